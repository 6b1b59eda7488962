//! `rnicctl emu start/list/stop` as a user runs them: real `rnic-mlx5-emu`
//! processes (the binary next to rnicctl in target/<profile>/, which `cargo
//! test --workspace` builds; alone: `cargo build -p rnic-mlx5-emu` first) in
//! a temporary emulator directory, a real driver bring-up through one of
//! them, stale entries, the SIGKILL fallback, and the missing-binary error.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_rnicctl");

fn emu_binary() -> PathBuf {
    let p = Path::new(BIN).parent().unwrap().join("rnic-mlx5-emu");
    assert!(
        p.exists(),
        "{} is missing: `cargo build -p rnic-mlx5-emu` (cargo test --workspace builds it)",
        p.display()
    );
    p
}

fn rnicctl(dir: &Path, args: &[&str]) -> Output {
    emu_binary();
    Command::new(BIN)
        .arg("emu")
        .arg("--dir")
        .arg(dir)
        .args(args)
        .env_remove("RNIC_MLX5_EMU")
        .env_remove("RNIC_EMU_DIR")
        .output()
        .unwrap()
}

/// Stops every emulator of a directory when dropped: a failed test leaves
/// no detached emulator running.
struct StopAll(PathBuf);

impl Drop for StopAll {
    fn drop(&mut self) {
        let _ = Command::new(BIN)
            .args(["emu", "--dir"])
            .arg(&self.0)
            .args(["stop", "--all", "--timeout", "1"])
            .output();
    }
}

fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "{:?}\nstdout: {}\nstderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn list(dir: &Path) -> Vec<Value> {
    let out = ok(&rnicctl(dir, &["list", "--json"]));
    let v: Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    v.as_array().unwrap().clone()
}

fn entry<'a>(entries: &'a [Value], name: &str) -> &'a Value {
    entries
        .iter()
        .find(|e| e["name"] == name)
        .unwrap_or_else(|| panic!("{name} not listed: {entries:?}"))
}

fn pid_alive(pid: i64) -> bool {
    // Gone, or a zombie nobody reaped yet.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| !s.rsplit_once(')').unwrap().1.trim_start().starts_with('Z'))
}

