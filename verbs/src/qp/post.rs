//! Queue pairs, per-request path: `ibv_context_ops.post_send` /
//! `post_recv` (the header's inline `ibv_post_send` / `ibv_post_recv`) and
//! the `ibv_qp_ex` builder (`ibv_wr_start`, `ibv_wr_rdma_write`,
//! `ibv_wr_set_sge`, …, `ibv_wr_complete`), which perftest uses by default.
//!
//! A C request list is converted on the stack — `CHUNK` requests and their
//! SGEs at a time, one request with no arrays at all when the list has one
//! (the common case) — and handed to rnic's `QueuePair::post_send` under
//! the QP's lock: no allocation, no table lookup. Inline payloads
//! (`IBV_SEND_INLINE`) are read from the application's buffers, which need
//! no registration, into the QP's bounce slots, which rnic's engine reads
//! through their key at post time. On a refusal `*bad_wr` is the first
//! request not posted, as in libibverbs; the requests before it are posted.

use std::ffi::{c_int, c_uint, c_void};
use std::ptr::NonNull;

use parking_lot::lock_api::RawMutex as _;
use rnic::core::{Lkey, Qpn, RecvWr, Rkey, SendFlags, SendOp, SendWr, Sge};

use super::{CHUNK, Qp, QpInner};
use crate::abi::{
    IBV_SEND_INLINE, IBV_SEND_KNOWN, IBV_WR_ATOMIC_CMP_AND_SWP, IBV_WR_ATOMIC_FETCH_AND_ADD,
    IBV_WR_RDMA_READ, IBV_WR_RDMA_WRITE, IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WR_SEND,
    IBV_WR_SEND_WITH_IMM, IBV_WR_SEND_WITH_INV, ibv_ah, ibv_data_buf, ibv_qp, ibv_qp_ex,
    ibv_recv_wr, ibv_send_wr, ibv_sge,
};
use crate::pd::Ah;
use crate::{errno_of, post_errno};
use rnic::core::QpType;
use rnic::core::VerbsError;

/// SGEs one chunk of a request list may carry.
const CHUNK_SGES: usize = 64;
/// SGEs of a single request converted without the chunk arrays.
const ONE_SGES: usize = 4;
/// The largest inline payload (rnic-rxe allows 400 bytes, mlx5 236 on RC).
pub const MAX_INLINE: usize = 1024;

/// Where an inline request's payload is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Inline {
    /// Not inline.
    No,
    /// In the application's buffers its SGEs name (`ibv_post_send`).
    AppSges,
    /// In the builder's byte buffer (`ibv_wr_set_inline_data`).
    Bytes { start: u32, len: u32 },
}

/// One send request in rnic's terms, its SGEs named by position in a side
/// array (so a chunk can be built before it is borrowed).
#[derive(Debug, Clone, Copy)]
pub struct Staged {
    wr_id: u64,
    op: SendOp,
    flags: SendFlags,
    sge_start: u32,
    sge_len: u32,
    inline: Inline,
    ud: Option<(NonNull<Ah>, u32, u32)>,
}

impl Staged {
    const EMPTY: Staged = Staged {
        wr_id: 0,
        op: SendOp::Send,
        flags: SendFlags::empty(),
        sge_start: 0,
        sge_len: 0,
        inline: Inline::No,
        ud: None,
    };
}

/// The `ibv_wr_*` requests between `ibv_wr_start` and `ibv_wr_complete`.
#[derive(Debug, Default)]
pub struct Builder {
    items: Vec<Staged>,
    sges: Vec<Sge>,
    bytes: Vec<u8>,
    /// The first error a builder call met (reported by `ibv_wr_complete`).
    err: c_int,
    cap: usize,
}

impl Builder {
    /// Room for a full send queue of requests (no allocation per post).
    pub fn with_capacity(caps: &rnic::core::QpCaps) -> Builder {
        let n = caps.max_send_wr as usize;
        Builder {
            items: Vec::with_capacity(n.min(4096)),
            sges: Vec::with_capacity((n * caps.max_send_sge as usize).min(16384)),
            bytes: Vec::new(),
            err: 0,
            cap: n,
        }
    }

