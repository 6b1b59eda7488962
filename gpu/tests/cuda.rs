//! On a machine with an NVIDIA GPU (opt-in: run by scripts/gpu-check.sh;
//! `RNIC_TEST_GPU=1` makes a missing GPU a failure instead of a skip):
//! VRAM buffers, the CUDA copy engine's ordering, staged VRAM written and
//! read through the staging and checked with direct device copies, the
//! teardown order, dma-buf export, and the RC conformance sequence over
//! rnic-rxe into VRAM (every WRITE WITH IMMEDIATE byte-checked in VRAM on
//! its completion).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;

use common::DeviceSide;
use rnic_core::{Memory, Mtu};
use rnic_gpu::{Gpu, GpuError, StagedMemory, StagingConfig};
use rnic_testkit::pattern;

fn gpu() -> Option<Arc<Gpu>> {
    match Gpu::open(0) {
        Ok(g) => Some(g),
        Err(e) if std::env::var("RNIC_TEST_GPU").is_ok_and(|v| v == "1") => {
            panic!("RNIC_TEST_GPU=1 but no GPU: {e}")
        }
        Err(e @ (GpuError::NoDriver { .. } | GpuError::NoDevice { .. })) => {
            println!("SKIP: no GPU ({e})");
            None
        }
        Err(e) => panic!("a driver is present but opening GPU 0 failed: {e}"),
    }
}

#[test]
fn gpu_info_and_vram() {
    let Some(g) = gpu() else { return };
    let i = g.info();
    println!("GPU: {i:?}");
    assert!(i.total_mem > 0 && !i.name.is_empty());
    let again = Gpu::open(0).unwrap();
    assert!(Arc::ptr_eq(&g, &again), "one context per ordinal");
    let v = g.alloc_vram(1 << 20).unwrap();
    println!("VRAM {v:?}");
    if i.gpudirect_rdma {
        assert!(
            v.gpudirect_capable(),
            "cuMemAlloc memory not GPUDirect-capable"
        );
    }
    let data = pattern(1 << 20, 3);
    v.write_sync(0, &data).unwrap();
    let mut back = vec![0; 1 << 20];
    v.read_sync(0, &mut back).unwrap();
    assert!(back == data);
    assert!(v.write_sync((1 << 20) - 4, &[0; 8]).is_err());
    assert!(matches!(
        Gpu::open(usize::MAX >> 1),
        Err(GpuError::NoDevice { .. })
    ));
}

#[test]
fn staged_vram_round_trip_and_device_view() {
    let Some(g) = gpu() else { return };
    let mem = g.staged_memory(64 << 20, StagingConfig::default()).unwrap();
    println!(
        "staging: {} pages on node {:?} (GPU node {:?})",
        mem.staging().page_size(),
        mem.staging().stats().node_verified,
        g.info().numa_node
    );
    let data = pattern(9 << 20, 5);
    mem.write(12345, &data).unwrap();
    assert!(
        mem.dev_read(12345, data.len()) == data,
        "VRAM differs after write returned"
    );
    mem.dev_write(40 << 20, &data);
    let mut back = vec![0u8; data.len()];
    mem.read(40 << 20, &mut back).unwrap();
    assert!(back == data, "read through staging differs from VRAM");
    mem.dev_write(0, &5u64.to_ne_bytes());
    assert_eq!(mem.fetch_add_u64(0, 10).unwrap(), 5);
    assert_eq!(mem.dev_read(0, 8), 15u64.to_ne_bytes());
}

#[test]
fn dmabuf_export_where_supported() {
    let Some(g) = gpu() else { return };
    let v = g.alloc_vram(2 << 20).unwrap();
    match v.export_dmabuf(false) {
        Ok(fd) => println!("dma-buf fd {fd:?}"),
        Err(e @ GpuError::Unsupported { .. }) => {
            assert!(!g.info().dma_buf, "{e}");
            println!("SKIP dma-buf: {e}");
        }
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn rxe_write_with_imm_into_vram() {
    let Some(g) = gpu() else { return };
    for mtu in [Mtu::Mtu1024, Mtu::Mtu4096] {
        let mem = Arc::new(
            g.staged_memory(4 * rnic_testkit::MIB + 4096, StagingConfig::default())
                .unwrap(),
        );
        common::conformance_into_device(mem, mtu);
    }
}

#[test]
fn staged_teardown_releases_everything() {
    let Some(g) = gpu() else { return };
    let (free0, _) = g.context().mem_get_info().unwrap();
    for _ in 0..8 {
        let m: StagedMemory<_> = g
            .staged_memory(256 << 20, StagingConfig::default())
            .unwrap();
        m.write(0, &[1; 4096]).unwrap();
    }
    let (free1, _) = g.context().mem_get_info().unwrap();
    // 8 × 256 MiB allocated and dropped: no leak beyond allocator slack.
    assert!(
        free1 + (64 << 20) >= free0,
        "VRAM leaked: {free0} -> {free1}"
    );
}
