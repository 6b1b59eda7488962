//! Completion queues and completion channels: `ibv_create_cq` (and the
//! extended `ibv_create_cq_ex` with its `ibv_start_poll` iterator),
//! `ibv_poll_cq`, `ibv_req_notify_cq`, `ibv_destroy_cq`,
//! `ibv_create_comp_channel`, `ibv_get_cq_event`, `ibv_ack_cq_events`.
//!
//! # Completion channels
//!
//! A channel's `fd` is an epoll descriptor holding the eventfd of every CQ
//! bound to it (rnic-rxe gives each CQ one, signalled by an armed CQ's next
//! completion), so it works with `poll(2)`, `epoll`, `O_NONBLOCK` like a
//! kernel channel: readable when a CQ of the channel has an event.
//! `ibv_get_cq_event` waits on it, learns which CQ fired, consumes that
//! event and returns the CQ. Where progress is the caller's
//! (`RNIC_VERBS_PROGRESS=caller`), or a CQ has no eventfd (mlx5 CQs wait
//! on the function's event queue), `ibv_get_cq_event` waits through rnic's
//! `CompletionQueue::wait` instead, which drives the device while it waits.

use std::ffi::{c_int, c_uint, c_void};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use parking_lot::Mutex;
use parking_lot::lock_api::RawMutex as _;
use rnic::core::{CompletionQueue, WcFlags, WorkCompletion};

use crate::abi::{
    IBV_CQ_INIT_ATTR_MASK_FLAGS, IBV_WC_STANDARD_FLAGS, Shared, WcImm, ibv_comp_channel,
    ibv_context, ibv_cq, ibv_cq_ex, ibv_cq_init_attr_ex, ibv_poll_cq_attr, ibv_wc, zeroed,
};
use crate::context::{Context, ProgressMode};
use crate::pd::next_handle;
use crate::{errno_of, fail, fail_neg, fail_null, warn};

/// Completions moved per call into rnic's poll.
const BATCH: usize = 16;

/// What a CQ's lock protects.
#[derive(Debug)]
pub struct CqInner {
    /// rnic's queue.
    pub cq: CompletionQueue,
    /// Where rnic's completions land before they are converted (kept, so a
    /// poll clears nothing).
    buf: [WorkCompletion; BATCH],
    /// The `ibv_cq_ex` iterator's current completion.
    cur: WorkCompletion,
}

/// Completion events handed out by `ibv_get_cq_event` and acknowledged by
/// `ibv_ack_cq_events`; `ibv_destroy_cq` waits until they are equal.
#[derive(Debug, Default)]
struct EventCount {
    delivered: u64,
    acked: u64,
}

/// A completion queue. `ibv_cq_ex` comes first (`ibv_cq` is its prefix).
#[repr(C)]
#[derive(Debug)]
pub struct Cq {
    /// The C structure.
    pub c: Shared<ibv_cq_ex>,
    /// Its context.
    pub ctx: NonNull<Context>,
    /// The queue, polled under this lock (`ibv_start_poll` holds it until
    /// `ibv_end_poll`).
    pub inner: Mutex<CqInner>,
    /// Its channel.
    channel: Option<NonNull<Channel>>,
    /// rnic's event descriptor for it, if the backend has one.
    event_fd: Option<RawFd>,
    /// QPs completing into it (`ibv_destroy_cq` refuses while any).
    pub qps: AtomicUsize,
    events: std::sync::Mutex<EventCount>,
    acked: std::sync::Condvar,
}

impl Cq {
    /// The CQ behind an `ibv_cq *` (or `ibv_cq_ex *`) of this library.
    ///
    /// # Safety
    ///
    /// `cq` came from `ibv_create_cq[_ex]` and was not destroyed.
    pub unsafe fn from_ptr<'a>(cq: *mut ibv_cq) -> &'a Cq {
        // SAFETY: the C struct is the first field of a repr(C) Cq; the
        // caller guarantees it is live.
        unsafe { &*cq.cast::<Cq>() }
    }

    /// Its context.
    pub fn ctx(&self) -> &Context {
        // SAFETY: a context outlives its CQs.
        unsafe { self.ctx.as_ref() }
    }

    /// The `ibv_cq *`.
    pub fn as_ptr(&self) -> *mut ibv_cq {
        self.c.get().cast()
    }
}

