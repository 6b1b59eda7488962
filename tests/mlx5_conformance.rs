//! The RC conformance suite of rnic-rxe's loopback tests
//! (`rnic_testkit::every_rc_op`, the very function the rxe suite runs) on the mlx5 driver over the
//! emulated ConnectX (rnic-mlx5-emu, in this process, one vfio-user socket
//! per function), through the facade (`rnic::open_mlx5` with
//! `mlx5:vfio-user:<socket>`, the `dyn` context `rnic::open` returns):
//!
//! * both ends mlx5 (two emulated functions, each given a 127.x address by
//!   SET_ROCE_ADDRESS), at every path MTU, 256 … 4096 (the emulated vport
//!   MTU is 9000; path MTU + 96 bytes of headers must fit);
//! * one end mlx5, the other rnic-rxe, in both directions (256/512, 1024 and
//!   4096).
//!
//! Each: the path MTU checked on the wire (packets per 1 MiB), then WRITE,
//! WRITE with immediate, SEND, SEND with immediate and READ at 0, 1, MTU-1,
//! MTU, MTU+1 bytes and 1 MiB, byte-exact with an untouched guard byte after
//! each target, then fetch-and-add and two compare-and-swaps returning the
//! original value; 64 QPs at once (more than the UAR page's BlueFlame
//! registers); and, `#[ignore]`d for release builds, 64 MiB WRITE, READ and
//! SEND at MTU 4096.
//!
//! Differences from the rxe suite, on purpose: atomics on mlx5 are
//! big-endian, as on ConnectX hardware without an atomic endianness mode
//! (docs/mlx5.md §9.3): an mlx5 responder reads and writes its target word
//! big-endian, and an mlx5 requester stores the original value big-endian;
//! rxe uses host order for both. The suite is a copy of rxe's shape rather
//! than one generic suite: rxe's lives in its crate's test helpers
//! (`tests/common`, its own `Side` and CQ wrapper), which the root crate
//! cannot import without moving it into a shared crate.
#![allow(clippy::unwrap_used)]

use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rnic::core::{
    AccessFlags, CompletionQueue, Context, Gid, HeapMemory, InitParams, Memory, MemoryRegion, Mtu,
    ProtectionDomain, Psn, QpCaps, QpInitAttr, QpType, QueuePair, RecvWr, RtrParams, RtsParams,
    SendWr, WcOpcode, WcStatus, WorkCompletion,
};
use rnic::mlx5::Mlx5Provider;
use rnic_mlx5_emu::TempFunction;
use rnic_testkit::{Endpoint, MIB, every_rc_op, pattern, sizes};

const ALL: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

/// Each side's buffer: source at 0, SEND target at 1 MiB, WRITE/READ target
/// at 2 MiB, receive scratch and atomics at 3 MiB.
const BUF: usize = 4 * MIB;

/// A fresh pair of loopback addresses: a /24 per process (127.251–254), a
/// counter within it.
fn ip_pair() -> (IpAddr, IpAddr) {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let b = 251 + (std::process::id() % 4) as u8;
    let c = (n % 250) as u8;
    (
        IpAddr::V4(Ipv4Addr::new(127, b, c, 1)),
        IpAddr::V4(Ipv4Addr::new(127, b, c, 2)),
    )
}

/// What keeps a side's device alive (dropped after every verbs object).
enum Backend {
    Mlx5 {
        provider: Arc<Mlx5Provider>,
        emu: TempFunction,
    },
    Rxe(#[allow(dead_code)] rnic::rxe::RxeDevice),
}

/// One end: a context from the facade, a PD, a CQ, a registered buffer.
struct Side {
    mr: MemoryRegion,
    mem: Arc<dyn Memory>,
    cq: Mutex<CompletionQueue>,
    pd: ProtectionDomain,
    _ctx: Context,
    gid: Gid,
    backend: Backend,
}

impl Side {
    fn mlx5(ip: IpAddr, cq_depth: u32) -> Side {
        Side::mlx5_with(ip, cq_depth, BUF)
    }

