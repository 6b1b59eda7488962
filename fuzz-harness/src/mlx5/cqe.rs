//! The `mlx5_cqe` target: the driver's CQ and EQ consumers (rnic-mlx5, over plain DMA
//! buffers: [`rnic_mlx5::rdma::fuzzing`]) fed CQEs and EQEs a hostile device writes (see
//! [`completions`]).

use std::collections::VecDeque;

use rnic_core::{WcOpcode, WcStatus, WorkCompletion};
use rnic_mlx5::rdma::fuzzing::{CqRig, EqRig, OTHER_QPN, QPN};
use rnic_mlx5_prm::{CQE_FORMAT_COMPRESSED, Cqe64, CqeOpcode, EQE_BYTES, Eqe, ErrCqe, EventType};

use crate::Input;

/// Most operations one input runs.
const MAX_OPS: usize = 64;
/// The CQN the EQ rig delivers completion events to.
const CQN: u32 = 0x11;
/// The sizes byte's flag for the sole-QP rig ([`CqRig::new_sole`]: no idle QP, so the
/// CQ's lean path takes the requester successes; CQEs naming [`OTHER_QPN`] name an
/// unknown QPN).
pub const SOLE_QP: u8 = 0x10;

/// A WQE the harness posted and the CQ has not retired yet.
#[derive(Clone, Copy, Debug)]
struct Posted {
    wr_id: u64,
    index: u16,
    wqebbs: u32,
}

/// What the harness knows: the rigs, what it posted, and the bytes it wrote into each ring
/// slot (the device's side).
struct Model {
    cq: CqRig,
    eq: EqRig,
    sends: VecDeque<Posted>,
    recvs: VecDeque<u64>,
    next_wr_id: u64,
    cqes: Vec<[u8; 64]>,
    eqes: Vec<[u8; EQE_BYTES]>,
    /// Completions returned, from CQEs and flushes.
    completions: u64,
}

/// What one input did (for the seed tests).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct End {
    /// Completions returned (CQEs and flushes).
    pub completions: u64,
    /// The CQ's counters at the end.
    pub cq: rnic_mlx5::CqCounters,
    /// The EQ's counters at the end.
    pub eq: rnic_mlx5::EventCounters,
    /// QPs attached to the CQ: 1 (the sole-QP rig, [`SOLE_QP`]) or 2.
    pub qps: u32,
}

fn refused(k: &rnic_mlx5::CqCounters) -> u64 {
    k.unknown_qpn + k.bad_wqe_counter + k.unexpected_recv + k.unknown_cqe
}

fn eq_categories(k: &rnic_mlx5::EventCounters) -> u64 {
    k.command
        + k.page_requests
        + k.completion
        + k.cq_error
        + k.qp_events
        + k.port_change
        + k.other
        + k.unknown_type
}

fn is_responder(op: u8) -> bool {
    matches!(
        CqeOpcode::from_raw(op),
        CqeOpcode::RespSend
            | CqeOpcode::RespSendImm
            | CqeOpcode::RespSendInv
            | CqeOpcode::RespWrImm
            | CqeOpcode::RespErr
    )
}

impl Model {
    fn new(log_cq: u32, log_eq: u32, sole: bool) -> Model {
        let cq = if sole {
            CqRig::new_sole(log_cq)
        } else {
            CqRig::new(log_cq)
        }
        .expect("CQ rig");
        let eq = EqRig::new(log_eq, CQN).expect("EQ rig");
        let mut cqes = vec![[0u8; 64]; cq.entries() as usize];
        for c in &mut cqes {
            c[63] = rnic_mlx5_prm::CQE_OP_OWN_INIT;
        }
        let mut eqes = vec![[0u8; EQE_BYTES]; eq.entries() as usize];
        for e in &mut eqes {
            e[63] = rnic_mlx5_prm::EQE_OWNER_INIT;
        }
        Model {
            cq,
            eq,
            sends: VecDeque::new(),
            recvs: VecDeque::new(),
            next_wr_id: 1,
            cqes,
            eqes,
            completions: 0,
        }
    }

