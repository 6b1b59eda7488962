//! [`Mlx5Error`]: one variant per failed operation, with context and a
//! message that says what to do.

use std::io;
use std::path::PathBuf;

use std::time::Duration;

use rnic_core::{Iova, MemoryError, PciAddr};
use rnic_mlx5_prm::{CmdOpcode, CmdStatus, DeliveryStatus};
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
    /// The vfio-user server accepted the connection but did not answer the
    /// handshake: it is serving another driver (one at a time, as a VFIO
    /// device opens once).
    #[error(
        "the vfio-user device at {path} did not answer within {after:?}: it is serving another \
         driver (an emulated function, like a VFIO device, has one owner at a time); stop the \
         other process, start another emulated function (rnicctl emu start --name <n>), or open \
         the spec once in this process and share it"
    )]
    ServerBusy {
        /// The socket path.
        path: PathBuf,
        /// How long the handshake was given.
        after: std::time::Duration,
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
    /// Application memory (memory the driver did not allocate) cannot be
    /// registered in place; nothing was changed.
    #[error(
        "cannot register {len} bytes of application memory at {addr:#x} on {function}: {problem}"
    )]
    UserMemory {
        /// The function.
        function: String,
        /// The range's first byte.
        addr: usize,
        /// Its length.
        len: usize,
        /// What is wrong, and the fix.
        problem: UserMemoryProblem,
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
    /// A system resource of the driver itself (a thread, an eventfd) could
    /// not be had.
    #[error("{what} failed: {source}; check the process's thread and open-file limits")]
    Io {
        /// What was being set up.
        what: &'static str,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The port is not an Ethernet port, so RoCE cannot be set up on it
    /// (RC mlx5_vfio.c:2220 enables RoCE only on Ethernet; audit row 9).
    #[error(
        "{function}: the port is {port_type}, not Ethernet, so RoCE cannot run on it; set the \
         port to Ethernet (mlxconfig -d <device> set LINK_TYPE_P1=2, then reset the card) and \
         bring the function up again"
    )]
    PortType {
        /// The function.
        function: String,
        /// What the general capabilities report.
        port_type: crate::PortType,
    },
    /// A GID index beyond the port's GID table (RoCE cap
    /// `roce_address_table_size`).
    #[error("GID index {index} is beyond the port's GID table of {size} entries; use 0..{size}")]
    GidIndex {
        /// Asked for.
        index: u16,
        /// The table's size.
        size: u32,
    },
    /// No destination MAC could be found for a peer (audit row 7): the
    /// driver never sends to its own MAC or to zeros instead.
    #[error(
        "no MAC address for peer {ip} ({why}): add a static neighbour (Hca::add_neighbour, or \
         `neigh=<ip>/<mac>` in the device spec), pass the peer's dmac, or let the host kernel \
         resolve it (HcaOptions::neighbours.host_kernel, `neigh=host` in the spec) when the host \
         has an interface on the port's network"
    )]
    NoNeighbour {
        /// The peer's address.
        ip: std::net::IpAddr,
        /// What was tried.
        why: String,
    },
    /// The kernel would not let the driver pin or map what the function
    /// needs (audit row 23).
    #[error("{function}: {needed} needed, {what} allows {limit}: {fix}")]
    DmaBudget {
        /// The function.
        function: String,
        /// Which limit.
        what: &'static str,
        /// What bring-up or the firmware's request needs (bytes or mappings).
        needed: u64,
        /// The limit.
        limit: u64,
        /// How to raise it.
        fix: &'static str,
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
    /// The firmware executed a command and reported a failure status
    /// (mlx5.md §4.3: output byte 0 and the syndrome at byte 4).
    #[error(
        "{opcode} (op_mod {op_mod:#x}) failed with status {status}, syndrome {syndrome:#010x}: \
         {}",
        command_advice(*.status)
    )]
    Command {
        /// The command.
        opcode: CmdOpcode,
        /// Its op_mod.
        op_mod: u16,
        /// The command status (output byte 0).
        status: CmdStatus,
        /// The firmware-specific syndrome (undocumented publicly; quote it in reports).
        syndrome: u32,
    },
    /// The command transport rejected the entry before the firmware ran it
    /// (delivery status, `status_own >> 1`, mlx5.md §4.3 step 6).
    #[error(
        "{opcode} was not delivered: delivery status {status}; this is a driver/device \
         disagreement about the command layout (entry, mailbox chain, token or alignment) — \
         report it with the opcode and status"
    )]
    Delivery {
        /// The command.
        opcode: CmdOpcode,
        /// The delivery status.
        status: DeliveryStatus,
    },
    /// The device did not hand a command back within the timeout. The slot
    /// stays reserved until the device clears its ownership bit.
    #[error(
        "{opcode} in command slot {slot} got no completion after {after:?}: the slot stays \
         reserved until the device returns it; if this repeats the firmware is hung — read the \
         health buffer and reset the function (Hca::bring_up resets it)"
    )]
    CommandTimeout {
        /// The command.
        opcode: CmdOpcode,
        /// The slot it occupies.
        slot: usize,
        /// How long the driver waited.
        after: Duration,
    },
    /// Every command slot is still owned by the device after timeouts.
    #[error(
        "cannot post {opcode}: all {slots} command slots are still owned by the device after \
         earlier timeouts; reset the function and bring it up again"
    )]
    NoCommandSlot {
        /// The command that could not be posted.
        opcode: CmdOpcode,
        /// Slots in the queue.
        slots: usize,
    },
    /// The device's reply contradicts what was posted (a broken or hostile
    /// device): token, output length or mailbox block number changed.
    #[error(
        "{opcode}: the device's reply is inconsistent ({what}: posted {posted:#x}, found \
         {found:#x}); the output was discarded — the device or its firmware is faulty"
    )]
    Reply {
        /// The command.
        opcode: CmdOpcode,
        /// Which field disagrees ("entry token", "output length", "output block 2 token" …).
        what: String,
        /// The value the driver posted.
        posted: u64,
        /// The value the device left.
        found: u64,
    },
    /// The caller's command buffer cannot be posted.
    #[error("{opcode}: {reason}")]
    CommandInput {
        /// The command.
        opcode: CmdOpcode,
        /// What is wrong.
        reason: String,
    },
    /// A PRM field could not be written or read (value too wide, short buffer).
    #[error("{what}: {source}")]
    Prm {
        /// The structure or step.
        what: &'static str,
        /// The PRM crate's error (it names the field).
        #[source]
        source: rnic_mlx5_prm::Error,
    },
    /// An access to driver-owned DMA memory (command queue, mailboxes) was refused.
    #[error("{what}: {source}")]
    DmaAccess {
        /// What was accessed.
        what: &'static str,
        /// The refusal.
        #[source]
        source: MemoryError,
    },
    /// The initialization segment holds values the driver cannot use.
    #[error("{function}: initialization segment: {reason}")]
    InitSegment {
        /// The function.
        function: String,
        /// What is wrong and what to do.
        reason: String,
    },
    /// The command interface revision is not the one this driver speaks.
    #[error(
        "{function}: command interface revision {found} (cmdif_rev_fw_sub >> 16), this driver \
         speaks revision {expected}; update the firmware or use a driver for this revision \
         (0xffff means the device does not answer: check the PCI link and reset it)"
    )]
    CmdifRev {
        /// The function.
        function: String,
        /// What the device reported.
        found: u32,
        /// What the driver needs (5).
        expected: u32,
    },
    /// The firmware kept `initializing` set past the timeout.
    #[error(
        "{function}: firmware still initializing after {after:?} ({stage}); the device may be \
         hung or still booting — check the health buffer, reset the function, or raise the \
         timeout in HcaOptions"
    )]
    FirmwareInit {
        /// The function.
        function: String,
        /// Which wait ("before the command queue", "after the command queue address").
        stage: &'static str,
        /// How long the driver waited.
        after: Duration,
    },
    /// The firmware supports no ISSI this driver speaks (0 or 1).
    #[error(
        "the firmware's supported ISSI mask is {supported:#x}: this driver speaks ISSI 1 (or 0); \
         update the firmware"
    )]
    Issi {
        /// `supported_issi_dw0` from QUERY_ISSI.
        supported: u32,
    },
    /// The firmware asked for (or returned) pages in a way the driver refuses.
    #[error("{function}: page management: {reason}")]
    Pages {
        /// The function.
        function: String,
        /// What happened and what to do.
        reason: String,
    },
    /// A CQ was asked for before the event queue it must name (§7.2).
    #[error("no event queue: call Hca::enable_events before creating CQs (a CQ names its EQ)")]
    NoEventQueue,
    /// A queue larger than the function allows, or of no valid size.
    #[error("{what} of {asked} entries: the function allows at most {max}; ask for fewer")]
    QueueSize {
        /// CQ or QP.
        what: &'static str,
        /// Entries asked for.
        asked: u32,
        /// The limit.
        max: u32,
    },
    /// QP creation options the driver does not support.
    #[error("QP options: {reason}")]
    QpOptions {
        /// What is wrong and what to do.
        reason: String,
    },
    /// A send request could not be posted; those before it were.
    #[error("post_send: request {index} not posted: {reason}")]
    PostSend {
        /// Index of the failed request in the batch.
        index: usize,
        /// Why.
        reason: PostFailure,
    },
    /// A receive request could not be posted; those before it were.
    #[error("post_recv: request {index} not posted: {reason}")]
    PostRecv {
        /// Index of the failed request in the batch.
        index: usize,
        /// Why.
        reason: PostFailure,
    },
    /// The function is in a fatal state (§2): no command is sent any more.
    #[error(
        "the function is in a fatal state ({}): its QPs are in ERR and their work is flushed; \
         drop every object, then reset the function and bring it up again",
        fatal_cause(syndrome, *counter_stuck, nic_state)
    )]
    DeviceFatal {
        /// The health syndrome, if one is set.
        syndrome: Option<rnic_mlx5_prm::HealthSyndrome>,
        /// The health counter stopped.
        counter_stuck: bool,
        /// The NIC interface state, when it is what made the function fatal
        /// (disabled, SW reset: a firmware reset from elsewhere).
        nic_state: Option<rnic_mlx5_prm::NicState>,
    },
}

