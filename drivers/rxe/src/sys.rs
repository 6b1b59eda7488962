//! Every socket system call of the crate, one function each.
//!
//! Socket options go through nix. Three calls do not: `IP_MTU_DISCOVER`
//! (nix has no option for it), and `sendmmsg` / `recvmmsg`, because nix's
//! wrappers either allocate per call or keep raw-pointer headers that are not
//! `Send`. Here the `mmsghdr`/`iovec`/address/control arrays live on the
//! stack of the call and point into the caller's preallocated buffers, so a
//! batch allocates nothing. Control messages (`UDP_SEGMENT`, `UDP_GRO`) are
//! written and parsed as bytes in safe code. These are the crate's only
//! `unsafe` blocks.

use std::io;
use std::mem::size_of;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

use nix::sys::socket::{setsockopt, sockopt};

/// Messages per `sendmmsg` / `recvmmsg` call.
pub const BATCH: usize = 32;
/// Calls for at most this many messages build their headers in arrays of
/// this size: a busy poller's empty `recvmmsg` and a ping-pong's one-datagram
/// `sendmmsg` then prepare 4 headers, not 32 (the arrays are initialised
/// whole on every call).
pub const SMALL_BATCH: usize = 4;

/// `IPV6_AUTOFLOWLABEL` (linux/in6.h): derive a flow label per flow.
const IPV6_AUTOFLOWLABEL: i32 = 70;
/// `UDP_SEGMENT` (linux/udp.h): a GSO send's segment size.
const UDP_SEGMENT: i32 = 103;
/// `UDP_GRO` (linux/udp.h): a GRO receive's segment size.
const UDP_GRO: i32 = 104;

/// `CMSG_ALIGN`: control data is aligned to `size_t`.
const fn cmsg_align(n: usize) -> usize {
    (n + size_of::<usize>() - 1) & !(size_of::<usize>() - 1)
}
/// Bytes of a `cmsghdr` before its data (`CMSG_LEN(0)`).
const CMSG_HDR: usize = cmsg_align(size_of::<libc::cmsghdr>());
/// Room for one control message with up to 8 data bytes.
const CMSG_ROOM: usize = CMSG_HDR + cmsg_align(8);

/// A control-message buffer with `cmsghdr` alignment.
#[derive(Clone, Copy)]
#[repr(C, align(8))]
struct Cmsg([u8; CMSG_ROOM]);

/// A socket address buffer big enough for `sockaddr_in6` and
/// `sockaddr_ll`, aligned for them.
#[derive(Clone, Copy)]
#[repr(C, align(8))]
struct AddrBuf([u8; 32]);

const _: () = assert!(
    size_of::<libc::sockaddr_in6>() <= size_of::<AddrBuf>()
        && size_of::<libc::sockaddr_ll>() <= size_of::<AddrBuf>()
);

impl AddrBuf {
    const EMPTY: AddrBuf = AddrBuf([0; 32]);

    /// Encode `a` as a `sockaddr_in` / `sockaddr_in6`; returns its length.
    fn encode(&mut self, a: &SocketAddr) -> usize {
        let b = &mut self.0;
        b.fill(0);
        match a {
            SocketAddr::V4(v4) => {
                b[0..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
                b[2..4].copy_from_slice(&v4.port().to_be_bytes());
                b[4..8].copy_from_slice(&v4.ip().octets());
                size_of::<libc::sockaddr_in>()
            }
            SocketAddr::V6(v6) => {
                b[0..2].copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
                b[2..4].copy_from_slice(&v6.port().to_be_bytes());
                b[4..8].copy_from_slice(&v6.flowinfo().to_be_bytes());
                b[8..24].copy_from_slice(&v6.ip().octets());
                b[24..28].copy_from_slice(&v6.scope_id().to_ne_bytes());
                size_of::<libc::sockaddr_in6>()
            }
        }
    }

    /// Encode `hop` as the `sockaddr_ll` of an IPv4 frame to it; returns
    /// its length.
    fn encode_ll(&mut self, hop: &crate::frames::Hop) -> usize {
        let b = &mut self.0;
        b.fill(0);
        // sockaddr_ll: family, protocol (network order), ifindex, hatype,
        // pkttype, halen, addr[8].
        b[0..2].copy_from_slice(&(libc::AF_PACKET as u16).to_ne_bytes());
        b[2..4].copy_from_slice(&(libc::ETH_P_IP as u16).to_be_bytes());
        b[4..8].copy_from_slice(&hop.ifindex.to_ne_bytes());
        b[11] = 6;
        b[12..18].copy_from_slice(&hop.mac);
        size_of::<libc::sockaddr_ll>()
    }

    /// Decode what the kernel wrote.
    fn decode(&self) -> Option<SocketAddr> {
        let b = &self.0;
        let family = i32::from(u16::from_ne_bytes([b[0], b[1]]));
        let port = u16::from_be_bytes([b[2], b[3]]);
        if family == libc::AF_INET {
            let ip = Ipv4Addr::new(b[4], b[5], b[6], b[7]);
            Some(SocketAddr::V4(SocketAddrV4::new(ip, port)))
        } else if family == libc::AF_INET6 {
            let mut o = [0u8; 16];
            o.copy_from_slice(&b[8..24]);
            let scope = u32::from_ne_bytes([b[24], b[25], b[26], b[27]]);
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(o),
                port,
                0,
                scope,
            )))
        } else {
            None
        }
    }
}

