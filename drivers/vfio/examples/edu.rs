//! A user-space driver for QEMU's `edu` device (1234:11e8) on rnic-vfio and
//! rnic-dma: bind to vfio-pci, MMIO through `Mmio`, DMA from hugepage-backed
//! `DmaRegion`s mapped through the IOMMU, a DMA to an unmapped IOVA that the
//! IOMMU must block, the DMA-completion MSI on an eventfd, NUMA placement on
//! every online node, and the original driver restored at the end.
//!
//! Prints one `CHECK <name>: PASS|FAIL|SKIP <detail>` line per check and
//! `RESULT: PASS|FAIL`; exits 0 only when no check failed.
//!
//! usage: edu [BDF]     (default: the first 1234:11e8 function)
//!
//! The edu device (QEMU docs/specs/edu.rst): BAR0 register 0x00 is the ID
//! (0x010000ed), 0x04 returns the inverse of what was written, 0x24/0x60/0x64
//! are interrupt status/raise/ack, and the DMA engine takes source 0x80,
//! destination 0x88, count 0x90 and command 0x98 (bit 0 start, bit 1
//! edu→RAM, bit 2 interrupt on completion with status 0x100). Its buffer is at
//! 0x40000 and its DMA mask 28 bits. QEMU 7.2 aborts the VM on a transfer
//! that ends exactly at the buffer's end, so transfers here are 2 KiB.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use rnic_core::{Memory, PciAddr};
use rnic_dma::numa::online_nodes;
use rnic_dma::{DmaDomain, DmaRegion, Mmio, NodeId, PagePolicy, PageSize};
use rnic_vfio::{Interrupt, Sysfs, VfioDevice};

const EDU_ID: u32 = 0x0100_00ed;
const CMD_IRQ: u64 = 4;
const IRQ_DMA: u32 = 0x100;

#[path = "edu_common/mod.rs"]
mod edu_common;
use edu_common::{CMD_TO_RAM, DMA_MASK, EDU_BUF, LEN, Res, dma};

struct Report {
    failed: bool,
}

impl Report {
    fn check(&mut self, name: &str, ok: bool, detail: impl AsRef<str>) -> bool {
        println!(
            "CHECK {name}: {} {}",
            if ok { "PASS" } else { "FAIL" },
            detail.as_ref()
        );
        self.failed |= !ok;
        ok
    }

    fn skip(&self, name: &str, detail: impl AsRef<str>) {
        println!("CHECK {name}: SKIP {}", detail.as_ref());
    }

    /// A step that must work for the rest to make sense.
    fn must<T>(&mut self, name: &str, r: Res<T>, detail: impl Fn(&T) -> String) -> Option<T> {
        match r {
            Ok(v) => {
                self.check(name, true, detail(&v));
                Some(v)
            }
            Err(e) => {
                self.check(name, false, e.to_string());
                None
            }
        }
    }
}

/// Wait for the completion MSI and acknowledge it; (eventfd count, status).
fn wait_irq(bar: &Mmio, irq: &Interrupt) -> Res<(u64, u32)> {
    let n = irq
        .wait(Duration::from_secs(5))?
        .ok_or("no interrupt on the eventfd within 5 s")?;
    let status = bar.read32(0x24)?;
    bar.write32(0x64, status)?;
    Ok((n, status))
}

fn region(domain: &Arc<DmaDomain>, node: Option<NodeId>) -> Res<Arc<DmaRegion>> {
    let mut b = DmaRegion::builder(2 << 20)
        .pages(PagePolicy::Prefer(PageSize::Huge2M))
        .domain(domain.clone());
    if let Some(n) = node {
        b = b.node(n);
    }
    Ok(b.build()?)
}

fn pattern(i: usize) -> u8 {
    (i * 7 + 3) as u8
}

