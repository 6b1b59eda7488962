//! Replays the committed seed corpus and a deterministic batch of
//! pseudo-random inputs through every harness, and shows that the
//! harnesses' checks fire on the bugs they exist for.

use std::path::{Path, PathBuf};

use crate::mlx5::{cqe, firmware, wqe};
use crate::{engine, wire};

fn corpus(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target)
}

/// Every file of the target's seed corpus through `f`; returns how many.
fn replay(target: &str, f: fn(&[u8])) -> usize {
    let dir = corpus(target);
    let mut n = 0;
    let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for e in entries {
        let path = e.expect("corpus entry").path();
        let data = std::fs::read(&path).expect("corpus file");
        f(&data);
        n += 1;
    }
    n
}

/// A deterministic xorshift stream of `count` inputs up to `max` bytes.
fn random_inputs(seed: u64, count: usize, max: usize, f: fn(&[u8])) {
    let mut x = seed | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for _ in 0..count {
        let len = (next() as usize) % max;
        let data: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        f(&data);
    }
}

#[test]
fn wire_corpus_and_random_inputs() {
    assert!(
        replay("wire", wire::packet) >= 10,
        "the wire seed corpus is missing"
    );
    random_inputs(1, 3000, 200, wire::packet);
}

#[test]
fn l2_corpus_and_random_inputs() {
    assert!(replay("l2", crate::l2::frames) >= 5);
    random_inputs(8, 1500, 300, crate::l2::frames);
}

/// The L2 seeds reach what they were written for.
#[test]
fn the_l2_seeds_do_what_they_say() {
    use rnic_roce::neigh::State;
    let seeds = crate::l2::seeds();
    let get = |name: &str| &seeds.iter().find(|(n, _)| *n == name).expect(name).1;
    let end = crate::l2::run(get("arp-resolve"));
    assert_eq!(end.entries.len(), 1, "{end:?}");
    assert_eq!(end.entries[0].state, State::Reachable, "{end:?}");
    assert_eq!(
        (end.counters.resolved, end.counters.learned),
        (1, 1),
        "{end:?}"
    );
    let end = crate::l2::run(get("nd-resolve-stale-probe"));
    let c = end.counters;
    assert_eq!((c.resolved, c.probes_sent, c.failed), (1, 3, 1), "{end:?}");
    assert_eq!(end.entries[0].state, State::Failed, "{end:?}");
    let end = crate::l2::run(get("arp-flood"));
    let c = end.counters;
    assert_eq!((c.answered, c.ignored.rate_limited), (10, 30), "{end:?}");
    assert!(end.entries.is_empty());
    let end = crate::l2::run(get("ns-dad-damaged"));
    let c = end.counters;
    assert_eq!(
        (c.answered, c.malformed.nd_rule, c.frames_in),
        (2, 1, 3),
        "{end:?}"
    );
    let end = crate::l2::run(get("garbage"));
    assert_eq!(end.counters.dispositions(), end.counters.frames_in);
}

#[test]
fn responder_corpus_and_random_inputs() {
    assert!(replay("responder", engine::responder) >= 3);
    random_inputs(2, 600, 600, engine::responder);
}

/// The rxe receive path: the seeds (valid packets of every kind) and random
/// inputs; the valid seeds do what they say (bytes land where the keys let
/// them, receives complete).
#[test]
fn rxe_rx_corpus_and_random_inputs() {
    assert!(replay("rxe_rx", crate::rxe::rx) >= 15);
    random_inputs(4, 200, 800, crate::rxe::rx);
    crate::rxe::check_seed_effects();
}

#[test]
fn requester_corpus_and_random_inputs() {
    assert!(replay("requester", engine::requester) >= 3);
    random_inputs(3, 600, 600, engine::requester);
}

#[test]
fn mlx5_firmware_corpus_and_random_inputs() {
    assert!(replay("mlx5_firmware", firmware::command_queue) >= 3);
    random_inputs(4, 100, 400, firmware::command_queue);
    // Inputs that start with an honest bring-up (first byte odd).
    random_inputs(5, 40, 400, |d| {
        let mut v = d.to_vec();
        if let Some(b) = v.first_mut() {
            *b |= 1;
        }
        firmware::command_queue(&v);
    });
    // And with the objects prefix (UAR, PD, TD, EQ, CQ) the raw Ethernet commands name.
    random_inputs(7, 40, 400, |d| {
        let mut v = d.to_vec();
        if let Some(b) = v.first_mut() {
            *b |= 1 | 4 | 8;
        }
        firmware::command_queue(&v);
    });
}

