//! [`VfioFunction`]: the kernel-VFIO transport, a thin adapter over
//! rnic-vfio's [`VfioDevice`].

use std::os::fd::AsFd;
use std::sync::Arc;

use nix::sys::eventfd::EventFd;
use rnic_core::PciAddr;
use rnic_dma::iova::X86_MSI_WINDOW;
use rnic_dma::{DmaDomain, IovaAllocator, Mapper, Mmio};
use rnic_vfio::{Sysfs, VFIO_PCI_MSIX_IRQ_INDEX, VfioDevice, VfioError, VfioMapper, ZERO_PAGE};

use crate::error::Mlx5Error;
use crate::function::memory::{DmaBuffer, IovaSpace, split_apertures};
use crate::{BlockWindow, FunctionId, PCI_DEVICE_ID, PCI_VENDOR_ID, PciFunction, Vector, sys};

/// A function bound to vfio-pci and owned through the kernel's VFIO.
#[derive(Debug)]
pub struct VfioFunction {
    name: String,
    id: FunctionId,
    bar0: Mmio,
    /// Where `resource0_wc` is looked for.
    sysfs: Sysfs,
    space: Arc<IovaSpace>,
    domain: Arc<DmaDomain>,
    // Last: the Mmio and the domains hold the container alive on their own.
    dev: VfioDevice,
}

impl VfioFunction {
    /// Open the function at `addr` (see [`VfioFunction::open_in`]).
    pub fn open(addr: &PciAddr, dma_limit: u64) -> Result<VfioFunction, Mlx5Error> {
        VfioFunction::open_in(&Sysfs::system(), addr, dma_limit)
    }

    /// Open the function at `addr` through `sysfs` (rnic-vfio checks binding
    /// and group viability), mmap BAR0, read the IDs; IOVAs at or below
    /// `dma_limit` (the DMA mask; mlx5 does 64-bit DMA).
    pub fn open_in(
        sysfs: &Sysfs,
        addr: &PciAddr,
        dma_limit: u64,
    ) -> Result<VfioFunction, Mlx5Error> {
        let vfio = |op, source| Mlx5Error::Vfio {
            op,
            addr: *addr,
            source,
        };
        let dev = VfioDevice::open_in(sysfs, addr).map_err(|e| vfio("open", e))?;
        let bar0 = dev.map_bar(0).map_err(|e| vfio("map BAR0", e))?;
        let vendor = dev
            .config_read16(u64::from(PCI_VENDOR_ID))
            .map_err(|e| vfio("read vendor ID", e))?;
        let device = dev
            .config_read16(u64::from(PCI_DEVICE_ID))
            .map_err(|e| vfio("read device ID", e))?;
        let ranges: Vec<_> = dev
            .container()
            .iova_ranges()
            .into_iter()
            .filter(|r| *r.start() <= dma_limit)
            .map(|r| *r.start()..=(*r.end()).min(dma_limit))
            .collect();
        let (low, high) = split_apertures(&ranges);
        let reserved = [ZERO_PAGE, X86_MSI_WINDOW];
        let mapper = VfioMapper(dev.container().clone());
        let name = addr.to_string();
        let space = IovaSpace::new(
            name.clone(),
            Arc::new(mapper.clone()) as Arc<dyn Mapper>,
            IovaAllocator::with_reserved(&low, &reserved),
        );
        let domain = DmaDomain::new(mapper, IovaAllocator::with_reserved(&high, &reserved));
        Ok(VfioFunction {
            name,
            id: FunctionId { vendor, device },
            bar0,
            sysfs: sysfs.clone(),
            space,
            domain,
            dev,
        })
    }

    /// The rnic-vfio device underneath.
    pub fn device(&self) -> &VfioDevice {
        &self.dev
    }

    fn vfio(&self, op: &'static str, source: VfioError) -> Mlx5Error {
        Mlx5Error::Vfio {
            op,
            addr: self.dev.addr(),
            source,
        }
    }
}

impl PciFunction for VfioFunction {
    fn name(&self) -> &str {
        &self.name
    }

    fn id(&self) -> FunctionId {
        self.id
    }

    fn bar0(&self) -> &Mmio {
        &self.bar0
    }

    /// `RLIMIT_MEMLOCK` (unless the process has `CAP_IPC_LOCK`) and
    /// vfio_iommu_type1's `dma_entry_limit`.
    fn dma_budget(&self) -> crate::function::DmaBudget {
        crate::function::DmaBudget {
            memlock: sys::memlock_limit().filter(|_| !sys::has_cap_ipc_lock()),
            entries: sys::vfio_dma_entry_limit(),
        }
    }

