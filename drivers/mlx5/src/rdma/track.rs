//! What a QP's poster and its CQs' pollers share: per-WQE `wr_id`s and
//! metadata, the producer and consumer counters — atomics only, no lock.
//!
//! The poster ([`crate::Qp`], `&mut`) writes a WQE's entry, then publishes
//! its producer counter with `Release`; a poller ([`crate::Cq`], `&mut`)
//! reads the counter with `Acquire` before trusting an entry, and publishes
//! the consumer counter with `Release` so the poster sees the space freed.
//! A CQE the device writes names a WQE by index: every index is checked
//! against the outstanding window and against the start of a WQE before it
//! is used, so no CQE can retire what was never posted, or index out of
//! bounds.

use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use rnic_core::WcOpcode;

use crate::rdma::ring::{BlockHead, WordRing, Wqebb};

/// Completion opcode codes stored per WQE (one byte).
pub(crate) const WC_CODE_SEND: u32 = 0;
pub(crate) const WC_CODE_WRITE: u32 = 1;
pub(crate) const WC_CODE_READ: u32 = 2;
pub(crate) const WC_CODE_CMP_SWAP: u32 = 3;
pub(crate) const WC_CODE_FETCH_ADD: u32 = 4;

/// The completion opcodes of codes `0 ..= 4`.
const WC_OPCODES: [WcOpcode; 5] = [
    WcOpcode::Send,
    WcOpcode::RdmaWrite,
    WcOpcode::RdmaRead,
    WcOpcode::CompSwap,
    WcOpcode::FetchAdd,
];

/// Completion opcodes stored per WQE (one byte).
#[inline(always)]
pub(crate) fn wc_opcode_code(op: WcOpcode) -> u32 {
    match op {
        WcOpcode::Send => WC_CODE_SEND,
        WcOpcode::RdmaWrite => WC_CODE_WRITE,
        WcOpcode::RdmaRead => WC_CODE_READ,
        WcOpcode::CompSwap => WC_CODE_CMP_SWAP,
        WcOpcode::FetchAdd => WC_CODE_FETCH_ADD,
        _ => 0xff,
    }
}

/// The completion opcode of a stored code (a table, no branch per code).
#[inline(always)]
pub(crate) fn wc_opcode_from_code(code: u32) -> WcOpcode {
    match WC_OPCODES.get(code as usize) {
        Some(op) => *op,
        None => WcOpcode::Unknown(code),
    }
}

/// One SQ entry's metadata, at the index of its first WQEBB: its size in
/// WQEBBs and its completion opcode. Nothing that varies per post (the
/// slot's `start` says where the WQE lies), so a post of a known kind
/// stores it as one immediate. (The code in the low byte: the direct poll
/// shifts the whole word to the completion's code bits, and the size falls
/// off the top.)
#[inline(always)]
pub(crate) const fn sq_meta(wqebbs: u32, wc_code: u32) -> u32 {
    // A code outside `0 ..= 4` (none is recorded: `wc_opcode_code` of a
    // `SendOp`'s opcode) as 7, so that the code fits [`SendCompletion`]'s
    // three bits as stored.
    //
    // [`SendCompletion`]: crate::SendCompletion
    let code = if wc_code <= WC_CODE_FETCH_ADD {
        wc_code
    } else {
        7
    };
    ((wqebbs & 0xff) << 8) | code
}

/// One WQEBB's tracking entry: the `wr_id`, the free-running WQEBB position
/// it was recorded at, and the [`sq_meta`] of the WQE that starts there (one
/// 32-byte slot, so one index covers all three).
#[derive(Debug, Default)]
#[repr(C, align(32))]
pub(crate) struct SqSlot {
    pub wr_id: AtomicU64,
    /// The producer counter (WQEBBs, free-running, 64 bits: it never
    /// wraps) the WQE was posted at: a CQE is taken only for the slot's
    /// WQE when this lies in the outstanding window and its low 16 bits
    /// are the CQE's `wqe_counter`. (With 32 bits a slot left stale inside
    /// longer WQEs came back into the window after 2^32 WQEBBs,
    /// `tests::a_slot_stale_for_2_32_wqebbs_is_refused`.)
    pub start: AtomicU64,
    pub meta: AtomicU32,
}

