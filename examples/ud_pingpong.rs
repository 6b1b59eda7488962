//! `ud_pingpong`: rdma-core's `ibv_ud_pingpong` on rnic — the same options,
//! the same TCP endpoint exchange (`LLLL:QQQQQQ:PPPPPP:<GID>`, as
//! `rc_pingpong`'s), the same Q_Key (0x11111111) and the same result lines,
//! so either side can be the stock tool on a kernel rxe peer.
//!
//! ```text
//! server: cargo run --example ud_pingpong -- -d rxe:127.0.0.1 -g 0
//! client: cargo run --example ud_pingpong -- -d rxe:127.0.0.2 -g 0 127.0.0.1
//! ```
//!
//! Each side has one UD QP and one address handle to the peer, made from the
//! GID the peer sent (`create_ah`: on mlx5 the driver's port resolves the
//! peer's MAC there). Every receive names the same `40 + size` bytes: the
//! 40-byte GRH area, then the payload; sends go from a second `size`-byte
//! area. A message must fit the port's active MTU (as the stock tool checks).
//!
//! Differences from the stock tool: `-g` defaults to 0, not "no GID" (RoCE
//! addresses by GID; the stock tool without `-g` sends GID `::`, which this
//! one refuses by name). `-c` fills every message with a per-message
//! pattern and checks each received one (payload, length with the GRH,
//! source QP); the stock tool echoes the last payload it received, so
//! against it `-c` works when this side is the client.

use std::net::TcpListener;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use rnic::core::exchange::{QpEndpoint, client_exchange, server_exchange};
use rnic::core::{
    AddressHandle, AddressVector, Gid, InitParams, Memory, ProtectionDomain, Psn, QpType,
    QueuePair, RtrParams, RtsParams, SendWr, WcFlags, WorkCompletion,
};

#[path = "pingpong/mod.rs"]
mod pingpong;
use pingpong::{
    Common, Loop, Objects, SEND_WRID, check, fill, gid_str, local_gid, objects, open, post_recvs,
    print_results, rand_psn, run_loop,
};

/// ibv_ud_pingpong's Q_Key.
const QKEY: u32 = 0x1111_1111;
/// The GRH area at the start of every UD receive buffer.
const GRH: usize = 40;

/// Ping-pong over a UD QP (ibv_ud_pingpong's options).
#[derive(Parser, Debug)]
#[command(name = "ud_pingpong", version)]
struct Args {
    #[command(flatten)]
    c: Common,
    /// Size of message to exchange (at most the port's active MTU).
    #[arg(short = 's', long = "size", default_value_t = 1024)]
    size: u32,
}

/// RTR and RTS (UD: no peer fields), then the address handle to `remote`
/// (ibv_ud_pingpong's `pp_connect_ctx`: hop limit 64).
fn connect(
    qp: &mut QueuePair,
    pd: &ProtectionDomain,
    local: &QpEndpoint,
    remote: &QpEndpoint,
    args: &Args,
) -> Result<AddressHandle, String> {
    qp.to_rtr(
        remote.qpn,
        remote.psn,
        remote.gid,
        &RtrParams {
            sgid_index: args.c.gid_idx,
            ..RtrParams::default()
        },
    )
    .map_err(|e| format!("Failed to modify QP to RTR: {e}"))?;
    qp.to_rts(local.psn, &RtsParams::default())
        .map_err(|e| format!("Failed to modify QP to RTS: {e}"))?;
    if remote.gid == Gid::ZERO {
        return Err(
            "Failed to create AH: the peer sent GID :: (RoCE addresses by GID: \
                    run the peer with -g <gid index>)"
                .into(),
        );
    }
    let av = AddressVector {
        sgid_index: args.c.gid_idx,
        hop_limit: 64,
        traffic_class: args.c.sl,
        ..AddressVector::new(remote.gid)
    };
    pd.create_ah(&av)
        .map_err(|e| format!("Failed to create AH: {}", rnic::error_chain(&e)))
}