/// Set `IP_MTU_DISCOVER = IP_PMTUDISC_DO` (IPv4) or `IPV6_MTU_DISCOVER =
/// IPV6_PMTUDISC_DO` (IPv6): DF is set and the kernel never fragments; on an
/// unconnected IPv4 socket it then sends identification 0.
pub fn set_pmtudisc_do(fd: BorrowedFd<'_>, ipv6: bool) -> io::Result<()> {
    if ipv6 {
        set_int(
            fd,
            libc::IPPROTO_IPV6,
            libc::IPV6_MTU_DISCOVER,
            libc::IPV6_PMTUDISC_DO,
        )
    } else {
        set_int(
            fd,
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            libc::IP_PMTUDISC_DO,
        )
    }
}

/// Turn `IPV6_AUTOFLOWLABEL` off: IPv6 packets carry flow label 0, as
/// kernel rxe sends them (nix has no option for it).
pub fn set_flow_label_off(fd: BorrowedFd<'_>) -> io::Result<()> {
    set_int(fd, libc::IPPROTO_IPV6, IPV6_AUTOFLOWLABEL, 0)
}

/// `SO_PREFER_BUSY_POLL` (asm-generic/socket.h, Linux 5.11).
const SO_PREFER_BUSY_POLL: i32 = 69;

/// The busy-poll budget caller-driven devices give their receive sockets.
pub const BUSY_POLL_USECS: u32 = 50;

/// `SO_BUSY_POLL` = `usecs` and `SO_PREFER_BUSY_POLL` on a receive socket:
/// each non-blocking receive first polls the NIC queue (NAPI context) the
/// socket's packets arrive on, instead of waiting for its interrupt; the
/// preference keeps the interrupt from taking the queue back while the
/// application polls. A device without NAPI contexts (`lo`, plain veth)
/// gives its packets none, so there it changes nothing. A value above
/// `net.core.busy_read` needs CAP_NET_ADMIN (`EPERM` otherwise); the
/// preference needs Linux 5.11 and is best effort.
pub fn set_busy_poll(fd: BorrowedFd<'_>, usecs: u32) -> io::Result<()> {
    let v = libc::c_int::try_from(usecs).unwrap_or(libc::c_int::MAX);
    set_int(fd, libc::SOL_SOCKET, libc::SO_BUSY_POLL, v)?;
    let _ = set_int(fd, libc::SOL_SOCKET, SO_PREFER_BUSY_POLL, 1);
    Ok(())
}

