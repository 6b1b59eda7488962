//! The disaggregated pair against the single-node reference, under faults,
//! and its failure modes: wrong layout, truncated stream, dead peer. Every
//! wait is bounded by the options' timeouts, so no test can hang.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::TcpListener;
use std::time::{Duration, Instant};

use rnic::rxe::FaultConfig;
use rnic_kvcache::KvError;
use rnic_kvcache::decode::{DecodeOptions, serve};
use rnic_kvcache::model::ModelConfig;
use rnic_kvcache::pair::{PairOutcome, device_pair, run_pair};
use rnic_kvcache::prefill::{self, PrefillOptions, StreamFault, Transport};
use rnic_kvcache::reference;

const GENERATE: u32 = 8;

fn options(prompt: u32, transport: Transport) -> (PrefillOptions, DecodeOptions) {
    let (dspec, pspec) = device_pair("rxe");
    let mut p = PrefillOptions::new("", ModelConfig::TINY);
    p.device = pspec;
    p.prompt_len = prompt;
    p.prompt_seed = u64::from(prompt);
    p.generate = GENERATE;
    p.window = 4;
    p.chunk_bytes = 8192;
    p.transport = transport;
    p.timeout = Duration::from_secs(20);
    let mut d = DecodeOptions::new(ModelConfig::TINY);
    d.device = dspec;
    d.timeout = Duration::from_secs(20);
    d.accept_timeout = Duration::from_secs(20);
    (p, d)
}

fn check_against_reference(p: PrefillOptions, d: DecodeOptions) {
    let (prompt, seed) = (p.prompt_len, p.prompt_seed);
    let (pr, dr) = run_pair(p, d)
        .expect("pair ran")
        .into_result()
        .expect("both nodes succeeded");
    let r = reference::run(&ModelConfig::TINY, prompt, seed, GENERATE).expect("reference");
    assert_eq!(dr.tokens, r.tokens, "prompt {prompt}: tokens differ");
    assert_eq!(dr.digest, r.digest, "prompt {prompt}: KV cache differs");
    assert_eq!(pr.decode_tokens, r.tokens, "KVDONE carries the tokens");
    assert_eq!(dr.chunks, pr.chunks);
    assert_eq!(dr.kv_bytes, pr.kv_bytes);
    assert!(dr.ttft >= dr.first_step);
    // Over RDMA the staging memory (a hugepage DmaRegion or the
    // application's own OwnedBuffer) offers direct access: every layer's K
    // and V were computed into it in place; TCP ships a packed copy.
    let in_place = if pr.transport == "rdma" {
        ModelConfig::TINY.layers
    } else {
        0
    };
    assert_eq!(pr.in_place_layers, in_place, "{}", pr.to_text());
}

#[test]
fn rdma_pair_matches_reference_at_16_128_512() {
    for prompt in [16, 128, 512] {
        let (p, d) = options(prompt, Transport::Rdma);
        check_against_reference(p, d);
    }
}

#[test]
fn preregistered_region_matches_reference() {
    let (p, mut d) = options(128, Transport::Rdma);
    d.prealloc_positions = 1024;
    check_against_reference(p, d);
}

#[test]
fn tcp_baseline_matches_reference() {
    let (p, d) = options(128, Transport::Tcp);
    check_against_reference(p, d);
}

#[test]
fn loss_and_reordering_in_rxe_still_give_identical_tokens() {
    let (mut p, mut d) = options(128, Transport::Rdma);
    let faults = |seed| FaultConfig {
        seed,
        drop_ppm: 20_000,
        reorder_ppm: 20_000,
    };
    p.faults = faults(11);
    d.faults = faults(12);
    let (prompt, seed) = (p.prompt_len, p.prompt_seed);
    let (pr, dr) = run_pair(p, d).expect("pair").into_result().expect("ok");
    let r = reference::run(&ModelConfig::TINY, prompt, seed, GENERATE).expect("reference");
    assert_eq!(dr.tokens, r.tokens);
    assert_eq!(dr.digest, r.digest);
    assert!(
        dr.faults.0 + dr.faults.1 > 0,
        "faults were injected on the decode side: {:?}",
        dr.faults
    );
    assert!(pr.retransmits > 0, "lost packets were retransmitted");
}

