//! The emulated HCA's data path end to end against an rnic-rxe peer: WQEs written into
//! the SQ ring and rung at the UAR (the tests' own client, not the driver's data path),
//! CQEs and EQEs read back from DMA memory.
#![allow(clippy::unwrap_used)]

mod common;

use common::hw::*;

#[test]
fn rc_write_send_read_atomic_against_rxe() {
    let mut p = pair();
    let rkey = p.peer.mr.rkey().get();
    let raddr = p.peer.mr.addr();

    // WRITE: 3000 bytes from MKey offset 100 (crossing a page of the MTT) to the peer.
    let src = pattern(3000, 7);
    p.data.write(100, &src).unwrap();
    let unsignaled = p.qp.post(
        &p.hw,
        WqeOpcode::RdmaWrite,
        false,
        &[
            raddr_seg(raddr + 64, rkey),
            data_seg(1000, p.lkey, VA + 100),
        ],
    );
    let idx = p.qp.post(
        &p.hw,
        WqeOpcode::RdmaWrite,
        true,
        &[
            raddr_seg(raddr + 1064, rkey),
            data_seg(2000, p.lkey, VA + 1100),
        ],
    );
    assert_eq!((unsignaled, idx), (0, 1));
    let cqe = p.cq.expect();
    let v = Cqe64::new_unchecked(&cqe[..]);
    assert_eq!(opcode(&cqe), CqeOpcode::Req, "{cqe:x?}");
    assert_eq!(
        v.wqe_counter(),
        u32::from(idx),
        "the signaled WQE; the unsignaled one is implied"
    );
    assert_eq!(v.qpn(), p.qp.qpn);
    assert_eq!(v.wqe_opcode(), u32::from(WqeOpcode::RdmaWrite.as_raw()));
    assert_eq!(v.srqn_uidx(), 0x77, "user_index (cqe_version 1)");
    assert_eq!(p.peer.bytes(64, 3000), src, "byte-exact at the peer");
    assert_eq!(p.peer.bytes(64 + 3000, 1), [0], "guard byte untouched");
    assert!(
        p.cq.poll(Duration::from_millis(50)).is_none(),
        "one CQE only"
    );

    // SEND from the peer into a posted receive WQE.
    let ridx = p.qp.post_recv(VA + 8192, 4096, p.lkey);
    let msg = pattern(1500, 3);
    p.peer.mem.write(8192, &msg).unwrap();
    let sge = [Sge::new(p.peer.mr.addr() + 8192, 1500, p.peer.mr.lkey())];
    p.peer
        .qp
        .post_send(&[SendWr {
            wr_id: 9,
            op: SendOp::SendWithImm { imm: 0x1234_5678 },
            sg_list: &sge,
            flags: SendFlags::SIGNALED,
            ud: None,
        }])
        .unwrap();
    let cqe = p.cq.expect();
    let v = Cqe64::new_unchecked(&cqe[..]);
    assert_eq!(opcode(&cqe), CqeOpcode::RespSendImm, "{cqe:x?}");
    assert_eq!(v.byte_cnt(), 1500);
    assert_eq!(v.imm_inval_pkey(), 0x1234_5678);
    assert_eq!(v.wqe_counter(), u32::from(ridx));
    let mut got = vec![0u8; 1500];
    p.data.read(8192, &mut got).unwrap();
    assert_eq!(got, msg);
    assert_eq!(p.peer.wait(1)[0].status, WcStatus::Success);

    // READ 2048 bytes of the peer into MKey offset 12288.
    let remote = pattern(2048, 11);
    p.peer.mem.write(16384, &remote).unwrap();
    let idx = p.qp.post(
        &p.hw,
        WqeOpcode::RdmaRead,
        true,
        &[
            raddr_seg(raddr + 16384, rkey),
            data_seg(2048, p.lkey, VA + 12288),
        ],
    );
    let cqe = p.cq.expect();
    let v = Cqe64::new_unchecked(&cqe[..]);
    assert_eq!(
        (opcode(&cqe), v.wqe_counter(), v.byte_cnt()),
        (CqeOpcode::Req, u32::from(idx), 2048)
    );
    let mut got = vec![0u8; 2048];
    p.data.read(12288, &mut got).unwrap();
    assert_eq!(got, remote);

    // Fetch-and-add: the original value comes back (big-endian, no endianness mode).
    p.peer.mem.write(32768, &41u64.to_ne_bytes()).unwrap();
    let idx = p.qp.post(
        &p.hw,
        WqeOpcode::AtomicFa,
        true,
        &[
            raddr_seg(raddr + 32768, rkey),
            atomic_seg(1, 0),
            data_seg(8, p.lkey, VA + 200),
        ],
    );
    let cqe = p.cq.expect();
    assert_eq!(opcode(&cqe), CqeOpcode::Req, "{cqe:x?}");
    assert_eq!(Cqe64::new_unchecked(&cqe[..]).wqe_counter(), u32::from(idx));
    let mut orig = [0u8; 8];
    p.data.read(200, &mut orig).unwrap();
    assert_eq!(u64::from_be_bytes(orig), 41);
    let mut now = [0u8; 8];
    p.peer.mem.read(32768, &mut now).unwrap();
    assert_eq!(u64::from_ne_bytes(now), 42);

    // Compare-and-swap 42 → 7.
    p.qp.post(
        &p.hw,
        WqeOpcode::AtomicCs,
        true,
        &[
            raddr_seg(raddr + 32768, rkey),
            atomic_seg(7, 42),
            data_seg(8, p.lkey, VA + 208),
        ],
    );
    assert_eq!(opcode(&p.cq.expect()), CqeOpcode::Req);
    p.data.read(208, &mut orig).unwrap();
    assert_eq!(u64::from_be_bytes(orig), 42);
    p.peer.mem.read(32768, &mut now).unwrap();
    assert_eq!(u64::from_ne_bytes(now), 7);

    // The peer WRITEs into our MKey (remote access through the MTT, key byte checked).
    let w = pattern(700, 99);
    p.peer.mem.write(40000, &w).unwrap();
    let sge = [Sge::new(p.peer.mr.addr() + 40000, 700, p.peer.mr.lkey())];
    p.peer
        .qp
        .post_send(&[SendWr {
            wr_id: 10,
            op: SendOp::RdmaWrite {
                remote_addr: VA + 4000,
                rkey: rnic_core::Rkey(p.lkey),
            },
            sg_list: &sge,
            flags: SendFlags::SIGNALED,
            ud: None,
        }])
        .unwrap();
    assert_eq!(p.peer.wait(1)[0].status, WcStatus::Success);
    let mut got = vec![0u8; 700];
    p.data.read(4000, &mut got).unwrap();
    assert_eq!(got, w);
    let stats = p.hw.r.fw().hca_stats();
    assert!(stats.tx_packets > 0 && stats.rx_packets > 0, "{stats:?}");
    assert_eq!(stats.rx_bad_icrc, 0, "{stats:?}");
    let _ = (&p.ceq, p.emu_ip, &p.peer.dev);
}

