//! A device's state and its progress engine: receive, verify, demultiplex,
//! run timers, flush.
//!
//! Everything mutable lives in one [`State`] behind the device's mutex: the
//! key table, the PDs, MRs, CQs and QPs, and the transmit and receive
//! buffers (preallocated at open: no allocation per packet). Progress is one
//! call, [`State::progress`], made by whichever thread gets there: a poller
//! in `poll_cq` (caller-driven mode) or the device's progress thread.

use std::collections::VecDeque;
use std::os::fd::AsFd;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard};

use nix::sys::eventfd::EventFd;
use rnic_core::{Mtu, QpAttr, QpCaps, QpType, WorkCompletion};
use rnic_roce::transport::{self, CompletionSink, CqSide, Instant, Io, Qp};
use rnic_roce::wire::roce::MIN_LEN;
use rustc_hash::FxHashMap;

use crate::fault::{FaultConfig, Faults, Verdict};
use crate::ident::{IcrcCheck, IdentCtx, LastIdent, Predicted, TapTable, check_icrc};
use crate::mem::{KeyAccess, Keys};
use crate::port::Port;
use crate::stats::DeviceStats;
use crate::sys::{self, BATCH, RxMsg};
use crate::tx::{Tx, TxCtx, gid_of};

/// How a device makes progress.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Progress {
    /// A thread per device waits on the sockets, a doorbell and the nearest
    /// engine deadline (epoll) and runs the engine; `cq_event_fd` and
    /// `wait_cq` work. Pollers also make progress when their CQ is empty.
    #[default]
    Thread,
    /// No thread: progress happens only inside `poll_cq`, `post_*` and
    /// `wait_cq`. Lowest latency for busy-polling applications, which must
    /// then poll (every device they use) to keep the transport going.
    Caller,
}

/// A slab of objects named by `index + 1` handles.
#[derive(Debug)]
pub struct Slab<T> {
    items: Vec<Option<T>>,
    free: Vec<usize>,
}

impl<T> Default for Slab<T> {
    fn default() -> Slab<T> {
        Slab {
            items: Vec::new(),
            free: Vec::new(),
        }
    }
}

impl<T> Slab<T> {
    /// Insert; returns the handle.
    pub fn insert(&mut self, t: T) -> u32 {
        let i = match self.free.pop() {
            Some(i) => {
                self.items[i] = Some(t);
                i
            }
            None => {
                self.items.push(Some(t));
                self.items.len() - 1
            }
        };
        (i + 1) as u32
    }

    /// The object named `h`.
    pub fn get(&self, h: u32) -> Option<&T> {
        self.items.get((h as usize).checked_sub(1)?)?.as_ref()
    }

    /// The object named `h`, mutably.
    pub fn get_mut(&mut self, h: u32) -> Option<&mut T> {
        self.items.get_mut((h as usize).checked_sub(1)?)?.as_mut()
    }

    /// Remove the object named `h`.
    pub fn remove(&mut self, h: u32) -> Option<T> {
        let i = (h as usize).checked_sub(1)?;
        let t = self.items.get_mut(i)?.take()?;
        self.free.push(i);
        Some(t)
    }

    /// Live objects.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.items.iter().flatten()
    }

    /// Live objects, mutably.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.items.iter_mut().flatten()
    }
}

/// A completion queue: a ring sized to its depth plus the event channel.
/// Destroyed when the last of its holders (the application's CQ object and
/// the QPs completing into it) is gone.
#[derive(Debug)]
pub struct CqState {
    /// Completions not yet polled, with the slab handle of their QP.
    pub ring: VecDeque<(WorkCompletion, u32)>,
    /// Holders: the CQ object and each QP completing into it.
    pub refs: u32,
    /// Entries it was created with.
    pub depth: u32,
    /// Armed by `req_notify_cq`: the next completion signals `event`.
    pub armed: bool,
    /// Signalled when an armed queue gets a completion.
    pub event: Arc<EventFd>,
    /// Completions pushed beyond `depth`.
    pub overflows: u64,
}

/// A queue pair: the engine's QP and what the provider tracks around it.
#[derive(Debug)]
pub struct QpEntry {
    /// The transport engine.
    pub qp: Qp,
    /// Send CQ handle.
    pub send_cq: u32,
    /// Receive CQ handle.
    pub recv_cq: u32,
    /// Type.
    pub qp_type: QpType,
    /// Capacities granted.
    pub caps: QpCaps,
    /// Attributes as last set (`query_qp`).
    pub attr: QpAttr,
    /// Its own slab handle (what its CQ entries name).
    pub handle: u32,
    /// Send requests posted and not yet retired by a polled completion: the
    /// send queue's room is freed at poll, so the CQ's credit reservation in
    /// core holds.
    pub sq_unpolled: u32,
    /// Receive requests posted and not yet retired by a polled completion.
    pub rq_unpolled: u32,
    /// Core discarded the QP's work (RESET, or about to be destroyed):
    /// completions it still produces are dropped, not queued.
    pub discarded: bool,
}

