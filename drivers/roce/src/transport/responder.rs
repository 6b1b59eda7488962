//! The RC responder (§9): executes incoming requests after every check has
//! passed, acknowledges AckReq packets, NAKs errors, replays duplicates.

use rnic_core::{AccessFlags, Psn, Rkey, WcFlags, WcOpcode, WcStatus, WorkCompletion};

use super::pkt::{Out, Pkt, aeth, f, op, syndrome};
use super::qp::{KeyPiece, MAX_MSG, Qp, Tx, transmit, transmit_gather};
use super::queue::{sgl_check, sgl_write};
use super::{Access, AtomicOp, CqSide, Io, MemKey};

/// The message the responder is in the middle of.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Cont {
    /// Between messages: FIRST/ONLY, READ or atomic expected.
    #[default]
    None,
    /// Inside a SEND (the receive WQE at the ring head is being filled).
    Send,
    /// Inside an RDMA WRITE.
    Write,
}

/// What a responder resource remembers for replay.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum ResKind {
    /// Unused slot.
    #[default]
    Empty,
    /// An RDMA READ: replayed by re-reading memory.
    Read { va: u64, rkey: Rkey, len: u64 },
    /// An atomic: replayed from the saved original value.
    Atomic { orig: u64 },
}

/// One slot of the READ/atomic resource ring (`max_dest_rd_atomic` slots).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Resource {
    pub kind: ResKind,
    pub first_psn: Psn,
    pub npkts: u32,
}

/// A READ reply being emitted.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Reply {
    /// PSN of the next response packet.
    pub psn: Psn,
    pub va: u64,
    pub rkey: Rkey,
    /// Bytes still to send.
    pub resid: u64,
    /// A response of this reply has been sent (next is MIDDLE/LAST).
    pub started: bool,
}

/// Responder state.
#[derive(Clone, Debug, Default)]
pub(crate) struct Responder {
    /// Expected PSN.
    pub psn: Psn,
    /// Message sequence number (24 bits).
    pub msn: u32,
    /// A sequence NAK was sent for the current gap.
    pub nak_seq_sent: bool,
    pub cont: Cont,
    /// The receive WQE at the ring head is being filled.
    pub recv_in_use: bool,
    /// Bytes written into it so far.
    pub recv_off: u64,
    /// RDMA WRITE in progress: next VA, key, bytes left, total.
    pub w_va: u64,
    pub w_rkey: Rkey,
    pub w_resid: u64,
    pub w_total: u64,
    pub resources: Vec<Resource>,
    pub res_next: usize,
    pub reply: Option<Reply>,
}

impl Responder {
    pub(crate) fn resize_resources(&mut self, n: usize) {
        self.resources.clear();
        self.resources.resize(n, Resource::default());
        self.res_next = 0;
    }

    pub(crate) fn reset_psn(&mut self, p: Psn) {
        self.psn = p;
        self.nak_seq_sent = false;
        self.cont = Cont::None;
    }

    fn save(&mut self, r: Resource) {
        let n = self.resources.len();
        if n == 0 {
            return;
        }
        if let Some(slot) = self.resources.get_mut(self.res_next % n) {
            *slot = r;
        }
        self.res_next = (self.res_next + 1) % n;
    }
}

/// Why a request is refused (each maps to a NAK).
#[derive(Clone, Copy, Debug)]
enum Refuse {
    InvalidRequest,
    RemoteAccess,
    RemoteOp,
    /// SEND_WITH_INVALIDATE of a key a peer may not invalidate (IBA class J).
    InvalidateRkey,
}

impl Qp {
    /// Handle one request packet (RTR/RTS).
    pub(crate) fn respond(&mut self, p: &Pkt<'_>, io: &mut Io<'_>) {
        if self.resp.reply.is_some() {
            self.stats.drops.busy += 1;
            return;
        }
        let d = self.resp.psn.distance_to(p.psn);
        if d > 0 {
            self.stats.drops.psn_out_of_window += 1;
            if !self.resp.nak_seq_sent {
                self.resp.nak_seq_sent = true;
                let psn = self.resp.psn;
                self.send_ack(syndrome::NAK_PSN_SEQ, psn, io);
            }
            return;
        }
        if d < 0 {
            self.duplicate(p, io);
            return;
        }
        self.resp.nak_seq_sent = false;
        if let Err(r) = self.execute(p, io) {
            let syn = match r {
                Refuse::InvalidRequest => syndrome::NAK_INVALID_REQ,
                Refuse::RemoteAccess => syndrome::NAK_REMOTE_ACCESS,
                Refuse::RemoteOp => syndrome::NAK_REMOTE_OP,
                Refuse::InvalidateRkey => {
                    // Kernel rxe (rxe_resp.c, RESPST_ERR_INVALIDATE_RKEY,
                    // "Class J"): the receive WQE has completed with
                    // REM_INV_REQ_ERR; the packet's AETH stays a plain ACK
                    // (sent if AckReq is set), and the QP moves to ERR.
                    if p.ack_req {
                        self.send_ack(syndrome::ACK_UNLIMITED, p.psn, io);
                    }
                    self.enter_error(io.cq);
                    return;
                }
            };
            self.send_ack(syn, p.psn, io);
            self.enter_error(io.cq);
        }
    }

