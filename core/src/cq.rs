//! Completion queues, and the credit accounting that makes CQ overflow
//! impossible by construction.
//!
//! # The rule
//!
//! Each [`CompletionQueue`] owns a [`CreditWindow`] whose limit is the CQ's
//! depth. A work request may produce a completion in a CQ, so it may only be
//! outstanding while it holds one of that CQ's credits. A driver never lets a
//! queue hold more outstanding requests than the capacity it granted, and a
//! request is outstanding until the poll that retires it (see
//! [`crate::provider`]). So credits are taken in one of two ways, chosen when
//! the CQ is created ([`CqCredits`]):
//!
//! * **Reserved** ([`CqCredits::Reserved`], `Context::create_cq_reserved`:
//!   the CQ is deep enough for its queues, as perftest and the examples size
//!   them): each QP reserves its whole queue depth once, at creation (send
//!   depth on the send CQ, receive depth on the receive CQ, both when they
//!   are the same queue) and returns it when destroyed; a QP that does not
//!   fit is refused at creation ([`VerbsError::CqOversubscribed`]). Posting
//!   and polling then touch no credit at all: the queue's own capacity bounds
//!   what can complete.
//! * **Shared** ([`CqCredits::Shared`], `Context::create_cq`, the default:
//!   any number of queues share the CQ): a QP takes one credit per request
//!   from the window when it posts — signaled or not, because an unsignaled
//!   request still produces a completion when it fails or is flushed — and a
//!   post that would exceed the window is refused whole with
//!   [`PostError::CqFull`] and counted as a stall. Polling gives the credits
//!   back: a receive completion returns 1, a send completion
//!   `1 + retired_unsignaled` (the driver says how many unsignaled requests it
//!   retired with it). Moving the QP to RESET or destroying it returns what
//!   the driver reports as discarded.
//!
//! Why not decide automatically (reserve while the queues fit, share the
//! rest)? A QP that reserved the whole depth and went idle would starve every
//! QP attached after it, with no poll able to help: the rxe IPv6 suite (an RC
//! pair, then a UD pair, on one 256-deep CQ) did exactly that. The choice is
//! the application's, made once, and both are safe.
//!
//! At any moment, then, the completions that can still arrive in a CQ are at
//! most its credits in flight, which never exceed its depth.
//!
//! # Cost
//!
//! A reserved CQ polls with one relaxed load of a counter that changes only
//! when QPs are created or destroyed, and its QPs post without touching it.
//! A shared CQ takes its attachment lock once per poll batch and makes one
//! atomic release per batch; its QPs make one compare-and-swap per post
//! batch (today's cost, kept for the oversubscribed case).

use rustc_hash::FxHashSet;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::credit::{CreditStats, CreditWindow};
use crate::error::{DeviceError, DeviceErrorKind};
use crate::provider::{CqOps, DynDevice, PostError, Provider, VerbsError};
use crate::types::Qpn;
use crate::wr::WorkCompletion;

/// Which QPs of a CQ are windowed.
#[derive(Debug, Default)]
pub(crate) struct Attached {
    /// QPs with a static reservation here.
    static_qps: u32,
    /// QPNs of the QPs taking credits per request here.
    windowed: FxHashSet<u32>,
}

/// How a QP takes credits from one CQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CreditMode {
    /// Reserved `n` credits at creation.
    Static(u32),
    /// One credit per request.
    Windowed,
}

/// How the QPs of a completion queue take its credits (chosen when it is
/// created; see the module docs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum CqCredits {
    /// One credit per request from the CQ's window, returned at poll: any
    /// number of queues may share the CQ (ibverbs' model, made safe). Costs
    /// one atomic read-modify-write per post batch and per poll batch.
    #[default]
    Shared,
    /// Each QP reserves its queue depths once, at creation, and returns them
    /// when destroyed; a QP that does not fit is refused
    /// ([`VerbsError::CqOversubscribed`]). Posting and polling take no credit:
    /// the queues' own capacity bounds what can complete.
    Reserved,
}

/// The part of a CQ its QPs share: depth and credits.
#[derive(Debug)]
pub(crate) struct CqShared {
    pub(crate) depth: u32,
    policy: CqCredits,
    pub(crate) credits: CreditWindow,
    /// Windowed QPs attached (read per poll, written per QP create/destroy).
    windowed_qps: AtomicU32,
    attached: Mutex<Attached>,
    release_errors: AtomicU64,
}

impl CqShared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Attached> {
        self.attached.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Attach QP `qpn` needing `need` credits: on a [`CqCredits::Reserved`]
    /// queue a static reservation (refused when it does not fit), on a
    /// [`CqCredits::Shared`] one per request.
    pub(crate) fn attach(&self, qpn: Qpn, need: u32) -> Result<CreditMode, VerbsError> {
        let mut a = self.lock();
        match self.policy {
            CqCredits::Reserved => {
                if need > 0 {
                    self.credits.try_reserve(need).map_err(|stall| {
                        VerbsError::CqOversubscribed {
                            depth: self.depth,
                            reserved: stall.in_flight,
                            needed: need,
                        }
                    })?;
                    a.static_qps += 1;
                }
                Ok(CreditMode::Static(need))
            }
            CqCredits::Shared => {
                a.windowed.insert(qpn.get());
                self.windowed_qps.fetch_add(1, Ordering::Relaxed);
                Ok(CreditMode::Windowed)
            }
        }
    }

