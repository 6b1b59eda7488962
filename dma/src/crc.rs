//! CRC-32 (IEEE 802.3, reflected: zlib's and crc32fast's) read straight out
//! of registered memory.
//!
//! The RoCEv2 ICRC is this CRC over every packet. A sender that sends its
//! payload in place from registered memory must compute it over bytes that
//! peers and the application may change at any moment, where a `&[u8]` (what
//! crc32fast takes) would be a data race. Here every load from the input is
//! an instruction inside inline assembly over a raw pointer — the argument of
//! [`copy`](crate::copy): the block is opaque to the compiler, and what it
//! does to each byte is one indivisible hardware read, as a device's DMA is.
//! A racing writer makes the value meaningless (the ICRC of a payload that
//! changes while it is sent is garbage on hardware too), never undefined
//! behaviour. Only register values are computed on with `core::arch`
//! intrinsics.
//!
//! The kernels fold the input as in Intel's "Fast CRC Computation for
//! Generic Polynomials Using PCLMULQDQ" (Gopal et al., 2009), written for
//! this module. A 16-byte block loaded little-endian is the polynomial of
//! its 128 message bits with byte 0's bit 0 the highest power (bit `i` of
//! the register is the coefficient of `x^(127-i)`): "reflected". An
//! accumulator `A = H·x^64 + L` followed by `D` more bits becomes
//! `H·(x^(D+32) mod P)·x^32 + L·(x^(D-32) mod P)·x^32 ≡ A·x^D`: two 64×33-bit
//! carry-less multiplies whose 96-bit result lines up with the block `D`
//! bits later, XORed into it. The constants are computed by [`x_pow_mod`] in
//! `const` context and checked against published values in the tests. At
//! the end, 128 bits are reduced to 96 (`x^96 mod P`), to 64 (`x^64 mod P`),
//! and by Barrett reduction (`floor(x^64 / P)`) to the 32-bit CRC register.
//! The CRC register passed in is XORed into the first four message bytes,
//! which is what starting the register at that value means.
//!
//! * [`Kernel::Vpclmul512`] (AVX-512F + VPCLMULQDQ): four 512-bit
//!   accumulators, sixteen 128-bit streams, 256 bytes per iteration; the
//!   256-bit kernel's path below [`WIDE512_MIN`] bytes.
//! * [`Kernel::Vpclmul256`] (AVX2 + VPCLMULQDQ): four 256-bit accumulators,
//!   eight 128-bit streams, 128 bytes per iteration.
//! * [`Kernel::Pclmul128`] (PCLMULQDQ): four 128-bit accumulators, 64 bytes
//!   per iteration; also the wide kernel's path below [`WIDE_MIN`] bytes.
//! * [`Kernel::Portable`]: copy into a stack buffer with
//!   [`copy_raw`](crate::copy::copy_raw) and feed crc32fast; also every
//!   kernel's tail of fewer than 16 bytes (and inputs under [`NARROW_MIN`]).
//!
//! The best kernel the CPU has is chosen once ([`Kernel::selected`]).
//! crc32fast 1.5 folds with VPCLMULQDQ too; what this module adds is the
//! raw-pointer input, not speed over slices (`dma/benches/crc.rs` compares
//! them; `docs/SAFETY.md` lists the `unsafe` blocks).

use std::sync::atomic::{AtomicU8, Ordering};

use rnic_core::memory::DirectSpan;
use rnic_core::{MemAccess, MemoryError};

use crate::copy::copy_raw;

/// The CRC-32 generator polynomial, `x^32 + x^26 + … + 1`, bit `i` the
/// coefficient of `x^i` (bit 32 set).
const P: u64 = 0x1_04C1_1DB7;

/// `x^n mod P` (bit `i` the coefficient of `x^i`), by shifting one bit at a
/// time: `x^(k+1) mod P = x·(x^k mod P)`, minus `P` when the `x^32` bit
/// appears.
const fn x_pow_mod(n: u32) -> u32 {
    let mut r: u64 = 1;
    let mut i = 0;
    while i < n {
        r <<= 1;
        if r & (1 << 32) != 0 {
            r ^= P;
        }
        i += 1;
    }
    r as u32
}

/// A polynomial of degree < 32 as a 33-bit reflected operand (the
/// coefficient of `x^j` at bit `32 - j`): a carry-less product of a 64-bit
/// reflected block half by it is the reflected 96-bit product.
const fn reflect33(f: u32) -> u64 {
    (f.reverse_bits() as u64) << 1
}

/// The pair a fold by `d` bits multiplies the low and the high half of an
/// accumulator by: `[x^(d+32) mod P, x^(d-32) mod P]`, reflected.
const fn fold_by(d: u32) -> [u64; 2] {
    [reflect33(x_pow_mod(d + 32)), reflect33(x_pow_mod(d - 32))]
}

