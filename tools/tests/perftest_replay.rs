//! The perftest exchange at the byte level: a fake of stock perftest 4.5-0.17
//! (`ib_write_bw`) on each side of `rnicctl perf write-bw`.
//!
//! The fakes write and expect the exact bytes the stock tool does, built
//! here from perftest's format strings (independently of rnicctl's code):
//! 16-byte version "6.06", big-endian cycle buffer and cache line, the MTU
//! enum as "%d" in 2 bytes, 108-byte `pingpong_dest` lines (three rounds
//! plus the end-of-test one), the five 8-byte big-endian BW report fields,
//! and "done\0". The fake server has a real in-process rxe QP so rnicctl's
//! client moves real RDMA WRITEs into its buffer.
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::{Ipv6Addr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rnic::core::{
    AccessFlags, Gid, HeapMemory, InitParams, Mtu, Psn, QpCaps, QpInitAttr, QpType, Qpn, RtrParams,
    RtsParams,
};
use rnic::rxe::{Progress, RxeConfig, RxeDevice, Target};

const BIN: &str = env!("CARGO_BIN_EXE_rnicctl");

/// perftest's KEY_PRINT_FMT_GID, written out here.
fn dest_line(qpn: u32, psn: u32, rkey: u32, vaddr: u64, gid: &[u8; 16]) -> [u8; 108] {
    let mut s = format!(
        "{:04x}:{:04x}:{qpn:06x}:{psn:06x}:{rkey:08x}:{vaddr:016x}:",
        0, 16
    );
    for b in gid {
        s.push_str(&format!("{b:02x}:"));
    }
    s.push_str(&format!("{:08x}:", 0));
    let mut out = [0u8; 108];
    out[..s.len()].copy_from_slice(s.as_bytes());
    out
}

/// The fields of a 108-byte line, checking its shape byte by byte.
fn parse_line(b: &[u8; 108]) -> (u32, u32, u32, u64, [u8; 16]) {
    assert_eq!(b[107], 0, "NUL terminator");
    let text = std::str::from_utf8(&b[..107]).unwrap();
    // Separator positions of "%04x:%04x:%06x:%06x:%08x:%016llx:" + 16 x "%02x:" + "%08x:".
    let mut seps = vec![4, 9, 16, 23, 32, 49];
    for i in 0..16 {
        seps.push(52 + 3 * i);
    }
    seps.push(106);
    for (i, c) in text.bytes().enumerate() {
        assert_eq!(c == b':', seps.contains(&i), "byte {i} of {text:?}");
        if c != b':' {
            assert!(c.is_ascii_hexdigit() && !c.is_ascii_uppercase(), "{text:?}");
        }
    }
    let f: Vec<&str> = text.split(':').collect();
    let h = |i: usize| u64::from_str_radix(f[i], 16).unwrap();
    let mut gid = [0u8; 16];
    for (i, g) in gid.iter_mut().enumerate() {
        *g = h(6 + i) as u8;
    }
    (h(2) as u32, h(3) as u32, h(4) as u32, h(5), gid)
}

/// perftest's symmetric exchange, as the client (write, then read).
fn xchg_client(s: &mut TcpStream, mine: &[u8], theirs: &mut [u8]) {
    s.write_all(mine).unwrap();
    s.read_exact(theirs).unwrap();
}

/// As the server (read, then write).
fn xchg_server(s: &mut TcpStream, mine: &[u8], theirs: &mut [u8]) {
    s.read_exact(theirs).unwrap();
    s.write_all(mine).unwrap();
}

fn version_field() -> [u8; 16] {
    let mut v = [0u8; 16];
    v[..4].copy_from_slice(b"6.06");
    v
}

fn connect_retry(port: u16) -> TcpStream {
    let t = Instant::now();
    loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => return s,
            Err(e) if t.elapsed() > Duration::from_secs(30) => panic!("connect: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

fn v4_gid(a: u8, b: u8, c: u8, d: u8) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&[a, b, c, d]);
    g
}

#[test]
fn stock_client_bytes_against_rnicctl_server() {
    let port = 19311;
    let child = Command::new(BIN)
        .args(["perf", "write-bw", "-d", "rxe:127.0.0.3", "-p"])
        .arg(port.to_string())
        .args(["-s", "4096", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut s = connect_retry(port);
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    // exchange_versions
    let mut v = [0u8; 16];
    xchg_client(&mut s, &version_field(), &mut v);
    assert_eq!(
        v,
        version_field(),
        "rnicctl announces perftest 4.5-0.17's version"
    );
    // check_sys_data: cycle buffer and cache line, htonl
    let mut b4 = [0u8; 4];
    xchg_client(&mut s, &4096u32.to_be_bytes(), &mut b4);
    assert_eq!(u32::from_be_bytes(b4), 4096);
    xchg_client(&mut s, &64u32.to_be_bytes(), &mut b4);
    assert_eq!(u32::from_be_bytes(b4), 64);
    // check_mtu: "%d" of IBV_MTU_1024 in 2 bytes; the server offers its own
    let mut m = [0u8; 2];
    xchg_client(&mut s, b"3\0", &mut m);
    assert!(
        m[0].is_ascii_digit() && (b'1'..=b'5').contains(&m[0]) && m[1] == 0,
        "{m:?}"
    );
    // Three rounds of pingpong_dest (before connect, after, and the RTR sync).
    let mine = dest_line(
        0x000abc,
        0x123456,
        0x0000_1234,
        0x5566_0000_1000,
        &v4_gid(127, 0, 0, 9),
    );
    let mut theirs = [0u8; 108];
    for _ in 0..3 {
        xchg_client(&mut s, &mine, &mut theirs);
        let (qpn, psn, _rkey, vaddr, gid) = parse_line(&theirs);
        assert!(qpn > 0 && qpn <= 0xff_ffff && psn <= 0xff_ffff && vaddr != 0);
        assert_eq!(
            gid,
            v4_gid(127, 0, 0, 3),
            "the server's GID index 0 is its IPv4 address"
        );
    }
    // (A stock client would run its WRITEs here.) End-of-test sync:
    xchg_client(&mut s, &mine, &mut theirs);
    // xchg_bw_reports: size, iters (u64, peer >= 5.33), peak, avg, msg rate.
    let fields: [[u8; 8]; 5] = [
        4096u64.to_be_bytes(),
        777u64.to_be_bytes(),
        123.5f64.to_bits().to_be_bytes(),
        100.25f64.to_bits().to_be_bytes(),
        0.0256f64.to_bits().to_be_bytes(),
    ];
    let mut b8 = [0u8; 8];
    for f in &fields {
        xchg_client(&mut s, f, &mut b8);
        assert_eq!(b8, [0u8; 8], "a passive perftest server reports zeros");
    }
    // ctx_close_connection: one more line, then "done\0" each way.
    xchg_client(&mut s, &mine, &mut theirs);
    parse_line(&theirs);
    s.write_all(b"done\0").unwrap();
    let mut d = [0u8; 5];
    s.read_exact(&mut d).unwrap();
    assert_eq!(&d, b"done\0");
    drop(s);
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(j["mtu"], 1024, "negotiated down to the client's 1024");
    assert_eq!(j["peer_version"], "6.06");
    let r = &j["results"][0];
    assert_eq!(r["bytes"], 4096);
    assert_eq!(r["iterations"], 777);
    assert_eq!(r["bw_peak"], 123.5);
    assert_eq!(r["bw_average"], 100.25);
}

#[test]
fn stock_server_bytes_against_rnicctl_client() {
    let port = 19312;
    // The fake server's RDMA side: a real rxe QP on 127.0.0.4, progressed
    // by its own thread while this test blocks on TCP.
    let dev = RxeDevice::open(
        &RxeConfig::new(Target::Ip("127.0.0.4".parse().unwrap())).with_progress(Progress::Thread),
    )
    .unwrap();
    let ctx = dev.context();
    let pd = ctx.alloc_pd().unwrap();
    let mem = Arc::new(HeapMemory::new(2 * 65536));
    let mr = pd
        .reg_mr(
            mem.clone(),
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )
        .unwrap();
    let cq = ctx.create_cq(16).unwrap();
    let mut qp = pd
        .create_qp(&cq, &cq, &QpInitAttr::new(QpType::Rc, QpCaps::default()))
        .unwrap();
    qp.to_init(&InitParams {
        access: AccessFlags::REMOTE_WRITE,
        ..InitParams::default()
    })
    .unwrap();
    let listener = TcpListener::bind(("127.0.0.1", port)).unwrap();
    let child = Command::new(BIN)
        .args(["perf", "write-bw", "-d", "rxe:127.0.0.5", "-p"])
        .arg(port.to_string())
        .args(["-s", "4096", "-n", "20", "--json", "127.0.0.1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (mut s, _) = listener.accept().unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut v = [0u8; 16];
    xchg_server(&mut s, &version_field(), &mut v);
    assert_eq!(v, version_field());
    let mut b4 = [0u8; 4];
    xchg_server(&mut s, &4096u32.to_be_bytes(), &mut b4);
    assert_eq!(b4, 4096u32.to_be_bytes());
    xchg_server(&mut s, &64u32.to_be_bytes(), &mut b4);
    assert_eq!(b4, 64u32.to_be_bytes());
    let mut m = [0u8; 2];
    xchg_server(&mut s, b"3\0", &mut m);
    assert_eq!(m[1], 0);
    let vaddr = mr.addr() + 65536;
    let mine = dest_line(
        qp.qpn().get(),
        0x00beef,
        mr.rkey().get(),
        vaddr,
        &v4_gid(127, 0, 0, 4),
    );
    let mut theirs = [0u8; 108];
    xchg_server(&mut s, &mine, &mut theirs);
    let (rqpn, rpsn, _, _, rgid) = parse_line(&theirs);
    assert_eq!(rgid, v4_gid(127, 0, 0, 5));
    // ctx_connect
    qp.to_rtr(
        Qpn::from_wire(rqpn),
        Psn::from_wire(rpsn),
        Gid::from_ipv6(Ipv6Addr::from(rgid)),
        &RtrParams {
            path_mtu: Mtu::Mtu1024,
            max_dest_rd_atomic: 16,
            hop_limit: 1,
            ..RtrParams::default()
        },
    )
    .unwrap();
    qp.to_rts(Psn::from_wire(0x00beef), &RtsParams::default())
        .unwrap();
    xchg_server(&mut s, &mine, &mut theirs);
    xchg_server(&mut s, &mine, &mut theirs);
    // The client runs its WRITEs now; its end-of-test line follows.
    xchg_server(&mut s, &mine, &mut theirs);
    parse_line(&theirs);
    let mut b8 = [0u8; 8];
    let mut got = Vec::new();
    for _ in 0..5 {
        xchg_server(&mut s, &[0u8; 8], &mut b8);
        got.push(b8);
    }
    assert_eq!(u64::from_be_bytes(got[0]), 4096, "size");
    assert_eq!(u64::from_be_bytes(got[1]), 20, "iterations");
    let peak = f64::from_bits(u64::from_be_bytes(got[2]));
    let avg = f64::from_bits(u64::from_be_bytes(got[3]));
    let rate = f64::from_bits(u64::from_be_bytes(got[4]));
    assert!(
        avg > 0.0 && peak >= avg && rate > 0.0,
        "{peak} {avg} {rate}"
    );
    xchg_server(&mut s, &mine, &mut theirs);
    let mut d = [0u8; 5];
    s.read_exact(&mut d).unwrap();
    assert_eq!(&d, b"done\0");
    s.write_all(b"done\0").unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(j["results"][0]["iterations"], 20);
    // The WRITEs really landed on this side's QP.
    let st = dev.stats();
    let q = st.qp(qp.qpn()).unwrap();
    assert!(q.rx_packets >= 20 * 4, "{q:?}");
}

/// ib_send_bw's shape differs from ib_write_bw's: after the endpoint rounds
/// (per QP, connect, one, per QP) there is one line once the server has
/// posted its receives, then the SENDs, then only the closing line and
/// "done" — no bandwidth reports.
#[test]
fn stock_send_bw_server_bytes_against_rnicctl_client() {
    let port = 19313;
    let dev = RxeDevice::open(
        &RxeConfig::new(Target::Ip("127.0.0.9".parse().unwrap())).with_progress(Progress::Thread),
    )
    .unwrap();
    let ctx = dev.context();
    let pd = ctx.alloc_pd().unwrap();
    let mem = Arc::new(HeapMemory::new(65536));
    let mr = pd.reg_mr(mem.clone(), AccessFlags::LOCAL_WRITE).unwrap();
    let mut cq = ctx.create_cq(64).unwrap();
    let caps = QpCaps {
        max_recv_wr: 32,
        ..QpCaps::default()
    };
    let mut qp = pd
        .create_qp(&cq, &cq, &QpInitAttr::new(QpType::Rc, caps))
        .unwrap();
    qp.to_init(&InitParams::default()).unwrap();
    let listener = TcpListener::bind(("127.0.0.1", port)).unwrap();
    let child = Command::new(BIN)
        .args(["perf", "send-bw", "-d", "rxe:127.0.0.10", "-p"])
        .arg(port.to_string())
        .args(["-s", "1024", "-n", "16", "-t", "4", "--json", "127.0.0.1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (mut s, _) = listener.accept().unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut v = [0u8; 16];
    xchg_server(&mut s, &version_field(), &mut v);
    let mut b4 = [0u8; 4];
    xchg_server(&mut s, &4096u32.to_be_bytes(), &mut b4);
    xchg_server(&mut s, &64u32.to_be_bytes(), &mut b4);
    let mut m = [0u8; 2];
    xchg_server(&mut s, b"3\0", &mut m);
    let mine = dest_line(
        qp.qpn().get(),
        0x000123,
        mr.rkey().get(),
        mr.addr(),
        &v4_gid(127, 0, 0, 9),
    );
    let mut theirs = [0u8; 108];
    xchg_server(&mut s, &mine, &mut theirs);
    let (rqpn, rpsn, _, _, rgid) = parse_line(&theirs);
    qp.to_rtr(
        Qpn::from_wire(rqpn),
        Psn::from_wire(rpsn),
        Gid::from_ipv6(Ipv6Addr::from(rgid)),
        &RtrParams {
            path_mtu: Mtu::Mtu1024,
            hop_limit: 1,
            ..RtrParams::default()
        },
    )
    .unwrap();
    qp.to_rts(Psn::from_wire(0x000123), &RtsParams::default())
        .unwrap();
    xchg_server(&mut s, &mine, &mut theirs);
    xchg_server(&mut s, &mine, &mut theirs);
    // ctx_set_recv_wqes, then the sync that lets the client send.
    for i in 0..16u64 {
        let sge = [mr.sge(0, 1024).unwrap()];
        qp.post_recv(&[rnic::core::RecvWr::new(i, &sge)]).unwrap();
    }
    xchg_server(&mut s, &mine, &mut theirs);
    // run_iter_bw_server: 16 receives.
    let mut wcs = [rnic::core::WorkCompletion::default(); 16];
    let mut got = 0;
    let t0 = Instant::now();
    while got < 16 && t0.elapsed() < Duration::from_secs(30) {
        got += cq.poll(&mut wcs).unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(got, 16, "the client's SENDs arrived");
    // ctx_close_connection: the next bytes are the client's closing line.
    xchg_server(&mut s, &mine, &mut theirs);
    parse_line(&theirs);
    let mut d = [0u8; 5];
    s.read_exact(&mut d).unwrap();
    assert_eq!(&d, b"done\0", "no reports in ib_send_bw");
    s.write_all(b"done\0").unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(j["results"][0]["bytes"], 1024);
    assert_eq!(j["results"][0]["iterations"], 16);
}
