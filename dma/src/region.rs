//! [`DmaRegion`]: host memory a device may access, owned from mmap to munmap.
//!
//! Construction order: mmap (page-size chain) → mbind → fault in → mlock →
//! verify placement → IOVA allocation → device map. `Drop` undoes exactly
//! that in reverse: device unmap → IOVA free → munlock → munmap. A failure
//! half-way undoes the steps already done, in the same reverse order, because
//! construction and teardown share one owner (the private `Resources`).
//!
//! # Lifetime: "a region still registered or mapped cannot be dropped"
//!
//! Regions are handed out as `Arc<DmaRegion>` only. Every holder of a
//! reference the device or a peer may use holds a clone: the memory-key
//! table's entries ([`crate::keys::KeyTable`]), and (by contract for drivers)
//! each MR and each posted work request. The device mapping itself is owned by
//! the region and removed only in its `Drop`. So the teardown above runs
//! exactly when the last key was invalidated and the last work request
//! retired — enforced by reference counting, not by comments. If the device
//! unmap fails in `Drop`, the pages, the lock and the IOVA are deliberately
//! leaked so the device can never write into memory that was reused.
//!
//! # Access
//!
//! No `&[u8]`/`&mut [u8]` into the region is ever created by the library:
//! Rust would assume bytes behind them stable or unshared, and DMA breaks
//! both. [`Memory::read`] and [`Memory::write`] are bulk copies over raw
//! pointers ([`crate::copy`]: `rep movsb`, each byte one indivisible
//! access, so concurrent calls from any thread are race-free and never
//! touch a byte outside their range); the two RDMA atomics are `fetch_add`
//! and `compare_exchange` on the aligned word ([`AtomicU64::from_ptr`]; an
//! `&AtomicU64` assumes nothing about its value). [`Memory::direct`] offers
//! the bytes to a software transport's system calls. All accesses are
//! bounds-checked with typed errors. Bytes the device writes while they are
//! being read are unspecified, as with ibverbs. The application fills or
//! reads a region in place through [`DmaRegion::as_ptr`], or as a slice
//! under the contract of [`DmaRegion::bytes`] / [`DmaRegion::bytes_mut`]
//! (the same as `OwnedBuffer`'s, `crate::buffer`).

use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

use rnic_core::memory::{DirectSpan, check_atomic};
use rnic_core::{Iova, Memory, MemoryError};
use tracing::{error, info_span};

use crate::error::DmaError;
use crate::mapper::DmaDomain;
use crate::numa::{self, NodeId, OnMismatch, Placement, PlacementReport};
use crate::page::{self, HostPages, PagePolicy, PageSize};
use crate::pin;
use crate::registry::{self, RegionStats};
use crate::sys;

/// Everything a region acquired; `Drop` releases what is set, in reverse
/// order of acquisition.
#[derive(Debug)]
struct Resources {
    domain: Arc<DmaDomain>,
    host: Option<HostPages>,
    locked: bool,
    /// IOVA taken from the domain's allocator (`None` for identity domains).
    allocated_iova: Option<Iova>,
    /// IOVA at which the mapper mapped the pages.
    device_mapped: Option<Iova>,
}

impl Drop for Resources {
    fn drop(&mut self) {
        let Some(host) = self.host.take() else { return };
        let len = host.len as u64;
        if let Some(iova) = self.device_mapped.take()
            && let Err(e) = self.domain.mapper().unmap(iova, len)
        {
            error!(
                %iova, len, %e,
                "device unmap of a DMA region failed: leaking its pages, pin and IOVA so the device \
                 cannot write into reused memory"
            );
            std::mem::forget(host);
            return;
        }
        if let Some(iova) = self.allocated_iova.take()
            && let Err(e) = self.domain.free_iova(iova)
        {
            error!(%iova, %e, "IOVA free failed");
        }
        if self.locked
            && let Err(e) = sys::munlock(host.addr, host.len)
        {
            error!(addr = host.addr.as_ptr() as usize, len = host.len, %e, "munlock failed");
        }
        // HostPages::drop unmaps.
        drop(host);
    }
}

/// Host memory prepared for device access; see the module docs.
#[derive(Debug)]
pub struct DmaRegion {
    res: Resources,
    /// Base of the mapping (copied out of `res.host` for the access paths).
    base: NonNull<u8>,
    /// Accessible bytes (the requested length).
    len: usize,
    iova: Iova,
    stats: Arc<RegionStats>,
}

// SAFETY: `base` points into the mapping `res.host` owns (HostPages is Send);
// the mapping is not tied to a thread, and dropping (unmapping) it from any
// thread is fine.
unsafe impl Send for DmaRegion {}
// SAFETY: `&DmaRegion` only reaches the bytes through atomics and
// raw-pointer copies that are indivisible per byte (`crate::copy`), so
// concurrent calls from many threads are race-free, and hands out the base as
// a raw pointer and slices under an unsafe contract, whose use is the
// caller's business.
unsafe impl Sync for DmaRegion {}

