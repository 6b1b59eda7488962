//! The RC completer (§8): retires send WQEs from ACKs, READ responses and
//! atomic ACKs; handles NAKs, RNR waits, the local ACK timer and retries.

use core::time::Duration;

use rnic_core::qp::{ack_timeout_delay, rnr_timer_delay};
use rnic_core::{Gid, Psn, QpType, Qpn, WcStatus};

use super::pkt::{self, Pkt, f, op, syndrome};
use super::qp::Qp;
use super::qp::{KeyPiece, MAX_PIECES};
use super::queue::{WqeStatus, sgl_write};
use super::requester::WINDOW_REGROW;
use super::{Access, Instant, Io, MemoryAccess, Piece};

/// Completer state.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Completer {
    /// Oldest unacknowledged PSN.
    pub psn: Psn,
    /// Transport retries left (reset on progress).
    pub retry_left: u8,
    /// RNR retries left (reset on progress).
    pub rnr_left: u8,
    /// Local ACK timer.
    pub timer: Option<Instant>,
    /// End of an RNR wait.
    pub rnr_until: Option<Instant>,
    /// A retry from this PSN is under way: sequence NAKs and read gaps for
    /// the same PSN do not start another.
    pub retrying: Option<Psn>,
    /// The next READ response must be a MIDDLE or LAST.
    pub read_cont: bool,
}

/// Where the READ responses a QP expects next put their payloads
/// ([`Qp::read_placement`]): what a receive path needs to receive them
/// straight into the READ's local buffer (which belongs to the transport
/// until the READ completes) and hand the QP only their headers
/// ([`Qp::receive_placed`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadPlacement {
    /// The QP (the responses' BTH DestQP).
    pub qpn: Qpn,
    /// The PSN expected next.
    pub psn: Psn,
    /// Responses left, `psn`'s included (the last is the READ's LAST or
    /// ONLY).
    pub left: u32,
    /// The response at `psn` opens the READ (FIRST or ONLY).
    pub opens: bool,
    /// The READ's message offset of `psn`'s payload.
    pub offset: u64,
    /// Payload bytes left from `offset`.
    pub bytes: u64,
    /// Payload bytes of every response but the READ's last (the path MTU).
    pub mtu: u32,
    /// The READ's send-queue slot and first PSN: a placed response is
    /// taken only while they still name the head (`receive_placed`).
    head: u32,
    first_psn: Psn,
}

/// One response a [`ReadPlacement`] expects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpectedResponse {
    /// Its PSN.
    pub psn: Psn,
    /// Its opcode.
    pub opcode: u8,
    /// Header bytes (BTH, AETH where the opcode has one).
    pub header: usize,
    /// The READ's message offset of its payload.
    pub offset: u64,
    /// Payload bytes.
    pub payload: usize,
    /// Pad bytes after the payload.
    pub pad: usize,
}

impl ExpectedResponse {
    /// Bytes on the wire: headers, payload, pad, ICRC.
    pub fn len(&self) -> usize {
        pkt::packet_len(self.opcode, self.payload)
    }

    /// Never empty (a header and an ICRC at least).
    pub fn is_empty(&self) -> bool {
        false
    }
}

impl ReadPlacement {
    /// The `k`-th response from [`ReadPlacement::psn`] (`None` past the
    /// READ's last).
    pub fn response(&self, k: u32) -> Option<ExpectedResponse> {
        if k >= self.left {
            return None;
        }
        let first = k == 0 && self.opens;
        let last = k + 1 == self.left;
        let opcode = match (first, last) {
            (true, true) => op::READ_RESP_ONLY,
            (true, false) => op::READ_RESP_FIRST,
            (false, true) => op::READ_RESP_LAST,
            (false, false) => op::READ_RESP_MIDDLE,
        };
        let at = u64::from(k) * u64::from(self.mtu);
        let payload = if last {
            self.bytes.checked_sub(at)?
        } else {
            u64::from(self.mtu)
        };
        let payload = usize::try_from(payload).ok()?;
        Some(ExpectedResponse {
            psn: self.psn.wrapping_add(k),
            opcode,
            header: pkt::header_len(opcode),
            offset: self.offset + at,
            payload,
            pad: pkt::pad_for(payload),
        })
    }
}

