//! Devices: which rnic devices the library lists, their `ibv_device`
//! structures, and the device-level exports (`ibv_get_device_list`,
//! `ibv_get_device_name`, `ibv_get_device_guid`, …, and the sysfs helpers
//! `ibv_get_sysfs_path` / `ibv_read_sysfs_file`).
//!
//! # Which devices
//!
//! * `RNIC_DEVICES=[name=]spec,[name=]spec,…` lists them explicitly, in
//!   that order; a spec is one of `rnic::open`'s (`rxe:<netdev>`,
//!   `rxe:<ip>`, `mlx5:<bdf>[@ip]`, `mlx5:vfio-user:<socket>[@ip]`). Without
//!   a name, `rxe:<netdev>` is `rnic_<netdev>`, `rxe:<ip>` is `rnic_<ip>`
//!   (punctuation as `_`), an mlx5 function `rnic_mlx5_<socket stem or
//!   bdf>`.
//! * Otherwise every interface that has an address, as `rnic_<netdev>`
//!   (`rnic_lo` first on most hosts), and every ConnectX function bound to
//!   vfio-pci, as `rnic_mlx5_<bdf>`.
//!
//! The list is built once per process, at the first `ibv_get_device_list`.
//! Listing opens nothing: an rxe device's GID table is read from the
//! interface's addresses (as the device will build it at open), an mlx5
//! function's is its `@ip` (or empty).
//!
//! # sysfs
//!
//! `ibv_device.ibdev_path` is `/sys/class/infiniband/<name>`, which does not
//! exist: no kernel device stands behind it. `ibv_read_sysfs_file` (which
//! `ibv_devinfo` and librdmacm read through) serves the files of that
//! directory the kernel would have (`board_id`, `node_guid`, `fw_ver`,
//! `node_type`, `ports/1/gids/<i>`, `ports/1/gid_attrs/types/<i>`,
//! `ports/1/gid_attrs/ndevs/<i>`, …); every other path is read from the
//! real file system. Programs that open those files themselves find
//! nothing (docs/verbs-abi.md lists what UCX does about it).

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::net::IpAddr;
use std::sync::OnceLock;

use rnic::core::{Gid, GidEntry, GidType};

use rnic::rxe::Target;
use rnic::spec::{DeviceSpec, Mlx5Target, RxeTarget};

use crate::abi::{IBV_NODE_CA, IBV_TRANSPORT_IB, Shared, ibv_device, zeroed};
use crate::{copy_cstr, fail_neg, fail_null, warn};

/// The backend a listed device opens.
#[derive(Debug, Clone)]
pub enum Backend {
    /// rnic-rxe on an interface or address.
    Rxe(Target),
    /// An mlx5 function (its full spec, for `rnic::open_mlx5`).
    Mlx5,
}

/// What the library knows about a device before opening it.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    /// Its name (`rnic_lo`).
    pub name: String,
    /// The rnic spec it opens (`rxe:lo`).
    pub spec: String,
    /// Which backend.
    pub backend: Backend,
    /// The GID table as the device will have it.
    pub gids: Vec<GidEntry>,
    /// Node GUID (host order; the C functions return it big-endian).
    pub guid: u64,
    /// Position in the list (`ibv_get_device_index`).
    pub index: usize,
}

/// A listed device. `ibv_device` comes first, so a `struct ibv_device *`
/// is a `*const Device`.
#[repr(C)]
#[derive(Debug)]
pub struct Device {
    /// The C structure applications read.
    pub c: Shared<ibv_device>,
    /// Where rdma-core's `struct verbs_device` has its `ops` pointer (right
    /// after `ibv_device`): NULL, so a real libmlx5/libefa loaded beside this
    /// library (perftest links both) sees a device that is not theirs
    /// (`mlx5dv_is_supported` false) instead of reading past the end.
    verbs_ops: usize,
    /// The Rust side.
    pub info: DeviceInfo,
}

