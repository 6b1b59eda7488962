//! CPU time per byte, measured as CPU time (not wall time), so the figures
//! hold on a machine that other processes share.
//!
//! * `parts`: each per-byte step of the data path alone, on one thread —
//!   the atomic-word copies rnic-core's `read_words`/`write_words` do, the
//!   `rep movsb` copies of `rnic_dma::copy`, `memcpy` (`copy_from_slice`)
//!   for reference, and the ICRC's CRC-32 (crc32fast over a slice, and
//!   `rnic_dma::crc` in place over the region, 4 KiB pieces) — over a 64 KiB
//!   buffer (cache-resident) and a 64 MiB one (memory), in ns per KiB.
//! * `path [SIZE] [N] [heap|owned] [write|read]`: N RDMA WRITEs (or READs)
//!   of SIZE bytes streamed
//!   between two rxe devices on 127.0.0.1/127.0.0.2 (MTU 4096, window 1024
//!   PSNs, up to 8 WRITEs in flight, `RNIC_BYTE_COST_SLOTS` to change), **one thread driving both ends**
//!   (caller-driven progress), so the process's CPU time (user + system,
//!   `getrusage`) is the whole cost of moving the bytes, kernel copies
//!   included, with no idle spinning; reported as ns per KiB and CPU·s/GB,
//!   with the system calls and datagrams the devices counted. The devices
//!   read the environment (`RNIC_RXE_RX_PLACE=1`: the reader receives READ
//!   response payloads straight into its buffer; the counts say how many).
//!
//! `cargo run --release -p rnic-rxe --example byte_cost -- parts`
//! `cargo run --release -p rnic-rxe --example byte_cost -- path 1048576 2000`
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use nix::sys::resource::{UsageWho, getrusage};
use rnic_core::memory::{read_words, write_words};
use rnic_core::{
    AccessFlags, HeapMemory, InitParams, Memory, Mtu, Psn, QpCaps, QpInitAttr, QpType, RtrParams,
    RtsParams, SendWr, WorkCompletion,
};
use rnic_dma::OwnedBuffer;
use rnic_rxe::{Progress, RxeConfig, RxeDevice, Target};

/// (user, system) CPU time of `who` so far.
fn cpu(who: UsageWho) -> (Duration, Duration) {
    let u = getrusage(who).unwrap();
    let d = |t: nix::sys::time::TimeVal| {
        Duration::from_micros(t.tv_sec() as u64 * 1_000_000 + t.tv_usec() as u64)
    };
    (d(u.user_time()), d(u.system_time()))
}

/// CPU ns per KiB of `f`, run on `bytes` bytes per call until ~0.4 s of
/// thread CPU time has passed.
fn per_kib(bytes: usize, mut f: impl FnMut()) -> f64 {
    f(); // warm
    let (u0, s0) = cpu(UsageWho::RUSAGE_THREAD);
    let mut moved = 0u64;
    loop {
        f();
        moved += bytes as u64;
        let (u, s) = cpu(UsageWho::RUSAGE_THREAD);
        let t = (u + s) - (u0 + s0);
        if t >= Duration::from_millis(400) {
            return t.as_nanos() as f64 * 1024.0 / moved as f64;
        }
    }
}

fn parts() {
    println!(
        "step                                  64 KiB (cache)   64 MiB (memory)   ns per KiB, CPU time"
    );
    for (name, which) in [
        ("atomic-word read (read_words)", 0),
        ("atomic-word write (write_words)", 1),
        ("rep movsb read (copy::read_span)", 2),
        ("rep movsb write (copy::write_span)", 3),
        ("memcpy (copy_from_slice)", 4),
        ("CRC-32 (crc32fast, the ICRC)", 5),
        ("CRC-32 in place (crc::crc32_span)", 6),
    ] {
        let mut row = Vec::new();
        for len in [64 << 10, 64 << 20] {
            let words: Vec<AtomicU64> = (0..len / 8).map(|_| AtomicU64::new(0)).collect();
            let mem = HeapMemory::new(len);
            let span = mem.direct().unwrap();
            let mut buf = vec![0x5au8; len];
            let src = vec![0xa5u8; len];
            let v = per_kib(len, || match which {
                0 => read_words(&words, 0, &mut buf).unwrap(),
                1 => write_words(&words, 0, &src).unwrap(),
                2 => rnic_dma::copy::read_span(&span, 0, &mut buf).unwrap(),
                3 => rnic_dma::copy::write_span(&span, 0, &src).unwrap(),
                4 => buf.copy_from_slice(black_box(&src)),
                6 => {
                    let mut crc = 0;
                    for at in (0..len).step_by(4096) {
                        crc = rnic_dma::crc::crc32_span(crc, &span, at, 4096).unwrap();
                    }
                    black_box(crc);
                }
                _ => {
                    let mut h = crc32fast::Hasher::new();
                    for p in src.chunks(4096) {
                        h.update(p);
                    }
                    black_box(h.finalize());
                }
            });
            black_box(&buf);
            row.push(v);
        }
        println!("{name:<38} {:>10.1}        {:>10.1}", row[0], row[1]);
    }
}

