//! What the kernel puts on the wire: capture the IPv4 packets of a loopback
//! RoCE exchange with an AF_PACKET socket and check the identification, DF
//! and the whole-packet ICRC (`icrc::verify` on the captured IP packet).
//! Needs root (CAP_NET_RAW); prints SKIP otherwise.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::IpAddr;

use common::*;
use rnic_core::{Mtu, QpType, RecvWr, SendWr, WcStatus};
use rnic_roce::wire::icrc;
use rnic_rxe::Progress;

/// A captured IPv4/UDP packet to port 4791.
struct Captured {
    ident: u16,
    df: bool,
    udp_payload_len: usize,
    ip: Vec<u8>,
}

#[test]
fn kernel_sends_ident_zero_with_df_and_the_icrc_verifies() {
    let Some(cap) = capture_socket() else {
        return;
    };

    let (a, b) = sides(1 << 20, Progress::Thread);
    let (mut qa, mut qb) = (a.qp(QpType::Rc), b.qp(QpType::Rc));
    connect(&a, &mut qa, &b, &mut qb, Mtu::Mtu1024);
    let (IpAddr::V4(ia), IpAddr::V4(ib)) = (a.gid().to_ip(), b.gid().to_ip()) else {
        unreachable!()
    };
    // One single-packet SEND, then a 64 KiB WRITE (64 MIDDLE-sized packets:
    // GSO material).
    let rsge = [b.mr.sge(0, 64).unwrap()];
    qb.post_recv(&[RecvWr::new(1, &rsge)]).unwrap();
    let src = [a.mr.sge(0, 64).unwrap()];
    qa.post_send(&[SendWr::send(1, &src).signaled()]).unwrap();
    assert_eq!(wait(&a.cq, 1, &[])[0].status, WcStatus::Success);
    let big = [a.mr.sge(0, 65536).unwrap()];
    qa.post_send(&[SendWr::rdma_write(2, &big, b.mr.addr(), b.mr.rkey()).signaled()])
        .unwrap();
    assert_eq!(wait(&a.cq, 1, &[])[0].status, WcStatus::Success);

    let got: Vec<Captured> = captured_v4(&cap, ia, ib, 2)
        .into_iter()
        .map(|ip| Captured {
            ident: u16::from_be_bytes([ip[4], ip[5]]),
            df: ip[6] & 0x40 != 0,
            udp_payload_len: usize::from(u16::from_be_bytes([ip[24], ip[25]])) - 8,
            ip,
        })
        .collect();
    assert!(!got.is_empty(), "captured nothing");
    let mut singles = 0;
    let mut supers = 0;
    for c in &got {
        assert!(c.df, "DF must be set");
        assert_eq!(c.ident, 0, "unconnected DF socket: identification 0");
        // A RoCE packet at MTU 1024 is at most 12 + 16 + 1024 + 4 bytes; a
        // larger capture is a GSO super-packet that lo never segments.
        if c.udp_payload_len <= 1060 {
            icrc::verify(&c.ip).expect("whole-packet ICRC of a captured datagram");
            singles += 1;
        } else {
            supers += 1;
        }
    }
    println!(
        "captured {} packets: {singles} single datagrams (ident 0, DF, ICRC ok), {supers} GSO super-packets (ident 0, DF)",
        got.len()
    );
    assert!(singles > 0);
    let s = b.dev.stats().device;
    println!("receiver: {s:?}");
    assert_eq!(s.icrc_drops, 0);
}

/// A GSO sender to a receiver without GRO: the receiving kernel cuts the
/// super-packet itself, and the receiver cannot know each segment's index.
/// Every packet must still verify (by identification 0, or by solving for
/// it), and the data must arrive whole. Prints which path was taken.
#[test]
fn gso_to_a_receiver_without_gro() {
    use rnic_rxe::{RxeConfig, RxeDevice, Target};
    let (ia, ib) = ip_pair();
    let a = Side::new(open(ia, Progress::Thread), 1 << 20, 64);
    let mut cfg = RxeConfig::new(Target::Ip(ib));
    cfg.gro = false;
    let b = Side::new(RxeDevice::open(&cfg).unwrap(), 1 << 20, 64);
    assert!(!b.dev.gro());
    let (mut qa, mut qb) = (a.qp(QpType::Rc), b.qp(QpType::Rc));
    connect(&a, &mut qa, &b, &mut qb, Mtu::Mtu1024);
    let data = pattern(256 * 1024, 5);
    a.fill(0, &data);
    let src = [a.mr.sge(0, data.len() as u32).unwrap()];
    qa.post_send(&[SendWr::rdma_write(1, &src, b.mr.addr(), b.mr.rkey()).signaled()])
        .unwrap();
    assert_eq!(wait(&a.cq, 1, &[])[0].status, WcStatus::Success);
    assert!(b.bytes(0, data.len()) == data);
    let sa = a.dev.stats().device;
    let sb = b.dev.stats().device;
    println!(
        "sender: gso {} sends / {} segments; receiver (no GRO): icrc_ok {}, icrc_recovered {}, drops {}",
        sa.gso_sends, sa.gso_segments, sb.icrc_ok, sb.icrc_recovered, sb.icrc_drops
    );
    assert_eq!(sb.icrc_drops, 0);
    assert_eq!(sb.gro_datagrams, 0);
    assert!(sa.gso_sends > 0, "the sender used GSO");
    // Every packet verified with a predicted identification (0 for the
    // first segment, previous + 1 after it), none needed solving: the
    // kernel numbers the segments of a DF GSO send 0, 1, 2, ...
    // Under load a timeout may retransmit part of the WRITE: count what
    // arrived rather than assume exactly the 256 packets of one pass.
    assert_eq!(sb.icrc_recovered, 0);
    assert_eq!(sb.icrc_ok, sb.rx_packets, "every received packet verified");
    assert!(
        sb.icrc_ok >= 256,
        "the WRITE is 256 packets: {}",
        sb.icrc_ok
    );
}

/// The address vector's traffic class and hop limit reach the IPv4 header
/// (TOS and TTL), as kernel rxe writes them (`prepare_ipv4_hdr`), in both
/// directions: requests and the responder's ACKs.
#[test]
fn ipv4_tos_and_ttl_come_from_the_address_vector() {
    let Some(cap) = capture_socket() else {
        return;
    };
    let (a, b) = sides(1 << 16, Progress::Thread);
    let (mut qa, mut qb) = (a.qp(QpType::Rc), b.qp(QpType::Rc));
    connect_marked(&a, &mut qa, &b, &mut qb);
    let (IpAddr::V4(ia), IpAddr::V4(ib)) = (a.gid().to_ip(), b.gid().to_ip()) else {
        unreachable!()
    };
    let src = [a.mr.sge(0, 3000).unwrap()];
    qa.post_send(&[SendWr::rdma_write(1, &src, b.mr.addr(), b.mr.rkey()).signaled()])
        .unwrap();
    assert_eq!(wait(&a.cq, 1, &[])[0].status, WcStatus::Success);
    let (mut requests, mut acks) = (0, 0);
    for ip in captured_v4(&cap, ia, ib, 1) {
        assert_eq!(
            ip[1], MARK_TCLASS,
            "TOS = the address vector's traffic class"
        );
        assert_eq!(ip[8], MARK_HOPS, "TTL = the address vector's hop limit");
        if ip[28] == 0x11 {
            acks += 1;
        } else {
            requests += 1;
        }
    }
    assert!(
        requests >= 3 && acks >= 1,
        "{requests} requests, {acks} ACKs"
    );
}
