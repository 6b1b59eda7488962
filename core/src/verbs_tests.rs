//! Tests of the object model against [`FakeProvider`]: teardown order,
//! checked transitions, and credit accounting end to end.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::access::{AccessError, AccessFlags};
use crate::fake_provider::{Call, FakeProvider};
use crate::memory::{HeapMemory, MemAccess, Memory, MemoryError};
use crate::provider::{PostError, VerbsError};
use crate::qp::{QpAttr, QpAttrMask, QpCaps, QpInitAttr, QpState, QpTransitionError, QpType};
use crate::queue_pair::{InitParams, RtrParams, RtsParams};
use crate::types::{Gid, Lkey, Psn, Qpn};
use crate::wr::{RecvWr, SendWr, Sge, WcStatus, WorkCompletion, WrError};

const CAPS: QpCaps = QpCaps {
    max_send_wr: 16,
    max_recv_wr: 16,
    max_send_sge: 1,
    max_recv_sge: 1,
    max_inline_data: 0,
};

type Context = crate::verbs::Context<FakeProvider>;
type ProtectionDomain = crate::verbs::ProtectionDomain<FakeProvider>;
type CompletionQueue = crate::cq::CompletionQueue<FakeProvider>;
type QueuePair = crate::queue_pair::QueuePair<FakeProvider>;

struct Rig {
    fake: Arc<FakeProvider>,
    ctx: Context,
    pd: ProtectionDomain,
}

fn rig() -> Rig {
    let fake = FakeProvider::new();
    let ctx = Context::new(fake.clone());
    let pd = ctx.alloc_pd().expect("alloc_pd");
    Rig { fake, ctx, pd }
}

impl Rig {
    fn cq(&self, depth: u32) -> CompletionQueue {
        self.ctx.create_cq(depth).expect("create_cq")
    }

    fn qp(&self, send_cq: &CompletionQueue, recv_cq: &CompletionQueue, caps: QpCaps) -> QueuePair {
        self.pd
            .create_qp(send_cq, recv_cq, &QpInitAttr::new(QpType::Rc, caps))
            .expect("create_qp")
    }

    /// A QP in RTS on one CQ of `depth`.
    fn connected(&self, depth: u32, caps: QpCaps) -> (CompletionQueue, QueuePair) {
        let cq = self.cq(depth);
        let mut qp = self.qp(&cq, &cq, caps);
        bring_up(&mut qp);
        (cq, qp)
    }
}

fn bring_up<P: crate::provider::Provider>(qp: &mut crate::queue_pair::QueuePair<P>) {
    qp.to_init(&InitParams::default()).expect("to_init");
    let gid: Gid = "::ffff:10.0.0.2".parse().expect("gid");
    qp.to_rtr(
        Qpn::from_wire(0x77),
        Psn::from_wire(0x1234),
        gid,
        &RtrParams::default(),
    )
    .expect("to_rtr");
    qp.to_rts(Psn::from_wire(0x4321), &RtsParams::default())
        .expect("to_rts");
}

const SGE: [Sge; 1] = [Sge {
    addr: 0x1000,
    length: 64,
    lkey: Lkey(1),
}];

fn unsignaled(wr_id: u64) -> SendWr<'static> {
    SendWr::send(wr_id, &SGE)
}

fn signaled(wr_id: u64) -> SendWr<'static> {
    SendWr::send(wr_id, &SGE).signaled()
}

fn recv(wr_id: u64) -> RecvWr<'static> {
    RecvWr::new(wr_id, &SGE)
}

fn poll_all(cq: &mut CompletionQueue) -> Vec<WorkCompletion> {
    let mut out = Vec::new();
    let mut wcs = [WorkCompletion::default(); 4];
    loop {
        let n = cq.poll(&mut wcs).expect("poll");
        out.extend_from_slice(&wcs[..n]);
        if n < wcs.len() {
            return out;
        }
    }
}

fn ids(fake: &FakeProvider) -> (u32, u32, Vec<u32>) {
    let calls = fake.calls();
    let pd = calls.iter().find_map(|c| match c {
        Call::AllocPd(i) => Some(*i),
        _ => None,
    });
    let mr = calls.iter().find_map(|c| match c {
        Call::RegMr(i) => Some(*i),
        _ => None,
    });
    let cqs = calls
        .iter()
        .filter_map(|c| match c {
            Call::CreateCq(i) => Some(*i),
            _ => None,
        })
        .collect();
    (pd.unwrap_or(0), mr.unwrap_or(0), cqs)
}

#[test]
fn teardown_runs_qp_cq_mr_pd_whatever_the_drop_order() {
    let Rig { fake, ctx, pd } = rig();
    let mr = pd
        .reg_mr(Arc::new(HeapMemory::new(4096)), AccessFlags::LOCAL_WRITE)
        .expect("reg_mr");
    let cq = ctx.create_cq(8).expect("create_cq");
    let mut qp = pd
        .create_qp(&cq, &cq, &QpInitAttr::new(QpType::Rc, CAPS))
        .expect("create_qp");
    bring_up(&mut qp);
    // A posted request naming the region retains it: no opt-in call.
    let sge = [mr.whole()];
    qp.post_send(&[SendWr::send(1, &sge)]).expect("post");
    assert_eq!(qp.retained_regions(), 1);
    let (pd_h, mr_h, cqs) = ids(&fake);
    let qpn = qp.qpn();

    // Drop the handles in the worst order: nothing may be torn down yet.
    drop(pd);
    drop(mr);
    drop(cq);
    drop(ctx);
    assert_eq!(fake.teardown_calls(), []);

    drop(qp);
    assert_eq!(
        fake.teardown_calls(),
        [
            Call::DestroyQp(qpn),
            Call::DestroyCq(cqs[0]),
            Call::DeregMr(mr_h),
            Call::DeallocPd(pd_h)
        ]
    );
}