#[test]
fn tight_window_stalls_are_counted() {
    let (mut p, d) = options(128, Transport::Rdma);
    p.window = 1;
    p.chunk_bytes = 4096;
    // A window of 1 stalls whenever a chunk's completion is still out when
    // the next chunk is posted. Whether that happens by itself depends on
    // the machine (a fast enough round trip beats a debug build's post), so
    // the prefill node loses an ACK (seed 5 at 3 %: the 39th packet it
    // receives, of about 65): that completion waits for a retransmission
    // timeout, and the post after it must stall.
    p.faults = FaultConfig {
        seed: 5,
        drop_ppm: 30_000,
        reorder_ppm: 0,
    };
    let (pr, dr) = run_pair(p, d).expect("pair").into_result().expect("ok");
    assert!(pr.max_in_flight <= 1, "{}", pr.max_in_flight);
    assert!(pr.faults.0 > 0, "ACKs were lost: {:?}", pr.faults);
    assert!(pr.stalls > 0, "a window of 1 must stall behind a lost ACK");
    assert_eq!(dr.prefill_stalls, pr.stalls);
}

fn expect_errors(out: PairOutcome) -> (KvError, KvError) {
    match (out.prefill, out.decode) {
        (Err(p), Err(d)) => (p, d),
        (p, d) => panic!("both nodes should fail: prefill {p:?}, decode {d:?}"),
    }
}

#[test]
fn mismatched_model_is_refused_by_name() {
    let (p, mut d) = options(16, Transport::Rdma);
    d.model.seed = 99;
    let (pe, de) = expect_errors(run_pair(p, d).expect("pair"));
    assert!(
        matches!(
            de,
            KvError::LayoutMismatch {
                field: "model fingerprint",
                ..
            }
        ),
        "{de}"
    );
    assert!(matches!(pe, KvError::Refused { .. }), "{pe}");
    assert!(pe.to_string().contains("fingerprint"), "{pe}");

    let (p, mut d) = options(16, Transport::Rdma);
    d.model.heads = 4;
    let (pe, de) = expect_errors(run_pair(p, d).expect("pair"));
    assert!(
        matches!(de, KvError::LayoutMismatch { field: "heads", .. }),
        "{de}"
    );
    assert!(pe.to_string().contains("heads"), "{pe}");
}

#[test]
fn prefill_dying_mid_stream_is_a_truncation() {
    let (mut p, d) = options(128, Transport::Rdma);
    p.fault = Some(StreamFault::AbortAfter(5));
    let start = Instant::now();
    let (_, de) = expect_errors(run_pair(p, d).expect("pair"));
    assert!(matches!(de, KvError::Truncated { received: 5, .. }), "{de}");
    assert!(de.to_string().contains("closed its connection"), "{de}");
    assert!(
        start.elapsed() < Duration::from_secs(15),
        "noticed by the closed connection, not the 20 s timeout"
    );
}

#[test]
fn missing_sentinel_times_out_as_a_truncation() {
    let (mut p, mut d) = options(16, Transport::Rdma);
    p.fault = Some(StreamFault::NoSentinel);
    d.timeout = Duration::from_millis(800);
    p.timeout = Duration::from_secs(10);
    let (pe, de) = expect_errors(run_pair(p, d).expect("pair"));
    match &de {
        KvError::Truncated {
            received, expected, ..
        } => assert_eq!(received, expected, "every chunk but no sentinel"),
        other => panic!("{other}"),
    }
    assert!(de.to_string().contains("no end-of-stream sentinel"), "{de}");
    assert!(
        matches!(pe, KvError::Protocol { .. } | KvError::Io { .. }),
        "{pe}"
    );
}

