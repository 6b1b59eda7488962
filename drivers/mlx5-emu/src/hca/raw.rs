//! Raw Ethernet objects (K `mlx5_ifc.h`): TIS, SQ, RQ, TIR — their commands with the checks
//! a ConnectX makes — and their data path: a raw SQ's WQEs (control + Ethernet segment with
//! inline headers + data segments) become frames on the port; a frame a flow table rule sends
//! to a TIR lands in its RQ's next WQE with a receive CQE.
//!
//! SQNs and RQNs come from the QP number space (they are QPs to the hardware). An SQ names one
//! TIS (`tis_lst_sz` 1) and rings the send doorbell of its UAR page with its SQN in the control
//! segment, as a QP does; an RQ has no doorbell: the receive counter of its doorbell record says
//! how many WQEs are posted. The states are RST → RDY ⇄ ERR → RST (MODIFY_SQ/RQ name the current
//! state and the next); an SQ in ERR flushes what is posted (WR_FLUSHED), an RQ in ERR takes no
//! frame.

use std::collections::BTreeMap;

use rnic_core::{Lkey, PdHandle};
use rnic_mlx5_prm::{
    CmdStatus, Cqe64, CqeOpcode, CqeSyndrome, CreateRqIn, CreateRqOut, CreateSqIn, CreateSqOut,
    CreateTirIn, CreateTirOut, CreateTisIn, CreateTisOut, DestroyRqIn, DestroySqIn, DestroyTirIn,
    DestroyTisIn, ErrCqe, INLINE_SEG_FLAG, INVALID_LKEY, ModifyRqIn, ModifySqIn, QueryRqIn,
    QuerySqIn, QueryTirIn, RQ_MEM_TYPE_INLINE, WqState, WqeCtrlSeg, WqeDataSeg, WqeEthSeg,
    WqeOpcode, cap_inline_mode, cqe_eth_l3_hdr_type, cqe_l4_hdr_type, create_rq_in, create_sq_in,
    create_tir_in, inline_mode, query_rq_out, query_sq_out, query_tir_out, rqc, sqc, tir_disp_type,
    tir_self_lb_block, wq, wq_type,
};
use rnic_roce::transport::{Access, MemKey, MemoryAccess};

use super::mkey::MemView;
use super::qp::ts_format_allowed;
use super::queues::{CQE, Ring};
use super::{Ctx, Hca, Outcome, refuse};
use crate::device::Device;
use crate::eth::{Headers, L4, MAX_FRAME, MacClass, Sent, fill_checksums, l4_checksum_ok};
use crate::firmware::exec::TERMINATE_SCATTER_KEY;
use crate::firmware::syndrome as syn;

/// `modify_rq_in.modify_bitmask` bit: `vsd` (K `MLX5_MODIFY_RQ_IN_MODIFY_BITMASK_VSD`).
const MODIFY_RQ_VSD: u64 = 1 << 1;

/// A transport interface send object.
#[derive(Debug)]
pub(crate) struct Tis {
    pub(crate) td: u32,
}

/// A transport interface receive object (direct: one RQ).
#[derive(Debug)]
pub(crate) struct Tir {
    pub(crate) td: u32,
    pub(crate) rqn: u32,
    pub(crate) self_lb: u32,
    ctx: Vec<u8>,
}

/// The work queue of an SQ or RQ.
#[derive(Debug)]
pub(crate) struct Wq {
    pub(crate) ring: Ring,
    pub(crate) log_sz: u32,
    pub(crate) log_stride: u32,
    pub(crate) dbr: u64,
    pub(crate) pd: u32,
    pub(crate) uar: u32,
}

/// A raw Ethernet send queue.
#[derive(Debug)]
pub(crate) struct Sq {
    pub(crate) state: WqState,
    pub(crate) cqn: u32,
    pub(crate) tisn: u32,
    /// The headers each WQE must inline ([`inline_mode`]).
    min_inline: u32,
    user_index: u32,
    pub(crate) wq: Wq,
    /// WQEBBs consumed (the next WQE's index).
    pub(crate) fetched: u16,
    ctx: Vec<u8>,
}

/// A raw Ethernet receive queue.
#[derive(Debug)]
pub(crate) struct Rq {
    pub(crate) state: WqState,
    pub(crate) cqn: u32,
    vsd: bool,
    user_index: u32,
    pub(crate) wq: Wq,
    /// WQEs consumed.
    pub(crate) fetched: u16,
    ctx: Vec<u8>,
}

/// The raw Ethernet objects of the function.
#[derive(Debug, Default)]
pub(crate) struct Raw {
    pub(crate) tises: BTreeMap<u32, Tis>,
    pub(crate) tirs: BTreeMap<u32, Tir>,
    pub(crate) sqs: BTreeMap<u32, Sq>,
    pub(crate) rqs: BTreeMap<u32, Rq>,
}

/// What became of a frame sent to a TIR.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Delivery {
    /// Written into the RQ, its CQE posted (or an error CQE: the RQ went to ERR).
    Delivered,
    /// The RQ is not ready or has no WQE posted.
    RqEmpty,
    /// Sent by the function itself and blocked by the TIR's `self_lb_block`.
    LoopbackBlocked,
}

fn param(s: u32) -> Outcome {
    refuse(CmdStatus::BadParam, s)
}

