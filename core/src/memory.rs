//! Device-visible memory as a provider sees it.
//!
//! A [`Memory`] is a range of bytes a device (or the software backend acting
//! as one) may read and write at any time while it is registered. The trait
//! therefore never hands out a reference into those bytes — not `&[u8]`, not
//! `&mut [u8]`: Rust assumes memory behind a shared reference does not change
//! and memory behind an exclusive one is not touched by anyone else, and DMA
//! breaks both assumptions. Every access copies: [`Memory::read`] into a
//! caller's buffer, [`Memory::write`] from one, plus the two 64-bit atomics
//! RDMA defines. Offsets are bounds-checked; atomics also need 8-byte
//! alignment. Atomics operate on the `u64` in host byte order, as verbs do
//! (the wire carries it big-endian; the transport converts).
//!
//! [`HeapMemory`] is the one backing in rnic-core: ordinary heap memory held
//! as `Box<[AtomicU64]>`, race-free in safe Rust. Whole words are relaxed
//! loads and stores; a write that covers part of a word merges its bytes with
//! a compare-and-swap loop, so concurrent writers to neighbouring bytes never
//! clobber each other and a reader never sees the untouched bytes of a word
//! change. Ordering between a write and the completion that announces it comes
//! from the completion path (the CQ), not from this type. Hugepage, NUMA-placed
//! and GPU memory come from `rnic-dma` and `rnic-gpu`, which implement the same
//! trait.
//!
//! # Direct access
//!
//! A software transport moves bytes with system calls (`sendmsg` reads the
//! payload, `recvmsg` places it) and with bulk copies; both work on
//! addresses, not on a `&[u8]`. [`Memory::direct`] offers them the region's
//! bytes as a [`DirectSpan`]: an address and a length that stay valid while
//! the span's borrow of the memory lasts. A span can only be made from a
//! slice of atomics ([`DirectSpan::from_words`], [`DirectSpan::from_bytes`]),
//! i.e. from memory that is live for the borrow and that anyone may change
//! at any time (interior mutability), so safe code cannot make a span that
//! lies; what may then be done through its address (a kernel copy, an
//! inline-assembly copy that the compiler cannot see into) is the business
//! of the crate that does it (`rnic-dma`'s `copy`, `rnic-rxe`'s `sys`).
//! Memory that is not addressable host memory (GPU memory behind a staging
//! ring, a BAR) returns `None` and is reached through `read`/`write` only.
//! Memory whose bytes can be withdrawn while the object lives offers its span
//! through [`Memory::pin_direct`] only: a [`PinnedSpan`] the withdrawal waits
//! for, taken per copy or system call; transports always ask that way.

use std::fmt;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};

use thiserror::Error;

use crate::types::Iova;

/// Device-visible memory, accessed only by copying (see the module docs).
///
/// Implementations must be safe to call from any thread at any time, including
/// concurrently with the device.
pub trait Memory: Send + Sync + fmt::Debug {
    /// Length in bytes.
    fn len(&self) -> usize;

    /// `true` when the region has no bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Process virtual address of byte 0: the region's default base address
    /// when registered (what a peer puts in a RETH with the rkey).
    fn addr(&self) -> u64;

