//! The port layer (`rnic_mlx5::port`) against the emulated function's Ethernet port: raw
//! Ethernet queues and NIC RX flow rules made by the driver, executed strictly by
//! rnic-mlx5-emu, and rnic-roce's neighbour engine on top. The far end of the emulated port is a
//! dgram cable (one UDP datagram per frame) this test reads and writes: every frame below is
//! built and checked by hand with rnic-roce's wire types, independent of the engine.
#![allow(clippy::unwrap_used)]

mod common;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rnic_core::{Gid, InitParams, Memory, Mtu, Psn, Qpn, RtrParams, RtsParams, SendFlags, SendWr};
use rnic_mlx5::port::{Port, PortOptions};
use rnic_mlx5::{
    Cq, Hca, HcaOptions, Mkey, Mlx5Error, NeighbourOptions, PciFunction, Qp, QpOptions,
    VfioUserFunction,
};
use rnic_mlx5_emu::{Emulator, FirmwareOptions, Options, Wire};
use rnic_roce::neigh::Config;
use rnic_roce::wire::EthernetAddress;
use rnic_roce::wire::arp;
use rnic_roce::wire::icmpv6::{self, AdvertFlags, NdRepr};

const FN_MAC: [u8; 6] = [0x02, 0x00, 0x00, 0x5e, 0x00, 0x01];
const PEER_MAC: [u8; 6] = [0x02, 0x00, 0x00, 0x5e, 0x00, 0x02];
const BROADCAST: [u8; 6] = [0xff; 6];
const FN_V4: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 1);
const PEER_V4: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 2);
const FN_V6: Ipv6Addr = Ipv6Addr::new(0xfd09, 0, 0, 0, 0, 0, 0, 1);
const PEER_V6: Ipv6Addr = Ipv6Addr::new(0xfd09, 0, 0, 0, 0, 0, 0, 2);
const ETH_ARP: u16 = 0x0806;
const ETH_IPV6: u16 = 0x86dd;
const ETH_IPV4: u16 = 0x0800;

/// An emulated function on a dgram cable, brought up with its event queue,
/// `FN_V4` as GID 0, and its port; `cable` is the far end.
struct Rig {
    port: Option<Port>,
    hca: Arc<Hca>,
    cable: UdpSocket,
    emu: Emulator,
    _dir: tempfile::TempDir,
}

/// Quick timers: solicitations 100 ms apart, three of them.
fn quick() -> Config {
    Config {
        retrans_time: Duration::from_millis(100),
        mcast_solicit: 3,
        announcements: 1,
        ..Config::default()
    }
}

fn rig(config: Config) -> Rig {
    rig_mtu(config, None)
}

/// [`rig`], the port's MTU set to `mtu` before the port opens.
fn rig_mtu(config: Config, mtu: Option<u32>) -> Rig {
    let cable = UdpSocket::bind("127.0.0.1:0").unwrap();
    cable
        .set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let local: SocketAddr = {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        s.local_addr().unwrap()
    };
    let (emu, dir) = common::emulator_with(Options {
        wire: Wire::Dgram {
            local,
            remote: cable.local_addr().unwrap(),
        },
        firmware: FirmwareOptions {
            mac: FN_MAC,
            ..FirmwareOptions::default()
        },
        ..Options::default()
    });
    cable.connect(local).unwrap();
    let hca = bring_up(&emu, Duration::from_secs(2));
    hca.set_gid(0, IpAddr::V4(FN_V4)).unwrap();
    assert_eq!(hca.mac(), Some(FN_MAC), "the function's MAC, as configured");
    if let Some(m) = mtu {
        hca.set_mtu(m).unwrap();
    }
    let port = Port::open(
        &hca,
        PortOptions {
            neighbours: config,
            vlan: None,
        },
    )
    .unwrap();
    Rig {
        port: Some(port),
        hca,
        cable,
        emu,
        _dir: dir,
    }
}

/// The emulated function brought up with its event queue; peers' MACs never from the host
/// kernel (the port or nothing), a resolution waiting at most `wait`.
fn bring_up(emu: &Emulator, wait: Duration) -> Arc<Hca> {
    let f: Arc<dyn PciFunction> = Arc::new(VfioUserFunction::connect(emu.socket()).unwrap());
    let mut hca = Hca::bring_up(
        f,
        HcaOptions {
            pre_init_timeout: Duration::from_secs(10),
            cmd_timeout: Some(Duration::from_secs(5)),
            neighbours: NeighbourOptions {
                host_kernel: Some(false),
                timeout: wait,
            },
            ..HcaOptions::default()
        },
    )
    .unwrap();
    hca.enable_events().unwrap();
    Arc::new(hca)
}

impl Rig {
    fn port(&self) -> &Port {
        self.port.as_ref().unwrap()
    }

    fn send(&self, frame: &[u8]) {
        self.cable.send(frame).unwrap();
    }

    /// Frames from the port for `within`, those `keep` accepts.
    fn frames(&self, within: Duration, keep: impl Fn(&[u8]) -> bool) -> Vec<Vec<u8>> {
        let end = Instant::now() + within;
        let mut out = Vec::new();
        let mut buf = [0u8; 2048];
        while Instant::now() < end {
            if let Ok(n) = self.cable.recv(&mut buf)
                && keep(&buf[..n])
            {
                out.push(buf[..n].to_vec());
            }
        }
        out
    }

