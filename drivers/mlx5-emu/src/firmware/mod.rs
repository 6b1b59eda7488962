//! The strict emulated firmware: a [`DoorbellHandler`] that executes the mlx5 command
//! interface (mlx5.md §3–§5) over the driver's DMA mappings.
//!
//! # What it does
//!
//! - **Command queue** ([`cmdq`]): the queue address is what the driver wrote into
//!   `cmdq_phy_addr` (BAR0 0x010/0x014, read at each doorbell, low 12 bits masked); the
//!   geometry is the one the init segment publishes (32 entries of 64 bytes, read-only). On
//!   doorbell bit *i* the firmware reads entry *i*, requires ownership = hardware (else the ring
//!   is ignored and counted, as hardware does) and type = PCIe command, gathers `inlen` bytes
//!   from the inline bytes and the input mailboxes, validates the output chain, executes, writes
//!   `outlen` bytes back and finally the delivery status with ownership cleared, then a
//!   command-completion EQE on the EQ that asks for command events (if any).
//! - **Commands** ([`exec`]): the life cycle Disabled → (ENABLE_HCA) Enabled → (INIT_HCA)
//!   Initialized → (TEARDOWN_HCA) Enabled → (DISABLE_HCA) Disabled, ISSI, pages, capabilities
//!   ([`caps`]), HOST_ENDIANNESS, driver version, UAR/PD/transport domain, vport state and
//!   context; the RoCE address, EQ, CQ, MKey and QP commands go to the [`crate::hca`]. Every
//!   refusal carries a nonzero [`syndrome`] naming the check.
//! - **Fault hooks** ([`Faults`]): fail the next command of an opcode with a chosen status and
//!   syndrome, swallow the next command (never completed), delay the next command's completion
//!   ([`Faults::delay_next`]: executed and completed when the delay ends, by the watcher thread,
//!   while other slots, the data path and the health counter go on), turn the next completion
//!   of a QP into an error CQE ([`Faults::error_cqe`]), declare a fatal health syndrome
//!   (health counter stops, commands are no longer served).
//! - **Accounting** ([`FirmwareHandle::accounting`], [`FirmwareHandle::stats`]): pages held,
//!   live UARs/PDs/TDs, DMA mappings; commands by opcode, errors by status, delivery errors.
//!
//! # Locking
//!
//! The device calls the handler under its handler lock; the handler then takes the state
//! lock. A [`FirmwareHandle`] takes only the state, fault or stats locks, never the handler
//! lock, so test threads can inspect the firmware while it runs.

pub mod caps;
pub mod cmdq;
pub mod exec;
pub mod syndrome;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use rnic_mlx5_prm::{CmdOpcode, CmdStatus, DeliveryStatus, HealthSyndrome, MboxOut, initial_seg};

use crate::bar::iseg;
use crate::device::Device;
use crate::watch::DoorbellHandler;

pub use exec::{Phase, Refusal, State};

/// What the firmware is configured with (part of [`crate::Options`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FirmwareOptions {
    /// Pages QUERY_PAGES(boot) asks for (default 16).
    pub boot_pages: u32,
    /// Pages QUERY_PAGES(init) asks for (default 32).
    pub init_pages: u32,
    /// Most pages the firmware holds at once (default 65536 = 256 MiB).
    pub max_pages: u32,
    /// The permanent MAC address (QUERY_NIC_VPORT_CONTEXT).
    pub mac: [u8; 6],
    /// The vport MTU at power-on (default 9000, a jumbo-frame port: RoCE path MTU 4096 needs
    /// 4096 + 96 bytes; the emulator's datagrams go over loopback, MTU 65536).
    pub mtu: u16,
    /// Whether the port reports link up (QUERY_VPORT_STATE `state`).
    pub link_up: bool,
}

impl Default for FirmwareOptions {
    fn default() -> FirmwareOptions {
        FirmwareOptions {
            boot_pages: 16,
            init_pages: 32,
            max_pages: 1 << 16,
            mac: [0x02, 0x00, 0x15, 0xb3, 0x10, 0x17],
            mtu: 9000,
            link_up: true,
        }
    }
}

