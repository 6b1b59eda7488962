//! The port's raw Ethernet queues, on the objects real firmware offers for
//! non-RoCE traffic (mlx5.md §5.1; K en_main.c builds the same chain for a
//! netdev): a transport domain, a TIS and an SQ on it to send frames, an RQ
//! and a direct TIR over it to receive the frames a flow table rule
//! (`super::steer`) sends there, one CQ for both.
//!
//! Frames are small (ARP, neighbour discovery: at most ~90 bytes), so a
//! send WQE carries the whole frame inline in its Ethernet segment
//! (`inline_hdr.sz` = the frame's length: the control segment, the Ethernet
//! segment with the frame's first two bytes, the rest in the following
//! 16-byte units) — more than any `min_wqe_inline_mode` asks — and no data
//! segment. Every send asks for a CQE; the SQ is free again when its CQE
//! comes. Receive WQEs are one data segment each, each over its own 2 KiB
//! slot of one registered buffer, written once: reposting a slot is moving
//! the RQ's doorbell counter on.

use std::sync::Arc;

use rnic_core::{AccessFlags, Memory};
use rnic_dma::Mmio;
use rnic_dma::barrier::dma_wmb_before_doorbell;
use rnic_mlx5_prm::{
    AllocTransportDomainOut, CmdOpcode, CompletionMode, CreateRqIn, CreateRqOut, CreateSqIn,
    CreateSqOut, CreateTirIn, CreateTirOut, CreateTisIn, CreateTisOut, DeallocTransportDomainIn,
    DestroyRqIn, DestroySqIn, DestroyTirIn, DestroyTisIn, ModifyRqIn, ModifySqIn, QueryHcaCapOut,
    UAR_BF_REG_0, WQEBB_BYTES, WqState, WqeEthSeg, WqeOpcode, cap_inline_mode, cap_type,
    inline_mode, tir_disp_type, tir_self_lb_block, wq_type, wqe_ctrl_seg, wqe_data_seg,
};
use tracing::{debug, warn};

use crate::firmware::resources::Mkey;
use crate::rdma::cq::Cq;
use crate::{DmaBuffer, Hca, Mlx5Error};

/// Entries of the RQ (frames the port can hold before the worker takes
/// them).
pub const RX_ENTRIES: u32 = 64;
/// The least bytes of one receive slot. A slot holds a whole frame of the
/// port's MTU ([`rx_slot`]): a longer one would be a local length error
/// that stops the RQ, as on a ConnectX, where mlx5e sizes its receive
/// buffers from the MTU for the same reason (the port drops frames over
/// its MTU before any RQ sees them).
pub const RX_SLOT: usize = 2048;

/// The receive slot for a port MTU of `mtu` bytes: the frame with its
/// Ethernet header, a VLAN tag and the FCS, in whole cache lines.
pub fn rx_slot(mtu: u32) -> usize {
    let frame = mtu as usize + 14 + 4 + 4;
    frame.div_ceil(64).max(RX_SLOT / 64) * 64
}
/// WQEBBs of the SQ.
pub const TX_WQEBBS: u32 = 64;
/// The largest frame a send carries (inline, in at most 4 WQEBBs: 256 -
/// 16 control - 14 of the Ethernet segment before `inline_hdr.start`).
pub const TX_MAX_FRAME: usize = 4 * WQEBB_BYTES - 16 - 14;
/// A frame shorter than this is padded (the Ethernet minimum without FCS).
const MIN_FRAME: usize = 60;

fn prm(what: &'static str) -> impl Fn(rnic_mlx5_prm::Error) -> Mlx5Error {
    move |source| Mlx5Error::Prm { what, source }
}

fn memory(what: &'static str) -> impl Fn(rnic_core::MemoryError) -> Mlx5Error {
    move |source| Mlx5Error::DmaAccess { what, source }
}

/// Why a frame was not sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxRefused {
    /// The SQ is full (its CQEs have not come back yet).
    Full,
    /// Longer than [`TX_MAX_FRAME`].
    TooLong,
    /// The device wrote an error CQE for this SQ: it is in ERR.
    Broken,
}

