//! [`RxeDevice`]: opening a device, its progress thread, and the
//! [`Provider`] implementation.

use std::collections::VecDeque;
use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};
use nix::sys::eventfd::{EfdFlags, EventFd};
use rnic_core::{
    AccessFlags, AddressVector, AtomicCap, AvError, Context, CqOps, DeviceAttr, DeviceError,
    DeviceErrorKind, DynProvider, Gid, GidEntry, GidType, HostDomain, LinkLayer, Lkey, Memory,
    MrInfo, Mtu, Outstanding, PdHandle, PortAttr, PortState, PostError, Provider, QpAttr,
    QpAttrMask, QpInfo, QpInitAttr, QpOps, QpState, RecvWr, SendWr, UdDest, VerbsError,
    WorkCompletion, WrError,
};
use rnic_roce::transport::{CqSide, DEFAULT_MAX_UNACKED_PSNS, Qp, QpConfig, TransportError};

use crate::device::{
    CqRing, CqShared, Ctl, Defer, HANDOFF_IDLE_NS, Polled, Progress, QpInner, QpShared, RxState,
    Shared, Slab, run_engine,
};
use crate::error::RxeError;
use crate::fault::FaultConfig;
use crate::gid::{self, Target};
use crate::mem::Keys;
use crate::port::Port;
use crate::qpns::QpnRange;
use crate::stats::RxeStats;
use crate::sys;
use crate::tx::{SendSockets, Tx};

/// How to open an rxe device.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RxeConfig {
    /// The interface or address.
    pub target: Target,
    /// Progress thread or caller-driven.
    pub progress: Progress,
    /// The UDP port RoCE uses (4791; others only talk to rnic peers
    /// configured the same way).
    pub roce_port: u16,
    /// Use UDP GSO where the kernel has it.
    pub gso: bool,
    /// Use UDP GRO where the kernel has it.
    pub gro: bool,
    /// Send each connection from rxe's per-QP UDP source port (else from
    /// the RoCE port itself).
    pub per_qp_sport: bool,
    /// Seeded loss/reordering on the receive path (off by default).
    pub faults: FaultConfig,
    /// Each RC QP's requester window in PSNs (see
    /// [`QpConfig::max_unacked_psns`]). Default [`RXE_WINDOW`], 1024 (4 MiB
    /// at MTU 4096): kernel rxe sends 128, but its responder queues what
    /// arrives without a limit, and between rnic devices 128 PSNs (75 µs
    /// of data at 7 GB/s) is too little for a passive responder's
    /// [receive moderation](RxeConfig::rx_moderation) to nap without
    /// stalling its sender. A device offers no more than its own sockets'
    /// receive buffers hold, assuming its peers have the same ones
    /// ([`window_for_buffer`]): without CAP_NET_ADMIN for 8 MiB buffers
    /// that is rxe's 128. A loss halves a QP's window, down to 128, and
    /// acknowledged progress gives it back ([`Qp::window`]).
    pub max_unacked_psns: u32,
    /// Share the addresses with other processes' devices (`rnic_rxe::share`):
    /// join each address's `SO_REUSEPORT` group, steered by QPN. Needs
    /// CAP_BPF and CAP_SYS_ADMIN; without them the device binds exclusively.
    /// On by default; `RNIC_RXE_SHARE=0` turns it off for devices opened
    /// with [`RxeConfig::new`].
    pub share: bool,
    /// Open an IPv4 identification tap per IPv4 address (a raw socket, needs
    /// CAP_NET_RAW; see `Port::tap`), so that every ICRC is checked in all
    /// 32 bits even when the sender's IPv4 identification is unpredictable.
    pub ident_tap: bool,
    /// Where a packet's identification was neither predicted nor tapped,
    /// accept it after solving the ICRC for the identification: only a
    /// 15-bit check. Off by default (such packets are dropped and counted in
    /// `icrc_unverified`); `RNIC_RXE_IDENT_RECOVERY=1` turns it on for
    /// devices opened with [`RxeConfig::new`]. `rnicctl doctor` reports it.
    pub ident_recovery: bool,
    /// Receive through a packet ring per IPv4 address (`AF_PACKET`,
    /// `TPACKET_V2`) polled in memory instead of through the UDP socket:
    /// an idle poll is a load, not a `recvmmsg` system call, and a datagram
    /// is taken without one — the low-latency receive path for caller-driven
    /// devices. Needs CAP_NET_RAW and Linux 6.2+ (opening fails with
    /// [`RxeError::PacketRing`] otherwise); binds exclusively (no sharing
    /// group); IPv6 addresses keep their socket. On loopback the kernel's
    /// copy into the ring runs on the *sender's* CPU, so streaming with the
    /// ring alone gets slower there; with frame transmit too (`tx_frames`,
    /// where lo's sysctls allow it) it is 1.03–1.18× faster than the socket
    /// path (docs/benchmarks.md, "Today's numbers"). Off by default;
    /// `RNIC_RXE_RX_RING=1` turns it on for devices opened with
    /// [`RxeConfig::new`]. `rnicctl doctor` reports it.
    pub rx_ring: bool,
    /// With a packet ring, send datagrams (and GSO groups) to IPv4 peers as
    /// whole frames through an `AF_PACKET` socket where the next hop is known and
    /// safe (`crate::frames`: an on-link Ethernet neighbour the kernel
    /// agrees on, or loopback with `accept_local`/`route_localnet` set),
    /// skipping the UDP socket's route lookup and IP output; everything
    /// else keeps the UDP sockets. On by default with the ring;
    /// `RNIC_RXE_TX_FRAMES=0` turns it off for devices opened with
    /// [`RxeConfig::new`]. `rnicctl doctor` reports it.
    pub tx_frames: bool,
    /// Receive READ response payloads straight into the READ's local
    /// buffer (socket ports; memory that offers direct access): while a
    /// READ's responses stream in, each datagram is received with a
    /// scatter list — headers and ICRCs into the transport's buffer, the
    /// payloads where the READ puts them — and checked (shape, QPN, PSN,
    /// ICRC read in place) before the QP takes the headers; a datagram that
    /// is not what was predicted is put back together and received as any
    /// other. The local buffer belongs to the transport until the READ
    /// completes, so bytes a rejected packet left there are rewritten by
    /// the accepted one before anyone may read them. Removes the user-space
    /// copy of READ data; on loopback the kernel's copy then writes the
    /// colder destination instead (docs/benchmarks.md, "Receive
    /// placement"). Off by default; `RNIC_RXE_RX_PLACE=1` turns it on for
    /// devices opened with [`RxeConfig::new`].
    pub rx_place: bool,
    /// Payloads of at least this many bytes in memory that offers direct
    /// access leave from it in place: the kernel's copy is the only one on
    /// the sending side (`tx.rs`). `usize::MAX` copies every payload into
    /// the transmit queue first. Default 512; `RNIC_RXE_TX_IN_PLACE=0`
    /// turns it off for devices opened with [`RxeConfig::new`].
    pub tx_in_place_min: usize,
    /// The progress thread's real-time priority: `Some(p)` puts it under
    /// `SCHED_FIFO` at `p` (1–99) when the process may (CAP_SYS_NICE or
    /// `RLIMIT_RTPRIO`), so that a packet's arrival preempts an application
    /// thread spinning on memory the way kernel rxe's softirq does; `None`
    /// (the default) leaves it under the normal scheduler, where such a
    /// spinner can keep it off the CPU for a whole time slice (~2 ms under
    /// EEVDF). [`RxeDevice::progress_scheduling`] says what was applied.
    pub progress_rt_priority: Option<u8>,
    /// Caller-driven devices only: a thread that wakes every period and
    /// sends ACKs a round deferred (to leave with the application's next
    /// post) when no call into the device came since. Without it a program
    /// that takes its last receive completion and then stops calling (as
    /// stock `ib_send_lat` does before its closing TCP handshake) leaves
    /// its peer waiting for that ACK. `None` (the default): no thread; the
    /// application's next call sends them.
    pub caller_ack_sweep: Option<Duration>,
    /// Progress-thread devices only: hand receiving to an application
    /// that polls. With `Some(hold)`:
    /// - an empty poll that runs a round takes the sockets from the
    ///   progress thread (they leave its epoll set until a send post
    ///   follows a poll that returned completions, a CQ is armed for an
    ///   event, a wait begins, or 1 ms passes without an empty poll), so a
    ///   packet a polling application will receive itself does not also
    ///   wake the thread;
    /// - ACKs a round produces with nothing else wait up to `hold` for the
    ///   application's next post on their QP, which sends them in its own
    ///   datagram (bundled with its request) instead of alone.
    ///
    /// In a ping-pong whose receiver spins on memory between its polls
    /// (stock `ib_write_lat`), the two together keep the peer's poll from
    /// returning before the answer has arrived, so the answer is received
    /// inside that poll rather than by waking the progress thread (10–20 µs
    /// on a busy vCPU): the thread is needed for the first message only.
    /// ACKs are held only on QPs the application posts on: a hold that runs
    /// out marks its QP passive (its ACKs then leave at once, so a passive
    /// responder's peer waits `hold` once), and a post marks it answering
    /// again. A packet that arrives after an application stopped calling
    /// (no post, poll, CQ arming or wait) waits up to 1 ms for the thread.
    /// `None` (the default): the thread receives everything it sees, and
    /// ACKs leave at once.
    pub poll_handoff: Option<Duration>,
    /// Progress-thread devices without a poll handoff: receive moderation,
    /// the software form of a NIC's adaptive interrupt coalescing (see
    /// [`RxModeration`]). Default [`RxModeration::default`] (naps of 10 to
    /// 100 µs, as the window allows, from 2 GB/s);
    /// `RNIC_RXE_RX_MODERATION_US=<µs>` sets the shortest nap (0 turns
    /// moderation off) for devices opened with [`RxeConfig::new`].
    /// `None`: off.
    pub rx_moderation: Option<RxModeration>,
}