#[test]
fn each_object_is_destroyed_once_and_parents_wait_for_children() {
    let Rig { fake, ctx, pd } = rig();
    let send_cq = ctx.create_cq(8).expect("send cq");
    let recv_cq = ctx.create_cq(8).expect("recv cq");
    let mr = pd
        .reg_mr(Arc::new(HeapMemory::new(64)), AccessFlags::empty())
        .expect("reg_mr");
    let qp = pd
        .create_qp(&send_cq, &recv_cq, &QpInitAttr::new(QpType::Rc, CAPS))
        .expect("create_qp");
    let (pd_h, mr_h, cqs) = ids(&fake);
    let (s_h, r_h) = (cqs[0], cqs[1]);
    let qpn = qp.qpn();

    drop(pd); // the MR and the QP keep it
    drop(recv_cq); // the QP keeps it
    assert_eq!(fake.teardown_calls(), []);
    drop(qp);
    // The QP first, then the receive CQ only it held; the send CQ lives on.
    assert_eq!(
        fake.teardown_calls(),
        [Call::DestroyQp(qpn), Call::DestroyCq(r_h)]
    );
    drop(mr);
    drop(send_cq);
    assert_eq!(
        fake.teardown_calls(),
        [
            Call::DestroyQp(qpn),
            Call::DestroyCq(r_h),
            Call::DeregMr(mr_h),
            Call::DeallocPd(pd_h),
            Call::DestroyCq(s_h)
        ]
    );
}

#[test]
fn modify_rejects_illegal_transitions_before_the_provider_is_called() {
    let r = rig();
    let cq = r.cq(8);
    let mut qp = r.qp(&cq, &cq, CAPS);
    let gid = Gid::ZERO;

    let err = qp
        .to_rtr(
            Qpn::from_wire(1),
            Psn::from_wire(1),
            gid,
            &RtrParams::default(),
        )
        .expect_err("RESET -> RTR is illegal");
    assert_eq!(
        err,
        VerbsError::ModifyQpRejected {
            qpn: qp.qpn(),
            source: QpTransitionError::IllegalTransition {
                qp_type: QpType::Rc,
                from: QpState::Reset,
                to: QpState::Rtr
            }
        }
    );
    let attr = QpAttr {
        qp_state: QpState::Init,
        ..QpAttr::default()
    };
    let err = qp
        .modify(&attr, QpAttrMask::STATE | QpAttrMask::PORT)
        .expect_err("missing attributes");
    assert!(matches!(
        err,
        VerbsError::ModifyQpRejected {
            source: QpTransitionError::MissingAttributes { missing, .. },
            ..
        } if missing == QpAttrMask::PKEY_INDEX | QpAttrMask::ACCESS_FLAGS
    ));
    let attr = QpAttr {
        qp_state: QpState::Init,
        retry_cnt: 9,
        ..QpAttr::default()
    };
    let mask =
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS;
    assert!(qp.modify(&attr, mask | QpAttrMask::RETRY_CNT).is_err());
    assert_eq!(fake_modify_count(&r), 0);
    assert_eq!(qp.state(), QpState::Reset);

    bring_up(&mut qp);
    assert_eq!(qp.state(), QpState::Rts);
    let modifies: Vec<QpAttrMask> = r
        .fake
        .calls()
        .into_iter()
        .filter_map(|c| match c {
            Call::ModifyQp(_, m) => Some(m),
            _ => None,
        })
        .collect();
    assert_eq!(
        modifies,
        [
            mask,
            QpAttrMask::STATE
                | QpAttrMask::AV
                | QpAttrMask::PATH_MTU
                | QpAttrMask::DEST_QPN
                | QpAttrMask::RQ_PSN
                | QpAttrMask::MAX_DEST_RD_ATOMIC
                | QpAttrMask::MIN_RNR_TIMER,
            QpAttrMask::STATE
                | QpAttrMask::SQ_PSN
                | QpAttrMask::TIMEOUT
                | QpAttrMask::RETRY_CNT
                | QpAttrMask::RNR_RETRY
                | QpAttrMask::MAX_QP_RD_ATOMIC
        ]
    );
    // RTS -> INIT is illegal too, and again the device is not asked.
    assert!(qp.to_init(&InitParams::default()).is_err());
    assert_eq!(fake_modify_count(&r), 3);
    assert_eq!(qp.query().expect("query").qp_state, QpState::Rts);
}

fn fake_modify_count(r: &Rig) -> usize {
    r.fake.count_modify_calls()
}

