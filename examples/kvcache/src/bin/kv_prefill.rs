//! `kv_prefill`: the prefill node. Computes a seeded prompt's KV cache layer
//! by layer and streams each layer into the decode node's memory as soon as
//! it exists.
//!
//! ```text
//! kv_prefill --connect 10.0.0.2:18600 --device rxe:10.0.0.1 --prompt 1024
//! ```

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use rnic_kvcache::cli::{FaultArgs, ModelArgs, secs};
use rnic_kvcache::prefill::{PrefillOptions, Transport, run};

/// The prefill node of a disaggregated-inference pair.
#[derive(Parser, Debug)]
#[command(name = "kv_prefill", version)]
struct Args {
    /// The decode node's control address.
    #[arg(long, default_value = "127.0.0.1:18600")]
    connect: String,
    /// Device spec: rxe (loopback), rxe:<ip|netdev>, mlx5:<pci bdf>.
    #[arg(long, default_value = "rxe:127.0.0.2")]
    device: String,
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt length in tokens (16..=4096 is the intended range).
    #[arg(long, default_value_t = 512)]
    prompt: u32,
    /// Seed of the prompt's token ids.
    #[arg(long, default_value_t = 1)]
    prompt_seed: u64,
    /// Tokens the decode node generates.
    #[arg(long, default_value_t = 32)]
    generate: u32,
    /// Credit window: most unacknowledged chunks in flight.
    #[arg(long, default_value_t = 16)]
    window: u32,
    /// Largest chunk in bytes.
    #[arg(long, default_value_t = 1 << 20)]
    chunk: u32,
    /// rdma (WRITE WITH IMMEDIATE) or tcp (the baseline: frames on the control socket).
    #[arg(long, default_value = "rdma", value_parser = ["rdma", "tcp"])]
    transport: String,
    /// Seconds any wait may take (connect, reply, completion).
    #[arg(long, default_value = "30", value_parser = secs)]
    timeout: Duration,
    /// NUMA node for the staging buffer.
    #[arg(long)]
    numa_node: Option<u32>,
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
    let mut o = PrefillOptions::new(&a.connect, a.model.config());
    o.device = a.device.clone();
    o.prompt_len = a.prompt;
    o.prompt_seed = a.prompt_seed;
    o.generate = a.generate;
    o.window = a.window;
    o.chunk_bytes = a.chunk;
    o.transport = Transport::from_name(&a.transport).unwrap_or_default();
    o.timeout = a.timeout;
    o.numa_node = a.numa_node;
    o.faults = a.faults.config(1);
    o.verbose = !a.quiet;
    match run(&o) {
        Ok(r) => {
            println!("{}", if a.json { r.to_json() } else { r.to_text() });
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("kv_prefill: {e}");
            ExitCode::FAILURE
        }
    }
}