/// Counters since the emulator started (a reset does not clear them).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FirmwareStats {
    /// Commands completed (delivered, any command status), by raw opcode.
    pub commands: BTreeMap<u16, u64>,
    /// Commands completed with a nonzero command status, by raw status.
    pub errors: BTreeMap<u8, u64>,
    /// Entries completed with a nonzero delivery status, by raw delivery status.
    pub delivery_errors: BTreeMap<u8, u64>,
    /// Rings of slots whose entry was owned by software (ignored).
    pub ignored_not_owned: u64,
    /// Rings before the driver wrote a command queue address (ignored).
    pub ignored_no_queue: u64,
    /// Rings whose entry could not be read through DMA (ignored).
    pub ignored_unreadable: u64,
    /// Rings of slots beyond the queue's 32 entries (ignored).
    pub ignored_bad_slot: u64,
    /// Rings after a fatal health syndrome (ignored).
    pub ignored_dead: u64,
    /// Commands swallowed by [`Faults::swallow_next`].
    pub swallowed: u64,
    /// Commands failed by [`Faults::fail_next`].
    pub injected: u64,
    /// Commands whose completion [`Faults::delay_next`] delayed.
    pub delayed: u64,
    /// Delayed commands never completed: the function was reset, or declared fatal, first.
    pub late_dropped: u64,
    /// Rings of a slot whose delayed command is still executing (ignored: a slot executes
    /// one command at a time).
    pub ignored_busy: u64,
    /// Command completion EQEs posted.
    pub command_events: u64,
}

impl FirmwareStats {
    /// Commands of `op` completed.
    pub fn executed(&self, op: CmdOpcode) -> u64 {
        self.commands.get(&op.as_raw()).copied().unwrap_or(0)
    }

    /// Commands completed with `status`.
    pub fn errors_with(&self, status: CmdStatus) -> u64 {
        self.errors.get(&status.as_raw()).copied().unwrap_or(0)
    }

    /// Entries completed with delivery status `status`.
    pub fn delivery_errors_with(&self, status: DeliveryStatus) -> u64 {
        self.delivery_errors
            .get(&status.as_raw())
            .copied()
            .unwrap_or(0)
    }
}

/// What the firmware and the device hold on the driver's behalf: for "teardown leaves nothing
/// behind" checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Accounting {
    /// The life-cycle state.
    pub phase: Phase,
    /// Pages given with MANAGE_PAGES and not taken back.
    pub pages_held: usize,
    /// UARs allocated.
    pub uars: usize,
    /// PDs allocated.
    pub pds: usize,
    /// Transport domains allocated.
    pub tds: usize,
    /// EQs alive.
    pub eqs: usize,
    /// CQs alive.
    pub cqs: usize,
    /// QPs alive.
    pub qps: usize,
    /// MKeys alive.
    pub mkeys: usize,
    /// GID table entries set (each binds a RoCE address).
    pub gids: usize,
    /// The driver's live DMA mappings (0 when no device is attached).
    pub dma_mappings: usize,
}

impl Accounting {
    /// No pages, no objects (UAR, PD, TD, EQ, CQ, QP, MKey, GID), no DMA mappings.
    pub fn is_clean(&self) -> bool {
        self.pages_held == 0
            && self.uars == 0
            && self.pds == 0
            && self.tds == 0
            && self.eqs == 0
            && self.cqs == 0
            && self.qps == 0
            && self.mkeys == 0
            && self.gids == 0
            && self.dma_mappings == 0
    }
}

#[derive(Clone, Copy, Debug)]
struct Injection {
    opcode: CmdOpcode,
    status: CmdStatus,
    syndrome: u32,
}

#[derive(Debug, Default)]
struct FaultPlan {
    fail: Vec<Injection>,
    swallow: Vec<Option<CmdOpcode>>,
    delay: Vec<(Option<CmdOpcode>, Duration)>,
    dead: bool,
}

/// A command whose completion [`Faults::delay_next`] delayed: fetched, waiting to execute.
#[derive(Debug)]
struct Late {
    due: Instant,
    /// The device epoch it was rung in (a reset since then drops it).
    epoch: u64,
    cmd: cmdq::Command,
}

/// The longest delay [`Faults::delay_next`] accepts (10 minutes).
pub const MAX_DELAY: Duration = Duration::from_secs(600);

