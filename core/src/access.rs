//! Access rights of memory regions and queue pairs.
//!
//! [`AccessFlags`] carries the ibverbs bit values (`IBV_ACCESS_*`), so a flag
//! word can cross to and from a C peer, a firmware command or a trace without
//! translation. A memory region's flags say what the device may do with its
//! bytes; a queue pair's flags say which incoming remote operations the
//! responder serves.
//!
//! The ibverbs rule for memory regions is enforced by [`AccessFlags::validate`]:
//! a region the peer may write into (`REMOTE_WRITE`) or run atomics on
//! (`REMOTE_ATOMIC`) must also be locally writable (`LOCAL_WRITE`), because the
//! device writes into it on the peer's behalf.

use std::fmt;

use bitflags::bitflags;
use thiserror::Error;

bitflags! {
    /// Access rights (`enum ibv_access_flags`; same bit values).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct AccessFlags: u32 {
        /// The local device may write into the region (receives, RDMA read
        /// responses, atomic results land here). `IBV_ACCESS_LOCAL_WRITE` = 1.
        const LOCAL_WRITE = 1;
        /// A peer may RDMA-write into the region. `IBV_ACCESS_REMOTE_WRITE` = 2.
        const REMOTE_WRITE = 1 << 1;
        /// A peer may RDMA-read from the region. `IBV_ACCESS_REMOTE_READ` = 4.
        const REMOTE_READ = 1 << 2;
        /// A peer may run atomics (compare-and-swap, fetch-and-add) on the
        /// region. `IBV_ACCESS_REMOTE_ATOMIC` = 8.
        const REMOTE_ATOMIC = 1 << 3;
    }
}

/// Why a set of access flags was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum AccessError {
    /// Validating the flags of a memory region found a remote write or atomic
    /// right without the local write right it depends on.
    #[error(
        "access flags {flags} grant REMOTE_WRITE or REMOTE_ATOMIC without LOCAL_WRITE; \
         add AccessFlags::LOCAL_WRITE (ibverbs refuses this combination with EINVAL)"
    )]
    MissingLocalWrite {
        /// The refused flags.
        flags: AccessFlags,
    },
    /// Converting a raw flag word found bits rnic does not know.
    #[error(
        "access flag word {raw:#x} has unknown bits {unknown:#x}; \
         only LOCAL_WRITE (1), REMOTE_WRITE (2), REMOTE_READ (4), REMOTE_ATOMIC (8) exist"
    )]
    UnknownBits {
        /// The raw word.
        raw: u32,
        /// The bits outside the known set.
        unknown: u32,
    },
}

impl AccessFlags {
    /// Everything a region can grant: local write, remote read, write and atomics.
    pub const ALL_REMOTE: AccessFlags = AccessFlags::all();

    /// Check the ibverbs rule for memory regions: `REMOTE_WRITE` or
    /// `REMOTE_ATOMIC` require `LOCAL_WRITE`.
    pub fn validate(self) -> Result<AccessFlags, AccessError> {
        let needs_local = self.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC);
        if needs_local && !self.contains(AccessFlags::LOCAL_WRITE) {
            Err(AccessError::MissingLocalWrite { flags: self })
        } else {
            Ok(self)
        }
    }

    /// Flags from a raw ibverbs word, refusing unknown bits.
    pub fn from_raw(raw: u32) -> Result<AccessFlags, AccessError> {
        AccessFlags::from_bits(raw).ok_or(AccessError::UnknownBits {
            raw,
            unknown: raw & !AccessFlags::all().bits(),
        })
    }

    /// The raw ibverbs word.
    pub const fn as_raw(self) -> u32 {
        self.bits()
    }
}

impl fmt::Display for AccessFlags {
    /// `LOCAL_WRITE|REMOTE_READ`, or `0` for no rights.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("0");
        }
        for (i, (name, _)) in self.iter_names().enumerate() {
            if i > 0 {
                f.write_str("|")?;
            }
            f.write_str(name)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bit_values_match_ibverbs() {
        assert_eq!(AccessFlags::LOCAL_WRITE.bits(), 1);
        assert_eq!(AccessFlags::REMOTE_WRITE.bits(), 2);
        assert_eq!(AccessFlags::REMOTE_READ.bits(), 4);
        assert_eq!(AccessFlags::REMOTE_ATOMIC.bits(), 8);
        assert_eq!(AccessFlags::ALL_REMOTE.as_raw(), 0xf);
    }

    #[test]
    fn validate_applies_the_local_write_rule_to_every_combination() {
        for raw in 0..16u32 {
            let flags = AccessFlags::from_raw(raw).expect("known bits");
            let remote_needs_local = raw & 0b1010 != 0;
            let has_local = raw & 1 != 0;
            let result = flags.validate();
            if remote_needs_local && !has_local {
                assert_eq!(
                    result,
                    Err(AccessError::MissingLocalWrite { flags }),
                    "raw {raw}"
                );
            } else {
                assert_eq!(result, Ok(flags), "raw {raw}");
            }
        }
    }

    #[test]
    fn unknown_bits_are_refused() {
        assert_eq!(
            AccessFlags::from_raw(0x31),
            Err(AccessError::UnknownBits {
                raw: 0x31,
                unknown: 0x30
            })
        );
    }

    #[test]
    fn display_lists_names() {
        assert_eq!(AccessFlags::empty().to_string(), "0");
        assert_eq!(
            (AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ).to_string(),
            "LOCAL_WRITE|REMOTE_READ"
        );
        let msg = AccessFlags::REMOTE_WRITE
            .validate()
            .expect_err("refused")
            .to_string();
        assert!(
            msg.contains("REMOTE_WRITE") && msg.contains("add AccessFlags::LOCAL_WRITE"),
            "{msg}"
        );
    }
}