fn path(size: usize, n: usize, owned: bool, read: bool) {
    let open = |ip: [u8; 4]| {
        RxeDevice::open(
            &RxeConfig::new(Target::Ip(IpAddr::V4(Ipv4Addr::from(ip))))
                .with_progress(Progress::Caller)
                .with_max_unacked_psns(1024),
        )
        .unwrap()
    };
    let dev = [open([127, 0, 0, 1]), open([127, 0, 0, 2])];
    let ctx = [dev[0].context(), dev[1].context()];
    let all = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    // WRITEs in flight, each from and to its own slot of the regions:
    // RNIC_BYTE_COST_SLOTS (default 8: 8 MiB regions at 1 MiB, larger than
    // the L2, so every byte comes from and goes to DRAM; rnicctl perf's
    // write-bw uses 2 slots, which stay in the cache).
    let inflight: usize = std::env::var("RNIC_BYTE_COST_SLOTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8)
        .max(1);
    let mk = |ctx: &rnic_core::Context| {
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq_reserved(256).unwrap();
        let mem: Arc<dyn Memory> = if owned {
            OwnedBuffer::zeroed(size * inflight)
        } else {
            Arc::new(HeapMemory::new(size * inflight))
        };
        // Every page written (a fresh calloc'd buffer would otherwise be
        // read from the kernel's shared zero page, which is always cached).
        let fill: Vec<u8> = (0..size * inflight).map(|i| (i * 7 + 1) as u8).collect();
        mem.write(0, &fill).unwrap();
        let mr = pd.reg_mr(mem, all).unwrap();
        let caps = QpCaps {
            max_send_wr: 64,
            max_recv_wr: 64,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let mut qp = pd
            .create_qp(&cq, &cq, &QpInitAttr::new(QpType::Rc, caps))
            .unwrap();
        qp.to_init(&InitParams {
            access: all,
            ..InitParams::default()
        })
        .unwrap();
        (pd, cq, mr, qp)
    };
    let (_pa, mut cqa, mra, mut qa) = mk(&ctx[0]);
    let (_pb, _cqb, mrb, mut qb) = mk(&ctx[1]);
    let (ga, gb) = (dev[0].gids()[0], dev[1].gids()[0]);
    let rtr = RtrParams {
        path_mtu: Mtu::Mtu4096,
        ..RtrParams::default()
    };
    qa.to_rtr(qb.qpn(), Psn::from_wire(1), gb, &rtr).unwrap();
    qb.to_rtr(qa.qpn(), Psn::from_wire(2), ga, &rtr).unwrap();
    qa.to_rts(Psn::from_wire(2), &RtsParams::default()).unwrap();
    qb.to_rts(Psn::from_wire(1), &RtsParams::default()).unwrap();
    let mut wcs = [WorkCompletion::default(); 16];
    let len = u32::try_from(size).unwrap();
    let t_wall = std::time::Instant::now();
    let (u0, s0) = cpu(UsageWho::RUSAGE_SELF);
    let (mut posted, mut done) = (0usize, 0usize);
    while done < n {
        while posted < n && posted - done < inflight {
            let slot = (posted % inflight) * size;
            let sge = [mra.sge(slot, len).unwrap()];
            let remote = mrb.addr() + slot as u64;
            let wr = [if read {
                SendWr::rdma_read(posted as u64, &sge, remote, mrb.rkey()).signaled()
            } else {
                SendWr::rdma_write(posted as u64, &sge, remote, mrb.rkey()).signaled()
            }];
            qa.post_send(&wr).unwrap();
            posted += 1;
        }
        let got = cqa.poll(&mut wcs).unwrap();
        for wc in &wcs[..got] {
            assert!(wc.is_success(), "{wc:?}");
        }
        done += got;
        dev[1].progress();
    }
    let (u, s) = cpu(UsageWho::RUSAGE_SELF);
    let wall = t_wall.elapsed();
    let (user, sys) = (u - u0, s - s0);
    let bytes = (n * size) as f64;
    let kib = bytes / 1024.0;
    let (sa, sb) = (dev[0].stats().device, dev[1].stats().device);
    println!(
        "{n} {} of {size} B ({} memory), one thread, both ends: CPU {:.3} s (user {:.3}, sys {:.3}), wall {:.3} s",
        if read { "READs" } else { "WRITEs" },
        if owned { "OwnedBuffer" } else { "HeapMemory" },
        (user + sys).as_secs_f64(),
        user.as_secs_f64(),
        sys.as_secs_f64(),
        wall.as_secs_f64()
    );
    println!(
        "  per KiB: {:.1} ns CPU (user {:.1}, sys {:.1}); {:.3} CPU·s/GB; {:.2} GB/s per core",
        (user + sys).as_nanos() as f64 / kib,
        user.as_nanos() as f64 / kib,
        sys.as_nanos() as f64 / kib,
        (user + sys).as_secs_f64() / (bytes / 1e9),
        bytes / 1e9 / (user + sys).as_secs_f64()
    );
    let (tx, rx) = if read { (&sb, &sa) } else { (&sa, &sb) };
    println!(
        "  data sender: {} sendmmsg, {} datagrams ({} GSO sends); data receiver: {} receive calls, {} datagrams, {} packets, {} placed ({} bytes), {} placement fallbacks",
        tx.sendmmsg_calls,
        tx.tx_datagrams,
        tx.gso_sends,
        rx.recvmmsg_calls,
        rx.rx_datagrams,
        rx.rx_packets,
        rx.rx_placed,
        rx.rx_placed_bytes,
        rx.rx_place_fallbacks
    );
    drop(qb);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("parts") | None => parts(),
        Some("path") => {
            let size = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(1 << 20);
            let n = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(1000);
            let owned = args.get(4).is_some_and(|a| a == "owned");
            let read = args.get(5).is_some_and(|a| a == "read");
            path(size, n, owned, read);
        }
        Some(other) => {
            eprintln!("unknown mode {other}: parts | path [SIZE] [N] [heap|owned] [write|read]")
        }
    }
}
