//! Queue pairs (mlx5.md §7.3, §7.4, §8, §9): [`Qp`], RC and UD.
//!
//! One [`DmaBuffer`] holds the RQ at offset 0, the SQ right after it (K
//! `_create_kernel_qp`), and the doorbell record in the 64 bytes after the
//! page-rounded work queues. [`Qp::post_send`] builds WQEs straight in the
//! SQ ring, then
//!
//! 1. publishes the per-WQE tracking for the CQ (`Release`),
//! 2. [`dma_wmb_before_doorbell`] — WQEs before the doorbell record,
//! 3. stores the record's send counter (`sq.head & 0xffff`),
//! 4. [`dma_wmb_before_doorbell`] — the record before the UAR write,
//! 5. writes the UAR: a single WQE of ≤ 256 bytes is copied whole into the
//!    QP's BlueFlame register (64-byte units) then [`wc_flush`]; otherwise
//!    the first 8 bytes of the last WQE's control segment,
//! 6. toggles the BlueFlame half (§8).
//!
//! [`Qp::post_recv`] writes RQ WQEs (data segments, a terminator when fewer
//! than the stride's slots are used), the barrier, then the record's
//! receive counter (§9.4; no MMIO). Neither takes a lock, allocates, or
//! makes a system call.

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rnic_core::{
    AccessFlags, Gid, InitParams, Psn, QpType, Qpn, RecvWr, Rkey, RtrParams, RtsParams, SendWr,
};
use rnic_dma::Mmio;
use rnic_dma::barrier::wc_flush;
use rnic_mlx5_prm::{
    ATOMIC_MODE_IB_COMP, CmdOpcode, CreateQpIn, CreateQpOut, DestroyQpIn, DestroyQpOut,
    Init2rtrQpIn, Init2rtrQpOut, LOG_ACK_REQ_FREQ_DEFAULT, QP_PM_STATE_MIGRATED, Qp2errIn,
    Qp2errOut, Qp2rstIn, Qp2rstOut, QpServiceType, QpState, Qpc, QueryQpIn, QueryQpOut,
    RQ_TYPE_REGULAR, Rst2initQpIn, Rst2initQpOut, Rtr2rtsQpIn, Rtr2rtsQpOut, TS_FORMAT_DEFAULT,
    TS_FORMAT_FREE_RUNNING, UAR_BF_REG_0, WQEBB_BYTES,
};
use tracing::{debug, warn};

use crate::rdma::bf::BlockPair;
use crate::rdma::cq::{Cq, CqCore};
use crate::rdma::ring::{BlockHead, Wqebb};
use crate::rdma::track::{QpShared, RqTrack, SqBlocks, SqTrack};
use crate::rdma::wq::{QpCounters, Region, SendDoorbell, UdSegment, WorkQueues, next_bf_offset};
use crate::rdma::wqe::{
    DATAGRAM_SEG_BYTES, MAX_INLINE_DATA, MAX_RECV_SGE, MAX_SEND_SGE, Refused, SendLimits,
    default_udp_sport,
};
use crate::{BlockWindow, Hca, Mkey, Mlx5Error};

/// `qpc.mtu` of a UD QP: 4096 bytes (IB_MTU_4096, the PRM enum's 5).
const UD_MTU_4096: u32 = 5;
/// `qpc.log_msg_max` of a UD QP: 2^12, one packet.
const UD_LOG_MSG_MAX: u32 = 12;

/// How big a QP's queues are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpOptions {
    /// RC or UD.
    pub qp_type: QpType,
    /// Send requests of the largest size that fit at once.
    pub max_send_wr: u32,
    /// Receives that fit at once.
    pub max_recv_wr: u32,
    /// Gather entries per send (≤ 16).
    pub max_send_sge: u32,
    /// Scatter entries per receive (≤ 16).
    pub max_recv_sge: u32,
    /// Inline bytes per send (≤ 188).
    pub max_inline_data: u32,
    /// Every send is signaled.
    pub sq_sig_all: bool,
}

impl Default for QpOptions {
    fn default() -> QpOptions {
        QpOptions {
            qp_type: QpType::Rc,
            max_send_wr: 64,
            max_recv_wr: 64,
            max_send_sge: 2,
            max_recv_sge: 2,
            max_inline_data: 64,
            sq_sig_all: false,
        }
    }
}

struct BlueFlame {
    /// The register through the uncached mapping: the general path's
    /// 8-byte doorbells.
    reg: Mmio,
    /// The register through the write-combining mapping: the general
    /// path's BlueFlame copies (`combine` QPs only).
    blocks: Option<BlockWindow>,
    /// Both halves of the register, checked once (`WorkQueues::block_pair`):
    /// over the write-combining mapping when `combine` (64-byte copies),
    /// else over the uncached one (8-byte doorbells); the fast paths ring
    /// through it with no `Option` test. Without a pair (a register too
    /// small to halve into blocks) a [`BlockPair::scratch`] that nothing
    /// rings through (the queues keep the fast paths' gate closed), and the
    /// current half is `offset`.
    fast: BlockPair,
    /// BlueFlame copies allowed: a write-combining mapping and a register
    /// this QP does not share (audit rows 4, 5).
    combine: bool,
    /// The current half when `fast` is a scratch pair.
    offset: usize,
    half: usize,
    exclusive: Option<usize>,
}

impl BlueFlame {
    /// The half the next write goes to (`paired`: `fast` is the
    /// register's own pair, `WorkQueues::block_pair`).
    #[inline(always)]
    fn offset(&self, paired: bool) -> usize {
        if paired {
            self.fast.offset()
        } else {
            self.offset
        }
    }

