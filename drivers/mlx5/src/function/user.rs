//! Application memory registered in place: [`UserPages`], the pages of a
//! range the driver did not allocate (a `malloc`ed buffer, an anonymous
//! `mmap`, a `Vec`), mapped into the function's IOVA space so that an MKey
//! can name them (`Mkey::new_user`, `Mlx5Provider::reg_mr`).
//!
//! # The two transports
//!
//! - **Kernel VFIO** ([`Sharing::Pin`]): the page-rounded range is mapped
//!   as it is with one `VFIO_IOMMU_MAP_DMA` of its virtual address, which
//!   pins the pages (counted against `RLIMIT_MEMLOCK`); the IOMMU then
//!   reaches the very pages the application uses. A registration granting
//!   no write access is mapped for the device to read only
//!   (`Mapper::map_read_only`): its writes fault in the IOMMU, and memory
//!   the process mapped read-only can be registered.
//! - **vfio-user** ([`Sharing::Memfd`]): the device is another process and
//!   reaches only memory passed to it by file descriptor (`DMA_MAP` with an
//!   fd; the `vfio_user` 0.1.7 client offers nothing else — no fd-less
//!   regions served through `DMA_READ`/`DMA_WRITE` messages, and the
//!   emulator would then need a message per access). So the range is made
//!   shareable **in place**: its pages' current contents are copied into a
//!   sealed memfd mapped `MAP_SHARED` elsewhere, and that mapping is moved
//!   over the range with one `mremap(MREMAP_FIXED)` — the range is never
//!   unmapped, its addresses and contents stay, only the pages behind it
//!   change — and the memfd goes to the device with `DMA_MAP`. When the last
//!   registration using those pages goes (after the device unmapped them),
//!   the contents are moved back onto private anonymous pages the same way,
//!   so after deregistration the memory is exactly what it was: private,
//!   same contents, same protection. Pages the driver shares already (its
//!   own `SharedMemory`, or a range an earlier registration moved) are
//!   passed by their fd; a range is split where its backing changes, each
//!   piece one `DMA_MAP` at consecutive IOVAs.
//!
//! # The contract of the vfio-user route
//!
//! - Registration and the last deregistration of a range copy its pages:
//!   other threads must not write those pages (which include the bytes
//!   around the range in its first and last page) while the call runs — a
//!   write in that window may be lost. This is the one rule beyond
//!   libibverbs' own (the range stays mapped while registered).
//! - Only private mappings are moved (`MAP_PRIVATE`: heap, anonymous
//!   `mmap`, stacks, private file mappings). A `MAP_SHARED` mapping the
//!   driver did not make is refused ([`UserMemoryProblem::Shared`]): moving
//!   it would end its sharing with other processes.
//! - Anonymous hugetlb memory (`MAP_HUGETLB`) is refused
//!   ([`UserMemoryProblem::Hugetlb`]): part of a huge page cannot be
//!   replaced by 4 KiB memfd pages, and moving whole huge pages would take
//!   the pool's pages behind the application's back. Kernel VFIO pins
//!   hugetlb pages in place like any other.
//! - While moved, the pages carry `MADV_DONTFORK`, as libibverbs'
//!   `ibv_fork_init` gives registered memory: a child made by `fork` gets no
//!   mapping there (instead of sharing the parent's pages, which a
//!   `MAP_SHARED` mapping would otherwise do). After deregistration the
//!   pages are private again and fork as any other memory.
//! - If the application unmaps or replaces registered memory before
//!   deregistering it (a verbs contract violation), deregistration finds the
//!   range no longer the driver's memfd (`/proc/self/maps` by inode), leaves
//!   it alone and logs it.
//!
//! IOVAs come from the function's [`IovaSpace`], the allocator its own DMA
//! buffers use, so the two never collide. Teardown order (enforced by
//! ownership in `Mkey`): DESTROY_MKEY → device unmap → IOVA free → pages
//! back → the application may free the memory.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rnic_core::Iova;
use tracing::{debug, error, warn};

use crate::error::{Mlx5Error, UserMemoryProblem};
use crate::function::memory::{IovaSpace, lock, next_shared_base, shared_extent};
use crate::sys;

