//! Health (mlx5.md §2): reading the health buffer, judging it as the kernel
//! and rdma-core do, and the fatal transition.
//!
//! # What is fatal (audit rows 2, 3, 22)
//!
//! - a syndrome **with** `rfr` (reset firmware required): K core/health.c
//!   104-131 (`sensor_fw_synd_rfr`), RC mlx5_vfio.c:2026-2057. A syndrome
//!   without `rfr` is only reported (K core/health.c:840-847): counted in
//!   [`HealthReport::warnings`], logged once per new syndrome, shown by
//!   `rnicctl stats`; the function keeps running.
//! - the health buffer's `fw_version` reading all-ones: the PCI link is gone.
//! - the NIC interface state (`(cmdq_addr_l_sz >> 8) & 7`) disabled (1) or
//!   SW reset (7): K core/health.c:70-73 and 124-127, RC
//!   mlx5_vfio.c:1950-1953 and 2047-2051 — how a firmware reset or teardown
//!   initiated elsewhere shows.
//! - the health counter standing still for [`HEALTH_STUCK`]: RC aborts
//!   after three 1 s polls (mlx5_vfio.c:2159-2168); K only reports it
//!   (core/health.c:826-838). This driver follows RC: a function whose
//!   firmware stopped ticking is not trusted with DMA.
//!
//! The fatal transition sets every QP's flush flag (posts then fail with
//! [`crate::PostFailure::DeviceFatal`], polls flush the outstanding work in
//! software) and stops all commands.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use rnic_mlx5_prm::{FW_VERSION_PCI_DEAD, HealthSyndrome, NicState, health_buffer, initial_seg};
use tracing::{error, warn};

use crate::firmware::read_iseg;
use crate::function::memory::lock;
use crate::{Mlx5Error, PciFunction};

/// How long the health counter may stand still before the function is
/// taken as dead (RC: three 1 s polls).
pub const HEALTH_STUCK: Duration = Duration::from_secs(3);

/// The health buffer and counter (§2), as read now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Health {
    /// `synd`: nonzero means the firmware reports a problem; fatal only with
    /// `reset_required` ([`Health::fatal`]).
    pub syndrome: Option<HealthSyndrome>,
    /// `ext_synd`.
    pub ext_syndrome: u32,
    /// `rfr`: reset firmware required.
    pub reset_required: bool,
    /// `severity` (with `valid`).
    pub severity: Option<u32>,
    /// `fw_version` of the health buffer; 0xffffffff means the PCI link is gone.
    pub fw_version: u32,
    /// `health_counter` (the firmware increments it periodically).
    pub counter: u32,
    /// The NIC interface state (`initial_seg.nic_state`).
    pub nic_state: NicState,
}

/// Why a [`Health`] reading is fatal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fatal {
    /// A syndrome with `rfr` set.
    Syndrome(HealthSyndrome),
    /// The PCI link is gone (`fw_version` all-ones).
    PciGone,
    /// The NIC interface is disabled or in SW reset.
    NicInterface(NicState),
}

impl Health {
    /// Read the health buffer of `function`.
    pub fn read(function: &dyn PciFunction) -> Result<Health, Mlx5Error> {
        let base = initial_seg::health_buffer.byte_offset();
        let bar = function.bar0();
        let field = |f: &rnic_mlx5_prm::FieldLayout| -> Result<u32, Mlx5Error> {
            let dword = bar
                .read32_be(base + f.dword_offset())
                .map_err(Mlx5Error::Bar)?;
            Ok(f.extract(dword))
        };
        let synd = field(&health_buffer::synd)?;
        Ok(Health {
            syndrome: (synd != 0).then(|| HealthSyndrome::from_raw(synd as u8)),
            ext_syndrome: field(&health_buffer::ext_synd)?,
            reset_required: field(&health_buffer::rfr)? != 0,
            severity: (field(&health_buffer::valid)? != 0)
                .then(|| field(&health_buffer::severity))
                .transpose()?,
            fw_version: field(&health_buffer::fw_version)?,
            counter: read_iseg(function, &initial_seg::health_counter)?,
            nic_state: NicState::from_raw(read_iseg(function, &initial_seg::nic_state)? as u8),
        })
    }

    /// Why this reading is fatal, if it is (module docs).
    pub fn fatal(&self) -> Option<Fatal> {
        if self.fw_version == FW_VERSION_PCI_DEAD {
            return Some(Fatal::PciGone);
        }
        if matches!(self.nic_state, NicState::Disabled | NicState::SwReset) {
            return Some(Fatal::NicInterface(self.nic_state));
        }
        match self.syndrome {
            Some(s) if self.reset_required => Some(Fatal::Syndrome(s)),
            _ => None,
        }
    }

    /// Whether the function is in a fatal state ([`Health::fatal`]).
    pub fn is_fatal(&self) -> bool {
        self.fatal().is_some()
    }
}

/// A syndrome the firmware reported without requiring a reset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HealthWarning {
    /// `synd`.
    pub syndrome: HealthSyndrome,
    /// `ext_synd`.
    pub ext_syndrome: u32,
    /// `severity`, when valid.
    pub severity: Option<u32>,
}

/// What the health checks have found so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HealthReport {
    /// Health buffer reads.
    pub checks: u64,
    /// Non-fatal syndromes reported (each new syndrome, or one that came
    /// back after the buffer cleared, counts once).
    pub warnings: u64,
    /// The latest non-fatal syndrome, while the buffer still shows it.
    pub warning: Option<HealthWarning>,
    /// Whether the function was found fatal.
    pub fatal: bool,
}

