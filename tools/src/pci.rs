//! PCI functions in sysfs: the mlx5 scan for `list`, and `bind`/`unbind`.
//!
//! Reading (vendor/device, driver, IOMMU group, NUMA node, link, netdevs)
//! is done here; the sysfs writes — `driver_override`, `unbind`,
//! `drivers_probe`, the restore — and group viability are rnic-vfio's
//! ([`rnic_vfio::Sysfs`]), which also checks that the kernel moved the
//! function. What this module adds is the operator's view: the group
//! preview, the default-route refusal, `--dry-run`, and remembering the
//! previous driver across processes in `<state dir>/<bdf>.driver` (default
//! `/run/rnic/bind`, `RNICCTL_STATE_DIR` overrides).
//!
//! Every path is under a sysfs root (`/sys`; tests pass a synthetic tree
//! whose directory is also named `sys`).

use std::fs;
use std::path::{Path, PathBuf};

use rnic::core::PciAddr;
use rnic_vfio::{Binding, Sysfs};
use serde_json::{Value, json};

use crate::error::CtlError;

/// Mellanox/NVIDIA.
pub const MLX_VENDOR: u16 = 0x15b3;

/// mlx5 device ids (reference/mlx5.md §1) and their names.
pub const MLX5_IDS: &[(u16, &str)] = &[
    (0x1011, "Connect-IB"),
    (0x1012, "Connect-IB VF"),
    (0x1013, "ConnectX-4"),
    (0x1014, "ConnectX-4 VF"),
    (0x1015, "ConnectX-4 Lx"),
    (0x1016, "ConnectX-4 Lx VF"),
    (0x1017, "ConnectX-5"),
    (0x1018, "ConnectX-5 VF"),
    (0x1019, "ConnectX-5 Ex"),
    (0x101a, "ConnectX-5 Ex VF"),
    (0x101b, "ConnectX-6"),
    (0x101c, "ConnectX-6 VF"),
    (0x101d, "ConnectX-6 Dx"),
    (0x101e, "ConnectX mlx5Gen VF"),
    (0x101f, "ConnectX-6 Lx"),
    (0x1021, "ConnectX-7"),
    (0x1023, "ConnectX-8"),
    (0x1025, "ConnectX-9"),
    (0x1027, "ConnectX-10"),
];

/// One PCI function as sysfs shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Function {
    /// `0000:3b:00.1`.
    pub bdf: String,
    /// Vendor id.
    pub vendor: u16,
    /// Device id.
    pub device: u16,
    /// Bound driver.
    pub driver: Option<String>,
    /// IOMMU group number.
    pub iommu_group: Option<u32>,
    /// NUMA node (-1 = none).
    pub numa_node: Option<i32>,
    /// `current_link_speed`.
    pub link_speed: Option<String>,
    /// `current_link_width`.
    pub link_width: Option<String>,
    /// Network interfaces of the function.
    pub netdevs: Vec<String>,
}

fn read_trim(p: &Path) -> Option<String> {
    fs::read_to_string(p).ok().map(|s| s.trim().to_owned())
}

fn hex16(s: Option<String>) -> Option<u16> {
    s.and_then(|v| u16::from_str_radix(v.trim_start_matches("0x"), 16).ok())
}

fn link_name(p: &Path) -> Option<String> {
    fs::read_link(p)
        .ok()
        .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()))
}

/// The devices directory under a sysfs root.
pub fn devices_dir(root: &Path) -> PathBuf {
    root.join("bus/pci/devices")
}

