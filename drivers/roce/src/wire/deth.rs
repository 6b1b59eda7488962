//! Datagram Extended Transport Header (8 bytes; rocev2.md §4): Q_Key and
//! source QP, in UD SENDs.

use rnic_core::Qpn;

use super::bytes::{self, read_u8, read_u24, read_u32, write_u8, write_u24, write_u32};
use super::{Header, Result};

/// DETH length in bytes.
pub const HEADER_LEN: usize = 8;

/// The Q_Key of the general services QP (QP1, CM MADs): `IB_QP1_QKEY`.
pub const GSI_QKEY: u32 = 0x8001_0000;

mod field {
    use super::bytes::Field;

    pub const QKEY: Field = 0..4;
    pub const RESERVED: usize = 4;
    pub const SRC_QP: Field = 5..8;
}

/// A read/write view of a DETH.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wrap a buffer without checking its length (accessors never panic).
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wrap a buffer, checking that it holds a whole DETH.
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let p = Packet::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Check that the buffer holds a whole DETH.
    pub fn check_len(&self) -> Result<()> {
        bytes::need(Header::Deth, HEADER_LEN, self.buffer.as_ref().len())
    }

    /// Unwrap the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Q_Key.
    pub fn qkey(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::QKEY)
    }

    /// The reserved byte (zero on send).
    pub fn reserved(&self) -> u8 {
        read_u8(self.buffer.as_ref(), field::RESERVED)
    }

    /// Source QP.
    pub fn src_qp(&self) -> Qpn {
        Qpn::from_wire(read_u24(self.buffer.as_ref(), field::SRC_QP))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set the Q_Key.
    pub fn set_qkey(&mut self, value: u32) {
        write_u32(self.buffer.as_mut(), field::QKEY, value);
    }

    /// Set the reserved byte.
    pub fn set_reserved(&mut self, value: u8) {
        write_u8(self.buffer.as_mut(), field::RESERVED, value);
    }

    /// Set the source QP.
    pub fn set_src_qp(&mut self, value: Qpn) {
        write_u24(self.buffer.as_mut(), field::SRC_QP, value.get());
    }
}

/// A parsed DETH (the reserved byte is emitted as zero).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Q_Key.
    pub qkey: u32,
    /// Source QP.
    pub src_qp: Qpn,
}

impl Repr {
    /// Parse a DETH view.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            qkey: packet.qkey(),
            src_qp: packet.src_qp(),
        })
    }

    /// Bytes `emit` writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Write the DETH (reserved byte zero).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_qkey(self.qkey);
        packet.set_reserved(0);
        packet.set_src_qp(self.src_qp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Hand-built DETH of a CM MAD to QP1: Q_Key 0x80010000, source QP 0x000011.
    const GSI: [u8; 8] = [0x80, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x11];

    #[test]
    fn golden_gsi() {
        let p = Packet::new_checked(&GSI[..]).expect("len");
        assert_eq!(p.reserved(), 0);
        let r = Repr::parse(&p).expect("parse");
        assert_eq!(r.qkey, GSI_QKEY);
        assert_eq!(r.src_qp, Qpn::from_wire(0x11));
        let mut out = [0xAAu8; 8];
        r.emit(&mut Packet::new_unchecked(&mut out[..]));
        assert_eq!(out, GSI);
        assert!(matches!(
            Packet::new_checked(&GSI[..7]),
            Err(super::super::Error::Truncated {
                header: Header::Deth,
                need: 8,
                have: 7
            })
        ));
    }

    proptest! {
        #[test]
        fn repr_round_trips(qkey in any::<u32>(), qp in 0u32..=0xFF_FFFF) {
            let repr = Repr { qkey, src_qp: Qpn::from_wire(qp) };
            let mut buf = [0u8; HEADER_LEN];
            repr.emit(&mut Packet::new_unchecked(&mut buf[..]));
            prop_assert_eq!(Repr::parse(&Packet::new_unchecked(&buf[..])), Ok(repr));
        }
    }
}
