//! Newtypes for the numbers that travel between verbs objects and the wire.
//!
//! Each one rejects values that do not fit its field (a QPN is 24 bits, an
//! MTU is one of five sizes) at construction, so code that holds one never
//! has to re-check it.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use crate::error::ValueError;

const MASK24: u32 = 0x00FF_FFFF;

/// A queue pair number: 24 bits on the wire (BTH DestQP, DETH SrcQP).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Qpn(u32);

impl Qpn {
    /// The largest representable QPN.
    pub const MAX: u32 = MASK24;
    /// QP1, the general services interface (CM MADs).
    pub const GSI: Qpn = Qpn(1);

    /// A QPN, or an error when `value` does not fit 24 bits.
    pub const fn new(value: u32) -> Result<Qpn, ValueError> {
        if value > MASK24 {
            Err(ValueError::Qpn(value))
        } else {
            Ok(Qpn(value))
        }
    }

    /// The low 24 bits of `value`: how a QPN is read out of a wire field.
    pub const fn from_wire(value: u32) -> Qpn {
        Qpn(value & MASK24)
    }

    /// The numeric value (always < 2^24).
    pub const fn get(self) -> u32 {
        self.0
    }
}

impl fmt::Display for Qpn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#08x}", self.0)
    }
}

/// A packet sequence number: 24 bits that wrap.
///
/// Ordering is windowed like a TCP sequence number: `a` is before `b` when
/// `b` lies in the 2^23 PSNs after `a` (rxe's `psn_compare`). That is why
/// `Psn` implements no `Ord`: use [`Psn::cmp_window`], [`Psn::is_before`]
/// and [`Psn::distance_to`], which are only meaningful for PSNs less than
/// 2^23 apart — always true for the PSNs of one queue pair's window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Psn(u32);

impl Psn {
    /// Number of distinct PSNs.
    pub const MODULUS: u32 = 1 << 24;
    /// Half the sequence space: the largest distance the windowed compare handles.
    pub const HALF: u32 = 1 << 23;

    /// A PSN, or an error when `value` does not fit 24 bits.
    pub const fn new(value: u32) -> Result<Psn, ValueError> {
        if value > MASK24 {
            Err(ValueError::Psn(value))
        } else {
            Ok(Psn(value))
        }
    }

    /// The low 24 bits of `value` (how a PSN is read from a wire field or
    /// derived from a random number, as ibv_rc_pingpong does with
    /// `lrand48() & 0xffffff`).
    pub const fn from_wire(value: u32) -> Psn {
        Psn(value & MASK24)
    }

    /// The numeric value (always < 2^24).
    pub const fn get(self) -> u32 {
        self.0
    }

    /// `self + n` modulo 2^24.
    #[must_use]
    pub const fn wrapping_add(self, n: u32) -> Psn {
        Psn(self.0.wrapping_add(n) & MASK24)
    }

    /// `self - n` modulo 2^24.
    #[must_use]
    pub const fn wrapping_sub(self, n: u32) -> Psn {
        Psn(self.0.wrapping_sub(n) & MASK24)
    }

    /// The next PSN.
    #[must_use]
    pub const fn next(self) -> Psn {
        self.wrapping_add(1)
    }

    /// Signed distance from `self` to `other`, in `-2^23 .. 2^23`:
    /// positive when `other` comes after `self`.
    pub const fn distance_to(self, other: Psn) -> i32 {
        // Shift the 24-bit difference into the top of an i32 and back:
        // exactly rxe's `psn_compare`, as a distance.
        ((other.0.wrapping_sub(self.0) << 8) as i32) >> 8
    }

    /// Windowed comparison: `Less` when `self` comes before `other`.
    pub const fn cmp_window(self, other: Psn) -> std::cmp::Ordering {
        let d = self.distance_to(other);
        if d > 0 {
            std::cmp::Ordering::Less
        } else if d < 0 {
            std::cmp::Ordering::Greater
        } else {
            std::cmp::Ordering::Equal
        }
    }

    /// `self` comes strictly before `other` in the window.
    pub const fn is_before(self, other: Psn) -> bool {
        self.distance_to(other) > 0
    }

