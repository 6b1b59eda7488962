//! A deterministic two-endpoint network simulation for the transport engine.
//!
//! Time is virtual (nanoseconds, jumped from event to event); a seeded
//! fault injector on each direction loses, duplicates, delays (reorders)
//! and corrupts packets. Corruption flips a bit after the sending sink has
//! computed a CRC over the packet; the receiving side recomputes it and
//! drops the packet, counted — exactly what the provider's ICRC check does.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rnic_core::{Gid, WorkCompletion};

pub(crate) use super::testkit::MemTable;
use super::{CompletionSink, CqSide, Instant, Io, PacketDest, PacketSink, Qp};

/// A small, fast, seeded PRNG (splitmix64).
#[derive(Clone, Debug)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n` > 0).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// True with probability `p`.
    pub(crate) fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
}

/// A sink that stamps a CRC-32 into the ICRC bytes (standing in for the
/// real ICRC, which needs IP headers) and queues the packets.
#[derive(Debug, Default)]
pub(crate) struct VecSink {
    pub out: Vec<(Vec<u8>, PacketDest)>,
    scratch: Vec<u8>,
    pool: Vec<Vec<u8>>,
    /// Refuse buffers (to test back-pressure).
    pub full: bool,
}

impl VecSink {
    /// Give a packet's storage back for reuse.
    pub(crate) fn recycle(&mut self, mut v: Vec<u8>) {
        v.clear();
        self.pool.push(v);
    }
}

/// CRC-32 of everything but the trailer, little-endian in the trailer.
pub(crate) fn stamp_crc(pkt: &mut [u8]) {
    let n = pkt.len().saturating_sub(4);
    let crc = crc32fast::hash(pkt.get(..n).unwrap_or(&[]));
    if let Some(t) = pkt.get_mut(n..) {
        t.copy_from_slice(&crc.to_le_bytes());
    }
}

/// The receive-side check matching [`stamp_crc`].
pub(crate) fn crc_ok(pkt: &[u8]) -> bool {
    let n = pkt.len().saturating_sub(4);
    let crc = crc32fast::hash(pkt.get(..n).unwrap_or(&[]));
    pkt.get(n..) == Some(&crc.to_le_bytes()[..])
}

impl PacketSink for VecSink {
    fn buffer(&mut self, len: usize) -> Option<&mut [u8]> {
        if self.full {
            return None;
        }
        self.scratch.clear();
        self.scratch.resize(len, 0xee);
        Some(&mut self.scratch)
    }

    fn commit(&mut self, len: usize, dest: &PacketDest) {
        let mut v = self.pool.pop().unwrap_or_default();
        v.extend_from_slice(self.scratch.get(..len).unwrap_or(&[]));
        stamp_crc(&mut v);
        self.out.push((v, *dest));
    }
}

/// Completions as two logs.
#[derive(Debug, Default)]
pub(crate) struct CqLog {
    pub send: Vec<WorkCompletion>,
    pub recv: Vec<WorkCompletion>,
}

impl CompletionSink for CqLog {
    fn complete(&mut self, side: CqSide, wc: WorkCompletion) {
        match side {
            CqSide::Send => self.send.push(wc),
            CqSide::Recv => self.recv.push(wc),
        }
    }
}

/// One endpoint: a QP and what it talks to.
#[derive(Debug)]
pub(crate) struct Endpoint {
    pub qp: Qp,
    pub mem: MemTable,
    pub cq: CqLog,
    pub tx: VecSink,
    pub gid: Gid,
}

impl Endpoint {
    pub(crate) fn new(qp: Qp, gid: Gid) -> Endpoint {
        Endpoint {
            qp,
            mem: MemTable::default(),
            cq: CqLog::default(),
            tx: VecSink::default(),
            gid,
        }
    }

    /// Run `f` with the QP and an [`Io`] over this endpoint's table, sink and CQ.
    pub(crate) fn with<R>(&mut self, f: impl FnOnce(&mut Qp, &mut Io<'_>) -> R) -> R {
        let mut io = Io {
            mem: &mut self.mem,
            tx: &mut self.tx,
            cq: &mut self.cq,
        };
        f(&mut self.qp, &mut io)
    }
}

/// Fault probabilities of one direction.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Faults {
    pub loss: f64,
    pub dup: f64,
    pub reorder: f64,
    pub corrupt: f64,
}

/// What the network did.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct NetStats {
    pub sent: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub reordered: u64,
    pub corrupted: u64,
    /// Corrupted packets dropped by the receiving CRC check.
    pub crc_dropped: u64,
    pub delivered: u64,
}

/// Two endpoints joined by a lossy network.
#[derive(Debug)]
pub(crate) struct Sim {
    pub now: u64,
    pub ep: [Endpoint; 2],
    pub faults: [Faults; 2],
    pub net: NetStats,
    pub rng: Rng,
    /// One-way latency.
    pub latency_ns: u64,
    /// Extra delay of a reordered packet: uniform in `0..reorder_ns`.
    pub reorder_ns: u64,
    queue: BinaryHeap<Reverse<(u64, u64, usize)>>,
    slots: Vec<Option<Vec<u8>>>,
    free: Vec<usize>,
    seq: u64,
}

