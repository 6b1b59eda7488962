//! What sysfs says about PCI functions and IOMMU groups, and binding a
//! function to a driver through `driver_override`.
//!
//! Every path is taken under a root prefix (`/` on a real system), so the
//! logic runs in host tests against a synthetic tree. Only plain file reads,
//! writes and symlink reads happen here; the kernel does the rest.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use rnic_core::PciAddr;
use tracing::info;

use crate::error::VfioError;

/// Drivers under which a group member does not stop the group being viable
/// (vfio-pci itself, pci-stub, and PCIe port bridges).
const HARMLESS_DRIVERS: &[&str] = &["vfio-pci", "pci-stub", "pcieport"];

/// A sysfs (and /dev) tree: the real one at `/`, or a synthetic one in tests.
#[derive(Clone, Debug)]
pub struct Sysfs {
    root: PathBuf,
    /// Tests: emulate the kernel's reaction to `unbind` and `drivers_probe`.
    #[cfg(test)]
    pub(crate) emulate: bool,
}

/// How a device was bound before [`Sysfs::bind`], to put it back.
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use = "restore the previous driver with Sysfs::restore"]
pub struct Binding {
    /// The device.
    pub addr: PciAddr,
    /// The driver it had before (`None`: unbound).
    pub previous: Option<String>,
    /// The driver it was bound to.
    pub driver: String,
}

impl Default for Sysfs {
    fn default() -> Self {
        Sysfs::at("/")
    }
}

impl Sysfs {
    /// The running system's tree.
    pub fn system() -> Sysfs {
        Sysfs::default()
    }

    /// A tree rooted at `root` (which holds `sys/` and `dev/`).
    pub fn at(root: impl Into<PathBuf>) -> Sysfs {
        Sysfs {
            root: root.into(),
            #[cfg(test)]
            emulate: false,
        }
    }