/// What one CQE of the port's CQ was.
#[derive(Debug, PartialEq, Eq)]
pub enum Completion {
    /// A frame arrived: its bytes.
    Received(Vec<u8>),
    /// A frame longer than the receive slot arrived: dropped.
    Oversized(u32),
    /// A send completed.
    Sent,
    /// An error CQE (opcode, syndrome): the queue it names went to ERR and
    /// was brought back (ERR → RST → RDY, as mlx5e's recovery does), or
    /// could not be.
    Error {
        /// The CQE opcode (REQ_ERR / RESP_ERR).
        opcode: u8,
        /// The CQE syndrome.
        syndrome: u8,
        /// Whether the queue is ready again.
        recovered: bool,
    },
    /// A CQE this port never asked for (counted, ignored).
    Unexpected(u8),
}

/// The raw Ethernet queues; destroyed in reverse order on drop.
pub struct EthQueues {
    hca: Arc<Hca>,
    td: u32,
    tis: u32,
    rqn: u32,
    sqn: u32,
    tirn: u32,
    cq: Cq,
    /// RQ ring (page 0), SQ ring (page 1), doorbell records (page 2:
    /// receive counter at 0, send counter at 4).
    rings: Arc<DmaBuffer>,
    rx: Mkey,
    /// The UAR register the SQ's 8-byte doorbells go to.
    reg: Mmio,
    reg_off: usize,
    /// Send producer (WQEBBs) and consumer; receive producer.
    sq_pc: u32,
    sq_cc: u32,
    /// WQEBBs of the WQE at each SQ index (masked).
    sq_sizes: [u8; TX_WQEBBS as usize],
    rq_pc: u32,
    /// Bytes of one receive slot ([`rx_slot`] of the MTU at creation).
    slot: usize,
    /// Queues an error CQE put in ERR and [`EthQueues::next_completion`]
    /// brought back.
    recoveries: u64,
    broken: bool,
}

impl std::fmt::Debug for EthQueues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EthQueues")
            .field("sqn", &self.sqn)
            .field("rqn", &self.rqn)
            .field("tirn", &self.tirn)
            .finish_non_exhaustive()
    }
}

const RQ_RING: usize = 0;
const SQ_RING: usize = 4096;
/// The RQ's doorbell record: its receive counter at offset 0.
const DBREC: usize = 8192;
/// The SQ's doorbell record, a cache line of its own (8-byte aligned, as the
/// PRM requires of `dbr_addr`): its send counter in the second word
/// (MLX5_SND_DBR), as for a QP.
const SQ_DBREC: usize = DBREC + 64;

