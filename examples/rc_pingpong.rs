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
use std::time::Duration;

use clap::Parser;
use rnic::core::exchange::{QpEndpoint, client_exchange, server_exchange};
use rnic::core::{
    InitParams, Mtu, Psn, QpType, QueuePair, RtrParams, RtsParams, SendWr, WorkCompletion,
};

#[path = "pingpong/mod.rs"]
mod pingpong;
use pingpong::{
    Common, Loop, Objects, SEND_WRID, check, fill, gid_str, local_gid, objects, open, post_recvs,
    print_results, rand_psn, run_loop,
};

/// Ping-pong over an RC QP (ibv_rc_pingpong's options).
#[derive(Parser, Debug)]
#[command(name = "rc_pingpong", version)]
struct Args {
    #[command(flatten)]
    c: Common,
    /// Size of message to exchange.
    #[arg(short = 's', long = "size", default_value_t = 4096)]
    size: u32,
    /// Path MTU.
    #[arg(short = 'm', long = "mtu", default_value_t = 1024)]
    mtu: u32,
}

fn run(args: &Args) -> Result<(), String> {
    let mtu = Mtu::from_bytes(args.mtu).map_err(|e| format!("Invalid MTU {}: {e}", args.mtu))?;
    let (ctx, dev, memory) = open(&args.c.device, args.c.events)?;
    let size = args.size as usize;
    // Receive half at 0, send half at `size`.
    let init = InitParams {
        port_num: args.c.ib_port,
        ..InitParams::default()
    };
    // Bound in creation order, so dropped QP first and PD last.
    let Objects {
        pd: _pd,
        mem,
        mr,
        mut cq,
        mut qp,
    } = objects(&ctx, &memory, 2 * size, args.c.rx_depth, QpType::Rc, &init)?;
    let rsge = [mr.sge(0, args.size).map_err(|e| e.to_string())?];
    let rsge: &[_] = if size == 0 { &[] } else { &rsge };
    let ssge = [mr.sge(size, args.size).map_err(|e| e.to_string())?];
    let ssge: &[_] = if size == 0 { &[] } else { &ssge };
    let routs = post_recvs(&mut qp, rsge, args.c.rx_depth);
    if routs < args.c.rx_depth {
        return Err(format!("Couldn't post receive ({routs})"));
    }
    if args.c.events {
        cq.req_notify(false)
            .map_err(|e| format!("Couldn't request CQ notification: {e}"))?;
    }
    let gid = local_gid(&ctx, args.c.ib_port, args.c.gid_idx)?;
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
        sgid_index: args.c.gid_idx,
        hop_limit: 1,
        traffic_class: args.c.sl,
        ..RtrParams::default()
    };
    let connect = |qp: &mut QueuePair, remote: &QpEndpoint| -> Result<(), String> {
        qp.to_rtr(remote.qpn, remote.psn, remote.gid, &rtr)
            .map_err(|e| format!("Failed to modify QP to RTR: {e}"))?;
        qp.to_rts(local.psn, &RtsParams::default())
            .map_err(|e| format!("Failed to modify QP to RTS: {e}"))
    };
    let timeout = Some(Duration::from_secs(60));
    let remote = match &args.c.servername {
        Some(host) => {
            let r = client_exchange((host.as_str(), args.c.port), &local, timeout)
                .map_err(|e| format!("Couldn't get remote address: {e}"))?;
            connect(&mut qp, &r)?;
            r
        }
        None => {
            let listener = TcpListener::bind(("0.0.0.0", args.c.port))
                .map_err(|e| format!("Couldn't listen to port {}: {e}", args.c.port))?;
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

    let post_send = |qp: &mut QueuePair, seq: u32| -> Result<(), String> {
        if args.c.check {
            fill(mem.as_ref(), size, size, seq)?;
        }
        qp.post_send(&[SendWr::send(SEND_WRID, ssge).signaled()])
            .map_err(|e| format!("Couldn't post send: {e}"))
    };
    let on_recv = |_: &WorkCompletion, seq: u32| -> Result<(), String> {
        if args.c.check && !check(mem.as_ref(), 0, size, seq) {
            return Err(format!("Failed validation of message {seq}"));
        }
        Ok(())
    };
    let l = Loop::new(&args.c, routs, dev.as_ref());
    let recvs = |qp: &mut QueuePair, n| post_recvs(qp, rsge, n);
    let secs = run_loop(&mut qp, &mut cq, &l, recvs, post_send, on_recv)?;
    print_results(args.size, args.c.iters, secs);
    if let Some(d) = dev.as_ref().filter(|_| args.c.stats) {
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
