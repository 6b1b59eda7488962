//! One local address of a device: its GID and its UDP/4791 socket.

use std::fs::File;
use std::io;
use std::net::{IpAddr, SocketAddr, SocketAddrV6, UdpSocket};
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use nix::sched::{CloneFlags, setns};

use rnic_core::Gid;

use crate::error::RxeError;
use crate::gid::LocalAddr;
use crate::sys;

/// Socket buffer size asked for (`net.core.rmem_max` caps it unless root).
const SOCK_BUF: usize = 8 << 20;

/// A bound local address.
#[derive(Debug)]
pub struct Port {
    /// The GID-table entry.
    pub gid: Gid,
    /// The address.
    pub ip: IpAddr,
    /// IPv6 scope for link-local addresses.
    pub scope_id: u32,
    /// The interface, when known.
    pub netdev: Option<String>,
    /// The receiving socket, bound to `ip`:RoCE port.
    pub sock: UdpSocket,
    /// `UDP_GRO` is on for `sock`.
    pub gro: bool,
    /// IPv4 only: the identification tap (`sys::ident_tap`), a raw socket
    /// that sees the headers of every packet to this address whose IPv4
    /// identification is not 0, so an ICRC whose identification the
    /// receive path could not predict is still checked in all 32 bits.
    /// `None` without CAP_NET_RAW, when not asked for, or with a packet
    /// ring (which sees every header, so identifications are never
    /// predicted there).
    pub tap: Option<std::os::fd::OwnedFd>,
    /// The packet-ring receive path (`crate::ring`): when present, every
    /// datagram to the port arrives here and `sock` drops all it receives.
    pub ring: Option<crate::ring::PacketRing>,
    /// The network namespace `sock` was bound in (the opening thread's),
    /// when `/proc` shows it: per-QP sockets bound later, from whichever
    /// thread connects or posts, are bound there too.
    netns: Option<NetNs>,
}

/// A network namespace, held open.
#[derive(Debug)]
pub(crate) struct NetNs {
    file: File,
    ino: u64,
}

impl NetNs {
    /// The calling thread's network namespace.
    pub(crate) fn current() -> io::Result<NetNs> {
        let file = File::open("/proc/thread-self/ns/net")?;
        let ino = file.metadata()?.ino();
        Ok(NetNs { file, ino })
    }

    /// Run `f` in this namespace: on the calling thread directly when it is
    /// already there, else between two `setns` calls (needs CAP_SYS_ADMIN;
    /// the thread returns to its own namespace before this returns).
    pub(crate) fn run<T>(&self, f: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
        let here = NetNs::current()?;
        if here.ino == self.ino {
            return f();
        }
        setns(self.file.as_fd(), CloneFlags::CLONE_NEWNET).map_err(io::Error::from)?;
        let r = f();
        setns(here.file.as_fd(), CloneFlags::CLONE_NEWNET).map_err(|e| {
            tracing::error!(error = %e, "could not return to the thread's network namespace");
            io::Error::from(e)
        })?;
        r
    }
}

/// The hop limit [`Port::bind_sender`] gives a socket for traffic class
/// `tclass` and hop limit `hops` (0: unset): `None` when both are unset
/// (the socket keeps the system's defaults), else `hops`, or 64 for 0.
pub fn sender_hops(tclass: u8, hops: u8) -> Option<u8> {
    (tclass != 0 || hops != 0).then_some(if hops == 0 { 64 } else { hops })
}

fn sockaddr(ip: IpAddr, scope_id: u32, port: u16) -> SocketAddr {
    match ip {
        IpAddr::V4(v4) => SocketAddr::from((v4, port)),
        IpAddr::V6(v6) => SocketAddr::V6(SocketAddrV6::new(v6, port, 0, scope_id)),
    }
}

/// Who probably holds a UDP port: the kernel's rxe, or another process.
fn holder(port: u16) -> String {
    if port == 4791 && Path::new("/sys/module/rdma_rxe").exists() {
        " — the kernel's rdma_rxe module is loaded and an rxe device binds UDP/4791 on every \
         address (list: rdma link show; remove: rdma link delete rxe0, or modprobe -r rdma_rxe)"
            .to_owned()
    } else {
        " — another process (or another rnic device in this one) holds it; rnic devices \
         share an address only when each process may load the steering program (CAP_BPF, \
         CAP_SYS_ADMIN: run as root) and none sets RNIC_RXE_SHARE=0; find the holder with \
         ss -uanp 'sport = :4791'"
            .to_owned()
    }
}

