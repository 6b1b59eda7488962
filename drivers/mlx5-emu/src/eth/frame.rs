//! Frames as the port sees them: a tolerant header parser (the NIC parses what it can and
//! steers on it; a malformed IP header just matches no IP field), the `fte_match_param` key a
//! frame presents to the flow table, checksum offloads of raw sends, and the Ethernet + IP +
//! UDP framing of RoCE v2 packets (headers from rnic-roce's wire module).

use std::net::IpAddr;

use rnic_mlx5_prm::{FteMatchParam, eth_cs_flags};
use rnic_roce::wire::{
    EtherType, EthernetAddress, EthernetRepr, Ipv4Repr, Ipv6Repr, ROCE_V2_PORT, UdpRepr, icrc,
};

/// Ethernet header, untagged.
const ETH_HDR: usize = 14;
/// The 802.1Q TPID.
const TPID_8021Q: u16 = 0x8100;
/// IP protocol numbers the parser looks into.
const PROTO_ICMP: u8 = 1;
const PROTO_TCP: u8 = 6;
const PROTO_UDP: u8 = 17;
const PROTO_ICMPV6: u8 = 58;

/// How a destination MAC relates to the function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MacClass {
    /// The function's own unicast address.
    Own,
    /// ff:ff:ff:ff:ff:ff.
    Broadcast,
    /// A group address other than broadcast (IPv4 01:00:5e:…, IPv6 33:33:…).
    Multicast,
    /// Another station's unicast address.
    Other,
}

impl MacClass {
    /// The class of `dmac` for a function whose address is `own`.
    pub(crate) fn of(dmac: &[u8; 6], own: &[u8; 6]) -> MacClass {
        if dmac == &[0xff; 6] {
            MacClass::Broadcast
        } else if dmac[0] & 1 != 0 {
            MacClass::Multicast
        } else if dmac == own {
            MacClass::Own
        } else {
            MacClass::Other
        }
    }
}

/// 14, or 18 for a frame with one 802.1Q tag.
pub(crate) fn l2_header_len(frame: &[u8]) -> usize {
    if be16(frame, 12) == TPID_8021Q && frame.len() >= ETH_HDR + 4 {
        ETH_HDR + 4
    } else {
        ETH_HDR
    }
}

fn be16(b: &[u8], at: usize) -> u16 {
    b.get(at..at + 2)
        .map_or(0, |s| u16::from_be_bytes([s[0], s[1]]))
}

/// An L4 header the parser recognised.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum L4 {
    /// UDP: ports, the header's offset in the frame.
    Udp { sport: u16, dport: u16, at: usize },
    /// TCP: ports, flags (9 bits), the header's offset and its data bytes.
    Tcp {
        sport: u16,
        dport: u16,
        flags: u16,
        at: usize,
        data: usize,
    },
    /// ICMP (IPv4): type, code, the 4 bytes after the checksum.
    Icmp { ty: u8, code: u8, data: u32 },
    /// ICMPv6: type, code, the 4 bytes after the checksum.
    Icmpv6 { ty: u8, code: u8, data: u32 },
}

/// The IP header of a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ip {
    /// 4 or 6.
    pub(crate) version: u8,
    /// Addresses as `fte_match_set_lyr_2_4` holds them: IPv4 in the last 4 bytes.
    pub(crate) src: [u8; 16],
    pub(crate) dst: [u8; 16],
    /// Protocol / the last next header.
    pub(crate) proto: u8,
    pub(crate) ttl: u8,
    /// Traffic class: DSCP << 2 | ECN.
    pub(crate) tos: u8,
    /// A fragment (IPv4 MF or offset, an IPv6 fragment header).
    pub(crate) frag: bool,
    /// IPv4 header checksum correct (IPv6: true).
    pub(crate) csum_ok: bool,
    /// Bytes from the L3 header to the end of the IP packet.
    pub(crate) total: usize,
    pub(crate) l4: Option<L4>,
}

/// What the port's parser found in a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Headers {
    pub(crate) dmac: [u8; 6],
    pub(crate) smac: [u8; 6],
    /// The 802.1Q tag control word.
    pub(crate) vlan: Option<u16>,
    /// The EtherType after the tag.
    pub(crate) ethertype: u16,
    /// Offset of the L3 header.
    pub(crate) l3: usize,
    pub(crate) ip: Option<Ip>,
}

