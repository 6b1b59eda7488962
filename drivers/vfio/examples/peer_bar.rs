//! A peer PCI BAR in a DMA device's IOMMU domain, on real VFIO: QEMU's
//! `ivshmem-plain` (1af4:1110, its BAR2 backed by a host file) stands in for
//! a GPU's BAR1, and the `edu` device (1234:11e8) for the NIC.
//!
//! Both are bound to vfio-pci (each in its own group and container). The
//! ivshmem's BAR2, mmapped through VFIO (a `VM_PFNMAP` mapping), is mapped
//! into edu's container with `VFIO_IOMMU_MAP_DMA` as an rnic-dma
//! `PeerRegion`; then:
//!
//! 1. edu DMAs pattern A into the region's IOVA + 0: the CPU reads it back
//!    through the ivshmem BAR, and the host checks the backing file;
//! 2. the ivshmem's device and BAR handles are dropped first — the region
//!    holds the BAR mapping, so edu's DMA of pattern B to IOVA + 8 KiB still
//!    lands (teardown order enforced by ownership);
//! 3. the region is dropped (unmapped from edu's IOMMU, IOVA freed), and the
//!    same DMA of pattern C to IOVA + 0 and + 8 KiB faults: the file keeps A
//!    and B (the guest kernel logs a DMAR fault at that IOVA).
//!
//! Prints `CHECK <name>: PASS|FAIL <detail>`, `PEER ...` lines the host
//! harness reads, and `RESULT: PASS|FAIL`; restores both drivers.
//!
//! usage: peer_bar [EDU_BDF IVSHMEM_BDF]

use std::process::ExitCode;
use std::sync::Arc;

use rnic_core::{Memory, PciAddr};
use rnic_dma::{DmaRegion, Mmio, PagePolicy, PageSize, PeerRegion};
use rnic_vfio::{Sysfs, VfioDevice};

const WINDOW: usize = 64 << 10;
const SECOND: usize = 8192;

#[path = "edu_common/mod.rs"]
mod edu_common;
use edu_common::{CMD_TO_RAM, DMA_MASK, EDU_BUF, LEN, Res, dma};

/// The three patterns (the host harness recomputes them).
fn pattern(which: u8, i: usize) -> u8 {
    match which {
        b'A' => (i * 7 + 3) as u8,
        b'B' => (i * 13 + 5) as u8,
        _ => (i * 11 + 1) as u8 ^ 0x80,
    }
}

struct Report(bool);

impl Report {
    fn check(&mut self, name: &str, ok: bool, detail: impl AsRef<str>) -> bool {
        println!(
            "CHECK {name}: {} {}",
            if ok { "PASS" } else { "FAIL" },
            detail.as_ref()
        );
        self.0 |= !ok;
        ok
    }
}

/// Load edu's buffer with `which` (RAM → edu), then DMA it to `iova`.
fn edu_to(edu: &Mmio, ram: &DmaRegion, which: u8, iova: u64) -> Res<()> {
    let data: Vec<u8> = (0..LEN).map(|i| pattern(which, i)).collect();
    ram.write(0, &data)?;
    dma(edu, ram.iova().0, EDU_BUF, LEN, 0)?;
    dma(edu, EDU_BUF, iova, LEN, CMD_TO_RAM).map(drop)
}

fn is(bytes: &[u8], which: u8) -> bool {
    bytes
        .iter()
        .enumerate()
        .all(|(i, b)| *b == pattern(which, i))
}

