//! The driver contract: [`Provider`] (the control path, with associated types
//! for the queue objects it creates), [`QpOps`] and [`CqOps`] (the per-request
//! path), the object-safe [`DynProvider`] wrapper used only at the facade's
//! `rnic::open`, memory domains ([`DmaDomain`], [`DeviceMemory`]), and
//! [`VerbsError`].
//!
//! # Contract
//!
//! * The driver creates the queue objects and the application owns them
//!   (through [`crate::QueuePair`] and [`crate::CompletionQueue`]):
//!   [`QpOps::post_send`] / [`QpOps::post_recv`] / [`CqOps::poll`] take
//!   `&mut self`, so a driver may rely on one poster per QP and one poller
//!   per CQ (core's `CompletionQueue::poll` takes `&mut self` too) without
//!   a lock; sharing is the application's explicit choice (a `Mutex`). No
//!   handle table sits between the call and the driver's queue.
//! * Checks happen once, in the driver, where the facts are: request shape
//!   ([`SendWr::validate`] is the helper), QP state and queue room.
//!   `post_send` / `post_recv` post the requests in order and stop at the
//!   first one they cannot post, returning [`VerbsError::PostSend`] /
//!   [`VerbsError::PostRecv`] whose `index` is that request's position:
//!   exactly the requests before it were posted. Any other error means none
//!   was.
//! * A request is *outstanding* from its post until the poll that returns its
//!   completion, or the completion of a later request of the same queue that
//!   retires it. A driver never has more outstanding requests on a queue than
//!   the capacity it granted ([`QpInfo::caps`]): it frees queue room at poll,
//!   not when the device finishes (mlx5 advances its SQ tail from the polled
//!   CQE's `wqe_counter`). Core's CQ credit accounting relies on it.
//! * A send completion retires its request and every unsignaled request
//!   posted before it on the same QP; the driver says how many of those there
//!   were in [`WorkCompletion::retired_unsignaled`]. Core never searches for a
//!   `wr_id`.
//! * `poll` sets `opcode` on every completion, error and flush completions
//!   included. Send-queue completions of a QP arrive in posting order. A
//!   failed request produces a completion even when unsignaled; moving the QP
//!   to ERR flushes every outstanding request with `WR_FLUSH_ERR`.
//! * Moving a QP to RESET discards its outstanding requests; [`QpOps::discard`]
//!   then removes its completions still queued in its CQs and reports how many
//!   requests that retired. Dropping a driver object destroys it; a QP object
//!   keeps whatever part of its CQs it completes into alive itself.
//! * `reg_mr` keeps its `Arc<dyn Memory>` until the region object is dropped;
//!   after that the device never touches the memory again. The memory has
//!   passed the driver's [`DmaDomain`] check (at compile time through
//!   [`DeviceMemory`], or at run time through [`DmaDomain::admit`] on the
//!   `dyn` path).
//!
//! [`SendWr::validate`]: crate::wr::SendWr::validate
//! [`WorkCompletion::retired_unsignaled`]: crate::wr::WorkCompletion::retired_unsignaled

use std::any::Any;
use std::fmt;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;

use crate::access::{AccessError, AccessFlags};
use crate::error::DeviceError;
use crate::memory::Memory;
use crate::qp::{
    AddressVector, QpAttr, QpAttrMask, QpCaps, QpInitAttr, QpState, QpTransitionError,
};
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

/// A registered memory region as the driver reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MrInfo {
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

/// A created queue pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QpInfo {
    /// The QP number peers address.
    pub qpn: Qpn,
    /// Capacities granted (at least those asked for).
    pub caps: QpCaps,
}

/// Requests of a QP posted and not yet retired by a polled completion.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Outstanding {
    /// Send requests.
    pub sends: u32,
    /// Receive requests.
    pub recvs: u32,
}

