//! `interop_rw`: RDMA WRITE and READ between rnic and a peer (kernel rxe via
//! `tests/vm/guest/interop_rw.py`, or another `interop_rw`), with every byte
//! checked on both sides.
//!
//! Each side registers one buffer of `3 × len` bytes, allowing remote write
//! and read:
//!
//! | bytes | role |
//! |---|---|
//! | `[0, len)` | target of the peer's WRITE (starts zeroed) |
//! | `[len, 2·len)` | source of the peer's READ (the owner's pattern) |
//! | `[2·len, 3·len)` | scratch: source of our WRITE, sink of our READ |
//!
//! Pattern `k`, byte `i`: `(37·k + 13·i + i / 256) mod 256`. The server's
//! READ source holds pattern 4, the client's pattern 2.
//!
//! The exchange is one text line each way over TCP (the client speaks first),
//! then one line per phase:
//!
//! ```text
//! client → server: "qpn=<hex> psn=<hex> gid=<IPv6 text> rkey=<hex> va=<hex> len=<dec>\n"
//! server → client: the same fields for the server
//! client → server: "client-ready\n" once its QP is in RTS (the server must not
//!                  send before: kernel rxe drops requests for a QP still in
//!                  INIT, and the first WRITE then waits for a retransmission)
//! server → client: "server-done\n"  after the server WROTE pattern 1 into the client's
//!                  [0, len) and READ the client's [len, 2·len) (pattern 2) and checked it
//! client → server: "client-done\n"  after the client checked pattern 1 in its [0, len),
//!                  WROTE pattern 3 into the server's [0, len) and READ the server's
//!                  [len, 2·len) (pattern 4) and checked it; the server then checks pattern 3
//! server → client: "rnr-send\n", then SENDs 3000 bytes of pattern 5 at once; the
//!                  client posts its receive 300 ms later (RNR NAKs meanwhile) and checks
//! client → server: "rnr-recv-done\n", then SENDs 3000 bytes of pattern 6 at once; the
//!                  server posts its receive 300 ms later and checks
//! server → client: "rnr-done\n"
//! ```
//!
//! Both QPs advertise `min_rnr_timer` 24 (40.96 ms), so a requester must wait
//! that long after each RNR NAK before it retries.
//!
//! Each check prints `RW VERDICT: <what>: MATCH` or `… MISMATCH at byte <n>`, and
//! the process exits non-zero on any mismatch. rnic is the server here:
//!
//! ```text
//! interop_rw -d rxe:10.50.0.1 -g 0 --len 20000 --port 18600
//! ```

use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv6Addr, TcpListener, TcpStream};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use rnic::core::{
    AccessFlags, CompletionQueue, Gid, HeapMemory, InitParams, Memory, MemoryRegion, Mtu, Psn,
    QpCaps, QpInitAttr, QpType, Qpn, QueuePair, RecvWr, Rkey, RtrParams, RtsParams, SendWr,
    WcStatus, WorkCompletion,
};
use rnic::rxe::{Progress, RxeConfig, RxeDevice, Target};

/// Bytes of each phase-3 SEND (3 packets at MTU 1024).
const RNR_LEN: usize = 3000;
/// How late each side posts its phase-3 receive.
const RNR_DELAY: Duration = Duration::from_millis(300);
/// The RNR timer both sides advertise: code 24, 40.96 ms.
const MIN_RNR_TIMER: u8 = 24;

/// RDMA WRITE/READ with byte checks against a peer (server side).
#[derive(Parser, Debug)]
#[command(name = "interop_rw")]
struct Args {
    /// Device: rxe:<netdev|ip>.
    #[arg(short = 'd', long = "ib-dev", default_value = "rxe:127.0.0.1")]
    device: String,
    /// Local GID index.
    #[arg(short = 'g', long = "gid-idx", default_value_t = 0)]
    gid_idx: u8,
    /// Bytes per region (the WRITE and READ sizes).
    #[arg(long, default_value_t = 20000)]
    len: u32,
    /// Path MTU.
    #[arg(short = 'm', long = "mtu", default_value_t = 1024)]
    mtu: u32,
    /// TCP port to listen on.
    #[arg(short = 'p', long = "port", default_value_t = 18600)]
    port: u16,
    /// Seconds to wait for the peer (connection and each phase).
    #[arg(long, default_value_t = 90)]
    timeout: u64,
}

