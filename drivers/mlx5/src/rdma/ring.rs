//! Views of a [`DmaBuffer`]'s words that keep their base pointer and
//! power-of-two mask, so the data path indexes a ring with one `and` and no
//! bounds check: [`WordRing`] (a ring of 64-byte blocks: SQ WQEBBs, CQEs)
//! and [`WordCell`] (one word: a doorbell record).
//!
//! Each view is checked once, when it is made, to lie inside the buffer's
//! words, and holds the buffer (`Arc`), so the mapping outlives it. Every
//! index it takes is masked into the range it was checked for. As
//! [`DmaBuffer::words`], the only references it hands out are
//! `&AtomicU64`, which assume nothing about values the device changes.

use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, Ordering};

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::{__m128i, _mm_or_si128, _mm_set_epi64x, _mm_slli_si128, _mm_storeu_si128};

use crate::DmaBuffer;

/// `len` words of a [`DmaBuffer`] (a power of two, at least 8): a ring of
/// `len / 8` 64-byte blocks; see the module docs.
pub(crate) struct WordRing {
    base: NonNull<AtomicU64>,
    /// `len - 1`.
    mask: usize,
    /// `8 len - 1`: the mask of a byte offset; block `i` starts at byte
    /// `64 i & byte_mask` (a multiple of 64: `len` is a power of two ≥ 8).
    byte_mask: usize,
    _buf: Arc<DmaBuffer>,
}

// SAFETY: a pointer into the mapping `buf` owns (which is `Send + Sync`),
// used only to form `&AtomicU64`s: nothing in it is tied to a thread.
unsafe impl Send for WordRing {}
// SAFETY: `&WordRing` hands out only `&AtomicU64`s, which are `Sync`.
unsafe impl Sync for WordRing {}

impl WordRing {
    /// Words `first .. first + len` of `buf`; `None` unless `len` is a power
    /// of two of at least 8 and the range lies inside the buffer's words.
    pub fn new(buf: Arc<DmaBuffer>, first: usize, len: usize) -> Option<WordRing> {
        if !len.is_power_of_two() || len < 8 {
            return None;
        }
        let words = buf.words().get(first..first.checked_add(len)?)?;
        // From the slice's pointer, so it may reach all `len` words.
        let base = NonNull::new(words.as_ptr().cast_mut())?;
        Some(WordRing {
            base,
            mask: len - 1,
            byte_mask: len * 8 - 1,
            _buf: buf,
        })
    }

    /// Word `i` of the ring, modulo its length.
    #[inline(always)]
    pub fn word(&self, i: usize) -> &AtomicU64 {
        // SAFETY: `i & mask < len` words from `base`, inside one allocation
        // (the mapping, checked in `new`).
        let p = unsafe { self.base.as_ptr().add(i & self.mask) };
        // SAFETY: `i & mask < len`, and `new` checked that the `len` words
        // from `base` lie inside `buf`'s words, a mapping that lives as long
        // as `self._buf`; `base` came from that slice's pointer. The
        // reference is an atomic (the module docs).
        unsafe { &*p }
    }

    /// Block `i` (8 words from word `8 i`) of the ring, modulo its length.
    #[inline(always)]
    pub fn block(&self, i: usize) -> &[AtomicU64; 8] {
        // SAFETY: `block_ptr` points at 8 words inside the mapping
        // `self._buf` keeps alive; `[AtomicU64; 8]` has the layout of 8
        // consecutive words, and the reference is to atomics (the module
        // docs).
        unsafe { &*self.block_ptr(i) }
    }

    /// The first word of block `i` (modulo the ring): one shift and one
    /// mask of a byte offset.
    #[inline(always)]
    fn block_ptr(&self, i: usize) -> *mut [AtomicU64; 8] {
        self.block_ptr_at(self.block_at(i))
    }

    /// Where block `i` (modulo the ring) starts: one shift and one mask.
    #[inline(always)]
    pub fn block_at(&self, i: usize) -> BlockAt {
        BlockAt(i.wrapping_shl(6) & self.byte_mask)
    }

    /// The ring's size in bytes.
    pub fn len_bytes(&self) -> usize {
        self.byte_mask + 1
    }

