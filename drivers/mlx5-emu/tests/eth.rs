//! The Ethernet port (issue 27): raw Ethernet objects and NIC RX flow steering executed
//! strictly, frames delivered into an RQ only through installed rules (byte-exact), frames
//! of a raw SQ on the wire byte-exact, drops counted by cause, the vport counters, and RoCE v2
//! between two emulated functions cabled by a dgram wire (IPv4 and IPv6). The client is the
//! raw one of tests/common (not the driver).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::{SocketAddr, UdpSocket};

use common::eth::*;
use common::hw::*;
use rnic_mlx5_prm::{
    CmdStatus, QueryFteOut, QuerySqOut, QueryVportCounterOut, WqState, eth_cs_flags,
    match_criteria, tir_self_lb_block,
};

const PEER: [u8; 6] = [0x52, 0x54, 0x00, 0x12, 0x34, 0x56];

/// A function on a dgram wire whose far end is `cable`, with a completion EQ, two CQs (send,
/// receive), a TD, a TIS, a ready raw SQ and RQ (8 receives posted) and a TIR on the RQ.
struct Port {
    cable: Cable,
    sq_cq: Cq,
    rq_cq: Cq,
    td: u32,
    tisn: u32,
    tirn: u32,
    sq: RawSq,
    rq: RawRq,
    hw: Hw,
}

fn port() -> Port {
    let cable = Cable::new();
    let mut hw = Hw::with(dgram_options(
        "127.0.0.1:0".parse().unwrap(),
        cable.addr(),
        MAC,
    ));
    cable.plug(
        hw.r.emu
            .device()
            .port_local_addr()
            .expect("dgram wire bound"),
    );
    let (eqn, _) = hw.eq(6, 1, 0);
    let sq_cq = hw.cq(eqn);
    let rq_cq = hw.cq(eqn);
    assert_eq!(subscribe(&hw, &GROUPS), (0, 0));
    let td = td(&hw);
    let tisn = tis(&hw, td).unwrap();
    let sq = RawSq::new(&mut hw, sq_cq.cqn, tisn);
    let mut rq = RawRq::new(&mut hw, rq_cq.cqn);
    rq.post(8);
    let tirn = tir(&hw, td, rq.rqn, 0).unwrap();
    Port {
        cable,
        sq_cq,
        rq_cq,
        td,
        tisn,
        tirn,
        sq,
        rq,
        hw,
    }
}

/// A table (level 0, 16 entries) with an ARP group (0..=1) whose entry 0 sends ARP to the
/// port's TIR, made the root: (table, group).
fn arp_rule(p: &Port) -> (u32, u32) {
    let t = flow_table(&p.hw, 0, 4, |_| {}).unwrap();
    let g = ethertype_group(&p.hw, t, (0, 1)).unwrap();
    assert_eq!(
        flow_entry(&p.hw, (t, g, 0), &[p.tirn], |m| m
            .outer_headers_mut()
            .set_ethertype(0x0806)
            .unwrap()),
        (0, 0)
    );
    assert_eq!(set_root(&p.hw, t), (0, 0));
    (t, g)
}

fn bad_param(s: (u8, u32), syndrome: u32) {
    assert_eq!(s, (CmdStatus::BadParam.as_raw(), syndrome));
}

