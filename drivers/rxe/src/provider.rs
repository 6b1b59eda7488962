//! [`RxeDevice`]: opening a device, its progress thread, and the
//! [`Provider`] implementation.

use std::collections::VecDeque;
use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};
use rnic_core::{
    AccessFlags, AddressVector, AtomicCap, Context, CqHandle, CqInfo, DeviceAttr, Gid, GidEntry,
    GidType, LinkLayer, Lkey, Memory, MrHandle, MrInfo, Mtu, PdHandle, PortAttr, PortState,
    PostError, Provider, QpAttr, QpAttrMask, QpHandle, QpInfo, QpInitAttr, QpState, RecvWr, SendWr,
    VerbsError, WorkCompletion, WrError,
};
use rnic_roce::transport::{CqSide, DEFAULT_MAX_UNACKED_PSNS, Qp, QpConfig, TransportError};

use crate::device::{CqState, MrEntry, Progress, QpEntry, Shared, State};
use crate::error::RxeError;
use crate::fault::FaultConfig;
use crate::gid::{self, Target};
use crate::port::Port;
use crate::stats::RxeStats;
use crate::sys;

/// How to open an rxe device.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RxeConfig {
    /// The interface or address.
    pub target: Target,
    /// Progress thread or caller-driven.
    pub progress: Progress,
    /// The UDP port RoCE uses (4791; others only talk to rnic peers
    /// configured the same way).
    pub roce_port: u16,
    /// Use UDP GSO where the kernel has it.
    pub gso: bool,
    /// Use UDP GRO where the kernel has it.
    pub gro: bool,
    /// Send each connection from rxe's per-QP UDP source port (else from
    /// the RoCE port itself).
    pub per_qp_sport: bool,
    /// Seeded loss/reordering on the receive path (off by default).
    pub faults: FaultConfig,
    /// Each RC QP's requester window in PSNs (see
    /// [`QpConfig::max_unacked_psns`]). The default, rxe's 128, is what a
    /// kernel rxe peer expects; between rnic devices with large socket
    /// buffers 1024 (4 MiB at MTU 4096) keeps a fast link busy.
    pub max_unacked_psns: u32,
    /// Open an IPv4 identification tap per IPv4 address (a raw socket, needs
    /// CAP_NET_RAW; see `Port::tap`), so that every ICRC is checked in all
    /// 32 bits even when the sender's IPv4 identification is unpredictable.
    pub ident_tap: bool,
    /// Where a packet's identification was neither predicted nor tapped,
    /// accept it after solving the ICRC for the identification: only a
    /// 15-bit check. Off by default (such packets are dropped and counted in
    /// `icrc_unverified`); `RNIC_RXE_IDENT_RECOVERY=1` turns it on for
    /// devices opened with [`RxeConfig::new`]. `rnicctl doctor` reports it.
    pub ident_recovery: bool,
}

impl RxeConfig {
    /// Defaults for `target`: progress thread, UDP/4791, GSO, GRO and
    /// per-QP source ports on.
    pub fn new(target: Target) -> RxeConfig {
        RxeConfig {
            target,
            progress: Progress::Thread,
            roce_port: 4791,
            gso: true,
            gro: true,
            per_qp_sport: true,
            faults: FaultConfig::default(),
            max_unacked_psns: DEFAULT_MAX_UNACKED_PSNS,
            ident_tap: true,
            ident_recovery: ident_recovery_from_env(),
        }
    }

    /// The same, with the identification tap on or off (see
    /// [`RxeConfig::ident_tap`]).
    #[must_use]
    pub fn with_ident_tap(mut self, on: bool) -> RxeConfig {
        self.ident_tap = on;
        self
    }

    /// The same, with the 15-bit identification recovery on or off (see
    /// [`RxeConfig::ident_recovery`]).
    #[must_use]
    pub fn with_ident_recovery(mut self, on: bool) -> RxeConfig {
        self.ident_recovery = on;
        self
    }

    /// The same, with `progress`.
    #[must_use]
    pub fn with_progress(mut self, progress: Progress) -> RxeConfig {
        self.progress = progress;
        self
    }

    /// The same, with a requester window of `psns` per RC QP (see
    /// [`RxeConfig::max_unacked_psns`]).
    #[must_use]
    pub fn with_max_unacked_psns(mut self, psns: u32) -> RxeConfig {
        self.max_unacked_psns = psns;
        self
    }

