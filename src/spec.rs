//! Device specs: the one string a user gives to pick a backend and a device.
//!
//! | spec | backend | device |
//! |---|---|---|
//! | `rxe:<netdev>` (`rxe:eth0`) | Soft-RoCE-compatible, UDP/4791 | the interface's addresses become the GID table |
//! | `rxe:<ip>` (`rxe:10.0.0.1`, `rxe:fe80::1`) | same | bind to that address only |
//! | `rxe` | same | the default: loopback, `127.0.0.1` |
//! | `mlx5:<pci bdf>` (`mlx5:0000:3b:00.1`) | ConnectX through VFIO | that PCI function, bound to vfio-pci |
//! | `mlx5:vfio-user:<socket>` (`mlx5:vfio-user:/run/rnic/emu0.sock`) | ConnectX over vfio-user | the device process serving that socket (rnic-mlx5-emu) |
//! | `mlx5:…@<ip>` (`mlx5:vfio-user:/tmp/emu.sock@10.0.0.1`, `mlx5:0000:3b:00.1@fd00::1`) | same | and program GID 0 with that RoCE v2 address at open |
//!
//! An mlx5 function has no kernel netdev whose addresses could fill its GID
//! table: the driver programs it (SET_ROCE_ADDRESS). Without `@<ip>` the
//! table stays empty (`Mlx5Provider::set_gid` fills it later); with it,
//! `rnic::open` programs entry 0. The suffix is the text after the last `@`,
//! taken only when it parses as an IP address.
//!
//! Options follow a `?`, separated by `&` (`mlx5:vfio-user:/tmp/a.sock@10.0.0.1?neigh=static&nbr=10.0.0.2/02:00:00:00:00:02`):
//!
//! | option | meaning |
//! |---|---|
//! | `neigh=arp` / `neigh=host` / `neigh=static` | where peers' MACs come from besides static entries: the port's own ARP / IPv6 neighbour discovery on raw Ethernet queues (`arp`: the function also answers for its GIDs), the host kernel's neighbour table (`host`), or nowhere (`static`); default: `arp` on kernel VFIO (a real port), `host` over vfio-user (the emulated function's default wire is the host's stack; an emulator on an Ethernet link, `--wire`, wants `arp`) |
//! | `vlan=<id>` / `vlan=<id>.<priority>` | the port's RoCE and ARP/ND traffic on this 802.1Q VLAN (id 1..=4094, priority 0..=7, default 0) |
//! | `mtu=<bytes>` | the port's Ethernet MTU (set on the vport; QPs' path MTU capped to it) |
//! | `nbr=<ip>/<mac>` | a static neighbour (repeatable) |
//! | `wc=off` | never use a write-combining mapping: 8-byte doorbells only |

use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::str::FromStr;

use rnic_core::PciAddr;
use thiserror::Error;

/// Where the rxe backend sends and receives.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum RxeTarget {
    /// A network interface by name; all its addresses are GIDs.
    Netdev(String),
    /// One local IP address.
    Ip(IpAddr),
}

/// How the mlx5 backend reaches its PCI function.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Mlx5Target {
    /// A function bound to vfio-pci, by PCI address (kernel VFIO).
    Pci(PciAddr),
    /// A vfio-user server's UNIX socket (an emulated function).
    VfioUser(PathBuf),
}

/// Where an mlx5 function's peers' MACs come from (`neigh=`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NeighbourMode {
    /// The port's own ARP / neighbour discovery (`neigh=arp`).
    Arp,
    /// The host kernel's neighbour table (`neigh=host`).
    Host,
    /// Static entries only (`neigh=static`).
    Static,
}

impl NeighbourMode {
    fn name(self) -> &'static str {
        match self {
            NeighbourMode::Arp => "arp",
            NeighbourMode::Host => "host",
            NeighbourMode::Static => "static",
        }
    }
}

