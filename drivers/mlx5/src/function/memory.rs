//! Device-visible memory that works over both transports: memfd-backed
//! shared mappings ([`SharedMemory`]) and the DMA buffers built from them
//! ([`DmaBuffer`]), mapped into a function's IOVA space ([`IovaSpace`]).
//!
//! # Why file-backed
//!
//! A vfio-user device is another process: it can reach driver memory only
//! through a file descriptor passed with `DMA_MAP`. Anonymous pages (what
//! `rnic_dma::DmaRegion` allocates) cannot be passed, so every buffer the
//! driver shares with its function is a memfd mapping — `MFD_HUGETLB` with
//! 2 MiB pages when the pool has room, else 4 KiB pages (logged with the
//! command that reserves hugepages). The same buffers work over kernel VFIO,
//! which pins any user mapping.
//!
//! The memfd's size is sealed (`F_SEAL_SHRINK | F_SEAL_GROW`): the device
//! process can check that no truncation will ever turn its mapping into
//! `SIGBUS`.
//!
//! # Finding the fd of a host address
//!
//! [`rnic_dma::Mapper::map`] receives a host pointer. Every live
//! [`SharedMemory`] registers its address range and fd in a process-wide
//! table; the vfio-user mapper looks the pointer up there and sends the fd
//! with the file offset. Memory not in the table (e.g. a `DmaRegion`'s
//! anonymous pages) is refused with an error that names the fix.
//!
//! (What would move to rnic-dma: a `Backing::Memfd` option for
//! `DmaRegionBuilder` that allocates through [`SharedMemory`] and registers
//! it, so `DmaRegion`s — with their NUMA placement and key-table integration
//! — work over vfio-user too. Until then driver-internal memory is
//! [`DmaBuffer`].)
//!
//! # Access
//!
//! As in rnic-dma: no `&[u8]` into the bytes ever exists; reads and writes go
//! through `&AtomicU64` words ([`rnic_core::memory::read_words`] /
//! [`rnic_core::memory::write_words`]), which assume nothing about values the
//! device changes behind our back.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fmt;
use std::io;
use std::ops::RangeInclusive;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use rnic_core::memory::{check_atomic, check_range, read_words, write_words};
use rnic_core::{Iova, MemAccess, Memory, MemoryError};
use rnic_dma::{IovaAllocator, Mapper};
use tracing::{error, info, warn};

use crate::error::Mlx5Error;
use crate::sys;

/// 2 MiB: the hugetlb page size tried first.
pub const HUGE_2M: usize = 2 << 20;

/// Which pages a [`SharedMemory`] should use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SharedPages {
    /// 2 MiB hugetlb pages if the pool has room, else base pages (default).
    #[default]
    PreferHuge,
    /// Base pages only.
    Base,
    /// 2 MiB hugetlb pages or an error.
    RequireHuge,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Critical sections in this crate leave their data consistent before
    // anything that can panic; a poisoned lock still holds valid data.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

struct Registered {
    len: usize,
    fd: Arc<OwnedFd>,
}

/// Base address → (length, fd) of every live [`SharedMemory`].
static REGISTRY: Mutex<BTreeMap<usize, Registered>> = Mutex::new(BTreeMap::new());

/// The memfd and file offset holding `[host, host + len)`, if one live
/// [`SharedMemory`] — or one range of application memory moved onto a
/// memfd for registration ([`crate::function::user`]) — contains the whole
/// range.
pub(crate) fn lookup_fd(host: NonNull<u8>, len: u64) -> Option<(Arc<OwnedFd>, u64)> {
    let addr = host.as_ptr() as usize;
    let end = addr.checked_add(usize::try_from(len).ok()?)?;
    let found = {
        let reg = lock(&REGISTRY);
        reg.range(..=addr)
            .next_back()
            .filter(|(base, entry)| end <= *base + entry.len)
            .map(|(&base, entry)| (entry.fd.clone(), (addr - base) as u64))
    };
    found.or_else(|| crate::function::user::swapped_fd(addr, end))
}

