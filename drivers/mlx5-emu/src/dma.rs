//! The emulated function's view of driver memory: the table of the client's
//! `DMA_MAP`s, each an mmap of the fd it passed, and every device access
//! (read or write of a byte range at an IOVA) served through that table only.
//!
//! # Faults
//!
//! An access is resolved completely before a byte moves: every byte of
//! `[iova, iova + len)` must lie in a live mapping that grants the access
//! (adjacent mappings may be crossed, as through an IOMMU). Otherwise the
//! access is a [`DmaFault`] — returned, counted in [`DmaStats`], logged with
//! the IOVA — and nothing is read or written. No path panics and no IOVA ever
//! reaches host memory outside a mapping.
//!
//! # Unmap while the device is using a mapping
//!
//! Mappings are `Arc<Mapping>`; an access holds its mappings' `live` read
//! locks for the duration of the copy. `unmap` first removes the mappings
//! from the table (no new access can find them), then takes each one's
//! `live` write lock — waiting for accesses in flight — and marks it dead.
//! So when `unmap` returns (and the server replies to `DMA_UNMAP`) the device
//! neither accesses the range nor can start to; the host mapping itself goes
//! away when the last `Arc` drops, so a stale holder never touches unmapped
//! memory.
//!
//! # What the driver must pass
//!
//! The fd's size is checked against `offset + size` (`fstat`) and must be
//! sealed against shrinking (`F_SEAL_SHRINK`): a file that could be
//! truncated under the mapping would turn a device access into `SIGBUS`.

use std::collections::BTreeMap;
use std::fmt;
use std::fs::File;
use std::os::fd::AsFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard};

use rnic_core::memory::{read_words, write_words};
use thiserror::Error;
use tracing::{debug, warn};

use crate::sys;

/// Why an access faulted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// Some byte of the range is in no mapping.
    Unmapped,
    /// A mapping in the range was mapped without `READ`.
    NotReadable,
    /// A mapping in the range was mapped without `WRITE`.
    NotWritable,
    /// The driver has not enabled bus mastering (PCI command bit 2).
    BusMasterDisabled,
    /// `iova + len` overflows.
    Overflow,
}

/// A refused device access; no memory was touched.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub struct DmaFault {
    /// First byte of the access.
    pub iova: u64,
    /// Bytes.
    pub len: usize,
    /// Write (true) or read.
    pub write: bool,
    /// Why.
    pub kind: FaultKind,
    /// The first IOVA that failed.
    pub at: u64,
}

impl fmt::Display for DmaFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "DMA fault: device {} of {} bytes at IOVA {:#x}: {:?} at {:#x} (no memory touched; \
             the driver must DMA_MAP the whole range and enable bus mastering)",
            if self.write { "write" } else { "read" },
            self.len,
            self.iova,
            self.kind,
            self.at
        )
    }
}

/// Why a `DMA_MAP` was refused.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum MapError {
    /// No fd came with the message.
    #[error("DMA_MAP without a file descriptor: this emulator only shares memory through fds")]
    NoFd,
    /// Zero size or the range overflows.
    #[error("DMA_MAP of {size:#x} bytes at {iova:#x} is empty or overflows")]
    BadRange {
        /// IOVA.
        iova: u64,
        /// Size.
        size: u64,
    },
    /// The range overlaps a live mapping.
    #[error("DMA_MAP {iova:#x}+{size:#x} overlaps the mapping at {existing:#x}")]
    Overlap {
        /// IOVA.
        iova: u64,
        /// Size.
        size: u64,
        /// The existing mapping's IOVA.
        existing: u64,
    },
    /// The file is smaller than `offset + size`.
    #[error("DMA_MAP of {size:#x} bytes at file offset {offset:#x}, but the file has {file:#x}")]
    PastEnd {
        /// Offset.
        offset: u64,
        /// Size.
        size: u64,
        /// File size.
        file: u64,
    },
    /// The file can shrink under the mapping.
    #[error(
        "DMA_MAP fd is not sealed against shrinking (F_SEAL_SHRINK): a truncation would make \
         device accesses fault; share memfds sealed with F_SEAL_SHRINK"
    )]
    NotSealed,
    /// fstat or mmap failed.
    #[error("DMA_MAP {op} failed: {source}")]
    Sys {
        /// fstat or mmap.
        op: &'static str,
        /// The errno.
        #[source]
        source: nix::Error,
    },
}

