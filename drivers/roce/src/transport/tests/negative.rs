//! Responder negative tests: hand-built request packets against one QP.
//! Each bad request gets the response §9 names (the NAK bytes are parsed
//! back and asserted), a counter moves, and no byte of memory changes.

use rnic_core::{Mtu, Psn, Qpn, Rkey, WcStatus};

use super::*;
use crate::transport::QpStats;
use crate::transport::pkt::{self, AtomicEth, Out, Reth, op, syndrome};
use crate::transport::sim::{Endpoint, MemTable};

const RQ_PSN: u32 = 1000;
const MTU: usize = 1024;
const W_VA: u64 = 0x1_0000;
const R_VA: u64 = 0x2_0000;
const A_VA: u64 = 0x3_0000;
const N_VA: u64 = 0x4_0000;
const F_VA: u64 = 0x5_0000;
const RECV_VA: u64 = 0x6_0000;

/// Builds a packet against a rig's keys.
type Make<'a> = Box<dyn Fn(&Rig) -> Vec<u8> + 'a>;

struct Rig {
    ep: Endpoint,
    w: u32,
    r: u32,
    a: u32,
    none: u32,
    foreign: u32,
    recv: u32,
}

/// Responder B (QPN 0x22) in RTS with `access`, regions filled with a pattern.
fn rig(access: AccessFlags) -> Rig {
    let mut cfg = QpConfig::rc(Qpn::from_wire(QPN_B), PD);
    cfg.local_gid = gid(2);
    let mut ep = Endpoint::new(Qp::new(cfg).expect("RC QP"), gid(2));
    let c = Conn {
        mtu: Mtu::Mtu1024,
        access,
        min_rnr_timer: 14,
        ..Conn::default()
    };
    connect(&mut ep, QPN_A, gid(1), 7, RQ_PSN, &c);
    let lw = AccessFlags::LOCAL_WRITE;
    let w = ep
        .mem
        .register(PD, W_VA, 4096, lw.union(AccessFlags::REMOTE_WRITE));
    let r = ep.mem.register(PD, R_VA, 4096, AccessFlags::REMOTE_READ);
    let a = ep
        .mem
        .register(PD, A_VA, 64, lw.union(AccessFlags::REMOTE_ATOMIC));
    let none = ep.mem.register(PD, N_VA, 4096, lw);
    let foreign = ep
        .mem
        .register(PdHandle(2), F_VA, 4096, AccessFlags::ALL_REMOTE);
    let recv = ep.mem.register(PD, RECV_VA, 4096, lw);
    for (i, reg) in ep.mem.regions.iter_mut().enumerate() {
        fill(&mut reg.data, i as u64 + 1);
    }
    Rig {
        ep,
        w,
        r,
        a,
        none,
        foreign,
        recv,
    }
}

/// A request packet from A to B.
fn req(opcode: u8, psn: u32, payload: &[u8], f: impl FnOnce(&mut Out)) -> Vec<u8> {
    let mut o = Out {
        opcode,
        dest_qp: Qpn::from_wire(QPN_B),
        psn: Psn::from_wire(psn),
        ack_req: true,
        ..Out::default()
    };
    f(&mut o);
    let len = pkt::packet_len(opcode, payload.len());
    let mut b = vec![0u8; len];
    let at = pkt::emit(&mut b, &o, payload.len()).expect("fits");
    b[at..at + payload.len()].copy_from_slice(payload);
    b
}

fn reth(va: u64, key: u32, len: u32) -> impl FnOnce(&mut Out) {
    move |o: &mut Out| {
        o.reth = Reth {
            va,
            rkey: Rkey(key),
            len,
        }
    }
}

fn atomic(va: u64, key: u32) -> impl FnOnce(&mut Out) {
    move |o: &mut Out| {
        o.atomic = AtomicEth {
            va,
            rkey: Rkey(key),
            swap_add: 5,
            compare: 0,
        }
    }
}

impl Rig {
    /// Feed one packet; return what B emitted as (opcode, syndrome, PSN).
    fn inject(&mut self, bytes: &[u8]) -> Vec<(u8, u8, u32)> {
        let now = crate::transport::Instant::from_nanos(0);
        self.ep.with(|qp, io| qp.receive(now, bytes, gid(1), io));
        let out = std::mem::take(&mut self.ep.tx.out);
        out.iter()
            .map(|(b, dest)| {
                assert_eq!(dest.qpn, Qpn::from_wire(QPN_A));
                let p = pkt::parse(b).expect("B emits valid packets");
                (p.opcode, p.aeth_syndrome, p.psn.get())
            })
            .collect()
    }

