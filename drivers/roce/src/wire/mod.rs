//! RoCEv2 wire formats, smoltcp-style.
//!
//! One file per header. Each has a zero-copy `Packet<T: AsRef<[u8]>>` view
//! (a private `mod field` of byte ranges, `new_unchecked` / `new_checked` /
//! `check_len`, field-named getters, `set_*` setters for `T: AsMut<[u8]>`)
//! and a `Repr` with `parse` / `emit` / `buffer_len`. The views never panic:
//! after `check_len` every field is in bounds, and even an unchecked view
//! reads missing bytes as zero instead of indexing out of range.
//!
//! | module | what |
//! |---|---|
//! | [`bth`], [`reth`], [`aeth`], [`immdt`], [`ieth`], [`atomic_eth`], [`atomic_ack_eth`], [`deth`] | the transport headers |
//! | [`opcode`] | the opcode table |
//! | [`roce`] | the whole transport packet BTH..ICRC (the UDP payload) |
//! | [`icrc`] | the invariant CRC, as rxe computes it |
//! | [`ethernet`], [`ip`] | Ethernet (+802.1Q), IPv4, IPv6, UDP |
//! | [`arp`], [`icmpv6`] | ARP (RFC 826) and ICMPv6 neighbour discovery (RFC 4861), for [`crate::neigh`] |
//! | [`frame`] | dissect a captured frame / IP datagram down to RoCE, and emit one |

pub(crate) mod bytes;

pub mod aeth;
pub mod arp;
pub mod atomic_ack_eth;
pub mod atomic_eth;
pub mod bth;
pub mod deth;
mod error;
pub mod ethernet;
pub mod frame;
pub mod icmpv6;
pub mod icrc;
pub mod ieth;
pub mod immdt;
pub mod ip;
pub mod opcode;
pub mod reth;
pub mod roce;

pub use aeth::{CreditCode, NakCode, Packet as AethPacket, Repr as AethRepr, RnrTimer, Syndrome};
pub use atomic_ack_eth::{Packet as AtomicAckEthPacket, Repr as AtomicAckEthRepr};
pub use atomic_eth::{Packet as AtomicEthPacket, Repr as AtomicEthRepr};
pub use bth::{Packet as BthPacket, Repr as BthRepr};
pub use deth::{Packet as DethPacket, Repr as DethRepr};
pub use error::{Error, Header, NdViolation, NotRoce, Result};
pub use ethernet::{
    EtherType, EthernetAddress, Packet as EthernetPacket, Repr as EthernetRepr, VlanTag,
};
pub use frame::{Datagram, DatagramRepr, Frame, FrameRepr, IpRepr};
pub use ieth::{Packet as IethPacket, Repr as IethRepr};
pub use immdt::{Packet as ImmDtPacket, Repr as ImmDtRepr};
pub use ip::ipv4::{Packet as Ipv4Packet, Repr as Ipv4Repr};
pub use ip::ipv6::{Packet as Ipv6Packet, Repr as Ipv6Repr};
pub use ip::udp::{Packet as UdpPacket, ROCE_V2_PORT, Repr as UdpRepr};
pub use opcode::{ExtHeader, Opcode, OpcodeInfo, Operation, PayloadRule, Position, Transport};
pub use reth::{Packet as RethPacket, Repr as RethRepr};
pub use roce::{ICRC_LEN, Packet as RocePacket, Repr as RoceRepr};