    fn clear(&mut self) {
        self.items.clear();
        self.sges.clear();
        self.bytes.clear();
        self.err = 0;
    }

    fn fail(&mut self, e: c_int) {
        if self.err == 0 {
            self.err = e;
        }
    }
}

/// The rnic operation of an `ibv_send_wr`, or `EINVAL`.
#[inline]
fn op_of(w: &ibv_send_wr) -> Result<SendOp, c_int> {
    // SAFETY: the union's variant is the one the opcode names; every bit
    // pattern of its integer fields is valid.
    let rdma = unsafe { w.wr.rdma };
    // SAFETY: likewise.
    let atomic = unsafe { w.wr.atomic };
    Ok(match w.opcode {
        IBV_WR_RDMA_WRITE => SendOp::RdmaWrite {
            remote_addr: rdma.remote_addr,
            rkey: Rkey(rdma.rkey),
        },
        IBV_WR_RDMA_WRITE_WITH_IMM => SendOp::RdmaWriteWithImm {
            remote_addr: rdma.remote_addr,
            rkey: Rkey(rdma.rkey),
            imm: u32::from_be(w.imm_data),
        },
        IBV_WR_SEND => SendOp::Send,
        IBV_WR_SEND_WITH_IMM => SendOp::SendWithImm {
            imm: u32::from_be(w.imm_data),
        },
        IBV_WR_SEND_WITH_INV => SendOp::SendWithInv {
            rkey: Rkey(w.imm_data),
        },
        IBV_WR_RDMA_READ => SendOp::RdmaRead {
            remote_addr: rdma.remote_addr,
            rkey: Rkey(rdma.rkey),
        },
        IBV_WR_ATOMIC_CMP_AND_SWP => SendOp::AtomicCmpSwap {
            remote_addr: atomic.remote_addr,
            rkey: Rkey(atomic.rkey),
            compare: atomic.compare_add,
            swap: atomic.swap,
        },
        IBV_WR_ATOMIC_FETCH_AND_ADD => SendOp::AtomicFetchAdd {
            remote_addr: atomic.remote_addr,
            rkey: Rkey(atomic.rkey),
            add: atomic.compare_add,
        },
        // Local invalidate, memory-window bind, TSO, atomic write, driver ops.
        _ => return Err(libc::EINVAL),
    })
}

/// Copy the C SGE list of `n` entries at `list` into `out`.
///
/// # Safety
///
/// `list` points to `n` readable `ibv_sge`s; `out.len() >= n`.
#[inline]
unsafe fn copy_sges(list: *const ibv_sge, n: usize, out: &mut [Sge]) {
    for (i, s) in out.iter_mut().enumerate().take(n) {
        // SAFETY: `i < n`, within the caller's list.
        let c = unsafe { list.wrapping_add(i).read() };
        *s = Sge::new(c.addr, c.length, Lkey(c.lkey));
    }
}

/// Stage the C request `w` (whose SGEs go to `sges[at..]`).
#[inline]
fn stage(q: &Qp, w: &ibv_send_wr, sges: &mut [Sge], at: usize) -> Result<Staged, c_int> {
    let n = usize::try_from(w.num_sge).map_err(|_| libc::EINVAL)?;
    if n > 0 && w.sg_list.is_null() {
        return Err(libc::EINVAL);
    }
    let room = sges.get_mut(at..at + n).ok_or(libc::EINVAL)?;
    // SAFETY: the application's list of `num_sge` entries.
    unsafe { copy_sges(w.sg_list, n, room) };
    let flags = SendFlags::from_bits_truncate(w.send_flags & IBV_SEND_KNOWN);
    let ud = if q.qp_type == QpType::Ud {
        // SAFETY: on a UD QP the `ud` member is the one in use.
        let ud = unsafe { w.wr.ud };
        let ah = NonNull::new(ud.ah.cast::<Ah>()).ok_or(libc::EINVAL)?;
        Some((ah, ud.remote_qpn, ud.remote_qkey))
    } else {
        None
    };
    Ok(Staged {
        wr_id: w.wr_id,
        op: op_of(w)?,
        flags,
        sge_start: at as u32,
        sge_len: n as u32,
        inline: if w.send_flags & IBV_SEND_INLINE != 0 {
            Inline::AppSges
        } else {
            Inline::No
        },
        ud,
    })
}