/// What a response's AETH says.
enum Kind {
    ReadData,
    AtomicAck,
    Ack,
    Rnr(u8),
    Nak(u8),
}

impl Qp {
    /// Where the READ responses this QP expects next go: `Some` while an RC
    /// QP whose requester is on waits for response data of the READ at the
    /// head of its send queue, from the completer's PSN on, and the opcode
    /// of that PSN is certain (not right after a retry from the middle of
    /// a READ, which a responder may answer as a new READ or as the
    /// continuation).
    pub fn read_placement(&self) -> Option<ReadPlacement> {
        if self.cfg.qp_type != QpType::Rc || !self.sender_on() {
            return None;
        }
        let head = self.sq.head;
        let w = self.sq.get(head)?;
        if w.status != WqeStatus::Started || !w.is_read() || w.len == 0 {
            return None;
        }
        let psn = self.comp.psn;
        if !w.holds(psn) || !psn.is_before(self.req.sent_hi) {
            return None;
        }
        let k = w.first_psn.distance_to(psn).unsigned_abs();
        let opens = k == 0 && !self.comp.read_cont;
        if !opens && !self.comp.read_cont {
            return None;
        }
        let mtu = self.a.path_mtu.bytes();
        let offset = u64::from(k) * u64::from(mtu);
        Some(ReadPlacement {
            qpn: self.cfg.qpn,
            psn,
            left: w.npkts.checked_sub(k)?,
            opens,
            offset,
            bytes: w.len.checked_sub(offset)?,
            mtu,
            head,
            first_psn: w.first_psn,
        })
    }

    /// The READ's local buffer from message offset `offset`, `len` bytes,
    /// as pieces of registered memory that offers direct access (checked
    /// for the SGEs' L_Keys and local write access as the copy would be),
    /// into `out`; how many. `None` when `rp` no longer describes the head
    /// or a piece's memory offers no direct access, the range spans more
    /// SGEs than `out` holds (or than 4), or a key does not validate (the copy then
    /// reports that).
    pub fn read_pieces<'m>(
        &self,
        mem: &'m dyn MemoryAccess,
        rp: &ReadPlacement,
        offset: u64,
        len: usize,
        out: &mut [Option<Piece<'m>>],
    ) -> Option<usize> {
        if !self.names_head(rp) {
            return None;
        }
        let mut keys = [KeyPiece::EMPTY; MAX_PIECES];
        let room = out.len().min(MAX_PIECES);
        let n = self
            .sq
            .payload_pieces(rp.head, offset, len, keys.get_mut(..room)?)?;
        for (slot, k) in out.iter_mut().zip(keys.iter().take(n)) {
            let (m, off) = mem
                .lend(self.cfg.pd, k.key, k.addr, k.len as u64, Access::LocalWrite)
                .ok()??;
            *slot = Some(Piece {
                mem: m,
                offset: off,
                len: k.len,
            });
        }
        Some(n)
    }

    /// `rp` still describes the READ at the head of the send queue.
    fn names_head(&self, rp: &ReadPlacement) -> bool {
        self.sq.head == rp.head
            && self
                .sq
                .get(rp.head)
                .is_some_and(|w| w.first_psn == rp.first_psn && w.is_read())
    }

    /// A READ response `rp` predicted, whose `placed` payload bytes (and pad)
    /// the receive path has put into the READ's local buffer where
    /// [`Qp::read_pieces`] said (its ICRC verified over them there): handle
    /// it from its `header` (BTH, AETH) as [`Qp::receive_at`] handles the
    /// whole packet, without writing the payload again. `false`, with
    /// nothing changed, when `rp` no longer names the head READ or the
    /// header is not a READ response whose pad fits `placed`: the caller
    /// then hands over the whole packet instead.
    #[allow(clippy::too_many_arguments)]
    pub fn receive_placed(
        &mut self,
        now: Instant,
        rp: &ReadPlacement,
        header: &[u8],
        placed: usize,
        src: Gid,
        dst: Gid,
        io: &mut Io<'_>,
    ) -> bool {
        if !self.names_head(rp) {
            return false;
        }
        let Ok(p) = pkt::parse_placed(header, placed) else {
            return false;
        };
        let pad = header.get(1).map_or(0, |b| usize::from((b >> 4) & 3));
        self.stats.rx_packets += 1;
        self.stats.rx_bytes += (header.len() + placed + pad + pkt::ICRC_LEN) as u64;
        self.receive_pkt(now, &p, src, dst, io);
        true
    }