/// The live [`SharedMemory`] containing `addr`: its (base, length).
pub(crate) fn shared_extent(addr: usize) -> Option<(usize, usize)> {
    let reg = lock(&REGISTRY);
    let (&base, entry) = reg.range(..=addr).next_back()?;
    (addr < base + entry.len).then_some((base, entry.len))
}

/// The base of the first live [`SharedMemory`] above `addr`.
pub(crate) fn next_shared_base(addr: usize) -> Option<usize> {
    let reg = lock(&REGISTRY);
    reg.range(addr.checked_add(1)?..).next().map(|(&b, _)| b)
}

/// A memfd-backed `MAP_SHARED` mapping: memory another process can map.
pub struct SharedMemory {
    ptr: NonNull<u8>,
    len: usize,
    huge: bool,
    fd: Arc<OwnedFd>,
}

impl fmt::Debug for SharedMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedMemory")
            .field("addr", &self.ptr)
            .field("len", &self.len)
            .field("huge", &self.huge)
            .finish_non_exhaustive()
    }
}

// SAFETY: SharedMemory owns its mapping (pointer + length + fd); the mapping
// is not tied to a thread and munmap from any thread is fine.
unsafe impl Send for SharedMemory {}
// SAFETY: `&SharedMemory` hands out only the raw pointer and the fd; every
// access to the bytes is the holder's (unsafe or atomic) business.
unsafe impl Sync for SharedMemory {}

impl SharedMemory {
    /// At least `len` zeroed bytes (rounded up to the page size obtained).
    pub fn new(len: usize, pages: SharedPages) -> Result<SharedMemory, Mlx5Error> {
        if len == 0 {
            return Err(Mlx5Error::SharedMemory {
                len,
                step: "size check (zero bytes asked for)",
                source: nix::Error::EINVAL,
            });
        }
        if pages != SharedPages::Base {
            match SharedMemory::create(len, true) {
                Ok(m) => return Ok(m),
                Err(e) if pages == SharedPages::RequireHuge => return Err(e),
                Err(e) => info!(
                    len, %e,
                    "no 2 MiB hugetlb memfd, using 4 KiB pages (to get hugepages: echo N > \
                     /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages)"
                ),
            }
        }
        SharedMemory::create(len, false)
    }

    fn create(len: usize, huge: bool) -> Result<SharedMemory, Mlx5Error> {
        let err = |step, source| Mlx5Error::SharedMemory { len, step, source };
        let page = if huge { HUGE_2M } else { sys::page_size() };
        let mapped = len
            .checked_next_multiple_of(page)
            .ok_or_else(|| err("size check", nix::Error::EOVERFLOW))?;
        let name = CString::new(if huge { "rnic-dma-2m" } else { "rnic-dma" })
            .map_err(|_| err("name", nix::Error::EINVAL))?;
        let fd = sys::memfd(&name, huge).map_err(|e| err("memfd_create", e))?;
        sys::truncate(fd.as_fd(), mapped as u64).map_err(|e| err("ftruncate", e))?;
        sys::seal_size(fd.as_fd()).map_err(|e| err("fcntl(F_ADD_SEALS)", e))?;
        // MAP_POPULATE faults every page in now: a hugetlb shortage fails
        // here, not as SIGBUS on first touch.
        let ptr = sys::mmap_shared(fd.as_fd(), 0, mapped, true).map_err(|e| err("mmap", e))?;
        let fd = Arc::new(fd);
        lock(&REGISTRY).insert(
            ptr.as_ptr() as usize,
            Registered {
                len: mapped,
                fd: fd.clone(),
            },
        );
        Ok(SharedMemory {
            ptr,
            len: mapped,
            huge,
            fd,
        })
    }

    /// Mapped length (a multiple of the page size).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether 2 MiB hugetlb pages back it.
    pub fn is_huge(&self) -> bool {
        self.huge
    }

    /// Base address (raw: create no references from it).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The memfd.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Drop for SharedMemory {
    fn drop(&mut self) {
        lock(&REGISTRY).remove(&(self.ptr.as_ptr() as usize));
        // SAFETY: exactly the mapping made in `create`; whoever mapped it for
        // a device (DmaBuffer) has unmapped it before dropping us.
        if let Err(e) = unsafe { sys::unmap(self.ptr, self.len) } {
            error!(len = self.len, %e, "munmap of shared DMA memory failed");
        }
    }
}

