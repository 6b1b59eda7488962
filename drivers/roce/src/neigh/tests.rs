//! The neighbour engine against byte-exact frames (golden vectors computed
//! independently with Python from RFC 826/4861/8200, and read back by
//! `tcpdump` where it is installed) and a fake clock.

use core::time::Duration;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use proptest::prelude::*;

use super::*;
use crate::wire::icmpv6::{self, AdvertFlags, NdRepr};
use crate::wire::{VlanTag, arp};

mod hostile;
mod tcpdump;

pub(super) const OWN_MAC: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 1]);
pub(super) const PEER_MAC: EthernetAddress = EthernetAddress([0x52, 0x54, 0, 0x12, 0x34, 0x56]);
pub(super) const OTHER_MAC: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 0x99]);

/// 52:54:00:12:34:56 ← 02:00:00:00:00:01: "10.0.0.1 is-at 02:00:00:00:00:01", padded to 60.
const ARP_REPLY: &str = "525400123456020000000001080600010800060400020200000000010a0000015254001234560a000002000000000000000000000000000000000000";
/// Gratuitous ARP for 10.0.0.1, broadcast.
const GARP: &str = "ffffffffffff020000000001080600010800060400010200000000010a0000010000000000000a000001000000000000000000000000000000000000";
/// "who-has 10.0.0.2 tell 10.0.0.1" on VLAN 100 priority 3, padded to 64.
const ARP_REQUEST_VLAN: &str = "ffffffffffff02000000000181006064080600010800060400010200000000010a0000010000000000000a000002000000000000000000000000000000000000";
/// fe80::1 → fe80::5054:ff:fe12:3456: "fe80::1 is at 02:00:00:00:00:01" (S, O).
const NA: &str = "52540012345602000000000186dd6000000000203afffe800000000000000000000000000001fe80000000000000505400fffe1234568800946160000000fe8000000000000000000000000000010201020000000001";
/// fe80::1 → ff02::1:ff00:2 (33:33:ff:00:00:02): "who has fe80::2".
const NS: &str = "3333ff00000202000000000186dd6000000000203afffe800000000000000000000000000001ff0200000000000000000001ff00000287007a9700000000fe8000000000000000000000000000020101020000000001";
/// fe80::1 → ff02::1: unsolicited advertisement (O) of fe80::1.
const UNSOLICITED_NA: &str = "33330000000102000000000186dd6000000000203afffe800000000000000000000000000001ff0200000000000000000000000000018800579b20000000fe8000000000000000000000000000010201020000000001";

pub(super) fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

pub(super) fn v4(d: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, 0, d))
}

pub(super) fn v6(s: &str) -> IpAddr {
    IpAddr::V6(s.parse().expect("address"))
}

pub(super) fn ms(n: u64) -> Instant {
    Instant::from_nanos(n * 1_000_000)
}

/// An engine owning 10.0.0.1 and fe80::1 at OWN_MAC, announcements drained.
pub(super) fn engine_with(config: Config) -> Neighbours {
    let mut n = Neighbours::new(config).expect("config");
    n.add_own(ms(0), v4(1), OWN_MAC).expect("own v4");
    n.add_own(ms(0), v6("fe80::1"), OWN_MAC).expect("own v6");
    drain(&mut n);
    n
}

pub(super) fn engine() -> Neighbours {
    engine_with(Config {
        announcements: 1,
        ..Config::default()
    })
}

pub(super) fn drain(n: &mut Neighbours) -> Vec<Vec<u8>> {
    std::iter::from_fn(|| n.transmit())
        .map(|f| f.to_vec())
        .collect()
}

pub(super) fn events(n: &mut Neighbours) -> Vec<Event> {
    std::iter::from_fn(|| n.event()).collect()
}

/// An ARP frame `repr` sent by its sender hardware address to `dst`.
pub(super) fn arp_in(dst: EthernetAddress, repr: &arp::Repr) -> Vec<u8> {
    frame::arp(dst, repr.source_hardware_addr, None, repr)
        .expect("frame")
        .to_vec()
}

/// A neighbour discovery frame.
pub(super) fn nd_in(
    eth: (EthernetAddress, EthernetAddress),
    src: &str,
    dst: &str,
    nd: &NdRepr,
) -> Vec<u8> {
    let (s, d): (Ipv6Addr, Ipv6Addr) = (src.parse().expect("src"), dst.parse().expect("dst"));
    frame::nd(eth.0, eth.1, None, s, d, nd)
        .expect("frame")
        .to_vec()
}

fn request(sha: EthernetAddress, spa: u8, tpa: u8) -> arp::Repr {
    arp::Repr::request(
        sha,
        Ipv4Addr::new(10, 0, 0, spa),
        Ipv4Addr::new(10, 0, 0, tpa),
    )
}

