//! Payloads sent in place (issue 30): request and READ-response payloads in
//! memory that offers direct access leave as iovecs into the registered
//! region — the kernel's copy is the only one on the sending side — and land
//! byte-exact with every ICRC verified in all 32 bits; memory without direct
//! access (GPU staging, BARs) and devices with the feature off copy as
//! before.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;

use common::*;
use rnic_core::{HeapMemory, Memory, MemoryError, Mtu, QpType, RecvWr, SendWr, WcStatus};
use rnic_dma::OwnedBuffer;
use rnic_rxe::{Progress, RxeConfig, RxeDevice, Target};

const LEN: usize = 1 << 20;

fn device(ip: std::net::IpAddr, in_place_min: usize) -> RxeDevice {
    RxeDevice::open(
        &RxeConfig::new(Target::Ip(ip))
            .with_progress(Progress::Thread)
            .with_tx_in_place_min(in_place_min),
    )
    .unwrap()
}

/// Heap memory that does not offer direct access, as GPU memory behind a
/// staging ring does not: the transport must copy it.
#[derive(Debug)]
struct Opaque(HeapMemory);

impl Memory for Opaque {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn addr(&self) -> u64 {
        self.0.addr()
    }
    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), MemoryError> {
        self.0.read(offset, dst)
    }
    fn write(&self, offset: usize, src: &[u8]) -> Result<(), MemoryError> {
        self.0.write(offset, src)
    }
    fn compare_swap_u64(&self, offset: usize, compare: u64, swap: u64) -> Result<u64, MemoryError> {
        self.0.compare_swap_u64(offset, compare, swap)
    }
    fn fetch_add_u64(&self, offset: usize, add: u64) -> Result<u64, MemoryError> {
        self.0.fetch_add_u64(offset, add)
    }
}

/// WRITEs and READs of sizes around the MTU up to 300 KiB, and a SEND
/// gathered from three SGEs in two regions, between `a` and `b`; every
/// byte checked. Returns nothing: the callers check the counters.
fn exchange(a: &Side, b: &Side, extra_a: &rnic_core::MemoryRegion, extra_mem: &dyn Memory) {
    let (mut qa, mut qb) = (a.qp(QpType::Rc), b.qp(QpType::Rc));
    connect(a, &mut qa, b, &mut qb, Mtu::Mtu1024);
    for (i, len) in [511usize, 512, 1023, 1024, 1025, 4096, 100_000, 300_000]
        .into_iter()
        .enumerate()
    {
        let data = rnic_testkit::pattern(len, 0x30 + i as u32);
        write_then_read_back(a, &mut qa, b, LEN / 2, &data, &[]);
    }
    // A SEND of 5000 + 700 + 3000 bytes from a's buffer, the second region,
    // and a's buffer again: one payload spanning three SGEs in two regions.
    let (p1, p2, p3) = (
        rnic_testkit::pattern(5000, 1),
        rnic_testkit::pattern(700, 2),
        rnic_testkit::pattern(3000, 3),
    );
    a.fill(0, &p1);
    extra_mem.write(100, &p2).unwrap();
    a.fill(200_000, &p3);
    let sges = [
        a.mr.sge(0, 5000).unwrap(),
        extra_a.sge(100, 700).unwrap(),
        a.mr.sge(200_000, 3000).unwrap(),
    ];
    let rsge = [b.mr.sge(0, 9000).unwrap()];
    qb.post_recv(&[RecvWr::new(7, &rsge)]).unwrap();
    qa.post_send(&[SendWr::send(3, &sges).signaled()]).unwrap();
    assert_eq!(wait(&a.cq, 1, &[])[0].status, WcStatus::Success);
    let wc = wait(&b.cq, 1, &[]);
    assert_eq!((wc[0].status, wc[0].byte_len), (WcStatus::Success, 8700));
    let want: Vec<u8> = [p1, p2, p3].concat();
    assert!(b.bytes(0, 8700) == want, "gathered SEND bytes differ");
}

/// Both sides clean: every packet received verified in all 32 ICRC bits.
fn assert_verified(d: &RxeDevice, who: &str) {
    let s = d.stats().device;
    assert_eq!(s.icrc_drops, 0, "{who}: {s:?}");
    assert_eq!(s.icrc_ok, s.rx_packets, "{who}: {s:?}");
    assert_eq!(s.tx_errors, 0, "{who}: {s:?}");
}

fn sides_with(
    mem: impl Fn() -> Arc<dyn Memory>,
    in_place_min: usize,
) -> (Side, Side, rnic_core::MemoryRegion, Arc<dyn Memory>) {
    let (ia, ib) = ip_pair();
    let a = Side::with_memory(device(ia, in_place_min), mem(), 512);
    let b = Side::with_memory(device(ib, in_place_min), mem(), 512);
    let extra = mem();
    let extra_mr = a.pd.reg_mr(Arc::clone(&extra), ALL).unwrap();
    (a, b, extra_mr, extra)
}

