//! The transmit side: the engine's [`PacketSink`] over a preallocated arena,
//! ICRC filling, UDP GSO grouping and batched `sendmmsg` flushes.
//!
//! Packets are written back to back into one arena. A packet that follows
//! one of the same size to the same destination from the same socket joins
//! its *group*; a group of n > 1 packets leaves as one GSO datagram (one
//! `UDP_SEGMENT` send the kernel cuts into n datagrams, each a complete
//! RoCE packet with its own ICRC). The MIDDLE packets of a large message all
//! have the path-MTU size, so a 1 MiB WRITE leaves in a few dozen sends.
//!
//! **ACK coalescing.** A plain (positive, cumulative) ACK queued right
//! behind a plain ACK of the same connection for an earlier PSN overwrites
//! it in place (same slot, same identification, ICRC refilled): a receive
//! round that served many AckReqs sends one ACK per connection, as a NIC's
//! coalescing would. NAKs, RNR NAKs and ATOMIC ACKNOWLEDGEs are never
//! merged. Counted as `acks_coalesced`.
//!
//! **ACK bundling.** A request packet queued right behind a lone plain ACK
//! to the same peer from the same socket trades places with it and the two
//! leave as one GSO datagram: the request as segment 0, the ACK (never
//! longer than a request it is bundled with) as the shorter last segment.
//! The ACK answers the peer's requester and the request goes to its
//! responder, two independent streams, so their relative order is free; the
//! order inside each stream is unchanged. This is the ping-pong case: the
//! caller-driven mode defers the ACK of a received request, the
//! application answers with its own request, and one send (and, at a GRO
//! receiver, one receive) carries both. On loopback that is the difference
//! between one datagram and two per one-way trip. Counted as
//! `acks_bundled`.
//!
//! **Payloads in place.** A packet whose payload lies in registered memory
//! that offers direct access (`Memory::direct`: heap, hugepage and
//! application-owned buffers), at least [`Tx::in_place_min`] bytes long, is
//! not copied: the engine commits its headers and tail (pad, ICRC) to the
//! arena and names the payload's pieces (`PacketSink::commit_gather`); the
//! queue holds each piece's memory (`Arc`) until the flush, and the flush
//! hands the kernel iovecs — headers from the arena, payload from the
//! region — in the same GSO groups, so the only copy of a payload byte on
//! the sending side is the kernel's. The ICRC of such a packet is computed
//! at the flush over the headers, the payload (read in place by
//! `rnic_dma::crc`, whose loads are inline assembly over the region's raw
//! address: no copy, no Rust reference into the region) and the pad; the
//! kernel then reads the payload while it is still in the cache, because a
//! queue flushes once [`ARENA`] bytes of wire data are waiting. Counted as
//! `tx_in_place` / `tx_in_place_bytes`.
//!
//! **IPv4 identification.** The ICRC covers the IPv4 identification, which
//! the kernel picks. Every socket sets `IP_PMTUDISC_DO` (DF) and stays
//! unconnected; Linux then sends identification 0 for a datagram
//! (`ip_select_ident_segs`), and the segments of a GSO send get 0, 1, 2, …
//! So packet `i` of a group is filled with identification `i`. (The crate's
//! tests capture the packets on the wire and check this.) Since a packet's
//! place in its group is final only when the group leaves (coalescing and
//! bundling move packets), ICRCs are filled at [`Tx::flush`], once per
//! packet.
//!
//! **Frames.** With a frame sender (`crate::frames`, beside the packet
//! ring), the flush gives each group to an IPv4 peer whose next hop is
//! usable that hop (one cached lookup per peer and table generation) and
//! sends runs of such groups through the frame socket: the headers a DF
//! socket would write in front (identification 0, as above; a GSO group's
//! segmentation in its virtio-net header), a small datagram copied behind
//! them into one buffer, and a run of one by `sendto`. A refused frame goes
//! through the group's socket instead.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV6, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use rnic_core::memory::{DirectSpan, PinnedSpan};
use rnic_core::{Gid, Memory, QpType, Qpn};
use rnic_dma::crc::crc32_span;
use rnic_roce::transport::{PacketDest, PacketSink, Piece};
use rnic_roce::wire::roce::MIN_LEN;
use rnic_roce::wire::{Opcode, Transport, icrc};
use rustc_hash::FxHashMap;

use crate::frames::{FRAME_HDR, FrameTx, Hop, Shape};
use crate::gid::{qp_udp_sport, rc_udp_sport};
use crate::port::Port;
use crate::stats::DeviceStats;
use crate::sys::{self, BATCH, RawIov, SMALL_BATCH, TxMsg};

/// Arena bytes: room for a full GSO group (64 KiB) several times over; also
/// the wire bytes (payloads in place included) a queue holds before it
/// flushes, so the kernel reads in-place payloads soon after their ICRC
/// pass read them (still in the core's cache).
const ARENA: usize = 512 * 1024;
/// Regions a queue holds for in-place payloads between flushes (it flushes
/// before a packet could need more).
const MAX_HOLDS: usize = 8;
/// Pieces one in-place payload may have (rnic-roce's limit).
const MAX_PIECES: usize = 4;
/// Payloads of at least this many bytes leave from registered memory in
/// place by default ([`Tx::in_place_min`]).
pub const IN_PLACE_MIN: usize = 512;
/// Largest GSO datagram payload (the kernel's limit is 65507 for IPv4).
const GSO_MAX_BYTES: usize = 65_000;
/// Largest GSO segment count (the kernel's `UDP_MAX_SEGMENTS` is 64 or 128).
const GSO_MAX_SEGS: usize = 64;
/// Bytes of a frame buffer: the headers and a small datagram behind them.
const FRAME_BUF: usize = 256;
/// Datagrams (groups) queued before a flush.
const MAX_MSGS: usize = 256;
/// BTH opcode of an RC ACKNOWLEDGE (ACK or NAK).
const OP_ACKNOWLEDGE: u8 = Opcode::RC_ACKNOWLEDGE.0;
/// Bytes of a plain ACKNOWLEDGE: BTH (12) + AETH (4) + ICRC (4).
const ACK_LEN: usize = 20;

/// Whether `pkt` is an RC request (a requester's packet: SEND, WRITE, READ
/// request, atomic), as opposed to a responder's (READ response,
/// ACKNOWLEDGE, ATOMIC ACKNOWLEDGE) or another transport's.
fn rc_request(pkt: &[u8]) -> bool {
    pkt.first()
        .and_then(|&op| Opcode(op).info())
        .is_some_and(|i| i.transport == Transport::Rc && i.operation.is_request())
}

