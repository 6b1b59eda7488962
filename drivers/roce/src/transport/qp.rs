//! The queue pair: its rings, attributes, state, and the entry points that
//! drive the three state machines.

use rnic_core::wr::MAX_MSG_SIZE;
use rnic_core::{
    AccessFlags, AddressVector, Gid, Mtu, PdHandle, Psn, QpAttr, QpAttrMask, QpInitAttr, QpState,
    QpType, Qpn, RecvWr, SendFlags, SendWr, UdDest, WcOpcode, WcStatus, WorkCompletion,
};

use super::completer::Completer;
use super::pkt::{self, Out, ParseError};
use super::queue::{
    RecvQueue, RecvWqe, SendQueue, SendWqe, UdTarget, WqeStatus, sgl_len, sgl_read,
};
use super::requester::{DEFAULT_MAX_UNACKED_PSNS, Requester};
use super::responder::Responder;
use super::stats::QpStats;
use super::{
    Access, CqSide, Instant, Io, MemError, MemKey, MemoryAccess, PacketDest, PacketSink, Piece,
    TransportError,
};

/// The largest message the engine moves (rxe's `RXE_MAX_MSG_SIZE`).
pub(crate) const MAX_MSG: u64 = MAX_MSG_SIZE;

/// What a QP is created with (sizes are fixed for its lifetime).
#[derive(Clone, Copy, Debug)]
pub struct QpConfig {
    /// This QP's number (BTH DestQP of incoming packets, DETH source QPN).
    pub qpn: Qpn,
    /// RC or UD (UC is refused by [`Qp::new`]).
    pub qp_type: QpType,
    /// The protection domain memory keys must belong to.
    pub pd: PdHandle,
    /// Send ring depth.
    pub sq_depth: u32,
    /// Receive ring depth.
    pub rq_depth: u32,
    /// SGEs per send WQE.
    pub max_send_sge: usize,
    /// SGEs per receive WQE.
    pub max_recv_sge: usize,
    /// Inline bytes per send WQE.
    pub max_inline: usize,
    /// Every send WQE completes (not only `SIGNALED` ones).
    pub sq_sig_all: bool,
    /// Our GID (written into the GRH area of UD receives).
    pub local_gid: Gid,
    /// Treat `retry_cnt` = 7 as infinite, as rxe does (the IBTA spec only
    /// makes `rnr_retry` = 7 infinite).
    pub retry_cnt_7_infinite: bool,
    /// The requester's window: at most this many PSNs sent and not yet
    /// acknowledged. rxe's `RXE_MAX_UNACKED_PSNS` (128, the default) keeps
    /// a kernel rxe peer's receive queue from overflowing; between rnic
    /// peers with large socket buffers a bigger window keeps the pipe full
    /// (128 packets are only 512 KiB at MTU 4096). Clamped to 1..=2^22.
    pub max_unacked_psns: u32,
}

impl QpConfig {
    /// The same configuration with a requester window of `psns` (see
    /// [`QpConfig::max_unacked_psns`]).
    #[must_use]
    pub fn with_max_unacked_psns(mut self, psns: u32) -> QpConfig {
        self.max_unacked_psns = psns;
        self
    }

    /// The configuration of a QP created with `attr` (ring sizes from its caps).
    pub fn from_init(qpn: Qpn, pd: PdHandle, attr: &QpInitAttr, local_gid: Gid) -> QpConfig {
        QpConfig {
            qpn,
            qp_type: attr.qp_type,
            pd,
            sq_depth: attr.caps.max_send_wr,
            rq_depth: attr.caps.max_recv_wr,
            max_send_sge: attr.caps.max_send_sge as usize,
            max_recv_sge: attr.caps.max_recv_sge as usize,
            max_inline: attr.caps.max_inline_data as usize,
            sq_sig_all: attr.sq_sig_all,
            local_gid,
            retry_cnt_7_infinite: true,
            max_unacked_psns: DEFAULT_MAX_UNACKED_PSNS,
        }
    }

    /// An RC QP with modest rings (64/64, 4 SGEs, 256 inline bytes).
    pub fn rc(qpn: Qpn, pd: PdHandle) -> QpConfig {
        QpConfig {
            qpn,
            qp_type: QpType::Rc,
            pd,
            sq_depth: 64,
            rq_depth: 64,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline: 256,
            sq_sig_all: false,
            local_gid: Gid::ZERO,
            retry_cnt_7_infinite: true,
            max_unacked_psns: DEFAULT_MAX_UNACKED_PSNS,
        }
    }

