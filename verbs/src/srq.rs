//! Shared receive queues, emulated on rnic's per-QP receive queues:
//! `ibv_create_srq`, `ibv_post_srq_recv`, `ibv_modify_srq` (the limit),
//! `ibv_query_srq`, `ibv_destroy_srq`, and the
//! `IBV_EVENT_QP_LAST_WQE_REACHED` / `IBV_EVENT_SRQ_LIMIT_REACHED` events.
//!
//! rnic's transport has no SRQ; UCX's `rc_verbs` transport and
//! `ibv_srq_pingpong` need one. The drop-in keeps the SRQ's receive
//! requests in a pool and hands them to the receive queues of the QPs
//! attached to it (created with `srq` set, the k-th with room for 1/k of
//! the SRQ's depth): at most an equal share per QP, topped up from the pool each
//! time `ibv_poll_cq` returns one of that QP's receives. So every posted
//! request is in exactly one place — the pool, or one QP's queue (the QP's
//! FIFO here mirrors its rnic queue) — and:
//!
//! * a QP moved to ERR or RESET, or destroyed, gives its requests back to
//!   the pool instead of flushing them (a flushed receive of an attached QP
//!   is swallowed by `ibv_poll_cq`, as a real SRQ keeps its WQEs), and
//!   `IBV_EVENT_QP_LAST_WQE_REACHED` is raised for it (UCX waits for it
//!   before destroying the QP);
//! * `IBV_EVENT_SRQ_LIMIT_REACHED` is raised once when the requests not yet
//!   consumed drop below an armed `srq_limit`.
//!
//! What differs from a device's SRQ: a request handed to one QP cannot be
//! consumed by another; a message to a QP whose share is used up waits for
//! a receive (RNR) until the application reposts. With one QP per SRQ (a
//! point-to-point connection) the behaviour is exact.

use std::collections::VecDeque;
use std::ffi::{c_int, c_void};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;
use rnic::core::{Lkey, QpState, RecvWr, Sge, WcStatus, WorkCompletion};

use crate::abi::{
    IBV_EVENT_QP_LAST_WQE_REACHED, IBV_EVENT_SRQ_LIMIT_REACHED, Shared, ibv_pd, ibv_recv_wr,
    ibv_srq, ibv_srq_attr, ibv_srq_init_attr,
};
use crate::context::{Context, raise};
use crate::pd::{Pd, next_handle};
use crate::qp::Qp;
use crate::{fail, fail_null, warn};

/// SGEs per SRQ receive request (UCX posts one).
pub const MAX_SRQ_SGE: usize = 4;
/// Requests an SRQ may hold.
pub const MAX_SRQ_WR: u32 = 16384;
/// `IBV_SRQ_MAX_WR`.
const IBV_SRQ_MAX_WR: c_int = 1;
/// `IBV_SRQ_LIMIT`.
const IBV_SRQ_LIMIT: c_int = 2;

/// A posted receive request, owned by the SRQ until consumed.
#[derive(Debug, Clone, Copy)]
pub struct Pooled {
    wr_id: u64,
    nsge: u8,
    sges: [Sge; MAX_SRQ_SGE],
}

impl Pooled {
    fn sges(&self) -> &[Sge] {
        &self.sges[..usize::from(self.nsge)]
    }
}

/// What an SRQ's lock protects.
#[derive(Debug)]
struct SrqInner {
    /// Posted and not handed to a QP.
    pool: VecDeque<Pooled>,
    /// The attached QPs.
    qps: Vec<NonNull<Qp>>,
    /// Requests posted and not consumed (pool + every QP's share).
    available: u32,
    /// The armed limit (0: not armed).
    limit: u32,
}

/// A shared receive queue. `ibv_srq` comes first.
#[repr(C)]
#[derive(Debug)]
pub struct Srq {
    /// The C structure.
    pub c: Shared<ibv_srq>,
    /// Its PD.
    pd: NonNull<Pd>,
    /// The depth asked for.
    pub max_wr: u32,
    /// SGEs per request.
    pub max_sge: u32,
    inner: Mutex<SrqInner>,
    /// QPs attached (`ibv_destroy_srq` refuses while any).
    attached: AtomicUsize,
}

