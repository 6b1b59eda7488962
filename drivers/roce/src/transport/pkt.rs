//! The engine's view of one RoCE packet (BTH‥ICRC): a flat parse of every
//! header the transport reads, and an emitter for the headers it writes.
//!
//! This is deliberately the transport's own narrow codec — the wire module
//! owns the full `Packet`/`Repr` views; this file only knows what the state
//! machines need and validates exactly what §9 asks the responder and
//! completer to reject (length, opcode, pad, version, P_Key).

use rnic_core::{Psn, Qpn, Rkey};

/// Bytes of the BTH.
pub(crate) const BTH_LEN: usize = 12;
/// Bytes of the ICRC trailer.
pub(crate) const ICRC_LEN: usize = 4;
/// Bytes of the RETH.
const RETH_LEN: usize = 16;
/// Bytes of AETH / ImmDt / IETH.
const WORD_LEN: usize = 4;
/// Bytes of the AtomicETH.
const ATOMIC_ETH_LEN: usize = 28;
/// Bytes of the AtomicAckETH.
const ATOMIC_ACK_LEN: usize = 8;
/// Bytes of the DETH.
const DETH_LEN: usize = 8;
/// The default partition key rxe always sends.
pub(crate) const PKEY_DEFAULT: u16 = 0xffff;

/// Opcodes the engine speaks (IBA numbering).
#[allow(missing_docs)]
pub(crate) mod op {
    pub const SEND_FIRST: u8 = 0x00;
    pub const SEND_MIDDLE: u8 = 0x01;
    pub const SEND_LAST: u8 = 0x02;
    pub const SEND_LAST_IMM: u8 = 0x03;
    pub const SEND_ONLY: u8 = 0x04;
    pub const SEND_ONLY_IMM: u8 = 0x05;
    pub const WRITE_FIRST: u8 = 0x06;
    pub const WRITE_MIDDLE: u8 = 0x07;
    pub const WRITE_LAST: u8 = 0x08;
    pub const WRITE_LAST_IMM: u8 = 0x09;
    pub const WRITE_ONLY: u8 = 0x0a;
    pub const WRITE_ONLY_IMM: u8 = 0x0b;
    pub const READ_REQUEST: u8 = 0x0c;
    pub const READ_RESP_FIRST: u8 = 0x0d;
    pub const READ_RESP_MIDDLE: u8 = 0x0e;
    pub const READ_RESP_LAST: u8 = 0x0f;
    pub const READ_RESP_ONLY: u8 = 0x10;
    pub const ACK: u8 = 0x11;
    pub const ATOMIC_ACK: u8 = 0x12;
    pub const CMP_SWAP: u8 = 0x13;
    pub const FETCH_ADD: u8 = 0x14;
    pub const SEND_LAST_INV: u8 = 0x16;
    pub const SEND_ONLY_INV: u8 = 0x17;
    pub const UD_SEND_ONLY: u8 = 0x64;
    pub const UD_SEND_ONLY_IMM: u8 = 0x65;
}

/// AETH syndromes.
pub(crate) mod syndrome {
    /// ACK with "unlimited" credits (what rxe always sends).
    pub const ACK_UNLIMITED: u8 = 0x1f;
    /// RNR NAK class (low 5 bits: timer code).
    pub const RNR: u8 = 0x20;
    /// NAK: PSN sequence error.
    pub const NAK_PSN_SEQ: u8 = 0x60;
    /// NAK: invalid request.
    pub const NAK_INVALID_REQ: u8 = 0x61;
    /// NAK: remote access error.
    pub const NAK_REMOTE_ACCESS: u8 = 0x62;
    /// NAK: remote operational error.
    pub const NAK_REMOTE_OP: u8 = 0x63;
}

