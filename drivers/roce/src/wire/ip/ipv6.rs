//! IPv6 header without extension headers (40 bytes).

use std::net::Ipv6Addr;

use super::super::bytes::{
    self, read_bytes, read_u8, read_u16, read_u32, write_bytes, write_u8, write_u16, write_u32,
};
use super::super::{Error, Header, Result};

/// IPv6 header length.
pub const HEADER_LEN: usize = 40;

mod field {
    use super::bytes::Field;

    /// Version (4 bits), traffic class (8), flow label (20).
    pub const VER_TC_FLOW: Field = 0..4;
    pub const PAYLOAD_LEN: Field = 4..6;
    pub const NEXT_HEADER: usize = 6;
    pub const HOP_LIMIT: usize = 7;
    pub const SRC_ADDR: Field = 8..24;
    pub const DST_ADDR: Field = 24..40;
}

/// A read/write view of an IPv6 packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wrap a buffer without checking it (accessors never panic).
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wrap a buffer, checking version and lengths.
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let p = Packet::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Check that the buffer holds the 40-byte header (version 6) and the
    /// payload length it announces (trailing bytes are ignored).
    pub fn check_len(&self) -> Result<()> {
        let have = self.buffer.as_ref().len();
        bytes::need(Header::Ipv6, HEADER_LEN, have)?;
        if self.version() != 6 {
            return Err(Error::IpVersion {
                expected: 6,
                found: self.version(),
            });
        }
        let total = HEADER_LEN + usize::from(self.payload_len());
        if total > have {
            return Err(Error::BadLength {
                header: Header::Ipv6,
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

    fn word0(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::VER_TC_FLOW)
    }

    /// Version (6).
    pub fn version(&self) -> u8 {
        // A 4-bit value.
        (self.word0() >> 28) as u8
    }

    /// Traffic class (the AV traffic class on rxe).
    pub fn traffic_class(&self) -> u8 {
        // An 8-bit value.
        (self.word0() >> 20) as u8
    }

    /// Flow label (20 bits; rxe sends 0).
    pub fn flow_label(&self) -> u32 {
        self.word0() & 0x000F_FFFF
    }

    /// Payload length (bytes after the 40-byte header).
    pub fn payload_len(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::PAYLOAD_LEN)
    }

    /// Next header (17 = UDP).
    pub fn next_header(&self) -> u8 {
        read_u8(self.buffer.as_ref(), field::NEXT_HEADER)
    }

    /// Hop limit.
    pub fn hop_limit(&self) -> u8 {
        read_u8(self.buffer.as_ref(), field::HOP_LIMIT)
    }

    /// Source address.
    pub fn src_addr(&self) -> Ipv6Addr {
        Ipv6Addr::from(read_bytes::<16>(self.buffer.as_ref(), field::SRC_ADDR))
    }

    /// Destination address.
    pub fn dst_addr(&self) -> Ipv6Addr {
        Ipv6Addr::from(read_bytes::<16>(self.buffer.as_ref(), field::DST_ADDR))
    }

    /// The payload (bytes 40 .. 40 + payload length).
    pub fn payload(&self) -> &[u8] {
        let end = HEADER_LEN + usize::from(self.payload_len());
        self.buffer.as_ref().get(HEADER_LEN..end).unwrap_or(&[])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set version 6, traffic class and flow label (low 20 bits) together.
    pub fn set_ver_tc_flow(&mut self, traffic_class: u8, flow_label: u32) {
        let w = (6 << 28) | (u32::from(traffic_class) << 20) | (flow_label & 0x000F_FFFF);
        write_u32(self.buffer.as_mut(), field::VER_TC_FLOW, w);
    }

    /// Set the payload length.
    pub fn set_payload_len(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::PAYLOAD_LEN, value);
    }

    /// Set the next header.
    pub fn set_next_header(&mut self, value: u8) {
        write_u8(self.buffer.as_mut(), field::NEXT_HEADER, value);
    }

    /// Set the hop limit.
    pub fn set_hop_limit(&mut self, value: u8) {
        write_u8(self.buffer.as_mut(), field::HOP_LIMIT, value);
    }

    /// Set the source address.
    pub fn set_src_addr(&mut self, value: Ipv6Addr) {
        write_bytes(self.buffer.as_mut(), field::SRC_ADDR, value.octets());
    }

    /// Set the destination address.
    pub fn set_dst_addr(&mut self, value: Ipv6Addr) {
        write_bytes(self.buffer.as_mut(), field::DST_ADDR, value.octets());
    }

    /// The payload, writable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let end = HEADER_LEN + usize::from(self.payload_len());
        self.buffer
            .as_mut()
            .get_mut(HEADER_LEN..end)
            .unwrap_or(&mut [])
    }
}