/// Copy the inline payload of `it` into bounce slot `slot`; the SGE of the
/// copy.
fn gather(
    q: &Qp,
    inner: &QpInner,
    it: &Staged,
    sges: &[Sge],
    bytes: &[u8],
    slot: usize,
) -> Result<Sge, c_int> {
    let Some((mr, mem)) = inner.bounce.as_ref() else {
        // The QP was created without max_inline_data.
        return Err(libc::EINVAL);
    };
    let mut buf = [0u8; MAX_INLINE];
    let len = match it.inline {
        Inline::AppSges => {
            let list = sges
                .get(it.sge_start as usize..(it.sge_start + it.sge_len) as usize)
                .ok_or(libc::EINVAL)?;
            let mut at = 0usize;
            for s in list {
                let l = s.length as usize;
                if at + l > q.max_inline {
                    return Err(libc::EINVAL);
                }
                if l > 0 {
                    // SAFETY: an inline request's SGEs name application
                    // memory readable for the duration of the post call (the
                    // verbs contract; no registration needed); `at + l` fits
                    // `buf` (max_inline <= MAX_INLINE).
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            s.addr as *const u8,
                            buf.as_mut_ptr().wrapping_add(at),
                            l,
                        );
                    }
                }
                at += l;
            }
            at
        }
        Inline::Bytes { start, len } => {
            let (start, len) = (start as usize, len as usize);
            if len > q.max_inline {
                return Err(libc::EINVAL);
            }
            buf[..len].copy_from_slice(bytes.get(start..start + len).ok_or(libc::EINVAL)?);
            len
        }
        Inline::No => return Err(libc::EINVAL),
    };
    let off = slot * q.max_inline;
    mem.write(off, &buf[..len]).map_err(|_| libc::EINVAL)?;
    Ok(Sge::new(mr.addr() + off as u64, len as u32, mr.lkey()))
}

/// Post `items` (at most `CHUNK`), their SGEs in `sges`, inline bytes of
/// builder requests in `bytes`. On a refusal, the position of the first
/// request not posted and the errno.
fn post_chunk(
    q: &Qp,
    inner: &mut QpInner,
    items: &[Staged],
    sges: &[Sge],
    bytes: &[u8],
) -> Result<(), (usize, c_int)> {
    if let [one] = items {
        return post_one(q, inner, one, sges, bytes).map_err(|e| (0, e));
    }
    let mut inline_sge = [Sge::default(); CHUNK];
    for (i, it) in items.iter().enumerate() {
        if it.inline != Inline::No {
            inline_sge[i] = gather(q, inner, it, sges, bytes, i).map_err(|e| (i, e))?;
        }
    }
    let mut wrs = [SendWr::send(0, &[]); CHUNK];
    for (i, it) in items.iter().enumerate() {
        let sg_list = if it.inline != Inline::No {
            &inline_sge[i..i + 1]
        } else {
            it.sg_list(sges)
        };
        wrs[i] = it.wr(sg_list);
    }
    inner
        .qp
        .post_send(&wrs[..items.len()])
        .map_err(|e| refusal(&e))
}

