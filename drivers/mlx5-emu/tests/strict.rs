//! The firmware checks and fault hooks of issue 26 (audit rows 2, 3, 8, 9, 10, 14, 15, 17, 18,
//! 19, 20, 21), each with strictness on and, where it is a check, with the legacy setting that
//! reproduces the emulator before it. Hand-built commands through the test client of
//! `tests/common`, as in tests/firmware.rs.
#![allow(clippy::unwrap_used)]

mod common;

use common::hw::*;
use common::{Reply, Tweak};
use rnic_mlx5_emu::firmware::cmdq::ReplyRewrite;
use rnic_mlx5_emu::firmware::exec::{CAP_TAIL_PATTERN, TERMINATE_SCATTER_KEY};
use rnic_mlx5_emu::{Emulator, PortSpeed, PortType};
use rnic_mlx5_prm::{
    AccessRegisterIn, CmdHcaCap, CmdQueueEntry, HealthSyndrome, NicState, PtysReg,
    QuerySpecialContextsOut, QueryVportStateOut, SetRoceAddressIn, access_reg_op_mod,
    access_register_in, health_buffer, init_seg_offset, initial_seg, ptys_proto, register_id,
};

fn st(s: CmdStatus) -> u8 {
    s.as_raw()
}

fn query_cap(r: &Rig, t: u32, current: bool) -> Vec<u8> {
    let out = r.ok(
        &cmd(CmdOpcode::QueryHcaCap, (t << 1) | u32::from(current), 0x10),
        0x1010,
    );
    out[query_hca_cap_out::cmd_hca_cap.byte_offset()..].to_vec()
}

fn set_cap(t: u32, area: &[u8]) -> Vec<u8> {
    let mut c = cmd(CmdOpcode::SetHcaCap, t << 1, 0x1010);
    c[0x10..].copy_from_slice(&area[..0x1000]);
    c
}

/// Row 17: with `cap-payload` QUERY_HCA_CAP fills the capability area past the structure with
/// a pattern, and SET_HCA_CAP refuses an area whose bytes past the structure are not zero —
/// so a driver that echoes all 0x1000 bytes (as rnic-mlx5 did) is refused, one that sends the
/// structure only (K, RC) is not. Legacy: the area reads zero and an echo passes.
#[test]
fn set_hca_cap_must_send_the_structure_only() {
    let r = Rig::with(strict());
    let _pages = boot(&r);
    for (t, size) in [(cap_type::GENERAL, 0x100), (cap_type::ROCE, 0x100)] {
        for current in [true, false] {
            let area = query_cap(&r, t, current);
            assert!(
                area[size..0x1000].iter().all(|&b| b == CAP_TAIL_PATTERN),
                "type {t}: the reserved area is the pattern"
            );
        }
        let echo = query_cap(&r, t, true);
        assert_eq!(
            r.err(&set_cap(t, &echo), OUT),
            (st(CmdStatus::BadParam), syn::CAP_PAYLOAD),
            "type {t}: echoing the whole area"
        );
        let mut own = echo.clone();
        own[size..].fill(0);
        r.ok(&set_cap(t, &own), OUT);
    }
    // One stray byte at the end of the area is enough.
    let mut one = query_cap(&r, cap_type::GENERAL, true);
    one[0x100..].fill(0);
    one[0xfff] = 1;
    assert_eq!(
        r.err(&set_cap(cap_type::GENERAL, &one), OUT),
        (st(CmdStatus::BadParam), syn::CAP_PAYLOAD)
    );

    let r = Rig::with(legacy());
    let _pages = boot(&r);
    let area = query_cap(&r, cap_type::GENERAL, true);
    assert!(area[0x100..].iter().all(|&b| b == 0), "legacy: zeros");
    r.ok(&set_cap(cap_type::GENERAL, &area), OUT);
}