#[test]
fn bad_lkey_is_a_local_protection_error_then_flushes() {
    let mut p = pair();
    let rkey = p.peer.mr.rkey().get();
    let raddr = p.peer.mr.addr();
    // A good WRITE, then one with an lkey whose key byte is wrong, then one more.
    let good = p.qp.post(
        &p.hw,
        WqeOpcode::RdmaWrite,
        true,
        &[raddr_seg(raddr, rkey), data_seg(16, p.lkey, VA)],
    );
    let bad = p.qp.post(
        &p.hw,
        WqeOpcode::RdmaWrite,
        false,
        &[raddr_seg(raddr, rkey), data_seg(16, p.lkey ^ 1, VA)],
    );
    let later = p.qp.post(
        &p.hw,
        WqeOpcode::RdmaWrite,
        true,
        &[raddr_seg(raddr, rkey), data_seg(16, p.lkey, VA)],
    );
    let c1 = p.cq.expect();
    assert_eq!(
        (opcode(&c1), Cqe64::new_unchecked(&c1[..]).wqe_counter()),
        (CqeOpcode::Req, u32::from(good))
    );
    let c2 = p.cq.expect();
    assert_eq!(opcode(&c2), CqeOpcode::ReqErr, "{c2:x?}");
    assert_eq!(syndrome(&c2), CqeSyndrome::LocalProt);
    assert_eq!(ErrCqe::new_unchecked(&c2[..]).wqe_counter(), u32::from(bad));
    let c3 = p.cq.expect();
    assert_eq!(
        (opcode(&c3), syndrome(&c3)),
        (CqeOpcode::ReqErr, CqeSyndrome::WrFlushed)
    );
    assert_eq!(
        ErrCqe::new_unchecked(&c3[..]).wqe_counter(),
        u32::from(later)
    );
    assert_eq!(p.qp.state(&p.hw), 6, "ERR");
    // Posted later still: flushed at once.
    let after =
        p.qp.post(&p.hw, WqeOpcode::Send, false, &[data_seg(8, p.lkey, VA)]);
    let c4 = p.cq.expect();
    assert_eq!(
        (syndrome(&c4), ErrCqe::new_unchecked(&c4[..]).wqe_counter()),
        (CqeSyndrome::WrFlushed, u32::from(after))
    );
}

