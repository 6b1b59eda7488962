//! Queue pairs (mlx5.md §7.3, §7.4): CREATE_QP / DESTROY_QP, the transitions RST2INIT,
//! INIT2RTR, RTR2RTS, 2ERR, 2RST and QUERY_QP, with the state machine's legality checks. Each
//! emulated QP owns one `rnic_roce::transport::Qp` (the RC/UD engine) configured from the QP
//! context.

use std::collections::VecDeque;
use std::net::IpAddr;

use rnic_core::{
    AccessFlags, AddressVector, Gid, Mtu, PdHandle, Psn, QpAttr, QpAttrMask, QpState as Vs, QpType,
    Qpn,
};
use rnic_mlx5_prm::{
    Ads, CmdStatus, CreateQpIn, CreateQpOut, QP_PM_STATE_MIGRATED, QpServiceType, QpState, Qpc,
    QueryQpOut, RQ_TYPE_REGULAR, RQ_TYPE_ZERO_SIZE, TS_FORMAT_DEFAULT, TS_FORMAT_FREE_RUNNING,
    TS_FORMAT_REAL_TIME, create_qp_in,
};
use rnic_roce::transport::{Qp as Engine, QpConfig};

use super::port::{GidEntry, gid_ip};
use super::queues::{Ring, pas_list};
use super::{Ctx, Outcome, refuse};
use crate::firmware::syndrome as syn;

/// Most WQEs handed to the engine at once per queue (the rest wait in the driver's ring).
pub(crate) const ENGINE_DEPTH: u32 = 256;
/// Most data segments of a send WQE (a 1 KiB WQE less its control segment).
pub(crate) const MAX_SEND_SGE: usize = 62;
/// Most inline bytes in a send WQE (1 KiB less control and inline header).
pub(crate) const MAX_INLINE: usize = 1024;
/// The transport rings all QPs together may hold (the emulator's stand-in for ICM).
pub(crate) const ENGINE_BUDGET: usize = 256 << 20;

/// The bytes of transport ring a QP with these depths costs.
pub(crate) fn engine_cost(sq_depth: u32, rq_depth: u32, max_recv_sge: usize) -> usize {
    sq_depth as usize * (MAX_SEND_SGE * 16 + MAX_INLINE + 64)
        + rq_depth as usize * (max_recv_sge * 16 + 32)
}

/// What the firmware remembers of a WQE handed to the engine (completions come in order).
#[derive(Clone, Copy, Debug)]
pub(crate) struct SendMeta {
    /// WQE index (ctrl segment [23:8]).
    pub(crate) index: u16,
    /// WQE opcode byte.
    pub(crate) opcode: u8,
    /// CQE on success (completion mode 2 or 3).
    pub(crate) signaled: bool,
    /// Completion mode 3: CQE and EQE.
    pub(crate) force_eqe: bool,
    /// Solicited event bit.
    pub(crate) solicited: bool,
    /// Not handed to the engine: complete here when it reaches the head (NOP, or a WQE that
    /// failed the firmware's own checks with this syndrome).
    pub(crate) local: Option<u8>,
    /// `vendor_err_synd` of the error CQE of a `local` failure (an injected one's).
    pub(crate) vendor: u8,
    /// Atomics: the local result buffer (lkey, address) to turn into big-endian.
    pub(crate) atomic_result: Option<(u32, u64)>,
    /// Message length (READ byte count, atomics 8).
    pub(crate) len: u32,
}

