//! The data path (mlx5.md §8–§10): send WQEs from the SQ ring at the doorbell, receive
//! WQEs from the RQ ring by the doorbell record, both handed to the QP's transport engine;
//! engine completions turned into CQEs (and completion EQEs); received packets and timers.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use rnic_core::{
    Lkey, QpAttr, QpAttrMask, QpState as Vs, Qpn, RecvWr, SendWr, Sge, WcStatus, WorkCompletion,
};
use rnic_mlx5_prm::{
    CQE_SYNDROME_TO_IBV, CqeOpcode, CqeSyndrome, EventType, INVALID_LKEY, QpState, WqeCtrlSeg,
    WqeDataSeg, WqeOpcode,
};
use rnic_roce::transport::{CompletionSink, CqSide, Instant, Io, MemKey, MemoryAccess};

use super::mkey::{INLINE_KEY, MemView};
use super::port::{Sink, ip_gid};
use super::qp::{ENGINE_DEPTH, QpObj, SendMeta};
use super::wqe::{be32, err_cqe, err_cqe_vendor, parse_segments, req_cqe, resp_cqe};
use super::{Hca, InjectSide};
use crate::device::Device;
use crate::firmware::exec::TERMINATE_SCATTER_KEY;

/// Completions the engine produced during one call.
#[derive(Debug, Default)]
pub(crate) struct Collect(pub(crate) Vec<(CqSide, WorkCompletion)>);

impl CompletionSink for Collect {
    fn complete(&mut self, side: CqSide, wc: WorkCompletion) {
        self.0.push((side, wc));
    }
}

/// The mlx5 syndrome of an engine status (the reverse of `CQE_SYNDROME_TO_IBV`); statuses
/// with no syndrome of their own report a local QP operation error.
pub(crate) fn syndrome_of(s: WcStatus) -> u8 {
    CQE_SYNDROME_TO_IBV
        .iter()
        .find(|(_, ibv)| *ibv == s.as_raw())
        .map_or(CqeSyndrome::LocalQpOp.as_raw(), |(syn, _)| syn.as_raw())
}

impl Hca {
    /// Nanoseconds on the engine's clock.
    pub(crate) fn now(&self) -> Instant {
        Instant::from_nanos(u64::try_from(self.clock.elapsed().as_nanos()).unwrap_or(u64::MAX))
    }