/// Why an address vector cannot be sent on from this device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Error)]
#[non_exhaustive]
pub enum AvError {
    /// `sgid_index` is past the end of the GID table.
    #[error(
        "sgid_index {index} is not in this device's GID table ({table_len} entries; \
         query_gid_table lists them)"
    )]
    NoSuchSgid {
        /// The index asked for.
        index: u8,
        /// Entries in the table.
        table_len: usize,
    },
    /// The source and destination GIDs are of different IP families.
    #[error(
        "the destination {dgid} and the source GID {sgid} are of different IP families: RoCEv2 \
         does not cross IPv4 and IPv6; pick a source GID of the destination's family"
    )]
    Family {
        /// The local GID at `sgid_index`.
        sgid: Gid,
        /// The destination.
        dgid: Gid,
    },
    /// An IPv6 link-local destination from a source without an interface scope.
    #[error(
        "the destination {dgid} is IPv6 link-local, but the source GID {sgid} has no interface \
         scope: open the device on an interface (rxe:<netdev>) or use a global address"
    )]
    LinkLocal {
        /// The local GID at `sgid_index`.
        sgid: Gid,
        /// The destination.
        dgid: Gid,
    },
    /// A flow label wider than 20 bits.
    #[error("flow label {value:#x} does not fit 20 bits (max 0xfffff)")]
    FlowLabel {
        /// The refused flow label.
        value: u32,
    },
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
        "the completion queue (depth {depth}) has {in_flight} work requests in flight and cannot \
         take {requested} more without risking overflow: poll it, signal more often so unsignaled \
         sends retire, or create the CQ deep enough for every queue attached to it"
    )]
    CqFull {
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
    /// A UD destination this device cannot send to (what `create_ah` would
    /// have refused).
    #[error("the UD destination cannot be used: {0}")]
    AddressVector(#[source] AvError),
    /// A UD send names an address handle another device (or no device:
    /// `AddressHandle::unchecked`) created; nothing from the request on was
    /// posted.
    #[error(
        "the UD send's address handle was not created on this device: create it with \
         create_ah on a protection domain of the QP's device"
    )]
    ForeignAddressHandle,
    /// The device refused the request.
    #[error("the device refused it: {0}")]
    Device(#[source] DeviceError),
}

/// Errors of verbs operations: one variant per failed operation, each with a
/// typed cause.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum VerbsError {
    /// Querying the device failed.
    #[error("query_device failed: {source}")]
    QueryDevice {
        /// What went wrong.
        #[source]
        source: DeviceError,
    },
    /// Querying a port failed.
    #[error("query_port({port}) failed: {source}")]
    QueryPort {
        /// The port (from 1).
        port: u8,
        /// What went wrong.
        #[source]
        source: DeviceError,
    },
    /// Reading a port's GID table failed.
    #[error("query_gid_table({port}) failed: {source}")]
    QueryGid {
        /// The port (from 1).
        port: u8,
        /// What went wrong.
        #[source]
        source: DeviceError,
    },
    /// Allocating a protection domain failed.
    #[error("alloc_pd failed: {source}")]
    AllocPd {
        /// What went wrong.
        #[source]
        source: DeviceError,
    },
    /// The access flags of a registration break the ibverbs rules.
    #[error("reg_mr refused the access flags: {source}")]
    RegMrAccess {
        /// The rule broken.
        #[from]
        source: AccessError,
    },
    /// Registering memory failed.
    #[error("reg_mr of {len} bytes with {access} failed: {source}")]
    RegMr {
        /// Bytes to register.
        len: usize,
        /// Rights asked for.
        access: AccessFlags,
        /// What went wrong.
        #[source]
        source: DeviceError,
    },
    /// Creating a completion queue failed.
    #[error("create_cq(depth {depth}) failed: {source}")]
    CreateCq {
        /// Depth asked for.
        depth: u32,
        /// What went wrong.
        #[source]
        source: DeviceError,
    },
    /// Creating a queue pair failed.
    #[error("create_qp failed: {source}")]
    CreateQp {
        /// What went wrong.
        #[source]
        source: DeviceError,
    },
    /// An address vector cannot be used from this device (create_ah, or a
    /// modify to RTR).
    #[error("the address vector to {dgid} cannot be used: {source}")]
    AddressVector {
        /// Its destination.
        dgid: Gid,
        /// What is wrong with it.
        #[source]
        source: AvError,
    },
    /// Creating an address handle failed on the device.
    #[error("create_ah failed: {source}")]
    CreateAh {
        /// What went wrong.
        #[source]
        source: DeviceError,
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
    #[error("modify_qp(QPN {qpn}, {mask}) failed: {source}")]
    ModifyQp {
        /// The QP.
        qpn: Qpn,
        /// Attributes being set.
        mask: QpAttrMask,
        /// What went wrong.
        #[source]
        source: DeviceError,
    },
    /// Querying a queue pair failed.
    #[error("query_qp(QPN {qpn}) failed: {source}")]
    QueryQp {
        /// The QP.
        qpn: Qpn,
        /// What went wrong.
        #[source]
        source: DeviceError,
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
    #[error("poll_cq failed: {source}")]
    PollCq {
        /// What went wrong.
        #[source]
        source: DeviceError,
    },
    /// Arming completion notification failed.
    #[error("req_notify_cq failed: {source}")]
    ReqNotifyCq {
        /// What went wrong.
        #[source]
        source: DeviceError,
    },
    /// Waiting for a completion event failed.
    #[error("wait_cq failed: {source}")]
    WaitCq {
        /// What went wrong.
        #[source]
        source: DeviceError,
    },
    /// A QP does not fit a reserved CQ ([`crate::CqCredits::Reserved`]).
    #[error(
        "create_qp: the completion queue (depth {depth}, {reserved} entries reserved by other \
         queues) has no room for this QP's {needed}: create the CQ deeper, give the QP its own \
         CQ, or create a shared CQ (Context::create_cq)"
    )]
    CqOversubscribed {
        /// The CQ's depth.
        depth: u32,
        /// Entries already reserved.
        reserved: u32,
        /// Entries this QP needs.
        needed: u32,
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
    /// Memory the driver cannot reach (the `dyn` path's run-time domain check).
    #[error(
        "reg_mr: the {backend} backend cannot reach this memory ({domain} memory needed): \
         allocate it from that domain (rnic-dma's DmaRegion for DMA devices)"
    )]
    UnreachableMemory {
        /// The backend's name.
        backend: &'static str,
        /// The domain the driver needs.
        domain: &'static str,
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

/// An address space a device reaches memory in. The marker types say which
/// memory a driver can register; [`DeviceMemory`] ties memory types to them.
pub trait DmaDomain: fmt::Debug + Send + Sync + 'static {
    /// The domain's name, for messages.
    const NAME: &'static str;

    /// Whether `memory` (of a type only known at run time) is reachable: the
    /// `dyn` path's check.
    fn admit(memory: &dyn Memory) -> bool;
}

