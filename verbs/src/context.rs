//! Device contexts: `ibv_open_device` / `ibv_close_device`, the queries
//! (`ibv_query_device[_ex]`, `ibv_query_port`, `ibv_query_gid[_ex|_table]`,
//! `ibv_query_pkey`), and asynchronous events.
//!
//! A [`Context`] starts with a `verbs_context` whose last member is the
//! `ibv_context` applications hold: the header's `verbs_get_ctx` finds the
//! extended operations at `ibv_context - 320` once `abi_compat` says
//! "extended" and `sz` is 648 (so even `query_port`, at offset 0, is
//! reached). The per-request operations (`poll_cq`, `req_notify_cq`,
//! `post_send`, `post_recv`) sit in `ibv_context.ops`, where the inline
//! `ibv_post_send` & co. look for them.
//!
//! # Progress
//!
//! An rxe device runs rnic-rxe's progress thread by default
//! (`RNIC_VERBS_PROGRESS=thread`): a stock `ib_write_bw` server never
//! polls while the client writes, and programs that sleep in `poll(2)` on a
//! completion channel's fd need someone to receive. `RNIC_VERBS_PROGRESS=
//! caller` makes progress only inside the application's verbs calls
//! (`ibv_poll_cq`, posts, `ibv_get_cq_event`), as `rnicctl perf` does when
//! busy-polling: no progress thread, lower latency. ACKs a round defers
//! to leave with the program's next post are swept out by a small thread
//! after 10–20 ms without a call (`RNIC_VERBS_ACK_SWEEP_US`), so a program
//! that stops calling after its last completion does not leave its peer
//! waiting.
//!
//! The progress thread runs under `SCHED_FIFO` priority 1 where the
//! process may (`RNIC_VERBS_PROGRESS_PRIORITY=N` picks another, `0` the
//! normal scheduler). A stock `ib_write_lat` spins on memory in both
//! processes; under the normal scheduler a packet's arrival waits until the
//! spinner's time slice ends (1.8 ms per iteration on two vCPUs), while a
//! real-time thread preempts it at once, as kernel rxe's softirq would.
//!
//! Even so, waking a thread costs 10–20 µs on these vCPUs, once per
//! message if the progress thread receives every packet. So the device
//! hands receiving to the application while it polls
//! (`RNIC_VERBS_HANDOFF_US`, default 50, `0`: off; rnic-rxe's
//! `RxeConfig::poll_handoff`): an empty `ibv_poll_cq` takes the sockets
//! from the thread, and ACKs a round produces alone wait up to 50 µs for
//! the program's next post on that QP, which carries them in its own
//! datagram. In `ib_write_lat`'s ping-pong the peer, polling for its
//! write's completion, then receives our answer in that same poll: after
//! the first message every packet is received by a polling application
//! thread and the progress threads stay asleep. A QP whose program never
//! posts (a passive `ib_write_bw` server) has its first ACK held once and
//! then none.

use std::collections::VecDeque;
use std::ffi::{c_int, c_void};
use std::os::fd::{AsFd, AsRawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};

use nix::sys::eventfd::{EfdFlags, EventFd};
use parking_lot::Mutex;
use rnic::MemorySource;
use rnic::core::{AtomicCap, DeviceAttr, GidEntry, GidType, LinkLayer, PortAttr, PortState};
use rnic::rxe::{Progress, ProgressScheduling, RxeConfig, RxeDevice};

use crate::abi::{
    IBV_DEVICE_RC_RNR_NAK_GEN, IBV_DEVICE_SYS_IMAGE_GUID, IBV_GID_TYPE_ROCE_V1,
    IBV_GID_TYPE_ROCE_V2, IBV_GID_TYPE_SYSFS_IB_ROCE_V1, IBV_GID_TYPE_SYSFS_ROCE_V2,
    IBV_LINK_LAYER_ETHERNET, IBV_LINK_LAYER_INFINIBAND, IBV_PORT_CM_SUP, IBV_PORT_IP_BASED_GIDS,
    Shared, VERBS_ABI_IS_EXTENDED, VERBS_CONTEXT_OFFSET, ibv_async_event, ibv_context, ibv_device,
    ibv_device_attr, ibv_device_attr_ex, ibv_gid, ibv_gid_entry, ibv_port_attr,
    ibv_query_device_ex_input, verbs_context, zeroed,
};
use crate::device::{Backend, Device};
use crate::{copy_cstr, fail, fail_neg, fail_null, warn};

