//! `rc_pingpong`: rdma-core's `ibv_rc_pingpong` on rnic — the same options,
//! the same TCP endpoint exchange (so it interoperates with the stock tool on
//! a kernel rxe peer) and the same result lines.
//!
//! ```text
//! server: cargo run --example rc_pingpong -- -d rxe:127.0.0.1 -g 0
//! client: cargo run --example rc_pingpong -- -d rxe:127.0.0.2 -g 0 127.0.0.1
//! ```
//!
//! `-d` takes a device spec (`rxe:<netdev|ip>`, `mlx5:<bdf>@<ip>`,
//! `mlx5:vfio-user:<socket>@<ip>`) or a bare netdev name. Busy-polling runs
//! the rxe backend caller-driven; `-e` uses its progress thread and the CQ's
//! completion channel (on mlx5: the function's event queue). The buffer comes
//! from the device's [`rnic::MemorySource`]: host memory for rxe, the
//! function's DMA buffers for mlx5.

use std::net::TcpListener;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use rnic::core::exchange::{QpEndpoint, client_exchange, server_exchange};
use rnic::core::{
    AccessFlags, InitParams, Memory, Mtu, Psn, QpCaps, QpInitAttr, QpType, QueuePair, RecvWr,
    RtrParams, RtsParams, SendWr, WcStatus, WorkCompletion,
};

#[path = "pingpong/mod.rs"]
mod pingpong;
use pingpong::{check, fill, gid_str, local_gid, open, print_results, rand_psn};

const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;

/// Ping-pong over an RC QP (ibv_rc_pingpong's options).
#[derive(Parser, Debug)]
#[command(name = "rc_pingpong", version)]
struct Args {
    /// Listen on / connect to TCP port.
    #[arg(short = 'p', long = "port", default_value_t = 18515)]
    port: u16,
    /// Device: a spec (rxe:<netdev|ip>, mlx5:<bdf>@<ip>,
    /// mlx5:vfio-user:<socket>@<ip>) or a netdev name.
    #[arg(short = 'd', long = "ib-dev", default_value = "rxe")]
    device: String,
    /// Port of the device.
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    ib_port: u8,
    /// Size of message to exchange.
    #[arg(short = 's', long = "size", default_value_t = 4096)]
    size: u32,
    /// Path MTU.
    #[arg(short = 'm', long = "mtu", default_value_t = 1024)]
    mtu: u32,
    /// Number of receives to post at a time.
    #[arg(short = 'r', long = "rx-depth", default_value_t = 500)]
    rx_depth: u32,
    /// Number of exchanges.
    #[arg(short = 'n', long = "iters", default_value_t = 1000)]
    iters: u32,
    /// Service level value.
    #[arg(short = 'l', long = "sl", default_value_t = 0)]
    sl: u8,
    /// Sleep on CQ events (default poll).
    #[arg(short = 'e', long = "events")]
    events: bool,
    /// Local port GID index.
    #[arg(short = 'g', long = "gid-idx", default_value_t = 0)]
    gid_idx: u8,
    /// Validate received buffer.
    #[arg(short = 'c', long = "chk")]
    check: bool,
    /// Print the rxe device's counters at the end (rnic only).
    #[arg(long = "stats")]
    stats: bool,
    /// Server to connect to (none: be the server).
    servername: Option<String>,
}