fn reply(sha: EthernetAddress, spa: u8, tpa: u8, tha: EthernetAddress) -> arp::Repr {
    arp::Repr {
        operation: arp::Operation::Reply,
        target_hardware_addr: tha,
        ..request(sha, spa, tpa)
    }
}

fn advert(target: &str, mac: EthernetAddress, solicited: bool, override_: bool) -> NdRepr {
    NdRepr::Advert {
        flags: AdvertFlags {
            router: false,
            solicited,
            override_,
        },
        target: target.parse().expect("target"),
        lladdr: Some(mac),
    }
}

#[test]
fn answers_an_arp_request_for_an_own_address_byte_exactly() {
    let mut n = engine();
    let out = n.on_frame(
        ms(5),
        &arp_in(EthernetAddress::BROADCAST, &request(PEER_MAC, 2, 1)),
    );
    assert_eq!(out, Outcome::Answered { target: v4(1) });
    assert_eq!(drain(&mut n), vec![hex(ARP_REPLY)]);
    // Answering creates no entry for the asker (nobody asked to resolve it).
    assert!(n.is_empty());
    assert_eq!(n.counters().answered, 1);
    // A request for someone else: ignored, nothing sent, nothing created.
    let out = n.on_frame(
        ms(6),
        &arp_in(EthernetAddress::BROADCAST, &request(PEER_MAC, 2, 3)),
    );
    assert_eq!(out, Outcome::Ignored(Ignored::NotForUs));
    assert!(drain(&mut n).is_empty() && n.is_empty());
}

#[test]
fn answers_a_solicitation_byte_exactly_and_defends_against_dad() {
    let mut n = engine();
    let ns = NdRepr::Solicit {
        target: "fe80::1".parse().expect("addr"),
        lladdr: Some(PEER_MAC),
    };
    let group = EthernetAddress::from_ipv6_multicast(icmpv6::solicited_node(
        "fe80::1".parse().expect("addr"),
    ));
    let f = nd_in(
        (group, PEER_MAC),
        "fe80::5054:ff:fe12:3456",
        "ff02::1:ff00:1",
        &ns,
    );
    assert_eq!(
        n.on_frame(ms(1), &f),
        Outcome::Answered {
            target: v6("fe80::1")
        }
    );
    assert_eq!(drain(&mut n), vec![hex(NA)]);
    assert!(n.is_empty());

    // Duplicate address detection for our address: an advertisement to all
    // nodes, without the Solicited flag.
    let dad = NdRepr::Solicit {
        target: "fe80::1".parse().expect("addr"),
        lladdr: None,
    };
    let f = nd_in((group, PEER_MAC), "::", "ff02::1:ff00:1", &dad);
    assert_eq!(
        n.on_frame(ms(2), &f),
        Outcome::Answered {
            target: v6("fe80::1")
        }
    );
    assert_eq!(drain(&mut n), vec![hex(UNSOLICITED_NA)]);

    // A solicitation for our address sent to another group is not for us.
    let f = nd_in(
        (group, PEER_MAC),
        "fe80::5054:ff:fe12:3456",
        "ff02::1:ff00:9",
        &ns,
    );
    assert_eq!(n.on_frame(ms(3), &f), Outcome::Ignored(Ignored::NotForUs));
}

#[test]
fn own_addresses_are_announced_on_add_and_retired_on_remove() {
    let mut n = Neighbours::new(Config::default()).expect("config");
    n.add_own(ms(0), v4(1), OWN_MAC).expect("own");
    n.add_own(ms(0), v6("fe80::1"), OWN_MAC).expect("own");
    assert_eq!(drain(&mut n), vec![hex(GARP), hex(UNSOLICITED_NA)]);
    // Three announcements each, one second apart.
    assert_eq!(n.next_deadline(), Some(ms(1000)));
    n.poll(ms(999));
    assert!(drain(&mut n).is_empty());
    n.poll(ms(1000));
    assert_eq!(drain(&mut n), vec![hex(GARP), hex(UNSOLICITED_NA)]);
    assert!(n.remove_own(v6("fe80::1")));
    n.poll(ms(2000));
    assert_eq!(drain(&mut n), vec![hex(GARP)]);
    assert_eq!(n.next_deadline(), None);
    assert_eq!(n.counters().announcements_sent, 5);
    // A removed address is not answered.
    let out = n.on_frame(
        ms(3000),
        &nd_in(
            (OWN_MAC, PEER_MAC),
            "fe80::2",
            "fe80::1",
            &NdRepr::Solicit {
                target: "fe80::1".parse().expect("addr"),
                lladdr: Some(PEER_MAC),
            },
        ),
    );
    assert_eq!(out, Outcome::Ignored(Ignored::NotForUs));
    assert_eq!(
        n.own_addresses().collect::<Vec<_>>(),
        vec![(v4(1), OWN_MAC)]
    );
}