/// How an rxe device makes progress (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgressMode {
    /// rnic-rxe's progress thread (the default).
    Thread,
    /// Inside the application's calls only.
    Caller,
}

impl ProgressMode {
    /// `RNIC_VERBS_PROGRESS`: `thread` (default) or `caller`.
    pub fn from_env() -> ProgressMode {
        match std::env::var("RNIC_VERBS_PROGRESS").as_deref() {
            Ok("caller") => ProgressMode::Caller,
            Ok("thread") | Ok("") | Err(_) => ProgressMode::Thread,
            Ok(other) => {
                warn(format_args!(
                    "RNIC_VERBS_PROGRESS={other:?} is neither \"thread\" nor \"caller\": using thread"
                ));
                ProgressMode::Thread
            }
        }
    }
}

/// Asynchronous events waiting for `ibv_get_async_event`: a queue, and an
/// eventfd (semaphore mode: one read per event) that is `async_fd`, so
/// applications can poll it, set it non-blocking, or put it in epoll.
pub struct AsyncEvents {
    fd: EventFd,
    queue: Mutex<VecDeque<ibv_async_event>>,
}

// SAFETY: the queued events hold raw pointers to this context's objects,
// which any thread may receive (as with rdma-core's async fd).
unsafe impl Send for AsyncEvents {}
// SAFETY: as above; the queue is behind a mutex.
unsafe impl Sync for AsyncEvents {}

impl std::fmt::Debug for AsyncEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncEvents")
            .field("fd", &self.fd.as_fd().as_raw_fd())
            .field("queued", &self.queue.lock().len())
            .finish()
    }
}

impl AsyncEvents {
    fn new() -> std::io::Result<AsyncEvents> {
        let fd = EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_SEMAPHORE)?;
        Ok(AsyncEvents {
            fd,
            queue: Mutex::new(VecDeque::new()),
        })
    }

    /// Queue `event` and wake a reader.
    pub fn push(&self, event: ibv_async_event) {
        self.queue.lock().push_back(event);
        let _ = self.fd.write(1);
    }
}

/// An open device. `vctx` comes first: an `ibv_context *` is this object's
/// address plus 320.
#[repr(C)]
#[derive(Debug)]
pub struct Context {
    /// The C structures (`verbs_context`, ending in `ibv_context`).
    pub vctx: Shared<verbs_context>,
    /// The listed device.
    pub dev: &'static Device,
    /// rnic's context.
    pub rnic: rnic::core::Context,
    /// Where registrable memory comes from (host memory for rxe; an mlx5
    /// function's DMA buffers).
    pub mem: MemorySource,
    /// The rxe device, for its progress mode and counters.
    pub rxe: Option<RxeDevice>,
    /// How progress is made.
    pub progress: ProgressMode,
    /// Device capabilities, read at open.
    pub attr: DeviceAttr,
    /// Port 1, read at open.
    pub port: PortAttr,
    /// Port 1's GID table, read at open.
    pub gids: Vec<GidEntry>,
    /// Asynchronous events.
    pub events: AsyncEvents,
    /// Objects created on it and not destroyed (`ibv_close_device` keeps
    /// the context while any is left).
    pub children: AtomicUsize,
    /// QPs attached to an SRQ, by QPN (their addresses): `ibv_poll_cq`
    /// hands their receive completions to the SRQ emulation.
    pub srq_qps: parking_lot::RwLock<std::collections::HashMap<u32, usize>>,
    /// `srq_qps.len()`, read without the lock on every poll.
    pub srq_qp_count: AtomicUsize,
}

impl Context {
    /// The `ibv_context *` applications hold.
    pub fn as_ptr(&self) -> *mut ibv_context {
        // SAFETY: `vctx` is a live verbs_context; `context` is a field of it.
        unsafe { &raw mut (*self.vctx.get()).context }
    }

    /// The context behind an `ibv_context *` of this library.
    ///
    /// # Safety
    ///
    /// `ctx` came from [`ibv_open_device`] and was not closed.
    pub unsafe fn from_ptr<'a>(ctx: *mut ibv_context) -> &'a Context {
        // SAFETY: an ibv_context of this library is the `context` member of
        // the `verbs_context` that starts a `Context` (`repr(C)`), so the
        // object starts VERBS_CONTEXT_OFFSET bytes before it; the caller
        // guarantees it is open.
        unsafe {
            &*ctx
                .cast::<u8>()
                .wrapping_sub(VERBS_CONTEXT_OFFSET)
                .cast::<Context>()
        }
    }

