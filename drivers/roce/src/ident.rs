//! Checking a received IPv4 packet's ICRC when its identification is not
//! known: predictions, the identification tap's table, and the opt-in
//! 15-bit recovery — shared by rnic-rxe and the emulated mlx5 function.
//!
//! The ICRC covers the IPv4 identification, which a UDP socket never sees.
//! [`check_icrc`] first *predicts* it — 0 (rnic senders: DF on an
//! unconnected socket), the GRO segment index (kernel-segmented GSO), the
//! sender's previous identification + 1 (kernel rxe's counter) — and
//! verifies all 32 bits with the prediction. When every prediction misses
//! (a kernel peer's first packet, a loss or reordering in its stream), the
//! identification is looked up among the headers an **identification tap**
//! saw — a raw IPPROTO_UDP socket with the classic-BPF program
//! [`tap_filter`], which keeps the first [`TAP_SNAP`] bytes of every packet
//! to the RoCE port whose identification is not 0 — and the ICRC is again
//! verified in all 32 bits. Only where no tap exists (no CAP_NET_RAW) is
//! there no full check: such packets are [`IcrcCheck::Unverified`], unless
//! the caller allows *solving* the ICRC for the identification (a 15-bit
//! check, [`IdentCtx::recovery`]).
//!
//! This module does no I/O: the socket belongs to the caller, which hands
//! its reads in through [`TapSource`].

use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use crate::wire::icrc;

/// Which prediction verified an IPv4 ICRC (all 32 bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Predicted {
    /// Identification 0 (rnic senders: DF on an unconnected socket), which
    /// is also segment index 0 of a datagram.
    Zero,
    /// The GRO segment index (kernel-segmented GSO counts 0, 1, 2, …).
    GroIndex,
    /// The sender's previous identification + 1 (kernel rxe's counter).
    Next,
    /// IPv6: nothing to predict.
    V6,
    /// Not predicted: the receive path saw the datagram's IPv4 header
    /// (rnic-rxe's packet ring) and checked with its identification
    /// ([`check_icrc_seen`]).
    Seen,
}

/// The outcome of an ICRC check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IcrcCheck {
    /// Verified with a predicted identification (or IPv6): all 32 bits.
    Ok(Predicted),
    /// Verified with the identification the tap saw: all 32 bits.
    Tapped,
    /// Verified after solving for the identification (15-bit check; only
    /// with [`IdentCtx::recovery`]).
    Recovered,
    /// No prediction held and no tap saw the identification: cannot be
    /// checked in full (callers drop it).
    Unverified,
    /// Bad: drop.
    Bad,
}

/// The last IPv4 identification seen from a sender, to predict the next
/// (kernel rxe and kernel-segmented GSO count upwards per packet).
pub type LastIdent = Option<(SocketAddr, u16)>;

/// Bytes of each tapped packet kept: the largest IPv4 header (60), UDP (8)
/// and a BTH (12), rounded up.
pub const TAP_SNAP: usize = 96;

/// One classic-BPF instruction (`struct sock_filter` of linux/filter.h).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BpfInsn {
    /// Opcode.
    pub code: u16,
    /// Jump offset if true.
    pub jt: u8,
    /// Jump offset if false.
    pub jf: u8,
    /// Constant.
    pub k: u32,
}

/// Classic BPF opcodes used by [`tap_filter`] and rnic-rxe's packet-ring
/// filter (linux/filter.h).
pub mod bpf {
    /// BPF_LD | BPF_B | BPF_ABS
    pub const LD_B_ABS: u16 = 0x30;
    /// BPF_LD | BPF_W | BPF_ABS
    pub const LD_W_ABS: u16 = 0x20;
    /// BPF_LD | BPF_H | BPF_ABS
    pub const LD_H_ABS: u16 = 0x28;
    /// BPF_LD | BPF_H | BPF_IND
    pub const LD_H_IND: u16 = 0x48;
    /// BPF_LDX | BPF_B | BPF_MSH: X = 4 * (P[k] & 0xf)
    pub const LDX_B_MSH: u16 = 0xb1;
    /// BPF_JMP | BPF_JEQ | BPF_K
    pub const JEQ_K: u16 = 0x15;
    /// BPF_JMP | BPF_JSET | BPF_K
    pub const JSET_K: u16 = 0x45;
    /// BPF_RET | BPF_K
    pub const RET_K: u16 = 0x06;
    /// BPF_ALU | BPF_AND | BPF_K
    pub const AND_K: u16 = 0x54;
    /// BPF_ALU | BPF_LSH | BPF_K
    pub const LSH_K: u16 = 0x64;
    /// BPF_MISC | BPF_TAX: X = A
    pub const TAX: u16 = 0x07;
}

