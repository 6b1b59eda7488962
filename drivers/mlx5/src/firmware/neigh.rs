//! Peers' MAC addresses: the destination MAC of a RoCE frame (audit row 7).
//!
//! A RoCEv2 frame leaves the port addressed to the next hop's MAC. The
//! kernel and rdma-core take it from the kernel's neighbour table (RC
//! verbs.c:3557-3570 in `mlx5_create_ah`; K ib/qp.c:3745 programs the
//! `dmac` ib_core resolved). A function owned through VFIO has no netdev,
//! so nothing resolves for it on its own; this driver never falls back to
//! the function's own MAC (which addresses frames to itself) nor to zeros:
//! a peer whose MAC it cannot find is refused with [`Mlx5Error::NoNeighbour`],
//! which names the address and the fixes.
//!
//! Where a MAC comes from, in order ([`Hca::resolve_neighbour`]):
//!
//! 1. the caller (`RtrParams::dmac`, `AddressVector::dmac`);
//! 2. the function's own GIDs (a QP of this function talking to another of
//!    the same function): its own MAC;
//! 3. static entries ([`Hca::add_neighbour`]), for networks without ARP;
//! 4. a link-local IPv6 GID's EUI-64 (the MAC it was derived from);
//! 5. the **host kernel's** neighbour table, when
//!    [`NeighbourOptions::host_kernel`] allows it: the next hop the
//!    kernel's route for the address names, its entry looked up by netlink
//!    and, when missing, resolved by the kernel (a datagram to the discard
//!    port makes it ARP or solicit) within [`NeighbourOptions::timeout`]; an
//!    address the kernel delivers locally (a loopback route) needs no MAC,
//!    and the route's device address (all-zero for `lo`) is used. This is
//!    the right table whenever the function's wire is the host's network
//!    stack — the emulated function's UDP wire — or the host has an
//!    interface on the same L2 as the port; it is off by default on kernel
//!    VFIO, where neither is known to hold.
//!
//! Resolution runs on the control path only: at RTR for an RC QP and at
//! `create_ah` for UD. A UD send that carries its vector in the work
//! request (no address handle) must carry its `dmac` or a link-local GID.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use rnic_core::Gid;
use tracing::{debug, info};

use crate::function::memory::lock;
use crate::{Hca, Mlx5Error};

/// How [`Hca::resolve_neighbour`] may look beyond the caller, the
/// function's own GIDs and static entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NeighbourOptions {
    /// Ask the host kernel's neighbour table (module docs, step 5); `None`:
    /// the transport's default ([`crate::PciFunction::host_neighbours`]).
    pub host_kernel: Option<bool>,
    /// How long a resolution through the host kernel may take.
    pub timeout: Duration,
}

impl Default for NeighbourOptions {
    fn default() -> NeighbourOptions {
        NeighbourOptions {
            host_kernel: None,
            timeout: Duration::from_secs(3),
        }
    }
}

/// Where a neighbour's MAC came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NeighbourSource {
    /// [`Hca::add_neighbour`].
    Static,
    /// The host kernel's neighbour table (or its route: a local address).
    HostKernel,
}

impl fmt::Display for NeighbourSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NeighbourSource::Static => "static",
            NeighbourSource::HostKernel => "host kernel",
        })
    }
}

/// One entry of the function's neighbour cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Neighbour {
    /// The peer's address.
    pub ip: IpAddr,
    /// Its MAC (the next hop's).
    pub mac: [u8; 6],
    /// Where it came from.
    pub source: NeighbourSource,
}

/// The function's neighbour cache: static entries and what the host kernel
/// answered.
#[derive(Debug)]
pub(crate) struct Neighbours {
    /// Whether the host kernel may be asked, and for how long.
    host_kernel: bool,
    timeout: Duration,
    entries: std::sync::Mutex<BTreeMap<IpAddr, Entry>>,
}

/// A cached MAC, where it came from, and when.
type Entry = (([u8; 6], NeighbourSource), Instant);

/// How long an answer of the host kernel is reused without asking again
/// (its own entries go stale after ~30 s of no traffic; a QP's path is
/// fixed at RTR anyway).
const HOST_ENTRY_TTL: Duration = Duration::from_secs(30);

/// The MAC a link-local IPv6 GID was derived from (EUI-64 inverted), if it
/// is one.
pub fn link_local_mac(gid: &Gid) -> Option<[u8; 6]> {
    let g = gid.raw();
    (g[0] == 0xfe && (g[1] & 0xc0) == 0x80 && g[11] == 0xff && g[12] == 0xfe)
        .then(|| [g[8] ^ 2, g[9], g[10], g[13], g[14], g[15]])
}