    /// `self` comes strictly after `other` in the window.
    pub const fn is_after(self, other: Psn) -> bool {
        self.distance_to(other) < 0
    }

    /// `self` lies in `[start, start + len)` modulo 2^24.
    pub const fn in_range(self, start: Psn, len: u32) -> bool {
        (self.0.wrapping_sub(start.0) & MASK24) < len
    }
}

impl fmt::Display for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#08x}", self.0)
    }
}

macro_rules! key_newtype {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(pub u32);

        impl $name {
            /// The raw 32-bit key.
            pub const fn get(self) -> u32 {
                self.0
            }

            /// The low 8 bits: the "key" part a driver varies on every
            /// registration so stale or guessed keys are rejected.
            pub const fn key_byte(self) -> u8 {
                self.0 as u8
            }

            /// The upper 24 bits: the index of the memory-key table entry.
            pub const fn index(self) -> u32 {
                self.0 >> 8
            }

            /// A key from a table index (24 bits) and a key byte.
            pub const fn from_parts(index: u32, key_byte: u8) -> $name {
                $name((index << 8) | key_byte as u32)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{:#010x}", self.0)
            }
        }
    };
}

key_newtype!(
    /// A local memory key: names a registered region in a local SGE.
    Lkey
);
key_newtype!(
    /// A remote memory key: names a registered region to the peer (RETH, AtomicETH, IETH).
    Rkey
);

/// An I/O virtual address: what the device (or the peer, for remote keys)
/// uses to name bytes of a registered region.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Iova(pub u64);

impl Iova {
    /// The raw address.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// `self + off`, or `None` on overflow.
    pub const fn checked_add(self, off: u64) -> Option<Iova> {
        match self.0.checked_add(off) {
            Some(v) => Some(Iova(v)),
            None => None,
        }
    }
}

impl fmt::Display for Iova {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#018x}", self.0)
    }
}

/// A path MTU: the payload bytes of one packet. Only the five IB sizes exist.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mtu {
    /// 256 bytes (`IB_MTU_256` = 1).
    Mtu256,
    /// 512 bytes (2).
    Mtu512,
    /// 1024 bytes (3): what a 1500-byte Ethernet MTU gives. The default.
    #[default]
    Mtu1024,
    /// 2048 bytes (4).
    Mtu2048,
    /// 4096 bytes (5): what a 9000-byte Ethernet MTU gives.
    Mtu4096,
}

impl Mtu {
    /// All five sizes, smallest first.
    pub const ALL: [Mtu; 5] = [
        Mtu::Mtu256,
        Mtu::Mtu512,
        Mtu::Mtu1024,
        Mtu::Mtu2048,
        Mtu::Mtu4096,
    ];

    /// Payload bytes per packet.
    pub const fn bytes(self) -> u32 {
        256 << (self.to_enum() - 1)
    }

    /// The verbs/PRM encoding (`enum ib_mtu`: 1 = 256 … 5 = 4096).
    pub const fn to_enum(self) -> u8 {
        match self {
            Mtu::Mtu256 => 1,
            Mtu::Mtu512 => 2,
            Mtu::Mtu1024 => 3,
            Mtu::Mtu2048 => 4,
            Mtu::Mtu4096 => 5,
        }
    }

    /// From the verbs/PRM encoding.
    pub const fn from_enum(value: u8) -> Result<Mtu, ValueError> {
        match value {
            1 => Ok(Mtu::Mtu256),
            2 => Ok(Mtu::Mtu512),
            3 => Ok(Mtu::Mtu1024),
            4 => Ok(Mtu::Mtu2048),
            5 => Ok(Mtu::Mtu4096),
            _ => Err(ValueError::MtuEnum(value)),
        }
    }

    /// From a byte count, which must be exactly one of the five sizes.
    pub const fn from_bytes(bytes: u32) -> Result<Mtu, ValueError> {
        match bytes {
            256 => Ok(Mtu::Mtu256),
            512 => Ok(Mtu::Mtu512),
            1024 => Ok(Mtu::Mtu1024),
            2048 => Ok(Mtu::Mtu2048),
            4096 => Ok(Mtu::Mtu4096),
            _ => Err(ValueError::MtuBytes(bytes)),
        }
    }

