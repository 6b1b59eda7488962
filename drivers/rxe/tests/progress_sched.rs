//! The progress thread's scheduling: asked for `SCHED_FIFO`, the thread
//! named `rnic-rxe` really runs under it (read back from /proc) and still
//! moves data; refused (a priority out of range, or no privilege), the
//! device says why and runs under the normal scheduler.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::time::Duration;

use rnic_core::{Mtu, QpType, RecvWr, SendWr, WcStatus};
use rnic_rxe::{Progress, ProgressScheduling, RxeConfig, RxeDevice, Target};

/// The scheduling policy (field 41 of /proc/self/task/TID/stat) of each of
/// this process's threads named `name`.
fn policies_of(name: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for t in std::fs::read_dir("/proc/self/task").unwrap() {
        let dir = t.unwrap().path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if comm.trim_end() != name {
            continue;
        }
        let stat = std::fs::read_to_string(dir.join("stat")).unwrap();
        // Fields after the parenthesised command name, which may hold spaces.
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        let policy = rest.split(' ').nth(41 - 3).unwrap().parse().unwrap();
        out.push(policy);
    }
    out
}

fn open_with(ip: std::net::IpAddr, priority: Option<u8>) -> RxeDevice {
    RxeDevice::open(
        &RxeConfig::new(Target::Ip(ip))
            .with_progress(Progress::Thread)
            .with_progress_rt_priority(priority),
    )
    .unwrap()
}

#[test]
fn fifo_progress_thread_runs_under_sched_fifo_and_moves_data() {
    let (ia, ib) = ip_pair();
    let before = policies_of("rnic-rxe").len();
    let a = Side::new(open_with(ia, Some(1)), 4096, 16);
    let b = Side::new(open_with(ib, Some(1)), 4096, 16);
    let want = if nix::unistd::geteuid().is_root() {
        ProgressScheduling::RealTime { priority: 1 }
    } else {
        // Without CAP_SYS_NICE this depends on RLIMIT_RTPRIO.
        match a.dev.progress_scheduling() {
            r @ ProgressScheduling::Refused { errno, .. } => {
                assert_eq!(errno, libc::EPERM);
                assert!(r.to_string().contains("RLIMIT_RTPRIO"), "{r}");
                r
            }
            r => r,
        }
    };
    assert_eq!(a.dev.progress_scheduling(), want);
    if want == (ProgressScheduling::RealTime { priority: 1 }) {
        let fifo = policies_of("rnic-rxe")
            .iter()
            .filter(|&&p| p == libc::SCHED_FIFO as u32)
            .count();
        assert!(
            fifo >= 2,
            "both progress threads under SCHED_FIFO: {fifo} of {before}+2"
        );
    }
    let (mut qa, mut qb) = (a.qp(QpType::Rc), b.qp(QpType::Rc));
    connect(&a, &mut qa, &b, &mut qb, Mtu::Mtu1024);
    a.fill(0, b"written by a fifo progress thread");
    let sge = [a.mr.sge(0, 33).unwrap()];
    qa.post_send(&[SendWr::rdma_write(1, &sge, b.mr.addr() + 100, b.mr.rkey()).signaled()])
        .unwrap();
    let wc = wait(&a.cq, 1, &[]);
    assert_eq!(wc[0].status, WcStatus::Success);
    assert_eq!(b.bytes(100, 33), b"written by a fifo progress thread");
}

#[test]
fn refused_priority_is_reported_and_the_thread_still_works() {
    // Priority 0 is not a SCHED_FIFO priority: EINVAL, for anyone.
    let (ia, ib) = ip_pair();
    let a = Side::new(open_with(ia, Some(0)), 4096, 16);
    let b = Side::new(open_with(ib, None), 4096, 16);
    let r = a.dev.progress_scheduling();
    assert_eq!(
        r,
        ProgressScheduling::Refused {
            priority: 0,
            errno: libc::EINVAL
        }
    );
    assert!(
        r.to_string()
            .starts_with("progress thread, normal scheduling"),
        "{r}"
    );
    assert_eq!(b.dev.progress_scheduling(), ProgressScheduling::Normal);
    let (mut qa, mut qb) = (a.qp(QpType::Rc), b.qp(QpType::Rc));
    connect(&a, &mut qa, &b, &mut qb, Mtu::Mtu1024);
    b.fill(0, b"read back");
    let sge = [a.mr.sge(0, 9).unwrap()];
    qa.post_send(&[SendWr::rdma_read(2, &sge, b.mr.addr(), b.mr.rkey()).signaled()])
        .unwrap();
    let wc = wait(&a.cq, 1, &[]);
    assert_eq!(wc[0].status, WcStatus::Success);
    assert_eq!(a.bytes(0, 9), b"read back");
}

#[test]
fn a_caller_driven_device_has_no_thread_to_schedule() {
    let (ia, _) = ip_pair();
    let c = RxeDevice::open(
        &RxeConfig::new(Target::Ip(ia))
            .with_progress(Progress::Caller)
            .with_progress_rt_priority(Some(1)),
    )
    .unwrap();
    assert_eq!(c.progress_scheduling(), ProgressScheduling::NoThread);
}

