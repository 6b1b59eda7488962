//! Receive moderation (`RxeConfig::rx_moderation`): a progress thread that
//! sees a dense stream naps on its doorbell instead of being woken by every
//! datagram, and the stream still lands byte for byte; sparse traffic (a
//! ping-pong) never naps; a device with moderation off, or with a poll
//! handoff, never naps either.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use rnic_core::{Mtu, QpType, SendWr, WcStatus};
use rnic_rxe::{DeviceStats, Progress, RxModeration, RxeConfig, RxeDevice, Target};

/// 4 MiB per side: the writer's buffer holds a pattern, the target's is
/// written over and over.
const BUF: usize = 4 << 20;

fn thread_device(ip: std::net::IpAddr, cfg: impl FnOnce(RxeConfig) -> RxeConfig) -> RxeDevice {
    open_cfg(&cfg(
        RxeConfig::new(Target::Ip(ip)).with_progress(Progress::Thread)
    ))
    .unwrap()
}

/// A caller-driven writer and a progress-thread target configured by `cfg`;
/// `writes` RDMA WRITEs of 1 MiB, 8 in flight, each from a different quarter
/// of the writer's pattern to a different quarter of the target (so a
/// misplaced or stale payload shows); then the target's whole buffer must
/// equal the writer's. Returns the target's device counters.
fn stream(writes: usize, cfg: impl FnOnce(RxeConfig) -> RxeConfig) -> DeviceStats {
    let (ia, ib) = ip_pair();
    let a = Side::new(open(ia, Progress::Caller), BUF, 512);
    let b = Side::new(thread_device(ib, cfg), BUF, 512);
    let pattern: Vec<u8> = (0..BUF)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3])
        .collect();
    a.fill(0, &pattern);
    b.fill(0, &vec![0; BUF]);
    let (mut qa, mut qb) = (a.qp(QpType::Rc), b.qp(QpType::Rc));
    connect(&a, &mut qa, &b, &mut qb, Mtu::Mtu4096);
    const CHUNK: usize = 1 << 20;
    let (mut posted, mut done) = (0, 0);
    while done < writes {
        while posted < writes && posted - done < 8 {
            let q = (posted * 3) % (BUF / CHUNK);
            let sge = [a.mr.sge(q * CHUNK, CHUNK as u32).unwrap()];
            let wr = SendWr::rdma_write(
                posted as u64,
                &sge,
                b.mr.addr() + (q * CHUNK) as u64,
                b.mr.rkey(),
            );
            qa.post_send(&[wr.signaled()]).unwrap();
            posted += 1;
        }
        for wc in wait(&a.cq, 1, &[&a.dev]) {
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            done += 1;
        }
    }
    assert!(
        b.bytes(0, BUF) == pattern,
        "the target's memory differs from what was written"
    );
    let s = b.dev.stats().device;
    println!(
        "{writes} MiB: {} datagrams, {} received by the thread in {} wake-ups and {} naps",
        s.rx_datagrams, s.thread_datagrams, s.thread_wakeups, s.thread_naps
    );
    s
}

/// A threshold any build reaches on loopback (debug builds move a few
/// hundred MB/s), so the test does not depend on the machine's speed.
fn low_threshold() -> Option<RxModeration> {
    Some(RxModeration {
        min_bytes_per_sec: 20_000_000,
        ..RxModeration::default()
    })
}

#[test]
fn a_dense_stream_is_received_in_naps_and_lands_intact() {
    let s = stream(64, |c| c.with_rx_moderation(low_threshold()));
    // Every byte landed (checked in `stream`) and the thread napped: while
    // it does, it is on no socket's wait queue, so the datagrams that
    // arrive wake nobody (what that saves the sender is measured in
    // docs/benchmarks.md, "Receive moderation").
    assert!(s.thread_naps > 0, "{s:?}");
    assert_eq!(s.thread_datagrams, s.rx_datagrams, "{s:?}");
    // rnic sends GSO datagrams from identification 0: their segments
    // verify with their GRO index, and the tap (root) filtered the one
    // copy it saw of each, so it is never drained for them.
    assert!(s.icrc_ident_gro > 0, "{s:?}");
    assert_eq!(s.tap_drains, 0, "{s:?}");
}

#[test]
fn without_moderation_or_with_a_poll_handoff_the_thread_never_naps() {
    let off = stream(16, |c| c.with_rx_moderation(None));
    assert_eq!(off.thread_naps, 0, "{off:?}");
    assert!(off.thread_wakeups > 0, "{off:?}");
    // A poll handoff gives receiving to the polling application: the thread
    // does not moderate (its rounds are the fallback), whatever is asked.
    let handoff = stream(16, |c| {
        c.with_rx_moderation(low_threshold())
            .with_poll_handoff(Some(Duration::from_micros(50)))
    });
    assert_eq!(handoff.thread_naps, 0, "{handoff:?}");
}

#[test]
fn a_ping_pong_never_naps() {
    // The default threshold (2 GB/s) against messages that come one at a
    // time: 8 B and 64 KiB WRITEs, each waited for before the next.
    let (ia, ib) = ip_pair();
    let a = Side::new(open(ia, Progress::Caller), 1 << 20, 64);
    let b = Side::new(thread_device(ib, |c| c), 1 << 20, 64);
    if std::env::var_os("RNIC_RXE_RX_MODERATION_US").is_none() {
        assert_eq!(
            RxeConfig::new(Target::Ip(ib)).rx_moderation,
            Some(RxModeration::default())
        );
    }
    let (mut qa, mut qb) = (a.qp(QpType::Rc), b.qp(QpType::Rc));
    connect(&a, &mut qa, &b, &mut qb, Mtu::Mtu4096);
    for (i, len) in [8usize, 65536]
        .into_iter()
        .flat_map(|l| std::iter::repeat_n(l, 100))
        .enumerate()
    {
        let data: Vec<u8> = (0..len).map(|k| (k + i) as u8).collect();
        a.fill(0, &data);
        let sge = [a.mr.sge(0, len as u32).unwrap()];
        qa.post_send(&[SendWr::rdma_write(i as u64, &sge, b.mr.addr(), b.mr.rkey()).signaled()])
            .unwrap();
        assert_eq!(wait(&a.cq, 1, &[&a.dev])[0].status, WcStatus::Success);
        assert!(b.bytes(0, len) == data, "message {i} ({len} B) differs");
        // The gap a ping-pong leaves between messages.
        std::thread::sleep(Duration::from_micros(200));
    }
    let s = b.dev.stats().device;
    assert_eq!(s.thread_naps, 0, "{s:?}");
    assert!(s.thread_wakeups >= 100, "{s:?}");
}

/// A device's QPs start with a 1024-PSN window where its sockets got 8 MiB
/// receive buffers (root: `SO_RCVBUFFORCE`), else with what the buffer
/// Linux allowed holds (rxe's 128 at the default `rmem_max`); a configured
/// window below that is kept as it is.
#[test]
fn the_window_is_what_the_receive_buffers_hold() {
    let (ia, _) = ip_pair();
    let dev = thread_device(ia, |c| c);
    let root = nix::unistd::geteuid().is_root();
    let rmem_max: usize = std::fs::read_to_string("/proc/sys/net/core/rmem_max")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let want = if root {
        1024
    } else {
        rnic_rxe::window_for_buffer(2 * rmem_max.min(8 << 20)).min(1024)
    };
    assert_eq!(dev.window(), want, "root: {root}, rmem_max {rmem_max}");
    drop(dev);
    let small = thread_device(ia, |c| c.with_max_unacked_psns(64));
    assert_eq!(small.window(), 64);
}
