//! The `mlx5_firmware` target: the emulated firmware's command interface fed by a hostile
//! driver (see [`command_queue`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;

use rnic_mlx5_emu::firmware::cmdq::MAX_CMD_BYTES;
use rnic_mlx5_emu::{Accounting, FirmwareStats, Phase};
use rnic_mlx5_prm::{
    AllocUarOut, CMD_INLINE_BYTES, CMD_TYPE_PCIE, CmdIfBox, CmdOpcode, CmdQueueEntry, CmdStatus,
    DeliveryStatus, MAILBOX_ALIGN, MAILBOX_DATA_BYTES, ManagePagesIn, ManagePagesOut, MboxIn,
    cmd_if_box, cmd_queue_entry, manage_pages_op_mod,
};

use super::{
    BASE, BLOCKS, CMDQ, ENTRY, INBOX, MAPPED, OUTBOX, POOL_PAGES, QUEUES, Rig, TOKEN, blocks, cmd,
    pool_page, split, status,
};
use crate::Input;

/// Most commands one input runs.
const MAX_COMMANDS: usize = 24;

/// The commands the firmware knows, with the input and output sizes of their PRM layouts.
const KNOWN: &[(CmdOpcode, usize, usize)] = {
    use rnic_mlx5_prm as p;
    &[
        (
            CmdOpcode::EnableHca,
            p::enable_hca_in::SIZE_BYTES,
            p::enable_hca_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::DisableHca,
            p::disable_hca_in::SIZE_BYTES,
            p::disable_hca_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::QueryIssi,
            p::query_issi_in::SIZE_BYTES,
            p::query_issi_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::SetIssi,
            p::set_issi_in::SIZE_BYTES,
            p::set_issi_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::QueryPages,
            p::query_pages_in::SIZE_BYTES,
            p::query_pages_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::ManagePages,
            p::manage_pages_in::SIZE_BYTES,
            p::manage_pages_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::QueryHcaCap,
            p::query_hca_cap_in::SIZE_BYTES,
            p::query_hca_cap_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::SetHcaCap,
            p::set_hca_cap_in::SIZE_BYTES,
            p::set_hca_cap_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::AccessReg,
            p::access_register_in::SIZE_BYTES,
            p::access_register_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::SetDriverVersion,
            p::set_driver_version_in::SIZE_BYTES,
            p::set_driver_version_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::InitHca,
            p::init_hca_in::SIZE_BYTES,
            p::init_hca_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::TeardownHca,
            p::teardown_hca_in::SIZE_BYTES,
            p::teardown_hca_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::Nop,
            p::mbox_in::SIZE_BYTES,
            p::mbox_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::AllocUar,
            p::alloc_uar_in::SIZE_BYTES,
            p::alloc_uar_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::DeallocUar,
            p::dealloc_uar_in::SIZE_BYTES,
            p::dealloc_uar_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::AllocPd,
            p::alloc_pd_in::SIZE_BYTES,
            p::alloc_pd_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::DeallocPd,
            p::dealloc_pd_in::SIZE_BYTES,
            p::dealloc_pd_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::AllocTransportDomain,
            p::alloc_transport_domain_in::SIZE_BYTES,
            p::alloc_transport_domain_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::DeallocTransportDomain,
            p::dealloc_transport_domain_in::SIZE_BYTES,
            p::dealloc_transport_domain_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::QueryVportState,
            p::query_vport_state_in::SIZE_BYTES,
            p::query_vport_state_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::QueryNicVportContext,
            p::query_nic_vport_context_in::SIZE_BYTES,
            p::query_nic_vport_context_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::ModifyNicVportContext,
            p::modify_nic_vport_context_in::SIZE_BYTES,
            p::modify_nic_vport_context_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::SetRoceAddress,
            p::set_roce_address_in::SIZE_BYTES,
            p::set_roce_address_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::QueryRoceAddress,
            p::query_roce_address_in::SIZE_BYTES,
            p::query_roce_address_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::CreateEq,
            p::create_eq_in::SIZE_BYTES,
            p::create_eq_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::DestroyEq,
            p::destroy_eq_in::SIZE_BYTES,
            p::destroy_eq_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::CreateCq,
            p::create_cq_in::SIZE_BYTES,
            p::create_cq_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::DestroyCq,
            p::destroy_cq_in::SIZE_BYTES,
            p::destroy_cq_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::CreateMkey,
            p::create_mkey_in::SIZE_BYTES,
            p::create_mkey_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::DestroyMkey,
            p::destroy_mkey_in::SIZE_BYTES,
            p::destroy_mkey_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::CreateQp,
            p::create_qp_in::SIZE_BYTES,
            p::create_qp_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::DestroyQp,
            p::destroy_qp_in::SIZE_BYTES,
            p::destroy_qp_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::Rst2InitQp,
            p::rst2init_qp_in::SIZE_BYTES,
            p::rst2init_qp_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::Init2RtrQp,
            p::init2rtr_qp_in::SIZE_BYTES,
            p::init2rtr_qp_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::Rtr2RtsQp,
            p::rtr2rts_qp_in::SIZE_BYTES,
            p::rtr2rts_qp_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::Qp2Err,
            p::qp_2err_in::SIZE_BYTES,
            p::qp_2err_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::Qp2Rst,
            p::qp_2rst_in::SIZE_BYTES,
            p::qp_2rst_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::QueryQp,
            p::query_qp_in::SIZE_BYTES,
            p::query_qp_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::QuerySpecialContexts,
            p::query_special_contexts_in::SIZE_BYTES,
            p::query_special_contexts_out::SIZE_BYTES,
        ),
        // Raw Ethernet (hca/raw.rs). CREATE_SQ / CREATE_RQ: room for two `pas` entries.
        (
            CmdOpcode::CreateTis,
            p::create_tis_in::SIZE_BYTES,
            p::create_tis_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::DestroyTis,
            p::destroy_tis_in::SIZE_BYTES,
            p::destroy_tis_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::CreateSq,
            p::create_sq_in::SIZE_BYTES + 2 * 8,
            p::create_sq_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::ModifySq,
            p::modify_sq_in::SIZE_BYTES,
            p::modify_sq_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::DestroySq,
            p::destroy_sq_in::SIZE_BYTES,
            p::destroy_sq_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::QuerySq,
            p::query_sq_in::SIZE_BYTES,
            p::query_sq_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::CreateRq,
            p::create_rq_in::SIZE_BYTES + 2 * 8,
            p::create_rq_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::ModifyRq,
            p::modify_rq_in::SIZE_BYTES,
            p::modify_rq_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::DestroyRq,
            p::destroy_rq_in::SIZE_BYTES,
            p::destroy_rq_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::QueryRq,
            p::query_rq_in::SIZE_BYTES,
            p::query_rq_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::CreateTir,
            p::create_tir_in::SIZE_BYTES,
            p::create_tir_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::DestroyTir,
            p::destroy_tir_in::SIZE_BYTES,
            p::destroy_tir_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::QueryTir,
            p::query_tir_in::SIZE_BYTES,
            p::query_tir_out::SIZE_BYTES,
        ),
        // Flow steering (hca/steer.rs). SET_FLOW_TABLE_ENTRY and QUERY_FLOW_TABLE_ENTRY:
        // room for two destinations in the flow context.
        (
            CmdOpcode::CreateFlowTable,
            p::create_flow_table_in::SIZE_BYTES,
            p::create_flow_table_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::DestroyFlowTable,
            p::destroy_flow_table_in::SIZE_BYTES,
            p::destroy_flow_table_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::QueryFlowTable,
            p::query_flow_table_in::SIZE_BYTES,
            p::query_flow_table_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::CreateFlowGroup,
            p::create_flow_group_in::SIZE_BYTES,
            p::create_flow_group_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::DestroyFlowGroup,
            p::destroy_flow_group_in::SIZE_BYTES,
            p::destroy_flow_group_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::SetFlowTableEntry,
            p::set_fte_in::SIZE_BYTES + 2 * FLOW_DEST_BYTES,
            p::set_fte_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::DeleteFlowTableEntry,
            p::delete_fte_in::SIZE_BYTES,
            p::delete_fte_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::QueryFlowTableEntry,
            p::query_fte_in::SIZE_BYTES,
            p::query_fte_out::SIZE_BYTES + 2 * FLOW_DEST_BYTES,
        ),
        (
            CmdOpcode::SetFlowTableRoot,
            p::set_flow_table_root_in::SIZE_BYTES,
            p::set_flow_table_root_out::SIZE_BYTES,
        ),
        (
            CmdOpcode::QueryVportCounter,
            p::query_vport_counter_in::SIZE_BYTES,
            p::query_vport_counter_out::SIZE_BYTES,
        ),
    ]
};

