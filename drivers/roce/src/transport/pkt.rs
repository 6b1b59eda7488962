//! The engine's view of one RoCE packet (BTH‥ICRC), on top of the wire
//! module: [`parse`] reads the fields the state machines need out of a
//! packet's bytes, [`emit`] writes a packet's headers straight
//! into the sink's buffer; both work at the offsets the wire module's
//! opcode table gives and are tested byte for byte against the wire
//! module's checked views and builders. What the engine adds is the
//! role table ([`op_flags`]: which opcodes it speaks and what each one is
//! to the requester/responder) and the checks §9 asks for beyond the
//! wire's length/pad checks (transport version, P_Key, payload on
//! payload-less opcodes).

use rnic_core::{Psn, Qpn, Rkey};

#[cfg(test)]
use crate::wire::{
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, Error as WireError, IethRepr,
    ImmDtRepr, RethRepr, RocePacket, RoceRepr, Syndrome,
};
use crate::wire::{BthPacket, Opcode};
#[cfg(test)]
use rnic_core::Iova;

/// Bytes of the BTH.
pub(crate) const BTH_LEN: usize = 12;
/// Bytes of the ICRC trailer.
pub(crate) const ICRC_LEN: usize = crate::wire::ICRC_LEN;

/// Opcodes the engine speaks, by their short engine names; every number
/// comes from the wire module's opcode table ([`Opcode`]).
#[allow(missing_docs)]
pub(crate) mod op {
    use crate::wire::Opcode;