/// Put the calling thread under `SCHED_FIFO` at `priority` (1–99). Needs
/// CAP_SYS_NICE or an `RLIMIT_RTPRIO` of at least `priority` (`EPERM`
/// otherwise); `EINVAL` for a priority out of range.
pub fn set_fifo(priority: u8) -> io::Result<()> {
    let param = libc::sched_param {
        sched_priority: libc::c_int::from(priority),
    };
    // SAFETY: pid 0 names the calling thread; `param` is a valid
    // `sched_param` that outlives the call, which only reads it.
    let r = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &raw const param) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Wait up to `timeout` for `fd` to become readable (`ppoll`, nanosecond
/// timeout); whether it is. An interruption or an error counts as not
/// readable (the caller's next round looks anyway).
pub fn wait_readable(fd: BorrowedFd<'_>, timeout: std::time::Duration) -> bool {
    use nix::poll::{PollFd, PollFlags, ppoll};
    let ts = nix::sys::time::TimeSpec::from_duration(timeout);
    let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
    matches!(ppoll(&mut fds, Some(ts), None), Ok(n) if n > 0)
}

/// Wait on epoll set `epoll` for up to `timeout_ns` nanoseconds
/// (`epoll_pwait2`, Linux 5.11: epoll_wait's milliseconds would turn a
/// 50 µs ACK hold into 1 ms); returns how many of `events` it filled, 0 on
/// a timeout, an interruption or an error. Before 5.11 (`ENOSYS`) it waits
/// the timeout rounded up to a millisecond.
pub fn epoll_wait_ns(
    epoll: &impl AsFd,
    events: &mut [nix::sys::epoll::EpollEvent],
    timeout_ns: u64,
) -> usize {
    let ts = libc::timespec {
        tv_sec: libc::time_t::try_from(timeout_ns / 1_000_000_000).unwrap_or(libc::time_t::MAX),
        tv_nsec: (timeout_ns % 1_000_000_000) as libc::c_long,
    };
    let max = libc::c_int::try_from(events.len()).unwrap_or(libc::c_int::MAX);
    // SAFETY: `EpollEvent` is a `#[repr(transparent)]` wrapper of
    // `libc::epoll_event`, so `events` is `max` writable `epoll_event`s that
    // outlive the call; `ts` is a valid timespec the call only reads; a
    // null signal mask means "leave the mask alone".
    let r = unsafe {
        libc::epoll_pwait2(
            epoll.as_fd().as_raw_fd(),
            events.as_mut_ptr().cast::<libc::epoll_event>(),
            max,
            &raw const ts,
            std::ptr::null(),
        )
    };
    if r >= 0 {
        return usize::try_from(r).unwrap_or(0);
    }
    if io::Error::last_os_error().raw_os_error() != Some(libc::ENOSYS) {
        return 0;
    }
    let ms = libc::c_int::try_from(timeout_ns.div_ceil(1_000_000)).unwrap_or(libc::c_int::MAX);
    // SAFETY: as above, with epoll_wait's millisecond timeout.
    let r = unsafe {
        libc::epoll_wait(
            epoll.as_fd().as_raw_fd(),
            events.as_mut_ptr().cast::<libc::epoll_event>(),
            max,
            ms,
        )
    };
    usize::try_from(r).unwrap_or(0)
}

/// Traffic class (IPv4 TOS) and hop limit (IPv4 TTL) of what the socket
/// sends: an address vector's `traffic_class` and `hop_limit`, which
/// kernel rxe writes into every packet's IP header.
pub fn set_tclass_and_hops(fd: &impl AsFd, ipv6: bool, tclass: u8, hops: u8) -> io::Result<()> {
    let (tclass, hops) = (libc::c_int::from(tclass), libc::c_int::from(hops));
    if ipv6 {
        setsockopt(fd, sockopt::Ipv6TClass, &tclass)?;
        setsockopt(fd, sockopt::Ipv6Ttl, &hops)?;
    } else {
        setsockopt(fd, sockopt::Ipv4Tos, &tclass)?;
        setsockopt(fd, sockopt::Ipv4Ttl, &hops)?;
    }
    Ok(())
}

/// `CLOCK_MONOTONIC` (the clock `std::time::Instant` reads) in nanoseconds.
/// The engine's clock is read once per progress round and once per post:
/// this skips `Instant`'s checked `timespec` subtraction and the `u128`
/// conversion of `Instant::elapsed`.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a live, writable timespec on our stack, the only
    // memory the call writes; CLOCK_MONOTONIC is a valid clock id on every
    // Linux (with a valid pointer the call cannot fail, and a failure would
    // leave `ts` zero, an early time, never memory unsafety).
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) };
    // Both fields are nonnegative for CLOCK_MONOTONIC (seconds since boot).
    u64::try_from(ts.tv_sec)
        .unwrap_or(0)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(u64::try_from(ts.tv_nsec).unwrap_or(0))
}

