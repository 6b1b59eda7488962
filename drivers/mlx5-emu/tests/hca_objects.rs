//! The emulated HCA's commands and events: checks and syndromes, command-completion and
//! page-request EQEs, UD against rnic-rxe, teardown accounting, and hostile inputs.
#![allow(clippy::unwrap_used)]

mod common;

use common::hw::*;

#[test]
fn command_completions_and_page_requests_are_eqes() {
    let mut hw = Hw::new();
    let mask = (1u64 << EventType::Cmd.as_raw()) | (1 << EventType::PageRequest.as_raw());
    let (eqn, ring) = hw.eq(7, 0, mask);
    let _ = hw.vectors[0].take();
    // The CREATE_EQ itself completed while the EQ existed: its EQE (slot 0) is the first.
    // It follows the command's completion, which `hw.eq` saw: wait for it.
    let mut e = wait_eqe(&ring, 7, 0);
    let v = Eqe::new_unchecked(&e[..]);
    assert_eq!(v.event_type(), u32::from(EventType::Cmd.as_raw()));
    assert_eq!(v.cmd_inter_comp_event().command_completion_vector(), 1);
    hw.uar_write32(0x40, (eqn << 24) | 1);
    // A NOP on slot 3: its completion EQE names bit 3, and the armed EQ interrupts.
    let out =
        hw.r.exec_on(
            3,
            &cmd(CmdOpcode::Nop, 0, 0x10),
            OUT,
            Default::default(),
            Duration::from_secs(5),
        )
        .out();
    assert_eq!(status(&out), (0, 0));
    assert!(
        hw.vectors[0]
            .wait(Duration::from_secs(5))
            .unwrap()
            .is_some()
    );
    ring.read(64, &mut e).unwrap();
    let v = Eqe::new_unchecked(&e[..]);
    assert_eq!(v.event_type(), u32::from(EventType::Cmd.as_raw()));
    assert_eq!(v.owner(), 0);
    assert_eq!(v.cmd_inter_comp_event().command_completion_vector(), 1 << 3);
    // The firmware counts a completion event once it is posted, its interrupt included.
    let deadline = Instant::now() + Duration::from_secs(5);
    while hw.r.fw().stats().command_events < 2 {
        assert!(Instant::now() < deadline, "{:?}", hw.r.fw().stats());
        std::thread::sleep(Duration::from_millis(1));
    }
    // The firmware asks for 5 pages at run time.
    hw.uar_write32(0x40, (eqn << 24) | 2);
    assert!(hw.r.fw().faults().request_pages(5));
    assert!(
        hw.vectors[0]
            .wait(Duration::from_secs(5))
            .unwrap()
            .is_some()
    );
    ring.read(128, &mut e).unwrap();
    let v = Eqe::new_unchecked(&e[..]);
    assert_eq!(v.event_type(), u32::from(EventType::PageRequest.as_raw()));
    assert_eq!(v.pages_req_event().num_pages() as i32, 5);
    assert_eq!(query_pages(&hw.r, query_pages_op_mod::REGULAR), 5);
    let extra: Vec<u64> = (48..53).map(|i| hw.pages.iter_page(i)).collect();
    give(&hw.r, &extra);
    assert_eq!(query_pages(&hw.r, query_pages_op_mod::REGULAR), 0);
    // And wants 2 back.
    assert!(hw.r.fw().faults().request_pages(-2));
    assert_eq!(query_pages(&hw.r, query_pages_op_mod::REGULAR), -2);
}

