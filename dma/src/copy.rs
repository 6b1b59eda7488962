//! Bulk copies into and out of registered memory at `memcpy` speed.
//!
//! Registered memory is shared: a remote peer writes it (an RDMA WRITE
//! landing), the application reads and writes it, the kernel reads it for a
//! send — all at once, with no lock. Rust's abstract machine calls two
//! unsynchronised accesses to the same byte a data race (undefined behaviour)
//! unless both are atomic, which is why every `Memory` in rnic used to copy
//! through relaxed `AtomicU64` loads and stores, eight bytes per instruction
//! and never vectorised.
//!
//! Here the copy is one `rep movsb` in inline assembly over raw pointers
//! (x86-64; with ERMS/FSRM the CPU moves whole cache lines, at `memcpy`
//! speed). The compiler sees an opaque block that may read and write any
//! memory; what it does to each byte is what the hardware does, exactly as a
//! device's DMA or the kernel's `copy_to_user` into the same memory is. Its
//! effect is expressible in the abstract machine as a sequence of relaxed
//! one-byte atomic loads and stores (x86-64 performs every byte access of a
//! string move as a single, indivisible access), so it is race-free against
//! every other access rnic makes to these bytes — relaxed word copies,
//! read-modify-write atomics, other `rep movsb`s — and a racing reader sees,
//! per byte, an old or a new value, never anything else, as ibverbs
//! specifies for memory a device writes. On other architectures the same
//! functions copy with volatile 8-byte loads and stores (one byte at a time
//! at unaligned ends), which the compiler may neither merge, split, elide nor
//! invent; there the argument is the one `rnic-dma`'s `Mmio` makes for
//! device memory.
//!
//! The safe entry points take a [`DirectSpan`] (made only from slices of
//! atomics: live memory that anyone may change) and a caller's own buffer,
//! check the range and copy. `docs/SAFETY.md` lists the `unsafe` blocks.

use rnic_core::memory::DirectSpan;
use rnic_core::{MemAccess, MemoryError};

