//! Threads posting to and polling their own QPs and CQs on one pair of
//! devices at the same time (the driver takes no device-wide lock on that
//! path: each QP and CQ has its own), with memory registered and
//! deregistered alongside, in both progress modes. Every WRITE lands
//! byte-exact, every SEND arrives in order with its payload, every
//! completion succeeds, and the devices' counters stay consistent.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::*;
use rnic_core::{
    AccessFlags, HeapMemory, Mtu, QpType, QueuePair, RecvWr, SendWr, WcOpcode, WcStatus,
    WorkCompletion,
};
use rnic_rxe::{Progress, RxeDevice};

/// Lanes (threads), each with its own PD, CQs, MRs and RC pair.
const LANES: usize = 4;
/// Messages per lane.
const ITERS: u32 = 150;
/// WRITE length: three packets at MTU 1024.
const LEN: usize = 2_500;

/// Poll `s`'s CQ until one completion arrives (20 s at most), running
/// `peer`'s progress too (caller-driven, its deferred ACKs wait for a call).
fn one(s: &Side, peer: &Side) -> WorkCompletion {
    let mut wcs = [WorkCompletion::default(); 1];
    let t = Instant::now();
    loop {
        if s.cq.poll(&mut wcs).unwrap() == 1 {
            return wcs[0];
        }
        peer.dev.progress();
        assert!(t.elapsed() < Duration::from_secs(20), "no completion");
    }
}

/// One lane: `ITERS` times a WRITE of a fresh pattern and a SEND of the
/// iteration number; the receiver checks both before the next.
fn lane(i: usize, a: &Side, qa: &mut QueuePair, b: &Side, qb: &mut QueuePair) {
    for it in 0..ITERS {
        let data = pattern(LEN, (i as u32) << 16 | it);
        a.fill(0, &data);
        a.fill(LEN, &it.to_le_bytes());
        let rsge = [b.mr.sge(LEN, 4).unwrap()];
        qb.post_recv(&[RecvWr::new(u64::from(it), &rsge)]).unwrap();
        let src = [a.mr.sge(0, LEN as u32).unwrap()];
        let msg = [a.mr.sge(LEN, 4).unwrap()];
        qa.post_send(&[
            SendWr::rdma_write(1, &src, b.mr.addr(), b.mr.rkey()),
            SendWr::send(u64::from(it), &msg).signaled(),
        ])
        .unwrap();
        let wr = one(b, a);
        assert_eq!(wr.status, WcStatus::Success, "lane {i} it {it}: {wr:?}");
        assert_eq!(wr.opcode, WcOpcode::Recv);
        assert_eq!(wr.wr_id, u64::from(it));
        assert_eq!(b.bytes(LEN, 4), it.to_le_bytes(), "lane {i} it {it}");
        assert!(b.bytes(0, LEN) == data, "lane {i} it {it}: WRITE mismatch");
        let ws = one(a, b);
        assert_eq!(ws.status, WcStatus::Success, "lane {i} it {it}: {ws:?}");
        assert_eq!(ws.wr_id, u64::from(it));
        // The unsignaled WRITE is retired by the SEND's completion.
        assert_eq!(qa.outstanding_sends(), 0);
    }
}

fn lanes_at_once(progress: Progress) {
    let (ia, ib) = ip_pair();
    let (da, db) = (open(ia, progress), open(ib, progress));
    let mut pairs: Vec<_> = (0..LANES)
        .map(|_| {
            let a = Side::new(da.clone(), 2 * LEN, 64);
            let b = Side::new(db.clone(), 2 * LEN, 64);
            let (mut qa, mut qb) = (a.qp(QpType::Rc), b.qp(QpType::Rc));
            connect(&a, &mut qa, &b, &mut qb, Mtu::Mtu1024);
            (a, qa, b, qb)
        })
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    // Registration churn on both devices while the lanes run: the key
    // table's writers alongside every engine call's readers.
    let churn = {
        let stop = Arc::clone(&stop);
        let (ca, cb) = (da.context(), db.context());
        std::thread::spawn(move || {
            let (pa, pb) = (ca.alloc_pd().unwrap(), cb.alloc_pd().unwrap());
            let mut n = 0u32;
            while !stop.load(Ordering::Relaxed) {
                for pd in [&pa, &pb] {
                    let mem = Arc::new(HeapMemory::new(4096));
                    let mr = pd.reg_mr(mem, AccessFlags::REMOTE_WRITE | AccessFlags::LOCAL_WRITE);
                    assert!(mr.is_ok(), "{mr:?}");
                    n += 1;
                }
                std::thread::yield_now();
            }
            n
        })
    };
    std::thread::scope(|s| {
        for (i, (a, qa, b, qb)) in pairs.iter_mut().enumerate() {
            s.spawn(move || lane(i, a, qa, b, qb));
        }
    });
    stop.store(true, Ordering::Relaxed);
    assert!(churn.join().unwrap() > 0);
    for d in [&da, &db] {
        let st: rnic_rxe::RxeStats = RxeDevice::stats(d);
        let s = st.device;
        assert_eq!(st.qps.len(), LANES, "{st}");
        assert_eq!(s.unknown_qpn, 0, "{st}");
        assert_eq!(s.icrc_drops, 0, "{st}");
        assert_eq!(s.icrc_ok, s.rx_packets, "{st}");
        assert_eq!(s.cq_overflows, 0, "{st}");
        assert_eq!(s.tx_errors, 0, "{st}");
        for (_, q) in &st.qps {
            assert_eq!(q.drops.total(), 0, "{st}");
        }
    }
    // a's QPs sent every request packet, b's received them: 3 WRITE packets
    // and one SEND per iteration and lane, plus retransmits if any.
    let (sa, sb) = (da.stats(), db.stats());
    let sent: u64 = sa.qps.iter().map(|(_, q)| q.tx_packets).sum();
    let got: u64 = sb.qps.iter().map(|(_, q)| q.rx_packets).sum();
    let retx: u64 = sa.qps.iter().map(|(_, q)| q.retransmits).sum();
    assert!(sent >= u64::from(ITERS) * 4 * LANES as u64, "{sa}");
    assert!(got + retx >= sent && got <= sent, "{sa}\n{sb}");
    drop(pairs);
    // Destroyed QPs leave the table; their transmit counters stay counted.
    let after = da.stats();
    assert!(after.qps.is_empty());
    assert!(after.device.tx_packets >= sa.device.tx_packets);
}

#[test]
fn lanes_post_and_poll_side_by_side_with_a_progress_thread() {
    lanes_at_once(Progress::Thread);
}

#[test]
fn lanes_post_and_poll_side_by_side_caller_driven() {
    lanes_at_once(Progress::Caller);
}
