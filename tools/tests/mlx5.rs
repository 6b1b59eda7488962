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
    assert_eq!(c["max_inline_data"], 236);
    assert_eq!(c["max_inline_data_ud"], 188);
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

/// `rnicctl neigh` on a function whose emulated port is a dgram cable this test holds: the
/// command's port asks for 10.9.0.2 by ARP, the test answers, the entry is listed REACHABLE
/// with the MAC; an address nobody answers fails with exit status 1, naming it.
#[test]
fn neigh_resolves_by_arp_and_lists_the_cache() {
    use std::net::UdpSocket;
    use std::time::{Duration, Instant};

    let cable = UdpSocket::bind("127.0.0.1:0").unwrap();
    cable
        .set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let local = UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let fn_mac = [0x02, 0, 0, 0x5e, 0, 0x11];
    let e = TempFunction::start_with(rnic_mlx5_emu::Options {
        wire: rnic_mlx5_emu::Wire::Dgram {
            local,
            remote: cable.local_addr().unwrap(),
        },
        firmware: rnic_mlx5_emu::FirmwareOptions {
            mac: fn_mac,
            ..Default::default()
        },
        ..Default::default()
    })
    .unwrap();
    cable.connect(local).unwrap();
    let spec = format!("{}?neigh=arp", e.spec_at("10.9.0.1"));
    let child = Command::new(BIN)
        .args(["neigh", &spec, "--resolve", "10.9.0.2", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Answer the first ARP request for 10.9.0.2 from 02:00:00:00:00:22.
    let peer_mac = [0x02, 0, 0, 0, 0, 0x22];
    let start = Instant::now();
    let mut buf = [0u8; 2048];
    let mut answered = false;
    while !answered && start.elapsed() < Duration::from_secs(20) {
        let Ok(n) = cable.recv(&mut buf) else {
            continue;
        };
        let f = &buf[..n];
        // ARP request (op 1) whose target protocol address is 10.9.0.2.
        if n >= 42 && f[12..14] == [8, 6] && f[20..22] == [0, 1] && f[38..42] == [10, 9, 0, 2] {
            assert_eq!(&f[6..12], &fn_mac, "from the function's MAC");
            assert_eq!(&f[28..32], &[10, 9, 0, 1], "from the function's address");
            let mut r = Vec::new();
            r.extend_from_slice(&fn_mac);
            r.extend_from_slice(&peer_mac);
            r.extend_from_slice(&[8, 6, 0, 1, 8, 0, 6, 4, 0, 2]);
            r.extend_from_slice(&peer_mac);
            r.extend_from_slice(&[10, 9, 0, 2]);
            r.extend_from_slice(&fn_mac);
            r.extend_from_slice(&[10, 9, 0, 1]);
            r.resize(60, 0);
            cable.send(&r).unwrap();
            answered = true;
        }
    }
    assert!(answered, "no ARP request for 10.9.0.2 reached the cable");
    let out = child.wait_with_output().unwrap();
    let j: serde_json::Value = serde_json::from_str(ok(&out).trim()).unwrap();
    assert_eq!(j["resolved"][0]["mac"], "02:00:00:00:00:22", "{j}");
    assert_eq!(j["mac"], "02:00:00:5e:00:11");
    let entry = j["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["ip"] == "10.9.0.2")
        .unwrap_or_else(|| panic!("{j}"));
    assert_eq!(
        (entry["mac"].as_str(), entry["state"].as_str()),
        (Some("02:00:00:00:00:22"), Some("REACHABLE"))
    );
    assert!(j["counters"]["learned"].as_u64().unwrap() >= 1, "{j}");
    // The NIC's own view (QUERY_VPORT_COUNTER): the broadcast request out, the reply in.
    assert!(
        j["vport"]["tx_broadcast"]["packets"].as_u64().unwrap() >= 1,
        "{j}"
    );
    assert!(
        j["vport"]["rx_unicast"]["packets"].as_u64().unwrap() >= 1,
        "{j}"
    );

    // Nobody at 10.9.0.99: exit status 1 in bounded time, the address named.
    let start = Instant::now();
    let o = Command::new(BIN)
        .args(["neigh", &spec, "--resolve", "10.9.0.99", "--wait", "1"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("FAILED 10.9.0.99"), "{text}");
    assert!(start.elapsed() < Duration::from_secs(15));
    // An rxe spec has no cache of its own: the message says where it is.
    let o = Command::new(BIN)
        .args(["neigh", "rxe:127.0.0.1"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("ip neigh"));
}
