//! Every system call of rnic-mlx5, one function each (STYLE habit 4): memfd
//! creation and sealing, shared mappings, eventfds. Typed results
//! (`nix::Result`); the callers add context.

use std::ffi::CStr;
use std::num::NonZeroUsize;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::{FcntlArg, SealFlag, fcntl};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::memfd::{MFdFlags, memfd_create};
use nix::sys::mman::{
    MapFlags, MmapAdvise, ProtFlags, madvise, mmap, mmap_anonymous, mprotect, munmap,
};

/// `memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING [| MFD_HUGETLB | huge size])`.
pub(crate) fn memfd(name: &CStr, huge_2m: bool) -> nix::Result<OwnedFd> {
    let mut flags = MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING;
    if huge_2m {
        flags |= MFdFlags::MFD_HUGETLB | MFdFlags::MFD_HUGE_2MB;
    }
    memfd_create(name, flags)
}

/// `ftruncate(fd, len)`.
pub(crate) fn truncate(fd: BorrowedFd<'_>, len: u64) -> nix::Result<()> {
    let len = libc::off_t::try_from(len).map_err(|_| Errno::EFBIG)?;
    nix::unistd::ftruncate(fd, len)
}

/// `fcntl(F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)`: the size
/// can never change again, so a peer that mmapped the file can never be hit
/// by `SIGBUS` from a truncation.
pub(crate) fn seal_size(fd: BorrowedFd<'_>) -> nix::Result<()> {
    fcntl(
        fd,
        FcntlArg::F_ADD_SEALS(
            SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL,
        ),
    )
    .map(drop)
}

/// `mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED [| MAP_POPULATE], fd, offset)`.
pub(crate) fn mmap_shared(
    fd: BorrowedFd<'_>,
    offset: u64,
    len: usize,
    populate: bool,
) -> nix::Result<NonNull<u8>> {
    let length = NonZeroUsize::new(len).ok_or(Errno::EINVAL)?;
    let offset = libc::off_t::try_from(offset).map_err(|_| Errno::EOVERFLOW)?;
    let mut flags = MapFlags::MAP_SHARED;
    if populate {
        flags |= MapFlags::MAP_POPULATE;
    }
    // SAFETY: a fresh mapping chosen by the kernel (addr = NULL) aliases no
    // Rust object; the caller owns it and unmaps it with `unmap`.
    let ptr = unsafe {
        mmap(
            None,
            length,
            ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
            flags,
            fd,
            offset,
        )
    }?;
    Ok(ptr.cast())
}

/// `munmap(ptr, len)`.
///
/// # Safety
///
/// `[ptr, ptr + len)` must be exactly one mapping made by [`mmap_shared`]
/// that nothing will access again.
pub(crate) unsafe fn unmap(ptr: NonNull<u8>, len: usize) -> nix::Result<()> {
    // SAFETY: the caller's contract.
    unsafe { munmap(ptr.cast(), len) }
}

/// `mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS)`:
/// fresh zeroed private pages at an address the kernel chooses.
pub(crate) fn mmap_private(len: usize) -> nix::Result<NonNull<u8>> {
    let length = NonZeroUsize::new(len).ok_or(Errno::EINVAL)?;
    // SAFETY: a fresh mapping chosen by the kernel (addr = NULL) aliases no
    // Rust object; the caller owns it (moves it with `move_mapping` or
    // unmaps it with `unmap`).
    let ptr = unsafe {
        mmap_anonymous(
            None,
            length,
            ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
            MapFlags::MAP_PRIVATE,
        )
    }?;
    Ok(ptr.cast())
}

/// `mremap(from, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, to)`: the
/// mapping at `from` now lies at `to`, replacing in one step whatever was
/// mapped at `[to, to + len)` (never a moment where the range is unmapped).
///
/// Made as a raw system call, not through libc's `mremap`: memory-event
/// hooks that programs install over libc's symbol (UCX's UCM patches every
/// loaded object's `mremap` relocation with a four-argument hook) drop the
/// fifth argument, and the kernel would then move the pages to address 0.
///
/// # Safety
///
/// `[from, from + len)` is one whole mapping the caller owns and nothing
/// else refers to; whatever `[to, to + len)` held is discarded, so the caller
/// must have copied what it needs out of it and must know that no other
/// thread uses those pages during the call.
pub(crate) unsafe fn move_mapping(
    from: NonNull<u8>,
    len: usize,
    to: NonNull<u8>,
) -> nix::Result<()> {
    let flags = libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED;
    // SAFETY: the caller's contract; the kernel reads only the five
    // arguments of mremap(2).
    let r = unsafe {
        libc::syscall(
            libc::SYS_mremap,
            from.as_ptr(),
            len,
            len,
            flags,
            to.as_ptr(),
        )
    };
    if r == -1 {
        return Err(Errno::last());
    }
    if r as usize != to.as_ptr() as usize {
        // The kernel honours MREMAP_FIXED or fails; anything else is a
        // broken contract we must not build on.
        return Err(Errno::EFAULT);
    }
    Ok(())
}