    /// Copy `dst.len()` bytes starting at `offset` into `dst`.
    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), MemoryError>;

    /// Copy `src` into the region starting at `offset`.
    fn write(&self, offset: usize, src: &[u8]) -> Result<(), MemoryError>;

    /// Atomically replace the `u64` at `offset` (8-byte aligned) with `swap`
    /// if it equals `compare`; returns the value found.
    fn compare_swap_u64(&self, offset: usize, compare: u64, swap: u64) -> Result<u64, MemoryError>;

    /// Atomically add `add` (wrapping) to the `u64` at `offset` (8-byte
    /// aligned); returns the value found.
    fn fetch_add_u64(&self, offset: usize, add: u64) -> Result<u64, MemoryError>;

    /// The NUMA node the bytes live on, when known.
    fn numa_node(&self) -> Option<u32> {
        None
    }

    /// The I/O virtual address the device uses for byte 0, when the memory is
    /// mapped in an IOMMU.
    fn iova(&self) -> Option<Iova> {
        None
    }

    /// The region's bytes as an address range a transport may copy to and
    /// from directly (system calls, bulk copies; see the module docs), or
    /// `None` when they are not addressable host memory. Byte `i` of the
    /// span is byte `i` of the region; the span is [`Memory::len`] long.
    fn direct(&self) -> Option<DirectSpan<'_>> {
        None
    }

    /// The process virtual address of byte 0 when the bytes are ordinary
    /// memory of this process that stays at that address for as long as
    /// this object lives — what a driver maps into a device's IOMMU domain
    /// to register the memory in place (rnic-mlx5 does, for memory it did
    /// not allocate). `None` when the bytes are not host memory of this
    /// process. The default is the address of [`Memory::direct`]'s span;
    /// memory that offers no direct span (because every access must pass a
    /// check of its own) may still name its address here.
    fn host_addr(&self) -> Option<usize> {
        self.direct().map(|s| s.as_ptr() as usize)
    }

    /// [`Memory::direct`] kept valid by a pin until the returned value is
    /// dropped: what a transport takes for each copy or system call. Memory
    /// whose bytes can be withdrawn while the object lives (an application's
    /// memory that `ibv_dereg_mr` revokes: `rnic-verbs`) offers its span only
    /// this way, and its revocation waits for every pin; the default pins
    /// nothing. A pin is held for a bounded operation, never across a wait.
    fn pin_direct(&self) -> Option<PinnedSpan<'_>> {
        self.direct().map(PinnedSpan::unpinned)
    }
}

/// A [`DirectSpan`] with the pin that keeps it valid ([`Memory::pin_direct`]):
/// dropping it releases the pin.
pub struct PinnedSpan<'a> {
    span: DirectSpan<'a>,
    pin: Option<&'a AtomicU32>,
}

impl<'a> PinnedSpan<'a> {
    /// A span of memory that cannot be revoked while borrowed.
    pub fn unpinned(span: DirectSpan<'a>) -> PinnedSpan<'a> {
        PinnedSpan { span, pin: None }
    }

    /// `span` held by one count of `pins`, which the memory incremented for
    /// it (and whose revocation waits for the count to drop); the drop
    /// decrements it (release).
    pub fn pinned(span: DirectSpan<'a>, pins: &'a AtomicU32) -> PinnedSpan<'a> {
        PinnedSpan {
            span,
            pin: Some(pins),
        }
    }

    /// The span, valid while this pin lives.
    pub fn span(&self) -> DirectSpan<'_> {
        self.span
    }
}

impl Drop for PinnedSpan<'_> {
    fn drop(&mut self) {
        if let Some(p) = self.pin {
            p.fetch_sub(1, Ordering::Release);
        }
    }
}

impl fmt::Debug for PinnedSpan<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedSpan")
            .field("span", &self.span)
            .field("pinned", &self.pin.is_some())
            .finish()
    }
}

/// The bytes of a [`Memory`] as a raw address range (see the module docs).
///
/// Made only from a slice of atomics, so the range is live memory for `'a`
/// that anyone may change at any time: no reference to its bytes exists or
/// can be made from a span, only its address. Everything done through the
/// address is raw-pointer work in the crate that does it.
#[derive(Clone, Copy)]
pub struct DirectSpan<'a> {
    ptr: NonNull<u8>,
    len: usize,
    _memory: PhantomData<&'a [AtomicU8]>,
}

impl<'a> DirectSpan<'a> {
    /// The first `len` bytes of `words` (byte `i` is byte `i % 8`, in memory
    /// order, of word `i / 8`: [`HeapMemory`]'s layout); `None` when `len`
    /// exceeds the words' bytes.
    pub fn from_words(words: &'a [AtomicU64], len: usize) -> Option<DirectSpan<'a>> {
        if len > words.len().checked_mul(8)? {
            return None;
        }
        let ptr = NonNull::new(words.as_ptr().cast_mut().cast::<u8>())?;
        Some(DirectSpan {
            ptr,
            len,
            _memory: PhantomData,
        })
    }

    /// All of `bytes`.
    pub fn from_bytes(bytes: &'a [AtomicU8]) -> DirectSpan<'a> {
        DirectSpan {
            ptr: NonNull::from(bytes).cast::<u8>(),
            len: bytes.len(),
            _memory: PhantomData,
        }
    }

    /// The address of byte 0 (raw: its bytes may change at any time).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Bytes in the span.
    pub fn len(&self) -> usize {
        self.len
    }

    /// `true` when the span has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address of byte `offset` when `offset..offset + len` lies inside
    /// the span (else the error an access of that kind reports).
    pub fn range(
        &self,
        access: MemAccess,
        offset: usize,
        len: usize,
    ) -> Result<*mut u8, MemoryError> {
        check_range(access, offset, len, self.len)?;
        Ok(self.ptr.as_ptr().wrapping_add(offset))
    }
}

impl fmt::Debug for DirectSpan<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DirectSpan")
            .field("addr", &self.ptr)
            .field("len", &self.len)
            .finish()
    }
}

