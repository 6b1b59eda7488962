//! Replays the committed seed corpus and a deterministic batch of
//! pseudo-random inputs through every harness, and shows that the
//! harnesses' checks fire on the bugs they exist for.

use std::path::{Path, PathBuf};

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
fn responder_corpus_and_random_inputs() {
    assert!(replay("responder", engine::responder) >= 3);
    random_inputs(2, 600, 600, engine::responder);
}

#[test]
fn requester_corpus_and_random_inputs() {
    assert!(replay("requester", engine::requester) >= 3);
    random_inputs(3, 600, 600, engine::requester);
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
    ] {
        let dir = corpus(target);
        std::fs::create_dir_all(&dir).expect("mkdir");
        for (name, bytes) in seeds {
            std::fs::write(dir.join(name), bytes).expect("write");
        }
    }
}
