//! The emulated HCA behind the command interface: GID table and RoCE ports, EQs, CQs,
//! MKeys, QPs (their commands, with full checks and stable syndromes) and the data path
//! that joins the driver's rings to the rnic-roce transport engine over UDP/4791 — or, on an
//! Ethernet wire ([`crate::eth`]), over Ethernet frames; the raw Ethernet objects (TIS, SQ,
//! RQ, TIR) and the NIC RX flow tables that steer the frames that are not RoCE.
//!
//! # Locking
//!
//! The HCA lives in an `Arc<Mutex<Hca>>` held by the firmware [`State`](crate::firmware::State).
//! Commands take the state lock, then the HCA lock; UAR doorbells (watcher thread) and the
//! per-address receive threads take only the HCA lock. Nothing here takes the device's
//! handler lock.

mod dp;
mod l2;
mod mkey;
mod port;
mod qp;
mod queues;
mod raw;
mod steer;
mod wqe;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use rnic_core::Gid;
use rnic_mlx5_prm::{
    CmdOpcode, CmdStatus, EventType, PORT_TYPE_ETH, PortChangeSubtype, QueryQpIn,
    QueryRoceAddressIn, QueryRoceAddressOut, ROCE_L3_TYPE_IPV4, ROCE_L3_TYPE_IPV6, ROCE_VERSION_2,
    RoceAddrLayout, SetRoceAddressIn, rst2init_qp_in, set_roce_address_in,
};

pub use port::{GID_TABLE, ROCE_PORT};

use crate::device::Device;
use crate::eth::{EthPort, PortCounters};
pub(crate) use crate::firmware::Refusal;
use crate::firmware::caps::Caps;
use crate::firmware::syndrome as syn;

use port::{GidEntry, Ports, gid_ip};
use qp::{PathCtx, QpObj, Transition};
use queues::Queues;

pub(crate) type Outcome = Result<(), Refusal>;

pub(crate) fn refuse(status: CmdStatus, syndrome: u32) -> Outcome {
    Err(Refusal { status, syndrome })
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Whether `port` is a valid `vhca_port_num` for SET/QUERY_ROCE_ADDRESS: 0 when the cap
/// `num_vhca_ports` is 0 (the port is implied), else 1..=num_vhca_ports (K lib/gid.c sets it
/// exactly then).
fn vhca_port_ok(ctx: &Ctx<'_>, port: u32) -> bool {
    match ctx.caps.general().num_vhca_ports() {
        0 => port == 0,
        n => (1..=n).contains(&port),
    }
}

/// What commands need from the firmware state.
pub(crate) struct Ctx<'a> {
    pub(crate) pds: &'a BTreeSet<u32>,
    pub(crate) uars: &'a BTreeSet<u32>,
    pub(crate) tds: &'a BTreeSet<u32>,
    pub(crate) caps: &'a Caps,
    pub(crate) mac: [u8; 6],
    pub(crate) mtu: u32,
    pub(crate) roce_en: bool,
    /// The vport context's `min_wqe_inline_mode`.
    pub(crate) min_inline: u32,
}

/// Data-path counters (survive nothing: they belong to one HCA life).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct HcaStats {
    /// EQEs written.
    pub eqes: u64,
    /// EQEs not written (EQ overran earlier).
    pub eqes_dropped: u64,
    /// EQ overruns.
    pub eq_overruns: u64,
    /// MSI-X interrupts raised by EQs.
    pub interrupts: u64,
    /// CQEs written.
    pub cqes: u64,
    /// CQEs not written (CQ in error, or unknown CQ).
    pub cqes_dropped: u64,
    /// CQ overruns.
    pub cq_overruns: u64,
    /// Device DMA faults met on the data path (rings, records, MKey translations).
    pub dma_faults: u64,
    /// Doorbells naming no object of their UAR page, or malformed.
    pub bad_doorbells: u64,
    /// QPs served by a send doorbell of their UAR page that named another QP: their
    /// doorbell record was ahead though their own doorbell was not seen (overwritten on a
    /// shared BlueFlame register before the watcher looked; see docs/mlx5-emu.md).
    pub swept_doorbells: u64,
    /// WQEs refused by the firmware's own checks (error CQE, QP to ERR).
    pub wqe_errors: u64,
    /// Error CQEs written by [`crate::Faults::error_cqe`] injections.
    pub injected_error_cqes: u64,
    /// RoCE packets sent.
    pub tx_packets: u64,
    /// Packets the engine emitted that could not be sent.
    pub tx_dropped: u64,
    /// Sends from 4791 because the per-QP source port could not be bound.
    pub sport_fallbacks: u64,
    /// Datagrams received.
    pub rx_packets: u64,
    /// Datagrams whose ICRC did not verify.
    pub rx_bad_icrc: u64,
    /// Datagrams for no QP.
    pub rx_dropped: u64,
    /// Socket receive errors.
    pub rx_errors: u64,
    /// RoCE packets dropped because the port's link was down (sent or received).
    pub link_down_drops: u64,
    /// UAR doorbells and packets ignored because the function stopped (a fatal syndrome, or
    /// the NIC interface state disabled / SW reset).
    pub halted_drops: u64,
}