#[test]
fn truncated_tcp_stream_is_a_truncation() {
    let (mut p, d) = options(128, Transport::Tcp);
    p.fault = Some(StreamFault::AbortAfter(3));
    let (_, de) = expect_errors(run_pair(p, d).expect("pair"));
    assert!(matches!(de, KvError::Truncated { received: 3, .. }), "{de}");
}

#[test]
fn no_decode_node_is_a_connect_error() {
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let (mut p, _) = options(16, Transport::Rdma);
    p.connect = format!("127.0.0.1:{port}");
    p.timeout = Duration::from_secs(2);
    let e = prefill::run(&p).expect_err("nobody listens");
    assert!(e.to_string().contains("is it listening"), "{e}");
}

#[test]
fn no_prefill_node_times_out() {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let (_, mut d) = options(16, Transport::Rdma);
    d.accept_timeout = Duration::from_millis(300);
    let start = Instant::now();
    let e = serve(&l, &d).expect_err("nobody connects");
    assert!(matches!(e, KvError::Timeout { .. }), "{e}");
    assert!(start.elapsed() < Duration::from_secs(5));
}

#[test]
fn decode_node_vanishing_fails_the_prefill() {
    let (mut p, mut d) = options(128, Transport::Rdma);
    d.die_after_accept = true;
    p.timeout = Duration::from_secs(10);
    let start = Instant::now();
    let (pe, _) = expect_errors(run_pair(p, d).expect("pair"));
    assert!(
        matches!(
            pe,
            KvError::Completion {
                status: rnic::core::WcStatus::RetryExcErr,
                ..
            }
        ),
        "{pe}"
    );
    assert!(pe.to_string().contains("is the other node alive"), "{pe}");
    assert!(
        start.elapsed() < Duration::from_secs(9),
        "the transport's retry budget, not the 10 s timeout, ends it"
    );
}

/// The KV cache into "VRAM" through the GPU staging path (host memory behind
/// the same staging ring and copy queue, `gpu-emulated`): the same tokens
/// and KV digest as the reference and as host memory, and the report says
/// where the cache landed.
#[test]
fn kv_into_staged_memory_matches_host_and_reference() {
    use rnic::gpu::MemorySpec;
    for prompt in [16, 300] {
        let mut results = Vec::new();
        for mem in [MemorySpec::Host, MemorySpec::Emulated] {
            let (p, mut d) = options(prompt, Transport::Rdma);
            d.kv_memory = mem;
            let (_, dr) = run_pair(p, d).unwrap().into_result().unwrap();
            assert_eq!(dr.kv_memory, mem.to_string());
            let kind = dr.placement.as_ref().unwrap().kind;
            assert_eq!(
                kind,
                if mem == MemorySpec::Host {
                    "dma"
                } else {
                    "vram-emulated"
                }
            );
            assert!(
                dr.to_text().contains(&format!("pinned [{mem}]")),
                "{}",
                dr.to_text()
            );
            assert!(dr.to_json().contains(&format!("\"kv_memory\":\"{mem}\"")));
            results.push((dr.tokens, dr.digest));
        }
        let r = reference::run(&ModelConfig::TINY, prompt, u64::from(prompt), GENERATE).unwrap();
        assert_eq!(
            results[0],
            (r.tokens.clone(), r.digest),
            "host memory, prompt {prompt}"
        );
        assert_eq!(
            results[1],
            (r.tokens, r.digest),
            "staged memory, prompt {prompt}"
        );
    }
}

/// TCP delivery into staged memory goes through `Memory::write` too.
#[test]
fn tcp_into_staged_memory_matches_reference() {
    let (p, mut d) = options(64, Transport::Tcp);
    d.kv_memory = rnic::gpu::MemorySpec::Emulated;
    check_against_reference(p, d);
}
