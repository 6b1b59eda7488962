//! The data path end to end below the MMIO store, over plain DMA buffers
//! with a fake device (a test that writes CQEs the way mlx5.md §10 says the
//! device does): WQE bytes in the SQ/RQ rings, doorbell records, the
//! doorbell a post asks for, CQE decoding (success and each error syndrome),
//! owner parity across ring wraps, and hostile CQEs.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rnic_core::{
    Lkey, Memory, Qpn, RecvWr, Rkey, SendFlags, SendWr, Sge, WcFlags, WcOpcode, WcStatus,
    WorkCompletion,
};
use rnic_dma::{IovaAllocator, RecordingMapper};
use rnic_mlx5_prm::{
    CQE_OP_OWN_INIT, Cqe64, CqeOpcode, CqeSyndrome, ErrCqe, QpState, WqeCtrlSeg, WqeDataSeg,
    WqeOpcode, WqeRaddrSeg,
};

use crate::function::memory::IovaSpace;
use crate::rdma::cq::{CqRing, cq_buffer_bytes};
use crate::rdma::track::{QpShared, RqTrack, SqBlocks, SqTrack};
use crate::rdma::wq::QpCounters;
use crate::rdma::wq::{Region, RegionBytes, WorkQueues, next_bf_offset};
use crate::rdma::wqe::{PostFailure, Refused, SendLimits};
use crate::{DmaBuffer, Mlx5Error};

fn space() -> Arc<IovaSpace> {
    IovaSpace::new(
        "fake".into(),
        Arc::new(RecordingMapper::new()),
        IovaAllocator::new(&[0x10_0000..=0xFFFF_FFFF]),
    )
}

const QPN: u32 = 0x2a;
const SQ_BBS: u32 = 8;
const RQ: u32 = 4;
const STRIDE: usize = 32; // two slots

fn queues(space: &Arc<IovaSpace>, ud: bool) -> (WorkQueues, Arc<DmaBuffer>) {
    let rq_bytes = RQ as usize * STRIDE;
    let sq_bytes = SQ_BBS as usize * 64;
    let wq_bytes = (rq_bytes + sq_bytes).div_ceil(4096) * 4096;
    let buf = space.alloc(wq_bytes + 64).unwrap();
    let data = space.alloc(4096).unwrap();
    data.write(0, b"inline!!").unwrap();
    let shared = Arc::new(QpShared {
        qpn: QPN,
        sq: SqTrack::new(SQ_BBS),
        rq: RqTrack::new(RQ),
        flush: AtomicBool::new(false),
        gate: std::sync::atomic::AtomicU32::new(0),
        destroyed: AtomicBool::new(false),
    });
    let (sq_ring, dbrec) =
        crate::rdma::wq::views(&buf, rq_bytes / 8, sq_bytes / 8, wq_bytes / 8).unwrap();
    let sq = SqBlocks::new(sq_ring, &shared).unwrap();
    let mut wq = WorkQueues {
        qpn: QPN,
        state: QpState::Rts,
        buf: buf.clone(),
        shared,
        sq_word_base: rq_bytes / 8,
        sq_mask_words: sq_bytes / 8 - 1,
        sq_wqebbs: SQ_BBS,
        sq_extra: 0,
        block_pair: true,
        rq_entries: RQ,
        rq_stride_words: STRIDE / 8,
        rq_mask_words: rq_bytes / 8 - 1,
        rq_head: 0,
        max_recv_sge: 2,
        recv_terminator: crate::rdma::wqe::RECV_TERMINATOR,
        dbrec_word: wq_bytes / 8,
        limits: SendLimits {
            max_sge: 2,
            max_inline: 64,
            ud,
        },
        sig_all: false,
        regions: vec![Region {
            lkey: 0x500,
            start: data.as_ptr() as u64,
            len: 4096,
            bytes: RegionBytes::Buffer(data.clone()),
        }],
        counters: QpCounters::default(),
        sq,
        dbrec,
        sq_limit: 0,
        write_ctrl: 0,
        write_ctrl1: 0,
        inline_src: crate::rdma::wq::InlineSource::empty(),
    };
    wq.set_state(QpState::Rts);
    (wq, data)
}

fn read(buf: &DmaBuffer, at: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    buf.read(at, &mut v).unwrap();
    v
}

fn sq_at(wq: &WorkQueues, bb: usize) -> usize {
    wq.sq_word_base * 8 + bb * 64
}

#[test]
fn an_inline_write_is_one_wqebb_with_blueflame_and_a_doorbell_record() {
    let s = space();
    let (mut wq, data) = queues(&s, false);
    let sge = [Sge::new(data.as_ptr() as u64, 8, Lkey(0x500))];
    let mut wr = SendWr::rdma_write(7, &sge, 0x1000_0000, Rkey(0x1234));
    wr.flags = SendFlags::INLINE | SendFlags::SIGNALED;
    let (ring, r) = wq.post_send(&[wr], false);
    r.unwrap();
    let ring = ring.unwrap();
    // ctrl + raddr + inline(4 + 8 → 16) = 3 DS, one WQEBB.
    let mut golden = [0u8; 48];
    {
        let mut c = WqeCtrlSeg::new_checked(&mut golden[..16]).unwrap();
        c.set_opcode(WqeOpcode::RdmaWrite.as_raw().into()).unwrap();
        c.set_wqe_index(0).unwrap();
        c.set_qpn(QPN).unwrap();
        c.set_ds(3).unwrap();
        c.set_completion_mode(2).unwrap();
        let mut r = WqeRaddrSeg::new_checked(&mut golden[16..32]).unwrap();
        r.set_raddr(0x1000_0000).unwrap();
        r.set_rkey(0x1234).unwrap();
    }
    golden[32..36].copy_from_slice(&[0x80, 0, 0, 8]);
    golden[36..44].copy_from_slice(b"inline!!");
    assert_eq!(read(&wq.buf, sq_at(&wq, 0), 48), golden);
    // Doorbell record: receive counter 0, send counter 1 (WQEBBs).
    let rec = read(&wq.buf, wq.dbrec_word * 8, 8);
    assert_eq!(rec, [0, 0, 0, 0, 0, 0, 0, 1]);
    // A single WQE of 64 bytes: BlueFlame, one 64-byte unit; ctrl word = first 8 bytes.
    assert!(ring.blueflame());
    assert_eq!((ring.wqebb, ring.wqebbs), (0, 1));
    let bytes: Vec<u8> = (0..8)
        .flat_map(|i| wq.sq_word(0, i).to_ne_bytes())
        .collect();
    assert_eq!(&bytes[..48], &golden[..]);
    assert_eq!(ring.ctrl.to_ne_bytes(), golden[..8]);
    assert_eq!(wq.shared.sq.outstanding(), 1);
    // Halves alternate 0x000 ↔ 0x100.
    assert_eq!(next_bf_offset(0, 256), 256);
    assert_eq!(next_bf_offset(256, 256), 0);
}

#[test]
fn a_batch_rings_once_without_blueflame_and_wraps_the_sq() {
    let s = space();
    let (mut wq, data) = queues(&s, false);
    let sge = [Sge::new(data.as_ptr() as u64, 64, Lkey(0x500))];
    // 2 SGEs: ctrl + raddr + 2 data = 4 DS = 1 WQEBB; atomics: ctrl+raddr+atomic+data = 1.
    let two = [sge[0], Sge::new(data.as_ptr() as u64 + 64, 64, Lkey(0x500))];
    let wrs: Vec<SendWr<'_>> = (0..7)
        .map(|i| SendWr::rdma_write(i, &two, 0x2000, Rkey(9)))
        .collect();
    let (ring, r) = wq.post_send(&wrs, false);
    r.unwrap();
    let ring = ring.unwrap();
    assert!(!ring.blueflame(), "a batch rings the 8-byte doorbell");
    // The ctrl word names the last WQE (index 6).
    assert_eq!(ring.ctrl.to_ne_bytes()[..4], [0, 0, 6, 0x08]);
    // Full: 8 WQEBBs, 7 used; a 2-WQEBB WQE does not fit.
    let many = [sge[0]; 2];
    let mut big = SendWr::send(99, &many);
    big.flags = SendFlags::INLINE; // 4 + 128 bytes > 64 max_inline
    let (_, r) = wq.post_send(&[big], false);
    assert!(matches!(
        r,
        Err(Mlx5Error::PostSend {
            index: 0,
            reason: PostFailure::InlineTooLong { .. }
        })
    ));
    // Retire all 7 with one CQE naming the last (unsignaled before it).
    assert_eq!(wq.shared.sq.complete(6), Some((6, 1)));
    // Now post 3 more: indices 7, 8, 9 at WQEBBs 7, 0, 1 (wrap).
    let wrs: Vec<SendWr<'_>> = (10..13).map(|i| SendWr::send(i, &sge)).collect();
    let (_, r) = wq.post_send(&wrs, false);
    r.unwrap();
    let at = sq_at(&wq, 0);
    let c = read(&wq.buf, at, 4);
    assert_eq!(c, [0, 0, 8, 0x0a], "WQE index 8 at WQEBB 0 after the wrap");
    let rec = read(&wq.buf, wq.dbrec_word * 8 + 4, 4);
    assert_eq!(rec, [0, 0, 0, 10]);
}