/// Counters of the DMA path.
#[derive(Debug, Default)]
pub struct DmaStats {
    /// Mappings installed.
    pub maps: AtomicU64,
    /// DMA_MAPs refused.
    pub maps_refused: AtomicU64,
    /// Mappings removed.
    pub unmaps: AtomicU64,
    /// DMA_UNMAPs that cut through a mapping (the whole mapping was removed).
    pub unmaps_partial: AtomicU64,
    /// DMA_UNMAPs that matched nothing.
    pub unmaps_unknown: AtomicU64,
    /// Faulted accesses.
    pub faults: AtomicU64,
    /// Bytes read by the device.
    pub bytes_read: AtomicU64,
    /// Bytes written by the device.
    pub bytes_written: AtomicU64,
}

/// One `DMA_MAP`: the mmap of the client's fd.
struct Mapping {
    iova: u64,
    len: u64,
    /// Base of our mmap (page-aligned), its length, and where the mapped
    /// range starts inside it (the client's offset need not be page-aligned).
    base: NonNull<u8>,
    map_len: usize,
    delta: usize,
    readable: bool,
    writable: bool,
    live: RwLock<bool>,
}

impl fmt::Debug for Mapping {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mapping")
            .field("iova", &format_args!("{:#x}", self.iova))
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

// SAFETY: Mapping owns its mmap; it is not tied to a thread. Bytes are only
// reached through `&AtomicU64` words (see `words`).
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: exactly the mmap made in `DmaSpace::map`; this is the last
        // Arc, so no access holds it.
        if let Err(e) = unsafe { sys::unmap(self.base, self.map_len) } {
            warn!(iova = self.iova, %e, "munmap of a DMA mapping failed");
        }
    }
}

impl Mapping {
    fn end(&self) -> u64 {
        self.iova + self.len
    }

    /// The mmap as 64-bit words (it is page-aligned and a multiple of 8 long
    /// — rounded up in `map`).
    fn words(&self) -> &[AtomicU64] {
        // SAFETY: `base` is page-aligned, `map_len` is a multiple of 8 and
        // the mapping lives as long as `self`, which bounds the slice. The
        // driver writes these bytes at any time; `&AtomicU64` assumes nothing
        // about their values and every access is atomic, so there is no data
        // race in this process.
        unsafe {
            std::slice::from_raw_parts(self.base.as_ptr().cast::<AtomicU64>(), self.map_len / 8)
        }
    }
}

/// The mapping table; see the module docs.
#[derive(Debug, Default)]
pub struct DmaSpace {
    maps: RwLock<BTreeMap<u64, Arc<Mapping>>>,
    stats: DmaStats,
}

fn read_lock<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    // Nothing panics while holding these locks; a poisoned one is consistent.
    l.read().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn write_lock<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One stretch of an access inside one mapping.
struct Piece {
    map: Arc<Mapping>,
    /// Byte offset inside the mmap.
    at: usize,
    len: usize,
}

impl DmaSpace {
    /// An empty table.
    pub fn new() -> DmaSpace {
        DmaSpace::default()
    }

    /// The counters.
    pub fn stats(&self) -> &DmaStats {
        &self.stats
    }

    /// Live mappings as (IOVA, length), lowest first.
    pub fn mappings(&self) -> Vec<(u64, u64)> {
        read_lock(&self.maps)
            .values()
            .map(|m| (m.iova, m.len))
            .collect()
    }

    /// Install a mapping of `size` bytes of `fd` at file `offset` for IOVA
    /// `iova`.
    pub fn map(
        &self,
        iova: u64,
        size: u64,
        fd: Option<File>,
        offset: u64,
        readable: bool,
        writable: bool,
    ) -> Result<(), MapError> {
        let r = self.try_map(iova, size, fd, offset, readable, writable);
        match &r {
            Ok(()) => {
                self.stats.maps.fetch_add(1, Ordering::Relaxed);
                debug!(iova, size, offset, "DMA_MAP");
            }
            Err(e) => {
                self.stats.maps_refused.fetch_add(1, Ordering::Relaxed);
                warn!(iova, size, offset, %e, "DMA_MAP refused");
            }
        }
        r
    }