/// Read one function.
pub fn function(root: &Path, bdf: &str) -> Option<Function> {
    let d = devices_dir(root).join(bdf);
    if !d.exists() {
        return None;
    }
    let mut netdevs: Vec<String> = fs::read_dir(d.join("net"))
        .map(|r| {
            r.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    netdevs.sort();
    Some(Function {
        bdf: bdf.to_owned(),
        vendor: hex16(read_trim(&d.join("vendor"))).unwrap_or(0),
        device: hex16(read_trim(&d.join("device"))).unwrap_or(0),
        driver: link_name(&d.join("driver")),
        iommu_group: link_name(&d.join("iommu_group")).and_then(|g| g.parse().ok()),
        numa_node: read_trim(&d.join("numa_node")).and_then(|n| n.parse().ok()),
        link_speed: read_trim(&d.join("current_link_speed")),
        link_width: read_trim(&d.join("current_link_width")),
        netdevs,
    })
}

/// The part name of an mlx5 device id.
pub fn mlx5_name(device: u16) -> Option<&'static str> {
    MLX5_IDS
        .iter()
        .find(|(id, _)| *id == device)
        .map(|(_, n)| *n)
}

/// Every mlx5 function under the root, sorted by BDF.
pub fn scan_mlx5(root: &Path) -> Vec<Function> {
    let mut v: Vec<Function> = fs::read_dir(devices_dir(root))
        .map(|r| {
            r.filter_map(Result::ok)
                .filter_map(|e| function(root, &e.file_name().to_string_lossy()))
                .filter(|f| f.vendor == MLX_VENDOR && mlx5_name(f.device).is_some())
                .collect()
        })
        .unwrap_or_default();
    v.sort_by(|a, b| a.bdf.cmp(&b.bdf));
    v
}

/// Interfaces that carry a default route (`/proc/net/route` destination 0).
pub fn default_route_ifaces(route_table: &Path) -> Vec<String> {
    let text = fs::read_to_string(route_table).unwrap_or_default();
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 2 && f[1] == "00000000").then(|| f[0].to_owned())
        })
        .collect()
}

/// A function as JSON.
pub fn function_json(f: &Function) -> Value {
    json!({
        "bdf": f.bdf,
        "vendor": format!("0x{:04x}", f.vendor),
        "device": format!("0x{:04x}", f.device),
        "part": mlx5_name(f.device),
        "driver": f.driver,
        "iommu_group": f.iommu_group,
        "numa_node": f.numa_node,
        "link_speed": f.link_speed,
        "link_width": f.link_width,
        "netdevs": f.netdevs,
    })
}

/// Where the remembered drivers live.
pub fn state_dir() -> PathBuf {
    std::env::var_os("RNICCTL_STATE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/run/rnic/bind"))
}

fn parse_bdf(bdf: &str) -> Result<PciAddr, CtlError> {
    bdf.parse::<PciAddr>().map_err(|e| {
        CtlError::Usage(format!(
            "{bdf}: {e} (expected a PCI address such as 0000:3b:00.1; `rnicctl list` shows them)"
        ))
    })
}

/// rnic-vfio's view of the tree: it takes the directory that holds `sys/`.
pub fn vfio_sysfs(sysfs_root: &Path) -> Result<Sysfs, CtlError> {
    match (sysfs_root.file_name(), sysfs_root.parent()) {
        (Some(n), Some(parent)) if n == "sys" => Ok(Sysfs::at(parent)),
        _ => Err(CtlError::Usage(format!(
            "--sysfs-root {}: must be a directory named sys",
            sysfs_root.display()
        ))),
    }
}

fn saved_driver(bdf: &str) -> PathBuf {
    state_dir().join(format!("{bdf}.driver"))
}

