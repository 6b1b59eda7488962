//! The receive path without sockets, for the `rxe_rx` fuzz target
//! (rnic-fuzz-harness): one datagram is handed to the very function a
//! `recvmmsg` batch goes through (ICRC and identification check, fault
//! injection, QPN demultiplexing, the QP's engine, its memory accesses and
//! CQ writes), then the round ends as a progress round does (due timers,
//! flush). Not part of the API: hidden, and no stability promised.
//!
//! A fuzzer keeps one device for many inputs, so each input must find it as
//! the previous one would have: [`seed_keys`] makes the key table's keys a
//! function of a seed (the same R_Keys in every process), and
//! [`forget_receive_state`] clears what datagrams leave in the receive path
//! between inputs (the objects — QPs, CQs, memory — are the caller's to
//! reset).

use std::net::SocketAddr;
use std::sync::atomic::Ordering;

use crate::RxeDevice;
use crate::mem::Keys;

/// Replace the device's key table by an empty one whose key bytes come from
/// `seed`, so registrations made afterwards get the same L_Keys and R_Keys
/// in every process. Returns `false` (and changes nothing) when a region is
/// registered.
#[doc(hidden)]
pub fn seed_keys(dev: &RxeDevice, seed: u64) -> bool {
    let mut keys = dev.inner.sh.keys_mut();
    if !keys.is_empty() {
        return false;
    }
    *keys = Keys::with_seed(seed);
    true
}

/// Forget what earlier datagrams left in the device beyond its objects, as
/// on a freshly opened device: the IPv4-identification predictor (the
/// sender's last identification), the identification taps' unclaimed
/// headers, a packet held back for reordering, ACKs left for the next call,
/// the receive counters, the counters of destroyed QPs and the CQ
/// overflows. The fault generator is not rewound (a fuzzing device runs
/// without faults).
#[doc(hidden)]
pub fn forget_receive_state(dev: &RxeDevice) {
    let sh = &dev.inner.sh;
    sh.rx().forget();
    sh.acks_waiting.store(false, Ordering::Release);
    sh.cq_overflows.store(0, Ordering::Relaxed);
    *sh.retired.lock().unwrap_or_else(|p| p.into_inner()) = Default::default();
}

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
        ident: None,
        hop: None,
    };
    let now = sh.now();
    {
        let table = sh.qps.read().unwrap_or_else(|p| p.into_inner());
        rx.deliver(sh, &table, 0, 0, now);
    }
    // A budget of 0 reads no socket: timers and the flush only.
    rx.progress(sh, 0, crate::device::Defer::Never);
    true
}