/// Receive moderation ([`RxeConfig::rx_moderation`]).
///
/// A progress thread waiting on a socket is woken by the sender of each
/// datagram that finds it asleep, and on loopback or a busy host that
/// wake-up (an IPI; a VM exit under virtualization) is paid on the sending
/// CPU: streaming 4 MiB WRITEs to a passive responder over `lo`, 11 % of
/// the sender's samples went to waking it (docs/benchmarks.md, "Receive
/// moderation"). So while datagrams arrive at `min_bytes_per_sec` or more —
/// measured from one sleep of the thread to the next, twice in a row — the
/// thread does not wait on the sockets between rounds but naps `nap` on
/// the doorbell alone (which still wakes it to stop, or for a deadline),
/// then runs the next round; the first sleep after which less arrived
/// leaves it waiting on the sockets again. A nap adds at most its length to
/// when a datagram is seen, and only while the stream is dense: a
/// ping-pong of 64 KiB messages never naps here, one of 256 KiB ones
/// sometimes does. The thread's timer slack is set to 1 µs so that a nap
/// lasts what it asks.
///
/// How long a nap lasts follows the requester window
/// ([`RxModeration::nap_for`]): the ACKs a nap delays must never let the
/// sender's window run out. The thread assumes its peers use this device's
/// window (the same software with the same buffers). A sender with rxe's
/// 128 PSNs (a kernel rxe peer) still gets its ACKs in time below
/// 5.2 GB/s, where its 512 KiB last longer than the longest nap.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RxModeration {
    /// The shortest nap.
    pub nap: Duration,
    /// The longest nap.
    pub max_nap: Duration,
    /// The arrival rate (bytes per second) from which the thread naps.
    pub min_bytes_per_sec: u64,
}

impl Default for RxModeration {
    /// 10 µs naps from 2 GB/s: above what a ping-pong of 64 KiB messages
    /// reaches on loopback (0.7 GB/s), below any bandwidth test (4–7).
    /// Against no moderation, 10 µs naps moved a passive responder's 4 MiB
    /// WRITEs on `lo` from 5.83 to 6.22 GB/s (every one of 8 alternating
    /// rounds faster) at the same CPU per byte for both processes, with the
    /// responder at 0.8 of a CPU; 3–5 µs reached a busy-polling responder's
    /// bandwidth but spent its whole CPU doing it; 20 µs starved the sender
    /// of ACKs (`bash bench/moderation_ab.sh`, docs/benchmarks.md).
    fn default() -> RxModeration {
        RxModeration {
            nap: Duration::from_micros(10),
            max_nap: Duration::from_micros(100),
            min_bytes_per_sec: 2_000_000_000,
        }
    }
}

impl RxModeration {
    /// The nap while `bytes` arrive every `ns` nanoseconds on a device
    /// whose QPs send `window` PSNs: the time the sender takes for an
    /// eighth of a window of 4 KiB packets at that rate, from `nap` to
    /// `max_nap`. With rxe's 128 PSNs at 7 GB/s that is 9.4 µs (so
    /// `nap`, 10 µs: 20 µs stalled such a sender); with 1024 PSNs, 75 µs.
    pub fn nap_for(&self, bytes: u64, ns: u64, window: u32) -> Duration {
        if bytes == 0 {
            return self.nap;
        }
        let eighth = u128::from(window) * 4096 / 8;
        let t = eighth * u128::from(ns) / u128::from(bytes);
        Duration::from_nanos(u64::try_from(t).unwrap_or(u64::MAX))
            .clamp(self.nap, self.longest_nap())
    }

    /// The longest nap [`RxModeration::nap_for`] gives: `max_nap`, or `nap`
    /// if that is longer.
    pub fn longest_nap(&self) -> Duration {
        self.max_nap.max(self.nap)
    }

    /// Whether `bytes` received over `ns` nanoseconds come at
    /// `min_bytes_per_sec` or more.
    pub fn dense(&self, bytes: u64, ns: u64) -> bool {
        bytes > 0
            && u128::from(bytes) * 1_000_000_000
                >= u128::from(ns) * u128::from(self.min_bytes_per_sec)
    }
}

impl RxeConfig {
    /// Defaults for `target`: progress thread, UDP/4791, GSO, GRO and
    /// per-QP source ports on.
    pub fn new(target: Target) -> RxeConfig {
        RxeConfig {
            target,
            progress: Progress::Thread,
            roce_port: 4791,
            gso: true,
            gro: true,
            per_qp_sport: true,
            faults: FaultConfig::default(),
            max_unacked_psns: RXE_WINDOW,
            ident_tap: true,
            ident_recovery: ident_recovery_from_env(),
            share: crate::share::share_from_env(),
            rx_ring: env_on("RNIC_RXE_RX_RING"),
            tx_frames: !env_off("RNIC_RXE_TX_FRAMES"),
            rx_place: env_on("RNIC_RXE_RX_PLACE"),
            tx_in_place_min: if env_off("RNIC_RXE_TX_IN_PLACE") {
                usize::MAX
            } else {
                crate::tx::IN_PLACE_MIN
            },
            progress_rt_priority: None,
            caller_ack_sweep: None,
            poll_handoff: None,
            rx_moderation: rx_moderation_from_env(),
        }
    }

    /// The same, with a progress thread's ACK hold (see
    /// [`RxeConfig::poll_handoff`]).
    #[must_use]
    pub fn with_poll_handoff(mut self, hold: Option<Duration>) -> RxeConfig {
        self.poll_handoff = hold;
        self
    }

    /// The same, with receive moderation `m` (`None`: off; see
    /// [`RxeConfig::rx_moderation`]).
    #[must_use]
    pub fn with_rx_moderation(mut self, m: Option<RxModeration>) -> RxeConfig {
        self.rx_moderation = m;
        self
    }

    /// The same, with a caller-driven device's ACK sweeper waking every
    /// `period` (see [`RxeConfig::caller_ack_sweep`]).
    #[must_use]
    pub fn with_caller_ack_sweep(mut self, period: Option<Duration>) -> RxeConfig {
        self.caller_ack_sweep = period;
        self
    }

    /// The same, with the progress thread under `SCHED_FIFO` at `priority`
    /// where allowed (see [`RxeConfig::progress_rt_priority`]).
    #[must_use]
    pub fn with_progress_rt_priority(mut self, priority: Option<u8>) -> RxeConfig {
        self.progress_rt_priority = priority;
        self
    }

    /// The same, sending payloads of at least `min` bytes in place
    /// (`usize::MAX`: never; see [`RxeConfig::tx_in_place_min`]).
    #[must_use]
    pub fn with_tx_in_place_min(mut self, min: usize) -> RxeConfig {
        self.tx_in_place_min = min;
        self
    }

    /// The same, sharing the addresses with other processes or not (see
    /// [`RxeConfig::share`]).
    #[must_use]
    pub fn with_share(mut self, on: bool) -> RxeConfig {
        self.share = on;
        self
    }

    /// The same, receiving through packet rings or not (see
    /// [`RxeConfig::rx_ring`]).
    #[must_use]
    pub fn with_rx_ring(mut self, on: bool) -> RxeConfig {
        self.rx_ring = on;
        self
    }

    /// The same, sending frames with the packet ring or not (see
    /// [`RxeConfig::tx_frames`]).
    #[must_use]
    pub fn with_tx_frames(mut self, on: bool) -> RxeConfig {
        self.tx_frames = on;
        self
    }

    /// The same, placing READ response payloads or not (see
    /// [`RxeConfig::rx_place`]).
    #[must_use]
    pub fn with_rx_place(mut self, on: bool) -> RxeConfig {
        self.rx_place = on;
        self
    }

    /// The same, with the identification tap on or off (see
    /// [`RxeConfig::ident_tap`]).
    #[must_use]
    pub fn with_ident_tap(mut self, on: bool) -> RxeConfig {
        self.ident_tap = on;
        self
    }

    /// The same, with the 15-bit identification recovery on or off (see
    /// [`RxeConfig::ident_recovery`]).
    #[must_use]
    pub fn with_ident_recovery(mut self, on: bool) -> RxeConfig {
        self.ident_recovery = on;
        self
    }

    /// The same, with `progress`.
    #[must_use]
    pub fn with_progress(mut self, progress: Progress) -> RxeConfig {
        self.progress = progress;
        self
    }

    /// The same, with a requester window of `psns` per RC QP (see
    /// [`RxeConfig::max_unacked_psns`]).
    #[must_use]
    pub fn with_max_unacked_psns(mut self, psns: u32) -> RxeConfig {
        self.max_unacked_psns = psns;
        self
    }