/// The queued ACK a newer ACK of the same connection may replace: the last
/// packet in the arena.
#[derive(Clone, Copy, Debug)]
struct LastAck {
    /// Its offset in the arena.
    off: usize,
    /// Sending socket and destination.
    sock: usize,
    dst: SocketAddr,
    /// BTH DestQP (bytes 5..8) and PSN (bytes 9..12).
    qpn: [u8; 3],
    psn: u32,
}

/// A plain positive ACK (syndrome 000xxxxx): cumulative, so a later one of
/// the same connection makes an earlier one redundant.
fn plain_ack(pkt: &[u8]) -> Option<([u8; 3], u32)> {
    match pkt {
        [
            OP_ACKNOWLEDGE,
            _,
            _,
            _,
            _,
            q0,
            q1,
            q2,
            _,
            p0,
            p1,
            p2,
            syn,
            ..,
        ] if pkt.len() == ACK_LEN && syn & 0xe0 == 0 => {
            Some(([*q0, *q1, *q2], u32::from_be_bytes([0, *p0, *p1, *p2])))
        }
        _ => None,
    }
}

/// A socket that sends from one (address, UDP source port).
#[derive(Debug)]
pub struct SendSock {
    sock: UdpSocket,
    port: u16,
    /// The IPv4 TOS and TTL its datagrams carry, which a frame in its place
    /// carries too.
    tos_ttl: (u8, u8),
}

/// A socket's key: (port index, source port, (traffic class, hop limit)).
type SockKey = (usize, u16, (u8, u8));

/// What every QP's transmit side shares: the send sockets (opened on first
/// use by whichever QP needs one, then cached by each QP) and whether the
/// kernel takes GSO. Touched on a QP's first packet to a new (source port,
/// class) and when GSO is refused, never per packet.
#[derive(Debug)]
pub struct SendSockets {
    socks: Mutex<FxHashMap<SockKey, Arc<SendSock>>>,
    /// The kernel takes `UDP_SEGMENT` (cleared on the first refusal).
    pub gso: AtomicBool,
    /// Send from rxe's per-QP UDP source ports (else from the listening port).
    pub per_qp_sport: bool,
    /// What each QP's [`Tx::in_place_min`] starts as.
    pub in_place_min: usize,
    /// Datagrams and GSO groups to peers with a usable next hop leave as
    /// frames (`crate::frames`); `None`: always through the UDP sockets.
    pub frames: Option<FrameTx>,
}

impl SendSockets {
    /// No sockets yet.
    pub fn new(gso: bool, per_qp_sport: bool, in_place_min: usize) -> SendSockets {
        SendSockets {
            socks: Mutex::new(FxHashMap::default()),
            gso: AtomicBool::new(gso),
            per_qp_sport,
            in_place_min,
            frames: None,
        }
    }

    /// The same, sending datagrams as frames through `frames` where it
    /// can.
    pub fn with_frames(mut self, frames: Option<FrameTx>) -> SendSockets {
        self.frames = frames;
        self
    }

    /// The socket sending from (`ports[port]`, `sport`, `tos`), opened on
    /// first use. When the source port cannot be bound (taken by someone
    /// else) the listening socket sends instead, from the RoCE port.
    fn get(&self, ports: &[Port], key: SockKey, stats: &mut DeviceStats) -> Option<Arc<SendSock>> {
        let mut socks = self.socks.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = socks.get(&key) {
            return Some(Arc::clone(s));
        }
        let (port, want, tos) = key;
        let p = ports.get(port)?;
        let sock = if want == 0 {
            p.sock.try_clone().ok()
        } else {
            match p.bind_sender(want, tos.0, tos.1) {
                Ok(s) => Some(s),
                Err(_) => {
                    stats.sport_fallbacks += 1;
                    p.sock.try_clone().ok()
                }
            }
        }?;
        let local = sock.local_addr().ok()?.port();
        // The listening socket (and the fallback) keeps the system's
        // defaults: TOS 0, `net.ipv4.ip_default_ttl`.
        let default_ttl = self.frames.as_ref().map_or(64, |f| f.default_ttl);
        let tos_ttl = match crate::port::sender_hops(tos.0, tos.1) {
            Some(hops) if want != 0 && local == want => (tos.0, hops),
            _ => (0, default_ttl),
        };
        let s = Arc::new(SendSock {
            sock,
            port: local,
            tos_ttl,
        });
        socks.insert(key, Arc::clone(&s));
        Some(s)
    }
}

/// One queued datagram or GSO group.
#[derive(Clone, Copy, Debug)]
struct Group {
    sock: usize,
    /// The local address and UDP source port it leaves from (the ICRC
    /// covers them).
    src: IpAddr,
    sport: u16,
    /// BTH DestQP of its packets: a GSO group never mixes QPs, so a shared
    /// address's steering (by the first packet) sends all to the right one.
    dqpn: u32,
    dst: SocketAddr,
    /// Its first byte in the arena.
    off: usize,
    /// Arena bytes it spans (headers and tails only, for packets in place).
    arena_len: usize,
    /// Bytes on the wire (all segments).
    len: usize,
    segs: usize,
    seg_len: usize,
    /// Another equal-sized packet may still join.
    open: bool,
    /// Index of its first packet in [`Tx::pkts`] when any of its packets
    /// has its payload in place (then every packet of it has an entry);
    /// `None`: all its bytes are `arena[off..off + len]`.
    pkts: Option<usize>,
    /// Leaves as a frame to this next hop (chosen at the flush).
    link: Option<Hop>,
}

/// A packet of a group with payloads in place.
#[derive(Clone, Copy, Debug)]
struct Pkt {
    /// Its first byte (BTH) in the arena.
    off: usize,
    /// Header bytes in the arena (the whole packet when `pieces` is 0).
    head: usize,
    /// Bytes after the payload (pad, ICRC), right behind the headers.
    tail: usize,
    /// Its payload pieces: `Tx::pieces[first..first + pieces]`.
    first: usize,
    pieces: usize,
}

/// An in-place payload piece: `len` bytes at `offset` of `Tx::holds[hold]`.
#[derive(Clone, Copy, Debug)]
struct HeldPiece {
    hold: usize,
    offset: usize,
    len: usize,
}

