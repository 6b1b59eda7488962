//! IPv6 GIDs end to end: two rnic-rxe devices on IPv6 addresses run every
//! RC operation (SEND/RECV, WRITE, WRITE with immediate, READ, CMP_SWP,
//! FETCH_ADD) at the sizes around each MTU and 1 MiB, and UD sends, with
//! byte-exact memory on both sides and every received packet's ICRC
//! verified (`icrc_ok == rx_packets`, no IPv4 identification path used).
//!
//! * **`lo_*`**: two extra IPv6 addresses on `lo` (unique per test, `nodad`,
//!   removed by a guard also when the test fails), one device on each.
//! * **`netns_*`**: two network namespaces joined by a veth pair carrying
//!   IPv4, a global IPv6 and a link-local IPv6 address each; the devices open
//!   the whole interface (`Target::Netdev`), so the GID table mixes families
//!   and the tests pick the GID index they mean.
//! * **`wire_*`**: an AF_PACKET capture of an exchange over the `lo` of a
//!   namespace of its own (so it sees nothing else): every IPv6 packet's
//!   ICRC (whole-packet and UDP-payload forms), GSO super-packets segment by
//!   segment, and the header fields the ICRC masks.
//! * **`mixed_*`**: an IPv4 source GID towards an IPv6 destination (and the
//!   other mismatches `Sink::route` cannot send) is refused at modify-QP and
//!   post time with a reason.
//!
//! Everything but `mixed_families_are_refused_with_a_reason` needs root (it
//! adds addresses, namespaces, raw sockets) and prints SKIP otherwise.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::process::Command;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use common::*;
use nix::sched::{CloneFlags, setns};
use nix::sys::socket::{LinkAddr, recvfrom};
use rnic_core::{
    AddressVector, AvError, Gid, InitParams, Mtu, PostError, Psn, QpState, QpType, QueuePair,
    RecvWr, RtrParams, SendWr, Sge, VerbsError, WcFlags, WcOpcode, WcStatus,
};
use rnic_roce::wire::icrc;
use rnic_rxe::{Progress, RxeConfig, RxeDevice, Target, qp_udp_sport, rc_udp_sport};

const MIB: usize = 1 << 20;
/// Per-side buffer: sources at 0, SEND target at 1 MiB, WRITE/READ
/// target at 2 MiB, receives of WRITE_IMM and atomics at 3 MiB.
const BUF: usize = 4 * MIB;
const QKEY: u32 = 0x1111_1111;

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

fn ipv6_enabled() -> bool {
    std::fs::read_to_string("/proc/sys/net/ipv6/conf/lo/disable_ipv6")
        .is_ok_and(|s| s.trim() == "0")
}

fn ip(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .status()
        .is_ok_and(|s| s.success())
}

fn v6(ip: IpAddr) -> Ipv6Addr {
    match ip {
        IpAddr::V6(a) => a,
        IpAddr::V4(a) => panic!("{a} is not IPv6"),
    }
}

// ---------------------------------------------------------------------------
// Addresses on lo
// ---------------------------------------------------------------------------

/// IPv6 addresses added to `lo`, deleted when dropped (also on panic).
struct LoAddrs(Vec<Ipv6Addr>);

impl Drop for LoAddrs {
    fn drop(&mut self) {
        for a in &self.0 {
            let cidr = format!("{a}/128");
            let _ = Command::new("ip")
                .args(["-6", "addr", "del", &cidr, "dev", "lo"])
                .status();
        }
    }
}

/// Two fresh IPv6 addresses on `lo`, `fd00:4791:1:<pid>:<pid>:<n>:0:1` and
/// `…:2`, unique per test and per process, usable at once (`nodad`).
fn lo_pair() -> Option<(LoAddrs, [IpAddr; 2])> {
    if !is_root() {
        println!("SKIP: adding IPv6 addresses to lo needs root");
        return None;
    }
    if !ipv6_enabled() {
        println!("SKIP: IPv6 is disabled on lo");
        return None;
    }
    static NEXT: AtomicU16 = AtomicU16::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let pid = std::process::id();
    let addr = |last| {
        Ipv6Addr::new(
            0xfd00,
            0x4791,
            1,
            pid as u16,
            (pid >> 16) as u16,
            n,
            0,
            last,
        )
    };
    let mut guard = LoAddrs(Vec::new());
    for a in [addr(1), addr(2)] {
        let cidr = format!("{a}/128");
        if !ip(&["-6", "addr", "add", &cidr, "dev", "lo", "nodad"]) {
            println!("SKIP: `ip -6 addr add {cidr} dev lo nodad` failed");
            return None;
        }
        guard.0.push(a);
    }
    let ips = [IpAddr::V6(guard.0[0]), IpAddr::V6(guard.0[1])];
    Some((guard, ips))
}

// ---------------------------------------------------------------------------
// Two namespaces over a veth pair
// ---------------------------------------------------------------------------

struct Netns {
    names: Vec<String>,
}

