//! Frame transmit (with the packet ring; `RxeConfig::tx_frames`,
//! `RNIC_RXE_TX_FRAMES=0` turns it off): a datagram or GSO group to an IPv4
//! peer whose link-layer next hop is known leaves as a whole frame — the
//! virtio-net, Ethernet, IPv4 and UDP headers written here — through one
//! `AF_PACKET` socket, skipping the UDP socket's route lookup and IP
//! output. On loopback that is 0.7 µs of a one-way trip (docs/benchmarks.md,
//! "The 8-byte path").
//!
//! **Where the next hop comes from.** The packet ring sees each received
//! datagram's interface, link type, and source and destination MAC
//! addresses (the peer's, or its router's, and ours); once a
//! datagram's ICRC has been verified, its sender's IPv4 address is
//! *observed* there. A hop is used only where a frame reaches the peer's
//! transport whatever receive path the peer runs:
//!
//! * **Ethernet**: the kernel's neighbour table (`/proc/net/arp` of the
//!   device's network namespace) must hold the peer's address with the same
//!   MAC address on the same interface — the peer is on the link, not behind
//!   a router, and the kernel agrees on its address. A routed peer keeps the
//!   UDP socket.
//! * **Loopback**: a frame looped back on `lo` goes through IP input (a
//!   datagram sent through a socket does not), where a local source address
//!   is a martian unless `net.ipv4.conf.{all,lo}.accept_local` is 1, and a
//!   127/8 address unless `route_localnet` is 1. Without them only a packet
//!   ring would see the frame, and a sender cannot know whether its peer
//!   runs one; so frames leave on `lo` only when those sysctls are set.
//!   rnic never sets them (`rnicctl doctor` says what is missing).
//! * Any other link type keeps the UDP socket.
//!
//! A rejected hop is checked again after [`RECHECK_NS`] (the neighbour
//! entry may appear, the sysctls change); a hop whose MAC address or
//! interface changes is checked at once.
//!
//! **What leaves.** The headers are what the UDP socket would have written:
//! DF set, identification 0 (the ICRC covers it; a datagram from the socket
//! carries 0 too), the socket's traffic class and hop limit. A single
//! datagram carries UDP checksum 0 (optional for IPv4; RoCEv2 sends 0). A
//! GSO group (the bundled request and ACK of a ping-pong, the MTU-sized
//! packets of a large message) leaves as one frame whose virtio-net header
//! asks for UDP GSO (`VIRTIO_NET_HDR_GSO_UDP_L4`, checksum offload, which
//! the kernel requires with it): a device that segments gives each segment
//! identification 0, 1, 2, … and its own checksum, exactly as a UDP
//! socket's GSO send; the loopback hands it over whole. A frame the kernel
//! refuses is sent through the UDP socket instead, counted as a fallback
//! (a refused GSO frame turns GSO frames off for the device). Frames and
//! datagrams of one QP leave through one device queue on loopback, in
//! order; on a multi-queue NIC the two paths may pick different transmit
//! queues, and a reorder between them costs RC a retransmission, not
//! correctness.

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::RwLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use rnic_roce::wire::ip::{PROTOCOL_UDP, checksum_add, checksum_fold};
use rnic_roce::wire::{
    self, EtherType, EthernetAddress, EthernetRepr, Ipv4Repr, UdpRepr, ethernet, ip,
};
use rustc_hash::FxHashMap;

use crate::port::NetNs;
use crate::ring::VNET_HDR as VNET;

/// Bytes of the headers a frame starts with: virtio-net (10), Ethernet
/// (14, what loopback uses too), IPv4 (20, no options), UDP (8).
pub const FRAME_HDR: usize = VNET + ETH + IP + UDP;
const ETH: usize = ethernet::HEADER_LEN;
const IP: usize = ip::ipv4::HEADER_LEN;
const UDP: usize = ip::udp::HEADER_LEN;
/// `VIRTIO_NET_HDR_F_NEEDS_CSUM`, `VIRTIO_NET_HDR_GSO_UDP_L4`.
const F_NEEDS_CSUM: u8 = 1;
const GSO_UDP_L4: u8 = 5;
/// How long a rejected hop stays rejected before it is checked again.
pub const RECHECK_NS: u64 = 1_000_000_000;
/// Peers remembered at most (a flood of spoofed sources cannot grow the
/// table; past it, new peers keep the UDP socket).
const MAX_PEERS: usize = 4096;
/// The least time between two judgements (each reads `/proc`): a flood of
/// verified datagrams from ever new sources costs at most 1000 reads a
/// second; a peer whose judgement was put off is judged on a later
/// datagram.
pub const CHECK_SPACING_NS: u64 = 1_000_000;
/// `ATF_COM` (linux/if_arp.h): the neighbour entry is complete.
const ATF_COM: u32 = 0x2;