/// One emulated QP.
#[derive(Debug)]
pub(crate) struct QpObj {
    pub(crate) qpn: u32,
    pub(crate) ud: bool,
    pub(crate) state: QpState,
    pub(crate) pd: u32,
    pub(crate) uar: u32,
    pub(crate) cqn_snd: u32,
    pub(crate) cqn_rcv: u32,
    pub(crate) dbr: u64,
    pub(crate) user_index: u32,
    pub(crate) no_sq: bool,
    /// The WQ buffer: RQ at 0, SQ after it (mlx5.md §7.4).
    pub(crate) wq: Option<Ring>,
    pub(crate) log_sq: u32,
    pub(crate) log_rq: u32,
    /// log2 of the RQ WQE stride in bytes.
    pub(crate) log_rq_stride: u32,
    pub(crate) sq_offset: u64,
    pub(crate) has_rq: bool,
    pub(crate) engine: Engine,
    /// Next SQ WQEBB counter to fetch.
    pub(crate) sq_fetched: u16,
    /// Next RQ WQE counter to fetch.
    pub(crate) rq_fetched: u16,
    pub(crate) sq_meta: VecDeque<SendMeta>,
    pub(crate) rq_meta: VecDeque<u16>,
    /// The SQ stopped at a WQE the firmware refused (its error CQE comes when earlier work
    /// has completed).
    pub(crate) sq_stopped: bool,
    /// The context as last set (QUERY_QP returns it with the live state).
    pub(crate) qpc: Vec<u8>,
    /// The local address (INIT2RTR `src_addr_index`) while past INIT.
    pub(crate) src: Option<(u8, IpAddr)>,
    pub(crate) sport: u16,
    pub(crate) log_msg_max: u32,
    /// A UD QP's MTU in bytes, as its last modify set it (sends above it are a length error
    /// while [`crate::Strictness::ud_mtu`] is on).
    pub(crate) ud_mtu: Option<u32>,
    pub(crate) q_key: u32,
    /// Bytes of [`ENGINE_BUDGET`] this QP holds.
    pub(crate) cost: usize,
}

/// The mlx5 state of an engine state.
pub(crate) fn mlx5_state(s: Vs) -> QpState {
    match s {
        Vs::Reset => QpState::Rst,
        Vs::Init => QpState::Init,
        Vs::Rtr => QpState::Rtr,
        Vs::Rts => QpState::Rts,
        Vs::Sqd => QpState::Sqd,
        Vs::Sqe => QpState::Sqer,
        Vs::Err => QpState::Err,
    }
}

fn bad(s: u32) -> Outcome {
    refuse(CmdStatus::BadParam, s)
}