/// Row 18: with `cmdif-rev`, `cmd_interface_rev` reads 0 while `initializing` is set, after
/// power-on and after every reset; it reads 5 once the firmware is ready. Legacy: 5 at once.
#[test]
fn the_command_interface_revision_is_valid_only_once_initialized() {
    let read = |f: &rnic_mlx5::VfioUserFunction| {
        let bar = f.bar0();
        let rev = initial_seg::cmd_interface_rev
            .extract(bar.read32_be(init_seg_offset::CMDIF_REV_FW_SUB).unwrap());
        let busy = initial_seg::initializing
            .extract(bar.read32_be(init_seg_offset::INITIALIZING).unwrap());
        (rev, busy)
    };
    let wait_ready = |f: &rnic_mlx5::VfioUserFunction| {
        let deadline = Instant::now() + Duration::from_secs(5);
        while read(f).1 != 0 {
            assert!(Instant::now() < deadline);
            std::thread::sleep(Duration::from_millis(2));
        }
    };
    for (strictness, early) in [(Strictness::strict(), 0), (Strictness::legacy(), 5)] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mlx5.sock");
        let o = Options {
            boot_delay: Duration::from_millis(300),
            ..options(strictness, FirmwareOptions::default())
        };
        let emu = Emulator::start(&path, o).unwrap();
        let f = rnic_mlx5::VfioUserFunction::connect(&path).unwrap();
        assert_eq!(read(&f), (early, 1), "{strictness:?}: right after power-on");
        wait_ready(&f);
        assert_eq!(read(&f), (5, 0), "ready");
        f.reset().unwrap();
        assert_eq!(read(&f), (early, 1), "right after a reset");
        wait_ready(&f);
        assert_eq!(read(&f).0, 5);
        drop(f);
        emu.shutdown();
    }
}

fn create_cq_cmd(hw: &mut Hw, eqn: u32, pas: usize) -> Vec<u8> {
    let ring = hw.buf(2 * 4096);
    let dbr = hw.buf(4096);
    let mut c = cmd(CmdOpcode::CreateCq, 0, 0x110 + 8 * pas);
    let mut v = CreateCqIn::new_unchecked(&mut c[..]);
    let mut x = v.cq_context_mut();
    x.set_log_cq_size(6).unwrap();
    x.set_uar_page(hw.uar).unwrap();
    x.set_c_eqn_or_apu_element(eqn).unwrap();
    x.set_dbr_addr(dbr.iova().0).unwrap();
    for p in 0..pas {
        v.set_pas(p, ring.iova().0 + 4096 * p as u64).unwrap();
    }
    c
}

/// Row 19: with `cq-pas`, a CREATE_CQ whose `inlen` lists more pages than the ring has (the
/// driver's extra doorbell-record page) is refused; the exact list passes. Legacy: the extra
/// entry is ignored.
#[test]
fn create_cq_lists_exactly_the_rings_pages() {
    let mut hw = Hw::with(strict());
    let (eqn, _) = hw.eq(4, 0, 0);
    let long = create_cq_cmd(&mut hw, eqn, 2);
    assert_eq!(
        hw.r.err(&long, OUT),
        (st(CmdStatus::BadParam), syn::CQ_PAS_LENGTH)
    );
    assert_eq!(hw.r.fw().accounting().cqs, 0);
    let exact = create_cq_cmd(&mut hw, eqn, 1);
    hw.r.ok(&exact, OUT);

    let mut hw = Hw::with(legacy());
    let (eqn, _) = hw.eq(4, 0, 0);
    let long = create_cq_cmd(&mut hw, eqn, 2);
    hw.r.ok(&long, OUT);
}

fn ptys_cmd(op_mod: u32, port: u32, proto: u32) -> Vec<u8> {
    let at = access_register_in::register_data.byte_offset();
    let mut c = cmd(CmdOpcode::AccessReg, op_mod, at + 0x40);
    AccessRegisterIn::new_unchecked(&mut c[..])
        .set_register_id(register_id::PTYS)
        .unwrap();
    let mut p = PtysReg::new_unchecked(&mut c[at..]);
    p.set_local_port(port).unwrap();
    p.set_proto_mask(proto).unwrap();
    c
}

fn ptys(r: &Rig) -> (u32, u32, u32) {
    let at = access_register_in::register_data.byte_offset();
    let out = r.ok(
        &ptys_cmd(access_reg_op_mod::READ, 1, ptys_proto::ETH),
        at + 0x40,
    );
    let p = PtysReg::new_unchecked(&out[at..]);
    assert_eq!((p.local_port(), p.proto_mask()), (1, ptys_proto::ETH));
    (
        p.eth_proto_capability(),
        p.eth_proto_admin(),
        p.eth_proto_oper(),
    )
}

fn vport_state(r: &Rig) -> (u32, u32) {
    let out = r.ok(&cmd(CmdOpcode::QueryVportState, 0, 0x10), OUT);
    let o = QueryVportStateOut::new_unchecked(&out[..]);
    (o.admin_state(), o.state())
}