#[test]
fn ud_bring_up_uses_qkey_and_no_remote_fields() {
    let r = rig();
    let cq = r.cq(8);
    let mut qp =
        r.pd.create_qp(&cq, &cq, &QpInitAttr::new(QpType::Ud, CAPS))
            .expect("create_qp");
    bring_up(&mut qp);
    assert_eq!(qp.state(), QpState::Rts);
    let modifies: Vec<QpAttrMask> = r
        .fake
        .calls()
        .into_iter()
        .filter_map(|c| match c {
            Call::ModifyQp(_, m) => Some(m),
            _ => None,
        })
        .collect();
    assert_eq!(
        modifies,
        [
            QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY,
            QpAttrMask::STATE,
            QpAttrMask::STATE | QpAttrMask::SQ_PSN
        ]
    );
}

#[test]
fn a_cq_deep_enough_for_its_queues_reserves_once_and_counts_nothing_per_request() {
    let r = rig();
    let caps = QpCaps {
        max_send_wr: 4,
        max_recv_wr: 4,
        ..CAPS
    };
    let mut cq = r.ctx.create_cq_reserved(8).expect("cq");
    let mut qp = r.qp(&cq, &cq, caps);
    bring_up(&mut qp);
    assert!(qp.credits_reserved());
    assert_eq!((cq.in_flight(), cq.stats().static_qps), (8, 1));
    let acquired = cq.stats().credits.acquired_total;
    qp.post_send(&[unsignaled(1), unsignaled(2), signaled(3)])
        .expect("post");
    qp.post_recv(&[recv(4)]).expect("post");
    // No credit moved per request: the reservation covers them.
    assert_eq!(cq.stats().credits.acquired_total, acquired);
    r.fake.complete_send(qp.qpn(), 3, WcStatus::Success);
    assert_eq!(poll_all(&mut cq).len(), 1);
    assert_eq!((qp.outstanding_sends(), qp.outstanding_recvs()), (0, 1));
    // The queue's own room is the bound: a fifth send is refused by the
    // driver, and counted as a stall of the QP.
    qp.post_send(&[unsignaled(5), unsignaled(6), unsignaled(7), signaled(8)])
        .expect("room for 4");
    assert!(matches!(
        qp.post_send(&[signaled(9)]),
        Err(VerbsError::PostSend {
            reason: PostError::QueueFull { .. },
            ..
        })
    ));
    assert_eq!(qp.stalls(), 1);
    // A second QP does not fit what is left: refused at creation, not
    // starved later.
    let err =
        r.pd.create_qp(&cq, &cq, &QpInitAttr::new(QpType::Rc, caps))
            .expect_err("oversubscribed");
    assert_eq!(
        err,
        VerbsError::CqOversubscribed {
            depth: 8,
            reserved: 8,
            needed: 8
        }
    );
    drop(qp);
    assert_eq!(cq.in_flight(), 0);
    let mut other = r.qp(&cq, &cq, caps);
    bring_up(&mut other);
    assert!(other.credits_reserved());
    other.post_send(&[signaled(1)]).expect("post");
    r.fake.complete_send(other.qpn(), 1, WcStatus::Success);
    assert_eq!(poll_all(&mut cq).len(), 1);
    assert_eq!(cq.in_flight(), 8);
    drop(other);
    assert_eq!(cq.in_flight(), 0);
    assert_eq!(cq.stats().credit_release_errors, 0);
}

#[test]
fn receive_credits_refuse_the_depth_plus_first_and_come_back_after_polling() {
    let r = rig();
    let (mut cq, mut qp) = r.connected(4, CAPS);
    qp.post_recv(&[recv(1), recv(2), recv(3)]).expect("3 of 4");
    qp.post_recv(&[recv(4)]).expect("4 of 4");
    assert_eq!((cq.in_flight(), cq.available()), (4, 0));

    let err = qp
        .post_recv(&[recv(5)])
        .expect_err("the 5th exceeds the depth");
    assert_eq!(
        err,
        VerbsError::PostRecv {
            index: 0,
            reason: PostError::CqFull {
                depth: 4,
                in_flight: 4,
                requested: 1
            }
        }
    );
    assert_eq!(cq.stats().credits.stalls, 1);
    assert_eq!(r.fake.posted_recvs(), [1, 2, 3, 4]);

    r.fake.complete_recv(qp.qpn(), 1, WcStatus::Success);
    r.fake.complete_recv(qp.qpn(), 2, WcStatus::Success);
    let wcs = poll_all(&mut cq);
    assert_eq!(wcs.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [1, 2]);
    assert_eq!((cq.in_flight(), qp.outstanding_recvs()), (2, 2));

    // A batch larger than the room left is refused whole.
    assert!(qp.post_recv(&[recv(5), recv(6), recv(7)]).is_err());
    assert_eq!(cq.stats().credits.stalls, 2);
    assert_eq!(r.fake.posted_recvs(), [1, 2, 3, 4]);
    qp.post_recv(&[recv(5), recv(6)]).expect("room for 2");
    assert_eq!(cq.in_flight(), 4);
}

#[test]
fn send_credits_count_unsignaled_requests_too() {
    let r = rig();
    let (cq, mut qp) = r.connected(2, CAPS);
    qp.post_send(&[unsignaled(1), unsignaled(2)])
        .expect("2 of 2");
    let err = qp.post_send(&[signaled(3)]).expect_err("CQ full");
    assert!(matches!(
        err,
        VerbsError::PostSend {
            index: 0,
            reason: PostError::CqFull {
                depth: 2,
                in_flight: 2,
                requested: 1,
            }
        }
    ));
    assert_eq!(r.fake.posted_sends(), [1, 2]);
    assert_eq!(cq.stats().credits.stalls, 1);
}

