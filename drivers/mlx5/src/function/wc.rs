//! [`BlockWindow`]: 64-byte BlueFlame copies into device memory with one
//! bounds check per block.
//!
//! [`rnic_dma::Mmio`] checks bounds and alignment on every 8-byte store,
//! which is what a register access wants but is most of the cost of a
//! BlueFlame copy (eight stores, eight checks). A `BlockWindow` names the
//! same mapping (pointer, length, the owner that keeps it mapped) and offers
//! one operation: [`BlockWindow::write_block`], which checks that the whole
//! 64-byte block lies inside the window and is 64-aligned, then issues eight
//! volatile 8-byte stores in order. It never reads, never creates a
//! reference into the mapping, and cannot be built over a window that is
//! not 64-aligned.

use std::any::Any;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

/// Bytes of one BlueFlame block (one WQEBB).
pub const BLOCK_BYTES: usize = 64;

/// A window of device memory for 64-byte block stores; see the module docs.
#[derive(Clone)]
pub struct BlockWindow {
    pub(crate) base: NonNull<u8>,
    pub(crate) len: usize,
    pub(crate) owner: Arc<dyn Any + Send + Sync>,
}

impl fmt::Debug for BlockWindow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlockWindow")
            .field("base", &self.base)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

// SAFETY: a pointer plus a Send + Sync owner, as `rnic_dma::Mmio`: the
// device memory is not tied to a thread and each access is one volatile
// store; which thread rings a register is the driver's discipline (one
// poster per QP, `&mut Qp`).
unsafe impl Send for BlockWindow {}
// SAFETY: see `Send`; `&BlockWindow` offers only the checked block store.
unsafe impl Sync for BlockWindow {}

impl BlockWindow {
    /// Wrap `len` bytes of device memory at `base`, kept mapped by `owner`;
    /// `None` unless `base` is 64-aligned.
    ///
    /// # Safety
    ///
    /// The contract of [`rnic_dma::Mmio::new`]: for as long as `owner`
    /// lives, `[base, base + len)` stays mapped and valid for volatile
    /// aligned 8-byte stores, no Rust reference to any of it exists, and
    /// `owner` is what keeps the mapping alive.
    pub unsafe fn new(
        base: NonNull<u8>,
        len: usize,
        owner: Arc<dyn Any + Send + Sync>,
    ) -> Option<BlockWindow> {
        if !(base.as_ptr() as usize).is_multiple_of(BLOCK_BYTES) {
            return None;
        }
        Some(BlockWindow { base, len, owner })
    }

    /// The same device memory as `mmio` (its base, length and owner), for
    /// block stores; `None` unless its base is 64-aligned.
    pub fn from_mmio(mmio: &rnic_dma::Mmio) -> Option<BlockWindow> {
        let (base, len, owner) = mmio.raw_parts();
        // SAFETY: the parts of a live `Mmio`, whose own contract (`Mmio::new`)
        // is this one's: `[base, base + len)` stays mapped and valid for
        // volatile aligned stores while `owner` lives, and no reference into
        // it exists.
        unsafe { BlockWindow::new(base, len, owner) }
    }

    /// The window's length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the window is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The sub-window `[offset, offset + len)`, sharing the owner; `None`
    /// if it is not inside this one or `offset` is not 64-aligned.
    pub fn window(&self, offset: usize, len: usize) -> Option<BlockWindow> {
        if !offset.is_multiple_of(BLOCK_BYTES) || offset.checked_add(len)? > self.len {
            return None;
        }
        let base = NonNull::new(self.base.as_ptr().wrapping_add(offset))?;
        Some(BlockWindow {
            base,
            len,
            owner: Arc::clone(&self.owner),
        })
    }

    /// Store `words` (in memory order: each as its bytes lie in memory) to
    /// the 64 bytes at `offset`, lowest address first; `false`, nothing
    /// stored, unless the block is inside the window and 64-aligned.
    #[inline(always)]
    pub fn write_block(&self, offset: usize, words: &[u64; 8]) -> bool {
        if !offset.is_multiple_of(BLOCK_BYTES)
            || offset
                .checked_add(BLOCK_BYTES)
                .is_none_or(|end| end > self.len)
        {
            return false;
        }
        let block = self.base.as_ptr().wrapping_add(offset).cast::<u64>();
        for (i, w) in words.iter().enumerate() {
            let word = block.wrapping_add(i);
            // SAFETY: `word` is 8 bytes of `[offset, offset + 64)`, inside
            // the window (checked above) and 8-aligned (base and offset are
            // 64-aligned); `new`'s contract makes the window valid for
            // volatile 8-byte stores while `self.owner` lives, and no
            // reference into it is created.
            unsafe { word.write_volatile(*w) };
        }
        true
    }
}
