//! [`Mlx5Provider`]: `rnic_core::Provider` on the driver's direct objects.
//!
//! The provider's queue objects *are* the direct fast path: [`Mlx5Qp`] owns a
//! [`Qp`] and its `post_send` calls [`Qp::post_send`]; [`Mlx5Cq`] owns a
//! [`Cq`] and its `poll` calls [`Cq::poll`]. No table lookup, lock or
//! allocation sits between the two: the CQ is kept in a `Mutex` only so the
//! control path (`create_qp`, `req_notify`, `wait`, which get `&Mlx5Cq`) can
//! reach it; `poll(&mut self)` uses [`Mutex::get_mut`], which takes no lock.
//! The borrow rules make the two exclusive (core's `CompletionQueue` owns the
//! `Mlx5Cq`, and `poll` takes it `&mut`), so the mutex is never contended.
//!
//! Memory: the driver's domain is [`Mlx5Domain`]. On the typed path only
//! [`DmaBuffer`]s of the same function, allocated through
//! [`Mlx5Provider::alloc_dma`], can be registered; heap memory is refused at
//! compile time:
//!
//! ```compile_fail
//! use std::sync::Arc;
//! use rnic_core::{AccessFlags, Context, HeapMemory};
//! use rnic_mlx5::Mlx5Provider;
//!
//! fn register(ctx: &Context<Mlx5Provider>) {
//!     let pd = ctx.alloc_pd().unwrap();
//!     // error: HeapMemory is not DeviceMemory<Mlx5Domain>
//!     let _ = pd.reg_mr(Arc::new(HeapMemory::new(64)), AccessFlags::LOCAL_WRITE);
//! }
//! ```
//!
//! while a [`DmaBuffer`] compiles:
//!
//! ```no_run
//! use rnic_core::{AccessFlags, Context};
//! use rnic_mlx5::{Mlx5Error, Mlx5Provider};
//!
//! fn register(p: &std::sync::Arc<Mlx5Provider>) -> Result<(), Box<dyn std::error::Error>> {
//!     let ctx: Context<Mlx5Provider> = Mlx5Provider::typed_context(p);
//!     let pd = ctx.alloc_pd()?;
//!     let _mr = pd.reg_mr(p.alloc_dma(4096)?, AccessFlags::LOCAL_WRITE)?;
//!     Ok(())
//! }
//! ```
//!
//! Through `rnic::open` (the `dyn` path) the check is made at run time: a
//! buffer this provider allocated is registered as it is; any other memory
//! whose [`Memory::host_addr`] names its host address is registered in
//! place — its pages mapped into the function's IOMMU domain
//! ([`crate::function::user`], [`Mkey::new_user`]); memory with neither is
//! refused ([`VerbsError::UnreachableMemory`]).
//!
//! Semantics that differ from rxe (see docs/mlx5.md):
//! * The function has one firmware PD (allocated at bring-up); every
//!   `alloc_pd` is a view of it, so R_Keys are not isolated between PDs.
//! * Queue room is counted in WQEBBs (64 bytes), so a QP of `max_send_wr` N
//!   needs a CQ of at least N × (WQEBBs per WQE) + its receive depth:
//!   the driver refuses a QP whose queues its CQ could overrun.
//! * `WorkCompletion::retired_unsignaled` is 0: prefer reserved CQs
//!   (`create_cq_reserved`) or signal every send on shared CQs.
//! * Inline sends read the source region from the CPU: the QP learns a
//!   region (its PD's table, under a mutex) the first time an inline request
//!   names it, then posts without a lookup.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::IpAddr;
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use rnic_core::{
    AccessFlags, AddressVector, AtomicCap, AvError, Context, CqOps, DeviceAttr, DeviceError,
    DeviceErrorKind, DeviceMemory, DmaDomain, Gid, GidEntry, GidType, InitParams, LinkLayer,
    Memory, MrInfo, Outstanding, PortAttr, PortState, PostError, Provider, QpAttr, QpAttrMask,
    QpInfo, QpInitAttr, QpOps, QpState, QpType, RecvWr, RtrParams, RtsParams, SendWr, VerbsError,
    WorkCompletion,
};
use rnic_mlx5_prm::QpState as PrmQpState;
use tracing::{debug, warn};

use crate::rdma::qp::path_mtu_for;
use crate::rdma::wqe::{
    DatagramTemplate, MAX_INLINE_DATA_RC, MAX_RECV_SGE, MAX_SEND_SGE, PostFailure,
};
use crate::{Cq, DmaBuffer, Hca, Mkey, Mlx5Error, Qp, QpOptions, UserMemoryProblem};

/// The memory an mlx5 function reaches: its own [`DmaBuffer`]s.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Mlx5Domain;

impl DmaDomain for Mlx5Domain {
    const NAME: &'static str =
        "mlx5 DMA buffer (Mlx5Provider::alloc_dma) or host memory with a stable address";
    fn admit(memory: &dyn Memory) -> bool {
        // The identity check (a buffer of this function) is in reg_mr;
        // other host memory is mapped in place there.
        memory.iova().is_some() || memory.host_addr().is_some()
    }
}