fn lowest_free<T>(map: &BTreeMap<u32, T>, log_max: u32) -> Option<u32> {
    let limit = 1u64 << log_max.min(24);
    if map.len() as u64 >= limit {
        return None;
    }
    (1u32..1 << 24).find(|n| !map.contains_key(n))
}

/// Check and take a `wq` (the ring of an SQ or RQ): cyclic, no umem, no striding, no
/// signature; `stride_ok` judges `log_wq_stride`; `uar_needed`: an SQ rings a doorbell.
fn parse_wq(
    ctx: &Ctx<'_>,
    input: &[u8],
    wq_at: usize,
    stride_ok: impl Fn(u32) -> bool,
    uar_needed: bool,
) -> Result<Wq, super::Refusal> {
    let bad = |status, syndrome| super::Refusal { status, syndrome };
    let w = rnic_mlx5_prm::Wq::new_unchecked(input.get(wq_at..).unwrap_or(&[]));
    if w.wq_type() != wq_type::CYCLIC
        || w.wq_signature() != 0
        || w.end_padding_mode() != 0
        || w.cd_slave() != 0
        || w.dbr_umem_valid() != 0
        || w.wq_umem_valid() != 0
        || w.log_wqe_num_of_strides() != 0
        || w.two_byte_shift_en() != 0
        || w.log_wqe_stride_size() != 0
        || !stride_ok(w.log_wq_stride())
        || w.log_wq_sz() > ctx.caps.general().log_max_wq_sz()
    {
        return Err(bad(CmdStatus::BadParam, syn::WQ_CONTEXT));
    }
    if !ctx.pds.contains(&w.pd()) {
        return Err(bad(CmdStatus::BadRes, syn::MKEY_PD));
    }
    if uar_needed && !ctx.uars.contains(&w.uar_page()) {
        return Err(bad(CmdStatus::BadRes, syn::EQ_UAR));
    }
    if !w.dbr_addr().is_multiple_of(8) {
        return Err(bad(CmdStatus::BadParam, syn::DBR_ALIGN));
    }
    let ring = Ring::parse(
        input,
        wq_at + wq::pas.byte_offset(),
        w.log_wq_sz(),
        w.log_wq_stride(),
        w.log_wq_pg_sz(),
        w.page_offset(),
    )
    .map_err(|s| bad(CmdStatus::BadParam, s))?;
    Ok(Wq {
        ring,
        log_sz: w.log_wq_sz(),
        log_stride: w.log_wq_stride(),
        dbr: w.dbr_addr(),
        pd: w.pd(),
        uar: w.uar_page(),
    })
}

/// The state transitions MODIFY_SQ / MODIFY_RQ execute.
fn transition_ok(from: WqState, to: WqState) -> bool {
    matches!(
        (from, to),
        (WqState::Rst, WqState::Rdy)
            | (WqState::Rdy, WqState::Err)
            | (WqState::Rdy, WqState::Rst)
            | (WqState::Err, WqState::Rst)
    )
}

/// The context bytes of a command's `ctx` (to answer QUERY_*).
fn ctx_bytes(input: &[u8], at: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    if let Some(s) = input.get(at..at + len) {
        v.copy_from_slice(s);
    }
    v
}

impl Hca {
    /// Whether a TIS or TIR names transport domain `td`.
    pub(crate) fn uses_td(&self, td: u32) -> bool {
        self.raw.tises.values().any(|t| t.td == td) || self.raw.tirs.values().any(|t| t.td == td)
    }

    /// CREATE_TIS.
    pub(crate) fn create_tis(&mut self, ctx: &Ctx<'_>, input: &[u8], out: &mut [u8]) -> Outcome {
        let v = CreateTisIn::new_unchecked(input);
        let c = v.ctx();
        if c.strict_lag_tx_port_affinity() != 0
            || c.tls_en() != 0
            || c.lag_tx_port_affinity() != 0
            || c.prio() > 7
            || c.underlay_qpn() != 0
            || c.pd() != 0
        {
            return param(syn::TIS_CONTEXT);
        }
        if !ctx.tds.contains(&c.transport_domain()) {
            return refuse(CmdStatus::BadRes, syn::TD_UNKNOWN);
        }
        let Some(n) = lowest_free(&self.raw.tises, ctx.caps.general().log_max_tis()) else {
            return refuse(CmdStatus::NoRes, syn::TIS_EXHAUSTED);
        };
        self.raw.tises.insert(
            n,
            Tis {
                td: c.transport_domain(),
            },
        );
        let _ = CreateTisOut::new_unchecked(out).set_tisn(n);
        Ok(())
    }

    /// DESTROY_TIS.
    pub(crate) fn destroy_tis(&mut self, input: &[u8]) -> Outcome {
        let n = DestroyTisIn::new_unchecked(input).tisn();
        if !self.raw.tises.contains_key(&n) {
            return refuse(CmdStatus::BadRes, syn::TIS_NOT_FOUND);
        }
        if self.raw.sqs.values().any(|s| s.tisn == n) {
            return refuse(CmdStatus::BadResState, syn::TIS_IN_USE);
        }
        self.raw.tises.remove(&n);
        Ok(())
    }

