//! The data path of a QP's work queues, sans-IO apart from its DMA words:
//! [`WorkQueues`] builds send WQEs in the SQ ring and receive WQEs in the RQ
//! ring, publishes the tracking the CQs read, stores the doorbell record
//! between the two named barriers, and tells the caller what UAR write
//! ([`SendDoorbell`]) the post needs — so the whole path below the MMIO
//! store runs in unit tests over plain buffers.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use rnic_core::{Memory, RecvWr, SendFlags, SendOp, SendWr, UdDest, UdDestination, WcOpcode};
use rnic_dma::barrier::dma_wmb_before_doorbell;
use rnic_mlx5_prm::{BLUEFLAME_MAX_BYTES, QpState, WQEBB_BYTES, WqeOpcode, qp_doorbell_record};

use crate::firmware::neigh::link_local_mac;
use crate::rdma::ring::{BlockHead, Pairs, WordCell, WordRing, Wqebb};
use crate::rdma::track::{QpShared, SqBlocks, sq_meta, wc_opcode_code};
use crate::rdma::wqe::{
    DATAGRAM_SEG_BYTES, MAX_INLINE_DATA, PostFailure, Refused, RingWriter, SendLimits,
    atomic_words, be_pair, ctrl_words, data_words, datagram_seg, default_udp_sport, fm_ce_se,
    inline_header, plan, push_sges, raddr_words,
};
use crate::{DmaBuffer, Mlx5Error};

/// What a QP counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpCounters {
    /// Send WQEs posted.
    pub sends: u64,
    /// Receive WQEs posted.
    pub recvs: u64,
    /// Doorbells rung with a BlueFlame copy.
    pub blueflame: u64,
    /// Doorbells rung with the 8-byte control word.
    pub doorbells: u64,
    /// Posts refused because the SQ or RQ was full (stalls).
    pub queue_full: u64,
}

/// A UD destination whose datagram segment the send path can take: built
/// from the vector ([`UdDest`]), or through an address handle
/// ([`UdSend`]) copied from the [`DatagramTemplate`] its [`crate::Mlx5Ah`] made
/// at `create_ah` — the same bytes either way.
pub trait UdSegment: UdDestination {
    /// The datagram segment of a send from local QP `qpn`.
    fn datagram(&self, qpn: u32) -> Result<[u8; DATAGRAM_SEG_BYTES], PostFailure>;
}

/// [`UdSegment::datagram`] built field by field from the vector.
/// The destination MAC is the vector's, or a link-local GID's own: the post
/// path resolves no neighbours (an address handle does, at `create_ah`).
pub(crate) fn datagram_of(
    dest: &UdDest,
    qpn: u32,
) -> Result<[u8; DATAGRAM_SEG_BYTES], PostFailure> {
    let dmac = dest
        .av
        .dmac
        .or_else(|| link_local_mac(&dest.av.dgid))
        .ok_or(PostFailure::UnresolvedMac { dgid: dest.av.dgid })?;
    let sport = dest
        .av
        .udp_sport
        .unwrap_or_else(|| default_udp_sport(qpn, dest.remote_qpn.get()));
    datagram_seg(dest, dmac, sport).map_err(|_| PostFailure::NoUdDest)
}

impl UdSegment for UdDest {
    #[inline]
    fn datagram(&self, qpn: u32) -> Result<[u8; DATAGRAM_SEG_BYTES], PostFailure> {
        datagram_of(self, qpn)
    }
}

/// The region [`WorkQueues::post_small_write`] read its last payload
/// from, as a view that keeps the buffer (`Arc`) and the base pointer of
/// its words: one key compare and one range check per post, no walk of
/// [`WorkQueues::regions`] and no [`DmaBuffer::words`] fetch. Made only
/// over a region that lies inside its buffer's words; the empty view
/// ([`InlineSource::empty`], no words) refuses every address.
pub(crate) struct InlineSource {
    lkey: u32,
    start: u64,
    /// The region's whole words from `start` (`len / 8`).
    words: u64,
    base: std::ptr::NonNull<std::sync::atomic::AtomicU64>,
    _buf: Option<Arc<DmaBuffer>>,
}

// SAFETY: a pointer into the mapping `_buf` owns (`Send + Sync`), used only
// to form `&AtomicU64`s, as `crate::rdma::ring::WordRing`.
unsafe impl Send for InlineSource {}
// SAFETY: as `Send`; `&InlineSource` hands out only `&AtomicU64` loads.
unsafe impl Sync for InlineSource {}

impl InlineSource {
    /// The view of no region: [`InlineSource::word`] refuses every
    /// address (no words), so `base` is never used.
    pub(crate) const fn empty() -> InlineSource {
        InlineSource {
            lkey: 0,
            start: 0,
            words: 0,
            base: std::ptr::NonNull::dangling(),
            _buf: None,
        }
    }

    /// The view of `r`; `None` unless its `len` bytes lie inside its
    /// buffer's words.
    fn new(r: &Region) -> Option<InlineSource> {
        let buf = r.buffer()?;
        let words = buf.words();
        if r.len > words.len() as u64 * 8 || r.start.checked_add(r.len).is_none() {
            return None;
        }
        Some(InlineSource {
            lkey: r.lkey,
            start: r.start,
            words: r.len / 8,
            base: std::ptr::NonNull::new(words.as_ptr().cast_mut())?,
            _buf: Some(buf.clone()),
        })
    }