impl Device {
    fn new(info: DeviceInfo) -> Device {
        let mut c: ibv_device = zeroed();
        c.node_type = IBV_NODE_CA;
        c.transport_type = IBV_TRANSPORT_IB;
        copy_cstr(&mut c.name, &info.name);
        // The kernel's would be `uverbs<N>`; the device's own name cannot
        // clash with a kernel device's node in /dev/infiniband (UCX checks
        // that /dev/infiniband/<dev_name> is a character device it can open:
        // `verbs/install.sh --dev-nodes`, docs/verbs-abi.md).
        copy_cstr(&mut c.dev_name, &info.name);
        copy_cstr(
            &mut c.dev_path,
            &format!("{}/class/infiniband_verbs/{}", sysfs_root(), info.name),
        );
        copy_cstr(&mut c.ibdev_path, &ibdev_path(&info.name));
        Device {
            c: Shared::new(c),
            verbs_ops: 0,
            info,
        }
    }

    /// The C pointer applications hold.
    pub fn as_ptr(&self) -> *mut ibv_device {
        self.c.get()
    }

    /// The device behind an `ibv_device` pointer of this library, if it is
    /// one (pointers are compared with the list, never dereferenced first).
    pub fn from_ptr(dev: *const ibv_device) -> Option<&'static Device> {
        devices().iter().find(|d| std::ptr::eq(d.as_ptr(), dev))
    }
}

/// `/sys`, or `$SYSFS_PATH` as rdma-core reads it.
pub fn sysfs_root() -> &'static str {
    static ROOT: OnceLock<String> = OnceLock::new();
    ROOT.get_or_init(|| {
        std::env::var("SYSFS_PATH")
            .ok()
            .filter(|p| !p.is_empty())
            .map_or_else(|| "/sys".to_owned(), |p| p.trim_end_matches('/').to_owned())
    })
}

fn ibdev_path(name: &str) -> String {
    format!("{}/class/infiniband/{name}", sysfs_root())
}

/// The devices, listed at the first call.
pub fn devices() -> &'static [Device] {
    static DEVICES: OnceLock<Vec<Device>> = OnceLock::new();
    DEVICES.get_or_init(|| {
        let (entries, explicit) = match std::env::var("RNIC_DEVICES") {
            Ok(list) if !list.trim().is_empty() => (parse_list(&list), true),
            _ => (discover(), false),
        };
        let infos: Vec<DeviceInfo> = entries
            .into_iter()
            .filter_map(|(name, spec)| match describe(name, &spec, 0) {
                Ok(info) => Some(info),
                Err(e) => {
                    // Discovery skips interfaces it cannot use (say, only a
                    // tentative IPv6 address) silently; a listed spec is
                    // the user's and says why.
                    if explicit {
                        warn(format_args!("RNIC_DEVICES: {spec:?} left out: {e}"));
                    }
                    None
                }
            })
            .collect();
        infos
            .into_iter()
            .enumerate()
            .map(|(index, info)| Device::new(DeviceInfo { index, ..info }))
            .collect()
    })
}

/// `RNIC_DEVICES` entries: `(name, spec)`.
pub fn parse_list(list: &str) -> Vec<(Option<String>, String)> {
    list.split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|e| match e.split_once('=') {
            Some((name, spec)) if !name.contains(':') && !name.is_empty() => {
                (Some(name.to_owned()), spec.to_owned())
            }
            _ => (None, e.to_owned()),
        })
        .collect()
}

/// Every interface with an address (in the order the kernel lists them),
/// then every mlx5 function bound to vfio-pci.
fn discover() -> Vec<(Option<String>, String)> {
    let mut out: Vec<(Option<String>, String)> = Vec::new();
    if let Ok(addrs) = nix::ifaddrs::getifaddrs() {
        for ifa in addrs {
            let has_ip = ifa
                .address
                .is_some_and(|a| a.as_sockaddr_in().is_some() || a.as_sockaddr_in6().is_some());
            let up = ifa.flags.contains(nix::net::if_::InterfaceFlags::IFF_UP);
            let spec = format!("rxe:{}", ifa.interface_name);
            if has_ip && up && !out.iter().any(|(_, s)| *s == spec) {
                out.push((None, spec));
            }
        }
    }
    let vfio = format!("{}/bus/pci/drivers/vfio-pci", sysfs_root());
    if let Ok(dir) = std::fs::read_dir(vfio) {
        let mut bdfs: Vec<String> = dir
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.matches(':').count() == 2)
            .filter(|n| {
                std::fs::read_to_string(format!("{}/bus/pci/devices/{n}/vendor", sysfs_root()))
                    .is_ok_and(|v| v.trim() == "0x15b3")
            })
            .collect();
        bdfs.sort();
        out.extend(bdfs.into_iter().map(|b| (None, format!("mlx5:{b}"))));
    }
    out
}

