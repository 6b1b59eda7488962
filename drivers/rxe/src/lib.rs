//! rnic-rxe: the Soft-RoCE-compatible provider. The `rnic-roce` transport
//! engine over UDP/4791 sockets, speaking RoCEv2 on the wire exactly like
//! Linux `rdma_rxe`, so it talks to kernel rxe peers and to itself.
//!
//! # What it owns
//!
//! * **Devices** ([`RxeDevice`]): one per `rxe:<netdev>` / `rxe:<ip>` /
//!   `rxe`. The GID table is built from the interface's addresses (IPv6
//!   link-local first, as rxe's default GID; then IPv4 as `::ffff:a.b.c.d`;
//!   then the other IPv6 addresses); each address gets a UDP socket bound to
//!   it on port 4791 with `IP_PMTUDISC_DO`.
//! * **The [`rnic_core::Provider`]**: PDs, MRs (any `Arc<dyn Memory>`,
//!   registered in rnic-dma's key table, which the engine's `MemoryAccess`
//!   goes through), CQs (a ring sized to the depth, plus an eventfd
//!   completion channel), RC and UD QPs (the engine's `Qp`), batched posts,
//!   `poll_cq`, `req_notify_cq`, `cq_event_fd`, `wait_cq`. Each QP owns
//!   its engine and its transmit queue; see `device` for who shares what.
//! * **Progress** ([`Progress`]): a thread per device (epoll on the sockets,
//!   a doorbell eventfd and the nearest engine deadline), or caller-driven
//!   (inside `poll_cq` / `post_*` / `wait_cq`).
//! * **Batching**: `recvmmsg` / `sendmmsg`; UDP GSO (equal-sized packets to
//!   one peer leave as one `UDP_SEGMENT` send) and UDP GRO, with fallbacks.
//!   Buffers are preallocated: no allocation per packet.
//! * **Payloads in place**: request and READ-response payloads in memory
//!   that offers direct access (`Memory::direct`) leave as iovecs into the
//!   registered region, the kernel's copy the only one on the sending side
//!   ([`RxeConfig::tx_in_place_min`], `tx_in_place` in [`DeviceStats`]);
//!   other copies into and out of such memory are `rnic_dma::copy`'s bulk
//!   copies.
//! * **ICRC**: filled per packet for the IPv4 identification the kernel will
//!   use (0 with DF on an unconnected socket; 0, 1, 2, … across a GSO send);
//!   verified on receipt in all 32 bits with the predicted identification
//!   (0, the GRO segment index, the sender's previous + 1: kernel rxe peers
//!   use a counter), else with the one the identification tap saw (a raw
//!   socket that sees the headers of every packet whose identification is
//!   not 0; needs CAP_NET_RAW). Without a tap such packets are dropped
//!   (`icrc_unverified`) unless `ident_recovery` (`RNIC_RXE_IDENT_RECOVERY=1`)
//!   accepts them after solving for the identification, a 15-bit check.
//!   Every path and the drops are counted ([`DeviceStats`]).
//! * **Demultiplexing** by BTH DestQP; unknown QPNs are dropped and counted.
//! * **Sharing** ([`share`]): processes opening the same address join one
//!   `SO_REUSEPORT` group on UDP/4791; an eBPF program steers each datagram
//!   to the member owning its DestQP's slot (`qpn >> 16`). Each device hands
//!   out QPNs only from its slot ([`RxeDevice::qpn_range`]). Needs CAP_BPF
//!   and CAP_SYS_ADMIN, else (or with `RNIC_RXE_SHARE=0`) the addresses are
//!   bound exclusively.
//! * **Packet-ring receive** ([`ring`], opt-in: [`RxeConfig::rx_ring`],
//!   `RNIC_RXE_RX_RING=1`): an IPv4 address's datagrams arrive in an
//!   `AF_PACKET` `TPACKET_V2` ring polled in memory (its UDP socket drops
//!   them all: one queue, so a stream is never reordered between two), GSO
//!   datagrams whole with their segment size from the virtio-net header. An
//!   idle busy poll is a load instead of a `recvmmsg`, a datagram needs no
//!   receive system call: the low-latency path for caller-driven devices.
//!   Root (CAP_NET_RAW), Linux 6.2+, exclusive binding.
//! * **Frame transmit** ([`frames`], with the ring; [`RxeConfig::tx_frames`],
//!   `RNIC_RXE_TX_FRAMES=0` turns it off): datagrams and GSO groups to IPv4
//!   peers leave as whole frames through an `AF_PACKET` socket, skipping the
//!   UDP socket's route lookup and IP output, where the next hop the ring
//!   saw is one any receive path takes (an on-link Ethernet neighbour the
//!   kernel's table agrees on; `lo` with `accept_local`/`route_localnet`).
//! * **Receive placement** (opt-in: [`RxeConfig::rx_place`],
//!   `RNIC_RXE_RX_PLACE=1`): while a READ's responses stream in, a socket
//!   port receives each datagram with a scatter list — headers and ICRCs
//!   into the receive slot, payloads straight into the READ's local buffer
//!   (the transport's until the READ completes) — and the QP takes only the
//!   headers once every segment is the predicted response with a verified
//!   ICRC; anything else is put back together and received as usual.
//! * **Fault injection** ([`FaultConfig`], off by default): seeded loss and
//!   reordering of verified packets before demultiplexing, counted.
//!
//! # Invariants
//!
//! * Every received datagram is verified (ICRC) before any QP sees it, and
//!   lands in exactly one outcome counter.
//! * No device-wide lock on the post and poll path: a QP's engine and
//!   transmit queue are behind the QP's own lock (shared with the receive
//!   and timer path that must reach it), a CQ's ring behind its own; the
//!   QPN table is read by the receive path only; an engine call read-locks
//!   the key table for its memory accesses. Locks are taken in one order
//!   (receive path → QPN table → one QP → key table or one CQ ring), never
//!   two QPs' or two CQs' at once, and no call holds two devices' locks.
//! * Moving a QP to RESET or destroying it removes its completions from its
//!   CQs (the provider contract).
//! * The only `unsafe` is in [`sys`], in `bpf` (device sharing: `bpf(2)`,
//!   `SO_ATTACH_REUSEPORT_EBPF`, `SO_COOKIE`, OFD locks), in [`ring`]
//!   (the packet ring's socket, mapping, frame copies and status words) and
//!   in [`frames`] (frame transmit's packet socket); in
//!   [`sys`]: socket options, `sendmmsg`,
//!   `recvmmsg` over stack-built headers (`sendmmsg`'s iovecs point into
//!   the transmit arena and into held regions' direct spans), the
//!   identification tap's raw socket, filters and `recv`, and receive
//!   placement's scatter `recvmsg`; plus one call each where the callers
//!   hold the memory the kernel reads or writes: the transmit flush's
//!   `sendmmsg` over held regions (`tx`) and placement's receive into a
//!   READ's pinned buffer (`device`).
//!
//! # Example
//!
//! ```no_run
//! use rnic_rxe::{RxeConfig, RxeDevice, Target};
//! let dev = RxeDevice::open(&RxeConfig::new(Target::Ip("127.0.0.1".parse()?)))?;
//! let ctx = dev.context();
//! let pd = ctx.alloc_pd()?;
//! let cq = ctx.create_cq(64)?;
//! # let _ = (pd, cq);
//! println!("{}", dev.stats());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod bpf;
mod device;
mod error;
mod fault;
pub mod frames;
#[doc(hidden)]
pub mod fuzzing;
mod gid;
mod ident;
mod mem;
mod port;
mod provider;
mod qpns;
pub mod ring;
pub mod share;
mod stats;
pub mod sys;
mod tx;

pub use device::Progress;
pub use error::RxeError;
pub use fault::FaultConfig;
pub use gid::{LocalAddr, Target, active_mtu, qp_udp_sport, rc_udp_sport, resolve as resolve_gids};
pub use provider::{
    BusyPoll, ProgressScheduling, RXE_WINDOW, RxModeration, RxeAh, RxeConfig, RxeCq, RxeDevice,
    RxeMr, RxePd, RxeProvider, RxeQp, window_for_buffer,
};
pub use qpns::QpnRange;
pub use share::{MemberInfo, share_from_env};
pub use stats::{DeviceStats, RxeStats};
pub use tx::IN_PLACE_MIN as DEFAULT_TX_IN_PLACE_MIN;
