//! `loopback`: rnic's main job on its embedded default — two rxe devices on
//! loopback (`rxe:127.0.0.1` and `rxe:127.0.0.2`), connected through the
//! ibv_rc_pingpong TCP exchange, moving real bytes with every RC operation and
//! checking every one of them.
//!
//! ```text
//! cargo run --release --example loopback                 # 64 MiB, MTU 4096
//! cargo run --release --example loopback -- --size 1MiB --iters 200 --mtu 1024
//! ```
//!
//! On mlx5 (`--a mlx5:vfio-user:/tmp/a.sock@127.0.0.1 --b
//! mlx5:vfio-user:/tmp/b.sock@127.0.0.2 --size 1MiB --mtu 1024`, or one end
//! of each) the buffers are the functions' own DMA buffers
//! ([`rnic::MemorySource`]) and the counters printed are the rxe end's.
//!
//! Steps: allocate both buffers with rnic-dma (hugepages preferred, NUMA
//! placement verified page by page), register them, connect an RC QP pair,
//! then RDMA WRITE A→B (timed, `--iters` times, `--depth` in flight), READ it
//! back B→A, SEND WITH IMMEDIATE, FETCH_ADD and CMP_SWP — each verified
//! byte for byte — and print throughput and the devices' counters. Exits
//! non-zero on the first mismatch.

use std::net::TcpListener;
use std::process::ExitCode;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Parser;
use rnic::core::exchange::{QpEndpoint, client_exchange, server_exchange};
use rnic::core::{
    AccessFlags, CompletionQueue, Context, Gid, InitParams, Memory, MemoryRegion, Mtu,
    ProtectionDomain, Psn, QpCaps, QpInitAttr, QpType, QueuePair, RecvWr, RtrParams, RtsParams,
    SendWr, WcOpcode, WcStatus, WorkCompletion,
};
use rnic::dma::{DmaRegion, PagePolicy, PageSize};
use rnic::rxe::{RxeConfig, RxeDevice, Target};
use rnic::{DeviceSpec, RxeTarget};

/// Move bytes between two rxe devices on loopback with every RC operation,
/// verify them, and report throughput and counters.
#[derive(Parser, Debug)]
#[command(name = "loopback", version)]
struct Args {
    /// Requester device (a device spec).
    #[arg(long, default_value = "rxe:127.0.0.1")]
    a: String,
    /// Responder device (a device spec).
    #[arg(long, default_value = "rxe:127.0.0.2")]
    b: String,
    /// Bytes per RDMA WRITE / READ (suffixes KiB, MiB, GiB accepted).
    #[arg(long, default_value = "64MiB", value_parser = parse_size)]
    size: usize,
    /// Timed WRITEs.
    #[arg(long, default_value_t = 16)]
    iters: u32,
    /// WRITEs in flight at once.
    #[arg(long, default_value_t = 4)]
    depth: u32,
    /// Path MTU: 256, 512, 1024, 2048 or 4096.
    #[arg(long, default_value_t = 4096)]
    mtu: u32,
    /// TCP port of the endpoint exchange (0: pick a free one).
    #[arg(long, default_value_t = 0)]
    port: u16,
}

fn parse_size(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let (num, mult) = [("GiB", 1usize << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)]
        .iter()
        .find_map(|(suf, m)| s.strip_suffix(suf).map(|n| (n, *m)))
        .unwrap_or((s, 1));
    let n: usize = num
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a size (e.g. 4096, 64KiB, 1MiB)"))?;
    match n.checked_mul(mult) {
        Some(v) if v > 0 && v <= (1 << 31) => Ok(v),
        _ => Err(format!("{s:?}: size must be between 1 byte and 2 GiB")),
    }
}

/// Requester window (unacknowledged PSNs) between two rnic ends; see
/// docs/benchmarks.md for what it buys over rxe's 128.
const WINDOW_PSNS: u32 = 1024;

