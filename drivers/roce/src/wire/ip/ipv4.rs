//! IPv4 header without options (20 bytes).

use std::net::Ipv4Addr;

use super::super::bytes::{self, read_bytes, read_u8, read_u16, write_bytes, write_u8, write_u16};
use super::super::{Error, Header, Result};
use super::internet_checksum;

/// The only header length supported: 20 bytes (IHL 5).
pub const HEADER_LEN: usize = 20;

mod field {
    #![allow(dead_code)]
    use super::bytes::Field;

    pub const VER_IHL: usize = 0;
    pub const TOS: usize = 1;
    pub const LENGTH: Field = 2..4;
    pub const IDENT: Field = 4..6;
    pub const FLG_OFF: Field = 6..8;
    pub const TTL: usize = 8;
    pub const PROTOCOL: usize = 9;
    pub const CHECKSUM: Field = 10..12;
    pub const SRC_ADDR: Field = 12..16;
    pub const DST_ADDR: Field = 16..20;

    pub const FLAG_DF: u16 = 0x4000;
    pub const FLAG_MF: u16 = 0x2000;
    pub const OFFSET_MASK: u16 = 0x1FFF;
}

/// A read/write view of an IPv4 packet (header without options + payload).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wrap a buffer without checking it (accessors never panic).
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wrap a buffer, checking version, header length and total length.
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let p = Packet::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Check that the buffer holds a 20-byte IPv4 header (version 4, IHL 5)
    /// and the whole packet its total length announces. Bytes after the
    /// total length (Ethernet padding) are allowed and ignored.
    pub fn check_len(&self) -> Result<()> {
        let have = self.buffer.as_ref().len();
        bytes::need(Header::Ipv4, HEADER_LEN, have)?;
        if self.version() != 4 {
            return Err(Error::IpVersion {
                expected: 4,
                found: self.version(),
            });
        }
        if self.ihl() != 5 {
            return Err(Error::Ipv4Options { ihl: self.ihl() });
        }
        let total = usize::from(self.total_len());
        if total < HEADER_LEN || total > have {
            return Err(Error::BadLength {
                header: Header::Ipv4,
                field: total,
                available: have,
            });
        }
        Ok(())
    }

    /// Unwrap the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// Version (4).
    pub fn version(&self) -> u8 {
        read_u8(self.b(), field::VER_IHL) >> 4
    }

    /// IHL: header length in 32-bit words (5).
    pub fn ihl(&self) -> u8 {
        read_u8(self.b(), field::VER_IHL) & 0x0F
    }

    /// Type of service (DSCP << 2 | ECN): the AV traffic class on rxe.
    pub fn tos(&self) -> u8 {
        read_u8(self.b(), field::TOS)
    }

    /// DSCP (TOS bits 7:2).
    pub fn dscp(&self) -> u8 {
        self.tos() >> 2
    }

    /// ECN (TOS bits 1:0).
    pub fn ecn(&self) -> u8 {
        self.tos() & 3
    }

    /// Total length (header + payload).
    pub fn total_len(&self) -> u16 {
        read_u16(self.b(), field::LENGTH)
    }

    /// Identification.
    pub fn ident(&self) -> u16 {
        read_u16(self.b(), field::IDENT)
    }

    /// The raw flags + fragment offset word.
    pub fn flags_frag(&self) -> u16 {
        read_u16(self.b(), field::FLG_OFF)
    }

    /// DF: don't fragment.
    pub fn dont_frag(&self) -> bool {
        self.flags_frag() & field::FLAG_DF != 0
    }

    /// MF: more fragments.
    pub fn more_frags(&self) -> bool {
        self.flags_frag() & field::FLAG_MF != 0
    }

    /// Fragment offset in 8-byte units.
    pub fn frag_offset(&self) -> u16 {
        self.flags_frag() & field::OFFSET_MASK
    }

    /// Time to live (the AV hop limit on rxe).
    pub fn ttl(&self) -> u8 {
        read_u8(self.b(), field::TTL)
    }

    /// Protocol (17 = UDP).
    pub fn protocol(&self) -> u8 {
        read_u8(self.b(), field::PROTOCOL)
    }

    /// Header checksum field.
    pub fn checksum(&self) -> u16 {
        read_u16(self.b(), field::CHECKSUM)
    }

    /// Source address.
    pub fn src_addr(&self) -> Ipv4Addr {
        Ipv4Addr::from(read_bytes::<4>(self.b(), field::SRC_ADDR))
    }

    /// Destination address.
    pub fn dst_addr(&self) -> Ipv4Addr {
        Ipv4Addr::from(read_bytes::<4>(self.b(), field::DST_ADDR))
    }

    /// The checksum the header should carry.
    pub fn compute_checksum(&self) -> u16 {
        let mut hdr = read_bytes::<HEADER_LEN>(self.b(), 0..HEADER_LEN);
        write_u16(&mut hdr, field::CHECKSUM, 0);
        internet_checksum(&hdr)
    }

    /// Whether the header checksum is right.
    pub fn verify_checksum(&self) -> bool {
        self.compute_checksum() == self.checksum()
    }

    /// The 20 header bytes (shorter on an unchecked short buffer).
    pub fn header(&self) -> &[u8] {
        let b = self.b();
        b.get(..HEADER_LEN).unwrap_or(b)
    }

    /// The payload: header end .. total length.
    pub fn payload(&self) -> &[u8] {
        let end = usize::from(self.total_len());
        self.b().get(HEADER_LEN..end).unwrap_or(&[])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    fn m(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }

    /// Set version 4 and IHL 5.
    pub fn set_version_ihl(&mut self) {
        write_u8(self.m(), field::VER_IHL, 0x45);
    }

    /// Set the type of service byte.
    pub fn set_tos(&mut self, value: u8) {
        write_u8(self.m(), field::TOS, value);
    }

    /// Set the total length.
    pub fn set_total_len(&mut self, value: u16) {
        write_u16(self.m(), field::LENGTH, value);
    }

    /// Set the identification.
    pub fn set_ident(&mut self, value: u16) {
        write_u16(self.m(), field::IDENT, value);
    }

    /// Set the raw flags + fragment offset word.
    pub fn set_flags_frag(&mut self, value: u16) {
        write_u16(self.m(), field::FLG_OFF, value);
    }

    /// Set the TTL.
    pub fn set_ttl(&mut self, value: u8) {
        write_u8(self.m(), field::TTL, value);
    }

    /// Set the protocol.
    pub fn set_protocol(&mut self, value: u8) {
        write_u8(self.m(), field::PROTOCOL, value);
    }

    /// Set the checksum field.
    pub fn set_checksum(&mut self, value: u16) {
        write_u16(self.m(), field::CHECKSUM, value);
    }

    /// Set the source address.
    pub fn set_src_addr(&mut self, value: Ipv4Addr) {
        write_bytes(self.m(), field::SRC_ADDR, value.octets());
    }

    /// Set the destination address.
    pub fn set_dst_addr(&mut self, value: Ipv4Addr) {
        write_bytes(self.m(), field::DST_ADDR, value.octets());
    }

    /// Compute and write the header checksum.
    pub fn fill_checksum(&mut self) {
        let c = self.compute_checksum();
        self.set_checksum(c);
    }

    /// The payload, writable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let end = usize::from(self.total_len());
        self.m().get_mut(HEADER_LEN..end).unwrap_or(&mut [])
    }
}

