//! Receive placement (`RxeConfig::rx_place`): READ responses received
//! straight into the READ's local buffer.
//!
//! Against a real rnic-rxe responder: READs of every shape (one byte to
//! several MiB, unaligned, spread over two SGEs, MTU 1024 and 4096) land
//! byte-exact, the bytes around each destination keep their canary, and
//! the device counts the responses it placed; the same under seeded loss
//! and reordering. Against a scripted responder (a UDP socket on the peer's
//! address that answers READ requests with responses it builds itself):
//! the GSO datagram is placed whole; a corrupted response inside a placed
//! datagram, a duplicate, a reordered and a lost response, a stray packet
//! for another QP and an oversized response each fall back, are dropped
//! or retried as without placement, and the READ still completes
//! byte-exact with nothing outside its buffer touched.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::{IpAddr, Ipv4Addr, UdpSocket};
use std::os::fd::{AsFd, AsRawFd};
use std::time::{Duration, Instant};

use common::*;
use rnic_core::{InitParams, Mtu, Psn, QpType, Qpn, Rkey, SendWr, WcStatus};
use rnic_roce::wire::icrc;
use rnic_rxe::{FaultConfig, Progress, RxeConfig, RxeDevice, Target};

/// What every byte of a destination buffer holds before a READ.
const CANARY: u8 = 0xc5;
/// The READ sizes (one SGE each): one byte to several MiB, around MTUs.
const SIZES: [usize; 8] = [
    1,
    3,
    1024,
    1025,
    3 * 4096 + 1,
    (64 << 10) + 7,
    1 << 20,
    (3 << 20) + 5,
];

fn placing(ip: IpAddr, faults: FaultConfig) -> RxeDevice {
    RxeDevice::open(
        &RxeConfig::new(Target::Ip(ip))
            .with_progress(Progress::Thread)
            .with_rx_place(true)
            .with_faults(faults),
    )
    .expect("open rxe")
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 9) as u8)
        .collect()
}

/// Every byte of `a`'s buffer outside `dests` (offset, length) is still
/// [`CANARY`].
fn assert_canaries(a: &Side, len: usize, dests: &[(usize, usize)], label: &str) {
    let all = a.bytes(0, len);
    let mut inside = vec![false; len];
    for &(off, n) in dests {
        inside[off..off + n].iter_mut().for_each(|b| *b = true);
    }
    let bad: Vec<usize> = (0..len)
        .filter(|&i| !inside[i] && all[i] != CANARY)
        .take(8)
        .collect();
    assert!(
        bad.is_empty(),
        "{label}: bytes outside the READs' buffers changed at {bad:?}"
    );
}

