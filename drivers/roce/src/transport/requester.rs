//! The RC requester (§8): turns send WQEs into request packets.
//!
//! Position: `idx` (the WQE being sent) and `pkt` (its next packet). PSNs
//! are assigned when a WQE starts and never change, so a retry only moves
//! the position back (see `Completer::start_retry`).

use rnic_core::qp::ack_timeout_delay;
use rnic_core::{Psn, QpState, SendFlags, SendOp, WcStatus};

use super::pkt::{AtomicEth, Out, Reth, op};
use super::qp::{KeyPiece, MAX_MSG, MAX_PIECES, Qp, Tx, transmit, transmit_gather};
use super::queue::{SendWqe, WqeStatus, sgl_check, sgl_len};
use super::{Access, Instant, Io};

/// At most this many PSNs unacknowledged by default (`RXE_MAX_UNACKED_PSNS`);
/// [`QpConfig::max_unacked_psns`](super::QpConfig::max_unacked_psns) sets it
/// per QP.
pub const DEFAULT_MAX_UNACKED_PSNS: u32 = 128;
/// The largest window a QP may ask for (a quarter of the 24-bit PSN space,
/// so windowed PSN comparisons stay unambiguous).
const MAX_WINDOW: u32 = 1 << 22;
/// AckReq at least every this many packets (`RXE_MAX_PKT_PER_ACK`).
pub(crate) const MAX_PKT_PER_ACK: u32 = 64;

/// Requester state.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Requester {
    /// Send-ring index of the WQE being sent.
    pub idx: u32,
    /// Packet index inside it.
    pub pkt: u32,
    /// PSN the next WQE to start gets.
    pub next_psn: Psn,
    /// One past the highest PSN ever sent (responses beyond it are bogus).
    pub sent_hi: Psn,
    /// Packets since the last AckReq.
    pub noack: u32,
    /// Started, unretired READ/atomic WQEs.
    pub rd_atomic: u32,
    /// How far a loss cut the window below
    /// [`QpConfig::max_unacked_psns`](super::QpConfig::max_unacked_psns):
    /// see [`Qp::window`].
    pub window_cut: u32,
}

/// A retry halves the window down to at most this (rxe's own window, or
/// the configured one if smaller).
pub(crate) const WINDOW_FLOOR: u32 = DEFAULT_MAX_UNACKED_PSNS;
/// Each response that advances the completer gives back this many PSNs of
/// a cut window: from half of 1024 to all of it in 64 acknowledgements
/// (4096 PSNs at rxe's AckReq cadence).
pub(crate) const WINDOW_REGROW: u32 = 8;

impl Qp {
    /// The requester's window in PSNs now: the configured
    /// [`max_unacked_psns`](super::QpConfig::max_unacked_psns) while no
    /// packet is lost. A retry (a NAK for a sequence error, a gap in READ
    /// responses, a timeout) halves it, down to rxe's 128 (or the configured
    /// window if smaller), and every response that advances the completer
    /// gives [`WINDOW_REGROW`] PSNs back, up to the configured window: a
    /// large window keeps a fast path full, and a receiver that drops part
    /// of it (a small socket buffer, a congested link) soon gets what rxe
    /// itself sends.
    pub fn window(&self) -> u32 {
        let (full, floor) = self.window_bounds();
        full.saturating_sub(self.req.window_cut).max(floor)
    }

    /// The configured window and the least a loss leaves of it.
    fn window_bounds(&self) -> (u32, u32) {
        let full = self.cfg.max_unacked_psns.clamp(1, MAX_WINDOW);
        (full, full.min(WINDOW_FLOOR))
    }

    /// Halve the window after a loss ([`Qp::window`]).
    pub(crate) fn cut_window(&mut self) {
        let (full, floor) = self.window_bounds();
        let now = self.window();
        let halved = (now / 2).max(floor);
        if halved < now {
            self.stats.window_cuts += 1;
        }
        self.req.window_cut = full - halved;
    }

