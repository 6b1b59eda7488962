//! The Ethernet port as the emulator runs it: the GID table (SET/QUERY_ROCE_ADDRESS,
//! mlx5.md §5.4) and, per RoCE v2 address in it, a UDP/4791 socket with a receive thread —
//! that is how the function gets its RoCE address, as on hardware where the driver programs
//! the GIDs. Outgoing packets leave from per-source-port sockets with DF set (IPv4
//! identification 0) and the ICRC filled.
//!
//! Incoming ICRCs are checked in all 32 bits by rnic-roce's [`rnic_roce::ident`], the code
//! rnic-rxe runs: IPv4 identifications are predicted (0, the sender's previous + 1), and
//! where that misses (kernel rxe numbers its packets from a counter a UDP socket never
//! sees) they are read from the address's **identification tap**, a raw IPPROTO_UDP socket
//! with the shared BPF program (needs CAP_NET_RAW; without it such packets are unverifiable
//! and dropped). The receive thread checks before it takes the HCA lock; each address's
//! counts are logged in rnic's `icrc: …` line when it is unbound and summed by
//! [`Hca::icrc_counts`].

use std::collections::BTreeMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use rnic_core::Gid;
use rnic_roce::ident::{self, IcrcCheck, IcrcCounts, IdentCtx, LastIdent, TapSource, TapTable};
use rnic_roce::transport::{PacketDest, PacketSink};
use rnic_roce::wire::icrc;

use super::{Hca, HcaStats, lock};

/// The RoCE v2 UDP port.
pub const ROCE_PORT: u16 = 4791;
/// GID table entries (cap `gid_table_size`, `roce_address_table_size`).
pub const GID_TABLE: usize = 256;

/// One GID table entry as set by SET_ROCE_ADDRESS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GidEntry {
    pub(crate) gid: Gid,
    pub(crate) ip: IpAddr,
    /// The raw `roce_addr_layout` (32 bytes) for QUERY_ROCE_ADDRESS.
    pub(crate) raw: [u8; 32],
}

/// The address a GID names: IPv4 for `::ffff:a.b.c.d`, IPv6 otherwise.
pub(crate) fn gid_ip(g: &Gid) -> IpAddr {
    let b = g.0;
    if b[..10].iter().all(|&x| x == 0) && b[10] == 0xff && b[11] == 0xff {
        IpAddr::V4(Ipv4Addr::new(b[12], b[13], b[14], b[15]))
    } else {
        IpAddr::V6(Ipv6Addr::from(b))
    }
}

/// The GID of an address.
pub(crate) fn ip_gid(ip: IpAddr) -> Gid {
    match ip {
        IpAddr::V4(v4) => Gid::from_ipv4(v4),
        IpAddr::V6(v6) => Gid(v6.octets()),
    }
}

/// One bound address.
#[derive(Debug)]
pub(crate) struct Port {
    rx: Arc<UdpSocket>,
    stop: Arc<AtomicBool>,
    /// GID entries naming this address.
    refs: usize,
    /// Send sockets by UDP source port.
    senders: BTreeMap<u16, UdpSocket>,
    /// The receive thread's ICRC outcomes.
    icrc: Arc<Mutex<IcrcCounts>>,
    /// The MTU of the host interface carrying the address (the wire).
    if_mtu: u32,
}

