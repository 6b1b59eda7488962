//! Hostile-device rigs for the `mlx5_cqe` fuzz target (rnic-fuzz-harness):
//! the driver's CQ consumer and EQ consumer over plain DMA buffers, with no
//! device behind them — whoever holds a rig writes the CQE and EQE bytes
//! the device would write, in any order and with any content, and polls.
//!
//! [`CqRig`]: one RC QP's work queues (8-WQEBB SQ, 4-entry RQ) attached to
//! a CQ ring of `2^log` CQEs, and — [`CqRig::new`] — a second QP's
//! tracking on the same CQ (so the QPN lookup has a choice and every CQE
//! goes through the general decoder), or — [`CqRig::new_sole`] — no second
//! QP (the CQ's sole QP: its lean path, [`crate::Cq::poll_send`] and the
//! first CQE of [`crate::Cq::poll`], takes the requester successes naming
//! an outstanding WQE; [`OTHER_QPN`] names no QP). Posts go through the real
//! [`crate::rdma::wq`] writers (the single-WRITE shortcut and the general writer),
//! polls through the real [`crate::Cq::poll`] / [`crate::Cq::poll_send`]
//! decoders, flushes through the fatal-device path.
//!
//! [`EqRig`]: an EQ ring of `2^log` EQEs drained by the driver's EQ
//! consumer with one CQ registered for completion events.
//!
//! Not a stable API (`#[doc(hidden)]`): it exists so the fuzz harness
//! drives the same code the driver runs.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rnic_core::{Lkey, Memory, RecvWr, Rkey, SendFlags, SendWr, Sge, WorkCompletion};
use rnic_dma::{IovaAllocator, RecordingMapper};
use rnic_mlx5_prm::{CQE_BYTES, CQE_OP_OWN_INIT, EQE_BYTES, EQE_OWNER_INIT, QpState};

use crate::firmware::events::CqNotify;
use crate::firmware::events::{EqState, EventCounters, drain_ring};
use crate::function::memory::IovaSpace;
use crate::rdma::cq::{CqCounters, CqRing, SendCompletion, cq_buffer_bytes};
use crate::rdma::track::{QpShared, RqTrack, SqBlocks, SqTrack};
use crate::rdma::wq::QpCounters;
use crate::rdma::wq::{Region, RegionBytes, WorkQueues};
use crate::rdma::wqe::SendLimits;
use crate::{DmaBuffer, Mlx5Error};

/// QPN of the rig's QP with work queues.
pub const QPN: u32 = 0x2a;
/// QPN of the second QP attached to the rig's CQ (tracking only: it never
/// posts, so every CQE naming it must be refused); on a
/// [`CqRig::new_sole`] rig no QP has it.
pub const OTHER_QPN: u32 = 0x2b;
/// SQ WQEBBs of the rig's QP.
pub const SQ_WQEBBS: u32 = 8;
/// RQ entries of the rig's QP.
pub const RQ_ENTRIES: u32 = 4;
/// Bytes of the region inline sends read from.
pub const DATA_BYTES: usize = 4096;
const LKEY: u32 = 0x500;
const RQ_STRIDE: usize = 32;

fn space() -> Arc<IovaSpace> {
    IovaSpace::new(
        "fuzz".into(),
        Arc::new(RecordingMapper::new()),
        IovaAllocator::new(&[0x10_0000..=0xFFFF_FFFF]),
    )
}

/// A CQ ring, the QPs on it, and the buffers behind them; see the module
/// docs.
pub struct CqRig {
    wq: WorkQueues,
    /// The idle second QP ([`CqRig::new`]); `None` on a sole-QP rig.
    other: Option<Arc<QpShared>>,
    ring: CqRing,
    cq: Arc<DmaBuffer>,
    data: Arc<DmaBuffer>,
    log: u32,
}

impl std::fmt::Debug for CqRig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CqRig")
            .field("log", &self.log)
            .field("qps", &self.attached_qps())
            .field("ci", &self.ring.consumer_index())
            .finish_non_exhaustive()
    }
}

