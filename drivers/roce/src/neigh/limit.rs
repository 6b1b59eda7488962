//! Reply rate limits: a bucket per source MAC in a fixed-size table, and
//! one for all replies together, so a flood of requests from any number of
//! forged sources neither grows state nor turns the port into an amplifier.
//!
//! Each bucket is a generic cell rate algorithm: one instant (the
//! theoretical arrival time) per bucket; a reply is allowed while that
//! instant is at most `burst - 1` intervals ahead of now.

use core::time::Duration;

use super::Instant;
use crate::wire::EthernetAddress;

/// A rate: `burst` replies at once, then `per_second` on average. A
/// `per_second` of 0 means no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    /// Replies allowed back to back.
    pub burst: u32,
    /// Replies allowed per second once the burst is spent (0: unlimited).
    pub per_second: u32,
}

impl Rate {
    fn interval(self) -> Duration {
        Duration::from_nanos(1_000_000_000 / u64::from(self.per_second.max(1)))
    }

    /// Whether a reply is allowed at `now` by a bucket whose theoretical
    /// arrival time is `tat`; if so, charge it.
    fn admit(self, tat: &mut Instant, now: Instant) -> bool {
        if self.per_second == 0 {
            return true;
        }
        let i = self.interval();
        let tolerance = i.saturating_mul(self.burst.saturating_sub(1));
        if *tat > now.after(tolerance) {
            return false;
        }
        *tat = (*tat).max(now).after(i);
        true
    }
}

/// The per-source table and the global bucket.
#[derive(Debug)]
pub(super) struct Limiter {
    per_source: Rate,
    total: Rate,
    capacity: usize,
    sources: Vec<(EthernetAddress, Instant)>,
    total_tat: Instant,
}

impl Limiter {
    pub(super) fn new(per_source: Rate, total: Rate, capacity: usize) -> Limiter {
        Limiter {
            per_source,
            total,
            capacity,
            sources: Vec::with_capacity(capacity),
            total_tat: Instant::default(),
        }
    }

    /// Whether a reply to `source` is allowed at `now` (and charge it).
    /// A source not in the table takes the slot of the one least in debt
    /// (an idle one is as good as new), so the table never grows.
    pub(super) fn admit(&mut self, source: EthernetAddress, now: Instant) -> bool {
        let slot = match self.sources.iter().position(|(m, _)| *m == source) {
            Some(i) => i,
            None if self.sources.len() < self.capacity => {
                self.sources.push((source, Instant::default()));
                self.sources.len() - 1
            }
            None => {
                let Some((i, _)) = self.sources.iter().enumerate().min_by_key(|(_, (_, t))| *t)
                else {
                    // A table of capacity 0 tracks no source: only the total applies.
                    return self.total.admit(&mut self.total_tat, now);
                };
                self.sources[i] = (source, Instant::default());
                i
            }
        };
        let mut tat = self.sources[slot].1;
        if !self.per_source.admit(&mut tat, now) {
            return false;
        }
        if !self.total.admit(&mut self.total_tat, now) {
            return false;
        }
        self.sources[slot].1 = tat;
        true
    }

    /// Sources tracked (at most the capacity).
    #[cfg(test)]
    pub(super) fn tracked(&self) -> usize {
        self.sources.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mac(i: u8) -> EthernetAddress {
        EthernetAddress([2, 0, 0, 0, 0, i])
    }

    #[test]
    fn burst_then_rate_per_source_and_in_total() {
        let per = Rate {
            burst: 3,
            per_second: 10,
        };
        let total = Rate {
            burst: 4,
            per_second: 10,
        };
        let mut l = Limiter::new(per, total, 2);
        let t0 = Instant::from_nanos(1_000_000_000);
        let admitted = |l: &mut Limiter, m, t| (0..10).filter(|_| l.admit(m, t)).count();
        assert_eq!(admitted(&mut l, mac(1), t0), 3, "the burst");
        // 100 ms later one more token (10 per second).
        let t1 = t0.after(Duration::from_millis(100));
        assert_eq!(admitted(&mut l, mac(1), t1), 1);
        // Another source has a full bucket of its own, but the total (4 at
        // once, 10 per second) has room for one more only.
        assert_eq!(admitted(&mut l, mac(2), t1), 1);
        // A third source takes the idle-most slot; the table stays at 2.
        let later = t0.after(Duration::from_secs(1));
        assert_eq!(admitted(&mut l, mac(3), later), 3);
        assert_eq!(l.tracked(), 2);
        // Unlimited.
        let mut free = Limiter::new(
            Rate {
                burst: 0,
                per_second: 0,
            },
            Rate {
                burst: 0,
                per_second: 0,
            },
            0,
        );
        assert_eq!(admitted(&mut free, mac(1), t0), 10);
    }
}
