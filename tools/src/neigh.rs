//! `rnicctl neigh <spec>`: an mlx5 function's neighbour cache (`ip neigh`'s view of the port's
//! ARP/ND engine), its static and host-kernel entries, and the port's counters; `--resolve`
//! resolves addresses first. Also the `port` object of `rnicctl info` / `rnicctl stats`.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use rnic::mlx5::Mlx5Provider;
use rnic::mlx5::port::PortCounters;
use serde_json::{Value, json};

use crate::error::CtlError;

/// The port's counters as JSON: frames by disposition, the engine's counts by cause.
pub(crate) fn counters_json(c: &PortCounters) -> Value {
    let n = &c.neighbours;
    let i = &n.ignored;
    let m = &n.malformed;
    json!({
        "rx_frames": c.rx_frames,
        "rx_oversized": c.rx_oversized,
        "tx_frames": c.tx_frames,
        "tx_full": c.tx_full,
        "tx_too_long": c.tx_too_long,
        "cqe_errors": c.cqe_errors,
        "recoveries": c.recoveries,
        "cqe_unexpected": c.cqe_unexpected,
        "answered": n.answered,
        "learned": n.learned,
        "resolved": n.resolved,
        "failed": n.failed,
        "solicitations_sent": n.solicitations_sent,
        "probes_sent": n.probes_sent,
        "announcements_sent": n.announcements_sent,
        "defended": n.defended,
        "mac_changed": n.mac_changed,
        "evicted": n.evicted,
        "tx_dropped": n.tx_dropped,
        "ignored": {
            "total": i.total(),
            "other_mac": i.other_mac,
            "other_vlan": i.other_vlan,
            "own_frame": i.own_frame,
            "other_protocol": i.other_protocol,
            "router_discovery": i.router_discovery,
            "not_for_us": i.not_for_us,
            "unsolicited": i.unsolicited,
            "static_kept": i.static_kept,
            "conflict": i.conflict,
            "rate_limited": i.rate_limited,
            "not_applied": i.not_applied,
        },
        "malformed": {
            "total": m.total(),
            "truncated": m.truncated,
            "ethernet_source": m.ethernet_source,
            "arp_format": m.arp_format,
            "arp_operation": m.arp_operation,
            "arp_address": m.arp_address,
            "ipv6_header": m.ipv6_header,
            "icmpv6_checksum": m.icmpv6_checksum,
            "nd_hop_limit": m.nd_hop_limit,
            "nd_rule": m.nd_rule,
            "nd_link_layer_address": m.nd_link_layer_address,
        },
    })
}

