//! Which routes this host offers for putting a peer PCI BAR (a GPU's BAR1)
//! into a VFIO-owned NIC's IOMMU domain, and why the others are closed
//! (reference/gpu.md §1; `rnicctl doctor` prints this).
//!
//! 1. **type1 `VFIO_IOMMU_MAP_DMA` of a PFNMAP mapping** (rnic-dma's
//!    `PeerRegion`): needs the VFIO container with the type1 IOMMU; PFNMAP
//!    faulting in `vaddr_get_pfns` since Linux 5.8, huge pfnmaps since 6.12
//!    and 6.15 (a 32 GB BAR maps in < 1 ms instead of ~1 s). Nothing
//!    revokes the mapping when the peer's driver goes, which rnic answers by
//!    ownership.
//! 2. **VFIO dma-buf export + iommufd `IOMMU_IOAS_MAP_FILE`**: Linux 6.19+
//!    with `/dev/iommu`, the VFIO device cdev (`/dev/vfio/devices/`, 6.6+)
//!    and `CONFIG_PCI_P2PDMA`; only VFIO-exported BARs (not a CUDA dma-buf).
//!
//! Everything is read under a [`Sysfs`] root, so tests describe hosts with
//! synthetic trees.

use std::fs;

use crate::sysfs::Sysfs;

/// One route and whether this host offers it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    /// Short name.
    pub name: &'static str,
    /// Whether it can be used here.
    pub available: bool,
    /// What was found, and what is missing.
    pub why: String,
}

/// A kernel release (`6.1.0-57-amd64`) as (major, minor).
pub fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut it = release.split(|c: char| !c.is_ascii_digit());
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

/// `CONFIG_<name>` from the kernel's config (`/boot/config-<release>` under
/// the root): `Some(true)` for `y`/`m`, `Some(false)` when unset, `None`
/// when no config file is readable.
pub fn kernel_config(sysfs: &Sysfs, release: &str, name: &str) -> Option<bool> {
    let text = fs::read_to_string(sysfs.path(&format!("boot/config-{release}"))).ok()?;
    let key = format!("CONFIG_{name}=");
    Some(
        text.lines()
            .any(|l| l.strip_prefix(&key).is_some_and(|v| v == "y" || v == "m")),
    )
}

fn at_least(v: Option<(u32, u32)>, want: (u32, u32)) -> bool {
    v.is_some_and(|v| v >= want)
}

