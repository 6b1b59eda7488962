//! rnic-dma against the real kernel (this test binary links the crate without
//! `cfg(test)`, so `sys.rs` makes real system calls).
//!
//! The hugepage tests reserve pages as root by writing `nr_hugepages`, read
//! back what the kernel actually gave, and restore the original value in a
//! guard's `Drop` (which also runs when an assertion fails). Without root, or
//! when the kernel gives nothing, they print why and check the fallback path
//! instead. Tests that change the global pools hold `POOL_LOCK`.
#![allow(clippy::unwrap_used)]

use std::fs;
use std::sync::{Mutex, MutexGuard, PoisonError};

use rnic_core::MemoryError;
use rnic_dma::numa::VerifyMethod;
use rnic_dma::{
    AccessFlags, DmaError, DmaRegion, KeyTable, Memory, NodeId, PagePolicy, PageSize, PdHandle,
    registry,
};

const POOL_2M: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages";
const POOL_1G: &str = "/sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages";

static POOL_LOCK: Mutex<()> = Mutex::new(());

fn pool_lock() -> MutexGuard<'static, ()> {
    POOL_LOCK.lock().unwrap_or_else(PoisonError::into_inner)
}

fn read_u64(path: &str) -> Option<u64> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Sets a hugepage pool's `nr_hugepages` and restores the original on drop.
struct PoolSetting {
    path: &'static str,
    original: u64,
}

impl PoolSetting {
    /// Set the pool to `target` pages; returns the guard and what the kernel
    /// actually holds now, or why it could not be set.
    fn set(path: &'static str, target: u64) -> Result<(PoolSetting, u64), String> {
        let original =
            read_u64(path).ok_or_else(|| format!("{path} is unreadable (no such pool?)"))?;
        fs::write(path, format!("{target}\n"))
            .map_err(|e| format!("writing {path}: {e} (not root?)"))?;
        let guard = PoolSetting { path, original };
        let now = read_u64(path).ok_or_else(|| format!("{path} unreadable after writing"))?;
        Ok((guard, now))
    }
}

impl Drop for PoolSetting {
    fn drop(&mut self) {
        if let Err(e) = fs::write(self.path, format!("{}\n", self.original)) {
            eprintln!("FAILED to restore {} to {}: {e}", self.path, self.original);
        }
    }
}

/// This process's hugetlb memory in KiB (`HugetlbPages` of /proc/self/status). Unlike the
/// pool's `free_hugepages`, no other process (another test binary, another engineer's run)
/// moves it; the tests that map hugetlb pages here hold [`pool_lock`].
fn own_hugetlb_kib() -> u64 {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let l = s.lines().find(|l| l.starts_with("HugetlbPages:"))?;
            l.split_whitespace().nth(1)?.parse().ok()
        })
        .unwrap_or(0)
}

fn free_pages(path_nr: &str) -> u64 {
    read_u64(&path_nr.replace("nr_hugepages", "free_hugepages")).unwrap_or(0)
}

/// Byte-exact reads/writes and both atomics on a real region.
fn exercise_memory(region: &DmaRegion) {
    let len = region.len();
    let pattern: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
    region.write(0, &pattern).unwrap();
    let mut back = vec![0u8; len];
    region.read(0, &mut back).unwrap();
    assert_eq!(back, pattern);
    // Unaligned, word-crossing writes touch exactly their bytes.
    region.write(4093, &[0xAA; 11]).unwrap();
    let mut window = [0u8; 16];
    region.read(4090, &mut window).unwrap();
    assert_eq!(&window[..3], &pattern[4090..4093]);
    assert_eq!(&window[3..14], &[0xAA; 11]);
    assert_eq!(&window[14..], &pattern[4104..4106]);
    // Atomics on the last word of the region.
    let last = (len - 8) as u64 as usize;
    region.write(last, &40u64.to_ne_bytes()).unwrap();
    assert_eq!(region.fetch_add_u64(last, 2).unwrap(), 40);
    assert_eq!(region.compare_swap_u64(last, 42, 7).unwrap(), 42);
    assert_eq!(
        region.compare_swap_u64(last, 42, 9).unwrap(),
        7,
        "no swap on mismatch"
    );
    let mut w = [0u8; 8];
    region.read(last, &mut w).unwrap();
    assert_eq!(u64::from_ne_bytes(w), 7);
    assert!(matches!(
        region.fetch_add_u64(last + 8, 1),
        Err(MemoryError::OutOfRange { .. })
    ));
    assert!(matches!(
        region.fetch_add_u64(3, 1),
        Err(MemoryError::Misaligned { .. })
    ));
}