impl Sim {
    pub(crate) fn new(a: Endpoint, b: Endpoint, seed: u64) -> Sim {
        Sim {
            now: 0,
            ep: [a, b],
            faults: [Faults::default(); 2],
            net: NetStats::default(),
            rng: Rng::new(seed),
            latency_ns: 2_000,
            reorder_ns: 20_000,
            queue: BinaryHeap::new(),
            slots: Vec::new(),
            free: Vec::new(),
            seq: 0,
        }
    }

    pub(crate) fn instant(&self) -> Instant {
        Instant::from_nanos(self.now)
    }

    /// Ring the doorbell of `side` and put what it emits on the wire.
    pub(crate) fn kick(&mut self, side: usize) {
        let now = self.instant();
        if let Some(ep) = self.ep.get_mut(side) {
            ep.with(|qp, io| qp.run(now, io));
        }
        self.drain(side);
    }

    fn enqueue(&mut self, at: u64, to: usize, pkt: Vec<u8>) {
        let slot = match self.free.pop() {
            Some(i) => {
                if let Some(s) = self.slots.get_mut(i) {
                    *s = Some(pkt);
                }
                i
            }
            None => {
                self.slots.push(Some(pkt));
                self.slots.len() - 1
            }
        };
        self.seq += 1;
        self.queue.push(Reverse((at, self.seq, slot * 2 + to)));
    }

    /// Move `side`'s emitted packets onto the wire, through the faults.
    pub(crate) fn drain(&mut self, side: usize) {
        let to = 1 - side;
        let out = match self.ep.get_mut(side) {
            Some(ep) => std::mem::take(&mut ep.tx.out),
            None => return,
        };
        let f = self.faults.get(side).copied().unwrap_or_default();
        for (pkt, _dest) in out {
            self.net.sent += 1;
            if self.rng.chance(f.loss) {
                self.net.lost += 1;
                if let Some(ep) = self.ep.get_mut(side) {
                    ep.tx.recycle(pkt);
                }
                continue;
            }
            let mut at = self.now + self.latency_ns;
            if self.rng.chance(f.reorder) {
                self.net.reordered += 1;
                at += self.rng.below(self.reorder_ns);
            }
            if self.rng.chance(f.dup) {
                self.net.duplicated += 1;
                let extra = self.rng.below(self.reorder_ns);
                self.enqueue(at + extra, to, pkt.clone());
            }
            let mut pkt = pkt;
            if self.rng.chance(f.corrupt) && !pkt.is_empty() {
                self.net.corrupted += 1;
                let bit = self.rng.below(pkt.len() as u64 * 8);
                if let Some(b) = pkt.get_mut((bit / 8) as usize) {
                    *b ^= 1 << (bit % 8);
                }
            }
            self.enqueue(at, to, pkt);
        }
    }

    /// The time of the next event, if any.
    pub(crate) fn next_event(&self) -> Option<u64> {
        let pkt = self.queue.peek().map(|Reverse((t, _, _))| *t);
        let timers = self
            .ep
            .iter()
            .filter_map(|e| e.qp.next_deadline().map(|d| d.nanos()));
        pkt.into_iter().chain(timers).min()
    }

    /// Process the next event. False when nothing is pending.
    pub(crate) fn step(&mut self) -> bool {
        let Some(t) = self.next_event() else {
            return false;
        };
        self.now = self.now.max(t);
        let now = self.instant();
        if let Some(Reverse((pt, _, tag))) = self.queue.peek().copied()
            && pt <= self.now
        {
            self.queue.pop();
            let (slot, to) = (tag / 2, tag % 2);
            let pkt = self.slots.get_mut(slot).and_then(Option::take);
            self.free.push(slot);
            if let Some(pkt) = pkt {
                if !crc_ok(&pkt) {
                    self.net.crc_dropped += 1;
                } else {
                    self.net.delivered += 1;
                    let src = self.ep.get(1 - to).map_or(Gid::ZERO, |e| e.gid);
                    if let Some(ep) = self.ep.get_mut(to) {
                        ep.with(|qp, io| qp.receive(now, &pkt, src, io));
                        ep.tx.recycle(pkt);
                    }
                }
                self.drain(to);
            }
            return true;
        }
        for side in 0..2 {
            let due = self
                .ep
                .get(side)
                .and_then(|e| e.qp.next_deadline())
                .is_some_and(|d| d <= now);
            if due {
                if let Some(ep) = self.ep.get_mut(side) {
                    ep.with(|qp, io| qp.on_timer(now, io));
                }
                self.drain(side);
            }
        }
        true
    }

    /// Step until nothing is pending or `max_steps` events ran; returns the
    /// number of events processed.
    pub(crate) fn run(&mut self, max_steps: u64) -> u64 {
        let mut n = 0;
        while n < max_steps && self.step() {
            n += 1;
        }
        n
    }
}