/// One side: device, verbs objects, and its buffer (two halves of `size`).
struct Side {
    name: &'static str,
    /// The rxe device (counters); `None` on mlx5.
    dev: Option<RxeDevice>,
    gid: Gid,
    ctx: Context,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    mem: Arc<dyn Memory>,
    mr: MemoryRegion,
}

/// All access rights the demo's operations need.
const ACCESS: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

/// An mlx5 side: the function's DMA buffer, GID 0 from the spec's `@<ip>`.
fn open_mlx5_side(name: &'static str, spec: &str, size: usize) -> Result<Side, String> {
    let (ctx, memory) = rnic::open_with_memory(spec).map_err(|e| rnic::error_chain(&e))?;
    let gid = ctx
        .query_gid_table(1)
        .map_err(|e| e.to_string())?
        .first()
        .map(|g| g.gid)
        .ok_or_else(|| format!("{spec}: no GID programmed: end the spec with @<ip>"))?;
    let pd = ctx.alloc_pd().map_err(|e| e.to_string())?;
    let cq = ctx.create_cq(512).map_err(|e| e.to_string())?;
    let mem = memory
        .alloc(2 * size)
        .map_err(|e| format!("allocating {} bytes for {name}: {e}", 2 * size))?;
    println!(
        "  {name}: {spec:<16} GID {gid:<18} buffer {} KiB of the function's DMA memory",
        (2 * size) >> 10,
    );
    let mr = pd.reg_mr(mem.clone(), ACCESS).map_err(|e| e.to_string())?;
    Ok(Side {
        name,
        dev: None,
        gid,
        ctx,
        pd,
        cq,
        mem,
        mr,
    })
}

fn open_side(name: &'static str, spec: &str, size: usize) -> Result<Side, String> {
    let target = match spec.parse::<DeviceSpec>().map_err(|e| e.to_string())? {
        DeviceSpec::Rxe(RxeTarget::Ip(ip)) => Target::Ip(ip),
        DeviceSpec::Rxe(RxeTarget::Netdev(n)) => Target::Netdev(n),
        DeviceSpec::Mlx5 { .. } => return open_mlx5_side(name, spec, size),
        other => return Err(format!("{other}: this demo drives rxe and mlx5 only")),
    };
    // Both ends are rnic, so the requester window can exceed rxe's 128 PSNs
    // (keep the default when one end is a kernel rxe peer).
    let cfg = RxeConfig::new(target).with_max_unacked_psns(WINDOW_PSNS);
    let dev = RxeDevice::open(&cfg).map_err(|e| format!("{spec}: {e}"))?;
    let ctx = dev.context();
    let pd = ctx.alloc_pd().map_err(|e| e.to_string())?;
    let cq = ctx.create_cq(512).map_err(|e| e.to_string())?;
    let mem = DmaRegion::builder(2 * size)
        .pages(PagePolicy::Prefer(PageSize::Huge2M))
        .build()
        .map_err(|e| format!("allocating {} bytes for {name}: {e}", 2 * size))?;
    let p = mem.placement();
    println!(
        "  {name}: {spec:<16} GID {:<18} buffer {} MiB on {} pages, {}/{} pages verified on their node",
        dev.gids()
            .first()
            .map(|g| g.to_string())
            .unwrap_or_default(),
        (2 * size) >> 20,
        mem.page_size(),
        p.pages_on_wanted,
        p.pages_checked,
    );
    let mem: Arc<dyn Memory> = mem;
    let mr = pd.reg_mr(mem.clone(), ACCESS).map_err(|e| e.to_string())?;
    let gid = *dev
        .gids()
        .first()
        .ok_or_else(|| format!("{name}: the device has no GID"))?;
    Ok(Side {
        name,
        dev: Some(dev),
        gid,
        ctx,
        pd,
        cq,
        mem,
        mr,
    })
}