/// Split `ranges` at the byte midpoint of their total size: the lower half
/// for [`DmaBuffer`]s, the upper half for `rnic_dma::DmaDomain` regions, so
/// the two allocators of one function never hand out the same IOVA.
pub(crate) fn split_apertures(
    ranges: &[RangeInclusive<u64>],
) -> (Vec<RangeInclusive<u64>>, Vec<RangeInclusive<u64>>) {
    let total: u128 = ranges
        .iter()
        .map(|r| u128::from(r.end().saturating_sub(*r.start())) + 1)
        .sum();
    let mut left = total / 2;
    let (mut low, mut high) = (Vec::new(), Vec::new());
    for r in ranges {
        let size = u128::from(r.end() - r.start()) + 1;
        if left == 0 {
            high.push(r.clone());
        } else if size <= left {
            low.push(r.clone());
            left -= size;
        } else {
            // Split inside this range on a 2 MiB boundary.
            let cut = (*r.start() as u128 + left) as u64 & !(HUGE_2M as u64 - 1);
            if cut > *r.start() {
                low.push(*r.start()..=cut - 1);
            }
            high.push(cut.max(*r.start())..=*r.end());
            left = 0;
        }
    }
    (low, high)
}

/// One function's space of IOVAs for [`DmaBuffer`]s and the mapper that
/// installs them.
pub struct IovaSpace {
    pub(super) function: String,
    pub(super) mapper: Arc<dyn Mapper>,
    pub(super) alloc: Mutex<IovaAllocator>,
}

impl fmt::Debug for IovaSpace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IovaSpace")
            .field("function", &self.function)
            .field("mapper", &self.mapper)
            .finish_non_exhaustive()
    }
}

impl IovaSpace {
    /// A space named after `function`, mapping through `mapper`, IOVAs from
    /// `alloc`.
    pub fn new(function: String, mapper: Arc<dyn Mapper>, alloc: IovaAllocator) -> Arc<IovaSpace> {
        Arc::new(IovaSpace {
            function,
            mapper,
            alloc: Mutex::new(alloc),
        })
    }

    /// Bytes of IOVA handed out.
    pub fn allocated_bytes(&self) -> u64 {
        lock(&self.alloc).allocated_bytes()
    }

    /// Allocate `len` bytes of memfd-backed memory and map it for the device.
    pub fn alloc(self: &Arc<Self>, len: usize) -> Result<Arc<DmaBuffer>, Mlx5Error> {
        let mem = SharedMemory::new(len, SharedPages::PreferHuge)?;
        let mapped = mem.len() as u64;
        let align = if mem.is_huge() { HUGE_2M as u64 } else { 4096 };
        let iova =
            lock(&self.alloc)
                .alloc(mapped, align)
                .map_err(|source| Mlx5Error::IovaExhausted {
                    function: self.function.clone(),
                    len: mapped,
                    source,
                })?;
        // SAFETY: `mem` stays mapped until the DmaBuffer drops, whose first
        // step is `unmap(iova, mapped)`; the pages are freed only after that
        // returned Ok (or leaked if it did not).
        let mapped_ok = unsafe { self.mapper.map(iova, mem.ptr, mapped) };
        if let Err(source) = mapped_ok {
            if let Err(e) = lock(&self.alloc).free(iova) {
                error!(%iova, %e, "IOVA free after a failed map failed");
            }
            return Err(Mlx5Error::DmaMap {
                function: self.function.clone(),
                iova,
                len: mapped,
                source,
            });
        }
        Ok(Arc::new(DmaBuffer {
            mem: Some(mem),
            len,
            iova,
            space: self.clone(),
        }))
    }
}

/// Device-visible memory mapped at an IOVA of one function: memfd-backed, so
/// it works over kernel VFIO and vfio-user alike. `Drop` unmaps it from the
/// device, frees the IOVA and only then unmaps the host pages; if the device
/// unmap fails the pages and the IOVA are leaked rather than reused.
pub struct DmaBuffer {
    mem: Option<SharedMemory>,
    len: usize,
    iova: Iova,
    space: Arc<IovaSpace>,
}

