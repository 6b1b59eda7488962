//! ICMPv6 (RFC 4443) as far as IPv6 neighbour discovery (RFC 4861) needs
//! it: Neighbor Solicitation (135) and Advertisement (136) with their
//! link-layer address options, parsed and emitted; Router Solicitation and
//! Advertisement (133, 134) and Redirect (137) validated and classified so a
//! caller can ignore them safely; every other ICMPv6 message classified by
//! type after its checksum is checked.
//!
//! The checksum covers the IPv6 pseudo-header (source, destination,
//! upper-layer length, next header 58), so parsing takes the IPv6 header:
//! [`Message::parse`] verifies it and applies the validity rules of RFC 4861
//! §6.1 and §7.1 (hop limit 255, code 0, minimum length, no zero-length
//! option, no multicast target, duplicate address detection only to a
//! solicited-node address and without a source link-layer option, no
//! Solicited flag on a multicast advertisement); a message that breaks one
//! is an [`Error::Nd`] naming the rule. [`NdRepr::emit`] fills the checksum.

use std::net::Ipv6Addr;

use super::bytes::{self, read_bytes, read_u8, read_u16, write_bytes, write_u8, write_u16};
use super::ip::{PROTOCOL_ICMPV6, checksum_add, checksum_fold};
use super::{Error, EthernetAddress, Header, Ipv6Repr, NdViolation, Result};

/// The type, code and checksum every ICMPv6 message starts with.
pub const HEADER_LEN: usize = 4;
/// A solicitation or advertisement without options: header, 4 bytes of
/// flags/reserved, 16 bytes of target address.
pub const ND_LEN: usize = 24;
/// One Ethernet link-layer address option: type, length (1 unit), 6 bytes.
pub const LLADDR_OPTION_LEN: usize = 8;

/// The all-nodes multicast address ff02::1, where unsolicited and
/// duplicate-address-detection advertisements go.
pub const ALL_NODES: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);

/// The hop limit every neighbour discovery message is sent with and must
/// arrive with (RFC 4861 §7.1.1): proof it was not forwarded by a router.
pub const ND_HOP_LIMIT: u8 = 255;

mod field {
    use super::bytes::Field;

    pub const TYPE: usize = 0;
    pub const CODE: usize = 1;
    pub const CHECKSUM: Field = 2..4;
    /// The NA flags byte (R, S, O in its top bits).
    pub const FLAGS: usize = 4;
    pub const TARGET: Field = 8..24;
}

/// ICMPv6 message types of neighbour discovery.
pub mod msg_type {
    /// Router Solicitation.
    pub const ROUTER_SOLICIT: u8 = 133;
    /// Router Advertisement.
    pub const ROUTER_ADVERT: u8 = 134;
    /// Neighbor Solicitation.
    pub const NEIGHBOR_SOLICIT: u8 = 135;
    /// Neighbor Advertisement.
    pub const NEIGHBOR_ADVERT: u8 = 136;
    /// Redirect.
    pub const REDIRECT: u8 = 137;
}

/// Neighbour discovery option types carrying a link-layer address.
pub mod option {
    /// Source Link-Layer Address.
    pub const SOURCE_LLADDR: u8 = 1;
    /// Target Link-Layer Address.
    pub const TARGET_LLADDR: u8 = 2;
}

const FLAG_ROUTER: u8 = 0x80;
const FLAG_SOLICITED: u8 = 0x40;
const FLAG_OVERRIDE: u8 = 0x20;

/// The solicited-node multicast address of `addr` (RFC 4291 §2.7.1):
/// ff02::1:ff00:0/104 with `addr`'s low 24 bits. A neighbour solicitation
/// for `addr` is sent there; its MAC is
/// [`EthernetAddress::from_ipv6_multicast`] of it, 33:33:ff:xx:xx:xx.
pub const fn solicited_node(addr: Ipv6Addr) -> Ipv6Addr {
    let o = addr.octets();
    Ipv6Addr::new(
        0xff02,
        0,
        0,
        0,
        0,
        1,
        0xff00 | o[13] as u16,
        ((o[14] as u16) << 8) | o[15] as u16,
    )
}

/// Whether `addr` is a solicited-node multicast address (ff02::1:ffXX:XXXX).
pub fn is_solicited_node(addr: Ipv6Addr) -> bool {
    let o = addr.octets();
    o[..13] == [0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff]
}

