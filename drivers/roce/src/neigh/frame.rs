//! The frames the engine sends, built whole (Ethernet header, optional
//! 802.1Q tag, ARP or IPv6 + ICMPv6), and the dissection of a received
//! frame down to an ARP packet or a neighbour discovery message.

use core::fmt;
use core::ops::Deref;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::Malformed;
use crate::wire::icmpv6::{self, AdvertFlags, Message, NdRepr};
use crate::wire::ip::PROTOCOL_ICMPV6;
use crate::wire::{
    Error, EtherType, EthernetAddress, EthernetRepr, Ipv6Packet, Ipv6Repr, NdViolation, VlanTag,
    arp, ethernet,
};

/// The longest frame the engine builds: a tagged Ethernet header, an IPv6
/// header and an advertisement with its link-layer address option.
pub const MAX_FRAME_LEN: usize =
    ethernet::TAGGED_HEADER_LEN + 40 + icmpv6::ND_LEN + icmpv6::LLADDR_OPTION_LEN;

/// The least payload after the Ethernet header (60-byte frames untagged,
/// 64 tagged, FCS excluded); shorter frames are padded with zeros so they
/// are valid on any link, including one whose sender does not pad.
const MIN_PAYLOAD: usize = 46;

/// A complete Ethernet frame to transmit (no FCS), ready to post as-is on
/// a raw Ethernet send queue. Inline, so queuing one allocates nothing.
#[derive(Clone, PartialEq, Eq)]
pub struct Frame {
    bytes: [u8; MAX_FRAME_LEN],
    len: usize,
}

impl Frame {
    /// The frame's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        self.bytes.get(..self.len).unwrap_or(&self.bytes)
    }
}

impl Deref for Frame {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl fmt::Debug for Frame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Frame({} bytes:", self.len)?;
        for b in self.as_bytes() {
            write!(f, " {b:02x}")?;
        }
        f.write_str(")")
    }
}

/// Build a frame: the Ethernet header, then `body` writes the payload into
/// the slice it is given and returns its length.
fn build(
    dst: EthernetAddress,
    src: EthernetAddress,
    vlan: Option<VlanTag>,
    ethertype: EtherType,
    body: impl FnOnce(&mut [u8]) -> Result<usize, Error>,
) -> Result<Frame, Error> {
    let mut frame = Frame {
        bytes: [0; MAX_FRAME_LEN],
        len: 0,
    };
    let eth = EthernetRepr {
        dst_addr: dst,
        src_addr: src,
        vlan,
        ethertype,
    };
    eth.emit(&mut frame.bytes)?;
    let hdr = eth.buffer_len();
    let payload = frame.bytes.get_mut(hdr..).unwrap_or(&mut []);
    let n = body(payload)?;
    frame.len = hdr + n.max(MIN_PAYLOAD);
    Ok(frame)
}

/// An ARP packet `repr` from `src` to `dst`.
pub(super) fn arp(
    dst: EthernetAddress,
    src: EthernetAddress,
    vlan: Option<VlanTag>,
    repr: &arp::Repr,
) -> Result<Frame, Error> {
    build(dst, src, vlan, EtherType::ARP, |b| {
        repr.emit(b).map(|()| arp::PACKET_LEN)
    })
}

/// A neighbour discovery message `nd` from `ip_src` to `ip_dst` (hop limit
/// 255, checksum filled), to the MAC `dst`.
pub(super) fn nd(
    dst: EthernetAddress,
    src: EthernetAddress,
    vlan: Option<VlanTag>,
    ip_src: Ipv6Addr,
    ip_dst: Ipv6Addr,
    nd: &NdRepr,
) -> Result<Frame, Error> {
    build(dst, src, vlan, EtherType::IPV6, |b| {
        let ip = Ipv6Repr {
            src_addr: ip_src,
            dst_addr: ip_dst,
            traffic_class: 0,
            flow_label: 0,
            next_header: PROTOCOL_ICMPV6,
            hop_limit: icmpv6::ND_HOP_LIMIT,
            payload_len: nd.buffer_len(),
        };
        ip.emit(b)?;
        let msg = b.get_mut(40..).unwrap_or(&mut []);
        let n = nd.emit(ip_src, ip_dst, msg)?;
        Ok(40 + n)
    })
}