/// The emulator's state report once it counted `n` drivers.
fn state_after(path: &Path, n: u64) -> Value {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Ok(s) = std::fs::read_to_string(path)
            && let Ok(v) = serde_json::from_str::<Value>(&s)
            && v["connections"].as_u64() >= Some(n)
        {
            return v;
        }
        assert!(Instant::now() < deadline, "{n} drivers not reported");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn help_explains_start_list_and_stop() {
    let o = Command::new(BIN).args(["emu", "--help"]).output().unwrap();
    let s = ok(&o);
    for w in ["start", "list", "stop", "rnic-mlx5-emu", "mlx5:vfio-user"] {
        assert!(s.contains(w), "{w}: {s}");
    }
    let s = ok(&Command::new(BIN)
        .args(["emu", "start", "--help"])
        .output()
        .unwrap());
    for w in [
        "--name",
        "--socket",
        "--dir",
        "--",
        "mlx5:vfio-user:<socket>",
        "PATH",
    ] {
        assert!(s.contains(w), "{w}: {s}");
    }
    let s = ok(&Command::new(BIN)
        .args(["emu", "stop", "--help"])
        .output()
        .unwrap());
    for w in ["--all", "SIGTERM", "SIGKILL", "--timeout"] {
        assert!(s.contains(w), "{w}: {s}");
    }
}

#[test]
fn two_emulators_started_listed_driven_and_stopped() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("emu");
    let _guard = StopAll(dir.clone());
    let out = ok(&rnicctl(
        &dir,
        &["start", "--name", "a", "--", "--boot-delay-ms", "10"],
    ));
    let sock_a = dir.join("a.sock");
    assert!(
        out.contains(&format!("spec: mlx5:vfio-user:{}", sock_a.display())),
        "{out}"
    );
    // The second on a socket elsewhere, with --json.
    let sock_b = tmp.path().join("elsewhere/b.sock");
    let out = ok(&rnicctl(
        &dir,
        &[
            "start",
            "--name",
            "b",
            "--socket",
            sock_b.to_str().unwrap(),
            "--json",
            "--",
            "--boot-delay-ms",
            "10",
            "--init-pages",
            "40",
        ],
    ));
    let rec: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(
        rec["spec"],
        format!("mlx5:vfio-user:{}", sock_b.display()).as_str()
    );
    assert_eq!(rec["args"][3], "40");
    // Both sockets accept (and exist) as soon as start returns.
    assert!(sock_a.exists() && sock_b.exists());

    // The same name twice is refused, naming the fix.
    let o = rnicctl(&dir, &["start", "--name", "a"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("already running") && err.contains("rnicctl emu stop a"),
        "{err}"
    );

    let l = list(&dir);
    assert_eq!(l.len(), 2, "{l:?}");
    for (name, sock) in [("a", &sock_a), ("b", &sock_b)] {
        let e = entry(&l, name);
        assert_eq!(e["status"], "alive");
        assert_eq!(e["socket"], sock.to_str().unwrap());
        assert!(pid_alive(e["pid"].as_i64().unwrap()));
        assert_eq!(e["state"]["running"], true);
        assert_eq!(e["state"]["connections"], 0);
    }
    let text = ok(&rnicctl(&dir, &["list"]));
    assert!(text.contains("NAME") && text.contains("alive"), "{text}");

    // A real driver through b: bring-up (its 40 init pages), a GID, the
    // device attributes, teardown.
    {
        let spec = rec["spec"].as_str().unwrap();
        let provider = rnic::open_mlx5(spec).unwrap();
        assert_eq!(provider.hca().info().pages.init, 40);
        provider.set_gid(0, "127.28.0.1".parse().unwrap()).unwrap();
        let ctx = rnic::mlx5::Mlx5Provider::context(&provider);
        let attr = ctx.query_device().unwrap();
        assert_eq!((attr.vendor_id, attr.vendor_part_id), (0x15b3, 0x1017));
    }
    let st = state_after(Path::new(rec["state_file"].as_str().unwrap()), 1);
    assert_eq!(st["last_driver"]["left"]["clean"], true, "{st}");
    assert_eq!(st["last_driver"]["left"]["pages_held"], 0, "{st}");
    assert_eq!(entry(&list(&dir), "b")["state"]["connections"], 1);
    assert_eq!(entry(&list(&dir), "a")["state"]["connections"], 0);

    let pids: Vec<i64> = l.iter().map(|e| e["pid"].as_i64().unwrap()).collect();
    let out = ok(&rnicctl(&dir, &["stop", "a", "b"]));
    assert!(out.contains("a (pid") && out.contains("stopped"), "{out}");
    for p in pids {
        assert!(!pid_alive(p), "pid {p} still runs");
    }
    assert!(!sock_a.exists() && !sock_b.exists());
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
    assert!(left.is_empty(), "files left: {left:?}");
    assert!(list(&dir).is_empty());
    let o = rnicctl(&dir, &["stop", "a"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("no emulator named a"));
}

#[test]
fn a_killed_emulator_is_listed_stale_once_and_its_name_reusable() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    let _guard = StopAll(dir.clone());
    ok(&rnicctl(&dir, &["start"]));
    let e = entry(&list(&dir), "emu0").clone();
    let pid = e["pid"].as_i64().unwrap();
    Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while pid_alive(pid) {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(dir.join("emu0.sock").exists(), "SIGKILL leaves the socket");
    let text = ok(&rnicctl(&dir, &["list"]));
    assert!(text.contains("stale (removed)"), "{text}");
    assert!(!dir.join("emu0.sock").exists());
    assert!(!dir.join("emu0.json").exists());
    assert!(list(&dir).is_empty());
    // The name is free again; the default name picks it.
    ok(&rnicctl(&dir, &["start"]));
    assert_eq!(entry(&list(&dir), "emu0")["status"], "alive");
    ok(&rnicctl(&dir, &["stop", "--all"]));
    assert!(list(&dir).is_empty());
}

#[test]
fn stop_kills_one_that_outlasts_the_timeout() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    let _guard = StopAll(dir.clone());
    ok(&rnicctl(&dir, &["start", "--name", "busy"]));
    // A connected client keeps the emulator's serving thread for 2 s after
    // SIGTERM; a 1 s timeout runs out first.
    let client = vfio_user_connect(&dir.join("busy.sock"));
    let pid = entry(&list(&dir), "busy")["pid"].as_i64().unwrap();
    let out = ok(&rnicctl(&dir, &["stop", "busy", "--timeout", "1"]));
    assert!(
        out.contains("did not stop within 1 s of SIGTERM: killed with SIGKILL"),
        "{out}"
    );
    assert!(!pid_alive(pid));
    assert!(!dir.join("busy.sock").exists());
    assert!(list(&dir).is_empty());
    drop(client);
}

/// A raw vfio-user connection (UNIX stream: the emulator's accept is all it needs).
fn vfio_user_connect(sock: &Path) -> std::os::unix::net::UnixStream {
    std::os::unix::net::UnixStream::connect(sock).unwrap()
}

#[test]
fn a_missing_emulator_binary_names_the_build_command() {
    let tmp = tempfile::tempdir().unwrap();
    let lone = tmp.path().join("rnicctl");
    std::fs::copy(BIN, &lone).unwrap();
    // Another test thread forking while the copy was open for writing holds
    // it open until its exec: ETXTBSY for a moment.
    let mut tries = 0;
    let o = loop {
        match Command::new(&lone)
            .args(["emu", "--dir"])
            .arg(tmp.path().join("d"))
            .arg("start")
            .env_remove("RNIC_MLX5_EMU")
            .env("PATH", "/nonexistent")
            .output()
        {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && tries < 100 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            r => break r.unwrap(),
        }
    };
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("rnic-mlx5-emu not found") && err.contains("cargo build -p rnic-mlx5-emu"),
        "{err}"
    );
    // Flags rnicctl owns are refused before anything starts.
    let o = rnicctl(
        &tmp.path().join("d"),
        &["start", "--", "--state-file", "/tmp/x"],
    );
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--state-file is set by"));
}