/// [`post_chunk`] of a single request: no arrays to fill.
#[inline]
fn post_one(
    q: &Qp,
    inner: &mut QpInner,
    it: &Staged,
    sges: &[Sge],
    bytes: &[u8],
) -> Result<(), c_int> {
    let inline_sge;
    let sg_list = if it.inline != Inline::No {
        inline_sge = [gather(q, inner, it, sges, bytes, 0)?];
        &inline_sge[..]
    } else {
        it.sg_list(sges)
    };
    let wr = it.wr(sg_list);
    inner
        .qp
        .post_send(std::slice::from_ref(&wr))
        .map_err(|e| refusal(&e).1)
}

impl Staged {
    /// Its SGEs in the side array.
    #[inline]
    fn sg_list<'a>(&self, sges: &'a [Sge]) -> &'a [Sge] {
        sges.get(self.sge_start as usize..(self.sge_start + self.sge_len) as usize)
            .unwrap_or(&[])
    }

    /// rnic's request over `sg_list`; a UD destination from the address
    /// handle the request names (live until its completion, by the verbs
    /// contract).
    #[inline]
    fn wr<'a>(&self, sg_list: &'a [Sge]) -> SendWr<'a> {
        let wr = SendWr {
            wr_id: self.wr_id,
            op: self.op,
            sg_list,
            flags: self.flags,
            ud: None,
        };
        match self.ud {
            Some((ah, qpn, qkey)) => {
                // SAFETY: a live AH of this library, named by a UD request.
                let ah: &'a Ah = unsafe { ah.as_ref() };
                wr.to_ud(ah.ah.ud_dest(Qpn::from_wire(qpn), qkey))
            }
            None => wr,
        }
    }
}

/// The position and errno of a refused post.
#[cold]
fn refusal(e: &VerbsError) -> (usize, c_int) {
    match e {
        VerbsError::PostSend { index, reason } | VerbsError::PostRecv { index, reason } => {
            (*index, post_errno(reason))
        }
        other => (0, errno_of(other)),
    }
}

/// Report request `w` as the first not posted (`*bad_wr`, when given) and
/// `e` as the errno; returns `e`.
///
/// # Safety
///
/// `bad_wr` is NULL or writable.
pub(crate) unsafe fn refuse<T>(bad_wr: *mut *mut T, w: *mut T, e: c_int) -> c_int {
    if !bad_wr.is_null() {
        // SAFETY: the caller's output (checked non-NULL).
        unsafe { bad_wr.write(w) };
    }
    crate::set_errno(e);
    e
}

/// `ibv_context_ops.post_send`.
///
/// # Safety
///
/// `qp` is a live QP; `wr` a list of valid requests; `bad_wr` writable.
pub unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    // SAFETY: the caller's live QP.
    let q = unsafe { Qp::from_ptr(qp) };
    let mut inner = q.inner.lock();
    // SAFETY: the caller's `bad_wr` output.
    let bad = |w: *mut ibv_send_wr, e: c_int| unsafe { refuse(bad_wr, w, e) };
    if wr.is_null() {
        return 0;
    }
    // SAFETY: the caller's request.
    let first = unsafe { &*wr };
    if first.next.is_null() && usize::try_from(first.num_sge).is_ok_and(|n| n <= ONE_SGES) {
        let mut sges = [Sge::default(); ONE_SGES];
        let it = match stage(q, first, &mut sges, 0) {
            Ok(it) => it,
            Err(e) => return bad(wr, e),
        };
        return match post_chunk(q, &mut inner, &[it], &sges, &[]) {
            Ok(()) => 0,
            Err((_, e)) => bad(wr, e),
        };
    }
    let mut cur = wr;
    while !cur.is_null() {
        let mut items = [Staged::EMPTY; CHUNK];
        let mut ptrs = [std::ptr::null_mut::<ibv_send_wr>(); CHUNK];
        let mut sges = [Sge::default(); CHUNK_SGES];
        let (mut n, mut ns) = (0usize, 0usize);
        let mut stop = None;
        while !cur.is_null() && n < CHUNK {
            // SAFETY: a request of the caller's list.
            let w = unsafe { &*cur };
            let k = usize::try_from(w.num_sge).unwrap_or(usize::MAX);
            if k > CHUNK_SGES {
                stop = Some((cur, libc::EINVAL));
                break;
            }
            if ns + k > CHUNK_SGES {
                break;
            }
            match stage(q, w, &mut sges, ns) {
                Ok(it) => {
                    items[n] = it;
                    ptrs[n] = cur;
                    n += 1;
                    ns += k;
                    cur = w.next;
                }
                Err(e) => {
                    stop = Some((cur, e));
                    break;
                }
            }
        }
        if n > 0
            && let Err((i, e)) = post_chunk(q, &mut inner, &items[..n], &sges, &[])
        {
            return bad(ptrs[i], e);
        }
        if let Some((w, e)) = stop {
            return bad(w, e);
        }
    }
    0
}

