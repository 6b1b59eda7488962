//! MSI-X vectors of the emulated function: the eventfds the client passed
//! with `SET_IRQS`, per-vector mask and pending bits, and [`Msix::signal`].

use std::fs::File;
use std::os::fd::AsFd;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use thiserror::Error;
use tracing::{debug, warn};
use vfio_bindings::bindings::vfio as b;

use crate::sys;

/// What [`Msix::signal`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    /// The eventfd was written.
    Delivered,
    /// The vector is masked: pending, delivered on unmask.
    Pending,
    /// No eventfd is connected to the vector (dropped, counted).
    NotConnected,
    /// Bus mastering is off: an MSI-X message is a memory write, not sent.
    BusMasterDisabled,
}

/// A refused `SET_IRQS` or `signal`.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum IrqError {
    /// Only MSI-X is emulated.
    #[error("SET_IRQS for interrupt index {index}: only MSI-X (index 2) is emulated")]
    Index {
        /// The index asked for.
        index: u32,
    },
    /// Vectors outside the table.
    #[error("vectors {start}..{start}+{count} are outside the {vectors}-entry MSI-X table")]
    Range {
        /// First vector.
        start: u32,
        /// How many.
        count: u32,
        /// Table size.
        vectors: u32,
    },
    /// The fd count does not match.
    #[error("SET_IRQS DATA_EVENTFD for {count} vectors came with {fds} fds")]
    FdCount {
        /// Vectors.
        count: u32,
        /// Fds received.
        fds: usize,
    },
    /// Flags this emulator does not handle.
    #[error("SET_IRQS flags {flags:#x} are not supported (DATA_BOOL, or an unknown action)")]
    Flags {
        /// The flags.
        flags: u32,
    },
    /// Writing the eventfd failed.
    #[error("signalling MSI-X vector {vector} failed: {source}")]
    Signal {
        /// The vector.
        vector: u32,
        /// The errno.
        #[source]
        source: nix::Error,
    },
}

#[derive(Debug, Default)]
struct VectorState {
    fd: Option<File>,
    masked: bool,
    pending: bool,
}

/// Counters of the interrupt path.
#[derive(Debug, Default)]
pub struct IrqStats {
    /// Interrupts written to an eventfd.
    pub delivered: AtomicU64,
    /// Signals on masked vectors (left pending).
    pub pended: AtomicU64,
    /// Signals on vectors with no eventfd.
    pub dropped: AtomicU64,
}

/// The MSI-X table state; see the module docs.
#[derive(Debug)]
pub struct Msix {
    vectors: Mutex<Vec<VectorState>>,
    count: u32,
    stats: IrqStats,
}

impl Msix {
    /// `count` vectors, none connected.
    pub fn new(count: u32) -> Msix {
        Msix {
            vectors: Mutex::new((0..count).map(|_| VectorState::default()).collect()),
            count,
            stats: IrqStats::default(),
        }
    }

