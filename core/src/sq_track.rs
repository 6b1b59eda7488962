//! Per-queue-pair bookkeeping that lets completions return credits.
//!
//! [`SqRing`] is a lock-free single-producer/single-consumer ring of
//! `(wr_id, signaled)` entries, one per posted send request, in posting
//! order. The producer is [`crate::queue_pair::QueuePair::post_send`]
//! (`&mut self`, so there is one); the consumer is the poller of the QP's send
//! CQ (serialized by that CQ's table lock). Indices are free-running `usize`
//! counters, masked into a power-of-two slot array.
//!
//! Posting is two-phase so a completion can never overtake its entry:
//!
//! 1. [`SqRing::reserve`] writes the batch's entries and publishes them up to
//!    `reserved` (Release) — before the provider sees the batch;
//! 2. [`SqRing::commit`] publishes `tail` (and pulls `reserved` back) to the
//!    entries the provider actually accepted.
//!
//! The consumer matches completions against everything up to `reserved`: a
//! completion proves its request (and all before it) was accepted, even if the
//! producer has not committed yet. Entries the provider refused are never
//! completed, so (with a provider that keeps the contract) the consumer never
//! reaches them and the producer can take them back.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};

/// What retiring one send completion did to the ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Retired {
    /// The completion matched an entry; this many entries (the match and the
    /// unsignaled ones before it) were popped.
    Matched(u32),
    /// Nothing matched; the oldest committed entry was popped (conservative).
    Fallback,
    /// Nothing matched and nothing was outstanding.
    Nothing,
}

#[derive(Default)]
struct Slot {
    wr_id: AtomicU64,
    signaled: AtomicBool,
}

/// The SPSC ring of outstanding send requests (see the module docs).
pub(crate) struct SqRing {
    slots: Box<[Slot]>,
    mask: usize,
    /// Consumer: next entry to retire.
    head: AtomicUsize,
    /// Producer: end of the entries the provider accepted.
    tail: AtomicUsize,
    /// Producer: end of the entries written (accepted or being posted).
    reserved: AtomicUsize,
}

impl SqRing {
    /// A ring of at least `min_entries` (and at least one) slots.
    pub(crate) fn new(min_entries: u32) -> SqRing {
        let cap = (min_entries.max(1) as usize).next_power_of_two();
        SqRing {
            slots: (0..cap).map(|_| Slot::default()).collect(),
            mask: cap - 1,
            head: AtomicUsize::new(0),
            tail: AtomicUsize::new(0),
            reserved: AtomicUsize::new(0),
        }
    }

    /// Number of slots.
    pub(crate) fn capacity(&self) -> usize {
        self.mask + 1
    }

    fn slot(&self, index: usize) -> &Slot {
        // `mask + 1 == slots.len()`, so the masked index is always in bounds.
        &self.slots[index & self.mask]
    }

    /// Producer: committed entries not yet retired. A value beyond the
    /// capacity (a provider that completed requests it never accepted) reads
    /// as full.
    pub(crate) fn outstanding(&self) -> usize {
        let used = self
            .tail
            .load(Ordering::Relaxed)
            .wrapping_sub(self.head.load(Ordering::Acquire));
        used.min(self.capacity())
    }

    /// Producer: write `entries` after the committed ones and publish them to
    /// the consumer. The caller has checked there is room. Returns the index
    /// of the first entry, for [`SqRing::commit`].
    pub(crate) fn reserve(&self, entries: impl Iterator<Item = (u64, bool)>) -> usize {
        let base = self.tail.load(Ordering::Relaxed);
        let mut end = base;
        for (wr_id, signaled) in entries {
            let slot = self.slot(end);
            slot.wr_id.store(wr_id, Ordering::Relaxed);
            slot.signaled.store(signaled, Ordering::Relaxed);
            end = end.wrapping_add(1);
        }
        self.reserved.store(end, Ordering::Release);
        base
    }

    /// Producer: `posted` entries from `base` were accepted; the rest of the
    /// reservation is dropped.
    pub(crate) fn commit(&self, base: usize, posted: usize) {
        let end = base.wrapping_add(posted);
        self.tail.store(end, Ordering::Release);
        self.reserved.store(end, Ordering::Release);
    }