impl EthQueues {
    /// Create the chain TD → TIS → CQ → RQ (ready, every slot posted) →
    /// TIR, and SQ (ready). Refused with the firmware's status where the
    /// function has no raw Ethernet (no `eth_net_offloads`, …).
    pub fn new(hca: &Arc<Hca>) -> Result<EthQueues, Mlx5Error> {
        let caps = hca.general_caps()?;
        if caps.eth_net_offloads() == 0 {
            return Err(Mlx5Error::QpOptions {
                reason: format!(
                    "{}: the function has no raw Ethernet queues (cap eth_net_offloads is 0), \
                     so the port cannot answer or send ARP/ND; use static neighbours \
                     (`neigh=static&nbr=<ip>/<mac>` in the device spec)",
                    hca.info().function
                ),
            });
        }
        let page = hca.query_cap(cap_type::ETHERNET_OFFLOADS, true)?;
        let inline = match QueryHcaCapOut::new_checked(&page[..]).map(|o| inline_cap(&o)) {
            Ok(c) if c == cap_inline_mode::NOT_REQUIRED => inline_mode::NONE,
            _ => inline_mode::L2,
        };
        let info = hca.info();
        let out = hca.exec(
            CmdOpcode::AllocTransportDomain,
            0,
            &[0u8; 16],
            AllocTransportDomainOut::<&[u8]>::SIZE_BYTES,
        )?;
        let td = AllocTransportDomainOut::new_checked(&out[..])
            .map_err(prm("ALLOC_TRANSPORT_DOMAIN"))?
            .transport_domain();
        let mut q = Partial {
            hca: Some(hca.clone()),
            td: Some(td),
            ..Partial::default()
        };
        let mut cmd = vec![0u8; CreateTisIn::<&[u8]>::SIZE_BYTES];
        CreateTisIn::new_checked(&mut cmd[..])
            .and_then(|mut v| v.ctx_mut().set_transport_domain(td))
            .map_err(prm("CREATE_TIS"))?;
        let out = hca.exec(
            CmdOpcode::CreateTis,
            0,
            &cmd,
            CreateTisOut::<&[u8]>::SIZE_BYTES,
        )?;
        let tis = CreateTisOut::new_checked(&out[..])
            .map_err(prm("CREATE_TIS"))?
            .tisn();
        q.tis = Some(tis);
        let cq = Cq::new(hca, 2 * (RX_ENTRIES + TX_WQEBBS))?;
        let rings = hca.function().alloc_dma(DBREC + 4096)?;
        let slot = rx_slot(hca.vport_mtu()?);
        let rx_buf = hca.function().alloc_dma(RX_ENTRIES as usize * slot)?;
        let rx = Mkey::new(hca, rx_buf, AccessFlags::LOCAL_WRITE)?;
        // Every receive WQE once: slot i over bytes [i * slot, +slot).
        for i in 0..RX_ENTRIES as usize {
            let mut seg = [0u8; 16];
            put(&mut seg, &wqe_data_seg::byte_count, slot as u32);
            put(&mut seg, &wqe_data_seg::lkey, rx.lkey().0);
            seg[8..16].copy_from_slice(&(rx.addr() + (i * slot) as u64).to_be_bytes());
            rings
                .write(RQ_RING + i * 16, &seg)
                .map_err(memory("RQ WQE"))?;
        }
        let base = rings.iova().get();
        let rqn = create_wq(hca, true, &cq, base, inline, 0)?;
        q.rqn = Some(rqn);
        modify_wq(hca, true, rqn, WqState::Rst, WqState::Rdy)?;
        let mut cmd = vec![0u8; CreateTirIn::<&[u8]>::SIZE_BYTES];
        CreateTirIn::new_checked(&mut cmd[..])
            .and_then(|mut v| {
                let mut t = v.ctx_mut();
                t.set_disp_type(tir_disp_type::DIRECT)?;
                t.set_inline_rqn(rqn)?;
                // The port's own broadcasts and multicasts (ARP requests,
                // NS, announcements) are not received back, as mlx5e asks.
                t.set_self_lb_block(tir_self_lb_block::UNICAST | tir_self_lb_block::MULTICAST)?;
                t.set_transport_domain(td)
            })
            .map_err(prm("CREATE_TIR"))?;
        let out = hca.exec(
            CmdOpcode::CreateTir,
            0,
            &cmd,
            CreateTirOut::<&[u8]>::SIZE_BYTES,
        )?;
        let tirn = CreateTirOut::new_checked(&out[..])
            .map_err(prm("CREATE_TIR"))?
            .tirn();
        q.tir = Some(tirn);
        let sqn = create_wq(hca, false, &cq, base, inline, tis)?;
        q.sqn = Some(sqn);
        modify_wq(hca, false, sqn, WqState::Rst, WqState::Rdy)?;
        // 8-byte doorbells on the register no QP copies BlueFlame into.
        let reg_size = hca.bf_reg_size();
        let reg_off = UAR_BF_REG_0 + crate::firmware::events::SHARED_BF_REG * reg_size;
        let reg = hca
            .function()
            .uar(info.uar)?
            .window(reg_off, reg_size)
            .map_err(Mlx5Error::Bar)?;
        q.disarm();
        let mut queues = EthQueues {
            hca: hca.clone(),
            td,
            tis,
            rqn,
            sqn,
            tirn,
            cq,
            rings,
            rx,
            reg,
            reg_off: 0,
            sq_pc: 0,
            sq_cc: 0,
            sq_sizes: [0; TX_WQEBBS as usize],
            rq_pc: 0,
            slot,
            recoveries: 0,
            broken: false,
        };
        queues.post_receives(RX_ENTRIES)?;
        debug!(td, tis, rqn, tirn, sqn, "raw Ethernet queues ready");
        Ok(queues)
    }

