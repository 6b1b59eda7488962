//! The `rnic-mlx5-emu` binary: help text, serving a client, socket hygiene,
//! clean stops (SIGTERM, SIGINT, `--once`) and the `--state-file` report.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

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
        "--once",
        "--state-file",
        "SIGTERM",
        "SIGUSR1",
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

#[path = "common/proc.rs"]
mod proc;
#[path = "common/report.rs"]
mod report;
use proc::Proc;
use report::field;

fn start_with(socket: &Path, extra: &[&str]) -> Proc {
    Proc(
        Command::new(BIN)
            .args([
                "--socket",
                socket.to_str().unwrap(),
                "--boot-delay-ms",
                "10",
            ])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    )
}

/// Wait for `child` to exit on its own (panics after 10 s, killing it).
fn exited(child: &mut Child) -> ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the emulator did not exit");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The state file (written just after the socket starts listening: wait
/// for it).
fn read_state(path: &Path) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match std::fs::read_to_string(path) {
            Ok(s) => return s,
            Err(e) if Instant::now() > deadline => panic!("{}: {e}", path.display()),
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

fn signal(child: &Child, sig: Signal) {
    kill(Pid::from_raw(i32::try_from(child.id()).unwrap()), sig).unwrap();
}

#[test]
fn sigterm_and_sigint_stop_it_cleanly_and_remove_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    for sig in [Signal::SIGTERM, Signal::SIGINT] {
        let sock = dir.path().join(format!("{sig}.sock"));
        let mut emu = start_with(&sock, &[]);
        // Serving: a client reads the vendor/device ID, then goes.
        let mut c = connect(&sock);
        let mut id = [0u8; 4];
        c.region_read(7, 0, &mut id).unwrap();
        assert_eq!(u32::from_le_bytes(id), 0x1017_15b3);
        drop(c);
        signal(&emu, sig);
        let st = exited(&mut emu);
        assert_eq!(st.code(), Some(0), "{sig}: {st:?}");
        assert!(!sock.exists(), "{sig} left the socket");
    }
}

#[test]
fn sigterm_with_a_driver_connected_still_exits_and_removes_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("busy.sock");
    let mut emu = start_with(&sock, &[]);
    let c = connect(&sock);
    assert!(c.region(0).is_some());
    let t0 = Instant::now();
    signal(&emu, Signal::SIGTERM);
    let st = exited(&mut emu);
    assert_eq!(st.code(), Some(0), "{st:?}");
    assert!(!sock.exists());
    // It waited for the driver at most 2 s (plus slack), then went anyway.
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    drop(c);
}

#[test]
fn once_exits_when_the_first_driver_disconnects_and_reports_what_it_left() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("once.sock");
    let state = dir.path().join("once.json");
    let mut emu = start_with(&sock, &["--once", "--state-file", state.to_str().unwrap()]);
    let mut c = connect(&sock);
    let first = read_state(&state);
    assert_eq!(field(&first, "{", "running"), "true", "{first}");
    assert_eq!(field(&first, "{", "connections"), "0", "{first}");
    assert!(first.contains("\"last_driver\":null"), "{first}");
    assert_eq!(field(&first, "{", "pid"), emu.id().to_string(), "{first}");
    let mut id = [0u8; 4];
    c.region_read(7, 0, &mut id).unwrap();
    assert_eq!(u32::from_le_bytes(id), 0x1017_15b3);
    drop(c);
    let st = exited(&mut emu);
    assert_eq!(st.code(), Some(0), "{st:?}");
    assert!(!sock.exists(), "--once left the socket");
    let last = read_state(&state);
    assert_eq!(field(&last, "{", "running"), "false", "{last}");
    assert_eq!(field(&last, "{", "connections"), "1", "{last}");
    // A client that never enabled the function left nothing behind.
    assert_eq!(field(&last, "\"left\"", "phase"), "\"disabled\"", "{last}");
    assert_eq!(field(&last, "\"left\"", "pages_held"), "0", "{last}");
    assert_eq!(field(&last, "\"left\"", "clean"), "true", "{last}");
    assert_eq!(field(&last, "\"accounting\"", "clean"), "true", "{last}");
    // Power-on plus the reset after the driver.
    assert_eq!(field(&last, "\"device\"", "resets"), "2", "{last}");
}

#[test]
fn by_default_it_serves_driver_after_driver_and_counts_them_in_the_state_file() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("many.sock");
    let state = dir.path().join("many.json");
    let mut emu = start_with(&sock, &["--state-file", state.to_str().unwrap()]);
    for n in 1..=3 {
        let c = connect(&sock);
        assert!(c.region(0).is_some());
        drop(c);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let s = read_state(&state);
            if field(&s, "{", "connections") == n.to_string() {
                assert_eq!(field(&s, "\"last_driver\"", "connection"), n.to_string());
                assert_eq!(field(&s, "{", "running"), "true");
                break;
            }
            assert!(Instant::now() < deadline, "driver {n} not counted: {s}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    assert!(emu.try_wait().unwrap().is_none(), "still serving");
    // SIGUSR1 rewrites the report and stops nothing.
    std::fs::remove_file(&state).unwrap();
    signal(&emu, Signal::SIGUSR1);
    let s = read_state(&state);
    assert_eq!(field(&s, "{", "running"), "true", "{s}");
    assert_eq!(field(&s, "\"last_driver\"", "connection"), "3", "{s}");
    assert!(emu.try_wait().unwrap().is_none(), "SIGUSR1 stopped it");
    signal(&emu, Signal::SIGTERM);
    assert_eq!(exited(&mut emu).code(), Some(0));
    assert!(!sock.exists());
    let s = read_state(&state);
    assert_eq!(field(&s, "{", "running"), "false", "{s}");
}