#[test]
fn frames_reach_the_rq_only_through_installed_rules_and_drops_are_counted() {
    let mut p = port();
    let arp = arp_request(PEER, [10, 0, 0, 9], [10, 0, 0, 1]);
    // No root table: an ARP broadcast is dropped and counted.
    p.cable.send(&arp);
    let s = wait_stats(&p.hw, |s| s.rx_no_rule == 1);
    assert_eq!(
        (s.rx_frames, s.rx_broadcast, s.rx_no_rule),
        (1, 1, 1),
        "{s:?}"
    );
    assert!(p.rq_cq.poll(Duration::from_millis(50)).is_none());
    // The rule installed and made the root: the same frame lands in the RQ, byte-exact.
    let (root, _) = arp_rule(&p);
    p.cable.send(&arp);
    let cqe = p.rq_cq.expect();
    let c = Cqe64::new_unchecked(&cqe[..]);
    assert_eq!(opcode(&cqe), CqeOpcode::RespSend);
    assert_eq!(c.byte_cnt(), arp.len() as u32);
    assert_eq!(
        (c.wqe_counter(), c.qpn(), c.srqn_uidx()),
        (0, 0xabc, 0x66),
        "index, flow tag, user index"
    );
    assert_eq!(c.eth_l3_hdr_type(), 0, "ARP is not IP");
    assert_eq!(p.rq.bytes(0, arp.len()), arp);
    // Unicast for another MAC, and an IPv4 broadcast no rule takes: dropped, counted.
    p.cable
        .send(&frame([2, 9, 9, 9, 9, 9], PEER, 0x0806, &arp[14..]));
    p.cable.send(&udp4(
        [0xff; 6],
        PEER,
        ([10, 0, 0, 9], [10, 0, 0, 255]),
        9,
        b"hello",
    ));
    let s = wait_stats(&p.hw, |s| s.rx_other_mac == 1 && s.rx_no_rule == 2);
    assert_eq!((s.rx_other_mac, s.rx_no_rule, s.rx_delivered), (1, 2, 1));
    // IPv6 neighbour discovery through a misc-3 (ICMPv6 type) rule: solicited-node multicast.
    let g = flow_group(
        &p.hw,
        root,
        (2, 3),
        match_criteria::OUTER_HEADERS | match_criteria::MISC_PARAMETERS_3,
        |m| {
            m.outer_headers_mut().set_ethertype(0xffff).unwrap();
            m.outer_headers_mut().set_ip_protocol(0xff).unwrap();
            m.misc_parameters_3_mut().set_icmpv6_type(0xff).unwrap();
        },
    )
    .unwrap();
    assert_eq!(
        flow_entry(&p.hw, (root, g, 2), &[p.tirn], |m| {
            m.outer_headers_mut().set_ethertype(0x86dd).unwrap();
            m.outer_headers_mut().set_ip_protocol(58).unwrap();
            m.misc_parameters_3_mut().set_icmpv6_type(135).unwrap();
        }),
        (0, 0)
    );
    let mut target = [0u8; 16];
    target[..2].copy_from_slice(&[0xfe, 0x80]);
    target[15] = 1;
    let mut src = target;
    src[15] = 9;
    let ns = neighbour_solicitation(PEER, src, target);
    // Its solicited-node group (33:33:ff:00:00:01) is not subscribed: the NIC drops it
    // before the flow table.
    p.cable.send(&ns);
    let s = wait_stats(&p.hw, |s| s.rx_not_subscribed == 1);
    assert_eq!(
        (s.rx_not_subscribed, s.rx_no_rule, s.rx_delivered),
        (1, 2, 1)
    );
    let groups = [GROUPS[0], GROUPS[1], [0x33, 0x33, 0xff, 0, 0, 1]];
    assert_eq!(subscribe(&p.hw, &groups), (0, 0));
    p.cable.send(&ns);
    let cqe = p.rq_cq.expect();
    let c = Cqe64::new_unchecked(&cqe[..]);
    assert_eq!((c.byte_cnt(), c.wqe_counter()), (ns.len() as u32, 1));
    assert_eq!(
        c.eth_l3_hdr_type(),
        rnic_mlx5_prm::cqe_eth_l3_hdr_type::IPV6
    );
    assert_eq!(p.rq.bytes(1, ns.len()), ns);
    // A neighbour advertisement (type 136) has no rule.
    let mut na = ns.clone();
    na[14 + 40] = 136;
    p.cable.send(&na);
    let s = wait_stats(&p.hw, |s| s.rx_no_rule == 3);
    assert_eq!((s.rx_multicast, s.rx_no_rule), (3, 3));
    // Over the port MTU (9000 bytes of L2 payload): dropped, counted.
    p.cable
        .send(&frame([0xff; 6], PEER, 0x0806, &vec![0u8; 9001]));
    let s = wait_stats(&p.hw, |s| s.rx_mtu == 1);
    assert_eq!(s.rx_mtu, 1);
    // Shorter than an Ethernet header: malformed.
    p.cable.send(&arp[..13]);
    assert_eq!(wait_stats(&p.hw, |s| s.rx_malformed == 1).rx_malformed, 1);
    // The RQ runs out of WQEs: 6 left of 8, the 7th frame is dropped and counted.
    for _ in 0..7 {
        p.cable.send(&arp);
    }
    let s = wait_stats(&p.hw, |s| s.rx_rq_empty == 1);
    assert_eq!((s.rx_delivered, s.rx_rq_empty), (8, 1));
    for i in 2..8 {
        let cqe = p.rq_cq.expect();
        assert_eq!(Cqe64::new_unchecked(&cqe[..]).wqe_counter(), i);
    }
    // The vport counters: what the function received, by cast.
    let out = vport_counters(&p.hw, true);
    let v = QueryVportCounterOut::new_unchecked(&out[..]);
    assert_eq!(
        v.received_eth_broadcast().packets(),
        2 + 1 + 7,
        "ARPs and the IPv4 broadcast"
    );
    assert_eq!(
        v.received_eth_broadcast().octets(),
        9 * 42 + udp4([0; 6], PEER, ([0; 4], [0; 4]), 9, b"hello").len() as u64
    );
    assert_eq!(v.received_eth_multicast().packets(), 3);
    assert_eq!(v.received_eth_unicast().packets(), 0);
    assert_eq!(v.received_errors().packets(), 2, "MTU + malformed");
    // Cleared.
    let out = vport_counters(&p.hw, false);
    assert_eq!(
        QueryVportCounterOut::new_unchecked(&out[..])
            .received_eth_broadcast()
            .packets(),
        0
    );
}