#[test]
fn full_queue_and_fatal_and_state_are_refused_without_writing() {
    let s = space();
    let (mut wq, data) = queues(&s, false);
    let sge = [Sge::new(data.as_ptr() as u64, 8, Lkey(0x500))];
    let wrs: Vec<SendWr<'_>> = (0..9).map(|i| SendWr::send(i, &sge)).collect();
    let (ring, r) = wq.post_send(&wrs, false);
    assert!(ring.is_some(), "the 8 that fit are rung");
    assert!(matches!(
        r,
        Err(Mlx5Error::PostSend {
            index: 8,
            reason: PostFailure::QueueFull { outstanding: 8 }
        })
    ));
    let (ring, r) = wq.post_send(&wrs[..1], true);
    assert!(ring.is_none());
    assert!(matches!(
        r,
        Err(Mlx5Error::PostSend {
            reason: PostFailure::DeviceFatal,
            ..
        })
    ));
    wq.set_state(QpState::Rtr);
    let (ring, r) = wq.post_send(&wrs[..1], false);
    assert!(ring.is_none());
    assert!(matches!(
        r,
        Err(Mlx5Error::PostSend {
            reason: PostFailure::BadState { .. },
            ..
        })
    ));
    // An inline SGE outside every region.
    wq.set_state(QpState::Rts);
    let _ = wq.shared.sq.complete(7);
    let stray = [Sge::new(0x10, 8, Lkey(0x500))];
    let mut w = SendWr::send(1, &stray);
    w.flags = SendFlags::INLINE;
    let (_, r) = wq.post_send(&[w], false);
    assert!(matches!(
        r,
        Err(Mlx5Error::PostSend {
            reason: PostFailure::InlineRegion { .. },
            ..
        })
    ));
}

#[test]
fn receives_fill_slots_with_a_terminator_and_update_the_record() {
    let s = space();
    let (mut wq, _data) = queues(&s, false);
    let one = [Sge::new(0xabc0, 256, Lkey(0x77))];
    let two = [one[0], Sge::new(0xdef0, 16, Lkey(0x78))];
    let three = [one[0]; 3];
    wq.post_recv(&[RecvWr::new(1, &one), RecvWr::new(2, &two)], false)
        .unwrap();
    let mut g = [0u8; 32];
    {
        let mut d = WqeDataSeg::new_checked(&mut g[..16]).unwrap();
        d.set_byte_count(256).unwrap();
        d.set_lkey(0x77).unwrap();
        d.set_addr(0xabc0).unwrap();
        let mut t = WqeDataSeg::new_checked(&mut g[16..]).unwrap();
        t.set_lkey(rnic_mlx5_prm::INVALID_LKEY).unwrap();
    }
    assert_eq!(read(&wq.buf, 0, 32), g, "slot 0: SGE then terminator");
    assert_eq!(
        read(&wq.buf, 32 + 16, 16)[..8],
        [0, 0, 0, 16, 0, 0, 0, 0x78]
    );
    assert_eq!(read(&wq.buf, wq.dbrec_word * 8, 4), [0, 0, 0, 2]);
    assert!(matches!(
        wq.post_recv(&[RecvWr::new(3, &three)], false),
        Err(Mlx5Error::PostRecv {
            reason: PostFailure::TooManySge { got: 3, max: 2 },
            ..
        })
    ));
    wq.post_recv(&[RecvWr::new(3, &one), RecvWr::new(4, &one)], false)
        .unwrap();
    assert!(matches!(
        wq.post_recv(&[RecvWr::new(5, &one)], false),
        Err(Mlx5Error::PostRecv {
            reason: PostFailure::QueueFull { outstanding: 4 },
            ..
        })
    ));
}

/// The fake device: writes a CQE at `ci` with the owner bit of that pass.
struct FakeCq {
    buf: Arc<DmaBuffer>,
    log: u32,
    pi: u32,
}

impl FakeCq {
    fn push(&mut self, fill: impl FnOnce(&mut [u8; 64])) {
        let mut c = [0u8; 64];
        fill(&mut c);
        let owner = (self.pi >> self.log) & 1;
        c[63] = (c[63] & 0xfe) | owner as u8;
        let at = ((self.pi & ((1 << self.log) - 1)) * 64) as usize;
        // Body first, op_own last (as the device must).
        self.buf.write(at, &c[..63]).unwrap();
        self.buf.write(at + 63, &c[63..]).unwrap();
        self.pi += 1;
    }
}

fn cq(space: &Arc<IovaSpace>, log: u32) -> (CqRing, FakeCq) {
    let n = 1u32 << log;
    let buf = space.alloc(cq_buffer_bytes(n)).unwrap();
    for i in 0..n as usize {
        buf.write(i * 64 + 63, &[CQE_OP_OWN_INIT]).unwrap();
    }
    (
        CqRing::new(buf.clone(), log).unwrap(),
        FakeCq { buf, log, pi: 0 },
    )
}

/// A requester CQE of a SEND WQE (what a device writes for one:
/// [`req_op`]).
fn req(qpn: u32, counter: u16, byte_cnt: u32) -> impl Fn(&mut [u8; 64]) {
    req_op(WqeOpcode::Send, qpn, counter, byte_cnt)
}

/// A requester CQE naming a WQE of opcode `op` (`sop_drop_qpn`'s top
/// byte, reference/mlx5.md §10), QP `qpn`, index `counter`.
fn req_op(op: WqeOpcode, qpn: u32, counter: u16, byte_cnt: u32) -> impl Fn(&mut [u8; 64]) {
    move |c| {
        let mut v = Cqe64::new_checked(&mut c[..]).unwrap();
        v.set_wqe_opcode(op.as_raw().into()).unwrap();
        v.set_qpn(qpn).unwrap();
        v.set_wqe_counter(counter.into()).unwrap();
        v.set_byte_cnt(byte_cnt).unwrap();
        v.set_opcode(CqeOpcode::Req.as_raw().into()).unwrap();
    }
}

#[test]
fn requester_completions_retire_unsignaled_wqes_and_respect_owner_parity() {
    let s = space();
    let (mut wq, data) = queues(&s, false);
    let (mut ring, mut dev) = cq(&s, 1); // 2 CQEs: wraps every 2
    ring.attach(wq.shared.clone(), true, true);
    let sge = [Sge::new(data.as_ptr() as u64, 8, Lkey(0x500))];
    let mut wcs = [WorkCompletion::default(); 4];
    assert_eq!(ring.poll(&mut wcs, false), 0, "0xF0 CQEs are invalid");
    for round in 0..5u64 {
        let mut wrs = [
            SendWr::send(round * 10, &sge),
            SendWr::rdma_read(round * 10 + 1, &sge, 0x40, Rkey(3)),
        ];
        wrs[1].flags = SendFlags::SIGNALED;
        let (_, r) = wq.post_send(&wrs, false);
        r.unwrap();
        let last = wq.sq_head().wrapping_sub(1) as u16;
        dev.push(req_op(WqeOpcode::RdmaRead, QPN, last, 8));
        let n = ring.poll(&mut wcs, false);
        assert_eq!(n, 1, "round {round}");
        assert_eq!(wcs[0].wr_id, round * 10 + 1);
        assert_eq!(wcs[0].opcode, WcOpcode::RdmaRead);
        assert_eq!(wcs[0].byte_len, 8);
        assert_eq!(wcs[0].status, WcStatus::Success);
        assert_eq!(wcs[0].qp_num, Qpn::from_wire(QPN));
        assert_eq!(wq.shared.sq.outstanding(), 0);
        // A stale CQE of the previous pass (owner of the other parity) is not taken.
        assert_eq!(ring.poll(&mut wcs, false), 0);
    }
    // Doorbell record: set_ci = 5 consumed, arm word 0.
    let rec = ring_dbrec(&ring);
    assert_eq!(rec, [0, 0, 0, 5, 0, 0, 0, 0]);
}

fn ring_dbrec(ring: &CqRing) -> [u8; 8] {
    ring.record()
}

