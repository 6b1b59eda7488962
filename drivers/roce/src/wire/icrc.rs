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
//!   A UDP-socket receiver does not learn the IPv4 identification the
//!   sender chose, which the ICRC covers: [`recover_v4_ident`] solves for it.
//!
//! A provider that fills and verifies many packets of a few flows keeps an
//! [`IcrcCache`]: the same results, with the CRC over each packet shape's
//! constant prefix (masked IP and UDP headers, the BTH's first bytes)
//! remembered; the free functions are its reference.
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
    let hdr = masked_v4(
        src,
        dst,
        ip_id,
        dont_frag,
        udp_src_port,
        udp_dst_port,
        roce.len(),
    );
    masked_roce_crc(&hdr, roce)
}

/// The masked IPv4 and UDP headers of a RoCE packet of `roce_len` bytes
/// (BTH..ICRC): what the ICRC covers before the BTH.
fn masked_v4(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    ip_id: u16,
    dont_frag: bool,
    udp_src_port: u16,
    udp_dst_port: u16,
    roce_len: usize,
) -> [u8; 28] {
    // Wrapping casts: documented above.
    let total = (ipv4::HEADER_LEN + udp::HEADER_LEN + roce_len) as u16;
    let udp_len = (udp::HEADER_LEN + roce_len) as u16;
    let [tl0, tl1] = total.to_be_bytes();
    let [id0, id1] = ip_id.to_be_bytes();
    let [s0, s1, s2, s3] = src.octets();
    let [d0, d1, d2, d3] = dst.octets();
    let [sp0, sp1] = udp_src_port.to_be_bytes();
    let [dp0, dp1] = udp_dst_port.to_be_bytes();
    let [ul0, ul1] = udp_len.to_be_bytes();
    let df = if dont_frag { 0x40 } else { 0 };
    [
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
    ]
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
    let hdr = masked_v6(src, dst, udp_src_port, udp_dst_port, roce.len());
    masked_roce_crc(&hdr, roce)
}

/// The masked IPv6 and UDP headers of a RoCE packet of `roce_len` bytes.
fn masked_v6(
    src: Ipv6Addr,
    dst: Ipv6Addr,
    udp_src_port: u16,
    udp_dst_port: u16,
    roce_len: usize,
) -> [u8; 48] {
    // Wrapping cast: lengths above 65535 wrap as the 16-bit field would.
    let len = (udp::HEADER_LEN + roce_len) as u16;
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
    hdr
}

/// An ICRC computed piece by piece, for a packet whose bytes are not in
/// one buffer: a sender that sends its payload from registered memory in
/// place (headers from one buffer, payload from another, pad, trailer)
/// feeds the pieces in wire order after the BTH. The result equals
/// [`compute_v4`] / [`compute_v6`] over the same bytes laid end to end.
#[derive(Clone, Debug)]
pub struct IcrcStream {
    h: crc32fast::Hasher,
}

impl IcrcStream {
    /// Start the ICRC of an IPv4 packet of `roce_len` bytes (BTH..ICRC)
    /// whose BTH is `bth` (its masked byte is masked here).
    #[allow(clippy::too_many_arguments)]
    pub fn v4(
        src: Ipv4Addr,
        dst: Ipv4Addr,
        ip_id: u16,
        dont_frag: bool,
        udp_src_port: u16,
        udp_dst_port: u16,
        roce_len: usize,
        bth: &[u8; bth::HEADER_LEN],
    ) -> IcrcStream {
        let hdr = masked_v4(
            src,
            dst,
            ip_id,
            dont_frag,
            udp_src_port,
            udp_dst_port,
            roce_len,
        );
        IcrcStream::start(&hdr, bth)
    }

    /// Start the ICRC of an IPv6 packet of `roce_len` bytes whose BTH is
    /// `bth`.
    pub fn v6(
        src: Ipv6Addr,
        dst: Ipv6Addr,
        udp_src_port: u16,
        udp_dst_port: u16,
        roce_len: usize,
        bth: &[u8; bth::HEADER_LEN],
    ) -> IcrcStream {
        let hdr = masked_v6(src, dst, udp_src_port, udp_dst_port, roce_len);
        IcrcStream::start(&hdr, bth)
    }

    fn start(ip_udp: &[u8], bth: &[u8; bth::HEADER_LEN]) -> IcrcStream {
        let mut masked = *bth;
        masked[BTH_RESV8A] = 0xFF;
        let mut h = crc32fast::Hasher::new_with_initial(CRC_AFTER_FF8);
        h.update(ip_udp);
        h.update(&masked);
        IcrcStream { h }
    }

    /// The next bytes after the BTH (extension headers, payload, pad), in
    /// wire order; not the 4-byte trailer.
    pub fn update(&mut self, bytes: &[u8]) {
        self.h.update(bytes);
    }

    /// The next bytes, CRCed by the caller: `f` gets the running CRC-32
    /// (zlib's convention, what `crc32fast::Hasher::new_with_initial`
    /// takes) and returns it continued over those bytes — for bytes that
    /// cannot be lent as a slice, such as a payload read in place from
    /// registered memory (`rnic_dma::crc::crc32_span`). An error from `f`
    /// is returned and leaves the stream as it was.
    pub fn update_with<E>(
        &mut self,
        f: impl FnOnce(u32) -> std::result::Result<u32, E>,
    ) -> std::result::Result<(), E> {
        let crc = f(self.h.clone().finalize())?;
        self.h = crc32fast::Hasher::new_with_initial(crc);
        Ok(())
    }

    /// The ICRC value (appended least-significant byte first).
    pub fn finish(self) -> u32 {
        self.h.finalize()
    }
}

/// Covered bytes (masked headers and packet) up to which the CRC runs in
/// one pass over a stack copy: for an ACK or a small WRITE the fixed cost of
/// three CRC calls over 28-, 12- and n-byte pieces (each ending bytewise) is
/// most of the work, and one call over the copy takes half the time.
const ONE_PASS: usize = 192;

