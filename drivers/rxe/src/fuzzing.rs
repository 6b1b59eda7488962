//! The receive path without sockets, for the `rxe_rx` fuzz target
//! (rnic-fuzz-harness): one datagram is handed to the very function a
//! `recvmmsg` batch goes through (ICRC and identification check, fault
//! injection, QPN demultiplexing, the QP's engine, its memory accesses and
//! CQ writes), then the round ends as a progress round does (due timers,
//! flush). Not part of the API: hidden, and no stability promised.

use std::net::SocketAddr;

use crate::RxeDevice;

/// Deliver `datagram` (a UDP payload as received on the RoCE port: BTH …
/// ICRC, or a GRO batch when `gro_segment` is nonzero) from `from` to the
/// device's first address, as if one `recvmmsg` had returned it, then run a
/// progress round that receives nothing (timers, flush). Returns `false`
/// (and delivers nothing) when the device has no address or the datagram
/// does not fit a receive slot.
#[doc(hidden)]
pub fn deliver(dev: &RxeDevice, from: SocketAddr, datagram: &[u8], gro_segment: u16) -> bool {
    let sh = &dev.inner.sh;
    if sh.ports.is_empty() {
        return false;
    }
    let mut rx = sh.rx();
    if datagram.len() > rx.rx.slot {
        return false;
    }
    let Some(slot) = rx.rx.arena.get_mut(..datagram.len()) else {
        return false;
    };
    slot.copy_from_slice(datagram);
    rx.rx.msgs[0] = crate::sys::RxMsg {
        len: datagram.len(),
        src: Some(from),
        gro: gro_segment,
        truncated: false,
    };
    let now = sh.now();
    {
        let table = sh.qps.read().unwrap_or_else(|p| p.into_inner());
        rx.deliver(sh, &table, 0, 0, now);
    }
    // A budget of 0 reads no socket: timers and the flush only.
    rx.progress(sh, 0, false);
    true
}
