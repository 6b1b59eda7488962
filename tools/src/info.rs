//! `rnicctl info <spec>`: what `Context::query_device/query_port/query_gid_table` report.

use serde_json::json;

use crate::error::CtlError;

/// `rnicctl info`.
pub fn main(spec: &str, json_out: bool) -> Result<(), CtlError> {
    let (ctx, _dev) = crate::perf::open_device(spec, false)?;
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
    }
    Ok(())
}
