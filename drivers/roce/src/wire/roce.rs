//! A whole RoCEv2 transport packet: BTH, the opcode's extension headers,
//! payload, pad and ICRC — exactly the payload of the UDP datagram.
//!
//! [`Packet`] is a zero-copy view; [`Repr`] aggregates the header reprs and
//! the payload length and emits the packet (headers, payload, zero pad,
//! PadCnt = (−len)&3). The ICRC trailer is left zero by `emit`: fill it with
//! [`icrc`](super::icrc) once the IP/UDP context is known.

use super::opcode::{ExtHeader, OpcodeInfo};
use super::{
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, Error, Header, IethRepr,
    ImmDtRepr, Opcode, Result, RethRepr, aeth, atomic_ack_eth, atomic_eth, bth, deth, ieth, immdt,
    reth,
};

/// ICRC trailer length in bytes.
pub const ICRC_LEN: usize = 4;

/// The smallest possible RoCE packet: BTH and ICRC.
pub const MIN_LEN: usize = bth::HEADER_LEN + ICRC_LEN;

/// Pad bytes after a payload of `payload_len` bytes: `(−len) & 3`.
pub const fn pad_len(payload_len: usize) -> usize {
    payload_len.wrapping_neg() & 3
}

/// The receiver's payload length (rxe `payload_size`): UDP length − 8 −
/// header length − PadCnt − 4, or `None` when the UDP length is too small.
pub const fn payload_len_from_udp(
    udp_len: usize,
    header_len: usize,
    pad_count: u8,
) -> Option<usize> {
    let overhead = 8 + header_len + pad_count as usize + ICRC_LEN;
    udp_len.checked_sub(overhead)
}