impl DeviceMemory<Mlx5Domain> for DmaBuffer {
    fn into_dyn_memory(self: Arc<Self>) -> Arc<dyn Memory> {
        self
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The GID table as the provider programmed it (index → GID).
type GidTable = Arc<Mutex<BTreeMap<u16, Gid>>>;

/// An mlx5 function as an `rnic_core` driver.
pub struct Mlx5Provider {
    /// The port's L2 ([`Mlx5Provider::open_port`]); first, so that it goes
    /// before the function.
    port: std::sync::OnceLock<crate::port::Port>,
    hca: Arc<Hca>,
    gids: GidTable,
    /// Buffers handed out by [`Mlx5Provider::alloc_dma`], by host address:
    /// how `reg_mr` finds the buffer behind an `Arc<dyn Memory>`.
    buffers: Mutex<HashMap<u64, Weak<DmaBuffer>>>,
}

impl fmt::Debug for Mlx5Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mlx5Provider")
            .field("function", &self.hca.function().name())
            .field("gids", &*lock(&self.gids))
            .finish_non_exhaustive()
    }
}

impl Mlx5Provider {
    /// A provider over a brought-up function; enables its event queue
    /// (needed by every CQ) when [`Hca::enable_events`] has not run.
    pub fn new(mut hca: Hca) -> Result<Arc<Mlx5Provider>, Mlx5Error> {
        if hca.eqn().is_none() {
            hca.enable_events()?;
        }
        Ok(Arc::new(Mlx5Provider {
            port: std::sync::OnceLock::new(),
            hca: Arc::new(hca),
            gids: Arc::default(),
            buffers: Mutex::default(),
        }))
    }

    /// Run the port's own L2 (ARP / neighbour discovery on raw Ethernet
    /// queues, `crate::port`): peers' MACs resolved by it from now on, the
    /// function's GIDs answered for. Once per provider; a second call is
    /// refused.
    pub fn open_port(&self, options: crate::port::PortOptions) -> Result<(), Mlx5Error> {
        if self.port.get().is_some() {
            return Err(Mlx5Error::QpOptions {
                reason: "the port's L2 already runs".into(),
            });
        }
        let port = crate::port::Port::open(&self.hca, options)?;
        self.port.set(port).map_err(|_| Mlx5Error::QpOptions {
            reason: "the port's L2 already runs".into(),
        })
    }

    /// The port's L2, if [`Mlx5Provider::open_port`] started it.
    pub fn port(&self) -> Option<&crate::port::Port> {
        self.port.get()
    }

    /// The function.
    pub fn hca(&self) -> &Arc<Hca> {
        &self.hca
    }

    /// Program GID table entry `index` with `ip` (SET_ROCE_ADDRESS); the
    /// emulated function then sends and receives RoCEv2 on that address.
    pub fn set_gid(&self, index: u16, ip: IpAddr) -> Result<Gid, Mlx5Error> {
        let gid = self.hca.set_gid(index, ip)?;
        lock(&self.gids).insert(index, gid);
        Ok(gid)
    }

    /// Make `ip` one of the function's GIDs: its index if it is one already,
    /// else the lowest free index (for a second user of an opened function).
    pub fn ensure_gid(&self, ip: IpAddr) -> Result<u16, Mlx5Error> {
        let gid = Gid::from_ip(ip);
        let free = {
            let table = lock(&self.gids);
            if let Some((&i, _)) = table.iter().find(|(_, g)| **g == gid) {
                return Ok(i);
            }
            (0..=u16::MAX).find(|i| !table.contains_key(i)).unwrap_or(0)
        };
        self.set_gid(free, ip)?;
        Ok(free)
    }

    /// `len` bytes of zeroed device-visible memory of this function, which
    /// `reg_mr` accepts (on the typed and the `dyn` path).
    pub fn alloc_dma(&self, len: usize) -> Result<Arc<DmaBuffer>, Mlx5Error> {
        let buf = self.hca.function().alloc_dma(len)?;
        let mut map = lock(&self.buffers);
        map.retain(|_, w| w.strong_count() > 0);
        map.insert(buf.as_ptr() as u64, Arc::downgrade(&buf));
        Ok(buf)
    }

    /// A statically dispatched verbs context.
    pub fn typed_context(this: &Arc<Mlx5Provider>) -> Context<Mlx5Provider> {
        Context::new(this.clone())
    }

    /// The `dyn` context `rnic::open` returns.
    pub fn context(this: &Arc<Mlx5Provider>) -> Context {
        Context::from_dyn(this.clone())
    }

    fn buffer_of(&self, memory: &Arc<dyn Memory>) -> Option<Arc<DmaBuffer>> {
        let buf = lock(&self.buffers).get(&memory.addr())?.upgrade()?;
        std::ptr::addr_eq(Arc::as_ptr(&buf), Arc::as_ptr(memory)).then_some(buf)
    }
}

