//! Dissect a captured frame or IP datagram down to the RoCE packet, and
//! emit whole datagrams and frames (headers, payload, IPv4 checksum, ICRC).

use super::ip::{PROTOCOL_UDP, ipv4, ipv6, udp};
use super::{
    Error, EtherType, EthernetPacket, EthernetRepr, Header, Ipv4Packet, Ipv4Repr, Ipv6Packet,
    Ipv6Repr, NotRoce, ROCE_V2_PORT, Result, RocePacket, RoceRepr, UdpPacket, UdpRepr, icrc,
};

/// An IPv4 or IPv6 header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpRepr {
    /// IPv4 (20-byte header).
    V4(Ipv4Repr),
    /// IPv6 (40-byte header).
    V6(Ipv6Repr),
}

impl IpRepr {
    /// Header length: 20 or 40.
    pub const fn header_len(&self) -> usize {
        match self {
            IpRepr::V4(_) => ipv4::HEADER_LEN,
            IpRepr::V6(_) => ipv6::HEADER_LEN,
        }
    }

    /// Payload bytes after the header.
    pub const fn payload_len(&self) -> usize {
        match self {
            IpRepr::V4(r) => r.payload_len,
            IpRepr::V6(r) => r.payload_len,
        }
    }

    /// The same header with another payload length.
    #[must_use]
    pub const fn with_payload_len(self, payload_len: usize) -> IpRepr {
        match self {
            IpRepr::V4(r) => IpRepr::V4(Ipv4Repr { payload_len, ..r }),
            IpRepr::V6(r) => IpRepr::V6(Ipv6Repr { payload_len, ..r }),
        }
    }

    /// IPv4 protocol / IPv6 next header.
    pub const fn protocol(&self) -> u8 {
        match self {
            IpRepr::V4(r) => r.protocol,
            IpRepr::V6(r) => r.next_header,
        }
    }

    /// The EtherType that carries this version.
    pub const fn ethertype(&self) -> EtherType {
        match self {
            IpRepr::V4(_) => EtherType::IPV4,
            IpRepr::V6(_) => EtherType::IPV6,
        }
    }

    /// Write the header (IPv4 with its checksum) into the start of `buffer`.
    pub fn emit(&self, buffer: &mut [u8]) -> Result<()> {
        match self {
            IpRepr::V4(r) => r.emit(buffer),
            IpRepr::V6(r) => r.emit(buffer),
        }
    }
}

/// An IP datagram carrying RoCEv2, dissected without copying.
#[derive(Debug, Clone)]
pub struct Datagram<'a> {
    /// The IP header.
    pub ip: IpRepr,
    /// The UDP header.
    pub udp: UdpRepr,
    /// IP header .. end of the IP packet: what [`icrc::verify`] takes.
    pub ip_packet: &'a [u8],
    /// The RoCE packet (the UDP payload), checked.
    pub roce: RocePacket<&'a [u8]>,
}

