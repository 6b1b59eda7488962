//! rnic-mlx5's registration of application memory in place
//! (`PciFunction::map_user`), kernel-VFIO route, on real VFIO: the guest's
//! `edu` device (1234:11e8, QEMU) behind a vIOMMU stands in for a ConnectX —
//! `VfioFunction` opens any vfio-pci function, and `map_user` does not care
//! whose it is. Run by the VM harness (scenario `vfio-rust`):
//!
//! 1. page-aligned heap memory (`std::alloc`, as perftest's `memalign`) is
//!    filled with pattern A and `map_user`ed from byte 100 on: one
//!    `VFIO_IOMMU_MAP_DMA` of its virtual address (pinned in place);
//! 2. edu DMAs 2 KiB from the IOVA of byte 100 into its buffer, then back to
//!    the IOVA of byte 4196 (the second page): the application reads pattern
//!    A there through its own pointer — the IOMMU reaches the very pages the
//!    program uses, at the offset the IOVA names;
//! 3. bad input: a range over unmapped pages and a read-only range with
//!    write access are refused with the typed error, nothing mapped;
//! 4. a read-only page registered without write access is mapped for the
//!    device to read only (`VFIO_DMA_MAP_FLAG_READ`): edu reads its bytes,
//!    and its DMA into the page is blocked by the IOMMU, the page unchanged;
//! 5. the pages are dropped (unmapped from the IOMMU, IOVA freed): the
//!    container holds no mapping, and edu's DMA to the old IOVA is blocked
//!    by the IOMMU — no byte of the program's memory changes.
//!
//! Prints `CHECK <name>: PASS|FAIL <detail>` and `RESULT: PASS|FAIL`; binds
//! edu to vfio-pci and restores its driver.
//!
//! usage: user_pages_edu [EDU_BDF]

use std::process::ExitCode;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU8, Ordering};

use rnic_core::PciAddr;
use rnic_dma::Mmio;
use rnic_mlx5::{Mlx5Error, PciFunction, UserMemoryProblem, VfioFunction};
use rnic_vfio::Sysfs;

// edu's constants and one DMA, shared with rnic-vfio's edu examples.
#[path = "../../vfio/examples/edu_common/mod.rs"]
mod edu_common;
use edu_common::{CMD_TO_RAM, DMA_MASK, EDU_BUF, LEN, Res};

/// The buffer: 3 pages of heap memory.
const PAGES: usize = 3;
/// Where the registered range starts in it.
const START: usize = 100;
/// Where edu writes back (in the second page).
const BACK: usize = 4196;

/// One edu DMA of [`LEN`] bytes.
fn dma(bar: &Mmio, src: u64, dst: u64, cmd: u64) -> Res<()> {
    edu_common::dma(bar, src, dst, LEN, cmd).map(drop)
}

fn pattern(i: usize) -> u8 {
    (i * 7 + 3) as u8
}

/// Page-aligned heap memory, seen as atomic bytes (edu writes it).
struct Heap {
    ptr: NonNull<u8>,
    layout: std::alloc::Layout,
}

impl Heap {
    fn new(len: usize) -> Res<Heap> {
        let layout = std::alloc::Layout::from_size_align(len, 4096)?;
        // SAFETY: a non-zero layout.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        Ok(Heap {
            ptr: NonNull::new(p).ok_or("out of memory")?,
            layout,
        })
    }

    fn bytes(&self) -> &[AtomicU8] {
        // SAFETY: the allocation lives as long as `self`; the device writes
        // it, so only atomics are formed over it.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().cast(), self.layout.size()) }
    }

    fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }
}