    /// The first frame `want` accepts within 2 s.
    fn expect(&self, what: &str, want: impl Fn(&[u8]) -> bool) -> Vec<u8> {
        let end = Instant::now() + Duration::from_secs(2);
        let mut buf = [0u8; 2048];
        let mut seen = Vec::new();
        while Instant::now() < end {
            if let Ok(n) = self.cable.recv(&mut buf) {
                if want(&buf[..n]) {
                    return buf[..n].to_vec();
                }
                seen.push(hex(&buf[..n.min(64)]));
            }
        }
        panic!(
            "no {what} within 2 s; other frames: {seen:#?}; port {:?}; emulator port {:?}",
            self.port.as_ref().map(Port::counters),
            self.emu.device().port_counters().snapshot()
        );
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn ethertype(f: &[u8]) -> u16 {
    if f.len() < 14 {
        return 0;
    }
    u16::from_be_bytes([f[12], f[13]])
}

fn eth(dst: [u8; 6], src: [u8; 6], ty: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(60);
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src);
    f.extend_from_slice(&ty.to_be_bytes());
    f.extend_from_slice(payload);
    f.resize(f.len().max(60), 0);
    f
}

fn arp_frame(dst: [u8; 6], src: [u8; 6], repr: &arp::Repr) -> Vec<u8> {
    let mut p = [0u8; 28];
    repr.emit(&mut p).unwrap();
    eth(dst, src, ETH_ARP, &p)
}

fn arp_of(f: &[u8]) -> Option<arp::Repr> {
    if ethertype(f) != ETH_ARP {
        return None;
    }
    arp::Repr::parse(&arp::Packet::new_checked(&f[14..]).ok()?).ok()
}

/// An ND frame `src` → `dst` (hop limit 255, checksum filled).
fn nd_frame(dmac: [u8; 6], smac: [u8; 6], src: Ipv6Addr, dst: Ipv6Addr, nd: &NdRepr) -> Vec<u8> {
    let mut icmp = vec![0u8; nd.buffer_len()];
    let n = nd.emit(src, dst, &mut icmp).unwrap();
    let mut ip = vec![0x60, 0, 0, 0];
    ip.extend_from_slice(&(n as u16).to_be_bytes());
    ip.extend_from_slice(&[58, 255]);
    ip.extend_from_slice(&src.octets());
    ip.extend_from_slice(&dst.octets());
    ip.extend_from_slice(&icmp[..n]);
    eth(dmac, smac, ETH_IPV6, &ip)
}

/// (IPv6 source, destination, ICMPv6 type, target, flags byte, link-layer option MAC).
type Nd = (Ipv6Addr, Ipv6Addr, u8, Ipv6Addr, u8, Option<[u8; 6]>);

fn nd_of(f: &[u8]) -> Option<Nd> {
    if ethertype(f) != ETH_IPV6 || f.len() < 14 + 40 + 24 || f[14 + 6] != 58 {
        return None;
    }
    let ip = &f[14..];
    let src = Ipv6Addr::from(<[u8; 16]>::try_from(&ip[8..24]).unwrap());
    let dst = Ipv6Addr::from(<[u8; 16]>::try_from(&ip[24..40]).unwrap());
    let icmp = &ip[40..];
    if !(icmp[0] == 135 || icmp[0] == 136) {
        return None;
    }
    let target = Ipv6Addr::from(<[u8; 16]>::try_from(&icmp[8..24]).unwrap());
    let lladdr =
        (icmp.len() >= 32 && icmp[25] == 1).then(|| <[u8; 6]>::try_from(&icmp[26..32]).unwrap());
    Some((src, dst, icmp[0], target, icmp[4], lladdr))
}

/// The solicited-node group of `ip` and its MAC.
fn solicited_node(ip: Ipv6Addr) -> (Ipv6Addr, [u8; 6]) {
    let group = icmpv6::solicited_node(ip);
    (group, EthernetAddress::from_ipv6_multicast(group).0)
}

fn request_for(ip: Ipv4Addr) -> impl Fn(&[u8]) -> bool {
    move |f| {
        arp_of(f).is_some_and(|a| {
            a.operation == arp::Operation::Request
                && a.target_protocol_addr == ip
                && !a.is_gratuitous()
        })
    }
}

#[test]
fn the_port_announces_and_answers_arp_and_nd_for_the_functions_gids() {
    let r = rig(quick());
    // The GID set before the port opened is announced once it does.
    let garp = r.expect("gratuitous ARP for GID 0", |f| {
        arp_of(f).is_some_and(|a| a.is_gratuitous())
    });
    assert_eq!(&garp[..12], [BROADCAST, FN_MAC].concat());
    assert_eq!(
        arp_of(&garp).unwrap(),
        arp::Repr::gratuitous(EthernetAddress(FN_MAC), FN_V4)
    );
    // A GID set afterwards: an unsolicited NA to all-nodes, override set.
    r.hca.set_gid(1, IpAddr::V6(FN_V6)).unwrap();
    let na = r.expect("unsolicited NA for GID 1", |f| {
        nd_of(f).is_some_and(|n| n.2 == 136 && n.3 == FN_V6)
    });
    let (src, dst, _, _, flags, ll) = nd_of(&na).unwrap();
    assert_eq!(&na[..12], [[0x33, 0x33, 0, 0, 0, 1], FN_MAC].concat());
    assert_eq!((src, dst), (FN_V6, "ff02::1".parse().unwrap()));
    assert_eq!((flags & 0xe0, ll), (0x20, Some(FN_MAC)), "O set, S clear");

    // Who has FN_V4? A reply to the asker, byte for byte what RFC 826 says.
    let ask = arp::Repr::request(EthernetAddress(PEER_MAC), PEER_V4, FN_V4);
    r.send(&arp_frame(BROADCAST, PEER_MAC, &ask));
    let reply = r.expect("ARP reply", |f| {
        arp_of(f).is_some_and(|a| a.operation == arp::Operation::Reply)
    });
    assert_eq!(&reply[..14], [&PEER_MAC[..], &FN_MAC, &[8, 6]].concat());
    assert_eq!(
        arp_of(&reply).unwrap(),
        arp::Repr::reply_to(&ask, EthernetAddress(FN_MAC))
    );
    assert!(reply.len() >= 60, "padded to the Ethernet minimum");

    // Who has FN_V6? A solicited NA: S and O, the target's link-layer address.
    let (sn, sn_mac) = solicited_node(FN_V6);
    let ns = NdRepr::Solicit {
        target: FN_V6,
        lladdr: Some(EthernetAddress(PEER_MAC)),
    };
    r.send(&nd_frame(sn_mac, PEER_MAC, PEER_V6, sn, &ns));
    let na = r.expect("solicited NA", |f| {
        nd_of(f).is_some_and(|n| n.2 == 136 && n.1 == PEER_V6)
    });
    assert_eq!(&na[..12], [PEER_MAC, FN_MAC].concat());
    let (src, _, _, target, flags, ll) = nd_of(&na).unwrap();
    assert_eq!(
        (src, target, flags & 0xe0, ll),
        (FN_V6, FN_V6, 0x60, Some(FN_MAC))
    );
    let expect = NdRepr::Advert {
        flags: AdvertFlags {
            router: false,
            solicited: true,
            override_: true,
        },
        target: FN_V6,
        lladdr: Some(EthernetAddress(FN_MAC)),
    };
    let mut want = vec![0u8; expect.buffer_len()];
    expect.emit(FN_V6, PEER_V6, &mut want).unwrap();
    assert_eq!(&na[54..54 + want.len()], want, "the NA, checksum included");

    // Not ours: no answer at all.
    let other = arp::Repr::request(
        EthernetAddress(PEER_MAC),
        PEER_V4,
        Ipv4Addr::new(10, 9, 0, 77),
    );
    r.send(&arp_frame(BROADCAST, PEER_MAC, &other));
    let answers = r.frames(Duration::from_millis(300), |f| {
        arp_of(f).is_some_and(|a| a.operation == arp::Operation::Reply)
    });
    assert!(
        answers.is_empty(),
        "answered for another address: {answers:?}"
    );

    let c = r.port().counters();
    assert!(c.rx_frames >= 3, "{c:?}");
    assert!(c.tx_frames >= 4, "announcements and answers sent: {c:?}");
    assert_eq!((c.cqe_errors, c.cqe_unexpected, c.tx_full), (0, 0, 0));
    let e = r.emu.device().port_counters().snapshot();
    assert!(
        e.rx_delivered >= 3,
        "delivered through the driver's rules: {e:?}"
    );
    // The same traffic as the NIC vport counts it (QUERY_VPORT_COUNTER).
    let v = r.hca.vport_counters().unwrap();
    assert_eq!(
        (v.rx_broadcast.packets, v.rx_multicast.packets),
        (e.rx_broadcast, e.rx_multicast),
        "{v:?} {e:?}"
    );
    assert!(
        v.tx_broadcast.packets >= 1 && v.tx_unicast.packets >= 1,
        "{v:?}"
    );
}

#[test]
fn the_port_resolves_peers_by_arp_and_nd_and_qps_send_to_the_mac_it_learned() {
    let r = rig(quick());
    r.hca.set_gid(1, IpAddr::V6(FN_V6)).unwrap();
    // IPv4: a broadcast request from the function's address; the answer completes it.
    std::thread::scope(|s| {
        let job = s.spawn(|| {
            r.port()
                .resolve(IpAddr::V4(PEER_V4), Duration::from_secs(2))
        });
        let req = r.expect("ARP request for the peer", request_for(PEER_V4));
        assert_eq!(&req[..12], [BROADCAST, FN_MAC].concat());
        let a = arp_of(&req).unwrap();
        assert_eq!(
            (a.source_hardware_addr.0, a.source_protocol_addr),
            (FN_MAC, FN_V4)
        );
        r.send(&arp_frame(
            FN_MAC,
            PEER_MAC,
            &arp::Repr::reply_to(&a, EthernetAddress(PEER_MAC)),
        ));
        assert_eq!(job.join().unwrap().unwrap(), PEER_MAC);
    });
    // IPv6: a solicitation to the solicited-node group from the function's address.
    std::thread::scope(|s| {
        let job = s.spawn(|| {
            r.port()
                .resolve(IpAddr::V6(PEER_V6), Duration::from_secs(2))
        });
        let (sn, sn_mac) = solicited_node(PEER_V6);
        let ns = r.expect("NS for the peer", |f| {
            nd_of(f).is_some_and(|n| n.2 == 135 && n.3 == PEER_V6)
        });
        assert_eq!(&ns[..12], [sn_mac, FN_MAC].concat());
        let (src, dst, _, _, _, ll) = nd_of(&ns).unwrap();
        assert_eq!((src, dst, ll), (FN_V6, sn, Some(FN_MAC)));
        let na = NdRepr::Advert {
            flags: AdvertFlags {
                router: false,
                solicited: true,
                override_: true,
            },
            target: PEER_V6,
            lladdr: Some(EthernetAddress(PEER_MAC)),
        };
        r.send(&nd_frame(FN_MAC, PEER_MAC, PEER_V6, FN_V6, &na));
        assert_eq!(job.join().unwrap().unwrap(), PEER_MAC);
    });
    let cache = r.port().neighbours();
    for ip in [IpAddr::V4(PEER_V4), IpAddr::V6(PEER_V6)] {
        let n = cache.iter().find(|n| n.ip == ip).unwrap_or_else(|| {
            panic!("{ip} not in the cache: {cache:?}");
        });
        assert_eq!(n.mac.map(|m| m.0), Some(PEER_MAC), "{n:?}");
    }
    // The driver's own lookup goes through the port now.
    assert_eq!(
        r.hca
            .resolve_neighbour(&Gid::from_ip(IpAddr::V4(PEER_V4)), None)
            .unwrap(),
        PEER_MAC
    );

    // An RC QP to the peer: its RDMA WRITE leaves the port addressed to the MAC ARP found.
    let mut cq = Cq::new(&r.hca, 256).unwrap();
    let buf = r.hca.function().alloc_dma(4096).unwrap();
    buf.write(0, b"to the MAC ARP found").unwrap();
    let access = rnic_core::AccessFlags::LOCAL_WRITE;
    let mkey = Mkey::new(&r.hca, buf, access).unwrap();
    let mut qp = Qp::new(&r.hca, &mut cq, None, QpOptions::default()).unwrap();
    qp.use_region(&mkey);
    qp.connect(
        &InitParams::default(),
        Qpn::from_wire(0x123),
        Gid::from_ip(IpAddr::V4(PEER_V4)),
        Psn::from_wire(1),
        Psn::from_wire(100),
        &RtrParams {
            path_mtu: Mtu::Mtu1024,
            ..RtrParams::default()
        },
        &RtsParams::default(),
    )
    .unwrap();
    let sge = [rnic_core::Sge::new(mkey.addr(), 20, mkey.lkey())];
    let mut wr = SendWr::rdma_write(7, &sge, 0x1000, rnic_core::Rkey(0x42));
    wr.flags = SendFlags::SIGNALED;
    qp.post_send(&[wr]).unwrap();
    let roce = r.expect("the RoCE v2 WRITE", |f| {
        ethertype(f) == ETH_IPV4 && f.len() > 14 + 28 && f[14 + 9] == 17
    });
    assert_eq!(&roce[..12], [PEER_MAC, FN_MAC].concat());
    assert_eq!(
        &roce[14 + 12..14 + 20],
        [FN_V4.octets(), PEER_V4.octets()].concat()
    );
    assert_eq!(u16::from_be_bytes([roce[14 + 22], roce[14 + 23]]), 4791);
    let payload = &roce[roce.len() - 4 - 20..roce.len() - 4];
    assert_eq!(
        payload, b"to the MAC ARP found",
        "the payload before the ICRC"
    );
    drop(qp);
}

#[test]
fn a_peer_that_never_answers_is_a_typed_error_in_bounded_time() {
    let r = rig(quick());
    let silent = IpAddr::V4(Ipv4Addr::new(10, 9, 0, 99));
    let start = Instant::now();
    let err = r
        .port()
        .resolve(silent, Duration::from_secs(5))
        .unwrap_err();
    let took = start.elapsed();
    match &err {
        Mlx5Error::NoNeighbour { ip, why } => {
            assert_eq!(*ip, silent);
            assert!(why.contains("3 sent"), "{why}");
        }
        e => panic!("{e:?}"),
    }
    assert!(
        took < Duration::from_secs(2),
        "3 tries 100 ms apart took {took:?}"
    );
    let asked = r.frames(Duration::from_millis(100), |_| true);
    drop(asked);
    // What the driver does with it: an RC QP to that address fails at RTR, naming it.
    let mut cq = Cq::new(&r.hca, 256).unwrap();
    let mut qp = Qp::new(&r.hca, &mut cq, None, QpOptions::default()).unwrap();
    let start = Instant::now();
    let err = qp
        .connect(
            &InitParams::default(),
            Qpn::from_wire(0x55),
            Gid::from_ip(IpAddr::V4(Ipv4Addr::new(10, 9, 0, 98))),
            Psn::from_wire(1),
            Psn::from_wire(1),
            &RtrParams::default(),
            &RtsParams::default(),
        )
        .unwrap_err();
    assert!(
        matches!(err, Mlx5Error::NoNeighbour { ip, .. } if ip == IpAddr::V4(Ipv4Addr::new(10, 9, 0, 98))),
        "{err:?}"
    );
    assert!(err.to_string().contains("10.9.0.98"), "{err}");
    assert!(start.elapsed() < Duration::from_secs(3));
    // The three requests went out, broadcast, for that address.
    let r2 = r.frames(
        Duration::from_millis(200),
        request_for(Ipv4Addr::new(10, 9, 0, 98)),
    );
    assert!(r2.len() <= 3, "{}", r2.len());
}

#[test]
fn hostile_l2_input_is_counted_and_teaches_the_cache_nothing() {
    let r = rig(quick());
    // An IPv6 GID: its solicited-node group is subscribed, so malformed ND reaches the engine.
    r.hca.set_gid(1, IpAddr::V6(FN_V6)).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    // A solicitation for an address the function does not have goes to a group it never
    // subscribed to: the NIC drops it before any rule.
    let (sn77, sn77_mac) = solicited_node("fd09::77".parse().unwrap());
    let ns77 = NdRepr::Solicit {
        target: "fd09::77".parse().unwrap(),
        lladdr: Some(EthernetAddress([0x02, 0, 0, 0, 0, 0x66])),
    };
    let base = r.emu.device().port_counters().snapshot();
    r.send(&nd_frame(
        sn77_mac,
        [0x02, 0, 0, 0, 0, 0x66],
        "fd09::66".parse().unwrap(),
        sn77,
        &ns77,
    ));
    std::thread::sleep(Duration::from_millis(100));
    let d = r.emu.device().port_counters().snapshot().since(&base);
    assert_eq!(
        (d.rx_not_subscribed, d.rx_delivered),
        (1, 0),
        "the NS for fd09::77's group: {d:?}"
    );
    let before = r.port().counters();
    let stranger = [0x02, 0, 0, 0, 0, 0x66];
    // An unsolicited reply for an address nobody asked about.
    let unasked = arp::Repr {
        operation: arp::Operation::Reply,
        source_hardware_addr: EthernetAddress(stranger),
        source_protocol_addr: Ipv4Addr::new(10, 9, 0, 66),
        target_hardware_addr: EthernetAddress(FN_MAC),
        target_protocol_addr: FN_V4,
    };
    r.send(&arp_frame(FN_MAC, stranger, &unasked));
    // An unsolicited NA for an address nobody asked about.
    let na = NdRepr::Advert {
        flags: AdvertFlags {
            router: false,
            solicited: true,
            override_: true,
        },
        target: "fd09::66".parse().unwrap(),
        lladdr: Some(EthernetAddress(stranger)),
    };
    r.send(&nd_frame(
        FN_MAC,
        stranger,
        "fd09::66".parse().unwrap(),
        FN_V6,
        &na,
    ));
    // Malformed: a truncated ARP, a wrong hardware length, an NS with a broken checksum,
    // an NS forwarded by a router (hop limit 64), a runt, an oversized frame.
    let good = arp_frame(
        BROADCAST,
        stranger,
        &arp::Repr::request(
            EthernetAddress(stranger),
            Ipv4Addr::new(10, 9, 0, 66),
            FN_V4,
        ),
    );
    r.send(&good[..14 + 20]);
    let mut bad_hlen = good.clone();
    bad_hlen[14 + 4] = 8;
    r.send(&bad_hlen);
    let (sn, sn_mac) = solicited_node(FN_V6);
    let ns = NdRepr::Solicit {
        target: FN_V6,
        lladdr: Some(EthernetAddress(stranger)),
    };
    let mut bad_sum = nd_frame(sn_mac, stranger, "fd09::66".parse().unwrap(), sn, &ns);
    bad_sum[14 + 40 + 2] ^= 0xff;
    r.send(&bad_sum);
    let mut routed = nd_frame(sn_mac, stranger, "fd09::66".parse().unwrap(), sn, &ns);
    routed[14 + 7] = 64;
    r.send(&routed);
    r.send(&[0xff; 10]);
    // Longer than the port's MTU: the port drops it before any queue.
    let mtu = r.hca.vport_mtu().unwrap() as usize;
    r.send(&eth(BROADCAST, stranger, ETH_ARP, &vec![0u8; mtu + 1]));
    // Exactly the MTU: a whole receive slot takes it (the engine finds no ARP in it).
    r.send(&eth(BROADCAST, stranger, ETH_ARP, &vec![0u8; mtu]));
    // Frames for another MAC and a flood of requests from one source.
    r.send(&arp_frame([0x02, 0, 0, 0, 0, 0x77], stranger, &unasked));
    let flood = Instant::now();
    for _ in 0..200 {
        r.send(&good);
    }
    std::thread::sleep(Duration::from_millis(300));
    let flood_secs = flood.elapsed().as_secs_f64();

    let cache = r.port().neighbours();
    assert!(
        cache
            .iter()
            .all(|n| n.ip != IpAddr::V4(Ipv4Addr::new(10, 9, 0, 66))
                || n.mac.map(|m| m.0) == Some(stranger)),
        "{cache:?}"
    );
    assert!(
        !cache
            .iter()
            .any(|n| n.ip == "fd09::66".parse::<IpAddr>().unwrap()),
        "an unsolicited NA made an entry: {cache:?}"
    );
    let c = r.port().counters();
    let n = &c.neighbours;
    let e = r.emu.device().port_counters().snapshot();
    assert!(
        c.rx_frames - before.rx_frames + e.rx_rq_empty >= 200,
        "the flood reached the port, or overran its RQ (counted by the device): {c:?} {e:?}"
    );
    // One source gets a burst of 10 answers, then 10 a second (Config::reply_per_source);
    // the rest of what reached the engine is counted as rate-limited.
    let answered = n.answered - before.neighbours.answered;
    let limited = n.ignored.rate_limited - before.neighbours.ignored.rate_limited;
    assert!(
        answered as f64 <= 10.0 + 10.0 * flood_secs + 1.0 && limited > 0,
        "the flood is rate-limited: {answered} answered, {limited} limited in {flood_secs:.2} s: {n:?}"
    );
    assert!(
        n.malformed.total() >= 3,
        "malformed counted by cause: {n:?}"
    );
    assert_eq!((c.cqe_errors, c.rx_oversized), (0, 0), "{c:?}");
    assert!(e.rx_other_mac >= 1, "{e:?}");
    assert!(e.rx_malformed >= 1, "the runt: {e:?}");
    assert_eq!(e.rx_mtu, 1, "over the MTU: {e:?}");
    // Still answering, with the right MAC.
    let ask = arp::Repr::request(EthernetAddress(PEER_MAC), PEER_V4, FN_V4);
    r.send(&arp_frame(BROADCAST, PEER_MAC, &ask));
    r.expect("a reply after the storm", |f| {
        arp_of(f).is_some_and(|a| {
            a.operation == arp::Operation::Reply && a.target_hardware_addr.0 == PEER_MAC
        })
    });
}

#[test]
fn static_entries_need_no_wire_and_closing_the_port_removes_its_rules() {
    let mut r = rig(quick());
    let mac = [0x02, 0, 0, 0, 0, 0x05];
    let ip = IpAddr::V4(Ipv4Addr::new(10, 9, 0, 5));
    r.port().set_static(ip, mac).unwrap();
    let quiet = r.frames(Duration::from_millis(150), |_| true);
    drop(quiet);
    assert_eq!(
        r.hca.resolve_neighbour(&Gid::from_ip(ip), None).unwrap(),
        mac
    );
    let asked = r.frames(
        Duration::from_millis(150),
        request_for(Ipv4Addr::new(10, 9, 0, 5)),
    );
    assert!(asked.is_empty(), "a static entry sends no request");
    assert!(
        r.port()
            .neighbours()
            .iter()
            .any(|n| n.ip == ip && n.is_static())
    );

    let objects = r.emu.accounting().unwrap();
    r.port = None;
    let after = r.emu.accounting().unwrap();
    assert!(
        after.flow_objects < objects.flow_objects && after.eth_objects < objects.eth_objects,
        "the port's tables, groups, entries and queues destroyed: {objects:?} -> {after:?}"
    );
    assert_eq!((after.flow_objects, after.eth_objects), (0, 0));
    let base = r.emu.device().port_counters().snapshot();
    let ask = arp::Repr::request(EthernetAddress(PEER_MAC), PEER_V4, FN_V4);
    r.send(&arp_frame(BROADCAST, PEER_MAC, &ask));
    let replies = r.frames(Duration::from_millis(300), |f| arp_of(f).is_some());
    assert!(replies.is_empty(), "answered after close: {replies:?}");
    let e = r.emu.device().port_counters().snapshot().since(&base);
    assert_eq!(
        e.rx_not_subscribed, 1,
        "the vport's multicast list emptied, broadcast no longer reaches it: {e:?}"
    );
    // No resolver any more: the host kernel is off, so a typed error at once.
    let start = Instant::now();
    let err = r
        .hca
        .resolve_neighbour(&Gid::from_ip(IpAddr::V4(Ipv4Addr::new(10, 9, 0, 9))), None)
        .unwrap_err();
    assert!(matches!(err, Mlx5Error::NoNeighbour { .. }), "{err:?}");
    assert!(start.elapsed() < Duration::from_millis(500));
}

#[test]
fn a_frame_longer_than_its_slot_stops_the_rq_and_the_port_brings_it_back() {
    let r = rig_mtu(quick(), Some(1500));
    // The slots were sized for the MTU at open (1500: 2 KiB); a larger MTU set afterwards
    // lets a frame through that no slot holds: a local length error CQE, the RQ in ERR.
    assert_eq!(rnic_mlx5::port::eth::rx_slot(1500), 2048);
    r.hca.set_mtu(9000).unwrap();
    r.send(&eth(BROADCAST, PEER_MAC, ETH_ARP, &vec![0u8; 8000]));
    let end = Instant::now() + Duration::from_secs(2);
    while r.port().counters().recoveries == 0 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(10));
    }
    let c = r.port().counters();
    assert_eq!((c.cqe_errors, c.recoveries), (1, 1), "{c:?}");
    // Ready again: every slot posted anew, ARP answered.
    for _ in 0..3 {
        let ask = arp::Repr::request(EthernetAddress(PEER_MAC), PEER_V4, FN_V4);
        r.send(&arp_frame(BROADCAST, PEER_MAC, &ask));
        r.expect("a reply after the recovery", |f| {
            arp_of(f).is_some_and(|a| a.operation == arp::Operation::Reply)
        });
    }
    assert_eq!(r.port().counters().cqe_errors, 1);
}

