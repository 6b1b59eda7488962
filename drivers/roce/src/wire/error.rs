//! The wire layer's error type.

use core::fmt;

use super::opcode::{ExtHeader, Opcode};

/// Which header (or trailer) an [`Error`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Header {
    /// Ethernet II header (with or without an 802.1Q tag).
    Ethernet,
    /// IPv4 header.
    Ipv4,
    /// IPv6 header.
    Ipv6,
    /// UDP header.
    Udp,
    /// Base Transport Header.
    Bth,
    /// RDMA Extended Transport Header.
    Reth,
    /// ACK Extended Transport Header.
    Aeth,
    /// Immediate data.
    ImmDt,
    /// Invalidate Extended Transport Header.
    Ieth,
    /// Atomic Extended Transport Header.
    AtomicEth,
    /// Atomic ACK Extended Transport Header.
    AtomicAckEth,
    /// Datagram Extended Transport Header.
    Deth,
    /// The 16 reserved bytes of a CNP.
    CnpReserved,
    /// The 4-byte ICRC trailer.
    Icrc,
    /// An ARP packet (RFC 826).
    Arp,
    /// An ICMPv6 message (RFC 4443), neighbour discovery included.
    Icmpv6,
}

impl From<ExtHeader> for Header {
    fn from(h: ExtHeader) -> Header {
        match h {
            ExtHeader::Reth => Header::Reth,
            ExtHeader::Aeth => Header::Aeth,
            ExtHeader::ImmDt => Header::ImmDt,
            ExtHeader::Ieth => Header::Ieth,
            ExtHeader::AtomicEth => Header::AtomicEth,
            ExtHeader::AtomicAckEth => Header::AtomicAckEth,
            ExtHeader::Deth => Header::Deth,
            ExtHeader::CnpReserved => Header::CnpReserved,
        }
    }
}

impl fmt::Display for Header {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Header::Ethernet => "Ethernet",
            Header::Ipv4 => "IPv4",
            Header::Ipv6 => "IPv6",
            Header::Udp => "UDP",
            Header::Bth => "BTH",
            Header::Reth => "RETH",
            Header::Aeth => "AETH",
            Header::ImmDt => "ImmDt",
            Header::Ieth => "IETH",
            Header::AtomicEth => "AtomicETH",
            Header::AtomicAckEth => "AtomicAckETH",
            Header::Deth => "DETH",
            Header::CnpReserved => "CNP reserved bytes",
            Header::Icrc => "ICRC",
            Header::Arp => "ARP",
            Header::Icmpv6 => "ICMPv6",
        })
    }
}

/// Why a well-formed frame or datagram is not RoCEv2.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum NotRoce {
    /// The EtherType is neither IPv4 (0x0800) nor IPv6 (0x86DD).
    EtherType(u16),
    /// The IP protocol / next header is not UDP (17).
    IpProtocol(u8),
    /// The UDP destination port is not 4791.
    UdpDstPort(u16),
}

impl fmt::Display for NotRoce {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotRoce::EtherType(t) => write!(f, "EtherType {t:#06x} is not IPv4 or IPv6"),
            NotRoce::IpProtocol(p) => write!(f, "IP protocol {p} is not UDP (17)"),
            NotRoce::UdpDstPort(p) => write!(f, "UDP destination port {p} is not 4791"),
        }
    }
}

