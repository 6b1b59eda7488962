//! Credit-based flow control: a lock-free window over a fixed number of slots.
//!
//! A [`CreditWindow`] hands out at most `limit` credits at a time. rnic gives
//! each completion queue one, sized to the CQ's depth: posting a work request
//! takes a credit, retiring its completion gives it back, so the number of
//! completions that can be pending never exceeds the CQ's depth and CQ
//! overflow is impossible by construction (see [`crate::cq`]).
//!
//! The window is one `AtomicU64` updated by compare-and-swap: the low 32 bits
//! are the credits in flight, bit 32 records whether the high watermark has
//! been crossed since the last low crossing. A refused acquire changes nothing
//! but the stall counter. The counters in [`CreditStats`] are separate atomics:
//! each is exact, but a snapshot taken while other threads move credits may
//! mix moments.
//!
//! Watermarks give hysteresis for back-pressure signals: a *high crossing* is
//! counted when `in_flight` rises to `high` or above; the next *low crossing*
//! is counted when it then falls to `low` or below, and only then can another
//! high crossing count. Crossings therefore alternate, high first.
//!
//! ```
//! use rnic_core::credit::CreditWindow;
//!
//! let w = CreditWindow::new(4, 3, 1)?;
//! w.try_acquire(3)?;
//! assert!(w.try_acquire(2).is_err()); // would exceed 4: refused, counted
//! w.release(2)?;
//! let s = w.stats();
//! assert_eq!((w.in_flight(), s.stalls, s.high_crossings, s.low_crossings), (1, 1, 1, 1));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::sync::atomic::{AtomicU64, Ordering};

use thiserror::Error;

const IN_FLIGHT_MASK: u64 = 0xFFFF_FFFF;
const ABOVE_HIGH: u64 = 1 << 32;

/// A refused acquire: taking `requested` credits would exceed the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error(
    "credit window full: {requested} more would exceed the limit of {limit} ({in_flight} in \
     flight); retire completions (poll the CQ) and retry"
)]
pub struct CreditStall {
    /// Credits asked for.
    pub requested: u32,
    /// Credits in flight when refused.
    pub in_flight: u32,
    /// The window's limit.
    pub limit: u32,
}

/// A credit window used wrongly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum CreditError {
    /// Creating a window with a zero limit or watermarks out of order.
    #[error(
        "cannot create a credit window with limit {limit}, high watermark {high}, low watermark \
         {low}: need 0 <= low < high <= limit and limit >= 1"
    )]
    Create {
        /// Requested limit.
        limit: u32,
        /// Requested high watermark.
        high: u32,
        /// Requested low watermark.
        low: u32,
    },
    /// Releasing more credits than are in flight (the window is unchanged).
    #[error(
        "cannot release {released} credits: only {in_flight} are in flight (a completion was \
         counted twice, or released without an acquire)"
    )]
    Release {
        /// Credits the caller tried to release.
        released: u32,
        /// Credits in flight at the time.
        in_flight: u32,
    },
}

/// Counters of a [`CreditWindow`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct CreditStats {
    /// Refused acquires.
    pub stalls: u64,
    /// Upward crossings of the high watermark.
    pub high_crossings: u64,
    /// Downward crossings of the low watermark after a high crossing.
    pub low_crossings: u64,
    /// The most credits ever in flight at once.
    pub max_in_flight: u32,
    /// Credits handed out, ever.
    pub acquired_total: u64,
    /// Credits given back, ever.
    pub released_total: u64,
}

/// A lock-free window of at most `limit` credits in flight.
#[derive(Debug)]
pub struct CreditWindow {
    limit: u32,
    high: u32,
    low: u32,
    /// In-flight count (low 32 bits) and the above-high flag (bit 32).
    state: AtomicU64,
    stalls: AtomicU64,
    high_crossings: AtomicU64,
    low_crossings: AtomicU64,
    max_in_flight: AtomicU64,
    acquired_total: AtomicU64,
    released_total: AtomicU64,
}

