//! Work requests and work completions.
//!
//! A [`SendWr`] or [`RecvWr`] borrows its scatter/gather list (`&[Sge]`), so
//! building and posting a batch allocates nothing: keep the SGEs in an array
//! on the stack or in a reused buffer. Every numeric code here — send flags,
//! completion status, completion opcode, completion flags — has the ibverbs
//! value, so a status printed by rnic reads the same as one printed by
//! rdma-core tools, and [`WcStatus::as_str`] gives `ibv_wc_status_str`'s text.
//!
//! [`SendWr::validate`] and [`RecvWr::validate`] check a request against the
//! queue pair's type and capacities before it reaches a provider: operations
//! the transport does not have (RDMA on UD, reads and atomics on UC), SGE
//! counts, inline size, and the atomics' 8-byte SGE and alignment rules.

use std::fmt;

use bitflags::bitflags;
use thiserror::Error;

use crate::qp::{AddressVector, QpCaps, QpType};
use crate::types::{Lkey, Qpn, Rkey};
use crate::verbs::AddressHandle;

/// The largest message a work request may describe: 2^31 bytes (what rxe
/// and ConnectX report as `max_msg_sz`).
pub const MAX_MSG_SIZE: u64 = 1 << 31;

/// One scatter/gather entry: `length` bytes at `addr` in the region named by
/// `lkey` (`struct ibv_sge`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Sge {
    /// Address of the first byte, in the region's address space (its `addr`
    /// plus an offset).
    pub addr: u64,
    /// Number of bytes.
    pub length: u32,
    /// Local key of the region holding the bytes.
    pub lkey: Lkey,
}

impl Sge {
    /// An SGE of `length` bytes at `addr` under `lkey`.
    pub const fn new(addr: u64, length: u32, lkey: Lkey) -> Sge {
        Sge { addr, length, lkey }
    }
}

/// Total bytes of a scatter/gather list.
fn sg_total(sg_list: &[Sge]) -> u64 {
    sg_list.iter().map(|s| u64::from(s.length)).sum()
}

bitflags! {
    /// Flags of a send work request (`enum ibv_send_flags`; same bit values).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct SendFlags: u32 {
        /// Wait for earlier RDMA reads and atomics to complete before starting
        /// this request (`IBV_SEND_FENCE` = 1).
        const FENCE = 1;
        /// Produce a work completion on success (`IBV_SEND_SIGNALED` = 2).
        /// Errors always produce one.
        const SIGNALED = 1 << 1;
        /// Set the solicited-event bit, waking a peer waiting for solicited
        /// completions (`IBV_SEND_SOLICITED` = 4).
        const SOLICITED = 1 << 2;
        /// Copy the payload into the work queue entry at post time; the SGE
        /// buffers may be reused as soon as the post returns and need no
        /// registration (`IBV_SEND_INLINE` = 8).
        const INLINE = 1 << 3;
    }
}

/// What a send work request does, with the operands of that operation.
///
/// Immediate data is the value as the application sees it; it travels
/// big-endian in the ImmDt header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SendOp {
    /// Send: consumes a receive at the peer.
    Send,
    /// Send with 32 bits of immediate data delivered in the peer's completion.
    SendWithImm {
        /// Immediate data.
        imm: u32,
    },
    /// Send that also invalidates `rkey` at the peer (RC only).
    SendWithInv {
        /// The remote key to invalidate.
        rkey: Rkey,
    },
    /// Write the local SGEs to `remote_addr` in the peer's region `rkey`.
    RdmaWrite {
        /// Remote address of the first byte.
        remote_addr: u64,
        /// Remote key of the target region.
        rkey: Rkey,
    },
    /// RDMA write that also consumes a receive at the peer, delivering `imm`.
    RdmaWriteWithImm {
        /// Remote address of the first byte.
        remote_addr: u64,
        /// Remote key of the target region.
        rkey: Rkey,
        /// Immediate data.
        imm: u32,
    },
    /// Read from `remote_addr` in the peer's region `rkey` into the local SGEs (RC only).
    RdmaRead {
        /// Remote address of the first byte.
        remote_addr: u64,
        /// Remote key of the source region.
        rkey: Rkey,
    },
    /// 64-bit compare-and-swap at `remote_addr`; the old value lands in the
    /// single 8-byte local SGE (RC only).
    AtomicCmpSwap {
        /// Remote address, 8-byte aligned.
        remote_addr: u64,
        /// Remote key of the target region.
        rkey: Rkey,
        /// Value to compare with.
        compare: u64,
        /// Value stored when the comparison succeeds.
        swap: u64,
    },
    /// 64-bit fetch-and-add at `remote_addr`; the old value lands in the
    /// single 8-byte local SGE (RC only).
    AtomicFetchAdd {
        /// Remote address, 8-byte aligned.
        remote_addr: u64,
        /// Remote key of the target region.
        rkey: Rkey,
        /// Value to add.
        add: u64,
    },
}

