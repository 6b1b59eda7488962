//! The packet-ring receive path (opt-in, `RxeConfig::rx_ring`,
//! `RNIC_RXE_RX_RING=1`): a port's datagrams arrive in a `TPACKET_V2` ring
//! of an `AF_PACKET` socket that the kernel fills and the device polls in
//! memory, so an idle poll costs a load instead of a `recvmmsg` system call
//! (~0.8 µs here) and a datagram is taken without one.
//!
//! The ring takes *every* datagram to the port's address and RoCE port
//! (classic-BPF filter: IPv4, UDP, not a fragment, destination address and
//! port), and the port's UDP socket drops all it receives (a drop-all
//! socket filter): one queue, so an RC stream is never split between two
//! queues that could reorder it. The socket stays bound (it sends what frame
//! transmit, `crate::frames`, does not, and it keeps the port from
//! answering ICMP port-unreachable). The ring also sees each datagram's
//! link layer: the next hop frame transmit sends to.
//!
//! A UDP GSO datagram that the loopback (or any device that does not
//! segment) delivers whole arrives as one frame with a virtio-net header
//! (`PACKET_VNET_HDR`) carrying its segment size: exactly what a UDP socket
//! with `UDP_GRO` hands over, so the receive path downstream is the same.
//! The kernel writes that header for UDP GSO only from Linux 6.2 (older
//! kernels drop such packets from the ring): [`PacketRing::open`] refuses
//! older kernels.
//!
//! IPv4 only (an IPv6 port keeps the socket path), and only on a device that
//! binds exclusively: a ring sees its address's datagrams whatever process
//! they are for, so it cannot live in a sharing group (`crate::share`).
//!
//! Frames are 68 KiB (a 64 KiB datagram, its headers and the ring's own), 64
//! of them per port: 4.25 MiB. The kernel counts a datagram that finds no
//! free frame as a drop, which RC recovers from like any loss.

use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

use rnic_roce::ident::{BpfInsn, bpf};

use crate::sys::{RxMsg, set_opt};

/// Bytes per frame: a multiple of the page size, so that one frame is one
/// block.
pub const FRAME: usize = 68 << 10;
/// Frames per ring.
pub const FRAMES: usize = 64;

/// `TPACKET_V2` (`enum tpacket_versions`, linux/if_packet.h).
const TPACKET_V2: libc::c_int = 1;
/// `struct virtio_net_hdr` (linux/virtio_net.h): flags, gso_type, hdr_len,
/// gso_size, csum_start, csum_offset; native byte order on a packet socket.
pub(crate) const VNET_HDR: usize = 10;
/// `VIRTIO_NET_HDR_GSO_NONE`.
const GSO_NONE: u8 = 0;
/// `struct tpacket2_hdr` field offsets: status, len, snaplen, mac, net.
const TP_STATUS: usize = 0;
const TP_LEN: usize = 4;
const TP_SNAPLEN: usize = 8;
const TP_MAC: usize = 12;
const TP_NET: usize = 14;
/// Where a frame's `struct sockaddr_ll` starts: right after the
/// `tpacket2_hdr`, aligned to 16 (`TPACKET2_HDRLEN`); its ifindex, hatype
/// and halen + address at these offsets within it.
const SLL: usize = 32;
const SLL_IFINDEX: usize = 4;
const SLL_HATYPE: usize = 8;
const SLL_PKTTYPE: usize = 10;
const SLL_HALEN: usize = 11;
const SLL_ADDR: usize = 12;
/// The most IPv4 and UDP header bytes (60 + 8).
const HEADERS: usize = 68;

/// The oldest kernel whose packet sockets describe UDP GSO datagrams in the
/// virtio-net header (older ones drop them from the ring).
pub const MIN_KERNEL: (u32, u32) = (6, 2);