/// The program of an identification tap (a raw IPv4 socket sees packets
/// from their IPv4 header): keep the first [`TAP_SNAP`] bytes of every
/// unfragmented IPv4/UDP packet to `roce_port` whose identification is not
/// 0 (rnic senders use 0, which [`check_icrc`] predicts; kernel rxe
/// counts), drop everything else.
pub fn tap_filter(roce_port: u16) -> [BpfInsn; 9] {
    let op = |code, jt, jf, k| BpfInsn { code, jt, jf, k };
    [
        op(bpf::LD_H_ABS, 0, 0, 6),                 // 0: flags + fragment offset
        op(bpf::JSET_K, 6, 0, 0x1fff),              // 1: a fragment → drop (8)
        op(bpf::LD_H_ABS, 0, 0, 4),                 // 2: identification
        op(bpf::JEQ_K, 4, 0, 0),                    // 3: 0 → drop (8)
        op(bpf::LDX_B_MSH, 0, 0, 0),                // 4: X = IPv4 header length
        op(bpf::LD_H_IND, 0, 0, 2),                 // 5: UDP destination port
        op(bpf::JEQ_K, 0, 1, u32::from(roce_port)), // 6: the RoCE port → keep (7)
        op(bpf::RET_K, 0, 0, TAP_SNAP as u32),      // 7: keep the headers
        op(bpf::RET_K, 0, 0, 0),                    // 8: drop
    ]
}

/// Where tapped headers come from: the caller's raw socket, read without
/// blocking.
pub trait TapSource {
    /// One queued packet's first bytes into `buf` (its length), or `None`
    /// when nothing is queued (or the socket failed).
    fn recv(&mut self, buf: &mut [u8]) -> Option<usize>;
}

/// The headers of one tapped packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Tapped {
    src: Ipv4Addr,
    sport: u16,
    /// The packet's BTH (the first RoCE packet of a GRO batch).
    bth: [u8; 12],
    ident: u16,
}

/// Tapped headers not yet claimed, oldest first (bounded: the oldest go).
#[derive(Debug, Default)]
pub struct TapTable {
    seen: VecDeque<Tapped>,
    /// Entries read from the tap.
    pub read: u64,
}

/// At most this many tapped headers are kept.
const TAP_KEEP: usize = 4096;

impl TapTable {
    /// Move every queued copy from `tap` into the table.
    pub fn drain(&mut self, tap: &mut dyn TapSource) {
        let mut buf = [0u8; TAP_SNAP];
        while let Some(n) = tap.recv(&mut buf) {
            self.push(buf.get(..n).unwrap_or(&buf));
        }
    }

    /// Add one tapped packet (its IPv4 header onwards); `false` when the
    /// bytes are not an IPv4/UDP/BTH header.
    pub fn push(&mut self, header: &[u8]) -> bool {
        let Some(t) = parse_tapped(header) else {
            return false;
        };
        if self.seen.len() == TAP_KEEP {
            self.seen.pop_front();
        }
        self.seen.push_back(t);
        self.read += 1;
        true
    }

    /// Headers kept and not yet claimed.
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    /// Whether no header is kept.
    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }

    /// The identification of segment `index` of the datagram from `src`
    /// whose first packet's BTH is `bth`, if a tapped copy verifies `pkt`'s
    /// ICRC with it (all 32 bits); the copy is used up. Newest first: a
    /// retransmission repeats the BTH with a new identification.
    fn claim(
        &mut self,
        src: &SocketAddr,
        bth: &[u8],
        index: u16,
        verify: impl Fn(u16) -> bool,
    ) -> Option<u16> {
        let IpAddr::V4(ip) = src.ip() else {
            return None;
        };
        let hit = self.seen.iter().enumerate().rev().find_map(|(i, t)| {
            if t.src != ip || t.sport != src.port() || t.bth[..] != *bth {
                return None;
            }
            // The tap sees the first identification of a GRO batch.
            segment_idents(t.ident, index)
                .find(|&id| verify(id))
                .map(|id| (i, id))
        });
        let (i, id) = hit?;
        self.seen.remove(i);
        Some(id)
    }
}

