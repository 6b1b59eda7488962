//! Every packet of a real kernel rxe capture (two Linux 6.1 `rdma_rxe`
//! peers, 10.0.0.1 ↔ 10.0.0.2, path MTU 1024; see
//! shared/reference/captures/README.md): parse, re-emit byte for byte at
//! every layer, verify every ICRC through both APIs, and check that the
//! ICRC covers exactly the bytes it should.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use rnic_roce::pcap::{self, ByteOrder, LinkType, Resolution};
use rnic_roce::wire::{
    AethPacket, AethRepr, AtomicAckEthPacket, AtomicAckEthRepr, AtomicEthPacket, AtomicEthRepr,
    BthPacket, BthRepr, DethPacket, DethRepr, Error, ExtHeader, Frame, IethPacket, IethRepr,
    ImmDtPacket, ImmDtRepr, IpRepr, Opcode, RethPacket, RethRepr, RoceRepr, Syndrome, icrc,
};

const CAPTURE: &[u8] = include_bytes!("data/kernel-rxe-send-write-read-atomic.pcap");

fn frames() -> Vec<&'static [u8]> {
    let r = pcap::Reader::new(CAPTURE).expect("global header");
    r.map(|rec| rec.expect("record").data).collect()
}

#[test]
fn capture_file_format() {
    let r = pcap::Reader::new(CAPTURE).expect("global header");
    let h = *r.header();
    assert_eq!(h.link_type, LinkType::ETHERNET);
    assert_eq!(
        (h.byte_order, h.resolution),
        (ByteOrder::Little, Resolution::Micro)
    );
    assert_eq!(
        (h.version_major, h.version_minor, h.snaplen),
        (2, 4, 262_144)
    );
    let recs: Vec<_> = r.map(|x| x.expect("record")).collect();
    assert_eq!(recs.len(), 1680);
    assert!(recs.iter().all(|r| !r.is_truncated()));
    assert!(
        recs.windows(2)
            .all(|w| w[0].timestamp() <= w[1].timestamp())
    );
    // Writing the records back reproduces the file exactly.
    let mut w = pcap::Writer::new(Vec::new(), LinkType::ETHERNET, Resolution::Micro).expect("vec");
    for rec in &recs {
        w.write_record(rec.timestamp(), rec.data).expect("vec");
    }
    assert_eq!(w.into_inner(), CAPTURE);
}

/// The opcode histogram, frozen after checking it against the tools that
/// ran (README): ibv_rc_pingpong -s 5000 (5 packets/message, both ways) and
/// ib_send_bw -s 3000 (3 packets) give SEND FIRST/MIDDLE/LAST, with
/// retransmissions on the pingpong flow (54 + 30 FIRST instead of 40 + 30);
/// ib_write_bw -s 16384 -n 50 gives 50 × (FIRST + 14 MIDDLE + LAST);
/// ib_read_bw -s 8192 -n 30 gives 30 REQUESTs answered by FIRST + 6 MIDDLE +
/// LAST; ib_atomic_bw -n 30 gives 30 FETCH_ADDs and 30 ATOMIC ACKs. No
/// *_ONLY, immediate, invalidate, UD or CNP packet occurs.
const HISTOGRAM: [(Opcode, usize); 13] = [
    (Opcode::RC_SEND_FIRST, 84),
    (Opcode::RC_SEND_MIDDLE, 192),
    (Opcode::RC_SEND_LAST, 84),
    (Opcode::RC_RDMA_WRITE_FIRST, 50),
    (Opcode::RC_RDMA_WRITE_MIDDLE, 700),
    (Opcode::RC_RDMA_WRITE_LAST, 50),
    (Opcode::RC_RDMA_READ_REQUEST, 30),
    (Opcode::RC_RDMA_READ_RESPONSE_FIRST, 30),
    (Opcode::RC_RDMA_READ_RESPONSE_MIDDLE, 180),
    (Opcode::RC_RDMA_READ_RESPONSE_LAST, 30),
    (Opcode::RC_ACKNOWLEDGE, 190),
    (Opcode::RC_ATOMIC_ACKNOWLEDGE, 30),
    (Opcode::RC_FETCH_ADD, 30),
];

