//! Queue pairs, control path: `ibv_create_qp`, `ibv_create_qp_ex` (the
//! `verbs_context` operation behind the inline), `ibv_modify_qp`,
//! `ibv_query_qp`, `ibv_destroy_qp`, `ibv_qp_to_qp_ex`. The per-request
//! path (`ibv_post_send`, `ibv_post_recv`, the `ibv_wr_*` builder) is in
//! [`crate::qp::post`].

pub mod post;

use std::ffi::{c_int, c_uint, c_void};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use parking_lot::Mutex;
use rnic::core::{
    AccessFlags, Memory, MemoryRegion, Mtu, Psn, QpAttr, QpAttrMask, QpCaps, QpInitAttr, QpState,
    QpType, Qpn, QueuePair,
};

use crate::abi::{
    IBV_QP_ATTR_MASK_KNOWN, IBV_QP_AV, IBV_QP_EX_SUPPORTED, IBV_QP_INIT_ATTR_CREATE_FLAGS,
    IBV_QP_INIT_ATTR_PD, IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, IBV_QP_RATE_LIMIT, IBV_QP_STATE,
    IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD, Shared, ibv_context, ibv_cq, ibv_pd, ibv_qp, ibv_qp_attr,
    ibv_qp_cap, ibv_qp_ex, ibv_qp_init_attr, ibv_qp_init_attr_ex, zeroed,
};
use crate::context::Context;
use crate::cq::Cq;
use crate::pd::{Pd, address_vector, ah_attr_of, next_handle};
use crate::{errno_of, fail, fail_null, warn};

use post::Builder;

/// Send requests an `ibv_post_send` list or an `ibv_wr_complete` hands to
/// rnic per call; also the number of inline payloads the bounce region holds.
pub const CHUNK: usize = 16;

/// What a QP's lock protects.
#[derive(Debug)]
pub struct QpInner {
    /// rnic's queue pair.
    pub qp: QueuePair,
    /// Where inline payloads are copied before rnic copies them into its
    /// queue (rnic reads inline data through a key; the application's
    /// inline buffers need none): `CHUNK` slots of `max_inline` bytes.
    pub bounce: Option<(MemoryRegion, Arc<dyn Memory>)>,
    /// The `ibv_wr_*` requests between `ibv_wr_start` and `ibv_wr_complete`.
    pub builder: Builder,
    /// Its shared receive queue's requests in its queue, if it has one.
    pub srq: crate::srq::Attachment,
}

/// A queue pair. `ibv_qp_ex` comes first (`ibv_qp` is its prefix).
#[repr(C)]
#[derive(Debug)]
pub struct Qp {
    /// The C structure.
    pub c: Shared<ibv_qp_ex>,
    /// Its context.
    pub ctx: NonNull<Context>,
    /// Its PD.
    pub pd: NonNull<Pd>,
    send_cq: NonNull<Cq>,
    recv_cq: NonNull<Cq>,
    /// Its number.
    pub qpn: u32,
    /// RC or UD.
    pub qp_type: QpType,
    /// Capacities granted.
    pub caps: QpCaps,
    /// Bytes one inline request may carry.
    pub max_inline: usize,
    /// Created through `ibv_create_qp_ex` with send operations: what
    /// `ibv_qp_to_qp_ex` hands out.
    ex: bool,
    /// The queue, posted to under this lock (`ibv_wr_start` holds it until
    /// `ibv_wr_complete` / `ibv_wr_abort`).
    pub inner: Mutex<QpInner>,
}

impl Qp {
    /// The QP behind an `ibv_qp *` (or `ibv_qp_ex *`) of this library.
    ///
    /// # Safety
    ///
    /// `qp` came from `ibv_create_qp[_ex]` and was not destroyed.
    pub unsafe fn from_ptr<'a>(qp: *mut ibv_qp) -> &'a Qp {
        // SAFETY: the C struct is the first field of a repr(C) Qp.
        unsafe { &*qp.cast::<Qp>() }
    }

    /// Its context.
    pub fn ctx(&self) -> &Context {
        // SAFETY: a context outlives its QPs.
        unsafe { self.ctx.as_ref() }
    }
}