/// What [`Sink::commit`] resolves a packet's destination by: the address
/// vector's fields that routing, the UDP source port and the socket depend
/// on, and the BTH DestQP (the source port hashes it). The emitting QP's
/// number and type, the rest of the inputs, are fixed for a [`Tx`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct RouteKey {
    dgid: Gid,
    sgid_index: u8,
    traffic_class: u8,
    hop_limit: u8,
    udp_sport: Option<u16>,
    dqpn: u32,
}

/// A resolved destination: the socket (index into [`Tx::socks`]) and
/// the addresses a packet to it leaves with.
#[derive(Clone, Copy, Debug)]
struct Route {
    key: RouteKey,
    dst: SocketAddr,
    sock: usize,
    src: IpAddr,
    sport: u16,
}

/// The sending state of one QP (under the QP's lock): its packets since
/// the last flush and the sockets it has sent from.
#[derive(Debug)]
pub struct Tx {
    /// Grown on demand up to [`ARENA`] (a QP that never sends holds none).
    arena: Vec<u8>,
    used: usize,
    groups: Vec<Group>,
    socks: Vec<Arc<SendSock>>,
    /// (port, source port, (traffic class, hop limit)) → socket.
    by_port: FxHashMap<SockKey, usize>,
    /// The kernel takes `UDP_SEGMENT` (this QP's copy of
    /// [`SendSockets::gso`]).
    pub gso: bool,
    /// Send from rxe's per-QP UDP source ports (else from the listening port).
    pub per_qp_sport: bool,
    /// Every packet queued since the last flush is an ACKNOWLEDGE.
    only_acks: bool,
    /// The last packet queued, when it is a plain ACK.
    last_ack: Option<LastAck>,
    /// The destination the last packet resolved to (an RC QP's packets all
    /// go to one peer: resolved once, not per packet). Its socket index
    /// stays valid: `socks` only grows.
    route: Option<Route>,
    /// Payloads of at least this many bytes leave from registered memory
    /// in place (`usize::MAX`: never); see the module docs.
    pub in_place_min: usize,
    /// Wire bytes queued since the last flush.
    wire: usize,
    /// The packets of groups with payloads in place, and their pieces.
    pkts: Vec<Pkt>,
    pieces: Vec<HeldPiece>,
    /// The regions in-place payloads are sent from, held until the flush.
    holds: Vec<Arc<dyn Memory>>,
    /// The iovecs of a flush (kept to reuse the allocation).
    iov: Vec<RawIov>,
    /// The CRC over this QP's packets' constant prefixes, per shape.
    icrc: icrc::IcrcCache,
    /// The last frame next-hop lookup: (table generation, peer, hop).
    frame_hop: Option<(u64, Ipv4Addr, Option<Hop>)>,
    /// A flush's frames' headers, one buffer per message of a `sendmmsg`,
    /// with the packets of small datagrams copied behind them (sized to
    /// [`BATCH`] on first use, never resized after: the iovecs point into
    /// it).
    frame_bufs: Vec<[u8; FRAME_BUF]>,
}

/// Which QP the engine is emitting for (the source port depends on it).
#[derive(Clone, Copy, Debug)]
pub struct TxCtx {
    /// The emitting QP.
    pub qpn: Qpn,
    /// Its type.
    pub qp_type: QpType,
}

impl Tx {
    /// An empty transmit state, sending through `shared`'s sockets.
    pub fn new(shared: &SendSockets) -> Tx {
        Tx {
            arena: Vec::new(),
            used: 0,
            groups: Vec::new(),
            socks: Vec::new(),
            by_port: FxHashMap::default(),
            gso: shared.gso.load(Ordering::Relaxed),
            per_qp_sport: shared.per_qp_sport,
            only_acks: true,
            last_ack: None,
            route: None,
            in_place_min: shared.in_place_min,
            wire: 0,
            pkts: Vec::new(),
            pieces: Vec::new(),
            holds: Vec::new(),
            iov: Vec::new(),
            icrc: icrc::IcrcCache::new(),
            frame_hop: None,
            frame_bufs: Vec::new(),
        }
    }

    /// Datagrams waiting for [`Tx::flush`].
    pub fn pending(&self) -> usize {
        self.groups.len()
    }

    /// Something is queued and all of it is ACKs/NAKs.
    pub fn only_acks(&self) -> bool {
        self.only_acks && !self.groups.is_empty()
    }

    /// The socket sending from (`ports[port]`, `sport`): this QP's cached
    /// one, else the device's ([`SendSockets::get`]). A per-QP socket sends
    /// with the address vector's traffic class and hop limit (`tos`), as
    /// kernel rxe's IP headers carry them; the listening socket (no per-QP
    /// ports, or the fallback) sends with the system's defaults.
    fn sock_for(
        &mut self,
        shared: &SendSockets,
        ports: &[Port],
        port: usize,
        sport: u16,
        tos: (u8, u8),
        stats: &mut DeviceStats,
    ) -> Option<usize> {
        let key = if self.per_qp_sport {
            (port, sport, tos)
        } else {
            (port, 0, (0, 0))
        };
        if let Some(&i) = self.by_port.get(&key) {
            return Some(i);
        }
        let s = shared.get(ports, key, stats)?;
        self.socks.push(s);
        let i = self.socks.len() - 1;
        self.by_port.insert(key, i);
        Some(i)
    }

    /// Make room for `len` more bytes at `used` (the arena grows by
    /// doubling up to [`ARENA`]: no allocation per packet once warm).
    fn reserve(&mut self, len: usize) {
        let need = self.used + len;
        if need > self.arena.len() {
            let grown = (self.arena.len() * 2).clamp(16 * 1024, ARENA).max(need);
            self.arena.resize(grown, 0);
        }
    }