    fn try_map(
        &self,
        iova: u64,
        size: u64,
        fd: Option<File>,
        offset: u64,
        readable: bool,
        writable: bool,
    ) -> Result<(), MapError> {
        let fd = fd.ok_or(MapError::NoFd)?;
        let bad = MapError::BadRange { iova, size };
        let end = iova.checked_add(size).filter(|_| size > 0);
        let file_end = offset.checked_add(size);
        let (Some(end), Some(file_end)) = (end, file_end) else {
            return Err(bad);
        };
        let file = sys::file_size(fd.as_fd()).map_err(|source| MapError::Sys {
            op: "fstat",
            source,
        })?;
        if file_end > file {
            return Err(MapError::PastEnd { offset, size, file });
        }
        if !sys::shrink_sealed(fd.as_fd()) {
            return Err(MapError::NotSealed);
        }
        let page = sys::page_size();
        let aligned = offset & !(page - 1);
        let delta = (offset - aligned) as usize;
        let map_len = usize::try_from(size)
            .ok()
            .and_then(|s| s.checked_add(delta))
            .and_then(|s| s.checked_next_multiple_of(8))
            .ok_or(MapError::BadRange { iova, size })?;
        let mut maps = write_lock(&self.maps);
        // Overlap: the mapping starting below `end` with the highest start.
        if let Some((_, m)) = maps.range(..end).next_back()
            && m.end() > iova
        {
            return Err(MapError::Overlap {
                iova,
                size,
                existing: m.iova,
            });
        }
        let base = sys::mmap_shared(fd.as_fd(), aligned, map_len, readable, writable)
            .map_err(|source| MapError::Sys { op: "mmap", source })?;
        maps.insert(
            iova,
            Arc::new(Mapping {
                iova,
                len: size,
                base,
                map_len,
                delta,
                readable,
                writable,
                live: RwLock::new(true),
            }),
        );
        Ok(())
    }

    /// Remove every mapping that intersects `[iova, iova + size)` (a cut
    /// through a mapping removes all of it: the device may lose access to
    /// more than asked, never keep access to less). Waits for accesses in
    /// flight. Returns the number removed.
    pub fn unmap(&self, iova: u64, size: u64) -> usize {
        let end = iova.saturating_add(size);
        let removed: Vec<Arc<Mapping>> = {
            let mut maps = write_lock(&self.maps);
            let hit: Vec<u64> = maps
                .range(..end)
                .filter(|(_, m)| m.end() > iova)
                .map(|(&k, _)| k)
                .collect();
            hit.iter().filter_map(|k| maps.remove(k)).collect()
        };
        self.retire(&removed);
        let partial = removed.iter().any(|m| m.iova < iova || m.end() > end);
        if partial {
            self.stats.unmaps_partial.fetch_add(1, Ordering::Relaxed);
            warn!(
                iova,
                size, "DMA_UNMAP cut through a mapping: removed the whole mapping"
            );
        }
        if removed.is_empty() {
            self.stats.unmaps_unknown.fetch_add(1, Ordering::Relaxed);
            debug!(iova, size, "DMA_UNMAP matched no mapping");
        }
        debug!(iova, size, removed = removed.len(), "DMA_UNMAP");
        removed.len()
    }

    /// Remove every mapping (the client disconnected, or `UNMAP_ALL`).
    pub fn clear(&self) -> usize {
        let removed: Vec<Arc<Mapping>> = std::mem::take(&mut *write_lock(&self.maps))
            .into_values()
            .collect();
        self.retire(&removed);
        removed.len()
    }