/// Row 8: PTYS reports the configured speed as capability, admin and (link up) oper;
/// `set_link` moves QUERY_VPORT_STATE and PTYS oper, and posts PORT_CHANGE EQEs (down 1,
/// active 4, port 1 at EQE+0x28 bits 7:4). PTYS's refusals: port, protocol, write, length.
#[test]
fn ptys_and_vport_state_follow_the_link() {
    let mut hw = Hw::with(Options {
        boot_delay: Duration::from_millis(1),
        firmware: FirmwareOptions {
            port_speed: PortSpeed::G25,
            ..FirmwareOptions::default()
        },
        ..Options::default()
    });
    let g25 = 1 << 27;
    assert_eq!(ptys(&hw.r), (g25, g25, g25));
    assert_eq!(vport_state(&hw.r), (1, 1));
    let (_, ring) = hw.eq(3, 0, 1 << EventType::PortChange.as_raw());
    let faults = hw.r.fw().faults();
    assert!(faults.set_link(false), "an EQ took the event");
    assert!(!faults.set_link(false), "no change, no event");
    assert_eq!(vport_state(&hw.r), (1, 0));
    assert_eq!(ptys(&hw.r), (g25, g25, 0), "no oper speed while down");
    let e = wait_eqe(&ring, 3, 0);
    assert_eq!(
        Eqe::new_unchecked(&e[..]).event_type(),
        u32::from(EventType::PortChange.as_raw())
    );
    assert_eq!((e[3], e[0x28] >> 4), (1, 1), "sub_type down, port 1");
    assert!(faults.set_link(true));
    let e = wait_eqe(&ring, 3, 1);
    assert_eq!((e[1], e[3], e[0x28] >> 4), (0x09, 4, 1), "active");
    assert_eq!(vport_state(&hw.r), (1, 1));
    assert_eq!(ptys(&hw.r).2, g25);

    let at = access_register_in::register_data.byte_offset();
    let (rd, wr, eth) = (
        access_reg_op_mod::READ,
        access_reg_op_mod::WRITE,
        ptys_proto::ETH,
    );
    let param = |s| (st(CmdStatus::BadParam), s);
    for ((op_mod, port, proto), outlen, want) in [
        ((rd, 2, eth), at + 0x40, param(syn::REGISTER_PORT)),
        (
            (rd, 1, ptys_proto::IB),
            at + 0x40,
            param(syn::REGISTER_PROTO),
        ),
        ((wr, 1, eth), at + 0x40, param(syn::REGISTER_READ_ONLY)),
        (
            (rd, 1, eth),
            at + 0x20,
            (st(CmdStatus::BadOutpLen), syn::REGISTER_LENGTH),
        ),
    ] {
        assert_eq!(hw.r.err(&ptys_cmd(op_mod, port, proto), outlen), want);
    }
    assert_eq!(PortSpeed::G100.eth_proto_bit(), 1 << 20, "100GBASE_CR4");
}

/// Row 9: on an InfiniBand port (cap `port_type` 0) enabling RoCE and programming a GID are
/// refused with `ROCE_ON_IB_PORT`; turning RoCE off is not.
#[test]
fn an_infiniband_port_refuses_roce_setup() {
    let r = Rig::with(options(
        Strictness::strict(),
        FirmwareOptions {
            port_type: PortType::Ib,
            ..FirmwareOptions::default()
        },
    ));
    let pages = boot(&r);
    assert_eq!(
        CmdHcaCap::new_unchecked(&query_cap(&r, cap_type::GENERAL, true)[..]).port_type(),
        0
    );
    let init = query_pages(&r, query_pages_op_mod::INIT) as usize;
    give(
        &r,
        &(16..16 + init)
            .map(|i| pages.iter_page(i))
            .collect::<Vec<_>>(),
    );
    r.ok(&cmd(CmdOpcode::InitHca, 0, 0x20), OUT);
    let modify = |on: u32| {
        let mut m = cmd(CmdOpcode::ModifyNicVportContext, 0, 0x200);
        let mut v = ModifyNicVportContextIn::new_unchecked(&mut m[..]);
        v.field_select_mut().set_roce_en(1).unwrap();
        v.nic_vport_context_mut().set_roce_en(on).unwrap();
        m
    };
    assert_eq!(
        r.err(&modify(1), OUT),
        (st(CmdStatus::BadParam), syn::ROCE_ON_IB_PORT)
    );
    r.ok(&modify(0), OUT);
    let mut c = cmd(CmdOpcode::SetRoceAddress, 0, 0x30);
    let mut v = SetRoceAddressIn::new_unchecked(&mut c[..]);
    v.roce_address_mut()
        .set_source_l3_address(&gid_of(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1))))
        .unwrap();
    assert_eq!(
        r.err(&c, OUT),
        (st(CmdStatus::BadParam), syn::ROCE_ON_IB_PORT)
    );
}