    /// The word at `addr` when it is a whole word of this region (its
    /// offset 8-aligned, all 8 bytes inside) under `lkey`: then any 1..=8
    /// bytes from `addr` are inside it too. `None` otherwise (a shorter
    /// tail of the region is the general writer's).
    #[inline(always)]
    fn word(&self, lkey: u32, addr: u64) -> Option<u64> {
        // Alignment and range as one compare: the offset rotated right by
        // 3 is its word index when 8-aligned; otherwise its low bits land
        // on top (≥ 2^61, past any `words` of a mapped buffer). An address
        // below `start` wraps the offset to ≥ 2^64 − start ≥ len (`new`:
        // the region does not wrap), so its index is ≥ `words` too.
        let i = addr.wrapping_sub(self.start).rotate_right(3);
        if i >= self.words || lkey != self.lkey {
            return None;
        }
        // SAFETY: `i < words = len / 8` and `len <= 8 × (the buffer's
        // words)` (`new`; the empty view has no words), so word `i` is one
        // of the buffer's words, a mapping `self._buf` keeps alive; the
        // reference is to an atomic, which assumes nothing about the value.
        let w = unsafe { &*self.base.as_ptr().wrapping_add(i as usize) };
        Some(w.load(Ordering::Relaxed))
    }
}

/// A region inline sends may read from.
pub(crate) struct Region {
    pub lkey: u32,
    pub start: u64,
    pub len: u64,
    pub bytes: RegionBytes,
}

/// What an inline send reads a region's bytes from.
#[derive(Clone)]
pub(crate) enum RegionBytes {
    /// A driver DMA buffer whose first word is the region's first byte:
    /// read word by word in place.
    Buffer(Arc<DmaBuffer>),
    /// Application memory registered in place: read through
    /// [`Memory::read`] (the `Memory`'s byte 0 is the region's first byte).
    Memory(Arc<dyn Memory>),
}

impl Region {
    /// The DMA buffer behind the region, when it is one.
    #[inline(always)]
    fn buffer(&self) -> Option<&Arc<DmaBuffer>> {
        match &self.bytes {
            RegionBytes::Buffer(b) => Some(b),
            RegionBytes::Memory(_) => None,
        }
    }
}

/// The UAR write a send post needs (§8 step 5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendDoorbell {
    /// The first 8 bytes of the last WQE's control segment (memory order).
    pub ctrl: u64,
    /// The WQEBB where the last WQE starts.
    pub wqebb: u32,
    /// Its size in WQEBBs.
    pub wqebbs: u32,
    /// One WQE of at most 256 bytes: a BlueFlame copy may carry it.
    pub single: bool,
}

impl SendDoorbell {
    /// Whether the BlueFlame copy (the whole WQE, in 64-byte units read back
    /// from the SQ ring) may carry this post.
    pub fn blueflame(&self) -> bool {
        self.single
    }
}

/// Write an inline segment whose payload is `len` bytes starting at the
/// first of `src` (8-aligned): header then data, shifted by the 4-byte
/// header, bytes past `len` zeroed, padded to 16 bytes (§9.3).
#[inline(always)]
fn push_inline_aligned(w: &mut RingWriter<'_>, src: &[std::sync::atomic::AtomicU64], len: usize) {
    let mut carry = inline_header(len as u32).to_be_bytes();
    let mut left = len;
    let mut out = 0usize;
    for word in src {
        let mut b = word.load(Ordering::Relaxed).to_ne_bytes();
        if left < 8 {
            for x in b.iter_mut().skip(left) {
                *x = 0;
            }
        }
        left = left.saturating_sub(8);
        let o = [
            carry[0], carry[1], carry[2], carry[3], b[0], b[1], b[2], b[3],
        ];
        w.push(u64::from_ne_bytes(o));
        carry = [b[4], b[5], b[6], b[7]];
        out += 8;
    }
    let total = (4 + len).div_ceil(16) * 16;
    if out < total {
        w.push(u64::from_ne_bytes([
            carry[0], carry[1], carry[2], carry[3], 0, 0, 0, 0,
        ]));
        out += 8;
    }
    while out < total {
        w.push(0);
        out += 8;
    }
}

/// The other half of a BlueFlame register after a ring (§8: `offset ^= size`).
#[inline(always)]
pub const fn next_bf_offset(offset: usize, half: usize) -> usize {
    offset ^ half
}

/// The most inline bytes [`crate::Qp::post_write_inline`] takes: control
/// (16) + remote address (16) + inline header (4) + 28 bytes = one WQEBB.
pub const FAST_INLINE_MAX: usize = WQEBB_BYTES - 16 - 16 - 4;

/// The `ds` [`WorkQueues::write_ctrl`] holds: an 8-byte inline WRITE's
/// (as every one of 1..=12 bytes).
pub const WRITE_CTRL_DS: u32 = inline_write_ds(8);

/// `ds` of an RDMA WRITE of `n` (> 0) inline bytes: control, remote
/// address, the inline segment padded to 16 (§9.3, as [`crate::rdma::wqe::plan`]).
#[inline(always)]
pub const fn inline_write_ds(n: usize) -> u32 {
    if n == 0 {
        2
    } else {
        2 + (4 + n).div_ceil(16) as u32
    }
}

/// What `SIGNALED` in `flags` adds to [`WorkQueues::write_ctrl1`] (the
/// control segment's second word), for a request with no flag but
/// `INLINE` and `SIGNALED`: a signaled WRITE's CE bits over an unsignaled
/// one's, which are one bit, so the flag goes in shifted (no branch).
#[inline(always)]
fn signaled_ctrl1(flags: SendFlags) -> u64 {
    const ON: u64 = ctrl_words(
        WqeOpcode::RdmaWrite,
        0,
        0,
        0,
        fm_ce_se(SendFlags::SIGNALED, false),
        0,
    )[1];
    const OFF: u64 = ctrl_words(
        WqeOpcode::RdmaWrite,
        0,
        0,
        0,
        fm_ce_se(SendFlags::empty(), false),
        0,
    )[1];
    const BIT: u64 = SendFlags::SIGNALED.bits() as u64;
    const SCALE: u64 = (ON ^ OFF) / BIT;
    // OR-ing is exact: the unsignaled bits are a subset of the signaled
    // ones, and the difference is one bit at or above the flag's.
    const {
        assert!(OFF & !ON == 0);
        assert!((ON ^ OFF).is_power_of_two() && BIT.is_power_of_two());
        assert!(SCALE * BIT == ON ^ OFF);
    };
    (u64::from(flags.bits()) & BIT) * SCALE
}