/// A datagram's link-layer next hop, as the packet ring saw its sender.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hop {
    /// The interface it arrived on.
    pub ifindex: i32,
    /// Its link type (`ARPHRD_*`).
    pub hatype: u16,
    /// The sender's (the last hop's) MAC address.
    pub mac: [u8; 6],
    /// Ours: the address it was sent to.
    pub local: [u8; 6],
}

/// What was decided about one peer.
#[derive(Clone, Copy, Debug)]
struct Seen {
    hop: Hop,
    usable: bool,
    at_ns: u64,
}

/// The frame sender of a device: its `AF_PACKET` socket and the next hops
/// observed so far.
#[derive(Debug)]
pub struct FrameTx {
    sock: OwnedFd,
    seen: RwLock<FxHashMap<Ipv4Addr, Seen>>,
    /// Bumped whenever a peer's usable hop changes, so that a transmit
    /// queue's cached lookup stays valid while it does not.
    generation: AtomicU64,
    /// The namespace the device's sockets live in (the checks read its
    /// sysctls and neighbour table).
    netns: Option<NetNs>,
    /// `net.ipv4.ip_default_ttl`: the hop limit of a socket that set none.
    pub default_ttl: u8,
    /// GSO groups may leave as frames (cleared when the kernel refuses one).
    pub gso: AtomicBool,
    /// When the next judgement may run ([`CHECK_SPACING_NS`]).
    next_check_ns: AtomicU64,
}

impl FrameTx {
    /// Open the frame socket in the calling thread's network namespace
    /// (needs CAP_NET_RAW, as the packet ring does).
    pub fn open() -> io::Result<FrameTx> {
        // Protocol 0: it receives nothing; SOCK_RAW: each message is a
        // whole frame (only raw sockets take virtio-net headers).
        // SAFETY: socket(2) with constant arguments; it returns a new fd or -1.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by socket(2) and is owned by nobody else.
        let sock = unsafe { OwnedFd::from_raw_fd(fd) };
        crate::sys::set_opt(sock.as_fd(), libc::SOL_PACKET, libc::PACKET_VNET_HDR, &1i32)?;
        crate::sys::set_buffers(&sock, 8 << 20);
        let default_ttl = std::fs::read_to_string("/proc/sys/net/ipv4/ip_default_ttl")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(64);
        Ok(FrameTx {
            sock,
            seen: RwLock::new(FxHashMap::default()),
            generation: AtomicU64::new(0),
            netns: NetNs::current().ok(),
            default_ttl,
            gso: AtomicBool::new(true),
            next_check_ns: AtomicU64::new(0),
        })
    }

    /// The socket frames leave through.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }

    /// The generation of the hop table (see [`FrameTx::hop`]).
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The usable next hop to `peer`, if one was observed and accepted.
    pub fn hop(&self, peer: Ipv4Addr) -> Option<Hop> {
        let seen = self.seen.read().unwrap_or_else(|p| p.into_inner());
        seen.get(&peer).filter(|s| s.usable).map(|s| s.hop)
    }

