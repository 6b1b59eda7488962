//! `copy_tiers`: host↔device copy bandwidth per host-memory tier (pageable,
//! pinned, hugepage + cuMemHostRegister), 4 KiB … 1 GiB, both directions,
//! printed beside the H200 reference figures and dmaplane's tiers; with
//! `--bar <sysfs resource file>` also CPU access to that BAR mapped uncached
//! (`resourceN`) and write-combined (`resourceN_wc`).
//!
//! ```text
//! cargo run --release -p rnic-gpu --example copy_tiers               # GPU 0, up to 1 GiB
//! cargo run --release -p rnic-gpu --example copy_tiers -- --max 64M --gpu 1 --json
//! ```
//!
//! Without a GPU it exits 2 with the driver probe's message.

use std::any::Any;
use std::fs::OpenOptions;
use std::num::NonZeroUsize;
use std::os::fd::OwnedFd;
use std::process::ExitCode;
use std::ptr::NonNull;
use std::sync::Arc;

use nix::sys::mman::{MapFlags, ProtFlags, mmap, munmap};
use rnic_dma::Mmio;
use rnic_gpu::tiers::{Direction, Tier, copy_tiers, cpu_bar_bandwidth, sizes_up_to};
use rnic_gpu::{Gpu, GpuError};

/// H200 figures from reference/peers.md (GB/s, H2D): pinned, pageable,
/// hugepage + cuMemHostRegister.
const H200: [(Tier, f64); 3] = [
    (Tier::Pinned, 55.0),
    (Tier::Pageable, 7.8),
    (Tier::Hugepage, 54.9),
];

fn parse_size(s: &str) -> Option<usize> {
    let (n, mul) = match s.as_bytes().last()? {
        b'K' | b'k' => (&s[..s.len() - 1], 1 << 10),
        b'M' | b'm' => (&s[..s.len() - 1], 1 << 20),
        b'G' | b'g' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    n.parse::<usize>().ok()?.checked_mul(mul)
}

struct Args {
    gpu: usize,
    max: usize,
    budget: usize,
    json: bool,
    bar: Option<String>,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        gpu: 0,
        max: 1 << 30,
        budget: 512 << 20,
        json: false,
        bar: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut val = || it.next().ok_or(format!("{k} needs a value"));
        match k.as_str() {
            "--gpu" => a.gpu = val()?.parse().map_err(|_| "--gpu takes an ordinal")?,
            "--max" => a.max = parse_size(&val()?).ok_or("--max takes a size like 64M")?,
            "--budget" => a.budget = parse_size(&val()?).ok_or("--budget takes a size")?,
            "--json" => a.json = true,
            "--bar" => a.bar = Some(val()?),
            "-h" | "--help" => {
                return Err(
                    "usage: copy_tiers [--gpu N] [--max SIZE] [--budget SIZE] [--json] \
                            [--bar /sys/bus/pci/devices/<bdf>/resourceN]"
                        .into(),
                );
            }
            other => return Err(format!("unknown argument {other} (see --help)")),
        }
    }
    Ok(a)
}

/// A sysfs BAR resource file mapped read-write (root only).
struct SysfsBar {
    ptr: NonNull<u8>,
    len: usize,
    _fd: OwnedFd,
}

// SAFETY: owns the mapping; nothing here touches the memory.
unsafe impl Send for SysfsBar {}
// SAFETY: as for Send.
unsafe impl Sync for SysfsBar {}

impl Drop for SysfsBar {
    fn drop(&mut self) {
        // SAFETY: exactly the mapping made in `map_resource`, unused now.
        let _ = unsafe { munmap(self.ptr.cast(), self.len) };
    }
}

