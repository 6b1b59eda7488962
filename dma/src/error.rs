//! The crate's error type: one variant per failed operation, each with its
//! context and, where the user can do something about it, the fix.

use std::io;

use rnic_core::Iova;
use thiserror::Error;

use crate::numa::NodeId;
use crate::page::PageSize;

/// Everything that can go wrong in rnic-dma (except memory-key lookups, which
/// have the allocation-free, `Copy` [`KeyError`] for the hot path).
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum DmaError {
    /// A region of zero bytes (or one whose rounded size overflows) was asked for.
    #[error("allocate a DMA region of {len} bytes: the length must be non-zero and below 2^63")]
    InvalidLength {
        /// The requested length.
        len: usize,
    },

    /// `PagePolicy::Require` named a page size that could not be obtained.
    #[error(
        "allocate {len} bytes in {size} pages{node_note}: {reason}; {advice}",
        node_note = node.map(|n| format!(" on NUMA node {n}")).unwrap_or_default()
    )]
    PagesUnavailable {
        /// The required page size.
        size: PageSize,
        /// The requested length in bytes.
        len: usize,
        /// The node the pages were wanted on.
        node: Option<NodeId>,
        /// What failed (the kernel's answer or the pre-check's finding).
        reason: String,
        /// How to make the request succeed, e.g. the exact
        /// `echo N > /sys/.../nr_hugepages` command.
        advice: String,
    },

    /// A system call that the allocation chain does not fall back from failed.
    #[error("{op} on [{addr:#x}, +{len:#x}): {source}")]
    Syscall {
        /// The call (`munmap`, `mbind`, `move_pages`, ...).
        op: &'static str,
        /// Start of the range it worked on (0 when none).
        addr: usize,
        /// Length of that range.
        len: usize,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },

    /// Binding the region's memory to a NUMA node with `mbind(MPOL_BIND)` failed.
    #[error(
        "bind {len} bytes to NUMA node {node} with mbind(MPOL_BIND): {source}; \
         check the node is online (cat /sys/devices/system/node/online)"
    )]
    Mbind {
        /// The wanted node.
        node: NodeId,
        /// Length of the range.
        len: usize,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },

    /// A NUMA node that is not online (or does not exist) was asked for.
    #[error(
        "place memory on NUMA node {node}: the node is not online (online nodes: {online}); \
         pick one of those, or omit the node to let the kernel choose"
    )]
    NodeNotOnline {
        /// The requested node.
        node: NodeId,
        /// The online nodes as the kernel lists them (`0-1`).
        online: String,
    },

    /// Reading the NUMA node of a PCI device from sysfs failed.
    #[error("read the NUMA node of PCI device {bdf} from {path}: {reason}")]
    PciNode {
        /// The device address as given.
        bdf: String,
        /// The sysfs file read.
        path: String,
        /// What went wrong.
        reason: String,
    },

    /// Verifying placement found pages off the wanted node and the placement
    /// policy says that is an error.
    #[error(
        "verify placement on NUMA node {wanted}: only {on_wanted} of {checked} pages are there \
         ({elsewhere} elsewhere, {absent} not present); free memory on node {wanted} \
         (numastat -m) or use OnMismatch::Warn"
    )]
    PlacementMismatch {
        /// The wanted node.
        wanted: NodeId,
        /// Pages queried with move_pages.
        checked: u64,
        /// Pages found on the wanted node.
        on_wanted: u64,
        /// Pages found on another node.
        elsewhere: u64,
        /// Pages the kernel reported as not present (or not queryable).
        absent: u64,
    },

    /// Pinning would exceed `RLIMIT_MEMLOCK`.
    #[error(
        "pin {request} bytes with mlock: RLIMIT_MEMLOCK is {limit} bytes and {locked} are already \
         locked (the process lacks CAP_IPC_LOCK); raise the limit: `ulimit -l unlimited` in the \
         shell, `<user> - memlock unlimited` in /etc/security/limits.conf, or `LimitMEMLOCK=infinity` \
         in the systemd unit (or build the region with .pin(false))"
    )]
    MemlockLimit {
        /// Bytes asked to pin.
        request: u64,
        /// The soft limit.
        limit: u64,
        /// Bytes this process has locked already (`VmLck`).
        locked: u64,
    },

    /// `mlock` itself failed (after the limit check passed).
    #[error("pin {len} bytes at {addr:#x} with mlock: {source}; check `ulimit -l` and free memory")]
    Mlock {
        /// Start of the range.
        addr: usize,
        /// Length of the range.
        len: usize,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },

    /// Faulting in the region's pages failed (no memory on the bound node, or
    /// the hugepage pool ran dry).
    #[error(
        "fault in {len} bytes of {size} pages{node_note} (madvise(MADV_POPULATE_WRITE)): {source}; \
         free memory{node_note} or reserve more hugepages",
        node_note = node.map(|n| format!(" on NUMA node {n}")).unwrap_or_default()
    )]
    Populate {
        /// The page size in use.
        size: PageSize,
        /// Length of the range.
        len: usize,
        /// The bound node, if any.
        node: Option<NodeId>,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },

    /// No free IOVA range of the size and alignment asked for.
    #[error(
        "allocate {len:#x} bytes of IOVA aligned to {align:#x}: no free range is large enough \
         ({free:#x} bytes free in total); free regions or widen the apertures"
    )]
    IovaExhausted {
        /// Requested length.
        len: u64,
        /// Requested alignment.
        align: u64,
        /// Total free IOVA space.
        free: u64,
    },

    /// An IOVA request with a zero length or an alignment that is not a power of two.
    #[error(
        "allocate {len:#x} bytes of IOVA aligned to {align:#x}: length must be non-zero and alignment a power of two"
    )]
    IovaRequest {
        /// Requested length.
        len: u64,
        /// Requested alignment.
        align: u64,
    },

    /// Freeing an IOVA that is not the start of an allocated range.
    #[error("free IOVA {iova}: it is not the start of an allocated range (double free?)")]
    IovaFree {
        /// The address given.
        iova: Iova,
    },

    /// The device mapper refused to map the region.
    #[error("map {len:#x} bytes at host {host:#x} to IOVA {iova} for the device: {source}")]
    DeviceMap {
        /// The IOVA.
        iova: Iova,
        /// Host virtual address.
        host: usize,
        /// Length.
        len: u64,
        /// The mapper's answer (for VFIO: the ioctl's errno).
        #[source]
        source: io::Error,
    },

    /// A peer BAR window that the IOMMU cannot map as asked.
    #[error(
        "map a peer BAR window at offset {offset:#x}, {len:#x} bytes, of a {bar_len:#x}-byte BAR: \
         {reason}"
    )]
    PeerWindow {
        /// Offset in the BAR.
        offset: u64,
        /// Length asked for.
        len: u64,
        /// The BAR mapping's length.
        bar_len: u64,
        /// What is wrong and what to do.
        reason: String,
    },

    /// A region access (`read`/`write`/atomic) fell outside the region.
    #[error(
        "access {len} bytes at offset {offset:#x} of a {region_len}-byte region: out of bounds"
    )]
    OutOfBounds {
        /// Offset of the access.
        offset: u64,
        /// Length of the access.
        len: u64,
        /// Length of the region (or MMIO window).
        region_len: u64,
    },

    /// An atomic or MMIO access at an offset not aligned to its width.
    #[error("access {width} bytes at offset {offset:#x}: not {width}-byte aligned")]
    Misaligned {
        /// Offset of the access.
        offset: u64,
        /// Width (and required alignment) in bytes.
        width: u64,
    },

    /// Registering a memory key failed: the range does not lie in the region,
    /// or the table is full.
    #[error("register memory key: {reason}")]
    Register {
        /// What was wrong.
        reason: String,
    },

    /// Registering a memory key with access flags that break the ibverbs
    /// rule (remote write or atomic without local write).
    #[error("register memory key: {source}")]
    RegisterAccess {
        /// rnic-core's refusal, which names the fix.
        #[source]
        source: rnic_core::AccessError,
    },

    /// A memory-key lookup failed.
    #[error(transparent)]
    Key(#[from] KeyError),
}

