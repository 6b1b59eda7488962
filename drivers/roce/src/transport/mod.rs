//! The RC/UD transport engine: requester, completer and responder as rxe
//! runs them, sans-IO.
//!
//! One [`Qp`] is one queue pair. It owns its send and receive rings
//! (preallocated at creation: WQEs, SGE lists, inline bytes) and three state
//! machines. It never reads a clock, opens a socket or allocates on the
//! packet path: everything comes in through the entry points and goes out
//! through the [`Io`] bundle of traits:
//!
//! | in | out |
//! |---|---|
//! | [`Qp::post_send`] / [`Qp::post_recv`] (work) | [`PacketSink`]: BTH‥payload‥pad + 4 reserved ICRC bytes, and a [`PacketDest`] |
//! | [`Qp::receive`] (an ICRC-verified packet, BTH‥ICRC) | [`CompletionSink`]: [`WorkCompletion`]s in posting order |
//! | [`Qp::on_timer`] at [`Qp::next_deadline`] (time, as [`Instant`]) | [`MemoryAccess`]: key-checked reads, writes, atomics |
//! | [`Qp::modify`] (state, attributes) | [`Qp::stats`]: counters |
//!
//! [`Qp::run`] is the doorbell: it lets the requester emit whatever the
//! window, `max_rd_atomic`, fences and the sink allow, and continues a READ
//! reply the sink had no room for. Every entry point that can make progress
//! calls it, so a provider only needs it after posting.
//!
//! # State machines
//!
//! **QP state** ([`QpState`]): RESET and INIT drop every packet
//! (`drops.bad_state`); RTR runs the responder only; RTS runs all three;
//! ERR flushes every posted WQE with `WR_FLUSH_ERR` (send side first, then
//! receive side) and completes later posts the same way at once.
//!
//! **Requester** (`requester.rs`, §8): walks the send ring from the oldest
//! unsent WQE. A WQE is *posted* until it starts, which assigns its PSN
//! range (one PSN per packet; a READ takes one per response packet), then
//! *started* until the completer retires it. A WQE starts only when its
//! fence (wait for every earlier WQE) and `max_rd_atomic` (outstanding
//! READ/atomics) allow, and its local SGEs pass the L_Key checks (else it is
//! marked failed with `LOC_PROT_ERR`/`LOC_LEN_ERR` and the completer fails it
//! in order). Packets go out FIRST/MIDDLE…/LAST or ONLY by path MTU while
//! fewer than 128 PSNs are unacknowledged; AckReq is set on the last packet
//! of a message and on every 64th packet. A retry (go-back-N) rewinds the
//! requester to the completer's PSN: the oldest WQE resumes after its
//! acknowledged packets (a READ is re-issued for its missing tail), later
//! WQEs are re-sent whole.
//!
//! **Completer** (`completer.rs`, §8): takes responses in PSN order against
//! the oldest started WQE. ACKs are cumulative (a response for PSN n retires
//! every SEND/WRITE ending at or before n); a response beyond an unanswered
//! READ/atomic means its response was lost and starts a retry; responses
//! older than the completer's PSN are duplicates. READ responses are written
//! into the local SGEs; atomic ACKs deliver the original value. NAK
//! PSN-sequence rewinds to the NAK's PSN and retries; RNR NAK waits the
//! peer's RNR timer, then retries (`rnr_retry`, 7 = infinite); NAK invalid
//! request / remote access / remote operational fail the WQE with
//! `REM_INV_REQ_ERR` / `REM_ACCESS_ERR` / `REM_OP_ERR` and move the QP to
//! ERR. The local ACK timer (4.096 µs·2^timeout, 0 = off) is armed while
//! anything is outstanding and re-armed on progress; expiry retries, counted
//! against `retry_cnt` (reset on progress; 7 = infinite like rxe unless
//! [`QpConfig::retry_cnt_7_infinite`] is off). Exhaustion fails the WQE with
//! `RETRY_EXC_ERR` / `RNR_RETRY_EXC_ERR` and flushes the rest.
//!
//! **Responder** (`responder.rs`, §9): checks, in rxe's order, the PSN
//! (gap → one `PSN_SEQ` NAK per gap, then silent drops; older → duplicate),
//! the opcode sequence (MIDDLE/LAST only inside a message of the same kind),
//! the QP's access flags, a receive WQE (else RNR NAK), lengths (FIRST and
//! MIDDLE exactly MTU, LAST 1‥MTU, ONLY 0‥MTU, and the RETH length), and the
//! R_Key (exists, same PD, grants the access, whole range inside) — all
//! before a byte of memory is touched. Errors NAK (invalid request, remote
//! access, remote operational) and move the QP to ERR, as rxe's class A/C
//! handling does. ACKs go only to packets with AckReq. Duplicate SEND/WRITE
//! are re-ACKed with the last processed PSN, duplicate READs are replayed
//! from the resource ring (`max_dest_rd_atomic` entries) re-reading memory,
//! duplicate atomics get their saved ATOMIC ACK; nothing is executed twice.
//!
//! **UD** (`ud.rs`): one packet per SEND with DETH (Q_Key, source QPN); a
//! send completes when emitted; a receive checks the Q_Key, needs a posted
//! receive (no RNR on UD: dropped and counted), fills a 40-byte GRH area and
//! reports the source QPN.
//!
//! # Counters ([`QpStats`])
//!
//! `tx_*`/`rx_*` count packets and bytes at the sink and at `receive`;
//! `retransmits` counts request packets sent a second time, `retries` the
//! go-back-N rounds, `timeouts` the ACK-timer expiries; `naks_sent` /
//! `naks_received` count by AETH code; `rnr_waits` the RNR NAKs that paused
//! the requester; `duplicate_requests` / `duplicate_responses` the
//! duplicates each side absorbed; `read_replays` / `atomic_replays` what the
//! resource ring answered; `drops` every packet discarded, by reason (see
//! [`DropCounts`]).

