//! The RoCEv2 invariant CRC, exactly as rxe computes it (rocev2.md §6).
//!
//! The ICRC is zlib's CRC-32 over `FF×8 ‖ masked(IP header ‖ UDP header ‖
//! BTH) ‖ rest of BTH..pad`, where the masked copy has all-ones in the
//! fields routers may change: IPv4 TOS, TTL and header checksum; IPv6
//! traffic class, flow label and hop limit; the UDP checksum; BTH byte 4
//! (FECN/BECN/Resv6a). It is appended least-significant byte first.
//!
//! Two entry points match what a provider holds:
//!
//! * the whole IP packet in one buffer (raw sockets, captures, the mlx5
//!   model): [`fill`], [`verify`], [`compute`];
//! * only the UDP payload (BTH..ICRC) plus the addresses and ports it knows
//!   (a UDP-socket provider): [`compute_v4`] / [`fill_v4`] / [`verify_v4`]
//!   and the v6 equivalents, which synthesise the masked IP and UDP headers
//!   (IP total/payload length and UDP length derived from the RoCE length).
//!
//! Nothing allocates: the masked headers live in a 60-byte stack buffer and
//! the CRC streams over the rest of the packet in place.

use std::net::{Ipv4Addr, Ipv6Addr};

use super::ip::{PROTOCOL_UDP, ipv4, ipv6, udp};
use super::roce::ICRC_LEN;
use super::{Error, Header, Result, bth};

/// zlib `crc32(FF×8)`: the CRC state after the 8-byte LRH stand-in
/// (`!0xDEBB20E3`, rxe's precomputed seed, in zlib's convention).
const CRC_AFTER_FF8: u32 = 0x2144_DF1C;

/// Offset of the masked BTH byte ("Resv8a": FECN, BECN, Resv6a).
const BTH_RESV8A: usize = 4;

/// The largest masked prefix: IPv6 (40) + UDP (8) + BTH (12).
const MAX_MASKED: usize = ipv6::HEADER_LEN + udp::HEADER_LEN + bth::HEADER_LEN;

fn crc(masked: &[u8], rest: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new_with_initial(CRC_AFTER_FF8);
    h.update(masked);
    h.update(rest);
    h.finalize()
}

/// Where the pieces of an IP packet carrying RoCEv2 lie.
struct Layout {
    /// IP header length (20 or 40).
    ip_hdr: usize,
    /// End of the ICRC (IP header + UDP length).
    end: usize,
}

impl Layout {
    fn of(ip: &[u8]) -> Result<Layout> {
        let first = *ip.first().ok_or(Error::Truncated {
            header: Header::Ipv4,
            need: 1,
            have: 0,
        })?;
        let (ip_hdr, ip_end) = match first >> 4 {
            4 => {
                let p = ipv4::Packet::new_checked(ip)?;
                (ipv4::HEADER_LEN, usize::from(p.total_len()))
            }
            6 => {
                let p = ipv6::Packet::new_checked(ip)?;
                (
                    ipv6::HEADER_LEN,
                    ipv6::HEADER_LEN + usize::from(p.payload_len()),
                )
            }
            found => return Err(Error::IpVersion { expected: 4, found }),
        };
        let udp = udp::Packet::new_checked(ip.get(ip_hdr..ip_end).unwrap_or(&[]))?;
        let roce_len = usize::from(udp.len()).saturating_sub(udp::HEADER_LEN);
        check_roce_len(roce_len)?;
        Ok(Layout {
            ip_hdr,
            end: ip_hdr + udp::HEADER_LEN + roce_len,
        })
    }
}

fn check_roce_len(len: usize) -> Result<()> {
    if len < bth::HEADER_LEN {
        return Err(Error::Truncated {
            header: Header::Bth,
            need: bth::HEADER_LEN,
            have: len,
        });
    }
    let need = bth::HEADER_LEN + ICRC_LEN;
    if len < need {
        return Err(Error::Truncated {
            header: Header::Icrc,
            need,
            have: len,
        });
    }
    Ok(())
}

fn mask_ipv4(h: &mut [u8]) {
    for i in [1, 8, 10, 11] {
        if let Some(b) = h.get_mut(i) {
            *b = 0xFF;
        }
    }
}

