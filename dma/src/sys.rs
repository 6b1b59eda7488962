//! Every system call rnic-dma makes, one function each, with typed results.
//!
//! Nothing above this module talks to the kernel. Unit tests (`cfg(test)`)
//! compile `sys_fake.rs` in its place: the same functions with the same
//! signatures, backed by heap memory and a scripted kernel, so the allocation
//! chain, placement checks, pinning checks and teardown order run in plain
//! `cargo test` with results this machine cannot produce (a second NUMA node,
//! an exhausted hugepage pool, a low `RLIMIT_MEMLOCK`). The integration tests
//! in `dma/tests/` link the crate without `cfg(test)` and so exercise this
//! module against the real kernel.
//!
//! Only [`munmap`] is `unsafe`: it is the one call that can invalidate memory
//! other code still points into. The others never change the contents of
//! memory (advice, binding, residency, queries) or create fresh mappings, so
//! they are safe to call with any address; the kernel validates the range.

use std::ffi::c_void;
use std::io;
use std::num::NonZeroUsize;
use std::ptr::NonNull;

use nix::sys::mman::{self, MapFlags, MmapAdvise, ProtFlags};
use nix::sys::resource::{Resource, getrlimit};
use nix::unistd::{SysconfVar, sysconf};

/// What kind of anonymous mapping to create.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MapKind {
    /// Base pages (the kernel may back it with THP after `madvise`).
    Base,
    /// hugetlbfs pages of 2 MiB (`MAP_HUGETLB | MAP_HUGE_2MB`).
    HugeTlb2M,
    /// hugetlbfs pages of 1 GiB (`MAP_HUGETLB | MAP_HUGE_1GB`).
    HugeTlb1G,
}

/// The mempolicy `get_mempolicy(MPOL_F_ADDR)` reports for an address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct MemPolicy {
    /// `MPOL_DEFAULT`, `MPOL_BIND`, ...
    pub(crate) mode: i32,
    /// The node mask, one bit per node, `c_ulong` words.
    pub(crate) nodes: Vec<libc::c_ulong>,
}

/// `MPOL_F_ADDR` from `include/uapi/linux/mempolicy.h` (libc lacks it):
/// report the policy of the given address instead of the thread's.
const MPOL_F_ADDR: libc::c_ulong = 1 << 1;

/// Words of node mask passed to `get_mempolicy` (1024 nodes, the kernel's
/// largest `MAX_NUMNODES`).
const MASK_WORDS: usize = 16;

fn errno(e: nix::Error) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

/// The base page size (`sysconf(_SC_PAGESIZE)`), 4096 on x86_64.
pub(crate) fn base_page_size() -> usize {
    match sysconf(SysconfVar::PAGE_SIZE) {
        Ok(Some(n)) if n > 0 => n as usize,
        _ => 4096,
    }
}

/// `mmap(NULL, len, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS[|MAP_HUGETLB|size], -1, 0)`.
///
/// Without `MAP_NORESERVE`, a hugetlb mapping reserves its pages now, so an
/// exhausted pool fails here with `ENOMEM` rather than with `SIGBUS` at fault
/// time.
pub(crate) fn mmap_anonymous(len: usize, kind: MapKind) -> io::Result<NonNull<u8>> {
    let len = NonZeroUsize::new(len).ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
    let mut flags = MapFlags::MAP_PRIVATE | MapFlags::MAP_ANONYMOUS;
    match kind {
        MapKind::Base => {}
        MapKind::HugeTlb2M => flags |= MapFlags::MAP_HUGETLB | MapFlags::MAP_HUGE_2MB,
        MapKind::HugeTlb1G => flags |= MapFlags::MAP_HUGETLB | MapFlags::MAP_HUGE_1GB,
    }
    // SAFETY: no address hint and no MAP_FIXED, so the kernel picks a fresh
    // range and no existing mapping (nor any memory Rust code points into)
    // is replaced. The caller owns the returned range.
    let ptr = unsafe {
        mman::mmap_anonymous(
            None,
            len,
            ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
            flags,
        )
    }
    .map_err(errno)?;
    Ok(ptr.cast())
}