impl SendOp {
    /// The operation's name, for messages.
    pub const fn name(&self) -> &'static str {
        match self {
            SendOp::Send => "SEND",
            SendOp::SendWithImm { .. } => "SEND_WITH_IMM",
            SendOp::SendWithInv { .. } => "SEND_WITH_INV",
            SendOp::RdmaWrite { .. } => "RDMA_WRITE",
            SendOp::RdmaWriteWithImm { .. } => "RDMA_WRITE_WITH_IMM",
            SendOp::RdmaRead { .. } => "RDMA_READ",
            SendOp::AtomicCmpSwap { .. } => "ATOMIC_CMP_AND_SWP",
            SendOp::AtomicFetchAdd { .. } => "ATOMIC_FETCH_AND_ADD",
        }
    }

    /// The ibverbs opcode (`enum ibv_wr_opcode`).
    pub const fn ibv_opcode(&self) -> u32 {
        match self {
            SendOp::RdmaWrite { .. } => 0,
            SendOp::RdmaWriteWithImm { .. } => 1,
            SendOp::Send => 2,
            SendOp::SendWithImm { .. } => 3,
            SendOp::RdmaRead { .. } => 4,
            SendOp::AtomicCmpSwap { .. } => 5,
            SendOp::AtomicFetchAdd { .. } => 6,
            SendOp::SendWithInv { .. } => 9,
        }
    }

    /// The opcode of the work completion this request produces.
    pub const fn wc_opcode(&self) -> WcOpcode {
        match self {
            SendOp::Send | SendOp::SendWithImm { .. } | SendOp::SendWithInv { .. } => {
                WcOpcode::Send
            }
            SendOp::RdmaWrite { .. } | SendOp::RdmaWriteWithImm { .. } => WcOpcode::RdmaWrite,
            SendOp::RdmaRead { .. } => WcOpcode::RdmaRead,
            SendOp::AtomicCmpSwap { .. } => WcOpcode::CompSwap,
            SendOp::AtomicFetchAdd { .. } => WcOpcode::FetchAdd,
        }
    }

    /// `true` for the two atomics.
    pub const fn is_atomic(&self) -> bool {
        matches!(
            self,
            SendOp::AtomicCmpSwap { .. } | SendOp::AtomicFetchAdd { .. }
        )
    }

    /// The immediate data, for the two operations that carry it.
    pub const fn imm(&self) -> Option<u32> {
        match self {
            SendOp::SendWithImm { imm } | SendOp::RdmaWriteWithImm { imm, .. } => Some(*imm),
            _ => None,
        }
    }

    /// The remote address and key, for RDMA and atomic operations.
    pub const fn remote(&self) -> Option<(u64, Rkey)> {
        match self {
            SendOp::RdmaWrite { remote_addr, rkey }
            | SendOp::RdmaWriteWithImm {
                remote_addr, rkey, ..
            }
            | SendOp::RdmaRead { remote_addr, rkey }
            | SendOp::AtomicCmpSwap {
                remote_addr, rkey, ..
            }
            | SendOp::AtomicFetchAdd {
                remote_addr, rkey, ..
            } => Some((*remote_addr, *rkey)),
            _ => None,
        }
    }

    /// `true` when a queue pair of `qp_type` can carry this operation: RC
    /// carries everything; UC sends (without invalidate) and RDMA writes; UD
    /// sends (without invalidate) only.
    pub const fn supported_on(&self, qp_type: QpType) -> bool {
        match qp_type {
            QpType::Rc => true,
            QpType::Uc => matches!(
                self,
                SendOp::Send
                    | SendOp::SendWithImm { .. }
                    | SendOp::RdmaWrite { .. }
                    | SendOp::RdmaWriteWithImm { .. }
            ),
            QpType::Ud => matches!(self, SendOp::Send | SendOp::SendWithImm { .. }),
        }
    }
}

/// Where a UD send goes, by value: the peer's address, QPN and Q_Key. This is
/// the form a sans-IO engine takes (`rnic-roce`'s queue pairs, the emulated
/// HCA decoding a WQE's datagram segment). Verbs users name an address handle
/// instead ([`UdSend`], [`SendWr::ud_send`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct UdDest {
    /// Address vector of the peer.
    pub av: AddressVector,
    /// The peer's QPN.
    pub remote_qpn: Qpn,
    /// The peer's Q_Key.
    pub remote_qkey: u32,
}

/// Where a UD send posted through the verbs API goes: an address handle the
/// driver resolved and checked once, at [`crate::ProtectionDomain::create_ah`],
/// and the peer's QPN and Q_Key. The request borrows the handle, so the handle
/// outlives the post call; drivers copy what they need out of it at post time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct UdSend<'a> {
    /// The resolved address of the peer.
    pub ah: &'a AddressHandle,
    /// The peer's QPN.
    pub remote_qpn: Qpn,
    /// The peer's Q_Key.
    pub remote_qkey: u32,
}

/// A UD destination a queue's post path can read: [`UdSend`] (through an
/// address handle) or [`UdDest`] (by value, for engines).
pub trait UdDestination: Copy + fmt::Debug {
    /// The destination by value.
    fn ud_dest(&self) -> UdDest;
}

impl UdDestination for UdDest {
    #[inline]
    fn ud_dest(&self) -> UdDest {
        *self
    }
}

impl UdDestination for UdSend<'_> {
    #[inline]
    fn ud_dest(&self) -> UdDest {
        UdDest {
            av: *self.ah.av(),
            remote_qpn: self.remote_qpn,
            remote_qkey: self.remote_qkey,
        }
    }
}

/// A send work request (`struct ibv_send_wr` without the list link): the
/// batch is a slice instead. `D` is the form of the UD destination: an
/// address handle ([`UdSend`]) through the verbs API, the destination by
/// value ([`UdDest`]) inside sans-IO engines.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SendWr<'a, D = UdSend<'a>> {
    /// Returned in the work completion.
    pub wr_id: u64,
    /// The operation and its operands.
    pub op: SendOp,
    /// Local buffers: gathered for sends and writes, scattered into for reads
    /// and atomics.
    pub sg_list: &'a [Sge],
    /// Signaling, fencing, solicited and inline flags.
    pub flags: SendFlags,
    /// Destination of a UD send; `None` on connected QPs.
    pub ud: Option<D>,
}

