//! ACK Extended Transport Header (4 bytes; rocev2.md §4, §4.1): syndrome
//! and MSN, in ACKs, atomic ACKs and READ response FIRST/LAST/ONLY.

use core::fmt;

use super::bytes::{self, read_u8, read_u24, write_u8, write_u24};
use super::{Header, Result};

/// AETH length in bytes.
pub const HEADER_LEN: usize = 4;

mod field {
    use super::bytes::Field;

    pub const SYNDROME: usize = 0;
    pub const MSN: Field = 1..4;
}

/// A 5-bit credit count code (the low bits of an ACK syndrome).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CreditCode(u8);

/// Credit code → number of receive WQEs (rdmavt `credit_table`); code 31 is
/// "invalid / unlimited".
const CREDIT_TABLE: [u32; 31] = [
    0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536,
    2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768,
];

impl CreditCode {
    /// Code 31: no credit limit — what rxe always sends (`AETH_ACK_UNLIMITED`).
    pub const UNLIMITED: CreditCode = CreditCode(31);

    /// A credit code from its low five bits (higher bits are ignored).
    pub const fn new(code: u8) -> CreditCode {
        CreditCode(code & 0x1f)
    }

    /// The 5-bit code.
    pub const fn code(self) -> u8 {
        self.0
    }

    /// Receive WQEs advertised, or `None` for code 31 (unlimited / invalid).
    pub fn credits(self) -> Option<u32> {
        CREDIT_TABLE.get(usize::from(self.0)).copied()
    }

    /// The largest code whose credit count does not exceed `credits`.
    pub fn from_credits(credits: u32) -> CreditCode {
        let n = CREDIT_TABLE.iter().take_while(|&&c| c <= credits).count();
        // n >= 1 because CREDIT_TABLE[0] == 0, and n <= 31 fits 5 bits.
        CreditCode::new(n.saturating_sub(1) as u8)
    }
}

/// A 5-bit RNR timer code (the low bits of an RNR NAK syndrome).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RnrTimer(u8);

/// RNR timer code → microseconds (`IB_RNR_TIMER_*`; code 0 is the longest).
const RNR_USEC: [u32; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560, 3_840,
    5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840,
    245_760, 327_680, 491_520,
];

impl RnrTimer {
    /// A timer code from its low five bits (higher bits are ignored).
    pub const fn new(code: u8) -> RnrTimer {
        RnrTimer(code & 0x1f)
    }

    /// The 5-bit code.
    pub const fn code(self) -> u8 {
        self.0
    }

    /// The delay the code stands for, in microseconds (code 0 = 655.36 ms;
    /// code 25 = 61.44 ms, where rxe's table has the typo 61.41 ms).
    pub fn micros(self) -> u32 {
        RNR_USEC.get(usize::from(self.0)).copied().unwrap_or(0)
    }
}

/// NAK codes (syndrome 0b011_xxxxx).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NakCode {
    /// 0: PSN sequence error (the PSN is the one the responder expected).
    PsnSeqErr,
    /// 1: invalid request.
    InvalidRequest,
    /// 2: remote access error.
    RemoteAccess,
    /// 3: remote operational error.
    RemoteOperational,
    /// 4: invalid RD request.
    InvalidRdRequest,
    /// Any other 5-bit code (reserved).
    Unknown(u8),
}

impl NakCode {
    /// From the low five bits of a syndrome.
    pub const fn from_code(code: u8) -> NakCode {
        match code & 0x1f {
            0 => NakCode::PsnSeqErr,
            1 => NakCode::InvalidRequest,
            2 => NakCode::RemoteAccess,
            3 => NakCode::RemoteOperational,
            4 => NakCode::InvalidRdRequest,
            other => NakCode::Unknown(other),
        }
    }

    /// The 5-bit code (an `Unknown` value is masked to 5 bits).
    pub const fn code(self) -> u8 {
        match self {
            NakCode::PsnSeqErr => 0,
            NakCode::InvalidRequest => 1,
            NakCode::RemoteAccess => 2,
            NakCode::RemoteOperational => 3,
            NakCode::InvalidRdRequest => 4,
            NakCode::Unknown(c) => c & 0x1f,
        }
    }
}

