//! Golden round trips: set fields through the views, check the exact bytes, read them back.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use rnic_mlx5_prm::*;

#[test]
fn create_qp_in_golden_bytes() {
    let mut buf = vec![0u8; CreateQpIn::<&[u8]>::SIZE_BYTES + 16];
    let mut cmd = CreateQpIn::new_checked(&mut buf[..]).unwrap();
    cmd.set_opcode(CmdOpcode::CreateQp.as_raw().into()).unwrap();
    {
        let mut qpc = cmd.qpc_mut();
        qpc.set_state(QpState::Rst.as_raw().into()).unwrap();
        qpc.set_st(QpServiceType::Ud.as_raw().into()).unwrap();
        qpc.set_pm_state(QP_PM_STATE_MIGRATED).unwrap();
        qpc.set_pd(0xabcdef).unwrap();
        qpc.set_log_msg_max(20).unwrap();
        qpc.set_mtu(QP_MTU_4096).unwrap();
        qpc.set_dbr_addr(0x1122_3344_5566_7788).unwrap();
        let mut ads = qpc.primary_address_path_mut();
        ads.set_rgid_rip(&[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8])
            .unwrap();
        ads.set_udp_sport(0xdcba).unwrap();
    }
    cmd.set_pas(0, 0x0000_0001_2345_6000).unwrap();
    cmd.set_pas(1, 0x0000_0001_2345_7000).unwrap();
    assert!(matches!(
        cmd.set_pas(2, 1),
        Err(Error::FieldOutOfBounds { .. })
    ));
    assert_eq!(cmd.pas(1), Some(0x0000_0001_2345_7000));
    assert_eq!(cmd.pas(2), None);

    assert_eq!(buf[0..2], [0x05, 0x00]); // opcode 0x500
    assert_eq!(buf[0x18..0x1c], [0x00, 0x02, 0x18, 0x00]); // state 0, st UD, pm_state 3 @ [12:11]
    assert_eq!(buf[0x1c..0x20], [0x00, 0xab, 0xcd, 0xef]); // pd
    assert_eq!(buf[0x20], 0xb4); // mtu 5 << 5 | log_msg_max 20
    assert_eq!(
        buf[0x18 + 0xa0..0x18 + 0xa8],
        [0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88]
    );
    assert_eq!(buf[0x40..0x42], [0xfe, 0x80]); // rgid_rip at qpc + 0x28
    assert_eq!(buf[0x52..0x54], [0xdc, 0xba]); // udp_sport
    assert_eq!(buf[0x110..0x118], [0, 0, 0, 1, 0x23, 0x45, 0x60, 0x00]); // pas[0] at 0x880 bits
    assert_eq!(buf[0x118..0x120], [0, 0, 0, 1, 0x23, 0x45, 0x70, 0x00]);
    // Nothing else was touched.
    let touched: usize = buf.iter().filter(|b| **b != 0).count();
    assert_eq!(touched, 1 + 2 + 3 + 1 + 8 + 10 + 2 + 8);

    let cmd = CreateQpIn::new_checked(&buf[..]).unwrap();
    assert_eq!(cmd.opcode(), 0x500);
    assert_eq!(cmd.qpc().pd(), 0xabcdef);
    assert_eq!(cmd.qpc().log_msg_max(), 20);
    assert_eq!(
        cmd.qpc().primary_address_path().rgid_rip()[8..],
        [1, 2, 3, 4, 5, 6, 7, 8]
    );
}

#[test]
fn setters_reject_values_wider_than_the_field() {
    let mut buf = [0u8; 0xe8];
    let mut qpc = Qpc::new_checked(&mut buf[..]).unwrap();
    qpc.set_pd(0xff_ffff).unwrap();
    let err = qpc.set_pd(0x100_0000).unwrap_err();
    assert_eq!(
        err,
        Error::ValueTooWide {
            structure: "qpc",
            field: "pd",
            width: 24,
            value: 0x100_0000
        }
    );
    assert!(err.to_string().contains("qpc.pd"));
    assert_eq!(qpc.pd(), 0xff_ffff); // unchanged
    assert!(qpc.set_state(16).is_err());
    assert!(qpc.set_state(15).is_ok());
}