/// The receive buffers: [`BATCH`] slots, each big enough for a GRO datagram
/// when GRO is on.
#[derive(Debug)]
pub struct Rx {
    arena: Vec<u8>,
    slot: usize,
    msgs: [RxMsg; BATCH],
    /// Datagrams the next `recvmmsg` asks for: twice what the last one got,
    /// between 1 and [`BATCH`]. An idle or ping-pong socket asks for one or
    /// two: `recvmmsg` tries for more after the first until the socket is
    /// empty, which costs a second pass through the kernel's receive path,
    /// and the call's headers are cheap to build. Streaming asks for
    /// [`BATCH`].
    want: usize,
}

impl Rx {
    fn new(gro: bool) -> Rx {
        let slot = if gro { 65_536 } else { 8_192 };
        Rx {
            arena: vec![0; slot * BATCH],
            slot,
            msgs: [RxMsg::EMPTY; BATCH],
            want: 1,
        }
    }
}

/// Everything mutable of a device (under [`Shared::state`]).
#[derive(Debug)]
pub struct State {
    /// L_Key/R_Key → region.
    pub keys: Keys,
    /// Protection domains.
    pub pds: Slab<()>,
    /// Completion queues.
    pub cqs: Slab<CqState>,
    /// Queue pairs.
    pub qps: Slab<QpEntry>,
    /// QPN → QP handle.
    pub by_qpn: FxHashMap<u32, u32>,
    /// The next QPN to hand out.
    pub next_qpn: u32,
    /// Transmit side.
    pub tx: Tx,
    rx: Rx,
    /// Device counters.
    pub stats: DeviceStats,
    /// The nearest engine timer (the progress thread sleeps until it).
    pub next_deadline: Option<Instant>,
    /// The last IPv4 identification received, and from whom.
    last_ident: LastIdent,
    /// Per port: identifications its tap saw, not yet claimed.
    taps: Vec<TapTable>,
    /// Accept unpredictable, untapped IPv4 packets after a 15-bit check.
    ident_recovery: bool,
    /// A packet with a nonzero identification arrived this round: drain
    /// the taps at its end so their queues never overflow.
    drain_taps: bool,
    /// Injected receive-path faults (off by default).
    faults: Faults,
}

/// The state every handle of a device shares.
#[derive(Debug)]
pub struct Shared {
    /// The mutable state.
    pub state: Mutex<State>,
    /// The local addresses (GID index = position).
    pub ports: Vec<Port>,
    /// The QPNs this device hands out: all, or its slot's when it shares its
    /// addresses with other processes (`crate::share`).
    pub qpns: crate::qpns::QpnRange,
    /// The sharing membership (its slot lock); dropped after `ports`, so
    /// the slot frees only once the sockets are closed.
    pub share: Option<crate::share::Member>,
    /// The UDP port RoCE listens on (4791).
    pub roce_port: u16,
    /// The path MTU the link allows.
    pub active_mtu: Mtu,
    /// How progress is made.
    pub progress: Progress,
    /// The requester window every new QP gets.
    pub max_unacked_psns: u32,
    /// Wakes the progress thread.
    pub doorbell: EventFd,
    /// Tells the progress thread to exit.
    pub stop: AtomicBool,
    /// The engine's time zero.
    pub epoch: std::time::Instant,
}

/// The sink that routes a QP's completions into its CQs.
struct CqSink<'a> {
    cqs: &'a mut Slab<CqState>,
    send: u32,
    recv: u32,
    qp: u32,
    discarded: bool,
}

impl CompletionSink for CqSink<'_> {
    fn complete(&mut self, side: CqSide, wc: WorkCompletion) {
        if self.discarded {
            return;
        }
        let h = match side {
            CqSide::Send => self.send,
            CqSide::Recv => self.recv,
        };
        if let Some(cq) = self.cqs.get_mut(h) {
            if cq.ring.len() >= cq.depth as usize {
                cq.overflows += 1;
            }
            cq.ring.push_back((wc, self.qp));
            if cq.armed {
                cq.armed = false;
                let _ = cq.event.write(1);
            }
        }
    }
}

