//! The [`Provider`] trait every rnic driver implements, the handles it deals
//! in, and [`VerbsError`].
//!
//! A provider is handle-based and object-safe: the facade keeps an
//! `Arc<dyn Provider>` and the RAII wrappers in [`crate::verbs`], [`crate::cq`]
//! and [`crate::queue_pair`] call it with plain `u32` handles. Ownership, the
//! teardown order and credit accounting live in those wrappers, once, instead
//! of in every driver; a provider only has to do what the device does.
//!
//! # Contract
//!
//! * Every method may be called from any thread; calls on different objects
//!   may run concurrently. The wrappers never call `post_send` concurrently for
//!   one QP, nor `poll_cq` concurrently for one CQ.
//! * `post_send` / `post_recv` post the requests in order and stop at the first
//!   one they cannot post, returning [`VerbsError::PostSend`] /
//!   [`VerbsError::PostRecv`] whose `index` is that request's position: exactly
//!   the requests before it were posted. Any other error means none was.
//! * `poll_cq` sets `opcode` on every completion, error and flush completions
//!   included: receive-queue completions carry [`WcOpcode::Recv`] or
//!   [`WcOpcode::RecvRdmaWithImm`], send-queue completions the opcode of their
//!   request. Credits are returned to the right queue by it.
//! * Send-queue completions of a QP arrive in posting order. A failed request
//!   produces a completion even when unsignaled; moving the QP to ERR flushes
//!   every outstanding request with [`WcStatus::WrFlushErr`].
//! * Moving a QP to RESET, or destroying it, discards its outstanding requests
//!   *and* removes its completions still queued in its CQs (as rdma-core's mlx5
//!   provider does).
//! * `reg_mr` keeps its `Arc<dyn Memory>` until `dereg_mr` returns; after that
//!   the device never touches the memory again.
//!
//! [`WcOpcode::Recv`]: crate::wr::WcOpcode::Recv
//! [`WcOpcode::RecvRdmaWithImm`]: crate::wr::WcOpcode::RecvRdmaWithImm
//! [`WcStatus::WrFlushErr`]: crate::wr::WcStatus::WrFlushErr

use std::fmt;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;

use crate::access::{AccessError, AccessFlags};
use crate::memory::Memory;
use crate::qp::{QpAttr, QpAttrMask, QpCaps, QpInitAttr, QpState, QpTransitionError};
use crate::types::{Gid, Lkey, Mtu, Qpn, Rkey};
use crate::wr::{RecvWr, SendWr, WorkCompletion, WrError};

macro_rules! handle {
    ($(#[$doc:meta])* $name:ident, $prefix:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(pub u32);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "#{}"), self.0)
            }
        }
    };
}

handle!(
    /// A provider's name for a protection domain.
    PdHandle,
    "pd"
);
handle!(
    /// A provider's name for a memory region.
    MrHandle,
    "mr"
);
handle!(
    /// A provider's name for a completion queue.
    CqHandle,
    "cq"
);
handle!(
    /// A provider's name for a queue pair.
    QpHandle,
    "qp"
);

/// Which atomics the device guarantees (`enum ibv_atomic_cap`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum AtomicCap {
    /// No atomics.
    #[default]
    None,
    /// Atomic with respect to other atomics through this device.
    Hca,
    /// Atomic with respect to every agent, CPU included.
    Glob,
}