/// Which completions of a QP an injected error CQE replaces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InjectSide {
    /// The send queue: the next send WQE the firmware fetches in RTS is not executed (nothing
    /// goes on the wire); its completion is a REQ_ERR CQE with the injected syndrome and its
    /// own WQE index as `wqe_counter`, written when it reaches the head of the send queue
    /// (signaled or not: error CQEs always are), then the QP goes to ERR and every later
    /// send WQE flushes (WR_FLUSHED), as do the posted receives.
    Send,
    /// The receive queue: the next successful receive completion (a message arrived and was
    /// placed: its bytes are in memory and the engine has acknowledged it) becomes a
    /// RESP_ERR CQE with the injected syndrome and that receive WQE's index, then the QP
    /// goes to ERR and the rest flush.
    Recv,
}

/// An error CQE to inject ([`crate::Faults::error_cqe`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CqeInjection {
    /// The QP (`None`: the first QP that completes on `side`).
    pub qpn: Option<u32>,
    /// Send or receive queue.
    pub side: InjectSide,
    /// `err_cqe.syndrome` (nonzero; an mlx5.md §10 syndrome or any other byte).
    pub syndrome: u8,
    /// `err_cqe.vendor_err_synd`.
    pub vendor: u8,
}

/// Live objects (for the accounting).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Live {
    pub(crate) eqs: usize,
    pub(crate) cqs: usize,
    pub(crate) qps: usize,
    pub(crate) mkeys: usize,
    pub(crate) gids: usize,
    /// TISes, SQs, RQs and TIRs.
    pub(crate) eth: usize,
    /// Flow tables, groups and entries.
    pub(crate) flow: usize,
}

/// The HCA; see the module docs.
pub struct Hca {
    me: Weak<Mutex<Hca>>,
    dev: Weak<Device>,
    clock: std::time::Instant,
    gids: Vec<Option<GidEntry>>,
    ports: Ports,
    q: Queues,
    mkeys: mkey::MkeyTable,
    qps: BTreeMap<u32, QpObj>,
    stats: HcaStats,
    txbuf: Vec<u8>,
    injections: Vec<CqeInjection>,
    raw: raw::Raw,
    steer: steer::Steering,
    /// The Ethernet port (an Ethernet wire), else `None` (the udp wire).
    eth: Option<Arc<EthPort>>,
    /// The port's counters (the device's).
    counters: Arc<PortCounters>,
    /// Frames the function sent to itself, waiting for its receive path: (frame, the
    /// transport domain of the SQ that sent it; `None` for RoCE).
    loopback: VecDeque<(Vec<u8>, Option<u32>)>,
    /// The loopback queue is being drained (frames it produces wait their turn).
    draining: bool,
    /// The NIC vport context's multicast address list (MODIFY_NIC_VPORT_CONTEXT
    /// `addresses_list`, `allowed_list_type` MC): the group addresses, broadcast included,
    /// whose frames reach the function's RX flow table.
    pub(crate) mc_list: Vec<[u8; 6]>,
    /// `promisc_mc` or `promisc_all`: every group address reaches the flow table.
    pub(crate) promisc_mc: bool,
    /// Frame assembly buffer of the RoCE sender.
    framebuf: Vec<u8>,
}

impl std::fmt::Debug for Hca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hca")
            .field("live", &self.live())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