/// Letters, digits and `_` of `s`, the rest as `_`.
fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// The name a spec gets when `RNIC_DEVICES` gives none.
pub fn default_name(spec: &DeviceSpec) -> String {
    match spec {
        DeviceSpec::Rxe(RxeTarget::Netdev(n)) => format!("rnic_{n}"),
        DeviceSpec::Rxe(RxeTarget::Ip(ip)) => format!("rnic_{}", sanitize(&ip.to_string())),
        DeviceSpec::Mlx5 {
            target: Mlx5Target::VfioUser(p),
            ..
        } => format!(
            "rnic_mlx5_{}",
            sanitize(
                &p.file_stem()
                    .map_or_else(String::new, |s| s.to_string_lossy().into_owned())
            )
        ),
        DeviceSpec::Mlx5 {
            target: Mlx5Target::Pci(bdf),
            ..
        } => format!("rnic_mlx5_{}", sanitize(&bdf.to_string())),
        _ => "rnic_unknown".to_owned(),
    }
}

/// A device's description: its name, backend and GID table.
fn describe(name: Option<String>, spec: &str, index: usize) -> Result<DeviceInfo, String> {
    let parsed: DeviceSpec = spec.parse().map_err(|e| format!("{e}"))?;
    let name = name.unwrap_or_else(|| default_name(&parsed));
    if name.len() >= crate::abi::IBV_SYSFS_NAME_MAX {
        return Err(format!(
            "the name {name:?} is longer than 63 bytes: name it (name=spec)"
        ));
    }
    let (backend, gids): (Backend, Vec<GidEntry>) = match &parsed {
        DeviceSpec::Rxe(t) => {
            let target = match t {
                RxeTarget::Netdev(n) => Target::Netdev(n.clone()),
                RxeTarget::Ip(ip) => Target::Ip(*ip),
            };
            let addrs = rnic::rxe::resolve_gids(&target).map_err(|e| e.to_string())?;
            let gids = addrs
                .into_iter()
                .enumerate()
                .map(|(i, a)| GidEntry {
                    index: i as u32,
                    gid: a.gid,
                    gid_type: GidType::RoceV2,
                    netdev: a.netdev,
                })
                .collect();
            (Backend::Rxe(target), gids)
        }
        DeviceSpec::Mlx5 { addr, .. } => {
            let gids = addr
                .map(|ip: IpAddr| GidEntry {
                    index: 0,
                    gid: Gid::from_ip(ip),
                    gid_type: GidType::RoceV2,
                    netdev: None,
                })
                .into_iter()
                .collect();
            (Backend::Mlx5, gids)
        }
        _ => return Err("this build does not know the backend".to_owned()),
    };
    Ok(DeviceInfo {
        guid: guid_of(&gids),
        name,
        spec: spec.to_owned(),
        backend,
        gids,
        index,
    })
}

/// The node GUID rnic-rxe reports: the interface-ID half of GID 0.
pub fn guid_of(gids: &[GidEntry]) -> u64 {
    gids.first().map_or(0, |g| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&g.gid.raw()[8..16]);
        u64::from_be_bytes(b)
    })
}

/// `ibv_get_device_list`: a NULL-terminated array (from `malloc`, freed by
/// `ibv_free_device_list`) of every listed device.
///
/// # Safety
///
/// `num`, when not NULL, points to writable memory for one `int`.
pub unsafe extern "C" fn ibv_get_device_list(num: *mut c_int) -> *mut *mut ibv_device {
    let list = devices();
    // SAFETY: calloc of (n + 1) pointers; the result is checked for NULL.
    let arr = unsafe { libc::calloc(list.len() + 1, size_of::<*mut ibv_device>()) }
        .cast::<*mut ibv_device>();
    if arr.is_null() {
        return fail_null(libc::ENOMEM);
    }
    for (i, d) in list.iter().enumerate() {
        // SAFETY: `arr` has `list.len() + 1` slots.
        unsafe { arr.wrapping_add(i).write(d.as_ptr()) };
    }
    if !num.is_null() {
        // SAFETY: the caller's pointer (checked non-NULL).
        unsafe { num.write(c_int::try_from(list.len()).unwrap_or(c_int::MAX)) };
    }
    arr
}

