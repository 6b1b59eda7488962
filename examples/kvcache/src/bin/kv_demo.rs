//! `kv_demo`: both nodes in one command (threads, loopback), checked
//! against the single-node reference.
//!
//! ```text
//! kv_demo --prompt 1024 --generate 32                 # RDMA over rxe on loopback
//! kv_demo --prompt 1024 --transport both --json       # RDMA and the TCP baseline
//! kv_demo --prompt 128 --loss 2 --reorder 2           # with injected faults
//! kv_demo --reference --prompt 128                    # the single-node reference only
//! kv_demo --prompt 1024 --kv-memory host,gpu:0         # KV into host memory, then VRAM
//! ```

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use rnic_kvcache::cli::{FaultArgs, ModelArgs, secs};
use rnic_kvcache::decode::DecodeOptions;
use rnic_kvcache::pair::{device_pair, run_pair};
use rnic_kvcache::prefill::{PrefillOptions, Transport};
use rnic_kvcache::reference;
use rnic_kvcache::report::{Json, ms, tokens_json};

/// Prefill and decode nodes over loopback, verified against the reference.
#[derive(Parser, Debug)]
#[command(name = "kv_demo", version)]
struct Args {
    /// Device spec for both nodes: rxe (two loopback addresses), or a spec
    /// such as mlx5:<bdf> (both nodes on it).
    #[arg(long, default_value = "rxe")]
    device: String,
    /// The decode node's device (overrides --device), e.g. rxe:127.0.0.1.
    #[arg(long)]
    decode_device: Option<String>,
    /// The prefill node's device (overrides --device), e.g. rxe:127.0.0.2.
    #[arg(long)]
    prefill_device: Option<String>,
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt length in tokens.
    #[arg(long, default_value_t = 512)]
    prompt: u32,
    /// Seed of the prompt's token ids.
    #[arg(long, default_value_t = 1)]
    prompt_seed: u64,
    /// Tokens to generate.
    #[arg(long, default_value_t = 32)]
    generate: u32,
    /// Credit window: most unacknowledged chunks in flight.
    #[arg(long, default_value_t = 16)]
    window: u32,
    /// Largest chunk in bytes.
    #[arg(long, default_value_t = 1 << 20)]
    chunk: u32,
    /// rdma, tcp, or both (one after the other, same prompt).
    #[arg(long, default_value = "rdma", value_parser = ["rdma", "tcp", "both"])]
    transport: String,
    /// Seconds any wait may take.
    #[arg(long, default_value = "60", value_parser = secs)]
    timeout: Duration,
    #[command(flatten)]
    faults: FaultArgs,
    /// Register the decode node's KV region before the prefill connects
    /// (a pre-registered pool of one), instead of per request.
    #[arg(long)]
    prealloc: bool,
    /// Where the decode node's KV cache lands, one run each, side by side:
    /// host, gpu:<ordinal> (VRAM, staged on rxe), gpu-emulated (host memory
    /// behind the same staging path). Comma-separated.
    #[arg(long, default_value = "host", value_delimiter = ',')]
    kv_memory: Vec<rnic::gpu::MemorySpec>,
    /// Run only the single-node reference.
    #[arg(long)]
    reference: bool,
    /// Skip the reference check.
    #[arg(long)]
    no_verify: bool,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
    /// No progress lines.
    #[arg(long, short)]
    quiet: bool,
}