    fn mem(&self) -> MemTable {
        self.ep.mem.clone()
    }

    /// Feed one packet as if it came from `src`; what B emitted.
    fn inject_from(&mut self, src: Gid, bytes: &[u8]) -> usize {
        let now = crate::transport::Instant::from_nanos(0);
        self.ep.with(|qp, io| qp.receive(now, bytes, src, io));
        std::mem::take(&mut self.ep.tx.out).len()
    }

    fn stats(&self) -> QpStats {
        *self.ep.qp.stats()
    }

    fn post_recv(&mut self, len: u32) {
        let sg = [sge(self.recv, RECV_VA, len)];
        let r = self.ep.with(|qp, io| {
            qp.post_recv(
                &RecvWr {
                    wr_id: 1,
                    sg_list: &sg,
                },
                io,
            )
        });
        assert!(r.is_ok());
    }
}

fn same_memory(a: &MemTable, b: &MemTable) {
    assert_eq!(a.regions.len(), b.regions.len());
    for (x, y) in a.regions.iter().zip(&b.regions) {
        assert!(x.data == y.data, "region {:#x} changed", x.key);
    }
}

/// Assert exactly one NAK with `syn` for `psn`, memory untouched, QP in ERR.
fn expect_nak(rig: &mut Rig, packet: &[u8], syn: u8, psn: u32) -> QpStats {
    let before = rig.mem();
    let out = rig.inject(packet);
    assert_eq!(out, vec![(op::ACK, syn, psn)], "response to a bad request");
    same_memory(&before, &rig.ep.mem);
    assert_eq!(rig.ep.qp.state(), QpState::Err);
    rig.stats()
}

#[test]
fn wrong_rkey_out_of_bounds_missing_access_foreign_pd() {
    let data = [7u8; 16];
    let cases: Vec<(&str, Make<'_>)> = vec![
        (
            "WRITE wrong rkey",
            Box::new(|r| req(op::WRITE_ONLY, RQ_PSN, &data, reth(W_VA, r.w ^ 0x100, 16))),
        ),
        (
            "WRITE stale key byte",
            Box::new(|r| req(op::WRITE_ONLY, RQ_PSN, &data, reth(W_VA, r.w ^ 1, 16))),
        ),
        (
            "WRITE past the end",
            Box::new(|r| {
                req(
                    op::WRITE_ONLY,
                    RQ_PSN,
                    &data,
                    reth(W_VA + 4096 - 8, r.w, 16),
                )
            }),
        ),
        (
            "WRITE before the start",
            Box::new(|r| req(op::WRITE_ONLY, RQ_PSN, &data, reth(W_VA - 1, r.w, 16))),
        ),
        (
            "WRITE FIRST whose RETH length overruns",
            Box::new(|r| req(op::WRITE_FIRST, RQ_PSN, &[1u8; MTU], reth(W_VA, r.w, 8192))),
        ),
        (
            "WRITE without REMOTE_WRITE on the region",
            Box::new(|r| req(op::WRITE_ONLY, RQ_PSN, &data, reth(N_VA, r.none, 16))),
        ),
        (
            "WRITE into a READ-only region",
            Box::new(|r| req(op::WRITE_ONLY, RQ_PSN, &data, reth(R_VA, r.r, 16))),
        ),
        (
            "WRITE into another PD",
            Box::new(|r| req(op::WRITE_ONLY, RQ_PSN, &data, reth(F_VA, r.foreign, 16))),
        ),
        (
            "READ without REMOTE_READ",
            Box::new(|r| req(op::READ_REQUEST, RQ_PSN, &[], reth(W_VA, r.w, 16))),
        ),
        (
            "READ past the end",
            Box::new(|r| req(op::READ_REQUEST, RQ_PSN, &[], reth(R_VA + 4000, r.r, 97))),
        ),
        (
            "READ from another PD",
            Box::new(|r| req(op::READ_REQUEST, RQ_PSN, &[], reth(F_VA, r.foreign, 8))),
        ),
        (
            "ATOMIC without REMOTE_ATOMIC",
            Box::new(|r| req(op::FETCH_ADD, RQ_PSN, &[], atomic(W_VA, r.w))),
        ),
        (
            "ATOMIC past the end",
            Box::new(|r| req(op::CMP_SWAP, RQ_PSN, &[], atomic(A_VA + 64, r.a))),
        ),
        (
            "ATOMIC on another PD",
            Box::new(|r| req(op::FETCH_ADD, RQ_PSN, &[], atomic(F_VA, r.foreign))),
        ),
        (
            "ATOMIC bad rkey",
            Box::new(|r| req(op::FETCH_ADD, RQ_PSN, &[], atomic(A_VA, r.a + 0x1000))),
        ),
    ];
    for (name, make) in &cases {
        let mut r = rig(AccessFlags::ALL_REMOTE);
        let p = make(&r);
        let s = expect_nak(&mut r, &p, syndrome::NAK_REMOTE_ACCESS, RQ_PSN);
        assert_eq!(s.naks_sent.remote_access, 1, "{name}");
        assert_eq!(s.naks_sent.total(), 1, "{name}");
    }
}