/// Header/role bits of an opcode.
pub(crate) mod f {
    pub const RETH: u32 = 1;
    pub const AETH: u32 = 1 << 1;
    pub const IMM: u32 = 1 << 2;
    pub const IETH: u32 = 1 << 3;
    pub const ATOMIC: u32 = 1 << 4;
    pub const ATOMIC_ACK: u32 = 1 << 5;
    pub const DETH: u32 = 1 << 6;
    pub const PAYLOAD: u32 = 1 << 7;
    pub const FIRST: u32 = 1 << 8;
    pub const MIDDLE: u32 = 1 << 9;
    pub const LAST: u32 = 1 << 10;
    pub const SEND: u32 = 1 << 11;
    pub const WRITE: u32 = 1 << 12;
    pub const READ_REQ: u32 = 1 << 13;
    pub const READ_RESP: u32 = 1 << 14;
    pub const ACK: u32 = 1 << 15;
    pub const CMP_SWAP: u32 = 1 << 16;
    pub const FETCH_ADD: u32 = 1 << 17;
    pub const UD: u32 = 1 << 18;
    /// FIRST and LAST: a one-packet message.
    pub const ONLY: u32 = FIRST | LAST;
    /// Either atomic request.
    pub const ATOMIC_REQ: u32 = CMP_SWAP | FETCH_ADD;
    /// Consumes a receive WQE (SEND, WRITE with immediate).
    pub const NEEDS_RECV: u32 = 1 << 19;
    /// A response (responder → completer).
    pub const RESPONSE: u32 = READ_RESP | ACK | ATOMIC_ACK;
}

/// The role bits of a known opcode, `None` for anything the engine does not speak.
pub(crate) const fn op_flags(opcode: u8) -> Option<u32> {
    use f::*;
    let fl = match opcode {
        op::SEND_FIRST => SEND | PAYLOAD | FIRST | NEEDS_RECV,
        op::SEND_MIDDLE => SEND | PAYLOAD | MIDDLE,
        op::SEND_LAST => SEND | PAYLOAD | LAST,
        op::SEND_LAST_IMM => SEND | PAYLOAD | LAST | IMM,
        op::SEND_ONLY => SEND | PAYLOAD | ONLY | NEEDS_RECV,
        op::SEND_ONLY_IMM => SEND | PAYLOAD | ONLY | IMM | NEEDS_RECV,
        op::SEND_LAST_INV => SEND | PAYLOAD | LAST | IETH,
        op::SEND_ONLY_INV => SEND | PAYLOAD | ONLY | IETH | NEEDS_RECV,
        op::WRITE_FIRST => WRITE | PAYLOAD | FIRST | RETH,
        op::WRITE_MIDDLE => WRITE | PAYLOAD | MIDDLE,
        op::WRITE_LAST => WRITE | PAYLOAD | LAST,
        op::WRITE_LAST_IMM => WRITE | PAYLOAD | LAST | IMM | NEEDS_RECV,
        op::WRITE_ONLY => WRITE | PAYLOAD | ONLY | RETH,
        op::WRITE_ONLY_IMM => WRITE | PAYLOAD | ONLY | RETH | IMM | NEEDS_RECV,
        op::READ_REQUEST => READ_REQ | ONLY | RETH,
        op::READ_RESP_FIRST => READ_RESP | PAYLOAD | FIRST | AETH,
        op::READ_RESP_MIDDLE => READ_RESP | PAYLOAD | MIDDLE,
        op::READ_RESP_LAST => READ_RESP | PAYLOAD | LAST | AETH,
        op::READ_RESP_ONLY => READ_RESP | PAYLOAD | ONLY | AETH,
        op::ACK => ACK | ONLY | AETH,
        op::ATOMIC_ACK => ATOMIC_ACK | ONLY | AETH,
        op::CMP_SWAP => CMP_SWAP | ONLY | ATOMIC,
        op::FETCH_ADD => FETCH_ADD | ONLY | ATOMIC,
        op::UD_SEND_ONLY => UD | SEND | PAYLOAD | ONLY | DETH | NEEDS_RECV,
        op::UD_SEND_ONLY_IMM => UD | SEND | PAYLOAD | ONLY | DETH | IMM | NEEDS_RECV,
        _ => return None,
    };
    Some(fl)
}

/// Bytes of BTH plus extension headers for an opcode's flags (IBA order:
/// DETH, RETH, AtomicETH, AETH, AtomicAckETH, ImmDt, IETH).
pub(crate) const fn header_len(flags: u32) -> usize {
    let mut n = BTH_LEN;
    if flags & f::DETH != 0 {
        n += DETH_LEN;
    }
    if flags & f::RETH != 0 {
        n += RETH_LEN;
    }
    if flags & f::ATOMIC != 0 {
        n += ATOMIC_ETH_LEN;
    }
    if flags & f::AETH != 0 {
        n += WORD_LEN;
    }
    if flags & f::ATOMIC_ACK != 0 {
        n += ATOMIC_ACK_LEN;
    }
    if flags & f::IMM != 0 {
        n += WORD_LEN;
    }
    if flags & f::IETH != 0 {
        n += WORD_LEN;
    }
    n
}

