//! Devices, registered buffers and queue pairs for the two nodes.

use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rnic::core::exchange::QpEndpoint;
use rnic::core::{
    AccessFlags, CompletionQueue, Context, Gid, InitParams, Memory, Mtu, ProtectionDomain, Psn,
    QpCaps, QpInitAttr, QpType, QueuePair, RtrParams, RtsParams,
};
use rnic::rxe::{FaultConfig, Progress, RxeConfig, RxeDevice, Target};
use rnic::{DeviceSpec, RxeTarget};
use rnic_dma::{DmaRegion, NodeId, OnMismatch, PagePolicy, PageSize};

use crate::KvError;
use crate::layout::Msg;

/// An open device: its verbs context and, for rxe, the device (counters).
#[derive(Debug)]
pub struct Device {
    /// The verbs entry point.
    pub ctx: Context,
    /// The rxe device behind it, when the backend is rxe.
    pub rxe: Option<RxeDevice>,
    /// The spec it was opened from.
    pub spec: String,
    /// Where its registrable memory comes from (host memory for rxe, the
    /// function's DMA buffers for mlx5).
    pub memory: rnic::MemorySource,
}

impl Device {
    /// Open `spec` (`rxe`, `rxe:<ip|netdev>`, `mlx5:<bdf>@<ip>`,
    /// `mlx5:vfio-user:<socket>@<ip>`). rxe devices run
    /// their progress thread (so transfers advance while the caller
    /// computes) and inject `faults` on their receive path.
    pub fn open(spec: &str, faults: FaultConfig) -> Result<Device, KvError> {
        let open_err = |reason: String| KvError::Open {
            spec: spec.to_owned(),
            reason,
        };
        let parsed = spec
            .parse::<DeviceSpec>()
            .map_err(|e| open_err(e.to_string()))?;
        match parsed {
            DeviceSpec::Rxe(t) => {
                let target = match t {
                    RxeTarget::Netdev(n) => Target::Netdev(n),
                    RxeTarget::Ip(ip) => Target::Ip(ip),
                };
                let cfg = RxeConfig::new(target)
                    .with_progress(Progress::Thread)
                    .with_faults(faults);
                let dev = RxeDevice::open(&cfg).map_err(|e| open_err(e.to_string()))?;
                Ok(Device {
                    ctx: dev.context(),
                    rxe: Some(dev),
                    spec: spec.to_owned(),
                    memory: rnic::MemorySource::Host,
                })
            }
            _ => {
                let (ctx, memory) =
                    rnic::open_with_memory(spec).map_err(|e| open_err(e.cause()))?;
                Ok(Device {
                    ctx,
                    rxe: None,
                    spec: spec.to_owned(),
                    memory,
                })
            }
        }
    }

    /// The GID to use: the first IPv4-mapped entry, else entry 0.
    pub fn gid(&self) -> Result<(u8, Gid), KvError> {
        let table = self
            .ctx
            .query_gid_table(1)
            .map_err(KvError::verbs("query_gid_table"))?;
        let pick = table
            .iter()
            .find(|g| g.gid.raw()[..12] == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff])
            .or_else(|| table.first())
            .ok_or_else(|| KvError::Open {
                spec: self.spec.clone(),
                reason: "the device has no GID".into(),
            })?;
        Ok((u8::try_from(pick.index).unwrap_or(0), pick.gid))
    }

    /// The path MTU to use: the port's active MTU, at most 4096.
    pub fn path_mtu(&self) -> Mtu {
        self.ctx
            .query_port(1)
            .map(|p| p.active_mtu)
            .unwrap_or(Mtu::Mtu1024)
            .min(Mtu::Mtu4096)
    }

    /// A registrable buffer of `len` bytes for this device: [`alloc_buffer`]
    /// on host-memory backends, the function's own DMA memory on mlx5.
    pub fn alloc_buffer(
        &self,
        len: usize,
        node: Option<u32>,
    ) -> Result<(Arc<dyn Memory>, Placement), KvError> {
        match &self.memory {
            rnic::MemorySource::Host => Ok(alloc_buffer(len, node)),
            other => {
                let mem = other.alloc(len.max(8)).map_err(|e| KvError::Open {
                    spec: self.spec.clone(),
                    reason: format!("{e}: {}", e.source),
                })?;
                Ok((
                    mem,
                    Placement {
                        kind: "device",
                        page_size: 4096,
                        node: None,
                        pinned: false,
                    },
                ))
            }
        }
    }

    /// Injected faults so far (rxe only): (dropped, reordered).
    pub fn fault_counts(&self) -> (u64, u64) {
        self.rxe.as_ref().map_or((0, 0), |d| {
            let s = d.stats().device;
            (s.fault_drops, s.fault_reordered)
        })
    }

    /// Transport retransmissions of every QP so far (rxe only).
    pub fn retransmits(&self) -> u64 {
        self.rxe.as_ref().map_or(0, |d| {
            d.stats().qps.iter().map(|(_, s)| s.retransmits).sum()
        })
    }
}

