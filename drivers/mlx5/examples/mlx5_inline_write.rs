//! Cost of the data path: one 8-byte inline RDMA WRITE (BlueFlame) posted
//! and its CQE polled, in a loop, against rnic-mlx5-emu and an rnic-rxe peer
//! on 127.x — three ways: the driver's generic calls (`Qp::post_send` /
//! `Cq::poll`), its direct fast path (`Qp::post_write_inline` /
//! `Cq::poll_send`), and through `rnic_core::Provider` (a typed
//! `Context<Mlx5Provider>`: `QueuePair::post_send` / `CompletionQueue::poll`).
//!
//! The emulator runs in this process unless `RNIC_MLX5_EMU_SOCKET` names the
//! socket of one running in its own process (`rnic-mlx5-emu --socket PATH
//! --once`), which is how docs/mlx5.md §13 counts instructions:
//!
//! ```sh
//! cargo build --release -p rnic-mlx5-emu --bin rnic-mlx5-emu
//! cargo build --release -p rnic-mlx5 --example mlx5_inline_write
//! target/release/rnic-mlx5-emu --socket /tmp/emu.sock --once &
//! RNIC_MLX5_EMU_SOCKET=/tmp/emu.sock valgrind --tool=callgrind \
//!   --callgrind-out-file=/tmp/mlx5.cg \
//!   --toggle-collect='mlx5_inline_write::bench_*' \
//!   target/release/examples/mlx5_inline_write 2000
//! callgrind_annotate --threshold=100 --inclusive=yes /tmp/mlx5.cg | grep 'mlx5_inline_write::bench_'
//! ```
//! Divide each function's inclusive Ir by the iteration count plus the
//! warm-up (2000 + 200). Take each function's largest line: callgrind
//! names a function by the file of its first instruction, which for a
//! wrapper without a prologue is the inlined callee's (`bench_poll_send`
//! starts in `src/ring.rs`), and lists the other files' lines below it.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rnic_core::{
    AccessFlags, CompletionQueue, Gid, HeapMemory, InitParams, Mtu, Psn, QpCaps, QpInitAttr,
    QpType, QueuePair, Rkey, RtrParams, RtsParams, SendFlags, SendWr, Sge, WcStatus,
    WorkCompletion,
};
use rnic_mlx5::{
    Cq, Hca, HcaOptions, Mkey, Mlx5Provider, PciFunction, Qp, QpOptions, Refused, SendCompletion,
    VfioUserFunction,
};
use rnic_mlx5_emu::{Emulator, Options};

const WARMUP: u64 = 200;

const ALL: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

#[inline(never)]
fn bench_post(qp: &mut Qp, wr: &SendWr<'_>) {
    if let Err(e) = qp.post_send(std::slice::from_ref(wr)) {
        panic!("post_send: {e}");
    }
}

/// (Returns the result for the caller to test: the direct path's refusal
/// comes back in registers, so the wrapper needs no frame of its own.)
#[inline(never)]
fn bench_post_inline(qp: &mut Qp, remote: u64, rkey: Rkey, data: &[u8; 8]) -> Result<(), Refused> {
    qp.post_write_inline(1, remote, rkey, data, true)
}

#[inline(never)]
fn bench_poll_send(cq: &mut Cq) -> Option<SendCompletion> {
    cq.poll_send()
}

#[inline(never)]
fn bench_poll(cq: &mut Cq, wcs: &mut [WorkCompletion]) -> usize {
    cq.poll(wcs)
}

#[inline(never)]
fn bench_provider_post(qp: &mut QueuePair<Mlx5Provider>, wr: &SendWr<'_>) {
    if let Err(e) = qp.post_send(std::slice::from_ref(wr)) {
        panic!("post_send: {e}");
    }
}

