//! [`StagedMemory`]: device memory (VRAM) as an rnic-core [`Memory`], every
//! access staged through a page-locked host ring.
//!
//! This is how a CPU-driven transport (rnic-rxe, where the CPU is the NIC)
//! reaches GPU memory: the responder's [`Memory::write`] of a packet's
//! payload copies it into a staging slot, queues the slot's copy to the
//! device and **returns only after the copy finished**; [`Memory::read`]
//! queues device-to-staging copies, waits, and copies out. So the ordering
//! RDMA promises holds without any hook in the transport: a WRITE WITH
//! IMMEDIATE's receive completion, generated after the last payload write
//! returned, follows its bytes into VRAM; a READ (and an atomic) returns
//! what VRAM holds at the time, including bytes a GPU kernel wrote.
//!
//! Large accesses are pipelined over the ring's slots (the CPU fills slot
//! `k + 1` while the engine copies slot `k`); a slot is reused only after
//! the copy that last used it finished.
//!
//! Teardown follows ownership: the device buffer is freed first (after the
//! queue drained), then the staging buffer is unregistered from the engine
//! and its pages released, and the engine (the device context) goes last,
//! when its last holder is gone.
//!
//! Atomics are a read-modify-write under the staging lock: atomic with
//! respect to every other access through this memory (RDMA atomics), not
//! with respect to GPU kernels writing the same word.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use rnic_core::memory::{check_atomic, check_range};
use rnic_core::{MemAccess, Memory, MemoryError};
use rnic_dma::{DmaRegion, NodeId, PagePolicy, PageSize};
use tracing::error;

use crate::copy::{CopyEngine, Fence};
use crate::error::GpuError;

/// Sizes of the staging ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StagingConfig {
    /// Bytes per slot (one copy moves at most this much).
    pub slot_len: usize,
    /// Slots in the ring (copies in flight at once).
    pub slots: usize,
    /// NUMA node of the staging pages (the GPU's node by default).
    pub node: Option<NodeId>,
}

impl Default for StagingConfig {
    /// 4 slots of 512 KiB: one 2 MiB hugepage.
    fn default() -> StagingConfig {
        StagingConfig {
            slot_len: 512 << 10,
            slots: 4,
            node: None,
        }
    }
}

/// Device memory of engine `E` behind a staging ring; see the module docs.
pub struct StagedMemory<E: CopyEngine> {
    // Field order is drop order: device buffer → staging registration →
    // engine (the context), as the module docs promise.
    buffer: DeviceBuffer<E>,
    ring: Mutex<Ring<E>>,
    engine: Arc<E>,
    len: usize,
    addr: u64,
}

/// A device allocation that waits for the engine's queue and frees itself
/// on drop.
struct DeviceBuffer<E: CopyEngine> {
    alloc: Option<E::Alloc>,
    engine: Arc<E>,
}

impl<E: CopyEngine> Drop for DeviceBuffer<E> {
    fn drop(&mut self) {
        let Some(a) = self.alloc.take() else { return };
        if let Err(e) = self.engine.wait_all() {
            error!(%e, "copy queue failed before freeing a device buffer: leaking it");
            std::mem::forget(a);
            return;
        }
        if let Err(e) = self.engine.free(a) {
            error!(%e, "freeing a device buffer failed");
        }
    }
}

/// A host buffer registered with an engine; unregistered on drop, before
/// its pages go.
pub struct Registered<E: CopyEngine> {
    region: Arc<DmaRegion>,
    engine: Arc<E>,
}

impl<E: CopyEngine> Registered<E> {
    /// Register `region` with `engine` (CUDA: `cuMemHostRegister`).
    pub fn new(engine: &Arc<E>, region: Arc<DmaRegion>) -> Result<Registered<E>, GpuError> {
        engine.register_host(&region)?;
        Ok(Registered {
            region,
            engine: engine.clone(),
        })
    }

    /// The registered buffer.
    pub fn region(&self) -> &Arc<DmaRegion> {
        &self.region
    }
}

impl<E: CopyEngine> fmt::Debug for Registered<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registered")
            .field("len", &self.region.len())
            .finish()
    }
}

impl<E: CopyEngine> Drop for Registered<E> {
    fn drop(&mut self) {
        if let Err(e) = self.engine.unregister_host(&self.region) {
            // The pages must outlive any copy that may still touch them.
            error!(%e, "unregistering a staging buffer failed: leaking its pages");
            std::mem::forget(self.region.clone());
        }
    }
}

