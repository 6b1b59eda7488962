//! A device's state and its progress engine: receive, verify, demultiplex,
//! run timers, flush.
//!
//! The state is split by who needs it, so that posting and polling take no
//! device-wide lock:
//!
//! * each QP's engine, transmit queue and queue counts ([`QpShared`]) sit
//!   behind the QP's own lock, which the QP object and the receive/timer
//!   path share (the application's `&mut` post on it meets only a round
//!   delivering a packet to that same QP);
//! * each CQ's ring ([`CqShared`]) behind its own lock, shared by its
//!   poller and the QPs completing into it;
//! * the QPN table ([`Shared::qps`]) is written at create and destroy and
//!   read by the receive and timer path only, through a copy of its own
//!   (under [`Shared::rx`], reloaded when [`Shared::qps_gen`] moves; a
//!   destroyed QP leaves the copy under the rx lock before its destruction
//!   goes on), so a round takes no table lock;
//! * the key table ([`Shared::keys`]) is read-locked by an engine call for
//!   its memory accesses (readers side by side) and written at
//!   registration, deregistration and a peer's invalidation;
//! * the receive path ([`RxState`]: buffers, identification prediction and
//!   tap tables, fault injection, receive counters) behind [`Shared::rx`],
//!   held by whichever thread runs a round of progress
//!   ([`RxState::progress`]): a poller whose CQ is empty (if no other
//!   thread is in a round) or the device's progress thread.
//!
//! Lock order: rx → QPN table (read) → one QP → key table (read) → one CQ
//! ring. No thread holds two QPs' or two CQs' locks. Destroying a QP takes
//! the table's write lock, then rx, each alone. Buffers are preallocated or
//! grown once (no allocation per packet).

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockWriteGuard, TryLockError};

use nix::sys::eventfd::EventFd;
use rnic_core::{
    DirectSpan, MemAccess, Memory, Mtu, PinnedSpan, QpAttr, QpCaps, QpType, WorkCompletion,
};
use rnic_roce::transport::{self, CompletionSink, CqSide, Instant, Io, Qp, QpStats};
use rnic_roce::wire::ICRC_LEN;
use rnic_roce::wire::roce::MIN_LEN;
use rustc_hash::FxHashMap;

use crate::fault::{FaultConfig, Faults, Verdict};
use crate::ident::{
    IcrcCache, IcrcCheck, IdentCtx, LastIdent, Predicted, TapTable, check_icrc, check_icrc_seen,
};
use crate::mem::{KeyAccess, Keys};
use crate::port::Port;
use crate::stats::DeviceStats;
use crate::sys::{self, BATCH, RxMsg};
use crate::tx::{SendSockets, Tx, TxCtx, gid_of};

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

    /// Remove the object named `h`.
    pub fn remove(&mut self, h: u32) -> Option<T> {
        let i = (h as usize).checked_sub(1)?;
        let t = self.items.get_mut(i)?.take()?;
        self.free.push(i);
        Some(t)
    }
}

/// The polled side of a QP's queue counts: requests retired by completions
/// the application has polled. Written only by the poller of the QP's send
/// CQ (`sends`) and of its receive CQ (`recvs`), under that CQ's ring lock;
/// read by the QP's poster (its own lock) to know the queue's room.
#[derive(Debug, Default)]
pub struct Polled {
    /// Send requests retired (signalled ones and the unsignalled ones they
    /// retire).
    pub sends: AtomicU32,
    /// Receive requests retired.
    pub recvs: AtomicU32,
}

/// A CQ's ring and what its poller needs: the completions not yet polled,
/// each with the slot of its QP's [`Polled`] counts.
#[derive(Debug)]
pub struct CqRing {
    /// Completions not yet polled, with their QP's slot in `qps`.
    pub entries: VecDeque<(WorkCompletion, u32)>,
    /// The counts of each QP completing into this CQ (a slot per side).
    pub qps: Slab<Arc<Polled>>,
    /// Armed by `req_notify_cq`: the next completion signals `event`.
    pub armed: bool,
}

/// A completion queue: its own ring (its own lock: the poller and the QPs
/// completing into it share it, nothing else) plus the event channel.
/// Destroyed when the last of its holders (the application's CQ object and
/// the QPs completing into it) is gone.
#[derive(Debug)]
pub struct CqShared {
    /// The ring.
    pub ring: Mutex<CqRing>,
    /// Entries it was created with.
    pub depth: u32,
    /// Completions in the ring (written under the ring lock after every
    /// change; read without it): an empty poll takes no lock.
    pub queued: AtomicUsize,
    /// Signalled when an armed queue gets a completion.
    pub event: EventFd,
}

impl CqShared {
    /// The ring, locked (a poisoned lock is taken over: the ring is plain
    /// data that no panic leaves half-updated).
    pub fn lock(&self) -> MutexGuard<'_, CqRing> {
        self.ring.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Move up to `wcs.len()` completions out, giving their queues' room
    /// back (at poll: the provider contract). Returns how many.
    pub fn poll_into(&self, wcs: &mut [WorkCompletion]) -> usize {
        // Empty (as of the last push or pop under the lock): nothing to
        // take. A completion pushed concurrently is seen by the next poll,
        // as it would be had the lock been taken just before the push.
        if self.queued.load(Ordering::Acquire) == 0 {
            return 0;
        }
        let mut r = self.lock();
        let CqRing { entries, qps, .. } = &mut *r;
        let mut n = 0;
        for slot in wcs.iter_mut() {
            let Some((wc, q)) = entries.pop_front() else {
                break;
            };
            if let Some(p) = qps.get(q) {
                if wc.opcode.is_recv() {
                    p.recvs.fetch_add(1, Ordering::Release);
                } else {
                    p.sends
                        .fetch_add(wc.retired_unsignaled.saturating_add(1), Ordering::Release);
                }
            }
            *slot = wc;
            n += 1;
        }
        self.queued.store(entries.len(), Ordering::Release);
        n
    }

    /// Remove every completion of the QP in `slot`.
    pub fn purge(&self, slot: u32) {
        let mut r = self.lock();
        r.entries.retain(|&(_, q)| q != slot);
        self.queued.store(r.entries.len(), Ordering::Release);
    }
}

/// A queue pair's state, owned by the QP object and reached by the receive
/// and timer path through the device's QPN table.
#[derive(Debug)]
pub struct QpShared {
    /// Its number (fixed).
    pub qpn: rnic_core::Qpn,
    /// The engine and everything around it.
    pub inner: Mutex<QpInner>,
    /// The engine's nearest deadline in nanoseconds + 1 (0: none), so the
    /// timer scan skips QPs without locking them.
    pub deadline: AtomicU64,
    /// Requests retired by polled completions.
    pub polled: Arc<Polled>,
    /// With a poll handoff: whether the application answers on this QP, so
    /// its ACKs are worth holding for a post. Set by every send post; cleared
    /// when a hold runs out with this QP's ACKs still queued (a passive
    /// responder, whose ACKs then leave at once).
    pub answering: AtomicBool,
}

impl QpShared {
    /// The QP's state, locked (a poisoned lock is taken over, as for the
    /// CQ ring).
    pub fn lock(&self) -> MutexGuard<'_, QpInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Record the engine's deadline after a call (the caller holds the lock).
    pub fn set_deadline(&self, d: Option<Instant>) {
        let v = d.map_or(0, |d| d.nanos().saturating_add(1));
        if self.deadline.load(Ordering::Relaxed) != v {
            self.deadline.store(v, Ordering::Relaxed);
        }
    }

    /// The deadline last recorded.
    pub fn deadline(&self) -> Option<Instant> {
        match self.deadline.load(Ordering::Relaxed) {
            0 => None,
            v => Some(Instant::from_nanos(v - 1)),
        }
    }
}