    /// Through sysfs `resource0_wc` (`VfioDevice::map_bar_wc`): absent
    /// unless BAR0 is prefetchable (a ConnectX's is); refused under kernel
    /// lockdown or `CONFIG_IO_STRICT_DEVMEM`.
    fn uar_wc(&self, index: u32) -> Result<BlockWindow, String> {
        let at = u64::from(index) * crate::UAR_PAGE_SIZE as u64;
        let path = self.sysfs.resource_wc(&self.dev.addr(), 0);
        let mmio = self
            .dev
            .map_bar_wc(&self.sysfs, 0, at, crate::UAR_PAGE_SIZE)
            .map_err(|e| {
                format!(
                    "{} could not be mapped ({e}): kernel VFIO maps BARs uncached \
                     (vfio_pci_core_mmap); the sysfs write-combining mapping exists only for a \
                     prefetchable BAR and is refused under lockdown or CONFIG_IO_STRICT_DEVMEM",
                    path.display()
                )
            })?;
        BlockWindow::from_mmio(&mmio).ok_or_else(|| "the WC mapping is not 64-byte aligned".into())
    }

    fn config_read(&self, offset: u16, buf: &mut [u8]) -> Result<(), Mlx5Error> {
        self.dev
            .config_read(u64::from(offset), buf)
            .map_err(|e| self.vfio("config read", e))
    }

    fn config_write(&self, offset: u16, buf: &[u8]) -> Result<(), Mlx5Error> {
        self.dev
            .config_write(u64::from(offset), buf)
            .map_err(|e| self.vfio("config write", e))
    }

    fn alloc_dma(&self, len: usize) -> Result<Arc<DmaBuffer>, Mlx5Error> {
        self.space.alloc(len)
    }

    fn map_user(
        &self,
        addr: usize,
        len: usize,
        writable: bool,
    ) -> Result<crate::UserPages, Mlx5Error> {
        self.space
            .map_user(addr, len, writable, crate::function::Sharing::Pin)
    }

    fn dma_domain(&self) -> Arc<DmaDomain> {
        self.domain.clone()
    }

    fn msix_count(&self) -> Result<u32, Mlx5Error> {
        Ok(self
            .dev
            .irq_info(VFIO_PCI_MSIX_IRQ_INDEX)
            .map_err(|e| self.vfio("MSI-X info", e))?
            .count)
    }

    fn enable_msix(&self, count: u32) -> Result<Vec<Vector>, Mlx5Error> {
        let irqs = self
            .dev
            .enable_msix(count)
            .map_err(|e| self.vfio("enable MSI-X", e))?;
        irqs.into_iter()
            .map(|irq| {
                let fd = sys::dup(irq.as_fd()).map_err(|e| Mlx5Error::Eventfd {
                    vector: irq.vector,
                    source: nix::Error::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
                })?;
                // SAFETY: `fd` is a duplicate of the eventfd rnic-vfio created
                // for this vector (`Interrupt` holds only eventfds); the
                // original closes when `irq` drops, the duplicate stays open.
                let fd = unsafe { EventFd::from_owned_fd(fd) };
                Ok(Vector {
                    fd,
                    vector: irq.vector,
                })
            })
            .collect()
    }

    fn disable_msix(&self) -> Result<(), Mlx5Error> {
        self.dev
            .disable_irqs(VFIO_PCI_MSIX_IRQ_INDEX)
            .map_err(|e| self.vfio("disable MSI-X", e))
    }

    fn reset(&self) -> Result<(), Mlx5Error> {
        match self.dev.reset() {
            Err(VfioError::ResetUnsupported { .. }) => Err(Mlx5Error::ResetUnsupported {
                function: self.name.clone(),
            }),
            other => other.map_err(|e| self.vfio("reset", e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// rnic-vfio's ioctl fake is private to its own tests, so this adapter
    /// can only be driven up to the point where real hardware would be
    /// needed: a synthetic sysfs tree without the device.
    #[test]
    fn open_without_the_device_is_a_typed_vfio_error() {
        let root = tempfile::tempdir().unwrap();
        let addr: PciAddr = "0000:3b:00.0".parse().unwrap();
        let err = VfioFunction::open_in(&Sysfs::at(root.path()), &addr, u64::MAX).unwrap_err();
        assert!(
            matches!(err, Mlx5Error::Vfio { op: "open", addr: a, .. } if a == addr),
            "{err:?}"
        );
        let msg = format!("{err}");
        assert!(msg.contains("0000:3b:00.0"), "{msg}");
    }
}

#[cfg(test)]
mod wc_tests {
    use super::*;

    /// The sysfs route's failure says what to do; its success is a window
    /// over exactly the asked page (a plain file stands in for the BAR).
    #[test]
    fn resource0_wc_is_looked_up_under_the_function() {
        let root = tempfile::tempdir().unwrap();
        let sysfs = Sysfs::at(root.path());
        let addr: PciAddr = "0000:3b:00.0".parse().unwrap();
        let path = sysfs.resource_wc(&addr, 0);
        assert_eq!(
            path,
            root.path()
                .join("sys/bus/pci/devices/0000:3b:00.0/resource0_wc")
        );
    }
}
