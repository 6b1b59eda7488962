//! The `mlx5_wqe` target: an RC QP of the emulated function in RTS, fed hostile send WQEs
//! (see [`send_queue`]).

use std::cell::RefCell;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU32, Ordering};

use rnic_core::Gid;
use rnic_mlx5_prm::{
    AllocPdOut, AllocUarOut, CmdOpcode, CqeOpcode, CqeSyndrome, CreateMkeyIn, CreateMkeyOut,
    CreateQpIn, CreateQpOut, DestroyCqIn, DestroyEqIn, DestroyQpIn, ErrCqe, EventType,
    INLINE_SEG_FLAG, INVALID_LKEY, ModifyNicVportContextIn, QpServiceType, QueryQpOut,
    Rst2initQpIn, SetRoceAddressIn, WqeOpcode, create_mkey_in,
};

use super::{BASE, MAPPED, QUEUES, Reply, Rig, cmd, status};
use crate::Input;

/// Most rounds (WQE batches, doorbells, polls) one input runs.
const MAX_ROUNDS: usize = 24;
const OUT: usize = 0x10;
const MAC: [u8; 6] = [0x02, 0x00, 0x15, 0xb3, 0x10, 0x17];
/// The MKeys' virtual address.
const VA: u64 = 0x7f00_0000_1000;

// The layout of the queue area (memfd offsets).
const ASYNC_EQ: u64 = QUEUES;
const COMP_EQ: u64 = QUEUES + 0x1000;
const CQ_RING: u64 = QUEUES + 0x2000;
const CQ_DBR: u64 = QUEUES + 0x3000;
const WQ: u64 = QUEUES + 0x4000;
const QP_DBR: u64 = QUEUES + 0x6000;
/// Data buffer of MKey A (all local and remote rights), 4 pages.
const DATA_A: u64 = QUEUES + 0x7000;
const DATA_A_LEN: u64 = 0x4000;
/// Data buffer of MKey B (local read only), 1 page.
const DATA_B: u64 = QUEUES + 0xb000;
const DATA_B_LEN: u64 = 0x1000;
const LOG_SQ: u32 = 6;
const LOG_RQ: u32 = 6;
const RQ_STRIDE: u64 = 32;
const SQ_OFF: u64 = (1 << LOG_RQ) * RQ_STRIDE;
const LOG_CQ: u32 = 6;

/// What the thread's rig keeps across inputs: the function brought up (pages, INIT_HCA), RoCE
/// on, GID 0 on a loopback address (its UDP/4791 socket bound), the UAR, the PD and both
/// MKeys (nothing on the data path changes an MKey: no peer, no memory windows).
#[derive(Debug)]
struct Kept {
    uar: u32,
    pd: u32,
    lkey_a: u32,
    lkey_b: u32,
    /// The QP's destination (nothing listens there).
    peer: Ipv4Addr,
    /// The firmware's accounting with only the kept objects (what every input gives back).
    accounting: rnic_mlx5_emu::Accounting,
    /// What the queue area (from [`QUEUES`]) holds when an input starts: the EQ and CQ
    /// rings owned by hardware, doorbell records and work queue zero, MKey A's buffer and
    /// the memory outside the MKeys with their patterns.
    template: Vec<u8>,
    /// The EQs (async, completion) when the last input left them as created (no EQ
    /// doorbell rung, no EQE written or dropped, no overrun): kept for the next.
    eqs: Option<(u32, u32)>,
}

/// The queue area as an input starts (see [`Kept::template`]).
fn template() -> Vec<u8> {
    let mut t = vec![0u8; (MAPPED - QUEUES) as usize];
    let at = |off: u64| (off - QUEUES) as usize;
    for ring in [ASYNC_EQ, COMP_EQ] {
        for e in t[at(ring)..at(ring) + 64 * 64].chunks_mut(64) {
            e[63] = 1;
        }
    }
    for e in t[at(CQ_RING)..at(CQ_RING) + (64 << LOG_CQ)].chunks_mut(64) {
        e[63] = 0xf0;
    }
    for (i, b) in t[at(DATA_A)..at(DATA_A) + DATA_A_LEN as usize]
        .iter_mut()
        .enumerate()
    {
        *b = (i as u8) ^ 0x5a;
    }
    for (i, b) in t[at(QUEUES + 0xc000)..].iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(13) ^ 0x3c;
    }
    t
}