#[test]
fn mlx5_wqe_corpus_and_random_inputs() {
    assert!(replay("mlx5_wqe", wqe::send_queue) >= 3);
    random_inputs(6, 12, 400, wqe::send_queue);
}

/// The inputs of `mlx5_wqe` share one rig per thread, reset between them: an input gives
/// the same QP state, counters, CQEs and memory (rings, MKey buffers, pattern) whether it
/// runs on a fresh rig, again at once, or after other inputs.
#[test]
fn mlx5_wqe_inputs_are_reproducible() {
    let mut inputs: Vec<Vec<u8>> = wqe::seeds().into_iter().map(|(_, d)| d).collect();
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..6 {
        let mut v = Vec::new();
        for _ in 0..(x % 300) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            v.push(x as u8);
        }
        inputs.push(v);
    }
    let first: Vec<wqe::End> = inputs.iter().map(|d| wqe::run(d)).collect();
    for (d, want) in inputs.iter().zip(&first).rev() {
        assert_eq!(&wqe::run(d), want, "run again, after the others");
    }
    assert!(
        first.iter().any(|e| e.state == 6) && first.iter().any(|e| e.stats.tx_packets > 0),
        "the inputs reach ERR and the wire"
    );
}

/// The firmware seeds reach what they were written for: resources allocated after an
/// honest bring-up, a GIVE and a TAKE of spare pages, transports refused with several
/// delivery statuses.
#[test]
fn the_mlx5_firmware_seeds_do_what_they_say() {
    let seeds = firmware::seeds();
    let get = |name: &str| &seeds.iter().find(|(n, _)| *n == name).expect(name).1;
    let end = firmware::run(get("up-and-objects"));
    let a = end.accounting;
    assert_eq!((a.uars, a.pds, a.tds, a.pages_held), (1, 0, 1, 48), "{a:?}");
    let st = &end.stats;
    assert_eq!(
        st.executed(rnic_mlx5_prm::CmdOpcode::ManagePages),
        2 + 2,
        "{st:?}"
    );
    assert_eq!(st.errors.values().sum::<u64>(), 0, "{st:?}");
    let end = firmware::run(get("broken-transports"));
    let st = &end.stats;
    assert!(st.delivery_errors.len() >= 5, "{st:?}");
    assert!(st.ignored_not_owned >= 1, "{st:?}");
}

/// The flow steering and raw Ethernet seeds: the honest flow program creates two tables, a
/// group and two entries (one forwarding to the other table) with no refusal; the hostile
/// one is refused exactly where the PRM says (bad parameter: size, type, range, criteria,
/// index, destination level, value outside the mask; bad resource: a root that does not
/// exist; bad resource state: a table in use), leaving the one valid table and group; the
/// raw program takes an RQ, a TIR and a rule forwarding to it past the objects prefix.
#[test]
fn the_mlx5_firmware_flow_seeds_do_what_they_say() {
    use rnic_mlx5_prm::{CmdOpcode, CmdStatus};
    let seeds = firmware::seeds();
    let get = |name: &str| &seeds.iter().find(|(n, _)| *n == name).expect(name).1;
    let end = firmware::run(get("flow-table-group-entry"));
    let (a, st) = (end.accounting, end.stats);
    assert_eq!(a.flow_objects, 2 + 1 + 2, "{a:?}");
    assert_eq!(st.errors.values().sum::<u64>(), 0, "{st:?}");
    assert_eq!(st.executed(CmdOpcode::SetFlowTableRoot), 1, "{st:?}");
    assert_eq!(st.executed(CmdOpcode::QueryFlowTableEntry), 1, "{st:?}");

    let end = firmware::run(get("hostile-flow-tables"));
    let (a, st) = (end.accounting, end.stats);
    assert_eq!(a.flow_objects, 2, "only the valid table and group: {a:?}");
    let errors = |s: CmdStatus| st.errors.get(&s.as_raw()).copied().unwrap_or(0);
    assert_eq!(errors(CmdStatus::BadParam), 7, "{st:?}");
    assert_eq!(errors(CmdStatus::BadRes), 1, "{st:?}");
    assert_eq!(errors(CmdStatus::BadResState), 1, "{st:?}");
    assert_eq!(st.executed(CmdOpcode::CreateFlowTable), 3, "{st:?}");

    let end = firmware::run(get("raw-rq-tir-steered"));
    let (a, st) = (end.accounting, end.stats);
    assert_eq!(st.errors.values().sum::<u64>(), 0, "{st:?}");
    assert_eq!((a.eth_objects, a.flow_objects), (2, 3), "{a:?}");
    assert_eq!(
        (a.uars, a.pds, a.tds, a.eqs, a.cqs),
        (1, 1, 1, 1, 1),
        "{a:?}"
    );
    assert_eq!(st.executed(CmdOpcode::ModifyRq), 1, "{st:?}");
}