#[test]
fn opcode_histogram() {
    let mut h: BTreeMap<Opcode, usize> = BTreeMap::new();
    for f in frames() {
        let frame = Frame::parse(f).expect("parse");
        *h.entry(frame.datagram.roce.opcode()).or_default() += 1;
    }
    assert_eq!(h, BTreeMap::from(HISTOGRAM));
    assert_eq!(h.values().sum::<usize>(), 1680);
}

fn v4(frame: &Frame<'_>) -> rnic_roce::wire::Ipv4Repr {
    match frame.datagram.ip {
        IpRepr::V4(ip) => ip,
        IpRepr::V6(_) => panic!("capture is IPv4 only"),
    }
}

#[test]
fn every_packet_parses_reemits_and_verifies() {
    for (n, bytes) in frames().into_iter().enumerate() {
        let f = Frame::parse(bytes).unwrap_or_else(|e| panic!("packet {}: {e}", n + 1));
        assert!(
            f.trailer.is_empty(),
            "packet {}: no Ethernet padding expected",
            n + 1
        );
        let d = &f.datagram;

        // ICRC: whole-IP-packet API and UDP-payload API agree and verify.
        let ip = v4(&f);
        let roce = d.roce.as_bytes();
        let (sport, dport) = (d.udp.src_port, d.udp.dst_port);
        let a = icrc::compute(d.ip_packet).expect("compute");
        let b = icrc::compute_v4(
            ip.src_addr,
            ip.dst_addr,
            ip.ident,
            ip.dont_frag,
            sport,
            dport,
            roce,
        );
        assert_eq!(a, b, "packet {}", n + 1);
        assert_eq!(a, d.roce.icrc(), "packet {}", n + 1);
        d.verify_icrc().expect("verify");
        icrc::verify_v4(
            ip.src_addr,
            ip.dst_addr,
            ip.ident,
            ip.dont_frag,
            sport,
            dport,
            roce,
        )
        .expect("verify_v4");
        // A UDP-socket receiver does not see the IP header: the identification
        // and DF the kernel chose are recovered from the ICRC alone.
        let recovered = icrc::recover_v4_ident(ip.src_addr, ip.dst_addr, sport, dport, roce);
        assert_eq!(recovered, Ok((ip.ident, true)), "packet {}", n + 1);

        // Frame level: reprs → emit (IPv4 checksum and ICRC recomputed) → same bytes.
        let repr = f.to_repr().expect("repr");
        let mut out = vec![0u8; repr.buffer_len()];
        assert_eq!(repr.emit(&mut out, d.roce.payload()), Ok(bytes.len()));
        assert_eq!(out, bytes, "packet {} frame re-emit", n + 1);

        // RoCE level: emit, then fill the ICRC through the UDP-payload API.
        let r = repr.datagram.roce;
        let mut roce_out = vec![0u8; r.buffer_len()];
        r.emit(&mut roce_out, d.roce.payload()).expect("emit");
        icrc::fill_v4(
            ip.src_addr,
            ip.dst_addr,
            ip.ident,
            ip.dont_frag,
            sport,
            dport,
            &mut roce_out,
        )
        .expect("fill");
        assert_eq!(roce_out, roce, "packet {} RoCE re-emit", n + 1);

        // Every header on its own.
        every_header_reemits(n + 1, &d.roce, &r);
    }
}