    /// The TIR a flow table rule sends frames to.
    pub fn tirn(&self) -> u32 {
        self.tirn
    }

    /// The SQ's number.
    pub fn sqn(&self) -> u32 {
        self.sqn
    }

    /// The CQ both queues complete into (the port's worker arms and waits
    /// on it).
    pub fn cq(&mut self) -> &mut Cq {
        &mut self.cq
    }

    /// Whether an error CQE put a queue in ERR.
    pub fn broken(&self) -> bool {
        self.broken
    }

    /// Bring the RQ (`rq`) or the SQ back from ERR: RST (the device forgets
    /// its counters), RDY, every receive slot posted again or the send ring
    /// empty. Frames the SQ held are lost; the engine's retries cover them.
    fn recover(&mut self, rq: bool) -> Result<(), Mlx5Error> {
        let n = if rq { self.rqn } else { self.sqn };
        modify_wq(&self.hca, rq, n, WqState::Err, WqState::Rst)?;
        if rq {
            self.rq_pc = 0;
            self.rings
                .write(DBREC, &0u32.to_be_bytes())
                .map_err(memory("RQ doorbell record"))?;
        } else {
            self.sq_pc = 0;
            self.sq_cc = 0;
            self.rings
                .write(SQ_DBREC + 4, &0u32.to_be_bytes())
                .map_err(memory("SQ doorbell record"))?;
        }
        modify_wq(&self.hca, rq, n, WqState::Rst, WqState::Rdy)?;
        if rq {
            self.post_receives(RX_ENTRIES)?;
        }
        self.recoveries += 1;
        Ok(())
    }

    /// Queues brought back from ERR so far.
    pub fn recoveries(&self) -> u64 {
        self.recoveries
    }

    /// Hand `n` more receive slots to the device (their WQEs are written
    /// once, in [`EthQueues::new`]).
    fn post_receives(&mut self, n: u32) -> Result<(), Mlx5Error> {
        self.rq_pc = self.rq_pc.wrapping_add(n);
        // The WQEs (and, on a repost, the reads of the slot) before the
        // counter that hands them over.
        dma_wmb_before_doorbell();
        self.rings
            .write(DBREC, &(self.rq_pc & 0xffff).to_be_bytes())
            .map_err(memory("RQ doorbell record"))
    }