    /// One more object on this context.
    pub fn adopt(&self) {
        self.children.fetch_add(1, Ordering::AcqRel);
    }

    /// One object fewer.
    pub fn release(&self) {
        self.children.fetch_sub(1, Ordering::AcqRel);
    }

    /// The backend's name (`rxe`, `mlx5`).
    pub fn backend(&self) -> &'static str {
        self.rnic.backend()
    }
}

/// The number in environment variable `name`, at most `max`; `default`
/// when it is unset or empty, and (with a warning) when it is not such a
/// number.
fn env_number(name: &str, default: u64, max: u64, what: &str) -> u64 {
    match std::env::var(name).as_deref() {
        Err(_) | Ok("") => default,
        Ok(v) => match v.parse::<u64>() {
            Ok(n) if n <= max => n,
            _ => {
                warn(format_args!("{name}={v:?} is not {what}: using {default}"));
                default
            }
        },
    }
}

/// `RNIC_VERBS_PROGRESS_PRIORITY`: the progress thread's `SCHED_FIFO`
/// priority (default 1; `0`: the normal scheduler).
fn progress_priority_from_env() -> Option<u8> {
    let p = env_number(
        "RNIC_VERBS_PROGRESS_PRIORITY",
        1,
        99,
        "0 (normal scheduling) or a SCHED_FIFO priority 1-99",
    );
    u8::try_from(p).ok().filter(|&p| p > 0)
}

/// `env_number` in microseconds, at most `max_us`; `0` means none.
fn env_micros(name: &str, default_us: u64, max_us: u64) -> Option<std::time::Duration> {
    let what = if max_us == u64::MAX {
        "a number of microseconds".to_owned()
    } else {
        format!("a number of microseconds up to {max_us}")
    };
    let us = env_number(name, default_us, max_us, &what);
    (us > 0).then(|| std::time::Duration::from_micros(us))
}

/// `RNIC_VERBS_ACK_SWEEP_US`: how often a caller-driven device's sweeper
/// looks for ACKs left queued (default 10 000 µs: under a peer's shortest
/// usual retransmission timeout, 67 ms at perftest's `-u 14`, and rare
/// enough not to disturb a spinning ping-pong; `0`: no sweeper, the
/// program's next call sends them).
fn ack_sweep_from_env() -> Option<std::time::Duration> {
    env_micros("RNIC_VERBS_ACK_SWEEP_US", 10_000, u64::MAX)
}

/// `RNIC_VERBS_HANDOFF_US`: how long a progress-thread device's ACKs wait
/// for the program's next post to carry them (default 50 µs; `0`: they
/// leave at once). See the module docs.
fn handoff_from_env() -> Option<std::time::Duration> {
    env_micros("RNIC_VERBS_HANDOFF_US", 50, 1_000_000)
}