/// An `ibv_wc` from rnic's completion.
#[inline]
fn to_ibv(wc: &WorkCompletion) -> ibv_wc {
    let imm = if wc.wc_flags.contains(WcFlags::WITH_INV) {
        WcImm {
            invalidated_rkey: wc.invalidated_rkey.map_or(0, |k| k.get()),
        }
    } else {
        WcImm {
            imm_data: wc.imm_data.map_or(0, u32::to_be),
        }
    };
    ibv_wc {
        wr_id: wc.wr_id,
        status: wc.status.as_raw(),
        opcode: wc.opcode.as_raw(),
        vendor_err: wc.vendor_err,
        byte_len: wc.byte_len,
        imm_data: imm,
        qp_num: wc.qp_num.get(),
        src_qp: wc.src_qp.get(),
        wc_flags: wc.wc_flags.bits(),
        pkey_index: wc.pkey_index,
        slid: wc.slid,
        sl: wc.sl,
        dlid_path_bits: wc.dlid_path_bits,
    }
}

/// `ibv_context_ops.poll_cq` (the inline `ibv_poll_cq`): up to `n`
/// completions into `wc`; their number, or a negative value.
///
/// # Safety
///
/// `cq` is a live CQ; `wc` has room for `n` entries.
pub unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    // SAFETY: the caller's live CQ.
    let q = unsafe { Cq::from_ptr(cq) };
    let n = usize::try_from(n).unwrap_or(0);
    let mut guard = q.inner.lock();
    let inner = &mut *guard;
    let mut done = 0usize;
    while done < n {
        let want = (n - done).min(BATCH);
        let got = match inner.cq.poll(&mut inner.buf[..want]) {
            Ok(k) => k.min(want),
            Err(e) => {
                if done > 0 {
                    break;
                }
                return -fail(errno_of(&e));
            }
        };
        let srq = q.ctx().srq_qp_count.load(Ordering::Acquire) != 0;
        for w in &inner.buf[..got] {
            if srq && w.is_recv() && !srq_completion(q.ctx(), w) {
                continue;
            }
            // SAFETY: `wc` has room for `n > done` entries.
            unsafe { wc.wrapping_add(done).write(to_ibv(w)) };
            done += 1;
        }
        if got < want {
            break;
        }
    }
    c_int::try_from(done).unwrap_or(c_int::MAX)
}

/// A receive completion of a QP attached to an SRQ goes through the SRQ
/// emulation first (`crate::srq`); `false` when the application must not
/// see it (a flushed request, back in the SRQ's pool).
#[cold]
fn srq_completion(c: &Context, w: &WorkCompletion) -> bool {
    let registry = c.srq_qps.read();
    let Some(&addr) = registry.get(&w.qp_num.get()) else {
        return true;
    };
    // SAFETY: registered QPs are live: `ibv_destroy_qp` unregisters (under
    // the write lock, so after this read guard is gone) before it frees.
    let q = unsafe { &*(addr as *const crate::qp::Qp) };
    let srq = q.inner.lock().srq.srq;
    // SAFETY: an SRQ outlives its QPs.
    srq.is_none_or(|s| unsafe { s.as_ref() }.on_completion(q, w))
}

/// `ibv_context_ops.req_notify_cq`: arm the CQ's next (solicited)
/// completion to raise an event on its channel.
///
/// # Safety
///
/// `cq` is a live CQ.
pub unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    // SAFETY: the caller's live CQ.
    let q = unsafe { Cq::from_ptr(cq) };
    match q.inner.lock().cq.req_notify(solicited_only != 0) {
        Ok(()) => 0,
        Err(e) => fail(errno_of(&e)),
    }
}

/// How many times the asked depth an mlx5 CQ gets (see `create`): a send
/// queue of N requests of up to 4 WQEBBs (inline data) rounds up to 4N..8N
/// WQEBBs.
const MLX5_CQ_HEADROOM: u32 = 8;