    /// The first word of the block at `at`.
    #[inline(always)]
    fn block_ptr_at(&self, at: BlockAt) -> *mut [AtomicU64; 8] {
        // `at` is this ring's (`block_at`) or below the length of one of
        // the same size (`BlockAt`'s contract), re-masked all the same so
        // that nothing rests on that.
        let at = at.0 & self.byte_mask;
        // SAFETY: `len` is a power of two ≥ 8, so `at` is a multiple of 64
        // below `8 len` (`block_at` made it one; the mask keeps it below)
        // and the block's 64 bytes end at or before the ring's end: inside
        // the `len` words from `base` that `new` checked lie inside `buf`'s
        // mapping (one allocation).
        unsafe { self.base.as_ptr().byte_add(at) }.cast::<[AtomicU64; 8]>()
    }
}

/// A consumer's position in a [`WordRing`] of blocks (a CQ's consumer
/// index), kept as the block's address so that reading the current block
/// is one load of the address and no shift or mask: [`BlockCursor::current`].
/// It moves one block at a time ([`BlockCursor::step`]) and stops every
/// `stride` blocks (a power of two that divides the ring): the step that
/// would reach a stop returns `true` without moving, and
/// [`BlockCursor::cross`] then moves onto it (at the ring's end: back to
/// block 0, one lap on). So `cur` is always a block of the ring, whatever
/// the caller does.
///
/// The distance to the stop is kept beside the address, counting down, so
/// that a step is a subtract whose sign says "stop", and an add: no compare
/// of the moved address (two read-modify-write instructions and a branch).
pub(crate) struct BlockCursor {
    ring: WordRing,
    /// The current block: `base + 64 i` for an `i` below the ring's blocks.
    cur: NonNull<[AtomicU64; 8]>,
    /// Bytes from `cur` to the last block before the next stop, when not
    /// negative: `cur + left + 64` is the stop, at most the ring's end
    /// (one past its last block), `stride` blocks apart from the base.
    /// Negative once a step found the stop, until [`BlockCursor::cross`].
    left: isize,
    /// The free-running index of block 0 in the current lap, times 64,
    /// less the ring's base address (wrapping): the current block's
    /// free-running index is `(cur + bias) / 64`, one add and one shift
    /// (the polls store `set_ci` from it after every CQE).
    bias: usize,
    /// `left` at a stop just crossed: `stride` blocks in bytes, less one
    /// block.
    full: isize,
}

// SAFETY: as `WordRing`'s (which it holds): pointers into the mapping the
// ring's `Arc<DmaBuffer>` keeps alive, used only to form `&AtomicU64`s.
unsafe impl Send for BlockCursor {}
// SAFETY: `&BlockCursor` hands out only `&AtomicU64`s, which are `Sync`.
unsafe impl Sync for BlockCursor {}

impl BlockCursor {
    /// At block 0 of `ring`, stopping every `stride` blocks; `None` unless
    /// `stride` is a power of two of at most the ring's blocks.
    pub fn new(ring: WordRing, stride: usize) -> Option<BlockCursor> {
        let stride_bytes = stride.checked_mul(64)?;
        if !stride.is_power_of_two() || stride_bytes > ring.len_bytes() {
            return None;
        }
        let cur = NonNull::new(ring.block_ptr(0))?;
        let full = isize::try_from(stride_bytes - 64).ok()?;
        let bias = 0usize.wrapping_sub(ring.base.as_ptr() as usize);
        Some(BlockCursor {
            ring,
            cur,
            left: full,
            bias,
            full,
        })
    }

    /// Blocks between stops.
    pub fn stride(&self) -> usize {
        (self.full.unsigned_abs() + 64) / 64
    }

    /// The current block.
    #[inline(always)]
    pub fn current(&self) -> &[AtomicU64; 8] {
        // SAFETY: `cur` is always a block of the ring (`new` starts it at
        // block 0; `step` moves it one block on only when `left` stays ≥ 0,
        // i.e. to at least one block before the stop, which is at most the
        // ring's end; `cross` moves it to the stop only when that is below
        // the end, else back to block 0), inside the mapping `ring` keeps
        // alive; the reference is to atomics (the module docs).
        unsafe { self.cur.as_ref() }
    }

