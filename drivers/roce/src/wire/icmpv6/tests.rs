//! Golden vectors (checksums computed independently with Python's integer
//! arithmetic over the RFC 8200 pseudo-header, and read back by
//! `tcpdump -vv` in the neighbour engine's pcap test) and the RFC 4861
//! validity rules one by one.

use super::*;
use proptest::prelude::*;

fn ip6(s: &str) -> Ipv6Addr {
    s.parse().expect("address")
}

const ASKER_MAC: EthernetAddress = EthernetAddress([0x52, 0x54, 0, 0x12, 0x34, 0x56]);
const OWNER_MAC: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 2]);

/// fe80::5054:ff:fe12:3456 → ff02::1:ff00:2: who has fe80::2? (SLLA 52:54:00:12:34:56)
const NS: [u8; 32] = [
    0x87, 0x00, 0x72, 0x20, 0x00, 0x00, 0x00, 0x00, 0xfe, 0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x01, 0x01, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56,
];
/// fe80::2 → fe80::5054:ff:fe12:3456: fe80::2 is at 02:00:00:00:00:02 (S, O).
const NA: [u8; 32] = [
    0x88, 0x00, 0x94, 0x5e, 0x60, 0x00, 0x00, 0x00, 0xfe, 0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x02, 0x01, 0x02, 0x00, 0x00, 0x00, 0x00, 0x02,
];
/// :: → ff02::1:ff00:2: duplicate address detection for fe80::2.
const DAD: [u8; 24] = [
    0x87, 0x00, 0x7c, 0x23, 0x00, 0x00, 0x00, 0x00, 0xfe, 0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02,
];

fn ip(src: &str, dst: &str, len: usize) -> Ipv6Repr {
    Ipv6Repr {
        src_addr: ip6(src),
        dst_addr: ip6(dst),
        traffic_class: 0,
        flow_label: 0,
        next_header: PROTOCOL_ICMPV6,
        hop_limit: ND_HOP_LIMIT,
        payload_len: len,
    }
}

fn parse(ip: &Ipv6Repr, b: &[u8]) -> Result<Message> {
    Message::parse(ip, &Packet::new_checked(b)?)
}

#[test]
fn solicited_node_addresses_and_macs() {
    let a = ip6("2001:db8::abcd:1234:5678");
    assert_eq!(solicited_node(a), ip6("ff02::1:ff34:5678"));
    assert!(is_solicited_node(solicited_node(a)));
    assert!(!is_solicited_node(ALL_NODES) && !is_solicited_node(a));
    assert_eq!(
        EthernetAddress::from_ipv6_multicast(solicited_node(a)).to_string(),
        "33:33:ff:34:56:78"
    );
    assert_eq!(
        EthernetAddress::from_ipv6_multicast(ALL_NODES).to_string(),
        "33:33:00:00:00:01"
    );
}

#[test]
fn golden_solicitation() {
    let hdr = ip("fe80::5054:ff:fe12:3456", "ff02::1:ff00:2", 32);
    let want = NdRepr::Solicit {
        target: ip6("fe80::2"),
        lladdr: Some(ASKER_MAC),
    };
    assert_eq!(parse(&hdr, &NS), Ok(Message::Nd(want)));
    let mut out = [0xAAu8; 32];
    assert_eq!(want.emit(hdr.src_addr, hdr.dst_addr, &mut out), Ok(32));
    assert_eq!(out, NS);
}

#[test]
fn golden_advertisement() {
    let hdr = ip("fe80::2", "fe80::5054:ff:fe12:3456", 32);
    let want = NdRepr::Advert {
        flags: AdvertFlags {
            router: false,
            solicited: true,
            override_: true,
        },
        target: ip6("fe80::2"),
        lladdr: Some(OWNER_MAC),
    };
    assert_eq!(parse(&hdr, &NA), Ok(Message::Nd(want)));
    let mut out = [0u8; 40];
    assert_eq!(want.emit(hdr.src_addr, hdr.dst_addr, &mut out), Ok(32));
    assert_eq!(out[..32], NA);
    assert_eq!(
        want.emit(hdr.src_addr, hdr.dst_addr, &mut [0; 31]),
        Err(Error::BufferTooSmall { need: 32, have: 31 })
    );
}

