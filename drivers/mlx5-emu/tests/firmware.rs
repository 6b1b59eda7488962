//! The strict firmware end to end over vfio-user: real command-queue entries and mailboxes
//! in the client's DMA buffers, the doorbell in the mmapped BAR0, completion by polling.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Reply, Rig, Tweak, cmd, status};
use rnic_mlx5::{DmaBuffer, PciFunction};
use rnic_mlx5_emu::firmware::syndrome as syn;
use rnic_mlx5_emu::{FirmwareOptions, Options, Phase};
use rnic_mlx5_prm::{
    AccessRegisterIn, AllocPdOut, AllocTransportDomainOut, AllocUarOut, CmdHcaCap, CmdOpcode,
    CmdStatus, DeallocPdIn, DeallocTransportDomainIn, DeallocUarIn, DeliveryStatus, HealthSyndrome,
    ManagePagesIn, ManagePagesOut, ModifyNicVportContextIn, QueryIssiOut, QueryNicVportContextOut,
    QueryPagesOut, QueryVportStateOut, RegisterHostEndianness, RoceCap, SetDriverVersionIn,
    SetIssiIn, access_reg_op_mod, access_register_in, cap_type, health_buffer, init_seg_offset,
    initial_seg, manage_pages_op_mod, query_hca_cap_out, query_pages_op_mod, register_id,
};

const OUT_HDR: usize = 0x10;
const CAP_OUT: usize = 0x1010;

fn st(s: CmdStatus) -> u8 {
    s.as_raw()
}

fn enable(r: &Rig) {
    r.ok(&cmd(CmdOpcode::EnableHca, 0, 0x10), OUT_HDR);
}

fn set_issi(r: &Rig, v: u32) {
    let mut c = cmd(CmdOpcode::SetIssi, 0, 0x10);
    SetIssiIn::new_unchecked(&mut c[..])
        .set_current_issi(v)
        .unwrap();
    r.ok(&c, OUT_HDR);
}

fn query_pages(r: &Rig, op_mod: u32) -> u32 {
    let out = r.ok(&cmd(CmdOpcode::QueryPages, op_mod, 0x10), OUT_HDR);
    QueryPagesOut::new_unchecked(&out[..]).num_pages()
}

fn give_cmd(pages: &[u64]) -> Vec<u8> {
    let mut c = cmd(
        CmdOpcode::ManagePages,
        manage_pages_op_mod::GIVE,
        0x10 + 8 * pages.len(),
    );
    let mut v = ManagePagesIn::new_unchecked(&mut c[..]);
    v.set_input_num_entries(pages.len() as u32).unwrap();
    for (i, p) in pages.iter().enumerate() {
        v.set_pas(i, *p).unwrap();
    }
    c
}

fn take(r: &Rig, n: usize) -> Vec<u64> {
    let mut c = cmd(CmdOpcode::ManagePages, manage_pages_op_mod::TAKE, 0x10);
    ManagePagesIn::new_unchecked(&mut c[..])
        .set_input_num_entries(n as u32)
        .unwrap();
    let out = r.ok(&c, 0x10 + 8 * n);
    let o = ManagePagesOut::new_unchecked(&out[..]);
    (0..o.output_num_entries() as usize)
        .map(|i| o.pas(i).unwrap())
        .collect()
}

fn page_addrs(buf: &DmaBuffer, range: std::ops::Range<usize>) -> Vec<u64> {
    range.map(|i| buf.iova().0 + (i * 4096) as u64).collect()
}

fn query_cap(r: &Rig, t: u32, current: bool) -> Vec<u8> {
    let out = r.ok(
        &cmd(CmdOpcode::QueryHcaCap, (t << 1) | u32::from(current), 0x10),
        CAP_OUT,
    );
    out[query_hca_cap_out::cmd_hca_cap.byte_offset()..].to_vec()
}

fn set_cap_cmd(t: u32, page: &[u8]) -> Vec<u8> {
    let mut c = cmd(CmdOpcode::SetHcaCap, t << 1, CAP_OUT);
    c[0x10..].copy_from_slice(&page[..0x1000]);
    c
}