    /// The same, with receive-path fault injection `faults`.
    #[must_use]
    pub fn with_faults(mut self, faults: FaultConfig) -> RxeConfig {
        self.faults = faults;
        self
    }
}

/// Whether a device's receive sockets busy-poll the NIC ([`RxeDevice::busy_poll`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BusyPoll {
    /// A progress thread waits in `epoll_wait`: no busy polling.
    Off,
    /// Caller-driven: each poll is a non-blocking `recvmmsg`, and the
    /// sockets have `SO_BUSY_POLL` = `usecs` (a NIC's NAPI queue is polled
    /// in each receive; `lo` and veth have none).
    Set {
        /// The budget per receive.
        usecs: u32,
    },
    /// Caller-driven, but the kernel refused `SO_BUSY_POLL` (this errno;
    /// `EPERM`: above `net.core.busy_read` without CAP_NET_ADMIN): each poll
    /// is a plain non-blocking `recvmmsg`.
    Refused(i32),
}

impl std::fmt::Display for BusyPoll {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BusyPoll::Off => f.write_str("progress thread (epoll), no busy polling"),
            BusyPoll::Set { usecs } => write!(
                f,
                "caller-driven busy polling of the UDP sockets (recvmmsg MSG_DONTWAIT per poll), SO_BUSY_POLL {usecs} us + SO_PREFER_BUSY_POLL (polls a NIC's NAPI queue; lo and veth have none)"
            ),
            BusyPoll::Refused(e) => write!(
                f,
                "caller-driven busy polling of the UDP sockets (recvmmsg MSG_DONTWAIT per poll); SO_BUSY_POLL refused: {}",
                std::io::Error::from_raw_os_error(*e)
            ),
        }
    }
}

/// How the progress thread is scheduled ([`RxeDevice::progress_scheduling`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProgressScheduling {
    /// No progress thread (caller-driven).
    NoThread,
    /// The normal scheduler (none was asked for).
    Normal,
    /// `SCHED_FIFO` at this priority.
    RealTime {
        /// The priority (1–99).
        priority: u8,
    },
    /// `SCHED_FIFO` was asked for and refused with this errno (`EPERM`:
    /// neither CAP_SYS_NICE nor an `RLIMIT_RTPRIO` of at least the
    /// priority); the thread runs under the normal scheduler.
    Refused {
        /// The priority asked for.
        priority: u8,
        /// The errno.
        errno: i32,
    },
}

impl std::fmt::Display for ProgressScheduling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProgressScheduling::NoThread => f.write_str("no progress thread"),
            ProgressScheduling::Normal => f.write_str("progress thread, normal scheduling"),
            ProgressScheduling::RealTime { priority } => {
                write!(f, "progress thread, SCHED_FIFO priority {priority}")
            }
            ProgressScheduling::Refused { priority, errno } => write!(
                f,
                "progress thread, normal scheduling: SCHED_FIFO priority {priority} refused ({}); \
                 grant CAP_SYS_NICE or raise RLIMIT_RTPRIO (ulimit -r {priority})",
                std::io::Error::from_raw_os_error(*errno)
            ),
        }
    }
}

/// The default receive moderation ([`RxeConfig::rx_moderation`]) with
/// `RNIC_RXE_RX_MODERATION_US`'s shortest nap, if set (0: off).
fn rx_moderation_from_env() -> Option<RxModeration> {
    match std::env::var("RNIC_RXE_RX_MODERATION_US") {
        Ok(v) => rx_moderation_from(&v),
        Err(_) => Some(RxModeration::default()),
    }
}

/// [`rx_moderation_from_env`] for the value `v`: microseconds (at most
/// 1000), 0 for off; anything else keeps the default and says so.
fn rx_moderation_from(v: &str) -> Option<RxModeration> {
    let default = RxModeration::default();
    match v.trim().parse::<u64>() {
        Ok(0) => None,
        Ok(us) => Some(RxModeration {
            nap: Duration::from_micros(us.min(1000)),
            ..default
        }),
        Err(_) => {
            tracing::warn!(
                value = %v,
                "RNIC_RXE_RX_MODERATION_US is not a number of microseconds; keeping {} µs (0 turns receive moderation off)",
                default.nap.as_micros()
            );
            Some(default)
        }
    }
}

/// The requester window of a device's QPs by default
/// ([`RxeConfig::max_unacked_psns`]).
pub const RXE_WINDOW: u32 = 1024;

/// The largest window (PSNs) a device whose sockets got receive buffers of
/// `rcvbuf` bytes (`SO_RCVBUF`, which reports twice the bytes asked for)
/// offers, never below rxe's 128: half the buffer's payload in packets of
/// 4 KiB, the rest for the socket buffers' overhead. 8 MiB asked for
/// (16 MiB reported) gives 1024; Linux's default `rmem_max` gives 128.
pub fn window_for_buffer(rcvbuf: usize) -> u32 {
    let psns = rcvbuf / 2 / 4096 / 2;
    u32::try_from(psns)
        .unwrap_or(u32::MAX)
        .max(DEFAULT_MAX_UNACKED_PSNS)
}

/// `name` is set to `0` (or `false`/`no`/`off`).
fn env_off(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "0" | "false" | "no" | "off"
        )
    })
}

/// `RNIC_RXE_IDENT_RECOVERY=1` (or `true`/`yes`/`on`): opt in to the 15-bit
/// ICRC check for packets whose identification could not be known.
pub fn ident_recovery_from_env() -> bool {
    env_on("RNIC_RXE_IDENT_RECOVERY")
}

/// `name` is set to `1` (or `true`/`yes`/`on`).
fn env_on(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "1" | "true" | "yes" | "on"
        )
    })
}

/// The rxe driver: what [`Context<RxeProvider>`] dispatches to statically
/// (and [`RxeDevice::context`] through `dyn`); stops its thread when dropped.
#[derive(Debug)]
pub struct RxeProvider {
    pub(crate) sh: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
    scheduling: ProgressScheduling,
}

impl Drop for RxeProvider {
    fn drop(&mut self) {
        self.sh.stop.store(true, Ordering::Release);
        let _ = self.sh.doorbell.write(1);
        let handle = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(h) = handle {
            // (The ACK sweeper sleeps parked.)
            h.thread().unpark();
            let _ = h.join();
        }
    }
}

/// An open rxe device. Cheap to clone; [`RxeDevice::context`] gives the
/// verbs entry point.
#[derive(Debug, Clone)]
pub struct RxeDevice {
    pub(crate) inner: Arc<RxeProvider>,
}