#[test]
fn hugetlb_2m_with_reserved_pages_is_obtained_on_node_0_and_byte_exact() {
    let _lock = pool_lock();
    let len = 4 << 20;
    let original = read_u64(POOL_2M).unwrap_or(0);
    let want = original + 2;
    match PoolSetting::set(POOL_2M, want) {
        Ok((_guard, got)) if got >= want && free_pages(POOL_2M) >= 2 => {
            println!("reserved 2 MiB hugepages: asked for {want}, the kernel holds {got}");
            let own_before = own_hugetlb_kib();
            let region = DmaRegion::builder(len)
                .pages(PagePolicy::Require(PageSize::Huge2M))
                .node(NodeId(0))
                .build()
                .unwrap();
            assert_eq!(region.page_size(), PageSize::Huge2M);
            assert_eq!(
                own_hugetlb_kib(),
                own_before + 4096,
                "two 2 MiB pages of the hugetlb pool back the region"
            );
            let p = region.placement();
            assert_eq!(p.method, VerifyMethod::MovePages);
            assert_eq!(p.pages_checked, 2, "one move_pages query per 2 MiB page");
            assert_eq!(p.pages_on_wanted, 2, "{p:?}");
            assert_eq!(p.by_node, vec![(NodeId(0), 2)]);
            assert!(region.stats().pinned);
            exercise_memory(&region);
            drop(region);
            assert_eq!(own_hugetlb_kib(), own_before, "drop returned the pages");
        }
        Ok((_guard, got)) => {
            println!(
                "SKIP-PATH: the kernel gave {got} of {want} 2 MiB hugepages; checking the fallback instead"
            );
            let region = DmaRegion::builder(len)
                .pages(PagePolicy::Prefer(PageSize::Huge2M))
                .build()
                .unwrap();
            assert_ne!(region.page_size(), PageSize::Huge2M);
            assert_eq!(region.stats().fallbacks[0].size, PageSize::Huge2M);
        }
        Err(why) => {
            println!(
                "SKIP-PATH: cannot reserve 2 MiB hugepages ({why}); checking the fallback instead"
            );
            let region = DmaRegion::builder(len)
                .pages(PagePolicy::Prefer(PageSize::Huge2M))
                .build();
            let region = region.unwrap();
            assert!(
                region
                    .stats()
                    .fallbacks
                    .iter()
                    .all(|f| !f.reason.is_empty())
            );
        }
    }
    assert_eq!(
        read_u64(POOL_2M).unwrap_or(0),
        original,
        "pool setting restored"
    );
}

#[test]
fn without_reserved_pages_require_explains_and_prefer_falls_back() {
    let _lock = pool_lock();
    let original = read_u64(POOL_2M).unwrap_or(0);
    let guard = match PoolSetting::set(POOL_2M, 0) {
        Ok((guard, 0)) => Some(guard),
        Ok((_guard, got)) => {
            println!("SKIP-PATH: could not empty the 2 MiB pool (it holds {got} in-use pages)");
            return;
        }
        Err(why) => {
            println!("note: cannot change the pool ({why}); relying on it being empty");
            None
        }
    };
    if free_pages(POOL_2M) > 0 {
        println!("SKIP-PATH: the 2 MiB pool has free pages and cannot be emptied");
        return;
    }
    let err = DmaRegion::builder(4 << 20)
        .pages(PagePolicy::Require(PageSize::Huge2M))
        .build()
        .unwrap_err();
    let msg = err.to_string();
    println!("Require(Huge2M) without pages: {msg}");
    assert!(matches!(
        err,
        DmaError::PagesUnavailable {
            size: PageSize::Huge2M,
            ..
        }
    ));
    assert!(
        msg.contains("echo 2 > /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages"),
        "{msg}"
    );

    let err = DmaRegion::builder(4 << 20)
        .pages(PagePolicy::Require(PageSize::Huge2M))
        .node(NodeId(0))
        .build()
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains(
            "echo 2 > /sys/devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages"
        ),
        "{msg}"
    );

    let region = DmaRegion::builder(4 << 20)
        .pages(PagePolicy::Prefer(PageSize::Huge2M))
        .build()
        .unwrap();
    let st = region.stats();
    println!(
        "Prefer(Huge2M) without pages got {} after {:?}",
        st.page_size, st.fallbacks
    );
    assert!(matches!(
        st.page_size,
        PageSize::Transparent2M | PageSize::Base
    ));
    assert_eq!(st.fallbacks[0].size, PageSize::Huge2M);
    assert_eq!(region.iova().get() % st.page_size.bytes() as u64, 0);
    exercise_memory(&region);
    drop(guard);
    assert_eq!(read_u64(POOL_2M).unwrap_or(0), original);
}