    /// Switch to the other half.
    #[inline(always)]
    fn advance(&mut self, paired: bool) {
        if paired {
            self.fast.advance();
        } else {
            self.offset = next_bf_offset(self.offset, self.half);
        }
    }

    /// The fast paths' UAR write for one WQEBB: a BlueFlame copy then
    /// [`wc_flush`] on a write-combining register of this QP's own, else
    /// the 8-byte doorbell (no flush: an uncached store is not buffered).
    #[inline(always)]
    fn ring_fast<H: BlockHead>(&mut self, wqe: &Wqebb<H>) {
        if self.combine {
            self.fast.write_next(wqe);
            wc_flush();
        } else {
            self.fast.ring_next(wqe.head.words()[0]);
        }
    }

    /// Copy one 64-byte unit into the write-combining register at
    /// `offset` (one bounds check, eight volatile stores). `false`
    /// (nothing written) without a write-combining mapping or if it does
    /// not fit.
    #[inline(always)]
    fn write_block(&self, offset: usize, words: &[u64; 8]) -> bool {
        self.blocks
            .as_ref()
            .is_some_and(|b| b.write_block(offset, words))
    }
}

/// A queue pair. `post_send` / `post_recv` take `&mut self`: one poster.
/// Dropping it destroys the firmware QP, then releases its CQs.
pub struct Qp {
    hca: Arc<Hca>,
    qp_type: QpType,
    send_cq: Arc<CqCore>,
    recv_cq: Arc<CqCore>,
    bf: BlueFlame,
    port: u8,
    wq: WorkQueues,
}

impl fmt::Debug for Qp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Qp")
            .field("qpn", &self.wq.qpn)
            .field("type", &self.qp_type)
            .field("state", &self.wq.state)
            .field("counters", &self.counters())
            .finish_non_exhaustive()
    }
}

fn prm(what: &'static str) -> impl Fn(rnic_mlx5_prm::Error) -> Mlx5Error {
    move |source| Mlx5Error::Prm { what, source }
}

fn ceil_log2(v: u32) -> u32 {
    v.max(1).next_power_of_two().trailing_zeros()
}

/// Bytes of headers a RoCE v2 packet adds to its payload on the wire, as
/// counted against the Ethernet MTU: IPv6 40 (the larger IP header), UDP 8,
/// BTH 12, the largest extended headers 32 (RETH 16 + IMMDT 4 + … within),
/// ICRC 4 — 96, the margin the emulated function checks too (docs/mlx5.md
/// §12).
pub const ROCE_HEADROOM: u32 = 96;

/// The largest path MTU whose packets fit a vport MTU of `vport_mtu` bytes
/// (256 when even that does not: the smallest size a QP can name).
pub fn path_mtu_for(vport_mtu: u32) -> rnic_core::Mtu {
    rnic_core::Mtu::ALL
        .into_iter()
        .rev()
        .find(|m| m.bytes() + ROCE_HEADROOM <= vport_mtu)
        .unwrap_or(rnic_core::Mtu::Mtu256)
}

macro_rules! modify_qp {
    ($self:ident, $In:ident, $Out:ident, $op:expr, $what:literal, |$q:ident| $fill:block) => {{
        let mut buf = vec![0u8; $In::<&[u8]>::SIZE_BYTES];
        {
            let mut v = $In::new_checked(&mut buf[..]).map_err(prm($what))?;
            v.set_qpn($self.wq.qpn).map_err(prm($what))?;
            v.set_opt_param_mask(0).map_err(prm($what))?;
            let mut $q = v.qpc_mut();
            $self.common_qpc(&mut $q).map_err(prm($what))?;
            (|| -> Result<(), rnic_mlx5_prm::Error> { $fill })().map_err(prm($what))?;
        }
        $self
            .hca
            .exec($op, 0, &buf, $Out::<&[u8]>::SIZE_BYTES)
            .map(|_| ())
    }};
}