    pub const SEND_FIRST: u8 = Opcode::RC_SEND_FIRST.0;
    pub const SEND_MIDDLE: u8 = Opcode::RC_SEND_MIDDLE.0;
    pub const SEND_LAST: u8 = Opcode::RC_SEND_LAST.0;
    pub const SEND_LAST_IMM: u8 = Opcode::RC_SEND_LAST_WITH_IMMEDIATE.0;
    pub const SEND_ONLY: u8 = Opcode::RC_SEND_ONLY.0;
    pub const SEND_ONLY_IMM: u8 = Opcode::RC_SEND_ONLY_WITH_IMMEDIATE.0;
    pub const WRITE_FIRST: u8 = Opcode::RC_RDMA_WRITE_FIRST.0;
    pub const WRITE_MIDDLE: u8 = Opcode::RC_RDMA_WRITE_MIDDLE.0;
    pub const WRITE_LAST: u8 = Opcode::RC_RDMA_WRITE_LAST.0;
    pub const WRITE_LAST_IMM: u8 = Opcode::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE.0;
    pub const WRITE_ONLY: u8 = Opcode::RC_RDMA_WRITE_ONLY.0;
    pub const WRITE_ONLY_IMM: u8 = Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE.0;
    pub const READ_REQUEST: u8 = Opcode::RC_RDMA_READ_REQUEST.0;
    pub const READ_RESP_FIRST: u8 = Opcode::RC_RDMA_READ_RESPONSE_FIRST.0;
    pub const READ_RESP_MIDDLE: u8 = Opcode::RC_RDMA_READ_RESPONSE_MIDDLE.0;
    pub const READ_RESP_LAST: u8 = Opcode::RC_RDMA_READ_RESPONSE_LAST.0;
    pub const READ_RESP_ONLY: u8 = Opcode::RC_RDMA_READ_RESPONSE_ONLY.0;
    pub const ACK: u8 = Opcode::RC_ACKNOWLEDGE.0;
    pub const ATOMIC_ACK: u8 = Opcode::RC_ATOMIC_ACKNOWLEDGE.0;
    pub const CMP_SWAP: u8 = Opcode::RC_COMPARE_SWAP.0;
    pub const FETCH_ADD: u8 = Opcode::RC_FETCH_ADD.0;
    pub const SEND_LAST_INV: u8 = Opcode::RC_SEND_LAST_WITH_INVALIDATE.0;
    pub const SEND_ONLY_INV: u8 = Opcode::RC_SEND_ONLY_WITH_INVALIDATE.0;
    pub const UD_SEND_ONLY: u8 = Opcode::UD_SEND_ONLY.0;
    pub const UD_SEND_ONLY_IMM: u8 = Opcode::UD_SEND_ONLY_WITH_IMMEDIATE.0;
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

/// The role bits of a known opcode, `None` for anything the engine does not
/// speak (UC, RD, CNP). Derived from the wire module's opcode table — the one
/// place the opcode facts live — so the engine, rnic-rxe and the emulated
/// mlx5 function cannot disagree with the wire code.
pub(crate) const fn op_flags(opcode: u8) -> Option<u32> {
    ROLES[opcode as usize]
}

/// [`roles_of`] for every opcode byte, computed at compile time: a lookup
/// per packet.
static ROLES: [Option<u32>; 256] = {
    let mut t = [None; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = roles_of(i as u8);
        i += 1;
    }
    t
};

/// The role bits of `opcode` from its wire table entry.
const fn roles_of(opcode: u8) -> Option<u32> {
    use crate::wire::{ExtHeader as H, Operation as O, Position as P, Transport as T};
    use f::*;
    let Some(info) = Opcode(opcode).info() else {
        return None;
    };
    let mut fl = match info.transport {
        T::Rc => 0,
        T::Ud => UD,
        _ => return None,
    };
    fl |= match info.operation {
        O::Send => SEND,
        O::RdmaWrite => WRITE,
        O::RdmaReadRequest => READ_REQ,
        O::RdmaReadResponse => READ_RESP,
        O::Acknowledge => ACK,
        O::AtomicAcknowledge => ATOMIC_ACK,
        O::CompareSwap => CMP_SWAP,
        O::FetchAdd => FETCH_ADD,
        O::Cnp => return None,
    };
    fl |= match info.position {
        P::First => FIRST,
        P::Middle => MIDDLE,
        P::Last => LAST,
        P::Only => ONLY,
    };
    if info.operation.has_payload() {
        fl |= PAYLOAD;
    }
    if info.consumes_recv_wqe {
        fl |= NEEDS_RECV;
    }
    let mut i = 0;
    while i < info.headers.len() {
        fl |= match info.headers[i] {
            H::Reth => RETH,
            H::Aeth => AETH,
            H::ImmDt => IMM,
            H::Ieth => IETH,
            H::AtomicEth => ATOMIC,
            H::AtomicAckEth => ATOMIC_ACK,
            H::Deth => DETH,
            H::CnpReserved => return None,
        };
        i += 1;
    }
    Some(fl)
}

/// Bytes of BTH plus extension headers of `opcode` (the wire table's).
pub(crate) fn header_len(opcode: u8) -> usize {
    Opcode(opcode).info().map_or(BTH_LEN, |i| i.header_len())
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
    /// A READ response whose payload the receive path already placed in the
    /// READ's local buffer ([`parse_placed`]): its length (`payload` is
    /// then empty); 0 for every other packet.
    pub placed: usize,
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

    /// Payload bytes: in the packet, or placed ahead of it.
    pub fn payload_len(&self) -> usize {
        self.payload.len().max(self.placed)
    }
}

/// Parse the headers (BTH‥AETH) of a READ response whose `placed` payload
/// bytes and pad the receive path put straight into the READ's local
/// buffer: the same checks as [`parse`] on the packet they came from, the
/// pad count included (`placed` + pad a multiple of 4).
pub(crate) fn parse_placed(header: &[u8], placed: usize) -> Result<Pkt<'static>, ParseError> {
    let mut b = [0u8; 32];
    let n = header.len();
    let Some(h) = b.get_mut(..n) else {
        return Err(ParseError::BadHeader);
    };
    h.copy_from_slice(header);
    let Some(&flags_byte) = header.get(1) else {
        return Err(ParseError::Truncated);
    };
    let pad = usize::from((flags_byte >> 4) & 3);
    // Parsed as the same headers with no payload and no pad.
    b[1] &= !0x30;
    let p = parse(b.get(..n + ICRC_LEN).ok_or(ParseError::BadHeader)?)?;
    if !p.is(f::READ_RESP) || !p.payload.is_empty() || n != header_len(p.opcode) {
        return Err(ParseError::BadHeader);
    }
    if placed == 0 || !(placed + pad).is_multiple_of(4) {
        return Err(ParseError::BadHeader);
    }
    Ok(Pkt {
        opcode: p.opcode,
        flags: p.flags,
        dest_qp: p.dest_qp,
        ack_req: p.ack_req,
        psn: p.psn,
        reth: p.reth,
        aeth_syndrome: p.aeth_syndrome,
        aeth_msn: p.aeth_msn,
        imm: p.imm,
        ieth: p.ieth,
        atomic: p.atomic,
        atomic_orig: p.atomic_orig,
        qkey: p.qkey,
        src_qp: p.src_qp,
        payload: &[],
        placed,
    })
}

