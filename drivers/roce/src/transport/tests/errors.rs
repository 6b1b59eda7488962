//! Requester-side errors and limits: retry and RNR exhaustion, remote NAKs,
//! local protection errors, flushes, posting to an ERR QP, and the flow
//! limits (128-PSN window, AckReq every 64 packets, max_rd_atomic, fence,
//! sink back-pressure).

use rnic_core::{Mtu, Psn, Rkey, SendFlags, SendOp, WcOpcode, WcStatus, WorkCompletion};

use super::*;
use crate::transport::pkt;
use crate::transport::sim::{Faults, Sim};

fn keys(sim: &mut Sim) -> (u32, u32) {
    let a = sim.ep[0]
        .mem
        .register(PD, 0x1000_0000, 2 << 20, AccessFlags::ALL_REMOTE);
    let b = sim.ep[1]
        .mem
        .register(PD, 0x1000_0000, 2 << 20, AccessFlags::ALL_REMOTE);
    (a, b)
}

fn write(id: u64, key: u32, rkey: u32, len: u32) -> (u64, Sge, SendOp) {
    (
        id,
        sge(key, 0x1000_0000, len),
        SendOp::RdmaWrite {
            remote_addr: 0x1000_0000,
            rkey: Rkey(rkey),
        },
    )
}

fn post(sim: &mut Sim, side: usize, id: u64, sg: Sge, op: SendOp, flags: SendFlags) {
    let sgl = [sg];
    let wr = SendWr {
        ud: None,
        wr_id: id,
        sg_list: &sgl,
        op,
        flags,
    };
    post_send(sim, side, &wr);
}

fn statuses(wcs: &[WorkCompletion]) -> Vec<(u64, WcStatus)> {
    wcs.iter().map(|w| (w.wr_id, w.status)).collect()
}

/// The peer vanishes: every packet is lost. The head WQE fails with
/// RETRY_EXC_ERR after `retry_cnt` retries, the rest flush, the QP is in
/// ERR, nothing hangs, and later posts flush at once.
#[test]
fn peer_vanishes_retry_exhausted() {
    for (retry_cnt, seven_infinite) in [(0u8, true), (3, true), (7, false)] {
        let c = Conn {
            retry_cnt,
            timeout: 4,
            ..Conn::default()
        };
        let mut sim = rc_pair(&c, 9);
        sim.ep[0].qp.cfg.retry_cnt_7_infinite = seven_infinite;
        sim.faults[0] = Faults {
            loss: 1.0,
            ..Faults::default()
        };
        let (ka, kb) = keys(&mut sim);
        let s = SendFlags::SIGNALED;
        let (id, sg, op) = write(1, ka, kb, 5000);
        post(&mut sim, 0, id, sg, op, s);
        let (id, sg, op) = write(2, ka, kb, 10);
        post(&mut sim, 0, id, sg, op, SendFlags::empty());
        post(
            &mut sim,
            0,
            3,
            sge(ka, 0x1000_0000, 64),
            SendOp::RdmaRead {
                remote_addr: 0x1000_0000,
                rkey: Rkey(kb),
            },
            s,
        );
        sim.run(1_000_000);
        assert!(sim.next_event().is_none(), "hung");
        assert_eq!(
            statuses(&sim.ep[0].cq.send),
            vec![
                (1, WcStatus::RetryExcErr),
                (2, WcStatus::WrFlushErr),
                (3, WcStatus::WrFlushErr)
            ]
        );
        assert_eq!(sim.ep[0].qp.state(), QpState::Err);
        let st = sim.ep[0].qp.stats();
        assert_eq!(st.timeouts, u64::from(retry_cnt) + 1);
        assert_eq!(st.retries, u64::from(retry_cnt));
        // 4.096 µs · 2^4 per attempt.
        let per = 4096 * 16;
        assert!(sim.now >= per * (u64::from(retry_cnt) + 1));
        // Posting to an ERR QP flushes at once, send and receive.
        let (id, sg, op) = write(4, ka, kb, 10);
        post(&mut sim, 0, id, sg, op, SendFlags::empty());
        post_recv(
            &mut sim,
            0,
            &RecvWr {
                wr_id: 5,
                sg_list: &[],
            },
        );
        assert_eq!(
            sim.ep[0].cq.send.last().map(|w| (w.wr_id, w.status)),
            Some((4, WcStatus::WrFlushErr))
        );
        assert_eq!(
            statuses(&sim.ep[0].cq.recv),
            vec![(5, WcStatus::WrFlushErr)]
        );
    }
}