    fn wr_id(&mut self) -> u64 {
        self.next_wr_id += 1;
        self.next_wr_id
    }

    /// CQ slots valid from the consumer index on (owner parity of their position, opcode
    /// not INVALID), as the device left them.
    fn cq_valid_run(&self) -> u32 {
        let n = self.cq.entries();
        let log = n.trailing_zeros();
        let ci = self.cq.consumer_index();
        (0..n)
            .take_while(|j| {
                let pos = ci.wrapping_add(*j);
                let op_own = self.cqes[(pos & (n - 1)) as usize][63];
                op_own >> 4 != 0xf && u32::from(op_own & 1) == (pos >> log) & 1
            })
            .count() as u32
    }

    fn eq_valid_run(&self) -> u32 {
        let n = self.eq.entries();
        let log = n.trailing_zeros();
        let ci = self.eq.consumer_index();
        (0..n)
            .take_while(|j| {
                let pos = ci.wrapping_add(*j);
                let owner = self.eqes[(pos & (n - 1)) as usize][63] & 1;
                u32::from(owner) == (pos >> log) & 1
            })
            .count() as u32
    }

    /// What the next CQE must complete, when the model knows: a valid requester success
    /// (REQ, not compressed) of the posting QP whose `wqe_counter` names an outstanding
    /// WQE start completes that WQE — the case the CQ's lean path takes on a sole-QP rig,
    /// and the general decoder otherwise.
    fn next_completes(&self) -> Option<u64> {
        if self.cq_valid_run() == 0 {
            return None;
        }
        let n = self.cq.entries();
        let b = &self.cqes[(self.cq.consumer_index() & (n - 1)) as usize];
        let v = Cqe64::new_unchecked(&b[..]);
        if b[63] >> 4 != CqeOpcode::Req.as_raw()
            || v.cqe_format() == CQE_FORMAT_COMPRESSED
            || v.qpn() != QPN
        {
            return None;
        }
        let counter = v.wqe_counter() as u16;
        self.sends
            .iter()
            .find(|p| p.index == counter)
            .map(|p| p.wr_id)
    }

    /// A completion of [`Model::next_completes`]'s WQE: an RDMA WRITE (all the harness
    /// posts), SUCCESS, of the posting QP, no bytes.
    fn check_next(wc: Option<&WorkCompletion>, want: Option<u64>) {
        let Some(want) = want else { return };
        let wc = wc.unwrap_or_else(|| panic!("a REQ CQE for WQE {want} completed nothing"));
        assert_eq!(
            (wc.wr_id, wc.status, wc.opcode, wc.qp_num.get(), wc.byte_len),
            (want, WcStatus::Success, WcOpcode::RdmaWrite, QPN, 0),
            "the completion of a REQ CQE"
        );
    }

    /// Every check a completion must pass: it names a WQE that was posted and is not retired
    /// yet; a send retires every WQE before it (the unsignaled ones), a receive the oldest.
    fn retire(&mut self, wc: &WorkCompletion) {
        assert_eq!(
            wc.qp_num.get(),
            QPN,
            "a completion for a QP that never posted: {wc:?}"
        );
        match wc.opcode {
            WcOpcode::Recv | WcOpcode::RecvRdmaWithImm => {
                let oldest = self.recvs.pop_front();
                assert_eq!(
                    oldest,
                    Some(wc.wr_id),
                    "a receive out of order or never posted"
                );
            }
            _ => {
                let at = self
                    .sends
                    .iter()
                    .position(|p| p.wr_id == wc.wr_id)
                    .unwrap_or_else(|| panic!("a send completion for no outstanding WQE: {wc:?}"));
                self.sends.drain(..=at);
            }
        }
        self.completions += 1;
    }

    /// After every operation: the driver's tracking equals the model's.
    fn check_tracking(&self) {
        let sq: u32 = self.sends.iter().map(|p| p.wqebbs).sum();
        assert_eq!(
            self.cq.outstanding(),
            (sq, self.recvs.len() as u32),
            "outstanding work disagrees with what was posted and retired"
        );
        assert_eq!(
            self.cq.other_outstanding(),
            (0, 0),
            "the idle QP's tracking moved"
        );
    }