/// A QP's side of the emulation (in the QP's lock): its SRQ, whether its
/// queue takes receives (INIT or later), and the requests handed to it, in
/// the order its rnic queue holds them.
#[derive(Debug, Default)]
pub struct Attachment {
    /// The SRQ.
    pub srq: Option<NonNull<Srq>>,
    ready: bool,
    handed: VecDeque<Pooled>,
}

impl Attachment {
    /// The side of a QP attached to `srq` (or to none).
    pub fn new(srq: Option<NonNull<Srq>>) -> Attachment {
        Attachment {
            srq,
            ready: false,
            handed: VecDeque::new(),
        }
    }
}

impl Srq {
    /// The SRQ behind an `ibv_srq *` of this library.
    ///
    /// # Safety
    ///
    /// `srq` came from [`ibv_create_srq`] and was not destroyed.
    pub unsafe fn from_ptr<'a>(srq: *mut ibv_srq) -> &'a Srq {
        // SAFETY: the C struct is the first field of a repr(C) Srq.
        unsafe { &*srq.cast::<Srq>() }
    }

    fn ctx(&self) -> &Context {
        // SAFETY: a PD outlives its SRQs, a context its PDs.
        unsafe { self.pd.as_ref() }.ctx()
    }

    /// Each attached QP's share of the requests.
    fn share(&self, nqps: usize) -> usize {
        (self.max_wr as usize).div_ceil(nqps.max(1)).max(1)
    }

    /// The receive-queue depth of the next QP to attach: its share once it
    /// is attached. The k-th QP gets `max_wr / k`, at least every later
    /// share while QPs are only added, and the queues of n QPs hold about
    /// `max_wr · ln n` in all, not `n · max_wr` (a provider that reserves
    /// completion-queue room for every receive its QPs can hold, rnic-mlx5,
    /// then fits `ibv_srq_pingpong`'s 16 QPs on one CQ). A share larger than
    /// a queue (after QPs were destroyed) leaves the rest in the pool.
    pub fn next_qp_depth(&self) -> u32 {
        self.share(self.attached.load(Ordering::Acquire) + 1) as u32
    }

    /// Attach `q` (at its creation, before anyone else can reach it).
    pub fn attach(&self, q: &Qp) {
        self.inner.lock().qps.push(NonNull::from(q));
        self.attached.fetch_add(1, Ordering::AcqRel);
    }

    /// Detach `q` at its destruction; its requests go back to the pool.
    pub fn detach(&self, q: &Qp) {
        let mut s = self.inner.lock();
        s.qps.retain(|p| !std::ptr::eq(p.as_ptr(), q));
        let mut inner = q.inner.lock();
        let back: Vec<Pooled> = inner.srq.handed.drain(..).collect();
        for p in back.into_iter().rev() {
            s.pool.push_front(p);
        }
        drop(inner);
        self.attached.fetch_sub(1, Ordering::AcqRel);
        self.distribute(&mut s);
    }

    /// `q` changed state to `state` (after a successful modify): INIT and
    /// later take receives; ERR and RESET give theirs back (RESET discards
    /// them in rnic; ERR flushes them, and `ibv_poll_cq` swallows those
    /// flushes through [`Srq::on_completion`]).
    pub fn state_changed(&self, q: &Qp, state: QpState) {
        let mut s = self.inner.lock();
        let mut inner = q.inner.lock();
        match state {
            QpState::Init | QpState::Rtr | QpState::Rts | QpState::Sqd => {
                inner.srq.ready = true;
            }
            QpState::Reset => {
                inner.srq.ready = false;
                let back: Vec<Pooled> = inner.srq.handed.drain(..).collect();
                for p in back.into_iter().rev() {
                    s.pool.push_front(p);
                }
            }
            QpState::Err | QpState::Sqe => {
                inner.srq.ready = false;
            }
        }
        drop(inner);
        if state == QpState::Err {
            raise(
                self.ctx(),
                IBV_EVENT_QP_LAST_WQE_REACHED,
                q.c.get().cast::<c_void>(),
            );
        }
        self.distribute(&mut s);
    }