/// The BTH DestQP of a packet, for demultiplexing before [`parse`].
pub(crate) fn dest_qpn(bytes: &[u8]) -> Option<Qpn> {
    if bytes.len() < BTH_LEN + ICRC_LEN {
        return None;
    }
    Some(BthPacket::new_unchecked(bytes).dest_qp())
}

/// Parse BTH‥ICRC. Never panics; rejects what no valid sender produces.
///
/// Reads the fields at the offsets the wire module's opcode table gives,
/// with the same checks in the same order as the checked `RocePacket` view
/// (`parse_via_view`, the reference `parse_reads_what_the_wire_view_reads`
/// holds it to for hostile bytes too): this runs for every packet received.
#[inline(always)]
pub(crate) fn parse(bytes: &[u8]) -> Result<Pkt<'_>, ParseError> {
    let len = bytes.len();
    let Some(bth) = bytes.first_chunk::<BTH_LEN>() else {
        return Err(ParseError::Truncated);
    };
    let opcode = bth[0];
    let info = Opcode(opcode).info().ok_or(ParseError::UnknownOpcode)?;
    let start = info.header_len();
    if len < start + ICRC_LEN {
        return Err(ParseError::Truncated);
    }
    let pad = usize::from((bth[1] >> 4) & 3);
    if pad > len - start - ICRC_LEN {
        return Err(ParseError::Truncated);
    }
    // Opcodes the wire knows but the engine does not speak (UC, RD, CNP, …).
    let flags = op_flags(opcode).ok_or(ParseError::UnknownOpcode)?;
    let pkey = u16::from_be_bytes([bth[2], bth[3]]);
    if bth[1] & 0x0f != 0 || pkey & 0x7fff != 0x7fff {
        return Err(ParseError::BadHeader);
    }
    let payload = bytes
        .get(start..len - pad - ICRC_LEN)
        .ok_or(ParseError::Truncated)?;
    if flags & f::PAYLOAD == 0 && (!payload.is_empty() || pad != 0) {
        return Err(ParseError::BadHeader);
    }
    // Pad makes the payload a multiple of 4; anything else is malformed.
    if !(payload.len() + pad).is_multiple_of(4) {
        return Err(ParseError::BadHeader);
    }
    let u24 = |b: &[u8]| u32::from_be_bytes([0, b[0], b[1], b[2]]);
    let mut p = Pkt {
        opcode,
        flags,
        dest_qp: Qpn::from_wire(u24(&bth[5..8])),
        ack_req: bth[8] & 0x80 != 0,
        psn: Psn::from_wire(u24(&bth[9..12])),
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
        placed: 0,
    };
    let mut at = BTH_LEN;
    for &h in info.headers {
        let Some(x) = bytes.get(at..at + h.len()) else {
            return Err(ParseError::Truncated);
        };
        at += h.len();
        let u32_at = |i: usize| u32::from_be_bytes([x[i], x[i + 1], x[i + 2], x[i + 3]]);
        let u64_at = |i: usize| (u64::from(u32_at(i)) << 32) | u64::from(u32_at(i + 4));
        use crate::wire::ExtHeader as H;
        match h {
            H::Reth => {
                p.reth = Reth {
                    va: u64_at(0),
                    rkey: Rkey(u32_at(8)),
                    len: u32_at(12),
                }
            }
            H::Aeth => {
                p.aeth_syndrome = x[0];
                p.aeth_msn = u24(&x[1..4]);
            }
            H::ImmDt => p.imm = u32_at(0),
            H::Ieth => p.ieth = Rkey(u32_at(0)),
            H::AtomicEth => {
                p.atomic = AtomicEth {
                    va: u64_at(0),
                    rkey: Rkey(u32_at(8)),
                    swap_add: u64_at(12),
                    compare: u64_at(20),
                }
            }
            H::AtomicAckEth => p.atomic_orig = u64_at(0),
            H::Deth => {
                p.qkey = u32_at(0);
                p.src_qp = Qpn::from_wire(u24(&x[5..8]));
            }
            H::CnpReserved => {}
        }
    }
    Ok(p)
}