impl SqSlot {
    /// Record the WQE posted at `start` (free-running): its `wr_id` and
    /// [`sq_meta`], then `start` (`Release`: a poller that loads this
    /// `start` with `Acquire` reads this `wr_id` and `meta`,
    /// [`SqTrack::complete`]).
    #[inline(always)]
    fn set(&self, start: u64, wr_id: u64, meta: u32) {
        self.wr_id.store(wr_id, Ordering::Relaxed);
        self.meta.store(meta, Ordering::Relaxed);
        self.start.store(start, Ordering::Release);
    }
}

/// The SQ ring and its QP's tracking slots as one: the same number of
/// blocks as slots, checked when made ([`SqBlocks::new`]), so the byte
/// offset of a block finds its slot with one shift (64-byte blocks,
/// 32-byte slots: half of it) and no mask of its own.
pub(crate) struct SqBlocks {
    ring: WordRing,
    /// `shared.sq`'s first slot.
    slots: NonNull<SqSlot>,
    /// Keeps `slots` alive.
    _shared: Arc<QpShared>,
}

// SAFETY: `ring` is `Send + Sync`; `slots` points into the `SqSlots` that
// `_shared`'s `SqTrack` keeps alive, whose slots are atomics (`Sync`),
// used only through shared references; nothing is tied to a thread.
unsafe impl Send for SqBlocks {}
// SAFETY: as `Send`: `&SqBlocks` stores only through atomics.
unsafe impl Sync for SqBlocks {}

const _: () = assert!(std::mem::size_of::<SqSlot>() == 32);

impl SqBlocks {
    /// `ring` with `shared`'s tracking; `None` unless the ring has exactly
    /// as many 64-byte blocks as the tracking has slots.
    pub fn new(ring: WordRing, shared: &Arc<QpShared>) -> Option<SqBlocks> {
        if ring.len_bytes() != shared.sq.wqebbs() as usize * 64 {
            return None;
        }
        Some(SqBlocks {
            slots: shared.sq.slots_ptr(),
            ring,
            _shared: Arc::clone(shared),
        })
    }

    /// The ring.
    #[inline(always)]
    pub fn ring(&self) -> &WordRing {
        &self.ring
    }

    /// Store `wqe` at block `head` (modulo the ring) and record it
    /// ([`SqTrack::record`]: the `wr_id`, the start, `meta`) in that
    /// block's slot.
    #[inline(always)]
    pub fn commit<H: BlockHead>(&self, head: u64, wqe: &Wqebb<H>, wr_id: u64, meta: u32) {
        let at = self.ring.block_at(head as usize);
        self.ring.store_block_at(at, wqe);
        // SAFETY: `at` is a multiple of 64 below the ring's length
        // (`block_at`), which `new` checked is 64 × the slot count (the
        // slots are set once in `SqTrack::new` and never change): `at / 2`
        // is a multiple of 32 below 32 × the slot count, the offset of
        // slot `at / 64` (32-byte slots, asserted above) in the one array
        // `slots` points at.
        let p = unsafe { self.slots.as_ptr().byte_add(at.bytes() >> 1) };
        // SAFETY: `p` is that slot, in the array `_shared` keeps alive; a
        // shared reference to atomics.
        let slot = unsafe { &*p };
        slot.set(head, wr_id, meta);
    }
}

/// A send queue's tracking, indexed by WQEBB: the producer counter, and
/// the consumer counter with the slots ([`SqSlots`], which the CQs the SQ
/// completes to hold too).
#[derive(Debug)]
pub(crate) struct SqTrack {
    /// Set once in `new` (a clone of the `Arc` is all that is handed out).
    slots: Arc<SqSlots>,
    /// Producer in WQEBBs (free-running, 64 bits), published by the
    /// poster, whose only copy it is (its send count is derived from it);
    /// pollers use its low 32 bits.
    pub head: AtomicU64,
}