#[test]
fn resolution_retries_at_one_second_and_fails_after_three() {
    let mut n = engine();
    let r = n.resolve(ms(0), v4(2)).expect("resolve");
    assert_eq!(r, Resolution::Pending { deadline: ms(3000) });
    let first = drain(&mut n);
    assert_eq!(first.len(), 1);
    // Broadcast "who-has 10.0.0.2 tell 10.0.0.1".
    let mut want = hex(ARP_REQUEST_VLAN);
    want.drain(12..16);
    want.truncate(60);
    assert_eq!(first[0], want);
    assert_eq!(n.resolve(ms(10), v4(2)), Ok(r), "no second solicitation");
    assert!(drain(&mut n).is_empty());

    for at in [1000, 2000] {
        assert_eq!(n.next_deadline(), Some(ms(at)));
        n.poll(ms(at - 1));
        assert!(drain(&mut n).is_empty(), "nothing before {at} ms");
        n.poll(ms(at));
        assert_eq!(drain(&mut n), vec![want.clone()], "retry at {at} ms");
    }
    n.poll(ms(2999));
    assert!(events(&mut n).is_empty());
    n.poll(ms(3000));
    assert_eq!(
        events(&mut n),
        vec![Event::Failed {
            ip: v4(2),
            tries: 3
        }]
    );
    assert!(drain(&mut n).is_empty());
    assert_eq!(n.next_deadline(), None);
    let failed = Resolution::Failed {
        ip: v4(2),
        tries: 3,
    };
    assert_eq!(n.resolve(ms(5999), v4(2)), Ok(failed), "within failed_hold");
    assert_eq!(
        n.lookup(ms(5999), v4(2)).map(|e| e.state),
        Some(State::Failed)
    );
    // After the hold, a resolve starts over.
    assert_eq!(
        n.resolve(ms(6000), v4(2)),
        Ok(Resolution::Pending { deadline: ms(9000) })
    );
    assert_eq!(drain(&mut n), vec![want]);
    let c = n.counters();
    assert_eq!((c.solicitations_sent, c.failed), (4, 1));
}

#[test]
fn a_reply_resolves_then_the_entry_goes_stale_delay_probe_failed() {
    let mut n = engine();
    n.resolve(ms(0), v4(2)).expect("resolve");
    drain(&mut n);
    let out = n.on_frame(ms(300), &arp_in(OWN_MAC, &reply(PEER_MAC, 2, 1, OWN_MAC)));
    assert_eq!(
        out,
        Outcome::Learned {
            ip: v4(2),
            mac: PEER_MAC
        }
    );
    assert_eq!(
        events(&mut n),
        vec![Event::Resolved {
            ip: v4(2),
            mac: PEER_MAC
        }]
    );
    assert_eq!(n.resolve(ms(400), v4(2)), Ok(Resolution::Known(PEER_MAC)));
    let e = n.lookup(ms(400), v4(2)).expect("entry");
    assert_eq!(
        (e.state, e.mac, e.age),
        (State::Reachable, Some(PEER_MAC), Duration::from_millis(100))
    );
    assert_eq!(n.next_deadline(), None, "no retransmission once answered");

    // Reachable lasts 15..45 s, then Stale; a stale entry still resolves.
    assert_eq!(
        n.lookup(ms(15_299), v4(2)).map(|e| e.state),
        Some(State::Reachable)
    );
    let t = ms(45_300);
    assert_eq!(n.lookup(t, v4(2)).map(|e| e.state), Some(State::Stale));
    assert_eq!(n.resolve(t, v4(2)), Ok(Resolution::Known(PEER_MAC)));
    assert_eq!(n.lookup(t, v4(2)).map(|e| e.state), Some(State::Delay));
    assert!(drain(&mut n).is_empty());
    // Delay 5 s, then unicast probes to the cached MAC, 1 s apart.
    let probe_at = ms(50_300);
    assert_eq!(n.next_deadline(), Some(probe_at));
    let mut unicast = arp_in(PEER_MAC, &request(OWN_MAC, 1, 2));
    unicast.resize(60, 0);
    for i in 0..3 {
        n.poll(probe_at.after(Duration::from_secs(i)));
        assert_eq!(drain(&mut n), vec![unicast.clone()], "probe {i}");
        assert_eq!(n.resolve(probe_at, v4(2)), Ok(Resolution::Known(PEER_MAC)));
    }
    assert_eq!(
        n.lookup(probe_at, v4(2)).map(|e| (e.state, e.tries)),
        Some((State::Probe, 3))
    );
    n.poll(probe_at.after(Duration::from_secs(3)));
    assert_eq!(
        events(&mut n),
        vec![Event::Failed {
            ip: v4(2),
            tries: 3
        }]
    );
    assert_eq!(n.counters().probes_sent, 3);
}

