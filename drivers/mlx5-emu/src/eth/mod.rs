//! The function's Ethernet port: what cable it is plugged into ([`Wire`]), its MAC and MTU,
//! its counters ([`PortCounters`]), and — on an Ethernet wire — the link itself and the
//! receive thread that hands every frame to the HCA ([`crate::hca`]'s `on_frame`).
//!
//! Two kinds of wire:
//!
//! - [`Wire::Udp`] (the default): no L2. Each RoCE v2 address of the GID table binds a UDP/4791
//!   socket of the host (`hca::port`); the kernel's IP stack is the network.
//! - An Ethernet link: every frame the port sends or receives is a whole Ethernet frame (no
//!   FCS): RoCE v2 and everything else. [`Wire::Dgram`] carries one frame per UDP datagram
//!   between two fixed endpoints — QEMU's `-netdev dgram` / `-netdev socket,udp=` protocol, so
//!   a guest's NIC is cabled straight to the port; [`Wire::Packet`] sends and receives on a host
//!   interface through an AF_PACKET socket in promiscuous mode (a veth end in a network
//!   namespace for host tests).
//!
//! On an Ethernet link the port is as strict as a NIC: unicast frames for other MACs are
//! dropped and counted; frames whose L2 payload exceeds the port MTU are dropped and counted;
//! broadcast and multicast reach the function only through the NIC RX flow table rules the
//! driver installed; RoCE v2 (UDP 4791 to an address of the GID table) goes to the RDMA engine.

mod frame;
mod gso;
mod link;

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

pub(crate) use frame::{
    Headers, L4, MacClass, build_roce_frame, fill_checksums, l4_checksum_ok, match_key,
};
pub(crate) use link::{Link, MAX_FRAME};

use crate::error::EmuError;
use crate::hca::{Hca, lock};

/// A network interface name (at most 15 bytes, as `IFNAMSIZ` allows), kept inline so
/// [`Wire`] stays `Copy`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct IfName {
    bytes: [u8; 15],
    len: u8,
}

impl IfName {
    /// `name` if it is a valid interface name (1..=15 bytes, no `/`, whitespace or NUL).
    pub fn new(name: &str) -> Option<IfName> {
        let b = name.as_bytes();
        if b.is_empty()
            || b.len() > 15
            || b.iter()
                .any(|&c| c == b'/' || c == 0 || c.is_ascii_whitespace())
        {
            return None;
        }
        let mut bytes = [0u8; 15];
        bytes[..b.len()].copy_from_slice(b);
        Some(IfName {
            bytes,
            len: b.len() as u8,
        })
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or("")
    }
}

impl fmt::Debug for IfName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IfName({:?})", self.as_str())
    }
}

impl fmt::Display for IfName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the port is cabled to (`rnic-mlx5-emu --wire`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Wire {
    /// No L2: RoCE v2 over host UDP/4791 sockets, one per GID (the default).
    #[default]
    Udp,
    /// Ethernet frames, one per UDP datagram, from `local` to `remote` (QEMU's dgram netdev
    /// protocol): `dgram:local=127.0.0.1:7000,remote=127.0.0.1:7001`.
    Dgram {
        /// The address the port's socket binds.
        local: SocketAddr,
        /// The only address frames go to and are taken from.
        remote: SocketAddr,
    },
    /// Ethernet frames on a host interface through AF_PACKET (promiscuous): `packet:veth0`.
    Packet {
        /// The interface.
        ifname: IfName,
    },
}

impl Wire {
    /// Whether the port carries Ethernet frames (not the UDP-socket wire).
    pub fn is_ethernet(&self) -> bool {
        !matches!(self, Wire::Udp)
    }
}

impl fmt::Display for Wire {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Wire::Udp => f.write_str("udp"),
            Wire::Dgram { local, remote } => write!(f, "dgram:local={local},remote={remote}"),
            Wire::Packet { ifname } => write!(f, "packet:{ifname}"),
        }
    }
}

const WIRE_HELP: &str = "type `udp`, `dgram:local=ADDR:PORT,remote=ADDR:PORT` (IPv6 as \
                         [addr]:port) or `packet:IFNAME`";