/// How a transport gives application pages to its device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sharing {
    /// The IOMMU maps (and pins) the pages where they are: kernel VFIO.
    Pin,
    /// The device maps file descriptors: the pages are moved onto a memfd
    /// in place (see the module docs): vfio-user.
    Memfd,
}

/// Page size of the MTT and of every mapping made here.
const PAGE: usize = 4096;

/// One line of `/proc/self/maps`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MapsEntry {
    lo: usize,
    hi: usize,
    /// Read, write, execute.
    rwx: [bool; 3],
    shared: bool,
    inode: u64,
    /// Anonymous hugetlb memory (`MAP_HUGETLB`, shown as `/anon_hugepage`).
    hugetlb: bool,
}

/// The lines of `/proc/<pid>/maps` text (unparseable lines skipped).
pub(crate) fn parse_maps(maps: &str) -> Vec<MapsEntry> {
    maps.lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let (lo, hi) = f.next()?.split_once('-')?;
            let perms = f.next()?.as_bytes();
            let _offset = f.next()?;
            let _dev = f.next()?;
            let inode = f.next()?.parse().ok()?;
            let path = f.next().unwrap_or("");
            Some(MapsEntry {
                lo: usize::from_str_radix(lo, 16).ok()?,
                hi: usize::from_str_radix(hi, 16).ok()?,
                rwx: [
                    perms.first() == Some(&b'r'),
                    perms.get(1) == Some(&b'w'),
                    perms.get(2) == Some(&b'x'),
                ],
                shared: perms.get(3) == Some(&b's'),
                inode,
                hugetlb: path == "/anon_hugepage",
            })
        })
        .collect()
}

/// The mappings covering `[start, end)`, clipped to it: the whole range
/// mapped and readable (and writable when `writable`), or the problem.
pub(crate) fn covering(
    maps: &[MapsEntry],
    start: usize,
    end: usize,
    writable: bool,
) -> Result<Vec<MapsEntry>, UserMemoryProblem> {
    let mut at = start;
    let mut out = Vec::new();
    for e in maps.iter().filter(|e| e.hi > start && e.lo < end) {
        if e.lo > at {
            break;
        }
        if !e.rwx[0] {
            return Err(UserMemoryProblem::Unmapped { at: e.lo.max(at) });
        }
        if writable && !e.rwx[1] {
            return Err(UserMemoryProblem::ReadOnly { at: e.lo.max(at) });
        }
        out.push(MapsEntry {
            lo: e.lo.max(start),
            hi: e.hi.min(end),
            ..*e
        });
        at = e.hi;
        if at >= end {
            return Ok(out);
        }
    }
    Err(UserMemoryProblem::Unmapped { at })
}

/// A range of application memory the driver moved onto a memfd.
struct Swap {
    len: usize,
    fd: Arc<OwnedFd>,
    inode: u64,
    /// The protections to keep: (offset, length, rwx) per original mapping.
    prot: Vec<(usize, usize, [bool; 3])>,
    /// Registrations using (part of) it.
    refs: usize,
}

/// Every moved range, by its first byte.
static SWAPS: Mutex<BTreeMap<usize, Swap>> = Mutex::new(BTreeMap::new());

/// The memfd and offset of `[addr, end)` when one moved range holds it all.
pub(crate) fn swapped_fd(addr: usize, end: usize) -> Option<(Arc<OwnedFd>, u64)> {
    let swaps = lock(&SWAPS);
    let (&base, s) = swaps.range(..=addr).next_back()?;
    (end <= base + s.len).then(|| (s.fd.clone(), (addr - base) as u64))
}

/// Copy `len` bytes (a multiple of 8, both ends 8-aligned) from `from` to
/// `to`, word by word.
///
/// # Safety
///
/// Both ranges are mapped, readable (`to` writable) and do not overlap;
/// only atomic words are formed over them.
unsafe fn copy_words(from: usize, to: NonNull<u8>, len: usize) {
    let n = len / 8;
    // SAFETY: the caller's contract: mapped, 8-aligned, `len` bytes; the
    // bytes may change behind us (another thread, against the contract), so
    // they are seen only as atomics, never as plain references.
    let src = unsafe { std::slice::from_raw_parts(from as *const AtomicU64, n) };
    // SAFETY: as `src`: the caller's writable mapping of `len` bytes.
    let dst =
        unsafe { std::slice::from_raw_parts(to.as_ptr().cast::<AtomicU64>().cast_const(), n) };
    for (s, d) in src.iter().zip(dst) {
        d.store(s.load(Ordering::Relaxed), Ordering::Relaxed);
    }
}

