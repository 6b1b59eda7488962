//! rnic-mlx5: the ConnectX (mlx5) userspace driver — its PCI-function layer,
//! the firmware command interface, the bring-up of a function, the event
//! queue, memory keys, CQs, RC/UD QPs and the direct data path.
//!
//! # What it owns
//!
//! - **Objects** (RAII; the teardown order QP → CQ → MKey → PD → EQ → UAR →
//!   `Hca` is what the ownership enforces): [`Hca::enable_events`] (the async
//!   EQ on MSI-X vector 0: command completions by EQE, page requests served
//!   at run time, unknown events counted), [`Hca::set_gid`] (the port's
//!   RoCEv2 address), [`Mkey`] (MTT over a [`DmaBuffer`]), [`Cq`], [`Qp`]
//!   (RST → INIT → RTR → RTS over RoCEv2, 2ERR, 2RST), [`Hca::check_health`]
//!   / [`Hca::spawn_health_poller`] (fatal → QPs in ERR, work flushed).
//! - **The data path** ([`Qp::post_send`], [`Qp::post_recv`], [`Cq::poll`]):
//!   WQEs built in the rings, doorbell record and UAR doorbell (BlueFlame for
//!   a single small WQE) behind named barriers, CQEs taken by owner parity —
//!   no lock, allocation or system call per request; every value the device
//!   writes is checked before it indexes anything (hostile CQEs and EQEs are
//!   counted, never a panic). `docs/mlx5.md` §8–§13 has each step.
//! - **The direct fast path** ([`Qp::post_write_inline`], [`Cq::poll_send`],
//!   mlx5dv-class): an RDMA WRITE of ≤ 28 inline bytes built whole as one
//!   WQEBB and copied to BlueFlame as one 64-byte block ([`BlockWindow`]:
//!   one bounds check, eight volatile stores), and requester completions
//!   decoded from the CQE's last word — the same bytes, checks and results
//!   as the generic calls (unit-tested against them).
//!
//! - **[`Hca`]** ([`init`]): a brought-up function. [`Hca::bring_up`] runs
//!   mlx5.md §3 in order (reset if left initialized, cmdif revision 5, wait
//!   for firmware, command queue, ENABLE_HCA, ISSI, boot pages, host
//!   endianness, general and RoCE caps, init pages, INIT_HCA,
//!   SET_DRIVER_VERSION, re-query, ALLOC_UAR, ALLOC_PD); dropping it (or
//!   [`Hca::shutdown`]) tears down in reverse and takes every page back
//!   before the DMA buffers are unmapped. [`Hca::info`] reports versions,
//!   capabilities and pages.
//! - **[`CmdQueue`]** ([`cmd`]): the command interface of mlx5.md §4 — one
//!   4 KiB page of entries, mailbox chains, tokens, signatures, ownership
//!   set last behind a named barrier, polled completion, typed errors
//!   ([`Mlx5Error::Command`], [`Mlx5Error::Delivery`],
//!   [`Mlx5Error::CommandTimeout`], [`Mlx5Error::Reply`]). Every byte goes
//!   through the rnic-mlx5-prm views.
//! - **[`PciFunction`]**, the only door the driver has to its function: BAR0
//!   as an [`rnic_dma::Mmio`] (and the 4 KiB UAR pages within it), PCI config
//!   read/write, device-visible memory ([`PciFunction::alloc_dma`] →
//!   [`DmaBuffer`], and a [`rnic_dma::DmaDomain`] for `DmaRegion` builders),
//!   MSI-X vectors as eventfds ([`Vector`]), function-level reset, and the
//!   function's identity ([`FunctionId`]).
//! - **Two transports**:
//!   - [`VfioFunction`]: kernel VFIO, a thin adapter over rnic-vfio's
//!     [`rnic_vfio::VfioDevice`] (BAR mmap, IOMMU mappings through
//!     [`rnic_vfio::VfioMapper`], MSI-X, `VFIO_DEVICE_RESET`).
//!   - [`VfioUserFunction`]: a device in another process (rnic-mlx5-emu)
//!     over a vfio-user UNIX socket, through the `vfio_user` crate's
//!     `Client`: BAR0 mmapped from the fd the server passes (the server must
//!     offer **all** of BAR0 as sparse-mmap areas, so the same `Mmio` code
//!     runs on both transports; a partial offer is refused with an error),
//!     `DMA_MAP` with the memfd behind each buffer, `SET_IRQS` with
//!     eventfds, `DEVICE_RESET`.
//! - **File-backed device memory** ([`memory`]): memfd mappings (2 MiB
//!   hugetlb when available, else 4 KiB pages, with a log line that says how
//!   to reserve hugepages), size-sealed, registered so a mapper can find the
//!   fd behind a host address.
//!
//! # Invariants
//!
//! - No `&`/`&mut` points into a BAR or into device-visible memory: BARs are
//!   [`rnic_dma::Mmio`] (volatile), buffers are `&AtomicU64` words.
//! - A [`DmaBuffer`] is unmapped from the device before its IOVA is freed and
//!   before its pages are unmapped; if the device unmap fails both are
//!   leaked (never reused under a live device mapping).
//! - The two IOVA allocators of a function (buffers, `DmaDomain`) cover
//!   disjoint halves of its aperture.
//! - All system calls are in one module (`sys`).
//! - A command entry is handed to the device only after its mailboxes and
//!   body are written ([`rnic_dma::barrier::dma_wmb_before_doorbell`] before
//!   the ownership bit and before the doorbell); its output is read only
//!   after ownership came back ([`rnic_dma::barrier::dma_rmb_after_owner_bit`]).
//!   A slot whose command timed out is not reused until the device returns it.
//! - Nothing the device writes into an entry or mailbox can make the driver
//!   panic or read out of bounds; disagreements are typed errors.
//!
//! # Bring-up example
//!
//! ```no_run
//! use std::sync::Arc;
//! use rnic_mlx5::{Hca, HcaOptions, PciFunction, VfioUserFunction};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let f: Arc<dyn PciFunction> = Arc::new(VfioUserFunction::connect("/tmp/mlx5.sock")?);
//! let hca = Hca::bring_up(f, HcaOptions::default())?;
//! let info = hca.info();
//! println!("fw {} log_max_qp {} pd {}", info.fw_version, info.log_max_qp, info.pd);
//! hca.shutdown()?; // or drop it
//! # Ok(())
//! # }
//! ```
//!
//! # Data-path example
//!
//! ```no_run
//! use std::sync::Arc;
//! use rnic_core::{AccessFlags, Gid, InitParams, Psn, Qpn, RtrParams, RtsParams, SendFlags,
//!     SendWr, Sge, WorkCompletion};
//! use rnic_mlx5::{Cq, Hca, HcaOptions, Mkey, PciFunction, Qp, QpOptions, VfioUserFunction};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let f: Arc<dyn PciFunction> = Arc::new(VfioUserFunction::connect("/tmp/mlx5.sock")?);
//! let mut hca = Hca::bring_up(f, HcaOptions::default())?;
//! hca.enable_events()?;
//! let hca = Arc::new(hca);
//! hca.set_gid(0, "127.0.0.1".parse()?)?;
//! let mut cq = Cq::new(&hca, 256)?;
//! let mkey = Mkey::new(&hca, hca.function().alloc_dma(4096)?, AccessFlags::LOCAL_WRITE)?;
//! let mut qp = Qp::new(&hca, &mut cq, None, QpOptions::default())?;
//! let (peer_qpn, peer_gid) = (Qpn::from_wire(0x11), Gid::from_ipv4("127.0.0.2".parse()?));
//! qp.connect(&InitParams::default(), peer_qpn, peer_gid, Psn::from_wire(0),
//!     Psn::from_wire(0), &RtrParams::default(), &RtsParams::default())?;
//! let sge = [Sge::new(mkey.addr(), 64, mkey.lkey())];
//! let mut wr = SendWr::rdma_write(1, &sge, 0x7f00_0000_0000, rnic_core::Rkey(0x1234));
//! wr.flags = SendFlags::SIGNALED;
//! qp.post_send(&[wr])?;
//! let mut wcs = [WorkCompletion::default(); 16];
//! while cq.poll(&mut wcs) == 0 {}
//! # Ok(())
//! # }
//! ```
//!
//! # Transport example
//!
//! ```no_run
//! use rnic_mlx5::{PciFunction, VfioUserFunction};
//! use rnic_core::Memory;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let f = VfioUserFunction::connect("/tmp/mlx5.sock")?;
//! let id = f.id();
//! assert_eq!((id.vendor, id.device), (0x15b3, 0x1017));
//! let iseg = f.bar0();
//! println!("cmdif rev {}", iseg.read32_be(0x004)? >> 16);
//! let cmdq = f.alloc_dma(4096)?;            // memfd-backed, DMA_MAPped
//! cmdq.write(0, &[0u8; 64])?;
//! println!("command queue at IOVA {}", cmdq.iova());
//! let vectors = f.enable_msix(1)?;
//! f.bar0().write32_be(0x018, 1)?;         // ring the command doorbell
//! # let _ = vectors;
//! # Ok(())
//! # }
//! ```
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod bf;
pub mod cmd;
pub mod cq;
#[cfg(test)]
mod datapath_tests;
mod error;
pub mod events;
#[doc(hidden)]
pub mod fuzzing;
pub mod health;
pub mod init;
pub mod memory;
pub mod neigh;
pub mod pages;
pub mod provider;
pub mod qp;
pub mod resources;
mod ring;
mod sys;
mod track;
mod vfio_kernel;
mod vfio_user;
pub mod wq;
pub mod wqe;