/// A read/write view of a RoCEv2 packet (BTH .. ICRC).
///
/// After [`Packet::new_checked`] the buffer is known to hold the BTH, every
/// extension header of a known opcode, a pad no longer than the bytes
/// before the ICRC, and the ICRC. Every accessor is panic-free even on an
/// unchecked view (short fields read as zero, short slices are empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wrap a buffer without checking it.
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wrap a buffer, checking opcode, lengths and pad.
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let p = Packet::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Check that the buffer holds BTH + the opcode's extension headers +
    /// pad + ICRC. Unknown opcodes fail with [`Error::UnknownOpcode`].
    pub fn check_len(&self) -> Result<()> {
        let buf = self.buffer.as_ref();
        let have = buf.len();
        let bth = bth::Packet::new_checked(buf)?;
        let opcode = bth.opcode();
        let info = opcode.info().ok_or(Error::UnknownOpcode(opcode.0))?;
        let mut end = bth::HEADER_LEN;
        for &h in info.headers {
            end += h.len();
            if have < end {
                return Err(Error::Truncated {
                    header: h.into(),
                    need: end,
                    have,
                });
            }
        }
        let need = end + ICRC_LEN;
        if have < need {
            return Err(Error::Truncated {
                header: Header::Icrc,
                need,
                have,
            });
        }
        let pad = bth.pad_count();
        let available = have - need;
        if usize::from(pad) > available {
            return Err(Error::BadPad { pad, available });
        }
        Ok(())
    }

    /// Unwrap the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The whole packet (BTH .. ICRC).
    pub fn as_bytes(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// Total length, BTH to ICRC inclusive.
    pub fn total_len(&self) -> usize {
        self.buffer.as_ref().len()
    }

    /// The BTH view.
    pub fn bth(&self) -> bth::Packet<&[u8]> {
        bth::Packet::new_unchecked(self.buffer.as_ref())
    }

    /// The BTH opcode.
    pub fn opcode(&self) -> Opcode {
        self.bth().opcode()
    }

    /// The opcode's table entry (`None` only on an unchecked view).
    pub fn info(&self) -> Option<&'static OpcodeInfo> {
        self.opcode().info()
    }

    /// BTH plus extension headers (just the BTH for an unknown opcode).
    pub fn header_len(&self) -> usize {
        self.info().map_or(bth::HEADER_LEN, |i| i.header_len())
    }

    /// BTH PadCnt.
    pub fn pad_count(&self) -> u8 {
        self.bth().pad_count()
    }

    /// Payload bytes, without pad: total − headers − PadCnt − ICRC.
    pub fn payload_len(&self) -> usize {
        self.total_len()
            .saturating_sub(self.header_len() + usize::from(self.pad_count()) + ICRC_LEN)
    }

    fn payload_start(&self) -> usize {
        self.header_len()
    }

    fn icrc_start(&self) -> usize {
        self.total_len().saturating_sub(ICRC_LEN)
    }

    fn ext(&self, h: ExtHeader) -> Option<&[u8]> {
        let off = self.info()?.offset_of(h)?;
        Some(self.buffer.as_ref().get(off..).unwrap_or(&[]))
    }

    /// The RETH, when the opcode carries one.
    pub fn reth(&self) -> Option<reth::Packet<&[u8]>> {
        self.ext(ExtHeader::Reth).map(reth::Packet::new_unchecked)
    }

    /// The AETH, when the opcode carries one.
    pub fn aeth(&self) -> Option<aeth::Packet<&[u8]>> {
        self.ext(ExtHeader::Aeth).map(aeth::Packet::new_unchecked)
    }

    /// The immediate data, when the opcode carries it.
    pub fn immdt(&self) -> Option<immdt::Packet<&[u8]>> {
        self.ext(ExtHeader::ImmDt).map(immdt::Packet::new_unchecked)
    }

    /// The IETH, when the opcode carries one.
    pub fn ieth(&self) -> Option<ieth::Packet<&[u8]>> {
        self.ext(ExtHeader::Ieth).map(ieth::Packet::new_unchecked)
    }

    /// The AtomicETH, when the opcode carries one.
    pub fn atomic_eth(&self) -> Option<atomic_eth::Packet<&[u8]>> {
        self.ext(ExtHeader::AtomicEth)
            .map(atomic_eth::Packet::new_unchecked)
    }

    /// The AtomicAckETH, when the opcode carries one.
    pub fn atomic_ack_eth(&self) -> Option<atomic_ack_eth::Packet<&[u8]>> {
        self.ext(ExtHeader::AtomicAckEth)
            .map(atomic_ack_eth::Packet::new_unchecked)
    }

    /// The DETH, when the opcode carries one.
    pub fn deth(&self) -> Option<deth::Packet<&[u8]>> {
        self.ext(ExtHeader::Deth).map(deth::Packet::new_unchecked)
    }

    /// The 16 reserved bytes of a CNP.
    pub fn cnp_reserved(&self) -> Option<&[u8]> {
        self.ext(ExtHeader::CnpReserved)
            .map(|b| b.get(..ExtHeader::CnpReserved.len()).unwrap_or(b))
    }

    /// The payload, without pad.
    pub fn payload(&self) -> &[u8] {
        let start = self.payload_start();
        let end = start + self.payload_len();
        self.buffer.as_ref().get(start..end).unwrap_or(&[])
    }

    /// The pad bytes (PadCnt of them).
    pub fn pad(&self) -> &[u8] {
        let start = self.payload_start() + self.payload_len();
        let end = self.icrc_start();
        self.buffer.as_ref().get(start..end).unwrap_or(&[])
    }

    /// Everything the ICRC covers in this packet: BTH .. end of pad.
    pub fn covered(&self) -> &[u8] {
        self.buffer.as_ref().get(..self.icrc_start()).unwrap_or(&[])
    }

    /// The ICRC trailer, read little-endian (the order rxe and hardware append it).
    pub fn icrc(&self) -> u32 {
        let b = self.buffer.as_ref();
        let t = b
            .get(self.icrc_start()..)
            .and_then(|t| t.first_chunk::<4>())
            .copied();
        t.map_or(0, u32::from_le_bytes)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    fn ext_mut(&mut self, h: ExtHeader) -> Option<&mut [u8]> {
        let off = self.info()?.offset_of(h)?;
        let buf = self.buffer.as_mut();
        let len = buf.len();
        buf.get_mut(off.min(len)..)
    }

    /// The BTH, writable.
    pub fn bth_mut(&mut self) -> bth::Packet<&mut [u8]> {
        bth::Packet::new_unchecked(self.buffer.as_mut())
    }

    /// The RETH, writable.
    pub fn reth_mut(&mut self) -> Option<reth::Packet<&mut [u8]>> {
        self.ext_mut(ExtHeader::Reth)
            .map(reth::Packet::new_unchecked)
    }

    /// The AETH, writable.
    pub fn aeth_mut(&mut self) -> Option<aeth::Packet<&mut [u8]>> {
        self.ext_mut(ExtHeader::Aeth)
            .map(aeth::Packet::new_unchecked)
    }

    /// The immediate data, writable.
    pub fn immdt_mut(&mut self) -> Option<immdt::Packet<&mut [u8]>> {
        self.ext_mut(ExtHeader::ImmDt)
            .map(immdt::Packet::new_unchecked)
    }

    /// The IETH, writable.
    pub fn ieth_mut(&mut self) -> Option<ieth::Packet<&mut [u8]>> {
        self.ext_mut(ExtHeader::Ieth)
            .map(ieth::Packet::new_unchecked)
    }

    /// The AtomicETH, writable.
    pub fn atomic_eth_mut(&mut self) -> Option<atomic_eth::Packet<&mut [u8]>> {
        self.ext_mut(ExtHeader::AtomicEth)
            .map(atomic_eth::Packet::new_unchecked)
    }

    /// The AtomicAckETH, writable.
    pub fn atomic_ack_eth_mut(&mut self) -> Option<atomic_ack_eth::Packet<&mut [u8]>> {
        self.ext_mut(ExtHeader::AtomicAckEth)
            .map(atomic_ack_eth::Packet::new_unchecked)
    }

    /// The DETH, writable.
    pub fn deth_mut(&mut self) -> Option<deth::Packet<&mut [u8]>> {
        self.ext_mut(ExtHeader::Deth)
            .map(deth::Packet::new_unchecked)
    }

    /// The payload, writable (without pad).
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let start = self.payload_start();
        let end = start + self.payload_len();
        self.buffer.as_mut().get_mut(start..end).unwrap_or(&mut [])
    }

    /// Write the ICRC trailer (little-endian).
    pub fn set_icrc(&mut self, value: u32) {
        let start = self.icrc_start();
        if let Some(t) = self
            .buffer
            .as_mut()
            .get_mut(start..)
            .and_then(|t| t.first_chunk_mut::<4>())
        {
            *t = value.to_le_bytes();
        }
    }
}