#[test]
fn a_probe_answer_or_a_confirmation_makes_the_entry_reachable_again() {
    let mut n = engine();
    n.resolve(ms(0), v4(2)).expect("resolve");
    n.on_frame(ms(0), &arp_in(OWN_MAC, &reply(PEER_MAC, 2, 1, OWN_MAC)));
    drain(&mut n);
    let stale = ms(60_000);
    n.resolve(stale, v4(2)).expect("delay");
    // An upper-layer confirmation during Delay: no probe.
    assert!(n.confirm(stale.after(Duration::from_secs(1)), v4(2)));
    assert_eq!(n.next_deadline(), None);
    assert_eq!(
        n.lookup(stale, v4(2)).map(|e| e.state),
        Some(State::Reachable)
    );
    // Stale again, probing, answered.
    let later = ms(200_000);
    n.resolve(later, v4(2)).expect("delay");
    n.poll(later.after(Duration::from_secs(5)));
    assert_eq!(drain(&mut n).len(), 1);
    n.on_frame(
        later.after(Duration::from_secs(6)),
        &arp_in(OWN_MAC, &reply(PEER_MAC, 2, 1, OWN_MAC)),
    );
    assert_eq!(
        n.lookup(later, v4(2)).map(|e| e.state),
        Some(State::Reachable)
    );
    assert_eq!(n.next_deadline(), None);
    assert!(!n.confirm(later, v4(3)), "no entry, nothing confirmed");
}

#[test]
fn replies_for_addresses_never_asked_about_create_nothing() {
    let mut n = engine();
    let frames = [
        arp_in(OWN_MAC, &reply(PEER_MAC, 2, 1, OWN_MAC)),
        arp_in(
            EthernetAddress::BROADCAST,
            &arp::Repr::gratuitous(PEER_MAC, Ipv4Addr::new(10, 0, 0, 2)),
        ),
        nd_in(
            (OWN_MAC, PEER_MAC),
            "fe80::2",
            "fe80::1",
            &advert("fe80::2", PEER_MAC, true, true),
        ),
        nd_in(
            (
                EthernetAddress::from_ipv6_multicast(icmpv6::ALL_NODES),
                PEER_MAC,
            ),
            "fe80::2",
            "ff02::1",
            &advert("fe80::2", PEER_MAC, false, true),
        ),
    ];
    for f in &frames {
        assert_eq!(n.on_frame(ms(1), f), Outcome::Ignored(Ignored::Unsolicited));
    }
    assert!(n.is_empty() && events(&mut n).is_empty() && drain(&mut n).is_empty());
    assert_eq!(n.counters().ignored.unsolicited, 4);
    // A solicitation from a stranger is answered but creates no entry either.
    let ns = NdRepr::Solicit {
        target: "fe80::1".parse().expect("addr"),
        lladdr: Some(PEER_MAC),
    };
    n.on_frame(
        ms(2),
        &nd_in((OWN_MAC, PEER_MAC), "fe80::2", "fe80::1", &ns),
    );
    assert!(n.is_empty());
}