impl FromStr for Wire {
    type Err = String;

    fn from_str(s: &str) -> Result<Wire, String> {
        if s == "udp" {
            return Ok(Wire::Udp);
        }
        if let Some(rest) = s.strip_prefix("dgram:") {
            let (mut local, mut remote) = (None, None);
            for part in rest.split(',') {
                let (k, v) = part
                    .split_once('=')
                    .ok_or_else(|| format!("{s:?}: {part:?} is not key=value; {WIRE_HELP}"))?;
                let a: SocketAddr = v
                    .parse()
                    .map_err(|_| format!("{s:?}: {v:?} is not ADDR:PORT; {WIRE_HELP}"))?;
                match k {
                    "local" => local = Some(a),
                    "remote" => remote = Some(a),
                    _ => return Err(format!("{s:?}: unknown key {k:?}; {WIRE_HELP}")),
                }
            }
            return match (local, remote) {
                (Some(local), Some(remote)) if local.is_ipv4() == remote.is_ipv4() => {
                    Ok(Wire::Dgram { local, remote })
                }
                (Some(_), Some(_)) => Err(format!(
                    "{s:?}: local and remote must both be IPv4 or both IPv6"
                )),
                _ => Err(format!(
                    "{s:?}: both local= and remote= are needed; {WIRE_HELP}"
                )),
            };
        }
        if let Some(name) = s.strip_prefix("packet:") {
            let ifname = IfName::new(name)
                .ok_or_else(|| format!("{s:?}: {name:?} is not an interface name"))?;
            return Ok(Wire::Packet { ifname });
        }
        Err(format!("{s:?} is not a wire: {WIRE_HELP}"))
    }
}

