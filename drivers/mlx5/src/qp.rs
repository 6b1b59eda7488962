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
    AccessFlags, Gid, InitParams, Memory, Psn, QpType, Qpn, RecvWr, RtrParams, RtsParams, SendOp,
    SendWr,
};
use rnic_dma::Mmio;
use rnic_dma::barrier::{dma_wmb_before_doorbell, wc_flush};
use rnic_mlx5_prm::{
    ATOMIC_MODE_IB_COMP, BLUEFLAME_MAX_BYTES, CmdOpcode, CreateQpIn, CreateQpOut, DestroyQpIn,
    DestroyQpOut, Init2rtrQpIn, Init2rtrQpOut, LOG_ACK_REQ_FREQ_DEFAULT, QP_PM_STATE_MIGRATED,
    Qp2errIn, Qp2errOut, Qp2rstIn, Qp2rstOut, QpServiceType, QpState, Qpc, QueryQpIn, QueryQpOut,
    RQ_TYPE_REGULAR, Rst2initQpIn, Rst2initQpOut, Rtr2rtsQpIn, Rtr2rtsQpOut, TS_FORMAT_DEFAULT,
    TS_FORMAT_FREE_RUNNING, UAR_BF_REG_0, WQEBB_BYTES, qp_doorbell_record,
};
use tracing::{debug, warn};

use crate::cq::{Cq, CqCore};
use crate::track::{QpShared, RqTrack, SqTrack, sq_meta, wc_opcode_code};
use crate::wqe::{
    DATAGRAM_SEG_BYTES, MAX_INLINE_DATA, MAX_RECV_SGE, MAX_SEND_SGE, PostFailure, RECV_TERMINATOR,
    RingWriter, SendLimits, atomic_words, be_pair, ctrl_words, data_words, datagram_seg, fm_ce_se,
    inline_header, plan, push_sges, raddr_words,
};
use crate::{DmaBuffer, Hca, Mkey, Mlx5Error};

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

/// What a QP counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpCounters {
    /// Send WQEs posted.
    pub sends: u64,
    /// Receive WQEs posted.
    pub recvs: u64,
    /// Doorbells rung with a BlueFlame copy.
    pub blueflame: u64,
    /// Doorbells rung with the 8-byte control word.
    pub doorbells: u64,
}

struct Region {
    lkey: u32,
    start: u64,
    len: u64,
    buf: Arc<DmaBuffer>,
}

struct BlueFlame {
    reg: Mmio,
    offset: usize,
    half: usize,
    exclusive: Option<usize>,
}

/// A queue pair. `post_send` / `post_recv` take `&mut self`: one poster.
/// Dropping it destroys the firmware QP, then releases its CQs.
pub struct Qp {
    hca: Arc<Hca>,
    qpn: u32,
    qp_type: QpType,
    state: QpState,
    buf: Arc<DmaBuffer>,
    shared: Arc<QpShared>,
    send_cq: Arc<CqCore>,
    recv_cq: Arc<CqCore>,
    sq_word_base: usize,
    sq_mask_words: usize,
    sq_wqebbs: u32,
    sq_head: u32,
    rq_entries: u32,
    rq_stride_words: usize,
    rq_mask_words: usize,
    rq_head: u32,
    max_recv_sge: usize,
    dbrec_word: usize,
    limits: SendLimits,
    sig_all: bool,
    bf: BlueFlame,
    regions: Vec<Region>,
    mac: [u8; 6],
    port: u8,
    counters: QpCounters,
}

impl fmt::Debug for Qp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Qp")
            .field("qpn", &self.qpn)
            .field("type", &self.qp_type)
            .field("state", &self.state)
            .field("counters", &self.counters)
            .finish_non_exhaustive()
    }
}

fn prm(what: &'static str) -> impl Fn(rnic_mlx5_prm::Error) -> Mlx5Error {
    move |source| Mlx5Error::Prm { what, source }
}

fn ceil_log2(v: u32) -> u32 {
    v.max(1).next_power_of_two().trailing_zeros()
}

