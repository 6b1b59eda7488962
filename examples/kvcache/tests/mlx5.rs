//! The disaggregated pair on mlx5-over-emulator: both nodes on emulated
//! ConnectX-5 functions (the KV region and the staging buffer are the
//! functions' own DMA memory), and one node on rnic-rxe; the decode node's
//! tokens and KV digest must equal the single-node reference.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use rnic_kvcache::decode::DecodeOptions;
use rnic_kvcache::model::ModelConfig;
use rnic_kvcache::pair::run_pair;
use rnic_kvcache::prefill::{PrefillOptions, Transport};
use rnic_kvcache::reference;
use rnic_mlx5_emu::TempFunction;

const GENERATE: u32 = 8;

fn pair(pspec: String, dspec: String, prompt: u32, prealloc: u32) {
    let mut p = PrefillOptions::new("", ModelConfig::TINY);
    p.device = pspec;
    p.prompt_len = prompt;
    p.prompt_seed = u64::from(prompt);
    p.generate = GENERATE;
    p.window = 4;
    p.chunk_bytes = 8192;
    p.transport = Transport::Rdma;
    p.timeout = Duration::from_secs(30);
    let mut d = DecodeOptions::new(ModelConfig::TINY);
    d.device = dspec;
    d.timeout = Duration::from_secs(30);
    d.accept_timeout = Duration::from_secs(30);
    d.prealloc_positions = prealloc;
    let (pr, dr) = run_pair(p, d)
        .expect("pair ran")
        .into_result()
        .expect("both nodes succeeded");
    let r = reference::run(&ModelConfig::TINY, prompt, u64::from(prompt), GENERATE).unwrap();
    assert_eq!(dr.tokens, r.tokens, "prompt {prompt}: tokens differ");
    assert_eq!(dr.digest, r.digest, "prompt {prompt}: KV cache differs");
    assert_eq!(pr.decode_tokens, r.tokens);
    assert!(dr.kv_bytes > 0 && dr.kv_bytes == pr.kv_bytes);
}

#[test]
fn kv_pair_on_two_emulated_functions_matches_reference() {
    let (a, b) = (
        TempFunction::start().unwrap(),
        TempFunction::start().unwrap(),
    );
    pair(a.spec_at("127.0.6.1"), b.spec_at("127.0.6.2"), 16, 0);
    pair(a.spec_at("127.0.6.1"), b.spec_at("127.0.6.2"), 128, 0);
    // The decode node's region allocated and registered before the request.
    pair(a.spec_at("127.0.6.1"), b.spec_at("127.0.6.2"), 128, 1024);
}

#[test]
fn kv_pair_between_an_emulated_function_and_rnic_rxe_matches_reference() {
    let a = TempFunction::start().unwrap();
    pair(a.spec_at("127.0.6.11"), "rxe:127.0.6.12".into(), 64, 0);
    pair("rxe:127.0.6.12".into(), a.spec_at("127.0.6.11"), 64, 0);
}

/// Issue 26 item 5: `kv_demo --device mlx5:vfio-user:<socket>@<ip>` puts both
/// nodes on one function, as its `--help` offers. A function has one owner,
/// so the second node's open shares the first's (rnic::open_mlx5) instead of
/// waiting in the emulator's accept queue while the other node times out.
#[test]
fn kv_pair_with_both_nodes_on_one_emulated_function_matches_reference() {
    let a = TempFunction::start().unwrap();
    let spec = a.spec_at("127.0.6.21");
    pair(spec.clone(), spec, 64, 0);
}

/// Issue 26 item 5: a prefill node whose device cannot be opened is what the
/// pair reports — the first error — not the decode node's consequence (a
/// truncated stream, or its accept timeout), and promptly.
#[test]
fn a_device_the_prefill_node_cannot_open_is_the_error_reported() {
    let mut p = PrefillOptions::new("", ModelConfig::TINY);
    p.device = "mlx5:vfio-user:/nonexistent/rnic-kv.sock@127.0.6.31".into();
    let mut d = DecodeOptions::new(ModelConfig::TINY);
    d.accept_timeout = Duration::from_secs(60);
    let start = std::time::Instant::now();
    let e = run_pair(p, d).unwrap().into_result().unwrap_err();
    let text = e.to_string();
    assert!(text.contains("is rnic-mlx5-emu running?"), "{text}");
    assert_eq!(text.matches("os error 2").count(), 1, "said once: {text}");
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "not the decode node's 60 s accept timeout"
    );
}