/// A retransmission deadline nearer than the sleeping progress thread's
/// planned wake-up (it sleeps up to 50 ms with nothing due) must wake it:
/// a WRITE to a QPN nobody has (its packets dropped as unknown) fails with
/// RETRY_EXC_ERR after its 1 + retry_cnt timeouts of ~4.2 ms (exponent 10),
/// not after waits rounded up to the thread's idle period.
///
/// Timed, so measured up to five times (a fresh QP each) and judged by the
/// fastest: load only adds to a run's time, while a thread that missed the
/// first deadline cannot finish before its idle wake-up, ~48 ms after the
/// post, in any run. One run alone failed 2 times in 30 on a loaded 2-core
/// machine (46 and 50 ms; at a load average of 9, three runs in a row took
/// 49-60 ms).
#[test]
fn a_sleeping_thread_keeps_short_retransmission_deadlines() {
    let (ia, ib) = ip_pair();
    let a = Side::new(open_with(ia, None), 4096, 16);
    let b = Side::new(open_with(ib, None), 4096, 16);
    let timeout = std::time::Duration::from_nanos(4096 << 10);
    // 4 timeouts of 4.2 ms (each rounded up to the thread's millisecond):
    // about 20 ms. A first deadline missed until the thread's idle wake-up
    // would take about 60 ms (a post that never rings: 43.7 ms even after
    // 20 ms of the thread's sleep had passed).
    let bound = std::time::Duration::from_millis(35);
    let mut took = Vec::new();
    for _ in 0..5 {
        let mut qa = a.qp(QpType::Rc);
        let init = rnic_core::InitParams {
            access: ALL,
            ..rnic_core::InitParams::default()
        };
        qa.to_init(&init).unwrap();
        let nobody = rnic_core::Qpn::new(0x00ab_cdef).unwrap();
        qa.to_rtr(
            nobody,
            rnic_core::Psn::from_wire(1),
            b.gid(),
            &rtr(Mtu::Mtu1024),
        )
        .unwrap();
        let rts = rnic_core::RtsParams {
            timeout: 10,
            retry_cnt: 3,
            ..rts()
        };
        qa.to_rts(rnic_core::Psn::from_wire(7), &rts).unwrap();
        // Let the thread fall asleep towards its idle wake-up first (50 ms from
        // its last round).
        std::thread::sleep(std::time::Duration::from_millis(2));
        let sge = [a.mr.sge(0, 8).unwrap()];
        let t = std::time::Instant::now();
        qa.post_send(&[SendWr::rdma_write(1, &sge, b.mr.addr(), b.mr.rkey()).signaled()])
            .unwrap();
        // No polling meanwhile (a poll's round would run the timers itself):
        // sleep on the CQ's event until the thread delivers the completion.
        a.cq.req_notify(false).unwrap();
        assert!(a.cq.wait(Some(std::time::Duration::from_secs(5))).unwrap());
        let run = t.elapsed();
        let wc = wait(&a.cq, 1, &[]);
        println!("RETRY_EXC_ERR after {run:?}: {wc:?}");
        assert_eq!(wc[0].status, WcStatus::RetryExcErr, "{wc:?}");
        assert!(run >= timeout * 4, "{run:?}");
        took.push(run);
        if run < bound {
            break;
        }
    }
    assert!(took.iter().any(|&t| t < bound), "{took:?}");
    assert!(b.dev.stats().device.unknown_qpn >= 4 * took.len() as u64);
}

/// A thread waiting on an armed CQ of a progress-thread device wakes for
/// the device's sockets too and receives what arrives itself when the
/// thread is not in a round (one wake-up per completion instead of the
/// thread's and then the waiter's): over a blocking ping of SENDs, each
/// sent while the receiver already waits, some datagrams are received
/// outside the progress thread — by the waits, since the poll before each
/// wait ran before its SEND left — and every message arrives intact.
#[test]
fn a_waiting_thread_receives_arrivals_itself() {
    const ROUNDS: usize = 60;
    let (a, b) = sides(4096, Progress::Thread);
    let (mut qa, mut qb) = (a.qp(QpType::Rc), b.qp(QpType::Rc));
    connect(&a, &mut qa, &b, &mut qb, Mtu::Mtu1024);
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| {
            let rsge = [b.mr.sge(0, 64).unwrap()];
            let mut wcs = vec![rnic_core::WorkCompletion::default(); 4];
            for i in 0..ROUNDS {
                qb.post_recv(&[RecvWr::new(i as u64, &rsge)]).unwrap();
                b.cq.req_notify(false).unwrap();
                assert_eq!(
                    b.cq.poll(&mut wcs).unwrap(),
                    0,
                    "round {i}: nothing sent yet"
                );
                ready_tx.send(()).unwrap();
                let got = loop {
                    assert!(
                        b.cq.wait(Some(Duration::from_secs(5))).unwrap(),
                        "round {i}: no event"
                    );
                    b.cq.req_notify(false).unwrap();
                    let n = b.cq.poll(&mut wcs).unwrap();
                    if n > 0 {
                        break n;
                    }
                };
                assert_eq!(got, 1);
                assert_eq!(
                    (wcs[0].wr_id, wcs[0].status, wcs[0].byte_len),
                    (i as u64, WcStatus::Success, 8)
                );
                assert_eq!(b.bytes(0, 8), [i as u8; 8]);
            }
        });
        for i in 0..ROUNDS {
            ready_rx.recv().unwrap();
            // Let the receiver get into its wait.
            std::thread::sleep(Duration::from_millis(2));
            a.fill(0, &[i as u8; 8]);
            let sge = [a.mr.sge(0, 8).unwrap()];
            qa.post_send(&[SendWr::send(i as u64, &sge).signaled()])
                .unwrap();
            let wc = wait(&a.cq, 1, &[]);
            assert_eq!(wc[0].status, WcStatus::Success);
        }
    });
    let d = b.dev.stats().device;
    assert_eq!(d.rx_datagrams, ROUNDS as u64, "{d:?}");
    assert!(
        d.thread_datagrams < d.rx_datagrams,
        "the waits received none of the {} datagrams themselves: {d:?}",
        d.rx_datagrams
    );
}