impl<'a> Datagram<'a> {
    /// Dissect an IP packet (version from the first nibble). Bytes past the
    /// IP length are ignored. Fails with [`Error::NotRoce`] for non-UDP or a
    /// destination port other than 4791, and with the lower layer's error
    /// for malformed headers (bad IPv4 checksum, options, fragments,
    /// lengths) or a malformed RoCE packet. The ICRC is not checked here:
    /// call [`Datagram::verify_icrc`].
    pub fn parse(ip_packet: &'a [u8]) -> Result<Datagram<'a>> {
        let first = *ip_packet.first().ok_or(Error::Truncated {
            header: Header::Ipv4,
            need: 1,
            have: 0,
        })?;
        match first >> 4 {
            6 => Datagram::parse_v6(ip_packet),
            _ => Datagram::parse_v4(ip_packet),
        }
    }

    /// Dissect an IPv4 packet.
    pub fn parse_v4(ip_packet: &'a [u8]) -> Result<Datagram<'a>> {
        let p = Ipv4Packet::new_checked(ip_packet)?;
        let ip = Ipv4Repr::parse(&p)?;
        let end = ip.buffer_len();
        Datagram::finish(IpRepr::V4(ip), ip_packet, ipv4::HEADER_LEN, end)
    }

    /// Dissect an IPv6 packet.
    pub fn parse_v6(ip_packet: &'a [u8]) -> Result<Datagram<'a>> {
        let p = Ipv6Packet::new_checked(ip_packet)?;
        let ip = Ipv6Repr::parse(&p)?;
        let end = ip.buffer_len();
        Datagram::finish(IpRepr::V6(ip), ip_packet, ipv6::HEADER_LEN, end)
    }

    fn finish(ip: IpRepr, buf: &'a [u8], hdr: usize, end: usize) -> Result<Datagram<'a>> {
        if ip.protocol() != PROTOCOL_UDP {
            return Err(Error::NotRoce(NotRoce::IpProtocol(ip.protocol())));
        }
        let ip_packet = buf.get(..end).unwrap_or(buf);
        let udp_bytes = ip_packet.get(hdr..).unwrap_or(&[]);
        let udp_packet = UdpPacket::new_checked(udp_bytes)?;
        let udp = UdpRepr::parse(&udp_packet)?;
        if udp.buffer_len() != udp_bytes.len() {
            return Err(Error::BadLength {
                header: Header::Udp,
                field: udp.buffer_len(),
                available: udp_bytes.len(),
            });
        }
        if udp.dst_port != ROCE_V2_PORT {
            return Err(Error::NotRoce(NotRoce::UdpDstPort(udp.dst_port)));
        }
        let roce = RocePacket::new_checked(udp_bytes.get(udp::HEADER_LEN..).unwrap_or(&[]))?;
        Ok(Datagram {
            ip,
            udp,
            ip_packet,
            roce,
        })
    }

    /// Check the ICRC trailer.
    pub fn verify_icrc(&self) -> Result<()> {
        icrc::verify(self.ip_packet)
    }

    /// The full repr (parses every RoCE header).
    pub fn to_repr(&self) -> Result<DatagramRepr> {
        Ok(DatagramRepr {
            ip: self.ip,
            udp: self.udp,
            roce: RoceRepr::parse(&self.roce)?,
        })
    }
}

/// An Ethernet frame carrying RoCEv2, dissected without copying.
#[derive(Debug, Clone)]
pub struct Frame<'a> {
    /// The Ethernet header.
    pub ethernet: EthernetRepr,
    /// The IP datagram.
    pub datagram: Datagram<'a>,
    /// Bytes after the IP packet (Ethernet padding, an FCS if captured).
    pub trailer: &'a [u8],
}

impl<'a> Frame<'a> {
    /// Dissect an Ethernet frame (optionally 802.1Q-tagged) down to RoCE.
    pub fn parse(frame: &'a [u8]) -> Result<Frame<'a>> {
        let eth = EthernetPacket::new_checked(frame)?;
        let ethernet = EthernetRepr::parse(&eth)?;
        let payload = frame.get(ethernet.buffer_len()..).unwrap_or(&[]);
        let datagram = match ethernet.ethertype {
            EtherType::IPV4 => Datagram::parse_v4(payload)?,
            EtherType::IPV6 => Datagram::parse_v6(payload)?,
            other => return Err(Error::NotRoce(NotRoce::EtherType(other.0))),
        };
        let trailer = payload.get(datagram.ip_packet.len()..).unwrap_or(&[]);
        Ok(Frame {
            ethernet,
            datagram,
            trailer,
        })
    }

    /// The full repr.
    pub fn to_repr(&self) -> Result<FrameRepr> {
        Ok(FrameRepr {
            ethernet: self.ethernet,
            datagram: self.datagram.to_repr()?,
        })
    }
}

/// IP + UDP + RoCE headers of a datagram to emit. The IP and UDP
/// `payload_len` fields are ignored: `emit` derives them from the RoCE repr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DatagramRepr {
    /// IP header.
    pub ip: IpRepr,
    /// UDP header (`checksum` is emitted verbatim; 0 for RoCEv2).
    pub udp: UdpRepr,
    /// RoCE headers and payload length.
    pub roce: RoceRepr,
}

impl DatagramRepr {
    /// IP header + UDP header + RoCE packet.
    pub fn buffer_len(&self) -> usize {
        self.ip.header_len() + udp::HEADER_LEN + self.roce.buffer_len()
    }

    /// Emit the whole IP packet: headers (IPv4 checksum filled), `payload`,
    /// zero pad, and the ICRC. Returns [`DatagramRepr::buffer_len`].
    pub fn emit(&self, buffer: &mut [u8], payload: &[u8]) -> Result<usize> {
        let need = self.buffer_len();
        let have = buffer.len();
        let buf = buffer
            .get_mut(..need)
            .ok_or(Error::BufferTooSmall { need, have })?;
        let roce_len = self.roce.buffer_len();
        let ip = self.ip.with_payload_len(udp::HEADER_LEN + roce_len);
        let udp = UdpRepr {
            payload_len: roce_len,
            ..self.udp
        };
        let (ip_hdr, rest) = buf.split_at_mut(ip.header_len());
        let (udp_hdr, roce) = rest.split_at_mut(udp::HEADER_LEN);
        self.roce.emit(roce, payload)?;
        udp.emit(udp_hdr)?;
        ip.emit(ip_hdr)?;
        icrc::fill(buf)?;
        Ok(need)
    }
}

/// A whole frame to emit: Ethernet header + datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FrameRepr {
    /// Ethernet header (its EtherType should match the IP version).
    pub ethernet: EthernetRepr,
    /// The datagram.
    pub datagram: DatagramRepr,
}

impl FrameRepr {
    /// Ethernet header + datagram (no FCS, no padding to 60 bytes).
    pub fn buffer_len(&self) -> usize {
        self.ethernet.buffer_len() + self.datagram.buffer_len()
    }

    /// Emit the frame. Returns [`FrameRepr::buffer_len`].
    pub fn emit(&self, buffer: &mut [u8], payload: &[u8]) -> Result<usize> {
        let need = self.buffer_len();
        let have = buffer.len();
        let buf = buffer
            .get_mut(..need)
            .ok_or(Error::BufferTooSmall { need, have })?;
        let (eth, rest) = buf.split_at_mut(self.ethernet.buffer_len());
        self.ethernet.emit(eth)?;
        self.datagram.emit(rest, payload)?;
        Ok(need)
    }
}