/// The MTU of the host interface that has `ip`, read from
/// `/sys/class/net/<name>/mtu`; `None` when no interface has it or the
/// value cannot be read.
pub(crate) fn interface_mtu(ip: IpAddr) -> Option<u32> {
    let name = nix::ifaddrs::getifaddrs().ok()?.find_map(|ifa| {
        let a = ifa.address?;
        let found = match ip {
            IpAddr::V4(v4) => a.as_sockaddr_in().map(|s| s.ip() == v4),
            IpAddr::V6(v6) => a.as_sockaddr_in6().map(|s| s.ip() == v6),
        };
        found.unwrap_or(false).then_some(ifa.interface_name)
    })?;
    std::fs::read_to_string(format!("/sys/class/net/{name}/mtu"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

impl Drop for Port {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake the receive thread (a UDP socket shut down for reading returns 0 at once);
        // it exits without taking the HCA lock, which the dropper may hold.
        let _ = nix::sys::socket::shutdown(
            std::os::fd::AsRawFd::as_raw_fd(&*self.rx),
            nix::sys::socket::Shutdown::Read,
        );
    }
}

/// The bound addresses.
#[derive(Debug, Default)]
pub(crate) struct Ports {
    pub(crate) by_ip: BTreeMap<IpAddr, Port>,
    /// ICRC outcomes of addresses already unbound.
    released: IcrcCounts,
}

fn add_counts(a: &mut IcrcCounts, b: &IcrcCounts) {
    a.ok += b.ok;
    a.ident_zero += b.ident_zero;
    a.gro_index += b.gro_index;
    a.next += b.next;
    a.tapped += b.tapped;
    a.recovered += b.recovered;
    a.unverified += b.unverified;
    a.bad += b.bad;
}

impl Hca {
    /// ICRC outcomes of every received datagram since power-on (all addresses, bound or
    /// not): rnic's `icrc: …` line is its `Display`.
    pub fn icrc_counts(&self) -> IcrcCounts {
        let mut sum = self.ports.released;
        for p in self.ports.by_ip.values() {
            add_counts(&mut sum, &lock(&p.icrc));
        }
        sum
    }
}

/// A raw IPv4 socket that sees a copy of every UDP packet to `ip`:`ROCE_PORT` whose
/// identification is not 0, cut to its headers ([`ident::tap_filter`]), non-blocking. Raw
/// delivery precedes UDP delivery in the kernel, so a datagram's copy is queued here before
/// the datagram is readable on the UDP socket. Needs CAP_NET_RAW (`EPERM` otherwise).
pub(crate) fn ident_tap(ip: Ipv4Addr) -> io::Result<OwnedFd> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockProtocol, SockType, SockaddrIn};
    let fd = nix::sys::socket::socket(
        AddressFamily::Inet,
        SockType::Raw,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        SockProtocol::Udp,
    )?;
    let filter = ident::tap_filter(ROCE_PORT).map(|i| libc::sock_filter {
        code: i.code,
        jt: i.jt,
        jf: i.jf,
        k: i.k,
    });
    let prog = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_ptr().cast_mut(),
    };
    // SAFETY: `fd` is a live socket we own; `prog` points at `filter`, both on this stack
    // frame for the duration of the call, with the size we pass; the kernel copies the
    // program and keeps no pointer into it.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_FILTER,
            (&raw const prog).cast(),
            size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    nix::sys::socket::bind(fd.as_raw_fd(), &SockaddrIn::from(SocketAddrV4::new(ip, 0)))?;
    let _ = nix::sys::socket::setsockopt(&fd, nix::sys::socket::sockopt::RcvBuf, &(1 << 20));
    Ok(fd)
}

/// A tap socket as the shared check reads it.
struct FdTap<'a>(&'a OwnedFd);

impl TapSource for FdTap<'_> {
    fn recv(&mut self, buf: &mut [u8]) -> Option<usize> {
        use nix::sys::socket::MsgFlags;
        nix::sys::socket::recv(
            self.0.as_raw_fd(),
            buf,
            MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_TRUNC,
        )
        .ok()
        .map(|n| n.min(buf.len()))
    }
}

/// One address's receive-side ICRC state: its tap (IPv4 with CAP_NET_RAW), the tapped
/// headers not yet claimed, the last sender's identification, the counts.
pub(crate) struct RxIdent {
    local: IpAddr,
    tap: Option<OwnedFd>,
    table: TapTable,
    last: LastIdent,
    /// The CRC over received packets' constant prefixes, per shape.
    icrc: icrc::IcrcCache,
    counts: Arc<Mutex<IcrcCounts>>,
}

