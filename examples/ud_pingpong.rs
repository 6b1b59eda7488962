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
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use rnic::core::exchange::{QpEndpoint, client_exchange, server_exchange};
use rnic::core::{
    AccessFlags, AddressHandle, AddressVector, Gid, InitParams, Memory, ProtectionDomain, Psn,
    QpCaps, QpInitAttr, QpType, QueuePair, RecvWr, RtrParams, RtsParams, SendWr, WcFlags, WcStatus,
    WorkCompletion,
};

#[path = "pingpong/mod.rs"]
mod pingpong;
use pingpong::{check, fill, gid_str, local_gid, open, print_results, rand_psn};

const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;
/// ibv_ud_pingpong's Q_Key.
const QKEY: u32 = 0x1111_1111;
/// The GRH area at the start of every UD receive buffer.
const GRH: usize = 40;

/// Ping-pong over a UD QP (ibv_ud_pingpong's options).
#[derive(Parser, Debug)]
#[command(name = "ud_pingpong", version)]
struct Args {
    /// Listen on / connect to TCP port.
    #[arg(short = 'p', long = "port", default_value_t = 18515)]
    port: u16,
    /// Device: a spec (rxe:<netdev|ip>, mlx5:<bdf>@<ip>,
    /// mlx5:vfio-user:<socket>@<ip>) or a netdev name.
    #[arg(short = 'd', long = "ib-dev", default_value = "rxe")]
    device: String,
    /// Port of the device.
    #[arg(short = 'i', long = "ib-port", default_value_t = 1,
          value_parser = clap::value_parser!(u8).range(1..))]
    ib_port: u8,
    /// Size of message to exchange (at most the port's active MTU).
    #[arg(short = 's', long = "size", default_value_t = 1024)]
    size: u32,
    /// Number of receives to post at a time.
    #[arg(short = 'r', long = "rx-depth", default_value_t = 500,
          value_parser = clap::value_parser!(u32).range(1..))]
    rx_depth: u32,
    /// Number of exchanges.
    #[arg(short = 'n', long = "iters", default_value_t = 1000,
          value_parser = clap::value_parser!(u32).range(1..))]
    iters: u32,
    /// Service level value (RoCE: the traffic class).
    #[arg(short = 'l', long = "sl", default_value_t = 0)]
    sl: u8,
    /// Sleep on CQ events (default poll).
    #[arg(short = 'e', long = "events")]
    events: bool,
    /// Local port GID index.
    #[arg(short = 'g', long = "gid-idx", default_value_t = 0)]
    gid_idx: u8,
    /// Validate every received buffer (rnic's per-message pattern).
    #[arg(short = 'c', long = "chk")]
    check: bool,
    /// Print the rxe device's counters at the end (rnic only).
    #[arg(long = "stats")]
    stats: bool,
    /// Server to connect to (none: be the server).
    servername: Option<String>,
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
            sgid_index: args.gid_idx,
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
        sgid_index: args.gid_idx,
        hop_limit: 64,
        traffic_class: args.sl,
        ..AddressVector::new(remote.gid)
    };
    pd.create_ah(&av)
        .map_err(|e| format!("Failed to create AH: {}", rnic::error_chain(&e)))
}

fn run(args: &Args) -> Result<(), String> {
    let (ctx, dev, memory) = open(&args.device, args.events)?;
    let port = ctx
        .query_port(args.ib_port)
        .map_err(|e| format!("Unable to query port info for port {}: {e}", args.ib_port))?;
    let mtu = port.active_mtu.bytes();
    if args.size > mtu {
        return Err(format!(
            "Requested size larger than port MTU ({mtu}): use -s {mtu} or less"
        ));
    }
    let size = args.size as usize;
    let pd = ctx
        .alloc_pd()
        .map_err(|e| format!("Couldn't allocate PD: {e}"))?;
    // Receive area (GRH + payload) at 0, send payload at GRH + size.
    let mem: Arc<dyn Memory> = memory
        .alloc(GRH + 2 * size)
        .map_err(|e| format!("Couldn't allocate the buffer: {e}"))?;
    let mr = pd
        .reg_mr(mem.clone(), AccessFlags::LOCAL_WRITE)
        .map_err(|e| format!("Couldn't register MR: {e}"))?;
    // As rc_pingpong: rx_depth + 1 entries, plus an mlx5 function's rounding.
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
        .create_qp(&cq, &cq, &QpInitAttr::new(QpType::Ud, caps))
        .map_err(|e| format!("Couldn't create QP: {e}"))?;
    qp.to_init(&InitParams {
        port_num: args.ib_port,
        qkey: QKEY,
        ..InitParams::default()
    })
    .map_err(|e| format!("Failed to modify QP to INIT: {e}"))?;
    let rlen = u32::try_from(GRH + size).map_err(|_| "message size too large".to_owned())?;
    let rsge = [mr.sge(0, rlen).map_err(|e| e.to_string())?];
    let ssge = [mr.sge(GRH + size, args.size).map_err(|e| e.to_string())?];
    let ssge: &[_] = if size == 0 { &[] } else { &ssge };
    let post_recvs = |qp: &mut QueuePair, n: u32| -> u32 {
        (0..n)
            .take_while(|_| qp.post_recv(&[RecvWr::new(RECV_WRID, &rsge)]).is_ok())
            .count() as u32
    };
    let mut routs = post_recvs(&mut qp, args.rx_depth);
    if routs < args.rx_depth {
        return Err(format!("Couldn't post receive ({routs})"));
    }
    if args.events {
        cq.req_notify(false)
            .map_err(|e| format!("Couldn't request CQ notification: {e}"))?;
    }
    let local = QpEndpoint {
        lid: 0,
        qpn: qp.qpn(),
        psn: Psn::from_wire(rand_psn()),
        gid: local_gid(&ctx, args.ib_port, args.gid_idx)?,
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
    let remote = match &args.servername {
        Some(host) => client_exchange((host.as_str(), args.port), &local, timeout)
            .map_err(|e| format!("Couldn't get remote address: {e}"))?,
        None => {
            let listener = TcpListener::bind(("0.0.0.0", args.port))
                .map_err(|e| format!("Couldn't listen to port {}: {e}", args.port))?;
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

    let start = Instant::now();
    let mut pending = RECV_WRID;
    let (mut scnt, mut rcnt) = (0u32, 0u32);
    let post_send = |qp: &mut QueuePair, seq: u32| -> Result<(), String> {
        if args.check {
            fill(mem.as_ref(), GRH + size, size, seq)?;
        }
        let wr = SendWr::send(SEND_WRID, ssge)
            .signaled()
            .to_ud(ah.ud_dest(remote.qpn, QKEY));
        qp.post_send(&[wr])
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
                return Err("Failed to get cq_event: timed out (a datagram lost?)".into());
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
                        routs += post_recvs(&mut qp, args.rx_depth - routs);
                        if routs < args.rx_depth {
                            return Err(format!("Couldn't post receive ({routs})"));
                        }
                    }
                    if args.check {
                        check_recv(wc, mem.as_ref(), &remote, size, rcnt)?;
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