/// What a poller of a send queue needs, in one allocation so that one
/// pointer reaches all of it at fixed offsets (the direct poll loads that
/// pointer and nothing else before the slot): the consumer counter
/// (offset 0), the slot mask (8) and `mask + 1` slots (from 32).
#[repr(C)]
pub(crate) struct SqSlots {
    /// Consumer in WQEBBs (free-running, 64 bits like the slots'
    /// `start`), published by the poller; the poster uses its low 32 bits.
    tail: AtomicU64,
    /// `slots.len() - 1`, a power of two less one (64 bits: compared with
    /// 64-bit positions). Private, set once in `new`, like the length.
    mask: u64,
    slots: [SqSlot],
}

impl std::fmt::Debug for SqSlots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqSlots")
            .field("tail", &self.tail)
            .field("slots", &self.slots.len())
            .finish()
    }
}

impl SqSlots {
    /// The allocation of `n` slots: the 16-byte header padded to the
    /// slots' alignment (one slot's size), then the slots.
    fn layout(n: usize) -> Option<std::alloc::Layout> {
        std::alloc::Layout::array::<SqSlot>(n.checked_add(1)?).ok()
    }

    /// `n` unused slots (a power of two in `1 ..= 2^15`), `tail` 0.
    fn new(n: u32) -> Arc<SqSlots> {
        let n = n.clamp(1, 1 << 15).next_power_of_two() as usize;
        let one = std::alloc::Layout::new::<SqSlot>();
        // (At most 2^15 + 1 32-byte entries: always a layout.)
        let layout = Self::layout(n).unwrap_or_else(|| std::alloc::handle_alloc_error(one));
        // SAFETY: `layout` has a non-zero size.
        let p = unsafe { std::alloc::alloc(layout) };
        if p.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        // `SqSlots`' `repr(C)` layout: its fields in order, `slots` at the
        // first multiple of its alignment after the 16-byte header, 32
        // (`tests::slots_lie_where_the_layout_says`). `p` is valid for
        // `layout.size()` = 32 (n + 1) bytes and aligned to 32.
        // SAFETY: `tail` at offset 0, in the allocation, aligned.
        unsafe { p.cast::<AtomicU64>().write(AtomicU64::new(0)) };
        // SAFETY: `mask` at offset 8, in the allocation, aligned.
        let mask = unsafe { p.add(8) };
        // SAFETY: as above.
        unsafe { mask.cast::<u64>().write(n as u64 - 1) };
        // SAFETY: slot 0 at offset 32, in the allocation (n ≥ 1).
        let first = unsafe { p.add(32) }.cast::<SqSlot>();
        for i in 0..n {
            // SAFETY: slot `i < n` at 32 + 32 i, in the allocation.
            let at = unsafe { first.add(i) };
            let slot = SqSlot {
                start: AtomicU64::new(Self::unused(i as u64, n as u64)),
                ..SqSlot::default()
            };
            // SAFETY: `at` is in the allocation and aligned to 32.
            unsafe { at.write(slot) };
        }
        // A slice-tailed struct's pointer carries the slice's length.
        let fat = std::ptr::slice_from_raw_parts_mut(p.cast::<SqSlot>(), n) as *mut SqSlots;
        // SAFETY: allocated by the global allocator with the layout `Box`
        // frees it with (`size_of_val` of `n` slots is the same
        // 32 (n + 1) bytes, align 32), every field initialized above.
        let boxed = unsafe { Box::from_raw(fat) };
        Arc::from(boxed)
    }

    /// The position a slot holds before a WQE is recorded in it (`new`,
    /// [`SqTrack::restart`]): slot `i`'s one lap of `n` before position 0,
    /// `i − n` (wrapping), so it is `≡ i` modulo `n` like every recorded
    /// position, and before any `tail`: refused, whatever the counter.
    fn unused(i: u64, n: u64) -> u64 {
        i.wrapping_sub(n)
    }

