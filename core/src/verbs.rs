//! The objects users hold: [`Context`], [`ProtectionDomain`],
//! [`MemoryRegion`] and [`AddressHandle`] (completion queues are in
//! [`crate::cq`], queue pairs in [`crate::queue_pair`]).
//!
//! Each is generic over the driver `P` ([`Provider`]); the default,
//! [`DynDevice`], is the `dyn` form `rnic::open` returns. Naming a driver type
//! (`Context<RxeProvider>`) dispatches every call statically.
//!
//! Every object releases its device resource exactly once, when the driver's
//! object it owns is dropped, and the teardown order **QP → CQ → MR → PD**
//! follows from ownership rather than from the order the user drops things in:
//!
//! * a queue pair holds its PD and the driver keeps the CQs it completes into
//!   alive, so it is destroyed before any of them;
//! * a memory region holds its PD, so it is deregistered before the PD is
//!   freed;
//! * a queue pair holds every memory region a request posted on it named (it
//!   retains each the first time it sees its L_Key), so no request the QP has
//!   outstanding can name a key that is gone.
//!
//! Memory never outlives its device access either way: a region holds its
//! memory, and the driver holds it until the region is dropped.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use crate::access::AccessFlags;
use crate::cq::{CompletionQueue, CqCredits};
use crate::memory::{MemAccess, Memory, MemoryError, check_range};
use crate::provider::{
    AnyObject, DeviceAttr, DeviceMemory, DynDevice, DynProvider, GidEntry, MrInfo, PortAttr,
    Provider, VerbsError,
};
use crate::qp::{AddressVector, QpInitAttr};
use crate::queue_pair::QueuePair;
use crate::types::{Lkey, Rkey};
use crate::wr::Sge;

/// An open device: the entry point to every other object. Cloning is cheap.
#[derive(Debug)]
pub struct Context<P: Provider = DynDevice> {
    provider: Arc<P>,
}

impl<P: Provider> Clone for Context<P> {
    fn clone(&self) -> Context<P> {
        Context {
            provider: Arc::clone(&self.provider),
        }
    }
}

impl Context<DynDevice> {
    /// A context over a driver of any type, dispatched dynamically.
    pub fn from_dyn(provider: Arc<dyn DynProvider>) -> Context {
        Context::new(Arc::new(DynDevice::new(provider)))
    }
}

impl<P: Provider> Context<P> {
    /// A context over `provider` (what a driver's `open` returns).
    pub fn new(provider: Arc<P>) -> Context<P> {
        Context { provider }
    }

    /// The driver behind this context.
    pub fn provider(&self) -> &Arc<P> {
        &self.provider
    }

    /// The backend's name (`"rxe"`, `"mlx5"`).
    pub fn backend(&self) -> &'static str {
        self.provider.backend()
    }

    /// Device capabilities.
    pub fn query_device(&self) -> Result<DeviceAttr, VerbsError> {
        self.provider.query_device()
    }

    /// Properties of port `port_num` (from 1).
    pub fn query_port(&self, port_num: u8) -> Result<PortAttr, VerbsError> {
        self.provider.query_port(port_num)
    }

    /// The valid entries of port `port_num`'s GID table.
    pub fn query_gid_table(&self, port_num: u8) -> Result<Vec<GidEntry>, VerbsError> {
        self.provider.query_gid_table(port_num)
    }

    /// Allocate a protection domain.
    pub fn alloc_pd(&self) -> Result<ProtectionDomain<P>, VerbsError> {
        let pd = self.provider.alloc_pd()?;
        tracing::debug!(backend = self.backend(), "alloc_pd");
        Ok(ProtectionDomain {
            inner: Arc::new(PdInner {
                pd,
                provider: Arc::clone(&self.provider),
                regions: Mutex::new(HashMap::new()),
            }),
        })
    }

    /// Create a completion queue of at least `depth` entries that any number
    /// of queues may share: one credit per request ([`CqCredits::Shared`]).
    pub fn create_cq(&self, depth: u32) -> Result<CompletionQueue<P>, VerbsError> {
        CompletionQueue::create(&self.provider, depth, CqCredits::Shared)
    }

    /// Create a completion queue of at least `depth` entries whose QPs
    /// reserve their queue depths at creation ([`CqCredits::Reserved`]):
    /// no credit work per request; a QP that does not fit is refused.
    pub fn create_cq_reserved(&self, depth: u32) -> Result<CompletionQueue<P>, VerbsError> {
        CompletionQueue::create(&self.provider, depth, CqCredits::Reserved)
    }
}