/// The inputs of `mlx5_firmware` share one rig per thread, reset between them: an input
/// gives the same accounting, counters, DMA faults and memory (every mapped byte) whether
/// it runs first on a fresh rig, again at once, or after other inputs (seeds and random
/// ones, some of which leave objects, pages and a torn-down function behind).
#[test]
fn mlx5_firmware_inputs_are_reproducible() {
    let seeds = firmware::seeds();
    let mut inputs: Vec<Vec<u8>> = seeds.iter().map(|(_, d)| d.clone()).collect();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..30 {
        let mut v = Vec::new();
        for _ in 0..(x % 300) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            v.push(x as u8);
        }
        if let Some(b) = v.first_mut() {
            *b |= 1;
        }
        inputs.push(v);
    }
    let first: Vec<firmware::End> = inputs.iter().map(|d| firmware::run(d)).collect();
    for (d, want) in inputs.iter().zip(&first) {
        assert_eq!(&firmware::run(d), want, "run again at once");
    }
    for (d, want) in inputs.iter().zip(&first).rev() {
        assert_eq!(&firmware::run(d), want, "run after the others, in reverse");
    }
    // A rig made for the input alone (another thread: its own rig) agrees too.
    let alone = std::thread::spawn({
        let d = inputs[0].clone();
        move || firmware::run(&d)
    })
    .join()
    .expect("the thread");
    assert_eq!(alone, first[0], "a fresh rig");
    assert!(
        first.iter().any(|e| e.accounting.pages_held == 48)
            && first.iter().any(|e| e.dma_faults > 0),
        "the inputs reach bring-up and DMA faults"
    );
}

/// The WQE seeds reach what they were written for.
#[test]
fn the_mlx5_wqe_seeds_do_what_they_say() {
    let seeds = wqe::seeds();
    let get = |name: &str| &seeds.iter().find(|(n, _)| *n == name).expect(name).1;
    let end = wqe::run(get("send"));
    assert_eq!(end.state, 3, "an honest SEND leaves the QP in RTS: {end:?}");
    assert!(end.stats.tx_packets >= 1, "{end:?}");
    let end = wqe::run(get("bad-lkey"));
    assert_eq!(end.state, 6, "a SEND with a bad lkey: {end:?}");
    assert!(end.cqes >= 1, "{end:?}");
    let end = wqe::run(get("garbage"));
    assert_eq!(end.state, 6, "raw WQEBBs are refused: {end:?}");
    assert!(end.cqes >= 1 && end.stats.wqe_errors >= 1, "{end:?}");
}

#[test]
fn mlx5_cqe_corpus_and_random_inputs() {
    assert!(replay("mlx5_cqe", cqe::completions) >= 8);
    random_inputs(7, 400, 600, cqe::completions);
}