    /// One unused slot, nothing outstanding: what a CQ's lean path holds
    /// when it has no sole QP (its key then matches no CQE).
    pub fn placeholder() -> Arc<SqSlots> {
        Self::new(1)
    }

    /// The consumer counter.
    #[inline(always)]
    pub fn tail(&self) -> &AtomicU64 {
        &self.tail
    }

    /// The slot of WQEBB `i` (modulo the ring): no bounds check.
    #[inline(always)]
    fn slot(&self, i: u64) -> &SqSlot {
        let i = (i & self.mask) as usize;
        // SAFETY: `new` made `slots` exactly `mask + 1` long and both are
        // private and never change after, so `i <= mask < slots.len()`.
        unsafe { self.slots.get_unchecked(i) }
    }

    /// Retire every WQE up to and including the one whose WQE index is
    /// `counter` (§10: unsignaled WQEs before it are done too); its
    /// `(wr_id, completion opcode code)`, or `None` if `counter` names no
    /// outstanding WQE start.
    ///
    /// The slot at `counter` (modulo the ring) says where its WQE was
    /// posted (`start`, free-running). `counter` names an outstanding WQE
    /// start iff that position is in `tail .. tail + n` (`n` slots) and its
    /// low 16 bits are `counter` — no load of `head`, and no compare of
    /// `start - tail` with `n` either: its sign is enough. A slot's
    /// position is the start of the WQE now at that slot, or older (the
    /// slot is inside a longer WQE, or retired, or unused:
    /// [`SqSlots::unused`]). The poster records only below `tail + n`
    /// (the ring holds `n` WQEBBs, and `tail` only grows), so a position
    /// at or after `tail` is in `tail .. tail + n`: outstanding
    /// (`tail ≤ start < head`) or a WQE the poster is publishing now. An
    /// older one is before `tail`, and stays before it however long it is
    /// left (positions are 64 bits and never wrap): `start - tail` is
    /// negative. Refused: a slot inside a longer WQE or retired since, an
    /// unused slot, a counter whose high bits differ. The one case the
    /// `head` compare also refused is a CQE for a WQE whose slot is
    /// recorded but whose `head` is not yet published — which no device
    /// writes before the doorbell; a hostile one that guesses it completes
    /// a WQE that is being posted, with its own `wr_id` and `meta` (`start`
    /// is stored last, `Release`, and loaded `Acquire`), and `tail` then
    /// equals the `head` the poster publishes. The poster cannot reuse a
    /// slot of the window before `tail` passes it, so the retire count,
    /// `start + WQEBBs - tail`, needs no further check.
    #[inline(always)]
    pub fn complete(&self, counter: u16) -> Option<(u64, u32)> {
        let tail = self.tail.load(Ordering::Relaxed);
        let slot = self.slot(u64::from(counter));
        let start = slot.start.load(Ordering::Acquire);
        let meta = slot.meta.load(Ordering::Relaxed);
        let wr_id = slot.wr_id.load(Ordering::Relaxed);
        if (start.wrapping_sub(tail) as i64) < 0 || start as u16 != counter {
            return None;
        }
        self.tail
            .store(start + u64::from((meta >> 8) & 0xff), Ordering::Release);
        Some((wr_id, meta & 0xff))
    }
}

impl SqTrack {
    /// Tracking for `wqebbs` WQEBBs, rounded up to a power of two in
    /// `1 ..= 2^15` (the SQ's own bounds, `Qp::new`).
    pub fn new(wqebbs: u32) -> SqTrack {
        SqTrack {
            slots: SqSlots::new(wqebbs),
            head: AtomicU64::new(0),
        }
    }

    /// The consumer counter.
    #[inline(always)]
    pub fn tail(&self) -> &AtomicU64 {
        self.slots.tail()
    }

