//! Property tests over whole packets: Repr → emit → parse round trips for
//! every opcode, and parsers fed arbitrary bytes never panic.

use std::net::{Ipv4Addr, Ipv6Addr};

use proptest::prelude::*;
use rnic_core::{Iova, Psn, Qpn, Rkey};
use rnic_roce::pcap;
use rnic_roce::wire::{
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, Datagram, DatagramRepr, DethRepr, Error,
    EtherType, EthernetAddress, EthernetRepr, ExtHeader, Frame, FrameRepr, Header, IethRepr,
    ImmDtRepr, IpRepr, Ipv4Repr, Ipv6Repr, Opcode, RethRepr, RocePacket, RoceRepr, Syndrome,
    UdpRepr, VlanTag, icrc, opcode, roce,
};

fn known_opcodes() -> Vec<Opcode> {
    opcode::known().map(|i| i.opcode).collect()
}

prop_compose! {
    fn arb_bth(op: Opcode)(fl in any::<[bool; 6]>(), tver in 0u8..16, pkey in any::<u16>(),
                            qp in 0u32..=0xFF_FFFF, psn in 0u32..=0xFF_FFFF) -> BthRepr {
        BthRepr { opcode: op, solicited: fl[0], mig_req: fl[1], pad_count: 0, tver, pkey, fecn: fl[2],
                  becn: fl[3], dest_qp: Qpn::from_wire(qp), ack_req: fl[4], psn: Psn::from_wire(psn) }
    }
}

prop_compose! {
    fn arb_exts()(va in any::<u64>(), k in any::<u32>(), len in any::<u32>(), syn in any::<u8>(),
                  msn in 0u32..=0xFF_FFFF, imm in any::<u32>(), swap in any::<u64>(), cmp in any::<u64>(),
                  orig in any::<u64>(), qkey in any::<u32>(), sqp in 0u32..=0xFF_FFFF)
                 -> (RethRepr, AethRepr, ImmDtRepr, IethRepr, AtomicEthRepr, AtomicAckEthRepr, DethRepr) {
        (RethRepr { va: Iova(va), rkey: Rkey(k), dma_len: len },
         AethRepr { syndrome: Syndrome::from_u8(syn), msn },
         ImmDtRepr { imm },
         IethRepr { rkey: Rkey(k.rotate_left(8)) },
         AtomicEthRepr { va: Iova(va & !7), rkey: Rkey(k), swap_add: swap, compare: cmp },
         AtomicAckEthRepr { orig },
         DethRepr { qkey, src_qp: Qpn::from_wire(sqp) })
    }
}

/// A valid repr of any known opcode plus a payload that fits it.
fn arb_packet() -> impl Strategy<Value = (RoceRepr, Vec<u8>)> {
    proptest::sample::select(known_opcodes())
        .prop_flat_map(|op| {
            let max = if op.info().is_some_and(|i| i.has_payload()) {
                300
            } else {
                0
            };
            (
                arb_bth(op),
                arb_exts(),
                proptest::collection::vec(any::<u8>(), 0..=max),
            )
        })
        .prop_map(|(bth, e, payload)| {
            let info = bth.opcode.info().expect("known");
            let mut r = RoceRepr::new(bth, payload.len());
            for &h in info.headers {
                r = match h {
                    ExtHeader::Reth => r.with_reth(e.0),
                    ExtHeader::Aeth => r.with_aeth(e.1),
                    ExtHeader::ImmDt => r.with_immdt(e.2),
                    ExtHeader::Ieth => r.with_ieth(e.3),
                    ExtHeader::AtomicEth => r.with_atomic_eth(e.4),
                    ExtHeader::AtomicAckEth => r.with_atomic_ack_eth(e.5),
                    ExtHeader::Deth => r.with_deth(e.6),
                    ExtHeader::CnpReserved => r,
                };
            }
            r.bth.pad_count = roce::pad_len(payload.len()) as u8;
            (r, payload)
        })
}