fn masked_roce_crc(ip_udp: &[u8], roce: &[u8]) -> u32 {
    let (bth_part, rest) = split_roce(roce);
    let total = ip_udp.len() + bth_part.len() + rest.len();
    if total <= ONE_PASS {
        let mut buf = [0u8; ONE_PASS];
        let (hdrs, tail) = buf.split_at_mut(ip_udp.len());
        hdrs.copy_from_slice(ip_udp);
        let (bth, tail) = tail.split_at_mut(bth_part.len());
        bth.copy_from_slice(bth_part);
        if let Some(b) = bth.get_mut(BTH_RESV8A) {
            *b = 0xFF;
        }
        if let Some(t) = tail.get_mut(..rest.len()) {
            t.copy_from_slice(rest);
        }
        let mut h = crc32fast::Hasher::new_with_initial(CRC_AFTER_FF8);
        h.update(buf.get(..total).unwrap_or(&[]));
        return h.finalize();
    }
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

/// Check `roce`'s length for an IP header of `ip_hdr` bytes, then write
/// the trailer `compute` finds.
fn fill_by(roce: &mut [u8], ip_hdr: usize, compute: impl FnOnce(&[u8]) -> u32) -> Result<u32> {
    check_udp_payload(roce.len(), ip_hdr)?;
    let v = compute(roce);
    write_trailer(roce, v);
    Ok(v)
}

/// Check `roce`'s length for an IP header of `ip_hdr` bytes, then its
/// trailer against what `compute` finds.
fn verify_by(roce: &[u8], ip_hdr: usize, compute: impl FnOnce(&[u8]) -> u32) -> Result<()> {
    check_udp_payload(roce.len(), ip_hdr)?;
    check_trailer(roce, compute(roce))
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
    fill_by(roce, ipv4::HEADER_LEN, |r| {
        compute_v4(src, dst, ip_id, dont_frag, udp_src_port, udp_dst_port, r)
    })
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
    verify_by(roce, ipv4::HEADER_LEN, |r| {
        compute_v4(src, dst, ip_id, dont_frag, udp_src_port, udp_dst_port, r)
    })
}

/// [`compute_v6`] and write the trailer of `roce` (BTH..ICRC).
pub fn fill_v6(
    src: Ipv6Addr,
    dst: Ipv6Addr,
    udp_src_port: u16,
    udp_dst_port: u16,
    roce: &mut [u8],
) -> Result<u32> {
    fill_by(roce, ipv6::HEADER_LEN, |r| {
        compute_v6(src, dst, udp_src_port, udp_dst_port, r)
    })
}

/// Check the trailer of `roce` (BTH..ICRC) received over IPv6.
pub fn verify_v6(
    src: Ipv6Addr,
    dst: Ipv6Addr,
    udp_src_port: u16,
    udp_dst_port: u16,
    roce: &[u8],
) -> Result<()> {
    verify_by(roce, ipv6::HEADER_LEN, |r| {
        compute_v6(src, dst, udp_src_port, udp_dst_port, r)
    })
}

/// [`IcrcCache`] slots (a power of two).
const CACHE_SLOTS: usize = 8;

/// BTH bytes an [`IcrcCache`] state covers: opcode, flags, P_Key, and the
/// masked byte after them.
const CACHED_BTH: usize = BTH_RESV8A + 1;

/// Everything the bytes before BTH byte 5 depend on: the masked IP and UDP
/// headers are a function of the addresses, ports, identification, DF and
/// the RoCE length (from which the IP and UDP lengths are derived), and
/// the BTH's first four bytes are copied; its fifth is masked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Prefix {
    V4 {
        src: Ipv4Addr,
        dst: Ipv4Addr,
        ip_id: u16,
        dont_frag: bool,
        sport: u16,
        dport: u16,
        roce_len: usize,
        bth: [u8; BTH_RESV8A],
    },
    V6 {
        src: Ipv6Addr,
        dst: Ipv6Addr,
        sport: u16,
        dport: u16,
        roce_len: usize,
        bth: [u8; BTH_RESV8A],
    },
}

impl Prefix {
    /// This prefix with identification 0, and the identification: the
    /// [`IcrcCache`] remembers the former and folds the latter in
    /// ([`ident_delta`]).
    fn split_ident(mut self) -> (Prefix, u16) {
        let id = match &mut self {
            Prefix::V4 { ip_id, .. } => std::mem::take(ip_id),
            Prefix::V6 { .. } => 0,
        };
        (self, id)
    }

    /// The slot this prefix lives in: a multiplicative hash of the fields
    /// that tell a flow's packet shapes and its flows apart.
    fn slot(&self) -> usize {
        let (len, bth, id, sport, dst) = match self {
            Prefix::V4 {
                dst,
                ip_id,
                sport,
                roce_len,
                bth,
                ..
            } => (*roce_len, *bth, *ip_id, *sport, dst.octets()[3]),
            Prefix::V6 {
                dst,
                sport,
                roce_len,
                bth,
                ..
            } => (*roce_len, *bth, 0, *sport, dst.octets()[15]),
        };
        let x = (len as u64)
            ^ u64::from(u32::from_le_bytes(bth)) << 16
            ^ u64::from(id) << 24
            ^ u64::from(sport) << 40
            ^ u64::from(dst) << 56;
        // The top bits of a Fibonacci hash.
        (x.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - CACHE_SLOTS.trailing_zeros())) as usize
    }

    /// The CRC state after `FF×8 ‖ masked IP and UDP headers ‖ BTH[0..4] ‖
    /// FF`, computed as the reference functions lay those bytes out.
    fn crc(&self) -> crc32fast::Hasher {
        let mut h = crc32fast::Hasher::new_with_initial(CRC_AFTER_FF8);
        let bth = match *self {
            Prefix::V4 {
                src,
                dst,
                ip_id,
                dont_frag,
                sport,
                dport,
                roce_len,
                bth,
            } => {
                h.update(&masked_v4(
                    src, dst, ip_id, dont_frag, sport, dport, roce_len,
                ));
                bth
            }
            Prefix::V6 {
                src,
                dst,
                sport,
                dport,
                roce_len,
                bth,
            } => {
                h.update(&masked_v6(src, dst, sport, dport, roce_len));
                bth
            }
        };
        h.update(&bth);
        h.update(&[0xFF]);
        h
    }
}

#[derive(Clone, Debug)]
struct Cached {
    /// A prefix with identification 0.
    prefix: Prefix,
    /// `prefix.crc()`.
    after: crc32fast::Hasher,
}

/// Bytes of an IPv4 prefix after `FF×8` ([`Prefix::crc`]): the masked IP
/// and UDP headers, BTH bytes 0–3, the masked BTH byte.
const V4_PREFIX_AFTER_FF8: usize = 28 + BTH_RESV8A + 1;

/// `IDENT_HI[b]`, `IDENT_LO[b]`: the raw CRC register (zero start, no
/// final inversion) over a [`V4_PREFIX_AFTER_FF8`]-byte run of zeros with
/// `b` in the identification's high or low byte.
const IDENT_HI: [u32; 256] = ident_table(IDENT_AT - 8);
const IDENT_LO: [u32; 256] = ident_table(IDENT_AT - 8 + 1);

const fn ident_table(at: usize) -> [u32; 256] {
    let mut t = [0u32; 256];
    let mut b = 0;
    while b < 256 {
        // Zeros before `at` leave a zero register as it is.
        let mut c = CRC_TABLE[b];
        let mut k = at + 1;
        while k < V4_PREFIX_AFTER_FF8 {
            c = (c >> 8) ^ CRC_TABLE[(c & 0xff) as usize];
            k += 1;
        }
        t[b] = c;
        b += 1;
    }
    t
}

/// What identification `id` changes in the CRC after an IPv4 prefix
/// against identification 0. The CRC is affine: two messages of the same
/// length that differ only in `d` have CRCs (zlib's, any start) that
/// differ by the raw register over `d` alone, and the prefixes differ only
/// in the identification's two bytes.
fn ident_delta(id: u16) -> u32 {
    let [hi, lo] = id.to_be_bytes();
    IDENT_HI[usize::from(hi)] ^ IDENT_LO[usize::from(lo)]
}