/// The shared state of a protection domain; freed with its last owner.
#[derive(Debug)]
pub(crate) struct PdInner<P: Provider> {
    /// Field order is drop order: the driver's PD first.
    pub(crate) pd: P::Pd,
    pub(crate) provider: Arc<P>,
    /// L_Key → region, for the QPs that retain the regions their requests
    /// name (looked up once per region per QP).
    regions: Mutex<HashMap<u32, Weak<MrInner<P>>>>,
}

impl<P: Provider> PdInner<P> {
    /// The live region whose L_Key is `lkey`.
    pub(crate) fn region(&self, lkey: Lkey) -> Option<Arc<MrInner<P>>> {
        let map = self.regions.lock().unwrap_or_else(PoisonError::into_inner);
        map.get(&lkey.get()).and_then(Weak::upgrade)
    }
}

/// A protection domain: regions and queue pairs in one domain may use each
/// other. Cloning is cheap; the domain is freed when the last clone, region
/// and queue pair in it are gone.
#[derive(Debug)]
pub struct ProtectionDomain<P: Provider = DynDevice> {
    pub(crate) inner: Arc<PdInner<P>>,
}

impl<P: Provider> Clone for ProtectionDomain<P> {
    fn clone(&self) -> ProtectionDomain<P> {
        ProtectionDomain {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<P: Provider> ProtectionDomain<P> {
    /// The driver's protection domain object.
    pub fn driver_pd(&self) -> &P::Pd {
        &self.inner.pd
    }

    /// Register `memory` with `access` rights. The memory must be of a kind
    /// the driver reaches ([`DeviceMemory`] of its [`Provider::Domain`]; the
    /// compiler checks). The flags are checked first (REMOTE_WRITE or
    /// REMOTE_ATOMIC need LOCAL_WRITE).
    pub fn reg_mr<M>(
        &self,
        memory: Arc<M>,
        access: AccessFlags,
    ) -> Result<MemoryRegion<P>, VerbsError>
    where
        M: DeviceMemory<P::Domain> + ?Sized,
    {
        let access = access.validate()?;
        let memory = memory.into_dyn_memory();
        let (mr, info) = self
            .inner
            .provider
            .reg_mr(&self.inner.pd, Arc::clone(&memory), access)?;
        tracing::debug!(lkey = %info.lkey, len = info.len, %access, "reg_mr");
        let inner = Arc::new(MrInner {
            mr,
            info,
            access,
            memory,
            pd: Arc::clone(&self.inner),
        });
        self.inner
            .regions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(info.lkey.get(), Arc::downgrade(&inner));
        Ok(MemoryRegion { inner })
    }

    /// Create a queue pair in this domain completing into `send_cq` and
    /// `recv_cq` (which may be the same queue). It starts in RESET.
    pub fn create_qp(
        &self,
        send_cq: &CompletionQueue<P>,
        recv_cq: &CompletionQueue<P>,
        init: &QpInitAttr,
    ) -> Result<QueuePair<P>, VerbsError> {
        QueuePair::create(self, send_cq, recv_cq, init)
    }

    /// Resolve `av` once, for UD sends ([`crate::SendWr::ud_send`]): the driver
    /// checks the source GID and the route here instead of per request, and
    /// keeps what it resolved in the handle for its post path.
    pub fn create_ah(&self, av: &AddressVector) -> Result<AddressHandle, VerbsError> {
        if av.flow_label > AddressVector::MAX_FLOW_LABEL {
            return Err(VerbsError::AddressVector {
                dgid: av.dgid,
                source: crate::provider::AvError::FlowLabel {
                    value: av.flow_label,
                },
            });
        }
        let ah = self.inner.provider.create_ah(&self.inner.pd, av)?;
        Ok(AddressHandle {
            av: *av,
            keep: Arc::new(AhKeep {
                ah,
                _pd: Arc::clone(&self.inner) as Arc<dyn std::any::Any + Send + Sync>,
            }),
        })
    }
}

#[derive(Debug)]
struct AhKeep<A> {
    ah: A,
    _pd: Arc<dyn std::any::Any + Send + Sync>,
}

/// A resolved address vector (`ibv_ah`): what UD sends name. Cloning is
/// cheap. It keeps its protection domain alive.
#[derive(Debug, Clone)]
pub struct AddressHandle {
    av: AddressVector,
    keep: Arc<dyn AhObject>,
}

trait AhObject: std::fmt::Debug + Send + Sync {
    fn driver(&self) -> &dyn std::any::Any;
}

impl<A: std::fmt::Debug + Send + Sync + 'static> AhObject for AhKeep<A> {
    fn driver(&self) -> &dyn std::any::Any {
        &self.ah
    }
}

impl AddressHandle {
    /// An address handle no driver resolved, for sans-IO engines and tests
    /// (`rnic-roce`'s simulation). A driver's `create_ah` is what checks an
    /// address vector; a driver may refuse, or drop, sends to an unchecked one.
    pub fn unchecked(av: AddressVector) -> AddressHandle {
        AddressHandle {
            av,
            keep: Arc::new(AhKeep {
                ah: (),
                _pd: Arc::new(()),
            }),
        }
    }

    /// The address vector it was created from.
    pub fn av(&self) -> &AddressVector {
        &self.av
    }

    /// The destination of a UD send to QP `remote_qpn` (Q_Key `remote_qkey`)
    /// at this address.
    pub fn ud_dest(
        &self,
        remote_qpn: crate::types::Qpn,
        remote_qkey: u32,
    ) -> crate::wr::UdSend<'_> {
        crate::wr::UdSend {
            ah: self,
            remote_qpn,
            remote_qkey,
        }
    }

    /// The driver's object for it, when it is of type `T` (a driver looks its
    /// own up; through [`DynDevice`] it is boxed once more: `AnyObject`).
    pub fn driver<T: 'static>(&self) -> Option<&T> {
        let d = self.keep.driver();
        d.downcast_ref::<T>().or_else(|| {
            d.downcast_ref::<AnyObject>()
                .and_then(|b| b.downcast_ref::<T>())
        })
    }
}

