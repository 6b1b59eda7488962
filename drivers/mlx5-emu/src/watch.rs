//! Watching BAR0 for driver writes without a message per write: the command
//! doorbell, the command-queue address registers, and the doorbells of the
//! UAR pages the firmware has handed out ([`crate::Device::watch_uar`]).
//! Events go to a [`DoorbellHandler`] — the hook the firmware step
//! implements.
//!
//! # Semantics
//!
//! - `cmd_dbell` (0x018) is consumed: the watcher atomically swaps it to 0
//!   and reports the bits (`1 << slot`), so ringing the same slot twice is
//!   two events.
//! - UAR doorbells are consumed too: the watcher keeps each watched register
//!   at a sentinel ([`UAR_IDLE`], all-ones), reports any other value it finds
//!   and puts the sentinel back with a compare-and-swap (a write racing the
//!   swap stays and is the next event). So every write is an event — an EQ 0
//!   armed at consumer index 0 writes 0, which a change detector would miss —
//!   except a write of the all-ones sentinel itself, which no mlx5 doorbell
//!   carries (EQ 255 at index 0xffffff; opcode 0xff for QPN 0xffffff).
//! - `cmdq_addr_h`/`cmdq_addr_l_sz` are *state*: the watcher compares them
//!   with a shadow copy and reports changes.
//! - After the driver writes `cmdq_addr_l_sz`, the watcher restores its low
//!   byte to the read-only queue geometry (log size / log stride) and bits
//!   10:8 to the firmware's NIC interface state, as the hardware register
//!   reads back.
//!
//! # Cost while idle
//!
//! Adaptive polling: after activity the watcher spins ([`SPIN_FOR`]), then
//! sleeps, doubling from [`MIN_SLEEP`] to [`MAX_SLEEP`]; any event resets
//! it. Idle, that is ~1000 cheap scans a second.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::bar::{CMDQ_SIZES, UAR_PAGE, iseg};
use crate::device::Device;

/// How long the watcher spins after the last event.
pub const SPIN_FOR: Duration = Duration::from_micros(50);
/// First sleep after spinning.
pub const MIN_SLEEP: Duration = Duration::from_micros(10);
/// Longest sleep between scans while idle.
pub const MAX_SLEEP: Duration = Duration::from_millis(1);

/// What a watched UAR doorbell register holds between writes.
pub const UAR_IDLE: u64 = u64::MAX;

/// Doorbell registers of a UAR page: (offset, width in bytes) — CQ doorbell,
/// EQ update+arm, EQ update, and the first 8 bytes of each half of the four
/// BlueFlame/send-doorbell registers (mlx5.md §8).
pub const UAR_DOORBELLS: [(u32, u32); 11] = [
    (0x020, 8),
    (0x040, 4),
    (0x048, 4),
    (0x800, 8),
    (0x900, 8),
    (0xa00, 8),
    (0xb00, 8),
    (0xc00, 8),
    (0xd00, 8),
    (0xe00, 8),
    (0xf00, 8),
];

/// What the firmware step implements to react to the driver. Callbacks run
/// on the watcher thread (doorbells) or the serving thread (`reset`), one at
/// a time (the device holds the handler behind a lock): they must not call
/// back into [`Device`] methods that take the handler lock
/// ([`Device::reset`]).
pub trait DoorbellHandler: Send {
    /// The driver rang the command doorbell with `bits` (`1 << slot` each).
    fn command_doorbell(&mut self, dev: &Device, bits: u32);

    /// A doorbell register of a watched UAR page changed: `page` (BAR0 offset
    /// / 4096), `offset` in the page (one of [`UAR_DOORBELLS`]), `value` as
    /// the driver wrote it (big-endian decoded; 4-byte registers zero-extended).
    fn uar_doorbell(&mut self, dev: &Device, page: u32, offset: u32, value: u64);

    /// The driver wrote `cmdq_addr_h` (0x010) or `cmdq_addr_l_sz` (0x014);
    /// `value` as written.
    fn init_segment_write(&mut self, dev: &Device, offset: u32, value: u32) {
        let _ = (dev, offset, value);
    }

