//! Immediate data (4 bytes; rocev2.md §4): in SEND/WRITE LAST/ONLY *with
//! immediate* and UD SEND with immediate.

use super::bytes::{self, read_u32, write_u32};
use super::{Header, Result};

/// ImmDt length in bytes.
pub const HEADER_LEN: usize = 4;

mod field {
    use super::bytes::Field;

    pub const IMM: Field = 0..4;
}

/// A read/write view of an ImmDt header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wrap a buffer without checking its length (accessors never panic).
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wrap a buffer, checking that it holds the 4 bytes.
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let p = Packet::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Check that the buffer holds the 4 bytes.
    pub fn check_len(&self) -> Result<()> {
        bytes::need(Header::ImmDt, HEADER_LEN, self.buffer.as_ref().len())
    }

    /// Unwrap the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The immediate value, read big-endian (network order): the verbs
    /// `imm_data` as a host integer is `u32::from_be(..)` of the same bytes.
    pub fn imm(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::IMM)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set the immediate value (written big-endian).
    pub fn set_imm(&mut self, value: u32) {
        write_u32(self.buffer.as_mut(), field::IMM, value);
    }
}

/// Parsed immediate data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// The 32 opaque bits, as a big-endian integer.
    pub imm: u32,
}

impl Repr {
    /// Parse an ImmDt view.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr> {
        packet.check_len()?;
        Ok(Repr { imm: packet.imm() })
    }

    /// Bytes `emit` writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Write the ImmDt.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_imm(self.imm);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Hand-built: immediate 0xDEADBEEF as ibv_post_send sends `htonl(0xdeadbeef)`.
    const IMM: [u8; 4] = [0xde, 0xad, 0xbe, 0xef];

    #[test]
    fn golden() {
        let r = Repr::parse(&Packet::new_checked(&IMM[..]).expect("len")).expect("parse");
        assert_eq!(r.imm, 0xDEAD_BEEF);
        let mut out = [0u8; 4];
        r.emit(&mut Packet::new_unchecked(&mut out[..]));
        assert_eq!(out, IMM);
        assert!(Packet::new_checked(&IMM[..3]).is_err());
    }

    proptest! {
        #[test]
        fn repr_round_trips(imm in any::<u32>()) {
            let mut buf = [0u8; HEADER_LEN];
            Repr { imm }.emit(&mut Packet::new_unchecked(&mut buf[..]));
            prop_assert_eq!(buf, imm.to_be_bytes());
            prop_assert_eq!(Repr::parse(&Packet::new_unchecked(&buf[..])), Ok(Repr { imm }));
        }
    }
}
