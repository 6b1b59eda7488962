//! [`VfioDevice`]: one PCI function owned through VFIO: regions, BAR → [`Mmio`],
//! PCI config, interrupts → eventfds, reset, and its DMA domain.

use std::any::Any;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

use rnic_core::PciAddr;
use rnic_dma::{DmaDomain, Mmio};
use tracing::{error, info};
use vfio_bindings::bindings::vfio as b;

use crate::container::{Backend, Container, VfioMapper};
use crate::error::VfioError;
use crate::info::{DeviceInfo, IrqInfo, IrqSet, RegionInfo};
use crate::ioctls;
use crate::sysfs::Sysfs;

/// PCI config space: the command register and its bits.
pub const PCI_COMMAND: u64 = 0x04;
/// Command bit: respond to memory-space accesses (BARs).
pub const PCI_COMMAND_MEMORY: u16 = 0x2;
/// Command bit: the device may master the bus (DMA, MSI writes).
pub const PCI_COMMAND_MASTER: u16 = 0x4;

/// A PCI function opened through VFIO; see the crate docs.
#[derive(Debug)]
pub struct VfioDevice {
    // Drop order: the device fd closes before the container detaches the group.
    fd: OwnedFd,
    addr: PciAddr,
    info: DeviceInfo,
    backend: Backend,
    container: Arc<Container>,
}

fn open_node(path: &Path, is_container: bool) -> Result<OwnedFd, VfioError> {
    ioctls::open_rw(path).map_err(|source| match source.raw_os_error() {
        Some(libc::EACCES | libc::EPERM) => match std::fs::metadata(path) {
            Ok(m) => VfioError::Permission {
                path: path.to_path_buf(),
                uid: m.uid(),
                gid: m.gid(),
                mode: m.mode() & 0o7777,
            },
            Err(_) => VfioError::ioctl("open", path.display(), source),
        },
        Some(libc::ENOENT) if is_container => VfioError::VfioMissing {
            path: path.to_path_buf(),
            source,
        },
        Some(libc::EBUSY) => VfioError::ioctl(
            "open (the group is already open, by this or another process)",
            path.display(),
            source,
        ),
        _ => VfioError::ioctl("open", path.display(), source),
    })
}

impl VfioDevice {
    /// Open the function at `addr` on this system (see [`VfioDevice::open_in`]).
    pub fn open(addr: &PciAddr) -> Result<VfioDevice, VfioError> {
        VfioDevice::open_in(&Sysfs::system(), addr)
    }

    /// Open the function at `addr`: check it exists, has an IOMMU group, is
    /// bound to vfio-pci and its group is viable; open the container, check
    /// the API version and type1v2; attach the group; select type1v2; read
    /// the IOVA ranges; get the device fd.
    pub fn open_in(sysfs: &Sysfs, addr: &PciAddr) -> Result<VfioDevice, VfioError> {
        let _span = tracing::info_span!("vfio_open", %addr).entered();
        let group = sysfs.check_viable(addr)?;
        let backend = Backend {
            kind: "VFIO container + group, VFIO_TYPE1v2_IOMMU",
            cdev: sysfs.vfio_cdev(addr),
        };
        let cpath = sysfs.path("dev/vfio/vfio");
        let cfd = open_node(&cpath, true)?;
        let version = ioctls::get_api_version(cfd.as_fd())
            .map_err(|e| VfioError::ioctl("VFIO_GET_API_VERSION", cpath.display(), e))?;
        if version != b::VFIO_API_VERSION as i32 {
            return Err(VfioError::Unsupported {
                path: cpath,
                what: format!("API version {version}, expected {}", b::VFIO_API_VERSION),
            });
        }
        let type1v2 = ioctls::check_extension(cfd.as_fd(), b::VFIO_TYPE1v2_IOMMU)
            .map_err(|e| VfioError::ioctl("VFIO_CHECK_EXTENSION", cpath.display(), e))?;
        if !type1v2 {
            return Err(VfioError::Unsupported {
                path: cpath,
                what: "no VFIO_TYPE1v2_IOMMU support (load vfio_iommu_type1)".into(),
            });
        }
        let gpath = sysfs.path(&format!("dev/vfio/{group}"));
        let gfd = open_node(&gpath, false)?;
        let flags = ioctls::group_get_status(gfd.as_fd())
            .map_err(|e| VfioError::ioctl("VFIO_GROUP_GET_STATUS", gpath.display(), e))?;
        if flags & b::VFIO_GROUP_FLAGS_VIABLE == 0 {
            return Err(VfioError::GroupNotViable {
                addr: *addr,
                group,
                blockers: sysfs
                    .group_devices(group)
                    .into_iter()
                    .filter(|(d, _)| *d != addr.to_string())
                    .map(|(d, drv)| (d, drv.unwrap_or_else(|| "no driver".into())))
                    .collect(),
            });
        }
        let container = Arc::new(Container::attach(cfd, cpath, gfd, group)?);
        let fd = ioctls::group_get_device_fd(container.group_fd(), &addr.to_string())
            .map_err(|e| VfioError::ioctl("VFIO_GROUP_GET_DEVICE_FD", addr, e))?;
        let info = ioctls::device_get_info(fd.as_fd())
            .map_err(|e| VfioError::ioctl("VFIO_DEVICE_GET_INFO", addr, e))?;
        info!(%addr, group, backend = %backend.describe(), ?info, "opened");
        Ok(VfioDevice {
            fd,
            addr: *addr,
            info,
            backend,
            container,
        })
    }