/// Copy `len` bytes from `src` to `dst`.
///
/// # Safety
///
/// `src` must be valid for reads and `dst` for writes of `len` bytes for the
/// whole call, and no Rust reference the compiler relies on may cover
/// `src..src + len` while another party writes it, or `dst..dst + len` at
/// all (the caller's `&mut [u8]` passed as `dst` is fine: it is this call's
/// to write). Other threads, processes and devices may read and write either
/// range concurrently: each byte is then copied as one indivisible access.
pub unsafe fn copy_raw(dst: *mut u8, src: *const u8, len: usize) {
    if len == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    {
        // The fast-string microcode falls to a tenth of its speed when the
        // destination lies 1..63 bytes after the source modulo 4 KiB (its
        // stores then alias the loads it has queued); glibc's memcpy avoids
        // `rep movsb` there too. Those copies run backward in 64-byte blocks
        // of SSE2 moves instead, whose loads never alias a queued store.
        let ahead = (dst as usize).wrapping_sub(src as usize) & 4095;
        if (1..64).contains(&ahead) && len >= 256 {
            // SAFETY: the caller's contract, passed on.
            unsafe { copy_backward_sse2(dst, src, len) };
            return;
        }
        // SAFETY: the caller guarantees both ranges are valid for `len`
        // bytes. `rep movsb` copies rcx bytes from [rsi] to [rdi] ascending
        // (the direction flag is clear at every asm boundary, a Rust
        // guarantee), each byte one indivisible access; it changes no flags
        // and no stack. The block may touch any memory (no
        // `nomem`/`readonly`), so the compiler keeps every access to the two
        // ranges on its side of it.
        unsafe {
            core::arch::asm!(
                "rep movsb",
                inout("rcx") len => _,
                inout("rdi") dst => _,
                inout("rsi") src => _,
                options(nostack, preserves_flags),
            );
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: as above; the fallback's accesses are volatile.
    unsafe {
        copy_volatile(dst, src, len)
    }
}

/// [`copy_raw`] for a destination just after the source modulo 4 KiB: the
/// tail beyond the last whole 64-byte block with `rep movsb`, then the
/// blocks from the last to the first, each four 16-byte SSE2 loads and then
/// four stores (x86-64's baseline; every byte one indivisible access).
///
/// # Safety
///
/// As [`copy_raw`].
#[cfg(target_arch = "x86_64")]
unsafe fn copy_backward_sse2(dst: *mut u8, src: *const u8, len: usize) {
    let body = len & !63;
    let tail = len - body;
    if tail > 0 {
        // SAFETY: body..len lies inside both ranges (caller's contract);
        // as the `rep movsb` in `copy_raw`.
        unsafe {
            core::arch::asm!(
                "rep movsb",
                inout("rcx") tail => _,
                inout("rdi") dst.wrapping_add(body) => _,
                inout("rsi") src.wrapping_add(body) => _,
                options(nostack, preserves_flags),
            );
        }
    }
    if body == 0 {
        return;
    }
    // SAFETY: every access is at [ptr + i, ptr + i + 64) with 0 <= i <
    // body <= len, inside both ranges (caller's contract); unaligned 16-byte
    // moves (`movdqu`), loads before stores per block; the block clobbers
    // only the registers it names, and may touch any memory.
    unsafe {
        core::arch::asm!(
            "2:",
            "sub {i}, 64",
            "movdqu {a}, xmmword ptr [{s} + {i}]",
            "movdqu {b}, xmmword ptr [{s} + {i} + 16]",
            "movdqu {c}, xmmword ptr [{s} + {i} + 32]",
            "movdqu {e}, xmmword ptr [{s} + {i} + 48]",
            "movdqu xmmword ptr [{d} + {i}], {a}",
            "movdqu xmmword ptr [{d} + {i} + 16], {b}",
            "movdqu xmmword ptr [{d} + {i} + 32], {c}",
            "movdqu xmmword ptr [{d} + {i} + 48], {e}",
            "jnz 2b",
            i = inout(reg) body => _,
            s = in(reg) src,
            d = in(reg) dst,
            a = out(xmm_reg) _,
            b = out(xmm_reg) _,
            c = out(xmm_reg) _,
            e = out(xmm_reg) _,
            options(nostack),
        );
    }
}

/// The portable copy: volatile 8-byte loads and stores where both pointers
/// allow them, single volatile bytes otherwise.
///
/// # Safety
///
/// As [`copy_raw`].
#[cfg(any(not(target_arch = "x86_64"), test))]
unsafe fn copy_volatile(dst: *mut u8, src: *const u8, len: usize) {
    let mut i = 0;
    let byte = |i: usize| {
        // SAFETY: i < len: inside the source range (caller's contract).
        let b = unsafe { src.wrapping_add(i).read_volatile() };
        // SAFETY: i < len: inside the destination range.
        unsafe { dst.wrapping_add(i).write_volatile(b) };
    };
    if (dst as usize) % 8 == (src as usize) % 8 {
        while i < len && !(dst as usize + i).is_multiple_of(8) {
            byte(i);
            i += 1;
        }
        while i + 8 <= len {
            // SAFETY: i + 8 <= len and both pointers are 8-aligned here.
            let w = unsafe { src.wrapping_add(i).cast::<u64>().read_volatile() };
            // SAFETY: as for the load.
            unsafe { dst.wrapping_add(i).cast::<u64>().write_volatile(w) };
            i += 8;
        }
    }
    while i < len {
        byte(i);
        i += 1;
    }
}

/// Copy `dst.len()` bytes of `span` starting at `offset` into `dst`.
pub fn read_span(span: &DirectSpan<'_>, offset: usize, dst: &mut [u8]) -> Result<(), MemoryError> {
    let src = span.range(MemAccess::Read, offset, dst.len())?;
    // SAFETY: `range` checked offset..offset + len inside the span, which is
    // live memory for its borrow (a span is made only from slices of
    // atomics); `dst` is the caller's exclusive buffer, and cannot overlap
    // the span (safe code cannot hold `&mut` into atomics it also shares).
    unsafe { copy_raw(dst.as_mut_ptr(), src, dst.len()) };
    Ok(())
}

/// Copy `src` into `span` starting at `offset`.
pub fn write_span(span: &DirectSpan<'_>, offset: usize, src: &[u8]) -> Result<(), MemoryError> {
    let dst = span.range(MemAccess::Write, offset, src.len())?;
    // SAFETY: as in `read_span`; the span's memory is atomics, writable
    // through a shared borrow (interior mutability), and the bytes of `src`
    // are only read.
    unsafe { copy_raw(dst, src.as_ptr(), src.len()) };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rnic_core::{HeapMemory, Memory};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU8, Ordering};

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed))
            .collect()
    }

    #[test]
    fn byte_exact_at_every_offset_and_length_and_neighbours_untouched() {
        const LEN: usize = 83;
        let mem = HeapMemory::from_bytes(&pattern(LEN, 1));
        let mut model = pattern(LEN, 1);
        let span = mem.direct().unwrap();
        let mut seed = 2;
        for offset in 0..=LEN {
            for len in 0..=(LEN - offset) {
                let data = pattern(len, seed);
                seed = seed.wrapping_add(5);
                write_span(&span, offset, &data).unwrap();
                model[offset..offset + len].copy_from_slice(&data);
                let mut back = vec![0u8; len];
                read_span(&span, offset, &mut back).unwrap();
                assert_eq!(back, data, "offset {offset} len {len}");
            }
        }
        assert_eq!(mem.to_vec(), model);
    }

    #[test]
    fn out_of_range_is_refused_and_copies_nothing() {
        let mem = HeapMemory::from_bytes(&[7u8; 16]);
        let span = mem.direct().unwrap();
        let mut dst = [1u8; 4];
        assert!(matches!(
            read_span(&span, 13, &mut dst),
            Err(MemoryError::OutOfRange {
                access: MemAccess::Read,
                offset: 13,
                len: 4,
                region_len: 16
            })
        ));
        assert_eq!(dst, [1; 4]);
        assert!(write_span(&span, usize::MAX, &[0; 2]).is_err());
        assert!(write_span(&span, 15, &[0; 2]).is_err());
        assert_eq!(mem.to_vec(), vec![7u8; 16]);
        assert_eq!(write_span(&span, 16, &[]), Ok(()));
    }

    #[test]
    fn the_volatile_fallback_is_byte_exact_at_every_alignment() {
        let src = pattern(64, 9);
        for s in 0..9 {
            for d in 0..9 {
                for len in [0, 1, 7, 8, 9, 17, 40] {
                    let mut dst = vec![0xEEu8; 64];
                    let (dp, sp) = (
                        dst.as_mut_ptr().wrapping_add(d),
                        src.as_ptr().wrapping_add(s),
                    );
                    // SAFETY: both ranges lie inside their vectors.
                    unsafe { copy_volatile(dp, sp, len) };
                    assert_eq!(&dst[d..d + len], &src[s..s + len]);
                    assert!(dst[..d].iter().chain(&dst[d + len..]).all(|&b| b == 0xEE));
                }
            }
        }
    }

    /// Every relative placement of destination and source modulo 4 KiB —
    /// including the 1..63 bytes ahead that take the backward SSE2 path —
    /// and lengths around the 64-byte blocks copy exactly and touch nothing
    /// outside the destination range.
    #[test]
    fn every_relative_offset_and_length_copies_exactly() {
        let src: Vec<u8> = pattern(4096 + 1024, 3);
        let mut arena = vec![0u8; 3 * 4096 + 2048];
        let base = arena.as_ptr() as usize;
        // A destination start whose address is `ahead` bytes after the
        // source's modulo 4 KiB.
        for ahead in [0usize, 1, 7, 8, 31, 32, 63, 64, 65, 4000, 4095] {
            for len in [255usize, 256, 257, 319, 320, 1000, 4096, 5000] {
                arena.fill(0xEE);
                let want = (src.as_ptr() as usize + ahead) % 4096;
                let at = (want + 4096 - base % 4096) % 4096;
                let d = &mut arena[at..at + len + 64];
                // SAFETY: `len` bytes lie inside `d` and inside `src`.
                unsafe { copy_raw(d.as_mut_ptr(), src.as_ptr(), len) };
                assert_eq!(&arena[at..at + len], &src[..len], "ahead {ahead} len {len}");
                assert!(
                    arena[..at]
                        .iter()
                        .chain(&arena[at + len..])
                        .all(|&b| b == 0xEE)
                );
            }
        }
    }

    /// Writers copying whole buffers of one byte value into the same range
    /// while a reader copies it out: every byte the reader sees is one some
    /// writer wrote (no torn or invented bytes), and the final contents are
    /// one writer's value per byte.
    #[test]
    fn concurrent_copies_only_ever_show_written_bytes() {
        let bytes: Arc<Vec<AtomicU8>> = Arc::new((0..4096).map(|_| AtomicU8::new(1)).collect());
        let writers: Vec<_> = [1u8, 2, 3]
            .into_iter()
            .map(|v| {
                let bytes = Arc::clone(&bytes);
                std::thread::spawn(move || {
                    let span = DirectSpan::from_bytes(&bytes);
                    let src = vec![v; 4096];
                    for _ in 0..2000 {
                        write_span(&span, 0, &src).unwrap();
                    }
                })
            })
            .collect();
        let span = DirectSpan::from_bytes(&bytes);
        let mut out = vec![0u8; 4096];
        for _ in 0..2000 {
            read_span(&span, 0, &mut out).unwrap();
            assert!(out.iter().all(|b| (1..=3).contains(b)));
        }
        for w in writers {
            w.join().unwrap();
        }
        assert!(
            bytes
                .iter()
                .all(|b| (1..=3).contains(&b.load(Ordering::Relaxed)))
        );
    }
}
