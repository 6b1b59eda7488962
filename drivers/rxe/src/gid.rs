//! The GID table from interface addresses, the port MTU, and rxe's UDP
//! source-port choice (rocev2.md §11, §13).

use std::net::{IpAddr, Ipv6Addr};

use nix::ifaddrs::getifaddrs;
use rnic_core::{Gid, Mtu, Qpn};

use crate::error::RxeError;

/// Where an rxe device lives: a netdev (all its addresses) or one address.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// Every address of this interface.
    Netdev(String),
    /// This one local address.
    Ip(IpAddr),
}

/// One usable local address: its GID and how to bind to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalAddr {
    /// The GID (`::ffff:a.b.c.d` for IPv4).
    pub gid: Gid,
    /// The address.
    pub ip: IpAddr,
    /// IPv6 scope (interface index) for link-local addresses, else 0.
    pub scope_id: u32,
    /// The interface carrying it, when known.
    pub netdev: Option<String>,
    /// That interface's MTU, when known.
    pub netdev_mtu: Option<u32>,
}

/// An IPv6 link-local address (fe80::/10): reachable only with a scope.
pub fn is_link_local(ip: &Ipv6Addr) -> bool {
    (ip.segments()[0] & 0xffc0) == 0xfe80
}

/// Every (interface, address) pair on the host.
fn host_addrs() -> Result<Vec<(String, IpAddr)>, RxeError> {
    let mut out = Vec::new();
    for ifa in getifaddrs().map_err(RxeError::Interfaces)? {
        let Some(addr) = ifa.address else { continue };
        if let Some(v4) = addr.as_sockaddr_in() {
            out.push((ifa.interface_name.clone(), IpAddr::V4(v4.ip())));
        } else if let Some(v6) = addr.as_sockaddr_in6() {
            out.push((ifa.interface_name.clone(), IpAddr::V6(v6.ip())));
        }
    }
    Ok(out)
}

/// `IFA_F_DADFAILED` (linux/if_addr.h): duplicate address detection failed.
const IFA_F_DADFAILED: u8 = 0x08;
/// `IFA_F_OPTIMISTIC`: optimistic DAD, usable while tentative.
const IFA_F_OPTIMISTIC: u8 = 0x04;
/// `IFA_F_TENTATIVE`: duplicate address detection still runs.
const IFA_F_TENTATIVE: u8 = 0x40;

/// The (interface, IPv6 address) pairs of `if_inet6` text (the format of
/// `/proc/net/if_inet6`: address, ifindex, prefix length, scope, flags, name,
/// the numbers in hex) that no socket can bind: tentative (and not
/// optimistic) or DAD failed. The kernel's rxe leaves such addresses out of
/// its GID table the same way: it adds an IPv6 GID only once DAD succeeded.
fn unbindable_v6(if_inet6: &str) -> Vec<(String, Ipv6Addr)> {
    if_inet6
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let [addr, _ifindex, _plen, _scope, flags, name] = f.as_slice() else {
                return None;
            };
            let flags = u8::from_str_radix(flags, 16).ok()?;
            let tentative = flags & IFA_F_TENTATIVE != 0 && flags & IFA_F_OPTIMISTIC == 0;
            if !tentative && flags & IFA_F_DADFAILED == 0 {
                return None;
            }
            let ip = Ipv6Addr::from(u128::from_str_radix(addr, 16).ok()?);
            Some(((*name).to_owned(), ip))
        })
        .collect()
}

/// [`unbindable_v6`] of the calling thread's network namespace (empty when
/// procfs is not readable: binding then reports the problem).
fn host_unbindable_v6() -> Vec<(String, Ipv6Addr)> {
    // thread-self: a thread that entered another namespace (setns) sees that
    // namespace's addresses, as getifaddrs does.
    std::fs::read_to_string("/proc/thread-self/net/if_inet6")
        .or_else(|_| std::fs::read_to_string("/proc/self/net/if_inet6"))
        .map(|t| unbindable_v6(&t))
        .unwrap_or_default()
}