/// Why a function is fatal, in words.
fn fatal_cause(
    syndrome: &Option<rnic_mlx5_prm::HealthSyndrome>,
    counter_stuck: bool,
    nic_state: &Option<rnic_mlx5_prm::NicState>,
) -> String {
    let mut why = Vec::new();
    if let Some(s) = syndrome {
        why.push(format!("health syndrome {s} with reset required"));
    }
    if let Some(n) = nic_state {
        why.push(format!("NIC interface {n}"));
    }
    if counter_stuck {
        why.push("health counter stopped".to_string());
    }
    if why.is_empty() {
        why.push("found fatal earlier".to_string());
    }
    why.join(", ")
}

/// What to do about a failed command, per status (mlx5.md §4.3).
fn command_advice(status: CmdStatus) -> &'static str {
    match status {
        CmdStatus::BadOp => {
            "the firmware does not implement this opcode (older firmware, or a function without \
             the capability): check the capabilities before using it"
        }
        CmdStatus::BadParam => {
            "an input field is out of range or unsupported: check the values against \
             QUERY_HCA_CAP's limits"
        }
        CmdStatus::BadSysState => {
            "the function is in the wrong state for this command (e.g. INIT_HCA twice, or before \
             ENABLE_HCA): reset the function and bring it up again"
        }
        CmdStatus::BadRes => {
            "the object number does not exist or belongs to another function/uid: check the \
             handle"
        }
        CmdStatus::ResBusy => "the object is still in use: destroy what refers to it first",
        CmdStatus::ExceedLim => {
            "a firmware limit was reached: free objects or ask for less (see the log_max_* \
             capabilities)"
        }
        CmdStatus::BadResState => "the object is in the wrong state for this command",
        CmdStatus::BadIndex => "an index is outside its table",
        CmdStatus::NoRes => {
            "the firmware is out of resources: give it more pages (QUERY_PAGES) or free objects"
        }
        CmdStatus::BadInpLen | CmdStatus::BadOutpLen => {
            "the command's input/output length is not what the firmware expects: a driver bug or \
             an ISSI/firmware mismatch — report it with the opcode"
        }
        CmdStatus::IntErr => {
            "firmware internal error: read the health buffer and reset the function"
        }
        CmdStatus::BadQpState => "the QP is in the wrong state for this transition",
        _ => "quote the status and syndrome when reporting it",
    }
}

