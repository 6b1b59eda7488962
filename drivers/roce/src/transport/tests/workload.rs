//! The mixed, fault-injected workload: both endpoints post SEND/+IMM,
//! WRITE/+IMM, READ and both atomics at each other over a lossy,
//! duplicating, reordering, corrupting network, and every completion is
//! checked against an oracle:
//!
//! * send completions arrive in posting order, all successful;
//! * every byte lands (WRITE targets and READ/receive buffers are poisoned
//!   before posting, then compared with the source pattern);
//! * every receive completes exactly once, in the peer's posting order, with
//!   the right length / immediate;
//! * atomics return the value predicted from posting order and the final
//!   counter equals the prediction (applied exactly once).
//!
//! The default run is small; `workload_100k_per_setting` (ignored) runs
//! 100,000 operations per fault setting:
//! `cargo test -p rnic-roce --release --lib -- --ignored --nocapture workload_100k`.

use std::collections::VecDeque;

use rnic_core::{Mtu, Rkey, SendFlags, SendOp, WcOpcode, WcStatus};

use super::*;
use crate::transport::QpStats;
use crate::transport::sim::{Faults, NetStats, Rng, Sim};

const WINDOW: usize = 32;
const RQ_DEPTH: u32 = 64;
const LARGE_MIN: usize = 64 * 1024;
const LARGE_MAX: usize = 256 * 1024;
const RSRC_LEN: usize = LARGE_MAX + 64 * 1024;
const POISON: u8 = 0xa5;

/// One fault setting.
#[derive(Clone, Copy, Debug)]
pub(super) struct Setting {
    pub name: &'static str,
    pub faults: Faults,
    /// Probability that reposting a receive is deferred (provokes RNR).
    pub starve: f64,
}

pub(super) const SETTINGS: [Setting; 6] = [
    Setting {
        name: "loss 0%",
        faults: Faults {
            loss: 0.0,
            dup: 0.0,
            reorder: 0.0,
            corrupt: 0.0,
        },
        starve: 0.0,
    },
    Setting {
        name: "loss 1%",
        faults: Faults {
            loss: 0.01,
            dup: 0.0,
            reorder: 0.0,
            corrupt: 0.0,
        },
        starve: 0.0,
    },
    Setting {
        name: "loss 5%",
        faults: Faults {
            loss: 0.05,
            dup: 0.0,
            reorder: 0.0,
            corrupt: 0.0,
        },
        starve: 0.0,
    },
    Setting {
        name: "loss 20%",
        faults: Faults {
            loss: 0.20,
            dup: 0.0,
            reorder: 0.0,
            corrupt: 0.0,
        },
        starve: 0.0,
    },
    Setting {
        name: "mix: loss 2% dup 5% reorder 10% corrupt 2% + RNR",
        faults: Faults {
            loss: 0.02,
            dup: 0.05,
            reorder: 0.10,
            corrupt: 0.02,
        },
        starve: 0.2,
    },
    Setting {
        name: "heavy mix: loss 5% dup 10% reorder 30% corrupt 5% + RNR",
        faults: Faults {
            loss: 0.05,
            dup: 0.10,
            reorder: 0.30,
            corrupt: 0.05,
        },
        starve: 0.3,
    },
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Send,
    SendImm,
    Write,
    WriteImm,
    Read,
    FetchAdd,
    CmpSwap,
}

#[derive(Clone, Copy, Debug)]
struct Op {
    id: u64,
    kind: Kind,
    len: usize,
    /// Source/landing slot (or the large slot).
    slot: usize,
    large: bool,
    /// Offset in the peer's READ source region.
    read_off: usize,
    /// Predicted original value of an atomic.
    expect_orig: u64,
}

/// What the peer's next receive completion must be.
#[derive(Clone, Copy, Debug)]
struct RecvExpect {
    id: u64,
    kind: Kind,
    len: usize,
    imm: u32,
}

/// Region keys of one endpoint.
#[derive(Clone, Copy, Debug)]
struct Keys {
    src: u32,
    dst: u32,
    rsrc: u32,
    rdst: u32,
    atom: u32,
    recv: u32,
}

