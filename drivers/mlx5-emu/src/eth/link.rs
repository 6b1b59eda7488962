//! The cable: a UDP socket carrying one frame per datagram (QEMU's dgram netdev protocol), or
//! an AF_PACKET socket on a host interface. Both send and receive whole Ethernet frames
//! without FCS.

use std::io;
use std::net::UdpSocket;
use std::os::fd::{AsFd, OwnedFd};
use std::time::Duration;

use super::Wire;
use crate::sys;

/// The largest frame the link takes or gives (a UDP datagram's payload bound, far above any
/// port MTU the firmware accepts).
pub(crate) const MAX_FRAME: usize = 65_535;

/// An open link.
#[derive(Debug)]
pub(crate) enum Link {
    /// A UDP socket bound to the local address and connected to the remote one: the kernel
    /// drops datagrams from anywhere else.
    Dgram(UdpSocket),
    /// An AF_PACKET raw socket bound to one interface, in promiscuous mode, not seeing its
    /// own transmissions.
    Packet(OwnedFd),
}

impl Link {
    /// Open the link of an Ethernet `wire`.
    pub(crate) fn open(wire: Wire) -> io::Result<Link> {
        match wire {
            Wire::Udp => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the udp wire has no Ethernet link",
            )),
            Wire::Dgram { local, remote } => {
                let s = UdpSocket::bind(local)?;
                s.connect(remote)?;
                sys::set_socket_buffers(s.as_fd(), 4 << 20);
                Ok(Link::Dgram(s))
            }
            Wire::Packet { ifname } => {
                let index = sys::ifindex(ifname.as_str()).map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!(
                            "interface {ifname}: {e} (create it first, e.g. a veth pair: `ip \
                             link add {ifname} type veth peer name {ifname}p`)"
                        ),
                    )
                })?;
                let fd = sys::packet_socket(index).map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!("AF_PACKET on {ifname}: {e} (needs CAP_NET_RAW: run as root)"),
                    )
                })?;
                sys::set_socket_buffers(fd.as_fd(), 4 << 20);
                Ok(Link::Packet(fd))
            }
        }
    }

    /// The address a dgram link's socket is bound to (`None` for AF_PACKET).
    pub(crate) fn local_addr(&self) -> Option<std::net::SocketAddr> {
        match self {
            Link::Dgram(s) => s.local_addr().ok(),
            Link::Packet(_) => None,
        }
    }

    /// Send one frame.
    pub(crate) fn send(&self, frame: &[u8]) -> io::Result<()> {
        let n = match self {
            Link::Dgram(s) => s.send(frame)?,
            Link::Packet(fd) => sys::packet_send(fd.as_fd(), frame)?,
        };
        if n == frame.len() {
            Ok(())
        } else {
            Err(io::Error::new(io::ErrorKind::WriteZero, "frame cut short"))
        }
    }

    /// Receive one frame into `buf`, waiting up to `timeout`: its length (which may exceed
    /// `buf.len()` when it was cut), or `None` on timeout.
    pub(crate) fn recv(&self, buf: &mut [u8], timeout: Duration) -> io::Result<Option<usize>> {
        let timeout = timeout.max(Duration::from_micros(1));
        let r = match self {
            Link::Dgram(s) => {
                s.set_read_timeout(Some(timeout))?;
                s.recv(buf)
            }
            Link::Packet(fd) => sys::packet_recv(fd.as_fd(), buf, timeout),
        };
        match r {
            Ok(n) => Ok(Some(n)),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                Ok(None)
            }
            // ICMP port unreachable of an earlier send (the peer's socket is not up yet).
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => Ok(None),
            Err(e) => Err(e),
        }
    }
}
