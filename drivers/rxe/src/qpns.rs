//! The QPNs a device may hand out: all of them when it has its addresses to
//! itself, one slot's range when it shares them with other processes
//! ([`crate::share`]). The steering program maps a QPN to its slot by
//! `qpn >> SLOT_SHIFT`, so a range is exactly one slot.

use crate::bpf::{SLOT_SHIFT, SLOTS};

/// The lowest QPN handed out (0 and 1 are the special QPs; kernel rxe
/// starts at 0x11).
pub const FIRST_QPN: u32 = 0x11;
/// The highest 24-bit QPN.
pub const LAST_QPN: u32 = 0xFF_FFFF;

/// An inclusive QPN range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QpnRange {
    /// First QPN.
    pub first: u32,
    /// Last QPN.
    pub last: u32,
}

impl QpnRange {
    /// The whole space (exclusive use of the addresses).
    pub const ALL: QpnRange = QpnRange {
        first: FIRST_QPN,
        last: LAST_QPN,
    };

    /// The range of slot `slot` (`None` beyond the last slot).
    pub fn of_slot(slot: u32) -> Option<QpnRange> {
        if slot >= SLOTS {
            return None;
        }
        let base = slot << SLOT_SHIFT;
        Some(QpnRange {
            first: base.max(FIRST_QPN),
            last: base | ((1 << SLOT_SHIFT) - 1),
        })
    }

    /// Whether `qpn` is in the range.
    pub fn contains(&self, qpn: u32) -> bool {
        (self.first..=self.last).contains(&qpn)
    }

    /// How many QPNs.
    pub fn len(&self) -> u32 {
        self.last - self.first + 1
    }

    /// Never empty (kept for clippy's `len` rule).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The first QPN to try: `first` for the whole space (as kernel rxe);
    /// in a slot, a point in its first half picked from `seed`, so a
    /// process that takes over a slot its previous owner just left does not
    /// start with the very QPNs the old one's peers may still address.
    pub fn start(&self, seed: u64) -> u32 {
        if *self == QpnRange::ALL {
            return self.first;
        }
        self.first + (seed % u64::from(self.len() / 2)) as u32
    }

    /// The next free QPN at or after `from` (wrapping inside the range),
    /// skipping those `taken` says are in use; `None` when all are.
    pub fn next_free(&self, from: u32, taken: impl Fn(u32) -> bool) -> Option<u32> {
        let mut n = if self.contains(from) {
            from
        } else {
            self.first
        };
        for _ in 0..self.len() {
            if !taken(n) {
                return Some(n);
            }
            n = if n >= self.last { self.first } else { n + 1 };
        }
        None
    }

    /// The one after `n`, wrapping inside the range.
    pub fn after(&self, n: u32) -> u32 {
        if n >= self.last { self.first } else { n + 1 }
    }
}

impl std::fmt::Display for QpnRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#08x}-{:#08x}", self.first, self.last)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn slots_tile_the_space_and_steer_by_shift() {
        let s0 = QpnRange::of_slot(0).unwrap();
        assert_eq!((s0.first, s0.last), (0x11, 0xffff));
        let s3 = QpnRange::of_slot(3).unwrap();
        assert_eq!((s3.first, s3.last), (0x3_0000, 0x3_ffff));
        let top = QpnRange::of_slot(SLOTS - 1).unwrap();
        assert_eq!(top.last, LAST_QPN);
        assert_eq!(QpnRange::of_slot(SLOTS), None);
        for q in [s3.first, s3.last, 0x3_1234] {
            assert_eq!(q >> SLOT_SHIFT, 3);
        }
        assert!(!s3.contains(0x4_0000));
        assert!(!s3.contains(0x2_ffff));
    }

    #[test]
    fn allocation_wraps_inside_the_range_and_reports_full() {
        let r = QpnRange {
            first: 10,
            last: 13,
        };
        assert_eq!(r.next_free(12, |n| n == 12), Some(13));
        assert_eq!(r.next_free(13, |n| n == 13), Some(10));
        assert_eq!(r.next_free(99, |_| false), Some(10));
        assert_eq!(r.next_free(10, |_| true), None);
        assert_eq!(r.after(13), 10);
    }

    #[test]
    fn a_slot_starts_in_its_first_half() {
        let r = QpnRange::of_slot(5).unwrap();
        for seed in [0, 1, 0x7fff, 0x8000, u64::MAX] {
            let s = r.start(seed);
            assert!(r.contains(s) && s < r.first + r.len() / 2, "{s:#x}");
        }
        assert_eq!(QpnRange::ALL.start(1234), FIRST_QPN);
    }
}
