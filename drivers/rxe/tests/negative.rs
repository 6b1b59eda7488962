//! Negative tests end to end: bad keys, bounds and rights give the requester
//! the IBTA status and leave the target's memory untouched; RNR; and bad
//! datagrams injected from a plain UDP socket are dropped and counted.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use common::*;
use rnic_core::{
    AccessFlags, HeapMemory, Mtu, QpType, RecvWr, RtrParams, RtsParams, SendWr, WcStatus,
};
use rnic_roce::wire::icrc;
use rnic_rxe::Progress;

fn connected(mtu: Mtu) -> (Side, Side, rnic_core::QueuePair, rnic_core::QueuePair) {
    let (a, b) = sides(1 << 20, Progress::Thread);
    let (mut qa, mut qb) = (a.qp(QpType::Rc), b.qp(QpType::Rc));
    connect(&a, &mut qa, &b, &mut qb, mtu);
    (a, b, qa, qb)
}

/// Post one WRITE of `len` bytes to (`addr`, `rkey`) and return its status.
fn write_status(
    a: &Side,
    qa: &mut rnic_core::QueuePair,
    addr: u64,
    rkey: rnic_core::Rkey,
    len: u32,
) -> WcStatus {
    a.fill(0, &vec![0x5A; len as usize]);
    let src = [a.mr.sge(0, len).unwrap()];
    qa.post_send(&[SendWr::rdma_write(1, &src, addr, rkey).signaled()])
        .unwrap();
    wait(&a.cq, 1, &[])[0].status
}

#[test]
fn wrong_rkey_is_a_remote_access_error_and_touches_nothing() {
    let (a, b, mut qa, qb) = connected(Mtu::Mtu1024);
    let bad = rnic_core::Rkey(b.mr.rkey().get() ^ 0x5500);
    let st = write_status(&a, &mut qa, b.mr.addr(), bad, 3000);
    assert_eq!(st, WcStatus::RemAccessErr);
    assert_eq!(b.bytes(0, 4096), vec![0; 4096]);
    let sb = b.dev.stats();
    assert_eq!(sb.qp(qb.qpn()).unwrap().naks_sent.remote_access, 1);
    let sa = a.dev.stats();
    assert_eq!(sa.qp(qa.qpn()).unwrap().naks_received.remote_access, 1);
}

#[test]
fn out_of_bounds_write_is_refused_whole() {
    let (a, b, mut qa, qb) = connected(Mtu::Mtu1024);
    // 16 bytes starting 8 before the end of the 1 MiB region.
    let addr = b.mr.addr() + (1 << 20) - 8;
    let st = write_status(&a, &mut qa, addr, b.mr.rkey(), 16);
    assert_eq!(st, WcStatus::RemAccessErr);
    assert_eq!(b.bytes((1 << 20) - 8, 8), vec![0; 8]);
    assert_eq!(
        b.dev.stats().qp(qb.qpn()).unwrap().naks_sent.remote_access,
        1
    );
}

#[test]
fn missing_remote_rights_are_refused() {
    let (a, b, mut qa, _qb) = connected(Mtu::Mtu1024);
    // A region that allows local writes only.
    let mem = std::sync::Arc::new(HeapMemory::new(4096));
    let ro = b.pd.reg_mr(mem.clone(), AccessFlags::LOCAL_WRITE).unwrap();
    let st = write_status(&a, &mut qa, ro.addr(), ro.rkey(), 64);
    assert_eq!(st, WcStatus::RemAccessErr);
    let mut z = [1u8; 64];
    rnic_core::Memory::read(&*mem, 0, &mut z).unwrap();
    assert_eq!(z, [0; 64]);
    // The error moved a's QP to ERR: later work is flushed.
    let src = [a.mr.sge(0, 8).unwrap()];
    qa.post_send(&[SendWr::rdma_write(2, &src, b.mr.addr(), b.mr.rkey()).signaled()])
        .unwrap();
    assert_eq!(wait(&a.cq, 1, &[])[0].status, WcStatus::WrFlushErr);
}

