//! Base Transport Header (12 bytes; rocev2.md §2).

use rnic_core::{Psn, Qpn};

use super::bytes::{self, read_u8, read_u16, read_u24, write_flag, write_u8, write_u16, write_u24};
use super::{Header, Opcode, Result};

/// BTH length in bytes.
pub const HEADER_LEN: usize = 12;

/// The default (full-membership) partition key, which rxe always sends.
pub const DEFAULT_PKEY: u16 = 0xFFFF;

mod field {
    #![allow(dead_code)]
    use super::bytes::Field;

    pub const OPCODE: usize = 0;
    /// SE (bit 7), MigReq (6), PadCnt (5:4), TVer (3:0).
    pub const FLAGS: usize = 1;
    pub const PKEY: Field = 2..4;
    /// FECN (bit 7), BECN (6), Resv6a (5:0): "Resv8a", masked in the ICRC.
    pub const CN: usize = 4;
    pub const DEST_QP: Field = 5..8;
    /// AckReq (bit 7), Resv7 (6:0).
    pub const ACK: usize = 8;
    pub const PSN: Field = 9..12;

    pub const SE: u8 = 0x80;
    pub const MIG: u8 = 0x40;
    pub const PAD_SHIFT: u8 = 4;
    pub const PAD_MASK: u8 = 0x30;
    pub const TVER_MASK: u8 = 0x0F;
    pub const FECN: u8 = 0x80;
    pub const BECN: u8 = 0x40;
    pub const RESV6A: u8 = 0x3F;
    pub const ACK_REQ: u8 = 0x80;
    pub const RESV7: u8 = 0x7F;
}

