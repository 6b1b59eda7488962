//! Every system call of rnic-mlx5-emu, one function each (STYLE habit 4):
//! the BAR memfd, mappings of the driver's DMA fds, zeroing, eventfd
//! signalling. Typed results; callers add context.

use std::ffi::CStr;
use std::num::NonZeroUsize;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::ptr::NonNull;

use nix::errno::Errno;
use nix::fcntl::{FallocateFlags, FcntlArg, SealFlag, fallocate, fcntl};
use nix::sys::memfd::{MFdFlags, memfd_create};
use nix::sys::mman::{MapFlags, ProtFlags, mmap, munmap};

/// `memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING)`.
pub(crate) fn memfd(name: &CStr) -> nix::Result<OwnedFd> {
    memfd_create(name, MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING)
}

/// `ftruncate(fd, len)`.
pub(crate) fn truncate(fd: BorrowedFd<'_>, len: u64) -> nix::Result<()> {
    let len = libc::off_t::try_from(len).map_err(|_| Errno::EFBIG)?;
    nix::unistd::ftruncate(fd, len)
}

/// Seal the size of a memfd (no shrink, no grow, no more seals), so the
/// driver's mapping of it can never fault with `SIGBUS`.
pub(crate) fn seal_size(fd: BorrowedFd<'_>) -> nix::Result<()> {
    fcntl(
        fd,
        FcntlArg::F_ADD_SEALS(
            SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL,
        ),
    )
    .map(drop)
}

/// Whether `fd` is sealed against shrinking (`F_GET_SEALS`; false for files
/// that do not support seals).
pub(crate) fn shrink_sealed(fd: BorrowedFd<'_>) -> bool {
    fcntl(fd, FcntlArg::F_GET_SEALS).is_ok_and(|s| s & libc::F_SEAL_SHRINK != 0)
}

/// The size of the file behind `fd` (`fstat`).
pub(crate) fn file_size(fd: BorrowedFd<'_>) -> nix::Result<u64> {
    let st = nix::sys::stat::fstat(fd)?;
    u64::try_from(st.st_size).map_err(|_| Errno::EINVAL)
}

/// `mmap(NULL, len, prot, MAP_SHARED, fd, offset)`; `offset` page-aligned.
pub(crate) fn mmap_shared(
    fd: BorrowedFd<'_>,
    offset: u64,
    len: usize,
    read: bool,
    write: bool,
) -> nix::Result<NonNull<u8>> {
    let length = NonZeroUsize::new(len).ok_or(Errno::EINVAL)?;
    let offset = libc::off_t::try_from(offset).map_err(|_| Errno::EOVERFLOW)?;
    let mut prot = ProtFlags::PROT_NONE;
    if read {
        prot |= ProtFlags::PROT_READ;
    }
    if write {
        prot |= ProtFlags::PROT_WRITE;
    }
    // SAFETY: a fresh mapping chosen by the kernel (addr = NULL) aliases no
    // Rust object; the caller owns it and unmaps it with `unmap`.
    let ptr = unsafe { mmap(None, length, prot, MapFlags::MAP_SHARED, fd, offset) }?;
    Ok(ptr.cast())
}

/// `munmap(ptr, len)`.
///
/// # Safety
///
/// `[ptr, ptr + len)` must be exactly one mapping made by [`mmap_shared`]
/// that nothing accesses any more.
pub(crate) unsafe fn unmap(ptr: NonNull<u8>, len: usize) -> nix::Result<()> {
    // SAFETY: the caller's contract.
    unsafe { munmap(ptr.cast(), len) }
}

/// Zero `[offset, offset + len)` of a memfd by punching a hole (the size
/// stays; mappings stay valid and read zeros).
pub(crate) fn punch_hole(fd: BorrowedFd<'_>, offset: u64, len: u64) -> nix::Result<()> {
    let off = libc::off_t::try_from(offset).map_err(|_| Errno::EOVERFLOW)?;
    let len = libc::off_t::try_from(len).map_err(|_| Errno::EOVERFLOW)?;
    fallocate(
        fd,
        FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE,
        off,
        len,
    )
}

/// Add 1 to an eventfd's counter (one interrupt).
pub(crate) fn eventfd_signal(fd: BorrowedFd<'_>) -> nix::Result<()> {
    match nix::unistd::write(fd, &1u64.to_ne_bytes()) {
        Ok(8) => Ok(()),
        Ok(_) => Err(Errno::EIO),
        // The counter is saturated: the interrupt is pending anyway.
        Err(Errno::EAGAIN) => Ok(()),
        Err(e) => Err(e),
    }
}

/// The base page size.
pub(crate) fn page_size() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .and_then(|v| u64::try_from(v).ok())
        .unwrap_or(4096)
}

