//! The asynchronous event queue (mlx5.md §7.1, §8, §11), the thread that
//! drains it and the worker that answers page requests.
//!
//! [`Hca::enable_events`] creates one EQ on MSI-X vector 0 (RC's VFIO
//! driver: a single EQ) with the command-completion, page-request and K's
//! async event types (port change, CQ error, QP events) in its mask; every
//! CQ names it as `c_eqn`. Entries start with owner = 1 and are valid iff
//! `owner == (ci >> log_size) & 1`; after the owner check
//! [`dma_rmb_after_owner_bit`]; the consumer index goes to UAR+0x48 (no arm)
//! every 0x80 entries and to UAR+0x40 (arm) when a drain ends.
//!
//! # Who drains it (audit rows 1 and 13)
//!
//! The kernel and rdma-core drain their async EQ on every interrupt (K
//! core/eq.c; RC mlx5_vfio.c:466-494), so it cannot overrun whatever the
//! application does — an overrun is a fatal firmware syndrome (0x0c). So
//! does this driver: the **event thread** (`mlx5-events`) blocks on the
//! vector's eventfd, drains every valid EQE, re-arms, and hands each on:
//! command completions wake the command waiting in that slot, completion
//! events bump the CQ's counter and signal its eventfd, page requests go to
//! the **page worker** (`mlx5-pages`), which answers them with MANAGE_PAGES
//! on the command queue's reserved slot — while a regular command may be
//! waiting for exactly those pages (firmware holds CREATE_QP/CQ/MKEY under
//! ICM pressure; K core/pagealloc.c:700-776, core/cmd.c:1015-1053). The
//! event thread never posts a command, so it can always deliver the
//! completion the page worker waits for. It also reads the health buffer
//! every [`HEALTH_PERIOD`] ([`crate::firmware::health`]). Both threads stop and are
//! joined before DESTROY_EQ.

use std::collections::HashMap;
use std::fmt;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::sys::eventfd::EventFd;
use rnic_dma::Mmio;
use rnic_dma::barrier::dma_rmb_after_owner_bit;
use rnic_mlx5_prm::{
    ASYNC_EVENT_TYPES, CmdOpcode, CreateEqIn, CreateEqOut, DestroyEqIn, DestroyEqOut, EQE_BYTES,
    EQE_OWNER_INIT, EventType, FieldLayout, NUM_SPARE_EQE, UAR_EQ_DOORBELL_ARM,
    UAR_EQ_DOORBELL_NO_ARM, cmd_inter_comp_event, comp_event, cq_error, eq_uar_doorbell, eqe,
    pages_req_event,
};
use tracing::{debug, error, info, warn};

use crate::firmware::cmd::CommandEvents;
use crate::firmware::health::HealthShared;
use crate::firmware::pages::{MAX_PAGES_PER_REQUEST, Pages};
use crate::function::memory::lock;
use rnic_core::Memory;

use crate::{DmaBuffer, Hca, Mlx5Error, Vector, sys};

/// Shared with the event queue: completion events for one CQ, counted,
/// and signalled on an eventfd (where the CQ has one) that a caller can
/// poll or epoll (`Cq::event_fd` in the RDMA layer).
#[derive(Debug, Default)]
pub(crate) struct CqNotify {
    pub events: AtomicU32,
    pub fd: Option<nix::sys::eventfd::EventFd>,
}

impl CqNotify {
    /// With an eventfd for waiters.
    pub(crate) fn with_fd() -> nix::Result<CqNotify> {
        Ok(CqNotify {
            events: AtomicU32::new(0),
            fd: Some(crate::sys::eventfd()?),
        })
    }

    /// One completion event (the event thread, under the EQ's lock).
    pub(crate) fn signal(&self) {
        self.events.fetch_add(1, Ordering::Release);
        if let Some(fd) = &self.fd {
            crate::sys::eventfd_signal(fd);
        }
    }
}

/// EQ entries asked for (the ring has this + [`NUM_SPARE_EQE`], rounded up
/// to a power of two: 256).
pub const EQ_ENTRIES: u32 = 0x80;