fn main() -> ExitCode {
    let a = Args::parse();
    match run(&a) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(2),
        Err(e) => {
            eprintln!("kv_demo: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(a: &Args) -> Result<bool, rnic_kvcache::KvError> {
    let cfg = a.model.config();
    let reference = if a.reference || !a.no_verify {
        if !a.quiet {
            eprintln!(
                "reference: prefill {} tokens + {} decode steps on one node",
                a.prompt, a.generate
            );
        }
        Some(reference::run(&cfg, a.prompt, a.prompt_seed, a.generate)?)
    } else {
        None
    };
    if a.reference {
        let Some(r) = reference else { return Ok(true) };
        if a.json {
            let j = Json::new()
                .num("prefill_ms", ms(r.prefill))
                .num("ttft_ms", ms(r.ttft))
                .str("kv_digest", &format!("{:016x}", r.digest))
                .raw("tokens", &tokens_json(&r.tokens))
                .finish();
            println!("{j}");
        } else {
            println!(
                "reference: prefill {:.2} ms, TTFT {:.2} ms, digest {:016x}\n  tokens: {}",
                ms(r.prefill),
                ms(r.ttft),
                r.digest,
                tokens_json(&r.tokens)
            );
        }
        return Ok(true);
    }
    let transports = match a.transport.as_str() {
        "both" => vec![Transport::Rdma, Transport::Tcp],
        "tcp" => vec![Transport::Tcp],
        _ => vec![Transport::Rdma],
    };
    let mut all_ok = true;
    let mut runs = Vec::new();
    let mut streams = Vec::new();
    let runs_of = transports
        .iter()
        .flat_map(|t| a.kv_memory.iter().map(move |m| (*t, *m)));
    for (t, mem) in runs_of {
        let (dspec, pspec) = device_pair(&a.device);
        let dspec = a.decode_device.clone().unwrap_or(dspec);
        let pspec = a.prefill_device.clone().unwrap_or(pspec);
        let mut p = PrefillOptions::new("", cfg);
        p.device = pspec;
        p.prompt_len = a.prompt;
        p.prompt_seed = a.prompt_seed;
        p.generate = a.generate;
        p.window = a.window;
        p.chunk_bytes = a.chunk;
        p.transport = t;
        p.timeout = a.timeout;
        p.faults = a.faults.config(1);
        p.verbose = !a.quiet;
        let mut d = DecodeOptions::new(cfg);
        d.device = dspec;
        d.timeout = a.timeout;
        d.accept_timeout = a.timeout;
        d.faults = a.faults.config(2);
        d.verbose = !a.quiet;
        d.kv_memory = mem;
        if a.prealloc {
            d.prealloc_positions = a.prompt.saturating_add(a.generate);
        }
        let (pr, dr) = run_pair(p, d)?.into_result()?;
        let verdict = reference
            .as_ref()
            .map(|r| r.tokens == dr.tokens && r.digest == dr.digest);
        if verdict == Some(false) {
            all_ok = false;
        }
        streams.push(format!(
            "{} into {}: {:.2} MiB, transfer busy {:.2} ms ({:.3} GB/s), tail after compute {:.2} ms, TTFT {:.2} ms; tokens {}",
            t.name(),
            mem,
            dr.kv_bytes as f64 / f64::from(1u32 << 20),
            ms(pr.transfer_busy),
            rnic_kvcache::report::gbps(pr.kv_bytes, pr.transfer_busy),
            ms(pr.tail),
            ms(dr.ttft),
            match verdict {
                Some(true) => "match the reference",
                Some(false) => "DIFFER",
                None => "not verified",
            }
        ));
        if a.json {
            let mut j = Json::new()
                .str("transport", t.name())
                .str("kv_memory", &mem.to_string())
                .raw("prefill", &pr.to_json())
                .raw("decode", &dr.to_json());
            j = match verdict {
                Some(v) => j.bool("matches_reference", v),
                None => j.raw("matches_reference", "null"),
            };
            runs.push(j.finish());
        } else {
            println!("{}", pr.to_text());
            println!("{}", dr.to_text());
            match verdict {
                Some(true) => {
                    println!("  matches the single-node reference (tokens and KV digest)")
                }
                Some(false) => println!("  MISMATCH with the single-node reference"),
                None => println!("  (not verified)"),
            }
        }
    }
    if a.json {
        let mut j = Json::new()
            .int("layers", u64::from(cfg.layers))
            .int("heads", u64::from(cfg.heads))
            .int("head_dim", u64::from(cfg.head_dim))
            .int("prompt_tokens", u64::from(a.prompt))
            .int("generate", u64::from(a.generate))
            .raw("runs", &format!("[{}]", runs.join(",")));
        if let Some(r) = &reference {
            j = j.raw(
                "reference",
                &Json::new()
                    .num("prefill_ms", ms(r.prefill))
                    .num("ttft_ms", ms(r.ttft))
                    .raw("tokens", &tokens_json(&r.tokens))
                    .finish(),
            );
        }
        println!("{}", j.finish());
    } else if streams.len() > 1 {
        println!("KV stream, side by side:");
        for l in &streams {
            println!("  {l}");
        }
    }
    Ok(all_ok)
}