impl RxeDevice {
    /// Resolve the GIDs, bind UDP/4791 on each address, probe GSO/GRO and
    /// start the progress thread (in [`Progress::Thread`] mode).
    pub fn open(cfg: &RxeConfig) -> Result<RxeDevice, RxeError> {
        let addrs = gid::resolve(&cfg.target)?;
        let (ports, share) = crate::share::bind_ports(
            &addrs,
            cfg.roce_port,
            cfg.gro,
            cfg.ident_tap,
            cfg.rx_ring,
            cfg.share,
            &match &cfg.target {
                Target::Netdev(n) => format!("rxe:{n}"),
                Target::Ip(ip) => format!("rxe:{ip}"),
            },
        )?;
        let qpns = share.as_ref().map_or(QpnRange::ALL, |m| m.range());
        // A packet ring holds FRAMES datagrams, whatever the socket buffer.
        let cap = ports
            .iter()
            .map(|p| match p.ring {
                Some(_) => DEFAULT_MAX_UNACKED_PSNS,
                None => window_for_buffer(sys::rcvbuf(&p.sock)),
            })
            .min()
            .unwrap_or(DEFAULT_MAX_UNACKED_PSNS);
        let window = cfg.max_unacked_psns.min(cap);
        if window < cfg.max_unacked_psns {
            tracing::info!(
                asked = cfg.max_unacked_psns,
                window,
                "requester window limited to what this device's receive buffers hold \
                 (8 MiB buffers need CAP_NET_ADMIN; a packet ring holds rxe's 128)"
            );
        }
        // Caller-driven devices busy-poll their sockets; let each receive
        // poll the NIC's queue too where the device has one.
        let busy_poll = if cfg.progress == Progress::Caller {
            match ports
                .iter()
                .map(|p| sys::set_busy_poll(p.sock.as_fd(), sys::BUSY_POLL_USECS))
                .find_map(Result::err)
            {
                None => BusyPoll::Set {
                    usecs: sys::BUSY_POLL_USECS,
                },
                Some(e) => BusyPoll::Refused(e.raw_os_error().unwrap_or(0)),
            }
        } else {
            BusyPoll::Off
        };
        let gso = cfg.gso && ports.iter().all(|p| sys::probe_gso(&p.sock));
        let gro = ports.iter().any(|p| p.gro);
        // A ring hands over GSO datagrams whole, as a GRO socket does: the
        // receive slots must hold them.
        let whole = gro || ports.iter().any(|p| p.ring.is_some());
        let active_mtu = gid::active_mtu(addrs.first().and_then(|a| a.netdev_mtu));
        let doorbell =
            EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
                .map_err(|source| RxeError::Event {
                    what: "the doorbell eventfd",
                    source,
                })?;
        let epoll = if cfg.progress == Progress::Thread {
            let epoll =
                Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(|source| RxeError::Event {
                    what: "the progress thread's epoll set",
                    source,
                })?;
            for (i, p) in ports.iter().enumerate() {
                epoll
                    .add(p.rx_fd(), EpollEvent::new(EpollFlags::EPOLLIN, i as u64))
                    .map_err(|source| RxeError::Event {
                        what: "the epoll registration of a socket",
                        source,
                    })?;
            }
            epoll
                .add(
                    doorbell.as_fd(),
                    EpollEvent::new(EpollFlags::EPOLLIN, u64::MAX),
                )
                .map_err(|source| RxeError::Event {
                    what: "the epoll registration of the doorbell",
                    source,
                })?;
            Some(epoll)
        } else {
            None
        };
        // Frames only where a ring sees the peers' hops; opened in the
        // ports' namespace (this thread's).
        let frames = if cfg.tx_frames && ports.iter().any(|p| p.ring.is_some()) {
            match crate::frames::FrameTx::open() {
                Ok(f) => Some(f),
                Err(e) => {
                    tracing::warn!(error = %e, "no frame socket: datagrams leave through the UDP sockets");
                    None
                }
            }
        } else {
            None
        };
        let sh = Arc::new(Shared {
            keys: RwLock::new(Keys::new()),
            qps: RwLock::new(Default::default()),
            qps_gen: AtomicU64::new(0),
            ctl: Mutex::new(Ctl {
                pds: Slab::default(),
                next_qpn: 0x11,
            }),
            rx: Mutex::new(
                RxState::new(whole, cfg.faults, cfg.ident_recovery).with_placement(cfg.rx_place),
            ),
            send: SendSockets::new(gso, cfg.per_qp_sport, cfg.tx_in_place_min).with_frames(frames),
            retired: Mutex::new(Default::default()),
            cq_overflows: AtomicU64::new(0),
            next_deadline: AtomicU64::new(0),
            deadline_gen: AtomicU64::new(0),
            thread_wake_at: AtomicU64::new(0),
            acks_waiting: AtomicBool::new(false),
            acks_gen: AtomicU64::new(0),
            rx_moderation: match (cfg.progress, cfg.poll_handoff) {
                (Progress::Thread, None) => cfg.rx_moderation.filter(|m| !m.nap.is_zero()),
                _ => None,
            },
            ack_hold_ns: match (cfg.progress, cfg.poll_handoff) {
                (Progress::Thread, Some(h)) => {
                    u64::try_from(h.as_nanos()).unwrap_or(u64::MAX).max(1)
                }
                _ => 0,
            },
            thread_napping: AtomicBool::new(false),
            thread_in_stream: AtomicBool::new(false),
            waiters_off_until: AtomicU64::new(0),
            epoll,
            sockets_watched: AtomicBool::new(true),
            last_app_round: AtomicU64::new(0),
            give_back_at_post: AtomicBool::new(false),
            ports,
            qpns,
            share,
            roce_port: cfg.roce_port,
            active_mtu,
            progress: cfg.progress,
            busy_poll,
            max_unacked_psns: window,
            doorbell,
            stop: AtomicBool::new(false),
            epoch_ns: crate::sys::monotonic_ns(),
        });
        if sh.qpns != QpnRange::ALL {
            let seed = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
                ^ u64::from(std::process::id()).rotate_left(32);
            sh.ctl().next_qpn = sh.qpns.start(seed);
        }
        tracing::info!(
            target = ?cfg.target,
            gids = sh.ports.len(),
            gso,
            gro,
            mtu = active_mtu.bytes(),
            progress = ?cfg.progress,
            "rxe device open"
        );
        let (thread, scheduling) = match cfg.progress {
            Progress::Caller => {
                let sweeper = match cfg.caller_ack_sweep {
                    None => None,
                    Some(period) => {
                        let t = Arc::clone(&sh);
                        Some(
                            std::thread::Builder::new()
                                .name("rnic-rxe-acks".into())
                                .spawn(move || ack_sweeper(&t, period))
                                .map_err(RxeError::Thread)?,
                        )
                    }
                };
                (sweeper, ProgressScheduling::NoThread)
            }
            Progress::Thread => {
                let t = Arc::clone(&sh);
                let rt = cfg.progress_rt_priority;
                let (tell, told) = std::sync::mpsc::sync_channel(1);
                let handle = std::thread::Builder::new()
                    .name("rnic-rxe".into())
                    .spawn(move || {
                        let sched = match rt {
                            None => ProgressScheduling::Normal,
                            Some(priority) => match sys::set_fifo(priority) {
                                Ok(()) => ProgressScheduling::RealTime { priority },
                                Err(e) => ProgressScheduling::Refused {
                                    priority,
                                    errno: e.raw_os_error().unwrap_or(0),
                                },
                            },
                        };
                        let _ = tell.send(sched);
                        progress_thread(&t);
                    })
                    .map_err(RxeError::Thread)?;
                // The thread reports before its first round.
                let sched = told.recv().unwrap_or(ProgressScheduling::Normal);
                if let ProgressScheduling::Refused { .. } = sched {
                    tracing::debug!(%sched, "rxe progress thread");
                }
                (Some(handle), sched)
            }
        };
        Ok(RxeDevice {
            inner: Arc::new(RxeProvider {
                sh,
                thread: Mutex::new(thread),
                scheduling,
            }),
        })
    }

    /// The verbs context of this device, dispatched dynamically (what
    /// `rnic::open` returns).
    pub fn context(&self) -> Context {
        Context::from_dyn(Arc::clone(&self.inner) as Arc<dyn DynProvider>)
    }

    /// The verbs context of this device with the driver's type named: every
    /// call dispatches statically.
    pub fn typed_context(&self) -> Context<RxeProvider> {
        Context::new(Arc::clone(&self.inner))
    }

    /// The GID table (index = position).
    pub fn gids(&self) -> Vec<Gid> {
        self.inner.sh.ports.iter().map(|p| p.gid).collect()
    }

    /// The requester window (PSNs) this device's RC QPs start with: the
    /// configured one, limited by what the sockets' receive buffers hold
    /// ([`window_for_buffer`]; a packet ring holds rxe's 128).
    pub fn window(&self) -> u32 {
        self.inner.sh.max_unacked_psns
    }

    /// The path MTU the link allows.
    pub fn active_mtu(&self) -> Mtu {
        self.inner.sh.active_mtu
    }

    /// How the device waits for packets: a progress thread, or the
    /// caller's busy polling (with `SO_BUSY_POLL` where the kernel took it).
    pub fn busy_poll(&self) -> BusyPoll {
        self.inner.sh.busy_poll
    }

    /// How the progress thread is scheduled (asked for with
    /// [`RxeConfig::with_progress_rt_priority`]).
    pub fn progress_scheduling(&self) -> ProgressScheduling {
        self.inner.scheduling
    }

    /// Whether sends use UDP GSO.
    pub fn gso(&self) -> bool {
        self.inner.sh.send.gso.load(Ordering::Relaxed)
    }

    /// Whether receives use UDP GRO.
    pub fn gro(&self) -> bool {
        self.inner.sh.ports.iter().any(|p| p.gro)
    }

    /// How many of the device's addresses receive through a packet ring
    /// ([`RxeConfig::rx_ring`]), and how many it has.
    pub fn rx_rings(&self) -> (usize, usize) {
        let ports = &self.inner.sh.ports;
        (
            ports.iter().filter(|p| p.ring.is_some()).count(),
            ports.len(),
        )
    }

    /// Whether single datagrams may leave as frames
    /// ([`RxeConfig::tx_frames`]): the device has a frame socket.
    pub fn tx_frames(&self) -> bool {
        self.inner.sh.send.frames.is_some()
    }

    /// The QPNs this device hands out: all of them, or its slot's when it
    /// shares its addresses with other processes (see [`crate::share`]).
    pub fn qpn_range(&self) -> QpnRange {
        self.inner.sh.qpns
    }

    /// Its sharing slot, when it shares its addresses.
    pub fn share_slot(&self) -> Option<u32> {
        self.inner.sh.share.as_ref().map(|m| m.slot())
    }

    /// Whether the device shares its addresses and every address's steering
    /// array holds this device's socket at its slot.
    pub fn steered(&self) -> bool {
        let sh = &self.inner.sh;
        sh.share.as_ref().is_some_and(|m| {
            sh.ports
                .iter()
                .all(|p| p.sock.local_addr().is_ok_and(|a| m.steered(a, &p.sock)))
        })
    }

    /// The device's and every QP's counters.
    pub fn stats(&self) -> RxeStats {
        let (device, qps) = self.inner.sh.device_stats();
        RxeStats { device, qps }
    }

    /// Run one round of progress now (receive, timers, flush); returns the
    /// datagrams received. Caller-driven applications that do not poll a
    /// CQ of this device call it to keep its responder going. In
    /// caller-driven mode a round whose only output is ACKs leaves them for
    /// the next call into the device (progress, poll, send post or wait),
    /// which sends them with its own packets; keep calling while peers
    /// wait for ACKs.
    pub fn progress(&self) -> usize {
        let sh = &self.inner.sh;
        sh.app_round(sh.rx(), 1024)
    }
}