#[test]
fn raw_sq_frames_appear_on_the_wire_byte_exact() {
    let mut p = port();
    // An ARP reply from the function's MAC, 18 bytes inline, the rest from memory.
    let reply = {
        let mut f = arp_request(MAC, [10, 0, 0, 1], [10, 0, 0, 9]);
        f[..6].copy_from_slice(&PEER);
        f[21] = 2;
        f
    };
    let idx = p.sq.send(&p.hw, &reply, 18, 0);
    assert_eq!(p.cable.recv().as_deref(), Some(&reply[..]));
    let cqe = p.sq_cq.expect();
    let c = Cqe64::new_unchecked(&cqe[..]);
    assert_eq!(opcode(&cqe), CqeOpcode::Req);
    assert_eq!((c.wqe_counter(), c.qpn()), (u32::from(idx), p.sq.sqn));
    // Checksum offloads: the IPv4 header and UDP checksums are filled.
    let f = udp4(
        PEER,
        MAC,
        ([10, 0, 0, 1], [10, 0, 0, 9]),
        7,
        b"checksums please",
    );
    p.sq.send(&p.hw, &f, 18, eth_cs_flags::L3_CSUM | eth_cs_flags::L4_CSUM);
    let got = p.cable.recv().unwrap();
    p.sq_cq.expect();
    assert_eq!(got.len(), f.len());
    assert_eq!(
        rnic_roce::wire::ip::internet_checksum(&got[14..34]),
        0,
        "IPv4 header checksum"
    );
    let mut pseudo = got[26..34].to_vec();
    pseudo.extend_from_slice(&[0, 17]);
    pseudo.extend_from_slice(&((got.len() - 34) as u16).to_be_bytes());
    pseudo.extend_from_slice(&got[34..]);
    assert_ne!(got[40..42], [0, 0]);
    assert_eq!(
        rnic_roce::wire::ip::internet_checksum(&pseudo),
        0,
        "UDP checksum"
    );
    // A frame from another source MAC never leaves (counted); its WQE completes.
    let mut spoof = reply.clone();
    spoof[6..12].copy_from_slice(&[2, 7, 7, 7, 7, 7]);
    p.sq.send(&p.hw, &spoof, 18, 0);
    p.sq_cq.expect();
    assert!(p.cable.recv().is_none());
    assert_eq!(port_stats(&p.hw).tx_bad_smac, 1);
    // Too few inline header bytes (the vport wants L2: 18): an error CQE, the SQ in ERR,
    // nothing on the wire; the next WQE is flushed.
    let bad = p.sq.send(&p.hw, &reply, 14, 0);
    let cqe = p.sq_cq.expect();
    assert_eq!(
        (opcode(&cqe), syndrome(&cqe)),
        (CqeOpcode::ReqErr, CqeSyndrome::LocalQpOp)
    );
    assert_eq!(
        ErrCqe::new_unchecked(&cqe[..]).wqe_counter(),
        u32::from(bad)
    );
    let flushed = p.sq.send(&p.hw, &reply, 18, 0);
    let cqe = p.sq_cq.expect();
    assert_eq!(
        (
            syndrome(&cqe),
            ErrCqe::new_unchecked(&cqe[..]).wqe_counter()
        ),
        (CqeSyndrome::WrFlushed, u32::from(flushed))
    );
    assert!(p.cable.recv().is_none());
    let mut q = cmd(CmdOpcode::QuerySq, 0, 0x10);
    q[0x09..0x0c].copy_from_slice(&p.sq.sqn.to_be_bytes()[1..]);
    let out = p.hw.r.ok(&q, QuerySqOut::<&[u8]>::SIZE_BYTES);
    assert_eq!(
        QuerySqOut::new_unchecked(&out[..]).sq_context().state(),
        u32::from(WqState::Err.as_raw())
    );
    assert_eq!(
        QuerySqOut::new_unchecked(&out[..]).sq_context().cqn(),
        p.sq_cq.cqn
    );
    // Recovery as mlx5e does it: ERR → RST → RDY, counters from 0.
    assert_eq!(
        modify_sq(&p.hw, p.sq.sqn, WqState::Rdy, WqState::Rst).1,
        syn::WQ_STATE,
        "not RDY"
    );
    assert_eq!(
        modify_sq(&p.hw, p.sq.sqn, WqState::Err, WqState::Rdy).1,
        syn::WQ_STATE,
        "ERR → RDY skips RST"
    );
    assert_eq!(
        modify_sq(&p.hw, p.sq.sqn, WqState::Err, WqState::Rst),
        (0, 0)
    );
    // The doorbell record back to 0 before RDY (the SQ would execute what it says again).
    p.sq.pi = 0;
    p.sq.dbr.write(4, &[0; 4]).unwrap();
    assert_eq!(
        modify_sq(&p.hw, p.sq.sqn, WqState::Rst, WqState::Rdy),
        (0, 0)
    );
    assert_eq!(p.sq.send(&p.hw, &reply, 18, 0), 0);
    assert_eq!(p.cable.recv().as_deref(), Some(&reply[..]));
    p.sq_cq.expect();
    let s = port_stats(&p.hw);
    assert_eq!((s.tx_frames, s.tx_unicast, s.tx_bad_smac), (3, 3, 1));
}