#[test]
fn invalid_requests() {
    let mtu_data = [3u8; MTU];
    let cases: Vec<(&str, AccessFlags, Make<'_>)> = vec![
        (
            "WRITE on a QP without REMOTE_WRITE",
            AccessFlags::REMOTE_READ,
            Box::new(|r| req(op::WRITE_ONLY, RQ_PSN, &[1; 8], reth(W_VA, r.w, 8))),
        ),
        (
            "READ on a QP without REMOTE_READ",
            AccessFlags::REMOTE_WRITE,
            Box::new(|r| req(op::READ_REQUEST, RQ_PSN, &[], reth(R_VA, r.r, 8))),
        ),
        (
            "ATOMIC on a QP without REMOTE_ATOMIC",
            AccessFlags::REMOTE_WRITE,
            Box::new(|r| req(op::FETCH_ADD, RQ_PSN, &[], atomic(A_VA, r.a))),
        ),
        (
            "misaligned ATOMIC",
            AccessFlags::ALL_REMOTE,
            Box::new(|r| req(op::CMP_SWAP, RQ_PSN, &[], atomic(A_VA + 4, r.a))),
        ),
        (
            "WRITE MIDDLE without FIRST",
            AccessFlags::ALL_REMOTE,
            Box::new(|_| req(op::WRITE_MIDDLE, RQ_PSN, &mtu_data, |_| {})),
        ),
        (
            "WRITE LAST without FIRST",
            AccessFlags::ALL_REMOTE,
            Box::new(|_| req(op::WRITE_LAST, RQ_PSN, &[1; 4], |_| {})),
        ),
        (
            "SEND LAST without FIRST",
            AccessFlags::ALL_REMOTE,
            Box::new(|_| req(op::SEND_LAST, RQ_PSN, &[1; 4], |_| {})),
        ),
        (
            "SEND MIDDLE with IMM-less LAST_INV out of sequence",
            AccessFlags::ALL_REMOTE,
            Box::new(|_| req(op::SEND_LAST_INV, RQ_PSN, &[1; 4], |_| {})),
        ),
        (
            "WRITE FIRST shorter than MTU",
            AccessFlags::ALL_REMOTE,
            Box::new(|r| req(op::WRITE_FIRST, RQ_PSN, &[1; 512], reth(W_VA, r.w, 2048))),
        ),
        (
            "WRITE ONLY payload differs from RETH length",
            AccessFlags::ALL_REMOTE,
            Box::new(|r| req(op::WRITE_ONLY, RQ_PSN, &[1; 8], reth(W_VA, r.w, 16))),
        ),
        (
            "WRITE ONLY longer than MTU",
            AccessFlags::ALL_REMOTE,
            Box::new(|r| {
                req(
                    op::WRITE_ONLY,
                    RQ_PSN,
                    &[1; MTU + 4],
                    reth(W_VA, r.w, MTU as u32 + 4),
                )
            }),
        ),
        (
            "SEND ONLY longer than MTU",
            AccessFlags::ALL_REMOTE,
            Box::new(|_| req(op::SEND_ONLY, RQ_PSN, &[1; MTU + 4], |_| {})),
        ),
        (
            "SEND FIRST shorter than MTU",
            AccessFlags::ALL_REMOTE,
            Box::new(|_| req(op::SEND_FIRST, RQ_PSN, &[1; 8], |_| {})),
        ),
    ];
    for (name, access, make) in &cases {
        let mut r = rig(*access);
        r.post_recv(4096);
        let p = make(&r);
        let s = expect_nak(&mut r, &p, syndrome::NAK_INVALID_REQ, RQ_PSN);
        assert_eq!(s.naks_sent.invalid_request, 1, "{name}");
    }
}