/// The BlueFlame register QPs share when the UAR is write-combining: only
/// 8-byte doorbells go to it, never a copy (audit row 5); registers below
/// it are handed out one per QP for BlueFlame.
pub const SHARED_BF_REG: usize = rnic_mlx5_prm::UAR_NUM_BF_REGS - 1;

/// How often the event thread reads the health buffer (RC: every second,
/// mlx5_vfio.c:2159-2168; K's health timer likewise).
pub const HEALTH_PERIOD: Duration = Duration::from_secs(1);

/// The most pages one negative page request takes back at once.
const MAX_TAKE_PER_REQUEST: usize = 50_000;

/// What the event queue counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EventCounters {
    /// EQEs consumed.
    pub eqes: u64,
    /// Interrupts the event thread woke for.
    pub interrupts: u64,
    /// Command completion EQEs.
    pub command: u64,
    /// Page request EQEs.
    pub page_requests: u64,
    /// Pages given at run time.
    pub pages_given: u64,
    /// Pages taken back at run time.
    pub pages_taken: u64,
    /// Page requests refused as beyond [`crate::firmware::init::MAX_PAGES_PER_REQUEST`].
    pub pages_refused: u64,
    /// Page requests answered with CANT_GIVE (memory could not be had, or
    /// the request was refused).
    pub cant_give: u64,
    /// Page requests whose MANAGE_PAGES failed.
    pub page_errors: u64,
    /// Completion EQEs.
    pub completion: u64,
    /// Completion EQEs naming no CQ of this function.
    pub unknown_cq: u64,
    /// CQ error EQEs.
    pub cq_error: u64,
    /// QP (affiliated) EQEs.
    pub qp_events: u64,
    /// Port change EQEs.
    pub port_change: u64,
    /// Known types the driver takes no action on.
    pub other: u64,
    /// Types the driver does not know.
    pub unknown_type: u64,
}

#[derive(Debug, Default)]
pub(crate) struct EqState {
    pub ci: u32,
    cmd_done: u32,
    pub pages: i64,
    /// The page worker is answering a request now.
    page_busy: bool,
    pub counters: EventCounters,
    pub cqs: HashMap<u32, Arc<CqNotify>>,
}

/// The function's EQ.
pub(crate) struct EventQueue {
    pub eqn: u32,
    ring: Arc<DmaBuffer>,
    log_size: u32,
    uar: Mmio,
    vector: Vector,
    state: Mutex<EqState>,
    /// A command completion EQE arrived (the waiters check their slot).
    commands: Condvar,
    /// Page requests are pending (or the threads stop).
    page_work: Condvar,
    /// The page worker is idle with nothing pending.
    page_idle: Condvar,
    stop: AtomicBool,
    /// Written to wake the event thread when it should stop.
    wake: EventFd,
}

impl fmt::Debug for EventQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventQueue")
            .field("eqn", &self.eqn)
            .field("log_size", &self.log_size)
            .finish_non_exhaustive()
    }
}

fn dword(e: &[u8; EQE_BYTES], base: usize, f: &FieldLayout) -> u32 {
    let at = base + f.dword_offset();
    match e.get(at..at + 4) {
        Some(b) => f.extract(u32::from_be_bytes([b[0], b[1], b[2], b[3]])),
        None => 0,
    }
}

/// A condvar wait that takes a poisoned lock as it is (see `memory::lock`).
fn wait_on<'a, T>(cv: &Condvar, guard: MutexGuard<'a, T>, timeout: Duration) -> MutexGuard<'a, T> {
    cv.wait_timeout(guard, timeout)
        .unwrap_or_else(PoisonError::into_inner)
        .0
}

impl EventQueue {
    fn doorbell(&self, ci: u32, arm: bool) {
        let dw = eq_uar_doorbell::cons_index
            .insert(eq_uar_doorbell::eqn.insert(0, self.eqn), ci & 0xff_ffff);
        let off = if arm {
            UAR_EQ_DOORBELL_ARM
        } else {
            UAR_EQ_DOORBELL_NO_ARM
        };
        if let Err(e) = self.uar.write32_be(off, dw) {
            warn!(%e, "EQ doorbell write failed");
        }
        // The UAR page may be write-combining (PAT gives every mapping of a
        // page the type of its first; `Hca::uar_wc`): flush the store.
        rnic_dma::barrier::wc_flush();
    }