/// `floor(x^64 / P)` (degree 32) as a 33-bit reflected operand: Barrett's
/// quotient estimate.
const fn barrett_mu() -> u64 {
    let mut rem: u128 = 1 << 64;
    let mut q: u64 = 0;
    let mut i: i32 = 32;
    while i >= 0 {
        if rem & (1u128 << (i + 32)) != 0 {
            q |= 1 << i;
            rem ^= (P as u128) << i;
        }
        i -= 1;
    }
    q.reverse_bits() >> 31
}

/// Fold constants for the distances the kernels fold by, in bits: one
/// 128-bit block, one 256-bit lane pair, four blocks (one 512-bit
/// accumulator), four 256-bit accumulators, four 512-bit accumulators.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const FOLD_128: [u64; 2] = fold_by(128);
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const FOLD_256: [u64; 2] = fold_by(256);
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const FOLD_512: [u64; 2] = fold_by(512);
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const FOLD_1024: [u64; 2] = fold_by(1024);
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const FOLD_2048: [u64; 2] = fold_by(2048);
/// The 128 → 96 → 64-bit reduction: `x^96 mod P`, `x^64 mod P`, reflected.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const REDUCE: [u64; 2] = [reflect33(x_pow_mod(96)), reflect33(x_pow_mod(64))];
/// Barrett: `[floor(x^64 / P), P]`, reflected (33 bits each).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const BARRETT: [u64; 2] = [barrett_mu(), P.reverse_bits() >> 31];

/// Inputs of at least this many bytes take the 512-bit kernel (when it is
/// the selected one); shorter ones the 256-bit kernel.
pub const WIDE512_MIN: usize = 512;
/// Inputs of at least this many bytes take the 256-bit kernel (when it or
/// the 512-bit one is the selected one); shorter ones the 128-bit kernel.
pub const WIDE_MIN: usize = 256;
/// Inputs of at least this many bytes take a folding kernel; shorter ones
/// (and the last `len % 16` bytes of any) are read through crc32fast.
pub const NARROW_MIN: usize = 64;

/// Which CRC kernel runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Kernel {
    /// AVX-512F + VPCLMULQDQ: 512-bit carry-less folds (x86-64).
    Vpclmul512,
    /// AVX2 + VPCLMULQDQ: 256-bit carry-less folds (x86-64).
    Vpclmul256,
    /// PCLMULQDQ: 128-bit carry-less folds (x86-64).
    Pclmul128,
    /// A stack bounce buffer and crc32fast (every CPU).
    Portable,
}

/// [`Kernel::selected`]'s cached answer: 0 until detected, else the
/// kernel's `code`.
static SELECTED: AtomicU8 = AtomicU8::new(0);

impl Kernel {
    /// Every kernel, fastest first.
    pub const ALL: [Kernel; 4] = [
        Kernel::Vpclmul512,
        Kernel::Vpclmul256,
        Kernel::Pclmul128,
        Kernel::Portable,
    ];

    /// Whether this CPU can run the kernel.
    pub fn is_available(self) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            Kernel::Vpclmul512 => {
                is_x86_feature_detected!("avx512f") && Kernel::Vpclmul256.is_available()
            }
            #[cfg(target_arch = "x86_64")]
            Kernel::Vpclmul256 => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("pclmulqdq")
                    && is_x86_feature_detected!("vpclmulqdq")
            }
            #[cfg(target_arch = "x86_64")]
            Kernel::Pclmul128 => is_x86_feature_detected!("pclmulqdq"),
            Kernel::Portable => true,
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The fastest kernel this CPU has (detected once, then cached).
    pub fn selected() -> Kernel {
        let code = SELECTED.load(Ordering::Relaxed);
        if let Some(k) = Kernel::ALL.into_iter().find(|k| k.code() == code) {
            return k;
        }
        let k = Kernel::ALL
            .into_iter()
            .find(|k| k.is_available())
            .unwrap_or(Kernel::Portable);
        SELECTED.store(k.code(), Ordering::Relaxed);
        k
    }

    fn code(self) -> u8 {
        match self {
            Kernel::Vpclmul512 => 4,
            Kernel::Vpclmul256 => 3,
            Kernel::Pclmul128 => 2,
            Kernel::Portable => 1,
        }
    }

    /// A short name: `vpclmul512`, `vpclmul256`, `pclmul128`, `portable`
    /// (as the `crc` benchmark and `rnicctl doctor` print it).
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Vpclmul512 => "vpclmul512",
            Kernel::Vpclmul256 => "vpclmul256",
            Kernel::Pclmul128 => "pclmul128",
            Kernel::Portable => "portable",
        }
    }
}

/// The CRC-32 of `len` bytes at `ptr`, continuing from `crc` (zlib's
/// convention: `crc32(crc32(0, a), b) == crc32(0, a ‖ b)`, crc32fast's
/// `Hasher::new_with_initial(crc)`; start with 0).
///
/// # Safety
///
/// `ptr` must be valid for reads of `len` bytes for the whole call, and no
/// Rust reference the compiler relies on may cover the range while another
/// party writes it. Other threads, processes and devices may write the
/// range concurrently: each byte is then read once, indivisibly, and the
/// result is the CRC of the bytes as read (meaningless, but defined).
pub unsafe fn crc32_raw(crc: u32, ptr: *const u8, len: usize) -> u32 {
    // SAFETY: the caller's contract; the selected kernel is available.
    unsafe { crc32_raw_with(Kernel::selected(), crc, ptr, len) }
}