    fn post(&mut self, inp: &mut Input<'_>) {
        let kind = inp.u8();
        let wr_id = self.wr_id();
        let got = match kind % 3 {
            0 => {
                let b = inp.u8();
                let offset = u32::from(inp.u8()) * if b & 1 == 0 { 8 } else { 1 };
                let len = u32::from(inp.u8() % 48);
                self.cq
                    .post_write(wr_id, offset, len, b & 2 != 0, b & 4 != 0)
            }
            1 => self
                .cq
                .post_write_inline(wr_id, kind & 8 != 0)
                .map(|index| (index, 1)),
            _ => {
                match self.cq.post_recv(wr_id) {
                    Ok(()) => self.recvs.push_back(wr_id),
                    Err(e) => assert!(matches!(e, rnic_mlx5::Mlx5Error::PostRecv { .. }), "{e}"),
                }
                return;
            }
        };
        match got {
            Ok((index, wqebbs)) => {
                assert!(wqebbs >= 1, "a post that took no WQEBB");
                self.sends.push_back(Posted {
                    wr_id,
                    index,
                    wqebbs,
                });
            }
            // Full, fatal, an unaligned or too long inline payload: typed, nothing posted.
            Err(e) => assert!(matches!(e, rnic_mlx5::Mlx5Error::PostSend { .. }), "{e}"),
        }
    }

    /// A CQE built from the input: a plausible or hostile opcode, QPN, `wqe_counter`,
    /// format, syndrome, byte count, and the right or the wrong owner for its slot.
    fn cqe(&self, inp: &mut Input<'_>) -> (u32, [u8; 64]) {
        let k = u32::from(inp.u8()) % self.cq.entries();
        let pos = self.cq.consumer_index().wrapping_add(k);
        let log = self.cq.entries().trailing_zeros();
        let pick = inp.u8();
        let opcode = match pick % 9 {
            0 | 1 => CqeOpcode::Req.as_raw(),
            2 => CqeOpcode::ReqErr.as_raw(),
            3 => CqeOpcode::RespSend.as_raw(),
            4 => CqeOpcode::RespSendImm.as_raw(),
            5 => CqeOpcode::RespWrImm.as_raw(),
            6 => CqeOpcode::RespSendInv.as_raw(),
            7 => CqeOpcode::RespErr.as_raw(),
            _ => pick >> 4,
        };
        let q = inp.u8();
        let qpn = match q % 4 {
            0 | 1 => QPN,
            2 => OTHER_QPN,
            _ => inp.u32() & 0xff_ffff,
        };
        let c = inp.u8();
        let outstanding = self.sends.len().max(1);
        let named = self.sends.get(usize::from(c) % outstanding);
        let counter = match (c >> 5, named) {
            (0..=3, Some(p)) => p.index,
            (4, Some(p)) => p.index.wrapping_add(1),
            (5, Some(p)) => p.index.wrapping_sub(1),
            _ => inp.u16(),
        };
        let flags = inp.u8();
        let format = if flags & 0x0f == 0 {
            CQE_FORMAT_COMPRESSED
        } else if flags & 0x0f == 1 {
            u32::from(flags >> 6)
        } else {
            0
        };
        let owner = ((pos >> log) & 1) ^ u32::from(flags & 0x10 != 0 && flags & 0x20 != 0);
        let mut b = [0u8; 64];
        {
            let mut e = ErrCqe::new_unchecked(&mut b[..]);
            let _ = e.set_syndrome(u32::from(inp.u8()));
            let _ = e.set_vendor_err_synd(u32::from(inp.u8()));
        }
        let mut v = Cqe64::new_unchecked(&mut b[..]);
        let _ = v.set_byte_cnt(inp.u32());
        let _ = v.set_imm_inval_pkey(inp.u32());
        let _ = v.set_rqpn(inp.u32() & 0xff_ffff);
        let _ = v.set_qpn(qpn);
        let _ = v.set_wqe_counter(counter.into());
        let _ = v.set_opcode(u32::from(opcode & 0xf));
        let _ = v.set_cqe_format(format);
        let _ = v.set_owner(owner);
        (pos, b)
    }