impl Qp {
    /// CREATE_QP of `opts.qp_type` on `send_cq` (and `recv_cq`, or the same
    /// CQ when `None`), in RST.
    pub fn new(
        hca: &Arc<Hca>,
        send_cq: &mut Cq,
        mut recv_cq: Option<&mut Cq>,
        opts: QpOptions,
    ) -> Result<Qp, Mlx5Error> {
        let ud = match opts.qp_type {
            QpType::Rc => false,
            QpType::Ud => true,
            QpType::Uc => {
                return Err(Mlx5Error::QpOptions {
                    reason: "UC QPs are not supported by this driver; use RC".into(),
                });
            }
        };
        let bad = |reason: String| Mlx5Error::QpOptions { reason };
        if opts.max_send_sge as usize > MAX_SEND_SGE || opts.max_recv_sge as usize > MAX_RECV_SGE {
            return Err(bad(format!(
                "at most {MAX_SEND_SGE} send and {MAX_RECV_SGE} receive SGEs"
            )));
        }
        if opts.max_inline_data as usize > MAX_INLINE_DATA {
            return Err(bad(format!("at most {MAX_INLINE_DATA} inline bytes")));
        }
        let caps = hca.general_caps()?;
        let log_max_wq = caps.log_max_qp_sz();
        let log_max_msg = caps.log_max_msg();
        // K inc/qp.h:580-588, ib/qp.c:1310: a RoCE QP's timestamp format
        // follows the RoCE cap's `qp_ts_format` when RoCE is on, else the
        // general `sq_ts_format`; nonzero → DEFAULT, else FREE_RUNNING
        // (audit row 20).
        let ts_cap = match hca.roce_caps() {
            Some(r) if caps.roce() != 0 => r.qp_ts_format(),
            _ => caps.sq_ts_format(),
        };
        let ts_format = if ts_cap != 0 {
            TS_FORMAT_DEFAULT
        } else {
            TS_FORMAT_FREE_RUNNING
        };
        // Largest WQE: ctrl + (UD: datagram) + (RC: raddr + atomic) + data.
        let data = (opts.max_send_sge as usize * 16)
            .max((4 + opts.max_inline_data as usize).div_ceil(16) * 16);
        let wqe_bytes = 16 + if ud { DATAGRAM_SEG_BYTES } else { 32 } + data;
        let bbs_per = wqe_bytes.div_ceil(WQEBB_BYTES) as u32;
        let sq_wqebbs = (opts.max_send_wr.max(1) * bbs_per).next_power_of_two();
        let rq_entries = opts.max_recv_wr.max(1).next_power_of_two();
        let stride = (opts.max_recv_sge.max(1) as usize * 16).next_power_of_two();
        let rq_entries = rq_entries.max((64 / stride) as u32);
        if sq_wqebbs > 0x8000
            || ceil_log2(sq_wqebbs) > log_max_wq
            || ceil_log2(rq_entries) > log_max_wq
        {
            return Err(Mlx5Error::QueueSize {
                what: "QP",
                asked: opts.max_send_wr.max(opts.max_recv_wr),
                max: 1 << log_max_wq.min(15),
            });
        }
        // CQ credit (DESIGN: overflow impossible by construction): every WQE
        // the queues can hold must have a CQE slot.
        let same = recv_cq.is_none();
        let send_need = sq_wqebbs + if same { rq_entries } else { 0 };
        let send_free = send_cq.free_capacity();
        let recv_free = recv_cq.as_deref_mut().map(|c| c.free_capacity());
        if send_need > send_free || recv_free.is_some_and(|f| rq_entries > f) {
            return Err(Mlx5Error::QueueSize {
                what: "CQ for this QP (SQ WQEBBs + RQ WQEs it must be able to complete)",
                asked: send_need.max(rq_entries),
                max: send_free.min(recv_free.unwrap_or(u32::MAX)),
            });
        }
        let rq_bytes = rq_entries as usize * stride;
        let sq_bytes = sq_wqebbs as usize * WQEBB_BYTES;
        let wq_bytes = (rq_bytes + sq_bytes).div_ceil(4096) * 4096;
        let buf = hca.function().alloc_dma(wq_bytes + 64)?;
        let (sq_ring, dbrec) =
            crate::rdma::wq::views(&buf, rq_bytes / 8, sq_bytes / 8, wq_bytes / 8).ok_or_else(
                || bad("the SQ or doorbell record lies outside the QP buffer".into()),
            )?;
        let iova = buf.iova().get();
        let pages = wq_bytes / 4096;
        let send_core = send_cq.core().clone();
        let recv_core = match &recv_cq {
            Some(c) => c.core().clone(),
            None => send_core.clone(),
        };
        let info = hca.info();
        let mut cmd = vec![0u8; CreateQpIn::<&[u8]>::SIZE_BYTES + 8 * pages];
        {
            let mut v = CreateQpIn::new_checked(&mut cmd[..]).map_err(prm("CREATE_QP"))?;
            v.set_input_qpn(0).map_err(prm("CREATE_QP"))?;
            v.set_wq_umem_valid(0).map_err(prm("CREATE_QP"))?;
            for p in 0..pages {
                v.set_pas(p, iova + (p * 4096) as u64)
                    .map_err(prm("CREATE_QP pas"))?;
            }
            let mut q = v.qpc_mut();
            let st = if ud {
                QpServiceType::Ud
            } else {
                QpServiceType::Rc
            };
            (|| -> Result<(), rnic_mlx5_prm::Error> {
                q.set_st(st.as_raw().into())?;
                q.set_pm_state(QP_PM_STATE_MIGRATED)?;
                q.set_pd(info.pd)?;
                q.set_log_msg_max(log_max_msg)?;
                q.set_log_rq_size(ceil_log2(rq_entries))?;
                q.set_log_rq_stride(stride.trailing_zeros() - 4)?;
                q.set_log_sq_size(ceil_log2(sq_wqebbs))?;
                q.set_no_sq(0)?;
                q.set_ts_format(ts_format)?;
                q.set_uar_page(info.uar)?;
                q.set_log_page_size(0)?;
                q.set_page_offset(0)?;
                q.set_cqn_snd(send_core.cqn)?;
                q.set_cqn_rcv(recv_core.cqn)?;
                q.set_rq_type(RQ_TYPE_REGULAR)?;
                q.set_dbr_addr(iova + wq_bytes as u64)?;
                q.set_dbr_umem_valid(0)?;
                q.set_cs_req(0)?;
                q.set_cs_res(0)?;
                Ok(())
            })()
            .map_err(prm("CREATE_QP qpc"))?;
        }
        let out = hca.exec(
            CmdOpcode::CreateQp,
            0,
            &cmd,
            CreateQpOut::<&[u8]>::SIZE_BYTES,
        )?;
        let qpn = CreateQpOut::new_checked(&out[..])
            .map_err(prm("CREATE_QP"))?
            .qpn();
        let shared = Arc::new(QpShared {
            qpn,
            sq: SqTrack::new(sq_wqebbs),
            rq: RqTrack::new(rq_entries),
            flush: AtomicBool::new(false),
            gate: std::sync::atomic::AtomicU32::new(0),
            destroyed: AtomicBool::new(false),
        });
        hca.register_qp(shared.clone());
        match recv_cq {
            Some(r) => {
                send_cq.attach(shared.clone(), true, false);
                r.attach(shared.clone(), false, true);
            }
            None => send_cq.attach(shared.clone(), true, true),
        }
        // Audit rows 4, 5: BlueFlame copies only through a write-combining
        // mapping and only into a register no other QP writes (registers
        // 0..=2 of the UAR page, one per QP); every other QP rings 8-byte
        // doorbells — on the uncached mapping any register (qpn % 4), with
        // write-combining the shared register 3, which never takes a copy.
        let reg_size = hca.bf_reg_size();
        let uar_wc = hca.uar_wc();
        let (bf_index, exclusive) = match uar_wc.and_then(|_| hca.alloc_bf_reg()) {
            Some(i) => (i, Some(i)),
            None if uar_wc.is_some() => (crate::firmware::events::SHARED_BF_REG, None),
            None => ((qpn as usize) % rnic_mlx5_prm::UAR_NUM_BF_REGS, None),
        };
        let combine = exclusive.is_some();
        let uar = hca.function().uar(info.uar)?;
        let reg_at = UAR_BF_REG_0 + bf_index * reg_size;
        let reg = uar.window(reg_at, reg_size).map_err(Mlx5Error::Bar)?;
        let blocks = uar_wc
            .filter(|_| combine)
            .and_then(|w| w.window(reg_at, reg_size));
        debug!(
            qpn,
            sq_wqebbs, rq_entries, stride, bf_index, combine, "CREATE_QP"
        );
        let pair_window = if combine {
            blocks.clone()
        } else {
            BlockWindow::from_mmio(&reg)
        };
        let pair = pair_window.and_then(|b| BlockPair::new(b, reg_size / 2));
        let block_pair = pair.is_some();
        let sq = SqBlocks::new(sq_ring, &shared)
            .ok_or_else(|| bad("the SQ ring and its tracking differ in size".into()))?;
        Ok(Qp {
            hca: hca.clone(),
            qp_type: opts.qp_type,
            send_cq: send_core,
            recv_cq: recv_core,
            bf: BlueFlame {
                reg,
                fast: pair.unwrap_or_else(BlockPair::scratch),
                blocks,
                combine,
                offset: 0,
                half: reg_size / 2,
                exclusive,
            },
            port: 1,
            wq: WorkQueues {
                qpn,
                state: QpState::Rst,
                buf,
                shared,
                sq_word_base: rq_bytes / 8,
                sq_mask_words: sq_bytes / 8 - 1,
                sq_wqebbs,
                sq_extra: 0,
                block_pair,
                rq_entries,
                rq_stride_words: stride / 8,
                rq_mask_words: rq_bytes / 8 - 1,
                rq_head: 0,
                max_recv_sge: opts.max_recv_sge as usize,
                recv_terminator: crate::rdma::wqe::recv_terminator(hca.terminator_lkey()),
                dbrec_word: wq_bytes / 8,
                limits: SendLimits {
                    max_sge: opts.max_send_sge as usize,
                    max_inline: opts.max_inline_data as usize,
                    ud,
                },
                sig_all: opts.sq_sig_all,
                regions: Vec::new(),
                counters: QpCounters::default(),
                sq,
                dbrec,
                sq_limit: 0,
                write_ctrl: 0,
                write_ctrl1: 0,
                inline_src: crate::rdma::wq::InlineSource::empty(),
            },
        })
    }

