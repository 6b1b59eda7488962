//! Shared by the GPU tests: an rxe endpoint whose buffer is device memory
//! behind a staging ring, checked on the device side (what a GPU kernel
//! would see), never through the staging.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rnic_core::{
    AccessFlags, CompletionQueue, Context, HeapMemory, InitParams, Memory, MemoryRegion, Mtu,
    ProtectionDomain, Psn, QpCaps, QpInitAttr, QpType, QueuePair, RtrParams, RtsParams,
    WorkCompletion,
};
use rnic_gpu::{HostEngine, StagedMemory};
use rnic_rxe::{Progress, RxeConfig, RxeDevice, Target};

pub const ALL: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

/// Device-side access to a staged buffer: what VRAM holds, bypassing the
/// staging ring and its copy queue (a GPU kernel's view).
pub trait DeviceSide: Memory + Send + Sync + 'static {
    fn dev_read(&self, off: usize, len: usize) -> Vec<u8>;
    fn dev_write(&self, off: usize, data: &[u8]);
}

impl DeviceSide for StagedMemory<HostEngine> {
    fn dev_read(&self, off: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.device_alloc().device_view().read(off, &mut v).unwrap();
        v
    }
    fn dev_write(&self, off: usize, data: &[u8]) {
        self.device_alloc().device_view().write(off, data).unwrap();
    }
}

impl DeviceSide for StagedMemory<rnic_gpu::CudaEngine> {
    fn dev_read(&self, off: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.device_alloc().read_sync(off, &mut v).unwrap();
        v
    }
    fn dev_write(&self, off: usize, data: &[u8]) {
        self.device_alloc().write_sync(off, data).unwrap();
    }
}

/// Fresh loopback addresses per call (tests run in parallel).
pub fn ip_pair() -> (IpAddr, IpAddr) {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let b = 16 + (std::process::id() % 200) as u8;
    (
        IpAddr::V4(Ipv4Addr::new(127, b, (n % 250) as u8, 1)),
        IpAddr::V4(Ipv4Addr::new(127, b, (n % 250) as u8, 2)),
    )
}

/// One rxe side whose buffer is `mem`; `bytes`/`fill` go to `view`
/// (the device side for staged memory, the memory itself for host memory).
pub struct Side {
    pub dev: RxeDevice,
    pub ctx: Context,
    pub pd: ProtectionDomain,
    pub cq: Mutex<CompletionQueue>,
    pub mr: MemoryRegion,
    store: Box<dyn Store>,
}

/// Where a side's test bytes are read and written.
trait Store: Send + Sync {
    fn get(&self, off: usize, len: usize) -> Vec<u8>;
    fn put(&self, off: usize, data: &[u8]);
}

struct Host(Arc<HeapMemory>);

impl Store for Host {
    fn get(&self, off: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.0.read(off, &mut v).unwrap();
        v
    }
    fn put(&self, off: usize, data: &[u8]) {
        self.0.write(off, data).unwrap();
    }
}

struct Dev<M>(Arc<M>);

impl<M: DeviceSide> Store for Dev<M> {
    fn get(&self, off: usize, len: usize) -> Vec<u8> {
        self.0.dev_read(off, len)
    }
    fn put(&self, off: usize, data: &[u8]) {
        self.0.dev_write(off, data);
    }
}

impl Side {
    fn open(ip: IpAddr) -> (RxeDevice, Context, ProtectionDomain, Mutex<CompletionQueue>) {
        let dev = RxeDevice::open(&RxeConfig::new(Target::Ip(ip)).with_progress(Progress::Thread))
            .expect("open rxe");
        let ctx = dev.context();
        let pd = ctx.alloc_pd().unwrap();
        let cq = Mutex::new(ctx.create_cq(512).unwrap());
        (dev, ctx, pd, cq)
    }

    /// A side over ordinary host memory.
    pub fn host(ip: IpAddr, len: usize) -> Side {
        let (dev, ctx, pd, cq) = Side::open(ip);
        let mem = Arc::new(HeapMemory::new(len));
        let mr = pd.reg_mr(mem.clone(), ALL).unwrap();
        Side {
            dev,
            ctx,
            pd,
            cq,
            mr,
            store: Box::new(Host(mem)),
        }
    }

    /// A side over staged device memory, checked on the device side.
    pub fn device<M: DeviceSide>(ip: IpAddr, mem: Arc<M>) -> Side {
        let (dev, ctx, pd, cq) = Side::open(ip);
        let mr = pd.reg_mr(mem.clone(), ALL).unwrap();
        Side {
            dev,
            ctx,
            pd,
            cq,
            mr,
            store: Box::new(Dev(mem)),
        }
    }

    pub fn qp(&self) -> QueuePair {
        let caps = QpCaps {
            max_send_wr: 128,
            max_recv_wr: 128,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline_data: 64,
        };
        let cq = self.cq.lock().unwrap();
        self.pd
            .create_qp(&cq, &cq, &QpInitAttr::new(QpType::Rc, caps))
            .unwrap()
    }
}

impl rnic_testkit::Endpoint for Side {
    fn mr(&self) -> &MemoryRegion {
        &self.mr
    }
    fn fill(&self, off: usize, data: &[u8]) {
        self.store.put(off, data);
    }
    fn bytes(&self, off: usize, len: usize) -> Vec<u8> {
        self.store.get(off, len)
    }
    fn wait(&self, _peer: &Side, n: usize) -> Vec<WorkCompletion> {
        let mut out = Vec::new();
        let mut wcs = [WorkCompletion::default(); 16];
        let start = Instant::now();
        while out.len() < n {
            let got = self.cq.lock().unwrap().poll(&mut wcs).unwrap();
            out.extend_from_slice(&wcs[..got]);
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "timed out with {} of {n} completions: {out:?}",
                out.len()
            );
        }
        out
    }
}

/// Connect `qa` on `a` and `qb` on `b` as an RC pair at `mtu`.
pub fn connect(a: &Side, qa: &mut QueuePair, b: &Side, qb: &mut QueuePair, mtu: Mtu) {
    let init = InitParams {
        access: ALL,
        ..InitParams::default()
    };
    let rtr = RtrParams {
        path_mtu: mtu,
        max_dest_rd_atomic: 16,
        ..RtrParams::default()
    };
    let rts = RtsParams {
        max_rd_atomic: 16,
        ..RtsParams::default()
    };
    let (pa, pb) = (Psn::from_wire(0x1000), Psn::from_wire(0xabcdef));
    qa.to_init(&init).unwrap();
    qb.to_init(&init).unwrap();
    qb.to_rtr(qa.qpn(), pa, a.dev.gids()[0], &rtr).unwrap();
    qb.to_rts(pb, &rts).unwrap();
    qa.to_rtr(qb.qpn(), pb, b.dev.gids()[0], &rtr).unwrap();
    qa.to_rts(pa, &rts).unwrap();
}

/// The RC conformance sequence from host memory on `a` into device memory
/// `mem` on `b`: every WRITE (with immediate: its completion is checked
/// against the device's bytes), SEND, READ (of what the device holds) and
/// atomic, at the sizes around `mtu`.
pub fn conformance_into_device<M: DeviceSide>(mem: Arc<M>, mtu: Mtu) {
    let (ia, ib) = ip_pair();
    let a = Side::host(ia, 4 * rnic_testkit::MIB + 4096);
    let b = Side::device(ib, mem);
    let (mut qa, mut qb) = (a.qp(), b.qp());
    connect(&a, &mut qa, &b, &mut qb, mtu);
    rnic_testkit::every_rc_op(&a, &mut qa, &b, &mut qb, &rnic_testkit::sizes(mtu));
}
