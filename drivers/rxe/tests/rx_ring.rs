//! The packet-ring receive path (`RxeConfig::rx_ring`, issue 30): every
//! datagram to a ring device's address arrives through its `TPACKET_V2`
//! ring — its UDP socket drops all it receives, so a transfer that lands
//! proves the ring delivered it — byte-exact, with every ICRC verified in
//! all 32 bits, for single packets and for UDP GSO datagrams that the
//! loopback delivers whole (their segment size from the virtio-net header);
//! with a progress thread (epoll on the ring's socket) and caller-driven;
//! against a device on the socket path; under seeded loss and reordering;
//! and a malformed datagram is counted and dropped. Every ICRC is checked
//! with the identification of the header the ring saw. Needs root (CAP_NET_RAW) and Linux 6.2+: skipped with a
//! message otherwise.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use rnic_core::{Mtu, QpType, RecvWr, SendWr, WcStatus};
use rnic_rxe::{FaultConfig, Progress, RxeConfig, RxeDevice, Target};

const LEN: usize = 2 << 20;

/// A ring device on `ip`, or `None` (printed) where this machine cannot
/// have one.
fn ring_device(ip: std::net::IpAddr, progress: Progress) -> Option<RxeDevice> {
    ring_device_with(ip, progress, FaultConfig::default())
}

/// [`ring_device`] losing and reordering received packets as `faults` says.
fn ring_device_with(
    ip: std::net::IpAddr,
    progress: Progress,
    faults: FaultConfig,
) -> Option<RxeDevice> {
    open_ring(
        &RxeConfig::new(Target::Ip(ip))
            .with_progress(progress)
            .with_faults(faults)
            .with_rx_ring(true),
    )
}

/// WRITEs of 8 B to 1 MiB (the large ones leave in GSO datagrams), READs
/// of the same back, and a SEND, from `a` to `b`; every byte checked.
/// `kick` are caller-driven devices the waits must progress.
fn exchange(a: &Side, b: &Side, kick: &[&RxeDevice]) {
    let (mut qa, mut qb) = (a.qp(QpType::Rc), b.qp(QpType::Rc));
    connect(a, &mut qa, b, &mut qb, Mtu::Mtu1024);
    for (i, len) in [8usize, 1024, 1025, 100_000, 1 << 20]
        .into_iter()
        .enumerate()
    {
        let data = rnic_testkit::pattern(len, 0x50 + i as u32);
        write_then_read_back(a, &mut qa, b, LEN / 2, &data, kick);
    }
    let msg = rnic_testkit::pattern(3000, 9);
    a.fill(0, &msg);
    let rsge = [b.mr.sge(0, 4096).unwrap()];
    qb.post_recv(&[RecvWr::new(7, &rsge)]).unwrap();
    let s = [a.mr.sge(0, 3000).unwrap()];
    qa.post_send(&[SendWr::send(3, &s).signaled()]).unwrap();
    assert_eq!(wait(&a.cq, 1, kick)[0].status, WcStatus::Success);
    let wc = wait(&b.cq, 1, kick);
    assert_eq!((wc[0].status, wc[0].byte_len), (WcStatus::Success, 3000));
    assert!(b.bytes(0, 3000) == msg, "SEND bytes differ");
}

/// Everything `d` received came through its ring, verified in all 32 bits.
fn assert_ring_only(d: &RxeDevice, who: &str) {
    let s = d.stats().device;
    assert_eq!(d.rx_rings(), (1, 1), "{who}");
    assert_eq!(
        s.recvmmsg_calls, 0,
        "{who}: nothing through the socket: {s:?}"
    );
    assert!(s.ring_batches > 0 && s.rx_packets > 0, "{who}: {s:?}");
    assert_eq!(s.icrc_ok, s.rx_packets, "{who}: every ICRC verified: {s:?}");
    assert_eq!(
        s.icrc_ident_seen, s.icrc_ok,
        "{who}: each with the identification its header carried: {s:?}"
    );
    assert_eq!(s.tap_drains, 0, "{who}: a ring device needs no tap: {s:?}");
    assert_eq!(s.rx_malformed, 0, "{who}: {s:?}");
}

#[test]
fn two_ring_devices_carry_writes_reads_and_sends_both_progress_modes() {
    for progress in [Progress::Caller, Progress::Thread] {
        let (ia, ib) = ip_pair();
        let Some(da) = ring_device(ia, progress) else {
            return;
        };
        let db = ring_device(ib, progress).unwrap();
        let (a, b) = (
            Side::new(da, LEN + 4096, 512),
            Side::new(db, LEN + 4096, 512),
        );
        let kick: Vec<&RxeDevice> = match progress {
            Progress::Caller => vec![&a.dev, &b.dev],
            Progress::Thread => vec![],
        };
        exchange(&a, &b, &kick);
        assert_ring_only(&a.dev, "a");
        assert_ring_only(&b.dev, "b");
        // The 1 MiB WRITE reached b in GSO datagrams handed over whole.
        let sb = b.dev.stats().device;
        assert!(
            sb.gro_datagrams > 0 && sb.gro_segments > sb.gro_datagrams,
            "{sb:?}"
        );
    }
}

#[test]
fn a_ring_device_talks_to_a_socket_device_and_drops_a_malformed_datagram() {
    let (ia, ib) = ip_pair();
    let Some(da) = ring_device(ia, Progress::Thread) else {
        return;
    };
    let db = open(ib, Progress::Thread);
    let (a, b) = (
        Side::new(da, LEN + 4096, 512),
        Side::new(db, LEN + 4096, 512),
    );
    // Five bytes of garbage to the ring's port: counted, nothing else moves.
    let junk = std::net::UdpSocket::bind((ib, 0)).unwrap();
    junk.send_to(b"hello", (ia, 4791)).unwrap();
    let start = std::time::Instant::now();
    while a.dev.stats().device.rx_malformed == 0 {
        assert!(start.elapsed().as_secs() < 10, "{:?}", a.dev.stats().device);
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    exchange(&a, &b, &[]);
    exchange(&b, &a, &[]);
    let sa = a.dev.stats().device;
    assert_eq!(sa.rx_malformed, 1, "{sa:?}");
    assert_eq!(sa.recvmmsg_calls, 0, "{sa:?}");
    assert_eq!(sa.icrc_ok, sa.rx_packets - 1, "{sa:?}");
    assert_eq!(b.dev.rx_rings(), (0, 1));
    assert!(b.dev.stats().device.recvmmsg_calls > 0);
}

/// Loss and reordering on both receive paths of two ring devices (2 % of
/// packets lost, 2 % delivered after the next, seeded): RC recovers and
/// every byte still lands; the faults were really injected.
#[test]
fn ring_devices_recover_from_loss_and_reordering() {
    let faults = |seed| FaultConfig {
        seed,
        drop_ppm: 20_000,
        reorder_ppm: 20_000,
    };
    let (ia, ib) = ip_pair();
    let Some(da) = ring_device_with(ia, Progress::Thread, faults(7)) else {
        return;
    };
    let db = ring_device_with(ib, Progress::Thread, faults(11)).unwrap();
    let (a, b) = (
        Side::new(da, LEN + 4096, 512),
        Side::new(db, LEN + 4096, 512),
    );
    exchange(&a, &b, &[]);
    let (sa, sb) = (a.dev.stats().device, b.dev.stats().device);
    assert_eq!((sa.recvmmsg_calls, sb.recvmmsg_calls), (0, 0));
    assert!(sb.fault_drops > 0 && sb.fault_reordered > 0, "{sb:?}");
}