/// `ibv_context_ops.post_recv`.
///
/// # Safety
///
/// `qp` is a live QP; `wr` a list of valid requests; `bad_wr` writable.
pub unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: the caller's live QP.
    let q = unsafe { Qp::from_ptr(qp) };
    let mut inner = q.inner.lock();
    // SAFETY: the caller's `bad_wr` output.
    let bad = |w: *mut ibv_recv_wr, e: c_int| unsafe { refuse(bad_wr, w, e) };
    let mut cur = wr;
    while !cur.is_null() {
        let mut ranges = [(0u64, 0usize, 0usize); CHUNK];
        let mut ptrs = [std::ptr::null_mut::<ibv_recv_wr>(); CHUNK];
        let mut sges = [Sge::default(); CHUNK_SGES];
        let (mut n, mut ns) = (0usize, 0usize);
        let mut stop = None;
        while !cur.is_null() && n < CHUNK {
            // SAFETY: a request of the caller's list.
            let w = unsafe { &*cur };
            let k = usize::try_from(w.num_sge).unwrap_or(usize::MAX);
            if k > CHUNK_SGES || (k > 0 && w.sg_list.is_null()) {
                stop = Some((cur, libc::EINVAL));
                break;
            }
            if ns + k > CHUNK_SGES {
                break;
            }
            // SAFETY: the application's list of `num_sge` entries.
            unsafe { copy_sges(w.sg_list, k, &mut sges[ns..ns + k]) };
            ranges[n] = (w.wr_id, ns, k);
            ptrs[n] = cur;
            n += 1;
            ns += k;
            cur = w.next;
        }
        if n > 0 {
            let r = if n == 1 {
                let (id, s, k) = ranges[0];
                inner.qp.post_recv(&[RecvWr::new(id, &sges[s..s + k])])
            } else {
                let mut wrs = [RecvWr::new(0, &[]); CHUNK];
                for (i, &(id, s, k)) in ranges[..n].iter().enumerate() {
                    wrs[i] = RecvWr::new(id, &sges[s..s + k]);
                }
                inner.qp.post_recv(&wrs[..n])
            };
            if let Err(e) = r {
                let (i, e) = refusal(&e);
                return bad(ptrs[i], e);
            }
        }
        if let Some((w, e)) = stop {
            return bad(w, e);
        }
    }
    0
}

/// The QP of an `ibv_qp_ex *` and its builder, with the QP's lock held by
/// this thread (between `ibv_wr_start` and `ibv_wr_complete`/`abort`).
///
/// # Safety
///
/// `qpx` is a live QP of this library on which this thread called
/// `ibv_wr_start` and not yet `ibv_wr_complete` or `ibv_wr_abort`.
unsafe fn building<'a>(qpx: *mut ibv_qp_ex) -> (&'a Qp, &'a mut QpInner) {
    // SAFETY: the caller's live QP; the lock is held by this thread, so the
    // inner state is ours alone.
    let q = unsafe { Qp::from_ptr(qpx.cast()) };
    // SAFETY: as above: the lock is held by this thread.
    (q, unsafe { &mut *q.inner.data_ptr() })
}