    /// The engine's sink for packets of `ctx` (flushes to `ports` when the
    /// arena fills).
    pub fn sink<'a>(
        &'a mut self,
        shared: &'a SendSockets,
        ports: &'a [Port],
        roce_port: u16,
        stats: &'a mut DeviceStats,
        ctx: TxCtx,
    ) -> Sink<'a> {
        Sink {
            tx: self,
            shared,
            ports,
            roce_port,
            stats,
            ctx,
        }
    }

    /// Fill the ICRC of every queued packet: packet `k` of a group with
    /// IPv4 identification `k`. A packet that cannot be filled (never one
    /// the engine emits: [`Sink::commit`] checks the lengths) leaves with
    /// a bad ICRC, and is dropped and counted by the peer; counted here as
    /// a transmit error. In-place payloads are read through `spans` (the
    /// held regions' direct spans).
    fn fill_icrcs(&mut self, spans: &[Option<DirectSpan<'_>>], stats: &mut DeviceStats) {
        let Tx {
            arena,
            groups,
            pkts,
            pieces,
            icrc: cache,
            ..
        } = self;
        for g in groups.iter() {
            match g.pkts {
                None => {
                    let mut off = g.off;
                    let end = g.off + g.len;
                    let mut k = 0u16;
                    while off < end {
                        let len = g.seg_len.min(end - off);
                        let filled = arena
                            .get_mut(off..off + len)
                            .is_some_and(|pkt| fill_icrc(cache, g.src, g.dst, g.sport, k, pkt));
                        if !filled {
                            stats.tx_errors += 1;
                        }
                        off += len;
                        k = k.wrapping_add(1);
                    }
                }
                Some(first) => {
                    for (k, p) in pkts.iter().skip(first).take(g.segs).enumerate() {
                        let filled = if p.pieces == 0 {
                            arena.get_mut(p.off..p.off + p.head).is_some_and(|pkt| {
                                fill_icrc(cache, g.src, g.dst, g.sport, k as u16, pkt)
                            })
                        } else {
                            let ps = pieces.get(p.first..p.first + p.pieces).unwrap_or(&[]);
                            fill_icrc_in_place(cache, g, k as u16, p, ps, spans, arena)
                        };
                        if !filled {
                            stats.tx_errors += 1;
                        }
                    }
                }
            }
        }
    }

    /// Send everything queued. Errors are counted, never returned: a lost
    /// packet is the transport's to retransmit.
    pub fn flush(&mut self, shared: &SendSockets, stats: &mut DeviceStats) {
        if self.groups.is_empty() {
            return;
        }
        // The held regions' direct spans, pinned until the last send of
        // this flush returned: what the in-place iovecs point into.
        let holds = std::mem::take(&mut self.holds);
        let pins: [Option<PinnedSpan<'_>>; MAX_HOLDS] =
            std::array::from_fn(|i| holds.get(i).and_then(|h| h.pin_direct()));
        let spans = pins.each_ref().map(|p| p.as_ref().map(PinnedSpan::span));
        self.fill_icrcs(&spans, stats);
        if let Some(f) = &shared.frames {
            self.choose_links(f);
        }
        let mut at = 0;
        while at < self.groups.len() {
            // A run of groups from the same socket goes in one sendmmsg; so
            // does a run of frames (all through the frame socket).
            let sock = self.groups[at].sock;
            let framed = self.groups[at].link.is_some();
            let mut end = at;
            while end < self.groups.len()
                && end - at < BATCH
                && self.groups[end].link.is_some() == framed
                && (framed || self.groups[end].sock == sock)
            {
                end += 1;
            }
            let Some(s) = self.socks.get(sock).map(Arc::clone) else {
                at = end;
                continue;
            };
            let fd = match (&shared.frames, framed) {
                (Some(f), true) => f.fd(),
                _ => s.sock.as_fd(),
            };
            stats.sendmmsg_calls += 1;
            let sent = self.send_run(fd, at..end, &spans, stats);
            match sent {
                Ok(0) => {
                    stats.tx_errors += 1;
                    at += 1;
                }
                Ok(n) => {
                    for g in &self.groups[at..at + n] {
                        stats.tx_datagrams += 1;
                        if g.link.is_some() {
                            stats.tx_frames += 1;
                        }
                        if g.segs > 1 {
                            stats.gso_sends += 1;
                            stats.gso_segments += g.segs as u64;
                        }
                    }
                    at += n;
                }
                Err(e) if framed => {
                    // The kernel refused the frame: this group goes through
                    // its socket. A refused GSO frame turns GSO frames off;
                    // an interface gone makes the hop be judged again.
                    let g = &mut self.groups[at];
                    tracing::debug!(error = %e, dst = %g.dst, segs = g.segs, "frame refused; sending through the socket");
                    if let (Some(f), IpAddr::V4(ip)) = (&shared.frames, g.dst.ip()) {
                        if g.segs > 1 {
                            f.gso.store(false, Ordering::Relaxed);
                        } else if matches!(
                            e.raw_os_error(),
                            Some(libc::ENXIO | libc::ENODEV | libc::ENETDOWN)
                        ) {
                            f.forget(ip);
                        }
                    }
                    g.link = None;
                    stats.tx_frame_fallbacks += 1;
                }
                Err(e) => {
                    let g = self.groups[at];
                    if g.segs > 1 && gso_unsupported(&e) {
                        // The kernel refused GSO: turn it off and send this
                        // group's packets one by one (identification 0 each).
                        self.gso = false;
                        shared.gso.store(false, Ordering::Relaxed);
                        stats.gso_fallbacks += 1;
                        self.split_group(at, &spans, stats);
                        continue;
                    }
                    tracing::debug!(error = %e, dst = %g.dst, "send failed");
                    stats.tx_errors += 1;
                    if e.raw_os_error() == Some(libc::EMSGSIZE) {
                        stats.tx_too_big += 1;
                    }
                    at += 1;
                }
            }
        }
        // The regions are unpinned and released only now: every send naming
        // them has returned (the kernel copied their bytes).
        drop(pins);
        self.holds = holds;
        self.holds.clear();
        self.groups.clear();
        self.pkts.clear();
        self.pieces.clear();
        self.used = 0;
        self.wire = 0;
        self.only_acks = true;
        self.last_ack = None;
    }

    /// Send groups `run` (one socket's) with one `sendmmsg`: each group's
    /// iovecs — the arena bytes, or for groups with payloads in place the
    /// headers and tails from the arena and the payloads from `spans` — then
    /// the call. A group naming a region that no longer offers a span
    /// large enough (a `Memory` whose `direct` changed, a contract breach)
    /// is not sent: counted as a transmit error, retransmitted later.
    fn send_run(
        &mut self,
        fd: BorrowedFd<'_>,
        run: std::ops::Range<usize>,
        spans: &[Option<DirectSpan<'_>>],
        stats: &mut DeviceStats,
    ) -> io::Result<usize> {
        // A ping-pong's flush sends one datagram: its message array is
        // sized for the run, not for BATCH (initialised whole every call).
        if run.len() == 1 {
            self.send_run_n::<1>(fd, run, spans, stats)
        } else if run.len() <= SMALL_BATCH {
            self.send_run_n::<SMALL_BATCH>(fd, run, spans, stats)
        } else {
            self.send_run_n::<BATCH>(fd, run, spans, stats)
        }
    }

    /// Pick the groups that leave as frames: datagrams and GSO groups to
    /// IPv4 peers whose next hop `frames` accepted (looked up once per peer
    /// and table generation: an RC QP's flush costs two atomic loads here).
    fn choose_links(&mut self, frames: &FrameTx) {
        let generation = frames.generation();
        let gso = frames.gso.load(Ordering::Relaxed);
        let Tx {
            groups, frame_hop, ..
        } = self;
        for g in groups.iter_mut() {
            g.link = None;
            let (IpAddr::V4(_), SocketAddr::V4(d)) = (g.src, g.dst) else {
                continue;
            };
            if g.segs > 1 && !gso {
                continue;
            }
            let peer = *d.ip();
            g.link = match *frame_hop {
                Some((at, p, hop)) if at == generation && p == peer => hop,
                _ => {
                    let hop = frames.hop(peer);
                    *frame_hop = Some((generation, peer, hop));
                    hop
                }
            };
        }
    }

    /// [`Tx::send_run`] with a message array of `N` entries.
    fn send_run_n<const N: usize>(
        &mut self,
        fd: BorrowedFd<'_>,
        run: std::ops::Range<usize>,
        spans: &[Option<DirectSpan<'_>>],
        stats: &mut DeviceStats,
    ) -> io::Result<usize> {
        let mut msgs = [TxMsg {
            first: 0,
            count: 0,
            dst: SocketAddr::from(([0, 0, 0, 0], 0)),
            gso: 0,
            link: None,
        }; N];
        self.iov.clear();
        let base = self.arena.as_ptr() as usize;
        let mut n = 0;
        for g in self.groups[run].iter().take(N) {
            let first = self.iov.len();
            let mut whole = false;
            if let Some(hop) = &g.link {
                let (IpAddr::V4(src), SocketAddr::V4(dst)) = (g.src, g.dst) else {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        "a frame to an IPv6 peer",
                    ));
                };
                let (tos, ttl) = self.socks.get(g.sock).map_or((0, 64), |s| s.tos_ttl);
                let shape = Shape {
                    src: (src, g.sport),
                    dst: (*dst.ip(), dst.port()),
                    tos,
                    ttl,
                    payload: g.len,
                    gso: if g.segs > 1 { g.seg_len as u16 } else { 0 },
                };
                // Never for a group the queue built (at most
                // GSO_MAX_BYTES); such a group is refused like a frame the
                // kernel refuses, or left for the next call.
                let hdr = match crate::frames::headers(hop, &shape) {
                    Ok(h) => h,
                    Err(e) if n == 0 => {
                        return Err(io::Error::new(io::ErrorKind::InvalidInput, e));
                    }
                    Err(_) => break,
                };
                // Sized once, at a device's first frame, before any iovec
                // points into it (a QP that sends no frame holds none).
                if self.frame_bufs.len() < BATCH {
                    self.frame_bufs.resize(BATCH, [0; FRAME_BUF]);
                }
                let buf = &mut self.frame_bufs[n];
                buf[..FRAME_HDR].copy_from_slice(&hdr);
                // A small datagram is copied behind its headers: the frame
                // is one iovec (the kernel's per-iovec cost is more than
                // copying a ping-pong's 60 bytes).
                let mut len = FRAME_HDR;
                if g.pkts.is_none()
                    && FRAME_HDR + g.len <= FRAME_BUF
                    && let Some(pkt) = self.arena.get(g.off..g.off + g.len)
                {
                    buf[FRAME_HDR..FRAME_HDR + g.len].copy_from_slice(pkt);
                    len += g.len;
                    whole = true;
                }
                self.iov.push(RawIov {
                    base: self.frame_bufs.as_ptr() as usize + n * FRAME_BUF,
                    len,
                });
            }
            let ok = whole
                || match g.pkts {
                    None => {
                        self.iov.push(RawIov {
                            base: base + g.off,
                            len: g.len,
                        });
                        g.off + g.len <= self.arena.len()
                    }
                    Some(p0) => push_in_place_iovs(
                        &mut self.iov,
                        base,
                        self.arena.len(),
                        self.pkts.get(p0..p0 + g.segs).unwrap_or(&[]),
                        &self.pieces,
                        spans,
                    ),
                };
            if !ok {
                // Everything before it goes now; this group is dropped.
                self.iov.truncate(first);
                stats.tx_errors += 1;
                if n == 0 {
                    return Ok(1);
                }
                break;
            }
            msgs[n] = TxMsg {
                first,
                count: self.iov.len() - first,
                dst: g.dst,
                // A frame's segmentation is in its virtio-net header.
                gso: if g.segs > 1 && g.link.is_none() {
                    g.seg_len as u16
                } else {
                    0
                },
                link: g.link,
            };
            n += 1;
        }
        // SAFETY: every iovec points into `self.arena` (bounds checked above,
        // not resized before the call), into `self.frame_bufs` (entries
        // below N <= BATCH, sized once before the first pointer into it was
        // taken, never resized after) or into a
        // held region's direct span
        // (`spans`, borrowed from `holds`, which the caller keeps until after
        // this returns; ranges checked by `push_in_place_iovs`). The kernel
        // only reads them.
        unsafe { sys::send_iov_batch(fd, &msgs[..n], &self.iov) }
    }

    /// Replace the GSO group at `i` by its single packets, re-filling their
    /// ICRCs for identification 0.
    fn split_group(&mut self, i: usize, spans: &[Option<DirectSpan<'_>>], stats: &mut DeviceStats) {
        let g = self.groups[i];
        let mut singles = Vec::with_capacity(g.segs);
        match g.pkts {
            None => {
                let mut off = g.off;
                let end = g.off + g.len;
                while off < end {
                    let len = g.seg_len.min(end - off);
                    if let Some(pkt) = self.arena.get_mut(off..off + len) {
                        fill_icrc(&mut self.icrc, g.src, g.dst, g.sport, 0, pkt);
                    }
                    singles.push(Group {
                        off,
                        arena_len: len,
                        len,
                        segs: 1,
                        seg_len: len,
                        open: false,
                        ..g
                    });
                    off += len;
                }
            }
            Some(p0) => {
                for j in p0..p0 + g.segs {
                    let Some(p) = self.pkts.get(j).copied() else {
                        continue;
                    };
                    let single = Group {
                        off: p.off,
                        arena_len: p.head + p.tail,
                        len: p.head + p.tail + piece_bytes(&self.pieces, &p),
                        segs: 1,
                        seg_len: 0,
                        open: false,
                        pkts: Some(j),
                        ..g
                    };
                    let single = Group {
                        seg_len: single.len,
                        ..single
                    };
                    let filled = if p.pieces == 0 {
                        self.arena
                            .get_mut(p.off..p.off + p.head)
                            .is_some_and(|pkt| {
                                fill_icrc(&mut self.icrc, g.src, g.dst, g.sport, 0, pkt)
                            })
                    } else {
                        let ps = self.pieces.get(p.first..p.first + p.pieces).unwrap_or(&[]);
                        fill_icrc_in_place(
                            &mut self.icrc,
                            &single,
                            0,
                            &p,
                            ps,
                            spans,
                            &mut self.arena,
                        )
                    };
                    if !filled {
                        stats.tx_errors += 1;
                    }
                    singles.push(single);
                }
            }
        }
        self.groups.splice(i..=i, singles);
    }
}

/// Payload bytes of packet `p`'s pieces.
fn piece_bytes(pieces: &[HeldPiece], p: &Pkt) -> usize {
    pieces
        .get(p.first..p.first + p.pieces)
        .map_or(0, |ps| ps.iter().map(|x| x.len).sum())
}

/// Fill the ICRC of in-place packet `p` (segment `k` of group `g`): the
/// headers from the arena, the payload `ps` CRCed in place in `spans`
/// (`rnic_dma::crc::crc32_span`: no copy, no reference into the region),
/// the pad; the result goes into the tail's last 4 bytes. `false` when a
/// piece's span is gone or too short, or the arena bytes are missing.
fn fill_icrc_in_place(
    cache: &mut icrc::IcrcCache,
    g: &Group,
    k: u16,
    p: &Pkt,
    ps: &[HeldPiece],
    spans: &[Option<DirectSpan<'_>>],
    arena: &mut [u8],
) -> bool {
    let payload: usize = ps.iter().map(|x| x.len).sum();
    let roce_len = p.head + payload + p.tail;
    let (Some(head), Some(tail)) = (
        arena.get(p.off..p.off + p.head),
        arena.get(p.off + p.head..p.off + p.head + p.tail),
    ) else {
        return false;
    };
    let Some(pad) = tail.get(..tail.len().saturating_sub(4)) else {
        return false;
    };
    // The segments of a group share their prefix but the identification:
    // resumed from the cache's state, the headers cost one short CRC call.
    let stream = match (g.src, g.dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            cache.stream_v4(s, d, k, true, g.sport, g.dst.port(), roce_len, head)
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            cache.stream_v6(s, d, g.sport, g.dst.port(), roce_len, head)
        }
        _ => None,
    };
    let Some(mut h) = stream else {
        return false;
    };
    for piece in ps {
        let Some(Some(span)) = spans.get(piece.hold) else {
            return false;
        };
        let read = h.update_with(|crc| crc32_span(crc, span, piece.offset, piece.len));
        if read.is_err() {
            return false;
        }
    }
    h.update(pad);
    let crc = h.finish().to_le_bytes();
    let end = p.off + p.head + p.tail;
    match arena.get_mut(end - 4..end) {
        Some(t) => {
            t.copy_from_slice(&crc);
            true
        }
        None => false,
    }
}

/// Append the iovecs of one group's in-place packets to `iov`: per packet
/// its headers from the arena, its pieces from `spans`, its tail from the
/// arena (a tail and the next packet's headers, adjacent in the arena, share
/// one iovec). `false` when a range lies outside the arena or a span.
fn push_in_place_iovs(
    iov: &mut Vec<RawIov>,
    base: usize,
    arena_len: usize,
    pkts: &[Pkt],
    pieces: &[HeldPiece],
    spans: &[Option<DirectSpan<'_>>],
) -> bool {
    // Iovecs before `first` belong to earlier datagrams: never merged into.
    let first = iov.len();
    let push_arena = |iov: &mut Vec<RawIov>, off: usize, len: usize| -> bool {
        if off + len > arena_len {
            return false;
        }
        if len == 0 {
            return true;
        }
        let mine = iov.len() > first;
        match iov.last_mut() {
            Some(last) if mine && last.base + last.len == base + off => {
                last.len += len;
            }
            _ => iov.push(RawIov {
                base: base + off,
                len,
            }),
        }
        true
    };
    for p in pkts {
        if !push_arena(iov, p.off, p.head) {
            return false;
        }
        for piece in pieces.get(p.first..p.first + p.pieces).unwrap_or(&[]) {
            let Some(Some(span)) = spans.get(piece.hold) else {
                return false;
            };
            let Ok(at) = span.range(rnic_core::MemAccess::Read, piece.offset, piece.len) else {
                return false;
            };
            iov.push(RawIov {
                base: at as usize,
                len: piece.len,
            });
        }
        if !push_arena(iov, p.off + p.head, p.tail) {
            return false;
        }
    }
    true
}

fn gso_unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EIO | libc::EINVAL | libc::EOPNOTSUPP | libc::ENOPROTOOPT)
    )
}

