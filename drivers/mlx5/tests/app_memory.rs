//! Application memory registered in place on mlx5 (`Mlx5Provider::reg_mr`
//! with memory the driver did not allocate): two emulated functions in this
//! process, each registering ordinary process memory — a heap allocation and
//! an anonymous `mmap` range at an offset inside its first page — and moving
//! bytes between them with RDMA WRITE, READ, SEND/RECV and both atomics over
//! RoCEv2. Over vfio-user the pages are moved onto a memfd in place while
//! registered (`rnic_mlx5::function::user`): the tests check that the bytes
//! around the region survive, that deregistration (`Mlx5Mr::revoke`) makes a
//! remote access fail with REM_ACCESS_ERR while the application's memory
//! keeps its contents, is private again and stays usable, and that bad
//! ranges are refused with the typed error, nothing changed.
#![allow(clippy::unwrap_used)]

mod common;

use common::peer::ALL;

use std::net::{IpAddr, Ipv4Addr};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rnic_core::memory::{check_range, read_words, write_words};
use rnic_core::{
    AccessFlags, CompletionQueue, Context, DeviceErrorKind, Gid, InitParams, MemAccess, Memory,
    MemoryError, MemoryRegion, ProtectionDomain, Psn, QpCaps, QpInitAttr, QpType, QueuePair,
    RecvWr, RtrParams, RtsParams, SendWr, Sge, VerbsError, WcOpcode, WcStatus, WorkCompletion,
};
use rnic_mlx5::{Mlx5Mr, Mlx5Provider};

const CAPS: QpCaps = QpCaps {
    max_send_wr: 16,
    max_recv_wr: 16,
    max_send_sge: 1,
    max_recv_sge: 1,
    // An RC QP's most (rnic_mlx5::rdma::wqe::MAX_INLINE_DATA_RC).
    max_inline_data: 236,
};

/// Pages the test made: an anonymous `mmap`, or page-aligned heap memory.
struct Pages {
    base: NonNull<u8>,
    mapped: usize,
    /// From `std::alloc` rather than `mmap`.
    heap: bool,
}

// SAFETY: the pages are owned by this object and reached only through
// atomics (or by the device).
unsafe impl Send for Pages {}
// SAFETY: as Send.
unsafe impl Sync for Pages {}

impl Drop for Pages {
    fn drop(&mut self) {
        if self.heap {
            let layout = std::alloc::Layout::from_size_align(self.mapped, 4096).unwrap();
            // SAFETY: allocated in `Anon::heap` with this layout.
            unsafe { std::alloc::dealloc(self.base.as_ptr(), layout) };
        } else {
            // SAFETY: exactly the mapping made in `Anon::map`.
            unsafe { libc::munmap(self.base.as_ptr().cast(), self.mapped) };
        }
    }
}

/// A [`Memory`] of `len` bytes from `offset` into test-made pages: its host
/// address is what the driver maps (no direct span: a plain range of
/// process memory).
struct Anon {
    pages: Arc<Pages>,
    offset: usize,
    len: usize,
}

impl std::fmt::Debug for Anon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Anon")
            .field("addr", &self.host())
            .field("len", &self.len)
            .finish()
    }
}

impl Anon {
    /// `pages` pages mapped with `prot` and `flags` (plus anonymous), the
    /// view `len` bytes from `offset` (8-aligned).
    fn map(pages: usize, prot: i32, flags: i32, offset: usize, len: usize) -> Anon {
        Anon::try_map(pages, prot, flags, offset, len).expect("mmap failed")
    }

    /// [`Anon::map`], `None` when the kernel refuses the mapping.
    fn try_map(pages: usize, prot: i32, flags: i32, offset: usize, len: usize) -> Option<Anon> {
        Anon::try_map_at(0, pages, prot, flags, offset, len)
    }

    /// `pages` read-write private pages at a low address (below the
    /// executable, 256 MiB up), which the kernel never picks for a mapping
    /// that names no address: once unmapped, the hole stays a hole while
    /// other tests of this process map memory in parallel (a hole the kernel
    /// picked itself is the next one it hands out).
    fn map_low(pages: usize) -> Anon {
        let rw = libc::PROT_READ | libc::PROT_WRITE;
        (0..256)
            .find_map(|i| {
                let at = 0x1000_0000 + i * 0x10_0000;
                Anon::try_map_at(at, pages, rw, libc::MAP_PRIVATE, 0, pages * 4096)
            })
            .expect("no free range from 256 MiB to 512 MiB")
    }

