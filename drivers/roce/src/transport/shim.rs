//! Local stand-ins for rnic-core's verbs types (`wr.rs`, access flags, QP
//! attributes) until core publishes them.
//!
//! Everything here mirrors the ibverbs shapes the engine needs; when core's
//! modules land this file is replaced by re-exports and the engine keeps
//! compiling against the same names.

use rnic_core::{Lkey, Mtu, Psn, Qpn, Rkey};

/// QP-level remote access rights (the subset of `IBV_ACCESS_*` a responder checks).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AccessFlags(u32);

impl AccessFlags {
    /// No rights.
    pub const EMPTY: AccessFlags = AccessFlags(0);
    /// `IBV_ACCESS_LOCAL_WRITE`.
    pub const LOCAL_WRITE: AccessFlags = AccessFlags(1);
    /// `IBV_ACCESS_REMOTE_WRITE`.
    pub const REMOTE_WRITE: AccessFlags = AccessFlags(1 << 1);
    /// `IBV_ACCESS_REMOTE_READ`.
    pub const REMOTE_READ: AccessFlags = AccessFlags(1 << 2);
    /// `IBV_ACCESS_REMOTE_ATOMIC`.
    pub const REMOTE_ATOMIC: AccessFlags = AccessFlags(1 << 3);
    /// Every right.
    pub const ALL: AccessFlags = AccessFlags(0xf);

    /// All bits of `other` are set in `self`.
    pub const fn contains(self, other: AccessFlags) -> bool {
        self.0 & other.0 == other.0
    }

    /// The union.
    #[must_use]
    pub const fn union(self, other: AccessFlags) -> AccessFlags {
        AccessFlags(self.0 | other.0)
    }

    /// `self` without the bits of `other`.
    #[must_use]
    pub const fn difference(self, other: AccessFlags) -> AccessFlags {
        AccessFlags(self.0 & !other.0)
    }
}

/// One scatter/gather element: `length` bytes at `addr` of the region `lkey`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sge {
    /// Start address (IOVA) inside the region.
    pub addr: u64,
    /// Byte count.
    pub length: u32,
    /// Local key of the region.
    pub lkey: Lkey,
}

/// Flags of a send work request (`IBV_SEND_*`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SendFlags(u32);

impl SendFlags {
    /// No flags.
    pub const EMPTY: SendFlags = SendFlags(0);
    /// Wait for all earlier work requests before starting this one.
    pub const FENCE: SendFlags = SendFlags(1);
    /// Generate a completion on success.
    pub const SIGNALED: SendFlags = SendFlags(1 << 1);
    /// Set the solicited-event bit on the last packet.
    pub const SOLICITED: SendFlags = SendFlags(1 << 2);
    /// Copy the data at post time.
    pub const INLINE: SendFlags = SendFlags(1 << 3);

    /// All bits of `other` are set.
    pub const fn contains(self, other: SendFlags) -> bool {
        self.0 & other.0 == other.0
    }

    /// The union.
    #[must_use]
    pub const fn union(self, other: SendFlags) -> SendFlags {
        SendFlags(self.0 | other.0)
    }
}

/// Where a UD datagram goes (the address handle part of a UD send).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UdDest {
    /// The path to the peer.
    pub path: crate::transport::Path,
    /// The peer's QPN.
    pub remote_qpn: Qpn,
    /// The Q_Key to put in DETH (bit 31 set: use the QP's own Q_Key).
    pub remote_qkey: u32,
}

/// The operation of a send work request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendOp {
    /// SEND.
    Send,
    /// SEND with immediate data.
    SendWithImm(u32),
    /// SEND that invalidates the peer's `Rkey`.
    SendWithInv(Rkey),
    /// RDMA WRITE to `remote_addr` of `rkey`.
    Write {
        /// Remote IOVA.
        remote_addr: u64,
        /// Remote key.
        rkey: Rkey,
    },
    /// RDMA WRITE with immediate data.
    WriteWithImm {
        /// Remote IOVA.
        remote_addr: u64,
        /// Remote key.
        rkey: Rkey,
        /// Immediate data.
        imm: u32,
    },
    /// RDMA READ from `remote_addr` of `rkey` into the local SGEs.
    Read {
        /// Remote IOVA.
        remote_addr: u64,
        /// Remote key.
        rkey: Rkey,
    },
    /// 64-bit compare-and-swap; the original value lands in the first 8 local bytes.
    CompareSwap {
        /// Remote IOVA (8-byte aligned).
        remote_addr: u64,
        /// Remote key.
        rkey: Rkey,
        /// Value to compare with.
        compare: u64,
        /// Value stored when equal.
        swap: u64,
    },
    /// 64-bit fetch-and-add; the original value lands in the first 8 local bytes.
    FetchAdd {
        /// Remote IOVA (8-byte aligned).
        remote_addr: u64,
        /// Remote key.
        rkey: Rkey,
        /// Addend.
        add: u64,
    },
    /// UD SEND (optionally with immediate data).
    UdSend {
        /// Destination.
        dest: UdDest,
        /// Immediate data.
        imm: Option<u32>,
    },
}

