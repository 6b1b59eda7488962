//! # rnic — userspace RDMA
//!
//! rnic drives RDMA NICs entirely from userspace. A ConnectX (mlx5) function
//! bound to `vfio-pci` is owned through VFIO; where no RNIC exists, the same
//! API runs on a software backend that speaks RoCEv2 exactly like Linux
//! Soft-RoCE (`rdma_rxe`), so it interoperates with kernel rxe peers.
//!
//! This crate is the facade applications depend on. It re-exports:
//!
//! * [`core`] (`rnic-core`): the verbs object model — newtypes (`Qpn`,
//!   `Psn`, `Gid`, …), protection domains, memory regions, completion queues,
//!   queue pairs, work requests and completions, the `Provider` trait every
//!   driver implements, credit-based flow control, and the ibv_rc_pingpong
//!   endpoint exchange;
//! * [`roce`] (`rnic-roce`): RoCEv2 as a sans-IO library — wire headers,
//!   ICRC, and (as it lands) the RC/UD transport;
//! * [`rxe`] (`rnic-rxe`, feature `rxe`, default): the Soft-RoCE-compatible
//!   software backend;
//! * [`open`]: a device from a spec string, as a `rnic_core::Context`;
//! * [`spec`]: the device-spec strings (`rxe:<netdev|ip>`, `mlx5:<pci bdf>`)
//!   users pick a backend with.
//!
//! Which crate owns what, and the invariants each keeps, are in
//! `docs/architecture.md`.
#![forbid(unsafe_code)]

pub mod spec;

mod open;

pub use open::{OpenError, open};
pub use rnic_core as core;
pub use rnic_dma as dma;
pub use rnic_roce as roce;
#[cfg(feature = "rxe")]
pub use rnic_rxe as rxe;
pub use spec::{DeviceSpec, RxeTarget, SpecError};
