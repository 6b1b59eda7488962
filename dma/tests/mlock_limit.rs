//! The `RLIMIT_MEMLOCK` error path against the real kernel.
//!
//! This binary lowers its own `RLIMIT_MEMLOCK` to 64 KiB and, when it runs as
//! root, switches to uid `nobody` so it loses `CAP_IPC_LOCK` (root is exempt
//! from the limit). That changes the whole process, so it has no libtest
//! harness: `main` runs the checks and prints libtest-style result lines.
#![allow(clippy::unwrap_used)]

use nix::sys::resource::{Resource, setrlimit};
use nix::unistd::{Uid, geteuid, setuid};
use rnic_dma::{DmaError, DmaRegion, PagePolicy, PageSize};

const LIMIT: u64 = 64 * 1024;

fn main() {
    setrlimit(Resource::RLIMIT_MEMLOCK, LIMIT, LIMIT).unwrap();
    if geteuid().is_root() {
        // Dropping to an unprivileged uid clears the effective capabilities.
        setuid(Uid::from_raw(65534)).unwrap();
    }

    // Within the limit: the real mlock succeeds.
    let small = DmaRegion::builder(32 * 1024)
        .pages(PagePolicy::Require(PageSize::Base))
        .build()
        .unwrap();
    assert!(small.stats().pinned);

    // 32 KiB are locked now; 48 KiB more would exceed 64 KiB.
    let err = DmaRegion::builder(48 * 1024)
        .pages(PagePolicy::Require(PageSize::Base))
        .build()
        .unwrap_err();
    match &err {
        DmaError::MemlockLimit {
            request,
            limit,
            locked,
        } => {
            assert_eq!(
                (*request, *limit, *locked),
                (48 * 1024, LIMIT, 32 * 1024),
                "{err}"
            );
        }
        other => panic!("expected MemlockLimit, got: {other}"),
    }
    let msg = err.to_string();
    for needle in [
        "65536",
        "49152",
        "ulimit -l",
        "/etc/security/limits.conf",
        "LimitMEMLOCK=",
    ] {
        assert!(msg.contains(needle), "{needle:?} missing from: {msg}");
    }
    println!("error shown to the user: {msg}");

    // An unpinned region is not subject to the limit.
    let unpinned = DmaRegion::builder(1 << 20)
        .pin(false)
        .pages(PagePolicy::Require(PageSize::Base))
        .build()
        .unwrap();
    assert!(!unpinned.stats().pinned);

    // Dropping the pinned region unlocks it: the same request now fits.
    drop(small);
    let again = DmaRegion::builder(48 * 1024)
        .pages(PagePolicy::Require(PageSize::Base))
        .build()
        .unwrap();
    assert!(again.stats().pinned);

    println!("test mlock_limit_is_checked_up_front_and_explained ... ok");
    println!();
    println!("test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out");
}