/// A parsed RoCEv2 packet: the header reprs and the payload length.
///
/// Exactly the extension headers the opcode carries are `Some`. `emit`
/// rejects a repr whose headers disagree with its opcode, and writes
/// PadCnt = (−payload_len)&3 whatever `bth.pad_count` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// The BTH.
    pub bth: BthRepr,
    /// RETH (WRITE FIRST/ONLY, READ REQUEST).
    pub reth: Option<RethRepr>,
    /// AETH (ACK, atomic ACK, READ response FIRST/LAST/ONLY).
    pub aeth: Option<AethRepr>,
    /// Immediate data (… WITH_IMMEDIATE).
    pub immdt: Option<ImmDtRepr>,
    /// IETH (SEND … WITH_INVALIDATE).
    pub ieth: Option<IethRepr>,
    /// AtomicETH (COMPARE_SWAP, FETCH_ADD).
    pub atomic_eth: Option<AtomicEthRepr>,
    /// AtomicAckETH (ATOMIC_ACKNOWLEDGE).
    pub atomic_ack_eth: Option<AtomicAckEthRepr>,
    /// DETH (UD).
    pub deth: Option<DethRepr>,
    /// Payload bytes, without pad.
    pub payload_len: usize,
}

impl Repr {
    /// A repr with only a BTH (add extension headers with the `with_*` methods).
    pub const fn new(bth: BthRepr, payload_len: usize) -> Repr {
        Repr {
            bth,
            reth: None,
            aeth: None,
            immdt: None,
            ieth: None,
            atomic_eth: None,
            atomic_ack_eth: None,
            deth: None,
            payload_len,
        }
    }

