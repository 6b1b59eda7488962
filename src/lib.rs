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
//!   queue pairs, address handles, work requests and completions, the
//!   `Provider` contract every driver implements (driver-owned queues on
//!   `&mut`), credit-based flow control, and the ibv_rc_pingpong
//!   endpoint exchange;
//! * [`roce`] (`rnic-roce`): RoCEv2 as a sans-IO library — wire headers,
//!   ICRC, and (as it lands) the RC/UD transport;
//! * [`rxe`] (`rnic-rxe`, feature `rxe`, default): the Soft-RoCE-compatible
//!   software backend;
//! * `mlx5` (`rnic-mlx5`, feature `mlx5`, default): the ConnectX driver;
//!   `open_mlx5` gives the typed provider (for `alloc_dma`: an mlx5
//!   function registers only its own DMA buffers);
//! * `gpu` (`rnic-gpu`, feature `gpu`, off by default): VRAM as a registrable
//!   region (staged on rxe), copy engines, the CUDA driver probe; feature
//!   `gpu-topology` adds hwloc topology (needs libhwloc-dev to build);
//! * [`open`]: a device from a spec string, as a `rnic_core::Context`;
//!   [`open_with_memory`] adds the [`MemorySource`] its buffers must come
//!   from (host memory for rxe, the function's DMA buffers for mlx5);
//! * [`spec`]: the device-spec strings (`rxe:<netdev|ip>`, `mlx5:<pci bdf>`,
//!   `mlx5:vfio-user:<socket>`)
//!   users pick a backend with.
//!
//! `rnic::open` returns a `Context` over the driver behind dynamic dispatch
//! (one indirect call per post and per poll, straight into the driver's
//! queue object); a program that names the driver (`RxeDevice::typed_context`,
//! `Context<RxeProvider>`) dispatches statically. The README's example:
//!
//! ```rust,no_run
//! use std::sync::Arc;
//! use rnic::core::{AccessFlags, HeapMemory, QpCaps, QpInitAttr, QpType, SendWr, WorkCompletion};
//!
//! let ctx = rnic::open("rxe:127.0.0.1")?;            // or rxe:eth0, rxe:fe80::1, mlx5:0000:3b:00.1
//! let pd = ctx.alloc_pd()?;
//! let mr = pd.reg_mr(Arc::new(HeapMemory::new(1 << 20)), AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
//! // A CQ deep enough for its queues: each QP reserves its depth once, so no
//! // post or poll touches a shared counter (ctx.create_cq(n) shares n credits
//! // among any number of queues instead). Either way the CQ cannot overflow.
//! let mut cq = ctx.create_cq_reserved(256)?;
//! let mut qp = pd.create_qp(&cq, &cq, &QpInitAttr::new(QpType::Rc, QpCaps::default()))?;
//! // exchange endpoints (rnic::core::exchange), then qp.to_init / to_rtr / to_rts, and:
//! let sge = [mr.sge(0, 64)?];
//! # let (remote_addr, rkey) = (0u64, mr.rkey());
//! qp.post_send(&[SendWr::rdma_write(1, &sge, remote_addr, rkey).signaled()])?; // &mut qp: one poster
//! let mut wcs = [WorkCompletion::default(); 16];
//! let n = cq.poll(&mut wcs)?;                          // &mut cq: one poller; share either with a Mutex
//! # let _ = n;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Which crate owns what, and the invariants each keeps, are in
//! `docs/architecture.md`.
#![forbid(unsafe_code)]

pub mod spec;

mod open;

#[cfg(feature = "mlx5")]
pub use open::open_mlx5;
pub use open::{AllocError, MemorySource, OpenError, open, open_with_memory};
pub use rnic_core as core;
pub use rnic_dma as dma;
#[cfg(feature = "gpu")]
pub use rnic_gpu as gpu;
#[cfg(feature = "mlx5")]
pub use rnic_mlx5 as mlx5;
pub use rnic_roce as roce;
#[cfg(feature = "rxe")]
pub use rnic_rxe as rxe;
pub use spec::{DeviceSpec, Mlx5SpecOptions, Mlx5Target, NeighbourMode, RxeTarget, SpecError};

/// An error and its sources, `: `-separated, each thing said once: a
/// source whose text the message already holds (a `thiserror` message that
/// embeds `{source}`) is not repeated.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut m = e.to_string();
    let mut s = e.source();
    while let Some(c) = s {
        let t = c.to_string();
        if !m.contains(&t) {
            m += ": ";
            m += &t;
        }
        s = c.source();
    }
    m
}
