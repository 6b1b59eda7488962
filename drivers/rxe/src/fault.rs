//! In-process fault injection on the receive path, for tests and demos:
//! a seeded network that loses and reorders verified RoCE packets before
//! they reach their QP.
//!
//! Off by default ([`FaultConfig::default`] injects nothing and costs one
//! branch per packet). When on, each packet that passed the ICRC check is
//!
//! * dropped with probability `drop_ppm / 1e6` (counted in
//!   [`DeviceStats::fault_drops`](crate::DeviceStats::fault_drops)), else
//! * held back with probability `reorder_ppm / 1e6` and delivered after the
//!   next packet, or at the end of the progress round if none follows
//!   (counted in
//!   [`DeviceStats::fault_reordered`](crate::DeviceStats::fault_reordered)).
//!
//! The decisions come from a xorshift64* generator seeded by
//! [`FaultConfig::seed`], so a run's fault pattern depends only on the seed
//! and the order packets arrive in. Holding a packet copies it (one
//! allocation per reordered packet, never on the fault-free path).

use rnic_core::Gid;

/// What the injector does; probabilities in parts per million (so the
/// config stays `Eq + Hash`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FaultConfig {
    /// Seed of the decision generator.
    pub seed: u64,
    /// Probability (ppm) that a received packet is dropped.
    pub drop_ppm: u32,
    /// Probability (ppm) that a received packet is delivered after the next.
    pub reorder_ppm: u32,
}

impl FaultConfig {
    /// Whether any fault is injected.
    pub fn is_active(&self) -> bool {
        self.drop_ppm > 0 || self.reorder_ppm > 0
    }
}

/// What to do with one packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Hand it to its QP now.
    Deliver,
    /// Lose it.
    Drop,
    /// Keep a copy and hand it over after the next packet.
    Hold,
}

/// The injector's state (one per device, under its lock).
#[derive(Debug)]
pub(crate) struct Faults {
    cfg: FaultConfig,
    rng: u64,
    /// A packet held back for reordering, with its source and destination
    /// GIDs.
    held: Option<(Vec<u8>, Gid, Gid)>,
}

impl Faults {
    pub(crate) fn new(cfg: FaultConfig) -> Faults {
        Faults {
            cfg,
            // xorshift needs a non-zero state.
            rng: cfg.seed ^ 0x9E37_79B9_7F4A_7C15,
            held: None,
        }
    }

    fn next(&mut self) -> u64 {
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn chance(&mut self, ppm: u32) -> bool {
        ppm > 0 && self.next() % 1_000_000 < u64::from(ppm)
    }

    /// Decide the fate of a packet; `Hold` only when no packet is held.
    pub(crate) fn judge(&mut self) -> Verdict {
        if !self.cfg.is_active() {
            return Verdict::Deliver;
        }
        if self.chance(self.cfg.drop_ppm) {
            return Verdict::Drop;
        }
        if self.held.is_none() && self.chance(self.cfg.reorder_ppm) {
            return Verdict::Hold;
        }
        Verdict::Deliver
    }

    /// Keep a copy of `pkt` from `src` for later.
    pub(crate) fn hold(&mut self, pkt: &[u8], src: Gid, dst: Gid) {
        self.held = Some((pkt.to_vec(), src, dst));
    }

    /// The held packet, if any (taken).
    pub(crate) fn take_held(&mut self) -> Option<(Vec<u8>, Gid, Gid)> {
        self.held.take()
    }

    /// A packet is held back.
    pub(crate) fn has_held(&self) -> bool {
        self.held.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_by_default_and_seeded() {
        let mut f = Faults::new(FaultConfig::default());
        assert!((0..1000).all(|_| f.judge() == Verdict::Deliver));
        let cfg = FaultConfig {
            seed: 7,
            drop_ppm: 100_000,
            reorder_ppm: 100_000,
        };
        let run = |cfg| {
            let mut f = Faults::new(cfg);
            (0..10_000)
                .map(|_| {
                    let v = f.judge();
                    if v == Verdict::Hold {
                        f.hold(b"x", Gid::default(), Gid::default());
                        f.take_held();
                    }
                    v
                })
                .collect::<Vec<_>>()
        };
        let a = run(cfg);
        assert_eq!(a, run(cfg), "same seed, same faults");
        let drops = a.iter().filter(|v| **v == Verdict::Drop).count();
        let holds = a.iter().filter(|v| **v == Verdict::Hold).count();
        assert!((800..1200).contains(&drops), "{drops}");
        assert!((700..1100).contains(&holds), "{holds}");
    }
}