    fn mlx5_with(ip: IpAddr, cq_depth: u32, buf: usize) -> Side {
        let emu = TempFunction::start().unwrap();
        let provider = rnic::open_mlx5(&emu.spec()).unwrap();
        let gid = provider.set_gid(0, ip).unwrap();
        let ctx = Mlx5Provider::context(&provider);
        assert_eq!(ctx.backend(), "mlx5");
        let gids = ctx.query_gid_table(1).unwrap();
        assert_eq!((gids.len(), gids[0].gid), (1, gid));
        let mem: Arc<dyn Memory> = provider.alloc_dma(buf).unwrap();
        Side::with(ctx, mem, gid, cq_depth, Backend::Mlx5 { provider, emu })
    }

    fn rxe_with(ip: IpAddr, cq_depth: u32, buf: usize) -> Side {
        let dev = rnic::rxe::RxeDevice::open(
            &rnic::rxe::RxeConfig::new(rnic::rxe::Target::Ip(ip))
                .with_progress(rnic::rxe::Progress::Thread),
        )
        .unwrap();
        let ctx = dev.context();
        let gid = dev.gids()[0];
        let mem: Arc<dyn Memory> = Arc::new(HeapMemory::new(buf));
        Side::with(ctx, mem, gid, cq_depth, Backend::Rxe(dev))
    }

    fn with(ctx: Context, mem: Arc<dyn Memory>, gid: Gid, cq_depth: u32, b: Backend) -> Side {
        let pd = ctx.alloc_pd().unwrap();
        let mr = pd.reg_mr(mem.clone(), ALL).unwrap();
        let cq = Mutex::new(ctx.create_cq(cq_depth).unwrap());
        Side {
            mr,
            mem,
            cq,
            pd,
            _ctx: ctx,
            gid,
            backend: b,
        }
    }

    fn cq(&self) -> MutexGuard<'_, CompletionQueue> {
        self.cq.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn qp_with(&self, caps: QpCaps) -> QueuePair {
        let cq = self.cq();
        self.pd
            .create_qp(&cq, &cq, &QpInitAttr::new(QpType::Rc, caps))
            .unwrap()
    }

    fn qp(&self) -> QueuePair {
        self.qp_with(QpCaps {
            max_send_wr: 128,
            max_recv_wr: 128,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline_data: 64,
        })
    }

    fn bytes(&self, off: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.mem.read(off, &mut v).unwrap();
        v
    }

    fn fill(&self, off: usize, data: &[u8]) {
        self.mem.write(off, data).unwrap();
    }

    /// A 64-bit atomic operand as this side's device reads it from memory:
    /// big-endian on mlx5 (as a responder and for the original value it
    /// returns as a requester: ConnectX without an atomic endianness mode),
    /// host order on rxe.
    fn atomic_bytes(&self, v: u64) -> [u8; 8] {
        match self.backend {
            Backend::Mlx5 { .. } => v.to_be_bytes(),
            Backend::Rxe(_) => v.to_ne_bytes(),
        }
    }

    /// RoCE packets the emulated function sent (`None` on rxe).
    fn tx_packets(&self) -> Option<u64> {
        match &self.backend {
            Backend::Mlx5 { emu, .. } => {
                emu.emulator().firmware().map(|f| f.hca_stats().tx_packets)
            }
            Backend::Rxe(_) => None,
        }
    }

