//! [`RxeError`]: why opening an rxe device failed, with what to do about it.

use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use thiserror::Error;

/// Opening an rxe device failed. Every message says how to fix it.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum RxeError {
    /// The named interface does not exist.
    #[error(
        "network interface {name:?} not found; interfaces on this host: {available}. Use \
         rxe:<one of them>, or rxe:<ip address>"
    )]
    InterfaceNotFound {
        /// The name asked for.
        name: String,
        /// The interfaces that do exist, comma-separated.
        available: String,
    },
    /// The interface has no IPv4/IPv6 address to use as a GID.
    #[error(
        "interface {name:?} has no IPv4 or IPv6 address, so it has no GID: add one (ip addr add \
         10.0.0.1/24 dev {name}) or bring it up (ip link set {name} up)"
    )]
    NoAddress {
        /// The interface.
        name: String,
    },
    /// No local interface carries the address.
    #[error(
        "{ip} is not an address of this host (addresses: {available}); use one of them, or add it \
         ({add}). All of 127.0.0.0/8 is loopback on Linux",
        add = add_hint(.ip)
    )]
    AddressNotLocal {
        /// The address asked for.
        ip: IpAddr,
        /// The host's addresses, comma-separated.
        available: String,
    },
    /// The IPv6 address cannot be bound yet: duplicate address detection is
    /// still running on it (tentative), or it failed.
    #[error(
        "{ip} on {netdev} cannot be bound: it is tentative (IPv6 duplicate address detection runs \
         for a second or two after an address is added or its link comes up) or failed duplicate \
         address detection. Wait until `ip -6 addr show dev {netdev}` no longer marks it \
         tentative, or add it without detection (ip -6 addr add {ip}/128 dev {netdev} nodad)"
    )]
    AddressTentative {
        /// The address.
        ip: Ipv6Addr,
        /// Its interface.
        netdev: String,
    },
    /// UDP/4791 on this address is taken.
    #[error(
        "UDP port {addr} is already in use{holder}. Free it, or give this endpoint its own \
         address (rxe:127.0.0.2, any 127.x.y.z works on loopback)"
    )]
    PortInUse {
        /// The address and port.
        addr: SocketAddr,
        /// Who probably holds it (the kernel's rdma_rxe, another rnic process).
        holder: String,
    },
    /// A socket operation failed.
    #[error("{what} on {addr} failed: {source}")]
    Socket {
        /// What was being done.
        what: &'static str,
        /// The local address.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Joining an address's sharing group (`crate::share`) failed.
    #[error(
        "{what} for {addr} failed: {source} (sharing the address with other rnic processes; \
         RNIC_RXE_SHARE=0 binds it exclusively instead)"
    )]
    Share {
        /// What was being done.
        what: &'static str,
        /// The local address and port.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The packet-ring receive path (`RxeConfig::rx_ring`) could not be set
    /// up on an address.
    #[error(
        "{what} for the packet-ring receive path on {addr} failed: {source}. The ring needs \
         CAP_NET_RAW (run as root) and Linux 6.2 or later; without RNIC_RXE_RX_RING=1 (or \
         RxeConfig::with_rx_ring(false)) the device receives through its UDP socket"
    )]
    PacketRing {
        /// What was being done.
        what: &'static str,
        /// The local address and port.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Listing the interfaces failed.
    #[error("reading the interface addresses (getifaddrs) failed: {0}")]
    Interfaces(#[source] nix::Error),
    /// Creating the doorbell / completion eventfd or the epoll set failed.
    #[error("creating {what} failed: {source} (check RLIMIT_NOFILE: ulimit -n)")]
    Event {
        /// Which object.
        what: &'static str,
        /// The OS error.
        #[source]
        source: nix::Error,
    },
    /// The progress thread could not be started.
    #[error("starting the progress thread failed: {0}")]
    Thread(#[source] io::Error),
}

/// How to add `ip` to an interface, for messages.
fn add_hint(ip: &IpAddr) -> String {
    match ip {
        IpAddr::V4(_) => format!("ip addr add {ip}/32 dev <netdev>"),
        IpAddr::V6(_) => format!("ip -6 addr add {ip}/128 dev <netdev> nodad"),
    }
}