/// The rnic QP type of an `ibv_qp_type`, or why not.
fn qp_type_of(raw: c_uint) -> Result<QpType, (c_int, &'static str)> {
    match raw {
        IBV_QPT_RC => Ok(QpType::Rc),
        IBV_QPT_UD => Ok(QpType::Ud),
        IBV_QPT_UC => Err((libc::EOPNOTSUPP, "UC queue pairs: rnic runs RC and UD")),
        _ => Err((
            libc::EOPNOTSUPP,
            "this QP type (XRC, raw packet, driver): rnic runs RC and UD",
        )),
    }
}

/// Everything `ibv_create_qp` and `create_qp_ex` share.
struct Create {
    pd: *mut ibv_pd,
    send_cq: *mut ibv_cq,
    recv_cq: *mut ibv_cq,
    srq: *mut crate::abi::ibv_srq,
    cap: ibv_qp_cap,
    qp_type: c_uint,
    sq_sig_all: bool,
    qp_context: *mut c_void,
    ex: bool,
}

fn create(a: &Create) -> Result<(*mut Qp, ibv_qp_cap), (c_int, String)> {
    let err = |(e, m): (c_int, &str)| (e, m.to_owned());
    if a.pd.is_null() || a.send_cq.is_null() || a.recv_cq.is_null() {
        return Err(err((
            libc::EINVAL,
            "a QP needs a PD, a send CQ and a receive CQ",
        )));
    }
    let qp_type = qp_type_of(a.qp_type).map_err(err)?;
    // SAFETY: the caller's live PD.
    let p = unsafe { Pd::from_ptr(a.pd) };
    // SAFETY: the caller's live CQs.
    let scq = unsafe { Cq::from_ptr(a.send_cq) };
    // SAFETY: likewise.
    let rcq = unsafe { Cq::from_ptr(a.recv_cq) };
    let c = p.ctx();
    if scq.ctx != p.ctx || rcq.ctx != p.ctx {
        return Err(err((
            libc::EINVAL,
            "the PD and CQs belong to different contexts",
        )));
    }
    let max_inline = a.cap.max_inline_data;
    if max_inline > c.attr.max_inline_data {
        return Err((
            libc::EINVAL,
            format!(
                "max_inline_data {max_inline} exceeds the device's {}",
                c.attr.max_inline_data
            ),
        ));
    }
    // SAFETY: the caller's live SRQ, when given.
    let srq = (!a.srq.is_null()).then(|| unsafe { crate::srq::Srq::from_ptr(a.srq) });
    if let Some(s) = srq
        // SAFETY: the caller's live SRQ.
        && !std::ptr::eq(unsafe { (*s.c.get()).context }, c.as_ptr())
    {
        return Err(err((libc::EINVAL, "the SRQ belongs to another context")));
    }
    // A QP of an SRQ holds its share of the SRQ's requests in its own queue
    // (the emulation hands them to it: crate::srq).
    let (max_recv_wr, max_recv_sge) = match srq {
        Some(s) => (s.next_qp_depth(), s.max_sge),
        None => (a.cap.max_recv_wr.max(1), a.cap.max_recv_sge.max(1)),
    };
    let caps = QpCaps {
        max_send_wr: a.cap.max_send_wr.max(1),
        max_recv_wr,
        max_send_sge: a.cap.max_send_sge.max(1),
        max_recv_sge,
        max_inline_data: max_inline,
    };
    let init = QpInitAttr {
        qp_type,
        caps,
        sq_sig_all: a.sq_sig_all,
    };
    let qp = if std::ptr::eq(scq, rcq) {
        let g = scq.inner.lock();
        p.pd.create_qp(&g.cq, &g.cq, &init)
    } else {
        // Two CQ locks, always in address order.
        let (first, second) = if (scq as *const Cq) < (rcq as *const Cq) {
            (scq, rcq)
        } else {
            (rcq, scq)
        };
        let g1 = first.inner.lock();
        let g2 = second.inner.lock();
        let (s, r) = if std::ptr::eq(first, scq) {
            (&g1.cq, &g2.cq)
        } else {
            (&g2.cq, &g1.cq)
        };
        p.pd.create_qp(s, r, &init)
    }
    .map_err(|e| (errno_of(&e), e.to_string()))?;
    let granted = qp.caps();
    let bounce = if max_inline > 0 {
        let len = max_inline as usize * CHUNK;
        let mem = c
            .mem
            .alloc(len)
            .map_err(|e| (libc::ENOMEM, format!("the inline bounce buffer: {e}")))?;
        let mr =
            p.pd.reg_mr(Arc::clone(&mem), AccessFlags::empty())
                .map_err(|e| {
                    (
                        errno_of(&e),
                        format!("registering the inline bounce buffer: {e}"),
                    )
                })?;
        Some((mr, mem))
    } else {
        None
    };
    let qpn = qp.qpn().get();
    let mut x: ibv_qp_ex = zeroed();
    post::fill_ops(&mut x);
    let b = &mut x.qp_base;
    b.context = c.as_ptr();
    b.qp_context = a.qp_context;
    b.pd = a.pd;
    b.send_cq = a.send_cq;
    b.recv_cq = a.recv_cq;
    b.srq = a.srq;
    b.handle = next_handle();
    b.qp_num = qpn;
    b.state = QpState::Reset.as_raw();
    b.qp_type = a.qp_type;
    b.mutex = libc::PTHREAD_MUTEX_INITIALIZER;
    b.cond = libc::PTHREAD_COND_INITIALIZER;
    let cap = ibv_qp_cap {
        max_send_wr: granted.max_send_wr,
        max_recv_wr: granted.max_recv_wr,
        max_send_sge: granted.max_send_sge,
        max_recv_sge: granted.max_recv_sge,
        max_inline_data: granted.max_inline_data,
    };
    let obj = Box::new(Qp {
        c: Shared::new(x),
        ctx: p.ctx,
        pd: NonNull::from(p),
        send_cq: NonNull::from(scq),
        recv_cq: NonNull::from(rcq),
        qpn,
        qp_type,
        caps: granted,
        max_inline: max_inline as usize,
        ex: a.ex,
        inner: Mutex::new(QpInner {
            qp,
            bounce,
            builder: Builder::with_capacity(&granted),
            srq: crate::srq::Attachment::new(srq.map(NonNull::from)),
        }),
    });
    let raw = Box::into_raw(obj);
    if let Some(s) = srq {
        // SAFETY: just created; lives until ibv_destroy_qp, which detaches.
        let q = unsafe { &*raw };
        s.attach(q);
        c.srq_qps.write().insert(qpn, raw as usize);
        c.srq_qp_count.fetch_add(1, Ordering::AcqRel);
    }
    c.adopt();
    p.children.fetch_add(1, Ordering::AcqRel);
    scq.qps.fetch_add(1, Ordering::AcqRel);
    rcq.qps.fetch_add(1, Ordering::AcqRel);
    Ok((raw, cap))
}