/// Move `[start, start + len)`'s pages (private mappings, readable: the
/// caller checked) onto a fresh sealed memfd in place.
fn swap_in(start: usize, len: usize, parts: &[MapsEntry]) -> Result<Swap, UserMemoryProblem> {
    let share = |step| move |source| UserMemoryProblem::Share { step, source };
    let fd = sys::memfd(c"rnic-mr", false).map_err(share("memfd_create"))?;
    sys::truncate(fd.as_fd(), len as u64).map_err(share("ftruncate"))?;
    sys::seal_size(fd.as_fd()).map_err(share("fcntl(F_ADD_SEALS)"))?;
    let inode = sys::inode(fd.as_fd()).map_err(share("fstat"))?;
    let tmp = sys::mmap_shared(fd.as_fd(), 0, len, false).map_err(share("mmap"))?;
    let target = NonNull::new(start as *mut u8).ok_or(UserMemoryProblem::Empty)?;
    // SAFETY: `start..start + len` is mapped readable (checked by the
    // caller against /proc/self/maps), `tmp` is our fresh writable mapping
    // of `len` bytes; both page-aligned.
    unsafe { copy_words(start, tmp, len) };
    // SAFETY: `tmp` is one whole mapping of ours; the pages at `target`
    // were copied into it just now and the module's contract keeps other
    // threads from writing them during the call.
    if let Err(e) = unsafe { sys::move_mapping(tmp, len, target) } {
        // SAFETY: `tmp` is still our own mapping; nothing refers to it.
        if let Err(u) = unsafe { sys::unmap(tmp, len) } {
            error!(%u, "munmap of a discarded memfd mapping failed");
        }
        return Err(UserMemoryProblem::Share {
            step: "mremap",
            source: e,
        });
    }
    let prot: Vec<_> = parts
        .iter()
        .map(|p| (p.lo - start, p.hi - p.lo, p.rwx))
        .collect();
    restore_protection(start, &prot);
    if let Err(e) = sys::dont_fork(target, len) {
        warn!(start, len, %e, "MADV_DONTFORK on registered memory failed: a fork would share it");
    }
    debug!(
        start = format_args!("{start:#x}"),
        len, "application pages moved onto a memfd"
    );
    Ok(Swap {
        len,
        fd: Arc::new(fd),
        inode,
        prot,
        refs: 1,
    })
}

/// Give the pieces of `[start, ..)` the protections they had.
fn restore_protection(start: usize, prot: &[(usize, usize, [bool; 3])]) {
    for &(off, len, rwx) in prot.iter().filter(|p| p.2 != [true, true, false]) {
        let Some(at) = NonNull::new((start + off) as *mut u8) else {
            continue;
        };
        // SAFETY: the range is the application's own mapping and gets back
        // the protection it had; the driver holds no reference into it.
        if let Err(e) = unsafe { sys::protect(at, len, rwx) } {
            warn!(at = format_args!("{:#x}", start + off), len, %e, "mprotect back failed");
        }
    }
}