    /// A verified datagram from `peer` to `local` arrived through `hop` at
    /// `now_ns`: decide (again, when it is new, changed, or rejected
    /// [`RECHECK_NS`] ago) whether frames to `peer` may use it.
    pub fn observe(&self, local: Ipv4Addr, peer: Ipv4Addr, hop: Hop, now_ns: u64) {
        {
            let seen = self.seen.read().unwrap_or_else(|p| p.into_inner());
            match seen.get(&peer) {
                Some(s) if s.hop == hop && (s.usable || now_ns < s.at_ns + RECHECK_NS) => return,
                None if seen.len() >= MAX_PEERS => return,
                _ => {}
            }
        }
        let due = self.next_check_ns.load(Ordering::Relaxed);
        if now_ns < due
            || self
                .next_check_ns
                .compare_exchange(
                    due,
                    now_ns + CHECK_SPACING_NS,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_err()
        {
            return;
        }
        let verdict = match &self.netns {
            Some(ns) => ns.run(|| Ok(check(local, peer, &hop))),
            None => Ok(check(local, peer, &hop)),
        }
        .unwrap_or_else(|e| Err(format!("entering the device's network namespace: {e}")));
        match &verdict {
            Ok(()) => {
                tracing::debug!(%peer, ?hop, "frames to this peer leave through the packet socket")
            }
            Err(why) => {
                tracing::debug!(%peer, ?hop, why, "frames to this peer keep the UDP socket")
            }
        }
        let mut seen = self.seen.write().unwrap_or_else(|p| p.into_inner());
        let was = seen.insert(
            peer,
            Seen {
                hop,
                usable: verdict.is_ok(),
                at_ns: now_ns,
            },
        );
        if was.is_none_or(|w| w.usable != verdict.is_ok() || w.hop != hop) {
            self.generation.fetch_add(1, Ordering::Release);
        }
    }

    /// Forget `peer`'s hop (the kernel refused a frame to it): its next
    /// verified datagram is checked afresh.
    pub fn forget(&self, peer: Ipv4Addr) {
        let mut seen = self.seen.write().unwrap_or_else(|p| p.into_inner());
        if seen.remove(&peer).is_some() {
            self.generation.fetch_add(1, Ordering::Release);
        }
    }
}

/// Whether frames from `local` to `peer` through `hop` reach the peer
/// whatever its receive path; `Err`: why not, with the fix where there is
/// one. Reads the calling thread's namespace.
fn check(local: Ipv4Addr, peer: Ipv4Addr, hop: &Hop) -> Result<(), String> {
    let name =
        crate::sys::if_name(hop.ifindex).map_err(|e| format!("interface {}: {e}", hop.ifindex))?;
    match hop.hatype {
        libc::ARPHRD_LOOPBACK => loopback_verdict(
            conf(&name, "accept_local"),
            conf(&name, "route_localnet"),
            local,
            peer,
            &name,
        ),
        libc::ARPHRD_ETHER => {
            let arp = std::fs::read_to_string("/proc/thread-self/net/arp")
                .map_err(|e| format!("reading the neighbour table: {e}"))?;
            if arp_confirms(&arp, peer, hop.mac, &name) {
                Ok(())
            } else {
                Err(format!(
                    "the neighbour table has no complete entry for {peer} with {} on {name} \
                     (a peer behind a router, or not resolved yet)",
                    EthernetAddress(hop.mac)
                ))
            }
        }
        t => Err(format!(
            "link type {t} on {name}: frames only on Ethernet and loopback"
        )),
    }
}

/// Whether IPv4 setting `key` is on for interface `dev` (its own or
/// `all`'s), in the calling thread's namespace.
fn conf(dev: &str, key: &str) -> bool {
    ["all", dev].iter().any(|d| {
        std::fs::read_to_string(format!("/proc/sys/net/ipv4/conf/{d}/{key}"))
            .is_ok_and(|v| v.trim() == "1")
    })
}

/// Whether frames between two 127/8 addresses on `lo` would leave as
/// frames here (the calling thread's namespace); `Err`: why not and the
/// fix. What `rnicctl doctor` reports.
pub fn loopback_sysctls() -> Result<(), String> {
    loopback_verdict(
        conf("lo", "accept_local"),
        conf("lo", "route_localnet"),
        Ipv4Addr::LOCALHOST,
        Ipv4Addr::new(127, 0, 0, 2),
        "lo",
    )
}

/// The loopback rule of the module docs, on the sysctls' values.
pub fn loopback_verdict(
    accept_local: bool,
    route_localnet: bool,
    local: Ipv4Addr,
    peer: Ipv4Addr,
    dev: &str,
) -> Result<(), String> {
    let localnet = local.is_loopback() || peer.is_loopback();
    if accept_local && (route_localnet || !localnet) {
        return Ok(());
    }
    let mut need = Vec::new();
    if !accept_local {
        need.push(format!("net.ipv4.conf.{dev}.accept_local=1"));
    }
    if localnet && !route_localnet {
        need.push(format!("net.ipv4.conf.{dev}.route_localnet=1"));
    }
    Err(format!(
        "a frame looped back on {dev} is a martian to IP input (only a packet ring would see \
         it); sysctl -w {} lets it through to any receiver",
        need.join(" ")
    ))
}

/// Whether `/proc/net/arp`'s text has a complete entry for `peer` with
/// `mac` on interface `dev`.
pub fn arp_confirms(arp: &str, peer: Ipv4Addr, mac: [u8; 6], dev: &str) -> bool {
    let want = EthernetAddress(mac).to_string();
    arp.lines().skip(1).any(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        let flags = f
            .get(2)
            .and_then(|s| u32::from_str_radix(s.trim_start_matches("0x"), 16).ok());
        f.len() >= 6
            && f[0].parse::<Ipv4Addr>() == Ok(peer)
            && flags.is_some_and(|fl| fl & ATF_COM != 0)
            && f[3].eq_ignore_ascii_case(&want)
            && f[5] == dev
    })
}

