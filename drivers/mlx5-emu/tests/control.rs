//! The control socket from another process: the `rnic-mlx5-emu` binary with
//! `--control`, the real driver (`rnic_mlx5::Hca` over vfio-user) in this
//! process, faults injected through the socket and seen by the driver as the
//! typed errors and events they are.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use rnic_mlx5::{Hca, HcaOptions, Mlx5Error, PciFunction, VfioUserFunction};
use rnic_mlx5_prm::{CmdOpcode, CmdStatus, HealthSyndrome};

const BIN: &str = env!("CARGO_BIN_EXE_rnic-mlx5-emu");

fn start(socket: &Path, control: &Path) -> Child {
    start_with(socket, control, &[])
}

fn start_with(socket: &Path, control: &Path, extra: &[&str]) -> Child {
    let child = Command::new(BIN)
        .arg("--socket")
        .arg(socket)
        .arg("--control")
        .arg(control)
        .args(["--boot-delay-ms", "5", "--health-period-ms", "10"])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !(socket.exists() && control.exists()) {
        assert!(Instant::now() < deadline, "the emulator did not start");
        std::thread::sleep(Duration::from_millis(10));
    }
    child
}

/// Kills the emulator if the test fails before its SIGTERM.
struct Reap(Option<Child>);

impl Drop for Reap {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// One control client.
struct Ctl {
    r: BufReader<UnixStream>,
    w: UnixStream,
}

impl Ctl {
    fn connect(path: &Path) -> Ctl {
        let w = UnixStream::connect(path).unwrap();
        w.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        Ctl {
            r: BufReader::new(w.try_clone().unwrap()),
            w,
        }
    }

    fn ask(&mut self, req: &str) -> String {
        self.w.write_all(req.as_bytes()).unwrap();
        self.w.write_all(b"\n").unwrap();
        let mut line = String::new();
        self.r.read_line(&mut line).unwrap();
        assert!(line.ends_with('\n'), "{req:?} → {line:?}");
        line.trim_end().to_owned()
    }