impl RxIdent {
    /// The state of `local`, with its tap when one can be opened (the reason is logged
    /// when not).
    pub(crate) fn new(local: IpAddr, counts: Arc<Mutex<IcrcCounts>>) -> RxIdent {
        let tap = match local {
            IpAddr::V4(v4) => match ident_tap(v4) {
                Ok(fd) => Some(fd),
                Err(e) => {
                    tracing::warn!(
                        %local, %e,
                        "no IPv4 identification tap (needs CAP_NET_RAW): packets whose \
                         identification is neither 0 nor the sender's previous + 1 (kernel \
                         rxe's first, and any after a loss) cannot be checked and are dropped"
                    );
                    None
                }
            },
            IpAddr::V6(_) => None,
        };
        RxIdent {
            local,
            tap,
            table: TapTable::default(),
            last: None,
            icrc: icrc::IcrcCache::new(),
            counts,
        }
    }

    /// The state of `local` without a tap: identification 0 or the sender's previous + 1
    /// only.
    #[cfg(test)]
    fn untapped(local: IpAddr) -> RxIdent {
        RxIdent {
            local,
            tap: None,
            table: TapTable::default(),
            last: None,
            icrc: icrc::IcrcCache::new(),
            counts: Arc::default(),
        }
    }

    /// Whether this address has a tap.
    pub(crate) fn tapped(&self) -> bool {
        self.tap.is_some()
    }

    /// Check `pkt` (BTH‥ICRC, one datagram: no GRO) from `from`, and count the outcome.
    pub(crate) fn check(&mut self, from: SocketAddr, pkt: &[u8]) -> IcrcCheck {
        let mut fd_tap;
        let tap = match &self.tap {
            Some(fd) => {
                fd_tap = FdTap(fd);
                Some((&mut fd_tap as &mut dyn TapSource, &mut self.table))
            }
            None => None,
        };
        let mut cx = IdentCtx {
            last: &mut self.last,
            tap,
            recovery: false,
            icrc: &mut self.icrc,
        };
        let first_bth = pkt.get(..12).unwrap_or(&[]);
        let c = ident::check_icrc(self.local, ROCE_PORT, &from, 0, first_bth, pkt, &mut cx);
        lock(&self.counts).count(c);
        c
    }
}

/// Socket buffer asked for (see `sys::set_socket_buffers`), as rnic-rxe does.
const SOCKET_BUFFER: usize = 16 << 20;

fn bind_udp(ip: IpAddr, port: u16) -> io::Result<UdpSocket> {
    let s = UdpSocket::bind(SocketAddr::new(ip, port))?;
    crate::sys::set_pmtudisc_do(s.as_fd(), ip.is_ipv6())?;
    crate::sys::set_socket_buffers(s.as_fd(), SOCKET_BUFFER);
    Ok(s)
}

impl Ports {
    /// Take a reference on `ip`, binding UDP/4791 and starting its receive thread on first
    /// use. A socket of a just-dropped port may linger for a moment: binding is retried for
    /// up to 200 ms.
    pub(crate) fn acquire(&mut self, ip: IpAddr, hca: &Weak<Mutex<Hca>>) -> io::Result<()> {
        if let Some(p) = self.by_ip.get_mut(&ip) {
            p.refs += 1;
            return Ok(());
        }
        let mut tries = 0;
        let sock = loop {
            match bind_udp(ip, ROCE_PORT) {
                Ok(s) => break s,
                Err(e) if e.kind() == io::ErrorKind::AddrInUse && tries < 40 => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => return Err(e),
            }
        };
        let rx = Arc::new(sock);
        let stop = Arc::new(AtomicBool::new(false));
        let icrc = Arc::new(Mutex::new(IcrcCounts::default()));
        let rx_ident = RxIdent::new(ip, icrc.clone());
        let tapped = rx_ident.tapped();
        let (r, s, h) = (rx.clone(), stop.clone(), hca.clone());
        std::thread::Builder::new()
            .name(format!("mlx5-emu-rx {ip}"))
            .spawn(move || rx_loop(&h, &r, &s, rx_ident))?;
        let if_mtu = interface_mtu(ip).unwrap_or(u32::MAX);
        tracing::info!(%ip, ident_tap = tapped, if_mtu, "RoCE v2 address bound (UDP/4791)");
        self.by_ip.insert(
            ip,
            Port {
                rx,
                stop,
                refs: 1,
                senders: BTreeMap::new(),
                icrc,
                if_mtu,
            },
        );
        Ok(())
    }