/// The receiver never posts a receive: with rnr_retry = 2 the SEND fails
/// with RNR_RETRY_EXC_ERR after three RNR NAKs; the WQEs behind it flush.
#[test]
fn rnr_retry_exhausted() {
    let c = Conn {
        rnr_retry: 2,
        min_rnr_timer: 3,
        ..Conn::default()
    };
    let mut sim = rc_pair(&c, 2);
    let (ka, kb) = keys(&mut sim);
    let s = SendFlags::SIGNALED;
    let (id, sg, op) = write(1, ka, kb, 100);
    post(&mut sim, 0, id, sg, op, s);
    post(&mut sim, 0, 2, sge(ka, 0x1000_0000, 3000), SendOp::Send, s);
    let (id, sg, op) = write(3, ka, kb, 100);
    post(&mut sim, 0, id, sg, op, s);
    sim.run(100_000);
    assert!(sim.next_event().is_none(), "hung");
    assert_eq!(
        statuses(&sim.ep[0].cq.send),
        vec![
            (1, WcStatus::Success),
            (2, WcStatus::RnrRetryExcErr),
            (3, WcStatus::WrFlushErr)
        ]
    );
    let st = sim.ep[0].qp.stats();
    assert_eq!(st.naks_received.rnr, 3);
    assert_eq!(st.rnr_waits, 2);
    assert_eq!(sim.ep[1].qp.stats().naks_sent.rnr, 3);
    // Two waits of 30 µs (timer code 3).
    assert!(sim.now >= 60_000);
    assert_eq!(sim.ep[1].qp.state(), QpState::Rts);
}

/// RNR with infinite retries succeeds once a receive shows up.
#[test]
fn rnr_infinite_then_delivered() {
    let mut sim = rc_pair(&Conn::default(), 3);
    let (ka, kb) = keys(&mut sim);
    post(
        &mut sim,
        0,
        1,
        sge(ka, 0x1000_0000, 100),
        SendOp::Send,
        SendFlags::SIGNALED,
    );
    sim.run(200);
    assert!(sim.ep[0].cq.send.is_empty());
    assert!(sim.ep[0].qp.stats().rnr_waits > 3);
    let rsg = [sge(kb, 0x1000_0000, 100)];
    post_recv(
        &mut sim,
        1,
        &RecvWr {
            wr_id: 9,
            sg_list: &rsg,
        },
    );
    sim.run(10_000);
    assert_eq!(statuses(&sim.ep[0].cq.send), vec![(1, WcStatus::Success)]);
    assert_eq!(statuses(&sim.ep[1].cq.recv), vec![(9, WcStatus::Success)]);
}

/// NAKs from the responder map to REM_* completions and flush the rest.
#[test]
fn remote_naks_complete_with_remote_errors() {
    // (setup, expected status)
    for case in 0..3 {
        let mut c = Conn::default();
        if case == 1 {
            c.access = AccessFlags::REMOTE_WRITE;
        }
        let mut sim = rc_pair(&c, 4);
        let (ka, kb) = keys(&mut sim);
        let s = SendFlags::SIGNALED;
        let expect = match case {
            0 => {
                let (id, sg, op) = write(1, ka, kb ^ 0x100, 100);
                post(&mut sim, 0, id, sg, op, s);
                WcStatus::RemAccessErr
            }
            1 => {
                post(
                    &mut sim,
                    0,
                    1,
                    sge(ka, 0x1000_0000, 8),
                    SendOp::RdmaRead {
                        remote_addr: 0x1000_0000,
                        rkey: Rkey(kb),
                    },
                    s,
                );
                WcStatus::RemInvReqErr
            }
            _ => {
                let rsg = [sge(kb ^ 0x300, 0x1000_0000, 100)];
                post_recv(
                    &mut sim,
                    1,
                    &RecvWr {
                        wr_id: 9,
                        sg_list: &rsg,
                    },
                );
                post(&mut sim, 0, 1, sge(ka, 0x1000_0000, 10), SendOp::Send, s);
                WcStatus::RemOpErr
            }
        };
        let (id, sg, op) = write(2, ka, kb, 10);
        post(&mut sim, 0, id, sg, op, s);
        sim.run(10_000);
        assert!(sim.next_event().is_none());
        assert_eq!(
            statuses(&sim.ep[0].cq.send),
            vec![(1, expect), (2, WcStatus::WrFlushErr)],
            "case {case}"
        );
        assert_eq!(sim.ep[0].qp.state(), QpState::Err);
        assert_eq!(sim.ep[1].qp.state(), QpState::Err);
        assert_eq!(sim.ep[0].qp.stats().naks_received.total(), 1);
    }
}

