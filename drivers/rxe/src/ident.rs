//! Checking a received packet's ICRC when its IPv4 identification is not
//! known.
//!
//! The ICRC covers the IPv4 identification, which a UDP socket never sees.
//! The receive path first *predicts* it — 0 (rnic senders: DF on an
//! unconnected socket), the GRO segment index (kernel-segmented GSO), the
//! sender's previous identification + 1 (kernel rxe's counter) — and
//! verifies all 32 bits with the prediction. When every prediction misses
//! (a kernel peer's first packet, a loss or reordering in its stream), the
//! identification is read from the **identification tap** (`sys::ident_tap`:
//! a raw socket that sees the headers of every packet to the address whose
//! identification is not 0) and the ICRC is again verified in all 32 bits.
//! Only where no tap exists (no CAP_NET_RAW) is there no full check: such
//! packets are dropped and counted, unless the device was opened with
//! `ident_recovery`, which accepts them after *solving* the ICRC for the
//! identification (a 15-bit check; off by default, reported by
//! `rnicctl doctor`).

use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::BorrowedFd;

use rnic_roce::wire::icrc;

use crate::sys;

/// Which prediction verified an IPv4 ICRC (all 32 bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Predicted {
    /// Identification 0 (rnic senders: DF on an unconnected socket), which
    /// is also segment index 0 of a datagram.
    Zero,
    /// The GRO segment index (kernel-segmented GSO counts 0, 1, 2, …).
    GroIndex,
    /// The sender's previous identification + 1 (kernel rxe's counter).
    Next,
    /// IPv6: nothing to predict.
    V6,
}

/// The outcome of an ICRC check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum IcrcCheck {
    /// Verified with a predicted identification (or IPv6): all 32 bits.
    Ok(Predicted),
    /// Verified with the identification the tap saw: all 32 bits.
    Tapped,
    /// Verified after solving for the identification (15-bit check; only
    /// with `ident_recovery`).
    Recovered,
    /// No prediction held and no tap saw the identification: cannot be
    /// checked in full, dropped.
    Unverified,
    /// Bad: drop.
    Bad,
}

/// The last IPv4 identification seen from a sender, to predict the next
/// (kernel rxe and kernel-segmented GSO count upwards per packet).
pub(crate) type LastIdent = Option<(SocketAddr, u16)>;

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
pub(crate) struct TapTable {
    seen: VecDeque<Tapped>,
    /// Entries read from the tap.
    pub read: u64,
}

/// At most this many tapped headers are kept.
const TAP_KEEP: usize = 4096;

impl TapTable {
    /// Move every queued copy from the tap `fd` into the table.
    pub(crate) fn drain(&mut self, fd: BorrowedFd<'_>) {
        let mut buf = [0u8; sys::TAP_SNAP];
        while let Ok(Some(n)) = sys::tap_recv(fd, &mut buf) {
            if let Some(t) = parse_tapped(&buf[..n]) {
                if self.seen.len() == TAP_KEEP {
                    self.seen.pop_front();
                }
                self.seen.push_back(t);
                self.read += 1;
            }
        }
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
            // GRO coalesces a run of consecutive identifications (or one
            // repeated identification); the tap sees the first.
            [t.ident.wrapping_add(index), t.ident]
                .into_iter()
                .find(|&id| verify(id))
                .map(|id| (i, id))
        });
        let (i, id) = hit?;
        self.seen.remove(i);
        Some(id)
    }
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
        src: Ipv4Addr::new(b[12], b[13], b[14], b[15]),
        sport: u16::from_be_bytes([udp[0], udp[1]]),
        bth,
        ident: u16::from_be_bytes([b[4], b[5]]),
    })
}

/// What a check may use beyond the packet: the sender's last
/// identification, this address's tap (and its table), and whether the
/// 15-bit recovery is allowed.
pub(crate) struct IdentCtx<'a> {
    pub last: &'a mut LastIdent,
    pub tap: Option<(BorrowedFd<'a>, &'a mut TapTable)>,
    pub recovery: bool,
}

/// Check the ICRC of `pkt`, segment `index` of a datagram from `src` to
/// `local`:`dport` whose first packet starts with `first_bth`. IPv4
/// candidates in order: the segment index, the sender's last
/// identification + 1, 0; then the tap; then (opt-in) solving for it.
pub(crate) fn check_icrc(
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
            let verify = |id| icrc::verify_v4(s, d, id, true, sport, dport, pkt).is_ok();
            let next = match *cx.last {
                Some((a, id)) if a == *src => Some(id.wrapping_add(1)),
                _ => None,
            };
            let index_path = if index == 0 {
                Predicted::Zero
            } else {
                Predicted::GroIndex
            };
            let candidates = [
                (Some(index), index_path),
                (next, Predicted::Next),
                (Some(0), Predicted::Zero),
            ];
            let mut tried = [None::<u16>; 3];
            for (i, (c, path)) in candidates.into_iter().enumerate() {
                let Some(id) = c else { continue };
                if tried.contains(&Some(id)) {
                    continue;
                }
                tried[i] = Some(id);
                if verify(id) {
                    *cx.last = Some((*src, id));
                    return IcrcCheck::Ok(path);
                }
            }
            if let Some((fd, table)) = cx.tap.as_mut() {
                table.drain(*fd);
                return match table.claim(src, first_bth, index, verify) {
                    Some(id) => {
                        *cx.last = Some((*src, id));
                        IcrcCheck::Tapped
                    }
                    // The tap sees every nonzero identification: a packet
                    // none of them verifies is bad.
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
            if icrc::verify_v6(s, d, src.port(), dport, pkt).is_ok() {
                IcrcCheck::Ok(Predicted::V6)
            } else {
                IcrcCheck::Bad
            }
        }
        _ => IcrcCheck::Bad,
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
        };
        assert_eq!(
            check_icrc(IpAddr::V4(D), 4791, &src(), 3, &p[..12], &p, &mut cx),
            IcrcCheck::Ok(Predicted::GroIndex)
        );
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
    }
}