/// Device capabilities (`struct ibv_device_attr`, the fields rnic uses).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct DeviceAttr {
    /// Firmware version text.
    pub fw_ver: String,
    /// PCI vendor ID (0x15b3 Mellanox/NVIDIA; 0 for the software backend).
    pub vendor_id: u32,
    /// Vendor part ID.
    pub vendor_part_id: u32,
    /// Node GUID.
    pub node_guid: u64,
    /// Queue pairs.
    pub max_qp: u32,
    /// Work requests per queue.
    pub max_qp_wr: u32,
    /// SGEs per work request.
    pub max_sge: u32,
    /// Completion queues.
    pub max_cq: u32,
    /// Entries per completion queue.
    pub max_cqe: u32,
    /// Memory regions.
    pub max_mr: u32,
    /// Bytes per memory region.
    pub max_mr_size: u64,
    /// Outstanding RDMA reads/atomics per QP as responder.
    pub max_qp_rd_atom: u32,
    /// Outstanding RDMA reads/atomics per QP as requester.
    pub max_qp_init_rd_atom: u32,
    /// Inline bytes per send work request.
    pub max_inline_data: u32,
    /// Atomic guarantees.
    pub atomic_cap: AtomicCap,
    /// Physical ports.
    pub phys_port_cnt: u8,
}

/// Logical port state (`enum ibv_port_state`; same values).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum PortState {
    /// 0: no state change.
    Nop,
    /// 1: link down.
    #[default]
    Down,
    /// 2: initializing.
    Init,
    /// 3: armed.
    Armed,
    /// 4: active: traffic flows.
    Active,
    /// 5: active, deferring.
    ActiveDefer,
}

/// The link layer of a port.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum LinkLayer {
    /// InfiniBand.
    InfiniBand,
    /// Ethernet (RoCE).
    #[default]
    Ethernet,
}

/// Port properties (`struct ibv_port_attr`, the fields rnic uses).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PortAttr {
    /// Logical state.
    pub state: PortState,
    /// Largest path MTU the port supports.
    pub max_mtu: Mtu,
    /// Path MTU the link currently allows.
    pub active_mtu: Mtu,
    /// Entries in the GID table.
    pub gid_tbl_len: u32,
    /// Link layer.
    pub link_layer: LinkLayer,
    /// Lanes in use (1, 2, 4, 8, 12).
    pub active_width: u8,
    /// Signalling rate per lane in Mb/s.
    pub active_speed_mbps: u32,
    /// Largest message in bytes.
    pub max_msg_sz: u32,
}

impl PortAttr {
    /// Link bandwidth in Mb/s (lanes × per-lane rate).
    pub const fn bandwidth_mbps(&self) -> u64 {
        self.active_width as u64 * self.active_speed_mbps as u64
    }
}

/// The RoCE version a GID is used with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum GidType {
    /// RoCE v1 (Ethernet type 0x8915).
    RoceV1,
    /// RoCE v2 (UDP port 4791).
    #[default]
    RoceV2,
}

/// One entry of a port's GID table.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct GidEntry {
    /// Index in the table (what `sgid_index` names).
    pub index: u32,
    /// The GID.
    pub gid: Gid,
    /// RoCE version.
    pub gid_type: GidType,
    /// The network interface the GID belongs to, when known.
    pub netdev: Option<String>,
}

/// A registered memory region as the provider reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MrInfo {
    /// The provider's handle.
    pub handle: MrHandle,
    /// Key for local SGEs.
    pub lkey: Lkey,
    /// Key a peer names the region by.
    pub rkey: Rkey,
    /// Address of byte 0 in the region's address space (what SGEs and the
    /// peer's RETH use).
    pub addr: u64,
    /// Length in bytes.
    pub len: usize,
}

/// A created completion queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CqInfo {
    /// The provider's handle.
    pub handle: CqHandle,
    /// Entries the queue holds (at least the depth asked for).
    pub depth: u32,
}

/// A created queue pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QpInfo {
    /// The provider's handle.
    pub handle: QpHandle,
    /// The QP number peers address.
    pub qpn: Qpn,
    /// Capacities granted (at least those asked for).
    pub caps: QpCaps,
}