impl Kept {
    /// Bring `rig` (fresh or freshly reset) up to the kept state.
    fn bring_up(rig: &mut Rig) -> Kept {
        rig.bring_up(true);
        let mut m = cmd(CmdOpcode::ModifyNicVportContext, 0, 0x200);
        let mut v = ModifyNicVportContextIn::new_unchecked(&mut m[..]);
        let _ = v.field_select_mut().set_roce_en(1);
        let _ = v.nic_vport_context_mut().set_roce_en(1);
        ok(rig, &m, OUT);
        let (me, peer) = addresses();
        let mut c = cmd(CmdOpcode::SetRoceAddress, 0, 0x30);
        let mut v = SetRoceAddressIn::new_unchecked(&mut c[..]);
        let _ = v.set_roce_address_index(0);
        let mut l = v.roce_address_mut();
        let _ = l.set_source_l3_address(&Gid::from_ipv4(me).0);
        let _ = l.set_source_mac_47_32(u32::from(u16::from_be_bytes([MAC[0], MAC[1]])));
        let _ = l.set_source_mac_31_0(u32::from_be_bytes([MAC[2], MAC[3], MAC[4], MAC[5]]));
        let _ = l.set_roce_version(2);
        let _ = l.set_roce_l3_type(0);
        ok(rig, &c, OUT);
        let out = ok(rig, &cmd(CmdOpcode::AllocUar, 0, 0x10), OUT);
        let uar = AllocUarOut::new_unchecked(&out[..]).uar();
        // The watcher's first look at a new UAR page is not a doorbell.
        rig.scan();
        let out = ok(rig, &cmd(CmdOpcode::AllocPd, 0, 0x10), OUT);
        let pd = AllocPdOut::new_unchecked(&out[..]).pd();
        let lkey_a = mkey(rig, pd, DATA_A, DATA_A_LEN, VA, true);
        let lkey_b = mkey(rig, pd, DATA_B, DATA_B_LEN, VA + 0x10_0000, false);
        Kept {
            uar,
            pd,
            lkey_a,
            lkey_b,
            peer,
            accounting: rig.fw.accounting(),
            template: template(),
            eqs: None,
        }
    }
}

/// The per-input objects' numbers (the emulator gives the lowest free number, so a
/// destroyed and re-created object gets the same one).
#[derive(Clone, Copy, Debug)]
struct Objects {
    aeq: u32,
    ceq: u32,
    cqn: u32,
    qpn: u32,
}

/// The live QP and what the harness knows of it.
struct Qp<'r> {
    rig: &'r mut Rig,
    uar: u32,
    qpn: u32,
    lkey_a: u32,
    lkey_b: u32,
    objects: Objects,
    sq_pi: u16,
    /// CQEs consumed (the CQ consumer index).
    ci: u32,
    /// Whether the input rang an EQ doorbell.
    eq_doorbells: bool,
    /// The emulator's CQE counter when the QP reached RTS.
    cqes0: u64,
    /// Its dropped-CQE counter then.
    dropped0: u64,
    /// All its counters then.
    stats0: rnic_mlx5_emu::HcaStats,
}

/// A fresh 127.x.y.1 / .2 pair per rig (the emulator binds UDP/4791 on the first; nothing
/// listens on the second).
fn addresses() -> (Ipv4Addr, Ipv4Addr) {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let b = 100 + (std::process::id() % 100) as u8;
    let [_, _, c, d] = n.to_be_bytes();
    let d = d & 0x7f;
    (
        Ipv4Addr::new(127, b ^ c, d, 1),
        Ipv4Addr::new(127, b ^ c, d, 2),
    )
}

fn ok(rig: &mut Rig, c: &[u8], outlen: usize) -> Vec<u8> {
    rig.ok(c, outlen)
}