impl CreditWindow {
    /// A window of `limit` credits with the given watermarks; needs
    /// `low < high <= limit` and `limit >= 1`.
    pub fn new(
        limit: u32,
        high_watermark: u32,
        low_watermark: u32,
    ) -> Result<CreditWindow, CreditError> {
        if limit == 0 || high_watermark > limit || low_watermark >= high_watermark {
            return Err(CreditError::Create {
                limit,
                high: high_watermark,
                low: low_watermark,
            });
        }
        Ok(CreditWindow {
            limit,
            high: high_watermark,
            low: low_watermark,
            state: AtomicU64::new(0),
            stalls: AtomicU64::new(0),
            high_crossings: AtomicU64::new(0),
            low_crossings: AtomicU64::new(0),
            max_in_flight: AtomicU64::new(0),
            acquired_total: AtomicU64::new(0),
            released_total: AtomicU64::new(0),
        })
    }

    /// A window of `limit` credits with watermarks at 3/4 (rounded up) and
    /// 1/4 (rounded down) of it.
    pub fn with_default_watermarks(limit: u32) -> Result<CreditWindow, CreditError> {
        let high = limit - limit / 4;
        let low = (limit / 4).min(high.saturating_sub(1));
        CreditWindow::new(limit, high, low)
    }

    /// Take `n` credits, or refuse (counting a stall) when that would put more
    /// than `limit` in flight. Taking 0 always succeeds and changes nothing.
    pub fn try_acquire(&self, n: u32) -> Result<(), CreditStall> {
        self.acquire(n, true)
    }

    /// Take `n` credits like [`CreditWindow::try_acquire`], but a refusal is
    /// not a stall (a static reservation asked for on the control path).
    pub fn try_reserve(&self, n: u32) -> Result<(), CreditStall> {
        self.acquire(n, false)
    }