/// The number the emulator gives the first SQ or RQ of a function (they come from the QP
/// number space; the seeds name it).
const FIRST_RAW_QPN: u32 = 2;

/// Bytes of one element of a flow context's destination list.
const FLOW_DEST_BYTES: usize = 16;

/// Where the objects prefix puts its EQ ring, CQ ring and CQ doorbell record (memfd
/// offsets, past the pool).
const PREFIX_EQ: u64 = QUEUES;
const PREFIX_CQ: u64 = QUEUES + 0x1000;
const PREFIX_CQ_DBR: u64 = QUEUES + 0x2000;

/// Addresses a hostile driver names that are not (wholly) mapped, or not aligned.
const BAD_ADDRS: [u64; 6] = [
    BASE + MAPPED,
    BASE - 4096,
    0,
    BASE + INBOX + 0x200,
    !0x3ff,
    BASE + MAPPED - 0x200,
];

/// What the harness knows the firmware holds: the model its accounting must match.
#[derive(Clone, Debug, Default)]
struct Model {
    pages: BTreeSet<u64>,
    uars: usize,
    pds: usize,
    tds: usize,
    eqs: usize,
    cqs: usize,
    mkeys: usize,
    qps: usize,
    /// TISes, SQs, RQs, TIRs.
    eth: usize,
    /// Flow tables, groups, entries.
    flow: usize,
}

impl Model {
    /// Follow a command the firmware completed with status OK (`input` as it gathered it).
    fn apply(&mut self, op: CmdOpcode, input: &[u8], out: &[u8]) {
        let op_mod = MboxIn::new_unchecked(input).op_mod();
        let inc = |n: &mut usize, up: bool| {
            if up {
                *n += 1;
            } else {
                *n = n
                    .checked_sub(1)
                    .expect("a destroy succeeded with none alive");
            }
        };
        match op {
            CmdOpcode::AllocUar | CmdOpcode::DeallocUar => {
                inc(&mut self.uars, op == CmdOpcode::AllocUar);
            }
            CmdOpcode::AllocPd | CmdOpcode::DeallocPd => {
                inc(&mut self.pds, op == CmdOpcode::AllocPd)
            }
            CmdOpcode::AllocTransportDomain | CmdOpcode::DeallocTransportDomain => {
                inc(&mut self.tds, op == CmdOpcode::AllocTransportDomain);
            }
            CmdOpcode::CreateEq | CmdOpcode::DestroyEq => {
                inc(&mut self.eqs, op == CmdOpcode::CreateEq)
            }
            CmdOpcode::CreateCq | CmdOpcode::DestroyCq => {
                inc(&mut self.cqs, op == CmdOpcode::CreateCq)
            }
            CmdOpcode::CreateMkey | CmdOpcode::DestroyMkey => {
                inc(&mut self.mkeys, op == CmdOpcode::CreateMkey);
            }
            CmdOpcode::CreateQp | CmdOpcode::DestroyQp => {
                inc(&mut self.qps, op == CmdOpcode::CreateQp)
            }
            CmdOpcode::CreateTis
            | CmdOpcode::CreateSq
            | CmdOpcode::CreateRq
            | CmdOpcode::CreateTir
            | CmdOpcode::DestroyTis
            | CmdOpcode::DestroySq
            | CmdOpcode::DestroyRq
            | CmdOpcode::DestroyTir => {
                let up = matches!(
                    op,
                    CmdOpcode::CreateTis
                        | CmdOpcode::CreateSq
                        | CmdOpcode::CreateRq
                        | CmdOpcode::CreateTir
                );
                inc(&mut self.eth, up);
            }
            // Nothing cascades (steer.rs: nothing in use is destroyed) and SET_FTE only
            // adds (no modify in place): each command is one object.
            CmdOpcode::CreateFlowTable
            | CmdOpcode::CreateFlowGroup
            | CmdOpcode::SetFlowTableEntry
            | CmdOpcode::DestroyFlowTable
            | CmdOpcode::DestroyFlowGroup
            | CmdOpcode::DeleteFlowTableEntry => {
                let up = matches!(
                    op,
                    CmdOpcode::CreateFlowTable
                        | CmdOpcode::CreateFlowGroup
                        | CmdOpcode::SetFlowTableEntry
                );
                inc(&mut self.flow, up);
            }
            CmdOpcode::DisableHca => *self = Model::default(),
            CmdOpcode::ManagePages if op_mod == manage_pages_op_mod::GIVE => {
                let v = ManagePagesIn::new_unchecked(input);
                for i in 0..v.input_num_entries() as usize {
                    let page = v
                        .pas(i)
                        .expect("GIVE succeeded with its page list in the input");
                    assert!(self.pages.insert(page), "GIVE of {page:#x} twice succeeded");
                }
            }
            CmdOpcode::ManagePages if op_mod == manage_pages_op_mod::TAKE => {
                let v = ManagePagesOut::new_unchecked(out);
                for i in 0..v.output_num_entries() as usize {
                    let page = v
                        .pas(i)
                        .expect("TAKE reported more pages than its output holds");
                    assert!(
                        self.pages.remove(&page),
                        "TAKE returned page {page:#x}, which the firmware was not holding"
                    );
                }
            }
            _ => {}
        }
    }