#[test]
fn a_poll_stores_set_ci_alone_and_leaves_the_armed_word_as_arming_wrote_it() {
    let s = space();
    let (mut wq, _data) = queues(&s, false);
    let (mut ring, mut dev) = cq(&s, 2);
    ring.attach(wq.shared.clone(), true, true);
    let hi = ring.arm_record(true);
    let armed = ring_dbrec(&ring);
    assert_eq!(armed[..4], [0, 0, 0, 0]);
    assert_eq!(
        armed[4..],
        hi.to_be_bytes(),
        "the record's arm dword is the UAR word's"
    );
    let mut wcs = [WorkCompletion::default(); 2];
    for i in 0..3u64 {
        wq.post_write_inline(i, 0, 1, b"8 bytes!", true, false)
            .unwrap();
        dev.push(req_op(
            WqeOpcode::RdmaWrite,
            QPN,
            wq.sq_head().wrapping_sub(1) as u16,
            0,
        ));
        if i == 1 {
            assert_eq!(ring.poll_send().map(|c| c.wr_id()), Some(1));
        } else {
            assert_eq!(ring.poll(&mut wcs, false), 1);
            assert_eq!(wcs[0].wr_id, i);
        }
        // set_ci (the 24-bit consumer index, big-endian) stored after every
        // poll, as K and RC do (audit row 11); the arm dword kept: the word
        // `store_dbrec` writes whole.
        let rec = ring_dbrec(&ring);
        assert_eq!(ring.consumer_index(), i as u32 + 1);
        assert_eq!(rec[..4], (i as u32 + 1).to_be_bytes(), "poll {i}");
        assert_eq!(rec[4..], armed[4..], "poll {i}");
    }
}

#[test]
fn every_error_syndrome_maps_to_its_wc_status_with_vendor_err() {
    let table = [
        (CqeSyndrome::LocalLength, WcStatus::LocLenErr),
        (CqeSyndrome::LocalQpOp, WcStatus::LocQpOpErr),
        (CqeSyndrome::LocalProt, WcStatus::LocProtErr),
        (CqeSyndrome::WrFlushed, WcStatus::WrFlushErr),
        (CqeSyndrome::MwBind, WcStatus::MwBindErr),
        (CqeSyndrome::BadResp, WcStatus::BadRespErr),
        (CqeSyndrome::LocalAccess, WcStatus::LocAccessErr),
        (CqeSyndrome::RemoteInvalReq, WcStatus::RemInvReqErr),
        (CqeSyndrome::RemoteAccess, WcStatus::RemAccessErr),
        (CqeSyndrome::RemoteOp, WcStatus::RemOpErr),
        (CqeSyndrome::TransportRetryExceeded, WcStatus::RetryExcErr),
        (CqeSyndrome::RnrRetryExceeded, WcStatus::RnrRetryExcErr),
        (CqeSyndrome::RemoteAborted, WcStatus::RemAbortErr),
        (CqeSyndrome::Unknown(0x7e), WcStatus::GeneralErr),
    ];
    let s = space();
    let (mut wq, data) = queues(&s, false);
    let (mut ring, mut dev) = cq(&s, 4);
    ring.attach(wq.shared.clone(), true, true);
    let sge = [Sge::new(data.as_ptr() as u64, 8, Lkey(0x500))];
    let mut wcs = [WorkCompletion::default(); 1];
    for (i, (synd, status)) in table.into_iter().enumerate() {
        let (_, r) = wq.post_send(&[SendWr::send(i as u64, &sge)], false);
        r.unwrap();
        let counter = wq.sq_head().wrapping_sub(1) as u16;
        dev.push(|c| {
            let mut v = ErrCqe::new_checked(&mut c[..]).unwrap();
            v.set_qpn(QPN).unwrap();
            v.set_wqe_counter(counter.into()).unwrap();
            v.set_syndrome(synd.as_raw().into()).unwrap();
            v.set_vendor_err_synd(0x40 + i as u32).unwrap();
            v.set_opcode(CqeOpcode::ReqErr.as_raw().into()).unwrap();
        });
        assert_eq!(ring.poll(&mut wcs, false), 1);
        assert_eq!(wcs[0].status, status, "{synd:?}");
        assert_eq!(wcs[0].vendor_err, 0x40 + i as u32);
        assert_eq!(wcs[0].wr_id, i as u64);
        assert_eq!(wcs[0].opcode, WcOpcode::Send);
    }
}

#[test]
fn responder_completions_carry_imm_inval_and_source_qp() {
    let s = space();
    let (mut wq, _) = queues(&s, false);
    let (mut ring, mut dev) = cq(&s, 2);
    ring.attach(wq.shared.clone(), true, true);
    let sge = [Sge::new(0x1000, 64, Lkey(1))];
    let wrs: Vec<RecvWr<'_>> = (0..3).map(|i| RecvWr::new(100 + i, &sge)).collect();
    wq.post_recv(&wrs, false).unwrap();
    for (i, op) in [
        CqeOpcode::RespSendImm,
        CqeOpcode::RespWrImm,
        CqeOpcode::RespSendInv,
    ]
    .into_iter()
    .enumerate()
    {
        dev.push(move |c| {
            let mut v = Cqe64::new_checked(&mut c[..]).unwrap();
            v.set_qpn(QPN).unwrap();
            v.set_wqe_counter(i as u32).unwrap();
            v.set_byte_cnt(17).unwrap();
            v.set_imm_inval_pkey(0xcafe_0000 + i as u32).unwrap();
            v.set_rqpn(0x99).unwrap();
            v.set_opcode(op.as_raw().into()).unwrap();
        });
    }
    let mut wcs = [WorkCompletion::default(); 4];
    assert_eq!(ring.poll(&mut wcs, false), 3);
    assert_eq!(
        (wcs[0].wr_id, wcs[0].opcode, wcs[0].imm_data),
        (100, WcOpcode::Recv, Some(0xcafe_0000))
    );
    assert!(wcs[0].wc_flags.contains(WcFlags::WITH_IMM));
    assert_eq!(wcs[0].byte_len, 17);
    assert_eq!(wcs[0].src_qp, Qpn::from_wire(0x99));
    assert_eq!(
        (wcs[1].wr_id, wcs[1].opcode, wcs[1].imm_data),
        (101, WcOpcode::RecvRdmaWithImm, Some(0xcafe_0001))
    );
    assert_eq!(wcs[2].invalidated_rkey, Some(Rkey(0xcafe_0002)));
    assert!(wcs[2].wc_flags.contains(WcFlags::WITH_INV));
}

#[test]
fn hostile_cqes_are_counted_and_never_complete_anything() {
    let s = space();
    let (mut wq, data) = queues(&s, false);
    let (mut ring, mut dev) = cq(&s, 3);
    ring.attach(wq.shared.clone(), true, true);
    let sge = [Sge::new(data.as_ptr() as u64, 8, Lkey(0x500))];
    let (_, r) = wq.post_send(&[SendWr::send(1, &sge)], false);
    r.unwrap();
    dev.push(req(0x77, 0, 0)); // unknown QPN
    dev.push(req(QPN, 5, 0)); // beyond what was posted
    dev.push(req(QPN, 0xffff, 0)); // far out of range
    dev.push(|c| {
        // A responder CQE with no receive posted.
        let mut v = Cqe64::new_checked(&mut c[..]).unwrap();
        v.set_qpn(QPN).unwrap();
        v.set_opcode(CqeOpcode::RespSend.as_raw().into()).unwrap();
    });
    dev.push(|c| {
        let mut v = Cqe64::new_checked(&mut c[..]).unwrap();
        v.set_opcode(CqeOpcode::ResizeCq.as_raw().into()).unwrap();
    });
    dev.push(|c| {
        // Compressed format (never enabled).
        c[63] = 0x0c;
    });
    let mut wcs = [WorkCompletion::default(); 8];
    assert_eq!(ring.poll(&mut wcs, false), 0);
    let k = ring.counters();
    assert_eq!(k.cqes, 6);
    assert_eq!(k.unknown_qpn, 1);
    assert_eq!(k.bad_wqe_counter, 2);
    assert_eq!(k.unexpected_recv, 1);
    assert_eq!(k.unknown_cqe, 2);
    assert_eq!(wq.shared.sq.outstanding(), 1, "nothing was retired");
    dev.push(req(QPN, 0, 0));
    assert_eq!(ring.poll(&mut wcs, false), 1);
    assert_eq!(wcs[0].wr_id, 1);
}

