//! Atomic ACK Extended Transport Header (8 bytes; rocev2.md §4): the
//! original remote value, in ATOMIC_ACKNOWLEDGE after the AETH.

use super::bytes::{self, read_u64, write_u64};
use super::{Header, Result};

/// AtomicAckETH length in bytes.
pub const HEADER_LEN: usize = 8;

mod field {
    use super::bytes::Field;

    pub const ORIG: Field = 0..8;
}

/// A read/write view of an AtomicAckETH.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wrap a buffer without checking its length (accessors never panic).
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wrap a buffer, checking that it holds a whole AtomicAckETH.
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let p = Packet::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Check that the buffer holds a whole AtomicAckETH.
    pub fn check_len(&self) -> Result<()> {
        bytes::need(Header::AtomicAckEth, HEADER_LEN, self.buffer.as_ref().len())
    }

    /// Unwrap the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The remote value before the atomic operation.
    pub fn orig(&self) -> u64 {
        read_u64(self.buffer.as_ref(), field::ORIG)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set the original remote value.
    pub fn set_orig(&mut self, value: u64) {
        write_u64(self.buffer.as_mut(), field::ORIG, value);
    }
}

/// A parsed AtomicAckETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// The remote value before the operation.
    pub orig: u64,
}

impl Repr {
    /// Parse an AtomicAckETH view.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            orig: packet.orig(),
        })
    }

    /// Bytes `emit` writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Write the AtomicAckETH.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_orig(self.orig);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// AtomicAckETH of capture packet 1531 (the ATOMIC ACK answering packet
    /// 1501's FETCH_ADD; ib_atomic_bw never initialises its buffer).
    const ATOMIC_ACK: [u8; 8] = [0x03, 0xb8, 0xe2, 0x6e, 0xe6, 0x1d, 0x83, 0xa2];

    #[test]
    fn capture_atomic_ack() {
        let r = Repr::parse(&Packet::new_checked(&ATOMIC_ACK[..]).expect("len")).expect("parse");
        assert_eq!(r.orig, 0x03b8_e26e_e61d_83a2);
        let mut out = [0u8; 8];
        r.emit(&mut Packet::new_unchecked(&mut out[..]));
        assert_eq!(out, ATOMIC_ACK);
        assert!(Packet::new_checked(&ATOMIC_ACK[..7]).is_err());
    }

    proptest! {
        #[test]
        fn repr_round_trips(orig in any::<u64>()) {
            let mut buf = [0u8; HEADER_LEN];
            Repr { orig }.emit(&mut Packet::new_unchecked(&mut buf[..]));
            prop_assert_eq!(Repr::parse(&Packet::new_unchecked(&buf[..])), Ok(Repr { orig }));
        }
    }
}