    fn check(&self, rig: &Rig) {
        let a: Accounting = rig.fw.accounting();
        let held: BTreeSet<u64> = rig.fw.pages().into_iter().collect();
        assert_eq!(
            held, self.pages,
            "the firmware holds other pages than were given and not taken back"
        );
        assert_eq!(a.pages_held, self.pages.len());
        let counts = (
            a.uars,
            a.pds,
            a.tds,
            a.eqs,
            a.cqs,
            a.mkeys,
            a.qps,
            a.eth_objects,
            a.flow_objects,
        );
        let want = (
            self.uars, self.pds, self.tds, self.eqs, self.cqs, self.mkeys, self.qps, self.eth,
            self.flow,
        );
        assert_eq!(
            counts, want,
            "object counts (uar, pd, td, eq, cq, mkey, qp, eth, flow) differ from the commands \
             that succeeded"
        );
        if a.phase == Phase::Disabled {
            assert!(self.pages.is_empty(), "a disabled function holds pages");
        }
    }
}

/// What the harness expects of one rung entry, from the mailbox rules of mlx5.md §4 applied
/// to the memory as the driver left it (its own walk, not the firmware's).
#[derive(Debug)]
enum Expect {
    /// The entry is not owned by hardware: ignored, unchanged.
    Ignored,
    /// A transport error; `fault`: a block outside the mapping was named (a counted DMA
    /// fault).
    Refused { status: DeliveryStatus, fault: bool },
    /// Executed: the input as gathered, and the output blocks.
    Run {
        input: Vec<u8>,
        out_blocks: Vec<u64>,
    },
}

fn mapped(iova: u64, len: u64) -> bool {
    iova >= BASE
        && iova
            .checked_add(len)
            .is_some_and(|end| end <= BASE + MAPPED)
}

fn walk(
    mem: &[u8],
    first: u64,
    n: usize,
    token: u8,
    mut data: Option<&mut [u8]>,
    unaligned: DeliveryStatus,
) -> Result<Vec<u64>, (DeliveryStatus, bool)> {
    if !first.is_multiple_of(MAILBOX_ALIGN as u64) {
        return Err((unaligned, false));
    }
    let mut out = Vec::new();
    let mut at = first;
    for k in 0..n {
        if !mapped(at, cmd_if_box::SIZE_BYTES as u64) {
            return Err((DeliveryStatus::FwInternalErr, true));
        }
        let off = (at - BASE) as usize;
        let b = CmdIfBox::new_unchecked(&mem[off..off + cmd_if_box::SIZE_BYTES]);
        if b.block_number() as usize != k {
            return Err((DeliveryStatus::BadBlockNumber, false));
        }
        if b.token() != u32::from(token) {
            return Err((DeliveryStatus::TokenErr, false));
        }
        if let Some(d) = data.as_deref_mut() {
            let from = k * MAILBOX_DATA_BYTES;
            let len = (d.len() - from).min(MAILBOX_DATA_BYTES);
            d[from..from + len].copy_from_slice(&b.mailbox_data()[..len]);
        }
        out.push(at);
        at = (u64::from(b.next_pointer_63_32()) << 32) | (u64::from(b.next_pointer_31_10()) << 10);
    }
    Ok(out)
}

fn expect(mem: &[u8], slot: u32) -> Expect {
    let off = (CMDQ + u64::from(slot) * ENTRY as u64) as usize;
    let e = CmdQueueEntry::new_unchecked(&mem[off..off + ENTRY]);
    if e.ownership() != 1 {
        return Expect::Ignored;
    }
    let refused = |status| Expect::Refused {
        status,
        fault: false,
    };
    if e.r#type() != CMD_TYPE_PCIE {
        return refused(DeliveryStatus::BadCmdType);
    }
    let (inlen, outlen) = (e.input_length() as usize, e.output_length() as usize);
    if inlen > MAX_CMD_BYTES {
        return refused(DeliveryStatus::InputLenErr);
    }
    if outlen > MAX_CMD_BYTES {
        return refused(DeliveryStatus::OutputLenErr);
    }
    let token = e.token() as u8;
    let mut input = vec![0u8; inlen];
    let inline = inlen.min(CMD_INLINE_BYTES);
    input[..inline].copy_from_slice(&e.command_input_inline_data()[..inline]);
    let ptr = |h: u32, l: u32| (u64::from(h) << 32) | (u64::from(l) << 9);
    if inlen > CMD_INLINE_BYTES {
        let first = ptr(
            e.input_mailbox_pointer_63_32(),
            e.input_mailbox_pointer_31_9(),
        );
        let data = Some(&mut input[CMD_INLINE_BYTES..]);
        let r = walk(
            mem,
            first,
            blocks(inlen),
            token,
            data,
            DeliveryStatus::InputPointerNotAligned,
        );
        if let Err((status, fault)) = r {
            return Expect::Refused { status, fault };
        }
    }
    let mut out_blocks = Vec::new();
    if outlen > CMD_INLINE_BYTES {
        let first = ptr(
            e.output_mailbox_pointer_63_32(),
            e.output_mailbox_pointer_31_9(),
        );
        match walk(
            mem,
            first,
            blocks(outlen),
            token,
            None,
            DeliveryStatus::OutputPointerNotAligned,
        ) {
            Ok(b) => out_blocks = b,
            Err((status, fault)) => return Expect::Refused { status, fault },
        }
    }
    Expect::Run { input, out_blocks }
}

/// The bytes of the mapping one completed command may change: the entry's output inline
/// bytes and status byte, and the data areas of its output blocks up to `outlen`.
fn allowed(slot: u32, outlen: usize, out_blocks: &[u64]) -> Vec<(usize, usize)> {
    let entry = (CMDQ + u64::from(slot) * ENTRY as u64) as usize;
    let inline = cmd_queue_entry::command_output_inline_data.byte_offset();
    let own = cmd_queue_entry::ownership.byte_offset();
    let mut v = vec![
        (entry + inline, entry + inline + CMD_INLINE_BYTES),
        (entry + own, entry + own + 1),
    ];
    let mut left = outlen.saturating_sub(CMD_INLINE_BYTES);
    for &b in out_blocks {
        let n = left.min(MAILBOX_DATA_BYTES);
        let at = (b - BASE) as usize;
        v.push((at, at + n));
        left -= n;
    }
    v
}

