//! rnic-mlx5-emu: an emulated ConnectX-5 PCI function (15b3:1017) served
//! over vfio-user, so the real mlx5 driver (rnic-mlx5's
//! `VfioUserFunction`) runs end to end without hardware.
//!
//! This crate is the device *shell* — PCI, BAR0, DMA, interrupts and the
//! doorbell hook — and the strict [`firmware`] behind that hook (command
//! interface, life cycle, pages, capabilities, UAR/PD/TD, vport queries), the
//! default of [`Emulator::start`], with its [`hca`]: GID table and RoCE v2
//! addresses (UDP/4791), EQs, CQs, MKeys, RC/UD QPs and the data path over the
//! rnic-roce transport engine. Other firmware plugs in through
//! [`DoorbellHandler`] ([`Emulator::start_with`]).
//!
//! # What it owns
//!
//! - **Config space** ([`config`]): IDs, class 0x020000, command register,
//!   BAR0 as a 64-bit 32 MiB memory BAR, prefetchable only when advertised as
//!   write-combining ([`Bar0Mapping`]; size probing works),
//!   an MSI-X capability (64 vectors) whose table and PBA lie in BAR0.
//! - **BAR0** ([`bar`]): a size-sealed memfd, offered to the client as one
//!   sparse-mmap area covering all of it, so doorbell writes land in shared
//!   memory with no message per write. The initialization segment at offset 0
//!   (fw_rev, cmdif_rev = 5, cmdq address registers, command doorbell,
//!   `initializing`, health buffer, health counter, internal timer).
//! - **DMA** ([`dma`]): the client's `DMA_MAP`s (mmaps of the fds it
//!   passed); every device access goes through them only, and an access
//!   outside them is a typed, counted, logged [`DmaFault`] that touches
//!   nothing.
//! - **MSI-X** ([`irq`]): eventfds from `SET_IRQS`, masking, [`Device::signal`].
//! - **The watcher** ([`watch`]): adaptive polling of the command doorbell,
//!   the cmdq address registers and the watched UAR pages, delivering events
//!   to the [`DoorbellHandler`].
//! - **The firmware** ([`firmware`]): executes commands from the driver's
//!   command queue through DMA only, refuses every broken transport or
//!   command with the status mlx5.md names and a stable syndrome, and offers
//!   fault hooks ([`Faults`]) and accounting ([`Accounting`]) to tests.
//! - **The server** ([`Emulator`]): socket handling (stale sockets removed
//!   only if nothing listens), one driver at a time, panics of the vfio-user
//!   crate contained, power-on reset between drivers.
//!
//! # Invariants
//!
//! - No device access reaches host memory outside a live mapping; unmap
//!   waits for accesses in flight, and mappings are `Arc`s so a late holder
//!   never touches unmapped memory.
//! - No `&[u8]` into memory shared with the driver (BAR0, DMA mappings):
//!   atomics only.
//! - Nothing a client sends panics the emulator's own code; the crate's
//!   VERSION-handler panics are caught per connection.
//! - All system calls are in one module (`sys`).
//!
//! # Example
//!
//! ```no_run
//! use rnic_mlx5_emu::{Device, DoorbellHandler, Emulator, Options};
//!
//! struct Fw;
//! impl DoorbellHandler for Fw {
//!     fn command_doorbell(&mut self, dev: &Device, bits: u32) {
//!         println!("slots {bits:#x} rung; cmdq at {:#x}", dev.bar().read32_be(0x14));
//!     }
//!     fn uar_doorbell(&mut self, _dev: &Device, page: u32, offset: u32, value: u64) {
//!         println!("UAR {page} +{offset:#x} = {value:#x}");
//!     }
//! }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let emu = Emulator::start_with("/tmp/mlx5.sock", Options::default(), Box::new(Fw))?;
//! emu.device().watch_uar(3)?;
//! // ... a driver connects with rnic_mlx5::VfioUserFunction::connect("/tmp/mlx5.sock") ...
//! emu.shutdown();
//! # Ok(())
//! # }
//! ```
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod bar;
pub mod config;
pub mod control;
pub mod device;
pub mod dma;
mod error;
pub mod eth;
pub mod firmware;
pub mod hca;
pub mod irq;
pub mod report;
pub mod server;
mod sys;
mod temp;
pub mod watch;

pub use bar::{BAR0_SIZE, FwRev};
pub use device::{Bar0Mapping, Device, DeviceStats, Options};
pub use dma::{DmaFault, FaultKind};
pub use error::EmuError;
pub use eth::{PortCounters, PortStats, Wire};
pub use firmware::{
    Accounting, Faults, Firmware, FirmwareHandle, FirmwareOptions, FirmwareStats, Phase, PortSpeed,
    PortType, Strictness,
};
pub use hca::HcaStats;
pub use irq::Signal;
pub use server::{AfterDisconnect, Disconnect, Emulator};
pub use temp::TempFunction;
pub use watch::{DoorbellHandler, NoFirmware};