/// The CPU's own address space: software drivers (rxe) that copy through
/// [`Memory::read`] / [`Memory::write`] reach any memory, `HeapMemory`
/// included.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct HostDomain;

impl DmaDomain for HostDomain {
    const NAME: &'static str = "host";
    fn admit(_memory: &dyn Memory) -> bool {
        true
    }
}

/// Memory mapped in an IOMMU for a DMA device (mlx5): it has an IOVA.
/// `HeapMemory` is not in it; rnic-dma's `DmaRegion` is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct IommuDomain;

impl DmaDomain for IommuDomain {
    const NAME: &'static str = "IOMMU-mapped";
    fn admit(memory: &dyn Memory) -> bool {
        memory.iova().is_some()
    }
}

/// The `dyn` path's domain: any memory type compiles, and the driver behind
/// the wrapper checks at run time ([`DmaDomain::admit`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct AnyDomain;

impl DmaDomain for AnyDomain {
    const NAME: &'static str = "any";
    fn admit(_memory: &dyn Memory) -> bool {
        true
    }
}

/// Memory a driver of domain `D` can reach: the bound
/// [`crate::ProtectionDomain::reg_mr`] checks at compile time.
///
/// Every memory type is in [`HostDomain`] and [`AnyDomain`]; only memory
/// mapped for a device (rnic-dma's `DmaRegion`) is in [`IommuDomain`]:
///
/// ```compile_fail
/// use std::sync::Arc;
/// use rnic_core::{AccessFlags, HeapMemory, IommuDomain, Provider, ProtectionDomain};
///
/// // A DMA driver (Domain = IommuDomain) cannot be handed heap memory.
/// fn register<P: Provider<Domain = IommuDomain>>(pd: &ProtectionDomain<P>) {
///     let _ = pd.reg_mr(Arc::new(HeapMemory::new(64)), AccessFlags::LOCAL_WRITE);
/// }
/// ```
///
/// The same with a host-domain driver compiles:
///
/// ```
/// use std::sync::Arc;
/// use rnic_core::{AccessFlags, HeapMemory, HostDomain, Provider, ProtectionDomain};
///
/// fn register<P: Provider<Domain = HostDomain>>(pd: &ProtectionDomain<P>) {
///     let _ = pd.reg_mr(Arc::new(HeapMemory::new(64)), AccessFlags::LOCAL_WRITE);
/// }
/// ```
pub trait DeviceMemory<D: DmaDomain>: Memory {
    /// The memory as the driver stores it.
    fn into_dyn_memory(self: Arc<Self>) -> Arc<dyn Memory>;
}