    /// CREATE_SQ.
    pub(crate) fn create_sq(&mut self, ctx: &Ctx<'_>, input: &[u8], out: &mut [u8]) -> Outcome {
        let v = CreateSqIn::new_unchecked(input);
        let c = v.ctx();
        if c.state() != u32::from(WqState::Rst.as_raw())
            || c.rlky() != 0
            || c.cd_master() != 0
            || c.fre() != 0
            || c.allow_multi_pkt_send_wqe() != 0
            || c.reg_umr() != 0
            || c.allow_swp() != 0
            || c.hairpin() != 0
            || c.non_wire() != 0
            || c.hairpin_peer_rq() != 0
            || c.hairpin_peer_vhca() != 0
            || c.ts_cqe_to_dest_cqn() != 0
            || c.packet_pacing_rate_limit_index() != 0
            || c.qos_queue_group_id() != 0
            || c.tis_lst_sz() != 1
            || !ts_format_allowed(ctx.caps.general().sq_ts_format(), c.ts_format())
        {
            return param(syn::SQ_CONTEXT);
        }
        let required = match ctx.caps.eth().wqe_inline_mode() {
            cap_inline_mode::L2 => inline_mode::L2,
            cap_inline_mode::VPORT_CONTEXT => ctx.min_inline,
            _ => inline_mode::NONE,
        };
        if c.min_wqe_inline_mode() < required || c.min_wqe_inline_mode() > inline_mode::TCP_UDP {
            return param(syn::SQ_INLINE);
        }
        if !self.q.cqs.contains_key(&c.cqn()) {
            return refuse(CmdStatus::BadRes, syn::CQ_NOT_FOUND);
        }
        if !self.raw.tises.contains_key(&c.tis_num_0()) {
            return refuse(CmdStatus::BadRes, syn::TIS_NOT_FOUND);
        }
        let wq_at = create_sq_in::ctx.byte_offset() + sqc::wq.byte_offset();
        // A send WQE basic block is 64 bytes.
        let wq = parse_wq(ctx, input, wq_at, |s| s == 6, true)?;
        if self.raw.sqs.len() as u64 >= 1u64 << ctx.caps.general().log_max_sq() {
            return refuse(CmdStatus::NoRes, syn::SQ_EXHAUSTED);
        }
        let Some(sqn) = self.free_qpn(ctx) else {
            return refuse(CmdStatus::NoRes, syn::SQ_EXHAUSTED);
        };
        let at = create_sq_in::ctx.byte_offset();
        self.raw.sqs.insert(
            sqn,
            Sq {
                state: WqState::Rst,
                cqn: c.cqn(),
                tisn: c.tis_num_0(),
                min_inline: c.min_wqe_inline_mode(),
                user_index: c.user_index(),
                wq,
                fetched: 0,
                ctx: ctx_bytes(input, at, wq_at - at),
            },
        );
        let _ = CreateSqOut::new_unchecked(out).set_sqn(sqn);
        tracing::debug!(sqn, cqn = c.cqn(), tis = c.tis_num_0(), "CREATE_SQ");
        Ok(())
    }

    /// MODIFY_SQ.
    pub(crate) fn modify_sq(&mut self, dev: &Device, input: &[u8]) -> Outcome {
        let v = ModifySqIn::new_unchecked(input);
        let sqn = v.sqn();
        let Some(sq) = self.raw.sqs.get_mut(&sqn) else {
            return refuse(CmdStatus::BadRes, syn::SQ_NOT_FOUND);
        };
        if v.modify_bitmask() != 0 {
            return param(syn::WQ_BITMASK);
        }
        let (cur, next) = (
            WqState::from_raw(v.sq_state() as u8),
            WqState::from_raw(v.ctx().state() as u8),
        );
        if cur != sq.state || !transition_ok(cur, next) {
            return refuse(CmdStatus::BadResState, syn::WQ_STATE);
        }
        sq.state = next;
        if next == WqState::Rst {
            sq.fetched = 0;
        }
        tracing::debug!(sqn, ?cur, ?next, "MODIFY_SQ");
        if next != WqState::Rst {
            self.raw_sq_pump(dev, sqn);
        }
        Ok(())
    }

    /// DESTROY_SQ.
    pub(crate) fn destroy_sq(&mut self, input: &[u8]) -> Outcome {
        let n = DestroySqIn::new_unchecked(input).sqn();
        if self.raw.sqs.remove(&n).is_none() {
            return refuse(CmdStatus::BadRes, syn::SQ_NOT_FOUND);
        }
        Ok(())
    }

    /// QUERY_SQ.
    pub(crate) fn query_sq(&self, input: &[u8], out: &mut [u8]) -> Outcome {
        let Some(sq) = self.raw.sqs.get(&QuerySqIn::new_unchecked(input).sqn()) else {
            return refuse(CmdStatus::BadRes, syn::SQ_NOT_FOUND);
        };
        let at = query_sq_out::sq_context.byte_offset();
        if let Some(d) = out.get_mut(at..at + sq.ctx.len()) {
            d.copy_from_slice(&sq.ctx);
            let _ = rnic_mlx5_prm::Sqc::new_unchecked(d).set_state(u32::from(sq.state.as_raw()));
        }
        Ok(())
    }

