//! Loopback benchmarks: RDMA WRITE bandwidth (4 KiB … 4 MiB) and 8-byte
//! WRITE / SEND one-way latency (busy poll, caller-driven), two devices on
//! 127.x addresses in one process.
//!
//! `cargo bench -p rnic-rxe --bench loopback`
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use rnic_core::{
    AccessFlags, CompletionQueue, HeapMemory, InitParams, MemoryRegion, Mtu, Psn, QpCaps,
    QpInitAttr, QpType, QueuePair, RecvWr, RtrParams, RtsParams, SendWr, WcStatus, WorkCompletion,
};
use rnic_rxe::{Progress, RxeConfig, RxeDevice, Target};

const ALL: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ);

struct Ep {
    dev: RxeDevice,
    cq: CompletionQueue,
    mr: MemoryRegion,
    qp: QueuePair,
}

/// The requester window both ends use: `RNIC_BENCH_WINDOW` PSNs, else 1024
/// (rnic to rnic; rxe's default of 128 is for kernel rxe peers).
fn window() -> u32 {
    std::env::var("RNIC_BENCH_WINDOW")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024)
}

fn ep(ip: [u8; 4], buf: usize, progress: Progress) -> Ep {
    let dev = RxeDevice::open(
        &RxeConfig::new(Target::Ip(IpAddr::V4(Ipv4Addr::from(ip))))
            .with_progress(progress)
            .with_max_unacked_psns(window()),
    )
    .unwrap();
    let ctx = dev.context();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq_reserved(1024).unwrap();
    let mr = pd.reg_mr(Arc::new(HeapMemory::new(buf)), ALL).unwrap();
    let caps = QpCaps {
        max_send_wr: 256,
        max_recv_wr: 256,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 64,
    };
    let qp = pd
        .create_qp(&cq, &cq, &QpInitAttr::new(QpType::Rc, caps))
        .unwrap();
    Ep { dev, cq, mr, qp }
}

/// Devices a (requester) and b (responder) with one RC QP each, connected.
fn pair(buf: usize, pa: Progress, pb: Progress, net: u8) -> (Ep, Ep) {
    let mut a = ep([127, 33, net, 1], buf, pa);
    let mut b = ep([127, 33, net, 2], buf, pb);
    let init = InitParams {
        access: ALL,
        ..InitParams::default()
    };
    let rtr = RtrParams {
        path_mtu: Mtu::Mtu4096,
        max_dest_rd_atomic: 16,
        ..RtrParams::default()
    };
    let rts = RtsParams {
        max_rd_atomic: 16,
        ..RtsParams::default()
    };
    let (ga, gb) = (a.dev.gids()[0], b.dev.gids()[0]);
    a.qp.to_init(&init).unwrap();
    b.qp.to_init(&init).unwrap();
    b.qp.to_rtr(a.qp.qpn(), Psn::from_wire(1), ga, &rtr)
        .unwrap();
    b.qp.to_rts(Psn::from_wire(2), &rts).unwrap();
    a.qp.to_rtr(b.qp.qpn(), Psn::from_wire(2), gb, &rtr)
        .unwrap();
    a.qp.to_rts(Psn::from_wire(1), &rts).unwrap();
    (a, b)
}

/// Wait for `n` successful completions on `cq`, kicking `other`.
fn reap(cq: &mut CompletionQueue, n: usize, other: Option<&RxeDevice>) {
    let mut wcs = [WorkCompletion::default(); 32];
    let mut got = 0;
    while got < n {
        let k = cq.poll(&mut wcs).unwrap();
        for w in &wcs[..k] {
            assert_eq!(w.status, WcStatus::Success);
        }
        got += k;
        if let Some(o) = other.filter(|_| k == 0) {
            o.progress();
        }
    }
}

/// CPU seconds this process used so far.
fn cpu_secs() -> f64 {
    let r = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF).unwrap();
    let (u, s) = (r.user_time(), r.system_time());
    u.tv_sec() as f64 + u.tv_usec() as f64 / 1e6 + s.tv_sec() as f64 + s.tv_usec() as f64 / 1e6
}