struct Ring<E: CopyEngine> {
    staging: Registered<E>,
    slot_len: usize,
    /// The fence of the copy that last used each slot, until waited for.
    busy: Vec<Option<Fence>>,
    next: usize,
}

impl<E: CopyEngine> Ring<E> {
    /// The next slot, free (its last copy waited for).
    fn take(&mut self, engine: &E) -> Result<usize, GpuError> {
        let slot = self.next;
        self.next = (self.next + 1) % self.busy.len();
        if let Some(f) = self.busy[slot].take() {
            engine.wait(f)?;
        }
        Ok(slot)
    }

    fn settle(&mut self, engine: &E, last: Option<Fence>) -> Result<(), GpuError> {
        if let Some(f) = last {
            engine.wait(f)?;
            // In-order queue: everything before `f` is done too.
            self.busy.iter_mut().for_each(|b| *b = None);
        }
        Ok(())
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The ring's state is consistent between calls; a panic mid-call leaves
    // at worst a slot marked busy, which the next use waits for.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn mem_err(access: MemAccess, offset: usize, len: usize, region_len: usize) -> MemoryError {
    MemoryError::OutOfRange {
        access,
        offset,
        len,
        region_len,
    }
}

impl<E: CopyEngine> StagedMemory<E> {
    /// `len` bytes of device memory from `engine`, staged through a ring
    /// shaped by `config` (hugepage-backed, page-locked, registered with the
    /// engine, on `config.node`).
    pub fn new(
        engine: &Arc<E>,
        len: usize,
        config: StagingConfig,
    ) -> Result<StagedMemory<E>, GpuError> {
        if len == 0 || config.slot_len == 0 || config.slots == 0 {
            return Err(GpuError::Unsupported {
                what: "an empty device buffer or staging ring",
                why: "give the buffer, the slot length and the slot count at least 1".into(),
            });
        }
        let alloc = engine.alloc(len)?;
        let buffer = DeviceBuffer {
            alloc: Some(alloc),
            engine: engine.clone(),
        };
        let ring_len =
            config
                .slot_len
                .checked_mul(config.slots)
                .ok_or_else(|| GpuError::Unsupported {
                    what: "a staging ring that large",
                    why: "slot_len × slots overflows".into(),
                })?;
        let mut b = DmaRegion::builder(ring_len).pages(PagePolicy::Prefer(PageSize::Huge2M));
        if let Some(n) = config.node {
            b = b.node(n);
        }
        let staging = Registered::new(engine, b.build()?)?;
        let addr =
            engine.device_addr(buffer.alloc.as_ref().ok_or_else(|| GpuError::Unsupported {
                what: "a device buffer",
                why: "allocation vanished".into(),
            })?);
        Ok(StagedMemory {
            buffer,
            ring: Mutex::new(Ring {
                staging,
                slot_len: config.slot_len,
                busy: vec![None; config.slots],
                next: 0,
            }),
            engine: engine.clone(),
            len,
            addr,
        })
    }

    /// The engine (device context) behind the memory.
    pub fn engine(&self) -> &Arc<E> {
        &self.engine
    }

    /// The device allocation (for device-side users: kernels, checks).
    pub fn device_alloc(&self) -> &E::Alloc {
        // Set from construction until drop.
        match &self.buffer.alloc {
            Some(a) => a,
            None => unreachable!("a StagedMemory's allocation lives until it drops"),
        }
    }

    /// The staging ring's bytes (slot length × slots).
    pub fn staging_len(&self) -> usize {
        lock(&self.ring).staging.region().len()
    }

    /// The staging buffer (its placement and page size are in its stats).
    pub fn staging(&self) -> Arc<DmaRegion> {
        lock(&self.ring).staging.region().clone()
    }

    fn write_locked(&self, r: &mut Ring<E>, offset: usize, src: &[u8]) -> Result<(), GpuError> {
        let alloc = self.device_alloc();
        let mut last = None;
        for (i, chunk) in src.chunks(r.slot_len).enumerate() {
            let slot = r.take(&self.engine)?;
            let soff = slot * r.slot_len;
            r.staging.region().write(soff, chunk)?;
            // SAFETY: the slot is this call's until its fence is waited for
            // (the ring hands a slot out only after its last fence, and the
            // lock is held); both ranges were checked against their buffers.
            let f = unsafe {
                self.engine.to_device(
                    alloc,
                    offset + i * r.slot_len,
                    r.staging.region(),
                    soff,
                    chunk.len(),
                )
            }?;
            r.busy[slot] = Some(f);
            last = Some(f);
        }
        r.settle(&self.engine, last)
    }