/// Where a KV buffer's memory came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// `"dma"` (rnic-dma region: NUMA-verified, hugepages where available),
    /// `"heap"` (the fallback), `"device"` (an mlx5 function's own DMA
    /// memory, the only memory it registers), `"vram"` (a GPU's memory,
    /// staged; page size, node and pinning are the staging ring's) or
    /// `"vram-emulated"` (host memory behind the same staging).
    pub kind: &'static str,
    /// Page size in bytes.
    pub page_size: usize,
    /// The NUMA node the pages were verified on, if known.
    pub node: Option<u32>,
    /// Whether the pages are pinned (mlocked).
    pub pinned: bool,
}

/// The KV region of `len` bytes in `spec`'s memory: host memory as
/// [`Device::alloc_buffer`] gives it (or [`alloc_buffer`] without a device),
/// or a GPU's VRAM staged through a hugepage ring registered with CUDA on
/// the GPU's node (`node` overrides it), which rxe registers like any memory.
/// A DMA device (mlx5) cannot reach staged VRAM: that is refused here, with
/// why.
pub fn alloc_kv_region(
    spec: rnic::gpu::MemorySpec,
    dev: Option<&Device>,
    len: usize,
    node: Option<u32>,
) -> Result<(Arc<dyn Memory>, Placement), KvError> {
    use rnic::gpu::{Gpu, HostEngine, MemorySpec, StagedMemory, StagingConfig};
    let config = StagingConfig {
        node: node.map(NodeId),
        ..StagingConfig::default()
    };
    let placed = |staging: &DmaRegion, kind: &'static str| Placement {
        kind,
        page_size: staging.page_size().bytes(),
        node: staging.stats().node_verified.map(|n| n.0),
        pinned: staging.stats().pinned,
    };
    if spec != MemorySpec::Host
        && let Some(d) = dev
        && !matches!(d.memory, rnic::MemorySource::Host)
    {
        return Err(KvError::Open {
            spec: d.spec.clone(),
            reason: format!(
                "--kv-memory {spec}: a DMA device reaches VRAM only through a peer-BAR region, \
                 which rnic does not build for GPUs yet (docs/gpu.md); use an rxe device, or \
                 --kv-memory host"
            ),
        });
    }
    match spec {
        MemorySpec::Host => match dev {
            Some(d) => d.alloc_buffer(len, node),
            None => Ok(alloc_buffer(len, node)),
        },
        MemorySpec::Gpu(n) => {
            let mem = Gpu::open(n)?.staged_memory(len.max(8), config)?;
            let p = placed(&mem.staging(), "vram");
            Ok((Arc::new(mem), p))
        }
        MemorySpec::Emulated => {
            let mem = StagedMemory::new(&HostEngine::new(), len.max(8), config)?;
            let p = placed(&mem.staging(), "vram-emulated");
            Ok((Arc::new(mem), p))
        }
    }
}

