//! Queue pairs: checked state transitions, posting with credit accounting,
//! and teardown.
//!
//! [`QueuePair::modify`] runs [`check_modify`] before the provider sees the
//! request, so an illegal transition or a missing attribute fails with an
//! error naming them and the device is never asked; on success the new state
//! is cached. [`QueuePair::to_init`], [`QueuePair::to_rtr`] and
//! [`QueuePair::to_rts`] build the usual bring-up requests with
//! ibv_rc_pingpong's defaults.
//!
//! Posting follows the credit rule of [`crate::cq`]: a batch takes one credit
//! per request from the matching CQ or is refused whole. A batch stops at
//! its first malformed request: the requests before it are posted, and the
//! error's `index` says where it stopped (ibverbs' `bad_wr`).

use std::sync::{Arc, MutexGuard};

use crate::access::AccessFlags;
use crate::cq::{CompletionQueue, CqInner, QpTable};
use crate::provider::{PostError, Provider, QpHandle, VerbsError};
use crate::qp::{
    AddressVector, QpAttr, QpAttrMask, QpCaps, QpInitAttr, QpState, QpType, check_modify,
};
use crate::sq_track::QpTrack;
use crate::types::{Gid, Mtu, Psn, Qpn};
use crate::verbs::{MemoryRegion, PdInner, ProtectionDomain};
use crate::wr::{RecvWr, SendWr};

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

/// A queue pair. Not `Clone`: posting sends needs `&mut self`, which makes
/// the poster the single producer of the send tracking ring.
///
/// Dropping it destroys the device QP, returns its outstanding credits, and
/// then releases its CQs, retained regions and PD — in that order.
#[derive(Debug)]
pub struct QueuePair {
    provider: Arc<dyn Provider>,
    handle: QpHandle,
    qpn: Qpn,
    qp_type: QpType,
    caps: QpCaps,
    sq_sig_all: bool,
    state: QpState,
    track: Arc<QpTrack>,
    // Field order is drop order: CQs, then regions, then the PD.
    send_cq: Arc<CqInner>,
    recv_cq: Arc<CqInner>,
    retained: Vec<MemoryRegion>,
    pd: Arc<PdInner>,
}

/// The table locks of a QP's CQs, taken in handle order (one lock when the
/// send and receive CQ are the same queue).
struct CqLocks<'a> {
    send: MutexGuard<'a, QpTable>,
    recv: Option<MutexGuard<'a, QpTable>>,
}

fn lock_cqs<'a>(send: &'a CqInner, recv: &'a CqInner) -> CqLocks<'a> {
    if std::ptr::eq(send, recv) {
        CqLocks {
            send: send.lock_table(),
            recv: None,
        }
    } else if send.handle <= recv.handle {
        let s = send.lock_table();
        let r = recv.lock_table();
        CqLocks {
            send: s,
            recv: Some(r),
        }
    } else {
        let r = recv.lock_table();
        let s = send.lock_table();
        CqLocks {
            send: s,
            recv: Some(r),
        }
    }
}