/// Configures and builds a [`DmaRegion`]; from [`DmaRegion::builder`].
#[derive(Debug, Clone)]
pub struct DmaRegionBuilder {
    len: usize,
    pages: PagePolicy,
    placement: Placement,
    pin: bool,
    domain: Option<Arc<DmaDomain>>,
}

impl DmaRegionBuilder {
    /// Page-size policy (default `Prefer(Huge2M)`).
    pub fn pages(mut self, policy: PagePolicy) -> Self {
        self.pages = policy;
        self
    }

    /// Place the pages on `node` (bound with `mbind(MPOL_BIND)`, verified).
    pub fn node(mut self, node: NodeId) -> Self {
        self.placement.node = Some(node);
        self
    }

    /// Place the pages on the NUMA node of a PCI device (`0000:3b:00.0`); no
    /// preference when sysfs reports `-1`.
    pub fn near_pci_device(mut self, bdf: &str) -> Result<Self, DmaError> {
        self.placement.node = numa::node_of_pci_device(bdf)?;
        Ok(self)
    }

    /// What a placement mismatch means (default [`OnMismatch::Fail`]).
    pub fn on_mismatch(mut self, on_mismatch: OnMismatch) -> Self {
        self.placement.on_mismatch = on_mismatch;
        self
    }

    /// Whether to `mlock` the pages (default `true`).
    pub fn pin(mut self, pin: bool) -> Self {
        self.pin = pin;
        self
    }

    /// The device address space to map into (default [`DmaDomain::identity`]).
    pub fn domain(mut self, domain: Arc<DmaDomain>) -> Self {
        self.domain = Some(domain);
        self
    }

    /// Allocate, place, pin, verify, allocate an IOVA and map.
    pub fn build(self) -> Result<Arc<DmaRegion>, DmaError> {
        let wanted = self.placement.node;
        let _span =
            info_span!("dma_region", len = self.len, node = ?wanted, pages = ?self.pages).entered();
        if self.pin {
            // A lower bound of what will be pinned: fail before allocating.
            pin::check_memlock(self.len.next_multiple_of(sys::base_page_size()) as u64)?;
        }
        let domain = self.domain.unwrap_or_else(DmaDomain::identity);
        let (host, fallbacks) = page::allocate(self.len, self.pages, wanted)?;
        let (base, mapped, size) = (host.addr, host.len, host.size);
        let mut res = Resources {
            domain,
            host: Some(host),
            locked: false,
            allocated_iova: None,
            device_mapped: None,
        };

        if self.pin {
            pin::check_memlock(mapped as u64)?;
            pin::lock(base, mapped)?;
            res.locked = true;
        }
        let report = numa::verify(base, mapped, size.verify_granularity(), wanted)?;
        numa::judge(&report, self.placement.on_mismatch)?;

        let iova = match res.domain.alloc_iova(mapped as u64, size.bytes() as u64)? {
            Some(iova) => {
                res.allocated_iova = Some(iova);
                iova
            }
            None => Iova(base.as_ptr() as u64),
        };
        // SAFETY: [base, base + mapped) is owned by `res.host` and stays
        // mapped until `res` is dropped, whose first step is `unmap(iova,
        // mapped)`; the pages are freed only after that returned Ok.
        unsafe { res.domain.mapper().map(iova, base, mapped as u64) }.map_err(|source| {
            DmaError::DeviceMap {
                iova,
                host: base.as_ptr() as usize,
                len: mapped as u64,
                source,
            }
        })?;
        res.device_mapped = Some(iova);

        let stats = Arc::new(RegionStats {
            id: next_id(),
            bytes: self.len,
            mapped_bytes: mapped,
            page_size: size,
            fallbacks,
            node_wanted: wanted,
            node_verified: report.dominant_node(),
            verified_fraction: report.fraction_on_wanted(),
            placement: report,
            pinned: res.locked,
            iova,
            device_mapped: !res.domain.is_identity(),
        });
        registry::register(&stats);
        Ok(Arc::new(DmaRegion {
            res,
            base,
            len: self.len,
            iova,
            stats,
        }))
    }
}

fn next_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

impl DmaRegion {
    /// Start building a region of `len` bytes.
    pub fn builder(len: usize) -> DmaRegionBuilder {
        DmaRegionBuilder {
            len,
            pages: PagePolicy::default(),
            placement: Placement::default(),
            pin: true,
            domain: None,
        }
    }

    /// Accessible length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always `false`: regions have at least one byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device address of byte 0 (the virtual address in an identity
    /// domain). [`Memory::iova`] reports it only for IOMMU-mapped regions.
    pub fn iova(&self) -> Iova {
        self.iova
    }