    /// Table size.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// The counters.
    pub fn stats(&self) -> &IrqStats {
        &self.stats
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<VectorState>> {
        self.vectors
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether `vector` has an eventfd.
    pub fn connected(&self, vector: u32) -> bool {
        self.lock()
            .get(vector as usize)
            .is_some_and(|v| v.fd.is_some())
    }

    /// Disconnect every vector and clear masks (disconnect / reset).
    pub fn clear(&self) {
        for v in self.lock().iter_mut() {
            *v = VectorState::default();
        }
    }

    /// Apply a `SET_IRQS` (VFIO semantics for the MSI-X index).
    pub fn set_irqs(
        &self,
        index: u32,
        flags: u32,
        start: u32,
        count: u32,
        fds: Vec<File>,
    ) -> Result<(), IrqError> {
        if index != b::VFIO_PCI_MSIX_IRQ_INDEX {
            return Err(IrqError::Index { index });
        }
        let data = flags & b::VFIO_IRQ_SET_DATA_TYPE_MASK;
        let action = flags & b::VFIO_IRQ_SET_ACTION_TYPE_MASK;
        let range = || -> Result<std::ops::Range<usize>, IrqError> {
            let end = start
                .checked_add(count)
                .filter(|&e| e <= self.count)
                .ok_or(IrqError::Range {
                    start,
                    count,
                    vectors: self.count,
                })?;
            Ok(start as usize..end as usize)
        };
        match (data, action) {
            (b::VFIO_IRQ_SET_DATA_NONE, b::VFIO_IRQ_SET_ACTION_TRIGGER) if count == 0 => {
                debug!("MSI-X disabled");
                self.clear();
            }
            (b::VFIO_IRQ_SET_DATA_NONE, b::VFIO_IRQ_SET_ACTION_TRIGGER) => {
                // Loopback trigger: fire the vectors.
                for v in range()? {
                    self.signal(v as u32)?;
                }
            }
            (b::VFIO_IRQ_SET_DATA_EVENTFD, b::VFIO_IRQ_SET_ACTION_TRIGGER) => {
                let r = range()?;
                if fds.len() != r.len() {
                    return Err(IrqError::FdCount {
                        count,
                        fds: fds.len(),
                    });
                }
                let mut vs = self.lock();
                for (v, fd) in r.zip(fds) {
                    vs[v].fd = Some(fd);
                }
                debug!(start, count, "MSI-X eventfds connected");
            }
            (b::VFIO_IRQ_SET_DATA_NONE, b::VFIO_IRQ_SET_ACTION_MASK) => {
                let r = range()?;
                for v in &mut self.lock()[r] {
                    v.masked = true;
                }
            }
            (b::VFIO_IRQ_SET_DATA_NONE, b::VFIO_IRQ_SET_ACTION_UNMASK) => {
                let r = range()?;
                let fire: Vec<u32> = {
                    let mut vs = self.lock();
                    r.filter(|&v| {
                        let s = &mut vs[v];
                        s.masked = false;
                        std::mem::take(&mut s.pending)
                    })
                    .map(|v| v as u32)
                    .collect()
                };
                for v in fire {
                    self.signal(v)?;
                }
            }
            _ => return Err(IrqError::Flags { flags }),
        }
        Ok(())
    }

    /// Raise `vector`: write its eventfd, or leave it pending if masked.
    pub fn signal(&self, vector: u32) -> Result<Signal, IrqError> {
        let mut vs = self.lock();
        let Some(v) = vs.get_mut(vector as usize) else {
            return Err(IrqError::Range {
                start: vector,
                count: 1,
                vectors: self.count,
            });
        };
        if v.masked {
            v.pending = true;
            self.stats.pended.fetch_add(1, Ordering::Relaxed);
            return Ok(Signal::Pending);
        }
        let Some(fd) = &v.fd else {
            self.stats.dropped.fetch_add(1, Ordering::Relaxed);
            warn!(vector, "MSI-X signal on a vector with no eventfd: dropped");
            return Ok(Signal::NotConnected);
        };
        sys::eventfd_signal(fd.as_fd()).map_err(|source| IrqError::Signal { vector, source })?;
        self.stats.delivered.fetch_add(1, Ordering::Relaxed);
        Ok(Signal::Delivered)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::eventfd::{EfdFlags, EventFd};
    use std::os::fd::OwnedFd;

    fn efd() -> (EventFd, File) {
        let e = EventFd::from_flags(EfdFlags::EFD_NONBLOCK).unwrap();
        let dup: OwnedFd = e.as_fd().try_clone_to_owned().unwrap();
        (e, File::from(dup))
    }

    const TRIGGER_FD: u32 = b::VFIO_IRQ_SET_DATA_EVENTFD | b::VFIO_IRQ_SET_ACTION_TRIGGER;

    #[test]
    fn signal_mask_unmask_and_disable() {
        let m = Msix::new(4);
        assert_eq!(m.signal(1).unwrap(), Signal::NotConnected);
        let (e, f) = efd();
        m.set_irqs(2, TRIGGER_FD, 1, 1, vec![f]).unwrap();
        assert_eq!(m.signal(1).unwrap(), Signal::Delivered);
        assert_eq!(e.read().unwrap(), 1);
        m.set_irqs(
            2,
            b::VFIO_IRQ_SET_DATA_NONE | b::VFIO_IRQ_SET_ACTION_MASK,
            1,
            1,
            vec![],
        )
        .unwrap();
        assert_eq!(m.signal(1).unwrap(), Signal::Pending);
        assert!(e.read().is_err(), "masked: nothing delivered");
        m.set_irqs(
            2,
            b::VFIO_IRQ_SET_DATA_NONE | b::VFIO_IRQ_SET_ACTION_UNMASK,
            1,
            1,
            vec![],
        )
        .unwrap();
        assert_eq!(e.read().unwrap(), 1, "pending delivered on unmask");
        m.set_irqs(
            2,
            b::VFIO_IRQ_SET_DATA_NONE | b::VFIO_IRQ_SET_ACTION_TRIGGER,
            0,
            0,
            vec![],
        )
        .unwrap();
        assert!(!m.connected(1));
        assert!(m.signal(9).is_err());
    }

    #[test]
    fn refusals() {
        let m = Msix::new(4);
        let (_e, f) = efd();
        assert!(matches!(
            m.set_irqs(0, TRIGGER_FD, 0, 1, vec![]),
            Err(IrqError::Index { index: 0 })
        ));
        assert!(matches!(
            m.set_irqs(2, TRIGGER_FD, 3, 2, vec![]),
            Err(IrqError::Range { .. })
        ));
        assert!(matches!(
            m.set_irqs(2, TRIGGER_FD, 0, 2, vec![f]),
            Err(IrqError::FdCount { .. })
        ));
        assert!(matches!(
            m.set_irqs(
                2,
                b::VFIO_IRQ_SET_DATA_BOOL | b::VFIO_IRQ_SET_ACTION_TRIGGER,
                0,
                1,
                vec![]
            ),
            Err(IrqError::Flags { .. })
        ));
    }
}