/// The commands the HCA executes (and their input/output sizes).
pub(crate) fn spec(op: CmdOpcode) -> Option<(usize, usize)> {
    use rnic_mlx5_prm as p;
    Some(match op {
        CmdOpcode::SetRoceAddress => (
            p::set_roce_address_in::SIZE_BYTES,
            p::set_roce_address_out::SIZE_BYTES,
        ),
        CmdOpcode::QueryRoceAddress => (
            p::query_roce_address_in::SIZE_BYTES,
            p::query_roce_address_out::SIZE_BYTES,
        ),
        CmdOpcode::CreateEq => (p::create_eq_in::SIZE_BYTES, p::create_eq_out::SIZE_BYTES),
        CmdOpcode::DestroyEq => (p::destroy_eq_in::SIZE_BYTES, p::destroy_eq_out::SIZE_BYTES),
        CmdOpcode::CreateCq => (p::create_cq_in::SIZE_BYTES, p::create_cq_out::SIZE_BYTES),
        CmdOpcode::DestroyCq => (p::destroy_cq_in::SIZE_BYTES, p::destroy_cq_out::SIZE_BYTES),
        CmdOpcode::CreateMkey => (
            p::create_mkey_in::SIZE_BYTES,
            p::create_mkey_out::SIZE_BYTES,
        ),
        CmdOpcode::DestroyMkey => (
            p::destroy_mkey_in::SIZE_BYTES,
            p::destroy_mkey_out::SIZE_BYTES,
        ),
        CmdOpcode::CreateQp => (p::create_qp_in::SIZE_BYTES, p::create_qp_out::SIZE_BYTES),
        CmdOpcode::DestroyQp => (p::destroy_qp_in::SIZE_BYTES, p::destroy_qp_out::SIZE_BYTES),
        CmdOpcode::Rst2InitQp => (
            p::rst2init_qp_in::SIZE_BYTES,
            p::rst2init_qp_out::SIZE_BYTES,
        ),
        CmdOpcode::Init2RtrQp => (
            p::init2rtr_qp_in::SIZE_BYTES,
            p::init2rtr_qp_out::SIZE_BYTES,
        ),
        CmdOpcode::Rtr2RtsQp => (p::rtr2rts_qp_in::SIZE_BYTES, p::rtr2rts_qp_out::SIZE_BYTES),
        CmdOpcode::Rts2RtsQp => (p::rts2rts_qp_in::SIZE_BYTES, p::rts2rts_qp_out::SIZE_BYTES),
        // INIT2INIT has the same layout as RST2INIT (mlx5.md §7.3: all modify inputs do).
        CmdOpcode::Init2InitQp => (
            p::rst2init_qp_in::SIZE_BYTES,
            p::rst2init_qp_out::SIZE_BYTES,
        ),
        CmdOpcode::Qp2Err => (p::qp_2err_in::SIZE_BYTES, p::qp_2err_out::SIZE_BYTES),
        CmdOpcode::Qp2Rst => (p::qp_2rst_in::SIZE_BYTES, p::qp_2rst_out::SIZE_BYTES),
        CmdOpcode::QueryQp => (p::query_qp_in::SIZE_BYTES, p::query_qp_out::SIZE_BYTES),
        CmdOpcode::CreateTis => (p::create_tis_in::SIZE_BYTES, p::create_tis_out::SIZE_BYTES),
        CmdOpcode::DestroyTis => (
            p::destroy_tis_in::SIZE_BYTES,
            p::destroy_tis_out::SIZE_BYTES,
        ),
        CmdOpcode::CreateSq => (p::create_sq_in::SIZE_BYTES, p::create_sq_out::SIZE_BYTES),
        CmdOpcode::ModifySq => (p::modify_sq_in::SIZE_BYTES, p::modify_sq_out::SIZE_BYTES),
        CmdOpcode::DestroySq => (p::destroy_sq_in::SIZE_BYTES, p::destroy_sq_out::SIZE_BYTES),
        CmdOpcode::QuerySq => (p::query_sq_in::SIZE_BYTES, p::query_sq_out::SIZE_BYTES),
        CmdOpcode::CreateRq => (p::create_rq_in::SIZE_BYTES, p::create_rq_out::SIZE_BYTES),
        CmdOpcode::ModifyRq => (p::modify_rq_in::SIZE_BYTES, p::modify_rq_out::SIZE_BYTES),
        CmdOpcode::DestroyRq => (p::destroy_rq_in::SIZE_BYTES, p::destroy_rq_out::SIZE_BYTES),
        CmdOpcode::QueryRq => (p::query_rq_in::SIZE_BYTES, p::query_rq_out::SIZE_BYTES),
        CmdOpcode::CreateTir => (p::create_tir_in::SIZE_BYTES, p::create_tir_out::SIZE_BYTES),
        CmdOpcode::DestroyTir => (
            p::destroy_tir_in::SIZE_BYTES,
            p::destroy_tir_out::SIZE_BYTES,
        ),
        CmdOpcode::QueryTir => (p::query_tir_in::SIZE_BYTES, p::query_tir_out::SIZE_BYTES),
        CmdOpcode::CreateFlowTable => (
            p::create_flow_table_in::SIZE_BYTES,
            p::create_flow_table_out::SIZE_BYTES,
        ),
        CmdOpcode::DestroyFlowTable => (
            p::destroy_flow_table_in::SIZE_BYTES,
            p::destroy_flow_table_out::SIZE_BYTES,
        ),
        CmdOpcode::QueryFlowTable => (
            p::query_flow_table_in::SIZE_BYTES,
            p::query_flow_table_out::SIZE_BYTES,
        ),
        CmdOpcode::CreateFlowGroup => (
            p::create_flow_group_in::SIZE_BYTES,
            p::create_flow_group_out::SIZE_BYTES,
        ),
        CmdOpcode::DestroyFlowGroup => (
            p::destroy_flow_group_in::SIZE_BYTES,
            p::destroy_flow_group_out::SIZE_BYTES,
        ),
        CmdOpcode::SetFlowTableEntry => (p::set_fte_in::SIZE_BYTES, p::set_fte_out::SIZE_BYTES),
        CmdOpcode::DeleteFlowTableEntry => {
            (p::delete_fte_in::SIZE_BYTES, p::delete_fte_out::SIZE_BYTES)
        }
        // The flow context, without a destination list (which `outlen` may add).
        CmdOpcode::QueryFlowTableEntry => {
            (p::query_fte_in::SIZE_BYTES, p::query_fte_out::SIZE_BYTES)
        }
        CmdOpcode::SetFlowTableRoot => (
            p::set_flow_table_root_in::SIZE_BYTES,
            p::set_flow_table_root_out::SIZE_BYTES,
        ),
        _ => return None,
    })
}