    /// The same, with receive-path fault injection `faults`.
    #[must_use]
    pub fn with_faults(mut self, faults: FaultConfig) -> RxeConfig {
        self.faults = faults;
        self
    }
}

/// `RNIC_RXE_IDENT_RECOVERY=1` (or `true`/`yes`/`on`): opt in to the 15-bit
/// ICRC check for packets whose identification could not be known.
pub fn ident_recovery_from_env() -> bool {
    std::env::var("RNIC_RXE_IDENT_RECOVERY").is_ok_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "1" | "true" | "yes" | "on"
        )
    })
}

/// The provider object behind a [`Context`]; stops its thread when dropped.
#[derive(Debug)]
pub struct Inner {
    sh: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.sh.stop.store(true, Ordering::Release);
        let _ = self.sh.doorbell.write(1);
        let handle = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(h) = handle {
            let _ = h.join();
        }
    }
}

/// An open rxe device. Cheap to clone; [`RxeDevice::context`] gives the
/// verbs entry point.
#[derive(Debug, Clone)]
pub struct RxeDevice {
    inner: Arc<Inner>,
}

impl RxeDevice {
    /// Resolve the GIDs, bind UDP/4791 on each address, probe GSO/GRO and
    /// start the progress thread (in [`Progress::Thread`] mode).
    pub fn open(cfg: &RxeConfig) -> Result<RxeDevice, RxeError> {
        let addrs = gid::resolve(&cfg.target)?;
        let ports = addrs
            .iter()
            .map(|a| Port::bind(a, cfg.roce_port, cfg.gro, cfg.ident_tap))
            .collect::<Result<Vec<_>, _>>()?;
        let gso = cfg.gso && ports.iter().all(|p| sys::probe_gso(&p.sock));
        let gro = ports.iter().any(|p| p.gro);
        let active_mtu = gid::active_mtu(addrs.first().and_then(|a| a.netdev_mtu));
        let doorbell =
            EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
                .map_err(|source| RxeError::Event {
                    what: "the doorbell eventfd",
                    source,
                })?;
        let sh = Arc::new(Shared {
            state: Mutex::new(State::new(
                gso,
                gro,
                cfg.per_qp_sport,
                cfg.faults,
                cfg.ident_recovery,
            )),
            ports,
            roce_port: cfg.roce_port,
            active_mtu,
            progress: cfg.progress,
            max_unacked_psns: cfg.max_unacked_psns,
            doorbell,
            stop: AtomicBool::new(false),
            epoch: std::time::Instant::now(),
        });
        tracing::info!(
            target = ?cfg.target,
            gids = sh.ports.len(),
            gso,
            gro,
            mtu = active_mtu.bytes(),
            progress = ?cfg.progress,
            "rxe device open"
        );
        let thread = match cfg.progress {
            Progress::Caller => None,
            Progress::Thread => {
                let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(|source| {
                    RxeError::Event {
                        what: "the progress thread's epoll set",
                        source,
                    }
                })?;
                for (i, p) in sh.ports.iter().enumerate() {
                    epoll
                        .add(&p.sock, EpollEvent::new(EpollFlags::EPOLLIN, i as u64))
                        .map_err(|source| RxeError::Event {
                            what: "the epoll registration of a socket",
                            source,
                        })?;
                }
                epoll
                    .add(
                        sh.doorbell.as_fd(),
                        EpollEvent::new(EpollFlags::EPOLLIN, u64::MAX),
                    )
                    .map_err(|source| RxeError::Event {
                        what: "the epoll registration of the doorbell",
                        source,
                    })?;
                let t = Arc::clone(&sh);
                Some(
                    std::thread::Builder::new()
                        .name("rnic-rxe".into())
                        .spawn(move || progress_thread(&t, &epoll))
                        .map_err(RxeError::Thread)?,
                )
            }
        };
        Ok(RxeDevice {
            inner: Arc::new(Inner {
                sh,
                thread: Mutex::new(thread),
            }),
        })
    }

    /// The verbs context of this device.
    pub fn context(&self) -> Context {
        Context::new(Arc::clone(&self.inner) as Arc<dyn Provider>)
    }