/// The CQE seeds reach what they were written for: honest completions, and each hostile
/// kind refused and counted.
#[test]
fn the_mlx5_cqe_seeds_do_what_they_say() {
    let seeds = cqe::seeds();
    let get = |name: &str| &seeds.iter().find(|(n, _)| *n == name).expect(name).1;
    let end = cqe::run(get("honest-sends"));
    assert_eq!((end.completions, end.cq.cqes), (2, 2), "{end:?}");
    assert_eq!(end.cq.bad_wqe_counter + end.cq.unknown_qpn, 0, "{end:?}");
    let end = cqe::run(get("honest-recv-and-error"));
    assert_eq!((end.completions, end.cq.cqes), (3, 3), "{end:?}");
    let end = cqe::run(get("bad-wqe-counter"));
    assert_eq!(end.cq.bad_wqe_counter, 3, "{end:?}");
    assert_eq!(end.completions, 0, "{end:?}");
    // A REQ for a QPN no QP has; a receive completion for the idle QP (nothing posted).
    let end = cqe::run(get("unknown-qpn"));
    assert_eq!(
        (end.cq.unknown_qpn, end.cq.unexpected_recv, end.completions),
        (1, 1, 0),
        "{end:?}"
    );
    let end = cqe::run(get("unknown-opcode-and-compressed"));
    assert_eq!(
        end.cq.unknown_cqe, 2,
        "opcode 9 and the compressed format: {end:?}"
    );
    assert_eq!(end.completions, 1, "format 1 is decoded: {end:?}");
    let end = cqe::run(get("wrong-owner-and-raw"));
    assert_eq!((end.cq.cqes, end.completions), (0, 0), "{end:?}");
    let end = cqe::run(get("responder-stops-poll-send"));
    assert_eq!((end.cq.cqes, end.completions), (2, 2), "{end:?}");
    let end = cqe::run(get("flush"));
    assert_eq!(end.cq.software_flushed, 3, "{end:?}");
    let end = cqe::run(get("eqes"));
    let k = end.eq;
    assert_eq!(
        (
            k.eqes,
            k.completion,
            k.unknown_cq,
            k.command,
            k.page_requests,
            k.unknown_type
        ),
        (5, 2, 1, 1, 1, 1),
        "{k:?}"
    );
    let end = cqe::run(get("full-sq"));
    assert_eq!(end.completions, 0, "{end:?}");
}

/// The `sole-*` seeds (the first byte's [`cqe::SOLE_QP`]) run on a CQ with one QP, and end
/// as their two-QP originals do — the lean path and the general decoder agree — except
/// where a CQE names the idle QP, which on the sole-QP rig is an unknown QPN.
#[test]
fn the_mlx5_cqe_sole_qp_seeds_end_as_the_two_qp_ones() {
    let seeds = cqe::seeds();
    let get = |name: &str| &seeds.iter().find(|(n, _)| *n == name).expect(name).1;
    for name in [
        "honest-sends",
        "honest-recv-and-error",
        "bad-wqe-counter",
        "unknown-opcode-and-compressed",
        "wrong-owner-and-raw",
        "responder-stops-poll-send",
        "flush",
    ] {
        let two = cqe::run(get(name));
        let sole = cqe::run(get(&format!("sole-{name}")));
        assert_eq!((two.qps, sole.qps), (2, 1), "{name}");
        assert_eq!(sole, cqe::End { qps: 1, ..two }, "{name}");
    }
    // The REQ for a random QPN and the receive CQE for the idle QP's QPN: both unknown.
    let end = cqe::run(get("sole-unknown-qpn"));
    assert_eq!(
        (
            end.qps,
            end.cq.unknown_qpn,
            end.cq.unexpected_recv,
            end.completions
        ),
        (1, 2, 0, 0),
        "{end:?}"
    );
    let end = cqe::run(get("sole-wrap"));
    assert_eq!(end.qps, 1);
    assert_eq!((end.completions, end.cq.cqes), (9, 9), "{end:?}");
    assert_eq!(
        end.cq.unknown_qpn + end.cq.bad_wqe_counter + end.cq.unexpected_recv + end.cq.unknown_cqe,
        0,
        "{end:?}"
    );
}

/// Every `mlx5_cqe` input builds its rigs afresh: each seed, on either rig, ends the same
/// when run twice.
#[test]
fn mlx5_cqe_inputs_are_reproducible() {
    for (name, seed) in cqe::seeds() {
        assert_eq!(cqe::run(&seed), cqe::run(&seed), "{name}");
    }
}

