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
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use rnic_core::{
    AccessFlags, CompletionQueue, Context, Gid, HeapMemory, InitParams, Memory, MemoryRegion, Mtu,
    ProtectionDomain, Psn, QpCaps, QpInitAttr, QpType, QueuePair, RtrParams, RtsParams, SendWr,
    WcStatus, WorkCompletion,
};
use rnic_mlx5::{Hca, HcaOptions, Mlx5Provider, PciFunction, VfioUserFunction};

#[path = "common/proc.rs"]
mod proc;
use proc::Proc;

const BIN: &str = env!("CARGO_BIN_EXE_rnic-mlx5-emu");
const CHILD_SOCKET: &str = "RNIC_KEEP_CHILD_SOCKET";
const CHILD_NET: &str = "RNIC_KEEP_CHILD_NET";
const TEST: &str = "a_function_left_initialized_by_a_killed_driver_is_reset_by_the_next_one";
const ALL: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ);
const BUF: usize = 64 << 10;

fn ip(net: u8, host: u8) -> IpAddr {
    // 127.28.N: crash_recovery.rs uses 127.29.
    IpAddr::V4(Ipv4Addr::new(127, 28, net, host))
}

struct Side {
    mr: MemoryRegion,
    cq: CompletionQueue,
    pd: ProtectionDomain,
    mem: Arc<dyn Memory>,
    _ctx: Context,
    gid: Gid,
}

impl Side {
    fn new(ctx: Context, mem: Arc<dyn Memory>, gid: Gid) -> Side {
        let pd = ctx.alloc_pd().unwrap();
        let mr = pd.reg_mr(mem.clone(), ALL).unwrap();
        let cq = ctx.create_cq(64).unwrap();
        Side {
            mr,
            cq,
            pd,
            mem,
            _ctx: ctx,
            gid,
        }
    }

    fn qp(&self) -> QueuePair {
        let caps = QpCaps {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        self.pd
            .create_qp(&self.cq, &self.cq, &QpInitAttr::new(QpType::Rc, caps))
            .unwrap()
    }

    fn wait(&self, n: usize) -> Vec<WorkCompletion> {
        let mut out = Vec::new();
        let mut wcs = [WorkCompletion::default(); 8];
        let start = Instant::now();
        while out.len() < n {
            let got = self.cq.poll(&mut wcs).unwrap();
            out.extend_from_slice(&wcs[..got]);
            assert!(start.elapsed() < Duration::from_secs(10), "{out:?}");
            if got == 0 {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
        out
    }
}

fn mlx5_side(socket: &Path, ip: IpAddr) -> (Side, Arc<Mlx5Provider>, bool) {
    let function: Arc<dyn PciFunction> = Arc::new(VfioUserFunction::connect(socket).unwrap());
    let opts = HcaOptions {
        pre_init_timeout: Duration::from_secs(10),
        cmd_timeout: Some(Duration::from_secs(5)),
        ..HcaOptions::default()
    };
    let hca = Hca::bring_up(function, opts).unwrap();
    let reset_first = hca.info().reset_first;
    let provider = Mlx5Provider::new(hca).unwrap();
    let gid = provider.set_gid(0, ip).unwrap();
    let mem: Arc<dyn Memory> = provider.alloc_dma(BUF).unwrap();
    let side = Side::new(Mlx5Provider::context(&provider), mem, gid);
    (side, provider, reset_first)
}

fn rxe_side(ip: IpAddr) -> (Side, rnic_rxe::RxeDevice) {
    let dev = rnic_rxe::RxeDevice::open(
        &rnic_rxe::RxeConfig::new(rnic_rxe::Target::Ip(ip))
            .with_progress(rnic_rxe::Progress::Thread),
    )
    .unwrap();
    let gid = dev.gids()[0];
    let side = Side::new(dev.context(), Arc::new(HeapMemory::new(BUF)), gid);
    (side, dev)
}

fn connect(a: &Side, qa: &mut QueuePair, b: &Side, qb: &mut QueuePair) {
    let init = InitParams {
        access: ALL,
        ..InitParams::default()
    };
    let rtr = RtrParams {
        path_mtu: Mtu::Mtu1024,
        max_dest_rd_atomic: 4,
        ..RtrParams::default()
    };
    let rts = RtsParams {
        max_rd_atomic: 4,
        ..RtsParams::default()
    };
    let (pa, pb) = (Psn::from_wire(0x300), Psn::from_wire(0x7_0000));
    qa.to_init(&init).unwrap();
    qb.to_init(&init).unwrap();
    qb.to_rtr(qa.qpn(), pa, a.gid, &rtr).unwrap();
    qb.to_rts(pb, &rts).unwrap();
    qa.to_rtr(qb.qpn(), pb, b.gid, &rtr).unwrap();
    qa.to_rts(pa, &rts).unwrap();
}

/// A WRITE of `len` bytes mlx5 → rxe and a READ of them back into another
/// part of the mlx5 buffer, both checked byte for byte.
fn write_and_read(m: &Side, qm: &mut QueuePair, r: &Side, seed: u8) {
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
    let (m, _provider, _) = mlx5_side(socket, ip(net, 1));
    let (r, _rxe) = rxe_side(ip(net, 2));
    let (mut qm, mut qr) = (m.qp(), r.qp());
    connect(&m, &mut qm, &r, &mut qr);
    write_and_read(&m, &mut qm, &r, 1);
    let mut out = std::io::stdout();
    writeln!(out, "ready").unwrap();
    out.flush().unwrap();
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// The value of `"key":` after `from` in the one-line report.
fn field<'a>(json: &'a str, from: &str, key: &str) -> &'a str {
    let at = json
        .find(from)
        .unwrap_or_else(|| panic!("{from} not in {json}"));
    let rest = &json[at..];
    let k = format!("\"{key}\":");
    let v = &rest[rest
        .find(&k)
        .unwrap_or_else(|| panic!("{key} not in {rest}"))
        + k.len()..];
    &v[..v.find([',', '}']).unwrap()]
}

fn num(json: &str, from: &str, key: &str) -> u64 {
    field(json, from, key)
        .parse()
        .unwrap_or_else(|e| panic!("{key}: {e}: {json}"))
}

/// The state report once `connections` reached `n`.
fn state_after(path: &Path, n: u64) -> String {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Ok(s) = std::fs::read_to_string(path)
            && s.contains("\"connections\":")
            && num(&s, "{", "connections") >= n
        {
            return s;
        }
        assert!(Instant::now() < deadline, "no report of {n} connections");
        std::thread::sleep(Duration::from_millis(10));
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
    assert_eq!(num(&kept, now, "pages_held"), 16 + 32, "{kept}");
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
        let (m, provider, reset_first) = mlx5_side(&sock, ip(net, 3));
        assert!(reset_first, "the driver took its function-level-reset path");
        let (r, rxe) = rxe_side(ip(net, 4));
        let (mut qm, mut qr) = (m.qp(), r.qp());
        connect(&m, &mut qm, &r, &mut qr);
        write_and_read(&m, &mut qm, &r, 2);
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