    /// Handle one response packet (RTS only).
    pub(crate) fn complete_response(&mut self, now: Instant, p: &Pkt<'_>, io: &mut Io<'_>) {
        if !p.psn.is_before(self.req.sent_hi) {
            self.stats.drops.bad_response_psn += 1;
            return;
        }
        if p.psn.is_before(self.comp.psn) {
            self.stats.duplicate_responses += 1;
            return;
        }
        let kind = if p.any(f::AETH) {
            match p.aeth_syndrome >> 5 {
                0 if p.any(f::READ_RESP) => Kind::ReadData,
                0 if p.any(f::ATOMIC_ACK) => Kind::AtomicAck,
                0 => Kind::Ack,
                1 if p.any(f::ACK) => Kind::Rnr(p.aeth_syndrome & 0x1f),
                3 if p.any(f::ACK) => Kind::Nak(p.aeth_syndrome),
                _ => {
                    self.stats.drops.bad_response += 1;
                    return;
                }
            }
        } else {
            Kind::ReadData
        };
        let mut progress = false;
        let mut retry = false;
        // Implicit acknowledgement of every WQE that ends before the response.
        let w = loop {
            let head = self.sq.head;
            let Some(w) = self.sq.get(head).copied() else {
                self.stats.drops.bad_response_psn += 1;
                return;
            };
            if w.status != WqeStatus::Started {
                self.stats.drops.bad_response_psn += 1;
                return;
            }
            if !p.psn.is_after(w.last_psn()) {
                break w;
            }
            if w.is_rd_atomic() {
                // Its response was lost: ask again.
                self.stats.drops.bad_response_psn += 1;
                self.after_progress(now, progress, io);
                self.gap_retry(now, io);
                return;
            }
            self.complete_send(head, WcStatus::Success, io.cq);
            self.comp.psn = w.last_psn().next();
            progress = true;
        };
        let head = self.sq.head;
        let mtu = u64::from(self.a.path_mtu.bytes());
        if matches!(kind, Kind::Rnr(_) | Kind::Nak(_)) && w.is_rd_atomic() && p.psn != self.comp.psn
        {
            // Only a READ's own response data, PSN by PSN and in order,
            // retires its PSNs (and only the atomic ACK an atomic's). A NAK
            // or RNR NAK naming a PSN inside the range must not move the
            // completer past data that never arrived: as kernel rxe
            // (rxe_comp.c check_psn: a response beyond comp.psn while a
            // READ/atomic is at the head is a retry from comp.psn), ask
            // again from the first missing PSN.
            self.stats.drops.bad_response_psn += 1;
            self.after_progress(now, progress, io);
            self.gap_retry(now, io);
            return;
        }
        match kind {
            Kind::ReadData => {
                if !w.is_read() {
                    self.stats.drops.bad_response += 1;
                } else if p.psn != self.comp.psn {
                    self.stats.drops.bad_response_psn += 1;
                    retry = true;
                } else if !p.is(f::FIRST) && !self.comp.read_cont && p.psn == w.first_psn {
                    // A READ's first response must be FIRST/ONLY. After a retry
                    // from the middle (a new request from the first missing
                    // PSN), MIDDLE/LAST at that PSN is accepted too: kernel rxe
                    // replays such a request as the continuation of the
                    // original response (rxe_resp.c, duplicate_request).
                    self.stats.drops.bad_response += 1;
                } else {
                    let off = u64::from(w.first_psn.distance_to(p.psn).unsigned_abs()) * mtu;
                    let remaining = w.len.saturating_sub(off);
                    let n = p.payload_len() as u64;
                    let ok = if p.is(f::LAST) {
                        n == remaining
                    } else {
                        n == mtu && remaining > mtu
                    };
                    if !ok {
                        self.stats.drops.bad_response += 1;
                    } else {
                        let sges = self.sq.sges(head);
                        // A placed payload is where this write would put it
                        // (`Qp::receive_placed` checked the prediction).
                        if p.placed == 0
                            && sgl_write(io.mem, self.cfg.pd, sges, off, p.payload).is_err()
                        {
                            self.fail_head(WcStatus::LocProtErr, io);
                            return;
                        }
                        self.stats.acks_received += 1;
                        self.comp.psn = p.psn.next();
                        self.comp.read_cont = !p.is(f::LAST);
                        progress = true;
                        if p.is(f::LAST) {
                            self.complete_send(head, WcStatus::Success, io.cq);
                        }
                    }
                }
            }
            Kind::AtomicAck => {
                if !w.is_atomic() || p.psn != w.first_psn {
                    self.stats.drops.bad_response += 1;
                } else {
                    let bytes = p.atomic_orig.to_ne_bytes();
                    let sges = self.sq.sges(head);
                    if sgl_write(io.mem, self.cfg.pd, sges, 0, &bytes).is_err() {
                        self.fail_head(WcStatus::LocProtErr, io);
                        return;
                    }
                    self.stats.acks_received += 1;
                    self.comp.psn = p.psn.next();
                    progress = true;
                    self.complete_send(head, WcStatus::Success, io.cq);
                }
            }
            Kind::Ack => {
                if w.is_rd_atomic() {
                    // The responder has the request; its data is what retires it.
                    self.stats.duplicate_responses += 1;
                } else {
                    self.stats.acks_received += 1;
                    self.comp.psn = p.psn.next();
                    progress = true;
                    if p.psn == w.last_psn() {
                        self.complete_send(head, WcStatus::Success, io.cq);
                    }
                }
            }
            Kind::Rnr(code) => {
                self.stats.naks_received.rnr += 1;
                if p.psn != self.comp.psn {
                    self.comp.psn = p.psn;
                    self.reset_retry_counters();
                }
                if self.comp.rnr_left == 0 {
                    self.fail_head(WcStatus::RnrRetryExcErr, io);
                    return;
                }
                if self.comp.rnr_left != 7 {
                    self.comp.rnr_left -= 1;
                }
                self.stats.rnr_waits += 1;
                self.comp.timer = None;
                let delay = rnr_timer_delay(code).unwrap_or(Duration::from_micros(10));
                self.comp.rnr_until = Some(now.after(delay));
                self.rewind();
                return;
            }
            Kind::Nak(syn) => {
                let status = match syn {
                    syndrome::NAK_PSN_SEQ => {
                        self.stats.naks_received.psn_seq += 1;
                        if p.psn != self.comp.psn {
                            self.comp.psn = p.psn;
                            progress = true;
                        }
                        self.after_progress(now, progress, io);
                        if self.sender_on() && self.comp.retrying != Some(p.psn) {
                            self.start_retry(now, true, io);
                        }
                        return;
                    }
                    syndrome::NAK_INVALID_REQ => {
                        self.stats.naks_received.invalid_request += 1;
                        WcStatus::RemInvReqErr
                    }
                    syndrome::NAK_REMOTE_ACCESS => {
                        self.stats.naks_received.remote_access += 1;
                        WcStatus::RemAccessErr
                    }
                    syndrome::NAK_REMOTE_OP => {
                        self.stats.naks_received.remote_op += 1;
                        WcStatus::RemOpErr
                    }
                    _ => {
                        self.stats.drops.bad_response += 1;
                        self.after_progress(now, progress, io);
                        return;
                    }
                };
                self.fail_head(status, io);
                return;
            }
        }
        self.after_progress(now, progress, io);
        if retry {
            self.gap_retry(now, io);
        }
    }

