//! The L2 neighbour layer (rnic-roce's `neigh` engine and its `arp` /
//! `icmpv6` wire formats) fed hostile frames between honest control calls.
//!
//! The input is a program. Its first byte picks the configuration (VLAN or
//! not, a tight cache or not); then each step takes one byte: resolve an
//! address of a small pool, pin or drop a static entry, advance the clock
//! and poll, or deliver a frame — raw bytes, or an ARP request / reply /
//! gratuitous ARP or a solicitation / advertisement / DAD probe built from
//! the input (addresses from the pool or the input, any flags, hop limit
//! and options), then truncated, or with bytes changed and the ICMPv6
//! checksum recomputed or not.
//!
//! Checked after every step:
//! - every cache entry is an address the program resolved or pinned: no
//!   frame creates an entry;
//! - a static entry keeps the MAC it was set to;
//! - the counters add up: every frame lands in exactly one disposition;
//! - the cache, the resolutions in progress and the transmit queue stay
//!   within their configured bounds;
//! - every frame the engine sends parses as ARP, or as ICMPv6 neighbour
//!   discovery that passes every RFC 4861 validity check, from an own MAC
//!   and address;
//! - a `Known` resolution of a learned entry is the MAC the entry lists.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use rnic_roce::neigh::{Config, Counters, Instant, Neighbour, Neighbours, Resolution, State};
use rnic_roce::wire::icmpv6::{self, AdvertFlags, Message, NdRepr};
use rnic_roce::wire::ip::PROTOCOL_ICMPV6;
use rnic_roce::wire::{
    EtherType, EthernetAddress, EthernetPacket, EthernetRepr, Ipv6Packet, Ipv6Repr, VlanTag, arp,
};

use crate::Input;

/// The engine's MAC.
pub const OWN_MAC: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 1]);
const PEERS: [EthernetAddress; 3] = [
    EthernetAddress([0x52, 0x54, 0, 0, 0, 2]),
    EthernetAddress([0x52, 0x54, 0, 0, 0, 3]),
    EthernetAddress([2, 0, 0, 0, 0, 0x99]),
];
const VLAN: VlanTag = VlanTag {
    pcp: 5,
    dei: false,
    vid: 42,
};

/// The own addresses: 10.0.0.1, fe80::1, 2001:db8::1.
fn own() -> [IpAddr; 3] {
    [
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
        IpAddr::V6(Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1)),
        IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1)),
    ]
}

/// Address `i` of the pool: own addresses, peers of both families, a
/// multicast and a loopback address (which resolve refuses or maps).
fn pool(i: u8) -> IpAddr {
    match i % 12 {
        0..=2 => own()[usize::from(i % 12)],
        3..=5 => IpAddr::V4(Ipv4Addr::new(10, 0, 0, i % 12 - 1)),
        6..=8 => IpAddr::V6(Ipv6Addr::new(
            0xfe80,
            0,
            0,
            0,
            0,
            0,
            0,
            u16::from(i % 12 - 4),
        )),
        9 => IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 2)),
        10 => IpAddr::V6(Ipv6Addr::new(0xff02, 0, 0, 0, 0, 1, 0xff00, 2)),
        _ => IpAddr::V4(Ipv4Addr::LOCALHOST),
    }
}

fn mac(input: &mut Input<'_>) -> EthernetAddress {
    match input.u8() % 6 {
        0..=2 => PEERS[usize::from(input.u8() % 3)],
        3 => OWN_MAC,
        4 => EthernetAddress::BROADCAST,
        _ => EthernetAddress([
            input.u8(),
            input.u8(),
            input.u8(),
            input.u8(),
            input.u8(),
            input.u8(),
        ]),
    }
}

fn v4(input: &mut Input<'_>) -> Ipv4Addr {
    match pool(input.u8()) {
        IpAddr::V4(a) => a,
        IpAddr::V6(_) => Ipv4Addr::from(input.u32()),
    }
}

fn v6(input: &mut Input<'_>) -> Ipv6Addr {
    match (input.u8() % 4, pool(input.u8())) {
        (0, _) => Ipv6Addr::UNSPECIFIED,
        (1, IpAddr::V6(a)) => icmpv6::solicited_node(a),
        (_, IpAddr::V6(a)) => a,
        (_, IpAddr::V4(_)) => Ipv6Addr::from((u128::from(input.u64()) << 64) | 0xfe80),
    }
}