    /// An anonymous mapping at exactly `at` (`MAP_FIXED_NOREPLACE`), or where
    /// the kernel picks when `at` is 0; `None` when it cannot be made.
    fn try_map_at(
        at: usize,
        pages: usize,
        prot: i32,
        flags: i32,
        offset: usize,
        len: usize,
    ) -> Option<Anon> {
        let mapped = pages * 4096;
        let fixed = if at == 0 {
            0
        } else {
            libc::MAP_FIXED_NOREPLACE
        };
        // SAFETY: a fresh anonymous mapping; MAP_FIXED_NOREPLACE never
        // replaces an existing mapping.
        let p = unsafe {
            libc::mmap(
                at as *mut libc::c_void,
                mapped,
                prot,
                flags | fixed | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return None;
        }
        if at != 0 && p as usize != at {
            // A kernel before 4.17 takes the flag as a hint only.
            // SAFETY: the mapping just made, which nothing else knows.
            unsafe { libc::munmap(p, mapped) };
            return None;
        }
        let pages = Pages {
            base: NonNull::new(p.cast())?,
            mapped,
            heap: false,
        };
        Some(Anon::over(pages, offset, len))
    }

    /// `pages` pages of heap memory (`malloc`'s, page-aligned as perftest's
    /// `memalign` buffers: no other object shares their pages, which other
    /// threads of the test process could be writing while the pages are
    /// moved — see the module docs of `rnic_mlx5::function::user`), the view
    /// `len` bytes from `offset`.
    fn heap(pages: usize, offset: usize, len: usize) -> Anon {
        let mapped = pages * 4096;
        let layout = std::alloc::Layout::from_size_align(mapped, 4096).unwrap();
        // SAFETY: a non-zero layout.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        let pages = Pages {
            base: NonNull::new(p).unwrap(),
            mapped,
            heap: true,
        };
        Anon::over(pages, offset, len)
    }

    fn over(pages: Pages, offset: usize, len: usize) -> Anon {
        assert!(offset.is_multiple_of(8) && offset + len <= pages.mapped);
        Anon {
            pages: Arc::new(pages),
            offset,
            len,
        }
    }

    /// Another view of the same pages, `len` bytes from `offset`.
    fn view(&self, offset: usize, len: usize) -> Anon {
        assert!(offset.is_multiple_of(8) && offset + len <= self.pages.mapped);
        Anon {
            pages: self.pages.clone(),
            offset,
            len,
        }
    }

    fn base(&self) -> usize {
        self.pages.base.as_ptr() as usize
    }

    fn host(&self) -> usize {
        self.base() + self.offset
    }

    /// Every word of the pages (the region and the bytes around it).
    fn all(&self) -> &[AtomicU64] {
        // SAFETY: the pages live as long as `self` (its `Arc`), are
        // page-aligned and readable in every test that calls this; only
        // atomics are formed.
        unsafe {
            std::slice::from_raw_parts(self.pages.base.as_ptr().cast(), self.pages.mapped / 8)
        }
    }

    fn words(&self) -> &[AtomicU64] {
        &self.all()[self.offset / 8..(self.offset + self.len).div_ceil(8)]
    }

    fn fill(&self, seed: u8) {
        for (i, w) in self.all().iter().enumerate() {
            w.store(u64::from(seed) << 56 | i as u64, Ordering::Relaxed);
        }
    }

    fn snapshot(&self) -> Vec<u64> {
        self.all()
            .iter()
            .map(|w| w.load(Ordering::Relaxed))
            .collect()
    }
}

impl Memory for Anon {
    fn len(&self) -> usize {
        self.len
    }
    fn addr(&self) -> u64 {
        self.host() as u64
    }
    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), MemoryError> {
        check_range(MemAccess::Read, offset, dst.len(), self.len)?;
        read_words(self.words(), offset, dst)
    }
    fn write(&self, offset: usize, src: &[u8]) -> Result<(), MemoryError> {
        check_range(MemAccess::Write, offset, src.len(), self.len)?;
        write_words(self.words(), offset, src)
    }
    fn compare_swap_u64(&self, offset: usize, compare: u64, swap: u64) -> Result<u64, MemoryError> {
        check_range(MemAccess::Atomic, offset, 8, self.len)?;
        let w = &self.words()[offset / 8];
        Ok(
            match w.compare_exchange(compare, swap, Ordering::AcqRel, Ordering::Acquire) {
                Ok(v) | Err(v) => v,
            },
        )
    }
    fn fetch_add_u64(&self, offset: usize, add: u64) -> Result<u64, MemoryError> {
        check_range(MemAccess::Atomic, offset, 8, self.len)?;
        Ok(self.words()[offset / 8].fetch_add(add, Ordering::AcqRel))
    }
    fn host_addr(&self) -> Option<usize> {
        Some(self.host())
    }
}

