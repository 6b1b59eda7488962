//! [`Mmio`]: the one way to touch device memory (a BAR, a UAR page, a
//! BlueFlame buffer).
//!
//! A raw base pointer, a length and an owner that keeps the mapping alive.
//! Every access is a single volatile load or store of the access width,
//! bounds- and alignment-checked, in little-endian or big-endian byte order
//! (mlx5 registers and doorbells are big-endian). No reference to the memory
//! is ever created: a `&u32` into a BAR would let the compiler invent,
//! merge or drop accesses that have side effects on the device.

use std::any::Any;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::error::DmaError;

/// A window of device memory; see the module docs.
#[derive(Clone)]
pub struct Mmio {
    base: NonNull<u8>,
    len: usize,
    owner: Arc<dyn Any + Send + Sync>,
}

impl fmt::Debug for Mmio {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mmio")
            .field("base", &self.base)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

// SAFETY: an Mmio is a pointer plus a Send + Sync owner; the device memory it
// names is not tied to a thread, and each access is a single volatile load or
// store, which hardware serializes per register. Ordering between threads is
// the driver's job (locks around doorbells), as in any MMIO driver. A window
// over RAM (tests) is the one case where concurrent accesses could race;
// `Mmio::new`'s contract puts keeping such a window single-threaded on its
// creator.
unsafe impl Send for Mmio {}
// SAFETY: see `Send`; `&Mmio` only offers the volatile accessors.
unsafe impl Sync for Mmio {}

macro_rules! accessors {
    ($($read:ident $write:ident $ty:ty, $from:ident $to:ident;)*) => {$(
        #[doc = concat!("Volatile `", stringify!($ty), "` load at `offset`, converted with `", stringify!($from), "`.")]
        pub fn $read(&self, offset: usize) -> Result<$ty, DmaError> {
            let ptr = self.at::<$ty>(offset)?;
            // SAFETY: `at` checked the access is in bounds and aligned; the
            // contract of `Mmio::new` makes the window valid for volatile
            // access of this width while `self.owner` lives.
            Ok(<$ty>::$from(unsafe { ptr.read_volatile() }))
        }

        #[doc = concat!("Volatile `", stringify!($ty), "` store at `offset`, converted with `", stringify!($to), "`.")]
        pub fn $write(&self, offset: usize, value: $ty) -> Result<(), DmaError> {
            let ptr = self.at::<$ty>(offset)?;
            // SAFETY: as in the read accessor.
            unsafe { ptr.write_volatile(value.$to()) };
            Ok(())
        }
    )*};
}

impl Mmio {
    /// Wrap `len` bytes of device memory at `base`, kept alive by `owner`.
    ///
    /// # Safety
    ///
    /// For as long as `owner` lives: `[base, base + len)` must stay mapped
    /// and valid for volatile 4- and 8-byte loads and stores at aligned
    /// addresses, and no Rust reference (`&`/`&mut`) to any of it may exist.
    /// `owner` must be what keeps the mapping alive (e.g. the VFIO device
    /// whose BAR was mmapped, or a heap buffer in tests).
    ///
    /// The window must be device memory (MMIO), where the hardware
    /// serializes each register access. Over ordinary RAM (a heap buffer
    /// standing in for a BAR in tests) volatile accesses are not atomic: the
    /// caller must then keep the `Mmio` and its clones and windows on one
    /// thread at a time, or otherwise make sure no two threads access the
    /// same bytes concurrently with one of them writing.
    pub unsafe fn new(base: NonNull<u8>, len: usize, owner: Arc<dyn Any + Send + Sync>) -> Mmio {
        Mmio { base, len, owner }
    }

    /// The window's length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the window is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The window's base address, length and owner, for a type that offers
    /// other accesses to the same device memory under the same contract
    /// (`rnic-mlx5`'s `BlockWindow`: 64-byte block stores). Nothing is
    /// dereferenced here; whoever builds on these parts takes over
    /// [`Mmio::new`]'s contract, which this window already satisfies.
    pub fn raw_parts(&self) -> (NonNull<u8>, usize, Arc<dyn Any + Send + Sync>) {
        (self.base, self.len, Arc::clone(&self.owner))
    }

    /// A sub-window `[offset, offset + len)` sharing this one's owner.
    pub fn window(&self, offset: usize, len: usize) -> Result<Mmio, DmaError> {
        self.check(offset, len)?;
        let base =
            NonNull::new(self.base.as_ptr().wrapping_add(offset)).ok_or(DmaError::OutOfBounds {
                offset: offset as u64,
                len: len as u64,
                region_len: self.len as u64,
            })?;
        Ok(Mmio {
            base,
            len,
            owner: Arc::clone(&self.owner),
        })
    }