/// Open the rnic device `dev` stands for.
fn open(dev: &'static Device) -> Result<Box<Context>, String> {
    let progress = ProgressMode::from_env();
    let (rnic_ctx, mem, rxe) = match &dev.info.backend {
        Backend::Rxe(target) => {
            let cfg = RxeConfig::new(target.clone())
                .with_progress(match progress {
                    ProgressMode::Thread => Progress::Thread,
                    ProgressMode::Caller => Progress::Caller,
                })
                .with_progress_rt_priority(progress_priority_from_env())
                // A stock program may take its last completion and stop
                // calling (ib_send_lat's closing handshake): its peer's
                // last ACK must still leave.
                .with_caller_ack_sweep(ack_sweep_from_env())
                // ib_write_lat spins on memory: its peer's poll must not
                // return (on our ACK) before our answer is on its way.
                .with_poll_handoff(handoff_from_env());
            let d = RxeDevice::open(&cfg).map_err(|e| e.to_string())?;
            // Refused without the variable set is the common unprivileged
            // case (docs/verbs-abi.md says what it costs); asked for
            // explicitly, say why it did not happen.
            if let sched @ ProgressScheduling::Refused { .. } = d.progress_scheduling()
                && std::env::var_os("RNIC_VERBS_PROGRESS_PRIORITY").is_some()
            {
                warn(format_args!("{}: {sched}", dev.info.name));
            }
            (d.context(), MemorySource::Host, Some(d))
        }
        Backend::Mlx5 => {
            let (c, m) = rnic::open_with_memory(&dev.info.spec).map_err(|e| {
                let mut msg = e.to_string();
                let mut src = std::error::Error::source(&e);
                while let Some(s) = src {
                    msg += &format!(": {s}");
                    src = s.source();
                }
                msg
            })?;
            (c, m, None)
        }
    };
    let attr = rnic_ctx.query_device().map_err(|e| e.to_string())?;
    let port = rnic_ctx.query_port(1).map_err(|e| e.to_string())?;
    let gids = rnic_ctx.query_gid_table(1).map_err(|e| e.to_string())?;
    let events = AsyncEvents::new().map_err(|e| format!("eventfd for async events: {e}"))?;
    let mut vctx: verbs_context = zeroed();
    vctx.sz = size_of::<verbs_context>();
    vctx.query_port = Some(query_port_ex);
    vctx.query_device_ex = Some(query_device_ex);
    vctx.create_cq_ex = Some(crate::cq::create_cq_ex);
    vctx.create_qp_ex = Some(crate::qp::create_qp_ex);
    let c = &mut vctx.context;
    c.device = dev.as_ptr();
    c.cmd_fd = -1;
    c.async_fd = events.fd.as_fd().as_raw_fd();
    c.num_comp_vectors = 1;
    c.abi_compat = VERBS_ABI_IS_EXTENDED;
    c.ops._compat_query_device = Some(ibv_query_device);
    c.ops._compat_query_port = Some(ibv_query_port);
    c.ops.poll_cq = Some(crate::cq::poll_cq);
    c.ops.req_notify_cq = Some(crate::cq::req_notify_cq);
    c.ops.post_send = Some(crate::qp::post::post_send);
    c.ops.post_recv = Some(crate::qp::post::post_recv);
    c.ops.post_srq_recv = Some(crate::srq::post_srq_recv);
    // SAFETY: the mutex is initialized in place before the context is
    // published (it is never locked by this library, only kept valid for
    // programs that might).
    unsafe { libc::pthread_mutex_init(&raw mut c.mutex, std::ptr::null()) };
    Ok(Box::new(Context {
        vctx: Shared::new(vctx),
        dev,
        rnic: rnic_ctx,
        mem,
        rxe,
        progress,
        attr,
        port,
        gids,
        events,
        children: AtomicUsize::new(0),
        srq_qps: parking_lot::RwLock::new(std::collections::HashMap::new()),
        srq_qp_count: AtomicUsize::new(0),
    }))
}

/// `ibv_open_device`.
///
/// # Safety
///
/// `dev` is NULL or a device of this library's list.
pub unsafe extern "C" fn ibv_open_device(dev: *mut ibv_device) -> *mut ibv_context {
    let Some(d) = Device::from_ptr(dev) else {
        return fail_null(libc::ENODEV);
    };
    match open(d) {
        Ok(ctx) => {
            tracing::debug!(device = %d.info.name, spec = %d.info.spec, "ibv_open_device");
            Box::leak(ctx).as_ptr()
        }
        Err(e) => {
            warn(format_args!(
                "opening {} ({}): {e}",
                d.info.name, d.info.spec
            ));
            fail_null(libc::ENODEV)
        }
    }
}

/// `ibv_close_device`. rdma-core closes whatever is left (the kernel
/// reclaims it; perftest's `ib_send_bw` client leaks its receive CQ), so
/// this succeeds too. While objects created on the context remain, they
/// point to it: the context is then left allocated (its rnic device stays
/// open) rather than freed under them.
///
/// # Safety
///
/// `ctx` is an open context of this library.
pub unsafe extern "C" fn ibv_close_device(ctx: *mut ibv_context) -> c_int {
    if ctx.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: the caller's open context.
    let c = unsafe { Context::from_ptr(ctx) };
    let left = c.children.load(Ordering::Acquire);
    if left != 0 {
        tracing::debug!(device = %c.dev.info.name, left, "ibv_close_device with objects left: context kept");
        return 0;
    }
    if let Some(rxe) = &c.rxe
        && std::env::var_os("RNIC_VERBS_STATS").is_some_and(|v| v != "0")
    {
        eprintln!(
            "rnic: {} counters at close: {:?}",
            c.dev.info.name,
            rxe.stats().device
        );
    }
    let raw = std::ptr::from_ref(c).cast_mut();
    // SAFETY: the context was leaked from a Box by `ibv_open_device`;
    // nothing refers to it any more (no children).
    drop(unsafe { Box::from_raw(raw) });
    0
}