impl From<Refused> for Mlx5Error {
    /// The direct fast path's refusal as the general path reports it (one
    /// request, index 0).
    fn from(r: Refused) -> Mlx5Error {
        Mlx5Error::PostSend {
            index: 0,
            reason: r.into(),
        }
    }
}

/// Why a work request could not be posted (no allocation: the hot path's
/// errors are `Copy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PostFailure {
    /// The send or receive queue has no room for the request.
    #[error("the queue is full ({outstanding} outstanding); poll the CQ and retry")]
    QueueFull {
        /// Entries (WQEBBs for the SQ, WQEs for the RQ) still owned by the device.
        outstanding: u32,
    },
    /// More SGEs than the queue was created for.
    #[error("{got} SGEs, the queue takes at most {max}")]
    TooManySge {
        /// SGEs in the request.
        got: usize,
        /// The queue's limit.
        max: usize,
    },
    /// The inline payload is larger than the queue's `max_inline_data`.
    #[error("{got} inline bytes, the queue takes at most {max}")]
    InlineTooLong {
        /// Bytes asked for.
        got: usize,
        /// The queue's limit.
        max: usize,
    },
    /// An inline SGE lies outside every region the QP was given with `Qp::use_region`.
    #[error(
        "inline SGE at {addr:#x} (+{len}) under lkey {lkey:#x} is in no region of this QP; call Qp::use_region"
    )]
    InlineRegion {
        /// Address of the SGE.
        addr: u64,
        /// Length.
        len: u32,
        /// Its lkey.
        lkey: u32,
    },
    /// A UD send whose vector names neither a `dmac` nor a link-local GID:
    /// the post path resolves no neighbours (audit row 7).
    #[error(
        "the UD destination {dgid} has no destination MAC: create an address handle (which \
         resolves the neighbour) or give the vector's dmac"
    )]
    UnresolvedMac {
        /// The destination GID.
        dgid: rnic_core::Gid,
    },
    /// The operation does not exist on this QP type (RDMA on UD, …).
    #[error("{op} is not supported on this QP type")]
    Unsupported {
        /// The operation's name.
        op: &'static str,
    },
    /// An atomic needs exactly one 8-byte SGE and an 8-byte aligned remote address.
    #[error("an atomic needs one 8-byte SGE and an 8-byte aligned remote address")]
    BadAtomic,
    /// A UD send without its destination.
    #[error("a UD send needs `SendWr::ud`")]
    NoUdDest,
    /// The QP is not in a state that accepts this queue's requests.
    #[error("the QP is in state {state}; sends need RTS, receives INIT or later")]
    BadState {
        /// The state's name.
        state: &'static str,
    },
    /// The function is in a fatal state (health syndrome): nothing is posted.
    #[error(
        "the device is in a fatal state; every QP is in ERR, poll the CQs for flushed completions"
    )]
    DeviceFatal,
}