/// `mprotect(ptr, len, prot)` with `prot` built from read/write/execute.
///
/// # Safety
///
/// `[ptr, ptr + len)` is page-aligned memory of this process whose
/// protection the caller may set: no Rust reference into it relies on an
/// access the new protection removes.
pub(crate) unsafe fn protect(ptr: NonNull<u8>, len: usize, rwx: [bool; 3]) -> nix::Result<()> {
    let mut prot = ProtFlags::PROT_NONE;
    for (on, flag) in rwx.into_iter().zip([
        ProtFlags::PROT_READ,
        ProtFlags::PROT_WRITE,
        ProtFlags::PROT_EXEC,
    ]) {
        if on {
            prot |= flag;
        }
    }
    // SAFETY: the caller's contract.
    unsafe { mprotect(ptr.cast(), len, prot) }
}

/// `madvise(ptr, len, MADV_DONTFORK)`: a child made by `fork` gets no
/// mapping there (as libibverbs' `ibv_fork_init` does for registered memory).
pub(crate) fn dont_fork(ptr: NonNull<u8>, len: usize) -> nix::Result<()> {
    // SAFETY: MADV_DONTFORK changes only what a future child inherits; it
    // never changes the pages or their contents in this process.
    unsafe { madvise(ptr.cast(), len, MmapAdvise::MADV_DONTFORK) }
}

/// The inode number of `fd`'s file (how `/proc/self/maps` names it).
pub(crate) fn inode(fd: BorrowedFd<'_>) -> nix::Result<u64> {
    nix::sys::stat::fstat(fd).map(|s| s.st_ino)
}

/// `/proc/self/maps`, read whole.
pub(crate) fn self_maps() -> std::io::Result<String> {
    std::fs::read_to_string("/proc/self/maps")
}

/// A non-blocking, close-on-exec eventfd (one interrupt vector).
pub(crate) fn eventfd() -> nix::Result<EventFd> {
    EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
}

/// Wait until `fd` is readable or `timeout` passes (clamped to ~65 s);
/// whether it became readable.
pub(crate) fn wait_readable(fd: BorrowedFd<'_>, timeout: Duration) -> nix::Result<bool> {
    let ms = u16::try_from(timeout.as_millis()).unwrap_or(u16::MAX);
    let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
    loop {
        match poll(&mut fds, PollTimeout::from(ms)) {
            Ok(n) => return Ok(n > 0),
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Wait until `a` or `b` is readable or `timeout` passes (clamped to ~65 s);
/// which of them became readable.
pub(crate) fn wait_either(
    a: BorrowedFd<'_>,
    b: BorrowedFd<'_>,
    timeout: Duration,
) -> nix::Result<(bool, bool)> {
    let ms = u16::try_from(timeout.as_millis()).unwrap_or(u16::MAX);
    let mut fds = [
        PollFd::new(a, PollFlags::POLLIN),
        PollFd::new(b, PollFlags::POLLIN),
    ];
    loop {
        match poll(&mut fds, PollTimeout::from(ms)) {
            Ok(_) => {
                let ready = |f: &PollFd<'_>| f.revents().is_some_and(|r| !r.is_empty());
                return Ok((ready(&fds[0]), ready(&fds[1])));
            }
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Add 1 to an eventfd's counter (a notification; a full counter is left
/// as it is: the reader sees it readable either way).
pub(crate) fn eventfd_signal(fd: &EventFd) {
    let _ = fd.write(1);
}

/// Read (and so reset) an eventfd's counter; `None` when it is zero.
pub(crate) fn eventfd_take(fd: &EventFd) -> nix::Result<Option<u64>> {
    match fd.read() {
        Ok(n) => Ok(Some(n)),
        Err(Errno::EAGAIN) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Duplicate a descriptor (close-on-exec).
pub(crate) fn dup(fd: BorrowedFd<'_>) -> std::io::Result<OwnedFd> {
    fd.as_fd().try_clone_to_owned()
}

/// The base page size.
pub(crate) fn page_size() -> usize {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .and_then(|v| usize::try_from(v).ok())
        .unwrap_or(4096)
}

/// The soft `RLIMIT_MEMLOCK` in bytes; `None` when unlimited.
pub(crate) fn memlock_limit() -> Option<u64> {
    match nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_MEMLOCK) {
        Ok((soft, _)) if soft != nix::sys::resource::RLIM_INFINITY => Some(soft),
        _ => None,
    }
}

/// Whether the process has `CAP_IPC_LOCK` in its effective set (then
/// `RLIMIT_MEMLOCK` does not bind it): bit 14 of `CapEff` in
/// `/proc/self/status`.
pub(crate) fn has_cap_ipc_lock() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_some_and(|caps| caps & (1 << 14) != 0)
}

/// vfio_iommu_type1's `dma_entry_limit` (mappings per container; 65535 by
/// default), when the module is loaded.
pub(crate) fn vfio_dma_entry_limit() -> Option<u64> {
    std::fs::read_to_string("/sys/module/vfio_iommu_type1/parameters/dma_entry_limit")
        .ok()
        .and_then(|s| s.trim().parse().ok())
}