impl QueuePair {
    pub(crate) fn create(
        pd: &ProtectionDomain,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
        init: &QpInitAttr,
    ) -> Result<QueuePair, VerbsError> {
        let provider = &pd.inner.provider;
        for (cq, what) in [(send_cq, "the send CQ"), (recv_cq, "the receive CQ")] {
            if !std::ptr::addr_eq(Arc::as_ptr(provider), Arc::as_ptr(&cq.inner.provider)) {
                return Err(VerbsError::ForeignObject {
                    operation: "create_qp",
                    what,
                });
            }
        }
        let info = provider.create_qp(
            pd.inner.handle,
            send_cq.inner.handle,
            recv_cq.inner.handle,
            init,
        )?;
        tracing::debug!(qp = %info.handle, qpn = %info.qpn, qp_type = %init.qp_type, "create_qp");
        let track = Arc::new(QpTrack::new(info.caps.max_send_wr));
        let qp = QueuePair {
            provider: Arc::clone(provider),
            handle: info.handle,
            qpn: info.qpn,
            qp_type: init.qp_type,
            caps: info.caps,
            sq_sig_all: init.sq_sig_all,
            state: QpState::Reset,
            track,
            send_cq: Arc::clone(&send_cq.inner),
            recv_cq: Arc::clone(&recv_cq.inner),
            retained: Vec::new(),
            pd: Arc::clone(&pd.inner),
        };
        {
            let mut locks = lock_cqs(&qp.send_cq, &qp.recv_cq);
            let key = qp.qpn.get();
            if locks.send.insert(key, Arc::clone(&qp.track)).is_some() {
                tracing::warn!(qpn = %qp.qpn, "QPN reused while still attached to the send CQ");
            }
            if let Some(recv) = locks.recv.as_mut() {
                recv.insert(key, Arc::clone(&qp.track));
            }
        }
        Ok(qp)
    }

