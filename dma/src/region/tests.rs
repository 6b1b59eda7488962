//! DmaRegion on the scripted kernel (`sys_fake.rs`): construction, teardown
//! order, failure unwinding, placement policy and byte-exact access.

use std::sync::{Arc, OnceLock, Weak};

use super::*;
use crate::iova::IovaAllocator;
use crate::mapper::{Mapper, MapperCall, RecordingMapper};
use crate::sys::{self, Call};
use rnic_core::{MemAccess, MemoryError};

fn pool_2m(free: u64) {
    sys::script(|s| {
        let dir = "/sys/kernel/mm/hugepages/hugepages-2048kB";
        s.files
            .insert(format!("{dir}/nr_hugepages"), format!("{free}\n"));
        s.files
            .insert(format!("{dir}/free_hugepages"), format!("{free}\n"));
        s.files
            .insert(format!("{dir}/resv_hugepages"), "0\n".into());
    });
}

fn recording_domain() -> (Arc<DmaDomain>, RecordingMapper) {
    let mapper = RecordingMapper::new();
    let domain = DmaDomain::new(
        mapper.clone(),
        IovaAllocator::new(&[0x1_0000_0000..=0x1_FFFF_FFFF]),
    );
    (domain, mapper)
}

#[test]
fn build_records_what_was_obtained_and_maps_at_an_aligned_iova() {
    pool_2m(4);
    let (domain, mapper) = recording_domain();
    let r = DmaRegion::builder(3 << 20)
        .node(NodeId(0))
        .domain(Arc::clone(&domain))
        .build()
        .unwrap();
    assert_eq!(r.page_size(), PageSize::Huge2M);
    assert_eq!(r.len(), 3 << 20);
    let st = r.stats();
    assert_eq!(st.mapped_bytes, 4 << 20);
    assert!(st.pinned && st.device_mapped);
    assert_eq!(st.node_wanted, Some(NodeId(0)));
    assert_eq!(st.node_verified, Some(NodeId(0)));
    assert_eq!(st.placement.pages_checked, 2, "one query per 2 MiB page");
    assert_eq!(st.verified_fraction, 1.0);
    assert_eq!(r.iova().get() % (2 << 20), 0);
    assert_eq!(
        mapper.calls(),
        vec![MapperCall::Map {
            iova: r.iova(),
            host: r.as_ptr() as usize,
            len: 4 << 20
        }]
    );
    assert_eq!(domain.iova_allocated_bytes(), 4 << 20);
    // The steps happened in construction order.
    let calls = sys::calls();
    let pos = |f: &dyn Fn(&Call) -> bool| calls.iter().position(f).unwrap();
    let mmap = pos(&|c| matches!(c, Call::Mmap { .. }));
    let mbind = pos(&|c| matches!(c, Call::Mbind { .. }));
    let populate = pos(&|c| matches!(c, Call::Populate { .. }));
    let mlock = pos(&|c| matches!(c, Call::Mlock { .. }));
    let query = pos(&|c| matches!(c, Call::QueryNodes { .. }));
    assert!(
        mmap < mbind && mbind < populate && populate < mlock && mlock < query,
        "{calls:?}"
    );
}

/// A mapper that journals `unmap` together with whether the IOVA is still
/// allocated at that moment.
#[derive(Debug)]
struct JournalMapper {
    journal: Arc<std::sync::Mutex<Vec<String>>>,
    domain: Arc<OnceLock<Weak<DmaDomain>>>,
}

// SAFETY: no device; the journal never touches the memory.
unsafe impl Mapper for JournalMapper {
    unsafe fn map(&self, _iova: Iova, _host: NonNull<u8>, _len: u64) -> std::io::Result<()> {
        Ok(())
    }

    fn unmap(&self, iova: Iova, _len: u64) -> std::io::Result<()> {
        let held = self
            .domain
            .get()
            .and_then(Weak::upgrade)
            .is_some_and(|d| d.iova_allocated(iova));
        self.journal
            .lock()
            .unwrap()
            .push(format!("unmap iova_held={held}"));
        Ok(())
    }
}