    /// Send as much as the window, `max_rd_atomic`, fences and the sink allow.
    pub(crate) fn request(&mut self, now: Instant, io: &mut Io<'_>) {
        let mtu = u64::from(self.a.path_mtu.bytes());
        let window = self.window() as i32;
        loop {
            if self.comp.rnr_until.is_some() {
                return;
            }
            let idx = self.req.idx;
            let Some(w) = self.sq.get(idx).copied() else {
                return;
            };
            let w = match w.status {
                WqeStatus::Failed(_) => return,
                WqeStatus::Started => w,
                WqeStatus::Posted => {
                    if self.state == QpState::Sqd {
                        return;
                    }
                    if w.flags.contains(SendFlags::FENCE) && idx != self.sq.head {
                        return;
                    }
                    let max_rd = u32::from(self.a.max_rd_atomic.max(1));
                    if w.is_rd_atomic() && self.req.rd_atomic >= max_rd {
                        return;
                    }
                    if let Err(st) = self.validate(idx, io) {
                        if let Some(wm) = self.sq.get_mut(idx) {
                            wm.status = WqeStatus::Failed(st);
                        }
                        self.retire_failed_head(io);
                        return;
                    }
                    if self.comp.psn.distance_to(self.req.next_psn) >= window {
                        return;
                    }
                    let npkts = if w.is_atomic() {
                        1
                    } else {
                        self.a.path_mtu.packets_for(w.len) as u32
                    };
                    let first = self.req.next_psn;
                    let Some(wm) = self.sq.get_mut(idx) else {
                        return;
                    };
                    wm.status = WqeStatus::Started;
                    wm.first_psn = first;
                    wm.npkts = npkts;
                    let started = *wm;
                    self.req.next_psn = first.wrapping_add(npkts);
                    self.req.pkt = 0;
                    if started.is_rd_atomic() {
                        self.req.rd_atomic += 1;
                    }
                    started
                }
            };
            let psn = w.first_psn.wrapping_add(self.req.pkt);
            if self.comp.psn.distance_to(psn) >= window {
                return;
            }
            let (out, paylen, off) = self.build_request(&w, mtu);
            let dest = self.peer();
            let pd = self.cfg.pd;
            let sq = &self.sq;
            let mem = &*io.mem;
            // In place when the sink takes this size and the memory lends
            // itself; else copied into the sink's buffer.
            let mut keys = [KeyPiece::EMPTY; MAX_PIECES];
            let gathered = if paylen >= io.tx.gather_min() {
                sq.payload_pieces(idx, off, paylen, &mut keys)
                    .and_then(|n| transmit_gather(io.tx, mem, pd, &out, paylen, &dest, &keys[..n]))
            } else {
                None
            };
            let t = match gathered {
                Some(t) => t,
                None => transmit(io.tx, &out, paylen, &dest, |buf| {
                    sq.read_payload(mem, pd, idx, off, buf)
                }),
            };
            self.count_tx(&t);
            match t {
                Tx::Full => return,
                Tx::Fill => {
                    if let Some(wm) = self.sq.get_mut(idx) {
                        wm.status = WqeStatus::Failed(WcStatus::LocProtErr);
                    }
                    self.retire_failed_head(io);
                    return;
                }
                Tx::Sent(_) => {}
            }
            let span = if w.is_read() {
                w.npkts.saturating_sub(self.req.pkt).max(1)
            } else {
                1
            };
            if psn.is_before(self.req.sent_hi) {
                self.stats.retransmits += 1;
            }
            let end = psn.wrapping_add(span);
            if end.is_after(self.req.sent_hi) {
                self.req.sent_hi = end;
            }
            if self.comp.timer.is_none() {
                self.comp.timer = ack_timeout_delay(self.a.timeout).map(|d| now.after(d));
            }
            if w.is_rd_atomic() || self.req.pkt + 1 >= w.npkts {
                self.req.idx = idx.wrapping_add(1);
                self.req.pkt = 0;
            } else {
                self.req.pkt += 1;
            }
        }
    }

    /// L_Key and length checks at WQE start.
    fn validate(&self, idx: u32, io: &Io<'_>) -> Result<(), WcStatus> {
        let Some(w) = self.sq.get(idx) else {
            return Err(WcStatus::LocQpOpErr);
        };
        if w.len > MAX_MSG {
            return Err(WcStatus::LocLenErr);
        }
        let access = if w.is_rd_atomic() {
            Access::LocalWrite
        } else {
            Access::LocalRead
        };
        if w.is_atomic() && sgl_len(self.sq.sges(idx)) < 8 {
            return Err(WcStatus::LocLenErr);
        }
        if !w.inline {
            sgl_check(&*io.mem, self.cfg.pd, self.sq.sges(idx), access)
                .map_err(|_| WcStatus::LocProtErr)?;
        }
        Ok(())
    }