#[test]
fn broadcasts_the_function_sends_loop_back_unless_its_tir_blocks_them() {
    let mut p = port();
    arp_rule(&p);
    let arp = arp_request(MAC, [10, 0, 0, 1], [10, 0, 0, 9]);
    p.sq.send(&p.hw, &arp, 18, 0);
    assert_eq!(p.cable.recv().as_deref(), Some(&arp[..]), "on the wire");
    p.sq_cq.expect();
    let cqe = p.rq_cq.expect();
    assert_eq!(Cqe64::new_unchecked(&cqe[..]).byte_cnt(), arp.len() as u32);
    assert_eq!(
        p.rq.bytes(0, arp.len()),
        arp,
        "and back to the function itself"
    );
    assert_eq!(port_stats(&p.hw).rx_loopback, 1);
    // A TIR of the same transport domain blocking multicast loopback: the next one is not
    // received (the entry must go before its TIR can).
    let blocking = tir(&p.hw, p.td, p.rq.rqn, tir_self_lb_block::MULTICAST).unwrap();
    assert_eq!(
        flow_destroy(&p.hw, CmdOpcode::DeleteFlowTableEntry, 1, 0),
        (0, 0)
    );
    assert_eq!(
        flow_entry(&p.hw, (1, 1, 0), &[blocking], |m| m
            .outer_headers_mut()
            .set_ethertype(0x0806)
            .unwrap()),
        (0, 0)
    );
    p.sq.send(&p.hw, &arp, 18, 0);
    assert!(p.cable.recv().is_some());
    p.sq_cq.expect();
    assert_eq!(wait_stats(&p.hw, |s| s.rx_lb_blocked == 1).rx_lb_blocked, 1);
    assert!(p.rq_cq.poll(Duration::from_millis(50)).is_none());
    // A peer's ARP still gets through the same rule.
    p.cable
        .send(&arp_request(PEER, [10, 0, 0, 9], [10, 0, 0, 1]));
    p.rq_cq.expect();
    let _ = (p.tisn, p.td);
}