/// The progress thread: block in `epoll_wait` (sockets, doorbell, the
/// nearest timer) only after a round that received nothing; while datagrams
/// keep arriving, run round after round without the wait and without
/// touching the doorbell (two system calls per round saved under load).
///
/// With a poll handoff it also wakes when ACKs deferred for a post have
/// waited the hold (its round then sends them unless a post has), and while
/// an application polls (sockets disarmed) it wakes once per
/// [`HANDOFF_IDLE_NS`] to re-arm them if the polls have stopped.
fn progress_thread(sh: &Arc<Shared>) {
    let Some(epoll) = &sh.epoll else { return };
    let mut events = [EpollEvent::empty(); 8];
    let hold = sh.ack_hold_ns;
    let defer = if hold > 0 { Defer::Hold } else { Defer::Never };
    let moderation = sh.rx_moderation;
    if moderation.is_some() {
        // Best effort: the default slack (50 µs) would make a 10 µs nap 60.
        let _ = nix::sys::prctl::set_timerslack(NAP_TIMER_SLACK_NS);
    }
    let mut woke = 0;
    let mut naps = 0;
    // When the thread last began to sleep, and the bytes received by then;
    // how many sleeps in a row were followed by dense arrivals.
    let mut slept = (sh.now().nanos(), 0);
    let mut dense = 0u32;
    while !sh.stop.load(Ordering::Acquire) {
        let generation = sh.deadline_gen.load(Ordering::SeqCst);
        let (got, scan_next, rx_bytes) = {
            let mut rx = sh.rx();
            let got = rx.progress(sh, 256, defer);
            rx.stats.thread_datagrams += got as u64;
            rx.stats.thread_wakeups += std::mem::take(&mut woke);
            rx.stats.thread_naps += std::mem::take(&mut naps);
            (got, rx.scan_next, rx.stats.rx_bytes)
        };
        if got > 0 {
            continue;
        }
        let now = sh.now().nanos();
        if let Some(m) = &moderation {
            let arrived = rx_bytes.saturating_sub(slept.1);
            let took = now.saturating_sub(slept.0);
            dense = if m.dense(arrived, took) {
                dense.saturating_add(1)
            } else {
                0
            };
            slept = (now, rx_bytes);
            sh.thread_in_stream.store(dense > 0, Ordering::Relaxed);
            // Two in a row: one message's tail that came in a burst
            // right after the wake-up its head caused is not a stream.
            if dense >= NAP_AFTER_DENSE {
                // Not on the sockets' wait queues: a datagram that arrives
                // now wakes nobody. The doorbell still does (stop, a
                // deadline noted earlier than the nap's end cannot be: the
                // thread counts as awake, `thread_wake_at` stays 0, and the
                // round after the nap scans every deadline).
                let nap = m.nap_for(arrived, took, sh.max_unacked_psns);
                if sys::wait_readable(sh.doorbell.as_fd(), nap) {
                    let _ = sh.doorbell.read();
                }
                naps = 1;
                continue;
            }
        }
        // Engine timers keep their millisecond granularity; with nothing
        // due, the thread still wakes every IDLE_WAKE_NS, so that a post
        // setting a retransmission deadline (67 ms and more at the usual
        // timeouts) never has to wake it (`Shared::note_deadline`).
        let mut wake = match scan_next {
            0 => now + IDLE_WAKE_NS,
            v => {
                now + (v - 1)
                    .saturating_sub(now)
                    .div_ceil(1_000_000)
                    .min(IDLE_WAKE_NS / 1_000_000)
                    * 1_000_000
            }
        };
        if hold > 0 {
            // Sockets handed to a polling application: ACKs a round defers
            // leave with the application's next call (a post, or the next
            // poll's round), and the thread wakes within HANDOFF_IDLE_NS
            // anyway in case the calls stop; so it does not keep the hold
            // itself, and polls need not ring.
            let mut bounded = false;
            if !sh.sockets_watched.load(Ordering::Acquire) {
                let idle = now.saturating_sub(sh.last_app_round.load(Ordering::Relaxed));
                if idle >= HANDOFF_IDLE_NS {
                    sh.poller_leaving();
                } else {
                    wake = wake.min(now + HANDOFF_IDLE_NS - idle);
                    bounded = true;
                }
            }
            // Otherwise napping first, then the check: a poll that defers
            // after the check sees the flag and rings (both SeqCst).
            if !bounded {
                sh.thread_napping.store(true, Ordering::SeqCst);
                if sh.acks_waiting.load(Ordering::SeqCst) {
                    wake = wake.min(now + hold);
                }
                if wake <= now + hold {
                    sh.thread_napping.store(false, Ordering::Relaxed);
                }
            }
        }
        // Publish the wake-up, then look for a deadline noted since the
        // round began (see `Shared::note_deadline`).
        sh.thread_wake_at.store(wake + 1, Ordering::SeqCst);
        if sh.deadline_gen.load(Ordering::SeqCst) == generation && wake > now {
            let n = sys::epoll_wait_ns(&epoll.0, &mut events, wake - now);
            woke = 1;
            if events[..n].iter().any(|e| e.data() == u64::MAX) {
                let _ = sh.doorbell.read();
            }
        }
        sh.thread_wake_at.store(0, Ordering::SeqCst);
        if hold > 0 {
            sh.thread_napping.store(false, Ordering::Relaxed);
        }
    }
}

/// Sleeps in a row followed by dense arrivals before the progress thread
/// naps ([`RxeConfig::rx_moderation`]).
const NAP_AFTER_DENSE: u32 = 2;

/// A waiter's round that received more datagrams than this found a stream
/// (`RxeCq::wait`; a ping-pong's message is one or two).
const WAITER_STREAM_DATAGRAMS: usize = 4;

/// How long waiters then leave the sockets to the progress thread (1 ms).
const WAITER_STREAM_OFF_NS: u64 = 1_000_000;

/// The progress thread's timer slack while it naps
/// ([`RxeConfig::rx_moderation`]).
const NAP_TIMER_SLACK_NS: u64 = 1_000;

/// The longest the progress thread sleeps (50 ms): shorter than the
/// retransmission timeouts in use (perftest's and rnicctl's `-u 14` is
/// 67 ms, the shortest rdma-core users set is about that), so posts that
/// set one need not ring; 20 wake-ups a second when idle.
const IDLE_WAKE_NS: u64 = 50_000_000;

/// A caller-driven device's ACK sweeper: every `period`, send the ACKs
/// that a round deferred and that are still waiting a period later (the
/// same deferral generation seen twice), unless the application is in a
/// round right now (which sends them itself).
fn ack_sweeper(sh: &Shared, period: Duration) {
    let mut seen = None;
    while !sh.stop.load(Ordering::Acquire) {
        std::thread::park_timeout(period);
        if !sh.acks_waiting.load(Ordering::Acquire) {
            seen = None;
            continue;
        }
        let generation = sh.acks_gen.load(Ordering::Relaxed);
        if seen != Some(generation) {
            seen = Some(generation);
            continue;
        }
        seen = None;
        if let Some(mut rx) = sh.try_rx()
            && sh.acks_waiting.load(Ordering::Acquire)
            && sh.acks_gen.load(Ordering::Relaxed) == generation
        {
            rx.sweep_deferred(sh);
        }
    }
}

/// `unpolled`: the send and receive requests outstanding.
fn transport_to_post(e: TransportError, qp: &QpInner, unpolled: (u32, u32)) -> PostError {
    match e {
        TransportError::QueueFull(side) => {
            let (outstanding, capacity) = match side {
                CqSide::Send => (unpolled.0, qp.caps.max_send_wr),
                CqSide::Recv => (unpolled.1, qp.caps.max_recv_wr),
            };
            PostError::QueueFull {
                outstanding,
                capacity,
                requested: 1,
            }
        }
        TransportError::BadState(state) => PostError::QpState { state },
        TransportError::TooManySge { got, max } => PostError::InvalidWr(WrError::TooManySges {
            count: got,
            max: u32::try_from(max).unwrap_or(u32::MAX),
        }),
        TransportError::InlineTooLong { got, max } => {
            PostError::InvalidWr(WrError::InlineTooLarge {
                len: got,
                max: u32::try_from(max).unwrap_or(u32::MAX),
            })
        }
        TransportError::BadOpForQpType(qp_type) => PostError::InvalidWr(WrError::OpNotSupported {
            op: "this operation",
            qp_type,
        }),
        TransportError::InlineRead(_) => PostError::Device(DeviceError::new(
            DeviceErrorKind::InvalidArgument,
            "inline data unreadable: check the SGE's L_Key and bounds",
        )),
        _ => PostError::Device(DeviceError::new(
            DeviceErrorKind::Transport,
            "the transport refused the request",
        )),
    }
}

/// What is wrong with `av` when sent from `ports` (the GID table), if
/// anything. `Sink::route` would drop every packet of such an address vector
/// (counted as `tx_bad_sgid`, or as a send error): refusing it when the
/// address handle is created, or at RTR, gives the caller a reason instead of
/// a retry timeout.
fn av_problem(ports: &[Port], av: &AddressVector) -> Option<AvError> {
    let Some(local) = ports.get(usize::from(av.sgid_index)) else {
        return Some(AvError::NoSuchSgid {
            index: av.sgid_index,
            table_len: ports.len(),
        });
    };
    match (local.ip, av.dgid.to_ip()) {
        (IpAddr::V4(_), IpAddr::V4(_)) => None,
        (IpAddr::V6(_), IpAddr::V6(d)) if gid::is_link_local(&d) && local.scope_id == 0 => {
            Some(AvError::LinkLocal {
                sgid: local.gid,
                dgid: av.dgid,
            })
        }
        (IpAddr::V6(_), IpAddr::V6(_)) => None,
        _ => Some(AvError::Family {
            sgid: local.gid,
            dgid: av.dgid,
        }),
    }
}