    /// The largest path MTU an Ethernet MTU carries, as rxe derives it
    /// (subtract 80 header bytes, round down to a size; 1500 → 1024,
    /// 9000 → 4096); 256 when the link is smaller than that.
    pub const fn from_ethernet_mtu(eth_mtu: u32) -> Mtu {
        let room = eth_mtu.saturating_sub(80);
        if room >= 4096 {
            Mtu::Mtu4096
        } else if room >= 2048 {
            Mtu::Mtu2048
        } else if room >= 1024 {
            Mtu::Mtu1024
        } else if room >= 512 {
            Mtu::Mtu512
        } else {
            Mtu::Mtu256
        }
    }

    /// Packets a message of `len` bytes takes (a zero-byte message takes one).
    pub const fn packets_for(self, len: u64) -> u64 {
        if len == 0 {
            1
        } else {
            len.div_ceil(self.bytes() as u64)
        }
    }
}

impl fmt::Display for Mtu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.bytes())
    }
}

/// A 16-byte global identifier. For RoCEv2 it is an IPv6 address, or the
/// IPv4-mapped form `::ffff:a.b.c.d` for IPv4.
///
/// `Display` prints the address form (`::ffff:10.0.0.1`, `fe80::1`);
/// [`Gid::to_hex`] / [`Gid::from_hex`] give the 32-hex-digit form that
/// ibv_rc_pingpong puts on its exchange wire.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The all-zero GID (an unset table entry).
    pub const ZERO: Gid = Gid([0; 16]);

    /// The raw bytes, in wire order.
    pub const fn raw(&self) -> &[u8; 16] {
        &self.0
    }

    /// The IPv4-mapped GID for `addr`.
    pub const fn from_ipv4(addr: Ipv4Addr) -> Gid {
        let o = addr.octets();
        Gid([
            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, o[0], o[1], o[2], o[3],
        ])
    }

    /// The GID of an IPv6 address (its 16 bytes).
    pub const fn from_ipv6(addr: Ipv6Addr) -> Gid {
        Gid(addr.octets())
    }

    /// The GID of an IP address (IPv4 addresses are mapped).
    pub const fn from_ip(addr: IpAddr) -> Gid {
        match addr {
            IpAddr::V4(a) => Gid::from_ipv4(a),
            IpAddr::V6(a) => Gid::from_ipv6(a),
        }
    }

    /// `Some(ipv4)` when this is an IPv4-mapped GID (RoCEv2 over IPv4).
    pub const fn to_ipv4(&self) -> Option<Ipv4Addr> {
        let b = &self.0;
        if b[0] == 0
            && b[1] == 0
            && b[2] == 0
            && b[3] == 0
            && b[4] == 0
            && b[5] == 0
            && b[6] == 0
            && b[7] == 0
            && b[8] == 0
            && b[9] == 0
            && b[10] == 0xff
            && b[11] == 0xff
        {
            Some(Ipv4Addr::new(b[12], b[13], b[14], b[15]))
        } else {
            None
        }
    }

    /// The IP address the GID stands for: IPv4 for mapped GIDs, else IPv6.
    pub const fn to_ip(&self) -> IpAddr {
        match self.to_ipv4() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from_octets(self.0)),
        }
    }

    /// The link-local GID derived from a MAC address (fe80::/64 + modified
    /// EUI-64), what RoCE ports expose at index 0.
    pub const fn link_local_from_mac(mac: [u8; 6]) -> Gid {
        Gid([
            0xfe,
            0x80,
            0,
            0,
            0,
            0,
            0,
            0,
            mac[0] ^ 0x02,
            mac[1],
            mac[2],
            0xff,
            0xfe,
            mac[3],
            mac[4],
            mac[5],
        ])
    }

    /// The 32 lower-case hex digits of the raw bytes (ibv_rc_pingpong's wire form).
    pub fn to_hex(&self) -> String {
        use fmt::Write as _;
        let mut s = String::with_capacity(32);
        for b in self.0 {
            // Writing into a String cannot fail.
            let _ = write!(s, "{b:02x}");
        }
        s
    }

    /// Parse exactly 32 hex digits (either case).
    pub fn from_hex(s: &str) -> Result<Gid, ValueError> {
        let bytes = s.as_bytes();
        if bytes.len() != 32 {
            return Err(ValueError::GidHex(s.to_owned()));
        }
        let mut out = [0u8; 16];
        for (i, pair) in bytes.chunks_exact(2).enumerate() {
            let hi = hex_digit(pair[0]).ok_or_else(|| ValueError::GidHex(s.to_owned()))?;
            let lo = hex_digit(pair[1]).ok_or_else(|| ValueError::GidHex(s.to_owned()))?;
            out[i] = (hi << 4) | lo;
        }
        Ok(Gid(out))
    }
}