#[test]
fn flow_and_raw_commands_refuse_bad_input_and_change_nothing() {
    let mut p = port();
    let (t, g) = arp_rule(&p);
    let before = p.hw.r.fw().accounting();
    // Tables.
    bad_param(
        flow_table(&p.hw, 0, 4, |v| v.set_table_type(1).unwrap()).unwrap_err(),
        syn::FLOW_TABLE_TYPE,
    );
    bad_param(
        flow_table(&p.hw, 0, 4, |v| v.set_vport_number(1).unwrap()).unwrap_err(),
        syn::FLOW_VPORT,
    );
    bad_param(
        flow_table(&p.hw, 64, 4, |_| {}).unwrap_err(),
        syn::FLOW_TABLE_LEVEL,
    );
    bad_param(
        flow_table(&p.hw, 0, 17, |_| {}).unwrap_err(),
        syn::FLOW_TABLE_SIZE,
    );
    bad_param(
        flow_table(&p.hw, 0, 4, |v| {
            v.flow_table_context_mut().set_table_miss_action(1).unwrap()
        })
        .unwrap_err(),
        syn::FLOW_TABLE_CONTEXT,
    );
    // Groups.
    bad_param(
        ethertype_group(&p.hw, t, (1, 2)).unwrap_err(),
        syn::FLOW_GROUP_OVERLAP,
    );
    bad_param(
        ethertype_group(&p.hw, t, (4, 16)).unwrap_err(),
        syn::FLOW_GROUP_RANGE,
    );
    bad_param(
        ethertype_group(&p.hw, t, (5, 4)).unwrap_err(),
        syn::FLOW_GROUP_RANGE,
    );
    assert_eq!(
        ethertype_group(&p.hw, 99, (4, 5)).unwrap_err(),
        (CmdStatus::BadRes.as_raw(), syn::FLOW_TABLE_NOT_FOUND)
    );
    bad_param(
        flow_group(&p.hw, t, (4, 5), match_criteria::MISC_PARAMETERS, |_| {}).unwrap_err(),
        syn::FLOW_CRITERIA_UNSUPPORTED,
    );
    bad_param(
        flow_group(&p.hw, t, (4, 5), match_criteria::OUTER_HEADERS, |m| {
            m.misc_parameters_3_mut().set_icmpv6_type(0xff).unwrap()
        })
        .unwrap_err(),
        syn::FLOW_CRITERIA_NOT_ENABLED,
    );
    bad_param(
        flow_group(&p.hw, t, (4, 5), match_criteria::OUTER_HEADERS, |m| {
            m.outer_headers_mut().set_l4_type(3).unwrap()
        })
        .unwrap_err(),
        syn::FLOW_CRITERIA_UNSUPPORTED,
    );
    // Entries: a TIR that does not exist, the same match again, bits outside the mask, an
    // index outside the group, another entry's index, no destination, DROP with one.
    let arp = |m: &mut rnic_mlx5_prm::FteMatchParam<&mut [u8]>| {
        m.outer_headers_mut().set_ethertype(0x0806).unwrap()
    };
    assert_eq!(
        flow_entry(&p.hw, (t, g, 1), &[77], |m| m
            .outer_headers_mut()
            .set_ethertype(0x86dd)
            .unwrap()),
        (CmdStatus::BadRes.as_raw(), syn::FLOW_DEST_TIR)
    );
    bad_param(
        flow_entry(&p.hw, (t, g, 1), &[p.tirn], arp),
        syn::FLOW_ENTRY_DUPLICATE,
    );
    bad_param(
        flow_entry(&p.hw, (t, g, 1), &[p.tirn], |m| {
            m.outer_headers_mut().set_ip_protocol(17).unwrap()
        }),
        syn::FLOW_VALUE_OUTSIDE_MASK,
    );
    bad_param(
        flow_entry(&p.hw, (t, g, 2), &[p.tirn], arp),
        syn::FLOW_INDEX,
    );
    bad_param(
        flow_entry(&p.hw, (t, g, 0), &[p.tirn], arp),
        syn::FLOW_ENTRY_EXISTS,
    );
    bad_param(
        flow_entry(&p.hw, (t, g, 1), &[p.tirn; 17], |m| {
            m.outer_headers_mut().set_ethertype(1).unwrap()
        }),
        syn::FLOW_DEST_COUNT,
    );
    assert_eq!(
        flow_entry(&p.hw, (t, 99, 1), &[p.tirn], arp),
        (CmdStatus::BadRes.as_raw(), syn::FLOW_GROUP_NOT_FOUND)
    );
    // Root on a table that does not exist.
    assert_eq!(
        set_root(&p.hw, 99),
        (CmdStatus::BadRes.as_raw(), syn::FLOW_TABLE_NOT_FOUND)
    );
    // Nothing in use is destroyed.
    let in_use = (CmdStatus::BadResState.as_raw(),);
    assert_eq!(
        flow_destroy(&p.hw, CmdOpcode::DestroyFlowTable, t, 0),
        (in_use.0, syn::FLOW_TABLE_IS_ROOT)
    );
    assert_eq!(
        flow_destroy(&p.hw, CmdOpcode::DestroyFlowGroup, t, g),
        (in_use.0, syn::FLOW_GROUP_HAS_ENTRIES)
    );
    assert_eq!(
        destroy(&p.hw, CmdOpcode::DestroyTir, p.tirn),
        (in_use.0, syn::TIR_IN_USE)
    );
    assert_eq!(
        destroy(&p.hw, CmdOpcode::DestroyRq, p.rq.rqn),
        (in_use.0, syn::RQ_IN_USE)
    );
    assert_eq!(
        destroy(&p.hw, CmdOpcode::DestroyTis, p.tisn),
        (in_use.0, syn::TIS_IN_USE)
    );
    assert_eq!(
        destroy(&p.hw, CmdOpcode::DeallocTransportDomain, p.td),
        (in_use.0, syn::TD_IN_USE)
    );
    assert_eq!(
        destroy(&p.hw, CmdOpcode::DestroyCq, p.sq_cq.cqn),
        (in_use.0, syn::CQ_IN_USE)
    );
    assert_eq!(
        destroy(&p.hw, CmdOpcode::DeallocPd, p.hw.pd),
        (in_use.0, syn::RESOURCE_IN_USE)
    );
    assert_eq!(
        destroy(&p.hw, CmdOpcode::DeallocUar, p.hw.uar),
        (in_use.0, syn::RESOURCE_IN_USE)
    );
    let teardown = status(
        &p.hw
            .r
            .exec(&cmd(CmdOpcode::TeardownHca, 0, 0x10), OUT)
            .out(),
    );
    assert_eq!(teardown, (in_use.0, syn::TEARDOWN_OBJECTS_LIVE));
    // Raw objects with bad contexts.
    let (sq_cq, tisn) = (p.sq_cq.cqn, p.tisn);
    bad_param(
        try_sq(&mut p.hw, sq_cq, tisn, |s| s.set_state(1).unwrap())
            .err()
            .unwrap(),
        syn::SQ_CONTEXT,
    );
    bad_param(
        try_sq(&mut p.hw, sq_cq, tisn, |s| s.set_tis_lst_sz(2).unwrap())
            .err()
            .unwrap(),
        syn::SQ_CONTEXT,
    );
    bad_param(
        try_sq(&mut p.hw, sq_cq, tisn, |s| {
            s.set_min_wqe_inline_mode(0).unwrap()
        })
        .err()
        .unwrap(),
        syn::SQ_INLINE,
    );
    bad_param(
        try_sq(&mut p.hw, sq_cq, tisn, |s| {
            s.wq_mut().set_log_wq_stride(5).unwrap()
        })
        .err()
        .unwrap(),
        syn::WQ_CONTEXT,
    );
    bad_param(
        try_sq(&mut p.hw, sq_cq, tisn, |s| {
            s.wq_mut().set_wq_type(0).unwrap()
        })
        .err()
        .unwrap(),
        syn::WQ_CONTEXT,
    );
    assert_eq!(
        try_sq(&mut p.hw, sq_cq, 99, |_| {}).err().unwrap(),
        (CmdStatus::BadRes.as_raw(), syn::TIS_NOT_FOUND)
    );
    assert_eq!(
        try_sq(&mut p.hw, 99, tisn, |_| {}).err().unwrap(),
        (CmdStatus::BadRes.as_raw(), syn::CQ_NOT_FOUND)
    );
    bad_param(
        try_rq(&mut p.hw, sq_cq, |r| r.set_scatter_fcs(1).unwrap())
            .err()
            .unwrap(),
        syn::RQ_CONTEXT,
    );
    bad_param(
        try_rq(&mut p.hw, sq_cq, |r| {
            r.wq_mut().set_log_wq_stride(3).unwrap()
        })
        .err()
        .unwrap(),
        syn::WQ_CONTEXT,
    );
    assert_eq!(
        tir(&p.hw, p.td, 99, 0).unwrap_err(),
        (CmdStatus::BadRes.as_raw(), syn::TIR_RQ)
    );
    assert_eq!(
        tir(&p.hw, 99, p.rq.rqn, 0).unwrap_err(),
        (CmdStatus::BadRes.as_raw(), syn::TD_UNKNOWN)
    );
    assert_eq!(
        tis(&p.hw, 99).unwrap_err(),
        (CmdStatus::BadRes.as_raw(), syn::TD_UNKNOWN)
    );
    assert_eq!(
        modify_sq(&p.hw, p.sq.sqn, WqState::Rst, WqState::Rdy).1,
        syn::WQ_STATE,
        "it is RDY"
    );
    assert_eq!(
        modify_rq(&p.hw, p.rq.rqn, WqState::Rdy, WqState::Rdy).1,
        syn::WQ_STATE
    );
    // Nothing changed: the same objects (the refused SQs' and RQs' buffers and MKeys aside),
    // the entry as set, ARP still delivered.
    let after = p.hw.r.fw().accounting();
    assert_eq!(
        (
            after.eth_objects,
            after.flow_objects,
            after.tds,
            after.cqs,
            after.qps
        ),
        (
            before.eth_objects,
            before.flow_objects,
            before.tds,
            before.cqs,
            before.qps
        )
    );
    let mut q = cmd(CmdOpcode::QueryFlowTableEntry, 0, 0x40);
    q[0x15..0x18].copy_from_slice(&t.to_be_bytes()[1..]);
    let out = p.hw.r.ok(&q, QueryFteOut::<&[u8]>::SIZE_BYTES + 16);
    let fc = QueryFteOut::new_unchecked(&out[..]);
    let fc = fc.flow_context();
    assert_eq!((fc.group_id(), fc.destination_list_size()), (g, 1));
    assert_eq!(
        fc.destination(0)
            .unwrap()
            .destination_entry()
            .destination_id(),
        p.tirn
    );
    assert_eq!(fc.match_value().outer_headers().ethertype(), 0x0806);
    p.cable
        .send(&arp_request(PEER, [10, 0, 0, 9], [10, 0, 0, 1]));
    let got = p.rq_cq.poll(Duration::from_secs(5));
    assert!(got.is_some(), "{:?}", port_stats(&p.hw));
    assert_eq!(opcode(&got.unwrap()), CqeOpcode::RespSend);
    // Torn down in order, everything goes.
    assert_eq!(
        flow_destroy(&p.hw, CmdOpcode::DeleteFlowTableEntry, t, 0),
        (0, 0)
    );
    assert_eq!(
        flow_destroy(&p.hw, CmdOpcode::DeleteFlowTableEntry, t, 0).1,
        syn::FLOW_ENTRY_NOT_FOUND
    );
    assert_eq!(
        flow_destroy(&p.hw, CmdOpcode::DestroyFlowGroup, t, g),
        (0, 0)
    );
    let mut root_off = cmd(CmdOpcode::SetFlowTableRoot, 1, 0x40);
    root_off[0x10] = 0;
    p.hw.r.ok(&root_off, OUT);
    assert_eq!(
        flow_destroy(&p.hw, CmdOpcode::DestroyFlowTable, t, 0),
        (0, 0)
    );
    for (op, n) in [
        (CmdOpcode::DestroyTir, p.tirn),
        (CmdOpcode::DestroyRq, p.rq.rqn),
        (CmdOpcode::DestroySq, p.sq.sqn),
        (CmdOpcode::DestroyTis, p.tisn),
        (CmdOpcode::DeallocTransportDomain, p.td),
    ] {
        assert_eq!(destroy(&p.hw, op, n), (0, 0), "{op}");
    }
    let a = p.hw.r.fw().accounting();
    assert_eq!((a.eth_objects, a.flow_objects, a.tds), (0, 0, 0));
}