/// `ibv_free_device_list`.
///
/// # Safety
///
/// `list` is NULL or came from [`ibv_get_device_list`].
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    // SAFETY: the array was allocated with calloc (the devices themselves
    // live for the whole process).
    unsafe { libc::free(list.cast::<c_void>()) };
}

/// `ibv_get_device_name`.
///
/// # Safety
///
/// `dev` is a device of this library.
pub unsafe extern "C" fn ibv_get_device_name(dev: *mut ibv_device) -> *const c_char {
    match Device::from_ptr(dev) {
        // SAFETY: a listed device lives for the whole process.
        Some(d) => unsafe { (*d.as_ptr()).name.as_ptr() },
        None => fail_null(libc::ENODEV),
    }
}

/// `ibv_get_device_guid`: the node GUID, big-endian.
///
/// # Safety
///
/// `dev` is a device of this library.
pub unsafe extern "C" fn ibv_get_device_guid(dev: *mut ibv_device) -> u64 {
    Device::from_ptr(dev).map_or(0, |d| d.info.guid.to_be())
}

/// `ibv_get_device_index`: the position in the list.
///
/// # Safety
///
/// `dev` is a device of this library.
pub unsafe extern "C" fn ibv_get_device_index(dev: *mut ibv_device) -> c_int {
    Device::from_ptr(dev).map_or(-1, |d| c_int::try_from(d.info.index).unwrap_or(-1))
}

/// `ibv_get_sysfs_path`: `/sys`, or `$SYSFS_PATH`.
pub extern "C" fn ibv_get_sysfs_path() -> *const c_char {
    static PATH: OnceLock<CString> = OnceLock::new();
    PATH.get_or_init(|| CString::new(sysfs_root()).unwrap_or_default())
        .as_ptr()
}

/// The contents of the file `rel` of device `d`'s sysfs directory, as the
/// kernel would show them (without the trailing newline).
pub fn virtual_file(d: &DeviceInfo, rel: &str) -> Option<String> {
    let guid = |g: u64| {
        format!(
            "{:04x}:{:04x}:{:04x}:{:04x}",
            g >> 48,
            (g >> 32) & 0xffff,
            (g >> 16) & 0xffff,
            g & 0xffff
        )
    };
    let rxe = matches!(d.backend, Backend::Rxe(_));
    let gid_at = |idx: &str| idx.parse::<usize>().ok().and_then(|i| d.gids.get(i));
    match rel.trim_matches('/') {
        "board_id" => Some(if rxe { "RNIC_RXE" } else { "RNIC_MLX5" }.to_owned()),
        "node_guid" | "sys_image_guid" => Some(guid(d.guid)),
        "fw_ver" => Some(env!("CARGO_PKG_VERSION").to_owned()),
        "hw_rev" => Some("0".to_owned()),
        "hca_type" => Some(if rxe { "rnic-rxe" } else { "rnic-mlx5" }.to_owned()),
        "node_type" => Some("1: CA".to_owned()),
        "node_desc" => Some(format!("rnic {}", d.spec)),
        "ports/1/state" => Some("4: ACTIVE".to_owned()),
        "ports/1/phys_state" => Some("5: LinkUp".to_owned()),
        "ports/1/link_layer" => Some("Ethernet".to_owned()),
        "ports/1/lid" | "ports/1/sm_lid" => Some("0x0".to_owned()),
        "ports/1/pkeys/0" => Some("0xffff".to_owned()),
        other => {
            if let Some(i) = other.strip_prefix("ports/1/gids/") {
                let g = gid_at(i)?;
                let h = g.gid.to_hex();
                Some(
                    (0..8)
                        .map(|k| &h[k * 4..k * 4 + 4])
                        .collect::<Vec<_>>()
                        .join(":"),
                )
            } else if let Some(i) = other.strip_prefix("ports/1/gid_attrs/types/") {
                gid_at(i).map(|_| "RoCE v2".to_owned())
            } else if let Some(i) = other.strip_prefix("ports/1/gid_attrs/ndevs/") {
                gid_at(i).and_then(|g| g.netdev.clone())
            } else {
                None
            }
        }
    }
}