/// The `ibv_device_attr` of `c`.
fn device_attr(c: &Context) -> ibv_device_attr {
    let a = &c.attr;
    let int = |v: u32| c_int::try_from(v).unwrap_or(c_int::MAX);
    let mut d: ibv_device_attr = zeroed();
    copy_cstr(&mut d.fw_ver, &a.fw_ver);
    d.node_guid = a.node_guid.to_be();
    d.sys_image_guid = a.node_guid.to_be();
    d.max_mr_size = a.max_mr_size;
    d.page_size_cap = 0xffff_f000;
    // Kernel rxe reports vendor 0xffffff (RXE_VENDOR_ID); rnic-rxe says 0.
    d.vendor_id = match (&c.dev.info.backend, a.vendor_id) {
        (Backend::Rxe(_), 0) => 0x00ff_ffff,
        (_, v) => v,
    };
    d.vendor_part_id = a.vendor_part_id;
    d.max_qp = int(a.max_qp);
    d.max_qp_wr = int(a.max_qp_wr);
    d.device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_SYS_IMAGE_GUID;
    d.max_sge = int(a.max_sge);
    d.max_sge_rd = int(a.max_sge);
    d.max_cq = int(a.max_cq);
    d.max_cqe = int(a.max_cqe);
    d.max_mr = int(a.max_mr);
    // rnic limits PDs and AHs by memory only; rxe's numbers.
    d.max_pd = 0x7ff0;
    d.max_ah = 0x7ff0;
    d.max_qp_rd_atom = int(a.max_qp_rd_atom);
    d.max_qp_init_rd_atom = int(a.max_qp_init_rd_atom);
    d.max_res_rd_atom = int(a.max_qp_rd_atom.saturating_mul(a.max_qp));
    d.atomic_cap = match a.atomic_cap {
        AtomicCap::None => 0,
        AtomicCap::Hca => 1,
        AtomicCap::Glob => 2,
    };
    d.max_srq = 0x4000;
    d.max_srq_wr = crate::srq::MAX_SRQ_WR as c_int;
    d.max_srq_sge = crate::srq::MAX_SRQ_SGE as c_int;
    d.max_pkeys = 1;
    d.local_ca_ack_delay = 15;
    d.phys_port_cnt = a.phys_port_cnt;
    d
}

/// `ibv_query_device`.
///
/// # Safety
///
/// `ctx` is an open context; `attr` points to a writable `ibv_device_attr`.
pub unsafe extern "C" fn ibv_query_device(
    ctx: *mut ibv_context,
    attr: *mut ibv_device_attr,
) -> c_int {
    if ctx.is_null() || attr.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: the caller's open context.
    let c = unsafe { Context::from_ptr(ctx) };
    // SAFETY: the caller's output structure.
    unsafe { attr.write(device_attr(c)) };
    0
}

/// `verbs_context.query_device_ex`: the extended attributes, at most
/// `attr_size` bytes of them (older programs pass smaller structures).
///
/// # Safety
///
/// `ctx` is an open context; `attr` has `attr_size` writable bytes.
pub unsafe extern "C" fn query_device_ex(
    ctx: *mut ibv_context,
    input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    // SAFETY: the caller's input structure, when given.
    if ctx.is_null() || attr.is_null() || (!input.is_null() && unsafe { (*input).comp_mask } != 0) {
        return fail(libc::EINVAL);
    }
    if attr_size < size_of::<ibv_device_attr>() {
        return fail(libc::EINVAL);
    }
    // SAFETY: the caller's open context.
    let c = unsafe { Context::from_ptr(ctx) };
    let mut ex: ibv_device_attr_ex = zeroed();
    ex.orig_attr = device_attr(c);
    ex.device_cap_flags_ex = u64::from(ex.orig_attr.device_cap_flags);
    ex.phys_port_cnt_ex = u32::from(ex.orig_attr.phys_port_cnt);
    let n = attr_size.min(size_of::<ibv_device_attr_ex>());
    // SAFETY: `attr` has `attr_size` bytes (bytes past ours read as zero).
    unsafe { std::ptr::write_bytes(attr.cast::<u8>(), 0, attr_size) };
    // SAFETY: `n` of the `attr_size` bytes are written, from a local
    // structure of at least `n` bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(std::ptr::from_ref(&ex).cast::<u8>(), attr.cast::<u8>(), n)
    };
    0
}