/// A read/write view of a BTH at the start of a buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wrap a buffer without checking its length. Accessors never panic:
    /// on a short buffer missing bytes read as zero and writes are dropped.
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wrap a buffer, checking that it holds a whole BTH.
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let p = Packet::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Check that the buffer holds a whole BTH.
    pub fn check_len(&self) -> Result<()> {
        bytes::need(Header::Bth, HEADER_LEN, self.buffer.as_ref().len())
    }

    /// Unwrap the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// OpCode.
    pub fn opcode(&self) -> Opcode {
        Opcode(read_u8(self.b(), field::OPCODE))
    }

    /// SE: the requester asks for a solicited event.
    pub fn solicited(&self) -> bool {
        read_u8(self.b(), field::FLAGS) & field::SE != 0
    }

    /// M: the MigReq bit (APM state; rxe always sends 0).
    pub fn mig_req(&self) -> bool {
        read_u8(self.b(), field::FLAGS) & field::MIG != 0
    }

    /// PadCnt: pad bytes (0..=3) between payload and ICRC.
    pub fn pad_count(&self) -> u8 {
        (read_u8(self.b(), field::FLAGS) & field::PAD_MASK) >> field::PAD_SHIFT
    }

    /// TVer: transport header version (0).
    pub fn tver(&self) -> u8 {
        read_u8(self.b(), field::FLAGS) & field::TVER_MASK
    }

    /// P_Key.
    pub fn pkey(&self) -> u16 {
        read_u16(self.b(), field::PKEY)
    }

    /// FECN: forward explicit congestion notification.
    pub fn fecn(&self) -> bool {
        read_u8(self.b(), field::CN) & field::FECN != 0
    }

    /// BECN: backward explicit congestion notification (set in CNPs).
    pub fn becn(&self) -> bool {
        read_u8(self.b(), field::CN) & field::BECN != 0
    }

    /// The six reserved bits after FECN/BECN (Resv6a; zero on send).
    pub fn resv6a(&self) -> u8 {
        read_u8(self.b(), field::CN) & field::RESV6A
    }

    /// DestQP.
    pub fn dest_qp(&self) -> Qpn {
        Qpn::from_wire(read_u24(self.b(), field::DEST_QP))
    }

    /// AckReq: the responder must acknowledge this packet.
    pub fn ack_req(&self) -> bool {
        read_u8(self.b(), field::ACK) & field::ACK_REQ != 0
    }

    /// The seven reserved bits after AckReq (Resv7; zero on send).
    pub fn resv7(&self) -> u8 {
        read_u8(self.b(), field::ACK) & field::RESV7
    }

    /// PSN.
    pub fn psn(&self) -> Psn {
        Psn::from_wire(read_u24(self.b(), field::PSN))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    fn m(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }

    /// Set OpCode.
    pub fn set_opcode(&mut self, value: Opcode) {
        write_u8(self.m(), field::OPCODE, value.0);
    }

    /// Set SE.
    pub fn set_solicited(&mut self, value: bool) {
        write_flag(self.m(), field::FLAGS, field::SE, value);
    }

    /// Set MigReq.
    pub fn set_mig_req(&mut self, value: bool) {
        write_flag(self.m(), field::FLAGS, field::MIG, value);
    }

    /// Set PadCnt (only the low two bits of `value` are used).
    pub fn set_pad_count(&mut self, value: u8) {
        let old = read_u8(self.b(), field::FLAGS) & !field::PAD_MASK;
        write_u8(
            self.m(),
            field::FLAGS,
            old | ((value << field::PAD_SHIFT) & field::PAD_MASK),
        );
    }

    /// Set TVer (only the low four bits of `value` are used).
    pub fn set_tver(&mut self, value: u8) {
        let old = read_u8(self.b(), field::FLAGS) & !field::TVER_MASK;
        write_u8(self.m(), field::FLAGS, old | (value & field::TVER_MASK));
    }

    /// Set P_Key.
    pub fn set_pkey(&mut self, value: u16) {
        write_u16(self.m(), field::PKEY, value);
    }

    /// Set FECN.
    pub fn set_fecn(&mut self, value: bool) {
        write_flag(self.m(), field::CN, field::FECN, value);
    }

    /// Set BECN.
    pub fn set_becn(&mut self, value: bool) {
        write_flag(self.m(), field::CN, field::BECN, value);
    }

    /// Set the Resv6a bits (only the low six bits of `value` are used).
    pub fn set_resv6a(&mut self, value: u8) {
        let old = read_u8(self.b(), field::CN) & !field::RESV6A;
        write_u8(self.m(), field::CN, old | (value & field::RESV6A));
    }

    /// Set DestQP.
    pub fn set_dest_qp(&mut self, value: Qpn) {
        write_u24(self.m(), field::DEST_QP, value.get());
    }

    /// Set AckReq.
    pub fn set_ack_req(&mut self, value: bool) {
        write_flag(self.m(), field::ACK, field::ACK_REQ, value);
    }

    /// Set the Resv7 bits (only the low seven bits of `value` are used).
    pub fn set_resv7(&mut self, value: u8) {
        let old = read_u8(self.b(), field::ACK) & !field::RESV7;
        write_u8(self.m(), field::ACK, old | (value & field::RESV7));
    }

    /// Set PSN.
    pub fn set_psn(&mut self, value: Psn) {
        write_u24(self.m(), field::PSN, value.get());
    }
}

/// A parsed BTH. Reserved bits are not represented: `emit` writes them as zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// OpCode.
    pub opcode: Opcode,
    /// SE (solicited event).
    pub solicited: bool,
    /// MigReq.
    pub mig_req: bool,
    /// PadCnt (0..=3). [`RoceRepr`](super::RoceRepr) derives it from the payload length.
    pub pad_count: u8,
    /// TVer (0..=15; 0 today).
    pub tver: u8,
    /// P_Key.
    pub pkey: u16,
    /// FECN.
    pub fecn: bool,
    /// BECN.
    pub becn: bool,
    /// DestQP.
    pub dest_qp: Qpn,
    /// AckReq.
    pub ack_req: bool,
    /// PSN.
    pub psn: Psn,
}

