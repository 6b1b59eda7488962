//! Atomic Extended Transport Header (28 bytes; rocev2.md §4): in
//! COMPARE_SWAP and FETCH_ADD. 28 is not a multiple of 8, so the 64-bit
//! fields after the R_Key are unaligned; they are read byte-wise.

use rnic_core::{Iova, Rkey};

use super::bytes::{self, read_u32, read_u64, write_u32, write_u64};
use super::{Header, Result};

/// AtomicETH length in bytes.
pub const HEADER_LEN: usize = 28;

mod field {
    use super::bytes::Field;

    pub const VA: Field = 0..8;
    pub const RKEY: Field = 8..12;
    pub const SWAP_ADD: Field = 12..20;
    pub const COMPARE: Field = 20..28;
}

/// A read/write view of an AtomicETH.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wrap a buffer without checking its length (accessors never panic).
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wrap a buffer, checking that it holds a whole AtomicETH.
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let p = Packet::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Check that the buffer holds a whole AtomicETH.
    pub fn check_len(&self) -> Result<()> {
        bytes::need(Header::AtomicEth, HEADER_LEN, self.buffer.as_ref().len())
    }

    /// Unwrap the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Remote virtual address (must be 8-byte aligned; the responder checks).
    pub fn va(&self) -> Iova {
        Iova(read_u64(self.buffer.as_ref(), field::VA))
    }

    /// R_Key.
    pub fn rkey(&self) -> Rkey {
        Rkey(read_u32(self.buffer.as_ref(), field::RKEY))
    }

    /// Swap data (COMPARE_SWAP) or add data (FETCH_ADD).
    pub fn swap_add(&self) -> u64 {
        read_u64(self.buffer.as_ref(), field::SWAP_ADD)
    }

    /// Compare data (COMPARE_SWAP; ignored for FETCH_ADD).
    pub fn compare(&self) -> u64 {
        read_u64(self.buffer.as_ref(), field::COMPARE)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set the remote virtual address.
    pub fn set_va(&mut self, value: Iova) {
        write_u64(self.buffer.as_mut(), field::VA, value.get());
    }

    /// Set the R_Key.
    pub fn set_rkey(&mut self, value: Rkey) {
        write_u32(self.buffer.as_mut(), field::RKEY, value.get());
    }

    /// Set the swap/add data.
    pub fn set_swap_add(&mut self, value: u64) {
        write_u64(self.buffer.as_mut(), field::SWAP_ADD, value);
    }

    /// Set the compare data.
    pub fn set_compare(&mut self, value: u64) {
        write_u64(self.buffer.as_mut(), field::COMPARE, value);
    }
}

/// A parsed AtomicETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Remote virtual address.
    pub va: Iova,
    /// Remote key.
    pub rkey: Rkey,
    /// Swap (CmpSwap) or add (FetchAdd) operand.
    pub swap_add: u64,
    /// Compare operand (CmpSwap only).
    pub compare: u64,
}

impl Repr {
    /// Parse an AtomicETH view.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            va: packet.va(),
            rkey: packet.rkey(),
            swap_add: packet.swap_add(),
            compare: packet.compare(),
        })
    }

    /// Bytes `emit` writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Write the AtomicETH.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_va(self.va);
        packet.set_rkey(self.rkey);
        packet.set_swap_add(self.swap_add);
        packet.set_compare(self.compare);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// AtomicETH of capture packet 1501 (RC FETCH_ADD from ib_atomic_bw: add 1).
    const FETCH_ADD: [u8; 28] = [
        0x00, 0x00, 0x55, 0x6f, 0xb4, 0x9b, 0x90, 0x00, // VA
        0x00, 0x00, 0x05, 0x6a, // R_Key
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, // add
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // compare
    ];

    #[test]
    fn capture_fetch_add() {
        let r = Repr::parse(&Packet::new_checked(&FETCH_ADD[..]).expect("len")).expect("parse");
        assert_eq!(r.va, Iova(0x0000_556f_b49b_9000));
        assert_eq!(r.rkey, Rkey(0x56a));
        assert_eq!(r.swap_add, 1);
        assert_eq!(r.compare, 0);
        let mut out = [0u8; 28];
        r.emit(&mut Packet::new_unchecked(&mut out[..]));
        assert_eq!(out, FETCH_ADD);
    }

    #[test]
    fn unaligned_fields_compare_swap() {
        // Hand-built CmpSwap: distinct byte patterns show each field's bounds.
        let mut b = [0u8; 29];
        let mut p = Packet::new_checked(&mut b[1..]).expect("len");
        p.set_va(Iova(0x0102_0304_0506_0708));
        p.set_rkey(Rkey(0x090a_0b0c));
        p.set_swap_add(0x1112_1314_1516_1718);
        p.set_compare(0x2122_2324_2526_2728);
        assert_eq!(b[0], 0);
        assert_eq!(&b[1..9], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(&b[9..13], &[9, 10, 11, 12]);
        assert_eq!(
            &b[13..21],
            &[0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18]
        );
        assert_eq!(
            &b[21..29],
            &[0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x27, 0x28]
        );
        assert!(matches!(
            Packet::new_checked(&b[2..]),
            Err(super::super::Error::Truncated {
                header: Header::AtomicEth,
                need: 28,
                have: 27
            })
        ));
    }

    proptest! {
        #[test]
        fn repr_round_trips(va in any::<u64>(), k in any::<u32>(), s in any::<u64>(), c in any::<u64>()) {
            let repr = Repr { va: Iova(va), rkey: Rkey(k), swap_add: s, compare: c };
            let mut buf = [0u8; HEADER_LEN];
            repr.emit(&mut Packet::new_unchecked(&mut buf[..]));
            prop_assert_eq!(Repr::parse(&Packet::new_unchecked(&buf[..])), Ok(repr));
        }
    }
}