#[test]
fn new_checked_rejects_short_buffers() {
    let buf = [0u8; 0x10f];
    assert_eq!(
        CreateQpIn::new_checked(&buf[..]).unwrap_err(),
        Error::Truncated {
            structure: "create_qp_in",
            needed: 0x110,
            got: 0x10f
        }
    );
    assert!(matches!(
        Cqe64::new_checked(&buf[..63]),
        Err(Error::Truncated { needed: 64, .. })
    ));
    assert!(Cqe64::new_checked(&buf[..64]).is_ok());
    // An unchecked view over a short buffer never panics either.
    let short = Qpc::new_unchecked(&buf[..4]);
    assert_eq!(short.pd(), 0);
    assert_eq!(short.primary_address_path().rgid_rip(), &[] as &[u8]);
    let mut tiny = [0u8; 2];
    let mut v = Qpc::new_unchecked(&mut tiny[..]);
    assert!(matches!(v.set_pd(1), Err(Error::FieldOutOfBounds { .. })));
}

#[test]
fn cqe_parsing_golden() {
    let mut cqe = [0u8; 64];
    cqe[0x2c..0x30].copy_from_slice(&4096u32.to_be_bytes());
    cqe[0x38..0x3c].copy_from_slice(&[0x08, 0x00, 0x12, 0x34]); // RDMA_WRITE, QPN 0x1234
    cqe[0x3c..0x3e].copy_from_slice(&[0x00, 0x07]);
    cqe[0x3f] = 0x01; // REQ, owner 1
    let v = Cqe64::new_checked(&cqe[..]).unwrap();
    assert_eq!(CqeOpcode::from_raw(v.opcode() as u8), CqeOpcode::Req);
    assert_eq!(v.owner(), 1);
    assert_eq!(
        WqeOpcode::from_raw(v.wqe_opcode() as u8),
        WqeOpcode::RdmaWrite
    );
    assert_eq!(v.qpn(), 0x1234);
    assert_eq!(v.byte_cnt(), 4096);
    assert_eq!(v.wqe_counter(), 7);

    let mut err = [0u8; 64];
    err[0x37] = 0x13;
    err[0x3f] = (CqeOpcode::ReqErr.as_raw() << 4) | 1;
    let e = ErrCqe::new_checked(&err[..]).unwrap();
    assert_eq!(CqeOpcode::from_raw(e.opcode() as u8), CqeOpcode::ReqErr);
    let synd = CqeSyndrome::from_raw(e.syndrome() as u8);
    assert_eq!(synd, CqeSyndrome::RemoteAccess);
    assert_eq!(synd.ibv_wc_status(), ibv_wc_status::REM_ACCESS_ERR);

    let fresh = [CQE_OP_OWN_INIT; 1];
    assert_eq!(fresh[0] >> 4, CqeOpcode::Invalid.as_raw());
}