impl Hca {
    /// A fresh HCA (no objects).
    pub(crate) fn new_shared(dev: Weak<Device>) -> Arc<Mutex<Hca>> {
        Arc::new_cyclic(|me| {
            Mutex::new(Hca {
                me: me.clone(),
                dev,
                clock: std::time::Instant::now(),
                gids: vec![None; GID_TABLE],
                ports: Ports::default(),
                q: Queues::default(),
                mkeys: mkey::MkeyTable::default(),
                qps: BTreeMap::new(),
                stats: HcaStats::default(),
                txbuf: vec![0u8; 4096 + 128],
                injections: Vec::new(),
                raw: raw::Raw::default(),
                steer: steer::Steering::default(),
                eth: None,
                counters: Arc::default(),
                loopback: VecDeque::new(),
                draining: false,
                mc_list: Vec::new(),
                promisc_mc: false,
                framebuf: Vec::new(),
            })
        })
    }

    /// Tell the HCA which device it runs in (receive threads reach DMA through it); on an
    /// Ethernet wire the port's receive thread hands its frames to this HCA from now on.
    pub(crate) fn attach(&mut self, dev: Weak<Device>) {
        if let Some(d) = dev.upgrade() {
            self.counters = d.port_counters().clone();
            self.eth = d.eth_port().cloned();
            if let Some(p) = &self.eth {
                p.set_target(self.me.clone());
            }
        }
        self.dev = dev;
    }

    /// The device the HCA reaches DMA through.
    pub(crate) fn device(&self) -> Weak<Device> {
        self.dev.clone()
    }

    /// The counters.
    pub fn stats(&self) -> HcaStats {
        self.stats
    }

    /// Queue an error CQE injection (fires once).
    pub(crate) fn inject_error_cqe(&mut self, i: CqeInjection) {
        self.injections.push(i);
    }

    /// Drop the pending error CQE injections.
    pub(crate) fn clear_injections(&mut self) {
        self.injections.clear();
    }

    /// Take the first pending injection for `qpn` on `side`: (syndrome, vendor syndrome).
    pub(crate) fn take_injection(&mut self, qpn: u32, side: InjectSide) -> Option<(u8, u8)> {
        if self.injections.is_empty() {
            return None;
        }
        let i = self
            .injections
            .iter()
            .position(|i| i.side == side && i.qpn.is_none_or(|q| q == qpn))?;
        let i = self.injections.remove(i);
        self.stats.injected_error_cqes += 1;
        tracing::info!(
            qpn,
            ?side,
            syndrome = i.syndrome,
            vendor = i.vendor,
            "error CQE injected (fault hook)"
        );
        Some((i.syndrome, i.vendor))
    }

    pub(crate) fn live(&self) -> Live {
        Live {
            eqs: self.q.eqs.len(),
            cqs: self.q.cqs.len(),
            qps: self.qps.len(),
            mkeys: self.mkeys.keys.len(),
            gids: self.gids.iter().filter(|g| g.is_some()).count(),
            eth: self.raw_objects(),
            flow: self.steer.objects(),
        }
    }