impl Headers {
    /// Parse `frame`; `None` when it is shorter than an Ethernet header.
    pub(crate) fn parse(frame: &[u8]) -> Option<Headers> {
        if frame.len() < ETH_HDR {
            return None;
        }
        let mut dmac = [0u8; 6];
        let mut smac = [0u8; 6];
        dmac.copy_from_slice(&frame[..6]);
        smac.copy_from_slice(&frame[6..12]);
        let l3 = l2_header_len(frame);
        let (vlan, ethertype) = if l3 == ETH_HDR + 4 {
            (Some(be16(frame, 14)), be16(frame, 16))
        } else {
            (None, be16(frame, 12))
        };
        let body = &frame[l3..];
        let ip = match ethertype {
            0x0800 => parse_v4(body, l3),
            0x86dd => parse_v6(body, l3),
            _ => None,
        };
        Some(Headers {
            dmac,
            smac,
            vlan,
            ethertype,
            l3,
            ip,
        })
    }

    /// The offset just past the L3 header and its extension headers (`None` without IP).
    pub(crate) fn l4_start(&self) -> Option<usize> {
        self.ip.and_then(|ip| match ip.l4 {
            Some(L4::Udp { at, .. } | L4::Tcp { at, .. }) => Some(at),
            _ => None,
        })
    }
}

fn l4_of(proto: u8, b: &[u8], at: usize, len: usize) -> Option<L4> {
    let s = b.get(..len)?;
    match proto {
        PROTO_UDP if s.len() >= 8 => Some(L4::Udp {
            sport: be16(s, 0),
            dport: be16(s, 2),
            at,
        }),
        PROTO_TCP if s.len() >= 20 => {
            let hl = usize::from(s[12] >> 4) * 4;
            if hl < 20 || hl > s.len() {
                return None;
            }
            Some(L4::Tcp {
                sport: be16(s, 0),
                dport: be16(s, 2),
                flags: be16(s, 12) & 0x1ff,
                at,
                data: s.len() - hl,
            })
        }
        PROTO_ICMP | PROTO_ICMPV6 if s.len() >= 8 => {
            let data = u32::from_be_bytes([s[4], s[5], s[6], s[7]]);
            Some(if proto == PROTO_ICMP {
                L4::Icmp {
                    ty: s[0],
                    code: s[1],
                    data,
                }
            } else {
                L4::Icmpv6 {
                    ty: s[0],
                    code: s[1],
                    data,
                }
            })
        }
        _ => None,
    }
}

fn parse_v4(b: &[u8], l3: usize) -> Option<Ip> {
    if b.len() < 20 || b[0] >> 4 != 4 {
        return None;
    }
    let ihl = usize::from(b[0] & 0xf) * 4;
    let total = usize::from(be16(b, 2));
    if ihl < 20 || total < ihl || total > b.len() {
        return None;
    }
    let frag_field = be16(b, 6);
    let offset = frag_field & 0x1fff;
    let frag = frag_field & 0x2000 != 0 || offset != 0;
    let mut src = [0u8; 16];
    let mut dst = [0u8; 16];
    src[12..].copy_from_slice(&b[12..16]);
    dst[12..].copy_from_slice(&b[16..20]);
    let proto = b[9];
    let l4 = if offset == 0 {
        l4_of(proto, &b[ihl..], l3 + ihl, total - ihl)
    } else {
        None
    };
    Some(Ip {
        version: 4,
        src,
        dst,
        proto,
        ttl: b[8],
        tos: b[1],
        frag,
        csum_ok: rnic_roce::wire::ip::internet_checksum(&b[..ihl]) == 0,
        total,
        l4,
    })
}