impl Drop for Heap {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout; its device mapping
        // was dropped before (`drive` owns both, the pages first).
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

struct Report(bool);

impl Report {
    fn check(&mut self, name: &str, ok: bool, detail: impl AsRef<str>) {
        println!(
            "CHECK {name}: {} {}",
            if ok { "PASS" } else { "FAIL" },
            detail.as_ref()
        );
        self.0 |= !ok;
    }
}

fn main() -> ExitCode {
    let mut r = Report(false);
    let sysfs = Sysfs::system();
    let addr: Option<PciAddr> = match std::env::args().nth(1) {
        Some(a) => a.parse().ok(),
        None => sysfs.find(0x1234, 0x11e8).first().copied(),
    };
    let Some(addr) = addr else {
        r.check("find", false, "no edu device (1234:11e8), or a bad BDF");
        println!("RESULT: FAIL");
        return ExitCode::FAILURE;
    };
    let binding = match sysfs.bind(&addr, "vfio-pci") {
        Ok(b) => b,
        Err(e) => {
            r.check("user-bind", false, e.to_string());
            println!("RESULT: FAIL");
            return ExitCode::FAILURE;
        }
    };
    if let Err(e) = drive(&mut r, &addr) {
        r.check("user-run", false, e.to_string());
    }
    if let Err(e) = sysfs.restore(binding) {
        r.check("user-restore", false, e.to_string());
    }
    println!("RESULT: {}", if r.0 { "FAIL" } else { "PASS" });
    if r.0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn drive(r: &mut Report, addr: &PciAddr) -> Res<()> {
    let f = VfioFunction::open(addr, DMA_MASK)?;
    f.enable_bus_master()?;
    let heap = Heap::new(PAGES * 4096)?;
    for (i, b) in heap.bytes().iter().enumerate() {
        b.store(pattern(i), Ordering::Relaxed);
    }
    let len = PAGES * 4096 - START;
    let pages = f.map_user(heap.addr() + START, len, true)?;
    let live = f.device().container().mappings();
    r.check(
        "user-map",
        pages.start() == heap.addr()
            && pages.len() == PAGES * 4096
            && pages.pieces() == 1
            && live.contains(&(pages.iova().get(), (PAGES * 4096) as u64)),
        format!(
            "{len} bytes at {:#x}+{START}: one VFIO_IOMMU_MAP_DMA of {} pages at IOVA {} \
             (container: {live:x?})",
            heap.addr(),
            pages.len() / 4096,
            pages.iova()
        ),
    );
    let iova = pages.iova().get();
    // Clear the target first, so the bytes found there are edu's.
    for b in &heap.bytes()[BACK..BACK + LEN] {
        b.store(0, Ordering::Relaxed);
    }
    let bar = f.bar0();
    dma(bar, iova + START as u64, EDU_BUF, 0)?;
    dma(bar, EDU_BUF, iova + BACK as u64, CMD_TO_RAM)?;
    let got: Vec<u8> = heap.bytes()[BACK..BACK + LEN]
        .iter()
        .map(|b| b.load(Ordering::Relaxed))
        .collect();
    let want: Vec<u8> = (START..START + LEN).map(pattern).collect();
    r.check(
        "user-dma",
        got == want,
        format!(
            "edu read {LEN} bytes at the IOVA of byte {START} and wrote them at the IOVA of byte \
             {BACK}: the program's own pages hold them"
        ),
    );

    // Bad input: unmapped pages, read-only pages with write access.
    let hole = f.map_user(0x1000, 4096, false);
    let ro = readonly_page_with(|_| 0)?;
    let refused_ro = f.map_user(ro.as_ptr() as usize, 4096, true);
    r.check(
        "user-refusals",
        matches!(
            hole,
            Err(Mlx5Error::UserMemory {
                problem: UserMemoryProblem::Unmapped { .. },
                ..
            })
        ) && matches!(
            refused_ro,
            Err(Mlx5Error::UserMemory {
                problem: UserMemoryProblem::ReadOnly { .. },
                ..
            })
        ) && f.device().container().mappings().len() == live.len(),
        format!(
            "unmapped: {}; read-only: {}",
            hole.err().map(|e| e.to_string()).unwrap_or_default(),
            refused_ro.err().map(|e| e.to_string()).unwrap_or_default()
        ),
    );
    // SAFETY: the page `readonly_page_with` mapped; nothing refers to it.
    unsafe { libc::munmap(ro.as_ptr().cast(), 4096) };

    // A read-only page registered without write access: the device reads
    // it, its writes are blocked.
    let ro = readonly_page_with(pattern_ro)?;
    // SAFETY: the page lives until the munmap below; only atomics over it.
    let ro_bytes: &[AtomicU8] = unsafe { std::slice::from_raw_parts(ro.as_ptr().cast(), 4096) };
    let ro_pages = f.map_user(ro.as_ptr() as usize, 4096, false)?;
    let ro_iova = ro_pages.iova().get();
    for b in &heap.bytes()[BACK..BACK + LEN] {
        b.store(0, Ordering::Relaxed);
    }
    dma(bar, ro_iova, EDU_BUF, 0)?;
    dma(bar, EDU_BUF, iova + BACK as u64, CMD_TO_RAM)?;
    let read_back: Vec<u8> = heap.bytes()[BACK..BACK + LEN]
        .iter()
        .map(|b| b.load(Ordering::Relaxed))
        .collect();
    let ro_want: Vec<u8> = (0..LEN).map(pattern_ro).collect();
    // edu's buffer now holds the heap's bytes; write them at the page.
    dma(bar, iova + START as u64, EDU_BUF, 0)?;
    let blocked = dma(bar, EDU_BUF, ro_iova, CMD_TO_RAM);
    let ro_after: Vec<u8> = ro_bytes.iter().map(|b| b.load(Ordering::Relaxed)).collect();
    let ro_all: Vec<u8> = (0..4096).map(pattern_ro).collect();
    r.check(
        "user-readonly",
        read_back == ro_want && ro_after == ro_all,
        format!(
            "a read-only page mapped read-only at IOVA {ro_iova:#x}: edu read its {LEN} bytes \
             (match: {}), its DMA into it was blocked ({:?}), page unchanged: {}",
            read_back == ro_want,
            blocked.err().map(|e| e.to_string()),
            ro_after == ro_all
        ),
    );
    drop(ro_pages);
    // SAFETY: the page `readonly_page_with` mapped; its device mapping is
    // gone and nothing refers to it.
    unsafe { libc::munmap(ro.as_ptr().cast(), 4096) };

    // Unmapped from the IOMMU: the container holds nothing, and a DMA to
    // the old IOVA does not reach the memory.
    drop(pages);
    let left = f.device().container().mappings();
    let before: Vec<u8> = heap
        .bytes()
        .iter()
        .map(|b| b.load(Ordering::Relaxed))
        .collect();
    let stray = dma(bar, EDU_BUF, iova, CMD_TO_RAM);
    let after: Vec<u8> = heap
        .bytes()
        .iter()
        .map(|b| b.load(Ordering::Relaxed))
        .collect();
    r.check(
        "user-unmap",
        !left.contains(&(iova, (PAGES * 4096) as u64)) && before == after,
        format!(
            "IOMMU mapping gone (container: {left:x?}); edu DMA to the old IOVA: {:?}, memory \
             untouched",
            stray.err().map(|e| e.to_string())
        ),
    );
    Ok(())
}

fn pattern_ro(i: usize) -> u8 {
    (i * 13 + 5) as u8
}

/// One anonymous page holding `fill(i)` at byte `i`, then made read-only.
fn readonly_page_with(fill: fn(usize) -> u8) -> Res<NonNull<u8>> {
    // SAFETY: a fresh anonymous mapping at an address the kernel picks.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err("mmap of a page failed".into());
    }
    // SAFETY: the fresh page is ours; only atomics are formed over it.
    let bytes: &[AtomicU8] = unsafe { std::slice::from_raw_parts(p.cast(), 4096) };
    for (i, b) in bytes.iter().enumerate() {
        b.store(fill(i), Ordering::Relaxed);
    }
    // SAFETY: the page mapped above.
    if unsafe { libc::mprotect(p, 4096, libc::PROT_READ) } != 0 {
        return Err("mprotect(PROT_READ) failed".into());
    }
    Ok(NonNull::new(p.cast()).ok_or("mmap returned NULL")?)
}