impl<'a> SendWr<'a> {
    /// A UD send of `sg_list` to QP `remote_qpn` (Q_Key `remote_qkey`) at the
    /// address `ah` resolved. The request borrows the handle, so the handle
    /// cannot be dropped while a request names it:
    ///
    /// ```compile_fail
    /// use rnic_core::{AddressHandle, AddressVector, Gid, Qpn, SendWr};
    /// let wr = {
    ///     let ah = AddressHandle::unchecked(AddressVector::new(Gid::ZERO));
    ///     SendWr::ud_send(1, &[], &ah, Qpn::from_wire(2), 1)
    /// }; // `ah` dropped here while borrowed
    /// assert!(wr.ud.is_some());
    /// ```
    ///
    /// ```
    /// use rnic_core::{AddressHandle, AddressVector, Gid, Qpn, SendWr};
    /// let ah = AddressHandle::unchecked(AddressVector::new(Gid::ZERO));
    /// let wr = SendWr::ud_send(1, &[], &ah, Qpn::from_wire(2), 1).signaled();
    /// assert_eq!(wr.ud.map(|d| d.remote_qpn), Some(Qpn::from_wire(2)));
    /// ```
    pub const fn ud_send(
        wr_id: u64,
        sg_list: &'a [Sge],
        ah: &'a AddressHandle,
        remote_qpn: Qpn,
        remote_qkey: u32,
    ) -> SendWr<'a> {
        SendWr {
            wr_id,
            op: SendOp::Send,
            sg_list,
            flags: SendFlags::empty(),
            ud: Some(UdSend {
                ah,
                remote_qpn,
                remote_qkey,
            }),
        }
    }
}

impl<'a> SendWr<'a> {
    /// A request for `op` over `sg_list`, unsignaled, no UD destination.
    pub const fn new(wr_id: u64, op: SendOp, sg_list: &'a [Sge]) -> SendWr<'a> {
        SendWr {
            wr_id,
            op,
            sg_list,
            flags: SendFlags::empty(),
            ud: None,
        }
    }

    /// A send of `sg_list`.
    pub const fn send(wr_id: u64, sg_list: &'a [Sge]) -> SendWr<'a> {
        SendWr::new(wr_id, SendOp::Send, sg_list)
    }

    /// A send of `sg_list` with immediate data.
    pub const fn send_with_imm(wr_id: u64, sg_list: &'a [Sge], imm: u32) -> SendWr<'a> {
        SendWr::new(wr_id, SendOp::SendWithImm { imm }, sg_list)
    }

    /// An RDMA write of `sg_list` to `remote_addr` under `rkey`.
    pub const fn rdma_write(
        wr_id: u64,
        sg_list: &'a [Sge],
        remote_addr: u64,
        rkey: Rkey,
    ) -> SendWr<'a> {
        SendWr::new(wr_id, SendOp::RdmaWrite { remote_addr, rkey }, sg_list)
    }

    /// An RDMA write with immediate data.
    pub const fn rdma_write_with_imm(
        wr_id: u64,
        sg_list: &'a [Sge],
        remote_addr: u64,
        rkey: Rkey,
        imm: u32,
    ) -> SendWr<'a> {
        SendWr::new(
            wr_id,
            SendOp::RdmaWriteWithImm {
                remote_addr,
                rkey,
                imm,
            },
            sg_list,
        )
    }

    /// An RDMA read from `remote_addr` under `rkey` into `sg_list`.
    pub const fn rdma_read(
        wr_id: u64,
        sg_list: &'a [Sge],
        remote_addr: u64,
        rkey: Rkey,
    ) -> SendWr<'a> {
        SendWr::new(wr_id, SendOp::RdmaRead { remote_addr, rkey }, sg_list)
    }

    /// A compare-and-swap; `result` must be one 8-byte SGE.
    pub const fn atomic_cmp_swap(
        wr_id: u64,
        result: &'a [Sge],
        remote_addr: u64,
        rkey: Rkey,
        compare: u64,
        swap: u64,
    ) -> SendWr<'a> {
        SendWr::new(
            wr_id,
            SendOp::AtomicCmpSwap {
                remote_addr,
                rkey,
                compare,
                swap,
            },
            result,
        )
    }

    /// A fetch-and-add; `result` must be one 8-byte SGE.
    pub const fn atomic_fetch_add(
        wr_id: u64,
        result: &'a [Sge],
        remote_addr: u64,
        rkey: Rkey,
        add: u64,
    ) -> SendWr<'a> {
        SendWr::new(
            wr_id,
            SendOp::AtomicFetchAdd {
                remote_addr,
                rkey,
                add,
            },
            result,
        )
    }
}

