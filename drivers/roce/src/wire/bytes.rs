//! Panic-free big-endian field access shared by every header view.
//!
//! Each header file declares its layout as a private `mod field` of byte
//! ranges ([`Field`]). The accessors here read and write those ranges with
//! `get`/`get_mut`, so even a view made with `new_unchecked` over a buffer
//! that is too short never panics: missing bytes read as zero and writes
//! that do not fit are dropped. Views made with `new_checked` never hit
//! either case.

use core::ops::Range;

/// A byte range inside a header.
pub(crate) type Field = Range<usize>;

#[inline]
fn array<const N: usize>(buf: &[u8], at: usize) -> [u8; N] {
    buf.get(at..)
        .and_then(|rest| rest.first_chunk::<N>())
        .copied()
        .unwrap_or([0; N])
}

#[inline]
fn put<const N: usize>(buf: &mut [u8], at: usize, bytes: [u8; N]) {
    if let Some(dst) = buf
        .get_mut(at..)
        .and_then(|rest| rest.first_chunk_mut::<N>())
    {
        *dst = bytes;
    }
}

/// The byte at `at` (0 when absent).
#[inline]
pub(crate) fn read_u8(buf: &[u8], at: usize) -> u8 {
    buf.get(at).copied().unwrap_or(0)
}

/// Write the byte at `at` (dropped when absent).
#[inline]
pub(crate) fn write_u8(buf: &mut [u8], at: usize, value: u8) {
    if let Some(b) = buf.get_mut(at) {
        *b = value;
    }
}

/// Big-endian u16 at `f.start`.
#[inline]
pub(crate) fn read_u16(buf: &[u8], f: Field) -> u16 {
    u16::from_be_bytes(array(buf, f.start))
}

/// Write a big-endian u16 at `f.start`.
#[inline]
pub(crate) fn write_u16(buf: &mut [u8], f: Field, value: u16) {
    put(buf, f.start, value.to_be_bytes());
}

/// Big-endian 24-bit value in the three bytes at `f.start`.
#[inline]
pub(crate) fn read_u24(buf: &[u8], f: Field) -> u32 {
    let [a, b, c] = array::<3>(buf, f.start);
    u32::from_be_bytes([0, a, b, c])
}

/// Write the low 24 bits of `value` big-endian at `f.start`.
#[inline]
pub(crate) fn write_u24(buf: &mut [u8], f: Field, value: u32) {
    let [_, a, b, c] = value.to_be_bytes();
    put(buf, f.start, [a, b, c]);
}

/// Big-endian u32 at `f.start`.
#[inline]
pub(crate) fn read_u32(buf: &[u8], f: Field) -> u32 {
    u32::from_be_bytes(array(buf, f.start))
}

/// Write a big-endian u32 at `f.start`.
#[inline]
pub(crate) fn write_u32(buf: &mut [u8], f: Field, value: u32) {
    put(buf, f.start, value.to_be_bytes());
}

/// Big-endian u64 at `f.start` (need not be aligned).
#[inline]
pub(crate) fn read_u64(buf: &[u8], f: Field) -> u64 {
    u64::from_be_bytes(array(buf, f.start))
}

/// Write a big-endian u64 at `f.start`.
#[inline]
pub(crate) fn write_u64(buf: &mut [u8], f: Field, value: u64) {
    put(buf, f.start, value.to_be_bytes());
}

/// `N` raw bytes at `f.start` (addresses).
#[inline]
pub(crate) fn read_bytes<const N: usize>(buf: &[u8], f: Field) -> [u8; N] {
    array(buf, f.start)
}

/// Write `N` raw bytes at `f.start`.
#[inline]
pub(crate) fn write_bytes<const N: usize>(buf: &mut [u8], f: Field, bytes: [u8; N]) {
    put(buf, f.start, bytes);
}

/// Set or clear the bits of `mask` in the byte at `at`.
#[inline]
pub(crate) fn write_flag(buf: &mut [u8], at: usize, mask: u8, on: bool) {
    let old = read_u8(buf, at);
    write_u8(buf, at, if on { old | mask } else { old & !mask });
}

/// Check that `buf` holds at least `need` bytes of `header`.
#[inline]
pub(crate) fn need(header: super::Header, need: usize, have: usize) -> Result<(), super::Error> {
    if have < need {
        Err(super::Error::Truncated { header, need, have })
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_buffers_read_zero_and_drop_writes() {
        let mut buf = [0xAAu8; 3];
        assert_eq!(read_u32(&buf, 0..4), 0);
        assert_eq!(read_u16(&buf, 1..3), 0xAAAA);
        assert_eq!(read_u16(&buf, 2..4), 0);
        assert_eq!(read_u8(&buf, 9), 0);
        write_u32(&mut buf, 0..4, 0x0102_0304);
        write_u8(&mut buf, 3, 1);
        assert_eq!(buf, [0xAA; 3]);
        write_u24(&mut buf, 0..3, 0xFF01_0203);
        assert_eq!(buf, [1, 2, 3]);
        assert_eq!(read_u24(&buf, 0..3), 0x01_0203);
        assert_eq!(
            read_u64(&[1, 2, 3, 4, 5, 6, 7, 8, 9], 1..9),
            0x0203_0405_0607_0809
        );
    }
}