    /// The GID table (index = position).
    pub fn gids(&self) -> Vec<Gid> {
        self.inner.sh.ports.iter().map(|p| p.gid).collect()
    }

    /// The path MTU the link allows.
    pub fn active_mtu(&self) -> Mtu {
        self.inner.sh.active_mtu
    }

    /// Whether sends use UDP GSO.
    pub fn gso(&self) -> bool {
        self.inner.sh.lock().tx.gso
    }

    /// Whether receives use UDP GRO.
    pub fn gro(&self) -> bool {
        self.inner.sh.ports.iter().any(|p| p.gro)
    }

    /// The device's and every QP's counters.
    pub fn stats(&self) -> RxeStats {
        let st = self.inner.sh.lock();
        RxeStats {
            device: st.device_stats(),
            qps: st.qps.iter().map(|e| (e.qp.qpn(), *e.qp.stats())).collect(),
        }
    }

    /// Run one round of progress now (receive, timers, flush); returns the
    /// datagrams received. Caller-driven applications that do not poll a
    /// CQ of this device call it to keep its responder going. In
    /// caller-driven mode a round whose only output is ACKs leaves them for
    /// the next call into the device (progress, poll, send post or wait),
    /// which sends them with its own packets; keep calling while peers
    /// wait for ACKs.
    pub fn progress(&self) -> usize {
        let sh = &self.inner.sh;
        sh.lock()
            .progress(sh, 1024, sh.progress == Progress::Caller)
    }
}

/// The progress thread: block in `epoll_wait` (sockets, doorbell, the
/// nearest timer) only after a round that received nothing; while datagrams
/// keep arriving, run round after round without the wait and without
/// touching the doorbell (two system calls per round saved under load).
fn progress_thread(sh: &Arc<Shared>, epoll: &Epoll) {
    let mut events = [EpollEvent::empty(); 8];
    let mut busy = false;
    while !sh.stop.load(Ordering::Acquire) {
        if !busy {
            let timeout_ms: u16 = {
                let st = sh.lock();
                match st.next_deadline {
                    None => 1000,
                    Some(d) => {
                        let now = sh.now().nanos();
                        let left = d.nanos().saturating_sub(now);
                        u16::try_from(left.div_ceil(1_000_000).min(1000)).unwrap_or(1000)
                    }
                }
            };
            if timeout_ms > 0 {
                let n = epoll
                    .wait(&mut events, EpollTimeout::from(timeout_ms))
                    .unwrap_or(0);
                if events[..n].iter().any(|e| e.data() == u64::MAX) {
                    let _ = sh.doorbell.read();
                }
            }
            if sh.stop.load(Ordering::Acquire) {
                break;
            }
        }
        busy = sh.lock().progress(sh, 256, false) > 0;
    }
}

fn transport_to_post(e: TransportError, qp: &QpEntry) -> PostError {
    match e {
        TransportError::QueueFull(side) => {
            let (outstanding, capacity) = match side {
                CqSide::Send => (qp.qp.send_outstanding(), qp.caps.max_send_wr),
                CqSide::Recv => (qp.qp.recv_outstanding(), qp.caps.max_recv_wr),
            };
            PostError::QueueFull {
                outstanding,
                capacity,
                requested: 1,
            }
        }
        TransportError::BadState(state) => PostError::QpState { state },
        TransportError::TooManySge { got, max } => PostError::InvalidWr(WrError::TooManySges {
            count: got,
            max: u32::try_from(max).unwrap_or(u32::MAX),
        }),
        TransportError::InlineTooLong { got, max } => {
            PostError::InvalidWr(WrError::InlineTooLarge {
                len: got,
                max: u32::try_from(max).unwrap_or(u32::MAX),
            })
        }
        TransportError::BadOpForQpType(qp_type) => PostError::InvalidWr(WrError::OpNotSupported {
            op: "this operation",
            qp_type,
        }),
        TransportError::InlineRead(_) => {
            PostError::Device("inline data unreadable: check the SGE's L_Key and bounds")
        }
        _ => PostError::Device("the transport refused the request"),
    }
}

/// Why an address vector cannot be sent on from a device's GID table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AvProblem {
    /// `sgid_index` is past the end of the GID table.
    NoSuchSgid,
    /// The source and destination GIDs are of different IP families.
    Family,
    /// An IPv6 link-local destination from a source without a scope.
    LinkLocal,
}

