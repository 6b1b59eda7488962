//! Helpers shared by the driver's integration tests against the emulated
//! function (`bringup.rs`, `datapath.rs`, `faults.rs`): a fresh emulated function on a
//! temporary socket, and raw PD commands through `Hca::exec`, independent of the
//! driver's resource code.
#![allow(clippy::unwrap_used, dead_code)]

use std::time::Duration;

pub mod peer;

use rnic_mlx5::{Hca, Mlx5Error};
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