#[test]
fn ipv6_resolution_by_solicitation_and_the_rfc4861_update_rules() {
    let mut n = engine();
    let r = n.resolve(ms(0), v6("fe80::2")).expect("resolve");
    assert!(matches!(r, Resolution::Pending { .. }));
    assert_eq!(drain(&mut n), vec![hex(NS)]);
    // An unsolicited advertisement resolves too, but only to Stale.
    let all = EthernetAddress::from_ipv6_multicast(icmpv6::ALL_NODES);
    let f = nd_in(
        (all, PEER_MAC),
        "fe80::2",
        "ff02::1",
        &advert("fe80::2", PEER_MAC, false, true),
    );
    assert!(matches!(n.on_frame(ms(5), &f), Outcome::Learned { .. }));
    assert_eq!(
        n.lookup(ms(5), v6("fe80::2")).map(|e| e.state),
        Some(State::Stale)
    );
    // The solicited answer makes it reachable.
    let solicited = nd_in(
        (OWN_MAC, PEER_MAC),
        "fe80::2",
        "fe80::1",
        &advert("fe80::2", PEER_MAC, true, false),
    );
    assert!(matches!(
        n.on_frame(ms(6), &solicited),
        Outcome::Learned { .. }
    ));
    assert_eq!(
        n.lookup(ms(6), v6("fe80::2")).map(|e| e.state),
        Some(State::Reachable)
    );
    // Another MAC without Override: not applied, the entry turns stale.
    let other = nd_in(
        (OWN_MAC, OTHER_MAC),
        "fe80::2",
        "fe80::1",
        &advert("fe80::2", OTHER_MAC, true, false),
    );
    assert_eq!(
        n.on_frame(ms(7), &other),
        Outcome::Ignored(Ignored::NotApplied)
    );
    let e = n.lookup(ms(7), v6("fe80::2")).expect("entry");
    assert_eq!((e.state, e.mac), (State::Stale, Some(PEER_MAC)));
    // With Override (and Solicited): replaced, reachable, reported.
    let moved = nd_in(
        (OWN_MAC, OTHER_MAC),
        "fe80::2",
        "fe80::1",
        &advert("fe80::2", OTHER_MAC, true, true),
    );
    assert!(matches!(n.on_frame(ms(8), &moved), Outcome::Learned { .. }));
    let e = n.lookup(ms(8), v6("fe80::2")).expect("entry");
    assert_eq!((e.state, e.mac), (State::Reachable, Some(OTHER_MAC)));
    assert_eq!(
        events(&mut n),
        vec![
            Event::Resolved {
                ip: v6("fe80::2"),
                mac: PEER_MAC
            },
            Event::MacChanged {
                ip: v6("fe80::2"),
                old: PEER_MAC,
                new: OTHER_MAC
            }
        ]
    );
    // A solicitation from the tracked peer with a new source MAC: updated, stale.
    let ns = NdRepr::Solicit {
        target: "fe80::1".parse().expect("addr"),
        lladdr: Some(PEER_MAC),
    };
    let f = nd_in((OWN_MAC, PEER_MAC), "fe80::2", "fe80::1", &ns);
    assert!(matches!(n.on_frame(ms(9), &f), Outcome::Answered { .. }));
    let e = n.lookup(ms(9), v6("fe80::2")).expect("entry");
    assert_eq!((e.state, e.mac), (State::Stale, Some(PEER_MAC)));
    // Unicast probe for IPv6: to the address and MAC cached.
    n.resolve(ms(10), v6("fe80::2")).expect("delay");
    drain(&mut n);
    n.poll(ms(5010));
    let probe = drain(&mut n);
    assert_eq!(probe.len(), 1);
    assert_eq!(&probe[0][..6], &PEER_MAC.0);
    assert_eq!(
        &probe[0][38..54],
        &"fe80::2".parse::<Ipv6Addr>().expect("a").octets()
    );
}

#[test]
fn static_entries_win_and_complete_pending_resolutions() {
    let mut n = engine();
    n.resolve(ms(0), v4(2)).expect("resolve");
    drain(&mut n);
    n.set_static(ms(1), v4(2), OTHER_MAC).expect("static");
    assert_eq!(
        events(&mut n),
        vec![Event::Resolved {
            ip: v4(2),
            mac: OTHER_MAC
        }]
    );
    assert_eq!(n.next_deadline(), None, "no more solicitations");
    let out = n.on_frame(ms(2), &arp_in(OWN_MAC, &reply(PEER_MAC, 2, 1, OWN_MAC)));
    assert_eq!(out, Outcome::Ignored(Ignored::StaticKept));
    assert_eq!(
        n.resolve(ms(100_000), v4(2)),
        Ok(Resolution::Known(OTHER_MAC))
    );
    let e = n.lookup(ms(100_000), v4(2)).expect("entry");
    assert!(e.is_static());
    assert_eq!(
        e.to_string(),
        "10.0.0.2 lladdr 02:00:00:00:00:99 PERMANENT age 100.0s"
    );
    assert!(!n.forget(v4(2)), "forget leaves static entries");
    assert!(n.remove_static(v4(2)));
    assert!(!n.remove_static(v4(2)));
    assert!(n.is_empty());
    // Errors name the fix.
    assert_eq!(
        n.set_static(ms(3), v4(1), OTHER_MAC),
        Err(Error::OwnAddress { ip: v4(1) })
    );
    let multicast = EthernetAddress([1, 0, 0x5e, 0, 0, 1]);
    assert_eq!(
        n.set_static(ms(3), v4(5), multicast),
        Err(Error::NotUnicastMac { mac: multicast })
    );
    assert!(matches!(
        n.set_static(ms(3), v6("ff02::1"), OTHER_MAC),
        Err(Error::NotUnicastIp { .. })
    ));
}