    /// Hand pooled requests to attached QPs that are ready and below their
    /// share.
    fn distribute(&self, s: &mut SrqInner) {
        if s.pool.is_empty() {
            return;
        }
        let share = self.share(s.qps.len());
        for qp in s.qps.clone() {
            if s.pool.is_empty() {
                break;
            }
            // SAFETY: attached QPs are live (destroy detaches first).
            let q = unsafe { qp.as_ref() };
            let mut inner = q.inner.lock();
            while inner.srq.ready && inner.srq.handed.len() < share {
                let Some(p) = s.pool.pop_front() else { break };
                match inner.qp.post_recv(&[RecvWr::new(p.wr_id, p.sges())]) {
                    Ok(()) => inner.srq.handed.push_back(p),
                    Err(e) => {
                        s.pool.push_front(p);
                        tracing::debug!(error = %e, qpn = q.qpn, "SRQ hand-out refused");
                        break;
                    }
                }
            }
        }
    }

    /// A receive completion `wc` of attached QP `q` was polled: `false`
    /// when it must not reach the application (a flushed request, back in
    /// the pool).
    pub fn on_completion(&self, q: &Qp, wc: &WorkCompletion) -> bool {
        let mut s = self.inner.lock();
        let mut inner = q.inner.lock();
        let Some(front) = inner.srq.handed.pop_front() else {
            return true;
        };
        drop(inner);
        if wc.status == WcStatus::WrFlushErr {
            s.pool.push_front(front);
            self.distribute(&mut s);
            return false;
        }
        s.available = s.available.saturating_sub(1);
        if s.limit != 0 && s.available < s.limit {
            s.limit = 0;
            raise(
                self.ctx(),
                IBV_EVENT_SRQ_LIMIT_REACHED,
                self.c.get().cast::<c_void>(),
            );
        }
        self.distribute(&mut s);
        true
    }
}

/// `ibv_create_srq`.
///
/// # Safety
///
/// `pd` is a live PD; `attr` points to an `ibv_srq_init_attr`.
pub unsafe extern "C" fn ibv_create_srq(
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    if pd.is_null() || attr.is_null() {
        return fail_null(libc::EINVAL);
    }
    // SAFETY: the caller's live PD.
    let p = unsafe { Pd::from_ptr(pd) };
    // SAFETY: the caller's attributes.
    let a = unsafe { &mut *attr };
    if a.attr.max_wr == 0 || a.attr.max_wr > MAX_SRQ_WR || a.attr.max_sge as usize > MAX_SRQ_SGE {
        warn(format_args!(
            "ibv_create_srq: max_wr {} / max_sge {}: rnic's SRQs hold 1..={MAX_SRQ_WR} requests of at most {MAX_SRQ_SGE} SGEs",
            a.attr.max_wr, a.attr.max_sge
        ));
        return fail_null(libc::EINVAL);
    }
    p.children.fetch_add(1, Ordering::AcqRel);
    let obj = Box::new(Srq {
        c: Shared::new(ibv_srq {
            context: p.ctx().as_ptr(),
            srq_context: a.srq_context,
            pd,
            handle: next_handle(),
            mutex: libc::PTHREAD_MUTEX_INITIALIZER,
            cond: libc::PTHREAD_COND_INITIALIZER,
            events_completed: 0,
        }),
        pd: NonNull::from(p),
        max_wr: a.attr.max_wr,
        max_sge: a.attr.max_sge.max(1),
        inner: Mutex::new(SrqInner {
            pool: VecDeque::with_capacity(a.attr.max_wr as usize),
            qps: Vec::new(),
            available: 0,
            limit: a.attr.srq_limit,
        }),
        attached: AtomicUsize::new(0),
    });
    a.attr.max_sge = obj.max_sge;
    Box::leak(obj).c.get()
}