    /// The host virtual address of byte 0 (raw: create no references from it).
    pub fn as_ptr(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    /// The page size obtained.
    pub fn page_size(&self) -> PageSize {
        self.stats.page_size
    }

    /// The placement verification result.
    pub fn placement(&self) -> &PlacementReport {
        &self.stats.placement
    }

    /// Everything recorded about the region.
    pub fn stats(&self) -> &RegionStats {
        &self.stats
    }

    /// The domain the region is mapped into.
    pub fn domain(&self) -> &Arc<DmaDomain> {
        &self.res.domain
    }

    /// The atomic word holding byte `pos`.
    ///
    /// The RDMA atomics operate on it; concurrent callers (the safe API
    /// allows any thread at any time) never race in the Rust memory model,
    /// and the compiler can neither assume the word is stable nor invent
    /// accesses, which is what volatile would buy for device-written memory.
    ///
    /// Callers must have checked `pos < self.len` (with `check_range` /
    /// `check_atomic`).
    fn word(&self, pos: usize) -> &AtomicU64 {
        debug_assert!(pos < self.len);
        let ptr = self.base.as_ptr().wrapping_add(pos & !7).cast::<u64>();
        // SAFETY: callers checked pos < self.len; the mapping is
        // `mapped_bytes` long, a multiple of the page size and so of 8, so the
        // whole word lies inside it. The base is page-aligned, so the word is
        // 8-aligned. The mapping lives as long as `self`, which bounds the
        // reference; the only references into the region are these
        // `&AtomicU64`s, which assume nothing about the value.
        unsafe { AtomicU64::from_ptr(ptr) }
    }

    /// The region's bytes as atomics, for the bulk copies ([`crate::copy`])
    /// and [`Memory::direct`].
    fn atomics(&self) -> &[AtomicU8] {
        // SAFETY: the mapping starts at `base` and is at least `len` bytes
        // long; it lives as long as `self`, which bounds the slice.
        // `AtomicU8` has `u8`'s size and alignment. As with `word`, the only
        // references into the region are atomics, which assume nothing about
        // the values (the device may change them at any time).
        unsafe { std::slice::from_raw_parts(self.base.as_ptr().cast::<AtomicU8>(), self.len) }
    }

    /// The bytes as a slice, to read results in place.
    ///
    /// # Safety
    ///
    /// While the slice lives nothing writes the region: every operation
    /// (and device DMA) that writes it has completed and none is posted, and
    /// no peer can write it (`crate::buffer`'s contract).
    pub unsafe fn bytes(&self) -> &[u8] {
        // SAFETY: `len` bytes of the live mapping; the caller guarantees
        // nobody writes them while the slice lives.
        unsafe { std::slice::from_raw_parts(self.base.as_ptr(), self.len) }
    }

    /// The bytes as a mutable slice, to fill them in place.
    ///
    /// # Safety
    ///
    /// While the slice lives nothing else reads or writes the region (no
    /// operation or DMA naming it is posted or in flight, no peer can reach
    /// it, no other slice of it exists).
    #[allow(clippy::mut_from_ref)] // the contract above is what `&mut self` would prove
    pub unsafe fn bytes_mut(&self) -> &mut [u8] {
        // SAFETY: as `bytes`, and the caller guarantees exclusivity.
        unsafe { std::slice::from_raw_parts_mut(self.base.as_ptr(), self.len) }
    }
}

/// A region is DMA-capable memory (pinned, with an IOVA once mapped): DMA drivers
/// (`Provider::Domain = IommuDomain`) can register it; `HeapMemory` they
/// cannot. (Every memory is in `HostDomain`.)
impl rnic_core::DeviceMemory<rnic_core::IommuDomain> for DmaRegion {
    fn into_dyn_memory(self: Arc<Self>) -> Arc<dyn Memory> {
        self
    }
}

impl Memory for DmaRegion {
    fn len(&self) -> usize {
        self.len
    }

    fn addr(&self) -> u64 {
        self.base.as_ptr() as u64
    }

    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), MemoryError> {
        crate::copy::read_span(&DirectSpan::from_bytes(self.atomics()), offset, dst)
    }

    fn write(&self, offset: usize, src: &[u8]) -> Result<(), MemoryError> {
        crate::copy::write_span(&DirectSpan::from_bytes(self.atomics()), offset, src)
    }

    fn compare_swap_u64(&self, offset: usize, compare: u64, swap: u64) -> Result<u64, MemoryError> {
        check_atomic(offset, self.len)?;
        let word = self.word(offset);
        Ok(
            match word.compare_exchange(compare, swap, Ordering::AcqRel, Ordering::Acquire) {
                Ok(v) | Err(v) => v,
            },
        )
    }

    fn fetch_add_u64(&self, offset: usize, add: u64) -> Result<u64, MemoryError> {
        check_atomic(offset, self.len)?;
        Ok(self.word(offset).fetch_add(add, Ordering::AcqRel))
    }

    /// The verified node, when every present page is on it.
    fn numa_node(&self) -> Option<u32> {
        match self.stats.placement.by_node.as_slice() {
            [(node, _)] => Some(node.0),
            _ => None,
        }
    }

    /// The IOVA, when the region is mapped through a non-identity mapper.
    fn iova(&self) -> Option<Iova> {
        (!self.res.domain.is_identity()).then_some(self.iova)
    }

    fn direct(&self) -> Option<DirectSpan<'_>> {
        Some(DirectSpan::from_bytes(self.atomics()))
    }
}

#[cfg(test)]
mod tests;