#[test]
fn send_wqe_golden_bytes() {
    let mut wqe = [0u8; 64];
    {
        let mut ctrl = WqeCtrlSeg::new_checked(&mut wqe[0..16]).unwrap();
        ctrl.set_wqe_index(0x0102).unwrap();
        ctrl.set_opcode(WqeOpcode::RdmaWrite.as_raw().into())
            .unwrap();
        ctrl.set_qpn(0xabcdef).unwrap();
        ctrl.set_ds(3).unwrap();
        ctrl.set_completion_mode(CompletionMode::Always.as_raw().into())
            .unwrap();
    }
    {
        let mut raddr = WqeRaddrSeg::new_checked(&mut wqe[16..32]).unwrap();
        raddr.set_raddr(0x7f00_0000_1000).unwrap();
        raddr.set_rkey(0x1234_5678).unwrap();
    }
    {
        let mut data = WqeDataSeg::new_checked(&mut wqe[32..48]).unwrap();
        data.set_byte_count(64).unwrap();
        data.set_lkey(0x0000_0100).unwrap();
        data.set_addr(0xdead_beef_0000).unwrap();
    }
    assert_eq!(wqe[0..8], [0x00, 0x01, 0x02, 0x08, 0xab, 0xcd, 0xef, 0x03]);
    assert_eq!(wqe[8..16], [0, 0, 0, 0x08, 0, 0, 0, 0]);
    assert_eq!(
        wqe[16..32],
        [
            0, 0, 0x7f, 0, 0, 0, 0x10, 0, 0x12, 0x34, 0x56, 0x78, 0, 0, 0, 0
        ]
    );
    assert_eq!(
        wqe[32..48],
        [0, 0, 0, 64, 0, 0, 1, 0, 0, 0, 0xde, 0xad, 0xbe, 0xef, 0, 0]
    );

    let mut inl = [0u8; 4];
    let mut h = WqeInlineSeg::new_checked(&mut inl[..]).unwrap();
    h.set_inline(1).unwrap();
    h.set_len(12).unwrap();
    assert_eq!(u32::from_be_bytes(inl), INLINE_SEG_FLAG | 12);
}

#[test]
fn eqe_and_events_golden() {
    let mut eqe = [0u8; 64];
    eqe[1] = EventType::PageRequest.as_raw();
    eqe[0x22..0x24].copy_from_slice(&[0x00, 0x00]);
    eqe[0x24..0x28].copy_from_slice(&(-5i32).to_be_bytes());
    eqe[0x3f] = 1;
    let v = Eqe::new_checked(&eqe[..]).unwrap();
    assert_eq!(
        EventType::from_raw(v.event_type() as u8),
        EventType::PageRequest
    );
    assert_eq!(v.pages_req_event().num_pages() as i32, -5);
    assert_eq!(v.owner(), 1);

    let mut eqe = [0u8; 64];
    let mut v = Eqe::new_checked(&mut eqe[..]).unwrap();
    v.set_event_type(EventType::Completion.as_raw().into())
        .unwrap();
    v.comp_event_mut().set_cq_number(0x00ab_cdef).unwrap();
    assert_eq!(eqe[0x38..0x3c], [0x00, 0xab, 0xcd, 0xef]);
    let mut v = Eqe::new_checked(&mut eqe[..]).unwrap();
    v.cmd_inter_comp_event_mut()
        .set_command_completion_vector(1 << 31)
        .unwrap();
    assert_eq!(eqe[0x20], 0x80);
}

#[test]
fn cmd_queue_entry_and_mailbox_golden() {
    let mut entry = [0u8; 64];
    let mut e = CmdQueueEntry::new_checked(&mut entry[..]).unwrap();
    e.set_type(CMD_TYPE_PCIE).unwrap();
    e.set_input_length(0x20).unwrap();
    e.set_input_mailbox_pointer_31_9(0x1234_5400 >> 9).unwrap();
    e.set_token(0x5a).unwrap();
    e.set_ownership(1).unwrap();
    e.set_command_input_inline_data(&[0x01, 0x02, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0])
        .unwrap();
    assert_eq!(entry[0], 0x07);
    assert_eq!(entry[4..8], [0, 0, 0, 0x20]);
    assert_eq!(entry[0x0c..0x10], [0x12, 0x34, 0x54, 0x00]);
    assert_eq!(entry[0x10..0x12], [0x01, 0x02]);
    assert_eq!(entry[0x3c], 0x5a);
    assert_eq!(entry[0x3f], 0x01);
    entry[0x3f] = 0x10 << 1; // delivery status BAD_CMD_TYPE, owned by SW
    let e = CmdQueueEntry::new_checked(&entry[..]).unwrap();
    assert_eq!(
        DeliveryStatus::from_raw(e.status() as u8),
        DeliveryStatus::BadCmdType
    );
    assert_eq!(e.ownership(), 0);

    let mut block = vec![0u8; 576];
    let mut b = CmdIfBox::new_checked(&mut block[..]).unwrap();
    b.set_next_pointer_63_32(0x1).unwrap();
    b.set_next_pointer_31_10(0x8000_0400 >> 10).unwrap();
    b.set_block_number(2).unwrap();
    b.set_token(0x5a).unwrap();
    assert_eq!(block[0x230..0x238], [0, 0, 0, 1, 0x80, 0, 0x04, 0]);
    assert_eq!(block[0x238..0x23c], [0, 0, 0, 2]);
    assert_eq!(block[0x23d], 0x5a);
}

