//! Queue pairs: checked state transitions, posting, region retention and
//! teardown.
//!
//! [`QueuePair::modify`] runs [`check_modify`] before the provider sees the
//! request, so an illegal transition or a missing attribute fails with an
//! error naming them and the device is never asked; on success the new state
//! is cached. [`QueuePair::to_init`], [`QueuePair::to_rtr`] and
//! [`QueuePair::to_rts`] build the usual bring-up requests with
//! ibv_rc_pingpong's defaults.
//!
//! Posting goes straight to the driver's queue object ([`QpOps`]): the driver
//! checks each request, the state and the queue room, once. Core adds two
//! things: a windowed QP (see [`crate::cq`]) takes its CQ credits, and every
//! memory region a request names stays registered until the QP is destroyed
//! (the QP retains it the first time it sees its L_Key; after that a hit in
//! a small map, the same L_Key as the previous SGE costing one compare).

use std::sync::Arc;

use rustc_hash::FxHashMap;

use crate::access::AccessFlags;
use crate::cq::{CompletionQueue, CqShared, CreditMode};
use crate::provider::{DynDevice, Outstanding, PostError, Provider, QpOps, VerbsError};
use crate::qp::{
    AddressVector, QpAttr, QpAttrMask, QpCaps, QpInitAttr, QpState, QpType, check_modify,
};
use crate::types::{Gid, Lkey, Mtu, Psn, Qpn};
use crate::verbs::{MrInner, PdInner, ProtectionDomain};
use crate::wr::{RecvWr, SendFlags, SendWr, Sge};

/// Parameters of RESET → INIT.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct InitParams {
    /// Physical port, from 1.
    pub port_num: u8,
    /// P_Key index.
    pub pkey_index: u16,
    /// Remote operations the QP serves (RC, UC).
    pub access: AccessFlags,
    /// Q_Key (UD).
    pub qkey: u32,
}

impl Default for InitParams {
    /// ibv_rc_pingpong's: port 1, P_Key index 0, no remote access;
    /// ibv_ud_pingpong's Q_Key 0x11111111.
    fn default() -> InitParams {
        InitParams {
            port_num: 1,
            pkey_index: 0,
            access: AccessFlags::empty(),
            qkey: 0x1111_1111,
        }
    }
}

/// Tuning of INIT → RTR.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RtrParams {
    /// Path MTU (both sides must agree).
    pub path_mtu: Mtu,
    /// Reads/atomics the peer may have outstanding here (RC).
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer code sent to the peer (RC).
    pub min_rnr_timer: u8,
    /// Local GID index to send from.
    pub sgid_index: u8,
    /// IP hop limit / TTL.
    pub hop_limit: u8,
    /// IP traffic class.
    pub traffic_class: u8,
    /// UDP source port; `None` lets the provider choose.
    pub udp_sport: Option<u16>,
    /// Destination MAC; `None` lets the provider resolve it.
    pub dmac: Option<[u8; 6]>,
}

impl Default for RtrParams {
    /// ibv_rc_pingpong's: MTU 1024, max_dest_rd_atomic 1, min_rnr_timer 12,
    /// GID index 0. The hop limit is 64, not pingpong's 1 — the kernel replaces
    /// pingpong's value with the route's for RoCEv2, and rnic has no kernel to
    /// do that.
    fn default() -> RtrParams {
        RtrParams {
            path_mtu: Mtu::Mtu1024,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            sgid_index: 0,
            hop_limit: 64,
            traffic_class: 0,
            udp_sport: None,
            dmac: None,
        }
    }
}

/// Tuning of RTR → RTS.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RtsParams {
    /// Local ACK timeout exponent (RC).
    pub timeout: u8,
    /// Transport retries (RC).
    pub retry_cnt: u8,
    /// RNR retries, 7 = forever (RC).
    pub rnr_retry: u8,
    /// Reads/atomics this QP may have outstanding (RC).
    pub max_rd_atomic: u8,
}

impl Default for RtsParams {
    /// ibv_rc_pingpong's: timeout 14 (≈ 67 ms), retry_cnt 7, rnr_retry 7,
    /// max_rd_atomic 1.
    fn default() -> RtsParams {
        RtsParams {
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 1,
        }
    }
}