/// `ibv_create_qp`; writes the capacities granted back to `attr->cap`.
///
/// # Safety
///
/// `pd` is a live PD; `attr` points to an `ibv_qp_init_attr` naming live CQs.
pub unsafe extern "C" fn ibv_create_qp(
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    if pd.is_null() || attr.is_null() {
        return fail_null(libc::EINVAL);
    }
    // SAFETY: the caller's attributes.
    let a = unsafe { &mut *attr };
    let r = create(&Create {
        pd,
        send_cq: a.send_cq,
        recv_cq: a.recv_cq,
        srq: a.srq,
        cap: a.cap,
        qp_type: a.qp_type,
        sq_sig_all: a.sq_sig_all != 0,
        qp_context: a.qp_context,
        ex: false,
    });
    created(r, &mut a.cap, "ibv_create_qp")
}

/// What both create calls return: the QP, with the capacities granted
/// written back to the caller's `cap`, or NULL with errno and a message.
fn created(
    r: Result<(*mut Qp, ibv_qp_cap), (c_int, String)>,
    cap: &mut ibv_qp_cap,
    what: &str,
) -> *mut ibv_qp {
    match r {
        Ok((q, granted)) => {
            *cap = granted;
            q.cast()
        }
        Err((e, msg)) => {
            warn(format_args!("{what}: {msg}"));
            fail_null(e)
        }
    }
}