    /// The in-order path: checks in rxe's order, then the operation.
    /// `Ok` covers RNR (no state change) and success.
    fn execute(&mut self, p: &Pkt<'_>, io: &mut Io<'_>) -> Result<(), Refuse> {
        // Opcode sequence.
        let in_seq = match self.resp.cont {
            Cont::None => p.is(f::FIRST),
            Cont::Send => p.is(f::SEND) && !p.is(f::FIRST),
            Cont::Write => p.is(f::WRITE) && !p.is(f::FIRST),
        };
        if !in_seq {
            return Err(Refuse::InvalidRequest);
        }
        // QP access rights.
        let need = if p.any(f::WRITE) {
            AccessFlags::REMOTE_WRITE
        } else if p.any(f::READ_REQ) {
            AccessFlags::REMOTE_READ
        } else if p.any(f::ATOMIC_REQ) {
            AccessFlags::REMOTE_ATOMIC
        } else {
            AccessFlags::empty()
        };
        if !self.a.access.contains(need) {
            return Err(Refuse::InvalidRequest);
        }
        // Resources: a receive WQE, or a READ/atomic slot.
        if p.is(f::NEEDS_RECV) && self.rq.front().is_none() {
            let syn = syndrome::RNR | (self.a.min_rnr_timer & 0x1f);
            self.send_ack(syn, p.psn, io);
            return Ok(());
        }
        if p.any(f::READ_REQ | f::ATOMIC_REQ) && self.resp.resources.is_empty() {
            return Err(Refuse::InvalidRequest);
        }
        // Lengths.
        let mtu = u64::from(self.a.path_mtu.bytes());
        let n = p.payload.len() as u64;
        let len_ok = match (p.is(f::FIRST), p.is(f::LAST)) {
            (true, true) => n <= mtu,
            (true, false) | (false, false) => n == mtu,
            (false, true) => n >= 1 && n <= mtu,
        };
        if p.any(f::PAYLOAD) && !len_ok {
            return Err(Refuse::InvalidRequest);
        }
        if p.any(f::SEND) {
            self.exec_send(p, io)
        } else if p.any(f::WRITE) {
            self.exec_write(p, io)
        } else if p.any(f::READ_REQ) {
            self.exec_read(p, io)
        } else {
            self.exec_atomic(p, io)
        }
    }

