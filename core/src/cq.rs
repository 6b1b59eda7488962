//! Completion queues, and the credit accounting that makes CQ overflow
//! impossible by construction.
//!
//! # The rule
//!
//! Each [`CompletionQueue`] owns a [`CreditWindow`] whose limit is the CQ's
//! depth. A work request may produce a completion in a CQ, so it may only be
//! posted while it holds one of that CQ's credits:
//!
//! * posting receives takes one credit per request from the QP's *receive*
//!   CQ; posting sends takes one credit per request from the QP's *send* CQ —
//!   signaled or not, because an unsignaled request still produces a
//!   completion when it fails or is flushed;
//! * a post that would exceed the window is refused whole with
//!   [`PostError::CqFull`] (naming the depth and the credits in flight) and the
//!   window counts a stall; nothing of the refused batch is posted;
//! * polling gives credits back: a receive completion returns 1; a send
//!   completion for QP *q* returns the credit of its request **and of every
//!   unsignaled request posted before it on *q*** (send completions arrive in
//!   posting order, and those requests can no longer produce one);
//! * moving a QP to RESET or destroying it returns all its credits (the
//!   provider discards its work and its queued completions).
//!
//! At any moment, then, the completions that can still arrive in a CQ are at
//! most its credits in flight, which never exceed its depth.
//!
//! # Finding the requests a send completion retires
//!
//! Each QP keeps a lock-free single-producer/single-consumer ring of
//! `(wr_id, signaled)` entries in posting order, sized to its send queue. On a
//! send completion the poller pops from the front through the first entry
//! whose `wr_id` equals the completion's — for a successful completion, the
//! first *signaled* entry with that `wr_id` — and returns one credit per
//! popped entry. If nothing matches (a provider bug, or reused `wr_id`s gone
//! wrong) it pops one entry, conservatively, and counts an unmatched
//! completion. The CQ maps QP numbers to those rings in a table locked once
//! per poll batch; the lock also makes the poller the ring's single consumer.
//! Nothing is locked per message.

use rustc_hash::FxHashMap;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::credit::{CreditStats, CreditWindow};
use crate::provider::{CqHandle, PostError, Provider, VerbsError};
use crate::sq_track::{QpTrack, Retired};
use crate::wr::WorkCompletion;

/// QP number → tracking, for the QPs completing into one CQ.
pub(crate) type QpTable = FxHashMap<u32, Arc<QpTrack>>;

/// The shared state of a completion queue; destroyed with its last owner.
#[derive(Debug)]
pub(crate) struct CqInner {
    pub(crate) provider: Arc<dyn Provider>,
    pub(crate) handle: CqHandle,
    pub(crate) depth: u32,
    pub(crate) credits: CreditWindow,
    /// The QPs completing here. Held across each poll batch.
    table: Mutex<QpTable>,
    unmatched: AtomicU64,
    unknown_qp: AtomicU64,
    release_errors: AtomicU64,
}

impl CqInner {
    /// Lock the QP table (a poisoned lock is still usable: the table holds
    /// no invariant a panic could break half-way).
    pub(crate) fn lock_table(&self) -> MutexGuard<'_, QpTable> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Take `n` credits for a post, or the error that refuses it.
    pub(crate) fn acquire(&self, n: u32) -> Result<(), PostError> {
        self.credits
            .try_acquire(n)
            .map_err(|stall| PostError::CqFull {
                cq: self.handle,
                depth: self.depth,
                in_flight: stall.in_flight,
                requested: n,
            })
    }

    /// Give back `n` credits; an over-release is logged and counted (it means
    /// a provider broke the completion contract), never panics.
    pub(crate) fn release(&self, n: u32) {
        if let Err(e) = self.credits.release(n) {
            self.release_errors.fetch_add(1, Ordering::Relaxed);
            tracing::error!(cq = %self.handle, error = %e, "credit accounting out of step");
        }
    }