    /// The QP number.
    pub fn qpn(&self) -> Qpn {
        Qpn::from_wire(self.wq.qpn)
    }

    /// The state the driver last moved the QP to (ERR once the device is fatal).
    pub fn state(&self) -> QpState {
        if self.hca.is_fatal() || self.wq.shared.flush.load(Ordering::Acquire) {
            QpState::Err
        } else {
            self.wq.state
        }
    }

    /// What the QP counted. The send and BlueFlame counts are derived: the
    /// send count from the producer (`WorkQueues::sends`), and the queues
    /// keep BlueFlame rings minus sends (wrapping), so a one-WQEBB post
    /// rung as one BlueFlame copy — the fast paths' only kind — counts
    /// nothing at all; [`Qp::ring`] subtracts the sends of any other ring.
    pub fn counters(&self) -> QpCounters {
        let mut c = self.wq.counters;
        c.sends = self.wq.sends();
        // Rings the general path did not count: the fast paths', one per
        // send — BlueFlame copies on a write-combining register of the
        // QP's own, 8-byte doorbells otherwise.
        let fast = c.blueflame.wrapping_add(c.sends);
        if self.bf.combine {
            c.blueflame = fast;
        } else {
            c.blueflame = 0;
            c.doorbells = c.doorbells.wrapping_add(fast);
        }
        c
    }

    /// Whether this QP rings BlueFlame copies (a write-combining mapping
    /// and a register of its own) rather than 8-byte doorbells.
    pub fn blueflame(&self) -> bool {
        self.bf.combine
    }

    /// Outstanding (posted, not yet completed) SQ WQEBBs and RQ WQEs.
    pub fn outstanding(&self) -> (u32, u32) {
        (
            self.wq.shared.sq.outstanding(),
            self.wq.shared.rq.outstanding(),
        )
    }