    fn acquire(&self, n: u32, count_stall: bool) -> Result<(), CreditStall> {
        if n == 0 {
            return Ok(());
        }
        let mut cur = self.state.load(Ordering::Acquire);
        loop {
            let in_flight = (cur & IN_FLIGHT_MASK) as u32;
            let above = cur & ABOVE_HIGH != 0;
            let next = match in_flight.checked_add(n) {
                Some(next) if next <= self.limit => next,
                _ => {
                    if count_stall {
                        self.stalls.fetch_add(1, Ordering::Relaxed);
                    }
                    return Err(CreditStall {
                        requested: n,
                        in_flight,
                        limit: self.limit,
                    });
                }
            };
            let crossed = !above && next >= self.high;
            let new = u64::from(next) | if above || crossed { ABOVE_HIGH } else { 0 };
            match self
                .state
                .compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    if crossed {
                        self.high_crossings.fetch_add(1, Ordering::Relaxed);
                    }
                    self.acquired_total
                        .fetch_add(u64::from(n), Ordering::Relaxed);
                    self.max_in_flight
                        .fetch_max(u64::from(next), Ordering::Relaxed);
                    return Ok(());
                }
                Err(actual) => cur = actual,
            }
        }
    }

    /// Give back `n` credits. Giving back more than are in flight is an error
    /// and changes nothing. Giving back 0 always succeeds.
    pub fn release(&self, n: u32) -> Result<(), CreditError> {
        if n == 0 {
            return Ok(());
        }
        let mut cur = self.state.load(Ordering::Acquire);
        loop {
            let in_flight = (cur & IN_FLIGHT_MASK) as u32;
            let above = cur & ABOVE_HIGH != 0;
            let Some(next) = in_flight.checked_sub(n) else {
                return Err(CreditError::Release {
                    released: n,
                    in_flight,
                });
            };
            let crossed = above && next <= self.low;
            let new = u64::from(next) | if above && !crossed { ABOVE_HIGH } else { 0 };
            match self
                .state
                .compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    if crossed {
                        self.low_crossings.fetch_add(1, Ordering::Relaxed);
                    }
                    self.released_total
                        .fetch_add(u64::from(n), Ordering::Relaxed);
                    return Ok(());
                }
                Err(actual) => cur = actual,
            }
        }
    }

    /// Credits in flight now.
    pub fn in_flight(&self) -> u32 {
        (self.state.load(Ordering::Acquire) & IN_FLIGHT_MASK) as u32
    }

    /// Credits that could be acquired now.
    pub fn available(&self) -> u32 {
        self.limit - self.in_flight()
    }

    /// The most credits that may be in flight.
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// The high watermark.
    pub fn high_watermark(&self) -> u32 {
        self.high
    }

    /// The low watermark.
    pub fn low_watermark(&self) -> u32 {
        self.low
    }

    /// `true` between a high crossing and the following low crossing.
    pub fn is_above_high(&self) -> bool {
        self.state.load(Ordering::Acquire) & ABOVE_HIGH != 0
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> CreditStats {
        CreditStats {
            stalls: self.stalls.load(Ordering::Relaxed),
            high_crossings: self.high_crossings.load(Ordering::Relaxed),
            low_crossings: self.low_crossings.load(Ordering::Relaxed),
            // Only ever set from a u32.
            max_in_flight: self.max_in_flight.load(Ordering::Relaxed) as u32,
            acquired_total: self.acquired_total.load(Ordering::Relaxed),
            released_total: self.released_total.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicU32;

    #[test]
    fn construction_rules() {
        assert!(CreditWindow::new(8, 6, 2).is_ok());
        assert!(CreditWindow::new(1, 1, 0).is_ok());
        for (limit, high, low) in [(0, 0, 0), (8, 9, 2), (8, 4, 4), (8, 4, 5)] {
            assert_eq!(
                CreditWindow::new(limit, high, low).map(|_| ()),
                Err(CreditError::Create { limit, high, low })
            );
        }
        for limit in [1, 2, 3, 4, 5, 100, u32::MAX] {
            let w = CreditWindow::with_default_watermarks(limit).expect("default watermarks");
            assert!(w.low_watermark() < w.high_watermark() && w.high_watermark() <= limit);
        }
        let w = CreditWindow::with_default_watermarks(100).expect("window");
        assert_eq!((w.high_watermark(), w.low_watermark()), (75, 25));
    }

    #[test]
    fn never_exceeds_the_limit() {
        let w = CreditWindow::new(4, 3, 1).expect("window");
        assert_eq!(w.try_acquire(4), Ok(()));
        assert_eq!(
            w.try_acquire(1),
            Err(CreditStall {
                requested: 1,
                in_flight: 4,
                limit: 4
            })
        );
        assert_eq!(w.available(), 0);
        assert_eq!(w.release(1), Ok(()));
        assert_eq!(w.try_acquire(1), Ok(()));
        assert_eq!(
            w.try_acquire(u32::MAX),
            Err(CreditStall {
                requested: u32::MAX,
                in_flight: 4,
                limit: 4
            })
        );
        assert_eq!(w.stats().stalls, 2);
        assert_eq!(w.try_acquire(0), Ok(()));
        assert_eq!(w.stats().stalls, 2);
    }

    #[test]
    fn over_release_is_refused_and_changes_nothing() {
        let w = CreditWindow::new(4, 3, 1).expect("window");
        w.try_acquire(2).expect("acquire");
        let before = w.stats();
        assert_eq!(
            w.release(3),
            Err(CreditError::Release {
                released: 3,
                in_flight: 2
            })
        );
        assert_eq!(w.in_flight(), 2);
        assert_eq!(w.stats(), before);
    }

    #[test]
    fn crossings_have_hysteresis() {
        let w = CreditWindow::new(10, 8, 2).expect("window");
        w.try_acquire(8).expect("to 8");
        assert!(w.is_above_high());
        w.release(3).expect("to 5");
        w.try_acquire(4)
            .expect("to 9: still above, no new crossing");
        assert_eq!(w.stats().high_crossings, 1);
        w.release(7).expect("to 2");
        assert!(!w.is_above_high());
        w.try_acquire(1).expect("to 3");
        w.release(3)
            .expect("to 0: no high crossing since, no low crossing");
        w.try_acquire(8).expect("to 8 again");
        let s = w.stats();
        assert_eq!(
            (s.high_crossings, s.low_crossings, s.max_in_flight),
            (2, 1, 9)
        );
    }

    #[derive(Debug, Clone)]
    enum Op {
        Acquire(u32),
        Release(u32),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u32..12).prop_map(Op::Acquire),
            (0u32..12).prop_map(Op::Release)
        ]
    }

    proptest! {
        #[test]
        fn window_invariants(
            limit in 1u32..20,
            watermarks in (0u32..20, 0u32..20),
            ops in proptest::collection::vec(op(), 0..200),
        ) {
            let high = watermarks.0 % limit + 1; // 1..=limit
            let low = watermarks.1 % high; // 0..high
            let w = CreditWindow::new(limit, high, low).expect("valid watermarks");
            let mut model: u32 = 0;
            let mut refused = 0u64;
            let mut above = false;
            let mut events = Vec::new();
            for op in ops {
                match op {
                    Op::Acquire(n) => {
                        let ok = w.try_acquire(n).is_ok();
                        prop_assert_eq!(ok, model + n <= limit);
                        if ok {
                            model += n;
                            if n > 0 && !above && model >= high {
                                above = true;
                                events.push('H');
                            }
                        } else {
                            refused += 1;
                        }
                    }
                    Op::Release(n) => {
                        let ok = w.release(n).is_ok();
                        prop_assert_eq!(ok, n <= model);
                        if ok {
                            model -= n;
                            if n > 0 && above && model <= low {
                                above = false;
                                events.push('L');
                            }
                        }
                    }
                }
                let s = w.stats();
                prop_assert!(w.in_flight() <= limit);
                prop_assert_eq!(w.in_flight(), model);
                prop_assert_eq!(u64::from(w.in_flight()), s.acquired_total - s.released_total);
                prop_assert_eq!(s.stalls, refused);
                prop_assert!(s.max_in_flight <= limit);
                // Crossings alternate, high first.
                prop_assert!(s.high_crossings == s.low_crossings || s.high_crossings == s.low_crossings + 1);
                prop_assert_eq!(w.is_above_high(), s.high_crossings > s.low_crossings);
                prop_assert_eq!(s.high_crossings as usize, events.iter().filter(|&&e| e == 'H').count());
                prop_assert_eq!(s.low_crossings as usize, events.iter().filter(|&&e| e == 'L').count());
            }
            prop_assert!(events.windows(2).all(|p| p[0] != p[1]));
        }
    }

    #[test]
    fn concurrent_acquirers_never_exceed_the_limit() {
        const LIMIT: u32 = 16;
        const THREADS: usize = 4;
        const ROUNDS: usize = 20_000;
        let w = Arc::new(CreditWindow::new(LIMIT, 12, 4).expect("window"));
        // Each thread records the in-flight count it observes right after an
        // acquire, plus an independent holder count checked against the limit.
        let holders = Arc::new(AtomicU32::new(0));
        let refused = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                let w = Arc::clone(&w);
                let holders = Arc::clone(&holders);
                let refused = Arc::clone(&refused);
                std::thread::spawn(move || {
                    let mut max_seen = 0;
                    for i in 0..ROUNDS {
                        let n = ((i + t) % 5 + 1) as u32;
                        if w.try_acquire(n).is_ok() {
                            let now = holders.fetch_add(n, Ordering::SeqCst) + n;
                            max_seen = max_seen.max(now);
                            assert!(now <= LIMIT, "{now} credits held with a limit of {LIMIT}");
                            holders.fetch_sub(n, Ordering::SeqCst);
                            w.release(n).expect("release what was acquired");
                        } else {
                            refused.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    max_seen
                })
            })
            .collect();
        let max_seen = threads
            .into_iter()
            .map(|t| t.join().expect("no thread panics"))
            .max()
            .unwrap_or(0);
        let s = w.stats();
        assert_eq!(w.in_flight(), 0);
        assert!(max_seen <= LIMIT);
        assert!(s.max_in_flight <= LIMIT);
        assert_eq!(s.acquired_total, s.released_total);
        assert_eq!(s.stalls, refused.load(Ordering::Relaxed));
        assert!(s.high_crossings == s.low_crossings);
    }
}