fn mask_ipv6(h: &mut [u8]) {
    // Keep the version nibble; traffic class and flow label become all ones.
    if let Some(b) = h.first_mut() {
        *b |= 0x0F;
    }
    for i in [1, 2, 3, 7] {
        if let Some(b) = h.get_mut(i) {
            *b = 0xFF;
        }
    }
}

fn mask_udp_bth(h: &mut [u8]) {
    for i in [6, 7, udp::HEADER_LEN + BTH_RESV8A] {
        if let Some(b) = h.get_mut(i) {
            *b = 0xFF;
        }
    }
}

/// Compute the ICRC of a whole IP packet (IPv4 without options, or IPv6)
/// carrying RoCEv2: IP header .. ICRC, as found from the IP and UDP length
/// fields (bytes past the IP length, e.g. Ethernet padding, are ignored).
/// The trailer itself is not read.
pub fn compute(ip_packet: &[u8]) -> Result<u32> {
    let l = Layout::of(ip_packet)?;
    let masked_len = l.ip_hdr + udp::HEADER_LEN + bth::HEADER_LEN;
    let mut masked = [0u8; MAX_MASKED];
    let (m, src) = (masked.get_mut(..masked_len), ip_packet.get(..masked_len));
    let (Some(m), Some(src)) = (m, src) else {
        // Layout::of checked the lengths; unreachable in practice.
        return Err(Error::Truncated {
            header: Header::Bth,
            need: masked_len,
            have: ip_packet.len(),
        });
    };
    m.copy_from_slice(src);
    let (ip_part, rest_part) = m.split_at_mut(l.ip_hdr);
    if l.ip_hdr == ipv4::HEADER_LEN {
        mask_ipv4(ip_part)
    } else {
        mask_ipv6(ip_part)
    }
    mask_udp_bth(rest_part);
    let rest = ip_packet
        .get(masked_len..l.end.saturating_sub(ICRC_LEN))
        .unwrap_or(&[]);
    Ok(crc(m, rest))
}

fn trailer(buf: &[u8], end: usize) -> u32 {
    let t = buf
        .get(end.saturating_sub(ICRC_LEN)..end)
        .and_then(|t| t.first_chunk::<4>())
        .copied();
    t.map_or(0, u32::from_le_bytes)
}

/// Compute the ICRC of a whole IP packet and write it into its trailer
/// (little-endian). Returns the value written.
pub fn fill(ip_packet: &mut [u8]) -> Result<u32> {
    let l = Layout::of(ip_packet)?;
    let value = compute(ip_packet)?;
    if let Some(t) = ip_packet.get_mut(l.end.saturating_sub(ICRC_LEN)..l.end) {
        t.copy_from_slice(&value.to_le_bytes());
    }
    Ok(value)
}

/// Check the ICRC trailer of a whole IP packet.
pub fn verify(ip_packet: &[u8]) -> Result<()> {
    let l = Layout::of(ip_packet)?;
    let computed = compute(ip_packet)?;
    let found = trailer(ip_packet, l.end);
    if computed == found {
        Ok(())
    } else {
        Err(Error::IcrcMismatch { computed, found })
    }
}

/// The BTH-prefix part of `roce` that goes into the masked buffer, and the rest.
fn split_roce(roce: &[u8]) -> (&[u8], &[u8]) {
    let covered = roce
        .get(..roce.len().saturating_sub(ICRC_LEN))
        .unwrap_or(&[]);
    covered.split_at(covered.len().min(bth::HEADER_LEN))
}

