//! RDMA Extended Transport Header (16 bytes; rocev2.md §4): in RDMA WRITE
//! FIRST/ONLY and RDMA READ REQUEST.

use rnic_core::{Iova, Rkey};

use super::bytes::{self, read_u32, read_u64, write_u32, write_u64};
use super::{Header, Result};

/// RETH length in bytes.
pub const HEADER_LEN: usize = 16;

mod field {
    use super::bytes::Field;

    pub const VA: Field = 0..8;
    pub const RKEY: Field = 8..12;
    pub const DMA_LEN: Field = 12..16;
}

/// A read/write view of a RETH at the start of a buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wrap a buffer without checking its length (accessors never panic;
    /// missing bytes read as zero, writes past the end are dropped).
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wrap a buffer, checking that it holds a whole RETH.
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let p = Packet::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Check that the buffer holds a whole RETH.
    pub fn check_len(&self) -> Result<()> {
        bytes::need(Header::Reth, HEADER_LEN, self.buffer.as_ref().len())
    }

    /// Unwrap the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Virtual address (remote IOVA).
    pub fn va(&self) -> Iova {
        Iova(read_u64(self.buffer.as_ref(), field::VA))
    }

    /// R_Key.
    pub fn rkey(&self) -> Rkey {
        Rkey(read_u32(self.buffer.as_ref(), field::RKEY))
    }

    /// DMA length: bytes of the whole WRITE/READ (rxe: bytes remaining).
    pub fn dma_len(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::DMA_LEN)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set the virtual address.
    pub fn set_va(&mut self, value: Iova) {
        write_u64(self.buffer.as_mut(), field::VA, value.get());
    }

    /// Set the R_Key.
    pub fn set_rkey(&mut self, value: Rkey) {
        write_u32(self.buffer.as_mut(), field::RKEY, value.get());
    }

    /// Set the DMA length.
    pub fn set_dma_len(&mut self, value: u32) {
        write_u32(self.buffer.as_mut(), field::DMA_LEN, value);
    }
}

/// A parsed RETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Remote virtual address.
    pub va: Iova,
    /// Remote key.
    pub rkey: Rkey,
    /// DMA length in bytes.
    pub dma_len: u32,
}

impl Repr {
    /// Parse a RETH view.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            va: packet.va(),
            rkey: packet.rkey(),
            dma_len: packet.dma_len(),
        })
    }

    /// Bytes `emit` writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Write the RETH.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_va(self.va);
        packet.set_rkey(self.rkey);
        packet.set_dma_len(self.dma_len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// RETH of capture packet 381 (RC RDMA WRITE FIRST, ib_write_bw -s 16384).
    const WRITE_FIRST: [u8; 16] = [
        0x00, 0x00, 0x56, 0x50, 0x48, 0x10, 0x90, 0x00, 0x00, 0x00, 0x03, 0x24, 0x00, 0x00, 0x40,
        0x00,
    ];
    /// RETH of capture packet 1231 (RC RDMA READ REQUEST, ib_read_bw -s 8192).
    const READ_REQUEST: [u8; 16] = [
        0x00, 0x00, 0x56, 0x4f, 0x80, 0x5b, 0xf0, 0x00, 0x00, 0x00, 0x04, 0x94, 0x00, 0x00, 0x20,
        0x00,
    ];

    fn round_trip(bytes: &[u8; 16]) -> Repr {
        let r = Repr::parse(&Packet::new_checked(&bytes[..]).expect("len")).expect("parse");
        let mut out = [0u8; 16];
        r.emit(&mut Packet::new_checked(&mut out[..]).expect("len"));
        assert_eq!(&out, bytes);
        r
    }

    #[test]
    fn capture_write_first() {
        let r = round_trip(&WRITE_FIRST);
        assert_eq!(r.va, Iova(0x0000_5650_4810_9000));
        assert_eq!(r.rkey, Rkey(0x324));
        assert_eq!(r.dma_len, 16384);
    }

    #[test]
    fn capture_read_request() {
        let r = round_trip(&READ_REQUEST);
        assert_eq!(r.va, Iova(0x0000_564f_805b_f000));
        assert_eq!(r.rkey, Rkey(0x494));
        assert_eq!(r.dma_len, 8192);
    }

    #[test]
    fn truncated() {
        assert!(matches!(
            Packet::new_checked(&WRITE_FIRST[..15]),
            Err(super::super::Error::Truncated {
                header: Header::Reth,
                need: 16,
                have: 15
            })
        ));
    }

    proptest! {
        #[test]
        fn repr_round_trips(va in any::<u64>(), rkey in any::<u32>(), len in any::<u32>()) {
            let repr = Repr { va: Iova(va), rkey: Rkey(rkey), dma_len: len };
            let mut buf = [0u8; HEADER_LEN];
            repr.emit(&mut Packet::new_unchecked(&mut buf[..]));
            prop_assert_eq!(Repr::parse(&Packet::new_unchecked(&buf[..])), Ok(repr));
        }
    }
}