/// The one's-complement sum of the IPv6 pseudo-header of an ICMPv6 message
/// of `len` bytes (RFC 8200 §8.1).
fn pseudo_header_sum(src: Ipv6Addr, dst: Ipv6Addr, len: u32) -> u32 {
    let mut sum = checksum_add(0, &src.octets());
    sum = checksum_add(sum, &dst.octets());
    sum = checksum_add(sum, &len.to_be_bytes());
    checksum_add(sum, &[0, 0, 0, PROTOCOL_ICMPV6])
}

/// A read/write view of an ICMPv6 message (the IPv6 payload).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wrap a buffer without checking it (accessors never panic).
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wrap a buffer, checking it holds the 4-byte header.
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let p = Packet::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Check that the buffer holds type, code and checksum. (Each type's
    /// minimum length is a validity rule, checked by [`Message::parse`].)
    pub fn check_len(&self) -> Result<()> {
        bytes::need(Header::Icmpv6, HEADER_LEN, self.buffer.as_ref().len())
    }

    /// Unwrap the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// The message type (135 = Neighbor Solicitation, …).
    pub fn msg_type(&self) -> u8 {
        read_u8(self.b(), field::TYPE)
    }

    /// The code (0 for every neighbour discovery message).
    pub fn code(&self) -> u8 {
        read_u8(self.b(), field::CODE)
    }

    /// The checksum field.
    pub fn checksum(&self) -> u16 {
        read_u16(self.b(), field::CHECKSUM)
    }

    /// The target address of a solicitation, advertisement or redirect.
    pub fn target_addr(&self) -> Ipv6Addr {
        Ipv6Addr::from(read_bytes::<16>(self.b(), field::TARGET))
    }

    /// NA Router flag: the sender is a router.
    pub fn router_flag(&self) -> bool {
        read_u8(self.b(), field::FLAGS) & FLAG_ROUTER != 0
    }

    /// NA Solicited flag: sent in answer to a solicitation.
    pub fn solicited_flag(&self) -> bool {
        read_u8(self.b(), field::FLAGS) & FLAG_SOLICITED != 0
    }

    /// NA Override flag: the advertised address should replace a cached one.
    pub fn override_flag(&self) -> bool {
        read_u8(self.b(), field::FLAGS) & FLAG_OVERRIDE != 0
    }

    /// The checksum the message should carry, sent from `src` to `dst`.
    pub fn compute_checksum(&self, src: Ipv6Addr, dst: Ipv6Addr) -> u16 {
        let b = self.b();
        let len = u32::try_from(b.len()).unwrap_or(u32::MAX);
        let mut sum = pseudo_header_sum(src, dst, len);
        sum = checksum_add(sum, b.get(..field::CHECKSUM.start).unwrap_or(b));
        sum = checksum_add(sum, b.get(field::CHECKSUM.end..).unwrap_or(&[]));
        checksum_fold(sum)
    }

    /// Check the checksum of a message sent from `src` to `dst`.
    pub fn verify_checksum(&self, src: Ipv6Addr, dst: Ipv6Addr) -> Result<()> {
        let (computed, found) = (self.compute_checksum(src, dst), self.checksum());
        if computed == found {
            Ok(())
        } else {
            Err(Error::Icmpv6Checksum { computed, found })
        }
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    fn m(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }

    /// Set the message type.
    pub fn set_msg_type(&mut self, v: u8) {
        write_u8(self.m(), field::TYPE, v);
    }

    /// Set the code.
    pub fn set_code(&mut self, v: u8) {
        write_u8(self.m(), field::CODE, v);
    }

    /// Set the checksum field.
    pub fn set_checksum(&mut self, v: u16) {
        write_u16(self.m(), field::CHECKSUM, v);
    }

    /// Set the NA flags byte (and zero the 3 reserved bytes after it).
    pub fn set_advert_flags(&mut self, flags: AdvertFlags) {
        let mut byte = 0;
        for (on, bit) in [
            (flags.router, FLAG_ROUTER),
            (flags.solicited, FLAG_SOLICITED),
            (flags.override_, FLAG_OVERRIDE),
        ] {
            if on {
                byte |= bit;
            }
        }
        write_bytes(self.m(), field::FLAGS..field::FLAGS + 4, [byte, 0, 0, 0]);
    }

    /// Set the target address.
    pub fn set_target_addr(&mut self, a: Ipv6Addr) {
        write_bytes(self.m(), field::TARGET, a.octets());
    }

    /// Compute and write the checksum for a message sent from `src` to `dst`
    /// (the buffer must be exactly the message).
    pub fn fill_checksum(&mut self, src: Ipv6Addr, dst: Ipv6Addr) {
        let c = self.compute_checksum(src, dst);
        self.set_checksum(c);
    }
}

/// The flags of a Neighbor Advertisement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AdvertFlags {
    /// R: the sender is a router.
    pub router: bool,
    /// S: the advertisement answers a solicitation to the sender.
    pub solicited: bool,
    /// O: the link-layer address should override a cached one.
    pub override_: bool,
}

