//! Loss-free end-to-end behaviour: every operation, every size edge, every
//! MTU, PSN wrap, scatter/gather, inline, UD.

use rnic_core::{
    Mtu, QpType, Qpn, Rkey, SendFlags, SendOp, UdDest, WcFlags, WcOpcode, WcStatus, WorkCompletion,
};

use super::*;
use crate::transport::GRH_LEN;
use crate::transport::sim::{Endpoint, Sim};

const MIB: usize = 1 << 20;

struct Keys {
    src: u32,
    dst: u32,
}

fn regions(sim: &mut Sim, len: usize) -> [Keys; 2] {
    let mut out = Vec::new();
    for ep in sim.ep.iter_mut() {
        let src = ep
            .mem
            .register(PD, 0x1000_0000, len, AccessFlags::ALL_REMOTE);
        let dst = ep
            .mem
            .register(PD, 0x2000_0000, len, AccessFlags::ALL_REMOTE);
        out.push(Keys { src, dst });
    }
    let b = out.pop().expect("b");
    let a = out.pop().expect("a");
    [a, b]
}

fn run_idle(sim: &mut Sim) {
    sim.run(50_000_000);
    assert!(sim.next_event().is_none(), "simulation did not go idle");
}

fn one_send_wc(sim: &Sim, side: usize) -> WorkCompletion {
    let l = &sim.ep[side].cq.send;
    assert_eq!(l.len(), 1, "{l:?}");
    l[0]
}

/// SEND, WRITE and READ of 0, 1, MTU−1, MTU, MTU+1 and 1 MiB bytes at every
/// MTU, starting two PSNs before the wrap so multi-packet messages cross
/// 0xFFFFFF → 0.
#[test]
fn sizes_and_mtus_with_psn_wrap() {
    for mtu in Mtu::ALL {
        let m = mtu.bytes() as usize;
        for len in [0, 1, m - 1, m, m + 1, MIB] {
            for kind in 0..3 {
                let c = Conn {
                    mtu,
                    psn_a: 0xff_fffe,
                    psn_b: 0xff_fffd,
                    ..Conn::default()
                };
                let mut sim = rc_pair(&c, 7);
                let [ka, kb] = regions(&mut sim, MIB + 64);
                fill(&mut sim.ep[0].mem.bytes_mut(ka.src)[..len], len as u64);
                fill(&mut sim.ep[1].mem.bytes_mut(kb.src)[..len], !(len as u64));
                let sg = [sge(ka.src, 0x1000_0000, len as u32)];
                let (op, signal) = match kind {
                    0 => (SendOp::Send, SendFlags::SIGNALED),
                    1 => (
                        SendOp::RdmaWrite {
                            remote_addr: 0x2000_0000,
                            rkey: Rkey(kb.dst),
                        },
                        SendFlags::SIGNALED,
                    ),
                    _ => (
                        SendOp::RdmaRead {
                            remote_addr: 0x1000_0000,
                            rkey: Rkey(kb.src),
                        },
                        SendFlags::SIGNALED,
                    ),
                };
                let sg_read = [sge(ka.dst, 0x2000_0000, len as u32)];
                if kind == 0 {
                    let rsg = [sge(kb.dst, 0x2000_0000, (MIB + 64) as u32)];
                    post_recv(
                        &mut sim,
                        1,
                        &RecvWr {
                            wr_id: 77,
                            sg_list: &rsg,
                        },
                    );
                }
                let wr = SendWr {
                    ud: None,
                    wr_id: 9,
                    sg_list: if kind == 2 { &sg_read } else { &sg },
                    op,
                    flags: signal,
                };
                post_send(&mut sim, 0, &wr);
                run_idle(&mut sim);
                let wc = one_send_wc(&sim, 0);
                assert_eq!(
                    (wc.wr_id, wc.status),
                    (9, WcStatus::Success),
                    "mtu {m} len {len} kind {kind}"
                );
                match kind {
                    0 => {
                        let r = &sim.ep[1].cq.recv;
                        assert_eq!(r.len(), 1);
                        assert_eq!((r[0].wr_id, r[0].byte_len), (77, len as u32));
                        assert_eq!(r[0].opcode, WcOpcode::Recv);
                        assert_eq!(
                            &sim.ep[1].mem.bytes(kb.dst)[..len],
                            &sim.ep[0].mem.bytes(ka.src)[..len]
                        );
                    }
                    1 => assert_eq!(
                        &sim.ep[1].mem.bytes(kb.dst)[..len],
                        &sim.ep[0].mem.bytes(ka.src)[..len]
                    ),
                    _ => assert_eq!(
                        &sim.ep[0].mem.bytes(ka.dst)[..len],
                        &sim.ep[1].mem.bytes(kb.src)[..len]
                    ),
                }
                // Nothing beyond the message was touched.
                let tail_dst = if kind == 2 {
                    &sim.ep[0].mem.bytes(ka.dst)[len..]
                } else {
                    &sim.ep[1].mem.bytes(kb.dst)[len..]
                };
                assert!(tail_dst.iter().all(|&b| b == 0));
                let s = sim.ep[0].qp.stats();
                assert_eq!(s.retransmits, 0);
                assert_eq!(s.drops.total(), 0);
                assert_eq!(sim.ep[1].qp.stats().drops.total(), 0);
            }
        }
    }
}