impl<M: Memory + 'static> DeviceMemory<HostDomain> for M {
    fn into_dyn_memory(self: Arc<Self>) -> Arc<dyn Memory> {
        self
    }
}

impl DeviceMemory<HostDomain> for dyn Memory {
    fn into_dyn_memory(self: Arc<Self>) -> Arc<dyn Memory> {
        self
    }
}

impl<M: Memory + 'static> DeviceMemory<AnyDomain> for M {
    fn into_dyn_memory(self: Arc<Self>) -> Arc<dyn Memory> {
        self
    }
}

impl DeviceMemory<AnyDomain> for dyn Memory {
    fn into_dyn_memory(self: Arc<Self>) -> Arc<dyn Memory> {
        self
    }
}

/// `&dyn Any` of a value, through a trait object (for the `dyn` wrapper's
/// downcasts on the control path).
pub trait AsAny: Any {
    /// The value as `&dyn Any`.
    fn as_any(&self) -> &dyn Any;
}

impl<T: Any> AsAny for T {
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A driver's queue pair: the per-request path. See the module docs for the
/// contract.
pub trait QpOps: Send + Sync + fmt::Debug {
    /// Apply the attributes named in `mask` (already checked by
    /// [`crate::qp::check_modify`]).
    fn modify(&mut self, attr: &QpAttr, mask: QpAttrMask) -> Result<(), VerbsError>;

    /// Current attributes, `qp_state` included.
    fn query(&mut self) -> Result<QpAttr, VerbsError>;