    /// The smallest MTU of the host interfaces carrying the bound
    /// addresses (`u32::MAX` with none bound): the emulated port's wire.
    pub(crate) fn wire_mtu(&self) -> u32 {
        self.by_ip
            .values()
            .map(|p| p.if_mtu)
            .min()
            .unwrap_or(u32::MAX)
    }

    /// Drop a reference on `ip` (unbinding on the last).
    pub(crate) fn release(&mut self, ip: IpAddr) {
        if let Some(p) = self.by_ip.get_mut(&ip) {
            p.refs -= 1;
            if p.refs == 0 {
                let counts = *lock(&p.icrc);
                add_counts(&mut self.released, &counts);
                self.by_ip.remove(&ip);
                // The counts last: the line ends with rnic's icrc line.
                tracing::info!("RoCE v2 address {ip} unbound; {counts}");
            }
        }
    }

    /// The socket to send from `ip`:`sport` (bound on first use); the 4791 socket when that
    /// port cannot be bound (counted).
    fn sender(
        &mut self,
        ip: IpAddr,
        sport: u16,
        stats: &mut HcaStats,
    ) -> Option<(&UdpSocket, u16)> {
        let p = self.by_ip.get_mut(&ip)?;
        if sport == ROCE_PORT {
            return Some((&*p.rx, ROCE_PORT));
        }
        if let std::collections::btree_map::Entry::Vacant(v) = p.senders.entry(sport) {
            match bind_udp(ip, sport) {
                Ok(s) => {
                    v.insert(s);
                }
                Err(e) => {
                    stats.sport_fallbacks += 1;
                    tracing::debug!(%ip, sport, %e, "source port not bindable: sending from 4791");
                    return Some((&*p.rx, ROCE_PORT));
                }
            }
        }
        p.senders.get(&sport).map(|s| (s, sport))
    }
}

/// The receive thread of one address: blocks on the socket up to the next engine deadline
/// (at most 50 ms), checks each datagram's ICRC (without the HCA lock) and hands it to the
/// HCA with the verdict, runs due timers on timeouts. It holds only a weak reference, so
/// the HCA's end ends it.
fn rx_loop(hca: &Weak<Mutex<Hca>>, sock: &UdpSocket, stop: &AtomicBool, mut ident: RxIdent) {
    let local = ident.local;
    let mut buf = vec![0u8; 65536];
    loop {
        if stop.load(Ordering::Acquire) {
            return;
        }
        let timeout = match hca.upgrade() {
            Some(h) => lock(&h).poll_timeout(),
            None => return,
        };
        let _ = sock.set_read_timeout(Some(timeout));
        let got = sock.recv_from(&mut buf);
        if stop.load(Ordering::Acquire) {
            return;
        }
        // The ICRC check (all 32 bits with the tap) runs before the HCA lock is taken.
        let icrc_ok = match &got {
            Ok((n, from)) => matches!(
                ident.check(*from, buf.get(..*n).unwrap_or(&[])),
                IcrcCheck::Ok(_) | IcrcCheck::Tapped | IcrcCheck::Recovered
            ),
            Err(_) => false,
        };
        let Some(h) = hca.upgrade() else { return };
        let mut h = lock(&h);
        match got {
            Ok((n, from)) => {
                h.count_udp_rx(local, n);
                h.on_packet(local, from, buf.get(..n).unwrap_or(&[]), icrc_ok);
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                h.on_timers();
            }
            Err(e) => {
                // ICMP errors (ECONNREFUSED …) of earlier sends: nothing to receive.
                h.stats.rx_errors += 1;
                tracing::trace!(%e, "RoCE socket receive error");
                h.on_timers();
            }
        }
    }
}

/// What the sink needs to send on an Ethernet wire: the port, the loopback queue of frames
/// for the function itself, a frame buffer.
pub(crate) struct EthTx<'a> {
    pub(crate) port: &'a crate::eth::EthPort,
    pub(crate) loopback: &'a mut std::collections::VecDeque<(Vec<u8>, Option<u32>)>,
    pub(crate) frame: &'a mut Vec<u8>,
}