/// A Neighbor Solicitation or Advertisement (Ethernet link-layer options).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NdRepr {
    /// Type 135: who has `target`? (`lladdr`: the Source Link-Layer Address option.)
    Solicit {
        /// The address being resolved or checked.
        target: Ipv6Addr,
        /// The solicitor's MAC, absent in duplicate address detection.
        lladdr: Option<EthernetAddress>,
    },
    /// Type 136: `target` is at `lladdr` (the Target Link-Layer Address option).
    Advert {
        /// R, S, O.
        flags: AdvertFlags,
        /// The advertised address.
        target: Ipv6Addr,
        /// The advertiser's MAC for `target`.
        lladdr: Option<EthernetAddress>,
    },
}

impl NdRepr {
    /// The message type: 135 or 136.
    pub const fn msg_type(&self) -> u8 {
        match self {
            NdRepr::Solicit { .. } => msg_type::NEIGHBOR_SOLICIT,
            NdRepr::Advert { .. } => msg_type::NEIGHBOR_ADVERT,
        }
    }

    /// The target address.
    pub const fn target(&self) -> Ipv6Addr {
        match self {
            NdRepr::Solicit { target, .. } | NdRepr::Advert { target, .. } => *target,
        }
    }

    /// The link-layer address option's MAC, if any.
    pub const fn lladdr(&self) -> Option<EthernetAddress> {
        match self {
            NdRepr::Solicit { lladdr, .. } | NdRepr::Advert { lladdr, .. } => *lladdr,
        }
    }

    /// 24, or 32 with the link-layer address option.
    pub const fn buffer_len(&self) -> usize {
        if self.lladdr().is_some() {
            ND_LEN + LLADDR_OPTION_LEN
        } else {
            ND_LEN
        }
    }

    /// Write the message into the start of `buffer`, its checksum computed
    /// for `src` → `dst`; returns its length ([`NdRepr::buffer_len`]).
    pub fn emit(&self, src: Ipv6Addr, dst: Ipv6Addr, buffer: &mut [u8]) -> Result<usize> {
        let len = self.buffer_len();
        let have = buffer.len();
        let out = buffer
            .get_mut(..len)
            .ok_or(Error::BufferTooSmall { need: len, have })?;
        out.fill(0);
        let mut p = Packet::new_unchecked(&mut *out);
        p.set_msg_type(self.msg_type());
        p.set_code(0);
        let option = match *self {
            NdRepr::Solicit { .. } => option::SOURCE_LLADDR,
            NdRepr::Advert { flags, .. } => {
                p.set_advert_flags(flags);
                option::TARGET_LLADDR
            }
        };
        p.set_target_addr(self.target());
        if let Some(mac) = self.lladdr() {
            let [a, b, c, d, e, f] = mac.0;
            write_bytes(
                p.m(),
                ND_LEN..ND_LEN + LLADDR_OPTION_LEN,
                [option, 1, a, b, c, d, e, f],
            );
        }
        p.fill_checksum(src, dst);
        Ok(len)
    }
}

/// An ICMPv6 message, classified and validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Message {
    /// A valid Neighbor Solicitation or Advertisement.
    Nd(NdRepr),
    /// A valid Router Solicitation (133): routers' business.
    RouterSolicit,
    /// A valid Router Advertisement (134): rnic does not configure
    /// addresses or routes from it.
    RouterAdvert,
    /// A valid Redirect (137): rnic has no routes to redirect.
    Redirect,
    /// Any other ICMPv6 message (echo, errors, MLD, …), checksum verified.
    Other {
        /// The message type.
        msg_type: u8,
        /// The code.
        code: u8,
    },
}