/// Why a packet could not be parsed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ParseError {
    /// Shorter than its headers + ICRC, or the pad does not fit.
    Truncated,
    /// An opcode the engine does not speak.
    UnknownOpcode,
    /// Transport version, P_Key or pad inconsistent with the opcode.
    BadHeader,
}

/// RETH fields.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Reth {
    pub va: u64,
    pub rkey: Rkey,
    pub len: u32,
}

/// AtomicETH fields.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct AtomicEth {
    pub va: u64,
    pub rkey: Rkey,
    pub swap_add: u64,
    pub compare: u64,
}

/// Every field the engine reads from a packet. Absent headers read as zero;
/// `flags` says which are present.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pkt<'a> {
    #[cfg_attr(not(test), allow(dead_code))]
    pub opcode: u8,
    pub flags: u32,
    pub dest_qp: Qpn,
    pub ack_req: bool,
    pub psn: Psn,
    pub reth: Reth,
    pub aeth_syndrome: u8,
    pub aeth_msn: u32,
    pub imm: u32,
    pub ieth: Rkey,
    pub atomic: AtomicEth,
    pub atomic_orig: u64,
    pub qkey: u32,
    pub src_qp: Qpn,
    pub payload: &'a [u8],
}

impl Pkt<'_> {
    /// The opcode has all bits of `mask`.
    pub fn is(&self, mask: u32) -> bool {
        self.flags & mask == mask
    }

    /// The opcode has any bit of `mask`.
    pub fn any(&self, mask: u32) -> bool {
        self.flags & mask != 0
    }
}

fn be_u32(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    if let Some(s) = b.get(at..at + 4) {
        w.copy_from_slice(s);
    }
    u32::from_be_bytes(w)
}

fn be_u64(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    if let Some(s) = b.get(at..at + 8) {
        w.copy_from_slice(s);
    }
    u64::from_be_bytes(w)
}

fn be_u24(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    if let Some(s) = b.get(at..at + 3) {
        w[1..].copy_from_slice(s);
    }
    u32::from_be_bytes(w)
}

/// The BTH DestQP of a packet, for demultiplexing before [`parse`].
pub(crate) fn dest_qpn(bytes: &[u8]) -> Option<Qpn> {
    if bytes.len() < BTH_LEN + ICRC_LEN {
        return None;
    }
    Some(Qpn::from_wire(be_u24(bytes, 5)))
}

/// Parse BTH‥ICRC. Never panics; rejects what no valid sender produces.
pub(crate) fn parse(bytes: &[u8]) -> Result<Pkt<'_>, ParseError> {
    if bytes.len() < BTH_LEN + ICRC_LEN {
        return Err(ParseError::Truncated);
    }
    let opcode = bytes.first().copied().unwrap_or(0);
    let b1 = bytes.get(1).copied().unwrap_or(0);
    let flags = op_flags(opcode).ok_or(ParseError::UnknownOpcode)?;
    let pad = usize::from((b1 >> 4) & 3);
    let tver = b1 & 0x0f;
    let pkey = (be_u32(bytes, 0) & 0xffff) as u16;
    if tver != 0 || pkey & 0x7fff != 0x7fff {
        return Err(ParseError::BadHeader);
    }
    let hlen = header_len(flags);
    let tail = hlen + pad + ICRC_LEN;
    if bytes.len() < tail {
        return Err(ParseError::Truncated);
    }
    let paylen = bytes.len() - tail;
    if flags & f::PAYLOAD == 0 && (paylen != 0 || pad != 0) {
        return Err(ParseError::BadHeader);
    }
    // Pad makes the payload a multiple of 4; anything else is malformed.
    if !(paylen + pad).is_multiple_of(4) {
        return Err(ParseError::BadHeader);
    }
    let payload = bytes
        .get(hlen..hlen + paylen)
        .ok_or(ParseError::Truncated)?;
    let mut p = Pkt {
        opcode,
        flags,
        dest_qp: Qpn::from_wire(be_u24(bytes, 5)),
        ack_req: bytes.get(8).copied().unwrap_or(0) & 0x80 != 0,
        psn: Psn::from_wire(be_u24(bytes, 9)),
        reth: Reth::default(),
        aeth_syndrome: 0,
        aeth_msn: 0,
        imm: 0,
        ieth: Rkey(0),
        atomic: AtomicEth::default(),
        atomic_orig: 0,
        qkey: 0,
        src_qp: Qpn::default(),
        payload,
    };
    let mut at = BTH_LEN;
    if flags & f::DETH != 0 {
        p.qkey = be_u32(bytes, at);
        p.src_qp = Qpn::from_wire(be_u24(bytes, at + 5));
        at += DETH_LEN;
    }
    if flags & f::RETH != 0 {
        p.reth = Reth {
            va: be_u64(bytes, at),
            rkey: Rkey(be_u32(bytes, at + 8)),
            len: be_u32(bytes, at + 12),
        };
        at += RETH_LEN;
    }
    if flags & f::ATOMIC != 0 {
        p.atomic = AtomicEth {
            va: be_u64(bytes, at),
            rkey: Rkey(be_u32(bytes, at + 8)),
            swap_add: be_u64(bytes, at + 12),
            compare: be_u64(bytes, at + 20),
        };
        at += ATOMIC_ETH_LEN;
    }
    if flags & f::AETH != 0 {
        let w = be_u32(bytes, at);
        p.aeth_syndrome = (w >> 24) as u8;
        p.aeth_msn = w & 0x00ff_ffff;
        at += WORD_LEN;
    }
    if flags & f::ATOMIC_ACK != 0 {
        p.atomic_orig = be_u64(bytes, at);
        at += ATOMIC_ACK_LEN;
    }
    if flags & f::IMM != 0 {
        p.imm = be_u32(bytes, at);
        at += WORD_LEN;
    }
    if flags & f::IETH != 0 {
        p.ieth = Rkey(be_u32(bytes, at));
    }
    Ok(p)
}