/// Create a CQ of at least `cqe` entries on `c`.
fn create(
    ctx: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> Result<*mut Cq, (c_int, String)> {
    // SAFETY: the caller's open context (checked non-NULL by the callers).
    let c = unsafe { Context::from_ptr(ctx) };
    let depth = u32::try_from(cqe).ok().filter(|&d| d >= 1).ok_or((
        libc::EINVAL,
        format!("cqe {cqe}: ask for at least one entry"),
    ))?;
    if comp_vector != 0 {
        return Err((
            libc::EINVAL,
            format!("comp_vector {comp_vector}: rnic contexts have one completion vector, 0"),
        ));
    }
    // rnic-mlx5 reserves CQ room for every WQEBB and receive each QP on the
    // CQ can hold (overflow impossible by construction), where a device
    // trusts the application's sizing; stock programs size CQs by work
    // requests, so an mlx5 CQ gets headroom (within the device's maximum).
    let depth = if c.backend() == "mlx5" {
        depth
            .saturating_mul(MLX5_CQ_HEADROOM)
            .min(c.attr.max_cqe.max(depth))
    } else {
        depth
    };
    let cq = c
        .rnic
        .create_cq(depth)
        .map_err(|e| (errno_of(&e), e.to_string()))?;
    let granted = cq.depth();
    let event_fd = cq.event_fd();
    let mut x: ibv_cq_ex = zeroed();
    x.context = ctx;
    x.channel = channel;
    x.cq_context = cq_context;
    x.handle = next_handle();
    x.cqe = c_int::try_from(granted).unwrap_or(c_int::MAX);
    x.mutex = libc::PTHREAD_MUTEX_INITIALIZER;
    x.cond = libc::PTHREAD_COND_INITIALIZER;
    x.start_poll = Some(start_poll);
    x.next_poll = Some(next_poll);
    x.end_poll = Some(end_poll);
    x.read_opcode = Some(read_opcode);
    x.read_vendor_err = Some(read_vendor_err);
    x.read_byte_len = Some(read_byte_len);
    x.read_imm_data = Some(read_imm_data);
    x.read_qp_num = Some(read_qp_num);
    x.read_src_qp = Some(read_src_qp);
    x.read_wc_flags = Some(read_wc_flags);
    x.read_slid = Some(read_slid);
    x.read_sl = Some(read_sl);
    x.read_dlid_path_bits = Some(read_dlid_path_bits);
    let chan = NonNull::new(channel.cast::<Channel>());
    let obj = Box::new(Cq {
        c: Shared::new(x),
        ctx: NonNull::from(c),
        inner: Mutex::new(CqInner {
            cq,
            buf: [WorkCompletion::default(); BATCH],
            cur: WorkCompletion::default(),
        }),
        channel: chan,
        event_fd,
        qps: AtomicUsize::new(0),
        events: std::sync::Mutex::new(EventCount::default()),
        acked: std::sync::Condvar::new(),
    });
    let raw = Box::into_raw(obj);
    // SAFETY: just created; stays live until `ibv_destroy_cq`.
    let q = unsafe { &*raw };
    if let Some(ch) = chan {
        // SAFETY: a channel outlives its CQs (destroy refuses while bound).
        let ch = unsafe { ch.as_ref() };
        if let Err(e) = ch.bind(q) {
            // SAFETY: `raw` came from Box::into_raw above and was not published.
            drop(unsafe { Box::from_raw(raw) });
            return Err((libc::EINVAL, e));
        }
    }
    c.adopt();
    Ok(raw)
}

/// `ibv_create_cq`.
///
/// # Safety
///
/// `ctx` is an open context; `channel` NULL or a live channel of it.
pub unsafe extern "C" fn ibv_create_cq(
    ctx: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    if ctx.is_null() {
        return fail_null(libc::EINVAL);
    }
    match create(ctx, cqe, cq_context, channel, comp_vector) {
        Ok(q) => q.cast(),
        Err((e, msg)) => {
            warn(format_args!("ibv_create_cq({cqe}): {msg}"));
            fail_null(e)
        }
    }
}

/// `verbs_context.create_cq_ex` (the inline `ibv_create_cq_ex`).
///
/// # Safety
///
/// `ctx` is an open context; `attr` points to an `ibv_cq_init_attr_ex`.
pub unsafe extern "C" fn create_cq_ex(
    ctx: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    if ctx.is_null() || attr.is_null() {
        return fail_null(libc::EINVAL);
    }
    // SAFETY: the caller's attributes.
    let a = unsafe { &*attr };
    if a.wc_flags & !IBV_WC_STANDARD_FLAGS != 0 {
        warn(format_args!(
            "ibv_create_cq_ex: wc_flags {:#x} ask for fields rnic does not report (timestamps, cvlan, flow tag, tag matching); \
             ask for IBV_WC_STANDARD_FLAGS only",
            a.wc_flags
        ));
        return fail_null(libc::EOPNOTSUPP);
    }
    if a.comp_mask & !IBV_CQ_INIT_ATTR_MASK_FLAGS != 0 {
        warn(format_args!(
            "ibv_create_cq_ex: parent domains are not supported"
        ));
        return fail_null(libc::EOPNOTSUPP);
    }
    // IBV_CREATE_CQ_ATTR_SINGLE_THREADED is a promise we do not need;
    // IGNORE_OVERRUN cannot happen (rnic's CQs cannot overrun).
    if a.comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS != 0 && a.flags & !3 != 0 {
        return fail_null(libc::EOPNOTSUPP);
    }
    let cqe = c_int::try_from(a.cqe).unwrap_or(c_int::MAX);
    let vector = c_int::try_from(a.comp_vector).unwrap_or(c_int::MAX);
    match create(ctx, cqe, a.cq_context, a.channel, vector) {
        Ok(q) => {
            // SAFETY: just created.
            unsafe { (*q).c.get() }
        }
        Err((e, msg)) => {
            warn(format_args!("ibv_create_cq_ex({cqe}): {msg}"));
            fail_null(e)
        }
    }
}

/// `ibv_resize_cq`: rnic's CQs have a fixed depth.
///
/// # Safety
///
/// `cq` is a live CQ.
pub unsafe extern "C" fn ibv_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    let _ = (cq, cqe);
    fail(libc::EOPNOTSUPP)
}

