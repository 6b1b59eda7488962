//! [`OwnedBuffer`]: memory the application owns, registered as it is and
//! filled or read in place.
//!
//! An application that already holds its data — a `Vec<u8>`, a tensor's
//! allocation, a hugepage [`DmaRegion`](crate::DmaRegion) — registers that
//! memory itself instead of copying into a buffer of the library's: the
//! `OwnedBuffer` takes ownership of the allocation (or, for memory some
//! other object owns, keeps that object alive), implements rnic-core's
//! [`Memory`] and offers direct access ([`Memory::direct`]), so a software
//! transport sends from it and receives into it with the kernel's copy
//! only. The application reaches the same bytes through [`OwnedBuffer::as_ptr`]
//! or, under the contract below, as a slice ([`OwnedBuffer::bytes`],
//! [`OwnedBuffer::bytes_mut`]): no copy through the API either way.
//!
//! # The in-place contract
//!
//! While registered, the buffer is shared with the transport (which reads
//! it for sends and READ responses and writes it for receives, RDMA WRITEs
//! landing and READ results) and with every peer holding its R_Key. A Rust
//! slice over it promises the compiler that nobody else changes the bytes
//! (`&[u8]`) or touches them at all (`&mut [u8]`) while the slice lives. So:
//!
//! * **Filling before a send/WRITE/serving a READ** (`bytes_mut`): no work
//!   request naming the range is posted or in flight, and no peer may write
//!   or read it (it has no remote access, or the application's protocol
//!   keeps peers away, as for any ibverbs buffer the application writes).
//! * **Reading results** (`bytes`): the operation that wrote the range has
//!   completed (its completion was polled, or for a peer's WRITE the
//!   protocol message that follows it arrived), and nothing may write the
//!   range until the slice is dropped.
//!
//! Breaking the contract is a data race on the application's side, exactly
//! as touching an ibverbs buffer under a posted request is; the library's own
//! accesses never form references, so they stay sound whatever the
//! application does.

use std::any::Any;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::AtomicU8;

use rnic_core::memory::{DirectSpan, check_atomic};
use rnic_core::{MemAccess, Memory, MemoryError};

use crate::copy::{read_span, write_span};

/// Who keeps an [`OwnedBuffer`]'s bytes allocated.
enum Owner {
    /// A `Box<[u8]>` taken apart into the buffer's pointer and length (put
    /// back together on drop or by [`OwnedBuffer::into_vec`]).
    Boxed,
    /// Another object owning the allocation (a tensor, a mapping): held,
    /// never used, dropped with the buffer.
    External(#[allow(dead_code)] Box<dyn Any + Send + Sync>),
}

/// Application-owned memory registered in place; see the module docs.
pub struct OwnedBuffer {
    ptr: NonNull<u8>,
    len: usize,
    owner: Owner,
}

// SAFETY: the buffer owns (or keeps alive) its allocation, which is not tied
// to a thread; the external owner is `Send + Sync` by its bound.
unsafe impl Send for OwnedBuffer {}
// SAFETY: `&OwnedBuffer` reaches the bytes only through raw-pointer copies
// (`crate::copy`, indivisible per byte), atomics, the raw address, and the
// unsafe slice accessors whose contract excludes concurrent access.
unsafe impl Sync for OwnedBuffer {}

impl fmt::Debug for OwnedBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnedBuffer")
            .field("addr", &self.ptr)
            .field("len", &self.len)
            .field(
                "owner",
                &match self.owner {
                    Owner::Boxed => "vec",
                    Owner::External(_) => "external",
                },
            )
            .finish()
    }
}

impl OwnedBuffer {
    /// Take `bytes` as the buffer (its allocation, not a copy of it).
    pub fn from_vec(bytes: Vec<u8>) -> Arc<OwnedBuffer> {
        let boxed = bytes.into_boxed_slice();
        let len = boxed.len();
        let ptr = NonNull::new(Box::into_raw(boxed).cast::<u8>()).unwrap_or(NonNull::dangling());
        Arc::new(OwnedBuffer {
            ptr,
            len,
            owner: Owner::Boxed,
        })
    }

    /// `len` zero bytes on the heap.
    pub fn zeroed(len: usize) -> Arc<OwnedBuffer> {
        OwnedBuffer::from_vec(vec![0; len])
    }

    /// `len` bytes at `ptr`, allocated and kept alive by `owner` (a tensor
    /// handle, a mapping's owner), which the buffer drops last.
    ///
    /// # Safety
    ///
    /// `ptr..ptr + len` is readable and writable memory for as long as
    /// `owner` lives, and nothing else holds a Rust reference to it (the
    /// application reaches it through this buffer's accessors, or through
    /// raw pointers under the module's contract).
    pub unsafe fn from_raw_parts(
        ptr: NonNull<u8>,
        len: usize,
        owner: impl Any + Send + Sync,
    ) -> Arc<OwnedBuffer> {
        Arc::new(OwnedBuffer {
            ptr,
            len,
            owner: Owner::External(Box::new(owner)),
        })
    }

