//! The objects users hold: [`Context`], [`ProtectionDomain`] and
//! [`MemoryRegion`] (completion queues are in [`crate::cq`], queue pairs in
//! [`crate::queue_pair`]).
//!
//! Every object releases its device resource exactly once, in `Drop`, and the
//! teardown order **QP → CQ → MR → PD** follows from ownership rather than from
//! the order the user drops things in:
//!
//! * a queue pair holds its send and receive CQs and its PD, so it is destroyed
//!   before any of them;
//! * a memory region holds its PD, so it is deregistered before the PD is
//!   freed;
//! * a queue pair may also hold memory regions ([`QueuePair::retain_region`]):
//!   they stay registered until the QP is destroyed, so no request the QP has
//!   outstanding can name a key that is gone.
//!
//! Memory never outlives its device access either way: a region holds its
//! `Arc<dyn Memory>`, and the provider holds one until deregistration returns.
//!
//! A failed destroy in `Drop` is logged with `tracing` and otherwise ignored —
//! `Drop` cannot report it and must not panic.
//!
//! [`QueuePair::retain_region`]: crate::queue_pair::QueuePair::retain_region

use std::sync::Arc;

use crate::access::AccessFlags;
use crate::cq::CompletionQueue;
use crate::memory::{MemAccess, Memory, MemoryError, check_range};
use crate::provider::{
    DeviceAttr, GidEntry, MrHandle, MrInfo, PdHandle, PortAttr, Provider, VerbsError,
};
use crate::qp::QpInitAttr;
use crate::queue_pair::QueuePair;
use crate::types::{Lkey, Rkey};
use crate::wr::Sge;

/// An open device: the entry point to every other object. Cloning is cheap.
#[derive(Debug, Clone)]
pub struct Context {
    provider: Arc<dyn Provider>,
}

impl Context {
    /// A context over `provider` (what a driver's `open` returns).
    pub fn new(provider: Arc<dyn Provider>) -> Context {
        Context { provider }
    }

    /// The provider behind this context.
    pub fn provider(&self) -> &Arc<dyn Provider> {
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
    pub fn alloc_pd(&self) -> Result<ProtectionDomain, VerbsError> {
        let handle = self.provider.alloc_pd()?;
        tracing::debug!(pd = %handle, "alloc_pd");
        Ok(ProtectionDomain {
            inner: Arc::new(PdInner {
                provider: Arc::clone(&self.provider),
                handle,
            }),
        })
    }

    /// Create a completion queue of at least `depth` entries. Its credit
    /// window is sized to the depth the provider grants.
    pub fn create_cq(&self, depth: u32) -> Result<CompletionQueue, VerbsError> {
        CompletionQueue::create(&self.provider, depth)
    }
}

/// The shared state of a protection domain; freed with its last owner.
#[derive(Debug)]
pub(crate) struct PdInner {
    pub(crate) provider: Arc<dyn Provider>,
    pub(crate) handle: PdHandle,
}

impl Drop for PdInner {
    fn drop(&mut self) {
        tracing::debug!(pd = %self.handle, "dealloc_pd");
        if let Err(e) = self.provider.dealloc_pd(self.handle) {
            tracing::error!(pd = %self.handle, error = %e, "dealloc_pd failed during drop");
        }
    }
}

/// A protection domain: regions and queue pairs in one domain may use each
/// other. Cloning is cheap; the domain is freed when the last clone, region
/// and queue pair in it are gone.
#[derive(Debug, Clone)]
pub struct ProtectionDomain {
    pub(crate) inner: Arc<PdInner>,
}

impl ProtectionDomain {
    /// The provider's handle.
    pub fn handle(&self) -> PdHandle {
        self.inner.handle
    }

    /// Register `memory` with `access` rights. The flags are checked first
    /// (REMOTE_WRITE or REMOTE_ATOMIC need LOCAL_WRITE).
    pub fn reg_mr(
        &self,
        memory: Arc<dyn Memory>,
        access: AccessFlags,
    ) -> Result<MemoryRegion, VerbsError> {
        let access = access.validate()?;
        let info = self
            .inner
            .provider
            .reg_mr(self.inner.handle, Arc::clone(&memory), access)?;
        tracing::debug!(pd = %self.inner.handle, mr = %info.handle, len = info.len, %access, "reg_mr");
        Ok(MemoryRegion {
            inner: Arc::new(MrInner {
                info,
                access,
                memory,
                pd: Arc::clone(&self.inner),
            }),
        })
    }

    /// Create a queue pair in this domain completing into `send_cq` and
    /// `recv_cq` (which may be the same queue). It starts in RESET.
    pub fn create_qp(
        &self,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
        init: &QpInitAttr,
    ) -> Result<QueuePair, VerbsError> {
        QueuePair::create(self, send_cq, recv_cq, init)
    }
}

/// The shared state of a memory region; deregistered with its last owner.
#[derive(Debug)]
pub(crate) struct MrInner {
    info: MrInfo,
    access: AccessFlags,
    memory: Arc<dyn Memory>,
    /// Dropped after the deregistration: the PD outlives its regions.
    pd: Arc<PdInner>,
}

impl Drop for MrInner {
    fn drop(&mut self) {
        tracing::debug!(mr = %self.info.handle, "dereg_mr");
        if let Err(e) = self.pd.provider.dereg_mr(self.info.handle) {
            tracing::error!(mr = %self.info.handle, error = %e, "dereg_mr failed during drop");
        }
    }
}

/// Registered memory. Cloning is cheap; the registration ends when the last
/// clone (and every queue pair retaining it) is gone.
#[derive(Debug, Clone)]
pub struct MemoryRegion {
    pub(crate) inner: Arc<MrInner>,
}

impl MemoryRegion {
    /// The provider's handle.
    pub fn handle(&self) -> MrHandle {
        self.inner.info.handle
    }

    /// The protection domain's handle.
    pub fn pd_handle(&self) -> PdHandle {
        self.inner.pd.handle
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
