//! BTH opcodes: the table of every RC, UC and UD opcode and the CNP
//! (rocev2.md §3), with the facts the transport needs about each.
//!
//! [`Opcode`] is a newtype over the raw byte with named constants, so an
//! unknown value survives a round trip; [`Opcode::info`] looks the byte up
//! in a 256-entry table built at compile time (an O(1) index, no branches
//! on the hot path).

use core::fmt;

use rnic_core::Mtu;

/// A BTH opcode byte: bits 7:5 select the transport, bits 4:0 the operation.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Opcode(pub u8);

impl Opcode {
    /// RC SEND first packet.
    pub const RC_SEND_FIRST: Opcode = Opcode(0x00);
    /// RC SEND middle packet.
    pub const RC_SEND_MIDDLE: Opcode = Opcode(0x01);
    /// RC SEND last packet.
    pub const RC_SEND_LAST: Opcode = Opcode(0x02);
    /// RC SEND last packet with immediate data.
    pub const RC_SEND_LAST_WITH_IMMEDIATE: Opcode = Opcode(0x03);
    /// RC SEND in one packet.
    pub const RC_SEND_ONLY: Opcode = Opcode(0x04);
    /// RC SEND in one packet with immediate data.
    pub const RC_SEND_ONLY_WITH_IMMEDIATE: Opcode = Opcode(0x05);
    /// RC RDMA WRITE first packet (carries the RETH).
    pub const RC_RDMA_WRITE_FIRST: Opcode = Opcode(0x06);
    /// RC RDMA WRITE middle packet.
    pub const RC_RDMA_WRITE_MIDDLE: Opcode = Opcode(0x07);
    /// RC RDMA WRITE last packet.
    pub const RC_RDMA_WRITE_LAST: Opcode = Opcode(0x08);
    /// RC RDMA WRITE last packet with immediate data.
    pub const RC_RDMA_WRITE_LAST_WITH_IMMEDIATE: Opcode = Opcode(0x09);
    /// RC RDMA WRITE in one packet.
    pub const RC_RDMA_WRITE_ONLY: Opcode = Opcode(0x0a);
    /// RC RDMA WRITE in one packet with immediate data.
    pub const RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE: Opcode = Opcode(0x0b);
    /// RC RDMA READ request.
    pub const RC_RDMA_READ_REQUEST: Opcode = Opcode(0x0c);
    /// RC RDMA READ response, first packet.
    pub const RC_RDMA_READ_RESPONSE_FIRST: Opcode = Opcode(0x0d);
    /// RC RDMA READ response, middle packet (no AETH).
    pub const RC_RDMA_READ_RESPONSE_MIDDLE: Opcode = Opcode(0x0e);
    /// RC RDMA READ response, last packet.
    pub const RC_RDMA_READ_RESPONSE_LAST: Opcode = Opcode(0x0f);
    /// RC RDMA READ response in one packet.
    pub const RC_RDMA_READ_RESPONSE_ONLY: Opcode = Opcode(0x10);
    /// RC ACK or NAK.
    pub const RC_ACKNOWLEDGE: Opcode = Opcode(0x11);
    /// RC atomic ACK (carries the original remote value).
    pub const RC_ATOMIC_ACKNOWLEDGE: Opcode = Opcode(0x12);
    /// RC atomic compare-and-swap.
    pub const RC_COMPARE_SWAP: Opcode = Opcode(0x13);
    /// RC atomic fetch-and-add.
    pub const RC_FETCH_ADD: Opcode = Opcode(0x14);
    /// RC SEND last packet with invalidate.
    pub const RC_SEND_LAST_WITH_INVALIDATE: Opcode = Opcode(0x16);
    /// RC SEND in one packet with invalidate.
    pub const RC_SEND_ONLY_WITH_INVALIDATE: Opcode = Opcode(0x17);
    /// UC SEND first packet.
    pub const UC_SEND_FIRST: Opcode = Opcode(0x20);
    /// UC SEND middle packet.
    pub const UC_SEND_MIDDLE: Opcode = Opcode(0x21);
    /// UC SEND last packet.
    pub const UC_SEND_LAST: Opcode = Opcode(0x22);
    /// UC SEND last packet with immediate data.
    pub const UC_SEND_LAST_WITH_IMMEDIATE: Opcode = Opcode(0x23);
    /// UC SEND in one packet.
    pub const UC_SEND_ONLY: Opcode = Opcode(0x24);
    /// UC SEND in one packet with immediate data.
    pub const UC_SEND_ONLY_WITH_IMMEDIATE: Opcode = Opcode(0x25);
    /// UC RDMA WRITE first packet.
    pub const UC_RDMA_WRITE_FIRST: Opcode = Opcode(0x26);
    /// UC RDMA WRITE middle packet.
    pub const UC_RDMA_WRITE_MIDDLE: Opcode = Opcode(0x27);
    /// UC RDMA WRITE last packet.
    pub const UC_RDMA_WRITE_LAST: Opcode = Opcode(0x28);
    /// UC RDMA WRITE last packet with immediate data.
    pub const UC_RDMA_WRITE_LAST_WITH_IMMEDIATE: Opcode = Opcode(0x29);
    /// UC RDMA WRITE in one packet.
    pub const UC_RDMA_WRITE_ONLY: Opcode = Opcode(0x2a);
    /// UC RDMA WRITE in one packet with immediate data.
    pub const UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE: Opcode = Opcode(0x2b);
    /// UD SEND (always one packet).
    pub const UD_SEND_ONLY: Opcode = Opcode(0x64);
    /// UD SEND with immediate data.
    pub const UD_SEND_ONLY_WITH_IMMEDIATE: Opcode = Opcode(0x65);
    /// RoCEv2 congestion notification packet.
    pub const CNP: Opcode = Opcode(0x81);

