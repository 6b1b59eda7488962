//! An application's buffer as rnic memory: [`UserMemory`].
//!
//! `ibv_reg_mr(pd, addr, len, access)` names memory the application owns
//! and keeps using: rnic's engine reads and writes it (sends, RDMA writes
//! landing, reads, atomics) while the application's threads do too. So, as
//! everywhere in rnic (core's `HeapMemory`, mlx5's `DmaBuffer`), no `&[u8]`
//! into those bytes ever exists: every access copies through `&AtomicU64`
//! words made from the raw pointer ([`rnic::core::memory::read_words`] /
//! [`rnic::core::memory::write_words`]), which assume nothing about values
//! changing behind them. The words cover the region rounded out to 8-byte
//! boundaries; a write merges its partial edge words with a compare-and-swap,
//! so the bytes around the region (another object of the application) are
//! never overwritten, only re-stored with the value they hold. Bulk moves
//! (rxe's copies into and out of a region, its in-place sends) take the
//! exact range as a pinned direct span instead ([`Memory::pin_direct`]):
//! raw-pointer copies of those bytes only, the kernel's or rnic-dma's.
//!
//! # Revocation
//!
//! A queue pair keeps every region its requests named registered until it is
//! destroyed (rnic's invariant: no outstanding request names a key that is
//! gone). libibverbs lets the application deregister earlier and free the
//! memory, so after [`UserMemory::revoke`] (called by `ibv_dereg_mr`) every
//! access fails — the engine answers with a protection/access error, as a
//! real device answers an invalidated key — and `revoke` returns only when
//! no access is in flight (a copy, or a pinned span: for the sends of one
//! flush at most). From then on the library never touches the
//! bytes.
//!
//! # Checks at registration
//!
//! [`UserMemory::new`] checks `/proc/self/maps`: the whole range must be
//! mapped, and writable when the region is (the kernel's `ib_umem_get`
//! refuses the same with `EFAULT`), so a bad registration is an error, not
//! a fault in the progress thread later. Memory the application unmaps while
//! it is still registered is its bug, as with any verbs library; here it
//! faults the process (a device would keep the pinned pages).

use std::fmt;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};

use rnic::core::memory::{check_range, read_words, write_words};
use rnic::core::{DirectSpan, MemAccess, Memory, MemoryError, PinnedSpan};

/// Set in [`UserMemory`]'s state once revoked; the low bits count accesses
/// in flight.
const REVOKED: u32 = 1 << 31;

/// Why a range cannot be registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeError {
    /// Part of the range is not mapped.
    Unmapped,
    /// Part of the range is not writable, and the region would be written.
    ReadOnly,
}

/// `len` bytes of the application's memory at `ptr`, named `base` in the
/// region's address space (the `iova` of `ibv_reg_mr_iova`, the address
/// itself for `ibv_reg_mr`).
pub struct UserMemory {
    /// The address of byte 0, rounded down to 8 bytes.
    words: usize,
    /// Byte 0's offset from `words`.
    lane: usize,
    /// Words covering the region.
    nwords: usize,
    len: usize,
    base: u64,
    state: AtomicU32,
}

impl fmt::Debug for UserMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UserMemory")
            .field("addr", &format_args!("{:#x}", self.words + self.lane))
            .field("len", &self.len)
            .field("base", &format_args!("{:#x}", self.base))
            .field(
                "revoked",
                &(self.state.load(Ordering::Relaxed) & REVOKED != 0),
            )
            .finish()
    }
}

impl UserMemory {
    /// The memory at `ptr..ptr + len`, checked against the process's
    /// mappings (mapped, and writable when `writable`).
    ///
    /// # Safety
    ///
    /// The caller (the application, through `ibv_reg_mr`) keeps the range
    /// mapped until [`UserMemory::revoke`] returns.
    pub unsafe fn new(
        ptr: usize,
        len: usize,
        base: u64,
        writable: bool,
    ) -> Result<UserMemory, RangeError> {
        check_mapped(ptr, len, writable)?;
        let words = ptr & !7;
        let lane = ptr - words;
        Ok(UserMemory {
            words,
            lane,
            nwords: (lane + len).div_ceil(8),
            len,
            base,
            state: AtomicU32::new(0),
        })
    }