    /// Bookkeeping after a response: reset retry counters, re-arm or stop
    /// the timer, keep the requester ahead of the completer, fail a head
    /// WQE that failed locally.
    fn after_progress(&mut self, now: Instant, progress: bool, io: &mut Io<'_>) {
        if progress {
            self.reset_retry_counters();
            self.req.window_cut = self.req.window_cut.saturating_sub(WINDOW_REGROW);
            self.comp.retrying = None;
            self.comp.timer = if self.outstanding() {
                ack_timeout_delay(self.a.timeout).map(|d| now.after(d))
            } else {
                None
            };
            self.sync_requester();
        }
        self.retire_failed_head(io);
    }

    fn reset_retry_counters(&mut self) {
        self.comp.retry_left = self.a.retry_cnt;
        self.comp.rnr_left = self.a.rnr_retry;
    }

    /// A started WQE is waiting for its acknowledgement.
    pub(crate) fn outstanding(&self) -> bool {
        self.sq
            .get(self.sq.head)
            .is_some_and(|w| w.status == WqeStatus::Started)
    }

    /// After a late ACK moved the completer past the requester's position
    /// (possible after a rewind), move the requester forward.
    fn sync_requester(&mut self) {
        let behind = self.req.idx.wrapping_sub(self.sq.head) > self.sq.len();
        if behind {
            self.req.idx = self.sq.head;
            self.req.pkt = 0;
        }
        if self.req.idx == self.sq.head
            && let Some(w) = self.sq.get(self.sq.head)
            && w.status == WqeStatus::Started
            && w.holds(self.comp.psn)
        {
            let k = w.first_psn.distance_to(self.comp.psn).unsigned_abs();
            self.req.pkt = self.req.pkt.max(k);
        }
    }