/// Row 15: with cap `num_vhca_ports` 2, SET/QUERY_ROCE_ADDRESS must name port 1 or 2 (0 and 3
/// refused, `GID_PORT`); with 0 (the default) it must be 0.
#[test]
fn vhca_port_num_follows_the_cap() {
    let hw = Hw::with(options(
        Strictness::strict(),
        FirmwareOptions {
            num_vhca_ports: 2,
            ..FirmwareOptions::default()
        },
    ));
    let (ip, _) = ip_pair();
    let gid = |port: u32| {
        let mut c = cmd(CmdOpcode::SetRoceAddress, 0, 0x30);
        let mut v = SetRoceAddressIn::new_unchecked(&mut c[..]);
        v.set_vhca_port_num(port).unwrap();
        let mut l = v.roce_address_mut();
        l.set_source_l3_address(&gid_of(ip)).unwrap();
        l.set_source_mac_47_32(0x0200).unwrap();
        l.set_source_mac_31_0(0x15b3_1017).unwrap();
        l.set_roce_version(2).unwrap();
        status(&hw.r.exec(&c, OUT).out())
    };
    let refused = (st(CmdStatus::BadParam), syn::GID_PORT);
    assert_eq!(gid(0), refused);
    assert_eq!(gid(3), refused);
    assert_eq!(gid(1), (0, 0));
    assert_eq!(gid(2), (0, 0));
    let query = |port: u32| status(&hw.r.exec(&query_gid(port), 0x30).out());
    assert_eq!(query(0), refused);
    assert_eq!(query(1), (0, 0));

    let hw = Hw::with(strict());
    assert_eq!(hw.set_gid(0, ip_pair().0), (0, 0), "port 0 with the cap 0");
    assert_eq!(status(&hw.r.exec(&query_gid(1), 0x30).out()), refused);
}

fn query_gid(port: u32) -> Vec<u8> {
    let mut c = cmd(CmdOpcode::QueryRoceAddress, 0, 0x10);
    rnic_mlx5_prm::QueryRoceAddressIn::new_unchecked(&mut c[..])
        .set_vhca_port_num(port)
        .unwrap();
    c
}

/// Row 21: with the option, cap `terminate_scatter_list_mkey` is set and
/// QUERY_SPECIAL_CONTEXTS names the firmware's key; without, the cap is 0 and so is the key.
/// (That the key, not 0x100, ends a receive list is tests/strict_hca.rs's.)
#[test]
fn query_special_contexts_names_the_terminator_when_the_cap_says_so() {
    for (on, key) in [(true, TERMINATE_SCATTER_KEY), (false, 0)] {
        let hw = Hw::with(options(
            Strictness::strict(),
            FirmwareOptions {
                terminate_scatter_key: on,
                ..FirmwareOptions::default()
            },
        ));
        let q = cmd(CmdOpcode::QueryHcaCap, (cap_type::GENERAL << 1) | 1, 0x10);
        let out = hw.r.ok(&q, 0x1010);
        let cap = CmdHcaCap::new_unchecked(&out[0x10..]);
        assert_eq!(cap.terminate_scatter_list_mkey(), u32::from(on));
        let out =
            hw.r.ok(&cmd(CmdOpcode::QuerySpecialContexts, 0, 0x10), 0x20);
        let o = QuerySpecialContextsOut::new_unchecked(&out[..]);
        assert_eq!(o.terminate_scatter_list_mkey(), key);
        assert_eq!(o.resd_lkey(), 0);
    }
    assert_ne!(TERMINATE_SCATTER_KEY, 0x100);
}