/// The checked-view parser [`parse`] replaces, kept as its reference.
#[cfg(test)]
fn parse_via_view(bytes: &[u8]) -> Result<Pkt<'_>, ParseError> {
    let view = RocePacket::new_checked(bytes).map_err(|e| match e {
        WireError::UnknownOpcode(_) => ParseError::UnknownOpcode,
        WireError::Truncated { .. } | WireError::BadPad { .. } => ParseError::Truncated,
        _ => ParseError::BadHeader,
    })?;
    let bth = view.bth();
    let opcode = bth.opcode().0;
    // Opcodes the wire knows but the engine does not speak (UC, RD, CNP, …).
    let flags = op_flags(opcode).ok_or(ParseError::UnknownOpcode)?;
    if bth.tver() != 0 || bth.pkey() & 0x7fff != 0x7fff {
        return Err(ParseError::BadHeader);
    }
    let start = view.header_len();
    let payload = bytes
        .get(start..start + view.payload_len())
        .ok_or(ParseError::Truncated)?;
    let pad = usize::from(bth.pad_count());
    if flags & f::PAYLOAD == 0 && (!payload.is_empty() || pad != 0) {
        return Err(ParseError::BadHeader);
    }
    // Pad makes the payload a multiple of 4; anything else is malformed.
    if !(payload.len() + pad).is_multiple_of(4) {
        return Err(ParseError::BadHeader);
    }
    let mut p = Pkt {
        opcode,
        flags,
        dest_qp: bth.dest_qp(),
        ack_req: bth.ack_req(),
        psn: bth.psn(),
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
        placed: 0,
    };
    if let Some(d) = view.deth() {
        p.qkey = d.qkey();
        p.src_qp = d.src_qp();
    }
    if let Some(r) = view.reth() {
        p.reth = Reth {
            va: r.va().get(),
            rkey: r.rkey(),
            len: r.dma_len(),
        };
    }
    if let Some(a) = view.atomic_eth() {
        p.atomic = AtomicEth {
            va: a.va().get(),
            rkey: a.rkey(),
            swap_add: a.swap_add(),
            compare: a.compare(),
        };
    }
    if let Some(a) = view.aeth() {
        p.aeth_syndrome = a.syndrome_raw();
        p.aeth_msn = a.msn();
    }
    if let Some(a) = view.atomic_ack_eth() {
        p.atomic_orig = a.orig();
    }
    if let Some(i) = view.immdt() {
        p.imm = i.imm();
    }
    if let Some(i) = view.ieth() {
        p.ieth = i.rkey();
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
    header_len(opcode) + payload + pad_for(payload) + ICRC_LEN
}

/// Pad bytes after a payload of `len` bytes.
pub(crate) const fn pad_for(len: usize) -> usize {
    len.wrapping_neg() & 3
}

