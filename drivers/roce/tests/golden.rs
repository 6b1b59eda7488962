//! Golden vectors from rocev2.md §6: a real ConnectX-4 Lx CNP and scapy's
//! UC SEND_ONLY. Each is parsed field by field, re-emitted byte for byte,
//! and its ICRC recomputed both from the whole IP packet and from the UDP
//! payload plus addresses.

use std::net::Ipv4Addr;

use rnic_core::{Psn, Qpn};
use rnic_roce::wire::{
    Error, EtherType, EthernetAddress, Frame, IpRepr, Opcode, ROCE_V2_PORT, RoceRepr, icrc,
};

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

/// rocev2.md §6.1: ConnectX-4 Lx CNP, whole Ethernet frame.
fn cnp_frame() -> Vec<u8> {
    hex("e41d2dab2bc2 7cfe90643b32 0800
         45c2 003c 718c 4000 4011 9161 0a001101 0a001201
         0000 12b7 0028 0000
         81 00 ffff 40 000118 00 000000
         00000000000000000000000000000000
         82 fd 00 2a")
}

/// rocev2.md §6.2: scapy UC SEND_ONLY, IP packet (header .. pad) + ICRC `78 f3 53 f3`.
fn scapy_ip_packet() -> Vec<u8> {
    hex("45010040047840004011b4d5c0a80007c0a80007 c00012b7002caca2
         2460ffff000000d300cf1710 4630818be28935d90e9a95505401be885e500000
         78f353f3")
}

#[test]
fn cnp_parses_field_by_field() {
    let bytes = cnp_frame();
    let f = Frame::parse(&bytes).expect("parse");
    assert_eq!(
        f.ethernet.dst_addr,
        EthernetAddress([0xe4, 0x1d, 0x2d, 0xab, 0x2b, 0xc2])
    );
    assert_eq!(
        f.ethernet.src_addr,
        EthernetAddress([0x7c, 0xfe, 0x90, 0x64, 0x3b, 0x32])
    );
    assert_eq!(
        (f.ethernet.vlan, f.ethernet.ethertype),
        (None, EtherType::IPV4)
    );
    let IpRepr::V4(ip) = f.datagram.ip else {
        panic!("IPv4 expected")
    };
    assert_eq!(ip.tos, 0xc2, "DSCP 48, ECN 10b");
    assert_eq!(
        (ip.ident, ip.dont_frag, ip.ttl, ip.protocol),
        (0x718c, true, 64, 17)
    );
    assert_eq!(
        (ip.src_addr, ip.dst_addr),
        (Ipv4Addr::new(10, 0, 17, 1), Ipv4Addr::new(10, 0, 18, 1))
    );
    assert_eq!(ip.payload_len, 0x3c - 20);
    let udp = f.datagram.udp;
    assert_eq!(
        (udp.src_port, udp.dst_port, udp.checksum, udp.payload_len),
        (0, ROCE_V2_PORT, 0, 32)
    );
    let roce = &f.datagram.roce;
    let bth = roce.bth();
    assert_eq!(bth.opcode(), Opcode::CNP);
    assert!(!bth.solicited() && !bth.mig_req() && !bth.fecn() && !bth.ack_req());
    assert!(bth.becn());
    assert_eq!((bth.pad_count(), bth.tver(), bth.pkey()), (0, 0, 0xffff));
    assert_eq!(
        (bth.dest_qp(), bth.psn()),
        (Qpn::from_wire(0x118), Psn::from_wire(0))
    );
    assert_eq!(roce.cnp_reserved(), Some(&[0u8; 16][..]));
    assert_eq!((roce.payload_len(), roce.pad().len()), (0, 0));
    assert_eq!(roce.icrc(), 0x2A00_FD82);
    assert!(f.trailer.is_empty());
}

#[test]
fn cnp_icrc_and_reemit() {
    let bytes = cnp_frame();
    let f = Frame::parse(&bytes).expect("parse");
    assert_eq!(icrc::compute(f.datagram.ip_packet), Ok(0x2A00_FD82));
    f.datagram.verify_icrc().expect("icrc");
    let IpRepr::V4(ip) = f.datagram.ip else {
        panic!("IPv4 expected")
    };
    let udp = f.datagram.udp;
    let roce = f.datagram.roce.as_bytes();
    assert_eq!(
        icrc::compute_v4(
            ip.src_addr,
            ip.dst_addr,
            ip.ident,
            ip.dont_frag,
            udp.src_port,
            udp.dst_port,
            roce
        ),
        0x2A00_FD82
    );
    icrc::verify_v4(
        ip.src_addr,
        ip.dst_addr,
        ip.ident,
        true,
        udp.src_port,
        udp.dst_port,
        roce,
    )
    .expect("icrc");
    let repr = f.to_repr().expect("repr");
    let mut out = vec![0u8; repr.buffer_len()];
    assert_eq!(repr.emit(&mut out, &[]), Ok(bytes.len()));
    assert_eq!(out, bytes);
}

#[test]
fn scapy_uc_send_only_parses_field_by_field() {
    let bytes = scapy_ip_packet();
    let d = rnic_roce::wire::Datagram::parse(&bytes).expect("parse");
    let IpRepr::V4(ip) = d.ip else {
        panic!("IPv4 expected")
    };
    assert_eq!(
        (ip.tos, ip.ident, ip.dont_frag, ip.ttl, ip.payload_len),
        (0x01, 1144, true, 64, 44)
    );
    assert_eq!(
        (ip.src_addr, ip.dst_addr),
        (Ipv4Addr::new(192, 168, 0, 7), Ipv4Addr::new(192, 168, 0, 7))
    );
    assert_eq!(
        (d.udp.src_port, d.udp.dst_port, d.udp.checksum),
        (49152, 4791, 0xaca2)
    );
    let r = RoceRepr::parse(&d.roce).expect("roce");
    assert_eq!(r.bth.opcode, Opcode::UC_SEND_ONLY);
    assert!(r.bth.mig_req && !r.bth.solicited && !r.bth.ack_req && !r.bth.fecn && !r.bth.becn);
    assert_eq!((r.bth.pad_count, r.bth.tver, r.bth.pkey), (2, 0, 0xffff));
    assert_eq!((r.bth.dest_qp.get(), r.bth.psn.get()), (211, 13_571_856));
    assert_eq!(r.payload_len, 18);
    assert_eq!(r.reth.or(None), None);
    assert_eq!(
        d.roce.payload(),
        &hex("4630818be28935d90e9a95505401be885e50")[..]
    );
    assert_eq!(d.roce.pad(), &[0, 0]);
    assert_eq!(d.roce.icrc(), 0xF353_F378);
}

#[test]
fn scapy_icrc_and_reemit() {
    let bytes = scapy_ip_packet();
    assert_eq!(icrc::compute(&bytes), Ok(0xF353_F378));
    icrc::verify(&bytes).expect("icrc");
    let d = rnic_roce::wire::Datagram::parse(&bytes).expect("parse");
    let IpRepr::V4(ip) = d.ip else {
        panic!("IPv4 expected")
    };
    let roce = d.roce.as_bytes();
    let v = icrc::compute_v4(
        ip.src_addr,
        ip.dst_addr,
        ip.ident,
        ip.dont_frag,
        49152,
        4791,
        roce,
    );
    assert_eq!(v, 0xF353_F378);
    // Re-emit the datagram (IPv4 checksum and ICRC recomputed) and the RoCE
    // packet alone, then fill the ICRC through the UDP-payload API.
    let repr = d.to_repr().expect("repr");
    let mut out = vec![0u8; repr.buffer_len()];
    assert_eq!(repr.emit(&mut out, d.roce.payload()), Ok(bytes.len()));
    assert_eq!(out, bytes);
    let mut roce_out = vec![0u8; repr.roce.buffer_len()];
    repr.roce
        .emit(&mut roce_out, d.roce.payload())
        .expect("emit");
    assert_eq!(&roce_out[roce_out.len() - 4..], &[0, 0, 0, 0]);
    let filled = icrc::fill_v4(
        ip.src_addr,
        ip.dst_addr,
        1144,
        true,
        49152,
        4791,
        &mut roce_out,
    )
    .expect("fill");
    assert_eq!(filled, 0xF353_F378);
    assert_eq!(roce_out, roce);
}

#[test]
fn masked_fields_do_not_change_the_icrc() {
    // TOS, TTL, IP checksum, UDP checksum, and BTH byte 4.
    let bytes = scapy_ip_packet();
    for off in [1usize, 8, 10, 11, 26, 27, 28 + 4] {
        let mut b = bytes.clone();
        b[off] ^= 0x5a;
        assert_eq!(icrc::verify(&b), Ok(()), "offset {off}");
    }
}

#[test]
fn flipped_payload_bit_fails_icrc() {
    for mut bytes in [scapy_ip_packet(), cnp_frame()[14..].to_vec()] {
        let payload_at = 20 + 8 + 12 + 3;
        bytes[payload_at] ^= 0x01;
        let found = u32::from_le_bytes(bytes[bytes.len() - 4..].try_into().expect("4"));
        match icrc::verify(&bytes) {
            Err(Error::IcrcMismatch { computed, found: f }) => {
                assert_eq!(f, found);
                assert_ne!(computed, found);
            }
            other => panic!("expected IcrcMismatch, got {other:?}"),
        }
        let roce = &bytes[28..];
        let a = Ipv4Addr::from(<[u8; 4]>::try_from(&bytes[12..16]).expect("4"));
        let b = Ipv4Addr::from(<[u8; 4]>::try_from(&bytes[16..20]).expect("4"));
        let ident = u16::from_be_bytes([bytes[4], bytes[5]]);
        let sport = u16::from_be_bytes([bytes[20], bytes[21]]);
        assert!(matches!(
            icrc::verify_v4(a, b, ident, true, sport, 4791, roce),
            Err(Error::IcrcMismatch { .. })
        ));
    }
}