/// Which validity rule of RFC 4861 (§6.1, §7.1) a neighbour discovery
/// message breaks. Nodes silently discard such messages; rnic counts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum NdViolation {
    /// The IPv6 hop limit is not 255, so the message may come from off-link.
    HopLimit(u8),
    /// The ICMPv6 code is not 0.
    Code(u8),
    /// The message is shorter than its type's fixed part.
    Length {
        /// The ICMPv6 message length.
        len: usize,
        /// The minimum for its type.
        min: usize,
    },
    /// An option has length 0 or runs past the end of the message.
    OptionLength {
        /// The option's type.
        option: u8,
    },
    /// A link-layer address option of the wrong length for Ethernet (not 1 unit of 8 bytes).
    LinkLayerOption {
        /// The option's type.
        option: u8,
        /// Its length in units of 8 bytes.
        units: u8,
    },
    /// The target address of a solicitation or advertisement is multicast.
    MulticastTarget,
    /// A solicitation from the unspecified address (duplicate address
    /// detection) is not sent to a solicited-node multicast address.
    DadDestination,
    /// A solicitation from the unspecified address carries a source
    /// link-layer address option.
    DadSourceLinkLayer,
    /// A multicast advertisement has the Solicited flag set.
    SolicitedMulticast,
}

impl fmt::Display for NdViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NdViolation::HopLimit(h) => write!(f, "hop limit {h} is not 255"),
            NdViolation::Code(c) => write!(f, "ICMPv6 code {c} is not 0"),
            NdViolation::Length { len, min } => {
                write!(
                    f,
                    "{len}-byte message is shorter than its {min}-byte fixed part"
                )
            }
            NdViolation::OptionLength { option } => {
                write!(f, "option {option} has length 0 or runs past the end")
            }
            NdViolation::LinkLayerOption { option, units } => write!(
                f,
                "link-layer address option {option} is {units} units long, Ethernet needs 1"
            ),
            NdViolation::MulticastTarget => f.write_str("target address is multicast"),
            NdViolation::DadDestination => f.write_str(
                "solicitation from :: is not sent to the target's solicited-node address",
            ),
            NdViolation::DadSourceLinkLayer => {
                f.write_str("solicitation from :: carries a source link-layer address")
            }
            NdViolation::SolicitedMulticast => {
                f.write_str("advertisement to a multicast address has the Solicited flag")
            }
        }
    }
}

