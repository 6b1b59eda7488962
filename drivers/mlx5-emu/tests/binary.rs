//! The `rnic-mlx5-emu` binary: help text, serving a client, socket hygiene.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_rnic-mlx5-emu");

fn start(socket: &Path) -> Child {
    Command::new(BIN)
        .args([
            "--socket",
            socket.to_str().unwrap(),
            "--boot-delay-ms",
            "10",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

fn connect(socket: &Path) -> vfio_user::Client {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match vfio_user::Client::new(socket) {
            Ok(c) => return c,
            Err(e) if Instant::now() > deadline => panic!("emulator not reachable: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

fn stop(mut child: Child) {
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn help_explains_the_options() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for needle in [
        "--socket",
        "--boot-delay-ms",
        "vfio-user",
        "ConnectX-5",
        "stale",
        "--boot-pages",
        "--init-pages",
        "firmware",
    ] {
        assert!(text.contains(needle), "--help lacks {needle}:\n{text}");
    }
}

#[test]
fn serves_a_client_and_guards_its_socket() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("emu.sock");
    let first = start(&sock);
    let mut c = connect(&sock);
    let bar0 = c.region(0).unwrap();
    assert_eq!(bar0.size, 32 << 20);
    assert!(bar0.file_offset.is_some(), "BAR0 fd passed");
    let mut id = [0u8; 4];
    c.region_read(7, 0, &mut id).unwrap();
    assert_eq!(u32::from_le_bytes(id), 0x1017_15b3);
    drop(c);

    // A second emulator on a live socket refuses, saying why.
    let out = Command::new(BIN)
        .args(["--socket", sock.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("in use"), "{err}");

    // Killed, it leaves a stale socket; the next start removes it.
    stop(first);
    assert!(sock.exists(), "SIGKILL leaves the socket file");
    let second = start(&sock);
    let c = connect(&sock);
    assert!(c.region(0).is_some());
    drop(c);
    stop(second);
}

#[test]
fn refuses_to_remove_a_file_that_is_not_a_socket() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("not-a-socket");
    std::fs::write(&path, b"keep me").unwrap();
    let out = Command::new(BIN)
        .args(["--socket", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a socket"));
    assert_eq!(std::fs::read(&path).unwrap(), b"keep me");
}