impl<'r> Qp<'r> {
    /// The QP in RTS on a fresh (or freshly reset) `rig`.
    #[cfg(test)]
    fn new(rig: &'r mut Rig) -> Qp<'r> {
        let kept = Kept::bring_up(rig);
        Qp::open(rig, &kept)
    }

    /// The per-input part on a rig in the kept state: the queue area (rings, doorbell
    /// records, work queue, MKey buffers, pattern) rewritten, the EQs, the CQ and the QP
    /// created, the QP taken to RTS, the counters noted.
    fn open(rig: &'r mut Rig, kept: &Kept) -> Qp<'r> {
        // The image is current: the last input's close checked the memory.
        rig.restore(QUEUES, &kept.template);
        let uar = kept.uar;
        let (aeq, ceq) = kept.eqs.unwrap_or_else(|| {
            let async_mask = (1u64 << EventType::PageRequest.as_raw())
                | (1 << EventType::CqError.as_raw())
                | (1 << EventType::WqCatasError.as_raw());
            (
                rig.create_eq(ASYNC_EQ, uar, 0, async_mask),
                rig.create_eq(COMP_EQ, uar, 1, 0),
            )
        });
        let cqn = rig.create_cq(LOG_CQ, uar, ceq, CQ_RING, CQ_DBR);
        let mut c = cmd(CmdOpcode::CreateQp, 0, 0x110 + 16);
        let mut v = CreateQpIn::new_unchecked(&mut c[..]);
        let mut q = v.qpc_mut();
        let _ = q.set_st(u32::from(QpServiceType::Rc.as_raw()));
        let _ = q.set_pm_state(3);
        let _ = q.set_pd(kept.pd);
        let _ = q.set_log_sq_size(LOG_SQ);
        let _ = q.set_log_rq_size(LOG_RQ);
        let _ = q.set_log_rq_stride(1);
        let _ = q.set_uar_page(uar);
        let _ = q.set_cqn_snd(cqn);
        let _ = q.set_cqn_rcv(cqn);
        let _ = q.set_dbr_addr(BASE + QP_DBR);
        let _ = q.set_user_index(0x77);
        let _ = v.set_pas(0, BASE + WQ);
        let _ = v.set_pas(1, BASE + WQ + 0x1000);
        let out = ok(rig, &c, OUT);
        let qpn = CreateQpOut::new_unchecked(&out[..]).qpn();
        let mut qp = Qp {
            rig,
            uar,
            qpn,
            lkey_a: kept.lkey_a,
            lkey_b: kept.lkey_b,
            objects: Objects { aeq, ceq, cqn, qpn },
            sq_pi: 0,
            ci: 0,
            eq_doorbells: false,
            cqes0: 0,
            dropped0: 0,
            stats0: rnic_mlx5_emu::HcaStats::default(),
        };
        qp.connect(kept.peer);
        assert_eq!(qp.state(), 3, "bring-up: the QP is not in RTS");
        let st = qp.rig.fw.hca_stats();
        (qp.cqes0, qp.dropped0, qp.stats0) = (st.cqes, st.cqes_dropped, st);
        qp
    }

    /// Back to the kept state: the memory checked one last time, the QP and the CQ
    /// destroyed, the EQs too unless they are as created (then kept for the next input), the
    /// firmware's accounting asserted equal to the kept state's (nothing the input made
    /// outlives it).
    fn close(mut self, kept: &mut Kept) {
        self.check_memory(true);
        let o = self.objects;
        let st = since(&self.stats0, &self.rig.fw.hca_stats());
        // Only an EQ doorbell moves an EQ's consumer index or arms it, and every EQE the
        // emulator posts (or drops, or overruns on) counts.
        let eqs_as_created = !self.eq_doorbells && st.eqes + st.eqes_dropped + st.eq_overruns == 0;
        let mut c = cmd(CmdOpcode::DestroyQp, 0, 0x10);
        let _ = DestroyQpIn::new_unchecked(&mut c[..]).set_qpn(o.qpn);
        ok(self.rig, &c, OUT);
        let mut c = cmd(CmdOpcode::DestroyCq, 0, 0x10);
        let _ = DestroyCqIn::new_unchecked(&mut c[..]).set_cqn(o.cqn);
        ok(self.rig, &c, OUT);
        let mut want = kept.accounting;
        if eqs_as_created {
            kept.eqs = Some((o.aeq, o.ceq));
            want.eqs += 2;
        } else {
            kept.eqs = None;
            for eqn in [o.ceq, o.aeq] {
                let mut c = cmd(CmdOpcode::DestroyEq, 0, 0x10);
                let _ = DestroyEqIn::new_unchecked(&mut c[..]).set_eq_number(eqn);
                ok(self.rig, &c, OUT);
            }
        }
        assert_eq!(
            self.rig.fw.accounting(),
            want,
            "after an input's objects are destroyed, the function does not account like the \
             kept state"
        );
    }

    fn modify(&mut self, op: CmdOpcode, f: impl FnOnce(&mut rnic_mlx5_prm::Qpc<&mut [u8]>)) {
        let mut c = cmd(op, 0, 0x110);
        let mut v = Rst2initQpIn::new_unchecked(&mut c[..]);
        let _ = v.set_qpn(self.qpn);
        f(&mut v.qpc_mut());
        ok(self.rig, &c, OUT);
    }

    fn connect(&mut self, peer: Ipv4Addr) {
        self.modify(CmdOpcode::Rst2InitQp, |q| {
            let _ = q.set_rre(1);
            let _ = q.set_rwe(1);
            let _ = q.set_rae(1);
            let _ = q.primary_address_path_mut().set_vhca_port_num(1);
        });
        self.modify(CmdOpcode::Init2RtrQp, |q| {
            let _ = q.set_mtu(3);
            let _ = q.set_log_msg_max(20);
            let _ = q.set_remote_qpn(0x1234);
            let _ = q.set_next_rcv_psn(0x100);
            let _ = q.set_min_rnr_nak(12);
            let _ = q.set_log_rra_max(4);
            let mut a = q.primary_address_path_mut();
            let _ = a.set_src_addr_index(0);
            let _ = a.set_rgid_rip(&Gid::from_ipv4(peer).0);
            let _ = a.set_hop_limit(64);
            let _ = a.set_udp_sport(0xdcba);
            let _ = a.set_vhca_port_num(1);
            let _ = a.set_rmac_47_32(0x0200);
            let _ = a.set_rmac_31_0(0x1234_5678);
        });
        self.modify(CmdOpcode::Rtr2RtsQp, |q| {
            let _ = q.set_next_send_psn(0x1000);
            let _ = q.set_retry_count(7);
            let _ = q.set_rnr_retry(7);
            let _ = q.set_log_sra_max(4);
            // ~4.3 s: no retransmission timer fires within one input.
            let _ = q.primary_address_path_mut().set_ack_timeout(20);
        });
    }

    /// QUERY_QP's state.
    fn state(&mut self) -> u32 {
        let mut c = cmd(CmdOpcode::QueryQp, 0, 0x10);
        c[0x09..0x0c].copy_from_slice(&self.qpn.to_be_bytes()[1..]);
        let n = QueryQpOut::<&[u8]>::SIZE_BYTES + 16;
        let out = match self.rig.exec(&c, n) {
            Reply::Done(o) => o,
            other => panic!("QUERY_QP not delivered: {other:?}"),
        };
        assert_eq!(status(&out).0, 0, "QUERY_QP failed");
        QueryQpOut::new_unchecked(&out[..]).qpc().state()
    }

    /// Write as the driver: into the memfd and the image.
    fn write(&mut self, off: u64, bytes: &[u8]) {
        self.rig.write(off, bytes);
    }

    /// Write one WQE (whole WQEBBs) at the producer index and advance it.
    fn put(&mut self, w: &[u8]) {
        for (k, bb) in w.chunks(64).enumerate() {
            let slot = (u64::from(self.sq_pi) + k as u64) & ((1 << LOG_SQ) - 1);
            let mut b = [0u8; 64];
            b[..bb.len()].copy_from_slice(bb);
            self.write(WQ + SQ_OFF + slot * 64, &b);
        }
        self.sq_pi = self.sq_pi.wrapping_add(w.len().div_ceil(64) as u16);
    }

    fn ring(&mut self, counter: u16, qpn: u32, ctrl_first: u64) {
        self.write(QP_DBR + 4, &u32::from(counter).to_be_bytes());
        let value = (ctrl_first & !0xffff_ff00) | (u64::from(qpn) << 8);
        let uar = self.uar;
        self.rig.uar64(uar, 0x800, value);
    }

    /// Check every CQE written since the last look, consume them if `consume`.
    fn check_cqes(&mut self, consume: bool) {
        let st = self.rig.fw.hca_stats();
        let written = st.cqes - self.cqes0;
        // Nothing posts receives and no peer answers: every completion is a send WQE's, and
        // each WQE takes at least one of the basic blocks the doorbell record announced
        // (the record only moves forward, to `sq_pi`).
        let all = written + (st.cqes_dropped - self.dropped0);
        assert!(
            all <= u64::from(self.sq_pi),
            "{all} completions (written or dropped) for {} basic blocks posted: the device \
             completed WQEs that were never posted",
            self.sq_pi
        );
        let pending = written - u64::from(self.ci);
        assert!(
            pending <= 1 << LOG_CQ,
            "{pending} CQEs outstanding in a ring of {}: an unconsumed CQE was overwritten",
            1 << LOG_CQ
        );
        let mut error = false;
        let mut ring = [0u8; 64 << LOG_CQ];
        if pending > 0 {
            self.rig.read(CQ_RING, &mut ring);
        }
        for i in 0..pending as u32 {
            let pos = self.ci + i;
            let slot = (pos as usize) & ((1 << LOG_CQ) - 1);
            let v = ErrCqe::new_unchecked(&ring[slot * 64..slot * 64 + 64]);
            let owner = (pos >> LOG_CQ) & 1;
            assert_eq!(
                v.owner(),
                owner,
                "CQE {pos}: owner bit inconsistent with its position"
            );
            let op = CqeOpcode::from_raw(v.opcode() as u8);
            assert!(
                matches!(
                    op,
                    CqeOpcode::Req
                        | CqeOpcode::RespSend
                        | CqeOpcode::RespSendImm
                        | CqeOpcode::RespSendInv
                        | CqeOpcode::RespWrImm
                        | CqeOpcode::ReqErr
                        | CqeOpcode::RespErr
                ),
                "CQE {pos}: opcode {op}"
            );
            assert_eq!(v.qpn(), self.qpn, "CQE {pos}: a CQE for another QP");
            if matches!(op, CqeOpcode::ReqErr | CqeOpcode::RespErr) {
                let s = CqeSyndrome::from_raw(v.syndrome() as u8);
                assert!(s.name().is_some(), "CQE {pos}: unknown syndrome {s}");
                error = true;
            }
        }
        if error {
            assert_eq!(self.state(), 6, "an error CQE, but the QP is not in ERR");
        }
        if consume {
            self.ci += pending as u32;
            let ci = self.ci & 0xff_ffff;
            self.write(CQ_DBR, &ci.to_be_bytes());
        }
    }

    /// No byte outside the device-written areas (CQ ring, EQ rings, MKey A's buffer, the
    /// command area) changed, and nothing outside the mapping. The command area, where any
    /// change is allowed, is not read back; of the rest, everything if `whole` (after the
    /// last round), else (after every round) the page pool and the pages between the CQ
    /// ring and MKey A's buffer (the doorbell records and the work queue): the EQ and CQ
    /// rings and MKey A's buffer may change anyway, and MKey B's buffer and the 80 KiB of
    /// pattern above them are compared by the check after the last round.
    fn check_memory(&mut self, whole: bool) {
        self.rig.assert_canary();
        let device_written = [
            (0, super::POOL),
            (ASYNC_EQ, COMP_EQ + 0x1000),
            (CQ_RING, CQ_RING + 0x1000),
            (DATA_A, DATA_A + DATA_A_LEN),
        ];
        let diff = if whole {
            self.rig.refresh_range(super::POOL, MAPPED)
        } else {
            let mut d = self.rig.refresh_range(super::POOL, QUEUES);
            d.extend(self.rig.refresh_range(CQ_DBR, DATA_A));
            d
        };
        for (i, old, new) in diff {
            let off = i as u64;
            if !device_written.iter().any(|&(s, e)| (s..e).contains(&off)) {
                panic!(
                    "memory no MKey grants changed: IOVA {:#x} ({old:#x} -> {new:#x})",
                    BASE + off
                );
            }
        }
    }
}

fn mkey(rig: &mut Rig, pd: u32, at: u64, len: u64, va: u64, all: bool) -> u32 {
    let np = (len / 4096) as usize;
    let mut c = cmd(CmdOpcode::CreateMkey, 0, 0x110 + 8 * np.next_multiple_of(2));
    let mut v = CreateMkeyIn::new_unchecked(&mut c[..]);
    let _ = v.set_translations_octword_actual_size(np.div_ceil(2) as u32);
    let mut m = v.memory_key_mkey_entry_mut();
    let _ = m.set_access_mode_1_0(1);
    let _ = m.set_lr(1);
    if all {
        let _ = m.set_lw(1);
        let _ = m.set_rr(1);
        let _ = m.set_rw(1);
        let _ = m.set_a(1);
    }
    let _ = m.set_qpn(0xff_ffff);
    let _ = m.set_mkey_7_0(0x5a);
    let _ = m.set_pd(pd);
    let _ = m.set_start_addr(va);
    let _ = m.set_len(len);
    let _ = m.set_translations_octword_size(np.div_ceil(2) as u32);
    let _ = m.set_log_page_size(12);
    let at_mtt = create_mkey_in::klm_pas_mtt.byte_offset();
    for p in 0..np {
        let e = (BASE + at + (p * 4096) as u64) | 3;
        c[at_mtt + 8 * p..at_mtt + 8 * p + 8].copy_from_slice(&e.to_be_bytes());
    }
    let out = rig.ok(&c, OUT);
    (CreateMkeyOut::new_unchecked(&out[..]).mkey_index() << 8) | 0x5a
}

/// WQE opcodes the emulator implements (and NOP).
const OPCODES: [WqeOpcode; 9] = [
    WqeOpcode::Nop,
    WqeOpcode::Send,
    WqeOpcode::SendImm,
    WqeOpcode::SendInval,
    WqeOpcode::RdmaWrite,
    WqeOpcode::RdmaWriteImm,
    WqeOpcode::RdmaRead,
    WqeOpcode::AtomicCs,
    WqeOpcode::AtomicFa,
];

/// One structured hostile WQE: control segment (opcode known or any, DS count honest or
/// not, index and QPN honest or not, completion/fence/solicited bits), remote address and
/// atomic segments, data segments naming both MKeys and bad keys at, across and beyond
/// their edges, or inline data.
fn hostile_wqe(qp: &Qp<'_>, inp: &mut Input<'_>) -> Vec<u8> {
    let o = inp.u8();
    let op = if o < 0xf0 {
        OPCODES[usize::from(o) % OPCODES.len()].as_raw()
    } else {
        inp.u8()
    };
    let mut segs: Vec<[u8; 16]> = Vec::new();
    let flags = inp.u8();
    let wop = WqeOpcode::from_raw(op);
    if matches!(
        wop,
        WqeOpcode::RdmaWrite
            | WqeOpcode::RdmaWriteImm
            | WqeOpcode::RdmaRead
            | WqeOpcode::AtomicCs
            | WqeOpcode::AtomicFa
    ) || flags & 0x80 != 0
    {
        let mut s = [0u8; 16];
        s[0..8].copy_from_slice(&(VA + u64::from(inp.u16())).to_be_bytes());
        s[8..12].copy_from_slice(&inp.u32().to_be_bytes());
        segs.push(s);
    }
    if matches!(wop, WqeOpcode::AtomicCs | WqeOpcode::AtomicFa) {
        let mut s = [0u8; 16];
        s[..8].copy_from_slice(&inp.u64().to_be_bytes());
        s[8..].copy_from_slice(&inp.u64().to_be_bytes());
        segs.push(s);
    }
    let nseg = inp.u8();
    if nseg >= 0xe0 {
        // Inline data.
        let n = usize::from(inp.u8()) % 200;
        let mut b = (INLINE_SEG_FLAG | n as u32).to_be_bytes().to_vec();
        b.extend_from_slice(inp.bytes(n));
        b.resize((4 + n).div_ceil(16) * 16, 0);
        for c in b.chunks(16) {
            let mut s = [0u8; 16];
            s.copy_from_slice(c);
            segs.push(s);
        }
    } else {
        for _ in 0..nseg % 5 {
            let k = inp.u8();
            let lkey = match k % 6 {
                0 | 1 => qp.lkey_a,
                2 => qp.lkey_b,
                3 => qp.lkey_a ^ 0x100,
                4 => INVALID_LKEY,
                _ => inp.u32(),
            };
            let base = if k % 6 == 2 { VA + 0x10_0000 } else { VA };
            let len_of = if k % 6 == 2 { DATA_B_LEN } else { DATA_A_LEN };
            let a = inp.u8();
            let addr = match a % 5 {
                0 | 1 => base + u64::from(inp.u16()) % len_of,
                2 => base.wrapping_sub(8),
                3 => base + len_of - 4,
                _ => inp.u64(),
            };
            let l = inp.u8();
            let len = match l % 5 {
                0 | 1 => u32::from(l % 64) + 1,
                2 => 8,
                3 => 0,
                _ => inp.u32(),
            };
            let mut s = [0u8; 16];
            s[0..4].copy_from_slice(&len.to_be_bytes());
            s[4..8].copy_from_slice(&lkey.to_be_bytes());
            s[8..16].copy_from_slice(&addr.to_be_bytes());
            segs.push(s);
        }
    }
    let honest_ds = 1 + segs.len() as u32;
    let ds = if flags & 0x40 != 0 {
        u32::from(inp.u8()) & 0x3f
    } else {
        honest_ds
    };
    let index = if flags & 0x20 != 0 {
        inp.u16()
    } else {
        qp.sq_pi
    };
    let qpn = if flags & 0x10 != 0 {
        inp.u32() & 0xff_ffff
    } else {
        qp.qpn
    };
    let mut w = vec![0u8; (honest_ds as usize).div_ceil(4) * 64];
    w[0..4].copy_from_slice(&((u32::from(index) << 8) | u32::from(op)).to_be_bytes());
    w[4..8].copy_from_slice(&((qpn << 8) | ds).to_be_bytes());
    // fm_ce_se: completion mode, solicited, fence from the flag bits.
    w[11] = ((flags & 0x3) << 2) | ((flags >> 2) & 1) << 1 | (((flags >> 3) & 1) * 2) << 5;
    w[12..16].copy_from_slice(&inp.u32().to_be_bytes());
    for (i, s) in segs.iter().enumerate() {
        w[16 + 16 * i..32 + 16 * i].copy_from_slice(s);
    }
    w
}

/// The `mlx5_wqe` harness: the function brought up to an RC QP in RTS (GID on a fresh
/// loopback address, EQs, a 64-entry CQ, MKey A with every right over four pages and MKey B
/// local-read-only over one, a peer address nothing listens on), then up to
/// [`MAX_ROUNDS`] rounds from `data`: structured WQEs (see `hostile_wqe`) or raw WQEBBs
/// written at the producer, the doorbell record set (honestly or not) and the UAR send
/// doorbell rung (with the right QPN or another), CQEs consumed or left to pile up, the CQ
/// and EQs armed.
///
/// The doorbell record only moves forward: after a hostile doorbell announces k blocks
/// beyond the producer, the harness's producer moves there too (a record moved back is
/// 65,536 - k WQEs to the device, one long flush of nothing new).
///
/// The function is the thread's rig (see `with_kept`): what no input can change is kept
/// (the function up to INIT_HCA and its pages, RoCE on, the GID and its bound socket, the
/// UAR, the PD, both MKeys), what an input can change is made fresh for each one (the
/// queue area rewritten, EQs, CQ and QP created and taken to RTS, then destroyed after it
/// with the firmware's accounting asserted back to the kept state's), and the counters
/// it is judged by are taken from its own start.
///
/// Asserts after every round: every CQE the emulator wrote is well-formed (a known opcode,
/// the owner bit of its ring position, this QP's number, a known syndrome on an error CQE)
/// and no unconsumed CQE was overwritten (never more outstanding than the ring holds); the
/// completions written and dropped together never outnumber the basic blocks the record
/// announced (no WQE completes that was never posted); after an error CQE, QUERY_QP says
/// ERR; no byte outside the MKeys' buffers, the CQ/EQ rings and the command area changed,
/// and none outside the DMA mapping.
pub fn send_queue(data: &[u8]) {
    with_kept(|qp| {
        rounds(qp, data, false);
    });
}

/// What one run left: the QP's state, CQEs consumed, and the emulator's counters.
#[derive(Debug, PartialEq, Eq)]
pub struct End {
    /// QUERY_QP's state.
    pub state: u32,
    /// CQEs written since RTS.
    pub cqes: u64,
    /// The data path's counters, counted from RTS.
    pub stats: rnic_mlx5_emu::HcaStats,
    /// The mapped bytes from the page pool on (rings, CQEs, EQEs, MKey buffers, the
    /// pattern; not the command area).
    pub memory: Vec<u8>,
}

/// [`send_queue`], returning what it left.
pub fn run(data: &[u8]) -> End {
    with_kept(|qp| rounds(qp, data, true)).expect("an End was asked for")
}

/// This thread's rig in the kept state.
struct Shared {
    rig: Rig,
    kept: Kept,
}

thread_local! {
    static SHARED: RefCell<Option<Shared>> = const { RefCell::new(None) };
}

/// Run `f` on a QP in RTS on this thread's rig in the kept state ([`Kept`]), then close
/// the QP. The rig is taken out of its slot for the input and put back only after a clean
/// close: an input that panicked halfway leaves no rig, and the next one brings up a new
/// function (on a new address).
fn with_kept<R>(f: impl FnOnce(&mut Qp<'_>) -> R) -> R {
    let taken = SHARED.with_borrow_mut(Option::take);
    let mut s = taken.unwrap_or_else(|| {
        let mut rig = Rig::new();
        let kept = Kept::bring_up(&mut rig);
        Shared { rig, kept }
    });
    let r = {
        let mut qp = Qp::open(&mut s.rig, &s.kept);
        let r = f(&mut qp);
        qp.close(&mut s.kept);
        r
    };
    s.rig.resets += 1;
    SHARED.with_borrow_mut(|slot| *slot = Some(s));
    r
}

/// `after` minus `before`, counter by counter.
fn since(
    before: &rnic_mlx5_emu::HcaStats,
    after: &rnic_mlx5_emu::HcaStats,
) -> rnic_mlx5_emu::HcaStats {
    let mut d = *after;
    d.eqes -= before.eqes;
    d.eqes_dropped -= before.eqes_dropped;
    d.eq_overruns -= before.eq_overruns;
    d.interrupts -= before.interrupts;
    d.cqes -= before.cqes;
    d.cqes_dropped -= before.cqes_dropped;
    d.cq_overruns -= before.cq_overruns;
    d.dma_faults -= before.dma_faults;
    d.bad_doorbells -= before.bad_doorbells;
    d.swept_doorbells -= before.swept_doorbells;
    d.wqe_errors -= before.wqe_errors;
    d.injected_error_cqes -= before.injected_error_cqes;
    d.tx_packets -= before.tx_packets;
    d.tx_dropped -= before.tx_dropped;
    d.sport_fallbacks -= before.sport_fallbacks;
    d.rx_packets -= before.rx_packets;
    d.rx_bad_icrc -= before.rx_bad_icrc;
    d.rx_dropped -= before.rx_dropped;
    d.rx_errors -= before.rx_errors;
    d
}

/// The rounds of `data` on `qp`; what they left when `end` (a QUERY_QP and a copy of the
/// memory the fuzz target does not need).
fn rounds(qp: &mut Qp<'_>, data: &[u8], end: bool) -> Option<End> {
    let mut inp = Input::new(data);
    let mut rounds = 0;
    while !inp.is_empty() && rounds < MAX_ROUNDS {
        rounds += 1;
        let what = inp.u8();
        match what % 8 {
            0..=3 => {
                let n = 1 + inp.u8() % 4;
                let mut first = 0u64;
                for i in 0..n {
                    let w = hostile_wqe(qp, &mut inp);
                    if i == n - 1 {
                        let mut b = [0u8; 8];
                        b.copy_from_slice(&w[..8]);
                        first = u64::from_be_bytes(b);
                    }
                    qp.put(&w);
                }
                let (pi, qpn) = (qp.sq_pi, qp.qpn);
                qp.ring(pi, qpn, first);
            }
            4 => {
                let n = 1 + usize::from(inp.u8() % 4);
                let raw = inp.bytes(64 * n).to_vec();
                qp.put(&raw);
                let (pi, qpn) = (qp.sq_pi, qp.qpn);
                qp.ring(pi, qpn, 0);
            }
            5 => {
                // A hostile doorbell: any counter in the record, any QPN at the UAR.
                let counter = qp.sq_pi.wrapping_add(inp.u16() % 80);
                let qpn = if inp.u8() & 1 == 0 {
                    qp.qpn
                } else {
                    inp.u32() & 0xff_ffff
                };
                let v = inp.u64();
                qp.ring(counter, qpn, v);
                // The slots it announced count as posted: the record never moves behind a
                // counter the device may have fetched up to (a record moved back by k is
                // 65,536 - k WQEs to the device, one flush loop of instrumented reads
                // that takes the fuzzer a fifth of a second; the loop itself is reached
                // by the short flushes).
                qp.sq_pi = counter;
            }
            6 => {
                // Arm the CQ (cmd in the value) or update/arm an EQ.
                let v = inp.u64();
                let uar = qp.uar;
                let k = inp.u8() % 3;
                qp.eq_doorbells |= k != 0;
                match k {
                    0 => qp.rig.uar64(uar, 0x20, v),
                    1 => qp.rig.uar32(uar, 0x40, v as u32),
                    _ => qp.rig.uar32(uar, 0x48, v as u32),
                }
            }
            _ => {}
        }
        let consume = what & 0x80 == 0;
        qp.check_cqes(consume);
        qp.check_memory(false);
    }
    if !end {
        return None;
    }
    let state = qp.state();
    let stats = since(&qp.stats0, &qp.rig.fw.hca_stats());
    qp.check_memory(true);
    Some(End {
        state,
        cqes: stats.cqes,
        stats,
        memory: qp.rig.image()[super::POOL as usize..].to_vec(),
    })
}

/// A signaled NOP: one REQ CQE.
#[cfg(test)]
fn nop(qp: &mut Qp<'_>) {
    let mut w = vec![0u8; 64];
    w[0..4].copy_from_slice(&(u32::from(qp.sq_pi) << 8).to_be_bytes());
    w[4..8].copy_from_slice(&((qp.qpn << 8) | 1).to_be_bytes());
    w[11] = 2 << 2;
    qp.put(&w);
    let (pi, qpn) = (qp.sq_pi, qp.qpn);
    qp.ring(pi, qpn, 0);
}

/// The CQE check fires on a CQE whose owner bit does not match its ring position (forged
/// by flipping it after the emulator wrote it).
#[cfg(test)]
pub(crate) fn check_a_forged_cqe() {
    let mut rig = Rig::new();
    let mut qp = Qp::new(&mut rig);
    nop(&mut qp);
    let mut last = [0u8; 1];
    qp.rig.read(CQ_RING + 63, &mut last);
    qp.rig.write(CQ_RING + 63, &[last[0] ^ 1]);
    qp.check_cqes(true);
}

/// The completion-count check fires when more WQEs complete than were posted (forged: the
/// harness forgets the block it posted).
#[cfg(test)]
pub(crate) fn check_a_forged_completion_count() {
    let mut rig = Rig::new();
    let mut qp = Qp::new(&mut rig);
    nop(&mut qp);
    qp.sq_pi = 0;
    qp.check_cqes(true);
}

/// The memory check fires on a byte outside every MKey that changed behind the driver.
#[cfg(test)]
pub(crate) fn check_a_forged_stray_write() {
    let mut rig = Rig::new();
    let mut qp = Qp::new(&mut rig);
    nop(&mut qp);
    qp.check_cqes(true);
    qp.check_memory(true);
    qp.rig.write_behind(QUEUES + 0xd000, &[0xee]);
    qp.check_memory(true);
}

/// Hand-made programs for the seed corpus.
pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    // round: what=0, n-1, then per WQE: opcode pick, flags, [raddr: u16 off, u32 rkey],
    // [atomic: 2 u64], nseg, per seg: k, a, [u16], l, then imm u32.
    let send = vec![0, 0, 1, 2, 1, 0, 0, 0, 0, 0x10, 0, 0, 0, 0, 0];
    let bad_key = vec![0, 0, 1, 2, 1, 3, 0, 0, 0, 0x10, 0, 0, 0, 0];
    let mut write_then_flush = vec![
        0, 1, // two WQEs
        4, 2, 0, 0, 0, 0, 0x5a, 0x01, 1, 0, 0, 0, 0x20, 0, 0, 0, 0, //
        1, 2, 1, 4, 0, 0, 0, 0, 0, 0, 0,
    ];
    write_then_flush.extend_from_slice(&[4, 1]);
    write_then_flush.extend_from_slice(&[0xab; 128]);
    let inline = vec![
        0, 0, 1, 2, 0xe0, 24, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19,
        20, 21, 22, 23, 24, 0, 0, 0, 0,
    ];
    let doorbells = vec![
        5, 0, 3, 1, 0, 0, 0x12, 0x34, 0, 0, 0, 0, 0, 0, 0, 0, 6, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ];
    let mut garbage = vec![4, 1];
    garbage.extend_from_slice(&[0xab; 128]);
    vec![
        ("send", send),
        ("garbage", garbage),
        ("bad-lkey", bad_key),
        ("write-then-garbage", write_then_flush),
        ("inline", inline),
        ("hostile-doorbells", doorbells),
    ]
}
