//! `rnicctl list`: mlx5 PCI functions and rxe-backend endpoints.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;

use nix::ifaddrs::getifaddrs;
use rnic::core::Gid;
use serde_json::{Value, json};

use crate::error::CtlError;
use crate::pci;

/// One network interface as an rxe endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// Interface name.
    pub netdev: String,
    /// Interface MTU.
    pub mtu: Option<u32>,
    /// The RoCE path MTU that interface MTU allows.
    pub active_mtu: u32,
    /// Its addresses as GIDs (text form as `ibv_devinfo -v` prints).
    pub gids: Vec<String>,
    /// Whether the interface is up.
    pub up: bool,
}

/// Every interface with an IP address (loopback included).
pub fn endpoints(sysfs_root: &Path) -> Vec<Endpoint> {
    let mut by: BTreeMap<String, Vec<IpAddr>> = BTreeMap::new();
    let mut up: BTreeMap<String, bool> = BTreeMap::new();
    if let Ok(addrs) = getifaddrs() {
        for a in addrs {
            let name = a.interface_name.clone();
            up.insert(
                name.clone(),
                a.flags.contains(nix::net::if_::InterfaceFlags::IFF_UP),
            );
            let ip = a.address.as_ref().and_then(|s| {
                s.as_sockaddr_in()
                    .map(|v| IpAddr::V4(v.ip()))
                    .or_else(|| s.as_sockaddr_in6().map(|v| IpAddr::V6(v.ip())))
            });
            if let Some(ip) = ip {
                by.entry(name).or_default().push(ip);
            }
        }
    }
    by.into_iter()
        .map(|(netdev, ips)| {
            let mtu = std::fs::read_to_string(sysfs_root.join(format!("class/net/{netdev}/mtu")))
                .ok()
                .and_then(|s| s.trim().parse().ok());
            Endpoint {
                active_mtu: rnic::rxe::active_mtu(mtu).bytes(),
                mtu,
                gids: ips
                    .iter()
                    .map(|ip| std::net::Ipv6Addr::from(*Gid::from_ip(*ip).raw()).to_string())
                    .collect(),
                up: up.get(&netdev).copied().unwrap_or(false),
                netdev,
            }
        })
        .collect()
}

/// `rnicctl list`.
pub fn main(root: &Path, json_out: bool) -> Result<(), CtlError> {
    let fns = pci::scan_mlx5(root);
    let eps = endpoints(root);
    let sharing = rnic::rxe::share::members();
    if json_out {
        let v = json!({
            "mlx5": fns.iter().map(pci::function_json).collect::<Vec<_>>(),
            "rxe": eps.iter().map(|e| json!({
                "spec": format!("rxe:{}", e.netdev),
                "netdev": e.netdev,
                "up": e.up,
                "mtu": e.mtu,
                "active_mtu": e.active_mtu,
                "gids": e.gids,
            })).collect::<Vec<Value>>(),
            "rxe_sharing": sharing.iter().map(crate::stats::member_json).collect::<Vec<_>>(),
        });
        println!("{v}");
        return Ok(());
    }
    println!("mlx5 PCI functions (vendor 0x15b3):");
    if fns.is_empty() {
        println!("  none found under {}", pci::devices_dir(root).display());
    }
    for f in &fns {
        println!(
            "  mlx5:{}  {:<20} driver {:<10} iommu_group {:<4} numa {:<3} link {} x{} {}",
            f.bdf,
            pci::mlx5_name(f.device).unwrap_or("?"),
            f.driver.as_deref().unwrap_or("(none)"),
            f.iommu_group.map_or("-".into(), |g| g.to_string()),
            f.numa_node.map_or("-".into(), |n| n.to_string()),
            f.link_speed.as_deref().unwrap_or("?"),
            f.link_width.as_deref().unwrap_or("?"),
            if f.netdevs.is_empty() {
                String::new()
            } else {
                format!("netdev {}", f.netdevs.join(","))
            }
        );
    }
    println!("rxe backend endpoints (UDP 4791):");
    for e in &eps {
        println!(
            "  rxe:{:<12} {} mtu {} -> active path MTU {}",
            e.netdev,
            if e.up { "up  " } else { "down" },
            e.mtu.map_or("?".into(), |m| m.to_string()),
            e.active_mtu
        );
        for (i, g) in e.gids.iter().enumerate() {
            println!("      GID[{i}] {g}");
        }
    }
    println!(
        "rxe devices open in processes (sharing UDP 4791 by QPN range; registry {}):",
        rnic::rxe::share::REGISTRY
    );
    if sharing.is_empty() {
        println!("  none");
    }
    for m in &sharing {
        println!(
            "  pid {:<7} {:<16} slot {:<3} QPNs {}  on {}",
            m.pid,
            m.target,
            m.slot,
            m.range,
            m.addrs.join(", ")
        );
    }
    Ok(())
}