    /// CREATE_RQ.
    pub(crate) fn create_rq(&mut self, ctx: &Ctx<'_>, input: &[u8], out: &mut [u8]) -> Outcome {
        let v = CreateRqIn::new_unchecked(input);
        let c = v.ctx();
        if c.state() != u32::from(WqState::Rst.as_raw())
            || c.rlky() != 0
            || c.delay_drop_en() != 0
            || c.scatter_fcs() != 0
            || c.mem_rq_type() != RQ_MEM_TYPE_INLINE
            || c.hairpin() != 0
            || c.counter_set_id() != 0
            || c.rmpn() != 0
            || c.hairpin_peer_sq() != 0
            || c.hairpin_peer_vhca() != 0
            || c.flush_in_error_en() > 1
            || !ts_format_allowed(ctx.caps.general().rq_ts_format(), c.ts_format())
            || (c.vsd() == 0 && ctx.caps.eth().vlan_cap() == 0)
        {
            return param(syn::RQ_CONTEXT);
        }
        if !self.q.cqs.contains_key(&c.cqn()) {
            return refuse(CmdStatus::BadRes, syn::CQ_NOT_FOUND);
        }
        let wq_at = create_rq_in::ctx.byte_offset() + rqc::wq.byte_offset();
        let max_rq = ctx.caps.general().max_wqe_sz_rq();
        // A receive WQE is 1.. data segments of 16 bytes, at most max_wqe_sz_rq.
        let wq = parse_wq(
            ctx,
            input,
            wq_at,
            |s| (4..=16).contains(&s) && (1u32 << s) <= max_rq,
            false,
        )?;
        if self.raw.rqs.len() as u64 >= 1u64 << ctx.caps.general().log_max_rq() {
            return refuse(CmdStatus::NoRes, syn::RQ_EXHAUSTED);
        }
        let Some(rqn) = self.free_qpn(ctx) else {
            return refuse(CmdStatus::NoRes, syn::RQ_EXHAUSTED);
        };
        let at = create_rq_in::ctx.byte_offset();
        self.raw.rqs.insert(
            rqn,
            Rq {
                state: WqState::Rst,
                cqn: c.cqn(),
                vsd: c.vsd() == 1,
                user_index: c.user_index(),
                wq,
                fetched: 0,
                ctx: ctx_bytes(input, at, wq_at - at),
            },
        );
        let _ = CreateRqOut::new_unchecked(out).set_rqn(rqn);
        tracing::debug!(rqn, cqn = c.cqn(), "CREATE_RQ");
        Ok(())
    }

    /// MODIFY_RQ (a state transition; `vsd` with its bitmask bit).
    pub(crate) fn modify_rq(&mut self, input: &[u8]) -> Outcome {
        let v = ModifyRqIn::new_unchecked(input);
        let rqn = v.rqn();
        let Some(rq) = self.raw.rqs.get_mut(&rqn) else {
            return refuse(CmdStatus::BadRes, syn::RQ_NOT_FOUND);
        };
        let mask = v.modify_bitmask();
        if mask & !MODIFY_RQ_VSD != 0 {
            return param(syn::WQ_BITMASK);
        }
        let (cur, next) = (
            WqState::from_raw(v.rq_state() as u8),
            WqState::from_raw(v.ctx().state() as u8),
        );
        if cur != rq.state || !(cur == next && mask != 0 || transition_ok(cur, next)) {
            return refuse(CmdStatus::BadResState, syn::WQ_STATE);
        }
        rq.state = next;
        if mask & MODIFY_RQ_VSD != 0 {
            rq.vsd = v.ctx().vsd() == 1;
        }
        if next == WqState::Rst {
            rq.fetched = 0;
        }
        tracing::debug!(rqn, ?cur, ?next, "MODIFY_RQ");
        Ok(())
    }

    /// DESTROY_RQ.
    pub(crate) fn destroy_rq(&mut self, input: &[u8]) -> Outcome {
        let n = DestroyRqIn::new_unchecked(input).rqn();
        if !self.raw.rqs.contains_key(&n) {
            return refuse(CmdStatus::BadRes, syn::RQ_NOT_FOUND);
        }
        if self.raw.tirs.values().any(|t| t.rqn == n) {
            return refuse(CmdStatus::BadResState, syn::RQ_IN_USE);
        }
        self.raw.rqs.remove(&n);
        Ok(())
    }

    /// QUERY_RQ.
    pub(crate) fn query_rq(&self, input: &[u8], out: &mut [u8]) -> Outcome {
        let Some(rq) = self.raw.rqs.get(&QueryRqIn::new_unchecked(input).rqn()) else {
            return refuse(CmdStatus::BadRes, syn::RQ_NOT_FOUND);
        };
        let at = query_rq_out::rq_context.byte_offset();
        if let Some(d) = out.get_mut(at..at + rq.ctx.len()) {
            d.copy_from_slice(&rq.ctx);
            let mut c = rnic_mlx5_prm::Rqc::new_unchecked(d);
            let _ = c.set_state(u32::from(rq.state.as_raw()));
            let _ = c.set_vsd(u32::from(rq.vsd));
        }
        Ok(())
    }

