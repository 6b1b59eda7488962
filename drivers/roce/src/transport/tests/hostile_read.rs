//! A lying responder against an outstanding RDMA READ (issue 15, bug 1).
//!
//! Found by adversarial traffic: a PSN-sequence NAK or an RNR NAK whose PSN
//! lay *inside* a READ's response range moved the completer past response
//! packets that never arrived; the requester asked again for the tail only,
//! the tail arrived, and the READ completed `SUCCESS` with a hole. A READ's
//! PSNs are retired only by its own response data, in order (kernel rxe,
//! rxe_comp.c `check_psn`: a response beyond `comp.psn` while a READ or an
//! atomic is at the head is a retry from `comp.psn`).

use proptest::prelude::*;
use rnic_core::{Mtu, Rkey, SendFlags, SendOp, SendWr, WcStatus};

use super::*;
use crate::transport::pkt::{op, syndrome};
use crate::transport::sim::Endpoint;
use crate::transport::{Instant, QpStats};

const MTU: usize = 1024;
const LOCAL_VA: u64 = 0x1_0000;
const REMOTE_VA: u64 = 0x8_0000;
const SQ_PSN: u32 = 7;
/// What the local buffer holds before the READ: never a byte of `truth`.
const CANARY: u8 = 0xAA;

/// The remote bytes a READ of `len` at `REMOTE_VA` returns: no byte equals
/// [`CANARY`], so a byte left unwritten is always seen.
fn truth(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            let b = (i % 251) as u8;
            if b == CANARY { 0x55 } else { b }
        })
        .collect()
}

/// Requester A with the READs `lens` posted (one after another, each into
/// its own stretch of one local region filled with [`CANARY`]) and sent.
/// Returns the endpoint, the region's key and each READ's local offset.
fn requester(lens: &[usize], retry_cnt: u8) -> (Endpoint, u32, Vec<usize>) {
    let mut cfg = QpConfig::rc(Qpn::from_wire(QPN_A), PD);
    cfg.local_gid = gid(1);
    let mut ep = Endpoint::new(Qp::new(cfg).expect("RC QP"), gid(1));
    let c = Conn {
        mtu: Mtu::Mtu1024,
        timeout: 8,
        retry_cnt,
        rnr_retry: retry_cnt,
        ..Conn::default()
    };
    connect(&mut ep, QPN_B, gid(2), SQ_PSN, 1000, &c);
    let total: usize = lens.iter().sum::<usize>().max(1);
    let key = ep
        .mem
        .register(PD, LOCAL_VA, total, AccessFlags::LOCAL_WRITE);
    ep.mem.bytes_mut(key).fill(CANARY);
    let mut offs = Vec::new();
    let mut at = 0;
    for (i, &len) in lens.iter().enumerate() {
        let sgl = [sge(key, LOCAL_VA + at as u64, len as u32)];
        let wr = SendWr {
            ud: None,
            wr_id: i as u64 + 1,
            sg_list: if len == 0 { &[] } else { &sgl },
            op: SendOp::RdmaRead {
                remote_addr: REMOTE_VA + at as u64,
                rkey: Rkey(0x1234),
            },
            flags: SendFlags::SIGNALED,
        };
        ep.with(|qp, io| qp.post_send(&wr, io).expect("post"));
        offs.push(at);
        at += len;
    }
    ep.with(|qp, io| qp.run(Instant::from_nanos(0), io));
    (ep, key, offs)
}

fn feed(ep: &mut Endpoint, now: Instant, p: &[u8]) {
    ep.with(|qp, io| qp.receive(now, p, gid(2), io));
}

/// Feed READ response data `opcode` at `psn` (AETH "ACK").
fn answer(ep: &mut Endpoint, now: Instant, opcode: u8, psn: u32, payload: &[u8]) {
    feed(
        ep,
        now,
        &response(opcode, psn, syndrome::ACK_UNLIMITED, payload),
    );
}