impl<'a, D> SendWr<'a, D> {
    /// The same request with `SIGNALED` added.
    #[must_use]
    pub const fn signaled(self) -> SendWr<'a, D> {
        self.with_flags(SendFlags::SIGNALED)
    }

    /// The same request with `INLINE` added.
    #[must_use]
    pub const fn inline(self) -> SendWr<'a, D> {
        self.with_flags(SendFlags::INLINE)
    }

    /// The same request with `flags` added.
    #[must_use]
    pub const fn with_flags(mut self, flags: SendFlags) -> SendWr<'a, D> {
        self.flags = self.flags.union(flags);
        self
    }

    /// The same request addressed to a UD peer: through an address handle
    /// ([`crate::AddressHandle::ud_dest`]) for the verbs API, or by value
    /// ([`UdDest`]) for an engine.
    #[must_use]
    pub fn to_ud<E>(self, dest: E) -> SendWr<'a, E> {
        SendWr {
            wr_id: self.wr_id,
            op: self.op,
            sg_list: self.sg_list,
            flags: self.flags,
            ud: Some(dest),
        }
    }

    /// Total bytes of the scatter/gather list.
    pub fn total_len(&self) -> u64 {
        sg_total(self.sg_list)
    }

    /// `true` when the request produces a completion on success, given the
    /// QP's `sq_sig_all`.
    pub const fn is_signaled(&self, sq_sig_all: bool) -> bool {
        sq_sig_all || self.flags.contains(SendFlags::SIGNALED)
    }

    /// Check the request against a queue pair of `qp_type` created with `caps`.
    pub fn validate(&self, qp_type: QpType, caps: &QpCaps) -> Result<(), WrError> {
        let op = self.op.name();
        if !self.op.supported_on(qp_type) {
            return Err(WrError::OpNotSupported { op, qp_type });
        }
        match (qp_type, &self.ud) {
            (QpType::Ud, None) => return Err(WrError::MissingUdDest),
            // The address handle's vector was checked by `create_ah`.
            (QpType::Ud, Some(_)) => {}
            (_, Some(_)) => return Err(WrError::UdDestOnConnectedQp { qp_type }),
            (_, None) => {}
        }
        let count = self.sg_list.len();
        if count > caps.max_send_sge as usize {
            return Err(WrError::TooManySges {
                count,
                max: caps.max_send_sge,
            });
        }
        let len = self.total_len();
        if len > MAX_MSG_SIZE {
            return Err(WrError::MessageTooLong { len });
        }
        if self.flags.contains(SendFlags::INLINE) {
            if matches!(self.op, SendOp::RdmaRead { .. }) || self.op.is_atomic() {
                return Err(WrError::InlineNotAllowed { op });
            }
            if len > u64::from(caps.max_inline_data) {
                return Err(WrError::InlineTooLarge {
                    len,
                    max: caps.max_inline_data,
                });
            }
        }
        if let SendOp::AtomicCmpSwap { remote_addr, .. }
        | SendOp::AtomicFetchAdd { remote_addr, .. } = self.op
        {
            if count != 1 || len != 8 {
                return Err(WrError::AtomicSge { count, len });
            }
            if !remote_addr.is_multiple_of(8) {
                return Err(WrError::AtomicAlignment { remote_addr });
            }
        }
        Ok(())
    }
}

/// A receive work request (`struct ibv_recv_wr` without the list link).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RecvWr<'a> {
    /// Returned in the work completion.
    pub wr_id: u64,
    /// Buffers the incoming message is scattered into. On UD the first 40
    /// bytes receive the GRH.
    pub sg_list: &'a [Sge],
}

impl<'a> RecvWr<'a> {
    /// A receive into `sg_list`.
    pub const fn new(wr_id: u64, sg_list: &'a [Sge]) -> RecvWr<'a> {
        RecvWr { wr_id, sg_list }
    }

    /// Total bytes of the scatter/gather list.
    pub fn total_len(&self) -> u64 {
        sg_total(self.sg_list)
    }

    /// Check the request against a queue pair created with `caps`.
    pub fn validate(&self, caps: &QpCaps) -> Result<(), WrError> {
        let count = self.sg_list.len();
        if count > caps.max_recv_sge as usize {
            return Err(WrError::TooManySges {
                count,
                max: caps.max_recv_sge,
            });
        }
        let len = self.total_len();
        if len > MAX_MSG_SIZE {
            return Err(WrError::MessageTooLong { len });
        }
        Ok(())
    }
}

/// Why a work request was refused before reaching a provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum WrError {
    /// The QP type does not carry this operation.
    #[error(
        "{qp_type} QPs cannot post {op}: RC carries every operation, UC sends and RDMA writes, \
         UD sends only; use an RC QP"
    )]
    OpNotSupported {
        /// The operation.
        op: &'static str,
        /// The QP type.
        qp_type: QpType,
    },
    /// A UD send without a destination.
    #[error(
        "a UD send needs a destination: build it with SendWr::ud_send (an address handle from create_ah)"
    )]
    MissingUdDest,
    /// A UD destination on a connected QP.
    #[error(
        "{qp_type} QPs send to the peer set at RTR: remove the UD destination from the request"
    )]
    UdDestOnConnectedQp {
        /// The QP type.
        qp_type: QpType,
    },
    /// More SGEs than the QP was created for.
    #[error(
        "the request has {count} SGEs but the queue allows {max}: split it, or create the QP with a \
         larger max_send_sge / max_recv_sge"
    )]
    TooManySges {
        /// SGEs in the request.
        count: usize,
        /// The queue's limit.
        max: u32,
    },
    /// More bytes than one message may carry.
    #[error("the request describes {len} bytes; a message carries at most 2^31 bytes: split it")]
    MessageTooLong {
        /// Total bytes of the request.
        len: u64,
    },
    /// INLINE on an operation that reads into local memory.
    #[error("{op} cannot be INLINE (it writes into local memory): remove SendFlags::INLINE")]
    InlineNotAllowed {
        /// The operation.
        op: &'static str,
    },
    /// More inline bytes than the QP allows.
    #[error(
        "{len} bytes do not fit inline (max_inline_data is {max}): post without SendFlags::INLINE \
         from a registered buffer, or create the QP with a larger max_inline_data"
    )]
    InlineTooLarge {
        /// Total bytes of the request.
        len: u64,
        /// The QP's `max_inline_data`.
        max: u32,
    },
    /// An atomic without exactly one 8-byte result SGE.
    #[error(
        "an atomic needs exactly one 8-byte SGE for the old value; this one has {count} SGEs \
         totalling {len} bytes"
    )]
    AtomicSge {
        /// SGEs in the request.
        count: usize,
        /// Total bytes of the request.
        len: u64,
    },
    /// An atomic on a remote address that is not 8-byte aligned.
    #[error(
        "atomic remote address {remote_addr:#x} is not 8-byte aligned: atomics operate on aligned 64-bit words"
    )]
    AtomicAlignment {
        /// The refused address.
        remote_addr: u64,
    },
}