impl fmt::Debug for DmaBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DmaBuffer")
            .field("iova", &self.iova)
            .field("len", &self.len)
            .field("mem", &self.mem)
            .finish_non_exhaustive()
    }
}

impl DmaBuffer {
    /// The device address of byte 0.
    pub fn iova(&self) -> Iova {
        self.iova
    }

    /// Accessible length (as asked for).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Host address of byte 0 (raw: create no references from it).
    pub fn as_ptr(&self) -> *mut u8 {
        self.shared().as_ptr()
    }

    /// The backing shared memory.
    pub fn shared(&self) -> &SharedMemory {
        // Only `Drop` takes it.
        self.mem
            .as_ref()
            .unwrap_or_else(|| unreachable!("taken only in Drop"))
    }

    #[inline]
    pub(crate) fn words(&self) -> &[AtomicU64] {
        let mem = self.shared();
        // SAFETY: the mapping is page-aligned (so 8-aligned), `mem.len()`
        // bytes long (a multiple of the page size, >= self.len), and lives as
        // long as `self`, which bounds the slice. The only references into it
        // are these `&AtomicU64`s, which assume nothing about the values (the
        // device changes them at any time).
        unsafe { std::slice::from_raw_parts(mem.ptr.as_ptr().cast::<AtomicU64>(), mem.len / 8) }
    }
}

impl Drop for DmaBuffer {
    fn drop(&mut self) {
        let Some(mem) = self.mem.take() else { return };
        let mapped = mem.len() as u64;
        if let Err(e) = self.space.mapper.unmap(self.iova, mapped) {
            warn!(
                iova = %self.iova, len = mapped, %e,
                "device unmap of a DMA buffer failed: leaking its pages and IOVA so the device \
                 cannot write into reused memory"
            );
            std::mem::forget(mem);
            return;
        }
        if let Err(e) = lock(&self.space.alloc).free(self.iova) {
            error!(iova = %self.iova, %e, "IOVA free failed");
        }
        drop(mem);
    }
}

impl Memory for DmaBuffer {
    fn len(&self) -> usize {
        self.len
    }

    fn addr(&self) -> u64 {
        self.as_ptr() as u64
    }

    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), MemoryError> {
        check_range(MemAccess::Read, offset, dst.len(), self.len)?;
        read_words(self.words(), offset, dst)
    }

    fn write(&self, offset: usize, src: &[u8]) -> Result<(), MemoryError> {
        check_range(MemAccess::Write, offset, src.len(), self.len)?;
        write_words(self.words(), offset, src)
    }

    fn compare_swap_u64(&self, offset: usize, compare: u64, swap: u64) -> Result<u64, MemoryError> {
        check_atomic(offset, self.len)?;
        let word = &self.words()[offset / 8];
        Ok(
            match word.compare_exchange(compare, swap, Ordering::AcqRel, Ordering::Acquire) {
                Ok(v) | Err(v) => v,
            },
        )
    }

    fn fetch_add_u64(&self, offset: usize, add: u64) -> Result<u64, MemoryError> {
        check_atomic(offset, self.len)?;
        Ok(self.words()[offset / 8].fetch_add(add, Ordering::AcqRel))
    }

    fn iova(&self) -> Option<Iova> {
        Some(self.iova)
    }
}