/// The `?` options of an mlx5 spec (module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Mlx5SpecOptions {
    /// `neigh=`; `None`: the transport's default (`arp` on kernel VFIO,
    /// `host` over vfio-user).
    pub neigh: Option<NeighbourMode>,
    /// `vlan=<id>[.<priority>]`.
    pub vlan: Option<(u16, u8)>,
    /// `mtu=<bytes>`.
    pub mtu: Option<u32>,
    /// `nbr=<ip>/<mac>` entries.
    pub neighbours: Vec<(IpAddr, [u8; 6])>,
    /// `wc=off`.
    pub no_write_combining: bool,
}

impl Mlx5SpecOptions {
    fn parse(spec: &str, text: &str) -> Result<Mlx5SpecOptions, SpecError> {
        let mut o = Mlx5SpecOptions::default();
        let bad = |option: &str, reason: &'static str| SpecError::BadOption {
            spec: spec.to_owned(),
            option: option.to_owned(),
            reason,
        };
        for opt in text.split('&').filter(|o| !o.is_empty()) {
            match opt.split_once('=') {
                Some(("neigh", "arp")) => o.neigh = Some(NeighbourMode::Arp),
                Some(("neigh", "host")) => o.neigh = Some(NeighbourMode::Host),
                Some(("neigh", "static")) => o.neigh = Some(NeighbourMode::Static),
                Some(("neigh", _)) => return Err(bad(opt, "neigh is arp, host or static")),
                Some(("vlan", v)) => {
                    let (id, prio) = v.split_once('.').unwrap_or((v, "0"));
                    let id: u16 = id
                        .parse()
                        .ok()
                        .filter(|i| (1..=4094).contains(i))
                        .ok_or_else(|| bad(opt, "vlan's id is 1..=4094"))?;
                    let prio: u8 = prio
                        .parse()
                        .ok()
                        .filter(|p| *p <= 7)
                        .ok_or_else(|| bad(opt, "vlan's priority (after '.') is 0..=7"))?;
                    o.vlan = Some((id, prio));
                }
                Some(("mtu", v)) => {
                    o.mtu = Some(
                        v.parse()
                            .ok()
                            .filter(|m| (576..=9978).contains(m))
                            .ok_or_else(|| bad(opt, "mtu is 576..=9978 bytes"))?,
                    );
                }
                Some(("nbr", v)) => {
                    let (ip, mac) = v
                        .split_once('/')
                        .ok_or_else(|| bad(opt, "nbr is <ip>/<mac>"))?;
                    let ip = ip
                        .parse()
                        .map_err(|_| bad(opt, "nbr's address is not an IP address"))?;
                    let mac = parse_mac(mac)
                        .ok_or_else(|| bad(opt, "nbr's MAC is six hex bytes separated by ':'"))?;
                    o.neighbours.push((ip, mac));
                }
                Some(("wc", "off")) => o.no_write_combining = true,
                Some(("wc", "on")) => o.no_write_combining = false,
                Some(("wc", _)) => return Err(bad(opt, "wc is on or off")),
                _ => {
                    return Err(bad(
                        opt,
                        "unknown option: use neigh=arp|host|static, nbr=<ip>/<mac>, vlan=<id>[.<prio>], mtu=<bytes>, wc=on|off",
                    ));
                }
            }
        }
        Ok(o)
    }

    fn is_empty(&self) -> bool {
        *self == Mlx5SpecOptions::default()
    }
}

impl fmt::Display for Mlx5SpecOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(n) = self.neigh {
            parts.push(format!("neigh={}", n.name()));
        }
        for (ip, m) in &self.neighbours {
            parts.push(format!(
                "nbr={ip}/{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
                m[0], m[1], m[2], m[3], m[4], m[5]
            ));
        }
        if let Some((id, prio)) = self.vlan {
            parts.push(format!("vlan={id}.{prio}"));
        }
        if let Some(m) = self.mtu {
            parts.push(format!("mtu={m}"));
        }
        if self.no_write_combining {
            parts.push("wc=off".into());
        }
        f.write_str(&parts.join("&"))
    }
}