fn parse_v6(b: &[u8], l3: usize) -> Option<Ip> {
    if b.len() < 40 || b[0] >> 4 != 6 {
        return None;
    }
    let total = 40 + usize::from(be16(b, 4));
    if total > b.len() {
        return None;
    }
    let mut src = [0u8; 16];
    let mut dst = [0u8; 16];
    src.copy_from_slice(&b[8..24]);
    dst.copy_from_slice(&b[24..40]);
    let (mut next, mut at, mut frag, mut first) = (b[6], 40usize, false, true);
    // Hop-by-hop, routing, destination options and fragment headers (at most 8).
    for _ in 0..8 {
        match next {
            0 | 43 | 60 => {
                let h = b.get(at..at + 2)?;
                next = h[0];
                at += (usize::from(h[1]) + 1) * 8;
            }
            44 => {
                let h = b.get(at..at + 8)?;
                next = h[0];
                frag = true;
                first = be16(h, 2) & 0xfff8 == 0;
                at += 8;
            }
            _ => break,
        }
    }
    if at > total {
        return None;
    }
    let tc = ((b[0] & 0xf) << 4) | (b[1] >> 4);
    let l4 = if first {
        l4_of(next, &b[at..], l3 + at, total - at)
    } else {
        None
    };
    Some(Ip {
        version: 6,
        src,
        dst,
        proto: next,
        ttl: b[7],
        tos: tc,
        frag,
        csum_ok: true,
        total,
        l4,
    })
}

/// The `fte_match_param` (outer headers and misc set 3) a frame presents to the flow table:
/// every field the port's parser understands, in the layout a group's mask and an entry's
/// value use.
pub(crate) fn match_key(h: &Headers) -> Vec<u8> {
    let mut key = vec![0u8; FteMatchParam::<&[u8]>::SIZE_BYTES];
    let mut p = FteMatchParam::new_unchecked(&mut key[..]);
    {
        let mut o = p.outer_headers_mut();
        let _ = o.set_smac_47_16(u32::from_be_bytes([
            h.smac[0], h.smac[1], h.smac[2], h.smac[3],
        ]));
        let _ = o.set_smac_15_0(u32::from(u16::from_be_bytes([h.smac[4], h.smac[5]])));
        let _ = o.set_dmac_47_16(u32::from_be_bytes([
            h.dmac[0], h.dmac[1], h.dmac[2], h.dmac[3],
        ]));
        let _ = o.set_dmac_15_0(u32::from(u16::from_be_bytes([h.dmac[4], h.dmac[5]])));
        let _ = o.set_ethertype(u32::from(h.ethertype));
        if let Some(tci) = h.vlan {
            let _ = o.set_cvlan_tag(1);
            let _ = o.set_first_prio(u32::from(tci >> 13));
            let _ = o.set_first_cfi(u32::from((tci >> 12) & 1));
            let _ = o.set_first_vid(u32::from(tci & 0xfff));
        }
        if let Some(ip) = h.ip {
            let _ = o.set_ip_version(u32::from(ip.version));
            let _ = o.set_ip_protocol(u32::from(ip.proto));
            let _ = o.set_ip_dscp(u32::from(ip.tos >> 2));
            let _ = o.set_ip_ecn(u32::from(ip.tos & 3));
            let _ = o.set_ttl_hoplimit(u32::from(ip.ttl));
            let _ = o.set_frag(u32::from(ip.frag));
            let _ = o.set_src_ipv4_src_ipv6(&ip.src);
            let _ = o.set_dst_ipv4_dst_ipv6(&ip.dst);
            match ip.l4 {
                Some(L4::Udp { sport, dport, .. }) => {
                    let _ = o.set_udp_sport(u32::from(sport));
                    let _ = o.set_udp_dport(u32::from(dport));
                }
                Some(L4::Tcp {
                    sport,
                    dport,
                    flags,
                    ..
                }) => {
                    let _ = o.set_tcp_sport(u32::from(sport));
                    let _ = o.set_tcp_dport(u32::from(dport));
                    let _ = o.set_tcp_flags(u32::from(flags));
                }
                _ => {}
            }
        }
    }
    if let Some(ip) = h.ip {
        let mut m = p.misc_parameters_3_mut();
        match ip.l4 {
            Some(L4::Icmp { ty, code, data }) => {
                let _ = m.set_icmp_type(u32::from(ty));
                let _ = m.set_icmp_code(u32::from(code));
                let _ = m.set_icmp_header_data(data);
            }
            Some(L4::Icmpv6 { ty, code, data }) => {
                let _ = m.set_icmpv6_type(u32::from(ty));
                let _ = m.set_icmpv6_code(u32::from(code));
                let _ = m.set_icmpv6_header_data(data);
            }
            _ => {}
        }
    }
    key
}