    /// CREATE_TIR (direct dispatch to one RQ).
    pub(crate) fn create_tir(&mut self, ctx: &Ctx<'_>, input: &[u8], out: &mut [u8]) -> Outcome {
        let v = CreateTirIn::new_unchecked(input);
        let c = v.ctx();
        let hashing = (0..10).any(|i| c.rx_hash_toeplitz_key(i).unwrap_or(0) != 0)
            || c.rx_hash_field_selector_outer() != 0
            || c.rx_hash_field_selector_inner() != 0
            || c.rx_hash_fn() != 0
            || c.rx_hash_symmetric() != 0
            || c.indirect_table() != 0;
        if c.disp_type() != tir_disp_type::DIRECT
            || hashing
            || c.tls_en() != 0
            || c.lro_timeout_period_usecs() != 0
            || c.packet_merge_mask() != 0
            || c.lro_max_ip_payload_size() != 0
            || c.tunneled_offload_en() != 0
        {
            return param(syn::TIR_CONTEXT);
        }
        if !self.raw.rqs.contains_key(&c.inline_rqn()) {
            return refuse(CmdStatus::BadRes, syn::TIR_RQ);
        }
        if !ctx.tds.contains(&c.transport_domain()) {
            return refuse(CmdStatus::BadRes, syn::TD_UNKNOWN);
        }
        let Some(n) = lowest_free(&self.raw.tirs, ctx.caps.general().log_max_tir()) else {
            return refuse(CmdStatus::NoRes, syn::TIR_EXHAUSTED);
        };
        let at = create_tir_in::ctx.byte_offset();
        self.raw.tirs.insert(
            n,
            Tir {
                td: c.transport_domain(),
                rqn: c.inline_rqn(),
                self_lb: c.self_lb_block(),
                ctx: ctx_bytes(input, at, rnic_mlx5_prm::Tirc::<&[u8]>::SIZE_BYTES),
            },
        );
        let _ = CreateTirOut::new_unchecked(out).set_tirn(n);
        tracing::debug!(tirn = n, rqn = c.inline_rqn(), "CREATE_TIR");
        Ok(())
    }

    /// DESTROY_TIR.
    pub(crate) fn destroy_tir(&mut self, input: &[u8]) -> Outcome {
        let n = DestroyTirIn::new_unchecked(input).tirn();
        if !self.raw.tirs.contains_key(&n) {
            return refuse(CmdStatus::BadRes, syn::TIR_NOT_FOUND);
        }
        if self.steer.uses_tir(n) {
            return refuse(CmdStatus::BadResState, syn::TIR_IN_USE);
        }
        self.raw.tirs.remove(&n);
        Ok(())
    }

    /// QUERY_TIR.
    pub(crate) fn query_tir(&self, input: &[u8], out: &mut [u8]) -> Outcome {
        let Some(t) = self.raw.tirs.get(&QueryTirIn::new_unchecked(input).tirn()) else {
            return refuse(CmdStatus::BadRes, syn::TIR_NOT_FOUND);
        };
        let at = query_tir_out::tir_context.byte_offset();
        if let Some(d) = out.get_mut(at..at + t.ctx.len()) {
            d.copy_from_slice(&t.ctx);
        }
        Ok(())
    }

    fn sq_producer(dev: &Device, sq: &Sq) -> Option<u16> {
        let mut b = [0u8; 4];
        dev.dma_read(sq.wq.dbr + 4, &mut b).ok()?;
        Some(u32::from_be_bytes(b) as u16)
    }

    /// A raw SQ's send doorbell (or a transition to RDY/ERR): execute the WQEs its doorbell
    /// record posts — in RDY each becomes a frame (and a CQE when signaled or failed), in ERR
    /// each is flushed.
    pub(crate) fn raw_sq_pump(&mut self, dev: &Device, sqn: u32) {
        for _ in 0..(1u32 << 16) {
            let Some(sq) = self.raw.sqs.get(&sqn) else {
                return;
            };
            if !matches!(sq.state, WqState::Rdy | WqState::Err) {
                return;
            }
            let Some(producer) = Self::sq_producer(dev, sq) else {
                self.stats.dma_faults += 1;
                return;
            };
            let idx = sq.fetched;
            let avail = producer.wrapping_sub(idx);
            if avail == 0 {
                break;
            }
            let nbb = 1u32 << sq.wq.log_sz;
            let bb = |i: u16| u64::from(u32::from(i) & (nbb - 1)) * 64;
            let mut ctrl_raw = [0u8; 16];
            let read_ok = sq.wq.ring.read(dev, bb(idx), &mut ctrl_raw);
            let ctrl = WqeCtrlSeg::new_unchecked(&ctrl_raw[..]);
            let (ds, opcode, cm) = (ctrl.ds(), ctrl.opcode() as u8, ctrl.completion_mode());
            let size = ds.div_ceil(4).max(1);
            let step = if read_ok && ds > 0 && size <= u32::from(avail) {
                size as u16
            } else {
                1
            };
            let (cqn, user_index, state) = (sq.cqn, sq.user_index, sq.state);
            if state == WqState::Err {
                if let Some(sq) = self.raw.sqs.get_mut(&sqn) {
                    sq.fetched = idx.wrapping_add(step);
                }
                let cqe = raw_err_cqe(
                    sqn,
                    user_index,
                    CqeOpcode::ReqErr,
                    CqeSyndrome::WrFlushed.as_raw(),
                    opcode,
                    idx,
                );
                self.q
                    .complete(dev, cqn, cqe, true, cm == 3, &mut self.stats);
                continue;
            }
            let result = if !read_ok {
                self.stats.dma_faults += 1;
                Err(CqeSyndrome::LocalQpOp.as_raw())
            } else if ds == 0
                || size > u32::from(avail)
                || ctrl.wqe_index() != u32::from(idx)
                || ctrl.qpn() != sqn
                || ctrl.opmod() != 0
            {
                Err(CqeSyndrome::LocalQpOp.as_raw())
            } else {
                match WqeOpcode::from_raw(opcode) {
                    WqeOpcode::Nop => Ok(()),
                    WqeOpcode::Send => self.raw_send(dev, sqn, idx, size, ds),
                    _ => Err(CqeSyndrome::LocalQpOp.as_raw()),
                }
            };
            if let Some(sq) = self.raw.sqs.get_mut(&sqn) {
                sq.fetched = idx.wrapping_add(step);
            }
            match result {
                Ok(()) if cm >= 2 => {
                    let mut b = [0u8; CQE];
                    let mut c = Cqe64::new_unchecked(&mut b[..]);
                    let _ = c.set_opcode(u32::from(CqeOpcode::Req.as_raw()));
                    let _ = c.set_wqe_opcode(u32::from(opcode));
                    let _ = c.set_qpn(sqn);
                    let _ = c.set_wqe_counter(u32::from(idx));
                    let _ = c.set_srqn_uidx(user_index);
                    self.q
                        .complete(dev, cqn, b, ctrl.solicited() == 1, cm == 3, &mut self.stats);
                }
                Ok(()) => {}
                Err(syndrome) => {
                    tracing::info!(sqn, index = idx, syndrome, "raw send WQE failed: SQ to ERR");
                    self.stats.wqe_errors += 1;
                    let cqe =
                        raw_err_cqe(sqn, user_index, CqeOpcode::ReqErr, syndrome, opcode, idx);
                    self.q
                        .complete(dev, cqn, cqe, true, cm == 3, &mut self.stats);
                    if let Some(sq) = self.raw.sqs.get_mut(&sqn) {
                        sq.state = WqState::Err;
                    }
                }
            }
        }
        self.drain_loopback(dev);
    }

