//! Without a CUDA driver every GPU entry point returns the typed NoDriver
//! error with the fix, and nothing panics. On a machine that has a driver,
//! the same test re-runs itself with `RNIC_GPU=off` (the switch that turns
//! GPU features off), so the no-driver path is checked there too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use rnic_gpu::{Gpu, GpuError, StagingConfig};

fn assert_no_driver(what: &str, e: GpuError) {
    match &e {
        GpuError::NoDriver { .. } => {}
        other => panic!("{what}: expected NoDriver, got {other:?}"),
    }
    let m = e.to_string();
    assert!(m.starts_with("no CUDA driver: "), "{what}: {m}");
    assert!(m.contains("Install the NVIDIA driver"), "{what}: {m}");
    assert!(m.contains("rnicctl doctor"), "{what}: {m}");
}

#[test]
fn every_entry_point_says_no_driver() {
    let forced = std::env::var("RNIC_GPU").is_ok_and(|v| v == "off");
    if rnic_gpu::driver().is_ok() && !forced {
        // A driver is here: check the no-driver path in a child process.
        let out = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "every_entry_point_says_no_driver", "--nocapture"])
            .env("RNIC_GPU", "off")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "child with RNIC_GPU=off failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    assert_no_driver("driver()", rnic_gpu::driver().unwrap_err());
    assert!(!rnic_gpu::available());
    assert_no_driver("device_count()", rnic_gpu::device_count().unwrap_err());
    for ordinal in [0, 1, 7] {
        assert_no_driver("Gpu::open", Gpu::open(ordinal).unwrap_err());
    }
    // Still no panic on a second call (the probe is cached).
    assert_no_driver("Gpu::open again", Gpu::open(0).unwrap_err());
    let _ = StagingConfig::default();
    if forced {
        let e = rnic_gpu::driver().unwrap_err().to_string();
        assert!(e.contains("RNIC_GPU=off"), "{e}");
    }
}