fn new_qp(s: &Side) -> Result<QueuePair, String> {
    let caps = QpCaps {
        max_send_wr: 128,
        max_recv_wr: 128,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let mut qp =
        s.pd.create_qp(&s.cq, &s.cq, &QpInitAttr::new(QpType::Rc, caps))
            .map_err(|e| e.to_string())?;
    qp.to_init(&InitParams {
        access: AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC,
        ..InitParams::default()
    })
    .map_err(|e| e.to_string())?;
    Ok(qp)
}

fn random_psn() -> Psn {
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0x9e37_79b9);
    let mut z = t.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    Psn::from_wire((z ^ (z >> 31)) as u32)
}

fn endpoint(s: &Side, qp: &QueuePair) -> Result<QpEndpoint, String> {
    Ok(QpEndpoint {
        lid: 0,
        qpn: qp.qpn(),
        psn: random_psn(),
        gid: s.gid,
    })
}

fn connect(
    qp: &mut QueuePair,
    local: &QpEndpoint,
    remote: &QpEndpoint,
    mtu: Mtu,
) -> Result<(), String> {
    let rtr = RtrParams {
        path_mtu: mtu,
        max_dest_rd_atomic: 16,
        ..RtrParams::default()
    };
    let rts = RtsParams {
        max_rd_atomic: 16,
        ..RtsParams::default()
    };
    qp.to_rtr(remote.qpn, remote.psn, remote.gid, &rtr)
        .map_err(|e| format!("RTR: {e}"))?;
    qp.to_rts(local.psn, &rts).map_err(|e| format!("RTS: {e}"))
}

