//! `rnicctl topo`: NUMA nodes and distances, the NICs and GPUs with their
//! nearest node and CPUs, how each NIC reaches each GPU (NCCL's PIX … SYS),
//! and the pairing and buffer placement rnic would choose. Reads this
//! machine through hwloc, or an hwloc XML export (`--xml`).

use std::path::{Path, PathBuf};

use clap::Args;
use rnic_gpu::topo::{PciFunction, Topology};
use serde_json::{Value, json};

use crate::error::CtlError;

/// `rnicctl topo` options.
#[derive(Args, Debug)]
pub struct TopoArgs {
    /// Read an hwloc XML export (lstopo --of xml) instead of this machine.
    #[arg(long)]
    pub xml: Option<PathBuf>,
    /// Print the topology as hwloc XML (to save it, or to feed --xml).
    #[arg(long, conflicts_with = "json")]
    pub export_xml: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

fn gib(b: u64) -> String {
    format!("{:.1} GiB", b as f64 / f64::from(1u32 << 30))
}

/// The kernel driver bound to `f` (only meaningful for this machine).
fn driver(f: &PciFunction, system: bool) -> Option<String> {
    if !system {
        return None;
    }
    let l = std::fs::read_link(format!("/sys/bus/pci/devices/{}/driver", f.addr)).ok()?;
    Some(l.file_name()?.to_string_lossy().into_owned())
}

fn function_json(f: &PciFunction, system: bool) -> Value {
    json!({
        "pci": f.addr.to_string(),
        "vendor": format!("{:04x}", f.vendor),
        "device": format!("{:04x}", f.device),
        "class": format!("{:04x}", f.class),
        "numa_node": f.node,
        "cpus": f.cpus,
        "link_gbs": f.link_gbs,
        "driver": driver(f, system),
    })
}

fn line(f: &PciFunction, system: bool) -> String {
    format!(
        "  {} {:04x}:{:04x} class {:04x}  node {}  cpus {}  link {}{}",
        f.addr,
        f.vendor,
        f.device,
        f.class,
        f.node.map_or("-".into(), |n| n.to_string()),
        if f.cpus.is_empty() { "-" } else { &f.cpus },
        if f.link_gbs > 0.0 {
            format!("{:.1} GB/s", f.link_gbs)
        } else {
            "unknown".into()
        },
        driver(f, system).map_or(String::new(), |d| format!("  driver {d}")),
    )
}

/// Build the report (text lines and JSON) for `t`.
pub fn report(t: &Topology) -> (Vec<String>, Value) {
    let system = t.source() == "system";
    let mut out = vec![format!("topology: {}", t.source())];
    let nodes = t.nodes();
    out.push(format!("NUMA nodes: {}", nodes.len()));
    for n in &nodes {
        out.push(format!(
            "  node {}: cpus {}, {}",
            n.os_index,
            n.cpus,
            gib(n.memory)
        ));
    }
    let dist = t.distances();
    match &dist {
        Some(d) => {
            out.push("NUMA distances (SLIT, 10 = local):".into());
            let k = d.nodes.len();
            for (i, n) in d.nodes.iter().enumerate() {
                let row: Vec<String> = d.values[i * k..(i + 1) * k]
                    .iter()
                    .map(u64::to_string)
                    .collect();
                out.push(format!("  node {n}: {}", row.join(" ")));
            }
        }
        None => out.push("NUMA distances: none reported".into()),
    }
    let (nics, gpus) = (t.nics(), t.gpus());
    out.push(format!("NICs (network class): {}", nics.len()));
    out.extend(nics.iter().map(|f| line(f, system)));
    out.push(format!("GPUs (display/3D class): {}", gpus.len()));
    out.extend(gpus.iter().map(|f| line(f, system)));
    let mut relations = Vec::new();
    if !nics.is_empty() && !gpus.is_empty() {
        out.push("NIC ↔ GPU:".into());
        for n in &nics {
            for g in &gpus {
                if let Ok(r) = t.relation(&n.addr, &g.addr) {
                    out.push(format!("  {} ↔ {}: {r}", n.addr, g.addr));
                    relations.push(json!({"nic": n.addr.to_string(), "gpu": g.addr.to_string(), "relation": r.nccl_name()}));
                }
            }
        }
    }
    let pairs = t.pairings();
    let mut chosen = Vec::new();
    if pairs.is_empty() {
        let node = nics.iter().find_map(|n| n.node);
        out.push(format!(
            "rnic's choice: {}; buffers a NIC touches go on its node ({})",
            if gpus.is_empty() {
                "no GPU, nothing to pair"
            } else {
                "no NIC to pair the GPUs with"
            },
            node.map_or("no node: the kernel reports none".into(), |n| format!(
                "node {n}"
            ))
        ));
    } else {
        out.push("rnic's choice (closest relation, then faster link):".into());
        for p in &pairs {
            out.push(format!(
                "  GPU {} → NIC {} ({}), staging buffers on {}{}",
                p.gpu,
                p.nic,
                p.relation.nccl_name(),
                p.staging_node
                    .map_or("no particular node".into(), |n| format!("node {n}")),
                if p.relation.below_root_complex() {
                    ""
                } else {
                    "; peer DMA would cross the CPU: expect staging to be as fast"
                }
            ));
            chosen.push(json!({
                "gpu": p.gpu.to_string(),
                "nic": p.nic.to_string(),
                "relation": p.relation.nccl_name(),
                "staging_node": p.staging_node,
            }));
        }
    }
    let j = json!({
        "source": t.source(),
        "nodes": nodes.iter().map(|n| json!({"node": n.os_index, "cpus": n.cpus, "memory": n.memory})).collect::<Vec<_>>(),
        "distances": dist.map(|d| json!({"nodes": d.nodes, "values": d.values})),
        "nics": nics.iter().map(|f| function_json(f, system)).collect::<Vec<_>>(),
        "gpus": gpus.iter().map(|f| function_json(f, system)).collect::<Vec<_>>(),
        "relations": relations,
        "pairings": chosen,
    });
    (out, j)
}

/// Load the topology `args` name.
pub fn load(xml: Option<&Path>) -> Result<Topology, CtlError> {
    Ok(match xml {
        Some(p) => Topology::from_xml_file(p)?,
        None => Topology::system()?,
    })
}

/// `rnicctl topo`.
pub fn main(a: &TopoArgs) -> Result<(), CtlError> {
    let t = load(a.xml.as_deref())?;
    if a.export_xml {
        print!("{}", t.to_xml()?);
        return Ok(());
    }
    let (lines, j) = report(&t);
    if a.json {
        println!("{j}");
    } else {
        for l in lines {
            println!("{l}");
        }
    }
    Ok(())
}