    /// Execute one raw SEND WQE of `ds` units at `idx`: gather the frame, check its inline
    /// headers, apply the checksum offloads, send it. `Err(syndrome)` for an error CQE.
    fn raw_send(&mut self, dev: &Device, sqn: u32, idx: u16, size: u32, ds: u32) -> Result<(), u8> {
        let qp_op = CqeSyndrome::LocalQpOp.as_raw();
        let len_err = CqeSyndrome::LocalLength.as_raw();
        let Some(sq) = self.raw.sqs.get(&sqn) else {
            return Err(qp_op);
        };
        let nbb = 1u32 << sq.wq.log_sz;
        let mut w = vec![0u8; size as usize * 64];
        for k in 0..size {
            let i = idx.wrapping_add(k as u16);
            let at = k as usize * 64;
            if !sq.wq.ring.read(
                dev,
                u64::from(u32::from(i) & (nbb - 1)) * 64,
                &mut w[at..at + 64],
            ) {
                self.stats.dma_faults += 1;
                return Err(qp_op);
            }
        }
        w.truncate(ds as usize * 16);
        // Control segment, then the Ethernet segment.
        let eth = WqeEthSeg::new_unchecked(w.get(16..32).ok_or(qp_op)?);
        let (cs_flags, inline_len) = (eth.cs_flags(), eth.inline_hdr_sz() as usize);
        if eth.mss() != 0 || eth.swp_flags() != 0 || eth.swp_outer_l3_offset() != 0 {
            return Err(qp_op);
        }
        let mut frame = Vec::with_capacity(inline_len + 256);
        // inline_hdr.start (2 bytes), then the rest in the following 16-byte units.
        let inline_end = 30 + inline_len;
        if inline_len > 0 {
            frame.extend_from_slice(w.get(30..inline_end).ok_or(qp_op)?);
        }
        let mut at = if inline_len > 2 {
            32 + (inline_len - 2).div_ceil(16) * 16
        } else {
            32
        };
        let pd = PdHandle(sq.wq.pd);
        let (min_inline, td) = (sq.min_inline, self.raw.tises.get(&sq.tisn).map(|t| t.td));
        let mem = MemView {
            dev,
            mkeys: &self.mkeys,
            inline: None,
            dma_faults: std::cell::Cell::new(0),
        };
        let terminator = if dev.options().firmware.terminate_scatter_key {
            TERMINATE_SCATTER_KEY
        } else {
            INVALID_LKEY
        };
        while at < w.len() {
            let head = super::wqe::be32(&w, at);
            if head & INLINE_SEG_FLAG != 0 {
                let n = (head & !INLINE_SEG_FLAG) as usize;
                frame.extend_from_slice(w.get(at + 4..at + 4 + n).ok_or(qp_op)?);
                at += (4 + n).div_ceil(16) * 16;
                continue;
            }
            let d = WqeDataSeg::new_unchecked(w.get(at..at + 16).ok_or(qp_op)?);
            at += 16;
            if d.lkey() == terminator && d.byte_count() == 0 {
                continue;
            }
            // byte_count 0 is 2^31 bytes (the data-segment convention): beyond any frame.
            let n = match d.byte_count() {
                0 => return Err(len_err),
                n if n as usize > MAX_FRAME => return Err(len_err),
                n => n as usize,
            };
            let start = frame.len();
            frame.resize(start + n, 0);
            let r = mem.read(
                pd,
                MemKey::Local(Lkey(d.lkey())),
                d.addr(),
                &mut frame[start..],
                Access::LocalRead,
            );
            self.stats.dma_faults += mem.dma_faults.get();
            mem.dma_faults.set(0);
            if r.is_err() {
                return Err(CqeSyndrome::LocalProt.as_raw());
            }
        }
        if frame.len() < 14 || frame.len() > MAX_FRAME {
            return Err(len_err);
        }
        // The headers this SQ must carry inline (sqc.min_wqe_inline_mode).
        let h = Headers::parse(&frame);
        let needed = match min_inline {
            inline_mode::NONE => 0,
            inline_mode::L2 => rnic_mlx5_prm::ETH_L2_INLINE_HEADER_SIZE.min(frame.len()),
            mode => {
                let l3_end = h.and_then(|h| h.ip.map(|ip| (h, ip))).map(|(h, ip)| {
                    let ip_hdr = match ip.l4 {
                        Some(L4::Udp { at, .. } | L4::Tcp { at, .. }) => at,
                        _ => h.l3 + if ip.version == 4 { 20 } else { 40 },
                    };
                    if mode == inline_mode::TCP_UDP {
                        match ip.l4 {
                            Some(L4::Udp { at, .. }) => at + 8,
                            Some(L4::Tcp { at, .. }) => at + 20,
                            _ => ip_hdr,
                        }
                    } else {
                        ip_hdr
                    }
                });
                l3_end.unwrap_or_else(|| rnic_mlx5_prm::ETH_L2_INLINE_HEADER_SIZE.min(frame.len()))
            }
        };
        if inline_len < needed {
            tracing::info!(
                sqn,
                inline_len,
                needed,
                "raw send: too few inline header bytes"
            );
            return Err(qp_op);
        }
        if cs_flags != 0 {
            fill_checksums(&mut frame, cs_flags);
        }
        self.transmit_raw(frame, td);
        Ok(())
    }