/// Why the direct fast path ([`crate::Qp::post_write_inline`]) posted
/// nothing: the [`PostFailure`]s that path can meet, small and `Copy` so
/// that it comes back in a register (8 bytes with its `Result`: a refusal
/// costs the hot path no stack frame). Its message is the [`PostFailure`]'s; `PostFailure::from` and
/// `Mlx5Error::from` turn it into the general path's error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// [`PostFailure::QueueFull`].
    QueueFull {
        /// WQEBBs still owned by the device.
        outstanding: u32,
    },
    /// [`PostFailure::InlineTooLong`].
    InlineTooLong {
        /// Bytes asked for (at most [`crate::rdma::wq::FAST_INLINE_MAX`]).
        got: u16,
        /// The queue's limit (at most [`crate::rdma::wqe::MAX_INLINE_DATA`]).
        max: u16,
    },
    /// [`PostFailure::BadState`]: the QP is not in RTS.
    BadState {
        /// The QP's state.
        state: rnic_mlx5_prm::QpState,
    },
    /// [`PostFailure::Unsupported`]: an RDMA WRITE on a UD QP.
    WriteOnUd,
    /// [`PostFailure::DeviceFatal`].
    DeviceFatal,
}

impl From<Refused> for PostFailure {
    fn from(r: Refused) -> PostFailure {
        match r {
            Refused::QueueFull { outstanding } => PostFailure::QueueFull { outstanding },
            Refused::InlineTooLong { got, max } => PostFailure::InlineTooLong {
                got: usize::from(got),
                max: usize::from(max),
            },
            Refused::BadState { state } => PostFailure::BadState {
                state: state.name().unwrap_or("?"),
            },
            Refused::WriteOnUd => PostFailure::Unsupported { op: "RDMA WRITE" },
            Refused::DeviceFatal => PostFailure::DeviceFatal,
        }
    }
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        PostFailure::from(*self).fmt(f)
    }
}

