//! `MLX5_GET` / `MLX5_SET` arithmetic over byte buffers.
//!
//! A PRM bit offset counts MSB-first inside big-endian 32-bit dwords from the start of the
//! structure. Because the dwords are big-endian, that is the same as counting MSB-first
//! through the byte stream: bit `b` is bit `7 - b % 8` (LSB = 0) of byte `b / 8`. These
//! helpers use that byte-stream view, so one routine serves fields inside one dword, fields
//! that span dwords (64-bit addresses) and fields at any alignment.

use crate::Error;

/// Widest field [`get_bits`] / [`set_bits`] handle; wider fields are byte arrays.
pub const MAX_VALUE_BITS: u32 = 64;

/// The byte range `[first, end)` a field of `width` bits at `bit_offset` touches, or an
/// error when the width is 0 or above [`MAX_VALUE_BITS`] or the field ends past `len` bytes.
fn span(len: usize, bit_offset: usize, width: u32) -> Result<(usize, usize), Error> {
    if width == 0 || width > MAX_VALUE_BITS {
        return Err(Error::WidthUnsupported { width });
    }
    let end_bit = bit_offset
        .checked_add(width as usize)
        .ok_or(Error::FieldOutOfBounds {
            bit_offset,
            width,
            buf_len: len,
        })?;
    let end = end_bit.div_ceil(8);
    if end > len {
        return Err(Error::FieldOutOfBounds {
            bit_offset,
            width,
            buf_len: len,
        });
    }
    Ok((bit_offset / 8, end))
}

/// The mask of a `width`-bit value (`width` in 1..=64).
#[inline]
pub const fn mask(width: u32) -> u64 {
    if width >= 64 {
        u64::MAX
    } else {
        (1u64 << width) - 1
    }
}

/// Reads the `width`-bit field (1..=64) at `bit_offset`: `MLX5_GET` for any width.
///
/// # Errors
/// [`Error::WidthUnsupported`] for a width of 0 or above 64, [`Error::FieldOutOfBounds`] when
/// the field does not lie inside `buf`.
#[inline]
pub fn get_bits(buf: &[u8], bit_offset: usize, width: u32) -> Result<u64, Error> {
    let (first, end) = span(buf.len(), bit_offset, width)?;
    // At most 9 bytes (a 64-bit field at a non-byte-aligned offset): fits a u128 window.
    let mut window: u128 = 0;
    for b in buf.get(first..end).unwrap_or(&[]) {
        window = (window << 8) | u128::from(*b);
    }
    let shift = end * 8 - (bit_offset + width as usize);
    Ok(((window >> shift) as u64) & mask(width))
}