/// A bad L_Key fails the WQE with LOC_PROT_ERR in order: earlier work
/// completes, later work flushes. Too short an atomic buffer is LOC_LEN_ERR.
#[test]
fn local_errors_in_order() {
    for (bad, status) in [(0, WcStatus::LocProtErr), (1, WcStatus::LocLenErr)] {
        let mut sim = rc_pair(&Conn::default(), 5);
        let (ka, kb) = keys(&mut sim);
        let s = SendFlags::SIGNALED;
        let (id, sg, op) = write(1, ka, kb, 3000);
        post(&mut sim, 0, id, sg, op, s);
        if bad == 0 {
            let (id, sg, op) = write(2, ka ^ 0x200, kb, 10);
            post(&mut sim, 0, id, sg, op, SendFlags::empty());
        } else {
            post(
                &mut sim,
                0,
                2,
                sge(ka, 0x1000_0000, 4),
                SendOp::AtomicFetchAdd {
                    remote_addr: 0x1000_0000,
                    rkey: Rkey(kb),
                    add: 1,
                },
                SendFlags::empty(),
            );
        }
        let (id, sg, op) = write(3, ka, kb, 10);
        post(&mut sim, 0, id, sg, op, s);
        sim.run(10_000);
        assert_eq!(
            statuses(&sim.ep[0].cq.send),
            vec![
                (1, WcStatus::Success),
                (2, status),
                (3, WcStatus::WrFlushErr)
            ]
        );
        assert_eq!(
            sim.ep[0].cq.send[1].opcode,
            if bad == 0 {
                WcOpcode::RdmaWrite
            } else {
                WcOpcode::FetchAdd
            }
        );
    }
}

/// Unsignaled successes produce no completion; signaled ones do, in order.
#[test]
fn unsignaled_work_is_silent() {
    let mut sim = rc_pair(&Conn::default(), 6);
    let (ka, kb) = keys(&mut sim);
    for id in 0..6 {
        let f = if id % 3 == 2 {
            SendFlags::SIGNALED
        } else {
            SendFlags::empty()
        };
        let (id, sg, op) = write(id, ka, kb, 100);
        post(&mut sim, 0, id, sg, op, f);
    }
    sim.run(10_000);
    assert_eq!(
        statuses(&sim.ep[0].cq.send),
        vec![(2, WcStatus::Success), (5, WcStatus::Success)]
    );
    assert_eq!(sim.ep[0].qp.send_outstanding(), 0);
}

/// Emitted, not yet delivered request packets of A.
fn a_packets(sim: &Sim) -> Vec<(u8, bool, u32)> {
    sim.ep[0]
        .tx
        .out
        .iter()
        .map(|(b, _)| {
            let p = pkt::parse(b).expect("valid");
            (p.opcode, p.ack_req, p.psn.get())
        })
        .collect()
}