    /// The raw byte.
    pub const fn get(self) -> u8 {
        self.0
    }

    /// The transport named by bits 7:5.
    pub const fn transport(self) -> Transport {
        Transport::from_opcode(self.0)
    }

    /// The operation code in bits 4:0.
    pub const fn operation_code(self) -> u8 {
        self.0 & 0x1f
    }

    /// What this crate knows about the opcode; `None` for RD, reserved and
    /// unverified opcodes (FLUSH, ATOMIC WRITE), which the parsers reject
    /// with [`Error::UnknownOpcode`](super::Error::UnknownOpcode).
    pub const fn info(self) -> Option<&'static OpcodeInfo> {
        match &TABLE[self.0 as usize] {
            Some(info) => Some(info),
            None => None,
        }
    }

    /// Whether [`Opcode::info`] knows this opcode.
    pub const fn is_known(self) -> bool {
        self.info().is_some()
    }

    /// The IBTA-style name (`"RC_SEND_FIRST"`), or `None` when unknown.
    pub const fn name(self) -> Option<&'static str> {
        match self.info() {
            Some(i) => Some(i.name),
            None => None,
        }
    }
}

impl fmt::Debug for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => write!(f, "Opcode({name})"),
            None => write!(f, "Opcode({:#04x})", self.0),
        }
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => write!(f, "{name} ({:#04x})", self.0),
            None => write!(f, "{:#04x}", self.0),
        }
    }
}

impl From<u8> for Opcode {
    fn from(raw: u8) -> Opcode {
        Opcode(raw)
    }
}

impl From<Opcode> for u8 {
    fn from(op: Opcode) -> u8 {
        op.0
    }
}

/// The transport service, from opcode bits 7:5.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// Reliable connected (0b000).
    Rc,
    /// Unreliable connected (0b001).
    Uc,
    /// Reliable datagram (0b010; not supported by Linux or this crate).
    Rd,
    /// Unreliable datagram (0b011).
    Ud,
    /// Congestion notification (0b100).
    Cnp,
    /// A reserved or vendor value (the raw 3 bits).
    Unknown(u8),
}

impl Transport {
    /// The transport of an opcode byte.
    pub const fn from_opcode(op: u8) -> Transport {
        match op >> 5 {
            0 => Transport::Rc,
            1 => Transport::Uc,
            2 => Transport::Rd,
            3 => Transport::Ud,
            4 => Transport::Cnp,
            other => Transport::Unknown(other),
        }
    }
}

