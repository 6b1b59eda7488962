//! rnicctl's errors: each says what failed and what to do about it.

use std::io;
use std::path::PathBuf;

/// Everything a command can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CtlError {
    /// Bad or conflicting options.
    #[error("{0}")]
    Usage(String),
    /// Opening a device spec failed.
    #[error("couldn't open {spec}: {why}")]
    Open {
        /// The spec.
        spec: String,
        /// Why.
        why: String,
    },
    /// A verbs call failed.
    #[error("{what}: {why}")]
    Verbs {
        /// The step.
        what: &'static str,
        /// The provider's error.
        why: String,
    },
    /// A work request completed in error.
    #[error(
        "completion with status {status} ({raw}) for wr_id {wr_id}: the peer refused or lost the request (check both sides use the same test, -s and -q; `rnicctl perf ... --stats` shows NAKs and retransmits)"
    )]
    Completion {
        /// Status name.
        status: String,
        /// Raw ibverbs status.
        raw: u32,
        /// The request.
        wr_id: u64,
    },
    /// Nothing happened for too long.
    #[error(
        "no progress for 30 s while {0}: is the peer still running, and can its UDP 4791 reach this host?"
    )]
    Stalled(&'static str),
    /// The TCP exchange connection could not be made.
    #[error(
        "couldn't connect to {host}:{port}: {source} (start the server side first: `rnicctl perf <test>` or a stock ib_*_bw/lat without a host)"
    )]
    Connect {
        /// Host.
        host: String,
        /// Port.
        port: u16,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// The exchange port could not be listened on.
    #[error(
        "couldn't listen on TCP port {port}: {source} (another perftest server running? pick one with -p)"
    )]
    Listen {
        /// Port.
        port: u16,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// The peer closed the exchange connection early.
    #[error(
        "the peer closed the exchange connection early (it failed or was interrupted; see its output)"
    )]
    PeerClosed,
    /// The perftest exchange failed.
    #[error(transparent)]
    Wire(#[from] crate::perf::wire::WireError),
    /// Some other I/O failed.
    #[error("{what}: {source}")]
    Io {
        /// The step.
        what: &'static str,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// A sysfs file could not be read or written.
    #[error("{path}: {source}{hint}")]
    Sysfs {
        /// The file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: io::Error,
        /// What to do.
        hint: &'static str,
    },
    /// Binding was refused for safety.
    #[error("refusing to bind {bdf}: {why}")]
    Refused {
        /// The function.
        bdf: String,
        /// Why, and how to override.
        why: String,
    },
    /// A VFIO/sysfs step failed (rnic-vfio's message says what to do).
    #[error(transparent)]
    Vfio(#[from] rnic_vfio::VfioError),
    /// An `emu` command failed.
    #[error(transparent)]
    Emu(#[from] crate::emu::EmuError),
    /// A topology query failed (hwloc).
    #[error(transparent)]
    Topo(#[from] rnic_gpu::topo::TopoError),
    /// `doctor` found failures.
    #[error("{0} check(s) failed; apply the fixes above")]
    DoctorFailed(usize),
}