/// Status of a work completion (`enum ibv_wc_status`; same values).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum WcStatus {
    /// 0: the request completed.
    #[default]
    Success,
    /// 1: a local length error (receive buffer too small, message too long).
    LocLenErr,
    /// 2: a local QP operation error (malformed WQE, QP state).
    LocQpOpErr,
    /// 3: local EE context operation error (RD only).
    LocEecOpErr,
    /// 4: local protection error (bad lkey, PD mismatch, SGE outside the region).
    LocProtErr,
    /// 5: flushed: the QP entered the error state with the request outstanding.
    WrFlushErr,
    /// 6: memory window bind error.
    MwBindErr,
    /// 7: bad response from the peer (unexpected opcode).
    BadRespErr,
    /// 8: local access error (the region lacks the right to be written).
    LocAccessErr,
    /// 9: the peer refused the request as invalid (NAK invalid request).
    RemInvReqErr,
    /// 10: the peer refused access (NAK remote access: bad rkey, bounds, rights).
    RemAccessErr,
    /// 11: the peer failed to carry out the operation (NAK remote operational error).
    RemOpErr,
    /// 12: transport retries exhausted (no ACK within timeout × (retry_cnt + 1)).
    RetryExcErr,
    /// 13: RNR retries exhausted (the peer had no receive posted).
    RnrRetryExcErr,
    /// 14: local RDD violation (RD only).
    LocRddViolErr,
    /// 15: remote invalid RD request (RD only).
    RemInvRdReqErr,
    /// 16: the operation was aborted.
    RemAbortErr,
    /// 17: invalid EE context number (RD only).
    InvEecnErr,
    /// 18: invalid EE context state (RD only).
    InvEecStateErr,
    /// 19: fatal error.
    FatalErr,
    /// 20: response timeout.
    RespTimeoutErr,
    /// 21: general error.
    GeneralErr,
    /// A value ibverbs does not define (kept, never dropped).
    Unknown(u32),
}

impl WcStatus {
    /// The 22 defined statuses, by value.
    pub const DEFINED: [WcStatus; 22] = [
        WcStatus::Success,
        WcStatus::LocLenErr,
        WcStatus::LocQpOpErr,
        WcStatus::LocEecOpErr,
        WcStatus::LocProtErr,
        WcStatus::WrFlushErr,
        WcStatus::MwBindErr,
        WcStatus::BadRespErr,
        WcStatus::LocAccessErr,
        WcStatus::RemInvReqErr,
        WcStatus::RemAccessErr,
        WcStatus::RemOpErr,
        WcStatus::RetryExcErr,
        WcStatus::RnrRetryExcErr,
        WcStatus::LocRddViolErr,
        WcStatus::RemInvRdReqErr,
        WcStatus::RemAbortErr,
        WcStatus::InvEecnErr,
        WcStatus::InvEecStateErr,
        WcStatus::FatalErr,
        WcStatus::RespTimeoutErr,
        WcStatus::GeneralErr,
    ];

    /// From the ibverbs value.
    pub const fn from_raw(raw: u32) -> WcStatus {
        if raw < 22 {
            WcStatus::DEFINED[raw as usize]
        } else {
            WcStatus::Unknown(raw)
        }
    }

    /// The ibverbs value.
    pub const fn as_raw(self) -> u32 {
        match self {
            WcStatus::Success => 0,
            WcStatus::LocLenErr => 1,
            WcStatus::LocQpOpErr => 2,
            WcStatus::LocEecOpErr => 3,
            WcStatus::LocProtErr => 4,
            WcStatus::WrFlushErr => 5,
            WcStatus::MwBindErr => 6,
            WcStatus::BadRespErr => 7,
            WcStatus::LocAccessErr => 8,
            WcStatus::RemInvReqErr => 9,
            WcStatus::RemAccessErr => 10,
            WcStatus::RemOpErr => 11,
            WcStatus::RetryExcErr => 12,
            WcStatus::RnrRetryExcErr => 13,
            WcStatus::LocRddViolErr => 14,
            WcStatus::RemInvRdReqErr => 15,
            WcStatus::RemAbortErr => 16,
            WcStatus::InvEecnErr => 17,
            WcStatus::InvEecStateErr => 18,
            WcStatus::FatalErr => 19,
            WcStatus::RespTimeoutErr => 20,
            WcStatus::GeneralErr => 21,
            WcStatus::Unknown(raw) => raw,
        }
    }