struct Shared {
    state: Mutex<State>,
    faults: Mutex<FaultPlan>,
    stats: Mutex<FirmwareStats>,
    device: Mutex<Weak<Device>>,
    late: Mutex<Vec<Late>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The firmware, as the device's [`DoorbellHandler`]; see the module docs.
pub struct Firmware {
    shared: Arc<Shared>,
}

impl fmt::Debug for Firmware {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Firmware").finish_non_exhaustive()
    }
}

/// A handle to a running [`Firmware`]: faults, counters, accounting.
#[derive(Clone)]
pub struct FirmwareHandle {
    shared: Arc<Shared>,
}

impl fmt::Debug for FirmwareHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FirmwareHandle")
            .field("accounting", &self.accounting())
            .finish()
    }
}

/// The fault hooks of a firmware (from [`FirmwareHandle::faults`]).
#[derive(Clone)]
pub struct Faults {
    shared: Arc<Shared>,
}

impl fmt::Debug for Faults {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Faults")
            .field(&*lock(&self.shared.faults))
            .finish()
    }
}

impl Firmware {
    /// A powered-on firmware.
    pub fn new(options: FirmwareOptions) -> Firmware {
        Firmware {
            shared: Arc::new(Shared {
                state: Mutex::new(State::new(options)),
                faults: Mutex::new(FaultPlan::default()),
                stats: Mutex::new(FirmwareStats::default()),
                device: Mutex::new(Weak::new()),
                late: Mutex::new(Vec::new()),
            }),
        }
    }

    /// A handle for tests and tools.
    pub fn handle(&self) -> FirmwareHandle {
        FirmwareHandle {
            shared: self.shared.clone(),
        }
    }
}

impl FirmwareHandle {
    /// Tell the handle which device the firmware runs in (for [`Faults::fatal`] and the DMA
    /// mapping count). [`crate::Emulator::start`] does it.
    pub fn attach(&self, dev: &Arc<Device>) {
        *lock(&self.shared.device) = Arc::downgrade(dev);
        let s = lock(&self.shared.state);
        crate::hca::lock(&s.hca).attach(Arc::downgrade(dev));
    }

    /// The data path's counters (EQEs, CQEs, interrupts, packets, faults).
    pub fn hca_stats(&self) -> crate::hca::HcaStats {
        let s = lock(&self.shared.state);
        crate::hca::lock(&s.hca).stats()
    }

    /// The RoCE addresses the GID table has bound.
    pub fn bound_addresses(&self) -> Vec<std::net::IpAddr> {
        let s = lock(&self.shared.state);
        crate::hca::lock(&s.hca).bound_addresses()
    }

