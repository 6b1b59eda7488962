//! Test support shared by rnic's providers.
//!
//! [`every_rc_op`] is the RC conformance sequence: every RC operation (WRITE,
//! WRITE with immediate, SEND, SEND with immediate, READ) at each size, with
//! both sides' bytes checked and an untouched guard byte after every target,
//! every completion's status, opcode, byte count and immediate, then
//! fetch-and-add and two compare-and-swaps returning the original value. The
//! same function runs on rnic-rxe (`drivers/rxe/tests`) and on rnic-mlx5 over
//! the emulated function, mlx5 ↔ mlx5 and mlx5 ↔ rxe (`tests/mlx5_conformance.rs`):
//! a backend only says how to reach its buffer, its completions and its atomic
//! byte order ([`Endpoint`]).
//!
//! Buffer layout each side needs (≥ 4 MiB + 1 byte past the largest size): the
//! source at 0, the SEND target at 1 MiB, the WRITE/READ target at 2 MiB, the
//! receive scratch and the atomics at 3 MiB.

// Test support: a failed expectation panics, which is how a test reports it.
#![allow(clippy::unwrap_used)]

use rnic_core::{MemoryRegion, Mtu, QueuePair, WorkCompletion};
use rnic_core::{RecvWr, SendWr, Sge, WcFlags, WcOpcode, WcStatus};
use std::time::{Duration, Instant};

/// One MiB.
pub const MIB: usize = 1 << 20;

/// One side of a connected pair, as the conformance sequence sees it.
pub trait Endpoint {
    /// The region over this side's whole buffer (all access rights).
    fn mr(&self) -> &MemoryRegion;
    /// Write `data` into the buffer at `off`.
    fn fill(&self, off: usize, data: &[u8]);
    /// The buffer's `len` bytes at `off`.
    fn bytes(&self, off: usize, len: usize) -> Vec<u8>;
    /// `v` as this side's atomics keep a 64-bit word in memory (an mlx5
    /// function without an atomic endianness mode: big-endian; rxe: native).
    fn atomic_bytes(&self, v: u64) -> [u8; 8] {
        v.to_ne_bytes()
    }
    /// Poll this side's CQ until `n` completions arrived (panicking after a
    /// bound), driving `peer` meanwhile if it is caller-driven.
    fn wait(&self, peer: &Self, n: usize) -> Vec<WorkCompletion>;
}