impl Message {
    /// Validate and classify the ICMPv6 message `packet` carried by the IPv6
    /// header `ip` (whose payload it must be exactly): the checksum over the
    /// pseudo-header, then for types 133–137 the rules of RFC 4861 §6.1.1,
    /// §6.1.2, §7.1.1, §7.1.2 and §8.1 that need no state.
    pub fn parse<T: AsRef<[u8]>>(ip: &Ipv6Repr, packet: &Packet<T>) -> Result<Message> {
        packet.check_len()?;
        packet.verify_checksum(ip.src_addr, ip.dst_addr)?;
        let t = packet.msg_type();
        let min = match t {
            msg_type::ROUTER_SOLICIT => 8,
            msg_type::ROUTER_ADVERT => 16,
            msg_type::NEIGHBOR_SOLICIT | msg_type::NEIGHBOR_ADVERT => ND_LEN,
            msg_type::REDIRECT => 40,
            _ => {
                return Ok(Message::Other {
                    msg_type: t,
                    code: packet.code(),
                });
            }
        };
        let nd = |v| Err(Error::Nd(v));
        if ip.hop_limit != ND_HOP_LIMIT {
            return nd(NdViolation::HopLimit(ip.hop_limit));
        }
        if packet.code() != 0 {
            return nd(NdViolation::Code(packet.code()));
        }
        let b = packet.b();
        if b.len() < min {
            return nd(NdViolation::Length { len: b.len(), min });
        }
        let options = b.get(min..).unwrap_or(&[]);
        let lladdr_kind = match t {
            msg_type::NEIGHBOR_ADVERT => option::TARGET_LLADDR,
            _ => option::SOURCE_LLADDR,
        };
        let lladdr = link_layer_option(options, lladdr_kind)?;
        let unspecified_src = ip.src_addr.is_unspecified();
        match t {
            msg_type::ROUTER_SOLICIT if unspecified_src && lladdr.is_some() => {
                nd(NdViolation::DadSourceLinkLayer)
            }
            msg_type::ROUTER_SOLICIT => Ok(Message::RouterSolicit),
            msg_type::ROUTER_ADVERT => Ok(Message::RouterAdvert),
            msg_type::REDIRECT => Ok(Message::Redirect),
            _ => {
                let target = packet.target_addr();
                if target.is_multicast() {
                    return nd(NdViolation::MulticastTarget);
                }
                if t == msg_type::NEIGHBOR_SOLICIT {
                    if unspecified_src && !is_solicited_node(ip.dst_addr) {
                        return nd(NdViolation::DadDestination);
                    }
                    if unspecified_src && lladdr.is_some() {
                        return nd(NdViolation::DadSourceLinkLayer);
                    }
                    return Ok(Message::Nd(NdRepr::Solicit { target, lladdr }));
                }
                let flags = AdvertFlags {
                    router: packet.router_flag(),
                    solicited: packet.solicited_flag(),
                    override_: packet.override_flag(),
                };
                if flags.solicited && ip.dst_addr.is_multicast() {
                    return nd(NdViolation::SolicitedMulticast);
                }
                Ok(Message::Nd(NdRepr::Advert {
                    flags,
                    target,
                    lladdr,
                }))
            }
        }
    }
}

/// Walk the options, checking every length (RFC 4861 §4.6: a zero length
/// discards the message), and return the MAC of the first option of type
/// `kind`. Unknown options are skipped, later duplicates ignored.
fn link_layer_option(mut options: &[u8], kind: u8) -> Result<Option<EthernetAddress>> {
    let mut found = None;
    while let [t, units, ..] = *options {
        let len = usize::from(units) * 8;
        let Some(body) = options.get(..len).filter(|_| len > 0) else {
            return Err(Error::Nd(NdViolation::OptionLength { option: t }));
        };
        if t == kind && found.is_none() {
            if units != 1 {
                return Err(Error::Nd(NdViolation::LinkLayerOption { option: t, units }));
            }
            found = Some(EthernetAddress(read_bytes(body, 2..8)));
        }
        options = options.get(len..).unwrap_or(&[]);
    }
    if let [t] = *options {
        return Err(Error::Nd(NdViolation::OptionLength { option: t }));
    }
    Ok(found)
}

#[cfg(test)]
mod tests;