    /// The fault hooks.
    pub fn faults(&self) -> Faults {
        Faults {
            shared: self.shared.clone(),
        }
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> FirmwareStats {
        lock(&self.shared.stats).clone()
    }

    /// What is held now.
    pub fn accounting(&self) -> Accounting {
        let dma_mappings = lock(&self.shared.device)
            .upgrade()
            .map_or(0, |d| d.dma().mappings().len());
        let s = lock(&self.shared.state);
        let live = crate::hca::lock(&s.hca).live();
        Accounting {
            phase: s.phase,
            pages_held: s.pages.len(),
            uars: s.uars.len(),
            pds: s.pds.len(),
            tds: s.tds.len(),
            eqs: live.eqs,
            cqs: live.cqs,
            qps: live.qps,
            mkeys: live.mkeys,
            gids: live.gids,
            dma_mappings,
        }
    }

    /// The life-cycle state.
    pub fn phase(&self) -> Phase {
        lock(&self.shared.state).phase
    }

    /// The pages held, ascending.
    pub fn pages(&self) -> Vec<u64> {
        lock(&self.shared.state).pages.iter().copied().collect()
    }

    /// The HOST_ENDIANNESS `he` bit the driver wrote (None before any write).
    pub fn host_endianness(&self) -> Option<u32> {
        lock(&self.shared.state).host_endianness
    }

    /// The string of the last SET_DRIVER_VERSION.
    pub fn driver_version(&self) -> Option<String> {
        lock(&self.shared.state).driver_version.clone()
    }

    /// The current ISSI.
    pub fn issi(&self) -> u32 {
        lock(&self.shared.state).issi
    }

    /// Delayed commands still waiting to execute ([`Faults::delay_next`]).
    pub fn late_pending(&self) -> usize {
        lock(&self.shared.late).len()
    }

    /// Execute and complete the delayed commands whose delay has ended ([`Faults::delay_next`]);
    /// how many completed. The emulator's watcher thread calls it after each scan of BAR0
    /// (so a delay ends within the watcher's longest sleep, 1 ms, of its deadline); an
    /// in-process harness that runs [`crate::watch::Watcher::scan`] itself calls it too.
    /// A command rung before the last reset of `dev`, or after a fatal health syndrome, is
    /// dropped (counted in [`FirmwareStats::late_dropped`]).
    pub fn deliver_late(&self, dev: &Device) -> usize {
        let sh = &self.shared;
        let due: Vec<Late> = {
            let mut late = lock(&sh.late);
            if late.is_empty() {
                return 0;
            }
            let now = Instant::now();
            let mut due = Vec::new();
            let mut i = 0;
            while i < late.len() {
                if late[i].due <= now {
                    due.push(late.remove(i));
                } else {
                    i += 1;
                }
            }
            due
        };
        let mut done = 0;
        let epoch = dev.epoch();
        for l in due {
            if l.epoch != epoch || lock(&sh.faults).dead {
                lock(&sh.stats).late_dropped += 1;
                tracing::info!(
                    slot = l.cmd.slot,
                    "delayed command dropped: reset or fatal since"
                );
                continue;
            }
            tracing::info!(slot = l.cmd.slot, op = %CmdOpcode::from_raw(l.cmd.opcode), "delayed command executes now");
            finish(sh, dev, &l.cmd);
            done += 1;
        }
        done
    }
}

impl Faults {
    /// The next command with `opcode` fails with `status` and `syndrome` (0 becomes
    /// [`syndrome::INJECTED`]) without executing. Several may be queued; each fires once.
    pub fn fail_next(&self, opcode: CmdOpcode, status: CmdStatus, syndrome: u32) {
        let syndrome = if syndrome == 0 {
            syndrome::INJECTED
        } else {
            syndrome
        };
        lock(&self.shared.faults).fail.push(Injection {
            opcode,
            status,
            syndrome,
        });
    }

    /// The next command (with `opcode`, or any when `None`) is neither executed nor
    /// completed: its entry stays owned by hardware, so the driver must time out.
    pub fn swallow_next(&self, opcode: Option<CmdOpcode>) {
        lock(&self.shared.faults).swallow.push(opcode);
    }

    /// The next command (with `opcode`, or any when `None`) executes and completes `delay`
    /// (at most [`MAX_DELAY`]) after its doorbell: until then its entry stays owned by
    /// hardware and the function's state is unchanged; then the firmware executes it
    /// (a [`Faults::fail_next`] injection for it applies then), writes its output, clears
    /// ownership and posts the completion EQE (events mode), as a slow firmware would.
    /// Meanwhile the other slots, the data path and the health counter go on; a ring of the
    /// delayed command's own slot is ignored ([`FirmwareStats::ignored_busy`]). A reset or a
    /// fatal syndrome before the delay ends drops the command. Several may be queued; each
    /// fires once. `false` (nothing queued) when `delay` exceeds [`MAX_DELAY`].
    pub fn delay_next(&self, opcode: Option<CmdOpcode>, delay: Duration) -> bool {
        if delay > MAX_DELAY {
            return false;
        }
        lock(&self.shared.faults).delay.push((opcode, delay));
        true
    }

    /// The next completion QP `qpn` (any QP when `None`) writes on `side` becomes an error
    /// CQE with `syndrome` (a [`rnic_mlx5_prm::CqeSyndrome`] or any other nonzero byte) and
    /// `vendor_err_synd` = `vendor`; the QP goes to ERR and its later WQEs flush (see
    /// [`crate::hca::CqeInjection`] for exactly which completion). Several may be queued; each
    /// fires once. `false` when `syndrome` is 0 (success, not an error); the injection is
    /// dropped by a reset.
    pub fn error_cqe(&self, injection: crate::hca::CqeInjection) -> bool {
        if injection.syndrome == 0 {
            return false;
        }
        let s = lock(&self.shared.state);
        crate::hca::lock(&s.hca).inject_error_cqe(injection);
        true
    }