const SRC_VA: u64 = 0x10_0000_0000;
const DST_VA: u64 = 0x20_0000_0000;
const RSRC_VA: u64 = 0x30_0000_0000;
const RDST_VA: u64 = 0x40_0000_0000;
const ATOM_VA: u64 = 0x50_0000_0000;
const RECV_VA: u64 = 0x60_0000_0000;

/// One direction's driver state (requests from `side` to `1 - side`).
#[derive(Debug, Default)]
struct Dir {
    posted: u64,
    inflight: VecDeque<Op>,
    free: Vec<usize>,
    large_busy: bool,
    expects: VecDeque<RecvExpect>,
    model: u64,
    completed: u64,
}

/// Totals of one setting.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Report {
    pub ops: u64,
    pub bytes: u64,
    pub large_ops: u64,
    pub sim_ns: u64,
    pub events: u64,
    pub net: NetStats,
    pub qp: [QpStats; 2],
}

fn add_stats(acc: &mut QpStats, s: &QpStats) {
    acc.tx_packets += s.tx_packets;
    acc.rx_packets += s.rx_packets;
    acc.retransmits += s.retransmits;
    acc.retries += s.retries;
    acc.timeouts += s.timeouts;
    acc.rnr_waits += s.rnr_waits;
    acc.acks_sent += s.acks_sent;
    acc.naks_sent.psn_seq += s.naks_sent.psn_seq;
    acc.naks_sent.rnr += s.naks_sent.rnr;
    acc.naks_received.psn_seq += s.naks_received.psn_seq;
    acc.naks_received.rnr += s.naks_received.rnr;
    acc.duplicate_requests += s.duplicate_requests;
    acc.duplicate_responses += s.duplicate_responses;
    acc.read_replays += s.read_replays;
    acc.atomic_replays += s.atomic_replays;
    acc.drops.psn_out_of_window += s.drops.psn_out_of_window;
    acc.drops.bad_response_psn += s.drops.bad_response_psn;
    acc.drops.no_resource += s.drops.no_resource;
}

fn add_net(acc: &mut NetStats, n: &NetStats) {
    acc.sent += n.sent;
    acc.lost += n.lost;
    acc.duplicated += n.duplicated;
    acc.reordered += n.reordered;
    acc.corrupted += n.corrupted;
    acc.crc_dropped += n.crc_dropped;
    acc.delivered += n.delivered;
}

struct Chunk {
    sim: Sim,
    keys: [Keys; 2],
    dirs: [Dir; 2],
    mtu: usize,
    small_max: usize,
    rng: Rng,
    starve: f64,
    deferred: [Vec<usize>; 2],
    bytes: u64,
    large_ops: u64,
    events: u64,
}

impl Chunk {
    fn new(setting: &Setting, seed: u64) -> Chunk {
        let mut rng = Rng::new(seed);
        let mtu = Mtu::ALL[rng.below(5) as usize];
        let psn = |rng: &mut Rng| {
            if rng.chance(0.3) {
                0xff_ffff - rng.below(300) as u32
            } else {
                rng.below(1 << 24) as u32
            }
        };
        let c = Conn {
            mtu,
            psn_a: psn(&mut rng),
            psn_b: psn(&mut rng),
            timeout: 8,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
            max_rd_atomic: 1 + rng.below(8) as u8,
            access: AccessFlags::ALL_REMOTE,
            depth: RQ_DEPTH,
        };
        let mut sim = rc_pair(&c, rng.next_u64());
        sim.faults = [setting.faults; 2];
        let m = mtu.bytes() as usize;
        let small_max = 4 * m + 1;
        let slot_bytes = WINDOW * small_max + LARGE_MAX;
        let mut keys = Vec::new();
        for (side, ep) in sim.ep.iter_mut().enumerate() {
            let local = AccessFlags::LOCAL_WRITE;
            let k = Keys {
                src: ep.mem.register(PD, SRC_VA, slot_bytes, local),
                dst: ep.mem.register(
                    PD,
                    DST_VA,
                    slot_bytes,
                    local.union(AccessFlags::REMOTE_WRITE),
                ),
                rsrc: ep
                    .mem
                    .register(PD, RSRC_VA, RSRC_LEN, AccessFlags::REMOTE_READ),
                rdst: ep.mem.register(PD, RDST_VA, slot_bytes, local),
                atom: ep
                    .mem
                    .register(PD, ATOM_VA, 64, local.union(AccessFlags::REMOTE_ATOMIC)),
                recv: ep
                    .mem
                    .register(PD, RECV_VA, RQ_DEPTH as usize * small_max, local),
            };
            fill(ep.mem.bytes_mut(k.rsrc), 0xbeef ^ side as u64);
            keys.push(k);
        }
        let keys = [keys[0], keys[1]];
        let mut ch = Chunk {
            sim,
            keys,
            dirs: [Dir::default(), Dir::default()],
            mtu: m,
            small_max,
            rng,
            starve: setting.starve,
            deferred: [Vec::new(), Vec::new()],
            bytes: 0,
            large_ops: 0,
            events: 0,
        };
        for side in 0..2 {
            ch.dirs[side].free = (0..WINDOW).rev().collect();
            // With starvation on, start with few receives so RNR NAKs happen.
            let initial = if ch.starve > 0.0 {
                8
            } else {
                RQ_DEPTH as usize
            };
            for slot in 0..initial {
                ch.post_recv(side, slot);
            }
        }
        ch
    }