/// `verbs_context.create_qp_ex` (the inline `ibv_create_qp_ex` with more
/// than a PD in `comp_mask`; perftest asks for send operations, for the
/// `ibv_wr_*` API).
///
/// # Safety
///
/// `ctx` is an open context; `attr` points to an `ibv_qp_init_attr_ex`.
pub unsafe extern "C" fn create_qp_ex(
    ctx: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    if ctx.is_null() || attr.is_null() {
        return fail_null(libc::EINVAL);
    }
    // SAFETY: the caller's attributes.
    let a = unsafe { &mut *attr };
    let known =
        IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    let refuse = |why: String| {
        warn(format_args!("ibv_create_qp_ex: {why}"));
        fail_null::<ibv_qp>(libc::EOPNOTSUPP)
    };
    if a.comp_mask & IBV_QP_INIT_ATTR_PD == 0 {
        warn(format_args!(
            "ibv_create_qp_ex: comp_mask lacks IBV_QP_INIT_ATTR_PD"
        ));
        return fail_null(libc::EINVAL);
    }
    if a.comp_mask & !known != 0 {
        return refuse(format!(
            "comp_mask {:#x} asks for XRC domains, TSO, RSS or indirection tables, which rnic lacks",
            a.comp_mask
        ));
    }
    if a.comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS != 0 && a.create_flags != 0 {
        return refuse(format!(
            "create_flags {:#x} are not supported",
            a.create_flags
        ));
    }
    let ex = a.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0;
    if ex && a.send_ops_flags & !IBV_QP_EX_SUPPORTED != 0 {
        return refuse(format!(
            "send_ops_flags {:#x}: rnic posts RDMA write (with immediate), send (with immediate or invalidate), \
             RDMA read and the two atomics; not bind-MW, local invalidate, TSO or atomic write",
            a.send_ops_flags
        ));
    }
    // SAFETY: the caller's PD (checked non-NULL in `create`).
    if !a.pd.is_null() && !std::ptr::eq(unsafe { (*a.pd).context }, ctx) {
        warn(format_args!(
            "ibv_create_qp_ex: the PD belongs to another context"
        ));
        return fail_null(libc::EINVAL);
    }
    let r = create(&Create {
        pd: a.pd,
        send_cq: a.send_cq,
        recv_cq: a.recv_cq,
        srq: a.srq,
        cap: a.cap,
        qp_type: a.qp_type,
        sq_sig_all: a.sq_sig_all != 0,
        qp_context: a.qp_context,
        ex,
    });
    created(r, &mut a.cap, "ibv_create_qp_ex")
}

/// `ibv_qp_to_qp_ex`: the `ibv_qp_ex` of a QP created with send operations,
/// NULL otherwise (as rdma-core).
///
/// # Safety
///
/// `qp` is a live QP.
pub unsafe extern "C" fn ibv_qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
    if qp.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: the caller's live QP.
    let q = unsafe { Qp::from_ptr(qp) };
    if q.ex {
        q.c.get()
    } else {
        std::ptr::null_mut()
    }
}

/// rnic's attributes and mask of an `ibv_modify_qp` call.
fn rnic_attr(a: &ibv_qp_attr, mask: c_int) -> Result<(QpAttr, QpAttrMask), (c_int, String)> {
    if mask & IBV_QP_RATE_LIMIT != 0 {
        return Err((
            libc::EOPNOTSUPP,
            "IBV_QP_RATE_LIMIT: rnic has no per-QP rate limiter".to_owned(),
        ));
    }
    if mask & !IBV_QP_ATTR_MASK_KNOWN != 0 {
        return Err((
            libc::EINVAL,
            format!("unknown attribute mask bits {mask:#x}"),
        ));
    }
    let m = QpAttrMask::from_bits_truncate(mask as u32);
    let state = |raw: c_uint| {
        QpState::from_raw(raw).ok_or((
            libc::EINVAL,
            format!("QP state {raw} does not exist (0..=6)"),
        ))
    };
    let mut attr = QpAttr::default();
    if m.contains(QpAttrMask::STATE) {
        attr.qp_state = state(a.qp_state)?;
    }
    if m.contains(QpAttrMask::CUR_STATE) {
        attr.cur_qp_state = state(a.cur_qp_state)?;
    }
    attr.en_sqd_async_notify = a.en_sqd_async_notify != 0;
    attr.qp_access_flags = AccessFlags::from_bits_truncate(a.qp_access_flags);
    attr.pkey_index = a.pkey_index;
    attr.port_num = a.port_num;
    attr.qkey = a.qkey;
    if m.contains(QpAttrMask::AV) {
        attr.ah_attr = address_vector(&a.ah_attr).map_err(|e| (libc::EINVAL, e.to_owned()))?;
    }
    if m.contains(QpAttrMask::PATH_MTU) {
        attr.path_mtu = u8::try_from(a.path_mtu)
            .ok()
            .and_then(|v| Mtu::from_enum(v).ok())
            .ok_or((
                libc::EINVAL,
                format!("path_mtu {} is not an ibv_mtu (1..=5)", a.path_mtu),
            ))?;
    }
    attr.timeout = a.timeout;
    attr.retry_cnt = a.retry_cnt;
    attr.rnr_retry = a.rnr_retry;
    attr.rq_psn = Psn::from_wire(a.rq_psn);
    attr.max_rd_atomic = a.max_rd_atomic;
    attr.min_rnr_timer = a.min_rnr_timer;
    attr.sq_psn = Psn::from_wire(a.sq_psn);
    attr.max_dest_rd_atomic = a.max_dest_rd_atomic;
    attr.dest_qp_num = Qpn::from_wire(a.dest_qp_num);
    attr.validate(m)
        .map_err(|e| (libc::EINVAL, e.to_string()))?;
    Ok((attr, m))
}