/// A mapped `TPACKET_V2` receive ring on its socket.
#[derive(Debug)]
pub struct PacketRing {
    sock: OwnedFd,
    base: NonNull<u8>,
    /// The next frame to look at. Only the holder of the device's receive
    /// lock (`Shared::rx`) reads or moves it.
    cursor: AtomicU32,
}

// SAFETY: the mapping is owned by this object; frames are read through raw
// pointers by the holder of the device's receive lock only, their status
// words through atomics.
unsafe impl Send for PacketRing {}
// SAFETY: as Send: `recv_batch`, the only method that touches frames, runs
// under the device's receive lock, one thread at a time.
unsafe impl Sync for PacketRing {}

/// Where classic BPF addresses the network header whatever the link layer
/// (`SKF_NET_OFF`, linux/filter.h): a `SOCK_RAW` packet socket's program
/// sees the frame from its link-layer header.
const NET: u32 = 0xfff0_0000;

/// The classic-BPF program of a port's ring: keep whole datagrams for UDP
/// `roce_port` on `ip` that are not fragments, drop the rest. Offsets are
/// from the IPv4 header (`NET`), so any link layer works.
pub fn ring_filter(ip: Ipv4Addr, roce_port: u16) -> [BpfInsn; 14] {
    let op = |code, jt, jf, k| BpfInsn { code, jt, jf, k };
    [
        op(bpf::LD_H_ABS, 0, 0, NET + 6),    // 0: flags + fragment offset
        op(bpf::JSET_K, 11, 0, 0x3fff),      // 1: MF or an offset → drop (13)
        op(bpf::LD_B_ABS, 0, 0, NET + 9),    // 2: protocol
        op(bpf::JEQ_K, 0, 9, 17),            // 3: UDP, else drop (13)
        op(bpf::LD_W_ABS, 0, 0, NET + 16),   // 4: destination address
        op(bpf::JEQ_K, 0, 7, u32::from(ip)), // 5: ours, else drop (13)
        op(bpf::LD_B_ABS, 0, 0, NET),        // 6: version + header length
        op(bpf::AND_K, 0, 0, 0xf),           // 7
        op(bpf::LSH_K, 0, 0, 2),             // 8: IPv4 header bytes
        op(bpf::TAX, 0, 0, 0),               // 9: X = them
        op(bpf::LD_H_IND, 0, 0, NET + 2),    // 10: UDP destination port
        op(bpf::JEQ_K, 0, 1, u32::from(roce_port)), // 11: ours → keep (12), else drop (13)
        op(bpf::RET_K, 0, 0, u32::MAX),      // 12: keep all of it
        op(bpf::RET_K, 0, 0, 0),             // 13: drop
    ]
}

/// `major.minor` of a kernel release string (`6.18.44-…`).
pub fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut it = release.split(|c: char| !c.is_ascii_digit());
    let major = it.next()?.parse().ok()?;
    let minor = it.next()?.parse().ok()?;
    Some((major, minor))
}

/// One ring frame's datagram, from its IPv4 header: the sender, where the
/// UDP payload starts and how long it is, whether the frame holds less than
/// the datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Parsed {
    /// Source address and port.
    pub src: SocketAddr,
    /// Offset of the UDP payload from the IPv4 header.
    pub off: usize,
    /// UDP payload bytes.
    pub len: usize,
    /// The frame holds fewer bytes than the payload.
    pub truncated: bool,
    /// The IPv4 identification and don't-fragment bit (the ICRC covers
    /// both: checked with them, nothing predicted).
    pub ident: (u16, bool),
}