/// The ICRC of a RoCEv2 packet sent over IPv4, from the UDP payload `roce`
/// (BTH..ICRC; the last 4 bytes, the trailer, are not read) and what the
/// sender knows: addresses, IP identification, DF, and UDP ports. IPv4
/// total length (20 + 8 + len) and UDP length (8 + len) are derived;
/// lengths above 65535 wrap as the 16-bit fields would. TOS, TTL and both
/// checksums are masked and therefore not needed.
pub fn compute_v4(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    ip_id: u16,
    dont_frag: bool,
    udp_src_port: u16,
    udp_dst_port: u16,
    roce: &[u8],
) -> u32 {
    // Wrapping casts: documented above.
    let total = (ipv4::HEADER_LEN + udp::HEADER_LEN + roce.len()) as u16;
    let udp_len = (udp::HEADER_LEN + roce.len()) as u16;
    let [tl0, tl1] = total.to_be_bytes();
    let [id0, id1] = ip_id.to_be_bytes();
    let [s0, s1, s2, s3] = src.octets();
    let [d0, d1, d2, d3] = dst.octets();
    let [sp0, sp1] = udp_src_port.to_be_bytes();
    let [dp0, dp1] = udp_dst_port.to_be_bytes();
    let [ul0, ul1] = udp_len.to_be_bytes();
    let df = if dont_frag { 0x40 } else { 0 };
    let hdr: [u8; 28] = [
        0x45,
        0xFF,
        tl0,
        tl1,
        id0,
        id1,
        df,
        0,
        0xFF,
        PROTOCOL_UDP,
        0xFF,
        0xFF,
        s0,
        s1,
        s2,
        s3,
        d0,
        d1,
        d2,
        d3, //
        sp0,
        sp1,
        dp0,
        dp1,
        ul0,
        ul1,
        0xFF,
        0xFF,
    ];
    masked_roce_crc(&hdr, roce)
}

/// The ICRC of a RoCEv2 packet sent over IPv6, from the UDP payload `roce`
/// (BTH..ICRC; the trailer is not read), the addresses and UDP ports. The
/// payload length (8 + len) and UDP length are derived; traffic class,
/// flow label and hop limit are masked.
pub fn compute_v6(
    src: Ipv6Addr,
    dst: Ipv6Addr,
    udp_src_port: u16,
    udp_dst_port: u16,
    roce: &[u8],
) -> u32 {
    // Wrapping cast: lengths above 65535 wrap as the 16-bit field would.
    let len = (udp::HEADER_LEN + roce.len()) as u16;
    let mut hdr = [0u8; 48];
    let [l0, l1] = len.to_be_bytes();
    let [sp0, sp1] = udp_src_port.to_be_bytes();
    let [dp0, dp1] = udp_dst_port.to_be_bytes();
    let (ip, u) = hdr.split_at_mut(ipv6::HEADER_LEN);
    let (fixed, addrs) = ip.split_at_mut(8);
    fixed.copy_from_slice(&[0x6F, 0xFF, 0xFF, 0xFF, l0, l1, PROTOCOL_UDP, 0xFF]);
    let (s, d) = addrs.split_at_mut(16);
    s.copy_from_slice(&src.octets());
    d.copy_from_slice(&dst.octets());
    u.copy_from_slice(&[sp0, sp1, dp0, dp1, l0, l1, 0xFF, 0xFF]);
    masked_roce_crc(&hdr, roce)
}

fn masked_roce_crc(ip_udp: &[u8], roce: &[u8]) -> u32 {
    let (bth_part, rest) = split_roce(roce);
    let mut bth = [0u8; bth::HEADER_LEN];
    let dst = bth.get_mut(..bth_part.len()).unwrap_or(&mut []);
    dst.copy_from_slice(bth_part);
    if let Some(b) = bth.get_mut(BTH_RESV8A) {
        *b = 0xFF;
    }
    let bth = bth.get(..bth_part.len()).unwrap_or(&[]);
    let mut h = crc32fast::Hasher::new_with_initial(CRC_AFTER_FF8);
    h.update(ip_udp);
    h.update(bth);
    h.update(rest);
    h.finalize()
}

fn check_udp_payload(roce_len: usize, ip_hdr: usize) -> Result<()> {
    check_roce_len(roce_len)?;
    let max = usize::from(u16::MAX)
        - udp::HEADER_LEN
        - if ip_hdr == ipv4::HEADER_LEN {
            ip_hdr
        } else {
            0
        };
    if roce_len > max {
        return Err(Error::TooLong {
            header: Header::Udp,
            len: roce_len + udp::HEADER_LEN,
        });
    }
    Ok(())
}

fn write_trailer(roce: &mut [u8], value: u32) {
    let end = roce.len();
    if let Some(t) = roce
        .get_mut(end.saturating_sub(ICRC_LEN)..)
        .and_then(|t| t.first_chunk_mut::<4>())
    {
        *t = value.to_le_bytes();
    }
}