/// Set an integer socket option by number.
fn set_int(fd: BorrowedFd<'_>, level: i32, name: i32, value: libc::c_int) -> io::Result<()> {
    set_opt(fd, level, name, &value)
}

/// Set socket option `name` of `level` to `value` (an integer or a plain
/// C struct such as `tpacket_req`), passed with its size.
pub(crate) fn set_opt<T: Copy>(
    fd: BorrowedFd<'_>,
    level: i32,
    name: i32,
    value: &T,
) -> io::Result<()> {
    // SAFETY: `fd` is a live socket (borrowed for the call); the option value
    // points at a `T` the caller holds for the call, whose size we pass; the
    // kernel only reads it.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (value as *const T).cast(),
            size_of::<T>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Ask for `bytes` of send and receive buffer (the `*_FORCE` variants first,
/// which root may use beyond `net.core.[rw]mem_max`). Best effort.
pub fn set_buffers(fd: &impl AsFd, bytes: usize) {
    if setsockopt(fd, sockopt::RcvBufForce, &bytes).is_err() {
        let _ = setsockopt(fd, sockopt::RcvBuf, &bytes);
    }
    if setsockopt(fd, sockopt::SndBufForce, &bytes).is_err() {
        let _ = setsockopt(fd, sockopt::SndBuf, &bytes);
    }
}

/// The receive buffer `fd` got (`SO_RCVBUF`: what the kernel accounts,
/// twice what was asked for), or 0 if it cannot be read.
pub fn rcvbuf(fd: &impl AsFd) -> usize {
    nix::sys::socket::getsockopt(fd, sockopt::RcvBuf).unwrap_or(0)
}

/// Whether the kernel takes `UDP_SEGMENT` (probe: set the socket default to 0).
pub fn probe_gso(fd: &impl AsFd) -> bool {
    setsockopt(fd, sockopt::UdpGsoSegment, &0).is_ok()
}

/// Turn on `UDP_GRO`; whether the kernel took it.
pub fn enable_gro(fd: &impl AsFd) -> bool {
    setsockopt(fd, sockopt::UdpGroSegment, &true).is_ok()
}

/// One iovec as plain integers, laid out as the kernel's `struct iovec`
/// (base address, length), so that a transmit queue holding them stays
/// `Send`; only [`send_iov_batch`] turns them into pointers for the kernel.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RawIov {
    /// Address of the first byte.
    pub base: usize,
    /// Bytes.
    pub len: usize,
}

const _: () = assert!(
    size_of::<RawIov>() == size_of::<libc::iovec>()
        && std::mem::align_of::<RawIov>() == std::mem::align_of::<libc::iovec>()
);

/// One datagram to send: `count` iovecs of the batch's array from `first`,
/// to `dst`; with `gso` > 0 the kernel cuts it into `gso`-byte UDP
/// datagrams (the last may be shorter).
#[derive(Clone, Copy, Debug)]
pub struct TxMsg {
    /// First iovec.
    pub first: usize,
    /// Iovecs.
    pub count: usize,
    /// Destination.
    pub dst: SocketAddr,
    /// GSO segment size, 0 for a plain datagram.
    pub gso: u16,
    /// Sent as a frame on a packet socket (`crate::frames`) to this next
    /// hop: the iovecs start with the IPv4 and UDP headers, and `dst` is
    /// only in them.
    pub link: Option<crate::frames::Hop>,
}

/// Send up to [`BATCH`] datagrams gathered from `iov` with one `sendmmsg`;
/// returns how many the kernel took (the rest were not sent).
///
/// # Safety
///
/// Every iovec the messages name is valid for reads of its length for the
/// whole call (the transmit queue's arena, or registered memory whose
/// owner the queue holds and whose direct span is borrowed across the
/// call). The kernel only reads them.
pub unsafe fn send_iov_batch(
    fd: BorrowedFd<'_>,
    msgs: &[TxMsg],
    iov: &[RawIov],
) -> io::Result<usize> {
    if let [m] = msgs
        && m.count == 1
        && m.gso == 0
    {
        // SAFETY: the caller's contract, passed on.
        unsafe { send_one(fd, m, iov) }
    } else if msgs.len() == 1 {
        // SAFETY: the caller's contract, passed on.
        unsafe { send_n::<1>(fd, msgs, iov) }
    } else if msgs.len() <= SMALL_BATCH {
        // SAFETY: the caller's contract, passed on.
        unsafe { send_n::<SMALL_BATCH>(fd, msgs, iov) }
    } else {
        // SAFETY: as above.
        unsafe { send_n::<BATCH>(fd, msgs, iov) }
    }
}

/// [`send_iov_batch`] of one datagram in one iovec with no control
/// message: `sendto`, which spares the kernel copying in a message header
/// and an iovec array (a ping-pong's frame; a lone ACK).
///
/// # Safety
///
/// As [`send_iov_batch`].
unsafe fn send_one(fd: BorrowedFd<'_>, m: &TxMsg, iov: &[RawIov]) -> io::Result<usize> {
    let Some(v) = iov.get(m.first) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "datagram outside the iovec array",
        ));
    };
    let mut addr = AddrBuf::EMPTY;
    let alen = match &m.link {
        Some(hop) => addr.encode_ll(hop),
        None => addr.encode(&m.dst),
    };
    // SAFETY: `v` names memory the caller guarantees readable for its
    // length during the call; `addr` is a live stack buffer of at least
    // `alen` bytes; the kernel only reads both. (The raw system call, as in
    // `send_n`.)
    let rc = unsafe {
        libc::syscall(
            libc::SYS_sendto,
            fd.as_raw_fd(),
            v.base as *const libc::c_void,
            v.len,
            libc::MSG_NOSIGNAL,
            addr.0.as_ptr(),
            alen as libc::socklen_t,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(1)
    }
}

