//! Ethernet II header with an optional single 802.1Q VLAN tag.
//!
//! The frame check sequence is not part of the view: capture tools and
//! sockets hand frames over without it.

use core::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

use super::bytes::{self, read_bytes, read_u16, write_bytes, write_u16};
use super::{Error, Header, Result};

/// Untagged header length.
pub const HEADER_LEN: usize = 14;
/// Header length with one 802.1Q tag.
pub const TAGGED_HEADER_LEN: usize = 18;

mod field {
    use super::bytes::Field;

    pub const DST: Field = 0..6;
    pub const SRC: Field = 6..12;
    /// EtherType, or the 802.1Q TPID when tagged.
    pub const TYPE: Field = 12..14;
    pub const TCI: Field = 14..16;
    pub const INNER_TYPE: Field = 16..18;
}

/// A 48-bit MAC address.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct EthernetAddress(pub [u8; 6]);

impl EthernetAddress {
    /// The broadcast address.
    pub const BROADCAST: EthernetAddress = EthernetAddress([0xff; 6]);

    /// Whether this is a group address (the I/G bit, bit 0 of the first
    /// octet, is set): broadcast and multicast.
    pub const fn is_multicast(&self) -> bool {
        self.0[0] & 1 != 0
    }

    /// Whether this is the broadcast address.
    pub fn is_broadcast(&self) -> bool {
        *self == Self::BROADCAST
    }

    /// Whether this is an individual (unicast) address other than all zeros:
    /// one a station may use as its own.
    pub fn is_unicast(&self) -> bool {
        !self.is_multicast() && self.0 != [0; 6]
    }

    /// The multicast MAC an IPv4 group address maps to (RFC 1112 §6.4):
    /// 01:00:5e followed by the group's low 23 bits.
    pub const fn from_ipv4_multicast(group: Ipv4Addr) -> EthernetAddress {
        let [_, b, c, d] = group.octets();
        EthernetAddress([0x01, 0x00, 0x5e, b & 0x7f, c, d])
    }

    /// The multicast MAC an IPv6 multicast address maps to (RFC 2464 §7):
    /// 33:33 followed by its last four octets.
    pub const fn from_ipv6_multicast(group: Ipv6Addr) -> EthernetAddress {
        let o = group.octets();
        EthernetAddress([0x33, 0x33, o[12], o[13], o[14], o[15]])
    }
}

impl fmt::Display for EthernetAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

impl fmt::Debug for EthernetAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EthernetAddress({self})")
    }
}

/// An EtherType, with the values RoCE cares about named.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EtherType(pub u16);

impl EtherType {
    /// IPv4.
    pub const IPV4: EtherType = EtherType(0x0800);
    /// IPv6.
    pub const IPV6: EtherType = EtherType(0x86DD);
    /// 802.1Q VLAN tag (TPID).
    pub const VLAN: EtherType = EtherType(0x8100);
    /// RoCEv1 (IB GRH follows; recognised, not parsed).
    pub const ROCE_V1: EtherType = EtherType(0x8915);
    /// ARP.
    pub const ARP: EtherType = EtherType(0x0806);
}

/// An 802.1Q tag control word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct VlanTag {
    /// Priority code point (3 bits).
    pub pcp: u8,
    /// Drop eligible indicator.
    pub dei: bool,
    /// VLAN identifier (12 bits).
    pub vid: u16,
}

impl VlanTag {
    /// Decode a TCI.
    pub const fn from_tci(tci: u16) -> VlanTag {
        // PCP is the top 3 bits.
        VlanTag {
            pcp: (tci >> 13) as u8,
            dei: tci & 0x1000 != 0,
            vid: tci & 0x0FFF,
        }
    }

    /// Encode to a TCI (out-of-range bits are masked).
    pub const fn tci(self) -> u16 {
        ((self.pcp as u16 & 7) << 13) | ((self.dei as u16) << 12) | (self.vid & 0x0FFF)
    }
}

/// A read/write view of an Ethernet frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wrap a buffer without checking it (accessors never panic).
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wrap a buffer, checking it holds the header (and tag, if any).
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let p = Packet::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Check that the buffer holds the header, including an 802.1Q tag when
    /// the first EtherType is 0x8100.
    pub fn check_len(&self) -> Result<()> {
        let have = self.buffer.as_ref().len();
        bytes::need(Header::Ethernet, HEADER_LEN, have)?;
        bytes::need(Header::Ethernet, self.header_len(), have)
    }

    /// Unwrap the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Destination MAC.
    pub fn dst_addr(&self) -> EthernetAddress {
        EthernetAddress(read_bytes(self.buffer.as_ref(), field::DST))
    }

    /// Source MAC.
    pub fn src_addr(&self) -> EthernetAddress {
        EthernetAddress(read_bytes(self.buffer.as_ref(), field::SRC))
    }

    /// The EtherType at bytes 12..14 (0x8100 when tagged).
    pub fn outer_ethertype(&self) -> EtherType {
        EtherType(read_u16(self.buffer.as_ref(), field::TYPE))
    }

    /// Whether the frame carries an 802.1Q tag.
    pub fn is_tagged(&self) -> bool {
        self.outer_ethertype() == EtherType::VLAN
    }

    /// The 802.1Q tag, if any.
    pub fn vlan(&self) -> Option<VlanTag> {
        self.is_tagged()
            .then(|| VlanTag::from_tci(read_u16(self.buffer.as_ref(), field::TCI)))
    }

    /// The EtherType of the payload (after the tag, if any).
    pub fn ethertype(&self) -> EtherType {
        if self.is_tagged() {
            EtherType(read_u16(self.buffer.as_ref(), field::INNER_TYPE))
        } else {
            self.outer_ethertype()
        }
    }

    /// 14, or 18 with a tag.
    pub fn header_len(&self) -> usize {
        if self.is_tagged() {
            TAGGED_HEADER_LEN
        } else {
            HEADER_LEN
        }
    }

    /// Everything after the header.
    pub fn payload(&self) -> &[u8] {
        self.buffer.as_ref().get(self.header_len()..).unwrap_or(&[])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set the destination MAC.
    pub fn set_dst_addr(&mut self, value: EthernetAddress) {
        write_bytes(self.buffer.as_mut(), field::DST, value.0);
    }

    /// Set the source MAC.
    pub fn set_src_addr(&mut self, value: EthernetAddress) {
        write_bytes(self.buffer.as_mut(), field::SRC, value.0);
    }

    /// Write the type field(s): the EtherType directly, or TPID + TCI + EtherType.
    pub fn set_vlan_and_ethertype(&mut self, vlan: Option<VlanTag>, ethertype: EtherType) {
        let b = self.buffer.as_mut();
        match vlan {
            Some(tag) => {
                write_u16(b, field::TYPE, EtherType::VLAN.0);
                write_u16(b, field::TCI, tag.tci());
                write_u16(b, field::INNER_TYPE, ethertype.0);
            }
            None => write_u16(b, field::TYPE, ethertype.0),
        }
    }

    /// Everything after the header, writable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let start = self.header_len();
        self.buffer.as_mut().get_mut(start..).unwrap_or(&mut [])
    }
}