    /// The window's base address, raw (for handing to the kernel, e.g. a
    /// peer BAR's `VFIO_IOMMU_MAP_DMA`): never make a reference from it.
    pub fn as_ptr(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    /// Copy `dst.len()` bytes at `offset` out of the window: aligned 8-byte
    /// volatile loads where possible, single bytes at the unaligned ends.
    pub fn read_bytes(&self, offset: usize, dst: &mut [u8]) -> Result<(), DmaError> {
        self.check(offset, dst.len())?;
        let mut i = 0;
        while i < dst.len() {
            let p = self.base.as_ptr().wrapping_add(offset + i);
            if (p as usize).is_multiple_of(8) && dst.len() - i >= 8 {
                // SAFETY: in bounds (checked above) and 8-aligned; `new`'s
                // contract makes the window valid for volatile 8-byte loads.
                let v = unsafe { p.cast::<u64>().read_volatile() };
                dst[i..i + 8].copy_from_slice(&v.to_ne_bytes());
                i += 8;
            } else {
                // SAFETY: in bounds; a byte load is always aligned.
                dst[i] = unsafe { p.read_volatile() };
                i += 1;
            }
        }
        Ok(())
    }

    /// Copy `src` into the window at `offset` (volatile stores, as
    /// [`Mmio::read_bytes`] loads).
    pub fn write_bytes(&self, offset: usize, src: &[u8]) -> Result<(), DmaError> {
        self.check(offset, src.len())?;
        let mut i = 0;
        while i < src.len() {
            let p = self.base.as_ptr().wrapping_add(offset + i);
            if (p as usize).is_multiple_of(8) && src.len() - i >= 8 {
                let mut w = [0u8; 8];
                w.copy_from_slice(&src[i..i + 8]);
                // SAFETY: in bounds and 8-aligned, as in read_bytes.
                unsafe { p.cast::<u64>().write_volatile(u64::from_ne_bytes(w)) };
                i += 8;
            } else {
                // SAFETY: in bounds; a byte store is always aligned.
                unsafe { p.write_volatile(src[i]) };
                i += 1;
            }
        }
        Ok(())
    }

    fn check(&self, offset: usize, len: usize) -> Result<(), DmaError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(DmaError::OutOfBounds {
                offset: offset as u64,
                len: len as u64,
                region_len: self.len as u64,
            }),
        }
    }

    fn at<T>(&self, offset: usize) -> Result<*mut T, DmaError> {
        let width = size_of::<T>();
        self.check(offset, width)?;
        let ptr = self.base.as_ptr().wrapping_add(offset);
        if !(ptr as usize).is_multiple_of(width) {
            return Err(DmaError::Misaligned {
                offset: offset as u64,
                width: width as u64,
            });
        }
        Ok(ptr.cast())
    }

    accessors! {
        read32 write32 u32, from_le to_le;
        read32_be write32_be u32, from_be to_be;
        read64 write64 u64, from_le to_le;
        read64_be write64_be u64, from_be to_be;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::alloc::{self, Layout};

    /// A heap buffer standing in for a BAR: owns the allocation Mmio points into.
    struct HeapBar {
        ptr: NonNull<u8>,
        layout: Layout,
    }

    // SAFETY: HeapBar owns its allocation exclusively, like a Box.
    unsafe impl Send for HeapBar {}
    // SAFETY: HeapBar exposes nothing; the Mmio accesses it via raw pointers.
    unsafe impl Sync for HeapBar {}

    impl Drop for HeapBar {
        fn drop(&mut self) {
            // SAFETY: allocated in `bar` with this layout, freed once here.
            unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) };
        }
    }

    fn bar(len: usize) -> Mmio {
        let layout = Layout::from_size_align(len, 64).unwrap();
        // SAFETY: non-zero size.
        let ptr = NonNull::new(unsafe { alloc::alloc_zeroed(layout) }).unwrap();
        let owner = Arc::new(HeapBar { ptr, layout });
        // SAFETY: the allocation is valid for `len` bytes, aligned to 64, and
        // lives as long as `owner`; no reference to it is created.
        unsafe { Mmio::new(ptr, len, owner) }
    }

    #[test]
    fn endianness_is_byte_exact() {
        let m = bar(64);
        m.write32_be(0, 0x0102_0304).unwrap();
        assert_eq!(m.read32(0).unwrap(), 0x0403_0201);
        assert_eq!(m.read32_be(0).unwrap(), 0x0102_0304);
        m.write64(8, 0x1122_3344_5566_7788).unwrap();
        assert_eq!(m.read64_be(8).unwrap(), 0x8877_6655_4433_2211);
        assert_eq!(
            m.read32(8).unwrap(),
            0x5566_7788,
            "low half first in little-endian"
        );
        assert_eq!(m.read32_be(12).unwrap(), 0x4433_2211);
        m.write64_be(16, 0xAABB_CCDD_0011_2233).unwrap();
        assert_eq!(
            m.read32_be(16).unwrap(),
            0xAABB_CCDD,
            "high half first in big-endian"
        );
    }

    #[test]
    fn bounds_and_alignment_are_typed_errors() {
        let m = bar(16);
        assert!(matches!(
            m.read32(16),
            Err(DmaError::OutOfBounds {
                offset: 16,
                len: 4,
                region_len: 16
            })
        ));
        assert!(matches!(
            m.write64(12, 0),
            Err(DmaError::OutOfBounds { .. })
        ));
        assert!(matches!(
            m.read32(usize::MAX - 1),
            Err(DmaError::OutOfBounds { .. })
        ));
        assert!(matches!(
            m.read32(2),
            Err(DmaError::Misaligned {
                offset: 2,
                width: 4
            })
        ));
        assert!(matches!(
            m.read64(4),
            Err(DmaError::Misaligned {
                offset: 4,
                width: 8
            })
        ));
        assert!(m.read64(8).is_ok());
    }

    #[test]
    fn windows_share_the_owner_and_are_bounded() {
        let m = bar(64);
        let w = m.window(32, 16).unwrap();
        drop(m);
        w.write32_be(12, 7).unwrap();
        assert_eq!(w.read32_be(12).unwrap(), 7);
        assert!(w.read32(16).is_err());
        assert!(w.window(8, 9).is_err());
    }
}