/// [`send_iov_batch`] with header arrays of `N` entries.
///
/// # Safety
///
/// As [`send_iov_batch`].
unsafe fn send_n<const N: usize>(
    fd: BorrowedFd<'_>,
    msgs: &[TxMsg],
    iov: &[RawIov],
) -> io::Result<usize> {
    let n = msgs.len().min(N);
    if n == 0 {
        return Ok(0);
    }
    let mut addrs = [AddrBuf::EMPTY; N];
    let mut cmsgs = [Cmsg([0; CMSG_ROOM]); N];
    // SAFETY: an all-zero mmsghdr is valid (null pointers, zero lengths).
    let mut hdrs: [libc::mmsghdr; N] = unsafe { std::mem::zeroed() };
    for (i, m) in msgs.iter().take(n).enumerate() {
        let Some(v) = iov.get(m.first..m.first.saturating_add(m.count)) else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "datagram outside the iovec array",
            ));
        };
        let alen = match &m.link {
            Some(hop) => addrs[i].encode_ll(hop),
            None => addrs[i].encode(&m.dst),
        };
        let h = &mut hdrs[i].msg_hdr;
        h.msg_name = addrs[i].0.as_mut_ptr().cast();
        h.msg_namelen = alen as libc::socklen_t;
        // The kernel only reads the iovec array (`sendmsg` copies it in).
        h.msg_iov = v.as_ptr().cast::<libc::iovec>().cast_mut();
        h.msg_iovlen = v.len();
        if m.gso > 0 {
            let c = &mut cmsgs[i].0;
            let len = CMSG_HDR + size_of::<u16>();
            c[..size_of::<usize>()].copy_from_slice(&len.to_ne_bytes());
            let lvl = size_of::<usize>();
            c[lvl..lvl + 4].copy_from_slice(&libc::SOL_UDP.to_ne_bytes());
            c[lvl + 4..lvl + 8].copy_from_slice(&UDP_SEGMENT.to_ne_bytes());
            c[CMSG_HDR..CMSG_HDR + 2].copy_from_slice(&m.gso.to_ne_bytes());
            h.msg_control = c.as_mut_ptr().cast();
            h.msg_controllen = CMSG_HDR + cmsg_align(size_of::<u16>());
        }
    }
    // SAFETY: the first `n` headers point at live stack arrays (addresses,
    // control bytes) and at `iov`'s entries (`RawIov` has `iovec`'s layout,
    // checked at compile time), whose memory the caller guarantees readable
    // for the call; the kernel only reads all of it; `n` <= N, the arrays'
    // length. (The raw system call: glibc's wrapper is a thread-cancellation
    // point and brackets the call with two atomic updates, a measurable
    // share of a ping-pong's time.)
    let rc = unsafe {
        libc::syscall(
            libc::SYS_sendmmsg,
            fd.as_raw_fd(),
            hdrs.as_mut_ptr(),
            n as libc::c_uint,
            libc::MSG_NOSIGNAL,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc as usize)
    }
}