/// The engine's packet sink: one preallocated buffer, sent on commit from the address of the
/// packet's source GID index — as a UDP datagram of the host (the udp wire), or as a whole
/// Ethernet frame from the function's MAC to the address vector's `rmac` (an Ethernet wire).
pub(crate) struct Sink<'a> {
    pub(crate) buf: &'a mut Vec<u8>,
    pub(crate) ports: &'a mut Ports,
    pub(crate) gids: &'a [Option<GidEntry>],
    pub(crate) stats: &'a mut HcaStats,
    /// UDP source port when the address vector leaves it open.
    pub(crate) default_sport: u16,
    /// The function stopped (fatal syndrome, NIC interface down): nothing leaves.
    pub(crate) halted: bool,
    /// The port's link: nothing leaves while it is down.
    pub(crate) link_up: bool,
    /// The port's counters.
    pub(crate) counters: &'a crate::eth::PortCounters,
    /// The Ethernet port, on an Ethernet wire.
    pub(crate) eth: Option<EthTx<'a>>,
}

/// Bytes a RoCE datagram of `len` UDP payload bytes from `ip` takes as an Ethernet frame.
pub(crate) fn frame_len(ip: IpAddr, len: usize) -> u64 {
    (14 + if ip.is_ipv4() { 20 } else { 40 } + 8 + len) as u64
}