#[test]
fn resolve_maps_multicast_own_and_refuses_what_has_no_neighbour() {
    let mut n = engine();
    assert_eq!(
        n.resolve(ms(0), v6("ff02::1:ff00:2")),
        Ok(Resolution::Known(EthernetAddress([
            0x33, 0x33, 0xff, 0, 0, 2
        ])))
    );
    assert_eq!(
        n.resolve(ms(0), IpAddr::V4(Ipv4Addr::new(239, 129, 2, 3))),
        Ok(Resolution::Known(EthernetAddress([1, 0, 0x5e, 1, 2, 3])))
    );
    assert_eq!(
        n.resolve(ms(0), IpAddr::V4(Ipv4Addr::BROADCAST)),
        Ok(Resolution::Known(EthernetAddress::BROADCAST))
    );
    assert_eq!(n.resolve(ms(0), v4(1)), Ok(Resolution::Known(OWN_MAC)));
    assert_eq!(
        n.resolve(ms(0), v6("::1")),
        Err(Error::Unresolvable { ip: v6("::1") })
    );
    assert!(n.is_empty() && drain(&mut n).is_empty());
    let mut bare = Neighbours::new(Config::default()).expect("config");
    let err = bare
        .resolve(ms(0), v6("2001:db8::2"))
        .expect_err("no source");
    assert_eq!(
        err,
        Error::NoSourceAddress {
            ip: v6("2001:db8::2"),
            family: 6
        }
    );
    assert!(err.to_string().contains("add_own"));
    assert!(bare.is_empty());
}

#[test]
fn the_source_address_matches_the_target_scope_and_prefix() {
    let mut n = engine();
    n.add_own(ms(0), v6("2001:db8:1::1"), OTHER_MAC)
        .expect("own");
    n.add_own(ms(0), v6("2001:db8:2::1"), OWN_MAC).expect("own");
    n.add_own(ms(0), IpAddr::V4(Ipv4Addr::new(192, 168, 7, 1)), OTHER_MAC)
        .expect("own");
    drain(&mut n);
    n.resolve(ms(0), v6("2001:db8:1::2")).expect("resolve");
    n.resolve(ms(0), v6("fe80::7")).expect("resolve");
    n.resolve(ms(0), IpAddr::V4(Ipv4Addr::new(192, 168, 7, 9)))
        .expect("resolve");
    let f = drain(&mut n);
    // IPv6 source at bytes 22..38, the SLLA at the end; ARP sender at 22..32.
    assert_eq!(
        &f[0][22..38],
        &"2001:db8:1::1".parse::<Ipv6Addr>().expect("a").octets()
    );
    assert_eq!(&f[0][f[0].len() - 6..], &OTHER_MAC.0);
    assert_eq!(
        &f[1][22..38],
        &"fe80::1".parse::<Ipv6Addr>().expect("a").octets()
    );
    assert_eq!(&f[2][22..32], &[2, 0, 0, 0, 0, 0x99, 192, 168, 7, 1]);
}

#[test]
fn vlan_tags_on_output_and_filtering_on_input() {
    let tag = VlanTag {
        pcp: 3,
        dei: false,
        vid: 100,
    };
    let mut n = engine_with(Config {
        vlan: Some(tag),
        announcements: 1,
        ..Config::default()
    });
    n.resolve(ms(0), v4(2)).expect("resolve");
    assert_eq!(drain(&mut n), vec![hex(ARP_REQUEST_VLAN)]);
    let untagged = arp_in(OWN_MAC, &reply(PEER_MAC, 2, 1, OWN_MAC));
    let tagged = |vid: u16| {
        let mut f = untagged.clone();
        f.splice(12..12, [0x81, 0x00, 0x60 | (vid >> 8) as u8, vid as u8]);
        f
    };
    assert_eq!(
        n.on_frame(ms(1), &tagged(200)),
        Outcome::Ignored(Ignored::OtherVlan)
    );
    assert!(matches!(
        n.on_frame(ms(2), &tagged(100)),
        Outcome::Learned { .. }
    ));
    // Untagged (the NIC stripped the tag): accepted.
    assert!(matches!(
        n.on_frame(ms(3), &untagged),
        Outcome::Learned { .. }
    ));
    // Without a configured VLAN only VLAN 0 (priority tags) passes.
    let mut plain = engine();
    assert_eq!(
        plain.on_frame(ms(1), &tagged(100)),
        Outcome::Ignored(Ignored::OtherVlan)
    );
    assert!(matches!(
        plain.on_frame(ms(1), &tagged(0)),
        Outcome::Ignored(Ignored::Unsolicited)
    ));
    assert_eq!(
        Neighbours::new(Config {
            vlan: Some(VlanTag { vid: 4095, ..tag }),
            ..Config::default()
        })
        .err(),
        Some(Error::Config {
            field: "vlan",
            why: "needs a VLAN id 0..=4094 and a priority 0..=7"
        })
    );
}