/// Parse the first bytes of a frame's IPv4 datagram (`head`, up to
/// `HEADERS`) of which the frame holds `snap` bytes. `None`: not an IPv4
/// UDP datagram whose headers the frame holds.
pub fn parse(head: &[u8], snap: usize) -> Option<Parsed> {
    let b0 = *head.first()?;
    let ihl = usize::from(b0 & 0xf) * 4;
    if b0 >> 4 != 4 || ihl < 20 {
        return None;
    }
    let udp = head.get(ihl..ihl + 8)?;
    let src_ip: [u8; 4] = head.get(12..16)?.try_into().ok()?;
    let sport = u16::from_be_bytes([udp[0], udp[1]]);
    let udp_len = usize::from(u16::from_be_bytes([udp[4], udp[5]]));
    let len = udp_len.checked_sub(8)?;
    let off = ihl + 8;
    Some(Parsed {
        src: SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::from(src_ip), sport)),
        off,
        len,
        truncated: off + len > snap,
        ident: (
            u16::from_be_bytes([*head.get(4)?, *head.get(5)?]),
            head.get(6)? & 0x40 != 0,
        ),
    })
}

/// The next hop a frame's `sockaddr_ll` names: its interface, link type
/// and source address, with `to`, the frame's destination address (its
/// link header's first bytes: ours). `None` unless the addresses are 6-byte
/// MAC addresses and the frame was sent to this host alone.
pub fn link_hop(sll: &[u8; 20], to: [u8; 6]) -> Option<crate::frames::Hop> {
    if sll[SLL_HALEN] != 6 || sll[SLL_PKTTYPE] != libc::PACKET_HOST {
        return None;
    }
    let i = SLL_IFINDEX;
    let mut mac = [0u8; 6];
    mac.copy_from_slice(&sll[SLL_ADDR..SLL_ADDR + 6]);
    Some(crate::frames::Hop {
        ifindex: i32::from_ne_bytes([sll[i], sll[i + 1], sll[i + 2], sll[i + 3]]),
        hatype: u16::from_ne_bytes([sll[SLL_HATYPE], sll[SLL_HATYPE + 1]]),
        mac,
        local: to,
    })
}

/// The segment size a frame's virtio-net header gives a GSO datagram (0: a
/// single datagram).
pub fn gso_size(vnet: &[u8; VNET_HDR]) -> u16 {
    if vnet[1] == GSO_NONE {
        0
    } else {
        u16::from_ne_bytes([vnet[4], vnet[5]])
    }
}