    fn write_cqe(&mut self, pos: u32, b: [u8; 64]) {
        let n = self.cq.entries();
        self.cq.write_cqe(pos, &b);
        self.cqes[(pos & (n - 1)) as usize] = b;
    }

    fn poll(&mut self, n: usize) {
        let run = self.cq_valid_run();
        let ci0 = self.cq.consumer_index();
        let k0 = self.cq.counters();
        let want = self.next_completes();
        let mut wcs = [WorkCompletion::default(); 4];
        let got = self.cq.poll(&mut wcs[..n]);
        assert!(got <= n);
        Model::check_next(wcs[..got].first(), want);
        let consumed = self.cq.consumer_index().wrapping_sub(ci0);
        self.after_cqes(run, consumed, got as u64, &k0);
        if got < n {
            assert_eq!(consumed, run, "poll stopped before an invalid CQE");
        }
        // (An error CQE may carry WR_FLUSH_ERR itself: the device flushes too. Software
        // flushes are checked by the counter in `after_cqes`.)
        for wc in &wcs[..got] {
            self.retire(wc);
        }
    }

    fn poll_send(&mut self) {
        let run = self.cq_valid_run();
        let ci0 = self.cq.consumer_index();
        let k0 = self.cq.counters();
        let want = self.next_completes();
        let got = self.cq.poll_send();
        Model::check_next(got.map(WorkCompletion::from).as_ref(), want);
        let consumed = self.cq.consumer_index().wrapping_sub(ci0);
        self.after_cqes(run, consumed, u64::from(got.is_some()), &k0);
        match got {
            Some(c) => {
                assert!(
                    !matches!(c.opcode(), WcOpcode::Recv | WcOpcode::RecvRdmaWithImm),
                    "poll_send returned a receive: {c:?}"
                );
                self.retire(&WorkCompletion::from(c));
            }
            None if consumed < run => {
                // Stopped at a responder CQE, left in place for `poll`.
                let n = self.cq.entries();
                let at = self.cq.consumer_index() & (n - 1);
                let op = self.cqes[at as usize][63] >> 4;
                assert!(is_responder(op), "poll_send stopped at a CQE it could take");
            }
            None => {}
        }
    }

    /// The consumer side after a poll: it took no more than the valid run, every CQE it
    /// consumed was counted and either completed something or moved a refusal counter, and
    /// the doorbell record holds the consumer index.
    fn after_cqes(&self, run: u32, consumed: u32, completed: u64, k0: &rnic_mlx5::CqCounters) {
        let k = self.cq.counters();
        assert!(
            consumed <= run,
            "consumed {consumed} CQEs past a valid run of {run}"
        );
        assert_eq!(k.cqes - k0.cqes, u64::from(consumed), "CQE counter");
        assert_eq!(
            u64::from(consumed),
            completed + (refused(&k) - refused(k0)),
            "a consumed CQE neither completed a WQE nor moved a counter: {k0:?} → {k:?}"
        );
        assert_eq!(k.software_flushed, k0.software_flushed);
        // `set_ci` is the consumer index, stored after every CQE consumed
        // (audit row 11: after every poll batch, as K and RC).
        assert_eq!(
            self.cq.record_ci(),
            self.cq.consumer_index() & 0xff_ffff,
            "doorbell record set_ci"
        );
        assert_eq!(
            u64::from(self.cq.consumer_index()),
            k.cqes & 0xffff_ffff,
            "the consumer index moved without a CQE"
        );
    }

    fn flush(&mut self, n: usize) {
        let mut wcs = [WorkCompletion::default(); 8];
        let k0 = self.cq.counters();
        let got = self.cq.flush(&mut wcs[..n]);
        assert_eq!(
            self.cq.counters().software_flushed - k0.software_flushed,
            got as u64
        );
        for wc in &wcs[..got] {
            assert_eq!(wc.status, WcStatus::WrFlushErr);
            // Flushes complete in order, every WQE (signaled or not) on its own.
            match wc.opcode {
                WcOpcode::Recv => {}
                _ => assert_eq!(
                    self.sends.front().map(|p| p.wr_id),
                    Some(wc.wr_id),
                    "flushes complete sends oldest first"
                ),
            }
            self.retire(wc);
        }
    }