#[test]
fn mid_message_sequence_and_length_errors() {
    // WRITE FIRST accepted, then a SEND MIDDLE inside the WRITE.
    let mut r = rig(AccessFlags::ALL_REMOTE);
    r.post_recv(4096);
    let first = req(op::WRITE_FIRST, RQ_PSN, &[9; MTU], reth(W_VA, r.w, 3000));
    assert_eq!(
        r.inject(&first),
        vec![(op::ACK, syndrome::ACK_UNLIMITED, RQ_PSN)]
    );
    let bad = req(op::SEND_MIDDLE, RQ_PSN + 1, &[9; MTU], |_| {});
    expect_nak(&mut r, &bad, syndrome::NAK_INVALID_REQ, RQ_PSN + 1);
    // WRITE LAST that overruns the RETH length.
    let mut r = rig(AccessFlags::ALL_REMOTE);
    let first = req(
        op::WRITE_FIRST,
        RQ_PSN,
        &[9; MTU],
        reth(W_VA, r.w, MTU as u32 + 8),
    );
    r.inject(&first);
    let bad = req(op::WRITE_LAST, RQ_PSN + 1, &[9; 12], |_| {});
    expect_nak(&mut r, &bad, syndrome::NAK_INVALID_REQ, RQ_PSN + 1);
    // SEND LAST with no payload.
    let mut r = rig(AccessFlags::ALL_REMOTE);
    r.post_recv(4096);
    r.inject(&req(op::SEND_FIRST, RQ_PSN, &[9; MTU], |_| {}));
    let bad = req(op::SEND_LAST, RQ_PSN + 1, &[], |_| {});
    expect_nak(&mut r, &bad, syndrome::NAK_INVALID_REQ, RQ_PSN + 1);
}

#[test]
fn send_longer_than_receive_buffer() {
    let mut r = rig(AccessFlags::ALL_REMOTE);
    r.post_recv(100);
    let p = req(op::SEND_ONLY, RQ_PSN, &[1; 101], |_| {});
    let s = expect_nak(&mut r, &p, syndrome::NAK_INVALID_REQ, RQ_PSN);
    assert_eq!(s.naks_sent.invalid_request, 1);
    let wc = &r.ep.cq.recv;
    assert_eq!(wc.len(), 1);
    assert_eq!(wc[0].status, WcStatus::LocLenErr);
}

#[test]
fn send_into_bad_receive_buffer_is_remote_op_error() {
    let mut r = rig(AccessFlags::ALL_REMOTE);
    let sg = [sge(r.recv ^ 0x300, RECV_VA, 64)];
    let res = r.ep.with(|qp, io| {
        qp.post_recv(
            &RecvWr {
                wr_id: 4,
                sg_list: &sg,
            },
            io,
        )
    });
    assert!(res.is_ok());
    let p = req(op::SEND_ONLY, RQ_PSN, &[1; 16], |_| {});
    let s = expect_nak(&mut r, &p, syndrome::NAK_REMOTE_OP, RQ_PSN);
    assert_eq!(s.naks_sent.remote_op, 1);
    assert_eq!(r.ep.cq.recv[0].status, WcStatus::LocProtErr);
}

#[test]
fn empty_receive_queue_rnr() {
    let mut r = rig(AccessFlags::ALL_REMOTE);
    for opcode in [op::SEND_ONLY, op::SEND_FIRST] {
        let n = if opcode == op::SEND_ONLY { 16 } else { MTU };
        let before = r.mem();
        let out = r.inject(&req(opcode, RQ_PSN, &vec![1; n], |_| {}));
        assert_eq!(out, vec![(op::ACK, syndrome::RNR | 14, RQ_PSN)]);
        same_memory(&before, &r.ep.mem);
        assert_eq!(r.ep.qp.state(), QpState::Rts);
    }
    let wimm = req(op::WRITE_ONLY_IMM, RQ_PSN, &[1; 8], |o| {
        o.reth = Reth {
            va: W_VA,
            rkey: Rkey(r.w),
            len: 8,
        };
        o.imm = 1;
    });
    let before = r.mem();
    assert_eq!(r.inject(&wimm), vec![(op::ACK, syndrome::RNR | 14, RQ_PSN)]);
    same_memory(&before, &r.ep.mem);
    assert_eq!(r.stats().naks_sent.rnr, 3);
    // The same PSN is accepted once a receive is posted.
    r.post_recv(4096);
    let out = r.inject(&req(op::SEND_ONLY, RQ_PSN, &[5; 16], |_| {}));
    assert_eq!(out, vec![(op::ACK, syndrome::ACK_UNLIMITED, RQ_PSN)]);
    assert_eq!(r.ep.cq.recv.len(), 1);
    assert_eq!(r.ep.cq.recv[0].status, WcStatus::Success);
}