fn run(args: &Args) -> Result<(), String> {
    let (ctx, dev, memory) = open(&args.c.device, args.c.events)?;
    let port = ctx
        .query_port(args.c.ib_port)
        .map_err(|e| format!("Unable to query port info for port {}: {e}", args.c.ib_port))?;
    let mtu = port.active_mtu.bytes();
    if args.size > mtu {
        return Err(format!(
            "Requested size larger than port MTU ({mtu}): use -s {mtu} or less"
        ));
    }
    let size = args.size as usize;
    // Receive area (GRH + payload) at 0, send payload at GRH + size.
    let init = InitParams {
        port_num: args.c.ib_port,
        qkey: QKEY,
        ..InitParams::default()
    };
    // Bound in creation order, so dropped QP first and PD last.
    let Objects {
        pd,
        mem,
        mr,
        mut cq,
        mut qp,
    } = objects(
        &ctx,
        &memory,
        GRH + 2 * size,
        args.c.rx_depth,
        QpType::Ud,
        &init,
    )?;
    let rlen = u32::try_from(GRH + size).map_err(|_| "message size too large".to_owned())?;
    let rsge = [mr.sge(0, rlen).map_err(|e| e.to_string())?];
    let ssge = [mr.sge(GRH + size, args.size).map_err(|e| e.to_string())?];
    let ssge: &[_] = if size == 0 { &[] } else { &ssge };
    let routs = post_recvs(&mut qp, &rsge, args.c.rx_depth);
    if routs < args.c.rx_depth {
        return Err(format!("Couldn't post receive ({routs})"));
    }
    if args.c.events {
        cq.req_notify(false)
            .map_err(|e| format!("Couldn't request CQ notification: {e}"))?;
    }
    let local = QpEndpoint {
        lid: 0,
        qpn: qp.qpn(),
        psn: Psn::from_wire(rand_psn()),
        gid: local_gid(&ctx, args.c.ib_port, args.c.gid_idx)?,
    };
    // The stock tool's line, its ':' before "GID" included.
    println!(
        "  local address:  LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}: GID {}",
        local.lid,
        local.qpn.get(),
        local.psn.get(),
        gid_str(&local.gid)
    );
    let timeout = Some(Duration::from_secs(60));
    let mut ah = None;
    let remote = match &args.c.servername {
        Some(host) => client_exchange((host.as_str(), args.c.port), &local, timeout)
            .map_err(|e| format!("Couldn't get remote address: {e}"))?,
        None => {
            let listener = TcpListener::bind(("0.0.0.0", args.c.port))
                .map_err(|e| format!("Couldn't listen to port {}: {e}", args.c.port))?;
            server_exchange(&listener, &local, timeout, |r| {
                connect(&mut qp, &pd, &local, r, args).map(|h| ah = Some(h))
            })
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
    let ah = match ah {
        Some(ah) => ah,
        None => connect(&mut qp, &pd, &local, &remote, args)?,
    };

    let post_send = |qp: &mut QueuePair, seq: u32| -> Result<(), String> {
        if args.c.check {
            fill(mem.as_ref(), GRH + size, size, seq)?;
        }
        let wr = SendWr::send(SEND_WRID, ssge)
            .signaled()
            .to_ud(ah.ud_dest(remote.qpn, QKEY));
        qp.post_send(&[wr])
            .map_err(|e| format!("Couldn't post send: {e}"))
    };
    let on_recv = |wc: &WorkCompletion, seq: u32| -> Result<(), String> {
        if args.c.check {
            check_recv(wc, mem.as_ref(), &remote, size, seq)?;
        }
        Ok(())
    };
    let l = Loop::new(&args.c, routs, dev.as_ref());
    let recvs = |qp: &mut QueuePair, n| post_recvs(qp, &rsge, n);
    let secs = run_loop(&mut qp, &mut cq, &l, recvs, post_send, on_recv)?;
    print_results(args.size, args.c.iters, secs);
    if let Some(d) = dev.as_ref().filter(|_| args.c.stats) {
        print!("{}", d.stats());
    }
    Ok(())
}

/// `-c` on receive `seq`: a GRH area, `size` payload bytes from the peer's
/// QP, and message `seq`'s pattern behind the GRH.
fn check_recv(
    wc: &WorkCompletion,
    mem: &dyn Memory,
    remote: &QpEndpoint,
    size: usize,
    seq: u32,
) -> Result<(), String> {
    if !wc.wc_flags.contains(WcFlags::GRH) || wc.byte_len as usize != GRH + size {
        return Err(format!(
            "Failed validation of message {seq}: {} bytes, GRH flag {} (want {} with a GRH)",
            wc.byte_len,
            wc.wc_flags.contains(WcFlags::GRH),
            GRH + size
        ));
    }
    if wc.src_qp != remote.qpn {
        return Err(format!(
            "Failed validation of message {seq}: from QP 0x{:06x}, not the peer's 0x{:06x}",
            wc.src_qp.get(),
            remote.qpn.get()
        ));
    }
    if !check(mem, GRH, size, seq) {
        return Err(format!("Failed validation of message {seq}"));
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
