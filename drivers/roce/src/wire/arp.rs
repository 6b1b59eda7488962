//! ARP for Ethernet and IPv4 (RFC 826): the 28-byte packet after an Ethernet
//! header of EtherType 0x0806.
//!
//! Only the Ethernet/IPv4 combination is spoken (hardware type 1, protocol
//! 0x0800, address lengths 6 and 4); [`Repr::parse`] rejects every other
//! one, and any operation but request and reply (RARP and InARP included),
//! with a typed error. Bytes after the 28 (Ethernet padding) are ignored.

use std::net::Ipv4Addr;

use super::bytes::{self, read_bytes, read_u8, read_u16, write_bytes, write_u8, write_u16};
use super::{Error, EtherType, EthernetAddress, Header, Result};

/// Length of an Ethernet/IPv4 ARP packet.
pub const PACKET_LEN: usize = 28;

/// ARP hardware type of Ethernet.
pub const HTYPE_ETHERNET: u16 = 1;

mod field {
    use super::bytes::Field;

    pub const HTYPE: Field = 0..2;
    pub const PTYPE: Field = 2..4;
    pub const HLEN: usize = 4;
    pub const PLEN: usize = 5;
    pub const OPER: Field = 6..8;
    pub const SHA: Field = 8..14;
    pub const SPA: Field = 14..18;
    pub const THA: Field = 18..24;
    pub const TPA: Field = 24..28;
}

/// An ARP operation code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// 1: who has the target protocol address?
    Request,
    /// 2: the sender has the sender protocol address.
    Reply,
    /// Anything else (RARP 3/4, InARP 8/9, …).
    Unknown(u16),
}

impl From<u16> for Operation {
    fn from(v: u16) -> Operation {
        match v {
            1 => Operation::Request,
            2 => Operation::Reply,
            other => Operation::Unknown(other),
        }
    }
}

impl From<Operation> for u16 {
    fn from(op: Operation) -> u16 {
        match op {
            Operation::Request => 1,
            Operation::Reply => 2,
            Operation::Unknown(v) => v,
        }
    }
}

/// A read/write view of an ARP packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wrap a buffer without checking it (accessors never panic).
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wrap a buffer, checking it holds 28 bytes.
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let p = Packet::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Check that the buffer holds an Ethernet/IPv4-sized packet (28 bytes).
    pub fn check_len(&self) -> Result<()> {
        bytes::need(Header::Arp, PACKET_LEN, self.buffer.as_ref().len())
    }

    /// Unwrap the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// Hardware type (1 = Ethernet).
    pub fn hardware_type(&self) -> u16 {
        read_u16(self.b(), field::HTYPE)
    }

    /// Protocol type (an EtherType; 0x0800 = IPv4).
    pub fn protocol_type(&self) -> EtherType {
        EtherType(read_u16(self.b(), field::PTYPE))
    }

    /// Hardware address length.
    pub fn hardware_len(&self) -> u8 {
        read_u8(self.b(), field::HLEN)
    }

    /// Protocol address length.
    pub fn protocol_len(&self) -> u8 {
        read_u8(self.b(), field::PLEN)
    }

    /// Operation.
    pub fn operation(&self) -> Operation {
        Operation::from(read_u16(self.b(), field::OPER))
    }

    /// Sender hardware address.
    pub fn source_hardware_addr(&self) -> EthernetAddress {
        EthernetAddress(read_bytes(self.b(), field::SHA))
    }

    /// Sender protocol address.
    pub fn source_protocol_addr(&self) -> Ipv4Addr {
        Ipv4Addr::from(read_bytes::<4>(self.b(), field::SPA))
    }

    /// Target hardware address.
    pub fn target_hardware_addr(&self) -> EthernetAddress {
        EthernetAddress(read_bytes(self.b(), field::THA))
    }

    /// Target protocol address.
    pub fn target_protocol_addr(&self) -> Ipv4Addr {
        Ipv4Addr::from(read_bytes::<4>(self.b(), field::TPA))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    fn m(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }

    /// Write the four format fields for Ethernet/IPv4 (1, 0x0800, 6, 4).
    pub fn set_ethernet_ipv4(&mut self) {
        write_u16(self.m(), field::HTYPE, HTYPE_ETHERNET);
        write_u16(self.m(), field::PTYPE, EtherType::IPV4.0);
        write_u8(self.m(), field::HLEN, 6);
        write_u8(self.m(), field::PLEN, 4);
    }

    /// Set the operation.
    pub fn set_operation(&mut self, op: Operation) {
        write_u16(self.m(), field::OPER, op.into());
    }

    /// Set the sender hardware address.
    pub fn set_source_hardware_addr(&mut self, a: EthernetAddress) {
        write_bytes(self.m(), field::SHA, a.0);
    }

    /// Set the sender protocol address.
    pub fn set_source_protocol_addr(&mut self, a: Ipv4Addr) {
        write_bytes(self.m(), field::SPA, a.octets());
    }

    /// Set the target hardware address.
    pub fn set_target_hardware_addr(&mut self, a: EthernetAddress) {
        write_bytes(self.m(), field::THA, a.0);
    }

    /// Set the target protocol address.
    pub fn set_target_protocol_addr(&mut self, a: Ipv4Addr) {
        write_bytes(self.m(), field::TPA, a.octets());
    }
}