    fn eqe(&self, inp: &mut Input<'_>) -> (u32, [u8; EQE_BYTES]) {
        let k = u32::from(inp.u8()) % self.eq.entries();
        let pos = self.eq.consumer_index().wrapping_add(k);
        let log = self.eq.entries().trailing_zeros();
        let pick = inp.u8();
        let ty = match pick % 8 {
            0 | 1 => EventType::Completion.as_raw(),
            2 => EventType::Cmd.as_raw(),
            3 => EventType::PageRequest.as_raw(),
            4 => EventType::CqError.as_raw(),
            5 => EventType::PortChange.as_raw(),
            6 => EventType::WqCatasError.as_raw(),
            _ => inp.u8(),
        };
        let cqn = match inp.u8() % 3 {
            0 | 1 => CQN,
            _ => inp.u32() & 0xff_ffff,
        };
        let flip = u32::from(pick & 0xc0 == 0xc0);
        let mut b = [0u8; EQE_BYTES];
        if pick & 0x20 != 0 {
            // Event data from the input.
            for x in b.iter_mut().take(0x3c).skip(0x20) {
                *x = inp.u8();
            }
        }
        let mut v = Eqe::new_unchecked(&mut b[..]);
        let _ = v.set_event_type(ty.into());
        if ty == EventType::Completion.as_raw() {
            let _ = v.comp_event_mut().set_cq_number(cqn);
        }
        let _ = v.set_owner(((pos >> log) & 1) ^ flip);
        (pos, b)
    }

    fn drain(&mut self) {
        let run = self.eq_valid_run();
        let ci0 = self.eq.consumer_index();
        let k0 = self.eq.counters();
        let events0 = self.eq.cq_events();
        let n_eq = self.eq.entries();
        // What the consumed entries are: completions for the registered CQ and for others.
        let (mut ours, mut theirs) = (0u32, 0u64);
        for j in 0..run {
            let e = &self.eqes[(ci0.wrapping_add(j) & (n_eq - 1)) as usize];
            let v = Eqe::new_unchecked(&e[..]);
            if v.event_type() as u8 == EventType::Completion.as_raw() {
                if v.comp_event().cq_number() == CQN {
                    ours += 1;
                } else {
                    theirs += 1;
                }
            }
        }
        let (n, rings) = self.eq.drain();
        let k = self.eq.counters();
        assert_eq!(
            n, run,
            "the EQ drain stops only at an entry of the wrong owner"
        );
        assert_eq!(self.eq.consumer_index().wrapping_sub(ci0), n);
        assert_eq!(k.eqes - k0.eqes, u64::from(n));
        assert_eq!(
            eq_categories(&k) - eq_categories(&k0),
            u64::from(n),
            "an EQE consumed without being counted: {k0:?} → {k:?}"
        );
        assert_eq!(
            self.eq.cq_events() - events0,
            ours,
            "completion events delivered"
        );
        assert_eq!(
            k.unknown_cq - k0.unknown_cq,
            theirs,
            "events for unknown CQs counted"
        );
        if n > 0 {
            assert_eq!(rings.last(), Some(&(self.eq.consumer_index(), true)));
        } else {
            assert!(rings.is_empty(), "a doorbell for an empty drain");
        }
    }
}