    /// With a RETH.
    #[must_use]
    pub const fn with_reth(mut self, reth: RethRepr) -> Repr {
        self.reth = Some(reth);
        self
    }

    /// With an AETH.
    #[must_use]
    pub const fn with_aeth(mut self, aeth: AethRepr) -> Repr {
        self.aeth = Some(aeth);
        self
    }

    /// With immediate data.
    #[must_use]
    pub const fn with_immdt(mut self, immdt: ImmDtRepr) -> Repr {
        self.immdt = Some(immdt);
        self
    }

    /// With an IETH.
    #[must_use]
    pub const fn with_ieth(mut self, ieth: IethRepr) -> Repr {
        self.ieth = Some(ieth);
        self
    }

    /// With an AtomicETH.
    #[must_use]
    pub const fn with_atomic_eth(mut self, atomic_eth: AtomicEthRepr) -> Repr {
        self.atomic_eth = Some(atomic_eth);
        self
    }

    /// With an AtomicAckETH.
    #[must_use]
    pub const fn with_atomic_ack_eth(mut self, atomic_ack_eth: AtomicAckEthRepr) -> Repr {
        self.atomic_ack_eth = Some(atomic_ack_eth);
        self
    }

    /// With a DETH.
    #[must_use]
    pub const fn with_deth(mut self, deth: DethRepr) -> Repr {
        self.deth = Some(deth);
        self
    }