impl Drop for Netns {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

/// Two namespaces joined by a veth pair; side `i` has `10.214.k.(i+1)/24`,
/// `fd00:4791:k::(i+1)/64` and `fe80::4791:k:(i+1)/64` (no automatic
/// link-local address; all `nodad`, so usable at once).
struct Net6 {
    ns: Netns,
    devs: [String; 2],
    v4: [Ipv4Addr; 2],
    global: [Ipv6Addr; 2],
    link_local: [Ipv6Addr; 2],
}

fn netns6(tag: &str, k: u16, mtu: u32) -> Option<Net6> {
    if !is_root() {
        println!("SKIP: creating network namespaces needs root");
        return None;
    }
    if !ipv6_enabled() {
        println!("SKIP: IPv6 is disabled here");
        return None;
    }
    let pid = std::process::id();
    let names = [format!("rnic-6{tag}a-{pid}"), format!("rnic-6{tag}b-{pid}")];
    let ns = Netns {
        names: names.to_vec(),
    };
    let devs = [
        format!("v6{tag}a{}", pid % 100_000),
        format!("v6{tag}b{}", pid % 100_000),
    ];
    let ok = ip(&["netns", "add", &names[0]])
        && ip(&["netns", "add", &names[1]])
        && ip(&[
            "link", "add", &devs[0], "netns", &names[0], "type", "veth", "peer", "name", &devs[1],
            "netns", &names[1],
        ]);
    if !ok {
        println!("SKIP: `ip netns` / veth not available here");
        return None;
    }
    let v4 = [
        Ipv4Addr::new(10, 214, k as u8, 1),
        Ipv4Addr::new(10, 214, k as u8, 2),
    ];
    let global = [
        Ipv6Addr::new(0xfd00, 0x4791, k, 0, 0, 0, 0, 1),
        Ipv6Addr::new(0xfd00, 0x4791, k, 0, 0, 0, 0, 2),
    ];
    let link_local = [
        Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0x4791, k, 1),
        Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0x4791, k, 2),
    ];
    let mtu = mtu.to_string();
    for i in 0..2 {
        let (n, d) = (names[i].as_str(), devs[i].as_str());
        let (a4, g, ll) = (
            format!("{}/24", v4[i]),
            format!("{}/64", global[i]),
            format!("{}/64", link_local[i]),
        );
        assert!(ip(&[
            "-n",
            n,
            "link",
            "set",
            "dev",
            d,
            "addrgenmode",
            "none"
        ]));
        assert!(ip(&["-n", n, "link", "set", "dev", d, "mtu", &mtu]));
        assert!(ip(&["-n", n, "addr", "add", &a4, "dev", d]));
        assert!(ip(&["-n", n, "-6", "addr", "add", &g, "dev", d, "nodad"]));
        assert!(ip(&["-n", n, "-6", "addr", "add", &ll, "dev", d, "nodad"]));
        assert!(ip(&["-n", n, "link", "set", "dev", d, "up"]));
        assert!(ip(&["-n", n, "link", "set", "dev", "lo", "up"]));
    }
    Some(Net6 {
        ns,
        devs,
        v4,
        global,
        link_local,
    })
}

/// A namespace of its own with `fd00:4791:ff::1` and `::2` on its `lo`
/// (`nodad`): a capture there sees this test's packets only.
fn netns_lo(tag: &str) -> Option<(Netns, [IpAddr; 2])> {
    if !is_root() {
        println!("SKIP: creating a network namespace needs root");
        return None;
    }
    if !ipv6_enabled() {
        println!("SKIP: IPv6 is disabled here");
        return None;
    }
    let name = format!("rnic-6{tag}-{}", std::process::id());
    let ns = Netns {
        names: vec![name.clone()],
    };
    if !ip(&["netns", "add", &name]) {
        println!("SKIP: `ip netns` not available here");
        return None;
    }
    assert!(ip(&["-n", &name, "link", "set", "dev", "lo", "up"]));
    let ends = [
        Ipv6Addr::new(0xfd00, 0x4791, 0xff, 0, 0, 0, 0, 1),
        Ipv6Addr::new(0xfd00, 0x4791, 0xff, 0, 0, 0, 0, 2),
    ];
    for a in ends {
        let cidr = format!("{a}/128");
        assert!(ip(&[
            "-n", &name, "-6", "addr", "add", &cidr, "dev", "lo", "nodad"
        ]));
    }
    Some((ns, ends.map(IpAddr::V6)))
}

/// Run `f` in a thread inside namespace `ns` (sockets it opens stay there).
fn in_ns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let path = format!("/var/run/netns/{ns}");
    std::thread::spawn(move || {
        let file = std::fs::File::open(path).unwrap();
        setns(file, CloneFlags::CLONE_NEWNET).unwrap();
        f()
    })
    .join()
    .unwrap()
}

/// Open the whole interface `dev` of namespace `ns`.
fn open_netdev_in(ns: &str, dev: &str) -> RxeDevice {
    let dev = dev.to_owned();
    in_ns(ns, move || {
        RxeDevice::open(&RxeConfig::new(Target::Netdev(dev))).expect("open rxe on the veth")
    })
}

/// The GID-table index of `gid` on `dev`.
fn index_of(dev: &RxeDevice, gid: Gid) -> u8 {
    let gids = dev.gids();
    let i = gids
        .iter()
        .position(|g| *g == gid)
        .unwrap_or_else(|| panic!("{gid} not in the GID table {gids:?}"));
    u8::try_from(i).unwrap()
}

// ---------------------------------------------------------------------------
// What every test checks
// ---------------------------------------------------------------------------

/// The device received only IPv6 RoCE and verified every packet with all
/// 32 ICRC bits, sent everything it queued, and routed every packet.
fn assert_clean_v6(dev: &RxeDevice, who: &str) {
    let s = dev.stats().device;
    assert!(s.rx_packets > 0, "{who} received nothing: {s:?}");
    assert_eq!(
        s.icrc_ok, s.rx_packets,
        "{who}: every packet verified: {s:?}"
    );
    assert_eq!(s.icrc_drops, 0, "{who}: {s:?}");
    assert_eq!(s.icrc_recovered, 0, "{who}: {s:?}");
    assert_eq!(
        s.icrc_ident_zero + s.icrc_ident_gro + s.icrc_ident_next,
        0,
        "{who}: IPv6 has no identification to predict: {s:?}"
    );
    assert_eq!(s.rx_malformed, 0, "{who}: {s:?}");
    assert_eq!(s.unknown_qpn, 0, "{who}: {s:?}");
    assert_eq!(s.tx_bad_sgid, 0, "{who}: {s:?}");
    assert_eq!(s.tx_errors, 0, "{who}: {s:?}");
}