/// The `/proc/self/maps` lines overlapping `[lo, hi)`.
fn maps_over(lo: usize, hi: usize) -> Vec<String> {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter(|l| {
            let (a, b) = l
                .split_whitespace()
                .next()
                .unwrap()
                .split_once('-')
                .unwrap();
            let (a, b) = (
                usize::from_str_radix(a, 16).unwrap(),
                usize::from_str_radix(b, 16).unwrap(),
            );
            a < hi && b > lo
        })
        .map(str::to_owned)
        .collect()
}

/// One end: an RC QP on a CQ of its own. Field order is drop order.
struct End {
    qp: QueuePair,
    cq: CompletionQueue,
    pd: ProtectionDomain,
    _ctx: Context,
    gid: Gid,
}

impl End {
    fn new(provider: &Arc<Mlx5Provider>, ip: IpAddr) -> End {
        let ctx = Mlx5Provider::context(provider);
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(256).unwrap();
        let qp = pd
            .create_qp(&cq, &cq, &QpInitAttr::new(QpType::Rc, CAPS))
            .unwrap();
        End {
            qp,
            cq,
            pd,
            _ctx: ctx,
            gid: Gid::from_ip(ip),
        }
    }

    fn wait(&mut self, n: usize) -> Vec<WorkCompletion> {
        common::wait_wcs(&mut self.cq, n)
    }
}

fn connect(a: &mut End, b: &mut End) {
    let init = InitParams {
        access: ALL,
        ..InitParams::default()
    };
    let rtr = RtrParams {
        max_dest_rd_atomic: 4,
        ..RtrParams::default()
    };
    let rts = RtsParams {
        max_rd_atomic: 4,
        ..RtsParams::default()
    };
    let (pa, pb) = (Psn::from_wire(0x10), Psn::from_wire(0x2000));
    a.qp.to_init(&init).unwrap();
    b.qp.to_init(&init).unwrap();
    b.qp.to_rtr(a.qp.qpn(), pa, a.gid, &rtr).unwrap();
    b.qp.to_rts(pb, &rts).unwrap();
    a.qp.to_rtr(b.qp.qpn(), pb, b.gid, &rtr).unwrap();
    a.qp.to_rts(pa, &rts).unwrap();
}

/// Two addresses of this process's own /24 (`127.241.<pid>.{n, n + 1}`).
fn ips_at(n: u8) -> (IpAddr, IpAddr) {
    let b = 60 + (std::process::id() % 40) as u8;
    (
        IpAddr::V4(Ipv4Addr::new(127, 241, b, n)),
        IpAddr::V4(Ipv4Addr::new(127, 241, b, n + 1)),
    )
}

fn ok(wcs: &[WorkCompletion]) -> Vec<(u64, WcStatus, WcOpcode)> {
    wcs.iter().map(|w| (w.wr_id, w.status, w.opcode)).collect()
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(37).wrapping_add(seed))
        .collect()
}

fn revoke(mr: &MemoryRegion) {
    mr.driver_mr()
        .downcast_ref::<Mlx5Mr>()
        .expect("an mlx5 region")
        .revoke()
        .unwrap();
}