    /// Declare a fatal error: health buffer `synd` (and the `health_syndrome` byte of
    /// `health_counter`) = `synd`, the health counter stops, and commands are no longer
    /// served (rings are ignored). A function reset clears it. Needs an attached device.
    pub fn fatal(&self, synd: HealthSyndrome) -> bool {
        let Some(dev) = lock(&self.shared.device).upgrade() else {
            return false;
        };
        lock(&self.shared.faults).dead = true;
        dev.declare_fatal(synd.as_raw());
        tracing::warn!(syndrome = %synd, "fatal health syndrome declared (fault hook)");
        true
    }

    /// The firmware wants `n` more pages (`n` < 0: wants to return `-n`) at run time: a
    /// PAGE_REQUEST EQE (type 0x0b, `num_pages` = n) goes to the EQ that asks for page
    /// requests, and QUERY_PAGES(regular) reports the demand. `false` when no EQ asks for
    /// page requests or no device is attached (the demand stands either way).
    pub fn request_pages(&self, n: i32) -> bool {
        let dev = lock(&self.shared.device).upgrade();
        let mut s = lock(&self.shared.state);
        s.request_pages(n);
        let Some(dev) = dev else {
            return false;
        };
        crate::hca::lock(&s.hca).page_request_event(&dev, n)
    }