/// A driver failure as core's allocation-free device error (the full
/// error is logged where it happens).
fn device_error(e: &Mlx5Error) -> DeviceError {
    match e {
        Mlx5Error::Command {
            opcode,
            status,
            syndrome,
            ..
        } => DeviceError::command(
            u32::from(status.as_raw()),
            *syndrome,
            opcode.name().unwrap_or("a firmware command failed"),
        ),
        Mlx5Error::CommandTimeout { .. } => DeviceError::new(
            DeviceErrorKind::Command,
            "a firmware command timed out: check the function's health (rnicctl info)",
        ),
        Mlx5Error::DeviceFatal { .. } => DeviceError::new(
            DeviceErrorKind::Command,
            "the function is in a fatal state: drop every object, reset and bring it up again",
        ),
        Mlx5Error::QueueSize { .. } => DeviceError::new(
            DeviceErrorKind::NoResources,
            "the queue does not fit (the device's maximum, or the CQ's room for every WQEBB and \
             receive the QP can hold): create the CQ deeper or the QP smaller",
        ),
        Mlx5Error::QpOptions { .. } => DeviceError::new(
            DeviceErrorKind::InvalidArgument,
            "the QP's capacities exceed what the driver supports (16 SGEs; 236 inline bytes on RC, \
             188 on UD; RC/UD)",
        ),
        Mlx5Error::IovaExhausted { .. } | Mlx5Error::SharedMemory { .. } => DeviceError::new(
            DeviceErrorKind::NoResources,
            "no device-visible memory left for the queue (IOVA space or memfd)",
        ),
        Mlx5Error::NoNeighbour { .. } => DeviceError::new(
            DeviceErrorKind::NotFound,
            "no MAC address for the peer (the log names it): add a static neighbour \
             (`neigh=<ip>/<mac>` in the mlx5 spec), pass the peer's dmac, or use `neigh=host` \
             when the host's kernel can reach the port's network",
        ),
        Mlx5Error::PortType { .. } => DeviceError::new(
            DeviceErrorKind::Unsupported,
            "the port is not Ethernet: set it to Ethernet with mlxconfig (LINK_TYPE_P1=2) and \
             reset the card",
        ),
        Mlx5Error::UserMemory { problem, .. } => match problem {
            UserMemoryProblem::Unmapped { .. } => DeviceError::os(
                libc::EFAULT,
                "the memory is not all mapped (the log names the page): register mapped memory",
            ),
            UserMemoryProblem::ReadOnly { .. } => DeviceError::os(
                libc::EFAULT,
                "the memory is read-only and the region grants write access: drop the write \
                 rights or make it writable",
            ),
            UserMemoryProblem::Shared { .. } => DeviceError::new(
                DeviceErrorKind::Unsupported,
                "the memory is a MAP_SHARED mapping a vfio-user device cannot be given: register \
                 private memory (malloc, anonymous mmap)",
            ),
            UserMemoryProblem::Hugetlb { .. } => DeviceError::new(
                DeviceErrorKind::Unsupported,
                "the memory is hugetlb memory, which a vfio-user device cannot be given in place: \
                 register 4 KiB private memory or an alloc_dma buffer (the log names the page)",
            ),
            UserMemoryProblem::PageOffset { .. } => DeviceError::new(
                DeviceErrorKind::InvalidArgument,
                "the region's address and the memory's differ in their offset within a 4 KiB \
                 page: an mlx5 MTT maps whole pages",
            ),
            _ => DeviceError::new(
                DeviceErrorKind::NoResources,
                "the memory could not be made shareable with the device (the log says why)",
            ),
        },
        Mlx5Error::DmaMap { .. } => DeviceError::new(
            DeviceErrorKind::NoResources,
            "the IOMMU mapping of the memory failed (the log says why; RLIMIT_MEMLOCK bounds \
             what kernel VFIO may pin: ulimit -l)",
        ),
        Mlx5Error::NoEventQueue => DeviceError::new(
            DeviceErrorKind::Unsupported,
            "the function has no event queue (Hca::enable_events)",
        ),
        _ => DeviceError::new(
            DeviceErrorKind::Transport,
            "the mlx5 function failed the request (the log has the driver's error)",
        ),
    }
}

fn logged(op: &'static str, e: &Mlx5Error) -> DeviceError {
    warn!(op, %e, "mlx5");
    device_error(e)
}

fn core_state(s: PrmQpState) -> QpState {
    match s {
        PrmQpState::Rst => QpState::Reset,
        PrmQpState::Init => QpState::Init,
        PrmQpState::Rtr => QpState::Rtr,
        PrmQpState::Rts => QpState::Rts,
        PrmQpState::Sqer => QpState::Sqe,
        PrmQpState::Sqd | PrmQpState::SqDraining => QpState::Sqd,
        _ => QpState::Err,
    }
}

/// Whether `av` can be sent on from a function with GID table `gids`.
fn av_problem(gids: &BTreeMap<u16, Gid>, av: &AddressVector) -> Option<AvError> {
    if av.flow_label > AddressVector::MAX_FLOW_LABEL {
        return Some(AvError::FlowLabel {
            value: av.flow_label,
        });
    }
    let Some(sgid) = gids.get(&u16::from(av.sgid_index)) else {
        return Some(AvError::NoSuchSgid {
            index: av.sgid_index,
            table_len: gids.keys().next_back().map_or(0, |&k| usize::from(k) + 1),
        });
    };
    if sgid.to_ipv4().is_some() != av.dgid.to_ipv4().is_some() {
        return Some(AvError::Family {
            sgid: *sgid,
            dgid: av.dgid,
        });
    }
    None
}

/// A protection domain: a view of the function's PD, with the regions
/// registered through it (for inline sends, which read them from the CPU).
#[derive(Debug, Clone, Default)]
pub struct Mlx5Pd {
    regions: Arc<Mutex<HashMap<u32, Weak<Mkey>>>>,
}

/// A memory region: the MKey, and the memory it keeps registered.
#[derive(Debug)]
pub struct Mlx5Mr {
    mkey: Arc<Mkey>,
    regions: Arc<Mutex<HashMap<u32, Weak<Mkey>>>>,
    _memory: Arc<dyn Memory>,
}

impl Mlx5Mr {
    /// The driver's MKey.
    pub fn mkey(&self) -> &Arc<Mkey> {
        &self.mkey
    }