    /// Host memory the objects hold on the driver's behalf (transport rings, page lists,
    /// MTTs, contexts): bounded by one budget, so no command sequence exhausts the host.
    pub(crate) fn host_bytes(&self) -> usize {
        // Each object's own bookkeeping, beyond its lists.
        const PER_OBJECT: usize = 256;
        let l = self.live();
        (l.eqs + l.cqs + l.mkeys + l.qps + l.eth + l.flow) * PER_OBJECT
            + self.q.bytes()
            + self.steer.bytes()
            + self
                .raw
                .sqs
                .values()
                .map(|s| s.wq.ring.bytes())
                .sum::<usize>()
            + self
                .raw
                .rqs
                .values()
                .map(|r| r.wq.ring.bytes())
                .sum::<usize>()
            + self.mkeys.bytes()
            + self
                .qps
                .values()
                .map(|q| q.cost + q.qpc.len() + q.wq.as_ref().map_or(0, queues::Ring::bytes))
                .sum::<usize>()
    }

    /// Whether an object uses PD `pd`.
    pub(crate) fn uses_pd(&self, pd: u32) -> bool {
        self.mkeys.uses_pd(pd)
            || self.qps.values().any(|q| q.pd == pd)
            || self.raw.sqs.values().any(|s| s.wq.pd == pd)
            || self.raw.rqs.values().any(|r| r.wq.pd == pd)
    }

    /// Whether an object uses UAR page `uar`.
    pub(crate) fn uses_uar(&self, uar: u32) -> bool {
        self.q.uses_uar(uar)
            || self.qps.values().any(|q| q.uar == uar)
            || self.raw.sqs.values().any(|s| s.wq.uar == uar)
    }

    /// The lowest free number of the QP space (QPs, SQs and RQs share it), below
    /// 2^`log_max_qp`.
    pub(crate) fn free_qpn(&self, ctx: &Ctx<'_>) -> Option<u32> {
        let limit = 1u64 << ctx.caps.general().log_max_qp();
        (2u32..).take_while(|&n| u64::from(n) < limit).find(|n| {
            !self.qps.contains_key(n)
                && !self.raw.sqs.contains_key(n)
                && !self.raw.rqs.contains_key(n)
        })
    }

    /// Objects that TEARDOWN_HCA refuses to leave behind (the GID table is not one: teardown
    /// clears it).
    pub(crate) fn objects(&self) -> usize {
        let l = self.live();
        l.eqs + l.cqs + l.qps + l.mkeys + l.eth + l.flow
    }

    /// TEARDOWN_HCA: forget the GID table (unbinding the addresses).
    pub(crate) fn teardown(&mut self) {
        for i in 0..self.gids.len() {
            if let Some(e) = self.gids.get_mut(i).and_then(Option::take)
                && self.eth.is_none()
            {
                self.ports.release(e.ip);
            }
        }
    }

