//! A deterministic hostile peer against a live rnic-rxe device (issue 15).
//!
//! A fake requester on its own loopback address (bound to UDP/4791, so it
//! also receives the device's ACKs and NAKs) sends thousands of requests
//! built by `rnic_fuzz_harness::engine::hostile_request` from a seeded
//! stream: every RC request opcode and stray bytes, PSNs in and out of the
//! window, RETH/AtomicETH/IETH naming every region of the device and
//! random keys, near and across region edges, any length; plus bad ICRCs,
//! truncations and spoofed sources. The QP is brought back up whenever the
//! traffic drove it to ERR. Afterwards: no region without remote rights, of
//! another PD, or read-only changed by a single byte; no receive completed
//! more often than posted; every key still works; and an honest WRITE and
//! SEND land byte-exact.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use rnic_core::{
    AccessFlags, HeapMemory, InitParams, Memory, Mtu, Psn, QpState, QpType, Qpn, RecvWr, WcStatus,
};
use rnic_fuzz_harness::Input;
use rnic_fuzz_harness::engine::hostile_request;
use rnic_roce::wire::icrc;
use rnic_rxe::Progress;

/// The fake requester's QPN.
const PEER_QPN: u32 = 0x77;

/// A seeded xorshift byte stream (the program the hostile peer runs).
fn stream(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

fn region(
    b: &Side,
    len: usize,
    access: AccessFlags,
    pd: Option<&rnic_core::ProtectionDomain>,
) -> (Arc<HeapMemory>, rnic_core::MemoryRegion) {
    let mem = Arc::new(HeapMemory::new(len));
    let fill: Vec<u8> = (0..len).map(|i| (i % 253) as u8 ^ 0x5c).collect();
    mem.write(0, &fill).unwrap();
    let mr = pd.unwrap_or(&b.pd).reg_mr(mem.clone(), access).unwrap();
    (mem, mr)
}

fn contents(m: &HeapMemory) -> Vec<u8> {
    let mut v = vec![0; m.len()];
    m.read(0, &mut v).unwrap();
    v
}

/// (Re)connect `qb` to the fake peer with expected PSN `psn`.
fn bring_up(qb: &mut rnic_core::QueuePair, peer: IpAddr, psn: u32) {
    if qb.query().unwrap().qp_state != QpState::Reset {
        qb.reset().unwrap();
    }
    qb.to_init(&InitParams {
        access: ALL,
        ..InitParams::default()
    })
    .unwrap();
    let gid = rnic_core::Gid::from_ip(peer);
    qb.to_rtr(
        Qpn::from_wire(PEER_QPN),
        Psn::from_wire(psn),
        gid,
        &rtr(Mtu::Mtu1024),
    )
    .unwrap();
    qb.to_rts(Psn::from_wire(0x500), &rts()).unwrap();
}

/// After the traffic drove `qb` to ERR: every posted receive completes
/// (flushed) exactly once; then the QP comes back up at a new PSN.
fn recover(
    b: &Side,
    qb: &mut rnic_core::QueuePair,
    peer: IpAddr,
    psn: &mut u32,
    posted: u64,
    recv_done: &mut u64,
    round: usize,
) {
    let mut wcs = [rnic_core::WorkCompletion::default(); 64];
    let t = Instant::now();
    while *recv_done < posted && t.elapsed() < Duration::from_secs(5) {
        *recv_done += b.cq.poll(&mut wcs).unwrap() as u64;
    }
    assert_eq!(
        *recv_done, posted,
        "round {round}: every receive completes once"
    );
    *psn = (*psn + 0x1000) & 0xff_ffff;
    bring_up(qb, peer, *psn);
}

#[test]
fn hostile_requests_touch_nothing_they_may_not_and_honest_traffic_still_lands() {
    let (ib, ip) = ip_pair();
    let b = Side::new(open(ib, Progress::Thread), 1 << 16, 512);
    let other_pd = b.ctx.alloc_pd().unwrap();
    let lw = AccessFlags::LOCAL_WRITE;
    let (w, w_mr) = region(&b, 4096, lw | AccessFlags::REMOTE_WRITE, None);
    let (r, r_mr) = region(&b, 4096, AccessFlags::REMOTE_READ, None);
    let (a, a_mr) = region(&b, 64, lw | AccessFlags::REMOTE_ATOMIC, None);
    let (none, none_mr) = region(&b, 4096, lw, None);
    let (foreign, foreign_mr) = region(&b, 4096, ALL, Some(&other_pd));
    let frozen = [
        (&r, contents(&r)),
        (&none, contents(&none)),
        (&foreign, contents(&foreign)),
    ];
    let mrs = [&w_mr, &r_mr, &a_mr, &none_mr, &foreign_mr, &b.mr];
    let keys: Vec<u32> = mrs.iter().map(|m| m.rkey().get()).collect();
    let bases: Vec<u64> = mrs.iter().map(|m| m.addr()).collect();

    // The fake requester owns UDP/4791 on its address: it sees every response.
    let peer = UdpSocket::bind((ip, 4791)).unwrap();
    rnic_rxe::sys::set_pmtudisc_do(peer.as_fd(), false).unwrap();
    peer.set_nonblocking(true).unwrap();
    let me = peer.local_addr().unwrap();
    let target = SocketAddr::new(ib, 4791);
    let IpAddr::V4(spoof) = (match ib {
        IpAddr::V4(v) => IpAddr::V4(std::net::Ipv4Addr::from(u32::from(v) + 5)),
        v => v,
    }) else {
        unreachable!()
    };
    let spoofer = UdpSocket::bind((spoof, 0)).unwrap();

    let mut qb = b.qp(QpType::Rc);
    let mut psn = 0x1000;
    bring_up(&mut qb, ip, psn);
    let program = stream(0x15_15_15, 8 << 20);
    let mut inp = Input::new(&program);
    let (mut posted, mut recv_done, mut reconnects, mut sent) = (0u64, 0u64, 0u32, 0u32);
    let mut wcs = [rnic_core::WorkCompletion::default(); 64];
    let mut buf = [0u8; 9000];
    for round in 0..2000 {
        if sent >= 3000 {
            break;
        }
        // Receives for the SENDs (the ring holds 128).
        while qb.outstanding_recvs() < 32 {
            let sge = [b.mr.sge((posted as usize % 8) * 4096, 4096).unwrap()];
            if qb.post_recv(&[RecvWr::new(posted, &sge)]).is_err() {
                break;
            }
            posted += 1;
        }
        for _ in 0..25 {
            let (mut pkt, in_order) = hostile_request(&mut inp, qb.qpn().get(), psn, &keys, &bases);
            let IpAddr::V4(src) = me.ip() else {
                unreachable!()
            };
            let IpAddr::V4(dst) = ib else { unreachable!() };
            let class = inp.u8();
            let from_spoofer = class == 0xff;
            let s = if from_spoofer { spoof } else { src };
            let port = if from_spoofer {
                spoofer.local_addr().unwrap().port()
            } else {
                me.port()
            };
            if icrc::fill_v4(s, dst, 0, true, port, 4791, &mut pkt).is_err() {
                continue; // too short to carry an ICRC: send it as garbage below
            }
            match class {
                0xf0..=0xf7 => {
                    let n = pkt.len() / 2;
                    pkt.truncate(n);
                }
                0xf8..=0xfd => {
                    let i = usize::from(inp.u8()) % pkt.len();
                    pkt[i] ^= 0x10; // bad ICRC
                }
                _ => {}
            }
            let sock = if from_spoofer { &spoofer } else { &peer };
            let rx = b.dev.stats().device.rx_packets;
            sock.send_to(&pkt, target).unwrap();
            sent += 1;
            // Wait for the device to take it, then follow its answers: a
            // PSN-sequence NAK names the expected PSN, an ACK or READ
            // response the last PSN it executed.
            let t = Instant::now();
            while b.dev.stats().device.rx_packets == rx && t.elapsed() < Duration::from_millis(50) {
                std::thread::yield_now();
            }
            std::thread::sleep(Duration::from_micros(100));
            let mut refused = false;
            while let Ok((n, _)) = peer.recv_from(&mut buf) {
                let (op, at) = (buf[0], u32::from_be_bytes([0, buf[9], buf[10], buf[11]]));
                let syn = if n > 16 { buf[12] } else { 0 };
                match (op, syn >> 5) {
                    (0x11, 3) if syn == 0x60 => psn = at,
                    (0x11, 1 | 3) => refused = true,
                    (0x0d..=0x12, _) => psn = (at + 1) & 0xff_ffff,
                    _ => {}
                }
            }
            if in_order && class < 0xf0 && !from_spoofer && !refused && pkt[0] != 0x0c {
                psn = (psn + 1) & 0xff_ffff;
            }
            if refused && qb.query().unwrap().qp_state == QpState::Err {
                recover(&b, &mut qb, ip, &mut psn, posted, &mut recv_done, round);
                reconnects += 1;
                break;
            }
        }
        // Let the device work, drain its responses and completions.
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(5) {
            while peer.recv_from(&mut buf).is_ok() {}
            let n = b.cq.poll(&mut wcs).unwrap();
            recv_done += n as u64;
            std::thread::sleep(Duration::from_micros(200));
        }
        for (m, before) in &frozen {
            assert!(
                contents(m) == *before,
                "round {round}: a region the peer may not write changed"
            );
        }
        assert!(
            recv_done <= posted,
            "more receive completions than receives"
        );
        if qb.query().unwrap().qp_state == QpState::Err {
            recover(&b, &mut qb, ip, &mut psn, posted, &mut recv_done, round);
            reconnects += 1;
        }
    }
    assert!(sent >= 3000, "{sent}");
    assert!(
        reconnects > 5,
        "the traffic was hostile enough to break the QP {reconnects} times"
    );
    let d = b.dev.stats().device;
    assert!(d.icrc_drops > 0, "{d:?}");
    let q = *b.dev.stats().qp(qb.qpn()).unwrap();
    assert!(q.naks_sent.total() > 0 && q.drops.total() > 0, "{q:?}");

    // Honest traffic on a fresh connection lands byte-exact.
    psn = (psn + 0x1000) & 0xff_ffff;
    bring_up(&mut qb, ip, psn);
    while b.cq.poll(&mut wcs).unwrap() > 0 {}
    let sge = [b.mr.sge(0, 64).unwrap()];
    qb.post_recv(&[RecvWr::new(9_999, &sge)]).unwrap();
    let IpAddr::V4(src) = me.ip() else {
        unreachable!()
    };
    let IpAddr::V4(dst) = ib else { unreachable!() };
    // WRITE_ONLY of 16 bytes to w at offset 100, then SEND_ONLY.
    let mut write = vec![0x0a, 0, 0xff, 0xff, 0];
    write.extend_from_slice(&qb.qpn().get().to_be_bytes()[1..]);
    write.push(0x80);
    write.extend_from_slice(&psn.to_be_bytes()[1..]);
    write.extend_from_slice(&(w_mr.addr() + 100).to_be_bytes());
    write.extend_from_slice(&w_mr.rkey().get().to_be_bytes());
    write.extend_from_slice(&16u32.to_be_bytes());
    write.extend_from_slice(b"honest write ok!");
    write.extend_from_slice(&[0; 4]);
    icrc::fill_v4(src, dst, 0, true, me.port(), 4791, &mut write).unwrap();
    peer.send_to(&write, target).unwrap();
    let mut send = vec![0x04, 0, 0xff, 0xff, 0];
    send.extend_from_slice(&qb.qpn().get().to_be_bytes()[1..]);
    send.push(0x80);
    send.extend_from_slice(&((psn + 1) & 0xff_ffff).to_be_bytes()[1..]);
    send.extend_from_slice(b"honest send!");
    send.extend_from_slice(&[0; 4]);
    icrc::fill_v4(src, dst, 0, true, me.port(), 4791, &mut send).unwrap();
    peer.send_to(&send, target).unwrap();
    let wc = wait(&b.cq, 1, &[]);
    assert_eq!(
        (wc[0].wr_id, wc[0].status, wc[0].byte_len),
        (9_999, WcStatus::Success, 12)
    );
    assert_eq!(b.bytes(0, 12), b"honest send!");
    let mut got = [0u8; 16];
    w.read(100, &mut got).unwrap();
    assert_eq!(&got, b"honest write ok!");
    drop((a, none_mr, foreign_mr, r_mr, a_mr));
}