/// UD QPs on `a` and `b`, at RTS with path MTU `mtu`.
fn ud_pair(a: &Side, b: &Side, mtu: Mtu) -> (QueuePair, QueuePair) {
    let (mut qa, mut qb) = (a.qp(QpType::Ud), b.qp(QpType::Ud));
    let init = InitParams {
        qkey: QKEY,
        ..InitParams::default()
    };
    for q in [&mut qa, &mut qb] {
        q.to_init(&init).unwrap();
        q.to_rtr(
            rnic_core::Qpn::from_wire(0),
            Psn::from_wire(0),
            Gid::ZERO,
            &rtr(mtu),
        )
        .unwrap();
        q.to_rts(Psn::from_wire(0x22), &rts()).unwrap();
    }
    (qa, qb)
}

/// UD SENDs (with immediate) of `lens` from `qa` (source GID index
/// `sgid_index`) to `qb` at `dgid`; checks the payload behind the 40-byte
/// GRH area and that the area carries an IPv6 version nibble and the
/// sender's IPv6 GID as source. Returns the last GRH area.
#[allow(clippy::too_many_arguments)]
fn ud_sends(
    a: &Side,
    qa: &mut QueuePair,
    sgid_index: u8,
    b: &Side,
    qb: &mut QueuePair,
    dgid: Gid,
    lens: &[usize],
) -> Vec<u8> {
    let sgid = a.dev.gids()[usize::from(sgid_index)];
    let mut grh = Vec::new();
    for &len in lens {
        let data = pattern(len, 0x0d00 + len as u32);
        a.fill(0, &data);
        b.fill(0, &vec![0xEE; 40 + len + 1]);
        let rsge = [b.mr.sge(0, 40 + 4096).unwrap()];
        qb.post_recv(&[RecvWr::new(9, &rsge)]).unwrap();
        let src = [a.mr.sge(0, len as u32).unwrap()];
        let src: &[Sge] = if len == 0 { &[] } else { &src };
        let ah =
            a.pd.create_ah(&AddressVector {
                sgid_index,
                ..AddressVector::new(dgid)
            })
            .unwrap();
        qa.post_send(&[SendWr::send_with_imm(10, src, 0x6d6d)
            .to_ud(ah.ud_dest(qb.qpn(), QKEY))
            .signaled()])
            .unwrap();
        assert_eq!(wait(&a.cq, 1, &[&b.dev])[0].status, WcStatus::Success);
        let wb = wait_seen(&b.cq, 1, &[&a.dev], &[&a.dev, &b.dev]);
        assert_eq!(wb[0].status, WcStatus::Success, "UD {len}");
        assert_eq!(wb[0].src_qp, qa.qpn());
        assert_eq!(wb[0].byte_len, 40 + len as u32);
        assert_eq!(wb[0].imm_data, Some(0x6d6d));
        assert!(wb[0].wc_flags.contains(WcFlags::GRH));
        assert!(b.bytes(40, len) == data, "UD {len}: payload differs");
        assert_eq!(b.bytes(40 + len, 1), [0xEE], "UD {len} overran");
        grh = b.bytes(0, 40);
        assert_eq!(grh[0] >> 4, 6, "GRH area: version 6");
        // Where an IPv6 header (what kernel rxe copies there for IPv6)
        // carries its source address.
        assert_eq!(
            &grh[8..24],
            sgid.raw(),
            "GRH area source = the sender's IPv6 GID"
        );
    }
    grh
}

// ---------------------------------------------------------------------------
// lo
// ---------------------------------------------------------------------------

/// Two devices on IPv6 addresses of `lo`, every RC operation at `mtu`.
fn lo_every_op(mtu: Mtu, progress: Progress) {
    let Some((_addrs, [ia, ib])) = lo_pair() else {
        return;
    };
    let a = Side::new(open(ia, progress), BUF, 256);
    let b = Side::new(open(ib, progress), BUF, 256);
    // One IPv6 GID each, the address itself, at index 0.
    assert_eq!(a.dev.gids(), [Gid::from_ipv6(v6(ia))]);
    assert_eq!(b.dev.gids(), [Gid::from_ipv6(v6(ib))]);
    assert_eq!(a.gid().to_ipv4(), None);
    // lo's 64 KiB MTU allows 4096.
    assert_eq!(a.dev.active_mtu(), Mtu::Mtu4096);
    let (mut qa, mut qb) = (a.qp(QpType::Rc), b.qp(QpType::Rc));
    connect_at(&a, &mut qa, 0, &b, &mut qb, 0, mtu);
    every_rc_op(&a, &mut qa, &b, &mut qb, &sizes(mtu));
    assert_clean_v6(&a.dev, "requester");
    assert_clean_v6(&b.dev, "responder");
    // lo takes UDP GSO and GRO over IPv6 as over IPv4: the 1 MiB messages
    // left in GSO sends and arrived in GRO datagrams, every segment verified.
    let (sa, s) = (a.dev.stats().device, b.dev.stats());
    if a.dev.gso() {
        assert!(sa.gso_sends > 0 && sa.gso_segments > sa.gso_sends, "{sa:?}");
    }
    if b.dev.gro() {
        assert!(
            s.device.gro_segments > s.device.gro_datagrams,
            "{:?}",
            s.device
        );
    }
    let q = s.qp(qb.qpn()).unwrap();
    assert!(q.rx_packets > 0 && q.tx_packets > 0, "{q:?}");
    drop((qa, qb, a, b));
}