    fn post_recv(&mut self, side: usize, slot: usize) {
        let k = self.keys[side];
        let base = slot * self.small_max;
        self.sim.ep[side].mem.bytes_mut(k.recv)[base..base + self.small_max].fill(POISON);
        let split = self.rng.below(self.small_max as u64 + 1) as u32;
        let va = RECV_VA + base as u64;
        let sg = [
            sge(k.recv, va, split),
            sge(k.recv, va + u64::from(split), self.small_max as u32 - split),
        ];
        post_recv(
            &mut self.sim,
            side,
            &RecvWr {
                wr_id: slot as u64,
                sg_list: &sg,
            },
        );
    }

    fn pick_len(&mut self, large_ok: bool) -> (usize, bool) {
        if large_ok && self.rng.chance(0.002) {
            let span = (LARGE_MAX - LARGE_MIN) as u64;
            return (LARGE_MIN + self.rng.below(span + 1) as usize, true);
        }
        let m = self.mtu;
        let len = match self.rng.below(10) {
            0 => 0,
            1 => 1,
            2 => m - 1,
            3 => m,
            4 => m + 1,
            5 => 2 * m,
            6 => self.small_max,
            _ => self.rng.below(self.small_max as u64 + 1) as usize,
        };
        (len, false)
    }

    /// Post the next operation from `side`.
    fn post_op(&mut self, side: usize) {
        let peer = 1 - side;
        let kind = match self.rng.below(100) {
            0..20 => Kind::Send,
            20..30 => Kind::SendImm,
            30..50 => Kind::Write,
            50..60 => Kind::WriteImm,
            60..80 => Kind::Read,
            80..90 => Kind::FetchAdd,
            _ => Kind::CmpSwap,
        };
        let large_ok = matches!(kind, Kind::Write | Kind::WriteImm | Kind::Read)
            && !self.dirs[side].large_busy;
        let (mut len, large) = self.pick_len(large_ok);
        if matches!(kind, Kind::FetchAdd | Kind::CmpSwap) {
            len = 8;
        }
        let d = &mut self.dirs[side];
        let slot = if large {
            d.large_busy = true;
            WINDOW
        } else {
            match d.free.pop() {
                Some(s) => s,
                None => return,
            }
        };
        let id = d.posted;
        d.posted += 1;
        let tag = (side as u64) << 40 | id;
        let off = slot * self.small_max;
        let k = self.keys[side];
        let pk = self.keys[peer];
        let va_src = SRC_VA + off as u64;
        let va_dst = DST_VA + off as u64;
        let va_rdst = RDST_VA + off as u64;
        let read_off = self.rng.below((RSRC_LEN - len) as u64 + 1) as usize;
        let imm = self.rng.next_u64() as u32;
        let mut expect_orig = 0;
        let op = match kind {
            Kind::Send => SendOp::Send,
            Kind::SendImm => SendOp::SendWithImm { imm },
            Kind::Write => SendOp::RdmaWrite {
                remote_addr: va_dst,
                rkey: Rkey(pk.dst),
            },
            Kind::WriteImm => SendOp::RdmaWriteWithImm {
                remote_addr: va_dst,
                rkey: Rkey(pk.dst),
                imm,
            },
            Kind::Read => SendOp::RdmaRead {
                remote_addr: RSRC_VA + read_off as u64,
                rkey: Rkey(pk.rsrc),
            },
            Kind::FetchAdd => {
                let add = self.rng.below(1000);
                expect_orig = d.model;
                d.model = d.model.wrapping_add(add);
                SendOp::AtomicFetchAdd {
                    remote_addr: ATOM_VA,
                    rkey: Rkey(pk.atom),
                    add,
                }
            }
            Kind::CmpSwap => {
                let hit = self.rng.chance(0.5);
                let compare = if hit { d.model } else { d.model ^ 1 };
                let swap = self.rng.next_u64();
                expect_orig = d.model;
                if hit {
                    d.model = swap;
                }
                SendOp::AtomicCmpSwap {
                    remote_addr: ATOM_VA,
                    rkey: Rkey(pk.atom),
                    compare,
                    swap,
                }
            }
        };
        if matches!(kind, Kind::Send | Kind::SendImm | Kind::WriteImm) {
            d.expects.push_back(RecvExpect { id, kind, len, imm });
        }
        d.inflight.push_back(Op {
            id,
            kind,
            len,
            slot,
            large,
            read_off,
            expect_orig,
        });
        // Source pattern, poisoned landing zones.
        fill(
            &mut self.sim.ep[side].mem.bytes_mut(k.src)[off..off + len],
            tag,
        );
        match kind {
            Kind::Write | Kind::WriteImm => {
                self.sim.ep[peer].mem.bytes_mut(pk.dst)[off..off + len].fill(POISON);
            }
            Kind::Read | Kind::FetchAdd | Kind::CmpSwap => {
                self.sim.ep[side].mem.bytes_mut(k.rdst)[off..off + len].fill(POISON);
            }
            _ => {}
        }
        let local_va = if matches!(kind, Kind::Read | Kind::FetchAdd | Kind::CmpSwap) {
            va_rdst
        } else {
            va_src
        };
        let local_key = if local_va == va_rdst { k.rdst } else { k.src };
        // Split the local buffer into 1..=3 SGEs.
        let nsge = 1 + self.rng.below(3) as usize;
        let mut cuts = [0usize, len, len, len];
        for c in cuts.iter_mut().take(nsge).skip(1) {
            *c = self.rng.below(len as u64 + 1) as usize;
        }
        cuts[..nsge].sort_unstable();
        let mut sg = Vec::with_capacity(nsge);
        for i in 0..nsge {
            let (a, b) = (cuts[i], if i + 1 < nsge { cuts[i + 1] } else { len });
            sg.push(sge(local_key, local_va + a as u64, (b - a) as u32));
        }
        let mut flags = SendFlags::SIGNALED;
        if len <= 256 && self.rng.chance(0.3) {
            flags = flags.union(SendFlags::INLINE);
        }
        if self.rng.chance(0.02) {
            flags = flags.union(SendFlags::FENCE);
        }
        if self.rng.chance(0.1) {
            flags = flags.union(SendFlags::SOLICITED);
        }
        self.bytes += len as u64;
        if large {
            self.large_ops += 1;
        }
        let wr = SendWr {
            ud: None,
            wr_id: id,
            sg_list: &sg,
            op,
            flags,
        };
        post_send(&mut self.sim, side, &wr);
    }