    /// Send a raw frame from the function (transport domain `td`): on the wire, and back to
    /// the function itself when it is for it (its own MAC, broadcast, multicast).
    fn transmit_raw(&mut self, frame: Vec<u8>, td: Option<u32>) {
        let Some(port) = self.eth.clone() else {
            // The udp wire has no L2: the frame leaves into nothing.
            self.counters
                .tx_no_l2
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return;
        };
        let mut dmac = [0u8; 6];
        dmac.copy_from_slice(&frame[..6]);
        let class = MacClass::of(&dmac, &port.mac);
        match port.transmit(&frame, false) {
            Sent::Looped => self.loopback.push_back((frame, td)),
            Sent::Wire if matches!(class, MacClass::Broadcast | MacClass::Multicast) => {
                self.loopback.push_back((frame, td));
            }
            _ => {}
        }
    }

    /// Write `frame` (the flow tables sent it to TIR `tirn`) into the TIR's RQ: the next
    /// posted WQE, and a receive CQE with `flow_tag`. `from_td`: the transport domain of the
    /// function's own SQ that sent it (loopback), for the TIR's `self_lb_block`.
    pub(crate) fn raw_deliver(
        &mut self,
        dev: &Device,
        tirn: u32,
        frame: &[u8],
        flow_tag: u32,
        from_td: Option<u32>,
    ) -> Delivery {
        let Some(tir) = self.raw.tirs.get(&tirn) else {
            return Delivery::RqEmpty;
        };
        if let Some(td) = from_td
            && td == tir.td
        {
            let group = frame.first().is_some_and(|b| b & 1 != 0);
            let bit = if group {
                tir_self_lb_block::MULTICAST
            } else {
                tir_self_lb_block::UNICAST
            };
            if tir.self_lb & bit != 0 {
                return Delivery::LoopbackBlocked;
            }
        }
        let rqn = tir.rqn;
        let Some(rq) = self.raw.rqs.get(&rqn) else {
            return Delivery::RqEmpty;
        };
        if rq.state != WqState::Rdy {
            return Delivery::RqEmpty;
        }
        let mut b = [0u8; 4];
        if dev.dma_read(rq.wq.dbr, &mut b).is_err() {
            self.stats.dma_faults += 1;
            return Delivery::RqEmpty;
        }
        let producer = u32::from_be_bytes(b) as u16;
        let idx = rq.fetched;
        if producer == idx {
            return Delivery::RqEmpty;
        }
        let (cqn, user_index, vsd, pd) = (rq.cqn, rq.user_index, rq.vsd, rq.wq.pd);
        let stride = 1usize << rq.wq.log_stride;
        let mut w = vec![0u8; stride];
        let off = u64::from(u32::from(idx) & ((1 << rq.wq.log_sz) - 1)) << rq.wq.log_stride;
        let read_ok = rq.wq.ring.read(dev, off, &mut w);
        if let Some(rq) = self.raw.rqs.get_mut(&rqn) {
            rq.fetched = idx.wrapping_add(1);
        }
        // VLAN stripping (vsd clear): the tag goes into the CQE.
        let h = Headers::parse(frame);
        let stripped;
        let (data, vlan) = match h.and_then(|h| h.vlan) {
            Some(tci) if !vsd => {
                let mut f = frame[..12].to_vec();
                f.extend_from_slice(&frame[16..]);
                stripped = f;
                (&stripped[..], Some(tci))
            }
            _ => (frame, None),
        };
        let result = if read_ok {
            self.scatter(dev, pd, &w, data)
        } else {
            self.stats.dma_faults += 1;
            Err(CqeSyndrome::LocalQpOp.as_raw())
        };
        let cqe = match result {
            Ok(()) => rx_cqe(user_index, idx, data, vlan, flow_tag),
            Err(syndrome) => {
                tracing::info!(rqn, index = idx, syndrome, "raw receive failed: RQ to ERR");
                self.stats.wqe_errors += 1;
                if let Some(rq) = self.raw.rqs.get_mut(&rqn) {
                    rq.state = WqState::Err;
                }
                raw_err_cqe(flow_tag, user_index, CqeOpcode::RespErr, syndrome, 0, idx)
            }
        };
        self.q
            .complete(dev, cqn, cqe, false, false, &mut self.stats);
        Delivery::Delivered
    }