/// Write BTH and extension headers for a packet carrying `paylen` bytes into
/// `buf`; zero the pad and the ICRC. Returns where the payload goes, or
/// `None` when `buf` is shorter than [`packet_len`] (or the opcode is not
/// one the engine speaks).
///
/// The bytes are written directly, field by field, in the wire module's
/// header order for the opcode (the same bytes `RoceRepr::emit_headers`
/// writes — `emit_writes_what_the_wire_builder_writes` holds them equal for
/// every opcode the engine speaks — without building and validating a
/// repr per packet: this runs for every packet the engine sends).
pub(crate) fn emit(buf: &mut [u8], o: &Out, paylen: usize) -> Option<usize> {
    op_flags(o.opcode)?;
    let info = Opcode(o.opcode).info()?;
    let head = info.header_len();
    let pad = pad_for(paylen);
    let b = buf.get_mut(..head + paylen + pad + ICRC_LEN)?;
    let (hdr, rest) = b.split_at_mut(head);
    let (bth, mut ext) = hdr.split_at_mut(BTH_LEN);
    let q = o.dest_qp.get().to_be_bytes();
    let p = o.psn.get().to_be_bytes();
    let pkey = crate::wire::bth::DEFAULT_PKEY.to_be_bytes();
    bth.copy_from_slice(&[
        o.opcode,
        (u8::from(o.se) << 7) | ((pad as u8) << 4),
        pkey[0],
        pkey[1],
        0,
        q[1],
        q[2],
        q[3],
        u8::from(o.ack_req) << 7,
        p[1],
        p[2],
        p[3],
    ]);
    for &h in info.headers {
        let (field, tail) = core::mem::take(&mut ext).split_at_mut(h.len());
        ext = tail;
        use crate::wire::ExtHeader as H;
        match h {
            H::Reth => {
                field[..8].copy_from_slice(&o.reth.va.to_be_bytes());
                field[8..12].copy_from_slice(&o.reth.rkey.get().to_be_bytes());
                field[12..16].copy_from_slice(&o.reth.len.to_be_bytes());
            }
            H::Aeth => field.copy_from_slice(&o.aeth.to_be_bytes()),
            H::ImmDt => field.copy_from_slice(&o.imm.to_be_bytes()),
            H::Ieth => field.copy_from_slice(&o.ieth.to_be_bytes()),
            H::AtomicEth => {
                field[..8].copy_from_slice(&o.atomic.va.to_be_bytes());
                field[8..12].copy_from_slice(&o.atomic.rkey.get().to_be_bytes());
                field[12..20].copy_from_slice(&o.atomic.swap_add.to_be_bytes());
                field[20..28].copy_from_slice(&o.atomic.compare.to_be_bytes());
            }
            H::AtomicAckEth => field.copy_from_slice(&o.atomic_orig.to_be_bytes()),
            H::Deth => {
                field[..4].copy_from_slice(&o.qkey.to_be_bytes());
                field[4..8].copy_from_slice(&(o.src_qp.get() & 0x00ff_ffff).to_be_bytes());
            }
            H::CnpReserved => field.fill(0),
        }
    }
    if let Some(tail) = rest.get_mut(paylen..) {
        tail.fill(0);
    }
    Some(head)
}

/// The generic builder [`emit`] replaces, kept as the reference its bytes
/// are tested against.
#[cfg(test)]
fn emit_via_repr(buf: &mut [u8], o: &Out, paylen: usize) -> Option<usize> {
    let flags = op_flags(o.opcode)?;
    let mut bth = BthRepr::new(Opcode(o.opcode), o.dest_qp, o.psn);
    bth.solicited = o.se;
    bth.ack_req = o.ack_req;
    let mut r = RoceRepr::new(bth, paylen);
    if flags & f::DETH != 0 {
        r = r.with_deth(DethRepr {
            qkey: o.qkey,
            src_qp: o.src_qp,
        });
    }
    if flags & f::RETH != 0 {
        r = r.with_reth(RethRepr {
            va: Iova(o.reth.va),
            rkey: o.reth.rkey,
            dma_len: o.reth.len,
        });
    }
    if flags & f::ATOMIC != 0 {
        r = r.with_atomic_eth(AtomicEthRepr {
            va: Iova(o.atomic.va),
            rkey: o.atomic.rkey,
            swap_add: o.atomic.swap_add,
            compare: o.atomic.compare,
        });
    }
    if flags & f::AETH != 0 {
        r = r.with_aeth(AethRepr {
            syndrome: Syndrome::from_u8((o.aeth >> 24) as u8),
            msn: o.aeth & 0x00ff_ffff,
        });
    }
    if flags & f::ATOMIC_ACK != 0 {
        r = r.with_atomic_ack_eth(AtomicAckEthRepr {
            orig: o.atomic_orig,
        });
    }
    if flags & f::IMM != 0 {
        r = r.with_immdt(ImmDtRepr { imm: o.imm });
    }
    if flags & f::IETH != 0 {
        r = r.with_ieth(IethRepr { rkey: Rkey(o.ieth) });
    }
    r.emit_headers(buf).ok()
}