    /// A UD QP with the same rings.
    pub fn ud(qpn: Qpn, pd: PdHandle) -> QpConfig {
        QpConfig {
            qp_type: QpType::Ud,
            ..QpConfig::rc(qpn, pd)
        }
    }
}

/// The attributes in force (defaults: rc_pingpong's values).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Attrs {
    pub path_mtu: Mtu,
    pub dest_qpn: Qpn,
    pub av: AddressVector,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub min_rnr_timer: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub access: AccessFlags,
    pub qkey: u32,
}

impl Default for Attrs {
    fn default() -> Attrs {
        Attrs {
            path_mtu: Mtu::Mtu1024,
            dest_qpn: Qpn::default(),
            av: AddressVector::default(),
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            access: AccessFlags::empty(),
            qkey: 0,
        }
    }
}

/// Outcome of one attempt to put a packet into the sink.
pub(crate) enum Tx {
    /// Committed; this many bytes.
    Sent(usize),
    /// The sink had no room.
    Full,
    /// Filling the payload failed (nothing committed).
    Fill,
}

/// Build one packet into the sink: headers from `o`, `paylen` payload bytes
/// from `fill`, zero pad and ICRC.
pub(crate) fn transmit(
    tx: &mut dyn PacketSink,
    o: &Out,
    paylen: usize,
    dest: &PacketDest,
    fill: impl FnOnce(&mut [u8]) -> Result<(), MemError>,
) -> Tx {
    let len = pkt::packet_len(o.opcode, paylen);
    let Some(buf) = tx.buffer(len).and_then(|b| b.get_mut(..len)) else {
        return Tx::Full;
    };
    let Some(at) = pkt::emit(buf, o, paylen) else {
        return Tx::Fill;
    };
    if paylen > 0 {
        let Some(p) = buf.get_mut(at..at + paylen) else {
            return Tx::Full;
        };
        if fill(p).is_err() {
            return Tx::Fill;
        }
    }
    tx.commit(len, dest);
    Tx::Sent(len)
}

/// Pieces a gathered payload may have (a payload spread over more SGEs is
/// copied).
pub(crate) const MAX_PIECES: usize = 4;

/// A piece of a payload named by key, before [`MemoryAccess::lend`]
/// resolves it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KeyPiece {
    pub key: MemKey,
    pub addr: u64,
    pub len: usize,
    pub access: Access,
}

impl KeyPiece {
    pub const EMPTY: KeyPiece = KeyPiece {
        key: MemKey::Local(rnic_core::Lkey(0)),
        addr: 0,
        len: 0,
        access: Access::LocalRead,
    };
}