    /// Refuse every access from now on, and wait for those in flight.
    pub fn revoke(&self) {
        self.state.fetch_or(REVOKED, Ordering::AcqRel);
        while self.state.load(Ordering::Acquire) & !REVOKED != 0 {
            std::thread::yield_now();
        }
    }

    /// Run `f` over the region's words unless revoked.
    fn with_words<R>(
        &self,
        access: MemAccess,
        offset: usize,
        len: usize,
        f: impl FnOnce(&[AtomicU64]) -> Result<R, MemoryError>,
    ) -> Result<R, MemoryError> {
        // The access counts as in flight while the pin lives.
        let Some(_pin) = self.pin_direct() else {
            return Err(MemoryError::OutOfRange {
                access,
                offset,
                len,
                region_len: 0,
            });
        };
        // SAFETY: `words..words + nwords * 8` covers the registered range
        // rounded out to 8-byte boundaries: mapped (checked at `new`, kept
        // mapped by the caller of `new` until `revoke`, which waits for
        // `_pin`), 8-byte aligned, and the rounding stays within the pages of
        // the range's first and last bytes. Only atomic words are formed,
        // never plain references to the bytes.
        let words =
            unsafe { std::slice::from_raw_parts(self.words as *const AtomicU64, self.nwords) };
        f(words)
    }

    /// Run `op` on the aligned word at region offset `offset` (an atomic's
    /// target) unless revoked.
    fn atomic(
        &self,
        offset: usize,
        op: impl FnOnce(&AtomicU64) -> u64,
    ) -> Result<u64, MemoryError> {
        let i = self.atomic_word(offset)?;
        self.with_words(MemAccess::Atomic, offset, 8, |w| {
            w.get(i).map(op).ok_or(MemoryError::OutOfRange {
                access: MemAccess::Atomic,
                offset,
                len: 8,
                region_len: self.len,
            })
        })
    }

    /// The index of the aligned word at region offset `offset`.
    fn atomic_word(&self, offset: usize) -> Result<usize, MemoryError> {
        check_range(MemAccess::Atomic, offset, 8, self.len)?;
        let at = self.lane + offset;
        if !at.is_multiple_of(8) {
            return Err(MemoryError::Misaligned {
                access: MemAccess::Atomic,
                offset,
            });
        }
        Ok(at / 8)
    }
}

impl Memory for UserMemory {
    fn len(&self) -> usize {
        self.len
    }

    fn addr(&self) -> u64 {
        self.base
    }

    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), MemoryError> {
        check_range(MemAccess::Read, offset, dst.len(), self.len)?;
        self.with_words(MemAccess::Read, offset, dst.len(), |w| {
            read_words(w, self.lane + offset, dst)
        })
    }

    fn write(&self, offset: usize, src: &[u8]) -> Result<(), MemoryError> {
        check_range(MemAccess::Write, offset, src.len(), self.len)?;
        self.with_words(MemAccess::Write, offset, src.len(), |w| {
            write_words(w, self.lane + offset, src)
        })
    }

    fn compare_swap_u64(&self, offset: usize, compare: u64, swap: u64) -> Result<u64, MemoryError> {
        self.atomic(offset, |w| {
            match w.compare_exchange(compare, swap, Ordering::AcqRel, Ordering::Acquire) {
                Ok(v) | Err(v) => v,
            }
        })
    }

    fn fetch_add_u64(&self, offset: usize, add: u64) -> Result<u64, MemoryError> {
        self.atomic(offset, |w| w.fetch_add(add, Ordering::AcqRel))
    }

    /// The application's address (no unpinned span: every CPU access passes
    /// the revocation check). rnic-mlx5 maps the pages there into the
    /// function's IOMMU domain; rxe never asks.
    fn host_addr(&self) -> Option<usize> {
        Some(self.words + self.lane)
    }

    /// The registered bytes for bulk copies and system calls (rxe's
    /// in-place sends and its copies into and out of the region), counted
    /// as an access in flight until the pin drops, so [`UserMemory::revoke`]
    /// waits for it; `None` once revoked. Every access takes one (the word
    /// copies and atomics too, through `with_words`).
    fn pin_direct(&self) -> Option<PinnedSpan<'_>> {
        let prev = self.state.fetch_add(1, Ordering::Acquire);
        if prev & REVOKED != 0 {
            self.state.fetch_sub(1, Ordering::Release);
            return None;
        }
        // SAFETY: `words + lane .. + len` is the registered range: mapped
        // (checked at `new`, kept mapped by the caller of `new` until
        // `revoke`, which waits for this pin to drop). Only a slice of
        // atomic bytes is formed, never `&[u8]`; what is done through the
        // span's address is raw-pointer work of the transport (rnic-dma's
        // copies, the kernel's).
        let bytes = unsafe {
            std::slice::from_raw_parts((self.words + self.lane) as *const AtomicU8, self.len)
        };
        Some(PinnedSpan::pinned(
            DirectSpan::from_bytes(bytes),
            &self.state,
        ))
    }
}