#[inline(always)]
const fn signaled_flags(signaled: bool) -> SendFlags {
    if signaled {
        SendFlags::SIGNALED
    } else {
        SendFlags::empty()
    }
}

/// The 64 bytes (as memory words) of an RDMA WRITE WQE with `N` ≤
/// [`FAST_INLINE_MAX`] inline bytes: control, remote address, inline
/// header and data, zeros to the end of the WQEBB.
#[inline(always)]
pub fn inline_write_words<const N: usize>(
    wqe_index: u16,
    qpn: u32,
    ds: u32,
    fm_ce_se: u32,
    remote_addr: u64,
    rkey: u32,
    data: &[u8; N],
) -> [u64; 8] {
    let ctrl = ctrl_words(WqeOpcode::RdmaWrite, wqe_index, qpn, ds, fm_ce_se, 0);
    let raddr = raddr_words(remote_addr, rkey);
    // Inline segment: header dword then the bytes, zero-padded (§9.3).
    let mut seg = [0u8; 32];
    if N > 0 {
        seg[..4].copy_from_slice(&inline_header(N as u32).to_be_bytes());
        seg[4..4 + N].copy_from_slice(data);
    }
    let word = |i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&seg[i * 8..i * 8 + 8]);
        u64::from_ne_bytes(b)
    };
    [
        ctrl[0],
        ctrl[1],
        raddr[0],
        raddr[1],
        word(0),
        word(1),
        word(2),
        word(3),
    ]
}

/// `BYTE_MASKS[n]` keeps bytes `0..n` (memory order) of a word (n ≤ 8).
const BYTE_MASKS: [u64; 9] = {
    let mut m = [0u64; 9];
    let mut n = 0;
    while n <= 8 {
        m[n] = keep_bytes(u64::MAX, n);
        n += 1;
    }
    m
};

/// Bytes `0..n` (memory order) of a word, the rest zero.
#[inline(always)]
const fn keep_bytes(word: u64, n: usize) -> u64 {
    if n >= 8 {
        return word;
    }
    let low = (1u64 << (8 * n)) - 1;
    let mask = if cfg!(target_endian = "little") {
        low
    } else {
        !(u64::MAX >> (8 * n))
    };
    word & mask
}

/// The memory word made of the last 4 bytes of `prev` then the first 4 of
/// `next` (memory order): the inline payload shifted by its 4-byte header.
#[inline(always)]
fn shift4(prev: u64, next: u64) -> u64 {
    if cfg!(target_endian = "little") {
        (prev >> 32) | (next << 32)
    } else {
        (prev << 32) | (next >> 32)
    }
}

/// [`inline_write_words`] with the `len` (1..=[`FAST_INLINE_MAX`]) inline
/// bytes read from region words `src` (`len.div_ceil(8)` of them, the
/// payload starting at the first): the same 64 bytes.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(crate) fn inline_write_words_from(
    wqe_index: u16,
    qpn: u32,
    ds: u32,
    fm_ce_se: u32,
    remote_addr: u64,
    rkey: u32,
    src: &[std::sync::atomic::AtomicU64],
    len: usize,
) -> [u64; 8] {
    let ctrl = ctrl_words(WqeOpcode::RdmaWrite, wqe_index, qpn, ds, fm_ce_se, 0);
    let raddr = raddr_words(remote_addr, rkey);
    let d = |i: usize| {
        src.get(i).map_or(0, |w| {
            keep_bytes(w.load(Ordering::Relaxed), len.saturating_sub(i * 8))
        })
    };
    let (d0, d1, d2, d3) = (d(0), d(1), d(2), d(3));
    // The header dword in memory order, as the low (LE) / high (BE) half.
    let hdr = u64::from(inline_header(len as u32).to_be());
    let hdr = if cfg!(target_endian = "little") {
        hdr << 32
    } else {
        hdr
    };
    [
        ctrl[0],
        ctrl[1],
        raddr[0],
        raddr[1],
        shift4(hdr, d0),
        shift4(d0, d1),
        shift4(d1, d2),
        shift4(d2, d3),
    ]
}

/// The doorbell record's memory word for receive producer `rq_head` and
/// send producer `sq_head` (each counter 16 bits).
#[inline(always)]
fn dbrec_word(rq_head: u32, sq_head: u32) -> u64 {
    let recv = qp_doorbell_record::recv_counter.insert(0, rq_head & 0xffff);
    let send = qp_doorbell_record::send_counter.insert(0, sq_head & 0xffff);
    be_pair(recv, send)
}

/// A QP's rings and the state of its one poster.
pub(crate) struct WorkQueues {
    pub qpn: u32,
    pub state: QpState,
    pub buf: Arc<DmaBuffer>,
    pub shared: Arc<QpShared>,
    pub sq_word_base: usize,
    pub sq_mask_words: usize,
    pub sq_wqebbs: u32,
    /// WQEBBs posted beyond one per send WQE (wrapping, and less the sends
    /// before a reset): the send count is the producer
    /// (`shared.sq.head`, the poster's only copy) minus this
    /// ([`WorkQueues::sends`]), so a one-WQEBB post counts nothing.
    pub sq_extra: u64,
    /// The QP rings through a BlueFlame block pair of its own (an
    /// exclusive register with a [`crate::function::wc::BlockWindow`]): only then
    /// may `shared.gate` open, since the paths behind it
    /// ([`WorkQueues::fast_head`]) ring that pair unconditionally.
    pub block_pair: bool,
    pub rq_entries: u32,
    pub rq_stride_words: usize,
    pub rq_mask_words: usize,
    pub rq_head: u32,
    pub max_recv_sge: usize,
    /// The slot that ends a receive scatter list shorter than the stride:
    /// byte_count 0, the terminator key (`Hca::terminator_lkey`), addr 0.
    pub recv_terminator: [u64; 2],
    pub dbrec_word: usize,
    pub limits: SendLimits,
    pub sig_all: bool,
    pub regions: Vec<Region>,
    pub counters: QpCounters,
    /// The SQ's words (`sq_word_base ..`, `sq_wqebbs` WQEBBs) as a ring,
    /// with `shared`'s tracking slots, one per block.
    pub sq: SqBlocks,
    /// The doorbell record (`dbrec_word`).
    pub dbrec: WordCell,
    /// `tail + sq_wqebbs` at the last look at the consumer: the producer
    /// may reach it and no further. Kept by every writer of `sq_head`
    /// (`sq_limit - sq_head` stays in `0..=sq_wqebbs`), so the fast path's
    /// queue-space check is one compare; 0 (or any stale value at or
    /// behind the producer) only sends the next post to
    /// [`WorkQueues::sq_room`], which looks again.
    pub sq_limit: u32,
    /// The control segment's first word of an RDMA WRITE from this QP
    /// with index 0 and `ds` [`WRITE_CTRL_DS`] (the memory word); kept by
    /// [`WorkQueues::set_state`].
    pub write_ctrl: u64,
    /// The control segment's second memory word of an unsignaled RDMA
    /// WRITE from this QP (CE set iff `sig_all`), kept by
    /// [`WorkQueues::set_state`]: a request's `SIGNALED` goes in as one
    /// shifted bit.
    pub write_ctrl1: u64,
    /// The region the last small inline WRITE read from (a cache of
    /// `regions`, filled out of line on a miss).
    pub inline_src: InlineSource,
}