    /// The PCI address.
    pub fn addr(&self) -> PciAddr {
        self.addr
    }

    /// What `VFIO_DEVICE_GET_INFO` said.
    pub fn info(&self) -> DeviceInfo {
        self.info
    }

    /// The kernel interface in use.
    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    /// The container (IOMMU) this device's group is attached to.
    pub fn container(&self) -> &Arc<Container> {
        &self.container
    }

    /// A DMA domain mapping through this device's IOMMU, IOVAs at or below
    /// `dma_limit` (the device's DMA mask, e.g. `(1 << 28) - 1` for edu).
    pub fn dma_domain(&self, dma_limit: u64) -> Arc<DmaDomain> {
        VfioMapper(self.container.clone()).domain(dma_limit)
    }

    /// `VFIO_DEVICE_GET_REGION_INFO(index)`.
    pub fn region(&self, index: u32) -> Result<RegionInfo, VfioError> {
        ioctls::device_get_region_info(self.fd.as_fd(), index)
            .map_err(|e| VfioError::ioctl("VFIO_DEVICE_GET_REGION_INFO", self.addr, e))
    }

    /// mmap BAR `index` (0..=5) as an [`Mmio`]; the mapping lives until the
    /// last clone of the `Mmio` is gone (it holds the container alive too).
    pub fn map_bar(&self, index: u32) -> Result<Mmio, VfioError> {
        let r = self.region(index)?;
        let bad = |reason: &str| VfioError::Region {
            addr: self.addr,
            index,
            reason: reason.into(),
        };
        if index > b::VFIO_PCI_BAR5_REGION_INDEX {
            return Err(bad("not a BAR (BARs are regions 0..=5)"));
        }
        if r.size == 0 {
            return Err(bad("the BAR is not implemented (size 0)"));
        }
        if !r.mmap_supported() {
            return Err(bad(
                "the BAR cannot be mmapped (an I/O port BAR, or mmap disabled)",
            ));
        }
        let len = usize::try_from(r.size).map_err(|_| bad("BAR larger than the address space"))?;
        let ptr = ioctls::mmap_region(self.fd.as_fd(), r.offset, len)
            .map_err(|e| VfioError::ioctl("mmap", format!("{} BAR{index}", self.addr), e))?;
        let owner: Arc<dyn Any + Send + Sync> = Arc::new(BarMapping {
            ptr,
            len,
            _container: self.container.clone(),
        });
        // SAFETY: `ptr` is a fresh MAP_SHARED mapping of `len` bytes of BAR
        // memory, valid for volatile loads and stores, unmapped only when
        // `owner` (BarMapping) drops; nothing creates references into it.
        Ok(unsafe { Mmio::new(ptr, len, owner) })
    }