impl AvProblem {
    /// What is wrong with `av` when sent from `ports` (the GID table), if
    /// anything. `Sink::route` would drop every packet of such an address
    /// vector (counted as `tx_bad_sgid`, or as a send error): refusing it
    /// up front gives the caller a reason instead of a retry timeout.
    fn of(ports: &[Port], av: &AddressVector) -> Option<AvProblem> {
        let Some(local) = ports.get(usize::from(av.sgid_index)) else {
            return Some(AvProblem::NoSuchSgid);
        };
        match (local.ip, av.dgid.to_ip()) {
            (IpAddr::V4(_), IpAddr::V4(_)) => None,
            (IpAddr::V6(_), IpAddr::V6(d)) if gid::is_link_local(&d) && local.scope_id == 0 => {
                Some(AvProblem::LinkLocal)
            }
            (IpAddr::V6(_), IpAddr::V6(_)) => None,
            _ => Some(AvProblem::Family),
        }
    }

    /// The short form, for a refused work request.
    fn summary(self) -> &'static str {
        match self {
            AvProblem::NoSuchSgid => {
                "the UD destination's sgid_index is not in this device's GID table \
                 (query_gid_table lists it)"
            }
            AvProblem::Family => {
                "the UD destination's GID and the GID at its sgid_index are of different IP \
                 families: RoCEv2 does not cross IPv4 and IPv6; pick a source GID of the \
                 destination's family"
            }
            AvProblem::LinkLocal => {
                "the UD destination is IPv6 link-local, reachable only from a link-local source \
                 GID: use the index of this device's link-local GID"
            }
        }
    }

    /// The long form, naming the GIDs, for a refused modify.
    fn explain(self, ports: &[Port], av: &AddressVector) -> String {
        let family = |ip: IpAddr| if ip.is_ipv4() { "IPv4" } else { "IPv6" };
        let table = ports
            .iter()
            .enumerate()
            .map(|(i, p)| format!("{i}: {}", p.gid))
            .collect::<Vec<_>>()
            .join(", ");
        let dip = av.dgid.to_ip();
        let i = av.sgid_index;
        let sgid = ports.get(usize::from(i)).map_or(Gid::ZERO, |p| p.gid);
        match self {
            AvProblem::NoSuchSgid => format!(
                "sgid_index {i} is not in this device's GID table ({table}); use one of those \
                 indices"
            ),
            AvProblem::Family => format!(
                "sgid_index {i} is {sgid} ({}) but the destination GID {} is {}: RoCEv2 does not \
                 cross IPv4 and IPv6; use the index of a source GID of the destination's family \
                 (GID table: {table})",
                family(sgid.to_ip()),
                av.dgid,
                family(dip),
            ),
            AvProblem::LinkLocal => format!(
                "the destination GID {} is IPv6 link-local, reachable only from a link-local \
                 source GID (whose interface is the scope), but sgid_index {i} is {sgid}; use the \
                 index of this device's link-local GID (GID table: {table})",
                av.dgid
            ),
        }
    }
}

fn no_such(what: &'static str) -> String {
    format!("no such {what} on this rxe device (already destroyed, or from another device)")
}

impl Inner {
    fn sh(&self) -> &Shared {
        &self.sh
    }
}