    /// Headers of packet `self.req.pkt` of `w`, its payload length and the
    /// payload's offset in the message.
    fn build_request(&mut self, w: &SendWqe, mtu: u64) -> (Out, usize, u64) {
        let k = self.req.pkt;
        let off = u64::from(k) * mtu;
        let remaining = w.len.saturating_sub(off);
        let last = k + 1 >= w.npkts;
        let first = k == 0;
        let paylen = remaining.min(mtu) as usize;
        let mut o = Out {
            dest_qp: self.a.dest_qpn,
            psn: w.first_psn.wrapping_add(k),
            ..Out::default()
        };
        let solicited = w.flags.contains(SendFlags::SOLICITED);
        let pick = |only: u8, f: u8, m: u8, l: u8| match (first, last) {
            (true, true) => only,
            (true, false) => f,
            (false, false) => m,
            (false, true) => l,
        };
        let (paylen, end) = match w.op {
            SendOp::Send => {
                o.opcode = pick(
                    op::SEND_ONLY,
                    op::SEND_FIRST,
                    op::SEND_MIDDLE,
                    op::SEND_LAST,
                );
                o.se = last && solicited;
                (paylen, last)
            }
            SendOp::SendWithImm { imm } => {
                o.opcode = pick(
                    op::SEND_ONLY_IMM,
                    op::SEND_FIRST,
                    op::SEND_MIDDLE,
                    op::SEND_LAST_IMM,
                );
                o.imm = imm;
                o.se = last && solicited;
                (paylen, last)
            }
            SendOp::SendWithInv { rkey } => {
                o.opcode = pick(
                    op::SEND_ONLY_INV,
                    op::SEND_FIRST,
                    op::SEND_MIDDLE,
                    op::SEND_LAST_INV,
                );
                o.ieth = rkey.get();
                o.se = last && solicited;
                (paylen, last)
            }
            SendOp::RdmaWrite { remote_addr, rkey } => {
                o.opcode = pick(
                    op::WRITE_ONLY,
                    op::WRITE_FIRST,
                    op::WRITE_MIDDLE,
                    op::WRITE_LAST,
                );
                o.reth = reth(remote_addr, off, rkey, remaining);
                (paylen, last)
            }
            SendOp::RdmaWriteWithImm {
                remote_addr,
                rkey,
                imm,
            } => {
                o.opcode = pick(
                    op::WRITE_ONLY_IMM,
                    op::WRITE_FIRST,
                    op::WRITE_MIDDLE,
                    op::WRITE_LAST_IMM,
                );
                o.reth = reth(remote_addr, off, rkey, remaining);
                o.imm = imm;
                o.se = last && solicited;
                (paylen, last)
            }
            SendOp::RdmaRead { remote_addr, rkey } => {
                o.opcode = op::READ_REQUEST;
                o.reth = reth(remote_addr, off, rkey, remaining);
                (0, true)
            }
            SendOp::AtomicCmpSwap {
                remote_addr,
                rkey,
                compare,
                swap,
            } => {
                o.opcode = op::CMP_SWAP;
                o.atomic = AtomicEth {
                    va: remote_addr,
                    rkey,
                    swap_add: swap,
                    compare,
                };
                (0, true)
            }
            SendOp::AtomicFetchAdd {
                remote_addr,
                rkey,
                add,
            } => {
                o.opcode = op::FETCH_ADD;
                o.atomic = AtomicEth {
                    va: remote_addr,
                    rkey,
                    swap_add: add,
                    compare: 0,
                };
                (0, true)
            }
        };
        self.req.noack += 1;
        if end || self.req.noack >= MAX_PKT_PER_ACK {
            o.ack_req = true;
            self.req.noack = 0;
        }
        (o, paylen, off)
    }
}

fn reth(remote_addr: u64, off: u64, rkey: rnic_core::Rkey, remaining: u64) -> Reth {
    Reth {
        va: remote_addr.wrapping_add(off),
        rkey,
        len: u32::try_from(remaining).unwrap_or(u32::MAX),
    }
}
