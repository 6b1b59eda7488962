//! Judging BlueFlame bodies (audit rows 4, 5; the `blueflame` check): what else a send
//! doorbell's register half holds besides the 8-byte doorbell the watcher serves.
//!
//! A BlueFlame register half is 256 bytes; a doorbell is its first 8 bytes (the first 8 bytes
//! of the WQE's control segment, which the watcher consumes), a BlueFlame copy writes the
//! whole WQE there. The firmware serves every doorbell from the SQ ring (never from the body),
//! and with the check on it looks at the body:
//!
//! - **Uncombined.** On a BAR0 advertised uncached (`--bar0 uc`), body bytes are a BlueFlame
//!   copy that cannot arrive combined: counted once per doorbell (`bf_uncombined`).
//! - **Interleaved.** Body bytes that are not the WQE the ring holds at the doorbell's index
//!   for its QP: two writers' bytes in one register (`bf_interleaved`, logged at warn).
//!
//! # Why a correct driver never trips `bf_interleaved`
//!
//! The watcher samples; it may see a doorbell's word 0 before the rest of its copy, and it may
//! miss a doorbell altogether (overwritten before it looked). So the body is never judged as
//! found at the doorbell: when the firmware takes a doorbell it *swaps every body word to 0*
//! (those values — the copy so far, or a missed earlier copy's leftovers — only count towards
//! `bf_uncombined`), and records what the ring holds. Only words written **after** that are
//! judged, on later scans, and only while neither half of the register has seen a newer
//! doorbell: before judging, the firmware reads both halves' word 0 (the watcher keeps them at
//! the all-ones sentinel between doorbells), swaps the body words out, and reads word 0 again;
//! any doorbell in between voids the round. A correct driver writes one register's halves one
//! at a time (a lock per shared register, as rdma-core's `need_lock`; its own register
//! otherwise), word 0 first (a later writer's bytes then cannot be read without its word 0
//! being visible first: x86 stores become visible in order), and a body-first driver also
//! first rings the other half (the toggle) — so every word judged is the copy of the WQE the
//! ring holds at that doorbell's index, which matches. Words beyond the WQE's basic blocks
//! must stay zero (a copy covers the WQE's WQEBBs and nothing else).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::bar::{Bar, UAR_PAGE};
use crate::watch::UAR_IDLE;

/// Bytes of one BlueFlame register half (`log_bf_reg_size` 9: 512-byte registers).
pub const HALF_BYTES: u64 = 256;
/// How long the body of a doorbell is judged after it (longer than any copy a running driver
/// makes; a preempted one's late words are not judged).
pub const JUDGE_FOR: Duration = Duration::from_millis(50);

/// One doorbell whose body is being judged.
#[derive(Clone, Debug)]
struct Pending {
    /// What the ring holds at the doorbell's index (its WQEBBs, at most 256 bytes); `None`
    /// when the doorbell names no WQE the firmware could read (only uncombined bytes count).
    expected: Option<Vec<u8>>,
    /// QPN and WQE index, for the log.
    qpn: u32,
    index: u16,
    /// Body bytes seen (counted once as uncombined on a UC BAR0).
    seen_body: bool,
    since: Instant,
}

/// What judging found (counts to add).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Verdicts {
    /// Doorbells whose half held a BlueFlame body on an uncached BAR0.
    pub uncombined: u64,
    /// Doorbells whose body held bytes of another write.
    pub interleaved: u64,
}

/// The doorbells whose bodies are being judged, by (UAR page, half offset).
#[derive(Debug, Default)]
pub struct BfJudge {
    pending: BTreeMap<(u32, u32), Pending>,
}

fn half_base(page: u32, half: u32) -> u64 {
    u64::from(page) * UAR_PAGE + u64::from(half)
}

/// Swap the body words of a half to 0; the old values.
fn take_body(bar: &Bar, page: u32, half: u32) -> [u64; 31] {
    let base = half_base(page, half);
    let mut w = [0u64; 31];
    for (k, v) in w.iter_mut().enumerate() {
        *v = bar.swap64_be(base + 8 * (k as u64 + 1), 0);
    }
    w
}

/// The other half of the same register.
fn sibling(half: u32) -> u32 {
    half ^ (HALF_BYTES as u32)
}

impl BfJudge {
    /// Whether a doorbell is being judged.
    pub fn is_idle(&self) -> bool {
        self.pending.is_empty()
    }