/// The ICRC with the CRC over each packet shape's constant prefix
/// remembered.
///
/// Everything the ICRC covers before BTH byte 5 — `FF×8`, the masked IP
/// and UDP headers, the BTH's opcode, flags and P_Key, its masked byte —
/// is the same for every packet of a flow with the same length, opcode
/// and IPv4 identification, and an 8-byte ping-pong sends and receives
/// the same two or three such shapes (the WRITE, its ACK) over and over.
/// The cache keeps the CRC state after that prefix for the last
/// [`CACHE_SLOTS`] shapes seen (direct-mapped), **keyed by every field
/// the prefix bytes are made from but the IPv4 identification**, with
/// identification 0; the packet's identification is then folded into the
/// state exactly (the CRC is affine, so it changes the state by a value
/// two table lookups give, [`ident_delta`]). A hit resumes from the state
/// over exactly the bytes this packet's prefix is, so the result is the
/// reference computation's ([`compute_v4`], [`compute_v6`]) bit for bit,
/// for any field values; a miss hashes the prefix and replaces the slot.
/// Per packet that leaves comparing the fields and one CRC call over the
/// packet from BTH byte 5 to the trailer, in place (no masked copy).
///
/// The segments of a GRO datagram (identifications 0, 1, 2, …) and a
/// flow whose identification changes with every packet (a kernel rxe
/// peer counts) share one slot.
#[derive(Clone, Debug, Default)]
pub struct IcrcCache {
    slots: [Option<Cached>; CACHE_SLOTS],
    hits: u64,
    misses: u64,
}

impl IcrcCache {
    /// An empty cache.
    pub fn new() -> IcrcCache {
        IcrcCache::default()
    }

    /// Computations that resumed from a remembered prefix state.
    pub fn hits(&self) -> u64 {
        self.hits
    }

    /// Computations that hashed their prefix (and remembered it).
    pub fn misses(&self) -> u64 {
        self.misses
    }

    /// The ICRC of `roce` (BTH..ICRC, at least [`CACHED_BTH`] covered
    /// bytes) whose prefix is `prefix`.
    fn compute(&mut self, prefix: Prefix, after_prefix: &[u8]) -> u32 {
        self.stream(prefix, after_prefix).finish()
    }

    /// A stream resumed after `prefix` that has covered `after_prefix`.
    fn stream(&mut self, prefix: Prefix, after_prefix: &[u8]) -> IcrcStream {
        let mut h = self.state_after(prefix);
        h.update(after_prefix);
        IcrcStream { h }
    }

    /// The CRC state after `prefix`: remembered for the prefix with
    /// identification 0 (or hashed and remembered), the identification
    /// folded in ([`ident_delta`]).
    #[inline(always)]
    fn state_after(&mut self, prefix: Prefix) -> crc32fast::Hasher {
        let (base, id) = prefix.split_ident();
        let after = match self.slots.get_mut(base.slot()) {
            Some(Some(c)) if c.prefix == base => {
                self.hits += 1;
                c.after.clone()
            }
            slot => {
                self.misses += 1;
                let after = base.crc();
                if let Some(slot) = slot {
                    *slot = Some(Cached {
                        prefix: base,
                        after: after.clone(),
                    });
                }
                after
            }
        };
        if id == 0 {
            after
        } else {
            crc32fast::Hasher::new_with_initial(after.finalize() ^ ident_delta(id))
        }
    }

    /// [`compute_v4`], resuming from the remembered prefix state.
    #[allow(clippy::too_many_arguments)] // the free function's, and `self`
    pub fn compute_v4(
        &mut self,
        src: Ipv4Addr,
        dst: Ipv4Addr,
        ip_id: u16,
        dont_frag: bool,
        udp_src_port: u16,
        udp_dst_port: u16,
        roce: &[u8],
    ) -> u32 {
        match split_prefix(roce) {
            Some((bth, rest)) => {
                let prefix = Prefix::V4 {
                    src,
                    dst,
                    ip_id,
                    dont_frag,
                    sport: udp_src_port,
                    dport: udp_dst_port,
                    roce_len: roce.len(),
                    bth,
                };
                self.compute(prefix, rest)
            }
            None => compute_v4(src, dst, ip_id, dont_frag, udp_src_port, udp_dst_port, roce),
        }
    }

    /// [`compute_v6`], resuming from the remembered prefix state.
    pub fn compute_v6(
        &mut self,
        src: Ipv6Addr,
        dst: Ipv6Addr,
        udp_src_port: u16,
        udp_dst_port: u16,
        roce: &[u8],
    ) -> u32 {
        match split_prefix(roce) {
            Some((bth, rest)) => {
                let prefix = Prefix::V6 {
                    src,
                    dst,
                    sport: udp_src_port,
                    dport: udp_dst_port,
                    roce_len: roce.len(),
                    bth,
                };
                self.compute(prefix, rest)
            }
            None => compute_v6(src, dst, udp_src_port, udp_dst_port, roce),
        }
    }

    /// [`IcrcStream::v4`] resuming from the remembered prefix state, for a
    /// packet of `roce_len` bytes (BTH..ICRC) whose headers — the BTH and
    /// any extension headers, in one buffer — are `head`: the stream has
    /// covered `head` and takes the payload and pad next. For a sender
    /// whose payload is read in place, where the prefix (masked IP and UDP
    /// headers, BTH bytes 0–4) is the same for every segment of a GSO
    /// datagram but the identification. `None` when `head` is shorter than
    /// a BTH.
    #[allow(clippy::too_many_arguments)] // the stream's, and `self`
    pub fn stream_v4(
        &mut self,
        src: Ipv4Addr,
        dst: Ipv4Addr,
        ip_id: u16,
        dont_frag: bool,
        udp_src_port: u16,
        udp_dst_port: u16,
        roce_len: usize,
        head: &[u8],
    ) -> Option<IcrcStream> {
        let (bth, rest) = split_head(head)?;
        let prefix = Prefix::V4 {
            src,
            dst,
            ip_id,
            dont_frag,
            sport: udp_src_port,
            dport: udp_dst_port,
            roce_len,
            bth,
        };
        Some(self.stream(prefix, rest))
    }

    /// [`IcrcCache::stream_v4`] for IPv6 ([`IcrcStream::v6`]).
    #[allow(clippy::too_many_arguments)] // the stream's, and `self`
    pub fn stream_v6(
        &mut self,
        src: Ipv6Addr,
        dst: Ipv6Addr,
        udp_src_port: u16,
        udp_dst_port: u16,
        roce_len: usize,
        head: &[u8],
    ) -> Option<IcrcStream> {
        let (bth, rest) = split_head(head)?;
        let prefix = Prefix::V6 {
            src,
            dst,
            sport: udp_src_port,
            dport: udp_dst_port,
            roce_len,
            bth,
        };
        Some(self.stream(prefix, rest))
    }

    /// [`fill_v4`] through the cache.
    #[allow(clippy::too_many_arguments)] // the free function's, and `self`
    pub fn fill_v4(
        &mut self,
        src: Ipv4Addr,
        dst: Ipv4Addr,
        ip_id: u16,
        dont_frag: bool,
        udp_src_port: u16,
        udp_dst_port: u16,
        roce: &mut [u8],
    ) -> Result<u32> {
        fill_by(roce, ipv4::HEADER_LEN, |r| {
            self.compute_v4(src, dst, ip_id, dont_frag, udp_src_port, udp_dst_port, r)
        })
    }