/// `ibv_destroy_cq`: `EBUSY` while QPs complete into it; waits until every
/// event `ibv_get_cq_event` returned for it is acknowledged, as rdma-core
/// does.
///
/// # Safety
///
/// `cq` is a live CQ of this library.
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    if cq.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: the caller's live CQ.
    let q = unsafe { Cq::from_ptr(cq) };
    if q.qps.load(Ordering::Acquire) != 0 {
        return fail(libc::EBUSY);
    }
    {
        let mut ev = q.events.lock().unwrap_or_else(|p| p.into_inner());
        while ev.acked < ev.delivered {
            ev = q.acked.wait(ev).unwrap_or_else(|p| p.into_inner());
        }
    }
    if let Some(ch) = q.channel {
        // SAFETY: a channel outlives its CQs.
        unsafe { ch.as_ref() }.unbind(q);
    }
    q.ctx().release();
    // SAFETY: leaked by `create`; nothing refers to it any more.
    drop(unsafe { Box::from_raw(cq.cast::<Cq>()) });
    0
}

/// The current completion of an `ibv_cq_ex` between `start_poll` and
/// `end_poll`.
///
/// # Safety
///
/// The caller is between `ibv_start_poll` (which returned 0) and
/// `ibv_end_poll` on `cq`, so this thread holds the CQ's lock.
unsafe fn current<'a>(cq: *mut ibv_cq_ex) -> &'a WorkCompletion {
    // SAFETY: the CQ is live; its lock is held by this poll sequence, so no
    // one else touches `inner`.
    let q = unsafe { Cq::from_ptr(cq.cast()) };
    // SAFETY: as above: the lock is held by this thread.
    unsafe { &(*q.inner.data_ptr()).cur }
}

/// Poll one completion into `cur` and mirror `status`/`wr_id`; ENOENT when
/// none. The lock is held by the caller.
///
/// # Safety
///
/// As [`current`].
unsafe fn advance(cq: *mut ibv_cq_ex) -> c_int {
    // SAFETY: the caller's live CQ, whose lock this poll sequence holds.
    let q = unsafe { Cq::from_ptr(cq.cast()) };
    // SAFETY: as above: the lock is held by this thread.
    let inner = unsafe { &mut *q.inner.data_ptr() };
    match inner.cq.poll(std::slice::from_mut(&mut inner.cur)) {
        Ok(1) => {
            // SAFETY: the CQ's own C struct; the application reads status and
            // wr_id only after this call returns.
            unsafe {
                q.c.with(|c| {
                    c.status = inner.cur.status.as_raw();
                    c.wr_id = inner.cur.wr_id;
                });
            }
            0
        }
        Ok(_) => libc::ENOENT,
        Err(e) => errno_of(&e),
    }
}

