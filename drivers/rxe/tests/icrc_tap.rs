//! Issue 15 part 3: every received IPv4 packet gets a full 32-bit ICRC
//! check, even when its IPv4 identification is unpredictable.
//!
//! A fake kernel-rxe-like peer sends from a raw `IP_HDRINCL` socket, so it
//! chooses each packet's identification: random ones (unpredictable), a
//! counter (kernel rxe), and a forgery whose ICRC holds only for another
//! identification — the packet the old 15-bit "solve for the
//! identification" path accepted. With the identification tap (the
//! default, root) it is refused; without the tap it is dropped as
//! unverifiable unless the 15-bit recovery is explicitly allowed. A device
//! receiving through the packet ring checks with the identification it saw
//! in each header, needing neither. Needs root (raw sockets; the ring also
//! Linux 6.2+); says SKIP otherwise.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use common::*;
use rnic_core::{InitParams, Mtu, Psn, QpType, Qpn, RecvWr, WcStatus};
use rnic_roce::wire::icrc;
use rnic_rxe::{Progress, RxeConfig, RxeDevice, Target};

const PEER_QPN: u32 = 0x66;
const SPORT: u16 = 0xC0DE;

/// A raw IPv4 socket that sends whole IP packets (`IPPROTO_RAW` implies
/// `IP_HDRINCL`), or `None` without CAP_NET_RAW.
fn raw_sender() -> Option<OwnedFd> {
    // SAFETY: socket(2) with constant arguments; it returns a new fd or -1.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW) };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` was just returned by socket(2) and nobody else owns it.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Send `roce` (BTH … ICRC) from `src`:SPORT to `dst`:4791 in an IPv4
/// packet with identification `ident` and DF.
fn send_ip(fd: &OwnedFd, src: Ipv4Addr, dst: Ipv4Addr, ident: u16, roce: &[u8]) {
    let udp_len = 8 + roce.len();
    let total = 20 + udp_len;
    let mut p = vec![0x45, 0];
    p.extend_from_slice(&(total as u16).to_be_bytes());
    p.extend_from_slice(&ident.to_be_bytes());
    p.extend_from_slice(&[0x40, 0, 64, 17, 0, 0]); // DF, TTL 64, UDP, checksum by the kernel
    p.extend_from_slice(&src.octets());
    p.extend_from_slice(&dst.octets());
    p.extend_from_slice(&SPORT.to_be_bytes());
    p.extend_from_slice(&4791u16.to_be_bytes());
    p.extend_from_slice(&(udp_len as u16).to_be_bytes());
    p.extend_from_slice(&[0, 0]); // no UDP checksum (allowed for IPv4)
    p.extend_from_slice(roce);
    let to = nix::sys::socket::SockaddrIn::from(SocketAddrV4::new(dst, 0));
    nix::sys::socket::sendto(fd.as_raw_fd(), &p, &to, nix::sys::socket::MsgFlags::empty())
        .expect("raw send");
}

/// An RC SEND_ONLY to `qpn` at `psn` with `payload`, ICRC filled as if the
/// IPv4 identification were `icrc_ident`.
fn send_only(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    qpn: u32,
    psn: u32,
    payload: &[u8],
    icrc_ident: u16,
) -> Vec<u8> {
    let pad = (4 - payload.len() % 4) % 4;
    let mut p = vec![0x04, (pad as u8) << 4, 0xff, 0xff, 0];
    p.extend_from_slice(&qpn.to_be_bytes()[1..]);
    p.push(0x80);
    p.extend_from_slice(&psn.to_be_bytes()[1..]);
    p.extend_from_slice(payload);
    p.extend(std::iter::repeat_n(0, pad + 4));
    icrc::fill_v4(src, dst, icrc_ident, true, SPORT, 4791, &mut p).unwrap();
    p
}

struct Rig {
    b: Side,
    qb: rnic_core::QueuePair,
    peer: Ipv4Addr,
    me: Ipv4Addr,
    raw: OwnedFd,
    psn: u32,
}

fn rig(tap: bool, recovery: bool) -> Option<Rig> {
    rig_with(|cfg| cfg.with_ident_tap(tap).with_ident_recovery(recovery))
}

/// The rig with the receiving device configured by `config` (`None` where
/// the device cannot be opened here: no raw socket, or no packet ring).
fn rig_with(config: impl FnOnce(RxeConfig) -> RxeConfig) -> Option<Rig> {
    let raw = raw_sender()?;
    let (ib, ip) = ip_pair();
    let (IpAddr::V4(me), IpAddr::V4(peer)) = (ib, ip) else {
        unreachable!()
    };
    let cfg = config(RxeConfig::new(Target::Ip(ib)).with_progress(Progress::Thread));
    let dev = match RxeDevice::open(&cfg) {
        Ok(d) => d,
        Err(e @ rnic_rxe::RxeError::PacketRing { .. }) => {
            println!("SKIP: no packet ring here: {e}");
            return None;
        }
        Err(e) => panic!("open: {e}"),
    };
    let b = Side::new(dev, 1 << 16, 64);
    let mut qb = b.qp(QpType::Rc);
    qb.to_init(&InitParams {
        access: ALL,
        ..InitParams::default()
    })
    .unwrap();
    let psn = 0x100;
    qb.to_rtr(
        Qpn::from_wire(PEER_QPN),
        Psn::from_wire(psn),
        rnic_core::Gid::from_ipv4(peer),
        &rtr(Mtu::Mtu1024),
    )
    .unwrap();
    qb.to_rts(Psn::from_wire(0x900), &rts()).unwrap();
    for i in 0..16 {
        let sge = [b.mr.sge(i * 64, 64).unwrap()];
        qb.post_recv(&[RecvWr::new(i as u64, &sge)]).unwrap();
    }
    Some(Rig {
        b,
        qb,
        peer,
        me,
        raw,
        psn,
    })
}

impl Rig {
    /// Send a SEND_ONLY on the wire with `wire_ident`, its ICRC for
    /// `icrc_ident`; wait until the device counted it.
    fn send(&mut self, wire_ident: u16, icrc_ident: u16, payload: &[u8]) {
        let before = self.b.dev.stats().device.rx_packets;
        let pkt = send_only(
            self.peer,
            self.me,
            self.qb.qpn().get(),
            self.psn,
            payload,
            icrc_ident,
        );
        send_ip(&self.raw, self.peer, self.me, wire_ident, &pkt);
        let t = Instant::now();
        while self.b.dev.stats().device.rx_packets == before {
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "the device never saw it"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(5));
    }

    /// One honest SEND_ONLY per identification in `ids` (wire and ICRC
    /// alike), each completing successfully at the next PSN.
    fn deliver_each(&mut self, ids: &[u16], label: &str) {
        for (i, &id) in ids.iter().enumerate() {
            self.send(id, id, format!("{label} {i}").as_bytes());
            let wc = self.completions();
            assert_eq!(wc.len(), 1, "{label} {id:#x}: {wc:?}");
            assert_eq!(wc[0].status, WcStatus::Success);
            self.psn += 1;
        }
    }

    fn completions(&self) -> Vec<rnic_core::WorkCompletion> {
        let mut wcs = [rnic_core::WorkCompletion::default(); 16];
        let n = self.b.cq.poll(&mut wcs).unwrap();
        wcs[..n].to_vec()
    }
}

fn skip() {
    println!("SKIP: raw IPv4 sockets need CAP_NET_RAW (run the tests as root)");
}

#[test]
fn unpredictable_identifications_are_checked_in_all_32_bits_by_the_tap() {
    let Some(mut r) = rig(true, false) else {
        return skip();
    };
    // Random identifications: no prediction holds; the tap saw each.
    r.deliver_each(&[0x3b1f, 0x91c4, 0x0007, 0xfffe], "tapped");
    let d = r.b.dev.stats().device;
    assert_eq!(
        (d.icrc_ident_tap, d.icrc_recovered, d.icrc_unverified),
        (4, 0, 0),
        "{d:?}"
    );
    // A kernel-rxe-like counter: the first from the tap, then predicted.
    for k in 0..5u16 {
        r.send(0x7000 + k, 0x7000 + k, b"counter");
        assert_eq!(r.completions().len(), 1);
        r.psn += 1;
    }
    let d = r.b.dev.stats().device;
    assert!(d.icrc_ident_next >= 4, "{d:?}");
    assert_eq!(d.icrc_recovered, 0);
    // The forgery: identification 0x1111 on the wire, ICRC valid only for
    // 0x2222. The 15-bit solve would accept it; the tap knows better.
    r.send(0x1111, 0x2222, b"forged!!");
    assert!(r.completions().is_empty(), "a forged packet was accepted");
    let d2 = r.b.dev.stats().device;
    assert_eq!(d2.icrc_drops, d.icrc_drops + 1, "{d2:?}");
    assert_eq!(d2.icrc_recovered, 0);
    // The honest packet at the same PSN still lands.
    r.send(0x4321, 0x4321, b"honest");
    let wc = r.completions();
    assert_eq!((wc.len(), wc[0].status), (1, WcStatus::Success));
    assert_eq!(r.b.bytes(wc[0].wr_id as usize * 64, 6), b"honest");
}

/// A device receiving through the packet ring sees every IPv4 header, so
/// it checks each ICRC with the identification the packet carried: random
/// ones verify with no tap (it opens none) and no prediction, and a packet
/// whose ICRC holds only for another identification is refused — also
/// when that other one is 0 or the next of a counter, which a socket
/// device's predictions would have accepted. A duplicate is not delivered
/// twice.
#[test]
fn a_ring_device_checks_the_identification_each_packet_carries() {
    let Some(mut r) = rig_with(|cfg| cfg.with_rx_ring(true).with_ident_tap(true)) else {
        return skip();
    };
    r.deliver_each(&[0x3b1f, 0x91c4, 0x0007, 0, 0xfffe], "seen");
    let d = r.b.dev.stats().device;
    assert_eq!(
        (
            d.icrc_ident_seen,
            d.icrc_ident_tap,
            d.tap_drains,
            d.icrc_recovered
        ),
        (5, 0, 0, 0),
        "{d:?}"
    );
    assert_eq!(d.recvmmsg_calls, 0, "all through the ring: {d:?}");
    // Identification 0x1234 on the wire, ICRC for 0 (what a predictor tries
    // first), then for 0xffff (the previous + 1): both refused.
    for forged_for in [0u16, 0xffff] {
        let before = r.b.dev.stats().device.icrc_drops;
        r.send(0x1234, forged_for, b"forged!!");
        assert!(
            r.completions().is_empty(),
            "forged for {forged_for:#x} accepted"
        );
        assert_eq!(r.b.dev.stats().device.icrc_drops, before + 1);
    }
    r.send(0x1234, 0x1234, b"honest");
    let wc = r.completions();
    assert_eq!((wc.len(), wc[0].status), (1, WcStatus::Success));
    let slot = wc[0].wr_id as usize * 64;
    assert_eq!(r.b.bytes(slot, 6), b"honest");
    // The same PSN again (a duplicate on the wire, another identification
    // and other bytes): verified, answered, never delivered twice — no
    // receive is consumed and the next slot stays untouched.
    let next = r.b.bytes(slot + 64, 64);
    r.send(0x1235, 0x1235, b"replay");
    assert!(
        r.completions().is_empty(),
        "a duplicate completed a receive"
    );
    assert_eq!(r.b.bytes(slot, 6), b"honest");
    assert_eq!(r.b.bytes(slot + 64, 64), next);
    r.psn += 1;
    r.deliver_each(&[0x1236], "after the duplicate");
    let d = r.b.dev.stats().device;
    assert_eq!(d.icrc_ident_seen, d.icrc_ok, "{d:?}");
}

#[test]
fn without_a_tap_unpredictable_packets_are_dropped_unless_recovery_is_allowed() {
    let Some(mut r) = rig(false, false) else {
        return skip();
    };
    r.send(0x3b1f, 0x3b1f, b"no tap");
    assert!(r.completions().is_empty());
    let d = r.b.dev.stats().device;
    assert_eq!(
        (d.icrc_unverified, d.icrc_recovered, d.icrc_ident_tap),
        (1, 0, 0),
        "{d:?}"
    );

    // Opted in: the 15-bit check accepts the honest packet — and the forgery.
    let Some(mut r) = rig(false, true) else {
        return skip();
    };
    r.send(0x3b1f, 0x3b1f, b"solved");
    assert_eq!(r.completions().len(), 1);
    r.psn += 1;
    r.send(0x1111, 0x2222, b"forged!!");
    assert_eq!(
        r.completions().len(),
        1,
        "the 15-bit check cannot tell the forgery: why it is off by default"
    );
    let d = r.b.dev.stats().device;
    assert_eq!(d.icrc_recovered, 2, "{d:?}");
    let _ = SocketAddr::new(IpAddr::V4(r.peer), 0);
}

/// A long stream whose identifications the tap copies but the device
/// predicts (a kernel-rxe-like counter) drains the tap in batches, not at
/// every round (one system call per round trip before, issue 11) — and
/// late draining loses nothing: after a burst of more copies than the
/// tap's buffer could hold undrained, an unpredictable packet is still
/// verified by its copy.
#[test]
fn predicted_streams_drain_the_tap_in_batches_and_lose_no_copy() {
    let Some(mut r) = rig(true, false) else {
        return skip();
    };
    r.send(0x2000, 0x2000, b"first");
    assert_eq!(r.completions().len(), 1);
    // The same SEND again and again (duplicates of the PSN just taken: the
    // responder re-ACKs, no receive is used), identifications counting up.
    let dup = send_only(r.peer, r.me, r.qb.qpn().get(), r.psn, b"first", 0);
    let mut id = 0x2000u16;
    let mut stream = |r: &mut Rig, n: u64, pace: Option<Duration>| {
        let before = r.b.dev.stats().device;
        for _ in 0..n {
            id = id.wrapping_add(1);
            let mut p = dup.clone();
            icrc::fill_v4(r.peer, r.me, id, true, SPORT, 4791, &mut p).unwrap();
            send_ip(&r.raw, r.peer, r.me, id, &p);
            if let Some(d) = pace {
                // One packet per progress round: the thread sleeps between.
                std::thread::sleep(d);
            }
        }
        let t = Instant::now();
        while r.b.dev.stats().device.rx_packets < before.rx_packets + n {
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "the device never saw them all"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        let d = r.b.dev.stats().device;
        assert!(d.icrc_ident_next - before.icrc_ident_next >= n - 1, "{d:?}");
        (
            d.tap_drains - before.tap_drains,
            d.recvmmsg_calls - before.recvmmsg_calls,
        )
    };
    // Paced: nearly a round per packet, yet ~24-byte packets charged 1 KiB
    // each drain once per ~120.
    let (drains, rounds) = stream(&mut r, 600, Some(Duration::from_micros(200)));
    assert!(
        rounds > 300,
        "{rounds} receive rounds for 600 paced packets"
    );
    assert!(
        (1..=10).contains(&drains),
        "{drains} drains in {rounds} rounds"
    );
    // A burst of 6 000 copies: undrained they would overflow the tap.
    let (drains, _) = stream(&mut r, 6000, None);
    assert!(drains >= 10, "{drains} drains for 6 000 packets");
    r.psn += 1;
    let d = r.b.dev.stats().device;
    r.send(0x5a5a, 0x5a5a, b"after");
    let wc = r.completions();
    assert_eq!(wc.len(), 1, "{wc:?}");
    assert_eq!(wc[0].status, WcStatus::Success);
    assert_eq!(r.b.bytes(wc[0].wr_id as usize * 64, 5), b"after");
    let d2 = r.b.dev.stats().device;
    assert_eq!(d2.icrc_ident_tap, d.icrc_ident_tap + 1, "{d2:?}");
}