const GONE: DeviceError = DeviceError::new(
    DeviceErrorKind::NotFound,
    "the object is gone from this rxe device (destroyed, or from another device)",
);

const ONE_PORT: DeviceError = DeviceError::new(
    DeviceErrorKind::NotFound,
    "an rxe device has one port, number 1",
);

/// An rxe protection domain.
#[derive(Debug)]
pub struct RxePd {
    h: u32,
    sh: Arc<Shared>,
}

impl Drop for RxePd {
    fn drop(&mut self) {
        self.sh.ctl().pds.remove(self.h);
    }
}

/// An rxe memory region (its key in the device's key table).
#[derive(Debug)]
pub struct RxeMr {
    key: u32,
    sh: Arc<Shared>,
}

impl Drop for RxeMr {
    fn drop(&mut self) {
        // A key a peer already invalidated (SEND with invalidate) is gone.
        let _ = self.sh.keys_mut().invalidate(Lkey(self.key));
    }
}

/// An rxe completion queue: its ring (shared with the QPs completing into
/// it, which keep it alive while they exist).
#[derive(Debug)]
pub struct RxeCq {
    cq: Arc<CqShared>,
    sh: Arc<Shared>,
}

impl CqOps for RxeCq {
    fn poll(&mut self, wcs: &mut [WorkCompletion]) -> Result<usize, VerbsError> {
        let sh = &*self.sh;
        let n = self.cq.poll_into(wcs);
        if n > 0 {
            // ACKs a caller-driven round deferred stay queued: an
            // application that just took a receive completion usually posts
            // its answer next, and that post sends them in its own
            // `sendmmsg`; otherwise the next empty poll's round, a wait or
            // a QP's destruction sends them.
            sh.poller_took_completions();
            return Ok(n);
        }
        // Empty: make progress, unless another thread is in a round (then
        // the next poll sees what it delivers). A round that received
        // nothing completed nothing either but a timer's error completion,
        // which the next poll returns.
        let Some(rx) = sh.try_rx() else {
            return Ok(0);
        };
        sh.poller_here();
        if sh.app_round(rx, 256) == 0 {
            return Ok(0);
        }
        let n = self.cq.poll_into(wcs);
        if n > 0 {
            sh.poller_took_completions();
        }
        Ok(n)
    }

    fn req_notify(&self, solicited_only: bool) -> Result<(), VerbsError> {
        // Solicited-only arming signals on any completion (a superset: waiters
        // re-poll anyway).
        let _ = solicited_only;
        self.cq.lock().armed = true;
        // The application is about to sleep on the event: the progress
        // thread must receive.
        self.sh.poller_leaving();
        Ok(())
    }

    fn event_fd(&self) -> Option<RawFd> {
        Some(self.cq.event.as_raw_fd())
    }

    fn wait(&self, timeout: Option<Duration>) -> Result<bool, VerbsError> {
        let sh = &*self.sh;
        sh.poller_leaving();
        let event = &self.cq.event;
        let start = std::time::Instant::now();
        // A progress thread's device: the waiter wakes for the sockets too
        // and receives what arrives itself when the thread is not in a
        // round, so that a completion costs one wake-up (this thread's)
        // instead of two (the thread's, then this one's through the
        // eventfd). It watches them only while the thread sleeps in
        // `epoll_wait` (awake, the thread is receiving already), not while
        // the thread sees a dense stream (its moderation naps would be
        // undone),
        // not for WAITER_STREAM_OFF_NS after a waiter's round received a
        // stream (more than WAITER_STREAM_DATAGRAMS datagrams: the thread's
        // rounds and naps take those for less), and not in the poll after a
        // round the thread was already in (it delivers). A poll without the
        // sockets lasts at most 1 ms, then the waiter looks again.
        let mut sockets = true;
        loop {
            let deadline = if sh.progress == Progress::Caller {
                sh.rx().progress(sh, 256, Defer::Never);
                sh.next_deadline()
            } else {
                None
            };
            if event.read().is_ok() {
                return Ok(true);
            }
            let left = match timeout {
                Some(t) => match t.checked_sub(start.elapsed()) {
                    Some(l) if !l.is_zero() => Some(l),
                    _ => return Ok(false),
                },
                None => None,
            };
            // Caller-driven: wake for packets and timers too.
            let timer =
                deadline.map(|d| Duration::from_nanos(d.nanos().saturating_sub(sh.now().nanos())));
            let wait = match (left, timer) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let ms = wait.map_or(PollTimeout::NONE, |w| {
                PollTimeout::try_from(w.as_millis().max(1)).unwrap_or(PollTimeout::MAX)
            });
            let thread = sh.progress == Progress::Thread;
            let watch = !thread
                || (std::mem::replace(&mut sockets, true)
                    && sh.thread_wake_at.load(Ordering::Relaxed) != 0
                    && !sh.thread_in_stream.load(Ordering::Relaxed)
                    && sh.now().nanos() >= sh.waiters_off_until.load(Ordering::Relaxed));
            let ms = match ms {
                m if watch => m,
                PollTimeout::NONE => PollTimeout::from(1u8),
                m => m.min(PollTimeout::from(1u8)),
            };
            let mut fds = vec![PollFd::new(event.as_fd(), PollFlags::POLLIN)];
            if watch {
                fds.extend(
                    sh.ports
                        .iter()
                        .map(|p| PollFd::new(p.rx_fd(), PollFlags::POLLIN)),
                );
            }
            poll(&mut fds, ms).map_err(|e| VerbsError::WaitCq {
                source: DeviceError::os(e as i32, "poll() on the CQ's eventfd failed"),
            })?;
            let arrived = fds[1..]
                .iter()
                .any(|f| f.revents().is_some_and(|r| r.contains(PollFlags::POLLIN)));
            if thread && arrived {
                match sh.try_rx() {
                    Some(rx) => {
                        if sh.app_round(rx, 256) > WAITER_STREAM_DATAGRAMS {
                            let until = sh.now().nanos() + WAITER_STREAM_OFF_NS;
                            sh.waiters_off_until.store(until, Ordering::Relaxed);
                        }
                    }
                    None => sockets = false,
                }
            }
        }
    }
}

/// What `create_ah` resolved: a destination the device's GID table can
/// send to (the source GID index exists, the families match, a link-local
/// destination has a scoped source), and the device that checked it.
pub struct RxeAh {
    sh: Arc<Shared>,
    av: AddressVector,
}

impl std::fmt::Debug for RxeAh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RxeAh")
            .field("av", &self.av)
            .finish_non_exhaustive()
    }
}

/// The engine's form of `wr`: a UD destination copied out of the address
/// handle this device resolved; `None` for a handle of another device (or
/// none: `AddressHandle::unchecked`).
#[inline]
fn engine_wr<'a>(sh: &Shared, wr: &SendWr<'a>) -> Option<SendWr<'a, UdDest>> {
    let ud = match &wr.ud {
        None => None,
        Some(d) => {
            let ah =
                d.ah.driver::<RxeAh>()
                    .filter(|ah| std::ptr::eq(Arc::as_ptr(&ah.sh), sh))?;
            Some(UdDest {
                av: ah.av,
                remote_qpn: d.remote_qpn,
                remote_qkey: d.remote_qkey,
            })
        }
    };
    Some(SendWr {
        wr_id: wr.wr_id,
        op: wr.op,
        sg_list: wr.sg_list,
        flags: wr.flags,
        ud,
    })
}

/// An rxe queue pair: it owns its state ([`QpShared`]), which the device's
/// QPN table shares with the receive and timer path.
#[derive(Debug)]
pub struct RxeQp {
    q: Arc<QpShared>,
    sh: Arc<Shared>,
}

impl Drop for RxeQp {
    fn drop(&mut self) {
        let sh = &*self.sh;
        // Out of the receive path's reach first: out of the table, then
        // out of the receive path's copy of it (waits for a round in
        // progress); then nothing but this object reaches the QP.
        {
            let mut table = sh.qps.write().unwrap_or_else(|p| p.into_inner());
            table.remove(&self.q.qpn.get());
            sh.qps_gen.fetch_add(1, Ordering::Release);
        }
        sh.rx().remove_qp(self.q.qpn.get());
        let mut e = self.q.lock();
        // ACKs a caller-driven round deferred to the next call leave now: an
        // application that polled its last completion and tears down makes no
        // next call, and its peer would retry into a dead QP.
        e.flush(sh);
        e.discarded = true;
        e.discard(&self.q.polled);
        e.send_cq.lock().qps.remove(e.send_slot);
        e.recv_cq.lock().qps.remove(e.recv_slot);
        sh.retired
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .add(&std::mem::take(&mut e.stats));
    }
}