/// At most 128 PSNs unacknowledged; AckReq on every 64th packet and the last.
#[test]
fn window_and_ack_request_spacing() {
    let c = Conn {
        mtu: Mtu::Mtu256,
        psn_a: 0xff_ffc0,
        ..Conn::default()
    };
    let mut sim = rc_pair(&c, 7);
    let (ka, kb) = keys(&mut sim);
    post_mib_write(&mut sim, ka, kb, 1);
    let now = sim.instant();
    sim.ep[0].with(|qp, io| qp.run(now, io));
    let pkts = a_packets(&sim);
    assert_eq!(pkts.len(), 128);
    let acks: Vec<usize> = pkts
        .iter()
        .enumerate()
        .filter(|(_, p)| p.1)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(acks, vec![63, 127]);
    assert_eq!(pkts[0].2, 0xff_ffc0);
    assert_eq!(pkts[64].2, 0);
    sim.drain(0);
    sim.run(1_000_000);
    assert_eq!(statuses(&sim.ep[0].cq.send), vec![(1, WcStatus::Success)]);
    let st = sim.ep[0].qp.stats();
    assert_eq!(st.tx_packets, 4096);
    assert_eq!(sim.ep[1].qp.stats().acks_sent, 4096 / 64);
}

/// A QP configured with a larger window (rnic to rnic) keeps that many
/// PSNs in flight, still asks for an ACK every 64 packets, and completes.
#[test]
fn configured_window_is_honoured() {
    let c = Conn {
        mtu: Mtu::Mtu256,
        ..Conn::default()
    };
    let mut sim = rc_pair(&c, 7);
    sim.ep[0].qp.cfg.max_unacked_psns = 1000;
    let (ka, kb) = keys(&mut sim);
    post_mib_write(&mut sim, ka, kb, 1);
    let now = sim.instant();
    sim.ep[0].with(|qp, io| qp.run(now, io));
    let pkts = a_packets(&sim);
    assert_eq!(pkts.len(), 1000);
    assert_eq!(pkts.iter().filter(|p| p.1).count(), 1000 / 64);
    sim.drain(0);
    sim.run(1_000_000);
    assert_eq!(statuses(&sim.ep[0].cq.send), vec![(1, WcStatus::Success)]);
    assert_eq!(sim.ep[0].qp.stats().tx_packets, 4096);
}

/// Post one 1 MiB WRITE (4096 packets at MTU 256) from A to B.
fn post_mib_write(sim: &mut Sim, ka: u32, kb: u32, id: u64) {
    let sgl = [sge(ka, 0x1000_0000, 1 << 20)];
    let wr = SendWr {
        ud: None,
        wr_id: id,
        sg_list: &sgl,
        op: SendOp::RdmaWrite {
            remote_addr: 0x1000_0000,
            rkey: Rkey(kb),
        },
        flags: SendFlags::SIGNALED,
    };
    assert!(sim.ep[0].with(|qp, io| qp.post_send(&wr, io)).is_ok());
}

/// The wire loses A's first queued packet and delivers the rest: B NAKs
/// the second one; returns once A has that NAK.
fn lose_the_first_packet(sim: &mut Sim) {
    let lost = sim.ep[0].tx.out.remove(0);
    sim.ep[0].tx.recycle(lost.0);
    sim.drain(0);
    while sim.ep[0].qp.stats().naks_received.psn_seq == 0 {
        assert!(sim.step(), "the NAK never came");
    }
}

