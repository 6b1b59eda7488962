//! The poll handoff (`RxeConfig::poll_handoff`) of a progress-thread
//! device. Stock `ib_write_lat`'s ping-pong: each side spins on its memory
//! until the peer's WRITE lands, posts its own WRITE and polls for that
//! WRITE's completion. Without the handoff the progress thread must receive
//! every WRITE (nobody polls while a side spins on memory); with it the ACK
//! of each WRITE waits for the answering WRITE and leaves bundled behind
//! it, so the peer's poll receives the answer before its completion, and
//! the threads stay asleep after the first message. Also what the handoff
//! must not break: a passive responder (its held ACKs still leave), an
//! application that polls and then stops calling (the thread takes the
//! sockets back), and one that polls and then sleeps on a CQ event.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use common::*;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use rnic_core::{Mtu, QpType, QueuePair, RecvWr, SendWr, WcOpcode, WcStatus, WorkCompletion};
use rnic_rxe::{DeviceStats, Progress, RxeConfig, RxeDevice, Target};

/// Round trips of the ping-pong.
const ROUNDS: u32 = 2000;

/// The ping-pong's two spinning threads take both vCPUs of a small machine:
/// the other tests here wait for it (and it for them), so that what it
/// counts is its own.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn open_thread(ip: std::net::IpAddr, handoff: Option<Duration>) -> RxeDevice {
    RxeDevice::open(
        &RxeConfig::new(Target::Ip(ip))
            .with_progress(Progress::Thread)
            .with_poll_handoff(handoff),
    )
    .unwrap()
}

/// A connected RC pair of progress-thread devices.
fn pair(handoff: Option<Duration>) -> (Side, Side, QueuePair, QueuePair) {
    let (ia, ib) = ip_pair();
    let a = Side::new(open_thread(ia, handoff), 4096, 256);
    let b = Side::new(open_thread(ib, handoff), 4096, 256);
    let (mut qa, mut qb) = (a.qp(QpType::Rc), b.qp(QpType::Rc));
    connect(&a, &mut qa, &b, &mut qb, Mtu::Mtu1024);
    (a, b, qa, qb)
}

/// `a`, a progress-thread device with a handoff of `hold`, connected to `b`,
/// a caller-driven one (the test thread drives it by polling).
fn with_caller_peer(hold: Duration) -> (Side, Side, QueuePair, QueuePair) {
    let (ia, ib) = ip_pair();
    let a = Side::new(open_thread(ia, Some(hold)), 4096, 64);
    let b = Side::new(open(ib, Progress::Caller), 4096, 64);
    let (mut qa, mut qb) = (a.qp(QpType::Rc), b.qp(QpType::Rc));
    connect(&a, &mut qa, &b, &mut qb, Mtu::Mtu1024);
    (a, b, qa, qb)
}

/// One side of ib_write_lat: `first` posts before it waits. Byte 0 of
/// each side's buffer counts the peer's WRITEs (mod 256); nothing is
/// polled while spinning on it.
fn write_lat_side(me: &Side, qp: &mut QueuePair, peer: &Side, first: bool) {
    let mut wcs = [WorkCompletion::default(); 4];
    for i in 1..=ROUNDS {
        let v = i as u8;
        if !(first && i == 1) {
            let want = if first { (i - 1) as u8 } else { v };
            let t = Instant::now();
            while me.bytes(0, 1)[0] != want {
                assert!(
                    t.elapsed() < Duration::from_secs(20),
                    "round {i}: WRITE never landed"
                );
            }
        }
        me.fill(64, &[v; 8]);
        let sge = [me.mr.sge(64, 8).unwrap()];
        qp.post_send(&[
            SendWr::rdma_write(u64::from(i), &sge, peer.mr.addr(), peer.mr.rkey())
                .signaled()
                .inline(),
        ])
        .unwrap();
        let t = Instant::now();
        loop {
            let n = me.cq.poll(&mut wcs).unwrap();
            if n > 0 {
                assert_eq!(n, 1);
                assert_eq!(wcs[0].status, WcStatus::Success, "{:?}", wcs[0]);
                assert_eq!(wcs[0].wr_id, u64::from(i));
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "round {i}: no completion"
            );
        }
    }
    // The peer's last WRITE.
    if first {
        let t = Instant::now();
        while me.bytes(0, 1)[0] != ROUNDS as u8 {
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "last WRITE never landed"
            );
        }
    }
}