    /// The provider's handle.
    pub fn handle(&self) -> QpHandle {
        self.handle
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

    /// The protection domain's handle.
    pub fn pd_handle(&self) -> crate::provider::PdHandle {
        self.pd.handle
    }

    /// Send requests posted and not yet retired by a polled completion.
    pub fn outstanding_sends(&self) -> u32 {
        u32::try_from(self.track.sq.outstanding()).unwrap_or(u32::MAX)
    }

    /// Receive requests posted and not yet retired by a polled completion.
    pub fn outstanding_recvs(&self) -> u32 {
        self.track.recv_outstanding()
    }

    /// Keep `mr` registered until this QP is destroyed, so requests the QP has
    /// outstanding can never name a deregistered key. Teardown then runs
    /// QP → CQ → MR → PD whatever order the handles are dropped in.
    pub fn retain_region(&mut self, mr: &MemoryRegion) {
        if !self
            .retained
            .iter()
            .any(|r| Arc::ptr_eq(&r.inner, &mr.inner))
        {
            self.retained.push(mr.clone());
        }
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
        if next == QpState::Reset {
            // RESET discards the QP's work and completions: return their
            // credits while no poller can be retiring them.
            let _locks = lock_cqs(&self.send_cq, &self.recv_cq);
            self.provider.modify_qp(self.handle, attr, mask)?;
            self.return_all_credits();
        } else {
            self.provider.modify_qp(self.handle, attr, mask)?;
        }
        self.state = next;
        Ok(())
    }

    /// Give back the credits of every outstanding request. The caller holds
    /// the QP exclusively and its CQs' table locks.
    fn return_all_credits(&self) {
        let sends = self.track.sq.drain();
        self.send_cq.release(sends);
        let recvs = self.track.drain_recv();
        self.recv_cq.release(recvs);
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
        let attr = self.provider.query_qp(self.handle)?;
        self.state = attr.qp_state;
        Ok(attr)
    }

    /// Post send requests. The batch is refused whole (nothing posted) when
    /// the QP's state does not take sends, the send queue lacks room, or the
    /// send CQ lacks credits; a malformed request stops the batch there, with
    /// the requests before it posted. Allocates nothing.
    pub fn post_send(&mut self, wrs: &[SendWr<'_>]) -> Result<(), VerbsError> {
        if !self.state.can_post_send() {
            return Err(VerbsError::PostSend {
                index: 0,
                reason: PostError::QpState { state: self.state },
            });
        }
        let bad = wrs
            .iter()
            .enumerate()
            .find_map(|(i, wr)| wr.validate(self.qp_type, &self.caps).err().map(|e| (i, e)));
        let Some((index, reason)) = bad else {
            return self.post_send_valid(wrs);
        };
        self.post_send_valid(&wrs[..index])?;
        Err(VerbsError::PostSend {
            index,
            reason: PostError::InvalidWr(reason),
        })
    }

    fn post_send_valid(&mut self, wrs: &[SendWr<'_>]) -> Result<(), VerbsError> {
        if wrs.is_empty() {
            return Ok(());
        }
        let refuse = |reason| Err(VerbsError::PostSend { index: 0, reason });
        let outstanding = self.track.sq.outstanding();
        let capacity = self.caps.max_send_wr;
        let requested = u32::try_from(wrs.len()).unwrap_or(u32::MAX);
        if outstanding.saturating_add(wrs.len()) > capacity as usize {
            return refuse(PostError::QueueFull {
                outstanding: u32::try_from(outstanding).unwrap_or(u32::MAX),
                capacity,
                requested,
            });
        }
        if let Err(reason) = self.send_cq.acquire(requested) {
            return refuse(reason);
        }
        let sig_all = self.sq_sig_all;
        let base = self
            .track
            .sq
            .reserve(wrs.iter().map(|wr| (wr.wr_id, wr.is_signaled(sig_all))));
        match self.provider.post_send(self.handle, wrs) {
            Ok(()) => {
                self.track.sq.commit(base, wrs.len());
                Ok(())
            }
            Err(e) => {
                let posted = e.posted_count().min(wrs.len());
                self.track.sq.commit(base, posted);
                let posted = u32::try_from(posted).unwrap_or(u32::MAX);
                self.send_cq.release(requested.saturating_sub(posted));
                Err(e)
            }
        }
    }

    /// Post receive requests. The batch is refused whole (nothing posted)
    /// when the QP is in RESET, the receive queue lacks room, or the receive
    /// CQ lacks credits; a malformed request stops the batch there, with the
    /// requests before it posted. Allocates nothing.
    pub fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), VerbsError> {
        if !self.state.can_post_recv() {
            return Err(VerbsError::PostRecv {
                index: 0,
                reason: PostError::QpState { state: self.state },
            });
        }
        let bad = wrs
            .iter()
            .enumerate()
            .find_map(|(i, wr)| wr.validate(&self.caps).err().map(|e| (i, e)));
        let Some((index, reason)) = bad else {
            return self.post_recv_valid(wrs);
        };
        self.post_recv_valid(&wrs[..index])?;
        Err(VerbsError::PostRecv {
            index,
            reason: PostError::InvalidWr(reason),
        })
    }

    fn post_recv_valid(&self, wrs: &[RecvWr<'_>]) -> Result<(), VerbsError> {
        if wrs.is_empty() {
            return Ok(());
        }
        let refuse = |reason| Err(VerbsError::PostRecv { index: 0, reason });
        let requested = u32::try_from(wrs.len()).unwrap_or(u32::MAX);
        let capacity = self.caps.max_recv_wr;
        if let Err(outstanding) = self.track.try_add_recv(requested, capacity) {
            return refuse(PostError::QueueFull {
                outstanding,
                capacity,
                requested,
            });
        }
        if let Err(reason) = self.recv_cq.acquire(requested) {
            self.track.sub_recv(requested);
            return refuse(reason);
        }
        match self.provider.post_recv(self.handle, wrs) {
            Ok(()) => Ok(()),
            Err(e) => {
                let posted = u32::try_from(e.posted_count()).unwrap_or(u32::MAX);
                let unposted = requested.saturating_sub(posted);
                self.track.sub_recv(unposted);
                self.recv_cq.release(unposted);
                Err(e)
            }
        }
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        tracing::debug!(qp = %self.handle, qpn = %self.qpn, "destroy_qp");
        let mut locks = lock_cqs(&self.send_cq, &self.recv_cq);
        if let Err(e) = self.provider.destroy_qp(self.handle) {
            tracing::error!(qp = %self.handle, error = %e, "destroy_qp failed during drop");
        }
        let key = self.qpn.get();
        for table in std::iter::once(&mut locks.send).chain(locks.recv.as_mut()) {
            if table.get(&key).is_some_and(|t| Arc::ptr_eq(t, &self.track)) {
                table.remove(&key);
            }
        }
        self.return_all_credits();
    }
}