#[test]
fn drop_undoes_everything_in_exact_reverse_order() {
    pool_2m(1);
    let journal = Arc::new(std::sync::Mutex::new(Vec::new()));
    let view = Arc::new(OnceLock::new());
    let mapper = JournalMapper {
        journal: Arc::clone(&journal),
        domain: Arc::clone(&view),
    };
    let domain = DmaDomain::new(mapper, IovaAllocator::new(&[0x1000_0000..=0x2000_0000]));
    view.set(Arc::downgrade(&domain)).unwrap();

    let r = DmaRegion::builder(4096)
        .domain(Arc::clone(&domain))
        .build()
        .unwrap();
    let iova = r.iova();
    let (addr, len) = (r.as_ptr() as usize, r.stats().mapped_bytes);
    // Journal every later syscall with the IOVA state at that moment.
    let j = Arc::clone(&journal);
    let d = Arc::clone(&domain);
    sys::set_observer(move |call| {
        let held = d.iova_allocated(iova);
        j.lock().unwrap().push(format!("{call:?} iova_held={held}"));
    });
    drop(r);
    let got = journal.lock().unwrap().clone();
    assert_eq!(
        got,
        vec![
            "unmap iova_held=true".to_string(),
            format!("{:?} iova_held=false", Call::Munlock { addr, len }),
            format!("{:?} iova_held=false", Call::Munmap { addr, len }),
        ]
    );
    assert_eq!(sys::live_mappings(), 0);
}

#[test]
fn a_failed_device_map_unwinds_the_earlier_steps_in_reverse() {
    pool_2m(1);
    let mapper = RecordingMapper::new().failing_map(libc::EFAULT);
    let domain = DmaDomain::new(mapper.clone(), IovaAllocator::new(&[0..=0xFFFF_FFFF]));
    let err = DmaRegion::builder(8192)
        .domain(Arc::clone(&domain))
        .build()
        .unwrap_err();
    assert!(matches!(err, DmaError::DeviceMap { .. }), "{err}");
    assert!(err.to_string().contains("for the device"));
    assert_eq!(domain.iova_allocated_bytes(), 0, "IOVA returned");
    assert!(
        !mapper
            .calls()
            .iter()
            .any(|c| matches!(c, MapperCall::Unmap { .. })),
        "never mapped: no unmap"
    );
    let calls = sys::calls();
    let tail: Vec<_> = calls.iter().rev().take(2).rev().collect();
    assert!(
        matches!(tail[0], Call::Munlock { .. }) && matches!(tail[1], Call::Munmap { .. }),
        "{calls:?}"
    );
    assert_eq!(sys::live_mappings(), 0);
}

#[test]
fn a_failed_device_unmap_leaks_instead_of_freeing_under_the_device() {
    pool_2m(1);
    let mapper = RecordingMapper::new().failing_unmap(libc::EBUSY);
    let domain = DmaDomain::new(mapper.clone(), IovaAllocator::new(&[0..=0xFFFF_FFFF]));
    let r = DmaRegion::builder(4096)
        .domain(Arc::clone(&domain))
        .build()
        .unwrap();
    let iova = r.iova();
    let before = sys::calls().len();
    drop(r);
    let after: Vec<_> = sys::calls()[before..].to_vec();
    assert!(
        after.is_empty(),
        "no munlock/munmap after a failed unmap: {after:?}"
    );
    assert!(domain.iova_allocated(iova), "IOVA not reused");
    assert_eq!(sys::live_mappings(), 1, "pages deliberately leaked");
}

#[test]
fn placement_mismatch_fails_or_warns_per_policy() {
    sys::script(|s| {
        s.files
            .insert("/sys/devices/system/node/online".into(), "0-1\n".into());
        // Every other page lands on node 0 although node 1 was bound.
        s.page_node = Some(Box::new(|i| (i % 2 == 0) as i32));
    });
    let err = DmaRegion::builder(4 * 4096)
        .pages(PagePolicy::Require(PageSize::Base))
        .node(NodeId(1))
        .build()
        .unwrap_err();
    match err {
        DmaError::PlacementMismatch {
            wanted,
            checked,
            on_wanted,
            elsewhere,
            absent,
        } => {
            assert_eq!(
                (wanted, checked, on_wanted, elsewhere, absent),
                (NodeId(1), 4, 2, 2, 0)
            );
        }
        other => panic!("{other}"),
    }
    assert_eq!(sys::live_mappings(), 0, "the failed build unmapped");

    let r = DmaRegion::builder(4 * 4096)
        .pages(PagePolicy::Require(PageSize::Base))
        .node(NodeId(1))
        .on_mismatch(OnMismatch::Warn)
        .build()
        .unwrap();
    assert_eq!(r.stats().verified_fraction, 0.5);
    assert_eq!(r.placement().by_node, vec![(NodeId(0), 2), (NodeId(1), 2)]);
}

