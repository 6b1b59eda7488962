//! [`BlockPair`]: the two halves of a BlueFlame register, written one
//! 64-byte block per post through a [`BlockWindow`] checked once.

use std::ptr::NonNull;
use std::sync::Arc;

use crate::function::wc::{BLOCK_BYTES, BlockWindow};
use crate::rdma::ring::{BlockHead, Wqebb};

/// The two halves of one BlueFlame register as two 64-byte blocks of a
/// [`BlockWindow`], both checked once when the pair is made:
/// [`BlockPair::write_next`] stores one block to the current half and flips
/// to the other, with no check per post. The current half is private here
/// and only ever the window's base or base + `flip`, so every store lands
/// in a checked block.
#[derive(Debug)]
pub struct BlockPair {
    window: BlockWindow,
    /// The current half: the window's base or base + `flip`.
    cur: *mut u8,
    /// The address of one half xor that of the other: `cur`'s address xor
    /// `toggle` is the other half (one `xor` per ring, no offset add).
    toggle: usize,
}

// SAFETY: as `BlockWindow` (which it holds): `cur` points into that
// window's device memory, used only for volatile stores by the one poster
// that holds `&mut BlockPair`; nothing in it is tied to a thread.
unsafe impl Send for BlockPair {}
// SAFETY: `&BlockPair` offers only `offset` (a read of the pair's own
// fields); every store needs `&mut`.
unsafe impl Sync for BlockPair {}

/// Two 64-byte blocks of host memory: what [`BlockPair::scratch`] writes
/// to (atomics, so that stores through a pointer derived from a shared
/// reference are allowed; nothing reads them).
#[repr(C, align(64))]
struct ScratchBlocks([std::sync::atomic::AtomicU64; 16]);

impl BlockPair {
    /// A pair over two blocks of host memory of its own, for a QP that has
    /// no BlueFlame pair of its own (a shared register, or a transport
    /// without a [`BlockWindow`]). Its stores reach no device: the driver
    /// never takes a path that rings through it (`WorkQueues::block_pair`
    /// keeps such a QP's fast-path gate closed), so the fast paths need no
    /// `Option` test; were one taken by mistake, it would write only here.
    pub fn scratch() -> BlockPair {
        let blocks = Arc::new(ScratchBlocks(Default::default()));
        let base = NonNull::from(&blocks.0).cast::<u8>();
        let a = base.as_ptr() as usize;
        // What `BlockWindow::new` and `BlockPair::new` would check holds by
        // construction: `base` is the start of the 128-byte, 64-aligned
        // allocation `blocks` owns (passed along as the owner), valid for
        // 8- and 16-byte stores while it lives (atomics: interior
        // mutability, so stores through this pointer are allowed), and no
        // other reference to it is used; both blocks lie inside it.
        BlockPair {
            cur: base.as_ptr(),
            toggle: a ^ a.wrapping_add(BLOCK_BYTES),
            window: BlockWindow {
                base,
                len: 2 * BLOCK_BYTES,
                owner: blocks,
            },
        }
    }

    /// Blocks at `0` and `half` of `window`; `None` unless `half` is a
    /// non-zero multiple of 64 and both blocks lie inside the window.
    pub fn new(window: BlockWindow, half: usize) -> Option<BlockPair> {
        if half == 0
            || !half.is_multiple_of(BLOCK_BYTES)
            || half.checked_add(BLOCK_BYTES)? > window.len
        {
            return None;
        }
        let base = window.base.as_ptr() as usize;
        Some(BlockPair {
            cur: window.base.as_ptr(),
            toggle: base ^ base.wrapping_add(half),
            window,
        })
    }

    /// The offset the next block goes to (`0` or the second half).
    #[inline(always)]
    pub fn offset(&self) -> usize {
        (self.cur as usize).wrapping_sub(self.window.base.as_ptr() as usize)
    }