/// One received datagram.
#[derive(Clone, Copy, Debug)]
pub struct RxMsg {
    /// Bytes received (in the message's slot of the arena).
    pub len: usize,
    /// Sender.
    pub src: Option<SocketAddr>,
    /// GRO segment size (0: a single datagram).
    pub gro: u16,
    /// The datagram did not fit its slot.
    pub truncated: bool,
    /// Its IPv4 identification and don't-fragment bit, when the receive
    /// path saw the IPv4 header (the packet ring; a socket does not).
    pub ident: Option<(u16, bool)>,
    /// The link-layer hop it arrived through, when the receive path saw
    /// it (the packet ring).
    pub hop: Option<crate::frames::Hop>,
}

impl RxMsg {
    /// An empty message.
    pub const EMPTY: RxMsg = RxMsg {
        len: 0,
        src: None,
        gro: 0,
        truncated: false,
        ident: None,
        hop: None,
    };
}

/// Receive up to `out.len()` (<= [`BATCH`]) datagrams without blocking into
/// `arena`, slot `i` being `arena[i * slot..(i + 1) * slot]`. Returns how many
/// arrived (0 when none were waiting).
pub fn recv_batch(
    fd: BorrowedFd<'_>,
    arena: &mut [u8],
    slot: usize,
    out: &mut [RxMsg],
) -> io::Result<usize> {
    if out.len() == 1 {
        // An idle or ping-pong socket's call: one header to prepare.
        recv_n::<1>(fd, arena, slot, out)
    } else if out.len() <= SMALL_BATCH {
        recv_n::<SMALL_BATCH>(fd, arena, slot, out)
    } else {
        recv_n::<BATCH>(fd, arena, slot, out)
    }
}

/// [`recv_batch`] with header arrays of `N` entries.
fn recv_n<const N: usize>(
    fd: BorrowedFd<'_>,
    arena: &mut [u8],
    slot: usize,
    out: &mut [RxMsg],
) -> io::Result<usize> {
    let n = out.len().min(N).min(arena.len() / slot.max(1));
    if n == 0 {
        return Ok(0);
    }
    let mut addrs = [AddrBuf::EMPTY; N];
    let mut cmsgs = [Cmsg([0; CMSG_ROOM]); N];
    let mut iovs = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; N];
    // SAFETY: an all-zero mmsghdr is valid (null pointers, zero lengths).
    let mut hdrs: [libc::mmsghdr; N] = unsafe { std::mem::zeroed() };
    for (i, chunk) in arena.chunks_exact_mut(slot).take(n).enumerate() {
        iovs[i].iov_base = chunk.as_mut_ptr().cast();
        iovs[i].iov_len = chunk.len();
        let h = &mut hdrs[i].msg_hdr;
        h.msg_name = addrs[i].0.as_mut_ptr().cast();
        h.msg_namelen = size_of::<AddrBuf>() as libc::socklen_t;
        h.msg_iov = &raw mut iovs[i];
        h.msg_iovlen = 1;
        h.msg_control = cmsgs[i].0.as_mut_ptr().cast();
        h.msg_controllen = CMSG_ROOM;
    }
    // SAFETY: the first `n` headers point at live, writable stack arrays and
    // at disjoint `slot`-byte chunks of `arena`, with their true sizes; all
    // of it outlives the call; `n` <= N, the arrays' length; no timeout
    // pointer.
    // (The raw system call, as for sendmmsg.)
    let rc = unsafe {
        libc::syscall(
            libc::SYS_recvmmsg,
            fd.as_raw_fd(),
            hdrs.as_mut_ptr(),
            n as libc::c_uint,
            libc::MSG_DONTWAIT,
            std::ptr::null_mut::<libc::timespec>(),
        )
    };
    if rc < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EAGAIN | libc::EINTR) => Ok(0),
            _ => Err(e),
        };
    }
    let got = rc as usize;
    for i in 0..got {
        let h = &hdrs[i];
        let ctl = h.msg_hdr.msg_controllen.min(CMSG_ROOM);
        out[i] = RxMsg {
            len: (h.msg_len as usize).min(slot),
            src: addrs[i].decode(),
            gro: parse_gro(&cmsgs[i].0[..ctl]),
            truncated: h.msg_hdr.msg_flags & libc::MSG_TRUNC != 0,
            ident: None,
            hop: None,
        };
    }
    Ok(got)
}

