//! Counters: per device (sockets, ICRC, demultiplexing, GSO/GRO) and per QP
//! (the engine's [`QpStats`]).

use std::fmt;

use rnic_core::Qpn;
use rnic_roce::transport::QpStats;

/// What one device counts. Every received datagram and every packet moves
/// exactly one of the `rx_*`/`icrc_*`/`unknown_qpn` outcome counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceStats {
    /// RoCE packets handed to the socket layer.
    pub tx_packets: u64,
    /// Their bytes (BTH‥ICRC).
    pub tx_bytes: u64,
    /// Datagrams (plain or GSO) the kernel took.
    pub tx_datagrams: u64,
    /// `sendmmsg` calls.
    pub sendmmsg_calls: u64,
    /// Caller-driven progress rounds whose output was only ACKs, left queued
    /// for the next call into the device (to leave with its packets).
    pub acks_deferred: u64,
    /// Deferred ACKs a caller-driven device's ACK sweeper sent because no
    /// call into the device came for a whole sweep period
    /// ([`crate::RxeConfig::caller_ack_sweep`]).
    pub acks_swept: u64,
    /// Progress-thread rounds that sent ACKs held for a post
    /// ([`crate::RxeConfig::poll_handoff`]) because none came within the
    /// hold.
    pub acks_held_out: u64,
    /// Datagrams the progress thread's rounds received (the rest were
    /// received inside the application's calls).
    pub thread_datagrams: u64,
    /// Times the progress thread woke from its wait (a packet, the
    /// doorbell, a timer).
    pub thread_wakeups: u64,
    /// Naps the progress thread took instead of waiting on its sockets
    /// while datagrams arrived densely (receive moderation,
    /// [`crate::RxeConfig::rx_moderation`]).
    pub thread_naps: u64,
    /// Plain ACKs that replaced a queued, older ACK of the same connection
    /// before it was sent (so they are not in `tx_packets`).
    pub acks_coalesced: u64,
    /// Plain ACKs that left in one GSO datagram behind a request to the
    /// same peer (ACK bundling: one send instead of two).
    pub acks_bundled: u64,
    /// GSO sends (each carrying `gso_segments / gso_sends` packets on average).
    pub gso_sends: u64,
    /// Packets that left inside GSO sends.
    pub gso_segments: u64,
    /// Times the kernel refused GSO and the device fell back to plain sends.
    pub gso_fallbacks: u64,
    /// Packets whose payload left from registered memory in place (the
    /// kernel's copy the only one on the sending side).
    pub tx_in_place: u64,
    /// Their payload bytes.
    pub tx_in_place_bytes: u64,
    /// Datagrams that left as frames through the packet socket
    /// (`crate::frames`; also in `tx_datagrams`).
    pub tx_frames: u64,
    /// Frames the kernel refused, sent through the UDP socket instead.
    pub tx_frame_fallbacks: u64,
    /// Sends that failed (the transport retransmits).
    pub tx_errors: u64,
    /// Of which: larger than the path allows with DF set (EMSGSIZE): lower
    /// the QP's path MTU or raise the interface MTU.
    pub tx_too_big: u64,
    /// Packets whose address vector named a GID index the device lacks, or
    /// mixed IPv4 and IPv6.
    pub tx_bad_sgid: u64,
    /// QP source ports that could not be bound (sent from the RoCE port).
    pub sport_fallbacks: u64,
    /// Datagrams received.
    pub rx_datagrams: u64,
    /// `recvmmsg` calls that returned data (and receive placement's
    /// `recvmsg` calls).
    pub recvmmsg_calls: u64,
    /// Batches taken from packet rings (`RxeConfig::rx_ring`) that held data.
    pub ring_batches: u64,
    /// RoCE packets received (a GRO datagram carries several).
    pub rx_packets: u64,
    /// Their bytes.
    pub rx_bytes: u64,
    /// GRO datagrams (carrying more than one packet).
    pub gro_datagrams: u64,
    /// Packets that arrived inside GRO datagrams.
    pub gro_segments: u64,
    /// Packets too short for BTH + ICRC, or truncated by the socket.
    pub rx_malformed: u64,
    /// READ responses received with their payload placed straight into
    /// the READ's local buffer (`RxeConfig::rx_place`).
    pub rx_placed: u64,
    /// Their payload bytes.
    pub rx_placed_bytes: u64,
    /// Datagrams received for placement that were not the responses
    /// predicted (another QP, another PSN or shape, a bad ICRC): copied
    /// back together and received as any other.
    pub rx_place_fallbacks: u64,
    /// ICRC verified, all 32 bits, with a predicted identification (IPv4:
    /// the GRO segment index, the sender's previous identification + 1, or
    /// 0; IPv6 has none), the one the identification tap saw, or the one in
    /// the header the packet ring saw.
    pub icrc_ok: u64,
    /// Of `icrc_ok`: IPv4 verified with identification 0 (rnic peers; also
    /// a datagram's first segment).
    pub icrc_ident_zero: u64,
    /// Of `icrc_ok`: IPv4 verified with the GRO segment index (> 0).
    pub icrc_ident_gro: u64,
    /// Of `icrc_ok`: IPv4 verified with the sender's previous
    /// identification + 1 (kernel rxe peers, after their first packet).
    pub icrc_ident_next: u64,
    /// Of `icrc_ok`: IPv4 verified (all 32 bits) with the identification the
    /// tap saw, after every prediction missed.
    pub icrc_ident_tap: u64,
    /// Of `icrc_ok`: IPv4 verified with the identification of the header
    /// the packet ring saw (nothing predicted, no tap needed).
    pub icrc_ident_seen: u64,
    /// IPv4 packets dropped because no prediction held, no tap exists and
    /// the 15-bit recovery is off (see `RxeConfig::ident_recovery`).
    pub icrc_unverified: u64,
    /// IPv4 ICRC verified only after solving for the sender's identification
    /// (kernel rxe peers use a counter). Such a check keeps only 15 of the 32
    /// ICRC bits: a corrupted packet passes with probability 2^-15.
    pub icrc_recovered: u64,
    /// Packets dropped for a bad ICRC.
    pub icrc_drops: u64,
    /// Rounds that ended by draining the identification taps (one system
    /// call per tap and copy, and one that finds it empty): once per
    /// `TAP_DRAIN_AT` of packets a tap may have copied, not per round.
    pub tap_drains: u64,
    /// Packets for a QPN the device does not have (dropped).
    pub unknown_qpn: u64,
    /// Of `unknown_qpn`, those for a QPN outside this device's range (not an
    /// outcome of its own): another process's on
    /// a shared address, reaching this one because its owner had just left
    /// (the kernel's hash fallback) or a GRO batch mixed two QPs. Dropped,
    /// never delivered.
    pub foreign_qpn: u64,
    /// Verified packets the fault injector dropped ([`crate::FaultConfig`]).
    pub fault_drops: u64,
    /// Verified packets the fault injector delivered after their successor.
    pub fault_reordered: u64,
    /// Completions pushed beyond a CQ's depth (never with core's credit
    /// accounting in place).
    pub cq_overflows: u64,
}