#[test]
fn memlock_limit_fails_before_anything_is_mapped() {
    sys::script(|s| s.memlock_limit = 64 * 1024);
    let err = DmaRegion::builder(1 << 20).build().unwrap_err();
    assert!(
        matches!(
            err,
            DmaError::MemlockLimit {
                request: 1048576,
                limit: 65536,
                ..
            }
        ),
        "{err}"
    );
    assert!(sys::calls().is_empty(), "{:?}", sys::calls());
    // Unpinned regions don't need the limit.
    let r = DmaRegion::builder(1 << 20)
        .pin(false)
        .pages(PagePolicy::Require(PageSize::Base))
        .build()
        .unwrap();
    assert!(!r.stats().pinned);
    assert!(!sys::calls().iter().any(|c| matches!(c, Call::Mlock { .. })));
}

#[test]
fn mlock_failure_is_reported_with_context_and_unwinds() {
    sys::script(|s| s.mlock_errno = Some(libc::EAGAIN));
    let err = DmaRegion::builder(4096)
        .pages(PagePolicy::Require(PageSize::Base))
        .build()
        .unwrap_err();
    assert!(matches!(err, DmaError::Mlock { len: 4096, .. }), "{err}");
    assert_eq!(sys::live_mappings(), 0);
    assert!(
        !sys::calls()
            .iter()
            .any(|c| matches!(c, Call::Munlock { .. })),
        "never locked: no munlock"
    );
}

#[test]
fn identity_domain_uses_the_virtual_address() {
    let r = DmaRegion::builder(100)
        .pages(PagePolicy::Require(PageSize::Base))
        .build()
        .unwrap();
    assert_eq!(r.iova().get(), r.as_ptr() as u64);
    assert!(!r.stats().device_mapped);
    assert!(r.domain().is_identity());
}

#[test]
fn reads_writes_and_atomics_are_byte_exact_and_bounded() {
    const LEN: usize = 77;
    let r = DmaRegion::builder(LEN)
        .pages(PagePolicy::Require(PageSize::Base))
        .build()
        .unwrap();
    let mut model = vec![0u8; LEN];
    let mut seed = 1u8;
    for offset in 0..=LEN {
        for len in [0, 1, 3, 7, 8, 9, 16, 17, LEN - offset]
            .into_iter()
            .filter(|&l| offset + l <= LEN)
        {
            let data: Vec<u8> = (0..len)
                .map(|i| seed.wrapping_add((i as u8).wrapping_mul(13)))
                .collect();
            seed = seed.wrapping_add(5);
            r.write(offset, &data).unwrap();
            model[offset..offset + len].copy_from_slice(&data);
            let mut all = vec![0u8; LEN];
            r.read(0, &mut all).unwrap();
            assert_eq!(all, model, "after writing {len} at {offset}");
        }
    }
    r.write(8, &0x0102_0304_0506_0708u64.to_ne_bytes()).unwrap();
    assert_eq!(r.fetch_add_u64(8, 1).unwrap(), 0x0102_0304_0506_0708);
    assert_eq!(
        r.compare_swap_u64(8, 1, 2).unwrap(),
        0x0102_0304_0506_0709,
        "no swap on mismatch"
    );
    assert_eq!(
        r.compare_swap_u64(8, 0x0102_0304_0506_0709, 42).unwrap(),
        0x0102_0304_0506_0709
    );
    let mut w = [0u8; 8];
    r.read(8, &mut w).unwrap();
    assert_eq!(u64::from_ne_bytes(w), 42);

    let before = {
        let mut all = vec![0u8; LEN];
        r.read(0, &mut all).unwrap();
        all
    };
    let oor = |access, offset, len| MemoryError::OutOfRange {
        access,
        offset,
        len,
        region_len: LEN,
    };
    assert_eq!(r.write(70, &[0xEE; 8]), Err(oor(MemAccess::Write, 70, 8)));
    assert_eq!(
        r.read(usize::MAX, &mut [0; 2]),
        Err(oor(MemAccess::Read, usize::MAX, 2))
    );
    assert_eq!(
        r.fetch_add_u64(4, 1),
        Err(MemoryError::Misaligned {
            access: MemAccess::Atomic,
            offset: 4
        })
    );
    assert_eq!(
        r.compare_swap_u64(72, 0, 1),
        Err(oor(MemAccess::Atomic, 72, 8)),
        "word crosses the end"
    );
    let mut after = vec![0u8; LEN];
    r.read(0, &mut after).unwrap();
    assert_eq!(after, before, "refused accesses changed nothing");
}