    /// Scatter `data` over the data segments of receive WQE `w`.
    fn scatter(&mut self, dev: &Device, pd: u32, w: &[u8], data: &[u8]) -> Result<(), u8> {
        let terminator = if dev.options().firmware.terminate_scatter_key {
            TERMINATE_SCATTER_KEY
        } else {
            INVALID_LKEY
        };
        let zero_is_2g = dev.options().firmware.strictness.recv_zero_length;
        let mut mem = MemView {
            dev,
            mkeys: &self.mkeys,
            inline: None,
            dma_faults: std::cell::Cell::new(0),
        };
        let mut done = 0usize;
        for s in w.chunks_exact(16) {
            if done == data.len() {
                break;
            }
            let d = WqeDataSeg::new_unchecked(s);
            if d.lkey() == terminator {
                break;
            }
            let cap = match d.byte_count() {
                0 if zero_is_2g => 0x8000_0000usize,
                n => n as usize,
            };
            let n = cap.min(data.len() - done);
            if n == 0 {
                continue;
            }
            let r = mem.write(
                PdHandle(pd),
                MemKey::Local(Lkey(d.lkey())),
                d.addr(),
                &data[done..done + n],
                Access::LocalWrite,
            );
            self.stats.dma_faults += mem.dma_faults.get();
            mem.dma_faults.set(0);
            if r.is_err() {
                return Err(CqeSyndrome::LocalProt.as_raw());
            }
            done += n;
        }
        if done < data.len() {
            return Err(CqeSyndrome::LocalLength.as_raw());
        }
        Ok(())
    }

    /// The raw objects alive (TIS, SQ, RQ, TIR).
    pub(crate) fn raw_objects(&self) -> usize {
        self.raw.tises.len() + self.raw.tirs.len() + self.raw.sqs.len() + self.raw.rqs.len()
    }
}

/// An error CQE of a raw SQ or RQ.
fn raw_err_cqe(
    qpn: u32,
    user_index: u32,
    op: CqeOpcode,
    syndrome: u8,
    wqe_opcode: u8,
    counter: u16,
) -> [u8; CQE] {
    let mut b = [0u8; CQE];
    let mut c = ErrCqe::new_unchecked(&mut b[..]);
    let _ = c.set_opcode(u32::from(op.as_raw()));
    let _ = c.set_syndrome(u32::from(syndrome));
    let _ = c.set_wqe_opcode(u32::from(wqe_opcode));
    let _ = c.set_qpn(qpn & 0xff_ffff);
    let _ = c.set_wqe_counter(u32::from(counter));
    let _ = c.set_srqn(user_index);
    b
}

/// The receive CQE of a frame: RESP_SEND, its length, the RQ WQE index, the rule's flow tag
/// (`sop_drop_qpn` [23:0]), the RQ's user index, header types and checksum verdicts, the
/// stripped VLAN tag.
fn rx_cqe(user_index: u32, idx: u16, data: &[u8], vlan: Option<u16>, flow_tag: u32) -> [u8; CQE] {
    let mut b = [0u8; CQE];
    let mut c = Cqe64::new_unchecked(&mut b[..]);
    let _ = c.set_opcode(u32::from(CqeOpcode::RespSend.as_raw()));
    let _ = c.set_byte_cnt(data.len() as u32);
    let _ = c.set_wqe_counter(u32::from(idx));
    let _ = c.set_qpn(flow_tag & 0xff_ffff);
    let _ = c.set_srqn_uidx(user_index);
    let _ = c.set_l2_ok(1);
    if let Some(tci) = vlan {
        let _ = c.set_vlan_present(1);
        let _ = c.set_vlan_info(u32::from(tci));
    }
    if let Some(h) = Headers::parse(data)
        && let Some(ip) = h.ip
    {
        let _ = c.set_eth_l3_hdr_type(if ip.version == 4 {
            cqe_eth_l3_hdr_type::IPV4
        } else {
            cqe_eth_l3_hdr_type::IPV6
        });
        let _ = c.set_l3_ok(u32::from(ip.csum_ok));
        let l4 = match ip.l4 {
            Some(L4::Udp { .. }) => cqe_l4_hdr_type::UDP,
            Some(L4::Tcp { flags, data, .. }) => match (flags & 0x10 != 0, data) {
                (false, _) => cqe_l4_hdr_type::TCP_NO_ACK,
                (true, 0) => cqe_l4_hdr_type::TCP_ACK_NO_DATA,
                (true, _) => cqe_l4_hdr_type::TCP_ACK_AND_DATA,
            },
            _ => cqe_l4_hdr_type::NONE,
        };
        let _ = c.set_l4_hdr_type(l4);
        if l4 != cqe_l4_hdr_type::NONE {
            let _ = c.set_l4_ok(u32::from(l4_checksum_ok(data, &h)));
        }
    }
    b
}