/// Wait for `n` completions on `cq`, failing on any error status or after 30 s.
fn wait(cq: &mut CompletionQueue, n: usize, what: &str) -> Result<Vec<WorkCompletion>, String> {
    let mut out = Vec::with_capacity(n);
    let mut wcs = [WorkCompletion::default(); 16];
    let deadline = Instant::now() + Duration::from_secs(30);
    while out.len() < n {
        let got = cq.poll(&mut wcs).map_err(|e| e.to_string())?;
        for wc in &wcs[..got] {
            if wc.status != WcStatus::Success {
                return Err(format!(
                    "{what}: completion {} ({:?})",
                    wc.status.as_str(),
                    wc.opcode
                ));
            }
            out.push(*wc);
        }
        if got == 0 {
            if Instant::now() > deadline {
                return Err(format!(
                    "{what}: no completion within 30 s ({} of {n})",
                    out.len()
                ));
            }
            std::hint::spin_loop();
        }
    }
    Ok(out)
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn read(mem: &Arc<dyn Memory>, off: usize, len: usize) -> Result<Vec<u8>, String> {
    let mut v = vec![0u8; len];
    mem.read(off, &mut v).map_err(|e| e.to_string())?;
    Ok(v)
}

fn check(what: &str, got: &[u8], want: &[u8]) -> Result<(), String> {
    match got.iter().zip(want).position(|(g, w)| g != w) {
        None if got.len() == want.len() => {
            println!("  ok    {what}: {} bytes identical", got.len());
            Ok(())
        }
        None => Err(format!("{what}: length {} != {}", got.len(), want.len())),
        Some(i) => Err(format!(
            "{what}: byte {i} differs (got {:#04x}, want {:#04x})",
            got[i], want[i]
        )),
    }
}

fn gbps(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e9
}

fn run(args: &Args) -> Result<(), String> {
    let mtu = Mtu::from_bytes(args.mtu).map_err(|e| e.to_string())?;
    let size = args.size;
    println!(
        "rnic loopback: {} MiB per message, MTU {mtu}, {} timed WRITEs, {} in flight",
        size >> 20,
        args.iters,
        args.depth
    );
    let mut a = open_side("A", &args.a, size)?;
    let mut b = open_side("B", &args.b, size)?;
    let mut qa = new_qp(&a)?;
    let mut qb = new_qp(&b)?;

    // The real ibv_rc_pingpong exchange: B serves, A connects.
    let listener = TcpListener::bind(("127.0.0.1", args.port))
        .map_err(|e| format!("exchange listener: {e}"))?;
    let port = listener.local_addr().map_err(|e| e.to_string())?.port();
    let (ea, eb) = (endpoint(&a, &qa)?, endpoint(&b, &qb)?);
    let server = thread::spawn(move || {
        let r = server_exchange(&listener, &eb, Some(Duration::from_secs(10)), |remote| {
            connect(&mut qb, &eb, remote, mtu)
        });
        r.map(|_| qb).map_err(|e| e.to_string())
    });
    let remote = client_exchange(("127.0.0.1", port), &ea, Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    connect(&mut qa, &ea, &remote, mtu)?;
    let mut qb = server
        .join()
        .map_err(|_| "exchange thread panicked".to_owned())??;
    println!(
        "  connected: A QPN {} ↔ B QPN {} (exchange on 127.0.0.1:{port})",
        qa.qpn(),
        qb.qpn()
    );

    // 1. WRITE A[0..size] → B[0..size], timed, `depth` in flight.
    let data = pattern(size, 0x5eed);
    a.mem.write(0, &data).map_err(|e| e.to_string())?;
    let src = [a.mr.sge(0, size as u32).map_err(|e| e.to_string())?];
    let (raddr, rkey) = (b.mr.addr(), b.mr.rkey());
    let t0 = Instant::now();
    let (mut posted, mut done) = (0u32, 0u32);
    let mut wcs = [WorkCompletion::default(); 16];
    let mut last_report = Instant::now();
    while done < args.iters {
        while posted < args.iters && posted - done < args.depth {
            qa.post_send(&[SendWr::rdma_write(u64::from(posted), &src, raddr, rkey).signaled()])
                .map_err(|e| format!("post WRITE: {e}"))?;
            posted += 1;
        }
        let n = a.cq.poll(&mut wcs).map_err(|e| e.to_string())?;
        for wc in &wcs[..n] {
            if wc.status != WcStatus::Success {
                return Err(format!("WRITE completed with {}", wc.status.as_str()));
            }
            done += 1;
        }
        if last_report.elapsed() > Duration::from_secs(1) {
            eprintln!(
                "  … {done}/{} WRITEs, {:.2} GB/s so far",
                args.iters,
                gbps(u64::from(done) * size as u64, t0.elapsed())
            );
            last_report = Instant::now();
        }
        if t0.elapsed() > Duration::from_secs(120) {
            return Err(format!(
                "WRITE: only {done} of {} completed in 120 s",
                args.iters
            ));
        }
    }
    let wt = t0.elapsed();
    check("RDMA WRITE A→B", &read(&b.mem, 0, size)?, &data)?;

    // 2. READ B[0..size] → A[size..2size].
    let dst = [a.mr.sge(size, size as u32).map_err(|e| e.to_string())?];
    let t1 = Instant::now();
    qa.post_send(&[SendWr::rdma_read(1000, &dst, raddr, rkey).signaled()])
        .map_err(|e| format!("post READ: {e}"))?;
    let wc = wait(&mut a.cq, 1, "READ")?;
    let rt = t1.elapsed();
    if wc[0].opcode != WcOpcode::RdmaRead {
        return Err(format!("READ completed as {:?}", wc[0].opcode));
    }
    check("RDMA READ  B→A", &read(&a.mem, size, size)?, &data)?;

    // 3. SEND WITH IMMEDIATE: 4 KiB from A into B's second half.
    let msg = pattern(4096, 0xabc);
    a.mem.write(0, &msg).map_err(|e| e.to_string())?;
    let rsge = [b.mr.sge(size, 4096).map_err(|e| e.to_string())?];
    qb.post_recv(&[RecvWr::new(7, &rsge)])
        .map_err(|e| e.to_string())?;
    let ssge = [a.mr.sge(0, 4096).map_err(|e| e.to_string())?];
    qa.post_send(&[SendWr::send_with_imm(2000, &ssge, 0xC0FFEE).signaled()])
        .map_err(|e| e.to_string())?;
    wait(&mut a.cq, 1, "SEND")?;
    let rwc = wait(&mut b.cq, 1, "RECV")?;
    if rwc[0].imm_data != Some(0xC0FFEE) || rwc[0].byte_len != 4096 {
        return Err(format!(
            "RECV: imm {:?}, {} bytes",
            rwc[0].imm_data, rwc[0].byte_len
        ));
    }
    check(
        "SEND+IMM   A→B (imm 0xc0ffee)",
        &read(&b.mem, size, 4096)?,
        &msg,
    )?;

    // 4. Atomics on B's first 8 bytes: FETCH_ADD ×100, then CMP_SWP. An
    // mlx5 function (no atomic endianness mode) keeps the target word and
    // returns the original value big-endian; rxe uses host order.
    type WordOrder = (fn(u64) -> [u8; 8], fn([u8; 8]) -> u64);
    let order = |s: &Side| -> WordOrder {
        if s.dev.is_none() {
            (u64::to_be_bytes, u64::from_be_bytes)
        } else {
            (u64::to_ne_bytes, u64::from_ne_bytes)
        }
    };
    let ((b_enc, b_dec), (_, a_dec)) = (order(&b), order(&a));
    b.mem.write(0, &b_enc(1000)).map_err(|e| e.to_string())?;
    let res = [a.mr.sge(size, 8).map_err(|e| e.to_string())?];
    for i in 0..100u64 {
        qa.post_send(&[SendWr::atomic_fetch_add(3000 + i, &res, raddr, rkey, 7).signaled()])
            .map_err(|e| e.to_string())?;
        wait(&mut a.cq, 1, "FETCH_ADD")?;
        let old = a_dec(
            read(&a.mem, size, 8)?
                .try_into()
                .map_err(|_| "short read")?,
        );
        if old != 1000 + 7 * i {
            return Err(format!(
                "FETCH_ADD #{i} returned {old}, want {}",
                1000 + 7 * i
            ));
        }
    }
    qa.post_send(&[SendWr::atomic_cmp_swap(4000, &res, raddr, rkey, 1700, 42).signaled()])
        .map_err(|e| e.to_string())?;
    wait(&mut a.cq, 1, "CMP_SWP")?;
    let old = a_dec(
        read(&a.mem, size, 8)?
            .try_into()
            .map_err(|_| "short read")?,
    );
    let now = b_dec(read(&b.mem, 0, 8)?.try_into().map_err(|_| "short read")?);
    if old != 1700 || now != 42 {
        return Err(format!(
            "CMP_SWP returned {old} (want 1700), memory now {now} (want 42)"
        ));
    }
    println!("  ok    FETCH_ADD ×100 then CMP_SWP: every original value returned, final value 42");

    let moved = u64::from(args.iters) * size as u64;
    println!();
    println!(
        "  RDMA WRITE  {:>6} × {:>5} KiB  {:>8.3} s  {:>6.2} GB/s",
        args.iters,
        size >> 10,
        wt.as_secs_f64(),
        gbps(moved, wt)
    );
    println!(
        "  RDMA READ   {:>6} × {:>5} KiB  {:>8.3} s  {:>6.2} GB/s",
        1,
        size >> 10,
        rt.as_secs_f64(),
        gbps(size as u64, rt)
    );
    for s in [&a, &b] {
        let Some(dev) = &s.dev else {
            println!("  {}: mlx5 function (counters: rnicctl info)", s.name);
            continue;
        };
        let st = dev.stats();
        let d = &st.device;
        let retrans: u64 = st.qps.iter().map(|(_, q)| q.retransmits).sum();
        println!(
            "  {}: tx {} packets in {} datagrams (GSO), rx {} packets, ICRC ok {} / recovered {} / dropped {}, retransmits {}",
            s.name,
            d.tx_packets,
            d.tx_datagrams,
            d.rx_packets,
            d.icrc_ok,
            d.icrc_recovered,
            d.icrc_drops,
            retrans
        );
    }
    // Teardown order QP → CQ → MR → PD → memory is enforced by ownership.
    drop((qa, qb));
    let _ = (&a.ctx, &b.ctx);
    println!("\nall checks passed");
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("loopback: {e}");
            ExitCode::FAILURE
        }
    }
}
