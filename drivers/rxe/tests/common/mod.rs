//! Shared helpers for the loopback tests: endpoint pairs on distinct
//! 127.x.y.z addresses, connected RC/UD QPs, completion waiting.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rnic_core::{
    AccessFlags, CompletionQueue, Context, CqStats, HeapMemory, InitParams, Memory, MemoryRegion,
    Mtu, ProtectionDomain, Psn, QpCaps, QpInitAttr, QpType, QueuePair, RtrParams, RtsParams,
    SendWr, VerbsError, WcStatus, WorkCompletion,
};
use rnic_rxe::{Progress, RxeConfig, RxeDevice, RxeError, Target};

/// A fresh pair of loopback addresses (127.<pid-derived>.<n>.1/.2) so tests
/// running in parallel threads (and processes) never share UDP/4791.
pub fn ip_pair() -> (IpAddr, IpAddr) {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let b = 16 + (std::process::id() % 200) as u8;
    let c = (n % 250) as u8;
    (
        IpAddr::V4(Ipv4Addr::new(127, b, c, 1)),
        IpAddr::V4(Ipv4Addr::new(127, b, c, 2)),
    )
}

pub const ALL: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

pub fn open(ip: IpAddr, progress: Progress) -> RxeDevice {
    open_cfg(&RxeConfig::new(Target::Ip(ip)).with_progress(progress)).expect("open rxe")
}

/// Open a device, waiting out a port that a device this test just dropped
/// still seems to hold: its socket is closed, but a child process another
/// test thread is spawning (`ip netns …`) may still hold a copy of the
/// descriptor between its fork and its exec (close-on-exec closes it only
/// there). Seen on a loaded 2-core machine; anything else fails at once.
pub fn open_cfg(cfg: &RxeConfig) -> Result<RxeDevice, RxeError> {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        match RxeDevice::open(cfg) {
            Err(RxeError::PortInUse { .. }) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            other => return other,
        }
    }
}

/// A completion queue the test shares between helpers: the explicit lock an
/// application chooses when more than one place polls.
pub struct Cq(pub Mutex<CompletionQueue>);

impl Cq {
    pub fn new(cq: CompletionQueue) -> Cq {
        Cq(Mutex::new(cq))
    }
    pub fn lock(&self) -> MutexGuard<'_, CompletionQueue> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
    pub fn poll(&self, wcs: &mut [WorkCompletion]) -> Result<usize, VerbsError> {
        self.lock().poll(wcs)
    }
    pub fn stats(&self) -> CqStats {
        self.lock().stats()
    }
    pub fn in_flight(&self) -> u32 {
        self.lock().in_flight()
    }
    pub fn depth(&self) -> u32 {
        self.lock().depth()
    }
    pub fn req_notify(&self, solicited_only: bool) -> Result<(), VerbsError> {
        self.lock().req_notify(solicited_only)
    }
    pub fn event_fd(&self) -> Option<std::os::fd::RawFd> {
        self.lock().event_fd()
    }
    pub fn wait(&self, timeout: Option<Duration>) -> Result<bool, VerbsError> {
        self.lock().wait(timeout)
    }
}

/// One side: device, PD, CQ, a buffer with its MR, and QPs.
pub struct Side {
    pub dev: RxeDevice,
    pub ctx: Context,
    pub pd: ProtectionDomain,
    pub cq: Cq,
    pub mem: Arc<dyn Memory>,
    pub mr: MemoryRegion,
}

impl Side {
    pub fn new(dev: RxeDevice, buf: usize, cq_depth: u32) -> Side {
        Side::with_memory(dev, Arc::new(HeapMemory::new(buf)), cq_depth)
    }

    /// A side whose buffer is `mem` (any memory: heap, an application's
    /// own `OwnedBuffer`, a hugepage `DmaRegion`).
    pub fn with_memory(dev: RxeDevice, mem: Arc<dyn Memory>, cq_depth: u32) -> Side {
        let ctx = dev.context();
        let pd = ctx.alloc_pd().unwrap();
        let cq = Cq::new(ctx.create_cq(cq_depth).unwrap());
        let mr = pd.reg_mr(mem.clone(), ALL).unwrap();
        Side {
            dev,
            ctx,
            pd,
            cq,
            mem,
            mr,
        }
    }

    pub fn qp(&self, qp_type: QpType) -> QueuePair {
        let caps = QpCaps {
            max_send_wr: 128,
            max_recv_wr: 128,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline_data: 64,
        };
        let cq = self.cq.lock();
        self.pd
            .create_qp(&cq, &cq, &QpInitAttr::new(qp_type, caps))
            .unwrap()
    }

    pub fn gid(&self) -> rnic_core::Gid {
        self.dev.gids()[0]
    }

    pub fn bytes(&self, off: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.mem.read(off, &mut v).unwrap();
        v
    }

    pub fn fill(&self, off: usize, data: &[u8]) {
        self.mem.write(off, data).unwrap();
    }
}

pub fn rtr(mtu: Mtu) -> RtrParams {
    RtrParams {
        path_mtu: mtu,
        max_dest_rd_atomic: 16,
        ..RtrParams::default()
    }
}

