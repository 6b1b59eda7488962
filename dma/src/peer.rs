//! [`PeerRegion`]: a window of another PCI device's BAR (a GPU's BAR1, or
//! in tests an ivshmem's shared-memory BAR) mapped into a DMA domain, so the
//! device that owns the domain (the NIC) reads and writes the peer directly.
//!
//! The window is the CPU's mapping of the BAR ([`Mmio`]: a VFIO BAR mmap,
//! a gdrcopy mapping, a dma-buf mmap); VFIO type1 `VFIO_IOMMU_MAP_DMA`
//! accepts such `VM_PFNMAP` memory (it resolves the PFNs with
//! `follow_pfnmap`, reference/gpu.md §1a) and points the NIC's IOMMU entries
//! at the peer's BAR.
//!
//! # Teardown order, by ownership
//!
//! Nothing revokes such a mapping when the peer goes away (type1 takes no
//! reference on MMIO), so rnic orders it: a `PeerRegion` holds a clone of
//! the [`Mmio`] — and through its owner the peer's BAR mapping (for VFIO:
//! the BAR mmap and the peer's container) — until it has unmapped itself
//! from the NIC's domain. Dropping the peer's device and BAR handles first
//! changes nothing; the BAR goes only after the region's `Drop` has
//! unmapped it from the NIC (IOTLB flushed) and freed the IOVA. When that
//! unmap fails the BAR mapping is leaked rather than released under a live
//! device mapping. Fields drop in declaration order: the device mapping
//! first, then the BAR.
//!
//! CPU access ([`Memory`]) goes through the `Mmio`'s volatile copies; the
//! two 64-bit atomics are a volatile read-modify-write under a lock, atomic
//! with respect to CPU users of this region only (a BAR has no CPU atomics
//! the peer honours).

use std::sync::{Arc, Mutex, PoisonError};

use rnic_core::memory::{check_atomic, check_range};
use rnic_core::{Iova, MemAccess, Memory, MemoryError};
use tracing::{error, info_span};

use crate::error::DmaError;
use crate::mapper::DmaDomain;
use crate::mmio::Mmio;
use crate::sys;

/// The device-side half of a [`PeerRegion`]: unmaps and frees its IOVA on
/// drop, before the BAR half goes.
#[derive(Debug)]
struct Mapping {
    domain: Arc<DmaDomain>,
    iova: Iova,
    len: u64,
    /// IOVA taken from the domain's allocator (not for identity domains).
    allocated: bool,
    /// Set when the unmap failed: the BAR must then outlive this process.
    keep_bar: Option<Mmio>,
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if let Err(e) = self.domain.mapper().unmap(self.iova, self.len) {
            error!(
                iova = %self.iova, len = self.len, %e,
                "unmapping a peer BAR from the device failed: keeping the BAR mapped and the IOVA \
                 allocated so the device never reaches a released BAR"
            );
            std::mem::forget(self.keep_bar.take());
            return;
        }
        if self.allocated
            && let Err(e) = self.domain.free_iova(self.iova)
        {
            error!(iova = %self.iova, %e, "IOVA free failed");
        }
    }
}

/// A peer BAR window mapped into a DMA domain; see the module docs.
#[derive(Debug)]
pub struct PeerRegion {
    // Declaration order is drop order: unmap from the device, then release
    // the BAR.
    mapping: Mapping,
    bar: Mmio,
    len: usize,
    rmw: Mutex<()>,
}