    /// What a CQ's poller holds of this queue.
    pub fn slots(&self) -> &Arc<SqSlots> {
        &self.slots
    }

    /// Back to position 0 (the QP was reset: the device's WQE index starts
    /// at 0 again): `head`, `tail` and every slot as `new` left them, so
    /// that no position recorded before the reset is in the window after
    /// it. (The poster's, with nothing in flight: a CQE of before the reset
    /// that comes now names a slot that is unused again.)
    pub fn restart(&self) {
        let n = self.slots.mask + 1;
        self.head.store(0, Ordering::Release);
        self.tail().store(0, Ordering::Release);
        for (i, slot) in (0..n).zip(self.slots.slots.iter()) {
            slot.start.store(SqSlots::unused(i, n), Ordering::Release);
        }
    }

    /// The number of WQEBBs tracked.
    pub fn wqebbs(&self) -> u32 {
        self.slots.mask as u32 + 1
    }

    /// The slot of WQEBB `i` (modulo the ring), for tests.
    #[cfg(test)]
    pub fn slot_at(&self, i: u64) -> &SqSlot {
        self.slots.slot(i)
    }

    /// Record the WQE starting at WQEBB `head` (the poster, before it
    /// publishes `head`).
    #[inline(always)]
    pub fn record(&self, head: u64, wr_id: u64, meta: u32) {
        self.slots.slot(head).set(head, wr_id, meta);
    }

    /// The first slot (for [`SqBlocks`]).
    fn slots_ptr(&self) -> NonNull<SqSlot> {
        NonNull::from(&self.slots.slots).cast::<SqSlot>()
    }

    /// [`SqSlots::complete`].
    #[inline(always)]
    pub fn complete(&self, counter: u16) -> Option<(u64, u32)> {
        self.slots.complete(counter)
    }

    /// The oldest outstanding WQE, retired: for software flushes.
    pub fn pop(&self) -> Option<(u64, u32)> {
        let head = self.head.load(Ordering::Acquire);
        let tail = self.tail().load(Ordering::Relaxed);
        if head == tail {
            return None;
        }
        self.complete(tail as u16).or_else(|| {
            // Inconsistent metadata: drop everything rather than loop.
            self.tail().store(head, Ordering::Release);
            None
        })
    }

    pub fn outstanding(&self) -> u32 {
        self.head
            .load(Ordering::Acquire)
            .wrapping_sub(self.tail().load(Ordering::Acquire)) as u32
    }
}

/// A receive queue's tracking, indexed by WQE.
#[derive(Debug)]
pub(crate) struct RqTrack {
    pub wrid: Box<[AtomicU64]>,
    pub head: AtomicU32,
    pub tail: AtomicU32,
    pub mask: u32,
}

fn atomics64(n: usize) -> Box<[AtomicU64]> {
    (0..n).map(|_| AtomicU64::new(0)).collect()
}

impl RqTrack {
    pub fn new(entries: u32) -> RqTrack {
        RqTrack {
            wrid: atomics64(entries as usize),
            head: AtomicU32::new(0),
            tail: AtomicU32::new(0),
            mask: entries - 1,
        }
    }

    /// Retire the oldest receive (a plain RQ completes in order, §10);
    /// `(wr_id, index matches counter)`, or `None` when nothing is posted.
    pub fn complete(&self, counter: u16) -> Option<(u64, bool)> {
        let head = self.head.load(Ordering::Acquire);
        let tail = self.tail.load(Ordering::Relaxed);
        if head == tail {
            return None;
        }
        let idx = tail & self.mask;
        let wr_id = self.wrid.get(idx as usize)?.load(Ordering::Relaxed);
        self.tail.store(tail.wrapping_add(1), Ordering::Release);
        let matches = (u32::from(counter) ^ tail) & self.mask == 0;
        Some((wr_id, matches))
    }

    pub fn outstanding(&self) -> u32 {
        self.head
            .load(Ordering::Acquire)
            .wrapping_sub(self.tail.load(Ordering::Acquire))
    }
}

