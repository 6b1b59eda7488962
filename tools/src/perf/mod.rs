//! `rnicctl perf`: perftest's bandwidth and latency tests on rnic, with
//! perftest's options where they overlap, its result tables and its TCP
//! exchange ([`wire`]), so either side can be a stock `ib_*_bw`/`ib_*_lat`.
//!
//! Progress is caller-driven busy polling by default (the rxe backend runs
//! inside `poll`/`progress` on this thread); `-e` runs the backend's
//! progress thread and sleeps on the completion channel.

pub mod report;
mod run;
pub use run::open_device;
pub mod wire;

use std::io::IsTerminal;
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use serde_json::json;

use crate::error::CtlError;
use report::{BwRow, LatRow};
use wire::{Role, Session};

/// The tests (perftest's binaries without the `ib_` prefix).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Test {
    /// RDMA WRITE bandwidth (ib_write_bw).
    WriteBw,
    /// RDMA WRITE latency, ping-pong on the last byte (ib_write_lat).
    WriteLat,
    /// RDMA READ bandwidth (ib_read_bw).
    ReadBw,
    /// RDMA READ latency (ib_read_lat).
    ReadLat,
    /// SEND bandwidth (ib_send_bw).
    SendBw,
    /// SEND latency, ping-pong (ib_send_lat).
    SendLat,
    /// Atomic fetch-and-add bandwidth (ib_atomic_bw).
    AtomicBw,
    /// Atomic fetch-and-add latency (ib_atomic_lat).
    AtomicLat,
}

/// The operation a test posts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verb {
    /// RDMA WRITE.
    Write,
    /// RDMA READ.
    Read,
    /// SEND.
    Send,
    /// Fetch-and-add.
    Atomic,
}

impl Test {
    /// The verb.
    pub fn verb(self) -> Verb {
        match self {
            Test::WriteBw | Test::WriteLat => Verb::Write,
            Test::ReadBw | Test::ReadLat => Verb::Read,
            Test::SendBw | Test::SendLat => Verb::Send,
            Test::AtomicBw | Test::AtomicLat => Verb::Atomic,
        }
    }

    /// Whether it is a latency test.
    pub fn is_lat(self) -> bool {
        matches!(
            self,
            Test::WriteLat | Test::ReadLat | Test::SendLat | Test::AtomicLat
        )
    }

    /// perftest's name.
    pub fn perftest_name(self) -> &'static str {
        match self {
            Test::WriteBw => "ib_write_bw",
            Test::WriteLat => "ib_write_lat",
            Test::ReadBw => "ib_read_bw",
            Test::ReadLat => "ib_read_lat",
            Test::SendBw => "ib_send_bw",
            Test::SendLat => "ib_send_lat",
            Test::AtomicBw => "ib_atomic_bw",
            Test::AtomicLat => "ib_atomic_lat",
        }
    }
}

/// `rnicctl perf` options (perftest's letters).
#[derive(Args, Debug, Clone)]
pub struct PerfArgs {
    /// The test.
    #[arg(value_enum)]
    pub test: Test,
    /// Server to connect to; without it this side is the server.
    pub host: Option<String>,
    /// Device spec: rxe:<netdev|ip>, mlx5:<bdf> (kernel VFIO) or mlx5:vfio-user:<socket>.
    #[arg(short = 'd', long = "ib-dev", default_value = "rxe:127.0.0.1")]
    pub device: String,
    /// TCP port of the exchange.
    #[arg(short = 'p', long = "port", default_value_t = 18515)]
    pub port: u16,
    /// Message size in bytes (default 65536 for bandwidth, 2 for latency; atomics: 8).
    #[arg(short = 's', long = "size")]
    pub size: Option<u64>,
    /// Iterations per size (default 5000 for bandwidth, 1000 for latency).
    #[arg(short = 'n', long = "iters")]
    pub iters: Option<u64>,
    /// Run for this many seconds instead of -n (bandwidth tests).
    #[arg(short = 'D', long = "duration")]
    pub duration: Option<u64>,
    /// All sizes 2..2^23 (atomics: 8 only).
    #[arg(short = 'a', long = "all")]
    pub all: bool,
    /// Queue pairs.
    #[arg(short = 'q', long = "qp", default_value_t = 1)]
    pub qps: u32,
    /// Outstanding work requests per QP (default 128 for bandwidth, 1 for latency).
    #[arg(short = 't', long = "tx-depth")]
    pub tx_depth: Option<u32>,
    /// Receive depth per QP for SEND tests.
    #[arg(short = 'r', long = "rx-depth", default_value_t = 512)]
    pub rx_depth: u32,
    /// Path MTU (256..4096; default: the port's active MTU, negotiated down to the peer's).
    #[arg(short = 'm', long = "mtu")]
    pub mtu: Option<u32>,
    /// GID index.
    #[arg(short = 'x', long = "gid-index", default_value_t = 0)]
    pub gid_index: u8,
    /// Send messages up to this size inline.
    #[arg(short = 'I', long = "inline_size", default_value_t = 0)]
    pub inline: u32,
    /// Report Gb/s instead of MB/s.
    #[arg(long = "report_gbits")]
    pub report_gbits: bool,
    /// Accepted for perftest compatibility (CPU frequency warnings do not apply).
    #[arg(short = 'F', long = "CPU-freq")]
    pub cpu_freq: bool,
    /// Sleep on completion events instead of busy polling.
    #[arg(short = 'e', long = "events")]
    pub events: bool,
    /// Print the device's, the CQ's and the DMA registry's counters after the run.
    #[arg(long = "stats")]
    pub stats: bool,
    /// Serve live counters on /run/rnic/<pid>.sock during the run (`rnicctl stats`).
    #[arg(long = "stats-socket")]
    pub stats_socket: bool,
    /// Machine-readable output on stdout.
    #[arg(long = "json")]
    pub json: bool,
}

