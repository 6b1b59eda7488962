//! The function layer: a PCI function and the two transports that reach
//! one — kernel VFIO ([`VfioFunction`]) and vfio-user ([`VfioUserFunction`],
//! an out-of-process device such as rnic-mlx5-emu) — behind one trait,
//! [`PciFunction`]: config space, BAR0 (uncached, and write-combining where
//! the transport has it: [`wc::BlockWindow`]), MSI-X vectors, function
//! reset, device-visible memory ([`memory`]) and what the kernel lets the
//! owner pin ([`budget`]). Nothing here knows the firmware.

pub mod budget;
pub mod memory;
pub mod user;
mod vfio_kernel;
mod vfio_user;
pub mod wc;

use std::fmt;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::eventfd::EventFd;
use rnic_dma::{DmaDomain, Mmio};

pub use budget::DmaBudget;
pub use memory::{DmaBuffer, IovaSpace, SharedMemory, SharedPages};
pub use user::{Sharing, UserPages};
pub use vfio_kernel::VfioFunction;
pub use vfio_user::{VfioUserFunction, VfioUserMapper};
pub use wc::BlockWindow;

use crate::{Mlx5Error, sys};

/// PCI config space: vendor ID (16 bits).
pub const PCI_VENDOR_ID: u16 = 0x00;
/// PCI config space: device ID (16 bits).
pub const PCI_DEVICE_ID: u16 = 0x02;
/// PCI config space: BAR0's low dword (32 bits).
pub const PCI_BAR0: u16 = 0x10;
/// BAR bit: prefetchable memory.
pub const PCI_BAR_PREFETCHABLE: u32 = 0x8;
/// PCI config space: command register (16 bits).
pub const PCI_COMMAND: u16 = 0x04;
/// Command bit: memory-space decoding.
pub const PCI_COMMAND_MEMORY: u16 = 0x2;
/// Command bit: bus mastering (DMA, MSI-X writes).
pub const PCI_COMMAND_MASTER: u16 = 0x4;
/// Bytes of one UAR page in BAR0 (`log_uar_page_sz` = 0).
pub const UAR_PAGE_SIZE: usize = 4096;

/// Who a function is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FunctionId {
    /// PCI vendor ID (0x15b3 for Mellanox/NVIDIA).
    pub vendor: u16,
    /// PCI device ID (0x1017 for ConnectX-5).
    pub device: u16,
}

/// One MSI-X vector delivered to an eventfd.
#[derive(Debug)]
pub struct Vector {
    fd: EventFd,
    /// The vector number (MSI-X table entry).
    pub vector: u32,
}

impl Vector {
    /// Wait up to `timeout` (at most ~65 s) for the interrupt; the number of
    /// interrupts since the last take, or `None` on timeout.
    pub fn wait(&self, timeout: Duration) -> io::Result<Option<u64>> {
        if !sys::wait_readable(self.fd.as_fd(), timeout)? {
            return Ok(None);
        }
        self.take()
    }

    /// The interrupts since the last take, without waiting.
    pub fn take(&self) -> io::Result<Option<u64>> {
        if !sys::wait_readable(self.fd.as_fd(), Duration::ZERO)? {
            return Ok(None);
        }
        Ok(sys::eventfd_take(&self.fd)?)
    }
}

impl AsFd for Vector {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Everything the mlx5 driver uses to reach its PCI function; implemented by
/// [`VfioFunction`] (kernel VFIO) and [`VfioUserFunction`] (vfio-user).
pub trait PciFunction: Send + Sync + fmt::Debug {
    /// A name for messages: the PCI address, or `vfio-user:<socket>`.
    fn name(&self) -> &str;

    /// Vendor and device ID (read from config space at open).
    fn id(&self) -> FunctionId;

    /// BAR0, whole: the initialization segment at offset 0, UAR pages at
    /// `index * 4096`.
    fn bar0(&self) -> &Mmio;

    /// UAR page `index` of BAR0 (4 KiB; doorbells at 0x20, 0x40, 0x48,
    /// 0x800..).
    fn uar(&self, index: u32) -> Result<Mmio, Mlx5Error> {
        self.bar0()
            .window(index as usize * UAR_PAGE_SIZE, UAR_PAGE_SIZE)
            .map_err(Mlx5Error::Bar)
    }