/// Writes `value` into the `width`-bit field (1..=64) at `bit_offset`, leaving every other
/// bit of `buf` unchanged: `MLX5_SET` for any width.
///
/// # Errors
/// As [`get_bits`], plus [`Error::ValueTooWide`] (struct and field names empty) when `value`
/// does not fit in `width` bits; nothing is written then.
#[inline]
pub fn set_bits(buf: &mut [u8], bit_offset: usize, width: u32, value: u64) -> Result<(), Error> {
    let (first, end) = span(buf.len(), bit_offset, width)?;
    if value & !mask(width) != 0 {
        return Err(Error::ValueTooWide {
            structure: "",
            field: "",
            width,
            value,
        });
    }
    let bytes = buf.get_mut(first..end).unwrap_or(&mut []);
    let mut window: u128 = 0;
    for b in bytes.iter() {
        window = (window << 8) | u128::from(*b);
    }
    let shift = end * 8 - (bit_offset + width as usize);
    let field_mask = u128::from(mask(width)) << shift;
    window = (window & !field_mask) | (u128::from(value) << shift);
    for (i, b) in bytes.iter_mut().rev().enumerate() {
        *b = (window >> (8 * i)) as u8;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The naive reference: one bit at a time, MSB-first through the byte stream.
    fn naive_get(buf: &[u8], off: usize, width: u32) -> u64 {
        let mut v = 0u64;
        for i in 0..width as usize {
            let bit = off + i;
            v = (v << 1) | u64::from((buf[bit / 8] >> (7 - bit % 8)) & 1);
        }
        v
    }

    fn naive_set(buf: &mut [u8], off: usize, width: u32, value: u64) {
        for i in 0..width as usize {
            let bit = off + i;
            let v = (value >> (width as usize - 1 - i)) & 1;
            let m = 1u8 << (7 - bit % 8);
            if v == 1 {
                buf[bit / 8] |= m;
            } else {
                buf[bit / 8] &= !m;
            }
        }
    }

    /// The kernel's formula for a field inside one dword: `(be32(dw) >> (32 - off%32 - w)) & mask`.
    fn dword_get(buf: &[u8], off: usize, width: u32) -> u64 {
        let dw = off / 32 * 4;
        let v = u32::from_be_bytes([buf[dw], buf[dw + 1], buf[dw + 2], buf[dw + 3]]);
        let shift = 32 - (off % 32) as u32 - width;
        u64::from(v >> shift) & mask(width)
    }

    proptest! {
        #[test]
        fn get_matches_naive(buf in proptest::collection::vec(any::<u8>(), 16..48),
                             off in 0usize..256, width in 1u32..=64) {
            prop_assume!(off + width as usize <= buf.len() * 8);
            prop_assert_eq!(get_bits(&buf, off, width).unwrap(), naive_get(&buf, off, width));
        }

        #[test]
        fn get_matches_dword_formula(buf in proptest::collection::vec(any::<u8>(), 16..48),
                                     off in 0usize..256, width in 1u32..=32) {
            prop_assume!(off % 32 + width as usize <= 32);
            prop_assume!(off / 32 * 4 + 4 <= buf.len());
            prop_assert_eq!(get_bits(&buf, off, width).unwrap(), dword_get(&buf, off, width));
        }

        #[test]
        fn set_matches_naive(buf in proptest::collection::vec(any::<u8>(), 16..48),
                             off in 0usize..256, width in 1u32..=64, raw in any::<u64>()) {
            prop_assume!(off + width as usize <= buf.len() * 8);
            let value = raw & mask(width);
            let mut ours = buf.clone();
            let mut reference = buf.clone();
            set_bits(&mut ours, off, width, value).unwrap();
            naive_set(&mut reference, off, width, value);
            prop_assert_eq!(&ours, &reference);
            prop_assert_eq!(get_bits(&ours, off, width).unwrap(), value);
        }

        #[test]
        fn set_rejects_wide_values_and_writes_nothing(
            buf in proptest::collection::vec(any::<u8>(), 16..24),
            off in 0usize..64, width in 1u32..64, raw in any::<u64>()) {
            prop_assume!(raw >> width != 0);
            let mut ours = buf.clone();
            let err = set_bits(&mut ours, off, width, raw).unwrap_err();
            let is_too_wide = matches!(err, Error::ValueTooWide { .. });
            prop_assert!(is_too_wide);
            prop_assert_eq!(ours, buf);
        }
    }

    #[test]
    fn known_values() {
        // cqc.log_cq_size @ 0x63/5 holding 10 sets bits [28:24] of dword 3.
        let mut buf = [0u8; 16];
        set_bits(&mut buf, 0x63, 5, 10).unwrap();
        assert_eq!(buf[12..16], [0x0a, 0, 0, 0]);
        // A 64-bit field at a dword boundary is two big-endian dwords, high first.
        let mut buf = [0u8; 16];
        set_bits(&mut buf, 64, 64, 0x0102_0304_0506_0708).unwrap();
        assert_eq!(buf[8..16], [1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(get_bits(&buf, 64, 64).unwrap(), 0x0102_0304_0506_0708);
    }

    #[test]
    fn errors_are_typed() {
        let buf = [0u8; 4];
        assert!(matches!(
            get_bits(&buf, 0, 0),
            Err(Error::WidthUnsupported { width: 0 })
        ));
        assert!(matches!(
            get_bits(&buf, 0, 65),
            Err(Error::WidthUnsupported { width: 65 })
        ));
        assert!(matches!(
            get_bits(&buf, 30, 4),
            Err(Error::FieldOutOfBounds {
                bit_offset: 30,
                width: 4,
                buf_len: 4
            })
        ));
        assert!(matches!(
            get_bits(&buf, usize::MAX, 4),
            Err(Error::FieldOutOfBounds { .. })
        ));
    }
}