    /// Execute one of the HCA's commands (see [`spec`]).
    pub(crate) fn command(
        &mut self,
        dev: &Device,
        op: CmdOpcode,
        input: &[u8],
        out: &mut [u8],
        ctx: &Ctx<'_>,
    ) -> Outcome {
        let creates = matches!(
            op,
            CmdOpcode::CreateEq
                | CmdOpcode::CreateCq
                | CmdOpcode::CreateMkey
                | CmdOpcode::CreateQp
                | CmdOpcode::CreateSq
                | CmdOpcode::CreateRq
                | CmdOpcode::CreateTis
                | CmdOpcode::CreateTir
                | CmdOpcode::CreateFlowTable
                | CmdOpcode::CreateFlowGroup
                | CmdOpcode::SetFlowTableEntry
        );
        // What a new object keeps is at most its command's size (page lists, MTT, context).
        if creates && self.host_bytes().saturating_add(input.len()) > qp::ENGINE_BUDGET {
            return refuse(CmdStatus::NoRes, syn::QP_MEMORY);
        }
        match op {
            CmdOpcode::SetRoceAddress => self.set_roce_address(ctx, input),
            CmdOpcode::QueryRoceAddress => {
                let v = QueryRoceAddressIn::new_unchecked(input);
                let idx = v.roce_address_index() as usize;
                if idx >= GID_TABLE {
                    return refuse(CmdStatus::BadParam, syn::GID_INDEX);
                }
                if !vhca_port_ok(ctx, v.vhca_port_num()) {
                    return refuse(CmdStatus::BadParam, syn::GID_PORT);
                }
                if let Some(e) = self.gids.get(idx).copied().flatten() {
                    let mut o = QueryRoceAddressOut::new_unchecked(out);
                    let mut l = o.roce_address_mut();
                    if let Some(d) = l.as_bytes_mut().get_mut(..32) {
                        d.copy_from_slice(&e.raw);
                    }
                }
                Ok(())
            }
            CmdOpcode::CreateEq => self.q.create_eq(dev, ctx, input, out),
            CmdOpcode::DestroyEq => self.q.destroy_eq(input),
            CmdOpcode::CreateCq => self.q.create_cq(dev, ctx, input, out),
            CmdOpcode::DestroyCq => {
                let (qps, raw) = (&self.qps, &self.raw);
                self.q.destroy_cq(input, |cqn| {
                    qps.values()
                        .any(|q| (!q.no_sq && q.cqn_snd == cqn) || (q.has_rq && q.cqn_rcv == cqn))
                        || raw.sqs.values().any(|s| s.cqn == cqn)
                        || raw.rqs.values().any(|r| r.cqn == cqn)
                })
            }
            CmdOpcode::CreateMkey => self.mkeys.create(ctx, input, out),
            CmdOpcode::DestroyMkey => self.mkeys.destroy(input),
            CmdOpcode::CreateQp => {
                let Some(qpn) = self.free_qpn(ctx) else {
                    return refuse(CmdStatus::NoRes, syn::QP_EXHAUSTED);
                };
                let cqs = &self.q.cqs;
                let left = qp::ENGINE_BUDGET.saturating_sub(self.host_bytes());
                let qp = qp::create(ctx, qpn, left, |c| cqs.contains_key(&c), input, out)?;
                tracing::debug!(qpn, ud = qp.ud, "CREATE_QP");
                self.qps.insert(qpn, qp);
                Ok(())
            }
            CmdOpcode::DestroyQp => {
                let qpn = QueryQpIn::new_unchecked(input).qpn();
                if self.qps.remove(&qpn).is_none() {
                    return refuse(CmdStatus::BadRes, syn::QP_NOT_FOUND);
                }
                Ok(())
            }
            CmdOpcode::QueryQp => {
                let qpn = QueryQpIn::new_unchecked(input).qpn();
                let Some(qp) = self.qps.get_mut(&qpn) else {
                    return refuse(CmdStatus::BadRes, syn::QP_NOT_FOUND);
                };
                qp.query(out);
                Ok(())
            }
            CmdOpcode::Rst2InitQp => self.transition(dev, ctx, Transition::Rst2Init, input),
            CmdOpcode::Init2RtrQp => self.transition(dev, ctx, Transition::Init2Rtr, input),
            CmdOpcode::Rtr2RtsQp => self.transition(dev, ctx, Transition::Rtr2Rts, input),
            CmdOpcode::Rts2RtsQp => self.transition(dev, ctx, Transition::Rts2Rts, input),
            CmdOpcode::Init2InitQp => self.transition(dev, ctx, Transition::Init2Init, input),
            CmdOpcode::Qp2Err => self.transition(dev, ctx, Transition::ToErr, input),
            CmdOpcode::Qp2Rst => self.transition(dev, ctx, Transition::ToRst, input),
            CmdOpcode::CreateTis => self.create_tis(ctx, input, out),
            CmdOpcode::DestroyTis => self.destroy_tis(input),
            CmdOpcode::CreateSq => self.create_sq(ctx, input, out),
            CmdOpcode::ModifySq => self.modify_sq(dev, input),
            CmdOpcode::DestroySq => self.destroy_sq(input),
            CmdOpcode::QuerySq => self.query_sq(input, out),
            CmdOpcode::CreateRq => self.create_rq(ctx, input, out),
            CmdOpcode::ModifyRq => self.modify_rq(input),
            CmdOpcode::DestroyRq => self.destroy_rq(input),
            CmdOpcode::QueryRq => self.query_rq(input, out),
            CmdOpcode::CreateTir => self.create_tir(ctx, input, out),
            CmdOpcode::DestroyTir => self.destroy_tir(input),
            CmdOpcode::QueryTir => self.query_tir(input, out),
            CmdOpcode::CreateFlowTable => {
                let caps = ctx.caps.flow();
                self.steer
                    .create_table(&caps.flow_table_properties_nic_receive(), input, out)
            }
            CmdOpcode::DestroyFlowTable => self.steer.destroy_table(input),
            CmdOpcode::QueryFlowTable => self.steer.query_table(input, out),
            CmdOpcode::CreateFlowGroup => self.steer.create_group(input, out),
            CmdOpcode::DestroyFlowGroup => self.steer.destroy_group(input),
            CmdOpcode::SetFlowTableEntry => {
                let caps = ctx.caps.flow();
                let tirs = &self.raw.tirs;
                self.steer.set_entry(
                    &caps.flow_table_properties_nic_receive(),
                    |t| tirs.contains_key(&t),
                    input,
                )
            }
            CmdOpcode::DeleteFlowTableEntry => self.steer.delete_entry(input),
            CmdOpcode::QueryFlowTableEntry => self.steer.query_entry(input, out),
            CmdOpcode::SetFlowTableRoot => self.steer.set_root(input),
            _ => refuse(CmdStatus::BadOp, syn::UNKNOWN_OPCODE),
        }
    }