    /// Check and retire every completion so far.
    fn reap(&mut self) {
        for side in 0..2 {
            let peer = 1 - side;
            let wcs = std::mem::take(&mut self.sim.ep[side].cq.send);
            for wc in wcs {
                let d = &mut self.dirs[side];
                let Some(op) = d.inflight.pop_front() else {
                    panic!("side {side}: completion with nothing in flight: {wc:?}");
                };
                assert_eq!(
                    (wc.wr_id, wc.status),
                    (op.id, WcStatus::Success),
                    "side {side} op {op:?}"
                );
                d.completed += 1;
                let off = op.slot * self.small_max;
                let k = self.keys[side];
                let pk = self.keys[peer];
                match op.kind {
                    Kind::Write | Kind::WriteImm => {
                        let got = &self.sim.ep[peer].mem.bytes(pk.dst)[off..off + op.len];
                        let want = &self.sim.ep[side].mem.bytes(k.src)[off..off + op.len];
                        assert!(got == want, "WRITE data lost: {op:?}");
                    }
                    Kind::Read => {
                        let got = &self.sim.ep[side].mem.bytes(k.rdst)[off..off + op.len];
                        let want = &self.sim.ep[peer].mem.bytes(pk.rsrc)
                            [op.read_off..op.read_off + op.len];
                        assert!(got == want, "READ data lost: {op:?}");
                    }
                    Kind::FetchAdd | Kind::CmpSwap => {
                        let got = &self.sim.ep[side].mem.bytes(k.rdst)[off..off + 8];
                        let orig = u64::from_ne_bytes(got.try_into().expect("8 bytes"));
                        assert_eq!(orig, op.expect_orig, "atomic result: {op:?}");
                    }
                    Kind::Send | Kind::SendImm => {}
                }
                if op.large {
                    d.large_busy = false;
                } else {
                    d.free.push(op.slot);
                }
            }
            // Receive completions at `side` answer the peer's send-likes.
            let wcs = std::mem::take(&mut self.sim.ep[side].cq.recv);
            for wc in wcs {
                let Some(e) = self.dirs[peer].expects.pop_front() else {
                    panic!("side {side}: unexpected receive (duplicate delivery?): {wc:?}");
                };
                assert_eq!(wc.status, WcStatus::Success, "recv {wc:?} for {e:?}");
                let slot = wc.wr_id as usize;
                match e.kind {
                    Kind::WriteImm => {
                        assert_eq!(wc.opcode, WcOpcode::RecvRdmaWithImm);
                        assert_eq!(wc.imm_data, Some(e.imm));
                        assert_eq!(wc.byte_len as usize, e.len);
                    }
                    _ => {
                        assert_eq!(wc.opcode, WcOpcode::Recv);
                        assert_eq!(wc.byte_len as usize, e.len, "{e:?}");
                        let want_imm = (e.kind == Kind::SendImm).then_some(e.imm);
                        assert_eq!(wc.imm_data, want_imm);
                        let base = slot * self.small_max;
                        let got =
                            &self.sim.ep[side].mem.bytes(self.keys[side].recv)[base..base + e.len];
                        let tag = (peer as u64) << 40 | e.id;
                        assert!(
                            got.iter().enumerate().all(|(i, &b)| b == pattern(tag, i)),
                            "SEND data lost: {e:?}"
                        );
                    }
                }
                if self.rng.chance(self.starve) {
                    self.deferred[side].push(slot);
                } else {
                    self.post_recv(side, slot);
                }
            }
        }
    }