#[test]
fn object_checks_and_teardown_accounting() {
    let (emu_ip, _) = ip_pair();
    let mut hw = Hw::new();
    let (st, synd) = hw.set_gid(0, emu_ip);
    assert_eq!((st, synd), (0, 0));
    // Refusals: another MAC, RoCE v1, an address of no local interface.
    let IpAddr::V4(e4) = emu_ip else { panic!() };
    let o = e4.octets();
    let other = IpAddr::V4(Ipv4Addr::new(o[0], o[1], o[2], 9));
    assert_eq!(
        hw.set_gid_with(1, other, [2, 0, 0, 0, 0, 1], 2),
        (CmdStatus::BadParam.as_raw(), syn::GID_MAC)
    );
    assert_eq!(
        hw.set_gid_with(1, other, MAC, 0),
        (CmdStatus::BadParam.as_raw(), syn::GID_VERSION)
    );
    let nowhere = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 77));
    assert_eq!(
        hw.set_gid(1, nowhere),
        (CmdStatus::BadParam.as_raw(), syn::GID_BIND)
    );
    // QUERY_ROCE_ADDRESS returns what was set.
    let mut q = cmd(CmdOpcode::QueryRoceAddress, 0, 0x10);
    rnic_mlx5_prm::QueryRoceAddressIn::new_unchecked(&mut q[..])
        .set_roce_address_index(0)
        .unwrap();
    let out = hw.r.ok(&q, 0x30);
    let o = rnic_mlx5_prm::QueryRoceAddressOut::new_unchecked(&out[..]);
    let l = o.roce_address();
    assert_eq!(l.source_l3_address(), &rnic_core::Gid::from_ipv4(e4).0[..]);
    assert_eq!((l.roce_version(), l.roce_l3_type()), (2, 0));
    // Index out of range, and a CQ on a missing EQ.
    let mut c = cmd(CmdOpcode::SetRoceAddress, 0, 0x30);
    SetRoceAddressIn::new_unchecked(&mut c[..])
        .set_roce_address_index(300)
        .unwrap();
    assert_eq!(
        hw.r.err(&c, OUT),
        (CmdStatus::BadParam.as_raw(), syn::GID_INDEX)
    );
    let mut c = cmd(CmdOpcode::CreateCq, 0, 0x118);
    CreateCqIn::new_unchecked(&mut c[..])
        .cq_context_mut()
        .set_c_eqn_or_apu_element(9)
        .unwrap();
    CreateCqIn::new_unchecked(&mut c[..])
        .cq_context_mut()
        .set_uar_page(hw.uar)
        .unwrap();
    assert_eq!(
        hw.r.err(&c, OUT),
        (CmdStatus::BadRes.as_raw(), syn::EQ_NOT_FOUND)
    );
    let (eqn, _) = hw.eq(6, 1, 0);
    let mut cq = hw.cq(eqn);
    let data = hw.buf(4096);
    let key = hw.mkey(&data, VA, &["lw"]);
    let qp = EmuQp::create(&mut hw, &cq, QpServiceType::Rc);
    // Illegal transition: RTR2RTS from RST.
    assert_eq!(
        qp.modify(&hw, CmdOpcode::Rtr2RtsQp, |_| {}),
        (CmdStatus::BadQpState.as_raw(), syn::QP_STATE)
    );
    // DESTROY_CQ while the QP names it; DEALLOC_PD while objects use it; TEARDOWN with objects.
    let mut d = cmd(CmdOpcode::DestroyCq, 0, 0x10);
    d[0x09..0x0c].copy_from_slice(&cq.cqn.to_be_bytes()[1..]);
    assert_eq!(
        hw.r.err(&d, OUT),
        (CmdStatus::BadResState.as_raw(), syn::CQ_IN_USE)
    );
    let mut dp = cmd(CmdOpcode::DeallocPd, 0, 0x10);
    dp[0x09..0x0c].copy_from_slice(&hw.pd.to_be_bytes()[1..]);
    assert_eq!(
        hw.r.err(&dp, OUT),
        (CmdStatus::BadResState.as_raw(), syn::RESOURCE_IN_USE)
    );
    let a = hw.r.fw().accounting();
    assert_eq!((a.eqs, a.cqs, a.qps, a.mkeys, a.gids), (1, 1, 1, 1, 1));
    // A UD QP's flushes: 2ERR with a posted receive gives a flush CQE.
    let mut ud = EmuQp::create(&mut hw, &cq, QpServiceType::Ud);
    assert_eq!(
        ud.modify(&hw, CmdOpcode::Rst2InitQp, |q| q.set_q_key(0x1111).unwrap()),
        (0, 0)
    );
    ud.post_recv(VA, 64, key);
    assert_eq!(ud.modify(&hw, CmdOpcode::Qp2Err, |_| {}), (0, 0));
    let c = cq.expect();
    assert_eq!(
        (opcode(&c), syndrome(&c)),
        (CqeOpcode::RespErr, CqeSyndrome::WrFlushed)
    );

    // Clean teardown: QPs, MKey, CQ, EQ, PD, UAR, GID cleared by TEARDOWN_HCA, pages back.
    for q in [&qp, &ud] {
        let mut c = cmd(CmdOpcode::DestroyQp, 0, 0x10);
        c[0x09..0x0c].copy_from_slice(&q.qpn.to_be_bytes()[1..]);
        hw.r.ok(&c, OUT);
    }
    let mut c = cmd(CmdOpcode::DestroyMkey, 0, 0x10);
    c[0x09..0x0c].copy_from_slice(&(key >> 8).to_be_bytes()[1..]);
    hw.r.ok(&c, OUT);
    hw.r.ok(&d, OUT);
    let mut c = cmd(CmdOpcode::DestroyEq, 0, 0x10);
    c[0x0b] = eqn as u8;
    hw.r.ok(&c, OUT);
    hw.r.ok(&dp, OUT);
    let mut c = cmd(CmdOpcode::DeallocUar, 0, 0x10);
    c[0x09..0x0c].copy_from_slice(&hw.uar.to_be_bytes()[1..]);
    hw.r.ok(&c, OUT);
    hw.r.ok(&cmd(CmdOpcode::TeardownHca, 0, 0x10), OUT);
    assert!(
        hw.r.fw().bound_addresses().is_empty(),
        "GIDs unbound at teardown"
    );
    let mut t = cmd(CmdOpcode::ManagePages, manage_pages_op_mod::TAKE, 0x10);
    ManagePagesIn::new_unchecked(&mut t[..])
        .set_input_num_entries(64)
        .unwrap();
    hw.r.ok(&t, 0x10 + 8 * 64);
    hw.r.ok(&cmd(CmdOpcode::DisableHca, 0, 0x10), OUT);
    assert_eq!(hw.r.fw().phase(), Phase::Disabled);
    drop((qp, ud, cq, data));
    let Hw {
        r,
        pages,
        bufs,
        vectors,
        ..
    } = hw;
    drop((pages, bufs, vectors));
    let Rig {
        emu,
        f,
        cmdq,
        inbox,
        outbox,
        ..
    } = r;
    drop((cmdq, inbox, outbox));
    drop(f);
    let fw = emu.firmware().unwrap().clone();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !fw.accounting().is_clean() {
        assert!(
            Instant::now() < deadline,
            "left behind: {:?}",
            fw.accounting()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn ud_both_ways_against_rxe() {
    let (emu_ip, peer_ip) = ip_pair();
    let mut hw = Hw::new();
    assert_eq!(hw.set_gid(0, emu_ip), (0, 0));
    let ceq = hw.eq(6, 1, 0);
    let mut cq = hw.cq(ceq.0);
    let data = hw.buf(4 * 4096);
    let lkey = hw.mkey(&data, VA, &["lw"]);
    let mut qp = EmuQp::create(&mut hw, &cq, QpServiceType::Ud);
    let qkey = 0x1111_1111;
    assert_eq!(
        qp.modify(&hw, CmdOpcode::Rst2InitQp, |q| q.set_q_key(qkey).unwrap()),
        (0, 0)
    );
    assert_eq!(qp.modify(&hw, CmdOpcode::Init2RtrQp, |_| {}), (0, 0));
    assert_eq!(
        qp.modify(&hw, CmdOpcode::Rtr2RtsQp, |q| q
            .set_next_send_psn(5)
            .unwrap()),
        (0, 0)
    );
    let mut peer = Peer::with(peer_ip, QpType::Ud);
    let IpAddr::V4(e4) = emu_ip else { panic!() };
    let IpAddr::V4(p4) = peer_ip else { panic!() };
    peer.qp
        .to_init(&InitParams {
            qkey,
            ..InitParams::default()
        })
        .unwrap();
    peer.qp
        .to_rtr(
            rnic_core::Qpn::from_wire(0),
            Psn::from_wire(0),
            rnic_core::Gid::from_ipv4(e4),
            &RtrParams {
                path_mtu: Mtu::Mtu1024,
                ..RtrParams::default()
            },
        )
        .unwrap();
    peer.qp
        .to_rts(Psn::from_wire(0x22), &RtsParams::default())
        .unwrap();

    // Emulator → peer: ctrl + datagram segment (3 DS) + one data segment.
    let msg = pattern(500, 21);
    data.write(0, &msg).unwrap();
    let rsge = [Sge::new(peer.mr.addr(), 40 + 1024, peer.mr.lkey())];
    peer.qp
        .post_recv(&[rnic_core::RecvWr {
            wr_id: 3,
            sg_list: &rsge,
        }])
        .unwrap();
    let mut av = [0u8; 48];
    {
        let mut v = rnic_mlx5_prm::UdAdrsVector::new_unchecked(&mut av[..]);
        v.set_q_key(qkey).unwrap();
        v.set_destination_qp_dct(peer.qp.qpn().get()).unwrap();
        v.set_hop_limit(64).unwrap();
        v.set_src_addr_index(0).unwrap();
        v.set_rgid_rip(&rnic_core::Gid::from_ipv4(p4).0).unwrap();
    }
    let mut segs = [[0u8; 16]; 4];
    for (i, s) in segs.iter_mut().take(3).enumerate() {
        s.copy_from_slice(&av[i * 16..i * 16 + 16]);
    }
    segs[3] = data_seg(500, lkey, VA);
    let idx = qp.post(&hw, WqeOpcode::Send, true, &segs);
    let c = cq.expect();
    assert_eq!(opcode(&c), CqeOpcode::Req, "{c:x?}");
    assert_eq!(Cqe64::new_unchecked(&c[..]).wqe_counter(), u32::from(idx));
    let wc = peer.wait(1);
    assert_eq!(wc[0].status, WcStatus::Success);
    assert_eq!(wc[0].src_qp.get(), qp.qpn);
    assert_eq!(wc[0].byte_len, 540);
    assert_eq!(peer.bytes(40, 500), msg);

    // Peer → emulator: the GRH area first, then the payload; source QPN in the CQE.
    let ridx = qp.post_recv(VA + 4096, 40 + 1024, lkey);
    let back = pattern(700, 33);
    peer.mem.write(8192, &back).unwrap();
    let sge = [Sge::new(peer.mr.addr() + 8192, 700, peer.mr.lkey())];
    let to_emu = peer
        ._pd
        .create_ah(&rnic_core::AddressVector::new(rnic_core::Gid::from_ipv4(
            e4,
        )))
        .unwrap();
    peer.qp
        .post_send(&[SendWr {
            wr_id: 4,
            op: SendOp::SendWithImm { imm: 0xabc },
            sg_list: &sge,
            flags: SendFlags::SIGNALED,
            ud: Some(to_emu.ud_dest(rnic_core::Qpn::from_wire(qp.qpn), qkey)),
        }])
        .unwrap();
    let c = cq.expect();
    let v = Cqe64::new_unchecked(&c[..]);
    assert_eq!(opcode(&c), CqeOpcode::RespSendImm, "{c:x?}");
    assert_eq!(
        (v.byte_cnt(), v.imm_inval_pkey(), v.rqpn()),
        (740, 0xabc, peer.qp.qpn().get())
    );
    assert_eq!((v.wqe_counter(), v.g()), (u32::from(ridx), 1));
    let mut got = vec![0u8; 700];
    data.read(4096 + 40, &mut got).unwrap();
    assert_eq!(got, back);
}

#[test]
fn hostile_command_bytes_never_crash_the_firmware() {
    let hw = Hw::new();
    let mut n = Noise(0x9e37_79b9_7f4a_7c15);
    let ops = [
        CmdOpcode::SetRoceAddress,
        CmdOpcode::QueryRoceAddress,
        CmdOpcode::CreateEq,
        CmdOpcode::DestroyEq,
        CmdOpcode::CreateCq,
        CmdOpcode::DestroyCq,
        CmdOpcode::CreateMkey,
        CmdOpcode::DestroyMkey,
        CmdOpcode::CreateQp,
        CmdOpcode::DestroyQp,
        CmdOpcode::Rst2InitQp,
        CmdOpcode::Init2RtrQp,
        CmdOpcode::Rtr2RtsQp,
        CmdOpcode::Qp2Err,
        CmdOpcode::Qp2Rst,
        CmdOpcode::QueryQp,
    ];
    for op in ops {
        for _ in 0..40 {
            let mut c = vec![0u8; 0x110 + 8 * (n.next() % 8) as usize];
            n.fill(&mut c);
            let mut h = rnic_mlx5_prm::MboxIn::new_unchecked(&mut c[..]);
            h.set_opcode(op.as_raw().into()).unwrap();
            h.set_uid(0).unwrap();
            let out = hw.r.exec(&c, 0x110 + 16);
            assert!(
                matches!(out, common::Reply::Done(_)),
                "{op}: no completion: {out:?}"
            );
        }
    }
    // Still serving.
    assert_eq!(status(&hw.r.ok(&cmd(CmdOpcode::Nop, 0, 0x10), OUT)), (0, 0));
}

#[test]
fn hostile_wqes_and_doorbells_never_crash_the_data_path() {
    let mut p = pair();
    let mut n = Noise(0x1234_5678_9abc_def1);
    for round in 0..200 {
        // Random ring contents, random counters, random doorbells of every kind.
        let mut junk = vec![0u8; 2 * 4096];
        n.fill(&mut junk);
        p.qp.wq.write(0, &junk).unwrap();
        let mut dbr = [0u8; 8];
        n.fill(&mut dbr);
        p.qp.dbr.write(0, &dbr).unwrap();
        let v = n.next();
        let off = [0x20usize, 0x800, 0x900, 0xa00][round % 4];
        p.hw.uar_write64(off, (v & !0xffff_ff00) | (u64::from(p.qp.qpn) << 8));
        p.hw.uar_write32(0x40 + 8 * (round % 2), n.next() as u32);
        if round % 50 == 0 {
            // A peer SEND lands on whatever the RQ holds.
            let sge = [Sge::new(p.peer.mr.addr(), 64, p.peer.mr.lkey())];
            let _ = p.peer.qp.post_send(&[SendWr {
                wr_id: round as u64,
                op: SendOp::Send,
                sg_list: &sge,
                flags: SendFlags::SIGNALED,
                ud: None,
            }]);
        }
    }
    std::thread::sleep(Duration::from_millis(50));
    // Still serving commands; the QP answers QUERY_QP (in whatever state it ended).
    assert_eq!(
        status(&p.hw.r.ok(&cmd(CmdOpcode::Nop, 0, 0x10), OUT)),
        (0, 0)
    );
    let st = p.qp.state(&p.hw);
    assert!(st <= 7, "{st}");
    let stats = p.hw.r.fw().hca_stats();
    assert!(
        stats.wqe_errors + stats.bad_doorbells + stats.cqes > 0,
        "{stats:?}"
    );
}

/// INIT2RTR of an RC QP at path MTU enum `mtu` (1 = 256 … 5 = 4096, mlx5.md qpc dw 0x20).
fn init2rtr_at(hw: &Hw, qp: &EmuQp, peer: u32, ip: IpAddr, mtu: u32) -> (u8, u32) {
    qp.modify(hw, CmdOpcode::Init2RtrQp, |q| {
        q.set_mtu(mtu).unwrap();
        q.set_log_msg_max(20).unwrap();
        q.set_remote_qpn(peer).unwrap();
        q.set_min_rnr_nak(12).unwrap();
        let mut a = q.primary_address_path_mut();
        a.set_src_addr_index(0).unwrap();
        a.set_rgid_rip(&gid_of(ip)).unwrap();
        a.set_hop_limit(64).unwrap();
        a.set_vhca_port_num(1).unwrap();
    })
}

#[test]
fn path_mtu_must_fit_the_vport_mtu() {
    let (ip, _) = ip_pair();
    let mut hw = Hw::new();
    assert_eq!(hw.set_gid(0, ip), (0, 0));
    let ceq = hw.eq(6, 1, 0);
    let cq = hw.cq(ceq.0);
    let qps: Vec<EmuQp> = (0..3)
        .map(|_| EmuQp::create(&mut hw, &cq, QpServiceType::Rc))
        .collect();
    for qp in &qps {
        let st = qp.modify(&hw, CmdOpcode::Rst2InitQp, |q| {
            q.primary_address_path_mut().set_vhca_port_num(1).unwrap();
        });
        assert_eq!(st, (0, 0));
    }
    let bad = (CmdStatus::BadParam.as_raw(), syn::QP_ATTR);
    // The power-on vport MTU (9000) takes path MTU 4096; enums 0, 6, 7 are no MTU.
    let out =
        hw.r.ok(&cmd(CmdOpcode::QueryNicVportContext, 0, 0x10), 0x110);
    let vport = rnic_mlx5_prm::QueryNicVportContextOut::new_unchecked(&out[..]);
    assert_eq!(vport.nic_vport_context().mtu(), 9000);
    for m in [0, 6, 7] {
        assert_eq!(
            init2rtr_at(&hw, &qps[0], qps[1].qpn, ip, m),
            bad,
            "enum {m}"
        );
    }
    assert_eq!(init2rtr_at(&hw, &qps[0], qps[1].qpn, ip, 5), (0, 0));
    // A 1500-byte vport: 1024 + 96 fits, 2048 + 96 does not.
    let mut m = cmd(CmdOpcode::ModifyNicVportContext, 0, 0x200);
    let mut v = ModifyNicVportContextIn::new_unchecked(&mut m[..]);
    v.field_select_mut().set_mtu(1).unwrap();
    v.nic_vport_context_mut().set_mtu(1500).unwrap();
    hw.r.ok(&m, OUT);
    assert_eq!(init2rtr_at(&hw, &qps[1], qps[0].qpn, ip, 4), bad);
    assert_eq!(init2rtr_at(&hw, &qps[1], qps[0].qpn, ip, 3), (0, 0));
    assert_eq!(init2rtr_at(&hw, &qps[2], qps[0].qpn, ip, 5), bad);
}