#[test]
fn payloads_in_direct_memory_leave_in_place_and_land_byte_exact() {
    let owned = || -> Arc<dyn Memory> { OwnedBuffer::zeroed(LEN + 4096) };
    let heap = || -> Arc<dyn Memory> { Arc::new(HeapMemory::new(LEN + 4096)) };
    for (name, mem) in [
        ("owned", &owned as &dyn Fn() -> Arc<dyn Memory>),
        ("heap", &heap),
    ] {
        let (a, b, extra_mr, extra) = sides_with(mem, rnic_rxe::DEFAULT_TX_IN_PLACE_MIN);
        exchange(&a, &b, &extra_mr, &*extra);
        let (sa, sb) = (a.dev.stats().device, b.dev.stats().device);
        // Requests (WRITE and SEND payloads of 512+ bytes) from a, READ
        // responses from b: in place; the 511-byte payloads were copied.
        assert!(
            sa.tx_in_place > 0 && sb.tx_in_place > 0,
            "{name}: {sa:?} {sb:?}"
        );
        assert!(sa.tx_in_place_bytes >= 400_000, "{name}: {sa:?}");
        assert!(sb.tx_in_place_bytes >= 400_000, "{name}: {sb:?}");
        assert!(
            sa.tx_in_place < sa.tx_packets,
            "the 511-byte WRITE was copied"
        );
        assert!(
            sa.gso_sends > 0,
            "{name}: in-place packets still leave in GSO sends"
        );
        assert_verified(&a.dev, name);
        assert_verified(&b.dev, name);
    }
}

#[test]
fn memory_without_direct_access_and_devices_with_it_off_copy() {
    let opaque = || -> Arc<dyn Memory> { Arc::new(Opaque(HeapMemory::new(LEN + 4096))) };
    let (a, b, extra_mr, extra) = sides_with(opaque, rnic_rxe::DEFAULT_TX_IN_PLACE_MIN);
    exchange(&a, &b, &extra_mr, &*extra);
    for d in [&a.dev, &b.dev] {
        assert_eq!(d.stats().device.tx_in_place, 0);
        assert_verified(d, "opaque");
    }
    let owned = || -> Arc<dyn Memory> { OwnedBuffer::zeroed(LEN + 4096) };
    let (a, b, extra_mr, extra) = sides_with(owned, usize::MAX);
    exchange(&a, &b, &extra_mr, &*extra);
    for d in [&a.dev, &b.dev] {
        assert_eq!(d.stats().device.tx_in_place, 0);
        assert_verified(d, "off");
    }
}

/// A SEND whose pieces lie in more regions than a transmit queue holds at
/// once between flushes still lands: the queue flushes early rather than
/// hold more.
#[test]
fn many_regions_in_one_round_flush_early_and_land() {
    let (ia, ib) = ip_pair();
    let a = Side::with_memory(device(ia, 512), OwnedBuffer::zeroed(LEN), 512);
    let b = Side::with_memory(device(ib, 512), OwnedBuffer::zeroed(LEN), 512);
    let (mut qa, mut qb) = (a.qp(QpType::Rc), b.qp(QpType::Rc));
    connect(&a, &mut qa, &b, &mut qb, Mtu::Mtu1024);
    let regions: Vec<(Arc<OwnedBuffer>, rnic_core::MemoryRegion)> = (0..12)
        .map(|i| {
            let m = OwnedBuffer::from_vec(rnic_testkit::pattern(2048, 100 + i));
            let mr = a.pd.reg_mr(Arc::clone(&m) as Arc<dyn Memory>, ALL).unwrap();
            (m, mr)
        })
        .collect();
    // Twelve WRITEs posted at once, one per region: twelve regions queued
    // in one round.
    let wrs: Vec<[rnic_core::Sge; 1]> = regions
        .iter()
        .map(|(_, mr)| [mr.sge(0, 2048).unwrap()])
        .collect();
    let posts: Vec<SendWr<'_>> = wrs
        .iter()
        .enumerate()
        .map(|(i, s)| {
            SendWr::rdma_write(i as u64, s, b.mr.addr() + (i * 2048) as u64, b.mr.rkey()).signaled()
        })
        .collect();
    qa.post_send(&posts).unwrap();
    let wcs = wait(&a.cq, 12, &[]);
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
    for i in 0..12 {
        assert_eq!(
            b.bytes(i * 2048, 2048),
            rnic_testkit::pattern(2048, 100 + i as u32),
            "region {i}"
        );
    }
    let s = a.dev.stats().device;
    assert!(s.tx_in_place >= 24, "{s:?}");
    assert_verified(&b.dev, "receiver");
    drop(qb);
}