/// `ibv_mtu` of an rnic MTU.
fn mtu_enum(m: rnic::core::Mtu) -> u32 {
    u32::from(m.to_enum())
}

/// `active_width` (`1x` = 1, `4x` = 2, `8x` = 4, `12x` = 8, `2x` = 16).
fn width_code(lanes: u8) -> u8 {
    match lanes {
        1 => 1,
        4 => 2,
        8 => 4,
        12 => 8,
        2 => 16,
        _ => 1,
    }
}

/// `active_speed` of a per-lane rate in Mb/s (SDR 1, DDR 2, QDR 4,
/// FDR10 8, FDR 16, EDR 32, HDR 64, NDR 128).
fn speed_code(mbps: u32) -> u8 {
    match mbps {
        0..=2_500 => 1,
        2_501..=5_000 => 2,
        5_001..=10_000 => 4,
        10_001..=14_000 => 16,
        14_001..=25_000 => 32,
        25_001..=50_000 => 64,
        _ => 128,
    }
}

/// Port 1's `ibv_port_attr`, as kernel rxe fills it for a RoCE port.
fn port_attr(c: &Context) -> ibv_port_attr {
    let p = &c.port;
    let mut a = ibv_port_attr {
        state: match p.state {
            PortState::Nop => 0,
            PortState::Down => 1,
            PortState::Init => 2,
            PortState::Armed => 3,
            PortState::Active => 4,
            PortState::ActiveDefer => 5,
        },
        max_mtu: mtu_enum(p.max_mtu),
        active_mtu: mtu_enum(p.active_mtu),
        gid_tbl_len: c_int::try_from(p.gid_tbl_len).unwrap_or(c_int::MAX),
        port_cap_flags: IBV_PORT_CM_SUP | IBV_PORT_IP_BASED_GIDS,
        max_msg_sz: p.max_msg_sz,
        pkey_tbl_len: 1,
        max_vl_num: 1,
        active_width: width_code(p.active_width),
        active_speed: speed_code(p.active_speed_mbps),
        // 5: LinkUp when active, 3: Disabled otherwise.
        phys_state: if p.state == PortState::Active { 5 } else { 3 },
        link_layer: match p.link_layer {
            LinkLayer::Ethernet => IBV_LINK_LAYER_ETHERNET,
            LinkLayer::InfiniBand => IBV_LINK_LAYER_INFINIBAND,
        },
        ..Default::default()
    };
    a.gid_tbl_len = a
        .gid_tbl_len
        .max(c_int::try_from(c.gids.len()).unwrap_or(0));
    a
}

/// Write at most `len` bytes of port `port`'s attributes to `out`.
///
/// # Safety
///
/// `ctx` is an open context; `out` has `len` writable bytes.
unsafe fn write_port(
    ctx: *mut ibv_context,
    port: u8,
    out: *mut ibv_port_attr,
    len: usize,
) -> c_int {
    if ctx.is_null() || out.is_null() {
        return fail(libc::EINVAL);
    }
    if port != 1 {
        return fail(libc::EINVAL);
    }
    // SAFETY: the caller's open context.
    let a = port_attr(unsafe { Context::from_ptr(ctx) });
    let n = len.min(size_of::<ibv_port_attr>());
    // SAFETY: `out` has `len >= n` bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(std::ptr::from_ref(&a).cast::<u8>(), out.cast::<u8>(), n)
    };
    0
}

/// `verbs_context.query_port`, what the header's inline `ibv_query_port`
/// calls with `sizeof(struct ibv_port_attr)`.
///
/// # Safety
///
/// `ctx` is an open context; `attr` has `len` writable bytes.
pub unsafe extern "C" fn query_port_ex(
    ctx: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
    len: usize,
) -> c_int {
    // SAFETY: forwarded caller guarantees.
    unsafe { write_port(ctx, port, attr, len) }
}

/// The exported `ibv_query_port@@IBVERBS_1.1`: the 48-byte
/// `struct _compat_ibv_port_attr` (without `port_cap_flags2`).
///
/// # Safety
///
/// `ctx` is an open context; `attr` has 48 writable bytes.
pub unsafe extern "C" fn ibv_query_port(
    ctx: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
) -> c_int {
    // SAFETY: forwarded caller guarantees.
    unsafe { write_port(ctx, port, attr, 48) }
}