    /// The firmware took a send doorbell at `half` of UAR page `page` (the watcher has put
    /// word 0 back to the sentinel): clear the body, count what it held as uncombined on an
    /// uncached BAR0 (`uc`), and judge what comes after against `expected` (the WQE's
    /// bytes the ring holds, if any). A doorbell on either half of the register ends the
    /// judging of the other doorbells there.
    pub fn observe(
        &mut self,
        bar: &Bar,
        (page, half): (u32, u32),
        (qpn, index): (u32, u16),
        expected: Option<Vec<u8>>,
        uc: bool,
    ) -> Verdicts {
        self.pending.remove(&(page, sibling(half)));
        let body = take_body(bar, page, half);
        let seen_body = body.iter().any(|&w| w != 0);
        let uncombined = u64::from(uc && seen_body);
        self.pending.insert(
            (page, half),
            Pending {
                expected,
                qpn,
                index,
                seen_body,
                since: Instant::now(),
            },
        );
        Verdicts {
            uncombined,
            interleaved: 0,
        }
    }

    /// Judge the bodies written since their doorbells (see the module docs); called after
    /// each scan of BAR0. Judgements older than [`JUDGE_FOR`] end.
    pub fn judge(&mut self, bar: &Bar, uc: bool) -> Verdicts {
        let mut v = Verdicts::default();
        let now = Instant::now();
        let idle = |page, half| bar.read64_be(half_base(page, half)) == UAR_IDLE;
        self.pending.retain(|&(page, half), p| {
            if now.duration_since(p.since) > JUDGE_FOR {
                return false;
            }
            // A newer doorbell on this register: its writes are its own.
            if !idle(page, half) || !idle(page, sibling(half)) {
                return false;
            }
            let body = take_body(bar, page, half);
            if !idle(page, half) || !idle(page, sibling(half)) {
                return false;
            }
            if body.iter().all(|&w| w == 0) {
                return true;
            }
            if uc && !p.seen_body {
                v.uncombined += 1;
            }
            p.seen_body = true;
            let Some(expected) = &p.expected else {
                return true;
            };
            let foreign = body.iter().enumerate().find(|&(k, &w)| {
                let at = 8 * (k + 1);
                let want = expected.get(at..at + 8).map_or(0, |b| {
                    let mut x = [0u8; 8];
                    x.copy_from_slice(b);
                    u64::from_be_bytes(x)
                });
                w != 0 && w != want
            });
            match foreign {
                Some((k, &w)) => {
                    v.interleaved += 1;
                    tracing::warn!(
                        page,
                        half = format_args!("{half:#x}"),
                        qpn = p.qpn,
                        index = p.index,
                        byte = 8 * (k + 1),
                        word = format_args!("{w:#018x}"),
                        "BlueFlame register written by two writers at once: the body holds \
                         bytes that are not the WQE the doorbell names (serialize the writers \
                         of a shared register)"
                    );
                    false
                }
                None => true,
            }
        });
        v
    }

