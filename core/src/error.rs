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

/// What kind of failure a [`DeviceError`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DeviceErrorKind {
    /// The device has no room (queues, keys, QPNs, memory).
    NoResources,
    /// An argument the device refused.
    InvalidArgument,
    /// The object named does not exist (any more) on the device.
    NotFound,
    /// The device does not do this.
    Unsupported,
    /// An operating-system call failed; `status` is the errno.
    Os,
    /// A firmware command failed; `status` and `syndrome` are the firmware's
    /// (mlx5: the command's opcode is in `syndrome`'s upper half only when the
    /// driver says so, see its docs).
    Command,
    /// The transport (engine) refused the operation.
    Transport,
}

/// A driver's typed failure, carried without allocation: a kind, the device's
/// status and syndrome words (0 where it has none; the errno for
/// [`DeviceErrorKind::Os`]), and a static sentence saying what failed and what
/// to do. rxe and mlx5 map their own error types into it; mlx5's
/// `Command { opcode, op_mod, status, syndrome }` keeps `status` and
/// `syndrome` as they are and names the command in `what`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeviceError {
    /// The kind of failure.
    pub kind: DeviceErrorKind,
    /// The device's status word (errno for `Os`).
    pub status: u32,
    /// The device's syndrome word.
    pub syndrome: u32,
    /// What failed, and what to do about it.
    pub what: &'static str,
}

impl DeviceError {
    /// An error of `kind` with no status words.
    pub const fn new(kind: DeviceErrorKind, what: &'static str) -> DeviceError {
        DeviceError {
            kind,
            status: 0,
            syndrome: 0,
            what,
        }
    }

    /// An operating-system failure with `errno`.
    pub const fn os(errno: i32, what: &'static str) -> DeviceError {
        DeviceError {
            kind: DeviceErrorKind::Os,
            status: errno as u32,
            syndrome: 0,
            what,
        }
    }

    /// A firmware command failure.
    pub const fn command(status: u32, syndrome: u32, what: &'static str) -> DeviceError {
        DeviceError {
            kind: DeviceErrorKind::Command,
            status,
            syndrome,
            what,
        }
    }
}

impl std::fmt::Display for DeviceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.what)?;
        match self.kind {
            DeviceErrorKind::Os => write!(
                f,
                " ({})",
                std::io::Error::from_raw_os_error(self.status as i32)
            ),
            _ if self.status != 0 || self.syndrome != 0 => write!(
                f,
                " (status {:#x}, syndrome {:#x})",
                self.status, self.syndrome
            ),
            _ => Ok(()),
        }
    }
}

impl std::error::Error for DeviceError {}
