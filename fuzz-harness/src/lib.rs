//! rnic-fuzz-harness: the hostile-input harnesses behind rnic's fuzz targets.
//!
//! Each harness takes arbitrary bytes, drives one piece of rnic with them,
//! and **asserts the invariants** (a failed assertion is a finding, exactly
//! like a panic inside rnic):
//!
//! - [`wire::packet`]: every RoCEv2 parser (BTH and each extension header,
//!   the whole packet, IPv4/IPv6/UDP datagrams, Ethernet frames, the ICRC)
//!   over the bytes. No panic; whatever parses re-emits and parses back to
//!   the same representation.
//! - [`engine::responder`]: an RC QP in RTS fed a sequence of request
//!   packets (structured from the input: every opcode, PSNs in and out of
//!   the window, RETH/AtomicETH/IETH naming every region and random keys,
//!   any length) and garbage, with receives posted and timers fired in
//!   between. Regions that grant no remote right, or belong to another PD,
//!   never change; no receive completes twice or more often than posted;
//!   everything the QP emits is a well-formed packet to its peer.
//! - [`engine::requester`]: an RC QP with READs, atomics, WRITEs and SENDs
//!   outstanding against a lying responder (READ responses of any opcode,
//!   PSN and length, ACKs/NAKs/RNR NAKs with any syndrome and PSN, atomic
//!   ACKs, timers). A READ or atomic that completes with success has every
//!   byte of its scatter list written by response data; every work request
//!   completes at most once and in posting order; memory no request names
//!   never changes.
//! - [`mlx5::firmware::command_queue`]: the emulated ConnectX function
//!   (rnic-mlx5-emu, in process) fed hostile command queue entries and
//!   mailbox chains. Every rung entry gets exactly the delivery status the
//!   mailbox rules give, a known command status with a nonzero syndrome on
//!   error; the pages and objects the firmware holds match the commands that
//!   succeeded; no device write lands outside the mapping or outside the
//!   outputs the entries name.
//! - [`mlx5::wqe::send_queue`]: an RC QP of the emulated function in RTS fed
//!   hostile send WQEs and doorbells. Every CQE is well-formed and in its ring
//!   position, none is overwritten unconsumed, an error CQE leaves the QP in
//!   ERR, memory no MKey grants never changes.
//!
//! - [`l2::frames`]: rnic-roce's neighbour engine (ARP / IPv6 neighbour
//!   discovery responder and resolver) fed hostile frames — raw, and ARP /
//!   solicitations / advertisements built from the input, truncated or
//!   damaged — between resolves, static entries and timers. No entry
//!   appears that the program did not resolve or pin, static entries keep
//!   their MAC, every frame lands in exactly one counter, the cache and
//!   queues stay bounded, and every frame sent is valid ARP / ND from an
//!   own address.
//!
//! - [`rxe::rx`]: a live rnic-rxe device (caller-driven, no sockets read)
//!   fed hostile datagrams through the receive path's own delivery function
//!   (ICRC check, QPN lookup, the per-QP engine, memory keys, CQ writes).
//!   No canary byte around the regions and no byte of a region without
//!   remote-write rights changes; every completion names a posted WR, once,
//!   with a known status; afterwards an honest WRITE and SEND still land.
//!
//! The cargo-fuzz targets in `fuzz/` call these functions; the tests of
//! this crate replay the committed seed corpus (`fuzz/corpus/<target>/`)
//! and a deterministic batch of pseudo-random inputs through them, so every
//! `cargo test` re-checks what the fuzzers found interesting.
#![forbid(unsafe_code)]

pub mod engine;
pub mod l2;
pub mod mlx5;
pub mod rxe;
pub mod wire;

/// Reads an input front to back; past the end every read is zero, so any
/// byte string is a valid program.
#[derive(Debug)]
pub struct Input<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Input<'a> {
    /// A reader over `data`.
    pub fn new(data: &'a [u8]) -> Input<'a> {
        Input { data, at: 0 }
    }

    /// Whether every byte has been read.
    pub fn is_empty(&self) -> bool {
        self.at >= self.data.len()
    }

    /// The next byte (0 past the end).
    pub fn u8(&mut self) -> u8 {
        let b = self.data.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        b
    }

    /// The next two bytes, big-endian.
    pub fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.u8(), self.u8()])
    }

    /// The next four bytes, big-endian.
    pub fn u32(&mut self) -> u32 {
        u32::from_be_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    /// The next eight bytes, big-endian.
    pub fn u64(&mut self) -> u64 {
        (u64::from(self.u32()) << 32) | u64::from(self.u32())
    }

    /// Up to `n` bytes (fewer at the end).
    pub fn bytes(&mut self, n: usize) -> &'a [u8] {
        let start = self.at.min(self.data.len());
        let end = self.at.saturating_add(n).min(self.data.len());
        self.at = self.at.saturating_add(n);
        &self.data[start..end]
    }
}

#[cfg(test)]
mod tests;
