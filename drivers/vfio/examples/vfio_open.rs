//! Open a PCI function through rnic-vfio and say what happened: one line,
//! `OPEN OK <details>` or `OPEN ERROR: <the error, with its advice>`.
//! The VM test uses it to see the real kernel's answers on the error paths
//! (a non-viable group, a device bound to a host driver, a wrong address,
//! permission, RLIMIT_MEMLOCK).
//!
//! usage: vfio_open <BDF> [--map <MiB>]
//!
//! With `--map`, also maps an unpinned region of that size through the IOMMU
//! (`MAP OK ...` or `MAP ERROR: ...`): VFIO pins it itself and charges
//! RLIMIT_MEMLOCK.

use std::process::ExitCode;

use rnic_core::PciAddr;
use rnic_dma::{DmaRegion, PagePolicy, PageSize};
use rnic_vfio::VfioDevice;

fn main() -> ExitCode {
    let Some(arg) = std::env::args().nth(1) else {
        eprintln!("usage: vfio_open <BDF>");
        return ExitCode::from(2);
    };
    let addr: PciAddr = match arg.parse() {
        Ok(a) => a,
        Err(e) => {
            println!("OPEN ERROR: {e}");
            return ExitCode::FAILURE;
        }
    };
    match VfioDevice::open(&addr) {
        Ok(dev) => {
            let c = dev.container();
            println!(
                "OPEN OK {addr}: group {}, {}, IOVA ranges {:x?}",
                c.group(),
                dev.backend().describe(),
                c.iova_ranges()
            );
            let mib = std::env::args()
                .skip_while(|a| a != "--map")
                .nth(1)
                .and_then(|m| m.parse::<usize>().ok());
            let Some(mib) = mib else {
                return ExitCode::SUCCESS;
            };
            let region = DmaRegion::builder(mib << 20)
                .pages(PagePolicy::Require(PageSize::Base))
                .pin(false)
                .domain(dev.dma_domain(u64::MAX))
                .build();
            match region {
                Ok(r) => {
                    println!("MAP OK {mib} MiB at IOVA {}", r.iova());
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    println!("MAP ERROR: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Err(e) => {
            println!("OPEN ERROR: {e}");
            ExitCode::FAILURE
        }
    }
}