impl PeerRegion {
    /// Map `len` bytes at `offset` of `bar` into `domain`. Offset and length
    /// must be multiples of the base page size (the IOMMU maps pages).
    pub fn map(
        bar: &Mmio,
        offset: usize,
        len: usize,
        domain: &Arc<DmaDomain>,
    ) -> Result<Arc<PeerRegion>, DmaError> {
        let _span = info_span!("peer_region", offset, len).entered();
        let page = sys::base_page_size();
        let bad = |reason: String| DmaError::PeerWindow {
            offset: offset as u64,
            len: len as u64,
            bar_len: bar.len() as u64,
            reason,
        };
        if len == 0 || !offset.is_multiple_of(page) || !len.is_multiple_of(page) {
            return Err(bad(format!(
                "offset and length must be non-zero multiples of the {page}-byte page: round the \
                 window to pages"
            )));
        }
        let window = bar
            .window(offset, len)
            .map_err(|_| bad("the window reaches past the end of the BAR".into()))?;
        let host = std::ptr::NonNull::new(window.as_ptr())
            .ok_or_else(|| bad("the BAR mapping has a null base".into()))?;
        let allocated = domain.alloc_iova(len as u64, page as u64)?;
        let iova = allocated.unwrap_or(Iova(host.as_ptr() as u64));
        // SAFETY: `window` (a clone of the BAR's Mmio, holding its owner and
        // so the mapping) is kept in the region until after `unmap` returned
        // Ok (Mapping drops first; on a failed unmap the Mmio is leaked).
        // Nothing takes a reference into BAR memory.
        if let Err(source) = unsafe { domain.mapper().map(iova, host, len as u64) } {
            if allocated.is_some() {
                let _ = domain.free_iova(iova);
            }
            return Err(DmaError::DeviceMap {
                iova,
                host: host.as_ptr() as usize,
                len: len as u64,
                source,
            });
        }
        Ok(Arc::new(PeerRegion {
            mapping: Mapping {
                domain: domain.clone(),
                iova,
                len: len as u64,
                allocated: allocated.is_some(),
                keep_bar: Some(window.clone()),
            },
            bar: window,
            len,
            rmw: Mutex::new(()),
        }))
    }

    /// The device address of byte 0.
    pub fn iova(&self) -> Iova {
        self.mapping.iova
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never: windows have at least one page.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The domain the window is mapped into.
    pub fn domain(&self) -> &Arc<DmaDomain> {
        &self.mapping.domain
    }

    /// The CPU's mapping of the window.
    pub fn bar(&self) -> &Mmio {
        &self.bar
    }
}

impl PeerRegion {
    /// A read-modify-write of the aligned word at `offset` under the lock:
    /// `f` maps the old value to the new one (`None`: leave it); returns the
    /// old value.
    fn rmw(&self, offset: usize, f: impl FnOnce(u64) -> Option<u64>) -> Result<u64, MemoryError> {
        check_atomic(offset, self.len)?;
        let err = |_| oob(MemAccess::Atomic, offset, 8, self.len);
        let _one = self.rmw.lock().unwrap_or_else(PoisonError::into_inner);
        let old = self.bar.read64(offset).map_err(err)?;
        if let Some(new) = f(old) {
            self.bar.write64(offset, new).map_err(err)?;
        }
        Ok(old)
    }
}

fn oob(access: MemAccess, offset: usize, len: usize, region_len: usize) -> MemoryError {
    MemoryError::OutOfRange {
        access,
        offset,
        len,
        region_len,
    }
}

/// A peer window is in the IOMMU domain (it has an IOVA): DMA drivers can
/// register it.
impl rnic_core::DeviceMemory<rnic_core::IommuDomain> for PeerRegion {
    fn into_dyn_memory(self: Arc<Self>) -> Arc<dyn Memory> {
        self
    }
}

impl Memory for PeerRegion {
    fn len(&self) -> usize {
        self.len
    }

    /// The CPU address of byte 0 of the window.
    fn addr(&self) -> u64 {
        self.bar.as_ptr() as u64
    }

    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), MemoryError> {
        check_range(MemAccess::Read, offset, dst.len(), self.len)?;
        self.bar
            .read_bytes(offset, dst)
            .map_err(|_| oob(MemAccess::Read, offset, dst.len(), self.len))
    }

    fn write(&self, offset: usize, src: &[u8]) -> Result<(), MemoryError> {
        check_range(MemAccess::Write, offset, src.len(), self.len)?;
        self.bar
            .write_bytes(offset, src)
            .map_err(|_| oob(MemAccess::Write, offset, src.len(), self.len))
    }

    fn compare_swap_u64(&self, offset: usize, compare: u64, swap: u64) -> Result<u64, MemoryError> {
        self.rmw(offset, |old| (old == compare).then_some(swap))
    }

    fn fetch_add_u64(&self, offset: usize, add: u64) -> Result<u64, MemoryError> {
        self.rmw(offset, |old| Some(old.wrapping_add(add)))
    }

    /// The IOVA, when mapped through a non-identity mapper.
    fn iova(&self) -> Option<Iova> {
        (!self.mapping.domain.is_identity()).then_some(self.mapping.iova)
    }
}

#[cfg(test)]
mod tests;