/// The lean path (a CQ's sole QP, [`CqRing::poll_send`] and the
/// single-completion [`CqRing::poll`]) refuses each hostile CQE the general
/// path refuses, one at a time, with the same counter, and consumes it.
#[test]
fn the_lean_path_counts_and_skips_each_hostile_cqe_like_the_general_one() {
    let s = space();
    let (mut wq, data) = queues(&s, false);
    let (mut ring, mut dev) = cq(&s, 3);
    ring.attach(wq.shared.clone(), true, true);
    let sge = [Sge::new(data.as_ptr() as u64, 8, Lkey(0x500))];
    let long = [Sge::new(data.as_ptr() as u64, 48, Lkey(0x500))];
    // One 1-WQEBB SEND, then a 2-WQEBB one (48 bytes inline: 16 + 4 + 48):
    // positions 0 and 1..3.
    let mut two = SendWr::send(2, &long);
    two.flags = SendFlags::INLINE;
    let (_, r) = wq.post_send(&[SendWr::send(1, &sge), two], false);
    r.unwrap();
    assert_eq!(wq.sq_head(), 3);
    let mut wcs = [WorkCompletion::default(); 1];
    let hostile: [(&str, u32, u16); 5] = [
        ("unknown QPN", 0x77, 0),
        ("QPN of another CQ's QP", QPN + 1, 1),
        ("inside the 2-WQEBB WQE", QPN, 2),
        ("at the head", QPN, 3),
        ("far out of range", QPN, 0x8001),
    ];
    for (i, (what, qpn, counter)) in hostile.into_iter().enumerate() {
        let k0 = ring.counters();
        dev.push(req(qpn, counter, 0));
        let got = if i % 2 == 0 {
            ring.poll_send().map(WorkCompletion::from)
        } else {
            (ring.poll(&mut wcs, false) == 1).then_some(wcs[0])
        };
        assert_eq!(got, None, "{what}");
        let k = ring.counters();
        assert_eq!(k.cqes, k0.cqes + 1, "{what}: consumed");
        let refused = (
            k.unknown_qpn - k0.unknown_qpn,
            k.bad_wqe_counter - k0.bad_wqe_counter,
        );
        assert_eq!(refused, if qpn == QPN { (0, 1) } else { (1, 0) }, "{what}");
        assert_eq!(wq.shared.sq.outstanding(), 3, "{what}: nothing retired");
        // set_ci follows every CQE consumed, hostile ones too (row 11).
        assert_eq!(ring.record()[..4], (i as u32 + 1).to_be_bytes(), "{what}");
    }
    // The last WQE's CQE retires both; a replay of it is refused.
    dev.push(req(QPN, 1, 0));
    let c = ring.poll_send().expect("a completion");
    assert_eq!(
        (c.wr_id(), c.status(), c.opcode(), c.byte_len(), c.qp_num()),
        (2, WcStatus::Success, WcOpcode::Send, 0, Qpn::from_wire(QPN))
    );
    assert_eq!(wq.shared.sq.outstanding(), 0);
    dev.push(req(QPN, 1, 0));
    assert_eq!(ring.poll(&mut wcs, false), 0);
    assert_eq!(ring.counters().bad_wqe_counter, 4);
    assert_eq!(ring.counters().cqes, 7);
    assert_eq!(ring.record()[..4], 7u32.to_be_bytes());
}

/// Each send opcode's completion on the lean path (`poll_send`, a one-entry
/// `poll`, a batch `poll` whose first CQE the lean path hands over) is what
/// the general decoder (a CQ of two QPs) makes of the same CQE: opcode,
/// `byte_len` (READ: the CQE's `byte_cnt`; atomics: 8; SEND and WRITE: 0),
/// QPN, `wr_id`, every other field default.
#[test]
fn every_send_opcode_completes_alike_on_the_lean_and_the_general_path() {
    let s = space();
    let sge = [Sge::new(0x1000, 8, Lkey(0x500))];
    let wrs = [
        SendWr::send(1, &sge),
        SendWr::rdma_write(2, &sge, 0x40, Rkey(3)),
        SendWr::rdma_read(3, &sge, 0x40, Rkey(3)),
        SendWr::atomic_cmp_swap(4, &sge, 0x40, Rkey(3), 1, 2),
        SendWr::atomic_fetch_add(5, &sge, 0x40, Rkey(3), 1),
    ];
    let want = [
        (WcOpcode::Send, 0),
        (WcOpcode::RdmaWrite, 0),
        (WcOpcode::RdmaRead, 0x1234),
        (WcOpcode::CompSwap, 8),
        (WcOpcode::FetchAdd, 8),
    ];
    let op_of = |o: WcOpcode| match o {
        WcOpcode::Send => WqeOpcode::Send,
        WcOpcode::RdmaWrite => WqeOpcode::RdmaWrite,
        WcOpcode::RdmaRead => WqeOpcode::RdmaRead,
        WcOpcode::CompSwap => WqeOpcode::AtomicCs,
        _ => WqeOpcode::AtomicFa,
    };
    for (how, (wr, (opcode, byte_len))) in [0, 1, 2, 3].iter().flat_map(|h| {
        wrs.iter()
            .zip(want)
            .map(move |(w, x)| (*h, ((*w).signaled(), x)))
    }) {
        let (mut wq, _) = queues(&s, false);
        let (mut ring, mut dev) = cq(&s, 1);
        ring.attach(wq.shared.clone(), true, true);
        let (other, _) = queues(&s, false);
        if how == 3 {
            // Two QPs: no sole QP, every CQE through the general decoder
            // (the table finds `wq`, attached first).
            ring.attach(other.shared.clone(), true, true);
        }
        let (_, r) = wq.post_send(std::slice::from_ref(&wr), false);
        r.unwrap();
        dev.push(req_op(op_of(opcode), QPN, 0, 0x1234));
        let mut wcs = [WorkCompletion::default(); 4];
        let wc = match how {
            0 => WorkCompletion::from(ring.poll_send().expect("poll_send")),
            1 => {
                assert_eq!(ring.poll(&mut wcs[..1], false), 1);
                wcs[0]
            }
            2 => {
                assert_eq!(ring.poll(&mut wcs, false), 1);
                wcs[0]
            }
            _ => {
                assert_eq!(ring.poll(&mut wcs[..1], false), 1);
                wcs[0]
            }
        };
        let what = format!("{opcode:?} by path {how}");
        let expected = WorkCompletion {
            wr_id: wr.wr_id,
            status: WcStatus::Success,
            opcode,
            byte_len,
            qp_num: Qpn::from_wire(QPN),
            ..WorkCompletion::default()
        };
        assert_eq!(wc, expected, "{what}");
        assert_eq!(wq.shared.sq.outstanding(), 0, "{what}");
        assert_eq!(ring.counters().cqes, 1, "{what}");
        assert_eq!(ring.record()[..4], 1u32.to_be_bytes(), "{what}");
    }
}

#[test]
fn a_fatal_device_flushes_everything_outstanding_in_software() {
    let s = space();
    let (mut wq, data) = queues(&s, false);
    let (mut ring, _dev) = cq(&s, 3);
    ring.attach(wq.shared.clone(), true, true);
    let sge = [Sge::new(data.as_ptr() as u64, 8, Lkey(0x500))];
    let (_, r) = wq.post_send(
        &[
            SendWr::send(1, &sge),
            SendWr::rdma_write(2, &sge, 0, Rkey(1)),
        ],
        false,
    );
    r.unwrap();
    wq.post_recv(&[RecvWr::new(3, &sge)], false).unwrap();
    let mut wcs = [WorkCompletion::default(); 8];
    assert_eq!(ring.poll(&mut wcs, false), 0);
    let n = ring.poll(&mut wcs, true);
    assert_eq!(n, 3);
    let got: Vec<(u64, WcStatus, WcOpcode)> = wcs[..n]
        .iter()
        .map(|w| (w.wr_id, w.status, w.opcode))
        .collect();
    assert_eq!(
        got,
        vec![
            (1, WcStatus::WrFlushErr, WcOpcode::Send),
            (2, WcStatus::WrFlushErr, WcOpcode::RdmaWrite),
            (3, WcStatus::WrFlushErr, WcOpcode::Recv)
        ]
    );
    assert!(wq.shared.flush.load(Ordering::Acquire));
    assert_eq!(ring.poll(&mut wcs, true), 0);
    assert_eq!(ring.counters().software_flushed, 3);
}

#[test]
fn inline_payloads_aligned_or_gathered_land_byte_exact_after_the_header() {
    let s = space();
    let (mut wq, data) = queues(&s, false);
    let payload: Vec<u8> = (1..=40).collect();
    data.write(64, &payload).unwrap();
    let base = data.as_ptr() as u64;
    // One aligned SGE of 13 bytes (fast path), then two unaligned SGEs of 5 + 30.
    let one = [Sge::new(base + 64, 13, Lkey(0x500))];
    let two = [
        Sge::new(base + 65, 5, Lkey(0x500)),
        Sge::new(base + 70, 30, Lkey(0x500)),
    ];
    for (i, sges) in [&one[..], &two[..]].into_iter().enumerate() {
        let mut w = SendWr::send(i as u64, sges);
        w.flags = SendFlags::INLINE;
        let before = wq.sq_head();
        let (_, r) = wq.post_send(&[w], false);
        r.unwrap();
        let len: usize = sges.iter().map(|s| s.length as usize).sum();
        let seg = read(
            &wq.buf,
            sq_at(&wq, before as usize) + 16,
            (4 + len).div_ceil(16) * 16,
        );
        assert_eq!(seg[..4], (0x8000_0000u32 | len as u32).to_be_bytes());
        let start = (sges[0].addr - base) as usize - 64;
        assert_eq!(&seg[4..4 + len], &payload[start..start + len], "case {i}");
        assert!(seg[4 + len..].iter().all(|&b| b == 0), "padding zeroed");
        let ds = read(&wq.buf, sq_at(&wq, before as usize) + 7, 1)[0] & 0x3f;
        assert_eq!(ds as usize, 1 + (4 + len).div_ceil(16));
    }
}

