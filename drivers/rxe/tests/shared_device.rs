//! One rxe device, many processes (`rnic_rxe::share`): processes that open
//! the same address share UDP/4791 through a QPN-steered `SO_REUSEPORT`
//! group. Each test starts worker processes (this test binary again, as
//! `worker_process`, driven over stdin/stdout) on one address and checks the
//! bytes every RDMA WRITE placed, the completion statuses and the counters.
//!
//! Needs CAP_BPF and CAP_SYS_ADMIN (as CI and the dev container run: root);
//! without them the tests check the exclusive fallback instead.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, Ipv4Addr};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{ALL, Side, pattern, rtr};
use rnic_core::{InitParams, Psn, QpType, RecvWr, RtsParams, SendWr, WcOpcode, WcStatus};
use rnic_rxe::{Progress, RxeConfig, RxeDevice, Target};

/// Bytes per RDMA WRITE.
const CHUNK: usize = 16 * 1024;
/// Ring slots in the receiver's buffer (more than receives posted, so a
/// slot is verified before it is written again).
const RING: usize = 8;
/// Receives kept posted.
const RECVS: usize = 4;

/// A fresh address for this test (127.200+.x.y): nothing else binds it.
fn test_ip(n: u8) -> IpAddr {
    let b = 200 + (std::process::id() % 50) as u8;
    IpAddr::V4(Ipv4Addr::new(127, b, n, 1))
}

fn sharing_possible() -> bool {
    let ip = test_ip(250);
    let open = || RxeDevice::open(&RxeConfig::new(Target::Ip(ip)));
    match (open(), open()) {
        (Ok(a), Ok(b)) => a.steered() && b.steered(),
        _ => false,
    }
}

// ---------------------------------------------------------------- worker

