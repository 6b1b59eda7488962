//! Per-QP counters. Counters, not logs, on the data path: every packet the
//! engine drops, NAKs or retransmits moves exactly one of these.

/// NAKs by AETH code (sent or received).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NakCounts {
    /// PSN sequence error (syndrome 0x60).
    pub psn_seq: u64,
    /// Invalid request (0x61).
    pub invalid_request: u64,
    /// Remote access error (0x62).
    pub remote_access: u64,
    /// Remote operational error (0x63).
    pub remote_op: u64,
    /// Receiver not ready (0x20 | timer).
    pub rnr: u64,
}

impl NakCounts {
    /// Sum over all codes.
    pub fn total(&self) -> u64 {
        self.psn_seq + self.invalid_request + self.remote_access + self.remote_op + self.rnr
    }
}

/// Received packets dropped without any effect on state, by reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DropCounts {
    /// Shorter than its headers + ICRC.
    pub truncated: u64,
    /// Opcode the engine does not speak (or of the wrong transport for the QP).
    pub bad_opcode: u64,
    /// Bad transport version, P_Key or padding.
    pub bad_header: u64,
    /// BTH DestQP is not this QP.
    pub wrong_qpn: u64,
    /// RC packet whose source GID is not the connected peer's (the address
    /// vector's DGID): kernel rxe's `check_addr` drops these too.
    pub wrong_source: u64,
    /// The QP state does not accept packets (RESET, INIT, ERR; responses before RTS).
    pub bad_state: u64,
    /// Request PSN ahead of the expected PSN (after the one sequence NAK per gap).
    pub psn_out_of_window: u64,
    /// Response whose PSN matches nothing outstanding (older than the window,
    /// newer than anything sent, or out of order inside a READ).
    pub bad_response_psn: u64,
    /// Response of the wrong kind or length for the work request it answers.
    pub bad_response: u64,
    /// Duplicate READ/atomic with no matching responder resource, or whose
    /// range does not lie within the original request.
    pub no_resource: u64,
    /// Request arriving while a READ reply is still being emitted.
    pub busy: u64,
    /// UD datagram with a Q_Key other than the QP's.
    pub qkey_mismatch: u64,
    /// UD datagram with no posted receive (UD has no RNR).
    pub no_receive: u64,
    /// Outgoing packet the sink had no room for (ACKs/NAKs; requests wait instead).
    pub tx_full: u64,
}

impl DropCounts {
    /// Sum over all reasons.
    pub fn total(&self) -> u64 {
        self.truncated
            + self.bad_opcode
            + self.bad_header
            + self.wrong_qpn
            + self.wrong_source
            + self.bad_state
            + self.psn_out_of_window
            + self.bad_response_psn
            + self.bad_response
            + self.no_resource
            + self.busy
            + self.qkey_mismatch
            + self.no_receive
            + self.tx_full
    }
}

/// Everything one QP counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpStats {
    /// Packets handed to the sink.
    pub tx_packets: u64,
    /// Bytes handed to the sink (BTH‥ICRC).
    pub tx_bytes: u64,
    /// Packets given to `receive` (before any check).
    pub rx_packets: u64,
    /// Bytes given to `receive`.
    pub rx_bytes: u64,
    /// Request packets sent again (PSN already sent once).
    pub retransmits: u64,
    /// Go-back-N rounds started (timeouts, sequence NAKs, RNR waits, read gaps).
    pub retries: u64,
    /// Local ACK timeouts that fired with work outstanding.
    pub timeouts: u64,
    /// Retries that halved a window above rxe's 128 PSNs
    /// ([`Qp::window`](super::Qp::window)).
    pub window_cuts: u64,
    /// RNR NAKs received that made the requester wait.
    pub rnr_waits: u64,
    /// ACKs (syndrome ACK) and atomic ACKs sent; READ responses are not counted here.
    pub acks_sent: u64,
    /// ACKs, atomic ACKs and READ responses received that moved the completer.
    pub acks_received: u64,
    /// NAKs sent, by code.
    pub naks_sent: NakCounts,
    /// NAKs received, by code.
    pub naks_received: NakCounts,
    /// Duplicate requests seen by the responder (re-ACKed or replayed, never re-executed).
    pub duplicate_requests: u64,
    /// Duplicate responses seen by the completer (ignored).
    pub duplicate_responses: u64,
    /// READ replies replayed for duplicate READ requests.
    pub read_replays: u64,
    /// Atomic ACKs replayed for duplicate atomics.
    pub atomic_replays: u64,
    /// SEND_WITH_INVALIDATEs refused because the R_Key named no registration
    /// a peer may invalidate (IBA class J: the receive completes with
    /// `REM_INV_REQ_ERR` and the QP enters ERR).
    pub invalidate_refused: u64,
    /// Dropped packets, by reason.
    pub drops: DropCounts,
    /// Send work requests completed (any status).
    pub send_completions: u64,
    /// Receive work requests completed (any status).
    pub recv_completions: u64,
}