/// A parsed Ethernet header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Destination MAC.
    pub dst_addr: EthernetAddress,
    /// Source MAC.
    pub src_addr: EthernetAddress,
    /// The 802.1Q tag, if any.
    pub vlan: Option<VlanTag>,
    /// The payload's EtherType.
    pub ethertype: EtherType,
}

impl Repr {
    /// Parse a header.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            dst_addr: packet.dst_addr(),
            src_addr: packet.src_addr(),
            vlan: packet.vlan(),
            ethertype: packet.ethertype(),
        })
    }

    /// 14, or 18 with a tag.
    pub const fn buffer_len(&self) -> usize {
        if self.vlan.is_some() {
            TAGGED_HEADER_LEN
        } else {
            HEADER_LEN
        }
    }

    /// Write the header into the start of `buffer`.
    pub fn emit(&self, buffer: &mut [u8]) -> Result<()> {
        let need = self.buffer_len();
        if buffer.len() < need {
            return Err(Error::BufferTooSmall {
                need,
                have: buffer.len(),
            });
        }
        let mut p = Packet::new_unchecked(buffer);
        p.set_dst_addr(self.dst_addr);
        p.set_src_addr(self.src_addr);
        p.set_vlan_and_ethertype(self.vlan, self.ethertype);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Ethernet header of capture packet 1 (52:54:00:00:00:02 → 52:54:00:00:00:01, IPv4).
    const CAPTURE: [u8; 14] = [
        0x52, 0x54, 0, 0, 0, 0x01, 0x52, 0x54, 0, 0, 0, 0x02, 0x08, 0x00,
    ];
    /// Hand-built tagged header: PCP 3, DEI 0, VID 100, IPv6.
    const TAGGED: [u8; 18] = [
        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 2, 0, 0, 0, 0, 1, 0x81, 0x00, 0x60, 0x64, 0x86, 0xdd,
    ];

    #[test]
    fn capture_header() {
        let p = Packet::new_checked(&CAPTURE[..]).expect("check");
        let r = Repr::parse(&p).expect("parse");
        assert_eq!(r.dst_addr.to_string(), "52:54:00:00:00:01");
        assert_eq!(r.src_addr, EthernetAddress([0x52, 0x54, 0, 0, 0, 2]));
        assert_eq!((r.vlan, r.ethertype), (None, EtherType::IPV4));
        let mut out = [0u8; 14];
        r.emit(&mut out).expect("emit");
        assert_eq!(out, CAPTURE);
    }

    #[test]
    fn tagged_header() {
        let p = Packet::new_checked(&TAGGED[..]).expect("check");
        assert_eq!(p.header_len(), 18);
        let r = Repr::parse(&p).expect("parse");
        assert_eq!(
            r.vlan,
            Some(VlanTag {
                pcp: 3,
                dei: false,
                vid: 100
            })
        );
        assert_eq!(r.ethertype, EtherType::IPV6);
        assert_eq!(r.dst_addr, EthernetAddress::BROADCAST);
        let mut out = [0u8; 18];
        r.emit(&mut out).expect("emit");
        assert_eq!(out, TAGGED);
        assert_eq!(
            Packet::new_checked(&TAGGED[..17]),
            Err(Error::Truncated {
                header: Header::Ethernet,
                need: 18,
                have: 17
            })
        );
        assert_eq!(
            r.emit(&mut [0u8; 17]),
            Err(Error::BufferTooSmall { need: 18, have: 17 })
        );
    }

    proptest! {
        #[test]
        fn repr_round_trips(d in any::<[u8; 6]>(), s in any::<[u8; 6]>(), tag in proptest::option::of((0u8..8, any::<bool>(), 0u16..4096)),
                            et in any::<u16>().prop_filter("not a TPID", |&t| t != 0x8100)) {
            let repr = Repr {
                dst_addr: EthernetAddress(d), src_addr: EthernetAddress(s),
                vlan: tag.map(|(pcp, dei, vid)| VlanTag { pcp, dei, vid }), ethertype: EtherType(et),
            };
            let mut buf = [0u8; 18];
            repr.emit(&mut buf).expect("emit");
            prop_assert_eq!(Repr::parse(&Packet::new_checked(&buf[..repr.buffer_len()]).expect("check")), Ok(repr));
        }
    }
}