/// One's-complement sum of `data` added to `sum` (not folded).
fn sum16(mut sum: u32, data: &[u8]) -> u32 {
    let mut words = data.chunks_exact(2);
    for w in &mut words {
        sum += u32::from(u16::from_be_bytes([w[0], w[1]]));
    }
    if let &[last] = words.remainder() {
        sum += u32::from(last) << 8;
    }
    sum
}

fn fold(mut sum: u32) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// The pseudo-header sum of an L4 segment of `len` bytes of protocol `proto` in `ip`.
fn pseudo(ip: &Ip, len: usize) -> u32 {
    let (s, d) = if ip.version == 4 {
        (&ip.src[12..], &ip.dst[12..])
    } else {
        (&ip.src[..], &ip.dst[..])
    };
    let mut sum = sum16(sum16(0, s), d);
    sum += u32::from(ip.proto);
    sum += (len as u32) >> 16;
    sum += (len as u32) & 0xffff;
    sum
}

/// Whether the TCP/UDP checksum of `frame` (parsed as `h`) verifies (an IPv4 UDP checksum
/// of 0 means "none" and verifies); `false` without a TCP/UDP header.
pub(crate) fn l4_checksum_ok(frame: &[u8], h: &Headers) -> bool {
    let Some(ip) = h.ip else { return false };
    let Some(at) = h.l4_start() else { return false };
    let end = h.l3 + ip.total;
    let Some(seg) = frame.get(at..end) else {
        return false;
    };
    if matches!(ip.l4, Some(L4::Udp { .. })) && ip.version == 4 && be16(seg, 6) == 0 {
        return true;
    }
    fold(sum16(pseudo(&ip, seg.len()), seg)) == 0xffff
}

/// Apply a raw send's checksum offloads (`wqe_eth_seg.cs_flags`) to `frame`: the IPv4 header
/// checksum (L3) and the TCP/UDP checksum (L4) of the outer headers. Flags for headers the
/// frame does not have change nothing.
pub(crate) fn fill_checksums(frame: &mut [u8], cs_flags: u32) {
    let Some(h) = Headers::parse(frame) else {
        return;
    };
    let Some(ip) = h.ip else { return };
    if cs_flags & eth_cs_flags::L3_CSUM != 0 && ip.version == 4 {
        let ihl = usize::from(frame[h.l3] & 0xf) * 4;
        frame[h.l3 + 10..h.l3 + 12].fill(0);
        let c = !fold(sum16(0, &frame[h.l3..h.l3 + ihl]));
        frame[h.l3 + 10..h.l3 + 12].copy_from_slice(&c.to_be_bytes());
    }
    if cs_flags & eth_cs_flags::L4_CSUM != 0 {
        let Some(at) = h.l4_start() else { return };
        let end = h.l3 + ip.total;
        let field = match ip.l4 {
            Some(L4::Udp { .. }) => at + 6,
            Some(L4::Tcp { .. }) => at + 16,
            _ => return,
        };
        frame[field..field + 2].fill(0);
        let mut c = !fold(sum16(pseudo(&ip, end - at), &frame[at..end]));
        if c == 0 && matches!(ip.l4, Some(L4::Udp { .. })) {
            c = 0xffff;
        }
        frame[field..field + 2].copy_from_slice(&c.to_be_bytes());
    }
}