    /// SQ size in WQEBBs, RQ size in WQEs.
    pub fn sizes(&self) -> (u32, u32) {
        (self.wq.sq_wqebbs, self.wq.rq_entries)
    }

    /// The doorbell record (receive counter, send counter) as stored now.
    pub fn doorbell_record(&self) -> [u8; 8] {
        self.wq
            .buf
            .words()
            .get(self.wq.dbrec_word)
            .map_or([0; 8], |w| w.load(Ordering::Acquire).to_ne_bytes())
    }

    /// Let inline sends read from `mkey`'s region (and keep it alive as
    /// long as the QP).
    pub fn use_region(&mut self, mkey: &Mkey) {
        self.wq.regions.push(Region {
            lkey: mkey.lkey().get(),
            start: mkey.addr(),
            len: mkey.len() as u64,
            bytes: mkey.region_bytes(),
        });
    }

    fn common_qpc(&self, q: &mut Qpc<&mut [u8]>) -> Result<(), rnic_mlx5_prm::Error> {
        let st = if self.wq.limits.ud {
            QpServiceType::Ud
        } else {
            QpServiceType::Rc
        };
        q.set_st(st.as_raw().into())?;
        q.set_pm_state(QP_PM_STATE_MIGRATED)?;
        q.set_pd(self.hca.info().pd)?;
        q.set_cqn_snd(self.send_cq.cqn)?;
        q.set_cqn_rcv(self.recv_cq.cqn)?;
        if self.wq.limits.ud {
            // K ib/qp.c:4396-4398 sets these on every modify of a UD QP: a
            // UD message is one packet of at most 4096 bytes (audit row 6).
            q.set_mtu(UD_MTU_4096)?;
            q.set_log_msg_max(UD_LOG_MSG_MAX)?;
        }
        q.primary_address_path_mut()
            .set_vhca_port_num(self.port.into())
    }

    /// RST → INIT (§7.4): remote access rights, port, P_Key index; Q_Key on UD.
    pub fn init(&mut self, p: &InitParams) -> Result<(), Mlx5Error> {
        self.port = p.port_num.max(1);
        let ud = self.wq.limits.ud;
        let access = p.access;
        // `atomic_mode` and `rae` only with the atomic capability (K
        // ib/qp.c:2113-2143; audit row 61): a function without atomics
        // refuses the modify, so the request is refused here with the fix.
        let has_atomic = self.hca.general_caps()?.atomic() != 0;
        if !ud && access.contains(AccessFlags::REMOTE_ATOMIC) && !has_atomic {
            return Err(Mlx5Error::QpOptions {
                reason: "this function has no atomic capability (general cap atomic = 0): \
                         drop REMOTE_ATOMIC from the QP's access flags"
                    .into(),
            });
        }
        let dbr = self.wq.buf.iova().get() + (self.wq.dbrec_word * 8) as u64;
        modify_qp!(
            self,
            Rst2initQpIn,
            Rst2initQpOut,
            CmdOpcode::Rst2InitQp,
            "RST2INIT_QP",
            |q| {
                q.set_dbr_addr(dbr)?;
                q.primary_address_path_mut()
                    .set_pkey_index(p.pkey_index.into())?;
                if ud {
                    q.set_q_key(p.qkey)?;
                } else {
                    q.set_rre(access.contains(AccessFlags::REMOTE_READ) as u32)?;
                    q.set_rwe(access.contains(AccessFlags::REMOTE_WRITE) as u32)?;
                    let atomic = access.contains(AccessFlags::REMOTE_ATOMIC) && has_atomic;
                    q.set_rae(atomic as u32)?;
                    if atomic {
                        q.set_atomic_mode(ATOMIC_MODE_IB_COMP)?;
                    }
                }
                Ok(())
            }
        )?;
        self.wq.set_state(QpState::Init);
        Ok(())
    }

    /// INIT → RTR: for RC the RoCEv2 path to `dgid` (GID table index
    /// `p.sgid_index` as source), MTU, destination QPN, receive PSN.
    pub fn ready_to_receive(
        &mut self,
        dest_qpn: Qpn,
        rq_psn: Psn,
        dgid: Gid,
        p: &RtrParams,
    ) -> Result<(), Mlx5Error> {
        let ud = self.wq.limits.ud;
        // The peer's MAC, never the function's own as a silent fallback
        // (audit row 7; `crate::firmware::neigh`). UD QPs have no path.
        let dmac = if ud {
            [0; 6]
        } else {
            self.hca.resolve_neighbour(&dgid, p.dmac)?
        };
        let sport = p
            .udp_sport
            .unwrap_or_else(|| default_udp_sport(self.wq.qpn, dest_qpn.get()));
        let caps = self.hca.general_caps()?;
        let log_msg_max = caps.log_max_msg();
        // The path MTU fits the port's (a larger one is capped, as the
        // port's active MTU caps it for verbs users).
        let path_mtu = if ud {
            p.path_mtu
        } else {
            p.path_mtu.min(path_mtu_for(self.hca.vport_mtu()?))
        };
        let eth_prio = self.hca.vlan().map_or(0, |(_, pcp)| u32::from(pcp));
        // Clamped to what the function can hold (K ib/qp.c:4443; audit
        // row 63): asking for more is refused by the firmware.
        let log_rra_cap = caps.log_max_ra_res_qp();
        modify_qp!(
            self,
            Init2rtrQpIn,
            Init2rtrQpOut,
            CmdOpcode::Init2RtrQp,
            "INIT2RTR_QP",
            |q| {
                if ud {
                    return Ok(());
                }
                q.set_mtu(path_mtu.to_enum().into())?;
                q.set_log_msg_max(log_msg_max)?;
                q.set_remote_qpn(dest_qpn.get())?;
                q.set_next_rcv_psn(rq_psn.get())?;
                q.set_min_rnr_nak(u32::from(p.min_rnr_timer & 0x1f))?;
                q.set_log_rra_max(ceil_log2(p.max_dest_rd_atomic.into()).min(log_rra_cap))?;
                let mut a = q.primary_address_path_mut();
                a.set_src_addr_index(p.sgid_index.into())?;
                a.set_rgid_rip(dgid.raw())?;
                a.set_rmac_47_32(u32::from(u16::from_be_bytes([dmac[0], dmac[1]])))?;
                a.set_rmac_31_0(u32::from_be_bytes([dmac[2], dmac[3], dmac[4], dmac[5]]))?;
                a.set_hop_limit(if p.hop_limit < 2 {
                    64
                } else {
                    p.hop_limit.into()
                })?;
                a.set_tclass(p.traffic_class.into())?;
                a.set_dscp(u32::from(p.traffic_class >> 2))?;
                a.set_udp_sport(sport.into())?;
                a.set_eth_prio(eth_prio)?;
                Ok(())
            }
        )?;
        self.wq.set_state(QpState::Rtr);
        Ok(())
    }

