//! Stock rdma-core tools and perftest (Debian's `ibverbs-utils` and
//! `perftest`, unmodified) on the drop-in, checked by their own output:
//! both sides on one host sharing the `rnic_lo` device (each process its own
//! rnic device in one SO_REUSEPORT group, docs/sharing.md), and against
//! rnic's own `rnicctl perf` and `rc_pingpong` example.
//!
//! Short runs (100 iterations) in the debug build: they prove the verbs the
//! tools use work end to end, not speed (bench/verbs.sh measures that).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use common::{Emulator, Pair, port, require, rnic_bin, run_pair, verbs_cmd};

const LIMIT: Duration = Duration::from_secs(90);

/// A stock tool on the drop-in, with `args`.
fn tool(name: &str, args: &[&str]) -> Command {
    let pkg = if name.starts_with("ib_") {
        "perftest"
    } else {
        "ibverbs-utils"
    };
    require(name, pkg);
    let mut c = verbs_cmd(name);
    c.args(args);
    c
}

/// The result row of a perftest run: the line after the `#bytes` header.
fn result_row(out: &str) -> Vec<f64> {
    let mut lines = out
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("#bytes"));
    lines.next();
    lines
        .next()
        .unwrap_or("")
        .split_whitespace()
        .filter_map(|v| v.parse().ok())
        .collect()
}

/// Both sides of a perftest run (the client only, for the tests whose
/// server is passive: `ib_read_lat`) report `iters` iterations of `bytes`,
/// and a positive figure in the other columns.
fn check_perftest(p: &Pair, bytes: u64, iters: u64) {
    assert!(p.ok(), "{}", p.all());
    let (s, c) = p.stdout();
    let passive_server = s.contains("RDMA_Read Latency Test");
    for out in [&s, &c].into_iter().skip(usize::from(passive_server)) {
        let row = result_row(out);
        assert!(row.len() >= 4, "no result row:\n{}", p.all());
        assert_eq!(row[0] as u64, bytes, "{}", p.all());
        assert_eq!(row[1] as u64, iters, "{}", p.all());
        assert!(row[2..].iter().any(|v| *v > 0.0), "{}", p.all());
    }
}

/// A stock perftest pair on `rnic_lo`.
fn perftest(test: &str, extra: &[&str], base: u16) -> Pair {
    let p = port(base).to_string();
    let mut args = vec!["-d", "rnic_lo", "-n", "100", "-p", p.as_str()];
    args.extend_from_slice(extra);
    let server = tool(test, &args);
    let mut client = tool(test, &args);
    client.arg("127.0.0.1");
    run_pair(server, client, port(base), LIMIT)
}