/// An anonymous base-page mapping of `len` bytes whose start is aligned to
/// `align` (a power of two): `mmap(len + align)`, then `munmap` of the
/// unaligned head and the tail. Used for THP, which the kernel only backs
/// with huge pages at 2 MiB-aligned addresses.
pub(crate) fn mmap_anonymous_aligned(len: usize, align: usize) -> io::Result<NonNull<u8>> {
    let einval = || io::Error::from_raw_os_error(libc::EINVAL);
    if !align.is_power_of_two() {
        return Err(einval());
    }
    let total = len.checked_add(align).ok_or_else(einval)?;
    let raw = mmap_anonymous(total, MapKind::Base)?;
    let start = raw.as_ptr() as usize;
    let aligned = start.next_multiple_of(align);
    let head = aligned - start;
    let tail = total - head - len;
    if head > 0 {
        // SAFETY: [start, start + head) is the head of the mapping created
        // just above; nothing has been given a pointer into it.
        unsafe { munmap(raw, head) }?;
    }
    let kept = raw.as_ptr().wrapping_add(head);
    if tail > 0 {
        let tail_ptr = NonNull::new(kept.wrapping_add(len)).ok_or_else(einval)?;
        // SAFETY: [aligned + len, start + total) is the tail of the mapping
        // created just above; nothing has been given a pointer into it.
        unsafe { munmap(tail_ptr, tail) }?;
    }
    NonNull::new(kept).ok_or_else(einval)
}

/// `munmap(addr, len)`.
///
/// # Safety
///
/// `[addr, addr + len)` must be (part of) a mapping the caller owns, created
/// by [`mmap_anonymous`] or [`mmap_anonymous_aligned`], and nothing may use a
/// pointer into it afterwards: the range is returned to the kernel and a later
/// `mmap` may reuse the addresses.
pub(crate) unsafe fn munmap(addr: NonNull<u8>, len: usize) -> io::Result<()> {
    // SAFETY: forwarded from this function's contract: the caller owns the
    // range and stops using it.
    unsafe { mman::munmap(addr.cast::<c_void>(), len) }.map_err(errno)
}

/// `madvise(addr, len, MADV_HUGEPAGE)`: ask for transparent hugepages.
pub(crate) fn madvise_hugepage(addr: NonNull<u8>, len: usize) -> io::Result<()> {
    // SAFETY: MADV_HUGEPAGE is advice about backing; it never changes the
    // contents of memory, so any range is memory-safe (the kernel rejects
    // unmapped ones with ENOMEM).
    unsafe { mman::madvise(addr.cast::<c_void>(), len, MmapAdvise::MADV_HUGEPAGE) }.map_err(errno)
}

/// `madvise(addr, len, MADV_POPULATE_WRITE)` (Linux 5.14+): fault in every
/// page writable, under the range's mempolicy, and report failure as an errno
/// (`ENOMEM`, `EFAULT`) instead of the `SIGBUS` a touching loop would take
/// when a hugetlb pool or a bound node runs dry. `EINVAL` means the kernel
/// predates the advice.
pub(crate) fn populate_write(addr: NonNull<u8>, len: usize) -> io::Result<()> {
    // SAFETY: populating allocates zero-filled pages where none are present
    // and leaves present pages untouched ("without actually writing"), so no
    // byte changes; the kernel rejects unmapped ranges.
    unsafe { mman::madvise(addr.cast::<c_void>(), len, MmapAdvise::MADV_POPULATE_WRITE) }
        .map_err(errno)
}