    /// Credits returned by the completions in `wcs`, looked up in `table`.
    fn retire(&self, table: &QpTable, wcs: &[WorkCompletion]) -> u32 {
        let mut credits = 0u32;
        let mut cached: Option<(u32, &Arc<QpTrack>)> = None;
        for wc in wcs {
            let qpn = wc.qp_num.get();
            let track = match cached {
                Some((n, t)) if n == qpn => Some(t),
                _ => table.get(&qpn),
            };
            let Some(track) = track else {
                self.unknown_qp.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(cq = %self.handle, qpn, wr_id = wc.wr_id, "completion for a QP not attached to this CQ");
                continue;
            };
            cached = Some((qpn, track));
            if wc.opcode.is_recv() {
                if track.retire_recv() {
                    credits = credits.saturating_add(1);
                } else {
                    self.unmatched.fetch_add(1, Ordering::Relaxed);
                }
            } else {
                match track.sq.retire(wc.wr_id, wc.status.is_success()) {
                    Retired::Matched(n) => credits = credits.saturating_add(n),
                    Retired::Fallback => {
                        credits = credits.saturating_add(1);
                        self.unmatched.fetch_add(1, Ordering::Relaxed);
                    }
                    Retired::Nothing => {
                        self.unmatched.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
        credits
    }
}

impl Drop for CqInner {
    fn drop(&mut self) {
        tracing::debug!(cq = %self.handle, "destroy_cq");
        if let Err(e) = self.provider.destroy_cq(self.handle) {
            tracing::error!(cq = %self.handle, error = %e, "destroy_cq failed during drop");
        }
    }
}

/// Counters of a completion queue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct CqStats {
    /// The queue's depth (the credit limit).
    pub depth: u32,
    /// Work requests that may still complete into the queue.
    pub in_flight: u32,
    /// The credit window's counters (stalls = refused posts).
    pub credits: CreditStats,
    /// Completions that matched no outstanding request of their QP.
    pub unmatched_completions: u64,
    /// Completions for QPs not attached to this queue.
    pub unknown_qp_completions: u64,
    /// Credit releases refused as over-releases.
    pub credit_release_errors: u64,
}

/// A completion queue. Cloning is cheap and shares the queue; the device
/// queue is destroyed when the last clone and the last QP using it are gone.
#[derive(Debug, Clone)]
pub struct CompletionQueue {
    pub(crate) inner: Arc<CqInner>,
}

impl CompletionQueue {
    /// Create a queue of at least `depth` entries through `provider`.
    pub(crate) fn create(
        provider: &Arc<dyn Provider>,
        depth: u32,
    ) -> Result<CompletionQueue, VerbsError> {
        let info = provider.create_cq(depth)?;
        let credits = match CreditWindow::with_default_watermarks(info.depth) {
            Ok(w) => w,
            Err(e) => {
                if let Err(destroy) = provider.destroy_cq(info.handle) {
                    tracing::error!(cq = %info.handle, error = %destroy, "destroy_cq after a failed create");
                }
                return Err(VerbsError::CreateCq {
                    depth,
                    reason: format!("the provider reported depth {}: {e}", info.depth),
                });
            }
        };
        tracing::debug!(cq = %info.handle, depth = info.depth, "create_cq");
        Ok(CompletionQueue {
            inner: Arc::new(CqInner {
                provider: Arc::clone(provider),
                handle: info.handle,
                depth: info.depth,
                credits,
                table: Mutex::new(FxHashMap::default()),
                unmatched: AtomicU64::new(0),
                unknown_qp: AtomicU64::new(0),
                release_errors: AtomicU64::new(0),
            }),
        })
    }

    /// The provider's handle.
    pub fn handle(&self) -> CqHandle {
        self.inner.handle
    }

    /// Entries the queue holds: the most work requests that may be
    /// outstanding against it.
    pub fn depth(&self) -> u32 {
        self.inner.depth
    }

    /// Work requests that may still complete into the queue.
    pub fn in_flight(&self) -> u32 {
        self.inner.credits.in_flight()
    }

    /// Work requests that could be posted against the queue now.
    pub fn available(&self) -> u32 {
        self.inner.credits.available()
    }

    /// Counters.
    pub fn stats(&self) -> CqStats {
        CqStats {
            depth: self.inner.depth,
            in_flight: self.inner.credits.in_flight(),
            credits: self.inner.credits.stats(),
            unmatched_completions: self.inner.unmatched.load(Ordering::Relaxed),
            unknown_qp_completions: self.inner.unknown_qp.load(Ordering::Relaxed),
            credit_release_errors: self.inner.release_errors.load(Ordering::Relaxed),
        }
    }

    /// Move up to `wcs.len()` completions into `wcs` and return how many;
    /// their credits go back to the window. Never waits for the device; it
    /// only waits for a concurrent `poll` of the same queue, or for a QP of
    /// this queue being reset or destroyed, to finish.
    pub fn poll(&self, wcs: &mut [WorkCompletion]) -> Result<usize, VerbsError> {
        let inner = &*self.inner;
        let table = inner.lock_table();
        let n = inner.provider.poll_cq(inner.handle, wcs)?.min(wcs.len());
        let credits = inner.retire(&table, &wcs[..n]);
        drop(table);
        inner.release(credits);
        Ok(n)
    }

    /// Arm the queue: the next completion (the next solicited one, if
    /// `solicited_only`) signals [`CompletionQueue::event_fd`] and wakes
    /// [`CompletionQueue::wait`]. Poll after arming, to catch completions that
    /// arrived before.
    pub fn req_notify(&self, solicited_only: bool) -> Result<(), VerbsError> {
        self.inner
            .provider
            .req_notify_cq(self.inner.handle, solicited_only)
    }

    /// An eventfd to put in epoll, readable after an armed completion;
    /// `None` when the backend has none.
    pub fn event_fd(&self) -> Option<RawFd> {
        self.inner.provider.cq_event_fd(self.inner.handle)
    }

    /// Block until the armed queue signals (`Ok(true)`) or `timeout` passes
    /// (`Ok(false)`); `None` waits forever. Then poll.
    pub fn wait(&self, timeout: Option<Duration>) -> Result<bool, VerbsError> {
        self.inner.provider.wait_cq(self.inner.handle, timeout)
    }
}
