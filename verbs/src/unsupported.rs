//! Exports rnic does not implement, each answering as libibverbs documents
//! for an unsupported operation: `EOPNOTSUPP` with errno set (NULL for
//! functions returning objects), never a crash, never a silent success.
//!
//! * Multicast, dma-buf and imported objects, ECE, L2 resolution: rnic has
//!   none of them (docs/verbs-abi.md says why).
//! * The 33 `@IBVERBS_1.0` compatibility versions: the pre-2007 ABI with
//!   other structure layouts; no binary built since uses them. `ENOSYS`.
//! * `IBVERBS_PRIVATE_34`: the provider interface of rdma-core (the
//!   `ibv_cmd_*` kernel commands, context and driver registration). rnic is
//!   not a provider; the real `libmlx5`/`libefa` that perftest loads call
//!   `verbs_register_driver_34` from their constructors, which therefore
//!   accepts and ignores them. The kernel commands answer `ENOSYS`: there
//!   is no kernel.

use std::ffi::{c_char, c_int, c_uint, c_void};

use crate::abi::{ibv_comp_channel, ibv_context, ibv_cq, ibv_gid, ibv_mr, ibv_pd, ibv_qp};
use crate::{fail, fail_neg, fail_null};

/// `ibv_attach_mcast`: no multicast on rnic.
pub extern "C" fn ibv_attach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, lid: u16) -> c_int {
    let _ = (qp, gid, lid);
    fail(libc::EOPNOTSUPP)
}

/// `ibv_detach_mcast`.
pub extern "C" fn ibv_detach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, lid: u16) -> c_int {
    let _ = (qp, gid, lid);
    fail(libc::EOPNOTSUPP)
}

/// `ibv_reg_dmabuf_mr`: registering dma-buf file descriptors is not wired
/// into this library.
pub extern "C" fn ibv_reg_dmabuf_mr(
    pd: *mut ibv_pd,
    offset: u64,
    length: usize,
    iova: u64,
    fd: c_int,
    access: c_int,
) -> *mut ibv_mr {
    let _ = (pd, offset, length, iova, fd, access);
    fail_null(libc::EOPNOTSUPP)
}

/// `ibv_import_device`: contexts cannot be shared through a command fd.
pub extern "C" fn ibv_import_device(cmd_fd: c_int) -> *mut ibv_context {
    let _ = cmd_fd;
    fail_null(libc::EOPNOTSUPP)
}

/// `ibv_import_pd`.
pub extern "C" fn ibv_import_pd(ctx: *mut ibv_context, handle: u32) -> *mut ibv_pd {
    let _ = (ctx, handle);
    fail_null(libc::EOPNOTSUPP)
}

/// `ibv_import_mr`.
pub extern "C" fn ibv_import_mr(pd: *mut ibv_pd, handle: u32) -> *mut ibv_mr {
    let _ = (pd, handle);
    fail_null(libc::EOPNOTSUPP)
}

/// `ibv_import_dm`.
pub extern "C" fn ibv_import_dm(ctx: *mut ibv_context, handle: u32) -> *mut c_void {
    let _ = (ctx, handle);
    fail_null(libc::EOPNOTSUPP)
}

/// `ibv_unimport_pd`: nothing can have been imported.
pub extern "C" fn ibv_unimport_pd(pd: *mut ibv_pd) {
    let _ = pd;
}

/// `ibv_unimport_mr`: nothing can have been imported.
pub extern "C" fn ibv_unimport_mr(mr: *mut ibv_mr) {
    let _ = mr;
}

/// `ibv_unimport_dm`: nothing can have been imported.
pub extern "C" fn ibv_unimport_dm(dm: *mut c_void) {
    let _ = dm;
}

/// `ibv_query_ece`: no enhanced connection establishment (it is a CM
/// feature, and the CM needs the kernel).
pub extern "C" fn ibv_query_ece(qp: *mut ibv_qp, ece: *mut c_void) -> c_int {
    let _ = (qp, ece);
    fail(libc::EOPNOTSUPP)
}

/// `ibv_set_ece`.
pub extern "C" fn ibv_set_ece(qp: *mut ibv_qp, ece: *mut c_void) -> c_int {
    let _ = (qp, ece);
    fail(libc::EOPNOTSUPP)
}

/// `ibv_query_qp_data_in_order`: 0, "no ordering guarantee beyond the
/// verbs' own" (what rdma-core answers for a device that does not say).
pub extern "C" fn ibv_query_qp_data_in_order(qp: *mut ibv_qp, op: c_int, flags: u32) -> c_int {
    let _ = (qp, op, flags);
    0
}