#[inline(never)]
fn bench_provider_poll(
    cq: &mut CompletionQueue<Mlx5Provider>,
    wcs: &mut [WorkCompletion],
) -> usize {
    match cq.poll(wcs) {
        Ok(n) => n,
        Err(e) => panic!("poll: {e}"),
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let iters: u64 = std::env::args()
        .nth(1)
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(20_000);
    let dir = tempfile::tempdir()?;
    let (_emu, socket) = match std::env::var_os("RNIC_MLX5_EMU_SOCKET") {
        Some(path) => (None, std::path::PathBuf::from(path)),
        None => {
            let emu = Emulator::start(dir.path().join("mlx5.sock"), Options::default())?;
            let socket = emu.socket().to_path_buf();
            (Some(emu), socket)
        }
    };
    let f: Arc<dyn PciFunction> = Arc::new(VfioUserFunction::connect(&socket)?);
    let hca = Hca::bring_up(
        f,
        HcaOptions {
            cmd_timeout: Some(Duration::from_secs(30)),
            // RNIC_MLX5_WC=0: the 8-byte doorbell path a UC mapping gives.
            write_combining: std::env::var("RNIC_MLX5_WC").map_or(true, |v| v != "0"),
            ..HcaOptions::default()
        },
    )?;
    eprintln!("doorbells: {}", hca.info().doorbells);
    // One function for all three ways: the provider owns the `Hca`, the
    // direct objects share it.
    let provider = Mlx5Provider::new(hca)?;
    let hca = provider.hca().clone();
    let b = 200 + (std::process::id() % 50) as u8;
    let emu_ip = IpAddr::V4(Ipv4Addr::new(127, 251, b, 1));
    let peer_ip = Ipv4Addr::new(127, 251, b, 2);
    provider.set_gid(0, emu_ip)?;
    let mut cq = Cq::new(&hca, 256)?;
    let mkey = Mkey::new(&hca, hca.function().alloc_dma(4096)?, ALL)?;
    let mut qp = Qp::new(&hca, &mut cq, None, QpOptions::default())?;
    qp.use_region(&mkey);

    let dev = rnic_rxe::RxeDevice::open(
        &rnic_rxe::RxeConfig::new(rnic_rxe::Target::Ip(IpAddr::V4(peer_ip)))
            .with_progress(rnic_rxe::Progress::Thread),
    )?;
    let ctx = dev.context();
    let pd = ctx.alloc_pd()?;
    let pcq = ctx.create_cq(64)?;
    let mr = pd.reg_mr(Arc::new(HeapMemory::new(4096)), ALL)?;
    let caps = QpCaps {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 64,
    };
    let mut pqp = pd.create_qp(&pcq, &pcq, &QpInitAttr::new(QpType::Rc, caps))?;
    let init = InitParams {
        access: ALL,
        ..InitParams::default()
    };
    let rtr = RtrParams {
        path_mtu: Mtu::Mtu1024,
        ..RtrParams::default()
    };
    let rts = RtsParams::default();
    pqp.to_init(&init)?;
    pqp.to_rtr(qp.qpn(), Psn::from_wire(1), Gid::from_ip(emu_ip), &rtr)?;
    pqp.to_rts(Psn::from_wire(2), &rts)?;
    qp.connect(
        &init,
        pqp.qpn(),
        Gid::from_ipv4(peer_ip),
        Psn::from_wire(2),
        Psn::from_wire(1),
        &rtr,
        &rts,
    )?;

    mkey.memory().write(0, b"8 bytes!")?;
    let sge = [Sge::new(mkey.addr(), 8, mkey.lkey())];
    let mut wr = SendWr::rdma_write(1, &sge, mr.addr(), mr.rkey());
    wr.flags = SendFlags::INLINE | SendFlags::SIGNALED;
    let mut wcs = [WorkCompletion::default(); 1];
    let mut run = |n: u64| -> Duration {
        let start = Instant::now();
        for _ in 0..n {
            bench_post(&mut qp, &wr);
            while !cq.pending() {
                std::hint::spin_loop();
            }
            let got = bench_poll(&mut cq, &mut wcs);
            assert!(got == 1 && wcs[0].status == WcStatus::Success, "{wcs:?}");
        }
        start.elapsed()
    };
    run(WARMUP);
    let t = run(iters);
    // The direct fast path: the same WRITE through `post_write_inline` and
    // `poll_send`.
    let (remote, rkey, data) = (mr.addr(), mr.rkey(), *b"8 bytes!");
    let mut fast = |n: u64| -> Duration {
        let start = Instant::now();
        for _ in 0..n {
            if let Err(e) = bench_post_inline(&mut qp, remote, rkey, &data) {
                panic!("post_write_inline: {e}");
            }
            while !cq.pending() {
                std::hint::spin_loop();
            }
            let got = bench_poll_send(&mut cq);
            assert!(
                got.is_some_and(|c| c.status() == WcStatus::Success),
                "{got:?}"
            );
        }
        start.elapsed()
    };
    fast(WARMUP);
    let tf = fast(iters);
    // Through `rnic_core::Provider`: a typed context, its own QP and CQ, a
    // second rxe QP as the peer.
    let tctx = Mlx5Provider::typed_context(&provider);
    let tpd = tctx.alloc_pd()?;
    let mut tcq = tctx.create_cq_reserved(64)?;
    let tmr = tpd.reg_mr(provider.alloc_dma(4096)?, ALL)?;
    rnic_core::Memory::write(tmr.memory().as_ref(), 0, b"8 bytes!")?;
    let mut tqp = tpd.create_qp(&tcq, &tcq, &QpInitAttr::new(QpType::Rc, caps))?;
    let mut pqp2 = pd.create_qp(&pcq, &pcq, &QpInitAttr::new(QpType::Rc, caps))?;
    pqp2.to_init(&init)?;
    pqp2.to_rtr(tqp.qpn(), Psn::from_wire(1), Gid::from_ip(emu_ip), &rtr)?;
    pqp2.to_rts(Psn::from_wire(2), &rts)?;
    tqp.to_init(&init)?;
    tqp.to_rtr(pqp2.qpn(), Psn::from_wire(2), Gid::from_ipv4(peer_ip), &rtr)?;
    tqp.to_rts(Psn::from_wire(1), &rts)?;
    let tsge = [Sge::new(tmr.addr(), 8, tmr.lkey())];
    let mut twr = SendWr::rdma_write(1, &tsge, mr.addr(), mr.rkey());
    twr.flags = SendFlags::INLINE | SendFlags::SIGNALED;
    let mut through = |n: u64| -> Duration {
        let start = Instant::now();
        for _ in 0..n {
            bench_provider_post(&mut tqp, &twr);
            while !tcq.driver_cq().pending() {
                std::hint::spin_loop();
            }
            let got = bench_provider_poll(&mut tcq, &mut wcs);
            assert!(got == 1 && wcs[0].status == WcStatus::Success, "{wcs:?}");
        }
        start.elapsed()
    };
    through(WARMUP);
    let tp = through(iters);
    println!(
        "{iters} inline 8-byte WRITEs (+{WARMUP} warm-up) per path: post_send/poll {:.2} µs, \
         post_write_inline/poll_send {:.2} µs, Provider {:.2} µs per post+completion round \
         trip (emulator + rxe peer included); BlueFlame rings {}",
        t.as_secs_f64() * 1e6 / iters as f64,
        tf.as_secs_f64() * 1e6 / iters as f64,
        tp.as_secs_f64() * 1e6 / iters as f64,
        qp.counters().blueflame
    );
    drop((tqp, tcq, tmr, tpd, tctx));
    drop((qp, cq, mkey, hca));
    drop(provider);
    Ok(())
}
