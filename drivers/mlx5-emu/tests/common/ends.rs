//! The two ends the cross-process tests connect (`crash_recovery.rs`,
//! `keep_state.rs`, included by path): the real driver (`rnic_mlx5`,
//! `VfioUserFunction`, `Hca::bring_up`, the `Mlx5Provider` verbs) on one
//! emulated function, and an rnic-rxe peer, joined as an RC pair.
#![allow(dead_code)]

use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rnic_core::{
    AccessFlags, CompletionQueue, Context, Gid, HeapMemory, InitParams, Memory, MemoryRegion, Mtu,
    ProtectionDomain, Psn, QpCaps, QpInitAttr, QpType, QueuePair, RtrParams, RtsParams,
    WorkCompletion,
};
use rnic_mlx5::{Hca, HcaOptions, Mlx5Provider, PciFunction, VfioUserFunction};

/// Every right a test region gets.
pub const ALL: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);
/// Each end's buffer.
pub const BUF: usize = 1 << 20;

/// One end of the RC connection: a verbs context, a PD, a CQ, a registered
/// buffer. Fields drop in declaration order: QP users first, then the CQ,
/// MR, PD, context.
pub struct Side {
    pub mr: MemoryRegion,
    pub cq: CompletionQueue,
    pub pd: ProtectionDomain,
    pub mem: Arc<dyn Memory>,
    pub ctx: Context,
    pub gid: Gid,
}

impl Side {
    pub fn new(ctx: Context, mem: Arc<dyn Memory>, gid: Gid) -> Side {
        let pd = ctx.alloc_pd().unwrap();
        let mr = pd.reg_mr(mem.clone(), ALL).unwrap();
        let cq = ctx.create_cq(256).unwrap();
        Side {
            mr,
            cq,
            pd,
            mem,
            ctx,
            gid,
        }
    }

    pub fn qp(&self) -> QueuePair {
        let caps = QpCaps {
            max_send_wr: 64,
            max_recv_wr: 64,
            max_send_sge: 2,
            max_recv_sge: 2,
            max_inline_data: 64,
        };
        self.pd
            .create_qp(&self.cq, &self.cq, &QpInitAttr::new(QpType::Rc, caps))
            .unwrap()
    }

    pub fn bytes(&self, off: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.mem.read(off, &mut v).unwrap();
        v
    }

    pub fn fill(&self, off: usize, data: &[u8]) {
        self.mem.write(off, data).unwrap();
    }

    /// Poll until `n` completions arrived (panics after 30 s).
    pub fn wait(&mut self, n: usize) -> Vec<WorkCompletion> {
        let mut out = Vec::new();
        let mut wcs = [WorkCompletion::default(); 16];
        let start = Instant::now();
        while out.len() < n {
            let got = self.cq.poll(&mut wcs).unwrap();
            out.extend_from_slice(&wcs[..got]);
            if got == 0 {
                std::thread::yield_now();
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "timed out with {} of {n} completions: {out:?}",
                out.len()
            );
        }
        out
    }
}

/// The mlx5 end over vfio-user, with `ip` in GID 0; whether the driver found the
/// function initialized and reset it first (`HcaInfo::reset_first`).
pub fn mlx5_side(socket: &Path, ip: IpAddr) -> (Side, Arc<Mlx5Provider>, bool) {
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
    assert_eq!(side.ctx.backend(), "mlx5");
    (side, provider, reset_first)
}

/// The rnic-rxe end on `ip`.
pub fn rxe_side(ip: IpAddr) -> (Side, rnic_rxe::RxeDevice) {
    let dev = rnic_rxe::RxeDevice::open(
        &rnic_rxe::RxeConfig::new(rnic_rxe::Target::Ip(ip))
            .with_progress(rnic_rxe::Progress::Thread),
    )
    .unwrap();
    let gid = dev.gids()[0];
    let side = Side::new(dev.context(), Arc::new(HeapMemory::new(BUF)), gid);
    (side, dev)
}

/// Connect `qa` on `a` and `qb` on `b` as an RC pair.
pub fn connect(a: &Side, qa: &mut QueuePair, b: &Side, qb: &mut QueuePair) {
    let init = InitParams {
        access: ALL,
        ..InitParams::default()
    };
    let rtr = RtrParams {
        path_mtu: Mtu::Mtu1024,
        max_dest_rd_atomic: 16,
        ..RtrParams::default()
    };
    let rts = RtsParams {
        max_rd_atomic: 16,
        ..RtsParams::default()
    };
    let (pa, pb) = (Psn::from_wire(0x2000), Psn::from_wire(0x5_4321));
    qa.to_init(&init).unwrap();
    qb.to_init(&init).unwrap();
    qb.to_rtr(qa.qpn(), pa, a.gid, &rtr).unwrap();
    qb.to_rts(pb, &rts).unwrap();
    qa.to_rtr(qb.qpn(), pb, b.gid, &rtr).unwrap();
    qa.to_rts(pa, &rts).unwrap();
}