#[test]
fn unsignaled_requests_are_released_by_the_next_signaled_completion() {
    let r = rig();
    let (mut cq, mut qp) = r.connected(8, CAPS);
    qp.post_send(&[unsignaled(1), unsignaled(2), unsignaled(3), signaled(4)])
        .expect("post");
    qp.post_send(&[unsignaled(5)]).expect("post");
    assert_eq!((cq.in_flight(), qp.outstanding_sends()), (5, 5));

    r.fake.complete_send(qp.qpn(), 4, WcStatus::Success);
    let wcs = poll_all(&mut cq);
    assert_eq!(wcs.len(), 1);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (4, WcStatus::Success));
    assert_eq!(wcs[0].retired_unsignaled, 3);
    // 1, 2, 3 retire with 4; 5 is still out.
    assert_eq!((cq.in_flight(), qp.outstanding_sends()), (1, 1));
}

#[test]
fn an_error_completion_for_an_unsignaled_request_releases_it_and_those_before() {
    let r = rig();
    let (mut cq, mut qp) = r.connected(8, CAPS);
    qp.post_send(&[unsignaled(1), unsignaled(2), signaled(3), unsignaled(4)])
        .expect("post");
    r.fake.complete_send(qp.qpn(), 2, WcStatus::RemAccessErr);
    let wcs = poll_all(&mut cq);
    assert_eq!(wcs[0].status, WcStatus::RemAccessErr);
    assert_eq!(cq.in_flight(), 2);
    // The QP went to ERR: the rest are flushed, unsignaled ones included.
    r.fake.complete_send(qp.qpn(), 3, WcStatus::WrFlushErr);
    r.fake.complete_send(qp.qpn(), 4, WcStatus::WrFlushErr);
    assert_eq!(poll_all(&mut cq).len(), 2);
    assert_eq!((cq.in_flight(), qp.outstanding_sends()), (0, 0));
    assert_eq!(cq.stats().credit_release_errors, 0);
}

#[test]
fn reused_wr_ids_do_not_confuse_the_accounting() {
    let r = rig();
    let (mut cq, mut qp) = r.connected(8, CAPS);
    // Two requests share wr_id 7; only the second is signaled. The driver
    // says how many requests its completion retires: nobody matches ids.
    qp.post_send(&[unsignaled(7), signaled(7), signaled(8)])
        .expect("post");
    r.fake.complete_send(qp.qpn(), 7, WcStatus::Success);
    poll_all(&mut cq);
    assert_eq!(cq.in_flight(), 1);
}

#[test]
fn separate_send_and_receive_cqs_account_separately() {
    let r = rig();
    let mut send_cq = r.cq(4);
    let mut recv_cq = r.cq(4);
    let mut qp = r.qp(&send_cq, &recv_cq, CAPS);
    bring_up(&mut qp);
    qp.post_recv(&[recv(1), recv(2)]).expect("recv");
    qp.post_send(&[signaled(10)]).expect("send");
    assert_eq!((send_cq.in_flight(), recv_cq.in_flight()), (1, 2));
    r.fake.complete_send(qp.qpn(), 10, WcStatus::Success);
    r.fake.complete_recv(qp.qpn(), 1, WcStatus::Success);
    assert_eq!(poll_all(&mut send_cq).len(), 1);
    assert_eq!(poll_all(&mut recv_cq).len(), 1);
    assert_eq!((send_cq.in_flight(), recv_cq.in_flight()), (0, 1));
}

#[test]
fn a_partial_post_keeps_the_credits_of_what_was_posted_only() {
    let r = rig();
    let (mut cq, mut qp) = r.connected(8, CAPS);
    r.fake.refuse_next_send_after(2);
    let err = qp
        .post_send(&[unsignaled(1), signaled(2), unsignaled(3), signaled(4)])
        .expect_err("device refuses the third");
    assert_eq!(err.posted_count(), 2);
    assert_eq!(r.fake.posted_sends(), [1, 2]);
    assert_eq!((cq.in_flight(), qp.outstanding_sends()), (2, 2));
    qp.post_send(&[signaled(5)]).expect("post");
    r.fake.complete_send(qp.qpn(), 2, WcStatus::Success);
    r.fake.complete_send(qp.qpn(), 5, WcStatus::Success);
    poll_all(&mut cq);
    assert_eq!((cq.in_flight(), qp.outstanding_sends()), (0, 0));

    r.fake.refuse_next_recv_after(1);
    let err = qp
        .post_recv(&[recv(1), recv(2), recv(3)])
        .expect_err("refused");
    assert_eq!(err.posted_count(), 1);
    assert_eq!((cq.in_flight(), qp.outstanding_recvs()), (1, 1));
}