#[test]
fn malformed_packets_are_dropped_and_counted() {
    let mut r = rig(AccessFlags::ALL_REMOTE);
    r.post_recv(4096);
    let good = req(op::WRITE_ONLY, RQ_PSN, &[1; 16], reth(W_VA, r.w, 16));
    let before = r.mem();
    // Truncated: shorter than BTH + ICRC, and shorter than its headers.
    assert!(r.inject(&good[..15]).is_empty());
    assert!(r.inject(&good[..20]).is_empty());
    // Unknown opcodes: reserved RC, UC, RD, CNP.
    for opc in [0x15u8, 0x18, 0x1c, 0x24, 0x40, 0x81, 0xff] {
        let mut b = good.clone();
        b[0] = opc;
        assert!(r.inject(&b).is_empty());
    }
    // Transport version, P_Key, pad count on an opcode without payload.
    let mut b = good.clone();
    b[1] |= 0x01;
    assert!(r.inject(&b).is_empty());
    let mut b = good.clone();
    b[2] = 0x12;
    assert!(r.inject(&b).is_empty());
    let mut b = req(op::READ_REQUEST, RQ_PSN, &[], reth(R_VA, r.r, 8));
    b[1] |= 0x10; // pad on an opcode without payload: the headers no longer fit
    assert!(r.inject(&b).is_empty());
    // Wrong destination QP.
    let mut b = good.clone();
    b[7] ^= 0x40;
    assert!(r.inject(&b).is_empty());
    // A UD packet on an RC QP.
    let mut b = req(op::UD_SEND_ONLY, RQ_PSN, &[1; 16], |_| {});
    b[7] = QPN_B as u8;
    assert!(r.inject(&b).is_empty());
    let s = r.stats();
    assert_eq!(s.drops.truncated, 3);
    assert_eq!(s.drops.bad_opcode, 8);
    assert_eq!(s.drops.bad_header, 2);
    assert_eq!(s.drops.wrong_qpn, 1);
    assert_eq!(s.drops.total(), 14);
    assert_eq!(s.rx_packets, 14);
    assert_eq!(s.tx_packets, 0);
    same_memory(&before, &r.ep.mem);
    assert_eq!(r.ep.qp.state(), QpState::Rts);
    // The QP still works.
    assert_eq!(
        r.inject(&good),
        vec![(op::ACK, syndrome::ACK_UNLIMITED, RQ_PSN)]
    );
}

#[test]
fn psn_gap_naks_once_then_drops() {
    let mut r = rig(AccessFlags::ALL_REMOTE);
    let before = r.mem();
    let ahead = |psn| req(op::WRITE_ONLY, psn, &[1; 16], reth(W_VA, 0, 16));
    let out = r.inject(&ahead(RQ_PSN + 2));
    assert_eq!(out, vec![(op::ACK, syndrome::NAK_PSN_SEQ, RQ_PSN)]);
    assert!(r.inject(&ahead(RQ_PSN + 3)).is_empty());
    assert!(r.inject(&ahead(RQ_PSN + 1)).is_empty());
    let s = r.stats();
    assert_eq!(s.naks_sent.psn_seq, 1);
    assert_eq!(s.drops.psn_out_of_window, 3);
    same_memory(&before, &r.ep.mem);
    assert_eq!(r.ep.qp.state(), QpState::Rts);
    // The expected PSN clears the gap; a new gap NAKs again.
    let ok = req(op::WRITE_ONLY, RQ_PSN, &[2; 16], reth(W_VA, r.w, 16));
    assert_eq!(
        r.inject(&ok),
        vec![(op::ACK, syndrome::ACK_UNLIMITED, RQ_PSN)]
    );
    let out = r.inject(&ahead(RQ_PSN + 5));
    assert_eq!(out, vec![(op::ACK, syndrome::NAK_PSN_SEQ, RQ_PSN + 1)]);
}