/// Run QP `e`'s engine with `f`, giving it memory (the key table), a packet
/// sink from its source port and its CQs: the one place an engine call is
/// wired up (posting, timers, received packets).
pub(crate) fn run_engine<R>(
    sh: &Shared,
    e: &mut QpEntry,
    keys: &mut Keys,
    cqs: &mut Slab<CqState>,
    tx: &mut Tx,
    stats: &mut DeviceStats,
    f: impl FnOnce(&mut Qp, &mut Io<'_>) -> R,
) -> R {
    let ctx = TxCtx {
        qpn: e.qp.qpn(),
        qp_type: e.qp_type,
    };
    let mut mem = KeyAccess(keys);
    let mut sink = tx.sink(&sh.ports, sh.roce_port, stats, ctx);
    let mut cq = CqSink {
        cqs,
        send: e.send_cq,
        recv: e.recv_cq,
        qp: e.handle,
        discarded: e.discarded,
    };
    let mut io = Io {
        mem: &mut mem,
        tx: &mut sink,
        cq: &mut cq,
    };
    f(&mut e.qp, &mut io)
}

impl State {
    /// A fresh state; `gso`/`gro` say what the sockets support.
    pub fn new(
        gso: bool,
        gro: bool,
        per_qp_sport: bool,
        faults: FaultConfig,
        ident_recovery: bool,
    ) -> State {
        State {
            keys: Keys::new(),
            pds: Slab::default(),
            cqs: Slab::default(),
            qps: Slab::default(),
            by_qpn: FxHashMap::default(),
            next_qpn: 0x11,
            tx: Tx::new(gso, per_qp_sport),
            rx: Rx::new(gro),
            stats: DeviceStats::default(),
            next_deadline: None,
            last_ident: None,
            taps: Vec::new(),
            ident_recovery,
            drain_taps: false,
            faults: Faults::new(faults),
        }
    }

    /// Run the engine for QP `h` with `f`, giving it memory, a packet sink and
    /// its CQs. Returns `None` when there is no such QP.
    pub fn with_qp<R>(
        &mut self,
        sh: &Shared,
        h: u32,
        f: impl FnOnce(&mut Qp, &mut Io<'_>) -> R,
    ) -> Option<R> {
        let State {
            keys,
            cqs,
            qps,
            tx,
            stats,
            ..
        } = self;
        let e = qps.get_mut(h)?;
        Some(run_engine(sh, e, keys, cqs, tx, stats, f))
    }

    /// Remove every completion of `qpn` still queued in CQ `h`.
    pub fn purge_cq(&mut self, h: u32, qpn: rnic_core::Qpn) {
        if let Some(cq) = self.cqs.get_mut(h) {
            cq.ring.retain(|(wc, _)| wc.qp_num != qpn);
        }
    }

    /// Drop a holder of CQ `h`; the last one destroys it.
    pub fn unref_cq(&mut self, h: u32) {
        let last = self.cqs.get_mut(h).is_some_and(|c| {
            c.refs = c.refs.saturating_sub(1);
            c.refs == 0
        });
        if last {
            self.cqs.remove(h);
        }
    }

    /// Send what is queued.
    pub fn flush(&mut self) {
        if self.tx.pending() > 0 {
            self.tx.flush(&mut self.stats);
        }
    }

    /// One round of progress: drain the sockets (up to `budget` datagrams per
    /// port), run due timers, flush. Returns the datagrams received.
    ///
    /// With `defer_acks` (caller-driven mode, busy polling) a round that
    /// received packets and produced nothing but ACKs leaves them queued:
    /// the caller's next call into the device (a send post, a poll, the
    /// next round, or a wait, which flushes before it sleeps) sends them, usually
    /// in the same `sendmmsg` as that call's own packets. A round that finds
    /// ACKs carried over from the previous one always flushes, so an ACK
    /// waits at most one call.
    pub fn progress(&mut self, sh: &Shared, budget: usize, defer_acks: bool) -> usize {
        let carried = self.tx.pending() > 0;
        let now = sh.now();
        let mut total = 0;
        for (pi, port) in sh.ports.iter().enumerate() {
            let mut got_here = 0;
            while got_here < budget {
                let want = self.rx.want;
                let got = match sys::recv_batch(
                    port.sock.as_fd(),
                    &mut self.rx.arena,
                    self.rx.slot,
                    &mut self.rx.msgs[..want],
                ) {
                    Ok(n) => n,
                    Err(e) => {
                        tracing::debug!(error = %e, "recvmmsg failed");
                        0
                    }
                };
                self.rx.want = (got * 2).clamp(1, BATCH);
                if got == 0 {
                    break;
                }
                self.stats.recvmmsg_calls += 1;
                for i in 0..got {
                    self.deliver(sh, pi, i, now);
                }
                got_here += got;
                // Only a full batch suggests more is waiting now; after a
                // small one the next round asks for twice as many.
                if got < BATCH {
                    break;
                }
            }
            total += got_here;
        }
        if self.drain_taps {
            self.drain_taps = false;
            for (port, table) in sh.ports.iter().zip(&mut self.taps) {
                if let Some(fd) = &port.tap {
                    table.drain(fd.as_fd());
                }
            }
        }
        // A packet held back for reordering never waits past its round.
        if let Some((pkt, src, dst)) = self.faults.take_held() {
            self.dispatch_held(sh, &pkt, src, dst, now);
        }
        self.run_timers(sh, now);
        if defer_acks && !carried && total > 0 && self.tx.only_acks() {
            self.stats.acks_deferred += 1;
        } else {
            self.flush();
        }
        total
    }

    /// Hand datagram `i` of the receive batch (from port `pi`) to its QP(s).
    fn deliver(&mut self, sh: &Shared, pi: usize, i: usize, now: Instant) {
        let State {
            keys,
            cqs,
            qps,
            by_qpn,
            tx,
            rx,
            stats,
            last_ident,
            taps,
            ident_recovery,
            drain_taps,
            faults,
            ..
        } = self;
        let m = rx.msgs[i];
        stats.rx_datagrams += 1;
        let Some(port) = sh.ports.get(pi) else { return };
        let (Some(src), false) = (m.src, m.truncated) else {
            stats.rx_malformed += 1;
            return;
        };
        let start = i * rx.slot;
        let Some(data) = rx.arena.get(start..start + m.len) else {
            stats.rx_malformed += 1;
            return;
        };
        let seg = if m.gro > 0 {
            usize::from(m.gro)
        } else {
            m.len.max(1)
        };
        let gro = m.len > seg;
        if gro {
            stats.gro_datagrams += 1;
        }
        let src_gid = gid_of(&src);
        if taps.len() < sh.ports.len() {
            taps.resize_with(sh.ports.len(), TapTable::default);
        }
        let first_bth = data.get(..12).unwrap_or(&[]);
        for (k, pkt) in data.chunks(seg).enumerate() {
            stats.rx_packets += 1;
            stats.rx_bytes += pkt.len() as u64;
            if gro {
                stats.gro_segments += 1;
            }
            if pkt.len() < MIN_LEN {
                stats.rx_malformed += 1;
                continue;
            }
            let mut cx = IdentCtx {
                last: last_ident,
                tap: port
                    .tap
                    .as_ref()
                    .and_then(|fd| Some((fd.as_fd(), taps.get_mut(pi)?))),
                recovery: *ident_recovery,
            };
            let check = check_icrc(
                port.ip,
                sh.roce_port,
                &src,
                k as u16,
                first_bth,
                pkt,
                &mut cx,
            );
            match check {
                IcrcCheck::Ok(path) => {
                    stats.icrc_ok += 1;
                    match path {
                        Predicted::Zero => stats.icrc_ident_zero += 1,
                        Predicted::GroIndex => {
                            stats.icrc_ident_gro += 1;
                            *drain_taps = true;
                        }
                        Predicted::Next => {
                            stats.icrc_ident_next += 1;
                            *drain_taps = true;
                        }
                        Predicted::V6 => {}
                    }
                }
                IcrcCheck::Tapped => {
                    stats.icrc_ok += 1;
                    stats.icrc_ident_tap += 1;
                    *drain_taps = true;
                }
                IcrcCheck::Recovered => stats.icrc_recovered += 1,
                IcrcCheck::Unverified => {
                    stats.icrc_unverified += 1;
                    if stats.icrc_unverified == 1 {
                        tracing::warn!(
                            %src,
                            "dropping IPv4 packets whose identification could not be predicted: \
                             a full ICRC check needs the identification tap (CAP_NET_RAW: run as \
                             root or `setcap cap_net_raw+ep`), or opt in to the 15-bit check \
                             with RNIC_RXE_IDENT_RECOVERY=1"
                        );
                    }
                    continue;
                }
                IcrcCheck::Bad => {
                    stats.icrc_drops += 1;
                    continue;
                }
            }
            match faults.judge() {
                Verdict::Deliver => {}
                Verdict::Drop => {
                    stats.fault_drops += 1;
                    continue;
                }
                Verdict::Hold => {
                    stats.fault_reordered += 1;
                    faults.hold(pkt, src_gid, port.gid);
                    continue;
                }
            }
            let mut d = Dispatch {
                keys,
                cqs,
                qps,
                by_qpn,
                tx,
                stats,
            };
            d.packet(sh, pkt, src_gid, port.gid, now);
            if let Some((held, held_src, held_dst)) = faults.take_held() {
                d.packet(sh, &held, held_src, held_dst, now);
            }
        }
    }

    /// Hand over a packet the fault injector held back.
    fn dispatch_held(
        &mut self,
        sh: &Shared,
        pkt: &[u8],
        src: rnic_core::Gid,
        dst: rnic_core::Gid,
        now: Instant,
    ) {
        let State {
            keys,
            cqs,
            qps,
            by_qpn,
            tx,
            stats,
            ..
        } = self;
        Dispatch {
            keys,
            cqs,
            qps,
            by_qpn,
            tx,
            stats,
        }
        .packet(sh, pkt, src, dst, now);
    }

    /// Run the timers that are due and recompute the nearest deadline.
    fn run_timers(&mut self, sh: &Shared, now: Instant) {
        let State {
            keys,
            cqs,
            qps,
            tx,
            stats,
            next_deadline,
            ..
        } = self;
        let mut next: Option<Instant> = None;
        for e in qps.iter_mut() {
            if e.qp.next_deadline().is_some_and(|d| d <= now) {
                run_engine(sh, e, keys, cqs, tx, stats, |q, io| q.on_timer(now, io));
            }
            if let Some(d) = e.qp.next_deadline() {
                next = Some(next.map_or(d, |n| n.min(d)));
            }
        }
        *next_deadline = next;
    }

    /// Note a QP's deadline; whether it is earlier than the one the progress
    /// thread sleeps towards (so it must be woken).
    pub fn note_deadline(&mut self, d: Option<Instant>) -> bool {
        match (d, self.next_deadline) {
            (Some(d), Some(n)) if d < n => {
                self.next_deadline = Some(d);
                true
            }
            (Some(d), None) => {
                self.next_deadline = Some(d);
                true
            }
            _ => false,
        }
    }

    /// A copy of the device counters, with the CQ overflows summed in.
    pub fn device_stats(&self) -> DeviceStats {
        let mut s = self.stats;
        s.cq_overflows = self.cqs.iter().map(|c| c.overflows).sum();
        s
    }
}

/// The parts of [`State`] a verified packet needs to reach its QP.
struct Dispatch<'a> {
    keys: &'a mut Keys,
    cqs: &'a mut Slab<CqState>,
    qps: &'a mut Slab<QpEntry>,
    by_qpn: &'a FxHashMap<u32, u32>,
    tx: &'a mut Tx,
    stats: &'a mut DeviceStats,
}

impl Dispatch<'_> {
    /// Demultiplex a verified packet (from `src_gid` to local `dst_gid`) by
    /// BTH DestQP and run its QP's engine.
    fn packet(
        &mut self,
        sh: &Shared,
        pkt: &[u8],
        src_gid: rnic_core::Gid,
        dst_gid: rnic_core::Gid,
        now: Instant,
    ) {
        let Some(qpn) = transport::dest_qpn(pkt) else {
            self.stats.rx_malformed += 1;
            return;
        };
        let Some(e) = self
            .by_qpn
            .get(&qpn.get())
            .and_then(|&h| self.qps.get_mut(h))
        else {
            self.stats.unknown_qpn += 1;
            // Of those, another process's QPN on a shared address (its
            // owner just left, or a GRO batch mixed QPs): dropped, never
            // delivered.
            if !sh.qpns.contains(qpn.get()) {
                self.stats.foreign_qpn += 1;
            }
            return;
        };
        run_engine(sh, e, self.keys, self.cqs, self.tx, self.stats, |q, io| {
            q.receive_at(now, pkt, src_gid, dst_gid, io);
        });
    }
}

impl Shared {
    /// The engine's clock.
    pub fn now(&self) -> Instant {
        let n = u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
        Instant::from_nanos(n)
    }

    /// Lock the state (a poisoned lock is taken over: the state is plain
    /// data that no panic leaves half-updated in a way later calls trust).
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wake the progress thread.
    pub fn ring(&self) {
        if self.progress == Progress::Thread {
            let _ = self.doorbell.write(1);
        }
    }
}
