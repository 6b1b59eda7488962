//! The staging logic of `StagedMemory` on the host engine (host memory
//! standing in for VRAM, copies deferred until waited for): a write is in
//! device memory when it returns, a read returns what device memory holds,
//! large accesses cross slots correctly, bad ranges change nothing, atomics
//! read-modify-write the device word, and teardown runs buffer →
//! registration → context. Then the RC conformance sequence over rnic-rxe
//! into staged memory, with every byte checked on the device side.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;

use common::DeviceSide;
use rnic_core::{MemAccess, Memory, MemoryError, Mtu};
use rnic_dma::{DmaRegion, PagePolicy, PageSize};
use rnic_gpu::{CopyEngine, GpuError, HostEngine, Registered, StagedMemory, StagingConfig};
use rnic_testkit::pattern;

fn small_ring() -> StagingConfig {
    StagingConfig {
        slot_len: 4096,
        slots: 3,
        node: None,
    }
}

#[test]
fn engine_copies_are_deferred_until_waited_for() {
    let engine = HostEngine::new();
    let dev = engine.alloc(64).unwrap();
    let host = DmaRegion::builder(4096)
        .pages(PagePolicy::Require(PageSize::Base))
        .build()
        .unwrap();
    // An unregistered source is refused and nothing is queued.
    // SAFETY: ranges in bounds; nothing writes the source meanwhile.
    let e = unsafe { engine.to_device(&dev, 0, &host, 0, 8) }.unwrap_err();
    assert!(matches!(e, GpuError::NotRegistered { .. }), "{e}");
    assert_eq!(engine.pending(), 0);
    let reg = Registered::new(&engine, host.clone()).unwrap();
    host.write(0, b"deferred").unwrap();
    // SAFETY: as above.
    let f = unsafe { engine.to_device(&dev, 8, &host, 0, 8) }.unwrap();
    let mut now = [0u8; 8];
    dev.device_view().read(8, &mut now).unwrap();
    assert_eq!(
        now, [0; 8],
        "a queued copy ran before its fence was waited for"
    );
    engine.wait(f).unwrap();
    dev.device_view().read(8, &mut now).unwrap();
    assert_eq!(&now, b"deferred");
    // Out of range on the device side: refused before queueing.
    // SAFETY: refused before any access.
    let e = unsafe { engine.to_device(&dev, 60, &host, 0, 8) }.unwrap_err();
    assert!(
        matches!(e, GpuError::Memory(MemoryError::OutOfRange { .. })),
        "{e}"
    );
    drop(reg);
    engine.free(dev).unwrap();
}

#[test]
fn write_is_in_device_memory_when_it_returns_across_slots() {
    let engine = HostEngine::new();
    let mem = StagedMemory::new(&engine, 64 << 10, small_ring()).unwrap();
    // Unaligned, several times the ring (3 × 4 KiB), so slots are reused.
    let data = pattern(5 * 4096 + 123, 7);
    mem.write(1001, &data).unwrap();
    assert_eq!(engine.pending(), 0, "write returned with copies queued");
    assert!(
        mem.dev_read(1001, data.len()) == data,
        "device bytes differ"
    );
    assert_eq!(mem.dev_read(1000, 1), [0], "byte before the write touched");
    assert_eq!(
        mem.dev_read(1001 + data.len(), 1),
        [0],
        "byte after touched"
    );
    // 6 chunks of at most 4 KiB: one copy each.
    assert_eq!(engine.queued(), 6);
}

#[test]
fn read_returns_what_device_memory_holds() {
    let engine = HostEngine::new();
    let mem = StagedMemory::new(&engine, 64 << 10, small_ring()).unwrap();
    // A kernel writes VRAM directly; a read through the staging sees it.
    let data = pattern(7 * 4096 + 5, 9);
    mem.dev_write(333, &data);
    let mut back = vec![0u8; data.len()];
    mem.read(333, &mut back).unwrap();
    assert!(
        back == data,
        "read through staging differs from device memory"
    );
    // And again after the device changed: no stale staging.
    mem.dev_write(333, &[0x5A; 100]);
    let mut again = vec![0u8; 100];
    mem.read(333, &mut again).unwrap();
    assert_eq!(again, vec![0x5A; 100]);
    assert_eq!(engine.pending(), 0);
}