/// `ibv_cq_ex.start_poll`: lock the CQ and fetch the first completion; 0,
/// or `ENOENT` (lock released) when there is none.
unsafe extern "C" fn start_poll(cq: *mut ibv_cq_ex, attr: *mut ibv_poll_cq_attr) -> c_int {
    // SAFETY: the caller's attributes, when given.
    if !attr.is_null() && unsafe { (*attr).comp_mask } != 0 {
        return libc::EINVAL;
    }
    // SAFETY: the caller's live CQ.
    let q = unsafe { Cq::from_ptr(cq.cast()) };
    // SAFETY: `raw()` locks the mutex; the guard-less lock is released by
    // `end_poll` (or below), as the ibv_cq_ex API pairs them.
    unsafe { q.inner.raw() }.lock();
    // SAFETY: the lock is held by this thread.
    let r = unsafe { advance(cq) };
    if r != 0 {
        // SAFETY: locked above by this thread.
        unsafe { q.inner.force_unlock() };
    }
    r
}

/// `ibv_cq_ex.next_poll`: the next completion, or `ENOENT`.
unsafe extern "C" fn next_poll(cq: *mut ibv_cq_ex) -> c_int {
    // SAFETY: between start_poll and end_poll (the API's contract).
    unsafe { advance(cq) }
}

/// `ibv_cq_ex.end_poll`: release the CQ.
unsafe extern "C" fn end_poll(cq: *mut ibv_cq_ex) {
    // SAFETY: the caller's live CQ.
    let q = unsafe { Cq::from_ptr(cq.cast()) };
    // SAFETY: start_poll returned 0, so this thread holds the lock.
    unsafe { q.inner.force_unlock() };
}

macro_rules! readers {
    ($($name:ident -> $t:ty = |$w:ident| $e:expr;)*) => { $(
        /// An `ibv_cq_ex` field reader.
        unsafe extern "C" fn $name(cq: *mut ibv_cq_ex) -> $t {
            // SAFETY: called between start_poll and end_poll (the API's contract).
            let $w = unsafe { current(cq) };
            $e
        }
    )* };
}

readers! {
    read_opcode -> c_uint = |w| w.opcode.as_raw();
    read_vendor_err -> u32 = |w| w.vendor_err;
    read_byte_len -> u32 = |w| w.byte_len;
    read_imm_data -> u32 = |w| if w.wc_flags.contains(WcFlags::WITH_INV) {
        w.invalidated_rkey.map_or(0, |k| k.get())
    } else {
        w.imm_data.map_or(0, u32::to_be)
    };
    read_qp_num -> u32 = |w| w.qp_num.get();
    read_src_qp -> u32 = |w| w.src_qp.get();
    read_wc_flags -> c_uint = |w| w.wc_flags.bits();
    read_slid -> u32 = |w| u32::from(w.slid);
    read_sl -> u8 = |w| w.sl;
    read_dlid_path_bits -> u8 = |w| w.dlid_path_bits;
}

/// A completion channel. `ibv_comp_channel` comes first.
#[repr(C)]
#[derive(Debug)]
pub struct Channel {
    /// The C structure (`fd` is the epoll descriptor).
    pub c: Shared<ibv_comp_channel>,
    ctx: NonNull<Context>,
    epoll: Epoll,
    /// CQs bound to it, for the waits that cannot use `epoll`.
    cqs: Mutex<Vec<NonNull<Cq>>>,
}

impl Channel {
    fn ctx(&self) -> &Context {
        // SAFETY: a context outlives its channels.
        unsafe { self.ctx.as_ref() }
    }