    /// Detach a QP attached with `mode`, returning `windowed_held` credits it
    /// still held (windowed mode). The caller holds the lock (`a`).
    pub(crate) fn detach(&self, a: &mut Attached, qpn: Qpn, mode: CreditMode, windowed_held: u32) {
        match mode {
            CreditMode::Static(0) => {}
            CreditMode::Static(n) => {
                a.static_qps = a.static_qps.saturating_sub(1);
                self.release(n);
            }
            CreditMode::Windowed => {
                if a.windowed.remove(&qpn.get()) {
                    self.windowed_qps.fetch_sub(1, Ordering::Relaxed);
                }
                self.release(windowed_held);
            }
        }
    }

    /// Take `n` credits for a windowed post, or the error that refuses it.
    pub(crate) fn acquire(&self, n: u32) -> Result<(), PostError> {
        self.credits
            .try_acquire(n)
            .map_err(|stall| PostError::CqFull {
                depth: self.depth,
                in_flight: stall.in_flight,
                requested: n,
            })
    }

    /// Give back `n` credits; an over-release is logged and counted (it means
    /// a driver broke the completion contract), never panics.
    pub(crate) fn release(&self, n: u32) {
        if let Err(e) = self.credits.release(n) {
            self.release_errors.fetch_add(1, Ordering::Relaxed);
            tracing::error!(error = %e, "credit accounting out of step");
        }
    }
}

/// [`CompletionQueue::poll`] of a queue with windowed QPs: their credits
/// go back to the window (out of line).
#[cold]
fn poll_windowed<C: CqOps + ?Sized>(
    shared: &CqShared,
    ops: &mut C,
    wcs: &mut [WorkCompletion],
) -> Result<usize, VerbsError> {
    let a = shared.lock();
    let n = ops.poll(wcs)?.min(wcs.len());
    let polled = wcs.get(..n).unwrap_or(&[]);
    let credits: u32 = if a.static_qps == 0 {
        polled.iter().map(credits_of).sum()
    } else {
        polled
            .iter()
            .filter(|wc| a.windowed.contains(&wc.qp_num.get()))
            .map(credits_of)
            .sum()
    };
    drop(a);
    shared.release(credits);
    Ok(n)
}

/// Credits a completion returns to a windowed QP's CQ.
#[inline]
fn credits_of(wc: &WorkCompletion) -> u32 {
    if wc.opcode.is_recv() {
        1
    } else {
        wc.retired_unsignaled.saturating_add(1)
    }
}

/// Counters of a completion queue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct CqStats {
    /// The queue's depth (the credit limit).
    pub depth: u32,
    /// Credits taken: static reservations plus windowed requests in flight.
    pub in_flight: u32,
    /// The credit window's counters (stalls = refused posts).
    pub credits: CreditStats,
    /// QPs with a static reservation on this queue.
    pub static_qps: u32,
    /// QPs taking credits per request on this queue.
    pub windowed_qps: u32,
    /// Credit releases refused as over-releases.
    pub credit_release_errors: u64,
}

/// A completion queue's counters, readable from any thread while the owner
/// polls (a stats server, a monitor). Cloning is cheap.
#[derive(Debug, Clone)]
pub struct CqCounters(Arc<CqShared>);

impl CqCounters {
    /// The counters now.
    pub fn stats(&self) -> CqStats {
        let sh = &*self.0;
        let a = sh.lock();
        CqStats {
            depth: sh.depth,
            in_flight: sh.credits.in_flight(),
            credits: sh.credits.stats(),
            static_qps: a.static_qps,
            windowed_qps: u32::try_from(a.windowed.len()).unwrap_or(u32::MAX),
            credit_release_errors: sh.release_errors.load(Ordering::Relaxed),
        }
    }
}

/// A completion queue. The application owns it: one thread polls it (`poll`
/// takes `&mut self`); share it with a lock if several threads must poll. Queue
/// pairs borrow it at creation and keep the driver's part alive themselves,
/// so dropping it before them is safe (the device CQ goes with the last).
#[derive(Debug)]
pub struct CompletionQueue<P: Provider = DynDevice> {
    /// The driver's queue: reached mutably by `poll` (`&mut self`, so one
    /// poller is a compile-time fact: another thread polls only through an
    /// explicit lock, `Mutex<CompletionQueue>`), shared by the rest.
    ops: P::Cq,
    /// `shared.policy == CqCredits::Reserved`, kept here so that a poll of
    /// a reserved queue (whose QPs never take credits per request, so its
    /// windowed-QP count is always 0) tests one byte of its own.
    reserved: bool,
    pub(crate) provider: Arc<P>,
    pub(crate) shared: Arc<CqShared>,
}