    fn flush_deferred(&mut self) {
        for side in 0..2 {
            for slot in std::mem::take(&mut self.deferred[side]) {
                self.post_recv(side, slot);
            }
        }
    }

    /// Run `ops` operations per direction to completion.
    fn run(&mut self, ops: u64) {
        let mut idle_rounds = 0u32;
        loop {
            for side in 0..2 {
                while self.dirs[side].posted < ops
                    && self.dirs[side].inflight.len() < WINDOW
                    && self.dirs[side].free.len() + usize::from(!self.dirs[side].large_busy) > 1
                {
                    let before = self.dirs[side].posted;
                    self.post_op(side);
                    if self.dirs[side].posted == before {
                        break;
                    }
                }
            }
            let mut n = 0;
            while n < 64 && self.sim.step() {
                n += 1;
            }
            self.events += n;
            self.reap();
            if self.rng.chance(0.02) || n == 0 {
                self.flush_deferred();
            }
            let done = self
                .dirs
                .iter()
                .all(|d| d.posted == ops && d.inflight.is_empty());
            if done {
                break;
            }
            if n == 0 {
                idle_rounds += 1;
                assert!(
                    idle_rounds < 1000,
                    "workload stalled: {:?} / {:?}\n{:?}\n{:?}",
                    self.dirs[0].inflight.front(),
                    self.dirs[1].inflight.front(),
                    self.sim.ep[0].qp.stats(),
                    self.sim.ep[1].qp.stats()
                );
            } else {
                idle_rounds = 0;
            }
        }
        self.flush_deferred();
        self.sim.run(10_000_000);
        self.reap();
        for side in 0..2 {
            let d = &self.dirs[side];
            assert!(
                d.expects.is_empty(),
                "side {side}: receives never delivered"
            );
            let ctr = &self.sim.ep[1 - side].mem.bytes(self.keys[1 - side].atom)[..8];
            let ctr = u64::from_ne_bytes(ctr.try_into().expect("8 bytes"));
            assert_eq!(ctr, d.model, "atomics not applied exactly once");
            assert_eq!(self.sim.ep[side].qp.state(), QpState::Rts);
        }
    }
}