/// ROUNDS round trips; the two devices' counters and how long they took.
fn run_write_lat(handoff: Option<Duration>) -> (DeviceStats, DeviceStats, Duration) {
    let (a, b, mut qa, mut qb) = pair(handoff);
    let t = Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| write_lat_side(&a, &mut qa, &b, true));
        s.spawn(|| write_lat_side(&b, &mut qb, &a, false));
    });
    assert_eq!(a.bytes(0, 8), [ROUNDS as u8; 8]);
    assert_eq!(b.bytes(0, 8), [ROUNDS as u8; 8]);
    let (sa, sb) = (a.dev.stats().device, b.dev.stats().device);
    let took = t.elapsed();
    println!("handoff {handoff:?}, {took:?}\na: {sa:?}\nb: {sb:?}");
    (sa, sb, took)
}

#[test]
fn handoff_keeps_a_memory_spinning_ping_pong_off_the_progress_thread() {
    let rounds = u64::from(ROUNDS);
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    // Without: ACKs leave at the end of the round that received the WRITE
    // (bundled only when the answer happens to be queued by then). Whether
    // the peer's poll then catches the answer anyway or its progress thread
    // must wake for it depends on timing (GRO may merge the ACK and the
    // answer; counts vary from 100 to 2 600 datagrams): only that no ACK
    // waited is certain.
    let (ca, cb, _) = run_write_lat(None);
    for s in [&ca, &cb] {
        assert_eq!(s.acks_deferred, 0, "{s:?}");
    }
    // With (a hold long enough for a loaded machine): every ACK leaves
    // behind the answering WRITE, the polls receive, the threads sleep. A
    // thread still takes the first WRITE, and the sockets back when a side
    // stops polling for a millisecond (a descheduled test thread); while
    // the sockets are the application's it wakes once per millisecond to
    // check that they still are.
    let (sa, sb, took) = run_write_lat(Some(Duration::from_millis(20)));
    let idle_checks = u64::try_from(took.as_millis()).unwrap() + 1;
    for s in [&sa, &sb] {
        assert!(s.acks_deferred >= rounds - rounds / 20, "{s:?}");
        assert!(s.acks_bundled >= rounds - rounds / 4, "{s:?}");
        assert!(s.thread_datagrams <= rounds / 8, "{s:?}");
        assert!(s.thread_wakeups <= rounds / 8 + idle_checks, "{s:?}");
        assert_eq!(s.icrc_drops, 0);
    }
}

/// A responder whose application never calls again: the first ACK its
/// thread holds for a post that never comes leaves after the hold, and the
/// QP then counts as passive: later ACKs leave at once (a passive
/// `ib_write_bw` server keeps its bandwidth). Every WRITE completes, none
/// is retransmitted. A post on the QP makes it answering again.
#[test]
fn a_passive_responder_holds_one_ack_then_none() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let hold = Duration::from_millis(20);
    let (a, b, mut qa, mut qb) = with_caller_peer(hold);
    let qpn_b = qb.qpn();
    let mut write = |i: u8| {
        b.fill(0, &[i; 16]);
        let sge = [b.mr.sge(0, 16).unwrap()];
        // From before the post: a's thread may receive the WRITE (and start
        // the hold) before this thread runs again after the send.
        let t = Instant::now();
        qb.post_send(&[
            SendWr::rdma_write(u64::from(i), &sge, a.mr.addr() + 100, a.mr.rkey()).signaled(),
        ])
        .unwrap();
        let wc = wait(&b.cq, 1, &[]);
        assert_eq!(wc[0].status, WcStatus::Success, "{wc:?}");
        assert_eq!(a.bytes(100, 16), [i; 16]);
        t.elapsed()
    };
    let first = write(1);
    let mut rest: Vec<Duration> = (2..=20).map(&mut write).collect();
    rest.sort_unstable();
    let sa = a.dev.stats().device;
    println!("first {first:?}, 19 more: {rest:?}\na: {sa:?}");
    assert!(first >= hold, "{first:?}");
    // Later ACKs leave at once: not deferred, and a typical WRITE completes
    // well within a hold (the median: a loaded machine delays some writes,
    // held ACKs would delay every one by the hold).
    assert_eq!(sa.acks_deferred, 1, "later ACKs were deferred: {sa:?}");
    assert!(
        rest[rest.len() / 2] < hold,
        "later ACKs were held: {rest:?}"
    );
    assert_eq!(sa.acks_held_out, 1, "{sa:?}");
    let q = *b.dev.stats().qp(qpn_b).unwrap();
    assert_eq!(q.retransmits, 0, "{q:?}");
    // a posts (an 8-byte WRITE into b): it answers now, so the ACK of b's
    // next WRITE is held again (and leaves after the hold: a posts no more).
    a.fill(0, &[0xaa; 8]);
    let sge = [a.mr.sge(0, 8).unwrap()];
    qa.post_send(&[SendWr::rdma_write(99, &sge, b.mr.addr() + 512, b.mr.rkey()).signaled()])
        .unwrap();
    let deferred = a.dev.stats().device.acks_deferred;
    let again = write(21);
    let sa = a.dev.stats().device;
    assert!(again >= hold, "{again:?}");
    assert_eq!(sa.acks_held_out, 2, "{sa:?}");
    assert!(sa.acks_deferred > deferred, "{sa:?}");
    assert_eq!(b.bytes(512, 8), [0xaa; 8]);
}