use std::fmt;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::eventfd::EventFd;
use rnic_dma::{DmaDomain, Mmio};

pub use bf::BlockWindow;
pub use cmd::{CmdQueue, CmdQueueOptions};
pub use cq::{Cq, CqCounters, SendCompletion};
pub use error::Mlx5Error;
pub use events::{EventCounters, HealthPoller};
pub use health::{Fatal, HealthReport, HealthWarning};
pub use init::{
    DoorbellPath, FwVersion, Hca, HcaInfo, HcaOptions, Health, PageCounts, PortType, ResetPolicy,
};
pub use memory::{DmaBuffer, IovaSpace, SharedMemory, SharedPages};
pub use neigh::{Neighbour, NeighbourOptions, NeighbourSource};
pub use provider::{Mlx5Ah, Mlx5Cq, Mlx5Domain, Mlx5Mr, Mlx5Pd, Mlx5Provider, Mlx5Qp};
pub use qp::{Qp, QpCounters, QpOptions};
pub use resources::Mkey;
pub use vfio_kernel::VfioFunction;
pub use vfio_user::{VfioUserFunction, VfioUserMapper};
pub use wq::UdSegment;
pub use wqe::{DatagramTemplate, PostFailure, Refused};

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
    fn dma_budget(&self) -> pages::DmaBudget {
        pages::DmaBudget::default()
    }

    /// Whether the host kernel's neighbour table knows this function's
    /// peers by default (`crate::neigh`): true where the function's wire is
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

#[cfg(test)]
mod send_tests {
    fn send<T: Send>() {}

    #[test]
    fn objects_are_send_so_poster_and_poller_may_be_different_threads() {
        send::<crate::Qp>();
        send::<crate::Cq>();
        send::<crate::Mkey>();
        send::<crate::HealthPoller>();
    }
}