#[test]
fn heap_and_mmap_memory_carry_write_read_send_and_atomics_and_dereg_revokes() {
    let (ip_a, ip_b) = ips_at(1);
    let (_emu_a, pa) = common::provider(ip_a);
    let (emu_b, pb) = common::provider(ip_b);
    let mut a = End::new(&pa, ip_a);
    let mut b = End::new(&pb, ip_b);
    connect(&mut a, &mut b);

    // A: plain heap memory (a Box of words, malloc'ed). B: an anonymous
    // mapping, the region 136 bytes into its first page, 40 000 bytes long
    // (it ends inside its tenth page), every word around it filled too.
    let heap = Arc::new(Anon::heap(12, 0, 48 << 10));
    let anon = Arc::new(Anon::map(
        12,
        libc::PROT_READ | libc::PROT_WRITE,
        libc::MAP_PRIVATE,
        136,
        40_000,
    ));
    anon.fill(0xA5);
    let before = anon.snapshot();
    let maps_before = maps_over(anon.base(), anon.base() + 4096);
    let mappings_before = emu_b.emulator().device().dma().mappings();
    let mr_a = a.pd.reg_mr(heap.clone(), ALL).unwrap();
    let mr_b = b.pd.reg_mr(anon.clone(), ALL).unwrap();
    assert_eq!(
        mr_b.addr(),
        anon.host() as u64,
        "the key is based at the VA"
    );
    assert_eq!(mr_a.addr(), heap.host() as u64);
    assert_eq!(
        anon.snapshot(),
        before,
        "registration kept every byte, around the region too"
    );
    assert!(
        emu_b
            .emulator()
            .device()
            .dma()
            .mappings()
            .iter()
            .any(|m| !mappings_before.contains(m) && m.1 == 10 * 4096),
        "the region's 10 pages are mapped for the device"
    );
    assert!(
        maps_over(anon.host(), anon.host() + 1)[0].contains("rnic-mr"),
        "over vfio-user the pages sit on the driver's memfd while registered"
    );

    // RDMA WRITE A → B at an odd offset, crossing page boundaries.
    let msg = pattern(10_000, 1);
    heap.write(0, &msg).unwrap();
    let s = [Sge::new(mr_a.addr(), 10_000, mr_a.lkey())];
    a.qp.post_send(&[SendWr::rdma_write(1, &s, mr_b.addr() + 4001, mr_b.rkey()).signaled()])
        .unwrap();
    assert_eq!(
        ok(&a.wait(1)),
        [(1, WcStatus::Success, WcOpcode::RdmaWrite)]
    );
    let mut got = vec![0u8; 10_000];
    anon.read(4001, &mut got).unwrap();
    assert_eq!(got, msg, "WRITE landed in the application's mapping");

    // RDMA READ B → A: B's last 3000 bytes (the region's tail page).
    let tail = pattern(3000, 9);
    anon.write(40_000 - 3000, &tail).unwrap();
    let s = [Sge::new(mr_a.addr() + 20_000, 3000, mr_a.lkey())];
    a.qp.post_send(&[SendWr::rdma_read(2, &s, mr_b.addr() + 37_000, mr_b.rkey()).signaled()])
        .unwrap();
    assert_eq!(ok(&a.wait(1)), [(2, WcStatus::Success, WcOpcode::RdmaRead)]);
    let mut got = vec![0u8; 3000];
    heap.read(20_000, &mut got).unwrap();
    assert_eq!(got, tail);

    // SEND A → RECV B (into the mmap region), 5000 bytes.
    let r = [Sge::new(mr_b.addr() + 16_000, 6000, mr_b.lkey())];
    b.qp.post_recv(&[RecvWr::new(30, &r)]).unwrap();
    let msg = pattern(5000, 4);
    heap.write(30_000, &msg).unwrap();
    let s = [Sge::new(mr_a.addr() + 30_000, 5000, mr_a.lkey())];
    a.qp.post_send(&[SendWr::send(3, &s).signaled()]).unwrap();
    assert_eq!(ok(&a.wait(1)), [(3, WcStatus::Success, WcOpcode::Send)]);
    let w = b.wait(1);
    assert_eq!(
        (w[0].wr_id, w[0].status, w[0].byte_len),
        (30, WcStatus::Success, 5000)
    );
    let mut got = vec![0u8; 5000];
    anon.read(16_000, &mut got).unwrap();
    assert_eq!(got, msg);

    // Atomics on B's word at region offset 8 (8-aligned in the mapping);
    // an mlx5 responder keeps it big-endian, an mlx5 requester returns
    // the original big-endian.
    anon.write(8, &100u64.to_be_bytes()).unwrap();
    let res = [Sge::new(mr_a.addr() + 40_000, 8, mr_a.lkey())];
    a.qp.post_send(&[
        SendWr::atomic_fetch_add(4, &res, mr_b.addr() + 8, mr_b.rkey(), 5).signaled(),
    ])
    .unwrap();
    assert_eq!(ok(&a.wait(1)), [(4, WcStatus::Success, WcOpcode::FetchAdd)]);
    let mut word = [0u8; 8];
    heap.read(40_000, &mut word).unwrap();
    assert_eq!(
        word,
        100u64.to_be_bytes(),
        "fetch-add returned the original"
    );
    let res = [Sge::new(mr_a.addr() + 40_008, 8, mr_a.lkey())];
    a.qp.post_send(&[
        SendWr::atomic_cmp_swap(5, &res, mr_b.addr() + 8, mr_b.rkey(), 105, 7).signaled(),
    ])
    .unwrap();
    assert_eq!(ok(&a.wait(1)), [(5, WcStatus::Success, WcOpcode::CompSwap)]);
    heap.read(40_008, &mut word).unwrap();
    assert_eq!(word, 105u64.to_be_bytes());
    anon.read(8, &mut word).unwrap();
    assert_eq!(
        word,
        7u64.to_be_bytes(),
        "compare-swap stored the new value"
    );

    // Deregistration while B's QP still holds the region (it named it in a
    // receive): the key is destroyed and the pages given back at once.
    let kept = anon.snapshot();
    let registered = emu_b.emulator().device().dma().mappings();
    revoke(&mr_b);
    let left = emu_b.emulator().device().dma().mappings();
    let gone: Vec<_> = registered.iter().filter(|m| !left.contains(m)).collect();
    assert_eq!(
        (gone.len(), left.len() + 1, gone[0].1),
        (1, registered.len(), 10 * 4096),
        "the device mapping of the region's 10 pages is gone, nothing else"
    );
    assert_eq!(anon.snapshot(), kept, "dereg kept the contents");
    let base = anon.base();
    let now = maps_over(base, base + 12 * 4096);
    assert!(
        now.iter().all(|l| l.contains(" rw-p 00000000 00:00 0 ")),
        "the pages are private anonymous memory again: {now:?} (before: {maps_before:?})"
    );
    let s = [Sge::new(mr_a.addr(), 64, mr_a.lkey())];
    a.qp.post_send(&[SendWr::rdma_write(6, &s, mr_b.addr(), mr_b.rkey()).signaled()])
        .unwrap();
    let w = a.wait(1);
    assert_eq!(
        (w[0].wr_id, w[0].status),
        (6, WcStatus::RemAccessErr),
        "a WRITE through the revoked key is refused: {w:?}"
    );
    assert_eq!(anon.snapshot(), kept, "and touched nothing");
    // The memory is the application's again: written and read by the CPU.
    anon.write(0, b"still usable").unwrap();
    let mut back = [0u8; 12];
    anon.read(0, &mut back).unwrap();
    assert_eq!(&back, b"still usable");
    drop((mr_a, mr_b));
    drop((a, b));
}