    fn read_locked(&self, r: &mut Ring<E>, offset: usize, dst: &mut [u8]) -> Result<(), GpuError> {
        let alloc = self.device_alloc();
        let slot_len = r.slot_len;
        let nslots = r.busy.len();
        let total = dst.len();
        let chunks = total.div_ceil(slot_len);
        // Queue up to one chunk per slot ahead, then drain in order.
        let mut queued: std::collections::VecDeque<(usize, usize, Fence)> = Default::default();
        let mut next_chunk = 0;
        let mut out = dst.chunks_mut(slot_len);
        while next_chunk < chunks || !queued.is_empty() {
            while next_chunk < chunks && queued.len() < nslots {
                let slot = r.take(&self.engine)?;
                let pos = next_chunk * slot_len;
                let len = slot_len.min(total - pos);
                // SAFETY: as in write_locked: the slot is exclusively this
                // call's until its fence; ranges checked.
                let f = unsafe {
                    self.engine.to_host(
                        r.staging.region(),
                        slot * slot_len,
                        alloc,
                        offset + pos,
                        len,
                    )
                }?;
                r.busy[slot] = Some(f);
                queued.push_back((slot, len, f));
                next_chunk += 1;
            }
            if let Some((slot, len, f)) = queued.pop_front() {
                self.engine.wait(f)?;
                r.busy[slot] = None;
                let d = out.next().ok_or(GpuError::Memory(mem_err(
                    MemAccess::Read,
                    offset,
                    total,
                    self.len,
                )))?;
                r.staging.region().read(slot * slot_len, &mut d[..len])?;
            }
        }
        Ok(())
    }
}

impl<E: CopyEngine> StagedMemory<E> {
    /// A read-modify-write of the aligned device word at `offset` under the
    /// ring's lock: `f` maps the old value to the new one (`None`: leave
    /// it); returns the old value.
    fn rmw(&self, offset: usize, f: impl FnOnce(u64) -> Option<u64>) -> Result<u64, MemoryError> {
        check_atomic(offset, self.len)?;
        let err = |e| to_mem(MemAccess::Atomic, offset, 8, self.len, e);
        let mut r = lock(&self.ring);
        let mut old = [0u8; 8];
        self.read_locked(&mut r, offset, &mut old).map_err(err)?;
        let old = u64::from_ne_bytes(old);
        if let Some(new) = f(old) {
            self.write_locked(&mut r, offset, &new.to_ne_bytes())
                .map_err(err)?;
        }
        Ok(old)
    }
}

impl<E: CopyEngine> fmt::Debug for StagedMemory<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StagedMemory")
            .field("engine", &self.engine.describe())
            .field("len", &self.len)
            .field("addr", &format_args!("{:#x}", self.addr))
            .finish()
    }
}

fn to_mem(
    access: MemAccess,
    offset: usize,
    len: usize,
    region_len: usize,
    e: GpuError,
) -> MemoryError {
    match e {
        GpuError::Memory(m) => m,
        other => {
            // The Memory trait has no variant for a failed device copy; the
            // transport turns this into a remote access error, and the cause
            // is logged here.
            error!(%other, %access, offset, len, "staged device access failed");
            mem_err(access, offset, len, region_len)
        }
    }
}

impl<E: CopyEngine> Memory for StagedMemory<E> {
    fn len(&self) -> usize {
        self.len
    }

    /// The device address of byte 0 (what a peer puts in a RETH).
    fn addr(&self) -> u64 {
        self.addr
    }

    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), MemoryError> {
        check_range(MemAccess::Read, offset, dst.len(), self.len)?;
        if dst.is_empty() {
            return Ok(());
        }
        let len = dst.len();
        let mut r = lock(&self.ring);
        self.read_locked(&mut r, offset, dst)
            .map_err(|e| to_mem(MemAccess::Read, offset, len, self.len, e))
    }

    fn write(&self, offset: usize, src: &[u8]) -> Result<(), MemoryError> {
        check_range(MemAccess::Write, offset, src.len(), self.len)?;
        if src.is_empty() {
            return Ok(());
        }
        let mut r = lock(&self.ring);
        self.write_locked(&mut r, offset, src)
            .map_err(|e| to_mem(MemAccess::Write, offset, src.len(), self.len, e))
    }

    fn compare_swap_u64(&self, offset: usize, compare: u64, swap: u64) -> Result<u64, MemoryError> {
        self.rmw(offset, |old| (old == compare).then_some(swap))
    }

    fn fetch_add_u64(&self, offset: usize, add: u64) -> Result<u64, MemoryError> {
        self.rmw(offset, |old| Some(old.wrapping_add(add)))
    }
}