/// `rnicctl bind`.
pub fn bind_main(
    root: &Path,
    route_table: &Path,
    bdf: &str,
    dry_run: bool,
    force: bool,
) -> Result<(), CtlError> {
    let addr = parse_bdf(bdf)?;
    let vs = vfio_sysfs(root)?;
    vs.check_exists(&addr)?;
    let f = function(root, bdf).ok_or_else(|| {
        CtlError::Usage(format!(
            "{bdf}: no such PCI function under {}",
            devices_dir(root).display()
        ))
    })?;
    if f.driver.as_deref() == Some("vfio-pci") {
        println!("{bdf}: already bound to vfio-pci");
        return Ok(());
    }
    if f.vendor != MLX_VENDOR || mlx5_name(f.device).is_none() {
        eprintln!(
            "warning: {bdf} ({:04x}:{:04x}) is not an mlx5 function; binding anyway",
            f.vendor, f.device
        );
    }
    let group = vs.iommu_group(&addr)?;
    let members = vs.group_devices(group);
    println!(
        "{bdf}: {} on {}, IOMMU group {group}",
        mlx5_name(f.device).unwrap_or("PCI function"),
        f.driver.as_deref().unwrap_or("no driver")
    );
    let others: Vec<&(String, Option<String>)> = members.iter().filter(|(m, _)| m != bdf).collect();
    if others.is_empty() {
        println!("  group {group} has no other members");
    } else {
        println!("  group {group} also holds (VFIO needs every member off its host driver):");
        for (m, d) in &others {
            println!("    {m} driver {}", d.as_deref().unwrap_or("(none)"));
        }
    }
    let routes = default_route_ifaces(route_table);
    let mut hit = Vec::new();
    for (m, _) in &members {
        if let Some(mf) = function(root, m) {
            for n in mf.netdevs.iter().filter(|n| routes.contains(n)) {
                hit.push(format!("{n} (on {m})"));
            }
        }
    }
    if !hit.is_empty() {
        let why = format!(
            "binding takes down {}, which carries the default route; you would lose connectivity. Use another function, or --force if you have console access",
            hit.join(", ")
        );
        if !force {
            return Err(CtlError::Refused {
                bdf: bdf.to_owned(),
                why,
            });
        }
        eprintln!("warning (--force): {why}");
    }
    let dev = devices_dir(root).join(bdf);
    let prev = f.driver.clone();
    if dry_run {
        println!("dry run; would:");
        println!(
            "  remember driver {} in {}",
            prev.as_deref().unwrap_or("(none)"),
            saved_driver(bdf).display()
        );
        println!(
            "  write vfio-pci to {}",
            dev.join("driver_override").display()
        );
        if let Some(p) = &prev {
            println!(
                "  write {bdf} to {}",
                root.join(format!("bus/pci/drivers/{p}/unbind")).display()
            );
        }
        println!(
            "  write {bdf} to {}",
            root.join("bus/pci/drivers_probe").display()
        );
        return Ok(());
    }
    if let Some(p) = &prev {
        let sd = state_dir();
        fs::create_dir_all(&sd)
            .and_then(|()| fs::write(saved_driver(bdf), p))
            .map_err(|source| CtlError::Sysfs {
                path: sd.clone(),
                source,
                hint: " (set RNICCTL_STATE_DIR to a writable directory)",
            })?;
    }
    let b = vs.bind(&addr, "vfio-pci")?;
    println!(
        "{bdf}: bound to vfio-pci (was {}; `rnicctl unbind {bdf}` gives it back)",
        b.previous.as_deref().unwrap_or("unbound")
    );
    if let Err(e) = vs.check_viable(&addr) {
        println!("  note: {e}");
    }
    Ok(())
}

/// `rnicctl unbind`.
pub fn unbind_main(
    root: &Path,
    bdf: &str,
    dry_run: bool,
    driver: Option<&str>,
) -> Result<(), CtlError> {
    let addr = parse_bdf(bdf)?;
    let vs = vfio_sysfs(root)?;
    vs.check_exists(&addr)?;
    let saved = saved_driver(bdf);
    let remembered = read_trim(&saved);
    let target = driver
        .map(str::to_owned)
        .or(remembered)
        .unwrap_or_else(|| "mlx5_core".to_owned());
    let now = vs.driver(&addr);
    if dry_run {
        println!("dry run; would:");
        if let Some(d) = &now {
            println!(
                "  write {bdf} to {}",
                root.join(format!("bus/pci/drivers/{d}/unbind")).display()
            );
        }
        let ovr = devices_dir(root).join(bdf).join("driver_override");
        println!("  write {target} to {}", ovr.display());
        println!(
            "  write {bdf} to {}",
            root.join("bus/pci/drivers_probe").display()
        );
        println!("  write \\n to {} (clear the override)", ovr.display());
        return Ok(());
    }
    let restored = vs.restore(Binding {
        addr,
        previous: Some(target.clone()),
        driver: now.unwrap_or_else(|| "vfio-pci".into()),
    })?;
    let _ = fs::remove_file(&saved);
    println!(
        "{bdf}: given back to {}",
        restored.as_deref().unwrap_or(&target)
    );
    Ok(())
}