/// What a packet does, independent of transport and position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// SEND (with or without immediate / invalidate).
    Send,
    /// RDMA WRITE (with or without immediate).
    RdmaWrite,
    /// RDMA READ request.
    RdmaReadRequest,
    /// RDMA READ response data.
    RdmaReadResponse,
    /// ACK / NAK.
    Acknowledge,
    /// Atomic ACK.
    AtomicAcknowledge,
    /// Atomic compare-and-swap request.
    CompareSwap,
    /// Atomic fetch-and-add request.
    FetchAdd,
    /// Congestion notification.
    Cnp,
}

impl Operation {
    /// Whether packets of this operation carry payload.
    pub const fn has_payload(self) -> bool {
        matches!(
            self,
            Operation::Send | Operation::RdmaWrite | Operation::RdmaReadResponse
        )
    }

    /// Sent by a requester (SEND, WRITE, READ request, atomics).
    pub const fn is_request(self) -> bool {
        matches!(
            self,
            Operation::Send
                | Operation::RdmaWrite
                | Operation::RdmaReadRequest
                | Operation::CompareSwap
                | Operation::FetchAdd
        )
    }

    /// Sent by a responder (READ responses, ACK/NAK, atomic ACK).
    pub const fn is_response(self) -> bool {
        matches!(
            self,
            Operation::RdmaReadResponse | Operation::Acknowledge | Operation::AtomicAcknowledge
        )
    }
}

/// Where a packet sits in its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Position {
    /// The first of several packets.
    First,
    /// Neither first nor last.
    Middle,
    /// The last of several packets.
    Last,
    /// The whole message in one packet (also ACKs, atomics, READ requests, CNPs).
    Only,
}

impl Position {
    /// First or only: the packet starts a message.
    pub const fn starts_message(self) -> bool {
        matches!(self, Position::First | Position::Only)
    }

    /// Last or only: the packet ends a message.
    pub const fn ends_message(self) -> bool {
        matches!(self, Position::Last | Position::Only)
    }
}

/// An extension header that can follow the BTH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExtHeader {
    /// RDMA ETH (16 bytes).
    Reth,
    /// ACK ETH (4 bytes).
    Aeth,
    /// Immediate data (4 bytes).
    ImmDt,
    /// Invalidate ETH (4 bytes).
    Ieth,
    /// Atomic ETH (28 bytes).
    AtomicEth,
    /// Atomic ACK ETH (8 bytes).
    AtomicAckEth,
    /// Datagram ETH (8 bytes).
    Deth,
    /// The 16 reserved bytes of a CNP.
    CnpReserved,
}

impl ExtHeader {
    /// The header's length in bytes.
    pub const fn len(self) -> usize {
        match self {
            ExtHeader::Reth => 16,
            ExtHeader::Aeth | ExtHeader::ImmDt | ExtHeader::Ieth => 4,
            ExtHeader::AtomicEth => 28,
            ExtHeader::AtomicAckEth | ExtHeader::Deth => 8,
            ExtHeader::CnpReserved => 16,
        }
    }

    /// Always false: no extension header is empty (present for clippy's `len_without_is_empty`).
    pub const fn is_empty(self) -> bool {
        false
    }
}

impl fmt::Display for ExtHeader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&super::Header::from(*self), f)
    }
}

/// The payload-length rule of a packet position (rocev2.md §5; rxe
/// `check_length`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PayloadRule {
    /// The opcode carries no payload.
    Empty,
    /// FIRST and MIDDLE packets: exactly one MTU.
    ExactlyMtu,
    /// LAST packets: 1 ..= MTU bytes.
    OneToMtu,
    /// ONLY packets: 0 ..= MTU bytes.
    UpToMtu,
}

impl PayloadRule {
    /// Whether `len` payload bytes obey the rule under path MTU `mtu`.
    pub const fn allows(self, len: usize, mtu: Mtu) -> bool {
        let mtu = mtu.bytes() as usize;
        match self {
            PayloadRule::Empty => len == 0,
            PayloadRule::ExactlyMtu => len == mtu,
            PayloadRule::OneToMtu => len >= 1 && len <= mtu,
            PayloadRule::UpToMtu => len <= mtu,
        }
    }
}