/// A parsed Ethernet/IPv4 ARP packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Request or reply (never `Unknown` after [`Repr::parse`]).
    pub operation: Operation,
    /// Sender hardware address.
    pub source_hardware_addr: EthernetAddress,
    /// Sender protocol address.
    pub source_protocol_addr: Ipv4Addr,
    /// Target hardware address (ignored in requests; zero when sent by rnic).
    pub target_hardware_addr: EthernetAddress,
    /// Target protocol address.
    pub target_protocol_addr: Ipv4Addr,
}

impl Repr {
    /// A request from `sha`/`spa` for `tpa` (target hardware address zero).
    pub const fn request(sha: EthernetAddress, spa: Ipv4Addr, tpa: Ipv4Addr) -> Repr {
        Repr {
            operation: Operation::Request,
            source_hardware_addr: sha,
            source_protocol_addr: spa,
            target_hardware_addr: EthernetAddress([0; 6]),
            target_protocol_addr: tpa,
        }
    }

    /// The reply `sha` (owner of `request`'s target address) gives to `request`.
    pub const fn reply_to(request: &Repr, sha: EthernetAddress) -> Repr {
        Repr {
            operation: Operation::Reply,
            source_hardware_addr: sha,
            source_protocol_addr: request.target_protocol_addr,
            target_hardware_addr: request.source_hardware_addr,
            target_protocol_addr: request.source_protocol_addr,
        }
    }

    /// A gratuitous ARP announcing that `sha` has `ip`: a request whose
    /// sender and target protocol addresses are both `ip` (RFC 5227 §3's
    /// announcement, what Linux's `arping -U` sends).
    pub const fn gratuitous(sha: EthernetAddress, ip: Ipv4Addr) -> Repr {
        Repr::request(sha, ip, ip)
    }

    /// Whether sender and target protocol addresses are equal (a gratuitous
    /// request or reply: an announcement, not a question).
    pub fn is_gratuitous(&self) -> bool {
        self.source_protocol_addr == self.target_protocol_addr
    }

    /// Whether the sender protocol address is 0.0.0.0 (an RFC 5227 probe:
    /// someone checking whether the target address is in use).
    pub fn is_probe(&self) -> bool {
        self.source_protocol_addr.is_unspecified()
    }