/// A frame built from the input: Ethernet header (VLAN or not), then ARP
/// or IPv6 + ICMPv6 neighbour discovery, then damage.
fn frame(input: &mut Input<'_>) -> Vec<u8> {
    let kind = input.u8();
    if kind.is_multiple_of(8) {
        let len = usize::from(input.u8());
        return input.bytes(len).to_vec();
    }
    let vlan = match input.u8() % 3 {
        0 => None,
        1 => Some(VLAN),
        _ => Some(VlanTag::from_tci(input.u16())),
    };
    let (dst, src) = (mac(input), mac(input));
    let mut f = vec![0u8; 18 + 40 + 40];
    let (ethertype, body_len) = if kind % 2 == 1 {
        let repr = arp::Repr {
            operation: if input.u8().is_multiple_of(2) {
                arp::Operation::Request
            } else {
                arp::Operation::Reply
            },
            source_hardware_addr: mac(input),
            source_protocol_addr: v4(input),
            target_hardware_addr: mac(input),
            target_protocol_addr: v4(input),
        };
        let at = if vlan.is_some() { 18 } else { 14 };
        repr.emit(&mut f[at..]).expect("room for ARP");
        (EtherType::ARP, arp::PACKET_LEN)
    } else {
        let (ip_src, ip_dst, target) = (v6(input), v6(input), v6(input));
        let lladdr = (!input.u8().is_multiple_of(3)).then(|| mac(input));
        let flags = input.u8();
        let nd = if kind % 4 == 2 {
            NdRepr::Solicit { target, lladdr }
        } else {
            NdRepr::Advert {
                flags: AdvertFlags {
                    router: flags & 1 != 0,
                    solicited: flags & 2 != 0,
                    override_: flags & 4 != 0,
                },
                target,
                lladdr,
            }
        };
        let hop_limit = if flags & 0x80 != 0 { input.u8() } else { 255 };
        let at = if vlan.is_some() { 18 } else { 14 };
        let ip = Ipv6Repr {
            src_addr: ip_src,
            dst_addr: ip_dst,
            traffic_class: 0,
            flow_label: 0,
            next_header: PROTOCOL_ICMPV6,
            hop_limit,
            payload_len: nd.buffer_len(),
        };
        ip.emit(&mut f[at..]).expect("room for IPv6");
        let n = nd
            .emit(ip_src, ip_dst, &mut f[at + 40..])
            .expect("room for ND");
        (EtherType::IPV6, 40 + n)
    };
    let eth = EthernetRepr {
        dst_addr: dst,
        src_addr: src,
        vlan,
        ethertype,
    };
    eth.emit(&mut f).expect("room for Ethernet");
    f.truncate(eth.buffer_len() + body_len);
    damage(input, &mut f, eth.buffer_len());
    f
}

/// Truncate, or change bytes (then maybe fix the ICMPv6 checksum so the
/// change reaches the validity rules), or leave whole.
fn damage(input: &mut Input<'_>, f: &mut Vec<u8>, l3: usize) {
    match input.u8() % 4 {
        0 => {
            let keep = usize::from(input.u8()) % (f.len() + 1);
            f.truncate(keep);
        }
        1 => {
            for _ in 0..=input.u8() % 3 {
                let at = usize::from(input.u16()) % f.len();
                f[at] ^= input.u8().max(1);
            }
            if input.u8().is_multiple_of(2) {
                fix_checksum(f, l3);
            }
        }
        _ => {}
    }
}

fn fix_checksum(f: &mut [u8], l3: usize) {
    let Some(ip) = f.get(l3..).and_then(|b| Ipv6Packet::new_checked(b).ok()) else {
        return;
    };
    let (src, dst, len) = (ip.src_addr(), ip.dst_addr(), usize::from(ip.payload_len()));
    if let Some(msg) = f.get_mut(l3 + 40..l3 + 40 + len) {
        icmpv6::Packet::new_unchecked(msg).fill_checksum(src, dst);
    }
}

/// Run the program in `data` (see the module docs); panics on a broken
/// invariant.
pub fn frames(data: &[u8]) {
    run(data);
}

/// How a program ended: the counters and the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct End {
    /// The engine's counters.
    pub counters: Counters,
    /// The cache at the end.
    pub entries: Vec<Neighbour>,
}

