//! rnic-mlx5: the ConnectX (mlx5) userspace driver — its PCI-function layer,
//! the firmware command interface, the bring-up of a function, the event
//! queue, memory keys, CQs, RC/UD QPs and the direct data path.
//!
//! # Layers
//!
//! One folder per layer, imports going downward only:
//!
//! | layer | folder | what it is |
//! |---|---|---|
//! | function | [`function`] | a PCI function and its transports (kernel VFIO, vfio-user): config space, BAR0 (uncached, write-combining), MSI-X, reset, device-visible memory, the pin budget |
//! | firmware | [`firmware`] | the command queue, bring-up ([`Hca`]), firmware pages, the event queue and its thread, health, PD / UAR / memory keys, where a peer's MAC comes from |
//! | RDMA | [`rdma`] | CQs, QPs, work queues, WQE builders, rings, BlueFlame |
//! | provider | [`provider`] | rnic-core's `Provider` on all of the above |
//!
//! Below them, shared by all: [`Mlx5Error`] (with the hot path's
//! [`PostFailure`] and [`Refused`]) and the system calls (`sys`). Within
//! the firmware layer `init.rs` defines [`Hca`] from the state the other
//! modules keep, and they extend it with their commands (`impl Hca` filed by
//! subsystem). The firmware layer reaches the RDMA layer's queues only
//! through what it defines: [`firmware::events`]' completion notifier and
//! the health module's flush hook, which the RDMA layer's queues implement.
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
//! - **[`Hca`]** ([`firmware::init`]): a brought-up function. [`Hca::bring_up`] runs
//!   mlx5.md §3 in order (reset if left initialized, cmdif revision 5, wait
//!   for firmware, command queue, ENABLE_HCA, ISSI, boot pages, host
//!   endianness, general and RoCE caps, init pages, INIT_HCA,
//!   SET_DRIVER_VERSION, re-query, ALLOC_UAR, ALLOC_PD); dropping it (or
//!   [`Hca::shutdown`]) tears down in reverse and takes every page back
//!   before the DMA buffers are unmapped. [`Hca::info`] reports versions,
//!   capabilities and pages.
//! - **[`CmdQueue`]** ([`firmware::cmd`]): the command interface of mlx5.md §4 — one
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
//! - **File-backed device memory** ([`function::memory`]): memfd mappings (2 MiB
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

mod error;
pub mod firmware;
pub mod function;
pub mod port;
pub mod provider;
pub mod rdma;
mod sys;

pub use error::{Mlx5Error, UserMemoryProblem};
pub use firmware::events::{EventCounters, HealthPoller};
pub use firmware::health::{Fatal, HealthReport, HealthWarning};
pub use firmware::init::{
    DoorbellPath, FwVersion, Hca, HcaInfo, HcaOptions, Health, PageCounts, PortType, ResetPolicy,
};
pub use firmware::neigh::{Neighbour, NeighbourOptions, NeighbourSource};
pub use firmware::resources::{Mkey, Traffic, VportCounters};
pub use firmware::{CmdQueue, CmdQueueOptions};
pub use function::{
    BlockWindow, DmaBuffer, FunctionId, IovaSpace, PCI_BAR_PREFETCHABLE, PCI_BAR0, PCI_COMMAND,
    PCI_COMMAND_MASTER, PCI_COMMAND_MEMORY, PCI_DEVICE_ID, PCI_VENDOR_ID, PciFunction,
    SharedMemory, SharedPages, Sharing, UAR_PAGE_SIZE, UserPages, Vector, VfioFunction,
    VfioUserFunction, VfioUserMapper,
};
pub use provider::{Mlx5Ah, Mlx5Cq, Mlx5Domain, Mlx5Mr, Mlx5Pd, Mlx5Provider, Mlx5Qp};
pub use rdma::cq::{Cq, CqCounters, SendCompletion};
pub use rdma::qp::{Qp, QpOptions};
pub use rdma::wq::QpCounters;
pub use rdma::wq::UdSegment;
pub use rdma::wqe::{DatagramTemplate, PostFailure, Refused};

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