    /// The function was reset (FLR or client disconnect): forget all state.
    fn reset(&mut self, dev: &Device) {
        let _ = dev;
    }
}

/// A handler with no firmware behind it: events are only counted (in
/// [`crate::device::DeviceStats`]) and logged at debug level. What the binary
/// runs until the firmware step lands.
#[derive(Debug, Default)]
pub struct NoFirmware;

impl DoorbellHandler for NoFirmware {
    fn command_doorbell(&mut self, _dev: &Device, bits: u32) {
        tracing::debug!(
            bits = format_args!("{bits:#x}"),
            "command doorbell (no firmware)"
        );
    }

    fn uar_doorbell(&mut self, _dev: &Device, page: u32, offset: u32, value: u64) {
        tracing::debug!(page, offset, value, "UAR doorbell (no firmware)");
    }
}

/// The watcher's shadow state.
///
/// Public only for in-process harnesses (the fuzz targets in `fuzz-harness`): a harness
/// that builds a [`Device`] without a server runs [`Watcher::scan`] itself after writing
/// BAR0, so its doorbells take the same path as the watcher thread's.
#[doc(hidden)]
#[derive(Debug, Default)]
pub struct Watcher {
    epoch: u64,
    uar_gen: u64,
    cmdq_h: u32,
    cmdq_l: u32,
    /// (page, offset) → last value seen.
    shadow: BTreeMap<(u32, u32), u64>,
}

fn read_doorbell(dev: &Device, page: u32, offset: u32, width: u32) -> u64 {
    let at = u64::from(page) * UAR_PAGE + u64::from(offset);
    if width == 8 {
        dev.bar().read64_be(at)
    } else {
        u64::from(dev.bar().read32_be(at))
    }
}

impl Watcher {
    /// One scan; the number of events delivered.
    pub fn scan(&mut self, dev: &Device) -> usize {
        let epoch = dev.epoch();
        if epoch != self.epoch {
            // Reset happened: start from the power-on contents.
            *self = Watcher {
                epoch,
                uar_gen: dev.uar_generation(),
                cmdq_h: dev.bar().read32_be(iseg::CMDQ_ADDR_H),
                cmdq_l: dev.bar().read32_be(iseg::CMDQ_ADDR_L_SZ),
                shadow: BTreeMap::new(),
            };
        }
        let gen_now = dev.uar_generation();
        let watched = dev.watched_uars();
        if gen_now != self.uar_gen {
            self.uar_gen = gen_now;
            self.shadow.retain(|(p, _), _| watched.contains(p));
        }
        let mut events = 0;
        let bar = dev.bar();
        let bits = bar.swap32_be(iseg::CMD_DBELL, 0);
        if bits != 0 {
            dev.stats()
                .command_doorbells
                .fetch_add(1, Ordering::Relaxed);
            dev.with_handler(|h| h.command_doorbell(dev, bits));
            events += 1;
        }
        let h = bar.read32_be(iseg::CMDQ_ADDR_H);
        if h != self.cmdq_h {
            self.cmdq_h = h;
            dev.with_handler(|hd| hd.init_segment_write(dev, iseg::CMDQ_ADDR_H as u32, h));
            events += 1;
        }
        let l = bar.read32_be(iseg::CMDQ_ADDR_L_SZ);
        if l != self.cmdq_l {
            // The geometry byte is read-only, and bits 10:8 are the firmware's NIC interface
            // state (full driver unless a fault hook set another): both read back as the
            // firmware has them whatever the driver wrote.
            let fixed = iseg::with_nic_state((l & !0xff) | CMDQ_SIZES, dev.nic_state().as_raw());
            // If the driver wrote again meanwhile the CAS fails; the next
            // scan sees that write.
            let restored = l == fixed || bar.cas32_be(iseg::CMDQ_ADDR_L_SZ, l, fixed);
            if restored {
                self.cmdq_l = fixed;
                dev.with_handler(|hd| hd.init_segment_write(dev, iseg::CMDQ_ADDR_L_SZ as u32, l));
                events += 1;
            }
        }
        // Control doorbells (CQ arm, EQ update) first, and again before each
        // send doorbell: the driver's earlier writes are visible once a later
        // one is (x86 stores are seen in order), and the device must act on
        // them in that order. Without the second sweep a CQ armed before a
        // post could be read after the post's completion — and a second arm
        // written over the first (the register holds one value; a PCIe device
        // sees every write) lost that completion's event.
        events += self.sweep_control(dev, &watched);
        for &page in &watched {
            for (offset, width) in UAR_DOORBELLS.into_iter().filter(|(o, _)| is_send(*o)) {
                let idle = idle_for(width);
                if read_doorbell(dev, page, offset, width) == idle {
                    continue;
                }
                events += self.sweep_control(dev, &watched);
                events += usize::from(self.take(dev, page, offset, width));
            }
        }
        events
    }