fn main() -> ExitCode {
    let sysfs = Sysfs::system();
    let arg = |n: usize, vendor: u16, device: u16| -> Option<PciAddr> {
        match std::env::args().nth(n) {
            Some(a) => a.parse().ok(),
            None => sysfs.find(vendor, device).first().copied(),
        }
    };
    let (Some(edu), Some(shm)) = (arg(1, 0x1234, 0x11e8), arg(2, 0x1af4, 0x1110)) else {
        println!("CHECK find: FAIL need an edu (1234:11e8) and an ivshmem-plain (1af4:1110)");
        println!("RESULT: FAIL");
        return ExitCode::FAILURE;
    };
    let mut r = Report(false);
    let mut bindings = Vec::new();
    for a in [edu, shm] {
        match sysfs.bind(&a, "vfio-pci") {
            Ok(b) => {
                r.check("peer-bind", true, format!("{a} on vfio-pci"));
                bindings.push(b);
            }
            Err(e) => {
                r.check("peer-bind", false, format!("{a}: {e}"));
            }
        }
    }
    if bindings.len() == 2
        && let Err(e) = drive(&mut r, &edu, &shm)
    {
        r.check("peer-run", false, e.to_string());
    }
    for b in bindings {
        if let Err(e) = sysfs.restore(b) {
            r.check("peer-restore", false, e.to_string());
        }
    }
    println!("RESULT: {}", if r.0 { "FAIL" } else { "PASS" });
    if r.0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn drive(r: &mut Report, edu_addr: &PciAddr, shm_addr: &PciAddr) -> Res<()> {
    let edu_dev = VfioDevice::open(edu_addr)?;
    let container = edu_dev.container().clone();
    let edu = edu_dev.map_bar(0)?;
    edu_dev.enable_bus_master()?;
    let domain = edu_dev.dma_domain(DMA_MASK);
    let ram = DmaRegion::builder(2 << 20)
        .pages(PagePolicy::Prefer(PageSize::Huge2M))
        .domain(domain.clone())
        .build()?;

    let shm_dev = VfioDevice::open(shm_addr)?;
    shm_dev.enable_bus_master()?; // memory decoding for the CPU's BAR accesses
    let shm_bar = shm_dev.map_bar(2)?;
    println!(
        "PEER ivshmem {shm_addr} BAR2 {} KiB, group {}; edu {edu_addr} group {}",
        shm_bar.len() >> 10,
        shm_dev.container().group(),
        container.group()
    );
    shm_bar.write_bytes(0, &[0u8; 3 * SECOND])?;
    let before = container.mappings().len();
    let region: Arc<PeerRegion> = PeerRegion::map(&shm_bar, 0, WINDOW, &domain)?;
    let iova = region.iova().0;
    let mapped = container.mappings().contains(&(iova, WINDOW as u64));
    r.check(
        "peer-map",
        mapped && region.iova() == Memory::iova(&*region).unwrap_or(rnic_core::Iova(0)),
        format!(
            "ivshmem BAR2 [0, {WINDOW:#x}) at edu IOVA {iova:#x} (VFIO_IOMMU_MAP_DMA of the \
             PFNMAP mapping; edu container mappings {before} -> {})",
            container.mappings().len()
        ),
    );
    println!("PEER IOVA {iova:#x}");

    // 1. Device DMA into the peer's BAR.
    let first = edu_to(&edu, &ram, b'A', iova);
    let mut got = vec![0u8; LEN];
    shm_bar.read_bytes(0, &mut got)?;
    r.check(
        "peer-dma",
        first.is_ok() && is(&got, b'A'),
        format!(
            "edu DMA of {LEN} bytes to IOVA {iova:#x}: ivshmem BAR2 offset 0 {} ({:?})",
            if is(&got, b'A') {
                "holds pattern A"
            } else {
                "DIFFERS"
            },
            first.map_err(|e| e.to_string())
        ),
    );

    // 2. The peer's own handles go first; the region keeps its BAR.
    let shm_cpu = region.bar().clone();
    drop((shm_bar, shm_dev));
    let second = edu_to(&edu, &ram, b'B', iova + SECOND as u64);
    shm_cpu.read_bytes(SECOND, &mut got)?;
    r.check(
        "peer-teardown-order",
        second.is_ok() && is(&got, b'B'),
        format!(
            "ivshmem device and BAR handles dropped first: the region still holds the BAR, edu's \
             DMA to IOVA {:#x} {} ({:?})",
            iova + SECOND as u64,
            if is(&got, b'B') {
                "lands (pattern B)"
            } else {
                "DIFFERS"
            },
            second.map_err(|e| e.to_string())
        ),
    );

    // 3. Unmapped from edu's IOMMU: the same DMA faults.
    drop(region);
    let gone = !container
        .mappings()
        .iter()
        .any(|&(i, l)| i <= iova && iova < i + l);
    let _ = edu_to(&edu, &ram, b'C', iova);
    let _ = edu_to(&edu, &ram, b'C', iova + SECOND as u64);
    let mut a = vec![0u8; LEN];
    let mut b = vec![0u8; LEN];
    shm_cpu.read_bytes(0, &mut a)?;
    shm_cpu.read_bytes(SECOND, &mut b)?;
    r.check(
        "peer-unmapped-fault",
        gone && is(&a, b'A') && is(&b, b'B'),
        format!(
            "after the region dropped (IOVA {iova:#x} {} edu's container), the same DMAs of \
             pattern C: ivshmem keeps {} and {}",
            if gone { "gone from" } else { "STILL IN" },
            if is(&a, b'A') { "A" } else { "NOT A" },
            if is(&b, b'B') { "B" } else { "NOT B" },
        ),
    );
    drop((shm_cpu, ram, edu, edu_dev, domain));
    r.check(
        "peer-teardown",
        container.mappings().is_empty(),
        format!(
            "edu container mappings left: {}",
            container.mappings().len()
        ),
    );
    Ok(())
}