/// `ibv_resolve_eth_l2_from_gid`: rnic resolves MACs itself when a QP or
/// AH is created; this netlink helper of rdma-core's is not offered.
pub extern "C" fn ibv_resolve_eth_l2_from_gid(
    ctx: *mut ibv_context,
    attr: *mut c_void,
    mac: *mut u8,
    vid: *mut u16,
) -> c_int {
    let _ = (ctx, attr, mac, vid);
    fail_neg(libc::EOPNOTSUPP)
}

/// `ibv_register_driver@IBVERBS_1.1`: the pre-provider-ABI registration;
/// there is no driver to register with.
pub extern "C" fn ibv_register_driver(name: *const c_char, init: *mut c_void) {
    let _ = (name, init);
}

/// The `@IBVERBS_1.0` versions that return an object: NULL, `ENOSYS`.
pub extern "C" fn compat_null() -> *mut c_void {
    fail_null(libc::ENOSYS)
}

/// The `@IBVERBS_1.0` versions that return an errno: `ENOSYS`.
pub extern "C" fn compat_errno() -> c_int {
    fail(libc::ENOSYS)
}

/// The `@IBVERBS_1.0` versions that return -1 on failure.
pub extern "C" fn compat_neg() -> c_int {
    fail_neg(libc::ENOSYS)
}

/// The `@IBVERBS_1.0` versions that return nothing.
pub extern "C" fn compat_void() {
    crate::set_errno(libc::ENOSYS);
}

/// `ibv_get_device_guid@IBVERBS_1.0`: 0.
pub extern "C" fn compat_guid() -> u64 {
    crate::set_errno(libc::ENOSYS);
    0
}

/// Every `ibv_cmd_*` (IBVERBS_PRIVATE_34): a kernel command, `ENOSYS`.
/// All of them return an errno as `int`; the arguments, passed in
/// registers by the caller, are not read.
pub extern "C" fn cmd_enosys() -> c_int {
    fail(libc::ENOSYS)
}

/// `execute_ioctl`: no uverbs ioctl without a kernel.
pub extern "C" fn execute_ioctl() -> c_int {
    fail(libc::ENOSYS)
}

/// `__ioctl_final_num_attrs(num_attrs, link)`: the count it is given (no
/// command buffer is ever built here).
pub extern "C" fn ioctl_final_num_attrs(num_attrs: c_uint, link: *mut c_void) -> c_uint {
    let _ = link;
    num_attrs
}

/// `__verbs_log(ctx, level, fmt, ...)`: providers' debug log; nothing to
/// log to (the variadic arguments are not read, which the x86-64 calling
/// convention allows).
pub extern "C" fn verbs_log(ctx: *mut c_void, level: u32, fmt: *const c_char) {
    let _ = (ctx, level, fmt);
}

/// `_verbs_init_and_alloc_context`: only a provider's `alloc_context`
/// calls it, and no provider is ever asked for a context here.
pub extern "C" fn verbs_init_and_alloc_context() -> *mut c_void {
    fail_null(libc::ENOSYS)
}

/// `verbs_open_device`: likewise a provider's.
pub extern "C" fn verbs_open_device() -> *mut c_void {
    fail_null(libc::ENOSYS)
}

/// `verbs_init_cq(cq, context, channel, cq_context)`: initialize the
/// generic fields of a provider's CQ, as rdma-core does.
///
/// # Safety
///
/// `cq` is NULL or points to a writable `ibv_cq`.
pub unsafe extern "C" fn verbs_init_cq(
    cq: *mut ibv_cq,
    ctx: *mut ibv_context,
    channel: *mut ibv_comp_channel,
    cq_context: *mut c_void,
) {
    if cq.is_null() {
        return;
    }
    // SAFETY: the caller's CQ structure.
    let c = unsafe { &mut *cq };
    c.context = ctx;
    c.channel = channel;
    c.cq_context = cq_context;
    c.comp_events_completed = 0;
    c.async_events_completed = 0;
    c.mutex = libc::PTHREAD_MUTEX_INITIALIZER;
    c.cond = libc::PTHREAD_COND_INITIALIZER;
}

/// `verbs_set_ops`, `verbs_uninit_context`: providers' context setup; no
/// provider context exists here.
pub extern "C" fn provider_noop(ctx: *mut c_void, ops: *const c_void) {
    let _ = (ctx, ops);
}

/// `verbs_register_driver_34(ops)`: called by the constructors of real
/// provider libraries loaded beside this one (perftest links libmlx5 and
/// libefa). They are accepted and never used: rnic's devices are its own.
pub extern "C" fn verbs_register_driver(ops: *const c_void) {
    let _ = ops;
}

/// `ibv_read_ibdev_sysfs_file(buf, size, sysfs_dev, fmt, ...)`: providers
/// read their device's sysfs through it; there is no provider device.
pub extern "C" fn ibv_read_ibdev_sysfs_file() -> c_int {
    fail_neg(libc::ENOSYS)
}