    /// The address of byte 0, for code that fills or reads the bytes in
    /// place (a tensor library, a decoder writing into it); raw: the module
    /// docs' contract applies to what is done through it.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Bytes in the buffer.
    pub fn len(&self) -> usize {
        self.len
    }

    /// `true` when the buffer has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes as a slice, to read results in place.
    ///
    /// # Safety
    ///
    /// While the slice lives nothing writes the buffer: every operation that
    /// writes it has completed and none is posted, and no peer can write it
    /// (see the module docs).
    pub unsafe fn bytes(&self) -> &[u8] {
        // SAFETY: the allocation is `len` bytes, live while `self` is; the
        // caller guarantees nobody writes it while the slice lives.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes as a mutable slice, to fill them in place.
    ///
    /// # Safety
    ///
    /// While the slice lives nothing else reads or writes the buffer: no
    /// operation naming it is posted or in flight and no peer can reach it,
    /// and no other slice of it exists (see the module docs).
    #[allow(clippy::mut_from_ref)] // the contract above is what `&mut self` would prove
    pub unsafe fn bytes_mut(&self) -> &mut [u8] {
        // SAFETY: as `bytes`, and the caller guarantees exclusivity.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// The `Vec` back, when this is the last handle of a buffer made by
    /// [`OwnedBuffer::from_vec`] / [`OwnedBuffer::zeroed`] (deregistered,
    /// and no request holds it); otherwise the handle, unchanged.
    pub fn into_vec(this: Arc<OwnedBuffer>) -> Result<Vec<u8>, Arc<OwnedBuffer>> {
        if !matches!(this.owner, Owner::Boxed) {
            return Err(this);
        }
        let mut b = Arc::try_unwrap(this)?;
        let (ptr, len) = (b.ptr, b.len);
        // The box is rebuilt here and not again by `Drop`.
        b.len = 0;
        b.ptr = NonNull::dangling();
        drop(b);
        // SAFETY: `ptr`/`len` came from `Box::into_raw` of a `Box<[u8]>` of
        // `len` bytes in `from_vec` and were never freed (the `Drop` above ran
        // on the emptied copy, which frees nothing); the Arc was the last
        // handle, so no access is in flight.
        let boxed = unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr.as_ptr(), len)) };
        Ok(boxed.into_vec())
    }

    /// The buffer as atomic bytes (for the copies and atomics).
    fn atomics(&self) -> &[AtomicU8] {
        // SAFETY: the allocation is `len` bytes, live while `self` is;
        // `AtomicU8` has `u8`'s size and alignment; only atomic (or raw,
        // indivisible) accesses are made through it, so the shared slice
        // asserts nothing about the values.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().cast::<AtomicU8>(), self.len) }
    }

    /// The 8-byte word at `offset` (checked: in range, 8-aligned address).
    fn word(&self, offset: usize) -> Result<&std::sync::atomic::AtomicU64, MemoryError> {
        check_atomic(offset, self.len)?;
        let p = self.ptr.as_ptr().wrapping_add(offset);
        if !(p as usize).is_multiple_of(8) {
            return Err(MemoryError::Misaligned {
                access: MemAccess::Atomic,
                offset,
            });
        }
        // SAFETY: offset..offset + 8 lies inside the live allocation
        // (check_atomic) and `p` is 8-aligned (checked above); the word is
        // only accessed atomically here.
        Ok(unsafe { std::sync::atomic::AtomicU64::from_ptr(p.cast::<u64>()) })
    }
}

impl Drop for OwnedBuffer {
    fn drop(&mut self) {
        if matches!(self.owner, Owner::Boxed) && self.len > 0 {
            // SAFETY: made by `Box::into_raw` of a `len`-byte `Box<[u8]>` in
            // `from_vec`; `into_vec` empties `len` before dropping, so this
            // frees each allocation exactly once; `&mut self`: no access is in
            // flight.
            drop(unsafe {
                Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                    self.ptr.as_ptr(),
                    self.len,
                ))
            });
        }
        // An external owner drops after this, with the struct.
    }
}

impl Memory for OwnedBuffer {
    fn len(&self) -> usize {
        self.len
    }

    fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), MemoryError> {
        read_span(&DirectSpan::from_bytes(self.atomics()), offset, dst)
    }

    fn write(&self, offset: usize, src: &[u8]) -> Result<(), MemoryError> {
        write_span(&DirectSpan::from_bytes(self.atomics()), offset, src)
    }

    fn compare_swap_u64(&self, offset: usize, compare: u64, swap: u64) -> Result<u64, MemoryError> {
        use std::sync::atomic::Ordering;
        Ok(
            match self.word(offset)?.compare_exchange(
                compare,
                swap,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(v) | Err(v) => v,
            },
        )
    }

    fn fetch_add_u64(&self, offset: usize, add: u64) -> Result<u64, MemoryError> {
        Ok(self
            .word(offset)?
            .fetch_add(add, std::sync::atomic::Ordering::AcqRel))
    }

    fn direct(&self) -> Option<DirectSpan<'_>> {
        Some(DirectSpan::from_bytes(self.atomics()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vec_is_taken_not_copied_and_given_back() {
        let v: Vec<u8> = (0..100u8).collect();
        let addr = v.as_ptr() as usize;
        let buf = OwnedBuffer::from_vec(v);
        assert_eq!(buf.as_ptr() as usize, addr, "the Vec's own allocation");
        assert_eq!(buf.addr(), addr as u64);
        let mut got = [0u8; 10];
        buf.read(90, &mut got).unwrap();
        assert_eq!(got, [90, 91, 92, 93, 94, 95, 96, 97, 98, 99]);
        buf.write(0, b"abc").unwrap();
        let held = Arc::clone(&buf);
        let buf = OwnedBuffer::into_vec(buf).unwrap_err(); // another handle lives
        drop(held);
        let back = OwnedBuffer::into_vec(buf).unwrap();
        assert_eq!(back.as_ptr() as usize, addr);
        assert_eq!(&back[..4], b"abc\x03");
        assert_eq!(back.len(), 100);
    }

    #[test]
    fn in_place_fill_is_what_the_transport_reads() {
        let buf = OwnedBuffer::zeroed(64);
        // SAFETY: nothing else holds or accesses the buffer.
        unsafe { buf.bytes_mut() }.copy_from_slice(&[0x42; 64]);
        let mut via_memory = [0u8; 64];
        buf.read(0, &mut via_memory).unwrap();
        assert_eq!(via_memory, [0x42; 64]);
        buf.write(8, &[1, 2, 3]).unwrap();
        // SAFETY: as above.
        assert_eq!(&unsafe { buf.bytes() }[7..12], &[0x42, 1, 2, 3, 0x42]);
        let span = buf.direct().unwrap();
        assert_eq!((span.as_ptr(), span.len()), (buf.as_ptr(), 64));
    }

    #[test]
    fn atomics_need_aligned_in_range_words_and_return_the_old_value() {
        let buf = OwnedBuffer::zeroed(24);
        assert_eq!(buf.fetch_add_u64(8, 5), Ok(0));
        assert_eq!(buf.compare_swap_u64(8, 5, 9), Ok(5));
        assert_eq!(buf.fetch_add_u64(8, 0), Ok(9));
        assert!(matches!(
            buf.fetch_add_u64(4, 1),
            Err(MemoryError::Misaligned { .. })
        ));
        assert!(matches!(
            buf.fetch_add_u64(24, 1),
            Err(MemoryError::OutOfRange { .. })
        ));
        let mut w = [0u8; 8];
        buf.read(8, &mut w).unwrap();
        assert_eq!(u64::from_ne_bytes(w), 9);
    }

    #[test]
    fn an_external_owner_lives_as_long_as_the_buffer_and_keeps_its_vec() {
        struct Tensor(Vec<u8>, #[allow(dead_code)] Arc<()>);
        let alive = Arc::new(());
        let mut t = Tensor(vec![7; 32], Arc::clone(&alive));
        let ptr = NonNull::new(t.0.as_mut_ptr()).unwrap();
        // SAFETY: the Vec's buffer lives as long as the tensor, which the
        // buffer owns; nothing else references it.
        let buf = unsafe { OwnedBuffer::from_raw_parts(ptr, 32, t) };
        assert_eq!(Arc::strong_count(&alive), 2);
        buf.write(31, &[1]).unwrap();
        let mut b = [0u8; 2];
        buf.read(30, &mut b).unwrap();
        assert_eq!(b, [7, 1]);
        let buf = OwnedBuffer::into_vec(buf).unwrap_err(); // not a Vec it owns
        drop(buf);
        assert_eq!(
            Arc::strong_count(&alive),
            1,
            "the owner dropped with the buffer"
        );
    }

    #[test]
    fn empty_buffers_are_fine() {
        let buf = OwnedBuffer::from_vec(Vec::new());
        assert!(buf.is_empty());
        assert_eq!(buf.write(0, &[]), Ok(()));
        assert!(buf.write(0, &[1]).is_err());
        assert_eq!(OwnedBuffer::into_vec(buf).unwrap(), Vec::<u8>::new());
    }
}