#[test]
fn fault_forwards_one_request_and_prints_the_reply() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    let _guard = StopAll(dir.clone());
    let started: Value =
        serde_json::from_str(ok(&rnicctl(&dir, &["start", "--name", "f", "--json"])).trim())
            .unwrap();
    let ctl = dir.join("f.ctl");
    assert_eq!(
        started["control"].as_str().map(PathBuf::from),
        Some(std::path::absolute(&ctl).unwrap())
    );
    assert!(
        ctl.exists(),
        "the control socket listens once start returns"
    );
    // A request with a leading '-' argument passes through clap untouched.
    let out = ok(&rnicctl(&dir, &["fault", "f", "pages", "-3"]));
    assert_eq!(
        out.trim(),
        "{\"ok\":true,\"request\":\"pages\",\"pages\":-3,\"event\":false}"
    );
    let out = ok(&rnicctl(
        &dir,
        &[
            "fault",
            "f",
            "fail-next",
            "ALLOC_PD",
            "EXCEED_LIM",
            "0x1234",
        ],
    ));
    assert_eq!(
        out.trim(),
        "{\"ok\":true,\"request\":\"fail-next\",\"opcode\":\"0x800\",\"status\":\"0x08\",\"syndrome\":\"0x1234\"}"
    );
    // Issue 26's requests: the port's link, a health warning.
    let out = ok(&rnicctl(&dir, &["fault", "f", "link", "down"]));
    assert_eq!(
        out.trim(),
        "{\"ok\":true,\"request\":\"link\",\"up\":false,\"changed\":true,\"event\":false}"
    );
    let out = ok(&rnicctl(&dir, &["fault", "f", "health-warn", "0x10"]));
    assert!(out.contains("\"rfr\":false"), "{out}");
    let state: Value =
        serde_json::from_str(ok(&rnicctl(&dir, &["fault", "f", "state"])).trim()).unwrap();
    assert_eq!(state["ok"], true);
    assert_eq!(state["state"]["accounting"]["pages_held"], 0);
    assert_eq!(state["state"]["running"], true);
    assert_eq!(
        state["state"]["strictness"]["ud-mtu"], true,
        "every check on by default (issue 26)"
    );
    // A refusal: the reply on stdout, the reason on stderr, exit 1.
    let o = rnicctl(&dir, &["fault", "f", "pages", "8"]);
    assert!(!o.status.success());
    let stdout = String::from_utf8_lossy(&o.stdout);
    let reply: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(reply["ok"], false);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("type +N (give) or -N"), "{stderr}");
    // No such emulator.
    let o = rnicctl(&dir, &["fault", "nope", "state"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("no emulator named nope"));
    // The control socket is only rnicctl's to set.
    let o = rnicctl(
        &dir,
        &["start", "--name", "g", "--", "--control", "/tmp/x.ctl"],
    );
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--control is set by"));
    ok(&rnicctl(&dir, &["stop", "f"]));
    assert!(!ctl.exists(), "stop leaves the control socket");
}