/// Check one rung slot against what was expected of it (`rig` refreshed after the ring;
/// `before`: the entry as the driver left it).
fn check_slot(
    rig: &Rig,
    model: &mut Model,
    slot: u32,
    before: &[u8; ENTRY],
    ex: Expect,
    faults: u64,
) {
    let off = (CMDQ + u64::from(slot) * ENTRY as u64) as usize;
    let mem = rig.image();
    let e = &mem[off..off + ENTRY];
    let v = CmdQueueEntry::new_unchecked(e);
    match ex {
        Expect::Ignored => {
            assert_eq!(
                e,
                &before[..],
                "slot {slot}: an entry owned by software was changed"
            );
        }
        Expect::Refused { status, fault } => {
            assert_eq!(
                v.ownership(),
                0,
                "slot {slot}: a refused entry stayed with hardware"
            );
            let got = DeliveryStatus::from_raw(v.status() as u8);
            assert_eq!(got, status, "slot {slot}: delivery status");
            if fault {
                assert!(
                    faults > 0,
                    "slot {slot}: a block outside the mapping was not a DMA fault"
                );
            }
        }
        Expect::Run { input, out_blocks } => {
            assert_eq!(
                v.ownership(),
                0,
                "slot {slot}: an executed entry stayed with hardware"
            );
            let got = DeliveryStatus::from_raw(v.status() as u8);
            assert_eq!(
                got,
                DeliveryStatus::Ok,
                "slot {slot}: a well-formed chain was refused"
            );
            let outlen = v.output_length() as usize;
            let mut out = vec![0u8; outlen.max(CMD_INLINE_BYTES)];
            out[..CMD_INLINE_BYTES].copy_from_slice(v.command_output_inline_data());
            let data = cmd_if_box::mailbox_data.byte_offset();
            let mut at = CMD_INLINE_BYTES;
            for &b in &out_blocks {
                let n = (outlen - at).min(MAILBOX_DATA_BYTES);
                let from = (b - BASE) as usize + data;
                out[at..at + n].copy_from_slice(&mem[from..from + n]);
                at += n;
            }
            let (st, syndrome) = status(&out);
            let cs = CmdStatus::from_raw(st);
            assert!(
                cs.name().is_some(),
                "slot {slot}: unknown command status {st:#x}"
            );
            if st != 0 {
                assert_ne!(syndrome, 0, "slot {slot}: {cs} with a zero syndrome");
            } else {
                assert_eq!(
                    syndrome, 0,
                    "slot {slot}: success with syndrome {syndrome:#x}"
                );
                let op =
                    CmdOpcode::from_raw(MboxIn::new_unchecked(&before[0x10..0x20]).opcode() as u16);
                model.apply(op, &input, &out);
            }
        }
    }
}

/// Every changed byte of the mapping lies in `allowed`.
fn check_writes(diffs: &[(usize, u8, u8)], allowed: &[(usize, usize)]) {
    for &(i, old, new) in diffs {
        if !allowed.iter().any(|&(s, e)| (s..e).contains(&i)) {
            panic!(
                "the device wrote IOVA {:#x} ({old:#x} -> {new:#x}), which no command output names",
                BASE + i as u64,
            );
        }
    }
}

/// One hostile command: an opcode (known or any), op_mod, lengths, a body with patches
/// naming pool pages, bad addresses and small object numbers, and a transport tweak.
fn hostile_command(rig: &mut Rig, inp: &mut Input<'_>) -> u32 {
    let pick = inp.u8();
    let (op, spec_in, spec_out) = if pick < 224 {
        let k = KNOWN[usize::from(pick) % KNOWN.len()];
        (k.0.as_raw(), k.1, k.2)
    } else {
        (inp.u16(), 16, 16)
    };
    let m = inp.u8();
    let op_mod = if m < 0xf0 {
        u32::from(m & 0xf)
    } else {
        u32::from(inp.u16())
    };
    let len = |inp: &mut Input<'_>, spec: usize| {
        let l = inp.u8();
        match l >> 6 {
            0 | 1 => spec + 8 * usize::from(l & 0xf),
            2 => usize::from(inp.u16()) % (BLOCKS * MAILBOX_DATA_BYTES + 32),
            _ => [
                0,
                1,
                8,
                15,
                16,
                17,
                528,
                529,
                spec - 1,
                MAX_CMD_BYTES,
                MAX_CMD_BYTES + 1,
            ][usize::from(l & 0x3f) % 11],
        }
    };
    let inlen = len(inp, spec_in);
    let outlen = len(inp, spec_out);
    let body_len = inlen.min(BLOCKS * MAILBOX_DATA_BYTES + CMD_INLINE_BYTES);
    let mut input = cmd(CmdOpcode::from_raw(op), op_mod, body_len);
    for _ in 0..inp.u8() % 8 {
        let at = (usize::from(inp.u16()) % body_len.max(1)) & !3;
        let kind = inp.u8() % 6;
        let val: Vec<u8> = match kind {
            0 => inp.u32().to_be_bytes().to_vec(),
            1 => u32::from(inp.u8() % 8).to_be_bytes().to_vec(),
            2 => pool_page(u64::from(inp.u8()) % POOL_PAGES)
                .to_be_bytes()
                .to_vec(),
            3 => BAD_ADDRS[usize::from(inp.u8()) % BAD_ADDRS.len()]
                .to_be_bytes()
                .to_vec(),
            4 => {
                let n = usize::from(inp.u8() % 32);
                inp.bytes(n).to_vec()
            }
            _ => inp.u64().to_be_bytes().to_vec(),
        };
        let end = (at + val.len()).min(input.len());
        if at < end {
            input[at..end].copy_from_slice(&val[..end - at]);
        }
    }
    // The header stays: opcode and op_mod as chosen (patches may have hit them).
    input[..2].copy_from_slice(&op.to_be_bytes());
    let slot = u32::from(inp.u8() % 32);
    let tweak = inp.u8();
    let nin = blocks(input.len()).min(BLOCKS);
    let nout = blocks(outlen).min(BLOCKS);
    let mut token = TOKEN;
    if tweak == 0xff {
        token = inp.u8();
    }
    rig.write_chain(
        INBOX,
        input.get(CMD_INLINE_BYTES..).unwrap_or(&[]),
        nin,
        token,
    );
    rig.write_chain(OUTBOX, &[], nout, token);
    let mut entry = Rig::entry(&input, outlen, token);
    let _ = CmdQueueEntry::new_unchecked(&mut entry[..]).set_input_length(inlen as u32);
    if tweak >= 0x80 {
        let k = usize::from(inp.u8()) % BLOCKS.max(1);
        let block = |base: u64| base + (k * MAILBOX_ALIGN) as u64;
        let mut e = CmdQueueEntry::new_unchecked(&mut entry[..]);
        match tweak % 12 {
            0 => {
                let _ = e.set_ownership(0);
            }
            1 => {
                let _ = e.set_type(u32::from(inp.u8()));
            }
            2 => {
                let (h, l) = split(BAD_ADDRS[usize::from(inp.u8()) % BAD_ADDRS.len()]);
                let _ = e.set_input_mailbox_pointer_63_32(h);
                let _ = e.set_input_mailbox_pointer_31_9(l);
            }
            3 => {
                let (h, l) = split(BAD_ADDRS[usize::from(inp.u8()) % BAD_ADDRS.len()]);
                let _ = e.set_output_mailbox_pointer_63_32(h);
                let _ = e.set_output_mailbox_pointer_31_9(l);
            }
            4 | 5 => {
                let at = block(if tweak % 12 == 4 { INBOX } else { OUTBOX });
                let num = cmd_if_box::block_number.byte_offset() as u64;
                rig.write(at + num, &inp.u32().to_be_bytes());
            }
            6 => {
                let at = block(INBOX) + cmd_if_box::token.byte_offset() as u64;
                rig.write(at, &[inp.u8()]);
            }
            7 => {
                let _ = e.set_token(u32::from(inp.u8()));
            }
            8 => {
                let at = block(INBOX) + cmd_if_box::next_pointer_63_32.byte_offset() as u64;
                let next = BAD_ADDRS[usize::from(inp.u8()) % BAD_ADDRS.len()];
                rig.write(at, &(next >> 32).to_be_bytes()[4..]);
                rig.write(at + 4, &((next as u32) & !0x3ff).to_be_bytes());
            }
            9 => {
                let _ = e.set_input_length(inp.u32());
            }
            10 => {
                let _ = e.set_output_length(inp.u32());
            }
            _ => {
                let at = block(OUTBOX) + cmd_if_box::token.byte_offset() as u64;
                rig.write(at, &[inp.u8()]);
            }
        }
    }
    rig.write(CMDQ + u64::from(slot) * ENTRY as u64, &entry);
    slot
}