#[test]
fn init_seg_dword_access_for_mmio() {
    // What a driver reading BAR0 + 0x14 does: host-order dword → fields.
    let dword = u32::from_be_bytes([0x12, 0x34, 0x57, 0x5c]);
    assert_eq!(
        initial_seg::log_cmdq_size.dword_offset(),
        init_seg_offset::CMDQ_ADDR_L_SZ
    );
    assert_eq!(initial_seg::log_cmdq_size.extract(dword), 5);
    assert_eq!(initial_seg::log_cmdq_stride.extract(dword), 0xc);
    assert_eq!(initial_seg::nic_state.extract(dword), 7);
    assert_eq!(
        NicState::from_raw(initial_seg::nic_state.extract(dword) as u8),
        NicState::SwReset
    );
    let written = initial_seg::nic_state.insert(dword, NicState::Disabled.as_raw().into());
    assert_eq!(written, (dword & !0x700) | 0x100);
    assert_eq!(
        initial_seg::initializing.dword_offset(),
        init_seg_offset::INITIALIZING
    );
    assert_eq!(
        initial_seg::initializing.extract(0x8000_0000),
        FW_INITIALIZING
    );
    assert_eq!(
        initial_seg::cmd_exec_to.dword_offset(),
        init_seg_offset::CMD_EXEC_TO
    );
    assert_eq!(
        initial_seg::health_counter.dword_offset(),
        init_seg_offset::HEALTH_COUNTER
    );
    assert_eq!(
        initial_seg::cmd_interface_rev.extract(0x0005_0003),
        CMD_INTERFACE_REV
    );
    // A 64-bit field spans dwords: extract declines.
    assert_eq!(initial_seg::ieee1588_clk.dword_shift(), None);
}

