//! ACK bundling: in a caller-driven WRITE ping-pong (ib_write_lat's
//! pattern) the ACK of the peer's WRITE leaves in one GSO datagram behind
//! this side's own WRITE. Checked end to end (memory, completions, counters,
//! which ICRC prediction verified each packet) against a GRO receiver and a
//! receiver without GRO, and on the wire (root: an AF_PACKET capture of the
//! datagram, each segment's ICRC verified for its own identification).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use common::*;
use rnic_core::{Mtu, QpType, QueuePair, SendWr, WcStatus, WorkCompletion};
use rnic_roce::wire::icrc;
use rnic_rxe::{Progress, RxeConfig, RxeDevice, Target};

/// Iterations of the ping-pong.
const ROUNDS: u8 = 50;

/// Poll `s` (caller-driven: each empty poll is a round of progress) until
/// byte 0 of its buffer reads `want`; returns the completions seen.
fn spin_for(s: &Side, want: u8) -> Vec<WorkCompletion> {
    let mut wcs = [WorkCompletion::default(); 8];
    let mut seen = Vec::new();
    let t = Instant::now();
    while s.bytes(0, 1)[0] != want {
        let n = s.cq.poll(&mut wcs).unwrap();
        seen.extend_from_slice(&wcs[..n]);
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "byte {want} never arrived"
        );
    }
    seen
}

/// Write `val` (8 bytes, inline) into the peer's byte 0..8.
fn write8(from: &Side, qp: &mut QueuePair, to: &Side, val: u8, wr_id: u64) {
    from.fill(64, &[val; 8]);
    let sge = [from.mr.sge(64, 8).unwrap()];
    qp.post_send(
        &[SendWr::rdma_write(wr_id, &sge, to.mr.addr(), to.mr.rkey())
            .signaled()
            .inline()],
    )
    .unwrap();
}

/// ROUNDS round trips a → b → a; returns the send completions of each side.
fn ping_pong(a: &Side, qa: &mut QueuePair, b: &Side, qb: &mut QueuePair) -> (usize, usize) {
    let (mut ca, mut cb) = (0, 0);
    for i in 1..=ROUNDS {
        write8(a, qa, b, i, u64::from(i));
        cb += spin_for(b, i).len();
        write8(b, qb, a, i, u64::from(i));
        ca += spin_for(a, i).len();
        assert_eq!(a.bytes(0, 8), [i; 8]);
        assert_eq!(b.bytes(0, 8), [i; 8]);
    }
    // The last ACKs: keep both sides polling until every WRITE completed.
    let mut wcs = [WorkCompletion::default(); 8];
    let t = Instant::now();
    while ca < usize::from(ROUNDS) || cb < usize::from(ROUNDS) {
        for (s, c) in [(a, &mut ca), (b, &mut cb)] {
            let n = s.cq.poll(&mut wcs).unwrap();
            assert!(wcs[..n].iter().all(|w| w.status == WcStatus::Success));
            *c += n;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "completions {ca} {cb}"
        );
    }
    (ca, cb)
}

fn pair(gro_b: bool) -> (Side, Side, QueuePair, QueuePair) {
    let (ia, ib) = ip_pair();
    let a = Side::new(open(ia, Progress::Caller), 4096, 256);
    let mut cfg = RxeConfig::new(Target::Ip(ib)).with_progress(Progress::Caller);
    cfg.gro = gro_b;
    let b = Side::new(RxeDevice::open(&cfg).unwrap(), 4096, 256);
    let (mut qa, mut qb) = (a.qp(QpType::Rc), b.qp(QpType::Rc));
    connect(&a, &mut qa, &b, &mut qb, Mtu::Mtu1024);
    (a, b, qa, qb)
}