/// Why a post refused a work request. Carries no heap data, so a refused post
/// (back-pressure is normal) allocates nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum PostError {
    /// The request is malformed for this QP.
    #[error(transparent)]
    InvalidWr(#[from] WrError),
    /// The QP's state does not accept this kind of request.
    #[error(
        "the QP is in state {state}: sends need RTS (or SQD, SQE, ERR, where they are flushed), \
         receives need INIT or later; bring the QP up first"
    )]
    QpState {
        /// The QP's state.
        state: QpState,
    },
    /// Accepting the batch would overfill the completion queue.
    #[error(
        "{cq} (depth {depth}) has {in_flight} work requests in flight and cannot take {requested} \
         more without risking overflow: poll it, or signal more often so unsignaled sends retire"
    )]
    CqFull {
        /// The completion queue.
        cq: CqHandle,
        /// Its depth.
        depth: u32,
        /// Work requests that may still complete into it.
        in_flight: u32,
        /// Work requests in the refused batch.
        requested: u32,
    },
    /// The work queue has no room for the batch.
    #[error(
        "the work queue holds {outstanding} of {capacity} requests and cannot take {requested} more: \
         poll the CQ (unsignaled sends retire only with a later signaled completion)"
    )]
    QueueFull {
        /// Requests outstanding.
        outstanding: u32,
        /// The queue's capacity.
        capacity: u32,
        /// Requests in the refused batch.
        requested: u32,
    },
    /// The device refused the request.
    #[error("the device refused it: {0}")]
    Device(&'static str),
}

/// Errors of verbs operations: one variant per failed operation.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum VerbsError {
    /// Querying the device failed.
    #[error("query_device failed: {reason}")]
    QueryDevice {
        /// What went wrong.
        reason: String,
    },
    /// Querying a port failed.
    #[error("query_port({port}) failed: {reason}")]
    QueryPort {
        /// The port (from 1).
        port: u8,
        /// What went wrong.
        reason: String,
    },
    /// Reading a port's GID table failed.
    #[error("query_gid_table({port}) failed: {reason}")]
    QueryGid {
        /// The port (from 1).
        port: u8,
        /// What went wrong.
        reason: String,
    },
    /// Allocating a protection domain failed.
    #[error("alloc_pd failed: {reason}")]
    AllocPd {
        /// What went wrong.
        reason: String,
    },
    /// Freeing a protection domain failed.
    #[error("dealloc_pd({pd}) failed: {reason}")]
    DeallocPd {
        /// The protection domain.
        pd: PdHandle,
        /// What went wrong.
        reason: String,
    },
    /// The access flags of a registration break the ibverbs rules.
    #[error("reg_mr refused the access flags: {source}")]
    RegMrAccess {
        /// The rule broken.
        #[from]
        source: AccessError,
    },
    /// Registering memory failed.
    #[error("reg_mr of {len} bytes with {access} failed: {reason}")]
    RegMr {
        /// Bytes to register.
        len: usize,
        /// Rights asked for.
        access: AccessFlags,
        /// What went wrong.
        reason: String,
    },
    /// Deregistering memory failed.
    #[error("dereg_mr({mr}) failed: {reason}")]
    DeregMr {
        /// The region.
        mr: MrHandle,
        /// What went wrong.
        reason: String,
    },
    /// Creating a completion queue failed.
    #[error("create_cq(depth {depth}) failed: {reason}")]
    CreateCq {
        /// Depth asked for.
        depth: u32,
        /// What went wrong.
        reason: String,
    },
    /// Destroying a completion queue failed.
    #[error("destroy_cq({cq}) failed: {reason}")]
    DestroyCq {
        /// The queue.
        cq: CqHandle,
        /// What went wrong.
        reason: String,
    },
    /// Creating a queue pair failed.
    #[error("create_qp failed: {reason}")]
    CreateQp {
        /// What went wrong.
        reason: String,
    },
    /// A modify was refused before reaching the device.
    #[error("modify_qp on QPN {qpn} refused: {source}")]
    ModifyQpRejected {
        /// The QP.
        qpn: Qpn,
        /// The rule broken.
        #[source]
        source: QpTransitionError,
    },
    /// The device failed a modify.
    #[error("modify_qp({qp}, {mask}) failed: {reason}")]
    ModifyQp {
        /// The QP.
        qp: QpHandle,
        /// Attributes being set.
        mask: QpAttrMask,
        /// What went wrong.
        reason: String,
    },
    /// Querying a queue pair failed.
    #[error("query_qp({qp}) failed: {reason}")]
    QueryQp {
        /// The QP.
        qp: QpHandle,
        /// What went wrong.
        reason: String,
    },
    /// Destroying a queue pair failed.
    #[error("destroy_qp({qp}) failed: {reason}")]
    DestroyQp {
        /// The QP.
        qp: QpHandle,
        /// What went wrong.
        reason: String,
    },
    /// A send batch stopped at request `index`; the requests before it were posted.
    #[error("post_send stopped at request {index} (requests before it were posted): {reason}")]
    PostSend {
        /// Position of the refused request (= number posted).
        index: usize,
        /// Why it was refused.
        #[source]
        reason: PostError,
    },
    /// A receive batch stopped at request `index`; the requests before it were posted.
    #[error("post_recv stopped at request {index} (requests before it were posted): {reason}")]
    PostRecv {
        /// Position of the refused request (= number posted).
        index: usize,
        /// Why it was refused.
        #[source]
        reason: PostError,
    },
    /// Polling a completion queue failed.
    #[error("poll_cq({cq}) failed: {reason}")]
    PollCq {
        /// The queue.
        cq: CqHandle,
        /// What went wrong.
        reason: String,
    },
    /// Arming completion notification failed.
    #[error("req_notify_cq({cq}) failed: {reason}")]
    ReqNotifyCq {
        /// The queue.
        cq: CqHandle,
        /// What went wrong.
        reason: String,
    },
    /// Waiting for a completion event failed.
    #[error("wait_cq({cq}) failed: {reason}")]
    WaitCq {
        /// The queue.
        cq: CqHandle,
        /// What went wrong.
        reason: String,
    },
    /// Objects from different device contexts were combined.
    #[error(
        "{operation}: {what} belongs to another device context; create it from the same Context"
    )]
    ForeignObject {
        /// The operation.
        operation: &'static str,
        /// The misplaced object.
        what: &'static str,
    },
    /// The backend does not implement the operation.
    #[error("{operation} is not supported by the {backend} backend")]
    NotSupported {
        /// The operation.
        operation: &'static str,
        /// The backend's name.
        backend: &'static str,
    },
}

