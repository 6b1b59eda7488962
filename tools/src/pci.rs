//! PCI functions in sysfs: the mlx5 scan, IOMMU groups, and moving a
//! function to vfio-pci and back.
//!
//! Everything takes the sysfs root as a parameter so tests run against a
//! synthetic tree. The sysfs protocol (what the kernel documents for
//! `driver_override`): write `vfio-pci` to `devices/<bdf>/driver_override`,
//! the BDF to `devices/<bdf>/driver/unbind`, then the BDF to
//! `bus/pci/drivers_probe`; to give it back, unbind, write `\n` to
//! `driver_override` (clears it) and bind the remembered driver
//! (`drivers/<name>/bind`) or, without one, probe.
//!
//! The remembered driver lives in `<state dir>/<bdf>.driver` (default
//! `/run/rnic/bind`). The VFIO crate (rnic-vfio) grows the same bind/unbind
//! for programs; once it is committed this module should call it.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

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

/// Drivers a VFIO group member may have (the kernel's allow-list) besides
/// vfio-pci itself; "none" means unbound.
pub const VIABLE_DRIVERS: &[&str] = &["vfio-pci", "pci-stub", "pcieport"];

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

/// The BDFs in an IOMMU group.
pub fn group_members(root: &Path, group: u32) -> Vec<String> {
    let mut v: Vec<String> =
        fs::read_dir(root.join(format!("kernel/iommu_groups/{group}/devices")))
            .map(|r| {
                r.filter_map(Result::ok)
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
    v.sort();
    v
}

/// Whether VFIO can use the group: every member on vfio-pci, an
/// allow-listed driver, or none. Returns the members in the way.
pub fn group_blockers(root: &Path, group: u32, except: Option<&str>) -> Vec<(String, String)> {
    group_members(root, group)
        .into_iter()
        .filter(|b| Some(b.as_str()) != except)
        .filter_map(|b| {
            let drv = function(root, &b).and_then(|f| f.driver)?;
            (!VIABLE_DRIVERS.contains(&drv.as_str())).then_some((b, drv))
        })
        .collect()
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

fn write(path: &Path, val: &str, hint: &'static str) -> Result<(), CtlError> {
    fs::write(path, val).map_err(|source| CtlError::Sysfs {
        path: path.to_owned(),
        source,
        hint,
    })
}

const ROOT_HINT: &str = " (run as root; sysfs PCI files are root-only)";

/// Where the remembered drivers live.
pub fn state_dir() -> PathBuf {
    std::env::var_os("RNICCTL_STATE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/run/rnic/bind"))
}

fn check_bdf(bdf: &str) -> Result<(), CtlError> {
    bdf.parse::<rnic::core::PciAddr>().map(|_| ()).map_err(|e| {
        CtlError::Usage(format!(
            "{bdf}: {e} (expected a PCI address such as 0000:3b:00.1; `rnicctl list` shows them)"
        ))
    })
}

/// `rnicctl bind`.
pub fn bind_main(
    root: &Path,
    route_table: &Path,
    bdf: &str,
    dry_run: bool,
    force: bool,
) -> Result<(), CtlError> {
    check_bdf(bdf)?;
    let f = function(root, bdf).ok_or_else(|| {
        CtlError::Usage(format!(
            "{bdf}: no such PCI function under {} (`rnicctl list` shows the mlx5 ones)",
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
    let group = f.iommu_group.ok_or_else(|| CtlError::Refused {
        bdf: bdf.to_owned(),
        why: "it has no IOMMU group: enable the IOMMU (intel_iommu=on or amd_iommu=on on the kernel command line; `rnicctl doctor` checks)".into(),
    })?;
    let members = group_members(root, group);
    println!(
        "{bdf}: {} driver {}, IOMMU group {group}",
        mlx5_name(f.device).unwrap_or("PCI function"),
        f.driver.as_deref().unwrap_or("(none)")
    );
    let others: Vec<&String> = members.iter().filter(|m| *m != bdf).collect();
    if others.is_empty() {
        println!("  group {group} has no other members");
    } else {
        println!("  group {group} also holds (VFIO needs every member off its host driver):");
        for m in &others {
            let d = function(root, m).and_then(|x| x.driver);
            println!("    {m} driver {}", d.as_deref().unwrap_or("(none)"));
        }
    }
    let routes = default_route_ifaces(route_table);
    let mut hit = Vec::new();
    for m in &members {
        if let Some(mf) = function(root, m) {
            for n in mf.netdevs.iter().filter(|n| routes.contains(n)) {
                hit.push(format!("{n} (on {m})"));
            }
        }
    }
    if !hit.is_empty() {
        let why = format!(
            "binding takes down {} which carries the default route; you would lose connectivity. Use another function, or --force if you have console access",
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
    let plan = [
        format!(
            "remember driver {} in {}",
            prev.as_deref().unwrap_or("(none)"),
            state_dir().join(format!("{bdf}.driver")).display()
        ),
        format!(
            "write vfio-pci to {}",
            dev.join("driver_override").display()
        ),
        match &prev {
            Some(_) => format!("write {bdf} to {}", dev.join("driver/unbind").display()),
            None => "(not bound: nothing to unbind)".into(),
        },
        format!(
            "write {bdf} to {}",
            root.join("bus/pci/drivers_probe").display()
        ),
    ];
    if dry_run {
        println!("dry run; would:");
        for s in &plan {
            println!("  {s}");
        }
        return Ok(());
    }
    if let Some(p) = &prev {
        let sd = state_dir();
        fs::create_dir_all(&sd)
            .and_then(|()| fs::write(sd.join(format!("{bdf}.driver")), p))
            .map_err(|source| CtlError::Sysfs {
                path: sd.clone(),
                source,
                hint: " (set RNICCTL_STATE_DIR to a writable directory)",
            })?;
    }
    write(&dev.join("driver_override"), "vfio-pci", ROOT_HINT)?;
    if prev.is_some() {
        write(&dev.join("driver/unbind"), bdf, ROOT_HINT)?;
    }
    write(&root.join("bus/pci/drivers_probe"), bdf, ROOT_HINT)?;
    let now = function(root, bdf).and_then(|x| x.driver);
    if root == Path::new("/sys") && now.as_deref() != Some("vfio-pci") {
        return Err(CtlError::Sysfs {
            path: dev.join("driver"),
            source: io::Error::other("vfio-pci did not take the function"),
            hint: " (load the module: modprobe vfio-pci; then rerun)",
        });
    }
    println!(
        "{bdf}: bound to vfio-pci (was {})",
        prev.as_deref().unwrap_or("unbound")
    );
    let blockers = group_blockers(root, group, Some(bdf));
    for (b, d) in &blockers {
        println!(
            "  note: group {group} is not viable yet: {b} is on {d}; bind it too (rnicctl bind {b})"
        );
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
    check_bdf(bdf)?;
    let f = function(root, bdf).ok_or_else(|| {
        CtlError::Usage(format!(
            "{bdf}: no such PCI function under {}",
            devices_dir(root).display()
        ))
    })?;
    let saved = state_dir().join(format!("{bdf}.driver"));
    let remembered = read_trim(&saved);
    let target = driver
        .map(str::to_owned)
        .or(remembered)
        .unwrap_or_else(|| "mlx5_core".to_owned());
    let dev = devices_dir(root).join(bdf);
    let bind_file = root.join(format!("bus/pci/drivers/{target}/bind"));
    let plan = [
        match &f.driver {
            Some(d) => format!(
                "write {bdf} to {} (leave {d})",
                dev.join("driver/unbind").display()
            ),
            None => "(not bound: nothing to unbind)".into(),
        },
        format!(
            "write \\n to {} (clear the override)",
            dev.join("driver_override").display()
        ),
        if bind_file.exists() {
            format!("write {bdf} to {}", bind_file.display())
        } else {
            format!(
                "write {bdf} to {} ({target} not loaded: let the kernel pick)",
                root.join("bus/pci/drivers_probe").display()
            )
        },
    ];
    if dry_run {
        println!("dry run; would:");
        for s in &plan {
            println!("  {s}");
        }
        return Ok(());
    }
    if f.driver.is_some() {
        write(&dev.join("driver/unbind"), bdf, ROOT_HINT)?;
    }
    write(&dev.join("driver_override"), "\n", ROOT_HINT)?;
    if bind_file.exists() {
        write(&bind_file, bdf, ROOT_HINT)?;
    } else {
        write(&root.join("bus/pci/drivers_probe"), bdf, ROOT_HINT)?;
    }
    let _ = fs::remove_file(&saved);
    println!("{bdf}: given back to {target}");
    Ok(())
}