/// Begin a request of `op` with the `wr_id` and `wr_flags` the application
/// stored in the `ibv_qp_ex`.
///
/// # Safety
///
/// As [`building`].
unsafe fn begin(qpx: *mut ibv_qp_ex, op: SendOp) {
    // SAFETY: forwarded.
    let (q, inner) = unsafe { building(qpx) };
    // SAFETY: the QP's C struct; the application wrote these fields before
    // this call and does not write them during it.
    let (wr_id, flags) = unsafe { q.c.with(|c| (c.wr_id, c.wr_flags)) };
    let b = &mut inner.builder;
    if b.items.len() >= b.cap {
        b.fail(libc::ENOMEM);
        return;
    }
    b.items.push(Staged {
        wr_id,
        op,
        flags: SendFlags::from_bits_truncate(flags & IBV_SEND_KNOWN & !IBV_SEND_INLINE),
        sge_start: b.sges.len() as u32,
        sge_len: 0,
        inline: Inline::No,
        ud: None,
    });
}

/// The request being built, or `None` (and `EINVAL` recorded).
fn last(b: &mut Builder) -> Option<&mut Staged> {
    if b.items.is_empty() {
        b.fail(libc::EINVAL);
    }
    b.items.last_mut()
}

macro_rules! wr_ops {
    ($($name:ident($($arg:ident: $t:ty),*) => $op:expr;)*) => { $(
        /// An `ibv_qp_ex` operation: begin a request.
        unsafe extern "C" fn $name(qpx: *mut ibv_qp_ex, $($arg: $t),*) {
            // SAFETY: the application called ibv_wr_start (the API's contract).
            unsafe { begin(qpx, $op) };
        }
    )* };
}

wr_ops! {
    wr_rdma_write(rkey: u32, addr: u64) => SendOp::RdmaWrite { remote_addr: addr, rkey: Rkey(rkey) };
    wr_rdma_write_imm(rkey: u32, addr: u64, imm: u32) =>
        SendOp::RdmaWriteWithImm { remote_addr: addr, rkey: Rkey(rkey), imm: u32::from_be(imm) };
    wr_rdma_read(rkey: u32, addr: u64) => SendOp::RdmaRead { remote_addr: addr, rkey: Rkey(rkey) };
    wr_send() => SendOp::Send;
    wr_send_imm(imm: u32) => SendOp::SendWithImm { imm: u32::from_be(imm) };
    wr_send_inv(rkey: u32) => SendOp::SendWithInv { rkey: Rkey(rkey) };
    wr_atomic_cmp_swp(rkey: u32, addr: u64, compare: u64, swap: u64) =>
        SendOp::AtomicCmpSwap { remote_addr: addr, rkey: Rkey(rkey), compare, swap };
    wr_atomic_fetch_add(rkey: u32, addr: u64, add: u64) =>
        SendOp::AtomicFetchAdd { remote_addr: addr, rkey: Rkey(rkey), add };
}

/// Record `EOPNOTSUPP` for an operation rnic does not post.
///
/// # Safety
///
/// As [`building`].
unsafe fn unsupported(qpx: *mut ibv_qp_ex) {
    // SAFETY: forwarded.
    unsafe { building(qpx) }.1.builder.fail(libc::EOPNOTSUPP);
}

unsafe extern "C" fn wr_local_inv(qpx: *mut ibv_qp_ex, _rkey: u32) {
    // SAFETY: the API's contract.
    unsafe { unsupported(qpx) };
}

unsafe extern "C" fn wr_send_tso(qpx: *mut ibv_qp_ex, _hdr: *mut c_void, _sz: u16, _mss: u16) {
    // SAFETY: the API's contract.
    unsafe { unsupported(qpx) };
}

unsafe extern "C" fn wr_set_xrc_srqn(qpx: *mut ibv_qp_ex, _srqn: u32) {
    // SAFETY: the API's contract.
    unsafe { unsupported(qpx) };
}