    /// Bind `q`: its eventfd joins the epoll set.
    fn bind(&self, q: &Cq) -> Result<(), String> {
        if !std::ptr::eq(q.ctx.as_ptr(), self.ctx.as_ptr()) {
            return Err("the channel belongs to another context".to_owned());
        }
        if let Some(fd) = q.event_fd {
            // SAFETY: rnic keeps the CQ's eventfd open while the CQ lives,
            // and `unbind` removes it before the CQ is dropped.
            let fd = unsafe { BorrowedFd::borrow_raw(fd) };
            self.epoll
                .add(
                    fd,
                    EpollEvent::new(EpollFlags::EPOLLIN, q as *const Cq as u64),
                )
                .map_err(|e| format!("adding the CQ's eventfd to the channel: {e}"))?;
        }
        self.cqs.lock().push(NonNull::from(q));
        // SAFETY: the channel's own C struct.
        unsafe { self.c.with(|c| c.refcnt += 1) };
        Ok(())
    }

    fn unbind(&self, q: &Cq) {
        if let Some(fd) = q.event_fd {
            // SAFETY: the CQ (and so its eventfd) is still live.
            let _ = self.epoll.delete(unsafe { BorrowedFd::borrow_raw(fd) });
        }
        self.cqs.lock().retain(|p| !std::ptr::eq(p.as_ptr(), q));
        // SAFETY: the channel's own C struct.
        unsafe { self.c.with(|c| c.refcnt -= 1) };
    }

    /// Whether the application made the channel's fd non-blocking.
    fn nonblocking(&self) -> bool {
        nix::fcntl::fcntl(self.epoll.0.as_fd(), nix::fcntl::FcntlArg::F_GETFL).is_ok_and(|f| {
            nix::fcntl::OFlag::from_bits_truncate(f).contains(nix::fcntl::OFlag::O_NONBLOCK)
        })
    }

    /// Wait for a CQ's event; the CQ, or the errno.
    fn wait(&self) -> Result<NonNull<Cq>, c_int> {
        let nonblock = self.nonblocking();
        let cqs: Vec<NonNull<Cq>> = self.cqs.lock().clone();
        let all_fds = cqs.iter().all(|q| {
            // SAFETY: bound CQs are live.
            unsafe { q.as_ref() }.event_fd.is_some()
        });
        if all_fds && self.ctx().progress == ProgressMode::Thread {
            return self.wait_epoll(nonblock);
        }
        self.wait_driving(&cqs, nonblock)
    }

    /// Wait on the epoll set (a progress thread signals the eventfds).
    fn wait_epoll(&self, nonblock: bool) -> Result<NonNull<Cq>, c_int> {
        let mut ev = [EpollEvent::empty()];
        loop {
            let timeout = if nonblock {
                EpollTimeout::ZERO
            } else {
                EpollTimeout::NONE
            };
            match self.epoll.wait(&mut ev, timeout) {
                Ok(0) if nonblock => return Err(libc::EAGAIN),
                Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
                Ok(_) => {
                    let q = ev[0].data() as *mut Cq;
                    let Some(q) = NonNull::new(q) else { continue };
                    // SAFETY: only bound (live) CQs are in the set.
                    if consume(unsafe { q.as_ref() }) {
                        return Ok(q);
                    }
                    // Another thread consumed it first.
                    if nonblock {
                        return Err(libc::EAGAIN);
                    }
                }
                Err(e) => return Err(e as c_int),
            }
        }
    }

    /// Wait through rnic's `CompletionQueue::wait`, which makes progress in
    /// caller-driven mode and sleeps on an mlx5 function's event queue.
    fn wait_driving(&self, cqs: &[NonNull<Cq>], nonblock: bool) -> Result<NonNull<Cq>, c_int> {
        let slice = if cqs.len() == 1 && !nonblock {
            None
        } else if nonblock {
            Some(Duration::ZERO)
        } else {
            Some(Duration::from_millis(1))
        };
        loop {
            for q in cqs {
                // SAFETY: bound CQs are live.
                let cq = unsafe { q.as_ref() };
                if consume(cq) {
                    return Ok(*q);
                }
            }
            for q in cqs {
                // SAFETY: bound CQs are live.
                let cq = unsafe { q.as_ref() };
                let r = cq.inner.lock().cq.wait(slice);
                match r {
                    Ok(true) => return Ok(*q),
                    Ok(false) => {}
                    Err(e) => return Err(errno_of(&e)),
                }
            }
            if cqs.is_empty() {
                if nonblock {
                    return Err(libc::EAGAIN);
                }
                std::thread::sleep(Duration::from_millis(1));
            } else if nonblock {
                return Err(libc::EAGAIN);
            }
        }
    }
}

