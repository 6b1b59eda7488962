//! [`Mlx5Error`]: one variant per failed operation, with context and a
//! message that says what to do.

use std::io;
use std::path::PathBuf;

use rnic_core::{Iova, PciAddr};
use thiserror::Error;

/// Everything that can fail in rnic-mlx5.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum Mlx5Error {
    /// The vfio-user socket could not be reached or the handshake failed.
    #[error(
        "cannot connect to the vfio-user device at {path}: is rnic-mlx5-emu running? start it \
         with `rnic-mlx5-emu --socket {path}`"
    )]
    Connect {
        /// The socket path.
        path: PathBuf,
        /// What the vfio-user client reported.
        #[source]
        source: vfio_user::Error,
    },
    /// A vfio-user request failed on the socket (the server went away?).
    #[error(
        "vfio-user {op} on {path} failed: the device process closed the connection or broke the \
         protocol; restart rnic-mlx5-emu and reconnect"
    )]
    Protocol {
        /// The request.
        op: &'static str,
        /// The socket path.
        path: PathBuf,
        /// What the vfio-user client reported.
        #[source]
        source: vfio_user::Error,
    },
    /// The device does not offer a region the driver needs, or offers it in
    /// a shape the driver cannot use.
    #[error("{function}: region {index}: {reason}")]
    Region {
        /// The function (PCI address or socket).
        function: String,
        /// The region index (0 = BAR0, 7 = config space).
        index: u32,
        /// What is wrong and what to do.
        reason: String,
    },
    /// mmap of a region or of shared memory failed.
    #[error("mmap of {len} bytes for {what} failed: {source}; check `ulimit -v` and free memory")]
    Mmap {
        /// What was being mapped.
        what: String,
        /// Bytes.
        len: usize,
        /// The errno.
        #[source]
        source: nix::Error,
    },
    /// A PCI config-space access failed.
    #[error("{function}: PCI config {op} of {len} bytes at {offset:#x} failed")]
    Config {
        /// The function.
        function: String,
        /// "read" or "write".
        op: &'static str,
        /// Offset in config space.
        offset: u16,
        /// Bytes.
        len: usize,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A PCI config access outside the config region.
    #[error("{function}: PCI config access at {offset:#x}+{len} is outside its {size} bytes")]
    ConfigRange {
        /// The function.
        function: String,
        /// Offset.
        offset: u16,
        /// Bytes.
        len: usize,
        /// Config-space size.
        size: u64,
    },
    /// Creating file-backed (memfd) device memory failed.
    #[error(
        "creating {len} bytes of memfd-backed device memory failed at {step}: {source}; check \
         free memory and RLIMIT_MEMLOCK"
    )]
    SharedMemory {
        /// Bytes asked for.
        len: usize,
        /// The failed step (memfd_create, ftruncate, seal, mmap).
        step: &'static str,
        /// The errno.
        #[source]
        source: nix::Error,
    },
    /// A device (IOMMU / vfio-user) DMA mapping failed.
    #[error("DMA map of {len} bytes at IOVA {iova} for {function} failed: {source}")]
    DmaMap {
        /// The function.
        function: String,
        /// Device address.
        iova: Iova,
        /// Bytes.
        len: u64,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// No IOVA space left for a DMA buffer.
    #[error(
        "no IOVA space for {len} bytes in {function}'s DMA buffer space: free buffers or use \
         fewer/larger ones"
    )]
    IovaExhausted {
        /// The function.
        function: String,
        /// Bytes asked for.
        len: u64,
        /// What the allocator said.
        #[source]
        source: rnic_dma::DmaError,
    },
    /// Fewer interrupt vectors than asked for.
    #[error("{function}: asked for {wanted} MSI-X vectors, the function has {count}")]
    Vectors {
        /// The function.
        function: String,
        /// Asked for.
        wanted: u32,
        /// Available.
        count: u32,
    },
    /// Creating an eventfd failed.
    #[error("eventfd for MSI-X vector {vector} failed: {source}; check the open-file limit")]
    Eventfd {
        /// The vector.
        vector: u32,
        /// The errno.
        #[source]
        source: nix::Error,
    },
    /// The function cannot be reset.
    #[error("{function} does not offer a function-level reset (VFIO_DEVICE_FLAGS_RESET is clear)")]
    ResetUnsupported {
        /// The function.
        function: String,
    },
    /// An operation of the kernel VFIO layer failed.
    #[error("VFIO {op} on {addr} failed")]
    Vfio {
        /// What was attempted.
        op: &'static str,
        /// The PCI function.
        addr: PciAddr,
        /// rnic-vfio's error (it says what to do).
        #[source]
        source: rnic_vfio::VfioError,
    },
    /// A BAR access through [`rnic_dma::Mmio`] was refused.
    #[error("BAR0 access refused")]
    Bar(#[source] rnic_dma::DmaError),
}