    /// Drop every pending hook: fail, swallow, delay, error CQE (a declared fatal error stays
    /// until reset; a command already being delayed still completes).
    pub fn clear(&self) {
        {
            let mut f = lock(&self.shared.faults);
            f.fail.clear();
            f.swallow.clear();
            f.delay.clear();
        }
        let s = lock(&self.shared.state);
        crate::hca::lock(&s.hca).clear_injections();
    }
}

/// The command queue's IOVA as the driver wrote it into the init segment, if it did.
fn cmdq_base(dev: &Device) -> Option<u64> {
    let bar = dev.bar();
    let h = bar.read32_be(initial_seg::cmdq_phy_addr_63_32.dword_offset() as u64);
    let l = bar.read32_be(initial_seg::cmdq_phy_addr_31_12.dword_offset() as u64);
    let base =
        (u64::from(h) << 32) | (u64::from(initial_seg::cmdq_phy_addr_31_12.extract(l)) << 12);
    (base != 0).then_some(base)
}

impl Firmware {
    fn run_slot(&self, dev: &Device, base: u64, slot: u32) {
        let sh = &self.shared;
        let cmd = match cmdq::fetch(dev, base, iseg::LOG_CMDQ_STRIDE, slot) {
            cmdq::Fetch::Ignored(why) => {
                let mut st = lock(&sh.stats);
                match why {
                    cmdq::Ignored::NoQueue => st.ignored_no_queue += 1,
                    cmdq::Ignored::EntryUnreadable => st.ignored_unreadable += 1,
                    cmdq::Ignored::NotOwned => st.ignored_not_owned += 1,
                }
                tracing::debug!(slot, ?why, "command doorbell ignored");
                return;
            }
            cmdq::Fetch::Refused { entry_iova, status } => {
                tracing::warn!(slot, %status, "command refused by the transport (delivery status)");
                cmdq::finish(dev, entry_iova, status);
                *lock(&sh.stats)
                    .delivery_errors
                    .entry(status.as_raw())
                    .or_default() += 1;
                return;
            }
            cmdq::Fetch::Ready(cmd) => cmd,
        };
        let op = CmdOpcode::from_raw(cmd.opcode);
        if lock(&sh.late).iter().any(|l| l.cmd.slot == slot) {
            lock(&sh.stats).ignored_busy += 1;
            tracing::warn!(slot, %op, "ring of a slot whose delayed command still executes: ignored");
            return;
        }
        {
            let mut f = lock(&sh.faults);
            if let Some(i) = f.swallow.iter().position(|o| o.is_none_or(|o| o == op)) {
                f.swallow.remove(i);
                drop(f);
                lock(&sh.stats).swallowed += 1;
                tracing::info!(slot, %op, "command swallowed (fault hook): never completed");
                return;
            }
            if let Some(i) = f.delay.iter().position(|(o, _)| o.is_none_or(|o| o == op)) {
                let (_, delay) = f.delay.remove(i);
                drop(f);
                lock(&sh.stats).delayed += 1;
                tracing::info!(slot, %op, ?delay, "command delayed (fault hook)");
                lock(&sh.late).push(Late {
                    due: Instant::now() + delay,
                    epoch: dev.epoch(),
                    cmd,
                });
                return;
            }
        }
        finish(sh, dev, &cmd);
    }
}

/// Execute a fetched command (or fail it, if a [`Faults::fail_next`] injection names it),
/// deliver its output and ownership, post its completion EQE and count it.
fn finish(sh: &Shared, dev: &Device, cmd: &cmdq::Command) {
    let slot = cmd.slot;
    let op = CmdOpcode::from_raw(cmd.opcode);
    let injected = {
        let mut f = lock(&sh.faults);
        f.fail
            .iter()
            .position(|i| i.opcode == op)
            .map(|i| f.fail.remove(i))
    };
    let mut out = vec![0u8; cmd.outlen.max(rnic_mlx5_prm::CMD_INLINE_BYTES)];
    let result = match injected {
        Some(i) => {
            lock(&sh.stats).injected += 1;
            Err(Refusal {
                status: i.status,
                syndrome: i.syndrome,
            })
        }
        None => lock(&sh.state).execute(dev, op, &cmd.input, cmd.outlen, &mut out),
    };
    if let Err(r) = result {
        out.fill(0);
        let mut o = MboxOut::new_unchecked(&mut out[..]);
        let _ = o.set_status(u32::from(r.status.as_raw()));
        let _ = o.set_syndrome(r.syndrome);
        tracing::debug!(slot, %op, status = %r.status, syndrome = format_args!("{:#x}", r.syndrome), "command failed");
    } else {
        tracing::debug!(slot, %op, "command ok");
    }
    let delivery = cmdq::complete(dev, cmd, &out);
    // Events mode: a command completion EQE on the EQ that asks for them.
    {
        let s = lock(&sh.state);
        let posted = crate::hca::lock(&s.hca).command_event(dev, slot);
        drop(s);
        if posted {
            lock(&sh.stats).command_events += 1;
        }
    }
    let mut st = lock(&sh.stats);
    if delivery != DeliveryStatus::Ok {
        *st.delivery_errors.entry(delivery.as_raw()).or_default() += 1;
        return;
    }
    *st.commands.entry(op.as_raw()).or_default() += 1;
    if let Err(r) = result {
        *st.errors.entry(r.status.as_raw()).or_default() += 1;
    }
}

impl DoorbellHandler for Firmware {
    fn command_doorbell(&mut self, dev: &Device, bits: u32) {
        if lock(&self.shared.faults).dead {
            lock(&self.shared.stats).ignored_dead += u64::from(bits.count_ones());
            return;
        }
        let slots = 1u32 << iseg::LOG_CMDQ_SIZE;
        let Some(base) = cmdq_base(dev) else {
            lock(&self.shared.stats).ignored_no_queue += u64::from(bits.count_ones());
            return;
        };
        for slot in 0..32 {
            if bits & (1 << slot) == 0 {
                continue;
            }
            if slot >= slots {
                lock(&self.shared.stats).ignored_bad_slot += 1;
                continue;
            }
            self.run_slot(dev, base, slot);
        }
    }

    fn uar_doorbell(&mut self, dev: &Device, page: u32, offset: u32, value: u64) {
        let hca = lock(&self.shared.state).hca.clone();
        crate::hca::lock(&hca).uar_doorbell(dev, page, offset, value);
    }

    fn init_segment_write(&mut self, _dev: &Device, offset: u32, value: u32) {
        tracing::debug!(
            offset = format_args!("{offset:#x}"),
            value = format_args!("{value:#x}"),
            "command queue address register written"
        );
    }

    fn reset(&mut self, _dev: &Device) {
        let dev = lock(&self.shared.device).clone();
        let mut s = lock(&self.shared.state);
        let options = s.options;
        *s = State::attached(options, dev);
        drop(s);
        lock(&self.shared.faults).dead = false;
        let dropped = std::mem::take(&mut *lock(&self.shared.late)).len();
        if dropped > 0 {
            lock(&self.shared.stats).late_dropped += dropped as u64;
            tracing::info!(dropped, "delayed commands dropped by the reset");
        }
    }
}