/// A GID's IP address (IPv4 for an IPv4-mapped GID).
pub fn gid_ip(gid: &Gid) -> IpAddr {
    match gid.to_ipv4() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(Ipv6Addr::from(*gid.raw())),
    }
}

impl Neighbours {
    pub(crate) fn new(options: NeighbourOptions, transport_default: bool) -> Neighbours {
        Neighbours {
            host_kernel: options.host_kernel.unwrap_or(transport_default),
            timeout: options.timeout,
            entries: Default::default(),
        }
    }

    /// Whether the host kernel's table is asked.
    pub(crate) fn host_kernel(&self) -> bool {
        self.host_kernel
    }
}

impl Hca {
    /// Whether peers' MACs may come from the host kernel's neighbour table.
    pub fn host_neighbours(&self) -> bool {
        self.neighbours.host_kernel()
    }

    /// Add (or replace) a static neighbour: frames to `ip` go to `mac`.
    /// Refused: a multicast or all-zero MAC.
    pub fn add_neighbour(&self, ip: IpAddr, mac: [u8; 6]) -> Result<(), Mlx5Error> {
        if mac[0] & 1 != 0 || mac == [0; 6] {
            return Err(Mlx5Error::QpOptions {
                reason: format!(
                    "neighbour {ip}: {} is not a unicast MAC address",
                    crate::firmware::neigh::mac_text(&mac)
                ),
            });
        }
        lock(&self.neighbours.entries).insert(ip, ((mac, NeighbourSource::Static), Instant::now()));
        info!(%ip, mac = %mac_text(&mac), "static neighbour added");
        Ok(())
    }

    /// Remove a neighbour entry (static or learned); whether there was one.
    pub fn remove_neighbour(&self, ip: IpAddr) -> bool {
        lock(&self.neighbours.entries).remove(&ip).is_some()
    }

    /// The neighbour cache now.
    pub fn neighbours(&self) -> Vec<Neighbour> {
        lock(&self.neighbours.entries)
            .iter()
            .map(|(ip, ((mac, source), _))| Neighbour {
                ip: *ip,
                mac: *mac,
                source: *source,
            })
            .collect()
    }

    /// The destination MAC for frames to `gid` (module docs: given, own,
    /// static, link-local, host kernel); [`Mlx5Error::NoNeighbour`] when
    /// none answers. Control path: locks, and the host kernel may be asked.
    pub fn resolve_neighbour(
        &self,
        gid: &Gid,
        given: Option<[u8; 6]>,
    ) -> Result<[u8; 6], Mlx5Error> {
        if let Some(m) = given {
            return Ok(m);
        }
        if self.owns_gid(gid)
            && let Some(own) = self.mac()
        {
            return Ok(own);
        }
        let ip = gid_ip(gid);
        let now = Instant::now();
        if let Some(((mac, source), at)) = lock(&self.neighbours.entries).get(&ip).copied()
            && (source == NeighbourSource::Static || now.duration_since(at) < HOST_ENTRY_TTL)
        {
            return Ok(mac);
        }
        if let Some(mac) = link_local_mac(gid) {
            return Ok(mac);
        }
        if !self.neighbours.host_kernel {
            return Err(Mlx5Error::NoNeighbour {
                ip,
                why: "no static entry, and asking the host kernel's neighbour table is off".into(),
            });
        }
        let mac =
            host::resolve(ip, self.neighbours.timeout).map_err(|why| Mlx5Error::NoNeighbour {
                ip,
                why: format!("the host kernel could not resolve it: {why}"),
            })?;
        debug!(%ip, mac = %mac_text(&mac), "neighbour resolved by the host kernel");
        lock(&self.neighbours.entries).insert(ip, ((mac, NeighbourSource::HostKernel), now));
        Ok(mac)
    }
}

/// `aa:bb:cc:dd:ee:ff`.
pub fn mac_text(mac: &[u8; 6]) -> String {
    let parts: Vec<String> = mac.iter().map(|b| format!("{b:02x}")).collect();
    parts.join(":")
}

