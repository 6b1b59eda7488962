//! An emulated function on a private temporary socket, for tests and
//! examples: [`TempFunction::start`] listens in a fresh directory under the
//! system's temporary directory, boots in 10 ms, and removes the directory
//! when dropped (after the emulator has stopped).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::{EmuError, Emulator, Options};

/// A running [`Emulator`] whose socket lives in a directory of its own.
#[derive(Debug)]
pub struct TempFunction {
    // Fields drop in order: the emulator stops and removes its socket, then
    // the directory goes.
    emu: Emulator,
    _dir: RemoveOnDrop,
    socket: PathBuf,
}

/// A directory removed (with what is left in it) when dropped.
#[derive(Debug)]
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl TempFunction {
    /// Start one with the default firmware and a 10 ms boot delay.
    pub fn start() -> Result<TempFunction, EmuError> {
        TempFunction::start_with(Options {
            boot_delay: Duration::from_millis(10),
            ..Options::default()
        })
    }

    /// Start one with `options`.
    pub fn start_with(options: Options) -> Result<TempFunction, EmuError> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "rnic-mlx5-emu-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).map_err(|source| EmuError::Socket {
            op: "creating the directory",
            path: dir.clone(),
            source,
        })?;
        let socket = dir.join("mlx5.sock");
        let dir = RemoveOnDrop(dir);
        Ok(TempFunction {
            emu: Emulator::start(&socket, options)?,
            _dir: dir,
            socket,
        })
    }

    /// The vfio-user socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The device spec that opens it: `mlx5:vfio-user:<socket>`.
    pub fn spec(&self) -> String {
        format!("mlx5:vfio-user:{}", self.socket.display())
    }

    /// The device spec that opens it with `ip` as GID 0:
    /// `mlx5:vfio-user:<socket>@<ip>`.
    pub fn spec_at(&self, ip: impl std::fmt::Display) -> String {
        format!("{}@{ip}", self.spec())
    }

    /// The emulator.
    pub fn emulator(&self) -> &Emulator {
        &self.emu
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_listens_on_a_private_socket_and_leaves_nothing_behind() {
        let (a, b) = (
            TempFunction::start().unwrap(),
            TempFunction::start().unwrap(),
        );
        assert_ne!(a.socket(), b.socket());
        assert!(a.socket().exists());
        assert_eq!(
            a.spec_at("127.0.0.9"),
            format!("mlx5:vfio-user:{}@127.0.0.9", a.socket().display())
        );
        let dir = a.socket().parent().unwrap().to_path_buf();
        let mut c = vfio_user::Client::new(a.socket()).unwrap();
        let mut id = [0u8; 4];
        c.region_read(7, 0, &mut id).unwrap();
        assert_eq!(u32::from_le_bytes(id), 0x1017_15b3);
        drop(c);
        drop(a);
        assert!(!dir.exists(), "{} left behind", dir.display());
        assert!(b.socket().exists());
    }
}