/// The decoded AETH syndrome byte. Every byte value decodes, and
/// [`Syndrome::to_u8`] gives it back unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Syndrome {
    /// 0b000_xxxxx: ACK with a credit count code.
    Ack(CreditCode),
    /// 0b001_xxxxx: receiver not ready, retry after the timer.
    RnrNak(RnrTimer),
    /// 0b011_xxxxx: NAK.
    Nak(NakCode),
    /// 0b010_xxxxx or bit 7 set: reserved (the raw byte).
    Reserved(u8),
}

impl Syndrome {
    /// The ACK rxe sends: unlimited credits (0x1F).
    pub const ACK_UNLIMITED: Syndrome = Syndrome::Ack(CreditCode::UNLIMITED);

    /// Decode a syndrome byte.
    pub const fn from_u8(raw: u8) -> Syndrome {
        match raw >> 5 {
            0b000 => Syndrome::Ack(CreditCode::new(raw)),
            0b001 => Syndrome::RnrNak(RnrTimer::new(raw)),
            0b011 => Syndrome::Nak(NakCode::from_code(raw)),
            _ => Syndrome::Reserved(raw),
        }
    }

    /// Encode to the syndrome byte.
    pub const fn to_u8(self) -> u8 {
        match self {
            Syndrome::Ack(c) => c.code(),
            Syndrome::RnrNak(t) => 0x20 | t.code(),
            Syndrome::Nak(n) => 0x60 | n.code(),
            Syndrome::Reserved(raw) => raw,
        }
    }

    /// An ACK (any credit code).
    pub const fn is_ack(self) -> bool {
        matches!(self, Syndrome::Ack(_))
    }
}

impl From<u8> for Syndrome {
    fn from(raw: u8) -> Syndrome {
        Syndrome::from_u8(raw)
    }
}

impl From<Syndrome> for u8 {
    fn from(s: Syndrome) -> u8 {
        s.to_u8()
    }
}

impl fmt::Display for Syndrome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Syndrome::Ack(c) => match c.credits() {
                Some(n) => write!(f, "ACK ({n} credits)"),
                None => f.write_str("ACK (unlimited credits)"),
            },
            Syndrome::RnrNak(t) => write!(f, "RNR NAK ({} us)", t.micros()),
            Syndrome::Nak(n) => write!(f, "NAK {n:?}"),
            Syndrome::Reserved(raw) => write!(f, "reserved syndrome {raw:#04x}"),
        }
    }
}

/// A read/write view of an AETH.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wrap a buffer without checking its length (accessors never panic).
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wrap a buffer, checking that it holds a whole AETH.
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let p = Packet::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Check that the buffer holds a whole AETH.
    pub fn check_len(&self) -> Result<()> {
        bytes::need(Header::Aeth, HEADER_LEN, self.buffer.as_ref().len())
    }

    /// Unwrap the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The raw syndrome byte.
    pub fn syndrome_raw(&self) -> u8 {
        read_u8(self.buffer.as_ref(), field::SYNDROME)
    }

    /// The decoded syndrome.
    pub fn syndrome(&self) -> Syndrome {
        Syndrome::from_u8(self.syndrome_raw())
    }

    /// MSN: message sequence number (24 bits).
    pub fn msn(&self) -> u32 {
        read_u24(self.buffer.as_ref(), field::MSN)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set the syndrome.
    pub fn set_syndrome(&mut self, value: Syndrome) {
        write_u8(self.buffer.as_mut(), field::SYNDROME, value.to_u8());
    }

    /// Set the MSN (low 24 bits of `value`).
    pub fn set_msn(&mut self, value: u32) {
        write_u24(self.buffer.as_mut(), field::MSN, value);
    }
}

/// A parsed AETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Syndrome.
    pub syndrome: Syndrome,
    /// MSN (24 bits; `emit` keeps the low 24).
    pub msn: u32,
}