    /// End the registration now although queue pairs may still hold the
    /// region ([`Mkey::revoke`]): the key is destroyed, so every later
    /// access through it fails, and application memory is unmapped from the
    /// device and given back before this returns — what `ibv_dereg_mr`
    /// promises. Inline sends stop reading it too.
    pub fn revoke(&self) -> Result<(), Mlx5Error> {
        lock(&self.regions).remove(&self.mkey.lkey().get());
        self.mkey.revoke()
    }
}

impl Drop for Mlx5Mr {
    fn drop(&mut self) {
        lock(&self.regions).remove(&self.mkey.lkey().get());
    }
}

/// A completion queue: the driver's [`Cq`] (see the module docs for why it
/// sits in a `Mutex` that `poll` never locks).
#[derive(Debug)]
pub struct Mlx5Cq {
    cq: Mutex<Cq>,
}

impl Mlx5Cq {
    /// The driver's CQ (for its counters).
    pub fn with_cq<R>(&mut self, f: impl FnOnce(&mut Cq) -> R) -> R {
        f(self.cq.get_mut().unwrap_or_else(PoisonError::into_inner))
    }

    /// Whether the next CQE is valid, without consuming it
    /// ([`Cq::pending`]; takes the lock `poll` never takes).
    pub fn pending(&self) -> bool {
        lock(&self.cq).pending()
    }
}

impl CqOps for Mlx5Cq {
    #[inline(always)]
    fn poll(&mut self, wcs: &mut [WorkCompletion]) -> Result<usize, VerbsError> {
        Ok(self
            .cq
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .poll(wcs))
    }

    fn req_notify(&self, solicited_only: bool) -> Result<(), VerbsError> {
        lock(&self.cq)
            .arm(solicited_only)
            .map_err(|e| VerbsError::ReqNotifyCq {
                source: logged("req_notify_cq", &e),
            })
    }

    fn event_fd(&self) -> Option<RawFd> {
        // The event thread drains the function's event queue and signals
        // each CQ's eventfd (`Cq::event_fd`); a reader of it leaves the arm
        // sequence to `Cq::arm`, which counts delivered events itself.
        use std::os::fd::AsRawFd;
        lock(&self.cq).event_fd().map(|fd| fd.as_raw_fd())
    }

    fn wait(&self, timeout: Option<Duration>) -> Result<bool, VerbsError> {
        let t = timeout.unwrap_or(Duration::from_secs(3600 * 24 * 365));
        lock(&self.cq)
            .wait_event(t)
            .map_err(|e| VerbsError::WaitCq {
                source: logged("wait_cq", &e),
            })
    }
}

/// A queue pair: the driver's [`Qp`], the attributes set on it, and the
/// regions inline sends may read.
#[derive(Debug)]
pub struct Mlx5Qp {
    qp: Qp,
    qp_type: QpType,
    attr: QpAttr,
    gids: GidTable,
    pd: Mlx5Pd,
    learned: Vec<u32>,
    discarded: Outstanding,
}

impl Mlx5Qp {
    /// `ah` was resolved by this QP's device.
    #[inline]
    fn owns(&self, ah: &rnic_core::AddressHandle) -> bool {
        ah.driver::<Mlx5Ah>()
            .is_some_and(|a| Arc::ptr_eq(&a.gids, &self.gids))
    }

