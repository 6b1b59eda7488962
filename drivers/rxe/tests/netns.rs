//! The loopback conformance checks across two network namespaces joined by
//! a veth pair (real IPv4 routing, a 1500/9000-byte MTU, the veth's
//! GSO/GRO). Needs root and `ip`; prints SKIP otherwise. The namespaces are
//! removed by a guard, also when the test fails.
//!
//! Frame transmit (`rnic_rxe::frames`, with the packet ring) is checked
//! here too: across the veth to an on-link neighbour, and on a namespace's
//! own loopback, where it needs `accept_local` and `route_localnet`; in
//! both, frames reach a peer on the ring and one on the socket path.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::{IpAddr, Ipv4Addr};
use std::process::Command;

use common::*;
use nix::sched::{CloneFlags, setns};
use rnic_core::{Mtu, QpType, RecvWr, SendWr, WcStatus};
use rnic_roce::wire::icrc;
use rnic_rxe::{Progress, RxeConfig, RxeDevice, Target};

struct Netns {
    names: [String; 2],
}

impl Drop for Netns {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

fn ip(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .status()
        .is_ok_and(|s| s.success())
}

/// Two namespaces with a veth pair of `mtu` bytes, 10.213.<k>.1 and .2.
fn setup(tag: &str, k: u8, mtu: u32) -> Option<(Netns, [IpAddr; 2])> {
    if !nix::unistd::geteuid().is_root() {
        println!("SKIP: creating network namespaces needs root");
        return None;
    }
    let pid = std::process::id();
    let names = [format!("rnic-{tag}a-{pid}"), format!("rnic-{tag}b-{pid}")];
    let guard = Netns {
        names: names.clone(),
    };
    let (va, vb) = (
        format!("v{tag}a{}", pid % 100_000),
        format!("v{tag}b{}", pid % 100_000),
    );
    let addrs = [
        IpAddr::V4(Ipv4Addr::new(10, 213, k, 1)),
        IpAddr::V4(Ipv4Addr::new(10, 213, k, 2)),
    ];
    let mtu = mtu.to_string();
    let ok = ip(&["netns", "add", &names[0]])
        && ip(&["netns", "add", &names[1]])
        && ip(&[
            "link", "add", &va, "netns", &names[0], "type", "veth", "peer", "name", &vb, "netns",
            &names[1],
        ]);
    if !ok {
        println!("SKIP: `ip netns` / veth not available here");
        return None;
    }
    for (ns, dev, a) in [(&names[0], &va, addrs[0]), (&names[1], &vb, addrs[1])] {
        let cidr = format!("{a}/24");
        assert!(ip(&["-n", ns, "link", "set", dev, "mtu", &mtu]));
        assert!(ip(&["-n", ns, "addr", "add", &cidr, "dev", dev]));
        assert!(ip(&["-n", ns, "link", "set", dev, "up"]));
        assert!(ip(&["-n", ns, "link", "set", "lo", "up"]));
    }
    Some((guard, addrs))
}

/// Run `f` on a thread inside namespace `ns` (sockets it opens stay there).
fn in_ns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let ns = ns.to_owned();
    std::thread::spawn(move || {
        let f_ns = std::fs::File::open(format!("/var/run/netns/{ns}")).unwrap();
        setns(f_ns, CloneFlags::CLONE_NEWNET).unwrap();
        f()
    })
    .join()
    .unwrap()
}

/// Open a device from inside namespace `ns` (its sockets stay there).
fn open_in(ns: &str, addr: IpAddr) -> RxeDevice {
    in_ns(ns, move || open(addr, Progress::Thread))
}

/// Open a device with a packet ring (and frame transmit, the default with
/// it) inside namespace `ns`; `None` (printed) where there can be none.
fn open_ring_in(ns: &str, addr: IpAddr) -> Option<RxeDevice> {
    in_ns(ns, move || {
        open_ring(
            &RxeConfig::new(Target::Ip(addr))
                .with_progress(Progress::Thread)
                .with_rx_ring(true)
                .with_tx_frames(true),
        )
    })
}