impl QpOps for RxeQp {
    fn modify(&mut self, attr: &QpAttr, mask: QpAttrMask) -> Result<(), VerbsError> {
        let sh = &*self.sh;
        let qpn = self.q.qpn;
        if mask.contains(QpAttrMask::AV)
            && let Some(source) = av_problem(&sh.ports, &attr.ah_attr)
        {
            return Err(VerbsError::AddressVector {
                dgid: attr.ah_attr.dgid,
                source,
            });
        }
        let mut e = self.q.lock();
        let now = sh.now();
        // A UD QP sends datagrams of up to the port's MTU, as kernel rxe's
        // (its `get_mtu` takes the port's for UD; UD has no path MTU
        // attribute to set): the engine is given it when the QP is set up.
        let ud_mtu;
        let (attr, mask) = if e.qp_type == rnic_core::QpType::Ud
            && mask.contains(QpAttrMask::STATE)
            && attr.qp_state == QpState::Init
        {
            ud_mtu = QpAttr {
                path_mtu: sh.active_mtu,
                ..*attr
            };
            (&ud_mtu, mask | QpAttrMask::PATH_MTU)
        } else {
            (attr, mask)
        };
        let r = run_engine(sh, &mut e, |q, io| {
            let r = q.modify(attr, mask, io.cq);
            if r.is_ok() {
                q.run(now, io);
            }
            r.map(|()| q.next_deadline())
        });
        let deadline = r.map_err(|e| VerbsError::ModifyQp {
            qpn,
            mask,
            source: transport_error(&e),
        })?;
        apply_attr(&mut e.attr, attr, mask);
        if mask.contains(QpAttrMask::STATE) {
            if attr.qp_state == QpState::Reset {
                e.send_cq.purge(e.send_slot);
                e.recv_cq.purge(e.recv_slot);
            } else {
                e.discarded = false;
            }
        }
        e.flush(sh);
        self.q.set_deadline(deadline);
        drop(e);
        if sh.note_deadline(deadline) {
            sh.ring();
        }
        Ok(())
    }

    fn query(&mut self) -> Result<QpAttr, VerbsError> {
        let e = self.q.lock();
        let mut a = e.attr;
        a.qp_state = e.qp.state();
        a.cur_qp_state = e.qp.state();
        a.cap = e.caps;
        Ok(a)
    }

    fn post_send(&mut self, wrs: &[SendWr<'_>]) -> Result<(), VerbsError> {
        let sh = &*self.sh;
        if sh.ack_hold_ns != 0 && !self.q.answering.load(Ordering::Relaxed) {
            self.q.answering.store(true, Ordering::Relaxed);
        }
        let mut e = self.q.lock();
        let now = sh.now();
        let cap = e.caps.max_send_wr;
        let unpolled = e.unpolled(&self.q.polled);
        let mut refused = None;
        let mut foreign_ah = None;
        let mut posted = 0u32;
        let deadline = run_engine(sh, &mut e, |q, io| {
            for (i, wr) in wrs.iter().enumerate() {
                if unpolled.0 + posted >= cap {
                    refused = Some((i, TransportError::QueueFull(CqSide::Send)));
                    break;
                }
                // A UD send takes the destination its address handle
                // resolved at create_ah (no second check); a handle of
                // another device stops the batch there.
                let Some(wr) = engine_wr(sh, wr) else {
                    foreign_ah = Some(i);
                    break;
                };
                if let Err(e) = q.post_send(&wr, io) {
                    refused = Some((i, e));
                    break;
                }
                posted += 1;
            }
            q.run(now, io);
            q.next_deadline()
        });
        e.sq_posted = e.sq_posted.wrapping_add(posted);
        let unpolled = (unpolled.0 + posted, unpolled.1);
        let reason = refused
            .map(|(index, err)| (index, transport_to_post(err, &e, unpolled)))
            .or(foreign_ah.map(|index| (index, PostError::ForeignAddressHandle)));
        e.flush(sh);
        self.q.set_deadline(deadline);
        drop(e);
        sh.posted();
        if sh.note_deadline(deadline) {
            sh.ring();
        }
        match reason {
            None => Ok(()),
            Some((index, reason)) => Err(VerbsError::PostSend { index, reason }),
        }
    }

    fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> Result<(), VerbsError> {
        let sh = &*self.sh;
        let mut e = self.q.lock();
        let cap = e.caps.max_recv_wr;
        let unpolled = e.unpolled(&self.q.polled);
        let mut posted = 0u32;
        let refused = run_engine(sh, &mut e, |q, io| {
            for (i, wr) in wrs.iter().enumerate() {
                if unpolled.1 + posted >= cap {
                    return Some((i, TransportError::QueueFull(CqSide::Recv)));
                }
                if let Err(e) = q.post_recv(wr, io) {
                    return Some((i, e));
                }
                posted += 1;
            }
            None
        });
        e.rq_posted = e.rq_posted.wrapping_add(posted);
        match refused {
            None => Ok(()),
            Some((index, err)) => Err(VerbsError::PostRecv {
                index,
                reason: transport_to_post(err, &e, (unpolled.0, unpolled.1 + posted)),
            }),
        }
    }

    fn outstanding(&self) -> Outstanding {
        let e = self.q.lock();
        let (sends, recvs) = e.unpolled(&self.q.polled);
        Outstanding { sends, recvs }
    }

    fn discard(&mut self) -> Outstanding {
        let mut e = self.q.lock();
        e.discarded = true;
        let (sends, recvs) = e.discard(&self.q.polled);
        Outstanding { sends, recvs }
    }
}

/// A transport error on the control path, as a device error.
fn transport_error(e: &TransportError) -> DeviceError {
    let what = match e {
        TransportError::BadState(_) => "the transport refused the change in this QP state",
        _ => "the transport refused the attributes",
    };
    DeviceError::new(DeviceErrorKind::Transport, what)
}

impl Provider for RxeProvider {
    type Domain = HostDomain;
    type Pd = RxePd;
    type Mr = RxeMr;
    type Cq = RxeCq;
    type Qp = RxeQp;
    type Ah = RxeAh;

    fn backend(&self) -> &'static str {
        "rxe"
    }

    fn query_device(&self) -> Result<DeviceAttr, VerbsError> {
        let guid = self.sh.ports.first().map_or(0, |p| {
            u64::from_be_bytes(p.gid.raw()[8..16].try_into().unwrap_or([0; 8]))
        });
        Ok(DeviceAttr {
            fw_ver: concat!("rnic-rxe ", env!("CARGO_PKG_VERSION")).to_owned(),
            vendor_id: 0,
            vendor_part_id: 0,
            node_guid: guid,
            max_qp: 0x1_0000,
            max_qp_wr: 0x4000,
            max_sge: 32,
            max_cq: 0x4000,
            max_cqe: 0x8000,
            max_mr: 0x8000,
            max_mr_size: u64::MAX,
            max_qp_rd_atom: 128,
            max_qp_init_rd_atom: 128,
            max_inline_data: 400,
            atomic_cap: AtomicCap::Hca,
            phys_port_cnt: 1,
        })
    }

    fn query_port(&self, port_num: u8) -> Result<PortAttr, VerbsError> {
        if port_num != 1 {
            return Err(VerbsError::QueryPort {
                port: port_num,
                source: ONE_PORT,
            });
        }
        Ok(PortAttr {
            state: PortState::Active,
            max_mtu: Mtu::Mtu4096,
            active_mtu: self.sh.active_mtu,
            gid_tbl_len: u32::try_from(self.sh.ports.len()).unwrap_or(u32::MAX),
            link_layer: LinkLayer::Ethernet,
            active_width: 1,
            active_speed_mbps: 10_000,
            max_msg_sz: 1 << 31,
        })
    }

    fn query_gid_table(&self, port_num: u8) -> Result<Vec<GidEntry>, VerbsError> {
        if port_num != 1 {
            return Err(VerbsError::QueryGid {
                port: port_num,
                source: ONE_PORT,
            });
        }
        Ok(self
            .sh
            .ports
            .iter()
            .enumerate()
            .map(|(i, p)| GidEntry {
                index: i as u32,
                gid: p.gid,
                gid_type: GidType::RoceV2,
                netdev: p.netdev.clone(),
            })
            .collect())
    }

    fn alloc_pd(&self) -> Result<RxePd, VerbsError> {
        let h = self.sh.ctl().pds.insert(());
        Ok(RxePd {
            h,
            sh: Arc::clone(&self.sh),
        })
    }

    fn reg_mr(
        &self,
        pd: &RxePd,
        memory: Arc<dyn Memory>,
        access: AccessFlags,
    ) -> Result<(RxeMr, MrInfo), VerbsError> {
        let len = memory.len();
        let err = |source| VerbsError::RegMr {
            len,
            access,
            source,
        };
        if len == 0 {
            return Err(err(DeviceError::new(
                DeviceErrorKind::InvalidArgument,
                "an empty region cannot be registered: register at least one byte",
            )));
        }
        if !Arc::ptr_eq(&pd.sh, &self.sh) || self.sh.ctl().pds.get(pd.h).is_none() {
            return Err(err(GONE));
        }
        let keys = self
            .sh
            .keys_mut()
            .register(memory, 0, len as u64, PdHandle(pd.h), access)
            .map_err(|e| {
                tracing::debug!(error = %e, "key table registration refused");
                err(DeviceError::new(
                    DeviceErrorKind::NoResources,
                    "the key table has no room for another region: deregister some",
                ))
            })?;
        Ok((
            RxeMr {
                key: keys.lkey.get(),
                sh: Arc::clone(&self.sh),
            },
            MrInfo {
                lkey: keys.lkey,
                rkey: keys.rkey,
                addr: keys.start,
                len,
            },
        ))
    }

