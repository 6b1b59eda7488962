//! rnic-roce: RoCEv2 as a sans-IO library.
//!
//! This crate owns the RoCEv2 wire format for every rnic backend: the
//! software provider that talks to Linux Soft-RoCE (`rdma_rxe`) over
//! UDP/4791, the emulated mlx5 function, and the capture tooling. It does no
//! I/O: callers hand it byte buffers and get views, reprs and errors back.
//!
//! * [`wire`] — smoltcp-style zero-copy views (`Packet<T>`) and reprs for
//!   the transport headers (BTH, RETH, AETH, ImmDt, IETH, AtomicETH,
//!   AtomicAckETH, DETH), the opcode table, the whole RoCE packet
//!   (BTH..ICRC), the ICRC exactly as rxe computes it, and the minimal
//!   Ethernet / IPv4 / IPv6 / UDP layers needed to dissect and emit frames.
//! * [`neigh`] — the L2 neighbour layer of a port without a kernel netdev:
//!   ARP / IPv6 neighbour discovery responder for the port's own addresses
//!   and a resolver with a neighbour cache (states, timers, retries, rate
//!   limits, counters), sans-IO. Its wire formats are [`wire::arp`] and
//!   [`wire::icmpv6`].
//! * [`pcap`] — a classic-pcap reader and writer for golden tests and
//!   capture tools.
//!
//! # Invariants
//!
//! * **No panic on network input.** Every parser returns a typed
//!   [`wire::Error`] (truncated header, bad pad, unknown opcode, ICRC
//!   mismatch, not RoCE, …) for bad bytes. Field accessors read through
//!   checked ranges: after `new_checked` every field is in bounds, and even
//!   a `new_unchecked` view over a short buffer reads zeros rather than
//!   indexing out of range.
//! * **No allocation on the data path.** Parsing borrows the buffer;
//!   emitting writes into a caller's buffer; the ICRC streams over the
//!   packet with its masked headers in a small stack buffer.
//! * **Wire compatibility with rxe**, checked against a real kernel capture
//!   (`tests/capture.rs`): every packet re-emits byte for byte and every
//!   ICRC verifies.
//!
//! # Example
//!
//! Build an RC SEND_ONLY, emit it as the UDP payload a socket would send,
//! fill its ICRC from the addresses, and parse it back:
//!
//! ```
//! use std::net::Ipv4Addr;
//! use rnic_core::{Psn, Qpn};
//! use rnic_roce::wire::{icrc, BthRepr, Opcode, RocePacket, RoceRepr};
//!
//! let mut bth = BthRepr::new(Opcode::RC_SEND_ONLY, Qpn::new(0x11)?, Psn::new(100)?);
//! bth.ack_req = true;
//! let repr = RoceRepr::new(bth, 5);
//! let mut buf = [0u8; 64];
//! let len = repr.emit(&mut buf, b"hello")?; // BTH + 5 bytes + 3 pad + ICRC
//! assert_eq!(len, 24);
//!
//! let (src, dst) = (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2));
//! icrc::fill_v4(src, dst, 0, true, 0xC000, 4791, &mut buf[..len])?;
//!
//! let packet = RocePacket::new_checked(&buf[..len])?;
//! icrc::verify_v4(src, dst, 0, true, 0xC000, 4791, packet.as_bytes())?;
//! assert_eq!(packet.bth().pad_count(), 3);
//! assert_eq!(packet.payload(), b"hello");
//! let back = RoceRepr::parse(&packet)?;
//! assert_eq!((back.bth.dest_qp, back.bth.psn, back.bth.ack_req), (bth.dest_qp, bth.psn, true));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod ident;
pub mod neigh;
pub mod pcap;
pub mod transport;
pub mod wire;