#[test]
fn bad_ranges_are_refused_and_change_nothing() {
    let engine = HostEngine::new();
    let mem = StagedMemory::new(&engine, 8192, small_ring()).unwrap();
    mem.write(0, &[0x11; 8192]).unwrap();
    let before = engine.queued();
    let e = mem.write(8000, &[0x22; 200]).unwrap_err();
    assert_eq!(
        e,
        MemoryError::OutOfRange {
            access: MemAccess::Write,
            offset: 8000,
            len: 200,
            region_len: 8192
        }
    );
    assert!(mem.read(usize::MAX, &mut [0u8; 2]).is_err());
    assert!(matches!(
        mem.fetch_add_u64(12, 1).unwrap_err(),
        MemoryError::Misaligned { .. }
    ));
    assert_eq!(engine.queued(), before, "a refused access queued a copy");
    assert_eq!(mem.dev_read(0, 8192), vec![0x11; 8192]);
}

#[test]
fn atomics_read_modify_write_the_device_word() {
    let engine = HostEngine::new();
    let mem = StagedMemory::new(&engine, 4096, small_ring()).unwrap();
    mem.dev_write(64, &1000u64.to_ne_bytes());
    assert_eq!(mem.fetch_add_u64(64, 46).unwrap(), 1000);
    assert_eq!(mem.dev_read(64, 8), 1046u64.to_ne_bytes());
    assert_eq!(mem.compare_swap_u64(64, 1046, 7).unwrap(), 1046);
    assert_eq!(mem.compare_swap_u64(64, 1, 2).unwrap(), 7);
    assert_eq!(mem.dev_read(64, 8), 7u64.to_ne_bytes());
}

#[test]
fn concurrent_writers_to_disjoint_ranges() {
    let engine = HostEngine::new();
    let mem = Arc::new(StagedMemory::new(&engine, 256 << 10, small_ring()).unwrap());
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let mem = mem.clone();
            std::thread::spawn(move || {
                for i in 0..16usize {
                    let off = (t * 16 + i) * 4096;
                    mem.write(off, &pattern(4096, (t * 100 + i) as u32))
                        .unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    for t in 0..4usize {
        for i in 0..16usize {
            let off = (t * 16 + i) * 4096;
            assert!(mem.dev_read(off, 4096) == pattern(4096, (t * 100 + i) as u32));
        }
    }
}

#[test]
fn teardown_is_buffer_then_registration_then_context() {
    let engine = HostEngine::new();
    let log = engine.log();
    let mem = StagedMemory::new(&engine, 8192, small_ring()).unwrap();
    let staging = mem.staging();
    assert_eq!(staging.len(), 3 * 4096);
    mem.write(0, b"x").unwrap();
    drop(engine);
    assert!(
        !log.entries().iter().any(|e| e == "context released"),
        "the context went while a buffer still used it"
    );
    drop(mem);
    let entries = log.entries();
    assert_eq!(
        entries,
        [
            "context created",
            "alloc 1 (8192 bytes)",
            "register host buffer (12288 bytes)",
            "free 1",
            "unregister host buffer (12288 bytes)",
            "context released",
        ],
        "{entries:?}"
    );
    // The staging pages outlive their registration (we still hold them).
    assert_eq!(staging.len(), 12288);
}

#[test]
fn empty_buffers_are_refused() {
    let engine = HostEngine::new();
    for cfg in [
        StagingConfig {
            slot_len: 0,
            ..small_ring()
        },
        StagingConfig {
            slots: 0,
            ..small_ring()
        },
    ] {
        assert!(matches!(
            StagedMemory::new(&engine, 4096, cfg),
            Err(GpuError::Unsupported { .. })
        ));
    }
    assert!(StagedMemory::new(&engine, 0, small_ring()).is_err());
}

/// Every RC operation over rnic-rxe into staged memory, at two MTUs: each
/// WRITE WITH IMMEDIATE's receive completion is checked against the device
/// bytes, each READ returns bytes written on the device side.
#[test]
fn rxe_conformance_into_staged_memory() {
    for mtu in [Mtu::Mtu1024, Mtu::Mtu4096] {
        let engine = HostEngine::new();
        let mem = Arc::new(
            StagedMemory::new(
                &engine,
                4 * rnic_testkit::MIB + 4096,
                StagingConfig::default(),
            )
            .unwrap(),
        );
        common::conformance_into_device(mem, mtu);
        assert_eq!(engine.pending(), 0);
    }
}
