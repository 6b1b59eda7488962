//! A driver killed mid-traffic leaves the emulated function ready for the
//! next one, and a driver that tears down leaves nothing behind — across
//! processes, as a user runs them:
//!
//! 1. the `rnic-mlx5-emu` binary serves one socket (`--state-file` reports
//!    what it holds);
//! 2. a child process (this test binary re-executed with
//!    `RNIC_CRASH_CHILD_SOCKET` set) brings the function up with the real
//!    driver (`rnic_mlx5`: `VfioUserFunction`, `Hca::bring_up`, the
//!    `Mlx5Provider` verbs), connects an RC QP to an rnic-rxe peer of its
//!    own and streams RDMA WRITEs, byte-checked (the live report, on
//!    SIGUSR1, shows the function initialized, its objects and packets
//!    sent), until this test SIGKILLs it mid-stream; the state file then shows what the dead driver left behind
//!    (pages, EQ/CQ/QP/MKey, GID, DMA mappings) and that the reset after its
//!    disconnect reclaimed all of it;
//! 3. this process brings the same function up, runs WRITE, READ and SEND
//!    (with immediate) to and from a new rxe peer, byte-exact, tears down in
//!    ownership order and disconnects: the emulator reports that this driver
//!    left zero pages, zero objects and zero DMA mappings;
//! 4. SIGTERM: exit 0, the socket gone, the last report `running: false`.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use rnic_core::{QueuePair, RecvWr, SendWr, WcFlags, WcOpcode, WcStatus};

#[path = "common/ends.rs"]
mod ends;
#[path = "common/proc.rs"]
mod proc;
#[path = "common/report.rs"]
mod report;
use ends::{BUF, Side, connect, mlx5_side, rxe_side};
use proc::Proc;
use report::{field, num, state_after};

const BIN: &str = env!("CARGO_BIN_EXE_rnic-mlx5-emu");
/// Set in the child process: the socket to drive.
const CHILD_SOCKET: &str = "RNIC_CRASH_CHILD_SOCKET";
/// Set in the child process: the /24 (127.29.N.0) its addresses come from.
const CHILD_NET: &str = "RNIC_CRASH_CHILD_NET";
/// This test's name, which the child is run with (`--exact`).
const TEST: &str =
    "a_driver_killed_mid_traffic_leaves_the_function_ready_and_teardown_leaves_nothing";

const CHUNK: usize = 64 << 10;

fn ip(net: u8, host: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 29, net, host))
}

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2_654_435_761) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

/// The child: bring up, connect, stream WRITEs forever (8 in flight per
/// round), printing `posted N` once round N's first WRITEs are posted and
/// `round N` after it was byte-checked, until killed.
fn child(socket: &Path, net: u8) -> ! {
    let (mut m, _provider, _) = mlx5_side(socket, ip(net, 1));
    let (r, _rxe) = rxe_side(ip(net, 2));
    let (mut qm, mut qr) = (m.qp(), r.qp());
    connect(&m, &mut qm, &r, &mut qr);
    let mut out = std::io::stdout();
    for round in 1u32.. {
        let data = pattern(BUF, round);
        m.fill(0, &data);
        let wrs: Vec<_> = (0..BUF / CHUNK)
            .map(|i| {
                let off = i * CHUNK;
                (
                    [m.mr.sge(off, CHUNK as u32).unwrap()],
                    r.mr.addr() + off as u64,
                    i as u64,
                )
            })
            .collect();
        for (i, w) in wrs.chunks(8).enumerate() {
            let batch: Vec<_> = w
                .iter()
                .map(|(sge, at, id)| SendWr::rdma_write(*id, sge, *at, r.mr.rkey()).signaled())
                .collect();
            qm.post_send(&batch).unwrap();
            if i == 0 {
                writeln!(out, "posted {round}").unwrap();
                out.flush().unwrap();
            }
            for wc in m.wait(batch.len()) {
                assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            }
        }
        assert!(r.bytes(0, BUF) == data, "round {round}: bytes differ");
        writeln!(out, "round {round}").unwrap();
        out.flush().unwrap();
    }
    unreachable!("the rounds never end")
}