impl CqRig {
    /// A rig with a CQ of `2^log` CQEs (`log` clamped to 1..=8), every
    /// `op_own` = 0xF0, the QP in RTS, and the idle second QP
    /// ([`OTHER_QPN`]) attached after it.
    pub fn new(log: u32) -> Result<CqRig, Mlx5Error> {
        CqRig::build(log, true)
    }

    /// [`CqRig::new`] without the second QP: the QP is the CQ's sole QP.
    pub fn new_sole(log: u32) -> Result<CqRig, Mlx5Error> {
        CqRig::build(log, false)
    }

    fn build(log: u32, with_other: bool) -> Result<CqRig, Mlx5Error> {
        let log = log.clamp(1, 8);
        let s = space();
        let rq_bytes = RQ_ENTRIES as usize * RQ_STRIDE;
        let sq_bytes = SQ_WQEBBS as usize * 64;
        let wq_bytes = (rq_bytes + sq_bytes).div_ceil(4096) * 4096;
        let buf = s.alloc(wq_bytes + 64)?;
        let data = s.alloc(DATA_BYTES)?;
        let fill: Vec<u8> = (0..DATA_BYTES).map(|i| (i * 7 + 1) as u8).collect();
        data.write(0, &fill)
            .map_err(|source| Mlx5Error::DmaAccess {
                what: "fuzz data",
                source,
            })?;
        let shared = |qpn| {
            Arc::new(QpShared {
                qpn,
                sq: SqTrack::new(SQ_WQEBBS),
                rq: RqTrack::new(RQ_ENTRIES),
                flush: AtomicBool::new(false),
                gate: std::sync::atomic::AtomicU32::new(0),
                destroyed: AtomicBool::new(false),
            })
        };
        let mine = shared(QPN);
        let other = with_other.then(|| shared(OTHER_QPN));
        let (sq_ring, dbrec) =
            crate::rdma::wq::views(&buf, rq_bytes / 8, sq_bytes / 8, wq_bytes / 8).ok_or(
                Mlx5Error::QpOptions {
                    reason: "fuzz QP buffer too small".into(),
                },
            )?;
        let sq = SqBlocks::new(sq_ring, &mine).ok_or(Mlx5Error::QpOptions {
            reason: "fuzz QP ring and tracking differ in size".into(),
        })?;
        let mut wq = WorkQueues {
            qpn: QPN,
            state: QpState::Rts,
            buf,
            shared: mine.clone(),
            sq_word_base: rq_bytes / 8,
            sq_mask_words: sq_bytes / 8 - 1,
            sq_wqebbs: SQ_WQEBBS,
            sq_extra: 0,
            block_pair: true,
            rq_entries: RQ_ENTRIES,
            rq_stride_words: RQ_STRIDE / 8,
            rq_mask_words: rq_bytes / 8 - 1,
            rq_head: 0,
            max_recv_sge: 2,
            recv_terminator: crate::rdma::wqe::RECV_TERMINATOR,
            dbrec_word: wq_bytes / 8,
            limits: SendLimits {
                max_sge: 2,
                max_inline: 64,
                ud: false,
            },
            sig_all: false,
            regions: vec![Region {
                lkey: LKEY,
                start: data.as_ptr() as u64,
                len: DATA_BYTES as u64,
                bytes: RegionBytes::Buffer(data.clone()),
            }],
            counters: QpCounters::default(),
            sq,
            dbrec,
            sq_limit: 0,
            write_ctrl: 0,
            write_ctrl1: 0,
            inline_src: crate::rdma::wq::InlineSource::empty(),
        };
        wq.set_state(QpState::Rts);
        let n = 1usize << log;
        let cq = s.alloc(cq_buffer_bytes(n as u32))?;
        for i in 0..n {
            cq.write(i * CQE_BYTES + 63, &[CQE_OP_OWN_INIT])
                .map_err(|source| Mlx5Error::DmaAccess {
                    what: "fuzz CQ init",
                    source,
                })?;
        }
        let mut ring = CqRing::new(cq.clone(), log).ok_or(Mlx5Error::QpOptions {
            reason: "fuzz CQ buffer too small".into(),
        })?;
        ring.attach(mine, true, true);
        if let Some(other) = &other {
            ring.attach(other.clone(), true, true);
        }
        Ok(CqRig {
            wq,
            other,
            ring,
            cq,
            data,
            log,
        })
    }