/// One more than the inline bytes the fast RDMA WRITE may carry in `state`
/// on a QP with `limits` (`max_inline + 1` on an RC QP in RTS, else 0): an
/// `n`-byte inline WRITE passes the state, service and inline-limit checks
/// iff `n < fast_inline_limit(..)`.
pub(crate) const fn fast_inline_limit(state: QpState, limits: &SendLimits) -> usize {
    if matches!(state, QpState::Rts) && !limits.ud {
        limits.max_inline + 1
    } else {
        0
    }
}

/// The SQ ring and doorbell record views of a QP buffer; `None` unless
/// they lie inside it (`sq_words` a power of two of at least 8).
pub(crate) fn views(
    buf: &Arc<DmaBuffer>,
    sq_word_base: usize,
    sq_words: usize,
    dbrec_word: usize,
) -> Option<(WordRing, WordCell)> {
    Some((
        WordRing::new(buf.clone(), sq_word_base, sq_words)?,
        WordCell::new(buf.clone(), dbrec_word)?,
    ))
}

impl WorkQueues {
    /// The SQ producer in WQEBBs (free-running). The poster's own: it lives
    /// in `shared.sq.head`, which only the poster writes, so reading it
    /// back needs no ordering.
    #[inline(always)]
    pub fn sq_head(&self) -> u32 {
        self.sq_head64() as u32
    }

    /// [`WorkQueues::sq_head`] with its high bits (the send count's base).
    #[inline(always)]
    fn sq_head64(&self) -> u64 {
        self.shared.sq.head.load(Ordering::Relaxed)
    }

    /// Send WQEs posted (derived: [`WorkQueues::sq_extra`]).
    pub fn sends(&self) -> u64 {
        self.sq_head64().wrapping_sub(self.sq_extra)
    }

    /// The SQ restarts at 0 (reset): the send count carried over.
    pub fn restart_sq(&mut self) {
        self.sq_extra = self.sq_extra.wrapping_sub(self.sq_head64());
        self.shared.sq.restart();
        self.sq_limit = 0;
    }

    /// What `shared.gate` opens to: [`fast_inline_limit`], on a QP with a
    /// block pair of its own ([`WorkQueues::block_pair`]); else 0.
    fn gate_limit(&self) -> usize {
        if self.block_pair {
            fast_inline_limit(self.state, &self.limits)
        } else {
            0
        }
    }

    /// Move to `state` (the driver's view), keeping the fast path's limit.
    pub fn set_state(&mut self, state: QpState) {
        self.state = state;
        self.shared.open_gate(self.gate_limit());
        self.write_ctrl = ctrl_words(WqeOpcode::RdmaWrite, 0, self.qpn, WRITE_CTRL_DS, 0, 0)[0];
        self.write_ctrl1 = ctrl_words(
            WqeOpcode::RdmaWrite,
            0,
            0,
            0,
            fm_ce_se(SendFlags::empty(), self.sig_all),
            0,
        )[1];
    }

    /// The memory word of [`ctrl_words`]`(RdmaWrite, index, qpn, ds, ..)[0]`
    /// from [`WorkQueues::write_ctrl`]: the index's memory bits put in,
    /// `ds` corrected from [`WRITE_CTRL_DS`] (nothing to do for 1..=12
    /// inline bytes, a compile-time constant otherwise).
    #[inline(always)]
    fn write_ctrl_word(&self, index: u16, ds: u32) -> u64 {
        // The fields alone (the opcode is in `write_ctrl`), in memory
        // order; `ds ^ WRITE_CTRL_DS` in the `ds` field turns the kept
        // `ds` into `ds`.
        let opcode = ctrl_words(WqeOpcode::RdmaWrite, 0, 0, 0, 0, 0)[0];
        let varying =
            ctrl_words(WqeOpcode::RdmaWrite, index, 0, ds ^ WRITE_CTRL_DS, 0, 0)[0] ^ opcode;
        self.write_ctrl ^ varying
    }

    /// The queue-space check behind [`WorkQueues::sq_limit`] when the
    /// producer has reached it: the consumer read again (`Acquire`, as
    /// the general writer), the limit moved; `QueueFull` (counted) when
    /// the SQ is really full.
    #[cold]
    #[inline(never)]
    fn sq_room(&mut self, head: u32) -> Result<(), Refused> {
        let tail = self.shared.sq.tail().load(Ordering::Acquire) as u32;
        let used = head.wrapping_sub(tail);
        if used >= self.sq_wqebbs {
            return Err(self.queue_full(used));
        }
        self.sq_limit = tail.wrapping_add(self.sq_wqebbs);
        Ok(())
    }

