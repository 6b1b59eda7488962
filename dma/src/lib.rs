//! rnic-dma: memory that a device (an mlx5 function through VFIO, or the
//! software RoCE backend) may read and write behind the CPU's back.
//!
//! # What it owns
//!
//! - **Allocation** ([`page`]): 1 GiB hugetlb → 2 MiB hugetlb → transparent
//!   hugepages → base pages, per [`PagePolicy`]; the size obtained and every
//!   skipped step are recorded. A [`PagePolicy::Require`] that cannot be met
//!   fails with the exact `echo N > .../nr_hugepages` that fixes it.
//! - **NUMA placement** ([`numa`]): `mbind(MPOL_BIND)` before the first
//!   fault, fault-in of every page, then `move_pages` on every page to
//!   *verify*; the [`PlacementReport`] is part of the region.
//! - **Pinning**: `mlock` after an up-front `RLIMIT_MEMLOCK` check whose
//!   error says how to raise the limit.
//! - **IOVA allocation** ([`iova`]): aligned ranges inside the IOMMU apertures,
//!   MSI window excluded, coalescing free.
//! - **[`DmaRegion`]**: all of the above plus the device mapping through a
//!   [`Mapper`] (rnic-vfio implements it; [`IdentityMapper`] for the software
//!   backend), as one RAII object handed out as `Arc<DmaRegion>`; it
//!   implements rnic-core's [`Memory`], so providers can register it.
//! - **Bulk copies** ([`copy`]) into and out of shared memory at `memcpy`
//!   speed (`rep movsb` over raw pointers), and **[`OwnedBuffer`]**: an
//!   application's own allocation (a `Vec<u8>`, a tensor's) registered as it
//!   is and filled or read in place.
//! - **CRC-32 in place** ([`crc`]): the RoCEv2 ICRC's CRC read straight out
//!   of registered memory (loads in inline assembly, folded with
//!   VPCLMULQDQ/PCLMULQDQ), so a sender CRCs a payload it sends in place
//!   without copying it first.
//! - **[`Mmio`]** for device registers and the named [`barrier`]s.
//! - **Peer BARs** ([`PeerRegion`]): a window of another PCI device's BAR
//!   (a GPU's, an ivshmem's) mapped into a domain, unmapped from the device
//!   before the BAR mapping can go (ownership, not comments).
//! - **The memory-key table** ([`KeyTable`]): L_Key/R_Key → region, PD,
//!   access, range; O(1), allocation-free lookups with typed refusals.
//! - **Observability**: [`RegionStats`] per region and [`registry::snapshot`].
//!
//! # Invariants
//!
//! - Construction is mmap → mbind → fault-in → mlock → verify → IOVA → map;
//!   `Drop` is unmap → IOVA free → munlock → munmap, and a failed step undoes
//!   the earlier ones in the same reverse order. If the device unmap fails,
//!   the memory is leaked rather than freed under a live device mapping.
//! - A region that is registered (key table) or mapped (by its own domain)
//!   cannot be dropped: the table holds an `Arc`, and the mapping is torn
//!   down only by the region's `Drop`.
//! - No `&[u8]`/`&mut [u8]` made by the library ever points into a region,
//!   a buffer or a BAR; region bytes are copied by `rep movsb` over raw
//!   pointers ([`copy`]) and reached by atomics, device registers through
//!   volatile loads and stores ([`Mmio`]). The application may take slices
//!   under the documented in-place contract (`unsafe`, [`buffer`]).
//! - A key lookup succeeds only for a live key with its current key byte, the
//!   right PD, the granted access and a range inside the registration.
//! - All system calls are in one module (`sys`), replaced by a scripted fake
//!   in unit tests; `dma/tests/` runs against the real kernel.
//!
//! `docs/invariants.md` lists the test that guards each invariant.
//!
//! # Example
//!
//! ```no_run
//! use rnic_dma::{AccessFlags, DmaRegion, KeyTable, Memory, NodeId, PagePolicy, PageSize, PdHandle};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let region = DmaRegion::builder(64 << 20)
//!     .pages(PagePolicy::Prefer(PageSize::Huge2M))
//!     .node(NodeId(0))
//!     .build()?;
//! println!("got {} pages, {:.0}% on node 0", region.page_size(), 100.0 * region.placement().fraction_on_wanted());
//!
//! let mut keys = KeyTable::new();
//! let mr = keys.register(region.clone(), 0, 4096, PdHandle(1), AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
//! // The responder, for an incoming RDMA WRITE of 16 bytes at mr.start:
//! let (target, offset) = keys.lookup(mr.rkey, PdHandle(1), mr.start, 16, AccessFlags::REMOTE_WRITE)?;
//! target.write(offset as usize, &[0xAB; 16])?;
//! # Ok(())
//! # }
//! ```
//!
//! (`memmap2` was considered for the mappings; it cannot express
//! `MAP_HUGE_1GB`, aligned THP mappings or the fake the tests need, so the
//! crate calls `mmap` through `nix` in `sys`.)
#![deny(unsafe_op_in_unsafe_fn)]
// Tests may unwrap: a panic is the failure report.
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod barrier;
pub mod buffer;
pub mod copy;
pub mod crc;
mod error;
pub mod iova;
pub mod keys;
pub mod mapper;
pub mod mmio;
pub mod numa;
pub mod page;
pub mod peer;
mod pin;
pub mod region;
pub mod registry;

#[cfg(not(test))]
mod sys;
#[cfg(test)]
#[path = "sys_fake.rs"]
mod sys;

pub use buffer::OwnedBuffer;
pub use error::{DmaError, KeyError};
pub use iova::IovaAllocator;
pub use keys::{KeyTable, MrKeys};
pub use mapper::{DmaDomain, IdentityMapper, Mapper, MapperCall, RecordingMapper};
pub use mmio::Mmio;
pub use numa::{NodeId, OnMismatch, Placement, PlacementReport};
pub use page::{PagePolicy, PageSize};
pub use peer::PeerRegion;
pub use region::{DmaRegion, DmaRegionBuilder};
pub use registry::RegionStats;
pub use rnic_core::{AccessFlags, Iova, Lkey, Memory, PdHandle, Rkey};