/// The application polls (handing the sockets to itself), then stops
/// calling: the thread takes the sockets back and a peer's WRITE still
/// lands, and is acknowledged.
#[test]
fn polls_that_stop_hand_the_sockets_back() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let (a, b, _qa, mut qb) = with_caller_peer(Duration::from_micros(50));
    let mut wcs = [WorkCompletion::default(); 4];
    for _ in 0..100 {
        assert_eq!(a.cq.poll(&mut wcs).unwrap(), 0);
    }
    // a never calls again.
    std::thread::sleep(Duration::from_millis(5));
    b.fill(0, b"handed back!");
    let sge = [b.mr.sge(0, 12).unwrap()];
    qb.post_send(&[SendWr::rdma_write(7, &sge, a.mr.addr() + 200, a.mr.rkey()).signaled()])
        .unwrap();
    let wc = wait(&b.cq, 1, &[]);
    assert_eq!(wc[0].status, WcStatus::Success, "{wc:?}");
    assert_eq!(a.bytes(200, 12), b"handed back!");
    let sa = a.dev.stats().device;
    assert!(sa.thread_datagrams >= 1, "{sa:?}");
}

/// Polls, then a sleep on the CQ's event fd (as `ibv_get_cq_event` users
/// do): arming the CQ hands the sockets back, so the SEND wakes it.
#[test]
fn arming_a_cq_after_polls_hands_the_sockets_back() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let (a, b, mut qa, mut qb) = with_caller_peer(Duration::from_micros(50));
    let rsge = [a.mr.sge(300, 64).unwrap()];
    qa.post_recv(&[RecvWr::new(9, &rsge)]).unwrap();
    let mut wcs = [WorkCompletion::default(); 4];
    for _ in 0..100 {
        assert_eq!(a.cq.poll(&mut wcs).unwrap(), 0);
    }
    a.cq.req_notify(false).unwrap();
    let fd = a.cq.event_fd().unwrap();
    b.fill(0, b"wake up");
    let sge = [b.mr.sge(0, 7).unwrap()];
    qb.post_send(&[SendWr::send(3, &sge).signaled()]).unwrap();
    let t = Instant::now();
    // SAFETY: the CQ, and so its event fd, outlives this borrow.
    let bfd = unsafe { BorrowedFd::borrow_raw(fd) };
    let mut fds = [PollFd::new(bfd, PollFlags::POLLIN)];
    let ready = poll(&mut fds, PollTimeout::from(5000u16)).unwrap();
    assert_eq!(ready, 1, "no CQ event within 5 s");
    println!("event after {:?}", t.elapsed());
    let wc = wait(&a.cq, 1, &[]);
    assert_eq!(
        (wc[0].wr_id, wc[0].opcode, wc[0].byte_len),
        (9, WcOpcode::Recv, 7),
        "{wc:?}"
    );
    assert_eq!(a.bytes(300, 7), b"wake up");
    let wc = wait(&b.cq, 1, &[]);
    assert_eq!(wc[0].status, WcStatus::Success, "{wc:?}");
}
