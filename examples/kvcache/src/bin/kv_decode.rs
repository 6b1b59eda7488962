//! `kv_decode`: the decode node. Listens for one prefill node, receives the
//! prompt's KV cache into a registered region over RDMA WRITE WITH
//! IMMEDIATE (or TCP, as the prefill node chooses) and generates tokens.
//!
//! ```text
//! kv_decode --listen 18600 --device rxe:10.0.0.2
//! kv_decode --listen 18600 --device rxe:10.0.0.2 --kv-memory gpu:0   # KV cache in VRAM
//! ```

use std::net::TcpListener;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use rnic_kvcache::cli::{FaultArgs, ModelArgs, secs};
use rnic_kvcache::decode::{DecodeOptions, serve};

/// The decode node of a disaggregated-inference pair.
#[derive(Parser, Debug)]
#[command(name = "kv_decode", version)]
struct Args {
    /// TCP port to listen on for the prefill node's control connection.
    #[arg(long, default_value_t = 18600)]
    listen: u16,
    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0")]
    bind: String,
    /// Device spec: rxe (loopback), rxe:<ip|netdev>, mlx5:<pci bdf>.
    #[arg(long, default_value = "rxe")]
    device: String,
    #[command(flatten)]
    model: ModelArgs,
    /// Seconds to wait for the prefill node to connect.
    #[arg(long, default_value = "120", value_parser = secs)]
    accept_timeout: Duration,
    /// Seconds without progress (a control message or a chunk) before giving up.
    #[arg(long, default_value = "30", value_parser = secs)]
    timeout: Duration,
    /// Allocate and register a KV region for this many positions before
    /// the prefill node connects (0: per request). Requests that fit skip
    /// allocation and registration in their handshake.
    #[arg(long, default_value_t = 0)]
    prealloc: u32,
    /// NUMA node for the KV region (default: where this process runs; with
    /// --kv-memory gpu:N, of the staging ring, by default the GPU's).
    #[arg(long)]
    numa_node: Option<u32>,
    /// Where the KV cache lands: host, gpu:<ordinal> (VRAM, staged through
    /// pinned hugepages on rxe; needs the NVIDIA driver), or gpu-emulated
    /// (host memory behind the same staging path, for testing).
    #[arg(long, default_value = "host")]
    kv_memory: rnic::gpu::MemorySpec,
    #[command(flatten)]
    faults: FaultArgs,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// No progress lines.
    #[arg(long, short)]
    quiet: bool,
}

fn main() -> ExitCode {
    let a = Args::parse();
    let mut o = DecodeOptions::new(a.model.config());
    o.device = a.device.clone();
    o.accept_timeout = a.accept_timeout;
    o.timeout = a.timeout;
    o.numa_node = a.numa_node;
    o.kv_memory = a.kv_memory;
    o.prealloc_positions = a.prealloc;
    o.faults = a.faults.config(0);
    o.verbose = !a.quiet;
    let listener = match TcpListener::bind((a.bind.as_str(), a.listen)) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("kv_decode: cannot listen on {}:{}: {e}", a.bind, a.listen);
            return ExitCode::FAILURE;
        }
    };
    if !a.quiet {
        eprintln!(
            "kv_decode: listening on {}:{} (device {}, KV memory {})",
            a.bind, a.listen, a.device, a.kv_memory
        );
    }
    match serve(&listener, &o) {
        Ok(r) => {
            println!("{}", if a.json { r.to_json() } else { r.to_text() });
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("kv_decode: {e}");
            ExitCode::FAILURE
        }
    }
}
