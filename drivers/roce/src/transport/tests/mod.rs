//! Transport tests: end-to-end over the simulation, negative responder
//! tests with hand-built packets, retry exhaustion, and the fault-injected
//! mixed workload.

mod basic;
mod errors;
mod negative;
mod workload;

use rnic_core::{Gid, Lkey, Mtu, Psn, Qpn};

use super::sim::{Endpoint, Sim};
use super::{AccessFlags, PdId, Qp, QpAttr, QpConfig, QpState, RecvWr, SendWr, Sge};
use crate::transport::Path;

pub(super) const QPN_A: u32 = 0x11;
pub(super) const QPN_B: u32 = 0x22;
pub(super) const PD: PdId = PdId(1);

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
            access: AccessFlags::ALL,
            depth: 64,
        }
    }
}

pub(super) fn gid(last: u8) -> Gid {
    Gid::from_ipv4(std::net::Ipv4Addr::new(10, 0, 0, last))
}

/// Bring `qp` to RTS against `peer` with `c`.
pub(super) fn connect(ep: &mut Endpoint, peer: u32, peer_gid: Gid, sq: u32, rq: u32, c: &Conn) {
    let steps = [
        QpAttr {
            state: Some(QpState::Init),
            access: Some(c.access),
            ..QpAttr::default()
        },
        QpAttr {
            state: Some(QpState::Rtr),
            path_mtu: Some(c.mtu),
            dest_qp_num: Some(Qpn::from_wire(peer)),
            rq_psn: Some(Psn::from_wire(rq)),
            max_dest_rd_atomic: Some(16),
            min_rnr_timer: Some(c.min_rnr_timer),
            path: Some(Path {
                dgid: peer_gid,
                udp_sport: 0xc000,
                hop_limit: 64,
                traffic_class: 0,
            }),
            ..QpAttr::default()
        },
        QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(Psn::from_wire(sq)),
            timeout: Some(c.timeout),
            retry_cnt: Some(c.retry_cnt),
            rnr_retry: Some(c.rnr_retry),
            max_rd_atomic: Some(c.max_rd_atomic),
            ..QpAttr::default()
        },
    ];
    for s in &steps {
        let r = ep.qp.modify(s, &mut ep.cq);
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
        Endpoint::new(Qp::new(cfg), g)
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

pub(super) fn post_send(sim: &mut Sim, side: usize, wr: &SendWr<'_>) {
    let r = sim.ep[side].with(|qp, io| qp.post_send(wr, io));
    assert!(r.is_ok(), "post_send: {r:?}");
    sim.kick(side);
}

pub(super) fn post_recv(sim: &mut Sim, side: usize, wr: &RecvWr<'_>) {
    let r = sim.ep[side].with(|qp, io| qp.post_recv(wr, io));
    assert!(r.is_ok(), "post_recv: {r:?}");
}
