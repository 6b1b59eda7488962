//! The IP and UDP layers under RoCEv2: a minimal IPv4 (20-byte header, no
//! options), IPv6 (40-byte header, no extension headers) and UDP.
//!
//! These are just enough to dissect a captured frame down to the RoCE
//! packet, to re-emit it byte for byte, and to build the headers a raw
//! sender needs; they are not a general IP stack.

pub mod ipv4;
pub mod ipv6;
pub mod udp;

/// IP protocol number / IPv6 next header of UDP.
pub const PROTOCOL_UDP: u8 = 17;

/// IPv6 next header of ICMPv6.
pub const PROTOCOL_ICMPV6: u8 = 58;

/// The Internet checksum (RFC 1071) of `data`: the one's complement of the
/// one's-complement sum of its 16-bit big-endian words.
pub fn internet_checksum(data: &[u8]) -> u16 {
    checksum_fold(checksum_add(0, data))
}

/// Add `data`'s 16-bit big-endian words to a running one's-complement sum
/// (an odd last byte is padded with zero, so only the last piece of a
/// message may have an odd length). Finish with [`checksum_fold`].
pub fn checksum_add(mut sum: u32, data: &[u8]) -> u32 {
    let mut words = data.chunks_exact(2);
    for w in &mut words {
        if let &[hi, lo] = w {
            sum = fold_carries(sum + u32::from(u16::from_be_bytes([hi, lo])));
        }
    }
    if let &[last] = words.remainder() {
        sum = fold_carries(sum + (u32::from(last) << 8));
    }
    sum
}

/// Fold the carries of a running sum back into its low 16 bits. Keeps the
/// sum at most 0x1FFFE, so adding one more 16-bit word cannot overflow.
const fn fold_carries(mut sum: u32) -> u32 {
    while sum > 0xFFFF {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    sum
}

/// The checksum of a running sum: its carries folded in, complemented.
pub const fn checksum_fold(sum: u32) -> u16 {
    // fold_carries leaves sum <= 0xFFFF, so the cast is lossless.
    !(fold_carries(sum) as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_examples() {
        // RFC 1071 §3 example words sum to 0xddf2; the checksum is its complement.
        assert_eq!(
            internet_checksum(&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7]),
            !0xddf2
        );
        // Odd length pads with a zero byte.
        assert_eq!(internet_checksum(&[0x01]), !0x0100);
        assert_eq!(internet_checksum(&[]), 0xFFFF);
    }
}