/// Both receivers use GRO: each bundle arrives as one datagram and its
/// ACK verifies as segment 1 (`icrc_ident_gro`).
#[test]
fn ping_pong_acks_leave_behind_the_answering_write() {
    let (a, b, mut qa, mut qb) = pair(true);
    let (ca, cb) = ping_pong(&a, &mut qa, &b, &mut qb);
    assert_eq!((ca, cb), (usize::from(ROUNDS), usize::from(ROUNDS)));
    let (sa, sb) = (a.dev.stats().device, b.dev.stats().device);
    println!("a: {sa:?}\nb: {sb:?}");
    // b answers every WRITE of a with its own, carrying the ACK; a does the
    // same from round 2 on (its first WRITE had nothing to carry).
    assert!(sb.acks_bundled >= u64::from(ROUNDS) - 1, "{sb:?}");
    assert!(sa.acks_bundled >= u64::from(ROUNDS) - 2, "{sa:?}");
    for (s, peer_bundled) in [(&sa, sb.acks_bundled), (&sb, sa.acks_bundled)] {
        assert_eq!(s.icrc_drops, 0);
        assert_eq!(s.icrc_recovered, 0);
        assert_eq!(s.icrc_ok, s.rx_packets);
        assert!(s.gro_datagrams >= peer_bundled, "{s:?}");
        assert!(s.icrc_ident_gro >= peer_bundled, "{s:?}");
    }
    // One datagram per bundle: fewer datagrams than packets.
    assert!(
        sa.tx_datagrams + sa.acks_bundled <= sa.tx_packets + 1,
        "{sa:?}"
    );
}

/// b without GRO: its kernel cuts each bundle in two; the ACK (with
/// identification 1) verifies as "previous + 1" behind the WRITE (with
/// identification 0): all 32 ICRC bits, no solving.
#[test]
fn bundles_verify_at_a_receiver_without_gro() {
    let (a, b, mut qa, mut qb) = pair(false);
    assert!(!b.dev.gro());
    let (ca, cb) = ping_pong(&a, &mut qa, &b, &mut qb);
    assert_eq!((ca, cb), (usize::from(ROUNDS), usize::from(ROUNDS)));
    let (sa, sb) = (a.dev.stats().device, b.dev.stats().device);
    println!("a: {sa:?}\nb: {sb:?}");
    assert!(sa.acks_bundled >= u64::from(ROUNDS) - 2, "{sa:?}");
    assert_eq!(sb.gro_datagrams, 0);
    assert_eq!(sb.icrc_drops, 0);
    assert_eq!(sb.icrc_recovered, 0);
    assert_eq!(sb.icrc_ok, sb.rx_packets);
    assert!(sb.icrc_ident_next >= sa.acks_bundled, "{sb:?}");
}

/// On the wire (lo keeps a GSO datagram whole): a datagram whose first
/// segment is an RDMA WRITE ONLY with 8 inline bytes (40 bytes: BTH, RETH,
/// payload, ICRC) and whose second is a 20-byte ACKNOWLEDGE; the WRITE's
/// ICRC verifies with identification 0 and the ACK's with identification 1,
/// each with its own IP and UDP lengths.
#[test]
fn captured_bundle_is_a_write_then_an_ack() {
    let Some(cap) = capture_socket() else {
        return;
    };
    let (a, b, mut qa, mut qb) = pair(true);
    let (IpAddr::V4(ia), IpAddr::V4(ib)) = (a.gid().to_ip(), b.gid().to_ip()) else {
        unreachable!()
    };
    ping_pong(&a, &mut qa, &b, &mut qb);
    let mut bundles = 0;
    for ip in captured_v4(&cap, ia, ib, 2) {
        let (s, d) = (
            Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]),
            Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]),
        );
        let payload = &ip[28..];
        if payload.len() != 60 {
            assert!(
                payload.len() == 40 || payload.len() == 20,
                "{}",
                payload.len()
            );
            continue;
        }
        let (write, ack) = payload.split_at(40);
        assert_eq!(write[0], 0x0a, "RC RDMA WRITE ONLY first");
        assert_eq!(ack[0], 0x11, "RC ACKNOWLEDGE second");
        assert_eq!(ack[12] & 0xe0, 0, "a positive ACK");
        let sport = u16::from_be_bytes([ip[20], ip[21]]);
        let (src, dst) = (s, d);
        icrc::verify_v4(src, dst, 0, true, sport, 4791, write).expect("WRITE ICRC, ident 0");
        icrc::verify_v4(src, dst, 1, true, sport, 4791, ack).expect("ACK ICRC, ident 1");
        // And not with the other's identification: the ident is covered.
        assert!(icrc::verify_v4(src, dst, 0, true, sport, 4791, ack).is_err());
        bundles += 1;
    }
    println!("captured {bundles} WRITE+ACK bundles");
    assert!(bundles >= usize::from(ROUNDS), "{bundles}");
}