/// READs of many shapes from a placing device against an rnic responder:
/// `faults` on the placing side.
fn reads_land_byte_exact(faults: FaultConfig, label: &str) -> rnic_rxe::DeviceStats {
    const BUF: usize = 16 << 20;
    let (ia, ib) = ip_pair();
    let a = Side::new(placing(ia, faults), BUF, 512);
    let b = Side::new(open(ib, Progress::Thread), BUF, 512);
    let src = pattern(BUF, 7);
    b.fill(0, &src);
    for mtu in [Mtu::Mtu1024, Mtu::Mtu4096] {
        let mut qa = a.qp(QpType::Rc);
        let mut qb = b.qp(QpType::Rc);
        connect(&a, &mut qa, &b, &mut qb, mtu);
        a.fill(0, &vec![CANARY; BUF]);
        let mut dests = Vec::new();
        let mut at = 4096 + 13;
        // One SGE each, several in flight.
        let mut posted = 0;
        for (i, &n) in SIZES.iter().enumerate() {
            let from = 977 * i + 5;
            let sge = [a.mr.sge(at, n as u32).unwrap()];
            qa.post_send(&[SendWr::rdma_read(
                i as u64,
                &sge,
                b.mr.addr() + from as u64,
                b.mr.rkey(),
            )
            .signaled()])
                .unwrap();
            posted += 1;
            dests.push((at, n, from));
            at += n + 4096 + 17;
        }
        // One READ whose buffer is two SGEs with canaries between them.
        let (n1, n2) = (7777usize, (200 << 10) + 3);
        let gap = 4096 + 11;
        let sges = [
            a.mr.sge(at, n1 as u32).unwrap(),
            a.mr.sge(at + n1 + gap, n2 as u32).unwrap(),
        ];
        let from = 12_345;
        qa.post_send(&[
            SendWr::rdma_read(99, &sges, b.mr.addr() + from as u64, b.mr.rkey()).signaled(),
        ])
        .unwrap();
        posted += 1;
        let wcs = wait(&a.cq, posted, &[]);
        for wc in &wcs {
            assert_eq!(wc.status, WcStatus::Success, "{label} {mtu:?}: {wc:?}");
        }
        let got = a.bytes(0, BUF);
        for &(off, n, from) in &dests {
            assert!(
                got[off..off + n] == src[from..from + n],
                "{label} {mtu:?}: READ of {n} bytes differs"
            );
        }
        assert!(
            got[at..at + n1] == src[from..from + n1],
            "{label}: first SGE"
        );
        assert!(
            got[at + n1 + gap..at + n1 + gap + n2] == src[from + n1..from + n1 + n2],
            "{label}: second SGE"
        );
        let mut regions: Vec<(usize, usize)> = dests.iter().map(|&(o, n, _)| (o, n)).collect();
        regions.push((at, n1));
        regions.push((at + n1 + gap, n2));
        assert_canaries(&a, BUF, &regions, label);
    }
    let d = a.dev.stats().device;
    println!("{label}: {d:?}");
    assert_eq!(
        b.dev.stats().device.rx_placed,
        0,
        "the responder placed nothing"
    );
    d
}

#[test]
fn reads_are_received_into_their_buffers_byte_exact() {
    let d = reads_land_byte_exact(FaultConfig::default(), "clean");
    let read: u64 = 2 * (SIZES.iter().map(|&n| n as u64).sum::<u64>() + 7777 + (200 << 10) + 3);
    // Each READ's first datagram is received as usual (it names the QP to
    // predict for); the rest is placed.
    assert!(d.rx_placed > 0, "{d:?}");
    assert!(
        d.rx_placed_bytes * 10 >= read * 8,
        "at least 80 % of the READ bytes placed: {} of {read}",
        d.rx_placed_bytes
    );
    assert_eq!(d.icrc_drops, 0, "{d:?}");
}

#[test]
fn placed_reads_survive_loss_and_reordering() {
    let faults = FaultConfig {
        seed: 0x9e37_79b9,
        drop_ppm: 20_000,
        reorder_ppm: 20_000,
    };
    let d = reads_land_byte_exact(faults, "lossy");
    assert!(d.fault_drops > 0 && d.fault_reordered > 0, "{d:?}");
    assert!(d.rx_placed > 0, "{d:?}");
}

// ---- A scripted responder -------------------------------------------------

const READ_REQ: u8 = 0x0c;
const FIRST: u8 = 0x0d;
const MIDDLE: u8 = 0x0e;
const LAST: u8 = 0x0f;
const ONLY: u8 = 0x10;
/// The scripted responder's QPN.
const PEER_QPN: u32 = 0x66;
/// The remote address the READs name (the responder serves `data` there).
const BASE: u64 = 0x10_0000;
const MTU: usize = 1024;

/// A READ request as the responder read it.
#[derive(Clone, Copy, Debug)]
struct Req {
    psn: u32,
    va: u64,
    len: usize,
}

struct Peer {
    sock: UdpSocket,
    me: Ipv4Addr,
    dev: Ipv4Addr,
    dqpn: u32,
    data: Vec<u8>,
}