fn main() -> ExitCode {
    let mut r = Report { failed: false };
    let sysfs = Sysfs::system();
    let addr: PciAddr = match std::env::args().nth(1) {
        Some(a) => match a.parse() {
            Ok(a) => a,
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::from(2);
            }
        },
        None => match sysfs.find(0x1234, 0x11e8).first() {
            Some(a) => *a,
            None => {
                r.check(
                    "find",
                    false,
                    "no edu device (1234:11e8) in /sys/bus/pci/devices",
                );
                println!("RESULT: FAIL");
                return ExitCode::FAILURE;
            }
        },
    };
    let Some(binding) = r.must(
        "bind",
        sysfs.bind(&addr, "vfio-pci").map_err(Into::into),
        |b| {
            format!(
                "{addr}: was {}, now {}",
                b.previous.as_deref().unwrap_or("unbound"),
                sysfs.driver(&addr).as_deref().unwrap_or("unbound")
            )
        },
    ) else {
        println!("RESULT: FAIL");
        return ExitCode::FAILURE;
    };
    let mappings_left = drive(&mut r, &addr);
    r.check(
        "teardown",
        mappings_left == Some(0),
        format!("live IOVA mappings after every region dropped: {mappings_left:?}"),
    );
    let before = binding.previous.clone();
    r.must(
        "restore",
        sysfs.restore(binding).map_err(Into::into),
        |now| {
            format!(
                "driver now {} (before bind: {})",
                now.as_deref().unwrap_or("none"),
                before.as_deref().unwrap_or("none")
            )
        },
    );
    println!("RESULT: {}", if r.failed { "FAIL" } else { "PASS" });
    if r.failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// Everything between bind and restore; returns the container's live
