//! `rnic-mlx5-emu --keep-state-on-disconnect`: a function whose driver died
//! without a reset stays initialized, as a real one does, and the next driver
//! must take its function-level-reset path — across processes:
//!
//! 1. the binary serves one socket with `--keep-state-on-disconnect` and a
//!    `--state-file`;
//! 2. a child process (this test binary re-executed with
//!    `RNIC_KEEP_CHILD_SOCKET` set) brings the function up with the real
//!    driver, connects an RC QP to an rnic-rxe peer of its own, checks a
//!    WRITE byte for byte, says `ready` and waits; this test SIGKILLs it;
//! 3. the state file: the function still initialized with its pages, EQ, CQ,
//!    QP, MKey and GID, no DMA mapping left (the dead process's), no reset;
//! 4. this process brings the function up: the driver sees it initialized and
//!    resets it first (`HcaInfo::reset_first`, the emulator's `resets` + 1),
//!    then runs WRITE and READ to a new rxe peer byte-exact and tears down;
//!    the function is left disabled and holding nothing.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use rnic_core::{QueuePair, SendWr, WcStatus};

#[path = "common/ends.rs"]
mod ends;
#[path = "common/proc.rs"]
mod proc;
#[path = "common/report.rs"]
mod report;
use ends::{Side, connect, mlx5_side, rxe_side};
use proc::Proc;
use report::{field, num, state_after};

const BIN: &str = env!("CARGO_BIN_EXE_rnic-mlx5-emu");
const CHILD_SOCKET: &str = "RNIC_KEEP_CHILD_SOCKET";
const CHILD_NET: &str = "RNIC_KEEP_CHILD_NET";
const TEST: &str = "a_function_left_initialized_by_a_killed_driver_is_reset_by_the_next_one";
fn ip(net: u8, host: u8) -> IpAddr {
    // 127.28.N: crash_recovery.rs uses 127.29.
    IpAddr::V4(Ipv4Addr::new(127, 28, net, host))
}

/// A WRITE of `len` bytes mlx5 → rxe and a READ of them back into another
/// part of the mlx5 buffer, both checked byte for byte.
fn write_and_read(m: &mut Side, qm: &mut QueuePair, r: &Side, seed: u8) {
    let len = 3000usize;
    let data: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(7) ^ seed).collect();
    m.mem.write(0, &data).unwrap();
    let sge = [m.mr.sge(0, len as u32).unwrap()];
    qm.post_send(&[SendWr::rdma_write(1, &sge, r.mr.addr(), r.mr.rkey()).signaled()])
        .unwrap();
    assert_eq!(m.wait(1)[0].status, WcStatus::Success);
    let mut got = vec![0u8; len];
    r.mem.read(0, &mut got).unwrap();
    assert!(got == data, "WRITE bytes differ");
    let back = [m.mr.sge(8192, len as u32).unwrap()];
    qm.post_send(&[SendWr::rdma_read(2, &back, r.mr.addr(), r.mr.rkey()).signaled()])
        .unwrap();
    let wc = m.wait(1)[0];
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (2, WcStatus::Success, len as u32)
    );
    m.mem.read(8192, &mut got).unwrap();
    assert!(got == data, "READ bytes differ");
}

fn child(socket: &Path, net: u8) -> ! {
    let (mut m, _provider, _) = mlx5_side(socket, ip(net, 1));
    let (r, _rxe) = rxe_side(ip(net, 2));
    let (mut qm, mut qr) = (m.qp(), r.qp());
    connect(&m, &mut qm, &r, &mut qr);
    write_and_read(&mut m, &mut qm, &r, 1);
    let mut out = std::io::stdout();
    writeln!(out, "ready").unwrap();
    out.flush().unwrap();
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

#[test]
fn a_function_left_initialized_by_a_killed_driver_is_reset_by_the_next_one() {
    if let Ok(sock) = std::env::var(CHILD_SOCKET) {
        let net = std::env::var(CHILD_NET).unwrap().parse().unwrap();
        child(Path::new(&sock), net);
    }
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("emu.sock");
    let state = dir.path().join("emu.json");
    let net = (std::process::id() % 250) as u8;
    let mut emu = Proc(
        Command::new(BIN)
            .args(["--socket", sock.to_str().unwrap()])
            .args(["--state-file", state.to_str().unwrap()])
            .args(["--boot-delay-ms", "10", "--keep-state-on-disconnect"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let first = state_after(&state, 0);
    let resets = num(&first, "\"device\"", "resets");

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
    loop {
        let line = lines
            .next()
            .expect("the driver process ended before it was ready")
            .unwrap();
        // The harness's `test … ... ` heading precedes the first line.
        if line.ends_with("ready") {
            break;
        }
    }
    kill(
        Pid::from_raw(i32::try_from(driver.id()).unwrap()),
        Signal::SIGKILL,
    )
    .unwrap();
    let st = driver.wait().unwrap();
    assert!(!st.success(), "{st:?}");

    // Kept: still initialized with what the dead driver made; its mappings gone; no reset.
    let kept = state_after(&state, 1);
    let now = "\"accounting\"";
    assert_eq!(field(&kept, now, "phase"), "\"initialized\"", "{kept}");
    // Boot and init pages, and the page per CQ, QP and MKey the dead driver
    // gave when the firmware asked (the strict firmware charges each:
    // issue 26, audit row 1).
    let charged: u64 = ["cqs", "qps", "mkeys"]
        .iter()
        .map(|k| num(&kept, now, k))
        .sum();
    assert_eq!(num(&kept, now, "pages_held"), 16 + 32 + charged, "{kept}");
    for key in ["uars", "pds", "eqs", "cqs", "qps", "mkeys", "gids"] {
        assert!(num(&kept, now, key) >= 1, "{key}: {kept}");
    }
    assert_eq!(num(&kept, now, "dma_mappings"), 0, "{kept}");
    assert_eq!(field(&kept, now, "clean"), "false", "{kept}");
    assert_eq!(
        num(&kept, "\"device\"", "resets"),
        resets,
        "no reset: {kept}"
    );

    // The next driver: it finds the function initialized and resets it first.
    {
        let (mut m, provider, reset_first) = mlx5_side(&sock, ip(net, 3));
        assert!(reset_first, "the driver took its function-level-reset path");
        let (r, rxe) = rxe_side(ip(net, 4));
        let (mut qm, mut qr) = (m.qp(), r.qp());
        connect(&m, &mut qm, &r, &mut qr);
        write_and_read(&mut m, &mut qm, &r, 2);
        drop((qm, qr));
        drop(m);
        drop(r);
        drop(rxe);
        drop(Arc::into_inner(provider).expect("no other holder of the provider"));
    }
    let after = state_after(&state, 2);
    // One FLR by the driver, and the default reset after its disconnect is not made.
    assert_eq!(
        num(&after, "\"device\"", "resets"),
        resets + 1,
        "one FLR: {after}"
    );
    assert_eq!(
        field(&after, "\"left\"", "phase"),
        "\"disabled\"",
        "{after}"
    );
    assert_eq!(field(&after, "\"left\"", "clean"), "true", "{after}");
    assert_eq!(field(&after, now, "clean"), "true", "{after}");

    kill(
        Pid::from_raw(i32::try_from(emu.id()).unwrap()),
        Signal::SIGTERM,
    )
    .unwrap();
    let st = emu.wait().unwrap();
    assert_eq!(st.code(), Some(0), "{st:?}");
}