impl Repr {
    /// Parse an AETH view.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            syndrome: packet.syndrome(),
            msn: packet.msn(),
        })
    }

    /// Bytes `emit` writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Write the AETH.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_syndrome(self.syndrome);
        packet.set_msn(self.msn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// AETH of capture packet 6 (RC ACKNOWLEDGE from rxe): ACK, unlimited credits, MSN 1.
    const ACK: [u8; 4] = [0x1f, 0x00, 0x00, 0x01];
    /// Hand-built NAK remote access error, MSN 0x123456.
    const NAK_ACCESS: [u8; 4] = [0x62, 0x12, 0x34, 0x56];
    /// Hand-built RNR NAK with rc_pingpong's min_rnr_timer 12 (0.64 ms), MSN 7.
    const RNR: [u8; 4] = [0x2c, 0x00, 0x00, 0x07];

    fn round_trip(bytes: &[u8; 4]) -> Repr {
        let r = Repr::parse(&Packet::new_checked(&bytes[..]).expect("len")).expect("parse");
        let mut out = [0u8; 4];
        r.emit(&mut Packet::new_unchecked(&mut out[..]));
        assert_eq!(&out, bytes);
        r
    }

    #[test]
    fn capture_ack() {
        let r = round_trip(&ACK);
        assert_eq!(r.syndrome, Syndrome::ACK_UNLIMITED);
        assert_eq!(r.syndrome, Syndrome::Ack(CreditCode::new(31)));
        assert_eq!(CreditCode::UNLIMITED.credits(), None);
        assert_eq!(r.msn, 1);
    }

    #[test]
    fn naks() {
        let r = round_trip(&NAK_ACCESS);
        assert_eq!(r.syndrome, Syndrome::Nak(NakCode::RemoteAccess));
        assert_eq!(r.msn, 0x12_3456);
        let r = round_trip(&RNR);
        assert_eq!(r.syndrome, Syndrome::RnrNak(RnrTimer::new(12)));
        assert_eq!(RnrTimer::new(12).micros(), 640);
        assert_eq!(r.msn, 7);
        assert_eq!(Syndrome::from_u8(0x60), Syndrome::Nak(NakCode::PsnSeqErr));
        assert_eq!(
            Syndrome::from_u8(0x61),
            Syndrome::Nak(NakCode::InvalidRequest)
        );
        assert_eq!(
            Syndrome::from_u8(0x63),
            Syndrome::Nak(NakCode::RemoteOperational)
        );
        assert_eq!(
            Syndrome::from_u8(0x64),
            Syndrome::Nak(NakCode::InvalidRdRequest)
        );
        assert_eq!(Syndrome::from_u8(0x65), Syndrome::Nak(NakCode::Unknown(5)));
        assert_eq!(Syndrome::from_u8(0x40), Syndrome::Reserved(0x40));
        assert_eq!(Syndrome::from_u8(0x9f), Syndrome::Reserved(0x9f));
    }

    #[test]
    fn every_syndrome_byte_round_trips() {
        for raw in 0..=255u8 {
            assert_eq!(Syndrome::from_u8(raw).to_u8(), raw, "{raw:#x}");
        }
    }

    #[test]
    fn credit_table() {
        let want: [(u8, u32); 8] = [
            (0, 0),
            (1, 1),
            (5, 6),
            (7, 12),
            (9, 24),
            (15, 192),
            (22, 2048),
            (30, 32768),
        ];
        for (code, n) in want {
            assert_eq!(CreditCode::new(code).credits(), Some(n));
            assert_eq!(CreditCode::from_credits(n), CreditCode::new(code));
        }
        assert_eq!(CreditCode::from_credits(5), CreditCode::new(4));
        assert_eq!(CreditCode::from_credits(u32::MAX), CreditCode::new(30));
    }

    #[test]
    fn rnr_timer_table() {
        assert_eq!(RnrTimer::new(0).micros(), 655_360);
        assert_eq!(RnrTimer::new(1).micros(), 10);
        assert_eq!(RnrTimer::new(14).micros(), 1_280);
        assert_eq!(RnrTimer::new(25).micros(), 61_440);
        assert_eq!(RnrTimer::new(31).micros(), 491_520);
        assert_eq!(RnrTimer::new(0x3f).code(), 31);
    }

    proptest! {
        #[test]
        fn repr_round_trips(syn in any::<u8>(), msn in 0u32..=0xFF_FFFF) {
            let repr = Repr { syndrome: Syndrome::from_u8(syn), msn };
            let mut buf = [0u8; HEADER_LEN];
            repr.emit(&mut Packet::new_unchecked(&mut buf[..]));
            prop_assert_eq!(buf[0], syn);
            prop_assert_eq!(Repr::parse(&Packet::new_unchecked(&buf[..])), Ok(repr));
        }
    }
}