#[test]
fn lo_every_rc_op_mtu_1024() {
    lo_every_op(Mtu::Mtu1024, Progress::Thread);
}

#[test]
fn lo_every_rc_op_mtu_4096() {
    lo_every_op(Mtu::Mtu4096, Progress::Thread);
}

#[test]
fn lo_every_rc_op_caller_driven_mtu_2048() {
    lo_every_op(Mtu::Mtu2048, Progress::Caller);
}

#[test]
fn lo_ud_grh_carries_the_ipv6_gids() {
    let Some((_addrs, [ia, ib])) = lo_pair() else {
        return;
    };
    let a = Side::new(open(ia, Progress::Thread), MIB, 64);
    let b = Side::new(open(ib, Progress::Thread), MIB, 64);
    let (mut qa, mut qb) = ud_pair(&a, &b, Mtu::Mtu1024);
    let grh = ud_sends(&a, &mut qa, 0, &b, &mut qb, b.gid(), &[0, 1, 1023, 1024]);
    // The destination half: b's own (single) GID.
    assert_eq!(&grh[24..40], b.gid().raw());
    // Over the port's MTU (a UD datagram's limit, as kernel rxe's, whatever
    // the RTR path MTU says: 4096 on lo): refused locally, nothing sent.
    let before = a.dev.stats().device.tx_packets;
    let over = a.dev.active_mtu().bytes() + 1;
    let src = [a.mr.sge(0, over).unwrap()];
    let ah = a.pd.create_ah(&AddressVector::new(b.gid())).unwrap();
    qa.post_send(&[SendWr::ud_send(11, &src, &ah, qb.qpn(), QKEY).signaled()])
        .unwrap();
    assert_eq!(wait(&a.cq, 1, &[])[0].status, WcStatus::LocLenErr);
    assert_eq!(a.dev.stats().device.tx_packets, before);
    assert_clean_v6(&b.dev, "UD receiver");
}

// ---------------------------------------------------------------------------
// Two namespaces
// ---------------------------------------------------------------------------

/// Open both sides of `net` and check their GID tables: the link-local
/// GID first (rxe's default GID), then IPv4, then the global IPv6 one.
fn netns_sides(net: &Net6) -> (Side, Side) {
    let a = Side::new(open_netdev_in(&net.ns.names[0], &net.devs[0]), BUF, 256);
    let b = Side::new(open_netdev_in(&net.ns.names[1], &net.devs[1]), BUF, 256);
    for (i, s) in [&a, &b].into_iter().enumerate() {
        assert_eq!(
            s.dev.gids(),
            [
                Gid::from_ipv6(net.link_local[i]),
                Gid::from_ipv4(net.v4[i]),
                Gid::from_ipv6(net.global[i]),
            ],
            "side {i}"
        );
    }
    (a, b)
}

/// A global IPv6 GID (index 2, not 0) across a 1500-byte veth: every RC
/// operation at MTU 1024, UD, and the mixed-family refusals.
#[test]
fn netns_global_gid_every_op_mtu_1024() {
    let Some(net) = netns6("g", 1, 1500) else {
        return;
    };
    let (a, b) = netns_sides(&net);
    let gi = index_of(&a.dev, Gid::from_ipv6(net.global[0]));
    assert_eq!(index_of(&b.dev, Gid::from_ipv6(net.global[1])), gi);
    let (mut qa, mut qb) = (a.qp(QpType::Rc), b.qp(QpType::Rc));
    connect_at(&a, &mut qa, gi, &b, &mut qb, gi, Mtu::Mtu1024);
    every_rc_op(&a, &mut qa, &b, &mut qb, &sizes(Mtu::Mtu1024));

    let (mut ua, mut ub) = ud_pair(&a, &b, Mtu::Mtu1024);
    let bg = Gid::from_ipv6(net.global[1]);
    let grh = ud_sends(&a, &mut ua, gi, &b, &mut ub, bg, &[0, 1, 1024]);
    // The GRH area's destination half is the address the datagram was sent
    // to (the global GID, index 2), not the device's GID-table entry 0 (the
    // link-local GID), as kernel rxe copies it from the received IP header.
    assert_ne!(index_of(&b.dev, bg), 0);
    assert_eq!(
        &grh[24..40],
        bg.raw(),
        "GRH area destination = the global GID"
    );

    // Mixed families on a table that has both: IPv4 source to an IPv6
    // destination, and a global source to a link-local destination.
    let v4i = index_of(&a.dev, Gid::from_ipv4(net.v4[0]));
    let mut qx = a.qp(QpType::Rc);
    qx.to_init(&InitParams {
        access: ALL,
        ..InitParams::default()
    })
    .unwrap();
    let refused = |qx: &mut QueuePair, sgid_index: u8, dgid: Gid| {
        let p = RtrParams {
            sgid_index,
            ..rtr(Mtu::Mtu1024)
        };
        let e = qx
            .to_rtr(qb.qpn(), Psn::from_wire(1), dgid, &p)
            .unwrap_err();
        assert_eq!(qx.state(), QpState::Init, "{e}");
        match e {
            VerbsError::AddressVector { source, .. } => source,
            other => panic!("expected AddressVector, got {other:?}"),
        }
    };
    let v4_gid = a.dev.gids()[usize::from(v4i)];
    let r = refused(&mut qx, v4i, bg);
    assert!(
        matches!(r, AvError::Family { sgid, dgid } if sgid == v4_gid && dgid == bg),
        "{r}"
    );
    let r = refused(&mut qx, gi, Gid::from_ipv6(net.link_local[1]));
    assert!(matches!(r, AvError::LinkLocal { .. }), "{r}");
    let r = refused(&mut qx, 0, Gid::from_ipv4(net.v4[1]));
    assert!(matches!(r, AvError::Family { .. }), "{r}");

    assert_clean_v6(&a.dev, "requester");
    assert_clean_v6(&b.dev, "responder");
    drop((qa, qb, qx, ua, ub, a, b));
}