/// The kind of access that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemAccess {
    /// A copy out of the region.
    Read,
    /// A copy into the region.
    Write,
    /// A 64-bit atomic.
    Atomic,
}

impl fmt::Display for MemAccess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MemAccess::Read => "read",
            MemAccess::Write => "write",
            MemAccess::Atomic => "atomic",
        })
    }
}

/// A refused memory access; the memory is unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum MemoryError {
    /// The access reaches outside the region.
    #[error(
        "{access} of {len} bytes at offset {offset} is outside the {region_len}-byte region: keep \
         offset + length within the region"
    )]
    OutOfRange {
        /// What was attempted.
        access: MemAccess,
        /// First byte asked for.
        offset: usize,
        /// Bytes asked for.
        len: usize,
        /// The region's length.
        region_len: usize,
    },
    /// An atomic at an offset that is not a multiple of 8.
    #[error(
        "{access} at offset {offset} is not 8-byte aligned: atomics operate on aligned 64-bit words"
    )]
    Misaligned {
        /// What was attempted.
        access: MemAccess,
        /// The refused offset.
        offset: usize,
    },
}

/// Check that `offset..offset + len` lies within `region_len` bytes.
pub fn check_range(
    access: MemAccess,
    offset: usize,
    len: usize,
    region_len: usize,
) -> Result<(), MemoryError> {
    match offset.checked_add(len) {
        Some(end) if end <= region_len => Ok(()),
        _ => Err(MemoryError::OutOfRange {
            access,
            offset,
            len,
            region_len,
        }),
    }
}

/// Check an atomic's offset: 8-byte aligned and 8 bytes within the region.
pub fn check_atomic(offset: usize, region_len: usize) -> Result<(), MemoryError> {
    if !offset.is_multiple_of(8) {
        return Err(MemoryError::Misaligned {
            access: MemAccess::Atomic,
            offset,
        });
    }
    check_range(MemAccess::Atomic, offset, 8, region_len)
}

/// The error for a word range a caller failed to check (never expected:
/// callers run [`check_range`] first).
fn words_out_of_range(access: MemAccess, offset: usize, len: usize, words: usize) -> MemoryError {
    MemoryError::OutOfRange {
        access,
        offset,
        len,
        region_len: words.saturating_mul(8),
    }
}

/// Copy `dst.len()` bytes starting at byte `offset` of `words` (byte `i` is
/// byte `i % 8`, in memory order, of word `i / 8`) into `dst`.
///
/// The bulk copy behind [`HeapMemory`] and rnic-dma's regions: a partial
/// head and tail word byte-wise, every whole word in between as one relaxed
/// 64-bit load written to `dst` with a fixed-size store — a tight loop
/// without per-word bounds checks or `memcpy` calls. Relaxed atomic loads
/// keep it free of data races with concurrent writers.
pub fn read_words(words: &[AtomicU64], offset: usize, dst: &mut [u8]) -> Result<(), MemoryError> {
    let (len, nwords) = (dst.len(), words.len());
    let oor = move || words_out_of_range(MemAccess::Read, offset, len, nwords);
    let end = offset.checked_add(len).ok_or_else(oor)?;
    if end > nwords.saturating_mul(8) {
        return Err(oor());
    }
    if dst.is_empty() {
        return Ok(());
    }
    let lane = offset % 8;
    let mut w = offset / 8;
    let mut rest = dst;
    if lane != 0 {
        let take = (8 - lane).min(rest.len());
        let bytes = words[w].load(Ordering::Relaxed).to_ne_bytes();
        let (head, tail) = rest.split_at_mut(take);
        for (d, s) in head.iter_mut().zip(&bytes[lane..]) {
            *d = *s;
        }
        rest = tail;
        w += 1;
    }
    let whole = rest.len() / 8;
    let (body, tail) = rest.split_at_mut(whole * 8);
    for (d, s) in body.chunks_exact_mut(8).zip(&words[w..w + whole]) {
        let v: &mut [u8; 8] = d.try_into().map_err(|_| oor())?;
        *v = s.load(Ordering::Relaxed).to_ne_bytes();
    }
    if !tail.is_empty() {
        let bytes = words[w + whole].load(Ordering::Relaxed).to_ne_bytes();
        for (d, s) in tail.iter_mut().zip(&bytes) {
            *d = *s;
        }
    }
    Ok(())
}

