//! A READ retried from the middle, against kernel rxe's way of answering it.
//!
//! Found in the interop-rw VM scenario: rnic READ 20000 bytes from kernel rxe;
//! the kernel's READ RESPONSE FIRST arrived, the rest was late (a starved
//! guest), rnic timed out and asked again from the first missing PSN (a new
//! READ request, VA and length advanced). Kernel rxe (6.1, `duplicate_request`
//! in rxe_resp.c) treats that request as a replay of the original one and
//! answers from that PSN with READ RESPONSE MIDDLE … LAST — not FIRST. rnic's
//! completer required a FIRST after every retry, dropped each replay, asked
//! again, forever (1197 READ requests until the scenario's timeout).

use rnic_core::{Mtu, Rkey, SendFlags, SendOp, SendWr, WcStatus};

use super::*;
use crate::transport::pkt::{op, syndrome};
use crate::transport::sim::Endpoint;
use crate::transport::{Instant, QpStats};

const MTU: usize = 1024;
const LOCAL_VA: u64 = 0x1_0000;
const REMOTE_VA: u64 = 0x8_0000;
const SQ_PSN: u32 = 7;

/// A READ response packet from B (QPN_B) to A (QPN_A), AETH "ACK".
fn resp(opcode: u8, psn: u32, payload: &[u8]) -> Vec<u8> {
    response(opcode, psn, syndrome::ACK_UNLIMITED, payload)
}

#[test]
fn read_retried_mid_message_accepts_a_middle_first_replay() {
    let mut cfg = QpConfig::rc(Qpn::from_wire(QPN_A), PD);
    cfg.local_gid = gid(1);
    let mut ep = Endpoint::new(Qp::new(cfg).expect("RC QP"), gid(1));
    let c = Conn {
        mtu: Mtu::Mtu1024,
        timeout: 8,
        ..Conn::default()
    };
    connect(&mut ep, QPN_B, gid(2), SQ_PSN, 1000, &c);
    let key = ep
        .mem
        .register(PD, LOCAL_VA, 4 * MTU, AccessFlags::LOCAL_WRITE);
    let sgl = [sge(key, LOCAL_VA, 4 * MTU as u32)];
    let wr = SendWr {
        ud: None,
        wr_id: 5,
        sg_list: &sgl,
        op: SendOp::RdmaRead {
            remote_addr: REMOTE_VA,
            rkey: Rkey(0x1234),
        },
        flags: SendFlags::SIGNALED,
    };
    let mut now = Instant::from_nanos(0);
    ep.with(|qp, io| {
        qp.post_send(&wr, io).expect("post");
        qp.run(now, io);
    });
    assert_eq!(
        requests(&mut ep),
        vec![(op::READ_REQUEST, SQ_PSN, REMOTE_VA, 4 * MTU as u32)]
    );
    let mut data = vec![0u8; 4 * MTU];
    fill(&mut data, 9);
    // FIRST arrives; the rest is late.
    let first = resp(op::READ_RESP_FIRST, SQ_PSN, &data[..MTU]);
    ep.with(|qp, io| qp.receive(now, &first, gid(2), io));
    // The local ACK timer fires: A asks again from the first missing PSN.
    now = ep.qp.next_deadline().expect("timer armed");
    ep.with(|qp, io| qp.on_timer(now, io));
    assert_eq!(
        requests(&mut ep),
        vec![(
            op::READ_REQUEST,
            SQ_PSN + 1,
            REMOTE_VA + MTU as u64,
            3 * MTU as u32
        )]
    );
    // Kernel rxe replays from that PSN as the continuation: MIDDLE, MIDDLE, LAST.
    for (i, opcode) in [
        op::READ_RESP_MIDDLE,
        op::READ_RESP_MIDDLE,
        op::READ_RESP_LAST,
    ]
    .into_iter()
    .enumerate()
    {
        let k = i + 1;
        let p = resp(opcode, SQ_PSN + k as u32, &data[k * MTU..(k + 1) * MTU]);
        ep.with(|qp, io| qp.receive(now, &p, gid(2), io));
    }
    let s: QpStats = *ep.qp.stats();
    assert_eq!(s.drops.bad_response, 0, "{s:?}");
    assert_eq!(ep.cq.send.len(), 1, "the READ completes");
    assert_eq!(ep.cq.send[0].status, WcStatus::Success);
    assert_eq!(ep.cq.send[0].wr_id, 5);
    assert!(
        ep.mem.bytes(key) == &data[..],
        "every byte of the READ landed"
    );
    assert!(requests(&mut ep).is_empty(), "no further request");
}

/// A responder that restarts with FIRST at the retried PSN (rnic's own
/// responder answers a new request that way) is accepted too.
#[test]
fn read_retried_mid_message_accepts_a_first_replay() {
    let mut cfg = QpConfig::rc(Qpn::from_wire(QPN_A), PD);
    cfg.local_gid = gid(1);
    let mut ep = Endpoint::new(Qp::new(cfg).expect("RC QP"), gid(1));
    let c = Conn {
        mtu: Mtu::Mtu1024,
        timeout: 8,
        ..Conn::default()
    };
    connect(&mut ep, QPN_B, gid(2), SQ_PSN, 1000, &c);
    let key = ep
        .mem
        .register(PD, LOCAL_VA, 3 * MTU, AccessFlags::LOCAL_WRITE);
    let sgl = [sge(key, LOCAL_VA, 3 * MTU as u32)];
    let wr = SendWr {
        ud: None,
        wr_id: 6,
        sg_list: &sgl,
        op: SendOp::RdmaRead {
            remote_addr: REMOTE_VA,
            rkey: Rkey(0x1234),
        },
        flags: SendFlags::SIGNALED,
    };
    let mut now = Instant::from_nanos(0);
    ep.with(|qp, io| {
        qp.post_send(&wr, io).expect("post");
        qp.run(now, io);
    });
    let _ = requests(&mut ep);
    let mut data = vec![0u8; 3 * MTU];
    fill(&mut data, 4);
    let first = resp(op::READ_RESP_FIRST, SQ_PSN, &data[..MTU]);
    ep.with(|qp, io| qp.receive(now, &first, gid(2), io));
    now = ep.qp.next_deadline().expect("timer armed");
    ep.with(|qp, io| qp.on_timer(now, io));
    let _ = requests(&mut ep);
    let a = resp(op::READ_RESP_FIRST, SQ_PSN + 1, &data[MTU..2 * MTU]);
    let b = resp(op::READ_RESP_LAST, SQ_PSN + 2, &data[2 * MTU..]);
    ep.with(|qp, io| qp.receive(now, &a, gid(2), io));
    ep.with(|qp, io| qp.receive(now, &b, gid(2), io));
    assert_eq!(ep.cq.send.len(), 1);
    assert_eq!(ep.cq.send[0].status, WcStatus::Success);
    assert!(ep.mem.bytes(key) == &data[..]);
}