/// Move a range back onto private anonymous pages (its last registration
/// is gone and the device has unmapped it).
fn swap_out(start: usize, s: &Swap) {
    let still_ours = sys::self_maps().ok().is_some_and(|m| {
        covering(&parse_maps(&m), start, start + s.len, false)
            .is_ok_and(|parts| parts.iter().all(|p| p.shared && p.inode == s.inode))
    });
    if !still_ours {
        warn!(
            start = format_args!("{start:#x}"),
            len = s.len,
            "registered memory was unmapped or replaced before it was deregistered (a verbs \
             contract violation); left as it is"
        );
        return;
    }
    let Some(target) = NonNull::new(start as *mut u8) else {
        return;
    };
    let tmp = match sys::mmap_private(s.len) {
        Ok(t) => t,
        Err(e) => {
            warn!(start, len = s.len, %e, "no private pages to move registered memory back to: \
                  it stays on its memfd (same contents, shared mapping)");
            return;
        }
    };
    // The range may have been made read-only: copying out needs read only.
    // SAFETY: `target..+len` is our memfd mapping (checked above), readable
    // (the caller registered it readable and `restore_protection` keeps
    // that); `tmp` is fresh and writable.
    unsafe { copy_words(start, tmp, s.len) };
    // SAFETY: `tmp` is one whole mapping of ours holding the range's
    // contents; the device no longer maps the memfd and the module's
    // contract keeps other threads from writing the pages during the call.
    if let Err(e) = unsafe { sys::move_mapping(tmp, s.len, target) } {
        warn!(start, len = s.len, %e, "mremap back failed: the memory stays on its memfd");
        // SAFETY: `tmp` is still our own mapping; nothing refers to it.
        let _ = unsafe { sys::unmap(tmp, s.len) };
        return;
    }
    restore_protection(start, &s.prot);
}

/// Drop one reference to each moved range in `keys`; those no registration
/// uses any more go back to private pages.
fn release(swaps: &mut BTreeMap<usize, Swap>, keys: &[usize]) {
    for k in keys {
        let last = swaps.get_mut(k).is_some_and(|s| {
            s.refs -= 1;
            s.refs == 0
        });
        if last && let Some(s) = swaps.remove(k) {
            swap_out(*k, &s);
        }
    }
}

/// A piece of a range to map: host start, length, and whether it must be
/// moved onto a memfd first.
struct Piece {
    start: usize,
    len: usize,
    kind: PieceKind,
}

enum PieceKind {
    /// The driver's own `SharedMemory`.
    Own,
    /// A range moved by an earlier registration (by its key).
    Moved(usize),
    /// Private pages to move.
    Private,
}

/// Split `[start, end)` where its backing changes.
fn plan(
    swaps: &BTreeMap<usize, Swap>,
    parts: &[MapsEntry],
    start: usize,
    end: usize,
) -> Result<Vec<Piece>, UserMemoryProblem> {
    let mut pieces = Vec::new();
    let mut at = start;
    while at < end {
        let moved = swaps
            .range(..=at)
            .next_back()
            .filter(|(k, s)| at < *k + s.len)
            .map(|(&k, s)| (k, k + s.len));
        let (to, kind) = if let Some((base, len)) = shared_extent(at) {
            ((base + len).min(end), PieceKind::Own)
        } else if let Some((k, hi)) = moved {
            (hi.min(end), PieceKind::Moved(k))
        } else {
            let next_swap = swaps.range(at + 1..).next().map_or(usize::MAX, |(&k, _)| k);
            let next_own = next_shared_base(at).unwrap_or(usize::MAX);
            let to = end.min(next_swap).min(next_own);
            if let Some(p) = parts.iter().find(|p| p.shared && p.hi > at && p.lo < to) {
                return Err(UserMemoryProblem::Shared { at: p.lo.max(at) });
            }
            if let Some(p) = parts.iter().find(|p| p.hugetlb && p.hi > at && p.lo < to) {
                return Err(UserMemoryProblem::Hugetlb { at: p.lo.max(at) });
            }
            (to, PieceKind::Private)
        };
        pieces.push(Piece {
            start: at,
            len: to - at,
            kind,
        });
        at = to;
    }
    Ok(pieces)
}

/// Application pages mapped for a function (see the module docs). Dropping
/// it unmaps them from the device, frees the IOVAs and — over vfio-user —
/// moves the pages back onto private memory when no other registration
/// uses them.
pub struct UserPages {
    space: Arc<IovaSpace>,
    iova: Iova,
    start: usize,
    len: usize,
    /// What was mapped: (IOVA, length) per piece.
    mapped: Vec<(Iova, u64)>,
    /// The moved ranges this registration holds a reference to.
    swaps: Vec<usize>,
}

impl std::fmt::Debug for UserPages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserPages")
            .field("start", &format_args!("{:#x}", self.start))
            .field("len", &self.len)
            .field("iova", &self.iova)
            .field("pieces", &self.mapped.len())
            .finish_non_exhaustive()
    }
}