impl std::error::Error for Refused {}

/// Why a range of application memory cannot be registered in place
/// (`PciFunction::map_user`).
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum UserMemoryProblem {
    /// Zero bytes, or a range starting at address 0.
    #[error(
        "the range is empty or starts at address 0: register at least one byte of mapped memory"
    )]
    Empty,
    /// A page of the range is not mapped, or not readable.
    #[error(
        "{at:#x} is not mapped (or not readable): register memory the process has mapped \
         readable, and keep it mapped until it is deregistered"
    )]
    Unmapped {
        /// The first page found missing.
        at: usize,
    },
    /// A page is read-only and the region grants write access.
    #[error(
        "{at:#x} is read-only and the region grants write access: register it without \
         LOCAL_WRITE / REMOTE_WRITE / REMOTE_ATOMIC, or make it writable first (mprotect)"
    )]
    ReadOnly {
        /// The first read-only page.
        at: usize,
    },
    /// Over vfio-user: a page lies in a `MAP_SHARED` mapping the driver did
    /// not make.
    #[error(
        "{at:#x} lies in a MAP_SHARED mapping the driver did not make: a vfio-user device reaches \
         only pages shared with it by file descriptor, and moving a shared mapping onto a memfd \
         would break its sharing; register private memory (malloc, an anonymous mmap) or a \
         buffer from Mlx5Provider::alloc_dma"
    )]
    Shared {
        /// The first such page.
        at: usize,
    },
    /// Over vfio-user: a page lies in anonymous hugetlb memory.
    #[error(
        "{at:#x} lies in hugetlb memory (MAP_HUGETLB): over vfio-user the driver moves registered \
         pages onto a 4 KiB memfd, which cannot replace part of a huge page; register 4 KiB \
         private memory or a buffer from Mlx5Provider::alloc_dma (hugepage-backed when the pool \
         has room); a function bound to vfio-pci pins hugetlb memory in place"
    )]
    Hugetlb {
        /// The first such page.
        at: usize,
    },
    /// The region's address and the memory's address differ within a page.
    #[error(
        "the region's address {va:#x} and the memory's address {addr:#x} differ in their offset \
         within a 4 KiB page: an MTT translates whole pages, so pick an address (iova) with the \
         same low 12 bits as the memory's"
    )]
    PageOffset {
        /// The memory's host address.
        addr: usize,
        /// The address the region was to have.
        va: u64,
    },
    /// `/proc/self/maps` could not be read.
    #[error("/proc/self/maps could not be read ({source}): is /proc mounted?")]
    Maps {
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Over vfio-user: moving the range's pages onto a memfd failed (the
    /// range is as it was).
    #[error(
        "moving the pages onto a shareable memfd failed at {step} ({source}): check free memory \
         and the process's mapping limit (vm.max_map_count)"
    )]
    Share {
        /// The failed step.
        step: &'static str,
        /// The errno.
        #[source]
        source: nix::Error,
    },
}