#[test]
fn mkey_and_roce_address_golden() {
    let mut buf = vec![0u8; CreateMkeyIn::<&[u8]>::SIZE_BYTES + 8];
    let mut cmd = CreateMkeyIn::new_checked(&mut buf[..]).unwrap();
    let mut mkc = cmd.memory_key_mkey_entry_mut();
    mkc.set_access_mode_1_0(mkey_access_mode::MTT).unwrap();
    mkc.set_lr(1).unwrap();
    mkc.set_lw(1).unwrap();
    mkc.set_rw(1).unwrap();
    mkc.set_qpn(MKEY_QPN_UNBOUND).unwrap();
    mkc.set_mkey_7_0(0x42).unwrap();
    mkc.set_len(1 << 33).unwrap();
    mkc.set_log_page_size(12).unwrap();
    let entry = 0x1_0000_0000u64 | MTT_READ_ENABLE | MTT_WRITE_ENABLE;
    cmd.set_klm_pas_mtt(0, (entry >> 32) as u32).unwrap();
    cmd.set_klm_pas_mtt(1, entry as u32).unwrap();
    assert_eq!(buf[0x10..0x14], [0, 0, 0x2d, 0x00] as [u8; 4]); // rw|lw|lr (bits 13,11,10) | MTT [9:8]
    assert_eq!(buf[0x12] & 0x03, 0x01);
    assert_eq!(buf[0x14..0x18], [0xff, 0xff, 0xff, 0x42]);
    assert_eq!(buf[0x28..0x30], [0, 0, 0, 2, 0, 0, 0, 0]);
    assert_eq!(buf[0x4b] & 0x3f, 12);
    assert_eq!(buf[0x110..0x118], [0, 0, 0, 1, 0, 0, 0, 3]);

    let mut set = [0u8; 0x30];
    let mut cmd = SetRoceAddressIn::new_checked(&mut set[..]).unwrap();
    cmd.set_roce_address_index(3).unwrap();
    let mut a = cmd.roce_address_mut();
    a.set_source_l3_address(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1])
        .unwrap();
    a.set_source_mac_47_32(0x0202).unwrap();
    a.set_source_mac_31_0(0x0304_0506).unwrap();
    a.set_roce_version(ROCE_VERSION_2).unwrap();
    a.set_roce_l3_type(ROCE_L3_TYPE_IPV4).unwrap();
    assert_eq!(set[0x08..0x0a], [0, 3]);
    assert_eq!(set[0x1c..0x20], [10, 0, 0, 1]);
    assert_eq!(set[0x22..0x28], [2, 2, 3, 4, 5, 6]);
    assert_eq!(set[0x2b], 2);
}

#[test]
fn fixed_arrays_bound_their_index() {
    let mut buf = vec![0u8; CreateEqIn::<&[u8]>::SIZE_BYTES];
    let mut cmd = CreateEqIn::new_checked(&mut buf[..]).unwrap();
    let mask = EventType::Cmd.mask_bit().unwrap() | EventType::PageRequest.mask_bit().unwrap();
    cmd.set_event_bitmask(0, mask).unwrap();
    assert_eq!(
        cmd.set_event_bitmask(4, 1).unwrap_err(),
        Error::IndexOutOfRange {
            structure: "create_eq_in",
            field: "event_bitmask",
            index: 4,
            count: 4
        }
    );
    assert_eq!(cmd.event_bitmask(3), Some(0));
    assert_eq!(cmd.event_bitmask(4), None);
    assert_eq!(buf[0x58..0x60], [0, 0, 0, 0, 0, 0, 0x0c, 0x00]);
}

/// A NIC RX rule as the driver installs one for ARP: SET_FLOW_TABLE_ENTRY with ethertype
/// 0x0806 in the outer headers and one TIR destination, reached through the nested
/// `flow_context` view (its destination list is a flexible array past the context's end).
#[test]
fn flow_table_entry_golden_bytes() {
    let mut buf = vec![0u8; SetFteIn::<&[u8]>::SIZE_BYTES + 16];
    let mut cmd = SetFteIn::new_checked(&mut buf[..]).unwrap();
    cmd.set_opcode(CmdOpcode::SetFlowTableEntry.as_raw().into())
        .unwrap();
    cmd.set_table_type(flow_table_type::NIC_RX).unwrap();
    cmd.set_table_id(0x00_0102).unwrap();
    cmd.set_flow_index(7).unwrap();
    {
        let mut fc = cmd.flow_context_mut();
        fc.set_group_id(0x33).unwrap();
        fc.set_action(flow_action::FWD_DEST).unwrap();
        fc.set_destination_list_size(1).unwrap();
        fc.match_value_mut()
            .outer_headers_mut()
            .set_ethertype(0x0806)
            .unwrap();
        let mut d = fc.destination_mut(0).expect("one destination fits");
        let mut e = d.destination_entry_mut();
        e.set_destination_type(flow_destination_type::TIR).unwrap();
        e.set_destination_id(0x00_0abc).unwrap();
        assert!(fc.destination_mut(1).is_none(), "the buffer holds one");
    }
    assert_eq!(buf[0..2], [0x09, 0x36]);
    assert_eq!(buf[0x10], 0); // table_type NIC RX at 0x10
    assert_eq!(buf[0x14..0x18], [0, 0, 0x01, 0x02]); // table_id
    assert_eq!(buf[0x20..0x24], [0, 0, 0, 7]); // flow_index
    assert_eq!(buf[0x44..0x48], [0, 0, 0, 0x33]); // flow_context.group_id
    assert_eq!(buf[0x4e..0x50], [0, 0x04]); // action FWD_DEST
    assert_eq!(buf[0x50..0x54], [0, 0, 0, 1]); // destination_list_size
    // match_value at flow_context + 0x40; outer_headers.ethertype at +6.
    assert_eq!(buf[0x80 + 6..0x80 + 8], [0x08, 0x06]);
    // destination[0] at flow_context + 0x300 = 0x340: type TIR, id 0xabc.
    assert_eq!(buf[0x340..0x348], [0x02, 0, 0x0a, 0xbc, 0, 0, 0, 0]);
    let touched = buf.iter().filter(|b| **b != 0).count();
    assert_eq!(touched, 2 + 2 + 1 + 1 + 1 + 1 + 2 + 3);

    let cmd = SetFteIn::new_checked(&buf[..]).unwrap();
    let fc = cmd.flow_context();
    let d = fc.destination(0).unwrap();
    assert_eq!(d.destination_entry().destination_id(), 0xabc);
    assert_eq!(
        d.flow_counter_id(),
        0x0200_0abc,
        "the union's other reading"
    );
    assert_eq!(fc.match_value().outer_headers().ethertype(), 0x0806);
}