    /// Send one frame (padded to 60 bytes), inline in the WQE.
    pub fn send(&mut self, frame: &[u8]) -> Result<(), TxRefused> {
        if self.broken {
            return Err(TxRefused::Broken);
        }
        if frame.len() > TX_MAX_FRAME {
            return Err(TxRefused::TooLong);
        }
        let mut padded = [0u8; TX_MAX_FRAME];
        padded[..frame.len()].copy_from_slice(frame);
        let len = frame.len().max(MIN_FRAME);
        let frame = &padded[..len];
        // Control (16) + Ethernet segment (16, the first 2 frame bytes in
        // it) + the other len - 2 bytes in 16-byte units.
        let bytes = 32 + (len - 2).div_ceil(16) * 16;
        let ds = (bytes / 16) as u32;
        let wqebbs = bytes.div_ceil(WQEBB_BYTES) as u32;
        if self.sq_pc.wrapping_sub(self.sq_cc) + wqebbs > TX_WQEBBS {
            return Err(TxRefused::Full);
        }
        let mut wqe = [0u8; 4 * WQEBB_BYTES];
        let index = self.sq_pc & 0xffff;
        put(
            &mut wqe,
            &wqe_ctrl_seg::opcode,
            u32::from(WqeOpcode::Send.as_raw()),
        );
        put(&mut wqe, &wqe_ctrl_seg::wqe_index, index);
        put(&mut wqe, &wqe_ctrl_seg::qpn, self.sqn);
        put(&mut wqe, &wqe_ctrl_seg::ds, ds);
        put(
            &mut wqe,
            &wqe_ctrl_seg::fm_ce_se,
            u32::from(CompletionMode::Always.as_raw()) << 2,
        );
        {
            let mut eth = WqeEthSeg::new_unchecked(&mut wqe[16..32]);
            let _ = eth.set_inline_hdr_sz(len as u32);
        }
        wqe[30..32].copy_from_slice(&frame[..2]);
        wqe[32..32 + len - 2].copy_from_slice(&frame[2..]);
        // Into the ring, WQEBB by WQEBB (a WQE may wrap to block 0).
        for bb in 0..wqebbs {
            let slot = (self.sq_pc.wrapping_add(bb) & (TX_WQEBBS - 1)) as usize;
            let chunk = &wqe[bb as usize * WQEBB_BYTES..(bb as usize + 1) * WQEBB_BYTES];
            if self
                .rings
                .write(SQ_RING + slot * WQEBB_BYTES, chunk)
                .is_err()
            {
                return Err(TxRefused::Broken);
            }
        }
        self.sq_sizes[(self.sq_pc & (TX_WQEBBS - 1)) as usize] = wqebbs as u8;
        self.sq_pc = self.sq_pc.wrapping_add(wqebbs);
        // WQE before the record, the record before the doorbell (§8).
        dma_wmb_before_doorbell();
        if self
            .rings
            .write(SQ_DBREC + 4, &(self.sq_pc & 0xffff).to_be_bytes())
            .is_err()
        {
            return Err(TxRefused::Broken);
        }
        dma_wmb_before_doorbell();
        let mut ctrl = [0u8; 8];
        ctrl.copy_from_slice(&wqe[..8]);
        // The shared register takes 8-byte doorbells only; the halves are
        // alternated as every doorbell of a BlueFlame register is.
        let _ = self.reg.write64(self.reg_off, u64::from_le_bytes(ctrl));
        rnic_dma::barrier::wc_flush();
        self.reg_off ^= self.reg.len() / 2;
        Ok(())
    }

    /// The next completion of the port's CQ, decoded; `None` when there is
    /// none. A received frame's slot is handed back to the device at once.
    pub fn next_completion(&mut self) -> Result<Option<Completion>, Mlx5Error> {
        use rnic_mlx5_prm::{Cqe64, CqeOpcode, ErrCqe};
        let Some(cqe) = self.cq.poll_raw() else {
            return Ok(None);
        };
        let v = Cqe64::new_unchecked(&cqe[..]);
        let op = v.opcode() as u8;
        let c = match CqeOpcode::from_raw(op) {
            CqeOpcode::Req => {
                let counter = v.wqe_counter();
                let size = self.sq_sizes[(counter & (TX_WQEBBS - 1)) as usize];
                // The CQE names the WQE it completes: everything up to and
                // including it is done (one CQE per WQE here).
                let done = counter.wrapping_add(u32::from(size.max(1)));
                if done.wrapping_sub(self.sq_cc) & 0xffff <= self.sq_pc.wrapping_sub(self.sq_cc) {
                    self.sq_cc = self
                        .sq_cc
                        .wrapping_add(done.wrapping_sub(self.sq_cc) & 0xffff);
                    Completion::Sent
                } else {
                    Completion::Unexpected(op)
                }
            }
            CqeOpcode::RespSend => {
                let slot = (v.wqe_counter() % RX_ENTRIES) as usize;
                let len = v.byte_cnt();
                let c = if len as usize > self.slot {
                    Completion::Oversized(len)
                } else {
                    let mut frame = vec![0u8; len as usize];
                    self.rx
                        .memory()
                        .read(slot * self.slot, &mut frame)
                        .map_err(memory("receive slot"))?;
                    Completion::Received(frame)
                };
                self.post_receives(1)?;
                c
            }
            CqeOpcode::ReqErr | CqeOpcode::RespErr => {
                let e = ErrCqe::new_unchecked(&cqe[..]);
                let rq = op == CqeOpcode::RespErr.as_raw();
                warn!(
                    opcode = op,
                    syndrome = e.syndrome(),
                    vendor = e.vendor_err_synd(),
                    qpn = e.qpn(),
                    "error CQE on the port's raw Ethernet {}: recovering it",
                    if rq { "RQ" } else { "SQ" }
                );
                let recovered = match self.recover(rq) {
                    Ok(()) => true,
                    Err(err) => {
                        self.broken = true;
                        warn!(error = %err, "the port's queue did not recover: ARP/ND stops");
                        false
                    }
                };
                Completion::Error {
                    opcode: op,
                    syndrome: e.syndrome() as u8,
                    recovered,
                }
            }
            _ => Completion::Unexpected(op),
        };
        Ok(Some(c))
    }
}