/// One fast-path WRITE of `N` bytes and the same request through the
/// generic path, on two identical queues: equal ring bytes (the WQE's
/// `ds`), doorbell records, tracking and BlueFlame words.
fn fast_equals_generic<const N: usize>(
    a: &mut WorkQueues,
    b: &mut WorkQueues,
    data: &Arc<DmaBuffer>,
    bytes: &[u8; N],
    signaled: bool,
    wr_id: u64,
) {
    data.write(64, bytes).unwrap();
    let sge = [Sge::new(data.as_ptr() as u64 + 64, N as u32, Lkey(0x500))];
    let mut wr = SendWr::rdma_write(wr_id, &sge, 0x7000_0000 + wr_id, Rkey(0x4321));
    wr.flags = SendFlags::INLINE;
    if signaled {
        wr.flags |= SendFlags::SIGNALED;
    }
    let head = a.sq_head();
    assert_eq!(head, b.sq_head());
    let (ring, r) = a.post_send(&[wr], false);
    r.unwrap();
    let ring = ring.unwrap();
    assert!(ring.blueflame() && ring.wqebbs == 1);
    let fast = b
        .post_write_inline(wr_id, 0x7000_0000 + wr_id, 0x4321, bytes, signaled, false)
        .unwrap();
    let ds = crate::rdma::wq::inline_write_ds(N) as usize;
    let at = a.sq_word_base * 8 + (head as usize % SQ_BBS as usize) * 64;
    assert_eq!(
        read(&a.buf, at, ds * 16),
        read(&b.buf, at, ds * 16),
        "N = {N}"
    );
    // BlueFlame: the generic copy reads the ring back; the fast one sends
    // the words it built (zeros past ds).
    let generic_bf: Vec<u64> = (0..8).map(|i| a.sq_word(head, i)).collect();
    assert_eq!(fast[..ds * 2], generic_bf[..ds * 2]);
    assert!(fast[ds * 2..].iter().all(|&w| w == 0));
    assert_eq!(ring.ctrl, fast[0]);
    assert_eq!(
        read(&a.buf, a.dbrec_word * 8, 8),
        read(&b.buf, b.dbrec_word * 8, 8)
    );
    assert_eq!(a.sq_head(), b.sq_head());
    let (x, y) = (&a.shared, &b.shared);
    assert_eq!(
        x.sq.slot_at(head.into()).wr_id.load(Ordering::Relaxed),
        y.sq.slot_at(head.into()).wr_id.load(Ordering::Relaxed)
    );
    assert_eq!(
        x.sq.slot_at(head.into()).meta.load(Ordering::Relaxed),
        y.sq.slot_at(head.into()).meta.load(Ordering::Relaxed)
    );
    assert_eq!(
        x.sq.head.load(Ordering::Relaxed),
        y.sq.head.load(Ordering::Relaxed)
    );
    assert_eq!(a.sends(), b.sends());
}

#[test]
fn the_send_count_is_one_per_wqe_of_any_size_and_survives_a_reset() {
    let s = space();
    let (mut wq, data) = queues(&s, false);
    let d = b"8 bytes!";
    for i in 0..3 {
        wq.post_write_inline(i, 0, 1, d, false, false).unwrap();
    }
    // A 48-byte inline WRITE: 16 + 16 + 4 + 48 bytes, two WQEBBs, one send.
    let sge = [Sge::new(data.as_ptr() as u64, 48, Lkey(0x500))];
    let mut wr = SendWr::rdma_write(3, &sge, 0x40, Rkey(3));
    wr.flags = SendFlags::INLINE;
    let (_, r) = wq.post_send(&[wr], false);
    r.unwrap();
    assert_eq!((wq.sq_head(), wq.sends()), (5, 4));
    retire_all(&wq);
    wq.restart_sq();
    assert_eq!((wq.sq_head(), wq.shared.sq.outstanding()), (0, 0));
    assert_eq!(wq.sends(), 4, "the count carries over the restart");
    wq.post_write_inline(4, 0, 1, d, true, false).unwrap();
    assert_eq!((wq.sq_head(), wq.sends()), (1, 5));
}

#[test]
fn sq_blocks_pair_a_ring_only_with_tracking_of_its_size_and_commit_to_both_modulo() {
    let s = space();
    let (wq, _) = queues(&s, false);
    // A ring of half or twice the tracking's blocks: refused.
    let buf = s.alloc(4096).unwrap();
    for words in [SQ_BBS as usize * 4, SQ_BBS as usize * 16] {
        let (ring, _) = crate::rdma::wq::views(&buf, 0, words, 511).unwrap();
        assert!(SqBlocks::new(ring, &wq.shared).is_none(), "{words} words");
    }
    let (ring, _) = crate::rdma::wq::views(&buf, 0, SQ_BBS as usize * 8, 511).unwrap();
    let blocks = SqBlocks::new(ring, &wq.shared).expect("the same size");
    // Past the ring's end, beyond 32 bits: block and slot both modulo, the
    // slot's start the full 64-bit position.
    let head = (1u64 << 32) + u64::from(SQ_BBS) * 3 + 5;
    let words: [u64; 8] = std::array::from_fn(|i| 0x1111 * (i as u64 + 1));
    let meta = crate::rdma::track::sq_meta(1, 1);
    blocks.commit(
        head,
        &crate::rdma::ring::Wqebb::<crate::rdma::ring::Words>::from_words(words),
        77,
        meta,
    );
    let got: Vec<u64> = blocks
        .ring()
        .block(5)
        .iter()
        .map(|w| w.load(Ordering::Relaxed))
        .collect();
    assert_eq!(got, words);
    let slot = wq.shared.sq.slot_at(5);
    assert_eq!(
        (
            slot.wr_id.load(Ordering::Relaxed),
            slot.start.load(Ordering::Relaxed),
            slot.meta.load(Ordering::Relaxed)
        ),
        (77, head, meta)
    );
    // Its neighbours untouched (their initial starts, one lap before 0:
    // `SqTrack::new`).
    for i in [4u64, 6] {
        assert_eq!(
            wq.shared.sq.slot_at(i).start.load(Ordering::Relaxed),
            i.wrapping_sub(SQ_BBS.into())
        );
        assert_eq!(wq.shared.sq.slot_at(i).wr_id.load(Ordering::Relaxed), 0);
    }
}

/// Retire everything outstanding on `q`'s send queue (as a CQE would).
fn retire_all(q: &WorkQueues) {
    let h = q.shared.sq.head.load(Ordering::Relaxed);
    q.shared.sq.tail().store(h, Ordering::Release);
}

/// [`retire_all`] on both queues.
fn drain(a: &WorkQueues, b: &WorkQueues) {
    retire_all(a);
    retire_all(b);
}

#[test]
fn the_fast_inline_write_writes_the_bytes_the_generic_path_writes() {
    let s = space();
    let (mut a, data) = queues(&s, false);
    let (mut b, _) = queues(&s, false);
    // Three passes over the 8-WQEBB ring (the 16-bit index and the ring wrap).
    for round in 0..3u64 {
        for (i, signaled) in [false, true].into_iter().enumerate() {
            let id = round * 100 + i as u64 * 10;
            fast_equals_generic(&mut a, &mut b, &data, b"", signaled, id);
            fast_equals_generic(&mut a, &mut b, &data, b"1", signaled, id + 1);
            fast_equals_generic(&mut a, &mut b, &data, b"8 bytes!", signaled, id + 2);
            fast_equals_generic(&mut a, &mut b, &data, b"twelve bytes", signaled, id + 3);
            fast_equals_generic(&mut a, &mut b, &data, b"thirteen byte", signaled, id + 4);
            fast_equals_generic(
                &mut a,
                &mut b,
                &data,
                b"twenty-eight bytes, inline!!",
                signaled,
                id + 5,
            );
            drain(&a, &b);
        }
    }
    // Signal-all QPs set the completion mode without the flag.
    a.sig_all = true;
    b.sig_all = true;
    fast_equals_generic(&mut a, &mut b, &data, b"8 bytes!", false, 999);
    assert_eq!(crate::rdma::wq::FAST_INLINE_MAX, 28);
}