#[test]
fn a_malformed_request_stops_the_batch_after_posting_those_before() {
    let r = rig();
    let (cq, mut qp) = r.connected(8, CAPS);
    let two = [SGE[0], SGE[0]];
    let batch = [
        signaled(1),
        unsignaled(2),
        SendWr::send(3, &two),
        signaled(4),
    ];
    let err = qp.post_send(&batch).expect_err("too many SGEs");
    assert_eq!(
        err,
        VerbsError::PostSend {
            index: 2,
            reason: PostError::InvalidWr(WrError::TooManySges { count: 2, max: 1 })
        }
    );
    assert_eq!(r.fake.posted_sends(), [1, 2]);
    assert_eq!(cq.in_flight(), 2);
    let err = qp
        .post_recv(&[RecvWr::new(9, &two)])
        .expect_err("too many SGEs");
    assert_eq!(err.posted_count(), 0);
    assert_eq!(r.fake.posted_recvs(), []);
}

#[test]
fn state_and_queue_capacity_are_checked_before_posting() {
    let r = rig();
    let cq = r.cq(32);
    let caps = QpCaps {
        max_send_wr: 2,
        max_recv_wr: 3,
        ..CAPS
    };
    let mut qp = r.qp(&cq, &cq, caps);
    assert!(matches!(
        qp.post_recv(&[recv(1)]),
        Err(VerbsError::PostRecv {
            reason: PostError::QpState {
                state: QpState::Reset
            },
            ..
        })
    ));
    qp.to_init(&InitParams::default()).expect("init");
    assert!(matches!(
        qp.post_send(&[signaled(1)]),
        Err(VerbsError::PostSend {
            reason: PostError::QpState {
                state: QpState::Init
            },
            ..
        })
    ));
    qp.post_recv(&[recv(1), recv(2), recv(3)])
        .expect("fills the RQ");
    assert_eq!(
        qp.post_recv(&[recv(4)]),
        Err(VerbsError::PostRecv {
            index: 0,
            reason: PostError::QueueFull {
                outstanding: 3,
                capacity: 3,
                requested: 1
            }
        })
    );
    let gid = Gid::ZERO;
    qp.to_rtr(
        Qpn::from_wire(2),
        Psn::from_wire(0),
        gid,
        &RtrParams::default(),
    )
    .expect("rtr");
    qp.to_rts(Psn::from_wire(0), &RtsParams::default())
        .expect("rts");
    qp.post_send(&[unsignaled(1), unsignaled(2)])
        .expect("fills the SQ");
    assert!(matches!(
        qp.post_send(&[signaled(3)]),
        Err(VerbsError::PostSend {
            reason: PostError::QueueFull {
                outstanding: 2,
                capacity: 2,
                ..
            },
            ..
        })
    ));
    // Queue-full refusals are not CQ stalls; the QP counts them.
    assert_eq!(cq.stats().credits.stalls, 0);
    assert_eq!(qp.stalls(), 2);
    assert_eq!(cq.in_flight(), 5);
}

#[test]
fn a_single_inline_send_is_offered_to_the_drivers_shortcut_and_a_decline_goes_the_general_way() {
    let r = rig();
    let caps = QpCaps {
        max_send_wr: 3,
        max_recv_wr: 1,
        max_inline_data: 64,
        ..CAPS
    };
    let mut cq = r.ctx.create_cq_reserved(4).expect("cq");
    let mut qp = r.qp(&cq, &cq, caps);
    bring_up(&mut qp);
    assert!(qp.credits_reserved());
    // Declined (the driver has no shortcut): posted by the general call.
    qp.post_send(&[signaled(1).inline()]).expect("post");
    assert_eq!(r.fake.send_paths(), (1, 0, 1));
    // Taken: the general call is not made.
    r.fake.set_take_one_sends(true);
    qp.post_send(&[signaled(2).inline()]).expect("post");
    assert_eq!(r.fake.send_paths(), (2, 1, 1));
    // Not offered: a request that is not inline (its region is retained),
    // or a batch.
    qp.post_send(&[signaled(3)]).expect("post");
    assert_eq!(r.fake.send_paths(), (2, 1, 2));
    assert!(matches!(
        qp.post_send(&[unsignaled(4).inline(), signaled(5).inline()]),
        Err(VerbsError::PostSend {
            index: 0,
            reason: PostError::QueueFull {
                outstanding: 3,
                capacity: 3,
                requested: 2
            }
        })
    ));
    assert_eq!(r.fake.send_paths(), (2, 1, 3));
    // A full queue: the shortcut refuses (nothing posted), the general
    // call says why, and the QP counts the stall.
    let stalls = qp.stalls();
    assert!(matches!(
        qp.post_send(&[signaled(6).inline()]),
        Err(VerbsError::PostSend {
            index: 0,
            reason: PostError::QueueFull { .. }
        })
    ));
    assert_eq!(r.fake.send_paths(), (3, 1, 4));
    assert_eq!(qp.stalls(), stalls + 1);
    // What either path posted completes as posted.
    for id in [1, 2, 3] {
        r.fake.complete_send(qp.qpn(), id, WcStatus::Success);
    }
    let got: Vec<u64> = poll_all(&mut cq).iter().map(|wc| wc.wr_id).collect();
    assert_eq!(got, [1, 2, 3]);
    assert_eq!(qp.outstanding_sends(), 0);
    // A QP taking credits per request (a shared CQ's window) is never
    // offered: its credit is taken before the driver sees the request.
    let (_cq2, mut windowed) = r.connected(32, caps);
    assert!(!windowed.credits_reserved());
    windowed.post_send(&[signaled(7).inline()]).expect("post");
    assert_eq!(r.fake.send_paths(), (3, 1, 5));
}