mod completer;
mod pkt;
mod qp;
mod queue;
mod requester;
mod responder;
mod stats;
mod ud;

#[cfg(test)]
pub(crate) mod sim;
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;
#[cfg(test)]
mod tests;

use core::time::Duration;
use std::sync::Arc;

use rnic_core::{
    AddressVector, Lkey, Memory, PdHandle, QpState, QpType, Qpn, Rkey, WorkCompletion,
};

pub use completer::{ExpectedResponse, ReadPlacement};
pub use qp::{Qp, QpConfig};
pub use requester::DEFAULT_MAX_UNACKED_PSNS;
pub use stats::{DropCounts, NakCounts, QpStats};
pub use ud::GRH_LEN;

/// A point in time in nanoseconds on the caller's clock. The engine only
/// compares and adds; where zero lies is the caller's business.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Instant(u64);

impl Instant {
    /// The instant `nanos` nanoseconds after the clock's zero.
    pub const fn from_nanos(nanos: u64) -> Instant {
        Instant(nanos)
    }

    /// Nanoseconds since the clock's zero.
    pub const fn nanos(self) -> u64 {
        self.0
    }

    /// `self + d`, saturating.
    #[must_use]
    pub fn after(self, d: Duration) -> Instant {
        let n = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        Instant(self.0.saturating_add(n))
    }
}

/// Where one emitted packet goes: the address vector (the provider builds
/// the IP/UDP headers from it; a `None` UDP source port is the provider's to
/// derive) and the destination QP (also in the BTH).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PacketDest {
    /// The peer's address: the QP's for RC, the work request's for UD.
    pub av: AddressVector,
    /// BTH DestQP.
    pub qpn: Qpn,
}