/// A registrable buffer of `len` bytes: an rnic-dma region on `node` (or
/// wherever the allocating thread runs) — pinned when the memlock limit
/// allows — else plain heap memory.
pub fn alloc_buffer(len: usize, node: Option<u32>) -> (Arc<dyn Memory>, Placement) {
    let len = len.max(8);
    for pin in [true, false] {
        let mut b = DmaRegion::builder(len)
            .pages(PagePolicy::Prefer(PageSize::Huge2M))
            .pin(pin)
            .on_mismatch(OnMismatch::Warn);
        if let Some(n) = node {
            b = b.node(NodeId(n));
        }
        if let Ok(r) = b.build() {
            let st = r.stats();
            let placement = Placement {
                kind: "dma",
                page_size: st.page_size.bytes(),
                node: st.node_verified.map(|n| n.0),
                pinned: st.pinned,
            };
            return (r as Arc<dyn Memory>, placement);
        }
    }
    // The application's own heap allocation, registered as it is.
    let placement = Placement {
        kind: "owned",
        page_size: 4096,
        node: None,
        pinned: false,
    };
    (rnic_dma::OwnedBuffer::zeroed(len), placement)
}

/// An RC queue pair with its CQ (send and receive share it).
#[derive(Debug)]
pub struct Rc {
    /// The queue pair.
    pub qp: QueuePair,
    /// Its completion queue.
    pub cq: CompletionQueue,
    /// Our endpoint (what the peer needs).
    pub local: QpEndpoint,
    sgid_index: u8,
    mtu: Mtu,
    /// Regions the peer writes into: no local request names them, so the QP
    /// does not retain them itself; declared after `qp`, they are dropped
    /// (deregistered) after it.
    pub peer_regions: Vec<rnic::core::MemoryRegion>,
}