/// `ibv_read_sysfs_file(dir, file, buf, size)`: the bytes read (without a
/// trailing newline, NUL-terminated), or -1 with errno.
///
/// # Safety
///
/// `dir` and `file` are C strings; `buf` has room for `size` bytes.
pub unsafe extern "C" fn ibv_read_sysfs_file(
    dir: *const c_char,
    file: *const c_char,
    buf: *mut c_char,
    size: usize,
) -> c_int {
    if dir.is_null() || file.is_null() || buf.is_null() || size == 0 {
        return fail_neg(libc::EINVAL);
    }
    // SAFETY: the caller's C string (checked non-NULL).
    let dir = unsafe { CStr::from_ptr(dir) };
    // SAFETY: likewise.
    let file = unsafe { CStr::from_ptr(file) };
    let (dir, file) = (dir.to_string_lossy(), file.to_string_lossy());
    let ours = devices().iter().find_map(|d| {
        let base = ibdev_path(&d.info.name);
        dir.trim_end_matches('/')
            .strip_prefix(base.as_str())
            .map(|sub| (d, format!("{}/{file}", sub.trim_start_matches('/'))))
    });
    let text = match ours {
        Some((d, rel)) => match virtual_file(&d.info, &rel) {
            Some(t) => t.into_bytes(),
            None => return fail_neg(libc::ENOENT),
        },
        None => match std::fs::read(format!("{dir}/{file}")) {
            Ok(mut b) => {
                if b.last() == Some(&b'\n') {
                    b.pop();
                }
                b
            }
            Err(e) => return fail_neg(e.raw_os_error().unwrap_or(libc::EIO)),
        },
    };
    let n = text.len().min(size - 1);
    // SAFETY: `buf` has `size` bytes; `n < size`.
    unsafe { std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), n) };
    // SAFETY: byte `n < size` of `buf`.
    unsafe { buf.wrapping_add(n).write(0) };
    c_int::try_from(n).unwrap_or(c_int::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_syntax_takes_optional_names() {
        assert_eq!(
            parse_list(" rxe:lo, b=rxe:127.0.0.2 ,mlx5:vfio-user:/run/a=b.sock@10.0.0.1,,"),
            vec![
                (None, "rxe:lo".to_owned()),
                (Some("b".to_owned()), "rxe:127.0.0.2".to_owned()),
                (None, "mlx5:vfio-user:/run/a=b.sock@10.0.0.1".to_owned()),
            ]
        );
    }

    #[test]
    fn default_names_follow_the_spec() {
        let name = |s: &str| default_name(&s.parse().expect("spec"));
        assert_eq!(name("rxe:lo"), "rnic_lo");
        assert_eq!(name("rxe:eth0"), "rnic_eth0");
        assert_eq!(name("rxe:127.0.0.2"), "rnic_127_0_0_2");
        assert_eq!(
            name("mlx5:vfio-user:/run/rnic/emu/emu0.sock@10.0.0.1"),
            "rnic_mlx5_emu0"
        );
        assert_eq!(name("mlx5:0000:3b:00.1"), "rnic_mlx5_0000_3b_00_1");
    }

    #[test]
    fn loopback_is_described_with_its_gids() {
        let d = describe(None, "rxe:lo", 0).expect("lo has addresses");
        assert_eq!(d.name, "rnic_lo");
        let v4 = Gid::from_ip("127.0.0.1".parse().expect("ip"));
        assert!(d.gids.iter().any(|g| g.gid == v4), "{:?}", d.gids);
        assert_eq!(d.guid, guid_of(&d.gids));
        assert_eq!(virtual_file(&d, "board_id").as_deref(), Some("RNIC_RXE"));
        let i = d.gids.iter().position(|g| g.gid == v4).expect("present");
        assert_eq!(
            virtual_file(&d, &format!("ports/1/gids/{i}")).as_deref(),
            Some("0000:0000:0000:0000:0000:ffff:7f00:0001")
        );
        assert_eq!(
            virtual_file(&d, &format!("ports/1/gid_attrs/types/{i}")).as_deref(),
            Some("RoCE v2")
        );
        assert_eq!(virtual_file(&d, "ports/1/gids/99"), None);
        assert_eq!(virtual_file(&d, "no_such_file"), None);
    }

    #[test]
    fn a_bad_spec_says_why() {
        let e = describe(None, "nope:1", 0).expect_err("unknown backend");
        assert!(e.contains("unknown backend"), "{e}");
        let e = describe(None, "rxe:nosuchif0", 0).expect_err("no such interface");
        assert!(e.contains("nosuchif0"), "{e}");
    }
}