/// What a QP shares with its CQs.
#[derive(Debug)]
pub(crate) struct QpShared {
    pub qpn: u32,
    pub sq: SqTrack,
    pub rq: RqTrack,
    /// Set once the device is fatal (or the QP went to ERR in software):
    /// CQ pollers flush what is outstanding. Set through
    /// [`QpShared::set_flush`], which closes `gate` with it.
    pub flush: AtomicBool,
    /// The fast WRITE paths' gate: an RDMA WRITE of `n` inline bytes
    /// passes every check but queue space iff `n < gate` — the poster's
    /// [`crate::rdma::wq::fast_inline_limit`] of state, service and inline limit
    /// ([`crate::rdma::wq::WorkQueues::set_state`]), 0 once `flush` is set. One
    /// load and compare on the hot path for all of them and device health.
    pub gate: AtomicU32,
    /// The QP was destroyed: CQs drop it at their next attach.
    pub destroyed: AtomicBool,
}

impl crate::firmware::health::Flush for QpShared {
    fn set_flush(&self) {
        QpShared::set_flush(self);
    }
}

impl QpShared {
    /// Flush the QP: set `flush`, then close `gate`. With
    /// [`QpShared::open_gate`]'s store-then-check (all `SeqCst`), whichever
    /// of the two runs last leaves the gate closed: a flushed QP's fast
    /// path refuses from then on.
    pub(crate) fn set_flush(&self) {
        self.flush.store(true, Ordering::SeqCst);
        self.gate.store(0, Ordering::SeqCst);
    }