fn across(tag: &str, k: u8, link_mtu: u32, mtu: Mtu) {
    let Some((ns, addrs)) = setup(tag, k, link_mtu) else {
        return;
    };
    let a = Side::new(open_in(&ns.names[0], addrs[0]), 4 << 20, 256);
    let b = Side::new(open_in(&ns.names[1], addrs[1]), 4 << 20, 256);
    traffic(tag, &a, &b, mtu);
    // The QPs were connected and posted from this thread, outside both
    // namespaces: their per-QP source-port sockets must still be bound in
    // the devices' namespaces (no fallback to the RoCE port).
    assert_eq!(a.dev.stats().device.sport_fallbacks, 0);
    assert_eq!(b.dev.stats().device.sport_fallbacks, 0);
    drop((a, b));
    drop(ns);
}

/// WRITE, SEND with immediate and READ of 0 B to 1 MiB around the path
/// MTU, and an atomic, from `a` to `b`; every byte checked, nothing
/// dropped for its ICRC, nothing too big.
fn traffic(tag: &str, a: &Side, b: &Side, mtu: Mtu) {
    // (active_mtu reads /sys/class/net, which shows the namespace sysfs was
    // mounted in, not the socket's: not checked here.)
    let (mut qa, mut qb) = (a.qp(QpType::Rc), b.qp(QpType::Rc));
    connect(a, &mut qa, b, &mut qb, mtu);
    let m = mtu.bytes() as usize;
    for (i, len) in [0usize, 1, m - 1, m, m + 1, 1 << 20]
        .into_iter()
        .enumerate()
    {
        let data = pattern(len, 77 + i as u32);
        a.fill(0, &data);
        let src = [a.mr.sge(0, len as u32).unwrap()];
        let src: &[rnic_core::Sge] = if len == 0 { &[] } else { &src };
        // WRITE
        qa.post_send(&[SendWr::rdma_write(1, src, b.mr.addr(), b.mr.rkey()).signaled()])
            .unwrap();
        assert_eq!(
            wait(&a.cq, 1, &[])[0].status,
            WcStatus::Success,
            "WRITE {len}"
        );
        assert_eq!(b.bytes(0, len), data, "WRITE {len}");
        // SEND with immediate
        let rsge = [b.mr.sge(2 << 20, (len + 1) as u32).unwrap()];
        qb.post_recv(&[RecvWr::new(2, &rsge)]).unwrap();
        qa.post_send(&[SendWr::send_with_imm(3, src, 42).signaled()])
            .unwrap();
        assert_eq!(wait(&a.cq, 1, &[])[0].status, WcStatus::Success);
        let wb = wait(&b.cq, 1, &[]);
        assert_eq!(
            (wb[0].status, wb[0].imm_data),
            (WcStatus::Success, Some(42))
        );
        assert_eq!(b.bytes(2 << 20, len), data, "SEND {len}");
        // READ back into a at 1 MiB
        let dst = [a.mr.sge(1 << 20, len as u32).unwrap()];
        let dst: &[rnic_core::Sge] = if len == 0 { &[] } else { &dst };
        qa.post_send(&[SendWr::rdma_read(4, dst, b.mr.addr(), b.mr.rkey()).signaled()])
            .unwrap();
        assert_eq!(
            wait(&a.cq, 1, &[])[0].status,
            WcStatus::Success,
            "READ {len}"
        );
        assert_eq!(a.bytes(1 << 20, len), data, "READ {len}");
    }
    // Atomics across the namespaces.
    b.fill(3 << 20, &5u64.to_ne_bytes());
    let res = [a.mr.sge(2 << 20, 8).unwrap()];
    qa.post_send(&[
        SendWr::atomic_fetch_add(5, &res, b.mr.addr() + (3 << 20), b.mr.rkey(), 10).signaled(),
    ])
    .unwrap();
    assert_eq!(wait(&a.cq, 1, &[])[0].status, WcStatus::Success);
    assert_eq!(a.bytes(2 << 20, 8), 5u64.to_ne_bytes());
    assert_eq!(b.bytes(3 << 20, 8), 15u64.to_ne_bytes());
    let s = b.dev.stats().device;
    println!("{tag}: receiver {s:?}");
    assert_eq!(s.icrc_drops, 0);
    assert_eq!(a.dev.stats().device.tx_too_big, 0);
    // Nothing was lost on the way (a frame the peer could not take would
    // have been retransmitted).
    for (d, q) in [(&a.dev, &qa), (&b.dev, &qb)] {
        let st = d.stats();
        let q = st.qp(q.qpn()).unwrap();
        assert_eq!((q.retransmits, q.timeouts), (0, 0), "{tag}: {q:?}");
    }
}