/// Two free UDP ports on 127.0.0.1.
fn two_ports() -> (SocketAddr, SocketAddr) {
    let a = UdpSocket::bind("127.0.0.1:0").unwrap();
    let b = UdpSocket::bind("127.0.0.1:0").unwrap();
    (a.local_addr().unwrap(), b.local_addr().unwrap())
}

/// One end of the RoCE test: a function with a GID, a CQ, an RC QP and 16 KiB of memory.
struct End {
    cq: Cq,
    qp: EmuQp,
    data: Arc<DmaBuffer>,
    lkey: u32,
    hw: Hw,
}

fn end(local: SocketAddr, remote: SocketAddr, mac: [u8; 6], ip: IpAddr) -> End {
    let mut hw = Hw::with(dgram_options(local, remote, mac));
    assert_eq!(hw.set_gid_with(0, ip, mac, 2), (0, 0));
    assert!(
        hw.r.fw().bound_addresses().is_empty(),
        "an Ethernet port binds no host socket"
    );
    let (eqn, _) = hw.eq(6, 1, 0);
    let cq = hw.cq(eqn);
    let data = hw.buf(4 * 4096);
    let lkey = hw.mkey(&data, VA, &["lw", "rr", "rw", "a"]);
    let qp = EmuQp::create(&mut hw, &cq, QpServiceType::Rc);
    End {
        cq,
        qp,
        data,
        lkey,
        hw,
    }
}