    /// Run `f` on QP `qpn`'s engine with the HCA's memory, sink and a collector, then settle
    /// the completions it produced.
    pub(crate) fn engine<R>(
        &mut self,
        dev: &Device,
        qpn: u32,
        inline: Option<&[u8]>,
        f: impl FnOnce(&mut rnic_roce::transport::Qp, &mut Io<'_>) -> R,
    ) -> Option<R> {
        let mut cq = Collect::default();
        let r = {
            let Hca {
                qps,
                mkeys,
                ports,
                gids,
                stats,
                txbuf,
                eth,
                counters,
                loopback,
                framebuf,
                ..
            } = self;
            let qp = qps.get_mut(&qpn)?;
            let mut mem = MemView {
                dev,
                mkeys,
                inline,
                dma_faults: std::cell::Cell::new(0),
            };
            let mut sink = Sink {
                buf: txbuf,
                ports,
                gids,
                stats,
                default_sport: qp.sport,
                halted: !dev.serving(),
                link_up: dev.link_up(),
                counters,
                eth: eth.as_deref().map(|port| super::port::EthTx {
                    port,
                    loopback,
                    frame: framebuf,
                }),
            };
            let mut io = Io {
                mem: &mut mem,
                tx: &mut sink,
                cq: &mut cq,
            };
            let r = f(&mut qp.engine, &mut io);
            let faults = mem.dma_faults.get();
            self.stats.dma_faults += faults;
            r
        };
        self.settle(dev, qpn, cq.0);
        self.drain_loopback(dev);
        Some(r)
    }

    /// Turn engine completions into CQEs, complete firmware-local WQEs that reached the head,
    /// and follow a firmware-detected error into ERR (flushing).
    fn settle(&mut self, dev: &Device, qpn: u32, mut wcs: Vec<(CqSide, WorkCompletion)>) {
        loop {
            let mut failed = false;
            for (side, wc) in wcs.drain(..) {
                failed |= self.deliver(dev, qpn, side, &wc);
            }
            while !failed {
                let Some(qp) = self.qps.get_mut(&qpn) else {
                    return;
                };
                let Some(m) = qp.sq_meta.front().copied() else {
                    break;
                };
                let Some(syndrome) = m.local else { break };
                qp.sq_meta.pop_front();
                let cqn = qp.cqn_snd;
                if syndrome == 0 {
                    if m.signaled {
                        let cqe = req_cqe(qp, &m);
                        self.q
                            .complete(dev, cqn, cqe, m.solicited, m.force_eqe, &mut self.stats);
                    }
                    continue;
                }
                let cqe =
                    err_cqe_vendor(qp, CqeOpcode::ReqErr, syndrome, m.vendor, m.opcode, m.index);
                self.q
                    .complete(dev, cqn, cqe, true, m.force_eqe, &mut self.stats);
                failed = true;
            }
            if !failed {
                return;
            }
            // A firmware-refused WQE (or an injected error CQE): the QP goes to ERR; the
            // engine flushes what it holds (receives), the SQ's later WQEs are flushed by the
            // next pump.
            let Some(qp) = self.qps.get_mut(&qpn) else {
                return;
            };
            let mut c = Collect::default();
            let attr = QpAttr {
                qp_state: Vs::Err,
                ..QpAttr::default()
            };
            let _ = qp.engine.modify(&attr, QpAttrMask::STATE, &mut c);
            qp.state = QpState::Err;
            qp.sq_stopped = false;
            self.stats.wqe_errors += 1;
            wcs = c.0;
        }
    }

    /// Write the CQE of one engine completion; `true` when it was turned into an injected
    /// error CQE (the QP must go to ERR).
    fn deliver(&mut self, dev: &Device, qpn: u32, side: CqSide, wc: &WorkCompletion) -> bool {
        let inject = if side == CqSide::Recv && wc.status == WcStatus::Success {
            self.take_injection(qpn, InjectSide::Recv)
        } else {
            None
        };
        let Some(qp) = self.qps.get_mut(&qpn) else {
            return false;
        };
        match side {
            CqSide::Send => {
                let Some(m) = qp.sq_meta.pop_front() else {
                    tracing::error!(qpn, "send completion with no WQE outstanding (bug)");
                    return false;
                };
                if wc.status == WcStatus::Success {
                    if let Some((lkey, addr)) = m.atomic_result {
                        fix_atomic_result(dev, &self.mkeys, qp, lkey, addr);
                    }
                    if !m.signaled {
                        return false;
                    }
                    let cqe = req_cqe(qp, &m);
                    let cqn = qp.cqn_snd;
                    self.q
                        .complete(dev, cqn, cqe, m.solicited, m.force_eqe, &mut self.stats);
                } else {
                    let s = syndrome_of(wc.status);
                    let cqe = err_cqe(qp, CqeOpcode::ReqErr, s, m.opcode, m.index);
                    let cqn = qp.cqn_snd;
                    self.q
                        .complete(dev, cqn, cqe, true, m.force_eqe, &mut self.stats);
                }
            }
            CqSide::Recv => {
                let Some(idx) = qp.rq_meta.pop_front() else {
                    tracing::error!(qpn, "receive completion with no WQE outstanding (bug)");
                    return false;
                };
                let cqn = qp.cqn_rcv;
                let cqe = if let Some((syndrome, vendor)) = inject {
                    err_cqe_vendor(qp, CqeOpcode::RespErr, syndrome, vendor, 0, idx)
                } else if wc.status == WcStatus::Success {
                    resp_cqe(qp, idx, wc)
                } else {
                    err_cqe(qp, CqeOpcode::RespErr, syndrome_of(wc.status), 0, idx)
                };
                // The engine does not surface the packet's SE bit: every receive completion
                // counts as solicited, so a solicited-only arm never misses one.
                self.q.complete(dev, cqn, cqe, true, false, &mut self.stats);
                return inject.is_some();
            }
        }
        false
    }

    /// The send doorbell (UAR + 0x800 …): `value` is the first 8 bytes of the last WQE's
    /// control segment; the QPN is in its second dword.
    ///
    /// The watcher samples the register rather than trapping each write, so a doorbell the
    /// driver wrote can be overwritten by another QP's before it is seen (QPs share the
    /// page's BlueFlame registers). Every driver publishes the doorbell record before it
    /// rings, so when any send doorbell of the page is seen, every record written before the
    /// lost doorbell is visible: the named QP is served, then every other QP of the page
    /// whose record's send counter is ahead of what the emulator fetched. WQEs are still
    /// read only up to each record's counter.
    pub(crate) fn sq_doorbell(&mut self, dev: &Device, page: u32, value: u64) {
        let qpn = (value as u32) >> 8;
        match self.qps.get(&qpn) {
            Some(qp) if qp.uar == page => self.pump(dev, qpn),
            _ if self.raw.sqs.get(&qpn).is_some_and(|sq| sq.wq.uar == page) => {
                self.raw_sq_pump(dev, qpn);
            }
            _ => {
                self.stats.bad_doorbells += 1;
                tracing::debug!(
                    qpn,
                    page,
                    "send doorbell for no QP of this UAR page: ignored"
                );
                return;
            }
        }
        self.sweep_page(dev, page, qpn);
    }

    /// The bytes of the WQE a send doorbell `value` on UAR page `page` names, as the SQ ring
    /// holds them (its basic blocks, at most a BlueFlame half's 256 bytes); `None` when the
    /// doorbell names no QP of the page or the ring cannot be read.
    pub(crate) fn bf_expected(&self, dev: &Device, page: u32, value: u64) -> Option<Vec<u8>> {
        let n = (value as u32) >> 8;
        if let Some(sq) = self.raw.sqs.get(&n) {
            if sq.wq.uar != page {
                return None;
            }
            let bb = |i: u16| u64::from(u32::from(i) & ((1 << sq.wq.log_sz) - 1)) * 64;
            return bf_read(dev, &sq.wq.ring, (value >> 40) as u16, bb);
        }
        let qp = self.qps.get(&n)?;
        if qp.uar != page || qp.no_sq {
            return None;
        }
        let ring = qp.wq.as_ref()?;
        let nbb = 1u32 << qp.log_sq;
        let bb = |i: u16| qp.sq_offset + u64::from(u32::from(i) & (nbb - 1)) * 64;
        bf_read(dev, ring, (value >> 40) as u16, bb)
    }

    /// Serve every QP of UAR page `page` (but `except`, just served) whose doorbell record's
    /// send counter is ahead of the WQEs fetched: the QPs whose doorbell may have been
    /// overwritten on a shared register (see [`Hca::sq_doorbell`]).
    fn sweep_page(&mut self, dev: &Device, page: u32, except: u32) {
        let behind: Vec<u32> = self
            .qps
            .iter()
            .filter(|(n, q)| {
                **n != except
                    && q.uar == page
                    && !q.no_sq
                    && !q.sq_stopped
                    && matches!(q.state, QpState::Rts | QpState::Err)
            })
            .filter_map(|(n, q)| {
                let (_, producer) = Self::dbr(dev, q)?;
                (producer != q.sq_fetched).then_some(*n)
            })
            .collect();
        for qpn in behind {
            self.stats.swept_doorbells += 1;
            self.pump(dev, qpn);
        }
        let raw_behind: Vec<u32> = self
            .raw
            .sqs
            .iter()
            .filter(|(n, sq)| {
                **n != except
                    && sq.wq.uar == page
                    && matches!(
                        sq.state,
                        rnic_mlx5_prm::WqState::Rdy | rnic_mlx5_prm::WqState::Err
                    )
            })
            .filter_map(|(n, sq)| {
                let mut b = [0u8; 4];
                dev.dma_read(sq.wq.dbr + 4, &mut b).ok()?;
                (u32::from_be_bytes(b) as u16 != sq.fetched).then_some(*n)
            })
            .collect();
        for sqn in raw_behind {
            self.stats.swept_doorbells += 1;
            self.raw_sq_pump(dev, sqn);
        }
    }

    /// Move work from the rings into the engine while there is room, and run it.
    pub(crate) fn pump(&mut self, dev: &Device, qpn: u32) {
        for _ in 0..64 {
            let before = self.qps.get(&qpn).map(|q| (q.sq_fetched, q.rq_fetched));
            self.fetch_recv(dev, qpn);
            self.fetch_send(dev, qpn);
            let now = self.now();
            self.engine(dev, qpn, None, |e, io| e.run(now, io));
            if self.qps.get(&qpn).map(|q| (q.sq_fetched, q.rq_fetched)) == before {
                return;
            }
        }
    }

    fn dbr(dev: &Device, qp: &QpObj) -> Option<(u16, u16)> {
        let mut b = [0u8; 8];
        dev.dma_read(qp.dbr, &mut b).ok()?;
        Some((be32(&b, 0) as u16, be32(&b, 4) as u16))
    }

    /// Receive WQEs up to the doorbell record's receive counter.
    fn fetch_recv(&mut self, dev: &Device, qpn: u32) {
        loop {
            let Some(qp) = self.qps.get_mut(&qpn) else {
                return;
            };
            if !qp.has_rq || qp.state == QpState::Rst {
                return;
            }
            let Some((head, _)) = Self::dbr(dev, qp) else {
                self.stats.dma_faults += 1;
                return;
            };
            if qp.rq_fetched == head {
                return;
            }
            let idx = qp.rq_fetched;
            if qp.state == QpState::Err {
                qp.rq_fetched = idx.wrapping_add(1);
                let cqe = err_cqe(
                    qp,
                    CqeOpcode::RespErr,
                    CqeSyndrome::WrFlushed.as_raw(),
                    0,
                    idx,
                );
                let cqn = qp.cqn_rcv;
                self.q.complete(dev, cqn, cqe, true, false, &mut self.stats);
                continue;
            }
            if qp.engine.recv_outstanding() >= (1u32 << qp.log_rq).min(ENGINE_DEPTH) {
                return;
            }
            let stride = 1usize << qp.log_rq_stride;
            let mut w = vec![0u8; stride];
            let off = u64::from(u32::from(idx) & ((1 << qp.log_rq) - 1)) << qp.log_rq_stride;
            let ok = qp.wq.as_ref().is_some_and(|r| r.read(dev, off, &mut w));
            if !ok {
                self.stats.dma_faults += 1;
                self.wq_fatal(dev, qpn, "RQ WQE unreadable");
                return;
            }
            let fw = &dev.options().firmware;
            // The key that ends the scatter list: QUERY_SPECIAL_CONTEXTS's when the cap
            // advertises one (then 0x100 is an ordinary key), else MLX5_INVALID_LKEY.
            let terminator = if fw.terminate_scatter_key {
                TERMINATE_SCATTER_KEY
            } else {
                INVALID_LKEY
            };
            let mut sges = Vec::new();
            for s in w.chunks_exact(16) {
                let d = WqeDataSeg::new_unchecked(s);
                if d.lkey() == terminator {
                    break;
                }
                // byte_count 0 is 2^31 bytes by the data-segment convention (as for sends)
                // when the check is on; no MKey spans that, so the receive fails its bounds
                // check (LOCAL_PROT) when a message arrives.
                let len = match d.byte_count() {
                    0 if fw.strictness.recv_zero_length => 0x8000_0000,
                    n => n,
                };
                sges.push(Sge::new(d.addr(), len, Lkey(d.lkey())));
            }
            qp.rq_fetched = idx.wrapping_add(1);
            qp.rq_meta.push_back(idx);
            let wr = RecvWr {
                wr_id: u64::from(idx),
                sg_list: &sges,
            };
            let posted = self.engine(dev, qpn, None, |e, io| e.post_recv(&wr, io));
            if let Some(Err(e)) = posted {
                tracing::warn!(qpn, %e, "receive WQE refused by the engine");
                if let Some(qp) = self.qps.get_mut(&qpn) {
                    qp.rq_meta.pop_back();
                }
                self.wq_fatal(dev, qpn, "receive WQE refused");
                return;
            }
        }
    }

    /// A work queue the firmware cannot use: WQ catastrophic error event, QP to ERR.
    fn wq_fatal(&mut self, dev: &Device, qpn: u32, why: &str) {
        tracing::warn!(qpn, why, "WQ catastrophic error: QP to ERR");
        let mut data = [0u8; 28];
        data[0x14] = 0; // qp_events.type: QP
        data[0x18..0x1c].copy_from_slice(&qpn.to_be_bytes());
        self.q
            .event(dev, EventType::WqCatasError, 0, &data, &mut self.stats);
        let attr = QpAttr {
            qp_state: Vs::Err,
            ..QpAttr::default()
        };
        self.engine(dev, qpn, None, |e, io| {
            let _ = e.modify(&attr, QpAttrMask::STATE, io.cq);
        });
        if let Some(qp) = self.qps.get_mut(&qpn) {
            qp.state = QpState::Err;
        }
    }

    /// Send WQEs up to the doorbell record's send counter (RTS: to the engine; ERR: flushed).
    fn fetch_send(&mut self, dev: &Device, qpn: u32) {
        loop {
            let Some(qp) = self.qps.get_mut(&qpn) else {
                return;
            };
            qp.sync_state();
            if qp.no_sq || qp.sq_stopped || !matches!(qp.state, QpState::Rts | QpState::Err) {
                return;
            }
            let Some((_, producer)) = Self::dbr(dev, qp) else {
                self.stats.dma_faults += 1;
                return;
            };
            let idx = qp.sq_fetched;
            let avail = producer.wrapping_sub(idx);
            if avail == 0 {
                return;
            }
            let nbb = 1u32 << qp.log_sq;
            let mut ctrl_raw = [0u8; 16];
            let base = qp.sq_offset;
            let bb = |i: u16| base + u64::from(u32::from(i) & (nbb - 1)) * 64;
            let ring = qp.wq.clone();
            let read_ok = ring
                .as_ref()
                .is_some_and(|r| r.read(dev, bb(idx), &mut ctrl_raw));
            let ctrl = WqeCtrlSeg::new_unchecked(&ctrl_raw[..]);
            let ds = ctrl.ds();
            let size = ds.div_ceil(4).max(1);
            let opcode = ctrl.opcode() as u8;
            let cm = ctrl.completion_mode();
            let mut meta = SendMeta {
                index: idx,
                opcode,
                signaled: cm >= 2,
                force_eqe: cm == 3,
                solicited: ctrl.solicited() == 1,
                local: None,
                vendor: 0,
                atomic_result: None,
                len: 0,
            };
            if qp.state == QpState::Err {
                // Flush: every WQE gets its error CQE with syndrome WR_FLUSHED.
                let step = if read_ok && ds > 0 && size <= u32::from(avail) {
                    size
                } else {
                    1
                };
                qp.sq_fetched = idx.wrapping_add(step as u16);
                let cqe = err_cqe(
                    qp,
                    CqeOpcode::ReqErr,
                    CqeSyndrome::WrFlushed.as_raw(),
                    opcode,
                    idx,
                );
                let cqn = qp.cqn_snd;
                self.q
                    .complete(dev, cqn, cqe, true, meta.force_eqe, &mut self.stats);
                continue;
            }
            if qp.engine.send_outstanding() >= nbb.min(ENGINE_DEPTH) {
                return;
            }
            let qp_op = CqeSyndrome::LocalQpOp.as_raw();
            let mut refused = None;
            let mut body = Vec::new();
            if let Some((syndrome, vendor)) = self.take_injection(qpn, InjectSide::Send) {
                // An injected error CQE: the WQE is not executed; it completes in error at
                // the head of the queue (settle), then the QP goes to ERR.
                let Some(qp) = self.qps.get_mut(&qpn) else {
                    return;
                };
                meta.local = Some(syndrome);
                meta.vendor = vendor;
                // A malformed WQE's size is not to be trusted: step one basic block.
                let step = if read_ok && ds > 0 && size <= u32::from(avail) {
                    size
                } else {
                    1
                };
                qp.sq_stopped = true;
                qp.sq_fetched = idx.wrapping_add(step as u16);
                qp.sq_meta.push_back(meta);
                self.settle(dev, qpn, Vec::new());
                continue;
            }
            let Some(qp) = self.qps.get_mut(&qpn) else {
                return;
            };
            if !read_ok {
                self.stats.dma_faults += 1;
                refused = Some(qp_op);
            } else if ds == 0
                || ds > 63
                || size > u32::from(avail)
                || ctrl.wqe_index() != u32::from(idx)
                || ctrl.qpn() != qpn
            {
                refused = Some(qp_op);
            } else {
                let mut w = vec![0u8; size as usize * 64];
                let ok = (0..size).all(|k| {
                    let at = k as usize * 64;
                    ring.as_ref().is_some_and(|r| {
                        r.read(dev, bb(idx.wrapping_add(k as u16)), &mut w[at..at + 64])
                    })
                });
                if ok {
                    w.truncate(ds as usize * 16);
                    body = w.split_off(16);
                } else {
                    self.stats.dma_faults += 1;
                    refused = Some(qp_op);
                }
            }
            let op = WqeOpcode::from_raw(opcode);
            if refused.is_none() && op == WqeOpcode::Nop {
                meta.local = Some(0);
                qp.sq_fetched = idx.wrapping_add(size as u16);
                qp.sq_meta.push_back(meta);
                self.settle(dev, qpn, Vec::new());
                continue;
            }
            let parsed = match refused {
                Some(s) => Err(s),
                None => parse_segments(qp, op, &ctrl, &body, &self.gids),
            };
            let p = match parsed {
                Ok(p) => p,
                Err(s) => {
                    tracing::info!(qpn, index = idx, opcode, syndrome = s, "send WQE refused");
                    meta.local = Some(s);
                    qp.sq_stopped = true;
                    // A WQE refused for claiming more basic blocks than were posted steps one:
                    // the consumer never passes the producer (past it, the ring would hold
                    // 65,536 - k WQEs the driver never posted, all flushed).
                    let step = if size <= u32::from(avail) { size } else { 1 };
                    qp.sq_fetched = idx.wrapping_add(step as u16);
                    qp.sq_meta.push_back(meta);
                    self.settle(dev, qpn, Vec::new());
                    continue;
                }
            };
            meta.atomic_result = p.atomic_result;
            meta.len = u32::try_from(p.len).unwrap_or(u32::MAX);
            qp.sq_fetched = idx.wrapping_add(size as u16);
            qp.sq_meta.push_back(meta);
            let inline_sge;
            let sg_list: &[Sge] = match &p.inline {
                Some(b) => {
                    inline_sge = [Sge::new(0, b.len() as u32, Lkey(INLINE_KEY))];
                    &inline_sge
                }
                None => &p.sges,
            };
            let wr = SendWr {
                wr_id: u64::from(idx),
                op: p.op,
                sg_list,
                flags: p.flags,
                ud: p.ud,
            };
            let posted = self.engine(dev, qpn, p.inline.as_deref(), |e, io| e.post_send(&wr, io));
            if let Some(Err(e)) = posted {
                tracing::info!(qpn, index = idx, %e, "send WQE refused by the engine");
                if let Some(qp) = self.qps.get_mut(&qpn) {
                    if let Some(m) = qp.sq_meta.back_mut() {
                        m.local = Some(qp_op);
                    }
                    qp.sq_stopped = true;
                }
                self.settle(dev, qpn, Vec::new());
            }
        }
    }

    /// A datagram at `local` from `from`, whose ICRC the receive thread checked
    /// (`icrc_ok`).
    pub(crate) fn on_packet(&mut self, local: IpAddr, from: SocketAddr, pkt: &[u8], icrc_ok: bool) {
        let Some(dev) = self.dev.upgrade() else {
            return;
        };
        self.stats.rx_packets += 1;
        if !dev.serving() {
            self.stats.halted_drops += 1;
            return;
        }
        if !dev.link_up() {
            self.stats.link_down_drops += 1;
            return;
        }
        if !icrc_ok {
            self.stats.rx_bad_icrc += 1;
            return;
        }
        let Some(qpn) = rnic_roce::transport::dest_qpn(pkt).map(Qpn::get) else {
            self.stats.rx_dropped += 1;
            return;
        };
        if !self.qps.contains_key(&qpn) {
            self.stats.rx_dropped += 1;
            return;
        }
        // Receive WQEs first: the doorbell record is read when a packet needs one.
        self.fetch_recv(&dev, qpn);
        let now = self.now();
        let (src, dst) = (ip_gid(from.ip()), ip_gid(local));
        self.engine(&dev, qpn, None, |e, io| {
            e.receive_at(now, pkt, src, dst, io)
        });
        self.pump(&dev, qpn);
    }

    /// Run the engines' due timers.
    pub(crate) fn on_timers(&mut self) {
        let Some(dev) = self.dev.upgrade() else {
            return;
        };
        let now = self.now();
        let due: Vec<u32> = self
            .qps
            .iter()
            .filter(|(_, q)| q.engine.next_deadline().is_some_and(|d| d <= now))
            .map(|(n, _)| *n)
            .collect();
        for qpn in due {
            self.engine(&dev, qpn, None, |e, io| e.on_timer(now, io));
            self.pump(&dev, qpn);
        }
        // Receives posted to a QP in error have no doorbell to ring and may wait for no
        // packet: look at the doorbell records of QPs in ERR here (at most every
        // `poll_timeout`, 50 ms), so they flush (WR_FLUSHED) as a real HCA flushes them.
        let in_err: Vec<u32> = self
            .qps
            .iter()
            .filter(|(_, q)| q.has_rq && q.state == QpState::Err)
            .map(|(n, _)| *n)
            .collect();
        for qpn in in_err {
            self.fetch_recv(&dev, qpn);
        }
    }

    /// How long a receive thread may block: up to the nearest engine deadline, 50 µs..50 ms.
    pub(crate) fn poll_timeout(&self) -> Duration {
        let now = self.now();
        let next = self
            .qps
            .values()
            .filter_map(|q| q.engine.next_deadline())
            .min();
        let d = next.map_or(Duration::from_millis(50), |d| {
            Duration::from_nanos(d.nanos().saturating_sub(now.nanos()))
        });
        d.clamp(Duration::from_micros(50), Duration::from_millis(50))
    }
}

/// The WQE at basic block `index` of `ring` (`bb` maps an index to its ring offset): its
/// basic blocks, at most a BlueFlame half's 256 bytes.
fn bf_read(
    dev: &Device,
    ring: &super::queues::Ring,
    index: u16,
    bb: impl Fn(u16) -> u64,
) -> Option<Vec<u8>> {
    let mut ctrl = [0u8; 16];
    if !ring.read(dev, bb(index), &mut ctrl) {
        return None;
    }
    let wqebbs = WqeCtrlSeg::new_unchecked(&ctrl[..])
        .ds()
        .div_ceil(4)
        .clamp(1, 4);
    let mut w = vec![0u8; wqebbs as usize * 64];
    for k in 0..wqebbs as usize {
        let i = index.wrapping_add(k as u16);
        if !ring.read(dev, bb(i), &mut w[k * 64..k * 64 + 64]) {
            return None;
        }
    }
    Some(w)
}

/// The requester wrote an atomic's original value in host order; mlx5 without the 8-byte
/// endianness mode returns it big-endian (mlx5.md §9.3).
fn fix_atomic_result(
    dev: &Device,
    mkeys: &super::mkey::MkeyTable,
    qp: &QpObj,
    lkey: u32,
    addr: u64,
) {
    let pd = rnic_core::PdHandle(qp.pd);
    let mut mem = MemView {
        dev,
        mkeys,
        inline: None,
        dma_faults: std::cell::Cell::new(0),
    };
    let key = MemKey::Local(Lkey(lkey));
    let access = rnic_roce::transport::Access::LocalWrite;
    let mut b = [0u8; 8];
    if mem.read(pd, key, addr, &mut b, access).is_ok() {
        let v = u64::from_ne_bytes(b);
        let _ = mem.write(pd, key, addr, &v.to_be_bytes(), access);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_ibverbs_status_maps_back_to_its_syndrome() {
        for (s, ibv) in CQE_SYNDROME_TO_IBV {
            assert_eq!(syndrome_of(WcStatus::from_raw(*ibv)), s.as_raw(), "{s}");
        }
        assert_eq!(syndrome_of(WcStatus::LocProtErr), 0x04);
        assert_eq!(syndrome_of(WcStatus::WrFlushErr), 0x05);
        assert_eq!(syndrome_of(WcStatus::RetryExcErr), 0x15);
        // No syndrome of its own: a local QP operation error.
        assert_eq!(syndrome_of(WcStatus::from_raw(21)), 0x02);
    }
}