impl Provider for Inner {
    fn backend(&self) -> &'static str {
        "rxe"
    }

    fn query_device(&self) -> Result<DeviceAttr, VerbsError> {
        let guid = self.sh().ports.first().map_or(0, |p| {
            u64::from_be_bytes(p.gid.raw()[8..16].try_into().unwrap_or([0; 8]))
        });
        Ok(DeviceAttr {
            fw_ver: concat!("rnic-rxe ", env!("CARGO_PKG_VERSION")).to_owned(),
            vendor_id: 0,
            vendor_part_id: 0,
            node_guid: guid,
            max_qp: 0x1_0000,
            max_qp_wr: 0x4000,
            max_sge: 32,
            max_cq: 0x4000,
            max_cqe: 0x8000,
            max_mr: 0x8000,
            max_mr_size: u64::MAX,
            max_qp_rd_atom: 128,
            max_qp_init_rd_atom: 128,
            max_inline_data: 400,
            atomic_cap: AtomicCap::Hca,
            phys_port_cnt: 1,
        })
    }

    fn query_port(&self, port_num: u8) -> Result<PortAttr, VerbsError> {
        if port_num != 1 {
            return Err(VerbsError::QueryPort {
                port: port_num,
                reason: "an rxe device has one port, number 1".into(),
            });
        }
        Ok(PortAttr {
            state: PortState::Active,
            max_mtu: Mtu::Mtu4096,
            active_mtu: self.sh().active_mtu,
            gid_tbl_len: u32::try_from(self.sh().ports.len()).unwrap_or(u32::MAX),
            link_layer: LinkLayer::Ethernet,
            active_width: 1,
            active_speed_mbps: 10_000,
            max_msg_sz: 1 << 31,
        })
    }

    fn query_gid_table(&self, port_num: u8) -> Result<Vec<GidEntry>, VerbsError> {
        if port_num != 1 {
            return Err(VerbsError::QueryGid {
                port: port_num,
                reason: "an rxe device has one port, number 1".into(),
            });
        }
        Ok(self
            .sh()
            .ports
            .iter()
            .enumerate()
            .map(|(i, p)| GidEntry {
                index: i as u32,
                gid: p.gid,
                gid_type: GidType::RoceV2,
                netdev: p.netdev.clone(),
            })
            .collect())
    }

    fn alloc_pd(&self) -> Result<PdHandle, VerbsError> {
        Ok(PdHandle(self.sh().lock().pds.insert(())))
    }

    fn dealloc_pd(&self, pd: PdHandle) -> Result<(), VerbsError> {
        self.sh()
            .lock()
            .pds
            .remove(pd.0)
            .ok_or_else(|| VerbsError::DeallocPd {
                pd,
                reason: no_such("protection domain"),
            })
    }

    fn reg_mr(
        &self,
        pd: PdHandle,
        memory: Arc<dyn Memory>,
        access: AccessFlags,
    ) -> Result<MrInfo, VerbsError> {
        let len = memory.len();
        let err = |reason: String| VerbsError::RegMr {
            len,
            access,
            reason,
        };
        let mut st = self.sh().lock();
        if st.pds.get(pd.0).is_none() {
            return Err(err(no_such("protection domain")));
        }
        if len == 0 {
            return Err(err(
                "an empty region cannot be registered: register at least one byte".into(),
            ));
        }
        let keys = st
            .keys
            .register(memory, 0, len as u64, pd, access)
            .map_err(|e| err(e.to_string()))?;
        let handle = MrHandle(st.mrs.insert(MrEntry {
            key: keys.lkey.get(),
        }));
        Ok(MrInfo {
            handle,
            lkey: keys.lkey,
            rkey: keys.rkey,
            addr: keys.start,
            len,
        })
    }

    fn dereg_mr(&self, mr: MrHandle) -> Result<(), VerbsError> {
        let mut st = self.sh().lock();
        let e = st.mrs.remove(mr.0).ok_or_else(|| VerbsError::DeregMr {
            mr,
            reason: no_such("memory region"),
        })?;
        // A key a peer already invalidated (SEND with invalidate) is gone.
        let _ = st.keys.invalidate(Lkey(e.key));
        Ok(())
    }

    fn create_cq(&self, depth: u32) -> Result<CqInfo, VerbsError> {
        let depth = depth.max(1);
        if depth > 0x8000 {
            return Err(VerbsError::CreateCq {
                depth,
                reason: "an rxe CQ holds at most 32768 entries".into(),
            });
        }
        let event =
            EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
                .map_err(|e| VerbsError::CreateCq {
                    depth,
                    reason: format!("eventfd: {e} (check ulimit -n)"),
                })?;
        let h = self.sh().lock().cqs.insert(CqState {
            ring: VecDeque::with_capacity(depth as usize),
            depth,
            armed: false,
            event: Arc::new(event),
            overflows: 0,
        });
        Ok(CqInfo {
            handle: CqHandle(h),
            depth,
        })
    }

    fn destroy_cq(&self, cq: CqHandle) -> Result<(), VerbsError> {
        self.sh()
            .lock()
            .cqs
            .remove(cq.0)
            .map(drop)
            .ok_or_else(|| VerbsError::DestroyCq {
                cq,
                reason: no_such("completion queue"),
            })
    }

    fn create_qp(
        &self,
        pd: PdHandle,
        send_cq: CqHandle,
        recv_cq: CqHandle,
        init: &QpInitAttr,
    ) -> Result<QpInfo, VerbsError> {
        let err = |reason: String| VerbsError::CreateQp { reason };
        let mut st = self.sh().lock();
        if st.pds.get(pd.0).is_none() {
            return Err(err(no_such("protection domain")));
        }
        if st.cqs.get(send_cq.0).is_none() || st.cqs.get(recv_cq.0).is_none() {
            return Err(err(no_such("completion queue")));
        }
        let mut n = st.next_qpn;
        while st.by_qpn.contains_key(&n) || !(0x11..=0xFF_FFFF).contains(&n) {
            n = if n >= 0xFF_FFFF { 0x11 } else { n + 1 };
        }
        st.next_qpn = n + 1;
        let qpn = rnic_core::Qpn::from_wire(n);
        let local_gid = self.sh().ports.first().map_or(Gid::ZERO, |p| p.gid);
        let qp = Qp::new(
            QpConfig::from_init(qpn, pd, init, local_gid)
                .with_max_unacked_psns(self.sh().max_unacked_psns),
        )
        .map_err(|e| err(e.to_string()))?;
        let h = st.qps.insert(QpEntry {
            qp,
            send_cq: send_cq.0,
            recv_cq: recv_cq.0,
            qp_type: init.qp_type,
            caps: init.caps,
            attr: QpAttr {
                cap: init.caps,
                ..QpAttr::default()
            },
        });
        st.by_qpn.insert(n, h);
        Ok(QpInfo {
            handle: QpHandle(h),
            qpn,
            caps: init.caps,
        })
    }

    fn modify_qp(&self, qp: QpHandle, attr: &QpAttr, mask: QpAttrMask) -> Result<(), VerbsError> {
        let sh = self.sh();
        if mask.contains(QpAttrMask::AV)
            && let Some(p) = AvProblem::of(&sh.ports, &attr.ah_attr)
        {
            return Err(VerbsError::ModifyQp {
                qp,
                mask,
                reason: p.explain(&sh.ports, &attr.ah_attr),
            });
        }
        let mut st = sh.lock();
        let now = sh.now();
        let r = st
            .with_qp(sh, qp.0, |q, io| {
                let r = q.modify(attr, mask, io.cq);
                if r.is_ok() {
                    q.run(now, io);
                }
                r.map(|()| (q.qpn(), q.next_deadline()))
            })
            .ok_or_else(|| VerbsError::ModifyQp {
                qp,
                mask,
                reason: no_such("queue pair"),
            })?;
        let (qpn, deadline) = r.map_err(|e| VerbsError::ModifyQp {
            qp,
            mask,
            reason: e.to_string(),
        })?;
        if let Some(e) = st.qps.get_mut(qp.0) {
            apply_attr(&mut e.attr, attr, mask);
        }
        let reset = mask.contains(QpAttrMask::STATE) && attr.qp_state == QpState::Reset;
        if let Some((s, r)) = st
            .qps
            .get(qp.0)
            .filter(|_| reset)
            .map(|e| (e.send_cq, e.recv_cq))
        {
            st.purge_cq(s, qpn);
            st.purge_cq(r, qpn);
        }
        st.flush();
        if st.note_deadline(deadline) {
            sh.ring();
        }
        Ok(())
    }

    fn query_qp(&self, qp: QpHandle) -> Result<QpAttr, VerbsError> {
        let st = self.sh().lock();
        let e = st.qps.get(qp.0).ok_or_else(|| VerbsError::QueryQp {
            qp,
            reason: no_such("queue pair"),
        })?;
        let mut a = e.attr;
        a.qp_state = e.qp.state();
        a.cur_qp_state = e.qp.state();
        a.cap = e.caps;
        Ok(a)
    }

    fn destroy_qp(&self, qp: QpHandle) -> Result<(), VerbsError> {
        let sh = self.sh();
        let mut st = sh.lock();
        // ACKs a caller-driven round deferred to the next call leave now: an
        // application that polled its last completion and tears down makes no
        // next call, and its peer would retry into a dead QP.
        st.flush();
        let e = st.qps.remove(qp.0).ok_or_else(|| VerbsError::DestroyQp {
            qp,
            reason: no_such("queue pair"),
        })?;
        let qpn = e.qp.qpn();
        st.by_qpn.remove(&qpn.get());
        st.purge_cq(e.send_cq, qpn);
        st.purge_cq(e.recv_cq, qpn);
        Ok(())
    }

    fn post_send(&self, qp: QpHandle, wrs: &[SendWr<'_>]) -> Result<(), VerbsError> {
        let sh = self.sh();
        // A UD destination that cannot be routed stops the batch there (the
        // requests before it are posted).
        let bad_av = wrs.iter().enumerate().find_map(|(i, wr)| {
            let d = wr.ud.as_ref()?;
            AvProblem::of(&sh.ports, &d.av).map(|p| (i, p))
        });
        let postable = wrs
            .get(..bad_av.map_or(wrs.len(), |(i, _)| i))
            .unwrap_or(&[]);
        let mut st = sh.lock();
        let now = sh.now();
        let r = st.with_qp(sh, qp.0, |q, io| {
            let mut refused = None;
            for (i, wr) in postable.iter().enumerate() {
                if let Err(e) = q.post_send(wr, io) {
                    refused = Some((i, e));
                    break;
                }
            }
            q.run(now, io);
            (refused, q.next_deadline())
        });
        let Some((refused, deadline)) = r else {
            return Err(VerbsError::PostSend {
                index: 0,
                reason: PostError::Device("no such queue pair on this rxe device"),
            });
        };
        st.flush();
        if st.note_deadline(deadline) {
            sh.ring();
        }
        match (refused, bad_av) {
            (None, None) => Ok(()),
            (None, Some((index, p))) => Err(VerbsError::PostSend {
                index,
                reason: PostError::Device(p.summary()),
            }),
            (Some((index, e)), _) => {
                let reason = st
                    .qps
                    .get(qp.0)
                    .map_or(PostError::Device("queue pair gone"), |q| {
                        transport_to_post(e, q)
                    });
                Err(VerbsError::PostSend { index, reason })
            }
        }
    }

    fn post_recv(&self, qp: QpHandle, wrs: &[RecvWr<'_>]) -> Result<(), VerbsError> {
        let sh = self.sh();
        let mut st = sh.lock();
        let r = st.with_qp(sh, qp.0, |q, io| {
            for (i, wr) in wrs.iter().enumerate() {
                if let Err(e) = q.post_recv(wr, io) {
                    return Some((i, e));
                }
            }
            None
        });
        let refused = r.ok_or(VerbsError::PostRecv {
            index: 0,
            reason: PostError::Device("no such queue pair on this rxe device"),
        })?;
        match refused {
            None => Ok(()),
            Some((index, e)) => {
                let reason = st
                    .qps
                    .get(qp.0)
                    .map_or(PostError::Device("queue pair gone"), |q| {
                        transport_to_post(e, q)
                    });
                Err(VerbsError::PostRecv { index, reason })
            }
        }
    }

    fn poll_cq(&self, cq: CqHandle, wcs: &mut [WorkCompletion]) -> Result<usize, VerbsError> {
        let sh = self.sh();
        let mut st = sh.lock();
        let empty = st.cqs.get(cq.0).map(|c| c.ring.is_empty());
        match empty {
            None => {
                return Err(VerbsError::PollCq {
                    cq,
                    reason: no_such("completion queue"),
                });
            }
            Some(true) => {
                st.progress(sh, 256, sh.progress == Progress::Caller);
            }
            Some(false) => st.flush(),
        }
        let Some(c) = st.cqs.get_mut(cq.0) else {
            return Ok(0);
        };
        let mut n = 0;
        for slot in wcs.iter_mut() {
            let Some(wc) = c.ring.pop_front() else { break };
            *slot = wc;
            n += 1;
        }
        Ok(n)
    }

    fn req_notify_cq(&self, cq: CqHandle, solicited_only: bool) -> Result<(), VerbsError> {
        // Solicited-only arming signals on any completion (a superset: waiters
        // re-poll anyway).
        let _ = solicited_only;
        let mut st = self.sh().lock();
        let c = st
            .cqs
            .get_mut(cq.0)
            .ok_or_else(|| VerbsError::ReqNotifyCq {
                cq,
                reason: no_such("completion queue"),
            })?;
        c.armed = true;
        Ok(())
    }

    fn cq_event_fd(&self, cq: CqHandle) -> Option<RawFd> {
        self.sh().lock().cqs.get(cq.0).map(|c| c.event.as_raw_fd())
    }

    fn wait_cq(&self, cq: CqHandle, timeout: Option<Duration>) -> Result<bool, VerbsError> {
        let sh = self.sh();
        let event = sh
            .lock()
            .cqs
            .get(cq.0)
            .map(|c| Arc::clone(&c.event))
            .ok_or_else(|| VerbsError::WaitCq {
                cq,
                reason: no_such("completion queue"),
            })?;
        let start = std::time::Instant::now();
        loop {
            let deadline = if sh.progress == Progress::Caller {
                let mut st = sh.lock();
                st.progress(sh, 256, false);
                st.next_deadline
            } else {
                None
            };
            if event.read().is_ok() {
                return Ok(true);
            }
            let left = match timeout {
                Some(t) => match t.checked_sub(start.elapsed()) {
                    Some(l) if !l.is_zero() => Some(l),
                    _ => return Ok(false),
                },
                None => None,
            };
            // Caller-driven: wake for packets and timers too.
            let timer =
                deadline.map(|d| Duration::from_nanos(d.nanos().saturating_sub(sh.now().nanos())));
            let wait = match (left, timer) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let ms = wait.map_or(PollTimeout::NONE, |w| {
                PollTimeout::try_from(w.as_millis().max(1)).unwrap_or(PollTimeout::MAX)
            });
            let mut fds = vec![PollFd::new(event.as_fd(), PollFlags::POLLIN)];
            if sh.progress == Progress::Caller {
                fds.extend(
                    sh.ports
                        .iter()
                        .map(|p| PollFd::new(p.sock.as_fd(), PollFlags::POLLIN)),
                );
            }
            poll(&mut fds, ms).map_err(|e| VerbsError::WaitCq {
                cq,
                reason: format!("poll: {e}"),
            })?;
        }
    }
}

/// Record the attributes `mask` names (for `query_qp`).
fn apply_attr(a: &mut QpAttr, attr: &QpAttr, mask: QpAttrMask) {
    type Setter<'a> = &'a dyn Fn(&mut QpAttr);
    let pairs: [(QpAttrMask, Setter<'_>); 15] = [
        (QpAttrMask::STATE, &|a| a.qp_state = attr.qp_state),
        (QpAttrMask::ACCESS_FLAGS, &|a| {
            a.qp_access_flags = attr.qp_access_flags;
        }),
        (QpAttrMask::PKEY_INDEX, &|a| a.pkey_index = attr.pkey_index),
        (QpAttrMask::PORT, &|a| a.port_num = attr.port_num),
        (QpAttrMask::QKEY, &|a| a.qkey = attr.qkey),
        (QpAttrMask::AV, &|a| a.ah_attr = attr.ah_attr),
        (QpAttrMask::PATH_MTU, &|a| a.path_mtu = attr.path_mtu),
        (QpAttrMask::TIMEOUT, &|a| a.timeout = attr.timeout),
        (QpAttrMask::RETRY_CNT, &|a| a.retry_cnt = attr.retry_cnt),
        (QpAttrMask::RNR_RETRY, &|a| a.rnr_retry = attr.rnr_retry),
        (QpAttrMask::RQ_PSN, &|a| a.rq_psn = attr.rq_psn),
        (QpAttrMask::MAX_QP_RD_ATOMIC, &|a| {
            a.max_rd_atomic = attr.max_rd_atomic;
        }),
        (QpAttrMask::MIN_RNR_TIMER, &|a| {
            a.min_rnr_timer = attr.min_rnr_timer;
        }),
        (QpAttrMask::SQ_PSN, &|a| a.sq_psn = attr.sq_psn),
        (QpAttrMask::MAX_DEST_RD_ATOMIC, &|a| {
            a.max_dest_rd_atomic = attr.max_dest_rd_atomic;
        }),
    ];
    for (m, f) in pairs {
        if mask.contains(m) {
            f(a);
        }
    }
    if mask.contains(QpAttrMask::DEST_QPN) {
        a.dest_qp_num = attr.dest_qp_num;
    }
}