impl Drop for EthQueues {
    fn drop(&mut self) {
        Partial {
            hca: Some(self.hca.clone()),
            td: Some(self.td),
            tis: Some(self.tis),
            rqn: Some(self.rqn),
            tir: Some(self.tirn),
            sqn: Some(self.sqn),
        }
        .destroy();
    }
}

/// One destroy command of the teardown: the object (if made), the opcode,
/// and how its number goes into the command.
type TeardownStep<'a> = (
    Option<u32>,
    CmdOpcode,
    &'a dyn Fn(&mut [u8], u32) -> Result<(), rnic_mlx5_prm::Error>,
);

/// What [`EthQueues::new`] made so far: destroyed in reverse if a later
/// step fails.
#[derive(Default)]
struct Partial {
    hca: Option<Arc<Hca>>,
    td: Option<u32>,
    tis: Option<u32>,
    rqn: Option<u32>,
    tir: Option<u32>,
    sqn: Option<u32>,
}

impl Partial {
    /// Everything made: no longer this guard's to destroy.
    fn disarm(&mut self) {
        self.hca = None;
    }

    fn destroy(&mut self) {
        let Some(hca) = self.hca.take() else {
            return;
        };
        if hca.is_fatal() {
            return;
        }
        let steps: [TeardownStep<'_>; 5] = [
            (self.sqn, CmdOpcode::DestroySq, &|b, n| {
                DestroySqIn::new_checked(b)?.set_sqn(n)
            }),
            (self.tir, CmdOpcode::DestroyTir, &|b, n| {
                DestroyTirIn::new_checked(b)?.set_tirn(n)
            }),
            (self.rqn, CmdOpcode::DestroyRq, &|b, n| {
                DestroyRqIn::new_checked(b)?.set_rqn(n)
            }),
            (self.tis, CmdOpcode::DestroyTis, &|b, n| {
                DestroyTisIn::new_checked(b)?.set_tisn(n)
            }),
            (self.td, CmdOpcode::DeallocTransportDomain, &|b, n| {
                DeallocTransportDomainIn::new_checked(b)?.set_transport_domain(n)
            }),
        ];
        for (n, opcode, fill) in steps {
            let Some(n) = n else { continue };
            let mut cmd = [0u8; 16];
            if fill(&mut cmd, n).is_err() {
                continue;
            }
            if let Err(e) = hca.exec(opcode, 0, &cmd, 16) {
                warn!(%opcode, n, error = %e, "raw Ethernet teardown step failed");
            }
        }
    }
}

impl Drop for Partial {
    fn drop(&mut self) {
        self.destroy();
    }
}

/// Store `value` into `field` of `buf` (big-endian dword).
fn put(buf: &mut [u8], field: &rnic_mlx5_prm::FieldLayout, value: u32) {
    let at = field.dword_offset();
    let mut d = [0u8; 4];
    d.copy_from_slice(&buf[at..at + 4]);
    let word = field.insert(u32::from_be_bytes(d), value);
    buf[at..at + 4].copy_from_slice(&word.to_be_bytes());
}

