//! Page sizes, the allocation chain (1 GiB hugetlb → 2 MiB hugetlb →
//! transparent hugepages → base pages) and the owner of a host mapping.
//!
//! Each step of the chain maps, binds to the wanted node *before* anything
//! faults the range in, then faults in every page with
//! `MADV_POPULATE_WRITE`. A step that cannot get its page size (pool empty,
//! node short of pages, THP disabled) unmaps what it made and, under
//! [`PagePolicy::Prefer`], hands over to the next smaller size, recording why
//! in a [`Fallback`]. Under [`PagePolicy::Require`] the first failure is the
//! answer, with the exact command that reserves the pages.

use std::fmt;
use std::ptr::NonNull;

use tracing::{debug, error};

use crate::error::DmaError;
use crate::numa::{self, Bound, NodeId};
use crate::sys::{self, MapKind};

/// The backing page size of a region.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PageSize {
    /// The base page size (4 KiB on x86_64).
    Base,
    /// Transparent hugepages: 2 MiB-aligned anonymous memory advised with
    /// `MADV_HUGEPAGE`. The kernel may still back parts with base pages; the
    /// region's stats report how much it actually backed with huge pages.
    Transparent2M,
    /// hugetlbfs 2 MiB pages (`MAP_HUGETLB | MAP_HUGE_2MB`), from the pool in
    /// `/sys/kernel/mm/hugepages/hugepages-2048kB/`.
    Huge2M,
    /// hugetlbfs 1 GiB pages (`MAP_HUGETLB | MAP_HUGE_1GB`), from the pool in
    /// `/sys/kernel/mm/hugepages/hugepages-1048576kB/`.
    Huge1G,
}

impl PageSize {
    /// The whole chain, largest first.
    pub const CHAIN: [PageSize; 4] = [
        PageSize::Huge1G,
        PageSize::Huge2M,
        PageSize::Transparent2M,
        PageSize::Base,
    ];

    /// Bytes per page (the mapping length and IOVA alignment are multiples).
    pub fn bytes(self) -> usize {
        match self {
            PageSize::Base => sys::base_page_size(),
            PageSize::Transparent2M | PageSize::Huge2M => 2 << 20,
            PageSize::Huge1G => 1 << 30,
        }
    }

    /// The granularity at which placement is verified: one query per
    /// hugetlb page; per base page for THP, which may mix sizes.
    pub(crate) fn verify_granularity(self) -> usize {
        match self {
            PageSize::Huge2M | PageSize::Huge1G => self.bytes(),
            PageSize::Base | PageSize::Transparent2M => sys::base_page_size(),
        }
    }

    /// The hugetlb pool directory name (`hugepages-2048kB`), if any.
    pub fn hugetlb_dir(self) -> Option<&'static str> {
        match self {
            PageSize::Huge2M => Some("hugepages-2048kB"),
            PageSize::Huge1G => Some("hugepages-1048576kB"),
            _ => None,
        }
    }
}

impl fmt::Display for PageSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PageSize::Base => write!(f, "{} KiB base", sys::base_page_size() / 1024),
            PageSize::Transparent2M => f.write_str("2 MiB transparent huge"),
            PageSize::Huge2M => f.write_str("2 MiB hugetlb"),
            PageSize::Huge1G => f.write_str("1 GiB hugetlb"),
        }
    }
}

/// Which page sizes a request accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PagePolicy {
    /// Exactly this size, or fail with instructions.
    Require(PageSize),
    /// This size, else each smaller step of [`PageSize::CHAIN`].
    Prefer(PageSize),
}

impl Default for PagePolicy {
    /// `Prefer(Huge2M)`: hugetlb 2 MiB, then THP, then base pages.
    fn default() -> Self {
        PagePolicy::Prefer(PageSize::Huge2M)
    }
}

impl PagePolicy {
    /// The sizes to try, in order.
    pub fn candidates(self) -> &'static [PageSize] {
        let pos = |s| {
            PageSize::CHAIN
                .iter()
                .position(|&c| c == s)
                .unwrap_or(PageSize::CHAIN.len() - 1)
        };
        match self {
            PagePolicy::Require(s) => {
                let i = pos(s);
                &PageSize::CHAIN[i..=i]
            }
            PagePolicy::Prefer(s) => &PageSize::CHAIN[pos(s)..],
        }
    }
}