/// The error a mapper returns for host memory it cannot pass to the device.
pub(crate) fn not_file_backed(host: NonNull<u8>, len: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!(
            "host memory {:#x}+{len:#x} is not file-backed: a vfio-user device can only reach \
             memfd-backed memory; allocate it with PciFunction::alloc_dma (rnic_mlx5::SharedMemory)",
            host.as_ptr() as usize
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use rnic_dma::{MapperCall, RecordingMapper};

    #[test]
    fn shared_memory_is_registered_sealed_and_zeroed() {
        let m = SharedMemory::new(10_000, SharedPages::Base).unwrap();
        assert_eq!(m.len() % sys::page_size(), 0);
        assert!(m.len() >= 10_000);
        let base = NonNull::new(m.as_ptr()).unwrap();
        let (fd, off) =
            lookup_fd(NonNull::new(m.as_ptr().wrapping_add(4096)).unwrap(), 16).unwrap();
        assert_eq!(off, 4096);
        assert_eq!(
            nix::sys::stat::fstat(fd.as_fd()).unwrap().st_size as usize,
            m.len()
        );
        let seals = nix::fcntl::fcntl(m.fd(), nix::fcntl::FcntlArg::F_GET_SEALS).unwrap();
        assert_ne!(seals & libc::F_SEAL_SHRINK, 0, "size must be sealed");
        assert!(
            sys::truncate(m.fd(), 4096).is_err(),
            "shrinking must be refused"
        );
        // One byte past the end is not inside the registration.
        assert!(lookup_fd(base, m.len() as u64 + 1).is_none());
        drop(m);
        assert!(
            lookup_fd(base, 1).is_none(),
            "dropped memory is unregistered"
        );
    }

    #[test]
    fn dma_buffer_maps_unmaps_and_frees_in_order() {
        let rec = RecordingMapper::new();
        let space = IovaSpace::new(
            "test".into(),
            Arc::new(rec.clone()),
            IovaAllocator::new(&[0x10_0000..=0xFFFF_FFFF]),
        );
        let buf = space.alloc(100).unwrap();
        assert_eq!(buf.len(), 100);
        buf.write(96, &[1, 2, 3, 4]).unwrap();
        let mut out = [0u8; 4];
        buf.read(96, &mut out).unwrap();
        assert_eq!(out, [1, 2, 3, 4]);
        assert!(
            buf.write(97, &[0; 4]).is_err(),
            "writes past len are refused"
        );
        assert_eq!(buf.fetch_add_u64(8, 5).unwrap(), 0);
        assert_eq!(buf.compare_swap_u64(8, 5, 9).unwrap(), 5);
        let (iova, host, mapped) = (buf.iova(), buf.as_ptr() as usize, buf.shared().len() as u64);
        assert!(space.allocated_bytes() > 0);
        drop(buf);
        assert_eq!(
            rec.calls(),
            vec![
                MapperCall::Map {
                    iova,
                    host,
                    len: mapped
                },
                MapperCall::Unmap { iova, len: mapped }
            ]
        );
        assert_eq!(space.allocated_bytes(), 0);
    }

    #[test]
    fn failed_map_frees_the_iova_and_a_failed_unmap_leaks() {
        let space = IovaSpace::new(
            "test".into(),
            Arc::new(RecordingMapper::new().failing_map(libc::ENOMEM)),
            IovaAllocator::new(&[0x10_0000..=0xFFFF_FFFF]),
        );
        assert!(matches!(space.alloc(4096), Err(Mlx5Error::DmaMap { .. })));
        assert_eq!(space.allocated_bytes(), 0);

        let space = IovaSpace::new(
            "test".into(),
            Arc::new(RecordingMapper::new().failing_unmap(libc::EIO)),
            IovaAllocator::new(&[0x10_0000..=0xFFFF_FFFF]),
        );
        let buf = space.alloc(4096).unwrap();
        let base = NonNull::new(buf.as_ptr()).unwrap();
        drop(buf);
        assert!(
            space.allocated_bytes() > 0,
            "IOVA kept: the device may still use it"
        );
        assert!(
            lookup_fd(base, 1).is_some(),
            "pages kept: the device may still use them"
        );
    }

    #[test]
    fn apertures_split_in_half_without_overlap() {
        let (low, high) = split_apertures(&[0x1000..=0xFFFF_FFFF]);
        assert_eq!(low, vec![0x1000..=0x7FFF_FFFF]);
        assert_eq!(high, vec![0x8000_0000..=0xFFFF_FFFF]);
        let (low, high) =
            split_apertures(&[0..=0xFFF, 0x10_0000..=0x1F_FFFF, 0x4000_0000..=0x7FFF_FFFF]);
        let last_low = low.iter().map(|r| *r.end()).max().unwrap();
        let first_high = high.iter().map(|r| *r.start()).min().unwrap();
        assert!(last_low < first_high);
        assert_eq!(low[0], 0..=0xFFF);
    }
}