/// Resolved parameters.
#[derive(Clone, Debug)]
pub struct Params {
    /// The test.
    pub test: Test,
    /// Sizes to run.
    pub sizes: Vec<u64>,
    /// Iterations per size (per QP for bandwidth).
    pub iters: u64,
    /// Duration mode.
    pub duration: Option<Duration>,
    /// QPs.
    pub qps: u32,
    /// Outstanding WRs per QP.
    pub tx_depth: u32,
    /// Receives per QP.
    pub rx_depth: u32,
    /// Inline threshold.
    pub inline: u32,
    /// Report unit.
    pub gbits: bool,
    /// Events instead of busy polling.
    pub events: bool,
    /// GID index.
    pub gid_index: u8,
}

/// The cycle buffer perftest announces (the page size).
pub const CYCLE_BUFFER: u32 = 4096;
/// The cache line size perftest announces.
pub const CACHE_LINE: u32 = 64;

impl PerfArgs {
    /// Check and resolve the options.
    pub fn params(&self) -> Result<Params, CtlError> {
        let lat = self.test.is_lat();
        let atomic = self.test.verb() == Verb::Atomic;
        let sizes = if atomic {
            vec![8]
        } else if self.all {
            (1..24).map(|i| 1u64 << i).collect()
        } else {
            vec![self.size.unwrap_or(if lat { 2 } else { 65536 })]
        };
        if sizes.iter().any(|s| *s == 0 || *s > (1 << 30)) {
            return Err(CtlError::Usage(
                "-s must be between 1 and 1073741824 bytes".into(),
            ));
        }
        if lat && self.duration.is_some() {
            return Err(CtlError::Usage(
                "-D is supported by the bandwidth tests only; use -n for latency".into(),
            ));
        }
        if self.qps == 0 || self.qps > 1024 {
            return Err(CtlError::Usage("-q must be 1..1024".into()));
        }
        let tx_depth = self.tx_depth.unwrap_or(if lat { 1 } else { 128 }).max(1);
        let iters = self.iters.unwrap_or(if lat { 1000 } else { 5000 });
        if iters == 0 {
            return Err(CtlError::Usage("-n must be at least 1".into()));
        }
        Ok(Params {
            test: self.test,
            sizes,
            iters,
            duration: self.duration.map(Duration::from_secs),
            qps: self.qps,
            tx_depth,
            rx_depth: self.rx_depth.max(2),
            inline: self.inline,
            gbits: self.report_gbits,
            events: self.events,
            gid_index: self.gid_index,
        })
    }
}