#[test]
fn devinfo_lists_rnic_devices_with_their_gids() {
    let out = tool("ibv_devinfo", &["-v", "-d", "rnic_lo"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for want in [
        "hca_id:\trnic_lo",
        "transport:\t\t\tInfiniBand (0)",
        "state:\t\t\tPORT_ACTIVE (4)",
        "link_layer:\t\tEthernet",
        "GID[  0]:\t\t::ffff:127.0.0.1, RoCE v2",
        "board_id:\t\t\tRNIC_RXE",
        "atomic_cap:\t\t\tATOMIC_HCA (1)",
    ] {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
    let out = tool("ibv_devices", &[]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["rnic_lo", "0000ffff7f000001"]),
        "{text}"
    );
}

#[test]
fn an_explicit_device_list_names_and_orders_the_devices() {
    let out = verbs_cmd("ibv_devices")
        .env("RNIC_DEVICES", "one=rxe:127.0.0.1, rxe:lo, bad=nope:1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let names: Vec<&str> = text
        .lines()
        .skip(2)
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(names, ["one", "rnic_lo"], "{text}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("\"nope:1\" left out") && err.contains("unknown backend"),
        "{err}"
    );
}

/// Both pingpong sides' result lines for `iters` exchanges of `size`.
fn check_pingpong(p: &Pair, iters: u64, size: u64) {
    assert!(p.ok(), "{}", p.all());
    let (s, c) = p.stdout();
    for out in [&s, &c] {
        assert!(
            out.contains("  remote address: LID 0x0000, QPN 0x"),
            "{}",
            p.all()
        );
        assert!(
            out.contains(&format!("{} bytes in ", 2 * iters * size)),
            "{}",
            p.all()
        );
        assert!(out.contains(&format!("{iters} iters in ")), "{}", p.all());
    }
}

fn pingpong(tool_name: &str, extra: &[&str], base: u16) -> Pair {
    let p = port(base).to_string();
    let mut args = vec!["-d", "rnic_lo", "-g", "0", "-p", p.as_str()];
    if !extra.contains(&"-n") {
        args.extend_from_slice(&["-n", "100"]);
    }
    args.extend_from_slice(extra);
    let mut client = tool(tool_name, &args);
    client.arg("127.0.0.1");
    run_pair(tool(tool_name, &args), client, port(base), LIMIT)
}

#[test]
fn rc_pingpong_busy_polling_checks_the_bytes() {
    check_pingpong(&pingpong("ibv_rc_pingpong", &["-c"], 20_000), 100, 4096);
}

#[test]
fn rc_pingpong_sleeps_on_completion_events() {
    check_pingpong(
        &pingpong("ibv_rc_pingpong", &["-e", "-c"], 20_001),
        100,
        4096,
    );
}

#[test]
fn rc_pingpong_with_the_new_send_api() {
    // -N: ibv_create_qp_ex with send operations, ibv_qp_to_qp_ex,
    // ibv_wr_start / ibv_wr_send / ibv_wr_set_sge / ibv_wr_complete.
    check_pingpong(
        &pingpong("ibv_rc_pingpong", &["-N", "-c", "-s", "1000"], 20_002),
        100,
        1000,
    );
}

#[test]
fn ud_pingpong_checks_the_bytes() {
    check_pingpong(
        &pingpong("ibv_ud_pingpong", &["-c", "-s", "1024"], 20_003),
        100,
        1024,
    );
}

#[test]
fn srq_pingpong_shares_one_receive_queue_among_16_qps() {
    check_pingpong(
        &pingpong("ibv_srq_pingpong", &["-c", "-n", "50"], 20_004),
        50,
        4096,
    );
}

#[test]
fn perftest_write_bw() {
    check_perftest(&perftest("ib_write_bw", &[], 20_010), 65536, 100);
}

#[test]
fn perftest_send_bw_with_events() {
    // -e: completion channel, ibv_req_notify_cq, ibv_get_cq_event.
    check_perftest(
        &perftest("ib_send_bw", &["-e", "-s", "8192"], 20_011),
        8192,
        100,
    );
}

#[test]
fn perftest_read_bw() {
    check_perftest(&perftest("ib_read_bw", &[], 20_012), 65536, 100);
}

#[test]
fn perftest_send_bw() {
    check_perftest(&perftest("ib_send_bw", &[], 20_013), 65536, 100);
}

#[test]
fn perftest_send_bw_ud() {
    check_perftest(
        &perftest("ib_send_bw", &["-c", "UD", "-s", "1024"], 20_014),
        1024,
        100,
    );
}

#[test]
fn perftest_atomic_bw() {
    check_perftest(&perftest("ib_atomic_bw", &[], 20_015), 8, 100);
}

#[test]
fn perftest_write_lat() {
    check_perftest(&perftest("ib_write_lat", &[], 20_016), 2, 100);
}

#[test]
fn perftest_send_lat() {
    check_perftest(&perftest("ib_send_lat", &[], 20_017), 2, 100);
}

#[test]
fn perftest_read_lat() {
    check_perftest(&perftest("ib_read_lat", &[], 20_018), 2, 100);
}

fn rnicctl() -> PathBuf {
    rnic_bin("rnicctl", &["rnicctl"])
}

#[test]
fn stock_write_bw_client_against_rnicctl_perf() {
    let p = port(20_020).to_string();
    let mut server = Command::new(rnicctl());
    server.args([
        "perf",
        "write-bw",
        "-d",
        "rxe:127.0.0.1",
        "-n",
        "100",
        "-p",
        &p,
    ]);
    let client = tool(
        "ib_write_bw",
        &["-d", "rnic_lo", "-n", "100", "-p", &p, "127.0.0.1"],
    );
    check_perftest(&run_pair(server, client, port(20_020), LIMIT), 65536, 100);
}

#[test]
fn rnicctl_perf_send_lat_client_against_a_stock_server() {
    let p = port(20_021).to_string();
    let server = tool("ib_send_lat", &["-d", "rnic_lo", "-n", "100", "-p", &p]);
    let mut client = Command::new(rnicctl());
    client.args([
        "perf",
        "send-lat",
        "-d",
        "rxe:127.0.0.1",
        "-n",
        "100",
        "-p",
        &p,
        "127.0.0.1",
    ]);
    check_perftest(&run_pair(server, client, port(20_021), LIMIT), 2, 100);
}

#[test]
fn stock_rc_pingpong_against_rnics_example() {
    let ex = rnic_bin(
        "examples/rc_pingpong",
        &["rnic", "--example", "rc_pingpong"],
    );
    let p = port(20_022).to_string();
    // rnic's example as the server, the stock tool on the drop-in as client.
    let mut server = Command::new(ex);
    server.args(["-d", "rxe:127.0.0.1", "-g", "0", "-n", "100", "-p", &p]);
    let client = tool(
        "ibv_rc_pingpong",
        &[
            "-d",
            "rnic_lo",
            "-g",
            "0",
            "-n",
            "100",
            "-p",
            &p,
            "127.0.0.1",
        ],
    );
    check_pingpong(&run_pair(server, client, port(20_022), LIMIT), 100, 4096);
}

/// A stock pair on two emulated mlx5 functions wired over UDP on the host
/// (each tool process drives its own function through the drop-in: the
/// server `a`, the client `b`); `args` for both, the client also gets
/// 127.0.0.1 (the TCP exchange).
fn mlx5_pair(tool_name: &str, args: &[&str], a: &str, b: &str, base: u16) -> Pair {
    let p = port(base).to_string();
    let mut all = vec!["-d", "rnic_mlx5", "-p", p.as_str()];
    all.extend_from_slice(args);
    let mut server = tool(tool_name, &all);
    server.env("RNIC_DEVICES", a);
    let mut client = tool(tool_name, &all);
    client.env("RNIC_DEVICES", b).arg("127.0.0.1");
    run_pair(server, client, port(base), LIMIT)
}

#[test]
fn stock_tools_on_emulated_mlx5_functions_list_it_and_run_rc_pingpong() {
    let (_ea, a) = Emulator::start("pp-a", "127.0.0.31");
    let (_eb, b) = Emulator::start("pp-b", "127.0.0.32");
    let out = tool("ibv_devinfo", &["-v", "-d", "rnic_mlx5"])
        .env("RNIC_DEVICES", &a)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for want in [
        "hca_id:\trnic_mlx5",
        "vendor_id:\t\t\t0x15b3",
        "board_id:\t\t\tRNIC_MLX5",
        "GID[  0]:\t\t::ffff:127.0.0.31, RoCE v2",
    ] {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
    // The application's malloc'ed buffer is registered in place (rnic-mlx5
    // maps its pages into each function's IOMMU domain); 100 exchanges of
    // 4 KiB, each side checking its byte counts.
    check_pingpong(
        &mlx5_pair("ibv_rc_pingpong", &["-g", "0", "-n", "100"], &a, &b, 20_030),
        100,
        4096,
    );
    // Sleeping on completion events (ibv_get_cq_event drives the function's
    // event queue).
    check_pingpong(
        &mlx5_pair(
            "ibv_rc_pingpong",
            &["-g", "0", "-n", "100", "-e"],
            &a,
            &b,
            20_034,
        ),
        100,
        4096,
    );
}

#[test]
fn stock_perftest_on_emulated_mlx5_functions() {
    let (_ea, a) = Emulator::start("pt-a", "127.0.0.33");
    let (_eb, b) = Emulator::start("pt-b", "127.0.0.34");
    let n = ["-n", "100"];
    check_perftest(&mlx5_pair("ib_write_bw", &n, &a, &b, 20_031), 65536, 100);
    check_perftest(&mlx5_pair("ib_read_bw", &n, &a, &b, 20_032), 65536, 100);
    // perftest asks ConnectX parts for 236 (send) and 220 (write) inline
    // bytes on latency tests: within rnic-mlx5's RC limit.
    check_perftest(&mlx5_pair("ib_send_lat", &n, &a, &b, 20_033), 2, 100);
    check_perftest(&mlx5_pair("ib_write_lat", &n, &a, &b, 20_035), 2, 100);
}

/// The rest of the stock list on emulated functions: UD, the SRQ shared by
/// 16 QPs (each QP's receive queue sized so the function's CQ can hold them
/// all: crate docs, srq.rs), SEND and atomic bandwidth, READ latency.
#[test]
fn more_stock_tools_on_emulated_mlx5_functions() {
    let (_ea, a) = Emulator::start("mt-a", "127.0.0.35");
    let (_eb, b) = Emulator::start("mt-b", "127.0.0.36");
    check_pingpong(
        &mlx5_pair(
            "ibv_ud_pingpong",
            &["-g", "0", "-n", "100", "-s", "1024"],
            &a,
            &b,
            20_036,
        ),
        100,
        1024,
    );
    check_pingpong(
        &mlx5_pair("ibv_srq_pingpong", &["-g", "0", "-n", "50"], &a, &b, 20_037),
        50,
        4096,
    );
    let n = ["-n", "100"];
    check_perftest(&mlx5_pair("ib_send_bw", &n, &a, &b, 20_038), 65536, 100);
    check_perftest(&mlx5_pair("ib_atomic_bw", &n, &a, &b, 20_039), 8, 100);
    check_perftest(&mlx5_pair("ib_read_lat", &n, &a, &b, 20_040), 2, 100);
}