#[test]
fn two_registrations_share_pages_and_read_only_memory_is_served_read_only() {
    let (ip_a, ip_b) = ips_at(3);
    let (_ea, pa) = common::provider(ip_a);
    let (_eb, pb) = common::provider(ip_b);
    let mut a = End::new(&pa, ip_a);
    let mut b = End::new(&pb, ip_b);
    connect(&mut a, &mut b);
    let local = Arc::new(Anon::heap(4, 0, 16 << 10));
    let mr_a = a.pd.reg_mr(local.clone(), ALL).unwrap();

    // Two regions in the same pages of one mapping: the second reuses the
    // memfd the first moved them onto (and extends past it); each works and
    // the pages go back only with the last.
    let m = Anon::map(
        4,
        libc::PROT_READ | libc::PROT_WRITE,
        libc::MAP_PRIVATE,
        0,
        16 << 10,
    );
    m.fill(3);
    let first = Arc::new(m.view(512, 1024));
    let second = Arc::new(m.view(1024, 8192));
    let r1 = b.pd.reg_mr(first.clone(), ALL).unwrap();
    let r2 = b.pd.reg_mr(second.clone(), ALL).unwrap();
    let pieces = |r: &MemoryRegion| {
        r.driver_mr()
            .downcast_ref::<Mlx5Mr>()
            .unwrap()
            .mkey()
            .user_pieces()
    };
    assert_eq!(pieces(&r1), Some(1));
    assert_eq!(pieces(&r2), Some(2), "the shared page and the rest");
    let msg = pattern(8192, 7);
    local.write(0, &msg).unwrap();
    let s = [Sge::new(mr_a.addr(), 8192, mr_a.lkey())];
    a.qp.post_send(&[SendWr::rdma_write(1, &s, r2.addr(), r2.rkey()).signaled()])
        .unwrap();
    assert_eq!(
        ok(&a.wait(1)),
        [(1, WcStatus::Success, WcOpcode::RdmaWrite)]
    );
    let mut got = vec![0u8; 512];
    first.read(512, &mut got).unwrap();
    assert_eq!(got, msg[..512], "seen through the other registration too");
    let mut got = vec![0u8; 1024];
    revoke(&r1);
    let s = [Sge::new(mr_a.addr(), 8192, mr_a.lkey())];
    a.qp.post_send(&[SendWr::rdma_read(2, &s, r2.addr(), r2.rkey()).signaled()])
        .unwrap();
    assert_eq!(ok(&a.wait(1)), [(2, WcStatus::Success, WcOpcode::RdmaRead)]);
    local.read(0, &mut got).unwrap();
    assert_eq!(got, msg[..1024], "the second still maps the shared page");
    let held = m.snapshot();
    revoke(&r2);
    assert_eq!(m.snapshot(), held);
    assert!(
        maps_over(m.host(), m.host() + (16 << 10))
            .iter()
            .all(|l| !l.contains("rnic-mr")),
        "the last one gave the pages back"
    );

    // Read-only memory registered for remote reads only: served, and read-
    // only again afterwards.
    let ro = Anon::map(
        2,
        libc::PROT_READ | libc::PROT_WRITE,
        libc::MAP_PRIVATE,
        0,
        8192,
    );
    ro.fill(9);
    // SAFETY: the test's own mapping; nothing holds a reference into it.
    let r = unsafe { libc::mprotect(ro.base() as *mut libc::c_void, 8192, libc::PROT_READ) };
    assert_eq!(r, 0);
    let ro = Arc::new(ro);
    let want = ro.snapshot();
    let rr = b.pd.reg_mr(ro.clone(), AccessFlags::REMOTE_READ).unwrap();
    assert!(maps_over(ro.host(), ro.host() + 1)[0].contains(" r--s "));
    let s = [Sge::new(mr_a.addr(), 8192, mr_a.lkey())];
    a.qp.post_send(&[SendWr::rdma_read(3, &s, rr.addr(), rr.rkey()).signaled()])
        .unwrap();
    assert_eq!(ok(&a.wait(1)), [(3, WcStatus::Success, WcOpcode::RdmaRead)]);
    let mut got = vec![0u8; 8192];
    local.read(0, &mut got).unwrap();
    let want_bytes: Vec<u8> = want.iter().flat_map(|w| w.to_ne_bytes()).collect();
    assert_eq!(got, want_bytes);
    let s = [Sge::new(mr_a.addr(), 8, mr_a.lkey())];
    a.qp.post_send(&[SendWr::rdma_write(4, &s, rr.addr(), rr.rkey()).signaled()])
        .unwrap();
    assert_eq!(
        a.wait(1)[0].status,
        WcStatus::RemAccessErr,
        "no write right"
    );
    revoke(&rr);
    assert!(maps_over(ro.host(), ro.host() + 1)[0].contains(" r--p "));
    assert_eq!(ro.snapshot(), want);
    drop((r1, r2, rr, mr_a));
}