#[test]
fn another_station_claiming_an_own_address_is_reported_and_defended() {
    let mut n = engine();
    let claim = arp_in(
        EthernetAddress::BROADCAST,
        &arp::Repr::gratuitous(OTHER_MAC, Ipv4Addr::new(10, 0, 0, 1)),
    );
    assert_eq!(
        n.on_frame(ms(0), &claim),
        Outcome::Ignored(Ignored::Conflict)
    );
    assert_eq!(
        events(&mut n),
        vec![Event::Conflict {
            ip: v4(1),
            mac: OTHER_MAC
        }]
    );
    assert_eq!(drain(&mut n), vec![hex(GARP)], "defended");
    // At most one defence per 10 s.
    n.on_frame(ms(9_999), &claim);
    assert!(drain(&mut n).is_empty());
    n.on_frame(ms(10_000), &claim);
    assert_eq!(drain(&mut n), vec![hex(GARP)]);
    // The same for an advertisement of our IPv6 address.
    let all = EthernetAddress::from_ipv6_multicast(icmpv6::ALL_NODES);
    let f = nd_in(
        (all, OTHER_MAC),
        "fe80::1",
        "ff02::1",
        &advert("fe80::1", OTHER_MAC, false, true),
    );
    assert_eq!(n.on_frame(ms(0), &f), Outcome::Ignored(Ignored::Conflict));
    assert_eq!(drain(&mut n), vec![hex(UNSOLICITED_NA)]);
    assert_eq!(n.counters().defended, 3);
    assert_eq!(n.counters().ignored.conflict, 4);
}

#[test]
fn frames_for_others_reflections_and_other_protocols_are_counted() {
    let mut n = engine();
    let req = request(PEER_MAC, 2, 1);
    let mut other_mac = arp_in(OTHER_MAC, &req);
    assert_eq!(
        n.on_frame(ms(0), &other_mac),
        Outcome::Ignored(Ignored::OtherMac)
    );
    // An IPv4 multicast group is not ours either.
    other_mac[..6].copy_from_slice(&[1, 0, 0x5e, 0, 0, 1]);
    assert_eq!(
        n.on_frame(ms(0), &other_mac),
        Outcome::Ignored(Ignored::OtherMac)
    );
    let own = arp_in(EthernetAddress::BROADCAST, &request(OWN_MAC, 1, 2));
    assert_eq!(n.on_frame(ms(0), &own), Outcome::Ignored(Ignored::OwnFrame));
    let mut ipv4 = arp_in(OWN_MAC, &req);
    ipv4[12..14].copy_from_slice(&[0x08, 0x00]);
    assert_eq!(
        n.on_frame(ms(0), &ipv4),
        Outcome::Ignored(Ignored::OtherProtocol)
    );
    let mut src_group = arp_in(OWN_MAC, &req);
    src_group[6] = 1;
    assert_eq!(
        n.on_frame(ms(0), &src_group),
        Outcome::Malformed(Malformed::EthernetSource)
    );
    assert_eq!(
        n.on_frame(ms(0), &own[..13]),
        Outcome::Malformed(Malformed::Truncated)
    );
    let c = n.counters();
    assert_eq!(
        (
            c.ignored.other_mac,
            c.ignored.own_frame,
            c.ignored.other_protocol
        ),
        (2, 1, 1)
    );
    assert_eq!((c.frames_in, c.dispositions()), (6, 6));
    assert!(drain(&mut n).is_empty() && n.is_empty());
}

#[test]
fn a_flood_is_rate_limited_and_grows_no_state() {
    let mut n = engine();
    let mut answered = 0;
    for i in 0..1000u32 {
        let out = n.on_frame(
            ms(u64::from(i)),
            &arp_in(EthernetAddress::BROADCAST, &request(PEER_MAC, 2, 1)),
        );
        if matches!(out, Outcome::Answered { .. }) {
            answered += 1;
        }
    }
    // 10 at once, then 10 per second over one second.
    assert_eq!(answered, 19);
    assert_eq!(n.counters().ignored.rate_limited, 981);
    // A thousand forged sources: the per-source table stays at 64, the
    // total allows its burst of 256 plus 2000/s.
    let mut answered = 0;
    for i in 0..1000u32 {
        let sha = EthernetAddress([2, 1, 0, 0, (i >> 8) as u8, i as u8]);
        let out = n.on_frame(
            ms(10_000),
            &arp_in(EthernetAddress::BROADCAST, &request(sha, 2, 1)),
        );
        if matches!(out, Outcome::Answered { .. }) {
            answered += 1;
        }
    }
    assert_eq!(answered, 256);
    assert_eq!(n.limiter.tracked(), 64);
    assert!(n.is_empty());
    assert!(n.pending_transmit() <= n.config().tx_queue);
}