/// The identifications segment `index` of a GRO batch whose first header
/// carried `first` may have been sent with: GRO coalesces a run of
/// consecutive identifications (`first + index`) or one repeated
/// identification (`first`); for segment 0 the two are one.
fn segment_idents(first: u16, index: u16) -> impl Iterator<Item = u16> {
    let repeated = (index != 0).then_some(first);
    std::iter::once(first.wrapping_add(index)).chain(repeated)
}

/// IPv4 header → (source, UDP source port, BTH, identification).
fn parse_tapped(b: &[u8]) -> Option<Tapped> {
    let ihl = usize::from(*b.first()? & 0x0f) * 4;
    if b.first()? >> 4 != 4 || ihl < 20 {
        return None;
    }
    let udp = b.get(ihl..ihl + 8)?;
    let bth: [u8; 12] = b.get(ihl + 8..ihl + 20)?.try_into().ok()?;
    Some(Tapped {
        src: Ipv4Addr::new(*b.get(12)?, *b.get(13)?, *b.get(14)?, *b.get(15)?),
        sport: u16::from_be_bytes([*udp.first()?, *udp.get(1)?]),
        bth,
        ident: u16::from_be_bytes([*b.get(4)?, *b.get(5)?]),
    })
}

/// What a check may use beyond the packet: the sender's last
/// identification, the receiving address's tap and its table, and whether
/// the 15-bit recovery is allowed.
pub struct IdentCtx<'a> {
    /// The sender's last identification (updated by a verified check).
    pub last: &'a mut LastIdent,
    /// The tap of the receiving address and its table (IPv4, CAP_NET_RAW).
    pub tap: Option<(&'a mut dyn TapSource, &'a mut TapTable)>,
    /// Accept a packet after solving its ICRC for the identification.
    pub recovery: bool,
    /// The receiver's ICRC prefix cache (predicted identifications and
    /// IPv6 go through it).
    pub icrc: &'a mut icrc::IcrcCache,
}

impl std::fmt::Debug for IdentCtx<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdentCtx")
            .field("last", &self.last)
            .field("tap", &self.tap.is_some())
            .field("recovery", &self.recovery)
            .field("icrc", &self.icrc)
            .finish()
    }
}

/// The IPv4 identifications a socket receiver tries for segment `index`
/// of a datagram from `src`, in order, and what each one is: the segment
/// index (0 for a lone packet), the sender's last identification + 1, 0.
#[inline(always)]
pub fn predicted_idents(
    index: u16,
    last: &LastIdent,
    src: &SocketAddr,
) -> [(Option<u16>, Predicted); 3] {
    let next = match *last {
        Some((a, id)) if a == *src => Some(id.wrapping_add(1)),
        _ => None,
    };
    let index_path = if index == 0 {
        Predicted::Zero
    } else {
        Predicted::GroIndex
    };
    [
        (Some(index), index_path),
        (next, Predicted::Next),
        (Some(0), Predicted::Zero),
    ]
}