    /// Parse a packet view (checked again here, so an unchecked view is fine).
    /// Fails with [`Error::UnexpectedPayload`] when an opcode without payload
    /// (ACK, READ request, atomics, CNP) has bytes before the ICRC.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr> {
        packet.check_len()?;
        let info = packet
            .info()
            .ok_or(Error::UnknownOpcode(packet.opcode().0))?;
        let payload_len = packet.payload_len();
        if !info.has_payload() && payload_len != 0 {
            return Err(Error::UnexpectedPayload {
                opcode: info.opcode,
                len: payload_len,
            });
        }
        Ok(Repr {
            bth: BthRepr::parse(&packet.bth())?,
            reth: packet.reth().map(|p| RethRepr::parse(&p)).transpose()?,
            aeth: packet.aeth().map(|p| AethRepr::parse(&p)).transpose()?,
            immdt: packet.immdt().map(|p| ImmDtRepr::parse(&p)).transpose()?,
            ieth: packet.ieth().map(|p| IethRepr::parse(&p)).transpose()?,
            atomic_eth: packet
                .atomic_eth()
                .map(|p| AtomicEthRepr::parse(&p))
                .transpose()?,
            atomic_ack_eth: packet
                .atomic_ack_eth()
                .map(|p| AtomicAckEthRepr::parse(&p))
                .transpose()?,
            deth: packet.deth().map(|p| DethRepr::parse(&p)).transpose()?,
            payload_len,
        })
    }

    /// The opcode's table entry, or [`Error::UnknownOpcode`].
    pub fn info(&self) -> Result<&'static OpcodeInfo> {
        self.bth
            .opcode
            .info()
            .ok_or(Error::UnknownOpcode(self.bth.opcode.0))
    }

    /// BTH plus extension headers (BTH only for an unknown opcode).
    pub fn header_len(&self) -> usize {
        self.info().map_or(bth::HEADER_LEN, |i| i.header_len())
    }

    /// Pad bytes `emit` writes: (−payload_len) & 3.
    pub const fn pad_len(&self) -> usize {
        pad_len(self.payload_len)
    }

    /// The whole packet's length: headers + payload + pad + ICRC.
    pub fn buffer_len(&self) -> usize {
        self.header_len() + self.payload_len + self.pad_len() + ICRC_LEN
    }

    fn validate(&self) -> Result<&'static OpcodeInfo> {
        let info = self.info()?;
        let present = [
            (ExtHeader::Reth, self.reth.is_some()),
            (ExtHeader::Aeth, self.aeth.is_some()),
            (ExtHeader::ImmDt, self.immdt.is_some()),
            (ExtHeader::Ieth, self.ieth.is_some()),
            (ExtHeader::AtomicEth, self.atomic_eth.is_some()),
            (ExtHeader::AtomicAckEth, self.atomic_ack_eth.is_some()),
            (ExtHeader::Deth, self.deth.is_some()),
        ];
        for (header, is_some) in present {
            match (info.has(header), is_some) {
                (true, false) => {
                    return Err(Error::MissingHeader {
                        opcode: info.opcode,
                        header,
                    });
                }
                (false, true) => {
                    return Err(Error::UnexpectedHeader {
                        opcode: info.opcode,
                        header,
                    });
                }
                _ => {}
            }
        }
        if !info.has_payload() && self.payload_len != 0 {
            return Err(Error::UnexpectedPayload {
                opcode: info.opcode,
                len: self.payload_len,
            });
        }
        Ok(info)
    }

    /// Write the headers, zero the pad and the ICRC, and return the payload
    /// offset; the caller then writes `payload_len` bytes there (e.g.
    /// straight from a memory region, without an intermediate copy).
    pub fn emit_headers(&self, buffer: &mut [u8]) -> Result<usize> {
        let info = self.validate()?;
        let need = self.buffer_len();
        let have = buffer.len();
        let buf = buffer
            .get_mut(..need)
            .ok_or(Error::BufferTooSmall { need, have })?;
        let mut bth = self.bth;
        // pad_len() < 4, so the cast is lossless.
        bth.pad_count = self.pad_len() as u8;
        bth.emit(&mut bth::Packet::new_unchecked(&mut *buf));
        let mut off = bth::HEADER_LEN;
        for &h in info.headers {
            let dst = buf.get_mut(off..).unwrap_or(&mut []);
            match h {
                ExtHeader::Reth => {
                    emit_opt(self.reth, |r| r.emit(&mut reth::Packet::new_unchecked(dst)))
                }
                ExtHeader::Aeth => {
                    emit_opt(self.aeth, |r| r.emit(&mut aeth::Packet::new_unchecked(dst)))
                }
                ExtHeader::ImmDt => emit_opt(self.immdt, |r| {
                    r.emit(&mut immdt::Packet::new_unchecked(dst))
                }),
                ExtHeader::Ieth => {
                    emit_opt(self.ieth, |r| r.emit(&mut ieth::Packet::new_unchecked(dst)))
                }
                ExtHeader::AtomicEth => emit_opt(self.atomic_eth, |r| {
                    r.emit(&mut atomic_eth::Packet::new_unchecked(dst))
                }),
                ExtHeader::AtomicAckEth => emit_opt(self.atomic_ack_eth, |r| {
                    r.emit(&mut atomic_ack_eth::Packet::new_unchecked(dst))
                }),
                ExtHeader::Deth => {
                    emit_opt(self.deth, |r| r.emit(&mut deth::Packet::new_unchecked(dst)))
                }
                ExtHeader::CnpReserved => dst.iter_mut().take(h.len()).for_each(|b| *b = 0),
            }
            off += h.len();
        }
        let payload_end = off + self.payload_len;
        if let Some(tail) = buf.get_mut(payload_end..) {
            tail.fill(0);
        }
        Ok(off)
    }

    /// Write the whole packet: headers, `payload`, zero pad and a zero ICRC
    /// (fill it with [`icrc`](super::icrc)). Returns [`Repr::buffer_len`].
    pub fn emit(&self, buffer: &mut [u8], payload: &[u8]) -> Result<usize> {
        if payload.len() != self.payload_len {
            return Err(Error::PayloadLength {
                expected: self.payload_len,
                given: payload.len(),
            });
        }
        let off = self.emit_headers(buffer)?;
        if let Some(dst) = buffer.get_mut(off..off + payload.len()) {
            dst.copy_from_slice(payload);
        }
        Ok(self.buffer_len())
    }
}

