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
//! **IPv4 identification.** The ICRC covers the IPv4 identification, which
//! the kernel picks. Every socket sets `IP_PMTUDISC_DO` (DF) and stays
//! unconnected; Linux then sends identification 0 for a datagram
//! (`ip_select_ident_segs`), and the segments of a GSO send get 0, 1, 2, …
//! So packet `i` of a group is filled with identification `i`. (The crate's
//! tests capture the packets on the wire and check this.) Since a packet's
//! place in its group is final only when the group leaves (coalescing and
//! bundling move packets), ICRCs are filled at [`Tx::flush`], once per
//! packet.

use std::io;
use std::net::{IpAddr, SocketAddr, SocketAddrV6, UdpSocket};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use rnic_core::{Gid, QpType, Qpn};
use rnic_roce::transport::{PacketDest, PacketSink};
use rnic_roce::wire::roce::MIN_LEN;
use rnic_roce::wire::{Opcode, Transport, icrc};
use rustc_hash::FxHashMap;

use crate::gid::{qp_udp_sport, rc_udp_sport};
use crate::port::Port;
use crate::stats::DeviceStats;
use crate::sys::{self, BATCH, SMALL_BATCH, TxMsg};

/// Arena bytes: room for a full GSO group (64 KiB) several times over.
const ARENA: usize = 512 * 1024;
/// Largest GSO datagram payload (the kernel's limit is 65507 for IPv4).
const GSO_MAX_BYTES: usize = 65_000;
/// Largest GSO segment count (the kernel's `UDP_MAX_SEGMENTS` is 64 or 128).
const GSO_MAX_SEGS: usize = 64;
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
}

impl SendSockets {
    /// No sockets yet.
    pub fn new(gso: bool, per_qp_sport: bool) -> SendSockets {
        SendSockets {
            socks: Mutex::new(FxHashMap::default()),
            gso: AtomicBool::new(gso),
            per_qp_sport,
        }
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
        let s = Arc::new(SendSock { sock, port: local });
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
    msg: TxMsg,
    segs: usize,
    seg_len: usize,
    /// Another equal-sized packet may still join.
    open: bool,
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
    /// a transmit error.
    fn fill_icrcs(&mut self, stats: &mut DeviceStats) {
        for g in &self.groups {
            let mut off = g.msg.off;
            let end = g.msg.off + g.msg.len;
            let mut k = 0u16;
            while off < end {
                let len = g.seg_len.min(end - off);
                let filled = self
                    .arena
                    .get_mut(off..off + len)
                    .is_some_and(|pkt| fill_icrc(g.src, g.msg.dst, g.sport, k, pkt));
                if !filled {
                    stats.tx_errors += 1;
                }
                off += len;
                k = k.wrapping_add(1);
            }
        }
    }

    /// Send everything queued. Errors are counted, never returned: a lost
    /// packet is the transport's to retransmit.
    pub fn flush(&mut self, shared: &SendSockets, stats: &mut DeviceStats) {
        if self.groups.is_empty() {
            return;
        }
        self.fill_icrcs(stats);
        let mut at = 0;
        while at < self.groups.len() {
            // A run of groups from the same socket goes in one sendmmsg.
            let sock = self.groups[at].sock;
            let mut end = at;
            while end < self.groups.len() && end - at < BATCH && self.groups[end].sock == sock {
                end += 1;
            }
            let Some(s) = self.socks.get(sock) else {
                at = end;
                continue;
            };
            stats.sendmmsg_calls += 1;
            let run = &self.groups[at..end];
            let sent = if run.len() <= SMALL_BATCH {
                send_run::<SMALL_BATCH>(s, &self.arena, run)
            } else {
                send_run::<BATCH>(s, &self.arena, run)
            };
            match sent {
                Ok(0) => {
                    stats.tx_errors += 1;
                    at += 1;
                }
                Ok(n) => {
                    for g in &self.groups[at..at + n] {
                        stats.tx_datagrams += 1;
                        if g.segs > 1 {
                            stats.gso_sends += 1;
                            stats.gso_segments += g.segs as u64;
                        }
                    }
                    at += n;
                }
                Err(e) => {
                    let g = self.groups[at];
                    if g.segs > 1 && gso_unsupported(&e) {
                        // The kernel refused GSO: turn it off and send this
                        // group's packets one by one (identification 0 each).
                        self.gso = false;
                        shared.gso.store(false, Ordering::Relaxed);
                        stats.gso_fallbacks += 1;
                        self.split_group(at);
                        continue;
                    }
                    tracing::debug!(error = %e, dst = %g.msg.dst, "send failed");
                    stats.tx_errors += 1;
                    if e.raw_os_error() == Some(libc::EMSGSIZE) {
                        stats.tx_too_big += 1;
                    }
                    at += 1;
                }
            }
        }
        self.groups.clear();
        self.used = 0;
        self.only_acks = true;
        self.last_ack = None;
    }

    /// Replace the GSO group at `i` by its single packets, re-filling their
    /// ICRCs for identification 0.
    fn split_group(&mut self, i: usize) {
        let g = self.groups[i];
        let mut singles = Vec::with_capacity(g.segs);
        let mut off = g.msg.off;
        let end = g.msg.off + g.msg.len;
        while off < end {
            let len = g.seg_len.min(end - off);
            if let Some(pkt) = self.arena.get_mut(off..off + len) {
                fill_icrc(g.src, g.msg.dst, g.sport, 0, pkt);
            }
            singles.push(Group {
                msg: TxMsg {
                    off,
                    len,
                    dst: g.msg.dst,
                    gso: 0,
                },
                segs: 1,
                seg_len: len,
                open: false,
                ..g
            });
            off += len;
        }
        self.groups.splice(i..=i, singles);
    }
}

/// Send `run` (at most `N` groups) with one `sendmmsg`; the message array
/// is sized for the run, not for [`BATCH`] (a ping-pong sends one).
fn send_run<const N: usize>(s: &SendSock, arena: &[u8], run: &[Group]) -> io::Result<usize> {
    let mut msgs = [TxMsg {
        off: 0,
        len: 0,
        dst: SocketAddr::from(([0, 0, 0, 0], 0)),
        gso: 0,
    }; N];
    for (m, g) in msgs.iter_mut().zip(run) {
        *m = g.msg;
    }
    sys::send_batch(s.sock.as_fd(), arena, &msgs[..run.len().min(N)])
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
/// IPv4 identification `ip_id` (DF set).
fn fill_icrc(src: IpAddr, dst: SocketAddr, sport: u16, ip_id: u16, pkt: &mut [u8]) -> bool {
    match (src, dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            icrc::fill_v4(s, d, ip_id, true, sport, dst.port(), pkt).is_ok()
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => icrc::fill_v6(s, d, sport, dst.port(), pkt).is_ok(),
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
            && g.msg.off == ack.off
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
            g.msg.len = len + ACK_LEN;
            g.msg.gso = len as u16;
            g.segs = 2;
            g.seg_len = len;
            g.open = len == ACK_LEN;
        }
        tx.last_ack = Some(LastAck { off: ack_at, ..ack });
        tx.only_acks = false;
        tx.used += len;
        self.stats.tx_packets += 1;
        self.stats.tx_bytes += len as u64;
        self.stats.acks_bundled += 1;
        true
    }
}

impl PacketSink for Sink<'_> {
    fn buffer(&mut self, len: usize) -> Option<&mut [u8]> {
        if len > ARENA {
            return None;
        }
        if self.tx.used + len > ARENA || self.tx.groups.len() >= MAX_MSGS {
            self.tx.flush(self.shared, self.stats);
        }
        self.tx.reserve(len);
        let start = self.tx.used;
        self.tx.arena.get_mut(start..start + len)
    }