fn arb_ip() -> impl Strategy<Value = IpRepr> {
    prop_oneof![
        (
            any::<[u8; 4]>(),
            any::<[u8; 4]>(),
            any::<u8>(),
            any::<u16>(),
            any::<bool>(),
            any::<u8>()
        )
            .prop_map(|(s, d, tos, ident, df, ttl)| IpRepr::V4(Ipv4Repr {
                src_addr: s.into(),
                dst_addr: d.into(),
                tos,
                ident,
                dont_frag: df,
                ttl,
                protocol: 17,
                payload_len: 0,
            })),
        (
            any::<[u8; 16]>(),
            any::<[u8; 16]>(),
            any::<u8>(),
            0u32..(1 << 20),
            any::<u8>()
        )
            .prop_map(|(s, d, tc, fl, hl)| IpRepr::V6(Ipv6Repr {
                src_addr: s.into(),
                dst_addr: d.into(),
                traffic_class: tc,
                flow_label: fl,
                next_header: 17,
                hop_limit: hl,
                payload_len: 0,
            })),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn roce_repr_round_trips((repr, payload) in arb_packet()) {
        let mut buf = vec![0xA5u8; repr.buffer_len() + 8];
        let n = repr.emit(&mut buf, &payload).expect("emit");
        prop_assert_eq!(n, repr.buffer_len());
        prop_assert_eq!(n % 4, 0);
        let p = RocePacket::new_checked(&buf[..n]).expect("check");
        prop_assert_eq!(p.payload(), &payload[..]);
        prop_assert!(p.pad().iter().all(|&b| b == 0));
        prop_assert_eq!(RoceRepr::parse(&p), Ok(repr));
        prop_assert!(buf[n..].iter().all(|&b| b == 0xA5));
    }

    #[test]
    fn datagram_and_frame_round_trip((roce, payload) in arb_packet(), ip in arb_ip(), sport in any::<u16>(),
                                     vlan in proptest::option::of((0u8..8, any::<bool>(), 0u16..4096))) {
        let dgram = DatagramRepr {
            ip,
            udp: UdpRepr { src_port: sport, dst_port: 4791, checksum: 0, payload_len: 0 },
            roce,
        };
        let frame = FrameRepr {
            ethernet: EthernetRepr {
                dst_addr: EthernetAddress([2, 0, 0, 0, 0, 1]),
                src_addr: EthernetAddress([2, 0, 0, 0, 0, 2]),
                vlan: vlan.map(|(pcp, dei, vid)| VlanTag { pcp, dei, vid }),
                ethertype: ip.ethertype(),
            },
            datagram: dgram,
        };
        let mut buf = vec![0u8; frame.buffer_len()];
        prop_assert_eq!(frame.emit(&mut buf, &payload), Ok(buf.len()));
        let f = Frame::parse(&buf).expect("parse");
        f.datagram.verify_icrc().expect("icrc");
        let roce_bytes = f.datagram.roce.as_bytes();
        let b = match f.datagram.ip {
            IpRepr::V4(v4) => {
                icrc::verify_v4(v4.src_addr, v4.dst_addr, v4.ident, v4.dont_frag, sport, 4791, roce_bytes)
                    .expect("verify_v4");
                let got = icrc::recover_v4_ident(v4.src_addr, v4.dst_addr, sport, 4791, roce_bytes);
                prop_assert_eq!(got, Ok((v4.ident, v4.dont_frag)));
                icrc::compute_v4(v4.src_addr, v4.dst_addr, v4.ident, v4.dont_frag, sport, 4791, roce_bytes)
            }
            IpRepr::V6(v6) => {
                icrc::verify_v6(v6.src_addr, v6.dst_addr, sport, 4791, roce_bytes).expect("verify_v6");
                icrc::compute_v6(v6.src_addr, v6.dst_addr, sport, 4791, roce_bytes)
            }
        };
        prop_assert_eq!(icrc::compute(f.datagram.ip_packet), Ok(b));
        let back = f.to_repr().expect("repr");
        prop_assert_eq!(back.datagram.roce, roce);
        let mut again = vec![0u8; back.buffer_len()];
        back.emit(&mut again, f.datagram.roce.payload()).expect("emit");
        prop_assert_eq!(again, buf);
    }

    #[test]
    fn roce_parser_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..120)) {
        let unchecked = RocePacket::new_unchecked(&bytes[..]);
        let _ = (unchecked.payload(), unchecked.pad(), unchecked.icrc(), unchecked.reth(), unchecked.aeth());
        let _ = (unchecked.atomic_eth().map(|a| a.compare()), unchecked.deth().map(|d| d.src_qp()));
        if let Ok(p) = RocePacket::new_checked(&bytes[..]) {
            let info = p.info().expect("checked ⇒ known");
            prop_assert_eq!(p.header_len() + p.payload_len() + usize::from(p.pad_count()) + 4, bytes.len());
            match RoceRepr::parse(&p) {
                Ok(r) => prop_assert_eq!(r.payload_len, p.payload_len()),
                Err(e) => prop_assert_eq!(e, Error::UnexpectedPayload { opcode: info.opcode, len: p.payload_len() }),
            }
        }
    }

    #[test]
    fn every_opcode_with_random_tail(op in any::<u8>(), flags in any::<u8>(), tail in proptest::collection::vec(any::<u8>(), 0..80)) {
        let mut bytes = vec![op, flags, 0xff, 0xff, 0, 0, 0, 1, 0, 0, 0, 1];
        bytes.extend(tail);
        prop_assert_eq!(RocePacket::new_checked(&bytes[..]).map(|_| ()), expected(&bytes));
    }

    #[test]
    fn frame_and_ip_parsers_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..160)) {
        let _ = Frame::parse(&bytes);
        let _ = Datagram::parse(&bytes);
        let _ = icrc::verify(&bytes);
        let _ = icrc::compute(&bytes);
        let a = Ipv4Addr::LOCALHOST;
        let _ = icrc::verify_v4(a, a, 0, true, 1, 4791, &bytes);
        let _ = icrc::verify_v6(Ipv6Addr::LOCALHOST, Ipv6Addr::LOCALHOST, 1, 4791, &bytes);
        let _ = pcap::network_layer(pcap::LinkType::LINUX_SLL, &bytes);
        if let Ok(r) = pcap::Reader::new(&bytes) {
            let n = r.take(100).count();
            prop_assert!(n <= bytes.len() / 16 + 1);
        }
    }

    /// Mutating a valid frame anywhere yields a typed error or a valid parse.
    #[test]
    fn mutated_frames_never_panic((roce, payload) in arb_packet(), at in any::<prop::sample::Index>(), val in any::<u8>(), cut in any::<prop::sample::Index>()) {
        let frame = FrameRepr {
            ethernet: EthernetRepr { dst_addr: EthernetAddress([0; 6]), src_addr: EthernetAddress([0; 6]), vlan: None, ethertype: EtherType::IPV4 },
            datagram: DatagramRepr {
                ip: IpRepr::V4(Ipv4Repr { src_addr: Ipv4Addr::new(10, 0, 0, 1), dst_addr: Ipv4Addr::new(10, 0, 0, 2), tos: 0, ident: 7, dont_frag: true, ttl: 64, protocol: 17, payload_len: 0 }),
                udp: UdpRepr { src_port: 0xC000, dst_port: 4791, checksum: 0, payload_len: 0 },
                roce,
            },
        };
        let mut buf = vec![0u8; frame.buffer_len()];
        frame.emit(&mut buf, &payload).expect("emit");
        let i = at.index(buf.len());
        buf[i] = val;
        let buf = &buf[..cut.index(buf.len() + 1)];
        if let Ok(f) = Frame::parse(buf) {
            let _ = f.datagram.verify_icrc();
            let _ = f.to_repr();
        }
    }
}