/// Receive one datagram without blocking into the buffers `iov` names, in
/// order (a scatter receive: headers into the transport's own buffer,
/// payloads straight into registered memory). `None` when none was
/// waiting; the message's `len` is the bytes the buffers took.
///
/// # Safety
///
/// Every entry of `iov` must name memory valid for writes of its length
/// for the whole call, which no Rust reference covers meanwhile (the
/// kernel writes it as a device's DMA would).
pub unsafe fn recv_scatter(fd: BorrowedFd<'_>, iov: &[libc::iovec]) -> io::Result<Option<RxMsg>> {
    let mut addr = AddrBuf::EMPTY;
    let mut cmsg = Cmsg([0; CMSG_ROOM]);
    // SAFETY: an all-zero msghdr is valid (null pointers, zero lengths).
    let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
    h.msg_name = addr.0.as_mut_ptr().cast();
    h.msg_namelen = size_of::<AddrBuf>() as libc::socklen_t;
    // The kernel only reads the iovec array.
    h.msg_iov = iov.as_ptr().cast_mut();
    h.msg_iovlen = iov.len();
    h.msg_control = cmsg.0.as_mut_ptr().cast();
    h.msg_controllen = CMSG_ROOM;
    // SAFETY: the header points at live, writable locals (address,
    // control bytes) with their true sizes and at `iov`, whose entries the
    // caller guarantees writable for the call; no other pointer.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_recvmsg,
            fd.as_raw_fd(),
            &raw mut h,
            libc::MSG_DONTWAIT,
        )
    };
    if rc < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EAGAIN | libc::EINTR) => Ok(None),
            _ => Err(e),
        };
    }
    let room: usize = iov.iter().map(|v| v.iov_len).sum();
    let ctl = h.msg_controllen.min(CMSG_ROOM);
    Ok(Some(RxMsg {
        len: (rc as usize).min(room),
        src: addr.decode(),
        gro: parse_gro(&cmsg.0[..ctl]),
        truncated: h.msg_flags & libc::MSG_TRUNC != 0,
        ident: None,
        hop: None,
    }))
}

/// The `UDP_GRO` segment size in a control buffer (0 when absent).
fn parse_gro(ctl: &[u8]) -> u16 {
    let w = size_of::<usize>();
    let mut at = 0;
    while at + CMSG_HDR <= ctl.len() {
        let mut lenb = [0u8; size_of::<usize>()];
        lenb.copy_from_slice(&ctl[at..at + w]);
        let len = usize::from_ne_bytes(lenb);
        let level = i32::from_ne_bytes([
            ctl[at + w],
            ctl[at + w + 1],
            ctl[at + w + 2],
            ctl[at + w + 3],
        ]);
        let ty = i32::from_ne_bytes([
            ctl[at + w + 4],
            ctl[at + w + 5],
            ctl[at + w + 6],
            ctl[at + w + 7],
        ]);
        if len < CMSG_HDR {
            break;
        }
        if level == libc::SOL_UDP && ty == UDP_GRO && at + CMSG_HDR + 4 <= ctl.len() {
            let d = &ctl[at + CMSG_HDR..at + CMSG_HDR + 4];
            let v = i32::from_ne_bytes([d[0], d[1], d[2], d[3]]);
            return u16::try_from(v).unwrap_or(0);
        }
        at += cmsg_align(len);
    }
    0
}