    /// Post send requests in order (see the contract on partial posts).
    fn post_send(&mut self, wrs: &[SendWr<'_>]) -> Result<(), VerbsError>;

    /// Post one send request on the driver's shortest path, if it has one:
    /// `true` when it is posted; `false` when the driver declines it, having
    /// posted nothing — the caller then hands it to
    /// [`QpOps::post_send`], which posts it or says why not. The answer fits a
    /// register, so a caller's fast path keeps no error slot and nothing
    /// live across the call. Core asks only for a single `INLINE` request
    /// on a QP without a credit window (such a request retains no region
    /// and takes no credit). The default declines every request.
    #[inline]
    fn try_post_send_one(&mut self, wr: &SendWr<'_>) -> bool {
        let _ = wr;
        false
    }

    /// Post receive requests in order (see the contract on partial posts).
    fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> Result<(), VerbsError>;

    /// Requests posted and not yet retired by a polled completion.
    fn outstanding(&self) -> Outstanding;

    /// After a move to RESET, or before the QP is dropped: remove its
    /// completions still queued in its CQs and retire every outstanding
    /// request; returns how many that were.
    fn discard(&mut self) -> Outstanding;
}

/// A driver's completion queue: the per-completion path.
pub trait CqOps: Send + Sync + fmt::Debug + AsAny {
    /// Move up to `wcs.len()` completions into `wcs`; returns how many.
    fn poll(&mut self, wcs: &mut [WorkCompletion]) -> Result<usize, VerbsError>;

    /// Arm the queue: the next completion (solicited only, if asked) signals
    /// its event file descriptor and wakes [`CqOps::wait`].
    fn req_notify(&self, solicited_only: bool) -> Result<(), VerbsError>;

    /// An eventfd that becomes readable when an armed queue gets a
    /// completion, for use with epoll; `None` when the backend has none.
    fn event_fd(&self) -> Option<RawFd>;

    /// Block until an armed queue signals (`Ok(true)`) or `timeout` passes
    /// (`Ok(false)`); `None` waits forever. Consumes the event.
    fn wait(&self, timeout: Option<Duration>) -> Result<bool, VerbsError>;
}

/// A device driver: the control path, and the types of the objects it
/// creates. `Context<P>` over a named driver type dispatches statically;
/// [`DynDevice`] is the `dyn` form the facade's `rnic::open` returns.
pub trait Provider: Send + Sync + fmt::Debug + Sized + 'static {
    /// The memory this driver can register.
    type Domain: DmaDomain;
    /// A protection domain.
    type Pd: Send + Sync + fmt::Debug + 'static;
    /// A memory region; dropping it deregisters.
    type Mr: Send + Sync + fmt::Debug + 'static;
    /// A completion queue.
    type Cq: CqOps + 'static;
    /// A queue pair.
    type Qp: QpOps + 'static;
    /// An address handle (what `create_ah` resolved).
    type Ah: Send + Sync + fmt::Debug + 'static;

    /// Short name of the backend (`"rxe"`, `"mlx5"`), for messages.
    fn backend(&self) -> &'static str;

    /// Device capabilities.
    fn query_device(&self) -> Result<DeviceAttr, VerbsError>;

    /// Properties of port `port_num` (from 1).
    fn query_port(&self, port_num: u8) -> Result<PortAttr, VerbsError>;

    /// The valid entries of port `port_num`'s GID table.
    fn query_gid_table(&self, port_num: u8) -> Result<Vec<GidEntry>, VerbsError>;

    /// Allocate a protection domain.
    fn alloc_pd(&self) -> Result<Self::Pd, VerbsError>;

    /// Register `memory` in `pd` with `access` (already validated; the memory
    /// is in [`Provider::Domain`]).
    fn reg_mr(
        &self,
        pd: &Self::Pd,
        memory: Arc<dyn Memory>,
        access: AccessFlags,
    ) -> Result<(Self::Mr, MrInfo), VerbsError>;

    /// Create a completion queue of at least `depth` entries; returns it and
    /// its depth.
    fn create_cq(&self, depth: u32) -> Result<(Self::Cq, u32), VerbsError>;

    /// Create a queue pair in `pd` completing into `send_cq` and `recv_cq`
    /// (which may be the same queue). It starts in RESET.
    fn create_qp(
        &self,
        pd: &Self::Pd,
        send_cq: &Self::Cq,
        recv_cq: &Self::Cq,
        init: &QpInitAttr,
    ) -> Result<(Self::Qp, QpInfo), VerbsError>;

    /// Resolve `av` once (source GID, route, destination) for UD sends.
    fn create_ah(&self, pd: &Self::Pd, av: &AddressVector) -> Result<Self::Ah, VerbsError>;
}

/// A boxed, type-erased object of a driver.
pub type AnyObject = Box<dyn Any + Send + Sync>;

/// The object-safe form of [`Provider`], blanket-implemented for every
/// driver: queue objects come back boxed. Only [`DynDevice`] uses it.
pub trait DynProvider: Send + Sync + fmt::Debug {
    /// See [`Provider::backend`].
    fn backend(&self) -> &'static str;
    /// See [`Provider::query_device`].
    fn query_device(&self) -> Result<DeviceAttr, VerbsError>;
    /// See [`Provider::query_port`].
    fn query_port(&self, port_num: u8) -> Result<PortAttr, VerbsError>;
    /// See [`Provider::query_gid_table`].
    fn query_gid_table(&self, port_num: u8) -> Result<Vec<GidEntry>, VerbsError>;
    /// See [`Provider::alloc_pd`].
    fn alloc_pd(&self) -> Result<AnyObject, VerbsError>;
    /// See [`Provider::reg_mr`]; checks the memory's domain at run time.
    fn reg_mr(
        &self,
        pd: &AnyObject,
        memory: Arc<dyn Memory>,
        access: AccessFlags,
    ) -> Result<(AnyObject, MrInfo), VerbsError>;
    /// See [`Provider::create_cq`].
    fn create_cq(&self, depth: u32) -> Result<(Box<dyn CqOps>, u32), VerbsError>;
    /// See [`Provider::create_qp`].
    fn create_qp(
        &self,
        pd: &AnyObject,
        send_cq: &dyn CqOps,
        recv_cq: &dyn CqOps,
        init: &QpInitAttr,
    ) -> Result<(Box<dyn QpOps>, QpInfo), VerbsError>;
    /// See [`Provider::create_ah`].
    fn create_ah(&self, pd: &AnyObject, av: &AddressVector) -> Result<AnyObject, VerbsError>;
}

fn foreign(operation: &'static str, what: &'static str) -> VerbsError {
    VerbsError::ForeignObject { operation, what }
}

impl<P: Provider> DynProvider for P {
    fn backend(&self) -> &'static str {
        Provider::backend(self)
    }
    fn query_device(&self) -> Result<DeviceAttr, VerbsError> {
        Provider::query_device(self)
    }
    fn query_port(&self, port_num: u8) -> Result<PortAttr, VerbsError> {
        Provider::query_port(self, port_num)
    }
    fn query_gid_table(&self, port_num: u8) -> Result<Vec<GidEntry>, VerbsError> {
        Provider::query_gid_table(self, port_num)
    }
    fn alloc_pd(&self) -> Result<AnyObject, VerbsError> {
        Ok(Box::new(Provider::alloc_pd(self)?))
    }
    fn reg_mr(
        &self,
        pd: &AnyObject,
        memory: Arc<dyn Memory>,
        access: AccessFlags,
    ) -> Result<(AnyObject, MrInfo), VerbsError> {
        let pd = pd
            .downcast_ref::<P::Pd>()
            .ok_or_else(|| foreign("reg_mr", "the protection domain"))?;
        if !P::Domain::admit(&*memory) {
            return Err(VerbsError::UnreachableMemory {
                backend: Provider::backend(self),
                domain: P::Domain::NAME,
            });
        }
        let (mr, info) = Provider::reg_mr(self, pd, memory, access)?;
        Ok((Box::new(mr), info))
    }
    fn create_cq(&self, depth: u32) -> Result<(Box<dyn CqOps>, u32), VerbsError> {
        let (cq, depth) = Provider::create_cq(self, depth)?;
        Ok((Box::new(cq), depth))
    }
    fn create_qp(
        &self,
        pd: &AnyObject,
        send_cq: &dyn CqOps,
        recv_cq: &dyn CqOps,
        init: &QpInitAttr,
    ) -> Result<(Box<dyn QpOps>, QpInfo), VerbsError> {
        let pd = pd
            .downcast_ref::<P::Pd>()
            .ok_or_else(|| foreign("create_qp", "the protection domain"))?;
        let send = send_cq
            .as_any()
            .downcast_ref::<P::Cq>()
            .ok_or_else(|| foreign("create_qp", "the send CQ"))?;
        let recv = recv_cq
            .as_any()
            .downcast_ref::<P::Cq>()
            .ok_or_else(|| foreign("create_qp", "the receive CQ"))?;
        let (qp, info) = Provider::create_qp(self, pd, send, recv, init)?;
        Ok((Box::new(qp), info))
    }
    fn create_ah(&self, pd: &AnyObject, av: &AddressVector) -> Result<AnyObject, VerbsError> {
        let pd = pd
            .downcast_ref::<P::Pd>()
            .ok_or_else(|| foreign("create_ah", "the protection domain"))?;
        Ok(Box::new(Provider::create_ah(self, pd, av)?))
    }
}

/// A driver behind dynamic dispatch: what `rnic::open` returns a
/// `Context<DynDevice>` (the default `Context`) over. The per-request calls go
/// straight to the driver's boxed queue objects (one indirect call each).
#[derive(Debug, Clone)]
pub struct DynDevice(Arc<dyn DynProvider>);

impl DynDevice {
    /// Erase a driver's type.
    pub fn new(provider: Arc<dyn DynProvider>) -> DynDevice {
        DynDevice(provider)
    }