/// What `RocePacket::check_len` must answer for `bytes` (an oracle written
/// from rocev2.md §3 and §5, independent of the implementation).
fn expected(bytes: &[u8]) -> Result<(), Error> {
    let have = bytes.len();
    if have < 12 {
        return Err(Error::Truncated {
            header: Header::Bth,
            need: 12,
            have,
        });
    }
    let Some(info) = Opcode(bytes[0]).info() else {
        return Err(Error::UnknownOpcode(bytes[0]));
    };
    let mut end = 12;
    for &h in info.headers {
        end += h.len();
        if have < end {
            return Err(Error::Truncated {
                header: h.into(),
                need: end,
                have,
            });
        }
    }
    if have < end + 4 {
        return Err(Error::Truncated {
            header: Header::Icrc,
            need: end + 4,
            have,
        });
    }
    let pad = (bytes[1] >> 4) & 3;
    if usize::from(pad) > have - end - 4 {
        return Err(Error::BadPad {
            pad,
            available: have - end - 4,
        });
    }
    Ok(())
}

#[test]
fn every_opcode_every_length_every_pad() {
    for op in 0..=255u8 {
        for pad in 0..4u8 {
            for len in 0..=72usize {
                let mut bytes = vec![0u8; len];
                if let Some(b) = bytes.first_mut() {
                    *b = op;
                }
                if let Some(b) = bytes.get_mut(1) {
                    *b = pad << 4;
                }
                assert_eq!(
                    RocePacket::new_checked(&bytes[..]).map(|_| ()),
                    expected(&bytes),
                    "opcode {op:#x} pad {pad} len {len}"
                );
            }
        }
    }
    // Spot checks of the oracle itself.
    let mut ack = [0u8; 19];
    ack[0] = 0x11;
    assert_eq!(
        expected(&ack),
        Err(Error::Truncated {
            header: Header::Icrc,
            need: 20,
            have: 19
        })
    );
    let mut send = [0u8; 17];
    send[0] = 0x04;
    send[1] = 0x20;
    assert_eq!(
        expected(&send),
        Err(Error::BadPad {
            pad: 2,
            available: 1
        })
    );
}