/// Row 10: `take_zero(2)` answers the next two MANAGE_PAGES takes with 0 entries (status OK,
/// nothing returned), then takes return the pages again.
#[test]
fn take_zero_returns_nothing_twice_then_the_pages() {
    let r = Rig::with(strict());
    let pages = boot(&r);
    assert_eq!(r.fw().accounting().pages_held, 16);
    r.fw().faults().take_zero(2);
    let take = |n: u32| {
        let mut c = cmd(CmdOpcode::ManagePages, manage_pages_op_mod::TAKE, 0x10);
        ManagePagesIn::new_unchecked(&mut c[..])
            .set_input_num_entries(n)
            .unwrap();
        let out = r.ok(&c, 0x10 + 8 * n as usize);
        rnic_mlx5_prm::ManagePagesOut::new_unchecked(&out[..]).output_num_entries()
    };
    assert_eq!(take(16), 0);
    assert_eq!(take(16), 0);
    assert_eq!(r.fw().accounting().pages_held, 16, "nothing taken");
    assert_eq!(take(16), 16);
    assert_eq!(r.fw().accounting().pages_held, 0);
    assert_eq!(r.fw().stats().take_zeroed, 2);
    drop(pages);
}

/// Row 14: a reply whose output-mailbox tokens, block numbers and entry token the firmware
/// rewrote still carries the right data; the next reply is written as usual.
#[test]
fn a_rewritten_reply_keeps_its_data() {
    let r = Rig::with(strict());
    let _pages = boot(&r);
    let clean = query_cap(&r, cap_type::GENERAL, true);
    r.fw().faults().rewrite_next_reply(ReplyRewrite {
        mailbox_tokens: true,
        block_numbers: true,
        entry_token: true,
    });
    let q = cmd(CmdOpcode::QueryHcaCap, (cap_type::GENERAL << 1) | 1, 0x10);
    let out = r.exec(&q, 0x1010).out();
    assert_eq!(status(&out), (0, 0));
    assert_eq!(&out[0x10..], &clean[..], "the data is intact");
    for k in 0..8 {
        let raw = Rig::block(&r.outbox, k);
        let b = rnic_mlx5_prm::CmdIfBox::new_unchecked(&raw[..]);
        assert_eq!(b.token(), u32::from(r.token ^ 0xff), "block {k} token");
        assert_eq!(b.block_number(), k as u32 + 1, "block {k} number");
    }
    let e = r.entry(0);
    assert_eq!(
        CmdQueueEntry::new_unchecked(&e[..]).token(),
        u32::from(r.token ^ 0xff)
    );
    assert_eq!(r.fw().stats().rewritten_replies, 1);
    let out = r.exec(&q, 0x1010).out();
    assert_eq!(&out[0x10..], &clean[..]);
    let b = Rig::block(&r.outbox, 3);
    let b = rnic_mlx5_prm::CmdIfBox::new_unchecked(&b[..]);
    assert_eq!(
        (b.token(), b.block_number()),
        (u32::from(r.token), 3),
        "not rewritten"
    );
}

fn health_word(r: &Rig, field: rnic_mlx5_prm::FieldLayout) -> u32 {
    let at = init_seg_offset::HEALTH_BUFFER + field.dword_offset();
    field.extract(r.f.bar0().read32_be(at).unwrap())
}

fn counter(r: &Rig) -> u32 {
    initial_seg::health_counter.extract(
        r.f.bar0()
            .read32_be(init_seg_offset::HEALTH_COUNTER)
            .unwrap(),
    )
}

fn ticks(r: &Rig) -> bool {
    let c0 = counter(r);
    std::thread::sleep(Duration::from_millis(150));
    counter(r) != c0
}

