//! The cable: a UDP socket carrying one frame per datagram (QEMU's dgram netdev protocol), or
//! an AF_PACKET socket on a host interface. Both send and receive whole Ethernet frames
//! without FCS.

use std::collections::VecDeque;
use std::io;
use std::net::UdpSocket;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Mutex;
use std::time::Duration;

use super::Wire;
use super::gso::{self, VNET_HDR_LEN, VnetHdr};
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
    /// own transmissions, with a virtio-net header on every frame (`PACKET_VNET_HDR`): the
    /// host stack's offloads are finished here ([`gso`]); the datagrams of a segmented
    /// frame wait in `pending`.
    Packet {
        fd: OwnedFd,
        pending: Mutex<VecDeque<Vec<u8>>>,
    },
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
                Ok(Link::Packet {
                    fd,
                    pending: Mutex::new(VecDeque::new()),
                })
            }
        }
    }

    /// The address a dgram link's socket is bound to (`None` for AF_PACKET).
    pub(crate) fn local_addr(&self) -> Option<std::net::SocketAddr> {
        match self {
            Link::Dgram(s) => s.local_addr().ok(),
            Link::Packet { .. } => None,
        }
    }

    /// Send one frame.
    pub(crate) fn send(&self, frame: &[u8]) -> io::Result<()> {
        let n = match self {
            Link::Dgram(s) => s.send(frame)?,
            // A zero virtio-net header: a whole frame, no offload asked.
            Link::Packet { fd, .. } => {
                let mut b = vec![0u8; VNET_HDR_LEN + frame.len()];
                b[VNET_HDR_LEN..].copy_from_slice(frame);
                sys::packet_send(fd.as_fd(), &b)?.saturating_sub(VNET_HDR_LEN)
            }
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
            Link::Packet { fd, pending } => {
                if let Some(f) = crate::hca::lock(pending).pop_front() {
                    return Ok(Some(put(buf, &f)));
                }
                sys::packet_recv(fd.as_fd(), buf, timeout).map(|n| {
                    let n = n.min(buf.len());
                    let Some(h) = VnetHdr::parse(&buf[..n]) else {
                        return 0;
                    };
                    match gso::frames(h, &buf[VNET_HDR_LEN..n]) {
                        Ok(mut fs) if !fs.is_empty() => {
                            let first = fs.remove(0);
                            crate::hca::lock(pending).extend(fs);
                            put(buf, &first)
                        }
                        // Counted by the caller as shorter than an Ethernet header.
                        Ok(_) => 0,
                        Err(why) => {
                            tracing::debug!(?why, ?h, "packet socket frame dropped");
                            0
                        }
                    }
                })
            }
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

/// `frame` at the start of `buf`: its length.
fn put(buf: &mut [u8], frame: &[u8]) -> usize {
    let n = frame.len().min(buf.len());
    buf[..n].copy_from_slice(&frame[..n]);
    frame.len()
}