/// The destination MAC: given, else the EUI-64 inverse of a link-local GID,
/// else `own` (no ARP on a VFIO function, §12: the emulator and loopback
/// peers ignore it).
pub fn resolve_dmac(gid: &Gid, given: Option<[u8; 6]>, own: [u8; 6]) -> [u8; 6] {
    if let Some(m) = given {
        return m;
    }
    let g = gid.raw();
    if g[0] == 0xfe && g[1] == 0x80 && g[11] == 0xff && g[12] == 0xfe {
        return [g[8] ^ 2, g[9], g[10], g[13], g[14], g[15]];
    }
    own
}

/// The RoCEv2 UDP source port when none is given: 0xC000 | a hash of the
/// two QPNs (rxe's range), so flows of different QP pairs spread.
pub fn default_udp_sport(local: u32, remote: u32) -> u16 {
    let h = local.wrapping_mul(0x9e37_79b9) ^ remote;
    0xc000 | ((h ^ (h >> 14)) & 0x3fff) as u16
}

macro_rules! modify_qp {
    ($self:ident, $In:ident, $Out:ident, $op:expr, $what:literal, |$q:ident| $fill:block) => {{
        let mut buf = vec![0u8; $In::<&[u8]>::SIZE_BYTES];
        {
            let mut v = $In::new_checked(&mut buf[..]).map_err(prm($what))?;
            v.set_qpn($self.qpn).map_err(prm($what))?;
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
        recv_cq: Option<&mut Cq>,
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
        let ts_format = if caps.sq_ts_format() != 0 {
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
        let rq_bytes = rq_entries as usize * stride;
        let sq_bytes = sq_wqebbs as usize * WQEBB_BYTES;
        let wq_bytes = (rq_bytes + sq_bytes).div_ceil(4096) * 4096;
        let buf = hca.function().alloc_dma(wq_bytes + 64)?;
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
            destroyed: AtomicBool::new(false),
        });
        match recv_cq {
            Some(r) => {
                send_cq.attach(shared.clone(), true, false);
                r.attach(shared.clone(), false, true);
            }
            None => send_cq.attach(shared.clone(), true, true),
        }
        let (bf_index, exclusive) = match hca.alloc_bf_reg() {
            Some(i) => (i, Some(i)),
            None => ((qpn as usize) % rnic_mlx5_prm::UAR_NUM_BF_REGS, None),
        };
        let reg_size = hca.bf_reg_size();
        let uar = hca.function().uar(info.uar)?;
        let reg = uar
            .window(UAR_BF_REG_0 + bf_index * reg_size, reg_size)
            .map_err(Mlx5Error::Bar)?;
        debug!(qpn, sq_wqebbs, rq_entries, stride, bf_index, "CREATE_QP");
        Ok(Qp {
            hca: hca.clone(),
            qpn,
            qp_type: opts.qp_type,
            state: QpState::Rst,
            buf,
            shared,
            send_cq: send_core,
            recv_cq: recv_core,
            sq_word_base: rq_bytes / 8,
            sq_mask_words: sq_bytes / 8 - 1,
            sq_wqebbs,
            sq_head: 0,
            rq_entries,
            rq_stride_words: stride / 8,
            rq_mask_words: rq_bytes / 8 - 1,
            rq_head: 0,
            max_recv_sge: opts.max_recv_sge as usize,
            dbrec_word: wq_bytes / 8,
            limits: SendLimits {
                max_sge: opts.max_send_sge as usize,
                max_inline: opts.max_inline_data as usize,
                ud,
            },
            sig_all: opts.sq_sig_all,
            bf: BlueFlame {
                reg,
                offset: 0,
                half: reg_size / 2,
                exclusive,
            },
            regions: Vec::new(),
            mac: hca.mac().unwrap_or([0; 6]),
            port: 1,
            counters: QpCounters::default(),
        })
    }

    /// The QP number.
    pub fn qpn(&self) -> Qpn {
        Qpn::from_wire(self.qpn)
    }

    /// The state the driver last moved the QP to (ERR once the device is fatal).
    pub fn state(&self) -> QpState {
        if self.hca.is_fatal() || self.shared.flush.load(Ordering::Acquire) {
            QpState::Err
        } else {
            self.state
        }
    }

    /// What the QP counted.
    pub fn counters(&self) -> QpCounters {
        self.counters
    }

    /// Outstanding (posted, not yet completed) SQ WQEBBs and RQ WQEs.
    pub fn outstanding(&self) -> (u32, u32) {
        (self.shared.sq.outstanding(), self.shared.rq.outstanding())
    }

    /// SQ size in WQEBBs, RQ size in WQEs.
    pub fn sizes(&self) -> (u32, u32) {
        (self.sq_wqebbs, self.rq_entries)
    }

    /// The doorbell record (receive counter, send counter) as stored now.
    pub fn doorbell_record(&self) -> [u8; 8] {
        self.buf
            .words()
            .get(self.dbrec_word)
            .map_or([0; 8], |w| w.load(Ordering::Acquire).to_ne_bytes())
    }

    /// Let inline sends read from `mkey`'s region (and keep it alive as
    /// long as the QP).
    pub fn use_region(&mut self, mkey: &Mkey) {
        self.regions.push(Region {
            lkey: mkey.lkey().get(),
            start: mkey.addr(),
            len: mkey.len() as u64,
            buf: mkey.buffer().clone(),
        });
    }

    fn common_qpc(&self, q: &mut Qpc<&mut [u8]>) -> Result<(), rnic_mlx5_prm::Error> {
        let st = if self.limits.ud {
            QpServiceType::Ud
        } else {
            QpServiceType::Rc
        };
        q.set_st(st.as_raw().into())?;
        q.set_pm_state(QP_PM_STATE_MIGRATED)?;
        q.set_pd(self.hca.info().pd)?;
        q.set_cqn_snd(self.send_cq.cqn)?;
        q.set_cqn_rcv(self.recv_cq.cqn)?;
        q.primary_address_path_mut()
            .set_vhca_port_num(self.port.into())
    }

    /// RST → INIT (§7.4): remote access rights, port, P_Key index; Q_Key on UD.
    pub fn init(&mut self, p: &InitParams) -> Result<(), Mlx5Error> {
        self.port = p.port_num.max(1);
        let ud = self.limits.ud;
        let access = p.access;
        let dbr = self.buf.iova().get() + (self.dbrec_word * 8) as u64;
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
                    let atomic = access.contains(AccessFlags::REMOTE_ATOMIC);
                    q.set_rae(atomic as u32)?;
                    if atomic {
                        q.set_atomic_mode(ATOMIC_MODE_IB_COMP)?;
                    }
                }
                Ok(())
            }
        )?;
        self.state = QpState::Init;
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
        let ud = self.limits.ud;
        let dmac = resolve_dmac(&dgid, p.dmac, self.mac);
        let sport = p
            .udp_sport
            .unwrap_or_else(|| default_udp_sport(self.qpn, dest_qpn.get()));
        let log_msg_max = self.hca.general_caps()?.log_max_msg();
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
                q.set_mtu(p.path_mtu.to_enum().into())?;
                q.set_log_msg_max(log_msg_max)?;
                q.set_remote_qpn(dest_qpn.get())?;
                q.set_next_rcv_psn(rq_psn.get())?;
                q.set_min_rnr_nak(u32::from(p.min_rnr_timer & 0x1f))?;
                q.set_log_rra_max(ceil_log2(p.max_dest_rd_atomic.into()))?;
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
                Ok(())
            }
        )?;
        self.state = QpState::Rtr;
        Ok(())
    }

    /// RTR → RTS: send PSN, retries, timeout, outstanding reads/atomics.
    pub fn ready_to_send(&mut self, sq_psn: Psn, p: &RtsParams) -> Result<(), Mlx5Error> {
        let ud = self.limits.ud;
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
                q.set_log_sra_max(ceil_log2(p.max_rd_atomic.into()))?;
                q.set_log_ack_req_freq(LOG_ACK_REQ_FREQ_DEFAULT)?;
                q.primary_address_path_mut()
                    .set_ack_timeout((p.timeout & 0x1f).into())?;
                Ok(())
            }
        )?;
        self.state = QpState::Rts;
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
            .and_then(|mut v| v.set_qpn(self.qpn))
            .map_err(prm("2ERR_QP"))?;
        self.hca
            .exec(CmdOpcode::Qp2Err, 0, &buf, Qp2errOut::<&[u8]>::SIZE_BYTES)?;
        self.state = QpState::Err;
        Ok(())
    }

    /// Any state → RST (2RST_QP); the driver's rings restart at 0.
    pub fn to_reset(&mut self) -> Result<(), Mlx5Error> {
        let mut buf = vec![0u8; Qp2rstIn::<&[u8]>::SIZE_BYTES];
        Qp2rstIn::new_checked(&mut buf[..])
            .and_then(|mut v| v.set_qpn(self.qpn))
            .map_err(prm("2RST_QP"))?;
        self.hca
            .exec(CmdOpcode::Qp2Rst, 0, &buf, Qp2rstOut::<&[u8]>::SIZE_BYTES)?;
        self.state = QpState::Rst;
        self.sq_head = 0;
        self.rq_head = 0;
        for t in [
            &self.shared.sq.head,
            &self.shared.sq.tail,
            &self.shared.rq.head,
            &self.shared.rq.tail,
        ] {
            t.store(0, Ordering::Release);
        }
        self.store_dbrec();
        Ok(())
    }

    /// The firmware's view of the state (QUERY_QP).
    pub fn query_state(&self) -> Result<QpState, Mlx5Error> {
        let mut buf = vec![0u8; QueryQpIn::<&[u8]>::SIZE_BYTES];
        QueryQpIn::new_checked(&mut buf[..])
            .and_then(|mut v| v.set_qpn(self.qpn))
            .map_err(prm("QUERY_QP"))?;
        let out = self
            .hca
            .exec(CmdOpcode::QueryQp, 0, &buf, QueryQpOut::<&[u8]>::SIZE_BYTES)?;
        let v = QueryQpOut::new_checked(&out[..]).map_err(prm("QUERY_QP"))?;
        Ok(QpState::from_raw(v.qpc().state() as u8))
    }

    #[inline(always)]
    fn store_dbrec(&self) {
        let recv = qp_doorbell_record::recv_counter.insert(0, self.rq_head & 0xffff);
        let send = qp_doorbell_record::send_counter.insert(0, self.sq_head & 0xffff);
        if let Some(w) = self.buf.words().get(self.dbrec_word) {
            w.store(be_pair(recv, send), Ordering::Relaxed);
        }
    }

    fn gather_inline(
        &self,
        wr: &SendWr<'_>,
        len: usize,
        w: &mut RingWriter<'_>,
    ) -> Result<(), PostFailure> {
        let mut data = [0u8; 4 + MAX_INLINE_DATA];
        data[..4].copy_from_slice(&inline_header(len as u32).to_be_bytes());
        let mut at = 4;
        for s in wr.sg_list.iter().filter(|s| s.length > 0) {
            let n = s.length as usize;
            let miss = PostFailure::InlineRegion {
                addr: s.addr,
                len: s.length,
                lkey: s.lkey.get(),
            };
            let r = self
                .regions
                .iter()
                .find(|r| {
                    r.lkey == s.lkey.get()
                        && s.addr >= r.start
                        && s.addr
                            .checked_add(n as u64)
                            .is_some_and(|e| e <= r.start + r.len)
                })
                .ok_or(miss)?;
            let dst = data.get_mut(at..at + n).ok_or(miss)?;
            r.buf
                .read((s.addr - r.start) as usize, dst)
                .map_err(|_| miss)?;
            at += n;
        }
        w.bytes(&data[..(4 + len).div_ceil(16) * 16]);
        Ok(())
    }

    /// Post a batch of sends: one doorbell for the batch. On a failure the
    /// requests before it are posted (and rung) and the error names the
    /// failing one.
    pub fn post_send(&mut self, wrs: &[SendWr<'_>]) -> Result<(), Mlx5Error> {
        let start = self.sq_head;
        let mut last_ctrl = 0u64;
        let mut bf_words = [0u64; 32];
        let mut bf_len = 0usize;
        let mut failed = None;
        for (index, wr) in wrs.iter().enumerate() {
            match self.write_send(wr, &mut last_ctrl, &mut bf_words, &mut bf_len) {
                Ok(()) => {}
                Err(reason) => {
                    failed = Some(Mlx5Error::PostSend { index, reason });
                    break;
                }
            }
        }
        let posted = self.sq_head.wrapping_sub(start);
        if posted > 0 {
            let single = failed.is_none() && wrs.len() == 1 && bf_len * 8 <= BLUEFLAME_MAX_BYTES;
            self.ring_send(last_ctrl, single.then_some(&bf_words[..bf_len]));
        }
        failed.map_or(Ok(()), Err)
    }

    #[inline(always)]
    fn write_send(
        &mut self,
        wr: &SendWr<'_>,
        last_ctrl: &mut u64,
        bf_words: &mut [u64; 32],
        bf_len: &mut usize,
    ) -> Result<(), PostFailure> {
        if self.hca.is_fatal() || self.shared.flush.load(Ordering::Relaxed) {
            return Err(PostFailure::DeviceFatal);
        }
        if self.state != QpState::Rts {
            return Err(PostFailure::BadState {
                state: self.state.name().unwrap_or("?"),
            });
        }
        let p = plan(wr, &self.limits)?;
        let tail = self.shared.sq.tail.load(Ordering::Acquire);
        let used = self.sq_head.wrapping_sub(tail);
        if used + p.wqebbs > self.sq_wqebbs {
            return Err(PostFailure::QueueFull { outstanding: used });
        }
        let head = self.sq_head;
        let words = self.buf.words();
        let mut w = RingWriter::new(
            words,
            self.sq_word_base,
            self.sq_mask_words,
            head as usize * 8,
        )
        .ok_or(PostFailure::QueueFull { outstanding: used })?;
        let ctrl = ctrl_words(
            p.opcode,
            head as u16,
            self.qpn,
            p.ds,
            fm_ce_se(wr.flags, self.sig_all),
            p.imm,
        );
        w.seg(ctrl);
        if self.limits.ud {
            let dest = wr.ud.as_ref().ok_or(PostFailure::NoUdDest)?;
            let dmac = resolve_dmac(&dest.av.dgid, dest.av.dmac, self.mac);
            let sport = dest
                .av
                .udp_sport
                .unwrap_or_else(|| default_udp_sport(self.qpn, dest.remote_qpn.get()));
            let seg = datagram_seg(dest, dmac, sport).map_err(|_| PostFailure::NoUdDest)?;
            w.bytes(&seg);
        }
        if let Some((raddr, rkey)) = wr.op.remote() {
            w.seg(raddr_words(raddr, rkey.get()));
        }
        match wr.op {
            SendOp::AtomicCmpSwap { compare, swap, .. } => w.seg(atomic_words(swap, compare)),
            SendOp::AtomicFetchAdd { add, .. } => w.seg(atomic_words(add, 0)),
            _ => {}
        }
        if p.inline {
            if p.inline_len > 0 {
                self.gather_inline(wr, p.inline_len, &mut w)?;
            }
        } else {
            push_sges(&mut w, wr.sg_list);
        }
        *last_ctrl = ctrl[0];
        *bf_len = w.len.min(32);
        bf_words[..*bf_len].copy_from_slice(&w.head[..*bf_len]);
        let idx = (head & self.shared.sq.mask) as usize;
        if let (Some(id), Some(m)) = (self.shared.sq.wrid.get(idx), self.shared.sq.meta.get(idx)) {
            id.store(wr.wr_id, Ordering::Relaxed);
            m.store(
                sq_meta(head as u16, p.wqebbs, wc_opcode_code(p.wc_opcode)),
                Ordering::Relaxed,
            );
        }
        self.sq_head = head.wrapping_add(p.wqebbs);
        self.counters.sends += 1;
        Ok(())
    }

    #[inline(always)]
    fn ring_send(&mut self, last_ctrl: u64, bf: Option<&[u64]>) {
        self.shared.sq.head.store(self.sq_head, Ordering::Release);
        // WQEs before the doorbell record.
        dma_wmb_before_doorbell();
        self.store_dbrec();
        // The record before the UAR write that makes the device read it.
        dma_wmb_before_doorbell();
        let off = self.bf.offset;
        match bf {
            Some(words) if self.bf.exclusive.is_some() => {
                // 64-byte units (§8): pad the last one with zeros.
                let units = words.len().div_ceil(8) * 8;
                for i in 0..units {
                    let w = words.get(i).copied().unwrap_or(0);
                    let _ = self
                        .bf
                        .reg
                        .write64(off + i * 8, u64::from_le_bytes(w.to_ne_bytes()));
                }
                wc_flush();
                self.counters.blueflame += 1;
            }
            _ => {
                let _ = self
                    .bf
                    .reg
                    .write64(off, u64::from_le_bytes(last_ctrl.to_ne_bytes()));
                self.counters.doorbells += 1;
            }
        }
        self.bf.offset ^= self.bf.half;
    }

    /// Post a batch of receives (RQ WQEs, then the record's receive counter).
    pub fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> Result<(), Mlx5Error> {
        let start = self.rq_head;
        let mut failed = None;
        for (index, wr) in wrs.iter().enumerate() {
            if let Err(reason) = self.write_recv(wr) {
                failed = Some(Mlx5Error::PostRecv { index, reason });
                break;
            }
        }
        if self.rq_head != start {
            self.shared.rq.head.store(self.rq_head, Ordering::Release);
            // RQ WQEs before the record that hands them to the device.
            dma_wmb_before_doorbell();
            self.store_dbrec();
        }
        failed.map_or(Ok(()), Err)
    }

    #[inline(always)]
    fn write_recv(&mut self, wr: &RecvWr<'_>) -> Result<(), PostFailure> {
        if self.hca.is_fatal() || self.shared.flush.load(Ordering::Relaxed) {
            return Err(PostFailure::DeviceFatal);
        }
        if self.state == QpState::Rst {
            return Err(PostFailure::BadState { state: "RST" });
        }
        if wr.sg_list.len() > self.max_recv_sge {
            return Err(PostFailure::TooManySge {
                got: wr.sg_list.len(),
                max: self.max_recv_sge,
            });
        }
        let tail = self.shared.rq.tail.load(Ordering::Acquire);
        let used = self.rq_head.wrapping_sub(tail);
        if used >= self.rq_entries {
            return Err(PostFailure::QueueFull { outstanding: used });
        }
        let slot = (self.rq_head & (self.rq_entries - 1)) as usize * self.rq_stride_words;
        let mut w = RingWriter::new(self.buf.words(), 0, self.rq_mask_words, slot)
            .ok_or(PostFailure::QueueFull { outstanding: used })?;
        let mut n = 0;
        for s in wr.sg_list {
            w.seg(data_words(s.length, s.lkey.get(), s.addr));
            n += 1;
        }
        if n * 2 < self.rq_stride_words {
            w.seg(RECV_TERMINATOR);
        }
        let idx = (self.rq_head & self.shared.rq.mask) as usize;
        if let Some(id) = self.shared.rq.wrid.get(idx) {
            id.store(wr.wr_id, Ordering::Relaxed);
        }
        self.rq_head = self.rq_head.wrapping_add(1);
        self.counters.recvs += 1;
        Ok(())
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        self.shared.destroyed.store(true, Ordering::Release);
        if let Some(i) = self.bf.exclusive {
            self.hca.free_bf_reg(i);
        }
        if self.hca.is_fatal() {
            return;
        }
        let mut buf = vec![0u8; DestroyQpIn::<&[u8]>::SIZE_BYTES];
        let r = DestroyQpIn::new_checked(&mut buf[..])
            .and_then(|mut v| v.set_qpn(self.qpn))
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
            Ok(_) => debug!(qpn = self.qpn, "DESTROY_QP"),
            Err(e) => warn!(qpn = self.qpn, %e, "DESTROY_QP failed"),
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
    fn dmac_resolution() {
        let own = [2, 0, 0x15, 0xb3, 0x10, 0x17];
        let mac = [0x02, 0x11, 0x22, 0x33, 0x44, 0x55];
        let ll = Gid::link_local_from_mac(mac);
        assert_eq!(resolve_dmac(&ll, None, own), mac);
        let v4 = Gid::from_ipv4(std::net::Ipv4Addr::new(127, 0, 0, 2));
        assert_eq!(resolve_dmac(&v4, None, own), own);
        assert_eq!(resolve_dmac(&v4, Some(mac), own), mac);
    }

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