/// Everything that can go wrong parsing or emitting RoCEv2 wire data.
///
/// Every parser in [`crate::wire`] returns one of these for bad input; none
/// panics, whatever the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The buffer ends before `header` does.
    #[error("truncated {header}: need {need} bytes, have {have}")]
    Truncated {
        /// The header that does not fit.
        header: Header,
        /// Bytes needed up to the end of that header.
        need: usize,
        /// Bytes available.
        have: usize,
    },
    /// BTH PadCnt claims more pad bytes than lie between the headers and the ICRC.
    #[error("BTH pad count {pad} exceeds the {available} bytes between headers and ICRC")]
    BadPad {
        /// The PadCnt field.
        pad: u8,
        /// Payload plus pad bytes actually present.
        available: usize,
    },
    /// The ICRC trailer does not match the packet.
    #[error("ICRC mismatch: computed {computed:#010x}, trailer holds {found:#010x}")]
    IcrcMismatch {
        /// The ICRC computed over the packet.
        computed: u32,
        /// The ICRC found in the trailer (read little-endian).
        found: u32,
    },
    /// The BTH opcode is not one this crate knows (RD, reserved, vendor).
    #[error("unknown or unsupported BTH opcode {0:#04x}")]
    UnknownOpcode(u8),
    /// The frame or datagram is well-formed but not RoCEv2.
    #[error("not RoCEv2: {0}")]
    NotRoce(NotRoce),
    /// The IP version nibble contradicts the EtherType (or is neither 4 nor 6).
    #[error("IP version {found} where version {expected} was expected")]
    IpVersion {
        /// The version the context requires.
        expected: u8,
        /// The version nibble found.
        found: u8,
    },
    /// An IPv4 header with options (IHL other than 5); RoCEv2 (and rxe's ICRC) assume none.
    #[error("IPv4 header length {ihl} words: options are not supported (IHL must be 5)")]
    Ipv4Options {
        /// The IHL field (header length in 32-bit words).
        ihl: u8,
    },
    /// A fragmented IPv4 packet; RoCEv2 packets are sent with DF and never fragmented.
    #[error("IPv4 fragment (more fragments {more_fragments}, offset {offset}) cannot carry RoCEv2")]
    Ipv4Fragment {
        /// The MF flag.
        more_fragments: bool,
        /// The fragment offset in 8-byte units.
        offset: u16,
    },
    /// The IPv4 header checksum is wrong.
    #[error("IPv4 header checksum {found:#06x}, expected {computed:#06x}")]
    Ipv4Checksum {
        /// The checksum computed over the header.
        computed: u16,
        /// The checksum field.
        found: u16,
    },
    /// A length field disagrees with the bytes available.
    #[error("{header} length field says {field} bytes, but {available} are available")]
    BadLength {
        /// The header whose length field is wrong.
        header: Header,
        /// The value of the length field (in bytes).
        field: usize,
        /// Bytes actually available (or the minimum allowed, when the field is too small).
        available: usize,
    },
    /// Bytes between the headers and the ICRC of an opcode that carries no payload.
    #[error("opcode {opcode} carries no payload, but {len} payload bytes are present")]
    UnexpectedPayload {
        /// The packet's opcode.
        opcode: Opcode,
        /// Payload bytes found.
        len: usize,
    },
    /// A repr lacks an extension header its opcode requires.
    #[error("opcode {opcode} requires a {header} but the repr has none")]
    MissingHeader {
        /// The repr's opcode.
        opcode: Opcode,
        /// The missing header.
        header: ExtHeader,
    },
    /// A repr carries an extension header its opcode does not have.
    #[error("opcode {opcode} has no {header} but the repr carries one")]
    UnexpectedHeader {
        /// The repr's opcode.
        opcode: Opcode,
        /// The extra header.
        header: ExtHeader,
    },
    /// The payload passed to `emit` differs in length from the repr's `payload_len`.
    #[error("payload of {given} bytes passed for a repr of {expected}")]
    PayloadLength {
        /// The repr's payload length.
        expected: usize,
        /// The length of the slice passed.
        given: usize,
    },
    /// An ARP packet for another hardware or protocol type than Ethernet/IPv4.
    #[error(
        "ARP hardware type {htype}, protocol {ptype:#06x}, address lengths {hlen}/{plen}: only Ethernet/IPv4 (1, 0x0800, 6/4) is spoken"
    )]
    ArpFormat {
        /// Hardware type (1 = Ethernet).
        htype: u16,
        /// Protocol type (0x0800 = IPv4).
        ptype: u16,
        /// Hardware address length.
        hlen: u8,
        /// Protocol address length.
        plen: u8,
    },
    /// An ARP operation other than request (1) or reply (2), e.g. RARP.
    #[error("ARP operation {0} is neither request (1) nor reply (2)")]
    ArpOperation(u16),
    /// The ICMPv6 checksum (over the IPv6 pseudo-header) is wrong.
    #[error("ICMPv6 checksum {found:#06x}, expected {computed:#06x}")]
    Icmpv6Checksum {
        /// The checksum computed over pseudo-header and message.
        computed: u16,
        /// The checksum field.
        found: u16,
    },
    /// A neighbour discovery message that RFC 4861 says to discard.
    #[error("invalid neighbour discovery message: {0}")]
    Nd(NdViolation),
    /// The output buffer is too small to emit into.
    #[error("buffer of {have} bytes is too small: {need} needed")]
    BufferTooSmall {
        /// Bytes needed.
        need: usize,
        /// Bytes available.
        have: usize,
    },
    /// The packet does not fit a 16-bit length field of `header`.
    #[error("{len} bytes do not fit the 16-bit length field of {header}")]
    TooLong {
        /// The header whose length field overflows.
        header: Header,
        /// The length that does not fit.
        len: usize,
    },
}

/// `Result` with the wire [`Error`].
pub type Result<T> = core::result::Result<T, Error>;
