use std::alloc::{self, Layout};
use std::any::Any;
use std::io;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use rnic_core::{Iova, MemAccess, Memory, MemoryError};

use super::PeerRegion;
use crate::error::DmaError;
use crate::iova::IovaAllocator;
use crate::mapper::{DmaDomain, Mapper};
use crate::mmio::Mmio;

type Log = Arc<Mutex<Vec<String>>>;

/// A heap buffer standing in for a peer's BAR mapping; logs its release.
struct FakeBar {
    ptr: NonNull<u8>,
    layout: Layout,
    log: Log,
}

// SAFETY: FakeBar owns its allocation exclusively, like a Box.
unsafe impl Send for FakeBar {}
// SAFETY: FakeBar exposes nothing; the Mmio reaches it through raw pointers.
unsafe impl Sync for FakeBar {}

impl Drop for FakeBar {
    fn drop(&mut self) {
        self.log.lock().unwrap().push("bar released".into());
        // SAFETY: allocated in `bar` with this layout, freed once here.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

fn bar(len: usize, log: &Log) -> Mmio {
    let layout = Layout::from_size_align(len, 4096).unwrap();
    // SAFETY: non-zero size.
    let ptr = NonNull::new(unsafe { alloc::alloc_zeroed(layout) }).unwrap();
    let owner: Arc<dyn Any + Send + Sync> = Arc::new(FakeBar {
        ptr,
        layout,
        log: log.clone(),
    });
    // SAFETY: the allocation is valid for `len` bytes, page-aligned, lives as
    // long as `owner`; the tests use it from one thread at a time.
    unsafe { Mmio::new(ptr, len, owner) }
}

/// A mapper that logs map/unmap into the same log as the BAR.
#[derive(Debug)]
struct LogMapper {
    log: Log,
    fail_unmap: bool,
}

// SAFETY: no device is involved; the test only checks the order of calls.
unsafe impl Mapper for LogMapper {
    unsafe fn map(&self, iova: Iova, host: NonNull<u8>, len: u64) -> io::Result<()> {
        self.log.lock().unwrap().push(format!(
            "map {iova} <- host {:#x} +{len:#x}",
            host.as_ptr() as usize & 0xfff
        ));
        Ok(())
    }
    fn unmap(&self, iova: Iova, len: u64) -> io::Result<()> {
        self.log
            .lock()
            .unwrap()
            .push(format!("unmap {iova} +{len:#x}"));
        if self.fail_unmap {
            Err(io::Error::from_raw_os_error(libc::EBUSY))
        } else {
            Ok(())
        }
    }
}

fn domain(log: &Log, fail_unmap: bool) -> Arc<DmaDomain> {
    DmaDomain::new(
        LogMapper {
            log: log.clone(),
            fail_unmap,
        },
        IovaAllocator::new(&[0x10_0000..=0xFFF_FFFF]),
    )
}

#[test]
fn maps_a_window_and_unmaps_before_the_bar_goes() {
    let log: Log = Arc::default();
    let d = domain(&log, false);
    let b = bar(64 << 10, &log);
    let r = PeerRegion::map(&b, 16 << 10, 8 << 10, &d).unwrap();
    assert_eq!(r.iova(), Iova(0x10_0000));
    assert_eq!(Memory::iova(&*r), Some(Iova(0x10_0000)));
    assert!(d.iova_allocated(r.iova()));
    // CPU access lands in the BAR at the window's offset.
    r.write(3, b"peer bytes").unwrap();
    let mut got = [0u8; 10];
    b.read_bytes((16 << 10) + 3, &mut got).unwrap();
    assert_eq!(&got, b"peer bytes");
    // Drop the peer's own handle first: the region keeps the BAR.
    drop(b);
    assert_eq!(log.lock().unwrap().len(), 1, "{:?}", log.lock().unwrap());
    r.write(8192 - 8, &7u64.to_ne_bytes()).unwrap();
    assert_eq!(r.fetch_add_u64(8192 - 8, 5).unwrap(), 7);
    assert_eq!(r.compare_swap_u64(8192 - 8, 12, 1).unwrap(), 12);
    let iova = r.iova();
    drop(r);
    assert_eq!(
        *log.lock().unwrap(),
        [
            "map 0x0000000000100000 <- host 0x0 +0x2000",
            "unmap 0x0000000000100000 +0x2000",
            "bar released"
        ]
    );
    assert!(!d.iova_allocated(iova), "IOVA not freed");
}

#[test]
fn a_failed_unmap_keeps_the_bar_and_the_iova() {
    let log: Log = Arc::default();
    let d = domain(&log, true);
    let b = bar(8192, &log);
    let r = PeerRegion::map(&b, 0, 4096, &d).unwrap();
    let iova = r.iova();
    drop((b, r));
    let l = log.lock().unwrap().clone();
    assert_eq!(
        l.len(),
        2,
        "the BAR was released under a live mapping: {l:?}"
    );
    assert!(d.iova_allocated(iova));
}

#[test]
fn windows_must_be_whole_pages_inside_the_bar() {
    let log: Log = Arc::default();
    let d = domain(&log, false);
    let b = bar(16384, &log);
    for (off, len) in [(0, 0), (100, 4096), (0, 100), (8192, 16384)] {
        match PeerRegion::map(&b, off, len, &d) {
            Err(e @ DmaError::PeerWindow { .. }) => {
                assert!(e.to_string().contains("peer BAR window"), "{e}")
            }
            other => panic!("({off}, {len}): {other:?}"),
        }
    }
    assert_eq!(d.iova_allocated_bytes(), 0);
    assert!(log.lock().unwrap().is_empty(), "nothing may be mapped");
    let r = PeerRegion::map(&b, 0, 4096, &d).unwrap();
    assert_eq!(
        r.write(4000, &[0; 100]).unwrap_err(),
        MemoryError::OutOfRange {
            access: MemAccess::Write,
            offset: 4000,
            len: 100,
            region_len: 4096
        }
    );
}