/// The GID entry `index` of port `port`, or the errno.
fn gid_entry(c: &Context, port: u32, index: u32) -> Result<&GidEntry, c_int> {
    if port != 1 {
        return Err(libc::EINVAL);
    }
    c.gids.iter().find(|g| g.index == index).ok_or_else(|| {
        if index < port_attr(c).gid_tbl_len as u32 {
            libc::ENODATA
        } else {
            libc::EINVAL
        }
    })
}

/// `ibv_query_gid`: 0, or -1 with errno; an empty entry inside the table
/// reads as the zero GID, as rdma-core's does.
///
/// # Safety
///
/// `ctx` is an open context; `gid` points to a writable `union ibv_gid`.
pub unsafe extern "C" fn ibv_query_gid(
    ctx: *mut ibv_context,
    port: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    if ctx.is_null() || gid.is_null() {
        return fail_neg(libc::EINVAL);
    }
    // SAFETY: the caller's open context.
    let c = unsafe { Context::from_ptr(ctx) };
    let Ok(index) = u32::try_from(index) else {
        return fail_neg(libc::EINVAL);
    };
    let raw = match gid_entry(c, u32::from(port), index) {
        Ok(g) => *g.gid.raw(),
        Err(libc::ENODATA) => [0; 16],
        Err(e) => return fail_neg(e),
    };
    // SAFETY: the caller's output.
    unsafe { gid.write(ibv_gid { raw }) };
    0
}

/// The interface index of `netdev`, 0 when unknown.
fn ifindex(netdev: Option<&str>) -> u32 {
    netdev
        .and_then(|n| nix::net::if_::if_nametoindex(n).ok())
        .unwrap_or(0)
}

fn fill_entry(g: &GidEntry, port: u32) -> ibv_gid_entry {
    ibv_gid_entry {
        gid: ibv_gid { raw: *g.gid.raw() },
        gid_index: g.index,
        port_num: port,
        gid_type: match g.gid_type {
            GidType::RoceV1 => IBV_GID_TYPE_ROCE_V1,
            GidType::RoceV2 => IBV_GID_TYPE_ROCE_V2,
        },
        ndev_ifindex: ifindex(g.netdev.as_deref()),
    }
}

/// `_ibv_query_gid_ex` (behind the inline `ibv_query_gid_ex`): 0, or the
/// errno (`ENODATA` for an empty entry, `EINVAL` past the table).
///
/// # Safety
///
/// `ctx` is an open context; `entry` has `entry_size` writable bytes.
pub unsafe extern "C" fn _ibv_query_gid_ex(
    ctx: *mut ibv_context,
    port: u32,
    index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    if ctx.is_null() || entry.is_null() || entry_size < size_of::<ibv_gid_entry>() {
        return fail(libc::EINVAL);
    }
    if flags != 0 {
        return fail(libc::EOPNOTSUPP);
    }
    // SAFETY: the caller's open context.
    let c = unsafe { Context::from_ptr(ctx) };
    match gid_entry(c, port, index) {
        Ok(g) => {
            // SAFETY: the caller's output, at least an ibv_gid_entry long.
            unsafe { entry.write(fill_entry(g, port)) };
            0
        }
        Err(e) => fail(e),
    }
}

/// `_ibv_query_gid_table`: the valid entries of every port, `entry_size`
/// bytes apart; their number, or a negative errno.
///
/// # Safety
///
/// `ctx` is an open context; `entries` has `max_entries * entry_size`
/// writable bytes.
pub unsafe extern "C" fn _ibv_query_gid_table(
    ctx: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max_entries: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    if ctx.is_null()
        || (entries.is_null() && max_entries > 0)
        || entry_size < size_of::<ibv_gid_entry>()
    {
        fail(libc::EINVAL);
        return -(libc::EINVAL as isize);
    }
    if flags != 0 {
        fail(libc::EOPNOTSUPP);
        return -(libc::EOPNOTSUPP as isize);
    }
    // SAFETY: the caller's open context.
    let c = unsafe { Context::from_ptr(ctx) };
    let valid: Vec<&GidEntry> = c
        .gids
        .iter()
        .filter(|g| !g.gid.raw().iter().all(|b| *b == 0))
        .collect();
    if valid.len() > max_entries {
        fail(libc::EINVAL);
        return -(libc::EINVAL as isize);
    }
    for (i, g) in valid.iter().enumerate() {
        // SAFETY: entry i lies within the caller's max_entries * entry_size bytes.
        unsafe {
            entries
                .cast::<u8>()
                .wrapping_add(i * entry_size)
                .cast::<ibv_gid_entry>()
                .write_unaligned(fill_entry(g, 1));
        }
    }
    valid.len() as isize
}