fn every_header_reemits(n: usize, p: &rnic_roce::wire::RocePacket<&[u8]>, r: &RoceRepr) {
    let info = p.info().expect("known opcode");
    let raw = p.as_bytes();
    let mut buf = [0u8; 32];
    let bth = BthRepr::parse(&BthPacket::new_checked(raw).expect("bth")).expect("bth");
    assert_eq!(bth, r.bth);
    bth.emit(&mut BthPacket::new_unchecked(&mut buf[..12]));
    assert_eq!(&buf[..12], &raw[..12], "packet {n} BTH");
    for &h in info.headers {
        let off = info.offset_of(h).expect("offset");
        let src = &raw[off..off + h.len()];
        let dst = &mut buf[..h.len()];
        match h {
            ExtHeader::Reth => {
                let x = RethRepr::parse(&RethPacket::new_checked(src).expect("len")).expect("reth");
                assert_eq!(Some(x), r.reth);
                x.emit(&mut RethPacket::new_unchecked(dst));
            }
            ExtHeader::Aeth => {
                let x = AethRepr::parse(&AethPacket::new_checked(src).expect("len")).expect("aeth");
                assert_eq!(Some(x), r.aeth);
                assert_eq!(
                    x.syndrome,
                    Syndrome::ACK_UNLIMITED,
                    "rxe always sends ACK, credits 0x1f"
                );
                x.emit(&mut AethPacket::new_unchecked(dst));
            }
            ExtHeader::ImmDt => {
                let x =
                    ImmDtRepr::parse(&ImmDtPacket::new_checked(src).expect("len")).expect("immdt");
                x.emit(&mut ImmDtPacket::new_unchecked(dst));
            }
            ExtHeader::Ieth => {
                let x = IethRepr::parse(&IethPacket::new_checked(src).expect("len")).expect("ieth");
                x.emit(&mut IethPacket::new_unchecked(dst));
            }
            ExtHeader::AtomicEth => {
                let x = AtomicEthRepr::parse(&AtomicEthPacket::new_checked(src).expect("len"))
                    .expect("atomic");
                assert_eq!(Some(x), r.atomic_eth);
                x.emit(&mut AtomicEthPacket::new_unchecked(dst));
            }
            ExtHeader::AtomicAckEth => {
                let x =
                    AtomicAckEthRepr::parse(&AtomicAckEthPacket::new_checked(src).expect("len"))
                        .expect("ack");
                assert_eq!(Some(x), r.atomic_ack_eth);
                x.emit(&mut AtomicAckEthPacket::new_unchecked(dst));
            }
            ExtHeader::Deth => {
                let x = DethRepr::parse(&DethPacket::new_checked(src).expect("len")).expect("deth");
                x.emit(&mut DethPacket::new_unchecked(dst));
            }
            ExtHeader::CnpReserved => dst.copy_from_slice(src),
        }
        assert_eq!(&buf[..h.len()], src, "packet {n} {h}");
    }
}

/// Facts about what the kernel put on the wire, which the UDP provider
/// must reproduce or cope with.
#[test]
fn kernel_rxe_header_facts() {
    let mut last_id: BTreeMap<Ipv4Addr, u16> = BTreeMap::new();
    let mut sports = std::collections::BTreeSet::new();
    for bytes in frames() {
        let f = Frame::parse(bytes).expect("parse");
        let ip = v4(&f);
        assert!(ip.dont_frag, "rxe sets DF");
        assert_eq!((ip.tos, ip.ttl), (0, 64));
        assert_eq!(f.datagram.udp.checksum, 0, "rxe sends UDP checksum 0");
        let bth = f.datagram.roce.bth();
        assert_eq!(
            (bth.pkey(), bth.mig_req(), bth.tver(), bth.pad_count()),
            (0xffff, false, 0, 0)
        );
        assert_eq!(
            (bth.fecn(), bth.becn(), bth.resv6a(), bth.resv7()),
            (false, false, 0, 0)
        );
        // IP IDs are not zero despite DF: each direction counts up
        // (__ip_select_ident), mostly by 1, with gaps.
        assert_ne!(ip.ident, 0);
        if let Some(prev) = last_id.insert(ip.src_addr, ip.ident) {
            assert!(
                ip.ident > prev,
                "{}: id {} after {}",
                ip.src_addr,
                ip.ident,
                prev
            );
        }
        sports.insert(f.datagram.udp.src_port);
    }
    assert_eq!(
        last_id.keys().copied().collect::<Vec<_>>(),
        [Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2)]
    );
    // One UDP source port per connection, the same in both directions, in 0xC000..=0xFFFF.
    assert_eq!(
        sports.into_iter().collect::<Vec<_>>(),
        [49441, 49476, 49513, 49552, 49593]
    );
}

/// Offsets (into the IP packet) that the ICRC masks.
const MASKED: [usize; 6] = [1, 8, 10, 11, 26, 27];
const BTH: usize = 28;