/// Both directions of [`traffic`] between `a` and `b`; then what each sent
/// as frames, checking that nothing was refused and that every packet the
/// receivers took was verified in all 32 ICRC bits.
fn both_ways(tag: &str, a: &Side, b: &Side, mtu: Mtu) -> (u64, u64) {
    traffic(tag, a, b, mtu);
    traffic(tag, b, a, mtu);
    let (sa, sb) = (a.dev.stats().device, b.dev.stats().device);
    for (who, s) in [("a", &sa), ("b", &sb)] {
        assert_eq!(s.tx_frame_fallbacks, 0, "{tag} {who}: {s:?}");
        assert_eq!(s.icrc_ok, s.rx_packets, "{tag} {who}: {s:?}");
        assert_eq!(s.tx_errors, 0, "{tag} {who}: {s:?}");
    }
    (sa.tx_frames, sb.tx_frames)
}

#[test]
fn veth_frames_reach_an_on_link_neighbour_on_either_receive_path() {
    let Some((ns, addrs)) = setup("f", 3, 1500) else {
        return;
    };
    let Some(da) = open_ring_in(&ns.names[0], addrs[0]) else {
        return;
    };
    let db = open_ring_in(&ns.names[1], addrs[1]).unwrap();
    assert!(da.tx_frames() && db.tx_frames());
    let (a, b) = (Side::new(da, 4 << 20, 256), Side::new(db, 4 << 20, 256));
    let (fa, fb) = both_ways("veth ring-ring", &a, &b, Mtu::Mtu1024);
    // Both learned the other's MAC address from its frames, and the
    // kernel's neighbour table agreed: requests and ACKs left as frames.
    assert!(fa > 0 && fb > 0, "frames: a {fa}, b {fb}");
    drop((a, b));
    // A ring device and one on the socket path: the frames go through the
    // peer's IP and UDP input like any datagram.
    let da = open_ring_in(&ns.names[0], addrs[0]).unwrap();
    let b = Side::new(open_in(&ns.names[1], addrs[1]), 4 << 20, 256);
    assert!(!b.dev.tx_frames());
    let a = Side::new(da, 4 << 20, 256);
    let (fa, fb) = both_ways("veth ring-socket", &a, &b, Mtu::Mtu1024);
    assert!(fa > 0, "the ring device sent frames");
    assert_eq!(fb, 0);
    assert!(b.dev.stats().device.recvmmsg_calls > 0);
    drop((a, b));
    drop(ns);
}

/// Set lo's `accept_local` and `route_localnet` in namespace `ns`.
fn lo_sysctls(ns: &str, v: &str) -> bool {
    ip(&[
        "netns",
        "exec",
        ns,
        "sysctl",
        "-q",
        "-w",
        &format!("net.ipv4.conf.lo.accept_local={v}"),
        &format!("net.ipv4.conf.lo.route_localnet={v}"),
    ])
}