/// A parsed IPv6 header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Source address.
    pub src_addr: Ipv6Addr,
    /// Destination address.
    pub dst_addr: Ipv6Addr,
    /// Traffic class.
    pub traffic_class: u8,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Next header.
    pub next_header: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Payload bytes after the header.
    pub payload_len: usize,
}

impl Repr {
    /// Parse a header.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            src_addr: packet.src_addr(),
            dst_addr: packet.dst_addr(),
            traffic_class: packet.traffic_class(),
            flow_label: packet.flow_label(),
            next_header: packet.next_header(),
            hop_limit: packet.hop_limit(),
            payload_len: usize::from(packet.payload_len()),
        })
    }

    /// Header plus payload.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN + self.payload_len
    }

    /// Write the header into the start of `buffer` (the payload is the caller's).
    pub fn emit(&self, buffer: &mut [u8]) -> Result<()> {
        let len16 = u16::try_from(self.payload_len).map_err(|_| Error::TooLong {
            header: Header::Ipv6,
            len: self.payload_len,
        })?;
        let have = buffer.len();
        let hdr = buffer.get_mut(..HEADER_LEN).ok_or(Error::BufferTooSmall {
            need: HEADER_LEN,
            have,
        })?;
        let mut p = Packet::new_unchecked(hdr);
        p.set_ver_tc_flow(self.traffic_class, self.flow_label);
        p.set_payload_len(len16);
        p.set_next_header(self.next_header);
        p.set_hop_limit(self.hop_limit);
        p.set_src_addr(self.src_addr);
        p.set_dst_addr(self.dst_addr);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Hand-built: TC 0x12, flow label 0xABCDE, payload 8, UDP, hop limit 64,
    /// fe80::1 → fe80::2.
    const HDR: [u8; 40] = [
        0x61, 0x2a, 0xbc, 0xde, 0x00, 0x08, 0x11, 0x40, //
        0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, //
        0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2,
    ];

    #[test]
    fn golden() {
        let mut buf = [0u8; 48];
        buf[..40].copy_from_slice(&HDR);
        let p = Packet::new_checked(&buf[..]).expect("check");
        assert_eq!(
            (p.version(), p.traffic_class(), p.flow_label()),
            (6, 0x12, 0xABCDE)
        );
        assert_eq!(
            (p.payload_len(), p.next_header(), p.hop_limit()),
            (8, 17, 64)
        );
        assert_eq!(p.src_addr(), "fe80::1".parse::<Ipv6Addr>().expect("addr"));
        assert_eq!(p.dst_addr(), "fe80::2".parse::<Ipv6Addr>().expect("addr"));
        assert_eq!(p.payload().len(), 8);
        let r = Repr::parse(&p).expect("parse");
        let mut out = [0u8; 40];
        r.emit(&mut out).expect("emit");
        assert_eq!(out, HDR);
        assert_eq!(
            Packet::new_checked(&buf[..47]),
            Err(Error::BadLength {
                header: Header::Ipv6,
                field: 48,
                available: 47
            })
        );
        assert_eq!(
            Packet::new_checked(&buf[..39]),
            Err(Error::Truncated {
                header: Header::Ipv6,
                need: 40,
                have: 39
            })
        );
        buf[0] = 0x45;
        assert_eq!(
            Packet::new_checked(&buf[..]),
            Err(Error::IpVersion {
                expected: 6,
                found: 4
            })
        );
    }

    proptest! {
        #[test]
        fn repr_round_trips(src in any::<[u8; 16]>(), dst in any::<[u8; 16]>(), tc in any::<u8>(),
                            fl in 0u32..(1 << 20), nh in any::<u8>(), hl in any::<u8>(), len in 0usize..100) {
            let repr = Repr { src_addr: src.into(), dst_addr: dst.into(), traffic_class: tc, flow_label: fl,
                              next_header: nh, hop_limit: hl, payload_len: len };
            let mut buf = vec![0u8; repr.buffer_len()];
            repr.emit(&mut buf).expect("emit");
            prop_assert_eq!(Repr::parse(&Packet::new_checked(&buf[..]).expect("check")), Ok(repr));
        }
    }
}