    fn create_cq(&self, depth: u32) -> Result<(RxeCq, u32), VerbsError> {
        let depth = depth.max(1);
        if depth > 0x8000 {
            return Err(VerbsError::CreateCq {
                depth,
                source: DeviceError::new(
                    DeviceErrorKind::InvalidArgument,
                    "an rxe CQ holds at most 32768 entries",
                ),
            });
        }
        let event =
            EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
                .map_err(|e| VerbsError::CreateCq {
                    depth,
                    source: DeviceError::os(e as i32, "eventfd for the CQ (check ulimit -n)"),
                })?;
        let cq = Arc::new(CqShared {
            ring: Mutex::new(CqRing {
                entries: VecDeque::with_capacity(depth as usize),
                qps: Slab::default(),
                armed: false,
            }),
            depth,
            queued: AtomicUsize::new(0),
            event,
        });
        Ok((
            RxeCq {
                cq,
                sh: Arc::clone(&self.sh),
            },
            depth,
        ))
    }

    fn create_qp(
        &self,
        pd: &RxePd,
        send_cq: &RxeCq,
        recv_cq: &RxeCq,
        init: &QpInitAttr,
    ) -> Result<(RxeQp, QpInfo), VerbsError> {
        let err = |what| VerbsError::CreateQp {
            source: DeviceError::new(DeviceErrorKind::InvalidArgument, what),
        };
        let sh = &self.sh;
        let ours = |o: &Arc<Shared>| Arc::ptr_eq(o, sh);
        if !ours(&pd.sh) || !ours(&send_cq.sh) || !ours(&recv_cq.sh) {
            return Err(VerbsError::CreateQp { source: GONE });
        }
        let mut ctl = sh.ctl();
        if ctl.pds.get(pd.h).is_none() {
            return Err(VerbsError::CreateQp { source: GONE });
        }
        let mut table = sh.qps.write().unwrap_or_else(|p| p.into_inner());
        let range = sh.qpns;
        let Some(n) = range.next_free(ctl.next_qpn, |n| table.contains_key(&n)) else {
            return Err(err(
                "every QPN of this device's range is in use: destroy QPs first",
            ));
        };
        let qpn = rnic_core::Qpn::from_wire(n);
        let local_gid = sh.ports.first().map_or(Gid::ZERO, |p| p.gid);
        let qp = Qp::new(
            QpConfig::from_init(qpn, PdHandle(pd.h), init, local_gid)
                .with_max_unacked_psns(sh.max_unacked_psns),
        )
        .map_err(|e| match e {
            TransportError::UnsupportedQpType(_) => {
                err("rxe runs RC and UD queue pairs, not UC: create an RC QP")
            }
            _ => err("the transport refused the QP's capacities"),
        })?;
        ctl.next_qpn = range.after(n);
        let polled = Arc::new(Polled::default());
        let send_slot = send_cq.cq.lock().qps.insert(Arc::clone(&polled));
        let recv_slot = recv_cq.cq.lock().qps.insert(Arc::clone(&polled));
        let q = Arc::new(QpShared {
            qpn,
            inner: Mutex::new(QpInner {
                qp,
                send_cq: Arc::clone(&send_cq.cq),
                send_slot,
                recv_cq: Arc::clone(&recv_cq.cq),
                recv_slot,
                qp_type: init.qp_type,
                caps: init.caps,
                attr: QpAttr {
                    cap: init.caps,
                    ..QpAttr::default()
                },
                sq_posted: 0,
                rq_posted: 0,
                discarded: false,
                tx: Tx::new(&sh.send),
                stats: Default::default(),
            }),
            deadline: AtomicU64::new(0),
            polled,
            answering: AtomicBool::new(true),
        });
        table.insert(n, Arc::clone(&q));
        sh.qps_gen.fetch_add(1, Ordering::Release);
        Ok((
            RxeQp {
                q,
                sh: Arc::clone(sh),
            },
            QpInfo {
                qpn,
                caps: init.caps,
            },
        ))
    }

    fn create_ah(&self, _pd: &RxePd, av: &AddressVector) -> Result<RxeAh, VerbsError> {
        match av_problem(&self.sh.ports, av) {
            None => Ok(RxeAh {
                sh: Arc::clone(&self.sh),
                av: *av,
            }),
            Some(source) => Err(VerbsError::AddressVector {
                dgid: av.dgid,
                source,
            }),
        }
    }
}

/// Record the attributes `mask` names (for `query_qp`).
fn apply_attr(a: &mut QpAttr, attr: &QpAttr, mask: QpAttrMask) {
    type Setter<'a> = &'a dyn Fn(&mut QpAttr);
    let pairs: [(QpAttrMask, Setter<'_>); 15] = [
        (QpAttrMask::STATE, &|a| a.qp_state = attr.qp_state),
        (QpAttrMask::ACCESS_FLAGS, &|a| {
            a.qp_access_flags = attr.qp_access_flags;
        }),
        (QpAttrMask::PKEY_INDEX, &|a| a.pkey_index = attr.pkey_index),
        (QpAttrMask::PORT, &|a| a.port_num = attr.port_num),
        (QpAttrMask::QKEY, &|a| a.qkey = attr.qkey),
        (QpAttrMask::AV, &|a| a.ah_attr = attr.ah_attr),
        (QpAttrMask::PATH_MTU, &|a| a.path_mtu = attr.path_mtu),
        (QpAttrMask::TIMEOUT, &|a| a.timeout = attr.timeout),
        (QpAttrMask::RETRY_CNT, &|a| a.retry_cnt = attr.retry_cnt),
        (QpAttrMask::RNR_RETRY, &|a| a.rnr_retry = attr.rnr_retry),
        (QpAttrMask::RQ_PSN, &|a| a.rq_psn = attr.rq_psn),
        (QpAttrMask::MAX_QP_RD_ATOMIC, &|a| {
            a.max_rd_atomic = attr.max_rd_atomic;
        }),
        (QpAttrMask::MIN_RNR_TIMER, &|a| {
            a.min_rnr_timer = attr.min_rnr_timer;
        }),
        (QpAttrMask::SQ_PSN, &|a| a.sq_psn = attr.sq_psn),
        (QpAttrMask::MAX_DEST_RD_ATOMIC, &|a| {
            a.max_dest_rd_atomic = attr.max_dest_rd_atomic;
        }),
    ];
    for (m, f) in pairs {
        if mask.contains(m) {
            f(a);
        }
    }
    if mask.contains(QpAttrMask::DEST_QPN) {
        a.dest_qp_num = attr.dest_qp_num;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_compares_the_rate_without_overflow() {
        let m = RxModeration::default(); // 2 GB/s = 2 bytes per ns
        assert!(m.dense(20_000, 10_000));
        assert!(!m.dense(19_999, 10_000));
        assert!(!m.dense(0, 0), "nothing received is never dense");
        assert!(m.dense(1, 0));
        assert!(
            !m.dense(u64::MAX / 4, u64::MAX),
            "no overflow at the extremes"
        );
        assert!(m.dense(u64::MAX, u64::MAX / 4));
    }

    #[test]
    fn the_nap_lets_an_eighth_of_the_window_arrive() {
        let m = RxModeration::default();
        let us = |d: Duration| d.as_nanos() as f64 / 1000.0;
        // 7 GB/s: 7 bytes per ns.
        assert_eq!(m.nap_for(7_000, 1_000, 128), m.nap, "9.4 µs → the shortest");
        assert!((us(m.nap_for(7_000, 1_000, 1024)) - 74.9).abs() < 0.1);
        assert_eq!(
            m.nap_for(2_000, 1_000, 1024),
            m.max_nap,
            "2 GB/s: 262 µs → the longest"
        );
        assert!((us(m.nap_for(3_000, 1_000, 512)) - 87.4).abs() < 0.1);
        assert_eq!(m.nap_for(0, 1_000, 1024), m.nap, "nothing measured");
        assert_eq!(m.nap_for(1, u64::MAX, u32::MAX), m.max_nap, "no overflow");
        let long = RxModeration {
            nap: Duration::from_micros(500),
            ..m
        };
        assert_eq!(
            long.nap_for(7_000, 1_000, 1024),
            long.nap,
            "a shortest nap above the longest wins"
        );
    }

    #[test]
    fn the_buffer_bounds_the_window() {
        assert_eq!(window_for_buffer(16 << 20), 1024, "8 MiB asked for");
        assert_eq!(
            window_for_buffer(425_984),
            128,
            "rmem_max's default: rxe's own"
        );
        assert_eq!(window_for_buffer(0), 128);
        assert_eq!(window_for_buffer(64 << 20), 4096);
    }

    #[test]
    fn the_environment_sets_the_nap_or_turns_moderation_off() {
        let d = RxModeration::default();
        assert_eq!(rx_moderation_from("0"), None);
        assert_eq!(
            rx_moderation_from(" 25 "),
            Some(RxModeration {
                nap: Duration::from_micros(25),
                ..d
            })
        );
        assert_eq!(
            rx_moderation_from("5000").map(|m| m.nap),
            Some(Duration::from_millis(1)),
            "capped at 1 ms"
        );
        assert_eq!(
            rx_moderation_from("fast"),
            Some(d),
            "not a number: the default"
        );
    }
}