    fn is_mlx5(&self) -> bool {
        matches!(self.backend, Backend::Mlx5 { .. })
    }
}

/// One test at a time: each starts emulated functions (a firmware thread and
/// a doorbell watcher each) and rxe devices; run side by side on a 2-core
/// machine they starve each other (one run was seen to time out that way).
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Poll `side`'s CQ until `n` completions arrived (panics after 30 s).
fn wait(side: &Side, n: usize) -> Vec<WorkCompletion> {
    wait_for(side, n, Duration::from_secs(30))
}

/// [`wait`] with its own limit.
fn wait_for(side: &Side, n: usize, limit: Duration) -> Vec<WorkCompletion> {
    let mut out = Vec::new();
    let mut wcs = [WorkCompletion::default(); 16];
    let start = Instant::now();
    let mut cq = side.cq();
    while out.len() < n {
        let got = cq.poll(&mut wcs).unwrap();
        out.extend_from_slice(&wcs[..got]);
        if got == 0 {
            std::thread::yield_now();
        }
        assert!(
            start.elapsed() < limit,
            "timed out with {} of {n} completions: {out:?}",
            out.len()
        );
    }
    out
}

fn rtr(mtu: Mtu) -> RtrParams {
    RtrParams {
        path_mtu: mtu,
        max_dest_rd_atomic: 16,
        ..RtrParams::default()
    }
}

fn rts() -> RtsParams {
    RtsParams {
        max_rd_atomic: 16,
        ..RtsParams::default()
    }
}

/// Bring `qa` (on `a`) and `qb` (on `b`) up as a connected RC pair, through
/// core's modify checks and the drivers' modify.
fn connect(a: &Side, qa: &mut QueuePair, b: &Side, qb: &mut QueuePair, mtu: Mtu) {
    let init = InitParams {
        access: ALL,
        ..InitParams::default()
    };
    let (pa, pb) = (Psn::from_wire(0x1000), Psn::from_wire(0xab_cdef));
    qa.to_init(&init).unwrap();
    qb.to_init(&init).unwrap();
    qb.to_rtr(qa.qpn(), pa, a.gid, &rtr(mtu)).unwrap();
    qb.to_rts(pb, &rts()).unwrap();
    qa.to_rtr(qb.qpn(), pb, b.gid, &rtr(mtu)).unwrap();
    qa.to_rts(pa, &rts()).unwrap();
    let q = qa.query().unwrap();
    assert_eq!(q.qp_state, rnic::core::QpState::Rts);
    assert_eq!(q.dest_qp_num, qb.qpn());
    assert_eq!(q.path_mtu, mtu);
}

impl Endpoint for Side {
    fn mr(&self) -> &MemoryRegion {
        &self.mr
    }
    fn fill(&self, off: usize, data: &[u8]) {
        Side::fill(self, off, data);
    }
    fn bytes(&self, off: usize, len: usize) -> Vec<u8> {
        Side::bytes(self, off, len)
    }
    fn atomic_bytes(&self, v: u64) -> [u8; 8] {
        Side::atomic_bytes(self, v)
    }
    fn wait(&self, _peer: &Side, n: usize) -> Vec<WorkCompletion> {
        wait(self, n)
    }
}

#[derive(Clone, Copy)]
enum Kind {
    Mlx5,
    Rxe,
}

fn side(kind: Kind, ip: IpAddr, cq_depth: u32) -> Side {
    side_with(kind, ip, cq_depth, BUF)
}

fn side_with(kind: Kind, ip: IpAddr, cq_depth: u32, buf: usize) -> Side {
    match kind {
        Kind::Mlx5 => Side::mlx5_with(ip, cq_depth, buf),
        Kind::Rxe => Side::rxe_with(ip, cq_depth, buf),
    }
}

/// The path MTU is what the emulated function packetizes at: a 1 MiB WRITE
/// from an mlx5 requester, and a 1 MiB READ answered by an mlx5 responder,
/// leave as 1 MiB / MTU packets (fewer than twice that: retransmissions
/// aside, a smaller MTU would double it).
fn path_mtu_on_the_wire(a: &Side, qa: &mut QueuePair, b: &Side, mtu: Mtu) {
    let n = (MIB / mtu.bytes() as usize) as u64;
    let src = [a.mr.sge(0, MIB as u32).unwrap()];
    let dst = b.mr.addr() + 2 * MIB as u64;
    if let Some(before) = a.tx_packets() {
        qa.post_send(&[SendWr::rdma_write(9, &src, dst, b.mr.rkey()).signaled()])
            .unwrap();
        assert_eq!(wait(a, 1)[0].status, WcStatus::Success);
        let sent = a.tx_packets().unwrap() - before;
        assert!(
            (n..2 * n).contains(&sent),
            "WRITE at {mtu:?}: {sent} packets"
        );
    }
    if let Some(before) = b.tx_packets() {
        qa.post_send(&[SendWr::rdma_read(10, &src, dst, b.mr.rkey()).signaled()])
            .unwrap();
        assert_eq!(wait(a, 1)[0].status, WcStatus::Success);
        let sent = b.tx_packets().unwrap() - before;
        assert!(
            (n..2 * n).contains(&sent),
            "READ at {mtu:?}: {sent} packets"
        );
    }
}

fn all_ops(ka: Kind, kb: Kind, mtu: Mtu) {
    let (ia, ib) = ip_pair();
    let (a, b) = (side(ka, ia, 512), side(kb, ib, 512));
    let (mut qa, mut qb) = (a.qp(), b.qp());
    connect(&a, &mut qa, &b, &mut qb, mtu);
    path_mtu_on_the_wire(&a, &mut qa, &b, mtu);
    every_rc_op(&a, &mut qa, &b, &mut qb, &sizes(mtu));
    drop((qa, qb));
    for s in [&a, &b] {
        if let Backend::Mlx5 { provider, .. } = &s.backend {
            let port = rnic::core::Provider::query_port(&**provider, 1).unwrap();
            // The emulated vport's MTU is 9000: every path MTU fits, and
            // query_port reports the largest (4096 + 96 bytes of headers).
            assert_eq!(port.max_mtu, Mtu::Mtu4096);
            assert_eq!(port.active_mtu, Mtu::Mtu4096);
        }
    }
}

#[test]
fn mlx5_to_mlx5_mtu_256() {
    let _serial = serial();
    all_ops(Kind::Mlx5, Kind::Mlx5, Mtu::Mtu256);
}

#[test]
fn mlx5_to_mlx5_mtu_512() {
    let _serial = serial();
    all_ops(Kind::Mlx5, Kind::Mlx5, Mtu::Mtu512);
}

#[test]
fn mlx5_to_mlx5_mtu_1024() {
    let _serial = serial();
    all_ops(Kind::Mlx5, Kind::Mlx5, Mtu::Mtu1024);
}

#[test]
fn mlx5_to_mlx5_mtu_2048() {
    let _serial = serial();
    all_ops(Kind::Mlx5, Kind::Mlx5, Mtu::Mtu2048);
}

#[test]
fn mlx5_to_mlx5_mtu_4096() {
    let _serial = serial();
    all_ops(Kind::Mlx5, Kind::Mlx5, Mtu::Mtu4096);
}

#[test]
fn mlx5_to_rxe_mtu_256() {
    let _serial = serial();
    all_ops(Kind::Mlx5, Kind::Rxe, Mtu::Mtu256);
}

#[test]
fn mlx5_to_rxe_mtu_1024() {
    let _serial = serial();
    all_ops(Kind::Mlx5, Kind::Rxe, Mtu::Mtu1024);
}

#[test]
fn mlx5_to_rxe_mtu_4096() {
    let _serial = serial();
    all_ops(Kind::Mlx5, Kind::Rxe, Mtu::Mtu4096);
}

#[test]
fn rxe_to_mlx5_mtu_512() {
    let _serial = serial();
    all_ops(Kind::Rxe, Kind::Mlx5, Mtu::Mtu512);
}

#[test]
fn rxe_to_mlx5_mtu_1024() {
    let _serial = serial();
    all_ops(Kind::Rxe, Kind::Mlx5, Mtu::Mtu1024);
}

#[test]
fn rxe_to_mlx5_mtu_4096() {
    let _serial = serial();
    all_ops(Kind::Rxe, Kind::Mlx5, Mtu::Mtu4096);
}

/// How many RC pairs run at once (as rxe's suite). More than the UAR page's
/// four BlueFlame registers, so QPs share registers and one QP's doorbell is
/// overwritten by another's before the emulator's watcher sees it; the
/// emulator serves every QP of the page whose doorbell record is ahead when
/// any send doorbell of the page is seen (docs/mlx5-emu.md, Doorbells).
const QPS: usize = 64;

/// `QPS` connected pairs on one CQ per side: each writes its own pattern
/// into its own slice of the peer's buffer and sends it a message; every
/// completion names its QP and every byte lands where it should.
fn many_qps(ka: Kind, kb: Kind) {
    let (ia, ib) = ip_pair();
    let (a, b) = (side(ka, ia, 2048), side(kb, ib, 2048));
    let caps = QpCaps {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let mut pairs: Vec<(QueuePair, QueuePair)> = (0..QPS)
        .map(|_| {
            let (mut qa, mut qb) = (a.qp_with(caps), b.qp_with(caps));
            connect(&a, &mut qa, &b, &mut qb, Mtu::Mtu1024);
            (qa, qb)
        })
        .collect();
    let chunk = 8 * 1024;
    for (i, (qa, qb)) in pairs.iter_mut().enumerate() {
        let data = pattern(chunk, 0x6400 + i as u32);
        a.fill(i * chunk, &data);
        let rsge = [b.mr.sge(MIB + i * 64, 64).unwrap()];
        qb.post_recv(&[RecvWr::new(1000 + i as u64, &rsge)])
            .unwrap();
        let src = [a.mr.sge(i * chunk, chunk as u32).unwrap()];
        let msg = [a.mr.sge(i * chunk, 64).unwrap()];
        let dst = b.mr.addr() + (2 * MIB + i * chunk) as u64;
        qa.post_send(&[
            SendWr::rdma_write(i as u64, &src, dst, b.mr.rkey()).signaled(),
            SendWr::send(100 + i as u64, &msg).signaled(),
        ])
        .unwrap();
    }
    let wa = wait(&a, 2 * QPS);
    assert!(wa.iter().all(|w| w.status == WcStatus::Success), "{wa:?}");
    let wb = wait(&b, QPS);
    for w in &wb {
        assert_eq!(w.status, WcStatus::Success, "{w:?}");
        let i = (w.wr_id - 1000) as usize;
        assert_eq!(w.qp_num, pairs[i].1.qpn());
        assert_eq!(w.byte_len, 64);
    }
    for (i, (qa, _)) in pairs.iter().enumerate() {
        let mine: Vec<_> = wa.iter().filter(|w| w.qp_num == qa.qpn()).collect();
        assert_eq!(
            mine.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
            [i as u64, 100 + i as u64],
            "send completions of a QP arrive in posting order"
        );
        let data = pattern(chunk, 0x6400 + i as u32);
        assert!(b.bytes(2 * MIB + i * chunk, chunk) == data, "QP {i}");
        assert_eq!(b.bytes(MIB + i * 64, 64), data[..64], "QP {i}");
    }
    assert!(a.is_mlx5() || b.is_mlx5());
}

#[test]
fn many_qps_mlx5_to_mlx5() {
    let _serial = serial();
    many_qps(Kind::Mlx5, Kind::Mlx5);
}

#[test]
fn many_qps_mlx5_to_rxe() {
    let _serial = serial();
    many_qps(Kind::Mlx5, Kind::Rxe);
}

#[test]
fn many_qps_rxe_to_mlx5() {
    let _serial = serial();
    many_qps(Kind::Rxe, Kind::Mlx5);
}

/// Memory that is not host memory of this process (as GPU memory behind a
/// staging ring): no direct span, no host address.
#[derive(Debug)]
struct NotHost(HeapMemory);

impl Memory for NotHost {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn addr(&self) -> u64 {
        self.0.addr()
    }
    fn read(&self, o: usize, d: &mut [u8]) -> Result<(), rnic::core::MemoryError> {
        self.0.read(o, d)
    }
    fn write(&self, o: usize, s: &[u8]) -> Result<(), rnic::core::MemoryError> {
        self.0.write(o, s)
    }
    fn compare_swap_u64(&self, o: usize, c: u64, s: u64) -> Result<u64, rnic::core::MemoryError> {
        self.0.compare_swap_u64(o, c, s)
    }
    fn fetch_add_u64(&self, o: usize, a: u64) -> Result<u64, rnic::core::MemoryError> {
        self.0.fetch_add_u64(o, a)
    }
}

/// Host memory is registered in place on mlx5 (drivers/mlx5/tests/app_memory.rs
/// moves bytes through it); memory with no host address is refused.
#[test]
fn memory_without_a_host_address_is_refused_at_run_time_on_the_dyn_path() {
    let _serial = serial();
    let (ia, _) = ip_pair();
    let a = Side::mlx5(ia, 16);
    let e =
        a.pd.reg_mr(
            Arc::new(NotHost(HeapMemory::new(4096))),
            AccessFlags::LOCAL_WRITE,
        )
        .unwrap_err();
    assert!(
        matches!(e, rnic::core::VerbsError::UnreachableMemory { .. }),
        "{e}"
    );
    assert!(e.to_string().contains("Mlx5Provider::alloc_dma"), "{e}");
}

/// rxe's 64 MiB case (`write_and_read_64_mib`), with SEND too: one message of
/// 64 MiB each way at path MTU 4096 (16384 packets), byte-exact, a guard byte
/// after each target. Slow in debug builds: run with `cargo test --release
/// -p rnic --test mlx5_conformance -- --ignored` (scripts/test.sh does).
fn big(ka: Kind, kb: Kind) {
    const LEN: usize = 64 * MIB;
    let l32 = LEN as u32;
    let limit = Duration::from_secs(60);
    let (ia, ib) = ip_pair();
    // Each side: source (or READ target) at 0, WRITE/SEND target at LEN.
    let buf = 2 * LEN + 4096;
    let (a, b) = (side_with(ka, ia, 512, buf), side_with(kb, ib, 512, buf));
    let (mut qa, mut qb) = (a.qp(), b.qp());
    connect(&a, &mut qa, &b, &mut qb, Mtu::Mtu4096);
    let src = [a.mr.sge(0, l32).unwrap()];
    let dst = b.mr.addr() + LEN as u64;

    let t = Instant::now();
    let data = pattern(LEN, 0x6401);
    a.fill(0, &data);
    b.fill(LEN, &vec![0xEE; LEN + 1]);
    let fill = t.elapsed();
    let t = Instant::now();
    qa.post_send(&[SendWr::rdma_write(1, &src, dst, b.mr.rkey()).signaled()])
        .unwrap();
    let wa = wait_for(&a, 1, limit);
    let write = t.elapsed();
    assert_eq!(
        (wa[0].status, wa[0].opcode),
        (WcStatus::Success, WcOpcode::RdmaWrite),
        "{wa:?}"
    );
    assert!(b.bytes(LEN, LEN) == data, "64 MiB WRITE: bytes differ");
    assert_eq!(b.bytes(2 * LEN, 1), [0xEE], "64 MiB WRITE overran");

    let data = pattern(LEN, 0x6402);
    b.fill(LEN, &data);
    a.fill(0, &vec![0xEE; LEN + 1]);
    let t = Instant::now();
    qa.post_send(&[SendWr::rdma_read(2, &src, dst, b.mr.rkey()).signaled()])
        .unwrap();
    let wa = wait_for(&a, 1, limit);
    let read = t.elapsed();
    assert_eq!(
        (wa[0].status, wa[0].opcode),
        (WcStatus::Success, WcOpcode::RdmaRead),
        "{wa:?}"
    );
    assert!(a.bytes(0, LEN) == data, "64 MiB READ: bytes differ");
    assert_eq!(a.bytes(LEN, 1), [0xEE], "64 MiB READ overran");

    let data = pattern(LEN, 0x6403);
    a.fill(0, &data);
    b.fill(LEN, &vec![0xEE; LEN + 1]);
    let rsge = [b.mr.sge(LEN, l32 + 1).unwrap()];
    qb.post_recv(&[RecvWr::new(80, &rsge)]).unwrap();
    let t = Instant::now();
    qa.post_send(&[SendWr::send(3, &src).signaled()]).unwrap();
    let wa = wait_for(&a, 1, limit);
    let wb = wait_for(&b, 1, limit);
    let send = t.elapsed();
    assert_eq!(
        (wa[0].status, wa[0].opcode),
        (WcStatus::Success, WcOpcode::Send),
        "{wa:?}"
    );
    assert_eq!(
        (wb[0].wr_id, wb[0].status, wb[0].opcode, wb[0].byte_len),
        (80, WcStatus::Success, WcOpcode::Recv, l32),
        "{wb:?}"
    );
    assert!(b.bytes(LEN, LEN) == data, "64 MiB SEND: bytes differ");
    assert_eq!(b.bytes(2 * LEN, 1), [0xEE], "64 MiB SEND overran");
    println!("64 MiB at MTU 4096: fill {fill:?}, WRITE {write:?}, READ {read:?}, SEND {send:?}");
}

#[test]
#[ignore = "64 MiB: run in release (scripts/test.sh does)"]
fn mlx5_to_mlx5_64_mib() {
    let _serial = serial();
    big(Kind::Mlx5, Kind::Mlx5);
}

#[test]
#[ignore = "64 MiB: run in release (scripts/test.sh does)"]
fn mlx5_to_rxe_64_mib() {
    let _serial = serial();
    big(Kind::Mlx5, Kind::Rxe);
}

#[test]
#[ignore = "64 MiB: run in release (scripts/test.sh does)"]
fn rxe_to_mlx5_64_mib() {
    let _serial = serial();
    big(Kind::Rxe, Kind::Mlx5);
}
