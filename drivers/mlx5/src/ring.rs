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
use std::sync::atomic::AtomicU64;

use crate::DmaBuffer;

/// `len` words of a [`DmaBuffer`] (a power of two, at least 8): a ring of
/// `len / 8` 64-byte blocks; see the module docs.
pub(crate) struct WordRing {
    base: NonNull<AtomicU64>,
    /// `len - 1`.
    mask: usize,
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
        let at = i.wrapping_mul(8) & self.mask;
        // SAFETY: `at < len` words from `base`, inside one allocation (the
        // mapping, checked in `new`).
        let p = unsafe { self.base.as_ptr().add(at) }.cast::<[AtomicU64; 8]>();
        // SAFETY: `len` is a power of two ≥ 8, so `at` is a multiple of 8
        // below `len` and `at + 8 <= len`; the `len` words from `base` lie
        // inside `buf`'s mapping (checked in `new`), which lives as long as
        // `self._buf`. `[AtomicU64; 8]` has the layout of 8 consecutive
        // words, and the reference is to atomics (the module docs).
        unsafe { &*p }
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
    use crate::memory::IovaSpace;
    use rnic_dma::{IovaAllocator, RecordingMapper};
    use std::sync::atomic::Ordering;

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
}