/// `ibv_query_gid_type` (IBVERBS_PRIVATE_34, what `ibv_devinfo -v` prints
/// beside each GID): 0, or -1 with errno.
///
/// # Safety
///
/// `ctx` is an open context; `ty` points to a writable `int`.
pub unsafe extern "C" fn ibv_query_gid_type(
    ctx: *mut ibv_context,
    port: u8,
    index: u32,
    ty: *mut u32,
) -> c_int {
    if ctx.is_null() || ty.is_null() {
        return fail_neg(libc::EINVAL);
    }
    // SAFETY: the caller's open context.
    let c = unsafe { Context::from_ptr(ctx) };
    let t = match gid_entry(c, u32::from(port), index) {
        Ok(g) if g.gid_type == GidType::RoceV2 => IBV_GID_TYPE_SYSFS_ROCE_V2,
        Ok(_) | Err(libc::ENODATA) => IBV_GID_TYPE_SYSFS_IB_ROCE_V1,
        Err(e) => return fail_neg(e),
    };
    // SAFETY: the caller's output.
    unsafe { ty.write(t) };
    0
}

/// `ibv_query_pkey`: the one P_Key of a RoCE port, 0xffff (big-endian);
/// -1 with errno past it.
///
/// # Safety
///
/// `ctx` is an open context; `pkey` points to a writable `__be16`.
pub unsafe extern "C" fn ibv_query_pkey(
    ctx: *mut ibv_context,
    port: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    if ctx.is_null() || pkey.is_null() || port != 1 || index != 0 {
        return fail_neg(libc::EINVAL);
    }
    // SAFETY: the caller's output.
    unsafe { pkey.write(0xffffu16.to_be()) };
    0
}

/// `ibv_get_pkey_index`: 0 for the default P_Key, -1 otherwise.
///
/// # Safety
///
/// `ctx` is an open context.
pub unsafe extern "C" fn ibv_get_pkey_index(ctx: *mut ibv_context, port: u8, pkey: u16) -> c_int {
    if ctx.is_null() || port != 1 {
        return fail_neg(libc::EINVAL);
    }
    // Full (0xffff) and limited (0x7fff) membership of the default partition.
    if u16::from_be(pkey) & 0x7fff == 0x7fff {
        0
    } else {
        fail_neg(libc::ENOENT)
    }
}

/// `ibv_get_async_event`: the next asynchronous event; blocks unless the
/// application made `async_fd` non-blocking. 0, or -1 with errno.
///
/// # Safety
///
/// `ctx` is an open context; `event` points to a writable `ibv_async_event`.
pub unsafe extern "C" fn ibv_get_async_event(
    ctx: *mut ibv_context,
    event: *mut ibv_async_event,
) -> c_int {
    if ctx.is_null() || event.is_null() {
        return fail_neg(libc::EINVAL);
    }
    // SAFETY: the caller's open context.
    let c = unsafe { Context::from_ptr(ctx) };
    loop {
        match c.events.fd.read() {
            Ok(_) => break,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return fail_neg(e as c_int),
        }
    }
    match c.events.queue.lock().pop_front() {
        Some(e) => {
            // SAFETY: the caller's output.
            unsafe { event.write(e) };
            0
        }
        None => fail_neg(libc::EAGAIN),
    }
}

/// `ibv_ack_async_event`: nothing to release (no destroy waits for it).
///
/// # Safety
///
/// `event` came from [`ibv_get_async_event`].
pub unsafe extern "C" fn ibv_ack_async_event(event: *mut ibv_async_event) {
    let _ = event;
}

/// An event for the element `element` of context `c`.
pub fn raise(c: &Context, event_type: u32, element: *mut c_void) {
    let mut e: ibv_async_event = zeroed();
    e.element.cq = element.cast();
    e.event_type = event_type;
    c.events.push(e);
}

/// The `NonNull` of a context, for objects that point back to it.
pub fn ctx_ptr(c: &Context) -> NonNull<Context> {
    NonNull::from(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn speeds_and_widths_encode_as_ibverbs_does() {
        assert_eq!(speed_code(2_500), 1);
        assert_eq!(speed_code(10_000), 4);
        assert_eq!(speed_code(25_000), 32);
        assert_eq!(speed_code(100_000), 128);
        assert_eq!(width_code(1), 1);
        assert_eq!(width_code(4), 2);
        assert_eq!(width_code(12), 8);
    }
}
