//! Teardown in caller-driven mode: a progress round that received a request
//! and produced only its ACK defers the ACK to the caller's next call. An
//! application that polls its last completion and then destroys the QP (as
//! `rc_pingpong` does at the end of a run) makes no next call, so destroying
//! the QP must send what was deferred (a QP keeps its device alive, so this
//! also covers dropping the device). Found against
//! kernel rxe (tests/vm interop-pingpong, busy polling): the kernel's last
//! SEND was never acknowledged and its `ibv_rc_pingpong` hung.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use rnic_core::{Mtu, QpType, RecvWr, SendWr, WcStatus};
use rnic_rxe::Progress;

fn last_send_is_acknowledged(teardown: impl FnOnce(Side, rnic_core::QueuePair)) {
    let (ia, ib) = ip_pair();
    // A waits for its ACK (progress thread); B busy-polls (caller-driven).
    let a = Side::new(open(ia, Progress::Thread), 4096, 64);
    let b = Side::new(open(ib, Progress::Caller), 4096, 64);
    let (mut qa, mut qb) = (a.qp(QpType::Rc), b.qp(QpType::Rc));
    connect(&a, &mut qa, &b, &mut qb, Mtu::Mtu1024);
    let rsge = [b.mr.sge(0, 64).unwrap()];
    qb.post_recv(&[RecvWr::new(7, &rsge)]).unwrap();
    a.fill(0, b"the last one");
    let ssge = [a.mr.sge(0, 12).unwrap()];
    qa.post_send(&[SendWr::send(1, &ssge).signaled()]).unwrap();
    let wc = wait(&b.cq, 1, &[]);
    assert_eq!(wc[0].status, WcStatus::Success);
    assert_eq!(b.bytes(0, 12), b"the last one");
    assert!(
        b.dev.stats().device.acks_deferred > 0,
        "the round that delivered the SEND should have deferred its ACK"
    );
    // B makes no further call into the device before tearing down.
    teardown(b, qb);
    let wc = wait(&a.cq, 1, &[]);
    assert_eq!(
        wc[0].status,
        WcStatus::Success,
        "A's SEND must be acknowledged by the ACK B deferred"
    );
    assert_eq!(a.dev.stats().qp(qa.qpn()).unwrap().retransmits, 0);
}

#[test]
fn deferred_ack_leaves_when_the_qp_is_destroyed() {
    last_send_is_acknowledged(|b, qb| {
        drop(qb);
        // The device stays open (and nobody polls it) while A waits.
        std::thread::sleep(std::time::Duration::from_millis(300));
        drop(b);
    });
}