/// A send work request.
#[derive(Clone, Copy, Debug)]
pub struct SendWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Local data (gather list; for READ and atomics, the scatter list).
    pub sg_list: &'a [Sge],
    /// The operation.
    pub op: SendOp,
    /// Flags.
    pub flags: SendFlags,
}

/// A receive work request.
#[derive(Clone, Copy, Debug)]
pub struct RecvWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Where incoming data lands.
    pub sg_list: &'a [Sge],
}

/// Completion status (`enum ibv_wc_status`, same numbering).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WcStatus {
    /// Success.
    Success,
    /// Local length error.
    LocLenErr,
    /// Local QP operation error.
    LocQpOpErr,
    /// Local protection error.
    LocProtErr,
    /// Flushed because the QP is in the error state.
    WrFlushErr,
    /// The peer NAKed the request as invalid.
    RemInvReqErr,
    /// The peer refused the remote access.
    RemAccessErr,
    /// The peer failed the operation.
    RemOpErr,
    /// Transport retries exhausted.
    RetryExcErr,
    /// RNR retries exhausted.
    RnrRetryExcErr,
}

/// Completion opcode (`enum ibv_wc_opcode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WcOpcode {
    /// SEND (RC or UD).
    Send,
    /// RDMA WRITE.
    RdmaWrite,
    /// RDMA READ.
    RdmaRead,
    /// Compare-and-swap.
    CompSwap,
    /// Fetch-and-add.
    FetchAdd,
    /// Received SEND.
    Recv,
    /// Received RDMA WRITE with immediate.
    RecvRdmaWithImm,
}

/// A work completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkCompletion {
    /// The work request's id.
    pub wr_id: u64,
    /// Outcome.
    pub status: WcStatus,
    /// What completed.
    pub opcode: WcOpcode,
    /// The local QP.
    pub qp_num: Qpn,
    /// Bytes transferred (receives, READ, atomics).
    pub byte_len: u32,
    /// Immediate data of a received SEND/WRITE with immediate.
    pub imm_data: Option<u32>,
    /// R_Key invalidated by a received SEND with invalidate.
    pub invalidated_rkey: Option<Rkey>,
    /// Source QPN of a UD receive.
    pub src_qp: Option<Qpn>,
    /// The receive buffer starts with a 40-byte GRH (UD receives).
    pub grh: bool,
}

/// QP states (`enum ibv_qp_state`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum QpState {
    /// Just created or reset: nothing moves.
    #[default]
    Reset,
    /// Receives may be posted; packets are dropped.
    Init,
    /// Ready to receive: the responder works.
    Rtr,
    /// Ready to send: requester, completer and responder work.
    Rts,
    /// Error: everything posted is flushed.
    Err,
}

/// The attributes the engine honours (`struct ibv_qp_attr`); `None` leaves
/// a value unchanged.
#[derive(Clone, Copy, Debug, Default)]
pub struct QpAttr {
    /// New state.
    pub state: Option<QpState>,
    /// Path MTU.
    pub path_mtu: Option<Mtu>,
    /// Peer QPN (RC).
    pub dest_qp_num: Option<Qpn>,
    /// Expected first incoming PSN.
    pub rq_psn: Option<Psn>,
    /// First outgoing PSN.
    pub sq_psn: Option<Psn>,
    /// Local ACK timeout exponent (4.096 µs · 2^t; 0 = none).
    pub timeout: Option<u8>,
    /// Transport retries.
    pub retry_cnt: Option<u8>,
    /// RNR retries (7 = infinite).
    pub rnr_retry: Option<u8>,
    /// RNR timer code put in our RNR NAKs.
    pub min_rnr_timer: Option<u8>,
    /// Outstanding READ/atomics we initiate.
    pub max_rd_atomic: Option<u8>,
    /// READ/atomic resources we keep as responder.
    pub max_dest_rd_atomic: Option<u8>,
    /// Remote access rights served by the responder.
    pub access: Option<AccessFlags>,
    /// Q_Key (UD).
    pub qkey: Option<u32>,
    /// The path to the peer (RC).
    pub path: Option<crate::transport::Path>,
}