/// A flow group masking the ethertype and ICMPv6 type (neighbour discovery), and the
/// match_criteria_enable bits it needs.
#[test]
fn flow_group_golden_bytes() {
    let mut buf = vec![0u8; CreateFlowGroupIn::<&[u8]>::SIZE_BYTES];
    let mut cmd = CreateFlowGroupIn::new_checked(&mut buf[..]).unwrap();
    cmd.set_start_flow_index(2).unwrap();
    cmd.set_end_flow_index(3).unwrap();
    cmd.set_match_criteria_enable(
        match_criteria::OUTER_HEADERS | match_criteria::MISC_PARAMETERS_3,
    )
    .unwrap();
    {
        let mut m = cmd.match_criteria_mut();
        m.outer_headers_mut().set_ethertype(0xffff).unwrap();
        m.outer_headers_mut().set_ip_protocol(0xff).unwrap();
        m.misc_parameters_3_mut().set_icmpv6_type(0xff).unwrap();
    }
    assert_eq!(buf[0x1c..0x20], [0, 0, 0, 2]);
    assert_eq!(buf[0x24..0x28], [0, 0, 0, 3]);
    assert_eq!(buf[0x3f], 0x11); // match_criteria_enable, bits 0 and 4
    assert_eq!(buf[0x40 + 6..0x40 + 8], [0xff, 0xff]); // outer ethertype
    assert_eq!(buf[0x40 + 0x10], 0xff); // outer ip_protocol
    // misc_parameters_3 at match_criteria + 0x100; icmpv6_type at +0x22.
    assert_eq!(buf[0x40 + 0x100 + 0x22], 0xff);
    assert_eq!(buf.iter().filter(|b| **b != 0).count(), 2 + 1 + 2 + 1 + 1);
}