/// Pattern `k`, byte `i` (the same formula as interop_rw.py).
fn pattern(k: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((37 * k as usize + 13 * i + i / 256) % 256) as u8)
        .collect()
}

/// Compares `[off, off + want.len())` of `mem` with `want` and prints the verdict.
fn verdict(what: &str, mem: &HeapMemory, off: usize, want: &[u8]) -> bool {
    let mut got = vec![0u8; want.len()];
    let ok = mem.read(off, &mut got).is_ok();
    match got.iter().zip(want).position(|(a, b)| a != b) {
        None if ok => {
            println!("RW VERDICT: {what}: {} bytes MATCH", want.len());
            true
        }
        at => {
            println!("RW VERDICT: {what}: MISMATCH at byte {}", at.unwrap_or(0));
            false
        }
    }
}

/// The peer's half of the exchange.
#[derive(Debug)]
struct Remote {
    qpn: Qpn,
    psn: Psn,
    gid: Gid,
    rkey: Rkey,
    va: u64,
    len: usize,
}

fn field<'a>(line: &'a str, key: &str) -> Result<&'a str, String> {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .ok_or_else(|| format!("no {key}= in {line:?}"))
}

fn hex(line: &str, key: &str) -> Result<u64, String> {
    let v = field(line, key)?;
    u64::from_str_radix(v.trim_start_matches("0x"), 16).map_err(|e| format!("{key}={v}: {e}"))
}

fn parse_remote(line: &str) -> Result<Remote, String> {
    let gid: Ipv6Addr = field(line, "gid")?
        .parse()
        .map_err(|e| format!("gid: {e}"))?;
    Ok(Remote {
        qpn: Qpn::from_wire(hex(line, "qpn")? as u32),
        psn: Psn::from_wire(hex(line, "psn")? as u32),
        gid: Gid::from_ipv6(gid),
        rkey: Rkey(hex(line, "rkey")? as u32),
        va: hex(line, "va")?,
        len: field(line, "len")?
            .parse()
            .map_err(|e| format!("len: {e}"))?,
    })
}

/// Waits for one completion (any queue of `cq`), which must be a success.
fn wait_wc(cq: &mut CompletionQueue, timeout: Duration) -> Result<WorkCompletion, String> {
    let deadline = Instant::now() + timeout;
    let mut wc = [WorkCompletion::default(); 1];
    let ok = |wc: WorkCompletion| {
        if wc.status == WcStatus::Success {
            Ok(wc)
        } else {
            Err(format!(
                "completion status {} for wr_id {}",
                wc.status.as_str(),
                wc.wr_id
            ))
        }
    };
    loop {
        if cq.poll(&mut wc).map_err(|e| format!("poll: {e}"))? == 1 {
            return ok(wc[0]);
        }
        if Instant::now() > deadline {
            return Err("no completion in time".into());
        }
        // Arm, then poll again before sleeping: a completion that landed in
        // between would not signal the channel.
        cq.req_notify(false)
            .map_err(|e| format!("req_notify: {e}"))?;
        if cq.poll(&mut wc).map_err(|e| format!("poll: {e}"))? == 1 {
            return ok(wc[0]);
        }
        cq.wait(Some(Duration::from_millis(100)))
            .map_err(|e| format!("wait: {e}"))?;
    }
}

/// Posts one signalled WR and waits for its completion.
fn post_and_wait(
    qp: &mut QueuePair,
    cq: &mut CompletionQueue,
    wr: SendWr<'_>,
    timeout: Duration,
) -> Result<(), String> {
    qp.post_send(&[wr]).map_err(|e| format!("post_send: {e}"))?;
    wait_wc(cq, timeout).map(|_| ())
}

fn read_line(r: &mut BufReader<TcpStream>) -> Result<String, String> {
    let mut line = String::new();
    r.read_line(&mut line)
        .map_err(|e| format!("read from peer: {e}"))?;
    if line.is_empty() {
        return Err("peer closed the connection".into());
    }
    Ok(line.trim_end().to_owned())
}