/// Link-local GIDs (the scope comes from the interface): every RC
/// operation and UD across the veth.
#[test]
fn netns_link_local_gid_every_op() {
    let Some(net) = netns6("l", 2, 1500) else {
        return;
    };
    let (a, b) = netns_sides(&net);
    let li = index_of(&a.dev, Gid::from_ipv6(net.link_local[0]));
    assert_eq!(li, 0);
    let (mut qa, mut qb) = (a.qp(QpType::Rc), b.qp(QpType::Rc));
    connect_at(&a, &mut qa, li, &b, &mut qb, li, Mtu::Mtu1024);
    every_rc_op(&a, &mut qa, &b, &mut qb, &sizes(Mtu::Mtu1024));
    let (mut ua, mut ub) = ud_pair(&a, &b, Mtu::Mtu1024);
    let bl = Gid::from_ipv6(net.link_local[1]);
    let grh = ud_sends(&a, &mut ua, li, &b, &mut ub, bl, &[0, 1, 1024]);
    assert_eq!(&grh[24..40], bl.raw(), "GRH area destination (index 0)");
    assert_clean_v6(&a.dev, "requester");
    assert_clean_v6(&b.dev, "responder");
    drop((qa, qb, ua, ub, a, b));
}

/// A 9000-byte veth: MTU 4096 over the global IPv6 GID.
#[test]
fn netns_global_gid_every_op_mtu_4096_jumbo() {
    let Some(net) = netns6("j", 3, 9000) else {
        return;
    };
    let (a, b) = netns_sides(&net);
    let gi = index_of(&a.dev, Gid::from_ipv6(net.global[0]));
    let (mut qa, mut qb) = (a.qp(QpType::Rc), b.qp(QpType::Rc));
    connect_at(&a, &mut qa, gi, &b, &mut qb, gi, Mtu::Mtu4096);
    every_rc_op(&a, &mut qa, &b, &mut qb, &sizes(Mtu::Mtu4096));
    assert_clean_v6(&a.dev, "requester");
    assert_clean_v6(&b.dev, "responder");
    assert_eq!(a.dev.stats().device.tx_too_big, 0);
    drop((qa, qb, a, b));
}

/// An IPv6 address still in duplicate address detection cannot be bound:
/// a whole-interface device leaves it out of the GID table (as kernel rxe
/// does until DAD succeeds) instead of failing, and asking for that one
/// address says why.
#[test]
fn netns_tentative_address_is_left_out() {
    let Some(net) = netns6("t", 4, 1500) else {
        return;
    };
    let (ns, dev) = (net.ns.names[0].as_str(), net.devs[0].as_str());
    // 30 probes a second apart: tentative for the whole test.
    let knob = format!("net.ipv6.conf.{dev}.dad_transmits=30");
    assert!(
        Command::new("ip")
            .args(["netns", "exec", ns, "sysctl", "-qw", &knob])
            .status()
            .is_ok_and(|s| s.success())
    );
    let tentative = Ipv6Addr::new(0xfd00, 0x4791, 4, 0, 0, 0, 0, 0x99);
    let cidr = format!("{tentative}/64");
    assert!(ip(&["-n", ns, "-6", "addr", "add", &cidr, "dev", dev]));
    let d = open_netdev_in(ns, dev);
    assert_eq!(
        d.gids(),
        [
            Gid::from_ipv6(net.link_local[0]),
            Gid::from_ipv4(net.v4[0]),
            Gid::from_ipv6(net.global[0]),
        ]
    );
    drop(d);
    let e = in_ns(ns, move || {
        RxeDevice::open(&RxeConfig::new(Target::Ip(IpAddr::V6(tentative)))).unwrap_err()
    });
    let msg = e.to_string();
    assert!(msg.contains("tentative") && msg.contains("nodad"), "{msg}");
}

// ---------------------------------------------------------------------------
// Mixed families (no root needed)
// ---------------------------------------------------------------------------