    /// [`verify_v4`] through the cache.
    #[allow(clippy::too_many_arguments)] // the free function's, and `self`
    pub fn verify_v4(
        &mut self,
        src: Ipv4Addr,
        dst: Ipv4Addr,
        ip_id: u16,
        dont_frag: bool,
        udp_src_port: u16,
        udp_dst_port: u16,
        roce: &[u8],
    ) -> Result<()> {
        verify_by(roce, ipv4::HEADER_LEN, |r| {
            self.compute_v4(src, dst, ip_id, dont_frag, udp_src_port, udp_dst_port, r)
        })
    }

    /// [`IcrcCache::verify_v4`] for a packet received in parts: `head`
    /// (BTH and the headers after it), a `body` whose CRC the caller took
    /// where it lies (`body.0`: the CRC-32 of its `body.1` bytes alone,
    /// zlib's convention, e.g. a payload read in place in registered
    /// memory), then `tail` (pad and the ICRC). The body's CRC is folded in
    /// (`crc32fast::Hasher::combine`), so a caller trying several
    /// identifications reads the body once.
    #[allow(clippy::too_many_arguments)] // verify_v4's, and the parts
    pub fn verify_v4_parts(
        &mut self,
        src: Ipv4Addr,
        dst: Ipv4Addr,
        ip_id: u16,
        dont_frag: bool,
        udp_src_port: u16,
        udp_dst_port: u16,
        head: &[u8],
        body: (u32, usize),
        tail: &[u8],
    ) -> Result<()> {
        let (roce_len, bth) = parts_shape(head, body.1, tail, ipv4::HEADER_LEN)?;
        let prefix = Prefix::V4 {
            src,
            dst,
            ip_id,
            dont_frag,
            sport: udp_src_port,
            dport: udp_dst_port,
            roce_len,
            bth,
        };
        self.verify_parts(prefix, head, body, tail)
    }

    /// [`IcrcCache::verify_v6`] for a packet received in parts (see
    /// [`IcrcCache::verify_v4_parts`]).
    #[allow(clippy::too_many_arguments)] // verify_v6's, and the parts
    pub fn verify_v6_parts(
        &mut self,
        src: Ipv6Addr,
        dst: Ipv6Addr,
        udp_src_port: u16,
        udp_dst_port: u16,
        head: &[u8],
        body: (u32, usize),
        tail: &[u8],
    ) -> Result<()> {
        let (roce_len, bth) = parts_shape(head, body.1, tail, ipv6::HEADER_LEN)?;
        let prefix = Prefix::V6 {
            src,
            dst,
            sport: udp_src_port,
            dport: udp_dst_port,
            roce_len,
            bth,
        };
        self.verify_parts(prefix, head, body, tail)
    }

    /// The parts' ICRC, resuming from the prefix state, against the
    /// trailer at the end of `tail`.
    fn verify_parts(
        &mut self,
        prefix: Prefix,
        head: &[u8],
        (body_crc, body_len): (u32, usize),
        tail: &[u8],
    ) -> Result<()> {
        let (Some(after), Some(pad)) = (
            head.get(CACHED_BTH..),
            tail.get(..tail.len().saturating_sub(ICRC_LEN)),
        ) else {
            return Err(Error::Truncated {
                header: Header::Bth,
                need: CACHED_BTH + ICRC_LEN,
                have: head.len() + tail.len(),
            });
        };
        let mut h = self.state_after(prefix);
        h.update(after);
        h.combine(&crc32fast::Hasher::new_with_initial_len(
            body_crc,
            body_len as u64,
        ));
        h.update(pad);
        check_trailer(tail, h.finalize())
    }

    /// [`fill_v6`] through the cache.
    pub fn fill_v6(
        &mut self,
        src: Ipv6Addr,
        dst: Ipv6Addr,
        udp_src_port: u16,
        udp_dst_port: u16,
        roce: &mut [u8],
    ) -> Result<u32> {
        fill_by(roce, ipv6::HEADER_LEN, |r| {
            self.compute_v6(src, dst, udp_src_port, udp_dst_port, r)
        })
    }

    /// [`verify_v6`] through the cache.
    pub fn verify_v6(
        &mut self,
        src: Ipv6Addr,
        dst: Ipv6Addr,
        udp_src_port: u16,
        udp_dst_port: u16,
        roce: &[u8],
    ) -> Result<()> {
        verify_by(roce, ipv6::HEADER_LEN, |r| {
            self.compute_v6(src, dst, udp_src_port, udp_dst_port, r)
        })
    }
}

/// A packet in parts: its RoCE length (checked to fit a UDP datagram over
/// an IP header of `ip_hdr` bytes) and the BTH bytes a cached prefix
/// copies, from `head`.
fn parts_shape(
    head: &[u8],
    body_len: usize,
    tail: &[u8],
    ip_hdr: usize,
) -> Result<(usize, [u8; BTH_RESV8A])> {
    let roce_len = head.len() + body_len + tail.len();
    check_udp_payload(roce_len, ip_hdr)?;
    let bth = *head.first_chunk::<BTH_RESV8A>().ok_or(Error::Truncated {
        header: Header::Bth,
        need: CACHED_BTH,
        have: head.len(),
    })?;
    Ok((roce_len, bth))
}

/// `roce` (BTH..ICRC) as the BTH bytes a cached prefix copies and the
/// covered bytes after the prefix (BTH byte 5 .. pad); `None` when fewer
/// than [`CACHED_BTH`] bytes are covered.
fn split_prefix(roce: &[u8]) -> Option<([u8; BTH_RESV8A], &[u8])> {
    let covered = roce.get(..roce.len().checked_sub(ICRC_LEN)?)?;
    let bth = *covered.first_chunk::<BTH_RESV8A>()?;
    Some((bth, covered.get(CACHED_BTH..)?))
}

/// Headers (BTH and extension headers, no trailer) as the BTH bytes a
/// cached prefix copies and the bytes after the prefix; `None` when `head`
/// is shorter than a BTH.
fn split_head(head: &[u8]) -> Option<([u8; BTH_RESV8A], &[u8])> {
    head.get(..bth::HEADER_LEN)?;
    Some((*head.first_chunk::<BTH_RESV8A>()?, head.get(CACHED_BTH..)?))
}

/// Reflected CRC-32 polynomial (IEEE 802.3).
const POLY: u32 = 0xEDB8_8320;

/// `T[i]`: the raw CRC register after feeding byte `i` into a zero register.
const CRC_TABLE: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { (c >> 1) ^ POLY } else { c >> 1 };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
};

/// `TOP_INV[CRC_TABLE[i] >> 24] == i`: the table's top bytes are distinct,
/// which makes one register step invertible.
const TOP_INV: [u8; 256] = {
    let mut inv = [0u8; 256];
    let mut i = 0;
    while i < 256 {
        inv[(CRC_TABLE[i] >> 24) as usize] = i as u8;
        i += 1;
    }
    inv
};

/// One raw register step over `byte`.
fn step(state: u32, byte: u8) -> u32 {
    let t = CRC_TABLE
        .get(usize::from((state as u8) ^ byte))
        .copied()
        .unwrap_or(0);
    (state >> 8) ^ t
}

/// Undo one raw register step over a zero byte.
fn unstep_zero(state: u32) -> u32 {
    let i = TOP_INV.get((state >> 24) as usize).copied().unwrap_or(0);
    let t = CRC_TABLE.get(usize::from(i)).copied().unwrap_or(0);
    ((state ^ t) << 8) | u32::from(i)
}