#[test]
fn bad_ranges_are_refused_with_the_typed_error_and_nothing_changes() {
    let (_emu, p) = common::provider(ips_at(5).0);
    let ctx = Mlx5Provider::context(&p);
    let pd = ctx.alloc_pd().unwrap();
    let kind = |e: VerbsError| match e {
        VerbsError::RegMr { source, .. } => (source.kind, source.status),
        e => panic!("not a reg_mr error: {e:?}"),
    };

    // Unmapped: a range whose pages were unmapped (low, so that no mapping
    // a parallel test makes lands in the hole before the registration).
    let gone = Anon::map_low(2);
    let view = Arc::new(gone.view(0, 8192));
    // SAFETY: the test's own mapping; the view is only registered, which
    // must refuse it, and the pages' owner is forgotten (never unmapped twice).
    let r = unsafe { libc::munmap(gone.base() as *mut libc::c_void, 8192) };
    assert_eq!(r, 0);
    std::mem::forget(gone);
    let e = pd.reg_mr(view, ALL).unwrap_err();
    assert_eq!(kind(e), (DeviceErrorKind::Os, libc::EFAULT as u32));

    // Read-only with write access.
    let ro = Anon::map(1, libc::PROT_READ, libc::MAP_PRIVATE, 0, 4096);
    let maps = maps_over(ro.host(), ro.host() + 4096);
    let ro = Arc::new(ro);
    let e = pd.reg_mr(ro.clone(), ALL).unwrap_err();
    assert_eq!(kind(e), (DeviceErrorKind::Os, libc::EFAULT as u32));
    assert_eq!(
        maps_over(ro.host(), ro.host() + 4096),
        maps,
        "nothing moved"
    );

    // A MAP_SHARED mapping the driver did not make.
    let sh = Arc::new(Anon::map(
        1,
        libc::PROT_READ | libc::PROT_WRITE,
        libc::MAP_SHARED,
        0,
        4096,
    ));
    sh.fill(1);
    let want = sh.snapshot();
    let e = pd.reg_mr(sh.clone(), ALL).unwrap_err();
    assert_eq!(kind(e).0, DeviceErrorKind::Unsupported);
    assert_eq!(sh.snapshot(), want);

    // The error itself names the fix.
    let f = p.hca().function();
    let e = f.map_user(sh.host(), 4096, true).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("MAP_SHARED") && msg.contains("private memory"),
        "{msg}"
    );
    let e = f.map_user(0, 10, false).unwrap_err();
    assert!(e.to_string().contains("empty"), "{e}");
    // And the function still registers good memory afterwards.
    let good = Arc::new(Anon::heap(1, 0, 4096));
    pd.reg_mr(good, ALL).unwrap();
    drop(ctx);
}