/// Check the ICRC of `pkt` (BTH‥ICRC), segment `index` of a datagram from
/// `src` to `local`:`dport` whose first packet starts with `first_bth`.
/// IPv4 candidates in order: the segment index, the sender's last
/// identification + 1, 0; then the tap (where one exists, a packet none of
/// its identifications verifies is [`IcrcCheck::Bad`]: it sees every
/// nonzero one); then (opt-in) solving for it.
#[inline(always)]
pub fn check_icrc(
    local: IpAddr,
    dport: u16,
    src: &SocketAddr,
    index: u16,
    first_bth: &[u8],
    pkt: &[u8],
    cx: &mut IdentCtx<'_>,
) -> IcrcCheck {
    match (src.ip(), local) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let sport = src.port();
            // Predictions repeat (0, a segment index): through the cache.
            // The tap's identifications rarely do: the reference path.
            let cache = &mut *cx.icrc;
            let mut predicted = |id| cache.verify_v4(s, d, id, true, sport, dport, pkt).is_ok();
            let verify = |id| icrc::verify_v4(s, d, id, true, sport, dport, pkt).is_ok();
            let candidates = predicted_idents(index, cx.last, src);
            let mut tried = [None::<u16>; 3];
            for (i, (c, path)) in candidates.into_iter().enumerate() {
                let Some(id) = c else { continue };
                if tried.contains(&Some(id)) {
                    continue;
                }
                if let Some(t) = tried.get_mut(i) {
                    *t = Some(id);
                }
                if predicted(id) {
                    *cx.last = Some((*src, id));
                    return IcrcCheck::Ok(path);
                }
            }
            if let Some((source, table)) = cx.tap.as_mut() {
                table.drain(&mut **source);
                return match table.claim(src, first_bth, index, verify) {
                    Some(id) => {
                        *cx.last = Some((*src, id));
                        IcrcCheck::Tapped
                    }
                    None => IcrcCheck::Bad,
                };
            }
            if !cx.recovery {
                return IcrcCheck::Unverified;
            }
            match icrc::recover_v4_ident(s, d, sport, dport, pkt) {
                Ok((id, _df)) => {
                    *cx.last = Some((*src, id));
                    IcrcCheck::Recovered
                }
                Err(_) => IcrcCheck::Bad,
            }
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            if cx.icrc.verify_v6(s, d, src.port(), dport, pkt).is_ok() {
                IcrcCheck::Ok(Predicted::V6)
            } else {
                IcrcCheck::Bad
            }
        }
        _ => IcrcCheck::Bad,
    }
}

/// Check the ICRC of `pkt` (BTH‥ICRC), segment `index` of an IPv4 datagram
/// from `src` to `local`:`dport` whose IPv4 header the receive path saw:
/// identification `ident`, don't-fragment bit `df`. Nothing is predicted:
/// the segment carried `ident + index` (a GSO send the kernel segmented,
/// which GRO merged again, or one the loopback delivered whole and whose
/// sender filled the ICRCs that way) or, for a GRO batch of equal
/// identifications, `ident` itself. All 32 bits verified, else
/// [`IcrcCheck::Bad`]. `last` is updated as [`check_icrc`] does, so a later
/// datagram through a socket is still predicted.
#[inline]
#[allow(clippy::too_many_arguments)]
pub fn check_icrc_seen(
    local: Ipv4Addr,
    dport: u16,
    src: &SocketAddr,
    index: u16,
    (ident, df): (u16, bool),
    pkt: &[u8],
    last: &mut LastIdent,
    cache: &mut icrc::IcrcCache,
) -> IcrcCheck {
    let IpAddr::V4(s) = src.ip() else {
        return IcrcCheck::Bad;
    };
    for id in segment_idents(ident, index) {
        if cache
            .verify_v4(s, local, id, df, src.port(), dport, pkt)
            .is_ok()
        {
            *last = Some((*src, id));
            return IcrcCheck::Ok(Predicted::Seen);
        }
    }
    IcrcCheck::Bad
}

/// Counts of [`check_icrc`] outcomes, and the line rnic prints them as
/// (`icrc: N ok, all 32 bits (…), R recovered (15-bit check), U
/// unverifiable (dropped), D dropped`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IcrcCounts {
    /// Verified, all 32 bits (predicted, IPv6 or tapped).
    pub ok: u64,
    /// Of `ok`: identification 0.
    pub ident_zero: u64,
    /// Of `ok`: the GRO segment index.
    pub gro_index: u64,
    /// Of `ok`: the sender's previous + 1.
    pub next: u64,
    /// Of `ok`: the tap's identification.
    pub tapped: u64,
    /// Accepted after the 15-bit solve.
    pub recovered: u64,
    /// Not checkable in full, dropped.
    pub unverified: u64,
    /// Bad, dropped.
    pub bad: u64,
}

impl IcrcCounts {
    /// Count one outcome.
    pub fn count(&mut self, c: IcrcCheck) {
        match c {
            IcrcCheck::Ok(p) => {
                self.ok += 1;
                match p {
                    Predicted::Zero => self.ident_zero += 1,
                    Predicted::GroIndex => self.gro_index += 1,
                    Predicted::Next => self.next += 1,
                    Predicted::V6 | Predicted::Seen => {}
                }
            }
            IcrcCheck::Tapped => {
                self.ok += 1;
                self.tapped += 1;
            }
            IcrcCheck::Recovered => self.recovered += 1,
            IcrcCheck::Unverified => self.unverified += 1,
            IcrcCheck::Bad => self.bad += 1,
        }
    }
}

