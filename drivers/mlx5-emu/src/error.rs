//! [`EmuError`]: what can stop the emulator from starting or serving.

use std::io;
use std::path::PathBuf;

use thiserror::Error;

/// Errors of rnic-mlx5-emu.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum EmuError {
    /// Creating the BAR0 memfd failed.
    #[error("creating BAR0 failed at {step}: {source}; check free memory")]
    Bar {
        /// The failed step.
        step: &'static str,
        /// The errno.
        #[source]
        source: nix::Error,
    },
    /// Something is already listening on the socket path.
    #[error(
        "{path} is in use: another rnic-mlx5-emu (or another server) is listening there; stop it \
         or choose another --socket path"
    )]
    SocketInUse {
        /// The path.
        path: PathBuf,
    },
    /// The socket path exists and is not a socket.
    #[error(
        "{path} exists and is not a socket: refusing to remove it; choose another --socket path"
    )]
    NotASocket {
        /// The path.
        path: PathBuf,
    },
    /// Inspecting or removing the socket path failed.
    #[error("{op} {path} failed: {source}")]
    Socket {
        /// What was attempted.
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The vfio-user server could not listen.
    #[error(
        "listening on {path} failed: {source}; check that the directory exists and is writable"
    )]
    Listen {
        /// The path.
        path: PathBuf,
        /// The crate's error.
        #[source]
        source: vfio_user::Error,
    },
    /// A UAR page index that is not a UAR page.
    #[error("page {page} is not a UAR page of BAR0 ({reason})")]
    UarPage {
        /// The page.
        page: u32,
        /// Why.
        reason: &'static str,
    },
    /// The port's Ethernet link could not be opened.
    #[error("opening the port's wire {wire} failed: {source}")]
    Wire {
        /// The wire (`--wire` syntax).
        wire: String,
        /// The cause (with what to do).
        #[source]
        source: io::Error,
    },
    /// Spawning a thread failed.
    #[error("spawning the {what} thread failed: {source}")]
    Thread {
        /// Which thread.
        what: &'static str,
        /// The cause.
        #[source]
        source: io::Error,
    },
}
