//! Helpers shared by the driver's integration tests against the emulated
//! function (`bringup.rs`, `datapath.rs`, `faults.rs`): a fresh emulated function on a
//! temporary socket, and raw PD commands through `Hca::exec`, independent of the
//! driver's resource code.
#![allow(clippy::unwrap_used, dead_code)]

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub mod peer;

use rnic_core::WorkCompletion;
use rnic_mlx5::{Cq, Hca, HcaOptions, Mlx5Error, Mlx5Provider, PciFunction, VfioUserFunction};
use rnic_mlx5_emu::{Emulator, Options, TempFunction};
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

/// An mlx5 function on its own emulator as an `rnic_core` provider, GID 0 =
/// `ip` (bind the emulator first, so it drops after the provider's teardown
/// commands).
pub fn provider(ip: IpAddr) -> (TempFunction, Arc<Mlx5Provider>) {
    let emu = TempFunction::start().unwrap();
    let f: Arc<dyn PciFunction> = Arc::new(VfioUserFunction::connect(emu.socket()).unwrap());
    let hca = Hca::bring_up(
        f,
        HcaOptions {
            cmd_timeout: Some(Duration::from_secs(30)),
            ..HcaOptions::default()
        },
    )
    .unwrap();
    let provider = Mlx5Provider::new(hca).unwrap();
    provider.set_gid(0, ip).unwrap();
    (emu, provider)
}

/// Poll a core `CompletionQueue` until `n` completions arrived (panics after
/// 10 s with what came).
pub fn wait_wcs(cq: &mut rnic_core::CompletionQueue, n: usize) -> Vec<WorkCompletion> {
    let mut got = Vec::new();
    let mut wcs = [WorkCompletion::default(); 8];
    let start = Instant::now();
    while got.len() < n {
        let k = cq.poll(&mut wcs).unwrap();
        got.extend_from_slice(&wcs[..k]);
        assert!(start.elapsed() < Duration::from_secs(10), "{got:?}");
        if k == 0 {
            std::thread::sleep(Duration::from_micros(100));
        }
    }
    got
}