impl Peer {
    /// The next READ request within `within`.
    fn request(&self, within: Duration) -> Option<Req> {
        let t = Instant::now();
        let mut b = [0u8; 256];
        while t.elapsed() < within {
            if let Ok(n) = self.sock.recv(&mut b) {
                if n >= 32 && b[0] == READ_REQ {
                    let psn = u32::from_be_bytes([0, b[9], b[10], b[11]]);
                    let va = u64::from_be_bytes(b[12..20].try_into().unwrap());
                    let len = u32::from_be_bytes(b[24..28].try_into().unwrap()) as usize;
                    return Some(Req { psn, va, len });
                }
            } else {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        None
    }

    /// One response packet, ICRC filled (identification 0: an unconnected
    /// DF socket's).
    fn response(&self, opcode: u8, psn: u32, payload: &[u8]) -> Vec<u8> {
        let pad = (4 - payload.len() % 4) % 4;
        let q = self.dqpn.to_be_bytes();
        let s = psn.to_be_bytes();
        let mut p = vec![
            opcode,
            (pad as u8) << 4,
            0xff,
            0xff,
            0,
            q[1],
            q[2],
            q[3],
            0,
            s[1],
            s[2],
            s[3],
        ];
        if opcode != MIDDLE {
            p.extend_from_slice(&[0, 0, 0, 1]); // AETH: ACK, MSN 1
        }
        p.extend_from_slice(payload);
        p.extend(std::iter::repeat_n(0, pad + 4));
        icrc::fill_v4(self.me, self.dev, 0, true, 4791, 4791, &mut p).unwrap();
        p
    }

    /// The honest responses to `r`, one per PSN.
    fn answer(&self, r: &Req) -> Vec<Vec<u8>> {
        let off = (r.va - BASE) as usize;
        let data = &self.data[off..off + r.len];
        let n = r.len.div_ceil(MTU).max(1);
        (0..n)
            .map(|k| {
                let op = match (k == 0, k + 1 == n) {
                    (true, true) => ONLY,
                    (true, false) => FIRST,
                    (false, true) => LAST,
                    (false, false) => MIDDLE,
                };
                let chunk = &data[k * MTU..((k + 1) * MTU).min(r.len)];
                self.response(op, (r.psn + k as u32) & 0xff_ffff, chunk)
            })
            .collect()
    }

    fn send(&self, dev: &RxeDevice, pkt: &[u8]) {
        let before = dev.stats().device.rx_datagrams;
        self.sock.send_to(pkt, (self.dev, 4791)).unwrap();
        wait_taken(dev, before);
    }

    /// `pkts` (equal sizes but the last) as one UDP GSO datagram.
    fn send_gso(&self, dev: &RxeDevice, pkts: &[Vec<u8>]) {
        let seg = pkts[0].len() as libc::c_int;
        set_udp_segment(&self.sock, seg);
        let all: Vec<u8> = pkts.concat();
        let before = dev.stats().device.rx_datagrams;
        self.sock.send_to(&all, (self.dev, 4791)).unwrap();
        set_udp_segment(&self.sock, 0);
        wait_taken(dev, before);
    }
}

/// Until the device has received a datagram more than `before`.
fn wait_taken(dev: &RxeDevice, before: u64) {
    let t = Instant::now();
    while dev.stats().device.rx_datagrams == before {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the device took nothing"
        );
        std::thread::sleep(Duration::from_micros(100));
    }
}

fn set_udp_segment(sock: &UdpSocket, seg: libc::c_int) {
    const UDP_SEGMENT: libc::c_int = 103;
    // SAFETY: a valid socket, an int option passed by pointer and size.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_UDP,
            UDP_SEGMENT,
            (&raw const seg).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "UDP_SEGMENT");
}

/// A placing device with one RC QP connected to a scripted responder.
struct Scripted {
    a: Side,
    qa: rnic_core::QueuePair,
    peer: Peer,
}