    /// Consume and deliver every pending control doorbell (CQ arm, EQ
    /// update: the registers below the BlueFlame ones) of `pages`.
    fn sweep_control(&mut self, dev: &Device, pages: &[u32]) -> usize {
        let mut events = 0;
        for &page in pages {
            for (offset, width) in UAR_DOORBELLS {
                if !is_send(offset) {
                    events += usize::from(self.take(dev, page, offset, width));
                }
            }
        }
        events
    }

    /// Consume register `offset` of UAR page `page`: put the sentinel back
    /// unless the driver wrote again meanwhile (then that write is the next
    /// event) and deliver the value. `true` if a write was delivered.
    fn take(&mut self, dev: &Device, page: u32, offset: u32, width: u32) -> bool {
        let bar = dev.bar();
        let v = read_doorbell(dev, page, offset, width);
        let idle = idle_for(width);
        let first = self.shadow.insert((page, offset), idle).is_none();
        if v == idle {
            return false;
        }
        let at = u64::from(page) * UAR_PAGE + u64::from(offset);
        if width == 8 {
            bar.cas64_be(at, v, idle);
        } else {
            bar.cas32_be(at, v as u32, idle as u32);
        }
        // First look at a newly watched page: what it held is no write.
        if first {
            return false;
        }
        dev.stats().uar_doorbells.fetch_add(1, Ordering::Relaxed);
        dev.with_handler(|hd| hd.uar_doorbell(dev, page, offset, v));
        true
    }
}

/// Whether `offset` is a send doorbell / BlueFlame register (0x800 and up).
fn is_send(offset: u32) -> bool {
    offset >= 0x800
}

/// The sentinel of a register `width` bytes wide.
fn idle_for(width: u32) -> u64 {
    if width == 8 { UAR_IDLE } else { UAR_IDLE >> 32 }
}

/// Adaptive poll pacing; see the module docs.
#[derive(Debug)]
pub(crate) struct Backoff {
    last_event: Instant,
    sleep: Duration,
}

impl Backoff {
    pub(crate) fn new() -> Backoff {
        Backoff {
            last_event: Instant::now(),
            sleep: MIN_SLEEP,
        }
    }

    /// After a scan with `events`: how long to sleep (zero = spin on).
    pub(crate) fn next(&mut self, events: usize) -> Duration {
        if events > 0 {
            self.last_event = Instant::now();
            self.sleep = MIN_SLEEP;
            return Duration::ZERO;
        }
        if self.last_event.elapsed() < SPIN_FOR {
            return Duration::ZERO;
        }
        let s = self.sleep;
        self.sleep = (self.sleep * 2).min(MAX_SLEEP);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_spins_then_grows_to_the_cap() {
        let mut b = Backoff::new();
        assert_eq!(b.next(1), Duration::ZERO);
        std::thread::sleep(SPIN_FOR);
        let mut last = Duration::ZERO;
        for _ in 0..20 {
            let s = b.next(0);
            assert!(s >= last && s <= MAX_SLEEP);
            last = s;
        }
        assert_eq!(last, MAX_SLEEP);
        assert_eq!(b.next(1), Duration::ZERO, "an event resets it");
    }
}