/// [`frames`], returning how the program ended.
pub fn run(data: &[u8]) -> End {
    let mut input = Input::new(data);
    let shape = input.u8();
    let mut config = Config {
        vlan: (shape & 1 != 0).then_some(VLAN),
        ..Config::default()
    };
    if shape & 2 != 0 {
        config.max_entries = 6;
        config.max_incomplete = 3;
        config.tx_queue = 4;
        config.event_queue = 3;
        config.rate_sources = 2;
    }
    let mut n = Neighbours::new(config.clone()).expect("a valid config");
    let mut now = 0u64;
    for ip in own() {
        n.add_own(Instant::from_nanos(now), ip, OWN_MAC)
            .expect("own address");
    }
    let mut asked: BTreeSet<IpAddr> = BTreeSet::new();
    let mut pinned: BTreeMap<IpAddr, EthernetAddress> = BTreeMap::new();
    let mut fed = 0u64;
    let mut steps = 0;
    while !input.is_empty() && steps < 256 {
        steps += 1;
        let t = Instant::from_nanos(now);
        match input.u8() % 8 {
            0 => {
                let ip = pool(input.u8());
                if let Ok(r) = n.resolve(t, ip) {
                    asked.insert(ip);
                    if let (Resolution::Known(m), Some(e)) = (r, n.lookup(t, ip))
                        && e.state != State::Failed
                    {
                        assert_eq!(e.mac, Some(m), "resolve and the listing disagree on {ip}");
                    }
                }
            }
            1 => {
                let (ip, m) = (pool(input.u8()), mac(&mut input));
                if n.set_static(t, ip, m).is_ok() {
                    pinned.insert(ip, m);
                }
            }
            2 => {
                if input.u8().is_multiple_of(2) {
                    let ip = pool(input.u8());
                    if n.remove_static(ip) {
                        pinned.remove(&ip);
                    }
                } else {
                    n.forget(pool(input.u8()));
                }
            }
            3 => {
                now += u64::from(input.u16()) * 1_000_000;
                n.poll(Instant::from_nanos(now));
            }
            _ => {
                let f = frame(&mut input);
                n.on_frame(t, &f);
                fed += 1;
            }
        }
        check(
            &mut n,
            &config,
            Instant::from_nanos(now),
            &asked,
            &pinned,
            fed,
        );
    }
    End {
        counters: *n.counters(),
        entries: n.entries(Instant::from_nanos(now)),
    }
}

/// Run the checks over an engine holding an entry the caller claims
/// nobody asked for: the entry check must fire (see the tests).
pub fn check_an_unasked_entry() {
    let config = Config::default();
    let mut n = Neighbours::new(config.clone()).expect("config");
    let t = Instant::from_nanos(0);
    n.add_own(t, own()[0], OWN_MAC).expect("own");
    n.resolve(t, pool(3)).expect("resolve");
    check(&mut n, &config, t, &BTreeSet::new(), &BTreeMap::new(), 0);
}

fn check(
    n: &mut Neighbours,
    config: &Config,
    now: Instant,
    asked: &BTreeSet<IpAddr>,
    pinned: &BTreeMap<IpAddr, EthernetAddress>,
    fed: u64,
) {
    let entries = n.entries(now);
    assert!(entries.len() <= config.max_entries, "cache over its bound");
    let incomplete = entries
        .iter()
        .filter(|e| e.state == State::Incomplete)
        .count();
    assert!(incomplete <= config.max_incomplete, "too many resolutions");
    for e in &entries {
        assert!(
            asked.contains(&e.ip) || pinned.contains_key(&e.ip),
            "an entry nobody asked for: {e}"
        );
        if e.state == State::Static {
            assert_eq!(
                Some(&e.mac.expect("a static MAC")),
                pinned.get(&e.ip),
                "a static entry changed: {e}"
            );
        }
    }
    let c = n.counters();
    assert_eq!(c.frames_in, fed, "frames counted");
    assert_eq!(c.dispositions(), c.frames_in, "dispositions: {c:?}");
    assert!(
        n.pending_transmit() <= config.tx_queue,
        "tx queue over its bound"
    );
    while let Some(f) = n.transmit() {
        check_output(&f, config.vlan);
    }
    while n.event().is_some() {}
}