/// Where the engine writes packets. Two steps, so no packet is built in a
/// temporary: [`PacketSink::buffer`] lends at least `len` bytes, the engine
/// writes BTH‥payload‥pad and zeroes the 4 ICRC bytes at the end, then
/// [`PacketSink::commit`] hands it over (the sink fills the ICRC: it knows
/// the IP/UDP headers).
///
/// A sink that sends payloads from registered memory in place (a software
/// transport handing the kernel iovecs into the region) says so with
/// [`PacketSink::gather_min`]: for a payload at least that long whose
/// memory offers direct access ([`MemoryAccess::lend`]) the engine writes
/// only the headers and the zeroed pad and ICRC into the lent buffer and
/// commits with [`PacketSink::commit_gather`], naming the payload's pieces
/// instead of copying them.
pub trait PacketSink {
    /// A buffer of at least `len` bytes for the next packet, or `None` when
    /// the sink is full (requests wait for the next [`Qp::run`]; ACKs are
    /// dropped and counted in `drops.tx_full`).
    fn buffer(&mut self, len: usize) -> Option<&mut [u8]>;
    /// The first `len` bytes of the last lent buffer are a packet for `dest`.
    fn commit(&mut self, len: usize, dest: &PacketDest);
    /// Payloads of at least this many bytes may be committed in place
    /// ([`PacketSink::commit_gather`]); `usize::MAX` (the default): never.
    fn gather_min(&self) -> usize {
        usize::MAX
    }
    /// The last lent buffer holds a packet's headers (`head` bytes) and then
    /// its `tail` zero bytes (pad and ICRC); its payload is `pieces`, in
    /// order, which go on the wire between the two. The sink keeps each
    /// piece's memory alive until the packet has left and fills the ICRC
    /// over all of it. Only called when [`PacketSink::gather_min`] allows.
    fn commit_gather(&mut self, head: usize, pieces: &[Piece<'_>], tail: usize, dest: &PacketDest) {
        let _ = (head, pieces, tail, dest);
    }
}

/// What [`MemoryAccess::lend`] resolves a range to: the registered memory
/// and the offset of the range's first byte in it.
pub type Lent<'a> = (&'a Arc<dyn Memory>, usize);

/// Part of a packet's payload that a gathering sink sends from registered
/// memory in place: `len` bytes at `offset` of `mem` (validated by
/// [`MemoryAccess::lend`] against the key that named them).
#[derive(Clone, Copy, Debug)]
pub struct Piece<'a> {
    /// The registered memory.
    pub mem: &'a Arc<dyn Memory>,
    /// Offset of the first byte in `mem`.
    pub offset: usize,
    /// Bytes.
    pub len: usize,
}

/// Which completion queue a completion belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CqSide {
    /// The QP's send CQ.
    Send,
    /// The QP's receive CQ.
    Recv,
}

/// Where completions go, in posting order per side.
pub trait CompletionSink {
    /// One completion.
    fn complete(&mut self, side: CqSide, wc: WorkCompletion);
}

/// A memory key as it appears in a work request (L_Key) or on the wire (R_Key).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemKey {
    /// Named by a local SGE.
    Local(Lkey),
    /// Named by the peer (RETH, AtomicETH, IETH).
    Remote(Rkey),
}

/// The right an access needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    /// Gather from a local SGE (always granted by a valid L_Key).
    LocalRead,
    /// Scatter into a local SGE (needs `LOCAL_WRITE`).
    LocalWrite,
    /// Serve an RDMA READ (needs `REMOTE_READ`).
    RemoteRead,
    /// Serve an RDMA WRITE (needs `REMOTE_WRITE`).
    RemoteWrite,
    /// Serve an atomic (needs `REMOTE_ATOMIC`).
    RemoteAtomic,
}

/// Why a memory access was refused. The engine maps these to completions
/// (`LOC_PROT_ERR`, `LOC_LEN_ERR`) and NAKs (remote access error).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemError {
    /// No region with this key (or a stale key byte).
    InvalidKey,
    /// The region belongs to another protection domain.
    WrongPd,
    /// The region does not grant the access.
    AccessDenied,
    /// Part of the range lies outside the region.
    OutOfBounds,
    /// An atomic target that is not 8-byte aligned.
    Misaligned,
    /// More bytes than the scatter list holds.
    Length,
    /// The key exists but names a registration a peer may not invalidate
    /// (anything but a fast-registration MR or a type-2 memory window).
    NotInvalidatable,
}

/// A 64-bit atomic on remote memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtomicOp {
    /// Store `swap` if the value equals `compare`.
    CompareSwap {
        /// Expected value.
        compare: u64,
        /// New value.
        swap: u64,
    },
    /// Add `add` (wrapping).
    FetchAdd {
        /// Addend.
        add: u64,
    },
}