/// Consume `q`'s pending event, if any (its eventfd is non-blocking).
fn consume(q: &Cq) -> bool {
    let Some(fd) = q.event_fd else { return false };
    let mut v = [0u8; 8];
    // SAFETY: the CQ's live eventfd (rnic keeps it open while the CQ lives).
    let fd = unsafe { BorrowedFd::borrow_raw(fd) };
    matches!(nix::unistd::read(fd, &mut v), Ok(8))
}

/// `ibv_create_comp_channel`.
///
/// # Safety
///
/// `ctx` is an open context.
pub unsafe extern "C" fn ibv_create_comp_channel(ctx: *mut ibv_context) -> *mut ibv_comp_channel {
    if ctx.is_null() {
        return fail_null(libc::EINVAL);
    }
    // SAFETY: the caller's open context.
    let c = unsafe { Context::from_ptr(ctx) };
    let epoll = match Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC) {
        Ok(e) => e,
        Err(e) => {
            warn(format_args!(
                "ibv_create_comp_channel: epoll_create: {e} (check ulimit -n)"
            ));
            return fail_null(e as c_int);
        }
    };
    c.adopt();
    let fd = epoll.0.as_raw_fd();
    let obj = Box::new(Channel {
        c: Shared::new(ibv_comp_channel {
            context: ctx,
            fd,
            refcnt: 0,
        }),
        ctx: NonNull::from(c),
        epoll,
        cqs: Mutex::new(Vec::new()),
    });
    Box::leak(obj).c.get()
}

/// `ibv_destroy_comp_channel`: `EBUSY` while CQs are bound to it.
///
/// # Safety
///
/// `ch` is a live channel of this library.
pub unsafe extern "C" fn ibv_destroy_comp_channel(ch: *mut ibv_comp_channel) -> c_int {
    if ch.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: the caller's live channel (the C struct starts a Channel).
    let chan = unsafe { &*ch.cast::<Channel>() };
    if !chan.cqs.lock().is_empty() {
        return fail(libc::EBUSY);
    }
    chan.ctx().release();
    // SAFETY: leaked by `ibv_create_comp_channel`; nothing refers to it.
    drop(unsafe { Box::from_raw(ch.cast::<Channel>()) });
    0
}

/// `ibv_get_cq_event`: wait for an armed CQ of the channel to get a
/// completion; 0 with `*cq` and `*cq_context` set, or -1 with errno
/// (`EAGAIN` on a non-blocking channel with nothing pending).
///
/// # Safety
///
/// `ch` is a live channel; `cq` and `cq_context` are writable.
pub unsafe extern "C" fn ibv_get_cq_event(
    ch: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    if ch.is_null() || cq.is_null() || cq_context.is_null() {
        return fail_neg(libc::EINVAL);
    }
    // SAFETY: the caller's live channel.
    let chan = unsafe { &*ch.cast::<Channel>() };
    match chan.wait() {
        Ok(q) => {
            // SAFETY: a bound, live CQ.
            let q = unsafe { q.as_ref() };
            q.events.lock().unwrap_or_else(|p| p.into_inner()).delivered += 1;
            // SAFETY: the CQ's own C struct.
            let context = unsafe { q.c.with(|c| c.cq_context) };
            // SAFETY: the caller's output.
            unsafe { cq.write(q.as_ptr()) };
            // SAFETY: the caller's output.
            unsafe { cq_context.write(context) };
            0
        }
        Err(e) => fail_neg(e),
    }
}

/// `ibv_ack_cq_events`.
///
/// # Safety
///
/// `cq` is a live CQ.
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut ibv_cq, n: c_uint) {
    if cq.is_null() {
        return;
    }
    // SAFETY: the caller's live CQ.
    let q = unsafe { Cq::from_ptr(cq) };
    let mut ev = q.events.lock().unwrap_or_else(|p| p.into_inner());
    ev.acked += u64::from(n);
    q.acked.notify_all();
    // SAFETY: the CQ's own C struct (mirrors rdma-core's counter).
    unsafe {
        q.c.with(|c| c.comp_events_completed = c.comp_events_completed.wrapping_add(n))
    };
}
