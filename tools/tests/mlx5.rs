//! rnicctl on mlx5-over-emulator: `info` shows the function's firmware,
//! caps, GIDs and pages; `perf` runs every test between two emulated
//! functions (busy poll and `-e`) and against rnic-rxe.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Output, Stdio};

use rnic_mlx5_emu::TempFunction;

const BIN: &str = env!("CARGO_BIN_EXE_rnicctl");

fn ok(o: &Output) -> String {
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

#[test]
fn info_shows_firmware_caps_gids_and_pages() {
    let e = TempFunction::start().unwrap();
    let spec = e.spec_at("127.0.3.1");
    let j: serde_json::Value = serde_json::from_str(
        ok(&Command::new(BIN)
            .args(["info", &spec, "--json"])
            .output()
            .unwrap())
        .trim(),
    )
    .unwrap();
    assert_eq!(j["backend"], "mlx5");
    assert_eq!(j["fw_ver"], "16.35.2000");
    assert_eq!(j["vendor_id"], 0x15b3);
    assert_eq!(j["ports"][0]["gids"][0]["gid"], "::ffff:127.0.3.1");
    assert_eq!(j["ports"][0]["gids"][0]["type"], "RoceV2");
    let m = &j["mlx5"];
    assert_eq!(m["fw_version"], "16.35.2000");
    assert_eq!(m["device_id"], "0x1017");
    assert_eq!(m["cmdif_rev"], 5);
    assert_eq!(m["issi"], 1);
    assert_eq!(m["port_type"], "Ethernet");
    let c = &m["caps"];
    assert_eq!(c["roce"], true);
    assert!(
        c["roce_versions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v == "v2"),
        "{c}"
    );
    assert_eq!(c["max_inline_data"], 188);
    assert_eq!(c["gid_table_size"], 256);
    assert_eq!(c["log_max_qp_sz"], 15);
    assert_eq!(c["log_max_cq_sz"], 22);
    assert_eq!(
        j["limits"]["max_qp"].as_u64().unwrap(),
        1u64 << c["log_max_qp"].as_u64().unwrap()
    );
    // The emulator's defaults: 16 boot + 32 init pages, all held.
    assert_eq!(m["pages"]["boot"], 16);
    assert_eq!(m["pages"]["init"], 32);
    assert_eq!(m["pages"]["held"], 48);
    assert_eq!(m["health"]["syndrome"], serde_json::Value::Null);

    let text = ok(&Command::new(BIN).args(["info", &spec]).output().unwrap());
    for want in [
        "fw_version:\t\t16.35.2000",
        "cmdif_rev:\t\t5 (ISSI 1,",
        "GID[  0]:\t::ffff:127.0.3.1, RoceV2",
        "roce:\t\t\tenabled (versions v1 v2)",
        "pages:\t\t\tboot 16 init 32 held 48",
        "health:\t\t\tok",
    ] {
        assert!(text.contains(want), "{want:?} missing:\n{text}");
    }
    // `stats <spec>` carries the function's facts too.
    let st: serde_json::Value = serde_json::from_str(
        ok(&Command::new(BIN)
            .args(["stats", &spec, "--json"])
            .output()
            .unwrap())
        .trim(),
    )
    .unwrap();
    assert_eq!(st["mlx5"]["pages"]["held"], 48, "{st}");
    assert_eq!(st["mlx5"]["fw_version"], "16.35.2000");
    // Without @<ip> the table is empty, and info says how to fill it.
    let bare = e.spec();
    let text = ok(&Command::new(BIN).args(["info", &bare]).output().unwrap());
    assert!(
        text.contains("none programmed (end the spec with @<ip>"),
        "{text}"
    );
}

#[test]
fn info_without_an_emulator_says_to_start_one() {
    let o = Command::new(BIN)
        .args(["info", "mlx5:vfio-user:/nonexistent/emu.sock"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("is rnic-mlx5-emu running?"), "{err}");
}

/// A perf server on `server` and a client on `client`; both outputs.
fn perf_pair(
    test: &str,
    server: &str,
    client: &str,
    port: u16,
    extra: &[&str],
) -> (String, String) {
    let p = port.to_string();
    let mut sargs = vec!["perf", test, "-d", server, "-p", &p];
    sargs.extend_from_slice(extra);
    let s = Command::new(BIN)
        .args(&sargs)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut cargs = vec!["perf", test, "-d", client, "-p", &p];
    cargs.extend_from_slice(extra);
    cargs.push("127.0.0.1");
    let c = Command::new(BIN).args(&cargs).output().unwrap();
    let s = s.wait_with_output().unwrap();
    (ok(&c), ok(&s))
}

fn row_after<'a>(out: &'a str, header: &str) -> Vec<&'a str> {
    let mut lines = out.lines();
    lines
        .find(|l| l.contains(header))
        .unwrap_or_else(|| panic!("{header} missing: {out}"));
    lines.next().unwrap().split_whitespace().collect()
}

fn check_bw(out: &str, bytes: &str, iters: &str) {
    let r = row_after(out, "#bytes     #iterations    BW peak[MB/sec]");
    assert_eq!((r[0], r[1]), (bytes, iters), "{out}");
    let (peak, avg): (f64, f64) = (r[2].parse().unwrap(), r[3].parse().unwrap());
    assert!(avg > 0.0 && peak >= avg, "{r:?}");
}

fn check_lat(out: &str, bytes: &str, iters: &str) {
    let r = row_after(out, "t_min[usec]");
    assert_eq!((r[0], r[1]), (bytes, iters), "{out}");
    let v: Vec<f64> = r[2..].iter().map(|x| x.parse().unwrap()).collect();
    assert!(
        v[0] > 0.0 && v[0] <= v[2] && v[2] <= v[5] && v[5] <= v[6] && v[6] <= v[1],
        "{v:?}"
    );
}

#[test]
fn perf_every_test_between_two_emulated_functions() {
    let (a, b) = (
        TempFunction::start().unwrap(),
        TempFunction::start().unwrap(),
    );
    let (sa, sb) = (a.spec_at("127.0.3.11"), b.spec_at("127.0.3.12"));
    let (c, s) = perf_pair("write-bw", &sa, &sb, 19501, &["-s", "4096", "-n", "200"]);
    check_bw(&c, "4096", "200");
    check_bw(&s, "4096", "200");
    let (c, _) = perf_pair(
        "read-bw",
        &sa,
        &sb,
        19502,
        &["-s", "8192", "-n", "100", "-q", "2"],
    );
    check_bw(&c, "8192", "100");
    let (c, s) = perf_pair("send-lat", &sa, &sb, 19503, &["-s", "64", "-n", "100"]);
    check_lat(&c, "64", "100");
    check_lat(&s, "64", "100");
    let (c, _) = perf_pair("write-lat", &sa, &sb, 19504, &["-s", "2", "-n", "100"]);
    check_lat(&c, "2", "100");
    // Event mode: the function's event queue behind CompletionQueue::wait.
    let (c, s) = perf_pair(
        "send-lat",
        &sa,
        &sb,
        19505,
        &["-s", "256", "-n", "50", "-e"],
    );
    check_lat(&c, "256", "50");
    check_lat(&s, "256", "50");
    let (c, _) = perf_pair(
        "write-bw",
        &sa,
        &sb,
        19506,
        &["-s", "1024", "-n", "100", "-e"],
    );
    check_bw(&c, "1024", "100");
}

#[test]
fn perf_between_an_emulated_function_and_rnic_rxe() {
    let a = TempFunction::start().unwrap();
    let sa = a.spec_at("127.0.3.21");
    let (c, s) = perf_pair(
        "write-bw",
        &sa,
        "rxe:127.0.3.22",
        19511,
        &["-s", "4096", "-n", "100"],
    );
    check_bw(&c, "4096", "100");
    check_bw(&s, "4096", "100");
    let (c, _) = perf_pair(
        "read-bw",
        "rxe:127.0.3.22",
        &sa,
        19512,
        &["-s", "4096", "-n", "100"],
    );
    check_bw(&c, "4096", "100");
    let (c, _) = perf_pair(
        "send-lat",
        "rxe:127.0.3.22",
        &sa,
        19513,
        &["-s", "64", "-n", "100"],
    );
    check_lat(&c, "64", "100");
}
