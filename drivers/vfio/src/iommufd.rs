//! The iommufd/cdev path (Linux 6.6+ for the VFIO device cdev; 6.19+ for
//! VFIO dma-buf export and iommufd's dma-buf `IOMMU_IOAS_MAP_FILE`): route 2
//! for a peer BAR in a device's IOMMU domain (reference/gpu.md §1b).
//!
//! - [`Iommufd`]: `/dev/iommu` with one IO address space (IOAS), destroyed
//!   on drop.
//! - [`CdevDevice`]: a PCI function opened through `/dev/vfio/devices/vfioN`,
//!   bound to the iommufd (`VFIO_DEVICE_BIND_IOMMUFD`) and attached to its
//!   IOAS (`VFIO_DEVICE_ATTACH_IOMMUFD_PT`). A peer's [`CdevDevice`] exports a
//!   BAR range as a dma-buf (`VFIO_DEVICE_FEATURE_DMA_BUF`).
//! - [`FileMapping`]: that dma-buf mapped at a fixed IOVA of the NIC's IOAS
//!   (`IOMMU_IOAS_MAP_FILE`); unmapped on drop before the dma-buf fd closes.
//!   The kernel revokes the mapping itself when the exporter goes (close,
//!   reset, memory decode off), which the type1 route cannot.
//!
//! Only VFIO-exported dma-bufs are accepted by iommufd (a CUDA dma-buf is
//! refused with `EOPNOTSUPP`), and only one range per dma-buf.
//!
//! **Not run on a kernel**: the host (6.18) and the VM guest (6.1) lack the
//! dma-buf pieces, so this runs against the scripted fake only;
//! [`crate::peer_bar_routes`] says when a host has them.

use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;

use rnic_core::PciAddr;
use tracing::error;

use crate::error::VfioError;
use crate::ioctls;
use crate::sysfs::Sysfs;

/// `/dev/iommu` with one IOAS; see the module docs.
#[derive(Debug)]
pub struct Iommufd {
    fd: OwnedFd,
    ioas: u32,
    path: PathBuf,
}

impl Iommufd {
    /// Open `/dev/iommu` (under `sysfs`'s root) and allocate an IOAS.
    pub fn open_in(sysfs: &Sysfs) -> Result<Arc<Iommufd>, VfioError> {
        let path = sysfs.path("dev/iommu");
        if !path.exists() {
            return Err(VfioError::Unsupported {
                path,
                what: "no /dev/iommu: the kernel lacks iommufd (CONFIG_IOMMUFD; modprobe \
                       iommufd) — use the VFIO container path"
                    .into(),
            });
        }
        let fd = ioctls::open_rw(&path).map_err(|e| VfioError::ioctl("open", path.display(), e))?;
        let ioas = ioctls::iommu_ioas_alloc(fd.as_fd())
            .map_err(|e| VfioError::ioctl("IOMMU_IOAS_ALLOC", path.display(), e))?;
        Ok(Arc::new(Iommufd { fd, ioas, path }))
    }

    /// The IOAS id.
    pub fn ioas(&self) -> u32 {
        self.ioas
    }

    /// Map `[start, start + len)` of `file` (a VFIO-exported dma-buf or a
    /// memfd) at `iova`, read/write; unmapped when the result drops.
    pub fn map_file(
        self: &Arc<Self>,
        file: OwnedFd,
        start: u64,
        len: u64,
        iova: u64,
    ) -> Result<FileMapping, VfioError> {
        ioctls::iommu_ioas_map_file(self.fd.as_fd(), self.ioas, file.as_fd(), start, len, iova)
            .map_err(|e| {
                let hint = if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
                    " (iommufd imports only VFIO-exported dma-bufs with one range: a CUDA \
                     dma-buf cannot be mapped this way)"
                } else {
                    ""
                };
                VfioError::ioctl(
                    "IOMMU_IOAS_MAP_FILE",
                    format!(
                        "{} IOAS {} IOVA {iova:#x}+{len:#x}{hint}",
                        self.path.display(),
                        self.ioas
                    ),
                    e,
                )
            })?;
        Ok(FileMapping {
            iommufd: self.clone(),
            iova,
            len,
            _file: file,
        })
    }
}

impl Drop for Iommufd {
    fn drop(&mut self) {
        if let Err(e) = ioctls::iommu_destroy(self.fd.as_fd(), self.ioas) {
            error!(ioas = self.ioas, %e, "IOMMU_DESTROY of the IOAS failed");
        }
    }
}