#[test]
fn read_without_remote_read_is_refused() {
    let (a, b, mut qa, _qb) = connected(Mtu::Mtu1024);
    let mem = std::sync::Arc::new(HeapMemory::from_bytes(&[7u8; 256]));
    let wo =
        b.pd.reg_mr(mem, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .unwrap();
    a.fill(0, &[0xEE; 256]);
    let dst = [a.mr.sge(0, 256).unwrap()];
    qa.post_send(&[SendWr::rdma_read(1, &dst, wo.addr(), wo.rkey()).signaled()])
        .unwrap();
    assert_eq!(wait(&a.cq, 1, &[])[0].status, WcStatus::RemAccessErr);
    assert_eq!(a.bytes(0, 256), vec![0xEE; 256], "local buffer untouched");
}

#[test]
fn rnr_with_no_retries_fails_the_send() {
    let (a, b) = sides(1 << 16, Progress::Thread);
    let (mut qa, mut qb) = (a.qp(QpType::Rc), b.qp(QpType::Rc));
    let rts0 = RtsParams {
        rnr_retry: 0,
        ..rts()
    };
    connect_with(&a, &mut qa, &b, &mut qb, rtr(Mtu::Mtu1024), rts0, ALL);
    let src = [a.mr.sge(0, 32).unwrap()];
    qa.post_send(&[SendWr::send(1, &src).signaled()]).unwrap();
    assert_eq!(wait(&a.cq, 1, &[])[0].status, WcStatus::RnrRetryExcErr);
    assert!(b.dev.stats().qp(qb.qpn()).unwrap().naks_sent.rnr >= 1);
    assert!(a.dev.stats().qp(qa.qpn()).unwrap().naks_received.rnr >= 1);
}

#[test]
fn rnr_then_receive_posted_succeeds() {
    let (a, b) = sides(1 << 16, Progress::Thread);
    let (mut qa, mut qb) = (a.qp(QpType::Rc), b.qp(QpType::Rc));
    let fast_rnr = RtrParams {
        min_rnr_timer: 1, // 0.01 ms
        ..rtr(Mtu::Mtu1024)
    };
    connect_with(&a, &mut qa, &b, &mut qb, fast_rnr, rts(), ALL);
    a.fill(0, b"late receive");
    let src = [a.mr.sge(0, 12).unwrap()];
    qa.post_send(&[SendWr::send(1, &src).signaled()]).unwrap();
    let t = Instant::now();
    while a.dev.stats().qp(qa.qpn()).unwrap().rnr_waits == 0 {
        assert!(t.elapsed() < Duration::from_secs(5), "no RNR NAK seen");
        std::thread::sleep(Duration::from_millis(1));
    }
    let rsge = [b.mr.sge(0, 64).unwrap()];
    qb.post_recv(&[RecvWr::new(3, &rsge)]).unwrap();
    assert_eq!(wait(&a.cq, 1, &[])[0].status, WcStatus::Success);
    assert_eq!(wait(&b.cq, 1, &[])[0].byte_len, 12);
    assert_eq!(b.bytes(0, 12), b"late receive");
}

/// A UDP socket on a third loopback address, DF set like a RoCE sender.
fn injector(near: IpAddr) -> UdpSocket {
    let IpAddr::V4(v4) = near else { unreachable!() };
    let o = v4.octets();
    let s = UdpSocket::bind((Ipv4Addr::new(o[0], o[1], o[2], 3), 0)).unwrap();
    rnic_rxe::sys::set_pmtudisc_do(s.as_fd(), false).unwrap();
    s
}

/// An RC SEND_ONLY to `qpn` with PSN `psn` carrying `payload`, ICRC filled
/// for identification 0 from `src` to `dst`.
fn send_only(src: SocketAddr, dst: SocketAddr, qpn: u32, psn: u32, payload: &[u8]) -> Vec<u8> {
    let pad = (4 - payload.len() % 4) % 4;
    let mut p = vec![0x04, (pad as u8) << 4, 0xFF, 0xFF, 0];
    p.extend_from_slice(&qpn.to_be_bytes()[1..]);
    p.push(0x80);
    p.extend_from_slice(&psn.to_be_bytes()[1..]);
    p.extend_from_slice(payload);
    p.extend(std::iter::repeat_n(0, pad + 4));
    let (IpAddr::V4(s), IpAddr::V4(d)) = (src.ip(), dst.ip()) else {
        unreachable!()
    };
    icrc::fill_v4(s, d, 0, true, src.port(), dst.port(), &mut p).unwrap();
    p
}

/// Wait (bounded) until `f` holds on `b`'s device counters.
fn until(b: &Side, what: &str, f: impl Fn(&rnic_rxe::DeviceStats) -> bool) {
    let t = Instant::now();
    while !f(&b.dev.stats().device) {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "{what}: {:?}",
            b.dev.stats().device
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn injected_garbage_is_dropped_and_counted() {
    let (a, b, _qa, mut qb) = connected(Mtu::Mtu1024);
    let target = SocketAddr::new(b.dev.gids()[0].to_ip(), 4791);
    let inj = injector(target.ip());
    let me = inj.local_addr().unwrap();
    let before = b.dev.stats().device;

    // Too short for BTH + ICRC.
    inj.send_to(&[1, 2, 3], target).unwrap();
    until(&b, "short datagram", |d| {
        d.rx_malformed == before.rx_malformed + 1
    });

    // A well-formed packet with a valid ICRC to a QPN nobody has.
    let pkt = send_only(me, target, 0xABCDEF, 0, b"hello");
    inj.send_to(&pkt, target).unwrap();
    until(&b, "unknown QPN", |d| {
        d.unknown_qpn == before.unknown_qpn + 1
    });

    // The same aimed at the real QP with one payload bit flipped: ICRC drop,
    // and the QP never sees it (no receive consumed, no NAK).
    let rsge = [b.mr.sge(0, 64).unwrap()];
    qb.post_recv(&[RecvWr::new(1, &rsge)]).unwrap();
    let mut bad = send_only(me, target, qb.qpn().get(), 0x1000, b"hello");
    bad[13] ^= 0x04;
    inj.send_to(&bad, target).unwrap();
    until(&b, "bad ICRC", |d| d.icrc_drops == before.icrc_drops + 1);

    // Random bytes of packet size.
    inj.send_to(&pattern(200, 9), target).unwrap();
    until(&b, "random bytes", |d| {
        d.icrc_drops == before.icrc_drops + 2
    });

    assert_eq!(b.bytes(0, 8), vec![0; 8], "memory untouched");
    let mut wcs = [rnic_core::WorkCompletion::default(); 4];
    assert_eq!(b.cq.poll(&mut wcs).unwrap(), 0, "no completion");
    let q = *b.dev.stats().qp(qb.qpn()).unwrap();
    assert_eq!(q.rx_packets, 0, "the QP never saw a bad packet");

    // A valid-ICRC SEND to the right QP and PSN, but from a third host
    // (x.y.z.3, not the connected peer): dropped by the QP like kernel rxe's
    // check_addr does, counted, nothing completes, no byte lands.
    let forged = send_only(me, target, qb.qpn().get(), 0x1000, b"hello!!!");
    inj.send_to(&forged, target).unwrap();
    let t = Instant::now();
    while b.dev.stats().qp(qb.qpn()).unwrap().drops.wrong_source == 0 {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "forged SEND not dropped"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(b.cq.poll(&mut wcs).unwrap(), 0, "no completion");
    assert_eq!(b.bytes(0, 8), vec![0; 8], "memory untouched");

    // The same packet from the peer's address is a real SEND.
    let peer = UdpSocket::bind((a.dev.gids()[0].to_ip(), 0)).unwrap();
    rnic_rxe::sys::set_pmtudisc_do(peer.as_fd(), false).unwrap();
    let good = send_only(
        peer.local_addr().unwrap(),
        target,
        qb.qpn().get(),
        0x1000,
        b"hello!!!",
    );
    peer.send_to(&good, target).unwrap();
    let wc = wait(&b.cq, 1, &[]);
    assert_eq!(wc[0].status, WcStatus::Success);
    assert_eq!(b.bytes(0, 8), b"hello!!!");
    drop(a);
}