/// Write the headers of a packet carrying `paylen` payload bytes that are
/// not in `buf` (a gathering sink sends them from memory): the headers, then
/// the zeroed pad and ICRC right behind them. Returns the header length, or
/// `None` when `buf` is shorter than headers + pad + ICRC (or the opcode is
/// not one the engine speaks).
pub(crate) fn emit_head(buf: &mut [u8], o: &Out, paylen: usize) -> Option<usize> {
    let head = header_len(o.opcode);
    let pad = pad_for(paylen);
    let b = buf.get_mut(..head + pad + ICRC_LEN)?;
    // The headers of the same packet without its payload, then the pad
    // count the payload needs (BTH byte 1, bits 5..4).
    let at = emit(b, o, 0)?;
    let flags = b.get_mut(1)?;
    *flags = (*flags & !0x30) | ((pad as u8) << 4);
    b.get_mut(at..)?.fill(0);
    Some(at)
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
        assert_eq!(header_len(op::SEND_ONLY), 12);
        assert_eq!(header_len(op::WRITE_ONLY_IMM), 32);
        assert_eq!(header_len(op::CMP_SWAP), 40);
        assert_eq!(header_len(op::ATOMIC_ACK), 24);
        assert_eq!(header_len(op::UD_SEND_ONLY_IMM), 24);
        assert_eq!(header_len(op::SEND_ONLY_INV), 16);
        assert_eq!(header_len(op::READ_RESP_MIDDLE), 12);
    }

    /// The role bits derived from the wire table, held against IBA's
    /// meaning of each opcode the engine speaks (golden expectations), and
    /// nothing for the rest (UC, RD, CNP, unknown).
    #[test]
    fn role_table_derived_from_the_wire_table() {
        use f::*;
        let golden = [
            (op::SEND_FIRST, SEND | PAYLOAD | FIRST | NEEDS_RECV),
            (op::SEND_MIDDLE, SEND | PAYLOAD | MIDDLE),
            (op::SEND_LAST, SEND | PAYLOAD | LAST),
            (op::SEND_LAST_IMM, SEND | PAYLOAD | LAST | IMM),
            (op::SEND_ONLY, SEND | PAYLOAD | ONLY | NEEDS_RECV),
            (op::SEND_ONLY_IMM, SEND | PAYLOAD | ONLY | IMM | NEEDS_RECV),
            (op::SEND_LAST_INV, SEND | PAYLOAD | LAST | IETH),
            (op::SEND_ONLY_INV, SEND | PAYLOAD | ONLY | IETH | NEEDS_RECV),
            (op::WRITE_FIRST, WRITE | PAYLOAD | FIRST | RETH),
            (op::WRITE_MIDDLE, WRITE | PAYLOAD | MIDDLE),
            (op::WRITE_LAST, WRITE | PAYLOAD | LAST),
            (
                op::WRITE_LAST_IMM,
                WRITE | PAYLOAD | LAST | IMM | NEEDS_RECV,
            ),
            (op::WRITE_ONLY, WRITE | PAYLOAD | ONLY | RETH),
            (
                op::WRITE_ONLY_IMM,
                WRITE | PAYLOAD | ONLY | RETH | IMM | NEEDS_RECV,
            ),
            (op::READ_REQUEST, READ_REQ | ONLY | RETH),
            (op::READ_RESP_FIRST, READ_RESP | PAYLOAD | FIRST | AETH),
            (op::READ_RESP_MIDDLE, READ_RESP | PAYLOAD | MIDDLE),
            (op::READ_RESP_LAST, READ_RESP | PAYLOAD | LAST | AETH),
            (op::READ_RESP_ONLY, READ_RESP | PAYLOAD | ONLY | AETH),
            (op::ACK, ACK | ONLY | AETH),
            (op::ATOMIC_ACK, ATOMIC_ACK | ONLY | AETH),
            (op::CMP_SWAP, CMP_SWAP | ONLY | ATOMIC),
            (op::FETCH_ADD, FETCH_ADD | ONLY | ATOMIC),
            (
                op::UD_SEND_ONLY,
                UD | SEND | PAYLOAD | ONLY | DETH | NEEDS_RECV,
            ),
            (
                op::UD_SEND_ONLY_IMM,
                UD | SEND | PAYLOAD | ONLY | DETH | IMM | NEEDS_RECV,
            ),
        ];
        for (opcode, want) in golden {
            assert_eq!(op_flags(opcode), Some(want), "{:?}", Opcode(opcode));
        }
        let spoken: Vec<u8> = golden.iter().map(|g| g.0).collect();
        for raw in 0..=255u8 {
            if !spoken.contains(&raw) {
                assert_eq!(op_flags(raw), None, "{:?}", Opcode(raw));
            }
        }
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
        let at = emit(&mut buf, &o, 5).expect("fits");
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

    /// A packet gathered from headers written by `emit_head`, a payload
    /// from elsewhere and the zeroed tail parses exactly as the packet
    /// `emit` builds in one buffer, for every pad length.
    #[test]
    fn emit_head_plus_payload_is_the_packet_emit_builds() {
        for paylen in [1usize, 2, 3, 4, 5, 4096] {
            let o = Out {
                opcode: op::WRITE_FIRST,
                dest_qp: Qpn::from_wire(0x12),
                psn: Psn::from_wire(7),
                reth: Reth {
                    va: 0x1000,
                    rkey: Rkey(9),
                    len: 9000,
                },
                ..Out::default()
            };
            let payload: Vec<u8> = (0..paylen).map(|i| i as u8 ^ 0x5a).collect();
            let mut whole = vec![0xaa; packet_len(o.opcode, paylen)];
            let at = emit(&mut whole, &o, paylen).expect("fits");
            whole[at..at + paylen].copy_from_slice(&payload);
            let mut head = vec![0xaa; 64];
            let h = emit_head(&mut head, &o, paylen).expect("fits");
            assert_eq!(h, at);
            let tail = pad_for(paylen) + ICRC_LEN;
            let mut gathered = head[..h].to_vec();
            gathered.extend_from_slice(&payload);
            gathered.extend_from_slice(&head[h..h + tail]);
            assert_eq!(gathered, whole, "paylen {paylen}");
            assert!(emit_head(&mut head[..h + tail - 1], &o, paylen).is_none());
        }
    }

    /// The direct writer and the wire module's builder write the same
    /// bytes — headers, zeroed pad and ICRC — for every opcode the engine
    /// speaks, across field values (all AETH syndrome bytes, QPN and PSN
    /// extremes, every pad length).
    /// A xorshift stream for the equivalence tests.
    fn stream(seed: u64) -> impl FnMut() -> u64 {
        let mut x = seed;
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        }
    }

    /// Headers for `opcode` with every field drawn from `next` (the AETH
    /// word whole: any syndrome byte).
    fn random_out(opcode: u8, next: &mut impl FnMut() -> u64) -> Out {
        let r = next();
        Out {
            opcode,
            se: r & 1 != 0,
            dest_qp: Qpn::from_wire((r >> 8) as u32),
            ack_req: r & 2 != 0,
            psn: Psn::from_wire((r >> 32) as u32),
            reth: Reth {
                va: next(),
                rkey: Rkey(next() as u32),
                len: next() as u32,
            },
            aeth: next() as u32,
            imm: next() as u32,
            ieth: next() as u32,
            atomic: AtomicEth {
                va: next(),
                rkey: Rkey(next() as u32),
                swap_add: next(),
                compare: next(),
            },
            atomic_orig: next(),
            qkey: next() as u32,
            src_qp: Qpn::from_wire(next() as u32),
        }
    }

    /// The direct writer and the wire module's builder write the same
    /// bytes — headers, zeroed pad and ICRC — for every opcode the engine
    /// speaks, across field values (AETH syndrome bytes, QPN and PSN
    /// extremes, every pad length).
    #[test]
    fn emit_writes_what_the_wire_builder_writes() {
        let mut next = stream(0x9e37_79b9_7f4a_7c15);
        let mut checked = 0;
        for opcode in 0..=255u8 {
            let Some(flags) = op_flags(opcode) else {
                continue;
            };
            for round in 0..64usize {
                let o = random_out(opcode, &mut next);
                let paylen = if flags & f::PAYLOAD != 0 {
                    (round * 7) % 37
                } else {
                    0
                };
                let len = packet_len(opcode, paylen);
                let (mut a, mut b) = (vec![0xa5u8; len + 8], vec![0xa5u8; len + 8]);
                let at = emit(&mut a, &o, paylen);
                assert_eq!(
                    at,
                    emit_via_repr(&mut b, &o, paylen),
                    "{:?}",
                    Opcode(opcode)
                );
                assert_eq!(a, b, "{:?} round {round}", Opcode(opcode));
                assert_eq!(emit(&mut a[..len - 1], &o, paylen), None);
                checked += 1;
            }
        }
        assert_eq!(checked, 25 * 64, "every opcode the engine speaks");
    }

    /// The direct parser and the checked wire view agree on every input:
    /// valid packets of every opcode the engine speaks (emitted with random
    /// fields and payloads) and hostile bytes (every opcode byte, random
    /// flags, P_Key, pad and lengths from 0 to 80 bytes) — the same fields
    /// or the same error.
    #[test]
    fn parse_reads_what_the_wire_view_reads() {
        let mut next = stream(0x2545_f491_4f6c_dd1d);
        let same = |b: &[u8]| {
            let (d, v) = (parse(b), parse_via_view(b));
            assert_eq!(format!("{d:?}"), format!("{v:?}"), "{b:02x?}");
        };
        for opcode in 0..=255u8 {
            for round in 0..40usize {
                // Valid packets where the engine speaks the opcode.
                if let Some(flags) = op_flags(opcode) {
                    let paylen = if flags & f::PAYLOAD != 0 {
                        round % 9
                    } else {
                        0
                    };
                    let o = random_out(opcode, &mut next);
                    let mut b = vec![0u8; packet_len(opcode, paylen)];
                    let at = emit(&mut b, &o, paylen).expect("fits");
                    for (i, v) in b[at..at + paylen].iter_mut().enumerate() {
                        *v = i as u8;
                    }
                    same(&b);
                }
                // Hostile bytes.
                let len = (next() % 81) as usize;
                let mut b: Vec<u8> = (0..len).map(|_| next() as u8).collect();
                if let Some(first) = b.first_mut() {
                    *first = opcode;
                }
                if round % 2 == 0 && len > 4 {
                    b[1] &= 0x30; // TVer 0
                    b[2] = 0xff;
                    b[3] = 0xff;
                }
                same(&b);
            }
        }
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

    /// A placed READ response's headers parse as the whole packet would,
    /// with the placed length as its payload; anything but a READ response,
    /// a header of the wrong length, no payload, or a pad that does not fit
    /// the placed length is refused.
    #[test]
    fn placed_headers_parse_as_their_packets() {
        let bth = |op: u8, pad: u8| {
            let mut b = vec![op, pad << 4, 0xff, 0xff, 0, 0, 0x12, 0x34, 0, 0, 0x05, 0x06];
            if op != op::READ_RESP_MIDDLE {
                b.extend_from_slice(&[0, 0, 0, 7]);
            }
            b
        };
        for (opcode, pad, placed) in [
            (op::READ_RESP_MIDDLE, 0, 1024),
            (op::READ_RESP_FIRST, 0, 4096),
            (op::READ_RESP_LAST, 3, 1021),
            (op::READ_RESP_ONLY, 1, 7),
        ] {
            let h = bth(opcode, pad);
            let p = parse_placed(&h, placed).expect("a placed READ response");
            let mut whole = h.clone();
            whole.extend(std::iter::repeat_n(
                0xab,
                placed + usize::from(pad) + ICRC_LEN,
            ));
            let q = parse(&whole).expect("the whole packet");
            assert_eq!((p.opcode, p.psn, p.dest_qp), (q.opcode, q.psn, q.dest_qp));
            assert_eq!((p.aeth_syndrome, p.aeth_msn), (q.aeth_syndrome, q.aeth_msn));
            assert_eq!((p.payload_len(), p.placed), (q.payload_len(), placed));
            assert!(p.payload.is_empty());
        }
        // Pad that does not fit, no payload, other opcodes, short headers.
        assert!(parse_placed(&bth(op::READ_RESP_LAST, 3), 1020).is_err());
        assert!(parse_placed(&bth(op::READ_RESP_MIDDLE, 0), 0).is_err());
        assert!(parse_placed(&bth(op::SEND_ONLY, 0), 64).is_err());
        assert!(parse_placed(&bth(op::WRITE_MIDDLE, 0), 1024).is_err());
        assert!(parse_placed(&bth(op::READ_RESP_FIRST, 0)[..12], 1024).is_err());
        assert!(parse_placed(&[0x0e; 4], 1024).is_err());
        assert!(parse_placed(&[0x0e; 40], 1024).is_err());
    }
}