impl DeviceStats {
    /// Add `o`'s counters to these (the device's total is the receive
    /// path's plus every QP's transmit side).
    pub fn add(&mut self, o: &DeviceStats) {
        let DeviceStats {
            tx_packets,
            tx_bytes,
            tx_datagrams,
            sendmmsg_calls,
            acks_deferred,
            acks_swept,
            acks_held_out,
            thread_datagrams,
            thread_wakeups,
            thread_naps,
            acks_coalesced,
            acks_bundled,
            gso_sends,
            gso_segments,
            gso_fallbacks,
            tx_in_place,
            tx_in_place_bytes,
            tx_frames,
            tx_frame_fallbacks,
            tx_errors,
            tx_too_big,
            tx_bad_sgid,
            sport_fallbacks,
            rx_datagrams,
            recvmmsg_calls,
            ring_batches,
            rx_packets,
            rx_bytes,
            gro_datagrams,
            gro_segments,
            rx_malformed,
            rx_placed,
            rx_placed_bytes,
            rx_place_fallbacks,
            icrc_ok,
            icrc_ident_zero,
            icrc_ident_gro,
            icrc_ident_next,
            icrc_ident_tap,
            icrc_ident_seen,
            icrc_unverified,
            icrc_recovered,
            icrc_drops,
            tap_drains,
            unknown_qpn,
            foreign_qpn,
            fault_drops,
            fault_reordered,
            cq_overflows,
        } = *o;
        for (a, b) in [
            (&mut self.tx_packets, tx_packets),
            (&mut self.tx_bytes, tx_bytes),
            (&mut self.tx_datagrams, tx_datagrams),
            (&mut self.sendmmsg_calls, sendmmsg_calls),
            (&mut self.acks_deferred, acks_deferred),
            (&mut self.acks_swept, acks_swept),
            (&mut self.acks_held_out, acks_held_out),
            (&mut self.thread_datagrams, thread_datagrams),
            (&mut self.thread_wakeups, thread_wakeups),
            (&mut self.thread_naps, thread_naps),
            (&mut self.acks_coalesced, acks_coalesced),
            (&mut self.acks_bundled, acks_bundled),
            (&mut self.gso_sends, gso_sends),
            (&mut self.gso_segments, gso_segments),
            (&mut self.gso_fallbacks, gso_fallbacks),
            (&mut self.tx_in_place, tx_in_place),
            (&mut self.tx_in_place_bytes, tx_in_place_bytes),
            (&mut self.tx_frames, tx_frames),
            (&mut self.tx_frame_fallbacks, tx_frame_fallbacks),
            (&mut self.tx_errors, tx_errors),
            (&mut self.tx_too_big, tx_too_big),
            (&mut self.tx_bad_sgid, tx_bad_sgid),
            (&mut self.sport_fallbacks, sport_fallbacks),
            (&mut self.rx_datagrams, rx_datagrams),
            (&mut self.recvmmsg_calls, recvmmsg_calls),
            (&mut self.ring_batches, ring_batches),
            (&mut self.rx_packets, rx_packets),
            (&mut self.rx_bytes, rx_bytes),
            (&mut self.gro_datagrams, gro_datagrams),
            (&mut self.gro_segments, gro_segments),
            (&mut self.rx_malformed, rx_malformed),
            (&mut self.rx_placed, rx_placed),
            (&mut self.rx_placed_bytes, rx_placed_bytes),
            (&mut self.rx_place_fallbacks, rx_place_fallbacks),
            (&mut self.icrc_ok, icrc_ok),
            (&mut self.icrc_ident_zero, icrc_ident_zero),
            (&mut self.icrc_ident_gro, icrc_ident_gro),
            (&mut self.icrc_ident_next, icrc_ident_next),
            (&mut self.icrc_ident_tap, icrc_ident_tap),
            (&mut self.icrc_ident_seen, icrc_ident_seen),
            (&mut self.icrc_unverified, icrc_unverified),
            (&mut self.icrc_recovered, icrc_recovered),
            (&mut self.icrc_drops, icrc_drops),
            (&mut self.tap_drains, tap_drains),
            (&mut self.unknown_qpn, unknown_qpn),
            (&mut self.foreign_qpn, foreign_qpn),
            (&mut self.fault_drops, fault_drops),
            (&mut self.fault_reordered, fault_reordered),
            (&mut self.cq_overflows, cq_overflows),
        ] {
            *a += b;
        }
    }
}