/// CREATE_QP: the QP object (not yet inserted), or the refusal.
pub(crate) fn create(
    ctx: &Ctx<'_>,
    qpn: u32,
    budget_left: usize,
    cq_exists: impl Fn(u32) -> bool,
    input: &[u8],
    out: &mut [u8],
) -> Result<QpObj, super::Refusal> {
    let v = CreateQpIn::new_unchecked(input);
    let c = v.qpc();
    let err = |st, s| super::Refusal {
        status: st,
        syndrome: s,
    };
    let ud = match QpServiceType::from_raw(c.st() as u8) {
        QpServiceType::Rc => false,
        QpServiceType::Ud => true,
        _ => return Err(err(CmdStatus::BadParam, syn::QP_TYPE)),
    };
    if c.pm_state() != QP_PM_STATE_MIGRATED
        || v.wq_umem_valid() != 0
        || c.dbr_umem_valid() != 0
        || c.ts_format() > TS_FORMAT_REAL_TIME
        || c.cs_req() != 0
        || c.cs_res() != 0
        || v.input_qpn() != 0
        || v.qpc_ext() != 0
    {
        return Err(err(CmdStatus::BadParam, syn::QP_CONTEXT));
    }
    if !ts_format_allowed(ctx.caps.roce().qp_ts_format(), c.ts_format()) {
        return Err(err(CmdStatus::BadParam, syn::QP_TS_FORMAT));
    }
    if !ctx.pds.contains(&c.pd()) {
        return Err(err(CmdStatus::BadRes, syn::MKEY_PD));
    }
    if !ctx.uars.contains(&c.uar_page()) {
        return Err(err(CmdStatus::BadRes, syn::EQ_UAR));
    }
    let caps = ctx.caps.general();
    let no_sq = c.no_sq() == 1;
    let rq_type = c.rq_type();
    let has_rq = match rq_type {
        RQ_TYPE_REGULAR => true,
        RQ_TYPE_ZERO_SIZE => false,
        _ => return Err(err(CmdStatus::BadParam, syn::QP_SIZE)),
    };
    let log_rq_stride = c.log_rq_stride() + 4;
    let max_qp = caps.log_max_qp_sz();
    if c.log_sq_size() > max_qp
        || c.log_rq_size() > max_qp
        || (has_rq && (1u32 << log_rq_stride) > caps.max_wqe_sz_rq())
    {
        return Err(err(CmdStatus::BadParam, syn::QP_SIZE));
    }
    if (!no_sq && !cq_exists(c.cqn_snd())) || (has_rq && !cq_exists(c.cqn_rcv())) {
        return Err(err(CmdStatus::BadRes, syn::CQ_NOT_FOUND));
    }
    if !c.dbr_addr().is_multiple_of(8) {
        return Err(err(CmdStatus::BadParam, syn::DBR_ALIGN));
    }
    let rq_bytes = if has_rq {
        1u64 << (c.log_rq_size() + log_rq_stride)
    } else {
        0
    };
    let sq_bytes = if no_sq { 0 } else { 64u64 << c.log_sq_size() };
    let total = rq_bytes + sq_bytes;
    let wq = if total > 0 {
        if c.page_offset() != 0 || c.log_page_size() > 18 {
            return Err(err(CmdStatus::BadParam, syn::QUEUE_PAS));
        }
        let log_page = 12 + c.log_page_size();
        let npages = total.div_ceil(1 << log_page) as usize;
        let pages = pas_list(input, create_qp_in::pas.byte_offset(), npages, log_page)
            .map_err(|s| err(CmdStatus::BadParam, s))?;
        Some(Ring::from_pages(pages, log_page))
    } else {
        None
    };
    let sq_depth = if no_sq {
        1
    } else {
        (1u32 << c.log_sq_size()).min(ENGINE_DEPTH)
    };
    let rq_depth = if has_rq {
        (1u32 << c.log_rq_size()).min(ENGINE_DEPTH)
    } else {
        1
    };
    let max_recv_sge = if has_rq {
        1usize << (log_rq_stride - 4)
    } else {
        1
    };
    let cost = engine_cost(sq_depth, rq_depth, max_recv_sge);
    if cost > budget_left {
        return Err(err(CmdStatus::NoRes, syn::QP_MEMORY));
    }
    let cfg = QpConfig {
        qpn: Qpn::from_wire(qpn),
        qp_type: if ud { QpType::Ud } else { QpType::Rc },
        pd: PdHandle(c.pd()),
        sq_depth,
        rq_depth,
        max_send_sge: MAX_SEND_SGE,
        max_recv_sge,
        max_inline: MAX_INLINE,
        sq_sig_all: true,
        local_gid: Gid::ZERO,
        retry_cnt_7_infinite: false,
        max_unacked_psns: rnic_roce::transport::DEFAULT_MAX_UNACKED_PSNS,
    };
    let engine = Engine::new(cfg).map_err(|e| {
        tracing::error!(%e, "transport engine refused a QP configuration (bug)");
        err(CmdStatus::BadParam, syn::QP_TYPE)
    })?;
    let _ = CreateQpOut::new_unchecked(out).set_qpn(qpn);
    let qpc_at = create_qp_in::qpc.byte_offset();
    let qpc = input
        .get(qpc_at..qpc_at + Qpc::<&[u8]>::SIZE_BYTES)
        .map(<[u8]>::to_vec)
        .unwrap_or_default();
    Ok(QpObj {
        qpn,
        ud,
        state: QpState::Rst,
        pd: c.pd(),
        uar: c.uar_page(),
        cqn_snd: c.cqn_snd(),
        cqn_rcv: c.cqn_rcv(),
        dbr: c.dbr_addr(),
        user_index: c.user_index(),
        no_sq,
        wq,
        log_sq: c.log_sq_size(),
        log_rq: c.log_rq_size(),
        log_rq_stride,
        sq_offset: rq_bytes,
        has_rq,
        engine,
        sq_fetched: 0,
        rq_fetched: 0,
        sq_meta: VecDeque::new(),
        rq_meta: VecDeque::new(),
        sq_stopped: false,
        qpc,
        src: None,
        // UD datagrams whose address vector names no port leave from this one (the
        // firmware's choice, like the RC hash); RC sets its own at INIT2RTR.
        sport: 0xc000 | (qpn & 0x3fff) as u16,
        log_msg_max: caps.log_max_msg(),
        ud_mtu: None,
        q_key: 0,
        cost,
    })
}