/// Why a memory-key lookup was refused. `Copy` and allocation-free: the
/// responder calls [`crate::keys::KeyTable::lookup`] on every remote access.
///
/// Each variant maps onto the NAK/completion status a transport reports:
/// all are "remote access error" (NAK code 2 / `IBV_WC_REM_ACCESS_ERR`) for a
/// remote key and "local protection error" (`IBV_WC_LOC_PROT_ERR`) for a local one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum KeyError {
    /// No live registration has this key's index.
    #[error("memory key {key:#010x}: no registration at index {index}")]
    Unknown {
        /// The raw key.
        key: u32,
        /// Its index part.
        index: u32,
    },
    /// The index is registered, but with another key byte: the key is stale
    /// (the registration it named was invalidated) or guessed.
    #[error(
        "memory key {key:#010x}: stale or guessed key byte (index {index} is live with another key)"
    )]
    Stale {
        /// The raw key.
        key: u32,
        /// Its index part.
        index: u32,
    },
    /// The key belongs to another protection domain.
    #[error("memory key {key:#010x}: registered in PD {registered}, used from PD {used}")]
    WrongPd {
        /// The raw key.
        key: u32,
        /// The PD the key was registered in.
        registered: u32,
        /// The PD it was used from.
        used: u32,
    },
    /// The registration does not grant the requested access.
    #[error("memory key {key:#010x}: access {wanted:#x} requested, only {granted:#x} granted")]
    AccessDenied {
        /// The raw key.
        key: u32,
        /// The requested access bits (ibverbs values).
        wanted: u32,
        /// The granted access bits.
        granted: u32,
    },
    /// `va + len` overflows 64 bits.
    #[error("memory key {key:#010x}: range {va:#x} + {len:#x} overflows")]
    Overflow {
        /// The raw key.
        key: u32,
        /// Start address.
        va: u64,
        /// Length.
        len: u64,
    },
    /// The range does not lie inside the registration's `[start, start + len)`.
    #[error(
        "memory key {key:#010x}: range [{va:#x}, +{len:#x}) is outside the registered [{start:#x}, +{reg_len:#x})"
    )]
    OutOfRange {
        /// The raw key.
        key: u32,
        /// Start of the access.
        va: u64,
        /// Length of the access.
        len: u64,
        /// Start of the registered range.
        start: u64,
        /// Length of the registered range.
        reg_len: u64,
    },
    /// A peer asked (SEND_WITH_INVALIDATE) to invalidate a registration that
    /// only its owner may end. As in kernel rxe (`rxe_invalidate_mr`), only
    /// fast-registration MRs and type-2 memory windows are remotely
    /// invalidatable; an ordinary `reg_mr` registration is not.
    #[error(
        "memory key {key:#010x}: a {kind} registration cannot be invalidated by a peer (only fast-registration MRs and type-2 memory windows can)"
    )]
    NotRemotelyInvalidatable {
        /// The raw key.
        key: u32,
        /// What the key names.
        kind: crate::keys::MrKind,
    },
}