    /// Consumer: retire one send completion for `wr_id`.
    ///
    /// Pops from the front through the first entry with that `wr_id` — for a
    /// successful completion, the first *signaled* such entry (a success
    /// completion is only produced for signaled requests). Entries before it
    /// are unsignaled requests the completion implicitly retires.
    pub(crate) fn retire(&self, wr_id: u64, success: bool) -> Retired {
        let head = self.head.load(Ordering::Relaxed);
        let reserved = self.reserved.load(Ordering::Acquire);
        let pending = reserved.wrapping_sub(head);
        if pending <= self.capacity() {
            for k in 0..pending {
                let index = head.wrapping_add(k);
                let slot = self.slot(index);
                if slot.wr_id.load(Ordering::Relaxed) == wr_id
                    && (!success || slot.signaled.load(Ordering::Relaxed))
                {
                    self.head.store(index.wrapping_add(1), Ordering::Release);
                    return Retired::Matched(u32::try_from(k + 1).unwrap_or(u32::MAX));
                }
            }
        }
        let committed = self.tail.load(Ordering::Acquire).wrapping_sub(head);
        if committed >= 1 && committed <= self.capacity() {
            self.head.store(head.wrapping_add(1), Ordering::Release);
            Retired::Fallback
        } else {
            Retired::Nothing
        }
    }

    /// Producer and consumer at once (the caller holds both roles: the QP
    /// exclusively and its send CQ's table lock): forget every committed
    /// entry. Returns how many there were.
    pub(crate) fn drain(&self) -> u32 {
        let tail = self.tail.load(Ordering::Acquire);
        let n = self.outstanding();
        self.head.store(tail, Ordering::Release);
        self.reserved.store(tail, Ordering::Release);
        u32::try_from(n).unwrap_or(u32::MAX)
    }
}

impl fmt::Debug for SqRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqRing")
            .field("capacity", &self.capacity())
            .field("head", &self.head.load(Ordering::Relaxed))
            .field("tail", &self.tail.load(Ordering::Relaxed))
            .field("reserved", &self.reserved.load(Ordering::Relaxed))
            .finish()
    }
}

/// What a CQ needs to know about one QP to return its credits.
#[derive(Debug)]
pub(crate) struct QpTrack {
    /// Outstanding send requests.
    pub(crate) sq: SqRing,
    /// Outstanding receive requests.
    recv_outstanding: AtomicU32,
}

impl QpTrack {
    /// Tracking for a QP with room for `max_send_wr` sends.
    pub(crate) fn new(max_send_wr: u32) -> QpTrack {
        QpTrack {
            sq: SqRing::new(max_send_wr),
            recv_outstanding: AtomicU32::new(0),
        }
    }

    /// Receive requests outstanding.
    pub(crate) fn recv_outstanding(&self) -> u32 {
        self.recv_outstanding.load(Ordering::Acquire)
    }