/// A device driver: what rnic needs from a NIC (or from software acting as one).
///
/// Object-safe; see the module docs for the contract.
pub trait Provider: Send + Sync + fmt::Debug {
    /// Short name of the backend (`"rxe"`, `"mlx5"`), for messages.
    fn backend(&self) -> &'static str;

    /// Device capabilities.
    fn query_device(&self) -> Result<DeviceAttr, VerbsError>;

    /// Properties of port `port_num` (from 1).
    fn query_port(&self, port_num: u8) -> Result<PortAttr, VerbsError>;

    /// The valid entries of port `port_num`'s GID table.
    fn query_gid_table(&self, port_num: u8) -> Result<Vec<GidEntry>, VerbsError>;

    /// Allocate a protection domain.
    fn alloc_pd(&self) -> Result<PdHandle, VerbsError>;

    /// Free a protection domain (no MR or QP refers to it any more).
    fn dealloc_pd(&self, pd: PdHandle) -> Result<(), VerbsError>;

    /// Register `memory` in `pd` with `access` (already validated). The
    /// provider keeps `memory` until [`Provider::dereg_mr`] returns.
    fn reg_mr(
        &self,
        pd: PdHandle,
        memory: Arc<dyn Memory>,
        access: AccessFlags,
    ) -> Result<MrInfo, VerbsError>;

    /// Deregister a region; afterwards the device never touches its memory.
    fn dereg_mr(&self, mr: MrHandle) -> Result<(), VerbsError>;

    /// Create a completion queue of at least `depth` entries.
    fn create_cq(&self, depth: u32) -> Result<CqInfo, VerbsError>;

    /// Destroy a completion queue (no QP refers to it any more).
    fn destroy_cq(&self, cq: CqHandle) -> Result<(), VerbsError>;