#[test]
fn the_fast_inline_write_refuses_what_the_generic_path_refuses_without_writing() {
    let s = space();
    let (mut wq, _) = queues(&s, false);
    let before = read(&wq.buf, 0, wq.dbrec_word * 8 + 8);
    let d = b"8 bytes!";
    assert_eq!(
        wq.post_write_inline(1, 0, 1, d, true, true),
        Err(Refused::DeviceFatal)
    );
    wq.shared.set_flush();
    assert_eq!(
        wq.post_write_inline(1, 0, 1, d, true, false),
        Err(Refused::DeviceFatal)
    );
    // A state change after the flush keeps the fast path's gate closed.
    wq.set_state(QpState::Rts);
    assert_eq!(wq.shared.gate.load(Ordering::Relaxed), 0);
    assert_eq!(
        wq.post_write_inline(1, 0, 1, d, true, false),
        Err(Refused::DeviceFatal)
    );
    // (Unflushed again only for the test: the gate reopens with the state.)
    wq.shared.flush.store(false, Ordering::Relaxed);
    wq.set_state(wq.state);
    wq.set_state(QpState::Rtr);
    assert!(matches!(
        wq.post_write_inline(1, 0, 1, d, true, false),
        Err(Refused::BadState { .. })
    ));
    wq.set_state(QpState::Rts);
    wq.set_limits(SendLimits {
        max_inline: 4,
        ..wq.limits
    });
    assert_eq!(
        wq.post_write_inline(1, 0, 1, d, true, false),
        Err(Refused::InlineTooLong { got: 8, max: 4 })
    );
    wq.set_limits(SendLimits {
        max_inline: 64,
        ..wq.limits
    });
    wq.set_limits(SendLimits {
        ud: true,
        ..wq.limits
    });
    assert!(matches!(
        wq.post_write_inline(1, 0, 1, d, true, false),
        Err(Refused::WriteOnUd)
    ));
    wq.set_limits(SendLimits {
        ud: false,
        ..wq.limits
    });
    assert_eq!(
        read(&wq.buf, 0, wq.dbrec_word * 8 + 8),
        before,
        "nothing written"
    );
    assert_eq!((wq.sq_head(), wq.sends()), (0, 0));
    for i in 0..SQ_BBS {
        wq.post_write_inline(u64::from(i), 0, 1, d, false, false)
            .unwrap();
    }
    assert_eq!(
        wq.post_write_inline(9, 0, 1, d, true, false),
        Err(Refused::QueueFull {
            outstanding: SQ_BBS
        })
    );
    assert_eq!(wq.counters.queue_full, 1);
    assert_eq!(wq.sq_head(), SQ_BBS);
}

/// The same CQE, pushed to two fake CQs.
fn push2(a: &mut FakeCq, b: &mut FakeCq, fill: impl Fn(&mut [u8; 64])) {
    a.push(&fill);
    b.push(&fill);
}

#[test]
fn poll_send_returns_what_poll_returns_across_wraps_errors_and_hostile_cqes() {
    let s = space();
    let (mut qa, data) = queues(&s, false);
    let (mut qb, _) = queues(&s, false);
    let (mut ra, mut da) = cq(&s, 1); // 2 CQEs: the owner parity flips every 2
    let (mut rb, mut db) = cq(&s, 1);
    ra.attach(qa.shared.clone(), true, true);
    rb.attach(qb.shared.clone(), true, true);
    let sge = [Sge::new(data.as_ptr() as u64, 8, Lkey(0x500))];
    let mut wcs = [WorkCompletion::default(); 1];
    assert_eq!(rb.poll_send(), None, "0xF0 CQEs are invalid");
    for round in 0..6u64 {
        let mut wrs = [
            SendWr::send(round * 10, &sge),
            SendWr::rdma_read(round * 10 + 1, &sge, 0x40, Rkey(3)),
        ];
        wrs[1].flags = SendFlags::SIGNALED;
        for q in [&mut qa, &mut qb] {
            let (_, r) = q.post_send(&wrs, false);
            r.unwrap();
        }
        let last = qa.sq_head().wrapping_sub(1) as u16;
        if round % 3 == 1 {
            // Hostile first (unknown QPN, a WQEBB no WQE starts at), then an error CQE.
            push2(&mut da, &mut db, req(0x77, last, 0));
            push2(&mut da, &mut db, |c| {
                let mut v = ErrCqe::new_checked(&mut c[..]).unwrap();
                v.set_qpn(QPN).unwrap();
                v.set_wqe_counter(last.into()).unwrap();
                v.set_syndrome(CqeSyndrome::RemoteAccess.as_raw().into())
                    .unwrap();
                v.set_vendor_err_synd(0x42).unwrap();
                v.set_opcode(CqeOpcode::ReqErr.as_raw().into()).unwrap();
            });
        } else {
            push2(&mut da, &mut db, req_op(WqeOpcode::RdmaRead, QPN, last, 8));
        }
        assert_eq!(ra.poll(&mut wcs, false), 1, "round {round}");
        let c = rb.poll_send().expect("a completion");
        assert_eq!(WorkCompletion::from(c), wcs[0], "round {round}");
        assert_eq!(ra.counters(), rb.counters());
        assert_eq!(ra.record(), rb.record());
        assert_eq!(rb.poll_send(), None, "the stale CQE of the last pass");
    }
    assert_eq!(rb.counters().unknown_qpn, 2);
    assert_eq!(qb.shared.sq.outstanding(), 0);
    // A responder CQE stops poll_send unconsumed; poll takes it.
    qb.post_recv(&[RecvWr::new(77, &sge)], false).unwrap();
    db.push(|c| {
        let mut v = Cqe64::new_checked(&mut c[..]).unwrap();
        v.set_qpn(QPN).unwrap();
        v.set_byte_cnt(8).unwrap();
        v.set_opcode(CqeOpcode::RespSend.as_raw().into()).unwrap();
    });
    let cqes = rb.counters().cqes;
    assert_eq!(rb.poll_send(), None);
    assert_eq!(rb.counters().cqes, cqes);
    assert_eq!(rb.poll(&mut wcs, false), 1);
    assert_eq!((wcs[0].wr_id, wcs[0].opcode), (77, WcOpcode::Recv));
}

#[test]
fn a_fatal_device_flushes_sends_one_at_a_time_for_poll_send() {
    let s = space();
    let (mut wq, data) = queues(&s, false);
    let (mut ring, _dev) = cq(&s, 3);
    ring.attach(wq.shared.clone(), true, true);
    let sge = [Sge::new(data.as_ptr() as u64, 8, Lkey(0x500))];
    let (_, r) = wq.post_send(
        &[
            SendWr::send(1, &sge),
            SendWr::rdma_write(2, &sge, 0, Rkey(1)),
        ],
        false,
    );
    r.unwrap();
    let got: Vec<(u64, WcStatus, WcOpcode)> = std::iter::from_fn(|| ring.flush_send())
        .map(|c| (c.wr_id(), c.status(), c.opcode()))
        .collect();
    assert_eq!(
        got,
        vec![
            (1, WcStatus::WrFlushErr, WcOpcode::Send),
            (2, WcStatus::WrFlushErr, WcOpcode::RdmaWrite)
        ]
    );
    assert!(wq.shared.flush.load(Ordering::Acquire));
    assert_eq!(ring.counters().software_flushed, 2);
}

/// `post_send`'s single-WRITE shortcut against the general writer, for
/// every inline length it takes (1..=28), signaled or not, across a wrap
/// of the SQ: the same WQE bytes (to its `ds`), doorbell record, tracking,
/// doorbell request and counters.
#[test]
fn the_single_write_shortcut_writes_what_the_general_writer_writes() {
    let s = space();
    let (mut a, data) = queues(&s, false);
    let (mut b, _) = queues(&s, false);
    b.regions = a
        .regions
        .iter()
        .map(|r| Region {
            bytes: r.bytes.clone(),
            ..*r
        })
        .collect();
    let payload: Vec<u8> = (0x41..0x41 + 40).collect();
    data.write(64, &payload).unwrap();
    let base = data.as_ptr() as u64 + 64;
    for (n, len) in (1..=crate::rdma::wq::FAST_INLINE_MAX as u32).enumerate() {
        let sge = [Sge::new(base, len, Lkey(0x500))];
        let mut wr = SendWr::rdma_write(n as u64, &sge, 0x7000_0000 + n as u64, Rkey(0x99));
        wr.flags = SendFlags::INLINE;
        if n % 2 == 0 {
            wr.flags |= SendFlags::SIGNALED;
        }
        let head = a.sq_head();
        let (ra, r) = a.post_send(&[wr], false);
        r.unwrap();
        let (rb, r) = b.post_send_general(&[wr], false);
        r.unwrap();
        assert_eq!(ra, rb, "len {len}");
        let ds = crate::rdma::wq::inline_write_ds(len as usize) as usize;
        let at = a.sq_word_base * 8 + (head as usize % SQ_BBS as usize) * 64;
        assert_eq!(
            read(&a.buf, at, ds * 16),
            read(&b.buf, at, ds * 16),
            "len {len}"
        );
        assert_eq!(
            read(&a.buf, a.dbrec_word * 8, 8),
            read(&b.buf, b.dbrec_word * 8, 8)
        );
        let (x, y) = (
            a.shared.sq.slot_at(head.into()),
            b.shared.sq.slot_at(head.into()),
        );
        assert_eq!(
            (
                x.wr_id.load(Ordering::Relaxed),
                x.meta.load(Ordering::Relaxed)
            ),
            (
                y.wr_id.load(Ordering::Relaxed),
                y.meta.load(Ordering::Relaxed)
            )
        );
        assert_eq!(a.sq_head(), b.sq_head());
        assert_eq!(a.sends(), b.sends());
        for q in [&a, &b] {
            q.shared.sq.complete(head as u16).unwrap();
        }
    }
    assert!(a.sq_head() > SQ_BBS, "the SQ wrapped");
}