impl<P: Provider> CompletionQueue<P> {
    /// Create a queue of at least `depth` entries through `provider`.
    pub(crate) fn create(
        provider: &Arc<P>,
        depth: u32,
        policy: CqCredits,
    ) -> Result<CompletionQueue<P>, VerbsError> {
        let (ops, granted) = provider.create_cq(depth)?;
        let credits =
            CreditWindow::with_default_watermarks(granted).map_err(|_| VerbsError::CreateCq {
                depth,
                source: DeviceError::new(
                    DeviceErrorKind::InvalidArgument,
                    "the driver granted a depth of 0: ask for at least one entry",
                ),
            })?;
        tracing::debug!(depth = granted, "create_cq");
        Ok(CompletionQueue {
            ops,
            reserved: policy == CqCredits::Reserved,
            provider: Arc::clone(provider),
            shared: Arc::new(CqShared {
                depth: granted,
                policy,
                credits,
                windowed_qps: AtomicU32::new(0),
                attached: Mutex::new(Attached::default()),
                release_errors: AtomicU64::new(0),
            }),
        })
    }

    /// How its QPs take credits.
    pub fn credit_policy(&self) -> CqCredits {
        self.shared.policy
    }

    /// The driver's queue object.
    pub fn driver_cq(&self) -> &P::Cq {
        &self.ops
    }

    /// Entries the queue holds: the most work requests that may be
    /// outstanding against it.
    pub fn depth(&self) -> u32 {
        self.shared.depth
    }

    /// Credits taken: static reservations plus windowed requests in flight.
    pub fn in_flight(&self) -> u32 {
        self.shared.credits.in_flight()
    }

    /// Credits free: what new QPs could reserve, or windowed QPs post.
    pub fn available(&self) -> u32 {
        self.shared.credits.available()
    }

    /// Counters.
    pub fn stats(&self) -> CqStats {
        self.counters().stats()
    }

    /// A handle on the counters for other threads.
    pub fn counters(&self) -> CqCounters {
        CqCounters(Arc::clone(&self.shared))
    }

    /// Move up to `wcs.len()` completions into `wcs` and return how many.
    /// Never waits for the device. Windowed QPs' credits go back to the
    /// window; reserved QPs have none to return.
    ///
    /// One thread polls: `&mut self`, so sharing the queue between pollers
    /// takes a lock the application chooses, and nothing the caller holds
    /// of the queue (its driver object) is borrowed across a poll — no
    /// run-time borrow flag.
    ///
    /// ```compile_fail
    /// # use rnic_core::{CompletionQueue, WorkCompletion};
    /// fn two_pollers(cq: &mut CompletionQueue) {
    ///     std::thread::scope(|s| {
    ///         for _ in 0..2 {
    ///             // error: `*cq` borrowed mutably by both threads
    ///             s.spawn(|| cq.poll(&mut [WorkCompletion::default(); 4]).is_ok());
    ///         }
    ///     });
    /// }
    /// ```
    ///
    /// ```compile_fail
    /// # use rnic_core::{CompletionQueue, WorkCompletion};
    /// fn poll_while_held(cq: &mut CompletionQueue) {
    ///     let held = cq.driver_cq();
    ///     // error: `*cq` is borrowed by `held`
    ///     let _ = cq.poll(&mut [WorkCompletion::default(); 4]);
    ///     drop(held);
    /// }
    /// ```
    #[inline]
    pub fn poll(&mut self, wcs: &mut [WorkCompletion]) -> Result<usize, VerbsError> {
        let ops = &mut self.ops;
        // A reserved queue has no windowed QPs (`CqShared::attach`).
        if self.reserved || self.shared.windowed_qps.load(Ordering::Relaxed) == 0 {
            return ops.poll(wcs);
        }
        poll_windowed(&self.shared, ops, wcs)
    }

    /// Arm the queue: the next completion (the next solicited one, if
    /// `solicited_only`) signals [`CompletionQueue::event_fd`] and wakes
    /// [`CompletionQueue::wait`]. Poll after arming, to catch completions that
    /// arrived before.
    pub fn req_notify(&self, solicited_only: bool) -> Result<(), VerbsError> {
        self.ops.req_notify(solicited_only)
    }

    /// An eventfd to put in epoll, readable after an armed completion;
    /// `None` when the backend has none.
    pub fn event_fd(&self) -> Option<RawFd> {
        self.ops.event_fd()
    }

    /// Block until the armed queue signals (`Ok(true)`) or `timeout` passes
    /// (`Ok(false)`); `None` waits forever. Then poll.
    pub fn wait(&self, timeout: Option<Duration>) -> Result<bool, VerbsError> {
        self.ops.wait(timeout)
    }
}