    /// RTR → RTS: send PSN, retries, timeout, outstanding reads/atomics.
    pub fn ready_to_send(&mut self, sq_psn: Psn, p: &RtsParams) -> Result<(), Mlx5Error> {
        let ud = self.wq.limits.ud;
        let log_sra_cap = self.hca.general_caps()?.log_max_ra_req_qp();
        modify_qp!(
            self,
            Rtr2rtsQpIn,
            Rtr2rtsQpOut,
            CmdOpcode::Rtr2RtsQp,
            "RTR2RTS_QP",
            |q| {
                q.set_next_send_psn(sq_psn.get())?;
                if ud {
                    return Ok(());
                }
                q.set_retry_count((p.retry_cnt & 7).into())?;
                q.set_rnr_retry((p.rnr_retry & 7).into())?;
                q.set_log_sra_max(ceil_log2(p.max_rd_atomic.into()).min(log_sra_cap))?;
                q.set_log_ack_req_freq(LOG_ACK_REQ_FREQ_DEFAULT)?;
                q.primary_address_path_mut()
                    .set_ack_timeout((p.timeout & 0x1f).into())?;
                Ok(())
            }
        )?;
        self.wq.set_state(QpState::Rts);
        Ok(())
    }

    /// RST → INIT → RTR → RTS in one call (RC: to the peer `dest_qpn` at
    /// `dgid`; UD: `dest_qpn`/`dgid` unused).
    #[allow(clippy::too_many_arguments)]
    pub fn connect(
        &mut self,
        init: &InitParams,
        dest_qpn: Qpn,
        dgid: Gid,
        rq_psn: Psn,
        sq_psn: Psn,
        rtr: &RtrParams,
        rts: &RtsParams,
    ) -> Result<(), Mlx5Error> {
        self.init(init)?;
        self.ready_to_receive(dest_qpn, rq_psn, dgid, rtr)?;
        self.ready_to_send(sq_psn, rts)
    }

    /// Any state → ERR (2ERR_QP): outstanding work completes flushed.
    pub fn to_error(&mut self) -> Result<(), Mlx5Error> {
        let mut buf = vec![0u8; Qp2errIn::<&[u8]>::SIZE_BYTES];
        Qp2errIn::new_checked(&mut buf[..])
            .and_then(|mut v| v.set_qpn(self.wq.qpn))
            .map_err(prm("2ERR_QP"))?;
        self.hca
            .exec(CmdOpcode::Qp2Err, 0, &buf, Qp2errOut::<&[u8]>::SIZE_BYTES)?;
        self.wq.set_state(QpState::Err);
        Ok(())
    }

    /// Any state → RST (2RST_QP); the driver's rings restart at 0.
    pub fn to_reset(&mut self) -> Result<(), Mlx5Error> {
        let mut buf = vec![0u8; Qp2rstIn::<&[u8]>::SIZE_BYTES];
        Qp2rstIn::new_checked(&mut buf[..])
            .and_then(|mut v| v.set_qpn(self.wq.qpn))
            .map_err(prm("2RST_QP"))?;
        self.hca
            .exec(CmdOpcode::Qp2Rst, 0, &buf, Qp2rstOut::<&[u8]>::SIZE_BYTES)?;
        self.wq.set_state(QpState::Rst);
        self.wq.restart_sq();
        self.wq.rq_head = 0;
        for t in [&self.wq.shared.rq.head, &self.wq.shared.rq.tail] {
            t.store(0, Ordering::Release);
        }
        self.wq.store_dbrec();
        Ok(())
    }

    /// The destination MAC the firmware holds for an RC QP's path
    /// (QUERY_QP `primary_address_path.rmac`).
    pub fn query_rmac(&self) -> Result<[u8; 6], Mlx5Error> {
        let out = self.query()?;
        let v = QueryQpOut::new_checked(&out[..]).map_err(prm("QUERY_QP"))?;
        let q = v.qpc();
        let a = q.primary_address_path();
        let hi = (a.rmac_47_32() as u16).to_be_bytes();
        let lo = a.rmac_31_0().to_be_bytes();
        Ok([hi[0], hi[1], lo[0], lo[1], lo[2], lo[3]])
    }