fn wait_exit(child: &mut Child, what: &str) -> ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{what} did not exit");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Ask the emulator for its live state (SIGUSR1) and read it.
fn live_state(emu: &Child, path: &Path) -> String {
    std::fs::remove_file(path).unwrap();
    kill(
        Pid::from_raw(i32::try_from(emu.id()).unwrap()),
        Signal::SIGUSR1,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Ok(s) = std::fs::read_to_string(path) {
            return s;
        }
        assert!(Instant::now() < deadline, "no report after SIGUSR1");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The counts every clean report has: nothing held.
fn assert_nothing_held(json: &str, from: &str) {
    for key in [
        "pages_held",
        "uars",
        "pds",
        "tds",
        "eqs",
        "cqs",
        "qps",
        "mkeys",
        "gids",
        "dma_mappings",
    ] {
        assert_eq!(num(json, from, key), 0, "{from} {key}: {json}");
    }
    assert_eq!(field(json, from, "clean"), "true", "{json}");
}

#[test]
fn a_driver_killed_mid_traffic_leaves_the_function_ready_and_teardown_leaves_nothing() {
    if let Ok(sock) = std::env::var(CHILD_SOCKET) {
        let net = std::env::var(CHILD_NET).unwrap().parse().unwrap();
        child(Path::new(&sock), net);
    }
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("emu.sock");
    let state = dir.path().join("emu.json");
    // A /24 of this process's own: 127.29.N (other tests use 30 and up).
    let net = (std::process::id() % 250) as u8;
    let mut emu = Proc(
        Command::new(BIN)
            .args(["--socket", sock.to_str().unwrap()])
            .args(["--state-file", state.to_str().unwrap()])
            .args(["--boot-delay-ms", "10"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let first = state_after(&state, 0);
    assert_nothing_held(&first, "\"accounting\"");

    // The first driver: another process, killed while its WRITEs stream.
    let mut driver = Proc(
        Command::new(std::env::current_exe().unwrap())
            .args([TEST, "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_SOCKET, &sock)
            .env(CHILD_NET, net.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    let mut lines = BufReader::new(driver.stdout.take().unwrap()).lines();
    let t0 = Instant::now();
    let mut rounds = 0;
    loop {
        let line = lines
            .next()
            .unwrap_or_else(|| panic!("the driver process ended after {rounds} rounds"))
            .unwrap();
        if let Some(n) = line.strip_prefix("round ") {
            rounds = n.parse().unwrap();
        }
        if line == "round 1" {
            // The live state (SIGUSR1): the function up, traffic flowing.
            let live = live_state(&emu, &state);
            let now = "\"accounting\"";
            assert_eq!(field(&live, now, "phase"), "\"initialized\"", "{live}");
            assert!(num(&live, now, "pages_held") > 0, "{live}");
            for key in ["eqs", "cqs", "qps", "mkeys", "gids"] {
                assert!(num(&live, now, key) >= 1, "{key}: {live}");
            }
            assert!(num(&live, "\"hca\"", "tx_packets") >= 16, "{live}");
            assert_eq!(num(&live, "{", "connections"), 0, "{live}");
        }
        // Three rounds checked, the 4th's first 8 WRITEs posted: kill it now,
        // with 8 WRITEs outstanding and 8 more of the round still to post.
        if line == "posted 4" {
            assert_eq!(rounds, 3);
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(120), "too slow");
    }
    kill(
        Pid::from_raw(i32::try_from(driver.id()).unwrap()),
        Signal::SIGKILL,
    )
    .unwrap();
    let st = wait_exit(&mut driver, "the killed driver");
    assert!(!st.success(), "{st:?}");

    // What it left behind, and the reset that took it back.
    let after_crash = state_after(&state, 1);
    let left = "\"left\"";
    assert_eq!(num(&after_crash, "\"last_driver\"", "connection"), 1);
    assert_eq!(field(&after_crash, left, "phase"), "\"initialized\"");
    assert!(num(&after_crash, left, "pages_held") > 0, "{after_crash}");
    for (key, at_least) in [
        ("uars", 1),
        ("pds", 1),
        ("eqs", 1),
        ("cqs", 1),
        ("qps", 1),
        ("mkeys", 1),
        ("gids", 1),
        ("dma_mappings", 3),
    ] {
        assert!(
            num(&after_crash, left, key) >= at_least,
            "{key}: {after_crash}"
        );
    }
    assert_eq!(field(&after_crash, left, "clean"), "false");
    assert_nothing_held(&after_crash, "\"accounting\"");
    assert!(emu.try_wait().unwrap().is_none(), "the emulator serves on");

    // The next driver: this process, on the same function, with a new peer.
    {
        let (mut m, provider, _) = mlx5_side(&sock, ip(net, 3));
        let (mut r, rxe) = rxe_side(ip(net, 4));
        let (mut qm, mut qr) = (m.qp(), r.qp());
        connect(&m, &mut qm, &r, &mut qr);
        traffic(&mut m, &mut qm, &mut r, &mut qr);
        // Ownership order: QPs, then CQs/MRs/PDs (the Sides), the buffers
        // with them, then the function (Hca teardown: pages back, DISABLE_HCA).
        drop((qm, qr));
        drop(m);
        drop(r);
        drop(rxe);
        drop(Arc::into_inner(provider).expect("no other holder of the provider"));
    }

    let after_clean = state_after(&state, 2);
    assert_eq!(num(&after_clean, "\"last_driver\"", "connection"), 2);
    assert_eq!(field(&after_clean, left, "phase"), "\"disabled\"");
    assert_nothing_held(&after_clean, left);
    assert_nothing_held(&after_clean, "\"accounting\"");

    kill(
        Pid::from_raw(i32::try_from(emu.id()).unwrap()),
        Signal::SIGTERM,
    )
    .unwrap();
    let st = wait_exit(&mut emu, "the emulator");
    assert_eq!(st.code(), Some(0), "{st:?}");
    assert!(!sock.exists(), "the socket is removed on SIGTERM");
    let last = std::fs::read_to_string(&state).unwrap();
    assert_eq!(field(&last, "{", "running"), "false", "{last}");
    assert_nothing_held(&last, "\"accounting\"");
}

/// WRITE and READ (mlx5 → rxe), SEND with immediate both ways, byte-exact
/// with a guard byte after each target.
fn traffic(m: &mut Side, qm: &mut QueuePair, r: &mut Side, qr: &mut QueuePair) {
    const LEN: usize = 200_000;
    let l32 = LEN as u32;
    // WRITE: m[0..] → r[0..].
    let data = pattern(LEN, 7);
    m.fill(0, &data);
    r.fill(0, &vec![0xEE; LEN + 1]);
    let src = [m.mr.sge(0, l32).unwrap()];
    qm.post_send(&[SendWr::rdma_write(1, &src, r.mr.addr(), r.mr.rkey()).signaled()])
        .unwrap();
    let wc = m.wait(1);
    assert_eq!(
        (wc[0].status, wc[0].opcode),
        (WcStatus::Success, WcOpcode::RdmaWrite)
    );
    assert!(r.bytes(0, LEN) == data, "WRITE bytes differ");
    assert_eq!(r.bytes(LEN, 1), [0xEE], "WRITE overran");

    // READ: r[512K..] → m[512K..].
    let data = pattern(LEN, 8);
    r.fill(512 << 10, &data);
    m.fill(512 << 10, &vec![0xEE; LEN + 1]);
    let dst = [m.mr.sge(512 << 10, l32).unwrap()];
    qm.post_send(&[SendWr::rdma_read(2, &dst, r.mr.addr() + (512 << 10), r.mr.rkey()).signaled()])
        .unwrap();
    let wc = m.wait(1);
    assert_eq!(
        (wc[0].status, wc[0].opcode),
        (WcStatus::Success, WcOpcode::RdmaRead)
    );
    assert_eq!(wc[0].byte_len, l32);
    assert!(m.bytes(512 << 10, LEN) == data, "READ bytes differ");
    assert_eq!(m.bytes((512 << 10) + LEN, 1), [0xEE], "READ overran");

    // SEND with immediate, each way, into a posted receive.
    send_imm(m, qm, r, qr, 9);
    send_imm(r, qr, m, qm, 10);
}

/// SEND with immediate from `a` into a receive posted on `b`, byte-exact.
fn send_imm(a: &mut Side, qa: &mut QueuePair, b: &mut Side, qb: &mut QueuePair, seed: u32) {
    {
        let len = 3000usize;
        let data = pattern(len, seed);
        a.fill(0, &data);
        b.fill(256 << 10, &vec![0xEE; len + 1]);
        let rsge = [b.mr.sge(256 << 10, len as u32).unwrap()];
        qb.post_recv(&[RecvWr::new(70 + u64::from(seed), &rsge)])
            .unwrap();
        let sge = [a.mr.sge(0, len as u32).unwrap()];
        qa.post_send(&[SendWr::send_with_imm(3, &sge, 0xC0DE_0000 | seed).signaled()])
            .unwrap();
        assert_eq!(a.wait(1)[0].status, WcStatus::Success);
        let wb = b.wait(1);
        assert_eq!(
            (wb[0].wr_id, wb[0].status, wb[0].opcode, wb[0].byte_len),
            (
                70 + u64::from(seed),
                WcStatus::Success,
                WcOpcode::Recv,
                len as u32
            ),
            "{wb:?}"
        );
        assert_eq!(wb[0].imm_data, Some(0xC0DE_0000 | seed));
        assert!(wb[0].wc_flags.contains(WcFlags::WITH_IMM));
        assert!(b.bytes(256 << 10, len) == data, "SEND bytes differ");
        assert_eq!(b.bytes((256 << 10) + len, 1), [0xEE], "SEND overran");
    }
}