impl PacketRing {
    /// Open the ring of IPv4 address `ip`'s RoCE port, in the calling
    /// thread's network namespace. On error, the step that failed.
    pub fn open(ip: Ipv4Addr, roce_port: u16) -> Result<PacketRing, (&'static str, io::Error)> {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        match kernel_version(release.trim()) {
            Some(v) if v >= MIN_KERNEL => {}
            _ => {
                return Err((
                    "checking the kernel (UDP GSO datagrams reach a packet ring whole only from \
                     Linux 6.2)",
                    io::Error::new(
                        io::ErrorKind::Unsupported,
                        format!("kernel {:?} is older than 6.2", release.trim()),
                    ),
                ));
            }
        }
        // Protocol 0: the socket receives nothing until `bind` names one,
        // after the filter and the ring are in place.
        // SAFETY: socket(2) with constant arguments; it returns a new fd or -1.
        let fd = unsafe {
            libc::socket(
                libc::AF_PACKET,
                // SOCK_RAW: packet sockets give virtio-net headers only to
                // raw sockets; the link-layer header is skipped by offset.
                libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                0,
            )
        };
        if fd < 0 {
            return Err((
                "opening the AF_PACKET socket (needs CAP_NET_RAW)",
                io::Error::last_os_error(),
            ));
        }
        // SAFETY: `fd` was just returned by socket(2) and is owned by nobody else.
        let sock = unsafe { OwnedFd::from_raw_fd(fd) };
        let e = |what| move |source| (what, source);
        set_opt(
            sock.as_fd(),
            libc::SOL_PACKET,
            libc::PACKET_VERSION,
            &TPACKET_V2,
        )
        .map_err(e("selecting TPACKET_V2"))?;
        set_opt(sock.as_fd(), libc::SOL_PACKET, libc::PACKET_VNET_HDR, &1i32)
            .map_err(e("asking for virtio-net headers (PACKET_VNET_HDR)"))?;
        set_opt(
            sock.as_fd(),
            libc::SOL_PACKET,
            libc::PACKET_IGNORE_OUTGOING,
            &1i32,
        )
        .map_err(e("ignoring outgoing packets"))?;
        crate::sys::attach_filter(sock.as_fd(), &ring_filter(ip, roce_port))
            .map_err(e("attaching the ring's filter"))?;
        let req = libc::tpacket_req {
            tp_block_size: FRAME as u32,
            tp_block_nr: FRAMES as u32,
            tp_frame_size: FRAME as u32,
            tp_frame_nr: FRAMES as u32,
        };
        set_opt(sock.as_fd(), libc::SOL_PACKET, libc::PACKET_RX_RING, &req)
            .map_err(e("creating the receive ring (PACKET_RX_RING)"))?;
        // SAFETY: maps the ring the kernel just made for this socket, at an
        // address the kernel picks; nothing else refers to it.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                FRAME * FRAMES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                sock.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(("mapping the receive ring", io::Error::last_os_error()));
        }
        let ring = PacketRing {
            sock,
            base: NonNull::new(p.cast()).ok_or((
                "mapping the receive ring",
                io::Error::other("mapped at address 0"),
            ))?,
            cursor: AtomicU32::new(0),
        };
        // SAFETY: an all-zero sockaddr_ll is valid; the fields that matter
        // are set below.
        let mut ll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        ll.sll_family = libc::AF_PACKET as u16;
        ll.sll_protocol = (libc::ETH_P_IP as u16).to_be();
        ll.sll_ifindex = 0; // every interface: the filter picks the address
        // SAFETY: `ll` is a sockaddr_ll of the size we pass, read by the
        // kernel during the call only.
        let rc = unsafe {
            libc::bind(
                ring.sock.as_raw_fd(),
                (&raw const ll).cast(),
                size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(("binding the AF_PACKET socket", io::Error::last_os_error()));
        }
        Ok(ring)
    }

    /// The ring's socket: readable while a frame waits (for epoll and poll).
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.sock.as_fd()
    }

    /// Copy `dst.len()` bytes from offset `off` of frame `frame` into
    /// `dst`. The caller owns the frame (its status says so); ranges outside
    /// the frame copy nothing and return false.
    fn copy_out(&self, frame: usize, off: usize, dst: &mut [u8]) -> bool {
        if frame >= FRAMES || off.checked_add(dst.len()).is_none_or(|end| end > FRAME) {
            return false;
        }
        let src = self.base.as_ptr().wrapping_add(frame * FRAME + off);
        // SAFETY: `src..src + dst.len()` lies inside frame `frame` of the
        // mapping (checked above), which the caller owns: the kernel wrote
        // it before it set the frame's status to TP_STATUS_USER (read with
        // acquire) and does not touch it until the status goes back to
        // TP_STATUS_KERNEL; `dst` is our own buffer, disjoint from the
        // mapping.
        unsafe { std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) };
        true
    }

    /// Frame `frame`'s status word, shared with the kernel.
    fn status(&self, frame: usize) -> &AtomicU32 {
        let p = self
            .base
            .as_ptr()
            .wrapping_add((frame % FRAMES) * FRAME + TP_STATUS);
        // SAFETY: the frame's first word is its status: inside the mapping,
        // 4-aligned (the mapping is page-aligned, frames whole pages), live
        // as long as `self`; the kernel and this code only ever access it
        // atomically.
        unsafe { AtomicU32::from_ptr(p.cast()) }
    }

    /// Take up to `out.len()` datagrams from the ring without blocking:
    /// datagram `i`'s UDP payload into `arena[i * slot..]`, its description
    /// into `out[i]` (a frame that holds no IPv4/UDP datagram gets
    /// `src: None`, which the receive path counts as malformed). Returns how
    /// many; every frame taken is handed back to the kernel before return.
    pub fn recv_batch(&self, arena: &mut [u8], slot: usize, out: &mut [RxMsg]) -> usize {
        let mut cur = self.cursor.load(Ordering::Relaxed) as usize % FRAMES;
        let mut n = 0;
        while n < out.len() && (n + 1) * slot <= arena.len() {
            let status = self.status(cur);
            if status.load(Ordering::Acquire) & libc::TP_STATUS_USER == 0 {
                break;
            }
            out[n] = self.take(cur, &mut arena[n * slot..(n + 1) * slot]);
            status.store(libc::TP_STATUS_KERNEL, Ordering::Release);
            cur = (cur + 1) % FRAMES;
            n += 1;
        }
        self.cursor.store(cur as u32, Ordering::Relaxed);
        n
    }

    /// The datagram in frame `frame` (which the caller owns): its UDP
    /// payload into `slot`, its description returned.
    fn take(&self, frame: usize, slot: &mut [u8]) -> RxMsg {
        let mut hdr = [0u8; 16];
        if !self.copy_out(frame, 0, &mut hdr) {
            return RxMsg::EMPTY;
        }
        let u32_at = |o: usize| u32::from_ne_bytes([hdr[o], hdr[o + 1], hdr[o + 2], hdr[o + 3]]);
        let u16_at = |o: usize| usize::from(u16::from_ne_bytes([hdr[o], hdr[o + 1]]));
        let (wire, snap) = (u32_at(TP_LEN) as usize, u32_at(TP_SNAPLEN) as usize);
        let (mac, net) = (u16_at(TP_MAC), u16_at(TP_NET));
        // The frame holds `snap` bytes from `mac`; the datagram starts at
        // `net`; the virtio-net header ends at `mac`.
        if mac < VNET_HDR || net < mac || net - mac > snap {
            return RxMsg::EMPTY;
        }
        let ip_snap = snap - (net - mac);
        let mut vnet = [0u8; VNET_HDR];
        let mut head = [0u8; HEADERS];
        let h = ip_snap.min(HEADERS);
        if !self.copy_out(frame, mac - VNET_HDR, &mut vnet)
            || !self.copy_out(frame, net, &mut head[..h])
        {
            return RxMsg::EMPTY;
        }
        let Some(d) = parse(&head[..h], ip_snap) else {
            return RxMsg::EMPTY;
        };
        let mut truncated = d.truncated || snap < wire || d.len > slot.len();
        if !truncated {
            truncated = !self.copy_out(frame, net + d.off, &mut slot[..d.len]);
        }
        let (mut sll, mut to) = ([0u8; 20], [0u8; 6]);
        let hop = (self.copy_out(frame, SLL, &mut sll) && self.copy_out(frame, mac, &mut to))
            .then(|| link_hop(&sll, to))
            .flatten();
        RxMsg {
            len: if truncated { 0 } else { d.len },
            src: Some(d.src),
            gro: gso_size(&vnet),
            truncated,
            ident: Some(d.ident),
            hop,
        }
    }
}

