//! The Ethernet port as the emulator runs it: the GID table (SET/QUERY_ROCE_ADDRESS,
//! mlx5.md §5.4) and, per RoCE v2 address in it, a UDP/4791 socket with a receive thread —
//! that is how the function gets its RoCE address, as on hardware where the driver programs
//! the GIDs. Outgoing packets leave from per-source-port sockets with DF set (IPv4
//! identification 0) and the ICRC filled.

use std::collections::BTreeMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use rnic_core::Gid;
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
}

fn bind_udp(ip: IpAddr, port: u16) -> io::Result<UdpSocket> {
    let s = UdpSocket::bind(SocketAddr::new(ip, port))?;
    crate::sys::set_pmtudisc_do(s.as_fd(), ip.is_ipv6())?;
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
        let (r, s, h) = (rx.clone(), stop.clone(), hca.clone());
        std::thread::Builder::new()
            .name(format!("mlx5-emu-rx {ip}"))
            .spawn(move || rx_loop(&h, &r, &s, ip))?;
        tracing::info!(%ip, "RoCE v2 address bound (UDP/4791)");
        self.by_ip.insert(
            ip,
            Port {
                rx,
                stop,
                refs: 1,
                senders: BTreeMap::new(),
            },
        );
        Ok(())
    }

    /// Drop a reference on `ip` (unbinding on the last).
    pub(crate) fn release(&mut self, ip: IpAddr) {
        if let Some(p) = self.by_ip.get_mut(&ip) {
            p.refs -= 1;
            if p.refs == 0 {
                self.by_ip.remove(&ip);
                tracing::info!(%ip, "RoCE v2 address unbound");
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
/// (at most 50 ms), hands each datagram to the HCA, runs due timers on timeouts. It holds
/// only a weak reference, so the HCA's end ends it.
fn rx_loop(hca: &Weak<Mutex<Hca>>, sock: &UdpSocket, stop: &AtomicBool, local: IpAddr) {
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
        let Some(h) = hca.upgrade() else { return };
        let mut h = lock(&h);
        match got {
            Ok((n, from)) => h.on_packet(local, from, buf.get(..n).unwrap_or(&[])),
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

/// Verify the ICRC of `pkt` (BTH‥ICRC) received from `from` at `local`. IPv4: the
/// identification is not visible to a UDP socket, so the likely ones are tried — 0 (DF,
/// unconnected sender), the segment indexes of a GSO send, and the last one seen + 1.
pub(crate) fn verify_icrc(local: IpAddr, from: SocketAddr, pkt: &[u8], last_id: &mut u16) -> bool {
    match (from.ip(), local) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let next = last_id.wrapping_add(1);
            let ids = [0u16, next].into_iter().chain(1..64);
            for id in ids {
                if icrc::verify_v4(s, d, id, true, from.port(), ROCE_PORT, pkt).is_ok() {
                    *last_id = id;
                    return true;
                }
            }
            icrc::verify_v4(s, d, 0, false, from.port(), ROCE_PORT, pkt).is_ok()
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            icrc::verify_v6(s, d, from.port(), ROCE_PORT, pkt).is_ok()
        }
        _ => false,
    }
}

/// The engine's packet sink: one preallocated buffer, sent on commit from the address of the
/// packet's source GID index.
pub(crate) struct Sink<'a> {
    pub(crate) buf: &'a mut Vec<u8>,
    pub(crate) ports: &'a mut Ports,
    pub(crate) gids: &'a [Option<GidEntry>],
    pub(crate) stats: &'a mut HcaStats,
    /// UDP source port when the address vector leaves it open.
    pub(crate) default_sport: u16,
}

impl PacketSink for Sink<'_> {
    fn buffer(&mut self, len: usize) -> Option<&mut [u8]> {
        if self.buf.len() < len {
            self.buf.resize(len, 0);
        }
        self.buf.get_mut(..len)
    }

    fn commit(&mut self, len: usize, dest: &PacketDest) {
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
            Ok(_) => stats.tx_packets += 1,
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
        let mut last = 0;
        assert!(verify_icrc(IpAddr::V4(d), from, &pkt, &mut last));
        icrc::fill_v4(s, d, 7, true, 0xc001, ROCE_PORT, &mut pkt).unwrap();
        assert!(
            verify_icrc(IpAddr::V4(d), from, &pkt, &mut last),
            "a GSO index"
        );
        assert_eq!(last, 7);
        let n = pkt.len();
        pkt[n - 1] ^= 1;
        assert!(!verify_icrc(IpAddr::V4(d), from, &pkt, &mut last));
    }
}