fn check_trailer(roce: &[u8], computed: u32) -> Result<()> {
    let found = trailer(roce, roce.len());
    if computed == found {
        Ok(())
    } else {
        Err(Error::IcrcMismatch { computed, found })
    }
}

/// [`compute_v4`] and write the trailer of `roce` (BTH..ICRC). Fails when
/// `roce` is shorter than BTH + ICRC or too long for the IPv4 length.
pub fn fill_v4(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    ip_id: u16,
    dont_frag: bool,
    udp_src_port: u16,
    udp_dst_port: u16,
    roce: &mut [u8],
) -> Result<u32> {
    check_udp_payload(roce.len(), ipv4::HEADER_LEN)?;
    let v = compute_v4(src, dst, ip_id, dont_frag, udp_src_port, udp_dst_port, roce);
    write_trailer(roce, v);
    Ok(v)
}

/// Check the trailer of `roce` (BTH..ICRC) received over IPv4.
pub fn verify_v4(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    ip_id: u16,
    dont_frag: bool,
    udp_src_port: u16,
    udp_dst_port: u16,
    roce: &[u8],
) -> Result<()> {
    check_udp_payload(roce.len(), ipv4::HEADER_LEN)?;
    check_trailer(
        roce,
        compute_v4(src, dst, ip_id, dont_frag, udp_src_port, udp_dst_port, roce),
    )
}

/// [`compute_v6`] and write the trailer of `roce` (BTH..ICRC).
pub fn fill_v6(
    src: Ipv6Addr,
    dst: Ipv6Addr,
    udp_src_port: u16,
    udp_dst_port: u16,
    roce: &mut [u8],
) -> Result<u32> {
    check_udp_payload(roce.len(), ipv6::HEADER_LEN)?;
    let v = compute_v6(src, dst, udp_src_port, udp_dst_port, roce);
    write_trailer(roce, v);
    Ok(v)
}

/// Check the trailer of `roce` (BTH..ICRC) received over IPv6.
pub fn verify_v6(
    src: Ipv6Addr,
    dst: Ipv6Addr,
    udp_src_port: u16,
    udp_dst_port: u16,
    roce: &[u8],
) -> Result<()> {
    check_udp_payload(roce.len(), ipv6::HEADER_LEN)?;
    check_trailer(roce, compute_v6(src, dst, udp_src_port, udp_dst_port, roce))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_is_crc_of_eight_ff() {
        assert_eq!(crc32fast::hash(&[0xFF; 8]), CRC_AFTER_FF8);
        assert_eq!(!CRC_AFTER_FF8, 0xDEBB_20E3);
    }

    #[test]
    fn ipv6_mask_keeps_version() {
        let mut h = [0x61u8, 0x2a, 0xbc, 0xde, 0, 8, 17, 64];
        mask_ipv6(&mut h);
        assert_eq!(h, [0x6F, 0xFF, 0xFF, 0xFF, 0, 8, 17, 0xFF]);
    }

    #[test]
    fn short_inputs_are_typed_errors() {
        assert_eq!(
            verify(&[]),
            Err(Error::Truncated {
                header: Header::Ipv4,
                need: 1,
                have: 0
            })
        );
        assert_eq!(
            verify(&[0x15; 30]),
            Err(Error::IpVersion {
                expected: 4,
                found: 1
            })
        );
        let a = Ipv4Addr::LOCALHOST;
        assert_eq!(
            verify_v4(a, a, 0, true, 1, 4791, &[0; 15]),
            Err(Error::Truncated {
                header: Header::Icrc,
                need: 16,
                have: 15
            })
        );
        assert_eq!(
            fill_v4(a, a, 0, true, 1, 4791, &mut [0; 11]),
            Err(Error::Truncated {
                header: Header::Bth,
                need: 12,
                have: 11
            })
        );
        assert_eq!(
            fill_v4(a, a, 0, true, 1, 4791, &mut vec![0; 65_508]),
            Err(Error::TooLong {
                header: Header::Udp,
                len: 65_516
            })
        );
        // compute_* never fails, whatever the length.
        let _ = compute_v4(a, a, 0, true, 1, 4791, &[]);
        let _ = compute_v6(
            Ipv6Addr::LOCALHOST,
            Ipv6Addr::LOCALHOST,
            1,
            4791,
            &[1, 2, 3],
        );
    }
}