impl PacketSink for Sink<'_> {
    fn buffer(&mut self, len: usize) -> Option<&mut [u8]> {
        if self.buf.len() < len {
            self.buf.resize(len, 0);
        }
        self.buf.get_mut(..len)
    }

    fn commit(&mut self, len: usize, dest: &PacketDest) {
        if self.halted {
            self.stats.halted_drops += 1;
            return;
        }
        if !self.link_up {
            self.stats.link_down_drops += 1;
            return;
        }
        let Some(src) = self
            .gids
            .get(usize::from(dest.av.sgid_index))
            .copied()
            .flatten()
        else {
            self.stats.tx_dropped += 1;
            return;
        };
        let dst = gid_ip(&dest.av.dgid);
        let sport = match dest.av.udp_sport {
            Some(p) if p != 0 => p,
            _ => self.default_sport,
        };
        if let Some(eth) = &mut self.eth {
            let Some(pkt) = self.buf.get(..len) else {
                self.stats.tx_dropped += 1;
                return;
            };
            let av = &dest.av;
            let built = crate::eth::build_roce_frame(
                eth.frame,
                (eth.port.mac, av.dmac.unwrap_or([0; 6])),
                (src.ip, dst),
                av.traffic_class,
                av.flow_label,
                av.hop_limit,
                sport,
                pkt,
            );
            if !built {
                self.stats.tx_dropped += 1;
                return;
            }
            match eth.port.transmit(eth.frame, true) {
                crate::eth::Sent::Wire => self.stats.tx_packets += 1,
                crate::eth::Sent::Looped => {
                    self.stats.tx_packets += 1;
                    eth.loopback.push_back((eth.frame.clone(), None));
                }
                _ => self.stats.tx_dropped += 1,
            }
            return;
        }
        let stats = &mut *self.stats;
        let Some((sock, sport)) = self.ports.sender(src.ip, sport, stats) else {
            stats.tx_dropped += 1;
            return;
        };
        let Some(pkt) = self.buf.get_mut(..len) else {
            stats.tx_dropped += 1;
            return;
        };
        let filled = match (src.ip, dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                icrc::fill_v4(s, d, 0, true, sport, ROCE_PORT, pkt).is_ok()
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => icrc::fill_v6(s, d, sport, ROCE_PORT, pkt).is_ok(),
            _ => false,
        };
        if !filled {
            stats.tx_dropped += 1;
            return;
        }
        match sock.send_to(pkt, SocketAddr::new(dst, ROCE_PORT)) {
            Ok(_) => {
                stats.tx_packets += 1;
                let c = self.counters;
                c.tx_frames.fetch_add(1, Ordering::Relaxed);
                c.tx_unicast.fetch_add(1, Ordering::Relaxed);
                c.tx_unicast_octets
                    .fetch_add(frame_len(dst, len), Ordering::Relaxed);
                c.tx_octets
                    .fetch_add(frame_len(dst, len), Ordering::Relaxed);
            }
            Err(e) => {
                stats.tx_dropped += 1;
                tracing::debug!(%e, %dst, "RoCE send failed (the engine retransmits)");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wire_mtu_is_the_interface_mtu_of_the_address() {
        let lo: u32 = std::fs::read_to_string("/sys/class/net/lo/mtu")
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert_eq!(interface_mtu(IpAddr::V4(Ipv4Addr::LOCALHOST)), Some(lo));
        // TEST-NET-3: no interface here has it.
        assert_eq!(
            interface_mtu(IpAddr::V4(Ipv4Addr::new(203, 0, 113, 77))),
            None
        );
        assert_eq!(Ports::default().wire_mtu(), u32::MAX);
    }

    #[test]
    fn gids_and_addresses_round_trip() {
        let v4 = IpAddr::V4(Ipv4Addr::new(127, 9, 8, 7));
        assert_eq!(gid_ip(&ip_gid(v4)), v4);
        assert_eq!(ip_gid(v4).0[10..12], [0xff, 0xff]);
        let v6 = IpAddr::V6("fe80::1".parse().unwrap());
        assert_eq!(gid_ip(&ip_gid(v6)), v6);
        // ::ffff:0:0/96 only; ::1 is IPv6.
        assert!(gid_ip(&Gid(Ipv6Addr::LOCALHOST.octets())).is_ipv6());
    }

    #[test]
    fn icrc_verification_finds_identification_zero_and_refuses_garbage() {
        let (s, d) = (Ipv4Addr::new(127, 1, 1, 1), Ipv4Addr::new(127, 1, 1, 2));
        let mut pkt = vec![0u8; 12 + 8 + 4];
        pkt[0] = 0x04; // SEND ONLY
        icrc::fill_v4(s, d, 0, true, 0xc001, ROCE_PORT, &mut pkt).unwrap();
        let from = SocketAddr::new(IpAddr::V4(s), 0xc001);
        let mut rx = RxIdent::untapped(IpAddr::V4(d));
        rx.last = Some((from, 6));
        assert!(matches!(rx.check(from, &pkt), IcrcCheck::Ok(_)));
        assert_eq!(
            rx.last,
            Some((from, 0)),
            "identification 0 is the last seen"
        );
        rx.last = Some((from, 6));
        icrc::fill_v4(s, d, 7, true, 0xc001, ROCE_PORT, &mut pkt).unwrap();
        assert!(
            matches!(rx.check(from, &pkt), IcrcCheck::Ok(_)),
            "previous + 1"
        );
        assert_eq!(rx.last, Some((from, 7)));
        icrc::fill_v4(s, d, 0x4444, true, 0xc001, ROCE_PORT, &mut pkt).unwrap();
        assert!(
            !matches!(rx.check(from, &pkt), IcrcCheck::Ok(_)),
            "not predictable without a tap"
        );
        icrc::fill_v4(s, d, 0, true, 0xc001, ROCE_PORT, &mut pkt).unwrap();
        let n = pkt.len();
        pkt[n - 1] ^= 1;
        assert!(!matches!(rx.check(from, &pkt), IcrcCheck::Ok(_)));
        let c = *lock(&rx.counts);
        assert_eq!((c.ok, c.ident_zero, c.next), (2, 1, 1), "{c}");
        assert_eq!(c.unverified + c.bad, 2, "{c}");
    }

    /// An IPv4 packet with identification `ident` and DF from `src`:`sport` to
    /// `dst`:4791 carrying `roce`, sent on a raw socket (IP_HDRINCL).
    fn send_raw(src: Ipv4Addr, dst: Ipv4Addr, sport: u16, ident: u16, roce: &[u8]) -> bool {
        use nix::sys::socket::{AddressFamily, MsgFlags, SockFlag, SockProtocol, SockType};
        let Ok(fd) = nix::sys::socket::socket(
            AddressFamily::Inet,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC,
            SockProtocol::Raw,
        ) else {
            return false;
        };
        let udp_len = 8 + roce.len();
        let mut p = vec![0x45, 0];
        p.extend_from_slice(&((20 + udp_len) as u16).to_be_bytes());
        p.extend_from_slice(&ident.to_be_bytes());
        p.extend_from_slice(&[0x40, 0, 64, 17, 0, 0]);
        p.extend_from_slice(&src.octets());
        p.extend_from_slice(&dst.octets());
        p.extend_from_slice(&sport.to_be_bytes());
        p.extend_from_slice(&ROCE_PORT.to_be_bytes());
        p.extend_from_slice(&(udp_len as u16).to_be_bytes());
        p.extend_from_slice(&[0, 0]);
        p.extend_from_slice(roce);
        let to = nix::sys::socket::SockaddrIn::from(SocketAddrV4::new(dst, 0));
        nix::sys::socket::sendto(fd.as_raw_fd(), &p, &to, MsgFlags::empty()).is_ok()
    }

    /// Kernel-rxe-like traffic (identifications from a counter, not 0) on a real socket:
    /// the tap's copy verifies the first packet in all 32 bits, the next verifies as
    /// previous + 1, a packet whose ICRC holds for another identification is refused, and
    /// the counts print as rnic's icrc line. Needs CAP_NET_RAW (SKIP otherwise).
    #[test]
    fn the_tap_verifies_counted_identifications_in_all_32_bits() {
        let (s, d) = (Ipv4Addr::new(127, 0, 77, 2), Ipv4Addr::new(127, 0, 77, 1));
        let counts = Arc::new(Mutex::new(IcrcCounts::default()));
        let mut rx = RxIdent::new(IpAddr::V4(d), counts.clone());
        if !rx.tapped() {
            println!("SKIP: no CAP_NET_RAW for the identification tap");
            return;
        }
        let sock = bind_udp(IpAddr::V4(d), ROCE_PORT).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let packet = |ident: u16, icrc_ident: u16| {
            let mut p = vec![0u8; 12 + 8 + 4];
            p[0] = 0x04; // RC SEND ONLY
            p[5..8].copy_from_slice(&[0, 0, 0x11]);
            p[12..20].copy_from_slice(&ident.to_be_bytes().repeat(4));
            icrc::fill_v4(s, d, icrc_ident, true, 0xc0de, ROCE_PORT, &mut p).unwrap();
            p
        };
        let mut buf = [0u8; 256];
        let mut deliver = |ident, icrc_ident| {
            if !send_raw(s, d, 0xc0de, ident, &packet(ident, icrc_ident)) {
                return None;
            }
            let (n, from) = sock.recv_from(&mut buf).unwrap();
            assert_eq!(from, SocketAddr::new(IpAddr::V4(s), 0xc0de));
            Some(rx.check(from, &buf[..n]))
        };
        let Some(first) = deliver(0x7e12, 0x7e12) else {
            println!("SKIP: raw IPv4 send refused");
            return;
        };
        assert_eq!(first, IcrcCheck::Tapped);
        assert_eq!(
            deliver(0x7e13, 0x7e13),
            Some(IcrcCheck::Ok(ident::Predicted::Next))
        );
        // A gap (a lost packet): the tap again.
        assert_eq!(deliver(0x7e30, 0x7e30), Some(IcrcCheck::Tapped));
        // Sent as 0x1111, ICRC for 0x2222 (which a 15-bit solve would accept): refused.
        assert_eq!(deliver(0x1111, 0x2222), Some(IcrcCheck::Bad));
        // rnic senders: identification 0 (not tapped), predicted.
        assert_eq!(deliver(0, 0), Some(IcrcCheck::Ok(ident::Predicted::Zero)));
        let c = *lock(&counts);
        assert_eq!(
            (c.ok, c.tapped, c.next, c.ident_zero, c.bad),
            (4, 2, 1, 1, 1)
        );
        assert!(
            c.to_string().starts_with(
                "icrc: 4 ok, all 32 bits (ident 0: 1, GRO index: 0, previous + 1: 1, tapped: 2), 0 recovered (15-bit check), 0 unverifiable (dropped), 1 dropped"
            ),
            "{c}"
        );
    }
}