/// Run one input (see [`completions`]).
pub fn run(data: &[u8]) -> End {
    let mut inp = Input::new(data);
    let sizes = inp.u8();
    let mut m = Model::new(
        u32::from(sizes & 3) + 1,
        u32::from((sizes >> 2) & 3) + 1,
        sizes & SOLE_QP != 0,
    );
    for _ in 0..MAX_OPS {
        if inp.is_empty() {
            break;
        }
        match inp.u8() % 10 {
            0..=2 => m.post(&mut inp),
            3 | 4 => {
                let (pos, b) = m.cqe(&mut inp);
                m.write_cqe(pos, b);
            }
            5 => {
                let k = u32::from(inp.u8()) % m.cq.entries();
                let pos = m.cq.consumer_index().wrapping_add(k);
                let mut b = [0u8; 64];
                b.copy_from_slice(&{
                    let mut raw = [0u8; 64];
                    let src = inp.bytes(64);
                    raw[..src.len()].copy_from_slice(src);
                    raw
                });
                m.write_cqe(pos, b);
            }
            6 => {
                let n = 1 + usize::from(inp.u8() % 4);
                m.poll(n);
            }
            7 => m.poll_send(),
            8 => {
                let b = inp.u8();
                if b < 8 {
                    m.flush(1 + usize::from(b));
                } else {
                    let (pos, e) = m.eqe(&mut inp);
                    let n = m.eq.entries();
                    m.eq.write_eqe(pos, &e);
                    m.eqes[(pos & (n - 1)) as usize] = e;
                }
            }
            _ => m.drain(),
        }
        m.check_tracking();
    }
    // Whatever is left, polled until the ring has nothing valid.
    for _ in 0..2 * m.cq.entries() {
        m.poll(4);
    }
    m.drain();
    m.check_tracking();
    End {
        completions: m.completions,
        cq: m.cq.counters(),
        eq: m.eq.counters(),
        qps: m.cq.attached_qps(),
    }
}

/// The `mlx5_cqe` harness: a QP with work posted (the single-WRITE shortcut, the general
/// writer, the direct fast path, receives) on a CQ — with an idle second QP on it, or, when
/// the first byte has [`SOLE_QP`], as the CQ's sole QP, so that the requester successes go
/// through the CQ's lean path (`poll_send`, the first CQE of `poll`) rather than the
/// general decoder, against the same model — and an EQ, whose entries the input
/// writes — well-formed CQEs naming outstanding WQEs, CQEs with an out-of-range or
/// mid-WQE `wqe_counter`, an unknown or idle QPN, an unknown opcode, the compressed format,
/// the wrong owner, raw bytes; EQEs of every type and unknown ones, for the registered CQ
/// and others — between posts, polls (`poll` and `poll_send`), fatal flushes and EQ
/// drains. Asserted: no panic; every completion names a WQE that was posted and not yet
/// retired (a send retires the unsignaled WQEs before it, a receive is the oldest), so
/// none retires twice; a poll whose next CQE is a requester success of the QP naming an
/// outstanding WQE start completes that WQE first (SUCCESS, RDMA WRITE, no bytes); the driver's outstanding counts equal the model's; a poll consumes
/// no more than the run of valid CQEs (and all of it unless its array filled or, for
/// `poll_send`, a responder CQE stopped it), counts each, and each consumed CQE either
/// completes something or moves a refusal counter; the doorbell record holds the
/// consumer index; an EQ drain consumes exactly the valid run, counts every entry in one
/// category, delivers completion events only to the registered CQ and counts the rest.
pub fn completions(data: &[u8]) {
    let _ = run(data);
}

/// The completion check fires on a completion for a WQE that was never posted (for the
/// test that shows the harness can fail).
pub fn check_a_forged_completion() {
    let mut m = Model::new(1, 1, false);
    let wc = WorkCompletion {
        wr_id: 77,
        qp_num: rnic_core::Qpn::from_wire(QPN),
        opcode: WcOpcode::RdmaWrite,
        ..WorkCompletion::default()
    };
    m.retire(&wc);
}

/// The next-CQE check fires on a completion of another WQE than the one a REQ CQE names
/// (for the test that shows the harness can fail): on the sole-QP rig, two WRITEs posted,
/// the CQE naming the second, a completion of the first.
pub fn check_a_misattributed_completion() {
    let mut m = Model::new(1, 1, true);
    for wr_id in [1, 2] {
        let (index, wqebbs) = m.cq.post_write(wr_id, 8, 8, true, true).expect("WRITE");
        m.sends.push_back(Posted {
            wr_id,
            index,
            wqebbs,
        });
    }
    let mut b = [0u8; 64];
    let mut v = Cqe64::new_unchecked(&mut b[..]);
    let _ = v.set_qpn(QPN);
    let _ = v.set_wqe_counter(m.sends[1].index.into());
    let _ = v.set_opcode(CqeOpcode::Req.as_raw().into());
    m.write_cqe(0, b);
    let forged = WorkCompletion {
        wr_id: 1,
        qp_num: rnic_core::Qpn::from_wire(QPN),
        opcode: WcOpcode::RdmaWrite,
        ..WorkCompletion::default()
    };
    Model::check_next(Some(&forged), m.next_completes());
}