/// A lost packet halves a large window (the NAK for the sequence error
/// starts a retry that sends at most half the window), the window never
/// falls below rxe's 128, and acknowledged progress gives it back.
#[test]
fn a_loss_halves_a_large_window_and_progress_regrows_it() {
    let c = Conn {
        mtu: Mtu::Mtu256,
        ..Conn::default()
    };
    let mut sim = rc_pair(&c, 7);
    sim.ep[0].qp.cfg.max_unacked_psns = 1024;
    let (ka, kb) = keys(&mut sim);
    let pattern: Vec<u8> = (0..1u32 << 20).map(|i| (i * 7 + i / 4099) as u8).collect();
    sim.ep[0].mem.bytes_mut(ka)[..1 << 20].copy_from_slice(&pattern);
    post_mib_write(&mut sim, ka, kb, 1);
    let now = sim.instant();
    sim.ep[0].with(|qp, io| qp.run(now, io));
    assert_eq!(a_packets(&sim).len(), 1024);
    assert_eq!(sim.ep[0].qp.window(), 1024);
    lose_the_first_packet(&mut sim);
    assert_eq!(sim.ep[0].qp.window(), 512);
    let st = sim.ep[0].qp.stats();
    assert_eq!(st.window_cuts, 1);
    assert_eq!(
        (st.tx_packets, st.retransmits),
        (1024 + 512, 512),
        "the retry resends half the window from the lost PSN"
    );
    sim.run(1_000_000);
    assert_eq!(statuses(&sim.ep[0].cq.send), vec![(1, WcStatus::Success)]);
    assert_eq!(&sim.ep[1].mem.bytes(kb)[..1 << 20], &pattern[..]);
    let regrown = sim.ep[0].qp.window();
    assert!(regrown > 512, "progress gave nothing back: {regrown}");
    post_mib_write(&mut sim, ka, kb, 2);
    sim.kick(0);
    sim.run(1_000_000);
    assert_eq!(sim.ep[0].qp.window(), 1024, "64 more ACKs restore it all");

    // rxe's own window is the floor: a loss leaves 128 at 128.
    let mut sim = rc_pair(&c, 8);
    let (ka, kb) = keys(&mut sim);
    post_mib_write(&mut sim, ka, kb, 1);
    let now = sim.instant();
    sim.ep[0].with(|qp, io| qp.run(now, io));
    lose_the_first_packet(&mut sim);
    assert_eq!(sim.ep[0].qp.window(), 128);
    assert_eq!(sim.ep[0].qp.stats().retransmits, 128);
    assert_eq!(sim.ep[0].qp.stats().window_cuts, 0, "nothing to cut");
}

/// max_rd_atomic bounds outstanding READ/atomics; a fence waits for all
/// earlier work.
#[test]
fn max_rd_atomic_and_fence() {
    let c = Conn {
        max_rd_atomic: 2,
        ..Conn::default()
    };
    let mut sim = rc_pair(&c, 8);
    let (ka, kb) = keys(&mut sim);
    let read = SendOp::RdmaRead {
        remote_addr: 0x1000_0000,
        rkey: Rkey(kb),
    };
    let now = sim.instant();
    for id in 0..3 {
        let sgl = [sge(ka, 0x1000_0000 + id * 64, 64)];
        let wr = SendWr {
            ud: None,
            wr_id: id,
            sg_list: &sgl,
            op: read,
            flags: SendFlags::SIGNALED,
        };
        assert!(sim.ep[0].with(|qp, io| qp.post_send(&wr, io)).is_ok());
    }
    let (_, sg, op) = write(3, ka, kb, 16);
    let sgl = [sg];
    let fenced = SendWr {
        ud: None,
        wr_id: 3,
        sg_list: &sgl,
        op,
        flags: SendFlags::SIGNALED.union(SendFlags::FENCE),
    };
    assert!(sim.ep[0].with(|qp, io| qp.post_send(&fenced, io)).is_ok());
    sim.ep[0].with(|qp, io| qp.run(now, io));
    let ops: Vec<u8> = a_packets(&sim).iter().map(|p| p.0).collect();
    assert_eq!(ops, vec![pkt::op::READ_REQUEST, pkt::op::READ_REQUEST]);
    sim.drain(0);
    sim.run(10_000);
    let done: Vec<_> = statuses(&sim.ep[0].cq.send);
    assert_eq!(
        done,
        (0..4).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>()
    );
}

/// A full sink makes the requester wait, not fail.
#[test]
fn sink_back_pressure() {
    let mut sim = rc_pair(&Conn::default(), 10);
    let (ka, kb) = keys(&mut sim);
    sim.ep[0].tx.full = true;
    let (id, sg, op) = write(1, ka, kb, 5000);
    post(&mut sim, 0, id, sg, op, SendFlags::SIGNALED);
    assert_eq!(sim.ep[0].qp.stats().tx_packets, 0);
    sim.ep[0].tx.full = false;
    sim.kick(0);
    sim.run(10_000);
    assert_eq!(statuses(&sim.ep[0].cq.send), vec![(1, WcStatus::Success)]);
    let _ = Psn::from_wire(0);
}