fn write_bw(c: &mut Criterion) {
    let mut g = c.benchmark_group("write_bw");
    g.sample_size(10).measurement_time(Duration::from_secs(3));
    // The sender busy-polls its CQ and so drives its own device
    // (caller-driven: no second thread on its side); the responder runs its
    // progress thread, as a remote host would. Two busy threads in all, as in
    // ucx_perftest's client/server pair.
    let (mut a, b) = pair(8 << 20, Progress::Caller, Progress::Thread, 1);
    for size in [4usize << 10, 64 << 10, 1 << 20, 4 << 20] {
        // Stream WRITEs with `depth` in flight (16 MiB, at most 128 WRs),
        // every `sig`-th signaled, posting a new chunk of `sig` as soon as a
        // completion frees room: the pipe never drains between criterion
        // iterations (as in ib_write_bw / ucx_perftest put_bw). One
        // iteration accounts for `depth` messages.
        let depth = ((16usize << 20) / size).clamp(1, 128);
        let sig = (depth / 4).max(1);
        g.throughput(Throughput::Bytes((size * depth) as u64));
        let src = [a.mr.sge(0, size as u32).unwrap()];
        let chunk: Vec<SendWr<'_>> = (0..sig)
            .map(|i| {
                let w = SendWr::rdma_write(i as u64, &src, b.mr.addr(), b.mr.rkey());
                if i + 1 == sig { w.signaled() } else { w }
            })
            .collect();
        let cpu0 = cpu_secs();
        let t0 = Instant::now();
        g.bench_with_input(BenchmarkId::from_parameter(size), &size, |bch, _| {
            bch.iter_custom(|iters| {
                let total = iters as usize * depth;
                let (mut posted, mut done) = (0usize, 0usize);
                let mut wcs = [WorkCompletion::default(); 32];
                let start = Instant::now();
                while done < total {
                    while posted < total && posted - done + sig <= depth {
                        a.qp.post_send(&chunk).unwrap();
                        posted += sig;
                    }
                    let k = a.cq.poll(&mut wcs).unwrap();
                    for w in &wcs[..k] {
                        assert_eq!(w.status, WcStatus::Success);
                    }
                    done += k * sig;
                }
                start.elapsed()
            });
        });
        let (wall, cpu) = (t0.elapsed().as_secs_f64(), cpu_secs() - cpu0);
        eprintln!(
            "write_bw {size}: process CPU {:.0}% of one core",
            100.0 * cpu / wall
        );
    }
    let s = a.dev.stats().device;
    eprintln!(
        "sender: {} packets, {} datagrams, {} GSO sends / {} segments, {} sendmmsg",
        s.tx_packets, s.tx_datagrams, s.gso_sends, s.gso_segments, s.sendmmsg_calls
    );
    let s = b.dev.stats().device;
    eprintln!(
        "receiver: {} packets, {} datagrams, {} GRO datagrams / {} segments, icrc ok {} recovered {} drops {}; {} ACKs sent, {} coalesced",
        s.rx_packets,
        s.rx_datagrams,
        s.gro_datagrams,
        s.gro_segments,
        s.icrc_ok,
        s.icrc_recovered,
        s.icrc_drops,
        s.tx_packets,
        s.acks_coalesced
    );
    g.finish();
}

/// Poll `cq` (kicking `other`) until a receive completion arrives; other
/// completions (signaled sends) are only checked.
fn reap_recv(cq: &mut CompletionQueue, other: &RxeDevice) {
    let mut wcs = [WorkCompletion::default(); 8];
    loop {
        let k = cq.poll(&mut wcs).unwrap();
        let mut seen = false;
        for w in &wcs[..k] {
            assert_eq!(w.status, WcStatus::Success);
            seen |= w.opcode.is_recv();
        }
        if seen {
            return;
        }
        if k == 0 {
            other.progress();
        }
    }
}

fn spin_until(dev: &RxeDevice, other: &RxeDevice, mr: &MemoryRegion, off: usize, want: u64) {
    let mut b = [0u8; 8];
    loop {
        dev.progress();
        mr.memory().read(off, &mut b).unwrap();
        if u64::from_le_bytes(b) == want {
            return;
        }
        other.progress();
    }
}

fn latency(c: &mut Criterion) {
    let mut g = c.benchmark_group("latency_8B_rtt");
    g.sample_size(20).measurement_time(Duration::from_secs(3));
    let (mut a, mut b) = pair(1 << 16, Progress::Caller, Progress::Caller, 2);
    let src = [a.mr.sge(0, 8).unwrap()];
    let bsrc = [b.mr.sge(16, 8).unwrap()];
    // ib_write_lat style: a WRITEs a sequence number into b, b spins on its
    // memory and WRITEs it back into a, a spins. One iteration = one round
    // trip; one-way latency = half of it. Every 64th WRITE is signaled.
    let mut seq = 0u64;
    g.bench_function("write", |bch| {
        bch.iter(|| {
            seq += 1;
            let sig = seq.is_multiple_of(64);
            a.mr.memory().write(0, &seq.to_le_bytes()).unwrap();
            let w = SendWr::rdma_write(1, &src, b.mr.addr(), b.mr.rkey());
            a.qp.post_send(&[if sig { w.signaled() } else { w }])
                .unwrap();
            spin_until(&b.dev, &a.dev, &b.mr, 0, seq);
            b.mr.memory().write(16, &seq.to_le_bytes()).unwrap();
            let w = SendWr::rdma_write(2, &bsrc, a.mr.addr() + 8, a.mr.rkey());
            b.qp.post_send(&[if sig { w.signaled() } else { w }])
                .unwrap();
            spin_until(&a.dev, &b.dev, &a.mr, 8, seq);
            if sig {
                reap(&mut a.cq, 1, Some(&b.dev));
                reap(&mut b.cq, 1, Some(&a.dev));
            }
        });
    });
    // SEND ping-pong: receives pre-posted, sends unsignaled but every 64th.
    let rs = [b.mr.sge(32, 8).unwrap()];
    let ra = [a.mr.sge(32, 8).unwrap()];
    let mut n = 0u64;
    g.bench_function("send", |bch| {
        bch.iter(|| {
            n += 1;
            let sig = n.is_multiple_of(64);
            b.qp.post_recv(&[RecvWr::new(1, &rs)]).unwrap();
            a.qp.post_recv(&[RecvWr::new(1, &ra)]).unwrap();
            let w = SendWr::send(1, &src);
            a.qp.post_send(&[if sig { w.signaled() } else { w }])
                .unwrap();
            reap_recv(&mut b.cq, &a.dev);
            let w = SendWr::send(2, &bsrc);
            b.qp.post_send(&[if sig { w.signaled() } else { w }])
                .unwrap();
            reap_recv(&mut a.cq, &b.dev);
        });
    });
    g.finish();
}

criterion_group!(benches, write_bw, latency);
criterion_main!(benches);
