//! `rnicctl stats`: counters as JSON/text.
//!
//! Live counters: `rnicctl perf … --stats-socket` serves its device's and
//! CQ's counters on `/run/rnic/<pid>.sock` (`RNIC_RUN_DIR` overrides the
//! directory): each connection gets one JSON line. `rnicctl stats` reads
//! every such socket, `rnicctl stats <pid>` one. Other rnic programs do not
//! serve one yet — [`StatsServer`] is the piece they would embed (it needs
//! only a cloned `RxeDevice` and the CQ's `CqCounters`); moving it into rnic-rxe
//! is the clean next step.
//!
//! Offline: the counters a perf run saved (`rnicctl perf … --stats --json >
//! run.json`, then `rnicctl stats run.json`), or, for a device spec, the
//! counters of a device this command opens itself (zero at first).

use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use rnic::core::CqCounters;
use rnic::rxe::RxeDevice;

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
        "window_cuts": s.window_cuts,
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
        "invalidate_refused": s.invalidate_refused,
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
        "icrc_ident_tap": d.icrc_ident_tap,
        "tap_drains": d.tap_drains,
        "icrc_unverified": d.icrc_unverified,
        "icrc_recovered": d.icrc_recovered,
        "icrc_drops": d.icrc_drops,
        "unknown_qpn": d.unknown_qpn,
        "foreign_qpn": d.foreign_qpn,
        "acks_deferred": d.acks_deferred,
        "acks_coalesced": d.acks_coalesced,
        "acks_bundled": d.acks_bundled,
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

/// How `dev` shares its addresses: its slot and QPN range, and every live
/// process's device (itself included) on any of the same addresses.
pub fn sharing_json(dev: &RxeDevice) -> Value {
    let members = rnic::rxe::share::members();
    let range = dev.qpn_range();
    let Some(slot) = dev.share_slot() else {
        return json!({
            "shared": false,
            "qpns": range.to_string(),
        });
    };
    let mine: Vec<String> = members
        .iter()
        .find(|m| m.slot == slot && m.pid == std::process::id())
        .map(|m| m.addrs.clone())
        .unwrap_or_default();
    json!({
        "shared": true,
        "slot": slot,
        "qpns": range.to_string(),
        "steered": dev.steered(),
        "members": members
            .iter()
            .filter(|m| m.addrs.iter().any(|a| mine.contains(a)))
            .map(member_json)
            .collect::<Vec<_>>(),
    })
}

/// One registry entry as JSON.
pub fn member_json(m: &rnic::rxe::MemberInfo) -> Value {
    json!({
        "pid": m.pid,
        "slot": m.slot,
        "target": m.target,
        "qpns": m.range.to_string(),
        "addrs": m.addrs,
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

/// Where live processes put their stats sockets.
pub fn run_dir() -> PathBuf {
    std::env::var_os("RNIC_RUN_DIR").map_or_else(|| PathBuf::from("/run/rnic"), PathBuf::from)
}

/// A CQ's counters as JSON.
pub fn cq_json(cq: &CqCounters) -> Value {
    let s = cq.stats();
    json!({
        "depth": s.depth,
        "in_flight": s.in_flight,
        "high_water_mark": s.credits.max_in_flight,
        "credit_stalls": s.credits.stalls,
        "static_qps": s.static_qps,
        "windowed_qps": s.windowed_qps,
    })
}

/// Serves `<run dir>/<pid>.sock` until dropped: one JSON line of counters
/// per connection.
#[derive(Debug)]
pub struct StatsServer {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl StatsServer {
    /// Start serving the counters of `dev` and `cq`.
    pub fn start(dev: RxeDevice, cq: CqCounters, label: String) -> Result<StatsServer, CtlError> {
        let dir = run_dir();
        let path = dir.join(format!("{}.sock", std::process::id()));
        let io = |what| move |source| CtlError::Io { what, source };
        std::fs::create_dir_all(&dir)
            .map_err(io("creating the stats socket directory (set RNIC_RUN_DIR)"))?;
        let _ = std::fs::remove_file(&path);
        let l = UnixListener::bind(&path).map_err(io("binding the stats socket"))?;
        l.set_nonblocking(true).map_err(io("stats socket"))?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::spawn(move || {
            while !stop2.load(Ordering::Acquire) {
                match l.accept() {
                    Ok((mut s, _)) => {
                        let v = json!({
                            "pid": std::process::id(),
                            "what": label,
                            "device": rxe_json(&dev.stats()),
                            "sharing": sharing_json(&dev),
                            "cq": cq_json(&cq),
                            "dma_registry": registry_json(&rnic::dma::registry::snapshot()),
                        });
                        let _ = s.set_nonblocking(false);
                        let _ = writeln!(s, "{v}");
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        Ok(StatsServer {
            path,
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for StatsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

fn read_socket(path: &Path) -> Result<Value, CtlError> {
    let s = UnixStream::connect(path).map_err(|source| CtlError::Io {
        what: "connecting to the stats socket (is that process still running with --stats-socket?)",
        source,
    })?;
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let mut line = String::new();
    BufReader::new(s)
        .read_line(&mut line)
        .map_err(|source| CtlError::Io {
            what: "reading the stats socket",
            source,
        })?;
    serde_json::from_str(line.trim())
        .map_err(|e| CtlError::Usage(format!("{}: not a stats line: {e}", path.display())))
}

/// `rnicctl stats [<pid> | <file.json> | <spec>]`.
pub fn main(target: Option<&str>, json_out: bool) -> Result<(), CtlError> {
    let Some(target) = target else {
        let mut socks: Vec<PathBuf> = std::fs::read_dir(run_dir())
            .map(|r| {
                r.filter_map(Result::ok)
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|x| x == "sock"))
                    .collect()
            })
            .unwrap_or_default();
        socks.sort();
        if socks.is_empty() {
            return Err(CtlError::Usage(format!(
                "no live rnic process serves counters under {} (start one with `rnicctl perf … --stats-socket`, or pass a saved run's JSON)",
                run_dir().display()
            )));
        }
        let all: Vec<Value> = socks.iter().filter_map(|p| read_socket(p).ok()).collect();
        if json_out {
            println!("{}", Value::Array(all));
        } else {
            for v in &all {
                print_tree(v, 0);
            }
        }
        return Ok(());
    };
    let v = if let Ok(pid) = target.parse::<u32>() {
        read_socket(&run_dir().join(format!("{pid}.sock")))?
    } else if Path::new(target).is_file() {
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
        let opened = crate::perf::open_device(target, false)?;
        let mlx5 = opened
            .memory
            .mlx5()
            .map(|p| crate::info::mlx5_facts(p).json);
        let dev = opened.dev;
        let regions = rnic::dma::registry::snapshot();
        json!({
            "device": dev.as_ref().map(|d| rxe_json(&d.stats())).unwrap_or(Value::Null),
            "mlx5": mlx5,
            "sharing": dev.as_ref().map(sharing_json).unwrap_or(Value::Null),
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