/// A REQ CQE for `qpn`'s WQE `counter` in slot `pos` of a ring of `2^log` CQEs, with
/// the owner bit of `pos`'s pass.
fn req_cqe(pos: u32, log: u32, qpn: u32, counter: u16) -> [u8; 64] {
    let mut b = [0u8; 64];
    let mut v = rnic_mlx5_prm::Cqe64::new_unchecked(&mut b[..]);
    v.set_qpn(qpn).expect("qpn");
    v.set_wqe_counter(counter.into()).expect("wqe_counter");
    v.set_opcode(rnic_mlx5_prm::CqeOpcode::Req.as_raw().into())
        .expect("opcode");
    v.set_owner((pos >> log) & 1).expect("owner");
    b
}

/// The sole-QP rig's CQ completes signaled WRITEs through `poll_send` (the CQ's lean path:
/// one QP attached) across two wraps of a 2-entry ring, exactly as the two-QP rig's
/// general decoder does: the completion (wr_id, opcode, status, QPN, byte_len), the
/// consumer index and doorbell record, the retired WQEs; a CQE naming the QPN the idle QP
/// has on the two-QP rig is an unknown QPN there.
#[test]
fn the_sole_qp_rig_completes_writes_through_poll_send_as_the_two_qp_rig_does() {
    use rnic_core::{WcOpcode, WcStatus};
    use rnic_mlx5::rdma::fuzzing::{CqRig, OTHER_QPN, QPN};
    let run = |mut rig: CqRig| {
        let mut got = Vec::new();
        for i in 0..5u32 {
            let wr_id = 100 + u64::from(i);
            let (index, wqebbs) = rig
                .post_write(wr_id, 8, 8, true, true)
                .expect("an inline WRITE");
            assert_eq!((index, wqebbs), (i as u16, 1));
            assert_eq!(rig.outstanding(), (1, 0));
            rig.write_cqe(i, &req_cqe(i, 1, QPN, index));
            let c = rig.poll_send().expect("a WRITE completion");
            assert_eq!(
                (
                    c.wr_id(),
                    c.opcode(),
                    c.status(),
                    c.qp_num().get(),
                    c.byte_len()
                ),
                (wr_id, WcOpcode::RdmaWrite, WcStatus::Success, QPN, 0)
            );
            assert_eq!(rig.consumer_index(), i + 1);
            assert_eq!(rig.record_ci(), i + 1, "doorbell record set_ci");
            assert_eq!(rig.outstanding(), (0, 0));
            got.push(c.wr_id());
        }
        // A REQ naming OTHER_QPN: refused (the idle QP has nothing outstanding, or there
        // is no such QP), counted, consumed.
        let (index, _) = rig.post_write(200, 8, 8, true, true).expect("a WRITE");
        rig.write_cqe(5, &req_cqe(5, 1, OTHER_QPN, index));
        assert!(rig.poll_send().is_none());
        assert_eq!((rig.consumer_index(), rig.outstanding()), (6, (1, 0)));
        (got, rig.counters(), rig.attached_qps())
    };
    let (sole, k_sole, n_sole) = run(CqRig::new_sole(1).expect("rig"));
    let (two, k_two, n_two) = run(CqRig::new(1).expect("rig"));
    assert_eq!((n_sole, n_two), (1, 2));
    assert_eq!(sole, vec![100, 101, 102, 103, 104]);
    assert_eq!(sole, two);
    assert_eq!(
        (k_sole.cqes, k_sole.unknown_qpn, k_sole.bad_wqe_counter),
        (6, 1, 0)
    );
    // On the two-QP rig the idle QP exists: its CQE names no outstanding WQE of it.
    assert_eq!(
        (k_two.cqes, k_two.unknown_qpn, k_two.bad_wqe_counter),
        (6, 0, 1)
    );
}

#[test]
#[should_panic(expected = "the completion of a REQ CQE")]
fn the_mlx5_cqe_next_completion_check_can_fail() {
    cqe::check_a_misattributed_completion();
}

