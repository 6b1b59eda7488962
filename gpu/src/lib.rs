//! rnic-gpu: GPU memory for rnic, through cudarc with the driver loaded at
//! run time, so the crate builds and its tests run on machines without CUDA.
//!
//! # What it owns
//!
//! - **The driver probe** ([`driver()`]): whether `libcuda` is there, which
//!   version, whether every function rnic calls exists — checked before any
//!   cudarc call (cudarc panics on a missing library or symbol). Without a
//!   driver every entry point returns [`GpuError::NoDriver`], whose message
//!   says how to install one.
//! - **GPUs** ([`Gpu`]): the primary context of an ordinal, shared per
//!   process; its PCI address, NUMA node, GPUDirect RDMA and dma-buf support.
//! - **VRAM** ([`VramBuffer`]): `cuMemAlloc_v2` memory (not a stream-ordered
//!   pool), `SYNC_MEMOPS` set, GPUDirect capability read back, exportable as
//!   a dma-buf.
//! - **Copies** ([`CopyEngine`]): one in-order queue per engine with fences;
//!   [`CudaEngine`] (a stream, events as fences) and [`HostEngine`] (host
//!   memory standing in for VRAM, for tests without a GPU).
//! - **VRAM as a registrable region** ([`StagedMemory`]): rnic-core's
//!   `Memory` over device memory, staged through a hugepage `DmaRegion`
//!   ring registered with the engine (`cuMemHostRegister`) on the GPU's NUMA
//!   node; a write returns after its bytes are in VRAM, a read returns what
//!   VRAM holds, so `pd.reg_mr(vram, ..)` on rnic-rxe keeps RDMA's ordering.
//! - **Copy tiers** ([`tiers`]): pageable, pinned and hugepage-registered
//!   host↔device copies, 4 KiB … 1 GiB, and CPU access to a BAR mapping.
//! - **Topology** ([`topo`], feature `topology`, on hwloc): nearest NUMA
//!   node and CPUs of a NIC or GPU by PCI address, the NCCL-style relation
//!   between them, NUMA distances, the NIC chosen for each GPU.
//!
//! Peer BARs in a NIC's IOMMU domain are rnic-dma's `PeerRegion` (built
//! from rnic-vfio's BAR mappings); docs/gpu.md covers the routes.
//!
//! # Invariants
//!
//! - No cudarc function runs before [`driver()`] succeeded.
//! - Teardown is buffer → staging registration → context, by field order
//!   and `Arc` ownership ([`StagedMemory`]'s docs); a staging buffer is
//!   unregistered only after every queued copy touching it finished, and
//!   its pages go only after that.
//! - No `&`/`&mut` points into a staging buffer: it is a `DmaRegion`,
//!   reached through its copying `Memory` methods and, by the engine, raw
//!   pointers handed to the driver.
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//! use rnic_core::Memory;
//! use rnic_gpu::{GpuError, HostEngine, StagedMemory, StagingConfig};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Without a GPU, every CUDA entry point says so, with the fix.
//! if let Err(e @ GpuError::NoDriver { .. }) = rnic_gpu::Gpu::open(0) {
//!     println!("{e}");
//! }
//! // The staging logic runs on the host engine everywhere.
//! let engine = HostEngine::new();
//! let vram = StagedMemory::new(&engine, 1 << 20, StagingConfig::default())?;
//! vram.write(4096, b"kv block")?;
//! let mut back = [0u8; 8];
//! vram.read(4096, &mut back)?;
//! assert_eq!(&back, b"kv block");
//! # Ok(())
//! # }
//! ```
#![cfg_attr(test, allow(clippy::unwrap_used))]

mod copy;
mod cuda;
mod driver;
mod error;
pub mod placement;
mod spec;
mod staged;
pub mod tiers;
#[cfg(feature = "topology")]
pub mod topo;

pub use copy::{CopyEngine, EngineLog, Fence, HostAlloc, HostEngine};
pub use cuda::{CudaEngine, Gpu, GpuInfo, VramBuffer, device_count, normalize_bus_id};
pub use driver::{DriverInfo, OPTIONAL, REQUIRED, available, driver};
pub use error::GpuError;
pub use spec::MemorySpec;
pub use staged::{Registered, StagedMemory, StagingConfig};