    fn transition(&mut self, dev: &Device, ctx: &Ctx<'_>, t: Transition, input: &[u8]) -> Outcome {
        // All QP commands carry the QPN at the same place.
        let qpn = QueryQpIn::new_unchecked(input).qpn();
        let at = rst2init_qp_in::qpc.byte_offset();
        let len = rnic_mlx5_prm::Qpc::<&[u8]>::SIZE_BYTES;
        let zeros = vec![0u8; len];
        let qpc_in = input.get(at..at + len).unwrap_or(&zeros);
        let opt = {
            let f = rnic_mlx5_prm::rst2init_qp_in::opt_param_mask;
            rnic_mlx5_prm::get_bits(input, f.bit_offset as usize, f.width).unwrap_or(0) as u32
        };
        let roce = ctx.caps.roce();
        let general = ctx.caps.general();
        let pc = PathCtx {
            gids: &self.gids,
            vport_mtu: ctx.mtu,
            sw_sport: roce.sw_r_roce_src_udp_port() == 1,
            sport_range: (
                roce.r_roce_min_src_udp_port(),
                roce.r_roce_max_src_udp_port(),
            ),
            log_max_ra: (general.log_max_ra_req_qp(), general.log_max_ra_res_qp()),
            log_max_msg: general.log_max_msg(),
            atomic: general.atomic() == 1,
            ud_strict: dev.options().firmware.strictness.ud_mtu,
        };
        let Some(qp) = self.qps.get_mut(&qpn) else {
            return refuse(CmdStatus::BadRes, syn::QP_NOT_FOUND);
        };
        let mut c = dp::Collect::default();
        qp.modify(t, qpc_in, opt, &pc, &mut c)?;
        tracing::debug!(qpn, ?t, "QP transition");
        // Flushes from 2ERR become CQEs; work waiting in the rings starts at RTS.
        if !c.0.is_empty() {
            self.engine(dev, qpn, None, |_, io| {
                for (side, wc) in c.0.drain(..) {
                    io.cq.complete(side, wc);
                }
            });
        }
        if matches!(
            t,
            Transition::Rtr2Rts | Transition::ToErr | Transition::Init2Rtr
        ) {
            self.pump(dev, qpn);
        }
        Ok(())
    }

    fn set_roce_address(&mut self, ctx: &Ctx<'_>, input: &[u8]) -> Outcome {
        let v = SetRoceAddressIn::new_unchecked(input);
        let idx = v.roce_address_index() as usize;
        if ctx.caps.general().port_type() != PORT_TYPE_ETH {
            return refuse(CmdStatus::BadParam, syn::ROCE_ON_IB_PORT);
        }
        if idx >= GID_TABLE {
            return refuse(CmdStatus::BadParam, syn::GID_INDEX);
        }
        if !vhca_port_ok(ctx, v.vhca_port_num()) {
            return refuse(CmdStatus::BadParam, syn::GID_PORT);
        }
        let at = set_roce_address_in::roce_address.byte_offset();
        let mut raw = [0u8; 32];
        if let Some(s) = input.get(at..at + 32) {
            raw.copy_from_slice(s);
        }
        let l = RoceAddrLayout::new_unchecked(&raw[..]);
        let mut g = [0u8; 16];
        g.copy_from_slice(l.source_l3_address());
        let gid = Gid(g);
        let in_use = self
            .qps
            .values()
            .any(|q| q.src.is_some_and(|(i, _)| usize::from(i) == idx));
        if gid == Gid::ZERO {
            // Clearing the entry.
            if in_use {
                return refuse(CmdStatus::BadResState, syn::GID_IN_USE);
            }
            if let Some(old) = self.gids.get_mut(idx).and_then(Option::take)
                && self.eth.is_none()
            {
                self.ports.release(old.ip);
            }
            return Ok(());
        }
        if !ctx.roce_en {
            return refuse(CmdStatus::BadSysState, syn::ROCE_DISABLED);
        }
        if l.roce_version() != ROCE_VERSION_2 {
            return refuse(CmdStatus::BadParam, syn::GID_VERSION);
        }
        let ip = gid_ip(&gid);
        let l3_ok = match l.roce_l3_type() {
            ROCE_L3_TYPE_IPV4 => ip.is_ipv4(),
            ROCE_L3_TYPE_IPV6 => ip.is_ipv6(),
            _ => false,
        };
        if !l3_ok {
            return refuse(CmdStatus::BadParam, syn::GID_L3_TYPE);
        }
        let hi = l.source_mac_47_32().to_be_bytes();
        let lo = l.source_mac_31_0().to_be_bytes();
        let mac = [hi[2], hi[3], lo[0], lo[1], lo[2], lo[3]];
        if mac != ctx.mac {
            return refuse(CmdStatus::BadParam, syn::GID_MAC);
        }
        if l.vlan_valid() != 0 {
            return refuse(CmdStatus::BadParam, syn::GID_VLAN);
        }
        if in_use && self.gids.get(idx).copied().flatten().map(|e| e.ip) != Some(ip) {
            return refuse(CmdStatus::BadResState, syn::GID_IN_USE);
        }
        if self.eth.is_none()
            && let Err(e) = self.ports.acquire(ip, &self.me)
        {
            tracing::error!(
                %ip, %e,
                "SET_ROCE_ADDRESS: cannot bind UDP/{ROCE_PORT} on this address; give the \
                 function an address of this host (e.g. 127.x.y.z) that nothing else uses for RoCE"
            );
            return refuse(CmdStatus::BadParam, syn::GID_BIND);
        }
        if let Some(old) = self.gids.get_mut(idx).and_then(Option::take)
            && self.eth.is_none()
        {
            self.ports.release(old.ip);
        }
        if let Some(slot) = self.gids.get_mut(idx) {
            *slot = Some(GidEntry { gid, ip, raw });
        }
        tracing::info!(index = idx, %ip, "GID set");
        Ok(())
    }