/// Everything the table knows about one opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpcodeInfo {
    /// The opcode.
    pub opcode: Opcode,
    /// IBTA-style name, e.g. `"RC_RDMA_WRITE_FIRST"`.
    pub name: &'static str,
    /// Transport service.
    pub transport: Transport,
    /// What the packet does.
    pub operation: Operation,
    /// Position in the message.
    pub position: Position,
    /// Extension headers after the BTH, in wire order.
    pub headers: &'static [ExtHeader],
    /// Whether the responder takes a receive WQE on this packet (rxe's
    /// `RXE_RWR_MASK`: the first/only packet of a SEND, the last/only packet
    /// of an RDMA WRITE with immediate, every UD SEND).
    pub consumes_recv_wqe: bool,
}

impl OpcodeInfo {
    /// Bytes of extension headers after the BTH.
    pub const fn ext_len(&self) -> usize {
        let mut len = 0;
        let mut i = 0;
        while i < self.headers.len() {
            len += self.headers[i].len();
            i += 1;
        }
        len
    }

    /// BTH plus extension headers: the payload's offset from the BTH start.
    pub const fn header_len(&self) -> usize {
        super::bth::HEADER_LEN + self.ext_len()
    }

    /// Offset of extension header `h` from the BTH start, or `None` when the
    /// opcode does not carry it.
    pub const fn offset_of(&self, h: ExtHeader) -> Option<usize> {
        let mut off = super::bth::HEADER_LEN;
        let mut i = 0;
        while i < self.headers.len() {
            let cur = self.headers[i];
            if cur as u8 == h as u8 {
                return Some(off);
            }
            off += cur.len();
            i += 1;
        }
        None
    }

    /// Whether the opcode carries extension header `h`.
    pub const fn has(&self, h: ExtHeader) -> bool {
        self.offset_of(h).is_some()
    }

    /// Whether packets with this opcode carry payload.
    pub const fn has_payload(&self) -> bool {
        self.operation.has_payload()
    }

    /// Sent by a requester.
    pub const fn is_request(&self) -> bool {
        self.operation.is_request()
    }

    /// Sent by a responder.
    pub const fn is_response(&self) -> bool {
        self.operation.is_response()
    }

    /// Carries immediate data.
    pub const fn has_immediate(&self) -> bool {
        self.has(ExtHeader::ImmDt)
    }

    /// The payload-length rule for this opcode.
    pub const fn payload_rule(&self) -> PayloadRule {
        if !self.has_payload() {
            return PayloadRule::Empty;
        }
        match self.position {
            Position::First | Position::Middle => PayloadRule::ExactlyMtu,
            Position::Last => PayloadRule::OneToMtu,
            Position::Only => PayloadRule::UpToMtu,
        }
    }

    /// Whether a packet with this opcode may carry `len` payload bytes
    /// under path MTU `mtu` (FIRST/MIDDLE exactly MTU, LAST 1..=MTU,
    /// ONLY 0..=MTU, none for opcodes without payload).
    pub const fn payload_len_ok(&self, len: usize, mtu: Mtu) -> bool {
        self.payload_rule().allows(len, mtu)
    }
}

use ExtHeader as H;
use Operation as O;
use Position as P;

const fn row(
    op: u8,
    name: &'static str,
    operation: Operation,
    position: Position,
    headers: &'static [ExtHeader],
    consumes_recv_wqe: bool,
) -> Option<OpcodeInfo> {
    Some(OpcodeInfo {
        opcode: Opcode(op),
        name,
        transport: Transport::from_opcode(op),
        operation,
        position,
        headers,
        consumes_recv_wqe,
    })
}