    /// `len` bytes at `offset` of BAR `index` mapped **write-combining**
    /// through sysfs `resource<index>_wc` (the route the kernel offers a
    /// VFIO owner for a prefetchable BAR; VFIO's own mapping is uncached,
    /// `vfio_pci_core_mmap`). The file is absent for a BAR that is not
    /// prefetchable; the mmap is refused under kernel lockdown, or with
    /// `CONFIG_IO_STRICT_DEVMEM` once the region is claimed
    /// (`iomem_is_exclusive`). On x86 the kernel's PAT may still give the
    /// pages another memory type when they are mapped otherwise too; the
    /// caller treats the mapping as a hint the device tolerates either way
    /// (a BlueFlame copy that does not arrive combined is a doorbell).
    pub fn map_bar_wc(
        &self,
        sysfs: &Sysfs,
        index: u32,
        offset: u64,
        len: usize,
    ) -> Result<Mmio, VfioError> {
        let path = sysfs.resource_wc(&self.addr, index);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| VfioError::ioctl("open", path.display().to_string(), e))?;
        let ptr = ioctls::mmap_region(file.as_fd(), offset, len)
            .map_err(|e| VfioError::ioctl("mmap", path.display().to_string(), e))?;
        let owner: Arc<dyn Any + Send + Sync> = Arc::new(BarMapping {
            ptr,
            len,
            _container: self.container.clone(),
        });
        // SAFETY: `ptr` is a fresh MAP_SHARED mapping of `len` bytes of BAR
        // memory (the sysfs resource file maps the BAR itself), valid for
        // volatile loads and stores, unmapped only when `owner` drops;
        // nothing creates references into it.
        Ok(unsafe { Mmio::new(ptr, len, owner) })
    }

    fn config(&self) -> Result<RegionInfo, VfioError> {
        self.region(b::VFIO_PCI_CONFIG_REGION_INDEX)
    }

    /// Read `buf.len()` bytes of PCI config space at `offset`.
    pub fn config_read(&self, offset: u64, buf: &mut [u8]) -> Result<(), VfioError> {
        let c = self.config()?;
        ioctls::region_read(self.fd.as_fd(), c.offset + offset, buf)
            .map_err(|e| VfioError::ioctl("pread (PCI config)", self.addr, e))
    }

    /// Write `buf` to PCI config space at `offset`.
    pub fn config_write(&self, offset: u64, buf: &[u8]) -> Result<(), VfioError> {
        let c = self.config()?;
        ioctls::region_write(self.fd.as_fd(), c.offset + offset, buf)
            .map_err(|e| VfioError::ioctl("pwrite (PCI config)", self.addr, e))
    }

    /// A 16-bit config register (little-endian, as PCI is).
    pub fn config_read16(&self, offset: u64) -> Result<u16, VfioError> {
        let mut v = [0u8; 2];
        self.config_read(offset, &mut v)?;
        Ok(u16::from_le_bytes(v))
    }

    /// A 32-bit config register.
    pub fn config_read32(&self, offset: u64) -> Result<u32, VfioError> {
        let mut v = [0u8; 4];
        self.config_read(offset, &mut v)?;
        Ok(u32::from_le_bytes(v))
    }

    /// Write a 16-bit config register.
    pub fn config_write16(&self, offset: u64, value: u16) -> Result<(), VfioError> {
        self.config_write(offset, &value.to_le_bytes())
    }

    /// Set memory-space decoding and bus mastering in PCI_COMMAND (vfio-pci
    /// leaves both to the user driver; without bus mastering every DMA reads
    /// zeros or is dropped). Returns the command register read back.
    pub fn enable_bus_master(&self) -> Result<u16, VfioError> {
        let cmd = self.config_read16(PCI_COMMAND)?;
        self.config_write16(PCI_COMMAND, cmd | PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER)?;
        self.config_read16(PCI_COMMAND)
    }

    /// `VFIO_DEVICE_GET_IRQ_INFO(index)`.
    pub fn irq_info(&self, index: u32) -> Result<IrqInfo, VfioError> {
        ioctls::device_get_irq_info(self.fd.as_fd(), index)
            .map_err(|e| VfioError::ioctl("VFIO_DEVICE_GET_IRQ_INFO", self.addr, e))
    }

    /// Route `count` vectors of interrupt `index` to fresh eventfds
    /// (`VFIO_DEVICE_SET_IRQS`, `DATA_EVENTFD | ACTION_TRIGGER`).
    pub fn enable_irqs(&self, index: u32, count: u32) -> Result<Vec<Interrupt>, VfioError> {
        let info = self.irq_info(index)?;
        if count == 0 || count > info.count {
            return Err(VfioError::Irq {
                addr: self.addr,
                index,
                wanted: count,
                count: info.count,
            });
        }
        let fds = (0..count)
            .map(|_| ioctls::eventfd().map_err(|e| VfioError::ioctl("eventfd", self.addr, e)))
            .collect::<Result<Vec<OwnedFd>, _>>()?;
        let raw: Vec<i32> = fds.iter().map(std::os::fd::AsRawFd::as_raw_fd).collect();
        ioctls::device_set_irqs(self.fd.as_fd(), &IrqSet::eventfds(index, 0, &raw))
            .map_err(|e| VfioError::ioctl("VFIO_DEVICE_SET_IRQS", self.addr, e))?;
        Ok(fds
            .into_iter()
            .enumerate()
            .map(|(v, fd)| Interrupt {
                fd,
                index,
                vector: v as u32,
            })
            .collect())
    }

    /// MSI vectors → eventfds.
    pub fn enable_msi(&self, count: u32) -> Result<Vec<Interrupt>, VfioError> {
        self.enable_irqs(b::VFIO_PCI_MSI_IRQ_INDEX, count)
    }

    /// MSI-X vectors → eventfds.
    pub fn enable_msix(&self, count: u32) -> Result<Vec<Interrupt>, VfioError> {
        self.enable_irqs(b::VFIO_PCI_MSIX_IRQ_INDEX, count)
    }

    /// Disable every vector of interrupt `index`.
    pub fn disable_irqs(&self, index: u32) -> Result<(), VfioError> {
        ioctls::device_set_irqs(self.fd.as_fd(), &IrqSet::disable(index))
            .map_err(|e| VfioError::ioctl("VFIO_DEVICE_SET_IRQS (disable)", self.addr, e))
    }

    /// `VFIO_DEVICE_RESET`, if the device has a reset method.
    pub fn reset(&self) -> Result<(), VfioError> {
        if !self.info.reset_supported() {
            return Err(VfioError::ResetUnsupported { addr: self.addr });
        }
        ioctls::device_reset(self.fd.as_fd())
            .map_err(|e| VfioError::ioctl("VFIO_DEVICE_RESET", self.addr, e))
    }
}