    fn query(&self) -> Result<Vec<u8>, Mlx5Error> {
        let mut buf = vec![0u8; QueryQpIn::<&[u8]>::SIZE_BYTES];
        QueryQpIn::new_checked(&mut buf[..])
            .and_then(|mut v| v.set_qpn(self.wq.qpn))
            .map_err(prm("QUERY_QP"))?;
        self.hca
            .exec(CmdOpcode::QueryQp, 0, &buf, QueryQpOut::<&[u8]>::SIZE_BYTES)
    }

    /// The firmware's view of the state (QUERY_QP).
    pub fn query_state(&self) -> Result<QpState, Mlx5Error> {
        let out = self.query()?;
        let v = QueryQpOut::new_checked(&out[..]).map_err(prm("QUERY_QP"))?;
        Ok(QpState::from_raw(v.qpc().state() as u8))
    }

    /// Post a batch of sends: one doorbell for the batch. On a failure the
    /// requests before it are posted (and rung) and the error names the
    /// failing one.
    #[inline(always)]
    pub fn post_send<D: UdSegment>(&mut self, wrs: &[SendWr<'_, D>]) -> Result<(), Mlx5Error> {
        // The commonest request first, with the fewest tests (a single
        // small inline WRITE, one word of payload, the block pair present:
        // `WorkQueues::post_small_write`), rung from the words it built;
        // everything else out of line.
        if let [wr] = wrs
            && self.try_post_small_write(wr)
        {
            return Ok(());
        }
        self.post_send_rest(wrs)
    }

    /// [`Qp::post_send`]'s shortcut alone: a single small inline WRITE
    /// (`WorkQueues::post_small_write`) built, committed and rung, `true`;
    /// `false`, nothing written, for any other request, which
    /// [`Qp::post_send`] then posts or refuses with its reason.
    #[inline(always)]
    pub fn try_post_small_write<D: UdSegment>(&mut self, wr: &SendWr<'_, D>) -> bool {
        let Some(wqe) = self.wq.post_small_write(wr) else {
            return false;
        };
        // `post_small_write` passes only with the gate open, which
        // `block_pair` keeps closed unless `fast` is the register's.
        self.bf.ring_fast(&wqe);
        true
    }

    /// [`Qp::post_send`] past its first shortcut: the single-WRITE
    /// shortcut's other cases (`WorkQueues::post_fast_write`), then the
    /// general writer.
    #[inline(never)]
    fn post_send_rest<D: UdSegment>(&mut self, wrs: &[SendWr<'_, D>]) -> Result<(), Mlx5Error> {
        // A fatal function has set this QP's flush flag (`Hca::register_qp`),
        // which the queues check: no second load through the `Hca`.
        let fatal = false;
        if let [wr] = wrs
            && let Some(wqe) = self.wq.post_fast_write(wr, fatal)
        {
            self.ring_wqebb(&wqe);
            return Ok(());
        }
        let sends = self.wq.sends();
        let (ring, result) = self.wq.post_send_general(wrs, fatal);
        if let Some(ring) = ring {
            self.ring(&ring, self.wq.sends().wrapping_sub(sends));
        }
        result
    }

    /// The UAR write of step 5 (§8): a BlueFlame copy of a single WQE of ≤
    /// 256 bytes in 64-byte units then [`wc_flush`], else the 8-byte
    /// control word; then the other half of the register next time.
    /// `posted` is the number of sends this ring hands over (the BlueFlame
    /// count is kept as rings minus sends: [`Qp::counters`]).
    #[inline(always)]
    fn ring(&mut self, ring: &SendDoorbell, posted: u64) {
        self.wq.counters.blueflame = self.wq.counters.blueflame.wrapping_sub(posted);
        let off = self.bf.offset(self.wq.block_pair);
        if ring.blueflame() && self.bf.combine {
            for bb in 0..ring.wqebbs {
                // A WQEBB is one block of the ring (masked: a WQE that
                // wraps continues at block 0).
                let src = self
                    .wq
                    .sq
                    .ring()
                    .block(ring.wqebb.wrapping_add(bb) as usize);
                let mut block = [0u64; 8];
                for (d, w) in block.iter_mut().zip(src) {
                    *d = w.load(Ordering::Relaxed);
                }
                self.bf.write_block(off + bb as usize * 64, &block);
            }
            wc_flush();
            self.wq.counters.blueflame = self.wq.counters.blueflame.wrapping_add(1);
        } else {
            self.doorbell(off, ring.ctrl);
        }
        self.bf.advance(self.wq.block_pair);
    }

    /// The 8-byte doorbell: the first word of the last WQE's control segment.
    #[inline(always)]
    fn doorbell(&mut self, off: usize, ctrl: u64) {
        let _ = self
            .bf
            .reg
            .write64(off, u64::from_le_bytes(ctrl.to_ne_bytes()));
        self.wq.counters.doorbells += 1;
    }

    /// The direct fast path (mlx5dv-class): post one RDMA WRITE of `N` ≤
    /// [`FAST_INLINE_MAX`](crate::rdma::wq::FAST_INLINE_MAX) (28) inline bytes to `remote_addr` under `rkey`,
    /// completion requested iff `signaled` (or the QP signals all). The WQE
    /// is built whole from its constant parts (opcode, QPN, `ds` computed
    /// from `N` at compile time) and the few that change, stored as one
    /// WQEBB, tracked, recorded behind the named barriers and rung as one
    /// 64-byte BlueFlame copy (an 8-byte doorbell when the QP shares its
    /// BlueFlame register). The same bytes as [`Qp::post_send`] with the
    /// equivalent [`SendWr`] (`RdmaWrite`, `INLINE`), and the same checks
    /// (state, device health, inline limit, queue space): an error posts
    /// nothing. The error is a [`Refused`] (small, in registers, so that
    /// refusing costs the hot path no stack frame); `?` into
    /// [`Mlx5Error`] gives the general path's [`Mlx5Error::PostSend`].
    #[inline]
    pub fn post_write_inline<const N: usize>(
        &mut self,
        wr_id: u64,
        remote_addr: u64,
        rkey: Rkey,
        data: &[u8; N],
        signaled: bool,
    ) -> Result<(), Refused> {
        // As `post_send`: the fatal state arrives through the flush flag.
        // Every check as one test; whatever fails it (a refusal, the
        // producer at its cached limit, no block pair) goes out of line,
        // where the checked post runs in full.
        if let Some(head) = self.wq.fast_head(N) {
            let wqe = self
                .wq
                .write_inline_at(head, wr_id, remote_addr, rkey.get(), data, signaled);
            // The gate is closed unless `fast` is the register's own pair
            // (`WorkQueues::block_pair`).
            self.bf.ring_fast(&wqe);
            return Ok(());
        }
        self.post_write_inline_cold(wr_id, remote_addr, rkey, data, signaled)
    }

    /// [`Qp::post_write_inline`] when its one test fails: the checked post
    /// (each refusal its typed error, nothing written), then the UAR write.
    /// The arguments in the registers they came in and the result in
    /// registers: the hot path's call of it is a tail call.
    #[cold]
    #[inline(never)]
    fn post_write_inline_cold<const N: usize>(
        &mut self,
        wr_id: u64,
        remote_addr: u64,
        rkey: Rkey,
        data: &[u8; N],
        signaled: bool,
    ) -> Result<(), Refused> {
        let wqe =
            self.wq
                .post_write_inline(wr_id, remote_addr, rkey.get(), data, signaled, false)?;
        self.ring_wqebb(&Wqebb::from_words(wqe));
        Ok(())
    }

    /// The UAR write for a one-WQEBB WQE whose words are at hand: one
    /// BlueFlame block through the pair, else [`Qp::ring_unit`].
    #[inline(always)]
    fn ring_wqebb(&mut self, wqe: &Wqebb) {
        if self.wq.block_pair {
            self.bf.ring_fast(wqe);
        } else {
            self.ring_unit();
        }
    }

    /// [`Qp::ring_wqebb`] without a block pair: step 5 for the one-WQEBB
    /// WQE just posted (at `sq_head − 1`), read back from the ring — the
    /// checked BlueFlame copy, or the 8-byte doorbell on a shared register.
    /// Out of line and reading the ring, so the hot path keeps the words in
    /// registers.
    #[cold]
    #[inline(never)]
    fn ring_unit(&mut self) {
        let wqebb = self.wq.sq_head().wrapping_sub(1);
        let ctrl = self.wq.sq_word(wqebb, 0);
        self.ring(
            &SendDoorbell {
                ctrl,
                wqebb,
                wqebbs: 1,
                single: true,
            },
            1,
        );
    }

    /// Post a batch of receives (RQ WQEs, then the record's receive counter).
    #[inline]
    pub fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> Result<(), Mlx5Error> {
        let fatal = self.hca.is_fatal();
        self.wq.post_recv(wrs, fatal)
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        self.wq.shared.destroyed.store(true, Ordering::Release);
        if let Some(i) = self.bf.exclusive {
            self.hca.free_bf_reg(i);
        }
        if self.hca.is_fatal() {
            return;
        }
        let mut buf = vec![0u8; DestroyQpIn::<&[u8]>::SIZE_BYTES];
        let r = DestroyQpIn::new_checked(&mut buf[..])
            .and_then(|mut v| v.set_qpn(self.wq.qpn))
            .map_err(prm("DESTROY_QP"))
            .and_then(|_| {
                self.hca.exec(
                    CmdOpcode::DestroyQp,
                    0,
                    &buf,
                    DestroyQpOut::<&[u8]>::SIZE_BYTES,
                )
            });
        match r {
            Ok(_) => debug!(qpn = self.wq.qpn, "DESTROY_QP"),
            Err(e) => warn!(qpn = self.wq.qpn, %e, "DESTROY_QP failed"),
        }
    }
}

/// An IP address as the GID the port's table holds (IPv4-mapped for IPv4).
pub fn gid_of(ip: IpAddr) -> Gid {
    Gid::from_ip(ip)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn udp_sport_is_in_the_rocev2_dynamic_range() {
        for (a, b) in [(1, 2), (0x12, 0x34), (0xff_ffff, 0)] {
            let p = default_udp_sport(a, b);
            assert!(p >= 0xc000, "{p:#x}");
        }
        assert_ne!(default_udp_sport(1, 2), default_udp_sport(2, 1));
    }

    #[test]
    fn ceil_log2_values() {
        assert_eq!(ceil_log2(0), 0);
        assert_eq!(ceil_log2(1), 0);
        assert_eq!(ceil_log2(2), 1);
        assert_eq!(ceil_log2(3), 2);
        assert_eq!(ceil_log2(16), 4);
    }
}