    /// CQEs in the ring.
    pub fn entries(&self) -> u32 {
        1 << self.log
    }

    /// QPs attached to the CQ: 2 ([`CqRig::new`]) or 1 ([`CqRig::new_sole`]).
    pub fn attached_qps(&self) -> u32 {
        1 + u32::from(self.other.is_some())
    }

    /// One send: an RDMA WRITE of `len` bytes from the region at byte
    /// `offset` (inline when `inline`), signaled or not. The WQE index it
    /// got and its size in WQEBBs, or the refusal.
    pub fn post_write(
        &mut self,
        wr_id: u64,
        offset: u32,
        len: u32,
        inline: bool,
        signaled: bool,
    ) -> Result<(u16, u32), Mlx5Error> {
        let sge = [Sge::new(
            self.data.as_ptr() as u64 + u64::from(offset),
            len,
            Lkey(LKEY),
        )];
        let mut wr = SendWr::rdma_write(wr_id, &sge, 0x7000_0000, Rkey(0x99));
        if inline {
            wr.flags |= SendFlags::INLINE;
        }
        if signaled {
            wr.flags |= SendFlags::SIGNALED;
        }
        let head = self.wq.sq_head();
        let (_, r) = self.wq.post_send(&[wr], self.fatal());
        r?;
        Ok((head as u16, self.wq.sq_head().wrapping_sub(head)))
    }

    /// The direct fast path's post ([`crate::Qp::post_write_inline`]'s
    /// ring half) of 8 bytes; the WQE index.
    pub fn post_write_inline(&mut self, wr_id: u64, signaled: bool) -> Result<u16, Mlx5Error> {
        let head = self.wq.sq_head();
        let fatal = self.fatal();
        self.wq
            .post_write_inline(wr_id, 0x7000_0000, 0x99, b"8 bytes!", signaled, fatal)?;
        Ok(head as u16)
    }

    /// One receive of one 64-byte SGE.
    pub fn post_recv(&mut self, wr_id: u64) -> Result<(), Mlx5Error> {
        let sge = [Sge::new(self.data.as_ptr() as u64, 64, Lkey(LKEY))];
        let fatal = self.fatal();
        self.wq.post_recv(&[RecvWr::new(wr_id, &sge)], fatal)
    }

    fn fatal(&self) -> bool {
        self.wq.shared.flush.load(Ordering::Acquire)
    }

    /// Write CQE slot `slot & (entries − 1)` as the device would: bytes
    /// 0..63, then `op_own` (byte 63) last.
    pub fn write_cqe(&self, slot: u32, cqe: &[u8; CQE_BYTES]) {
        let at = (slot & (self.entries() - 1)) as usize * CQE_BYTES;
        // Inside the buffer by construction (slot masked); a failure would
        // be a bug in the rig, and the write is skipped.
        let _ = self.cq.write(at, &cqe[..63]);
        let _ = self.cq.write(at + 63, &cqe[63..]);
    }

    /// [`crate::Cq::poll`] on the ring (no fatal flushes: see
    /// [`CqRig::flush`]).
    pub fn poll(&mut self, wcs: &mut [WorkCompletion]) -> usize {
        self.ring.poll_cqes(wcs)
    }

    /// [`crate::Cq::poll_send`] on the ring (no fatal flushes).
    pub fn poll_send(&mut self) -> Option<SendCompletion> {
        self.ring.poll_send()
    }

    /// The fatal-device flush: every outstanding WQE of every attached QP
    /// as WR_FLUSH_ERR (as many as fit); posts are refused from then on.
    pub fn flush(&mut self, wcs: &mut [WorkCompletion]) -> usize {
        self.ring.flush(wcs)
    }