/// Rows 2, 3: a syndrome without `rfr` is a warning — `synd` set, `rfr` clear, the counter
/// ticks, commands are served; with `rfr` it is fatal — `rfr` set, the counter stops, rings are
/// ignored. NIC interface state disabled / SW reset reads in `cmdq_addr_l_sz` bits 10:8 (and
/// stays there when the driver rewrites the register), commands are ignored; a reset clears
/// every one of them.
#[test]
fn health_syndromes_with_and_without_rfr_and_nic_interface_states() {
    let r = Rig::with(strict());
    r.ok(&cmd(CmdOpcode::EnableHca, 0, 0x10), OUT);
    let faults = r.fw().faults();
    let nop = cmd(CmdOpcode::Nop, 0, 0x10);
    assert!(faults.health(HealthSyndrome::HighTemp, false));
    assert_eq!(health_word(&r, health_buffer::synd), 0x10);
    assert_eq!(health_word(&r, health_buffer::rfr), 0);
    assert!(ticks(&r), "the counter keeps ticking");
    r.ok(&nop, OUT);

    assert!(faults.health(HealthSyndrome::FwInternal, true));
    assert_eq!(
        (
            health_word(&r, health_buffer::synd),
            health_word(&r, health_buffer::rfr)
        ),
        (0x01, 1)
    );
    assert!(!ticks(&r), "the counter stopped");
    assert_eq!(
        r.exec_on(0, &nop, OUT, Tweak::default(), Duration::from_millis(200)),
        Reply::Timeout
    );
    assert!(r.fw().stats().ignored_dead >= 1);
    r.f.reset().unwrap();
    assert_eq!(
        (
            health_word(&r, health_buffer::synd),
            health_word(&r, health_buffer::rfr)
        ),
        (0, 0),
        "a reset clears it"
    );

    for state in [NicState::Disabled, NicState::SwReset] {
        let r = Rig::with(strict());
        r.ok(&cmd(CmdOpcode::EnableHca, 0, 0x10), OUT);
        let bar = r.f.bar0();
        let nic = || {
            initial_seg::nic_state.extract(bar.read32_be(init_seg_offset::CMDQ_ADDR_L_SZ).unwrap())
        };
        assert_eq!(nic(), 0, "full driver");
        assert!(r.fw().faults().nic_state(state));
        assert_eq!(nic(), u32::from(state.as_raw()));
        // The driver rewrites the address (bits 10:8 zero): the state survives it.
        let l = bar.read32_be(init_seg_offset::CMDQ_ADDR_L_SZ).unwrap();
        bar.write32_be(init_seg_offset::CMDQ_ADDR_L_SZ, l & 0xffff_f000)
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while bar.read32_be(init_seg_offset::CMDQ_ADDR_L_SZ).unwrap() & 0xff != 0x56 {
            assert!(Instant::now() < deadline, "the watcher never restored it");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(nic(), u32::from(state.as_raw()), "{state}: kept");
        assert_eq!(
            r.exec_on(3, &nop, OUT, Tweak::default(), Duration::from_millis(200)),
            Reply::Timeout
        );
        assert!(r.fw().stats().ignored_nic_state >= 1);
        assert!(ticks(&r), "not fatal: the counter ticks");
        r.f.reset().unwrap();
        assert_eq!(nic(), 0, "a reset returns to full driver");
    }
}

fn owned(r: &Rig, slot: usize) -> bool {
    CmdQueueEntry::new_unchecked(&r.entry(slot)[..]).ownership() == 1
}

/// The signed `num_pages` of a PAGE_REQUEST EQE.
fn page_request(e: &[u8; 64]) -> i32 {
    assert_eq!(e[1], EventType::PageRequest.as_raw(), "{e:x?}");
    i32::from_be_bytes([e[0x24], e[0x25], e[0x26], e[0x27]])
}

/// Row 1: with `page-requests` a CREATE_CQ the pages held do not cover (boot + init + one
/// page per CQ/QP/MKey) is held: a PAGE_REQUEST EQE asks for the deficit, its entry stays
/// hardware-owned while other slots execute (QUERY_PAGES regular reports the deficit; a ring
/// of the held slot is ignored as busy), and the MANAGE_PAGES give on slot 31 that covers it
/// makes it execute and complete. A CANT_GIVE (MANAGE_PAGES op_mod 0) fails the held command
/// with NO_RES `PAGES_CANT_GIVE`; a reset drops one; without an EQ subscribing to page
/// requests the firmware cannot ask and runs it at once. Legacy: nothing is charged.
#[test]
fn a_command_waits_for_its_page_request_while_other_slots_run() {
    let mut hw = Hw::with_spares(strict(), 0);
    let log = 3;
    let (eqn, ring) = hw.eq(log, 0, 1 << EventType::PageRequest.as_raw());
    let (spare0, spare1) = (hw.pages.iter_page(48), hw.pages.iter_page(49));
    let (ib, ob) = hw.r.boxes();
    let (ib31, ob31) = hw.r.boxes();
    let wait = Duration::from_secs(5);
    let create = create_cq_cmd(&mut hw, eqn, 1);
    hw.r.post_in(0, &create, OUT, Tweak::default(), (&ib, &ob));
    assert_eq!(page_request(&wait_eqe(&ring, log, 0)), 1);
    std::thread::sleep(Duration::from_millis(50));
    assert!(owned(&hw.r, 0), "held: still hardware-owned");
    assert_eq!(hw.r.fw().accounting().cqs, 0);
    // Other slots run meanwhile.
    let q = cmd(CmdOpcode::QueryPages, query_pages_op_mod::REGULAR, 0x10);
    let out = hw.r.exec_on(1, &q, OUT, Tweak::default(), wait).out();
    assert_eq!(QueryPagesOut::new_unchecked(&out[..]).num_pages() as i32, 1);
    hw.r.f
        .bar0()
        .write32_be(init_seg_offset::CMD_DBELL, 1)
        .unwrap();
    let deadline = Instant::now() + wait;
    while hw.r.fw().stats().ignored_busy == 0 {
        assert!(Instant::now() < deadline, "the busy ring was not seen");
        std::thread::sleep(Duration::from_millis(1));
    }
    // The give on the page-management slot covers it: both complete.
    hw.r.post_in(
        31,
        &give_cmd(&[spare0]),
        OUT,
        Tweak::default(),
        (&ib31, &ob31),
    );
    let given = hw.r.wait_in(31, OUT, wait, &ob31).out();
    assert_eq!(status(&given), (0, 0));
    let out = hw.r.wait_in(0, OUT, wait, &ob).out();
    assert_eq!(status(&out), (0, 0));
    assert_ne!(CreateCqOut::new_unchecked(&out[..]).cqn(), 0);
    let a = hw.r.fw().accounting();
    assert_eq!((a.cqs, a.pages_held), (1, 49));
    let s = hw.r.fw().stats();
    assert_eq!((s.parked, s.parked_page_requests), (1, 1));

    // CANT_GIVE: the next CQ is held, then fails with NO_RES.
    let create = create_cq_cmd(&mut hw, eqn, 1);
    hw.r.post_in(0, &create, OUT, Tweak::default(), (&ib, &ob));
    assert_eq!(page_request(&wait_eqe(&ring, log, 1)), 1);
    let cant = cmd(
        CmdOpcode::ManagePages,
        manage_pages_op_mod::ALLOC_FAIL,
        0x10,
    );
    hw.r.post_in(31, &cant, OUT, Tweak::default(), (&ib31, &ob31));
    assert_eq!(status(&hw.r.wait_in(31, OUT, wait, &ob31).out()), (0, 0));
    assert_eq!(
        status(&hw.r.wait_in(0, OUT, wait, &ob).out()),
        (CmdStatus::NoRes.as_raw(), syn::PAGES_CANT_GIVE)
    );
    assert_eq!(hw.r.fw().stats().cant_give, 1);
    assert_eq!(hw.r.fw().accounting().cqs, 1);

    // A spare page given ahead (QUERY_PAGES regular shows it) lets a create run at once.
    give(&hw.r, &[spare1]);
    let before = hw.r.fw().stats().parked;
    let c = create_cq_cmd(&mut hw, eqn, 1);
    hw.r.ok(&c, OUT);
    assert_eq!(hw.r.fw().stats().parked, before, "not held");
    assert_eq!(hw.r.fw().accounting().cqs, 2);

    // A reset drops a held command: never executed, never completed.
    let create = create_cq_cmd(&mut hw, eqn, 1);
    hw.r.post_in(0, &create, OUT, Tweak::default(), (&ib, &ob));
    assert_eq!(page_request(&wait_eqe(&ring, log, 2)), 1);
    hw.r.f.reset().unwrap();
    assert_eq!(hw.r.fw().stats().parked_dropped, 1);
    assert!(owned(&hw.r, 0));

    // No EQ asks for page requests: the firmware cannot ask, the create runs short.
    let mut hw = Hw::with_spares(strict(), 0);
    let (eqn, _) = hw.eq(log, 0, 0);
    let c = create_cq_cmd(&mut hw, eqn, 1);
    hw.r.ok(&c, OUT);
    assert_eq!(hw.r.fw().stats().parked, 0);
    assert_eq!(
        query_pages(&hw.r, query_pages_op_mod::REGULAR),
        1,
        "it owes the page"
    );

    // Legacy: nothing is charged.
    let mut hw = Hw::with(legacy());
    let (eqn, _) = hw.eq(log, 0, 1 << EventType::PageRequest.as_raw());
    let c = create_cq_cmd(&mut hw, eqn, 1);
    hw.r.ok(&c, OUT);
    assert_eq!(hw.r.fw().stats().parked, 0);
    assert_eq!(query_pages(&hw.r, query_pages_op_mod::REGULAR), 0);
}