fn same_family(a: IpAddr, b: IpAddr) -> bool {
    a.is_ipv4() == b.is_ipv4()
}

/// Fill the ICRC of `pkt` (BTH..ICRC) sent from `src`:`sport` to `dst` with
/// IPv4 identification `ip_id` (DF set), through the QP's ICRC cache.
fn fill_icrc(
    cache: &mut icrc::IcrcCache,
    src: IpAddr,
    dst: SocketAddr,
    sport: u16,
    ip_id: u16,
    pkt: &mut [u8],
) -> bool {
    match (src, dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => cache
            .fill_v4(s, d, ip_id, true, sport, dst.port(), pkt)
            .is_ok(),
        (IpAddr::V6(s), IpAddr::V6(d)) => cache.fill_v6(s, d, sport, dst.port(), pkt).is_ok(),
        _ => false,
    }
}

/// The engine's packet sink for one call on one QP.
#[derive(Debug)]
pub struct Sink<'a> {
    tx: &'a mut Tx,
    shared: &'a SendSockets,
    ports: &'a [Port],
    roce_port: u16,
    stats: &'a mut DeviceStats,
    ctx: TxCtx,
}

impl Sink<'_> {
    /// Where `dest` goes: (local port index, socket address).
    fn route(&mut self, dest: &PacketDest) -> Option<(usize, SocketAddr)> {
        let port = usize::from(dest.av.sgid_index);
        let Some(local) = self.ports.get(port) else {
            self.stats.tx_bad_sgid += 1;
            return None;
        };
        let dip = dest.av.dgid.to_ip();
        if !same_family(local.ip, dip) {
            self.stats.tx_bad_sgid += 1;
            return None;
        }
        let dst = match dip {
            IpAddr::V4(v4) => SocketAddr::from((v4, self.roce_port)),
            IpAddr::V6(v6) => {
                let scope = if local.scope_id != 0 && (v6.segments()[0] & 0xffc0) == 0xfe80 {
                    local.scope_id
                } else {
                    0
                };
                SocketAddr::V6(SocketAddrV6::new(v6, self.roce_port, 0, scope))
            }
        };
        Some((port, dst))
    }
}