    /// The free-running index of the current block.
    #[inline(always)]
    pub fn index(&self) -> u64 {
        ((self.cur.as_ptr() as usize).wrapping_add(self.bias) / 64) as u64
    }

    /// One block on, unless that is a stop: then `true` with nothing moved,
    /// and the caller owes [`BlockCursor::cross`].
    #[inline(always)]
    pub fn step(&mut self) -> bool {
        self.left -= 64;
        if self.left < 0 {
            // Stays negative however often a caller steps without
            // crossing.
            self.left = -1;
            return true;
        }
        // SAFETY: `left` was at least 64: `cur + 64` is at or before the
        // last block before the stop, which is at most the ring's end: a
        // block of the ring, in the same allocation as `cur`.
        let next = unsafe { self.cur.as_ptr().byte_add(64) };
        // SAFETY: that block's address, so not null.
        self.cur = unsafe { NonNull::new_unchecked(next) };
        false
    }

    /// Onto the next stop ([`BlockCursor::step`] reached it); whether that
    /// wrapped the ring (back to block 0, the next lap). Cold: once per
    /// `stride` blocks.
    pub fn cross(&mut self) -> bool {
        let base = self.ring.base.as_ptr().cast::<[AtomicU64; 8]>();
        let end = base.wrapping_byte_add(self.ring.len_bytes());
        let stop = self
            .cur
            .as_ptr()
            .wrapping_byte_add(self.left.max(0).unsigned_abs() + 64);
        let wrapped = stop >= end;
        let cur = if wrapped {
            self.bias = self.bias.wrapping_add(self.ring.len_bytes());
            base
        } else {
            stop
        };
        // (`cur` is block 0 or a stop below the end: a block of the ring.)
        if let Some(cur) = NonNull::new(cur) {
            self.cur = cur;
            self.left = self.full;
        }
        wrapped
    }
}

/// The byte offset of one block of a [`WordRing`] ([`WordRing::block_at`]):
/// a multiple of 64 below the ring's length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BlockAt(usize);

impl BlockAt {
    /// The offset in bytes.
    #[inline(always)]
    pub fn bytes(self) -> usize {
        self.0
    }
}

impl WordRing {
    /// Store `wqe` to the block at `at` ([`WordRing::block_at`]), lowest
    /// address first: its first 32 bytes as its [`BlockHead`] stores them,
    /// its last 32 bytes as [`Pairs`] (two 16-byte stores: SSE2, baseline
    /// on x86_64; four word stores elsewhere). The same 64 bytes as storing
    /// [`Wqebb::words`] to that [`WordRing::block`].
    #[inline(always)]
    pub fn store_block_at<H: BlockHead>(&self, at: BlockAt, wqe: &Wqebb<H>) {
        // SAFETY: as `block`: `block_ptr_at` points at 8 words inside the
        // mapping `self._buf` keeps alive.
        let bb: &[AtomicU64; 8] = unsafe { &*self.block_ptr_at(at) };
        let (head, tail) = bb.split_at(4);
        // (Both halves are 4 words: `split_at(4)` of 8.)
        if let (Ok(head), Ok(tail)) = (head.try_into(), tail.try_into()) {
            wqe.head.store(head);
            wqe.tail.store(tail);
        }
    }
}

/// Words 0..4 of a [`Wqebb`] (the control segment and the one after it),
/// shaped as the stores that write them. Two shapes, chosen by the writer:
/// [`Words`], four 8-byte values (for a writer whose operands arrive in
/// registers: four stores, no packing), and [`Pairs`], two 16-byte
/// registers (for one that decodes a request from memory and would
/// otherwise hold four more general registers across the tracking and
/// doorbell-record stores until the BlueFlame copy).
pub(crate) trait BlockHead: Copy {
    /// The four memory words `w`, lowest address first.
    fn from_words(w: [u64; 4]) -> Self;
    /// The four memory words.
    fn words(self) -> [u64; 4];
    /// Store to the four ring words `half` (half of a block; see
    /// [`WordRing::store_block_at`] for why the block may be written).
    fn store(self, half: &[AtomicU64; 4]);
    /// Volatile stores to the 32 bytes at `block`.
    ///
    /// # Safety
    ///
    /// `block` is valid for 32 bytes of volatile writes and 16-aligned.
    unsafe fn write_volatile(self, block: *mut u64);
}