fn roce_between_two_functions(ips: (IpAddr, IpAddr)) {
    let (pa, pb) = two_ports();
    let (ma, mb) = ([2, 0, 0, 0, 0, 0xa], [2, 0, 0, 0, 0, 0xb]);
    let mut a = end(pa, pb, ma, ips.0);
    let mut b = end(pb, pa, mb, ips.1);
    a.qp.connect_via(&a.hw, (b.qp.qpn, ips.1, mb), 0x200, 0x100);
    b.qp.connect_via(&b.hw, (a.qp.qpn, ips.0, ma), 0x100, 0x200);
    // RDMA WRITE A → B, then SEND A → B into a posted receive.
    let msg = pattern(3000, 7);
    a.data.write(0, &msg).unwrap();
    let idx = a.qp.post(
        &a.hw,
        WqeOpcode::RdmaWrite,
        true,
        &[raddr_seg(VA + 4096, b.lkey), data_seg(3000, a.lkey, VA)],
    );
    let cqe = a.cq.expect();
    assert_eq!(
        (opcode(&cqe), Cqe64::new_unchecked(&cqe[..]).wqe_counter()),
        (CqeOpcode::Req, u32::from(idx))
    );
    let mut got = vec![0u8; 3000];
    b.data.read(4096, &mut got).unwrap();
    assert_eq!(got, msg);
    b.qp.post_recv(VA + 8192, 4096, b.lkey);
    a.qp.post(
        &a.hw,
        WqeOpcode::Send,
        true,
        &[data_seg(1000, a.lkey, VA + 100)],
    );
    assert_eq!(opcode(&a.cq.expect()), CqeOpcode::Req);
    let cqe = b.cq.expect();
    assert_eq!(
        (opcode(&cqe), Cqe64::new_unchecked(&cqe[..]).byte_cnt()),
        (CqeOpcode::RespSend, 1000)
    );
    let mut got = vec![0u8; 1000];
    b.data.read(8192, &mut got).unwrap();
    assert_eq!(got, msg[100..1100]);
    let (sa, sb) = (port_stats(&a.hw), port_stats(&b.hw));
    assert!(
        sa.tx_frames >= 4 && sb.rx_roce >= 4 && sb.tx_frames >= 2 && sa.rx_roce >= 2,
        "{sa:?} {sb:?}"
    );
    assert_eq!(
        (sa.rx_other_mac, sb.rx_other_mac, sa.tx_bad_dmac),
        (0, 0, 0)
    );
    assert_eq!(
        a.hw.r.fw().hca_stats().rx_bad_icrc + b.hw.r.fw().hca_stats().rx_bad_icrc,
        0
    );
    // A QP whose rmac was never resolved (zero): nothing leaves, every attempt counted.
    let mut lost = EmuQp::create(&mut a.hw, &a.cq, QpServiceType::Rc);
    lost.connect_via(&a.hw, (b.qp.qpn, ips.1, [0; 6]), 0x300, 0x300);
    lost.post(
        &a.hw,
        WqeOpcode::RdmaWrite,
        true,
        &[raddr_seg(VA, b.lkey), data_seg(8, a.lkey, VA)],
    );
    assert!(wait_stats(&a.hw, |s| s.tx_bad_dmac >= 1).tx_bad_dmac >= 1);
    assert_eq!(
        port_stats(&b.hw).rx_frames,
        sb.rx_frames,
        "nothing reached B"
    );
}