impl Sink<'_> {
    /// Resolve `dest` (whose fields `key` holds): the local port and peer
    /// address, the UDP source port, the socket. `None` (counted) when it
    /// cannot be sent to.
    fn resolve(&mut self, key: RouteKey, dest: &PacketDest) -> Option<Route> {
        let (port, dst) = self.route(dest)?;
        let sport = match (key.udp_sport, self.ctx.qp_type) {
            (Some(p), _) => p,
            (None, QpType::Ud) => qp_udp_sport(self.ctx.qpn),
            (None, _) => rc_udp_sport(self.ctx.qpn, dest.qpn),
        };
        let tos = (key.traffic_class, key.hop_limit);
        let Some(sock) = self
            .tx
            .sock_for(self.shared, self.ports, port, sport, tos, self.stats)
        else {
            self.stats.tx_errors += 1;
            return None;
        };
        let sport = self.tx.socks.get(sock).map_or(0, |s| s.port);
        let Some(src) = self.ports.get(port).map(|p| p.ip) else {
            self.stats.tx_errors += 1;
            return None;
        };
        Some(Route {
            key,
            dst,
            sock,
            src,
            sport,
        })
    }

    /// ACK bundling (see the module docs): when the request just written
    /// at `start` follows a lone queued plain ACK to `dst` from `sock`, put
    /// the request in the ACK's place and the ACK behind it, as one GSO
    /// group. Returns whether it did (the packet is then queued).
    fn bundle_behind_ack(
        &mut self,
        start: usize,
        len: usize,
        sock: usize,
        dst: SocketAddr,
        dqpn: u32,
    ) -> bool {
        let tx = &mut *self.tx;
        let (Some(ack), Some(g)) = (tx.last_ack, tx.groups.last()) else {
            return false;
        };
        let fits = tx.gso
            && g.segs == 1
            && g.pkts.is_none()
            && g.off == ack.off
            && ack.off + ACK_LEN == start
            && ack.sock == sock
            && ack.dst == dst
            && ack.qpn == dqpn.to_be_bytes()[1..]
            && (ACK_LEN..=GSO_MAX_BYTES - ACK_LEN).contains(&len)
            && tx.arena.get(start..start + len).is_some_and(rc_request);
        if !fits {
            return false;
        }
        let mut ack_bytes = [0u8; ACK_LEN];
        ack_bytes.copy_from_slice(&tx.arena[ack.off..start]);
        tx.arena.copy_within(start..start + len, ack.off);
        let ack_at = ack.off + len;
        tx.arena[ack_at..ack_at + ACK_LEN].copy_from_slice(&ack_bytes);
        if let Some(g) = tx.groups.last_mut() {
            g.len = len + ACK_LEN;
            g.arena_len = len + ACK_LEN;
            g.segs = 2;
            g.seg_len = len;
            g.open = len == ACK_LEN;
        }
        tx.last_ack = Some(LastAck { off: ack_at, ..ack });
        tx.only_acks = false;
        tx.used += len;
        tx.wire += len;
        self.stats.tx_packets += 1;
        self.stats.tx_bytes += len as u64;
        self.stats.acks_bundled += 1;
        true
    }
}