/// A step of the chain that was skipped, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fallback {
    /// The size that was not obtained.
    pub size: PageSize,
    /// The kernel's answer or the pre-check's finding.
    pub reason: String,
}

/// An anonymous mapping this process owns; `Drop` unmaps it. Nothing else
/// unmaps it, and no `&`/`&mut` into it is ever created.
#[derive(Debug)]
pub(crate) struct HostPages {
    pub(crate) addr: NonNull<u8>,
    /// Mapped length: the request rounded up to the page size.
    pub(crate) len: usize,
    pub(crate) size: PageSize,
}

// SAFETY: HostPages is an owning handle to an anonymous mapping (like a
// Box<[u8]> that is only accessed through raw pointers); the mapping is not
// tied to the creating thread, and unmapping from another thread is fine.
unsafe impl Send for HostPages {}
// SAFETY: &HostPages exposes only the address and length; all accesses to the
// memory go through raw pointers in DmaRegion, which documents their races.
unsafe impl Sync for HostPages {}

impl Drop for HostPages {
    fn drop(&mut self) {
        // SAFETY: HostPages uniquely owns [addr, addr + len), created by
        // sys::mmap_anonymous{,_aligned}; it is dropped last in the region's
        // teardown (after device unmap, IOVA free and munlock), when no
        // pointer into the range is used any more.
        if let Err(e) = unsafe { sys::munmap(self.addr, self.len) } {
            error!(addr = self.addr.as_ptr() as usize, len = self.len, %e, "munmap of a DMA region failed");
        }
    }
}

/// A hugetlb pool's counters (global, or one node's).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Pool {
    nr: u64,
    free: u64,
    resv: u64,
}

fn pool_dir(size: PageSize, node: Option<NodeId>) -> Option<String> {
    let dir = size.hugetlb_dir()?;
    Some(match node {
        Some(n) => format!("/sys/devices/system/node/node{n}/hugepages/{dir}"),
        None => format!("/sys/kernel/mm/hugepages/{dir}"),
    })
}

fn read_u64(path: &str) -> Option<u64> {
    sys::read_file(path).ok()?.trim().parse().ok()
}

fn pool(size: PageSize, node: Option<NodeId>) -> Option<Pool> {
    let dir = pool_dir(size, node)?;
    Some(Pool {
        nr: read_u64(&format!("{dir}/nr_hugepages"))?,
        free: read_u64(&format!("{dir}/free_hugepages"))?,
        // Reservations are only accounted globally.
        resv: if node.is_none() {
            read_u64(&format!("{dir}/resv_hugepages")).unwrap_or(0)
        } else {
            0
        },
    })
}

/// The command that makes `need` pages of `size` available (on `node`).
pub(crate) fn reserve_advice(size: PageSize, node: Option<NodeId>, need: u64) -> String {
    let Some(dir) = pool_dir(size, node) else {
        return match size {
            PageSize::Transparent2M => {
                "enable transparent hugepages: echo madvise > /sys/kernel/mm/transparent_hugepage/enabled".into()
            }
            _ => "base pages need no reservation; free memory".into(),
        };
    };
    let (target, exact) = match pool(size, node) {
        Some(p) => {
            let available = p.free.saturating_sub(p.resv);
            (p.nr + need.saturating_sub(available), true)
        }
        None => (need, false),
    };
    let mut advice = format!(
        "reserve them as root: echo {target} > {dir}/nr_hugepages{}, then check that file: the kernel may give fewer \
         when memory is fragmented",
        if exact {
            ""
        } else {
            " (at least; the pool counters were unreadable)"
        }
    );
    let boot = match size {
        PageSize::Huge1G => format!("default_hugepagesz=1G hugepagesz=1G hugepages={need}"),
        _ => format!("hugepagesz=2M hugepages={need}"),
    };
    advice.push_str(&format!(
        ", or reserve at boot with `{boot}` on the kernel command line"
    ));
    if node.is_some() {
        advice.push_str(" (the boot parameter spreads pages over all nodes)");
    }
    advice
}