/// The worker: open `RNIC_SHARE_IP`, print `INFO qpn rkey addr`, read the
/// partner's, then write `RNIC_SHARE_ITERS` chunks into the partner's ring
/// (RDMA WRITE with immediate = iteration) while checking every chunk the
/// partner writes into ours. Prints `ITER n` every 10, then `DONE …` (or
/// `GONE …` when its partner vanished) and waits for a line on stdin.
#[test]
#[ignore = "run by the tests below as a child process"]
fn worker_process() {
    let Ok(ip) = std::env::var("RNIC_SHARE_IP") else {
        return;
    };
    let ip: IpAddr = ip.parse().unwrap();
    let iters: u32 = std::env::var("RNIC_SHARE_ITERS").unwrap().parse().unwrap();
    let seed: u32 = std::env::var("RNIC_SHARE_SEED").unwrap().parse().unwrap();
    let event = std::env::var("RNIC_SHARE_EVENT").is_ok_and(|v| v == "1");
    let progress = if event {
        Progress::Thread
    } else {
        Progress::Caller
    };
    let dev = RxeDevice::open(&RxeConfig::new(Target::Ip(ip)).with_progress(progress)).unwrap();
    let side = Side::new(dev.clone(), 2 * RING * CHUNK, 256);
    let mut qp = side.qp(QpType::Rc);
    let range = dev.qpn_range();
    assert!(
        range.contains(qp.qpn().get()),
        "QPN outside the device's range"
    );
    println!(
        "INFO {} {} {} {} {}",
        qp.qpn().get(),
        side.mr.rkey().0,
        side.mr.addr(),
        dev.share_slot().map_or(-1, i64::from),
        dev.steered()
    );
    std::io::stdout().flush().unwrap();
    let mut stdin = BufReader::new(std::io::stdin());
    let mut line = String::new();
    stdin.read_line(&mut line).unwrap();
    let w: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().unwrap())
        .collect();
    let (peer_qpn, peer_rkey, peer_addr, peer_seed) = (w[0] as u32, w[1] as u32, w[2], w[3] as u32);

    qp.to_init(&InitParams {
        access: ALL,
        ..InitParams::default()
    })
    .unwrap();
    qp.to_rtr(
        rnic_core::Qpn::from_wire(peer_qpn),
        Psn::from_wire(peer_seed & 0xff_ffff),
        side.gid(),
        &rtr(rnic_core::Mtu::Mtu4096),
    )
    .unwrap();
    qp.to_rts(
        Psn::from_wire(seed & 0xff_ffff),
        // Finite retries (7 would be infinite, as in rxe), ≈ 0.5 s apart:
        // a vanished partner shows as an error within seconds.
        &RtsParams {
            max_rd_atomic: 16,
            timeout: 17,
            retry_cnt: 6,
            ..RtsParams::default()
        },
    )
    .unwrap();

    // Our ring is at [0, RING*CHUNK); the send staging area above it.
    let stage = RING * CHUNK;
    let post_recv = |qp: &mut rnic_core::QueuePair, id: u64| {
        qp.post_recv(&[RecvWr::new(id, &[])]).unwrap();
    };
    for i in 0..RECVS {
        post_recv(&mut qp, i as u64);
    }
    let (mut sent, mut acked, mut checked) = (0u32, 0u32, 0u32);
    let mut in_flight = false;
    let mut wcs = [rnic_core::WorkCompletion::default(); 16];
    let start = Instant::now();
    let mut gone = None;
    while (acked < iters || checked < iters) && gone.is_none() {
        if !in_flight && sent < iters {
            let data = pattern(CHUNK, seed.wrapping_add(sent));
            side.fill(stage, &data);
            let slot = (sent as usize % RING) * CHUNK;
            let sge = [side.mr.sge(stage, CHUNK as u32).unwrap()];
            qp.post_send(&[SendWr::rdma_write_with_imm(
                u64::from(sent),
                &sge,
                peer_addr + slot as u64,
                rnic_core::Rkey(peer_rkey),
                sent,
            )
            .signaled()])
                .unwrap();
            sent += 1;
            in_flight = true;
        }
        let mut n = side.cq.poll(&mut wcs).unwrap();
        if n == 0 && event {
            // The completion channel: arm, re-check, sleep on the event.
            side.cq.req_notify(false).unwrap();
            n = side.cq.poll(&mut wcs).unwrap();
            if n == 0 {
                side.cq.wait(Some(Duration::from_millis(100))).unwrap();
                continue;
            }
        }
        for wc in &wcs[..n] {
            match wc.opcode {
                _ if wc.status != WcStatus::Success => {
                    gone = Some(format!("{:?} {:?}", wc.opcode, wc.status));
                }
                WcOpcode::RdmaWrite => {
                    acked += 1;
                    in_flight = false;
                }
                WcOpcode::RecvRdmaWithImm => {
                    let i = wc.imm_data.unwrap();
                    assert_eq!(i, checked, "writes arrive in order");
                    let slot = (i as usize % RING) * CHUNK;
                    let want = pattern(CHUNK, peer_seed.wrapping_add(i));
                    assert!(side.bytes(slot, CHUNK) == want, "chunk {i}: bytes differ");
                    checked += 1;
                    post_recv(&mut qp, u64::from(i));
                    if checked % 10 == 0 {
                        println!("ITER {checked}");
                        std::io::stdout().flush().unwrap();
                    }
                }
                other => panic!("unexpected completion {other:?}"),
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "stuck: sent {sent} acked {acked} checked {checked}"
        );
    }
    let s = dev.stats();
    let retransmits: u64 = s.qps.iter().map(|(_, q)| q.retransmits).sum();
    println!(
        "{} checked={checked} acked={acked} retransmits={retransmits} foreign={} unknown={} icrc_drops={} why={}",
        if gone.is_some() { "GONE" } else { "DONE" },
        s.device.foreign_qpn,
        s.device.unknown_qpn,
        s.device.icrc_drops,
        gone.unwrap_or_default().replace(' ', "_"),
    );
    std::io::stdout().flush().unwrap();
    // Keep answering ACKs until the parent says both sides are done.
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut l = String::new();
        let _ = stdin.read_line(&mut l);
        let _ = tx.send(());
    });
    while rx.try_recv().is_err() {
        dev.progress();
        std::thread::sleep(Duration::from_millis(1));
    }
    // What arrived while answering (another member's retries), too.
    let s = dev.stats();
    println!(
        "FINAL foreign={} unknown={}",
        s.device.foreign_qpn, s.device.unknown_qpn
    );
    std::io::stdout().flush().unwrap();
}

// ---------------------------------------------------------------- parent

/// A worker process and what it has said.
struct Worker {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
    info: Vec<String>,
}

fn spawn(ip: IpAddr, iters: u32, seed: u32, event: bool) -> Worker {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "worker_process",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
            "-q",
        ])
        .env("RNIC_SHARE_IP", ip.to_string())
        .env("RNIC_SHARE_ITERS", iters.to_string())
        .env("RNIC_SHARE_SEED", seed.to_string())
        .env("RNIC_SHARE_EVENT", if event { "1" } else { "0" })
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdin = child.stdin.take().unwrap();
    let out = child.stdout.take().unwrap();
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    Worker {
        child,
        stdin,
        lines,
        info: Vec::new(),
    }
}

