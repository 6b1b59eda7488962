//! `rnicctl stats`: counters as JSON/text.
//!
//! A running rnic process keeps its counters in memory; there is no stats
//! socket yet, so another process cannot read them live. What this command
//! shows: the counters a perf run saved (`rnicctl perf … --stats --json >
//! run.json`, then `rnicctl stats run.json`), or, for a device spec, the
//! counters of a device this process opens (all zero at first — useful to
//! check the device opens). Live per-process counters need an IPC channel
//! (a `/run/rnic/<pid>.sock` the rxe device would serve); that is future work.

use std::path::Path;

use rnic::dma::RegionStats;
use rnic::roce::transport::QpStats;
use rnic::rxe::RxeStats;
use serde_json::{Value, json};

use crate::error::CtlError;

fn qp_json(s: &QpStats) -> Value {
    json!({
        "tx_packets": s.tx_packets,
        "tx_bytes": s.tx_bytes,
        "rx_packets": s.rx_packets,
        "rx_bytes": s.rx_bytes,
        "retransmits": s.retransmits,
        "timeouts": s.timeouts,
        "rnr_waits": s.rnr_waits,
        "naks_sent": {
            "total": s.naks_sent.total(),
            "psn_seq": s.naks_sent.psn_seq,
            "invalid_request": s.naks_sent.invalid_request,
            "remote_access": s.naks_sent.remote_access,
            "remote_op": s.naks_sent.remote_op,
            "rnr": s.naks_sent.rnr,
        },
        "naks_received": {
            "total": s.naks_received.total(),
            "psn_seq": s.naks_received.psn_seq,
            "invalid_request": s.naks_received.invalid_request,
            "remote_access": s.naks_received.remote_access,
            "remote_op": s.naks_received.remote_op,
            "rnr": s.naks_received.rnr,
        },
        "duplicate_requests": s.duplicate_requests,
        "duplicate_responses": s.duplicate_responses,
        "drops": s.drops.total(),
    })
}

/// An rxe device's counters as JSON.
pub fn rxe_json(s: &RxeStats) -> Value {
    let d = &s.device;
    json!({
        "tx_packets": d.tx_packets,
        "tx_bytes": d.tx_bytes,
        "tx_errors": d.tx_errors,
        "rx_packets": d.rx_packets,
        "rx_bytes": d.rx_bytes,
        "rx_malformed": d.rx_malformed,
        "icrc_ok": d.icrc_ok,
        "icrc_recovered": d.icrc_recovered,
        "icrc_drops": d.icrc_drops,
        "unknown_qpn": d.unknown_qpn,
        "gso_sends": d.gso_sends,
        "gro_datagrams": d.gro_datagrams,
        "cq_overflows": d.cq_overflows,
        "qps": s.qps.iter().map(|(q, st)| {
            let mut v = qp_json(st);
            v["qpn"] = json!(q.get());
            v
        }).collect::<Vec<_>>(),
    })
}

/// The DMA registry as JSON.
pub fn registry_json(r: &[RegionStats]) -> Value {
    Value::Array(
        r.iter()
            .map(|s| {
                json!({
                    "id": s.id,
                    "bytes": s.bytes,
                    "mapped_bytes": s.mapped_bytes,
                    "page_size": format!("{:?}", s.page_size),
                    "node_wanted": s.node_wanted.map(|n| n.0),
                    "node_verified": s.node_verified.map(|n| n.0),
                    "verified_fraction": s.verified_fraction,
                    "pinned": s.pinned,
                    "iova": s.iova.get(),
                })
            })
            .collect(),
    )
}

/// `rnicctl stats <file.json | spec>`.
pub fn main(target: &str, json_out: bool) -> Result<(), CtlError> {
    let v = if Path::new(target).is_file() {
        let text = std::fs::read_to_string(target).map_err(|source| CtlError::Io {
            what: "reading the saved perf output",
            source,
        })?;
        let v: Value = serde_json::from_str(&text).map_err(|e| {
            CtlError::Usage(format!(
                "{target} is not the JSON of `rnicctl perf … --stats --json`: {e}"
            ))
        })?;
        v.get("stats").cloned().unwrap_or(Value::Null)
    } else {
        let (_ctx, dev) = crate::perf::open_device(target, false)?;
        let regions = rnic::dma::registry::snapshot();
        json!({
            "device": dev.map(|d| rxe_json(&d.stats())).unwrap_or(Value::Null),
            "dma_registry": registry_json(&regions),
            "note": "counters of a device opened by this command; a running process's counters are not reachable yet (no stats socket): use `rnicctl perf … --stats`",
        })
    };
    if json_out {
        println!("{v}");
        return Ok(());
    }
    if v.is_null() {
        return Err(CtlError::Usage(format!(
            "{target} holds no counters: run the perf command with --stats --json"
        )));
    }
    print_tree(&v, 0);
    Ok(())
}

fn print_tree(v: &Value, depth: usize) {
    let pad = "  ".repeat(depth);
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                if x.is_object() || x.is_array() {
                    println!("{pad}{k}:");
                    print_tree(x, depth + 1);
                } else {
                    println!("{pad}{k}: {x}");
                }
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                println!("{pad}[{i}]");
                print_tree(x, depth + 1);
            }
        }
        other => println!("{pad}{other}"),
    }
}