/// `ibv_context_ops.post_srq_recv` (the inline `ibv_post_srq_recv`).
///
/// # Safety
///
/// `srq` is a live SRQ; `wr` a list of valid requests; `bad` writable.
pub unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: the caller's live SRQ.
    let q = unsafe { Srq::from_ptr(srq) };
    let mut s = q.inner.lock();
    let mut cur = wr;
    let mut err = 0;
    while !cur.is_null() {
        // SAFETY: a request of the caller's list.
        let w = unsafe { &*cur };
        let n = usize::try_from(w.num_sge).unwrap_or(usize::MAX);
        if n > q.max_sge as usize || (n > 0 && w.sg_list.is_null()) {
            err = libc::EINVAL;
            break;
        }
        if s.available >= q.max_wr {
            err = libc::ENOMEM;
            break;
        }
        let mut p = Pooled {
            wr_id: w.wr_id,
            nsge: n as u8,
            sges: [Sge::default(); MAX_SRQ_SGE],
        };
        for (i, slot) in p.sges.iter_mut().enumerate().take(n) {
            // SAFETY: the application's list of `num_sge` entries.
            let c = unsafe { w.sg_list.wrapping_add(i).read() };
            *slot = Sge::new(c.addr, c.length, Lkey(c.lkey));
        }
        s.pool.push_back(p);
        s.available += 1;
        cur = w.next;
    }
    q.distribute(&mut s);
    if err != 0 {
        // SAFETY: the caller's output.
        return unsafe { crate::qp::post::refuse(bad, cur, err) };
    }
    0
}

/// `ibv_modify_srq`: arms `srq_limit` (`IBV_SRQ_LIMIT`); the depth is
/// fixed (`IBV_SRQ_MAX_WR` is `EINVAL`, as for a device without
/// `IBV_DEVICE_SRQ_RESIZE`).
///
/// # Safety
///
/// `srq` is a live SRQ; `attr` points to an `ibv_srq_attr`.
pub unsafe extern "C" fn ibv_modify_srq(
    srq: *mut ibv_srq,
    attr: *mut ibv_srq_attr,
    mask: c_int,
) -> c_int {
    if srq.is_null()
        || attr.is_null()
        || mask & IBV_SRQ_MAX_WR != 0
        || mask & !(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT) != 0
    {
        return fail(libc::EINVAL);
    }
    // SAFETY: the caller's live SRQ and attributes.
    let q = unsafe { Srq::from_ptr(srq) };
    // SAFETY: likewise.
    let a = unsafe { &*attr };
    if mask & IBV_SRQ_LIMIT != 0 {
        if a.srq_limit > q.max_wr {
            return fail(libc::EINVAL);
        }
        q.inner.lock().limit = a.srq_limit;
    }
    0
}

/// `ibv_query_srq`.
///
/// # Safety
///
/// `srq` is a live SRQ; `attr` is writable.
pub unsafe extern "C" fn ibv_query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    if srq.is_null() || attr.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: the caller's live SRQ.
    let q = unsafe { Srq::from_ptr(srq) };
    let limit = q.inner.lock().limit;
    // SAFETY: the caller's output.
    unsafe {
        attr.write(ibv_srq_attr {
            max_wr: q.max_wr,
            max_sge: q.max_sge,
            srq_limit: limit,
        });
    }
    0
}

/// `ibv_destroy_srq`: `EBUSY` while QPs are attached.
///
/// # Safety
///
/// `srq` is a live SRQ of this library.
pub unsafe extern "C" fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
    if srq.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: the caller's live SRQ.
    let q = unsafe { Srq::from_ptr(srq) };
    if q.attached.load(Ordering::Acquire) != 0 {
        return fail(libc::EBUSY);
    }
    // SAFETY: a PD outlives its SRQs.
    unsafe { q.pd.as_ref() }
        .children
        .fetch_sub(1, Ordering::AcqRel);
    // SAFETY: leaked by `ibv_create_srq`; nothing refers to it any more.
    drop(unsafe { Box::from_raw(srq.cast::<Srq>()) });
    0
}