    /// Change the send limits, keeping the fast path's limit.
    #[cfg(test)]
    pub fn set_limits(&mut self, limits: SendLimits) {
        self.limits = limits;
        self.shared.open_gate(self.gate_limit());
    }

    /// Word `i` (from 0) of the WQE that starts at WQEBB `wqebb`, read back
    /// from the SQ ring (modulo the ring).
    #[inline(always)]
    pub fn sq_word(&self, wqebb: u32, i: usize) -> u64 {
        self.sq
            .ring()
            .word((wqebb as usize * 8).wrapping_add(i))
            .load(Ordering::Relaxed)
    }

    #[inline(always)]
    pub(crate) fn store_dbrec(&self) {
        self.dbrec
            .get()
            .store(dbrec_word(self.rq_head, self.sq_head()), Ordering::Relaxed);
    }

    #[inline(always)]
    fn gather_inline<D: UdDestination>(
        &self,
        wr: &SendWr<'_, D>,
        len: usize,
        w: &mut RingWriter<'_>,
    ) -> Result<(), PostFailure> {
        if let [s] = wr.sg_list
            && let Some(words) = self.inline_words(s)
        {
            push_inline_aligned(w, words, len);
            return Ok(());
        }
        self.gather_inline_staged(wr, len, w)
    }

    /// Several SGEs or an unaligned one: stage header and payload.
    #[cold]
    #[inline(never)]
    fn gather_inline_staged<D: UdDestination>(
        &self,
        wr: &SendWr<'_, D>,
        len: usize,
        w: &mut RingWriter<'_>,
    ) -> Result<(), PostFailure> {
        let mut data = [0u8; 4 + MAX_INLINE_DATA];
        self.stage_inline(wr, len, &mut data)?;
        w.bytes(&data[..(4 + len).div_ceil(16) * 16]);
        Ok(())
    }

    /// The region words under a single inline SGE at an 8-aligned offset.
    #[inline(always)]
    fn inline_words(&self, s: &rnic_core::Sge) -> Option<&[std::sync::atomic::AtomicU64]> {
        if !s.addr.is_multiple_of(8) {
            return None;
        }
        let n = s.length as u64;
        // A plain loop (not `Iter::find`): it inlines into the post.
        for r in &self.regions {
            if r.lkey == s.lkey.get()
                && s.addr >= r.start
                // `e ≥ addr ≥ start`: no wrap, even for a region at the top.
                && s.addr.checked_add(n).is_some_and(|e| e - r.start <= r.len)
            {
                let first = ((s.addr - r.start) / 8) as usize;
                return r
                    .buffer()?
                    .words()
                    .get(first..first + (s.length as usize).div_ceil(8));
            }
        }
        None
    }

    #[inline(always)]
    fn stage_inline<D: UdDestination>(
        &self,
        wr: &SendWr<'_, D>,
        len: usize,
        data: &mut [u8],
    ) -> Result<(), PostFailure> {
        if let Some(h) = data.get_mut(..4) {
            h.copy_from_slice(&inline_header(len as u32).to_be_bytes());
        }
        let mut at = 4;
        for s in wr.sg_list.iter().filter(|s| s.length > 0) {
            let n = s.length as usize;
            let miss = PostFailure::InlineRegion {
                addr: s.addr,
                len: s.length,
                lkey: s.lkey.get(),
            };
            let r = self
                .regions
                .iter()
                .find(|r| {
                    r.lkey == s.lkey.get()
                        && s.addr >= r.start
                        && s.addr
                            .checked_add(n as u64)
                            .is_some_and(|e| e - r.start <= r.len)
                })
                .ok_or(miss)?;
            let dst = data.get_mut(at..at + n).ok_or(miss)?;
            let off = (s.addr - r.start) as usize;
            match &r.bytes {
                RegionBytes::Buffer(buf) if off.is_multiple_of(8) => {
                    // Whole words straight from the region (8-aligned source).
                    let words = buf.words();
                    for (i, chunk) in dst.chunks_mut(8).enumerate() {
                        let word = words.get(off / 8 + i).ok_or(miss)?;
                        let bytes = word.load(Ordering::Relaxed).to_ne_bytes();
                        chunk.copy_from_slice(&bytes[..chunk.len()]);
                    }
                }
                RegionBytes::Buffer(buf) => buf.read(off, dst).map_err(|_| miss)?,
                RegionBytes::Memory(m) => m.read(off, dst).map_err(|_| miss)?,
            }
            at += n;
        }
        Ok(())
    }