/// Memory access by key. Every method validates the key (exists, belongs to
/// `pd`, grants `access`, whole `[addr, addr + len)` inside the region)
/// before touching a byte and touches nothing on error.
pub trait MemoryAccess {
    /// Validate without touching memory.
    fn check(
        &self,
        pd: PdHandle,
        key: MemKey,
        addr: u64,
        len: u64,
        access: Access,
    ) -> Result<(), MemError>;
    /// Copy `dst.len()` bytes from `addr`.
    fn read(
        &self,
        pd: PdHandle,
        key: MemKey,
        addr: u64,
        dst: &mut [u8],
        access: Access,
    ) -> Result<(), MemError>;
    /// Copy `src` to `addr`.
    fn write(
        &mut self,
        pd: PdHandle,
        key: MemKey,
        addr: u64,
        src: &[u8],
        access: Access,
    ) -> Result<(), MemError>;
    /// Run an atomic on the 8 bytes at `addr` (aligned, `REMOTE_ATOMIC`);
    /// returns the original value (host byte order).
    fn atomic(
        &mut self,
        pd: PdHandle,
        rkey: Rkey,
        addr: u64,
        op: AtomicOp,
    ) -> Result<u64, MemError>;
    /// A peer's SEND_WITH_INVALIDATE of `rkey`: end the registration if it
    /// is in `pd` and of a kind a peer may invalidate (a fast-registration
    /// MR or a type-2 memory window, never a plain `reg_mr` registration);
    /// otherwise refuse and change nothing.
    fn invalidate(&mut self, pd: PdHandle, rkey: Rkey) -> Result<(), MemError>;
    /// The registered memory holding `[addr, addr + len)` and the offset of
    /// `addr` in it, validated as [`MemoryAccess::read`] validates, for a
    /// sink that sends payloads in place; `Ok(None)` when that memory
    /// offers no direct access ([`Memory::direct`]) or this access does not
    /// lend (the default): the engine copies instead.
    fn lend(
        &self,
        pd: PdHandle,
        key: MemKey,
        addr: u64,
        len: u64,
        access: Access,
    ) -> Result<Option<Lent<'_>>, MemError> {
        let _ = (pd, key, addr, len, access);
        Ok(None)
    }
}

/// The outputs of one entry-point call, borrowed for its duration.
pub struct Io<'a> {
    /// Memory by key.
    pub mem: &'a mut dyn MemoryAccess,
    /// Outgoing packets.
    pub tx: &'a mut dyn PacketSink,
    /// Completions.
    pub cq: &'a mut dyn CompletionSink,
}

impl core::fmt::Debug for Io<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("Io")
    }
}

/// Why a post or a modify was refused (nothing was queued or changed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    /// The ring is full.
    #[error("{0:?} queue full: poll completions before posting more")]
    QueueFull(CqSide),
    /// More SGEs than the QP was created for.
    #[error("{got} SGEs exceed the QP's limit of {max}")]
    TooManySge {
        /// SGEs in the work request.
        got: usize,
        /// The QP's limit.
        max: usize,
    },
    /// Inline data longer than the QP's inline buffer.
    #[error("{got} inline bytes exceed the QP's limit of {max}")]
    InlineTooLong {
        /// Bytes asked for.
        got: u64,
        /// The QP's limit.
        max: usize,
    },
    /// Inline data could not be read from its SGEs.
    #[error("inline data unreadable: {0:?} (check the SGE's L_Key and bounds)")]
    InlineRead(MemError),
    /// The operation does not exist on this QP type (e.g. READ on UD), or a
    /// UD send lacks its destination.
    #[error("operation not supported on a {0} QP (UD sends need a UdDest, connected QPs none)")]
    BadOpForQpType(QpType),
    /// The engine does not implement this QP type (UC).
    #[error("the transport engine implements RC and UD, not {0}")]
    UnsupportedQpType(QpType),
    /// Posting to a QP in a state that does not take the work (RESET).
    #[error("post to a QP in state {0}: modify it to INIT first")]
    BadState(QpState),
    /// Invalid attribute value.
    #[error("invalid QP attribute: {0}")]
    BadAttr(&'static str),
}

/// The BTH DestQP of a RoCE packet (BTH‥ICRC), to pick the [`Qp`] to hand it
/// to; `None` when it is too short to be a packet.
pub fn dest_qpn(packet: &[u8]) -> Option<Qpn> {
    pkt::dest_qpn(packet)
}