impl UserPages {
    /// The device address of the first page.
    pub fn iova(&self) -> Iova {
        self.iova
    }

    /// Host address of the first page (the range rounded down to 4 KiB).
    pub fn start(&self) -> usize {
        self.start
    }

    /// Bytes mapped (whole pages).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// How many device mappings (`DMA_MAP`s) the range took.
    pub fn pieces(&self) -> usize {
        self.mapped.len()
    }
}

impl Drop for UserPages {
    fn drop(&mut self) {
        let mut unmapped = true;
        for &(iova, len) in self.mapped.iter().rev() {
            if let Err(e) = self.space.mapper.unmap(iova, len) {
                warn!(%iova, len, %e, "device unmap of application memory failed: its IOVA and \
                      pages are kept so the device cannot reach reused memory");
                unmapped = false;
            }
        }
        if !unmapped {
            return;
        }
        if let Err(e) = lock(&self.space.alloc).free(self.iova) {
            error!(iova = %self.iova, %e, "IOVA free failed");
        }
        release(&mut lock(&SWAPS), &self.swaps);
    }
}

impl IovaSpace {
    /// Map the application's `[addr, addr + len)` (whole pages around it)
    /// at an IOVA of this space; see the module docs. `writable`: the
    /// region grants some write access, so every page must be writable.
    /// Every failure leaves the memory and the space as they were.
    pub fn map_user(
        self: &Arc<Self>,
        addr: usize,
        len: usize,
        writable: bool,
        sharing: Sharing,
    ) -> Result<UserPages, Mlx5Error> {
        let refuse = |problem| Mlx5Error::UserMemory {
            function: self.function.clone(),
            addr,
            len,
            problem,
        };
        if len == 0 || addr == 0 {
            return Err(refuse(UserMemoryProblem::Empty));
        }
        let start = addr & !(PAGE - 1);
        let end = addr
            .checked_add(len)
            .and_then(|e| e.checked_next_multiple_of(PAGE))
            .ok_or(refuse(UserMemoryProblem::Unmapped { at: addr }))?;
        let maps = sys::self_maps().map_err(|source| refuse(UserMemoryProblem::Maps { source }))?;
        let parts = covering(&parse_maps(&maps), start, end, writable).map_err(refuse)?;
        let (pieces, swaps) = match sharing {
            Sharing::Pin => (vec![(start, end - start)], Vec::new()),
            Sharing::Memfd => self.share(&parts, start, end).map_err(refuse)?,
        };
        let total = (end - start) as u64;
        let iova = match lock(&self.alloc).alloc(total, PAGE as u64) {
            Ok(i) => i,
            Err(source) => {
                release(&mut lock(&SWAPS), &swaps);
                return Err(Mlx5Error::IovaExhausted {
                    function: self.function.clone(),
                    len: total,
                    source,
                });
            }
        };
        let mut pages = UserPages {
            space: self.clone(),
            iova,
            start,
            len: end - start,
            mapped: Vec::with_capacity(pieces.len()),
            swaps,
        };
        for (host, n) in pieces {
            let at = Iova(iova.0 + (host - start) as u64);
            let Some(ptr) = NonNull::new(host as *mut u8) else {
                continue;
            };
            // The pages stay mapped until `UserPages` drops, whose first
            // step is unmapping them from the device: the caller of
            // `map_user` (Mkey's owner, on the application's behalf) keeps
            // the memory registered — mapped — until then (the verbs
            // contract `Mlx5Provider::reg_mr` documents). A registration
            // without write access is mapped for the device to read only
            // (so read-only memory can be pinned on kernel VFIO).
            let mapped = if writable {
                // SAFETY: as said above.
                unsafe { self.mapper.map(at, ptr, n as u64) }
            } else {
                // SAFETY: as said above.
                unsafe { self.mapper.map_read_only(at, ptr, n as u64) }
            };
            if let Err(source) = mapped {
                // Drop undoes what was mapped, frees the IOVA and moves
                // the pages back.
                drop(pages);
                return Err(Mlx5Error::DmaMap {
                    function: self.function.clone(),
                    iova: at,
                    len: n as u64,
                    source,
                });
            }
            pages.mapped.push((at, n as u64));
        }
        Ok(pages)
    }