pub fn rts() -> RtsParams {
    RtsParams {
        max_rd_atomic: 16,
        ..RtsParams::default()
    }
}

/// Bring `qa` (on `a`) and `qb` (on `b`) up as a connected RC pair.
pub fn connect(a: &Side, qa: &mut QueuePair, b: &Side, qb: &mut QueuePair, mtu: Mtu) {
    connect_with(a, qa, b, qb, rtr(mtu), rts(), ALL);
}

pub fn connect_with(
    a: &Side,
    qa: &mut QueuePair,
    b: &Side,
    qb: &mut QueuePair,
    rtr: RtrParams,
    rts: RtsParams,
    access: AccessFlags,
) {
    let init = InitParams {
        access,
        ..InitParams::default()
    };
    let (pa, pb) = (Psn::from_wire(0x1000), Psn::from_wire(0xabcdef));
    qa.to_init(&init).unwrap();
    qb.to_init(&init).unwrap();
    qb.to_rtr(qa.qpn(), pa, a.gid(), &rtr).unwrap();
    qb.to_rts(pb, &rts).unwrap();
    qa.to_rtr(qb.qpn(), pb, b.gid(), &rtr).unwrap();
    qa.to_rts(pa, &rts).unwrap();
}

/// Bring `qa` and `qb` up as a connected RC pair where each side sends
/// from its own GID-table entry (`ia` on `a`, `ib` on `b`) and addresses
/// the peer's (a device with IPv4 and IPv6 GIDs: pick the family).
#[allow(clippy::too_many_arguments)]
pub fn connect_at(
    a: &Side,
    qa: &mut QueuePair,
    ia: u8,
    b: &Side,
    qb: &mut QueuePair,
    ib: u8,
    mtu: Mtu,
) {
    let init = InitParams {
        access: ALL,
        ..InitParams::default()
    };
    let (pa, pb) = (Psn::from_wire(0x1000), Psn::from_wire(0xabcdef));
    let (ga, gb) = (a.dev.gids()[ia as usize], b.dev.gids()[ib as usize]);
    qa.to_init(&init).unwrap();
    qb.to_init(&init).unwrap();
    let rtr_b = RtrParams {
        sgid_index: ib,
        ..rtr(mtu)
    };
    qb.to_rtr(qa.qpn(), pa, ga, &rtr_b).unwrap();
    qb.to_rts(pb, &rts()).unwrap();
    let rtr_a = RtrParams {
        sgid_index: ia,
        ..rtr(mtu)
    };
    qa.to_rtr(qb.qpn(), pb, gb, &rtr_a).unwrap();
    qa.to_rts(pa, &rts()).unwrap();
}

/// The traffic class and hop limit [`connect_marked`] gives the QPs: values
/// a capture tells apart from the system's defaults.
pub const MARK_TCLASS: u8 = 0x68;
pub const MARK_HOPS: u8 = 7;

/// [`connect`] at MTU 1024 with traffic class [`MARK_TCLASS`] and hop
/// limit [`MARK_HOPS`] in both address vectors.
pub fn connect_marked(a: &Side, qa: &mut QueuePair, b: &Side, qb: &mut QueuePair) {
    let p = RtrParams {
        traffic_class: MARK_TCLASS,
        hop_limit: MARK_HOPS,
        ..rtr(Mtu::Mtu1024)
    };
    connect_with(a, qa, b, qb, p, rts(), ALL);
}

/// Open `cfg`, a device with a packet ring; `None` (printed) where this
/// machine cannot have one (no CAP_NET_RAW, Linux before 6.2).
pub fn open_ring(cfg: &RxeConfig) -> Option<RxeDevice> {
    match open_cfg(cfg) {
        Ok(d) => Some(d),
        Err(e @ RxeError::PacketRing { .. }) => {
            println!("SKIP: no packet ring here: {e}");
            None
        }
        Err(e) => panic!("open: {e}"),
    }
}

/// Two sides on fresh loopback addresses with `buf` bytes each.
pub fn sides(buf: usize, progress: Progress) -> (Side, Side) {
    let (ia, ib) = ip_pair();
    (
        Side::new(open(ia, progress), buf, 512),
        Side::new(open(ib, progress), buf, 512),
    )
}