    /// Switch to the other half without storing.
    #[inline(always)]
    pub fn advance(&mut self) {
        let toggle = self.toggle;
        // `a ^ (a ^ b) = b`: base ↔ base + flip, the pointer's provenance
        // (the window) kept.
        self.cur = self.cur.map_addr(|a| a ^ toggle);
    }

    /// Store `word0` (the first 8 bytes of a WQE's control segment, memory
    /// order) to the current half — the 8-byte doorbell of an uncached
    /// mapping or a shared register (mlx5.md §8; K ib/wr.c `mlx5_write64`)
    /// — then switch to the other half.
    #[inline(always)]
    pub(crate) fn ring_next(&mut self, word0: u64) {
        let word = self.cur.cast::<u64>();
        // SAFETY: `cur` is the window's base or base + `flip`, both checked
        // in `new` to start a 64-byte block inside the window, 8-aligned
        // (the base is 64-aligned); the window's contract makes it valid for
        // volatile 8-byte stores while `self.window`'s owner lives; no
        // reference into it is created.
        unsafe { word.write_volatile(word0) };
        self.advance();
    }

    /// Store `wqe` (memory order, lowest address first) to the current
    /// half, then switch to the other: words 0..4 as its [`BlockHead`]'s
    /// volatile stores, bytes 32..64 as two volatile 16-byte stores on
    /// x86_64 (four 8-byte stores elsewhere).
    #[inline(always)]
    pub(crate) fn write_next<H: BlockHead>(&mut self, wqe: &Wqebb<H>) {
        let block = self.cur.cast::<u64>();
        // SAFETY: `cur` is the window's base or base + `flip` (set in
        // `new`, changed only by `advance`'s xor of the two), and `new`
        // checked that `[0, 64)` and `[flip, flip + 64)` lie inside the
        // window and `flip` is a multiple of 64: the first 32 bytes at
        // `block` are inside the window, 16-aligned (the base is
        // 64-aligned, `BlockWindow::new`). The window's contract makes it
        // valid for volatile stores while its owner lives (`self.window`
        // holds it); no reference into it is created.
        unsafe { wqe.head.write_volatile(block) };
        // SAFETY: as above, bytes 32..64 of the current half (16-aligned).
        unsafe { wqe.tail.write_volatile(block.wrapping_add(4)) };
        self.advance();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rdma::ring::{Pairs, Words};
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Plain memory standing in for a BAR: 40 words, and the first of them
    /// that is 64-aligned (one of the first 8 is). Atomic words, so the
    /// test reads back what the window stored through raw pointers.
    fn memory() -> (Arc<Vec<AtomicU64>>, usize) {
        let mem: Arc<Vec<AtomicU64>> = Arc::new((0..40).map(|_| AtomicU64::new(0)).collect());
        let first = (0..8)
            .find(|k| (mem.as_ptr() as usize + k * 8).is_multiple_of(64))
            .unwrap();
        (mem, first)
    }

    fn window(mem: &Arc<Vec<AtomicU64>>, first: usize, len: usize) -> Option<BlockWindow> {
        assert!(first * 8 + len <= mem.len() * 8);
        let base = NonNull::new(mem[first..].as_ptr().cast_mut().cast::<u8>())?;
        // SAFETY: `len` bytes from word `first` lie inside the allocation
        // (asserted), which lives as long as the owner (the same Arc);
        // AtomicU64 words allow stores through shared pointers.
        unsafe { BlockWindow::new(base, len, mem.clone()) }
    }

    #[test]
    fn a_block_is_checked_once_and_lands_in_order() {
        let (all, first) = memory();
        let w = window(&all, first, 256).unwrap();
        let mem = &all[first..first + 32];
        let words = [1, 2, 3, 4, 5, 6, 7, 0x0102_0304_0506_0708u64.to_be()];
        assert!(w.write_block(128, &words));
        let got: Vec<u64> = mem[16..24]
            .iter()
            .map(|a| a.load(Ordering::Relaxed))
            .collect();
        assert_eq!(got, words);
        assert_eq!(
            mem[23].load(Ordering::Relaxed).to_ne_bytes(),
            [1, 2, 3, 4, 5, 6, 7, 8]
        );
        // Out of the window, straddling its end, misaligned: nothing stored.
        assert!(!w.write_block(256, &words));
        assert!(!w.write_block(200, &words));
        assert!(!w.write_block(usize::MAX - 63, &words));
        assert!(mem[..16].iter().all(|a| a.load(Ordering::Relaxed) == 0));
        assert!(mem[24..].iter().all(|a| a.load(Ordering::Relaxed) == 0));
        // A base that is not 64-aligned is refused.
        let off = NonNull::new(all[first + 1..].as_ptr().cast_mut().cast::<u8>()).unwrap();
        // SAFETY: 64 bytes from word first + 1 lie inside the allocation,
        // kept alive by the owner; nothing is stored (construction fails).
        assert!(unsafe { BlockWindow::new(off, 64, all.clone()) }.is_none());
        // Sub-windows: bounded, aligned.
        let half = w.window(128, 128).unwrap();
        assert!(half.write_block(64, &[9; 8]));
        assert_eq!(mem[24].load(Ordering::Relaxed), 9);
        assert!(!half.write_block(128, &[9; 8]));
        assert!(w.window(8, 64).is_none());
        assert!(w.window(192, 128).is_none());
        assert_eq!((half.len(), half.is_empty()), (128, false));
    }

    #[test]
    fn a_pair_alternates_between_its_two_checked_halves() {
        let (all, first) = memory();
        let mem = &all[first..first + 32];
        // Halves that do not fit, or are misaligned or empty: refused.
        assert!(BlockPair::new(window(&all, first, 128).unwrap(), 128).is_none());
        assert!(BlockPair::new(window(&all, first, 256).unwrap(), 96).is_none());
        assert!(BlockPair::new(window(&all, first, 256).unwrap(), 0).is_none());
        assert!(BlockPair::new(window(&all, first, 256).unwrap(), usize::MAX - 63).is_none());
        let mut p = BlockPair::new(window(&all, first, 256).unwrap(), 128).unwrap();
        assert_eq!(p.offset(), 0);
        p.write_next(&Wqebb::<Words>::from_words([1; 8]));
        assert_eq!(p.offset(), 128);
        p.write_next(&Wqebb::<Pairs>::from_words([2; 8]));
        assert_eq!(p.offset(), 0);
        p.advance();
        assert_eq!(p.offset(), 128);
        p.advance();
        p.write_next(&Wqebb::<Pairs>::from_words([3, 4, 5, 6, 7, 8, 9, 10]));
        let got: Vec<u64> = mem.iter().map(|a| a.load(Ordering::Relaxed)).collect();
        assert_eq!(got[..8], [3, 4, 5, 6, 7, 8, 9, 10]);
        assert_eq!(got[8..16], [0; 8]);
        assert_eq!(got[16..24], [2; 8]);
        assert_eq!(got[24..], [0; 8]);
    }

    #[test]
    fn a_scratch_pair_alternates_inside_its_own_two_blocks() {
        let mut p = BlockPair::scratch();
        assert_eq!(p.offset(), 0);
        p.write_next(&Wqebb::<Words>::from_words([1, 2, 3, 4, 5, 6, 7, 8]));
        assert_eq!(p.offset(), 64);
        p.write_next(&Wqebb::<Pairs>::from_words([9; 8]));
        assert_eq!(p.offset(), 0);
        let owner = Arc::clone(&p.window.owner);
        let blocks = owner
            .downcast_ref::<ScratchBlocks>()
            .expect("the scratch pair owns its blocks");
        let got: Vec<u64> = blocks.0.iter().map(|a| a.load(Ordering::Relaxed)).collect();
        assert_eq!(got[..8], [1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(got[8..], [9; 8]);
    }
}
