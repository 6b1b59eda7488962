//! Errors of rnic-core.

use thiserror::Error;

/// A value that does not fit the field it was meant for.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ValueError {
    /// A QPN wider than 24 bits.
    #[error("QPN {0:#x} does not fit 24 bits (max 0xffffff)")]
    Qpn(u32),
    /// A PSN wider than 24 bits.
    #[error("PSN {0:#x} does not fit 24 bits (max 0xffffff)")]
    Psn(u32),
    /// An MTU that is not 256, 512, 1024, 2048 or 4096 bytes.
    #[error("path MTU {0} is not one of 256, 512, 1024, 2048, 4096")]
    MtuBytes(u32),
    /// An MTU enum value outside 1..=5.
    #[error("path MTU code {0} is not one of 1 (256) … 5 (4096)")]
    MtuEnum(u8),
    /// A string that is neither an IP address nor 32 hex digits.
    #[error("{0:?} is not a GID: give an IPv6 address, an IPv4 address, or 32 hex digits")]
    Gid(String),
    /// A hex GID that is not exactly 32 hex digits.
    #[error("{0:?} is not a GID in hex form: expected exactly 32 hex digits")]
    GidHex(String),
}