/// The RoCE v2 frame of `roce` (BTH..ICRC) from `src` to `dst` (same family): Ethernet
/// header (`smac` → `dmac`), IPv4 (DF, identification 0, TTL = `hop_limit`, TOS = `tclass`)
/// or IPv6 (`tclass`, `flow_label`, `hop_limit`), UDP `sport` → 4791, the packet, its ICRC
/// filled. The UDP checksum is 0 over IPv4 (as RoCE v2 sends it) and computed over IPv6,
/// where a zero checksum is refused by ordinary UDP receivers. Written into `buf`; `false`
/// when the addresses mix families or the packet is too long.
#[allow(clippy::too_many_arguments)]
pub(crate) fn build_roce_frame(
    buf: &mut Vec<u8>,
    (smac, dmac): ([u8; 6], [u8; 6]),
    (src, dst): (IpAddr, IpAddr),
    tclass: u8,
    flow_label: u32,
    hop_limit: u8,
    sport: u16,
    roce: &[u8],
) -> bool {
    let udp_len = 8 + roce.len();
    let (ip_hdr, ethertype) = match (src, dst) {
        (IpAddr::V4(_), IpAddr::V4(_)) => (20, EtherType::IPV4),
        (IpAddr::V6(_), IpAddr::V6(_)) => (40, EtherType::IPV6),
        _ => return false,
    };
    let total = ETH_HDR + ip_hdr + udp_len;
    buf.clear();
    buf.resize(total, 0);
    let eth = EthernetRepr {
        dst_addr: EthernetAddress(dmac),
        src_addr: EthernetAddress(smac),
        vlan: None,
        ethertype,
    };
    if eth.emit(&mut buf[..ETH_HDR]).is_err() {
        return false;
    }
    let ip_part = &mut buf[ETH_HDR..];
    let emitted = match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => Ipv4Repr {
            src_addr: s,
            dst_addr: d,
            tos: tclass,
            ident: 0,
            dont_frag: true,
            ttl: hop_limit,
            protocol: PROTO_UDP,
            payload_len: udp_len,
        }
        .emit(ip_part),
        (IpAddr::V6(s), IpAddr::V6(d)) => Ipv6Repr {
            src_addr: s,
            dst_addr: d,
            traffic_class: tclass,
            flow_label: flow_label & 0xf_ffff,
            next_header: PROTO_UDP,
            hop_limit,
            payload_len: udp_len,
        }
        .emit(ip_part),
        _ => return false,
    };
    let udp = UdpRepr {
        src_port: sport,
        dst_port: ROCE_V2_PORT,
        checksum: 0,
        payload_len: roce.len(),
    };
    if emitted.is_err() || udp.emit(&mut ip_part[ip_hdr..ip_hdr + 8]).is_err() {
        return false;
    }
    ip_part[ip_hdr + 8..].copy_from_slice(roce);
    if icrc::fill(ip_part).is_err() {
        return false;
    }
    if ip_hdr == 40 {
        // The ICRC masks the UDP checksum: filling it now leaves the ICRC valid.
        fill_checksums(buf, eth_cs_flags::L4_CSUM);
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    /// A Linux ARP request for 10.0.0.2 from 10.0.0.1 (52:54:00:12:34:56), unpadded.
    const ARP: [u8; 42] = [
        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x08, 0x06, 0x00,
        0x01, 0x08, 0x00, 0x06, 0x04, 0x00, 0x01, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 10, 0, 0, 1,
        0, 0, 0, 0, 0, 0, 10, 0, 0, 2,
    ];

    fn ipv6_ns() -> Vec<u8> {
        // IPv6 neighbour solicitation for fe80::2 from fe80::1 to ff02::1:ff00:2.
        let mut f = vec![
            0x33, 0x33, 0xff, 0x00, 0x00, 0x02, 0x52, 0x54, 0, 0x12, 0x34, 0x56,
        ];
        f.extend_from_slice(&[0x86, 0xdd]);
        let src: Ipv6Addr = "fe80::1".parse().unwrap();
        let dst: Ipv6Addr = "ff02::1:ff00:2".parse().unwrap();
        let mut icmp = vec![135, 0, 0, 0, 0, 0, 0, 0];
        icmp.extend_from_slice(&"fe80::2".parse::<Ipv6Addr>().unwrap().octets());
        f.extend_from_slice(&[0x60, 0, 0, 0]);
        f.extend_from_slice(&(icmp.len() as u16).to_be_bytes());
        f.extend_from_slice(&[58, 255]);
        f.extend_from_slice(&src.octets());
        f.extend_from_slice(&dst.octets());
        f.extend_from_slice(&icmp);
        f
    }

    #[test]
    fn arp_and_nd_parse_into_their_match_keys() {
        let h = Headers::parse(&ARP).unwrap();
        assert_eq!(h.ethertype, 0x0806);
        assert_eq!(
            MacClass::of(&h.dmac, &[2, 0, 0, 0, 0, 1]),
            MacClass::Broadcast
        );
        assert!(h.ip.is_none());
        let key = match_key(&h);
        let k = FteMatchParam::new_unchecked(&key[..]);
        assert_eq!(k.outer_headers().ethertype(), 0x0806);
        assert_eq!(k.outer_headers().dmac_47_16(), 0xffff_ffff);
        assert_eq!(k.outer_headers().ip_version(), 0);

        let ns = ipv6_ns();
        let h = Headers::parse(&ns).unwrap();
        assert_eq!(
            MacClass::of(&h.dmac, &[2, 0, 0, 0, 0, 1]),
            MacClass::Multicast
        );
        let ip = h.ip.unwrap();
        assert_eq!((ip.version, ip.proto, ip.ttl), (6, 58, 255));
        assert_eq!(
            ip.l4,
            Some(L4::Icmpv6 {
                ty: 135,
                code: 0,
                data: 0
            })
        );
        let key = match_key(&h);
        let k = FteMatchParam::new_unchecked(&key[..]);
        assert_eq!(k.outer_headers().ip_protocol(), 58);
        assert_eq!(k.misc_parameters_3().icmpv6_type(), 135);
        assert_eq!(k.outer_headers().dmac_47_16(), 0x3333_ff00);
        // Truncated: no IP, still an Ethernet frame; shorter than 14: nothing.
        assert!(Headers::parse(&ns[..60]).unwrap().ip.is_none());
        assert!(Headers::parse(&ns[..13]).is_none());
    }

    #[test]
    fn roce_frames_carry_a_valid_icrc_and_checksums() {
        let roce = {
            let mut p = vec![0u8; 12 + 4];
            p[0] = 0x04; // RC SEND ONLY
            p
        };
        let mut buf = Vec::new();
        let (s4, d4) = (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2));
        assert!(build_roce_frame(
            &mut buf,
            ([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]),
            (IpAddr::V4(s4), IpAddr::V4(d4)),
            0,
            0,
            64,
            0xc001,
            &roce
        ));
        let f = rnic_roce::wire::Frame::parse(&buf).unwrap();
        f.datagram.verify_icrc().unwrap();
        assert_eq!(buf.len(), 14 + 20 + 8 + 16);
        let (s6, d6): (Ipv6Addr, Ipv6Addr) =
            ("fd00::1".parse().unwrap(), "fd00::2".parse().unwrap());
        assert!(build_roce_frame(
            &mut buf,
            ([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]),
            (IpAddr::V6(s6), IpAddr::V6(d6)),
            0x10,
            0x12345,
            64,
            0xc001,
            &roce
        ));
        let f = rnic_roce::wire::Frame::parse(&buf).unwrap();
        f.datagram.verify_icrc().unwrap();
        let h = Headers::parse(&buf).unwrap();
        assert!(l4_checksum_ok(&buf, &h), "IPv6 UDP checksum filled");
        assert!(!build_roce_frame(
            &mut buf,
            ([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]),
            (IpAddr::V4(s4), IpAddr::V6(d6)),
            0,
            0,
            64,
            1,
            &roce
        ));
    }

    #[test]
    fn checksum_offloads_fill_what_the_frame_has() {
        let mut buf = Vec::new();
        let roce = vec![0u8; 16];
        build_roce_frame(
            &mut buf,
            ([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]),
            (
                IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
                IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)),
            ),
            0,
            0,
            64,
            7,
            &roce,
        );
        // Break the IPv4 checksum and fill it back; put a UDP checksum in.
        buf[14 + 10] ^= 0xff;
        assert!(!Headers::parse(&buf).unwrap().ip.unwrap().csum_ok);
        fill_checksums(&mut buf, eth_cs_flags::L3_CSUM | eth_cs_flags::L4_CSUM);
        let h = Headers::parse(&buf).unwrap();
        assert!(h.ip.unwrap().csum_ok);
        assert_ne!(be16(&buf, 14 + 20 + 6), 0);
        assert!(l4_checksum_ok(&buf, &h));
        buf[50] ^= 1;
        assert!(!l4_checksum_ok(&buf, &Headers::parse(&buf).unwrap()));
        // ARP: nothing to fill, nothing changes.
        let mut arp = ARP;
        fill_checksums(&mut arp, 0xff);
        assert_eq!(arp, ARP);
    }
}