/// A device's counters and those of each live QP.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RxeStats {
    /// Device-wide counters.
    pub device: DeviceStats,
    /// Each QP's engine counters, by QPN.
    pub qps: Vec<(Qpn, QpStats)>,
}

impl RxeStats {
    /// One QP's counters.
    pub fn qp(&self, qpn: Qpn) -> Option<&QpStats> {
        self.qps.iter().find(|(q, _)| *q == qpn).map(|(_, s)| s)
    }
}

impl fmt::Display for RxeStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = &self.device;
        writeln!(
            f,
            "tx: {} packets {} bytes in {} datagrams ({} sendmmsg, {} ACK rounds deferred ({} swept, {} held out), {} ACKs coalesced, {} bundled, {} GSO sends carrying {} packets, {} GSO fallbacks), {} payloads ({} bytes) sent in place, {} sent as frames ({} refused, sent as datagrams), {} errors ({} too big), {} bad sgid",
            d.tx_packets,
            d.tx_bytes,
            d.tx_datagrams,
            d.sendmmsg_calls,
            d.acks_deferred,
            d.acks_swept,
            d.acks_held_out,
            d.acks_coalesced,
            d.acks_bundled,
            d.gso_sends,
            d.gso_segments,
            d.gso_fallbacks,
            d.tx_in_place,
            d.tx_in_place_bytes,
            d.tx_frames,
            d.tx_frame_fallbacks,
            d.tx_errors,
            d.tx_too_big,
            d.tx_bad_sgid
        )?;
        writeln!(
            f,
            "rx: {} packets {} bytes in {} datagrams ({} recvmmsg, {} packet-ring batches, {} GRO datagrams carrying {} packets; the progress thread received {} datagrams in {} wake-ups and {} moderation naps), {} malformed, {} unknown QPN ({} in other processes' ranges)",
            d.rx_packets,
            d.rx_bytes,
            d.rx_datagrams,
            d.recvmmsg_calls,
            d.ring_batches,
            d.gro_datagrams,
            d.gro_segments,
            d.thread_datagrams,
            d.thread_wakeups,
            d.thread_naps,
            d.rx_malformed,
            d.unknown_qpn,
            d.foreign_qpn
        )?;
        if d.rx_placed > 0 || d.rx_place_fallbacks > 0 {
            writeln!(
                f,
                "placed: {} READ responses, {} payload bytes received straight into their READs' buffers; {} datagrams not as predicted (reassembled, received as usual)",
                d.rx_placed, d.rx_placed_bytes, d.rx_place_fallbacks
            )?;
        }
        writeln!(
            f,
            "icrc: {} ok, all 32 bits (ident 0: {}, GRO index: {}, previous + 1: {}, tapped: {}, seen by the ring: {}), {} recovered (15-bit check), {} unverifiable (dropped), {} dropped; {} tap drains",
            d.icrc_ok,
            d.icrc_ident_zero,
            d.icrc_ident_gro,
            d.icrc_ident_next,
            d.icrc_ident_tap,
            d.icrc_ident_seen,
            d.icrc_recovered,
            d.icrc_unverified,
            d.icrc_drops,
            d.tap_drains
        )?;
        if d.fault_drops > 0 || d.fault_reordered > 0 {
            writeln!(
                f,
                "faults injected: {} dropped, {} reordered",
                d.fault_drops, d.fault_reordered
            )?;
        }
        for (qpn, s) in &self.qps {
            writeln!(
                f,
                "qp {qpn}: tx {} pkts {} B, rx {} pkts {} B, retransmits {}, timeouts {}, window cuts {}, rnr waits {}, naks sent {} (seq {} inv {} acc {} op {} rnr {}), naks received {}, dup req {}, dup resp {}, drops {}",
                s.tx_packets,
                s.tx_bytes,
                s.rx_packets,
                s.rx_bytes,
                s.retransmits,
                s.timeouts,
                s.window_cuts,
                s.rnr_waits,
                s.naks_sent.total(),
                s.naks_sent.psn_seq,
                s.naks_sent.invalid_request,
                s.naks_sent.remote_access,
                s.naks_sent.remote_op,
                s.naks_sent.rnr,
                s.naks_received.total(),
                s.duplicate_requests,
                s.duplicate_responses,
                s.drops.total()
            )?;
        }
        Ok(())
    }
}
