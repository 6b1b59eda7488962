//! Hostile frames for the property test: random bytes, and valid ARP / ND
//! frames aimed at the engine's own addresses, truncated or with one byte
//! changed.

use proptest::prelude::*;

use super::super::frame;
use super::*;

/// Valid frames a peer might send the engine under test.
fn templates() -> Vec<Vec<u8>> {
    let all = EthernetAddress::from_ipv6_multicast(icmpv6::ALL_NODES);
    let group = EthernetAddress([0x33, 0x33, 0xff, 0, 0, 1]);
    let ns = |lladdr| NdRepr::Solicit {
        target: "fe80::1".parse().expect("addr"),
        lladdr,
    };
    vec![
        arp_in(EthernetAddress::BROADCAST, &request(PEER_MAC, 2, 1)),
        arp_in(OWN_MAC, &reply(PEER_MAC, 2, 1, OWN_MAC)),
        arp_in(
            EthernetAddress::BROADCAST,
            &arp::Repr::gratuitous(PEER_MAC, Ipv4Addr::new(10, 0, 0, 2)),
        ),
        nd_in(
            (group, PEER_MAC),
            "fe80::2",
            "ff02::1:ff00:1",
            &ns(Some(PEER_MAC)),
        ),
        nd_in((group, PEER_MAC), "::", "ff02::1:ff00:1", &ns(None)),
        nd_in(
            (OWN_MAC, PEER_MAC),
            "fe80::2",
            "fe80::1",
            &advert("fe80::2", PEER_MAC, true, true),
        ),
        nd_in(
            (all, PEER_MAC),
            "fe80::2",
            "ff02::1",
            &advert("fe80::1", PEER_MAC, false, true),
        ),
    ]
}

/// Random bytes, or a template truncated, with one byte changed, or whole.
pub(super) fn frame() -> impl Strategy<Value = Vec<u8>> {
    let n = templates().len();
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..120),
        (0..n, any::<usize>(), any::<usize>(), any::<u8>(), 0u8..3).prop_map(
            |(t, cut, at, byte, how)| {
                let mut f = templates().swap_remove(t);
                match how {
                    0 => f.truncate(cut % (f.len() + 1)),
                    1 => {
                        let i = at % f.len();
                        f[i] ^= byte.max(1);
                    }
                    _ => {}
                }
                f
            }
        ),
    ]
}

/// Whether `f` is an ARP packet or a valid neighbour discovery message
/// sent from the own MAC.
pub(super) fn is_own_output(f: &[u8]) -> bool {
    let Ok(eth) = crate::wire::EthernetPacket::new_checked(f) else {
        return false;
    };
    if eth.src_addr() != OWN_MAC {
        return false;
    }
    match frame::dissect(eth.ethertype(), eth.payload()) {
        Ok(frame::Payload::Arp(a)) => a.source_hardware_addr == OWN_MAC,
        Ok(frame::Payload::Nd(ip, nd)) => n_own(ip.src_addr) && (nd.lladdr() == Some(OWN_MAC)),
        _ => false,
    }
}

fn n_own(ip: Ipv6Addr) -> bool {
    ip == "fe80::1".parse::<Ipv6Addr>().expect("addr")
}