/// A program: `ops` as (op byte, operand bytes).
fn program(sizes: u8, ops: &[&[u8]]) -> Vec<u8> {
    let mut v = vec![sizes];
    for op in ops {
        v.extend_from_slice(op);
    }
    v
}

/// A structured CQE operand list: slot offset, opcode pick, QPN pick (0 = ours,
/// 2 = the idle QP, 3 = random + 4 bytes), counter pick (0 = the oldest outstanding
/// WQE, 0x80 = one past it, 0xe0 = random + 2 bytes), flags, syndrome, vendor error,
/// byte count (4), immediate (4), remote QPN (4).
fn cqe_op(slot: u8, opcode: u8, qpn: &[u8], counter: &[u8], flags: u8) -> Vec<u8> {
    let mut v = vec![3, slot, opcode];
    v.extend_from_slice(qpn);
    v.extend_from_slice(counter);
    v.push(flags);
    v.extend_from_slice(&[0x12, 0x34]);
    v.extend_from_slice(&[0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0]);
    v
}

/// The seed corpus: honest completions, and one input per hostile kind, on the two-QP rig;
/// the same programs on the sole-QP rig (`sole-*`, [`SOLE_QP`]: the lean path), and CQ
/// wraps through the lean path (`sole-wrap`).
pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let mut all = two_qp_seeds();
    let sole: Vec<_> = all
        .iter()
        .filter_map(|(name, v)| {
            let mut v = v.clone();
            v[0] |= SOLE_QP;
            Some((sole_name(name)?, v))
        })
        .collect();
    all.extend(sole);
    all.push(("sole-wrap", sole_wrap_seed()));
    all
}

/// The sole-QP seed named after a two-QP one.
fn sole_name(name: &str) -> Option<&'static str> {
    Some(match name {
        "honest-sends" => "sole-honest-sends",
        "honest-recv-and-error" => "sole-honest-recv-and-error",
        "bad-wqe-counter" => "sole-bad-wqe-counter",
        "unknown-qpn" => "sole-unknown-qpn",
        "unknown-opcode-and-compressed" => "sole-unknown-opcode-and-compressed",
        "wrong-owner-and-raw" => "sole-wrong-owner-and-raw",
        "responder-stops-poll-send" => "sole-responder-stops-poll-send",
        "flush" => "sole-flush",
        _ => return None,
    })
}

/// A CQ of 2 CQEs on the sole-QP rig, wrapped four times through the lean path: five
/// signaled inline WRITEs each completed by `poll_send`, two by one-entry `poll`s, then two
/// outstanding completed by one four-entry `poll` (the lean first CQE, then the general
/// loop): 9 completions, consumer index 9.
pub fn sole_wrap_seed() -> Vec<u8> {
    // CQ of 2 entries, EQ of 16, one QP.
    const SIZES: u8 = SOLE_QP | 0x0c;
    let write = [0u8, 0, 0b110, 1, 8];
    let next = cqe_op(0, 0, &[0], &[0], 0x02);
    let second = cqe_op(1, 0, &[0], &[1], 0x02);
    let mut ops: Vec<&[u8]> = Vec::new();
    for _ in 0..5 {
        ops.extend([&write[..], &next, &[7]]);
    }
    for _ in 0..2 {
        ops.extend([&write[..], &next, &[6, 0]]);
    }
    ops.extend([&write[..], &write, &next, &second, &[6, 3]]);
    program(SIZES, &ops)
}