/// Check that `ptr..ptr + len` is mapped (and writable when `writable`)
/// according to `/proc/self/maps`.
fn check_mapped(ptr: usize, len: usize, writable: bool) -> Result<(), RangeError> {
    let end = ptr.checked_add(len).ok_or(RangeError::Unmapped)?;
    if len == 0 || ptr == 0 {
        return Err(RangeError::Unmapped);
    }
    let maps = std::fs::read_to_string("/proc/self/maps").map_err(|_| RangeError::Unmapped)?;
    ranges_cover(&maps, ptr, end, writable)
}

/// Whether the mappings listed in `maps` (the `/proc/<pid>/maps` format)
/// cover `start..end` without a gap, writable where asked.
pub fn ranges_cover(
    maps: &str,
    start: usize,
    end: usize,
    writable: bool,
) -> Result<(), RangeError> {
    let mut at = start;
    let mut read_only = false;
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let (Some(range), Some(perms)) = (f.next(), f.next()) else {
            continue;
        };
        let Some((lo, hi)) = range.split_once('-') else {
            continue;
        };
        let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
        else {
            continue;
        };
        if hi <= at || lo > at {
            continue;
        }
        if !perms.starts_with('r') {
            return Err(RangeError::Unmapped);
        }
        if writable && perms.as_bytes().get(1) != Some(&b'w') {
            read_only = true;
        }
        at = hi;
        if at >= end {
            break;
        }
    }
    if at < end {
        Err(RangeError::Unmapped)
    } else if read_only {
        Err(RangeError::ReadOnly)
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(buf: &[AtomicU64], skip: usize, len: usize) -> UserMemory {
        let ptr = buf.as_ptr() as usize + skip;
        // SAFETY: `buf` outlives every use in the tests below.
        unsafe { UserMemory::new(ptr, len, ptr as u64, true) }.expect("mapped heap memory")
    }

    fn bytes(buf: &[AtomicU64]) -> Vec<u8> {
        buf.iter()
            .flat_map(|w| w.load(Ordering::Relaxed).to_ne_bytes())
            .collect()
    }

    #[test]
    fn copies_land_exactly_and_leave_the_neighbours_alone() {
        let buf: Vec<AtomicU64> = (0..8).map(|_| AtomicU64::new(u64::MAX)).collect();
        let m = user(&buf, 3, 37); // unaligned start and end
        assert_eq!(m.len(), 37);
        let data: Vec<u8> = (0..37u8).collect();
        m.write(0, &data).expect("in range");
        let all = bytes(&buf);
        assert_eq!(&all[..3], &[0xff; 3], "bytes before the region");
        assert_eq!(&all[3..40], &data[..]);
        assert_eq!(&all[40..], &[0xff; 24], "bytes after the region");
        let mut back = [0u8; 5];
        m.read(30, &mut back).expect("in range");
        assert_eq!(back, [30, 31, 32, 33, 34]);
        assert!(matches!(
            m.write(35, &[0; 3]),
            Err(MemoryError::OutOfRange { .. })
        ));
        assert_eq!(&bytes(&buf)[38..41], &[35, 36, 0xff]);
    }

    #[test]
    fn atomics_need_an_aligned_address() {
        let buf: Vec<AtomicU64> = (0..4).map(|_| AtomicU64::new(0)).collect();
        let m = user(&buf, 4, 24);
        // Offset 4 is the second word of the buffer.
        assert_eq!(m.fetch_add_u64(4, 5), Ok(0));
        assert_eq!(m.compare_swap_u64(4, 5, 9), Ok(5));
        assert_eq!(buf[1].load(Ordering::Relaxed), 9);
        assert!(matches!(
            m.fetch_add_u64(0, 1),
            Err(MemoryError::Misaligned { .. })
        ));
    }

    #[test]
    fn a_revoked_region_refuses_every_access() {
        let buf: Vec<AtomicU64> = (0..2).map(|_| AtomicU64::new(7)).collect();
        let m = user(&buf, 0, 16);
        m.revoke();
        assert!(m.write(0, &[1]).is_err());
        assert!(m.read(0, &mut [0u8; 1]).is_err());
        assert!(m.fetch_add_u64(0, 1).is_err());
        assert!(m.pin_direct().is_none(), "no span once revoked");
        assert_eq!(buf[0].load(Ordering::Relaxed), 7, "nothing changed");
    }

    /// The pinned span is the registered range exactly, and `revoke` waits
    /// for the pin: a transport's send naming the bytes finishes before
    /// `ibv_dereg_mr` returns.
    #[test]
    fn a_pinned_span_is_the_range_and_revocation_waits_for_it() {
        let buf: Vec<AtomicU64> = (0..4).map(|_| AtomicU64::new(0)).collect();
        let m = user(&buf, 5, 19);
        let pin = m.pin_direct().expect("application memory is addressable");
        let span = pin.span();
        assert_eq!(span.as_ptr() as usize, buf.as_ptr() as usize + 5);
        assert_eq!(span.len(), 19);
        assert!(
            span.range(MemAccess::Write, 18, 2).is_err(),
            "ends at the region's end"
        );
        let (revoked, dropped) = (AtomicU32::new(0), AtomicU32::new(0));
        std::thread::scope(|t| {
            t.spawn(|| {
                m.revoke();
                revoked.store(1, Ordering::SeqCst);
                // The pin was dropped before revoke returned.
                assert_eq!(
                    dropped.load(Ordering::SeqCst),
                    1,
                    "revoke returned under a pin"
                );
            });
            std::thread::sleep(std::time::Duration::from_millis(50));
            assert_eq!(
                revoked.load(Ordering::SeqCst),
                0,
                "revoke waits for the pin"
            );
            dropped.store(1, Ordering::SeqCst);
            drop(pin);
        });
        assert_eq!(revoked.load(Ordering::SeqCst), 1);
        assert!(m.pin_direct().is_none());
    }

    #[test]
    fn registration_checks_the_mappings() {
        let maps = "1000-3000 rw-p 0 0:0 0\n3000-4000 r--p 0 0:0 0\n5000-6000 rw-p 0 0:0 0\n";
        assert_eq!(ranges_cover(maps, 0x1000, 0x3000, true), Ok(()));
        assert_eq!(ranges_cover(maps, 0x2000, 0x4000, false), Ok(()));
        assert_eq!(
            ranges_cover(maps, 0x2000, 0x4000, true),
            Err(RangeError::ReadOnly)
        );
        assert_eq!(
            ranges_cover(maps, 0x3800, 0x5800, false),
            Err(RangeError::Unmapped),
            "a hole at 0x4000"
        );
        assert_eq!(
            ranges_cover(maps, 0x6000, 0x6001, false),
            Err(RangeError::Unmapped)
        );
        // SAFETY: address 8 is never mapped; `new` refuses it before any use.
        let e = unsafe { UserMemory::new(8, 64, 8, false) };
        assert!(matches!(e, Err(RangeError::Unmapped)));
    }
}