/// Whether QP `ts_format` (0 free-running, 1 default, 2 real-time) is one RoCE cap
/// `qp_ts_format` (0 free-running only, 1 real-time only, 2 both; K `get_ts_format`) allows.
/// DEFAULT means whatever the device runs, so it is always allowed; the cap's reserved value 3
/// is read as free-running only.
pub(crate) fn ts_format_allowed(cap: u32, ts: u32) -> bool {
    match ts {
        TS_FORMAT_DEFAULT => true,
        TS_FORMAT_FREE_RUNNING => cap != 1,
        TS_FORMAT_REAL_TIME => cap == 1 || cap == 2,
        _ => false,
    }
}

/// The transitions this firmware executes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Transition {
    Rst2Init,
    Init2Rtr,
    Rtr2Rts,
    Rts2Rts,
    Init2Init,
    ToErr,
    ToRst,
}

impl Transition {
    fn from(self) -> &'static [QpState] {
        match self {
            Transition::Rst2Init => &[QpState::Rst],
            Transition::Init2Rtr => &[QpState::Init],
            Transition::Rtr2Rts => &[QpState::Rtr],
            Transition::Rts2Rts => &[QpState::Rts],
            Transition::Init2Init => &[QpState::Init],
            Transition::ToErr | Transition::ToRst => &[
                QpState::Rst,
                QpState::Init,
                QpState::Rtr,
                QpState::Rts,
                QpState::Sqer,
                QpState::Sqd,
                QpState::Err,
            ],
        }
    }
}

fn mtu_of(raw: u32) -> Option<Mtu> {
    Mtu::from_enum(u8::try_from(raw).ok()?).ok()
}

/// The copy of `field`'s bits from `src` (a qpc) into `dst` (the stored qpc).
fn copy_bits(dst: &mut [u8], src: &[u8], f: rnic_mlx5_prm::FieldLayout) {
    if let Ok(v) = rnic_mlx5_prm::get_bits(src, f.bit_offset as usize, f.width) {
        let _ = rnic_mlx5_prm::set_bits(dst, f.bit_offset as usize, f.width, v);
    }
}

/// Context for a transition: the GID table, vport MTU, RoCE source-port cap.
pub(crate) struct PathCtx<'a> {
    pub(crate) gids: &'a [Option<GidEntry>],
    pub(crate) vport_mtu: u32,
    pub(crate) sw_sport: bool,
    pub(crate) sport_range: (u32, u32),
    pub(crate) log_max_ra: (u32, u32),
    /// Cap `log_max_msg`.
    pub(crate) log_max_msg: u32,
    /// Cap `atomic`.
    pub(crate) atomic: bool,
    /// [`crate::Strictness::ud_mtu`].
    pub(crate) ud_strict: bool,
}