fn scripted() -> Scripted {
    let (ia, ip) = ip_pair();
    let a = Side::new(placing(ia, FaultConfig::default()), 1 << 20, 64);
    let (IpAddr::V4(me), IpAddr::V4(dev)) = (ip, ia) else {
        unreachable!()
    };
    let sock = UdpSocket::bind((me, 4791)).unwrap();
    rnic_rxe::sys::set_pmtudisc_do(sock.as_fd(), false).unwrap();
    sock.set_nonblocking(true).unwrap();
    let mut qa = a.qp(QpType::Rc);
    qa.to_init(&InitParams {
        access: ALL,
        ..InitParams::default()
    })
    .unwrap();
    qa.to_rtr(
        Qpn::from_wire(PEER_QPN),
        Psn::from_wire(0x800),
        rnic_core::Gid::from_ip(ip),
        &rtr(Mtu::Mtu1024),
    )
    .unwrap();
    qa.to_rts(Psn::from_wire(0x4000), &rts()).unwrap();
    let peer = Peer {
        sock,
        me,
        dev,
        dqpn: qa.qpn().get(),
        data: pattern(64 << 10, 99),
    };
    Scripted { a, qa, peer }
}

/// Post a READ of `len` bytes from `BASE + from` into offset `at` of the
/// (canary-filled) buffer, let `script` answer the first request, then
/// answer every further request honestly until the READ completes; check
/// the bytes, the canaries, and return the device's counters before and
/// after.
fn scripted_read(
    s: &mut Scripted,
    at: usize,
    from: usize,
    len: usize,
    label: &str,
    script: impl FnOnce(&Peer, &RxeDevice, Vec<Vec<u8>>),
) -> (rnic_rxe::DeviceStats, rnic_rxe::DeviceStats) {
    let Scripted { a, qa, peer } = s;
    // A datagram that was not as predicted makes the device receive the
    // next 8 as usual: 8 strays first, so that each script starts with
    // placement on.
    for _ in 0..8 {
        let mut stray = peer.response(ONLY, 0, &[0; 4]);
        stray[5..8].copy_from_slice(&[0, 0x0f, 0xfe]);
        icrc::fill_v4(peer.me, peer.dev, 0, true, 4791, 4791, &mut stray).unwrap();
        peer.send(&a.dev, &stray);
    }
    a.fill(0, &vec![CANARY; 1 << 20]);
    let before = a.dev.stats().device;
    let sge = [a.mr.sge(at, len as u32).unwrap()];
    qa.post_send(&[SendWr::rdma_read(1, &sge, BASE + from as u64, Rkey(0x1234)).signaled()])
        .unwrap();
    // (Retries the previous READ sent before it completed are skipped.)
    let req = loop {
        let r = peer
            .request(Duration::from_secs(5))
            .expect("a READ request");
        if (r.va, r.len) == (BASE + from as u64, len) {
            break r;
        }
    };
    script(peer, &a.dev, peer.answer(&req));
    let t = Instant::now();
    let mut wcs = [rnic_core::WorkCompletion::default(); 4];
    loop {
        let n = a.cq.poll(&mut wcs).unwrap();
        if n > 0 {
            assert_eq!(wcs[0].status, WcStatus::Success, "{label}: {:?}", wcs[0]);
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "{label}: the READ never completed"
        );
        if let Some(r) = peer.request(Duration::from_millis(2)) {
            for p in peer.answer(&r) {
                peer.sock.send_to(&p, (peer.dev, 4791)).unwrap();
            }
        }
    }
    assert!(
        a.bytes(at, len) == peer.data[from..from + len],
        "{label}: the READ's bytes differ"
    );
    assert_canaries(a, 1 << 20, &[(at, len)], label);
    (before, a.dev.stats().device)
}