/// Words 0..4 as four 8-byte values.
pub(crate) type Words = [u64; 4];
/// Words 0..4 as two [`Pair`]s.
pub(crate) type Pairs = [Pair; 2];

impl BlockHead for Words {
    #[inline(always)]
    fn from_words(w: [u64; 4]) -> Words {
        w
    }

    #[inline(always)]
    fn words(self) -> [u64; 4] {
        self
    }

    #[inline(always)]
    fn store(self, half: &[AtomicU64; 4]) {
        for (slot, w) in half.iter().zip(self) {
            slot.store(w, Ordering::Relaxed);
        }
    }

    #[inline(always)]
    unsafe fn write_volatile(self, block: *mut u64) {
        for (i, w) in self.iter().enumerate() {
            // SAFETY: word `i < 4` of the 32 bytes the caller vouches for.
            unsafe { block.wrapping_add(i).write_volatile(*w) };
        }
    }
}

impl BlockHead for Pairs {
    #[inline(always)]
    fn from_words(w: [u64; 4]) -> Pairs {
        [pair(w[0], w[1]), pair(w[2], w[3])]
    }

    #[inline(always)]
    fn words(self) -> [u64; 4] {
        let [a, b] = unpair(self[0]);
        let [c, d] = unpair(self[1]);
        [a, b, c, d]
    }