/// ENABLE_HCA … INIT_HCA as mlx5.md §3.1 lists it; returns the page buffer.
fn bring_up(r: &Rig) -> Arc<DmaBuffer> {
    enable(r);
    let issi = r.ok(&cmd(CmdOpcode::QueryIssi, 0, 0x10), 0x70);
    let q = QueryIssiOut::new_unchecked(&issi[..]);
    assert_eq!(q.current_issi(), 0);
    assert_eq!(
        q.supported_issi_dw0() & 0b11,
        0b11,
        "ISSI 0 and 1 supported"
    );
    set_issi(r, 1);
    let boot = query_pages(r, query_pages_op_mod::BOOT) as usize;
    assert_eq!(boot, 16);
    let pages = r.f.alloc_dma(48 * 4096).unwrap();
    r.ok(&give_cmd(&page_addrs(&pages, 0..boot)), OUT_HDR);
    assert_eq!(query_pages(r, query_pages_op_mod::BOOT), 0);

    let mut he = cmd(CmdOpcode::AccessReg, access_reg_op_mod::WRITE, 0x20);
    AccessRegisterIn::new_unchecked(&mut he[..])
        .set_register_id(register_id::HOST_ENDIANNESS)
        .unwrap();
    r.ok(&he, OUT_HDR);

    let cur = query_cap(r, cap_type::GENERAL, true);
    let max = query_cap(r, cap_type::GENERAL, false);
    let g = CmdHcaCap::new_unchecked(&cur[..]);
    assert_eq!(g.port_type(), 1, "Ethernet");
    assert_eq!(g.roce(), 1);
    assert_eq!(g.cmdif_checksum(), 0);
    assert_eq!(CmdHcaCap::new_unchecked(&max[..]).mkey_by_name(), 1);
    let mut set = cur.clone();
    let mut v = CmdHcaCap::new_unchecked(&mut set[..]);
    v.set_mkey_by_name(1).unwrap();
    v.set_log_uar_page_sz(0).unwrap();
    r.ok(&set_cap_cmd(cap_type::GENERAL, &set), OUT_HDR);
    let after = query_cap(r, cap_type::GENERAL, true);
    assert_eq!(CmdHcaCap::new_unchecked(&after[..]).mkey_by_name(), 1);

    let roce_max = query_cap(r, cap_type::ROCE, false);
    assert_eq!(
        RoceCap::new_unchecked(&roce_max[..]).sw_r_roce_src_udp_port(),
        1
    );
    let mut roce = query_cap(r, cap_type::ROCE, true);
    assert_eq!(
        RoceCap::new_unchecked(&roce[..]).sw_r_roce_src_udp_port(),
        0
    );
    RoceCap::new_unchecked(&mut roce[..])
        .set_sw_r_roce_src_udp_port(1)
        .unwrap();
    r.ok(&set_cap_cmd(cap_type::ROCE, &roce), OUT_HDR);

    let init = query_pages(r, query_pages_op_mod::INIT) as usize;
    assert_eq!(init, 32);
    r.ok(&give_cmd(&page_addrs(&pages, boot..boot + init)), OUT_HDR);
    r.ok(&cmd(CmdOpcode::InitHca, 0, 0x20), OUT_HDR);
    assert_eq!(r.fw().phase(), Phase::Initialized);
    pages
}