/// The reproducer, for the PSN-sequence NAK (0x60) and the RNR NAK
/// (0x21): 2048-byte READ at MTU 1024, a NAK naming P+1, an honest
/// READ_RESPONSE_ONLY at P+1. The READ must not complete; the requester asks
/// again from P for the whole READ; honest FIRST + LAST then complete it
/// with every byte written.
fn nak_inside_a_read(syn: u8) {
    let (mut ep, key, _) = requester(&[2 * MTU], 7);
    let data = truth(2 * MTU);
    let p = SQ_PSN;
    assert_eq!(
        requests(&mut ep),
        vec![(op::READ_REQUEST, p, REMOTE_VA, 2 * MTU as u32)]
    );
    let now = Instant::from_nanos(1_000);
    feed(&mut ep, now, &response(op::ACK, p + 1, syn, &[]));
    // Asked again from the first missing PSN, P: the whole READ.
    let again = requests(&mut ep);
    let now = if again.is_empty() {
        // An RNR wait: the retry goes out when it ends.
        let t = ep.qp.next_deadline().expect("RNR wait armed");
        ep.with(|qp, io| qp.on_timer(t, io));
        t
    } else {
        now
    };
    let again = if again.is_empty() {
        requests(&mut ep)
    } else {
        again
    };
    assert_eq!(
        again,
        vec![(op::READ_REQUEST, p, REMOTE_VA, 2 * MTU as u32)],
        "syndrome {syn:#x}: the retry starts at the READ's first PSN"
    );
    // The liar's tail: data for P+1 while P is missing.
    answer(&mut ep, now, op::READ_RESP_ONLY, p + 1, &data[MTU..]);
    assert!(ep.cq.send.is_empty(), "syndrome {syn:#x}: {:?}", ep.cq.send);
    assert!(ep.mem.bytes(key)[..MTU].iter().all(|&b| b == CANARY));
    // Honest answer to the retry.
    answer(&mut ep, now, op::READ_RESP_FIRST, p, &data[..MTU]);
    answer(&mut ep, now, op::READ_RESP_LAST, p + 1, &data[MTU..]);
    assert_eq!(ep.cq.send.len(), 1, "syndrome {syn:#x}");
    let wc = ep.cq.send[0];
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (1, WcStatus::Success, 2048)
    );
    assert!(ep.mem.bytes(key) == &data[..], "syndrome {syn:#x}: a hole");
    let s: QpStats = *ep.qp.stats();
    assert!(s.drops.bad_response_psn >= 2, "{s:?}");
}

#[test]
fn psn_sequence_nak_inside_a_read_does_not_skip_its_data() {
    nak_inside_a_read(syndrome::NAK_PSN_SEQ);
}

#[test]
fn rnr_nak_inside_a_read_does_not_skip_its_data() {
    nak_inside_a_read(syndrome::RNR | 1);
}

/// A NAK inside the range after part of the READ arrived: the retry starts
/// at the first missing PSN (not at the NAK's), with VA and length moved.
#[test]
fn nak_past_the_received_part_retries_from_the_first_missing_psn() {
    let (mut ep, key, _) = requester(&[4 * MTU], 7);
    let data = truth(4 * MTU);
    let p = SQ_PSN;
    requests(&mut ep);
    let now = Instant::from_nanos(1_000);
    answer(&mut ep, now, op::READ_RESP_FIRST, p, &data[..MTU]);
    feed(
        &mut ep,
        now,
        &response(op::ACK, p + 3, syndrome::NAK_PSN_SEQ, &[]),
    );
    assert_eq!(
        requests(&mut ep),
        vec![(
            op::READ_REQUEST,
            p + 1,
            REMOTE_VA + MTU as u64,
            3 * MTU as u32
        )]
    );
    // The liar answers the last PSN only: nothing completes.
    answer(&mut ep, now, op::READ_RESP_LAST, p + 3, &data[3 * MTU..]);
    assert!(ep.cq.send.is_empty());
    for (k, opcode) in [
        op::READ_RESP_MIDDLE,
        op::READ_RESP_MIDDLE,
        op::READ_RESP_LAST,
    ]
    .into_iter()
    .enumerate()
    {
        let i = k + 1;
        let chunk = &data[i * MTU..(i + 1) * MTU];
        answer(&mut ep, now, opcode, p + i as u32, chunk);
    }
    assert_eq!(ep.cq.send.len(), 1);
    assert_eq!(ep.cq.send[0].status, WcStatus::Success);
    assert!(ep.mem.bytes(key) == &data[..]);
}