#[test]
#[should_panic(expected = "no outstanding WQE")]
fn the_mlx5_cqe_completion_check_can_fail() {
    cqe::check_a_forged_completion();
}

#[test]
#[should_panic(expected = "other pages")]
fn the_mlx5_page_check_can_fail() {
    firmware::check_a_forged_page();
}

#[test]
#[should_panic(expected = "delivery status")]
fn the_mlx5_delivery_check_can_fail() {
    firmware::check_a_forged_delivery();
}

#[test]
#[should_panic(expected = "no command output names")]
fn the_mlx5_stray_write_check_can_fail() {
    firmware::check_a_forged_write();
}

#[test]
#[should_panic(expected = "owner bit")]
fn the_mlx5_cqe_check_can_fail() {
    wqe::check_a_forged_cqe();
}

#[test]
#[should_panic(expected = "never posted")]
fn the_mlx5_completion_count_check_can_fail() {
    wqe::check_a_forged_completion_count();
}

#[test]
#[should_panic(expected = "no MKey grants")]
fn the_mlx5_mkey_memory_check_can_fail() {
    wqe::check_a_forged_stray_write();
}

/// The requester seed that encodes issue 15's reproducer (a PSN-sequence
/// NAK inside a 2048-byte READ, then the tail only) runs clean now; with
/// the bug back, its READ completed SUCCESS with 1024 unwritten bytes and
/// the harness's hole check failed (checked by reverting the fix once).
#[test]
fn the_issue_reproducer_seed_is_in_the_corpus() {
    let data = std::fs::read(corpus("requester").join("issue15-nak-inside-read"))
        .expect("the reproducer seed");
    assert_eq!(data, engine::issue15_read_hole_seed());
    engine::requester(&data);
}

/// The wire round-trip check fires on a repr that does not survive.
#[test]
#[should_panic(expected = "emit")]
fn the_round_trip_check_can_fail() {
    wire::assert_round_trip_fails_for_a_truncated_payload();
}

/// The L2 harness's "no entry nobody asked for" check fires.
#[test]
#[should_panic(expected = "nobody asked for")]
fn the_l2_entry_check_can_fail() {
    crate::l2::check_an_unasked_entry();
}

/// The hole check fires on a READ completion whose bytes were not written.
#[test]
#[should_panic(expected = "never written")]
fn the_hole_check_can_fail() {
    engine::check_a_forged_read_completion();
}

/// Writes the seed corpus (run once with `--ignored`; the files are
/// committed): the real kernel-rxe capture's frames, IP datagrams and RoCE
/// packets for `wire`, hand-made programs for the engine targets.
#[test]
#[ignore = "writes fuzz/corpus; run by hand when the seeds change"]
fn write_seed_corpus() {
    let pcap =
        include_bytes!("../../drivers/roce/tests/data/kernel-rxe-send-write-read-atomic.pcap");
    let mut r = rnic_roce::pcap::Reader::new(pcap).expect("capture");
    let dir = corpus("wire");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let mut i = 0;
    while let Some(rec) = r.next_record() {
        let frame = rec.expect("record").data;
        if i % 40 == 0 {
            let ihl = usize::from(frame.get(14).copied().unwrap_or(0x45) & 0xf) * 4;
            for (kind, bytes) in [
                ("frame", frame),
                ("ip", frame.get(14..).unwrap_or(&[])),
                ("roce", frame.get(14 + ihl + 8..).unwrap_or(&[])),
            ] {
                std::fs::write(dir.join(format!("capture-{i:04}-{kind}")), bytes).expect("write");
            }
        }
        i += 1;
    }
    for (target, seeds) in [
        ("responder", engine::responder_seeds()),
        ("requester", engine::requester_seeds()),
        ("mlx5_firmware", firmware::seeds()),
        ("mlx5_wqe", wqe::seeds()),
        ("mlx5_cqe", cqe::seeds()),
        ("rxe_rx", crate::rxe::rxe_rx_seeds()),
        ("l2", crate::l2::seeds()),
    ] {
        let dir = corpus(target);
        std::fs::create_dir_all(&dir).expect("mkdir");
        for (name, bytes) in seeds {
            std::fs::write(dir.join(name), bytes).expect("write");
        }
    }
}