/// Everything needed to emit one packet's headers.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Out {
    pub opcode: u8,
    pub se: bool,
    pub dest_qp: Qpn,
    pub ack_req: bool,
    pub psn: Psn,
    pub reth: Reth,
    pub aeth: u32,
    pub imm: u32,
    pub ieth: u32,
    pub atomic: AtomicEth,
    pub atomic_orig: u64,
    pub qkey: u32,
    pub src_qp: Qpn,
}

/// Total bytes (BTH‥ICRC) of a packet with `payload` bytes.
pub(crate) fn packet_len(opcode: u8, payload: usize) -> usize {
    let hlen = header_len(op_flags(opcode).unwrap_or(0));
    hlen + payload + pad_for(payload) + ICRC_LEN
}

/// Pad bytes after a payload of `len` bytes.
pub(crate) const fn pad_for(len: usize) -> usize {
    len.wrapping_neg() & 3
}

fn put(buf: &mut [u8], at: usize, bytes: &[u8]) {
    if let Some(d) = buf.get_mut(at..at + bytes.len()) {
        d.copy_from_slice(bytes);
    }
}

fn put_u24(buf: &mut [u8], at: usize, v: u32) {
    let b = v.to_be_bytes();
    put(buf, at, &b[1..]);
}

/// Write BTH and extension headers for a packet carrying `paylen` bytes into
/// `buf`; zero the pad and the ICRC. Returns the payload range start. `buf`
/// must be at least [`packet_len`] long (shorter buffers get a truncated,
/// never a panicking, write).
pub(crate) fn emit(buf: &mut [u8], o: &Out, paylen: usize) -> usize {
    let flags = op_flags(o.opcode).unwrap_or(0);
    let pad = pad_for(paylen);
    let b1 = (u8::from(o.se) << 7) | ((pad as u8) << 4);
    put(buf, 0, &[o.opcode, b1]);
    put(buf, 2, &PKEY_DEFAULT.to_be_bytes());
    put(buf, 4, &[0]);
    put_u24(buf, 5, o.dest_qp.get());
    put(buf, 8, &[u8::from(o.ack_req) << 7]);
    put_u24(buf, 9, o.psn.get());
    let mut at = BTH_LEN;
    if flags & f::DETH != 0 {
        put(buf, at, &o.qkey.to_be_bytes());
        put(buf, at + 4, &[0]);
        put_u24(buf, at + 5, o.src_qp.get());
        at += DETH_LEN;
    }
    if flags & f::RETH != 0 {
        put(buf, at, &o.reth.va.to_be_bytes());
        put(buf, at + 8, &o.reth.rkey.get().to_be_bytes());
        put(buf, at + 12, &o.reth.len.to_be_bytes());
        at += RETH_LEN;
    }
    if flags & f::ATOMIC != 0 {
        put(buf, at, &o.atomic.va.to_be_bytes());
        put(buf, at + 8, &o.atomic.rkey.get().to_be_bytes());
        put(buf, at + 12, &o.atomic.swap_add.to_be_bytes());
        put(buf, at + 20, &o.atomic.compare.to_be_bytes());
        at += ATOMIC_ETH_LEN;
    }
    if flags & f::AETH != 0 {
        put(buf, at, &o.aeth.to_be_bytes());
        at += WORD_LEN;
    }
    if flags & f::ATOMIC_ACK != 0 {
        put(buf, at, &o.atomic_orig.to_be_bytes());
        at += ATOMIC_ACK_LEN;
    }
    if flags & f::IMM != 0 {
        put(buf, at, &o.imm.to_be_bytes());
        at += WORD_LEN;
    }
    if flags & f::IETH != 0 {
        put(buf, at, &o.ieth.to_be_bytes());
        at += WORD_LEN;
    }
    let end = at + paylen;
    if let Some(t) = buf.get_mut(end..end + pad + ICRC_LEN) {
        t.fill(0);
    }
    at
}