/// One thing a hostile responder can do next.
#[derive(Clone, Debug)]
enum Move {
    /// READ response data at PSN `SQ_PSN + off` with the true bytes for
    /// that PSN (`kind`: 0 FIRST, 1 MIDDLE, 2 LAST, 3 ONLY) and a length
    /// that is honest (`cut` = 0) or short by `cut` bytes.
    Data { off: u32, kind: u8, cut: u16 },
    /// An ACK-opcode packet at PSN `SQ_PSN + off` with AETH syndrome `syn`.
    Aeth { off: u32, syn: u8 },
    /// Let time pass to the next deadline (ACK timeout or RNR wait).
    Timer,
}

fn a_move() -> impl Strategy<Value = Move> {
    let syn = prop_oneof![
        Just(syndrome::ACK_UNLIMITED),
        Just(syndrome::NAK_PSN_SEQ),
        Just(syndrome::RNR | 1),
        Just(syndrome::NAK_INVALID_REQ),
        any::<u8>(),
    ];
    prop_oneof![
        6 => (0u32..8, 0u8..4, prop_oneof![3 => Just(0u16), 1 => 1u16..1024])
            .prop_map(|(off, kind, cut)| Move::Data { off, kind, cut }),
        3 => (0u32..8, syn).prop_map(|(off, syn)| Move::Aeth { off, syn }),
        1 => Just(Move::Timer),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Under any sequence of responses, a READ that completes with success
    /// has every byte of its scatter list written by response data (the
    /// responses only ever carry the true bytes for their PSN), and nothing
    /// outside the READs' buffers changes.
    #[test]
    fn a_successful_read_is_fully_written(
        lens in proptest::collection::vec(prop_oneof![Just(0usize), 1usize..=3 * MTU], 1..=2),
        moves in proptest::collection::vec(a_move(), 1..60),
    ) {
        let (mut ep, key, offs) = requester(&lens, 3);
        let total: usize = lens.iter().sum();
        let data = truth(total.max(1));
        // PSN of each READ's first response and its packet count.
        let mut first = Vec::new();
        let mut psn = SQ_PSN;
        for &len in &lens {
            first.push(psn);
            psn += len.div_ceil(MTU).max(1) as u32;
        }
        let mut now = Instant::from_nanos(1_000);
        for m in &moves {
            match *m {
                Move::Data { off, kind, cut } => {
                    let at = SQ_PSN + off;
                    // The true bytes for this PSN: find its READ.
                    let Some(i) = first.iter().rposition(|&f| f <= at) else { continue };
                    let k = (at - first[i]) as usize;
                    let start = offs[i] + k * MTU;
                    let end = (offs[i] + lens[i]).min(start + MTU);
                    let chunk = data.get(start..end.max(start)).unwrap_or(&[]);
                    let n = chunk.len().saturating_sub(usize::from(cut));
                    let opcode = [
                        op::READ_RESP_FIRST,
                        op::READ_RESP_MIDDLE,
                        op::READ_RESP_LAST,
                        op::READ_RESP_ONLY,
                    ][usize::from(kind)];
                    feed(&mut ep, now, &response(opcode, at, syndrome::ACK_UNLIMITED, &chunk[..n]));
                }
                Move::Aeth { off, syn } => {
                    feed(&mut ep, now, &response(op::ACK, SQ_PSN + off, syn, &[]));
                }
                Move::Timer => {
                    if let Some(t) = ep.qp.next_deadline() {
                        now = t;
                        ep.with(|qp, io| qp.on_timer(t, io));
                    }
                }
            }
            requests(&mut ep);
        }
        let mem = ep.mem.bytes(key);
        for wc in &ep.cq.send {
            let i = (wc.wr_id - 1) as usize;
            if wc.status == WcStatus::Success {
                let r = offs[i]..offs[i] + lens[i];
                prop_assert!(
                    mem[r.clone()] == data[r.clone()],
                    "READ {} ({} B) completed SUCCESS with a hole: {:?}",
                    wc.wr_id, lens[i], wc
                );
                prop_assert_eq!(wc.byte_len as usize, lens[i]);
            }
        }
        // Bytes are only ever true data or the canary.
        for (j, &b) in mem.iter().enumerate().take(total) {
            prop_assert!(b == CANARY || b == data[j], "byte {} = {:#x}", j, b);
        }
    }
}