/// An IPv4 source GID towards an IPv6 destination cannot be sent on
/// (`Sink::route` would drop every packet as `tx_bad_sgid` and the
/// requester would time out): the RTR modify is refused with a reason and
/// the QP stays in INIT; so is a GID index past the table. A UD request to
/// such a destination stops its batch there. The right address still works
/// afterwards.
#[test]
fn mixed_families_are_refused_with_a_reason() {
    let (a, b) = sides(MIB, Progress::Thread);
    assert!(a.gid().to_ipv4().is_some());
    let (mut qa, mut qb) = (a.qp(QpType::Rc), b.qp(QpType::Rc));
    let init = InitParams {
        access: ALL,
        ..InitParams::default()
    };
    qa.to_init(&init).unwrap();
    let v6_peer: Gid = "fd00:4791::2".parse().unwrap();
    let e = qa
        .to_rtr(qb.qpn(), Psn::from_wire(0), v6_peer, &rtr(Mtu::Mtu1024))
        .unwrap_err();
    assert!(
        matches!(
            e,
            VerbsError::AddressVector {
                source: AvError::Family { sgid, dgid },
                ..
            } if sgid == a.gid() && dgid == v6_peer
        ),
        "{e:?}"
    );
    assert!(
        e.to_string().contains("does not cross IPv4 and IPv6"),
        "{e}"
    );
    assert_eq!(qa.state(), QpState::Init);
    let far = RtrParams {
        sgid_index: 3,
        ..rtr(Mtu::Mtu1024)
    };
    let e = qa
        .to_rtr(qb.qpn(), Psn::from_wire(0), b.gid(), &far)
        .unwrap_err();
    assert!(
        matches!(
            e,
            VerbsError::AddressVector {
                source: AvError::NoSuchSgid { index: 3, .. },
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(qa.state(), QpState::Init);
    // The QP is unharmed: connect it properly and send.
    qa.reset().unwrap();
    connect(&a, &mut qa, &b, &mut qb, Mtu::Mtu1024);
    a.fill(0, b"still fine");
    let rsge = [b.mr.sge(0, 64).unwrap()];
    qb.post_recv(&[RecvWr::new(1, &rsge)]).unwrap();
    let src = [a.mr.sge(0, 10).unwrap()];
    qa.post_send(&[SendWr::send(2, &src).signaled()]).unwrap();
    assert_eq!(wait(&a.cq, 1, &[])[0].status, WcStatus::Success);
    assert_eq!(wait(&b.cq, 1, &[])[0].byte_len, 10);
    assert_eq!(b.bytes(0, 10), b"still fine");

    // UD: a good request, then one to an IPv6 GID from the IPv4 GID.
    let (mut ua, mut ub) = ud_pair(&a, &b, Mtu::Mtu1024);
    let rsge = [b.mr.sge(0, 40 + 64).unwrap()];
    ub.post_recv(&[RecvWr::new(3, &rsge)]).unwrap();
    // The bad destination is refused once, when its address handle is
    // created: no request can name it.
    let e =
        a.pd.create_ah(&AddressVector::new(v6_peer))
            .expect_err("an IPv6 destination from the IPv4 GID");
    assert!(
        matches!(
            e,
            VerbsError::AddressVector {
                source: AvError::Family { .. },
                ..
            }
        ),
        "{e:?}"
    );
    let good = a.pd.create_ah(&AddressVector::new(b.gid())).unwrap();
    // An address handle of another device (b's, to a) is refused at post
    // time, typed: the batch stops there and nothing of it is sent.
    let foreign = b.pd.create_ah(&AddressVector::new(a.gid())).unwrap();
    let tx_before = a.dev.stats().device.tx_packets;
    let e = ua
        .post_send(&[
            SendWr::ud_send(4, &src, &good, ub.qpn(), QKEY).signaled(),
            SendWr::ud_send(5, &src, &foreign, ub.qpn(), QKEY).signaled(),
        ])
        .unwrap_err();
    assert!(
        matches!(
            e,
            VerbsError::PostSend {
                index: 1,
                reason: PostError::ForeignAddressHandle,
            }
        ),
        "{e:?}"
    );
    let wa = wait(&a.cq, 1, &[]);
    assert_eq!((wa[0].wr_id, wa[0].status), (4, WcStatus::Success));
    assert_eq!(wait(&b.cq, 1, &[])[0].byte_len, 40 + 10);
    assert_eq!(b.bytes(40, 10), b"still fine");
    // One packet left: the good request's.
    assert_eq!(a.dev.stats().device.tx_packets, tx_before + 1);
    // Nothing reached the routing stage with a bad GID.
    assert_eq!(a.dev.stats().device.tx_bad_sgid, 0);
    // Nothing else is outstanding.
    let mut wcs = [rnic_core::WorkCompletion::default(); 4];
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(a.cq.poll(&mut wcs).unwrap(), 0);
}

// ---------------------------------------------------------------------------
// On the wire
// ---------------------------------------------------------------------------

/// A named rewrite of a captured packet.
type Edit = (&'static str, fn(&mut [u8]));

/// `PACKET_OUTGOING` (linux/if_packet.h): lo shows each packet twice, once
/// leaving and once arriving; only the leaving copy is kept.
const PACKET_OUTGOING: u8 = 4;

/// The outgoing IPv6/UDP packets to port 4791 between `ends` captured
/// until the socket stays quiet for its timeout (at most 3 s).
fn capture_v6(cap: &OwnedFd, ends: [Ipv6Addr; 2]) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    let mut buf = vec![0u8; 70_000];
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(3) {
        let Ok((n, from)) = recvfrom::<LinkAddr>(cap.as_raw_fd(), &mut buf) else {
            break;
        };
        if from.is_none_or(|f| f.pkttype() != PACKET_OUTGOING) {
            continue;
        }
        let p = &buf[..n];
        if n < 48 || p[0] >> 4 != 6 {
            continue;
        }
        let s = Ipv6Addr::from(<[u8; 16]>::try_from(&p[8..24]).unwrap());
        let d = Ipv6Addr::from(<[u8; 16]>::try_from(&p[24..40]).unwrap());
        let ours = (s == ends[0] && d == ends[1]) || (s == ends[1] && d == ends[0]);
        if ours && p[6] == 17 && u16::from_be_bytes([p[42], p[43]]) == 4791 {
            got.push(p.to_vec());
        }
    }
    got
}

/// The RoCE packet length of a GSO super-packet's segments: the first
/// candidate whose first segment's ICRC verifies (a wrong cut fails the
/// 32-bit check).
fn segment_len(src: Ipv6Addr, dst: Ipv6Addr, sport: u16, roce: &[u8]) -> Option<usize> {
    (16..roce.len())
        .find(|&s| s % 4 == 0 && icrc::verify_v6(src, dst, sport, 4791, &roce[..s]).is_ok())
}

/// Capture an IPv6 exchange of every kind of packet (SEND, WRITE of
/// one, two and 64 packets, READ, atomics, UD, ACKs) and check each: no
/// extension headers, payload length = UDP length, the traffic class and
/// hop limit of the address vector (0 and 64, what kernel rxe sends for
/// it), one flow label per flow, and the ICRC in both forms (the whole IP
/// packet, and the UDP payload with the addresses), GSO super-packets
/// segment by segment. Then rewrite the fields the ICRC masks (traffic
/// class, flow label, hop limit, UDP checksum, BTH FECN/BECN) in a copy,
/// which must still verify, and fields it covers, which must not. The
/// captured packets are exactly the ones the devices counted as sent.
#[test]
fn wire_ipv6_icrc_and_header_fields() {
    let Some((ns, ends)) = netns_lo("w") else {
        return;
    };
    // The whole exchange runs in the namespace: sockets the devices open
    // later (per-QP source ports, on the posting thread) must be there too.
    in_ns(&ns.names[0], move || wire_check(ends));
}

fn wire_check([ia, ib]: [IpAddr; 2]) {
    let cap = capture_socket().expect("root (checked by the caller)");
    let a = Side::new(open(ia, Progress::Thread), MIB, 64);
    let b = Side::new(open(ib, Progress::Thread), MIB, 64);
    let (mut qa, mut qb) = (a.qp(QpType::Rc), b.qp(QpType::Rc));
    connect_at(&a, &mut qa, 0, &b, &mut qb, 0, Mtu::Mtu1024);
    let data = pattern(65_536, 0x6e);
    a.fill(0, &data);
    let rsge = [b.mr.sge(0, 64).unwrap()];
    qb.post_recv(&[RecvWr::new(1, &rsge)]).unwrap();
    let s64 = [a.mr.sge(0, 64).unwrap()];
    qa.post_send(&[SendWr::send(1, &s64).signaled()]).unwrap();
    assert_eq!(wait(&a.cq, 1, &[])[0].status, WcStatus::Success);
    for len in [1usize, 1025, 65_536] {
        let s = [a.mr.sge(0, len as u32).unwrap()];
        qa.post_send(&[SendWr::rdma_write(2, &s, b.mr.addr(), b.mr.rkey()).signaled()])
            .unwrap();
        assert_eq!(wait(&a.cq, 1, &[])[0].status, WcStatus::Success);
        assert!(b.bytes(0, len) == data[..len], "WRITE {len}");
    }
    let rd = [a.mr.sge(MIB / 2, 3000).unwrap()];
    qa.post_send(&[SendWr::rdma_read(3, &rd, b.mr.addr(), b.mr.rkey()).signaled()])
        .unwrap();
    assert_eq!(wait(&a.cq, 1, &[])[0].status, WcStatus::Success);
    assert!(a.bytes(MIB / 2, 3000) == data[..3000]);
    let res = [a.mr.sge(MIB / 2, 8).unwrap()];
    qa.post_send(&[
        SendWr::atomic_fetch_add(4, &res, b.mr.addr() + 4096, b.mr.rkey(), 1).signaled(),
    ])
    .unwrap();
    assert_eq!(wait(&a.cq, 1, &[])[0].status, WcStatus::Success);
    assert_eq!(wait(&b.cq, 1, &[])[0].opcode, WcOpcode::Recv);
    let (mut ua, mut ub) = ud_pair(&a, &b, Mtu::Mtu1024);
    ud_sends(&a, &mut ua, 0, &b, &mut ub, b.gid(), &[100]);

    let got = capture_v6(&cap, [v6(ia), v6(ib)]);
    let (sa, sb) = (a.dev.stats().device, b.dev.stats().device);
    assert!(!got.is_empty(), "captured nothing");
    let mut flows: HashMap<(Ipv6Addr, Ipv6Addr, u16), u32> = HashMap::new();
    let (mut singles, mut supers, mut packets) = (0, 0, 0u64);
    for p in &got {
        let payload_len = usize::from(u16::from_be_bytes([p[4], p[5]]));
        assert_eq!(p.len(), 40 + payload_len, "no trailing bytes");
        let udp_len = usize::from(u16::from_be_bytes([p[44], p[45]]));
        assert_eq!(
            udp_len, payload_len,
            "one UDP datagram, no extension header"
        );
        let tclass = (u32::from_be_bytes([p[0], p[1], p[2], p[3]]) >> 20) & 0xff;
        let flow = u32::from_be_bytes([p[0], p[1], p[2], p[3]]) & 0xF_FFFF;
        assert_eq!(tclass, 0, "traffic class = the AV's (0)");
        assert_eq!(p[7], 64, "hop limit = the AV's (64)");
        let src = Ipv6Addr::from(<[u8; 16]>::try_from(&p[8..24]).unwrap());
        let dst = Ipv6Addr::from(<[u8; 16]>::try_from(&p[24..40]).unwrap());
        let sport = u16::from_be_bytes([p[40], p[41]]);
        let seen = *flows.entry((src, dst, sport)).or_insert(flow);
        assert_eq!(seen, flow, "one flow label per flow");
        let roce = &p[48..];
        // lo never cuts GSO super-packets (a run of equal packets, or a
        // request with a bundled ACK behind it): those do not verify
        // whole, their segments do.
        if icrc::verify(p).is_ok() {
            icrc::verify_v6(src, dst, sport, 4791, roce).expect("UDP-payload ICRC");
            singles += 1;
            packets += 1;
        } else {
            let seg = segment_len(src, dst, sport, roce).expect("a segment length that verifies");
            for s in roce.chunks(seg) {
                icrc::verify_v6(src, dst, sport, 4791, s).expect("GSO segment ICRC");
                packets += 1;
            }
            supers += 1;
        }
    }
    println!(
        "captured {} IPv6 datagrams ({singles} single, {supers} GSO) = {packets} RoCE packets in \
         {} flows; flow labels {:x?}",
        got.len(),
        flows.len(),
        flows
    );
    assert!(supers > 0, "the 64 KiB WRITE left in GSO sends");
    // rxe's UDP source ports: one per RC connection (both directions),
    // one per UD QP.
    let (ea, eb) = (v6(ia), v6(ib));
    let rc = rc_udp_sport(qa.qpn(), qb.qpn());
    let ud = qp_udp_sport(ua.qpn());
    let mut keys: Vec<_> = flows.keys().copied().collect();
    keys.sort();
    let mut want = vec![(ea, eb, rc), (eb, ea, rc), (ea, eb, ud)];
    want.sort();
    assert_eq!(
        keys, want,
        "flows by (source, destination, UDP source port)"
    );
    assert_eq!(sa.sport_fallbacks + sb.sport_fallbacks, 0);
    assert_eq!(
        packets,
        sa.tx_packets + sb.tx_packets,
        "every packet sent is on the wire, once: {sa:?} {sb:?}"
    );

    // The masked fields do not matter; the covered ones do.
    let p = got.iter().find(|p| icrc::verify(p).is_ok()).unwrap();
    let masked: [Edit; 5] = [
        ("traffic class", |p| {
            p[0] = 0x6b;
            p[1] = (p[1] & 0x0f) | 0x80;
        }),
        ("flow label", |p| {
            p[1] = (p[1] & 0xf0) | 0x0a;
            p[2] = 0xbc;
            p[3] = 0xde;
        }),
        ("hop limit", |p| p[7] = 1),
        ("UDP checksum", |p| {
            p[46] ^= 0x5a;
            p[47] ^= 0xa5;
        }),
        ("BTH FECN/BECN", |p| p[48 + 4] = 0xc0),
    ];
    for (what, f) in masked {
        let mut q = p.clone();
        f(&mut q);
        assert!(icrc::verify(&q).is_ok(), "{what} is masked");
    }
    let covered: [Edit; 5] = [
        ("source address", |p| p[23] ^= 1),
        ("destination address", |p| p[39] ^= 1),
        ("UDP source port", |p| p[41] ^= 1),
        ("BTH opcode", |p| p[48] ^= 1),
        ("BTH PSN", |p| p[48 + 11] ^= 1),
    ];
    for (what, f) in covered {
        let mut q = p.clone();
        f(&mut q);
        assert!(icrc::verify(&q).is_err(), "{what} is covered");
    }
    assert_clean_v6(&a.dev, "requester");
    assert_clean_v6(&b.dev, "responder");
    drop((qa, qb, ua, ub, a, b));
}

/// Kernel rxe builds the IPv6 header itself: traffic class and hop limit
/// from the address vector, flow label 0 (rocev2.md §1). rnic-rxe sends
/// through UDP sockets, which put the socket's defaults there (traffic
/// class 0, the route's hop limit) and, with `net.ipv6.auto_flowlabels`
/// = 1, a hashed flow label. The ICRC masks all three, so peers interoperate;
/// this test pins the header parity itself and fails until `tx.rs` passes
/// the AV's traffic class / hop limit per datagram (IPV6_TCLASS /
/// IPV6_HOPLIMIT control messages) and the sockets turn off
/// IPV6_AUTOFLOWLABEL (`sys.rs`, `port.rs`).
#[test]
fn wire_ipv6_header_matches_kernel_rxe_for_a_non_default_av() {
    let Some((ns, ends)) = netns_lo("p") else {
        return;
    };
    // The whole exchange runs in the namespace: sockets the devices open
    // later (per-QP source ports, on the posting thread) must be there too.
    in_ns(&ns.names[0], move || parity_check(ends));
}

fn parity_check([ia, ib]: [IpAddr; 2]) {
    let cap = capture_socket().expect("root (checked by the caller)");
    let a = Side::new(open(ia, Progress::Thread), MIB, 64);
    let b = Side::new(open(ib, Progress::Thread), MIB, 64);
    let (mut qa, mut qb) = (a.qp(QpType::Rc), b.qp(QpType::Rc));
    connect_marked(&a, &mut qa, &b, &mut qb);
    let s = [a.mr.sge(0, 100).unwrap()];
    qa.post_send(&[SendWr::rdma_write(1, &s, b.mr.addr(), b.mr.rkey()).signaled()])
        .unwrap();
    assert_eq!(wait(&a.cq, 1, &[])[0].status, WcStatus::Success);
    let got = capture_v6(&cap, [v6(ia), v6(ib)]);
    assert!(!got.is_empty());
    for p in &got {
        let w = u32::from_be_bytes([p[0], p[1], p[2], p[3]]);
        assert_eq!((w >> 20) & 0xff, u32::from(MARK_TCLASS), "traffic class");
        assert_eq!(w & 0xF_FFFF, 0, "flow label");
        assert_eq!(p[7], MARK_HOPS, "hop limit");
    }
}