#[test]
fn reset_and_destroy_return_every_credit() {
    let r = rig();
    let mut cq = r.cq(16);
    let mut a = r.qp(&cq, &cq, CAPS);
    let mut b = r.qp(&cq, &cq, CAPS);
    bring_up(&mut a);
    bring_up(&mut b);
    a.post_recv(&[recv(1), recv(2)]).expect("recv");
    a.post_send(&[unsignaled(3), signaled(4)]).expect("send");
    b.post_send(&[signaled(5)]).expect("send");
    // A completion of `a` is queued but not yet polled when it is reset.
    r.fake.complete_send(a.qpn(), 4, WcStatus::Success);
    assert_eq!(cq.in_flight(), 5);

    a.reset().expect("reset");
    assert_eq!(a.state(), QpState::Reset);
    assert_eq!(
        (cq.in_flight(), a.outstanding_sends(), a.outstanding_recvs()),
        (1, 0, 0)
    );
    // The reset discarded `a`'s queued completion; nothing is double-counted.
    assert_eq!(poll_all(&mut cq), []);

    bring_up(&mut a);
    a.post_send(&[unsignaled(6), unsignaled(7)]).expect("send");
    assert_eq!(cq.in_flight(), 3);
    drop(a);
    assert_eq!(cq.in_flight(), 1);
    // `b` is untouched and still retires normally.
    r.fake.complete_send(b.qpn(), 5, WcStatus::Success);
    poll_all(&mut cq);
    assert_eq!(cq.in_flight(), 0);
    assert_eq!(cq.stats().credit_release_errors, 0);
}

#[test]
fn polling_and_posting_on_different_threads() {
    const BATCHES: u64 = 2_000;
    let r = rig();
    let (mut cq, mut qp) = r.connected(
        16,
        QpCaps {
            max_send_wr: 12,
            ..CAPS
        },
    );
    assert!(!qp.credits_reserved());
    r.fake.set_auto_complete(true);
    let done = Arc::new(AtomicBool::new(false));
    let poller = {
        let done = Arc::clone(&done);
        std::thread::spawn(move || {
            let mut wcs = [WorkCompletion::default(); 8];
            let mut seen = 0u64;
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
            while (!done.load(Ordering::Acquire) || cq.in_flight() > 0)
                && std::time::Instant::now() < deadline
            {
                seen += cq.poll(&mut wcs).expect("poll") as u64;
            }
            (seen, cq)
        })
    };
    let mut stalls = 0u64;
    for batch in 0..BATCHES {
        let base = batch * 4;
        let wrs = [
            unsignaled(base),
            unsignaled(base + 1),
            unsignaled(base + 2),
            signaled(base + 3),
        ];
        loop {
            match qp.post_send(&wrs) {
                Ok(()) => break,
                Err(VerbsError::PostSend {
                    index: 0,
                    reason: PostError::CqFull { .. } | PostError::QueueFull { .. },
                }) => {
                    stalls += 1;
                    assert!(!poller.is_finished(), "the poller gave up at batch {batch}");
                    // Back off rather than yield: a poster retrying at once keeps
                    // taking the fake provider's lock, and on a loaded machine the
                    // poller then waited for it for seconds (once past its 60 s).
                    std::thread::sleep(std::time::Duration::from_micros(20));
                }
                Err(e) => panic!("unexpected: {e}"),
            }
        }
    }
    done.store(true, Ordering::Release);
    let (seen, cq) = poller.join().expect("poller finished");
    assert_eq!(seen, BATCHES);
    let stats = cq.stats();
    assert_eq!((stats.in_flight, qp.outstanding_sends()), (0, 0));
    // Batches the driver refused for want of queue room gave their credits
    // straight back; every credit taken came back.
    assert!(stats.credits.acquired_total >= BATCHES * 4);
    assert_eq!(stats.credits.released_total, stats.credits.acquired_total);
    assert!(stats.credits.max_in_flight <= 16);
    assert!(stats.credits.stalls <= stalls);
    assert_eq!(qp.stalls(), stalls);
}

#[test]
fn memory_regions_check_access_and_bounds() {
    let r = rig();
    let mem = Arc::new(HeapMemory::new(4096));
    let err =
        r.pd.reg_mr(mem.clone(), AccessFlags::REMOTE_WRITE)
            .expect_err("REMOTE_WRITE needs LOCAL_WRITE");
    assert_eq!(
        err,
        VerbsError::RegMrAccess {
            source: AccessError::MissingLocalWrite {
                flags: AccessFlags::REMOTE_WRITE
            }
        }
    );
    assert!(!r.fake.calls().iter().any(|c| matches!(c, Call::RegMr(_))));

    let mr =
        r.pd.reg_mr(
            mem.clone(),
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )
        .expect("reg_mr");
    assert_eq!((mr.addr(), mr.len()), (mem.addr(), 4096));
    assert_eq!(
        mr.sge(16, 32).expect("in range"),
        Sge::new(mem.addr() + 16, 32, mr.lkey())
    );
    assert_eq!(
        mr.sge(4090, 8),
        Err(MemoryError::OutOfRange {
            access: MemAccess::Read,
            offset: 4090,
            len: 8,
            region_len: 4096
        })
    );
    assert_eq!(mr.whole().length, 4096);
    // Writes through the region's memory are visible through the original Arc.
    mr.memory().write(0, b"rnic").expect("write");
    let mut back = [0u8; 4];
    mem.read(0, &mut back).expect("read");
    assert_eq!(&back, b"rnic");
}