    /// Create a queue pair in `pd` completing into `send_cq` and `recv_cq`
    /// (which may be the same queue). It starts in RESET.
    fn create_qp(
        &self,
        pd: PdHandle,
        send_cq: CqHandle,
        recv_cq: CqHandle,
        init: &QpInitAttr,
    ) -> Result<QpInfo, VerbsError>;

    /// Apply the attributes named in `mask` (already checked by
    /// [`crate::qp::check_modify`]).
    fn modify_qp(&self, qp: QpHandle, attr: &QpAttr, mask: QpAttrMask) -> Result<(), VerbsError>;

    /// Current attributes, `qp_state` included.
    fn query_qp(&self, qp: QpHandle) -> Result<QpAttr, VerbsError>;

    /// Destroy a queue pair, discarding its work and its queued completions.
    fn destroy_qp(&self, qp: QpHandle) -> Result<(), VerbsError>;

    /// Post send requests in order (see the contract on partial posts).
    fn post_send(&self, qp: QpHandle, wrs: &[SendWr<'_>]) -> Result<(), VerbsError>;

    /// Post receive requests in order (see the contract on partial posts).
    fn post_recv(&self, qp: QpHandle, wrs: &[RecvWr<'_>]) -> Result<(), VerbsError>;

    /// Move up to `wcs.len()` completions into `wcs`; returns how many.
    fn poll_cq(&self, cq: CqHandle, wcs: &mut [WorkCompletion]) -> Result<usize, VerbsError>;

    /// Arm the queue: the next completion (solicited only, if asked) signals
    /// its event file descriptor and wakes [`Provider::wait_cq`].
    fn req_notify_cq(&self, cq: CqHandle, solicited_only: bool) -> Result<(), VerbsError>;

    /// An eventfd that becomes readable when an armed queue gets a
    /// completion, for use with epoll; `None` when the backend has none.
    fn cq_event_fd(&self, cq: CqHandle) -> Option<RawFd> {
        let _ = cq;
        None
    }

    /// Block until an armed queue signals (`Ok(true)`) or `timeout` passes
    /// (`Ok(false)`); `None` waits forever. Consumes the event.
    fn wait_cq(&self, cq: CqHandle, timeout: Option<Duration>) -> Result<bool, VerbsError> {
        let _ = (cq, timeout);
        Err(VerbsError::NotSupported {
            operation: "wait_cq",
            backend: self.backend(),
        })
    }
}

impl VerbsError {
    /// For a partial post, the number of requests that were posted: `index`
    /// of [`VerbsError::PostSend`] / [`VerbsError::PostRecv`], 0 otherwise.
    pub fn posted_count(&self) -> usize {
        match self {
            VerbsError::PostSend { index, .. } | VerbsError::PostRecv { index, .. } => *index,
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_say_what_to_do() {
        let e = VerbsError::PostRecv {
            index: 0,
            reason: PostError::CqFull {
                cq: CqHandle(3),
                depth: 4,
                in_flight: 4,
                requested: 1,
            },
        };
        assert_eq!(
            e.to_string(),
            "post_recv stopped at request 0 (requests before it were posted): cq#3 (depth 4) has 4 \
             work requests in flight and cannot take 1 more without risking overflow: poll it, or \
             signal more often so unsignaled sends retire"
        );
        assert_eq!(e.posted_count(), 0);
        let e = VerbsError::PostSend {
            index: 2,
            reason: PostError::Device("no space"),
        };
        assert_eq!(e.posted_count(), 2);
        let e = VerbsError::NotSupported {
            operation: "wait_cq",
            backend: "rxe",
        };
        assert_eq!(e.to_string(), "wait_cq is not supported by the rxe backend");
    }

    #[test]
    fn port_bandwidth() {
        let p = PortAttr {
            active_width: 4,
            active_speed_mbps: 25_000,
            ..PortAttr::default()
        };
        assert_eq!(p.bandwidth_mbps(), 100_000);
    }
}