/// rnic-rxe in one network namespace, the emulated function on a veth end (AF_PACKET) in
/// another: the host kernel and the port resolve each other by ARP and ND, then RC over IPv4
/// and IPv6 and UD over IPv4 carry bytes both ways. Root only (namespaces); skipped otherwise.
mod veth {
    use super::*;
    use common::peer::{ALL, Peer, pattern};
    use rnic_core::{QpType, RecvWr, SendOp, Sge, UdDest, WcStatus};
    use std::process::Command;

    const RXE_MAC: [u8; 6] = [0x02, 0x00, 0x00, 0x00, 0x88, 0x02];
    const FN: [IpAddr; 2] = [
        IpAddr::V4(Ipv4Addr::new(10, 88, 0, 1)),
        IpAddr::V6(Ipv6Addr::new(0xfd88, 0, 0, 0, 0, 0, 0, 1)),
    ];
    const RXE: [IpAddr; 2] = [
        IpAddr::V4(Ipv4Addr::new(10, 88, 0, 2)),
        IpAddr::V6(Ipv6Addr::new(0xfd88, 0, 0, 0, 0, 0, 0, 2)),
    ];

    fn ip(args: &[&str]) -> Result<String, String> {
        let out = Command::new("ip")
            .args(args)
            .output()
            .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!(
                "ip {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }

    /// Namespace `rxe` (veth end `p8r`, the kernel's addresses) and namespace `fun` (veth
    /// end `p8m`, no addresses: the emulated port's wire); removed on drop.
    struct Link {
        rxe: String,
        fun: String,
    }

    impl Link {
        fn new() -> Result<Link, String> {
            let id = std::process::id();
            let link = Link {
                rxe: format!("rnic-p8r-{id}"),
                fun: format!("rnic-p8m-{id}"),
            };
            ip(&["netns", "add", &link.rxe])?;
            ip(&["netns", "add", &link.fun])?;
            let (r, m) = (link.rxe.as_str(), link.fun.as_str());
            let mac = EthernetAddress(RXE_MAC).to_string();
            for args in [
                &[
                    "link", "add", "p8r", "netns", r, "type", "veth", "peer", "name", "p8m",
                    "netns", m,
                ][..],
                &["-n", r, "link", "set", "p8r", "address", &mac],
                &["-n", r, "addr", "add", "10.88.0.2/24", "dev", "p8r"],
                &["-n", r, "addr", "add", "fd88::2/64", "dev", "p8r", "nodad"],
                &["-n", r, "link", "set", "lo", "up"],
                &["-n", r, "link", "set", "p8r", "up"],
                &["-n", m, "link", "set", "p8m", "up"],
            ] {
                ip(args)?;
            }
            Ok(link)
        }
    }

    impl Drop for Link {
        fn drop(&mut self) {
            let _ = ip(&["netns", "del", &self.rxe]);
            let _ = ip(&["netns", "del", &self.fun]);
        }
    }

    fn enter(ns: &str) {
        let f = std::fs::File::open(format!("/var/run/netns/{ns}")).unwrap();
        nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
    }

    fn up(emu: &Emulator) -> (Arc<Hca>, Port) {
        let hca = bring_up(emu, Duration::from_secs(3));
        hca.set_gid(0, FN[0]).unwrap();
        hca.set_gid(1, FN[1]).unwrap();
        let port = Port::open(
            &hca,
            PortOptions {
                neighbours: Config {
                    retrans_time: Duration::from_millis(200),
                    ..Config::default()
                },
                vlan: None,
            },
        )
        .unwrap();
        (hca, port)
    }

    /// RC between the function and rxe at `family` (0 IPv4, 1 IPv6): WRITEs both ways.
    fn rc(hca: &Arc<Hca>, family: usize) {
        let mut peer = Peer::new(RXE[family]);
        let mut cq = Cq::new(hca, 256).unwrap();
        let mkey = Mkey::new(hca, hca.function().alloc_dma(4 * 4096).unwrap(), ALL).unwrap();
        let mut qp = Qp::new(hca, &mut cq, None, QpOptions::default()).unwrap();
        qp.use_region(&mkey);
        let init = InitParams {
            access: ALL,
            ..InitParams::default()
        };
        let rtr = RtrParams {
            path_mtu: Mtu::Mtu1024,
            max_dest_rd_atomic: 4,
            ..RtrParams::default()
        };
        // The function's GID of the same family: 0 (IPv4) or 1 (IPv6).
        let our_rtr = RtrParams {
            sgid_index: family as u8,
            ..rtr
        };
        let rts = RtsParams {
            max_rd_atomic: 4,
            ..RtsParams::default()
        };
        peer.qp.to_init(&init).unwrap();
        peer.qp
            .to_rtr(
                qp.qpn(),
                Psn::from_wire(0x10),
                Gid::from_ip(FN[family]),
                &rtr,
            )
            .unwrap();
        peer.qp.to_rts(Psn::from_wire(0x20), &rts).unwrap();
        // RTR resolves the rxe side's MAC by ARP / ND: the kernel answers.
        qp.connect(
            &init,
            peer.qp.qpn(),
            Gid::from_ip(RXE[family]),
            Psn::from_wire(0x20),
            Psn::from_wire(0x10),
            &our_rtr,
            &rts,
        )
        .unwrap();
        // Function → rxe: 3000 bytes, three packets, each acknowledged through the kernel,
        // which resolved the function's address by asking the port.
        let out = pattern(3000, family as u8 + 1);
        mkey.memory().write(0, &out).unwrap();
        let s = [Sge::new(mkey.addr(), 3000, mkey.lkey())];
        let mut w = SendWr::rdma_write(1, &s, peer.mr.addr() + 64, peer.mr.rkey());
        w.flags = SendFlags::SIGNALED;
        qp.post_send(&[w]).unwrap();
        let wc = common::wait_cq(&mut cq, 1);
        assert_eq!(wc[0].status, WcStatus::Success, "{wc:?}");
        assert_eq!(peer.bytes(64, 3000), out, "byte-exact at rxe");
        // rxe → function.
        let back = pattern(2000, family as u8 + 9);
        peer.mem.write(8192, &back).unwrap();
        let ps = [Sge::new(peer.mr.addr() + 8192, 2000, peer.mr.lkey())];
        let mut w = SendWr::rdma_write(2, &ps, mkey.addr() + 4096, mkey.rkey());
        w.flags = SendFlags::SIGNALED;
        peer.qp.post_send(&[w]).unwrap();
        let pw = peer.wait(1);
        assert_eq!(pw[0].status, WcStatus::Success, "{pw:?}");
        let mut got = vec![0u8; 2000];
        mkey.memory().read(4096, &mut got).unwrap();
        assert_eq!(got, back, "byte-exact at the function");
    }

    /// UD over IPv4: a send each way, the function's address vector from the port's cache.
    fn ud(hca: &Arc<Hca>) {
        let mut peer = Peer::with(RXE[0], QpType::Ud);
        let (mut cq, mkey, mut qp) = common::peer::ud_qp(hca);
        let qkey = 0x1234_5678;
        let init = InitParams {
            qkey,
            ..InitParams::default()
        };
        common::peer::ud_rts(&mut qp, &mut peer, FN[0], &init, (0x33, 0x22));
        let dmac = hca.resolve_neighbour(&Gid::from_ip(RXE[0]), None).unwrap();
        assert_eq!(dmac, RXE_MAC, "the rxe side's MAC, from the port's cache");
        let msg = pattern(500, 21);
        mkey.memory().write(0, &msg).unwrap();
        let prs = [Sge::new(peer.mr.addr(), 40 + 1024, peer.mr.lkey())];
        peer.qp.post_recv(&[RecvWr::new(5, &prs)]).unwrap();
        let s = [Sge::new(mkey.addr(), 500, mkey.lkey())];
        let w = SendWr::send(1, &s).signaled().to_ud(UdDest {
            av: rnic_core::AddressVector {
                dmac: Some(dmac),
                ..rnic_core::AddressVector::new(Gid::from_ip(RXE[0]))
            },
            remote_qpn: peer.qp.qpn(),
            remote_qkey: qkey,
        });
        qp.post_send(&[w]).unwrap();
        let pw = peer.wait(1)[0];
        assert_eq!(
            (pw.wr_id, pw.status, pw.byte_len),
            (5, WcStatus::Success, 540)
        );
        assert_eq!(peer.bytes(40, 500), msg);
        // rxe → function: the kernel already knows the function's MAC.
        let rs = [Sge::new(mkey.addr() + 4096, 40 + 1024, mkey.lkey())];
        qp.post_recv(&[RecvWr::new(9, &rs)]).unwrap();
        let back = pattern(300, 4);
        peer.mem.write(8192, &back).unwrap();
        let ps = [Sge::new(peer.mr.addr() + 8192, 300, peer.mr.lkey())];
        let to_fn = peer
            .pd
            .create_ah(&rnic_core::AddressVector::new(Gid::from_ip(FN[0])))
            .unwrap();
        peer.qp
            .post_send(&[SendWr {
                wr_id: 6,
                op: SendOp::Send,
                sg_list: &ps,
                flags: SendFlags::SIGNALED,
                ud: Some(to_fn.ud_dest(qp.qpn(), qkey)),
            }])
            .unwrap();
        let got = common::wait_cq(&mut cq, 2);
        let recv = got.iter().find(|w| w.wr_id == 9).unwrap();
        assert_eq!((recv.status, recv.byte_len), (WcStatus::Success, 340));
        let mut b = vec![0u8; 300];
        mkey.memory().read(4096 + 40, &mut b).unwrap();
        assert_eq!(b, back);
    }

    #[test]
    fn rxe_in_one_netns_and_the_function_on_a_veth_in_another_resolve_each_other_and_talk() {
        if !nix::unistd::Uid::effective().is_root() {
            eprintln!("skipped: needs root (network namespaces, veth, AF_PACKET)");
            return;
        }
        let link = Link::new().unwrap();
        // The emulator opens its AF_PACKET socket in the function's namespace.
        let fun = link.fun.clone();
        let (emu, dir) = std::thread::spawn(move || {
            enter(&fun);
            common::emulator_with(Options {
                wire: "packet:p8m".parse().unwrap(),
                firmware: FirmwareOptions {
                    mac: FN_MAC,
                    ..FirmwareOptions::default()
                },
                ..Options::default()
            })
        })
        .join()
        .unwrap();
        // Driver, port and rxe run in rxe's namespace: rxe's sockets are made there.
        let rxe_ns = link.rxe.clone();
        std::thread::spawn(move || {
            enter(&rxe_ns);
            let (hca, port) = up(&emu);
            rc(&hca, 0);
            rc(&hca, 1);
            ud(&hca);
            // The kernel asks for the function once it has forgotten it: the port answers.
            ip(&["neigh", "flush", "dev", "p8r"]).unwrap();
            for a in FN {
                let s =
                    std::net::UdpSocket::bind((RXE[if a.is_ipv4() { 0 } else { 1 }], 0)).unwrap();
                s.send_to(b"who", (a, 9)).unwrap();
            }
            std::thread::sleep(Duration::from_millis(300));
            for a in ["10.88.0.1", "fd88::1"] {
                let n = ip(&["neigh", "show", a, "dev", "p8r"]).unwrap();
                assert!(
                    n.contains("02:00:00:5e:00:01"),
                    "the kernel's neighbour table for {a}: {n:?}"
                );
            }
            // And the port the kernel's.
            let cache = port.neighbours();
            for a in RXE {
                assert!(
                    cache
                        .iter()
                        .any(|n| n.ip == a && n.mac.map(|m| m.0) == Some(RXE_MAC)),
                    "{a} not resolved to the veth's MAC: {cache:?}"
                );
            }
            // Nobody at 10.88.0.77: a typed error in bounded time.
            let start = Instant::now();
            let err = hca
                .resolve_neighbour(
                    &Gid::from_ip(IpAddr::V4(Ipv4Addr::new(10, 88, 0, 77))),
                    None,
                )
                .unwrap_err();
            assert!(matches!(err, Mlx5Error::NoNeighbour { .. }), "{err:?}");
            assert!(
                start.elapsed() < Duration::from_secs(3),
                "{:?}",
                start.elapsed()
            );
            let c = port.counters();
            assert!(
                c.neighbours.answered >= 2 && c.neighbours.resolved >= 2,
                "{c:?}"
            );
            drop(port);
            drop(hca);
            drop(emu);
            drop(dir);
        })
        .join()
        .unwrap();
        drop(link);
    }
}