/// Fork a child that reads the byte at `addr` and exits with it; how the
/// child ended (`Ok(byte)`, or `Err(signal)`).
fn child_reads(addr: usize) -> Result<u8, i32> {
    // SAFETY: the child only reads one byte (through a raw pointer, a
    // volatile load) and calls `_exit`: async-signal-safe work, as a child
    // of a multi-threaded process must restrict itself to.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        // SAFETY: in the child: the parent mapped `addr`; if the mapping
        // was not inherited the read faults, which is what is tested.
        let b = unsafe { std::ptr::read_volatile(addr as *const u8) };
        // SAFETY: ends the child without running the parent's atexit
        // handlers or destructors.
        unsafe { libc::_exit(i32::from(b)) };
    }
    let mut status = 0;
    // SAFETY: waits for the child just made; `status` is a valid out-pointer.
    let r = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(r, pid);
    if libc::WIFSIGNALED(status) {
        Err(libc::WTERMSIG(status))
    } else {
        Ok(libc::WEXITSTATUS(status) as u8)
    }
}

/// While registered the pages carry MADV_DONTFORK (as `ibv_fork_init` gives
/// registered memory): a forked child gets no mapping there rather than the
/// parent's pages shared; after deregistration the pages fork as any other
/// private memory (the child reads its own copy).
#[test]
fn a_fork_while_registered_gives_the_child_no_mapping_and_after_dereg_a_copy() {
    let (_emu, p) = common::provider(ips_at(7).0);
    let ctx = Mlx5Provider::context(&p);
    let pd = ctx.alloc_pd().unwrap();
    let m = Arc::new(Anon::map(
        2,
        libc::PROT_READ | libc::PROT_WRITE,
        libc::MAP_PRIVATE,
        0,
        8192,
    ));
    m.write(100, &[42]).unwrap();
    assert_eq!(child_reads(m.host() + 100), Ok(42), "before registration");
    let mr = pd.reg_mr(m.clone(), ALL).unwrap();
    assert_eq!(
        child_reads(m.host() + 100),
        Err(libc::SIGSEGV),
        "registered pages are not inherited"
    );
    revoke(&mr);
    m.write(100, &[43]).unwrap();
    assert_eq!(child_reads(m.host() + 100), Ok(43), "private memory again");
    drop(mr);
}