fn map_resource(path: &str) -> Result<Mmio, String> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| format!("{path}: {e} (needs root, and a memory BAR)"))?;
    let len = f.metadata().map_err(|e| e.to_string())?.len() as usize;
    let n = NonZeroUsize::new(len).ok_or(format!("{path} is empty"))?;
    let fd: OwnedFd = f.into();
    // SAFETY: a fresh shared mapping of the resource file chosen by the
    // kernel; no existing memory is replaced.
    let p = unsafe {
        mmap(
            None,
            n,
            ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
            MapFlags::MAP_SHARED,
            &fd,
            0,
        )
    }
    .map_err(|e| format!("mmap {path}: {e}"))?;
    let ptr = p.cast::<u8>();
    let owner: Arc<dyn Any + Send + Sync> = Arc::new(SysfsBar { ptr, len, _fd: fd });
    // SAFETY: `len` bytes of BAR memory mapped until `owner` drops; only
    // volatile accesses are made through the Mmio.
    Ok(unsafe { Mmio::new(ptr, len, owner) })
}

fn main() -> ExitCode {
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let gpu = match Gpu::open(a.gpu) {
        Ok(g) => g,
        Err(e @ GpuError::NoDriver { .. }) => {
            eprintln!("copy_tiers: {e}");
            return ExitCode::from(2);
        }
        Err(e) => {
            eprintln!("copy_tiers: {e}");
            return ExitCode::FAILURE;
        }
    };
    let i = gpu.info();
    eprintln!(
        "copy_tiers: GPU {} {} at {}, node {:?}; sizes 4 KiB..{} MiB, ~{} MiB per point",
        i.ordinal,
        i.name,
        i.pci.map_or("?".into(), |p| p.to_string()),
        i.numa_node.map(|n| n.0),
        a.max >> 20,
        a.budget >> 20
    );
    let json = a.json;
    let res = copy_tiers(&gpu, &sizes_up_to(a.max), a.budget, |r| {
        if !json {
            println!(
                "TIER {:<18} {} {:>10} B  {:>8.2} GB/s  ({} copies)",
                r.tier.to_string(),
                r.dir,
                r.size,
                r.gbps,
                r.iters
            );
        }
    });
    let res = match res {
        Ok(r) => r,
        Err(e) => {
            eprintln!("copy_tiers: {e}");
            return ExitCode::FAILURE;
        }
    };
    let best = |t: Tier, d: Direction| {
        res.iter()
            .filter(|r| r.tier == t && r.dir == d)
            .map(|r| r.gbps)
            .fold(0.0, f64::max)
    };
    let mut bar = None;
    if let Some(path) = &a.bar {
        for (kind, p) in [("UC", path.clone()), ("WC", format!("{path}_wc"))] {
            match map_resource(&p)
                .and_then(|m| cpu_bar_bandwidth(&m, 1 << 20, 16).map_err(|e| e.to_string()))
            {
                Ok((w, r)) => {
                    println!(
                        "BAR {kind} {p}: CPU write {:.3} GB/s, read {:.3} GB/s",
                        w, r
                    );
                    bar.get_or_insert_with(Vec::new).push((kind, w, r));
                }
                Err(e) => println!("BAR {kind}: not measured: {e}"),
            }
        }
    }
    if json {
        let rows: Vec<String> = res
            .iter()
            .map(|r| {
                format!(
                    "{{\"tier\":\"{}\",\"dir\":\"{}\",\"size\":{},\"iters\":{},\"gbps\":{:.3}}}",
                    r.tier, r.dir, r.size, r.iters, r.gbps
                )
            })
            .collect();
        println!(
            "{{\"gpu\":\"{}\",\"results\":[{}]}}",
            i.name,
            rows.join(",")
        );
    } else {
        println!("SUMMARY best GB/s         H2D      D2H   | H200 reference H2D (peers.md)");
        for (t, reference) in H200 {
            println!(
                "SUMMARY {:<18} {:>7.2}  {:>7.2}   | {reference:>5.1}",
                t.to_string(),
                best(t, Direction::H2D),
                best(t, Direction::D2H)
            );
        }
        println!(
            "SUMMARY dmaplane (RTX 5000 Ada, gpu.md §1d): cudaMemcpy 12.6 H2D / 13.1 D2H; \
             BAR WC 10.1 write / 0.107 read; UC 0.044 / 0.006"
        );
    }
    ExitCode::SUCCESS
}