#[test]
fn malformed_wqe_and_dma_fault_are_error_cqes() {
    let mut p = pair();
    // Unknown opcode 0x13: local QP operation error, QP to ERR.
    let idx = p.qp.post(
        &p.hw,
        WqeOpcode::from_raw(0x13),
        true,
        &[data_seg(8, p.lkey, VA)],
    );
    let c = p.cq.expect();
    assert_eq!(
        (opcode(&c), syndrome(&c)),
        (CqeOpcode::ReqErr, CqeSyndrome::LocalQpOp)
    );
    assert_eq!(ErrCqe::new_unchecked(&c[..]).wqe_counter(), u32::from(idx));
    assert_eq!(p.qp.state(&p.hw), 6);
    assert!(p.hw.r.fw().hca_stats().wqe_errors >= 1);

    // A second QP, RTS, with an SGE in a PA-mode MKey over unmapped IOVA: DMA fault.
    let mut c = cmd(CmdOpcode::CreateMkey, 0, 0x110);
    let mut v = CreateMkeyIn::new_unchecked(&mut c[..]);
    let mut m = v.memory_key_mkey_entry_mut();
    m.set_lr(1).unwrap();
    m.set_lw(1).unwrap();
    m.set_length64(1).unwrap();
    m.set_qpn(0xff_ffff).unwrap();
    m.set_pd(p.hw.pd).unwrap();
    let out = p.hw.r.ok(&c, OUT);
    let pa_key = CreateMkeyOut::new_unchecked(&out[..]).mkey_index() << 8;
    let mut qp2 = EmuQp::create(&mut p.hw, &p.cq, QpServiceType::Rc);
    let IpAddr::V4(e) = p.emu_ip else { panic!() };
    let o = e.octets();
    let pip = IpAddr::V4(Ipv4Addr::new(o[0], o[1], o[2], 3));
    let mut peer2 = Peer::new(pip);
    peer2.connect(qp2.qpn, p.emu_ip, 0x10, 0x20);
    qp2.connect(&p.hw, peer2.qp.qpn().get(), pip, 0x20, 0x10);
    let rkey = peer2.mr.rkey().get();
    let idx = qp2.post(
        &p.hw,
        WqeOpcode::RdmaWrite,
        true,
        &[
            raddr_seg(peer2.mr.addr(), rkey),
            data_seg(64, pa_key, 0xdead_0000_0000),
        ],
    );
    let c = p.cq.expect();
    assert_eq!(
        (opcode(&c), syndrome(&c)),
        (CqeOpcode::ReqErr, CqeSyndrome::LocalProt),
        "{c:x?}"
    );
    assert_eq!(ErrCqe::new_unchecked(&c[..]).qpn(), qp2.qpn);
    assert_eq!(ErrCqe::new_unchecked(&c[..]).wqe_counter(), u32::from(idx));
    assert!(p.hw.r.fw().hca_stats().dma_faults >= 1);
}