/// A queue pair: the driver's queue object, owned by the application.
/// Posting takes `&mut self`, so the type system makes one thread the poster;
/// sharing a QP between threads is an explicit lock:
///
/// ```compile_fail
/// # use rnic_core::{QueuePair, SendWr};
/// fn two_posters(qp: &mut QueuePair) {
///     std::thread::scope(|s| {
///         s.spawn(|| qp.post_send(&[]));
///         s.spawn(|| qp.post_send(&[])); // error: `*qp` borrowed mutably twice
///     });
/// }
/// ```
///
/// ```
/// # use std::sync::Mutex;
/// # use rnic_core::{QueuePair, SendWr};
/// fn two_posters(qp: &Mutex<QueuePair>) {
///     std::thread::scope(|s| {
///         for _ in 0..2 {
///             s.spawn(|| {
///                 if let Ok(mut q) = qp.lock() {
///                     let _ = q.post_send(&[]);
///                 }
///             });
///         }
///     });
/// }
/// ```
///
/// Dropping it destroys the device QP, returns its credits, and then
/// releases its retained regions and PD — in that order.
#[derive(Debug)]
pub struct QueuePair<P: Provider = DynDevice> {
    // Field order is drop order: the driver's QP, then the regions, the PD.
    ops: P::Qp,
    qpn: Qpn,
    qp_type: QpType,
    caps: QpCaps,
    sq_sig_all: bool,
    state: QpState,
    send_cq: Arc<CqShared>,
    recv_cq: Arc<CqShared>,
    send_mode: CreditMode,
    recv_mode: CreditMode,
    /// Posts refused for want of credits or room.
    stalls: u64,
    last_lkey: Option<Lkey>,
    retained: FxHashMap<u32, Arc<MrInner<P>>>,
    pd: Arc<PdInner<P>>,
}

impl<P: Provider> QueuePair<P> {
    pub(crate) fn create(
        pd: &ProtectionDomain<P>,
        send_cq: &CompletionQueue<P>,
        recv_cq: &CompletionQueue<P>,
        init: &QpInitAttr,
    ) -> Result<QueuePair<P>, VerbsError> {
        let provider = &pd.inner.provider;
        for (cq, what) in [(send_cq, "the send CQ"), (recv_cq, "the receive CQ")] {
            if !Arc::ptr_eq(provider, &cq.provider) {
                return Err(VerbsError::ForeignObject {
                    operation: "create_qp",
                    what,
                });
            }
        }
        let (ops, info) =
            provider.create_qp(&pd.inner.pd, send_cq.driver_cq(), recv_cq.driver_cq(), init)?;
        tracing::debug!(qpn = %info.qpn, qp_type = %init.qp_type, "create_qp");
        let same = Arc::ptr_eq(&send_cq.shared, &recv_cq.shared);
        let (send_mode, recv_mode) = if same {
            let m = send_cq
                .shared
                .attach(info.qpn, info.caps.max_send_wr + info.caps.max_recv_wr)?;
            // One CQ for both queues: a windowed QP takes per request on both.
            let r = match m {
                CreditMode::Windowed => CreditMode::Windowed,
                CreditMode::Static(_) => CreditMode::Static(0),
            };
            (m, r)
        } else {
            let s = send_cq.shared.attach(info.qpn, info.caps.max_send_wr)?;
            match recv_cq.shared.attach(info.qpn, info.caps.max_recv_wr) {
                Ok(r) => (s, r),
                Err(e) => {
                    let mut a = send_cq.shared.lock();
                    send_cq.shared.detach(&mut a, info.qpn, s, 0);
                    return Err(e);
                }
            }
        };
        Ok(QueuePair {
            ops,
            qpn: info.qpn,
            qp_type: init.qp_type,
            caps: info.caps,
            sq_sig_all: init.sq_sig_all,
            state: QpState::Reset,
            send_cq: Arc::clone(&send_cq.shared),
            recv_cq: Arc::clone(&recv_cq.shared),
            send_mode,
            recv_mode,
            stalls: 0,
            last_lkey: None,
            retained: FxHashMap::default(),
            pd: Arc::clone(&pd.inner),
        })
    }

    /// The driver's queue object.
    pub fn driver_qp(&self) -> &P::Qp {
        &self.ops
    }