/// `ibv_modify_qp`: 0 or an errno.
///
/// # Safety
///
/// `qp` is a live QP; `attr` points to an `ibv_qp_attr`.
pub unsafe extern "C" fn ibv_modify_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    mask: c_int,
) -> c_int {
    if qp.is_null() || attr.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: the caller's live QP.
    let q = unsafe { Qp::from_ptr(qp) };
    // SAFETY: the caller's attributes.
    let a = unsafe { &*attr };
    let (ra, rm) = match rnic_attr(a, mask) {
        Ok(v) => v,
        Err((e, msg)) => {
            warn(format_args!("ibv_modify_qp(QPN {:#x}): {msg}", q.qpn));
            return fail(e);
        }
    };
    let mut inner = q.inner.lock();
    match inner.qp.modify(&ra, rm) {
        Ok(()) => {
            let srq = inner.srq.srq;
            drop(inner);
            if mask & IBV_QP_STATE != 0 {
                // SAFETY: the QP's own C struct (rdma-core updates it too).
                unsafe { q.c.with(|x| x.qp_base.state = ra.qp_state.as_raw()) };
                if let Some(s) = srq {
                    // SAFETY: an SRQ outlives its QPs (destroy refuses while
                    // they are attached).
                    unsafe { s.as_ref() }.state_changed(q, ra.qp_state);
                }
            }
            0
        }
        Err(e) => {
            warn(format_args!(
                "ibv_modify_qp(QPN {:#x}, mask {mask:#x}{}): {e}",
                q.qpn,
                if mask & IBV_QP_AV != 0 {
                    ", with an address vector"
                } else {
                    ""
                }
            ));
            fail(errno_of(&e))
        }
    }
}

/// `ibv_query_qp`: the current attributes and the creation attributes.
///
/// # Safety
///
/// `qp` is a live QP; `attr` and `init` point to writable structures.
pub unsafe extern "C" fn ibv_query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    mask: c_int,
    init: *mut ibv_qp_init_attr,
) -> c_int {
    let _ = mask;
    if qp.is_null() || attr.is_null() || init.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: the caller's live QP.
    let q = unsafe { Qp::from_ptr(qp) };
    let r = q.inner.lock().qp.query();
    let ra = match r {
        Ok(a) => a,
        Err(e) => return fail(errno_of(&e)),
    };
    let cap = ibv_qp_cap {
        max_send_wr: q.caps.max_send_wr,
        max_recv_wr: q.caps.max_recv_wr,
        max_send_sge: q.caps.max_send_sge,
        max_recv_sge: q.caps.max_recv_sge,
        max_inline_data: q.caps.max_inline_data,
    };
    let mut o: ibv_qp_attr = zeroed();
    o.qp_state = ra.qp_state.as_raw();
    o.cur_qp_state = ra.qp_state.as_raw();
    o.path_mtu = u32::from(ra.path_mtu.to_enum());
    o.qkey = ra.qkey;
    o.rq_psn = ra.rq_psn.get();
    o.sq_psn = ra.sq_psn.get();
    o.dest_qp_num = ra.dest_qp_num.get();
    o.qp_access_flags = ra.qp_access_flags.bits();
    o.cap = cap;
    o.ah_attr = ah_attr_of(&ra.ah_attr, ra.port_num);
    o.pkey_index = ra.pkey_index;
    o.en_sqd_async_notify = u8::from(ra.en_sqd_async_notify);
    o.max_rd_atomic = ra.max_rd_atomic;
    o.max_dest_rd_atomic = ra.max_dest_rd_atomic;
    o.min_rnr_timer = ra.min_rnr_timer;
    o.port_num = ra.port_num;
    o.timeout = ra.timeout;
    o.retry_cnt = ra.retry_cnt;
    o.rnr_retry = ra.rnr_retry;
    let sq_sig_all = c_int::from(q.inner.lock().qp.sq_sig_all());
    // SAFETY: the QP's own C struct.
    let init_attr = unsafe {
        q.c.with(|x| {
            x.qp_base.state = o.qp_state;
            ibv_qp_init_attr {
                qp_context: x.qp_base.qp_context,
                send_cq: x.qp_base.send_cq,
                recv_cq: x.qp_base.recv_cq,
                srq: x.qp_base.srq,
                cap,
                qp_type: x.qp_base.qp_type,
                sq_sig_all,
            }
        })
    };
    // SAFETY: the caller's output.
    unsafe { init.write(init_attr) };
    // SAFETY: the caller's output.
    unsafe { attr.write(o) };
    0
}