/// Merge `n` bytes of `src` into lanes `lane..lane + n` of `word` with a
/// compare-and-swap loop (neighbouring bytes stay as concurrent writers
/// leave them).
fn merge_word(word: &AtomicU64, lane: usize, src: &[u8]) {
    let mut bytes = [0u8; 8];
    let mut mask = [0u8; 8];
    for (i, b) in src.iter().enumerate().take(8 - lane) {
        bytes[lane + i] = *b;
        mask[lane + i] = 0xFF;
    }
    let (value, mask) = (u64::from_ne_bytes(bytes), u64::from_ne_bytes(mask));
    let mut old = word.load(Ordering::Relaxed);
    loop {
        let new = (old & !mask) | value;
        match word.compare_exchange_weak(old, new, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => break,
            Err(actual) => old = actual,
        }
    }
}

/// Copy `src` into `words` starting at byte `offset` (layout as in
/// [`read_words`]): whole words are relaxed 64-bit stores in a tight loop,
/// a partial head or tail word merges with a compare-and-swap so concurrent
/// writers to neighbouring bytes never clobber each other.
pub fn write_words(words: &[AtomicU64], offset: usize, src: &[u8]) -> Result<(), MemoryError> {
    let (len, nwords) = (src.len(), words.len());
    let oor = move || words_out_of_range(MemAccess::Write, offset, len, nwords);
    let end = offset.checked_add(len).ok_or_else(oor)?;
    if end > nwords.saturating_mul(8) {
        return Err(oor());
    }
    if src.is_empty() {
        return Ok(());
    }
    let lane = offset % 8;
    let mut w = offset / 8;
    let mut rest = src;
    if lane != 0 {
        let take = (8 - lane).min(rest.len());
        merge_word(&words[w], lane, &rest[..take]);
        rest = &rest[take..];
        w += 1;
    }
    let whole = rest.len() / 8;
    let (body, tail) = rest.split_at(whole * 8);
    for (s, d) in body.chunks_exact(8).zip(&words[w..w + whole]) {
        let v: [u8; 8] = s.try_into().map_err(|_| oor())?;
        d.store(u64::from_ne_bytes(v), Ordering::Relaxed);
    }
    if !tail.is_empty() {
        merge_word(&words[w + whole], 0, tail);
    }
    Ok(())
}

/// Heap memory as `Box<[AtomicU64]>`: a safe [`Memory`] for tests and for
/// the software backend.
///
/// Byte `i` is byte `i % 8` (in memory order) of word `i / 8`, so the bytes
/// are laid out exactly as in a plain buffer and [`Memory::addr`] is the
/// address of byte 0.
pub struct HeapMemory {
    words: Box<[AtomicU64]>,
    len: usize,
}

impl HeapMemory {
    /// `len` zero bytes.
    pub fn new(len: usize) -> HeapMemory {
        let words = (0..len.div_ceil(8)).map(|_| AtomicU64::new(0)).collect();
        HeapMemory { words, len }
    }

    /// A copy of `bytes`.
    pub fn from_bytes(bytes: &[u8]) -> HeapMemory {
        let words = bytes
            .chunks(8)
            .map(|chunk| {
                let mut word = [0u8; 8];
                word[..chunk.len()].copy_from_slice(chunk);
                AtomicU64::new(u64::from_ne_bytes(word))
            })
            .collect();
        HeapMemory {
            words,
            len: bytes.len(),
        }
    }