    /// The text `ibv_wc_status_str` gives (`"unknown"` for undefined values).
    pub const fn as_str(self) -> &'static str {
        match self {
            WcStatus::Success => "success",
            WcStatus::LocLenErr => "local length error",
            WcStatus::LocQpOpErr => "local QP operation error",
            WcStatus::LocEecOpErr => "local EE context operation error",
            WcStatus::LocProtErr => "local protection error",
            WcStatus::WrFlushErr => "Work Request Flushed Error",
            WcStatus::MwBindErr => "memory management operation error",
            WcStatus::BadRespErr => "bad response error",
            WcStatus::LocAccessErr => "local access error",
            WcStatus::RemInvReqErr => "remote invalid request error",
            WcStatus::RemAccessErr => "remote access error",
            WcStatus::RemOpErr => "remote operation error",
            WcStatus::RetryExcErr => "transport retry counter exceeded",
            WcStatus::RnrRetryExcErr => "RNR retry counter exceeded",
            WcStatus::LocRddViolErr => "local RDD violation error",
            WcStatus::RemInvRdReqErr => "remote invalid RD request",
            WcStatus::RemAbortErr => "aborted error",
            WcStatus::InvEecnErr => "invalid EE context number",
            WcStatus::InvEecStateErr => "invalid EE context state",
            WcStatus::FatalErr => "fatal error",
            WcStatus::RespTimeoutErr => "response timeout error",
            WcStatus::GeneralErr => "general error",
            WcStatus::Unknown(_) => "unknown",
        }
    }

    /// `true` for [`WcStatus::Success`].
    pub const fn is_success(self) -> bool {
        matches!(self, WcStatus::Success)
    }
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.as_str(), self.as_raw())
    }
}

/// What a completed request was (`enum ibv_wc_opcode`; same values).
///
/// rnic providers set it on error completions too (unlike ibverbs, where it
/// is undefined there): receive-queue completions always carry a receive
/// opcode, which is how credits find their way back (see
/// [`crate::cq`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum WcOpcode {
    /// 0: a send (with or without immediate or invalidate).
    #[default]
    Send,
    /// 1: an RDMA write (with or without immediate).
    RdmaWrite,
    /// 2: an RDMA read.
    RdmaRead,
    /// 3: a compare-and-swap.
    CompSwap,
    /// 4: a fetch-and-add.
    FetchAdd,
    /// 5: a memory-window bind.
    BindMw,
    /// 6: a local invalidate.
    LocalInv,
    /// 128: a receive consumed by a send.
    Recv,
    /// 129: a receive consumed by an RDMA write with immediate.
    RecvRdmaWithImm,
    /// A value rnic does not know (kept, never dropped).
    Unknown(u32),
}

impl WcOpcode {
    /// From the ibverbs value.
    pub const fn from_raw(raw: u32) -> WcOpcode {
        match raw {
            0 => WcOpcode::Send,
            1 => WcOpcode::RdmaWrite,
            2 => WcOpcode::RdmaRead,
            3 => WcOpcode::CompSwap,
            4 => WcOpcode::FetchAdd,
            5 => WcOpcode::BindMw,
            6 => WcOpcode::LocalInv,
            128 => WcOpcode::Recv,
            129 => WcOpcode::RecvRdmaWithImm,
            _ => WcOpcode::Unknown(raw),
        }
    }

    /// The ibverbs value.
    pub const fn as_raw(self) -> u32 {
        match self {
            WcOpcode::Send => 0,
            WcOpcode::RdmaWrite => 1,
            WcOpcode::RdmaRead => 2,
            WcOpcode::CompSwap => 3,
            WcOpcode::FetchAdd => 4,
            WcOpcode::BindMw => 5,
            WcOpcode::LocalInv => 6,
            WcOpcode::Recv => 128,
            WcOpcode::RecvRdmaWithImm => 129,
            WcOpcode::Unknown(raw) => raw,
        }
    }

    /// `true` for receive-queue completions (`IBV_WC_RECV` bit, 128, set).
    pub const fn is_recv(self) -> bool {
        self.as_raw() & 0x80 != 0
    }
}

bitflags! {
    /// Flags of a work completion (`enum ibv_wc_flags`; same bit values).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct WcFlags: u32 {
        /// The first 40 bytes of the receive buffer hold a GRH (UD).
        const GRH = 1;
        /// `imm_data` is valid.
        const WITH_IMM = 1 << 1;
        /// The IP checksum was verified.
        const IP_CSUM_OK = 1 << 2;
        /// `invalidated_rkey` is valid.
        const WITH_INV = 1 << 3;
    }
}

/// A work completion (`struct ibv_wc`). `Copy` and `Default`, so a caller
/// polls into a `[WorkCompletion; N]` on its stack.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct WorkCompletion {
    /// The `wr_id` of the completed request.
    pub wr_id: u64,
    /// How it ended.
    pub status: WcStatus,
    /// What it was.
    pub opcode: WcOpcode,
    /// Provider-specific error detail (the CQE syndrome on mlx5).
    pub vendor_err: u32,
    /// Bytes received (receives) or transferred (reads, atomics: 8).
    pub byte_len: u32,
    /// Immediate data of a send or write with immediate (receives only).
    pub imm_data: Option<u32>,
    /// The rkey a send with invalidate invalidated (receives only).
    pub invalidated_rkey: Option<Rkey>,
    /// The local QP the request was posted on.
    pub qp_num: Qpn,
    /// The sending QP (UD receives).
    pub src_qp: Qpn,
    /// GRH / immediate / invalidate / checksum flags.
    pub wc_flags: WcFlags,
    /// P_Key index (GSI only).
    pub pkey_index: u16,
    /// Source LID (InfiniBand; 0 on RoCE).
    pub slid: u16,
    /// Service level.
    pub sl: u8,
    /// Destination LID path bits (InfiniBand; 0 on RoCE).
    pub dlid_path_bits: u8,
    /// Send completions: how many unsignaled requests of the same QP,
    /// posted before this one, it retires with it (they produce no
    /// completion of their own). 0 for receives. Drivers fill it (rnic-roce's
    /// engine counts them; mlx5 reads them off the CQE's `wqe_counter`), so
    /// nobody searches for a `wr_id`.
    pub retired_unsignaled: u32,
}