/// The seeds on the two-QP rig.
fn two_qp_seeds() -> Vec<(&'static str, Vec<u8>)> {
    // Sizes byte: CQ of 8 entries, EQ of 16.
    const SIZES: u8 = 0x0e;
    // post: op 0, then kind 0 (WRITE: flags (1 = unaligned, 2 = inline, 4 = signaled),
    // offset / 8, length), kind 13 (the direct fast path, signaled), kind 2 (a receive).
    let write_inline = [0u8, 0, 0b110, 1, 8];
    let write_two_bbs = [0u8, 0, 0b110, 1, 40];
    let write_plain = [0u8, 0, 0b100, 2, 40];
    let fast = [0u8, 13];
    let recv = [0u8, 2];
    let poll = [6u8, 3];
    let poll_send = [7u8];
    let ours = [0u8];
    let oldest = [0u8];
    let mut raw = vec![5u8, 1];
    raw.extend_from_slice(&[0u8; 64]);
    vec![
        (
            "honest-sends",
            program(
                SIZES,
                &[
                    &write_inline,
                    &fast,
                    &write_plain,
                    &cqe_op(0, 0, &ours, &oldest, 0x02),
                    &cqe_op(1, 0, &ours, &[2], 0x02),
                    &poll,
                    &poll_send,
                ],
            ),
        ),
        (
            "honest-recv-and-error",
            program(
                SIZES,
                &[
                    &recv,
                    &recv,
                    &write_inline,
                    &cqe_op(0, 3, &ours, &oldest, 0x02),
                    &cqe_op(1, 2, &ours, &oldest, 0x02),
                    &cqe_op(2, 4, &ours, &oldest, 0x02),
                    &poll,
                    &poll,
                ],
            ),
        ),
        (
            "bad-wqe-counter",
            program(
                SIZES,
                &[
                    &write_two_bbs,
                    &write_inline,
                    &cqe_op(0, 0, &ours, &[0x80], 0x02),
                    &cqe_op(1, 0, &ours, &[0xa0], 0x02),
                    &cqe_op(2, 0, &ours, &[0xe0, 0x7f, 0xff], 0x02),
                    &poll,
                    &poll_send,
                ],
            ),
        ),
        (
            "unknown-qpn",
            program(
                SIZES,
                &[
                    &write_inline,
                    &recv,
                    &cqe_op(0, 0, &[3, 0, 0x12, 0x34, 0x56], &oldest, 0x02),
                    &cqe_op(1, 3, &[2], &oldest, 0x02),
                    &poll,
                ],
            ),
        ),
        (
            "unknown-opcode-and-compressed",
            program(
                SIZES,
                &[
                    &write_inline,
                    &cqe_op(0, 0x98, &ours, &oldest, 0x02),
                    &cqe_op(1, 0, &ours, &oldest, 0x00),
                    &cqe_op(2, 0, &ours, &oldest, 0x41),
                    &poll,
                ],
            ),
        ),
        (
            "wrong-owner-and-raw",
            program(
                SIZES,
                &[
                    &write_inline,
                    &cqe_op(0, 0, &ours, &oldest, 0x32),
                    &poll,
                    &raw,
                    &poll_send,
                ],
            ),
        ),
        (
            "responder-stops-poll-send",
            program(
                SIZES,
                &[
                    &recv,
                    &write_inline,
                    &cqe_op(0, 3, &ours, &oldest, 0x02),
                    &cqe_op(1, 0, &ours, &oldest, 0x02),
                    &poll_send,
                    &poll,
                    &poll_send,
                ],
            ),
        ),
        (
            "flush",
            program(
                SIZES,
                &[&write_inline, &fast, &recv, &[8, 3], &write_inline, &[8, 7]],
            ),
        ),
        (
            "eqes",
            program(
                SIZES,
                &[
                    &[8, 9, 0, 0, 0],
                    &[8, 9, 1, 2, 0],
                    &[8, 9, 2, 3, 0],
                    &[8, 9, 3, 7, 0x3f, 0],
                    &[8, 9, 4, 0, 2, 0, 0xab, 0xcd, 0xef],
                    &[9],
                    &[8, 9, 0, 0xc0, 0],
                    &[9],
                ],
            ),
        ),
        ("full-sq", {
            let mut ops: Vec<&[u8]> = vec![&write_inline; 10];
            ops.push(&fast);
            program(SIZES, &ops)
        }),
    ]
}