/// Masked-buffer offsets (after the 8-byte 0xFF prefix) of the IPv4
/// identification (two bytes) and the flags byte.
const IDENT_AT: usize = 8 + 4;
const FLAGS_AT: usize = 8 + 6;

/// For a receiver that only sees the UDP payload (a UDP-socket provider):
/// find the IPv4 identification and DF flag with which the ICRC of `roce`
/// (BTH..ICRC received from `src` to `dst`) verifies.
///
/// The ICRC covers the IPv4 identification, which the sending kernel
/// chooses (rxe uses `__ip_select_ident`: a per-destination counter) and a
/// UDP socket does not report. CRC-32 is affine, so the 17 unknown bits
/// (16 of identification, DF) are solved for exactly from the difference
/// between the trailer and the ICRC computed with identification 0; the
/// answer is then checked with a full [`verify_v4`]. The price: only
/// 32 − 17 = 15 bits of the ICRC still detect corruption (a random error
/// passes with probability 2⁻¹⁵ instead of 2⁻³²). Costs one CRC pass plus
/// one table step per packet byte; allocates nothing.
///
/// Fails with [`Error::IcrcMismatch`] (reporting the ICRC for
/// identification 0) when no identification makes the trailer match.
pub fn recover_v4_ident(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    udp_src_port: u16,
    udp_dst_port: u16,
    roce: &[u8],
) -> Result<(u16, bool)> {
    check_udp_payload(roce.len(), ipv4::HEADER_LEN)?;
    let base = compute_v4(src, dst, 0, false, udp_src_port, udp_dst_port, roce);
    let found = trailer(roce, roce.len());
    // Bytes fed to the CRC after the flags byte: the rest of the masked
    // IPv4 header (5) and UDP header (8), then BTH .. pad.
    let after_flags = (ipv4::HEADER_LEN - 7) + udp::HEADER_LEN + (roce.len() - ICRC_LEN);
    // Undo the register steps over those bytes: what remains is the
    // contribution of the unknown bits, seen right after the flags byte.
    let mut target = base ^ found;
    for _ in 0..after_flags {
        target = unstep_zero(target);
    }
    // Each unknown bit's contribution at the same point, and a GF(2) basis.
    let mut basis = [(0u32, 0u32); 32];
    let unknowns = (0..17u32).map(|k| {
        let (at, byte) = match k {
            0..=7 => (IDENT_AT + 1, 1u8 << k),
            8..=15 => (IDENT_AT, 1u8 << (k - 8)),
            _ => (FLAGS_AT, 0x40),
        };
        let mut v = step(0, byte);
        for _ in at..FLAGS_AT {
            v = step(v, 0);
        }
        (v, 1u32 << k)
    });
    for (vec, mask) in unknowns {
        insert(&mut basis, vec, mask);
    }
    let mask = solve(&basis, target).ok_or(Error::IcrcMismatch {
        computed: base,
        found,
    })?;
    // The low 16 bits are the identification, bit 16 the DF flag.
    let ident = (mask & 0xFFFF) as u16;
    let dont_frag = mask & 0x1_0000 != 0;
    verify_v4(src, dst, ident, dont_frag, udp_src_port, udp_dst_port, roce)?;
    Ok((ident, dont_frag))
}

/// Add `(vec, mask)` to an XOR basis indexed by leading bit.
fn insert(basis: &mut [(u32, u32); 32], mut vec: u32, mut mask: u32) {
    while vec != 0 {
        let top = 31 - vec.leading_zeros() as usize;
        match basis.get_mut(top) {
            Some(slot) if slot.0 == 0 => {
                *slot = (vec, mask);
                return;
            }
            Some(slot) => {
                vec ^= slot.0;
                mask ^= slot.1;
            }
            None => return,
        }
    }
}