/// Inline sends whose source is application memory registered in place (the
/// CPU reads it through the region's `Memory` at post time), at an RC QP's
/// most inline bytes: a 236-byte SEND (one BlueFlame half) and a 236-byte
/// RDMA WRITE (5 WQEBBs), from an unaligned offset, byte-exact at the peer;
/// one byte more is refused at post, the QP still usable.
#[test]
fn inline_sends_read_application_memory_up_to_the_rc_limit() {
    let (ip_a, ip_b) = ips_at(9);
    let (_ea, pa) = common::provider(ip_a);
    let (_eb, pb) = common::provider(ip_b);
    let mut a = End::new(&pa, ip_a);
    let mut b = End::new(&pb, ip_b);
    connect(&mut a, &mut b);
    let src = Arc::new(Anon::map(
        1,
        libc::PROT_READ | libc::PROT_WRITE,
        libc::MAP_PRIVATE,
        0,
        4096,
    ));
    let dst = Arc::new(Anon::heap(1, 0, 4096));
    let mr_a = a.pd.reg_mr(src.clone(), ALL).unwrap();
    let mr_b = b.pd.reg_mr(dst.clone(), ALL).unwrap();
    let msg = pattern(236, 5);
    src.write(3, &msg).unwrap();
    let s = [Sge::new(mr_a.addr() + 3, 236, mr_a.lkey())];
    let r = [Sge::new(mr_b.addr(), 1024, mr_b.lkey())];
    b.qp.post_recv(&[RecvWr::new(9, &r)]).unwrap();
    a.qp.post_send(&[
        SendWr::send(1, &s).signaled().inline(),
        SendWr::rdma_write(2, &s, mr_b.addr() + 2048, mr_b.rkey())
            .signaled()
            .inline(),
    ])
    .unwrap();
    assert_eq!(
        ok(&a.wait(2)),
        [
            (1, WcStatus::Success, WcOpcode::Send),
            (2, WcStatus::Success, WcOpcode::RdmaWrite)
        ]
    );
    let w = b.wait(1);
    assert_eq!(
        (w[0].wr_id, w[0].status, w[0].byte_len),
        (9, WcStatus::Success, 236)
    );
    let mut got = vec![0u8; 236];
    dst.read(0, &mut got).unwrap();
    assert_eq!(got, msg, "inline SEND");
    dst.read(2048, &mut got).unwrap();
    assert_eq!(got, msg, "inline WRITE");
    let long = [Sge::new(mr_a.addr(), 237, mr_a.lkey())];
    let e =
        a.qp.post_send(&[SendWr::send(3, &long).signaled().inline()])
            .unwrap_err();
    assert!(matches!(e, VerbsError::PostSend { index: 0, .. }), "{e:?}");
    a.qp.post_send(&[SendWr::rdma_write(4, &s, mr_b.addr(), mr_b.rkey()).signaled()])
        .unwrap();
    assert_eq!(
        ok(&a.wait(1)),
        [(4, WcStatus::Success, WcOpcode::RdmaWrite)]
    );
    drop((mr_a, mr_b));
}

/// One 2 MiB anonymous hugetlb page (`MAP_PRIVATE | MAP_HUGETLB`), the view
/// `len` bytes from `offset`; when the pool has no free page and this is
/// root, the pool grows by one first. `None` (and why, on stderr) when no
/// hugetlb page can be had.
fn huge_page(offset: usize, len: usize) -> Option<Anon> {
    let try_map = || {
        Anon::try_map(
            512,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_HUGETLB,
            offset,
            len,
        )
    };
    let huge = try_map().or_else(|| {
        let path = "/proc/sys/vm/nr_hugepages";
        let n: usize = std::fs::read_to_string(path).ok()?.trim().parse().ok()?;
        std::fs::write(path, (n + 1).to_string()).ok()?;
        try_map()
    });
    if huge.is_none() {
        eprintln!(
            "skipping the hugetlb case: no free 2 MiB hugetlb page and the pool cannot grow \
             (as root: echo 1 > /proc/sys/vm/nr_hugepages)"
        );
    }
    huge
}

/// Over vfio-user, hugetlb memory cannot be moved onto the driver's 4 KiB
/// memfd: the registration is refused as unsupported (EOPNOTSUPP through
/// the drop-in) with the typed problem naming the page, and the mapping
/// and its bytes are as they were; 4 KiB memory registers afterwards.
#[test]
fn hugetlb_memory_is_refused_over_vfio_user_and_left_as_it_was() {
    let Some(huge) = huge_page(8192, 40_000) else {
        return;
    };
    let huge = Arc::new(huge);
    huge.fill(0x5A);
    let before = huge.snapshot();
    let maps = maps_over(huge.base(), huge.base() + (2 << 20));
    assert!(maps[0].contains("/anon_hugepage"), "{maps:?}");
    let (_emu, p) = common::provider(ips_at(7).0);
    let ctx = Mlx5Provider::context(&p);
    let pd = ctx.alloc_pd().unwrap();
    match pd.reg_mr(huge.clone(), ALL).unwrap_err() {
        VerbsError::RegMr { source, .. } => {
            assert_eq!(source.kind, DeviceErrorKind::Unsupported, "{source:?}");
            assert!(source.what.contains("hugetlb"), "{source:?}");
        }
        e => panic!("not a reg_mr error: {e:?}"),
    }
    let e = p
        .hca()
        .function()
        .map_user(huge.host(), 40_000, true)
        .unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains(&format!("{:#x}", huge.host())) && msg.contains("alloc_dma"),
        "{msg}"
    );
    assert_eq!(
        maps_over(huge.base(), huge.base() + (2 << 20)),
        maps,
        "nothing moved"
    );
    assert_eq!(huge.snapshot(), before, "nothing written");
    let good = Arc::new(Anon::heap(1, 0, 4096));
    pd.reg_mr(good, ALL).unwrap();
    drop(ctx);
}
