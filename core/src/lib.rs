//! rnic-core: the verbs object model every rnic driver implements.
//!
//! # What it owns
//!
//! * **Numbers that cross the wire** — [`Qpn`], [`Psn`], [`Lkey`], [`Rkey`],
//!   [`Gid`], [`Iova`], [`Mtu`] ([`types`]).
//! * **Rights and attributes** — [`AccessFlags`] ([`access`]); queue-pair
//!   types, states, attributes and the transition check modelled on the
//!   kernel's `ib_modify_qp_is_ok` ([`qp`]).
//! * **Work** — send and receive requests over borrowed SGE lists, work
//!   completions with ibverbs status codes, request validation ([`wr`]).
//! * **Memory** — the [`Memory`] trait (device-visible bytes, accessed only by
//!   copying) and [`HeapMemory`] ([`memory`]).
//! * **The driver interface** — [`Provider`] (control path, with associated
//!   types for the objects a driver creates), [`QpOps`] / [`CqOps`] (the
//!   per-request path on driver-owned queues), the object-safe [`DynProvider`]
//!   and [`DynDevice`] used only at `rnic::open`, memory domains
//!   ([`DeviceMemory`]), typed errors ([`VerbsError`], [`DeviceError`])
//!   ([`provider`]).
//! * **The objects users hold** — [`Context`], [`ProtectionDomain`],
//!   [`MemoryRegion`], [`AddressHandle`] ([`verbs`]), [`CompletionQueue`]
//!   ([`cq`]), [`QueuePair`] ([`queue_pair`]), each generic over the driver
//!   (`Context<P>`; the default is the `dyn` [`DynDevice`]); and the lock-free
//!   [`CreditWindow`] ([`credit`]) that flow-controls oversubscribed CQs.
//!
//! # Invariants
//!
//! * Teardown runs QP → CQ → MR → PD because each object owns what it depends
//!   on ([`verbs`]); every `Drop` releases its resource once and never panics.
//! * A modify is checked against the transition table before the device sees
//!   it ([`QueuePair::modify`]).
//! * The work requests that can complete into a CQ never outnumber its depth:
//!   a QP reserves its queues' depths at creation where the CQ has room,
//!   otherwise posting takes credits and polling returns them, a post that
//!   does not fit is refused whole and counted as a stall ([`cq`]). CQ
//!   overflow is impossible by construction.
//! * One poster per QP and one poller per CQ: `post_send` and `post_recv`
//!   take `&mut self` ([`QueuePair`]); a [`CompletionQueue`] is `Send` but not
//!   `Sync`.
//! * Every memory region a posted request names stays registered while the
//!   QP lives; memory is registered only with a driver that can reach it
//!   ([`DeviceMemory`]).
//! * No `&`/`&mut` points into device-visible memory ([`memory`]).
//! * No `unsafe` (`#![forbid(unsafe_code)]`), no panics outside tests.
//!
//! # Example
//!
//! Bringing up an RC queue pair and sending a message. `open` stands for a
//! driver's constructor (`rnic::open("rxe:eth0")` in the facade); the rest is
//! this crate.
//!
//! ```
//! use std::sync::Arc;
//! use rnic_core::{
//!     AccessFlags, Context, HeapMemory, InitParams, Gid, Psn, QpCaps, QpInitAttr, QpType,
//!     Qpn, RtrParams, RtsParams, SendWr, VerbsError, WorkCompletion,
//! };
//!
//! fn ping(ctx: &Context, remote_qpn: Qpn, remote_psn: Psn, remote_gid: Gid) -> Result<(), VerbsError> {
//!     let pd = ctx.alloc_pd()?;
//!     let buf = Arc::new(HeapMemory::from_bytes(b"ping"));
//!     let mr = pd.reg_mr(buf, AccessFlags::LOCAL_WRITE)?;
//!     let mut cq = ctx.create_cq(16)?;
//!     let mut qp = pd.create_qp(&cq, &cq, &QpInitAttr::new(QpType::Rc, QpCaps::default()))?;
//!     qp.to_init(&InitParams::default())?;
//!     qp.to_rtr(remote_qpn, remote_psn, remote_gid, &RtrParams::default())?;
//!     qp.to_rts(Psn::from_wire(0x1234), &RtsParams::default())?;
//!     let sge = [mr.whole()];
//!     qp.post_send(&[SendWr::send(1, &sge).signaled()])?;
//!     let mut wcs = [WorkCompletion::default(); 4];
//!     while cq.poll(&mut wcs)? == 0 {}
//!     assert!(wcs[0].is_success(), "{}", wcs[0].status);
//!     Ok(())
//! }
//!
//! // The pieces that need no device run anywhere:
//! use rnic_core::qp::{check_modify, QpAttr, QpAttrMask, QpState};
//! let attr = QpAttr { qp_state: QpState::Rtr, ..QpAttr::default() };
//! let err = check_modify(QpType::Rc, QpState::Reset, QpAttrMask::STATE, &attr).unwrap_err();
//! assert!(err.to_string().contains("cannot move from RESET to RTR"));
//! assert!(AccessFlags::REMOTE_WRITE.validate().is_err());
//! # let _ = ping;
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod access;
pub mod cq;
pub mod credit;
pub mod error;
pub mod exchange;
pub mod memory;
pub mod pci;
pub mod provider;
pub mod qp;
pub mod queue_pair;
pub mod types;
pub mod verbs;
pub mod wr;

#[cfg(test)]
mod fake_provider;
#[cfg(test)]
mod verbs_tests;

pub use access::{AccessError, AccessFlags};
pub use cq::{CompletionQueue, CqCounters, CqCredits, CqStats};
pub use credit::{CreditError, CreditStall, CreditStats, CreditWindow};
pub use error::{DeviceError, DeviceErrorKind, ValueError};
pub use memory::{DirectSpan, HeapMemory, MemAccess, Memory, MemoryError, PinnedSpan};
pub use pci::{PciAddr, PciAddrError};
pub use provider::{
    AnyDomain, AnyObject, AsAny, AtomicCap, AvError, CqHandle, CqOps, DeviceAttr, DeviceMemory,
    DmaDomain, DynDevice, DynProvider, GidEntry, GidType, HostDomain, IommuDomain, LinkLayer,
    MrHandle, MrInfo, Outstanding, PdHandle, PortAttr, PortState, PostError, Provider, QpHandle,
    QpInfo, QpOps, VerbsError,
};
pub use qp::{
    AddressVector, QpAttr, QpAttrError, QpAttrMask, QpCaps, QpInitAttr, QpState, QpTransitionError,
    QpType, check_modify,
};
pub use queue_pair::{InitParams, QueuePair, RtrParams, RtsParams};
pub use types::{Gid, Iova, Lkey, Mtu, Psn, Qpn, Rkey};
pub use verbs::{AddressHandle, Context, MemoryRegion, ProtectionDomain};
pub use wr::{
    RecvWr, SendFlags, SendOp, SendWr, Sge, UdDest, UdDestination, UdSend, WcFlags, WcOpcode,
    WcStatus, WorkCompletion, WrError,
};