/// The mask of basis vectors whose XOR is `target`, if any.
fn solve(basis: &[(u32, u32); 32], mut target: u32) -> Option<u32> {
    let mut mask = 0;
    while target != 0 {
        let top = 31 - target.leading_zeros() as usize;
        let &(vec, m) = basis.get(top)?;
        if vec == 0 {
            return None;
        }
        target ^= vec;
        mask ^= m;
    }
    Some(mask)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// The fields of one packet an [`IcrcCache`] is asked about.
    #[derive(Clone, Debug)]
    struct Case {
        v6: bool,
        src: [u8; 16],
        dst: [u8; 16],
        ip_id: u16,
        df: bool,
        sport: u16,
        dport: u16,
        roce: Vec<u8>,
        /// Values for every field the ICRC masks.
        noise: [u8; 9],
    }

    impl Case {
        fn v4(&self) -> (Ipv4Addr, Ipv4Addr) {
            let a = |b: &[u8; 16]| Ipv4Addr::new(b[0], b[1], b[2], b[3]);
            (a(&self.src), a(&self.dst))
        }

        fn reference(&self) -> u32 {
            let (s4, d4) = self.v4();
            if self.v6 {
                let (s, d) = (Ipv6Addr::from(self.src), Ipv6Addr::from(self.dst));
                compute_v6(s, d, self.sport, self.dport, &self.roce)
            } else {
                compute_v4(
                    s4, d4, self.ip_id, self.df, self.sport, self.dport, &self.roce,
                )
            }
        }

        fn cached(&self, c: &mut IcrcCache) -> u32 {
            self.cached_over(c, &self.roce)
        }

        fn cached_over(&self, c: &mut IcrcCache, roce: &[u8]) -> u32 {
            let (s4, d4) = self.v4();
            if self.v6 {
                let (s, d) = (Ipv6Addr::from(self.src), Ipv6Addr::from(self.dst));
                c.compute_v6(s, d, self.sport, self.dport, roce)
            } else {
                c.compute_v4(s4, d4, self.ip_id, self.df, self.sport, self.dport, roce)
            }
        }

        fn fill(&self, c: &mut IcrcCache, roce: &mut [u8]) -> Result<u32> {
            let (s4, d4) = self.v4();
            if self.v6 {
                let (s, d) = (Ipv6Addr::from(self.src), Ipv6Addr::from(self.dst));
                c.fill_v6(s, d, self.sport, self.dport, roce)
            } else {
                c.fill_v4(s4, d4, self.ip_id, self.df, self.sport, self.dport, roce)
            }
        }

        fn verify(&self, c: &mut IcrcCache, roce: &[u8]) -> Result<()> {
            let (s4, d4) = self.v4();
            if self.v6 {
                let (s, d) = (Ipv6Addr::from(self.src), Ipv6Addr::from(self.dst));
                c.verify_v6(s, d, self.sport, self.dport, roce)
            } else {
                c.verify_v4(s4, d4, self.ip_id, self.df, self.sport, self.dport, roce)
            }
        }

        /// The whole IP packet (the input of [`compute`], which masks by
        /// itself), with the masked fields and BTH byte 4 set to noise.
        fn ip_packet(&self) -> Vec<u8> {
            let n = self.noise;
            let udp_len = (8 + self.roce.len()) as u16;
            let mut p = Vec::new();
            if self.v6 {
                p.extend_from_slice(&[0x60 | (n[0] & 0x0F), n[1], n[2], n[3]]);
                p.extend_from_slice(&udp_len.to_be_bytes());
                p.extend_from_slice(&[PROTOCOL_UDP, n[4]]);
                p.extend_from_slice(&self.src);
                p.extend_from_slice(&self.dst);
            } else {
                p.extend_from_slice(&[0x45, n[0]]);
                p.extend_from_slice(&(udp_len + 20).to_be_bytes());
                p.extend_from_slice(&self.ip_id.to_be_bytes());
                p.extend_from_slice(&[if self.df { 0x40 } else { 0 }, 0, n[1], PROTOCOL_UDP]);
                p.extend_from_slice(&[n[2], n[3]]);
                p.extend_from_slice(&self.src[..4]);
                p.extend_from_slice(&self.dst[..4]);
            }
            p.extend_from_slice(&self.sport.to_be_bytes());
            p.extend_from_slice(&self.dport.to_be_bytes());
            p.extend_from_slice(&udp_len.to_be_bytes());
            p.extend_from_slice(&[n[5], n[6]]);
            let bth_at = p.len();
            p.extend_from_slice(&self.roce);
            p[bth_at + BTH_RESV8A] = n[7];
            p
        }
    }

    /// Few values often (so packets share prefixes, or differ in one
    /// field), any value sometimes.
    fn case() -> impl Strategy<Value = Case> {
        let addr = prop_oneof![3 => (0u8..3).prop_map(|i| [i; 16]), 1 => any::<[u8; 16]>()];
        let bth = prop_oneof![
            Just([0x0A, 0x00, 0xFF, 0xFF]), // RDMA WRITE Only
            Just([0x11, 0x00, 0xFF, 0xFF]), // ACKNOWLEDGE
            Just([0x0A, 0x40, 0xFF, 0xFF]), // … with a pad count
            any::<[u8; 4]>(),
        ];
        let len = prop_oneof![0usize..24, Just(20), Just(40), 24usize..300];
        let roce = (bth, len).prop_flat_map(|(bth, len)| {
            prop::collection::vec(any::<u8>(), len).prop_map(move |mut r| {
                let n = r.len().min(4);
                r[..n].copy_from_slice(&bth[..n]);
                r
            })
        });
        (
            any::<bool>(),
            addr.clone(),
            addr,
            prop_oneof![0u16..3, any::<u16>()],
            any::<bool>(),
            prop_oneof![Just(0xC000u16), any::<u16>()],
            prop_oneof![Just(4791u16), any::<u16>()],
            roce,
            any::<[u8; 9]>(),
        )
            .prop_map(
                |(v6, src, dst, ip_id, df, sport, dport, roce, noise)| Case {
                    v6,
                    src,
                    dst,
                    ip_id,
                    df,
                    sport,
                    dport,
                    roce,
                    noise,
                },
            )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// One cache asked about a run of packets (shared prefixes, one
        /// field apart, colliding slots, short and long, IPv4 and IPv6)
        /// answers every one as the reference does: the UDP-payload
        /// functions and the whole-packet computation over a real IP
        /// packet whose masked fields hold noise. Its fill writes the
        /// reference's trailer, its verify accepts it and rejects any
        /// changed covered byte.
        #[test]
        fn the_cache_computes_the_reference_icrc(
            cases in prop::collection::vec(case(), 1..40),
            flip in any::<prop::sample::Index>(),
        ) {
            let mut cache = IcrcCache::new();
            for c in &cases {
                let want = c.reference();
                prop_assert_eq!(c.cached(&mut cache), want, "{:?}", c);
                // BTH byte 4 is masked: any value, the same ICRC.
                if let Some(b) = c.roce.get(BTH_RESV8A) {
                    let mut r = c.roce.clone();
                    r[BTH_RESV8A] = !*b;
                    prop_assert_eq!(c.cached_over(&mut cache, &r), want);
                }
                if c.roce.len() < bth::HEADER_LEN + ICRC_LEN {
                    continue;
                }
                prop_assert_eq!(compute(&c.ip_packet()), Ok(want));
                let mut filled = c.roce.clone();
                prop_assert_eq!(c.fill(&mut cache, &mut filled), Ok(want));
                prop_assert_eq!(&filled[filled.len() - ICRC_LEN..], &want.to_le_bytes()[..]);
                prop_assert_eq!(c.verify(&mut cache, &filled), Ok(()));
                // Any covered byte but the masked one, or the trailer.
                let mut at = flip.index(filled.len() - 1);
                if at == BTH_RESV8A {
                    at = filled.len() - 1;
                }
                filled[at] ^= 0x01;
                let bad = c.verify(&mut cache, &filled);
                prop_assert!(matches!(bad, Err(Error::IcrcMismatch { .. })), "{:?}", bad);
            }
            prop_assert_eq!(cache.hits() + cache.misses(), {
                let long = cases.iter().filter(|c| c.roce.len() >= ICRC_LEN + CACHED_BTH);
                let full = cases.iter().filter(|c| c.roce.len() >= bth::HEADER_LEN + ICRC_LEN);
                // compute and the masked-byte variant; fill, verify, bad verify.
                2 * long.count() as u64 + 3 * full.count() as u64
            });
        }
    }

    /// A packet verified in parts — headers, a body whose CRC the caller
    /// took alone, a tail — verifies exactly when the whole packet does,
    /// at every split, IPv4 and IPv6; a changed byte in any part fails.
    #[test]
    fn parts_verify_as_the_whole_packet_does() {
        let (s4, d4) = (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2));
        let (s6, d6) = (Ipv6Addr::LOCALHOST, Ipv6Addr::UNSPECIFIED);
        let mut roce: Vec<u8> = (0..300u32).map(|i| (i * 7 + 3) as u8).collect();
        roce[..4].copy_from_slice(&[0x0E, 0x30, 0xFF, 0xFF]);
        let mut v4 = roce.clone();
        fill_v4(s4, d4, 9, true, 0xC000, 4791, &mut v4).expect("fill v4");
        let mut v6 = roce;
        fill_v6(s6, d6, 0xC000, 4791, &mut v6).expect("fill v6");
        let mut cache = IcrcCache::new();
        let body = |b: &[u8]| (crc32fast::hash(b), b.len());
        for h in [CACHED_BTH, 12, 16, 100] {
            for t in [ICRC_LEN, ICRC_LEN + 3] {
                for (v6_case, pkt) in [(false, &v4), (true, &v6)] {
                    let check = |c: &mut IcrcCache, p: &[u8]| {
                        let (head, rest) = p.split_at(h);
                        let (mid, tail) = rest.split_at(rest.len() - t);
                        if v6_case {
                            c.verify_v6_parts(s6, d6, 0xC000, 4791, head, body(mid), tail)
                        } else {
                            c.verify_v4_parts(s4, d4, 9, true, 0xC000, 4791, head, body(mid), tail)
                        }
                    };
                    assert_eq!(check(&mut cache, pkt), Ok(()), "split {h}/{t}");
                    for at in [0, h, h + 50, pkt.len() - t, pkt.len() - 1] {
                        let mut bad = pkt.clone();
                        bad[at] ^= 0x20;
                        let r = check(&mut cache, &bad);
                        assert!(matches!(r, Err(Error::IcrcMismatch { .. })), "{at}: {r:?}");
                    }
                }
            }
        }
        // Another identification: the whole packet's ICRC does not hold.
        let (head, rest) = v4.split_at(12);
        let (mid, tail) = rest.split_at(rest.len() - ICRC_LEN);
        let r = cache.verify_v4_parts(s4, d4, 10, true, 0xC000, 4791, head, body(mid), tail);
        assert!(r.is_err());
    }

    /// An IPv4 packet of `len` RoCE bytes starting with BTH `bth` (the rest
    /// zero) from 10.10.10.10 to 11.11.11.11, identification 0, DF, from
    /// port 0xC000 to 4791.
    fn v4_case(len: usize, bth: [u8; 12]) -> Case {
        let mut roce = vec![0u8; len];
        roce[..12].copy_from_slice(&bth);
        Case {
            v6: false,
            src: [10; 16],
            dst: [11; 16],
            ip_id: 0,
            df: true,
            sport: 0xC000,
            dport: 4791,
            roce,
            noise: [0; 9],
        }
    }

    /// A remembered prefix answers only for its own fields: the same
    /// shape again hits (and is right for any payload), and a packet one
    /// prefix field apart — address, identification, DF, port, length,
    /// any bit of the opcode, flags or P_Key, the IP version — gets its
    /// own ICRC, after which the first still gets its own. Every opcode.
    #[test]
    fn a_remembered_prefix_serves_only_its_own_fields() {
        let base = v4_case(40, [0x0A, 0, 0xFF, 0xFF, 0, 0, 0, 0x11, 0x80, 0, 0, 1]);
        let mut cache = IcrcCache::new();
        assert_eq!(base.cached(&mut cache), base.reference());
        assert_eq!((cache.hits(), cache.misses()), (0, 1));
        let mut other = base.clone();
        other.roce[20..].fill(0x5A);
        assert_eq!(other.cached(&mut cache), other.reference());
        assert_ne!(other.reference(), base.reference());
        assert_eq!((cache.hits(), cache.misses()), (1, 1));

        let mut variants = Vec::new();
        let mut push = |f: &dyn Fn(&mut Case)| {
            let mut v = base.clone();
            f(&mut v);
            variants.push(v);
        };
        push(&|c| c.src[3] ^= 1);
        push(&|c| c.dst[0] ^= 0x80);
        push(&|c| c.ip_id = 1);
        push(&|c| c.ip_id = 0x8000);
        push(&|c| c.df = false);
        push(&|c| c.sport ^= 1);
        push(&|c| c.dport ^= 0x100);
        push(&|c| c.roce.push(0));
        push(&|c| c.v6 = true);
        for bit in 0..32 {
            push(&|c| c.roce[bit / 8] ^= 1 << (bit % 8));
        }
        for v in &variants {
            assert_ne!(v.reference(), base.reference(), "{v:?}");
            for _ in 0..2 {
                assert_eq!(v.cached(&mut cache), v.reference(), "{v:?}");
                assert_eq!(base.cached(&mut cache), base.reference());
            }
        }
        for v6 in [false, true] {
            for op in 0..=u8::MAX {
                for len in [9, 16, 20, 40, 300] {
                    let mut c = base.clone();
                    c.v6 = v6;
                    c.roce.resize(len, 0x33);
                    c.roce[0] = op;
                    for _ in 0..2 {
                        assert_eq!(c.cached(&mut cache), c.reference(), "{op:#x}/{len}");
                    }
                }
            }
        }
        // Each of those asked twice in a row: the second at least hits.
        assert!(cache.hits() >= 2 + (variants.len() + 2 * 256 * 5) as u64);
    }

    /// The identifications of a GRO datagram's segments (0, 1, 2, …) and of
    /// a counting kernel rxe peer share one remembered prefix: one miss,
    /// then hits, each the reference ICRC (the identification is folded
    /// into the state exactly, [`ident_delta`]); every single-bit
    /// identification and the extremes too.
    #[test]
    fn identifications_share_one_remembered_prefix() {
        let mut base = v4_case(4136, [0x07, 0, 0xFF, 0xFF, 0, 0, 0, 0x11, 0x00, 0, 0, 9]);
        base.roce[12..].fill(0x77);
        let mut cache = IcrcCache::new();
        let ids = (0..16u16)
            .chain((0..16).map(|b| 1u16 << b))
            .chain([0xFFFF, 0x7FFF, 0x1234, 0xABCD]);
        for (n, id) in ids.enumerate() {
            let c = Case {
                ip_id: id,
                ..base.clone()
            };
            assert_eq!(
                c.cached(&mut cache),
                c.reference(),
                "identification {id:#x}"
            );
            assert_eq!((cache.misses(), cache.hits()), (1, n as u64), "{id:#x}");
        }
    }

    /// The one-pass path (small packets) and the streaming path (the rest)
    /// agree with a reference that hashes the whole masked stream from one
    /// buffer, for lengths on both sides of [`ONE_PASS`], IPv4 and IPv6.
    #[test]
    fn one_pass_and_streaming_paths_match_a_whole_buffer_reference() {
        let (s4, d4) = (Ipv4Addr::new(10, 1, 2, 3), Ipv4Addr::new(10, 4, 5, 6));
        let (s6, d6) = (
            Ipv6Addr::new(0xfd00, 1, 0, 0, 0, 0, 0, 1),
            Ipv6Addr::new(0xfd00, 1, 0, 0, 0, 0, 0, 2),
        );
        let reference = |hdr: &[u8], roce: &[u8]| {
            let covered = &roce[..roce.len() - ICRC_LEN];
            let mut all = vec![0xFF; 8];
            all.extend_from_slice(hdr);
            all.extend_from_slice(covered);
            all[8 + hdr.len() + BTH_RESV8A] = 0xFF;
            crc32fast::hash(&all)
        };
        let mut x = 0x1234_5678u32;
        for len in (16..=ONE_PASS + 64).chain([1052, 4124]) {
            let roce: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    x as u8
                })
                .collect();
            let l = (len + 8) as u16;
            let [l0, l1] = l.to_be_bytes();
            let [t0, t1] = (l + 20).to_be_bytes();
            let mut h4 = vec![
                0x45, 0xFF, t0, t1, 0x12, 0x34, 0x40, 0, 0xFF, 17, 0xFF, 0xFF,
            ];
            h4.extend_from_slice(&s4.octets());
            h4.extend_from_slice(&d4.octets());
            h4.extend_from_slice(&[0xC0, 0x01, 0x12, 0xB7, l0, l1, 0xFF, 0xFF]);
            assert_eq!(
                compute_v4(s4, d4, 0x1234, true, 0xC001, 4791, &roce),
                reference(&h4, &roce),
                "IPv4, {len} bytes"
            );
            let mut h6 = vec![0x6F, 0xFF, 0xFF, 0xFF, l0, l1, 17, 0xFF];
            h6.extend_from_slice(&s6.octets());
            h6.extend_from_slice(&d6.octets());
            h6.extend_from_slice(&[0xC0, 0x01, 0x12, 0xB7, l0, l1, 0xFF, 0xFF]);
            assert_eq!(
                compute_v6(s6, d6, 0xC001, 4791, &roce),
                reference(&h6, &roce),
                "IPv6, {len} bytes"
            );
        }
    }

    /// A piece CRCed by the caller (`update_with`, what a sender reading
    /// its payload in place does) continues the stream exactly as
    /// `update` over the same bytes; a failed piece leaves it unchanged.
    #[test]
    fn a_caller_crced_piece_continues_the_stream() {
        let (s4, d4) = (Ipv4Addr::new(10, 1, 2, 3), Ipv4Addr::new(10, 4, 5, 6));
        let len = 4124;
        let roce: Vec<u8> = (0..len).map(|i| (i * 13 + 1) as u8).collect();
        let bth: [u8; 12] = roce[..12].try_into().expect("12 bytes");
        let (head, rest) = roce[12..len - ICRC_LEN].split_at(16);
        let by_caller = |crc: u32, bytes: &[u8]| {
            let mut h = crc32fast::Hasher::new_with_initial(crc);
            h.update(bytes);
            h.finalize()
        };
        let mut a = IcrcStream::v4(s4, d4, 3, true, 0xC001, 4791, len, &bth);
        a.update(head);
        assert_eq!(
            a.update_with(|_| Err::<u32, &str>("span gone")),
            Err("span gone")
        );
        a.update_with(|crc| Ok::<_, ()>(by_caller(crc, rest)))
            .expect("infallible");
        assert_eq!(a.finish(), compute_v4(s4, d4, 3, true, 0xC001, 4791, &roce));
    }

    /// Feeding a packet in pieces (headers, payload split anywhere, pad)
    /// gives what the one-buffer computation gives, IPv4 and IPv6.
    #[test]
    fn the_stream_over_pieces_equals_the_whole_packet() {
        let (s4, d4) = (Ipv4Addr::new(10, 1, 2, 3), Ipv4Addr::new(10, 4, 5, 6));
        let (s6, d6) = (
            Ipv6Addr::LOCALHOST,
            Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 7),
        );
        for len in [16usize, 20, 61, 192, 1052, 4124] {
            let roce: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
            let bth: [u8; 12] = roce[..12].try_into().expect("12 bytes");
            let covered = &roce[12..len - ICRC_LEN];
            for cut in [0, 1, covered.len() / 2, covered.len()] {
                let (x, y) = covered.split_at(cut.min(covered.len()));
                let mut a = IcrcStream::v4(s4, d4, 7, true, 0xC001, 4791, len, &bth);
                a.update(x);
                a.update(y);
                assert_eq!(
                    a.finish(),
                    compute_v4(s4, d4, 7, true, 0xC001, 4791, &roce),
                    "{len}/{cut}"
                );
                let mut b = IcrcStream::v6(s6, d6, 0xC002, 4791, len, &bth);
                b.update(x);
                b.update(y);
                assert_eq!(
                    b.finish(),
                    compute_v6(s6, d6, 0xC002, 4791, &roce),
                    "{len}/{cut}"
                );
            }
        }
    }

    /// The cache's stream, resumed from a remembered prefix with the
    /// identification folded in, equals the one-buffer computation for
    /// any identification, length and header size, IPv4 and IPv6; the
    /// segments of one shape share one remembered prefix; a header
    /// shorter than a BTH is refused.
    #[test]
    fn the_cached_stream_equals_the_whole_packet() {
        let (s4, d4) = (Ipv4Addr::new(10, 1, 2, 3), Ipv4Addr::new(10, 4, 5, 6));
        let (s6, d6) = (
            Ipv6Addr::LOCALHOST,
            Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 7),
        );
        let mut cache = IcrcCache::new();
        for len in [16usize, 20, 61, 1052, 4124] {
            let roce: Vec<u8> = (0..len).map(|i| (i * 11 + 5) as u8).collect();
            for head_len in [12usize, 28, 32] {
                let Some(covered) = roce.get(..len - ICRC_LEN) else {
                    continue;
                };
                if head_len > covered.len() {
                    continue;
                }
                let (head, payload) = covered.split_at(head_len);
                for id in [0u16, 1, 2, 0x1234, 0xFFFF] {
                    let mut a = cache
                        .stream_v4(s4, d4, id, true, 0xC001, 4791, len, head)
                        .expect("a whole BTH");
                    a.update(payload);
                    assert_eq!(
                        a.finish(),
                        compute_v4(s4, d4, id, true, 0xC001, 4791, &roce),
                        "{len}/{head_len}/{id}"
                    );
                }
                let mut b = cache
                    .stream_v6(s6, d6, 0xC002, 4791, len, head)
                    .expect("a whole BTH");
                b.update(payload);
                assert_eq!(
                    b.finish(),
                    compute_v6(s6, d6, 0xC002, 4791, &roce),
                    "{len}/{head_len}"
                );
            }
        }
        // Per (length, BTH) shape one miss per family: the identifications
        // and header splits of a shape resumed from the remembered state.
        assert!(cache.misses() <= 2 * 5, "{} misses", cache.misses());
        assert!(cache.hits() > cache.misses() * 4, "{} hits", cache.hits());
        assert!(
            cache
                .stream_v4(s4, d4, 0, true, 1, 4791, 16, &[0; 11])
                .is_none()
        );
        assert!(cache.stream_v6(s6, d6, 1, 4791, 16, &[0; 11]).is_none());
    }

    #[test]
    fn seed_is_crc_of_eight_ff() {
        assert_eq!(crc32fast::hash(&[0xFF; 8]), CRC_AFTER_FF8);
        assert_eq!(!CRC_AFTER_FF8, 0xDEBB_20E3);
    }

    #[test]
    fn register_steps_invert_and_match_crc32fast() {
        for s in [0u32, 1, 0x8000_0000, 0xDEAD_BEEF, 0xFFFF_FFFF] {
            assert_eq!(unstep_zero(step(s, 0)), s);
        }
        // zlib crc = !raw(!0, data).
        let data = b"123456789";
        let raw = data.iter().fold(!0u32, |s, &b| step(s, b));
        assert_eq!(!raw, crc32fast::hash(data));
        assert_eq!(!raw, 0xCBF4_3926);
    }

    #[test]
    fn recovers_ident_and_df() {
        let (a, b) = (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2));
        let mut roce = [0u8; 12 + 7 + 1 + 4];
        roce[0] = 0x04;
        roce[1] = 0x10;
        roce[12..19].copy_from_slice(b"payload");
        for (ident, df) in [
            (0, false),
            (0, true),
            (1, true),
            (0xBEEF, false),
            (0xFFFF, true),
        ] {
            fill_v4(a, b, ident, df, 0xC000, 4791, &mut roce).expect("fill");
            assert_eq!(recover_v4_ident(a, b, 0xC000, 4791, &roce), Ok((ident, df)));
        }
        // A wrong address (or port) is not explained by any identification.
        assert!(matches!(
            recover_v4_ident(b, a, 0xC000, 4791, &roce),
            Err(Error::IcrcMismatch { .. })
        ));
        assert!(matches!(
            recover_v4_ident(a, b, 0xC001, 4791, &roce),
            Err(Error::IcrcMismatch { .. })
        ));
        roce[14] ^= 1;
        assert!(matches!(
            recover_v4_ident(a, b, 0xC000, 4791, &roce),
            Err(Error::IcrcMismatch { .. })
        ));
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