#[test]
fn duplicates_are_answered_not_reexecuted() {
    let mut r = rig(AccessFlags::ALL_REMOTE);
    r.post_recv(4096);
    r.post_recv(4096);
    let w = req(op::WRITE_ONLY, RQ_PSN, &[0xaa; 16], reth(W_VA, r.w, 16));
    let s = req(op::SEND_ONLY, RQ_PSN + 1, &[0xbb; 16], |o| {
        o.ack_req = false
    });
    let a = req(op::FETCH_ADD, RQ_PSN + 2, &[], atomic(A_VA, r.a));
    let rd = req(op::READ_REQUEST, RQ_PSN + 3, &[], reth(R_VA, r.r, 3000));
    assert_eq!(r.inject(&w).len(), 1);
    assert!(r.inject(&s).is_empty(), "no AckReq, no ACK");
    let orig = u64::from_ne_bytes(r.ep.mem.bytes(r.a)[..8].try_into().expect("8"));
    let out = r.inject(&a);
    assert_eq!(
        out,
        vec![(op::ATOMIC_ACK, syndrome::ACK_UNLIMITED, RQ_PSN + 2)]
    );
    let out = r.inject(&rd);
    let ops: Vec<u8> = out.iter().map(|x| x.0).collect();
    assert_eq!(
        ops,
        vec![
            op::READ_RESP_FIRST,
            op::READ_RESP_MIDDLE,
            op::READ_RESP_LAST
        ]
    );
    assert_eq!(r.ep.cq.recv.len(), 1);
    // Scribble over the targets, then replay everything.
    r.ep.mem.bytes_mut(r.w)[..16].fill(0);
    let after_add = r.ep.mem.bytes(r.a)[..8].to_vec();
    let before = r.mem();
    let last = RQ_PSN + 5; // READ took 3 PSNs.
    assert_eq!(r.inject(&w), vec![(op::ACK, syndrome::ACK_UNLIMITED, last)]);
    assert_eq!(r.inject(&s), vec![(op::ACK, syndrome::ACK_UNLIMITED, last)]);
    let out = r.inject(&a);
    assert_eq!(
        out,
        vec![(op::ATOMIC_ACK, syndrome::ACK_UNLIMITED, RQ_PSN + 2)]
    );
    // The replayed atomic ACK carries the original value.
    let now = crate::transport::Instant::from_nanos(0);
    r.ep.with(|qp, io| qp.receive(now, &a, gid(1), io));
    let (b, _) = r.ep.tx.out.pop().expect("replay");
    assert_eq!(pkt::parse(&b).expect("ack").atomic_orig, orig);
    // READ replay from its second packet continues the original response,
    // as kernel rxe does: MIDDLE then LAST, no FIRST.
    let rd2 = req(
        op::READ_REQUEST,
        RQ_PSN + 4,
        &[],
        reth(R_VA + 1024, r.r, 1976),
    );
    let out = r.inject(&rd2);
    assert_eq!(
        out,
        vec![
            (op::READ_RESP_MIDDLE, 0, RQ_PSN + 4), // MIDDLE carries no AETH
            (op::READ_RESP_LAST, syndrome::ACK_UNLIMITED, RQ_PSN + 5)
        ]
    );
    // A replay from the READ's first PSN is a new response: FIRST … LAST.
    let out = r.inject(&rd);
    assert_eq!(
        out,
        vec![
            (op::READ_RESP_FIRST, syndrome::ACK_UNLIMITED, RQ_PSN + 3),
            (op::READ_RESP_MIDDLE, 0, RQ_PSN + 4), // MIDDLE carries no AETH
            (op::READ_RESP_LAST, syndrome::ACK_UNLIMITED, RQ_PSN + 5)
        ]
    );
    // A replay asking outside the original range is dropped.
    let rd3 = req(
        op::READ_REQUEST,
        RQ_PSN + 4,
        &[],
        reth(R_VA + 1024, r.r, 4000),
    );
    assert!(r.inject(&rd3).is_empty());
    same_memory(&before, &r.ep.mem);
    assert_eq!(&r.ep.mem.bytes(r.a)[..8], &after_add[..]);
    assert_eq!(r.ep.cq.recv.len(), 1, "the SEND was delivered once");
    let st = r.stats();
    assert_eq!(st.duplicate_requests, 7);
    assert_eq!(st.atomic_replays, 2);
    assert_eq!(st.read_replays, 2);
    assert_eq!(st.drops.no_resource, 1);
}