/// What the fatal transition does to a queue of the RDMA layer above: flush
/// it (its posts refuse, its outstanding work completes in error).
pub(crate) trait Flush: Send + Sync {
    /// Flush the queue (idempotent).
    fn set_flush(&self);
}

/// Health state shared by the [`crate::Hca`], its event thread and its
/// health poller.
#[derive(Debug)]
pub(crate) struct HealthShared {
    function: Arc<dyn PciFunction>,
    fatal: AtomicBool,
    /// The function's QPs: the fatal transition sets their flush flags, so
    /// a post checks one flag of its own QP for both.
    qps: Mutex<Vec<Weak<dyn Flush>>>,
    /// The last counter value and when it was first seen.
    watch: Mutex<Option<(u32, Instant)>>,
    report: Mutex<HealthReport>,
}

impl HealthShared {
    pub(crate) fn new(function: Arc<dyn PciFunction>) -> HealthShared {
        HealthShared {
            function,
            fatal: AtomicBool::new(false),
            qps: Mutex::default(),
            watch: Mutex::default(),
            report: Mutex::default(),
        }
    }

    #[inline(always)]
    pub(crate) fn is_fatal(&self) -> bool {
        self.fatal.load(Ordering::Relaxed)
    }

    /// Registered before the check of `fatal`, so either the transition
    /// sees it in the list or this sees the flag set (both under the list's
    /// lock).
    pub(crate) fn register_qp(&self, qp: Arc<dyn Flush>) {
        {
            let mut qps = lock(&self.qps);
            qps.retain(|w| w.strong_count() > 0);
            qps.push(Arc::downgrade(&qp));
        }
        if self.fatal.load(Ordering::SeqCst) {
            qp.set_flush();
        }
    }

    pub(crate) fn report(&self) -> HealthReport {
        let mut r = *lock(&self.report);
        r.fatal = self.is_fatal();
        r
    }

    /// Read and judge the health buffer (module docs).
    pub(crate) fn check(&self) -> Result<Health, Mlx5Error> {
        let health = Health::read(self.function.as_ref())?;
        let stuck = {
            let mut w = lock(&self.watch);
            let now = Instant::now();
            match *w {
                Some((c, since)) if c == health.counter => {
                    now.duration_since(since) >= HEALTH_STUCK
                }
                _ => {
                    *w = Some((health.counter, now));
                    false
                }
            }
        };
        let fatal = health.fatal();
        {
            let mut r = lock(&self.report);
            r.checks += 1;
            let warning = match (fatal, health.syndrome) {
                (None, Some(syndrome)) => Some(HealthWarning {
                    syndrome,
                    ext_syndrome: health.ext_syndrome,
                    severity: health.severity,
                }),
                _ => None,
            };
            if warning.is_some() && warning != r.warning {
                r.warnings += 1;
                warn!(
                    function = self.function.name(),
                    ?warning,
                    "the firmware reports a health syndrome without requiring a reset; the \
                     function keeps running (rnicctl stats shows it)"
                );
            }
            r.warning = warning;
        }
        if fatal.is_some() || stuck {
            if !self.fatal.swap(true, Ordering::SeqCst) {
                error!(
                    function = self.function.name(),
                    ?health,
                    ?fatal,
                    stuck,
                    "function is in a fatal state: QPs to ERR, commands stop"
                );
                for qp in lock(&self.qps).iter().filter_map(Weak::upgrade) {
                    qp.set_flush();
                }
            }
            return Err(Mlx5Error::DeviceFatal {
                syndrome: match fatal {
                    Some(Fatal::Syndrome(s)) => Some(s),
                    _ => None,
                },
                counter_stuck: stuck,
                nic_state: match fatal {
                    Some(Fatal::NicInterface(n)) => Some(n),
                    _ => None,
                },
            });
        }
        Ok(health)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(syndrome: Option<u8>, rfr: bool, nic: u8) -> Health {
        Health {
            syndrome: syndrome.map(HealthSyndrome::from_raw),
            ext_syndrome: 0,
            reset_required: rfr,
            severity: None,
            fw_version: 0x1000_0010,
            counter: 1,
            nic_state: NicState::from_raw(nic),
        }
    }

    #[test]
    fn fatal_is_rfr_and_syndrome_or_a_dead_nic_interface_as_the_kernel_reads_it() {
        // Audit rows 2 and 3 (K core/health.c:104-131, 70-73).
        assert_eq!(reading(None, false, 0).fatal(), None);
        assert_eq!(
            reading(Some(0x10), false, 0).fatal(),
            None,
            "no rfr: report only"
        );
        assert_eq!(
            reading(None, true, 0).fatal(),
            None,
            "rfr without a syndrome"
        );
        assert_eq!(
            reading(Some(0x08), true, 0).fatal(),
            Some(Fatal::Syndrome(HealthSyndrome::HwFatal))
        );
        assert_eq!(
            reading(None, false, 1).fatal(),
            Some(Fatal::NicInterface(NicState::Disabled))
        );
        assert_eq!(
            reading(None, false, 7).fatal(),
            Some(Fatal::NicInterface(NicState::SwReset))
        );
        assert_eq!(
            reading(None, false, 2).fatal(),
            None,
            "no-DRAM NIC is a mode"
        );
        let mut dead = reading(None, false, 0);
        dead.fw_version = FW_VERSION_PCI_DEAD;
        assert_eq!(dead.fatal(), Some(Fatal::PciGone));
    }
}