/// What a QP's lock guards: the engine, its transmit queue, its CQs and the
/// posted side of its queue counts.
#[derive(Debug)]
pub struct QpInner {
    /// The transport engine.
    pub qp: Qp,
    /// Send CQ and this QP's slot in its ring.
    pub send_cq: Arc<CqShared>,
    /// The slot in the send CQ.
    pub send_slot: u32,
    /// Receive CQ.
    pub recv_cq: Arc<CqShared>,
    /// The slot in the receive CQ.
    pub recv_slot: u32,
    /// Type.
    pub qp_type: QpType,
    /// Capacities granted.
    pub caps: QpCaps,
    /// Attributes as last set (`query_qp`).
    pub attr: QpAttr,
    /// Send requests posted (wrapping; minus [`Polled::sends`]: those not
    /// yet retired by a polled completion, so the CQ's credit reservation
    /// in core holds).
    pub sq_posted: u32,
    /// Receive requests posted (wrapping).
    pub rq_posted: u32,
    /// Core discarded the QP's work (RESET, or about to be destroyed):
    /// completions it still produces are dropped, not queued.
    pub discarded: bool,
    /// Its packets not yet sent.
    pub tx: Tx,
    /// Its transmit counters (summed into the device's).
    pub stats: DeviceStats,
}

impl QpInner {
    /// Send and receive requests not yet retired by a polled completion.
    pub fn unpolled(&self, polled: &Polled) -> (u32, u32) {
        (
            self.sq_posted
                .wrapping_sub(polled.sends.load(Ordering::Acquire)),
            self.rq_posted
                .wrapping_sub(polled.recvs.load(Ordering::Acquire)),
        )
    }

    /// Send what is queued.
    pub fn flush(&mut self, sh: &Shared) {
        self.tx.flush(&sh.send, &mut self.stats);
    }

    /// Drop the completions it has queued and its requests' claim on the
    /// queues (RESET or destruction): returns what was outstanding.
    pub fn discard(&mut self, polled: &Polled) -> (u32, u32) {
        self.send_cq.purge(self.send_slot);
        self.recv_cq.purge(self.recv_slot);
        // After the purge no poller retires anything of this QP: the
        // counts are final.
        let d = self.unpolled(polled);
        self.sq_posted = polled.sends.load(Ordering::Acquire);
        self.rq_posted = polled.recvs.load(Ordering::Acquire);
        d
    }
}

/// The receive buffers: [`BATCH`] slots, each big enough for a GRO datagram
/// when GRO is on.
#[derive(Debug)]
pub struct Rx {
    pub(crate) arena: Vec<u8>,
    pub(crate) slot: usize,
    pub(crate) msgs: [RxMsg; BATCH],
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

/// The taps are drained at the end of a round once the copies they may
/// hold since the last drain could have charged this much to a tap's
/// receive buffer (`sys::ident_tap` asks for 1 MiB; 416 KiB is the
/// unprivileged fallback's): well below it, so no copy is dropped for
/// room. Draining at every round that saw such a packet cost a system call
/// per round — on loopback, where the segments of a GRO datagram verify
/// with their index but the tap only ever sees identification 0, a call
/// that always found the queue empty, one per 8-byte ping-pong round trip
/// (issue 11). A packet that no prediction verifies drains its port's tap
/// at once (rnic-roce's `check_icrc`), so a late drain never hides an
/// identification.
pub(crate) const TAP_DRAIN_AT: usize = 128 << 10;

/// What one tapped copy is charged beyond its bytes: a socket buffer's
/// overhead (`sk_buff`, shared info, alignment), generously.
pub(crate) const TAP_COPY_CHARGE: usize = 1024;

/// The receive path's state (under [`Shared::rx`]): whoever runs a round
/// of progress holds it; posting and polling never touch it.
#[derive(Debug)]
pub struct RxState {
    pub(crate) rx: Rx,
    /// Receive-path counters.
    pub stats: DeviceStats,
    /// The last IPv4 identification received, and from whom.
    last_ident: LastIdent,
    /// The CRC over received packets' constant prefixes, per shape.
    icrc: IcrcCache,
    /// Per port: identifications its tap saw, not yet claimed.
    taps: Vec<TapTable>,
    /// Accept unpredictable, untapped IPv4 packets after a 15-bit check.
    ident_recovery: bool,
    /// What the taps may hold since they were last drained: every IPv4
    /// packet that verified with the sender's previous identification + 1
    /// (a tap's filter drops identification 0, and a GRO datagram's
    /// segments share its first one's header: see `count_icrc_ok`) is
    /// charged its bytes and [`TAP_COPY_CHARGE`]; a round ending at
    /// [`TAP_DRAIN_AT`] or more drains them.
    tap_pending: usize,
    /// Injected receive-path faults (off by default).
    faults: Faults,
    /// The receive path's copy of [`Shared::qps`] (reloaded when
    /// [`Shared::qps_gen`] moves; a destroyed QP leaves it under this lock
    /// before its destruction goes on), so a round takes no table lock.
    table: QpTable,
    /// The generation `table` was copied at ([`TABLE_NONE`]: none yet).
    table_gen: u64,
    /// QPs this round gave packets to send (flushed, or deferred, at its
    /// end).
    touched: Touched,
    /// QPs holding ACKs a round left for the application's next call.
    deferred: Vec<Arc<QpShared>>,
    /// When the oldest of `deferred` was deferred (engine nanoseconds).
    deferred_since: u64,
    /// The nearest QP deadline the last round's timer scan found,
    /// nanoseconds + 1 (0: none): what the progress thread sleeps towards
    /// (`Shared::next_deadline` may be stored by another thread's round).
    pub scan_next: u64,
    /// Receive placement's state (`RxeConfig::rx_place`; `None`: off).
    placing: Option<Placing>,
}

/// Receive placement's state ([`RxeConfig::rx_place`](crate::RxeConfig::rx_place)).
#[derive(Debug, Default)]
struct Placing {
    /// The port and QP the last datagram's READ responses went to, while
    /// that QP expects more: the next datagram on that port is received
    /// into its READ's buffer.
    hint: Option<(usize, Arc<QpShared>)>,
    /// Datagrams to receive as usual before predicting again (after one
    /// that was not as predicted).
    cool: u32,
}

/// Most responses one placed datagram is predicted to carry (UDP GRO's
/// segment limit).
const PLACE_MAX_SEGS: usize = 64;
/// Distinct registrations one placed datagram may write (the payload
/// pieces' memories, pinned for the receive).
const PLACE_REGIONS: usize = 4;
/// Scatter entries: per response its header, up to four payload pieces and
/// its tail; one for whatever follows.
const PLACE_IOV: usize = PLACE_MAX_SEGS * 6 + 1;
/// Datagrams received as usual after one that was not as predicted (bounds
/// what interleaved streams cost: a datagram that is not as predicted is
/// copied twice).
const PLACE_COOL: u32 = 8;

/// One response of a placement plan: where it lies in the datagram, and
/// its payload's pieces (registration index, offset in it, bytes).
#[derive(Clone, Copy, Debug)]
struct PlanSeg {
    resp: transport::ExpectedResponse,
    at: usize,
    pieces: [(usize, usize, usize); 4],
    n: usize,
}

/// What a placement attempt did.
enum Placed {
    /// Received one datagram (placed, or reassembled and received as usual).
    Got,
    /// Nothing was waiting.
    Empty,
    /// No prediction: receive as usual.
    Unpredicted,
}

/// What a round does with the ACKs it produces when it produces nothing
/// else (see [`RxState::progress`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Defer {
    /// Send them at the round's end.
    Never,
    /// Leave them for the caller's next call (an application's round):
    /// a later round that finds them still queued sends them.
    NextCall,
    /// The progress thread's round: leave them, and send them at the first
    /// round [`Shared::ack_hold_ns`] or more after they were deferred.
    Hold,
}

/// The control path's state: PDs and QPN allocation.
#[derive(Debug)]
pub struct Ctl {
    /// Protection domains.
    pub pds: Slab<()>,
    /// The next QPN to hand out.
    pub next_qpn: u32,
}