#[test]
fn state_gates_packets() {
    let mut cfg = QpConfig::rc(Qpn::from_wire(QPN_B), PD);
    cfg.local_gid = gid(2);
    let mut ep = Endpoint::new(Qp::new(cfg).expect("RC QP"), gid(2));
    let w = ep.mem.register(PD, W_VA, 64, AccessFlags::ALL_REMOTE);
    let p = req(op::WRITE_ONLY, 0, &[1; 8], reth(W_VA, w, 8));
    let ack = {
        let mut o = Out {
            opcode: op::ACK,
            dest_qp: Qpn::from_wire(QPN_B),
            ..Out::default()
        };
        o.aeth = pkt::aeth(syndrome::ACK_UNLIMITED, 0);
        let mut b = vec![0u8; pkt::packet_len(op::ACK, 0)];
        pkt::emit(&mut b, &o, 0).expect("fits");
        b
    };
    let now = crate::transport::Instant::from_nanos(0);
    for st in [QpState::Reset, QpState::Init, QpState::Rtr] {
        if st != QpState::Reset {
            let attr = QpAttr {
                qp_state: st,
                qp_access_flags: AccessFlags::ALL_REMOTE,
                rq_psn: Psn::from_wire(0),
                dest_qp_num: Qpn::from_wire(QPN_A),
                ah_attr: AddressVector::new(gid(1)),
                ..QpAttr::default()
            };
            let mask = QpAttrMask::STATE
                | QpAttrMask::ACCESS_FLAGS
                | QpAttrMask::RQ_PSN
                | QpAttrMask::DEST_QPN
                | QpAttrMask::AV;
            assert!(ep.qp.modify(&attr, mask, &mut ep.cq).is_ok());
        }
        ep.with(|qp, io| qp.receive(now, &ack, gid(1), io));
        if st != QpState::Rtr {
            ep.with(|qp, io| qp.receive(now, &p, gid(1), io));
        }
    }
    // RESET, INIT: 2 packets each; RTR: the ACK (no requester yet).
    assert_eq!(ep.qp.stats().drops.bad_state, 5);
    assert!(ep.mem.bytes(w).iter().all(|&b| b == 0));
    // RTR serves requests.
    ep.with(|qp, io| qp.receive(now, &p, gid(1), io));
    assert_eq!(&ep.mem.bytes(w)[..8], &[1; 8]);
    assert_eq!(ep.tx.out.len(), 1);
}

#[test]
fn send_into_partly_bad_scatter_list_touches_nothing() {
    let mut r = rig(AccessFlags::ALL_REMOTE);
    let sg = [
        sge(r.recv, RECV_VA, 8),
        sge(r.recv ^ 0x300, RECV_VA + 8, 64),
    ];
    let res = r.ep.with(|qp, io| {
        qp.post_recv(
            &RecvWr {
                wr_id: 4,
                sg_list: &sg,
            },
            io,
        )
    });
    assert!(res.is_ok());
    let p = req(op::SEND_ONLY, RQ_PSN, &[1; 16], |_| {});
    let s = expect_nak(&mut r, &p, syndrome::NAK_REMOTE_OP, RQ_PSN);
    assert_eq!(s.naks_sent.remote_op, 1);
    assert_eq!(r.ep.cq.recv[0].status, WcStatus::LocProtErr);
}

/// A third host that learns the QPN and PSN cannot inject into a connected RC
/// QP: a valid SEND, WRITE or READ from a GID other than the peer's is dropped
/// (counted as `wrong_source`) with no response, no completion, no memory
/// change and no PSN movement; the peer's own packet at that PSN then works.
#[test]
fn packets_from_a_third_host_are_dropped() {
    let mut r = rig(AccessFlags::ALL_REMOTE);
    r.post_recv(4096);
    let intruder = gid(3);
    let before = r.mem();
    let send = req(op::SEND_ONLY, RQ_PSN, &[9; 16], |_| {});
    let write = req(op::WRITE_ONLY, RQ_PSN, &[9; 8], reth(W_VA, r.w, 8));
    let read = req(op::READ_REQUEST, RQ_PSN, &[], reth(R_VA, r.r, 64));
    for p in [&send, &write, &read] {
        assert_eq!(r.inject_from(intruder, p), 0, "no response to an intruder");
    }
    // An IPv6 GID, and the peer's address behind another prefix, are others too.
    let v6 = Gid::from_ipv6("fe80::1".parse().expect("ip"));
    assert_eq!(r.inject_from(v6, &send), 0);
    assert_eq!(r.stats().drops.wrong_source, 4);
    assert_eq!(r.stats().drops.total(), 4);
    assert!(r.ep.cq.recv.is_empty());
    same_memory(&before, &r.ep.mem);
    assert_eq!(r.ep.qp.state(), QpState::Rts);
    // The real peer's SEND at the same PSN is accepted: the PSN did not move.
    let out = r.inject(&req(op::SEND_ONLY, RQ_PSN, &[5; 16], |_| {}));
    assert_eq!(out, vec![(op::ACK, syndrome::ACK_UNLIMITED, RQ_PSN)]);
    assert_eq!(r.ep.cq.recv.len(), 1);
    assert_eq!(r.ep.cq.recv[0].status, WcStatus::Success);
}

