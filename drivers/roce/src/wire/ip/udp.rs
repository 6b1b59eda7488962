//! UDP header (8 bytes).

use super::super::bytes::{self, read_u16, write_u16};
use super::super::{Error, Header, Result};

/// UDP header length.
pub const HEADER_LEN: usize = 8;

/// The RoCEv2 UDP destination port (`ROCE_V2_UDP_DPORT`).
pub const ROCE_V2_PORT: u16 = 4791;

mod field {
    use super::bytes::Field;

    pub const SRC_PORT: Field = 0..2;
    pub const DST_PORT: Field = 2..4;
    pub const LENGTH: Field = 4..6;
    pub const CHECKSUM: Field = 6..8;
}

/// A read/write view of a UDP datagram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wrap a buffer without checking it (accessors never panic).
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wrap a buffer, checking the header and the length field.
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let p = Packet::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Check that the buffer holds the header and `8 <= length <= buffer`.
    pub fn check_len(&self) -> Result<()> {
        let have = self.buffer.as_ref().len();
        bytes::need(Header::Udp, HEADER_LEN, have)?;
        let len = usize::from(self.len());
        if len < HEADER_LEN {
            return Err(Error::BadLength {
                header: Header::Udp,
                field: len,
                available: HEADER_LEN,
            });
        }
        if len > have {
            return Err(Error::BadLength {
                header: Header::Udp,
                field: len,
                available: have,
            });
        }
        Ok(())
    }

    /// Unwrap the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Source port (per-flow entropy for RoCEv2).
    pub fn src_port(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::SRC_PORT)
    }

    /// Destination port (4791 for RoCEv2).
    pub fn dst_port(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::DST_PORT)
    }

    /// Length field: header + payload.
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::LENGTH)
    }

    /// Checksum field (rxe sends 0; RoCEv2 receivers rely on the ICRC).
    pub fn checksum(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::CHECKSUM)
    }

    /// The payload: bytes 8 .. length.
    pub fn payload(&self) -> &[u8] {
        let end = usize::from(self.len());
        self.buffer.as_ref().get(HEADER_LEN..end).unwrap_or(&[])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set the source port.
    pub fn set_src_port(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::SRC_PORT, value);
    }

    /// Set the destination port.
    pub fn set_dst_port(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::DST_PORT, value);
    }

    /// Set the length field.
    pub fn set_len(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::LENGTH, value);
    }

    /// Set the checksum field.
    pub fn set_checksum(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::CHECKSUM, value);
    }

    /// The payload, writable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let end = usize::from(self.len());
        self.buffer
            .as_mut()
            .get_mut(HEADER_LEN..end)
            .unwrap_or(&mut [])
    }
}

/// A parsed UDP header. The checksum is carried as-is (not verified, not
/// computed) so captured datagrams re-emit byte for byte; RoCEv2 senders
/// put 0 there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
    /// Checksum field, emitted verbatim.
    pub checksum: u16,
    /// Payload bytes after the header.
    pub payload_len: usize,
}

impl Repr {
    /// Parse a header.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            src_port: packet.src_port(),
            dst_port: packet.dst_port(),
            checksum: packet.checksum(),
            payload_len: usize::from(packet.len()).saturating_sub(HEADER_LEN),
        })
    }

    /// Header plus payload.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN + self.payload_len
    }

    /// Write the header into the start of `buffer` (the payload is the caller's).
    pub fn emit(&self, buffer: &mut [u8]) -> Result<()> {
        let len = self.buffer_len();
        let len16 = u16::try_from(len).map_err(|_| Error::TooLong {
            header: Header::Udp,
            len,
        })?;
        let have = buffer.len();
        let hdr = buffer.get_mut(..HEADER_LEN).ok_or(Error::BufferTooSmall {
            need: HEADER_LEN,
            have,
        })?;
        let mut p = Packet::new_unchecked(hdr);
        p.set_src_port(self.src_port);
        p.set_dst_port(self.dst_port);
        p.set_len(len16);
        p.set_checksum(self.checksum);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// UDP header of the ConnectX-4 Lx CNP (rocev2.md §6.1): src port 0, checksum 0.
    const CNP: [u8; 8] = [0x00, 0x00, 0x12, 0xb7, 0x00, 0x28, 0x00, 0x00];
    /// UDP header of the scapy UC SEND_ONLY (rocev2.md §6.2).
    const SCAPY: [u8; 8] = [0xc0, 0x00, 0x12, 0xb7, 0x00, 0x2c, 0xac, 0xa2];

    #[test]
    fn golden() {
        let mut buf = [0u8; 44];
        buf[..8].copy_from_slice(&SCAPY);
        let p = Packet::new_checked(&buf[..]).expect("check");
        assert_eq!(
            (p.src_port(), p.dst_port(), p.len(), p.checksum()),
            (49152, ROCE_V2_PORT, 44, 0xaca2)
        );
        assert_eq!(p.payload().len(), 36);
        let r = Repr::parse(&p).expect("parse");
        let mut out = [0u8; 8];
        r.emit(&mut out).expect("emit");
        assert_eq!(out, SCAPY);
        let mut buf = [0u8; 40];
        buf[..8].copy_from_slice(&CNP);
        let r = Repr::parse(&Packet::new_checked(&buf[..]).expect("check")).expect("parse");
        assert_eq!(
            r,
            Repr {
                src_port: 0,
                dst_port: 4791,
                checksum: 0,
                payload_len: 32
            }
        );
        assert_eq!(
            Packet::new_checked(&buf[..39]),
            Err(Error::BadLength {
                header: Header::Udp,
                field: 40,
                available: 39
            })
        );
        buf[5] = 7;
        assert_eq!(
            Packet::new_checked(&buf[..]),
            Err(Error::BadLength {
                header: Header::Udp,
                field: 7,
                available: 8
            })
        );
    }

    proptest! {
        #[test]
        fn repr_round_trips(s in any::<u16>(), d in any::<u16>(), c in any::<u16>(), len in 0usize..100) {
            let repr = Repr { src_port: s, dst_port: d, checksum: c, payload_len: len };
            let mut buf = vec![0u8; repr.buffer_len()];
            repr.emit(&mut buf).expect("emit");
            prop_assert_eq!(Repr::parse(&Packet::new_checked(&buf[..]).expect("check")), Ok(repr));
        }
    }
}