    fn exec_send(&mut self, p: &Pkt<'_>, io: &mut Io<'_>) -> Result<(), Refuse> {
        let Some(recv) = self.rq.front() else {
            return Err(Refuse::InvalidRequest);
        };
        if p.is(f::FIRST) {
            // The whole scatter list must be writable before the first byte lands.
            let sges = self.rq.front_sges();
            if sgl_check(&*io.mem, self.cfg.pd, sges, Access::LocalWrite).is_err() {
                self.complete_recv(recv.wr_id, WcStatus::LocProtErr, WcOpcode::Recv, 0, io);
                return Err(Refuse::RemoteOp);
            }
            self.resp.recv_in_use = true;
            self.resp.recv_off = 0;
        }
        let off = self.resp.recv_off;
        let n = p.payload.len() as u64;
        if off + n > recv.len {
            self.complete_recv(recv.wr_id, WcStatus::LocLenErr, WcOpcode::Recv, 0, io);
            return Err(Refuse::InvalidRequest);
        }
        let sges = self.rq.front_sges();
        if sgl_write(io.mem, self.cfg.pd, sges, off, p.payload).is_err() {
            self.complete_recv(recv.wr_id, WcStatus::LocProtErr, WcOpcode::Recv, 0, io);
            return Err(Refuse::RemoteOp);
        }
        self.resp.recv_off = off + n;
        self.resp.psn = self.resp.psn.next();
        if p.is(f::LAST) {
            let mut inv = None;
            if p.any(f::IETH) {
                // Only a fast-registration MR or a type-2 memory window may
                // be ended by a peer; anything else (a plain reg_mr, an
                // unknown or foreign key) is refused and stays as it was.
                if io.mem.invalidate(self.cfg.pd, p.ieth).is_err() {
                    self.stats.invalidate_refused += 1;
                    self.complete_recv(recv.wr_id, WcStatus::RemInvReqErr, WcOpcode::Recv, 0, io);
                    return Err(Refuse::InvalidateRkey);
                }
                inv = Some(p.ieth);
            }
            let mut wc_flags = WcFlags::empty();
            if p.any(f::IMM) {
                wc_flags |= WcFlags::WITH_IMM;
            }
            if inv.is_some() {
                wc_flags |= WcFlags::WITH_INV;
            }
            let wc = WorkCompletion {
                wr_id: recv.wr_id,
                status: WcStatus::Success,
                opcode: WcOpcode::Recv,
                qp_num: self.cfg.qpn,
                byte_len: u32::try_from(self.resp.recv_off).unwrap_or(u32::MAX),
                imm_data: p.any(f::IMM).then_some(p.imm),
                invalidated_rkey: inv,
                wc_flags,
                ..WorkCompletion::default()
            };
            self.push_recv(wc, io);
            self.resp.msn = (self.resp.msn + 1) & 0x00ff_ffff;
            self.resp.cont = Cont::None;
        } else {
            self.resp.cont = Cont::Send;
        }
        if p.ack_req {
            self.send_ack(syndrome::ACK_UNLIMITED, p.psn, io);
        }
        Ok(())
    }

    fn exec_write(&mut self, p: &Pkt<'_>, io: &mut Io<'_>) -> Result<(), Refuse> {
        let n = p.payload.len() as u64;
        if p.is(f::FIRST) {
            let len = u64::from(p.reth.len);
            if len > MAX_MSG {
                return Err(Refuse::InvalidRequest);
            }
            if len > 0 {
                io.mem
                    .check(
                        self.cfg.pd,
                        MemKey::Remote(p.reth.rkey),
                        p.reth.va,
                        len,
                        Access::RemoteWrite,
                    )
                    .map_err(|_| Refuse::RemoteAccess)?;
            }
            self.resp.w_va = p.reth.va;
            self.resp.w_rkey = p.reth.rkey;
            self.resp.w_resid = len;
            self.resp.w_total = len;
        }
        let resid = self.resp.w_resid;
        let fits = if p.is(f::LAST) { n == resid } else { n < resid };
        if !fits {
            return Err(Refuse::InvalidRequest);
        }
        if n > 0 {
            io.mem
                .write(
                    self.cfg.pd,
                    MemKey::Remote(self.resp.w_rkey),
                    self.resp.w_va,
                    p.payload,
                    Access::RemoteWrite,
                )
                .map_err(|_| Refuse::RemoteAccess)?;
        }
        self.resp.w_va = self.resp.w_va.wrapping_add(n);
        self.resp.w_resid = resid - n;
        self.resp.psn = self.resp.psn.next();
        if p.is(f::LAST) {
            self.resp.msn = (self.resp.msn + 1) & 0x00ff_ffff;
            self.resp.cont = Cont::None;
            if p.any(f::IMM)
                && let Some(recv) = self.rq.front()
            {
                let wc = WorkCompletion {
                    wr_id: recv.wr_id,
                    status: WcStatus::Success,
                    opcode: WcOpcode::RecvRdmaWithImm,
                    qp_num: self.cfg.qpn,
                    byte_len: u32::try_from(self.resp.w_total).unwrap_or(u32::MAX),
                    imm_data: Some(p.imm),
                    wc_flags: WcFlags::WITH_IMM,
                    ..WorkCompletion::default()
                };
                self.push_recv(wc, io);
            }
        } else {
            self.resp.cont = Cont::Write;
        }
        if p.ack_req {
            self.send_ack(syndrome::ACK_UNLIMITED, p.psn, io);
        }
        Ok(())
    }