    /// Over vfio-user: make `[start, end)` shareable by fd — its pieces and
    /// the moved ranges referenced.
    #[allow(clippy::type_complexity)]
    fn share(
        &self,
        parts: &[MapsEntry],
        start: usize,
        end: usize,
    ) -> Result<(Vec<(usize, usize)>, Vec<usize>), UserMemoryProblem> {
        let mut swaps = lock(&SWAPS);
        let pieces = plan(&swaps, parts, start, end)?;
        let mut held = Vec::new();
        for p in &pieces {
            match p.kind {
                PieceKind::Own => {}
                PieceKind::Moved(k) => {
                    if let Some(s) = swaps.get_mut(&k) {
                        s.refs += 1;
                        held.push(k);
                    }
                }
                PieceKind::Private => {
                    let mine: Vec<_> = parts
                        .iter()
                        .filter(|e| e.hi > p.start && e.lo < p.start + p.len)
                        .map(|e| MapsEntry {
                            lo: e.lo.max(p.start),
                            hi: e.hi.min(p.start + p.len),
                            ..*e
                        })
                        .collect();
                    match swap_in(p.start, p.len, &mine) {
                        Ok(s) => {
                            swaps.insert(p.start, s);
                            held.push(p.start);
                        }
                        Err(e) => {
                            release(&mut swaps, &held);
                            return Err(e);
                        }
                    }
                }
            }
        }
        Ok((pieces.iter().map(|p| (p.start, p.len)).collect(), held))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
1000-3000 rw-p 00000000 00:00 0
3000-4000 r--p 00000000 00:00 0
5000-6000 rw-s 00000000 00:01 77                 /memfd:x (deleted)
6000-7000 ---p 00000000 00:00 0
200000-400000 rw-p 00000000 00:11 10145784                   /anon_hugepage (deleted)
";

    #[test]
    fn maps_lines_parse_with_rights_sharing_and_inode() {
        let m = parse_maps(MAPS);
        assert_eq!(m.len(), 5);
        assert_eq!(
            m[2],
            MapsEntry {
                lo: 0x5000,
                hi: 0x6000,
                rwx: [true, true, false],
                shared: true,
                inode: 77,
                hugetlb: false,
            }
        );
        assert!(m[4].hugetlb && !m[4].shared);
        assert!(!m[1].rwx[1] && m[1].rwx[0]);
    }

    #[test]
    fn a_range_must_be_mapped_readable_and_writable_when_written() {
        let m = parse_maps(MAPS);
        let parts = covering(&m, 0x2000, 0x4000, false).unwrap();
        assert_eq!(
            parts.iter().map(|p| (p.lo, p.hi)).collect::<Vec<_>>(),
            [(0x2000, 0x3000), (0x3000, 0x4000)]
        );
        assert!(matches!(
            covering(&m, 0x2000, 0x4000, true),
            Err(UserMemoryProblem::ReadOnly { at: 0x3000 })
        ));
        assert!(matches!(
            covering(&m, 0x3000, 0x6000, false),
            Err(UserMemoryProblem::Unmapped { at: 0x4000 })
        ));
        assert!(matches!(
            covering(&m, 0x6000, 0x7000, false),
            Err(UserMemoryProblem::Unmapped { at: 0x6000 })
        ));
        assert!(matches!(
            covering(&m, 0x8000, 0x9000, false),
            Err(UserMemoryProblem::Unmapped { at: 0x8000 })
        ));
    }

    #[test]
    fn a_shared_mapping_the_driver_did_not_make_is_refused() {
        let m = parse_maps(MAPS);
        let swaps = BTreeMap::new();
        assert!(matches!(
            plan(&swaps, &m, 0x5000, 0x6000),
            Err(UserMemoryProblem::Shared { at: 0x5000 })
        ));
        let pieces = plan(&swaps, &m, 0x1000, 0x3000).unwrap();
        assert_eq!(pieces.len(), 1);
        assert!(matches!(pieces[0].kind, PieceKind::Private));
        assert!(matches!(
            plan(&swaps, &m, 0x202000, 0x20c000),
            Err(UserMemoryProblem::Hugetlb { at: 0x202000 })
        ));
    }
}