/// Every route, for kernel `release`, as this host (under `sysfs`) offers it.
pub fn peer_bar_routes(sysfs: &Sysfs, release: &str) -> Vec<Route> {
    let v = kernel_version(release);
    let groups = fs::read_dir(sysfs.path("sys/kernel/iommu_groups"))
        .map(|d| d.count())
        .unwrap_or(0);
    let container = sysfs.path("dev/vfio/vfio").exists();
    let type1 = {
        let mut missing = Vec::new();
        if groups == 0 {
            missing.push("no IOMMU groups (enable VT-d/AMD-Vi and boot with intel_iommu=on)");
        }
        if !container {
            missing.push("no /dev/vfio/vfio (modprobe vfio-pci)");
        }
        if !at_least(v, (5, 8)) {
            missing.push("kernel older than 5.8 cannot fault in PFNMAP memory for MAP_DMA");
        }
        Route {
            name: "type1 MAP_DMA of a PFNMAP BAR",
            available: missing.is_empty(),
            why: if missing.is_empty() {
                format!(
                    "{groups} IOMMU groups, VFIO container present, kernel {release}{}",
                    if at_least(v, (6, 15)) {
                        " (huge pfnmaps: large BARs map fast)"
                    } else {
                        " (no huge-pfnmap fast path before 6.15: a 32 GB BAR takes ~1 s to map)"
                    }
                )
            } else {
                missing.join("; ")
            },
        }
    };
    let dmabuf = {
        let mut missing = Vec::new();
        if !at_least(v, (6, 19)) {
            missing.push(format!(
                "kernel {release} is older than 6.19 (VFIO dma-buf export and iommufd's \
                 dma-buf MAP_FILE arrived in 6.19)"
            ));
        }
        if !sysfs.path("dev/iommu").exists() {
            missing.push("no /dev/iommu (CONFIG_IOMMUFD; modprobe iommufd)".into());
        }
        if !sysfs.path("dev/vfio/devices").is_dir() {
            missing.push(
                "no VFIO device cdev /dev/vfio/devices (CONFIG_VFIO_DEVICE_CDEV, 6.6+)".into(),
            );
        }
        match kernel_config(sysfs, release, "PCI_P2PDMA") {
            Some(true) => {}
            Some(false) => missing.push("CONFIG_PCI_P2PDMA is not set".into()),
            None => missing.push(format!(
                "CONFIG_PCI_P2PDMA unknown (no /boot/config-{release})"
            )),
        }
        Route {
            name: "VFIO dma-buf + iommufd MAP_FILE",
            available: missing.is_empty(),
            why: if missing.is_empty() {
                "kernel, /dev/iommu, VFIO cdev and PCI_P2PDMA present (VFIO-exported BARs only; \
                 a CUDA dma-buf cannot be imported by iommufd)"
                    .into()
            } else {
                missing.join("; ")
            },
        }
    };
    vec![type1, dmabuf]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(files: &[(&str, &str)], dirs: &[&str]) -> (tempfile::TempDir, Sysfs) {
        let t = tempfile::tempdir().unwrap();
        for d in dirs {
            fs::create_dir_all(t.path().join(d)).unwrap();
        }
        for (f, text) in files {
            let p = t.path().join(f);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, text).unwrap();
        }
        let s = Sysfs::at(t.path());
        (t, s)
    }

    #[test]
    fn versions_and_config() {
        assert_eq!(kernel_version("6.1.0-57-amd64"), Some((6, 1)));
        assert_eq!(kernel_version("6.19.2"), Some((6, 19)));
        assert_eq!(kernel_version("x"), None);
        let (_t, s) = tree(
            &[(
                "boot/config-6.19.0",
                "CONFIG_PCI_P2PDMA=y\n# CONFIG_X is not set\n",
            )],
            &[],
        );
        assert_eq!(kernel_config(&s, "6.19.0", "PCI_P2PDMA"), Some(true));
        assert_eq!(kernel_config(&s, "6.19.0", "X"), Some(false));
        assert_eq!(kernel_config(&s, "6.1.0", "PCI_P2PDMA"), None);
    }

    #[test]
    fn a_6_1_host_with_vfio_offers_type1_only() {
        let (_t, s) = tree(
            &[
                ("dev/vfio/vfio", ""),
                ("boot/config-6.1.0-57-amd64", "CONFIG_IOMMUFD=m\n"),
            ],
            &["sys/kernel/iommu_groups/0", "sys/kernel/iommu_groups/1"],
        );
        let r = peer_bar_routes(&s, "6.1.0-57-amd64");
        assert!(r[0].available, "{r:?}");
        assert!(
            r[0].why.contains("2 IOMMU groups") && r[0].why.contains("before 6.15"),
            "{r:?}"
        );
        assert!(!r[1].available);
        for want in [
            "older than 6.19",
            "no /dev/iommu",
            "no VFIO device cdev",
            "PCI_P2PDMA is not set",
        ] {
            assert!(r[1].why.contains(want), "{want}: {}", r[1].why);
        }
    }

    #[test]
    fn a_6_19_host_with_iommufd_offers_both() {
        let (_t, s) = tree(
            &[
                ("dev/vfio/vfio", ""),
                ("dev/iommu", ""),
                ("boot/config-6.19.1", "CONFIG_PCI_P2PDMA=y\n"),
            ],
            &["sys/kernel/iommu_groups/7", "dev/vfio/devices"],
        );
        let r = peer_bar_routes(&s, "6.19.1");
        assert!(r.iter().all(|x| x.available), "{r:?}");
        assert!(r[0].why.contains("huge pfnmaps"));
    }

    #[test]
    fn no_iommu_closes_both() {
        let (_t, s) = tree(&[], &[]);
        let r = peer_bar_routes(&s, "6.8.0");
        assert!(
            !r[0].available && r[0].why.contains("no IOMMU groups"),
            "{r:?}"
        );
        assert!(!r[1].available && r[1].why.contains("unknown"), "{r:?}");
    }
}