/// CREATE_RQ (`rq`) or CREATE_SQ over the rings at `base` (one page each),
/// in RST: its number.
fn create_wq(
    hca: &Arc<Hca>,
    rq: bool,
    cq: &Cq,
    base: u64,
    inline: u32,
    tis: u32,
) -> Result<u32, Mlx5Error> {
    let info = hca.info();
    let (what, size, ring, log_stride, log_sz) = if rq {
        (
            "CREATE_RQ",
            CreateRqIn::<&[u8]>::SIZE_BYTES,
            RQ_RING,
            4,
            RX_ENTRIES.trailing_zeros(),
        )
    } else {
        (
            "CREATE_SQ",
            CreateSqIn::<&[u8]>::SIZE_BYTES,
            SQ_RING,
            6,
            TX_WQEBBS.trailing_zeros(),
        )
    };
    let mut cmd = vec![0u8; size + 8];
    let fill_wq = |w: &mut rnic_mlx5_prm::Wq<&mut [u8]>| -> Result<(), rnic_mlx5_prm::Error> {
        w.set_wq_type(wq_type::CYCLIC)?;
        w.set_pd(info.pd)?;
        w.set_uar_page(info.uar)?;
        w.set_dbr_addr(base + if rq { DBREC } else { SQ_DBREC } as u64)?;
        w.set_log_wq_stride(log_stride)?;
        w.set_log_wq_pg_sz(0)?;
        w.set_log_wq_sz(log_sz)?;
        w.set_pas(0, base + ring as u64)
    };
    let opcode = if rq {
        let mut v = CreateRqIn::new_checked(&mut cmd[..]).map_err(prm(what))?;
        let mut c = v.ctx_mut();
        (|| -> Result<(), rnic_mlx5_prm::Error> {
            c.set_vsd(1)?; // keep VLAN tags in the frame: the engine checks them
            c.set_mem_rq_type(rnic_mlx5_prm::RQ_MEM_TYPE_INLINE)?;
            c.set_state(WqState::Rst.as_raw().into())?;
            c.set_cqn(cq.cqn())?;
            fill_wq(&mut c.wq_mut())
        })()
        .map_err(prm(what))?;
        CmdOpcode::CreateRq
    } else {
        let mut v = CreateSqIn::new_checked(&mut cmd[..]).map_err(prm(what))?;
        let mut c = v.ctx_mut();
        (|| -> Result<(), rnic_mlx5_prm::Error> {
            c.set_min_wqe_inline_mode(inline)?;
            c.set_state(WqState::Rst.as_raw().into())?;
            c.set_cqn(cq.cqn())?;
            c.set_tis_lst_sz(1)?;
            c.set_tis_num_0(tis)?;
            fill_wq(&mut c.wq_mut())
        })()
        .map_err(prm(what))?;
        CmdOpcode::CreateSq
    };
    let out = hca.exec(opcode, 0, &cmd, 16)?;
    Ok(if rq {
        CreateRqOut::new_checked(&out[..]).map_err(prm(what))?.rqn()
    } else {
        CreateSqOut::new_checked(&out[..]).map_err(prm(what))?.sqn()
    })
}

/// MODIFY_RQ / MODIFY_SQ `n` from `from` to `to`.
fn modify_wq(
    hca: &Arc<Hca>,
    rq: bool,
    n: u32,
    from: WqState,
    to: WqState,
) -> Result<(), Mlx5Error> {
    let mut cmd = vec![0u8; ModifyRqIn::<&[u8]>::SIZE_BYTES];
    let opcode = if rq {
        let mut v = ModifyRqIn::new_checked(&mut cmd[..]).map_err(prm("MODIFY_RQ"))?;
        (|| -> Result<(), rnic_mlx5_prm::Error> {
            v.set_rq_state(from.as_raw().into())?;
            v.set_rqn(n)?;
            v.ctx_mut().set_state(to.as_raw().into())
        })()
        .map_err(prm("MODIFY_RQ"))?;
        CmdOpcode::ModifyRq
    } else {
        let mut v = ModifySqIn::new_checked(&mut cmd[..]).map_err(prm("MODIFY_SQ"))?;
        (|| -> Result<(), rnic_mlx5_prm::Error> {
            v.set_sq_state(from.as_raw().into())?;
            v.set_sqn(n)?;
            v.ctx_mut().set_state(to.as_raw().into())
        })()
        .map_err(prm("MODIFY_SQ"))?;
        CmdOpcode::ModifySq
    };
    hca.exec(opcode, 0, &cmd, 16).map(drop)
}

/// The Ethernet offload capabilities' `wqe_inline_mode`, when the function
/// has the page.
pub(crate) fn inline_cap(out: &QueryHcaCapOut<&[u8]>) -> u32 {
    out.per_protocol_networking_offload_caps().wqe_inline_mode()
}