fn interface_names() -> String {
    let mut names: Vec<String> = nix::net::if_::if_nameindex()
        .map(|l| {
            l.iter()
                .map(|i| i.name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names.dedup();
    names.join(", ")
}

/// The MTU of `netdev` from sysfs (`None` when unreadable).
pub fn netdev_mtu(netdev: &str) -> Option<u32> {
    std::fs::read_to_string(format!("/sys/class/net/{netdev}/mtu"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
}

fn scope_of(netdev: &str, ip: &IpAddr) -> u32 {
    match ip {
        IpAddr::V6(v6) if is_link_local(v6) => nix::net::if_::if_nametoindex(netdev).unwrap_or(0),
        _ => 0,
    }
}

/// The GID table of `target`, in rxe's order: the IPv6 link-local address
/// first (rxe's default GID at index 0), then IPv4 addresses, then the other
/// IPv6 addresses.
pub fn resolve(target: &Target) -> Result<Vec<LocalAddr>, RxeError> {
    let all = host_addrs()?;
    match target {
        Target::Ip(ip) => {
            let netdev = all.iter().find(|(_, a)| a == ip).map(|(n, _)| n.clone());
            // All of 127/8 is local on Linux even though only 127.0.0.1 is listed.
            let loopback = matches!(ip, IpAddr::V4(v4) if v4.is_loopback());
            let netdev = match (netdev, loopback) {
                (Some(n), _) => Some(n),
                (None, true) => Some("lo".to_owned()),
                (None, false) => {
                    let available: Vec<String> = all.iter().map(|(_, a)| a.to_string()).collect();
                    return Err(RxeError::AddressNotLocal {
                        ip: *ip,
                        available: available.join(", "),
                    });
                }
            };
            if let (IpAddr::V6(v6), Some(n)) = (ip, &netdev)
                && host_unbindable_v6().contains(&(n.clone(), *v6))
            {
                return Err(RxeError::AddressTentative {
                    ip: *v6,
                    netdev: n.clone(),
                });
            }
            let scope_id = netdev.as_deref().map_or(0, |n| scope_of(n, ip));
            let netdev_mtu = netdev.as_deref().and_then(netdev_mtu);
            Ok(vec![LocalAddr {
                gid: Gid::from_ip(*ip),
                ip: *ip,
                scope_id,
                netdev,
                netdev_mtu,
            }])
        }
        Target::Netdev(name) => {
            let mine: Vec<IpAddr> = all
                .iter()
                .filter(|(n, _)| n == name)
                .map(|(_, a)| *a)
                .collect();
            if mine.is_empty() {
                if nix::net::if_::if_nametoindex(name.as_str()).is_err() {
                    return Err(RxeError::InterfaceNotFound {
                        name: name.clone(),
                        available: interface_names(),
                    });
                }
                return Err(RxeError::NoAddress { name: name.clone() });
            }
            // Tentative IPv6 addresses cannot be bound (yet): leave them out
            // rather than fail the whole device.
            let unbindable = host_unbindable_v6();
            let skipped = |ip: &IpAddr| match ip {
                IpAddr::V6(v6) => unbindable.contains(&(name.clone(), *v6)),
                IpAddr::V4(_) => false,
            };
            let (left_out, mine): (Vec<IpAddr>, Vec<IpAddr>) = mine.into_iter().partition(skipped);
            for ip in &left_out {
                tracing::warn!(netdev = %name, %ip, "IPv6 address is tentative or failed DAD: not in the GID table");
            }
            if let (true, Some(IpAddr::V6(first))) = (mine.is_empty(), left_out.first()) {
                return Err(RxeError::AddressTentative {
                    ip: *first,
                    netdev: name.clone(),
                });
            }
            let rank = |ip: &IpAddr| match ip {
                IpAddr::V6(v6) if is_link_local(v6) => 0,
                IpAddr::V4(_) => 1,
                IpAddr::V6(_) => 2,
            };
            let mut sorted = mine;
            sorted.sort_by_key(rank);
            let mtu = netdev_mtu(name);
            Ok(sorted
                .into_iter()
                .map(|ip| LocalAddr {
                    gid: Gid::from_ip(ip),
                    ip,
                    scope_id: scope_of(name, &ip),
                    netdev: Some(name.clone()),
                    netdev_mtu: mtu,
                })
                .collect())
        }
    }
}

/// The active path MTU rxe derives from a netdev MTU (netdev MTU − 80,
/// rounded down to an IB MTU, at most 4096).
pub fn active_mtu(netdev_mtu: Option<u32>) -> Mtu {
    netdev_mtu.map_or(Mtu::Mtu1024, Mtu::from_ethernet_mtu)
}

/// The UDP source port of an RC connection: `rdma_get_udp_sport(0, lqpn,
/// rqpn)`, symmetric in the two QPNs so both ends use the same port.
pub fn rc_udp_sport(lqpn: Qpn, rqpn: Qpn) -> u16 {
    let mut v = u64::from(lqpn.get()) * u64::from(rqpn.get());
    v ^= v >> 20;
    v ^= v >> 40;
    let fl = (v & 0xF_FFFF) as u32;
    let low = fl & 0x3FFF;
    let high = fl & 0xF_C000;
    ((low ^ (high >> 14)) | 0xC000) as u16
}

/// The UDP source port rxe gives a QP at creation: `0xC000 +
/// (hash_32(qpn, 14) & 0x3FFF)` (used for UD, whose peers vary).
pub fn qp_udp_sport(qpn: Qpn) -> u16 {
    let h = qpn.get().wrapping_mul(0x61C8_8647) >> (32 - 14);
    (0xC000 + (h & 0x3FFF)) as u16
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn sport_is_symmetric_and_in_range() {
        for (a, b) in [(0x11, 0x12), (0xabcdef, 0x123), (1, 0xffffff)] {
            let (a, b) = (Qpn::from_wire(a), Qpn::from_wire(b));
            let p = rc_udp_sport(a, b);
            assert_eq!(p, rc_udp_sport(b, a));
            assert!(p >= 0xC000);
            assert!(qp_udp_sport(a) >= 0xC000);
        }
        // v = 0x11 * 0x12 = 0x132: fl = 0x132, low 0x132, high 0 → 0xC132.
        assert_eq!(
            rc_udp_sport(Qpn::from_wire(0x11), Qpn::from_wire(0x12)),
            0xC132
        );
    }

    #[test]
    fn loopback_target_resolves() {
        let t = Target::Ip(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 7)));
        let a = resolve(&t).unwrap();
        assert_eq!(a.len(), 1);
        assert_eq!(a[0].gid, Gid::from_ipv4(Ipv4Addr::new(127, 0, 0, 7)));
        assert_eq!(a[0].netdev.as_deref(), Some("lo"));
        let lo = resolve(&Target::Netdev("lo".into())).unwrap();
        assert!(lo.iter().any(|l| l.ip == IpAddr::V4(Ipv4Addr::LOCALHOST)));
    }

    #[test]
    fn tentative_and_dad_failed_addresses_are_unbindable() {
        // /proc/net/if_inet6 right after `ip addr add` (0xc0: permanent +
        // tentative), after DAD (0x80), optimistic (0xc4), DAD failed (0xc8).
        let text = "\
fd000099000000000000000000000001 03 40 00 c0       d0
fe800000000000007ccbfdfffee5a34f 03 40 20 80       d0
fd000099000000000000000000000002 04 40 00 c4       d1
fd000099000000000000000000000003 04 40 00 c8       d1
00000000000000000000000000000001 01 80 10 80       lo
garbage line
";
        let got = unbindable_v6(text);
        assert_eq!(
            got,
            vec![
                ("d0".to_owned(), "fd00:99::1".parse().unwrap()),
                ("d1".to_owned(), "fd00:99::3".parse().unwrap()),
            ]
        );
        // This host's list parses (whatever it holds).
        let _ = host_unbindable_v6();
    }

    #[test]
    fn errors_say_what_exists() {
        let e = resolve(&Target::Netdev("nosuchif0".into())).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("not found") && msg.contains("lo"), "{msg}");
        let e = resolve(&Target::Ip("192.0.2.77".parse().unwrap())).unwrap_err();
        assert!(e.to_string().contains("127.0.0.1"), "{e}");
        assert!(e.to_string().contains("/32"), "{e}");
        let e = resolve(&Target::Ip("2001:db8::77".parse().unwrap())).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("ip -6 addr add 2001:db8::77/128 dev <netdev> nodad"),
            "{msg}"
        );
    }
}