    /// `<root>/<rel>`.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel.trim_start_matches('/'))
    }

    fn device_dir(&self, addr: &PciAddr) -> PathBuf {
        self.path("sys/bus/pci/devices").join(addr.to_string())
    }

    /// `resource<bar>_wc`: the kernel's write-combining mapping of a BAR,
    /// offered for prefetchable memory BARs only (drivers/pci/pci-sysfs.c).
    pub fn resource_wc(&self, addr: &PciAddr, bar: u32) -> PathBuf {
        self.device_dir(addr).join(format!("resource{bar}_wc"))
    }

    /// Every PCI function's address, sorted.
    pub fn devices(&self) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(self.path("sys/bus/pci/devices"))
            .map(|rd| {
                rd.filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }

    /// Fails with the list of present devices when `addr` does not exist.
    pub fn check_exists(&self, addr: &PciAddr) -> Result<(), VfioError> {
        if self.device_dir(addr).exists() {
            return Ok(());
        }
        Err(VfioError::NoSuchDevice {
            addr: *addr,
            dir: self.path("sys/bus/pci/devices"),
            present: self.devices(),
        })
    }

    /// Vendor and device ID (`/sys/bus/pci/devices/<bdf>/{vendor,device}`).
    pub fn ids(&self, addr: &PciAddr) -> Result<(u16, u16), VfioError> {
        let read = |f: &str| -> Result<u16, VfioError> {
            let p = self.device_dir(addr).join(f);
            let s = fs::read_to_string(&p).map_err(|source| VfioError::Sysfs {
                op: "read",
                path: p.clone(),
                source,
            })?;
            u16::from_str_radix(s.trim().trim_start_matches("0x"), 16).map_err(|e| {
                VfioError::Sysfs {
                    op: "parse",
                    path: p,
                    source: io::Error::new(io::ErrorKind::InvalidData, e),
                }
            })
        };
        Ok((read("vendor")?, read("device")?))
    }

    /// The functions with this vendor:device ID.
    pub fn find(&self, vendor: u16, device: u16) -> Vec<PciAddr> {
        self.devices()
            .iter()
            .filter_map(|d| d.parse::<PciAddr>().ok())
            .filter(|a| self.ids(a).ok() == Some((vendor, device)))
            .collect()
    }

    /// The driver a function is bound to (`None`: unbound).
    pub fn driver(&self, addr: &PciAddr) -> Option<String> {
        link_name(&self.device_dir(addr).join("driver"))
    }

    /// The function's IOMMU group; [`VfioError::NoIommu`] when it has none.
    pub fn iommu_group(&self, addr: &PciAddr) -> Result<u32, VfioError> {
        self.check_exists(addr)?;
        if let Some(g) = link_name(&self.device_dir(addr).join("iommu_group")) {
            return g.parse().map_err(|_| VfioError::Sysfs {
                op: "parse the group number of",
                path: self.device_dir(addr).join("iommu_group"),
                source: io::Error::new(io::ErrorKind::InvalidData, g),
            });
        }
        let groups = self.path("sys/kernel/iommu_groups");
        let state = match fs::read_dir(&groups).map(|mut rd| rd.next().is_some()) {
            Ok(true) => "not empty, but this device is in none",
            Ok(false) => "empty",
            Err(_) => "missing",
        };
        Err(VfioError::NoIommu {
            addr: *addr,
            groups,
            state,
        })
    }

    /// Every member of `group` with its driver.
    pub fn group_devices(&self, group: u32) -> Vec<(String, Option<String>)> {
        let dir = self.path(&format!("sys/kernel/iommu_groups/{group}/devices"));
        let mut v: Vec<(String, Option<String>)> = fs::read_dir(dir)
            .map(|rd| {
                rd.filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .map(|name| {
                        let drv =
                            link_name(&self.path("sys/bus/pci/devices").join(&name).join("driver"));
                        (name, drv)
                    })
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }

    /// Checks that `addr` is bound to vfio-pci and that every other member of
    /// its group is bound to vfio-pci, pci-stub, pcieport or nothing. Returns
    /// the group.
    pub fn check_viable(&self, addr: &PciAddr) -> Result<u32, VfioError> {
        let group = self.iommu_group(addr)?;
        let driver = self.driver(addr);
        if driver.as_deref() != Some("vfio-pci") {
            return Err(VfioError::NotBoundToVfio {
                addr: *addr,
                driver,
            });
        }
        let blockers: Vec<(String, String)> = self
            .group_devices(group)
            .into_iter()
            .filter_map(|(d, drv)| {
                drv.filter(|x| !HARMLESS_DRIVERS.contains(&x.as_str()))
                    .map(|x| (d, x))
            })
            .collect();
        if !blockers.is_empty() {
            return Err(VfioError::GroupNotViable {
                addr: *addr,
                group,
                blockers,
            });
        }
        Ok(group)
    }

    /// The VFIO cdev of the device (`/dev/vfio/devices/vfioX`), when the
    /// kernel offers the iommufd path (`/dev/iommu` and `<bdf>/vfio-dev/`).
    pub fn vfio_cdev(&self, addr: &PciAddr) -> Option<PathBuf> {
        if !self.path("dev/iommu").exists() {
            return None;
        }
        let name = fs::read_dir(self.device_dir(addr).join("vfio-dev"))
            .ok()?
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .find(|n| n.starts_with("vfio"))?;
        Some(self.path("dev/vfio/devices").join(name))
    }

    fn write(&self, path: &Path, value: &str) -> Result<(), VfioError> {
        fs::write(path, value).map_err(|source| VfioError::Sysfs {
            op: "write",
            path: path.to_path_buf(),
            source,
        })?;
        #[cfg(test)]
        if self.emulate {
            tests::emulate_kernel(&self.root, path, value);
        }
        Ok(())
    }

    fn set_override(&self, addr: &PciAddr, driver: Option<&str>) -> Result<(), VfioError> {
        // An empty line clears the override.
        let value = driver.map_or_else(|| "\n".to_string(), |d| format!("{d}\n"));
        self.write(&self.device_dir(addr).join("driver_override"), &value)
    }

    fn unbind_current(&self, addr: &PciAddr) -> Result<(), VfioError> {
        if let Some(cur) = self.driver(addr) {
            let p = self.path(&format!("sys/bus/pci/drivers/{cur}/unbind"));
            self.write(&p, &addr.to_string())?;
        }
        Ok(())
    }

    fn probe(&self, addr: &PciAddr) -> Result<(), VfioError> {
        self.write(&self.path("sys/bus/pci/drivers_probe"), &addr.to_string())
    }

    /// Bind `addr` to `driver` (normally `vfio-pci`): set `driver_override`,
    /// unbind the current driver, probe. Returns what to restore.
    pub fn bind(&self, addr: &PciAddr, driver: &str) -> Result<Binding, VfioError> {
        self.check_exists(addr)?;
        let previous = self.driver(addr);
        let binding = Binding {
            addr: *addr,
            previous: previous.clone(),
            driver: driver.to_string(),
        };
        if previous.as_deref() == Some(driver) {
            return Ok(binding);
        }
        if !self.path(&format!("sys/bus/pci/drivers/{driver}")).exists() {
            return Err(VfioError::Bind {
                addr: *addr,
                wanted: driver.into(),
                now: previous,
                hint: format!("the driver {driver} is not loaded: `modprobe {driver}`"),
            });
        }
        self.set_override(addr, Some(driver))?;
        self.unbind_current(addr)?;
        self.probe(addr)?;
        let now = self.driver(addr);
        if now.as_deref() != Some(driver) {
            return Err(VfioError::Bind {
                addr: *addr,
                wanted: driver.into(),
                now,
                hint:
                    "check `dmesg | tail` (an IOMMU group error, or the driver refused the device)"
                        .into(),
            });
        }
        info!(%addr, ?previous, driver, "bound");
        Ok(binding)
    }

    /// Unbind `addr` from its driver and leave it unbound (clearing
    /// `driver_override`); returns the driver it had, to pass to
    /// [`Sysfs::bind`] later.
    pub fn unbind(&self, addr: &PciAddr) -> Result<Option<String>, VfioError> {
        self.check_exists(addr)?;
        let previous = self.driver(addr);
        self.unbind_current(addr)?;
        self.set_override(addr, None)?;
        if let Some(now) = self.driver(addr) {
            return Err(VfioError::Bind {
                addr: *addr,
                wanted: "no driver".into(),
                now: Some(now),
                hint: "the unbind did not take; check `dmesg | tail`".into(),
            });
        }
        info!(%addr, ?previous, "unbound");
        Ok(previous)
    }

    /// Put the device back to the driver it had before [`Sysfs::bind`]
    /// (or leave it unbound if it had none), and clear `driver_override`.
    pub fn restore(&self, binding: Binding) -> Result<Option<String>, VfioError> {
        let addr = &binding.addr;
        if self.driver(addr) == binding.previous {
            self.set_override(addr, None)?;
            return Ok(binding.previous);
        }
        self.unbind_current(addr)?;
        if let Some(prev) = &binding.previous {
            self.set_override(addr, Some(prev))?;
            self.probe(addr)?;
        }
        self.set_override(addr, None)?;
        let now = self.driver(addr);
        if now != binding.previous {
            return Err(VfioError::Bind {
                addr: *addr,
                wanted: binding.previous.unwrap_or_else(|| "no driver".into()),
                now,
                hint: "check `dmesg | tail`".into(),
            });
        }
        info!(%addr, driver = ?now, "restored");
        Ok(now)
    }
}

fn link_name(link: &Path) -> Option<String> {
    fs::read_link(link)
        .ok()?
        .file_name()?
        .to_str()
        .map(str::to_owned)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::os::unix::fs::symlink;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// What the kernel does on the writes `bind`/`restore` make.
    pub(crate) fn emulate_kernel(root: &Path, path: &Path, value: &str) {
        let devs = root.join("sys/bus/pci/devices");
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        match name {
            "unbind" => {
                let _ = fs::remove_file(devs.join(value.trim()).join("driver"));
            }
            "drivers_probe" => {
                let dev = devs.join(value.trim());
                if dev.join("driver").exists() {
                    return;
                }
                let ovr = fs::read_to_string(dev.join("driver_override")).unwrap_or_default();
                let drv = match ovr.trim() {
                    "" => fs::read_to_string(dev.join("default_driver")).unwrap_or_default(),
                    o => o.to_string(),
                };
                let drv = drv.trim();
                let ddir = root.join("sys/bus/pci/drivers").join(drv);
                if !drv.is_empty() && ddir.exists() {
                    symlink(ddir, dev.join("driver")).unwrap();
                }
            }
            _ => {}
        }
    }

    /// One synthetic device: (bdf, IOMMU group, driver, vendor, device).
    pub(crate) type Dev<'a> = (&'a str, Option<u32>, Option<&'a str>, u16, u16);

    /// A synthetic tree of devices.
    pub(crate) struct Tree {
        pub(crate) root: PathBuf,
    }

    impl Drop for Tree {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.root);
        }
    }

    impl Tree {
        pub(crate) fn new(devices: &[Dev<'_>]) -> Tree {
            static N: AtomicU32 = AtomicU32::new(0);
            let root = std::env::temp_dir().join(format!(
                "rnic-vfio-sysfs-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = fs::remove_dir_all(&root);
            for d in ["sys/bus/pci/devices", "sys/kernel/iommu_groups", "dev/vfio"] {
                fs::create_dir_all(root.join(d)).unwrap();
            }
            fs::write(root.join("sys/bus/pci/drivers_probe"), "").unwrap();
            let t = Tree { root };
            for drv in ["vfio-pci", "e1000e", "edu-host", "ahci"] {
                t.add_driver(drv);
            }
            for &(bdf, group, driver, vendor, device) in devices {
                let dev = t.root.join("sys/bus/pci/devices").join(bdf);
                fs::create_dir_all(&dev).unwrap();
                fs::write(dev.join("vendor"), format!("0x{vendor:04x}\n")).unwrap();
                fs::write(dev.join("device"), format!("0x{device:04x}\n")).unwrap();
                fs::write(dev.join("driver_override"), "(null)\n").unwrap();
                if let Some(g) = group {
                    let gdir = t.root.join(format!("sys/kernel/iommu_groups/{g}/devices"));
                    fs::create_dir_all(&gdir).unwrap();
                    symlink(&dev, gdir.join(bdf)).unwrap();
                    symlink(gdir.parent().unwrap(), dev.join("iommu_group")).unwrap();
                }
                if let Some(drv) = driver {
                    fs::write(dev.join("default_driver"), drv).unwrap();
                    symlink(
                        t.root.join("sys/bus/pci/drivers").join(drv),
                        dev.join("driver"),
                    )
                    .unwrap();
                }
            }
            t
        }

        pub(crate) fn add_driver(&self, drv: &str) {
            let d = self.root.join("sys/bus/pci/drivers").join(drv);
            fs::create_dir_all(&d).unwrap();
            fs::write(d.join("unbind"), "").unwrap();
        }

        pub(crate) fn sysfs(&self) -> Sysfs {
            let mut s = Sysfs::at(&self.root);
            s.emulate = true;
            s
        }

        pub(crate) fn read(&self, rel: &str) -> String {
            fs::read_to_string(self.root.join(rel)).unwrap()
        }
    }

    fn a(s: &str) -> PciAddr {
        s.parse().unwrap()
    }

    const EDU: &str = "0000:00:02.0";
    const NIC: &str = "0000:00:03.0";

    #[test]
    fn bind_uses_driver_override_and_restore_puts_the_old_driver_back() {
        let t = Tree::new(&[(NIC, Some(3), Some("e1000e"), 0x8086, 0x10d3)]);
        let s = t.sysfs();
        let b = s.bind(&a(NIC), "vfio-pci").unwrap();
        assert_eq!(b.previous.as_deref(), Some("e1000e"));
        assert_eq!(s.driver(&a(NIC)).as_deref(), Some("vfio-pci"));
        assert_eq!(
            t.read(&format!("sys/bus/pci/devices/{NIC}/driver_override")),
            "vfio-pci\n"
        );
        assert_eq!(
            t.read("sys/bus/pci/drivers/e1000e/unbind"),
            NIC,
            "old driver unbound"
        );
        assert_eq!(t.read("sys/bus/pci/drivers_probe"), NIC);
        assert_eq!(s.check_viable(&a(NIC)).unwrap(), 3);

        assert_eq!(s.restore(b).unwrap().as_deref(), Some("e1000e"));
        assert_eq!(s.driver(&a(NIC)).as_deref(), Some("e1000e"));
        assert_eq!(t.read("sys/bus/pci/drivers/vfio-pci/unbind"), NIC);
        assert_eq!(
            t.read(&format!("sys/bus/pci/devices/{NIC}/driver_override")),
            "\n",
            "override cleared"
        );
    }

    #[test]
    fn an_unbound_device_is_restored_to_unbound_and_rebinding_is_a_no_op() {
        let t = Tree::new(&[(EDU, Some(2), None, 0x1234, 0x11e8)]);
        let s = t.sysfs();
        assert_eq!(s.find(0x1234, 0x11e8), vec![a(EDU)]);
        let b = s.bind(&a(EDU), "vfio-pci").unwrap();
        assert_eq!(b.previous, None);
        let again = s.bind(&a(EDU), "vfio-pci").unwrap();
        assert_eq!(
            again.previous.as_deref(),
            Some("vfio-pci"),
            "already bound: nothing to do"
        );
        assert_eq!(s.restore(b).unwrap(), None);
        assert_eq!(s.driver(&a(EDU)), None);
    }

    #[test]
    fn unbind_leaves_the_device_unbound_and_reports_the_old_driver() {
        let t = Tree::new(&[(NIC, Some(3), Some("e1000e"), 0x8086, 0x10d3)]);
        let s = t.sysfs();
        assert_eq!(s.unbind(&a(NIC)).unwrap().as_deref(), Some("e1000e"));
        assert_eq!(s.driver(&a(NIC)), None);
        assert_eq!(
            s.unbind(&a(NIC)).unwrap(),
            None,
            "unbinding an unbound device is a no-op"
        );
        let b = s.bind(&a(NIC), "e1000e").unwrap();
        assert_eq!(
            (b.previous, s.driver(&a(NIC)).as_deref()),
            (None, Some("e1000e"))
        );
    }

    #[test]
    fn bind_without_the_driver_loaded_says_modprobe() {
        let t = Tree::new(&[(EDU, Some(2), None, 0x1234, 0x11e8)]);
        fs::remove_dir_all(t.root.join("sys/bus/pci/drivers/vfio-pci")).unwrap();
        let e = t.sysfs().bind(&a(EDU), "vfio-pci").unwrap_err().to_string();
        assert!(e.contains("`modprobe vfio-pci`"), "{e}");
    }

    #[test]
    fn a_probe_that_does_not_take_is_an_error_naming_the_outcome() {
        let t = Tree::new(&[(EDU, Some(2), None, 0x1234, 0x11e8)]);
        let mut s = t.sysfs();
        s.emulate = false; // the "kernel" ignores the probe
        let e = s.bind(&a(EDU), "vfio-pci").unwrap_err().to_string();
        assert!(
            e.contains("bound to no driver") && e.contains("dmesg"),
            "{e}"
        );
    }

    #[test]
    fn group_viability_names_the_device_in_the_way() {
        let t = Tree::new(&[
            (EDU, Some(5), Some("vfio-pci"), 0x1234, 0x11e8),
            ("0000:00:1f.2", Some(5), Some("ahci"), 0x8086, 0x2922),
            ("0000:00:1f.0", Some(5), None, 0x8086, 0x2918),
        ]);
        let e = t.sysfs().check_viable(&a(EDU)).unwrap_err();
        assert!(
            matches!(e, VfioError::GroupNotViable { group: 5, ref blockers, .. } if blockers == &[("0000:00:1f.2".to_string(), "ahci".to_string())])
        );
        let msg = e.to_string();
        assert!(msg.contains("0000:00:1f.2 is bound to ahci"), "{msg}");
        assert!(
            !msg.contains("1f.0"),
            "an unbound member is harmless: {msg}"
        );
    }

    #[test]
    fn not_bound_to_vfio_gives_the_exact_commands() {
        let t = Tree::new(&[(NIC, Some(3), Some("e1000e"), 0x8086, 0x10d3)]);
        let msg = t.sysfs().check_viable(&a(NIC)).unwrap_err().to_string();
        assert!(msg.contains("bound to e1000e, not vfio-pci"), "{msg}");
        assert!(msg.contains(&format!("`rnicctl bind {NIC}`")), "{msg}");
        assert!(
            msg.contains(&format!(
                "echo vfio-pci > /sys/bus/pci/devices/{NIC}/driver_override"
            )),
            "{msg}"
        );
        assert!(
            msg.contains(&format!("echo {NIC} > /sys/bus/pci/drivers_probe")),
            "{msg}"
        );
    }

    #[test]
    fn no_iommu_and_no_such_device_explain_themselves() {
        let t = Tree::new(&[(NIC, None, Some("e1000e"), 0x8086, 0x10d3)]);
        let s = t.sysfs();
        let msg = s.iommu_group(&a(NIC)).unwrap_err().to_string();
        assert!(msg.contains("iommu_groups is empty"), "{msg}");
        assert!(
            msg.contains("intel_iommu=on") && msg.contains("amd_iommu=on iommu=pt"),
            "{msg}"
        );
        let e = s.iommu_group(&a("0000:af:00.0")).unwrap_err();
        assert!(
            matches!(&e, VfioError::NoSuchDevice { present, .. } if present == &[NIC.to_string()])
        );
        assert!(
            e.to_string().contains(&format!("devices present: {NIC}")),
            "{e}"
        );
    }

    #[test]
    fn the_vfio_cdev_is_reported_only_with_dev_iommu() {
        let t = Tree::new(&[(EDU, Some(2), Some("vfio-pci"), 0x1234, 0x11e8)]);
        let s = t.sysfs();
        fs::create_dir_all(
            t.root
                .join(format!("sys/bus/pci/devices/{EDU}/vfio-dev/vfio0")),
        )
        .unwrap();
        assert_eq!(s.vfio_cdev(&a(EDU)), None, "no /dev/iommu");
        fs::write(t.root.join("dev/iommu"), "").unwrap();
        assert_eq!(
            s.vfio_cdev(&a(EDU)),
            Some(t.root.join("dev/vfio/devices/vfio0"))
        );
    }
}