/// An arm whose doorbell the emulator has not read yet (a later arm can
/// overwrite the one register before the watcher reads it; a PCIe device
/// sees every write) is taken from the CQ's doorbell record, where the
/// driver stored it first: the completion raises its EQE. The doorbell, read
/// later, is not applied a second time.
#[test]
fn an_arm_in_the_record_whose_doorbell_is_unread_still_raises_the_event() {
    let mut p = pair();
    let (eqn, eq_ring) = (p.ceq.0, p.ceq.1.clone());
    p.hw.uar_write32(0x40, eqn << 24);
    // The record's arm dword (sn 1, cmd 0, ci 0); no doorbell.
    let word: u32 = 1 << 28;
    p.cq.dbr.write(4, &word.to_be_bytes()).unwrap();
    let rkey = p.peer.mr.rkey().get();
    let write = |p: &mut Pair| {
        p.qp.post(
            &p.hw,
            WqeOpcode::RdmaWrite,
            true,
            &[raddr_seg(p.peer.mr.addr(), rkey), data_seg(8, p.lkey, VA)],
        );
        assert_eq!(opcode(&p.cq.expect()), CqeOpcode::Req);
    };
    write(&mut p);
    let mut e = [0u8; 64];
    let t = std::time::Instant::now();
    loop {
        eq_ring.read(0, &mut e).unwrap();
        if e[63] & 1 == 0 || t.elapsed() > Duration::from_secs(5) {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let v = Eqe::new_unchecked(&e[..]);
    assert_eq!(v.owner(), 0, "an EQE was written");
    assert_eq!(v.event_type(), u32::from(EventType::Completion.as_raw()));
    assert_eq!(v.comp_event().cq_number(), p.cq.cqn);
    // The late doorbell of that same arm: already applied, not re-armed.
    p.hw.uar_write64(0x20, (u64::from(word) << 32) | u64::from(p.cq.cqn));
    write(&mut p);
    std::thread::sleep(Duration::from_millis(50));
    eq_ring.read(64, &mut e).unwrap();
    assert_eq!(e[63] & 1, 1, "no second EQE: the arm was used once");
}

#[test]
fn cq_arm_raises_a_completion_eqe_and_msix() {
    let mut p = pair();
    let (eqn, eq_ring) = (p.ceq.0, p.ceq.1.clone());
    let _ = p.hw.vectors[1].take();
    // Arm: sn 0, cmd 0 (next completion), ci 0.
    p.hw.uar_write64(0x20, u64::from(p.cq.cqn));
    // Arm the EQ (consumer index 0).
    p.hw.uar_write32(0x40, eqn << 24);
    let rkey = p.peer.mr.rkey().get();
    p.qp.post(
        &p.hw,
        WqeOpcode::RdmaWrite,
        true,
        &[raddr_seg(p.peer.mr.addr(), rkey), data_seg(8, p.lkey, VA)],
    );
    assert_eq!(opcode(&p.cq.expect()), CqeOpcode::Req);
    assert!(
        p.hw.vectors[1]
            .wait(Duration::from_secs(5))
            .unwrap()
            .is_some(),
        "MSI-X vector 1 fired"
    );
    let mut e = [0u8; 64];
    eq_ring.read(0, &mut e).unwrap();
    let v = Eqe::new_unchecked(&e[..]);
    assert_eq!(v.event_type(), u32::from(EventType::Completion.as_raw()));
    assert_eq!(v.owner(), 0, "first pass: owner 0");
    assert_eq!(v.comp_event().cq_number(), p.cq.cqn);
    // Not re-armed: a second completion writes no EQE.
    p.qp.post(
        &p.hw,
        WqeOpcode::RdmaWrite,
        true,
        &[raddr_seg(p.peer.mr.addr(), rkey), data_seg(8, p.lkey, VA)],
    );
    assert_eq!(opcode(&p.cq.expect()), CqeOpcode::Req);
    eq_ring.read(64, &mut e).unwrap();
    assert_eq!(e[63], 1, "no second EQE");
    // Arming with a stale consumer index fires at once (CQEs beyond it exist).
    p.hw.uar_write32(0x40, (eqn << 24) | 1);
    p.hw.uar_write64(0x20, (((1u64 << 28) | 1) << 32) | u64::from(p.cq.cqn));
    assert!(
        p.hw.vectors[1]
            .wait(Duration::from_secs(5))
            .unwrap()
            .is_some()
    );
}

#[test]
fn write_imm_from_the_peer_and_cq_overrun() {
    let mut p = pair();
    // RDMA WRITE with immediate from the peer: RESP_WR_IMM on the receive WQE.
    let ridx = p.qp.post_recv(VA, 0, p.lkey);
    let w = pattern(300, 5);
    p.peer.mem.write(0, &w).unwrap();
    let sge = [Sge::new(p.peer.mr.addr(), 300, p.peer.mr.lkey())];
    p.peer
        .qp
        .post_send(&[SendWr {
            wr_id: 1,
            op: SendOp::RdmaWriteWithImm {
                remote_addr: VA + 5000,
                rkey: rnic_core::Rkey(p.lkey),
                imm: 0xfeed_beef,
            },
            sg_list: &sge,
            flags: SendFlags::SIGNALED,
            ud: None,
        }])
        .unwrap();
    let c = p.cq.expect();
    let v = Cqe64::new_unchecked(&c[..]);
    assert_eq!(opcode(&c), CqeOpcode::RespWrImm, "{c:x?}");
    assert_eq!((v.imm_inval_pkey(), v.byte_cnt()), (0xfeed_beef, 300));
    assert_eq!(v.wqe_counter(), u32::from(ridx));
    let mut got = vec![0u8; 300];
    p.data.read(5000, &mut got).unwrap();
    assert_eq!(got, w);

    // 64 signaled NOPs fill the 64-entry CQ (set_ci not advanced); the 65th overruns it:
    // not written, a CQ error EQE instead.
    let first = p.cq.ci;
    for _ in 0..64 {
        p.qp.post(&p.hw, WqeOpcode::Nop, true, &[]);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while p.hw.r.fw().hca_stats().cqes < u64::from(first) + 64 {
        assert!(Instant::now() < deadline, "{:?}", p.hw.r.fw().hca_stats());
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut slot0 = [0u8; 64];
    p.cq.ring
        .read(((first & 63) as usize) * 64, &mut slot0)
        .unwrap();
    p.qp.post(&p.hw, WqeOpcode::Nop, true, &[]);
    let deadline = Instant::now() + Duration::from_secs(5);
    while p.hw.r.fw().hca_stats().cq_overruns == 0 {
        assert!(Instant::now() < deadline, "{:?}", p.hw.r.fw().hca_stats());
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut again = [0u8; 64];
    p.cq.ring
        .read(((first & 63) as usize) * 64, &mut again)
        .unwrap();
    assert_eq!(again, slot0, "never written past the ring");
    assert!(
        cq_error_seen(&p.aeq.1, p.cq.cqn),
        "CQ error EQE on the async EQ"
    );
}

#[test]
fn a_silent_peer_exhausts_the_retries_on_the_engine_timers() {
    let mut p = pair();
    // RTS2RTS with opt_param_mask RETRY_COUNT | ACK_TIMEOUT: one retry, ack_timeout 10
    // (~4 ms). Fields the mask does not name (rnr_retry 0 here) stay as they were.
    let mut c = cmd(CmdOpcode::Rts2RtsQp, 0, 0x110);
    let mut v = rnic_mlx5_prm::Rts2rtsQpIn::new_unchecked(&mut c[..]);
    v.set_qpn(p.qp.qpn).unwrap();
    v.set_opt_param_mask(
        rnic_mlx5_prm::qp_optpar::RETRY_COUNT | rnic_mlx5_prm::qp_optpar::ACK_TIMEOUT,
    )
    .unwrap();
    v.qpc_mut().set_retry_count(1).unwrap();
    v.qpc_mut()
        .primary_address_path_mut()
        .set_ack_timeout(10)
        .unwrap();
    p.hw.r.ok(&c, OUT);
    let mut q = cmd(CmdOpcode::QueryQp, 0, 0x10);
    q[0x09..0x0c].copy_from_slice(&p.qp.qpn.to_be_bytes()[1..]);
    let out = p.hw.r.ok(&q, QueryQpOut::<&[u8]>::SIZE_BYTES);
    let qpc = QueryQpOut::new_unchecked(&out[..]);
    assert_eq!((qpc.qpc().retry_count(), qpc.qpc().rnr_retry()), (1, 7));
    assert_eq!(qpc.qpc().primary_address_path().ack_timeout(), 10);
    // The peer drops everything from now on: no ACKs → TRANSPORT_RETRY_EXCEEDED.
    p.peer.qp.to_error().unwrap();
    let rkey = p.peer.mr.rkey().get();
    let idx = p.qp.post(
        &p.hw,
        WqeOpcode::RdmaWrite,
        true,
        &[raddr_seg(p.peer.mr.addr(), rkey), data_seg(32, p.lkey, VA)],
    );
    let c = p.cq.expect();
    assert_eq!(opcode(&c), CqeOpcode::ReqErr, "{c:x?}");
    assert_eq!(syndrome(&c), CqeSyndrome::TransportRetryExceeded);
    assert_eq!(ErrCqe::new_unchecked(&c[..]).wqe_counter(), u32::from(idx));
    assert_eq!(p.qp.state(&p.hw), 6, "ERR after the transport error");
}

#[test]
fn rc_between_two_emulated_qps_over_ipv6_loopback() {
    // Both QPs on one function, GID 0 = ::1 (RoCE v2, l3 type IPv6): the emulator talks to
    // itself through its own UDP/4791 socket, ICRC filled and verified over IPv6.
    let ip = IpAddr::V6(std::net::Ipv6Addr::LOCALHOST);
    let mut hw = Hw::new();
    let (st, synd) = hw.set_gid(0, ip);
    if (st, synd) == (CmdStatus::BadParam.as_raw(), syn::GID_BIND) {
        println!("SKIP: [::1]:4791 not bindable here");
        return;
    }
    assert_eq!((st, synd), (0, 0));
    let ceq = hw.eq(6, 1, 0);
    let mut cq = hw.cq(ceq.0);
    let data = hw.buf(4 * 4096);
    let lkey = hw.mkey(&data, VA, &["lw", "rr", "rw", "a"]);
    let mut a = EmuQp::create(&mut hw, &cq, QpServiceType::Rc);
    let b = EmuQp::create(&mut hw, &cq, QpServiceType::Rc);
    a.connect(&hw, b.qpn, ip, 0x300, 0x100);
    b.connect(&hw, a.qpn, ip, 0x100, 0x300);
    let src = pattern(2500, 77);
    data.write(0, &src).unwrap();
    let idx = a.post(
        &hw,
        WqeOpcode::RdmaWrite,
        true,
        &[raddr_seg(VA + 8192, lkey), data_seg(2500, lkey, VA)],
    );
    let c = cq.expect();
    let v = Cqe64::new_unchecked(&c[..]);
    assert_eq!(
        (opcode(&c), v.qpn(), v.wqe_counter()),
        (CqeOpcode::Req, a.qpn, u32::from(idx)),
        "{c:x?}"
    );
    let mut got = vec![0u8; 2500];
    data.read(8192, &mut got).unwrap();
    assert_eq!(got, src);
    let stats = hw.r.fw().hca_stats();
    assert_eq!(stats.rx_bad_icrc, 0, "{stats:?}");
}

/// Send doorbells of many QPs on one BlueFlame register: the watcher samples the register,
/// so a doorbell overwritten by the next QP's before it looked is never seen. Every QP is
/// still served (a send doorbell of the page makes the emulator check the doorbell record of
/// every QP on it), and still never beyond its doorbell record, nor without a doorbell.
#[test]
fn overwritten_send_doorbells_on_a_shared_register_serve_every_qp() {
    const N: usize = 16;
    const CHUNK: usize = 256;
    let (ip, _) = ip_pair();
    let mut hw = Hw::new();
    assert_eq!(hw.set_gid(0, ip), (0, 0));
    let ceq = hw.eq(6, 1, 0);
    let mut cq = hw.cq(ceq.0);
    // Sources at 0, WRITE targets at 8 KiB, the never-rung WQE's target at 12 KiB.
    let data = hw.buf(4 * 4096);
    let lkey = hw.mkey(&data, VA, &["lw", "rr", "rw", "a"]);
    let mut senders: Vec<EmuQp> = (0..N)
        .map(|_| EmuQp::create(&mut hw, &cq, QpServiceType::Rc))
        .collect();
    let receivers: Vec<EmuQp> = (0..N)
        .map(|_| EmuQp::create(&mut hw, &cq, QpServiceType::Rc))
        .collect();
    for (s, r) in senders.iter().zip(&receivers) {
        s.connect(&hw, r.qpn, ip, 0x500, 0x900);
        r.connect(&hw, s.qpn, ip, 0x900, 0x500);
    }
    let write = |qp: &mut EmuQp, i: usize, round: u8| {
        let src = pattern(CHUNK, round.wrapping_mul(64).wrapping_add(i as u8));
        data.write(i * CHUNK, &src).unwrap();
        let segs = [
            raddr_seg(VA + (8192 + i * CHUNK) as u64, lkey),
            data_seg(CHUNK as u32, lkey, VA + (i * CHUNK) as u64),
        ];
        (qp.prepare(WqeOpcode::RdmaWrite, true, &segs), src)
    };
    // Collect N CQEs: one per sender, each naming its WQE; then each target byte-exact.
    let served = |cq: &mut Cq, senders: &[EmuQp], idx: &[u16], srcs: &[Vec<u8>]| {
        let mut got: Vec<(u32, u32)> = (0..N)
            .map(|_| {
                let c = cq.expect();
                assert_eq!(opcode(&c), CqeOpcode::Req, "{c:x?}");
                let v = Cqe64::new_unchecked(&c[..]);
                (v.qpn(), v.wqe_counter())
            })
            .collect();
        got.sort_unstable();
        let mut want: Vec<(u32, u32)> = senders
            .iter()
            .zip(idx)
            .map(|(s, i)| (s.qpn, u32::from(*i)))
            .collect();
        want.sort_unstable();
        assert_eq!(got, want, "every sender's WQE completed once");
        for (i, src) in srcs.iter().enumerate() {
            let mut b = vec![0u8; CHUNK];
            data.read(8192 + i * CHUNK, &mut b).unwrap();
            assert!(b == *src, "QP {i}: target bytes differ");
        }
        assert!(cq.poll(Duration::from_millis(50)).is_none(), "N CQEs only");
    };

    // 1. Records published, nothing rung: nothing runs (no sweep without a doorbell).
    let mut idx = Vec::new();
    let mut srcs = Vec::new();
    let mut bells = Vec::new();
    for (i, s) in senders.iter_mut().enumerate() {
        let ((k, bell), src) = write(s, i, 1);
        idx.push(k);
        srcs.push(src);
        bells.push(bell);
    }
    // A WQE in QP 0's ring past its doorbell record: never to be read.
    senders[0].write_wqe(
        WqeOpcode::RdmaWrite,
        true,
        &[
            raddr_seg(VA + 12288, lkey),
            data_seg(CHUNK as u32, lkey, VA),
        ],
    );
    assert!(
        cq.poll(Duration::from_millis(100)).is_none(),
        "no doorbell rung: no WQE executed"
    );
    // 2. Only the last QP's doorbell survives on the register (what the watcher sees when
    //    the other N-1 were overwritten before it looked): all N are served.
    let before = hw.r.fw().hca_stats().swept_doorbells;
    hw.uar_write64(0x800, *bells.last().unwrap());
    served(&mut cq, &senders, &idx, &srcs);
    assert_eq!(
        hw.r.fw().hca_stats().swept_doorbells - before,
        N as u64 - 1,
        "the N-1 QPs whose doorbell was lost were served by the sweep"
    );
    let mut ghost = vec![0u8; CHUNK];
    data.read(12288, &mut ghost).unwrap();
    assert_eq!(
        ghost,
        vec![0u8; CHUNK],
        "no WQE read past the doorbell record"
    );

    // 3. Doorbells written back-to-back on one register, as fast as the client can: however
    //    many the watcher missed, every QP is served exactly once.
    for round in 2..6u8 {
        let mut idx = Vec::new();
        let mut srcs = Vec::new();
        let mut bells = Vec::new();
        for (i, s) in senders.iter_mut().enumerate() {
            let ((k, bell), src) = write(s, i, round);
            idx.push(k);
            srcs.push(src);
            bells.push(bell);
        }
        for b in bells {
            hw.uar_write64(0x800, b);
        }
        served(&mut cq, &senders, &idx, &srcs);
    }
    let stats = hw.r.fw().hca_stats();
    assert_eq!(stats.bad_doorbells, 0, "{stats:?}");
    assert_eq!(stats.wqe_errors, 0, "{stats:?}");
}

#[test]
fn an_injected_error_cqe_has_the_syndrome_vendor_byte_and_wqe_counter_then_flushes() {
    use rnic_mlx5_emu::hca::{CqeInjection, InjectSide};
    let mut p = pair();
    let rkey = p.peer.mr.rkey().get();
    let raddr = p.peer.mr.addr();
    let faults = p.hw.r.fw().faults();
    // Another QP's injection does not fire here.
    assert!(faults.error_cqe(CqeInjection {
        qpn: Some(p.qp.qpn + 1000),
        side: InjectSide::Send,
        syndrome: 0x13,
        vendor: 1,
    }));
    let write = |p: &mut Pair, signaled| {
        p.qp.post(
            &p.hw,
            WqeOpcode::RdmaWrite,
            signaled,
            &[raddr_seg(raddr, rkey), data_seg(16, p.lkey, VA)],
        )
    };
    let good = write(&mut p, true);
    let c = p.cq.expect();
    assert_eq!(
        (opcode(&c), Cqe64::new_unchecked(&c[..]).wqe_counter()),
        (CqeOpcode::Req, u32::from(good))
    );
    assert!(faults.error_cqe(CqeInjection {
        qpn: Some(p.qp.qpn),
        side: InjectSide::Send,
        syndrome: 0x16,
        vendor: 0xc3,
    }));
    let tx = p.hw.r.fw().hca_stats().tx_packets;
    // Unsignaled: an error CQE is written all the same.
    let bad = write(&mut p, false);
    let later = write(&mut p, true);
    let c = p.cq.expect();
    assert_eq!(opcode(&c), CqeOpcode::ReqErr, "{c:x?}");
    assert_eq!(syndrome(&c), CqeSyndrome::RnrRetryExceeded);
    assert_eq!(c[0x36], 0xc3, "vendor_err_synd");
    assert_eq!(c[0x37], 0x16, "syndrome byte");
    let e = ErrCqe::new_unchecked(&c[..]);
    assert_eq!(e.wqe_counter(), u32::from(bad));
    assert_eq!(e.qpn(), p.qp.qpn);
    assert_eq!(e.wqe_opcode(), u32::from(WqeOpcode::RdmaWrite.as_raw()));
    let c = p.cq.expect();
    assert_eq!(
        (opcode(&c), syndrome(&c)),
        (CqeOpcode::ReqErr, CqeSyndrome::WrFlushed)
    );
    assert_eq!(
        ErrCqe::new_unchecked(&c[..]).wqe_counter(),
        u32::from(later)
    );
    assert_eq!(p.qp.state(&p.hw), 6, "ERR");
    assert_eq!(
        p.hw.r.fw().hca_stats().tx_packets,
        tx,
        "neither WRITE went on the wire"
    );
    assert_eq!(p.hw.r.fw().hca_stats().injected_error_cqes, 1);
    // `clear` drops the other QP's pending injection.
    faults.clear();
}