/// Run `total` operations (both directions together) in chunks, each a
/// fresh QP pair with a random MTU and random initial PSNs.
pub(super) fn run_setting(setting: &Setting, total: u64, chunk: u64, seed: u64) -> Report {
    let mut rep = Report::default();
    let mut done = 0;
    let mut i = 0;
    while done < total {
        let n = chunk.min(total - done);
        let mut ch = Chunk::new(setting, seed.wrapping_add(i * 7919));
        ch.run(n.div_ceil(2));
        rep.ops += ch.dirs.iter().map(|d| d.completed).sum::<u64>();
        rep.bytes += ch.bytes;
        rep.large_ops += ch.large_ops;
        rep.sim_ns += ch.sim.now;
        rep.events += ch.events;
        add_net(&mut rep.net, &ch.sim.net);
        for s in 0..2 {
            add_stats(&mut rep.qp[s], ch.sim.ep[s].qp.stats());
        }
        done += n;
        i += 1;
    }
    rep
}

fn print(setting: &Setting, rep: &Report, wall: std::time::Duration) {
    let q = |f: fn(&QpStats) -> u64| f(&rep.qp[0]) + f(&rep.qp[1]);
    println!(
        "{:<58} ops {:>7} ({} large, {:.1} MB) wall {:>6.2}s sim {:>8.3}s | pkts {} lost {} dup {} reord {} crc-drop {} | retrans {} retries {} timeouts {} seqNAK {} RNR-NAK {} dupreq {} dupresp {} read-replay {} atomic-replay {}",
        setting.name,
        rep.ops,
        rep.large_ops,
        rep.bytes as f64 / 1e6,
        wall.as_secs_f64(),
        rep.sim_ns as f64 / 1e9,
        rep.net.sent,
        rep.net.lost,
        rep.net.duplicated,
        rep.net.reordered,
        rep.net.crc_dropped,
        q(|s| s.retransmits),
        q(|s| s.retries),
        q(|s| s.timeouts),
        q(|s| s.naks_sent.psn_seq),
        q(|s| s.naks_sent.rnr),
        q(|s| s.duplicate_requests),
        q(|s| s.duplicate_responses),
        q(|s| s.read_replays),
        q(|s| s.atomic_replays),
    );
}

/// A small run of every setting (the default test run).
#[test]
fn workload_every_setting_small() {
    for (i, s) in SETTINGS.iter().enumerate() {
        let t = std::time::Instant::now();
        let rep = run_setting(s, 3000, 1000, 0x5eed + i as u64);
        print(s, &rep, t.elapsed());
        assert_eq!(rep.ops, 3000);
        if s.faults.loss > 0.0 {
            assert!(rep.qp[0].retransmits + rep.qp[1].retransmits > 0);
        }
    }
}

/// 100,000 mixed operations per setting. Release only:
/// `cargo test -p rnic-roce --release --lib -- --ignored --nocapture workload_100k`.
#[test]
#[ignore = "long: run with --release -- --ignored"]
fn workload_100k_per_setting() {
    for (i, s) in SETTINGS.iter().enumerate() {
        let t = std::time::Instant::now();
        let rep = run_setting(s, 100_000, 10_000, 0x1000_0000_u64.wrapping_add(i as u64));
        print(s, &rep, t.elapsed());
        assert_eq!(rep.ops, 100_000);
    }
}