/// A parsed IPv4 header. The fragment fields are not represented: parsing
/// rejects fragments, and `emit` writes offset 0 with MF clear.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Source address.
    pub src_addr: Ipv4Addr,
    /// Destination address.
    pub dst_addr: Ipv4Addr,
    /// Type of service (DSCP << 2 | ECN).
    pub tos: u8,
    /// Identification.
    pub ident: u16,
    /// DF flag (rxe sets it).
    pub dont_frag: bool,
    /// Time to live.
    pub ttl: u8,
    /// Protocol (17 for RoCEv2).
    pub protocol: u8,
    /// Payload bytes after the 20-byte header.
    pub payload_len: usize,
}

impl Repr {
    /// Parse a header: checks lengths, the checksum, and that the packet is
    /// not a fragment.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr> {
        packet.check_len()?;
        if !packet.verify_checksum() {
            return Err(Error::Ipv4Checksum {
                computed: packet.compute_checksum(),
                found: packet.checksum(),
            });
        }
        if packet.more_frags() || packet.frag_offset() != 0 {
            return Err(Error::Ipv4Fragment {
                more_fragments: packet.more_frags(),
                offset: packet.frag_offset(),
            });
        }
        Ok(Repr {
            src_addr: packet.src_addr(),
            dst_addr: packet.dst_addr(),
            tos: packet.tos(),
            ident: packet.ident(),
            dont_frag: packet.dont_frag(),
            ttl: packet.ttl(),
            protocol: packet.protocol(),
            payload_len: usize::from(packet.total_len()).saturating_sub(HEADER_LEN),
        })
    }

    /// Header plus payload.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN + self.payload_len
    }

    /// Write the header (with checksum) into the start of `buffer`.
    /// Fails when the buffer is shorter than 20 bytes or the total length
    /// does not fit 16 bits; the payload is the caller's.
    pub fn emit(&self, buffer: &mut [u8]) -> Result<()> {
        let total = self.buffer_len();
        let total16 = u16::try_from(total).map_err(|_| Error::TooLong {
            header: Header::Ipv4,
            len: total,
        })?;
        let have = buffer.len();
        let hdr = buffer.get_mut(..HEADER_LEN).ok_or(Error::BufferTooSmall {
            need: HEADER_LEN,
            have,
        })?;
        let mut p = Packet::new_unchecked(hdr);
        p.set_version_ihl();
        p.set_tos(self.tos);
        p.set_total_len(total16);
        p.set_ident(self.ident);
        p.set_flags_frag(if self.dont_frag { field::FLAG_DF } else { 0 });
        p.set_ttl(self.ttl);
        p.set_protocol(self.protocol);
        p.set_src_addr(self.src_addr);
        p.set_dst_addr(self.dst_addr);
        p.fill_checksum();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// IPv4 header of the scapy UC SEND_ONLY (rocev2.md §6.2).
    const SCAPY: [u8; 20] = [
        0x45, 0x01, 0x00, 0x40, 0x04, 0x78, 0x40, 0x00, 0x40, 0x11, 0xb4, 0xd5, 0xc0, 0xa8, 0x00,
        0x07, 0xc0, 0xa8, 0x00, 0x07,
    ];

    #[test]
    fn golden_scapy() {
        let mut buf = [0u8; 64];
        buf[..20].copy_from_slice(&SCAPY);
        let p = Packet::new_checked(&buf[..]).expect("check");
        assert_eq!(
            (p.version(), p.ihl(), p.tos(), p.dscp(), p.ecn()),
            (4, 5, 1, 0, 1)
        );
        assert_eq!(
            (p.total_len(), p.ident(), p.ttl(), p.protocol()),
            (64, 1144, 64, 17)
        );
        assert!(p.dont_frag() && !p.more_frags() && p.frag_offset() == 0);
        assert_eq!(p.checksum(), 0xb4d5);
        assert!(p.verify_checksum());
        let r = Repr::parse(&p).expect("parse");
        assert_eq!(r.src_addr, Ipv4Addr::new(192, 168, 0, 7));
        assert_eq!(r.dst_addr, Ipv4Addr::new(192, 168, 0, 7));
        assert_eq!(r.payload_len, 44);
        let mut out = [0u8; 20];
        r.emit(&mut out).expect("emit");
        assert_eq!(out, SCAPY);
    }

    #[test]
    fn rejections() {
        let mut buf = [0u8; 64];
        buf[..20].copy_from_slice(&SCAPY);
        assert_eq!(
            Packet::new_checked(&buf[..63]),
            Err(Error::BadLength {
                header: Header::Ipv4,
                field: 64,
                available: 63
            })
        );
        assert_eq!(
            Packet::new_checked(&buf[..19]),
            Err(Error::Truncated {
                header: Header::Ipv4,
                need: 20,
                have: 19
            })
        );
        let mut opts = buf;
        opts[0] = 0x46;
        assert_eq!(
            Packet::new_checked(&opts[..]),
            Err(Error::Ipv4Options { ihl: 6 })
        );
        let mut v6 = buf;
        v6[0] = 0x65;
        assert_eq!(
            Packet::new_checked(&v6[..]),
            Err(Error::IpVersion {
                expected: 4,
                found: 6
            })
        );
        let mut bad = buf;
        bad[8] = 63;
        assert_eq!(
            Repr::parse(&Packet::new_unchecked(&bad[..])),
            Err(Error::Ipv4Checksum {
                computed: 0xb5d5,
                found: 0xb4d5
            })
        );
        let mut frag = buf;
        frag[6] = 0x20;
        Packet::new_unchecked(&mut frag[..]).fill_checksum();
        assert_eq!(
            Repr::parse(&Packet::new_unchecked(&frag[..])),
            Err(Error::Ipv4Fragment {
                more_fragments: true,
                offset: 0
            })
        );
        let big = Repr {
            payload_len: 65_516,
            ..Repr::parse(&Packet::new_unchecked(&buf[..])).expect("parse")
        };
        assert_eq!(
            big.emit(&mut [0u8; 20]),
            Err(Error::TooLong {
                header: Header::Ipv4,
                len: 65_536
            })
        );
    }

    proptest! {
        #[test]
        fn repr_round_trips(src in any::<[u8; 4]>(), dst in any::<[u8; 4]>(), tos in any::<u8>(),
                            ident in any::<u16>(), df in any::<bool>(), ttl in any::<u8>(),
                            proto in any::<u8>(), len in 0usize..200) {
            let repr = Repr { src_addr: src.into(), dst_addr: dst.into(), tos, ident, dont_frag: df, ttl,
                              protocol: proto, payload_len: len };
            let mut buf = vec![0u8; repr.buffer_len()];
            repr.emit(&mut buf).expect("emit");
            prop_assert_eq!(Repr::parse(&Packet::new_checked(&buf[..]).expect("check")), Ok(repr));
        }
    }
}