/// Both atomics, immediate data, invalidate, scatter/gather and inline data.
#[test]
fn atomics_imm_inv_sgl_inline() {
    let mut sim = rc_pair(&Conn::default(), 1);
    let [ka, kb] = regions(&mut sim, 64 * 1024);
    // Counter at B dst+0 = 40.
    sim.ep[1].mem.bytes_mut(kb.dst)[..8].copy_from_slice(&40u64.to_ne_bytes());
    let res = [sge(ka.dst, 0x2000_0000, 8)];
    let res2 = [sge(ka.dst, 0x2000_0008, 8)];
    post_send(
        &mut sim,
        0,
        &SendWr {
            ud: None,
            wr_id: 1,
            sg_list: &res,
            op: SendOp::AtomicFetchAdd {
                remote_addr: 0x2000_0000,
                rkey: Rkey(kb.dst),
                add: 2,
            },
            flags: SendFlags::SIGNALED,
        },
    );
    post_send(
        &mut sim,
        0,
        &SendWr {
            ud: None,
            wr_id: 2,
            sg_list: &res2,
            op: SendOp::AtomicCmpSwap {
                remote_addr: 0x2000_0000,
                rkey: Rkey(kb.dst),
                compare: 42,
                swap: 1000,
            },
            flags: SendFlags::SIGNALED,
        },
    );
    // Scatter/gather SEND with immediate: three source pieces into two sinks.
    fill(&mut sim.ep[0].mem.bytes_mut(ka.src)[..3000], 5);
    let gather = [
        sge(ka.src, 0x1000_0000, 1000),
        sge(ka.src, 0x1000_0000 + 1000, 1),
        sge(ka.src, 0x1000_0000 + 1001, 1999),
    ];
    let scatter = [
        sge(kb.src, 0x1000_0000 + 100, 1500),
        sge(kb.src, 0x1000_0000 + 5000, 1500),
    ];
    post_recv(
        &mut sim,
        1,
        &RecvWr {
            wr_id: 50,
            sg_list: &scatter,
        },
    );
    post_send(
        &mut sim,
        0,
        &SendWr {
            ud: None,
            wr_id: 3,
            sg_list: &gather,
            op: SendOp::SendWithImm { imm: 0xabcd_0123 },
            flags: SendFlags::SIGNALED.union(SendFlags::SOLICITED),
        },
    );
    // Inline WRITE with immediate; the source is overwritten right after posting.
    let inl = [sge(ka.src, 0x1000_0000 + 8000, 200)];
    fill(&mut sim.ep[0].mem.bytes_mut(ka.src)[8000..8200], 6);
    let expect: Vec<u8> = sim.ep[0].mem.bytes(ka.src)[8000..8200].to_vec();
    let recv_imm = [sge(kb.src, 0x1000_0000 + 9000, 16)];
    post_recv(
        &mut sim,
        1,
        &RecvWr {
            wr_id: 51,
            sg_list: &recv_imm,
        },
    );
    let r = sim.ep[0].with(|qp, io| {
        qp.post_send(
            &SendWr {
                ud: None,
                wr_id: 4,
                sg_list: &inl,
                op: SendOp::RdmaWriteWithImm {
                    remote_addr: 0x2000_0000 + 100,
                    rkey: Rkey(kb.dst),
                    imm: 7,
                },
                flags: SendFlags::SIGNALED.union(SendFlags::INLINE),
            },
            io,
        )
    });
    assert!(r.is_ok());
    sim.ep[0].mem.bytes_mut(ka.src)[8000..8200].fill(0);
    sim.kick(0);
    // SEND with invalidate of B's src key, which stands for a
    // fast-registration MR here: only such a key may be ended by a peer.
    sim.ep[1].mem.allow_remote_invalidate(kb.src);
    let recv_inv = [sge(kb.dst, 0x2000_0000 + 4096, 16)];
    post_recv(
        &mut sim,
        1,
        &RecvWr {
            wr_id: 52,
            sg_list: &recv_inv,
        },
    );
    post_send(
        &mut sim,
        0,
        &SendWr {
            ud: None,
            wr_id: 5,
            sg_list: &[],
            op: SendOp::SendWithInv { rkey: Rkey(kb.src) },
            flags: SendFlags::SIGNALED,
        },
    );
    run_idle(&mut sim);
    let s: Vec<_> = sim.ep[0]
        .cq
        .send
        .iter()
        .map(|w| (w.wr_id, w.status, w.opcode))
        .collect();
    assert_eq!(
        s,
        vec![
            (1, WcStatus::Success, WcOpcode::FetchAdd),
            (2, WcStatus::Success, WcOpcode::CompSwap),
            (3, WcStatus::Success, WcOpcode::Send),
            (4, WcStatus::Success, WcOpcode::RdmaWrite),
            (5, WcStatus::Success, WcOpcode::Send),
        ]
    );
    let a = sim.ep[0].mem.bytes(ka.dst);
    assert_eq!(u64::from_ne_bytes(a[..8].try_into().expect("8")), 40);
    assert_eq!(u64::from_ne_bytes(a[8..16].try_into().expect("8")), 42);
    let b = sim.ep[1].mem.bytes(kb.dst);
    assert_eq!(u64::from_ne_bytes(b[..8].try_into().expect("8")), 1000);
    assert_eq!(&b[100..300], &expect[..]);
    let r = &sim.ep[1].cq.recv;
    assert_eq!(r.len(), 3);
    assert_eq!(
        (r[0].wr_id, r[0].byte_len, r[0].imm_data),
        (50, 3000, Some(0xabcd_0123))
    );
    assert_eq!(
        (r[1].wr_id, r[1].opcode, r[1].byte_len, r[1].imm_data),
        (51, WcOpcode::RecvRdmaWithImm, 200, Some(7))
    );
    assert_eq!(
        (r[2].wr_id, r[2].invalidated_rkey),
        (52, Some(Rkey(kb.src)))
    );
    // The scatter landed in two pieces (read before invalidation took the key).
    let src_a: Vec<u8> = sim.ep[0].mem.bytes(ka.src)[..3000].to_vec();
    let reg = &sim.ep[1].mem.regions[(kb.src >> 8) as usize - 1];
    assert!(!reg.valid);
    assert_eq!(&reg.data[100..1600], &src_a[..1500]);
    assert_eq!(&reg.data[5000..6500], &src_a[1500..3000]);
}