    /// The QP number peers address.
    pub fn qpn(&self) -> Qpn {
        self.qpn
    }

    /// Transport service.
    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }

    /// Capacities granted at creation.
    pub fn caps(&self) -> QpCaps {
        self.caps
    }

    /// Whether every send is signaled.
    pub fn sq_sig_all(&self) -> bool {
        self.sq_sig_all
    }

    /// The state after the last successful modify or query. The device may
    /// have moved the QP to SQE or ERR since; [`QueuePair::query`] refreshes it.
    pub fn state(&self) -> QpState {
        self.state
    }

    /// Whether the send queue's CQ credits were reserved statically at
    /// creation (no credit work per request) rather than taken per request.
    pub fn credits_reserved(&self) -> bool {
        matches!(self.send_mode, CreditMode::Static(_))
    }

    /// Posts refused for want of CQ credits or queue room.
    pub fn stalls(&self) -> u64 {
        self.stalls
    }

    /// Send requests posted and not yet retired by a polled completion.
    pub fn outstanding_sends(&self) -> u32 {
        self.ops.outstanding().sends
    }

    /// Receive requests posted and not yet retired by a polled completion.
    pub fn outstanding_recvs(&self) -> u32 {
        self.ops.outstanding().recvs
    }

    /// Regions retained because requests posted here named them.
    pub fn retained_regions(&self) -> usize {
        self.retained.len()
    }

    /// Modify the QP: check the transition and attributes (see
    /// [`check_modify`]), then apply them. The device is not asked when the
    /// check fails.
    pub fn modify(&mut self, attr: &QpAttr, mask: QpAttrMask) -> Result<(), VerbsError> {
        let next = check_modify(self.qp_type, self.state, mask, attr).map_err(|source| {
            VerbsError::ModifyQpRejected {
                qpn: self.qpn,
                source,
            }
        })?;
        tracing::debug!(qpn = %self.qpn, from = %self.state, to = %next, %mask, "modify_qp");
        self.ops.modify(attr, mask)?;
        if next == QpState::Reset {
            // RESET discards the QP's work and completions: return the
            // windowed credits they held.
            let d = self.discard_locked();
            self.return_windowed(d);
        }
        self.state = next;
        Ok(())
    }

    /// Discard the driver's outstanding work with the windowed CQs' locks
    /// held, so no poll is between retiring and counting.
    fn discard_locked(&mut self) -> Outstanding {
        let windowed =
            self.send_mode == CreditMode::Windowed || self.recv_mode == CreditMode::Windowed;
        if !windowed {
            return self.ops.discard();
        }
        let same = Arc::ptr_eq(&self.send_cq, &self.recv_cq);
        let _s = self.send_cq.lock();
        let _r = (!same).then(|| self.recv_cq.lock());
        self.ops.discard()
    }

    fn return_windowed(&self, d: Outstanding) {
        if self.send_mode == CreditMode::Windowed {
            self.send_cq.release(d.sends);
        }
        if self.recv_mode == CreditMode::Windowed {
            self.recv_cq.release(d.recvs);
        }
    }

    /// RESET → INIT with `params` (Q_Key for UD, access flags otherwise).
    pub fn to_init(&mut self, params: &InitParams) -> Result<(), VerbsError> {
        let attr = QpAttr {
            qp_state: QpState::Init,
            port_num: params.port_num,
            pkey_index: params.pkey_index,
            qp_access_flags: params.access,
            qkey: params.qkey,
            ..QpAttr::default()
        };
        let mut mask = QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT;
        mask |= match self.qp_type {
            QpType::Ud => QpAttrMask::QKEY,
            QpType::Rc | QpType::Uc => QpAttrMask::ACCESS_FLAGS,
        };
        self.modify(&attr, mask)
    }

    /// INIT → RTR towards the peer QP `remote_qpn` at `remote_gid`, expecting
    /// its first PSN `remote_psn`. UD QPs ignore the remote fields.
    pub fn to_rtr(
        &mut self,
        remote_qpn: Qpn,
        remote_psn: Psn,
        remote_gid: Gid,
        params: &RtrParams,
    ) -> Result<(), VerbsError> {
        let attr = QpAttr {
            qp_state: QpState::Rtr,
            path_mtu: params.path_mtu,
            dest_qp_num: remote_qpn,
            rq_psn: remote_psn,
            max_dest_rd_atomic: params.max_dest_rd_atomic,
            min_rnr_timer: params.min_rnr_timer,
            ah_attr: AddressVector {
                dgid: remote_gid,
                sgid_index: params.sgid_index,
                hop_limit: params.hop_limit,
                traffic_class: params.traffic_class,
                flow_label: 0,
                udp_sport: params.udp_sport,
                dmac: params.dmac,
            },
            ..QpAttr::default()
        };
        let connected =
            QpAttrMask::AV | QpAttrMask::PATH_MTU | QpAttrMask::DEST_QPN | QpAttrMask::RQ_PSN;
        let mask = QpAttrMask::STATE
            | match self.qp_type {
                QpType::Rc => {
                    connected | QpAttrMask::MAX_DEST_RD_ATOMIC | QpAttrMask::MIN_RNR_TIMER
                }
                QpType::Uc => connected,
                QpType::Ud => QpAttrMask::empty(),
            };
        self.modify(&attr, mask)
    }

    /// RTR → RTS, sending from PSN `local_psn`.
    pub fn to_rts(&mut self, local_psn: Psn, params: &RtsParams) -> Result<(), VerbsError> {
        let attr = QpAttr {
            qp_state: QpState::Rts,
            sq_psn: local_psn,
            timeout: params.timeout,
            retry_cnt: params.retry_cnt,
            rnr_retry: params.rnr_retry,
            max_rd_atomic: params.max_rd_atomic,
            ..QpAttr::default()
        };
        let mask = QpAttrMask::STATE
            | QpAttrMask::SQ_PSN
            | match self.qp_type {
                QpType::Rc => {
                    QpAttrMask::TIMEOUT
                        | QpAttrMask::RETRY_CNT
                        | QpAttrMask::RNR_RETRY
                        | QpAttrMask::MAX_QP_RD_ATOMIC
                }
                QpType::Uc | QpType::Ud => QpAttrMask::empty(),
            };
        self.modify(&attr, mask)
    }

    /// Move to ERR: outstanding requests complete with flush errors (and
    /// return their credits as they are polled).
    pub fn to_error(&mut self) -> Result<(), VerbsError> {
        let attr = QpAttr {
            qp_state: QpState::Err,
            ..QpAttr::default()
        };
        self.modify(&attr, QpAttrMask::STATE)
    }

    /// Move to RESET: outstanding requests are discarded and their credits
    /// returned at once.
    pub fn reset(&mut self) -> Result<(), VerbsError> {
        let attr = QpAttr::default();
        self.modify(&attr, QpAttrMask::STATE)
    }

    /// The device's view of the QP; refreshes [`QueuePair::state`].
    pub fn query(&mut self) -> Result<QpAttr, VerbsError> {
        let attr = self.ops.query()?;
        self.state = attr.qp_state;
        Ok(attr)
    }

    /// Keep the regions `sges` name registered while this QP lives.
    #[inline]
    fn retain(&mut self, sges: &[Sge]) {
        for sge in sges {
            if self.last_lkey == Some(sge.lkey) {
                continue;
            }
            self.last_lkey = Some(sge.lkey);
            if !self.retained.contains_key(&sge.lkey.get()) {
                self.retain_slow(sge.lkey);
            }
        }
    }

    #[cold]
    fn retain_slow(&mut self, lkey: Lkey) {
        // An unknown key is the driver's to refuse (a local protection error).
        if let Some(mr) = self.pd.region(lkey) {
            self.retained.insert(lkey.get(), mr);
        }
    }

    /// Post send requests in order, straight to the driver's queue. The
    /// driver checks each request, the state and the room; a request it
    /// refuses stops the batch there, with the requests before it posted
    /// (the error's `index`). A windowed QP's batch is refused whole when its
    /// CQ lacks credits. Allocates nothing once the regions named are
    /// retained.
    #[inline]
    pub fn post_send(&mut self, wrs: &[SendWr<'_>]) -> Result<(), VerbsError> {
        // The commonest request first, with the fewest tests: one inline
        // request on a QP without a credit window retains nothing and takes
        // no credit, so the driver's shortest path may take it; whatever it
        // declines (nothing posted) goes the general way, where a refusal
        // is counted.
        if let [wr] = wrs
            && wr.flags.contains(SendFlags::INLINE)
            && self.send_mode != CreditMode::Windowed
            && self.ops.try_post_send_one(wr)
        {
            return Ok(());
        }
        self.post_send_rest(wrs)
    }

    /// A refusal of the driver's `post_send` (shortcut or general path,
    /// without a credit window): a full queue or CQ is a stall.
    #[cold]
    #[inline(never)]
    fn send_refused(&mut self, e: VerbsError) -> VerbsError {
        if let VerbsError::PostSend {
            reason: PostError::QueueFull { .. } | PostError::CqFull { .. },
            ..
        } = e
        {
            self.stalls += 1;
        }
        e
    }

    /// [`QueuePair::post_send`] past its shortcut: every other batch.
    #[inline(never)]
    fn post_send_rest(&mut self, wrs: &[SendWr<'_>]) -> Result<(), VerbsError> {
        for wr in wrs {
            // An inline request's bytes are copied at post time
            // ([`SendFlags::INLINE`]): the device never reads its SGEs'
            // memory afterwards, so it retains nothing.
            if !wr.flags.contains(SendFlags::INLINE) {
                self.retain(wr.sg_list);
            }
        }
        if self.send_mode != CreditMode::Windowed {
            let r = self.ops.post_send(wrs);
            return r.map_err(|e| self.send_refused(e));
        }
        self.post_send_windowed(wrs)
    }

    fn post_send_windowed(&mut self, wrs: &[SendWr<'_>]) -> Result<(), VerbsError> {
        let requested = u32::try_from(wrs.len()).unwrap_or(u32::MAX);
        if let Err(reason) = self.send_cq.acquire(requested) {
            self.stalls += 1;
            return Err(VerbsError::PostSend { index: 0, reason });
        }
        self.ops.post_send(wrs).inspect_err(|e| {
            let posted = u32::try_from(e.posted_count()).unwrap_or(u32::MAX);
            self.send_cq.release(requested.saturating_sub(posted));
            if let VerbsError::PostSend {
                reason: PostError::QueueFull { .. },
                ..
            } = e
            {
                self.stalls += 1;
            }
        })
    }

    /// Post receive requests in order, straight to the driver's queue (the
    /// same rules as [`QueuePair::post_send`]).
    #[inline]
    pub fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> Result<(), VerbsError> {
        for wr in wrs {
            self.retain(wr.sg_list);
        }
        if self.recv_mode != CreditMode::Windowed {
            let r = self.ops.post_recv(wrs);
            if let Err(VerbsError::PostRecv {
                reason: PostError::QueueFull { .. } | PostError::CqFull { .. },
                ..
            }) = r
            {
                self.stalls += 1;
            }
            return r;
        }
        let requested = u32::try_from(wrs.len()).unwrap_or(u32::MAX);
        if let Err(reason) = self.recv_cq.acquire(requested) {
            self.stalls += 1;
            return Err(VerbsError::PostRecv { index: 0, reason });
        }
        self.ops.post_recv(wrs).inspect_err(|e| {
            let posted = u32::try_from(e.posted_count()).unwrap_or(u32::MAX);
            self.recv_cq.release(requested.saturating_sub(posted));
            if let VerbsError::PostRecv {
                reason: PostError::QueueFull { .. },
                ..
            } = e
            {
                self.stalls += 1;
            }
        })
    }
}

impl<P: Provider> Drop for QueuePair<P> {
    fn drop(&mut self) {
        tracing::debug!(qpn = %self.qpn, "destroy_qp");
        let d = self.discard_locked();
        let same = Arc::ptr_eq(&self.send_cq, &self.recv_cq);
        {
            let mut s = self.send_cq.lock();
            let held = if same && self.recv_mode == CreditMode::Windowed {
                d.sends + d.recvs
            } else {
                d.sends
            };
            self.send_cq.detach(&mut s, self.qpn, self.send_mode, held);
        }
        if !same {
            let mut r = self.recv_cq.lock();
            self.recv_cq
                .detach(&mut r, self.qpn, self.recv_mode, d.recvs);
        }
    }
}
