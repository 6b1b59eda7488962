//! The crate's error type: one variant per failed operation, with the
//! context and, where the user can fix it, the fix.

use std::io;
use std::path::PathBuf;

use rnic_core::PciAddr;
use thiserror::Error;

fn bind_commands(addr: &PciAddr) -> String {
    format!(
        "`rnicctl bind {addr}`, or as root: \
         `modprobe vfio-pci; echo vfio-pci > /sys/bus/pci/devices/{addr}/driver_override; \
         [ -e /sys/bus/pci/devices/{addr}/driver ] && echo {addr} > /sys/bus/pci/devices/{addr}/driver/unbind; \
         echo {addr} > /sys/bus/pci/drivers_probe`"
    )
}

fn list(devices: &[String]) -> String {
    if devices.is_empty() {
        "none".into()
    } else {
        devices.join(", ")
    }
}

/// Everything that can go wrong in rnic-vfio.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum VfioError {
    /// The PCI address names no device.
    #[error(
        "open PCI device {addr}: no such device in {dir}; devices present: {}; check the address with `lspci -D`",
        list(present)
    )]
    NoSuchDevice {
        /// The address asked for.
        addr: PciAddr,
        /// The sysfs folder searched.
        dir: PathBuf,
        /// The addresses that do exist.
        present: Vec<String>,
    },

    /// The device has no IOMMU group: the IOMMU is off.
    #[error(
        "open PCI device {addr}: it has no IOMMU group ({groups} is {state}), so the IOMMU is off; \
         enable VT-d / AMD-Vi in the firmware and boot with `intel_iommu=on iommu=pt` (Intel) or \
         `amd_iommu=on iommu=pt` (AMD) on the kernel command line (check: `dmesg | grep -e DMAR -e AMD-Vi`)"
    )]
    NoIommu {
        /// The device.
        addr: PciAddr,
        /// `/sys/kernel/iommu_groups`.
        groups: PathBuf,
        /// "empty" or "missing".
        state: &'static str,
    },

    /// The device is not bound to vfio-pci.
    #[error(
        "open PCI device {addr}: it is bound to {}, not vfio-pci; bind it with {}",
        driver.as_deref().unwrap_or("no driver"),
        bind_commands(addr)
    )]
    NotBoundToVfio {
        /// The device.
        addr: PciAddr,
        /// Its current driver.
        driver: Option<String>,
    },

    /// Another device of the group is bound to a host driver.
    #[error(
        "open PCI device {addr}: IOMMU group {group} is not viable: {}; every device of a group must be \
         bound to vfio-pci or to no driver (`rnicctl bind <each device>`), or move {addr} to a slot \
         with its own group (ACS)",
        blockers.iter().map(|(d, drv)| format!("{d} is bound to {drv}")).collect::<Vec<_>>().join(", ")
    )]
    GroupNotViable {
        /// The device asked for.
        addr: PciAddr,
        /// Its group.
        group: u32,
        /// (device, driver) pairs in the way.
        blockers: Vec<(String, String)>,
    },

    /// `/dev/vfio/vfio` is missing.
    #[error(
        "open {path}: {source}; load VFIO with `modprobe vfio-pci` (and check /dev is populated)"
    )]
    VfioMissing {
        /// The container node.
        path: PathBuf,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },

    /// A VFIO node exists but this user may not open it.
    #[error(
        "open {path}: permission denied (owner uid {uid}, gid {gid}, mode {mode:o}); run as root, or \
         `chown <user> {path}` (a udev rule: SUBSYSTEM==\"vfio\", OWNER=\"<user>\")"
    )]
    Permission {
        /// The node.
        path: PathBuf,
        /// Its owner.
        uid: u32,
        /// Its group.
        gid: u32,
        /// Its permission bits.
        mode: u32,
    },

    /// The container speaks an unknown VFIO API or lacks type1v2.
    #[error("VFIO container {path}: {what}")]
    Unsupported {
        /// The container node.
        path: PathBuf,
        /// What is missing.
        what: String,
    },

    /// A VFIO ioctl (or read, write, mmap) failed.
    #[error("{op} on {target}: {source}")]
    Ioctl {
        /// The call, e.g. `VFIO_GROUP_SET_CONTAINER`.
        op: &'static str,
        /// What it acted on (`/dev/vfio/2`, `0000:00:02.0 BAR0`, ...).
        target: String,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },

    /// A region index or range the device does not have.
    #[error("device {addr} region {index}: {reason}")]
    Region {
        /// The device.
        addr: PciAddr,
        /// Region index.
        index: u32,
        /// What is wrong.
        reason: String,
    },

    /// An interrupt index cannot provide the vectors asked for.
    #[error(
        "device {addr} interrupt index {index}: asked for {wanted} vectors, the device offers {count}"
    )]
    Irq {
        /// The device.
        addr: PciAddr,
        /// Interrupt index.
        index: u32,
        /// Vectors asked for.
        wanted: u32,
        /// Vectors available.
        count: u32,
    },

    /// `VFIO_DEVICE_RESET` is not offered for this device.
    #[error("reset device {addr}: VFIO reports no reset method (no FLR, PM or bus reset)")]
    ResetUnsupported {
        /// The device.
        addr: PciAddr,
    },

    /// `VFIO_IOMMU_MAP_DMA` was refused because of the locked-memory limit.
    #[error(
        "map {len:#x} bytes at IOVA {iova:#x}: {source}; VFIO pins the pages and charges them to \
         RLIMIT_MEMLOCK (now {limit}): raise it (`ulimit -l unlimited`, `LimitMEMLOCK=infinity`, \
         or `<user> - memlock unlimited` in /etc/security/limits.conf) or run with CAP_IPC_LOCK"
    )]
    Memlock {
        /// The IOVA.
        iova: u64,
        /// The length.
        len: u64,
        /// The soft limit, as text (`unlimited` or bytes).
        limit: String,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },

    /// A DMA mapping request that conflicts with the container's bookkeeping.
    #[error("{op} {len:#x} bytes at IOVA {iova:#x}: {reason}")]
    DmaRange {
        /// `map` or `unmap`.
        op: &'static str,
        /// The IOVA.
        iova: u64,
        /// The length.
        len: u64,
        /// What is wrong.
        reason: String,
    },

    /// Reading or writing sysfs failed.
    #[error("{op} {path}: {source}")]
    Sysfs {
        /// What was attempted.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },

    /// A driver override + probe did not end with the wanted driver.
    #[error(
        "bind {addr} to {wanted}: after driver_override + drivers_probe it is bound to {}; {hint}",
        now.as_deref().unwrap_or("no driver")
    )]
    Bind {
        /// The device.
        addr: PciAddr,
        /// The driver asked for.
        wanted: String,
        /// The driver it ended up with.
        now: Option<String>,
        /// What to check.
        hint: String,
    },
}

impl VfioError {
    pub(crate) fn ioctl(op: &'static str, target: impl ToString, source: io::Error) -> VfioError {
        VfioError::Ioctl {
            op,
            target: target.to_string(),
            source,
        }
    }
}