    /// Forget every judgement (a reset).
    pub fn clear(&mut self) {
        self.pending.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: u32 = 1;
    const H0: u32 = 0x800;

    fn bar() -> Bar {
        let b = Bar::new(2 * UAR_PAGE).unwrap();
        for half in (0x800..0x1000).step_by(0x100) {
            b.write64_be(half_base(PAGE, half), UAR_IDLE);
        }
        b
    }

    /// A 128-byte WQE: word k = 0x1111_0000_0000_0000 + k (distinct, nonzero).
    fn wqe(tag: u64) -> Vec<u8> {
        (0..16u64)
            .flat_map(|k| ((tag << 48) | k).to_be_bytes())
            .collect()
    }

    fn word(w: &[u8], k: usize) -> u64 {
        let mut x = [0u8; 8];
        x.copy_from_slice(&w[8 * k..8 * k + 8]);
        u64::from_be_bytes(x)
    }

    fn put(b: &Bar, half: u32, w: &[u8], words: std::ops::Range<usize>) {
        for k in words {
            b.write64_be(half_base(PAGE, half) + 8 * k as u64, word(w, k));
        }
    }

    /// What the watcher does before the firmware sees a doorbell: word 0 back to the sentinel.
    fn take(b: &Bar, j: &mut BfJudge, half: u32, expected: &[u8], uc: bool) -> Verdicts {
        let at = half_base(PAGE, half);
        let v0 = b.read64_be(at);
        assert_ne!(v0, UAR_IDLE, "a doorbell is there");
        assert!(b.cas64_be(at, v0, UAR_IDLE));
        j.observe(b, (PAGE, half), (7, 1), Some(expected.to_vec()), uc)
    }

    #[test]
    fn a_copy_seen_midway_and_finished_later_is_not_interleaved() {
        let (b, mut j) = (bar(), BfJudge::default());
        let x = wqe(0x1111);
        put(&b, H0, &x, 0..5);
        let v = take(&b, &mut j, H0, &x, true);
        assert_eq!(v.uncombined, 1, "body words at the doorbell on a UC BAR");
        put(&b, H0, &x, 5..16);
        assert_eq!(j.judge(&b, true), Verdicts::default(), "counted once");
        assert_eq!(
            b.read64_be(half_base(PAGE, H0) + 8 * 5),
            0,
            "the body is cleared"
        );
        // An 8-byte doorbell on a WC BAR: nothing to count.
        let (b, mut j) = (bar(), BfJudge::default());
        put(&b, H0, &x, 0..1);
        assert_eq!(take(&b, &mut j, H0, &x, false), Verdicts::default());
        assert_eq!(j.judge(&b, false), Verdicts::default());
    }

    #[test]
    fn leftovers_of_a_missed_copy_are_not_judged() {
        let (b, mut j) = (bar(), BfJudge::default());
        let (y, x) = (wqe(0x2222), wqe(0x3333));
        // Y's whole copy, then (the watcher missed Y) X's word 0 over it.
        put(&b, H0, &y, 0..16);
        put(&b, H0, &x, 0..1);
        take(&b, &mut j, H0, &x, false);
        put(&b, H0, &x, 1..16);
        assert_eq!(j.judge(&b, false).interleaved, 0);
    }

    #[test]
    fn another_writers_words_after_a_doorbell_are_interleaved() {
        let (b, mut j) = (bar(), BfJudge::default());
        let (a, bq) = (wqe(0x4444), wqe(0x5555));
        // A starts its copy; B's doorbell lands in the same half; A's copy goes on.
        put(&b, H0, &a, 0..3);
        take(&b, &mut j, H0, &a, false);
        put(&b, H0, &bq, 0..1);
        take(&b, &mut j, H0, &bq, false);
        put(&b, H0, &a, 3..16);
        assert_eq!(j.judge(&b, false).interleaved, 1);
        assert!(j.is_idle(), "judged once");
        // Bytes past the WQE's blocks are foreign too.
        let x = wqe(0x6666);
        put(&b, H0, &x, 0..1);
        take(&b, &mut j, H0, &x[..64], false);
        put(&b, H0, &x, 1..16);
        assert_eq!(j.judge(&b, false).interleaved, 1);
    }

    #[test]
    fn a_newer_doorbell_on_the_register_ends_the_judging() {
        let (b, mut j) = (bar(), BfJudge::default());
        let (y, x) = (wqe(0x7777), wqe(0x8888));
        put(&b, H0, &y, 0..16);
        take(&b, &mut j, H0, &y, false);
        // A body-first writer: the other half's doorbell first (the toggle), then X's body
        // here before its word 0.
        put(&b, sibling(H0), &wqe(0x9999), 0..1);
        put(&b, H0, &x, 1..16);
        assert_eq!(j.judge(&b, false).interleaved, 0, "the register moved on");
        assert!(j.is_idle());
        // The same when the firmware took the other half's doorbell first.
        let (b, mut j) = (bar(), BfJudge::default());
        put(&b, H0, &y, 0..16);
        take(&b, &mut j, H0, &y, false);
        let w = wqe(0x9999);
        put(&b, sibling(H0), &w, 0..1);
        take(&b, &mut j, sibling(H0), &w, false);
        put(&b, H0, &x, 1..16);
        assert_eq!(j.judge(&b, false).interleaved, 0);
        // And a new word 0 in this half.
        let (b, mut j) = (bar(), BfJudge::default());
        put(&b, H0, &y, 0..1);
        take(&b, &mut j, H0, &y, false);
        put(&b, H0, &x, 0..16);
        assert_eq!(j.judge(&b, false).interleaved, 0);
    }
}