/// A file range mapped in an IOAS; unmapped on drop, before its file (the
/// dma-buf) is closed and before the IOAS can go (it holds the iommufd).
#[derive(Debug)]
pub struct FileMapping {
    iommufd: Arc<Iommufd>,
    iova: u64,
    len: u64,
    _file: OwnedFd,
}

impl FileMapping {
    /// The device address of byte 0.
    pub fn iova(&self) -> u64 {
        self.iova
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Never: mappings have at least one byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for FileMapping {
    fn drop(&mut self) {
        let i = &self.iommufd;
        match ioctls::iommu_ioas_unmap(i.fd.as_fd(), i.ioas, self.iova, self.len) {
            Ok(n) if n == self.len => {}
            Ok(n) => error!(
                iova = self.iova,
                len = self.len,
                n,
                "IOMMU_IOAS_UNMAP was short"
            ),
            Err(e) => error!(iova = self.iova, %e, "IOMMU_IOAS_UNMAP failed"),
        }
    }
}

/// A PCI function opened through its VFIO cdev and attached to an IOAS.
#[derive(Debug)]
pub struct CdevDevice {
    // Drop order: the device fd closes (detaching it) before the iommufd can.
    fd: OwnedFd,
    addr: PciAddr,
    devid: u32,
    iommufd: Arc<Iommufd>,
}

impl CdevDevice {
    /// Open `addr`'s `/dev/vfio/devices/vfioN`, bind it to `iommufd` and
    /// attach it to the IOAS. The function must be bound to vfio-pci.
    pub fn open_in(
        sysfs: &Sysfs,
        addr: &PciAddr,
        iommufd: &Arc<Iommufd>,
    ) -> Result<CdevDevice, VfioError> {
        let Some(path) = sysfs.vfio_cdev(addr) else {
            return Err(VfioError::Unsupported {
                path: sysfs.path("dev/vfio/devices"),
                what: format!(
                    "{addr} has no VFIO device cdev: the kernel lacks CONFIG_VFIO_DEVICE_CDEV \
                     (Linux 6.6+) or the function is not bound to vfio-pci (rnicctl bind {addr})"
                ),
            });
        };
        let fd = ioctls::open_rw(&path).map_err(|e| VfioError::ioctl("open", path.display(), e))?;
        let devid = ioctls::device_bind_iommufd(fd.as_fd(), iommufd.fd.as_fd())
            .map_err(|e| VfioError::ioctl("VFIO_DEVICE_BIND_IOMMUFD", addr, e))?;
        ioctls::device_attach_pt(fd.as_fd(), iommufd.ioas)
            .map_err(|e| VfioError::ioctl("VFIO_DEVICE_ATTACH_IOMMUFD_PT", addr, e))?;
        Ok(CdevDevice {
            fd,
            addr: *addr,
            devid,
            iommufd: iommufd.clone(),
        })
    }

    /// The device's id in the iommufd.
    pub fn devid(&self) -> u32 {
        self.devid
    }

    /// The iommufd it is attached to.
    pub fn iommufd(&self) -> &Arc<Iommufd> {
        &self.iommufd
    }

    /// Export `[offset, offset + len)` of BAR `bar` as a dma-buf
    /// (`VFIO_DEVICE_FEATURE_DMA_BUF`, Linux 6.19+, `CONFIG_PCI_P2PDMA`).
    pub fn export_bar(&self, bar: u32, offset: u64, len: u64) -> Result<OwnedFd, VfioError> {
        if bar > 5 || len == 0 || !offset.is_multiple_of(4096) || !len.is_multiple_of(4096) {
            return Err(VfioError::Region {
                addr: self.addr,
                index: bar,
                reason: "dma-buf export takes BAR 0..=5 and a non-empty, page-aligned range".into(),
            });
        }
        ioctls::device_export_dmabuf(self.fd.as_fd(), bar, offset, len).map_err(|e| {
            let why = match e.raw_os_error() {
                Some(libc::ENOTTY | libc::EINVAL) => {
                    " (the kernel has no VFIO dma-buf export: Linux 6.19+ with CONFIG_PCI_P2PDMA)"
                }
                _ => "",
            };
            VfioError::ioctl(
                "VFIO_DEVICE_FEATURE(DMA_BUF)",
                format!("{} BAR{bar} {offset:#x}+{len:#x}{why}", self.addr),
                e,
            )
        })
    }
}