/// UD: DETH with Q_Key and source QPN, GRH area, Q_Key mismatch dropped,
/// no receive posted dropped, oversize send fails locally.
#[test]
fn ud_send_recv() {
    let mk = |qpn: u32, last: u8| {
        let mut cfg = QpConfig::ud(Qpn::from_wire(qpn), PD);
        cfg.local_gid = gid(last);
        let mut ep = Endpoint::new(Qp::new(cfg).expect("UD QP"), gid(last));
        for st in [QpState::Init, QpState::Rtr, QpState::Rts] {
            let attr = QpAttr {
                qp_state: st,
                qkey: 0x1111,
                path_mtu: Mtu::Mtu1024,
                ..QpAttr::default()
            };
            let mask = QpAttrMask::STATE | QpAttrMask::QKEY | QpAttrMask::PATH_MTU;
            assert!(ep.qp.modify(&attr, mask, &mut ep.cq).is_ok());
        }
        ep
    };
    let mut sim = Sim::new(mk(0x31, 1), mk(0x32, 2), 3);
    assert_eq!(sim.ep[0].qp.stats().tx_packets, 0);
    let ka = sim.ep[0]
        .mem
        .register(PD, 0x1000, 4096, AccessFlags::ALL_REMOTE);
    let kb = sim.ep[1]
        .mem
        .register(PD, 0x1000, 4096, AccessFlags::ALL_REMOTE);
    fill(&mut sim.ep[0].mem.bytes_mut(ka)[..1024], 1);
    let dest = |qkey| UdDest {
        av: AddressVector::new(gid(2)),
        remote_qpn: Qpn::from_wire(0x32),
        remote_qkey: qkey,
    };
    let rsg = [sge(kb, 0x1000, 2048)];
    post_recv(
        &mut sim,
        1,
        &RecvWr {
            wr_id: 1,
            sg_list: &rsg,
        },
    );
    let sg = [sge(ka, 0x1000, 1024)];
    for (id, qkey, imm) in [
        (10, 0x1111, Some(5)),
        (11, 0x2222, None),
        (12, 0x8000_0000, None),
    ] {
        post_send(
            &mut sim,
            0,
            &SendWr {
                ud: Some(dest(qkey)),
                wr_id: id,
                sg_list: &sg,
                op: match imm {
                    Some(imm) => SendOp::SendWithImm { imm },
                    None => SendOp::Send,
                },
                flags: SendFlags::SIGNALED,
            },
        );
    }
    let big = [sge(ka, 0x1000, 1025)];
    post_send(
        &mut sim,
        0,
        &SendWr {
            ud: Some(dest(0x1111)),
            wr_id: 13,
            sg_list: &big,
            op: SendOp::Send,
            flags: SendFlags::SIGNALED,
        },
    );
    sim.run(1000);
    let s: Vec<_> = sim.ep[0]
        .cq
        .send
        .iter()
        .map(|w| (w.wr_id, w.status))
        .collect();
    assert_eq!(
        s,
        vec![
            (10, WcStatus::Success),
            (11, WcStatus::Success),
            (12, WcStatus::Success),
            (13, WcStatus::LocLenErr)
        ]
    );
    assert_eq!(sim.ep[0].qp.state(), QpState::Err);
    let r = &sim.ep[1].cq.recv;
    assert_eq!(r.len(), 1);
    assert_eq!(
        (
            r[0].wr_id,
            r[0].byte_len,
            r[0].src_qp,
            r[0].imm_data,
            r[0].wc_flags
        ),
        (
            1,
            1024 + GRH_LEN as u32,
            Qpn::from_wire(0x31),
            Some(5),
            WcFlags::GRH | WcFlags::WITH_IMM
        )
    );
    let b = sim.ep[1].mem.bytes(kb);
    assert_eq!(&b[8..24], gid(1).raw());
    assert_eq!(
        &b[GRH_LEN..GRH_LEN + 1024],
        &sim.ep[0].mem.bytes(ka)[..1024]
    );
    let st = sim.ep[1].qp.stats();
    assert_eq!(st.drops.qkey_mismatch, 1);
    assert_eq!(st.drops.no_receive, 1);
    assert_eq!(sim.ep[0].qp.stats().tx_packets, 3);
    let _ = QpType::Ud;
}

