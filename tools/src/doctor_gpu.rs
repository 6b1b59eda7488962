//! `rnicctl doctor`'s GPU section: is there a CUDA driver (probed by
//! rnic-gpu exactly as every GPU entry point probes it), what each GPU
//! offers (GPUDirect RDMA, dma-buf), what hwloc says about NIC↔GPU
//! placement, which routes this host offers for a peer BAR in a NIC's IOMMU
//! domain, and how each provider reaches VRAM.

use rnic_gpu::{Gpu, GpuError};

use crate::doctor::{Check, Level, check};

/// The GPU checks.
pub fn checks() -> Vec<Check> {
    let mut v = Vec::new();
    match rnic_gpu::driver() {
        Ok(d) => {
            v.push(check(
                "cuda",
                if d.devices > 0 {
                    Level::Ok
                } else {
                    Level::Warn
                },
                format!(
                    "{} driver, {} device(s); optional: {}",
                    d.version_string(),
                    d.devices,
                    if d.optional.is_empty() {
                        "none".into()
                    } else {
                        d.optional.join(", ")
                    }
                ),
                if d.devices > 0 {
                    ""
                } else {
                    "the driver sees no GPU: check nvidia-smi and CUDA_VISIBLE_DEVICES"
                },
            ));
            for ordinal in 0..d.devices {
                v.push(match Gpu::open(ordinal) {
                    Ok(g) => {
                        let i = g.info();
                        check(
                            &format!("gpu {ordinal}"),
                            Level::Ok,
                            format!(
                                "{} at {}, node {}, {} MiB; GPUDirect RDMA {}; dma-buf export {}",
                                i.name,
                                i.pci.map_or("?".into(), |p| p.to_string()),
                                i.numa_node.map_or("-".into(), |n| n.0.to_string()),
                                i.total_mem >> 20,
                                if i.gpudirect_rdma { "yes" } else { "no" },
                                if i.dma_buf {
                                    "yes"
                                } else {
                                    "no (needs the open kernel modules)"
                                },
                            ),
                            "",
                        )
                    }
                    Err(e) => check(&format!("gpu {ordinal}"), Level::Warn, e.to_string(), ""),
                });
            }
        }
        Err(e) => {
            let (detail, fix) = match &e {
                GpuError::NoDriver { detail } => (
                    format!("GPU features are off: {detail}"),
                    "install the NVIDIA driver (libcuda.so.1; Debian: nvidia-driver libcuda1) to \
                     use --kv-memory gpu:N and rnic-gpu; nothing else needs it"
                        .to_string(),
                ),
                other => (
                    format!("GPU features are off: {other}"),
                    "upgrade the NVIDIA driver".to_string(),
                ),
            };
            v.push(check("cuda", Level::Warn, detail, fix));
        }
    }
    let release = nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default();
    let routes = rnic_vfio::peer_bar_routes(&rnic_vfio::Sysfs::system(), &release);
    for r in &routes {
        v.push(check(
            &format!("peer-bar: {}", r.name),
            if r.available { Level::Ok } else { Level::Warn },
            r.why.clone(),
            if r.available {
                ""
            } else {
                "needed only for a NIC on vfio-pci to reach a peer BAR directly; staging works without"
            },
        ));
    }
    let type1 = routes.first().is_some_and(|r| r.available);
    let bar1_cpu = std::path::Path::new("/dev/gdrdrv").exists();
    v.push(check(
        "vram-reach",
        Level::Ok,
        format!(
            "rxe: staged through cuMemHostRegister'd hugepages (StagedMemory, always); mlx5: {}",
            match (type1, bar1_cpu) {
                (true, true) => "a GPU BAR1 CPU mapping (/dev/gdrdrv) exists and type1 MAP_DMA is open, but rnic does not map BAR1 through gdrdrv yet: register a host DmaRegion and copy (docs/gpu.md)",
                (true, false) => "type1 MAP_DMA is open but nothing maps the GPU's BAR1 for the CPU (no /dev/gdrdrv): register a host DmaRegion and copy (docs/gpu.md)",
                _ => "no peer-BAR route (see above): register a host DmaRegion and copy (docs/gpu.md)",
            }
        ),
        "",
    ));
    v.push(match rnic_gpu::topo::Topology::system() {
        Ok(t) => {
            let (nodes, nics, gpus) = (t.nodes().len(), t.nics().len(), t.gpus().len());
            let pairs: Vec<String> = t
                .pairings()
                .iter()
                .map(|p| format!("GPU {} ↔ NIC {} {}", p.gpu, p.nic, p.relation.nccl_name()))
                .collect();
            check(
                "topology",
                Level::Ok,
                format!(
                    "hwloc: {nodes} NUMA node(s), {nics} NIC(s), {gpus} GPU(s){}",
                    if pairs.is_empty() {
                        String::new()
                    } else {
                        format!("; {}", pairs.join("; "))
                    }
                ),
                "",
            )
        }
        Err(e) => check(
            "topology",
            Level::Warn,
            e.to_string(),
            "placement falls back to sysfs numa_node; `rnicctl topo` shows what hwloc reads",
        ),
    });
    v
}