/// A deterministic byte pattern.
pub fn pattern(len: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

/// The sizes an MTU makes interesting: empty, one byte, one packet less a
/// byte, exactly one packet, one byte into a second, and 1 MiB.
pub fn sizes(mtu: Mtu) -> [usize; 6] {
    let m = mtu.bytes() as usize;
    [0, 1, m - 1, m, m + 1, MIB]
}

/// Every RC operation at `sizes` from `a` to `b` over the connected pair,
/// checking both sides' bytes (with an untouched guard byte after each
/// target), every completion, then the three atomics.
pub fn every_rc_op<E: Endpoint>(
    a: &E,
    qa: &mut QueuePair,
    b: &E,
    qb: &mut QueuePair,
    sizes: &[usize],
) {
    let mut seed = 0x0600;
    for &len in sizes {
        let l32 = len as u32;
        seed += 1;
        let data = pattern(len, seed);
        a.fill(0, &data);
        let src = [a.mr().sge(0, l32).unwrap()];
        let src: &[Sge] = if len == 0 { &[] } else { &src };
        let dst = b.mr().addr() + 2 * MIB as u64;

        // RDMA WRITE
        b.fill(2 * MIB, &vec![0xEE; len + 1]);
        qa.post_send(&[SendWr::rdma_write(1, src, dst, b.mr().rkey()).signaled()])
            .unwrap();
        let wa = a.wait(b, 1);
        assert_eq!(
            (wa[0].status, wa[0].opcode),
            (WcStatus::Success, WcOpcode::RdmaWrite),
            "WRITE {len}: {wa:?}"
        );
        assert!(b.bytes(2 * MIB, len) == data, "WRITE {len}: bytes differ");
        assert_eq!(b.bytes(2 * MIB + len, 1), [0xEE], "WRITE {len} overran");

        // RDMA WRITE with immediate: consumes a receive.
        seed += 1;
        let data = pattern(len, seed);
        a.fill(0, &data);
        let rsge = [b.mr().sge(3 * MIB, 16).unwrap()];
        qb.post_recv(&[RecvWr::new(70, &rsge)]).unwrap();
        let imm = 0x6600_0000 | l32;
        qa.post_send(&[SendWr::rdma_write_with_imm(2, src, dst, b.mr().rkey(), imm).signaled()])
            .unwrap();
        assert_eq!(a.wait(b, 1)[0].status, WcStatus::Success);
        let wb = b.wait(a, 1);
        assert_eq!(
            (wb[0].wr_id, wb[0].status, wb[0].opcode),
            (70, WcStatus::Success, WcOpcode::RecvRdmaWithImm),
            "WRITE_IMM {len}: {wb:?}"
        );
        assert_eq!(wb[0].imm_data, Some(imm));
        assert!(wb[0].wc_flags.contains(WcFlags::WITH_IMM));
        assert_eq!(wb[0].byte_len, l32);
        assert!(
            b.bytes(2 * MIB, len) == data,
            "WRITE_IMM {len}: bytes differ"
        );

        // SEND and SEND with immediate into b at 1 MiB.
        for imm in [None, Some(0x0006_0006u32 ^ l32)] {
            seed += 1;
            let data = pattern(len, seed);
            a.fill(0, &data);
            b.fill(MIB, &vec![0xEE; len + 1]);
            let rsge = [b.mr().sge(MIB, l32 + 1).unwrap()];
            qb.post_recv(&[RecvWr::new(80, &rsge)]).unwrap();
            let wr = match imm {
                None => SendWr::send(3, src),
                Some(i) => SendWr::send_with_imm(3, src, i),
            };
            qa.post_send(&[wr.signaled()]).unwrap();
            let wa = a.wait(b, 1);
            assert_eq!(
                (wa[0].status, wa[0].opcode),
                (WcStatus::Success, WcOpcode::Send),
                "SEND {len} {imm:?}: {wa:?}"
            );
            let wb = b.wait(a, 1);
            assert_eq!(
                (wb[0].wr_id, wb[0].status, wb[0].opcode),
                (80, WcStatus::Success, WcOpcode::Recv),
                "RECV {len} {imm:?}: {wb:?}"
            );
            assert_eq!(wb[0].byte_len, l32);
            assert_eq!(wb[0].imm_data, imm);
            assert_eq!(wb[0].qp_num, qb.qpn());
            assert!(b.bytes(MIB, len) == data, "SEND {len}: bytes differ");
            assert_eq!(b.bytes(MIB + len, 1), [0xEE], "SEND {len} overran");
        }

        // RDMA READ of b's 2 MiB into a at 1 MiB.
        seed += 1;
        let data = pattern(len, seed);
        b.fill(2 * MIB, &data);
        a.fill(MIB, &vec![0xEE; len + 1]);
        let rd = [a.mr().sge(MIB, l32).unwrap()];
        let rd: &[Sge] = if len == 0 { &[] } else { &rd };
        qa.post_send(&[SendWr::rdma_read(4, rd, dst, b.mr().rkey()).signaled()])
            .unwrap();
        let wa = a.wait(b, 1);
        assert_eq!(
            (wa[0].status, wa[0].opcode),
            (WcStatus::Success, WcOpcode::RdmaRead),
            "READ {len}: {wa:?}"
        );
        assert!(a.bytes(MIB, len) == data, "READ {len}: bytes differ");
        assert_eq!(a.bytes(MIB + len, 1), [0xEE], "READ {len} overran");
    }

    // Atomics on b's 8 bytes at 3 MiB + 64; the original lands in a at 3 MiB.
    let target = b.mr().addr() + (3 * MIB + 64) as u64;
    b.fill(3 * MIB + 64, &b.atomic_bytes(1000));
    let res = [a.mr().sge(3 * MIB, 8).unwrap()];
    let steps = [
        // (request, original returned, value left)
        (
            SendWr::atomic_fetch_add(5, &res, target, b.mr().rkey(), 46),
            WcOpcode::FetchAdd,
            1000u64,
            1046u64,
        ),
        (
            SendWr::atomic_cmp_swap(6, &res, target, b.mr().rkey(), 1046, 0x6666),
            WcOpcode::CompSwap,
            1046,
            0x6666,
        ),
        (
            SendWr::atomic_cmp_swap(7, &res, target, b.mr().rkey(), 1, 2),
            WcOpcode::CompSwap,
            0x6666,
            0x6666,
        ),
    ];
    for (wr, opcode, orig, left) in steps {
        a.fill(3 * MIB, &[0xEE; 8]);
        qa.post_send(&[wr.signaled()]).unwrap();
        let wa = a.wait(b, 1);
        assert_eq!(
            (wa[0].status, wa[0].opcode),
            (WcStatus::Success, opcode),
            "{wa:?}"
        );
        assert_eq!(a.bytes(3 * MIB, 8), a.atomic_bytes(orig), "{opcode:?}");
        assert_eq!(b.bytes(3 * MIB + 64, 8), b.atomic_bytes(left), "{opcode:?}");
    }
}

/// Whether process `pid` holds a TCP socket listening on `port` (IPv4 or IPv6):
/// the listening sockets of its network namespace from `/proc/PID/net/tcp{,6}`,
/// matched by inode against its descriptors. A test that starts a server process
/// waits for this rather than sleeping, and without connecting (the server would
/// take a probe for its client); a listener left by another process on the same
/// port does not count.
pub fn tcp_listening(pid: u32, port: u16) -> bool {
    const LISTEN: &str = "0A";
    let mut inodes = Vec::new();
    for table in ["tcp", "tcp6"] {
        let Ok(t) = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")) else {
            continue;
        };
        // "sl local_address rem_address st … uid timeout inode", addresses as HEXIP:HEXPORT.
        for line in t.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().take(10).collect();
            if f.len() == 10
                && f[3] == LISTEN
                && f[1]
                    .rsplit(':')
                    .next()
                    .and_then(|p| u16::from_str_radix(p, 16).ok())
                    == Some(port)
            {
                inodes.push(format!("socket:[{}]", f[9]));
            }
        }
    }
    !inodes.is_empty()
        && std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|fds| {
            fds.flatten().any(|fd| {
                std::fs::read_link(fd.path())
                    .is_ok_and(|l| inodes.iter().any(|i| l.as_os_str() == i.as_str()))
            })
        })
}

/// Wait until `child` listens on TCP `port` ([`tcp_listening`]): `false` if it
/// exited first or `limit` passed (the caller then reports its output).
pub fn wait_listening(child: &mut std::process::Child, port: u16, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if tcp_listening(child.id(), port) {
            return true;
        }
        if !matches!(child.try_wait(), Ok(None)) || Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