    /// Consume every valid EQE and wake whoever it concerns.
    fn drain(&self) {
        let mut st = lock(&self.state);
        let before = st.cmd_done;
        drain_ring(self.ring.words(), self.log_size, &mut st, |ci, arm| {
            self.doorbell(ci, arm)
        });
        if st.cmd_done != before {
            self.commands.notify_all();
        }
        if st.pages != 0 {
            self.page_work.notify_one();
        }
    }

    fn handle(st: &mut EqState, e: &[u8; EQE_BYTES]) {
        let data = eqe::event_data.byte_offset();
        st.counters.eqes += 1;
        let raw = dword(e, 0, &eqe::event_type) as u8;
        match EventType::from_raw(raw) {
            EventType::Cmd => {
                st.counters.command += 1;
                st.cmd_done |= dword(e, data, &cmd_inter_comp_event::command_completion_vector);
            }
            EventType::PageRequest => {
                st.counters.page_requests += 1;
                let n = dword(e, data, &pages_req_event::num_pages) as i32;
                st.pages = st.pages.saturating_add(i64::from(n));
                debug!(num_pages = n, "PAGE_REQUEST");
            }
            EventType::Completion => {
                st.counters.completion += 1;
                let cqn = dword(e, data, &comp_event::cq_number);
                match st.cqs.get(&cqn) {
                    Some(c) => c.signal(),
                    None => st.counters.unknown_cq += 1,
                }
            }
            EventType::CqError => {
                st.counters.cq_error += 1;
                let cqn = dword(e, data, &cq_error::cqn);
                let synd = dword(e, data, &cq_error::syndrome);
                error!(
                    cqn,
                    syndrome = synd,
                    "CQ error event (overrun or bad access)"
                );
            }
            EventType::PathMig
            | EventType::CommEst
            | EventType::SqDrained
            | EventType::WqCatasError
            | EventType::PathMigFailed
            | EventType::WqInvalReq
            | EventType::WqAccessError => {
                st.counters.qp_events += 1;
                debug!(event = raw, "QP event");
            }
            EventType::PortChange => {
                st.counters.port_change += 1;
                info!(sub_type = dword(e, 0, &eqe::event_sub_type), "port change");
            }
            EventType::Unknown(_) => st.counters.unknown_type += 1,
            _ => st.counters.other += 1,
        }
    }

    fn take(st: &mut EqState, slot: usize) -> bool {
        let bit = 1u32.checked_shl(slot as u32).unwrap_or(0);
        let done = st.cmd_done & bit != 0;
        st.cmd_done &= !bit;
        done
    }