/// Requests the single-WRITE shortcut does not take go to the general
/// writer, which makes the refusal: nothing written by the shortcut.
#[test]
fn the_single_write_shortcut_leaves_refusals_to_the_general_writer() {
    let s = space();
    let (mut wq, data) = queues(&s, false);
    let base = data.as_ptr() as u64;
    let sge = [Sge::new(base, 8, Lkey(0x500))];
    let mut wr = SendWr::rdma_write(1, &sge, 0x1000, Rkey(1));
    wr.flags = SendFlags::INLINE;
    // Not in RTS: BadState, no WQE, no record.
    wq.set_state(QpState::Rtr);
    let (ring, r) = wq.post_send(&[wr], false);
    assert!(ring.is_none());
    assert!(matches!(
        r,
        Err(Mlx5Error::PostSend {
            reason: PostFailure::BadState { .. },
            ..
        })
    ));
    wq.set_state(QpState::Rts);
    // Fatal: DeviceFatal.
    let (ring, r) = wq.post_send(&[wr], true);
    assert!(ring.is_none());
    assert!(matches!(
        r,
        Err(Mlx5Error::PostSend {
            reason: PostFailure::DeviceFatal,
            ..
        })
    ));
    // Over the inline limit (a QP of 8 inline bytes): InlineTooLong.
    wq.set_limits(SendLimits {
        max_inline: 4,
        ..wq.limits
    });
    let (ring, r) = wq.post_send(&[wr], false);
    assert!(ring.is_none());
    assert!(matches!(
        r,
        Err(Mlx5Error::PostSend {
            reason: PostFailure::InlineTooLong { got: 8, max: 4 },
            ..
        })
    ));
    wq.set_limits(SendLimits {
        max_inline: 64,
        ..wq.limits
    });
    assert!(read(&wq.buf, sq_at(&wq, 0), 64).iter().all(|&b| b == 0));
    // A key no region has: the general writer's InlineRegion.
    let bad = [Sge::new(base, 8, Lkey(0x777))];
    let mut w2 = SendWr::rdma_write(2, &bad, 0x1000, Rkey(1));
    w2.flags = SendFlags::INLINE;
    let (ring, r) = wq.post_send(&[w2], false);
    assert!(ring.is_none());
    assert!(matches!(
        r,
        Err(Mlx5Error::PostSend {
            reason: PostFailure::InlineRegion { lkey: 0x777, .. },
            ..
        })
    ));
    assert_eq!(wq.sq_head(), 0);
    assert_eq!(wq.shared.sq.outstanding(), 0);
    // (The general writer stops in the unpublished slot: head, record and
    // tracking are untouched.)
    assert_eq!(read(&wq.buf, wq.dbrec_word * 8, 8), [0; 8]);
    // Full: the general writer counts and refuses.
    for i in 0..SQ_BBS {
        let (_, r) = wq.post_send(
            &[SendWr {
                wr_id: u64::from(i),
                ..wr
            }],
            false,
        );
        r.unwrap();
    }
    let (ring, r) = wq.post_send(&[wr], false);
    assert!(ring.is_none());
    assert!(matches!(
        r,
        Err(Mlx5Error::PostSend {
            reason: PostFailure::QueueFull { outstanding: 8 },
            ..
        })
    ));
    assert_eq!(wq.counters.queue_full, 1);
}

/// `post_small_write` (the generic `Qp::post_send`'s first shortcut) and
/// the general writer on two identical queues, for every length it takes
/// and across ring wraps: equal ring bytes, doorbell records and tracking,
/// and the words it returns for the BlueFlame copy equal its ring slot.
#[test]
fn the_small_write_shortcut_writes_the_bytes_the_general_writer_writes() {
    let s = space();
    let (mut a, data) = queues(&s, false);
    let (mut b, _) = queues(&s, false);
    // Both read the payload from `a`'s region.
    b.regions = vec![Region {
        lkey: 0x500,
        start: data.as_ptr() as u64,
        len: 4096,
        bytes: RegionBytes::Buffer(data.clone()),
    }];
    data.write(64, b"ABCDEFGH").unwrap();
    let mut missed = 0;
    for round in 0..3u64 {
        for len in 1..=8u32 {
            for signaled in [false, true] {
                let sge = [Sge::new(data.as_ptr() as u64 + 64, len, Lkey(0x500))];
                let id = round * 1000 + u64::from(len) * 10 + u64::from(signaled);
                let mut wr = SendWr::rdma_write(id, &sge, 0x7000_0000 + id, Rkey(0x4321));
                wr.flags = SendFlags::INLINE;
                if signaled {
                    wr.flags |= SendFlags::SIGNALED;
                }
                let head = a.sq_head();
                assert_eq!(head, b.sq_head());
                let fast = match a.post_small_write(&wr) {
                    Some(w) => w,
                    None => {
                        // The first post learns the region and goes the
                        // longer way; nothing was written.
                        missed += 1;
                        assert_eq!(a.sq_head(), head);
                        a.post_small_write(&wr).expect("the region is kept")
                    }
                };
                let (ring, r) = b.post_send_general(&[wr], false);
                r.unwrap();
                assert_eq!(ring.unwrap().wqebbs, 1);
                assert_eq!((a.sq_head(), b.sq_head()), (head + 1, head + 1));
                let at = sq_at(&a, (head % SQ_BBS) as usize);
                let ds = crate::rdma::wq::inline_write_ds(len as usize) as usize;
                assert_eq!(
                    read(&a.buf, at, ds * 16),
                    read(&b.buf, at, ds * 16),
                    "len {len}"
                );
                let words = fast.words();
                let slot: Vec<u64> = (0..8).map(|i| a.sq_word(head, i)).collect();
                assert_eq!(words[..], slot[..], "BlueFlame words = ring slot");
                assert!(words[ds * 2..].iter().all(|&w| w == 0));
                assert_eq!(
                    read(&a.buf, a.dbrec_word * 8, 8),
                    read(&b.buf, b.dbrec_word * 8, 8)
                );
                assert_eq!(
                    a.shared.sq.head.load(Ordering::Relaxed),
                    b.shared.sq.head.load(Ordering::Relaxed)
                );
                assert_eq!(
                    a.shared.sq.complete(head as u16),
                    b.shared.sq.complete(head as u16)
                );
                drain(&a, &b);
            }
        }
    }
    assert_eq!(missed, 1);
    assert_eq!(a.sends(), b.sends());
}