impl std::fmt::Display for IcrcCounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "icrc: {} ok, all 32 bits (ident 0: {}, GRO index: {}, previous + 1: {}, tapped: {}), {} recovered (15-bit check), {} unverifiable (dropped), {} dropped",
            self.ok,
            self.ident_zero,
            self.gro_index,
            self.next,
            self.tapped,
            self.recovered,
            self.unverified,
            self.bad
        )
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A 12-byte BTH + 4 bytes of payload + ICRC, filled for `ident`.
    fn packet(src: Ipv4Addr, dst: Ipv4Addr, sport: u16, ident: u16) -> Vec<u8> {
        let mut p = vec![0u8; 20];
        p[0] = 0x04; // RC SEND_ONLY
        p[5..8].copy_from_slice(&[0, 0, 0x11]);
        p[12..16].copy_from_slice(b"data");
        icrc::fill_v4(src, dst, ident, true, sport, 4791, &mut p).unwrap();
        p
    }

    /// The tapped header of `pkt` sent from `src`:`sport` with `ident`.
    fn tapped(src: Ipv4Addr, sport: u16, ident: u16, pkt: &[u8]) -> Tapped {
        Tapped {
            src,
            sport,
            bth: pkt[..12].try_into().unwrap(),
            ident,
        }
    }

    /// The IPv4 + UDP header a raw socket would show for `pkt`.
    fn raw_header(src: Ipv4Addr, dst: Ipv4Addr, sport: u16, ident: u16, pkt: &[u8]) -> Vec<u8> {
        let mut h = vec![0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0, 0];
        h[4..6].copy_from_slice(&ident.to_be_bytes());
        h.extend_from_slice(&src.octets());
        h.extend_from_slice(&dst.octets());
        h.extend_from_slice(&sport.to_be_bytes());
        h.extend_from_slice(&4791u16.to_be_bytes());
        h.extend_from_slice(&[0, 0, 0, 0]);
        h.extend_from_slice(&pkt[..12]);
        h
    }

    const S: Ipv4Addr = Ipv4Addr::new(10, 50, 0, 2);
    const D: Ipv4Addr = Ipv4Addr::new(10, 50, 0, 1);

    fn src() -> SocketAddr {
        SocketAddr::new(IpAddr::V4(S), 0xC123)
    }

    /// Kernel rxe numbers its IPv4 packets from a per-destination counter
    /// (seen in the interop runs): without a tap the first packet from a
    /// peer is solved for only when recovery is allowed; every following
    /// one verifies with all 32 bits as previous + 1. rnic peers send
    /// identification 0.
    #[test]
    fn predictions_and_the_opt_in_recovery() {
        let mut last = None;
        let mut run = |id, recovery| {
            let p = packet(S, D, 0xC123, id);
            let mut cx = IdentCtx {
                last: &mut last,
                tap: None,
                recovery,
                icrc: &mut icrc::IcrcCache::new(),
            };
            check_icrc(IpAddr::V4(D), 4791, &src(), 0, &p[..12], &p, &mut cx)
        };
        assert_eq!(run(0x7e12, false), IcrcCheck::Unverified);
        assert_eq!(run(0x7e12, true), IcrcCheck::Recovered);
        assert_eq!(run(0x7e13, false), IcrcCheck::Ok(Predicted::Next));
        assert_eq!(run(0x7e14, false), IcrcCheck::Ok(Predicted::Next));
        // A gap (a packet lost on the way) costs one solve, if allowed.
        assert_eq!(run(0x7e20, false), IcrcCheck::Unverified);
        assert_eq!(run(0x7e20, true), IcrcCheck::Recovered);
        assert_eq!(run(0x7e21, false), IcrcCheck::Ok(Predicted::Next));
        assert_eq!(run(0, false), IcrcCheck::Ok(Predicted::Zero));
        // GRO: segment 3 of a kernel-segmented GSO send carries ident 3.
        let p = packet(S, D, 0xC123, 3);
        let mut fresh = None;
        let mut cx = IdentCtx {
            last: &mut fresh,
            tap: None,
            recovery: false,
            icrc: &mut icrc::IcrcCache::new(),
        };
        assert_eq!(
            check_icrc(IpAddr::V4(D), 4791, &src(), 3, &p[..12], &p, &mut cx),
            IcrcCheck::Ok(Predicted::GroIndex)
        );
    }

    /// With the header seen, the identification is the header's (plus the
    /// segment index, or the same for a GRO batch of equal ones), whatever
    /// a predictor would have guessed; any other is bad, not unverified.
    #[test]
    fn a_seen_identification_is_checked_not_predicted() {
        let mut last = None;
        let mut cache = icrc::IcrcCache::new();
        let mut run = |index, seen, pkt: &[u8]| {
            check_icrc_seen(
                D,
                4791,
                &src(),
                index,
                (seen, true),
                pkt,
                &mut last,
                &mut cache,
            )
        };
        // A kernel rxe counter value no prediction knows.
        let p = packet(S, D, 0xC123, 0x7e12);
        assert_eq!(run(0, 0x7e12, &p), IcrcCheck::Ok(Predicted::Seen));
        // Segment 3 of a datagram whose header says 0x5000.
        let seg = packet(S, D, 0xC123, 0x5003);
        assert_eq!(run(3, 0x5000, &seg), IcrcCheck::Ok(Predicted::Seen));
        // A GRO batch of equal identifications.
        let same = packet(S, D, 0xC123, 0x5000);
        assert_eq!(run(2, 0x5000, &same), IcrcCheck::Ok(Predicted::Seen));
        // Filled for another identification than the one it came with: bad,
        // even for identification 0 or the segment index.
        let zero = packet(S, D, 0xC123, 0);
        assert_eq!(run(0, 0x1234, &zero), IcrcCheck::Bad);
        let idx = packet(S, D, 0xC123, 2);
        assert_eq!(run(2, 0x1234, &idx), IcrcCheck::Bad);
        // The DF bit is the header's too.
        assert_eq!(
            check_icrc_seen(
                D,
                4791,
                &src(),
                0,
                (0x7e12, false),
                &p,
                &mut None,
                &mut icrc::IcrcCache::new()
            ),
            IcrcCheck::Bad
        );
        // The last identification follows, for the predictor.
        let mut last = None;
        check_icrc_seen(
            D,
            4791,
            &src(),
            0,
            (0x7e12, true),
            &p,
            &mut last,
            &mut icrc::IcrcCache::new(),
        );
        assert_eq!(last, Some((src(), 0x7e12)));
    }

    /// A tapped identification verifies all 32 bits, is used once, and a
    /// packet whose ICRC holds only for some other identification — one the
    /// 15-bit solve would accept — is refused.
    #[test]
    fn tapped_identifications_check_all_32_bits() {
        let mut table = TapTable::default();
        let p = packet(S, D, 0xC123, 0x4242);
        table.seen.push_back(tapped(S, 0xC123, 0x4242, &p));
        let ok = |id| icrc::verify_v4(S, D, id, true, 0xC123, 4791, &p).is_ok();
        assert_eq!(table.claim(&src(), &p[..12], 0, ok), Some(0x4242));
        assert_eq!(table.claim(&src(), &p[..12], 0, ok), None, "used once");
        // Sent with identification 0x1111, ICRC computed for 0x2222: the
        // solve finds 0x2222 and accepts; the tap knows it was 0x1111.
        let forged = packet(S, D, 0xC123, 0x2222);
        assert!(icrc::recover_v4_ident(S, D, 0xC123, 4791, &forged).is_ok());
        table.seen.push_back(tapped(S, 0xC123, 0x1111, &forged));
        let ok = |id| icrc::verify_v4(S, D, id, true, 0xC123, 4791, &forged).is_ok();
        assert_eq!(table.claim(&src(), &forged[..12], 0, ok), None);
        // Another sender's copy or another port's never matches.
        let q = packet(S, D, 0xC124, 7);
        table.seen.push_back(tapped(S, 0xC124, 7, &q));
        let ok = |id| icrc::verify_v4(S, D, id, true, 0xC124, 4791, &q).is_ok();
        assert_eq!(table.claim(&src(), &q[..12], 0, ok), None);
        // GRO: the tap saw the first segment's identification.
        let seg2 = packet(S, D, 0xC123, 0x5002);
        let first = packet(S, D, 0xC123, 0x5000);
        table.seen.push_back(tapped(S, 0xC123, 0x5000, &first));
        let ok = |id| icrc::verify_v4(S, D, id, true, 0xC123, 4791, &seg2).is_ok();
        assert_eq!(table.claim(&src(), &first[..12], 2, ok), Some(0x5002));
    }

    /// Through a [`TapSource`]: the tap's copies are drained at the first
    /// miss and verify a kernel-numbered packet; with a tap, a packet no
    /// copy verifies is bad rather than unverified.
    #[test]
    fn check_drains_the_tap_source() {
        struct Queue(Vec<Vec<u8>>);
        impl TapSource for Queue {
            fn recv(&mut self, buf: &mut [u8]) -> Option<usize> {
                let h = self.0.pop()?;
                let n = h.len().min(buf.len());
                buf[..n].copy_from_slice(&h[..n]);
                Some(n)
            }
        }
        let p = packet(S, D, 0xC123, 0x3333);
        let mut q = Queue(vec![raw_header(S, D, 0xC123, 0x3333, &p)]);
        let mut table = TapTable::default();
        let mut last = None;
        let mut counts = IcrcCounts::default();
        let mut cx = IdentCtx {
            last: &mut last,
            tap: Some((&mut q, &mut table)),
            recovery: false,
            icrc: &mut icrc::IcrcCache::new(),
        };
        let c = check_icrc(IpAddr::V4(D), 4791, &src(), 0, &p[..12], &p, &mut cx);
        assert_eq!(c, IcrcCheck::Tapped);
        counts.count(c);
        let next = packet(S, D, 0xC123, 0x3334);
        let c = check_icrc(IpAddr::V4(D), 4791, &src(), 0, &next[..12], &next, &mut cx);
        assert_eq!(c, IcrcCheck::Ok(Predicted::Next));
        counts.count(c);
        let stray = packet(S, D, 0xC123, 0x9999);
        let c = check_icrc(
            IpAddr::V4(D),
            4791,
            &src(),
            0,
            &stray[..12],
            &stray,
            &mut cx,
        );
        assert_eq!(c, IcrcCheck::Bad);
        counts.count(c);
        assert_eq!(table.read, 1);
        assert_eq!(
            counts.to_string(),
            "icrc: 2 ok, all 32 bits (ident 0: 0, GRO index: 0, previous + 1: 1, tapped: 1), 0 recovered (15-bit check), 0 unverifiable (dropped), 1 dropped"
        );
    }

    #[test]
    fn tapped_headers_parse_and_garbage_does_not() {
        let mut h = vec![0x45, 0, 0, 60, 0xab, 0xcd, 0x40, 0, 64, 17, 0, 0];
        h.extend_from_slice(&S.octets());
        h.extend_from_slice(&D.octets());
        h.extend_from_slice(&[0xc1, 0x23, 0x12, 0xb7, 0, 40, 0, 0]);
        h.extend_from_slice(&[4, 0, 0xff, 0xff, 0, 0, 0, 0x11, 0x80, 0, 0, 1]);
        let t = parse_tapped(&h).unwrap();
        assert_eq!((t.src, t.sport, t.ident, t.bth[0]), (S, 0xC123, 0xabcd, 4));
        assert_eq!(parse_tapped(&h[..30]), None);
        assert_eq!(parse_tapped(&[0x65; 40]), None);
        assert_eq!(parse_tapped(&[]), None);
        let mut table = TapTable::default();
        assert!(table.push(&h));
        assert!(!table.push(&h[..25]));
        assert_eq!((table.len(), table.read), (1, 1));
    }

    /// The filter's shape: 9 instructions, the RoCE port in the compare,
    /// the snap length in the keep.
    #[test]
    fn tap_filter_keeps_headers_to_the_roce_port() {
        let f = tap_filter(4791);
        assert_eq!(f[6].k, 4791);
        assert_eq!(f[7].k, TAP_SNAP as u32);
        assert_eq!(f[8].k, 0);
        // Both drop jumps land on instruction 8.
        assert_eq!(1 + 1 + usize::from(f[1].jt), 8);
        assert_eq!(3 + 1 + usize::from(f[3].jt), 8);
    }
}
