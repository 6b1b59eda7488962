//! The port layer: the function's own L2, on top of the RDMA layer.
//!
//! A ConnectX function owned through VFIO has no kernel netdev, so nobody
//! answers ARP or IPv6 neighbour solicitations for its RoCE addresses and
//! nobody resolves its peers' MACs. [`Port`] does both, as a DPDK
//! application or a Snap-style target owning a NIC does: raw Ethernet
//! queues ([`eth`]), the NIC RX flow table rules that steer ARP and
//! neighbour discovery to them ([`steer`]), and rnic-roce's sans-IO
//! neighbour engine ([`rnic_roce::neigh`]: responder, resolver, cache,
//! announcements) driven by a worker thread that waits on the queues' CQ
//! and the engine's timers.
//!
//! [`Port::open`] registers the port as the function's [`Resolver`]: from
//! then on an RC QP's destination MAC at RTR and a UD address handle's at
//! creation are resolved by ARP / ND with a bounded wait
//! ([`Mlx5Error::NoNeighbour`] names the address that did not answer), the
//! function's GIDs ([`Hca::set_gid`]) are answered for and announced
//! (gratuitous ARP, unsolicited NA), and [`Port::neighbours`] lists the
//! cache (`rnicctl neigh`).

pub mod eth;
pub mod steer;

use std::net::IpAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use rnic_roce::neigh::{self, Config, Event, Neighbours, Outcome, Resolution};
use rnic_roce::wire::{EthernetAddress, VlanTag, icmpv6};
use tracing::{debug, info, warn};

use crate::firmware::neigh::{Resolver, mac_text};
use crate::function::memory::lock;
use crate::{Hca, Mlx5Error};
use eth::{Completion, EthQueues, TxRefused};
use steer::FlowRules;

/// How the port runs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PortOptions {
    /// The neighbour engine's timers and bounds (Linux's defaults).
    pub neighbours: Config,
    /// Send ARP / ND on this VLAN (id 0..=4094, priority 0..=7); the
    /// port's RoCE traffic takes the same tag from the QPs' address paths.
    pub vlan: Option<VlanTag>,
}

/// What the port counted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PortCounters {
    /// Frames the flow rules delivered.
    pub rx_frames: u64,
    /// Frames longer than a receive slot (dropped).
    pub rx_oversized: u64,
    /// Frames sent.
    pub tx_frames: u64,
    /// Frames not sent: the SQ was full.
    pub tx_full: u64,
    /// Frames not sent: longer than a send carries.
    pub tx_too_long: u64,
    /// Error CQEs (each one's queue is reset and made ready again).
    pub cqe_errors: u64,
    /// Queues brought back from an error CQE.
    pub recoveries: u64,
    /// CQEs the port did not expect.
    pub cqe_unexpected: u64,
    /// The neighbour engine's own counters (answered, learned, ignored and
    /// malformed by cause, solicitations, …).
    pub neighbours: neigh::Counters,
}

struct State {
    engine: Neighbours,
    queues: EthQueues,
    counters: PortCounters,
    /// Bumped on every engine event (waiters re-check).
    generation: u64,
    /// The vport multicast list last programmed ([`subscriptions`]).
    subscribed: Vec<[u8; 6]>,
}

/// The group addresses the port must receive: broadcast (ARP) and the
/// solicited-node group of each own IPv6 address (neighbour solicitations,
/// RFC 4861 §7.2.1), sorted, each once.
fn subscriptions(engine: &Neighbours) -> Vec<[u8; 6]> {
    let mut macs = vec![[0xff; 6]];
    for (ip, _) in engine.own_addresses() {
        if let IpAddr::V6(v6) = ip {
            macs.push(EthernetAddress::from_ipv6_multicast(icmpv6::solicited_node(v6)).0);
        }
    }
    macs.sort_unstable();
    macs.dedup();
    macs
}

impl Shared {
    /// Program the vport's multicast list if the own addresses changed it.
    fn subscribe(&self) -> Result<(), Mlx5Error> {
        let want = {
            let st = lock(&self.state);
            let want = subscriptions(&st.engine);
            if want == st.subscribed {
                return Ok(());
            }
            want
        };
        self.hca.set_multicast_list(&want)?;
        lock(&self.state).subscribed = want;
        Ok(())
    }
}

struct Shared {
    hca: Arc<Hca>,
    state: Mutex<State>,
    changed: Condvar,
    stop: AtomicBool,
    /// When the port started: the engine's clock is nanoseconds since.
    epoch: std::time::Instant,
}

impl Shared {
    fn now(&self) -> neigh::Instant {
        neigh::Instant::from_nanos(self.epoch.elapsed().as_nanos() as u64)
    }

    /// Send what the engine queued.
    fn flush(state: &mut State) {
        while let Some(frame) = state.engine.transmit() {
            match state.queues.send(frame.as_bytes()) {
                Ok(()) => state.counters.tx_frames += 1,
                Err(TxRefused::Full) => state.counters.tx_full += 1,
                Err(TxRefused::TooLong) => state.counters.tx_too_long += 1,
                // Counted once, when its error CQE came.
                Err(TxRefused::Broken) => {}
            }
        }
    }