/// The host kernel's route and neighbour tables over rtnetlink.
pub(crate) mod host {
    use super::*;
    use netlink_packet_core::{
        NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
    };
    use netlink_packet_route::neighbour::{
        NeighbourAddress, NeighbourAttribute, NeighbourMessage, NeighbourState,
    };
    use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteMessage, RouteType};
    use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
    use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};

    /// What the kernel's route says about reaching an address.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub(crate) enum Path {
        /// Delivered inside the host (a local address): no frame leaves.
        Local,
        /// Out of interface `oif` to the next hop `via` (the address itself
        /// or a gateway).
        Via { oif: u32, via: IpAddr },
    }

    struct Rtnl {
        socket: Socket,
        seq: u32,
    }

    impl Rtnl {
        fn open() -> Result<Rtnl, String> {
            let mut socket =
                Socket::new(NETLINK_ROUTE).map_err(|e| format!("netlink socket: {e}"))?;
            socket
                .bind_auto()
                .map_err(|e| format!("netlink bind: {e}"))?;
            socket
                .connect(&SocketAddr::new(0, 0))
                .map_err(|e| format!("netlink connect: {e}"))?;
            Ok(Rtnl { socket, seq: 0 })
        }

        /// Send `msg` and collect the kernel's answers until it is done.
        fn request(
            &mut self,
            msg: RouteNetlinkMessage,
            flags: u16,
        ) -> Result<Vec<RouteNetlinkMessage>, String> {
            self.seq += 1;
            let mut header = NetlinkHeader::default();
            header.flags = flags;
            header.sequence_number = self.seq;
            let mut packet = NetlinkMessage::new(header, NetlinkPayload::from(msg));
            packet.finalize();
            let mut buf = vec![0u8; packet.buffer_len()];
            packet.serialize(&mut buf);
            self.socket
                .send(&buf, 0)
                .map_err(|e| format!("netlink send: {e}"))?;
            let mut out = Vec::new();
            let mut rx = vec![0u8; 64 * 1024];
            loop {
                let n = self
                    .socket
                    .recv(&mut &mut rx[..], 0)
                    .map_err(|e| format!("netlink recv: {e}"))?;
                let mut at = 0;
                while at < n {
                    let m = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&rx[at..n])
                        .map_err(|e| format!("netlink reply: {e}"))?;
                    let len = m.header.length as usize;
                    match m.payload {
                        NetlinkPayload::Done(_) => return Ok(out),
                        NetlinkPayload::Error(e) => {
                            return match e.code {
                                None => Ok(out),
                                Some(code) => Err(format!(
                                    "the kernel refused: {}",
                                    std::io::Error::from_raw_os_error(-code.get())
                                )),
                            };
                        }
                        NetlinkPayload::InnerMessage(inner) => out.push(inner),
                        _ => {}
                    }
                    if flags & NLM_F_DUMP == 0 {
                        return Ok(out);
                    }
                    if len == 0 {
                        break;
                    }
                    at += len;
                }
            }
        }

        fn route(&mut self, ip: IpAddr) -> Result<Path, String> {
            let mut msg = RouteMessage::default();
            msg.header.address_family = family(ip);
            msg.header.destination_prefix_length = if ip.is_ipv4() { 32 } else { 128 };
            msg.attributes
                .push(RouteAttribute::Destination(RouteAddress::from(ip)));
            let answers = self.request(RouteNetlinkMessage::GetRoute(msg), NLM_F_REQUEST)?;
            let route = answers
                .into_iter()
                .find_map(|m| match m {
                    RouteNetlinkMessage::NewRoute(r) => Some(r),
                    _ => None,
                })
                .ok_or("no route to it")?;
            if route.header.kind == RouteType::Local {
                return Ok(Path::Local);
            }
            let mut oif = None;
            let mut gateway = None;
            for a in &route.attributes {
                match a {
                    RouteAttribute::Oif(i) => oif = Some(*i),
                    RouteAttribute::Gateway(RouteAddress::Inet(g)) => {
                        gateway = Some(IpAddr::V4(*g))
                    }
                    RouteAttribute::Gateway(RouteAddress::Inet6(g)) => {
                        gateway = Some(IpAddr::V6(*g))
                    }
                    _ => {}
                }
            }
            if route.header.kind != RouteType::Unicast {
                return Err(format!("its route is of type {:?}", route.header.kind));
            }
            Ok(Path::Via {
                oif: oif.ok_or("its route names no interface")?,
                via: gateway.unwrap_or(ip),
            })
        }

        /// The neighbour entry of `ip` on `oif`: its MAC when usable,
        /// `Err(state)` while resolving or failed, `Ok(None)` when absent.
        fn neighbour(
            &mut self,
            oif: u32,
            ip: IpAddr,
        ) -> Result<Option<Result<[u8; 6], NeighbourState>>, String> {
            let mut msg = NeighbourMessage::default();
            msg.header.family = family(ip);
            let answers = self.request(
                RouteNetlinkMessage::GetNeighbour(msg),
                NLM_F_REQUEST | NLM_F_DUMP,
            )?;
            for m in answers {
                let RouteNetlinkMessage::NewNeighbour(n) = m else {
                    continue;
                };
                if n.header.ifindex != oif {
                    continue;
                }
                let mut dst = None;
                let mut lladdr = None;
                for a in &n.attributes {
                    match a {
                        NeighbourAttribute::Destination(NeighbourAddress::Inet(v)) => {
                            dst = Some(IpAddr::V4(*v))
                        }
                        NeighbourAttribute::Destination(NeighbourAddress::Inet6(v)) => {
                            dst = Some(IpAddr::V6(*v))
                        }
                        NeighbourAttribute::LinkLayerAddress(b) => lladdr = Some(b.clone()),
                        _ => {}
                    }
                }
                if dst != Some(ip) {
                    continue;
                }
                let usable = matches!(
                    n.header.state,
                    NeighbourState::Reachable
                        | NeighbourState::Stale
                        | NeighbourState::Delay
                        | NeighbourState::Probe
                        | NeighbourState::Permanent
                        | NeighbourState::Noarp
                );
                return Ok(Some(match lladdr.as_deref() {
                    Some(&[a, b, c, d, e, f]) if usable => Ok([a, b, c, d, e, f]),
                    _ => Err(n.header.state),
                }));
            }
            Ok(None)
        }
    }

    fn family(ip: IpAddr) -> AddressFamily {
        if ip.is_ipv4() {
            AddressFamily::Inet
        } else {
            AddressFamily::Inet6
        }
    }

    /// Make the kernel resolve `via` on `oif`: a datagram to its discard
    /// port (9), which the kernel holds until the neighbour answers.
    fn provoke(oif: u32, via: IpAddr) -> Result<(), String> {
        let (bind, to): (std::net::SocketAddr, std::net::SocketAddr) = match via {
            IpAddr::V4(v) => (
                (Ipv4Addr::UNSPECIFIED, 0).into(),
                std::net::SocketAddrV4::new(v, 9).into(),
            ),
            IpAddr::V6(v) => (
                (Ipv6Addr::UNSPECIFIED, 0).into(),
                std::net::SocketAddrV6::new(v, 9, 0, oif).into(),
            ),
        };
        let s = std::net::UdpSocket::bind(bind).map_err(|e| format!("UDP socket: {e}"))?;
        s.send_to(&[], to)
            .map(drop)
            .map_err(|e| format!("sending to {to} to make the kernel resolve it: {e}"))
    }

    /// The next hop's MAC for frames to `ip`, within `timeout`.
    pub(crate) fn resolve(ip: IpAddr, timeout: Duration) -> Result<[u8; 6], String> {
        let mut nl = Rtnl::open()?;
        let (oif, via) = match nl.route(ip)? {
            // Delivered inside the host: the frame never reaches a wire, and
            // the loopback device's address is all zero (as the kernel's own
            // RoCE over `lo` addresses it).
            Path::Local => return Ok([0; 6]),
            Path::Via { oif, via } => (oif, via),
        };
        let start = Instant::now();
        let mut provoked = false;
        let mut last = None;
        loop {
            match nl.neighbour(oif, via)? {
                Some(Ok(mac)) => return Ok(mac),
                Some(Err(state)) => last = Some(state),
                None => {}
            }
            if start.elapsed() >= timeout {
                return Err(match last {
                    Some(state) => format!(
                        "next hop {via} (interface index {oif}) is {state:?} after {timeout:?}: \
                         nothing answered its ARP / neighbour solicitation"
                    ),
                    None => format!(
                        "next hop {via} (interface index {oif}) never appeared in the neighbour \
                         table within {timeout:?}"
                    ),
                });
            }
            if !provoked || matches!(last, Some(NeighbourState::Failed)) {
                provoke(oif, via)?;
                provoked = true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn a_local_address_needs_no_frame_and_gets_the_loopback_mac() {
            // 127.0.0.0/8 is local on every Linux host.
            let mut nl = Rtnl::open().unwrap();
            assert_eq!(
                nl.route("127.0.0.77".parse().unwrap()).unwrap(),
                Path::Local
            );
            assert_eq!(
                resolve("127.0.0.77".parse().unwrap(), Duration::from_millis(100)).unwrap(),
                [0; 6]
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_local_gid_gives_back_its_mac_and_others_none() {
        let mac = [0x02, 0x11, 0x22, 0x33, 0x44, 0x55];
        assert_eq!(link_local_mac(&Gid::link_local_from_mac(mac)), Some(mac));
        assert_eq!(
            link_local_mac(&Gid::from_ipv4(Ipv4Addr::new(10, 0, 0, 2))),
            None
        );
        assert_eq!(
            gid_ip(&Gid::from_ipv4(Ipv4Addr::new(10, 0, 0, 2))),
            IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2))
        );
        assert_eq!(mac_text(&mac), "02:11:22:33:44:55");
    }
}