#[test]
fn full_bring_up_and_teardown_leave_nothing_behind() {
    let r = Rig::new();
    let pages = bring_up(&r);
    assert_eq!(r.fw().issi(), 1);
    assert_eq!(r.fw().host_endianness(), Some(0), "little-endian host");

    let mut dv = cmd(CmdOpcode::SetDriverVersion, 0, 0x50);
    let mut name = [0u8; 64];
    name[..10].copy_from_slice(b"rnic,mlx5,");
    SetDriverVersionIn::new_unchecked(&mut dv[..])
        .set_driver_version(&name)
        .unwrap();
    r.ok(&dv, OUT_HDR);
    assert_eq!(r.fw().driver_version().as_deref(), Some("rnic,mlx5,"));

    let out = r.ok(&cmd(CmdOpcode::AllocUar, 0, 0x10), OUT_HDR);
    let uar = AllocUarOut::new_unchecked(&out[..]).uar();
    assert_eq!(uar, 3, "UAR indexes start after the init segment pages");
    assert!(r.emu.device().watched_uars().contains(&uar));
    let out = r.ok(&cmd(CmdOpcode::AllocPd, 0, 0x10), OUT_HDR);
    let pd = AllocPdOut::new_unchecked(&out[..]).pd();
    assert_ne!(pd, 0);
    let out = r.ok(&cmd(CmdOpcode::AllocTransportDomain, 0, 0x10), OUT_HDR);
    let td = AllocTransportDomainOut::new_unchecked(&out[..]).transport_domain();
    let acc = r.fw().accounting();
    assert_eq!((acc.pages_held, acc.uars, acc.pds, acc.tds), (48, 1, 1, 1));

    let out = r.ok(&cmd(CmdOpcode::QueryVportState, 0, 0x10), OUT_HDR);
    assert_eq!(
        QueryVportStateOut::new_unchecked(&out[..]).state(),
        1,
        "link up"
    );
    let mut m = cmd(CmdOpcode::ModifyNicVportContext, 0, 0x200);
    let mut mv = ModifyNicVportContextIn::new_unchecked(&mut m[..]);
    mv.field_select_mut().set_roce_en(1).unwrap();
    mv.nic_vport_context_mut().set_roce_en(1).unwrap();
    r.ok(&m, OUT_HDR);
    let out = r.ok(&cmd(CmdOpcode::QueryNicVportContext, 0, 0x10), 0x110);
    let ctx = QueryNicVportContextOut::new_unchecked(&out[..]);
    let ctx = ctx.nic_vport_context();
    assert_eq!(ctx.roce_en(), 1);
    assert_eq!(ctx.mtu(), 9000);
    assert_eq!(
        out[0x106..0x10c],
        FirmwareOptions::default().mac,
        "MAC at out 0x106 (mlx5.md §5.4)"
    );

    // Teardown with objects alive is refused and changes nothing.
    let (s, y) = r.err(&cmd(CmdOpcode::TeardownHca, 0, 0x10), OUT_HDR);
    assert_eq!(
        (s, y),
        (st(CmdStatus::BadResState), syn::TEARDOWN_OBJECTS_LIVE)
    );
    let mut c = cmd(CmdOpcode::DeallocUar, 0, 0x10);
    DeallocUarIn::new_unchecked(&mut c[..])
        .set_uar(uar)
        .unwrap();
    r.ok(&c, OUT_HDR);
    assert!(!r.emu.device().watched_uars().contains(&uar));
    let mut c = cmd(CmdOpcode::DeallocPd, 0, 0x10);
    DeallocPdIn::new_unchecked(&mut c[..]).set_pd(pd).unwrap();
    r.ok(&c, OUT_HDR);
    let mut c = cmd(CmdOpcode::DeallocTransportDomain, 0, 0x10);
    DeallocTransportDomainIn::new_unchecked(&mut c[..])
        .set_transport_domain(td)
        .unwrap();
    r.ok(&c, OUT_HDR);

    // Initialized: only pages beyond boot + init could be taken (none).
    assert!(take(&r, 8).is_empty());
    r.ok(&cmd(CmdOpcode::TeardownHca, 0, 0x10), OUT_HDR);
    assert_eq!(r.fw().phase(), Phase::Enabled);
    let (s, y) = r.err(&cmd(CmdOpcode::DisableHca, 0, 0x10), OUT_HDR);
    assert_eq!(
        (s, y),
        (st(CmdStatus::BadSysState), syn::DISABLE_PAGES_HELD)
    );
    let mut back: BTreeSet<u64> = take(&r, 40).into_iter().collect();
    back.extend(take(&r, 40));
    let given: BTreeSet<u64> = page_addrs(&pages, 0..48).into_iter().collect();
    assert_eq!(back, given, "every page given came back");
    r.ok(&cmd(CmdOpcode::DisableHca, 0, 0x10), OUT_HDR);
    assert_eq!(r.fw().phase(), Phase::Disabled);

    let acc = r.fw().accounting();
    assert!(acc.pages_held == 0 && acc.uars == 0 && acc.pds == 0 && acc.tds == 0);
    let stats = r.fw().stats();
    assert_eq!(stats.executed(CmdOpcode::ManagePages), 5);
    assert_eq!(stats.executed(CmdOpcode::QueryHcaCap), 5);
    assert!(stats.delivery_errors.is_empty());
    assert_eq!(
        stats.errors.values().sum::<u64>(),
        2,
        "the two refusals above"
    );

    drop(pages);
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
fn every_error_class_has_its_status_and_a_syndrome() {
    let r = Rig::new();
    // Before ENABLE_HCA everything but ENABLE_HCA is BAD_SYS_STATE.
    for op in [CmdOpcode::QueryIssi, CmdOpcode::InitHca, CmdOpcode::AllocPd] {
        let len = if op == CmdOpcode::InitHca { 0x20 } else { 0x10 };
        let outlen = if op == CmdOpcode::QueryIssi {
            0x70
        } else {
            OUT_HDR
        };
        assert_eq!(
            r.err(&cmd(op, 0, len), outlen),
            (st(CmdStatus::BadSysState), syn::NOT_ENABLED),
            "{op}"
        );
    }
    assert_eq!(
        r.err(&cmd(CmdOpcode::from_raw(0x7ff), 0, 0x10), OUT_HDR),
        (st(CmdStatus::BadOp), syn::UNKNOWN_OPCODE)
    );
    assert_eq!(
        r.err(&cmd(CmdOpcode::EnableHca, 0, 0x8), OUT_HDR),
        (st(CmdStatus::BadInpLen), syn::INPUT_TOO_SHORT)
    );
    assert_eq!(r.fw().phase(), Phase::Disabled, "refusals change nothing");
    enable(&r);
    assert_eq!(
        r.err(&cmd(CmdOpcode::EnableHca, 0, 0x10), OUT_HDR),
        (st(CmdStatus::BadSysState), syn::ALREADY_ENABLED)
    );
    assert_eq!(
        r.err(&cmd(CmdOpcode::QueryIssi, 0, 0x10), 0x10),
        (st(CmdStatus::BadOutpLen), syn::OUTPUT_TOO_SHORT)
    );
    assert_eq!(
        r.err(&cmd(CmdOpcode::InitHca, 0, 0x20), OUT_HDR),
        (st(CmdStatus::BadSysState), syn::INIT_WITHOUT_ISSI)
    );
    let mut c = cmd(CmdOpcode::SetIssi, 0, 0x10);
    SetIssiIn::new_unchecked(&mut c[..])
        .set_current_issi(2)
        .unwrap();
    assert_eq!(
        r.err(&c, OUT_HDR),
        (st(CmdStatus::BadParam), syn::ISSI_UNSUPPORTED)
    );
    set_issi(&r, 1);
    assert_eq!(
        r.err(&cmd(CmdOpcode::InitHca, 0, 0x20), OUT_HDR),
        (st(CmdStatus::BadSysState), syn::INIT_WITHOUT_BOOT_PAGES)
    );
    assert_eq!(
        r.err(&cmd(CmdOpcode::QueryHcaCap, 1, 0x10), CAP_OUT),
        (st(CmdStatus::BadSysState), syn::CAP_WITHOUT_BOOT_PAGES)
    );

    // MANAGE_PAGES: an unmapped page, a double give (in one command and across two), an
    // unaligned page, an inlen that cannot hold the entries: none of them takes a page.
    let pages = r.f.alloc_dma(16 * 4096).unwrap();
    let addrs = page_addrs(&pages, 0..16);
    let mut bad = addrs.clone();
    bad[5] = 0x7f00_0000_0000;
    assert_eq!(
        r.err(&give_cmd(&bad), OUT_HDR),
        (st(CmdStatus::BadParam), syn::PAGE_NOT_MAPPED)
    );
    let mut twice = addrs.clone();
    twice[3] = twice[2];
    assert_eq!(
        r.err(&give_cmd(&twice), OUT_HDR),
        (st(CmdStatus::BadParam), syn::PAGE_ALREADY_GIVEN)
    );
    let mut odd = addrs.clone();
    odd[0] += 8;
    assert_eq!(
        r.err(&give_cmd(&odd), OUT_HDR),
        (st(CmdStatus::BadParam), syn::PAGE_UNALIGNED)
    );
    let mut short = give_cmd(&addrs);
    short.truncate(0x10 + 8 * 15);
    assert_eq!(
        r.err(&short, OUT_HDR),
        (st(CmdStatus::BadInpLen), syn::PAGES_INPUT_TOO_SHORT)
    );
    assert_eq!(r.fw().accounting().pages_held, 0);
    r.ok(&give_cmd(&addrs[..8]), OUT_HDR);
    assert_eq!(
        r.err(&give_cmd(&addrs[7..9]), OUT_HDR),
        (st(CmdStatus::BadParam), syn::PAGE_ALREADY_GIVEN)
    );
    assert_eq!(
        r.fw().accounting().pages_held,
        8,
        "the refused give took nothing"
    );
    r.ok(&give_cmd(&addrs[8..]), OUT_HDR);

    // Boot pages given, init pages missing.
    assert_eq!(
        r.err(&cmd(CmdOpcode::InitHca, 0, 0x20), OUT_HDR),
        (st(CmdStatus::BadSysState), syn::INIT_WITHOUT_INIT_PAGES)
    );
    // SET_HCA_CAP: above max, read-only.
    let mut cap = query_cap(&r, cap_type::GENERAL, true);
    CmdHcaCap::new_unchecked(&mut cap[..])
        .set_log_max_qp(19)
        .unwrap();
    assert_eq!(
        r.err(&set_cap_cmd(cap_type::GENERAL, &cap), OUT_HDR),
        (st(CmdStatus::BadParam), syn::CAP_ABOVE_MAX)
    );
    let mut cap = query_cap(&r, cap_type::GENERAL, true);
    CmdHcaCap::new_unchecked(&mut cap[..])
        .set_log_max_pd(4)
        .unwrap();
    assert_eq!(
        r.err(&set_cap_cmd(cap_type::GENERAL, &cap), OUT_HDR),
        (st(CmdStatus::BadParam), syn::CAP_READ_ONLY)
    );
    assert_eq!(
        r.err(&cmd(CmdOpcode::QueryHcaCap, 3 << 1, 0x10), CAP_OUT),
        (st(CmdStatus::BadParam), syn::CAP_TYPE_UNSUPPORTED)
    );
    assert_eq!(
        CmdHcaCap::new_unchecked(&query_cap(&r, cap_type::GENERAL, true)[..]).log_max_qp(),
        18,
        "refused SET_HCA_CAPs changed nothing"
    );
    // Resource commands before INIT_HCA.
    assert_eq!(
        r.err(&cmd(CmdOpcode::AllocUar, 0, 0x10), OUT_HDR),
        (st(CmdStatus::BadSysState), syn::NOT_INITIALIZED)
    );
    let stats = r.fw().stats();
    assert!(stats.errors_with(CmdStatus::BadSysState) >= 7);
    assert_eq!(stats.errors_with(CmdStatus::BadOp), 1);
    assert!(stats.delivery_errors.is_empty());
}

#[test]
fn register_and_resource_checks() {
    let r = Rig::new();
    let _pages = bring_up(&r);
    let mut rd = cmd(CmdOpcode::AccessReg, access_reg_op_mod::READ, 0x10);
    AccessRegisterIn::new_unchecked(&mut rd[..])
        .set_register_id(register_id::HOST_ENDIANNESS)
        .unwrap();
    let out = r.ok(&rd, 0x20);
    let data = access_register_in::register_data.byte_offset();
    assert_eq!(RegisterHostEndianness::new_unchecked(&out[data..]).he(), 0);
    AccessRegisterIn::new_unchecked(&mut rd[..])
        .set_register_id(register_id::PAOS)
        .unwrap();
    assert_eq!(
        r.err(&rd, 0x20),
        (st(CmdStatus::BadParam), syn::REGISTER_UNSUPPORTED)
    );

    let mut c = cmd(CmdOpcode::DeallocUar, 0, 0x10);
    DeallocUarIn::new_unchecked(&mut c[..]).set_uar(1).unwrap();
    assert_eq!(
        r.err(&c, OUT_HDR),
        (st(CmdStatus::BadParam), syn::UAR_INDEX)
    );
    DeallocUarIn::new_unchecked(&mut c[..]).set_uar(7).unwrap();
    assert_eq!(
        r.err(&c, OUT_HDR),
        (st(CmdStatus::BadRes), syn::UAR_NOT_ALLOCATED)
    );
    let mut c = cmd(CmdOpcode::DeallocPd, 0, 0x10);
    DeallocPdIn::new_unchecked(&mut c[..]).set_pd(99).unwrap();
    assert_eq!(
        r.err(&c, OUT_HDR),
        (st(CmdStatus::BadRes), syn::PD_NOT_ALLOCATED)
    );
    let mut uid = cmd(CmdOpcode::AllocPd, 0, 0x10);
    uid[3] = 1;
    assert_eq!(
        r.err(&uid, OUT_HDR),
        (st(CmdStatus::BadParam), syn::UID_NOT_ZERO)
    );
    assert_eq!(
        r.err(&cmd(CmdOpcode::SetIssi, 0, 0x10), OUT_HDR),
        (st(CmdStatus::BadSysState), syn::ALREADY_INITIALIZED)
    );
    assert_eq!(r.fw().accounting().pds, 0);
}

#[test]
fn chained_mailboxes_carry_the_capability_page_with_block_numbers_kept() {
    let r = Rig::new();
    let _pages = bring_up(&r);
    assert_eq!(
        common::blocks(CAP_OUT),
        8,
        "0x1010 bytes = 16 inline + 8 blocks"
    );
    let cur = query_cap(&r, cap_type::GENERAL, true);
    // The output blocks still hold the driver's headers: numbers 0..8 and the token.
    for k in 0..8 {
        let b = Rig::block(&r.outbox, k);
        let v = rnic_mlx5_prm::CmdIfBox::new_unchecked(&b[..]);
        assert_eq!(v.block_number(), k as u32);
        assert_eq!(v.token(), u32::from(r.token));
    }
    let g = CmdHcaCap::new_unchecked(&cur[..]);
    assert_eq!(g.log_max_qp(), 18);
    assert_eq!(g.log_max_pd(), 24);
    assert_eq!(g.log_max_msg(), 30);
    // Only the 256-byte structure is nonzero; the rest of the 4 KiB page reads zero.
    assert!(cur[0x100..].iter().all(|&b| b == 0));
    // SET_HCA_CAP's input is 8 blocks too; after INIT_HCA it is refused by state.
    assert_eq!(
        r.err(&set_cap_cmd(cap_type::GENERAL, &cur), OUT_HDR),
        (st(CmdStatus::BadSysState), syn::ALREADY_INITIALIZED)
    );
}

#[test]
fn broken_transport_is_a_delivery_status_and_executes_nothing() {
    let r = Rig::new();
    enable(&r);
    set_issi(&r, 0);
    let pages = r.f.alloc_dma(16 * 4096).unwrap();
    let give = give_cmd(&page_addrs(&pages, 0..16)); // 0x90 bytes: one input block
    let wait = Duration::from_secs(5);
    let case = |t: Tweak| r.exec_on(0, &give, OUT_HDR, t, wait);
    let d = |s: DeliveryStatus| Reply::Delivery(s.as_raw());
    assert_eq!(
        case(Tweak {
            in_block_number: Some((0, 1)),
            ..Tweak::default()
        }),
        d(DeliveryStatus::BadBlockNumber)
    );
    assert_eq!(
        case(Tweak {
            in_token: Some((0, 0x33)),
            ..Tweak::default()
        }),
        d(DeliveryStatus::TokenErr)
    );
    assert_eq!(
        case(Tweak {
            in_ptr: Some(r.inbox.iova().0 + 512),
            ..Tweak::default()
        }),
        d(DeliveryStatus::InputPointerNotAligned)
    );
    assert_eq!(
        case(Tweak {
            in_ptr: Some(0x7f00_0000_0000),
            ..Tweak::default()
        }),
        d(DeliveryStatus::FwInternalErr),
        "an unmapped mailbox is a DMA fault"
    );
    assert_eq!(
        case(Tweak {
            cmd_type: Some(3),
            ..Tweak::default()
        }),
        d(DeliveryStatus::BadCmdType)
    );
    assert_eq!(
        case(Tweak {
            inlen: Some(2 << 20),
            ..Tweak::default()
        }),
        d(DeliveryStatus::InputLenErr)
    );
    assert_eq!(
        r.fw().accounting().pages_held,
        0,
        "no broken command executed"
    );
    // A broken *output* chain is found before executing: the pages are not taken either.
    assert_eq!(
        r.exec_on(
            0,
            &give,
            0x10 + 600,
            Tweak {
                out_block_number: Some((1, 7)),
                ..Tweak::default()
            },
            wait
        ),
        d(DeliveryStatus::BadBlockNumber)
    );
    assert_eq!(r.fw().accounting().pages_held, 0);
    let stats = r.fw().stats();
    assert_eq!(
        stats.delivery_errors_with(DeliveryStatus::BadBlockNumber),
        2
    );
    assert_eq!(stats.delivery_errors.values().sum::<u64>(), 7);
    // The same command, intact, on another slot and with token 0 (RC's choice).
    let zero = Tweak {
        token: Some(0),
        ..Tweak::default()
    };
    assert_eq!(
        status(&r.exec_on(5, &give, OUT_HDR, zero, wait).out()),
        (0, 0)
    );
    assert_eq!(r.fw().accounting().pages_held, 16);
}

#[test]
fn a_ring_of_a_software_owned_entry_is_ignored() {
    let r = Rig::new();
    let c = cmd(CmdOpcode::EnableHca, 0, 0x10);
    r.post(
        2,
        &c,
        OUT_HDR,
        Tweak {
            ownership: Some(0),
            ..Tweak::default()
        },
    );
    let before = r.entry(2);
    let deadline = Instant::now() + Duration::from_secs(5);
    while r.fw().stats().ignored_not_owned == 0 {
        assert!(
            Instant::now() < deadline,
            "the ring never reached the firmware"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(r.entry(2), before, "nothing written back");
    assert_eq!(r.fw().phase(), Phase::Disabled, "not executed");
    enable(&r);
}

#[test]
fn fault_hooks_fail_swallow_and_kill() {
    let r = Rig::new();
    let faults = r.fw().faults();
    faults.fail_next(CmdOpcode::EnableHca, CmdStatus::IntErr, 0x1234_5678);
    assert_eq!(
        r.err(&cmd(CmdOpcode::EnableHca, 0, 0x10), OUT_HDR),
        (st(CmdStatus::IntErr), 0x1234_5678)
    );
    assert_eq!(
        r.fw().phase(),
        Phase::Disabled,
        "an injected failure executes nothing"
    );
    enable(&r);

    faults.swallow_next(Some(CmdOpcode::QueryIssi));
    let q = cmd(CmdOpcode::QueryIssi, 0, 0x10);
    assert_eq!(
        r.exec_on(1, &q, 0x70, Tweak::default(), Duration::from_millis(300)),
        Reply::Timeout
    );
    let e = r.entry(1);
    assert_eq!(
        rnic_mlx5_prm::CmdQueueEntry::new_unchecked(&e[..]).ownership(),
        1,
        "still owned by hardware"
    );
    r.ok(&q, 0x70);
    assert_eq!(r.fw().stats().swallowed, 1);
    assert_eq!(r.fw().stats().injected, 1);

    let bar = r.f.bar0();
    assert!(faults.fatal(HealthSyndrome::HwFatal));
    let synd_at = init_seg_offset::HEALTH_BUFFER + health_buffer::synd.dword_offset();
    assert_eq!(
        health_buffer::synd.extract(bar.read32_be(synd_at).unwrap()),
        0x8
    );
    let counter = || {
        initial_seg::health_counter.extract(bar.read32_be(init_seg_offset::HEALTH_COUNTER).unwrap())
    };
    std::thread::sleep(Duration::from_millis(20));
    let c0 = counter();
    std::thread::sleep(Duration::from_millis(150));
    assert_eq!(counter(), c0, "the health counter stopped");
    assert_eq!(
        r.exec_on(0, &q, 0x70, Tweak::default(), Duration::from_millis(200)),
        Reply::Timeout
    );
    assert!(r.fw().stats().ignored_dead >= 1);
    // A function reset brings it back to power-on.
    r.f.reset().unwrap();
    assert_eq!(r.fw().phase(), Phase::Disabled);
    assert!(!r.emu.device().health_counter_stopped());
}

#[test]
fn page_counts_come_from_the_options() {
    let r = Rig::with(Options {
        boot_delay: Duration::from_millis(1),
        firmware: FirmwareOptions {
            boot_pages: 2,
            init_pages: 0,
            ..FirmwareOptions::default()
        },
        ..Options::default()
    });
    enable(&r);
    set_issi(&r, 0);
    assert_eq!(query_pages(&r, query_pages_op_mod::BOOT), 2);
    assert_eq!(query_pages(&r, query_pages_op_mod::INIT), 0);
    let pages = r.f.alloc_dma(2 * 4096).unwrap();
    r.ok(&give_cmd(&page_addrs(&pages, 0..2)), OUT_HDR);
    r.ok(&cmd(CmdOpcode::InitHca, 0, 0x20), OUT_HDR);
    r.ok(&cmd(CmdOpcode::Nop, 0, 0x10), OUT_HDR);
}

/// Wait (at most 5 s) until `done` holds: the watcher and the firmware run on threads of
/// their own, and a loaded machine may take a while to schedule them.
fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_delayed_command_completes_late_while_other_slots_run_and_its_own_slot_is_busy() {
    let r = Rig::new();
    let faults = r.fw().faults();
    // Long enough for the checks below to run within it on a loaded 2-core machine.
    let delay = Duration::from_millis(1000);
    assert!(faults.delay_next(Some(CmdOpcode::EnableHca), delay));
    assert!(
        !faults.delay_next(None, Duration::from_secs(601)),
        "longer than MAX_DELAY"
    );
    let start = Instant::now();
    let enable_cmd = cmd(CmdOpcode::EnableHca, 0, 0x10);
    r.post(0, &enable_cmd, OUT_HDR, Tweak::default());
    until("the delayed command was never fetched", || {
        r.fw().late_pending() > 0
    });
    assert_eq!(r.fw().late_pending(), 1);
    assert_eq!(r.fw().phase(), Phase::Disabled, "not executed yet");
    assert_eq!(
        rnic_mlx5_prm::CmdQueueEntry::new_unchecked(&r.entry(0)[..]).ownership(),
        1,
        "still owned by hardware"
    );
    // A ring of the busy slot is ignored (a slot executes one command at a time).
    r.post(0, &enable_cmd, OUT_HDR, Tweak::default());
    // (Let the watcher take that ring before slot 1's doorbell write replaces it.)
    until("the busy slot's ring was never seen", || {
        r.fw().stats().ignored_busy > 0
    });
    assert_eq!(r.fw().stats().ignored_busy, 1);
    // Another slot is served meanwhile (NOP before ENABLE_HCA: refused, but completed).
    let nop = r.exec_on(
        1,
        &cmd(CmdOpcode::Nop, 0, 0x10),
        OUT_HDR,
        Tweak::default(),
        Duration::from_millis(200),
    );
    assert!(matches!(nop, Reply::Done(_)), "{nop:?}");
    assert!(start.elapsed() < delay, "{:?}", start.elapsed());
    // Then the late completion: executed, output and ownership written.
    let out = r.wait(0, OUT_HDR, Duration::from_secs(5)).out();
    assert!(start.elapsed() >= delay, "{:?}", start.elapsed());
    assert_eq!(status(&out), (0, 0));
    assert_eq!(r.fw().phase(), Phase::Enabled);
    let s = r.fw().stats();
    assert_eq!((s.delayed, s.ignored_busy, s.late_dropped), (1, 1, 0));
    assert_eq!(s.executed(CmdOpcode::EnableHca), 1, "executed once");
    assert_eq!(r.fw().late_pending(), 0);

    // A fail_next for the delayed command applies when it executes.
    faults.delay_next(Some(CmdOpcode::QueryIssi), Duration::from_millis(50));
    faults.fail_next(CmdOpcode::QueryIssi, CmdStatus::ResBusy, 0x77);
    let q = cmd(CmdOpcode::QueryIssi, 0, 0x10);
    assert_eq!(
        r.err(&q, 0x70),
        (st(CmdStatus::ResBusy), 0x77),
        "late and failed"
    );

    // A reset before the delay ends drops the command: never executed, never completed.
    faults.delay_next(None, Duration::from_millis(200));
    r.post(2, &q, 0x70, Tweak::default());
    until("the third delayed command was never fetched", || {
        r.fw().late_pending() > 0
    });
    r.f.reset().unwrap();
    // Dropped (or, wrongly, executed) when its delay ends.
    until("the delay never ended", || {
        let s = r.fw().stats();
        s.late_dropped > 0 || s.executed(CmdOpcode::QueryIssi) > 1
    });
    let s = r.fw().stats();
    assert_eq!((s.delayed, s.late_dropped), (3, 1));
    assert_eq!(r.fw().late_pending(), 0);
    assert_eq!(s.executed(CmdOpcode::QueryIssi), 1, "only the failed one");
}