/// Outcome of one chain step.
enum Step {
    Got(HostPages),
    /// Not obtainable at this size; try the next.
    Unavailable(String),
}

/// Run the chain for `len` bytes. Returns the populated, bound mapping and
/// the steps that were skipped.
pub(crate) fn allocate(
    len: usize,
    policy: PagePolicy,
    node: Option<NodeId>,
) -> Result<(HostPages, Vec<Fallback>), DmaError> {
    if len == 0 || len > isize::MAX as usize / 2 {
        return Err(DmaError::InvalidLength { len });
    }
    if let Some(n) = node {
        numa::check_online(n)?;
    }
    let mut fallbacks = Vec::new();
    for &size in policy.candidates() {
        match try_size(len, size, node)? {
            Step::Got(pages) => return Ok((pages, fallbacks)),
            Step::Unavailable(reason) => {
                debug!(%size, %reason, "page size unavailable, falling back");
                if let PagePolicy::Require(_) = policy {
                    let need = len.div_ceil(size.bytes()) as u64;
                    return Err(DmaError::PagesUnavailable {
                        size,
                        len,
                        node,
                        reason,
                        advice: reserve_advice(size, node, need),
                    });
                }
                fallbacks.push(Fallback { size, reason });
            }
        }
    }
    // Base pages are last in every Prefer chain and only fail with an error;
    // reaching here means the chain was exhausted.
    let reason = fallbacks
        .last()
        .map(|f| f.reason.clone())
        .unwrap_or_default();
    Err(DmaError::PagesUnavailable {
        size: PageSize::Base,
        len,
        node,
        reason,
        advice: "free memory".into(),
    })
}

fn try_size(len: usize, size: PageSize, node: Option<NodeId>) -> Result<Step, DmaError> {
    let page = size.bytes();
    let Some(mapped) = len.checked_next_multiple_of(page) else {
        return Err(DmaError::InvalidLength { len });
    };
    let need = (mapped / page) as u64;

    // Pre-checks that avoid an mmap the kernel would refuse (or, for a bound
    // node short of hugepages, a populate that would fail).
    if size.hugetlb_dir().is_some() {
        match pool(size, None) {
            Some(p) if p.free.saturating_sub(p.resv) < need => {
                return Ok(Step::Unavailable(format!(
                    "the pool has {} free unreserved {size} pages, {need} needed",
                    p.free.saturating_sub(p.resv)
                )));
            }
            None => {
                return Ok(Step::Unavailable(format!(
                    "the kernel has no {size} pool (no {})",
                    size_dir(size)
                )));
            }
            Some(_) => {}
        }
        if let Some(n) = node
            && let Some(p) = pool(size, Some(n))
            && p.free < need
        {
            return Ok(Step::Unavailable(format!(
                "node {n} has {} free {size} pages, {need} needed",
                p.free
            )));
        }
    }
    if size == PageSize::Transparent2M {
        match sys::read_file("/sys/kernel/mm/transparent_hugepage/enabled") {
            Ok(s) if s.contains("[never]") => {
                return Ok(Step::Unavailable(
                    "transparent hugepages are disabled ([never])".into(),
                ));
            }
            Ok(_) => {}
            Err(e) => {
                return Ok(Step::Unavailable(format!(
                    "the kernel has no transparent hugepages ({e})"
                )));
            }
        }
    }

    let mapping = match size {
        PageSize::Base => sys::mmap_anonymous(mapped, MapKind::Base),
        PageSize::Huge2M => sys::mmap_anonymous(mapped, MapKind::HugeTlb2M),
        PageSize::Huge1G => sys::mmap_anonymous(mapped, MapKind::HugeTlb1G),
        PageSize::Transparent2M => sys::mmap_anonymous_aligned(mapped, page),
    };
    let addr = match mapping {
        Ok(addr) => addr,
        Err(e) if size == PageSize::Base => {
            return Err(DmaError::Syscall {
                op: "mmap",
                addr: 0,
                len: mapped,
                source: e,
            });
        }
        Err(e) => return Ok(Step::Unavailable(format!("mmap: {e}"))),
    };
    // From here the mapping is owned: an early return unmaps it.
    let pages = HostPages {
        addr,
        len: mapped,
        size,
    };

    if size == PageSize::Transparent2M
        && let Err(e) = sys::madvise_hugepage(addr, mapped)
    {
        return Ok(Step::Unavailable(format!("madvise(MADV_HUGEPAGE): {e}")));
    }
    if let Some(n) = node
        && numa::bind(addr, mapped, n)? == Bound::NoNumaKernel
    {
        debug!("kernel without NUMA support: node 0 needs no binding");
    }
    match sys::populate_write(addr, mapped) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => touch_every_page(&pages),
        Err(e) if size.hugetlb_dir().is_some() => {
            return Ok(Step::Unavailable(format!(
                "fault-in (MADV_POPULATE_WRITE): {e}"
            )));
        }
        Err(source) => {
            return Err(DmaError::Populate {
                size,
                len: mapped,
                node,
                source,
            });
        }
    }
    Ok(Step::Got(pages))
}