/// `mbind(addr, len, MPOL_BIND, {node}, maxnode, 0)`: future faults in the
/// range allocate on `node` only.
pub(crate) fn mbind_bind(addr: NonNull<u8>, len: usize, node: u32) -> io::Result<()> {
    let words = node as usize / 64 + 1;
    let mut mask = vec![0 as libc::c_ulong; words];
    mask[node as usize / 64] |= 1 << (node % 64);
    // The kernel reads `maxnode - 1` bits (a historical off-by-one that
    // libnuma also compensates for), so pass one more than the mask holds.
    let maxnode = (words * 64 + 1) as libc::c_ulong;
    // SAFETY: mbind reads `words` longs from `mask`, which is live for the
    // call; it changes the policy of the range, never its contents (no
    // MPOL_MF_MOVE), so any range is memory-safe.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mbind,
            addr.as_ptr() as libc::c_ulong,
            len as libc::c_ulong,
            libc::MPOL_BIND as libc::c_ulong,
            mask.as_ptr(),
            maxnode,
            0 as libc::c_ulong,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `get_mempolicy(&mode, mask, maxnode, addr, MPOL_F_ADDR)`: the policy that
/// governs `addr`.
pub(crate) fn mempolicy_of(addr: NonNull<u8>) -> io::Result<MemPolicy> {
    let mut mode: libc::c_int = 0;
    let mut mask = [0 as libc::c_ulong; MASK_WORDS];
    // SAFETY: the kernel writes one int to `mode` and at most MASK_WORDS
    // longs (maxnode bits) to `mask`, both live locals; addr is only looked up.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_get_mempolicy,
            &mut mode as *mut libc::c_int,
            mask.as_mut_ptr(),
            (MASK_WORDS * 64) as libc::c_ulong,
            addr.as_ptr() as libc::c_ulong,
            MPOL_F_ADDR,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(MemPolicy {
        mode,
        nodes: mask.to_vec(),
    })
}

/// `move_pages(0, n, pages, NULL, status, 0)`: with no target nodes this only
/// queries; `status[i]` becomes the node of the page holding `pages[i]`, or a
/// negative errno (`-ENOENT`: not present).
pub(crate) fn query_page_nodes(pages: &[usize], status: &mut [i32]) -> io::Result<()> {
    if pages.len() != status.len() {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let ptrs: Vec<*mut c_void> = pages.iter().map(|&a| a as *mut c_void).collect();
    // SAFETY: the kernel reads `n` pointers from `ptrs` and writes `n` ints
    // to `status`, both live and of length n; with `nodes` NULL it moves
    // nothing, so the pages' contents are untouched.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_pages,
            0 as libc::c_int,
            ptrs.len() as libc::c_ulong,
            ptrs.as_ptr(),
            std::ptr::null::<libc::c_int>(),
            status.as_mut_ptr(),
            0 as libc::c_int,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `mlock(addr, len)`: fault in and pin the range.
pub(crate) fn mlock(addr: NonNull<u8>, len: usize) -> io::Result<()> {
    // SAFETY: mlock changes residency, never contents; the kernel rejects
    // unmapped ranges with ENOMEM.
    unsafe { mman::mlock(addr.cast::<c_void>(), len) }.map_err(errno)
}

/// `munlock(addr, len)`.
pub(crate) fn munlock(addr: NonNull<u8>, len: usize) -> io::Result<()> {
    // SAFETY: munlock changes residency, never contents.
    unsafe { mman::munlock(addr.cast::<c_void>(), len) }.map_err(errno)
}

/// The soft `RLIMIT_MEMLOCK` in bytes (`u64::MAX` when unlimited).
pub(crate) fn memlock_limit() -> io::Result<u64> {
    let (soft, _hard) = getrlimit(Resource::RLIMIT_MEMLOCK).map_err(errno)?;
    Ok(if soft == libc::RLIM_INFINITY {
        u64::MAX
    } else {
        soft
    })
}

/// Read a sysfs or procfs file into a string.
pub(crate) fn read_file(path: &str) -> io::Result<String> {
    std::fs::read_to_string(path)
}