    /// Take every completion, feed frames to the engine, run its timers,
    /// send what it queued; wake waiters on events.
    fn step(&self) -> Result<(), Mlx5Error> {
        let mut st = lock(&self.state);
        let now = self.now();
        let mut events = 0;
        while let Some(c) = st.queues.next_completion()? {
            match c {
                Completion::Received(frame) => {
                    st.counters.rx_frames += 1;
                    if let Outcome::Malformed(why) = st.engine.on_frame(now, &frame) {
                        debug!(?why, len = frame.len(), "malformed L2 frame");
                    }
                }
                Completion::Oversized(_) => st.counters.rx_oversized += 1,
                Completion::Sent => {}
                Completion::Error { .. } => st.counters.cqe_errors += 1,
                Completion::Unexpected(_) => st.counters.cqe_unexpected += 1,
            }
        }
        st.engine.poll(now);
        Self::flush(&mut st);
        while let Some(e) = st.engine.event() {
            events += 1;
            match e {
                Event::Resolved { ip, mac } => debug!(%ip, %mac, "neighbour resolved"),
                Event::Failed { ip, tries } => info!(%ip, tries, "neighbour did not answer"),
                Event::MacChanged { ip, old, new } => {
                    info!(%ip, %old, %new, "neighbour moved to another MAC")
                }
                Event::Conflict { ip, mac } => warn!(
                    %ip, %mac,
                    "another station claims this function's address: check for a duplicate"
                ),
            }
        }
        if events > 0 {
            st.generation = st.generation.wrapping_add(1);
            self.changed.notify_all();
        }
        Ok(())
    }

    /// How long the worker may sleep: until the engine's next timer, at
    /// most 50 ms (a resolve started meanwhile sets an earlier one).
    fn sleep_for(&self) -> Duration {
        let st = lock(&self.state);
        let now = self.now();
        let cap = Duration::from_millis(50);
        match st.engine.next_deadline() {
            Some(d) if d.nanos() <= now.nanos() => Duration::ZERO,
            Some(d) => Duration::from_nanos(d.nanos() - now.nanos()).min(cap),
            None => cap,
        }
    }
}

/// The function's L2: see the module docs. Dropping it stops the worker,
/// removes the flow rules and destroys the queues.
pub struct Port {
    shared: Arc<Shared>,
    worker: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Port {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Port")
            .field("function", &self.shared.hca.info().function)
            .finish_non_exhaustive()
    }
}

/// The resolver registered with the [`Hca`]: it holds the port weakly, so
/// the port's lifetime stays its owner's.
struct PortResolver(Weak<Shared>);

impl Port {
    /// Raw Ethernet queues, the flow rules, the engine and its worker; the
    /// function's GIDs answered for and announced; registered as the
    /// function's [`Resolver`]. Needs the event queue
    /// ([`Hca::enable_events`]): the worker sleeps on CQ events.
    pub fn open(hca: &Arc<Hca>, options: PortOptions) -> Result<Port, Mlx5Error> {
        let mut config = options.neighbours;
        if options.vlan.is_some() {
            config.vlan = options.vlan;
        }
        let engine = Neighbours::new(config).map_err(|e| Mlx5Error::QpOptions {
            reason: format!("port: {e}"),
        })?;
        let mut queues = EthQueues::new(hca)?;
        let rules = FlowRules::new(hca, queues.tirn())?;
        let fd: OwnedFd = queues
            .cq()
            .event_fd()
            .ok_or_else(|| Mlx5Error::QpOptions {
                reason: "port: the CQ has no event fd (enable the event queue first: \
                         Hca::enable_events)"
                    .into(),
            })?
            .try_clone_to_owned()
            .map_err(|e| Mlx5Error::QpOptions {
                reason: format!("port: cannot duplicate the CQ's event fd: {e}"),
            })?;
        let shared = Arc::new(Shared {
            hca: hca.clone(),
            state: Mutex::new(State {
                engine,
                queues,
                counters: PortCounters::default(),
                generation: 0,
                subscribed: Vec::new(),
            }),
            changed: Condvar::new(),
            stop: AtomicBool::new(false),
            epoch: std::time::Instant::now(),
        });
        // Broadcast first (ARP); each own IPv6 address adds its solicited-node
        // group as the GIDs are announced below.
        shared.subscribe()?;
        let resolver: Arc<dyn Resolver> = Arc::new(PortResolver(Arc::downgrade(&shared)));
        // The resolver lives as long as the port: the Hca holds it weakly,
        // the worker strongly.
        hca.set_resolver(Arc::downgrade(&resolver));
        let worker_shared = shared.clone();
        let worker = std::thread::Builder::new()
            .name(format!("rnic-port-{}", hca.info().function))
            .spawn(move || {
                let _keep = resolver;
                let _rules = rules;
                worker(&worker_shared, fd);
            })
            .map_err(|e| Mlx5Error::QpOptions {
                reason: format!("port: cannot start its worker thread: {e}"),
            })?;
        info!(function = %hca.info().function, "port L2 up: ARP and ND answered and resolved");
        Ok(Port {
            shared,
            worker: Some(worker),
        })
    }