impl Worker {
    /// The next line starting with one of `prefixes` (60 s at most).
    fn expect(&mut self, prefixes: &[&str]) -> String {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let l = self
                .lines
                .recv_timeout(left)
                .unwrap_or_else(|e| panic!("worker said nothing of {prefixes:?}: {e}"));
            if prefixes.iter().any(|p| l.starts_with(p)) {
                return l;
            }
        }
    }

    fn hello(&mut self) {
        let l = self.expect(&["INFO "]);
        self.info = l.split_whitespace().skip(1).map(str::to_owned).collect();
    }

    fn qpn(&self) -> u32 {
        self.info[0].parse().unwrap()
    }

    fn slot(&self) -> i64 {
        self.info[3].parse().unwrap()
    }

    fn steered(&self) -> bool {
        self.info[4] == "true"
    }

    fn say(&mut self, s: &str) {
        writeln!(self.stdin, "{s}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// Tell the worker to exit; its `FINAL …` line (the device's counters
    /// at exit).
    fn finish(mut self) -> String {
        let _ = writeln!(self.stdin, "EXIT");
        let last = self.expect(&["FINAL "]);
        let st = self.child.wait().unwrap();
        assert!(st.success(), "worker failed: {st}");
        last
    }
}

/// `key=value` of a DONE/GONE/FINAL line.
fn field(line: &str, key: &str) -> u64 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key} in {line}"))
        .parse()
        .unwrap()
}

/// Introduce `a` and `b` to each other (seeds `sa`, `sb`).
fn pair(a: &mut Worker, sa: u32, b: &mut Worker, sb: u32) {
    let intro =
        |w: &Worker, seed: u32| format!("PEER {} {} {} {seed}", w.info[0], w.info[1], w.info[2]);
    let (ia, ib) = (intro(a, sa), intro(b, sb));
    a.say(&ib);
    b.say(&ia);
}

/// `n` pairs of workers on one address, all at once; every chunk checked.
fn run_pairs(ip: IpAddr, n: usize, iters: u32, event: bool) {
    let mut ws: Vec<Worker> = (0..2 * n)
        .map(|i| spawn(ip, iters, 1000 * (i as u32 + 1), event))
        .collect();
    for w in &mut ws {
        w.hello();
    }
    let mut slots: Vec<i64> = ws.iter().map(Worker::slot).collect();
    slots.sort_unstable();
    slots.dedup();
    assert_eq!(slots.len(), 2 * n, "every process has its own slot");
    assert!(
        ws.iter().all(Worker::steered),
        "every socket is in the array"
    );
    for i in 0..n {
        let (l, r) = ws.split_at_mut(2 * i + 1);
        pair(
            &mut l[2 * i],
            1000 * (2 * i as u32 + 1),
            &mut r[0],
            1000 * (2 * i as u32 + 2),
        );
    }
    let done: Vec<String> = ws
        .iter_mut()
        .map(|w| w.expect(&["DONE ", "GONE "]))
        .collect();
    for d in &done {
        assert!(d.starts_with("DONE "), "{d}");
        assert_eq!(field(d, "checked"), u64::from(iters), "{d}");
        assert_eq!(field(d, "acked"), u64::from(iters), "{d}");
        assert_eq!(
            field(d, "foreign"),
            0,
            "no other process's packet reached this one: {d}"
        );
        assert_eq!(field(d, "icrc_drops"), 0, "{d}");
    }
    for w in ws {
        let last = w.finish();
        assert_eq!(field(&last, "foreign"), 0, "nor while answering: {last}");
    }
}

#[test]
fn server_and_client_on_one_device_busy_poll() {
    if !sharing_possible() {
        exclusive_fallback(test_ip(7));
        return;
    }
    run_pairs(test_ip(1), 1, 200, false);
}

#[test]
fn server_and_client_on_one_device_event_mode() {
    if !sharing_possible() {
        exclusive_fallback(test_ip(7));
        return;
    }
    run_pairs(test_ip(2), 1, 200, true);
}

#[test]
fn eight_processes_on_one_device_pairwise() {
    if !sharing_possible() {
        exclusive_fallback(test_ip(7));
        return;
    }
    run_pairs(test_ip(3), 4, 100, false);
}

