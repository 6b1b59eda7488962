//! Checking a received packet's ICRC when its IPv4 identification is not
//! known: rnic-roce's [`rnic_roce::ident`] (predictions, the tap's table,
//! the opt-in 15-bit recovery — shared with the emulated mlx5 function) on
//! this device's identification tap (`sys::ident_tap`: a raw socket that
//! sees the headers of every packet to the address whose identification is
//! not 0).
//!
//! Only where no tap exists (no CAP_NET_RAW) is there no full check: such
//! packets are dropped and counted, unless the device was opened with
//! `ident_recovery`, which accepts them after *solving* the ICRC for the
//! identification (a 15-bit check; off by default, reported by
//! `rnicctl doctor`).

use std::net::{IpAddr, SocketAddr};
use std::os::fd::BorrowedFd;

pub(crate) use rnic_roce::ident::{IcrcCheck, LastIdent, Predicted, check_icrc_seen};
pub(crate) use rnic_roce::wire::icrc::IcrcCache;

use crate::sys;

/// One port's tapped headers not yet claimed ([`rnic_roce::ident::TapTable`]
/// read from this device's tap socket).
#[derive(Debug, Default)]
pub(crate) struct TapTable(rnic_roce::ident::TapTable);

impl TapTable {
    /// Move every queued copy from the tap `fd` into the table.
    pub(crate) fn drain(&mut self, fd: BorrowedFd<'_>) {
        self.0.drain(&mut FdTap(fd));
    }
}

/// A tap socket as the shared check reads it.
struct FdTap<'a>(BorrowedFd<'a>);

impl rnic_roce::ident::TapSource for FdTap<'_> {
    fn recv(&mut self, buf: &mut [u8]) -> Option<usize> {
        sys::tap_recv(self.0, buf).ok().flatten()
    }
}

/// What a check may use beyond the packet: the sender's last
/// identification, this address's tap (and its table), and whether the
/// 15-bit recovery is allowed.
pub(crate) struct IdentCtx<'a> {
    pub last: &'a mut LastIdent,
    pub tap: Option<(BorrowedFd<'a>, &'a mut TapTable)>,
    pub recovery: bool,
    pub icrc: &'a mut IcrcCache,
}

/// Check the ICRC of `pkt`, segment `index` of a datagram from `src` to
/// `local`:`dport` whose first packet starts with `first_bth`
/// ([`rnic_roce::ident::check_icrc`] on this port's tap).
#[inline(always)]
pub(crate) fn check_icrc(
    local: IpAddr,
    dport: u16,
    src: &SocketAddr,
    index: u16,
    first_bth: &[u8],
    pkt: &[u8],
    cx: &mut IdentCtx<'_>,
) -> IcrcCheck {
    let mut fd_tap;
    let tap = match cx.tap.as_mut() {
        Some((fd, table)) => {
            fd_tap = FdTap(*fd);
            Some((
                &mut fd_tap as &mut dyn rnic_roce::ident::TapSource,
                &mut table.0,
            ))
        }
        None => None,
    };
    let mut shared = rnic_roce::ident::IdentCtx {
        last: cx.last,
        tap,
        recovery: cx.recovery,
        icrc: &mut *cx.icrc,
    };
    rnic_roce::ident::check_icrc(local, dport, src, index, first_bth, pkt, &mut shared)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::net::Ipv4Addr;

    use rnic_roce::wire::icrc;

    use super::*;

    /// Through this device's wrapper: a kernel-numbered first packet is
    /// unverified without a tap (and solved only with recovery); the next
    /// verifies as previous + 1. The table and the tap's path are tested in
    /// rnic-roce and, on a real raw socket, in tests/icrc_tap.rs.
    #[test]
    fn the_wrapper_checks_as_the_shared_code() {
        let (s, d) = (Ipv4Addr::new(10, 50, 0, 2), Ipv4Addr::new(10, 50, 0, 1));
        let src = SocketAddr::new(IpAddr::V4(s), 0xC123);
        let packet = |id| {
            let mut p = vec![0u8; 20];
            p[0] = 0x04;
            p[5..8].copy_from_slice(&[0, 0, 0x11]);
            icrc::fill_v4(s, d, id, true, 0xC123, 4791, &mut p).unwrap();
            p
        };
        let mut last = None;
        let mut cache = IcrcCache::new();
        let mut run = |id, recovery| {
            let p = packet(id);
            let mut cx = IdentCtx {
                last: &mut last,
                tap: None,
                recovery,
                icrc: &mut cache,
            };
            check_icrc(IpAddr::V4(d), 4791, &src, 0, &p[..12], &p, &mut cx)
        };
        assert_eq!(run(0x7e12, false), IcrcCheck::Unverified);
        assert_eq!(run(0x7e12, true), IcrcCheck::Recovered);
        assert_eq!(run(0x7e13, false), IcrcCheck::Ok(Predicted::Next));
        assert_eq!(run(0, false), IcrcCheck::Ok(Predicted::Zero));
    }
}