/// One SEND_ONLY_WITH_INVALIDATE of `rkey` into a posted receive; what B
/// emitted, with memory compared before and after (only the receive
/// buffer may change).
fn send_inv(r: &mut Rig, rkey: u32) -> Vec<(u8, u8, u32)> {
    r.post_recv(64);
    let before = r.mem();
    let p = req(op::SEND_ONLY_INV, RQ_PSN, b"invalidate?", |o| o.ieth = rkey);
    let out = r.inject(&p);
    for (x, y) in before.regions.iter().zip(&r.ep.mem.regions) {
        if x.key != r.recv {
            assert!(x.data == y.data, "region {:#x} changed", x.key);
        }
        assert_eq!(x.valid, y.valid, "region {:#x} validity changed", x.key);
    }
    out
}

/// Issue 15 bug 2: a peer names the R_Key of a plain `reg_mr` registration
/// in a SEND_WITH_INVALIDATE. As kernel rxe (rxe_invalidate_mr refuses
/// anything but IB_MR_TYPE_MEM_REG; the responder's
/// RESPST_ERR_INVALIDATE_RKEY, class J): the receive completes with
/// REM_INV_REQ_ERR, the packet is acknowledged with a plain ACK, the QP
/// moves to ERR, and the registration keeps working.
#[test]
fn remote_invalidate_of_a_plain_registration_is_refused() {
    let mut r = rig(AccessFlags::ALL_REMOTE);
    let w = r.w;
    let out = send_inv(&mut r, w);
    assert_eq!(out, vec![(op::ACK, syndrome::ACK_UNLIMITED, RQ_PSN)]);
    assert_eq!(r.ep.qp.state(), QpState::Err);
    let wc = &r.ep.cq.recv;
    assert_eq!(wc.len(), 1, "{wc:?}");
    assert_eq!(wc[0].status, WcStatus::RemInvReqErr);
    assert_eq!(wc[0].invalidated_rkey, None);
    assert_eq!(r.stats().invalidate_refused, 1);
    // The key still reaches its region.
    let reg =
        r.ep.mem
            .region(w)
            .expect("the plain registration is still live");
    assert_eq!(reg.key, w);
}

/// Picks a key from a rig.
type KeyOf = fn(&Rig) -> u32;

/// The same with the receive buffer's own key, an unknown key, a stale key
/// byte and a key of another PD: refused alike, nothing invalidated.
#[test]
fn remote_invalidate_refusals_leave_every_key_alive() {
    let cases: [(&str, KeyOf); 4] = [
        ("the receive buffer's own region", |r| r.recv),
        ("an unknown index", |r| r.w + 0x10_0000),
        ("a stale key byte", |r| r.w ^ 1),
        ("a region of another PD", |r| r.foreign),
    ];
    for (name, key) in cases {
        let mut r = rig(AccessFlags::ALL_REMOTE);
        let k = key(&r);
        let out = send_inv(&mut r, k);
        assert_eq!(
            out,
            vec![(op::ACK, syndrome::ACK_UNLIMITED, RQ_PSN)],
            "{name}"
        );
        assert_eq!(r.ep.cq.recv[0].status, WcStatus::RemInvReqErr, "{name}");
        assert_eq!(r.ep.qp.state(), QpState::Err, "{name}");
        assert_eq!(r.stats().invalidate_refused, 1, "{name}");
        assert!(r.ep.mem.regions.iter().all(|g| g.valid), "{name}");
    }
}

/// A key a peer may invalidate (a fast-registration MR) is ended, and only it.
#[test]
fn remote_invalidate_of_an_invalidatable_key_succeeds() {
    let mut r = rig(AccessFlags::ALL_REMOTE);
    let w = r.w;
    r.ep.mem.allow_remote_invalidate(w);
    r.post_recv(64);
    let p = req(op::SEND_ONLY_INV, RQ_PSN, b"invalidate!", |o| o.ieth = w);
    let out = r.inject(&p);
    assert_eq!(out, vec![(op::ACK, syndrome::ACK_UNLIMITED, RQ_PSN)]);
    assert_eq!(r.ep.qp.state(), QpState::Rts);
    let wc = &r.ep.cq.recv;
    assert_eq!(wc[0].status, WcStatus::Success);
    assert_eq!(wc[0].invalidated_rkey, Some(Rkey(w)));
    assert!(r.ep.mem.region(w).is_none());
    let live = r.ep.mem.regions.iter().filter(|g| g.valid).count();
    assert_eq!(live, r.ep.mem.regions.len() - 1);
}