    fn exec_read(&mut self, p: &Pkt<'_>, io: &mut Io<'_>) -> Result<(), Refuse> {
        let len = u64::from(p.reth.len);
        if len > MAX_MSG {
            return Err(Refuse::InvalidRequest);
        }
        if len > 0 {
            io.mem
                .check(
                    self.cfg.pd,
                    MemKey::Remote(p.reth.rkey),
                    p.reth.va,
                    len,
                    Access::RemoteRead,
                )
                .map_err(|_| Refuse::RemoteAccess)?;
        }
        let npkts = self.a.path_mtu.packets_for(len) as u32;
        self.resp.save(Resource {
            kind: ResKind::Read {
                va: p.reth.va,
                rkey: p.reth.rkey,
                len,
            },
            first_psn: p.psn,
            npkts,
        });
        self.resp.psn = p.psn.wrapping_add(npkts);
        self.resp.msn = (self.resp.msn + 1) & 0x00ff_ffff;
        self.resp.reply = Some(Reply {
            psn: p.psn,
            va: p.reth.va,
            rkey: p.reth.rkey,
            resid: len,
            started: false,
        });
        self.continue_reply(io);
        Ok(())
    }

    fn exec_atomic(&mut self, p: &Pkt<'_>, io: &mut Io<'_>) -> Result<(), Refuse> {
        let a = p.atomic;
        if !a.va.is_multiple_of(8) {
            return Err(Refuse::InvalidRequest);
        }
        let pd = self.cfg.pd;
        io.mem
            .check(pd, MemKey::Remote(a.rkey), a.va, 8, Access::RemoteAtomic)
            .map_err(|_| Refuse::RemoteAccess)?;
        let op = if p.is(f::CMP_SWAP) {
            AtomicOp::CompareSwap {
                compare: a.compare,
                swap: a.swap_add,
            }
        } else {
            AtomicOp::FetchAdd { add: a.swap_add }
        };
        let orig = io
            .mem
            .atomic(pd, a.rkey, a.va, op)
            .map_err(|_| Refuse::RemoteAccess)?;
        self.resp.save(Resource {
            kind: ResKind::Atomic { orig },
            first_psn: p.psn,
            npkts: 1,
        });
        self.resp.psn = p.psn.next();
        self.resp.msn = (self.resp.msn + 1) & 0x00ff_ffff;
        self.send_atomic_ack(p.psn, orig, io);
        Ok(())
    }

    /// A request older than the expected PSN: answer it, never re-execute it.
    fn duplicate(&mut self, p: &Pkt<'_>, io: &mut Io<'_>) {
        self.stats.duplicate_requests += 1;
        if p.any(f::SEND | f::WRITE) {
            let last = self.resp.psn.wrapping_sub(1);
            self.send_ack(syndrome::ACK_UNLIMITED, last, io);
            return;
        }
        let found = self.resp.resources.iter().copied().find(|r| match r.kind {
            ResKind::Empty => false,
            ResKind::Read { .. } => p.any(f::READ_REQ) && p.psn.in_range(r.first_psn, r.npkts),
            ResKind::Atomic { .. } => p.any(f::ATOMIC_REQ) && p.psn == r.first_psn,
        });
        match found.map(|r| r.kind) {
            Some(ResKind::Read { va, rkey, len }) => {
                let req_len = u64::from(p.reth.len);
                let inside = p.reth.rkey == rkey
                    && p.reth.va >= va
                    && p.reth
                        .va
                        .checked_add(req_len)
                        .is_some_and(|end| end <= va.saturating_add(len));
                if !inside {
                    self.stats.drops.no_resource += 1;
                    return;
                }
                self.stats.read_replays += 1;
                // As rxe: a replay from the resource's first PSN is a new
                // response (FIRST/ONLY); one from inside the range continues
                // the original (MIDDLE/LAST).
                let first_psn = found.map_or(p.psn, |r| r.first_psn);
                self.resp.reply = Some(Reply {
                    psn: p.psn,
                    va: p.reth.va,
                    rkey,
                    resid: req_len,
                    started: p.psn != first_psn,
                });
                self.continue_reply(io);
            }
            Some(ResKind::Atomic { orig }) => {
                self.stats.atomic_replays += 1;
                self.send_atomic_ack(p.psn, orig, io);
            }
            _ => self.stats.drops.no_resource += 1,
        }
    }