    /// UAR page `index` mapped **write-combining**, for BlueFlame copies
    /// (mlx5.md §8): a BlueFlame copy only works as one when the CPU
    /// combines its stores into one PCIe write; through an uncached mapping
    /// each 8-byte store arrives alone and the device serves the first as a
    /// doorbell (K core/wc.c; audit row 4). `Err` says why this transport
    /// has no such mapping — the driver then rings 8-byte doorbells only.
    /// The default: none (kernel VFIO maps BARs uncached,
    /// `vfio_pci_core_mmap`: `pgprot_noncached`).
    fn uar_wc(&self, index: u32) -> Result<BlockWindow, String> {
        let _ = index;
        Err("this transport maps BAR0 uncached only".into())
    }

    /// What the kernel lets this transport pin and map for the function
    /// (audit row 23). The default: no limit (a vfio-user server maps the
    /// driver's memfds; nothing is pinned on the driver's side).
    fn dma_budget(&self) -> DmaBudget {
        DmaBudget::default()
    }

    /// Whether the host kernel's neighbour table knows this function's
    /// peers by default (`crate::firmware::neigh`): true where the function's wire is
    /// the host's own network stack. The default: false (a ConnectX owned
    /// through VFIO has no netdev, and the host may have no interface on
    /// its network).
    fn host_neighbours(&self) -> bool {
        false
    }

    /// Read `buf.len()` bytes of PCI config space at `offset`.
    fn config_read(&self, offset: u16, buf: &mut [u8]) -> Result<(), Mlx5Error>;

    /// Write `buf` to PCI config space at `offset`.
    fn config_write(&self, offset: u16, buf: &[u8]) -> Result<(), Mlx5Error>;

    /// A 16-bit config register (little-endian, as PCI is).
    fn config_read16(&self, offset: u16) -> Result<u16, Mlx5Error> {
        let mut v = [0u8; 2];
        self.config_read(offset, &mut v)?;
        Ok(u16::from_le_bytes(v))
    }

    /// A 32-bit config register.
    fn config_read32(&self, offset: u16) -> Result<u32, Mlx5Error> {
        let mut v = [0u8; 4];
        self.config_read(offset, &mut v)?;
        Ok(u32::from_le_bytes(v))
    }

    /// Write a 16-bit config register.
    fn config_write16(&self, offset: u16, value: u16) -> Result<(), Mlx5Error> {
        self.config_write(offset, &value.to_le_bytes())
    }

    /// Set memory decoding and bus mastering; the command register read back.
    fn enable_bus_master(&self) -> Result<u16, Mlx5Error> {
        let cmd = self.config_read16(PCI_COMMAND)?;
        self.config_write16(PCI_COMMAND, cmd | PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER)?;
        self.config_read16(PCI_COMMAND)
    }

    /// `len` bytes of zeroed device-visible memory mapped for this function
    /// (memfd-backed, so it works on every transport).
    fn alloc_dma(&self, len: usize) -> Result<Arc<DmaBuffer>, Mlx5Error>;

    /// Map application memory — `[addr, addr + len)`, memory the driver did
    /// not allocate — into this function's IOVA space, whole pages, at an
    /// IOVA of the space [`PciFunction::alloc_dma`] uses (see
    /// [`user`] for how each transport does it: kernel VFIO pins the pages
    /// where they are; vfio-user moves them onto a memfd in place).
    /// `writable`: the registration grants write access, so every page must
    /// be writable; without it the device is given the pages to read only
    /// (kernel VFIO: `VFIO_DMA_MAP_FLAG_READ` alone). A refusal ([`Mlx5Error::UserMemory`],
    /// [`Mlx5Error::IovaExhausted`], [`Mlx5Error::DmaMap`]) leaves the
    /// memory as it was.
    ///
    /// The caller keeps the range mapped until the returned [`UserPages`]
    /// is dropped (the verbs contract of a registered region).
    fn map_user(&self, addr: usize, len: usize, writable: bool) -> Result<UserPages, Mlx5Error>;

    /// A DMA domain for `rnic_dma::DmaRegion::builder(..).domain(..)`, over
    /// the half of the IOVA space that [`PciFunction::alloc_dma`] does not
    /// use. Over vfio-user only file-backed host memory can be mapped (a
    /// `DmaRegion`'s anonymous pages are refused with an error naming the
    /// fix).
    fn dma_domain(&self) -> Arc<DmaDomain>;

    /// How many MSI-X vectors the function has.
    fn msix_count(&self) -> Result<u32, Mlx5Error>;

    /// Route vectors `0..count` to fresh eventfds.
    fn enable_msix(&self, count: u32) -> Result<Vec<Vector>, Mlx5Error>;

    /// Disconnect every MSI-X vector.
    fn disable_msix(&self) -> Result<(), Mlx5Error>;

    /// Function-level reset (the function returns to its power-on state).
    fn reset(&self) -> Result<(), Mlx5Error>;
}