impl Sink<'_> {
    /// The route of `dest` (cached per QP; resolved on a change).
    #[inline(always)]
    fn route_of(&mut self, dest: &PacketDest) -> Option<Route> {
        let key = RouteKey {
            dgid: dest.av.dgid,
            sgid_index: dest.av.sgid_index,
            traffic_class: dest.av.traffic_class,
            hop_limit: dest.av.hop_limit,
            udp_sport: dest.av.udp_sport,
            dqpn: dest.qpn.get(),
        };
        match self.tx.route {
            Some(r) if r.key == key => Some(r),
            _ => {
                let r = self.resolve(key, dest)?;
                self.tx.route = Some(r);
                Some(r)
            }
        }
    }

    /// Queue a packet of `len` wire bytes whose arena part (`arena_len`
    /// bytes) starts at the arena's `used` mark: it joins the open group it
    /// continues, else starts one. `pkt` is its entry when its payload is in
    /// place (the group then lists every packet); a packet joining a group
    /// of the other kind converts the group to listing packets.
    #[inline(always)]
    fn queue(&mut self, route: &Route, len: usize, arena_len: usize, pkt: Option<Pkt>) {
        let start = self.tx.used;
        let dqpn = route.key.dqpn;
        let tx = &mut *self.tx;
        let join = match tx.groups.last() {
            Some(g) => {
                tx.gso
                    && g.open
                    && g.sock == route.sock
                    && g.dst == route.dst
                    && g.dqpn == dqpn
                    && len <= g.seg_len
                    && g.segs < GSO_MAX_SEGS
                    && g.len + len <= GSO_MAX_BYTES
                    && g.off + g.arena_len == start
            }
            None => false,
        };
        tx.used += arena_len;
        tx.wire += len;
        self.stats.tx_packets += 1;
        self.stats.tx_bytes += len as u64;
        if join {
            let (pkts, groups) = (&mut tx.pkts, &mut tx.groups);
            let Some(g) = groups.last_mut() else { return };
            if pkt.is_some() && g.pkts.is_none() {
                // Its packets so far, all in the arena, one entry each.
                g.pkts = Some(pkts.len());
                for k in 0..g.segs {
                    pkts.push(Pkt {
                        off: g.off + k * g.seg_len,
                        head: g.seg_len,
                        tail: 0,
                        first: 0,
                        pieces: 0,
                    });
                }
            }
            if g.pkts.is_some() {
                pkts.push(pkt.unwrap_or(Pkt {
                    off: start,
                    head: len,
                    tail: 0,
                    first: 0,
                    pieces: 0,
                }));
            }
            g.len += len;
            g.arena_len += arena_len;
            g.segs += 1;
            g.open = len == g.seg_len;
        } else {
            let pkts = pkt.map(|p| {
                tx.pkts.push(p);
                tx.pkts.len() - 1
            });
            tx.groups.push(Group {
                sock: route.sock,
                src: route.src,
                sport: route.sport,
                dqpn,
                dst: route.dst,
                off: start,
                arena_len,
                len,
                segs: 1,
                seg_len: len,
                open: true,
                pkts,
                link: None,
            });
        }
    }
}