    /// The driver behind it.
    pub fn provider(&self) -> &Arc<dyn DynProvider> {
        &self.0
    }
}

impl QpOps for Box<dyn QpOps> {
    fn modify(&mut self, attr: &QpAttr, mask: QpAttrMask) -> Result<(), VerbsError> {
        (**self).modify(attr, mask)
    }
    fn query(&mut self) -> Result<QpAttr, VerbsError> {
        (**self).query()
    }
    #[inline]
    fn post_send(&mut self, wrs: &[SendWr<'_>]) -> Result<(), VerbsError> {
        (**self).post_send(wrs)
    }
    #[inline]
    fn try_post_send_one(&mut self, wr: &SendWr<'_>) -> bool {
        (**self).try_post_send_one(wr)
    }
    #[inline]
    fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> Result<(), VerbsError> {
        (**self).post_recv(wrs)
    }
    fn outstanding(&self) -> Outstanding {
        (**self).outstanding()
    }
    fn discard(&mut self) -> Outstanding {
        (**self).discard()
    }
}

impl CqOps for Box<dyn CqOps> {
    #[inline]
    fn poll(&mut self, wcs: &mut [WorkCompletion]) -> Result<usize, VerbsError> {
        (**self).poll(wcs)
    }
    fn req_notify(&self, solicited_only: bool) -> Result<(), VerbsError> {
        (**self).req_notify(solicited_only)
    }
    fn event_fd(&self) -> Option<RawFd> {
        (**self).event_fd()
    }
    fn wait(&self, timeout: Option<Duration>) -> Result<bool, VerbsError> {
        (**self).wait(timeout)
    }
}

impl Provider for DynDevice {
    type Domain = AnyDomain;
    type Pd = AnyObject;
    type Mr = AnyObject;
    type Cq = Box<dyn CqOps>;
    type Qp = Box<dyn QpOps>;
    type Ah = AnyObject;