fn run(args: &Args) -> Result<bool, String> {
    let t = args.device.strip_prefix("rxe:").unwrap_or(&args.device);
    let target = match t.parse() {
        Ok(ip) => Target::Ip(ip),
        Err(_) => Target::Netdev(t.to_owned()),
    };
    let dev = RxeDevice::open(&RxeConfig::new(target).with_progress(Progress::Thread))
        .map_err(|e| format!("open {}: {e}", args.device))?;
    let ctx = dev.context();
    let len = args.len as usize;
    let mtu = Mtu::from_bytes(args.mtu).map_err(|e| format!("mtu {}: {e}", args.mtu))?;
    let pd = ctx.alloc_pd().map_err(|e| format!("alloc_pd: {e}"))?;
    let mem = Arc::new(HeapMemory::new(3 * len));
    mem.write(len, &pattern(4, len))
        .map_err(|e| format!("fill: {e}"))?;
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let mr: MemoryRegion = pd
        .reg_mr(mem.clone(), access)
        .map_err(|e| format!("reg_mr: {e}"))?;
    let mut cq = ctx.create_cq(16).map_err(|e| format!("create_cq: {e}"))?;
    let caps = QpCaps {
        max_send_wr: 4,
        max_recv_wr: 1,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let mut qp = pd
        .create_qp(&cq, &cq, &QpInitAttr::new(QpType::Rc, caps))
        .map_err(|e| format!("create_qp: {e}"))?;
    qp.to_init(&InitParams {
        access,
        ..InitParams::default()
    })
    .map_err(|e| format!("to_init: {e}"))?;
    let gid = ctx
        .query_gid_table(1)
        .map_err(|e| format!("query_gid_table: {e}"))?
        .iter()
        .find(|g| g.index == u32::from(args.gid_idx))
        .map(|g| g.gid)
        .ok_or_else(|| format!("no GID at index {}", args.gid_idx))?;
    let psn = Psn::from_wire(0x1234 + u32::from(args.port));

    let timeout = Duration::from_secs(args.timeout);
    let listener = TcpListener::bind(("0.0.0.0", args.port))
        .map_err(|e| format!("listen on {}: {e}", args.port))?;
    println!("listening on port {}", args.port);
    let (stream, peer) = listener.accept().map_err(|e| format!("accept: {e}"))?;
    stream
        .set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    let mut w = stream.try_clone().map_err(|e| e.to_string())?;
    let mut r = BufReader::new(stream);
    let line = read_line(&mut r)?;
    println!("client {peer}: {line}");
    let remote = parse_remote(&line)?;
    if remote.len != len {
        return Err(format!("client len {} != ours {len}", remote.len));
    }
    let mine = format!(
        "qpn={:06x} psn={:06x} gid={} rkey={:08x} va={:x} len={len}",
        qp.qpn().get(),
        psn.get(),
        Ipv6Addr::from(*gid.raw()),
        mr.rkey().get(),
        mr.addr()
    );
    println!("server: {mine}");
    let rtr = RtrParams {
        path_mtu: mtu,
        sgid_index: args.gid_idx,
        max_dest_rd_atomic: 4,
        min_rnr_timer: MIN_RNR_TIMER,
        ..RtrParams::default()
    };
    qp.to_rtr(remote.qpn, remote.psn, remote.gid, &rtr)
        .map_err(|e| format!("to_rtr: {e}"))?;
    qp.to_rts(
        psn,
        &RtsParams {
            max_rd_atomic: 4,
            ..RtsParams::default()
        },
    )
    .map_err(|e| format!("to_rts: {e}"))?;
    writeln!(w, "{mine}").map_err(|e| format!("send: {e}"))?;
    let line = read_line(&mut r)?;
    if line != "client-ready" {
        return Err(format!("expected client-ready, got {line:?}"));
    }

    // Phase 1: WRITE pattern 1 into the client's [0, len), READ its [len, 2·len).
    let t0 = Instant::now();
    mem.write(2 * len, &pattern(1, len))
        .map_err(|e| format!("fill: {e}"))?;
    let scratch = [mr.sge(2 * len, args.len).map_err(|e| e.to_string())?];
    let wr = SendWr::rdma_write(1, &scratch, remote.va, remote.rkey).signaled();
    post_and_wait(&mut qp, &mut cq, wr, timeout).map_err(|e| format!("RDMA WRITE: {e}"))?;
    println!(
        "rnic RDMA WRITE of {len} bytes completed in {:?}",
        t0.elapsed()
    );
    mem.write(2 * len, &vec![0; len])
        .map_err(|e| format!("clear: {e}"))?;
    let t1 = Instant::now();
    let wr = SendWr::rdma_read(2, &scratch, remote.va + len as u64, remote.rkey).signaled();
    post_and_wait(&mut qp, &mut cq, wr, timeout).map_err(|e| format!("RDMA READ: {e}"))?;
    println!(
        "rnic RDMA READ of {len} bytes completed in {:?}",
        t1.elapsed()
    );
    let mut ok = verdict(
        "rnic READ of kernel memory (pattern 2)",
        &mem,
        2 * len,
        &pattern(2, len),
    );
    writeln!(w, "server-done").map_err(|e| format!("send: {e}"))?;

    // Phase 2: the client WRITEs pattern 3 into our [0, len) and READs our [len, 2·len).
    let line = read_line(&mut r)?;
    println!("client: {line}");
    if line != "client-done" {
        return Err(format!("expected client-done, got {line:?}"));
    }
    ok &= verdict(
        "kernel WRITE into rnic memory (pattern 3)",
        &mem,
        0,
        &pattern(3, len),
    );
    ok &= verdict(
        "rnic READ source left intact (pattern 4)",
        &mem,
        len,
        &pattern(4, len),
    );

    // Phase 3, RNR both ways (receives posted RNR_DELAY late; both QPs
    // advertise min_rnr_timer 24 = 40.96 ms): rnic SENDs pattern 5 before
    // the client has a receive, then the client SENDs pattern 6 before we do.
    writeln!(w, "rnr-send").map_err(|e| format!("send: {e}"))?;
    mem.write(2 * len, &pattern(5, RNR_LEN))
        .map_err(|e| format!("fill: {e}"))?;
    let t2 = Instant::now();
    let rnr_sge = [mr.sge(2 * len, RNR_LEN as u32).map_err(|e| e.to_string())?];
    post_and_wait(
        &mut qp,
        &mut cq,
        SendWr::send(3, &rnr_sge).signaled(),
        timeout,
    )
    .map_err(|e| format!("SEND into RNR: {e}"))?;
    let waits = dev.stats().qp(qp.qpn()).map_or(0, |s| s.rnr_waits);
    println!(
        "rnic SEND of {RNR_LEN} bytes completed in {:?} after {waits} RNR waits",
        t2.elapsed()
    );
    let line = read_line(&mut r)?;
    if line != "rnr-recv-done" {
        return Err(format!("expected rnr-recv-done, got {line:?}"));
    }
    mem.write(2 * len, &vec![0; RNR_LEN])
        .map_err(|e| format!("clear: {e}"))?;
    std::thread::sleep(RNR_DELAY);
    let naks_before = dev.stats().qp(qp.qpn()).map_or(0, |s| s.naks_sent.rnr);
    qp.post_recv(&[RecvWr::new(4, &rnr_sge)])
        .map_err(|e| format!("post_recv: {e}"))?;
    let wc = wait_wc(&mut cq, timeout).map_err(|e| format!("receive after RNR: {e}"))?;
    println!(
        "rnic received {} bytes after sending {naks_before} RNR NAKs",
        wc.byte_len
    );
    ok &= verdict(
        "kernel SEND into rnic memory after RNR (pattern 6)",
        &mem,
        2 * len,
        &pattern(6, RNR_LEN),
    );
    writeln!(w, "rnr-done").map_err(|e| format!("send: {e}"))?;
    print!("{}", dev.stats());
    Ok(ok)
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("interop_rw: {e}");
            ExitCode::FAILURE
        }
    }
}