/// mappings after every region and the device are dropped.
fn drive(r: &mut Report, addr: &PciAddr) -> Option<usize> {
    let dev = r.must("open", VfioDevice::open(addr).map_err(Into::into), |d| {
        let c = d.container();
        format!(
            "group {}, {}, IOVA ranges {:x?}{}, pgsizes {:#x}, {} regions, {} irqs",
            c.group(),
            d.backend().describe(),
            c.iova_ranges(),
            if c.has_iova_range_cap() {
                ""
            } else {
                " (no capability: fallback)"
            },
            c.iova_pgsizes(),
            d.info().num_regions,
            d.info().num_irqs
        )
    })?;
    let container = dev.container().clone();
    let bar = r.must("bar0", dev.map_bar(0).map_err(Into::into), |b| {
        format!("mmapped {:#x} bytes as Mmio", b.len())
    })?;

    let id = bar.read32(0).unwrap_or(0);
    let live = bar
        .write32(4, 0x1234_5678)
        .and_then(|()| bar.read32(4))
        .unwrap_or(0);
    r.check(
        "mmio",
        id == EDU_ID && live == 0xedcb_a987,
        format!("id={id:#010x}, wrote 0x12345678 read {live:#010x}"),
    );
    r.must(
        "bus-master",
        dev.enable_bus_master().map_err(Into::into),
        |c| format!("PCI_COMMAND={c:#06x}"),
    )?;
    let irq = r.must("msi", dev.enable_msi(1).map_err(Into::into), |v| {
        format!("{} MSI vector on an eventfd", v.len())
    })?;
    let irq = &irq[0];

    let domain = dev.dma_domain(DMA_MASK);
    let src = r.must("hugepages", region(&domain, None), |s| {
        let why = s.stats().fallbacks.iter().map(|f| format!("{}: {}", f.size, f.reason)).collect::<Vec<_>>();
        if s.page_size() == PageSize::Huge2M {
            format!("src region in {} pages at IOVA {}", s.page_size(), s.iova())
        } else {
            format!(
                "FELL BACK to {} pages ({}); reserve 2 MiB hugepages: echo 16 > /proc/sys/vm/nr_hugepages",
                s.page_size(),
                why.join("; ")
            )
        }
    })?;
    if src.page_size() != PageSize::Huge2M {
        r.check("hugepages-obtained", false, "see above");
    }
    let dst = r.must("dst-region", region(&domain, None), |d| {
        format!("{} pages at IOVA {}", d.page_size(), d.iova())
    })?;
    for i in 0..LEN {
        src.write(i, &[pattern(i)]).ok()?;
    }
    dst.write(0, &[0u8; LEN]).ok()?;

    // RAM -> edu -> RAM, with the completion interrupt.
    let there = dma(&bar, src.iova().0, EDU_BUF, LEN, CMD_IRQ);
    let irq1 = there.as_ref().ok().map(|_| wait_irq(&bar, irq));
    let back = dma(&bar, EDU_BUF, dst.iova().0, LEN, CMD_TO_RAM);
    let mut got = vec![0u8; LEN];
    dst.read(0, &mut got).ok()?;
    let first_bad = (0..LEN).find(|&i| got[i] != pattern(i));
    r.check(
        "dma-roundtrip",
        there.is_ok() && back.is_ok() && first_bad.is_none(),
        format!(
            "{LEN} bytes RAM(IOVA {})->edu->RAM(IOVA {}) {} ({:?}, {:?})",
            src.iova(),
            dst.iova(),
            match first_bad {
                None => "byte-exact MATCH".to_string(),
                Some(i) => format!("MISMATCH at byte {i}: {:#04x}", got[i]),
            },
            there.map_err(|e| e.to_string()),
            back.map_err(|e| e.to_string()),
        ),
    );
    match irq1 {
        Some(Ok((n, status))) => r.check(
            "irq",
            status & IRQ_DMA != 0,
            format!(
                "DMA completion MSI received on the eventfd (count {n}, edu status {status:#x})"
            ),
        ),
        Some(Err(e)) => r.check("irq", false, e.to_string()),
        None => r.check("irq", false, "no DMA was started"),
    };

    // A DMA to an IOVA that was mapped and then unmapped must be blocked.
    let victim = r.must(
        "victim-region",
        DmaRegion::builder(4096)
            .pages(PagePolicy::Require(PageSize::Base))
            .build()
            .map_err(Into::into),
        |_| "4 KiB of host memory, not mapped for the device".to_string(),
    )?;
    victim.write(0, &[0xAA; 4096]).ok()?;
    let hole = (1u64 << 27) + 0x1000; // far from the regions above
    let host = std::ptr::NonNull::new(victim.as_ptr())?;
    // SAFETY: `victim` stays alive (and its memory mapped) until after the
    // unmap below returned; nothing takes a reference into it.
    let mapped = unsafe { container.map_dma(hole, host, 4096) };
    let unmapped = container.unmap_dma(hole, 4096);
    let covered = container
        .mappings()
        .iter()
        .any(|&(i, l)| i <= hole && hole < i + l);
    let blocked_dma = dma(&bar, EDU_BUF, hole, LEN, CMD_TO_RAM);
    let mut v = vec![0u8; 4096];
    victim.read(0, &mut v).ok()?;
    let untouched = v.iter().all(|&b| b == 0xAA);
    r.check(
        "unmapped-iova",
        mapped.is_ok() && unmapped.is_ok() && !covered && untouched,
        format!(
            "edu->RAM DMA to IOVA {hole:#x} after VFIO_IOMMU_UNMAP_DMA: {} (engine: {:?})",
            if untouched {
                "blocked, memory untouched (0xAA x 4096)"
            } else {
                "MEMORY MODIFIED"
            },
            blocked_dma.map_err(|e| e.to_string())
        ),
    );

    // NUMA: a hugepage region on every online node, verified, and DMA into it.
    let nodes = online_nodes();
    println!("online NUMA nodes: {nodes:?}");
    for n in &nodes {
        let name = format!("numa-node{}", n.0);
        match region(&domain, Some(*n)) {
            Ok(reg) => {
                let p = reg.placement();
                let dma_ok = dma(&bar, EDU_BUF, reg.iova().0, LEN, CMD_TO_RAM).is_ok() && {
                    let mut g = vec![0u8; LEN];
                    reg.read(0, &mut g).is_ok() && (0..LEN).all(|i| g[i] == pattern(i))
                };
                r.check(
                    &name,
                    p.all_on_wanted() && p.pages_checked > 0 && dma_ok,
                    format!(
                        "{}/{} {} pages on node {} by move_pages ({:?}), by node {:?}; DMA into it at IOVA {} {}",
                        p.pages_on_wanted,
                        p.pages_checked,
                        reg.page_size(),
                        n.0,
                        p.method,
                        p.by_node.iter().map(|(n, c)| (n.0, *c)).collect::<Vec<_>>(),
                        reg.iova(),
                        if dma_ok { "MATCH" } else { "FAILED" }
                    ),
                );
            }
            Err(e) => {
                r.check(&name, false, e.to_string());
            }
        }
    }
    if nodes.len() < 2 {
        r.skip(
            "numa-2-nodes",
            format!("only {} node(s) online", nodes.len()),
        );
    }

    match dev.reset() {
        Ok(()) => {
            let id = bar.read32(0).unwrap_or(0);
            r.check(
                "reset",
                id == EDU_ID,
                format!("VFIO_DEVICE_RESET done, id {id:#010x}"),
            );
        }
        Err(e) => r.skip("reset", e.to_string()),
    }

    drop((src, dst, victim, bar, dev, domain));
    Some(container.mappings().len())
}