    /// Count `n` more receives if that keeps the total within `capacity`;
    /// otherwise return the current count.
    pub(crate) fn try_add_recv(&self, n: u32, capacity: u32) -> Result<(), u32> {
        self.recv_outstanding
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
                cur.checked_add(n).filter(|&next| next <= capacity)
            })
            .map(|_| ())
    }

    /// Forget `n` receives that were counted but not posted.
    pub(crate) fn sub_recv(&self, n: u32) {
        // Saturating: never wraps, even if a provider misbehaves.
        let _ = self
            .recv_outstanding
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
                Some(cur.saturating_sub(n))
            });
    }

    /// Retire one receive; `false` when none was outstanding.
    pub(crate) fn retire_recv(&self) -> bool {
        self.recv_outstanding
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
                cur.checked_sub(1)
            })
            .is_ok()
    }

    /// Forget every outstanding receive; returns how many there were.
    pub(crate) fn drain_recv(&self) -> u32 {
        self.recv_outstanding.swap(0, Ordering::AcqRel)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn post(ring: &SqRing, entries: &[(u64, bool)]) {
        let base = ring.reserve(entries.iter().copied());
        ring.commit(base, entries.len());
    }

    #[test]
    fn signaled_completion_retires_the_unsignaled_before_it() {
        let ring = SqRing::new(8);
        post(
            &ring,
            &[(1, false), (2, false), (3, true), (4, false), (5, true)],
        );
        assert_eq!(ring.outstanding(), 5);
        assert_eq!(ring.retire(3, true), Retired::Matched(3));
        assert_eq!(ring.outstanding(), 2);
        assert_eq!(ring.retire(5, true), Retired::Matched(2));
        assert_eq!(ring.outstanding(), 0);
        assert_eq!(ring.retire(5, true), Retired::Nothing);
    }

    #[test]
    fn success_matches_signaled_entries_only_errors_match_any() {
        let ring = SqRing::new(8);
        post(&ring, &[(7, false), (7, true), (9, false)]);
        // A success for wr_id 7 belongs to the signaled one.
        assert_eq!(ring.retire(7, true), Retired::Matched(2));
        // An error for the unsignaled 9 retires it.
        assert_eq!(ring.retire(9, false), Retired::Matched(1));
        post(&ring, &[(11, false), (12, true)]);
        // An unknown wr_id pops one, conservatively.
        assert_eq!(ring.retire(99, true), Retired::Fallback);
        assert_eq!(ring.outstanding(), 1);
    }

    #[test]
    fn completion_may_overtake_commit_but_not_reservation() {
        let ring = SqRing::new(4);
        let base = ring.reserve([(1, true), (2, true), (3, true)].into_iter());
        // The provider accepted the batch and completed #2 before commit.
        assert_eq!(ring.retire(2, true), Retired::Matched(2));
        ring.commit(base, 3);
        assert_eq!(ring.outstanding(), 1);
        // A refused tail is dropped and its slots are reused.
        let base = ring.reserve([(4, true), (5, true)].into_iter());
        ring.commit(base, 1);
        assert_eq!(ring.outstanding(), 2);
        post(&ring, &[(6, true)]);
        assert_eq!(ring.retire(6, true), Retired::Matched(3));
        assert_eq!(ring.outstanding(), 0);
    }

    #[test]
    fn wraps_around_many_times() {
        let ring = SqRing::new(3);
        assert_eq!(ring.capacity(), 4);
        for round in 0..1_000u64 {
            post(&ring, &[(round * 2, false), (round * 2 + 1, true)]);
            assert_eq!(ring.retire(round * 2 + 1, true), Retired::Matched(2));
        }
        assert_eq!(ring.outstanding(), 0);
    }

    #[test]
    fn drain_forgets_everything() {
        let ring = SqRing::new(8);
        post(&ring, &[(1, false), (2, true)]);
        assert_eq!(ring.drain(), 2);
        assert_eq!(ring.outstanding(), 0);
        assert_eq!(ring.retire(2, true), Retired::Nothing);
    }

    #[test]
    fn recv_counting() {
        let t = QpTrack::new(4);
        assert_eq!(t.try_add_recv(3, 4), Ok(()));
        assert_eq!(t.try_add_recv(2, 4), Err(3));
        assert!(t.retire_recv());
        t.sub_recv(10);
        assert_eq!(t.recv_outstanding(), 0);
        assert!(!t.retire_recv());
        t.try_add_recv(4, 4).expect("room");
        assert_eq!(t.drain_recv(), 4);
    }

    #[test]
    fn producer_and_consumer_threads() {
        const TOTAL: u64 = 50_000;
        let ring = Arc::new(SqRing::new(16));
        let (tx, rx) = std::sync::mpsc::channel::<u64>();
        let producer = {
            let ring = Arc::clone(&ring);
            std::thread::spawn(move || {
                let mut next = 0u64;
                while next < TOTAL {
                    if ring.outstanding() + 4 > ring.capacity() {
                        std::thread::yield_now();
                        continue;
                    }
                    // Every 4th request is signaled; the "device" completes it.
                    let batch: Vec<(u64, bool)> =
                        (next..next + 4).map(|id| (id, id % 4 == 3)).collect();
                    let base = ring.reserve(batch.iter().copied());
                    tx.send(next + 3).expect("consumer alive");
                    ring.commit(base, 4);
                    next += 4;
                }
            })
        };
        let mut retired = 0u64;
        for wr_id in rx.iter().take((TOTAL / 4) as usize) {
            match ring.retire(wr_id, true) {
                Retired::Matched(n) => retired += u64::from(n),
                other => panic!("completion {wr_id} did not match: {other:?}"),
            }
        }
        producer.join().expect("producer finished");
        assert_eq!(retired, TOTAL);
        assert_eq!(ring.outstanding(), 0);
    }
}