/// The CRC-32 of `len` bytes of `span` from `offset`, continuing from `crc`
/// ([`crc32_raw`]'s convention), read in place.
pub fn crc32_span(
    crc: u32,
    span: &DirectSpan<'_>,
    offset: usize,
    len: usize,
) -> Result<u32, MemoryError> {
    let src = span.range(MemAccess::Read, offset, len)?;
    // SAFETY: `range` checked offset..offset + len inside the span, which is
    // live memory for its borrow (made only from slices of atomics); no
    // reference to its bytes exists, only atomics others may write through.
    Ok(unsafe { crc32_raw(crc, src, len) })
}

/// The CRC-32 of `bytes`, continuing from `crc` ([`crc32_raw`]'s
/// convention), with the selected kernel.
pub fn crc32(crc: u32, bytes: &[u8]) -> u32 {
    crc32_slice(Kernel::selected(), crc, bytes)
}

/// [`crc32`] with a given kernel; `None` when this CPU lacks it.
pub fn crc32_with(kernel: Kernel, crc: u32, bytes: &[u8]) -> Option<u32> {
    kernel
        .is_available()
        .then(|| crc32_slice(kernel, crc, bytes))
}

/// [`crc32_with`] for a kernel known to be available.
fn crc32_slice(kernel: Kernel, crc: u32, bytes: &[u8]) -> u32 {
    // SAFETY: a shared slice is valid for reads of its length and nobody
    // writes it while it is borrowed; the caller checked `kernel`.
    let (crc, done) = unsafe { fold(kernel, crc, bytes.as_ptr(), bytes.len()) };
    match bytes.get(done..) {
        Some(tail) if !tail.is_empty() => {
            let mut h = crc32fast::Hasher::new_with_initial(crc);
            h.update(tail);
            h.finalize()
        }
        _ => crc,
    }
}

/// [`crc32_raw`] with a given kernel.
///
/// # Safety
///
/// As [`crc32_raw`], and `kernel.is_available()`.
unsafe fn crc32_raw_with(kernel: Kernel, crc: u32, ptr: *const u8, len: usize) -> u32 {
    // SAFETY: the caller's contract, passed on.
    let (crc, done) = unsafe { fold(kernel, crc, ptr, len) };
    // SAFETY: done <= len, so the rest lies inside the caller's range.
    unsafe { crc32_bounced(crc, ptr.wrapping_add(done), len - done) }
}

/// The folding kernels' part of `len` bytes at `ptr`: the CRC after the
/// first `done` bytes (a multiple of 16, 0 when `len` is under
/// [`NARROW_MIN`] or the kernel is [`Kernel::Portable`]), and `done`.
///
/// # Safety
///
/// As [`crc32_raw_with`].
unsafe fn fold(kernel: Kernel, crc: u32, ptr: *const u8, len: usize) -> (u32, usize) {
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (ptr, len);
    match kernel {
        #[cfg(target_arch = "x86_64")]
        Kernel::Vpclmul512 if len >= WIDE512_MIN => {
            // SAFETY: the caller's range and the kernel's features, passed
            // on; len >= WIDE512_MIN >= 256.
            unsafe { x86::fold_vpclmul512(crc, ptr, len) }
        }
        #[cfg(target_arch = "x86_64")]
        Kernel::Vpclmul512 | Kernel::Vpclmul256 if len >= WIDE_MIN => {
            // SAFETY: the caller's range and the kernel's features, passed
            // on (the 512-bit kernel's include the 256-bit one's); len >=
            // WIDE_MIN >= 128.
            unsafe { x86::fold_vpclmul(crc, ptr, len) }
        }
        #[cfg(target_arch = "x86_64")]
        Kernel::Vpclmul512 | Kernel::Vpclmul256 | Kernel::Pclmul128 if len >= NARROW_MIN => {
            // SAFETY: as above (VPCLMULQDQ's features include PCLMULQDQ);
            // len >= NARROW_MIN >= 64.
            unsafe { x86::fold_pclmul(crc, ptr, len) }
        }
        _ => (crc, 0),
    }
}

/// Bytes [`crc32_bounced`] copies at a time.
const BOUNCE: usize = 512;