/// CREATE_SQ with its `wq.pas[]` reached through two nested views, and a raw Ethernet send
/// WQE: control segment, Ethernet segment with 18 inline header bytes, one data segment.
#[test]
fn raw_ethernet_sq_and_wqe_golden_bytes() {
    let mut buf = vec![0u8; CreateSqIn::<&[u8]>::SIZE_BYTES + 8];
    let mut cmd = CreateSqIn::new_checked(&mut buf[..]).unwrap();
    {
        let mut sqc = cmd.ctx_mut();
        sqc.set_state(WqState::Rst.as_raw().into()).unwrap();
        sqc.set_min_wqe_inline_mode(inline_mode::L2).unwrap();
        sqc.set_cqn(0x0a).unwrap();
        sqc.set_tis_lst_sz(1).unwrap();
        sqc.set_tis_num_0(0x0b).unwrap();
        let mut wq = sqc.wq_mut();
        wq.set_wq_type(wq_type::CYCLIC).unwrap();
        wq.set_log_wq_stride(6).unwrap();
        wq.set_log_wq_sz(4).unwrap();
        wq.set_pas(0, 0x1_0000_2000).unwrap();
        assert!(wq.set_pas(1, 0).is_err(), "past the buffer");
    }
    assert_eq!(buf[0x20..0x22], [0x01, 0]); // sqc dw0: min_wqe_inline_mode 1 @[26:24], state RST @[23:20]
    assert_eq!(buf[0x28..0x2c], [0, 0, 0, 0x0a]); // cqn
    assert_eq!(buf[0x40..0x42], [0, 1]); // tis_lst_sz
    assert_eq!(buf[0x4c..0x50], [0, 0, 0, 0x0b]); // tis_num_0
    assert_eq!(buf[0x50], 0x10); // wq_type cyclic @[31:28]
    assert_eq!(buf[0x50 + 0x20..0x50 + 0x24], [0, 0x06, 0, 0x04]); // stride, size
    assert_eq!(buf[0x110..0x118], [0, 0, 0, 1, 0, 0, 0x20, 0]); // wq.pas[0]

    let frame: Vec<u8> = (0u8..18).collect();
    let mut wqe = [0u8; 64];
    {
        let mut ctrl = WqeCtrlSeg::new_checked(&mut wqe[0..16]).unwrap();
        ctrl.set_opcode(WqeOpcode::Send.as_raw().into()).unwrap();
        ctrl.set_qpn(0x12).unwrap(); // the SQN
        ctrl.set_ds(4).unwrap(); // ctrl + eth (+16 inline bytes) + data
        let mut eth = WqeEthSeg::new_checked(&mut wqe[16..32]).unwrap();
        eth.set_cs_flags(eth_cs_flags::L3_CSUM | eth_cs_flags::L4_CSUM)
            .unwrap();
        eth.set_inline_hdr_sz(ETH_L2_INLINE_HEADER_SIZE as u32)
            .unwrap();
        eth.set_inline_hdr_start(&[frame[0], frame[1]]).unwrap();
    }
    wqe[32..48].copy_from_slice(&frame[2..]);
    assert_eq!(wqe[16 + 4], 0xc0);
    assert_eq!(wqe[16 + 12..16 + 16], [0, 18, 0, 1]);
    assert_eq!(wqe[32..34], [2, 3]);
    let eth = WqeEthSeg::new_checked(&wqe[16..32]).unwrap();
    assert_eq!(eth.insert_type(), 18, "the union's other reading");
}

/// The received-frame flags of an Ethernet CQE.
#[test]
fn ethernet_cqe_flags_golden() {
    let mut cqe = [0u8; 64];
    cqe[0x1c] = 0x07; // L2, L3, L4 ok
    cqe[0x1d] = (cqe_l4_hdr_type::UDP << 4 | cqe_eth_l3_hdr_type::IPV4 << 2 | 1) as u8;
    cqe[0x2c..0x30].copy_from_slice(&60u32.to_be_bytes());
    let c = Cqe64::new_checked(&cqe[..]).unwrap();
    assert_eq!((c.l2_ok(), c.l3_ok(), c.l4_ok()), (1, 1, 1));
    assert_eq!(c.l4_hdr_type(), cqe_l4_hdr_type::UDP);
    assert_eq!(c.eth_l3_hdr_type(), cqe_eth_l3_hdr_type::IPV4);
    assert_eq!(c.vlan_present(), 1);
    assert_eq!(c.byte_cnt(), 60);
}
