//! rnic-vfio: a PCI function owned from userspace through VFIO.
//!
//! # What it owns
//!
//! - **Finding and binding** ([`Sysfs`]): the IOMMU group of a PCI address,
//!   group viability (every member bound to vfio-pci or to nothing — the one
//!   in the way is named), and `bind`/`restore` through `driver_override`,
//!   `drivers/<drv>/unbind` and `drivers_probe`, remembering the previous
//!   driver. Every path hangs off a root prefix, so host tests run against a
//!   synthetic tree.
//! - **The IOMMU** ([`Container`]): `/dev/vfio/vfio` with the group attached
//!   and `VFIO_TYPE1v2_IOMMU`; the IOVA ranges of the
//!   `VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE` capability become
//!   [`rnic_dma::IovaAllocator`] apertures; `VFIO_IOMMU_MAP_DMA`/`UNMAP_DMA`
//!   with bookkeeping; [`VfioMapper`] is rnic-dma's [`rnic_dma::Mapper`], so
//!   `DmaRegion::builder(..).domain(dev.dma_domain(mask))` maps through the
//!   IOMMU. The iommufd cdev (`/dev/iommu` + `/dev/vfio/devices/vfioX`) is
//!   detected and reported ([`Backend`]); the container path is the one used.
//! - **Peer BAR routes** ([`peer_bar_routes`]): whether this host can put a
//!   peer's BAR into the IOMMU domain by type1 `MAP_DMA` of a PFNMAP mapping
//!   (rnic-dma's `PeerRegion`) or by VFIO dma-buf + iommufd `MAP_FILE`, and
//!   what is missing for each; the iommufd/cdev path itself ([`Iommufd`],
//!   [`CdevDevice`], [`FileMapping`]: BAR → dma-buf → `IOMMU_IOAS_MAP_FILE`),
//!   tested on the scripted fake (no kernel here has it).
//! - **The device** ([`VfioDevice`]): region info, BAR mmap as
//!   [`rnic_dma::Mmio`] (the `Mmio` owns the mapping), PCI config
//!   read/write and bus mastering, MSI/MSI-X vectors on eventfds
//!   ([`Interrupt`]), `VFIO_DEVICE_RESET`.
//!
//! # Invariants
//!
//! - Drop order is enforced by ownership: BAR mappings and DMA domains hold
//!   an `Arc<Container>`, so the group stays attached (and the IOMMU alive)
//!   until the last region is unmapped and the last BAR unmapped; the device
//!   fd closes before the group is detached.
//! - A DMA map never overlaps a live mapping; an unmap must name exactly a
//!   live mapping and reports `Ok` only when the kernel unmapped every byte,
//!   which is what [`rnic_dma::Mapper`]'s safety contract needs.
//! - No Rust reference points into a BAR or a DMA region: BARs are reached
//!   through [`rnic_dma::Mmio`] only.
//! - Every ioctl is in one module (`ioctls`), numbers computed with nix's
//!   `request_code_none!`; unit tests replace it with a scripted fake.
//!
//! # Example
//!
//! ```no_run
//! use rnic_core::PciAddr;
//! use rnic_dma::DmaRegion;
//! use rnic_vfio::{Sysfs, VfioDevice};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let addr: PciAddr = "0000:00:02.0".parse()?;
//! let sysfs = Sysfs::system();
//! let binding = sysfs.bind(&addr, "vfio-pci")?;
//! {
//!     let dev = VfioDevice::open(&addr)?;
//!     let bar0 = dev.map_bar(0)?;
//!     println!("id {:#x}", bar0.read32(0)?);
//!     dev.enable_bus_master()?;
//!     let buf = DmaRegion::builder(4096).domain(dev.dma_domain((1 << 28) - 1)).build()?;
//!     println!("device sees the buffer at {}", buf.iova());
//! }
//! sysfs.restore(binding)?;
//! # Ok(())
//! # }
//! ```
#![cfg_attr(test, allow(clippy::unwrap_used))]

mod container;
mod device;
mod error;
pub mod info;
mod iommufd;
pub mod routes;
pub mod sysfs;

#[cfg(not(test))]
mod ioctls;
#[cfg(test)]
#[path = "ioctls_fake.rs"]
mod ioctls;

pub use container::{Backend, Container, FALLBACK_APERTURE, VfioMapper, ZERO_PAGE};
pub use device::{Interrupt, PCI_COMMAND, PCI_COMMAND_MASTER, PCI_COMMAND_MEMORY, VfioDevice};
pub use error::VfioError;
pub use info::{DeviceInfo, IommuInfo, IrqInfo, IrqSet, RegionInfo};
pub use iommufd::{CdevDevice, FileMapping, Iommufd};
pub use routes::{Route, peer_bar_routes};
pub use sysfs::{Binding, Sysfs};
pub use vfio_bindings::bindings::vfio::{
    VFIO_PCI_BAR0_REGION_INDEX, VFIO_PCI_CONFIG_REGION_INDEX, VFIO_PCI_MSI_IRQ_INDEX,
    VFIO_PCI_MSIX_IRQ_INDEX,
};

#[cfg(test)]
mod tests;