    fn retire(&self, removed: &[Arc<Mapping>]) {
        for m in removed {
            // Waits for every access holding the read lock.
            *write_lock(&m.live) = false;
            self.stats.unmaps.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn fault(&self, iova: u64, len: usize, write: bool, kind: FaultKind, at: u64) -> DmaFault {
        self.stats.faults.fetch_add(1, Ordering::Relaxed);
        let f = DmaFault {
            iova,
            len,
            write,
            kind,
            at,
        };
        warn!(iova = format_args!("{iova:#x}"), len, write, ?kind, "{f}");
        f
    }

    /// Resolve, check and run `copy` over every piece of the access while
    /// holding the mappings' live locks.
    fn access(
        &self,
        iova: u64,
        len: usize,
        write: bool,
        mut copy: impl FnMut(&[AtomicU64], usize, usize, usize),
    ) -> Result<(), DmaFault> {
        if len == 0 {
            return Ok(());
        }
        let Some(end) = iova.checked_add(len as u64) else {
            return Err(self.fault(iova, len, write, FaultKind::Overflow, iova));
        };
        let maps = read_lock(&self.maps);
        let mut pieces: Vec<Piece> = Vec::new();
        let mut cur = iova;
        while cur < end {
            let Some((_, m)) = maps
                .range(..=cur)
                .next_back()
                .filter(|(_, m)| m.end() > cur)
            else {
                return Err(self.fault(iova, len, write, FaultKind::Unmapped, cur));
            };
            if write && !m.writable {
                return Err(self.fault(iova, len, write, FaultKind::NotWritable, cur));
            }
            if !write && !m.readable {
                return Err(self.fault(iova, len, write, FaultKind::NotReadable, cur));
            }
            let n = (m.end().min(end) - cur) as usize;
            pieces.push(Piece {
                map: m.clone(),
                at: m.delta + (cur - m.iova) as usize,
                len: n,
            });
            cur += n as u64;
        }
        // Hold every piece's live lock across the copy; taken while the table
        // lock is held, so every piece is still live.
        let guards: Vec<_> = pieces.iter().map(|p| read_lock(&p.map.live)).collect();
        drop(maps);
        if let Some(i) = guards.iter().position(|g| !**g) {
            let at = iova + pieces[..i].iter().map(|p| p.len as u64).sum::<u64>();
            return Err(self.fault(iova, len, write, FaultKind::Unmapped, at));
        }
        let mut done = 0;
        for p in &pieces {
            copy(p.map.words(), p.at, done, p.len);
            done += p.len;
        }
        drop(guards);
        Ok(())
    }

    /// The device reads `dst.len()` bytes at `iova`.
    pub fn read(&self, iova: u64, dst: &mut [u8]) -> Result<(), DmaFault> {
        let len = dst.len();
        self.access(iova, len, false, |words, at, done, n| {
            // In bounds by construction: `at + n <= delta + len <= map_len`.
            if let Err(e) = read_words(words, at, &mut dst[done..done + n]) {
                warn!(%e, "DMA read inside a mapping refused (bug)");
            }
        })?;
        self.stats
            .bytes_read
            .fetch_add(len as u64, Ordering::Relaxed);
        Ok(())
    }

    /// The device writes `src` at `iova`.
    pub fn write(&self, iova: u64, src: &[u8]) -> Result<(), DmaFault> {
        self.access(iova, src.len(), true, |words, at, done, n| {
            if let Err(e) = write_words(words, at, &src[done..done + n]) {
                warn!(%e, "DMA write inside a mapping refused (bug)");
            }
        })?;
        self.stats
            .bytes_written
            .fetch_add(src.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// A fault that the caller decided (bus mastering off), counted like the
    /// others.
    pub(crate) fn refuse(&self, iova: u64, len: usize, write: bool, kind: FaultKind) -> DmaFault {
        self.fault(iova, len, write, kind, iova)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CString;
    use std::os::fd::OwnedFd;

    fn memfd(len: u64, seal: bool) -> OwnedFd {
        let fd = sys::memfd(&CString::new("t").unwrap()).unwrap();
        sys::truncate(fd.as_fd(), len).unwrap();
        if seal {
            sys::seal_size(fd.as_fd()).unwrap();
        }
        fd
    }

    fn file(fd: &OwnedFd) -> Option<File> {
        Some(File::from(fd.try_clone().unwrap()))
    }

    #[test]
    fn reads_and_writes_go_through_the_fd() {
        let fd = memfd(8192, true);
        let dma = DmaSpace::new();
        dma.map(0x10_0000, 4096, file(&fd), 4096, true, true)
            .unwrap();
        dma.write(0x10_0003, b"hello").unwrap();
        let mut out = [0u8; 5];
        dma.read(0x10_0003, &mut out).unwrap();
        assert_eq!(&out, b"hello");
        // Visible in the file at offset 4096 + 3.
        let mut f = [0u8; 5];
        nix::sys::uio::pread(&fd, &mut f, 4099).unwrap();
        assert_eq!(&f, b"hello");
    }

    #[test]
    fn one_byte_past_the_end_faults_and_touches_nothing() {
        let fd = memfd(4096, true);
        let dma = DmaSpace::new();
        dma.map(0x1000, 4096, file(&fd), 0, true, true).unwrap();
        let err = dma.write(0x1000 + 4090, &[0xAA; 7]).unwrap_err();
        assert_eq!(err.kind, FaultKind::Unmapped);
        assert_eq!(err.at, 0x2000);
        let mut tail = [1u8; 6];
        dma.read(0x1000 + 4090, &mut tail).unwrap();
        assert_eq!(
            tail, [0; 6],
            "the in-range part of a faulting write is not written"
        );
        let mut buf = [7u8; 2];
        assert!(dma.read(0x1fff, &mut buf).is_err());
        assert_eq!(buf, [7, 7], "a faulting read leaves the buffer alone");
        assert_eq!(dma.stats().faults.load(Ordering::Relaxed), 2);
        assert!(dma.read(u64::MAX, &mut buf).is_err(), "overflow faults");
    }

    #[test]
    fn adjacent_mappings_are_crossed_and_gaps_fault() {
        let (a, b) = (memfd(4096, true), memfd(4096, true));
        let dma = DmaSpace::new();
        dma.map(0x1000, 4096, file(&a), 0, true, true).unwrap();
        dma.map(0x2000, 4096, file(&b), 0, true, true).unwrap();
        dma.write(0x1ffe, &[1, 2, 3, 4]).unwrap();
        let mut out = [0u8; 4];
        dma.read(0x1ffe, &mut out).unwrap();
        assert_eq!(out, [1, 2, 3, 4]);
        assert_eq!(dma.unmap(0x2000, 4096), 1);
        assert_eq!(dma.read(0x1ffe, &mut out).unwrap_err().at, 0x2000);
    }

    #[test]
    fn refused_maps() {
        let dma = DmaSpace::new();
        let fd = memfd(4096, true);
        assert!(matches!(
            dma.map(0, 4096, None, 0, true, true),
            Err(MapError::NoFd)
        ));
        assert!(matches!(
            dma.map(0, 8192, file(&fd), 0, true, true),
            Err(MapError::PastEnd { .. })
        ));
        assert!(matches!(
            dma.map(0, 4096, Some(File::from(memfd(4096, false))), 0, true, true),
            Err(MapError::NotSealed)
        ));
        assert!(matches!(
            dma.map(u64::MAX, 2, file(&fd), 0, true, true),
            Err(MapError::BadRange { .. })
        ));
        dma.map(0x1000, 4096, file(&fd), 0, true, false).unwrap();
        assert!(matches!(
            dma.map(0x1800, 16, file(&fd), 0, true, true),
            Err(MapError::Overlap {
                existing: 0x1000,
                ..
            })
        ));
        assert_eq!(
            dma.write(0x1000, &[1]).unwrap_err().kind,
            FaultKind::NotWritable
        );
        assert_eq!(dma.stats().maps_refused.load(Ordering::Relaxed), 5);
    }

    #[test]
    fn unmap_cuts_whole_mappings_and_waits_for_access() {
        let fd = memfd(8192, true);
        let dma = Arc::new(DmaSpace::new());
        dma.map(0x4000, 8192, file(&fd), 0, true, true).unwrap();
        assert_eq!(dma.unmap(0x5000, 16), 1, "a cut removes the whole mapping");
        assert_eq!(dma.stats().unmaps_partial.load(Ordering::Relaxed), 1);
        assert!(dma.mappings().is_empty());
        assert_eq!(dma.unmap(0x5000, 16), 0);
        assert_eq!(dma.stats().unmaps_unknown.load(Ordering::Relaxed), 1);

        // Concurrent accesses and unmap: every access either completes or
        // faults; none touches an unmapped page (this would SIGSEGV).
        dma.map(0x4000, 8192, file(&fd), 0, true, true).unwrap();
        let d = dma.clone();
        let t = std::thread::spawn(move || {
            let mut n = 0;
            while d.write(0x4000, &[9u8; 8192]).is_ok() {
                n += 1;
            }
            n
        });
        std::thread::sleep(std::time::Duration::from_millis(5));
        assert_eq!(dma.unmap(0x4000, 8192), 1);
        let _writes = t.join().unwrap();
        assert!(dma.write(0x4000, &[1]).is_err());
    }
}
