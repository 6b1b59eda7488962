//! Invalidate Extended Transport Header (4 bytes; rocev2.md §4): the R_Key
//! a SEND LAST/ONLY WITH INVALIDATE asks the responder to invalidate.

use rnic_core::Rkey;

use super::bytes::{self, read_u32, write_u32};
use super::{Header, Result};

/// IETH length in bytes.
pub const HEADER_LEN: usize = 4;

mod field {
    use super::bytes::Field;

    pub const RKEY: Field = 0..4;
}

/// A read/write view of an IETH.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wrap a buffer without checking its length (accessors never panic).
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wrap a buffer, checking that it holds a whole IETH.
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let p = Packet::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Check that the buffer holds a whole IETH.
    pub fn check_len(&self) -> Result<()> {
        bytes::need(Header::Ieth, HEADER_LEN, self.buffer.as_ref().len())
    }

    /// Unwrap the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The R_Key to invalidate.
    pub fn rkey(&self) -> Rkey {
        Rkey(read_u32(self.buffer.as_ref(), field::RKEY))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set the R_Key to invalidate.
    pub fn set_rkey(&mut self, value: Rkey) {
        write_u32(self.buffer.as_mut(), field::RKEY, value.get());
    }
}

/// A parsed IETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// The R_Key to invalidate.
    pub rkey: Rkey,
}

impl Repr {
    /// Parse an IETH view.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            rkey: packet.rkey(),
        })
    }

    /// Bytes `emit` writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Write the IETH.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_rkey(self.rkey);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Hand-built: invalidate R_Key 0x00123456 (index 0x1234, key byte 0x56).
    const IETH: [u8; 4] = [0x00, 0x12, 0x34, 0x56];

    #[test]
    fn golden() {
        let r = Repr::parse(&Packet::new_checked(&IETH[..]).expect("len")).expect("parse");
        assert_eq!(r.rkey, Rkey(0x0012_3456));
        assert_eq!(r.rkey.index(), 0x1234);
        assert_eq!(r.rkey.key_byte(), 0x56);
        let mut out = [0u8; 4];
        r.emit(&mut Packet::new_unchecked(&mut out[..]));
        assert_eq!(out, IETH);
        assert!(matches!(
            Packet::new_checked(&IETH[..2]),
            Err(super::super::Error::Truncated {
                header: Header::Ieth,
                need: 4,
                have: 2
            })
        ));
    }

    proptest! {
        #[test]
        fn repr_round_trips(k in any::<u32>()) {
            let repr = Repr { rkey: Rkey(k) };
            let mut buf = [0u8; HEADER_LEN];
            repr.emit(&mut Packet::new_unchecked(&mut buf[..]));
            prop_assert_eq!(Repr::parse(&Packet::new_unchecked(&buf[..])), Ok(repr));
        }
    }
}
