//! A child process killed (and reaped) when dropped, so a failing test
//! leaves no emulator or driver process behind. Included by path from the
//! tests that spawn processes (`binary.rs`, `crash_recovery.rs`, `keep_state.rs`).

use std::process::Child;

/// A child process killed (and reaped) when dropped.
pub struct Proc(pub Child);

impl std::ops::Deref for Proc {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Proc {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
