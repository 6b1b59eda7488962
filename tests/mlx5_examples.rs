//! The examples on mlx5-over-emulator: `rc_pingpong` and `ud_pingpong`
//! (server and client processes, `-c` checks every received buffer; busy poll
//! and `-e`) between two emulated functions and against rnic-rxe, and `loopback` (every RC
//! operation verified byte for byte) mlx5↔mlx5 and mlx5↔rxe.
#![cfg(all(feature = "rxe", feature = "mlx5"))]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use rnic_mlx5_emu::TempFunction;

fn example(name: &str) -> Option<PathBuf> {
    // target/<profile>/deps/<this test> → target/<profile>/examples/<name>
    let exe = std::env::current_exe().ok()?;
    let p = exe.parent()?.parent()?.join("examples").join(name);
    p.exists().then_some(p)
}

fn ok(o: &Output) -> String {
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

/// A pingpong example's server on `server`, client on `client`, 100
/// messages of `size` bytes; checks the four result lines of each (GIDs,
/// bytes moved).
fn pingpong(
    bin: &PathBuf,
    size: u32,
    server: (&str, &str),
    client: (&str, &str),
    port: u16,
    extra: &[&str],
) {
    let (tcp, port, ssize) = (port, port.to_string(), size.to_string());
    let args = |spec: &str| -> Vec<String> {
        let mut v: Vec<String> = [
            "-d", spec, "-g", "0", "-c", "-n", "100", "-s", &ssize, "-p", &port,
        ]
        .iter()
        .map(|x| x.to_string())
        .collect();
        v.extend(extra.iter().map(|x| x.to_string()));
        v
    };
    let mut s = Command::new(bin)
        .args(args(server.0))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The server listens once its device and QP are up; a client started before
    // that is refused (a fixed 300 ms head start was not always enough).
    if !rnic_testkit::wait_listening(&mut s, tcp, Duration::from_secs(60)) {
        let _ = s.kill();
        let o = s.wait_with_output().unwrap();
        panic!(
            "the server never listened on port {tcp}: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let mut ca = args(client.0);
    ca.push("127.0.0.1".to_owned());
    let c = Command::new(bin).args(&ca).output().unwrap();
    if !c.status.success() {
        let _ = s.kill();
    }
    let s = s.wait_with_output().unwrap();
    // Either side failing shows both.
    let text = |o: &Output| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };
    assert!(
        c.status.success() && s.status.success(),
        "client ({}):\n{}\nserver ({}):\n{}",
        c.status,
        text(&c),
        s.status,
        text(&s)
    );
    let (c, s) = (ok(&c), ok(&s));
    for (out, me, peer) in [(&c, client.1, server.1), (&s, server.1, client.1)] {
        let l: Vec<&str> = out.lines().collect();
        assert_eq!(l.len(), 4, "{out}");
        // ibv_ud_pingpong's local line has ": GID", ibv_rc_pingpong's ", GID".
        assert!(l[0].ends_with(&format!(" GID ::ffff:{me}")), "{out}");
        assert!(l[1].ends_with(&format!(", GID ::ffff:{peer}")), "{out}");
        let bytes = u64::from(size) * 200;
        assert!(l[2].starts_with(&format!("{bytes} bytes in ")), "{out}");
        assert!(l[3].starts_with("100 iters in "), "{out}");
    }
}

#[test]
fn rc_pingpong_on_mlx5_checks_every_buffer() {
    let Some(bin) = example("rc_pingpong") else {
        println!("SKIP: build the example first (cargo test builds it)");
        return;
    };
    let (a, b) = (
        TempFunction::start().unwrap(),
        TempFunction::start().unwrap(),
    );
    let (sa, sb) = (a.spec_at("127.0.4.1"), b.spec_at("127.0.4.2"));
    pingpong(
        &bin,
        4096,
        (&sa, "127.0.4.1"),
        (&sb, "127.0.4.2"),
        19601,
        &[],
    );
    pingpong(
        &bin,
        4096,
        (&sa, "127.0.4.1"),
        (&sb, "127.0.4.2"),
        19602,
        &["-e"],
    );
    pingpong(
        &bin,
        4096,
        ("rxe:127.0.4.3", "127.0.4.3"),
        (&sa, "127.0.4.1"),
        19603,
        &[],
    );
    pingpong(
        &bin,
        4096,
        (&sb, "127.0.4.2"),
        ("rxe:127.0.4.3", "127.0.4.3"),
        19604,
        &[],
    );
}

/// UD between two emulated functions and each way against rnic-rxe: the
/// address handle made from the exchanged GID, every datagram checked.
#[test]
fn ud_pingpong_on_mlx5_checks_every_datagram() {
    let Some(bin) = example("ud_pingpong") else {
        println!("SKIP: build the example first (cargo test builds it)");
        return;
    };
    let (a, b) = (
        TempFunction::start().unwrap(),
        TempFunction::start().unwrap(),
    );
    let (sa, sb) = (a.spec_at("127.0.4.21"), b.spec_at("127.0.4.22"));
    let rxe = ("rxe:127.0.4.23", "127.0.4.23");
    let (fa, fb) = ((sa.as_str(), "127.0.4.21"), (sb.as_str(), "127.0.4.22"));
    pingpong(&bin, 1024, fa, fb, 19611, &[]);
    pingpong(&bin, 1024, fa, fb, 19612, &["-e"]);
    pingpong(&bin, 1024, rxe, fa, 19613, &[]);
    pingpong(&bin, 1024, fb, rxe, 19614, &["-e"]);
}

#[test]
fn loopback_on_mlx5_verifies_every_operation() {
    let Some(bin) = example("loopback") else {
        println!("SKIP: build the example first (cargo test builds it)");
        return;
    };
    let (a, b) = (
        TempFunction::start().unwrap(),
        TempFunction::start().unwrap(),
    );
    let (sa, sb) = (a.spec_at("127.0.4.11"), b.spec_at("127.0.4.12"));
    for (x, y) in [
        (sa.as_str(), sb.as_str()),
        (sa.as_str(), "rxe:127.0.4.13"),
        ("rxe:127.0.4.13", sb.as_str()),
    ] {
        let out = ok(&Command::new(&bin)
            .args([
                "--a", x, "--b", y, "--size", "256KiB", "--iters", "4", "--mtu", "1024",
            ])
            .output()
            .unwrap());
        for want in [
            "ok    RDMA WRITE A→B: 262144 bytes identical",
            "ok    RDMA READ  B→A: 262144 bytes identical",
            "ok    SEND+IMM   A→B (imm 0xc0ffee): 4096 bytes identical",
            "ok    FETCH_ADD ×100 then CMP_SWP",
            "all checks passed",
        ] {
            assert!(out.contains(want), "{x} → {y}: {want:?} missing:\n{out}");
        }
    }
}
