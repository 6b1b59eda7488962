//! The data-path checks and hooks of issue 26 (audit rows 2, 3, 6, 8, 11, 12, 13, 20, 21, 61),
//! strict and, where a check has a switch, legacy: hand-built WQEs and receive lists through
//! the rig of `tests/common/hw.rs`, an rnic-rxe peer where a message must arrive.
#![allow(clippy::unwrap_used)]

mod common;

use common::hw::*;
use common::{Reply, Tweak};
use rnic_mlx5_emu::firmware::exec::TERMINATE_SCATTER_KEY;
use rnic_mlx5_prm::{HealthSyndrome, NicState, health_buffer, init_seg_offset};

fn param(s: u32) -> (u8, u32) {
    (CmdStatus::BadParam.as_raw(), s)
}

fn wait_for(what: &str, hw: &Hw, mut done: impl FnMut(&rnic_mlx5_emu::HcaStats) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = hw.r.fw().hca_stats();
        if done(&s) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: {s:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A UD QP of `hw` on `cq`, with (`mtu`, `log_msg_max`) written in every modify's context,
/// taken to RTS; `None` when a modify was refused, with its (status, syndrome).
fn ud_qp(hw: &mut Hw, cq: &Cq, mtu: u32, lmm: u32) -> Result<EmuQp, (u8, u32)> {
    let qp = EmuQp::create(hw, cq, QpServiceType::Ud);
    let set = |q: &mut rnic_mlx5_prm::Qpc<&mut [u8]>| {
        q.set_mtu(mtu).unwrap();
        q.set_log_msg_max(lmm).unwrap();
    };
    for op in [
        CmdOpcode::Rst2InitQp,
        CmdOpcode::Init2RtrQp,
        CmdOpcode::Rtr2RtsQp,
    ] {
        let s = qp.modify(hw, op, |q| {
            set(q);
            q.set_q_key(0x1111).unwrap();
        });
        if s != (0, 0) {
            return Err(s);
        }
    }
    Ok(qp)
}

/// A UD send of `len` bytes from `lkey`/`VA` to `peer` (nobody listens: UD does not care).
fn ud_send(hw: &Hw, qp: &mut EmuQp, peer: IpAddr, lkey: u32, len: u32) -> u16 {
    let mut av = [0u8; 48];
    {
        let mut v = rnic_mlx5_prm::UdAdrsVector::new_unchecked(&mut av[..]);
        v.set_q_key(0x1111).unwrap();
        v.set_destination_qp_dct(0x99).unwrap();
        v.set_hop_limit(64).unwrap();
        v.set_rgid_rip(&gid_of(peer)).unwrap();
    }
    let mut segs = [[0u8; 16]; 4];
    for (i, s) in segs.iter_mut().take(3).enumerate() {
        s.copy_from_slice(&av[i * 16..i * 16 + 16]);
    }
    segs[3] = data_seg(len, lkey, VA);
    qp.post(hw, WqeOpcode::Send, true, &segs)
}

/// Row 6: with `ud-mtu` every modify of a UD QP needs `mtu` 1..=5 (`UD_MTU`) and
/// `log_msg_max` within the cap (`UD_MSG_MAX`); a send above the QP's MTU is a LOCAL_LENGTH
/// error CQE, one within it leaves (up to 4096 with mtu 5). Legacy: `mtu` 0 passes every
/// modify and the engine keeps its own 1024-byte limit.
#[test]
fn ud_modifies_need_an_mtu_and_sends_fit_it() {
    let (emu_ip, peer_ip) = ip_pair();
    let mut hw = Hw::with(strict());
    assert_eq!(hw.set_gid(0, emu_ip), (0, 0));
    let ceq = hw.eq(6, 1, 0);
    let mut cq = hw.cq(ceq.0);
    let data = hw.buf(4096);
    let lkey = hw.mkey(&data, VA, &["lw"]);
    assert_eq!(ud_qp(&mut hw, &cq, 0, 12).err(), Some(param(syn::UD_MTU)));
    assert_eq!(ud_qp(&mut hw, &cq, 6, 12).err(), Some(param(syn::UD_MTU)));
    assert_eq!(
        ud_qp(&mut hw, &cq, 3, 31).err(),
        Some(param(syn::UD_MSG_MAX))
    );
    // Valid at RST2INIT, missing at INIT2RTR.
    let qp = EmuQp::create(&mut hw, &cq, QpServiceType::Ud);
    let ok = |q: &mut rnic_mlx5_prm::Qpc<&mut [u8]>| {
        q.set_mtu(3).unwrap();
        q.set_log_msg_max(12).unwrap();
    };
    assert_eq!(qp.modify(&hw, CmdOpcode::Rst2InitQp, ok), (0, 0));
    assert_eq!(
        qp.modify(&hw, CmdOpcode::Init2RtrQp, |_| {}),
        param(syn::UD_MTU)
    );

    let mut qp = ud_qp(&mut hw, &cq, 3, 12).unwrap();
    let idx = ud_send(&hw, &mut qp, peer_ip, lkey, 1024);
    let c = cq.expect();
    assert_eq!(
        (opcode(&c), Cqe64::new_unchecked(&c[..]).wqe_counter()),
        (CqeOpcode::Req, u32::from(idx))
    );
    let idx = ud_send(&hw, &mut qp, peer_ip, lkey, 1025);
    let c = cq.expect();
    assert_eq!(opcode(&c), CqeOpcode::ReqErr, "{c:x?}");
    assert_eq!(syndrome(&c), CqeSyndrome::LocalLength);
    assert_eq!(ErrCqe::new_unchecked(&c[..]).wqe_counter(), u32::from(idx));
    let mut big = ud_qp(&mut hw, &cq, 5, 12).unwrap();
    ud_send(&hw, &mut big, peer_ip, lkey, 4000);
    assert_eq!(
        opcode(&cq.expect()),
        CqeOpcode::Req,
        "mtu 4096 carries 4000"
    );

    let (emu_ip, peer_ip) = ip_pair();
    let mut hw = Hw::with(legacy());
    assert_eq!(hw.set_gid(0, emu_ip), (0, 0));
    let ceq = hw.eq(6, 1, 0);
    let mut cq = hw.cq(ceq.0);
    let data = hw.buf(4096);
    let lkey = hw.mkey(&data, VA, &["lw"]);
    let mut qp = ud_qp(&mut hw, &cq, 0, 0).expect("legacy: mtu 0 accepted");
    ud_send(&hw, &mut qp, peer_ip, lkey, 1000);
    assert_eq!(opcode(&cq.expect()), CqeOpcode::Req);
    let mut five = ud_qp(&mut hw, &cq, 5, 12).unwrap();
    ud_send(&hw, &mut five, peer_ip, lkey, 1500);
    let c = cq.expect();
    assert_eq!(
        (opcode(&c), syndrome(&c)),
        (CqeOpcode::ReqErr, CqeSyndrome::LocalLength),
        "legacy: the mtu is not read, the engine's 1024 holds"
    );
}

/// The peer SENDs `len` bytes to the emulated QP; its completion status.
fn peer_send(p: &mut Pair, len: u32) -> WcStatus {
    p.peer.mem.write(0, &pattern(len as usize, 9)).unwrap();
    let sge = [Sge::new(p.peer.mr.addr(), len, p.peer.mr.lkey())];
    p.peer
        .qp
        .post_send(&[SendWr {
            wr_id: 7,
            op: SendOp::Send,
            sg_list: &sge,
            flags: SendFlags::SIGNALED,
            ud: None,
        }])
        .unwrap();
    p.peer.wait(1)[0].status
}

/// Row 12: with `recv-zero-length` a receive data segment with `byte_count` 0 is 2^31 bytes,
/// which no MKey covers: the message that takes that receive completes RESP_ERR with
/// LOCAL_PROT and the peer's SEND fails. Legacy: the segment is 0 bytes and skipped, the
/// message lands in the next one.
#[test]
fn a_zero_length_receive_segment_is_two_gib() {
    let mut p = pair_with(strict());
    let lkey = p.lkey;
    let idx =
        p.qp.post_recv_segs(&[data_seg(0, lkey, VA), data_seg(64, lkey, VA + 64)]);
    assert_ne!(peer_send(&mut p, 16), WcStatus::Success);
    let c = p.cq.expect();
    assert_eq!(
        (opcode(&c), syndrome(&c)),
        (CqeOpcode::RespErr, CqeSyndrome::LocalProt),
        "{c:x?}"
    );
    assert_eq!(ErrCqe::new_unchecked(&c[..]).wqe_counter(), u32::from(idx));

    let mut p = pair_with(legacy());
    let lkey = p.lkey;
    p.qp.post_recv_segs(&[data_seg(0, lkey, VA), data_seg(64, lkey, VA + 64)]);
    assert_eq!(peer_send(&mut p, 16), WcStatus::Success);
    let c = p.cq.expect();
    assert_eq!(opcode(&c), CqeOpcode::RespSend, "{c:x?}");
    let mut got = [0u8; 16];
    p.data.read(64, &mut got).unwrap();
    assert_eq!(
        got.to_vec(),
        pattern(16, 9),
        "the message skipped the empty segment"
    );
}

/// Row 21: with `terminate_scatter_key` the key QUERY_SPECIAL_CONTEXTS names ends a receive
/// list, and 0x100 is an ordinary key — with `recv-zero-length` its zero-length segment is
/// 2^31 bytes under an invalid key: LOCAL_PROT. Without the option 0x100 ends the list (every
/// other receive test).
#[test]
fn the_advertised_terminator_ends_receive_lists() {
    let mut p = pair_with(options(
        Strictness::strict(),
        FirmwareOptions {
            terminate_scatter_key: true,
            ..FirmwareOptions::default()
        },
    ));
    let lkey = p.lkey;
    p.qp.post_recv_segs(&[
        data_seg(64, lkey, VA),
        data_seg(0, TERMINATE_SCATTER_KEY, 0),
    ]);
    assert_eq!(peer_send(&mut p, 16), WcStatus::Success);
    assert_eq!(opcode(&p.cq.expect()), CqeOpcode::RespSend);
    p.qp.post_recv_segs(&[data_seg(64, lkey, VA), data_seg(0, 0x100, 0)]);
    assert_ne!(peer_send(&mut p, 16), WcStatus::Success);
    let c = p.cq.expect();
    assert_eq!(
        (opcode(&c), syndrome(&c)),
        (CqeOpcode::RespErr, CqeSyndrome::LocalProt),
        "0x100 is an ordinary key now: {c:x?}"
    );
}

/// `n` signaled NOPs on `qp`, waiting until the firmware wrote their CQEs.
fn nops(hw: &Hw, qp: &mut EmuQp, n: u64) {
    let before = hw.r.fw().hca_stats().cqes;
    for _ in 0..n {
        qp.post(hw, WqeOpcode::Nop, true, &[]);
    }
    wait_for("CQEs", hw, |s| s.cqes >= before + n);
}

/// A fresh RC QP of `p` on `cq`, in RTS (towards the peer's QPN; it sends nothing).
fn rts_qp(p: &mut Pair, cq: &Cq) -> EmuQp {
    let peer_qpn = p.peer.qp.qpn().get();
    let qp = EmuQp::create(&mut p.hw, cq, QpServiceType::Rc);
    qp.connect(&p.hw, peer_qpn, p.emu_ip, 0, 0);
    qp
}

/// Row 11: `set_ci` is all the firmware knows of what the driver polled, and a CQ's CQEs are
/// the CQ's whatever QP wrote them: 40 CQEs of a QP destroyed unpolled still fill the 64-entry
/// CQ with 24 of another QP, and the next CQE overruns it — not written, a CQ error EQE
/// (syndrome 1) on the async EQ, the CQ in error and later CQEs dropped even after a poll. With
/// `cqc.oi` set the same traffic overwrites instead (the PRM's overrun ignore). No switch: the
/// emulator checked this before issue 26; the test pins it down.
#[test]
fn cqes_of_a_destroyed_qp_still_count_towards_a_cq_overrun() {
    let mut p = pair_with(strict());
    let cq = Cq {
        cqn: p.cq.cqn,
        ring: p.cq.ring.clone(),
        dbr: p.cq.dbr.clone(),
        ci: p.cq.ci,
    };
    let mut a = rts_qp(&mut p, &cq);
    let mut b = rts_qp(&mut p, &cq);
    let first = p.cq.ci;
    nops(&p.hw, &mut a, 40);
    assert_eq!(a.modify(&p.hw, CmdOpcode::Qp2Rst, |_| {}), (0, 0));
    let mut c = cmd(CmdOpcode::DestroyQp, 0, 0x10);
    c[0x09..0x0c].copy_from_slice(&a.qpn.to_be_bytes()[1..]);
    p.hw.r.ok(&c, OUT);
    nops(&p.hw, &mut b, 24);
    assert_eq!(p.hw.r.fw().hca_stats().cqes, u64::from(first) + 64);
    assert_eq!(p.hw.r.fw().hca_stats().cq_overruns, 0, "full, not overrun");
    b.post(&p.hw, WqeOpcode::Nop, true, &[]);
    wait_for("the overrun", &p.hw, |s| s.cq_overruns == 1);
    assert!(
        cq_error_seen(&p.aeq.1, p.cq.cqn),
        "CQ error EQE (overrun) on the async EQ"
    );
    // The driver polls everything now: the CQ stays in error, the next CQE is dropped.
    for _ in 0..64 {
        p.cq.expect();
    }
    let dropped = p.hw.r.fw().hca_stats().cqes_dropped;
    b.post(&p.hw, WqeOpcode::Nop, true, &[]);
    wait_for("a dropped CQE", &p.hw, |s| s.cqes_dropped > dropped);
    assert_eq!(p.hw.r.fw().hca_stats().cqes, u64::from(first) + 64);

    // oi set: 65 CQEs on a 64-entry CQ, no overrun.
    let mut p = pair_with(strict());
    let oi_cq = p.hw.cq_with(p.ceq.0, true);
    let mut c = rts_qp(&mut p, &oi_cq);
    nops(&p.hw, &mut c, 65);
    assert_eq!(p.hw.r.fw().hca_stats().cq_overruns, 0);
}

/// Row 13: with `eq-overrun` an EQ that overruns with `oi` clear is fatal as firmware reports
/// it: health syndrome 0x0c with `rfr`, the health counter stops, commands are ignored.
/// Legacy: counted, and the function goes on.
#[test]
fn an_eq_overrun_is_a_fatal_health_syndrome() {
    for strictness in [Strictness::strict(), Strictness::legacy()] {
        let mut hw = Hw::with(options(strictness, FirmwareOptions::default()));
        // Two entries asking for command completions: CREATE_EQ's own and one NOP fill it,
        // the next NOP's completion event overruns it.
        let _eq = hw.eq(1, 0, 1 << EventType::Cmd.as_raw());
        let nop = cmd(CmdOpcode::Nop, 0, 0x10);
        hw.r.ok(&nop, OUT);
        hw.r.ok(&nop, OUT);
        // The overrun comes with that NOP's completion event, after its output is back.
        wait_for("the EQ overrun", &hw, |s| s.eq_overruns > 0);
        assert_eq!(hw.r.fw().hca_stats().eq_overruns, 1);
        let bar = hw.r.f.bar0();
        let word = |f: rnic_mlx5_prm::FieldLayout| {
            f.extract(
                bar.read32_be(init_seg_offset::HEALTH_BUFFER + f.dword_offset())
                    .unwrap(),
            )
        };
        let fatal = (word(health_buffer::synd), word(health_buffer::rfr));
        let again =
            hw.r.exec_on(1, &nop, OUT, Tweak::default(), Duration::from_millis(200));
        if strictness.eq_overrun_fatal {
            assert_eq!(fatal, (0x0c, 1), "async EQ overrun, rfr");
            assert!(hw.r.emu.device().health_counter_stopped());
            assert_eq!(again, Reply::Timeout, "commands are not served");
        } else {
            assert_eq!(fatal, (0, 0));
            assert!(matches!(again, Reply::Done(_)), "legacy: still served");
        }
    }
}

/// An RDMA WRITE of 1000 bytes to the peer's buffer; its WQE index.
fn write(p: &mut Pair) -> u16 {
    p.data.write(0, &pattern(1000, 3)).unwrap();
    let rkey = p.peer.mr.rkey().0;
    let addr = p.peer.mr.addr();
    p.qp.post(
        &p.hw,
        WqeOpcode::RdmaWrite,
        true,
        &[raddr_seg(addr, rkey), data_seg(1000, p.lkey, VA)],
    )
}

/// Row 8: while the link is down no RoCE packet leaves or is taken (counted
/// `link_down_drops`) and a WRITE waits; when it comes back up the transport's retry delivers
/// it and it completes.
#[test]
fn a_link_down_drops_packets_until_it_comes_back() {
    let mut p = pair_with(strict());
    let faults = p.hw.r.fw().faults();
    faults.set_link(false);
    let tx = p.hw.r.fw().hca_stats().tx_packets;
    let idx = write(&mut p);
    wait_for("a drop", &p.hw, |s| s.link_down_drops > 0);
    assert!(
        p.cq.poll(Duration::from_millis(150)).is_none(),
        "no completion"
    );
    assert_eq!(p.hw.r.fw().hca_stats().tx_packets, tx, "nothing sent");
    faults.set_link(true);
    let c = p.cq.expect();
    assert_eq!(
        (opcode(&c), Cqe64::new_unchecked(&c[..]).wqe_counter()),
        (CqeOpcode::Req, u32::from(idx))
    );
    assert_eq!(p.peer.bytes(0, 1000), pattern(1000, 3));
}

/// Rows 2, 3: a syndrome without `rfr` leaves the data path running (a WRITE completes); the
/// NIC interface state disabled stops it (the doorbell is dropped, `halted_drops`), as does a
/// fatal syndrome.
#[test]
fn a_warning_keeps_the_data_path_a_stopped_function_does_not() {
    let mut p = pair_with(strict());
    let faults = p.hw.r.fw().faults();
    assert!(faults.health(HealthSyndrome::HighTemp, false));
    write(&mut p);
    assert_eq!(
        opcode(&p.cq.expect()),
        CqeOpcode::Req,
        "a warning is not fatal"
    );
    for stop in [0, 1] {
        let mut p = pair_with(strict());
        let faults = p.hw.r.fw().faults();
        if stop == 0 {
            assert!(faults.nic_state(NicState::Disabled));
        } else {
            assert!(faults.fatal(HealthSyndrome::HwFatal));
        }
        let halted = p.hw.r.fw().hca_stats().halted_drops;
        write(&mut p);
        wait_for("the doorbell dropped", &p.hw, |s| s.halted_drops > halted);
        assert!(p.cq.poll(Duration::from_millis(100)).is_none());
        assert_eq!(
            p.peer.bytes(0, 1000),
            vec![0u8; 1000],
            "nothing reached the peer"
        );
    }
}

/// Row 61: without the atomic capability RST2INIT refuses `rae` or `atomic_mode`
/// (`QP_ATOMIC`); remote read and write are fine.
#[test]
fn without_the_atomic_cap_atomics_cannot_be_enabled() {
    let mut hw = Hw::with(options(
        Strictness::strict(),
        FirmwareOptions {
            atomic: false,
            ..FirmwareOptions::default()
        },
    ));
    let q = cmd(CmdOpcode::QueryHcaCap, (cap_type::GENERAL << 1) | 1, 0x10);
    let out = hw.r.ok(&q, 0x1010);
    assert_eq!(
        rnic_mlx5_prm::CmdHcaCap::new_unchecked(&out[0x10..]).atomic(),
        0
    );
    let eq = hw.eq(4, 0, 0);
    let cq = hw.cq(eq.0);
    let qp = EmuQp::create(&mut hw, &cq, QpServiceType::Rc);
    assert_eq!(
        qp.modify(&hw, CmdOpcode::Rst2InitQp, |q| q.set_rae(1).unwrap()),
        param(syn::QP_ATOMIC)
    );
    assert_eq!(
        qp.modify(&hw, CmdOpcode::Rst2InitQp, |q| q
            .set_atomic_mode(1)
            .unwrap()),
        param(syn::QP_ATOMIC)
    );
    assert_eq!(
        qp.modify(&hw, CmdOpcode::Rst2InitQp, |q| {
            q.set_rre(1).unwrap();
            q.set_rwe(1).unwrap();
        }),
        (0, 0)
    );
}

/// Row 20: CREATE_QP's `ts_format` must be one the RoCE cap `qp_ts_format` allows: with
/// real-time only (1), free-running (0) is refused (`QP_TS_FORMAT`) and default (1) /
/// real-time (2) pass; with free-running only (0, the default) real-time is refused. The
/// reserved value 3 is a context error.
#[test]
fn create_qp_ts_format_follows_the_roce_cap() {
    for (cap, refused, accepted) in [(1, vec![0], vec![1, 2]), (0, vec![2], vec![0, 1])] {
        let mut hw = Hw::with(options(
            Strictness::strict(),
            FirmwareOptions {
                roce_qp_ts_format: cap,
                ..FirmwareOptions::default()
            },
        ));
        let eq = hw.eq(4, 0, 0);
        let cq = hw.cq(eq.0);
        for st in [QpServiceType::Rc, QpServiceType::Ud] {
            for &ts in &refused {
                let r = EmuQp::try_create(&mut hw, &cq, st, |q| q.set_ts_format(ts).unwrap());
                assert_eq!(r.err(), Some(param(syn::QP_TS_FORMAT)), "cap {cap} ts {ts}");
            }
            for &ts in &accepted {
                let r = EmuQp::try_create(&mut hw, &cq, st, |q| q.set_ts_format(ts).unwrap());
                assert!(r.is_ok(), "cap {cap} ts {ts}");
            }
            let r = EmuQp::try_create(&mut hw, &cq, st, |q| q.set_ts_format(3).unwrap());
            assert_eq!(r.err(), Some(param(syn::QP_CONTEXT)));
        }
    }
}

/// A WRITE of 64 bytes from the data buffer to the peer's, as a BlueFlame copy into `half`.
fn bf_write(p: &mut Pair, half: usize, seed: u8) -> u16 {
    p.data.write(0, &pattern(64, seed)).unwrap();
    let (addr, rkey, lkey) = (p.peer.mr.addr(), p.peer.mr.rkey().0, p.lkey);
    p.qp.post_bf(
        &p.hw,
        half,
        WqeOpcode::RdmaWrite,
        true,
        &[raddr_seg(addr, rkey), data_seg(64, lkey, VA)],
    )
}

fn bf_stats(hw: &Hw) -> (u64, u64) {
    let s = hw.r.fw().stats();
    (s.bf_uncombined, s.bf_interleaved)
}

/// Row 4: with `blueflame` on a BAR0 advertised uncached (the default `--bar0 uc`) a BlueFlame
/// copy is served as an 8-byte doorbell — the WQE is read from the ring — and counted
/// `bf_uncombined`; the body is cleared after the firmware looked. 100 copies alternating the
/// halves, 25 at a time as fast as the test writes them: every WRITE lands, none is judged interleaved (a
/// correct writer never is). With `--bar0 wc` the same copies are not counted. Legacy: the
/// body is not looked at (not counted, not cleared).
#[test]
fn blueflame_copies_on_an_uncached_bar0_are_counted_and_served_as_doorbells() {
    let mut p = pair_with(strict());
    let idx = bf_write(&mut p, 0x800, 1);
    let c = p.cq.expect();
    assert_eq!(
        (opcode(&c), Cqe64::new_unchecked(&c[..]).wqe_counter()),
        (CqeOpcode::Req, u32::from(idx))
    );
    assert_eq!(p.peer.bytes(0, 64), pattern(64, 1));
    let deadline = Instant::now() + Duration::from_secs(5);
    while bf_stats(&p.hw).0 == 0 {
        assert!(Instant::now() < deadline, "not counted");
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(20));
    let uar = p.hw.r.f.uar(p.hw.uar).unwrap();
    assert_eq!(uar.read64_be(0x808).unwrap(), 0, "the body is cleared");
    // Four rounds of 25 (the SQ holds 64 WQEBBs), each written back to back.
    for round in 0..4u16 {
        for i in 0..25u16 {
            let half = if (round * 25 + i) % 2 == 0 {
                0x900
            } else {
                0x800
            };
            bf_write(&mut p, half, i as u8);
        }
        for _ in 0..25 {
            assert_eq!(opcode(&p.cq.expect()), CqeOpcode::Req);
        }
    }
    std::thread::sleep(Duration::from_millis(60));
    let (uncombined, interleaved) = bf_stats(&p.hw);
    assert!(uncombined >= 2, "{uncombined}");
    assert_eq!(interleaved, 0, "a correct writer is never interleaved");

    let mut p = pair_with(Options {
        bar0: rnic_mlx5_emu::Bar0Mapping::Wc,
        ..strict()
    });
    bf_write(&mut p, 0x800, 2);
    assert_eq!(opcode(&p.cq.expect()), CqeOpcode::Req);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(
        bf_stats(&p.hw),
        (0, 0),
        "write-combining: a copy is expected"
    );

    let mut p = pair_with(legacy());
    bf_write(&mut p, 0x800, 3);
    assert_eq!(opcode(&p.cq.expect()), CqeOpcode::Req);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(bf_stats(&p.hw), (0, 0));
    let uar = p.hw.r.f.uar(p.hw.uar).unwrap();
    assert_ne!(uar.read64_be(0x808).unwrap(), 0, "legacy: the body stays");
}

/// Row 5: two QPs' writes interleaved in one register half — QP A's copy starts (word 0 is
/// served), QP B's 8-byte doorbell lands in the same half, then the rest of A's copy — leave
/// B's doorbell with a body that is not B's WQE: `bf_interleaved`. Both WQEs still run (read
/// from the ring).
#[test]
fn interleaved_writes_to_one_register_are_an_error() {
    let mut p = pair_with(strict());
    let cq = Cq {
        cqn: p.cq.cqn,
        ring: p.cq.ring.clone(),
        dbr: p.cq.dbr.clone(),
        ci: 0,
    };
    let mut b = rts_qp(&mut p, &cq);
    // A: the WQE published, only word 0 of its copy written.
    p.data.write(0, &pattern(64, 7)).unwrap();
    let (addr, rkey, lkey) = (p.peer.mr.addr(), p.peer.mr.rkey().0, p.lkey);
    let segs = [raddr_seg(addr, rkey), data_seg(64, lkey, VA)];
    let (ia, bell) = p.qp.prepare(WqeOpcode::RdmaWrite, true, &segs);
    let words = p.qp.wqe_words(ia, segs.len());
    assert_eq!(words[0], bell);
    p.hw.uar_write64(0x800, bell);
    let c = p.cq.expect();
    assert_eq!(Cqe64::new_unchecked(&c[..]).wqe_counter(), u32::from(ia));
    // B rings the same half.
    let (ib, bell_b) = b.prepare(WqeOpcode::Nop, true, &[]);
    p.hw.uar_write64(0x800, bell_b);
    let c = p.cq.expect();
    assert_eq!(
        (
            Cqe64::new_unchecked(&c[..]).qpn(),
            Cqe64::new_unchecked(&c[..]).wqe_counter()
        ),
        (b.qpn, u32::from(ib))
    );
    // The rest of A's copy.
    for (k, w) in words.iter().enumerate().skip(1) {
        p.hw.uar_write64(0x800 + 8 * k, *w);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while bf_stats(&p.hw).1 == 0 {
        assert!(Instant::now() < deadline, "not judged");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(bf_stats(&p.hw).1, 1);
    assert_eq!(
        p.peer.bytes(0, 64),
        pattern(64, 7),
        "A's WRITE ran from the ring"
    );
}