/// Every request the small-write shortcut does not take leaves the queue
/// as it was (the caller then goes the general way, which refuses or
/// posts it).
#[test]
fn the_small_write_shortcut_declines_without_writing() {
    let s = space();
    let (mut wq, data) = queues(&s, false);
    let base = data.as_ptr() as u64;
    let ok = [Sge::new(base, 8, Lkey(0x500))];
    let mut wr = SendWr::rdma_write(1, &ok, 0x1000, Rkey(1));
    wr.flags = SendFlags::INLINE;
    // Learn the region once (declines, writes nothing), then the checks.
    assert!(wq.post_small_write(&wr).is_none());
    let before = read(&wq.buf, 0, wq.dbrec_word * 8 + 8);
    let unaligned = [Sge::new(base + 4, 4, Lkey(0x500))];
    let nine = [Sge::new(base, 9, Lkey(0x500))];
    let foreign = [Sge::new(base, 8, Lkey(0x777))];
    let outside = [Sge::new(base + 4096, 8, Lkey(0x500))];
    let two = [ok[0], ok[0]];
    for sges in [&unaligned[..], &nine, &foreign, &outside, &two, &[]] {
        let mut w = SendWr::rdma_write(2, sges, 0x1000, Rkey(1));
        w.flags = SendFlags::INLINE;
        assert!(wq.post_small_write(&w).is_none(), "{sges:?}");
    }
    let mut fenced = wr;
    fenced.flags |= SendFlags::FENCE;
    let mut not_inline = wr;
    not_inline.flags = SendFlags::SIGNALED;
    let send = {
        let mut w = SendWr::send(3, &ok);
        w.flags = SendFlags::INLINE;
        w
    };
    for w in [fenced, not_inline, send] {
        assert!(wq.post_small_write(&w).is_none());
    }
    wq.shared.set_flush();
    assert!(wq.post_small_write(&wr).is_none());
    // (Unflushed again only for the test: the gate reopens with the state.)
    wq.shared.flush.store(false, Ordering::Relaxed);
    wq.set_state(wq.state);
    wq.set_state(QpState::Rtr);
    assert!(wq.post_small_write(&wr).is_none());
    wq.set_state(QpState::Rts);
    assert_eq!(
        read(&wq.buf, 0, wq.dbrec_word * 8 + 8),
        before,
        "nothing written"
    );
    assert_eq!((wq.sq_head(), wq.sends()), (0, 0));
    // Full: SQ_BBS posts, then a decline until the consumer moves.
    for _ in 0..SQ_BBS {
        assert!(wq.post_small_write(&wr).is_some());
    }
    assert!(wq.post_small_write(&wr).is_none());
    assert_eq!(wq.sq_head(), SQ_BBS);
    wq.shared.sq.tail().store(1, Ordering::Release);
    assert!(wq.post_small_write(&wr).is_some());
    assert!(wq.post_small_write(&wr).is_none());
    assert_eq!(wq.sq_head(), SQ_BBS + 1);
}

/// The cached SQ limit follows the general writer's multi-WQEBB posts:
/// mixing 2-WQEBB general posts with 1-WQEBB fast ones never puts more
/// than the ring's WQEBBs outstanding, and the fast path reports the full
/// queue exactly when it is full.
#[test]
fn the_cached_sq_limit_follows_the_general_writer() {
    let s = space();
    let (mut wq, data) = queues(&s, false);
    let long = [Sge::new(data.as_ptr() as u64, 40, Lkey(0x500))];
    let mut big = SendWr::rdma_write(1, &long, 0x1000, Rkey(1));
    big.flags = SendFlags::INLINE; // 16 + 16 + 4 + 40 bytes: 2 WQEBBs
    for round in 0..4u32 {
        let start = wq.sq_head();
        // One fast post (the limit is learnt), then general 2-WQEBB posts
        // until the general writer refuses, then fast posts to the brim.
        wq.post_write_inline(1, 0x1000, 1, b"8 bytes!", true, false)
            .unwrap();
        loop {
            let (_, r) = wq.post_send_general(&[big], false);
            if r.is_err() {
                break;
            }
        }
        while wq
            .post_write_inline(2, 0x1000, 1, b"8 bytes!", true, false)
            .is_ok()
        {}
        assert_eq!(wq.sq_head().wrapping_sub(start), SQ_BBS, "round {round}");
        assert_eq!(
            wq.post_write_inline(3, 0x1000, 1, b"8 bytes!", true, false),
            Err(Refused::QueueFull {
                outstanding: SQ_BBS
            })
        );
        // The consumer catches up.
        retire_all(&wq);
    }
}

/// The small-write shortcut reads one whole word of the cached region:
/// at an 8-aligned offset from the region's start (whatever the start's
/// own alignment), all 8 bytes inside it. It takes such an SGE with the
/// general writer's bytes, and declines (nothing written) an offset that
/// is not 8-aligned, a word reaching past the region's end, an address
/// below its start, and any address of a region that wraps the address
/// space (never cached).
#[test]
fn the_small_write_shortcut_reads_whole_words_of_the_region_only() {
    let s = space();
    let (mut a, data) = queues(&s, false);
    let (mut b, _) = queues(&s, false);
    let pattern: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
    data.write(0, &pattern).unwrap();
    // An IOVA that is not 8-aligned for byte 0, and a length that is not a
    // whole number of words.
    let start = 0x1_0003u64;
    let region = |start| Region {
        lkey: 0x600,
        start,
        len: 4093,
        bytes: RegionBytes::Buffer(data.clone()),
    };
    a.regions = vec![region(start)];
    b.regions = vec![region(start)];
    let post = |wq: &mut WorkQueues, addr: u64, len: u32| {
        let sge = [Sge::new(addr, len, Lkey(0x600))];
        let mut wr = SendWr::rdma_write(9, &sge, 0x7000_0000, Rkey(0x4321));
        wr.flags = SendFlags::INLINE | SendFlags::SIGNALED;
        wq.post_small_write(&wr)
    };
    // The first post learns the region and declines.
    assert!(post(&mut a, start + 16, 8).is_none());
    let before = read(&a.buf, 0, a.dbrec_word * 8 + 8);
    for (addr, len) in [
        (start + 4, 4),
        (start + 4088, 5),
        (start + 4088, 1),
        (start - 8, 8),
        (start.wrapping_sub(1 << 62), 8),
    ] {
        assert!(post(&mut a, addr, len).is_none(), "{addr:#x} {len}");
    }
    assert_eq!(
        read(&a.buf, 0, a.dbrec_word * 8 + 8),
        before,
        "nothing written"
    );
    assert_eq!(a.sq_head(), 0);
    for (addr, len) in [
        (start + 16, 8),
        (start + 4080, 8),
        (start, 3),
        (start + 8, 1),
    ] {
        let head = a.sq_head();
        assert!(post(&mut a, addr, len).is_some(), "{addr:#x} {len}");
        let sge = [Sge::new(addr, len, Lkey(0x600))];
        let mut wr = SendWr::rdma_write(9, &sge, 0x7000_0000, Rkey(0x4321));
        wr.flags = SendFlags::INLINE | SendFlags::SIGNALED;
        let (ring, r) = b.post_send_general(&[wr], false);
        r.unwrap();
        assert!(ring.is_some());
        let at = sq_at(&a, (head % SQ_BBS) as usize);
        let ds = crate::rdma::wq::inline_write_ds(len as usize) as usize;
        assert_eq!(read(&a.buf, at, ds * 16), read(&b.buf, at, ds * 16));
        let off = (addr - start) as usize;
        assert_eq!(
            read(&a.buf, at + 36, len as usize),
            pattern[off..off + len as usize],
            "the payload is the region's bytes at the SGE"
        );
        drain(&a, &b);
    }
    // A region that wraps the address space is never cached.
    let (mut c, _) = queues(&s, false);
    c.regions = vec![region(u64::MAX - 100)];
    assert!(post(&mut c, u64::MAX - 100, 8).is_none());
    assert!(
        post(&mut c, u64::MAX - 100, 8).is_none(),
        "still not cached"
    );
    assert_eq!(c.sq_head(), 0);
}

/// The small-write shortcut's second control word (`write_ctrl1` plus the
/// request's `SIGNALED`) on a QP that signals every send and on one that
/// does not: the general writer's CE bits for signaled and unsignaled
/// requests alike.
#[test]
fn the_small_write_shortcut_sets_ce_as_the_general_writer_with_or_without_sig_all() {
    let s = space();
    for sig_all in [false, true] {
        let (mut a, data) = queues(&s, false);
        let (mut b, _) = queues(&s, false);
        for wq in [&mut a, &mut b] {
            wq.sig_all = sig_all;
            wq.set_state(QpState::Rts);
            wq.regions = vec![Region {
                lkey: 0x500,
                start: data.as_ptr() as u64,
                len: 4096,
                bytes: RegionBytes::Buffer(data.clone()),
            }];
        }
        let sge = [Sge::new(data.as_ptr() as u64, 8, Lkey(0x500))];
        let mut learn = SendWr::rdma_write(0, &sge, 0x1000, Rkey(1));
        learn.flags = SendFlags::INLINE;
        assert!(a.post_small_write(&learn).is_none(), "learns the region");
        for (id, flags) in [
            (1, SendFlags::INLINE),
            (2, SendFlags::INLINE | SendFlags::SIGNALED),
        ] {
            let mut wr = SendWr::rdma_write(id, &sge, 0x1000, Rkey(1));
            wr.flags = flags;
            let head = a.sq_head();
            let fast = a.post_small_write(&wr).expect("shortcut");
            b.post_send_general(&[wr], false).1.unwrap();
            let at = sq_at(&a, (head % SQ_BBS) as usize);
            assert_eq!(
                read(&a.buf, at, 48),
                read(&b.buf, at, 48),
                "{sig_all} {flags:?}"
            );
            let ce = read(&a.buf, at + 11, 1)[0] & 0x0c;
            let want = if sig_all || flags.contains(SendFlags::SIGNALED) {
                0x08
            } else {
                0
            };
            assert_eq!(ce, want, "CE of {sig_all} {flags:?}");
            assert_eq!(fast.words()[1], a.sq_word(head, 1));
        }
    }
}
