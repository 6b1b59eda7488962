//! Interim memory-access flags and PD id, until rnic-core's
//! `access::AccessFlags` and `provider::PdHandle` are committed.
//!
//! Same bit values as `enum ibv_access_flags` (and as rnic-core's type), so
//! the switch is a `pub use` here and nothing else changes.

use bitflags::bitflags;

bitflags! {
    /// Access rights of a registration (`IBV_ACCESS_*` values).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct AccessFlags: u32 {
        /// The local device may write into the region. `IBV_ACCESS_LOCAL_WRITE` = 1.
        const LOCAL_WRITE = 1;
        /// A peer may RDMA-write into the region. `IBV_ACCESS_REMOTE_WRITE` = 2.
        const REMOTE_WRITE = 1 << 1;
        /// A peer may RDMA-read from the region. `IBV_ACCESS_REMOTE_READ` = 4.
        const REMOTE_READ = 1 << 2;
        /// A peer may run atomics on the region. `IBV_ACCESS_REMOTE_ATOMIC` = 8.
        const REMOTE_ATOMIC = 1 << 3;
    }
}

impl AccessFlags {
    /// The ibverbs rule: `REMOTE_WRITE` or `REMOTE_ATOMIC` need `LOCAL_WRITE`.
    pub fn is_valid_for_mr(self) -> bool {
        !self.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
            || self.contains(AccessFlags::LOCAL_WRITE)
    }
}

/// A protection domain's id (rnic-core's `PdHandle` has the same shape).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PdId(pub u32);