fn run(args: &Args) -> Result<(), String> {
    let mtu = Mtu::from_bytes(args.mtu).map_err(|e| format!("Invalid MTU {}: {e}", args.mtu))?;
    let (ctx, dev, memory) = open(&args.device, args.events)?;
    let size = args.size as usize;
    let pd = ctx
        .alloc_pd()
        .map_err(|e| format!("Couldn't allocate PD: {e}"))?;
    // Receive half at 0, send half at `size`.
    let mem: Arc<dyn Memory> = memory
        .alloc((2 * size).max(1))
        .map_err(|e| format!("Couldn't allocate the buffer: {e}"))?;
    let mr = pd
        .reg_mr(mem.clone(), AccessFlags::LOCAL_WRITE)
        .map_err(|e| format!("Couldn't register MR: {e}"))?;
    // ibv_rc_pingpong asks for rx_depth + 1 entries; an mlx5 function also
    // wants room for its rounded-up queues (a power-of-two RQ and up to 16
    // WQEBBs of send queue), which costs rxe nothing.
    let mut cq = ctx
        .create_cq(args.rx_depth.next_power_of_two().max(args.rx_depth + 1) + 16)
        .map_err(|e| format!("Couldn't create CQ: {e}"))?;
    let caps = QpCaps {
        max_send_wr: 1,
        max_recv_wr: args.rx_depth,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let mut qp = pd
        .create_qp(&cq, &cq, &QpInitAttr::new(QpType::Rc, caps))
        .map_err(|e| format!("Couldn't create QP: {e}"))?;
    qp.to_init(&InitParams {
        port_num: args.ib_port,
        ..InitParams::default()
    })
    .map_err(|e| format!("Failed to modify QP to INIT: {e}"))?;
    let rsge = [mr.sge(0, args.size).map_err(|e| e.to_string())?];
    let rsge: &[_] = if size == 0 { &[] } else { &rsge };
    let ssge = [mr.sge(size, args.size).map_err(|e| e.to_string())?];
    let ssge: &[_] = if size == 0 { &[] } else { &ssge };
    let post_recvs = |qp: &mut QueuePair, n: u32| -> Result<u32, String> {
        for i in 0..n {
            if let Err(e) = qp.post_recv(&[RecvWr::new(RECV_WRID, rsge)]) {
                if i == 0 {
                    return Err(format!("Couldn't post receive: {e}"));
                }
                return Ok(i);
            }
        }
        Ok(n)
    };
    let mut routs = post_recvs(&mut qp, args.rx_depth)?;
    if args.events {
        cq.req_notify(false)
            .map_err(|e| format!("Couldn't request CQ notification: {e}"))?;
    }
    let gid = local_gid(&ctx, args.ib_port, args.gid_idx)?;
    let local = QpEndpoint {
        lid: 0,
        qpn: qp.qpn(),
        psn: Psn::from_wire(rand_psn()),
        gid,
    };
    println!(
        "  local address:  LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
        local.lid,
        local.qpn.get(),
        local.psn.get(),
        gid_str(&gid)
    );
    let rtr = RtrParams {
        path_mtu: mtu,
        sgid_index: args.gid_idx,
        hop_limit: 1,
        traffic_class: args.sl,
        ..RtrParams::default()
    };
    let connect = |qp: &mut QueuePair, remote: &QpEndpoint| -> Result<(), String> {
        qp.to_rtr(remote.qpn, remote.psn, remote.gid, &rtr)
            .map_err(|e| format!("Failed to modify QP to RTR: {e}"))?;
        qp.to_rts(local.psn, &RtsParams::default())
            .map_err(|e| format!("Failed to modify QP to RTS: {e}"))
    };
    let timeout = Some(Duration::from_secs(60));
    let remote = match &args.servername {
        Some(host) => {
            let r = client_exchange((host.as_str(), args.port), &local, timeout)
                .map_err(|e| format!("Couldn't get remote address: {e}"))?;
            connect(&mut qp, &r)?;
            r
        }
        None => {
            let listener = TcpListener::bind(("0.0.0.0", args.port))
                .map_err(|e| format!("Couldn't listen to port {}: {e}", args.port))?;
            server_exchange(&listener, &local, timeout, |r| connect(&mut qp, r))
                .map_err(|e| format!("Couldn't get remote address: {e}"))?
        }
    };
    println!(
        "  remote address: LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
        remote.lid,
        remote.qpn.get(),
        remote.psn.get(),
        gid_str(&remote.gid)
    );

    let start = Instant::now();
    let mut pending = RECV_WRID;
    let (mut scnt, mut rcnt) = (0u32, 0u32);
    let post_send = |qp: &mut QueuePair, seq: u32| -> Result<(), String> {
        if args.check {
            fill(mem.as_ref(), size, size, seq)?;
        }
        qp.post_send(&[SendWr::send(SEND_WRID, ssge).signaled()])
            .map_err(|e| format!("Couldn't post send: {e}"))
    };
    if args.servername.is_some() {
        post_send(&mut qp, 0)?;
        pending |= SEND_WRID;
    }
    let mut wcs = [WorkCompletion::default(); 2];
    while rcnt < args.iters || scnt < args.iters {
        let n = if args.events {
            if !cq
                .wait(Some(Duration::from_secs(30)))
                .map_err(|e| format!("Failed to get cq_event: {e}"))?
            {
                return Err("Failed to get cq_event: timed out".into());
            }
            cq.req_notify(false)
                .map_err(|e| format!("Couldn't request CQ notification: {e}"))?;
            cq.poll(&mut wcs)
                .map_err(|e| format!("poll CQ failed: {e}"))?
        } else {
            let n = cq
                .poll(&mut wcs)
                .map_err(|e| format!("poll CQ failed: {e}"))?;
            if let Some(d) = dev.as_ref().filter(|_| n == 0) {
                d.progress();
            }
            n
        };
        for wc in &wcs[..n] {
            if wc.status != WcStatus::Success {
                return Err(format!(
                    "Failed status {} ({}) for wr_id {}",
                    wc.status.as_str(),
                    wc.status.as_raw(),
                    wc.wr_id
                ));
            }
            match wc.wr_id {
                SEND_WRID => scnt += 1,
                RECV_WRID => {
                    routs -= 1;
                    if routs <= 1 {
                        routs += post_recvs(&mut qp, args.rx_depth - routs)?;
                        if routs < args.rx_depth {
                            eprintln!("Couldn't post receive ({routs})");
                            return Err("Couldn't post receive".into());
                        }
                    }
                    if args.check && !check(mem.as_ref(), 0, size, rcnt) {
                        return Err(format!("Failed validation of message {rcnt}"));
                    }
                    rcnt += 1;
                }
                other => return Err(format!("Completion for unknown wr_id {other}")),
            }
            pending &= !wc.wr_id;
            if scnt < args.iters && pending == 0 {
                post_send(&mut qp, scnt)?;
                pending = RECV_WRID | SEND_WRID;
            }
        }
    }
    print_results(args.size, args.iters, start.elapsed().as_secs_f64());
    if let Some(d) = dev.as_ref().filter(|_| args.stats) {
        print!("{}", d.stats());
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