#[test]
fn the_cache_and_the_queues_are_bounded() {
    let mut n = engine_with(Config {
        max_entries: 4,
        max_incomplete: 2,
        tx_queue: 3,
        event_queue: 2,
        announcements: 1,
        ..Config::default()
    });
    n.resolve(ms(0), v4(2)).expect("1");
    n.resolve(ms(0), v4(3)).expect("2");
    assert_eq!(
        n.resolve(ms(0), v4(4)),
        Err(Error::TooManyPending { limit: 2 })
    );
    n.set_static(ms(0), v4(5), OTHER_MAC).expect("static");
    n.set_static(ms(0), v4(6), OTHER_MAC).expect("static");
    // Full of static and incomplete entries: nothing can be evicted.
    assert_eq!(
        n.set_static(ms(0), v4(7), OTHER_MAC),
        Err(Error::CacheFull { capacity: 4 })
    );
    // Resolve both; the least recently used learned entry makes room.
    for d in [2, 3] {
        n.on_frame(ms(1), &arp_in(OWN_MAC, &reply(PEER_MAC, d, 1, OWN_MAC)));
    }
    n.resolve(ms(2), v4(2)).expect("use .2");
    assert!(matches!(
        n.resolve(ms(3), v4(8)),
        Ok(Resolution::Pending { .. })
    ));
    assert!(n.lookup(ms(3), v4(3)).is_none(), ".3 was evicted");
    assert!(n.lookup(ms(3), v4(2)).is_some());
    assert_eq!((n.len(), n.counters().evicted), (4, 1));
    // Two solicitations queued, one more fits; the fourth is dropped.
    assert_eq!(n.pending_transmit(), 3);
    n.poll(ms(1003));
    assert_eq!((n.pending_transmit(), n.counters().tx_dropped), (3, 1));
    // Events: the oldest goes.
    assert_eq!(n.counters().events_dropped, 0);
    n.set_static(ms(4), v4(8), OTHER_MAC).expect("static");
    assert_eq!(n.counters().events_dropped, 1);
    assert_eq!(
        events(&mut n),
        vec![
            Event::Resolved {
                ip: v4(3),
                mac: PEER_MAC
            },
            Event::Resolved {
                ip: v4(8),
                mac: OTHER_MAC
            }
        ]
    );
}

#[test]
fn entries_list_like_ip_neigh() {
    let mut n = engine();
    n.resolve(ms(0), v4(2)).expect("resolve");
    n.resolve(ms(0), v6("fe80::2")).expect("resolve");
    n.set_static(ms(0), v4(9), OTHER_MAC).expect("static");
    n.on_frame(ms(500), &arp_in(OWN_MAC, &reply(PEER_MAC, 2, 1, OWN_MAC)));
    let lines: Vec<String> = n
        .entries(ms(1500))
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        lines,
        [
            "10.0.0.2 lladdr 52:54:00:12:34:56 REACHABLE age 1.0s",
            "10.0.0.9 lladdr 02:00:00:00:00:99 PERMANENT age 1.5s",
            "fe80::2 INCOMPLETE age 1.5s tries 1",
        ]
    );
}

#[test]
fn bad_configurations_are_refused() {
    for (cfg, field) in [
        (
            Config {
                mcast_solicit: 0,
                ..Config::default()
            },
            "mcast_solicit",
        ),
        (
            Config {
                retrans_time: Duration::ZERO,
                ..Config::default()
            },
            "retrans_time",
        ),
        (
            Config {
                tx_queue: 0,
                ..Config::default()
            },
            "tx_queue/event_queue",
        ),
    ] {
        assert!(
            matches!(Neighbours::new(cfg), Err(Error::Config { field: f, .. }) if f == field),
            "{field}"
        );
    }
    let mut n = engine();
    assert_eq!(
        n.add_own(ms(0), IpAddr::V4(Ipv4Addr::UNSPECIFIED), OWN_MAC),
        Err(Error::NotUnicastIp {
            ip: IpAddr::V4(Ipv4Addr::UNSPECIFIED)
        })
    );
    let mut small = Neighbours::new(Config {
        max_own: 1,
        ..Config::default()
    })
    .expect("config");
    small.add_own(ms(0), v4(1), OWN_MAC).expect("first");
    small.add_own(ms(0), v4(1), OTHER_MAC).expect("replace");
    assert_eq!(
        small.add_own(ms(0), v4(2), OWN_MAC),
        Err(Error::OwnTableFull { capacity: 1 })
    );
}

proptest! {
    /// Random frames, and valid frames truncated or with one byte changed,
    /// never panic, never create an entry, and land in exactly one counter.
    #[test]
    fn hostile_frames_create_nothing(frames in proptest::collection::vec(hostile::frame(), 1..40)) {
        let mut n = engine();
        for (i, f) in frames.iter().enumerate() {
            let _ = n.on_frame(ms(i as u64), f);
            n.poll(ms(i as u64));
        }
        prop_assert!(n.is_empty());
        let c = n.counters();
        prop_assert_eq!(c.frames_in, frames.len() as u64);
        prop_assert_eq!(c.dispositions(), c.frames_in);
        // Whatever was sent is a well-formed ARP or ND frame from us.
        for f in drain(&mut n) {
            prop_assert!(hostile::is_own_output(&f), "{:02x?}", f);
        }
    }
}
