//! The RC completer (§8): retires send WQEs from ACKs, READ responses and
//! atomic ACKs; handles NAKs, RNR waits, the local ACK timer and retries.

use core::time::Duration;

use rnic_core::qp::{ack_timeout_delay, rnr_timer_delay};
use rnic_core::{Psn, WcStatus};

use super::pkt::{Pkt, f, syndrome};
use super::qp::Qp;
use super::queue::{WqeStatus, sgl_write};
use super::{Instant, Io};

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

/// What a response's AETH says.
enum Kind {
    ReadData,
    AtomicAck,
    Ack,
    Rnr(u8),
    Nak(u8),
}

impl Qp {
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
                    let n = p.payload.len() as u64;
                    let ok = if p.is(f::LAST) {
                        n == remaining
                    } else {
                        n == mtu && remaining > mtu
                    };
                    if !ok {
                        self.stats.drops.bad_response += 1;
                    } else {
                        let sges = self.sq.sges(head);
                        if sgl_write(io.mem, self.cfg.pd, sges, off, p.payload).is_err() {
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