#[test]
fn objects_of_another_context_are_refused() {
    let a = rig();
    let b = rig();
    let foreign = b.cq(4);
    let local = a.cq(4);
    let err =
        a.pd.create_qp(&local, &foreign, &QpInitAttr::new(QpType::Rc, CAPS))
            .expect_err("foreign CQ");
    assert_eq!(
        err,
        VerbsError::ForeignObject {
            operation: "create_qp",
            what: "the receive CQ"
        }
    );
    assert!(
        !a.fake
            .calls()
            .iter()
            .any(|c| matches!(c, Call::CreateQp(_)))
    );
}

#[test]
fn the_dyn_path_reaches_the_same_driver() {
    let fake = FakeProvider::new();
    let ctx = crate::verbs::Context::from_dyn(fake.clone());
    assert_eq!(ctx.backend(), "fake");
    let pd = ctx.alloc_pd().expect("pd");
    let mut cq = ctx.create_cq(8).expect("cq");
    let mr = pd
        .reg_mr(Arc::new(HeapMemory::new(64)), AccessFlags::LOCAL_WRITE)
        .expect("mr");
    let mut qp = pd
        .create_qp(&cq, &cq, &QpInitAttr::new(QpType::Ud, CAPS))
        .expect("qp");
    bring_up(&mut qp);
    let ah = pd
        .create_ah(&crate::qp::AddressVector::new(Gid::ZERO))
        .expect("ah");
    assert!(ah.driver::<crate::fake_provider::FakeAh>().is_some());
    let sge = [mr.whole()];
    qp.post_send(&[SendWr::ud_send(1, &sge, &ah, Qpn::from_wire(2), 1).signaled()])
        .expect("post");
    fake.complete_send(qp.qpn(), 1, WcStatus::Success);
    let mut wcs = [WorkCompletion::default(); 2];
    assert_eq!(cq.poll(&mut wcs).expect("poll"), 1);
    // A CQ of another driver (type) is refused by the dyn wrapper.
    let other = crate::verbs::Context::from_dyn(FakeProvider::new());
    let foreign = other.create_cq(4).expect("cq");
    assert!(matches!(
        pd.create_qp(&foreign, &foreign, &QpInitAttr::new(QpType::Rc, CAPS)),
        Err(VerbsError::ForeignObject { .. })
    ));
}

#[test]
fn context_queries_reach_the_provider() {
    let r = rig();
    assert_eq!(r.ctx.backend(), "fake");
    assert_eq!(r.ctx.query_device().expect("device").max_qp, 64);
    assert!(r.ctx.query_port(1).is_ok());
    assert!(matches!(
        r.ctx.query_port(2),
        Err(VerbsError::QueryPort { port: 2, .. })
    ));
    let cq = r.cq(4);
    assert_eq!(cq.event_fd(), None);
    assert_eq!(
        cq.wait(None),
        Err(VerbsError::NotSupported {
            operation: "wait_cq",
            backend: "fake"
        })
    );
}

/// The objects can be shared with and moved to other threads (a compile-time
/// property: this fails to build if one stops being `Send + Sync`).
#[test]
fn objects_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Context>();
    check::<ProtectionDomain>();
    check::<crate::verbs::MemoryRegion<FakeProvider>>();
    check::<QueuePair>();
    check::<crate::verbs::Context>();
    check::<crate::queue_pair::QueuePair>();
    check::<crate::verbs::AddressHandle>();
    check::<HeapMemory>();
    check::<crate::credit::CreditWindow>();
    // A CQ moves between threads but is polled by one at a time.
    fn send<T: Send>() {}
    send::<CompletionQueue>();
    send::<crate::cq::CompletionQueue>();
    send::<std::sync::Mutex<CompletionQueue>>();
    check::<std::sync::Mutex<CompletionQueue>>();
}

/// A UD QP in RTS on `fake`, with a registered region.
fn ud_rig(
    ctx: &Context,
) -> (
    ProtectionDomain,
    CompletionQueue,
    crate::verbs::MemoryRegion<FakeProvider>,
    QueuePair,
) {
    let pd = ctx.alloc_pd().expect("pd");
    let cq = ctx.create_cq(8).expect("cq");
    let mr = pd
        .reg_mr(Arc::new(HeapMemory::new(64)), AccessFlags::LOCAL_WRITE)
        .expect("mr");
    let mut qp = pd
        .create_qp(&cq, &cq, &QpInitAttr::new(QpType::Ud, CAPS))
        .expect("qp");
    bring_up(&mut qp);
    (pd, cq, mr, qp)
}

