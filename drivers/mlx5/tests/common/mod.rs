//! Helpers shared by the driver's integration tests against the emulated
//! function (`bringup.rs`, `datapath.rs`, `faults.rs`): a fresh emulated function on a
//! temporary socket, and raw PD commands through `Hca::exec`, independent of the
//! driver's resource code.
#![allow(clippy::unwrap_used, dead_code)]

use std::time::{Duration, Instant};

pub mod peer;

use rnic_core::WorkCompletion;
use rnic_mlx5::{Cq, Hca, Mlx5Error};
use rnic_mlx5_emu::{Emulator, Options};
use rnic_mlx5_prm::{AllocPdOut, CmdOpcode, DeallocPdIn, DeallocPdOut};

/// A fresh emulated function (10 ms boot) on a socket in a temporary directory.
pub fn emulator() -> (Emulator, tempfile::TempDir) {
    emulator_with(Options::default())
}

/// [`emulator`] with `options` (its boot delay shortened to 10 ms).
pub fn emulator_with(options: Options) -> (Emulator, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let emu = Emulator::start(
        dir.path().join("mlx5.sock"),
        Options {
            boot_delay: Duration::from_millis(10),
            ..options
        },
    )
    .unwrap();
    (emu, dir)
}

/// ALLOC_PD through the raw command interface: the PD number.
pub fn alloc_pd(hca: &Hca) -> Result<u32, Mlx5Error> {
    let out = hca.exec(
        CmdOpcode::AllocPd,
        0,
        &[0u8; 16],
        AllocPdOut::<&[u8]>::SIZE_BYTES,
    )?;
    Ok(AllocPdOut::new_checked(&out[..]).unwrap().pd())
}

/// DEALLOC_PD of `pd` through the raw command interface.
pub fn dealloc_pd(hca: &Hca, pd: u32) -> Result<(), Mlx5Error> {
    let mut cmd = vec![0u8; DeallocPdIn::<&[u8]>::SIZE_BYTES];
    DeallocPdIn::new_checked(&mut cmd[..])
        .unwrap()
        .set_pd(pd)
        .unwrap();
    hca.exec(
        CmdOpcode::DeallocPd,
        0,
        &cmd,
        DeallocPdOut::<&[u8]>::SIZE_BYTES,
    )
    .map(drop)
}

/// Poll `cq` until `n` completions arrived (panics after 10 s, with the CQ's counters).
pub fn wait_cq(cq: &mut Cq, n: usize) -> Vec<WorkCompletion> {
    let mut out = Vec::new();
    let mut wcs = [WorkCompletion::default(); 16];
    let start = Instant::now();
    while out.len() < n {
        let got = cq.poll(&mut wcs);
        out.extend_from_slice(&wcs[..got]);
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "timed out: {out:?}, {:?}",
            cq.counters()
        );
        if got == 0 {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    out
}