#[test]
fn concurrent_partial_writes_never_clobber_neighbours() {
    let r = DmaRegion::builder(64)
        .pages(PagePolicy::Require(PageSize::Base))
        .build()
        .unwrap();
    std::thread::scope(|s| {
        for lane in 0..8usize {
            let r = &r;
            s.spawn(move || {
                for round in 0..500usize {
                    for w in 0..8 {
                        r.write(w * 8 + lane, &[((round + lane + w) % 251) as u8])
                            .unwrap();
                    }
                }
            });
        }
    });
    let mut all = [0u8; 64];
    r.read(0, &mut all).unwrap();
    for w in 0..8 {
        for lane in 0..8 {
            assert_eq!(all[w * 8 + lane], ((499 + lane + w) % 251) as u8);
        }
    }
}

#[test]
fn registry_lists_live_regions_only() {
    let r = DmaRegion::builder(4096)
        .pages(PagePolicy::Require(PageSize::Base))
        .build()
        .unwrap();
    let id = r.stats().id;
    let listed = registry::snapshot()
        .into_iter()
        .find(|s| s.id == id)
        .expect("listed");
    assert_eq!(listed.bytes, 4096);
    assert_eq!(listed.page_size, PageSize::Base);
    drop(r);
    assert!(
        registry::snapshot().iter().all(|s| s.id != id),
        "dropped regions vanish"
    );
}

#[test]
fn near_pci_device_reads_sysfs() {
    sys::script(|s| {
        s.files.insert(
            "/sys/bus/pci/devices/0000:3b:00.0/numa_node".into(),
            "-1\n".into(),
        );
    });
    let b = DmaRegion::builder(4096)
        .near_pci_device("0000:3b:00.0")
        .unwrap();
    let r = b
        .pages(PagePolicy::Require(PageSize::Base))
        .build()
        .unwrap();
    assert_eq!(r.stats().node_wanted, None);
    assert!(
        !sys::calls().iter().any(|c| matches!(c, Call::Mbind { .. })),
        "no preference: no binding"
    );
}

#[test]
fn a_region_in_the_key_table_outlives_its_other_owners() {
    use crate::keys::KeyTable;
    use rnic_core::{AccessFlags, PdHandle};
    let r = DmaRegion::builder(4096)
        .pages(PagePolicy::Require(PageSize::Base))
        .build()
        .unwrap();
    let mut t: KeyTable = KeyTable::with_seed(9);
    let k = t
        .register(
            Arc::clone(&r),
            0,
            4096,
            PdHandle(1),
            AccessFlags::LOCAL_WRITE,
        )
        .unwrap();
    drop(r);
    assert_eq!(sys::live_mappings(), 1, "the table's Arc keeps the pages");
    let (region, off) = t
        .lookup(
            k.lkey,
            PdHandle(1),
            k.start + 8,
            8,
            AccessFlags::LOCAL_WRITE,
        )
        .unwrap();
    region.write(off as usize, &[1; 8]).unwrap();
    drop(t.invalidate(k.lkey).unwrap());
    assert_eq!(sys::live_mappings(), 0, "last reference gone: torn down");
}

#[test]
fn a_region_registers_as_dyn_memory_with_its_iova_and_node() {
    use crate::keys::KeyTable;
    use rnic_core::{AccessFlags, PdHandle};
    pool_2m(1);
    let (domain, _mapper) = recording_domain();
    let r = DmaRegion::builder(4096)
        .node(NodeId(0))
        .domain(domain)
        .build()
        .unwrap();
    let dynamic: Arc<dyn Memory> = r.clone();
    assert_eq!(
        dynamic.iova(),
        Some(r.iova()),
        "IOMMU-mapped: the IOVA is reported"
    );
    assert_eq!(dynamic.numa_node(), Some(0));
    assert_eq!(dynamic.addr(), r.as_ptr() as u64);
    let mut t = KeyTable::<dyn Memory>::with_seed(1);
    let k = t
        .register(dynamic, 0, 4096, PdHandle(1), AccessFlags::LOCAL_WRITE)
        .unwrap();
    assert_eq!(k.start, r.iova().get(), "keys cover device addresses");
    let (m, off) = t
        .lookup(
            k.lkey,
            PdHandle(1),
            k.start + 16,
            8,
            AccessFlags::LOCAL_WRITE,
        )
        .unwrap();
    m.write(off as usize, &[7; 8]).unwrap();
    let mut b = [0u8; 8];
    r.read(16, &mut b).unwrap();
    assert_eq!(b, [7; 8]);

    let identity = DmaRegion::builder(4096)
        .pages(PagePolicy::Require(PageSize::Base))
        .build()
        .unwrap();
    assert_eq!(
        Memory::iova(&*identity),
        None,
        "identity-mapped: no IOVA, the VA is the address"
    );
}