/// Every entry the function resolves peers from: the port's cache, then the function's own
/// static and host-kernel entries.
fn entries_json(p: &Arc<Mlx5Provider>) -> Vec<Value> {
    let mut out: Vec<Value> = p
        .port()
        .map(|port| {
            port.neighbours()
                .iter()
                .map(|n| {
                    json!({
                        "ip": n.ip.to_string(),
                        "mac": n.mac.map(|m| m.to_string()),
                        "state": n.state.to_string(),
                        "age_ms": n.age.as_millis() as u64,
                        "tries": n.tries,
                        "source": "ARP/ND",
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    out.extend(p.hca().neighbours().iter().map(|n| {
        json!({
            "ip": n.ip.to_string(),
            "mac": rnic::mlx5::firmware::neigh::mac_text(&n.mac),
            "state": "PERMANENT",
            "source": n.source.to_string(),
        })
    }));
    out
}

/// The NIC vport's traffic counters (QUERY_VPORT_COUNTER) as JSON; null when the firmware
/// refuses the query.
pub(crate) fn vport_json(p: &Arc<Mlx5Provider>) -> Value {
    let Ok(v) = p.hca().vport_counters() else {
        return Value::Null;
    };
    let t = |t: rnic::mlx5::Traffic| json!({ "packets": t.packets, "octets": t.octets });
    json!({
        "rx_errors": t(v.rx_errors),
        "tx_errors": t(v.tx_errors),
        "rx_unicast": t(v.rx_unicast),
        "tx_unicast": t(v.tx_unicast),
        "rx_multicast": t(v.rx_multicast),
        "tx_multicast": t(v.tx_multicast),
        "rx_broadcast": t(v.rx_broadcast),
        "tx_broadcast": t(v.tx_broadcast),
    })
}

/// The `port` object of `rnicctl info` / `stats`: the NIC vport's counters, and the port
/// L2's when it runs.
pub(crate) fn port_json(p: &Arc<Mlx5Provider>) -> Value {
    json!({
        "l2": if p.port().is_some() { "ARP/ND" } else { "off" },
        "counters": p.port().map(|port| counters_json(&port.counters())),
        "vport": vport_json(p),
    })
}

/// One line per entry, as `ip neigh` prints them.
fn entry_line(e: &Value) -> String {
    let s = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("");
    let mut line = s("ip").to_owned();
    if let Some(mac) = e.get("mac").and_then(Value::as_str) {
        line.push_str(&format!(" lladdr {mac}"));
    }
    line.push_str(&format!(" {}", s("state")));
    if let Some(age) = e.get("age_ms").and_then(Value::as_u64) {
        line.push_str(&format!(" age {:.1}s", age as f64 / 1000.0));
    }
    if s("state") != "REACHABLE"
        && let Some(t) = e.get("tries").and_then(Value::as_u64)
        && t > 0
    {
        line.push_str(&format!(" tries {t}"));
    }
    line.push_str(&format!(" ({})", s("source")));
    line
}

/// `rnicctl neigh`.
pub fn main(
    spec: &str,
    resolve: &[IpAddr],
    wait: Duration,
    json_out: bool,
) -> Result<(), CtlError> {
    let opened = crate::perf::open_device(spec, false)?;
    let Some(p) = opened.memory.mlx5() else {
        return Err(CtlError::Usage(format!(
            "{spec}: an rxe device resolves its peers through the host kernel; its cache is \
             `ip neigh show` (rnicctl neigh lists an mlx5 function's own ARP/ND cache)"
        )));
    };
    let Some(port) = p.port() else {
        return Err(CtlError::Usage(format!(
            "{spec}: the function's port L2 is off, so it has no ARP/ND cache (static and \
             host-kernel entries only: `rnicctl info {spec}`); add neigh=arp to the spec"
        )));
    };
    let mut resolved = Vec::new();
    for ip in resolve {
        if !json_out {
            eprintln!("resolving {ip} (up to {wait:?}) ...");
        }
        let r = port.resolve(*ip, wait);
        resolved.push(match r {
            Ok(mac) => json!({
                "ip": ip.to_string(),
                "mac": rnic::mlx5::firmware::neigh::mac_text(&mac),
            }),
            Err(e) => json!({ "ip": ip.to_string(), "error": e.to_string() }),
        });
    }
    let entries = entries_json(p);
    let counters = counters_json(&port.counters());
    let vport = vport_json(p);
    if json_out {
        println!(
            "{}",
            json!({
                "spec": spec,
                "own_addresses": p.hca().own_ips().iter().map(ToString::to_string).collect::<Vec<_>>(),
                "mac": p.hca().mac().map(|m| rnic::mlx5::firmware::neigh::mac_text(&m)),
                "resolved": resolved,
                "entries": entries,
                "counters": counters,
                "vport": vport,
            })
        );
    } else {
        for r in &resolved {
            match (r.get("mac"), r.get("error")) {
                (Some(m), _) => println!(
                    "resolved {} -> {}",
                    r["ip"].as_str().unwrap_or(""),
                    m.as_str().unwrap_or("")
                ),
                (_, Some(e)) => println!(
                    "FAILED {}: {}",
                    r["ip"].as_str().unwrap_or(""),
                    e.as_str().unwrap_or("")
                ),
                _ => {}
            }
        }
        if entries.is_empty() {
            println!(
                "(no entries: this command's port started empty; --resolve <ip> asks the network)"
            );
        }
        for e in &entries {
            println!("{}", entry_line(e));
        }
        println!(
            "port: {} frames in, {} out, {} answered, {} learned, {} ignored, {} malformed",
            counters["rx_frames"],
            counters["tx_frames"],
            counters["answered"],
            counters["learned"],
            counters["ignored"]["total"],
            counters["malformed"]["total"]
        );
    }
    if resolved.iter().any(|r| r.get("error").is_some()) {
        return Err(CtlError::Usage(
            "some addresses did not answer (see above): check the peer is up on the same L2, \
             its VLAN, and that the switch passes ARP/ND to this function"
                .into(),
        ));
    }
    Ok(())
}