#[test]
fn golden_duplicate_address_detection() {
    let hdr = ip("::", "ff02::1:ff00:2", 24);
    let want = NdRepr::Solicit {
        target: ip6("fe80::2"),
        lladdr: None,
    };
    assert_eq!(parse(&hdr, &DAD), Ok(Message::Nd(want)));
    let mut out = [0u8; 24];
    assert_eq!(want.emit(hdr.src_addr, hdr.dst_addr, &mut out), Ok(24));
    assert_eq!(out, DAD);
}

#[test]
fn checksum_covers_the_pseudo_header_and_every_byte() {
    let hdr = ip("fe80::5054:ff:fe12:3456", "ff02::1:ff00:2", 32);
    // Another destination: the same bytes no longer verify.
    let other = Ipv6Repr {
        dst_addr: ip6("ff02::1:ff00:3"),
        ..hdr
    };
    assert!(matches!(
        parse(&other, &NS),
        Err(Error::Icmpv6Checksum { found: 0x7220, .. })
    ));
    for i in 0..NS.len() {
        let mut b = NS;
        b[i] ^= 0x10;
        assert!(
            matches!(parse(&hdr, &b), Err(Error::Icmpv6Checksum { .. })),
            "byte {i} is not covered"
        );
    }
    assert_eq!(
        parse(&hdr, &NS[..3]),
        Err(Error::Truncated {
            header: Header::Icmpv6,
            need: 4,
            have: 3
        })
    );
}

/// Rebuild `msg` with a fresh checksum for `hdr` after `edit`, and parse it.
fn edited(hdr: &Ipv6Repr, msg: &[u8], edit: impl FnOnce(&mut Vec<u8>)) -> Result<Message> {
    let mut b = msg.to_vec();
    edit(&mut b);
    Packet::new_unchecked(&mut b[..]).fill_checksum(hdr.src_addr, hdr.dst_addr);
    parse(hdr, &b)
}

#[test]
fn rfc4861_validity_rules() {
    let hdr = ip("fe80::5054:ff:fe12:3456", "ff02::1:ff00:2", 32);
    let nd = |v| Err(Error::Nd(v));
    let off_link = Ipv6Repr {
        hop_limit: 64,
        ..hdr
    };
    assert_eq!(parse(&off_link, &NS), nd(NdViolation::HopLimit(64)));
    assert_eq!(edited(&hdr, &NS, |b| b[1] = 1), nd(NdViolation::Code(1)));
    assert_eq!(
        edited(&hdr, &NS, |b| b.truncate(23)),
        nd(NdViolation::Length { len: 23, min: 24 })
    );
    assert_eq!(
        edited(&hdr, &NS, |b| b[25] = 0),
        nd(NdViolation::OptionLength { option: 1 })
    );
    assert_eq!(
        edited(&hdr, &NS, |b| b[25] = 2),
        nd(NdViolation::OptionLength { option: 1 })
    );
    assert_eq!(
        edited(&hdr, &NS, |b| b.push(9)),
        nd(NdViolation::OptionLength { option: 9 })
    );
    assert_eq!(
        edited(&hdr, &NS, |b| {
            b[25] = 2;
            b.extend_from_slice(&[0; 8]);
        }),
        nd(NdViolation::LinkLayerOption {
            option: 1,
            units: 2
        })
    );
    assert_eq!(
        edited(&hdr, &NS, |b| b[8] = 0xff),
        nd(NdViolation::MulticastTarget)
    );
    // Unknown options are skipped; a later duplicate is ignored.
    let with_extra = edited(&hdr, &NS, |b| {
        b.splice(24..24, [14, 1, 9, 9, 9, 9, 9, 9]);
        b.extend_from_slice(&[1, 1, 7, 7, 7, 7, 7, 7]);
    });
    assert_eq!(
        with_extra,
        Ok(Message::Nd(NdRepr::Solicit {
            target: ip6("fe80::2"),
            lladdr: Some(ASKER_MAC)
        }))
    );

    // Duplicate address detection: only to the solicited-node address, no SLLA.
    let dad = ip("::", "ff02::1:ff00:2", 24);
    let dad_unicast = Ipv6Repr {
        dst_addr: ip6("fe80::2"),
        ..dad
    };
    assert_eq!(
        edited(&dad_unicast, &DAD, |_| {}),
        nd(NdViolation::DadDestination)
    );
    assert_eq!(
        edited(&dad, &NS, |_| {}),
        nd(NdViolation::DadSourceLinkLayer)
    );

    // An advertisement to a multicast address must not claim to be solicited.
    let to_all = ip("fe80::2", "ff02::1", 32);
    assert_eq!(
        edited(&to_all, &NA, |_| {}),
        nd(NdViolation::SolicitedMulticast)
    );
    let unsolicited = edited(&to_all, &NA, |b| b[4] = 0x20);
    assert!(matches!(
        unsolicited,
        Ok(Message::Nd(NdRepr::Advert {
            flags: AdvertFlags {
                solicited: false,
                override_: true,
                router: false
            },
            ..
        }))
    ));
}