/// `aa:bb:cc:dd:ee:ff` (hex, either case).
fn parse_mac(text: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = text.split(':');
    for b in &mut mac {
        let p = parts.next()?;
        if p.len() != 2 {
            return None;
        }
        *b = u8::from_str_radix(p, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

/// A parsed device spec.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DeviceSpec {
    /// The Soft-RoCE-compatible software backend.
    Rxe(RxeTarget),
    /// A ConnectX function owned through VFIO or vfio-user.
    Mlx5 {
        /// The function.
        target: Mlx5Target,
        /// The RoCE v2 address GID 0 gets at open (`@<ip>`), if any.
        addr: Option<IpAddr>,
        /// The `?` options.
        options: Mlx5SpecOptions,
    },
}

impl Default for DeviceSpec {
    /// The embedded default: the rxe backend on loopback.
    fn default() -> DeviceSpec {
        DeviceSpec::Rxe(RxeTarget::Ip(IpAddr::V4(Ipv4Addr::LOCALHOST)))
    }
}

/// A spec string that names no device.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum SpecError {
    /// The part before ':' is not a known backend.
    #[error(
        "unknown backend {backend:?} in device spec {spec:?}: use rxe:<netdev|ip>, mlx5:<pci address> or mlx5:vfio-user:<socket>"
    )]
    UnknownBackend {
        /// The whole spec.
        spec: String,
        /// The backend part.
        backend: String,
    },
    /// `rxe:` with an empty or invalid interface name.
    #[error(
        "{spec:?}: {reason} (use rxe:<netdev> such as rxe:eth0, or rxe:<ip> such as rxe:10.0.0.1)"
    )]
    BadRxeTarget {
        /// The whole spec.
        spec: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// An mlx5 `?` option that is not one.
    #[error("device spec {spec:?}: option {option:?}: {reason}")]
    BadOption {
        /// The whole spec.
        spec: String,
        /// The option.
        option: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// `mlx5:vfio-user:` without a socket path.
    #[error(
        "device spec {spec:?}: vfio-user needs the server's socket path \
         (mlx5:vfio-user:/run/rnic/emu0.sock)"
    )]
    NoSocket {
        /// The whole spec.
        spec: String,
    },
    /// `mlx5:` without a valid PCI address.
    #[error("device spec {spec:?}: {source}")]
    BadPciAddr {
        /// The whole spec.
        spec: String,
        /// The address error.
        source: rnic_core::PciAddrError,
    },
}

impl FromStr for DeviceSpec {
    type Err = SpecError;

