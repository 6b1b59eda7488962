//! The rnic-rxe peer the driver's data-path tests talk RoCEv2 to, and the
//! addresses and buffers they share (`datapath.rs`, `audit.rs`).

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use rnic_core::{
    AccessFlags, CompletionQueue, Context, Gid, HeapMemory, InitParams, Memory, MemoryRegion,
    ProtectionDomain, Psn, QpCaps, QpInitAttr, QpType, QueuePair, RtrParams, RtsParams,
    WorkCompletion,
};
use rnic_mlx5::Qp;

/// Every access right the tests use.
pub const ALL: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

/// The peer's QP capacities.
const CAPS: QpCaps = QpCaps {
    max_send_wr: 64,
    max_recv_wr: 64,
    max_send_sge: 4,
    max_recv_sge: 4,
    max_inline_data: 64,
};

/// A fresh pair of loopback addresses (emulated function, peer) in a /24 of
/// this process's own: `127.<base + pid % 20>.<n>.{1,2}` — each test binary
/// passes a `base` of its own so that binaries running at once never share
/// an address.
pub fn ip_pair(base: u8) -> (IpAddr, IpAddr) {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let b = base + (std::process::id() % 20) as u8;
    let c = (n % 250) as u8;
    (
        IpAddr::V4(Ipv4Addr::new(127, b, c, 1)),
        IpAddr::V4(Ipv4Addr::new(127, b, c, 2)),
    )
}

/// The GID of `ip`.
pub fn v4(ip: IpAddr) -> Gid {
    Gid::from_ip(ip)
}

/// `len` bytes of a pattern that differs per `seed`.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed))
        .collect()
}

/// A UD QP of the emulated function on a CQ of its own (512 entries), using 16 KiB of
/// memory registered for everything: (CQ, memory, QP), in RST.
pub fn ud_qp(hca: &Arc<rnic_mlx5::Hca>) -> (rnic_mlx5::Cq, rnic_mlx5::Mkey, Qp) {
    let mut cq = rnic_mlx5::Cq::new(hca, 512).unwrap();
    let mkey = rnic_mlx5::Mkey::new(hca, hca.function().alloc_dma(4 * 4096).unwrap(), ALL).unwrap();
    let mut qp = Qp::new(
        hca,
        &mut cq,
        None,
        rnic_mlx5::QpOptions {
            qp_type: QpType::Ud,
            ..rnic_mlx5::QpOptions::default()
        },
    )
    .unwrap();
    qp.use_region(&mkey);
    (cq, mkey, qp)
}

/// Bring a UD `qp` of the emulated function (at `emu_ip`) and the peer's UD
/// QP to RTS with `init`'s Q_Key; `psns` are the send PSNs (ours, the
/// peer's).
pub fn ud_rts(qp: &mut Qp, peer: &mut Peer, emu_ip: IpAddr, init: &InitParams, psns: (u32, u32)) {
    qp.connect(
        init,
        rnic_core::Qpn::from_wire(0),
        Gid::ZERO,
        Psn::from_wire(0),
        Psn::from_wire(psns.0),
        &RtrParams::default(),
        &RtsParams::default(),
    )
    .unwrap();
    peer.qp.to_init(init).unwrap();
    peer.qp
        .to_rtr(
            rnic_core::Qpn::from_wire(0),
            Psn::from_wire(0),
            v4(emu_ip),
            &RtrParams::default(),
        )
        .unwrap();
    peer.qp
        .to_rts(Psn::from_wire(psns.1), &RtsParams::default())
        .unwrap();
}

/// The rxe peer.
pub struct Peer {
    _dev: rnic_rxe::RxeDevice,
    _ctx: Context,
    pub pd: ProtectionDomain,
    pub cq: CompletionQueue,
    pub mem: Arc<HeapMemory>,
    pub mr: MemoryRegion,
    pub qp: QueuePair,
}

impl Peer {
    pub fn new(ip: IpAddr) -> Peer {
        Peer::with(ip, QpType::Rc)
    }

    pub fn with(ip: IpAddr, qp_type: QpType) -> Peer {
        let dev = rnic_rxe::RxeDevice::open(
            &rnic_rxe::RxeConfig::new(rnic_rxe::Target::Ip(ip))
                .with_progress(rnic_rxe::Progress::Thread),
        )
        .expect("open rxe");
        let ctx = dev.context();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(256).unwrap();
        let mem = Arc::new(HeapMemory::new(64 << 10));
        let mr = pd.reg_mr(mem.clone(), ALL).unwrap();
        let qp = pd
            .create_qp(&cq, &cq, &QpInitAttr::new(qp_type, CAPS))
            .unwrap();
        Peer {
            _dev: dev,
            _ctx: ctx,
            pd,
            cq,
            mem,
            mr,
            qp,
        }
    }

    pub fn wait(&mut self, n: usize) -> Vec<WorkCompletion> {
        let mut out = Vec::new();
        let mut wcs = [WorkCompletion::default(); 16];
        let start = Instant::now();
        while out.len() < n {
            let got = self.cq.poll(&mut wcs).unwrap();
            out.extend_from_slice(&wcs[..got]);
            assert!(start.elapsed() < Duration::from_secs(10), "peer: {out:?}");
            std::thread::sleep(Duration::from_micros(100));
        }
        out
    }

    pub fn bytes(&self, off: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.mem.read(off, &mut v).unwrap();
        v
    }

    /// Another RC QP of the peer, on its PD and CQ, in RST.
    pub fn another_rc(&self) -> QueuePair {
        self.pd
            .create_qp(&self.cq, &self.cq, &QpInitAttr::new(QpType::Rc, CAPS))
            .unwrap()
    }
}