/// What one frame carries: its addresses, the IP header's traffic class
/// and hop limit, its UDP payload bytes, and the GSO segment size (0: a
/// single datagram).
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    /// Source address and UDP port.
    pub src: (Ipv4Addr, u16),
    /// Destination address and UDP port.
    pub dst: (Ipv4Addr, u16),
    /// IPv4 TOS.
    pub tos: u8,
    /// IPv4 TTL.
    pub ttl: u8,
    /// UDP payload bytes (all segments).
    pub payload: usize,
    /// GSO segment size (UDP payload bytes per segment), 0 for none.
    pub gso: u16,
}

/// The headers of a frame to `hop`: virtio-net (GSO and checksum offload
/// for a GSO frame, nothing for a single datagram), then Ethernet, IPv4 (DF,
/// identification 0, header checksum) and UDP (checksum 0 for a single
/// datagram; the pseudo-header sum the offload completes for a GSO frame),
/// written by rnic-roce's wire representations. `Err`: too long for one
/// IPv4 datagram.
pub fn headers(hop: &Hop, s: &Shape) -> wire::Result<[u8; FRAME_HDR]> {
    let mut h = [0u8; FRAME_HDR];
    let mut udp = UdpRepr {
        src_port: s.src.1,
        dst_port: s.dst.1,
        checksum: 0,
        payload_len: s.payload,
    };
    let ipv4 = Ipv4Repr {
        src_addr: s.src.0,
        dst_addr: s.dst.0,
        tos: s.tos,
        ident: 0,
        dont_frag: true,
        ttl: s.ttl,
        protocol: PROTOCOL_UDP,
        payload_len: udp.buffer_len(),
    };
    if s.gso > 0 {
        // flags, gso_type, hdr_len, gso_size, csum_start, csum_offset
        // (native order: a packet socket's header is the host's).
        h[0] = F_NEEDS_CSUM;
        h[1] = GSO_UDP_L4;
        h[2..4].copy_from_slice(&((ETH + IP + UDP) as u16).to_ne_bytes());
        h[4..6].copy_from_slice(&s.gso.to_ne_bytes());
        h[6..8].copy_from_slice(&((ETH + IP) as u16).to_ne_bytes());
        h[8..10].copy_from_slice(&6u16.to_ne_bytes());
        // The pseudo-header's sum, not complemented: the offload adds the
        // UDP header and payload (per segment, after GSO adjusts it).
        let sum = checksum_add(checksum_add(0, &s.src.0.octets()), &s.dst.0.octets())
            + u32::from(PROTOCOL_UDP)
            + udp.buffer_len() as u32;
        udp.checksum = !checksum_fold(sum);
    }
    EthernetRepr {
        dst_addr: EthernetAddress(hop.mac),
        src_addr: EthernetAddress(hop.local),
        vlan: None,
        ethertype: EtherType::IPV4,
    }
    .emit(&mut h[VNET..])?;
    ipv4.emit(&mut h[VNET + ETH..])?;
    udp.emit(&mut h[VNET + ETH + IP..])?;
    Ok(h)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const HOP: Hop = Hop {
        ifindex: 3,
        hatype: libc::ARPHRD_ETHER,
        mac: [2, 0, 0, 0, 0, 2],
        local: [2, 0, 0, 0, 0, 1],
    };

    fn shape(payload: usize, gso: u16) -> Shape {
        Shape {
            src: (Ipv4Addr::new(10, 0, 0, 1), 49_152),
            dst: (Ipv4Addr::new(10, 0, 0, 2), 4791),
            tos: 0x68,
            ttl: 64,
            payload,
            gso,
        }
    }

    #[test]
    fn a_single_datagram_frame_is_what_a_df_socket_writes() {
        let f = headers(&HOP, &shape(36, 0)).unwrap();
        assert_eq!(&f[..VNET], &[0; VNET], "no offload asked for");
        assert_eq!(&f[VNET..VNET + 6], &HOP.mac);
        assert_eq!(&f[VNET + 6..VNET + 12], &HOP.local);
        assert_eq!(&f[VNET + 12..VNET + 14], &[0x08, 0x00]);
        let h = &f[VNET + ETH..];
        assert_eq!((h[0], h[1]), (0x45, 0x68));
        assert_eq!(u16::from_be_bytes([h[2], h[3]]), 64, "20 + 8 + 36");
        assert_eq!(&h[4..8], &[0, 0, 0x40, 0], "identification 0, DF");
        assert_eq!((h[8], h[9]), (64, 17));
        // A header with its checksum in place checksums to 0.
        assert_eq!(ip::internet_checksum(&h[..20]), 0);
        assert_eq!(&h[20..24], &[0xc0, 0x00, 0x12, 0xb7]);
        assert_eq!(u16::from_be_bytes([h[24], h[25]]), 44);
        assert_eq!(&h[26..28], &[0, 0], "UDP checksum 0");
        // The receive path's parser reads the same datagram back.
        let d = crate::ring::parse(h, h.len() + 36).unwrap();
        assert_eq!(d.src, "10.0.0.1:49152".parse().unwrap());
        assert_eq!((d.off, d.len, d.ident), (28, 36, (0, true)));
    }

    #[test]
    fn a_gso_frame_asks_for_udp_segmentation_with_checksum_offload() {
        let f = headers(&HOP, &shape(3 * 1084 + 20, 1084)).unwrap();
        let u16_at = |o: usize| u16::from_ne_bytes([f[o], f[o + 1]]);
        assert_eq!((f[0], f[1]), (F_NEEDS_CSUM, GSO_UDP_L4));
        assert_eq!((u16_at(2), u16_at(4)), (42, 1084), "hdr_len, gso_size");
        assert_eq!((u16_at(6), u16_at(8)), (34, 6), "csum at the UDP checksum");
        let h = &f[VNET + ETH..];
        let udp_len = 8 + 3 * 1084 + 20;
        assert_eq!(usize::from(u16::from_be_bytes([h[24], h[25]])), udp_len);
        assert_eq!(usize::from(u16::from_be_bytes([h[2], h[3]])), 20 + udp_len);
        // The seeded checksum is the pseudo-header's sum: adding the UDP
        // header and payload and complementing gives the real checksum.
        let pseudo = u16::try_from(0x0a00 + 0x0001 + 0x0a00 + 0x0002 + 17 + udp_len).unwrap();
        assert_eq!(u16::from_be_bytes([h[26], h[27]]), pseudo);
    }

    #[test]
    fn loopback_needs_accept_local_and_for_127_route_localnet() {
        let (a, b) = (Ipv4Addr::new(127, 0, 0, 1), Ipv4Addr::new(127, 0, 0, 2));
        let (c, d) = (Ipv4Addr::new(10, 9, 0, 1), Ipv4Addr::new(10, 9, 0, 2));
        assert!(loopback_verdict(true, true, a, b, "lo").is_ok());
        assert!(loopback_verdict(true, false, c, d, "lo").is_ok());
        let e = loopback_verdict(true, false, a, b, "lo").unwrap_err();
        assert!(e.contains("net.ipv4.conf.lo.route_localnet=1"), "{e}");
        assert!(!e.contains("accept_local"), "{e}");
        let e = loopback_verdict(false, false, a, d, "lo").unwrap_err();
        assert!(
            e.contains("accept_local=1") && e.contains("route_localnet=1"),
            "{e}"
        );
        let e = loopback_verdict(false, true, c, d, "lo").unwrap_err();
        assert!(
            e.contains("accept_local=1") && !e.contains("route_localnet"),
            "{e}"
        );
    }

    #[test]
    fn the_neighbour_table_must_agree_on_address_mac_and_interface() {
        let arp = "IP address       HW type     Flags       HW address            Mask     Device\n\
                   10.9.0.2         0x1         0x2         02:00:0a:09:00:02     *        veth0\n\
                   10.9.0.3         0x1         0x0         00:00:00:00:00:00     *        veth0\n\
                   10.9.0.4         0x1         0x6         02:00:0a:09:00:04     *        veth1\n";
        let mac = [2, 0, 10, 9, 0, 2];
        assert!(arp_confirms(arp, Ipv4Addr::new(10, 9, 0, 2), mac, "veth0"));
        assert!(
            !arp_confirms(arp, Ipv4Addr::new(10, 9, 0, 2), mac, "veth1"),
            "interface"
        );
        assert!(
            !arp_confirms(
                arp,
                Ipv4Addr::new(10, 9, 0, 2),
                [2, 0, 10, 9, 0, 9],
                "veth0"
            ),
            "mac"
        );
        assert!(
            !arp_confirms(arp, Ipv4Addr::new(10, 9, 0, 3), [0; 6], "veth0"),
            "incomplete"
        );
        assert!(arp_confirms(
            arp,
            Ipv4Addr::new(10, 9, 0, 4),
            [2, 0, 10, 9, 0, 4],
            "veth1"
        ));
        assert!(
            !arp_confirms(arp, Ipv4Addr::new(10, 9, 0, 5), mac, "veth0"),
            "absent"
        );
        assert!(!arp_confirms("", Ipv4Addr::new(10, 9, 0, 2), mac, "veth0"));
    }

    #[test]
    fn observed_hops_are_rechecked_only_when_due_or_changed() {
        let Ok(f) = FrameTx::open() else {
            eprintln!("skipping: no AF_PACKET socket (needs CAP_NET_RAW)");
            return;
        };
        // Link type 0 is never usable: the verdict is a rejection, kept
        // for RECHECK_NS.
        let hop = Hop {
            ifindex: 1,
            hatype: 0,
            mac: [0; 6],
            local: [0; 6],
        };
        let (l, p) = (Ipv4Addr::new(10, 1, 0, 1), Ipv4Addr::new(10, 1, 0, 2));
        let t0 = 5 * CHECK_SPACING_NS;
        f.observe(l, p, hop, t0);
        assert_eq!(f.hop(p), None);
        let g = f.generation();
        f.observe(l, p, hop, t0 + 2 * CHECK_SPACING_NS);
        assert_eq!(f.generation(), g, "same hop, not due: no new verdict");
        let moved = Hop { ifindex: 2, ..hop };
        f.observe(l, p, moved, t0 + CHECK_SPACING_NS / 2);
        assert_eq!(
            f.generation(),
            g,
            "too soon after the last judgement: put off"
        );
        f.observe(l, p, moved, t0 + 3 * CHECK_SPACING_NS);
        assert_eq!(
            f.generation(),
            g + 1,
            "a changed hop is judged once allowed"
        );
        f.observe(l, p, moved, t0 + RECHECK_NS + 4 * CHECK_SPACING_NS);
        assert_eq!(f.generation(), g + 1, "judged again when due, same verdict");
        f.forget(p);
        assert_eq!(f.generation(), g + 2);
        f.forget(p);
        assert_eq!(
            f.generation(),
            g + 2,
            "forgetting an unknown peer changes nothing"
        );
    }
}
