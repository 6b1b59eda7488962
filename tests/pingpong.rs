//! The rc_pingpong and ud_pingpong examples end to end: a server and a client
//! process over loopback with `-c` (every received buffer checked), checking
//! the stock tools' address and result lines.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn example(name: &str) -> Option<PathBuf> {
    // target/<profile>/deps/<this test> → target/<profile>/examples/<name>
    let exe = std::env::current_exe().ok()?;
    let p = exe.parent()?.parent()?.join("examples").join(name);
    p.exists().then_some(p)
}

/// `local_sep`: what precedes "GID" on the local address line (the stock
/// ibv_ud_pingpong prints ':' there, ibv_rc_pingpong ',').
fn check_output(out: &str, local_sep: char, me: &str, peer: &str, iters: u32, size: u32) {
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "{out}");
    assert!(
        lines[0].starts_with("  local address:  LID 0x0000, QPN 0x")
            && lines[0].contains(", PSN 0x")
            && lines[0].ends_with(&format!("{local_sep} GID ::ffff:{me}")),
        "{out}"
    );
    assert!(
        lines[1].starts_with("  remote address: LID 0x0000, QPN 0x")
            && lines[1].ends_with(&format!(", GID ::ffff:{peer}")),
        "{out}"
    );
    let bytes = u64::from(size) * u64::from(iters) * 2;
    assert!(
        lines[2].starts_with(&format!("{bytes} bytes in "))
            && lines[2].contains(" seconds = ")
            && lines[2].ends_with(" Mbit/sec"),
        "{out}"
    );
    assert!(
        lines[3].starts_with(&format!("{iters} iters in ")) && lines[3].ends_with(" usec/iter"),
        "{out}"
    );
}

/// `name` (rc_pingpong or ud_pingpong) with `size`-byte messages.
fn run_pair(name: &str, size: u32, extra: &[&str], port: u16, base: u8) {
    let Some(bin) = example(name) else {
        println!("SKIP: build the example first (cargo test builds it)");
        return;
    };
    let (sip, cip) = (format!("127.9.{base}.1"), format!("127.9.{base}.2"));
    let iters = 200u32;
    let common = |ip: &str| {
        let mut v: Vec<String> = vec![
            "-d".into(),
            format!("rxe:{ip}"),
            "-g".into(),
            "0".into(),
            "-c".into(),
            "-n".into(),
            iters.to_string(),
            "-s".into(),
            size.to_string(),
            "-p".into(),
            port.to_string(),
        ];
        v.extend(extra.iter().map(|s| (*s).to_owned()));
        v
    };
    let server = Command::new(&bin)
        .args(common(&sip))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The client retries until the server listens.
    let start = Instant::now();
    let client = loop {
        let out = Command::new(&bin)
            .args(common(&cip))
            .arg("127.0.0.1")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        if out.status.success() || !err.contains("Couldn't get remote address") {
            break out;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "server never listened: {err}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let server = server.wait_with_output().unwrap();
    let (so, co) = (
        String::from_utf8_lossy(&server.stdout).to_string(),
        String::from_utf8_lossy(&client.stdout).to_string(),
    );
    assert!(
        server.status.success(),
        "server: {so}{}",
        String::from_utf8_lossy(&server.stderr)
    );
    assert!(
        client.status.success(),
        "client: {co}{}",
        String::from_utf8_lossy(&client.stderr)
    );
    let sep = if name == "ud_pingpong" { ':' } else { ',' };
    check_output(&so, sep, &sip, &cip, iters, size);
    check_output(&co, sep, &cip, &sip, iters, size);
}

#[test]
fn rc_pingpong_busy_poll_with_check() {
    run_pair("rc_pingpong", 4096, &[], 18711, 1);
}

#[test]
fn rc_pingpong_events_with_check() {
    run_pair("rc_pingpong", 4096, &["-e", "-m", "4096"], 18712, 2);
}

/// UD: one address handle per side, every datagram's payload, length (GRH
/// included) and source QP checked; 4096 bytes fill loopback's MTU.
#[test]
fn ud_pingpong_busy_poll_with_check() {
    run_pair("ud_pingpong", 4096, &[], 18713, 3);
}

#[test]
fn ud_pingpong_events_with_check() {
    run_pair("ud_pingpong", 1024, &["-e", "-r", "8"], 18714, 4);
}

/// A message over the port's active MTU is refused before any QP exists,
/// naming the limit (the stock tool's check).
#[test]
fn ud_pingpong_refuses_a_message_over_the_mtu() {
    let Some(bin) = example("ud_pingpong") else {
        println!("SKIP: build the example first (cargo test builds it)");
        return;
    };
    let out = Command::new(&bin)
        .args(["-d", "rxe:127.9.5.1", "-s", "4097", "-p", "18715"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("Requested size larger than port MTU (4096): use -s 4096 or less"),
        "{err}"
    );
}