const fn hex_digit(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.to_ipv4() {
            Some(v4) => write!(f, "::ffff:{v4}"),
            None => write!(f, "{}", Ipv6Addr::from_octets(self.0)),
        }
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({self})")
    }
}

impl FromStr for Gid {
    type Err = ValueError;

    /// Accepts an IPv6 address (`fe80::1`, `::ffff:10.0.0.1`), a plain IPv4
    /// address (mapped), or 32 hex digits.
    fn from_str(s: &str) -> Result<Gid, ValueError> {
        if let Ok(ip) = s.parse::<IpAddr>() {
            return Ok(Gid::from_ip(ip));
        }
        if s.len() == 32 {
            return Gid::from_hex(s);
        }
        Err(ValueError::Gid(s.to_owned()))
    }
}

impl From<IpAddr> for Gid {
    fn from(addr: IpAddr) -> Gid {
        Gid::from_ip(addr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn qpn_rejects_25_bits() {
        assert_eq!(Qpn::new(0xFF_FFFF).map(Qpn::get), Ok(0xFF_FFFF));
        assert_eq!(Qpn::new(0x100_0000), Err(ValueError::Qpn(0x100_0000)));
        assert_eq!(Qpn::from_wire(0xAB12_3456).get(), 0x12_3456);
    }

    #[test]
    fn psn_wraps_at_2_pow_24() {
        let top = Psn::from_wire(0xFF_FFFF);
        assert_eq!(top.next(), Psn::from_wire(0));
        assert_eq!(top.wrapping_add(2).get(), 1);
        assert_eq!(Psn::from_wire(0).wrapping_sub(1), top);
        assert_eq!(Psn::from_wire(5).wrapping_sub(10).get(), 0xFF_FFFB);
        assert!(top.is_before(Psn::from_wire(0)));
        assert!(Psn::from_wire(0).is_after(top));
        assert_eq!(top.distance_to(Psn::from_wire(3)), 4);
        assert_eq!(Psn::from_wire(3).distance_to(top), -4);
        assert!(Psn::from_wire(0).in_range(top, 2));
        assert!(!Psn::from_wire(1).in_range(top, 2));
        assert_eq!(Psn::new(0x100_0000), Err(ValueError::Psn(0x100_0000)));
    }

    #[test]
    fn psn_window_edges() {
        let a = Psn::from_wire(100);
        // Exactly 2^23 - 1 ahead is still "after"; 2^23 ahead flips to "before".
        assert!(a.is_before(a.wrapping_add(Psn::HALF - 1)));
        assert_eq!(
            a.distance_to(a.wrapping_add(Psn::HALF - 1)),
            (Psn::HALF - 1) as i32
        );
        assert!(a.is_after(a.wrapping_add(Psn::HALF + 1)));
        assert_eq!(
            a.distance_to(a.wrapping_add(Psn::HALF)),
            -(Psn::HALF as i32)
        );
        assert_eq!(a.cmp_window(a), std::cmp::Ordering::Equal);
        let top = Psn::from_wire(0xFF_FFFF);
        assert!(top.is_before(top.wrapping_add(Psn::HALF - 1)));
        assert!(top.is_after(top.wrapping_sub(Psn::HALF - 1)));
    }

    proptest! {
        #[test]
        fn psn_add_sub_inverse(base in 0u32..(1 << 24), n in 0u32..(1 << 24)) {
            let p = Psn::from_wire(base);
            prop_assert_eq!(p.wrapping_add(n).wrapping_sub(n), p);
            prop_assert_eq!(p.wrapping_add(n).get(), (base + n) % (1 << 24));
        }

        #[test]
        fn psn_distance_antisymmetric(base in 0u32..(1 << 24), d in -(1i32 << 23) + 1..(1i32 << 23)) {
            let a = Psn::from_wire(base);
            let b = a.wrapping_add(d as u32);
            prop_assert_eq!(a.distance_to(b), d);
            prop_assert_eq!(b.distance_to(a), -d);
            prop_assert_eq!(a.is_before(b), d > 0);
            prop_assert_eq!(b.in_range(a, (d.max(0) as u32) + 1), d >= 0);
        }

        #[test]
        fn gid_hex_round_trip(bytes in proptest::array::uniform16(any::<u8>())) {
            let g = Gid(bytes);
            prop_assert_eq!(Gid::from_hex(&g.to_hex()), Ok(g));
            prop_assert_eq!(g.to_string().parse::<Gid>(), Ok(g));
        }
    }

    #[test]
    fn gid_ipv4_mapped_forms() {
        let g: Gid = "::ffff:10.0.0.1".parse().expect("parse");
        assert_eq!(g.to_string(), "::ffff:10.0.0.1");
        assert_eq!(g.to_hex(), "00000000000000000000ffff0a000001");
        assert_eq!(g.to_ipv4(), Some(Ipv4Addr::new(10, 0, 0, 1)));
        assert_eq!("10.0.0.1".parse::<Gid>(), Ok(g));
        assert_eq!("00000000000000000000FFFF0A000001".parse::<Gid>(), Ok(g));
        let v6: Gid = "fe80::5054:ff:fe12:3456".parse().expect("parse");
        assert_eq!(v6.to_ipv4(), None);
        assert_eq!(v6.to_string(), "fe80::5054:ff:fe12:3456");
        assert_eq!(
            Gid::link_local_from_mac([0x52, 0x54, 0, 0x12, 0x34, 0x56]),
            v6
        );
        assert!(matches!("nonsense".parse::<Gid>(), Err(ValueError::Gid(_))));
        assert!(matches!(
            Gid::from_hex("zz000000000000000000ffff0a000001"),
            Err(ValueError::GidHex(_))
        ));
    }

    #[test]
    fn mtu_encodings() {
        for (m, bytes, e) in [
            (Mtu::Mtu256, 256, 1),
            (Mtu::Mtu512, 512, 2),
            (Mtu::Mtu1024, 1024, 3),
            (Mtu::Mtu2048, 2048, 4),
            (Mtu::Mtu4096, 4096, 5),
        ] {
            assert_eq!(m.bytes(), bytes);
            assert_eq!(m.to_enum(), e);
            assert_eq!(Mtu::from_enum(e), Ok(m));
            assert_eq!(Mtu::from_bytes(bytes), Ok(m));
        }
        assert_eq!(Mtu::from_bytes(1500), Err(ValueError::MtuBytes(1500)));
        assert_eq!(Mtu::from_enum(6), Err(ValueError::MtuEnum(6)));
        assert_eq!(Mtu::from_ethernet_mtu(1500), Mtu::Mtu1024);
        assert_eq!(Mtu::from_ethernet_mtu(9000), Mtu::Mtu4096);
        assert_eq!(Mtu::from_ethernet_mtu(65536), Mtu::Mtu4096);
        assert_eq!(Mtu::from_ethernet_mtu(100), Mtu::Mtu256);
        assert_eq!(Mtu::Mtu1024.packets_for(0), 1);
        assert_eq!(Mtu::Mtu1024.packets_for(1024), 1);
        assert_eq!(Mtu::Mtu1024.packets_for(1025), 2);
    }

    #[test]
    fn key_parts() {
        let k = Rkey::from_parts(0x12_3456, 0x9a);
        assert_eq!(k.get(), 0x1234_569a);
        assert_eq!(k.index(), 0x12_3456);
        assert_eq!(k.key_byte(), 0x9a);
    }
}