    /// Parse a packet, rejecting truncation, formats other than
    /// Ethernet/IPv4 and operations other than request and reply.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr> {
        packet.check_len()?;
        let (htype, ptype) = (packet.hardware_type(), packet.protocol_type());
        let (hlen, plen) = (packet.hardware_len(), packet.protocol_len());
        if htype != HTYPE_ETHERNET || ptype != EtherType::IPV4 || hlen != 6 || plen != 4 {
            return Err(Error::ArpFormat {
                htype,
                ptype: ptype.0,
                hlen,
                plen,
            });
        }
        let operation = packet.operation();
        if let Operation::Unknown(op) = operation {
            return Err(Error::ArpOperation(op));
        }
        Ok(Repr {
            operation,
            source_hardware_addr: packet.source_hardware_addr(),
            source_protocol_addr: packet.source_protocol_addr(),
            target_hardware_addr: packet.target_hardware_addr(),
            target_protocol_addr: packet.target_protocol_addr(),
        })
    }

    /// 28.
    pub const fn buffer_len(&self) -> usize {
        PACKET_LEN
    }

    /// Write the packet into the start of `buffer`.
    pub fn emit(&self, buffer: &mut [u8]) -> Result<()> {
        let have = buffer.len();
        let out = buffer.get_mut(..PACKET_LEN).ok_or(Error::BufferTooSmall {
            need: PACKET_LEN,
            have,
        })?;
        let mut p = Packet::new_unchecked(out);
        p.set_ethernet_ipv4();
        p.set_operation(self.operation);
        p.set_source_hardware_addr(self.source_hardware_addr);
        p.set_source_protocol_addr(self.source_protocol_addr);
        p.set_target_hardware_addr(self.target_hardware_addr);
        p.set_target_protocol_addr(self.target_protocol_addr);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// RFC 826's request laid out by hand: 52:54:00:12:34:56 / 10.0.0.1 asks
    /// for 10.0.0.2 (what `tcpdump -r` prints as "Request who-has 10.0.0.2
    /// tell 10.0.0.1", see the neighbour tests' pcap check).
    const REQUEST: [u8; 28] = [
        0x00, 0x01, 0x08, 0x00, 0x06, 0x04, 0x00, 0x01, // Ethernet, IPv4, 6, 4, request
        0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 10, 0, 0, 1, // sender
        0, 0, 0, 0, 0, 0, 10, 0, 0, 2, // target
    ];
    /// 02:00:00:00:00:02 answers "10.0.0.2 is-at 02:00:00:00:00:02".
    const REPLY: [u8; 28] = [
        0x00, 0x01, 0x08, 0x00, 0x06, 0x04, 0x00, 0x02, //
        0x02, 0, 0, 0, 0, 0x02, 10, 0, 0, 2, //
        0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 10, 0, 0, 1,
    ];

    fn mac(last: u8) -> EthernetAddress {
        EthernetAddress([2, 0, 0, 0, 0, last])
    }

    #[test]
    fn golden_request_and_reply() {
        let p = Packet::new_checked(&REQUEST[..]).expect("check");
        let req = Repr::parse(&p).expect("parse");
        let asker = EthernetAddress([0x52, 0x54, 0, 0x12, 0x34, 0x56]);
        assert_eq!(
            req,
            Repr::request(
                asker,
                Ipv4Addr::new(10, 0, 0, 1),
                Ipv4Addr::new(10, 0, 0, 2)
            )
        );
        assert!(!req.is_gratuitous() && !req.is_probe());
        let mut out = [0u8; 28];
        req.emit(&mut out).expect("emit");
        assert_eq!(out, REQUEST);

        let reply = Repr::reply_to(&req, mac(2));
        reply.emit(&mut out).expect("emit");
        assert_eq!(out, REPLY);
        assert_eq!(
            Repr::parse(&Packet::new_checked(&REPLY[..]).expect("check")),
            Ok(reply)
        );
        // Ethernet padding after the 28 bytes is ignored.
        let mut padded = [0u8; 46];
        padded[..28].copy_from_slice(&REPLY);
        assert_eq!(Repr::parse(&Packet::new_unchecked(&padded[..])), Ok(reply));
    }

    #[test]
    fn gratuitous_and_probe() {
        let g = Repr::gratuitous(mac(9), Ipv4Addr::new(192, 168, 1, 9));
        assert!(g.is_gratuitous());
        assert_eq!(g.operation, Operation::Request);
        let mut out = [0u8; 28];
        g.emit(&mut out).expect("emit");
        assert_eq!(&out[14..18], &out[24..28]);
        assert_eq!(&out[18..24], &[0; 6]);
        let probe = Repr::request(mac(9), Ipv4Addr::UNSPECIFIED, Ipv4Addr::new(10, 0, 0, 7));
        assert!(probe.is_probe() && !probe.is_gratuitous());
    }

    #[test]
    fn rejects_truncated_foreign_formats_and_operations() {
        assert_eq!(
            Packet::new_checked(&REQUEST[..27]),
            Err(Error::Truncated {
                header: Header::Arp,
                need: 28,
                have: 27
            })
        );
        let expect_format = |i: usize, v: u8, want: Error| {
            let mut b = REQUEST;
            b[i] = v;
            assert_eq!(Repr::parse(&Packet::new_unchecked(&b[..])), Err(want));
        };
        // IEEE 802 hardware type 6, IPv6 protocol type, 8-byte hardware
        // addresses, 16-byte protocol addresses.
        let fmt = |htype, ptype, hlen, plen| Error::ArpFormat {
            htype,
            ptype,
            hlen,
            plen,
        };
        expect_format(1, 6, fmt(6, 0x0800, 6, 4));
        expect_format(2, 0x86, fmt(1, 0x8600, 6, 4));
        expect_format(4, 8, fmt(1, 0x0800, 8, 4));
        expect_format(5, 16, fmt(1, 0x0800, 6, 16));
        expect_format(7, 3, Error::ArpOperation(3));
        expect_format(7, 0, Error::ArpOperation(0));
        assert!(
            Error::ArpFormat {
                htype: 6,
                ptype: 0x800,
                hlen: 6,
                plen: 4
            }
            .to_string()
            .contains("only Ethernet/IPv4")
        );
        assert_eq!(
            Repr::request(mac(1), Ipv4Addr::LOCALHOST, Ipv4Addr::LOCALHOST).emit(&mut [0; 27]),
            Err(Error::BufferTooSmall { need: 28, have: 27 })
        );
    }

    proptest! {
        #[test]
        fn repr_round_trips(reply in any::<bool>(), sha in any::<[u8; 6]>(), spa in any::<[u8; 4]>(),
                            tha in any::<[u8; 6]>(), tpa in any::<[u8; 4]>()) {
            let repr = Repr {
                operation: if reply { Operation::Reply } else { Operation::Request },
                source_hardware_addr: EthernetAddress(sha), source_protocol_addr: spa.into(),
                target_hardware_addr: EthernetAddress(tha), target_protocol_addr: tpa.into(),
            };
            let mut buf = [0u8; 28];
            repr.emit(&mut buf).expect("emit");
            prop_assert_eq!(Repr::parse(&Packet::new_checked(&buf[..]).expect("check")), Ok(repr));
        }

        #[test]
        fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..40)) {
            let p = Packet::new_unchecked(&data[..]);
            let _ = (p.operation(), p.source_protocol_addr(), p.target_hardware_addr());
            if let Ok(r) = Repr::parse(&p) {
                let mut buf = [0u8; 28];
                r.emit(&mut buf).expect("emit");
                prop_assert_eq!(&buf[..], &data[..28]);
            }
        }
    }
}