/// Connect (client) or accept (server) the exchange's TCP connection.
fn connect(args: &PerfArgs) -> Result<(TcpStream, Role), CtlError> {
    match &args.host {
        Some(h) => {
            // The server may still be starting: retry for a while, then
            // report what perftest reports.
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                match TcpStream::connect((h.as_str(), args.port)) {
                    Ok(s) => {
                        let _ = s.set_nodelay(true);
                        return Ok((s, Role::Client));
                    }
                    Err(e) if Instant::now() >= deadline => {
                        return Err(CtlError::Connect {
                            host: h.clone(),
                            port: args.port,
                            source: e,
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(100)),
                }
            }
        }
        None => {
            let l =
                TcpListener::bind(("0.0.0.0", args.port)).map_err(|source| CtlError::Listen {
                    port: args.port,
                    source,
                })?;
            if !args.json {
                println!("\n************************************");
                println!("* Waiting for client to connect... *");
                println!("************************************");
            }
            let (s, _) = l.accept().map_err(|source| CtlError::Listen {
                port: args.port,
                source,
            })?;
            let _ = s.set_nodelay(true);
            Ok((s, Role::Server))
        }
    }
}

/// What a run produced.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Bandwidth rows (this side's, or the client's as reported to the server).
    pub bw: Vec<BwRow>,
    /// Latency rows.
    pub lat: Vec<LatRow>,
    /// Negotiated MTU in bytes.
    pub mtu: u32,
    /// The peer's version.
    pub peer_version: String,
    /// Counters (`--stats`).
    pub stats: Option<serde_json::Value>,
    /// Counters as text.
    pub stats_text: Option<String>,
    /// How an rxe device received and sent during the run (`None` for mlx5).
    pub data_path: Option<String>,
}

/// A progress bar on stderr, drawn only when stderr is a terminal.
#[derive(Debug)]
pub struct Bar {
    on: bool,
    last: Instant,
}

impl Bar {
    /// A bar for a run expected to take a while.
    pub fn new(enabled: bool) -> Bar {
        Bar {
            on: enabled && std::io::stderr().is_terminal(),
            last: Instant::now(),
        }
    }

    /// Redraw at most 5 times a second.
    pub fn update(&mut self, label: &str, frac: f64) {
        if !self.on || self.last.elapsed() < Duration::from_millis(200) {
            return;
        }
        self.last = Instant::now();
        let w = 40usize;
        let done = ((frac.clamp(0.0, 1.0)) * w as f64) as usize;
        eprint!(
            "\r{label} [{}{}] {:3.0}%",
            "#".repeat(done),
            " ".repeat(w - done),
            frac * 100.0
        );
    }

    /// Clear the line.
    pub fn finish(&mut self) {
        if self.on {
            eprint!("\r{:60}\r", "");
        }
    }
}

/// `rnicctl perf`.
pub fn main(args: &PerfArgs) -> Result<(), CtlError> {
    let p = args.params()?;
    let (stream, role) = connect(args)?;
    let sess = Session::new(stream, role, true);
    let out = run::run(args, &p, sess)?;
    print(args, &p, role, &out);
    Ok(())
}

fn print(args: &PerfArgs, p: &Params, role: Role, out: &Outcome) {
    if args.json {
        let v = json!({
            "test": p.test.perftest_name(),
            "role": if role == Role::Client { "client" } else { "server" },
            "mtu": out.mtu,
            "qps": p.qps,
            "tx_depth": p.tx_depth,
            "peer_version": out.peer_version,
            "results": if p.test.is_lat() {
                out.lat.iter().map(LatRow::json).collect::<Vec<_>>()
            } else {
                out.bw.iter().map(|r| r.json(p.gbits)).collect::<Vec<_>>()
            },
            "stats": out.stats,
            "data_path": out.data_path,
        });
        println!("{v}");
        return;
    }
    println!("{}", report::RESULT_LINE);
    println!(
        "                    {} (rnicctl, perftest 4.5-0.17 exchange)",
        p.test.perftest_name()
    );
    println!(" Number of qps   : {}\t\tConnection type : RC", p.qps);
    println!(" TX depth        : {}", p.tx_depth);
    println!(" Mtu             : {}[B]", out.mtu);
    println!(
        " Polling         : {}",
        if p.events {
            "events"
        } else {
            "busy poll (caller-driven)"
        }
    );
    if let Some(path) = &out.data_path {
        println!(" Data path       : {path}");
    }
    println!("{}", report::RESULT_LINE);
    if p.test.is_lat() {
        println!("{}", report::LAT_HEADER);
        for r in &out.lat {
            println!("{}", r.line());
        }
    } else {
        println!("{}", report::bw_header(p.gbits));
        for r in &out.bw {
            println!("{}", r.line());
        }
    }
    println!("{}", report::RESULT_LINE);
    if let Some(t) = &out.stats_text {
        print!("{t}");
    }
}