impl Rc {
    /// Create a QP for `sends` outstanding sends and `recvs` receives, in
    /// INIT with `access` rights for the peer.
    pub fn new(
        dev: &Device,
        pd: &ProtectionDomain,
        sends: u32,
        recvs: u32,
        access: AccessFlags,
    ) -> Result<Rc, KvError> {
        // An mlx5 function also wants room for its power-of-two queues
        // (WQEBBs); a deeper CQ costs rxe nothing.
        let depth = (sends + recvs + 1)
            .max(sends.max(1).next_power_of_two() + recvs.max(4).next_power_of_two() + 16);
        let cq = dev
            .ctx
            .create_cq(depth)
            .map_err(KvError::verbs("create_cq"))?;
        let caps = QpCaps {
            max_send_wr: sends.max(1),
            max_recv_wr: recvs.max(1),
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let mut qp = pd
            .create_qp(&cq, &cq, &QpInitAttr::new(QpType::Rc, caps))
            .map_err(KvError::verbs("create_qp"))?;
        qp.to_init(&InitParams {
            access,
            ..InitParams::default()
        })
        .map_err(KvError::verbs("modify_qp to INIT"))?;
        let (sgid_index, gid) = dev.gid()?;
        let local = QpEndpoint {
            lid: 0,
            qpn: qp.qpn(),
            psn: Psn::from_wire(random_psn()),
            gid,
        };
        Ok(Rc {
            qp,
            cq,
            local,
            sgid_index,
            mtu: dev.path_mtu(),
            peer_regions: Vec::new(),
        })
    }

    /// `m` with this QP's endpoint (`qpn`, `psn`, `gid`) and its path MTU
    /// (`mtu`, bytes).
    pub fn endpoint_fields(&self, m: Msg) -> Msg {
        endpoint_fields(m, &self.local).with("mtu", self.mtu.bytes())
    }

    /// Move to RTR and RTS towards the endpoint in `m`, at the smaller of
    /// the two path MTUs (an mlx5 function's is at most 1024, rxe's 4096).
    pub fn connect_to(&mut self, m: &Msg) -> Result<(), KvError> {
        let remote = endpoint_of(m)?;
        if let Some(theirs) = m.u32("mtu").ok().and_then(|b| Mtu::from_bytes(b).ok()) {
            self.mtu = self.mtu.min(theirs);
        }
        self.connect(&remote)
    }

    /// Move to RTR and RTS towards `remote`.
    pub fn connect(&mut self, remote: &QpEndpoint) -> Result<(), KvError> {
        let rtr = RtrParams {
            path_mtu: self.mtu,
            sgid_index: self.sgid_index,
            ..RtrParams::default()
        };
        self.qp
            .to_rtr(remote.qpn, remote.psn, remote.gid, &rtr)
            .map_err(KvError::verbs("modify_qp to RTR"))?;
        // Retry budget: 6 retries of a ~268 ms ACK timer (7 would mean
        // "forever", as in rxe) — a dead peer fails the stream in under
        // two seconds, while loss with progress never exhausts it.
        let rts = RtsParams {
            timeout: 16,
            retry_cnt: 6,
            ..RtsParams::default()
        };
        self.qp
            .to_rts(self.local.psn, &rts)
            .map_err(KvError::verbs("modify_qp to RTS"))
    }
}

/// Add `qpn`, `psn`, `gid` fields for `ep`.
pub fn endpoint_fields(m: Msg, ep: &QpEndpoint) -> Msg {
    m.with("qpn", ep.qpn.get())
        .with("psn", ep.psn.get())
        .with("gid", ep.gid.to_hex())
}

/// The endpoint in a message's `qpn`, `psn`, `gid` fields.
pub fn endpoint_of(m: &Msg) -> Result<QpEndpoint, KvError> {
    let gid = Gid::from_hex(m.str("gid")?).map_err(|e| KvError::Protocol {
        reason: format!("bad gid: {e}"),
    })?;
    Ok(QpEndpoint {
        lid: 0,
        qpn: rnic::core::Qpn::from_wire(m.u32("qpn")?),
        psn: Psn::from_wire(m.u32("psn")?),
        gid,
    })
}

/// Accept one connection on `listener` within `timeout`.
pub fn accept_within(listener: &TcpListener, timeout: Duration) -> Result<TcpStream, KvError> {
    listener
        .set_nonblocking(true)
        .map_err(KvError::io("making the listener non-blocking"))?;
    let deadline = Instant::now() + timeout;
    loop {
        match listener.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false)
                    .map_err(KvError::io("configuring the control socket"))?;
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(KvError::Timeout {
                        what: "waiting for a prefill node to connect",
                        after: timeout,
                    });
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => {
                return Err(KvError::Io {
                    step: "accepting the prefill node",
                    source: e,
                });
            }
        }
    }
}

/// Connect to `addr` within `timeout`.
pub fn connect_within(addr: &str, timeout: Duration) -> Result<TcpStream, KvError> {
    let addrs: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(KvError::io("resolving the decode node's address"))?
        .collect();
    let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
    for a in addrs {
        match TcpStream::connect_timeout(&a, timeout) {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            Err(e) => last = e,
        }
    }
    Err(KvError::Io {
        step: "connecting to the decode node (is it listening?)",
        source: last,
    })
}

/// A PSN from the clock and the process id.
pub fn random_psn() -> u32 {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| {
            d.subsec_nanos() ^ (d.as_secs() as u32).rotate_left(13)
        });
    (n ^ std::process::id().rotate_left(7)) & 0xFF_FFFF
}

/// Two loopback addresses for a same-host pair: `127.<b>.<c>.1` and `.2`,
/// distinct per process and call, so parallel pairs never share UDP/4791.
pub fn loopback_pair() -> (IpAddr, IpAddr) {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let b = 100 + (std::process::id() % 100) as u8;
    let c = (n % 250) as u8 + 1;
    (IpAddr::from([127, b, c, 1]), IpAddr::from([127, b, c, 2]))
}