/// A locally administered unicast MAC derived from `name` (FNV-1a of its bytes): the
/// default MAC of a function served on socket `name`, stable across runs.
pub fn mac_from_name(name: &[u8]) -> [u8; 6] {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in name {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    let b = h.to_be_bytes();
    // Bit 1 of the first octet: locally administered; bit 0 clear: unicast.
    [(b[0] & 0xfc) | 0x02, b[1], b[2], b[3], b[4], b[5]]
}

macro_rules! port_counters {
    ($( $(#[$m:meta])* $name:ident, )*) => {
        /// The port's counters since the emulator started (a function reset keeps them: they
        /// are the cable's). QUERY_VPORT_COUNTER reports the vport's share from them.
        #[derive(Debug, Default)]
        pub struct PortCounters {
            $( $(#[$m])* pub $name: AtomicU64, )*
        }

        /// A snapshot of [`PortCounters`].
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        #[non_exhaustive]
        pub struct PortStats {
            $( $(#[$m])* pub $name: u64, )*
        }

        impl PortCounters {
            /// The values now.
            pub fn snapshot(&self) -> PortStats {
                PortStats { $( $name: self.$name.load(Ordering::Relaxed), )* }
            }
        }

        impl PortStats {
            /// (name, value) of every counter, in declaration order.
            pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> {
                [$( (stringify!($name), self.$name), )*].into_iter()
            }

            /// Every counter of `self` minus `base` (saturating).
            pub fn since(&self, base: &PortStats) -> PortStats {
                PortStats { $( $name: self.$name.saturating_sub(base.$name), )* }
            }
        }
    };
}

port_counters! {
    /// Frames taken from the wire (any destination).
    rx_frames,
    /// Their bytes (no FCS).
    rx_octets,
    /// Frames for the function's own MAC.
    rx_unicast,
    /// Octets of those.
    rx_unicast_octets,
    /// Multicast frames (group bit set, not broadcast).
    rx_multicast,
    /// Octets of those.
    rx_multicast_octets,
    /// Broadcast frames.
    rx_broadcast,
    /// Octets of those.
    rx_broadcast_octets,
    /// RoCE v2 packets handed to the RDMA engine.
    rx_roce,
    /// Frames written into a receive queue by a flow table rule.
    rx_delivered,
    /// Unicast frames for another MAC: dropped.
    rx_other_mac,
    /// Frames no flow table rule took (no root table, or no match): dropped.
    rx_no_rule,
    /// Broadcast and multicast frames for a group address the vport did not subscribe to
    /// (its multicast list, or promisc_mc): dropped before the flow table.
    rx_not_subscribed,
    /// Frames a rule dropped (action DROP).
    rx_rule_drop,
    /// Frames a rule sent to a receive queue that was not ready or had no WQE: dropped.
    rx_rq_empty,
    /// Frames shorter than an Ethernet header: dropped.
    rx_malformed,
    /// Frames whose L2 payload exceeds the port MTU: dropped.
    rx_mtu,
    /// Frames that arrived while no function was attached (between resets): dropped.
    rx_no_function,
    /// Frames looped back to the function itself (sent to its own MAC, or broadcast /
    /// multicast it sent) and received by it.
    rx_loopback,
    /// Frames the port sent on the wire.
    tx_frames,
    /// Their bytes.
    tx_octets,
    /// Unicast frames sent (wire or loopback).
    tx_unicast,
    /// Octets of those.
    tx_unicast_octets,
    /// Multicast frames sent.
    tx_multicast,
    /// Octets of those.
    tx_multicast_octets,
    /// Broadcast frames sent.
    tx_broadcast,
    /// Octets of those.
    tx_broadcast_octets,
    /// RoCE packets not sent because their destination MAC was zero or a group address
    /// (the QP's or address vector's `rmac` was never resolved).
    tx_bad_dmac,
    /// Raw frames not sent because their source MAC is not the function's.
    tx_bad_smac,
    /// Frames not sent because their L2 payload exceeds the port MTU.
    tx_mtu,
    /// Frames the link refused to send (a socket error).
    tx_errors,
    /// Frames a raw SQ sent while the port has no L2 (the udp wire): dropped.
    tx_no_l2,
    /// Looped-back frames a TIR's `self_lb_block` kept from the function.
    rx_lb_blocked,
}

/// The Ethernet port of a function on an Ethernet wire: the link, the MAC filter's address,
/// the MTU, and the HCA its receive thread hands frames to.
pub(crate) struct EthPort {
    link: Link,
    /// The link's own address (a dgram wire's bound socket).
    pub(crate) local: Option<SocketAddr>,
    /// The function's MAC (the permanent address of its vport).
    pub(crate) mac: [u8; 6],
    /// The most L2 payload bytes a frame may carry (the port MTU).
    pub(crate) mtu: u32,
    pub(crate) counters: Arc<PortCounters>,
    /// The HCA of the function's current life (replaced by every reset).
    target: Mutex<Weak<Mutex<Hca>>>,
    stop: AtomicBool,
}

impl fmt::Debug for EthPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EthPort")
            .field("link", &self.link)
            .field("mtu", &self.mtu)
            .finish_non_exhaustive()
    }
}

/// What became of a frame the function sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sent {
    /// On the wire (and looped back when it is also for the function itself).
    Wire,
    /// Only looped back (unicast to the function's own MAC).
    Looped,
    /// Dropped: its L2 payload exceeds the port MTU.
    TooBig,
    /// Dropped: a RoCE packet whose destination MAC is zero or a group address.
    BadDmac,
    /// Dropped: a raw frame whose source MAC is not the function's.
    BadSmac,
    /// Dropped: the link refused it.
    LinkError,
}

impl EthPort {
    /// Open the link of `wire` (an Ethernet wire) and start the port's receive thread.
    pub(crate) fn start(
        wire: Wire,
        mac: [u8; 6],
        mtu: u32,
        counters: Arc<PortCounters>,
    ) -> Result<Arc<EthPort>, EmuError> {
        let link = Link::open(wire).map_err(|source| EmuError::Wire {
            wire: wire.to_string(),
            source,
        })?;
        let local = link.local_addr();
        let port = Arc::new(EthPort {
            link,
            local,
            mac,
            mtu,
            counters,
            target: Mutex::new(Weak::new()),
            stop: AtomicBool::new(false),
        });
        let p = port.clone();
        std::thread::Builder::new()
            .name("mlx5-emu-port".into())
            .spawn(move || p.rx_loop())
            .map_err(|source| EmuError::Thread {
                what: "Ethernet port receive",
                source,
            })?;
        tracing::info!(%wire, mac = %MacFmt(mac), mtu, "Ethernet port up");
        Ok(port)
    }

    /// The HCA that receives from now on (the function's new life after a reset).
    pub(crate) fn set_target(&self, hca: Weak<Mutex<Hca>>) {
        *lock(&self.target) = hca;
    }

    /// Stop the receive thread (within its poll timeout, at most 50 ms).
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
    }

    /// Count a received frame's class.
    pub(crate) fn count_rx(&self, class: MacClass, len: usize) {
        let c = &*self.counters;
        let len = len as u64;
        let (n, o) = match class {
            MacClass::Own => (&c.rx_unicast, &c.rx_unicast_octets),
            MacClass::Multicast => (&c.rx_multicast, &c.rx_multicast_octets),
            MacClass::Broadcast => (&c.rx_broadcast, &c.rx_broadcast_octets),
            MacClass::Other => {
                c.rx_other_mac.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        n.fetch_add(1, Ordering::Relaxed);
        o.fetch_add(len, Ordering::Relaxed);
    }

    /// Send `frame` from the function: check it (MTU; for RoCE (`roce`) a unicast destination
    /// MAC; for raw frames the source MAC), count it, put it on the wire unless it is for the
    /// function alone. Whether it must also be looped back to the function's own receive
    /// path is `Sent::Looped`, or `Sent::Wire` for a broadcast / multicast frame (the caller
    /// loops those).
    pub(crate) fn transmit(&self, frame: &[u8], roce: bool) -> Sent {
        let c = &*self.counters;
        if frame.len() < 14 {
            c.tx_errors.fetch_add(1, Ordering::Relaxed);
            return Sent::LinkError;
        }
        let l2_payload = frame.len() - frame::l2_header_len(frame);
        if l2_payload > self.mtu as usize {
            c.tx_mtu.fetch_add(1, Ordering::Relaxed);
            return Sent::TooBig;
        }
        let mut dmac = [0u8; 6];
        dmac.copy_from_slice(&frame[..6]);
        let class = MacClass::of(&dmac, &self.mac);
        if roce && (dmac == [0; 6] || matches!(class, MacClass::Multicast | MacClass::Broadcast)) {
            c.tx_bad_dmac.fetch_add(1, Ordering::Relaxed);
            return Sent::BadDmac;
        }
        if !roce && frame[6..12] != self.mac {
            c.tx_bad_smac.fetch_add(1, Ordering::Relaxed);
            return Sent::BadSmac;
        }
        let len = frame.len() as u64;
        let (n, o) = match class {
            MacClass::Own | MacClass::Other => (&c.tx_unicast, &c.tx_unicast_octets),
            MacClass::Multicast => (&c.tx_multicast, &c.tx_multicast_octets),
            MacClass::Broadcast => (&c.tx_broadcast, &c.tx_broadcast_octets),
        };
        n.fetch_add(1, Ordering::Relaxed);
        o.fetch_add(len, Ordering::Relaxed);
        if class == MacClass::Own {
            return Sent::Looped;
        }
        match self.link.send(frame) {
            Ok(()) => {
                c.tx_frames.fetch_add(1, Ordering::Relaxed);
                c.tx_octets.fetch_add(len, Ordering::Relaxed);
                Sent::Wire
            }
            Err(e) => {
                c.tx_errors.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(%e, "frame not sent");
                Sent::LinkError
            }
        }
    }

    /// The receive thread: blocks on the link up to the HCA's next engine deadline (at most
    /// 50 ms), hands each frame to the HCA, runs due engine timers on timeouts.
    fn rx_loop(self: Arc<EthPort>) {
        let mut buf = vec![0u8; link::MAX_FRAME];
        while !self.stop.load(Ordering::Acquire) {
            let hca = lock(&self.target).upgrade();
            let timeout = hca
                .as_ref()
                .map_or(Duration::from_millis(50), |h| lock(h).poll_timeout());
            let got = self.link.recv(&mut buf, timeout);
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            // The function may have been attached (or reset) while this thread waited.
            let hca = lock(&self.target).upgrade();
            match got {
                Ok(Some(n)) => {
                    let c = &*self.counters;
                    c.rx_frames.fetch_add(1, Ordering::Relaxed);
                    c.rx_octets.fetch_add(n as u64, Ordering::Relaxed);
                    match &hca {
                        Some(h) => lock(h).on_frame(&self, &buf[..n.min(buf.len())], n, None),
                        None => {
                            c.rx_no_function.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                Ok(None) => {
                    if let Some(h) = &hca {
                        lock(h).on_timers();
                    }
                }
                Err(e) => {
                    tracing::debug!(%e, "port receive error");
                    if let Some(h) = &hca {
                        lock(h).on_timers();
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
    }
}

/// A MAC address as `aa:bb:cc:dd:ee:ff`.
#[derive(Clone, Copy, Debug)]
pub struct MacFmt(pub [u8; 6]);

impl fmt::Display for MacFmt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

/// Parse `aa:bb:cc:dd:ee:ff` (or with `-`).
pub fn parse_mac(s: &str) -> Result<[u8; 6], String> {
    let parts: Vec<&str> = s.split([':', '-']).collect();
    let bad = || format!("{s:?} is not a MAC address: type six hex bytes, e.g. 02:00:00:00:00:01");
    if parts.len() != 6 {
        return Err(bad());
    }
    let mut mac = [0u8; 6];
    for (m, p) in mac.iter_mut().zip(parts) {
        if p.len() != 2 {
            return Err(bad());
        }
        *m = u8::from_str_radix(p, 16).map_err(|_| bad())?;
    }
    if mac[0] & 1 != 0 {
        return Err(format!(
            "{s:?} is a group (multicast) address: a function's MAC must be unicast"
        ));
    }
    if mac == [0; 6] {
        return Err(format!(
            "{s:?}: the zero MAC cannot be a function's address"
        ));
    }
    Ok(mac)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wires_parse_and_print_back() {
        assert_eq!("udp".parse::<Wire>(), Ok(Wire::Udp));
        let w: Wire = "dgram:local=127.0.0.1:7000,remote=127.0.0.1:7001"
            .parse()
            .unwrap();
        assert_eq!(
            w.to_string(),
            "dgram:local=127.0.0.1:7000,remote=127.0.0.1:7001"
        );
        assert!(w.is_ethernet());
        let w: Wire = "dgram:remote=[::1]:9,local=[::1]:8".parse().unwrap();
        assert_eq!(w.to_string(), "dgram:local=[::1]:8,remote=[::1]:9");
        let w: Wire = "packet:veth0".parse().unwrap();
        assert_eq!(w.to_string(), "packet:veth0");
        for bad in [
            "",
            "tcp",
            "dgram:",
            "dgram:local=127.0.0.1:1",
            "dgram:local=127.0.0.1:1,remote=[::1]:2",
            "dgram:local=x,remote=127.0.0.1:2",
            "dgram:local=127.0.0.1:1,remote=127.0.0.1:2,mtu=9",
            "packet:",
            "packet:a/b",
            "packet:waytoolonginterface",
        ] {
            let e = bad.parse::<Wire>().unwrap_err();
            assert!(e.contains(bad) || bad.is_empty(), "{e}");
        }
    }

    #[test]
    fn derived_macs_are_local_unicast_and_stable() {
        let a = mac_from_name(b"/tmp/a.sock");
        assert_eq!(a, mac_from_name(b"/tmp/a.sock"));
        assert_ne!(a, mac_from_name(b"/tmp/b.sock"));
        assert_eq!(a[0] & 3, 2, "locally administered unicast");
        assert_eq!(
            parse_mac("02:00:15:b3:10:17"),
            Ok([2, 0, 0x15, 0xb3, 0x10, 0x17])
        );
        assert_eq!(parse_mac(&MacFmt(a).to_string()), Ok(a));
        assert!(
            parse_mac("01:00:5e:00:00:01")
                .unwrap_err()
                .contains("group")
        );
        assert!(parse_mac("00:00:00:00:00:00").unwrap_err().contains("zero"));
        assert!(parse_mac("02:00:00:00:00").is_err());
        assert!(parse_mac("02:00:00:00:00:zz").is_err());
    }
}