impl QpObj {
    /// Apply transition `t` with the qpc in `qpc_in` (the modify command's). The caller
    /// checked that the QP exists; the engine flushes through `cq` on ERR.
    pub(crate) fn modify(
        &mut self,
        t: Transition,
        qpc_in: &[u8],
        opt: u32,
        pc: &PathCtx<'_>,
        cq: &mut dyn rnic_roce::transport::CompletionSink,
    ) -> Outcome {
        self.sync_state();
        if !t.from().contains(&self.state) {
            return refuse(CmdStatus::BadQpState, syn::QP_STATE);
        }
        let c = Qpc::new_unchecked(qpc_in);
        let ads = c.primary_address_path();
        let mut attr = QpAttr::default();
        let mut mask = QpAttrMask::STATE;
        use rnic_mlx5_prm::{ads as a, qp_optpar as o, qpc as q};
        let carries_qpc = !matches!(t, Transition::ToErr | Transition::ToRst);
        // Row 6 (K ib/qp.c sets them on every modify of a UD QP): a valid MTU and a message
        // size within the cap, or the modify is refused.
        let mut ud_mtu = None;
        if self.ud && carries_qpc && pc.ud_strict {
            let Some(mtu) = mtu_of(c.mtu()) else {
                return bad(syn::UD_MTU);
            };
            if c.log_msg_max() > pc.log_max_msg {
                return bad(syn::UD_MSG_MAX);
            }
            ud_mtu = Some(mtu);
        }
        // Without the atomic cap, remote atomics cannot be enabled: RST2INIT always reads
        // `rae`/`atomic_mode`, the other transitions when they re-read the access bits.
        let reads_access = t == Transition::Rst2Init
            || (matches!(
                t,
                Transition::Init2Rtr | Transition::Init2Init | Transition::Rts2Rts
            ) && opt & o::RAE != 0);
        if !pc.atomic && reads_access && (c.rae() != 0 || c.atomic_mode() != 0) {
            return bad(syn::QP_ATOMIC);
        }
        let stored = &mut self.qpc;
        match t {
            Transition::Rst2Init => {
                if ads.pkey_index() != 0 || ads.vhca_port_num() > 1 {
                    return bad(syn::QP_ATTR);
                }
                attr.qp_state = Vs::Init;
                attr.qp_access_flags = access(&c);
                mask |= QpAttrMask::ACCESS_FLAGS;
                if self.ud {
                    attr.qkey = c.q_key();
                    self.q_key = c.q_key();
                    mask |= QpAttrMask::QKEY;
                }
                for f in [q::rre, q::rwe, q::rae, q::q_key] {
                    copy_bits(stored, qpc_in, f);
                }
            }
            Transition::Init2Rtr => {
                attr.qp_state = Vs::Rtr;
                if opt & (o::RRE | o::RWE | o::RAE) != 0 {
                    attr.qp_access_flags = access(&c);
                    mask |= QpAttrMask::ACCESS_FLAGS;
                }
                if !self.ud {
                    let Some(mtu) = mtu_of(c.mtu()) else {
                        return bad(syn::QP_ATTR);
                    };
                    if mtu.bytes() + 96 > pc.vport_mtu
                        || c.log_msg_max() > self.log_msg_max
                        || c.log_rra_max() > pc.log_max_ra.1
                        || c.min_rnr_nak() > 31
                        || ads.vhca_port_num() > 1
                        || c.remote_qpn() == 0
                    {
                        return bad(syn::QP_ATTR);
                    }
                    let gi = ads.src_addr_index();
                    let Some(src) = pc.gids.get(gi as usize).copied().flatten() else {
                        return bad(syn::QP_PATH);
                    };
                    let mut rgid = [0u8; 16];
                    rgid.copy_from_slice(ads.rgid_rip());
                    let dgid = Gid(rgid);
                    if gid_ip(&dgid).is_ipv4() != src.ip.is_ipv4() {
                        return bad(syn::QP_PATH);
                    }
                    let sport = if pc.sw_sport && ads.udp_sport() != 0 {
                        if !(pc.sport_range.0..=pc.sport_range.1).contains(&ads.udp_sport()) {
                            return bad(syn::QP_PATH);
                        }
                        ads.udp_sport() as u16
                    } else {
                        // The firmware's own choice (mlx5.md §12: not public): a hash of the
                        // QPNs into 0xc000..=0xffff.
                        0xc000 | ((self.qpn ^ c.remote_qpn()) & 0x3fff) as u16
                    };
                    let mac_hi = ads.rmac_47_32().to_be_bytes();
                    let mac_lo = ads.rmac_31_0().to_be_bytes();
                    attr.ah_attr = AddressVector {
                        dgid,
                        sgid_index: gi as u8,
                        hop_limit: ads.hop_limit() as u8,
                        traffic_class: ((ads.dscp() << 2) | ads.ecn()) as u8,
                        flow_label: ads.flow_label(),
                        udp_sport: Some(sport),
                        dmac: Some([
                            mac_hi[2], mac_hi[3], mac_lo[0], mac_lo[1], mac_lo[2], mac_lo[3],
                        ]),
                    };
                    attr.path_mtu = mtu;
                    attr.dest_qp_num = Qpn::from_wire(c.remote_qpn());
                    attr.rq_psn = Psn::from_wire(c.next_rcv_psn());
                    attr.min_rnr_timer = c.min_rnr_nak() as u8;
                    attr.max_dest_rd_atomic = 1u8 << c.log_rra_max();
                    mask |= QpAttrMask::AV
                        | QpAttrMask::PATH_MTU
                        | QpAttrMask::DEST_QPN
                        | QpAttrMask::RQ_PSN
                        | QpAttrMask::MIN_RNR_TIMER
                        | QpAttrMask::MAX_DEST_RD_ATOMIC;
                    self.src = Some((gi as u8, src.ip));
                    self.sport = sport;
                    self.log_msg_max = c.log_msg_max();
                    let pa = q::primary_address_path.bit_offset as usize;
                    for f in [
                        q::mtu,
                        q::log_msg_max,
                        q::remote_qpn,
                        q::next_rcv_psn,
                        q::min_rnr_nak,
                        q::log_rra_max,
                    ] {
                        copy_bits(stored, qpc_in, f);
                    }
                    let ads_bytes = Ads::<&[u8]>::SIZE_BYTES;
                    if let (Some(d), Some(s)) = (
                        stored.get_mut(pa / 8..pa / 8 + ads_bytes),
                        qpc_in.get(pa / 8..pa / 8 + ads_bytes),
                    ) {
                        d.copy_from_slice(s);
                    }
                }
            }
            Transition::Rtr2Rts => {
                attr.qp_state = Vs::Rts;
                if c.log_sra_max() > pc.log_max_ra.0 || c.retry_count() > 7 || c.rnr_retry() > 7 {
                    return bad(syn::QP_ATTR);
                }
                attr.sq_psn = Psn::from_wire(c.next_send_psn());
                mask |= QpAttrMask::SQ_PSN;
                if !self.ud {
                    attr.retry_cnt = c.retry_count() as u8;
                    attr.rnr_retry = c.rnr_retry() as u8;
                    attr.timeout = ads.ack_timeout() as u8;
                    attr.max_rd_atomic = 1u8 << c.log_sra_max();
                    mask |= QpAttrMask::RETRY_CNT
                        | QpAttrMask::RNR_RETRY
                        | QpAttrMask::TIMEOUT
                        | QpAttrMask::MAX_QP_RD_ATOMIC;
                    let pa = q::primary_address_path.bit_offset as usize;
                    if let (Some(d), Some(s)) = (stored.get_mut(pa / 8..), qpc_in.get(pa / 8..)) {
                        copy_bits(d, s, a::ack_timeout);
                    }
                }
                for f in [
                    q::next_send_psn,
                    q::retry_count,
                    q::rnr_retry,
                    q::log_sra_max,
                ] {
                    copy_bits(stored, qpc_in, f);
                }
            }
            Transition::Init2Init => {
                // Only what opt_param_mask names changes (§7.3).
                attr.qp_state = Vs::Init;
                if opt & o::PKEY_INDEX != 0 && ads.pkey_index() != 0 {
                    return bad(syn::QP_ATTR);
                }
                if opt & (o::RRE | o::RWE | o::RAE) != 0 {
                    attr.qp_access_flags = access(&c);
                    mask |= QpAttrMask::ACCESS_FLAGS;
                    for f in [q::rre, q::rwe, q::rae] {
                        copy_bits(stored, qpc_in, f);
                    }
                }
                if self.ud && opt & o::Q_KEY != 0 {
                    attr.qkey = c.q_key();
                    self.q_key = c.q_key();
                    mask |= QpAttrMask::QKEY;
                    copy_bits(stored, qpc_in, q::q_key);
                }
            }
            Transition::Rts2Rts => {
                // Only what opt_param_mask names changes (§7.3).
                attr.qp_state = Vs::Rts;
                if opt & (o::RRE | o::RWE | o::RAE) != 0 {
                    attr.qp_access_flags = access(&c);
                    mask |= QpAttrMask::ACCESS_FLAGS;
                    for f in [q::rre, q::rwe, q::rae] {
                        copy_bits(stored, qpc_in, f);
                    }
                }
                if !self.ud {
                    if opt & o::RETRY_COUNT != 0 {
                        attr.retry_cnt = c.retry_count() as u8;
                        mask |= QpAttrMask::RETRY_CNT;
                        copy_bits(stored, qpc_in, q::retry_count);
                    }
                    if opt & o::RNR_RETRY != 0 {
                        attr.rnr_retry = c.rnr_retry() as u8;
                        mask |= QpAttrMask::RNR_RETRY;
                        copy_bits(stored, qpc_in, q::rnr_retry);
                    }
                    if opt & o::RNR_TIMEOUT != 0 {
                        attr.min_rnr_timer = c.min_rnr_nak() as u8;
                        mask |= QpAttrMask::MIN_RNR_TIMER;
                        copy_bits(stored, qpc_in, q::min_rnr_nak);
                    }
                    if opt & o::ACK_TIMEOUT != 0 {
                        attr.timeout = ads.ack_timeout() as u8;
                        mask |= QpAttrMask::TIMEOUT;
                        let pa = q::primary_address_path.bit_offset as usize;
                        if let (Some(d), Some(s)) = (stored.get_mut(pa / 8..), qpc_in.get(pa / 8..))
                        {
                            copy_bits(d, s, a::ack_timeout);
                        }
                    }
                    if opt & o::SRA_MAX != 0 {
                        if c.log_sra_max() > pc.log_max_ra.0 {
                            return bad(syn::QP_ATTR);
                        }
                        attr.max_rd_atomic = 1u8 << c.log_sra_max();
                        mask |= QpAttrMask::MAX_QP_RD_ATOMIC;
                        copy_bits(stored, qpc_in, q::log_sra_max);
                    }
                    if opt & o::RRA_MAX != 0 {
                        if c.log_rra_max() > pc.log_max_ra.1 {
                            return bad(syn::QP_ATTR);
                        }
                        attr.max_dest_rd_atomic = 1u8 << c.log_rra_max();
                        mask |= QpAttrMask::MAX_DEST_RD_ATOMIC;
                        copy_bits(stored, qpc_in, q::log_rra_max);
                    }
                }
                if self.ud && opt & o::Q_KEY != 0 {
                    attr.qkey = c.q_key();
                    self.q_key = c.q_key();
                    mask |= QpAttrMask::QKEY;
                    copy_bits(stored, qpc_in, q::q_key);
                }
            }
            Transition::ToErr => attr.qp_state = Vs::Err,
            Transition::ToRst => attr.qp_state = Vs::Reset,
        }
        // A UD QP's MTU bounds its datagrams in the engine too (without the check the engine
        // keeps its default, 1024).
        if let Some(m) = ud_mtu {
            attr.path_mtu = m;
            mask |= QpAttrMask::PATH_MTU;
        }
        if let Err(e) = self.engine.modify(&attr, mask, cq) {
            tracing::info!(%e, "QP transition refused by the transport engine");
            return bad(syn::QP_ATTR);
        }
        self.state = mlx5_state(attr.qp_state);
        if let Some(m) = ud_mtu {
            self.ud_mtu = Some(m.bytes());
            self.log_msg_max = c.log_msg_max();
            for f in [q::mtu, q::log_msg_max] {
                copy_bits(&mut self.qpc, qpc_in, f);
            }
        }
        if t == Transition::ToRst {
            self.sq_fetched = 0;
            self.rq_fetched = 0;
            self.sq_meta.clear();
            self.rq_meta.clear();
            self.sq_stopped = false;
            self.src = None;
        }
        Ok(())
    }

    /// Follow the engine into ERR (a transport error it met).
    pub(crate) fn sync_state(&mut self) {
        if self.engine.state() == Vs::Err {
            self.state = QpState::Err;
        }
    }

    /// QUERY_QP output.
    pub(crate) fn query(&mut self, out: &mut [u8]) {
        self.sync_state();
        let mut o = QueryQpOut::new_unchecked(out);
        let mut c = o.qpc_mut();
        if let Some(d) = c.as_bytes_mut().get_mut(..self.qpc.len()) {
            d.copy_from_slice(&self.qpc);
        }
        let _ = c.set_state(u32::from(self.state.as_raw()));
    }
}

fn access(c: &Qpc<&[u8]>) -> AccessFlags {
    let mut f = AccessFlags::LOCAL_WRITE;
    if c.rre() == 1 {
        f |= AccessFlags::REMOTE_READ;
    }
    if c.rwe() == 1 {
        f |= AccessFlags::REMOTE_WRITE;
    }
    if c.rae() == 1 {
        f |= AccessFlags::REMOTE_ATOMIC;
    }
    f
}