/// Ring `bits` and check every rung slot, the model, the canary and (while no EQ could
/// take command events) that nothing but the named outputs changed. False when the ring
/// overwrote rung entries (see [`overwritten`]): the input's later commands are skipped.
fn ring_and_check(rig: &mut Rig, model: &mut Model, bits: u32) -> bool {
    let before = rig.image();
    let mut writable = Vec::new();
    let mut expected = Vec::new();
    for slot in (0..32).filter(|s| bits & (1 << s) != 0) {
        let off = (CMDQ + u64::from(slot) * ENTRY as u64) as usize;
        let mut entry = [0u8; ENTRY];
        entry.copy_from_slice(&before[off..off + ENTRY]);
        let ex = expect(before, slot);
        let outlen = CmdQueueEntry::new_unchecked(&entry[..]).output_length() as usize;
        match &ex {
            Expect::Run { out_blocks, .. } => writable.extend(allowed(slot, outlen, out_blocks)),
            Expect::Refused { .. } => writable.extend(allowed(slot, 0, &[])),
            Expect::Ignored => {}
        }
        expected.push((slot, entry, ex));
    }
    let eqs = model.eqs;
    let faults0 = rig.dev.dma().stats().faults.load(Ordering::Relaxed);
    rig.ring(bits);
    let faults = rig.dev.dma().stats().faults.load(Ordering::Relaxed) - faults0;
    let diffs = rig.refresh();
    rig.assert_canary();
    if overwritten(rig, &expected) {
        return false;
    }
    for (slot, entry, ex) in expected {
        check_slot(rig, model, slot, &entry, ex, faults);
    }
    model.check(rig);
    if eqs == 0 && model.eqs == 0 {
        check_writes(&diffs, &writable);
    }
    true
}

/// Whether a rung entry changed where its own completion never writes (anything but its
/// output inline bytes and its status/ownership byte; an ignored entry anywhere). The
/// device writes wherever the driver pointed it: an EQ whose ring lies over the command
/// queue page gets its command-completion EQEs there, an output mailbox there gets the
/// output, and either overwrites entries — then what each slot completed with can no
/// longer be read back, and the rest of the input is not checked entry by entry (the reset
/// before the next input restores the function and asserts that it did). An overwrite
/// with no such explanation is a finding: it asserts that an EQ exists or a rung slot's
/// output block lies in the queue.
fn overwritten(rig: &Rig, expected: &[(u32, [u8; ENTRY], Expect)]) -> bool {
    let mem = rig.image();
    let inline = cmd_queue_entry::command_output_inline_data.byte_offset();
    let own = cmd_queue_entry::ownership.byte_offset();
    let device_writes = |i: usize| (inline..inline + CMD_INLINE_BYTES).contains(&i) || i == own;
    let changed = expected.iter().any(|(slot, entry, ex)| {
        let off = (CMDQ + u64::from(*slot) * ENTRY as u64) as usize;
        let now = &mem[off..off + ENTRY];
        (0..ENTRY)
            .any(|i| now[i] != entry[i] && (matches!(ex, Expect::Ignored) || !device_writes(i)))
    });
    if !changed {
        return false;
    }
    let queue = CMDQ..CMDQ + 32 * ENTRY as u64;
    let mailbox_in_queue = expected.iter().any(|(_, _, ex)| match ex {
        Expect::Run { out_blocks, .. } => out_blocks.iter().any(|&b| {
            let at = b - BASE;
            at < queue.end && at + cmd_if_box::SIZE_BYTES as u64 > queue.start
        }),
        _ => false,
    });
    assert!(
        rig.fw.accounting().eqs > 0 || mailbox_in_queue,
        "a rung entry changed outside its output bytes with no EQ and no output mailbox \
         in the command queue"
    );
    true
}

/// The `mlx5_firmware` harness: an emulated function in process (device, firmware, a memfd
/// of which only part is DMA-mapped) and a sequence of hostile commands from `data`, each
/// written into the command queue with its mailbox chains and rung through the emulator's
/// doorbell path. The first byte chooses whether the function is first brought up honestly
/// (ENABLE_HCA … INIT_HCA), so the resource commands are reachable, and whether a UAR, a
/// PD, a transport domain and (another bit) an EQ and a CQ follow, so the raw Ethernet
/// commands (TIS, SQ, RQ, TIR) have what they name (see [`objects_prefix`]); the flow
/// steering commands need only the bring-up. The function is the thread's shared rig, reset
/// before each input (see [`super::with_rig`]): whatever an input leaves (objects — raw
/// Ethernet and flow steering ones included —, pages, a torn-down or disabled function, a
/// broken queue address) the function-level reset undoes, and the reset asserts that it did
/// (accounting, pages and DMA mappings equal to a fresh rig's), so no input needs a fresh
/// function.
///
/// Asserts, for every rung slot: an entry owned by software is ignored and unchanged; an
/// owned one is completed (ownership back to software) with exactly the delivery status the
/// mailbox rules give for the memory the driver left (the harness's own walk: type, lengths,
/// pointer alignment, every block mapped, block numbers, tokens), a block outside the
/// mapping counted as a DMA fault; a delivered output carries a known command status, a
/// nonzero syndrome on error and zero on success. After each ring: the pages the firmware
/// holds are exactly those given and not taken back (never a page it was not given), the
/// UAR/PD/TD/EQ/CQ/MKey/QP counts, the raw Ethernet objects (TIS/SQ/RQ/TIR) and the flow
/// objects (tables, groups, entries) match the commands that succeeded, no byte of the memfd
/// outside the mapping changed, and (while no EQ exists to take command events) no mapped
/// byte changed but the rung entries' outputs and their output mailboxes' data.
pub fn command_queue(data: &[u8]) {
    super::with_rig(|rig| commands(rig, data));
}