    fn from_str(spec: &str) -> Result<DeviceSpec, SpecError> {
        let (backend, rest) = spec.split_once(':').unwrap_or((spec, ""));
        match backend {
            "rxe" if rest.is_empty() => Ok(DeviceSpec::default()),
            "rxe" => {
                if let Ok(ip) = rest.parse::<IpAddr>() {
                    return Ok(DeviceSpec::Rxe(RxeTarget::Ip(ip)));
                }
                // Linux interface names: 1..=15 bytes, no '/', no whitespace, no ':'.
                let bad = |reason| SpecError::BadRxeTarget {
                    spec: spec.to_owned(),
                    reason,
                };
                if rest.len() > 15 {
                    return Err(bad("interface names are at most 15 characters"));
                }
                if rest
                    .chars()
                    .any(|c| c == '/' || c == ':' || c.is_whitespace())
                {
                    return Err(bad("not an IP address, and not a valid interface name"));
                }
                Ok(DeviceSpec::Rxe(RxeTarget::Netdev(rest.to_owned())))
            }
            "mlx5" => {
                let (rest, options) = match rest.rsplit_once('?') {
                    Some((head, opts)) => (head, Mlx5SpecOptions::parse(spec, opts)?),
                    None => (rest, Mlx5SpecOptions::default()),
                };
                let (rest, addr) = match rest.rsplit_once('@') {
                    Some((head, ip)) => match ip.parse::<IpAddr>() {
                        Ok(ip) => (head, Some(ip)),
                        Err(_) => (rest, None),
                    },
                    None => (rest, None),
                };
                if let Some(path) = rest.strip_prefix("vfio-user:") {
                    if path.is_empty() {
                        return Err(SpecError::NoSocket {
                            spec: spec.to_owned(),
                        });
                    }
                    return Ok(DeviceSpec::Mlx5 {
                        target: Mlx5Target::VfioUser(PathBuf::from(path)),
                        addr,
                        options,
                    });
                }
                rest.parse::<PciAddr>()
                    .map(|a| DeviceSpec::Mlx5 {
                        target: Mlx5Target::Pci(a),
                        addr,
                        options,
                    })
                    .map_err(|source| SpecError::BadPciAddr {
                        spec: spec.to_owned(),
                        source,
                    })
            }
            _ => Err(SpecError::UnknownBackend {
                spec: spec.to_owned(),
                backend: backend.to_owned(),
            }),
        }
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSpec::Rxe(RxeTarget::Netdev(n)) => write!(f, "rxe:{n}"),
            DeviceSpec::Rxe(RxeTarget::Ip(ip)) => write!(f, "rxe:{ip}"),
            DeviceSpec::Mlx5 {
                target,
                addr,
                options,
            } => {
                match target {
                    Mlx5Target::Pci(bdf) => write!(f, "mlx5:{bdf}")?,
                    Mlx5Target::VfioUser(p) => write!(f, "mlx5:vfio-user:{}", p.display())?,
                }
                if let Some(ip) = addr {
                    write!(f, "@{ip}")?;
                }
                if !options.is_empty() {
                    write!(f, "?{options}")?;
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_form() {
        assert_eq!("rxe".parse::<DeviceSpec>(), Ok(DeviceSpec::default()));
        assert_eq!(DeviceSpec::default().to_string(), "rxe:127.0.0.1");
        assert_eq!(
            "rxe:eth0".parse::<DeviceSpec>(),
            Ok(DeviceSpec::Rxe(RxeTarget::Netdev("eth0".into())))
        );
        assert_eq!(
            "rxe:fe80::1".parse::<DeviceSpec>().map(|s| s.to_string()),
            Ok("rxe:fe80::1".to_owned())
        );
        assert_eq!(
            "mlx5:0000:3b:00.1"
                .parse::<DeviceSpec>()
                .map(|s| s.to_string()),
            Ok("mlx5:0000:3b:00.1".to_owned())
        );
        assert_eq!(
            "mlx5:vfio-user:/run/rnic/emu0.sock".parse::<DeviceSpec>(),
            Ok(DeviceSpec::Mlx5 {
                target: Mlx5Target::VfioUser("/run/rnic/emu0.sock".into()),
                addr: None,
                options: Mlx5SpecOptions::default(),
            })
        );
        assert_eq!(
            "mlx5:vfio-user:/tmp/a@b.sock@10.0.0.1".parse::<DeviceSpec>(),
            Ok(DeviceSpec::Mlx5 {
                target: Mlx5Target::VfioUser("/tmp/a@b.sock".into()),
                addr: Some(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1))),
                options: Mlx5SpecOptions::default(),
            })
        );
        assert_eq!(
            "mlx5:vfio-user:/tmp/a@b.sock".parse::<DeviceSpec>(),
            Ok(DeviceSpec::Mlx5 {
                target: Mlx5Target::VfioUser("/tmp/a@b.sock".into()),
                addr: None,
                options: Mlx5SpecOptions::default(),
            })
        );
        assert_eq!(
            "mlx5:0000:3b:00.1@fd00::1"
                .parse::<DeviceSpec>()
                .map(|s| s.to_string()),
            Ok("mlx5:0000:3b:00.1@fd00::1".to_owned())
        );
        assert_eq!(
            "mlx5:vfio-user:rel/emu.sock"
                .parse::<DeviceSpec>()
                .map(|s| s.to_string()),
            Ok("mlx5:vfio-user:rel/emu.sock".to_owned())
        );
    }

    #[test]
    fn mlx5_options_parse_print_and_refuse_with_the_fix() {
        let spec = "mlx5:vfio-user:/tmp/a.sock@10.0.0.1?neigh=static&nbr=10.0.0.2/02:00:0A:00:00:02&wc=off";
        let DeviceSpec::Mlx5 { addr, options, .. } = spec.parse::<DeviceSpec>().expect("parses")
        else {
            panic!("an mlx5 spec");
        };
        assert_eq!(addr, Some(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1))));
        assert_eq!(options.neigh, Some(NeighbourMode::Static));
        assert_eq!(
            options.neighbours,
            vec![("10.0.0.2".parse().expect("parses"), [2, 0, 0x0a, 0, 0, 2])]
        );
        assert!(options.no_write_combining);
        assert_eq!(
            spec.parse::<DeviceSpec>().expect("parses").to_string(),
            "mlx5:vfio-user:/tmp/a.sock@10.0.0.1?neigh=static&nbr=10.0.0.2/02:00:0a:00:00:02&wc=off"
        );
        let spec = "mlx5:0000:3b:00.1@fd00::1?neigh=arp&vlan=42.5&mtu=9000";
        let DeviceSpec::Mlx5 { options, .. } = spec.parse::<DeviceSpec>().expect("parses") else {
            panic!("an mlx5 spec");
        };
        assert_eq!(
            (options.neigh, options.vlan, options.mtu),
            (Some(NeighbourMode::Arp), Some((42, 5)), Some(9000))
        );
        assert_eq!(
            spec.parse::<DeviceSpec>().expect("parses").to_string(),
            spec
        );
        for (bad, says) in [
            ("mlx5:0000:3b:00.1?neigh=rarp", "arp, host or static"),
            ("mlx5:0000:3b:00.1?vlan=4095", "1..=4094"),
            ("mlx5:0000:3b:00.1?vlan=10.8", "0..=7"),
            ("mlx5:0000:3b:00.1?mtu=100", "576..=9978"),
            ("mlx5:0000:3b:00.1?nbr=10.0.0.2", "<ip>/<mac>"),
            ("mlx5:0000:3b:00.1?nbr=10.0.0.2/02:00", "six hex bytes"),
            ("mlx5:0000:3b:00.1?nbr=x/02:00:00:00:00:01", "not an IP"),
            ("mlx5:0000:3b:00.1?color=red", "unknown option"),
        ] {
            let e = bad.parse::<DeviceSpec>().expect_err("refused");
            assert!(e.to_string().contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn bad_specs_name_the_fix() {
        let e = "efa:0".parse::<DeviceSpec>().expect_err("unknown backend");
        assert!(matches!(e, SpecError::UnknownBackend { .. }));
        assert!(e.to_string().contains("rxe:<netdev|ip>"), "{e}");
        assert!(matches!(
            "mlx5:3b:00".parse::<DeviceSpec>(),
            Err(SpecError::BadPciAddr { .. })
        ));
        assert!(matches!(
            "rxe:a-very-long-interface-name".parse::<DeviceSpec>(),
            Err(SpecError::BadRxeTarget { .. })
        ));
        let e = "mlx5:vfio-user:"
            .parse::<DeviceSpec>()
            .expect_err("no socket");
        assert!(matches!(e, SpecError::NoSocket { .. }));
        assert!(e.to_string().contains("mlx5:vfio-user:/"), "{e}");
        assert!(matches!(
            "rxe:eth 0".parse::<DeviceSpec>(),
            Err(SpecError::BadRxeTarget { .. })
        ));
    }
}