fn size_dir(size: PageSize) -> String {
    pool_dir(size, None).unwrap_or_default()
}

/// Fault in each page by writing a zero to its first byte: the fallback for
/// kernels before 5.14, which lack `MADV_POPULATE_WRITE`.
fn touch_every_page(pages: &HostPages) {
    let step = pages.size.verify_granularity();
    let mut off = 0;
    while off < pages.len {
        // SAFETY: off < len, so the byte is inside the mapping HostPages
        // owns; the mapping is fresh (zero-filled, no other pointer to it has
        // been handed out), so writing a zero changes nothing and races with
        // nobody. Volatile, so the store is not elided.
        unsafe { pages.addr.as_ptr().wrapping_add(off).write_volatile(0) };
        off += step;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::{self, Call};

    fn set_pool(size: PageSize, node: Option<NodeId>, nr: u64, free: u64) {
        let dir = pool_dir(size, node).unwrap();
        sys::script(|s| {
            s.files
                .insert(format!("{dir}/nr_hugepages"), format!("{nr}\n"));
            s.files
                .insert(format!("{dir}/free_hugepages"), format!("{free}\n"));
            s.files
                .insert(format!("{dir}/resv_hugepages"), "0\n".into());
        });
    }

    #[test]
    fn candidates_follow_the_chain() {
        use PageSize::*;
        assert_eq!(
            PagePolicy::Prefer(Huge1G).candidates(),
            &[Huge1G, Huge2M, Transparent2M, Base]
        );
        assert_eq!(
            PagePolicy::Prefer(Transparent2M).candidates(),
            &[Transparent2M, Base]
        );
        assert_eq!(PagePolicy::Require(Huge2M).candidates(), &[Huge2M]);
    }

    #[test]
    fn prefer_1g_falls_back_to_2m_and_records_why() {
        set_pool(PageSize::Huge2M, None, 8, 8);
        set_pool(PageSize::Huge1G, None, 0, 0);
        let (pages, fallbacks) =
            allocate(3 << 20, PagePolicy::Prefer(PageSize::Huge1G), None).unwrap();
        assert_eq!(pages.size, PageSize::Huge2M);
        assert_eq!(pages.len, 4 << 20, "rounded up to whole 2 MiB pages");
        assert_eq!(fallbacks.len(), 1);
        assert_eq!(fallbacks[0].size, PageSize::Huge1G);
        assert!(
            fallbacks[0].reason.contains("0 free"),
            "{}",
            fallbacks[0].reason
        );
        assert!(sys::calls().contains(&Call::Populate {
            addr: pages.addr.as_ptr() as usize,
            len: 4 << 20
        }));
    }

    #[test]
    fn prefer_2m_with_empty_pool_falls_back_to_thp_then_base() {
        set_pool(PageSize::Huge2M, None, 0, 0);
        let (pages, fb) = allocate(1 << 20, PagePolicy::Prefer(PageSize::Huge2M), None).unwrap();
        assert_eq!(pages.size, PageSize::Transparent2M);
        assert_eq!(
            fb.iter().map(|f| f.size).collect::<Vec<_>>(),
            vec![PageSize::Huge2M]
        );
        assert!(
            sys::calls()
                .iter()
                .any(|c| matches!(c, Call::MadviseHugepage { .. }))
        );
        drop(pages);

        sys::script(|s| {
            s.files.insert(
                "/sys/kernel/mm/transparent_hugepage/enabled".into(),
                "always madvise [never]\n".into(),
            );
        });
        let (pages, fb) = allocate(1 << 20, PagePolicy::Prefer(PageSize::Huge2M), None).unwrap();
        assert_eq!(pages.size, PageSize::Base);
        assert_eq!(pages.len, 1 << 20);
        assert_eq!(fb.len(), 2);
        assert!(fb[1].reason.contains("[never]"));
    }

    #[test]
    fn require_2m_without_pages_says_exactly_what_to_echo() {
        set_pool(PageSize::Huge2M, None, 3, 1);
        let err = allocate(10 << 20, PagePolicy::Require(PageSize::Huge2M), None).unwrap_err();
        let msg = err.to_string();
        // 5 pages needed, 1 free: 3 + 4 = 7.
        assert!(
            msg.contains("echo 7 > /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages"),
            "{msg}"
        );
        assert!(msg.contains("hugepagesz=2M hugepages=5"), "{msg}");
        assert_eq!(sys::live_mappings(), 0);
    }

    #[test]
    fn require_on_a_node_names_the_per_node_pool() {
        sys::script(|s| {
            s.files
                .insert("/sys/devices/system/node/online".into(), "0-1\n".into());
        });
        set_pool(PageSize::Huge2M, None, 16, 16);
        set_pool(PageSize::Huge2M, Some(NodeId(1)), 2, 0);
        let err = allocate(
            4 << 20,
            PagePolicy::Require(PageSize::Huge2M),
            Some(NodeId(1)),
        )
        .unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains(
                "echo 4 > /sys/devices/system/node/node1/hugepages/hugepages-2048kB/nr_hugepages"
            ),
            "{msg}"
        );
        assert!(msg.contains("on NUMA node 1"), "{msg}");
    }

    #[test]
    fn hugetlb_mmap_refusal_is_a_fallback_and_populate_failure_unmaps() {
        set_pool(PageSize::Huge2M, None, 8, 8);
        sys::script(|s| s.hugetlb_2m = false);
        let (pages, fb) = allocate(2 << 20, PagePolicy::Prefer(PageSize::Huge2M), None).unwrap();
        assert_eq!(pages.size, PageSize::Transparent2M);
        assert!(fb[0].reason.contains("mmap"), "{}", fb[0].reason);
        drop(pages);

        sys::script(|s| {
            s.hugetlb_2m = true;
            s.populate_errno = Some(libc::ENOMEM);
        });
        let err = allocate(2 << 20, PagePolicy::Require(PageSize::Huge2M), None).unwrap_err();
        assert!(err.to_string().contains("fault-in"), "{err}");
        assert_eq!(
            sys::live_mappings(),
            0,
            "the failed step unmapped its mapping"
        );
        // On base pages a populate failure is a hard error with context.
        let err = allocate(4096, PagePolicy::Require(PageSize::Base), None).unwrap_err();
        assert!(matches!(err, DmaError::Populate { .. }), "{err}");
        assert_eq!(sys::live_mappings(), 0);
    }

    #[test]
    fn binding_happens_before_population() {
        sys::script(|s| {
            s.files
                .insert("/sys/devices/system/node/online".into(), "0-1\n".into());
        });
        let (pages, _) =
            allocate(8192, PagePolicy::Require(PageSize::Base), Some(NodeId(1))).unwrap();
        let calls = sys::calls();
        let bind = calls
            .iter()
            .position(|c| matches!(c, Call::Mbind { node: 1, .. }))
            .unwrap();
        let populate = calls
            .iter()
            .position(|c| matches!(c, Call::Populate { .. }))
            .unwrap();
        assert!(bind < populate, "{calls:?}");
        drop(pages);
        let err = allocate(8192, PagePolicy::Require(PageSize::Base), Some(NodeId(2))).unwrap_err();
        assert!(matches!(err, DmaError::NodeNotOnline { .. }), "{err}");
    }

    #[test]
    fn zero_length_is_refused() {
        assert!(matches!(
            allocate(0, PagePolicy::default(), None),
            Err(DmaError::InvalidLength { len: 0 })
        ));
    }
}