#[test]
fn roce_v2_over_a_dgram_cable_between_two_functions_ipv4() {
    roce_between_two_functions(("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap()));
}

#[test]
fn roce_v2_over_a_dgram_cable_between_two_functions_ipv6() {
    roce_between_two_functions(("fd00::1".parse().unwrap(), "fd00::2".parse().unwrap()));
}

/// The vport's multicast list: group frames reach the flow table only for subscribed
/// addresses (or with promisc_mc); bad lists are refused whole and change nothing.
#[test]
fn group_frames_need_the_vport_multicast_list_and_bad_lists_are_refused() {
    let mut p = port();
    arp_rule(&p);
    let arp = arp_request(PEER, [10, 0, 0, 9], [10, 0, 0, 1]);
    p.cable.send(&arp);
    p.rq_cq.expect();
    // Refused lists leave the subscription as it was (broadcast still delivered).
    let mut c = cmd(
        CmdOpcode::ModifyNicVportContext,
        0,
        ModifyNicVportContextIn::<&[u8]>::SIZE_BYTES + 8,
    );
    {
        let mut v = ModifyNicVportContextIn::new_unchecked(&mut c[..]);
        v.field_select_mut().set_addresses_list(1).unwrap();
        v.nic_vport_context_mut().set_allowed_list_type(2).unwrap();
    }
    bad_param(status(&p.hw.r.exec(&c, OUT).out()), syn::VPORT_LIST_TYPE);
    ModifyNicVportContextIn::new_unchecked(&mut c[..])
        .nic_vport_context_mut()
        .set_allowed_list_type(1)
        .unwrap();
    ModifyNicVportContextIn::new_unchecked(&mut c[..])
        .nic_vport_context_mut()
        .set_allowed_list_size(129)
        .unwrap();
    bad_param(status(&p.hw.r.exec(&c, OUT).out()), syn::VPORT_LIST_SIZE);
    ModifyNicVportContextIn::new_unchecked(&mut c[..])
        .nic_vport_context_mut()
        .set_allowed_list_size(2)
        .unwrap();
    assert_eq!(
        status(&p.hw.r.exec(&c, OUT).out()),
        (CmdStatus::BadInpLen.as_raw(), syn::VPORT_LIST_LENGTH),
        "two entries announced, one in the input"
    );
    assert_eq!(
        subscribe(&p.hw, &[[0xff; 6], [0x02, 0, 0, 0, 0, 1]]).1,
        syn::VPORT_LIST_ADDRESS,
        "a unicast address in the MC list"
    );
    p.cable.send(&arp);
    p.rq_cq.expect();
    // An empty list: broadcast stops at the NIC.
    assert_eq!(subscribe(&p.hw, &[]), (0, 0));
    let base = wait_stats(&p.hw, |_| true);
    p.cable.send(&arp);
    let s = wait_stats(&p.hw, |s| s.rx_not_subscribed > base.rx_not_subscribed);
    assert_eq!(s.since(&base).rx_not_subscribed, 1);
    assert!(p.rq_cq.poll(Duration::from_millis(50)).is_none());
    // promisc_mc: every group address again.
    let mut c = cmd(
        CmdOpcode::ModifyNicVportContext,
        0,
        ModifyNicVportContextIn::<&[u8]>::SIZE_BYTES,
    );
    {
        let mut v = ModifyNicVportContextIn::new_unchecked(&mut c[..]);
        v.field_select_mut().set_promisc(1).unwrap();
        v.nic_vport_context_mut().set_promisc_mc(1).unwrap();
    }
    assert_eq!(status(&p.hw.r.exec(&c, OUT).out()), (0, 0));
    p.cable.send(&arp);
    p.rq_cq.expect();
}