#[test]
fn one_gib_pages_are_tried_and_the_outcome_recorded() {
    let _lock = pool_lock();
    let original = read_u64(POOL_1G);
    let reserved = match original {
        None => {
            println!("SKIP-PATH: this kernel has no 1 GiB hugepage pool");
            None
        }
        Some(orig) => match PoolSetting::set(POOL_1G, orig + 1) {
            Ok((guard, got)) => {
                println!(
                    "1 GiB hugepages: asked for {}, the kernel holds {got}",
                    orig + 1
                );
                Some((guard, got > orig && free_pages(POOL_1G) >= 1))
            }
            Err(why) => {
                println!("SKIP-PATH: cannot reserve a 1 GiB page ({why})");
                None
            }
        },
    };
    let region = DmaRegion::builder(8 << 20)
        .pages(PagePolicy::Prefer(PageSize::Huge1G))
        .build()
        .unwrap();
    let st = region.stats();
    println!(
        "Prefer(Huge1G) for 8 MiB got {} (fallbacks: {:?})",
        st.page_size, st.fallbacks
    );
    match &reserved {
        Some((_, true)) => {
            assert_eq!(st.page_size, PageSize::Huge1G);
            assert_eq!(st.mapped_bytes, 1 << 30);
            assert!(st.fallbacks.is_empty());
            assert_eq!(st.placement.pages_checked, 1);
            assert_eq!(st.placement.pages_absent, 0);
        }
        _ => {
            assert_ne!(st.page_size, PageSize::Huge1G);
            assert_eq!(
                st.fallbacks[0].size,
                PageSize::Huge1G,
                "the 1 GiB attempt is recorded"
            );
        }
    }
    drop(region);
    drop(reserved);
    assert_eq!(read_u64(POOL_1G), original, "1 GiB pool restored");
}

#[test]
fn every_page_of_a_node_0_region_reports_node_0() {
    for policy in [
        PagePolicy::Require(PageSize::Base),
        PagePolicy::Require(PageSize::Transparent2M),
    ] {
        let region = match DmaRegion::builder(8 << 20)
            .pages(policy)
            .node(NodeId(0))
            .build()
        {
            Ok(r) => r,
            Err(DmaError::PagesUnavailable { reason, .. })
                if policy != PagePolicy::Require(PageSize::Base) =>
            {
                println!("SKIP-PATH: {policy:?} unavailable here: {reason}");
                continue;
            }
            Err(e) => panic!("{e}"),
        };
        let p = region.placement();
        assert_eq!(p.method, VerifyMethod::MovePages);
        assert_eq!(p.granularity, 4096);
        assert_eq!(
            p.pages_checked,
            (8 << 20) / 4096,
            "every base page was queried"
        );
        assert_eq!(p.pages_absent, 0, "every page was faulted in");
        assert_eq!(p.pages_on_wanted, p.pages_checked, "{p:?}");
        assert_eq!(region.stats().verified_fraction, 1.0);
        assert_eq!(region.stats().node_verified, Some(NodeId(0)));
    }
}

#[test]
fn an_offline_node_is_refused() {
    // The default policy prefers 2 MiB hugepages, which may be mapped before the node is
    // refused: not while another test counts them.
    let _lock = pool_lock();
    let online = rnic_dma::numa::online_nodes();
    let missing = NodeId(online.iter().map(|n| n.0).max().unwrap_or(0) + 1);
    let err = DmaRegion::builder(4096).node(missing).build().unwrap_err();
    assert!(matches!(err, DmaError::NodeNotOnline { .. }), "{err}");
}

#[test]
fn key_table_lookup_reaches_the_real_bytes_and_registry_lists_the_region() {
    let region = DmaRegion::builder(1 << 20)
        .pages(PagePolicy::Require(PageSize::Base))
        .build()
        .unwrap();
    let id = region.stats().id;
    assert!(
        registry::snapshot()
            .iter()
            .any(|s| s.id == id && s.bytes == 1 << 20)
    );
    let mut keys = KeyTable::new();
    let rw = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let mr = keys
        .register(region.clone(), 4096, 8192, PdHandle(3), rw)
        .unwrap();
    assert_eq!(mr.start, region.iova().get() + 4096);
    let (target, off) = keys
        .lookup(
            mr.rkey,
            PdHandle(3),
            mr.start + 100,
            16,
            AccessFlags::REMOTE_WRITE,
        )
        .unwrap();
    target.write(off as usize, b"0123456789abcdef").unwrap();
    let mut b = [0u8; 16];
    region.read(4096 + 100, &mut b).unwrap();
    assert_eq!(&b, b"0123456789abcdef");
    drop(region);
    assert!(
        registry::snapshot().iter().any(|s| s.id == id),
        "the key keeps it alive"
    );
    drop(keys.invalidate(mr.rkey).unwrap());
    assert!(
        registry::snapshot().iter().all(|s| s.id != id),
        "gone with its last reference"
    );
}