/// Build one packet whose `paylen`-byte payload (`keys`, in order) the sink
/// sends in place from registered memory: headers and the zeroed tail into
/// the sink's buffer, the pieces by reference. `None` when that cannot be
/// done — the sink does not take this size in place, a piece's memory
/// offers no direct access, more than [`MAX_PIECES`] pieces — and the
/// caller copies with [`transmit`]; a key that fails validation is
/// [`Tx::Fill`], as the copy would be.
pub(crate) fn transmit_gather(
    tx: &mut dyn PacketSink,
    mem: &dyn MemoryAccess,
    pd: PdHandle,
    o: &Out,
    paylen: usize,
    dest: &PacketDest,
    keys: &[KeyPiece],
) -> Option<Tx> {
    if paylen == 0 || paylen < tx.gather_min() || keys.is_empty() || keys.len() > MAX_PIECES {
        return None;
    }
    let mut lent: [Option<Piece<'_>>; MAX_PIECES] = [None; MAX_PIECES];
    for (slot, k) in lent.iter_mut().zip(keys) {
        match mem.lend(pd, k.key, k.addr, k.len as u64, k.access) {
            Ok(Some((m, offset))) => {
                *slot = Some(Piece {
                    mem: m,
                    offset,
                    len: k.len,
                })
            }
            Ok(None) => return None,
            Err(_) => return Some(Tx::Fill),
        }
    }
    let first = lent[0]?;
    let mut pieces = [first; MAX_PIECES];
    for (p, l) in pieces.iter_mut().zip(&lent).take(keys.len()) {
        *p = (*l)?;
    }
    let head = pkt::header_len(o.opcode);
    let tail = pkt::pad_for(paylen) + pkt::ICRC_LEN;
    let Some(buf) = tx.buffer(head + tail) else {
        return Some(Tx::Full);
    };
    let Some(h) = pkt::emit_head(buf, o, paylen) else {
        return Some(Tx::Fill);
    };
    tx.commit_gather(h, &pieces[..keys.len()], tail, dest);
    Some(Tx::Sent(h + paylen + tail))
}

/// One queue pair. See the [module docs](super) for the state machines.
#[derive(Debug)]
pub struct Qp {
    pub(crate) cfg: QpConfig,
    pub(crate) state: QpState,
    pub(crate) a: Attrs,
    pub(crate) sq: SendQueue,
    pub(crate) rq: RecvQueue,
    pub(crate) req: Requester,
    pub(crate) comp: Completer,
    pub(crate) resp: Responder,
    pub(crate) stats: QpStats,
    /// Unsignaled send WQEs retired without a completion since the last send
    /// completion: the next one reports them (`retired_unsignaled`).
    pub(crate) silent: u32,
}

impl Qp {
    /// A QP in RESET with its rings allocated (RC or UD; UC is refused).
    pub fn new(cfg: QpConfig) -> Result<Qp, TransportError> {
        if cfg.qp_type == QpType::Uc {
            return Err(TransportError::UnsupportedQpType(cfg.qp_type));
        }
        Ok(Qp {
            cfg,
            state: QpState::Reset,
            a: Attrs::default(),
            sq: SendQueue::new(cfg.sq_depth, cfg.max_send_sge, cfg.max_inline),
            rq: RecvQueue::new(cfg.rq_depth, cfg.max_recv_sge),
            req: Requester::default(),
            comp: Completer::default(),
            resp: Responder::default(),
            stats: QpStats::default(),
            silent: 0,
        })
    }

    /// This QP's number.
    pub fn qpn(&self) -> Qpn {
        self.cfg.qpn
    }

    /// The current state.
    pub fn state(&self) -> QpState {
        self.state
    }

    /// The counters.
    pub fn stats(&self) -> &QpStats {
        &self.stats
    }

    /// Send WQEs posted and not yet completed.
    pub fn send_outstanding(&self) -> u32 {
        self.sq.len()
    }

    /// Receive WQEs posted and not yet completed.
    pub fn recv_outstanding(&self) -> u32 {
        self.rq.len()
    }

    /// Apply the attributes named in `mask` (and a state change when it
    /// names `STATE`). The legality of the transition is core's
    /// `check_modify`'s business; this applies what it is given. Moving to
    /// ERR flushes through `cq`; moving to RESET discards all posted work
    /// without completions, as ibverbs does; moving to SQE flushes the send
    /// queue.
    pub fn modify(
        &mut self,
        attr: &QpAttr,
        mask: QpAttrMask,
        cq: &mut dyn super::CompletionSink,
    ) -> Result<(), TransportError> {
        if mask.contains(QpAttrMask::TIMEOUT) && attr.timeout > 31 {
            return Err(TransportError::BadAttr("timeout is a 5-bit exponent"));
        }
        if mask.contains(QpAttrMask::MIN_RNR_TIMER) && attr.min_rnr_timer > 31 {
            return Err(TransportError::BadAttr("min_rnr_timer is a 5-bit code"));
        }
        if (mask.contains(QpAttrMask::RETRY_CNT) && attr.retry_cnt > 7)
            || (mask.contains(QpAttrMask::RNR_RETRY) && attr.rnr_retry > 7)
        {
            return Err(TransportError::BadAttr("retry counts are 3-bit"));
        }
        let a = &mut self.a;
        if mask.contains(QpAttrMask::PATH_MTU) {
            a.path_mtu = attr.path_mtu;
        }
        if mask.contains(QpAttrMask::DEST_QPN) {
            a.dest_qpn = attr.dest_qp_num;
        }
        if mask.contains(QpAttrMask::AV) {
            a.av = attr.ah_attr;
        }
        if mask.contains(QpAttrMask::TIMEOUT) {
            a.timeout = attr.timeout;
        }
        if mask.contains(QpAttrMask::RETRY_CNT) {
            a.retry_cnt = attr.retry_cnt;
            self.comp.retry_left = attr.retry_cnt;
        }
        if mask.contains(QpAttrMask::RNR_RETRY) {
            a.rnr_retry = attr.rnr_retry;
            self.comp.rnr_left = attr.rnr_retry;
        }
        if mask.contains(QpAttrMask::MIN_RNR_TIMER) {
            a.min_rnr_timer = attr.min_rnr_timer;
        }
        if mask.contains(QpAttrMask::MAX_QP_RD_ATOMIC) {
            a.max_rd_atomic = attr.max_rd_atomic;
        }
        if mask.contains(QpAttrMask::MAX_DEST_RD_ATOMIC) {
            a.max_dest_rd_atomic = attr.max_dest_rd_atomic;
            self.resp
                .resize_resources(usize::from(attr.max_dest_rd_atomic));
        }
        if mask.contains(QpAttrMask::ACCESS_FLAGS) {
            a.access = attr.qp_access_flags;
        }
        if mask.contains(QpAttrMask::QKEY) {
            a.qkey = attr.qkey;
        }
        if mask.contains(QpAttrMask::RQ_PSN) {
            self.resp.reset_psn(attr.rq_psn);
        }
        if mask.contains(QpAttrMask::SQ_PSN) {
            self.set_sq_psn(attr.sq_psn);
        }
        let s = attr.qp_state;
        if mask.contains(QpAttrMask::STATE) && s != self.state {
            match s {
                QpState::Reset => {
                    self.silent = 0;
                    self.sq.clear();
                    self.rq.clear();
                    self.req = Requester::default();
                    self.comp = Completer::default();
                    self.comp.retry_left = self.a.retry_cnt;
                    self.comp.rnr_left = self.a.rnr_retry;
                    let res = usize::from(self.a.max_dest_rd_atomic);
                    self.resp = Responder::default();
                    self.resp.resize_resources(res);
                    self.state = QpState::Reset;
                }
                QpState::Err => self.enter_error(cq),
                QpState::Sqe => {
                    self.state = QpState::Sqe;
                    self.flush_send(cq);
                }
                QpState::Init | QpState::Rtr | QpState::Rts | QpState::Sqd => self.state = s,
            }
        }
        Ok(())
    }

    fn set_sq_psn(&mut self, p: Psn) {
        self.req.next_psn = p;
        self.req.sent_hi = p;
        self.comp.psn = p;
    }

    /// Queue a send work request (data of `INLINE` requests is copied now).
    /// On an ERR QP the request completes at once with `WR_FLUSH_ERR`.
    /// Call [`Qp::run`] (the doorbell) to start sending.
    ///
    /// UD requests carry their destination by value ([`UdDest`]): the driver
    /// above resolved it (rnic-rxe from an address handle, the emulated HCA
    /// from the WQE's datagram segment).
    pub fn post_send(
        &mut self,
        wr: &SendWr<'_, UdDest>,
        io: &mut Io<'_>,
    ) -> Result<(), TransportError> {
        if self.state == QpState::Reset {
            return Err(TransportError::BadState(self.state));
        }
        let ud = self.cfg.qp_type == QpType::Ud;
        if ud != wr.ud.is_some() || !wr.op.supported_on(self.cfg.qp_type) {
            return Err(TransportError::BadOpForQpType(self.cfg.qp_type));
        }
        if wr.sg_list.len() > self.sq.max_sge {
            return Err(TransportError::TooManySge {
                got: wr.sg_list.len(),
                max: self.sq.max_sge,
            });
        }
        if self.sq.is_full() {
            return Err(TransportError::QueueFull(CqSide::Send));
        }
        let mut wqe = SendWqe {
            wr_id: wr.wr_id,
            op: wr.op,
            ud: wr.ud.as_ref().map(UdTarget::from),
            flags: wr.flags,
            signaled: self.cfg.sq_sig_all || wr.flags.contains(SendFlags::SIGNALED),
            num_sge: wr.sg_list.len(),
            inline: false,
            len: sgl_len(wr.sg_list),
            status: WqeStatus::Posted,
            first_psn: Psn::default(),
            npkts: 0,
        };
        if !wqe.is_rd_atomic() && wr.flags.contains(SendFlags::INLINE) {
            if wqe.len > self.sq.max_inline as u64 {
                return Err(TransportError::InlineTooLong {
                    got: wqe.len,
                    max: self.sq.max_inline,
                });
            }
            wqe.inline = true;
            let n = wqe.len as usize;
            let pd = self.cfg.pd;
            let area = self.sq.push(wqe, wr.sg_list);
            let res = match area.get_mut(..n) {
                Some(dst) => sgl_read(&*io.mem, pd, wr.sg_list, 0, dst),
                None => Err(MemError::Length),
            };
            if let Err(e) = res {
                // Undo the push: nothing was queued.
                self.sq.tail = self.sq.tail.wrapping_sub(1);
                return Err(TransportError::InlineRead(e));
            }
        } else {
            self.sq.push(wqe, wr.sg_list);
        }
        if matches!(self.state, QpState::Err | QpState::Sqe) {
            self.flush_send(io.cq);
        }
        Ok(())
    }

    /// Queue a receive work request. On an ERR QP it completes at once with
    /// `WR_FLUSH_ERR`.
    pub fn post_recv(&mut self, wr: &RecvWr<'_>, io: &mut Io<'_>) -> Result<(), TransportError> {
        if self.state == QpState::Reset {
            return Err(TransportError::BadState(self.state));
        }
        if wr.sg_list.len() > self.rq.max_sge {
            return Err(TransportError::TooManySge {
                got: wr.sg_list.len(),
                max: self.rq.max_sge,
            });
        }
        if self.rq.is_full() {
            return Err(TransportError::QueueFull(CqSide::Recv));
        }
        let wqe = RecvWqe {
            wr_id: wr.wr_id,
            num_sge: wr.sg_list.len(),
            len: sgl_len(wr.sg_list),
        };
        self.rq.push(wqe, wr.sg_list);
        if self.state == QpState::Err {
            self.flush_recv(io.cq);
        }
        Ok(())
    }

    /// The responder takes requests (RTR, RTS, SQD, SQE).
    fn responder_on(&self) -> bool {
        matches!(
            self.state,
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        )
    }

    /// The requester and completer work (RTS; SQD finishes started work).
    pub(crate) fn sender_on(&self) -> bool {
        matches!(self.state, QpState::Rts | QpState::Sqd)
    }

    /// Handle one received RoCE packet (BTH‥ICRC, ICRC already verified by
    /// the caller) from `src` at `now`, addressed to the QP's own GID
    /// ([`QpConfig::local_gid`]). Bad packets are dropped or NAKed and
    /// counted; nothing here panics.
    pub fn receive(&mut self, now: Instant, packet: &[u8], src: Gid, io: &mut Io<'_>) {
        let dst = self.cfg.local_gid;
        self.receive_at(now, packet, src, dst, io);
    }

    /// [`Qp::receive`] for a packet that arrived at local GID `dst` (a
    /// device with several addresses: a UD receive's GRH area names the
    /// address the datagram was sent to, as kernel rxe copies it from the
    /// received IP header).
    pub fn receive_at(&mut self, now: Instant, packet: &[u8], src: Gid, dst: Gid, io: &mut Io<'_>) {
        self.stats.rx_packets += 1;
        self.stats.rx_bytes += packet.len() as u64;
        let p = match pkt::parse(packet) {
            Ok(p) => p,
            Err(ParseError::Truncated) => {
                self.stats.drops.truncated += 1;
                return;
            }
            Err(ParseError::UnknownOpcode) => {
                self.stats.drops.bad_opcode += 1;
                return;
            }
            Err(ParseError::BadHeader) => {
                self.stats.drops.bad_header += 1;
                return;
            }
        };
        self.receive_pkt(now, &p, src, dst, io);
    }

    /// [`Qp::receive_at`] after the parse (inlined there: one function for
    /// the hot receive path, as before the placed entry shared it).
    #[inline(always)]
    pub(crate) fn receive_pkt(
        &mut self,
        now: Instant,
        p: &pkt::Pkt<'_>,
        src: Gid,
        dst: Gid,
        io: &mut Io<'_>,
    ) {
        if p.dest_qp != self.cfg.qpn {
            self.stats.drops.wrong_qpn += 1;
            return;
        }
        let ud_pkt = p.any(pkt::f::UD);
        if ud_pkt != (self.cfg.qp_type == QpType::Ud) {
            self.stats.drops.bad_opcode += 1;
            return;
        }
        if ud_pkt {
            if self.responder_on() {
                self.ud_receive(p, src, dst, io);
            } else {
                self.stats.drops.bad_state += 1;
            }
            return;
        }
        // Kernel rxe's check_addr (rxe_recv.c): a connected QP (RTR on, its
        // address vector set) takes requests and responses only from the
        // peer that address vector names; anyone else's are dropped before
        // the PSN check, so they cannot complete receives, move the PSN or
        // touch memory.
        if self.responder_on() && src != self.a.av.dgid {
            self.stats.drops.wrong_source += 1;
            return;
        }
        if p.any(pkt::f::RESPONSE) {
            if self.sender_on() {
                self.complete_response(now, p, io);
            } else {
                self.stats.drops.bad_state += 1;
            }
        } else if self.responder_on() {
            self.respond(p, io);
        } else {
            self.stats.drops.bad_state += 1;
        }
        self.run(now, io);
    }

    /// The doorbell: send what the requester may, continue a pending READ
    /// reply. Idempotent; cheap when there is nothing to do.
    pub fn run(&mut self, now: Instant, io: &mut Io<'_>) {
        if self.responder_on() {
            self.continue_reply(io);
        }
        if self.sender_on() {
            match self.cfg.qp_type {
                QpType::Ud => self.ud_send(io),
                _ => self.request(now, io),
            }
        }
    }

    /// When [`Qp::on_timer`] next has work to do (`None`: no timer pending).
    pub fn next_deadline(&self) -> Option<Instant> {
        if !self.sender_on() {
            return None;
        }
        match (self.comp.timer, self.comp.rnr_until) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Run the timers that are due at `now` (ACK timeout, RNR wait), then
    /// the doorbell.
    pub fn on_timer(&mut self, now: Instant, io: &mut Io<'_>) {
        if self.sender_on() {
            self.completer_timers(now, io);
        }
        self.run(now, io);
    }

    /// Move to ERR and flush every posted WQE.
    pub(crate) fn enter_error(&mut self, cq: &mut dyn super::CompletionSink) {
        self.state = QpState::Err;
        self.resp.reply = None;
        self.flush_send(cq);
        self.flush_recv(cq);
    }

    /// Complete every posted send WQE with `WR_FLUSH_ERR`; stop the timers.
    fn flush_send(&mut self, cq: &mut dyn super::CompletionSink) {
        while self.sq.len() > 0 {
            let head = self.sq.head;
            self.complete_send(head, WcStatus::WrFlushErr, cq);
        }
        self.req.idx = self.sq.head;
        self.req.pkt = 0;
        self.req.rd_atomic = 0;
        self.comp.timer = None;
        self.comp.rnr_until = None;
    }

    /// Complete every posted receive WQE with `WR_FLUSH_ERR`.
    fn flush_recv(&mut self, cq: &mut dyn super::CompletionSink) {
        self.resp.recv_in_use = false;
        while let Some(w) = self.rq.front() {
            cq.complete(
                CqSide::Recv,
                WorkCompletion {
                    wr_id: w.wr_id,
                    status: WcStatus::WrFlushErr,
                    opcode: WcOpcode::Recv,
                    qp_num: self.cfg.qpn,
                    ..WorkCompletion::default()
                },
            );
            self.stats.recv_completions += 1;
            self.rq.pop();
        }
    }

    /// Retire the head send WQE with `status` (a completion when it failed
    /// or was signaled).
    pub(crate) fn complete_send(
        &mut self,
        idx: u32,
        status: WcStatus,
        cq: &mut dyn super::CompletionSink,
    ) {
        let Some(w) = self.sq.get(idx).copied() else {
            return;
        };
        if status != WcStatus::Success || w.signaled {
            cq.complete(
                CqSide::Send,
                WorkCompletion {
                    wr_id: w.wr_id,
                    status,
                    opcode: w.op.wc_opcode(),
                    qp_num: self.cfg.qpn,
                    byte_len: u32::try_from(w.len).unwrap_or(u32::MAX),
                    retired_unsignaled: std::mem::take(&mut self.silent),
                    ..WorkCompletion::default()
                },
            );
        } else {
            self.silent = self.silent.saturating_add(1);
        }
        self.stats.send_completions += 1;
        if w.is_rd_atomic() && w.npkts > 0 {
            self.req.rd_atomic = self.req.rd_atomic.saturating_sub(1);
        }
        self.sq.pop();
    }

    /// Count one outgoing packet built by `transmit`.
    pub(crate) fn count_tx(&mut self, t: &Tx) {
        if let Tx::Sent(n) = t {
            self.stats.tx_packets += 1;
            self.stats.tx_bytes += *n as u64;
        }
    }

    /// The destination of packets to the connected peer.
    pub(crate) fn peer(&self) -> PacketDest {
        PacketDest {
            av: self.a.av,
            qpn: self.a.dest_qpn,
        }
    }
}
