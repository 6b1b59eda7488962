//! rnic-kvcache: disaggregated LLM inference over RDMA WRITE WITH IMMEDIATE.
//!
//! A prefill node computes the attention KV cache of a prompt layer by layer
//! and streams each layer into a decode node's registered memory as soon as
//! it exists; the decode node reads the cache in place and generates tokens.
//! The model ([`model`]) is a small decoder-only transformer with seeded
//! weights, so the generated tokens prove the transfer exact: they must equal
//! the single-node reference ([`reference`]) bit for bit.
//!
//! # Pieces
//!
//! * [`model`]: the transformer (RMSNorm, RoPE, multi-head attention, SiLU
//!   MLP), its prefill (K/V per layer handed out before the layer finishes)
//!   and its decode step (K/V rows read through a [`model::KvStore`]).
//! * [`layout`]: where every layer's K and V live in the decode node's
//!   region, the chunks a layer is sent in, the 32-bit immediate naming a
//!   chunk, and the text messages of the out-of-band TCP exchange.
//! * [`view`]: [`view::KvRegion`], the zero-copy tensor view: rows are read
//!   straight out of the registered region through `Memory::read`.
//! * [`net`]: device opening (rxe with optional fault injection, or any
//!   backend by spec), NUMA-local registered buffers, RC queue-pair bring-up.
//! * [`prefill`] and [`decode`]: the two nodes, over RDMA or (as a baseline)
//!   a plain TCP socket, with deadlines on every wait.
//! * [`report`]: what each node measured, as text or JSON.
//!
//! # Invariants
//!
//! * The prefill never has more unacknowledged chunks in flight than its
//!   credit window (a [`rnic::core::CreditWindow`]); waiting for a credit is
//!   counted as a stall.
//! * The decode node keeps `window + 1` receives posted, so a WRITE WITH
//!   IMMEDIATE never meets an empty receive queue.
//! * Every wait has a deadline: a dead peer, a truncated stream or a wrong
//!   layout ends in a [`KvError`] naming it, never in a hang.

use std::io;
use std::time::Duration;

use thiserror::Error;

pub mod cli;
pub mod decode;
pub mod layout;
pub mod model;
pub mod net;
pub mod pair;
pub mod prefill;
pub mod reference;
pub mod report;
pub mod view;

/// Everything that can go wrong in the example's library part.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum KvError {
    /// The KV region's memory (a GPU) could not be had.
    #[error("KV memory: {0}")]
    Gpu(#[from] rnic::gpu::GpuError),
    /// A model or run configuration that cannot work.
    #[error("bad configuration: {reason}")]
    Config {
        /// What is wrong.
        reason: &'static str,
    },
    /// Opening the device failed.
    #[error("cannot open device {spec:?}: {reason}")]
    Open {
        /// The device spec.
        spec: String,
        /// Why.
        reason: String,
    },
    /// A verbs call failed.
    #[error("{op} failed: {source}")]
    Verbs {
        /// The operation.
        op: &'static str,
        /// The driver's error.
        source: rnic::core::VerbsError,
    },
    /// A region access failed.
    #[error("region access failed while {op}: {source}")]
    Memory {
        /// What was being done.
        op: &'static str,
        /// The bounds error.
        source: rnic::core::MemoryError,
    },
    /// Allocating the KV region failed.
    #[error("cannot allocate the {len}-byte KV region: {reason}")]
    Alloc {
        /// Bytes asked for.
        len: usize,
        /// Why.
        reason: String,
    },
    /// A socket operation of the out-of-band channel failed.
    #[error("TCP channel: {step}: {source}")]
    Io {
        /// What was being done.
        step: &'static str,
        /// The socket error.
        source: io::Error,
    },
    /// The peer sent something that is not the protocol.
    #[error("protocol error: {reason}")]
    Protocol {
        /// What was wrong.
        reason: String,
    },
    /// The two nodes disagree on the model or the cache layout.
    #[error(
        "layout mismatch on {field}: this node has {ours}, the peer has {theirs} (run both nodes with the same model config and seed)"
    )]
    LayoutMismatch {
        /// The field.
        field: &'static str,
        /// Our value.
        ours: String,
        /// The peer's value.
        theirs: String,
    },
    /// The peer refused our layout.
    #[error("the peer refused the connection; it says: {reason}")]
    Refused {
        /// The peer's reason.
        reason: String,
    },
    /// A wait ran past its deadline.
    #[error("timed out after {after:?} {what}")]
    Timeout {
        /// What was awaited.
        what: &'static str,
        /// The deadline.
        after: Duration,
    },
    /// The KV stream ended before its sentinel.
    #[error(
        "KV stream truncated: {received} of {expected} chunks arrived and no end-of-stream sentinel ({reason})"
    )]
    Truncated {
        /// Chunks that arrived.
        received: u32,
        /// Chunks the layout has.
        expected: u32,
        /// How the end was noticed.
        reason: String,
    },
    /// A work request completed in error.
    #[error("{what} completed with status {status} (wr_id {wr_id}){}", completion_hint(*status))]
    Completion {
        /// Which request.
        what: &'static str,
        /// Its wr_id.
        wr_id: u64,
        /// The status.
        status: rnic::core::WcStatus,
    },
}

fn completion_hint(status: rnic::core::WcStatus) -> &'static str {
    use rnic::core::WcStatus;
    match status {
        WcStatus::RetryExcErr | WcStatus::RnrRetryExcErr => {
            ": the peer stopped answering — is the other node alive?"
        }
        WcStatus::RemAccessErr => {
            ": the peer refused the access (wrong rkey or range in the layout?)"
        }
        _ => "",
    }
}

impl KvError {
    pub(crate) fn verbs(op: &'static str) -> impl FnOnce(rnic::core::VerbsError) -> KvError {
        move |source| KvError::Verbs { op, source }
    }

    pub(crate) fn mem(op: &'static str) -> impl FnOnce(rnic::core::MemoryError) -> KvError {
        move |source| KvError::Memory { op, source }
    }

    pub(crate) fn io(step: &'static str) -> impl FnOnce(io::Error) -> KvError {
        move |source| KvError::Io { step, source }
    }
}
