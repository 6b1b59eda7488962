//! `rnicctl info <spec>`: what `Context::query_device/query_port/query_gid_table` report.

use serde_json::json;

use crate::error::CtlError;

/// `rnicctl info`.
pub fn main(spec: &str, json_out: bool) -> Result<(), CtlError> {
    let opened = crate::perf::open_device(spec, false)?;
    let ctx = &opened.ctx;
    let mlx5 = opened.memory.mlx5().map(mlx5_facts);
    let q = |what| {
        move |e: rnic::core::VerbsError| CtlError::Verbs {
            what,
            why: e.to_string(),
        }
    };
    let d = ctx.query_device().map_err(q("query_device"))?;
    let mut ports = Vec::new();
    for p in 1..=d.phys_port_cnt.max(1) {
        let a = ctx.query_port(p).map_err(q("query_port"))?;
        let g = ctx.query_gid_table(p).map_err(q("query_gid_table"))?;
        ports.push((p, a, g));
    }
    if json_out {
        let v = json!({
            "spec": spec,
            "backend": ctx.backend(),
            "fw_ver": d.fw_ver,
            "vendor_id": d.vendor_id,
            "vendor_part_id": d.vendor_part_id,
            "node_guid": format!("{:016x}", d.node_guid),
            "limits": {
                "max_qp": d.max_qp, "max_qp_wr": d.max_qp_wr, "max_sge": d.max_sge,
                "max_cq": d.max_cq, "max_cqe": d.max_cqe, "max_mr": d.max_mr,
                "max_mr_size": d.max_mr_size, "max_qp_rd_atom": d.max_qp_rd_atom,
                "max_qp_init_rd_atom": d.max_qp_init_rd_atom,
                "max_inline_data": d.max_inline_data,
                "atomic_cap": format!("{:?}", d.atomic_cap),
            },
            "ports": ports.iter().map(|(p, a, g)| json!({
                "port": p,
                "state": format!("{:?}", a.state),
                "max_mtu": a.max_mtu.bytes(),
                "active_mtu": a.active_mtu.bytes(),
                "link_layer": format!("{:?}", a.link_layer),
                "active_width": a.active_width,
                "active_speed_mbps": a.active_speed_mbps,
                "max_msg_sz": a.max_msg_sz,
                "gids": g.iter().map(|e| json!({
                    "index": e.index,
                    "gid": std::net::Ipv6Addr::from(*e.gid.raw()).to_string(),
                    "type": format!("{:?}", e.gid_type),
                    "netdev": e.netdev,
                })).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
            "mlx5": mlx5.as_ref().map(|m| &m.json),
        });
        println!("{v}");
        return Ok(());
    }
    println!("device: {spec} (backend {})", ctx.backend());
    println!(
        "\tfw_ver:\t\t\t{}",
        if d.fw_ver.is_empty() { "-" } else { &d.fw_ver }
    );
    println!("\tnode_guid:\t\t{:016x}", d.node_guid);
    println!("\tvendor_id:\t\t0x{:04x}", d.vendor_id);
    println!("\tvendor_part_id:\t\t{}", d.vendor_part_id);
    println!("\tmax_qp:\t\t\t{}", d.max_qp);
    println!("\tmax_qp_wr:\t\t{}", d.max_qp_wr);
    println!("\tmax_sge:\t\t{}", d.max_sge);
    println!("\tmax_cq:\t\t\t{}", d.max_cq);
    println!("\tmax_cqe:\t\t{}", d.max_cqe);
    println!("\tmax_mr:\t\t\t{}", d.max_mr);
    println!("\tmax_mr_size:\t\t0x{:x}", d.max_mr_size);
    println!("\tmax_qp_rd_atom:\t\t{}", d.max_qp_rd_atom);
    println!("\tmax_qp_init_rd_atom:\t{}", d.max_qp_init_rd_atom);
    println!("\tmax_inline_data:\t{}", d.max_inline_data);
    println!("\tatomic_cap:\t\t{:?}", d.atomic_cap);
    for (p, a, g) in &ports {
        println!("\tport:\t{p}");
        println!("\t\tstate:\t\t{:?}", a.state);
        println!("\t\tmax_mtu:\t{}", a.max_mtu.bytes());
        println!("\t\tactive_mtu:\t{}", a.active_mtu.bytes());
        println!("\t\tlink_layer:\t{:?}", a.link_layer);
        println!(
            "\t\tactive_width:\t{}X, {} Mb/s per lane",
            a.active_width, a.active_speed_mbps
        );
        println!("\t\tmax_msg_sz:\t0x{:x}", a.max_msg_sz);
        for e in g {
            println!(
                "\t\tGID[{:3}]:\t{}, {:?}{}",
                e.index,
                std::net::Ipv6Addr::from(*e.gid.raw()),
                e.gid_type,
                e.netdev
                    .as_deref()
                    .map(|n| format!(" ({n})"))
                    .unwrap_or_default()
            );
        }
        if g.is_empty() && mlx5.is_some() {
            println!("\t\tGIDs:\t\tnone programmed (end the spec with @<ip> to program GID 0)");
        }
    }
    if let Some(m) = &mlx5 {
        print!("{}", m.text);
    }
    Ok(())
}

/// What an mlx5 function reports beyond the verbs attributes.
pub(crate) struct Mlx5Facts {
    pub(crate) json: serde_json::Value,
    pub(crate) text: String,
}

/// The function's firmware, command interface, capabilities that matter to
/// a verbs user, pages and health (`Hca::info`, the current caps).
pub(crate) fn mlx5_facts(p: &std::sync::Arc<rnic::mlx5::Mlx5Provider>) -> Mlx5Facts {
    use std::fmt::Write as _;

    let hca = p.hca();
    let i = hca.info();
    let caps = hca.general_caps().ok();
    let roce = hca.roce_caps();
    let log_max_qp_sz = caps.as_ref().map(|c| c.log_max_qp_sz());
    let log_max_cq_sz = caps.as_ref().map(|c| c.log_max_cq_sz());
    let log_max_ra_res_qp = caps.as_ref().map(|c| c.log_max_ra_res_qp());
    let log_max_ra_req_qp = caps.as_ref().map(|c| c.log_max_ra_req_qp());
    let max_wqe_sz_sq = caps.as_ref().map(|c| c.max_wqe_sz_sq());
    let max_wqe_sz_rq = caps.as_ref().map(|c| c.max_wqe_sz_rq());
    let gid_table_size = caps.as_ref().map(|c| c.gid_table_size());
    let versions = {
        let mut v = Vec::new();
        for (bit, name) in [(0, "v1"), (1, "v1.5"), (2, "v2")] {
            if i.roce_version & (1 << bit) != 0 {
                v.push(name);
            }
        }
        v
    };
    let udp = roce.as_ref().map(|r| {
        (
            r.r_roce_min_src_udp_port(),
            r.r_roce_max_src_udp_port(),
            r.r_roce_dest_udp_port(),
        )
    });
    let health = hca.health().ok();
    let report = hca.health_report();
    let events = hca.event_counters();
    let neighbours = hca.neighbours();
    let json = json!({
        "function": i.function,
        "device_id": format!("0x{:04x}", i.device_id),
        "fw_version": i.fw_version.to_string(),
        "cmdif_rev": i.cmdif_rev,
        "issi": i.issi,
        "cmdq_slots": i.cmdq_slots,
        "cmd_timeout_ms": i.cmd_timeout.as_millis() as u64,
        "vhca_id": i.vhca_id,
        "port_type": i.port_type.to_string(),
        "num_ports": i.num_ports,
        "caps": {
            "log_max_qp": i.log_max_qp,
            "log_max_qp_sz": log_max_qp_sz,
            "log_max_cq": i.log_max_cq,
            "log_max_cq_sz": log_max_cq_sz,
            "log_max_eq": i.log_max_eq,
            "log_max_mkey": i.log_max_mkey,
            "log_max_pd": i.log_max_pd,
            "log_max_msg": i.log_max_msg,
            "log_max_ra_req_qp": log_max_ra_req_qp,
            "log_max_ra_res_qp": log_max_ra_res_qp,
            "max_wqe_sz_sq": max_wqe_sz_sq,
            "max_wqe_sz_rq": max_wqe_sz_rq,
            "max_inline_data": rnic::mlx5::rdma::wqe::MAX_INLINE_DATA_RC,
            "max_inline_data_ud": rnic::mlx5::rdma::wqe::MAX_INLINE_DATA,
            "gid_table_size": gid_table_size,
            "roce": i.roce,
            "roce_versions": versions,
            "sw_roce_src_udp_port": i.sw_roce_src_udp_port,
            "roce_src_udp_ports": udp.map(|(lo, hi, _)| [lo, hi]),
            "roce_dest_udp_port": udp.map(|(_, _, d)| d),
        },
        "uar": i.uar,
        "pd": i.pd,
        "pages": { "boot": i.pages.boot, "init": i.pages.init, "held": i.pages.held },
        "health": health.map(|h| json!({
            "syndrome": h.syndrome.map(|s| format!("{s:?}")),
            "reset_required": h.reset_required,
            "nic_state": h.nic_state.to_string(),
            "fatal": h.fatal().map(|f| format!("{f:?}")),
            "counter": h.counter,
            "warnings": report.warnings,
        })),
        "doorbells": {
            "write_combining": i.doorbells.write_combining,
            "why": i.doorbells.why,
        },
        "neighbours": {
            "host_kernel": hca.host_neighbours(),
            "entries": neighbours.iter().map(|n| json!({
                "ip": n.ip.to_string(),
                "mac": rnic::mlx5::firmware::neigh::mac_text(&n.mac),
                "source": n.source.to_string(),
            })).collect::<Vec<_>>(),
        },
        "port": crate::neigh::port_json(p),
        "commands": {
            "executed": hca.cmdq().executed(),
            "reply_mismatches": hca.cmdq().reply_mismatches(),
            "page_slot": hca.cmdq().page_slot(),
        },
        "page_requests": {
            "requests": events.page_requests,
            "given": events.pages_given,
            "taken": events.pages_taken,
            "cant_give": events.cant_give,
            "errors": events.page_errors,
        },
    });
    let opt = |v: Option<u32>| v.map_or_else(|| "?".to_owned(), |v| v.to_string());
    let mut t = String::new();
    let _ = writeln!(t, "mlx5 function: {}", i.function);
    let _ = writeln!(t, "\tpci_device_id:\t\t0x{:04x}", i.device_id);
    let _ = writeln!(t, "\tfw_version:\t\t{}", i.fw_version);
    let _ = writeln!(
        t,
        "\tcmdif_rev:\t\t{} (ISSI {}, {} command slots, timeout {} ms)",
        i.cmdif_rev,
        i.issi,
        i.cmdq_slots,
        i.cmd_timeout.as_millis()
    );
    let _ = writeln!(
        t,
        "\tport_type:\t\t{} ({} port{}), vhca_id {}",
        i.port_type,
        i.num_ports,
        if i.num_ports == 1 { "" } else { "s" },
        i.vhca_id
    );
    let _ = writeln!(
        t,
        "\tlog_max_qp/cq/eq/mkey/pd:\t{}/{}/{}/{}/{}",
        i.log_max_qp, i.log_max_cq, i.log_max_eq, i.log_max_mkey, i.log_max_pd
    );
    let _ = writeln!(
        t,
        "\tlog_max_qp_sz/cq_sz/msg:\t{}/{}/{}",
        opt(log_max_qp_sz),
        opt(log_max_cq_sz),
        i.log_max_msg
    );
    let _ = writeln!(
        t,
        "\tlog_max_ra_req/res_qp:\t{}/{}",
        opt(log_max_ra_req_qp),
        opt(log_max_ra_res_qp)
    );
    let _ = writeln!(
        t,
        "\tmax_wqe_sz_sq/rq:\t{}/{} bytes, inline up to {} bytes (RC), {} (UD)",
        opt(max_wqe_sz_sq),
        opt(max_wqe_sz_rq),
        rnic::mlx5::rdma::wqe::MAX_INLINE_DATA_RC,
        rnic::mlx5::rdma::wqe::MAX_INLINE_DATA
    );
    let _ = writeln!(
        t,
        "\troce:\t\t\t{} (versions {}), GID table {}, UDP source ports {}{}",
        if i.roce { "enabled" } else { "disabled" },
        if versions.is_empty() {
            "none".to_owned()
        } else {
            versions.join(" ")
        },
        opt(gid_table_size),
        udp.map_or_else(
            || "?".to_owned(),
            |(lo, hi, _)| format!("0x{lo:04x}-0x{hi:04x}")
        ),
        if i.sw_roce_src_udp_port {
            " (driver-chosen)"
        } else {
            ""
        }
    );
    let _ = writeln!(t, "\tuar/pd:\t\t\t{}/{}", i.uar, i.pd);
    let _ = writeln!(
        t,
        "\tpages:\t\t\tboot {} init {} held {}",
        i.pages.boot, i.pages.init, i.pages.held
    );
    let _ = writeln!(t, "\tdoorbells:\t\t{}", i.doorbells);
    let port = p.port();
    let _ = writeln!(
        t,
        "\tneighbours:\t\t{} entries; peers' MACs {}",
        neighbours.len() + port.map_or(0, |p| p.neighbours().len()),
        if port.is_some() {
            "by the port's own ARP/ND (`rnicctl neigh`), after static entries"
        } else if hca.host_neighbours() {
            "from static entries, then the host kernel's neighbour table"
        } else {
            "from static entries only (spec option neigh=arp for the port's ARP/ND, neigh=host for the host kernel's table)"
        }
    );
    if let Some(port) = port {
        let c = port.counters();
        let _ = writeln!(
            t,
            "\tport L2:\t\t{} frames in, {} out; {} answered, {} resolved, {} ignored, {} malformed, {} queue recoveries",
            c.rx_frames,
            c.tx_frames,
            c.neighbours.answered,
            c.neighbours.resolved,
            c.neighbours.ignored.total(),
            c.neighbours.malformed.total(),
            c.recoveries
        );
    }
    let _ = writeln!(
        t,
        "\tcommands:\t\t{} executed, {} reply field(s) the device changed, page slot {}",
        hca.cmdq().executed(),
        hca.cmdq().reply_mismatches(),
        hca.cmdq()
            .page_slot()
            .map_or_else(|| "none".to_owned(), |s| s.to_string())
    );
    let _ = writeln!(
        t,
        "\tpage requests:\t\t{} ({} pages given, {} taken, {} CANT_GIVE, {} failed)",
        events.page_requests,
        events.pages_given,
        events.pages_taken,
        events.cant_give,
        events.page_errors
    );
    match health {
        Some(h) => {
            let state = match (h.fatal(), h.syndrome) {
                (Some(f), _) => format!("FATAL {f:?}"),
                (None, Some(s)) => format!("warning: syndrome {s:?} without reset required"),
                (None, None) => "ok".to_owned(),
            };
            let _ = writeln!(
                t,
                "\thealth:\t\t\t{state} (counter {}, NIC interface {}, {} warning(s) so far)",
                h.counter, h.nic_state, report.warnings
            );
        }
        None => {
            let _ = writeln!(t, "\thealth:\t\t\tunreadable");
        }
    }
    Mlx5Facts { json, text: t }
}