impl Drop for PacketRing {
    fn drop(&mut self) {
        // SAFETY: exactly the mapping `open` made; no pointer into it
        // outlives `self` (frames are copied out before `recv_batch`
        // returns).
        unsafe { libc::munmap(self.base.as_ptr().cast(), FRAME * FRAMES) };
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn ipv4_udp(src: [u8; 4], sport: u16, payload: usize, ihl: u8) -> Vec<u8> {
        let mut p = vec![0u8; usize::from(ihl) * 4 + 8];
        p[0] = 0x40 | ihl;
        p[9] = 17;
        p[12..16].copy_from_slice(&src);
        let u = usize::from(ihl) * 4;
        p[u..u + 2].copy_from_slice(&sport.to_be_bytes());
        p[u + 4..u + 6].copy_from_slice(&((payload + 8) as u16).to_be_bytes());
        p
    }

    #[test]
    fn parse_finds_the_sender_and_the_payload_with_and_without_options() {
        for ihl in [5u8, 6, 15] {
            let h = ipv4_udp([10, 0, 0, 7], 49_152, 100, ihl);
            let off = usize::from(ihl) * 4 + 8;
            let d = parse(&h, off + 100).unwrap();
            assert_eq!(d.src, "10.0.0.7:49152".parse().unwrap());
            assert_eq!((d.off, d.len, d.truncated), (off, 100, false));
            // The frame holds one byte less than the datagram.
            assert!(parse(&h, off + 99).unwrap().truncated);
        }
        // The identification and the DF bit come from the header.
        let mut h = ipv4_udp([10, 0, 0, 7], 49_152, 100, 5);
        assert_eq!(parse(&h, 128).unwrap().ident, (0, false));
        h[4..6].copy_from_slice(&0xbeefu16.to_be_bytes());
        h[6] = 0x40;
        assert_eq!(parse(&h, 128).unwrap().ident, (0xbeef, true));
    }

    #[test]
    fn parse_refuses_what_is_not_ipv4_udp_headers() {
        let h = ipv4_udp([10, 0, 0, 7], 1, 10, 5);
        let mut v6 = h.clone();
        v6[0] = 0x65;
        assert_eq!(parse(&v6, 100), None);
        let mut short_ihl = h.clone();
        short_ihl[0] = 0x44;
        assert_eq!(parse(&short_ihl, 100), None);
        let mut short_udp = h.clone();
        short_udp[24..26].copy_from_slice(&7u16.to_be_bytes());
        assert_eq!(parse(&short_udp, 100), None);
        assert_eq!(parse(&h[..27], 100), None);
        assert_eq!(parse(&[], 0), None);
    }

    #[test]
    fn the_virtio_header_gives_the_gso_segment_size() {
        let mut v = [0u8; VNET_HDR];
        v[4..6].copy_from_slice(&1084u16.to_ne_bytes());
        assert_eq!(gso_size(&v), 0, "GSO_NONE: a single datagram");
        v[1] = 5; // VIRTIO_NET_HDR_GSO_UDP_L4
        assert_eq!(gso_size(&v), 1084);
    }

    #[test]
    fn the_frame_address_gives_the_next_hop() {
        let mut sll = [0u8; 20];
        sll[0..2].copy_from_slice(&(libc::AF_PACKET as u16).to_ne_bytes());
        sll[4..8].copy_from_slice(&7i32.to_ne_bytes());
        sll[8..10].copy_from_slice(&1u16.to_ne_bytes());
        sll[11] = 6;
        sll[12..18].copy_from_slice(&[2, 0, 10, 9, 0, 2]);
        let to = [2, 0, 10, 9, 0, 1];
        let hop = link_hop(&sll, to).unwrap();
        assert_eq!(
            (hop.ifindex, hop.hatype, hop.mac, hop.local),
            (7, 1, [2, 0, 10, 9, 0, 2], to)
        );
        sll[10] = libc::PACKET_BROADCAST;
        assert_eq!(link_hop(&sll, to), None, "not sent to this host alone");
        sll[10] = libc::PACKET_HOST;
        sll[11] = 0;
        assert_eq!(link_hop(&sll, to), None, "no link-layer address");
    }

    #[test]
    fn kernel_versions_parse_and_compare() {
        assert_eq!(kernel_version("6.18.44-fc-v1252"), Some((6, 18)));
        assert_eq!(kernel_version("6.1.0-28-amd64"), Some((6, 1)));
        assert!(kernel_version("6.1.0-28-amd64").unwrap() < MIN_KERNEL);
        assert!(kernel_version("6.2").unwrap() >= MIN_KERNEL);
        assert_eq!(kernel_version("garbage"), None);
    }
}
