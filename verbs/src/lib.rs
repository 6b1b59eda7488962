//! rnic-verbs: a drop-in `libibverbs.so.1` on rnic.
//!
//! Unmodified verbs programs — rdma-core's `ibv_*` tools, perftest, UCX —
//! run on rnic's userspace stack with `LD_LIBRARY_PATH=target/release/verbs`:
//! no `rdma_rxe` module, no `/dev/infiniband`, no root for the library itself.
//! Devices are rnic devices (`rnic_lo`, `rnic_<netdev>` on the rxe backend,
//! mlx5 functions by spec, emulated ones included).
//!
//! # What it owns
//!
//! * **The ABI** ([`abi`]): the C structures exactly as Debian 12's
//!   `<infiniband/verbs.h>` (rdma-core 44) lays them out, checked field by
//!   field against the system header by a test that compiles C; the
//!   `verbs_context` whose size and operations let the header's inline
//!   functions (`ibv_post_send`, `ibv_poll_cq`, `ibv_query_port`,
//!   `ibv_create_qp_ex`, `ibv_wr_*`, …) dispatch straight into rnic.
//! * **The exports** ([`exports`], `libibverbs.map`): the 180 versioned
//!   symbols of Debian's library, bound to their versions with `.symver`
//!   (the 13 version nodes, default and compat versions), and nothing else.
//! * **Devices** ([`device`]): `RNIC_DEVICES=[name=]spec,…`, or every
//!   interface with an address as `rnic_<netdev>` plus every ConnectX
//!   function bound to vfio-pci; GIDs as kernel rxe reports them.
//! * **Shared receive queues** ([`srq`]): emulated on rnic's per-QP receive
//!   queues (UCX's `rc_verbs` needs them).
//! * **Objects** ([`context`], [`pd`], [`cq`], [`qp`]): each C object is the
//!   first field of a `#[repr(C)]` Rust object holding the rnic object it
//!   stands for, so a C pointer is the Rust object's address. Control-path
//!   calls map onto rnic's API; the per-request calls (`post_send`,
//!   `post_recv`, `poll_cq`, the `ibv_wr_*` builder) convert the C request
//!   on the stack and call rnic's queue directly under the object's lock.
//! * **Registered memory** ([`memory`]): an application's buffer as an rnic
//!   [`rnic::core::Memory`] (raw-pointer copies, never a reference), revoked
//!   at `ibv_dereg_mr` so that no remote access can reach freed memory.
//!
//! # Invariants
//!
//! * No export is missing and none is extra: the link fails on a name of
//!   `libibverbs.map` without a definition, and `tests/exports.rs` compares
//!   the built library's `name@version` list with the system library's.
//! * A C object outlives every object that points to it: `ibv_dealloc_pd`,
//!   `ibv_destroy_cq` and `ibv_destroy_comp_channel` refuse with `EBUSY`
//!   while children exist, as the kernel does; `ibv_close_device` succeeds
//!   (as rdma-core's does) but keeps a context with children allocated.
//! * Nothing panics across the C boundary; every failure returns the code
//!   libibverbs documents with `errno` set, and unsupported verbs answer
//!   `EOPNOTSUPP` (or `ENOSYS` where rdma-core does).
//! * After `ibv_dereg_mr` returns, rnic never touches the region's memory.
//!
//! # Example
//!
//! ```sh
//! verbs/install.sh                                   # builds target/release/verbs/
//! LD_LIBRARY_PATH=$PWD/target/release/verbs ibv_devinfo -v
//! LD_LIBRARY_PATH=$PWD/target/release/verbs ib_write_bw -d rnic_lo &
//! LD_LIBRARY_PATH=$PWD/target/release/verbs ib_write_bw -d rnic_lo 127.0.0.1
//! ```
//!
//! docs/verbs-abi.md has the supported verbs, what is not and why.

pub mod abi;
pub mod context;
pub mod cq;
pub mod device;
pub mod exports;
pub mod memory;
pub mod misc;
pub mod pd;
pub mod qp;
pub mod srq;
pub mod unsupported;