/// A frame the engine sends: tagged as configured, from the own MAC, ARP
/// from an own address, or neighbour discovery that passes every RFC 4861
/// check, from an own address, with hop limit 255.
fn check_output(f: &[u8], vlan: Option<VlanTag>) {
    let eth = EthernetPacket::new_checked(f).expect("an output frame parses");
    assert_eq!(eth.src_addr(), OWN_MAC, "sent from another MAC");
    assert_eq!(eth.vlan(), vlan, "tagged otherwise than configured");
    assert!(f.len() >= eth.header_len() + 46, "a runt frame");
    let own = own();
    if eth.ethertype() == EtherType::ARP {
        let a = arp::Repr::parse(&arp::Packet::new_checked(eth.payload()).expect("ARP"))
            .expect("a valid ARP packet");
        assert_eq!(a.source_hardware_addr, OWN_MAC);
        assert!(own.contains(&IpAddr::V4(a.source_protocol_addr)));
        return;
    }
    assert_eq!(eth.ethertype(), EtherType::IPV6, "neither ARP nor IPv6");
    let ip = Ipv6Packet::new_checked(eth.payload()).expect("IPv6");
    let hdr = Ipv6Repr::parse(&ip).expect("an IPv6 header");
    assert!(
        own.contains(&IpAddr::V6(hdr.src_addr)),
        "from {}",
        hdr.src_addr
    );
    let msg = icmpv6::Packet::new_checked(ip.payload()).expect("ICMPv6");
    match Message::parse(&hdr, &msg) {
        Ok(Message::Nd(nd)) => assert_eq!(nd.lladdr(), Some(OWN_MAC)),
        other => panic!("not a valid ND message: {other:?}"),
    }
}

/// Hand-made programs for the seed corpus: honest resolutions answered,
/// requests answered, and hostile frames (the encoding is [`frames`]').
pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    // Resolve 10.0.0.2; its ARP reply (peer 0 → own MAC, 10.0.0.2 is-at
    // peer 0, for 10.0.0.1); one second passes.
    let arp_resolve = vec![
        0, 0, 3, 4, 1, 0, 3, 0, 0, 1, 0, 0, 3, 3, 0, 3, 3, 0x03, 0xe8,
    ];
    // Resolve fe80::2; a solicited advertisement (S, O) from fe80::2 with
    // peer 1's MAC; 60 s pass (stale); resolve (Delay); 5 s (first probe),
    // then three more seconds: probes 2 and 3, failure.
    let mut nd_resolve = vec![0, 0, 6, 4, 4, 0, 3, 0, 1, 2, 6, 2, 1, 2, 6, 1, 0, 1, 6, 3];
    nd_resolve.extend_from_slice(&[3, 0xea, 0x60, 0, 6, 3, 0x13, 0x88]);
    nd_resolve.extend_from_slice(&[3, 0x03, 0xe8, 3, 0x03, 0xe8, 3, 0x03, 0xe8]);
    // Tight config: 40 broadcast ARP requests for 10.0.0.1 from peer 0.
    let mut flood = vec![2];
    for _ in 0..40 {
        flood.extend_from_slice(&[4, 1, 0, 4, 0, 0, 0, 0, 0, 3, 3, 0, 3]);
    }
    // On VLAN 42: a solicitation for fe80::1 from fe80::2 to its
    // solicited-node group; a DAD probe for it; the first again with its
    // type changed to 134 (RA) and the checksum fixed, which breaks the
    // RA's option rule.
    let group = [5, 0x33, 0x33, 0xff, 0, 0, 1];
    let mut ns = vec![1];
    for (src, ip_src, lladdr, damage) in [
        (&[0u8, 1][..], [2u8, 6], &[1u8, 0, 1][..], &[3u8][..]),
        (&[0, 2][..], [0, 0], &[0][..], &[3][..]),
        (
            &[0, 1][..],
            [2, 6],
            &[1, 0, 1][..],
            &[1, 0, 0, 58, 1, 0][..],
        ),
    ] {
        ns.extend_from_slice(&[4, 2, 1]);
        ns.extend_from_slice(&group);
        ns.extend_from_slice(src);
        ns.extend_from_slice(&ip_src);
        ns.extend_from_slice(&[1, 1, 2, 1]);
        ns.extend_from_slice(lladdr);
        ns.push(0);
        ns.extend_from_slice(damage);
    }
    let garbage: Vec<u8> = (0..200u16).map(|i| (i * 37 % 251) as u8).collect();
    vec![
        ("arp-resolve", arp_resolve),
        ("nd-resolve-stale-probe", nd_resolve),
        ("arp-flood", flood),
        ("ns-dad-damaged", ns),
        ("garbage", garbage),
    ]
}