impl Repr {
    /// A BTH as rxe sends it: P_Key 0xFFFF, every flag clear, pad 0.
    pub const fn new(opcode: Opcode, dest_qp: Qpn, psn: Psn) -> Repr {
        Repr {
            opcode,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            tver: 0,
            pkey: DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qp,
            ack_req: false,
            psn,
        }
    }

    /// Parse a BTH view (any opcode value is accepted here).
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            opcode: packet.opcode(),
            solicited: packet.solicited(),
            mig_req: packet.mig_req(),
            pad_count: packet.pad_count(),
            tver: packet.tver(),
            pkey: packet.pkey(),
            fecn: packet.fecn(),
            becn: packet.becn(),
            dest_qp: packet.dest_qp(),
            ack_req: packet.ack_req(),
            psn: packet.psn(),
        })
    }

    /// Bytes `emit` writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Write every field (reserved bits zero). The view should have been
    /// made with `new_checked`; on a short buffer the excess is dropped.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_opcode(self.opcode);
        let flags = (u8::from(self.solicited) << 7)
            | (u8::from(self.mig_req) << 6)
            | ((self.pad_count << field::PAD_SHIFT) & field::PAD_MASK)
            | (self.tver & field::TVER_MASK);
        write_u8(packet.m(), field::FLAGS, flags);
        packet.set_pkey(self.pkey);
        let cn = (u8::from(self.fecn) << 7) | (u8::from(self.becn) << 6);
        write_u8(packet.m(), field::CN, cn);
        packet.set_dest_qp(self.dest_qp);
        write_u8(packet.m(), field::ACK, u8::from(self.ack_req) << 7);
        packet.set_psn(self.psn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// BTH of capture packet 1: RC SEND_FIRST 10.0.0.2 → 10.0.0.1 (ibv_rc_pingpong).
    const SEND_FIRST: [u8; 12] = [
        0x00, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x00, 0x6a, 0xe4, 0x2e,
    ];
    /// BTH of capture packet 5: RC SEND_LAST with AckReq.
    const SEND_LAST: [u8; 12] = [
        0x02, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x80, 0x6a, 0xe4, 0x32,
    ];
    /// BTH of the ConnectX-4 Lx CNP (rocev2.md §6.1): BECN set.
    const CNP: [u8; 12] = [
        0x81, 0x00, 0xff, 0xff, 0x40, 0x00, 0x01, 0x18, 0x00, 0x00, 0x00, 0x00,
    ];
    /// BTH of the scapy UC SEND_ONLY (rocev2.md §6.2): MigReq 1, PadCnt 2.
    const UC_SEND_ONLY: [u8; 12] = [
        0x24, 0x60, 0xff, 0xff, 0x00, 0x00, 0x00, 0xd3, 0x00, 0xcf, 0x17, 0x10,
    ];

    fn round_trip(bytes: &[u8; 12]) -> Repr {
        let repr = Repr::parse(&Packet::new_checked(&bytes[..]).expect("len")).expect("parse");
        let mut out = [0u8; 12];
        repr.emit(&mut Packet::new_unchecked(&mut out[..]));
        assert_eq!(&out, bytes);
        repr
    }

    #[test]
    fn capture_send_first() {
        let r = round_trip(&SEND_FIRST);
        assert_eq!(r.opcode, Opcode::RC_SEND_FIRST);
        assert!(!r.solicited && !r.mig_req && !r.fecn && !r.becn && !r.ack_req);
        assert_eq!((r.pad_count, r.tver, r.pkey), (0, 0, 0xFFFF));
        assert_eq!(r.dest_qp, Qpn::from_wire(0x11));
        assert_eq!(r.psn, Psn::from_wire(0x6a_e42e));
        assert_eq!(
            r,
            Repr::new(
                Opcode::RC_SEND_FIRST,
                Qpn::from_wire(17),
                Psn::from_wire(7_005_230)
            )
        );
    }

    #[test]
    fn capture_send_last_ack_req() {
        let r = round_trip(&SEND_LAST);
        assert_eq!(r.opcode, Opcode::RC_SEND_LAST);
        assert!(r.ack_req);
        assert_eq!(r.psn.get(), 0x6a_e432);
        let p = Packet::new_checked(&SEND_LAST[..]).expect("len");
        assert_eq!(p.resv7(), 0);
    }

    #[test]
    fn cnp_becn() {
        let r = round_trip(&CNP);
        assert_eq!(r.opcode, Opcode::CNP);
        assert!(r.becn && !r.fecn);
        assert_eq!(r.dest_qp.get(), 0x118);
        assert_eq!(r.psn.get(), 0);
        assert_eq!(Packet::new_unchecked(&CNP[..]).resv6a(), 0);
    }

    #[test]
    fn scapy_uc_send_only_flags() {
        let r = round_trip(&UC_SEND_ONLY);
        assert_eq!(r.opcode, Opcode::UC_SEND_ONLY);
        assert!(r.mig_req && !r.solicited);
        assert_eq!(r.pad_count, 2);
        assert_eq!(r.dest_qp.get(), 211);
        assert_eq!(r.psn.get(), 13_571_856);
    }

    #[test]
    fn setters_touch_only_their_bits() {
        let mut b = [0u8; 12];
        let mut p = Packet::new_checked(&mut b[..]).expect("len");
        p.set_solicited(true);
        p.set_pad_count(3);
        p.set_tver(0xF);
        p.set_resv6a(0x3F);
        p.set_fecn(true);
        p.set_resv7(0x7F);
        p.set_ack_req(true);
        assert_eq!(b[1], 0xBF);
        assert_eq!(b[4], 0xBF);
        assert_eq!(b[8], 0xFF);
        let mut p = Packet::new_unchecked(&mut b[..]);
        p.set_pad_count(0);
        p.set_fecn(false);
        assert_eq!(p.pad_count(), 0);
        assert_eq!(p.tver(), 0xF);
        assert!(p.solicited());
        assert_eq!(b[4], 0x3F);
    }

    #[test]
    fn truncated() {
        assert_eq!(
            Packet::new_checked(&SEND_FIRST[..11]),
            Err(super::super::Error::Truncated {
                header: Header::Bth,
                need: 12,
                have: 11
            })
        );
        // Unchecked short views read zeros instead of panicking.
        let p = Packet::new_unchecked(&SEND_FIRST[..3]);
        assert_eq!(p.psn().get(), 0);
        assert_eq!(p.pkey(), 0, "a field only partly present reads as zero");
    }

    pub(crate) fn arb_repr() -> impl Strategy<Value = Repr> {
        (
            any::<u8>(),
            any::<[bool; 6]>(),
            0u8..4,
            0u8..16,
            any::<u16>(),
            0u32..=0xFF_FFFF,
            0u32..=0xFF_FFFF,
        )
            .prop_map(|(op, fl, pad, tver, pkey, qp, psn)| Repr {
                opcode: Opcode(op),
                solicited: fl[0],
                mig_req: fl[1],
                pad_count: pad,
                tver,
                pkey,
                fecn: fl[2],
                becn: fl[3],
                dest_qp: Qpn::from_wire(qp),
                ack_req: fl[4],
                psn: Psn::from_wire(psn),
            })
    }

    proptest! {
        #[test]
        fn repr_round_trips(repr in arb_repr()) {
            let mut buf = [0u8; HEADER_LEN];
            repr.emit(&mut Packet::new_checked(&mut buf[..]).expect("len"));
            let back = Repr::parse(&Packet::new_checked(&buf[..]).expect("len")).expect("parse");
            prop_assert_eq!(back, repr);
        }

        #[test]
        fn any_bytes_parse(bytes in proptest::collection::vec(any::<u8>(), 0..16)) {
            let p = Packet::new_unchecked(&bytes[..]);
            match Repr::parse(&p) {
                Ok(r) => prop_assert_eq!(r.opcode.0, bytes[0]),
                Err(e) => {
                    let truncated = matches!(e, super::super::Error::Truncated { .. });
                    prop_assert!(truncated);
                }
            }
        }
    }
}