/// `ibv_destroy_qp`.
///
/// # Safety
///
/// `qp` is a live QP of this library.
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    if qp.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: leaked by `create`; the caller gives it up now.
    let q = unsafe { Box::from_raw(qp.cast::<Qp>()) };
    let srq = q.inner.lock().srq.srq;
    if let Some(s) = srq {
        let c = q.ctx();
        c.srq_qps.write().remove(&q.qpn);
        c.srq_qp_count.fetch_sub(1, Ordering::AcqRel);
        // SAFETY: an SRQ outlives its QPs; its requests come back to it.
        unsafe { s.as_ref() }.detach(&q);
    }
    // SAFETY: PD, CQs and context outlive their QPs (their destroy calls
    // refuse while this QP is counted).
    unsafe { q.send_cq.as_ref() }
        .qps
        .fetch_sub(1, Ordering::AcqRel);
    // SAFETY: as above.
    unsafe { q.recv_cq.as_ref() }
        .qps
        .fetch_sub(1, Ordering::AcqRel);
    // SAFETY: as above.
    unsafe { q.pd.as_ref() }
        .children
        .fetch_sub(1, Ordering::AcqRel);
    q.ctx().release();
    drop(q);
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modify_attributes_map_onto_rnic() {
        let mut a: ibv_qp_attr = zeroed();
        a.qp_state = 2; // RTR
        a.path_mtu = 3; // 1024
        a.dest_qp_num = 0x12_3456;
        a.rq_psn = 0xab_cdef;
        a.max_dest_rd_atomic = 1;
        a.min_rnr_timer = 12;
        a.ah_attr.is_global = 1;
        a.ah_attr.port_num = 1;
        a.ah_attr.grh.hop_limit = 1;
        let mask = 1 | (1 << 7) | (1 << 8) | (1 << 20) | (1 << 12) | (1 << 17) | (1 << 15);
        let (r, m) = rnic_attr(&a, mask).expect("valid");
        assert_eq!(r.qp_state, QpState::Rtr);
        assert_eq!(r.path_mtu, Mtu::Mtu1024);
        assert_eq!(r.dest_qp_num.get(), 0x12_3456);
        assert_eq!(r.rq_psn.get(), 0xab_cdef);
        assert_eq!(m.bits(), mask as u32);
        a.ah_attr.is_global = 0;
        assert_eq!(
            rnic_attr(&a, mask).map_err(|e| e.0).err(),
            Some(libc::EINVAL)
        );
        assert_eq!(
            rnic_attr(&a, 1 << 25).map_err(|e| e.0).err(),
            Some(libc::EOPNOTSUPP)
        );
        a.ah_attr.is_global = 1;
        a.path_mtu = 9;
        assert_eq!(
            rnic_attr(&a, mask).map_err(|e| e.0).err(),
            Some(libc::EINVAL)
        );
    }

    #[test]
    fn only_rc_and_ud_exist() {
        assert_eq!(qp_type_of(IBV_QPT_RC).ok(), Some(QpType::Rc));
        assert_eq!(qp_type_of(IBV_QPT_UD).ok(), Some(QpType::Ud));
        assert_eq!(
            qp_type_of(IBV_QPT_UC).map_err(|e| e.0).err(),
            Some(libc::EOPNOTSUPP)
        );
        assert_eq!(qp_type_of(9).map_err(|e| e.0).err(), Some(libc::EOPNOTSUPP));
    }
}