/// A QP that sent, and is then reset and brought up again, sends again:
/// RESET empties both queues back to index 0, where the fresh requester
/// looks for its next WQE. (RESET used to leave an emptied queue starting
/// at the old tail while the requester looked at index 0: nothing posted
/// after a RESET was ever sent.)
#[test]
fn a_qp_reset_after_sending_sends_again() {
    let c = Conn::default();
    let mut sim = rc_pair(&c, 5);
    let [ka, kb] = regions(&mut sim, 4096);
    fill(&mut sim.ep[0].mem.bytes_mut(ka.src)[..256], 3);
    let sg = [sge(ka.src, 0x1000_0000, 256)];
    let write = |wr_id, remote_addr| SendWr {
        ud: None,
        wr_id,
        sg_list: &sg,
        op: SendOp::RdmaWrite {
            remote_addr,
            rkey: Rkey(kb.dst),
        },
        flags: SendFlags::SIGNALED,
    };
    for i in 0..3 {
        post_send(&mut sim, 0, &write(i, 0x2000_0000));
    }
    run_idle(&mut sim);
    assert_eq!(sim.ep[0].cq.send.len(), 3);
    let reset = QpAttr {
        qp_state: QpState::Reset,
        ..QpAttr::default()
    };
    for ep in sim.ep.iter_mut() {
        let r = ep.qp.modify(&reset, QpAttrMask::STATE, &mut ep.cq);
        assert!(r.is_ok(), "{r:?}");
        assert_eq!((ep.qp.send_outstanding(), ep.qp.recv_outstanding()), (0, 0));
    }
    let again = Conn {
        psn_a: 700,
        psn_b: 900,
        ..c
    };
    let (a, b) = (again.psn_a, again.psn_b);
    connect(&mut sim.ep[0], QPN_B, gid(2), a, b, &again);
    connect(&mut sim.ep[1], QPN_A, gid(1), b, a, &again);
    post_send(&mut sim, 0, &write(9, 0x2000_0800));
    run_idle(&mut sim);
    let wcs = &sim.ep[0].cq.send;
    assert_eq!(wcs.len(), 4, "the WRITE after the RESET completed: {wcs:?}");
    assert_eq!((wcs[3].wr_id, wcs[3].status), (9, WcStatus::Success));
    assert_eq!(
        &sim.ep[1].mem.bytes(kb.dst)[0x800..0x900],
        &sim.ep[0].mem.bytes(ka.src)[..256]
    );
}