/// AETH word from a syndrome and MSN.
pub(crate) const fn aeth(syndrome: u8, msn: u32) -> u32 {
    (syndrome as u32) << 24 | (msn & 0x00ff_ffff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_lengths_match_rxe_table() {
        assert_eq!(header_len(op_flags(op::SEND_ONLY).unwrap_or(0)), 12);
        assert_eq!(header_len(op_flags(op::WRITE_ONLY_IMM).unwrap_or(0)), 32);
        assert_eq!(header_len(op_flags(op::CMP_SWAP).unwrap_or(0)), 40);
        assert_eq!(header_len(op_flags(op::ATOMIC_ACK).unwrap_or(0)), 24);
        assert_eq!(header_len(op_flags(op::UD_SEND_ONLY_IMM).unwrap_or(0)), 24);
        assert_eq!(header_len(op_flags(op::SEND_ONLY_INV).unwrap_or(0)), 16);
        assert_eq!(header_len(op_flags(op::READ_RESP_MIDDLE).unwrap_or(0)), 12);
    }

    #[test]
    fn emit_parse_round_trip() {
        let o = Out {
            opcode: op::WRITE_ONLY_IMM,
            se: true,
            dest_qp: Qpn::from_wire(0x123456),
            ack_req: true,
            psn: Psn::from_wire(0xfffffe),
            reth: Reth {
                va: 0x1122_3344_5566_7788,
                rkey: Rkey(0xdead_beef),
                len: 5,
            },
            imm: 0xcafe_f00d,
            ..Out::default()
        };
        let len = packet_len(o.opcode, 5);
        assert_eq!(len, 32 + 5 + 3 + 4);
        let mut buf = vec![0xaau8; len];
        let at = emit(&mut buf, &o, 5);
        buf[at..at + 5].copy_from_slice(b"hello");
        let p = parse(&buf).expect("parse");
        assert_eq!(p.opcode, op::WRITE_ONLY_IMM);
        assert!(p.ack_req);
        assert_eq!(p.dest_qp.get(), 0x123456);
        assert_eq!(p.psn.get(), 0xfffffe);
        assert_eq!(p.reth, o.reth);
        assert_eq!(p.imm, 0xcafe_f00d);
        assert_eq!(p.payload, b"hello");
        assert_eq!(buf[1], 0x80 | 0x30);
        assert_eq!(&buf[2..5], &[0xff, 0xff, 0]);
    }

    #[test]
    fn parse_rejects_malformed() {
        assert_eq!(parse(&[0u8; 15]).err(), Some(ParseError::Truncated));
        let mut b = [0u8; 16];
        b[0] = 0x1f;
        b[2] = 0xff;
        b[3] = 0xff;
        assert_eq!(parse(&b).err(), Some(ParseError::UnknownOpcode));
        b[0] = op::ACK;
        assert_eq!(parse(&b).err(), Some(ParseError::Truncated));
        let mut ack = [0u8; 20];
        ack[0] = op::ACK;
        ack[2] = 0xff;
        ack[3] = 0xff;
        assert!(parse(&ack).is_ok());
        ack[1] = 0x01; // TVer 1
        assert_eq!(parse(&ack).err(), Some(ParseError::BadHeader));
        let mut padded = [0u8; 24];
        padded[..20].copy_from_slice(&ack);
        padded[1] = 0x10; // pad on a payload-less opcode
        assert_eq!(parse(&padded).err(), Some(ParseError::BadHeader));
        ack[1] = 0;
        ack[3] = 0x00; // P_Key 0xff00
        assert_eq!(parse(&ack).err(), Some(ParseError::BadHeader));
    }
}