    /// Stop both threads (they notice within one wake-up).
    fn request_stop(&self) {
        self.stop.store(true, Ordering::Release);
        sys::eventfd_signal(&self.wake);
        let _g = lock(&self.state);
        self.page_work.notify_all();
        self.page_idle.notify_all();
        self.commands.notify_all();
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// Wait until no page request is pending or being answered (at most
    /// `timeout`); whether that is so.
    fn wait_pages_idle(&self, timeout: Duration) -> bool {
        let end = Instant::now() + timeout;
        let mut st = lock(&self.state);
        loop {
            if st.pages == 0 && !st.page_busy {
                return true;
            }
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() || self.stopping() {
                return false;
            }
            st = wait_on(&self.page_idle, st, left);
        }
    }
}

/// The event thread: drain on every interrupt, read the health buffer every
/// [`HEALTH_PERIOD`]; see the module docs.
fn event_thread(eq: Arc<EventQueue>, health: Arc<HealthShared>) {
    let mut next_health = Instant::now() + HEALTH_PERIOD;
    while !eq.stopping() {
        let wait = next_health.saturating_duration_since(Instant::now());
        match sys::wait_either(eq.vector.as_fd(), eq.wake.as_fd(), wait) {
            Ok((irq, _)) => {
                if irq {
                    let _ = eq.vector.take();
                    lock(&eq.state).counters.interrupts += 1;
                }
            }
            Err(e) => {
                warn!(%e, "waiting for the EQ interrupt failed; polling instead");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        if eq.stopping() {
            break;
        }
        eq.drain();
        if Instant::now() >= next_health {
            next_health = Instant::now() + HEALTH_PERIOD;
            if health.check().is_err() {
                // Fatal: wake every waiter so nothing sleeps on a dead
                // function (the commands then time out or see the flag).
                let _g = lock(&eq.state);
                eq.commands.notify_all();
                eq.page_idle.notify_all();
            }
        }
    }
}

/// The page worker: answer each page request with MANAGE_PAGES (give, take,
/// or CANT_GIVE) on the reserved page slot; see the module docs.
fn page_thread(eq: Arc<EventQueue>, pages: Arc<Pages>, health: Arc<HealthShared>) {
    loop {
        let want = {
            let mut st = lock(&eq.state);
            while st.pages == 0 && !eq.stopping() {
                st.page_busy = false;
                eq.page_idle.notify_all();
                st = wait_on(&eq.page_work, st, Duration::from_millis(200));
            }
            if eq.stopping() {
                st.page_busy = false;
                eq.page_idle.notify_all();
                return;
            }
            st.page_busy = true;
            std::mem::take(&mut st.pages)
        };
        if health.is_fatal() {
            continue;
        }
        serve_pages(&eq, &pages, want);
    }
}

/// Answer a net page request of `want` pages (negative: give back).
fn serve_pages(eq: &EventQueue, pages: &Pages, want: i64) {
    let count = |f: &dyn Fn(&mut EventCounters)| f(&mut lock(&eq.state).counters);
    if want > MAX_PAGES_PER_REQUEST {
        // A device asking for more than 4 GiB at once reports nonsense; it
        // is told so, so that a command it holds fails instead of waiting.
        count(&|c| {
            c.pages_refused += 1;
            c.cant_give += 1;
        });
        warn!(
            num_pages = want,
            "PAGE_REQUEST beyond the per-request limit refused (CANT_GIVE)"
        );
        pages.cant_give();
    } else if want > 0 {
        let n = want as usize;
        match pages.give(n, true) {
            Ok(()) => {
                count(&|c| c.pages_given += n as u64);
                info!(pages = n, "PAGE_REQUEST served: pages given");
            }
            Err(e) => {
                let told = !matches!(e, Mlx5Error::CommandTimeout { .. });
                count(&|c| {
                    c.page_errors += 1;
                    c.cant_give += u64::from(told);
                });
                error!(pages = n, %e, "PAGE_REQUEST could not be served");
            }
        }
    } else if want < 0 {
        let limit = (want.unsigned_abs() as usize).min(MAX_TAKE_PER_REQUEST);
        match pages.take(limit) {
            Ok(n) => {
                count(&|c| c.pages_taken += n as u64);
                info!(pages = n, "PAGE_REQUEST served: pages taken back");
            }
            Err(e) => {
                count(&|c| c.page_errors += 1);
                error!(pages = limit, %e, "negative PAGE_REQUEST could not be served");
            }
        }
    }
}

/// Consume every valid EQE of the ring (owner parity, then the read
/// barrier, then the body); `doorbell(ci, arm)` every [`NUM_SPARE_EQE`]
/// entries without arming and once, arming, at the end.
pub(crate) fn drain_ring(
    words: &[std::sync::atomic::AtomicU64],
    log_size: u32,
    st: &mut EqState,
    mut doorbell: impl FnMut(u32, bool),
) -> u32 {
    let mask = (1u32 << log_size) - 1;
    let mut n = 0u32;
    loop {
        let idx = (st.ci & mask) as usize * 8;
        let Some(last) = words.get(idx + 7) else {
            break;
        };
        let owner = last.load(Ordering::Acquire).to_ne_bytes()[7] & 1;
        if u32::from(owner) != (st.ci >> log_size) & 1 {
            break;
        }
        dma_rmb_after_owner_bit();
        let mut e = [0u8; EQE_BYTES];
        for (i, chunk) in e.chunks_exact_mut(8).enumerate() {
            if let Some(w) = words.get(idx + i) {
                chunk.copy_from_slice(&w.load(Ordering::Relaxed).to_ne_bytes());
            }
        }
        st.ci = st.ci.wrapping_add(1);
        n += 1;
        EventQueue::handle(st, &e);
        if n.is_multiple_of(NUM_SPARE_EQE) {
            doorbell(st.ci, false);
        }
    }
    if n > 0 {
        doorbell(st.ci, true);
    }
    n
}

impl CommandEvents for EventQueue {
    fn begin(&self, slot: usize) {
        let mut st = lock(&self.state);
        Self::take(&mut st, slot);
    }

    fn wait_command(&self, slot: usize, slice: Duration) -> bool {
        let mut st = lock(&self.state);
        if Self::take(&mut st, slot) {
            return true;
        }
        st = wait_on(&self.commands, st, slice);
        Self::take(&mut st, slot)
    }
}

/// The two threads of the event queue.
#[derive(Debug)]
struct EventThreads {
    events: JoinHandle<()>,
    pages: JoinHandle<()>,
}

/// The event-queue and health state of an [`Hca`].
#[derive(Debug)]
pub(crate) struct HcaRuntime {
    pub events: Option<Arc<EventQueue>>,
    threads: Option<EventThreads>,
    pub health: Arc<HealthShared>,
    pub bf_regs: Mutex<u8>,
}

impl HcaRuntime {
    pub(crate) fn new(function: Arc<dyn crate::PciFunction>) -> HcaRuntime {
        HcaRuntime {
            events: None,
            threads: None,
            health: Arc::new(HealthShared::new(function)),
            bf_regs: Mutex::default(),
        }
    }

    /// Stop and join the event thread and the page worker (teardown; also
    /// when the function is fatal and no DESTROY_EQ will be sent).
    pub(crate) fn stop_threads(&mut self) {
        if let Some(eq) = &self.events {
            eq.request_stop();
        }
        if let Some(t) = self.threads.take() {
            for (name, h) in [("event thread", t.events), ("page worker", t.pages)] {
                if h.join().is_err() {
                    error!(thread = name, "mlx5 thread panicked");
                }
            }
        }
    }
}

fn prm(what: &'static str) -> impl Fn(rnic_mlx5_prm::Error) -> Mlx5Error {
    move |source| Mlx5Error::Prm { what, source }
}

impl Hca {
    /// Create the async EQ on MSI-X vector 0, start the event thread and the
    /// page worker, and complete commands by EQE from now on (module docs).
    /// Destroyed in teardown after DEALLOC_PD and before DEALLOC_UAR.
    pub fn enable_events(&mut self) -> Result<(), Mlx5Error> {
        if self.runtime.events.is_some() {
            return Ok(());
        }
        let function = self.function().clone();
        let mut vectors = function.enable_msix(1)?;
        let vector = vectors.pop().ok_or_else(|| Mlx5Error::Vectors {
            function: function.name().into(),
            wanted: 1,
            count: 0,
        })?;
        let nent = (EQ_ENTRIES + NUM_SPARE_EQE).next_power_of_two();
        let log_size = nent.trailing_zeros();
        let len = nent as usize * EQE_BYTES;
        let ring = function.alloc_dma(len)?;
        let mut init = vec![0u8; len];
        for e in init.chunks_mut(EQE_BYTES) {
            e[EQE_BYTES - 1] = EQE_OWNER_INIT;
        }
        ring.write(0, &init)
            .map_err(|source| Mlx5Error::DmaAccess {
                what: "EQ ring init",
                source,
            })?;
        let pages = len.div_ceil(4096);
        let iova = ring.iova().get();
        let uar_index = self.info().uar;
        let mut mask = 0u64;
        for t in ASYNC_EVENT_TYPES
            .iter()
            .chain(&[EventType::Cmd, EventType::PageRequest])
        {
            mask |= t.mask_bit().unwrap_or(0);
        }
        let mut cmd = vec![0u8; CreateEqIn::<&[u8]>::SIZE_BYTES + 8 * pages];
        {
            let mut v = CreateEqIn::new_checked(&mut cmd[..]).map_err(prm("CREATE_EQ"))?;
            v.set_event_bitmask(0, mask).map_err(prm("CREATE_EQ"))?;
            for p in 0..pages {
                v.set_pas(p, iova + (p * 4096) as u64)
                    .map_err(prm("CREATE_EQ pas"))?;
            }
            let mut c = v.eq_context_entry_mut();
            c.set_log_eq_size(log_size).map_err(prm("CREATE_EQ"))?;
            c.set_uar_page(uar_index).map_err(prm("CREATE_EQ"))?;
            c.set_intr(vector.vector).map_err(prm("CREATE_EQ"))?;
            c.set_log_page_size(0).map_err(prm("CREATE_EQ"))?;
            c.set_page_offset(0).map_err(prm("CREATE_EQ"))?;
        }
        let out = self.cmdq().exec(
            CmdOpcode::CreateEq,
            0,
            &cmd,
            CreateEqOut::<&[u8]>::SIZE_BYTES,
        )?;
        let eqn = CreateEqOut::new_checked(&out[..])
            .map_err(prm("CREATE_EQ"))?
            .eq_number();
        let wake = sys::eventfd().map_err(|source| Mlx5Error::Eventfd {
            vector: u32::MAX,
            source,
        })?;
        let eq = Arc::new(EventQueue {
            eqn,
            ring,
            log_size,
            uar: function.uar(uar_index)?,
            vector,
            state: Mutex::new(EqState::default()),
            commands: Condvar::new(),
            page_work: Condvar::new(),
            page_idle: Condvar::new(),
            stop: AtomicBool::new(false),
            wake,
        });
        // From here the EQ exists: teardown destroys it even if a thread
        // cannot be started.
        self.runtime.events = Some(eq.clone());
        let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(name.into())
                .spawn(f)
                .map_err(|source| Mlx5Error::Io {
                    what: "starting an mlx5 event thread",
                    source,
                })
        };
        let (e, h) = (eq.clone(), self.runtime.health.clone());
        let events = spawn("mlx5-events", Box::new(move || event_thread(e, h)))?;
        let (e, p, h) = (eq.clone(), self.pages.clone(), self.runtime.health.clone());
        let pages = match spawn("mlx5-pages", Box::new(move || page_thread(e, p, h))) {
            Ok(p) => p,
            Err(err) => {
                eq.request_stop();
                let _ = events.join();
                return Err(err);
            }
        };
        self.runtime.threads = Some(EventThreads { events, pages });
        // §7.1: arm right after creation (the thread drains what came).
        eq.doorbell(0, true);
        self.cmdq().set_events(Some(eq.clone()));
        info!(
            eqn,
            nent,
            mask = format_args!("{mask:#x}"),
            "async EQ on vector 0, drained by the event thread"
        );
        Ok(())
    }

    /// Back to polled commands, the threads stopped, then DESTROY_EQ
    /// (teardown).
    pub(crate) fn destroy_events(&mut self) -> Result<(), Mlx5Error> {
        if self.runtime.events.is_none() {
            return Ok(());
        }
        self.cmdq().set_events(None);
        self.runtime.stop_threads();
        let Some(eq) = self.runtime.events.take() else {
            return Ok(());
        };
        let mut buf = vec![0u8; DestroyEqIn::<&[u8]>::SIZE_BYTES];
        DestroyEqIn::new_checked(&mut buf[..])
            .and_then(|mut v| v.set_eq_number(eq.eqn))
            .map_err(prm("DESTROY_EQ"))?;
        let r = self.cmdq().exec(
            CmdOpcode::DestroyEq,
            0,
            &buf,
            DestroyEqOut::<&[u8]>::SIZE_BYTES,
        );
        let _ = self.function().disable_msix();
        r.map(|_| ())
    }

    /// The EQ number CQs name, once [`Hca::enable_events`] ran.
    pub fn eqn(&self) -> Option<u32> {
        self.runtime.events.as_ref().map(|e| e.eqn)
    }

    /// What the event queue counted (zeros without one).
    pub fn event_counters(&self) -> EventCounters {
        self.runtime
            .events
            .as_ref()
            .map(|e| lock(&e.state).counters)
            .unwrap_or_default()
    }

    /// Drain the event queue now, then wait up to `timeout` until every
    /// page request that arrived has been answered by the page worker. The
    /// event thread does both by itself; this makes "the firmware's request
    /// is answered" something a caller can wait for.
    pub fn process_events(&self, timeout: Duration) -> Result<(), Mlx5Error> {
        if let Some(eq) = &self.runtime.events {
            eq.drain();
            eq.wait_pages_idle(timeout);
        }
        Ok(())
    }

    pub(crate) fn events_register_cq(&self, cqn: u32, notify: &Arc<CqNotify>) {
        if let Some(eq) = &self.runtime.events {
            lock(&eq.state).cqs.insert(cqn, notify.clone());
        }
    }

    pub(crate) fn events_unregister_cq(&self, cqn: u32) {
        if let Some(eq) = &self.runtime.events {
            lock(&eq.state).cqs.remove(&cqn);
        }
    }

    /// Let the fatal transition reach `qp` (its flush flag).
    pub(crate) fn register_qp(&self, qp: Arc<dyn crate::firmware::health::Flush>) {
        self.runtime.health.register_qp(qp);
    }

    /// Whether the function was found fatal by [`Hca::check_health`] (or
    /// the event thread's periodic check).
    #[inline(always)]
    pub fn is_fatal(&self) -> bool {
        self.runtime.health.is_fatal()
    }

    /// Read the health buffer and counter (§2) and judge them
    /// ([`crate::firmware::health`]): fatal is `rfr && synd`, PCI gone, the NIC
    /// interface disabled or in SW reset, or the counter standing still
    /// for [`crate::firmware::health::HEALTH_STUCK`]. A fatal function has every QP in
    /// ERR, posts fail with [`crate::PostFailure::DeviceFatal`], CQ polls
    /// return the outstanding work flushed, and no further command is sent.
    /// A syndrome without `rfr` is reported ([`Hca::health_report`], a log
    /// line) and the function keeps running.
    pub fn check_health(&self) -> Result<crate::Health, Mlx5Error> {
        self.runtime.health.check()
    }

    /// What the health checks found so far (non-fatal syndromes included).
    pub fn health_report(&self) -> crate::firmware::health::HealthReport {
        self.runtime.health.report()
    }

    /// A thread that runs [`Hca::check_health`] every `period` until the
    /// handle drops or the function turns fatal. It holds the `Hca` only
    /// weakly. (The event thread already checks every [`HEALTH_PERIOD`]
    /// once [`Hca::enable_events`] ran; this is for a function without
    /// events, or a shorter period.)
    pub fn spawn_health_poller(self: &Arc<Self>, period: Duration) -> HealthPoller {
        let weak: Weak<Hca> = Arc::downgrade(self);
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::Builder::new()
            .name("mlx5-health".into())
            .spawn(move || {
                while !flag.load(Ordering::Acquire) {
                    let Some(hca) = weak.upgrade() else { return };
                    if hca.check_health().is_err() {
                        return;
                    }
                    drop(hca);
                    std::thread::sleep(period);
                }
            })
            .ok();
        HealthPoller { stop, handle }
    }

    /// A BlueFlame register of the UAR page for one QP alone (registers
    /// below [`SHARED_BF_REG`]); `None` when all are taken.
    pub(crate) fn alloc_bf_reg(&self) -> Option<usize> {
        let mut used = lock(&self.runtime.bf_regs);
        let free = (0..SHARED_BF_REG).find(|i| *used & (1 << i) == 0)?;
        *used |= 1 << free;
        Some(free)
    }

    pub(crate) fn free_bf_reg(&self, i: usize) {
        *lock(&self.runtime.bf_regs) &= !(1u8 << i);
    }

    /// BlueFlame register size: 1 << `log_bf_reg_size` (§8; 512 if unset).
    pub fn bf_reg_size(&self) -> usize {
        let log = self
            .general_caps()
            .map(|c| c.log_bf_reg_size())
            .unwrap_or(9);
        1usize << log.clamp(6, 9)
    }
}

/// The thread of [`Hca::spawn_health_poller`]; dropping it stops it.
#[derive(Debug)]
pub struct HealthPoller {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl Drop for HealthPoller {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rnic_dma::{IovaAllocator, RecordingMapper};
    use rnic_mlx5_prm::Eqe;

    use crate::function::memory::IovaSpace;

    struct FakeEq {
        buf: Arc<DmaBuffer>,
        log: u32,
        pi: u32,
    }

    impl FakeEq {
        fn new(log: u32) -> FakeEq {
            let space = IovaSpace::new(
                "fake".into(),
                Arc::new(RecordingMapper::new()),
                IovaAllocator::new(&[0x10_0000..=0xFFFF_FFFF]),
            );
            let buf = space.alloc((1usize << log) * EQE_BYTES).unwrap();
            for i in 0..1usize << log {
                buf.write(i * EQE_BYTES + 63, &[EQE_OWNER_INIT]).unwrap();
            }
            FakeEq { buf, log, pi: 0 }
        }

        fn push(&mut self, ty: u8, fill: impl FnOnce(&mut Eqe<&mut [u8]>)) {
            let mut e = [0u8; EQE_BYTES];
            {
                let mut v = Eqe::new_checked(&mut e[..]).unwrap();
                v.set_event_type(ty.into()).unwrap();
                fill(&mut v);
                v.set_owner((self.pi >> self.log) & 1).unwrap();
            }
            let at = ((self.pi & ((1 << self.log) - 1)) as usize) * EQE_BYTES;
            self.buf.write(at, &e[..63]).unwrap();
            self.buf.write(at + 63, &e[63..]).unwrap();
            self.pi += 1;
        }
    }

    #[test]
    fn eqes_are_taken_by_owner_parity_and_unknown_types_counted() {
        let mut dev = FakeEq::new(2); // 4 entries: wraps
        let mut st = EqState::default();
        let notify = Arc::new(CqNotify::default());
        st.cqs.insert(5, notify.clone());
        let mut rings = Vec::new();
        assert_eq!(
            drain_ring(dev.buf.words(), 2, &mut st, |c, a| rings.push((c, a))),
            0
        );
        assert!(rings.is_empty(), "owner 1 at first pass: nothing valid");
        dev.push(EventType::Cmd.as_raw(), |v| {
            v.cmd_inter_comp_event_mut()
                .set_command_completion_vector(0b101)
                .unwrap();
        });
        dev.push(EventType::PageRequest.as_raw(), |v| {
            v.pages_req_event_mut().set_num_pages(10).unwrap();
        });
        dev.push(0x3f, |_| {}); // unknown type
        assert_eq!(
            drain_ring(dev.buf.words(), 2, &mut st, |c, a| rings.push((c, a))),
            3
        );
        assert_eq!(rings, vec![(3, true)]);
        assert!(EventQueue::take(&mut st, 0));
        assert!(!EventQueue::take(&mut st, 1));
        assert!(EventQueue::take(&mut st, 2));
        assert!(!EventQueue::take(&mut st, 2), "taken once");
        assert_eq!(st.pages, 10);
        // Second pass of the ring (owner 1 now valid).
        dev.push(EventType::PageRequest.as_raw(), |v| {
            v.pages_req_event_mut()
                .set_num_pages((-4i32) as u32)
                .unwrap();
        });
        dev.push(EventType::Completion.as_raw(), |v| {
            v.comp_event_mut().set_cq_number(5).unwrap();
        });
        dev.push(EventType::Completion.as_raw(), |v| {
            v.comp_event_mut().set_cq_number(6).unwrap();
        });
        dev.push(EventType::PortChange.as_raw(), |_| {});
        assert_eq!(drain_ring(dev.buf.words(), 2, &mut st, |_, _| {}), 4);
        assert_eq!(st.pages, 6);
        assert_eq!(notify.events.load(Ordering::Relaxed), 1);
        let k = st.counters;
        assert_eq!(
            (
                k.eqes,
                k.command,
                k.page_requests,
                k.completion,
                k.unknown_cq,
                k.unknown_type,
                k.port_change
            ),
            (7, 1, 2, 2, 1, 1, 1)
        );
        // A stale entry (previous pass's owner) stops the drain.
        assert_eq!(drain_ring(dev.buf.words(), 2, &mut st, |_, _| {}), 0);
        assert_eq!(st.ci, 7);
    }

    #[test]
    fn a_long_drain_updates_the_consumer_index_every_0x80_entries() {
        let mut dev = FakeEq::new(8);
        let mut st = EqState::default();
        for _ in 0..200 {
            dev.push(EventType::SqDrained.as_raw(), |_| {});
        }
        let mut rings = Vec::new();
        assert_eq!(
            drain_ring(dev.buf.words(), 8, &mut st, |c, a| rings.push((c, a))),
            200
        );
        assert_eq!(rings, vec![(0x80, false), (200, true)]);
        assert_eq!(st.counters.qp_events, 200);
    }
}