/// What one [`run`] left: the firmware's accounting at the end, and what its counters
/// counted during the input (the rig is shared by the thread's inputs; its counters are
/// not reset with it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct End {
    /// The firmware's accounting after the last command.
    pub accounting: Accounting,
    /// The firmware's counters, this input's share.
    pub stats: Counted,
    /// The mapped bytes at the end.
    pub memory: Vec<u8>,
    /// The DMA faults the input caused.
    pub dma_faults: u64,
}

/// What the firmware counted during one input (its [`FirmwareStats`] are not reset with
/// the rig: `after - before`, the zero entries dropped).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counted {
    /// Commands completed, by raw opcode.
    pub commands: BTreeMap<u16, u64>,
    /// Commands completed with a nonzero command status, by raw status.
    pub errors: BTreeMap<u8, u64>,
    /// Entries completed with a nonzero delivery status, by raw delivery status.
    pub delivery_errors: BTreeMap<u8, u64>,
    /// Rings of slots whose entry was owned by software.
    pub ignored_not_owned: u64,
}

impl Counted {
    fn between(before: &FirmwareStats, after: &FirmwareStats) -> Counted {
        fn map<K: Ord + Copy>(a: &BTreeMap<K, u64>, b: &BTreeMap<K, u64>) -> BTreeMap<K, u64> {
            a.iter()
                .map(|(k, v)| (*k, v - b.get(k).copied().unwrap_or(0)))
                .filter(|&(_, v)| v != 0)
                .collect()
        }
        Counted {
            commands: map(&after.commands, &before.commands),
            errors: map(&after.errors, &before.errors),
            delivery_errors: map(&after.delivery_errors, &before.delivery_errors),
            ignored_not_owned: after.ignored_not_owned - before.ignored_not_owned,
        }
    }

    /// Commands of `op` completed.
    pub fn executed(&self, op: CmdOpcode) -> u64 {
        self.commands.get(&op.as_raw()).copied().unwrap_or(0)
    }
}

/// [`command_queue`], returning what it left.
pub fn run(data: &[u8]) -> End {
    super::with_rig(|rig| {
        let stats0 = rig.fw.stats();
        let faults0 = rig.dev.dma().stats().faults.load(Ordering::Relaxed);
        commands(rig, data);
        rig.refresh();
        End {
            accounting: rig.fw.accounting(),
            stats: Counted::between(&stats0, &rig.fw.stats()),
            memory: rig.image().to_vec(),
            dma_faults: rig.dev.dma().stats().faults.load(Ordering::Relaxed) - faults0,
        }
    })
}

/// The input's commands on a fresh (or freshly reset) rig.
fn commands(rig: &mut Rig, data: &[u8]) {
    let mut inp = Input::new(data);
    rig.refresh();
    let mut model = Model::default();
    let first = inp.u8();
    if first & 1 == 1 {
        rig.bring_up(first & 2 == 2);
        for i in 0..48 {
            model.pages.insert(pool_page(i));
        }
        if first & 4 == 4 {
            objects_prefix(rig, &mut model, first & 8 == 8);
        }
        rig.refresh();
        model.check(rig);
    }
    let mut n = 0;
    while !inp.is_empty() && n < MAX_COMMANDS {
        n += 1;
        let what = inp.u8();
        let bits = if what < 0xf0 {
            let slot = hostile_command(rig, &mut inp);
            1u32 << slot
        } else {
            // Ring slots at random: stale entries, ignored ones, several at once.
            inp.u32()
        };
        if !ring_and_check(rig, &mut model, bits) {
            return;
        }
    }
}

/// The objects the raw Ethernet commands name, made honestly after the bring-up: a UAR, a
/// PD and a transport domain (PD and TD number 1: what a TIS, a TIR and a work queue need),
/// and with `queues` an EQ (no events) and a CQ (64 CQEs, number 1) on it, so an SQ and an
/// RQ can be created and a frame can complete. (An EQ turns the stray-write check off
/// for the input, as one the input creates does: a CQ's completions and an EQ's events are
/// device writes no command output names.)
fn objects_prefix(rig: &mut Rig, model: &mut Model, queues: bool) {
    let mut uar = 0;
    for op in [
        CmdOpcode::AllocUar,
        CmdOpcode::AllocPd,
        CmdOpcode::AllocTransportDomain,
    ] {
        let c = cmd(op, 0, 0x10);
        let out = rig.ok(&c, 0x10);
        if op == CmdOpcode::AllocUar {
            uar = AllocUarOut::new_unchecked(&out[..]).uar();
        }
        model.apply(op, &c, &out);
    }
    // The watcher's first look at the new UAR page is not a doorbell.
    rig.scan();
    if queues {
        let mut ring = vec![0u8; 4096];
        for e in ring.chunks_mut(64) {
            e[63] = 1;
        }
        rig.write(PREFIX_EQ, &ring);
        for e in ring.chunks_mut(64) {
            e[63] = 0xf0;
        }
        rig.write(PREFIX_CQ, &ring);
        let eqn = rig.create_eq(PREFIX_EQ, uar, 0, 0);
        rig.create_cq(6, uar, eqn, PREFIX_CQ, PREFIX_CQ_DBR);
        model.eqs += 1;
        model.cqs += 1;
    }
}

/// The accounting check fires on a firmware that holds a page it was not given (forged by
/// giving one behind the model's back).
#[cfg(test)]
pub(crate) fn check_a_forged_page() {
    let mut rig = Rig::new();
    rig.bring_up(false);
    rig.give(&[pool_page(60)]);
    let mut model = Model::default();
    for i in 0..48 {
        model.pages.insert(pool_page(i));
    }
    model.check(&rig);
}

/// The delivery check fires when an entry completes with another status than the mailbox
/// rules give (forged: an honest entry expected to fail with a token error).
#[cfg(test)]
pub(crate) fn check_a_forged_delivery() {
    let mut rig = Rig::new();
    let c = cmd(CmdOpcode::EnableHca, 0, 0x10);
    let entry = Rig::entry(&c, 0x10, TOKEN);
    rig.write(CMDQ, &entry);
    rig.ring(1);
    rig.refresh();
    let ex = Expect::Refused {
        status: DeliveryStatus::TokenErr,
        fault: false,
    };
    check_slot(&rig, &mut Model::default(), 0, &entry, ex, 0);
}

/// The stray-write check fires on a byte no output names.
#[cfg(test)]
pub(crate) fn check_a_forged_write() {
    check_writes(&[(0x1234, 0, 1)], &[(0, 0x1000)]);
}