#[cfg(test)]
mod abi_tests;

use std::ffi::c_int;

use rnic::core::{DeviceErrorKind, PostError, VerbsError};

/// Set the calling thread's `errno`.
pub(crate) fn set_errno(e: c_int) {
    nix::errno::Errno::set_raw(e);
}

/// `errno = e`, and the value libibverbs' int-returning verbs return: `e`.
pub(crate) fn fail(e: c_int) -> c_int {
    set_errno(e);
    e
}

/// `errno = e`, and `-1` (the verbs that report failure as -1).
pub(crate) fn fail_neg(e: c_int) -> c_int {
    set_errno(e);
    -1
}

/// `errno = e`, and NULL.
pub(crate) fn fail_null<T>(e: c_int) -> *mut T {
    set_errno(e);
    std::ptr::null_mut()
}

/// Print a control-path failure on stderr (rdma-core is silent and the
/// tools only say "Couldn't …"; this says why and what to do), unless
/// `RNIC_VERBS_QUIET` is set.
pub(crate) fn warn(what: std::fmt::Arguments<'_>) {
    static QUIET: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if !*QUIET.get_or_init(|| std::env::var_os("RNIC_VERBS_QUIET").is_some_and(|v| v != "0")) {
        eprintln!("rnic-verbs: {what}");
    }
}

/// The errno a failed rnic verb maps to.
pub(crate) fn errno_of(e: &VerbsError) -> c_int {
    match e {
        VerbsError::NotSupported { .. } => libc::EOPNOTSUPP,
        VerbsError::UnreachableMemory { .. } => libc::EFAULT,
        VerbsError::CqOversubscribed { .. } => libc::ENOMEM,
        VerbsError::PostSend { reason, .. } | VerbsError::PostRecv { reason, .. } => {
            post_errno(reason)
        }
        VerbsError::QueryDevice { source }
        | VerbsError::QueryPort { source, .. }
        | VerbsError::QueryGid { source, .. }
        | VerbsError::AllocPd { source }
        | VerbsError::RegMr { source, .. }
        | VerbsError::CreateCq { source, .. }
        | VerbsError::CreateQp { source }
        | VerbsError::CreateAh { source }
        | VerbsError::ModifyQp { source, .. }
        | VerbsError::QueryQp { source, .. }
        | VerbsError::PollCq { source }
        | VerbsError::ReqNotifyCq { source }
        | VerbsError::WaitCq { source } => device_errno(source),
        _ => libc::EINVAL,
    }
}

/// The errno of a driver failure.
pub(crate) fn device_errno(e: &rnic::core::DeviceError) -> c_int {
    match e.kind {
        DeviceErrorKind::NoResources => libc::ENOMEM,
        DeviceErrorKind::InvalidArgument => libc::EINVAL,
        DeviceErrorKind::NotFound => libc::ENOENT,
        DeviceErrorKind::Unsupported => libc::EOPNOTSUPP,
        DeviceErrorKind::Os => c_int::try_from(e.status).unwrap_or(libc::EIO),
        _ => libc::EIO,
    }
}

/// The errno of a refused post: a full queue or CQ is `ENOMEM` (what
/// rdma-core's providers return), a malformed request or wrong state
/// `EINVAL`.
pub(crate) fn post_errno(e: &PostError) -> c_int {
    match e {
        PostError::QueueFull { .. } | PostError::CqFull { .. } => libc::ENOMEM,
        PostError::Device(d) => device_errno(d),
        _ => libc::EINVAL,
    }
}

/// Copy `s` into a C char array, NUL-terminated, truncated to fit.
pub(crate) fn copy_cstr(dst: &mut [std::ffi::c_char], s: &str) {
    let n = s.len().min(dst.len().saturating_sub(1));
    for (d, b) in dst.iter_mut().zip(s.as_bytes()[..n].iter()) {
        *d = *b as std::ffi::c_char;
    }
    if let Some(z) = dst.get_mut(n) {
        *z = 0;
    }
}