#[test]
fn a_scripted_responder_cannot_make_placement_corrupt_a_read() {
    let mut s = scripted();
    // Five responses: FIRST, three MIDDLEs, a LAST with 3 pad bytes.
    let len = 5 * MTU - 3;

    // The MIDDLEs in one GSO datagram: placed whole, with the LAST.
    let (b, d) = scripted_read(&mut s, 8192 + 5, 100, len, "gso", |p, dev, r| {
        p.send(dev, &r[0]);
        p.send_gso(dev, &r[1..4]);
        p.send(dev, &r[4]);
    });
    assert_eq!(d.rx_placed - b.rx_placed, 4, "{d:?}");
    assert_eq!(d.rx_placed_bytes - b.rx_placed_bytes, (len - MTU) as u64);
    assert_eq!(d.rx_place_fallbacks, b.rx_place_fallbacks, "{d:?}");

    // A corrupted MIDDLE inside the GSO datagram: the datagram falls back,
    // the bad packet is dropped on its ICRC, the READ is retried from it.
    let (b, d) = scripted_read(
        &mut s,
        3 * 4096 + 1,
        200,
        len,
        "corrupt",
        |p, dev, mut r| {
            r[2][12 + 100] ^= 0x40;
            p.send(dev, &r[0]);
            p.send_gso(dev, &r[1..4]);
            p.send(dev, &r[4]);
        },
    );
    assert!(d.rx_place_fallbacks > b.rx_place_fallbacks, "{d:?}");
    assert_eq!(d.icrc_drops - b.icrc_drops, 1, "{d:?}");

    // Duplicates, a reordered and a lost response: each is not what was
    // predicted, falls back, and is handled as without placement.
    let schedules: [(&str, &[usize]); 3] = [
        ("duplicate", &[0, 1, 1, 2, 3, 3, 4]),
        ("reorder", &[0, 2, 1, 3, 4]),
        ("loss", &[0, 1, 3, 4]),
    ];
    for (i, (label, order)) in schedules.into_iter().enumerate() {
        let (b, d) = scripted_read(
            &mut s,
            40_000 + 1000 * i,
            300 + i,
            len,
            label,
            |p, dev, r| {
                for &k in order {
                    p.send(dev, &r[k]);
                }
            },
        );
        assert!(
            d.rx_place_fallbacks > b.rx_place_fallbacks,
            "{label}: {d:?}"
        );
    }

    // A stray packet for another QP, and a response for the expected PSN
    // that is too long: each lands (partly) where the READ's next bytes
    // would, falls back and is dropped (unknown QPN; a bad response
    // length), and nothing outside the READ's buffer changes (the
    // oversized one's extra bytes went to the slot).
    let (b, d) = scripted_read(&mut s, 100_000 + 3, 400, len, "stray", |p, dev, r| {
        p.send(dev, &r[0]);
        let mut stray = p.response(ONLY, 0x800, &[0xee; MTU]);
        stray[5..8].copy_from_slice(&[0, 0x0f, 0xff]);
        icrc::fill_v4(p.me, p.dev, 0, true, 4791, 4791, &mut stray).unwrap();
        p.send(dev, &stray);
        for pkt in &r[1..] {
            p.send(dev, pkt);
        }
    });
    assert_eq!(d.rx_place_fallbacks, b.rx_place_fallbacks + 1, "{d:?}");
    assert_eq!(d.unknown_qpn, b.unknown_qpn + 1, "{d:?}");
    let (b, d) = scripted_read(&mut s, 200_000 + 7, 500, len, "oversized", |p, dev, r| {
        p.send(dev, &r[0]);
        let psn = u32::from_be_bytes([0, r[1][9], r[1][10], r[1][11]]);
        p.send(dev, &p.response(MIDDLE, psn, &[0xdd; 3 * MTU]));
        for pkt in &r[1..] {
            p.send(dev, pkt);
        }
    });
    assert_eq!(d.rx_place_fallbacks, b.rx_place_fallbacks + 1, "{d:?}");
    let qp = s.a.dev.stats().qps;
    assert!(
        qp.iter().any(|(_, q)| q.drops.bad_response > 0),
        "the oversized response was dropped: {qp:?}"
    );
}