unsafe extern "C" fn wr_atomic_write(
    qpx: *mut ibv_qp_ex,
    _rkey: u32,
    _addr: u64,
    _data: *const c_void,
) {
    // SAFETY: the API's contract.
    unsafe { unsupported(qpx) };
}

unsafe extern "C" fn wr_set_sge(qpx: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    let s = ibv_sge { addr, length, lkey };
    // SAFETY: the API's contract; one SGE on the stack.
    unsafe { wr_set_sge_list(qpx, 1, &s) };
}

unsafe extern "C" fn wr_set_sge_list(qpx: *mut ibv_qp_ex, n: usize, list: *const ibv_sge) {
    // SAFETY: the API's contract.
    let (q, inner) = unsafe { building(qpx) };
    let b = &mut inner.builder;
    if n > q.caps.max_send_sge as usize || (n > 0 && list.is_null()) {
        b.fail(libc::EINVAL);
        return;
    }
    let start = b.sges.len();
    b.sges.resize(start + n, Sge::default());
    // SAFETY: the application's list of `n` entries; `n` slots just made.
    unsafe { copy_sges(list, n, &mut b.sges[start..]) };
    if let Some(it) = last(b) {
        it.sge_start = start as u32;
        it.sge_len = n as u32;
    }
}

unsafe extern "C" fn wr_set_inline_data(qpx: *mut ibv_qp_ex, addr: *mut c_void, length: usize) {
    let buf = ibv_data_buf { addr, length };
    // SAFETY: the API's contract; one buffer on the stack.
    unsafe { wr_set_inline_data_list(qpx, 1, &buf) };
}

unsafe extern "C" fn wr_set_inline_data_list(
    qpx: *mut ibv_qp_ex,
    n: usize,
    list: *const ibv_data_buf,
) {
    // SAFETY: the API's contract.
    let (q, inner) = unsafe { building(qpx) };
    let b = &mut inner.builder;
    if n > 0 && list.is_null() {
        b.fail(libc::EINVAL);
        return;
    }
    let start = b.bytes.len();
    for i in 0..n {
        // SAFETY: the application's list of `n` buffers.
        let d = unsafe { list.wrapping_add(i).read() };
        if b.bytes.len() - start + d.length > q.max_inline {
            b.fail(libc::EINVAL);
            return;
        }
        if d.length > 0 {
            if d.addr.is_null() {
                b.fail(libc::EINVAL);
                return;
            }
            // SAFETY: the application's buffer of `length` bytes, read now
            // (the inline API copies at this call).
            let src = unsafe { std::slice::from_raw_parts(d.addr.cast::<u8>(), d.length) };
            b.bytes.extend_from_slice(src);
        }
    }
    let len = (b.bytes.len() - start) as u32;
    if let Some(it) = last(b) {
        it.inline = Inline::Bytes {
            start: start as u32,
            len,
        };
        it.flags |= SendFlags::INLINE;
    }
}

unsafe extern "C" fn wr_set_ud_addr(qpx: *mut ibv_qp_ex, ah: *mut ibv_ah, qpn: u32, qkey: u32) {
    // SAFETY: the API's contract.
    let (q, inner) = unsafe { building(qpx) };
    let b = &mut inner.builder;
    let Some(ah) = NonNull::new(ah.cast::<Ah>()).filter(|_| q.qp_type == QpType::Ud) else {
        b.fail(libc::EINVAL);
        return;
    };
    if let Some(it) = last(b) {
        it.ud = Some((ah, qpn, qkey));
    }
}

unsafe extern "C" fn wr_start(qpx: *mut ibv_qp_ex) {
    // SAFETY: the caller's live QP.
    let q = unsafe { Qp::from_ptr(qpx.cast()) };
    // SAFETY: locked without a guard; `wr_complete` / `wr_abort` unlock, as
    // the API pairs them.
    unsafe { q.inner.raw() }.lock();
    // SAFETY: locked just above by this thread.
    unsafe { building(qpx) }.1.builder.clear();
}