/// What frames put on the wire, captured in the namespace: the headers a
/// DF socket writes (identification 0, DF, the address vector's TOS and
/// TTL, a valid header checksum), UDP checksum 0 on single datagrams, and
/// packets whose whole-packet ICRC verifies.
#[test]
fn frames_on_the_wire_carry_what_the_socket_would() {
    let Some((ns, _)) = setup("w", 5, 1500) else {
        return;
    };
    let n = ns.names[0].clone();
    assert!(lo_sysctls(&n, "1"));
    let Some(cap) = in_ns(&n, capture_socket) else {
        return;
    };
    let (ia, ib) = (Ipv4Addr::new(127, 0, 0, 1), Ipv4Addr::new(127, 0, 0, 2));
    let Some(da) = open_ring_in(&n, IpAddr::V4(ia)) else {
        return;
    };
    let db = open_ring_in(&n, IpAddr::V4(ib)).unwrap();
    let (a, b) = (Side::new(da, 1 << 20, 64), Side::new(db, 1 << 20, 64));
    let (mut qa, mut qb) = (a.qp(QpType::Rc), b.qp(QpType::Rc));
    connect_marked(&a, &mut qa, &b, &mut qb);
    // Ping-pong SENDs (each answer carries the ACK of the request before
    // it: two-packet GSO frames), then a 64 KiB WRITE (GSO frames of
    // MIDDLE packets).
    for i in 0..20u32 {
        let (from, to, qf, qt) = if i % 2 == 0 {
            (&a, &b, &mut qa, &mut qb)
        } else {
            (&b, &a, &mut qb, &mut qa)
        };
        let rsge = [to.mr.sge(0, 64).unwrap()];
        qt.post_recv(&[RecvWr::new(1, &rsge)]).unwrap();
        let src = [from.mr.sge(0, 64).unwrap()];
        qf.post_send(&[SendWr::send(2, &src).signaled()]).unwrap();
        assert_eq!(wait(&from.cq, 1, &[])[0].status, WcStatus::Success);
        assert_eq!(wait(&to.cq, 1, &[])[0].status, WcStatus::Success);
    }
    let big = [a.mr.sge(0, 65536).unwrap()];
    qa.post_send(&[SendWr::rdma_write(3, &big, b.mr.addr(), b.mr.rkey()).signaled()])
        .unwrap();
    assert_eq!(wait(&a.cq, 1, &[])[0].status, WcStatus::Success);
    let (sa, sb) = (a.dev.stats().device, b.dev.stats().device);
    assert!(sa.tx_frames > 0 && sb.tx_frames > 0, "{sa:?} {sb:?}");
    let got = captured_v4(&cap, ia, ib, 2);
    let (mut singles, mut supers) = (0, 0);
    for ip in &got {
        assert_eq!(&ip[4..8], &[0, 0, 0x40, 0], "identification 0, DF");
        assert_eq!(
            (ip[1], ip[8]),
            (MARK_TCLASS, MARK_HOPS),
            "TOS and TTL of the address vector"
        );
        assert_eq!(
            rnic_roce::wire::ip::internet_checksum(&ip[..20]),
            0,
            "IPv4 header checksum"
        );
        let udp_payload = usize::from(u16::from_be_bytes([ip[24], ip[25]])) - 8;
        if udp_payload <= 1060 {
            icrc::verify(ip).expect("whole-packet ICRC of a captured frame");
            singles += 1;
        } else {
            supers += 1;
        }
    }
    println!("captured {singles} single datagrams, {supers} GSO frames; {sa:?}");
    assert!(singles > 0 && supers > 0, "{singles} singles, {supers} GSO");
    drop((qa, qb, a, b));
    drop(ns);
}

#[test]
fn loopback_frames_need_accept_local_and_route_localnet() {
    let Some((ns, _)) = setup("l", 4, 1500) else {
        return;
    };
    let n = ns.names[0].clone();
    let ips = [
        IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1)),
        IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)),
    ];
    // A fresh namespace has both off: a frame looped back would be a
    // martian to IP input, so none is sent, and everything still arrives.
    let Some(da) = open_ring_in(&n, ips[0]) else {
        return;
    };
    let db = open_ring_in(&n, ips[1]).unwrap();
    let (a, b) = (Side::new(da, 4 << 20, 256), Side::new(db, 4 << 20, 256));
    assert_eq!(
        both_ways("lo, sysctls off", &a, &b, Mtu::Mtu4096),
        (0, 0),
        "no frames without the sysctls"
    );
    drop((a, b));
    assert!(lo_sysctls(&n, "1"));
    let da = open_ring_in(&n, ips[0]).unwrap();
    let db = open_ring_in(&n, ips[1]).unwrap();
    let (a, b) = (Side::new(da, 4 << 20, 256), Side::new(db, 4 << 20, 256));
    let (fa, fb) = both_ways("lo ring-ring", &a, &b, Mtu::Mtu4096);
    assert!(fa > 0 && fb > 0, "frames: a {fa}, b {fb}");
    drop((a, b));
    // With the sysctls, IP input takes them: a socket-path peer receives.
    let da = open_ring_in(&n, ips[0]).unwrap();
    let (a, b) = (
        Side::new(da, 4 << 20, 256),
        Side::new(
            in_ns(&n, move || open(ips[1], Progress::Thread)),
            4 << 20,
            256,
        ),
    );
    let (fa, _) = both_ways("lo ring-socket", &a, &b, Mtu::Mtu4096);
    assert!(fa > 0, "the ring device sent frames");
    assert!(b.dev.stats().device.recvmmsg_calls > 0);
    drop((a, b));
    drop(ns);
}

#[test]
fn veth_mtu_1500_path_mtu_1024() {
    across("x", 1, 1500, Mtu::Mtu1024);
}

#[test]
fn veth_mtu_9000_path_mtu_4096() {
    across("y", 2, 9000, Mtu::Mtu4096);
}
