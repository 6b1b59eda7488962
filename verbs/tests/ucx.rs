//! UCX (Debian's `ucx-utils` 1.13, unmodified) over the drop-in:
//! `ucx_perftest` `tag_lat` and `tag_bw` between two processes with
//! `UCX_TLS=rc_verbs,ud_verbs` (UCX needs an auxiliary transport for wireup;
//! the data lanes are rc_verbs, which the test checks in UCX's own log line)
//! and with `UCX_TLS=ud_verbs`, beside UCX over TCP in the same run; and
//! rc_verbs between two emulated mlx5 functions.
//!
//! What UCX needed from the drop-in (docs/verbs-abi.md, "UCX"): a character
//! device at `/dev/infiniband/<dev_name>` (created here, as `verbs/install.sh
//! --dev-nodes` does), shared receive queues (rc_verbs), the QP's
//! `IBV_EVENT_QP_LAST_WQE_REACHED` when it moves to ERR, 32-bit flow labels
//! masked to 20 bits, UD datagrams up to the port MTU.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::{Pair, port, require, run_pair, verbs_cmd};

/// `/dev/infiniband/<name>`, which UCX stats before it uses the device.
fn dev_node(name: &str) {
    let node = Path::new("/dev/infiniband").join(name);
    if node.exists() {
        return;
    }
    let root = nix::unistd::Uid::effective().is_root();
    assert!(
        root,
        "UCX needs {}: run verbs/install.sh --dev-nodes as root",
        node.display()
    );
    std::fs::create_dir_all("/dev/infiniband").unwrap();
    // Another test binary may race us here; either link is the same.
    let _ = std::os::unix::fs::symlink("/dev/null", &node);
    assert!(node.exists());
}

/// A `ucx_perftest` pair over `tls` running `test` with `extra` options,
/// with `RNIC_DEVICES` of the server and the client (`None`: the default
/// discovery, `rnic_lo`).
fn ucx(
    tls: &str,
    devices: &str,
    test: &str,
    extra: &[&str],
    base: u16,
    rnic_devices: [Option<&str>; 2],
) -> Pair {
    require("ucx_perftest", "ucx-utils");
    if tls.contains("verbs") {
        dev_node(devices.split(':').next().unwrap_or(devices));
    }
    let p = port(base).to_string();
    let cmd = |client: bool| {
        let mut c = verbs_cmd("ucx_perftest");
        c.env("UCX_TLS", tls)
            .env("UCX_NET_DEVICES", devices)
            .env("UCX_LOG_LEVEL", "info")
            .env("RNIC_VERBS_QUIET", "1")
            .args(["-p", &p]);
        if let Some(d) = rnic_devices[usize::from(client)] {
            c.env("RNIC_DEVICES", d);
        }
        if client {
            c.args(["127.0.0.1", "-t", test]).args(extra);
        }
        c
    };
    run_pair(cmd(false), cmd(true), port(base), Duration::from_secs(120))
}

/// The client's `Final:` line: iterations, then the figures.
fn final_line(p: &Pair) -> Vec<f64> {
    let (_, c) = p.stdout();
    let line = c
        .lines()
        .find(|l| l.starts_with("Final:"))
        .unwrap_or_else(|| panic!("no Final line:\n{}", p.all()));
    line.split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect()
}

/// Both sides ran `iters` iterations on `lane`, with positive figures.
fn check(p: &Pair, iters: f64, lane: &str) {
    assert!(p.ok(), "{}", p.all());
    let f = final_line(p);
    assert_eq!(f.first().copied(), Some(iters), "{}", p.all());
    assert!(
        f[1..].iter().all(|v| *v >= 0.0) && f[1..].iter().any(|v| *v > 0.0),
        "{}",
        p.all()
    );
    let all = p.all();
    assert!(all.contains(lane), "UCX did not select {lane}:\n{all}");
}

/// `tag_lat` (1000 iterations, checked on the tag lane `tag(<tl>/<devices>)`)
/// then `tag_bw` (200 × 64 KiB, checked on `<tl>/<devices>`) over `tls`,
/// on ports `base` and `base + 1`.
fn lat_and_bw(tls: &str, tl: &str, devices: &str, base: u16, rnic_devices: [Option<&str>; 2]) {
    let lat = ucx(tls, devices, "tag_lat", &["-n", "1000"], base, rnic_devices);
    check(&lat, 1000.0, &format!("tag({tl}/{devices})"));
    let bw = ucx(
        tls,
        devices,
        "tag_bw",
        &["-n", "200", "-s", "65536"],
        base + 1,
        rnic_devices,
    );
    check(&bw, 200.0, &format!("{tl}/{devices}"));
}

#[test]
fn ucx_perftest_over_rc_verbs() {
    lat_and_bw(
        "rc_verbs,ud_verbs",
        "rc_verbs",
        "rnic_lo:1",
        21_000,
        [None, None],
    );
}

#[test]
fn ucx_perftest_over_ud_verbs() {
    lat_and_bw("ud_verbs", "ud_verbs", "rnic_lo:1", 21_002, [None, None]);
}

/// UCX on two emulated mlx5 functions (rnic-mlx5-emu, one per process):
/// its memory pools and buffers registered in place by rnic-mlx5 (UCX's
/// memory hooks patch `mremap` with a four-argument hook, so rnic-mlx5 moves
/// pages with the raw system call), tag matching over rc_verbs.
#[test]
fn ucx_perftest_over_rc_verbs_on_emulated_mlx5_functions() {
    let (_ea, a) = common::Emulator::start("ucx-a", "127.0.0.36");
    let (_eb, b) = common::Emulator::start("ucx-b", "127.0.0.37");
    let both = [Some(a.as_str()), Some(b.as_str())];
    lat_and_bw("rc_verbs,ud_verbs", "rc_verbs", "rnic_mlx5:1", 21_006, both);
}

#[test]
fn ucx_perftest_over_tcp_in_the_same_run() {
    lat_and_bw("tcp", "tcp", "lo", 21_004, [None, None]);
}