    fn ok(&mut self, req: &str) -> String {
        let reply = self.ask(req);
        assert!(reply.starts_with("{\"ok\":true,"), "{req:?} → {reply}");
        reply
    }
}

/// The first number after `"key":` in `json`.
fn num(json: &str, key: &str) -> u64 {
    let pat = format!("\"{key}\":");
    let at = json.find(&pat).unwrap_or_else(|| panic!("{key} in {json}")) + pat.len();
    json[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .unwrap()
}

fn bring_up(socket: &Path) -> Result<Hca, Mlx5Error> {
    let function: Arc<dyn PciFunction> = Arc::new(VfioUserFunction::connect(socket).unwrap());
    Hca::bring_up(
        function,
        HcaOptions {
            pre_init_timeout: Duration::from_secs(10),
            cmd_timeout: Some(Duration::from_secs(5)),
            ..HcaOptions::default()
        },
    )
}

#[test]
fn faults_injected_through_the_control_socket_reach_the_driver() {
    let dir = tempfile::tempdir().unwrap();
    let (socket, control) = (dir.path().join("emu.sock"), dir.path().join("emu.ctl"));
    let mut reap = Reap(Some(start(&socket, &control)));

    // First client: help, refusals that leave the connection usable, a fault.
    let mut ctl = Ctl::connect(&control);
    let help = ctl.ok("help");
    assert!(help.contains("\"fail-next <OPCODE_NAME|0xNNN> <STATUS_NAME|0xNN> <syndrome>\""));
    let bad = ctl.ask("fail-next ALLOC_PD");
    assert!(
        bad.starts_with("{\"ok\":false,\"error\":\"usage: fail-next"),
        "{bad}"
    );
    let bad = ctl.ask("\u{1}\u{2} nonsense \"quoted\"");
    assert!(
        bad.starts_with("{\"ok\":false,\"error\":\"unknown request"),
        "{bad}"
    );
    ctl.w.write_all(&[0xff, 0xfe, b'\n']).unwrap();
    let mut line = String::new();
    ctl.r.read_line(&mut line).unwrap();
    assert!(line.contains("not UTF-8"), "{line}");
    let reply = ctl.ok("fail-next ALLOC_PD EXCEED_LIM 0x1234");
    assert_eq!(
        reply,
        "{\"ok\":true,\"request\":\"fail-next\",\"opcode\":\"0x800\",\"status\":\"0x08\",\"syndrome\":\"0x1234\"}"
    );
    drop(ctl);

    // The driver's ALLOC_PD fails with exactly that status and syndrome.
    match bring_up(&socket) {
        Err(Mlx5Error::Command {
            opcode: CmdOpcode::AllocPd,
            status: CmdStatus::ExceedLim,
            syndrome: 0x1234,
            ..
        }) => {}
        other => panic!("wanted ALLOC_PD EXCEED_LIM 0x1234, got {other:?}"),
    }

    // A second client, the next driver: `state` shows what it holds.
    let mut ctl = Ctl::connect(&control);
    let mut hca = bring_up(&socket).unwrap();
    hca.enable_events().unwrap();
    let state = ctl.ok("state");
    assert!(state.contains("\"phase\":\"initialized\""), "{state}");
    let held = num(&state, "pages_held");
    assert_eq!(held, 16 + 32, "{state}");
    assert_eq!(held, hca.info().pages.held);
    assert_eq!(num(&state, "pds"), 1, "{state}");
    assert_eq!(num(&state, "uars"), 1, "{state}");
    assert!(num(&state, "eqs") >= 1, "{state}");
    assert!(
        state.contains("\"last_driver\":{\"connection\":1,"),
        "{state}"
    );

    // pages +8: a PAGE_REQUEST the driver serves; the firmware holds 8 more.
    let reply = ctl.ok("pages +8");
    assert_eq!(
        reply,
        "{\"ok\":true,\"request\":\"pages\",\"pages\":8,\"event\":true}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        hca.process_events(Duration::from_millis(100)).unwrap();
        let now = num(&ctl.ok("state"), "pages_held");
        if now == held + 8 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "pages held {now}, wanted {}",
            held + 8
        );
    }
    assert_eq!(hca.info().pages.held, held + 8);

    // health: the driver sees the fatal syndrome.
    assert!(hca.check_health().is_ok());
    assert_eq!(
        ctl.ok("health 0x08"),
        "{\"ok\":true,\"request\":\"health\",\"syndrome\":\"0x08\",\"rfr\":true}"
    );
    match hca.check_health() {
        Err(Mlx5Error::DeviceFatal {
            syndrome: Some(HealthSyndrome::HwFatal),
            ..
        }) => {}
        other => panic!("wanted a fatal HwFatal health, got {other:?}"),
    }
    assert!(hca.is_fatal());
    drop(hca);
    drop(ctl);

    // SIGTERM: exit 0, both sockets gone.
    let mut child = reap.0.take().unwrap();
    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
    assert!(!control.exists(), "the control socket is left");
    assert!(!socket.exists(), "the vfio-user socket is left");
}

#[test]
fn delay_and_error_cqe_hooks_through_the_control_socket() {
    let dir = tempfile::tempdir().unwrap();
    let (socket, control) = (dir.path().join("emu.sock"), dir.path().join("emu.ctl"));
    let mut reap = Reap(Some(start(&socket, &control)));
    let mut ctl = Ctl::connect(&control);
    let help = ctl.ok("help");
    for line in [
        "delay-next [<OPCODE_NAME|0xNNN>] <ms>",
        "error-cqe <qpn|any> <SYNDROME_NAME|0xNN> [vendor_syndrome]",
        "error-cqe-recv <qpn|any> <SYNDROME_NAME|0xNN> [vendor_syndrome]",
    ] {
        assert!(help.contains(&format!("\"{line}\"")), "{line}: {help}");
    }
    // Bad arguments: refused with what to type, the connection stays open.
    for (req, want) in [
        ("delay-next", "usage: delay-next"),
        ("delay-next 0", "type milliseconds, 1..=600000"),
        ("delay-next ALLOC_PD 700000", "1..=600000"),
        ("delay-next NOPE 5", "unknown opcode"),
        ("error-cqe 1", "usage: error-cqe"),
        ("error-cqe 0x1000000 0x13", "24-bit QP number"),
        ("error-cqe any 0", "not an error"),
        ("error-cqe any SUNBURN", "unknown CQE syndrome"),
        ("error-cqe-recv any 0x13 0x100", "vendor syndrome"),
    ] {
        let reply = ctl.ask(req);
        assert!(
            reply.starts_with("{\"ok\":false,\"error\":") && reply.contains(want),
            "{req:?} → {reply}"
        );
    }
    assert_eq!(
        ctl.ok("error-cqe 0x12 REMOTE_ACCESS_ERR 0x88"),
        "{\"ok\":true,\"request\":\"error-cqe\",\"qpn\":\"0x12\",\"syndrome\":\"0x13\",\"vendor_syndrome\":\"0x88\"}"
    );
    assert_eq!(
        ctl.ok("error-cqe-recv any 0x01"),
        "{\"ok\":true,\"request\":\"error-cqe-recv\",\"qpn\":null,\"syndrome\":\"0x01\",\"vendor_syndrome\":\"0x00\"}"
    );
    // `clear` drops the two injections (no QP is about to complete anyway).
    ctl.ok("clear");

    // A delayed ALLOC_PD: the driver's bring-up waits for it, no sooner than the delay.
    assert_eq!(
        ctl.ok("delay-next ALLOC_PD 400"),
        "{\"ok\":true,\"request\":\"delay-next\",\"opcode\":\"0x800\",\"ms\":400}"
    );
    let start = Instant::now();
    let hca = bring_up(&socket).unwrap();
    assert!(
        start.elapsed() >= Duration::from_millis(400),
        "{:?}",
        start.elapsed()
    );
    let state = ctl.ok("state");
    assert_eq!(num(&state, "delayed"), 1, "{state}");
    assert_eq!(num(&state, "late_pending"), 0, "{state}");
    assert_eq!(num(&state, "late_dropped"), 0, "{state}");
    assert_eq!(num(&state, "pds"), 1, "{state}");
    assert_eq!(num(&state, "injected_error_cqes"), 0, "{state}");
    hca.shutdown().unwrap();
    drop(ctl);

    let mut child = reap.0.take().unwrap();
    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    assert!(child.wait().unwrap().success());
}

/// Issue 26 from the command line and the control socket: `--strict --lenient` as the state
/// report lists them, an unknown check refused at start, and the new requests' replies and
/// effects on BAR0 as a driver reads it (NIC interface state, health buffer).
#[test]
fn strictness_flags_and_issue_26_requests() {
    let out = Command::new(BIN)
        .args(["--socket", "/nonexistent/x.sock", "--lenient", "sunburn"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown check \"sunburn\""), "{err}");

    let dir = tempfile::tempdir().unwrap();
    let (socket, control) = (dir.path().join("emu.sock"), dir.path().join("emu.ctl"));
    let mut reap = Reap(Some(start_with(
        &socket,
        &control,
        &[
            "--strict",
            "--lenient",
            "cap-payload,cq-pas",
            "--port-speed",
            "25",
        ],
    )));
    let mut ctl = Ctl::connect(&control);
    let state = ctl.ok("state");
    assert!(
        state.contains(
            "\"strictness\":{\"page-requests\":true,\"blueflame\":true,\"ud-mtu\":true,\"recv-zero-length\":true,\"eq-overrun\":true,\
             \"cap-payload\":false,\"cmdif-rev\":true,\"cq-pas\":false}"
        ),
        "{state}"
    );
    let help = ctl.ok("help");
    for line in [
        "health <SYNDROME|0xNN> [rfr]",
        "health-warn <SYNDROME|0xNN>",
        "nic-state <disabled|sw-reset>",
        "link <up|down>",
        "take-zero <N>",
    ] {
        assert!(help.contains(&format!("\"{line}\"")), "{line}: {help}");
    }
    assert_eq!(
        ctl.ok("link down"),
        "{\"ok\":true,\"request\":\"link\",\"up\":false,\"changed\":true,\"event\":false}"
    );
    assert!(ctl.ok("link down").contains("\"changed\":false"));
    assert_eq!(
        ctl.ok("take-zero 2"),
        "{\"ok\":true,\"request\":\"take-zero\",\"count\":2}"
    );
    assert_eq!(
        ctl.ok("rewrite-reply tokens entry"),
        "{\"ok\":true,\"request\":\"rewrite-reply\",\"tokens\":true,\"blocks\":false,\"entry\":true}"
    );
    assert_eq!(
        ctl.ok("health-warn high_temperature"),
        "{\"ok\":true,\"request\":\"health-warn\",\"syndrome\":\"0x10\",\"rfr\":false}"
    );
    assert_eq!(
        ctl.ok("nic-state sw-reset"),
        "{\"ok\":true,\"request\":\"nic-state\",\"nic_state\":7}"
    );
    // What a driver reads: NIC state 7 in cmdq_addr_l_sz, synd 0x10 without rfr.
    let f = VfioUserFunction::connect(&socket).unwrap();
    let bar = f.bar0();
    let l = bar
        .read32_be(rnic_mlx5_prm::init_seg_offset::CMDQ_ADDR_L_SZ)
        .unwrap();
    assert_eq!((l >> 8) & 7, 7, "{l:#x}");
    let synd = bar.read32_be(0x23c).unwrap();
    assert_eq!(
        synd & 0x00ff_0000,
        0x10 << 16,
        "synd byte at 0x23d: {synd:#x}"
    );
    assert_eq!(bar.read32_be(0x238).unwrap() >> 31, 0, "rfr clear");
    drop(f);
    drop(ctl);
    let mut child = reap.0.take().unwrap();
    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    assert!(child.wait().unwrap().success());
}
