//! Transport tests: end-to-end over the simulation, negative responder
//! tests with hand-built packets, retry exhaustion, and the fault-injected
//! mixed workload.

mod basic;
mod errors;
mod hostile_read;
mod negative;
mod read_replay;
mod workload;

use rnic_core::{
    AccessFlags, AddressVector, Gid, Lkey, Mtu, PdHandle, Psn, QpAttr, QpAttrMask, QpState, Qpn,
    RecvWr, SendWr, Sge,
};

use super::sim::{Endpoint, Sim};
use super::{Qp, QpConfig};

pub(super) const QPN_A: u32 = 0x11;
pub(super) const QPN_B: u32 = 0x22;
pub(super) const PD: PdHandle = PdHandle(1);

/// How a test pair is connected.
#[derive(Clone, Copy, Debug)]
pub(super) struct Conn {
    pub mtu: Mtu,
    pub psn_a: u32,
    pub psn_b: u32,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub min_rnr_timer: u8,
    pub max_rd_atomic: u8,
    pub access: AccessFlags,
    pub depth: u32,
}

impl Default for Conn {
    fn default() -> Conn {
        Conn {
            mtu: Mtu::Mtu1024,
            psn_a: 100,
            psn_b: 5000,
            timeout: 8,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
            max_rd_atomic: 4,
            access: AccessFlags::all(),
            depth: 64,
        }
    }
}

pub(super) fn gid(last: u8) -> Gid {
    Gid::from_ipv4(std::net::Ipv4Addr::new(10, 0, 0, last))
}

/// Bring `qp` to RTS against `peer` with `c`.
pub(super) fn connect(ep: &mut Endpoint, peer: u32, peer_gid: Gid, sq: u32, rq: u32, c: &Conn) {
    let mut av = AddressVector::new(peer_gid);
    av.udp_sport = Some(0xc000);
    let init = QpAttr {
        qp_state: QpState::Init,
        qp_access_flags: c.access,
        ..QpAttr::default()
    };
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        path_mtu: c.mtu,
        dest_qp_num: Qpn::from_wire(peer),
        rq_psn: Psn::from_wire(rq),
        max_dest_rd_atomic: 16,
        min_rnr_timer: c.min_rnr_timer,
        ah_attr: av,
        ..QpAttr::default()
    };
    let rts = QpAttr {
        qp_state: QpState::Rts,
        sq_psn: Psn::from_wire(sq),
        timeout: c.timeout,
        retry_cnt: c.retry_cnt,
        rnr_retry: c.rnr_retry,
        max_rd_atomic: c.max_rd_atomic,
        ..QpAttr::default()
    };
    let m = QpAttrMask::STATE;
    let steps = [
        (init, m | QpAttrMask::ACCESS_FLAGS),
        (
            rtr,
            m | QpAttrMask::PATH_MTU
                | QpAttrMask::DEST_QPN
                | QpAttrMask::RQ_PSN
                | QpAttrMask::MAX_DEST_RD_ATOMIC
                | QpAttrMask::MIN_RNR_TIMER
                | QpAttrMask::AV,
        ),
        (
            rts,
            m | QpAttrMask::SQ_PSN
                | QpAttrMask::TIMEOUT
                | QpAttrMask::RETRY_CNT
                | QpAttrMask::RNR_RETRY
                | QpAttrMask::MAX_QP_RD_ATOMIC,
        ),
    ];
    for (attr, mask) in &steps {
        let r = ep.qp.modify(attr, *mask, &mut ep.cq);
        assert!(r.is_ok(), "{r:?}");
    }
}

/// Two connected RC endpoints (no regions yet).
pub(super) fn rc_pair(c: &Conn, seed: u64) -> Sim {
    let mk = |qpn: u32, g: Gid| {
        let mut cfg = QpConfig::rc(Qpn::from_wire(qpn), PD);
        cfg.sq_depth = c.depth;
        cfg.rq_depth = c.depth;
        cfg.local_gid = g;
        Endpoint::new(Qp::new(cfg).expect("RC QP"), g)
    };
    let mut a = mk(QPN_A, gid(1));
    let mut b = mk(QPN_B, gid(2));
    connect(&mut a, QPN_B, gid(2), c.psn_a, c.psn_b, c);
    connect(&mut b, QPN_A, gid(1), c.psn_b, c.psn_a, c);
    Sim::new(a, b, seed)
}

/// One SGE over a whole-region slice.
pub(super) fn sge(key: u32, addr: u64, len: u32) -> Sge {
    Sge {
        addr,
        length: len,
        lkey: Lkey(key),
    }
}

/// A deterministic byte pattern for (tag, offset).
pub(super) fn pattern(tag: u64, off: usize) -> u8 {
    let x = tag
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .wrapping_add(off as u64 * 0x1000_0000_01b3);
    (x >> 29) as u8 ^ (off as u8).wrapping_mul(31)
}

pub(super) fn fill(buf: &mut [u8], tag: u64) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = pattern(tag, i);
    }
}

pub(super) fn post_send(sim: &mut Sim, side: usize, wr: &SendWr<'_, rnic_core::UdDest>) {
    let r = sim.ep[side].with(|qp, io| qp.post_send(wr, io));
    assert!(r.is_ok(), "post_send: {r:?}");
    sim.kick(side);
}

pub(super) fn post_recv(sim: &mut Sim, side: usize, wr: &RecvWr<'_>) {
    let r = sim.ep[side].with(|qp, io| qp.post_recv(wr, io));
    assert!(r.is_ok(), "post_recv: {r:?}");
}

/// A response packet from B (QPN_B) to A (QPN_A): `opcode` at `psn` with
/// AETH syndrome `syn` (left out by `pkt::emit` where the opcode has no
/// AETH) and `payload`.
pub(super) fn response(opcode: u8, psn: u32, syn: u8, payload: &[u8]) -> Vec<u8> {
    let mut o = crate::transport::pkt::Out {
        opcode,
        dest_qp: Qpn::from_wire(QPN_A),
        psn: rnic_core::Psn::from_wire(psn),
        ..crate::transport::pkt::Out::default()
    };
    o.aeth = crate::transport::pkt::aeth(syn, 1);
    let mut b = vec![0u8; crate::transport::pkt::packet_len(opcode, payload.len())];
    let at = crate::transport::pkt::emit(&mut b, &o, payload.len()).expect("fits");
    b[at..at + payload.len()].copy_from_slice(payload);
    b
}

/// Requests `ep` emitted since the last call: (opcode, PSN, RETH va, RETH len).
pub(super) fn requests(ep: &mut Endpoint) -> Vec<(u8, u32, u64, u32)> {
    std::mem::take(&mut ep.tx.out)
        .iter()
        .map(|(b, _)| {
            let p = crate::transport::pkt::parse(b).expect("the QP emits valid packets");
            (p.opcode, p.psn.get(), p.reth.va, p.reth.len)
        })
        .collect()
}