    /// A copy of all bytes.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.len);
        for word in self.words.iter() {
            out.extend_from_slice(&word.load(Ordering::Relaxed).to_ne_bytes());
        }
        out.truncate(self.len);
        out
    }

    fn word(&self, index: usize) -> Result<&AtomicU64, MemoryError> {
        // Callers check ranges first; this keeps an arithmetic slip an error,
        // not a panic.
        self.words.get(index).ok_or(MemoryError::OutOfRange {
            access: MemAccess::Atomic,
            offset: index.saturating_mul(8),
            len: 8,
            region_len: self.len,
        })
    }
}

impl fmt::Debug for HeapMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HeapMemory")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len)
            .finish()
    }
}

impl Memory for HeapMemory {
    fn len(&self) -> usize {
        self.len
    }

    fn addr(&self) -> u64 {
        self.words.as_ptr() as u64
    }

    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), MemoryError> {
        check_range(MemAccess::Read, offset, dst.len(), self.len)?;
        read_words(&self.words, offset, dst)
    }

    fn write(&self, offset: usize, src: &[u8]) -> Result<(), MemoryError> {
        check_range(MemAccess::Write, offset, src.len(), self.len)?;
        write_words(&self.words, offset, src)
    }

    fn compare_swap_u64(&self, offset: usize, compare: u64, swap: u64) -> Result<u64, MemoryError> {
        check_atomic(offset, self.len)?;
        let word = self.word(offset / 8)?;
        match word.compare_exchange(compare, swap, Ordering::AcqRel, Ordering::Acquire) {
            Ok(old) | Err(old) => Ok(old),
        }
    }

    fn fetch_add_u64(&self, offset: usize, add: u64) -> Result<u64, MemoryError> {
        check_atomic(offset, self.len)?;
        Ok(self.word(offset / 8)?.fetch_add(add, Ordering::AcqRel))
    }

    fn direct(&self) -> Option<DirectSpan<'_>> {
        DirectSpan::from_words(&self.words, self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    #[test]
    fn byte_exact_at_every_alignment() {
        const LEN: usize = 37; // not a multiple of 8: the last word is partial
        let mem = HeapMemory::from_bytes(&pattern(LEN, 1));
        let mut model = pattern(LEN, 1);
        let mut seed = 2u8;
        for offset in 0..=LEN {
            for len in 0..=(LEN - offset) {
                let data = pattern(len, seed);
                seed = seed.wrapping_add(7);
                mem.write(offset, &data).expect("in range");
                model[offset..offset + len].copy_from_slice(&data);
                let mut back = vec![0u8; len];
                mem.read(offset, &mut back).expect("in range");
                assert_eq!(back, data, "offset {offset} len {len}");
                assert_eq!(
                    mem.to_vec(),
                    model,
                    "neighbours after offset {offset} len {len}"
                );
            }
        }
    }

    #[test]
    fn atomics_return_the_old_value_in_host_order() {
        let mem = HeapMemory::new(24);
        mem.write(8, &0x0102_0304_0506_0708u64.to_ne_bytes())
            .expect("write");
        assert_eq!(mem.fetch_add_u64(8, 1), Ok(0x0102_0304_0506_0708));
        assert_eq!(mem.fetch_add_u64(8, u64::MAX), Ok(0x0102_0304_0506_0709)); // wraps
        assert_eq!(mem.compare_swap_u64(8, 5, 9), Ok(0x0102_0304_0506_0708)); // no match
        assert_eq!(
            mem.compare_swap_u64(8, 0x0102_0304_0506_0708, 42),
            Ok(0x0102_0304_0506_0708)
        );
        let mut back = [0u8; 8];
        mem.read(8, &mut back).expect("read");
        assert_eq!(u64::from_ne_bytes(back), 42);
        // The neighbouring words are untouched.
        assert_eq!(&mem.to_vec()[..8], &[0; 8]);
        assert_eq!(&mem.to_vec()[16..], &[0; 8]);
    }

    #[test]
    fn refused_accesses_change_nothing() {
        let mem = HeapMemory::from_bytes(&pattern(20, 3));
        let before = mem.to_vec();
        let oor = |access, offset, len| MemoryError::OutOfRange {
            access,
            offset,
            len,
            region_len: 20,
        };
        assert_eq!(mem.write(18, &[0; 3]), Err(oor(MemAccess::Write, 18, 3)));
        assert_eq!(
            mem.write(usize::MAX, &[0; 2]),
            Err(oor(MemAccess::Write, usize::MAX, 2))
        );
        let mut buf = [0u8; 4];
        assert_eq!(mem.read(17, &mut buf), Err(oor(MemAccess::Read, 17, 4)));
        assert_eq!(buf, [0; 4]);
        assert_eq!(
            mem.fetch_add_u64(4, 1),
            Err(MemoryError::Misaligned {
                access: MemAccess::Atomic,
                offset: 4
            })
        );
        assert_eq!(
            mem.compare_swap_u64(16, 0, 1),
            Err(oor(MemAccess::Atomic, 16, 8))
        );
        assert_eq!(mem.fetch_add_u64(24, 1), Err(oor(MemAccess::Atomic, 24, 8)));
        assert_eq!(mem.to_vec(), before);
        // Zero-length accesses at the very end are in range.
        assert_eq!(mem.write(20, &[]), Ok(()));
        assert_eq!(mem.read(20, &mut []), Ok(()));
    }

    #[test]
    fn concurrent_writers_to_neighbouring_bytes_do_not_clobber() {
        const WORDS: usize = 4;
        let mem = Arc::new(HeapMemory::new(WORDS * 8));
        let threads: Vec<_> = (0..8usize)
            .map(|lane| {
                let mem = Arc::clone(&mem);
                std::thread::spawn(move || {
                    for round in 0..2_000usize {
                        for w in 0..WORDS {
                            let value = ((round + lane + w) % 251) as u8;
                            mem.write(w * 8 + lane, &[value]).expect("in range");
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("writer finished");
        }
        let bytes = mem.to_vec();
        for w in 0..WORDS {
            for lane in 0..8 {
                assert_eq!(bytes[w * 8 + lane], ((1_999 + lane + w) % 251) as u8);
            }
        }
    }

    #[test]
    fn a_direct_span_covers_exactly_the_region() {
        let mem = HeapMemory::from_bytes(&pattern(37, 4));
        let span = mem.direct().expect("heap memory is addressable");
        assert_eq!(span.as_ptr() as u64, mem.addr());
        assert_eq!(span.len(), 37);
        assert_eq!(
            span.range(MemAccess::Read, 37, 0),
            Ok(span.as_ptr().wrapping_add(37))
        );
        assert_eq!(
            span.range(MemAccess::Write, 30, 8),
            Err(MemoryError::OutOfRange {
                access: MemAccess::Write,
                offset: 30,
                len: 8,
                region_len: 37
            })
        );
        assert!(span.range(MemAccess::Read, usize::MAX, 2).is_err());
        let words: Vec<AtomicU64> = (0..2).map(AtomicU64::new).collect();
        assert!(
            DirectSpan::from_words(&words, 17).is_none(),
            "longer than the words"
        );
        assert_eq!(
            DirectSpan::from_words(&words, 16).map(|s| s.len()),
            Some(16)
        );
        let bytes: Vec<AtomicU8> = (0..5).map(AtomicU8::new).collect();
        assert_eq!(DirectSpan::from_bytes(&bytes).len(), 5);
        assert!(HeapMemory::new(0).direct().is_some_and(|s| s.is_empty()));
    }

    #[test]
    fn address_and_defaults() {
        let mem = HeapMemory::new(16);
        assert_ne!(mem.addr(), 0);
        assert_eq!(mem.addr() % 8, 0);
        assert_eq!(mem.numa_node(), None);
        assert_eq!(mem.iova(), None);
        assert!(!mem.is_empty());
        assert!(HeapMemory::new(0).is_empty());
        let dynamic: Arc<dyn Memory> = Arc::new(HeapMemory::from_bytes(b"abc"));
        let mut b = [0u8; 3];
        dynamic.read(0, &mut b).expect("read");
        assert_eq!(&b, b"abc");
    }
}