fn prepare(sock: &UdpSocket, ip: IpAddr, addr: SocketAddr) -> Result<(), RxeError> {
    sys::set_pmtudisc_do(sock.as_fd(), sys::is_v6(&ip)).map_err(|source| RxeError::Socket {
        what: "setting IP_MTU_DISCOVER=IP_PMTUDISC_DO",
        addr,
        source,
    })?;
    if sys::is_v6(&ip) {
        sys::set_flow_label_off(sock.as_fd()).map_err(|source| RxeError::Socket {
            what: "setting IPV6_AUTOFLOWLABEL=0",
            addr,
            source,
        })?;
    }
    sys::set_buffers(sock, SOCK_BUF);
    Ok(())
}

impl Port {
    /// Bind `local` on `roce_port` and configure the socket (DF, buffers,
    /// GRO when `want_gro` and the kernel has it).
    pub fn bind(
        local: &LocalAddr,
        roce_port: u16,
        want_gro: bool,
        want_tap: bool,
        want_ring: bool,
        share: Option<&mut crate::share::Member>,
    ) -> Result<Port, RxeError> {
        let addr = sockaddr(local.ip, local.scope_id, roce_port);
        let bound = match share {
            Some(m) => m.bind(addr)?,
            None => UdpSocket::bind(addr).map_err(|source| {
                if source.kind() == io::ErrorKind::AddrInUse {
                    RxeError::PortInUse {
                        addr,
                        holder: holder(roce_port),
                    }
                } else {
                    RxeError::Socket {
                        what: "binding the RoCE socket",
                        addr,
                        source,
                    }
                }
            })?,
        };
        let sock = bound;
        prepare(&sock, local.ip, addr)?;
        let gro = want_gro && sys::enable_gro(&sock);
        let ring = match local.ip {
            IpAddr::V4(v4) if want_ring => {
                let ring = crate::ring::PacketRing::open(v4, roce_port)
                    .map_err(|(what, source)| RxeError::PacketRing { what, addr, source })?;
                // One queue: what the ring takes, the socket drops.
                sys::drop_all(sock.as_fd()).map_err(|source| RxeError::PacketRing {
                    what: "attaching the drop-all filter to the UDP socket",
                    addr,
                    source,
                })?;
                Some(ring)
            }
            IpAddr::V6(_) if want_ring => {
                tracing::info!(%addr, "no packet ring for an IPv6 address: it receives through its socket");
                None
            }
            _ => None,
        };
        let tap = match local.ip {
            // With a ring the receive path sees every IPv4 header: no tap.
            IpAddr::V4(v4) if want_tap && ring.is_none() => match sys::ident_tap(v4, roce_port) {
                Ok(fd) => Some(fd),
                Err(e) => {
                    tracing::warn!(
                        %addr,
                        error = %e,
                        "no IPv4 identification tap (needs CAP_NET_RAW): packets whose \
                         identification cannot be predicted (kernel rxe peers after a loss, \
                         or their first packet) cannot be ICRC-checked in all 32 bits and are \
                         dropped unless RNIC_RXE_IDENT_RECOVERY=1 allows the 15-bit check"
                    );
                    None
                }
            },
            _ => None,
        };
        Ok(Port {
            gid: local.gid,
            ip: local.ip,
            scope_id: local.scope_id,
            netdev: local.netdev.clone(),
            sock,
            gro,
            tap,
            ring,
            netns: NetNs::current().ok(),
        })
    }

    /// The descriptor that becomes readable when a datagram for this port
    /// arrives: the packet ring's socket, or the UDP socket.
    pub fn rx_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        match &self.ring {
            Some(r) => r.fd(),
            None => self.sock.as_fd(),
        }
    }

    /// A send-only socket from this address and UDP port `sport` (rxe's
    /// per-QP source port), DF set, bound in the listening socket's network
    /// namespace whichever thread asks; its packets carry traffic class
    /// (TOS) `tclass` and hop limit (TTL) `hops` (0: the system default).
    pub fn bind_sender(&self, sport: u16, tclass: u8, hops: u8) -> Result<UdpSocket, RxeError> {
        let addr = sockaddr(self.ip, self.scope_id, sport);
        let bind = || UdpSocket::bind(addr);
        let bound = match &self.netns {
            Some(ns) => ns.run(bind),
            None => bind(),
        };
        let sock = bound.map_err(|source| RxeError::Socket {
            what: "binding a source-port socket",
            addr,
            source,
        })?;
        prepare(&sock, self.ip, addr)?;
        if let Some(hops) = sender_hops(tclass, hops) {
            sys::set_tclass_and_hops(&sock, sys::is_v6(&self.ip), tclass, hops).map_err(
                |source| RxeError::Socket {
                    what: "setting the traffic class and hop limit",
                    addr,
                    source,
                },
            )?;
        }
        // It never receives: keep its receive buffer small.
        let _ = nix::sys::socket::setsockopt(&sock, nix::sys::socket::sockopt::RcvBuf, &4096);
        Ok(sock)
    }
}