    /// The poster's new fast-path limit (its state or limits changed):
    /// stored, then closed again if the QP was flushed meanwhile.
    pub(crate) fn open_gate(&self, limit: usize) {
        self.gate
            .store(u32::try_from(limit).unwrap_or(u32::MAX), Ordering::SeqCst);
        if self.flush.load(Ordering::SeqCst) {
            self.gate.store(0, Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn post(sq: &SqTrack, wr_id: u64, bbs: u32) -> u16 {
        let head = sq.head.load(Ordering::Relaxed);
        sq.record(head, wr_id, sq_meta(bbs, 1));
        sq.head.store(head + u64::from(bbs), Ordering::Release);
        head as u16
    }

    #[test]
    fn a_cqe_retires_the_unsignaled_wqes_before_it() {
        let sq = SqTrack::new(8);
        post(&sq, 1, 1);
        post(&sq, 2, 2);
        let c = post(&sq, 3, 1);
        assert_eq!(sq.outstanding(), 4);
        assert_eq!(sq.complete(c), Some((3, 1)));
        assert_eq!(sq.outstanding(), 0);
        // Replayed CQE: nothing outstanding.
        assert_eq!(sq.complete(c), None);
    }

    #[test]
    fn hostile_counters_are_refused() {
        let sq = SqTrack::new(8);
        post(&sq, 1, 2);
        post(&sq, 2, 1);
        // Inside the first WQE (not its start), beyond head, far away.
        assert_eq!(sq.complete(1), None);
        assert_eq!(sq.complete(3), None);
        assert_eq!(sq.complete(0x8000), None);
        assert_eq!(sq.complete(u16::MAX), None);
        assert_eq!(sq.outstanding(), 3);
        assert_eq!(sq.complete(0), Some((1, 1)));
        assert_eq!(sq.complete(2), Some((2, 1)));
    }

    #[test]
    fn the_16_bit_index_wraps() {
        let sq = SqTrack::new(4);
        sq.head.store(0xfffe, Ordering::Relaxed);
        sq.tail().store(0xfffe, Ordering::Relaxed);
        let a = post(&sq, 10, 1);
        let b = post(&sq, 11, 2);
        assert_eq!((a, b), (0xfffe, 0xffff));
        let c = post(&sq, 12, 1);
        assert_eq!(c, 0x0001);
        assert_eq!(sq.complete(0x0001), Some((12, 1)));
        assert_eq!(sq.tail().load(Ordering::Relaxed), 0x1_0002);
    }

    /// Slot 1 last held a WQE at position 1; `lap` WQEBBs later a 2-WQEBB
    /// WQE covers it (`lap`, `lap + 1`), so its slot is stale but a CQE
    /// naming 0x0001 — the WQEBB inside the WQE, which is no WQE start —
    /// matches its 16-bit index (and, at a lap of 2^32, the low 32 bits of
    /// its position: a 32-bit window took it as outstanding, with its old
    /// `wr_id`, and moved `tail` past `head`).
    fn a_slot_stale_for(lap: u64) {
        let sq = SqTrack::new(4);
        post(&sq, 10, 1);
        post(&sq, 11, 1);
        assert_eq!(sq.complete(1), Some((11, 1)));
        sq.head.store(lap, Ordering::Relaxed);
        sq.tail().store(lap, Ordering::Relaxed);
        assert_eq!(post(&sq, 12, 2), 0);
        assert_eq!(sq.slot_at(1).start.load(Ordering::Relaxed), 1, "stale");
        assert_eq!(sq.complete(1), None);
        assert_eq!(sq.outstanding(), 2, "nothing retired");
        assert_eq!(sq.tail().load(Ordering::Relaxed), lap);
        assert_eq!(sq.complete(0), Some((12, 1)));
        assert_eq!(sq.tail().load(Ordering::Relaxed), lap + 2);
        assert_eq!(sq.outstanding(), 0);
    }

    #[test]
    fn a_stale_slot_with_the_same_16_bit_index_is_refused() {
        a_slot_stale_for(1 << 16);
    }

    #[test]
    fn a_slot_stale_for_2_32_wqebbs_is_refused() {
        a_slot_stale_for(1 << 32);
    }

    #[test]
    fn slots_lie_where_the_layout_says() {
        for n in [1u32, 2, 8, 1 << 15] {
            let s = SqSlots::new(n);
            let base = std::ptr::from_ref(&*s).cast::<u8>();
            let at = |p: *const u8| p as usize - base as usize;
            assert_eq!(at(std::ptr::from_ref(&s.tail).cast()), 0);
            assert_eq!(at(std::ptr::from_ref(&s.mask).cast()), 8);
            assert_eq!(s.slots.len(), n as usize);
            assert_eq!(s.mask, u64::from(n) - 1);
            for (i, slot) in s.slots.iter().enumerate() {
                assert_eq!(at(std::ptr::from_ref(slot).cast()), 32 + 32 * i);
                assert_eq!(
                    slot.start.load(Ordering::Relaxed),
                    (i as u64).wrapping_sub(u64::from(n))
                );
            }
            assert_eq!(
                std::mem::size_of_val(&*s),
                SqSlots::layout(n as usize).map_or(0, |l| l.size())
            );
        }
    }

    /// A QP reset starts the positions at 0 again: a slot recorded before
    /// it (positions 0 ..= 2 here) names no outstanding WQE after it, though
    /// its position is in the new window's range and its counter matches.
    #[test]
    fn slots_recorded_before_a_reset_are_refused_after_it() {
        let sq = SqTrack::new(8);
        post(&sq, 1, 1);
        post(&sq, 2, 1);
        post(&sq, 3, 1);
        sq.restart();
        assert_eq!(sq.outstanding(), 0);
        for c in 0..=u16::MAX {
            assert_eq!(sq.complete(c), None, "counter {c:#x}");
        }
        assert_eq!(sq.tail().load(Ordering::Relaxed), 0);
        // Posting after the reset works as on a new queue.
        post(&sq, 4, 1);
        post(&sq, 5, 1);
        assert_eq!(sq.complete(2), None, "position 2 is not posted yet");
        assert_eq!(sq.complete(1), Some((5, 1)));
        assert_eq!(sq.outstanding(), 0);
    }

    #[test]
    fn a_slot_no_wqe_was_recorded_in_is_refused() {
        // A 3-WQEBB WQE on a fresh ring: slots 1 and 2 were never written.
        let sq = SqTrack::new(4);
        post(&sq, 1, 3);
        assert_eq!(sq.complete(1), None);
        assert_eq!(sq.complete(2), None);
        assert_eq!(sq.complete(0), Some((1, 1)));
        // One slot: nothing maps anywhere before the first post.
        let one = SqTrack::new(1);
        assert_eq!(one.complete(0), None);
        assert_eq!(one.complete(1), None);
        post(&one, 7, 1);
        assert_eq!(one.complete(1), None, "index 1 is not position 0");
        assert_eq!(one.complete(0), Some((7, 1)));
    }

    /// `complete` loads no `head`: over many laps of 1- to 3-WQEBB WQEs on
    /// 8 slots, the counters it takes are exactly the outstanding WQE
    /// starts (every 16-bit counter tried at each step, `tail` put back).
    #[test]
    fn exactly_the_outstanding_starts_complete_without_a_head_load() {
        let sq = SqTrack::new(8);
        let mut starts = std::collections::VecDeque::new();
        let mut rng = 0x9e37_79b9u32;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 17;
            rng ^= rng << 5;
            rng
        };
        for step in 0..200u32 {
            let head = sq.head.load(Ordering::Relaxed);
            let tail = sq.tail().load(Ordering::Relaxed);
            let bbs = next() % 3 + 1;
            if head - tail + u64::from(bbs) <= 8 && next() % 3 != 0 {
                let at = post(&sq, u64::from(step), bbs);
                starts.push_back(u32::from(at));
            } else if !starts.is_empty() {
                // Complete one of the outstanding WQEs (the later ones retire
                // those before them).
                let k = next() as usize % starts.len();
                let c = starts[k] as u16;
                assert!(sq.complete(c).is_some(), "step {step}");
                starts.drain(..=k);
            }
            let tail = sq.tail().load(Ordering::Relaxed);
            for c in 0..=u16::MAX {
                let took = sq.complete(c).is_some();
                sq.tail().store(tail, Ordering::Relaxed);
                assert_eq!(
                    took,
                    starts.contains(&u32::from(c)),
                    "step {step}, counter {c:#x}"
                );
            }
        }
    }

    /// A CQE for a WQE whose slot is recorded but whose `head` is not yet
    /// published (a device that guessed it): that WQE, with its own
    /// `wr_id`, and `tail` becomes the `head` the poster then publishes.
    #[test]
    fn a_wqe_being_published_completes_with_its_own_slot() {
        let sq = SqTrack::new(4);
        post(&sq, 1, 1);
        sq.record(1, 42, sq_meta(2, 3));
        assert_eq!(sq.complete(1), Some((42, 3)));
        assert_eq!(sq.tail().load(Ordering::Relaxed), 3);
        sq.head.store(3, Ordering::Release);
        assert_eq!(sq.outstanding(), 0);
        assert_eq!(sq.complete(1), None, "retired: refused again");
    }

    #[test]
    fn software_flush_pops_in_order() {
        let sq = SqTrack::new(8);
        post(&sq, 1, 1);
        post(&sq, 2, 3);
        assert_eq!(sq.pop(), Some((1, 1)));
        assert_eq!(sq.pop(), Some((2, 1)));
        assert_eq!(sq.pop(), None);
    }

    #[test]
    fn receives_complete_in_order() {
        let rq = RqTrack::new(4);
        for i in 0..3u64 {
            let h = rq.head.load(Ordering::Relaxed);
            rq.wrid[(h & rq.mask) as usize].store(100 + i, Ordering::Relaxed);
            rq.head.store(h + 1, Ordering::Release);
        }
        assert_eq!(rq.complete(0), Some((100, true)));
        assert_eq!(rq.complete(7), Some((101, false)));
        assert_eq!(rq.complete(2), Some((102, true)));
        assert_eq!(rq.complete(3), None);
    }
}