impl PacketSink for Sink<'_> {
    fn buffer(&mut self, len: usize) -> Option<&mut [u8]> {
        if len > ARENA {
            return None;
        }
        let tx = &*self.tx;
        if tx.used + len > ARENA
            || tx.wire + len > ARENA
            || tx.groups.len() >= MAX_MSGS
            || tx.holds.len() > MAX_HOLDS - MAX_PIECES
        {
            self.tx.flush(self.shared, self.stats);
        }
        self.tx.reserve(len);
        let start = self.tx.used;
        self.tx.arena.get_mut(start..start + len)
    }

    fn commit(&mut self, len: usize, dest: &PacketDest) {
        let start = self.tx.used;
        let Some(route) = self.route_of(dest) else {
            return;
        };
        let Route { dst, sock, .. } = route;
        if !(MIN_LEN..=GSO_MAX_BYTES).contains(&len) {
            self.stats.tx_errors += 1;
            return;
        }
        let dqpn = route.key.dqpn;
        if self.bundle_behind_ack(start, len, sock, dst, dqpn) {
            return;
        }
        // A plain ACK right behind a queued plain ACK of the same connection
        // for an earlier PSN replaces it in place (ACKs are cumulative): one
        // ACK per connection per flush instead of one per AckReq.
        let ack = self.tx.arena.get(start..start + len).and_then(plain_ack);
        if let (Some((qpn, psn)), Some(prev)) = (ack, self.tx.last_ack) {
            let newer = psn.wrapping_sub(prev.psn) & 0x00ff_ffff;
            if prev.sock == sock
                && prev.dst == dst
                && prev.qpn == qpn
                && prev.off + ACK_LEN == start
                && (1..0x80_0000).contains(&newer)
            {
                self.tx.arena.copy_within(start..start + len, prev.off);
                self.tx.last_ack = Some(LastAck { psn, ..prev });
                self.stats.acks_coalesced += 1;
                return;
            }
        }
        if self.tx.arena.get(start) != Some(&OP_ACKNOWLEDGE) {
            self.tx.only_acks = false;
        }
        self.tx.last_ack = ack.map(|(qpn, psn)| LastAck {
            off: start,
            sock,
            dst,
            qpn,
            psn,
        });
        self.queue(&route, len, len, None);
    }

    fn gather_min(&self) -> usize {
        self.tx.in_place_min
    }

    fn commit_gather(&mut self, head: usize, pieces: &[Piece<'_>], tail: usize, dest: &PacketDest) {
        let start = self.tx.used;
        let Some(route) = self.route_of(dest) else {
            return;
        };
        let payload: usize = pieces.iter().map(|p| p.len).sum();
        let len = head + payload + tail;
        if !(MIN_LEN..=GSO_MAX_BYTES).contains(&len)
            || pieces.is_empty()
            || pieces.len() > MAX_PIECES
            || head < 12
            || tail < 4
        {
            self.stats.tx_errors += 1;
            return;
        }
        // Hold each piece's region until the flush (the queue flushes before
        // it could need more than MAX_HOLDS).
        let tx = &mut *self.tx;
        let first = tx.pieces.len();
        for p in pieces {
            let hold = match tx.holds.iter().rposition(|h| Arc::ptr_eq(h, p.mem)) {
                Some(i) => i,
                None => {
                    tx.holds.push(Arc::clone(p.mem));
                    tx.holds.len() - 1
                }
            };
            tx.pieces.push(HeldPiece {
                hold,
                offset: p.offset,
                len: p.len,
            });
        }
        tx.only_acks = false;
        tx.last_ack = None;
        self.stats.tx_in_place += 1;
        self.stats.tx_in_place_bytes += payload as u64;
        let pkt = Pkt {
            off: start,
            head,
            tail,
            first,
            pieces: pieces.len(),
        };
        self.queue(&route, len, head + tail, Some(pkt));
    }
}

/// The GID a datagram from `src` carries.
pub fn gid_of(src: &SocketAddr) -> Gid {
    Gid::from_ip(src.ip())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ack(syndrome: u8, psn: u32, len: usize) -> Vec<u8> {
        let mut p = vec![0u8; len];
        p[0] = OP_ACKNOWLEDGE;
        p[5..8].copy_from_slice(&[0, 0x12, 0x34]);
        p[9..12].copy_from_slice(&psn.to_be_bytes()[1..]);
        p[12] = syndrome;
        p
    }

    #[test]
    fn only_plain_acks_may_be_replaced() {
        assert_eq!(
            plain_ack(&ack(0x1f, 0xab_cdef, ACK_LEN)),
            Some(([0, 0x12, 0x34], 0xab_cdef))
        );
        // RNR NAK, PSN sequence NAK: never coalesced.
        assert_eq!(plain_ack(&ack(0x20 | 5, 1, ACK_LEN)), None);
        assert_eq!(plain_ack(&ack(0x60, 1, ACK_LEN)), None);
        // ATOMIC ACKNOWLEDGE or anything longer than a plain ACK.
        assert_eq!(plain_ack(&ack(0x1f, 1, ACK_LEN + 8)), None);
        let mut other = ack(0x1f, 1, ACK_LEN);
        other[0] = 0x12;
        assert_eq!(plain_ack(&other), None);
        assert_eq!(plain_ack(&[OP_ACKNOWLEDGE; 4]), None);
    }

    /// The request/response split comes from the wire table: RC SENDs,
    /// WRITEs, READ requests and atomics are requests; READ responses,
    /// ACKNOWLEDGEs, other transports and unknown bytes are not.
    #[test]
    fn rc_requests_by_the_opcode_table() {
        let requests: Vec<u8> = (0..=255u8).filter(|&op| rc_request(&[op])).collect();
        let want: Vec<u8> = (0x00..=0x0c).chain([0x13, 0x14, 0x16, 0x17]).collect();
        assert_eq!(requests, want);
        assert!(!rc_request(&[]));
    }
}