/// An RDMA WRITE of `data` from the start of `a`'s buffer to `b`'s at `at`,
/// then a READ of it back into `a`'s buffer at `at`: each completes and
/// lands byte-exact without overrunning (a 0xEE guard byte after each).
/// `kick`: caller-driven devices the waits must progress.
pub fn write_then_read_back(
    a: &Side,
    qa: &mut QueuePair,
    b: &Side,
    at: usize,
    data: &[u8],
    kick: &[&RxeDevice],
) {
    let len = data.len();
    a.fill(0, data);
    b.fill(at, &vec![0xEE; len + 1]);
    let src = [a.mr.sge(0, len as u32).unwrap()];
    let dst = b.mr.addr() + at as u64;
    qa.post_send(&[SendWr::rdma_write(1, &src, dst, b.mr.rkey()).signaled()])
        .unwrap();
    assert_eq!(
        wait(&a.cq, 1, kick)[0].status,
        WcStatus::Success,
        "WRITE {len}"
    );
    assert!(b.bytes(at, len) == data, "WRITE {len}: bytes differ");
    assert_eq!(b.bytes(at + len, 1), [0xEE], "WRITE {len} overran");

    a.fill(at, &vec![0xEE; len + 1]);
    let rd = [a.mr.sge(at, len as u32).unwrap()];
    qa.post_send(&[SendWr::rdma_read(2, &rd, dst, b.mr.rkey()).signaled()])
        .unwrap();
    assert_eq!(
        wait(&a.cq, 1, kick)[0].status,
        WcStatus::Success,
        "READ {len}"
    );
    assert!(a.bytes(at, len) == data, "READ {len}: bytes differ");
    assert_eq!(a.bytes(at + len, 1), [0xEE], "READ {len} overran");
}

/// Poll `cq` until `n` completions arrived (panics after 20 s). Also kicks
/// `others` (caller-driven peers) while waiting.
pub fn wait(cq: &Cq, n: usize, others: &[&RxeDevice]) -> Vec<WorkCompletion> {
    wait_seen(cq, n, others, &[])
}

/// [`wait`], naming on a timeout what each of `seen` counted (packets in
/// and out, drops by cause): where a datagram went missing.
pub fn wait_seen(
    cq: &Cq,
    n: usize,
    others: &[&RxeDevice],
    seen: &[&RxeDevice],
) -> Vec<WorkCompletion> {
    let mut out = Vec::new();
    let mut wcs = [WorkCompletion::default(); 16];
    let start = Instant::now();
    while out.len() < n {
        let got = cq.poll(&mut wcs).unwrap();
        out.extend_from_slice(&wcs[..got]);
        for d in others {
            d.progress();
        }
        if start.elapsed() >= Duration::from_secs(20) {
            let stats: Vec<String> = seen
                .iter()
                .map(|d| format!("{:?}", d.stats().device))
                .collect();
            panic!(
                "timed out with {} of {n} completions: {out:?}; devices: {stats:#?}",
                out.len()
            );
        }
    }
    out
}

/// An AF_PACKET socket capturing every packet of the calling thread's
/// network namespace (200 ms receive timeout, 16 MiB buffer). Needs root
/// (CAP_NET_RAW): `None` after printing a SKIP line otherwise.
pub fn capture_socket() -> Option<OwnedFd> {
    use nix::sys::socket::{
        AddressFamily, SockFlag, SockProtocol, SockType, setsockopt, socket, sockopt,
    };
    if !nix::unistd::geteuid().is_root() {
        println!("SKIP: capturing with AF_PACKET needs root");
        return None;
    }
    let cap = socket(
        AddressFamily::Packet,
        SockType::Datagram,
        SockFlag::empty(),
        SockProtocol::EthAll,
    )
    .expect("AF_PACKET socket");
    setsockopt(
        &cap,
        sockopt::ReceiveTimeout,
        &nix::sys::time::TimeVal::new(0, 200_000),
    )
    .unwrap();
    setsockopt(&cap, sockopt::RcvBufForce, &(16 << 20)).unwrap();
    Some(cap)
}

/// A mebibyte (the op suite's buffer layout is in MiB).
// Not every test binary that includes this module uses all three.
#[allow(unused_imports)]
pub use rnic_testkit::{every_rc_op, pattern, sizes};

impl rnic_testkit::Endpoint for Side {
    fn mr(&self) -> &MemoryRegion {
        &self.mr
    }
    fn fill(&self, off: usize, data: &[u8]) {
        Side::fill(self, off, data);
    }
    fn bytes(&self, off: usize, len: usize) -> Vec<u8> {
        Side::bytes(self, off, len)
    }
    fn wait(&self, peer: &Side, n: usize) -> Vec<WorkCompletion> {
        wait(&self.cq, n, &[&peer.dev])
    }
}

/// The IPv4/UDP packets to port 4791 between `a` and `b` (either way) that
/// `cap` ([`capture_socket`]) saw, whole IP packets, reading until the
/// socket is quiet for its timeout or `secs` pass.
pub fn captured_v4(cap: &OwnedFd, a: Ipv4Addr, b: Ipv4Addr, secs: u64) -> Vec<Vec<u8>> {
    use nix::sys::socket::{MsgFlags, recv};
    use std::os::fd::AsRawFd;
    let (a, b) = (a.octets(), b.octets());
    let mut got = Vec::new();
    let mut buf = vec![0u8; 70_000];
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(secs) {
        let Ok(n) = recv(cap.as_raw_fd(), &mut buf, MsgFlags::empty()) else {
            break;
        };
        let ip = &buf[..n];
        if n < 28 || ip[0] != 0x45 || ip[9] != 17 {
            continue;
        }
        let (s, d) = (&ip[12..16], &ip[16..20]);
        let ours = (s == a && d == b) || (s == b && d == a);
        if ours && u16::from_be_bytes([ip[22], ip[23]]) == 4791 {
            got.push(ip.to_vec());
        }
    }
    got
}