    fn backend(&self) -> &'static str {
        self.0.backend()
    }
    fn query_device(&self) -> Result<DeviceAttr, VerbsError> {
        self.0.query_device()
    }
    fn query_port(&self, port_num: u8) -> Result<PortAttr, VerbsError> {
        self.0.query_port(port_num)
    }
    fn query_gid_table(&self, port_num: u8) -> Result<Vec<GidEntry>, VerbsError> {
        self.0.query_gid_table(port_num)
    }
    fn alloc_pd(&self) -> Result<AnyObject, VerbsError> {
        self.0.alloc_pd()
    }
    fn reg_mr(
        &self,
        pd: &AnyObject,
        memory: Arc<dyn Memory>,
        access: AccessFlags,
    ) -> Result<(AnyObject, MrInfo), VerbsError> {
        self.0.reg_mr(pd, memory, access)
    }
    fn create_cq(&self, depth: u32) -> Result<(Box<dyn CqOps>, u32), VerbsError> {
        self.0.create_cq(depth)
    }
    fn create_qp(
        &self,
        pd: &AnyObject,
        send_cq: &Box<dyn CqOps>,
        recv_cq: &Box<dyn CqOps>,
        init: &QpInitAttr,
    ) -> Result<(Box<dyn QpOps>, QpInfo), VerbsError> {
        self.0.create_qp(pd, &**send_cq, &**recv_cq, init)
    }
    fn create_ah(&self, pd: &AnyObject, av: &AddressVector) -> Result<AnyObject, VerbsError> {
        self.0.create_ah(pd, av)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::DeviceErrorKind;

    #[test]
    fn messages_say_what_to_do() {
        let e = VerbsError::PostRecv {
            index: 0,
            reason: PostError::CqFull {
                depth: 4,
                in_flight: 4,
                requested: 1,
            },
        };
        assert!(e.to_string().starts_with(
            "post_recv stopped at request 0 (requests before it were posted): the completion \
             queue (depth 4) has 4 work requests in flight and cannot take 1 more"
        ));
        assert_eq!(e.posted_count(), 0);
        let e = VerbsError::PostSend {
            index: 2,
            reason: PostError::Device(DeviceError::new(DeviceErrorKind::Transport, "no space")),
        };
        assert_eq!(e.posted_count(), 2);
        let e = VerbsError::NotSupported {
            operation: "wait_cq",
            backend: "rxe",
        };
        assert_eq!(e.to_string(), "wait_cq is not supported by the rxe backend");
        let e = DeviceError::command(0x5, 0x1234, "CREATE_QP failed: check the PRM");
        assert_eq!(
            e.to_string(),
            "CREATE_QP failed: check the PRM (status 0x5, syndrome 0x1234)"
        );
        let e = VerbsError::CreateQp { source: e };
        assert!(std::error::Error::source(&e).is_some());
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