/// The state every handle of a device shares. No lock here is taken by
/// `post_send`/`post_recv`/`poll` except the key table's read lock (inside
/// an engine call that reads or writes memory); see the crate docs.
#[derive(Debug)]
pub struct Shared {
    /// L_Key/R_Key → region: written at registration, deregistration and a
    /// peer's invalidation; read by every engine call that touches memory.
    pub keys: RwLock<Keys>,
    /// QPN → QP: written at create and destroy (each bumping `qps_gen`
    /// under the write lock), copied by the receive path when `qps_gen`
    /// moves (never read by posting or polling).
    pub qps: RwLock<FxHashMap<u32, Arc<QpShared>>>,
    /// Bumped (under `qps`' write lock) by every change of `qps`.
    pub qps_gen: AtomicU64,
    /// PDs and QPN allocation (control path).
    pub ctl: Mutex<Ctl>,
    /// The receive path.
    pub rx: Mutex<RxState>,
    /// The send sockets every QP's transmit side shares.
    pub send: SendSockets,
    /// Transmit counters of destroyed QPs.
    pub retired: Mutex<DeviceStats>,
    /// Completions pushed beyond a CQ's depth.
    pub cq_overflows: AtomicU64,
    /// The nearest engine deadline the last round's timer scan found, in
    /// nanoseconds + 1 (0: none): a caller-driven wait sleeps until it (the
    /// progress thread sleeps towards its own round's `RxState::scan_next`).
    pub next_deadline: AtomicU64,
    /// Bumped by every post or modify that gives a QP a deadline (see
    /// [`Shared::note_deadline`]).
    pub deadline_gen: AtomicU64,
    /// When the sleeping progress thread wakes, engine nanoseconds + 1
    /// (0: it is awake and scans before it sleeps).
    pub thread_wake_at: AtomicU64,
    /// Some QP holds ACKs a round deferred (the next poll, post or the
    /// progress thread's hold sends them).
    pub acks_waiting: AtomicBool,
    /// Progress-thread devices with a poll handoff (`RxeConfig::
    /// poll_handoff`): how long (ns) ACKs the thread's or a poll's round
    /// deferred may wait for the application's next post to carry them.
    /// 0: no handoff (rounds never defer, the thread always watches the
    /// sockets).
    pub ack_hold_ns: u64,
    /// The progress thread's receive moderation (`RxeConfig::
    /// rx_moderation`); `None` for caller-driven devices and devices with a
    /// poll handoff (their polling application receives).
    pub rx_moderation: Option<crate::provider::RxModeration>,
    /// The progress thread is asleep for longer than `ack_hold_ns`: a poll
    /// that defers ACKs rings the doorbell so that the hold is kept.
    pub thread_napping: AtomicBool,
    /// The progress thread's last sleep was followed by dense arrivals
    /// (receive moderation's measure; it naps after two in a row): a
    /// waiter then leaves the sockets to it (`RxeCq::wait`).
    pub thread_in_stream: AtomicBool,
    /// Engine time (ns) until which waiters leave the sockets to the
    /// progress thread: a waiter's round found a stream
    /// (`RxeCq::wait`).
    pub waiters_off_until: AtomicU64,
    /// The progress thread's epoll set: the sockets (data = port index),
    /// the doorbell (`u64::MAX`). `None` for caller-driven devices.
    pub epoll: Option<nix::sys::epoll::Epoll>,
    /// With a handoff: whether the sockets are armed in `epoll`. A polling
    /// application receives itself, so its empty polls disarm them (the
    /// thread would only wake to find the packet gone) and its polls that
    /// return completions, `req_notify` and waits arm them again.
    pub sockets_watched: AtomicBool,
    /// Engine time (ns) of the last empty poll that ran a round: the
    /// thread re-arms the sockets itself after [`HANDOFF_IDLE_NS`] without
    /// one (a poller that left without arming them: another thread's
    /// racing poll, or a program that stops calling on an empty CQ).
    pub last_app_round: AtomicU64,
    /// A poll took completions while the sockets were the application's:
    /// the next send post hands them back (`Shared::poller_took_completions`).
    pub give_back_at_post: AtomicBool,
    /// Bumped by each round that defers ACKs: the ACK sweeper flushes only
    /// what has waited a whole period (the same generation seen twice).
    pub acks_gen: AtomicU64,
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
    /// Whether the receive sockets busy-poll the NIC.
    pub busy_poll: crate::provider::BusyPoll,
    /// The requester window every new QP gets.
    pub max_unacked_psns: u32,
    /// Wakes the progress thread.
    pub doorbell: EventFd,
    /// Tells the progress thread to exit.
    pub stop: AtomicBool,
    /// The engine's time zero: [`sys::monotonic_ns`] at open.
    pub epoch_ns: u64,
}

/// The sink that routes a QP's completions into its CQs.
struct CqSink<'a> {
    send: &'a CqShared,
    send_slot: u32,
    recv: &'a CqShared,
    recv_slot: u32,
    discarded: bool,
    overflows: &'a AtomicU64,
}

impl CompletionSink for CqSink<'_> {
    fn complete(&mut self, side: CqSide, wc: WorkCompletion) {
        if self.discarded {
            return;
        }
        let (cq, slot) = match side {
            CqSide::Send => (self.send, self.send_slot),
            CqSide::Recv => (self.recv, self.recv_slot),
        };
        let mut r = cq.lock();
        if r.entries.len() >= cq.depth as usize {
            self.overflows.fetch_add(1, Ordering::Relaxed);
        }
        r.entries.push_back((wc, slot));
        cq.queued.store(r.entries.len(), Ordering::Release);
        if r.armed {
            r.armed = false;
            let _ = cq.event.write(1);
        }
    }
}