#[test]
fn icrc_covers_exactly_the_unmasked_bytes() {
    let mut seen: BTreeMap<Opcode, usize> = BTreeMap::new();
    for bytes in frames() {
        let f = Frame::parse(bytes).expect("parse");
        let op = f.datagram.roce.opcode();
        // Three packets of every opcode class.
        let k = seen.entry(op).or_default();
        *k += 1;
        if *k > 3 {
            continue;
        }
        let mut ip = f.datagram.ip_packet.to_vec();
        let len = ip.len();
        let hdr_end = BTH + f.datagram.roce.header_len();
        let mut covered = vec![
            4,
            5,
            6,
            7,
            9,
            12,
            15,
            16,
            19,
            20,
            21,
            22,
            23,
            BTH,
            BTH + 1,
            BTH + 2,
        ];
        covered.extend([BTH + 3, BTH + 5, BTH + 7, BTH + 8, BTH + 9, BTH + 11]);
        covered.extend(BTH + 12..hdr_end); // every extension header byte
        if len - 4 > hdr_end {
            covered.extend([hdr_end, (hdr_end + len - 4) / 2, len - 5]); // payload
        }
        covered.extend(len - 4..len); // the trailer itself
        for off in covered {
            ip[off] ^= 0x10;
            match icrc::verify(&ip) {
                Err(Error::IcrcMismatch { .. }) => {}
                other => panic!("{op}: flipping byte {off} gave {other:?}"),
            }
            ip[off] ^= 0x10;
        }
        // Length fields: the mutation is caught too (as a length error or a mismatch).
        for off in [2, 3, 24, 25] {
            ip[off] ^= 0x01;
            assert!(icrc::verify(&ip).is_err(), "{op}: length byte {off}");
            ip[off] ^= 0x01;
        }
        for off in MASKED.into_iter().chain([BTH + 4]) {
            for bit in [0x01, 0x80, 0xff] {
                ip[off] ^= bit;
                assert_eq!(icrc::verify(&ip), Ok(()), "{op}: masked byte {off}");
                ip[off] ^= bit;
            }
        }
        // The UDP-payload API: flipping any covered RoCE byte fails, BTH byte 4 does not.
        let v4 = v4(&f);
        let (s, d) = (f.datagram.udp.src_port, f.datagram.udp.dst_port);
        let roce = &mut ip[BTH..];
        for off in [
            0,
            1,
            3,
            5,
            11,
            roce.len() / 2,
            roce.len() - 5,
            roce.len() - 1,
        ] {
            roce[off] ^= 0x02;
            let r = icrc::verify_v4(v4.src_addr, v4.dst_addr, v4.ident, true, s, d, roce);
            assert!(
                matches!(r, Err(Error::IcrcMismatch { .. })),
                "{op}: roce byte {off}"
            );
            roce[off] ^= 0x02;
        }
        roce[4] = 0xC0;
        assert_eq!(
            icrc::verify_v4(v4.src_addr, v4.dst_addr, v4.ident, true, s, d, roce),
            Ok(())
        );
        // ... and so do the IP fields the caller supplies.
        let bad_id = icrc::verify_v4(v4.src_addr, v4.dst_addr, v4.ident ^ 1, true, s, d, roce);
        assert!(matches!(bad_id, Err(Error::IcrcMismatch { .. })));
        let bad_df = icrc::verify_v4(v4.src_addr, v4.dst_addr, v4.ident, false, s, d, roce);
        assert!(matches!(bad_df, Err(Error::IcrcMismatch { .. })));
        // Without the identification, corruption is still caught (15 bits left).
        for off in [0, 7, 11, roce.len() - 5] {
            roce[off] ^= 0x04;
            let r = icrc::recover_v4_ident(v4.src_addr, v4.dst_addr, s, d, roce);
            assert!(
                matches!(r, Err(Error::IcrcMismatch { .. })),
                "{op}: roce byte {off}"
            );
            roce[off] ^= 0x04;
        }
    }
    assert_eq!(seen.len(), HISTOGRAM.len());
}

/// Prints the first packet of every opcode, header by header: how the
/// golden vectors in the header modules were taken. Run with
/// `cargo test -p rnic-roce --test capture -- --ignored --nocapture`.
#[test]
#[ignore = "helper that prints golden vectors"]
fn dump_first_packet_of_each_opcode() {
    let mut seen = std::collections::BTreeSet::new();
    for (n, bytes) in frames().into_iter().enumerate() {
        let f = Frame::parse(bytes).expect("parse");
        let p = &f.datagram.roce;
        if !seen.insert(p.opcode()) {
            continue;
        }
        let raw = p.as_bytes();
        let info = p.info().expect("known");
        println!("packet {} {}: BTH {:02x?}", n + 1, p.opcode(), &raw[..12]);
        for &h in info.headers {
            let off = info.offset_of(h).expect("offset");
            println!("    {h} {:02x?}", &raw[off..off + h.len()]);
        }
        println!(
            "    payload {} bytes, ICRC {:#010x}",
            p.payload_len(),
            p.icrc()
        );
    }
}