unsafe extern "C" fn wr_complete(qpx: *mut ibv_qp_ex) -> c_int {
    // SAFETY: the API's contract.
    let (q, inner) = unsafe { building(qpx) };
    let mut r = inner.builder.err;
    if r == 0 {
        let b = std::mem::take(&mut inner.builder);
        for chunk in b.items.chunks(CHUNK) {
            if let Err((_, e)) = post_chunk(q, inner, chunk, &b.sges, &b.bytes) {
                r = e;
                break;
            }
        }
        inner.builder = b;
    }
    inner.builder.clear();
    // SAFETY: locked by this thread's `wr_start`.
    unsafe { q.inner.force_unlock() };
    if r != 0 {
        crate::set_errno(r);
    }
    r
}

unsafe extern "C" fn wr_abort(qpx: *mut ibv_qp_ex) {
    // SAFETY: the API's contract.
    let (q, inner) = unsafe { building(qpx) };
    inner.builder.clear();
    // SAFETY: locked by this thread's `wr_start`.
    unsafe { q.inner.force_unlock() };
}

/// Fill the `ibv_qp_ex` function pointers.
pub fn fill_ops(x: &mut ibv_qp_ex) {
    x.wr_atomic_cmp_swp = Some(wr_atomic_cmp_swp);
    x.wr_atomic_fetch_add = Some(wr_atomic_fetch_add);
    x.wr_local_inv = Some(wr_local_inv);
    x.wr_rdma_read = Some(wr_rdma_read);
    x.wr_rdma_write = Some(wr_rdma_write);
    x.wr_rdma_write_imm = Some(wr_rdma_write_imm);
    x.wr_send = Some(wr_send);
    x.wr_send_imm = Some(wr_send_imm);
    x.wr_send_inv = Some(wr_send_inv);
    x.wr_send_tso = Some(wr_send_tso);
    x.wr_set_ud_addr = Some(wr_set_ud_addr);
    x.wr_set_xrc_srqn = Some(wr_set_xrc_srqn);
    x.wr_set_inline_data = Some(wr_set_inline_data);
    x.wr_set_inline_data_list = Some(wr_set_inline_data_list);
    x.wr_set_sge = Some(wr_set_sge);
    x.wr_set_sge_list = Some(wr_set_sge_list);
    x.wr_start = Some(wr_start);
    x.wr_complete = Some(wr_complete);
    x.wr_abort = Some(wr_abort);
    x.wr_atomic_write = Some(wr_atomic_write);
}

/// The `IBV_SEND_*` flags a C word carries into rnic.
pub fn send_flags(raw: c_uint) -> SendFlags {
    SendFlags::from_bits_truncate(raw & IBV_SEND_KNOWN)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::{SendWrAtomic, SendWrRdma, zeroed};

    #[test]
    fn opcodes_map_with_their_operands() {
        let mut w: ibv_send_wr = zeroed();
        w.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
        w.imm_data = 0x1234_5678u32.to_be();
        w.wr.rdma = SendWrRdma {
            remote_addr: 0x1000,
            rkey: 7,
        };
        assert_eq!(
            op_of(&w),
            Ok(SendOp::RdmaWriteWithImm {
                remote_addr: 0x1000,
                rkey: Rkey(7),
                imm: 0x1234_5678
            })
        );
        w.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
        w.wr.atomic = SendWrAtomic {
            remote_addr: 0x2000,
            compare_add: 1,
            swap: 2,
            rkey: 9,
        };
        assert_eq!(
            op_of(&w),
            Ok(SendOp::AtomicCmpSwap {
                remote_addr: 0x2000,
                rkey: Rkey(9),
                compare: 1,
                swap: 2
            })
        );
        w.opcode = 7; // IBV_WR_LOCAL_INV
        assert_eq!(op_of(&w), Err(libc::EINVAL));
        assert_eq!(send_flags(0x1f), SendFlags::all(), "IP_CSUM dropped");
    }
}