/// Run the engine of QP `e` (locked by the caller) with `f`, giving it
/// memory (the key table), a packet sink (its own transmit queue) and its
/// CQs: the one place an engine call is wired up (posting, timers,
/// received packets).
pub(crate) fn run_engine<R>(
    sh: &Shared,
    e: &mut QpInner,
    f: impl FnOnce(&mut Qp, &mut Io<'_>) -> R,
) -> R {
    run_engine_with(sh, e, &mut KeyAccess::new(&sh.keys), f)
}

/// [`run_engine`] with the caller's view of the key table (the receive
/// path keeps one, and its read lock, across the packets of a datagram).
fn run_engine_with<R>(
    sh: &Shared,
    e: &mut QpInner,
    mem: &mut KeyAccess<'_>,
    f: impl FnOnce(&mut Qp, &mut Io<'_>) -> R,
) -> R {
    let QpInner {
        qp,
        send_cq,
        send_slot,
        recv_cq,
        recv_slot,
        qp_type,
        discarded,
        tx,
        stats,
        ..
    } = e;
    let ctx = TxCtx {
        qpn: qp.qpn(),
        qp_type: *qp_type,
    };
    let mut sink = tx.sink(&sh.send, &sh.ports, sh.roce_port, stats, ctx);
    let mut cq = CqSink {
        send: send_cq,
        send_slot: *send_slot,
        recv: recv_cq,
        recv_slot: *recv_slot,
        discarded: *discarded,
        overflows: &sh.cq_overflows,
    };
    let mut io = Io {
        mem,
        tx: &mut sink,
        cq: &mut cq,
    };
    f(qp, &mut io)
}

/// Note that `q` has packets queued (dedup against the last few entries: a
/// flush of a QP with nothing queued costs a lock and a length check).
fn touch(touched: &mut Touched, q: &Arc<QpShared>, e: &QpInner) {
    touched.other |= !e.tx.only_acks();
    if !touched.qps.iter().rev().take(4).any(|t| Arc::ptr_eq(t, q)) {
        touched.qps.push(Arc::clone(q));
    }
}

/// The QPs a round gave packets to send, and whether any of them was given
/// more than ACKs (noted under each QP's lock as it is touched, so the
/// round's end need not lock them again to decide whether to defer).
#[derive(Debug, Default)]
struct Touched {
    qps: Vec<Arc<QpShared>>,
    /// A touched QP's queue held something other than ACKs/NAKs. A post
    /// that flushes such a queue between the touch and the round's end only
    /// makes this conservative (the round flushes rather than defers).
    other: bool,
}

/// The QPN table as the receive path reads it.
pub(crate) type QpTable = FxHashMap<u32, Arc<QpShared>>;

/// With a poll handoff: how long after the last empty poll the progress
/// thread watches the sockets again by itself (1 ms).
pub const HANDOFF_IDLE_NS: u64 = 1_000_000;

/// `RxState::table_gen` before the first round: never a generation.
const TABLE_NONE: u64 = u64::MAX;

/// The receive path's state one datagram's delivery works on (every field
/// of [`RxState`] but the table, which it reads alongside).
struct Parts<'r> {
    rx: &'r Rx,
    stats: &'r mut DeviceStats,
    last_ident: &'r mut LastIdent,
    icrc: &'r mut IcrcCache,
    taps: &'r mut Vec<TapTable>,
    ident_recovery: bool,
    tap_pending: &'r mut usize,
    faults: &'r mut Faults,
    touched: &'r mut Touched,
    placing: Option<&'r mut Placing>,
}

impl RxState {
    /// A fresh receive state; `gro` says whether the sockets coalesce.
    pub fn new(gro: bool, faults: FaultConfig, ident_recovery: bool) -> RxState {
        RxState {
            rx: Rx::new(gro),
            stats: DeviceStats::default(),
            last_ident: None,
            icrc: IcrcCache::new(),
            taps: Vec::new(),
            ident_recovery,
            tap_pending: 0,
            faults: Faults::new(faults),
            table: QpTable::default(),
            table_gen: TABLE_NONE,
            touched: Touched::default(),
            deferred: Vec::new(),
            deferred_since: 0,
            scan_next: 0,
            placing: None,
        }
    }

    /// The same, receiving READ response payloads straight into their
    /// READs' buffers or not ([`RxeConfig::rx_place`](crate::RxeConfig::rx_place)).
    pub fn with_placement(mut self, on: bool) -> RxState {
        self.placing = on.then(Placing::default);
        self
    }

    /// Forget what earlier datagrams left here, as on a freshly opened
    /// device: the identification predictor, the taps' unclaimed headers, a
    /// packet held for reordering, deferred ACKs, the counters (the fault
    /// generator is not rewound). For `crate::fuzzing::forget_receive_state`.
    pub(crate) fn forget(&mut self) {
        self.stats = DeviceStats::default();
        self.last_ident = None;
        self.icrc = IcrcCache::new();
        self.taps.clear();
        self.tap_pending = 0;
        let _ = self.faults.take_held();
        self.touched = Touched::default();
        self.deferred.clear();
        self.rx.want = 1;
    }

    /// One round of progress: drain the sockets (up to `budget` datagrams per
    /// port), run due timers, flush. Returns the datagrams received.
    ///
    /// With [`Defer::NextCall`] (an application's round: caller-driven
    /// mode, or a poll of a device whose progress thread holds ACKs) a round
    /// that received packets and produced nothing but ACKs leaves them
    /// queued in their QPs: the caller's next call (a send post on that QP, a
    /// poll, the next round, or a wait, which flushes before it sleeps) sends
    /// them, a post usually in the same `sendmmsg` as its own packets. A
    /// round that finds ACKs carried over from the previous one sends them,
    /// so an ACK waits at most one call that makes a round. With
    /// [`Defer::Hold`] (the progress thread's round) the same ACKs wait up
    /// to [`Shared::ack_hold_ns`] for a post to carry them, whatever rounds
    /// run meanwhile.
    pub fn progress(&mut self, sh: &Shared, budget: usize, defer: Defer) -> usize {
        self.sync_table(sh);
        let now = sh.now();
        let carried = !self.deferred.is_empty() && self.prune_deferred(sh);
        // Carried ACKs this round must send: all of them, or under a hold
        // those deferred a hold ago.
        let carried_due = carried
            && (defer != Defer::Hold
                || now.nanos().saturating_sub(self.deferred_since) >= sh.ack_hold_ns);
        let mut total = 0;
        for (pi, port) in sh.ports.iter().enumerate() {
            let mut got_here = 0;
            while got_here < budget {
                if port.ring.is_none() && self.placing_ready(pi) {
                    match self.place_one(sh, pi, now) {
                        Placed::Got => {
                            got_here += 1;
                            continue;
                        }
                        Placed::Empty => break,
                        Placed::Unpredicted => {}
                    }
                }
                let want = self.rx.want;
                let got = match &port.ring {
                    Some(ring) => {
                        ring.recv_batch(&mut self.rx.arena, self.rx.slot, &mut self.rx.msgs[..want])
                    }
                    None => match sys::recv_batch(
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
                    },
                };
                self.rx.want = (got * 2).clamp(1, BATCH);
                if got == 0 {
                    break;
                }
                if port.ring.is_some() {
                    self.stats.ring_batches += 1;
                } else {
                    self.stats.recvmmsg_calls += 1;
                }
                for i in 0..got {
                    let (parts, table) = self.parts();
                    deliver(parts, sh, table, pi, i, now);
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
        if self.tap_pending >= TAP_DRAIN_AT {
            self.tap_pending = 0;
            self.stats.tap_drains += 1;
            for (port, table) in sh.ports.iter().zip(&mut self.taps) {
                if let Some(fd) = &port.tap {
                    table.drain(fd.as_fd());
                }
            }
        }
        // A packet held back for reordering never waits past its round.
        if let Some((pkt, src, dst)) = self.faults.take_held() {
            let (p, table) = self.parts();
            let mut held = None;
            let mut d = Dispatch {
                table,
                stats: p.stats,
                touched: p.touched,
                held: &mut held,
            };
            d.packet(sh, &pkt, src, dst, now);
            d.release();
        }
        self.run_timers(sh, now);
        if carried_due && defer == Defer::Hold {
            self.stats.acks_held_out += 1;
            for q in &self.deferred {
                q.answering.store(false, Ordering::Relaxed);
            }
        }
        let only_acks = defer != Defer::Never
            && !carried_due
            && total > 0
            && !self.touched.qps.is_empty()
            && !self.touched.other
            && (sh.ack_hold_ns == 0
                || self
                    .touched
                    .qps
                    .iter()
                    .all(|q| q.answering.load(Ordering::Relaxed)));
        if only_acks {
            self.stats.acks_deferred += 1;
            if self.deferred.is_empty() {
                self.deferred_since = now.nanos();
            }
            // Once each: a hold spans many rounds of the same few QPs.
            for q in self.touched.qps.drain(..) {
                if !self.deferred.iter().any(|d| Arc::ptr_eq(d, &q)) {
                    self.deferred.push(q);
                }
            }
            sh.acks_gen.fetch_add(1, Ordering::Relaxed);
            sh.acks_waiting.store(true, Ordering::SeqCst);
        } else if carried && !carried_due && self.touched.qps.is_empty() {
            // A hold still running and nothing new: keep waiting for a post.
        } else if !self.touched.qps.is_empty() || !self.deferred.is_empty() {
            // (Most rounds of a ping-pong touch nothing: no call.)
            self.flush(sh);
        }
        self.touched.other = false;
        total
    }

    /// Forget the deferred ACKs that a post on their QP has sent since
    /// (bundled with its request); whether any are still queued.
    fn prune_deferred(&mut self, sh: &Shared) -> bool {
        self.deferred.retain(|q| q.lock().tx.pending() > 0);
        if self.deferred.is_empty() {
            sh.acks_waiting.store(false, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// The ACK sweeper's flush: send the ACKs a round deferred that no post
    /// has sent since (counted in `acks_swept`).
    pub fn sweep_deferred(&mut self, sh: &Shared) {
        if self.prune_deferred(sh) {
            self.stats.acks_swept += 1;
            self.flush(sh);
        }
    }

    /// Send what every QP this round or the last one touched has queued.
    pub fn flush(&mut self, sh: &Shared) {
        self.touched.other = false;
        if !self.deferred.is_empty() {
            sh.acks_waiting.store(false, Ordering::Relaxed);
            for q in self.deferred.drain(..) {
                q.lock().flush(sh);
            }
        }
        for q in self.touched.qps.drain(..) {
            q.lock().flush(sh);
        }
    }

    /// Hand datagram `i` of the receive batch (from port `pi`) to its QP(s)
    /// found in `table`.
    pub(crate) fn deliver(
        &mut self,
        sh: &Shared,
        table: &QpTable,
        pi: usize,
        i: usize,
        now: Instant,
    ) {
        let (parts, _) = self.parts();
        deliver(parts, sh, table, pi, i, now);
    }

    /// Bring the receive path's copy of the QPN table up to date with
    /// [`Shared::qps`] (one load when nothing was created or destroyed
    /// since the last round).
    fn sync_table(&mut self, sh: &Shared) {
        if sh.qps_gen.load(Ordering::Acquire) == self.table_gen {
            return;
        }
        let t = sh.qps.read().unwrap_or_else(|p| p.into_inner());
        // Read under the table's lock: writers bump it under theirs, so the
        // copy and its generation match.
        self.table_gen = sh.qps_gen.load(Ordering::Acquire);
        self.table.clone_from(&t);
    }

    /// QP `qpn` is being destroyed and is out of [`Shared::qps`]: out of
    /// the receive path's copy too (the caller holds the rx lock, so no
    /// round is using it).
    pub fn remove_qp(&mut self, qpn: u32) {
        if let Some(pl) = &mut self.placing
            && let Some((_, q)) = &pl.hint
            && self.table.get(&qpn).is_some_and(|t| Arc::ptr_eq(t, q))
        {
            pl.hint = None;
        }
        self.table.remove(&qpn);
    }

    /// Placement is on and predicts a datagram on port `pi`.
    fn placing_ready(&self, pi: usize) -> bool {
        self.placing
            .as_ref()
            .is_some_and(|p| p.cool == 0 && p.hint.as_ref().is_some_and(|(hp, _)| *hp == pi))
    }

    /// Receive the next datagram of port `pi` with its READ response
    /// payloads placed in the hinted QP's READ buffer (see
    /// [`RxeConfig::rx_place`](crate::RxeConfig::rx_place)).
    ///
    /// Under the QP's lock (so the READ can neither complete nor be
    /// flushed while the kernel writes its buffer) the engine names the
    /// responses it expects; each one's header and tail (pad, ICRC) go to
    /// the receive slot at the offset they would have in the datagram and
    /// its payload to the READ's buffer, whatever follows to the rest of
    /// the slot. The datagram is taken only when every segment is a
    /// predicted response — the GRO segmentation lands each on its planned
    /// bytes, opcode, pad, QPN and PSN as expected, and its ICRC verifies
    /// over the header, the payload read in place and the tail with a
    /// predicted identification — and the QP then takes each header
    /// (`Qp::receive_placed`). Anything else is put back together in the
    /// slot (the payloads copied back from the buffer) and received as
    /// usual: the bytes it left in the READ's buffer lie in PSNs the READ
    /// has not accepted, which the accepted responses rewrite before the
    /// READ completes.
    ///
    /// Never inlined: its plan and scatter list take some 10 KiB of stack,
    /// which inlined into [`RxState::progress`] would make every round pay
    /// for a frame that size (stack probes), placing or not.
    #[inline(never)]
    fn place_one(&mut self, sh: &Shared, pi: usize, now: Instant) -> Placed {
        let Some(port) = sh.ports.get(pi) else {
            return Placed::Unpredicted;
        };
        let Some(q) = self
            .placing
            .as_ref()
            .and_then(|p| p.hint.as_ref())
            .map(|(_, q)| Arc::clone(q))
        else {
            return Placed::Unpredicted;
        };
        if self.faults.has_held() {
            // The held packet goes first, as usual.
            return Placed::Unpredicted;
        }
        let mut e = q.lock();
        let mut mem = KeyAccess::new(&sh.keys);
        let slot = self.rx.slot;
        let Some((rp, plan, nseg, regions)) = plan_placement(&e.qp, &mem, slot) else {
            drop(e);
            if let Some(pl) = &mut self.placing {
                // (A READ into memory without direct access: not asked again
                // at every datagram.)
                pl.hint = None;
                pl.cool = PLACE_COOL;
            }
            return Placed::Unpredicted;
        };
        let pins: [Option<PinnedSpan<'_>>; PLACE_REGIONS] =
            std::array::from_fn(|r| regions[r].as_ref().and_then(|m| m.pin_direct()));
        let spans: [Option<DirectSpan<'_>>; PLACE_REGIONS] =
            std::array::from_fn(|r| pins[r].as_ref().map(PinnedSpan::span));
        let Some(arena) = self.rx.arena.get_mut(..slot) else {
            return Placed::Unpredicted;
        };
        let base = arena.as_mut_ptr();
        let mut iov = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; PLACE_IOV];
        let mut ni = 0;
        let mut push = |ptr: *mut u8, len: usize| {
            if let Some(v) = iov.get_mut(ni) {
                *v = libc::iovec {
                    iov_base: ptr.cast(),
                    iov_len: len,
                };
                ni += 1;
            }
        };
        let mut planned = 0;
        for p in plan.iter().take(nseg) {
            let r = &p.resp;
            push(base.wrapping_add(p.at), r.header);
            for &(ri, off, len) in p.pieces.iter().take(p.n) {
                let Some(Ok(ptr)) = spans[ri].map(|s| s.range(MemAccess::Write, off, len)) else {
                    return Placed::Unpredicted;
                };
                push(ptr, len);
            }
            push(
                base.wrapping_add(p.at + r.header + r.payload),
                r.pad + ICRC_LEN,
            );
            planned = p.at + r.len();
        }
        if planned < slot {
            push(base.wrapping_add(planned), slot - planned);
        }
        // SAFETY: every entry names writable memory for the call: the
        // receive slot (`arena`, borrowed mutably here, no reference into
        // it alive) or a range `DirectSpan::range` checked inside a
        // registration pinned above (`pins`) and kept alive by `regions`,
        // memory made of atomics that the kernel writes as a device's DMA
        // would; the QP's lock keeps the READ from completing meanwhile.
        let got = unsafe { sys::recv_scatter(port.sock.as_fd(), &iov[..ni]) };
        let m = match got {
            Ok(Some(m)) => m,
            Ok(None) => return Placed::Empty,
            Err(err) => {
                tracing::debug!(error = %err, "recvmsg failed");
                return Placed::Empty;
            }
        };
        self.stats.recvmmsg_calls += 1;
        let src_gid = m.src.as_ref().map(gid_of);
        let verified = match (m.src, src_gid) {
            (Some(src), Some(_)) if !m.truncated => verify_placed(
                &self.rx.arena[..m.len.min(slot)],
                &plan[..nseg],
                &spans,
                &rp,
                &m,
                port.ip,
                sh.roce_port,
                &src,
                &mut self.icrc,
                &mut self.last_ident,
            ),
            _ => None,
        };
        let (Some(paths), Some(src_gid)) = (verified, src_gid) else {
            // Not as predicted: put the datagram back together and receive
            // it as usual, after the QP's and the key table's locks go.
            fill_holes(&mut self.rx.arena[..slot], &plan[..nseg], &spans, m.len);
            drop(pins);
            drop(mem);
            drop(e);
            self.stats.rx_place_fallbacks += 1;
            if let Some(pl) = &mut self.placing {
                pl.cool = PLACE_COOL;
            }
            self.rx.msgs[0] = m;
            let (parts, table) = self.parts();
            deliver(parts, sh, table, pi, 0, now);
            return Placed::Got;
        };
        self.stats.rx_datagrams += 1;
        let (paths, segs) = paths;
        if segs > 1 {
            self.stats.gro_datagrams += 1;
        }
        for (p, &path) in plan.iter().zip(&paths[..segs]) {
            let r = &p.resp;
            let len = r.len();
            self.stats.rx_packets += 1;
            self.stats.rx_bytes += len as u64;
            if segs > 1 {
                self.stats.gro_segments += 1;
            }
            count_icrc_ok(&mut self.stats, &mut self.tap_pending, path, len);
            match self.faults.judge() {
                Verdict::Deliver => {}
                Verdict::Drop => {
                    self.stats.fault_drops += 1;
                    continue;
                }
                Verdict::Hold => {
                    self.stats.fault_reordered += 1;
                    fill_holes(
                        &mut self.rx.arena[..slot],
                        std::slice::from_ref(p),
                        &spans,
                        m.len,
                    );
                    self.faults
                        .hold(&self.rx.arena[p.at..p.at + len], src_gid, port.gid);
                    continue;
                }
            }
            let header = &self.rx.arena[p.at..p.at + r.header];
            let taken = run_engine_with(sh, &mut e, &mut mem, |qp, io| {
                qp.receive_placed(now, &rp, header, r.payload, src_gid, port.gid, io)
            });
            if taken {
                self.stats.rx_placed += 1;
                self.stats.rx_placed_bytes += r.payload as u64;
            } else {
                fill_holes(
                    &mut self.rx.arena[..slot],
                    std::slice::from_ref(p),
                    &spans,
                    m.len,
                );
                let pkt = &self.rx.arena[p.at..p.at + len];
                run_engine_with(sh, &mut e, &mut mem, |qp, io| {
                    qp.receive_at(now, pkt, src_gid, port.gid, io);
                });
            }
            // A response held back from this datagram (same QP) follows.
            if let Some((pkt, s, d)) = self.faults.take_held() {
                run_engine_with(sh, &mut e, &mut mem, |qp, io| {
                    qp.receive_at(now, &pkt, s, d, io);
                });
            }
        }
        drop(pins);
        drop(mem);
        after_run(&q, &e, &mut self.touched);
        let more = e.qp.read_placement().is_some();
        drop(e);
        if let Some(pl) = &mut self.placing
            && !more
        {
            pl.hint = None;
        }
        Placed::Got
    }

    /// Everything but the table, and the table.
    fn parts(&mut self) -> (Parts<'_>, &QpTable) {
        let RxState {
            rx,
            stats,
            last_ident,
            icrc,
            taps,
            ident_recovery,
            tap_pending,
            faults,
            table,
            touched,
            placing,
            ..
        } = self;
        (
            Parts {
                rx,
                stats,
                last_ident,
                icrc,
                taps,
                ident_recovery: *ident_recovery,
                tap_pending,
                faults,
                touched,
                placing: placing.as_mut(),
            },
            table,
        )
    }

    /// Run the timers that are due and recompute the nearest deadline.
    fn run_timers(&mut self, sh: &Shared, now: Instant) {
        let mut next: Option<Instant> = None;
        for q in self.table.values() {
            let mut d = q.deadline();
            if d.is_some_and(|d| d <= now) {
                let mut e = q.lock();
                if e.qp.next_deadline().is_some_and(|d| d <= now) {
                    run_engine(sh, &mut e, |qp, io| qp.on_timer(now, io));
                }
                d = e.qp.next_deadline();
                q.set_deadline(d);
                if e.tx.pending() > 0 {
                    touch(&mut self.touched, q, &e);
                }
            }
            if let Some(d) = d {
                next = Some(next.map_or(d, |n| n.min(d)));
            }
        }
        self.scan_next = next.map_or(0, |d| d.nanos().saturating_add(1));
        sh.next_deadline.store(self.scan_next, Ordering::Relaxed);
    }
}

/// [`RxState::deliver`] on the state's parts (inlined into the round).
///
/// The packets of one datagram (a GRO batch: one flow, so nearly always
/// one QP) share one hold of their QP's lock and of the key table's read
/// lock, taken at the first and released after the last (or when a packet
/// names another QP), instead of both locks per packet.
#[inline(always)]
fn deliver<'a>(
    p: Parts<'_>,
    sh: &'a Shared,
    table: &'a QpTable,
    pi: usize,
    i: usize,
    now: Instant,
) {
    let Parts {
        rx,
        stats,
        last_ident,
        icrc,
        taps,
        ident_recovery,
        tap_pending,
        faults,
        touched,
        placing,
    } = p;
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
    let mut held: Option<Held<'a>> = None;
    let mut verified = false;
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
        let check = match (m.ident, port.ip) {
            // The packet ring saw the IPv4 header: nothing to predict.
            (Some(seen), IpAddr::V4(local)) => check_icrc_seen(
                local,
                sh.roce_port,
                &src,
                k as u16,
                seen,
                pkt,
                last_ident,
                icrc,
            ),
            _ => {
                let mut cx = IdentCtx {
                    last: last_ident,
                    tap: port
                        .tap
                        .as_ref()
                        .and_then(|fd| Some((fd.as_fd(), taps.get_mut(pi)?))),
                    recovery: ident_recovery,
                    icrc: &mut *icrc,
                };
                check_icrc(
                    port.ip,
                    sh.roce_port,
                    &src,
                    k as u16,
                    first_bth,
                    pkt,
                    &mut cx,
                )
            }
        };
        match check {
            IcrcCheck::Ok(path) => {
                verified = true;
                count_icrc_ok(stats, tap_pending, path, pkt.len());
            }
            IcrcCheck::Tapped => {
                stats.icrc_ok += 1;
                stats.icrc_ident_tap += 1;
                *tap_pending += pkt.len() + TAP_COPY_CHARGE;
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
            table,
            stats,
            touched,
            held: &mut held,
        };
        d.packet(sh, pkt, src_gid, port.gid, now);
        if let Some((pkt, held_src, held_dst)) = faults.take_held() {
            d.packet(sh, &pkt, held_src, held_dst, now);
        }
    }
    // A verified datagram's sender and the hop it came through: where
    // frames to it may go (`crate::frames`).
    if let (true, Some(f), Some(hop), SocketAddr::V4(from), IpAddr::V4(local)) =
        (verified, &sh.send.frames, m.hop, src, port.ip)
    {
        f.observe(local, *from.ip(), hop, now.nanos());
    }
    if let Some(pl) = placing {
        pl.cool = pl.cool.saturating_sub(1);
        pl.hint = match &held {
            Some(h) if h.e.qp.read_placement().is_some() => Some((pi, Arc::clone(h.q))),
            _ => None,
        };
    }
    if let Some(h) = held {
        h.release(touched);
    }
}

/// The responses QP `qp` expects next, planned into one receive slot of
/// `slot` bytes: the prediction, up to [`PLACE_MAX_SEGS`] responses (each
/// at its datagram offset, its payload as pieces of at most
/// [`PLACE_REGIONS`] registrations that offer direct access), how many,
/// and those registrations. `None` when nothing can be placed.
#[allow(clippy::type_complexity)]
fn plan_placement(
    qp: &Qp,
    mem: &KeyAccess<'_>,
    slot: usize,
) -> Option<(
    transport::ReadPlacement,
    [PlanSeg; PLACE_MAX_SEGS],
    usize,
    [Option<Arc<dyn Memory>>; PLACE_REGIONS],
)> {
    let rp = qp.read_placement()?;
    let first = rp.response(0)?;
    let mut plan = [PlanSeg {
        resp: first,
        at: 0,
        pieces: [(0, 0, 0); 4],
        n: 0,
    }; PLACE_MAX_SEGS];
    let mut regions: [Option<Arc<dyn Memory>>; PLACE_REGIONS] = Default::default();
    let mut nseg = 0;
    let mut at = 0;
    'plan: while nseg < PLACE_MAX_SEGS {
        let Some(r) = rp.response(nseg as u32) else {
            break;
        };
        if at + r.len() > slot {
            break;
        }
        let mut lent = [None; 4];
        let Some(n) = qp.read_pieces(mem, &rp, r.offset, r.payload, &mut lent) else {
            break;
        };
        let mut pieces = [(0, 0, 0); 4];
        for (dst, piece) in pieces.iter_mut().zip(lent.iter().take(n)) {
            let Some(piece) = piece else { break 'plan };
            let known = regions
                .iter()
                .position(|m| m.as_ref().is_some_and(|m| Arc::ptr_eq(m, piece.mem)));
            let ri = match known {
                Some(ri) => ri,
                None => {
                    let Some(free) = regions.iter().position(Option::is_none) else {
                        break 'plan;
                    };
                    regions[free] = Some(Arc::clone(piece.mem));
                    free
                }
            };
            *dst = (ri, piece.offset, piece.len);
        }
        plan[nseg] = PlanSeg {
            resp: r,
            at,
            pieces,
            n,
        };
        nseg += 1;
        at += r.len();
    }
    (nseg > 0).then_some((rp, plan, nseg, regions))
}

/// Check a datagram received for placement (`slot`: the receive slot's
/// `m.len` bytes, payloads absent) against its plan: every GRO segment a
/// planned response, on its planned bytes, with the expected opcode, pad,
/// QPN and PSN, whose ICRC verifies over header, payload (read in place)
/// and tail with a predicted identification (the segment index, the
/// sender's previous + 1, 0). The identification each verified with, one
/// per segment; `None` when anything differs.
#[allow(clippy::too_many_arguments)]
fn verify_placed(
    slot: &[u8],
    plan: &[PlanSeg],
    spans: &[Option<DirectSpan<'_>>; PLACE_REGIONS],
    rp: &transport::ReadPlacement,
    m: &RxMsg,
    local: IpAddr,
    dport: u16,
    src: &std::net::SocketAddr,
    icrc: &mut IcrcCache,
    last: &mut LastIdent,
) -> Option<([Predicted; PLACE_MAX_SEGS], usize)> {
    let len = slot.len();
    let seg = if m.gro > 0 { usize::from(m.gro) } else { len };
    if len == 0 || seg == 0 {
        return None;
    }
    let nsegs = len.div_ceil(seg);
    if nsegs > plan.len() {
        return None;
    }
    let mut paths = [Predicted::V6; PLACE_MAX_SEGS];
    for (k, p) in plan.iter().take(nsegs).enumerate() {
        let r = &p.resp;
        let start = k * seg;
        if p.at != start || r.len() != seg.min(len - start) {
            return None;
        }
        let bth = slot.get(p.at..p.at + 12)?;
        let psn = u32::from_be_bytes([0, bth[9], bth[10], bth[11]]);
        let qpn = u32::from_be_bytes([0, bth[5], bth[6], bth[7]]);
        if bth[0] != r.opcode
            || usize::from((bth[1] >> 4) & 3) != r.pad
            || qpn != rp.qpn.get()
            || psn != r.psn.get()
        {
            return None;
        }
        let mut crc = 0;
        for &(ri, off, n) in p.pieces.iter().take(p.n) {
            let span = spans.get(ri).copied().flatten()?;
            crc = rnic_dma::crc::crc32_span(crc, &span, off, n).ok()?;
        }
        let head = slot.get(p.at..p.at + r.header)?;
        let tail = slot.get(p.at + r.header + r.payload..p.at + r.len())?;
        let body = (crc, r.payload);
        let path = match (src.ip(), local) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                let candidates = rnic_roce::ident::predicted_idents(k as u16, last, src);
                let (id, path) = candidates.into_iter().find_map(|(c, path)| {
                    let id = c?;
                    icrc.verify_v4_parts(s, d, id, true, src.port(), dport, head, body, tail)
                        .is_ok()
                        .then_some((id, path))
                })?;
                *last = Some((*src, id));
                path
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                icrc.verify_v6_parts(s, d, src.port(), dport, head, body, tail)
                    .ok()?;
                Predicted::V6
            }
            _ => return None,
        };
        *paths.get_mut(k)? = path;
    }
    Some((paths, nsegs))
}

/// Copy the planned payloads back from the READ's buffer into the receive
/// slot (as far as the datagram's `len` bytes reach), which then holds the
/// datagram as it arrived.
fn fill_holes(
    slot: &mut [u8],
    plan: &[PlanSeg],
    spans: &[Option<DirectSpan<'_>>; PLACE_REGIONS],
    len: usize,
) {
    for p in plan {
        let mut at = p.at + p.resp.header;
        for &(ri, off, n) in p.pieces.iter().take(p.n) {
            let end = (at + n).min(len);
            if end <= at {
                return;
            }
            if let (Some(Some(span)), Some(dst)) = (spans.get(ri), slot.get_mut(at..end)) {
                let _ = rnic_dma::copy::read_span(span, off, dst);
            }
            at += n;
        }
    }
}

/// The QP a run of packets is being delivered to, locked, with the key
/// table's read lock (taken at the run's first memory access).
struct Held<'a> {
    qpn: u32,
    q: &'a Arc<QpShared>,
    /// Declared before `e`: the key table's lock goes first (lock order QP
    /// → keys).
    mem: KeyAccess<'a>,
    e: MutexGuard<'a, QpInner>,
}

impl Held<'_> {
    /// The run is over: record the engine's deadline, note queued packets,
    /// unlock the key table, then the QP.
    fn release(self, touched: &mut Touched) {
        let Held { q, mem, e, .. } = self;
        drop(mem);
        after_run(q, &e, touched);
    }
}

/// After received packets ran QP `q`'s engine (locked as `e`): record its
/// next deadline, and note it when it has packets to send.
fn after_run(q: &Arc<QpShared>, e: &QpInner, touched: &mut Touched) {
    q.set_deadline(e.qp.next_deadline());
    if e.tx.pending() > 0 {
        touch(touched, q, e);
    }
}

/// Count a packet of `len` bytes whose ICRC verified with the
/// identification `path` names: packets whose copy the tap kept (a nonzero
/// identification: the sender's previous + 1) are charged to it. A segment
/// that verified with its GRO index is not: the tap sees a GRO datagram
/// once, with its first segment's header, and segments numbered 0, 1, 2, …
/// put identification 0 there, which the tap's filter drops (so a stream
/// between rnic devices, GSO from identification 0, never drains the tap:
/// on `lo` that was a system call per 128 KiB that always found it empty).
#[inline(always)]
fn count_icrc_ok(stats: &mut DeviceStats, tap_pending: &mut usize, path: Predicted, len: usize) {
    stats.icrc_ok += 1;
    match path {
        Predicted::Zero => stats.icrc_ident_zero += 1,
        Predicted::GroIndex => stats.icrc_ident_gro += 1,
        Predicted::Next => {
            stats.icrc_ident_next += 1;
            *tap_pending += len + TAP_COPY_CHARGE;
        }
        Predicted::Seen => stats.icrc_ident_seen += 1,
        Predicted::V6 => {}
    }
}

/// What a verified packet needs to reach its QP.
struct Dispatch<'d, 'a> {
    table: &'a QpTable,
    stats: &'d mut DeviceStats,
    touched: &'d mut Touched,
    /// The run in progress: kept while packets name its QP.
    held: &'d mut Option<Held<'a>>,
}

impl<'a> Dispatch<'_, 'a> {
    /// Demultiplex a verified packet (from `src_gid` to local `dst_gid`) by
    /// BTH DestQP and run its QP's engine, on the held run's locks when the
    /// packet names its QP.
    fn packet(
        &mut self,
        sh: &'a Shared,
        pkt: &[u8],
        src_gid: rnic_core::Gid,
        dst_gid: rnic_core::Gid,
        now: Instant,
    ) {
        let Some(qpn) = transport::dest_qpn(pkt) else {
            self.stats.rx_malformed += 1;
            return;
        };
        let qpn = qpn.get();
        if self.held.as_ref().is_none_or(|h| h.qpn != qpn) {
            self.release();
            let Some(q) = self.table.get(&qpn) else {
                self.stats.unknown_qpn += 1;
                // Of those, another process's QPN on a shared address (its
                // owner just left, or a GRO batch mixed QPs): dropped, never
                // delivered.
                if !sh.qpns.contains(qpn) {
                    self.stats.foreign_qpn += 1;
                }
                return;
            };
            let e = q.lock();
            *self.held = Some(Held {
                qpn,
                q,
                mem: KeyAccess::new(&sh.keys),
                e,
            });
        }
        let Some(h) = self.held.as_mut() else { return };
        run_engine_with(sh, &mut h.e, &mut h.mem, |qp, io| {
            qp.receive_at(now, pkt, src_gid, dst_gid, io);
        });
    }

    /// End the held run, if any.
    fn release(&mut self) {
        if let Some(h) = self.held.take() {
            h.release(self.touched);
        }
    }
}

impl Shared {
    /// The engine's clock.
    #[inline]
    pub fn now(&self) -> Instant {
        Instant::from_nanos(sys::monotonic_ns().saturating_sub(self.epoch_ns))
    }

    /// The receive path's state, locked (a poisoned lock is taken over: the
    /// state is plain data that no panic leaves half-updated in a way later
    /// calls trust).
    pub fn rx(&self) -> MutexGuard<'_, RxState> {
        self.rx.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The receive path's state if no other thread is running a round.
    pub fn try_rx(&self) -> Option<MutexGuard<'_, RxState>> {
        match self.rx.try_lock() {
            Ok(g) => Some(g),
            Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// The control path's state, locked.
    pub fn ctl(&self) -> MutexGuard<'_, Ctl> {
        self.ctl.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The key table, for writing (registration).
    pub fn keys_mut(&self) -> RwLockWriteGuard<'_, Keys> {
        self.keys.write().unwrap_or_else(|p| p.into_inner())
    }

    /// The nearest engine deadline the last round found.
    pub fn next_deadline(&self) -> Option<Instant> {
        match self.next_deadline.load(Ordering::Relaxed) {
            0 => None,
            v => Some(Instant::from_nanos(v - 1)),
        }
    }

    /// Note a QP's deadline (already set on the QP); whether the progress
    /// thread sleeps past it (so it must be woken).
    ///
    /// The thread publishes when it will wake (`thread_wake_at`), then
    /// checks `deadline_gen`; this bumps `deadline_gen`, then reads
    /// `thread_wake_at` (all SeqCst). So either the thread sees the bump and
    /// scans again before it sleeps, or this sees the wake-up time and
    /// rings if the deadline is earlier. A ping-pong whose every post sets
    /// a retransmission deadline thus wakes the thread once per timeout
    /// period, not once per post.
    pub fn note_deadline(&self, d: Option<Instant>) -> bool {
        // Caller-driven: no thread sleeps towards it (a wait runs a round,
        // which scans every QP's deadline, before it reads it).
        if self.progress == Progress::Caller {
            return false;
        }
        let Some(d) = d else { return false };
        let v = d.nanos().saturating_add(1);
        self.deadline_gen.fetch_add(1, Ordering::SeqCst);
        let wake = self.thread_wake_at.load(Ordering::SeqCst);
        wake != 0 && v < wake
    }

    /// A copy of the device counters: the receive path's, every live QP's
    /// transmit counters, those of destroyed QPs and the CQ overflows.
    pub fn device_stats(&self) -> (DeviceStats, Vec<(rnic_core::Qpn, QpStats)>) {
        let mut s = self.rx().stats;
        s.add(&self.retired.lock().unwrap_or_else(|p| p.into_inner()));
        let table = self.qps.read().unwrap_or_else(|p| p.into_inner());
        let mut qps = Vec::with_capacity(table.len());
        for q in table.values() {
            let e = q.lock();
            s.add(&e.stats);
            qps.push((q.qpn, *e.qp.stats()));
        }
        qps.sort_by_key(|(q, _)| q.get());
        s.cq_overflows = self.cq_overflows.load(Ordering::Relaxed);
        (s, qps)
    }

    /// How an application's round (a poll's, `RxeDevice::progress`)
    /// treats ACKs it produces alone: leave them for the next call where a
    /// post may carry them (caller-driven, or a progress thread holding
    /// ACKs), else send them.
    #[inline]
    pub fn caller_defer(&self) -> Defer {
        if self.progress == Progress::Caller || self.ack_hold_ns > 0 {
            Defer::NextCall
        } else {
            Defer::Never
        }
    }

    /// With a handoff, an empty poll is about to run a round: the
    /// application is receiving, so the progress thread stops watching the
    /// sockets.
    #[inline]
    pub fn poller_here(&self) {
        if self.ack_hold_ns == 0 {
            return;
        }
        self.last_app_round
            .store(self.now().nanos(), Ordering::Relaxed);
        if self.sockets_watched.load(Ordering::Relaxed)
            && self.sockets_watched.swap(false, Ordering::AcqRel)
        {
            self.watch_sockets(false);
        }
    }

    /// With a handoff, a poll returned completions: the application may
    /// stop polling now, or (a ping-pong) post its answer and poll again at
    /// once. Handing the sockets back here would put an `epoll_ctl` (about
    /// 1 µs on these vCPUs) between the completion and the answer, and the
    /// next empty poll would take them again: so the next send post hands
    /// them back after its packets have left, and an application that
    /// neither posts nor polls again gets them back from the thread's idle
    /// check (within [`HANDOFF_IDLE_NS`]).
    #[inline]
    pub fn poller_took_completions(&self) {
        if self.ack_hold_ns != 0 && !self.sockets_watched.load(Ordering::Relaxed) {
            self.give_back_at_post.store(true, Ordering::Relaxed);
        }
    }

    /// After a send post's packets left: hand the sockets back if a poll
    /// took completions since they were taken (see
    /// [`Shared::poller_took_completions`]).
    #[inline]
    pub fn posted(&self) {
        if self.give_back_at_post.load(Ordering::Relaxed)
            && self.give_back_at_post.swap(false, Ordering::Relaxed)
        {
            self.poller_leaving();
        }
    }

    /// With a handoff, the application may stop polling (a CQ was armed for
    /// an event, a wait begins, a post followed a completion): the progress
    /// thread watches the sockets again (a packet already queued wakes it at
    /// once).
    #[inline]
    pub fn poller_leaving(&self) {
        if self.ack_hold_ns != 0
            && !self.sockets_watched.load(Ordering::Relaxed)
            && !self.sockets_watched.swap(true, Ordering::AcqRel)
        {
            self.watch_sockets(true);
        }
    }

    /// Arm (`EPOLLIN`) or disarm (no events) every socket in the progress
    /// thread's epoll set. A failure (none is expected: the fds are
    /// registered for the device's life) is logged; the thread's idle
    /// re-arm repairs it.
    pub fn watch_sockets(&self, on: bool) {
        let Some(epoll) = &self.epoll else { return };
        let flags = if on {
            nix::sys::epoll::EpollFlags::EPOLLIN
        } else {
            nix::sys::epoll::EpollFlags::empty()
        };
        for (i, p) in self.ports.iter().enumerate() {
            let mut ev = nix::sys::epoll::EpollEvent::new(flags, i as u64);
            if let Err(e) = epoll.modify(p.rx_fd(), &mut ev) {
                tracing::debug!(error = %e, on, "epoll_ctl(MOD) of a socket failed");
            }
        }
    }

    /// An application's round (an empty poll's, a wait's,
    /// `RxeDevice::progress`) with the receive path `rx` it locked: up to
    /// `budget` datagrams, ACKs deferred as [`Shared::caller_defer`] says,
    /// the lock released, the hold kept; the datagrams received.
    pub fn app_round(&self, mut rx: MutexGuard<'_, RxState>, budget: usize) -> usize {
        let got = rx.progress(self, budget, self.caller_defer());
        drop(rx);
        self.keep_hold();
        got
    }

    /// After an application's round: if it left ACKs while the progress
    /// thread sleeps past its hold, wake the thread so they leave within it.
    #[inline]
    pub fn keep_hold(&self) {
        if self.ack_hold_ns > 0
            && self.acks_waiting.load(Ordering::SeqCst)
            && self.thread_napping.swap(false, Ordering::SeqCst)
        {
            self.ring();
        }
    }

    /// Wake the progress thread.
    pub fn ring(&self) {
        if self.progress == Progress::Thread {
            let _ = self.doorbell.write(1);
        }
    }
}