/// Hand-made programs for the seed corpus.
pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let known = |op: CmdOpcode| KNOWN.iter().position(|k| k.0 == op).expect("known") as u8;
    // command: what, pick, op_mod byte, inlen sel, outlen sel, patch count, patches…, slot,
    // tweak[, tweak args].
    let simple = |op: CmdOpcode, op_mod: u8, slot: u8, tweak: &[u8]| {
        let mut v = vec![0, known(op), op_mod, 0, 0, 0, slot];
        v.extend_from_slice(tweak);
        v
    };
    let mut give = vec![0, known(CmdOpcode::ManagePages), 1, 2, 0, 3];
    // input_num_entries = 2 at 0x0c; two spare pool pages at 0x10 and 0x18.
    give.extend_from_slice(&[0, 0x0c, 1, 2]);
    give.extend_from_slice(&[0, 0x10, 2, 50]);
    give.extend_from_slice(&[0, 0x18, 2, 51]);
    give.extend_from_slice(&[3, 0]);
    let mut take = vec![0, known(CmdOpcode::ManagePages), 2, 0, 2, 1];
    take.extend_from_slice(&[0, 0x0c, 1, 2]);
    take.extend_from_slice(&[4, 0]);
    let mut up_and_objects = vec![1];
    for op in [
        CmdOpcode::AllocUar,
        CmdOpcode::AllocPd,
        CmdOpcode::AllocTransportDomain,
        CmdOpcode::QueryHcaCap,
        CmdOpcode::QueryNicVportContext,
    ] {
        up_and_objects.extend(simple(op, 0, 1, &[0]));
    }
    // DEALLOC_PD of PD 1 (its number at byte 8).
    up_and_objects.extend([0, known(CmdOpcode::DeallocPd), 0, 0, 0, 1, 0, 8, 1, 1, 2, 0]);
    up_and_objects.extend(&give);
    up_and_objects.extend(&take);
    let mut bring_up_by_hand = vec![0];
    bring_up_by_hand.extend(simple(CmdOpcode::EnableHca, 0, 0, &[0]));
    bring_up_by_hand.extend(simple(CmdOpcode::QueryIssi, 0, 0, &[0]));
    bring_up_by_hand.extend(simple(CmdOpcode::QueryPages, 1, 2, &[0]));
    bring_up_by_hand.extend(simple(CmdOpcode::DisableHca, 0, 3, &[0]));
    // Transport tweak `case` (see `hostile_command`): the tweak byte is >= 0x80 and
    // selects case `byte % 12`; then the block index k and the case's argument.
    let tw = |case: u8| 0x80 + (case + 4) % 12;
    let mut broken = vec![1];
    for (op, tweak) in [
        (CmdOpcode::QueryHcaCap, vec![tw(0), 0]),
        (CmdOpcode::QueryHcaCap, vec![tw(1), 0, 3]),
        (CmdOpcode::SetDriverVersion, vec![tw(2), 0, 0]),
        (CmdOpcode::SetDriverVersion, vec![tw(2), 0, 3]),
        (CmdOpcode::QueryHcaCap, vec![tw(3), 0, 3]),
        (CmdOpcode::SetDriverVersion, vec![tw(4), 0, 0, 0, 0, 9]),
        (CmdOpcode::QueryHcaCap, vec![tw(5), 2, 0, 0, 0, 9]),
        (CmdOpcode::SetDriverVersion, vec![tw(6), 0, 0x33]),
        (CmdOpcode::QueryHcaCap, vec![tw(7), 0, 0x33]),
        (CmdOpcode::QueryHcaCap, vec![tw(10), 0, 0, 0x20, 0, 0]),
    ] {
        broken.extend(simple(op, 1, 5, &tweak));
    }
    broken.extend_from_slice(&[0xf0, 0xff, 0xff, 0xff, 0xff]);
    let (flow, hostile_flow) = flow_programs();
    vec![
        ("up-and-objects", up_and_objects),
        ("bring-up-by-hand", bring_up_by_hand),
        ("broken-transports", broken),
        ("flow-table-group-entry", flow),
        ("hostile-flow-tables", hostile_flow),
        ("raw-rq-tir-steered", raw_program()),
    ]
}

/// One honest command of a program on `slot`: `op` (from [`KNOWN`], its PRM lengths) with
/// `op_mod` (< 16) and `f`'s fields, the nonzero bytes of the body carried as raw patches
/// (runs of up to 28 bytes from a nonzero dword; at most 7), no transport tweak.
fn honest(op: CmdOpcode, op_mod: u8, slot: u8, f: impl FnOnce(&mut [u8])) -> Vec<u8> {
    let k = KNOWN.iter().position(|k| k.0 == op).expect("known");
    let mut body = vec![0u8; KNOWN[k].1];
    f(&mut body);
    let mut patches = Vec::new();
    let mut at = 8;
    while at < body.len() {
        if body[at..at + 4] == [0; 4] {
            at += 4;
            continue;
        }
        let end = (at + 28).min(body.len());
        let mut p = (at as u16).to_be_bytes().to_vec();
        p.extend([4, (end - at) as u8]);
        p.extend(&body[at..end]);
        patches.push(p);
        at = end;
    }
    assert!(patches.len() < 8, "{op}: too many patches");
    let mut v = vec![0, k as u8, op_mod, 0, 0, patches.len() as u8];
    v.extend(patches.concat());
    v.extend([slot, 0]);
    v
}