    /// Post `wrs`, whose address handles (if any) are this device's: the
    /// driver's post, and out of line whatever it refused.
    #[inline(always)]
    fn post_send_own(&mut self, wrs: &[SendWr<'_>]) -> Result<(), VerbsError> {
        match self.qp.post_send(wrs) {
            Ok(()) => Ok(()),
            Err(e) => self.post_send_refused(wrs, e),
        }
    }

    /// A UD QP's post: its sends name address handles this device resolved
    /// at create_ah (no second check of the vector); one of another device
    /// stops the batch there, the requests before it posted.
    #[inline(never)]
    fn post_send_ud(&mut self, wrs: &[SendWr<'_>]) -> Result<(), VerbsError> {
        if let Some(index) = wrs
            .iter()
            .position(|w| w.ud.is_some_and(|d| !self.owns(d.ah)))
        {
            self.post_send_own(&wrs[..index])?;
            return Err(VerbsError::PostSend {
                index,
                reason: PostError::ForeignAddressHandle,
            });
        }
        self.post_send_own(wrs)
    }

    /// What [`Mlx5Qp::post_send_own`] does when the driver refused a
    /// request: an inline SGE of a region the QP has not seen is learned
    /// once and the batch reposted from it; anything else is mapped.
    #[cold]
    #[inline(never)]
    fn post_send_refused(
        &mut self,
        wrs: &[SendWr<'_>],
        first: Mlx5Error,
    ) -> Result<(), VerbsError> {
        let mut done = 0;
        let mut result = Err(first);
        loop {
            let Some(rest) = wrs.get(done..) else {
                return Ok(());
            };
            match result {
                Ok(()) => return Ok(()),
                Err(Mlx5Error::PostSend {
                    index,
                    reason: PostFailure::InlineRegion { lkey, .. },
                }) if self.learn(lkey) => {
                    done += index;
                    result = wrs.get(done..).map_or(Ok(()), |r| self.qp.post_send(r));
                }
                Err(Mlx5Error::PostSend { index, reason }) => {
                    return Err(VerbsError::PostSend {
                        index: done + index,
                        reason: self.post_error(reason, rest.len() - index, true),
                    });
                }
                Err(e) => {
                    return Err(VerbsError::PostSend {
                        index: done,
                        reason: PostError::Device(logged("post_send", &e)),
                    });
                }
            }
        }
    }

    /// The driver's QP (counters, doorbell record).
    pub fn qp(&self) -> &Qp {
        &self.qp
    }

    /// Give the QP the region behind `lkey` for inline sends, once.
    #[cold]
    fn learn(&mut self, lkey: u32) -> bool {
        if self.learned.contains(&lkey) {
            return false;
        }
        let Some(mkey) = lock(&self.pd.regions).get(&lkey).and_then(Weak::upgrade) else {
            return false;
        };
        self.qp.use_region(&mkey);
        self.learned.push(lkey);
        true
    }

    fn post_error(&self, reason: PostFailure, requested: usize, send: bool) -> PostError {
        let (sq, rq) = self.qp.sizes();
        match reason {
            PostFailure::QueueFull { outstanding } => PostError::QueueFull {
                outstanding,
                capacity: if send { sq } else { rq },
                requested: u32::try_from(requested).unwrap_or(u32::MAX),
            },
            PostFailure::BadState { .. } => PostError::QpState {
                state: core_state(self.qp.state()),
            },
            PostFailure::TooManySge { .. } => PostError::Device(DeviceError::new(
                DeviceErrorKind::InvalidArgument,
                "more SGEs than the QP was created for",
            )),
            PostFailure::InlineTooLong { .. } => PostError::Device(DeviceError::new(
                DeviceErrorKind::InvalidArgument,
                "more inline bytes than the QP was created for",
            )),
            PostFailure::InlineRegion { .. } => PostError::Device(DeviceError::new(
                DeviceErrorKind::InvalidArgument,
                "an inline SGE lies in no region of the QP's protection domain",
            )),
            PostFailure::UnresolvedMac { .. } => PostError::Device(DeviceError::new(
                DeviceErrorKind::NotFound,
                "a UD destination without a MAC: create an address handle (it resolves the \
                 neighbour) or give the vector's dmac",
            )),
            PostFailure::Unsupported { .. } => PostError::Device(DeviceError::new(
                DeviceErrorKind::Unsupported,
                "the operation is not supported on this QP type",
            )),
            PostFailure::BadAtomic => PostError::Device(DeviceError::new(
                DeviceErrorKind::InvalidArgument,
                "an atomic needs one 8-byte SGE and an 8-byte aligned remote address",
            )),
            PostFailure::NoUdDest => PostError::Device(DeviceError::new(
                DeviceErrorKind::InvalidArgument,
                "a UD send needs SendWr::ud (an address handle)",
            )),
            PostFailure::DeviceFatal => PostError::Device(DeviceError::new(
                DeviceErrorKind::Command,
                "the function is in a fatal state: poll the CQs for flushed completions",
            )),
        }
    }

    fn modify_err(&self, mask: QpAttrMask, e: &Mlx5Error) -> VerbsError {
        VerbsError::ModifyQp {
            qpn: self.qp.qpn(),
            mask,
            source: logged("modify_qp", e),
        }
    }
}

/// Record the attributes `mask` names.
fn apply_attr(a: &mut QpAttr, attr: &QpAttr, mask: QpAttrMask) {
    macro_rules! take {
        ($($m:ident => $f:ident),* $(,)?) => {
            $(if mask.contains(QpAttrMask::$m) { a.$f = attr.$f; })*
        };
    }
    take!(
        STATE => qp_state,
        ACCESS_FLAGS => qp_access_flags,
        PKEY_INDEX => pkey_index,
        PORT => port_num,
        QKEY => qkey,
        AV => ah_attr,
        PATH_MTU => path_mtu,
        TIMEOUT => timeout,
        RETRY_CNT => retry_cnt,
        RNR_RETRY => rnr_retry,
        RQ_PSN => rq_psn,
        MAX_QP_RD_ATOMIC => max_rd_atomic,
        MIN_RNR_TIMER => min_rnr_timer,
        SQ_PSN => sq_psn,
        MAX_DEST_RD_ATOMIC => max_dest_rd_atomic,
        DEST_QPN => dest_qp_num,
    );
}

impl QpOps for Mlx5Qp {
    fn modify(&mut self, attr: &QpAttr, mask: QpAttrMask) -> Result<(), VerbsError> {
        let from = core_state(self.qp.state());
        let to = if mask.contains(QpAttrMask::STATE) {
            attr.qp_state
        } else {
            from
        };
        let mut a = self.attr;
        apply_attr(&mut a, attr, mask);
        if mask.contains(QpAttrMask::AV)
            && self.qp_type != QpType::Ud
            && let Some(source) = av_problem(&lock(&self.gids), &a.ah_attr)
        {
            return Err(VerbsError::AddressVector {
                dgid: a.ah_attr.dgid,
                source,
            });
        }
        let r = match (from, to) {
            (_, QpState::Reset) => {
                let (s, r) = self.qp.outstanding();
                self.discarded = Outstanding { sends: s, recvs: r };
                self.qp.to_reset()
            }
            (_, QpState::Err) => self.qp.to_error(),
            (QpState::Reset, QpState::Init) => self.qp.init(&InitParams {
                port_num: a.port_num.max(1),
                pkey_index: a.pkey_index,
                access: a.qp_access_flags,
                qkey: a.qkey,
            }),
            (QpState::Init, QpState::Rtr) => {
                let av = a.ah_attr;
                self.qp.ready_to_receive(
                    a.dest_qp_num,
                    a.rq_psn,
                    av.dgid,
                    &RtrParams {
                        path_mtu: a.path_mtu,
                        max_dest_rd_atomic: a.max_dest_rd_atomic,
                        min_rnr_timer: a.min_rnr_timer,
                        sgid_index: av.sgid_index,
                        hop_limit: av.hop_limit,
                        traffic_class: av.traffic_class,
                        udp_sport: av.udp_sport,
                        dmac: av.dmac,
                    },
                )
            }
            (QpState::Rtr, QpState::Rts) => self.qp.ready_to_send(
                a.sq_psn,
                &RtsParams {
                    timeout: a.timeout,
                    retry_cnt: a.retry_cnt,
                    rnr_retry: a.rnr_retry,
                    max_rd_atomic: a.max_rd_atomic,
                },
            ),
            _ => {
                return Err(VerbsError::NotSupported {
                    operation: "modify_qp (this transition or attribute-only change)",
                    backend: "mlx5",
                });
            }
        };
        r.map_err(|e| self.modify_err(mask, &e))?;
        if to != QpState::Reset {
            self.discarded = Outstanding::default();
        }
        self.attr = a;
        self.attr.qp_state = to;
        Ok(())
    }

    fn query(&mut self) -> Result<QpAttr, VerbsError> {
        let state = match self.qp.query_state() {
            Ok(s) => core_state(s),
            Err(e) if self.qp.state() == PrmQpState::Err => {
                tracing::debug!(%e, "QUERY_QP failed on a QP in ERR");
                QpState::Err
            }
            Err(e) => {
                return Err(VerbsError::QueryQp {
                    qpn: self.qp.qpn(),
                    source: logged("query_qp", &e),
                });
            }
        };
        let mut a = self.attr;
        a.qp_state = state;
        a.cur_qp_state = state;
        Ok(a)
    }

    // Always in line: core's `QueuePair::post_send` then holds the driver's
    // small-WRITE shortcut itself (one frame, no `Result` through memory).
    #[inline(always)]
    fn post_send(&mut self, wrs: &[SendWr<'_>]) -> Result<(), VerbsError> {
        // A UD QP's address handles are checked out of line: the connected
        // QP's post holds no call.
        if self.qp_type == QpType::Ud {
            return self.post_send_ud(wrs);
        }
        self.post_send_own(wrs)
    }
    /// The driver's small-WRITE shortcut ([`Qp::try_post_small_write`]);
    /// a UD QP's sends never take it (its queues refuse a WRITE there, so
    /// the address-handle check in `post_send` stays the only way in).
    #[inline(always)]
    fn try_post_send_one(&mut self, wr: &SendWr<'_>) -> bool {
        self.qp.try_post_small_write(wr)
    }
    #[inline]
    fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> Result<(), VerbsError> {
        match self.qp.post_recv(wrs) {
            Ok(()) => Ok(()),
            Err(Mlx5Error::PostRecv { index, reason }) => Err(VerbsError::PostRecv {
                index,
                reason: self.post_error(reason, wrs.len() - index, false),
            }),
            Err(e) => Err(VerbsError::PostRecv {
                index: 0,
                reason: PostError::Device(logged("post_recv", &e)),
            }),
        }
    }

    fn outstanding(&self) -> Outstanding {
        let (sends, recvs) = self.qp.outstanding();
        Outstanding { sends, recvs }
    }

    fn discard(&mut self) -> Outstanding {
        let (sends, recvs) = self.qp.outstanding();
        let d = Outstanding {
            sends: sends + self.discarded.sends,
            recvs: recvs + self.discarded.recvs,
        };
        self.discarded = Outstanding::default();
        d
    }
}

/// What `create_ah` resolved: the vector checked against the GID table,
/// the device (its GID table) that checked it, and the datagram segment
/// of its sends with everything the vector fixes already in place.
#[derive(Clone)]
pub struct Mlx5Ah {
    /// The address vector.
    pub av: AddressVector,
    /// The datagram segment, less the peer QPN, Q_Key and derived UDP
    /// source port a post puts in.
    pub(crate) template: DatagramTemplate,
    gids: GidTable,
}

impl fmt::Debug for Mlx5Ah {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mlx5Ah")
            .field("av", &self.av)
            .finish_non_exhaustive()
    }
}

impl crate::rdma::wq::UdSegment for rnic_core::UdSend<'_> {
    /// The handle's template when this driver made it (an
    /// [`crate::Mlx5Provider`] refuses a handle of another device before
    /// the post reaches the queue); otherwise built from its vector.
    #[inline]
    fn datagram(
        &self,
        qpn: u32,
    ) -> Result<[u8; crate::rdma::wqe::DATAGRAM_SEG_BYTES], PostFailure> {
        match self.ah.driver::<Mlx5Ah>() {
            Some(ah) => ah
                .template
                .segment(qpn, self.remote_qpn.get(), self.remote_qkey)
                .map_err(|_| PostFailure::NoUdDest),
            None => crate::rdma::wq::datagram_of(&rnic_core::UdDestination::ud_dest(self), qpn),
        }
    }
}

impl Provider for Mlx5Provider {
    type Domain = Mlx5Domain;
    type Pd = Mlx5Pd;
    type Mr = Mlx5Mr;
    type Cq = Mlx5Cq;
    type Qp = Mlx5Qp;
    type Ah = Mlx5Ah;

    fn backend(&self) -> &'static str {
        "mlx5"
    }

    fn query_device(&self) -> Result<DeviceAttr, VerbsError> {
        let info = self.hca.info();
        let caps = self
            .hca
            .general_caps()
            .map_err(|e| VerbsError::QueryDevice {
                source: logged("query_device", &e),
            })?;
        let pow = |l: u32| 1u32.checked_shl(l).unwrap_or(u32::MAX);
        let mac = self.hca.mac().unwrap_or([0; 6]);
        // EUI-64 from the port's MAC, as mlx5 derives its node GUID.
        let guid = u64::from_be_bytes([
            mac[0] ^ 2,
            mac[1],
            mac[2],
            0xff,
            0xfe,
            mac[3],
            mac[4],
            mac[5],
        ]);
        Ok(DeviceAttr {
            fw_ver: info.fw_version.to_string(),
            vendor_id: 0x15b3,
            vendor_part_id: u32::from(info.device_id),
            node_guid: guid,
            max_qp: pow(info.log_max_qp),
            max_qp_wr: pow(caps.log_max_qp_sz()).min(0x8000),
            max_sge: MAX_SEND_SGE.min(MAX_RECV_SGE) as u32,
            max_cq: pow(info.log_max_cq),
            max_cqe: pow(caps.log_max_cq_sz()),
            max_mr: pow(info.log_max_mkey),
            max_mr_size: 1u64 << info.log_max_msg.min(63),
            max_qp_rd_atom: 16,
            max_qp_init_rd_atom: 16,
            // RC's; a UD QP takes at most MAX_INLINE_DATA (188).
            max_inline_data: MAX_INLINE_DATA_RC as u32,
            atomic_cap: AtomicCap::Hca,
            phys_port_cnt: u8::try_from(info.num_ports.max(1)).unwrap_or(1),
        })
    }

    fn query_port(&self, port_num: u8) -> Result<PortAttr, VerbsError> {
        if port_num != 1 {
            return Err(VerbsError::QueryPort {
                port: port_num,
                source: DeviceError::new(
                    DeviceErrorKind::NotFound,
                    "an mlx5 function has one port: port 1",
                ),
            });
        }
        let info = self.hca.info();
        let vport_mtu = self.hca.vport_mtu().map_err(|e| VerbsError::QueryPort {
            port: port_num,
            source: logged("query_port", &e),
        })?;
        let mtu = path_mtu_for(vport_mtu);
        // Audit row 8: the link state and the GID table from the device.
        let up = self.hca.link_up().map_err(|e| VerbsError::QueryPort {
            port: port_num,
            source: logged("query_port", &e),
        })?;
        // PTYS when the firmware answers it; a function that refuses the
        // register (a VF may) keeps the old report of 4 × 25 Gb/s.
        let (lanes, lane_mbps) = match self.hca.link_speed() {
            Ok(Some(mode)) => mode,
            Ok(None) => (1, 0),
            Err(e) => {
                debug!(%e, "PTYS unreadable: reporting 4 x 25 Gb/s");
                (4, 25_000)
            }
        };
        Ok(PortAttr {
            state: if info.roce && up {
                PortState::Active
            } else {
                PortState::Down
            },
            max_mtu: mtu,
            active_mtu: mtu,
            gid_tbl_len: self.hca.gid_table_len(),
            link_layer: LinkLayer::Ethernet,
            active_width: lanes,
            active_speed_mbps: lane_mbps,
            max_msg_sz: 1u32.checked_shl(info.log_max_msg).unwrap_or(u32::MAX),
        })
    }

    fn query_gid_table(&self, port_num: u8) -> Result<Vec<GidEntry>, VerbsError> {
        if port_num != 1 {
            return Err(VerbsError::QueryGid {
                port: port_num,
                source: DeviceError::new(
                    DeviceErrorKind::NotFound,
                    "an mlx5 function has one port: port 1",
                ),
            });
        }
        Ok(lock(&self.gids)
            .iter()
            .map(|(&index, &gid)| GidEntry {
                index: u32::from(index),
                gid,
                gid_type: GidType::RoceV2,
                netdev: None,
            })
            .collect())
    }

    fn alloc_pd(&self) -> Result<Mlx5Pd, VerbsError> {
        Ok(Mlx5Pd::default())
    }

    fn reg_mr(
        &self,
        pd: &Mlx5Pd,
        memory: Arc<dyn Memory>,
        access: AccessFlags,
    ) -> Result<(Mlx5Mr, MrInfo), VerbsError> {
        let len = memory.len();
        let mkey = if let Some(buf) = self.buffer_of(&memory) {
            Mkey::new(&self.hca, buf, access)
        } else if let Some(host) = memory.host_addr() {
            // Memory this driver did not allocate: mapped in place.
            Mkey::new_user(&self.hca, memory.clone(), host, memory.addr(), access)
        } else {
            return Err(VerbsError::UnreachableMemory {
                backend: "mlx5",
                domain: Mlx5Domain::NAME,
            });
        };
        let mkey = mkey.map_err(|e| VerbsError::RegMr {
            len,
            access,
            source: logged("reg_mr", &e),
        })?;
        let mkey = Arc::new(mkey);
        lock(&pd.regions).insert(mkey.lkey().get(), Arc::downgrade(&mkey));
        let info = MrInfo {
            lkey: mkey.lkey(),
            rkey: mkey.rkey(),
            addr: mkey.addr(),
            len,
        };
        Ok((
            Mlx5Mr {
                mkey,
                regions: pd.regions.clone(),
                _memory: memory,
            },
            info,
        ))
    }

    fn create_cq(&self, depth: u32) -> Result<(Mlx5Cq, u32), VerbsError> {
        let cq = Cq::new(&self.hca, depth).map_err(|e| VerbsError::CreateCq {
            depth,
            source: logged("create_cq", &e),
        })?;
        let capacity = cq.capacity();
        Ok((Mlx5Cq { cq: Mutex::new(cq) }, capacity))
    }

    fn create_qp(
        &self,
        pd: &Mlx5Pd,
        send_cq: &Mlx5Cq,
        recv_cq: &Mlx5Cq,
        init: &QpInitAttr,
    ) -> Result<(Mlx5Qp, QpInfo), VerbsError> {
        let opts = QpOptions {
            qp_type: init.qp_type,
            max_send_wr: init.caps.max_send_wr,
            max_recv_wr: init.caps.max_recv_wr,
            max_send_sge: init.caps.max_send_sge.max(1),
            max_recv_sge: init.caps.max_recv_sge.max(1),
            max_inline_data: init.caps.max_inline_data,
            sq_sig_all: init.sq_sig_all,
        };
        let err = |e: Mlx5Error| VerbsError::CreateQp {
            source: logged("create_qp", &e),
        };
        let qp = if std::ptr::eq(send_cq, recv_cq) {
            Qp::new(&self.hca, &mut lock(&send_cq.cq), None, opts).map_err(err)?
        } else {
            // Two CQs: lock in address order (concurrent creates on the
            // same pair cannot deadlock); never contended by polls.
            let (first, second) = if (send_cq as *const Mlx5Cq) < (recv_cq as *const Mlx5Cq) {
                (send_cq, recv_cq)
            } else {
                (recv_cq, send_cq)
            };
            let mut a = lock(&first.cq);
            let mut b = lock(&second.cq);
            let (s, r) = if std::ptr::eq(first, send_cq) {
                (&mut *a, &mut *b)
            } else {
                (&mut *b, &mut *a)
            };
            Qp::new(&self.hca, s, Some(r), opts).map_err(err)?
        };
        let info = QpInfo {
            qpn: qp.qpn(),
            caps: init.caps,
        };
        Ok((
            Mlx5Qp {
                qp,
                qp_type: init.qp_type,
                attr: QpAttr {
                    cap: init.caps,
                    ..QpAttr::default()
                },
                gids: self.gids.clone(),
                pd: pd.clone(),
                learned: Vec::new(),
                discarded: Outstanding::default(),
            },
            info,
        ))
    }

    fn create_ah(&self, _pd: &Mlx5Pd, av: &AddressVector) -> Result<Mlx5Ah, VerbsError> {
        if let Some(source) = av_problem(&lock(&self.gids), av) {
            return Err(VerbsError::AddressVector {
                dgid: av.dgid,
                source,
            });
        }
        // The peer's MAC, resolved here on the control path (audit row 7).
        let dmac =
            self.hca
                .resolve_neighbour(&av.dgid, av.dmac)
                .map_err(|e| VerbsError::CreateAh {
                    source: logged("create_ah", &e),
                })?;
        let template = DatagramTemplate::new(av, dmac).map_err(|e| {
            warn!(%e, "create_ah: the address vector does not fit a datagram segment");
            VerbsError::CreateAh {
                source: DeviceError::new(
                    DeviceErrorKind::InvalidArgument,
                    "the address vector does not fit a datagram segment",
                ),
            }
        })?;
        Ok(Mlx5Ah {
            av: *av,
            template,
            gids: Arc::clone(&self.gids),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rnic_core::Mtu;

    #[test]
    fn av_checks_index_and_family() {
        let mut gids = BTreeMap::new();
        let v4 = Gid::from_ipv4("127.0.0.1".parse().unwrap());
        gids.insert(0, v4);
        let ok = AddressVector::new(Gid::from_ipv4("127.0.0.2".parse().unwrap()));
        assert_eq!(av_problem(&gids, &ok), None);
        let bad_index = AddressVector {
            sgid_index: 3,
            ..ok
        };
        assert!(matches!(
            av_problem(&gids, &bad_index),
            Some(AvError::NoSuchSgid {
                index: 3,
                table_len: 1
            })
        ));
        let v6 = AddressVector::new(Gid::from_ip("fd00::1".parse().unwrap()));
        assert!(matches!(
            av_problem(&gids, &v6),
            Some(AvError::Family { .. })
        ));
    }

    #[test]
    fn the_port_mtu_is_the_largest_path_mtu_the_vport_carries() {
        assert_eq!(path_mtu_for(9000), Mtu::Mtu4096);
        assert_eq!(path_mtu_for(4096 + 96), Mtu::Mtu4096);
        assert_eq!(path_mtu_for(4096 + 95), Mtu::Mtu2048);
        assert_eq!(path_mtu_for(1500), Mtu::Mtu1024);
        assert_eq!(path_mtu_for(1024 + 95), Mtu::Mtu512);
        assert_eq!(path_mtu_for(0), Mtu::Mtu256);
    }

    #[test]
    fn prm_states_map_onto_the_verbs_states() {
        assert_eq!(core_state(PrmQpState::Rst), QpState::Reset);
        assert_eq!(core_state(PrmQpState::Rts), QpState::Rts);
        assert_eq!(core_state(PrmQpState::Sqer), QpState::Sqe);
        assert_eq!(core_state(PrmQpState::Err), QpState::Err);
    }

    #[test]
    fn provider_objects_are_send_and_sync() {
        fn ss<T: Send + Sync>() {}
        ss::<Mlx5Provider>();
        ss::<Mlx5Cq>();
        ss::<Mlx5Qp>();
        ss::<Mlx5Mr>();
    }
}