    #[inline(always)]
    fn store(self, half: &[AtomicU64; 4]) {
        #[cfg(target_arch = "x86_64")]
        {
            let p = half.as_ptr().cast_mut().cast::<__m128i>();
            for (k, pair) in self.iter().enumerate() {
                // SAFETY: `p` points at the four words of `half`, inside
                // the ring's checked mapping; pair `k` is words
                // `2k ..= 2k + 1` of it. `AtomicU64` has the layout of `u64`
                // and may be written through its pointer when no other
                // access races it: the block is past the device's consumer
                // (free) until the doorbell record that follows the store
                // hands it over, and the poster is the only writer (`&mut`
                // WorkQueues). An unaligned store, so no alignment is
                // assumed.
                unsafe { _mm_storeu_si128(p.wrapping_add(k), *pair) };
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        for (slot, w) in half.iter().zip(self.iter().flatten()) {
            slot.store(*w, Ordering::Relaxed);
        }
    }

    #[inline(always)]
    unsafe fn write_volatile(self, block: *mut u64) {
        for (k, pair) in self.iter().enumerate() {
            // SAFETY: bytes `16k .. 16k + 16` (k < 2) of the 32 bytes the
            // caller vouches for, 16-aligned: one volatile 16-byte store
            // (two 8-byte ones where `Pair` is two words).
            unsafe {
                block
                    .wrapping_add(2 * k)
                    .cast::<Pair>()
                    .write_volatile(*pair)
            };
        }
    }
}

/// Two memory words as one 16-byte register (x86_64) or a pair.
#[cfg(target_arch = "x86_64")]
pub(crate) type Pair = __m128i;
/// Two memory words as one 16-byte register (x86_64) or a pair.
#[cfg(not(target_arch = "x86_64"))]
pub(crate) type Pair = [u64; 2];

/// One WQEBB's 64 bytes held in registers, in memory order, shaped as the
/// stores that write it: words 0..4 (control and the segment after it,
/// built from fields) as the writer's [`BlockHead`], bytes 32..64 as two
/// 16-byte pairs (the inline payload, loaded whole, and zeros).
#[derive(Clone, Copy)]
pub(crate) struct Wqebb<H: BlockHead = Words> {
    pub head: H,
    pub tail: [Pair; 2],
}

impl<H: BlockHead> Wqebb<H> {
    /// The block of eight memory words `w`.
    #[inline(always)]
    pub fn from_words(w: [u64; 8]) -> Wqebb<H> {
        Wqebb {
            head: H::from_words([w[0], w[1], w[2], w[3]]),
            tail: [pair(w[4], w[5]), pair(w[6], w[7])],
        }
    }

    /// The eight memory words.
    #[inline(always)]
    pub fn words(&self) -> [u64; 8] {
        let [e, f, g, h] = self.head.words();
        let [a, b] = unpair(self.tail[0]);
        let [c, d] = unpair(self.tail[1]);
        [e, f, g, h, a, b, c, d]
    }

    /// Words 0..4 `head`, then an inline segment of up to 8 bytes: the
    /// header dword `header` (memory order: its bytes as they lie), the 8
    /// bytes `data` (the payload, zeros past its length), zeros to the end
    /// of the block (§9.3).
    #[inline(always)]
    pub fn with_inline8(head: [u64; 4], header: [u8; 4], data: [u8; 8]) -> Wqebb<H> {
        Wqebb {
            head: H::from_words(head),
            tail: [inline_pair(header, data), pair(0, 0)],
        }
    }
}

/// The first 16 bytes of an inline segment: `header`, the 8 bytes of
/// `data`, 4 zero bytes. On x86_64 the data goes straight into the register
/// and is shifted behind the header there (a load, a shift, an or).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn inline_pair(header: [u8; 4], data: [u8; 8]) -> Pair {
    // SSE2 is part of the x86_64 baseline (every x86_64 target enables
    // it); each intrinsic below is a register operation only.
    // SAFETY: as above.
    let d = unsafe { _mm_set_epi64x(0, i64::from_ne_bytes(data)) };
    // SAFETY: as above.
    let h = unsafe { _mm_set_epi64x(0, i64::from(u32::from_ne_bytes(header))) };
    // SAFETY: as above.
    let d = unsafe { _mm_slli_si128::<4>(d) };
    // SAFETY: as above.
    unsafe { _mm_or_si128(d, h) }
}

/// The first 16 bytes of an inline segment (see the x86_64 version).
#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
fn inline_pair(header: [u8; 4], data: [u8; 8]) -> Pair {
    let mut lo = [0u8; 8];
    lo[..4].copy_from_slice(&header);
    lo[4..].copy_from_slice(&data[..4]);
    let mut hi = [0u8; 8];
    hi[..4].copy_from_slice(&data[4..]);
    [u64::from_ne_bytes(lo), u64::from_ne_bytes(hi)]
}

/// Memory words `lo` (lower address) and `hi` as a [`Pair`].
#[inline(always)]
pub(crate) fn pair(lo: u64, hi: u64) -> Pair {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE2 is part of the x86_64 baseline; a register operation.
    unsafe {
        _mm_set_epi64x(hi as i64, lo as i64)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        [lo, hi]
    }
}

/// The two memory words of a [`Pair`], lower address first.
#[inline(always)]
pub(crate) fn unpair(p: Pair) -> [u64; 2] {
    #[cfg(target_arch = "x86_64")]
    {
        let mut out = [0u64; 2];
        // SAFETY: `out` is 16 writable bytes; an unaligned store.
        unsafe { _mm_storeu_si128(out.as_mut_ptr().cast::<__m128i>(), p) };
        out
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        p
    }
}

/// One word of a [`DmaBuffer`] (a doorbell record); see the module docs.
pub(crate) struct WordCell {
    word: NonNull<AtomicU64>,
    _buf: Arc<DmaBuffer>,
}

// SAFETY: as `WordRing`.
unsafe impl Send for WordCell {}
// SAFETY: as `WordRing`.
unsafe impl Sync for WordCell {}

impl WordCell {
    /// Word `at` of `buf`; `None` unless it lies inside the buffer's words.
    pub fn new(buf: Arc<DmaBuffer>, at: usize) -> Option<WordCell> {
        let word = NonNull::from(buf.words().get(at)?);
        Some(WordCell { word, _buf: buf })
    }

    /// Store `v` as the big-endian low half of the word's second dword
    /// (bytes 6..8, memory order): one 2-byte store, bytes 0..6 untouched —
    /// the doorbell record's send counter when its high half (bytes 4..6)
    /// is zero, as the driver keeps it (it writes the counter mod 2^16).
    #[inline(always)]
    pub fn store_dword1_low16(&self, v: u16) {
        // SAFETY: `word` is an 8-aligned word of the mapping `self._buf`
        // keeps (`new`), so `+ 6` is 2 bytes inside it, 2-aligned. The
        // poster is the record's only writer (`&mut` WorkQueues), and no
        // Rust access to it runs concurrently (the device reads it through
        // its own mapping; the driver's other reads of the word are by the
        // poster, or by tests after the post).
        let low = unsafe { AtomicU16::from_ptr(self.word.as_ptr().cast::<u16>().wrapping_add(3)) };
        low.store(v.to_be(), Ordering::Relaxed);
    }