    /// The neighbour cache (`ip neigh`'s view).
    pub fn neighbours(&self) -> Vec<neigh::Neighbour> {
        let now = self.shared.now();
        lock(&self.shared.state).engine.entries(now)
    }

    /// What the port and its engine counted.
    pub fn counters(&self) -> PortCounters {
        let st = lock(&self.shared.state);
        PortCounters {
            neighbours: *st.engine.counters(),
            recoveries: st.queues.recoveries(),
            ..st.counters.clone()
        }
    }

    /// Resolve `ip` (ARP for IPv4, ND for IPv6) within `timeout`.
    pub fn resolve(&self, ip: IpAddr, timeout: Duration) -> Result<[u8; 6], Mlx5Error> {
        resolve(&self.shared, ip, timeout).map_err(|why| Mlx5Error::NoNeighbour { ip, why })
    }

    /// A static entry (networks without ARP): used for `ip`, never changed
    /// by the network.
    pub fn set_static(&self, ip: IpAddr, mac: [u8; 6]) -> Result<(), Mlx5Error> {
        let now = self.shared.now();
        lock(&self.shared.state)
            .engine
            .set_static(now, ip, EthernetAddress(mac))
            .map_err(|e| Mlx5Error::QpOptions {
                reason: format!("port: {e}"),
            })
    }
}

impl Drop for Port {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
        // The rules are gone with the worker; no group address is wanted now.
        if !self.shared.hca.is_fatal()
            && let Err(e) = self.shared.hca.set_multicast_list(&[])
        {
            warn!(error = %e, "port close: clearing the vport multicast list failed");
        }
    }
}

/// The worker: completions and timers until the port stops.
fn worker(shared: &Arc<Shared>, fd: OwnedFd) {
    while !shared.stop.load(Ordering::Acquire) {
        if let Err(e) = shared.step() {
            warn!(error = %e, "port worker: step failed");
        }
        if shared.hca.is_fatal() {
            info!("port worker: function fatal, stopping");
            return;
        }
        // Arm, then take what came meanwhile, then sleep on the eventfd.
        {
            let mut st = lock(&shared.state);
            st.queues.cq().take_events();
            if st.queues.cq().arm(false).is_err() {
                return;
            }
        }
        if let Err(e) = shared.step() {
            warn!(error = %e, "port worker: step failed");
        }
        let _ = crate::sys::wait_readable(fd.as_fd(), shared.sleep_for());
    }
}

/// Resolve on the engine, sending what it queues, waiting for the worker
/// to see the answer; why not, as text for [`Mlx5Error::NoNeighbour`].
fn resolve(shared: &Shared, ip: IpAddr, timeout: Duration) -> Result<[u8; 6], String> {
    let start = std::time::Instant::now();
    let mut st = lock(&shared.state);
    loop {
        let now = shared.now();
        match st.engine.resolve(now, ip) {
            Ok(Resolution::Known(mac)) => return Ok(mac.0),
            Ok(Resolution::Failed { tries, .. }) => {
                return Err(format!(
                    "no answer to {} ({tries} sent, {:?} apart)",
                    if ip.is_ipv4() {
                        "ARP requests"
                    } else {
                        "neighbour solicitations"
                    },
                    st.engine.config().retrans_time
                ));
            }
            Ok(Resolution::Pending { deadline }) => {
                Shared::flush(&mut st);
                let left = timeout.saturating_sub(start.elapsed());
                if left.is_zero() {
                    return Err(format!("no answer within {timeout:?}"));
                }
                let until = Duration::from_nanos(deadline.nanos().saturating_sub(now.nanos()));
                let wait = left.min(until.max(Duration::from_millis(1)));
                let generation = st.generation;
                let (guard, _) = shared
                    .changed
                    .wait_timeout_while(st, wait, |s| s.generation == generation)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                st = guard;
            }
            Err(e) => return Err(e.to_string()),
        }
    }
}

impl Resolver for PortResolver {
    fn resolve(&self, ip: IpAddr, timeout: Duration) -> Result<[u8; 6], String> {
        let shared = self.0.upgrade().ok_or("the port is closed")?;
        resolve(&shared, ip, timeout)
    }

    fn own_address(&self, ip: IpAddr, mac: Option<[u8; 6]>) {
        let Some(shared) = self.0.upgrade() else {
            return;
        };
        let now = shared.now();
        let mut st = lock(&shared.state);
        match mac {
            Some(m) => match st.engine.add_own(now, ip, EthernetAddress(m)) {
                Ok(()) => info!(%ip, mac = %mac_text(&m), "port answers for and announces"),
                Err(e) => warn!(%ip, error = %e, "port cannot answer for this address"),
            },
            None => {
                st.engine.remove_own(ip);
            }
        }
        Shared::flush(&mut st);
        drop(st);
        if let Err(e) = shared.subscribe() {
            warn!(%ip, error = %e, "port: the vport multicast list was not updated");
        }
    }
}