    fn commit(&mut self, len: usize, dest: &PacketDest) {
        let start = self.tx.used;
        let key = RouteKey {
            dgid: dest.av.dgid,
            sgid_index: dest.av.sgid_index,
            traffic_class: dest.av.traffic_class,
            hop_limit: dest.av.hop_limit,
            udp_sport: dest.av.udp_sport,
            dqpn: dest.qpn.get(),
        };
        let route = match self.tx.route {
            Some(r) if r.key == key => r,
            _ => {
                let Some(r) = self.resolve(key, dest) else {
                    return;
                };
                self.tx.route = Some(r);
                r
            }
        };
        let Route {
            dst,
            sock,
            src,
            sport,
            ..
        } = route;
        if !(MIN_LEN..=GSO_MAX_BYTES).contains(&len) {
            self.stats.tx_errors += 1;
            return;
        }
        let dqpn = key.dqpn;
        if self.bundle_behind_ack(start, len, sock, dst, dqpn) {
            return;
        }
        // Join the open group when the packet continues it.
        let gso = self.tx.gso;
        let join = match self.tx.groups.last() {
            Some(g) => {
                gso && g.open
                    && g.sock == sock
                    && g.msg.dst == dst
                    && g.dqpn == dqpn
                    && len <= g.seg_len
                    && g.segs < GSO_MAX_SEGS
                    && g.msg.len + len <= GSO_MAX_BYTES
                    && g.msg.off + g.msg.len == start
            }
            None => false,
        };
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
        self.tx.used += len;
        self.stats.tx_packets += 1;
        self.stats.tx_bytes += len as u64;
        if join {
            if let Some(g) = self.tx.groups.last_mut() {
                g.msg.len += len;
                g.segs += 1;
                g.msg.gso = g.seg_len as u16;
                g.open = len == g.seg_len;
            }
        } else {
            self.tx.groups.push(Group {
                sock,
                src,
                sport,
                dqpn,
                msg: TxMsg {
                    off: start,
                    len,
                    dst,
                    gso: 0,
                },
                segs: 1,
                seg_len: len,
                open: true,
            });
        }
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