fn emit_opt<R>(repr: Option<R>, emit: impl FnOnce(R)) {
    if let Some(r) = repr {
        emit(r);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rnic_core::{Iova, Psn, Qpn, Rkey};

    #[test]
    fn pad_rule_for_lengths_0_to_8() {
        let want = [0, 3, 2, 1, 0, 3, 2, 1, 0];
        for (len, &pad) in want.iter().enumerate() {
            assert_eq!(pad_len(len), pad, "len {len}");
            assert_eq!((len + pad) % 4, 0);
        }
        // The receiver recovers the payload length from the UDP length:
        // UDP 8 + BTH 12 + len + pad + ICRC 4.
        for (len, &pad) in want.iter().enumerate() {
            let udp_len = 8 + 12 + len + pad + 4;
            assert_eq!(payload_len_from_udp(udp_len, 12, pad as u8), Some(len));
        }
        assert_eq!(payload_len_from_udp(23, 12, 0), None);
    }

    #[test]
    fn emit_pads_and_parses_back() {
        for len in 0..=8usize {
            let bth = BthRepr::new(
                Opcode::RC_SEND_ONLY,
                Qpn::from_wire(0x11),
                Psn::from_wire(5),
            );
            let repr = Repr::new(bth, len);
            let payload: Vec<u8> = (1..=len as u8).collect();
            let mut buf = vec![0xEEu8; repr.buffer_len() + 3];
            let n = repr.emit(&mut buf, &payload).expect("emit");
            assert_eq!(n, 12 + len + pad_len(len) + 4);
            assert_eq!(n % 4, 0);
            assert_eq!(buf[1] >> 4 & 3, pad_len(len) as u8);
            let p = Packet::new_checked(&buf[..n]).expect("check");
            assert_eq!(p.payload(), &payload[..]);
            assert_eq!(p.payload_len(), len);
            assert!(p.pad().iter().all(|&b| b == 0));
            assert_eq!(p.pad().len(), pad_len(len));
            assert_eq!(p.icrc(), 0);
            let mut back = Repr::parse(&p).expect("parse");
            assert_eq!(back.bth.pad_count as usize, pad_len(len));
            back.bth.pad_count = 0;
            assert_eq!(back, repr);
            assert_eq!(buf[n], 0xEE, "emit wrote past buffer_len");
        }
    }

    #[test]
    fn emit_rejects_inconsistent_reprs() {
        let bth = BthRepr::new(
            Opcode::RC_RDMA_WRITE_FIRST,
            Qpn::from_wire(1),
            Psn::from_wire(0),
        );
        let mut buf = [0u8; 2048];
        let r = Repr::new(bth, 1024);
        assert_eq!(
            r.emit(&mut buf, &[0; 1024]),
            Err(Error::MissingHeader {
                opcode: Opcode::RC_RDMA_WRITE_FIRST,
                header: ExtHeader::Reth
            })
        );
        let reth = RethRepr {
            va: Iova(0x1000),
            rkey: Rkey(7),
            dma_len: 4096,
        };
        let r = r.with_reth(reth).with_immdt(ImmDtRepr { imm: 1 });
        assert_eq!(
            r.emit(&mut buf, &[0; 1024]),
            Err(Error::UnexpectedHeader {
                opcode: Opcode::RC_RDMA_WRITE_FIRST,
                header: ExtHeader::ImmDt
            })
        );
        let r = Repr { immdt: None, ..r };
        assert_eq!(
            r.emit(&mut buf, &[0; 10]),
            Err(Error::PayloadLength {
                expected: 1024,
                given: 10
            })
        );
        assert_eq!(
            r.emit(&mut buf[..100], &[0; 1024]),
            Err(Error::BufferTooSmall {
                need: 1056,
                have: 100
            })
        );
        assert_eq!(r.emit(&mut buf, &[0; 1024]), Ok(1056));
        let ack = Repr::new(
            BthRepr::new(Opcode::RC_ACKNOWLEDGE, Qpn::from_wire(1), Psn::from_wire(0)),
            4,
        );
        let ack = ack.with_aeth(AethRepr {
            syndrome: super::super::Syndrome::ACK_UNLIMITED,
            msn: 0,
        });
        assert_eq!(
            ack.emit(&mut buf, &[0; 4]),
            Err(Error::UnexpectedPayload {
                opcode: Opcode::RC_ACKNOWLEDGE,
                len: 4
            })
        );
        let unknown = Repr::new(
            BthRepr::new(Opcode(0x1c), Qpn::from_wire(1), Psn::from_wire(0)),
            0,
        );
        assert_eq!(unknown.emit(&mut buf, &[]), Err(Error::UnknownOpcode(0x1c)));
    }

    #[test]
    fn check_len_errors() {
        // ACK (needs 12 + 4 + 4 bytes).
        let mut ack = [0u8; 20];
        ack[0] = 0x11;
        assert!(Packet::new_checked(&ack[..]).is_ok());
        assert_eq!(
            Packet::new_checked(&ack[..15]),
            Err(Error::Truncated {
                header: Header::Aeth,
                need: 16,
                have: 15
            })
        );
        assert_eq!(
            Packet::new_checked(&ack[..19]),
            Err(Error::Truncated {
                header: Header::Icrc,
                need: 20,
                have: 19
            })
        );
        assert_eq!(
            Packet::new_checked(&ack[..5]),
            Err(Error::Truncated {
                header: Header::Bth,
                need: 12,
                have: 5
            })
        );
        // Pad count larger than the bytes present.
        let mut send = [0u8; 18];
        send[0] = 0x04;
        send[1] = 0x30;
        assert_eq!(
            Packet::new_checked(&send[..]),
            Err(Error::BadPad {
                pad: 3,
                available: 2
            })
        );
        send[1] = 0x20;
        let p = Packet::new_checked(&send[..]).expect("pad 2 of 2");
        assert_eq!(p.payload_len(), 0);
        assert_eq!(p.pad().len(), 2);
        // Unknown opcode.
        send[0] = 0x40;
        assert_eq!(
            Packet::new_checked(&send[..]),
            Err(Error::UnknownOpcode(0x40))
        );
        // An unchecked view of garbage still answers without panicking.
        let p = Packet::new_unchecked(&send[..3]);
        assert_eq!(
            (p.payload(), p.pad(), p.icrc(), p.payload_len()),
            (&[][..], &[][..], 0, 0)
        );
        assert!(p.reth().is_none());
    }

    #[test]
    fn write_only_with_immediate_layout() {
        let bth = BthRepr::new(
            Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE,
            Qpn::from_wire(0x12),
            Psn::from_wire(9),
        );
        let repr = Repr::new(bth, 3)
            .with_reth(RethRepr {
                va: Iova(0x1122_3344_5566_7788),
                rkey: Rkey(0x99aa_bbcc),
                dma_len: 3,
            })
            .with_immdt(ImmDtRepr { imm: 0xdead_beef });
        let mut buf = [0u8; 40];
        let n = repr.emit(&mut buf, b"abc").expect("emit");
        assert_eq!(n, 12 + 16 + 4 + 3 + 1 + 4);
        assert_eq!(
            &buf[..12],
            &[0x0b, 0x10, 0xff, 0xff, 0, 0, 0, 0x12, 0, 0, 0, 9]
        );
        assert_eq!(
            &buf[12..28],
            &[
                0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0, 0, 0, 3
            ]
        );
        assert_eq!(&buf[28..32], &[0xde, 0xad, 0xbe, 0xef]);
        assert_eq!(&buf[32..36], b"abc\0");
        let p = Packet::new_checked(&buf[..n]).expect("check");
        assert_eq!(p.immdt().map(|i| i.imm()), Some(0xdead_beef));
        assert_eq!(p.reth().map(|r| r.rkey()), Some(Rkey(0x99aa_bbcc)));
        assert_eq!(p.payload(), b"abc");
    }
}