#[test]
fn router_messages_and_others_are_classified() {
    let hdr = ip("fe80::1", "ff02::2", 16);
    let rs = [133u8, 0, 0, 0, 0, 0, 0, 0, 1, 1, 2, 0, 0, 0, 0, 1];
    assert_eq!(edited(&hdr, &rs, |_| {}), Ok(Message::RouterSolicit));
    // RS from :: must not carry a source link-layer address.
    let rs_dad = Ipv6Repr {
        src_addr: Ipv6Addr::UNSPECIFIED,
        ..hdr
    };
    assert_eq!(
        edited(&rs_dad, &rs, |_| {}),
        Err(Error::Nd(NdViolation::DadSourceLinkLayer))
    );
    let ra = [134u8, 0, 0, 0, 64, 0, 0x07, 0x08, 0, 0, 0, 0, 0, 0, 0, 0];
    assert_eq!(edited(&hdr, &ra, |_| {}), Ok(Message::RouterAdvert));
    assert_eq!(
        edited(&hdr, &ra[..15], |_| {}),
        Err(Error::Nd(NdViolation::Length { len: 15, min: 16 }))
    );
    let redirect = [137u8; 40].map(|_| 0);
    assert_eq!(
        edited(&hdr, &redirect, |b| b[0] = 137),
        Ok(Message::Redirect)
    );
    // An echo request: classified after its checksum, hop limit not checked.
    let echo_hdr = Ipv6Repr {
        hop_limit: 3,
        ..hdr
    };
    assert_eq!(
        edited(&echo_hdr, &[128, 0, 0, 0, 0, 1, 0, 1], |_| {}),
        Ok(Message::Other {
            msg_type: 128,
            code: 0
        })
    );
}

proptest! {
    #[test]
    fn repr_round_trips(solicit in any::<bool>(), flags in any::<(bool, bool, bool)>(), target in any::<[u8; 16]>(),
                        mac in proptest::option::of(any::<[u8; 6]>()), src in any::<[u8; 16]>(), dst in any::<[u8; 16]>()) {
        let target = Ipv6Addr::from(target);
        prop_assume!(!target.is_multicast());
        let (src, dst) = (Ipv6Addr::from(src), Ipv6Addr::from(dst));
        prop_assume!(!src.is_unspecified());
        let lladdr = mac.map(EthernetAddress);
        let repr = if solicit {
            NdRepr::Solicit { target, lladdr }
        } else {
            let (router, solicited, override_) = flags;
            NdRepr::Advert { flags: AdvertFlags { router, solicited: solicited && !dst.is_multicast(), override_ }, target, lladdr }
        };
        let mut buf = [0u8; 32];
        let n = repr.emit(src, dst, &mut buf).expect("emit");
        let hdr = Ipv6Repr { src_addr: src, dst_addr: dst, traffic_class: 0, flow_label: 0,
                             next_header: PROTOCOL_ICMPV6, hop_limit: 255, payload_len: n };
        prop_assert_eq!(parse(&hdr, &buf[..n]), Ok(Message::Nd(repr)));
    }

    #[test]
    fn arbitrary_messages_never_panic(data in proptest::collection::vec(any::<u8>(), 0..80), src in any::<[u8; 16]>(),
                                      fix in any::<bool>(), hop in prop_oneof![Just(255u8), any::<u8>()]) {
        let mut data = data;
        let hdr = Ipv6Repr { src_addr: src.into(), dst_addr: ip6("ff02::1:ff00:2"), traffic_class: 0, flow_label: 0,
                             next_header: PROTOCOL_ICMPV6, hop_limit: hop, payload_len: data.len() };
        if fix && data.len() >= 4 {
            Packet::new_unchecked(&mut data[..]).fill_checksum(hdr.src_addr, hdr.dst_addr);
        }
        if let Ok(Message::Nd(nd)) = parse(&hdr, &data) {
            // What parses re-emits to a message that parses the same.
            let mut out = [0u8; 32];
            let n = nd.emit(hdr.src_addr, hdr.dst_addr, &mut out).expect("emit");
            prop_assert_eq!(parse(&hdr, &out[..n]), Ok(Message::Nd(nd)));
        }
    }
}
