//! Pinning: the up-front `RLIMIT_MEMLOCK` check and `mlock`.
//!
//! The kernel would answer an over-limit `mlock` with a bare `ENOMEM` (or
//! `EPERM`); checking first lets the error name the limit, the request, what
//! is locked already and how to raise the limit.

use std::ptr::NonNull;

use crate::error::DmaError;
use crate::sys;

/// `CAP_IPC_LOCK` bit in the capability sets.
const CAP_IPC_LOCK: u32 = 14;

/// What `/proc/self/status` says about locking.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct LockStatus {
    /// `VmLck`, in bytes.
    pub(crate) locked: u64,
    /// Whether `CAP_IPC_LOCK` is in the effective set (limit not enforced).
    pub(crate) cap_ipc_lock: bool,
}

pub(crate) fn parse_status(status: &str) -> LockStatus {
    let mut out = LockStatus::default();
    for line in status.lines() {
        if let Some(v) = line.strip_prefix("VmLck:") {
            let kb = v.trim().trim_end_matches("kB").trim();
            out.locked = kb.parse::<u64>().map_or(0, |k| k * 1024);
        } else if let Some(v) = line.strip_prefix("CapEff:") {
            out.cap_ipc_lock =
                u64::from_str_radix(v.trim(), 16).is_ok_and(|caps| caps & (1 << CAP_IPC_LOCK) != 0);
        }
    }
    out
}

/// Fail with [`DmaError::MemlockLimit`] if pinning `request` more bytes would
/// exceed `RLIMIT_MEMLOCK` for a process without `CAP_IPC_LOCK`.
pub(crate) fn check_memlock(request: u64) -> Result<(), DmaError> {
    let status = sys::read_file("/proc/self/status")
        .map(|s| parse_status(&s))
        .unwrap_or_default();
    if status.cap_ipc_lock {
        return Ok(());
    }
    let limit = sys::memlock_limit().map_err(|source| DmaError::Syscall {
        op: "getrlimit(RLIMIT_MEMLOCK)",
        addr: 0,
        len: 0,
        source,
    })?;
    if status.locked.saturating_add(request) > limit {
        return Err(DmaError::MemlockLimit {
            request,
            limit,
            locked: status.locked,
        });
    }
    Ok(())
}

/// `mlock` the range.
pub(crate) fn lock(addr: NonNull<u8>, len: usize) -> Result<(), DmaError> {
    sys::mlock(addr, len).map_err(|source| DmaError::Mlock {
        addr: addr.as_ptr() as usize,
        len,
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_parsing() {
        let s = "Name:\tx\nVmLck:\t     128 kB\nCapEff:\t000001ffffffffff\n";
        assert_eq!(
            parse_status(s),
            LockStatus {
                locked: 128 * 1024,
                cap_ipc_lock: true
            }
        );
        let s = "VmLck:\t0 kB\nCapEff:\t0000000000000000\n";
        assert_eq!(
            parse_status(s),
            LockStatus {
                locked: 0,
                cap_ipc_lock: false
            }
        );
    }

    #[test]
    fn over_limit_is_refused_with_the_fix() {
        sys::script(|s| {
            s.memlock_limit = 64 * 1024;
            s.files.insert(
                "/proc/self/status".into(),
                "VmLck:\t16 kB\nCapEff:\t0\n".into(),
            );
        });
        assert!(check_memlock(48 * 1024).is_ok());
        let err = check_memlock(48 * 1024 + 1).unwrap_err();
        assert!(matches!(
            err,
            DmaError::MemlockLimit {
                request: 49153,
                limit: 65536,
                locked: 16384
            }
        ));
        let msg = err.to_string();
        for needle in [
            "65536",
            "49153",
            "ulimit -l",
            "/etc/security/limits.conf",
            "LimitMEMLOCK=",
        ] {
            assert!(msg.contains(needle), "{needle} missing from: {msg}");
        }
    }

    #[test]
    fn cap_ipc_lock_skips_the_limit() {
        sys::script(|s| {
            s.memlock_limit = 0;
            s.files.insert(
                "/proc/self/status".into(),
                format!("VmLck:\t0 kB\nCapEff:\t{:016x}\n", 1u64 << 14),
            );
        });
        assert!(check_memlock(1 << 30).is_ok());
    }
}