/// The owner of a BAR mapping behind an [`Mmio`]: unmaps on drop.
#[derive(Debug)]
struct BarMapping {
    ptr: NonNull<u8>,
    len: usize,
    /// Keeps the group attached while the BAR is mapped.
    _container: Arc<Container>,
}

// SAFETY: BarMapping only owns the mapping (a pointer and a length); it never
// touches the memory, and munmap from any thread is fine.
unsafe impl Send for BarMapping {}
// SAFETY: no method reads through `ptr`; `&BarMapping` exposes nothing.
unsafe impl Sync for BarMapping {}

impl Drop for BarMapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly the mapping from mmap_region, and
        // this owner is the last user: every Mmio holding it is gone.
        if let Err(e) = unsafe { ioctls::munmap_region(self.ptr, self.len) } {
            error!(len = self.len, %e, "munmap of a BAR failed");
        }
    }
}

/// One interrupt vector delivered to an eventfd.
#[derive(Debug)]
pub struct Interrupt {
    fd: OwnedFd,
    /// The interrupt index (MSI, MSI-X, ...).
    pub index: u32,
    /// The vector within the index.
    pub vector: u32,
}

impl Interrupt {
    /// Wait up to `timeout` (at most 65 s) for the interrupt; the number of
    /// interrupts since the last wait, or `None` on timeout.
    pub fn wait(&self, timeout: Duration) -> io::Result<Option<u64>> {
        let ms = u16::try_from(timeout.as_millis()).unwrap_or(u16::MAX);
        ioctls::eventfd_wait(self.fd.as_fd(), ms)
    }
}

impl AsFd for Interrupt {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}