/// Whether `ip` is IPv6 (and not IPv4-mapped).
pub fn is_v6(ip: &IpAddr) -> bool {
    matches!(ip, IpAddr::V6(_))
}

/// Bytes of each tapped packet kept (rnic-roce's [`rnic_roce::ident::TAP_SNAP`]).
pub const TAP_SNAP: usize = rnic_roce::ident::TAP_SNAP;

/// A raw IPv4 socket that sees a copy of every UDP packet to `ip`:`roce_port`
/// whose identification is not 0, cut to its headers (see
/// [`rnic_roce::ident::tap_filter`]),
/// non-blocking. Raw delivery precedes UDP delivery in the kernel, so a
/// datagram's copy is queued here before the datagram is readable on the
/// UDP socket. Needs CAP_NET_RAW (`EPERM` otherwise).
pub fn ident_tap(ip: Ipv4Addr, roce_port: u16) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: socket(2) with constant arguments; it returns a new fd or -1.
    let fd = unsafe {
        libc::socket(
            libc::AF_INET,
            libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            libc::IPPROTO_UDP,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by socket(2) and is owned by nobody else.
    let owned = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    attach_filter(owned.as_fd(), &rnic_roce::ident::tap_filter(roce_port))?;
    let addr = nix::sys::socket::SockaddrIn::from(SocketAddrV4::new(ip, 0));
    nix::sys::socket::bind(owned.as_raw_fd(), &addr).map_err(io::Error::from)?;
    set_buffers(&owned, 1 << 20);
    Ok(owned)
}

/// Attach classic-BPF program `prog` to socket `fd` (`SO_ATTACH_FILTER`).
pub fn attach_filter(fd: BorrowedFd<'_>, prog: &[rnic_roce::ident::BpfInsn]) -> io::Result<()> {
    let code: Vec<libc::sock_filter> = prog
        .iter()
        .map(|i| libc::sock_filter {
            code: i.code,
            jt: i.jt,
            jf: i.jf,
            k: i.k,
        })
        .collect();
    let fprog = libc::sock_fprog {
        len: u16::try_from(code.len()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?,
        filter: code.as_ptr().cast_mut(),
    };
    // SAFETY: `fd` is a live socket borrowed for the call; `fprog` points at
    // `code`, both alive for the call, with the sizes we pass; the kernel
    // copies the program.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_FILTER,
            (&raw const fprog).cast(),
            size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Drop every datagram socket `fd` would receive (a port whose packet ring
/// takes them; see `crate::ring`).
pub fn drop_all(fd: BorrowedFd<'_>) -> io::Result<()> {
    attach_filter(
        fd,
        &[rnic_roce::ident::BpfInsn {
            code: rnic_roce::ident::bpf::RET_K,
            jt: 0,
            jf: 0,
            k: 0,
        }],
    )
}

/// Read one tapped packet into `buf` without blocking: `Ok(None)` when the
/// queue is empty.
pub fn tap_recv(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<Option<usize>> {
    // SAFETY: `fd` is a live socket borrowed for the call; `buf` is a
    // writable buffer of the length we pass; the kernel writes at most that.
    let n = unsafe {
        libc::recv(
            fd.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT | libc::MSG_TRUNC,
        )
    };
    if n >= 0 {
        return Ok(Some((n as usize).min(buf.len())));
    }
    let e = io::Error::last_os_error();
    if e.kind() == io::ErrorKind::WouldBlock {
        Ok(None)
    } else {
        Err(e)
    }
}

/// The name of interface `ifindex` in the calling thread's network
/// namespace.
pub fn if_name(ifindex: i32) -> io::Result<String> {
    let index = u32::try_from(ifindex)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "negative interface index"))?;
    let mut buf = [0u8; libc::IF_NAMESIZE];
    // SAFETY: `buf` has the IF_NAMESIZE bytes if_indextoname(3) may write
    // (the name and its terminating NUL); it returns `buf` or null.
    let p = unsafe { libc::if_indextoname(index, buf.as_mut_ptr().cast()) };
    if p.is_null() {
        return Err(io::Error::last_os_error());
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
}