    /// Emit READ response packets until the reply is done or the sink is full.
    pub(crate) fn continue_reply(&mut self, io: &mut Io<'_>) {
        let mtu = u64::from(self.a.path_mtu.bytes());
        let dest = self.peer();
        let pd = self.cfg.pd;
        while let Some(r) = self.resp.reply {
            let n = r.resid.min(mtu);
            let last = r.resid <= mtu;
            let opcode = match (r.started, last) {
                (false, true) => op::READ_RESP_ONLY,
                (false, false) => op::READ_RESP_FIRST,
                (true, false) => op::READ_RESP_MIDDLE,
                (true, true) => op::READ_RESP_LAST,
            };
            let o = Out {
                opcode,
                dest_qp: self.a.dest_qpn,
                psn: r.psn,
                aeth: aeth(syndrome::ACK_UNLIMITED, self.resp.msn),
                ..Out::default()
            };
            let mem = &*io.mem;
            let key = KeyPiece {
                key: MemKey::Remote(r.rkey),
                addr: r.va,
                len: n as usize,
                access: Access::RemoteRead,
            };
            let t = match transmit_gather(io.tx, mem, pd, &o, n as usize, &dest, &[key]) {
                Some(t) => t,
                None => transmit(io.tx, &o, n as usize, &dest, |buf| {
                    mem.read(pd, MemKey::Remote(r.rkey), r.va, buf, Access::RemoteRead)
                }),
            };
            self.count_tx(&t);
            match t {
                Tx::Full => return,
                Tx::Fill => {
                    self.resp.reply = None;
                    self.send_ack(syndrome::NAK_REMOTE_ACCESS, r.psn, io);
                    self.enter_error(io.cq);
                    return;
                }
                Tx::Sent(_) => {}
            }
            self.resp.reply = if last {
                None
            } else {
                Some(Reply {
                    psn: r.psn.next(),
                    va: r.va.wrapping_add(n),
                    rkey: r.rkey,
                    resid: r.resid - n,
                    started: true,
                })
            };
        }
    }

    /// Send an ACK, NAK or RNR NAK for `psn`; count it.
    fn send_ack(&mut self, syn: u8, psn: Psn, io: &mut Io<'_>) {
        let o = Out {
            opcode: op::ACK,
            dest_qp: self.a.dest_qpn,
            psn,
            aeth: aeth(syn, self.resp.msn),
            ..Out::default()
        };
        let dest = self.peer();
        let t = transmit(io.tx, &o, 0, &dest, |_| Ok(()));
        self.count_tx(&t);
        if !matches!(t, Tx::Sent(_)) {
            self.stats.drops.tx_full += 1;
            return;
        }
        let n = &mut self.stats.naks_sent;
        match syn {
            syndrome::NAK_PSN_SEQ => n.psn_seq += 1,
            syndrome::NAK_INVALID_REQ => n.invalid_request += 1,
            syndrome::NAK_REMOTE_ACCESS => n.remote_access += 1,
            syndrome::NAK_REMOTE_OP => n.remote_op += 1,
            s if s & 0xe0 == syndrome::RNR => n.rnr += 1,
            _ => self.stats.acks_sent += 1,
        }
    }

    fn send_atomic_ack(&mut self, psn: Psn, orig: u64, io: &mut Io<'_>) {
        let o = Out {
            opcode: op::ATOMIC_ACK,
            dest_qp: self.a.dest_qpn,
            psn,
            aeth: aeth(syndrome::ACK_UNLIMITED, self.resp.msn),
            atomic_orig: orig,
            ..Out::default()
        };
        let dest = self.peer();
        let t = transmit(io.tx, &o, 0, &dest, |_| Ok(()));
        self.count_tx(&t);
        if matches!(t, Tx::Sent(_)) {
            self.stats.acks_sent += 1;
        } else {
            self.stats.drops.tx_full += 1;
        }
    }

    /// Complete the receive WQE at the ring head with an error status.
    fn complete_recv(
        &mut self,
        wr_id: u64,
        status: WcStatus,
        opcode: WcOpcode,
        byte_len: u32,
        io: &mut Io<'_>,
    ) {
        let wc = WorkCompletion {
            wr_id,
            status,
            opcode,
            qp_num: self.cfg.qpn,
            byte_len,
            ..WorkCompletion::default()
        };
        self.push_recv(wc, io);
    }

    /// Hand a receive completion over and retire the ring head.
    pub(crate) fn push_recv(&mut self, wc: WorkCompletion, io: &mut Io<'_>) {
        io.cq.complete(CqSide::Recv, wc);
        self.stats.recv_completions += 1;
        self.rq.pop();
        self.resp.recv_in_use = false;
        self.resp.recv_off = 0;
    }
}