    /// Steps 1–4 of a send post: WQEs, tracking, barrier, record, barrier;
    /// what the UAR write (step 5) must be, if anything was posted.
    #[inline(always)]
    pub fn post_send<D: UdSegment>(
        &mut self,
        wrs: &[SendWr<'_, D>],
        fatal: bool,
    ) -> (Option<SendDoorbell>, Result<(), Mlx5Error>) {
        if let [wr] = wrs
            && let Some(wqe) = self.post_fast_write(wr, fatal)
        {
            let ring = SendDoorbell {
                ctrl: wqe.head[0],
                wqebb: self.sq_head().wrapping_sub(1),
                wqebbs: 1,
                single: true,
            };
            return (Some(ring), Ok(()));
        }
        self.post_send_general(wrs, fatal)
    }

    /// [`WorkQueues::post_send`] without the single-WRITE shortcut: every
    /// request through the general writer.
    #[inline(never)]
    pub fn post_send_general<D: UdSegment>(
        &mut self,
        wrs: &[SendWr<'_, D>],
        fatal: bool,
    ) -> (Option<SendDoorbell>, Result<(), Mlx5Error>) {
        let start = self.sq_head64();
        let mut head = start;
        let mut ring = SendDoorbell {
            ctrl: 0,
            wqebb: 0,
            wqebbs: 0,
            single: false,
        };
        let mut failed = None;
        for (index, wr) in wrs.iter().enumerate() {
            if let Err(reason) = self.write_send(wr, fatal, &mut ring, &mut head) {
                if matches!(reason, PostFailure::QueueFull { .. }) {
                    self.counters.queue_full += 1;
                }
                failed = Some(Mlx5Error::PostSend { index, reason });
                break;
            }
        }
        if head == start {
            return (None, failed.map_or(Ok(()), Err));
        }
        ring.single = failed.is_none()
            && wrs.len() == 1
            && ring.wqebbs as usize * WQEBB_BYTES <= BLUEFLAME_MAX_BYTES;
        // The batch's WQEs published (the pollers' window) and counted.
        self.shared.sq.head.store(head, Ordering::Release);
        // WQEs before the doorbell record.
        dma_wmb_before_doorbell();
        self.store_dbrec();
        // The record before the UAR write that makes the device read it.
        dma_wmb_before_doorbell();
        (Some(ring), failed.map_or(Ok(()), Err))
    }

    #[inline(always)]
    fn write_send<D: UdSegment>(
        &mut self,
        wr: &SendWr<'_, D>,
        fatal: bool,
        ring: &mut SendDoorbell,
        next: &mut u64,
    ) -> Result<(), PostFailure> {
        if fatal || self.shared.flush.load(Ordering::Relaxed) {
            return Err(PostFailure::DeviceFatal);
        }
        if self.state != QpState::Rts {
            return Err(PostFailure::BadState {
                state: self.state.name().unwrap_or("?"),
            });
        }
        let p = plan(wr, &self.limits)?;
        let tail = self.shared.sq.tail().load(Ordering::Acquire) as u32;
        let head = *next as u32;
        let used = head.wrapping_sub(tail);
        if used + p.wqebbs > self.sq_wqebbs {
            return Err(PostFailure::QueueFull { outstanding: used });
        }
        // The producer ends at or behind it (`WorkQueues::sq_limit`).
        self.sq_limit = tail.wrapping_add(self.sq_wqebbs);
        let words = self.buf.words();
        let mut w = RingWriter::new(
            words,
            self.sq_word_base,
            self.sq_mask_words,
            head as usize * 8,
        )
        .ok_or(PostFailure::QueueFull { outstanding: used })?;
        let ctrl = ctrl_words(
            p.opcode,
            head as u16,
            self.qpn,
            p.ds,
            fm_ce_se(wr.flags, self.sig_all),
            p.imm,
        );
        w.seg(ctrl);
        if self.limits.ud {
            let dest = wr.ud.as_ref().ok_or(PostFailure::NoUdDest)?;
            w.bytes(&dest.datagram(self.qpn)?);
        }
        if let Some((raddr, rkey)) = wr.op.remote() {
            w.seg(raddr_words(raddr, rkey.get()));
        }
        match wr.op {
            SendOp::AtomicCmpSwap { compare, swap, .. } => w.seg(atomic_words(swap, compare)),
            SendOp::AtomicFetchAdd { add, .. } => w.seg(atomic_words(add, 0)),
            _ => {}
        }
        if p.inline {
            if p.inline_len > 0 {
                self.gather_inline(wr, p.inline_len, &mut w)?;
            }
        } else {
            push_sges(&mut w, wr.sg_list);
        }
        ring.ctrl = ctrl[0];
        ring.wqebb = head;
        ring.wqebbs = p.wqebbs;
        self.shared.sq.record(
            *next,
            wr.wr_id,
            sq_meta(p.wqebbs, wc_opcode_code(p.wc_opcode)),
        );
        // Published by the caller after the batch.
        *next = next.wrapping_add(u64::from(p.wqebbs));
        self.sq_extra = self.sq_extra.wrapping_add(u64::from(p.wqebbs - 1));
        Ok(())
    }

    /// The direct fast path (mlx5dv-class): one RDMA WRITE of `N` inline
    /// bytes (`N` ≤ [`FAST_INLINE_MAX`], so the WQE is one WQEBB and never
    /// wraps), built whole in registers and stored with one bounds check —
    /// steps 1–4 of [`WorkQueues::post_send`] with the same bytes for the
    /// same request (unit-tested against it). Its 64 bytes (the WQE, zeros
    /// past its `ds`) are returned for the BlueFlame copy.
    #[inline(always)]
    pub fn post_write_inline<const N: usize>(
        &mut self,
        wr_id: u64,
        remote_addr: u64,
        rkey: u32,
        data: &[u8; N],
        signaled: bool,
        fatal: bool,
    ) -> Result<[u64; 8], Refused> {
        const { assert!(N <= FAST_INLINE_MAX) };
        if !self.fast_write_ok(fatal, N) {
            return Err(self.fast_refusal(fatal, N));
        }
        let head = self.sq_head64();
        if head as u32 == self.sq_limit {
            self.sq_room(head as u32)?;
        }
        Ok(self
            .write_inline_at(head, wr_id, remote_addr, rkey, data, signaled)
            .words())
    }

    /// The producer, if an inline RDMA WRITE of `n` bytes may take the
    /// straight path: every check passes (state, service, inline limit,
    /// flush flag, a block pair of its own: `shared.gate`) and the
    /// producer is short of [`WorkQueues::sq_limit`] (moved here when it
    /// has reached it and the consumer has moved on). Then
    /// [`WorkQueues::write_inline_at`] posts it there.
    #[inline(always)]
    pub fn fast_head(&mut self, n: usize) -> Option<u64> {
        if n >= self.shared.gate.load(Ordering::Relaxed) as usize {
            return None;
        }
        let head = self.sq_head64();
        (head as u32 != self.sq_limit || self.move_limit(head as u32)).then_some(head)
    }

    /// The producer reached [`WorkQueues::sq_limit`]: read the consumer
    /// again (`Acquire`, as the general writer) and move the limit;
    /// `false`, nothing changed, when the SQ is really full.
    #[inline(always)]
    fn move_limit(&mut self, head: u32) -> bool {
        let tail = self.shared.sq.tail().load(Ordering::Acquire) as u32;
        if head.wrapping_sub(tail) >= self.sq_wqebbs {
            return false;
        }
        self.sq_limit = tail.wrapping_add(self.sq_wqebbs);
        true
    }

    /// The post of [`WorkQueues::post_write_inline`] after its checks, at
    /// producer `head` (= [`WorkQueues::sq_head`]): the WQE built in registers, stored,
    /// tracked and recorded ([`WorkQueues::commit_wqebb`]); its 64 bytes
    /// returned for the BlueFlame copy. Callers check first (`post_write_inline`,
    /// or [`WorkQueues::fast_head`]): without the checks it would
    /// still write only inside the ring, but past the consumer or on a QP
    /// that may not send.
    #[inline(always)]
    pub fn write_inline_at<const N: usize>(
        &mut self,
        head: u64,
        wr_id: u64,
        remote_addr: u64,
        rkey: u32,
        data: &[u8; N],
        signaled: bool,
    ) -> Wqebb {
        let ctrl0 = self.write_ctrl_word(head as u16, inline_write_ds(N));
        let ctrl1 = ctrl_words(
            WqeOpcode::RdmaWrite,
            0,
            0,
            0,
            fm_ce_se(signaled_flags(signaled), self.sig_all),
            0,
        )[1];
        let raddr = raddr_words(remote_addr, rkey);
        let first = [ctrl0, ctrl1, raddr[0], raddr[1]];
        let wqe = if N == 8 {
            let mut d = [0u8; 8];
            d.copy_from_slice(&data[..]);
            Wqebb::with_inline8(first, inline_header(8).to_be_bytes(), d)
        } else {
            let mut w = inline_write_words(0, 0, 0, 0, 0, 0, data);
            w[..4].copy_from_slice(&first);
            Wqebb::from_words(w)
        };
        self.commit_wqebb(head, &wqe, wr_id);
        wqe
    }

    /// Whether an RDMA WRITE of `n` inline bytes passes every check of
    /// [`WorkQueues::post_send`] but queue space, with or without a block
    /// pair (so not through `shared.gate`, which a QP without one keeps
    /// closed).
    #[inline(always)]
    fn fast_write_ok(&self, fatal: bool, n: usize) -> bool {
        !fatal
            & !self.shared.flush.load(Ordering::Relaxed)
            & (n < fast_inline_limit(self.state, &self.limits))
    }

    /// Why [`WorkQueues::fast_write_ok`] said no, in the order
    /// [`WorkQueues::post_send`] checks.
    #[cold]
    #[inline(never)]
    fn fast_refusal(&self, fatal: bool, n: usize) -> Refused {
        if fatal || self.shared.flush.load(Ordering::Relaxed) {
            Refused::DeviceFatal
        } else if self.state != QpState::Rts {
            Refused::BadState { state: self.state }
        } else if self.limits.ud {
            Refused::WriteOnUd
        } else {
            Refused::InlineTooLong {
                got: u16::try_from(n).unwrap_or(u16::MAX),
                max: u16::try_from(self.limits.max_inline).unwrap_or(u16::MAX),
            }
        }
    }

    #[cold]
    #[inline(never)]
    fn queue_full(&mut self, used: u32) -> Refused {
        self.counters.queue_full += 1;
        Refused::QueueFull { outstanding: used }
    }

    /// Store one whole WQEBB at `head` (the ring's block: masked, no
    /// bounds check), its tracking (an RDMA WRITE), the producer, then the
    /// record between the two named barriers. Everything the record needs
    /// is read before the first barrier (a compiler fence on x86_64, after
    /// which fields would be loaded again).
    #[inline(always)]
    fn commit_wqebb<H: BlockHead>(&mut self, head: u64, wqe: &Wqebb<H>, wr_id: u64) {
        let shared: &QpShared = &self.shared;
        self.sq.commit(
            head,
            wqe,
            wr_id,
            sq_meta(1, wc_opcode_code(WcOpcode::RdmaWrite)),
        );
        // One WQEBB, one send: the producer is the only count kept
        // (`sq_extra` unchanged).
        let next = head.wrapping_add(1);
        shared.sq.head.store(next, Ordering::Release);
        const _: () = assert!(
            qp_doorbell_record::send_counter.dword_offset() == 4
                && qp_doorbell_record::send_counter.width == 32
        );
        let cell = &self.dbrec;
        // WQE before the doorbell record.
        dma_wmb_before_doorbell();
        // Only the send counter changed, and only its low 16 bits (the
        // driver writes it mod 2^16: the high half stays zero): those two
        // bytes alone (as `store_dbrec` would leave the word, unit-tested).
        cell.store_dword1_low16(next as u16);
        // The record before the UAR write that makes the device read it.
        dma_wmb_before_doorbell();
    }

    /// [`WorkQueues::post_send`]'s common case on the fast path's code: a
    /// single signaled-or-not RDMA WRITE with `INLINE`, one SGE of 1..=28
    /// bytes at an 8-aligned address of a region given to
    /// [`crate::Qp::use_region`], no fence or solicited flag, on an RC QP
    /// with room — the same bytes as the general writer (unit-tested).
    /// `None` when any of that does not hold (the general writer then
    /// takes the request and makes every refusal); else the WQE's eight
    /// words (one WQEBB, at `sq_head − 1` now) for the BlueFlame copy.
    #[inline(always)]
    pub fn post_fast_write<D: UdDestination>(
        &mut self,
        wr: &SendWr<'_, D>,
        fatal: bool,
    ) -> Option<Wqebb> {
        let SendOp::RdmaWrite { remote_addr, rkey } = wr.op else {
            return None;
        };
        let [s] = wr.sg_list else {
            return None;
        };
        let len = s.length as usize;
        if !(SendFlags::INLINE | SendFlags::SIGNALED).contains(wr.flags)
            || !wr.flags.contains(SendFlags::INLINE)
            || len == 0
            || len > FAST_INLINE_MAX
            || !self.fast_write_ok(fatal, len)
        {
            return None;
        }
        let head = self.sq_head64();
        // A really full queue: the general writer counts it and refuses it.
        if head as u32 == self.sq_limit && !self.move_limit(head as u32) {
            return None;
        }
        let src = self.inline_words(s)?;
        let wqe = inline_write_words_from(
            head as u16,
            self.qpn,
            inline_write_ds(len),
            fm_ce_se(wr.flags, self.sig_all),
            remote_addr,
            rkey.get(),
            src,
            len,
        );
        let wqe = Wqebb::from_words(wqe);
        self.commit_wqebb(head, &wqe, wr.wr_id);
        Some(wqe)
    }

    /// [`WorkQueues::post_fast_write`] for its most common case, with the
    /// fewest tests: an RDMA WRITE with `INLINE` (and perhaps `SIGNALED`)
    /// of one SGE of 1..=8 bytes in a whole word (8-aligned offset) of a region given
    /// to [`crate::Qp::use_region`], on a QP that passes
    /// [`WorkQueues::fast_head`]. The payload is one region word,
    /// masked to its length, and the WQE is built as
    /// [`WorkQueues::write_inline_at`] builds one: the same bytes as the
    /// general writer (unit-tested). `None`, nothing written, when any of
    /// that does not hold.
    #[inline(always)]
    pub fn post_small_write<D: UdDestination>(
        &mut self,
        wr: &SendWr<'_, D>,
    ) -> Option<Wqebb<Pairs>> {
        let SendOp::RdmaWrite { remote_addr, rkey } = wr.op else {
            return None;
        };
        let [s] = wr.sg_list else {
            return None;
        };
        let len = s.length as usize;
        if wr.flags.difference(SendFlags::SIGNALED) != SendFlags::INLINE || len.wrapping_sub(1) >= 8
        {
            return None;
        }
        let head = self.fast_head(len)?;
        let Some(word) = self.inline_src.word(s.lkey.get(), s.addr) else {
            // Keep the region for the next post; this one goes the longer
            // way (nothing live across the call on the hot path).
            self.inline_source_miss(s);
            return None;
        };
        let data = (word & BYTE_MASKS[len]).to_ne_bytes();
        let raddr = raddr_words(remote_addr, rkey.get());
        let first = [
            // 4 + len ≤ 12 bytes of inline segment: `ds` 3 for every len.
            self.write_ctrl_word(head as u16, inline_write_ds(8)),
            self.write_ctrl1 | signaled_ctrl1(wr.flags),
            raddr[0],
            raddr[1],
        ];
        let wqe = Wqebb::with_inline8(first, inline_header(len as u32).to_be_bytes(), data);
        self.commit_wqebb(head, &wqe, wr.wr_id);
        Some(wqe)
    }

    /// [`WorkQueues::inline_src`] missed: find the region `s` names (as
    /// the general writer does) and keep it.
    #[cold]
    #[inline(never)]
    fn inline_source_miss(&mut self, s: &rnic_core::Sge) {
        let len = u64::from(s.length);
        let r = self.regions.iter().find(|r| {
            r.lkey == s.lkey.get()
                && s.addr >= r.start
                && s.addr
                    .checked_add(len)
                    .zip(r.start.checked_add(r.len))
                    .is_some_and(|(e, end)| e <= end)
        });
        if let Some(src) = r.and_then(InlineSource::new) {
            self.inline_src = src;
        }
    }

    /// Post a batch of receives (RQ WQEs, then the record's receive counter).
    pub fn post_recv(&mut self, wrs: &[RecvWr<'_>], fatal: bool) -> Result<(), Mlx5Error> {
        let start = self.rq_head;
        let mut failed = None;
        for (index, wr) in wrs.iter().enumerate() {
            if let Err(reason) = self.write_recv(wr, fatal) {
                if matches!(reason, PostFailure::QueueFull { .. }) {
                    self.counters.queue_full += 1;
                }
                failed = Some(Mlx5Error::PostRecv { index, reason });
                break;
            }
        }
        if self.rq_head != start {
            self.shared.rq.head.store(self.rq_head, Ordering::Release);
            // RQ WQEs before the record that hands them to the device.
            dma_wmb_before_doorbell();
            self.store_dbrec();
        }
        failed.map_or(Ok(()), Err)
    }

    #[inline(always)]
    fn write_recv(&mut self, wr: &RecvWr<'_>, fatal: bool) -> Result<(), PostFailure> {
        if fatal || self.shared.flush.load(Ordering::Relaxed) {
            return Err(PostFailure::DeviceFatal);
        }
        if self.state == QpState::Rst {
            return Err(PostFailure::BadState { state: "RST" });
        }
        if wr.sg_list.len() > self.max_recv_sge {
            return Err(PostFailure::TooManySge {
                got: wr.sg_list.len(),
                max: self.max_recv_sge,
            });
        }
        let tail = self.shared.rq.tail.load(Ordering::Acquire);
        let used = self.rq_head.wrapping_sub(tail);
        if used >= self.rq_entries {
            return Err(PostFailure::QueueFull { outstanding: used });
        }
        let slot = (self.rq_head & (self.rq_entries - 1)) as usize * self.rq_stride_words;
        let mut w = RingWriter::new(self.buf.words(), 0, self.rq_mask_words, slot)
            .ok_or(PostFailure::QueueFull { outstanding: used })?;
        let mut n = 0;
        // Zero-length scatter entries are skipped (RC qp.c:3862-3866): a
        // data segment's byte_count 0 reads as 2 GiB (audit row 12).
        for s in wr.sg_list.iter().filter(|s| s.length != 0) {
            w.seg(data_words(s.length, s.lkey.get(), s.addr));
            n += 1;
        }
        if n * 2 < self.rq_stride_words {
            w.seg(self.recv_terminator);
        }
        let idx = (self.rq_head & self.shared.rq.mask) as usize;
        if let Some(id) = self.shared.rq.wrid.get(idx) {
            id.store(wr.wr_id, Ordering::Relaxed);
        }
        self.rq_head = self.rq_head.wrapping_add(1);
        self.counters.recvs += 1;
        Ok(())
    }
}