/// `IP_MTU_DISCOVER = IP_PMTUDISC_DO` (or the IPv6 option): DF set, never fragmented; an
/// unconnected IPv4 socket then sends identification 0, which the peer's ICRC check
/// predicts.
pub(crate) fn set_pmtudisc_do(fd: BorrowedFd<'_>, ipv6: bool) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let (level, name, value) = if ipv6 {
        (
            libc::IPPROTO_IPV6,
            libc::IPV6_MTU_DISCOVER,
            libc::IPV6_PMTUDISC_DO,
        )
    } else {
        (
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            libc::IP_PMTUDISC_DO,
        )
    };
    // SAFETY: `fd` is a live socket borrowed for the call; the option value points at a
    // c_int on this stack frame whose size is passed; the kernel only reads it.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&raw const value).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Receive and send buffers of `bytes` for a RoCE socket (the `*_FORCE` options first, which
/// a privileged process may use beyond `net.core.[rw]mem_max`; else capped there). Best
/// effort: the default (~208 KiB) drops most of a burst of a large message (the transport has
/// no congestion control, a 1 MiB WRITE leaves at once) and go-back-N resends it.
pub(crate) fn set_socket_buffers(fd: BorrowedFd<'_>, bytes: usize) {
    use nix::sys::socket::{setsockopt, sockopt};
    if setsockopt(&fd, sockopt::RcvBufForce, &bytes).is_err() {
        let _ = setsockopt(&fd, sockopt::RcvBuf, &bytes);
    }
    if setsockopt(&fd, sockopt::SndBufForce, &bytes).is_err() {
        let _ = setsockopt(&fd, sockopt::SndBuf, &bytes);
    }
}

/// The index of network interface `name` (`if_nametoindex`).
pub(crate) fn ifindex(name: &str) -> std::io::Result<u32> {
    nix::net::if_::if_nametoindex(name).map_err(std::io::Error::from)
}

/// An AF_PACKET raw socket (all ethertypes) bound to interface `ifindex`, in promiscuous
/// mode (`PACKET_MR_PROMISC`: frames for every MAC, the port filters them itself), not
/// receiving what it sends itself (`PACKET_IGNORE_OUTGOING`). Needs CAP_NET_RAW.
pub(crate) fn packet_socket(ifindex: u32) -> std::io::Result<OwnedFd> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockProtocol, SockType, socket};
    use std::os::fd::AsRawFd;
    let fd = socket(
        AddressFamily::Packet,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::EthAll,
    )?;
    let index = libc::c_int::try_from(ifindex).map_err(|_| Errno::EINVAL)?;
    // SAFETY: all-zero bytes are a valid `sockaddr_ll` (plain integers and a byte array).
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as libc::c_ushort;
    sll.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
    sll.sll_ifindex = index;
    // SAFETY: `fd` is a live socket we own; `sll` is a sockaddr_ll on this stack frame and its
    // exact size is passed; the kernel only reads it during the call.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&raw const sll).cast(),
            size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mreq = libc::packet_mreq {
        mr_ifindex: index,
        mr_type: libc::PACKET_MR_PROMISC as libc::c_ushort,
        mr_alen: 0,
        mr_address: [0; 8],
    };
    // SAFETY: as above: a live socket, a packet_mreq on this stack frame with its size; the
    // kernel copies it. The membership ends when the socket is closed.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_PACKET,
            libc::PACKET_ADD_MEMBERSHIP,
            (&raw const mreq).cast(),
            size_of::<libc::packet_mreq>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let one: libc::c_int = 1;
    // SAFETY: as above, with a c_int option value.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_PACKET,
            libc::PACKET_IGNORE_OUTGOING,
            (&raw const one).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: as above: a live socket, a c_int option value on this stack frame.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_PACKET,
            libc::PACKET_VNET_HDR,
            (&raw const one).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(fd)
}

/// Send one frame on a bound AF_PACKET socket.
pub(crate) fn packet_send(fd: BorrowedFd<'_>, frame: &[u8]) -> std::io::Result<usize> {
    use std::os::fd::AsRawFd;
    nix::sys::socket::send(fd.as_raw_fd(), frame, nix::sys::socket::MsgFlags::empty())
        .map_err(std::io::Error::from)
}

/// Receive one frame from an AF_PACKET socket, waiting up to `timeout`: its full length
/// (`MSG_TRUNC`: larger than `buf` when it was cut).
pub(crate) fn packet_recv(
    fd: BorrowedFd<'_>,
    buf: &mut [u8],
    timeout: std::time::Duration,
) -> std::io::Result<usize> {
    use nix::sys::socket::{MsgFlags, setsockopt, sockopt};
    use nix::sys::time::TimeVal;
    use std::os::fd::AsRawFd;
    let tv = TimeVal::new(
        i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX),
        i64::from(timeout.subsec_micros()),
    );
    setsockopt(&fd, sockopt::ReceiveTimeout, &tv)?;
    nix::sys::socket::recv(fd.as_raw_fd(), buf, MsgFlags::MSG_TRUNC).map_err(std::io::Error::from)
}