/// The SEND/WRITE rows shared by RC and UC (operation codes 0x00..=0x0b).
const fn send_write(op: u8, names: &[&'static str; 12]) -> Option<OpcodeInfo> {
    let code = (op & 0x1f) as usize;
    let name = names[code];
    match code {
        0x00 => row(op, name, O::Send, P::First, &[], true),
        0x01 => row(op, name, O::Send, P::Middle, &[], false),
        0x02 => row(op, name, O::Send, P::Last, &[], false),
        0x03 => row(op, name, O::Send, P::Last, &[H::ImmDt], false),
        0x04 => row(op, name, O::Send, P::Only, &[], true),
        0x05 => row(op, name, O::Send, P::Only, &[H::ImmDt], true),
        0x06 => row(op, name, O::RdmaWrite, P::First, &[H::Reth], false),
        0x07 => row(op, name, O::RdmaWrite, P::Middle, &[], false),
        0x08 => row(op, name, O::RdmaWrite, P::Last, &[], false),
        0x09 => row(op, name, O::RdmaWrite, P::Last, &[H::ImmDt], true),
        0x0a => row(op, name, O::RdmaWrite, P::Only, &[H::Reth], false),
        0x0b => row(op, name, O::RdmaWrite, P::Only, &[H::Reth, H::ImmDt], true),
        _ => None,
    }
}

const RC_NAMES: [&str; 12] = [
    "RC_SEND_FIRST",
    "RC_SEND_MIDDLE",
    "RC_SEND_LAST",
    "RC_SEND_LAST_WITH_IMMEDIATE",
    "RC_SEND_ONLY",
    "RC_SEND_ONLY_WITH_IMMEDIATE",
    "RC_RDMA_WRITE_FIRST",
    "RC_RDMA_WRITE_MIDDLE",
    "RC_RDMA_WRITE_LAST",
    "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE",
    "RC_RDMA_WRITE_ONLY",
    "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE",
];

const UC_NAMES: [&str; 12] = [
    "UC_SEND_FIRST",
    "UC_SEND_MIDDLE",
    "UC_SEND_LAST",
    "UC_SEND_LAST_WITH_IMMEDIATE",
    "UC_SEND_ONLY",
    "UC_SEND_ONLY_WITH_IMMEDIATE",
    "UC_RDMA_WRITE_FIRST",
    "UC_RDMA_WRITE_MIDDLE",
    "UC_RDMA_WRITE_LAST",
    "UC_RDMA_WRITE_LAST_WITH_IMMEDIATE",
    "UC_RDMA_WRITE_ONLY",
    "UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE",
];

const fn lookup(op: u8) -> Option<OpcodeInfo> {
    match op {
        0x00..=0x0b => send_write(op, &RC_NAMES),
        0x0c => row(
            op,
            "RC_RDMA_READ_REQUEST",
            O::RdmaReadRequest,
            P::Only,
            &[H::Reth],
            false,
        ),
        0x0d => row(
            op,
            "RC_RDMA_READ_RESPONSE_FIRST",
            O::RdmaReadResponse,
            P::First,
            &[H::Aeth],
            false,
        ),
        0x0e => row(
            op,
            "RC_RDMA_READ_RESPONSE_MIDDLE",
            O::RdmaReadResponse,
            P::Middle,
            &[],
            false,
        ),
        0x0f => row(
            op,
            "RC_RDMA_READ_RESPONSE_LAST",
            O::RdmaReadResponse,
            P::Last,
            &[H::Aeth],
            false,
        ),
        0x10 => row(
            op,
            "RC_RDMA_READ_RESPONSE_ONLY",
            O::RdmaReadResponse,
            P::Only,
            &[H::Aeth],
            false,
        ),
        0x11 => row(
            op,
            "RC_ACKNOWLEDGE",
            O::Acknowledge,
            P::Only,
            &[H::Aeth],
            false,
        ),
        0x12 => row(
            op,
            "RC_ATOMIC_ACKNOWLEDGE",
            O::AtomicAcknowledge,
            P::Only,
            &[H::Aeth, H::AtomicAckEth],
            false,
        ),
        0x13 => row(
            op,
            "RC_COMPARE_SWAP",
            O::CompareSwap,
            P::Only,
            &[H::AtomicEth],
            false,
        ),
        0x14 => row(
            op,
            "RC_FETCH_ADD",
            O::FetchAdd,
            P::Only,
            &[H::AtomicEth],
            false,
        ),
        0x16 => row(
            op,
            "RC_SEND_LAST_WITH_INVALIDATE",
            O::Send,
            P::Last,
            &[H::Ieth],
            false,
        ),
        0x17 => row(
            op,
            "RC_SEND_ONLY_WITH_INVALIDATE",
            O::Send,
            P::Only,
            &[H::Ieth],
            true,
        ),
        0x20..=0x2b => send_write(op, &UC_NAMES),
        0x64 => row(op, "UD_SEND_ONLY", O::Send, P::Only, &[H::Deth], true),
        0x65 => row(
            op,
            "UD_SEND_ONLY_WITH_IMMEDIATE",
            O::Send,
            P::Only,
            &[H::Deth, H::ImmDt],
            true,
        ),
        0x81 => row(op, "CNP", O::Cnp, P::Only, &[H::CnpReserved], false),
        _ => None,
    }
}

const fn build_table() -> [Option<OpcodeInfo>; 256] {
    let mut table = [None; 256];
    let mut i = 0;
    while i < 256 {
        table[i] = lookup(i as u8);
        i += 1;
    }
    table
}

static TABLE: [Option<OpcodeInfo>; 256] = build_table();

/// Every opcode the table knows, in numeric order.
pub fn known() -> impl Iterator<Item = &'static OpcodeInfo> {
    TABLE.iter().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_has_every_rc_uc_ud_opcode_and_cnp() {
        let ops: Vec<u8> = known().map(|i| i.opcode.0).collect();
        let mut want: Vec<u8> = (0x00..=0x14).chain([0x16, 0x17]).collect();
        want.extend(0x20..=0x2b);
        want.extend([0x64, 0x65, 0x81]);
        assert_eq!(ops, want);
        for info in known() {
            assert_eq!(info.opcode.info(), Some(info));
            let pos = format!("{:?}", info.position).to_uppercase();
            if info.has_payload() {
                assert!(info.name.contains(&pos), "{} vs {pos}", info.name);
            }
        }
        // RD, reserved and unverified extension opcodes stay unknown.
        for raw in [
            0x15, 0x18, 0x1c, 0x1d, 0x1f, 0x2c, 0x40, 0x4c, 0x60, 0x63, 0x66, 0x80, 0x82, 0xff,
        ] {
            assert_eq!(Opcode(raw).info(), None, "{raw:#x}");
        }
    }

    #[test]
    fn header_composition_matches_rocev2_section_3() {
        let cases: &[(Opcode, &[ExtHeader], usize, bool)] = &[
            (Opcode::RC_SEND_FIRST, &[], 12, true),
            (Opcode::RC_SEND_LAST_WITH_IMMEDIATE, &[H::ImmDt], 16, true),
            (Opcode::RC_RDMA_WRITE_FIRST, &[H::Reth], 28, true),
            (
                Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE,
                &[H::Reth, H::ImmDt],
                32,
                true,
            ),
            (Opcode::RC_RDMA_READ_REQUEST, &[H::Reth], 28, false),
            (Opcode::RC_RDMA_READ_RESPONSE_FIRST, &[H::Aeth], 16, true),
            (Opcode::RC_RDMA_READ_RESPONSE_MIDDLE, &[], 12, true),
            (Opcode::RC_ACKNOWLEDGE, &[H::Aeth], 16, false),
            (
                Opcode::RC_ATOMIC_ACKNOWLEDGE,
                &[H::Aeth, H::AtomicAckEth],
                24,
                false,
            ),
            (Opcode::RC_COMPARE_SWAP, &[H::AtomicEth], 40, false),
            (Opcode::RC_FETCH_ADD, &[H::AtomicEth], 40, false),
            (Opcode::RC_SEND_ONLY_WITH_INVALIDATE, &[H::Ieth], 16, true),
            (
                Opcode::UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE,
                &[H::Reth, H::ImmDt],
                32,
                true,
            ),
            (
                Opcode::UD_SEND_ONLY_WITH_IMMEDIATE,
                &[H::Deth, H::ImmDt],
                24,
                true,
            ),
            (Opcode::CNP, &[H::CnpReserved], 28, false),
        ];
        for &(op, headers, len, payload) in cases {
            let info = op.info().expect("known");
            assert_eq!(info.headers, headers, "{op}");
            assert_eq!(info.header_len(), len, "{op}");
            assert_eq!(info.has_payload(), payload, "{op}");
        }
        let wi = Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE
            .info()
            .expect("known");
        assert_eq!(wi.offset_of(H::Reth), Some(12));
        assert_eq!(wi.offset_of(H::ImmDt), Some(28));
        assert_eq!(wi.offset_of(H::Aeth), None);
        let aa = Opcode::RC_ATOMIC_ACKNOWLEDGE.info().expect("known");
        assert_eq!(aa.offset_of(H::AtomicAckEth), Some(16));
    }

    #[test]
    fn uc_mirrors_rc_for_send_and_write() {
        for code in 0x00..=0x0b {
            let rc = Opcode(code).info().expect("rc");
            let uc = Opcode(0x20 | code).info().expect("uc");
            assert_eq!(rc.headers, uc.headers);
            assert_eq!(rc.position, uc.position);
            assert_eq!(rc.operation, uc.operation);
            assert_eq!(rc.consumes_recv_wqe, uc.consumes_recv_wqe);
            assert_eq!(uc.transport, Transport::Uc);
            assert_eq!(&uc.name[3..], &rc.name[3..]);
        }
    }

    #[test]
    fn requests_responses_and_receive_wqes() {
        let requests: Vec<u8> = known()
            .filter(|i| i.is_request())
            .map(|i| i.opcode.0)
            .collect();
        let responses: Vec<u8> = known()
            .filter(|i| i.is_response())
            .map(|i| i.opcode.0)
            .collect();
        assert_eq!(responses, vec![0x0d, 0x0e, 0x0f, 0x10, 0x11, 0x12]);
        assert!(!requests.contains(&0x81) && !responses.contains(&0x81));
        assert_eq!(requests.len() + responses.len() + 1, known().count());
        let rwqe: Vec<u8> = known()
            .filter(|i| i.consumes_recv_wqe)
            .map(|i| i.opcode.0)
            .collect();
        assert_eq!(
            rwqe,
            vec![
                0x00, 0x04, 0x05, 0x09, 0x0b, 0x17, 0x20, 0x24, 0x25, 0x29, 0x2b, 0x64, 0x65
            ]
        );
        assert_eq!(Opcode(0x64).transport(), Transport::Ud);
        assert_eq!(Opcode(0x81).transport(), Transport::Cnp);
        assert_eq!(Opcode(0x45).transport(), Transport::Rd);
        assert_eq!(Opcode(0xe1).transport(), Transport::Unknown(7));
    }

    #[test]
    fn payload_length_rules() {
        let m = Mtu::Mtu1024;
        let first = Opcode::RC_SEND_FIRST.info().expect("known");
        let middle = Opcode::RC_RDMA_WRITE_MIDDLE.info().expect("known");
        let last = Opcode::RC_RDMA_READ_RESPONSE_LAST.info().expect("known");
        let only = Opcode::RC_SEND_ONLY.info().expect("known");
        let ack = Opcode::RC_ACKNOWLEDGE.info().expect("known");
        assert!(first.payload_len_ok(1024, m));
        assert!(!first.payload_len_ok(1023, m) && !first.payload_len_ok(1025, m));
        assert!(middle.payload_len_ok(1024, m) && !middle.payload_len_ok(0, m));
        assert!(last.payload_len_ok(1, m) && last.payload_len_ok(1024, m));
        assert!(!last.payload_len_ok(0, m) && !last.payload_len_ok(1025, m));
        assert!(only.payload_len_ok(0, m) && only.payload_len_ok(1024, m));
        assert!(!only.payload_len_ok(1025, m));
        assert!(ack.payload_len_ok(0, m) && !ack.payload_len_ok(1, m));
        assert_eq!(first.payload_rule(), PayloadRule::ExactlyMtu);
        assert_eq!(last.payload_rule(), PayloadRule::OneToMtu);
        assert_eq!(only.payload_rule(), PayloadRule::UpToMtu);
        assert_eq!(ack.payload_rule(), PayloadRule::Empty);
        assert!(PayloadRule::ExactlyMtu.allows(4096, Mtu::Mtu4096));
    }

    #[test]
    fn display_and_debug() {
        assert_eq!(Opcode::RC_FETCH_ADD.to_string(), "RC_FETCH_ADD (0x14)");
        assert_eq!(format!("{:?}", Opcode::CNP), "Opcode(CNP)");
        assert_eq!(format!("{:?}", Opcode(0x1c)), "Opcode(0x1c)");
        assert_eq!(Opcode(0x1c).to_string(), "0x1c");
    }
}