/// The flow steering programs after an honest bring-up: a table, a group matching the
/// ethertype, a DROP entry, a second table of a higher level and an entry forwarding to
/// it, the root set, the entry and the table queried (all accepted: five flow objects);
/// and hostile parameters the PRM refuses (see `tests.rs`): a table over
/// `log_max_ft_size` and of another type, a group beyond its table and one with a mask
/// outside its enabled sets, an entry outside its group, one forwarding to a table of a
/// level not above its own, one with a value outside the group's mask, a root of a table
/// that does not exist — then the valid table destroyed while it has a group (in use).
fn flow_programs() -> (Vec<u8>, Vec<u8>) {
    use rnic_mlx5_prm::{
        CreateFlowGroupIn, CreateFlowTableIn, DestroyFlowTableIn, QueryFlowTableIn, QueryFteIn,
        SetFlowTableRootIn, SetFteIn, flow_action, flow_destination_type, match_criteria,
    };
    let table = |level: u32, log_size: u32, ty: u32| {
        honest(CmdOpcode::CreateFlowTable, 0, 1, move |b| {
            let mut v = CreateFlowTableIn::new_unchecked(b);
            let _ = v.set_table_type(ty);
            let _ = v.flow_table_context_mut().set_level(level);
            let _ = v.flow_table_context_mut().set_log_size(log_size);
        })
    };
    let group = |table: u32, range: (u32, u32), enable: u32, misc: bool| {
        honest(CmdOpcode::CreateFlowGroup, 0, 2, move |b| {
            let mut v = CreateFlowGroupIn::new_unchecked(b);
            let _ = v.set_table_id(table);
            let _ = v.set_start_flow_index(range.0);
            let _ = v.set_end_flow_index(range.1);
            let _ = v.set_match_criteria_enable(enable);
            let mut m = v.match_criteria_mut();
            let _ = m.outer_headers_mut().set_ethertype(0xffff);
            if misc {
                let _ = m.misc_parameters_mut().set_source_port(1);
            }
        })
    };
    let entry = |table: u32, index: u32, ethertype: u32, vlan: bool, dest: Option<(u32, u32)>| {
        honest(CmdOpcode::SetFlowTableEntry, 0, 3, move |b| {
            let mut v = SetFteIn::new_unchecked(b);
            let _ = v.set_table_id(table);
            let _ = v.set_flow_index(index);
            let mut fc = v.flow_context_mut();
            let _ = fc.set_group_id(1);
            let mut o = fc.match_value_mut();
            let _ = o.outer_headers_mut().set_ethertype(ethertype);
            if vlan {
                let _ = o.outer_headers_mut().set_first_vid(7);
            }
            match dest {
                Some((ty, id)) => {
                    let _ = fc.set_action(flow_action::FWD_DEST);
                    let _ = fc.set_destination_list_size(1);
                    if let Some(mut d) = fc.destination_mut(0) {
                        let _ = d.destination_entry_mut().set_destination_type(ty);
                        let _ = d.destination_entry_mut().set_destination_id(id);
                    }
                }
                None => {
                    let _ = fc.set_action(flow_action::DROP);
                }
            }
        })
    };
    let root = |table: u32| {
        honest(CmdOpcode::SetFlowTableRoot, 0, 4, move |b| {
            let _ = SetFlowTableRootIn::new_unchecked(b).set_table_id(table);
        })
    };
    let outer = match_criteria::OUTER_HEADERS;
    let to_table = flow_destination_type::FLOW_TABLE;
    let mut good = vec![1];
    good.extend(table(0, 2, 0));
    good.extend(group(1, (0, 1), outer, false));
    good.extend(entry(1, 0, 0x0806, false, None));
    good.extend(table(1, 0, 0));
    good.extend(entry(1, 1, 0x86dd, false, Some((to_table, 2))));
    good.extend(root(1));
    good.extend(honest(CmdOpcode::QueryFlowTableEntry, 0, 5, |b| {
        let mut v = QueryFteIn::new_unchecked(b);
        let _ = v.set_table_id(1);
        let _ = v.set_flow_index(1);
    }));
    good.extend(honest(CmdOpcode::QueryFlowTable, 0, 6, |b| {
        let _ = QueryFlowTableIn::new_unchecked(b).set_table_id(2);
    }));
    let mut bad = vec![1];
    bad.extend(table(0, 17, 0));
    bad.extend(table(0, 2, 1));
    bad.extend(table(0, 2, 0));
    bad.extend(group(1, (2, 4), outer, false));
    bad.extend(group(1, (0, 1), outer, true));
    bad.extend(group(1, (0, 1), outer, false));
    bad.extend(entry(1, 2, 0x0806, false, None));
    bad.extend(entry(1, 0, 0x0806, true, None));
    bad.extend(entry(1, 0, 0x0806, false, Some((to_table, 1))));
    bad.extend(root(9));
    bad.extend(honest(CmdOpcode::DestroyFlowTable, 0, 7, |b| {
        let _ = DestroyFlowTableIn::new_unchecked(b).set_table_id(1);
    }));
    (good, bad)
}

/// After the objects prefix (UAR, PD, TD, EQ, CQ): an RQ on the spare pool pages, a TIR
/// on it, a flow table whose entry forwards to the TIR and is the root, the RQ taken to
/// RDY and queried (all accepted: two raw objects, three flow objects).
fn raw_program() -> Vec<u8> {
    use rnic_mlx5_prm::{
        CreateFlowGroupIn, CreateFlowTableIn, CreateRqIn, CreateTirIn, ModifyRqIn, QueryRqIn,
        RQ_MEM_TYPE_INLINE, SetFlowTableRootIn, SetFteIn, flow_action, flow_destination_type,
        wq_type,
    };
    let rqn = FIRST_RAW_QPN;
    let mut v = vec![1 | 4 | 8];
    v.extend(honest(CmdOpcode::CreateRq, 0, 1, |b| {
        let mut c = CreateRqIn::new_unchecked(b);
        let mut x = c.ctx_mut();
        let _ = x.set_vsd(1);
        let _ = x.set_mem_rq_type(RQ_MEM_TYPE_INLINE);
        let _ = x.set_cqn(1);
        let mut w = x.wq_mut();
        let _ = w.set_wq_type(wq_type::CYCLIC);
        let _ = w.set_pd(1);
        let _ = w.set_dbr_addr(pool_page(51));
        let _ = w.set_log_wq_stride(4);
        let _ = w.set_log_wq_sz(2);
        let _ = w.set_pas(0, pool_page(50));
    }));
    v.extend(honest(CmdOpcode::CreateTir, 0, 2, |b| {
        let mut c = CreateTirIn::new_unchecked(b);
        let mut x = c.ctx_mut();
        let _ = x.set_inline_rqn(rqn);
        let _ = x.set_transport_domain(1);
    }));
    v.extend(honest(CmdOpcode::CreateFlowTable, 0, 3, |b| {
        let _ = CreateFlowTableIn::new_unchecked(b)
            .flow_table_context_mut()
            .set_log_size(1);
    }));
    v.extend(honest(CmdOpcode::CreateFlowGroup, 0, 4, |b| {
        let mut c = CreateFlowGroupIn::new_unchecked(b);
        let _ = c.set_table_id(1);
        let _ = c.set_end_flow_index(1);
    }));
    v.extend(honest(CmdOpcode::SetFlowTableEntry, 0, 5, |b| {
        let mut c = SetFteIn::new_unchecked(b);
        let _ = c.set_table_id(1);
        let mut fc = c.flow_context_mut();
        let _ = fc.set_group_id(1);
        let _ = fc.set_action(flow_action::FWD_DEST);
        let _ = fc.set_destination_list_size(1);
        if let Some(mut d) = fc.destination_mut(0) {
            let _ = d
                .destination_entry_mut()
                .set_destination_type(flow_destination_type::TIR);
            let _ = d.destination_entry_mut().set_destination_id(1);
        }
    }));
    v.extend(honest(CmdOpcode::SetFlowTableRoot, 0, 6, |b| {
        let _ = SetFlowTableRootIn::new_unchecked(b).set_table_id(1);
    }));
    v.extend(honest(CmdOpcode::ModifyRq, 0, 7, |b| {
        let mut c = ModifyRqIn::new_unchecked(b);
        let _ = c.set_rqn(rqn);
        let _ = c.ctx_mut().set_state(1);
    }));
    v.extend(honest(CmdOpcode::QueryRq, 0, 8, |b| {
        let _ = QueryRqIn::new_unchecked(b).set_rqn(rqn);
    }));
    v
}