/// Two pairs on one address; one process of the second pair is killed
/// mid-traffic. The first pair finishes without a single failed or missing
/// chunk; the dead process's QPN gets nothing delivered: its partner's
/// retries land as `foreign_qpn` at some live member, and the partner's
/// QP reports the peer gone.
#[test]
fn a_process_killed_mid_traffic_leaves_the_others_whole() {
    if !sharing_possible() {
        exclusive_fallback(test_ip(7));
        return;
    }
    let ip = test_ip(4);
    let iters = 400;
    let mut a1 = spawn(ip, iters, 11, false);
    let mut a2 = spawn(ip, iters, 22, false);
    let mut b1 = spawn(ip, 100_000, 33, false);
    let mut b2 = spawn(ip, 100_000, 44, false);
    for w in [&mut a1, &mut a2, &mut b1, &mut b2] {
        w.hello();
    }
    pair(&mut a1, 11, &mut a2, 22);
    pair(&mut b1, 33, &mut b2, 44);
    // Let both pairs run, then kill b1 while a1/a2 are mid-way.
    b1.expect(&["ITER 50"]);
    let a_mid = a1.expect(&["ITER "]);
    b1.child.kill().unwrap();
    let _ = b1.child.wait();
    let dead_qpn = b1.qpn();
    let da1 = a1.expect(&["DONE ", "GONE "]);
    let da2 = a2.expect(&["DONE ", "GONE "]);
    let db2 = b2.expect(&["DONE ", "GONE "]);
    for d in [&da1, &da2] {
        assert!(d.starts_with("DONE "), "the surviving pair failed: {d}");
        assert_eq!(field(d, "checked"), u64::from(iters), "{d}");
        assert_eq!(field(d, "acked"), u64::from(iters), "{d}");
    }
    assert!(
        field(&da1, "checked") > a_mid[5..].parse::<u64>().unwrap(),
        "the kill happened mid-traffic"
    );
    assert!(
        db2.starts_with("GONE "),
        "b2 should see its peer vanish: {db2}"
    );
    // Counted at exit: b2's retries (one 4-tuple, so one member's socket)
    // can reach a1 or a2 after those printed DONE and went on answering.
    let finals: Vec<String> = [a1, a2, b2].into_iter().map(Worker::finish).collect();
    let foreign: u64 = finals.iter().map(|f| field(f, "foreign")).sum();
    assert!(
        foreign > 0,
        "b2's retries to dead QPN {dead_qpn:#x} were dropped as another's by a live member: {finals:?}"
    );
}

/// Two devices on one address in one process: each its own slot and QPN
/// range, steered, and a connected pair moves bytes between them.
#[test]
fn two_devices_on_one_address_in_one_process() {
    if !sharing_possible() {
        exclusive_fallback(test_ip(7));
        return;
    }
    let ip = test_ip(5);
    let open = || common::open(ip, Progress::Caller);
    let (da, db) = (open(), open());
    assert_ne!(da.share_slot(), db.share_slot());
    assert_ne!(da.qpn_range(), db.qpn_range());
    let (a, b) = (Side::new(da, 4 << 20, 512), Side::new(db, 4 << 20, 512));
    let (mut qa, mut qb) = (a.qp(QpType::Rc), b.qp(QpType::Rc));
    assert!(a.dev.qpn_range().contains(qa.qpn().get()));
    assert!(b.dev.qpn_range().contains(qb.qpn().get()));
    common::connect(&a, &mut qa, &b, &mut qb, rnic_core::Mtu::Mtu4096);
    common::every_rc_op(
        &a,
        &mut qa,
        &b,
        &mut qb,
        &common::sizes(rnic_core::Mtu::Mtu4096),
    );
    let (sa, sb) = (a.dev.stats(), b.dev.stats());
    assert_eq!(sa.device.foreign_qpn + sb.device.foreign_qpn, 0);
    assert!(sa.device.rx_packets > 0 && sb.device.rx_packets > 0);
}

/// The registry shows every live member of an address with its range, and
/// forgets one once it is closed.
#[test]
fn the_registry_lists_live_members() {
    if !sharing_possible() {
        exclusive_fallback(test_ip(7));
        return;
    }
    let ip = test_ip(6);
    let da = common::open(ip, Progress::Caller);
    let db = common::open(ip, Progress::Caller);
    let addr = format!("{ip}:4791");
    let here = |slot: Option<u32>| {
        rnic_rxe::share::members()
            .into_iter()
            .find(|m| Some(m.slot) == slot)
    };
    let ma = here(da.share_slot()).expect("a is listed");
    assert_eq!(ma.pid, std::process::id());
    assert_eq!(ma.range, da.qpn_range());
    assert_eq!(ma.addrs, std::slice::from_ref(&addr));
    assert_eq!(ma.target, format!("rxe:{ip}"));
    let slot_b = db.share_slot();
    assert!(here(slot_b).is_some());
    drop(db);
    assert!(
        here(slot_b).is_none_or(|m| !m.addrs.contains(&addr)),
        "closed: gone"
    );
}

/// Without the privileges (or with `RNIC_RXE_SHARE=0`) a device binds its
/// addresses exclusively: the whole QPN space, and a second open of the
/// same address fails with the port-in-use error naming the fix.
fn exclusive_fallback(ip: IpAddr) {
    let a = RxeDevice::open(&RxeConfig::new(Target::Ip(ip)).with_share(false)).unwrap();
    assert_eq!(a.share_slot(), None);
    assert_eq!(a.qpn_range(), rnic_rxe::QpnRange::ALL);
    let e = RxeDevice::open(&RxeConfig::new(Target::Ip(ip))).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("already in use"), "{msg}");
}

#[test]
fn an_exclusive_device_keeps_sharers_out_and_says_why() {
    exclusive_fallback(test_ip(8));
}