/// The solicitation that resolves `target`: an ARP request (broadcast, or
/// unicast to `known` when probing a cached MAC) or a Neighbor Solicitation
/// (to the target's solicited-node address, or unicast to it when probing).
pub(super) fn solicitation(
    vlan: Option<VlanTag>,
    own: (IpAddr, EthernetAddress),
    target: IpAddr,
    known: Option<EthernetAddress>,
) -> Result<Frame, Error> {
    let (own_ip, own_mac) = own;
    match (own_ip, target) {
        (IpAddr::V4(spa), IpAddr::V4(tpa)) => arp(
            known.unwrap_or(EthernetAddress::BROADCAST),
            own_mac,
            vlan,
            &arp::Repr::request(own_mac, spa, tpa),
        ),
        (IpAddr::V6(src), IpAddr::V6(tgt)) => {
            let (mac, dst) = match known {
                Some(mac) => (mac, tgt),
                None => {
                    let group = icmpv6::solicited_node(tgt);
                    (EthernetAddress::from_ipv6_multicast(group), group)
                }
            };
            let ns = NdRepr::Solicit {
                target: tgt,
                lladdr: Some(own_mac),
            };
            nd(mac, own_mac, vlan, src, dst, &ns)
        }
        // The engine picks a source of the target's family; a mix is refused.
        (own, target) => Err(Error::IpVersion {
            expected: if target.is_ipv4() { 4 } else { 6 },
            found: if own.is_ipv4() { 4 } else { 6 },
        }),
    }
}

/// An announcement that `mac` has `ip`: a gratuitous ARP request
/// (broadcast) or an unsolicited advertisement with the Override flag to
/// all nodes (RFC 4861 §7.2.6).
pub(super) fn announcement(
    vlan: Option<VlanTag>,
    ip: IpAddr,
    mac: EthernetAddress,
) -> Result<Frame, Error> {
    match ip {
        IpAddr::V4(v4) => arp(
            EthernetAddress::BROADCAST,
            mac,
            vlan,
            &arp::Repr::gratuitous(mac, v4),
        ),
        IpAddr::V6(v6) => {
            let na = NdRepr::Advert {
                flags: AdvertFlags {
                    router: false,
                    solicited: false,
                    override_: true,
                },
                target: v6,
                lladdr: Some(mac),
            };
            let all = EthernetAddress::from_ipv6_multicast(icmpv6::ALL_NODES);
            nd(all, mac, vlan, v6, icmpv6::ALL_NODES, &na)
        }
    }
}

/// What a received frame carries, once its Ethernet header is accepted.
#[derive(Debug, Clone, Copy)]
pub(super) enum Payload {
    /// An Ethernet/IPv4 ARP request or reply.
    Arp(arp::Repr),
    /// A neighbour solicitation or advertisement and its IPv6 header.
    Nd(Ipv6Repr, NdRepr),
    /// A valid router solicitation, advertisement or redirect.
    Router,
    /// Anything else well-formed (another EtherType, IPv6 that is not
    /// ICMPv6, ICMPv6 that is not neighbour discovery).
    Other,
}

/// Dissect the payload after an accepted Ethernet header.
pub(super) fn dissect(ethertype: EtherType, payload: &[u8]) -> Result<Payload, Malformed> {
    if ethertype == EtherType::ARP {
        let repr =
            arp::Repr::parse(&arp::Packet::new_unchecked(payload)).map_err(Malformed::from)?;
        let spa = repr.source_protocol_addr;
        if !repr.source_hardware_addr.is_unicast() || bad_ipv4_source(spa) {
            return Err(Malformed::ArpAddress);
        }
        return Ok(Payload::Arp(repr));
    }
    if ethertype != EtherType::IPV6 {
        return Ok(Payload::Other);
    }
    let packet = Ipv6Packet::new_checked(payload).map_err(Malformed::from)?;
    let ip = Ipv6Repr::parse(&packet).map_err(Malformed::from)?;
    if ip.next_header != PROTOCOL_ICMPV6 {
        return Ok(Payload::Other);
    }
    if ip.src_addr.is_multicast() {
        return Err(Malformed::Ipv6Header);
    }
    let msg = icmpv6::Packet::new_checked(packet.payload()).map_err(Malformed::from)?;
    match Message::parse(&ip, &msg).map_err(Malformed::from)? {
        Message::Nd(nd) => {
            if nd.lladdr().is_some_and(|m| !m.is_unicast()) {
                return Err(Malformed::NdLinkLayerAddress);
            }
            Ok(Payload::Nd(ip, nd))
        }
        Message::RouterSolicit | Message::RouterAdvert | Message::Redirect => Ok(Payload::Router),
        Message::Other { .. } => Ok(Payload::Other),
    }
}

/// A sender protocol address no host can have: multicast, limited
/// broadcast, loopback (0.0.0.0 is allowed: an RFC 5227 probe).
fn bad_ipv4_source(a: Ipv4Addr) -> bool {
    a.is_multicast() || a.is_broadcast() || a.is_loopback()
}

impl From<Error> for Malformed {
    fn from(e: Error) -> Malformed {
        match e {
            Error::ArpFormat { .. } => Malformed::ArpFormat,
            Error::ArpOperation(_) => Malformed::ArpOperation,
            Error::IpVersion { .. } => Malformed::Ipv6Header,
            Error::Icmpv6Checksum { .. } => Malformed::Icmpv6Checksum,
            Error::Nd(NdViolation::HopLimit(h)) => Malformed::NdHopLimit(h),
            Error::Nd(v) => Malformed::Nd(v),
            // Truncated, BadLength: the bytes end before a header or length says.
            _ => Malformed::Truncated,
        }
    }
}