#[test]
fn ud_sends_use_the_handle_checked_once_at_create_ah() {
    let fake = FakeProvider::new();
    let ctx = Context::new(fake.clone());
    let (pd, _cq, mr, mut qp) = ud_rig(&ctx);
    let mut av = crate::qp::AddressVector::new(Gid::from_ipv4([10, 0, 0, 2].into()));
    av.hop_limit = 7;
    // A vector the device cannot use is refused at create_ah, typed.
    let bad = crate::qp::AddressVector {
        sgid_index: 4,
        ..av
    };
    assert!(matches!(
        pd.create_ah(&bad),
        Err(VerbsError::AddressVector {
            source: crate::provider::AvError::NoSuchSgid { index: 4, .. },
            ..
        })
    ));
    let ah = pd.create_ah(&av).expect("ah");
    assert_eq!(fake.av_checks(), 2);
    let sge = [mr.whole()];
    let wrs: Vec<SendWr<'_>> = (0..5)
        .map(|i| SendWr::ud_send(i, &sge, &ah, Qpn::from_wire(0x40 + i as u32), 0x1111))
        .collect();
    qp.post_send(&wrs).expect("post");
    qp.post_send(&wrs[..1]).expect("post");
    // Six sends, no check of the vector after create_ah's.
    assert_eq!(fake.av_checks(), 2);
    let sent = fake.ud_sent();
    assert_eq!(sent.len(), 6);
    for (i, (wr_id, dest)) in sent.iter().take(5).enumerate() {
        assert_eq!(*wr_id, i as u64);
        assert_eq!(dest.av, av);
        assert_eq!(dest.remote_qpn, Qpn::from_wire(0x40 + i as u32));
        assert_eq!(dest.remote_qkey, 0x1111);
    }
}

#[test]
fn an_address_handle_of_another_device_is_refused_and_nothing_sent() {
    let fake = FakeProvider::new();
    let ctx = Context::new(fake.clone());
    let (_pd, _cq, mr, mut qp) = ud_rig(&ctx);
    // Same driver type, another device.
    let other = FakeProvider::new();
    let other_ctx = Context::new(other.clone());
    let other_pd = other_ctx.alloc_pd().expect("pd");
    let foreign = other_pd
        .create_ah(&crate::qp::AddressVector::new(Gid::ZERO))
        .expect("ah");
    let sge = [mr.whole()];
    let before = fake.calls().len();
    let err = qp
        .post_send(&[SendWr::ud_send(1, &sge, &foreign, Qpn::from_wire(2), 1).signaled()])
        .expect_err("a foreign handle");
    assert_eq!(
        err,
        VerbsError::PostSend {
            index: 0,
            reason: PostError::ForeignAddressHandle
        }
    );
    // A handle no driver resolved is refused the same way.
    let unchecked =
        crate::verbs::AddressHandle::unchecked(crate::qp::AddressVector::new(Gid::ZERO));
    assert!(matches!(
        qp.post_send(&[SendWr::ud_send(2, &sge, &unchecked, Qpn::from_wire(2), 1)]),
        Err(VerbsError::PostSend {
            index: 0,
            reason: PostError::ForeignAddressHandle
        })
    ));
    assert!(fake.ud_sent().is_empty());
    assert!(
        fake.calls()[before..]
            .iter()
            .all(|c| matches!(c, Call::PostSend(_, w) if w.is_empty())),
        "nothing accepted"
    );
    assert_eq!(qp.outstanding_sends(), 0);
}

#[test]
fn a_single_inline_request_goes_straight_to_the_driver_retaining_nothing() {
    // The shortcut of `QueuePair::post_send` (one inline request, no credit
    // window): it retains no region, a refusal is counted as a stall as on
    // the general path, and a batch or a non-inline request still retains.
    let r = rig();
    let mr =
        r.pd.reg_mr(Arc::new(HeapMemory::new(4096)), AccessFlags::LOCAL_WRITE)
            .expect("reg_mr");
    let caps = QpCaps {
        max_send_wr: 2,
        max_recv_wr: 2,
        max_inline_data: 64,
        ..CAPS
    };
    let mut cq = r.ctx.create_cq_reserved(8).expect("cq");
    let mut qp = r.qp(&cq, &cq, caps);
    bring_up(&mut qp);
    assert!(qp.credits_reserved());
    let sge = [Sge {
        length: 8,
        ..mr.whole()
    }];
    qp.post_send(&[SendWr::send(1, &sge).inline().signaled()])
        .expect("inline post");
    assert_eq!(
        qp.retained_regions(),
        0,
        "an inline request names no region"
    );
    assert_eq!(qp.outstanding_sends(), 1);
    qp.post_send(&[SendWr::send(2, &sge).inline().signaled()])
        .expect("fills the SQ");
    let err = qp
        .post_send(&[SendWr::send(3, &sge).inline().signaled()])
        .expect_err("SQ full");
    assert!(
        matches!(
            err,
            VerbsError::PostSend {
                index: 0,
                reason: PostError::QueueFull { .. },
            }
        ),
        "{err:?}"
    );
    assert_eq!(qp.stalls(), 1);
    assert_eq!(qp.outstanding_sends(), 2, "the refusal posted nothing");
    r.fake.complete_send(qp.qpn(), 1, WcStatus::Success);
    r.fake.complete_send(qp.qpn(), 2, WcStatus::Success);
    assert_eq!(poll_all(&mut cq).len(), 2);
    // The general path: a non-inline request retains its region.
    qp.post_send(&[SendWr::send(4, &sge).signaled()])
        .expect("post");
    assert_eq!(qp.retained_regions(), 1);
}