    /// A UAR doorbell of page `page` (ignored while the function is stopped).
    pub(crate) fn uar_doorbell(&mut self, dev: &Device, page: u32, offset: u32, value: u64) {
        if !dev.serving() {
            self.stats.halted_drops += 1;
            return;
        }
        match offset {
            0x020 => self.q.cq_doorbell(dev, page, value, &mut self.stats),
            0x040 => self.q.eq_doorbell(dev, page, value, true, &mut self.stats),
            0x048 => self.q.eq_doorbell(dev, page, value, false, &mut self.stats),
            o if (0x800..0x1000).contains(&o) => self.sq_doorbell(dev, page, value),
            _ => self.stats.bad_doorbells += 1,
        }
    }

    /// Command completion EQE (type 0x0a, bit `slot` of the vector) on the EQ that asks for
    /// command events; `false` when none does.
    pub(crate) fn command_event(&mut self, dev: &Device, slot: u32) -> bool {
        let mut data = [0u8; 28];
        data[..4].copy_from_slice(&(1u32 << slot).to_be_bytes());
        self.q.event(dev, EventType::Cmd, 0, &data, &mut self.stats)
    }

    /// Port change EQE (type 0x09) for port 1: sub_type active (4) when `up`, down (1) when
    /// not; `false` when no EQ asks for port changes.
    pub(crate) fn port_change_event(&mut self, dev: &Device, up: bool) -> bool {
        let mut data = [0u8; 28];
        // port_state_change_event.port_num: bits 7:4 of EQE + 0x28 (data byte 8).
        data[8] = 1 << 4;
        let sub = if up {
            PortChangeSubtype::Active
        } else {
            PortChangeSubtype::Down
        };
        self.q.event(
            dev,
            EventType::PortChange,
            sub.as_raw(),
            &data,
            &mut self.stats,
        )
    }

    /// Whether an EQ asks for events of type `t`.
    pub(crate) fn subscribes(&self, t: EventType) -> bool {
        self.q.subscribes(t)
    }

    /// Page request EQE (type 0x0b): `num_pages` > 0 give, < 0 reclaim.
    pub(crate) fn page_request_event(&mut self, dev: &Device, num_pages: i32) -> bool {
        let mut data = [0u8; 28];
        // ec_function (BE16, 0) at +0, func_id (BE16, 0) at +2, num_pages BE32 at +4.
        data[4..8].copy_from_slice(&num_pages.to_be_bytes());
        self.q
            .event(dev, EventType::PageRequest, 0, &data, &mut self.stats)
    }

    /// The vport MTU in force: the vport context's `configured` MTU, at
    /// most the MTU of the host interfaces carrying the bound RoCE
    /// addresses (the emulated port's wire; docs/mlx5-emu.md).
    pub(crate) fn vport_mtu(&self, configured: u32) -> u32 {
        match &self.eth {
            Some(p) => configured.min(p.mtu),
            None => configured.min(self.ports.wire_mtu()),
        }
    }

    /// The addresses bound (for tests and tools).
    pub fn bound_addresses(&self) -> Vec<IpAddr> {
        self.ports.by_ip.keys().copied().collect()
    }
}