    /// Go-back-N: move the requester back to the completer's PSN.
    fn rewind(&mut self) {
        self.req.idx = self.sq.head;
        self.req.pkt = 0;
        self.req.noack = 0;
        self.comp.read_cont = false;
        self.sync_requester();
    }

    /// Start a retry; `counted` ones use up `retry_cnt` and fail the head
    /// WQE with `RETRY_EXC_ERR` when none are left.
    pub(crate) fn start_retry(&mut self, now: Instant, counted: bool, io: &mut Io<'_>) {
        let _ = now;
        if counted {
            if self.comp.retry_left == 0 {
                self.fail_head(WcStatus::RetryExcErr, io);
                return;
            }
            let infinite = self.comp.retry_left == 7 && self.cfg.retry_cnt_7_infinite;
            if !infinite {
                self.comp.retry_left -= 1;
            }
        }
        self.stats.retries += 1;
        if counted {
            // A loss (an RNR wait is the receiver's queue, not the path).
            self.cut_window();
        }
        self.comp.retrying = Some(self.comp.psn);
        self.comp.timer = None;
        self.rewind();
    }

    /// A response showed that an earlier one was lost.
    fn gap_retry(&mut self, now: Instant, io: &mut Io<'_>) {
        if self.sender_on() && self.comp.retrying != Some(self.comp.psn) {
            self.start_retry(now, true, io);
        }
    }

    /// Fire the timers due at `now`.
    pub(crate) fn completer_timers(&mut self, now: Instant, io: &mut Io<'_>) {
        if let Some(t) = self.comp.rnr_until
            && now >= t
        {
            self.comp.rnr_until = None;
            self.start_retry(now, false, io);
        }
        if let Some(t) = self.comp.timer
            && now >= t
        {
            self.comp.timer = None;
            if self.outstanding() {
                self.stats.timeouts += 1;
                self.start_retry(now, true, io);
            }
        }
    }

    /// Fail the head WQE with `status` and move the QP to ERR.
    pub(crate) fn fail_head(&mut self, status: WcStatus, io: &mut Io<'_>) {
        let head = self.sq.head;
        self.complete_send(head, status, io.cq);
        self.enter_error(io.cq);
    }

    /// A WQE that failed its local checks fails when it reaches the head.
    pub(crate) fn retire_failed_head(&mut self, io: &mut Io<'_>) {
        if let Some(w) = self.sq.get(self.sq.head)
            && let WqeStatus::Failed(st) = w.status
        {
            self.fail_head(st, io);
        }
    }
}