/// The portable kernel: `len` bytes at `ptr` copied [`BOUNCE`] at a time
/// into a stack buffer by [`copy_raw`], each copy fed to crc32fast.
///
/// # Safety
///
/// As [`crc32_raw`].
unsafe fn crc32_bounced(crc: u32, ptr: *const u8, len: usize) -> u32 {
    if len == 0 {
        return crc;
    }
    let mut buf = [0u8; BOUNCE];
    let mut h = crc32fast::Hasher::new_with_initial(crc);
    let mut done = 0;
    while done < len {
        let n = (len - done).min(BOUNCE);
        // SAFETY: done + n <= len: inside the caller's range; `buf` is ours
        // and holds n <= BOUNCE bytes.
        unsafe { copy_raw(buf.as_mut_ptr(), ptr.wrapping_add(done), n) };
        h.update(buf.get(..n).unwrap_or(&[]));
        done += n;
    }
    h.finalize()
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! The folding kernels. Loads from the input are `asm!` blocks (the
    //! only `unsafe` here); everything else is register arithmetic.

    use core::arch::asm;
    use core::arch::x86_64::{
        __m128i, __m256i, __m512i, _mm_and_si128, _mm_clmulepi64_si128, _mm_cvtsi32_si128,
        _mm_cvtsi128_si32, _mm_set_epi32, _mm_set_epi64x, _mm_srli_si128, _mm_xor_si128,
        _mm256_castsi256_si128, _mm256_clmulepi64_epi128, _mm256_extracti128_si256,
        _mm256_set_epi64x, _mm256_setzero_si256, _mm256_xor_si256, _mm256_zextsi128_si256,
        _mm512_castsi512_si256, _mm512_clmulepi64_epi128, _mm512_extracti64x4_epi64,
        _mm512_set_epi64, _mm512_setzero_si512, _mm512_ternarylogic_epi64, _mm512_zextsi128_si512,
    };

    use super::{BARRETT, FOLD_128, FOLD_256, FOLD_512, FOLD_1024, FOLD_2048, REDUCE};

    /// Four consecutive 16-byte blocks at `p`, read by `movdqu` in one
    /// `asm!` block.
    ///
    /// # Safety
    ///
    /// `p..p + 64` is valid for reads (others may write it: each byte is
    /// read once, indivisibly).
    #[inline]
    unsafe fn load4x128(p: *const u8) -> [__m128i; 4] {
        let (a, b, c, d): (__m128i, __m128i, __m128i, __m128i);
        // SAFETY: the 64 bytes lie in the caller's range; unaligned loads
        // (`movdqu`); the block only reads memory (`readonly`), touches no
        // stack or flags and writes only the four registers it names.
        unsafe {
            asm!(
                "movdqu {a}, xmmword ptr [{p}]",
                "movdqu {b}, xmmword ptr [{p} + 16]",
                "movdqu {c}, xmmword ptr [{p} + 32]",
                "movdqu {d}, xmmword ptr [{p} + 48]",
                p = in(reg) p,
                a = out(xmm_reg) a,
                b = out(xmm_reg) b,
                c = out(xmm_reg) c,
                d = out(xmm_reg) d,
                options(nostack, readonly, preserves_flags),
            );
        }
        [a, b, c, d]
    }

    /// The 16-byte block at `p` (`movdqu`).
    ///
    /// # Safety
    ///
    /// `p..p + 16` is valid for reads (as [`load4x128`]).
    #[inline]
    unsafe fn load128(p: *const u8) -> __m128i {
        let v: __m128i;
        // SAFETY: the 16 bytes lie in the caller's range; as `load4x128`.
        unsafe {
            asm!(
                "movdqu {v}, xmmword ptr [{p}]",
                p = in(reg) p,
                v = out(xmm_reg) v,
                options(nostack, readonly, preserves_flags),
            );
        }
        v
    }

    /// [`load128`] under AVX: `vmovdqu` (no legacy-SSE instruction after
    /// 256-bit code).
    ///
    /// # Safety
    ///
    /// As [`load128`].
    #[inline]
    #[target_feature(enable = "avx")]
    unsafe fn load128_vex(p: *const u8) -> __m128i {
        let v: __m128i;
        // SAFETY: the 16 bytes lie in the caller's range; as `load4x128`.
        unsafe {
            asm!(
                "vmovdqu {v}, xmmword ptr [{p}]",
                p = in(reg) p,
                v = out(xmm_reg) v,
                options(nostack, readonly, preserves_flags),
            );
        }
        v
    }

    /// `v[i]` XOR the `i`-th of four consecutive 32-byte blocks at `p`:
    /// the loads folded into `vpxor` in one `asm!` block (one instruction
    /// per block instead of a load and an XOR).
    ///
    /// # Safety
    ///
    /// `p..p + 128` is valid for reads (as [`load4x128`]).
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn xor_load4x256(p: *const u8, v: [__m256i; 4]) -> [__m256i; 4] {
        let [mut a, mut b, mut c, mut d] = v;
        // SAFETY: the 128 bytes lie in the caller's range; as `load4x128`
        // (the four registers are read and written).
        unsafe {
            asm!(
                "vpxor {a}, {a}, ymmword ptr [{p}]",
                "vpxor {b}, {b}, ymmword ptr [{p} + 32]",
                "vpxor {c}, {c}, ymmword ptr [{p} + 64]",
                "vpxor {d}, {d}, ymmword ptr [{p} + 96]",
                p = in(reg) p,
                a = inout(ymm_reg) a,
                b = inout(ymm_reg) b,
                c = inout(ymm_reg) c,
                d = inout(ymm_reg) d,
                options(nostack, readonly, preserves_flags),
            );
        }
        [a, b, c, d]
    }

    /// `v[i]` XOR the `i`-th of four consecutive 64-byte blocks at `p`, as
    /// [`xor_load4x256`] with 512-bit registers.
    ///
    /// # Safety
    ///
    /// `p..p + 256` is valid for reads (as [`load4x128`]).
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn xor_load4x512(p: *const u8, v: [__m512i; 4]) -> [__m512i; 4] {
        let [mut a, mut b, mut c, mut d] = v;
        // SAFETY: the 256 bytes lie in the caller's range; as `load4x128`
        // (the four registers are read and written).
        unsafe {
            asm!(
                "vpxorq {a}, {a}, zmmword ptr [{p}]",
                "vpxorq {b}, {b}, zmmword ptr [{p} + 64]",
                "vpxorq {c}, {c}, zmmword ptr [{p} + 128]",
                "vpxorq {d}, {d}, zmmword ptr [{p} + 192]",
                p = in(reg) p,
                a = inout(zmm_reg) a,
                b = inout(zmm_reg) b,
                c = inout(zmm_reg) c,
                d = inout(zmm_reg) d,
                options(nostack, readonly, preserves_flags),
            );
        }
        [a, b, c, d]
    }

    /// `v` XOR the 64-byte block at `p`.
    ///
    /// # Safety
    ///
    /// `p..p + 64` is valid for reads (as [`load4x128`]).
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn xor_load512(p: *const u8, mut v: __m512i) -> __m512i {
        // SAFETY: the 64 bytes lie in the caller's range; as `load4x128`.
        unsafe {
            asm!(
                "vpxorq {v}, {v}, zmmword ptr [{p}]",
                p = in(reg) p,
                v = inout(zmm_reg) v,
                options(nostack, readonly, preserves_flags),
            );
        }
        v
    }

    #[inline]
    #[target_feature(enable = "sse2")]
    fn pair128(k: [u64; 2]) -> __m128i {
        _mm_set_epi64x(k[1] as i64, k[0] as i64)
    }

    #[inline]
    #[target_feature(enable = "avx")]
    fn pair256(k: [u64; 2]) -> __m256i {
        _mm256_set_epi64x(k[1] as i64, k[0] as i64, k[1] as i64, k[0] as i64)
    }

    /// `acc` moved forward by the distance `k` was made for, plus `next`.
    #[inline]
    #[target_feature(enable = "pclmulqdq")]
    fn fold128(acc: __m128i, k: __m128i, next: __m128i) -> __m128i {
        let high_half = _mm_clmulepi64_si128::<0x00>(acc, k);
        let low_half = _mm_clmulepi64_si128::<0x11>(acc, k);
        _mm_xor_si128(_mm_xor_si128(high_half, low_half), next)
    }

    /// [`fold128`] on both 128-bit lanes.
    #[inline]
    #[target_feature(enable = "avx2,vpclmulqdq")]
    fn fold256(acc: __m256i, k: __m256i, next: __m256i) -> __m256i {
        let high_half = _mm256_clmulepi64_epi128::<0x00>(acc, k);
        let low_half = _mm256_clmulepi64_epi128::<0x11>(acc, k);
        _mm256_xor_si256(_mm256_xor_si256(high_half, low_half), next)
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    fn pair512(k: [u64; 2]) -> __m512i {
        let (lo, hi) = (k[0] as i64, k[1] as i64);
        _mm512_set_epi64(hi, lo, hi, lo, hi, lo, hi, lo)
    }

    /// [`fold128`] on all four 128-bit lanes, the three-way XOR in one
    /// `vpternlogq` (truth table 0x96: a XOR b XOR c).
    #[inline]
    #[target_feature(enable = "avx512f,vpclmulqdq")]
    fn fold512(acc: __m512i, k: __m512i, next: __m512i) -> __m512i {
        let high_half = _mm512_clmulepi64_epi128::<0x00>(acc, k);
        let low_half = _mm512_clmulepi64_epi128::<0x11>(acc, k);
        _mm512_ternarylogic_epi64::<0x96>(high_half, low_half, next)
    }

    /// The CRC register for a message whose folded remainder is `v` (the
    /// register value `v·x^32 mod P`, reflected).
    #[inline]
    #[target_feature(enable = "pclmulqdq")]
    fn reduce(v: __m128i) -> u32 {
        let low32 = _mm_set_epi32(0, 0, 0, -1);
        let k = pair128(REDUCE);
        // 128 → 96 bits: H·(x^96 mod P) + L (L already sits x^32 higher).
        let b = _mm_xor_si128(_mm_clmulepi64_si128::<0x00>(v, k), _mm_srli_si128::<8>(v));
        // 96 → 64 bits: the top 32 bits times x^64 mod P, plus the rest.
        let c = _mm_xor_si128(
            _mm_clmulepi64_si128::<0x10>(_mm_and_si128(b, low32), k),
            _mm_srli_si128::<4>(b),
        );
        // Barrett: q = floor(top32(c)·mu / x^32); remainder = low32(c) + q·P mod x^32.
        let kb = pair128(BARRETT);
        let q = _mm_and_si128(
            _mm_clmulepi64_si128::<0x00>(_mm_and_si128(c, low32), kb),
            low32,
        );
        let qp = _mm_clmulepi64_si128::<0x10>(q, kb);
        _mm_cvtsi128_si32(_mm_srli_si128::<4>(_mm_xor_si128(c, qp))) as u32
    }

    /// Fold the first `len & !15` bytes at `p` with 256-bit VPCLMULQDQ:
    /// `(crc after them, len & !15)`.
    ///
    /// # Safety
    ///
    /// `p..p + len` is valid for reads (as [`load4x128`]), `len >= 128`,
    /// and the CPU has AVX2, PCLMULQDQ and VPCLMULQDQ.
    #[target_feature(enable = "avx2,pclmulqdq,vpclmulqdq")]
    pub(super) unsafe fn fold_vpclmul(crc: u32, p: *const u8, len: usize) -> (u32, usize) {
        let k1024 = pair256(FOLD_1024);
        let z = _mm256_setzero_si256();
        // The first 128 bytes, the CRC register XORed into the first four.
        let init = _mm256_zextsi128_si256(_mm_cvtsi32_si128(!crc as i32));
        // SAFETY: 128 <= len.
        let [mut x0, mut x1, mut x2, mut x3] = unsafe { xor_load4x256(p, [init, z, z, z]) };
        let mut at = 128;
        while len - at >= 128 {
            let folded = [
                fold256(x0, k1024, z),
                fold256(x1, k1024, z),
                fold256(x2, k1024, z),
                fold256(x3, k1024, z),
            ];
            // SAFETY: at + 128 <= len.
            [x0, x1, x2, x3] = unsafe { xor_load4x256(p.wrapping_add(at), folded) };
            at += 128;
        }
        let x2 = fold256(x0, pair256(FOLD_512), x2);
        let x3 = fold256(x1, pair256(FOLD_512), x3);
        let x = fold256(x2, pair256(FOLD_256), x3);
        // SAFETY: the caller's range; at <= len.
        unsafe { finish256(x, p, at, len) }
    }

    /// The wide kernels' last steps: the 256-bit remainder `x` folded to
    /// 128 bits, the rest of `p..p + len` from `at` 16 bytes at a time, and
    /// the reduction: `(crc after them, len & !15)`.
    ///
    /// # Safety
    ///
    /// `p..p + len` is valid for reads (as [`load4x128`]), `at <= len`, and
    /// the CPU has AVX2 and PCLMULQDQ.
    #[inline]
    #[target_feature(enable = "avx2,pclmulqdq")]
    unsafe fn finish256(x: __m256i, p: *const u8, mut at: usize, len: usize) -> (u32, usize) {
        let k128 = pair128(FOLD_128);
        let mut v = fold128(
            _mm256_castsi256_si128(x),
            k128,
            _mm256_extracti128_si256::<1>(x),
        );
        while len - at >= 16 {
            // SAFETY: at + 16 <= len.
            v = fold128(v, k128, unsafe { load128_vex(p.wrapping_add(at)) });
            at += 16;
        }
        (!reduce(v), at)
    }

    /// Fold the first `len & !15` bytes at `p` with 512-bit VPCLMULQDQ:
    /// `(crc after them, len & !15)`.
    ///
    /// # Safety
    ///
    /// `p..p + len` is valid for reads (as [`load4x128`]), `len >= 256`,
    /// and the CPU has AVX-512F, AVX2, PCLMULQDQ and VPCLMULQDQ.
    #[target_feature(enable = "avx512f,avx2,pclmulqdq,vpclmulqdq")]
    pub(super) unsafe fn fold_vpclmul512(crc: u32, p: *const u8, len: usize) -> (u32, usize) {
        let k2048 = pair512(FOLD_2048);
        let z = _mm512_setzero_si512();
        // The first 256 bytes, the CRC register XORed into the first four.
        let init = _mm512_zextsi128_si512(_mm_cvtsi32_si128(!crc as i32));
        // SAFETY: 256 <= len.
        let [mut x0, mut x1, mut x2, mut x3] = unsafe { xor_load4x512(p, [init, z, z, z]) };
        let mut at = 256;
        while len - at >= 256 {
            let folded = [
                fold512(x0, k2048, z),
                fold512(x1, k2048, z),
                fold512(x2, k2048, z),
                fold512(x3, k2048, z),
            ];
            // SAFETY: at + 256 <= len.
            [x0, x1, x2, x3] = unsafe { xor_load4x512(p.wrapping_add(at), folded) };
            at += 256;
        }
        // x0 and x1 lie 128 bytes before x2 and x3, x2 64 bytes before x3.
        let x2 = fold512(x0, pair512(FOLD_1024), x2);
        let x3 = fold512(x1, pair512(FOLD_1024), x3);
        let k512 = pair512(FOLD_512);
        let mut x = fold512(x2, k512, x3);
        // The rest 64 bytes at a time, then the four lanes: the low two
        // move 256 bits onto the high two, the low one of those 128 bits
        // onto the other.
        while len - at >= 64 {
            let folded = fold512(x, k512, z);
            // SAFETY: at + 64 <= len.
            x = unsafe { xor_load512(p.wrapping_add(at), folded) };
            at += 64;
        }
        let y = fold256(
            _mm512_castsi512_si256(x),
            pair256(FOLD_256),
            _mm512_extracti64x4_epi64::<1>(x),
        );
        // SAFETY: the caller's range and features (AVX2, PCLMULQDQ among
        // them); at <= len.
        unsafe { finish256(y, p, at, len) }
    }

    /// Fold the first `len & !15` bytes at `p` with 128-bit PCLMULQDQ:
    /// `(crc after them, len & !15)`.
    ///
    /// # Safety
    ///
    /// `p..p + len` is valid for reads (as [`load4x128`]), `len >= 64`,
    /// and the CPU has PCLMULQDQ.
    #[target_feature(enable = "pclmulqdq")]
    pub(super) unsafe fn fold_pclmul(crc: u32, p: *const u8, len: usize) -> (u32, usize) {
        let k512 = pair128(FOLD_512);
        // SAFETY: 64 <= len.
        let [mut x0, mut x1, mut x2, mut x3] = unsafe { load4x128(p) };
        x0 = _mm_xor_si128(x0, _mm_cvtsi32_si128(!crc as i32));
        let mut at = 64;
        while len - at >= 64 {
            // SAFETY: at + 64 <= len.
            let [n0, n1, n2, n3] = unsafe { load4x128(p.wrapping_add(at)) };
            x0 = fold128(x0, k512, n0);
            x1 = fold128(x1, k512, n1);
            x2 = fold128(x2, k512, n2);
            x3 = fold128(x3, k512, n3);
            at += 64;
        }
        let x2 = fold128(x0, pair128(FOLD_256), x2);
        let x3 = fold128(x1, pair128(FOLD_256), x3);
        let k128 = pair128(FOLD_128);
        let mut v = fold128(x2, k128, x3);
        while len - at >= 16 {
            // SAFETY: at + 16 <= len.
            v = fold128(v, k128, unsafe { load128(p.wrapping_add(at)) });
            at += 16;
        }
        (!reduce(v), at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rnic_core::{HeapMemory, Memory};
    use rnic_testkit::pattern;

    fn reference(crc: u32, bytes: &[u8]) -> u32 {
        let mut h = crc32fast::Hasher::new_with_initial(crc);
        h.update(bytes);
        h.finalize()
    }

    fn available() -> Vec<Kernel> {
        Kernel::ALL
            .into_iter()
            .filter(|k| k.is_available())
            .collect()
    }

    /// Every kernel through both entry points (slice and raw pointer).
    fn each(crc: u32, bytes: &[u8]) -> Vec<(Kernel, &'static str, u32)> {
        let mut out = Vec::new();
        for k in available() {
            out.push((k, "slice", crc32_with(k, crc, bytes).unwrap()));
            // SAFETY: the slice is valid for its length and not written.
            let raw = unsafe { crc32_raw_with(k, crc, bytes.as_ptr(), bytes.len()) };
            out.push((k, "raw", raw));
        }
        out
    }

    /// The published values (the Intel paper's reflected constants as the
    /// Linux kernel's crc32-pclmul and crc32fast state them) that the
    /// `const fn`s must reproduce.
    #[test]
    fn fold_constants_are_the_published_ones() {
        assert_eq!(fold_by(512), [0x1_5444_2BD4, 0x1_C6E4_1596]);
        assert_eq!(FOLD_128, [0x1_7519_97D0, 0x0_CCAA_009E]);
        assert_eq!(REDUCE, [0x0_CCAA_009E, 0x1_63CD_6124]);
        assert_eq!(BARRETT, [0x1_F701_1641, 0x1_DB71_0641]);
        // x^32 mod P is P's low part, x^31 is itself.
        assert_eq!(u64::from(x_pow_mod(32)), P & 0xFFFF_FFFF);
        assert_eq!(x_pow_mod(31), 1 << 31);
    }

    #[test]
    fn known_vectors() {
        let v = b"123456789";
        for (k, how, c) in each(0, v) {
            assert_eq!(c, 0xCBF4_3926, "{k:?} {how}");
        }
        let zeros = [0u8; 4096];
        let ones = [0xFFu8; 4096];
        let abc: Vec<u8> = (0..4096u32).map(|i| b"abcdefgh"[i as usize % 8]).collect();
        for bytes in [&zeros[..], &ones[..], &abc[..], &zeros[..32], &ones[..1000]] {
            let want = crc32fast::hash(bytes);
            for (k, how, c) in each(0, bytes) {
                assert_eq!(c, want, "{k:?} {how} len {}", bytes.len());
            }
        }
        // zlib: crc32 of 32 zero bytes and of 32 0xFF bytes.
        for (k, how, c) in each(0, &zeros[..32]) {
            assert_eq!(c, 0x190A_55AD, "{k:?} {how}");
        }
        for (k, how, c) in each(0, &ones[..32]) {
            assert_eq!(c, 0xFF6C_AB0B, "{k:?} {how}");
        }
        assert_eq!(crc32(0, &[]), 0);
        assert_eq!(crc32(0xDEAD_BEEF, &[]), 0xDEAD_BEEF);
    }

    /// Every length through the kernels' thresholds and loop boundaries (the
    /// 512-bit kernel's: 512, its 256-byte loop, its 64- and 16-byte rests), at
    /// every misalignment in a cache line, against crc32fast.
    #[test]
    fn every_length_to_1300_at_every_alignment() {
        let buf = pattern(1300 + 64, 7);
        for len in 0..=1300 {
            for off in [0, 1, 3, 8, 15, 16, 31, 33, 63] {
                let bytes = &buf[off..off + len];
                let want = reference(0x1234_5678, bytes);
                for (k, how, c) in each(0x1234_5678, bytes) {
                    assert_eq!(c, want, "{k:?} {how} len {len} off {off}");
                }
            }
        }
    }

    #[test]
    fn a_span_is_read_in_place_and_ranges_are_checked() {
        let data = pattern(9000, 3);
        let mem = HeapMemory::from_bytes(&data);
        let span = mem.direct().unwrap();
        for (off, len) in [(0, 9000), (5, 4096), (8999, 1), (9000, 0), (100, 63)] {
            assert_eq!(
                crc32_span(77, &span, off, len),
                Ok(reference(77, &data[off..off + len]))
            );
        }
        assert_eq!(
            crc32_span(0, &span, 8990, 11),
            Err(MemoryError::OutOfRange {
                access: MemAccess::Read,
                offset: 8990,
                len: 11,
                region_len: 9000
            })
        );
        assert!(crc32_span(0, &span, usize::MAX, 2).is_err());
    }

    /// A writer rewriting the bytes under a reader: the racing reads run
    /// to completion (their values are whatever bytes they saw), and once
    /// the writer has stopped the CRC is exactly one written pattern's.
    #[test]
    fn reads_racing_a_writer_complete_and_are_exact_once_it_stops() {
        use std::sync::Arc;
        use std::sync::atomic::AtomicBool;
        let mem = Arc::new(HeapMemory::from_bytes(&[1u8; 8192]));
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (mem, stop) = (Arc::clone(&mem), Arc::clone(&stop));
            std::thread::spawn(move || {
                let span = mem.direct().unwrap();
                let mut v = 1u8;
                while !stop.load(Ordering::Relaxed) {
                    v = v % 3 + 1;
                    crate::copy::write_span(&span, 0, &[v; 8192]).unwrap();
                }
            })
        };
        let span = mem.direct().unwrap();
        let wants: Vec<u32> = (1..=3u8).map(|v| reference(0, &[v; 8192])).collect();
        for _ in 0..2000 {
            let _ = crc32_span(0, &span, 0, 8192).unwrap();
        }
        stop.store(true, Ordering::Relaxed);
        writer.join().unwrap();
        let c = crc32_span(0, &span, 0, 8192).unwrap();
        assert!(wants.contains(&c));
    }

    #[test]
    fn selected_is_the_fastest_available_and_cached() {
        let first = Kernel::selected();
        assert!(first.is_available());
        assert_eq!(
            Some(first),
            Kernel::ALL.into_iter().find(|k| k.is_available())
        );
        assert_eq!(Kernel::selected(), first);
        assert!(Kernel::Portable.is_available());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn matches_crc32fast_and_chains(
            len in 0usize..=70_000,
            off in 0usize..64,
            crc in any::<u32>(),
            split in any::<prop::sample::Index>(),
            seed in any::<u32>(),
        ) {
            let buf = pattern(len + off, seed);
            let bytes = &buf[off..];
            let want = reference(crc, bytes);
            for (k, how, c) in each(crc, bytes) {
                prop_assert_eq!(c, want, "{:?} {} len {} off {}", k, how, len, off);
            }
            let at = split.index(len + 1);
            let (a, b) = bytes.split_at(at);
            for k in available() {
                let chained = crc32_with(k, crc32_with(k, crc, a).unwrap(), b).unwrap();
                prop_assert_eq!(chained, want, "{:?} split {}", k, at);
                // SAFETY: both halves are valid slices, not written.
                let mid = unsafe { crc32_raw_with(k, crc, a.as_ptr(), a.len()) };
                // SAFETY: as above.
                let raw = unsafe { crc32_raw_with(k, mid, b.as_ptr(), b.len()) };
                prop_assert_eq!(raw, want, "{:?} raw split {}", k, at);
            }
        }
    }
}