impl PartialEq for AddressHandle {
    fn eq(&self, other: &AddressHandle) -> bool {
        Arc::ptr_eq(&self.keep, &other.keep)
    }
}

impl Eq for AddressHandle {}

impl std::hash::Hash for AddressHandle {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.av.hash(state);
    }
}

/// The shared state of a memory region; deregistered with its last owner.
#[derive(Debug)]
pub(crate) struct MrInner<P: Provider> {
    /// Field order is drop order: the driver's region first.
    mr: P::Mr,
    info: MrInfo,
    access: AccessFlags,
    memory: Arc<dyn Memory>,
    /// Dropped after the deregistration: the PD outlives its regions.
    pd: Arc<PdInner<P>>,
}

impl<P: Provider> Drop for MrInner<P> {
    fn drop(&mut self) {
        tracing::debug!(lkey = %self.info.lkey, "dereg_mr");
        let mut map = self
            .pd
            .regions
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if map
            .get(&self.info.lkey.get())
            .is_some_and(|w| w.strong_count() == 0)
        {
            map.remove(&self.info.lkey.get());
        }
    }
}

/// Registered memory. Cloning is cheap; the registration ends when the last
/// clone (and every queue pair that posted a request naming it) is gone.
#[derive(Debug)]
pub struct MemoryRegion<P: Provider = DynDevice> {
    pub(crate) inner: Arc<MrInner<P>>,
}

impl<P: Provider> Clone for MemoryRegion<P> {
    fn clone(&self) -> MemoryRegion<P> {
        MemoryRegion {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<P: Provider> MemoryRegion<P> {
    /// The driver's region object.
    pub fn driver_mr(&self) -> &P::Mr {
        &self.inner.mr
    }

    /// Key for local SGEs.
    pub fn lkey(&self) -> Lkey {
        self.inner.info.lkey
    }

    /// Key a peer names the region by.
    pub fn rkey(&self) -> Rkey {
        self.inner.info.rkey
    }

    /// Address of byte 0 in the region's address space (what SGEs and a
    /// peer's RDMA requests use).
    pub fn addr(&self) -> u64 {
        self.inner.info.addr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.inner.info.len
    }

    /// `true` for a zero-length region.
    pub fn is_empty(&self) -> bool {
        self.inner.info.len == 0
    }

    /// The rights granted.
    pub fn access(&self) -> AccessFlags {
        self.inner.access
    }

    /// The registered memory (read and write it by copying, never by reference).
    pub fn memory(&self) -> &Arc<dyn Memory> {
        &self.inner.memory
    }

    /// An SGE for `len` bytes at `offset` into the region, bounds-checked.
    pub fn sge(&self, offset: usize, len: u32) -> Result<Sge, MemoryError> {
        check_range(MemAccess::Read, offset, len as usize, self.len())?;
        Ok(Sge::new(
            self.addr().wrapping_add(offset as u64),
            len,
            self.lkey(),
        ))
    }

    /// An SGE covering the whole region (at most 4 GiB - 1 of it).
    pub fn whole(&self) -> Sge {
        let len = u32::try_from(self.len()).unwrap_or(u32::MAX);
        Sge::new(self.addr(), len, self.lkey())
    }
}