impl WorkCompletion {
    /// `true` when the request completed successfully.
    pub const fn is_success(&self) -> bool {
        self.status.is_success()
    }

    /// `true` for receive-queue completions.
    pub const fn is_recv(&self) -> bool {
        self.opcode.is_recv()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Gid;

    const CAPS: QpCaps = QpCaps {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 2,
        max_recv_sge: 3,
        max_inline_data: 64,
    };

    fn sge(len: u32) -> Sge {
        Sge::new(0x1000, len, Lkey(7))
    }

    fn ud_dest() -> UdDest {
        UdDest {
            av: AddressVector::new(Gid::ZERO),
            remote_qpn: Qpn::from_wire(0x12),
            remote_qkey: 0x1111_1111,
        }
    }

    fn all_ops() -> [SendOp; 8] {
        let rkey = Rkey(9);
        [
            SendOp::Send,
            SendOp::SendWithImm { imm: 1 },
            SendOp::SendWithInv { rkey },
            SendOp::RdmaWrite {
                remote_addr: 0x40,
                rkey,
            },
            SendOp::RdmaWriteWithImm {
                remote_addr: 0x40,
                rkey,
                imm: 2,
            },
            SendOp::RdmaRead {
                remote_addr: 0x40,
                rkey,
            },
            SendOp::AtomicCmpSwap {
                remote_addr: 0x40,
                rkey,
                compare: 1,
                swap: 2,
            },
            SendOp::AtomicFetchAdd {
                remote_addr: 0x40,
                rkey,
                add: 1,
            },
        ]
    }

    #[test]
    fn ops_per_qp_type() {
        let one = [sge(8)];
        let ah = AddressHandle::unchecked(AddressVector::new(Gid::ZERO));
        for op in all_ops() {
            for qp_type in QpType::ALL {
                let mut wr = SendWr::new(1, op, &one);
                if qp_type == QpType::Ud {
                    wr = wr.to_ud(ah.ud_dest(Qpn::from_wire(0x12), 1));
                }
                let expect_ok = match qp_type {
                    QpType::Rc => true,
                    QpType::Uc => matches!(
                        op,
                        SendOp::Send
                            | SendOp::SendWithImm { .. }
                            | SendOp::RdmaWrite { .. }
                            | SendOp::RdmaWriteWithImm { .. }
                    ),
                    QpType::Ud => matches!(op, SendOp::Send | SendOp::SendWithImm { .. }),
                };
                let got = wr.validate(qp_type, &CAPS);
                if expect_ok {
                    assert_eq!(got, Ok(()), "{} on {qp_type}", op.name());
                } else {
                    assert_eq!(
                        got,
                        Err(WrError::OpNotSupported {
                            op: op.name(),
                            qp_type
                        })
                    );
                }
            }
        }
    }

    #[test]
    fn ud_destination_rules() {
        let one = [sge(8)];
        let ah = AddressHandle::unchecked(AddressVector::new(Gid::ZERO));
        assert_eq!(
            SendWr::send(1, &one).validate(QpType::Ud, &CAPS),
            Err(WrError::MissingUdDest)
        );
        assert_eq!(
            SendWr::send(1, &one)
                .to_ud(ah.ud_dest(Qpn::from_wire(0x12), 1))
                .validate(QpType::Rc, &CAPS),
            Err(WrError::UdDestOnConnectedQp {
                qp_type: QpType::Rc
            })
        );
        let wr = SendWr::ud_send(1, &one, &ah, Qpn::from_wire(0x12), 0x1111_1111);
        assert_eq!(wr.validate(QpType::Ud, &CAPS), Ok(()));
        assert_eq!(wr.ud.map(|d| d.ud_dest()), Some(ud_dest()));
    }

    #[test]
    fn sge_count_and_length_limits() {
        let three = [sge(1), sge(2), sge(3)];
        assert_eq!(
            SendWr::send(1, &three).validate(QpType::Rc, &CAPS),
            Err(WrError::TooManySges { count: 3, max: 2 })
        );
        assert_eq!(
            SendWr::send(1, &three[..2]).validate(QpType::Rc, &CAPS),
            Ok(())
        );
        assert_eq!(RecvWr::new(1, &three).validate(&CAPS), Ok(()));
        let four = [sge(1); 4];
        assert_eq!(
            RecvWr::new(1, &four).validate(&CAPS),
            Err(WrError::TooManySges { count: 4, max: 3 })
        );
        let huge = [sge(u32::MAX), sge(u32::MAX)];
        assert_eq!(
            SendWr::send(1, &huge).validate(QpType::Rc, &CAPS),
            Err(WrError::MessageTooLong {
                len: 2 * u64::from(u32::MAX)
            })
        );
        // Zero SGEs is a valid zero-byte send.
        assert_eq!(SendWr::send(1, &[]).validate(QpType::Rc, &CAPS), Ok(()));
    }

    #[test]
    fn inline_rules() {
        let fits = [sge(32), sge(32)];
        assert_eq!(
            SendWr::send(1, &fits).inline().validate(QpType::Rc, &CAPS),
            Ok(())
        );
        let too_big = [sge(64), sge(1)];
        assert_eq!(
            SendWr::send(1, &too_big)
                .inline()
                .validate(QpType::Rc, &CAPS),
            Err(WrError::InlineTooLarge { len: 65, max: 64 })
        );
        // Without INLINE the same request is fine.
        assert_eq!(
            SendWr::send(1, &too_big).validate(QpType::Rc, &CAPS),
            Ok(())
        );
        let one = [sge(8)];
        assert_eq!(
            SendWr::rdma_read(1, &one, 0, Rkey(1))
                .inline()
                .validate(QpType::Rc, &CAPS),
            Err(WrError::InlineNotAllowed { op: "RDMA_READ" })
        );
        assert_eq!(
            SendWr::atomic_fetch_add(1, &one, 0, Rkey(1), 1)
                .inline()
                .validate(QpType::Rc, &CAPS),
            Err(WrError::InlineNotAllowed {
                op: "ATOMIC_FETCH_AND_ADD"
            })
        );
    }

    #[test]
    fn atomic_rules() {
        let one8 = [sge(8)];
        assert_eq!(
            SendWr::atomic_cmp_swap(1, &one8, 0x48, Rkey(1), 0, 1).validate(QpType::Rc, &CAPS),
            Ok(())
        );
        assert_eq!(
            SendWr::atomic_cmp_swap(1, &[sge(4)], 0x48, Rkey(1), 0, 1).validate(QpType::Rc, &CAPS),
            Err(WrError::AtomicSge { count: 1, len: 4 })
        );
        assert_eq!(
            SendWr::atomic_fetch_add(1, &[sge(4), sge(4)], 0x48, Rkey(1), 1)
                .validate(QpType::Rc, &CAPS),
            Err(WrError::AtomicSge { count: 2, len: 8 })
        );
        assert_eq!(
            SendWr::atomic_fetch_add(1, &one8, 0x44, Rkey(1), 1).validate(QpType::Rc, &CAPS),
            Err(WrError::AtomicAlignment { remote_addr: 0x44 })
        );
    }

    #[test]
    fn op_accessors() {
        let ops = all_ops();
        let wc: Vec<WcOpcode> = ops.iter().map(SendOp::wc_opcode).collect();
        assert_eq!(
            wc,
            [
                WcOpcode::Send,
                WcOpcode::Send,
                WcOpcode::Send,
                WcOpcode::RdmaWrite,
                WcOpcode::RdmaWrite,
                WcOpcode::RdmaRead,
                WcOpcode::CompSwap,
                WcOpcode::FetchAdd
            ]
        );
        let ibv: Vec<u32> = ops.iter().map(SendOp::ibv_opcode).collect();
        assert_eq!(ibv, [2, 3, 9, 0, 1, 4, 5, 6]);
        assert_eq!(ops[1].imm(), Some(1));
        assert_eq!(ops[4].imm(), Some(2));
        assert_eq!(ops[0].imm(), None);
        assert_eq!(ops[5].remote(), Some((0x40, Rkey(9))));
        assert_eq!(ops[2].remote(), None);
        let one = [sge(8)];
        let wr = SendWr::send(5, &one);
        assert!(!wr.is_signaled(false));
        assert!(wr.is_signaled(true));
        assert!(wr.signaled().is_signaled(false));
        assert_eq!(
            wr.with_flags(SendFlags::FENCE | SendFlags::SOLICITED)
                .flags
                .bits(),
            5
        );
        assert_eq!(SendFlags::INLINE.bits(), 8);
    }

    #[test]
    fn wc_status_values_and_strings() {
        for (i, s) in WcStatus::DEFINED.into_iter().enumerate() {
            assert_eq!(s.as_raw(), i as u32);
            assert_eq!(WcStatus::from_raw(i as u32), s);
        }
        assert_eq!(WcStatus::from_raw(22), WcStatus::Unknown(22));
        assert_eq!(WcStatus::Unknown(99).as_raw(), 99);
        assert_eq!(WcStatus::Unknown(99).as_str(), "unknown");
        assert_eq!(WcStatus::WrFlushErr.as_raw(), 5);
        assert_eq!(WcStatus::WrFlushErr.as_str(), "Work Request Flushed Error");
        assert_eq!(WcStatus::RetryExcErr.as_raw(), 12);
        assert_eq!(
            WcStatus::RetryExcErr.as_str(),
            "transport retry counter exceeded"
        );
        assert_eq!(
            WcStatus::RnrRetryExcErr.as_str(),
            "RNR retry counter exceeded"
        );
        assert_eq!(
            WcStatus::RemInvRdReqErr.as_str(),
            "remote invalid RD request"
        );
        assert_eq!(WcStatus::RemAbortErr.as_str(), "aborted error");
        assert_eq!(WcStatus::GeneralErr.as_raw(), 21);
        assert_eq!(WcStatus::GeneralErr.as_str(), "general error");
        assert_eq!(
            WcStatus::RemAccessErr.to_string(),
            "remote access error (10)"
        );
    }

    #[test]
    fn wc_opcode_values() {
        for raw in [0, 1, 2, 3, 4, 5, 6, 128, 129] {
            let op = WcOpcode::from_raw(raw);
            assert!(!matches!(op, WcOpcode::Unknown(_)));
            assert_eq!(op.as_raw(), raw);
            assert_eq!(op.is_recv(), raw >= 128);
        }
        assert_eq!(WcOpcode::from_raw(7), WcOpcode::Unknown(7));
        assert_eq!(WcOpcode::RecvRdmaWithImm.as_raw(), 129);
        assert_eq!(WcFlags::WITH_INV.bits(), 8);
        let wc = WorkCompletion::default();
        assert!(wc.is_success() && !wc.is_recv());
        assert_eq!(wc.status.as_raw(), 0);
    }
}