    /// What the CQ counted.
    pub fn counters(&self) -> CqCounters {
        self.ring.counters_now()
    }

    /// The CQ's consumer index (free-running).
    pub fn consumer_index(&self) -> u32 {
        self.ring.consumer_index()
    }

    /// CQEs the attached queues may have outstanding: half the ring; the
    /// polls store `set_ci` at each multiple of it.
    pub fn capacity(&self) -> u32 {
        self.ring.capacity()
    }

    /// The `set_ci` the CQ's doorbell record holds (24 bits).
    pub fn record_ci(&self) -> u32 {
        let r = self.ring.record_now();
        u32::from_be_bytes([r[0], r[1], r[2], r[3]]) & 0xff_ffff
    }

    /// WQEBBs outstanding on the QP's SQ, and receives on its RQ.
    pub fn outstanding(&self) -> (u32, u32) {
        (
            self.wq.shared.sq.outstanding(),
            self.wq.shared.rq.outstanding(),
        )
    }

    /// Work outstanding on the second QP (never posted to: always 0; 0 on
    /// a sole-QP rig, which has none).
    pub fn other_outstanding(&self) -> (u32, u32) {
        self.other
            .as_ref()
            .map_or((0, 0), |o| (o.sq.outstanding(), o.rq.outstanding()))
    }
}

/// An EQ ring drained by the driver's EQ consumer; see the module docs.
pub struct EqRig {
    buf: Arc<DmaBuffer>,
    log: u32,
    st: EqState,
    notify: Arc<CqNotify>,
}

impl std::fmt::Debug for EqRig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EqRig")
            .field("log", &self.log)
            .field("ci", &self.st.ci)
            .finish_non_exhaustive()
    }
}

impl EqRig {
    /// An EQ of `2^log` EQEs (`log` clamped to 1..=8), every owner bit 1
    /// (invalid on the first pass), with CQ `cqn` registered for
    /// completion events.
    pub fn new(log: u32, cqn: u32) -> Result<EqRig, Mlx5Error> {
        let log = log.clamp(1, 8);
        let buf = space().alloc((1usize << log) * EQE_BYTES)?;
        for i in 0..1usize << log {
            buf.write(i * EQE_BYTES + 63, &[EQE_OWNER_INIT])
                .map_err(|source| Mlx5Error::DmaAccess {
                    what: "fuzz EQ init",
                    source,
                })?;
        }
        let notify = Arc::new(CqNotify::default());
        let mut st = EqState::default();
        st.cqs.insert(cqn, notify.clone());
        Ok(EqRig {
            buf,
            log,
            st,
            notify,
        })
    }

    /// EQEs in the ring.
    pub fn entries(&self) -> u32 {
        1 << self.log
    }

    /// Write EQE slot `slot & (entries − 1)`: bytes 0..63, then byte 63
    /// (the owner) last.
    pub fn write_eqe(&self, slot: u32, eqe: &[u8; EQE_BYTES]) {
        let at = (slot & (self.entries() - 1)) as usize * EQE_BYTES;
        let _ = self.buf.write(at, &eqe[..63]);
        let _ = self.buf.write(at + 63, &eqe[63..]);
    }

    /// Consume every valid EQE; how many, and the EQ doorbells the drain
    /// rang (`(consumer index, armed)`).
    pub fn drain(&mut self) -> (u32, Vec<(u32, bool)>) {
        let mut rings = Vec::new();
        let n = drain_ring(self.buf.words(), self.log, &mut self.st, |ci, arm| {
            rings.push((ci, arm))
        });
        (n, rings)
    }

    /// What the EQ counted.
    pub fn counters(&self) -> EventCounters {
        self.st.counters
    }

    /// The EQ's consumer index (free-running).
    pub fn consumer_index(&self) -> u32 {
        self.st.ci
    }

    /// Completion events delivered to the registered CQ.
    pub fn cq_events(&self) -> u32 {
        self.notify.events.load(Ordering::Acquire)
    }

    /// Net pages the page requests asked for.
    pub fn pages_requested(&self) -> i64 {
        self.st.pages
    }
}