    /// Store `v` as the word's first dword, big-endian (bytes 0..4, memory
    /// order), `Release`: one 4-byte store, bytes 4..8 untouched — the CQ
    /// doorbell record's `set_ci` after the CQEs it releases were read.
    #[inline(always)]
    pub fn store_dword0(&self, v: u32) {
        // SAFETY: `word` is an 8-aligned word of the mapping `self._buf`
        // keeps (`new`), so its first 4 bytes are inside it, 4-aligned. The
        // record's one writer is the holder of `&mut` (the poster, the
        // poller), and no Rust access to it runs concurrently (the device
        // reads it through its own mapping; the driver's other accesses are
        // by that writer, or by tests after it).
        let low = unsafe { AtomicU32::from_ptr(self.word.as_ptr().cast::<u32>()) };
        low.store(v.to_be(), Ordering::Release);
    }

    /// The word.
    #[inline(always)]
    pub fn get(&self) -> &AtomicU64 {
        let p = self.word.as_ptr();
        // SAFETY: `new` took the pointer from a reference to a word of
        // `buf`'s mapping, which lives as long as `self._buf`.
        unsafe { &*p }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::function::memory::IovaSpace;
    use rnic_dma::{IovaAllocator, RecordingMapper};

    fn buffer() -> Arc<DmaBuffer> {
        let space = IovaSpace::new(
            "fake".into(),
            Arc::new(RecordingMapper::new()),
            IovaAllocator::new(&[0x10_0000..=0xFFFF_FFFF]),
        );
        space.alloc(4096).unwrap()
    }

    #[test]
    fn indices_wrap_inside_the_checked_range() {
        let buf = buffer();
        let words = buf.words().len();
        assert!(WordRing::new(buf.clone(), 0, 12).is_none());
        assert!(WordRing::new(buf.clone(), 0, 4).is_none());
        assert!(WordRing::new(buf.clone(), words - 8, 16).is_none());
        assert!(WordRing::new(buf.clone(), usize::MAX, 16).is_none());
        assert!(WordCell::new(buf.clone(), words).is_none());
        let r = WordRing::new(buf.clone(), 16, 32).unwrap();
        // Block 5 of a 4-block ring is block 1: words 16 + 8 .. 16 + 16.
        for (i, w) in r.block(5).iter().enumerate() {
            w.store(100 + i as u64, Ordering::Relaxed);
        }
        r.word(32 + 31).store(7, Ordering::Relaxed);
        let all = buf.words();
        let got: Vec<u64> = all[16..48]
            .iter()
            .map(|w| w.load(Ordering::Relaxed))
            .collect();
        assert_eq!(&got[8..16], &[100, 101, 102, 103, 104, 105, 106, 107]);
        assert_eq!(got[31], 7);
        assert!(got[..8].iter().chain(&got[16..31]).all(|&w| w == 0));
        assert!(
            all[..16]
                .iter()
                .chain(&all[48..])
                .all(|w| w.load(Ordering::Relaxed) == 0)
        );
        let c = WordCell::new(buf.clone(), 100).unwrap();
        c.get().store(9, Ordering::Relaxed);
        assert_eq!(all[100].load(Ordering::Relaxed), 9);
    }

    #[test]
    fn a_cursor_stops_every_stride_and_never_leaves_the_ring() {
        let buf = buffer();
        // An 8-block ring at words 8.. (blocks at words 8, 16, …, 64).
        let ring = || WordRing::new(buf.clone(), 8, 64).unwrap();
        assert!(BlockCursor::new(ring(), 3).is_none());
        assert!(BlockCursor::new(ring(), 16).is_none());
        assert!(BlockCursor::new(ring(), 0).is_none());
        let r = ring();
        for i in 0..8 {
            r.block(i)[0].store(1000 + i as u64, Ordering::Relaxed);
        }
        let mut c = BlockCursor::new(r, 4).unwrap();
        assert_eq!(c.stride(), 4);
        let mut stops = Vec::new();
        let mut wraps = Vec::new();
        for n in 0..40u64 {
            assert_eq!(c.index(), n);
            // The current block is block `n` modulo the ring.
            assert_eq!(c.current()[0].load(Ordering::Relaxed), 1000 + n % 8);
            if c.step() {
                // A stop: nothing moved until `cross`.
                assert_eq!(c.index(), n);
                assert_eq!(c.current()[0].load(Ordering::Relaxed), 1000 + n % 8);
                stops.push(n + 1);
                if c.cross() {
                    wraps.push(n + 1);
                }
            }
        }
        assert_eq!(c.index(), 40);
        assert_eq!(stops, [4, 8, 12, 16, 20, 24, 28, 32, 36, 40]);
        assert_eq!(wraps, [8, 16, 24, 32, 40]);
        // A caller that never crosses stays at the block before the stop.
        let mut c = BlockCursor::new(ring(), 2).unwrap();
        for _ in 0..10 {
            c.step();
        }
        assert_eq!(c.index(), 1);
        assert_eq!(c.current()[0].load(Ordering::Relaxed), 1001);
        // A stride of the whole ring (and of one block) stops at each wrap
        // (and at each block).
        let mut c = BlockCursor::new(ring(), 8).unwrap();
        let mut hits = Vec::new();
        for _ in 0..16 {
            if c.step() && c.cross() {
                hits.push(c.index());
            }
        }
        assert_eq!(hits, [8, 16]);
        let mut c = BlockCursor::new(ring(), 1).unwrap();
        assert!((0..8).all(|_| c.step() && (c.cross() == (c.index().is_multiple_of(8)))));
        assert_eq!(c.index(), 8);
    }

    #[test]
    fn a_wqebb_stores_the_words_it_was_built_from() {
        let buf = buffer();
        let r = WordRing::new(buf.clone(), 8, 16).unwrap();
        let words = [1, 2, 3, 4, 0x5555, 0x6666, 0x7777, 0x8888_9999];
        let b = Wqebb::<Words>::from_words(words);
        assert_eq!(b.words(), words);
        // Block 3 of a 2-block ring is block 1: words 16..24.
        r.store_block_at(r.block_at(3), &b);
        let got: Vec<u64> = buf.words()[8..24]
            .iter()
            .map(|w| w.load(Ordering::Relaxed))
            .collect();
        assert_eq!(&got[8..], &words);
        assert!(got[..8].iter().all(|&w| w == 0));
        // The same bytes from the other head shape, to block 0.
        let p = Wqebb::<Pairs>::from_words(words);
        assert_eq!(p.words(), words);
        r.store_block_at(r.block_at(0), &p);
        let got: Vec<u64> = buf.words()[8..16]
            .iter()
            .map(|w| w.load(Ordering::Relaxed))
            .collect();
        assert_eq!(got, words);
        // The inline segment: header dword, 8 bytes, zeros (either shape).
        let b = Wqebb::<Pairs>::with_inline8([9, 8, 7, 6], [0x80, 0, 0, 8], *b"ABCDEFGH");
        assert_eq!(
            b.words(),
            Wqebb::<Words>::with_inline8([9, 8, 7, 6], [0x80, 0, 0, 8], *b"ABCDEFGH").words()
        );
        let mut seg = [0u8; 32];
        seg[..4].copy_from_slice(&[0x80, 0, 0, 8]);
        seg[4..12].copy_from_slice(b"ABCDEFGH");
        let w = b.words();
        assert_eq!(&w[..4], &[9, 8, 7, 6]);
        for (i, chunk) in seg.chunks(8).enumerate() {
            assert_eq!(w[4 + i].to_ne_bytes(), chunk, "word {}", 4 + i);
        }
    }

    #[test]
    fn the_send_counter_store_writes_bytes_6_and_7_alone() {
        let buf = buffer();
        let c = WordCell::new(buf.clone(), 3).unwrap();
        c.get().store(
            u64::from_ne_bytes([1, 2, 3, 4, 5, 6, 7, 8]),
            Ordering::Relaxed,
        );
        c.store_dword1_low16(0xabcd);
        let bytes = c.get().load(Ordering::Relaxed).to_ne_bytes();
        assert_eq!(bytes, [1, 2, 3, 4, 5, 6, 0xab, 0xcd]);
    }
}
