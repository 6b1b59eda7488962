//! [`Device`]: the emulated function's state shared by the serving thread,
//! the watcher and the health ticker — BAR0, config space, the DMA table,
//! MSI-X, the boot clock and the firmware hook.
//!
//! # Power-on and reset
//!
//! At power-on (start, `DEVICE_RESET`, client disconnect) BAR0 is zeroed,
//! the init segment rewritten with `initializing` set, config space returns
//! to its power-on contents (bus mastering off), the watched UAR pages are
//! forgotten and the handler's `reset` runs. `initializing` clears
//! [`Options::boot_delay`] later. A reset keeps the DMA mappings and MSI-X
//! eventfds (they belong to the vfio-user connection — the IOMMU and the
//! interrupt routing — not to the function); a disconnect drops them too.
//!
//! # Health
//!
//! Every [`Options::health_period`] the ticker increments `health_counter`
//! bits 23:0 (0x1010) and refreshes `internal_timer` (0x1000, ns since
//! power-on, so it moves at tick granularity). A driver that sees the counter
//! stop for several of its polls declares the device dead (mlx5.md §2).

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::{Duration, Instant};

use rnic_mlx5_prm::{NicState, health_buffer, initial_seg};
use tracing::info;

use crate::bar::MSIX_VECTORS;
use crate::bar::{
    BAR0_SIZE, Bar, FIRST_NON_UAR_PAGE, FwRev, INIT_SEGMENT_PAGES, iseg, write_power_on,
};
use crate::config::ConfigSpace;
use crate::dma::{DmaFault, DmaSpace, FaultKind};
use crate::error::EmuError;
use crate::eth::{EthPort, PortCounters, Wire};
use crate::firmware::FirmwareOptions;
use crate::irq::{IrqError, Msix, Signal};
use crate::watch::DoorbellHandler;

/// How BAR0 is to be mapped, as config space advertises it (BAR0's prefetchable bit).
///
/// The contract with the driver: a prefetchable BAR0 may be mapped write-combining (the
/// BlueFlame registers then take whole WQEs), a non-prefetchable one is uncached, as kernel
/// VFIO maps every BAR (`pgprot_noncached`), and takes 8-byte doorbells only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bar0Mapping {
    /// Uncached: a non-prefetchable 64-bit memory BAR (the default: what kernel VFIO gives).
    Uc,
    /// Write-combining: a prefetchable 64-bit memory BAR.
    Wc,
}

/// How the emulated function behaves.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Time from power-on until `initializing` clears (default 100 ms).
    pub boot_delay: Duration,
    /// Health counter period (default 50 ms).
    pub health_period: Duration,
    /// Firmware revision reported (default 16.35.2000).
    pub fw: FwRev,
    /// What the firmware ([`crate::firmware::Firmware`]) asks for and reports.
    pub firmware: FirmwareOptions,
    /// BAR0 caching as advertised in config space (default uncached).
    pub bar0: Bar0Mapping,
    /// What the port is cabled to (default [`Wire::Udp`]: RoCE over host UDP sockets).
    pub wire: Wire,
    /// The port MTU on an Ethernet wire: the most L2 payload bytes a frame may carry in
    /// either direction (default 9000; larger frames are dropped and counted).
    pub port_mtu: u32,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            boot_delay: Duration::from_millis(100),
            health_period: Duration::from_millis(50),
            fw: FwRev::default(),
            firmware: FirmwareOptions::default(),
            bar0: Bar0Mapping::Uc,
            wire: Wire::Udp,
            port_mtu: 9000,
        }
    }
}

/// Device-level counters.
#[derive(Debug, Default)]
pub struct DeviceStats {
    /// Command doorbell events delivered.
    pub command_doorbells: AtomicU64,
    /// UAR doorbell events delivered.
    pub uar_doorbells: AtomicU64,
    /// Power-on resets (including the first power-on).
    pub resets: AtomicU64,
    /// Client connections that ended.
    pub connections: AtomicU64,
    /// Panics of the vfio-user serving code caught and contained.
    pub contained_panics: AtomicU64,
    /// Health counter ticks.
    pub health_ticks: AtomicU64,
}

#[derive(Debug)]
struct Boot {
    powered_on: Instant,
    ready_at: Instant,
    ready: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The emulated function; see the module docs.
pub struct Device {
    bar: Bar,
    config: Mutex<ConfigSpace>,
    dma: DmaSpace,
    msix: Msix,
    stats: DeviceStats,
    options: Options,
    boot: Mutex<Boot>,
    /// Scans and ticks hold it shared; power-on holds it exclusively, so
    /// nobody sees a half-reset BAR.
    quiesce: RwLock<()>,
    epoch: AtomicU64,
    health_stopped: AtomicBool,
    /// A fatal health syndrome (with `rfr`) was declared: commands and the data path stop.
    fatal: AtomicBool,
    /// The NIC interface state the firmware publishes in `cmdq_addr_l_sz` bits 10:8.
    nic_state: AtomicU8,
    /// The port's link (survives function resets: it is the cable, not the function).
    link: AtomicBool,
    uars: Mutex<Vec<u32>>,
    uar_gen: AtomicU64,
    handler: Mutex<Box<dyn DoorbellHandler>>,
    /// The port's counters (both wires).
    port_counters: Arc<PortCounters>,
    /// The Ethernet port (an Ethernet wire).
    eth: Option<Arc<EthPort>>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("bar", &self.bar)
            .field("options", &self.options)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl Device {
    /// A powered-on function with `handler` as its firmware hook.
    pub fn new(options: Options, handler: Box<dyn DoorbellHandler>) -> Result<Device, EmuError> {
        let now = Instant::now();
        let port_counters = Arc::new(PortCounters::default());
        let eth = if options.wire.is_ethernet() {
            Some(EthPort::start(
                options.wire,
                options.firmware.mac,
                options.port_mtu,
                port_counters.clone(),
            )?)
        } else {
            None
        };
        let dev = Device {
            bar: Bar::new(BAR0_SIZE)?,
            config: Mutex::new(ConfigSpace::power_on(options.bar0)),
            dma: DmaSpace::new(),
            msix: Msix::new(MSIX_VECTORS),
            stats: DeviceStats::default(),
            options,
            boot: Mutex::new(Boot {
                powered_on: now,
                ready_at: now + options.boot_delay,
                ready: false,
            }),
            quiesce: RwLock::new(()),
            epoch: AtomicU64::new(0),
            health_stopped: AtomicBool::new(false),
            fatal: AtomicBool::new(false),
            nic_state: AtomicU8::new(NicState::FullDriver.as_raw()),
            link: AtomicBool::new(options.firmware.link_up),
            uars: Mutex::new(Vec::new()),
            uar_gen: AtomicU64::new(0),
            handler: Mutex::new(handler),
            port_counters,
            eth,
        };
        dev.power_on_segment();
        dev.stats.resets.fetch_add(1, Ordering::Relaxed);
        Ok(dev)
    }

    /// BAR0.
    pub fn bar(&self) -> &Bar {
        &self.bar
    }

    /// The DMA table (prefer [`Device::dma_read`]/[`Device::dma_write`],
    /// which also check bus mastering).
    pub fn dma(&self) -> &DmaSpace {
        &self.dma
    }

    /// The MSI-X state.
    pub fn msix(&self) -> &Msix {
        &self.msix
    }

    /// Counters.
    pub fn stats(&self) -> &DeviceStats {
        &self.stats
    }

    /// The options it was started with.
    pub fn options(&self) -> &Options {
        &self.options
    }

    /// The port's counters (frames by direction, cast and drop cause).
    pub fn port_counters(&self) -> &Arc<PortCounters> {
        &self.port_counters
    }

    /// The address the port's dgram wire is bound to (its port chosen by the kernel when the
    /// wire said port 0); `None` on other wires.
    pub fn port_local_addr(&self) -> Option<std::net::SocketAddr> {
        self.eth.as_ref().and_then(|p| p.local)
    }

    /// The Ethernet port (on an Ethernet wire).
    pub(crate) fn eth_port(&self) -> Option<&Arc<EthPort>> {
        self.eth.as_ref()
    }

    /// Read config space.
    pub fn config_read(&self, offset: u64, dst: &mut [u8]) {
        lock(&self.config).read(offset, dst);
    }

    /// Write config space (through the write mask).
    pub fn config_write(&self, offset: u64, src: &[u8]) {
        lock(&self.config).write(offset, src);
    }

    /// Whether the driver enabled bus mastering.
    pub fn bus_master(&self) -> bool {
        lock(&self.config).bus_master()
    }

    /// The device reads driver memory at `iova` (faults if bus mastering is
    /// off or any byte is unmapped; nothing is read then).
    pub fn dma_read(&self, iova: u64, dst: &mut [u8]) -> Result<(), DmaFault> {
        if !self.bus_master() {
            return Err(self
                .dma
                .refuse(iova, dst.len(), false, FaultKind::BusMasterDisabled));
        }
        self.dma.read(iova, dst)
    }

    /// The device writes driver memory at `iova` (same checks).
    pub fn dma_write(&self, iova: u64, src: &[u8]) -> Result<(), DmaFault> {
        if !self.bus_master() {
            return Err(self
                .dma
                .refuse(iova, src.len(), true, FaultKind::BusMasterDisabled));
        }
        self.dma.write(iova, src)
    }

    /// Raise MSI-X `vector` (not sent while bus mastering is off).
    pub fn signal(&self, vector: u32) -> Result<Signal, IrqError> {
        if !self.bus_master() {
            self.msix.stats().dropped.fetch_add(1, Ordering::Relaxed);
            return Ok(Signal::BusMasterDisabled);
        }
        self.msix.signal(vector)
    }

    /// Whether `initializing` (0x1fc bit31) is still set.
    pub fn initializing(&self) -> bool {
        self.bar.read32_be(iseg::INITIALIZING) & iseg::INITIALIZING_BIT != 0
    }

    /// Start watching UAR page `page` for doorbell writes (the firmware calls
    /// it when it hands the page out with ALLOC_UAR).
    pub fn watch_uar(&self, page: u32) -> Result<(), EmuError> {
        if page < INIT_SEGMENT_PAGES {
            return Err(EmuError::UarPage {
                page,
                reason: "pages 0..=2 hold the initialization segment",
            });
        }
        if page >= FIRST_NON_UAR_PAGE {
            return Err(EmuError::UarPage {
                page,
                reason: "the last two pages hold the MSI-X table and PBA, or past BAR0",
            });
        }
        let mut u = lock(&self.uars);
        if !u.contains(&page) {
            u.push(page);
            u.sort_unstable();
            self.uar_gen.fetch_add(1, Ordering::Release);
        }
        Ok(())
    }

    /// Stop watching UAR page `page`.
    pub fn unwatch_uar(&self, page: u32) {
        lock(&self.uars).retain(|&p| p != page);
        self.uar_gen.fetch_add(1, Ordering::Release);
    }

    /// The watched UAR pages, ascending.
    pub fn watched_uars(&self) -> Vec<u32> {
        lock(&self.uars).clone()
    }

    pub(crate) fn uar_generation(&self) -> u64 {
        self.uar_gen.load(Ordering::Acquire)
    }

    /// Stop the health counter (a fatal firmware state; the driver's health poll sees it
    /// stuck). A reset restarts it.
    pub fn stop_health_counter(&self) {
        self.health_stopped.store(true, Ordering::Release);
    }

    /// A fatal error (mlx5.md §2: `rfr && synd`): health buffer `synd` and the
    /// `health_syndrome` byte of `health_counter` become `synd`, `rfr` is set, the counter
    /// stops, and [`Device::is_fatal`] holds (the firmware stops serving commands and the data
    /// path). Serialized with the health tick (both hold the boot lock), so neither write is
    /// lost. A reset clears it.
    pub fn declare_fatal(&self, synd: u8) {
        let _boot = lock(&self.boot);
        self.stop_health_counter();
        self.fatal.store(true, Ordering::Release);
        self.write_syndrome(synd, true);
    }

    /// A syndrome without `rfr` (a warning the firmware reports, not a fatal state): health
    /// buffer `synd` and the `health_syndrome` byte are set, `rfr` stays clear, the counter
    /// keeps ticking and the function keeps working. A reset clears it.
    pub fn report_syndrome(&self, synd: u8) {
        let _boot = lock(&self.boot);
        self.write_syndrome(synd, false);
    }

    fn write_syndrome(&self, synd: u8, rfr: bool) {
        let raw = u32::from(synd);
        let base = initial_seg::health_buffer.byte_offset();
        let at = (base + health_buffer::synd.dword_offset()) as u64;
        self.bar
            .write32_be(at, health_buffer::synd.insert(self.bar.read32_be(at), raw));
        let at = (base + health_buffer::rfr.dword_offset()) as u64;
        self.bar.write32_be(
            at,
            health_buffer::rfr.insert(self.bar.read32_be(at), u32::from(rfr)),
        );
        let hc = initial_seg::health_syndrome.dword_offset() as u64;
        self.bar.write32_be(
            hc,
            initial_seg::health_syndrome.insert(self.bar.read32_be(hc), raw),
        );
    }

    /// Whether a fatal syndrome (with `rfr`) was declared since the last reset.
    pub fn is_fatal(&self) -> bool {
        self.fatal.load(Ordering::Acquire)
    }

    /// Publish NIC interface state `state` in `cmdq_addr_l_sz` bits 10:8 (mlx5.md §2: the
    /// drivers read `(val >> 8) & 7`). Any state but full-driver stops the function (commands
    /// and data path) until a reset, which returns it to full driver. The watcher keeps the
    /// bits through driver writes of the register.
    pub fn set_nic_state(&self, state: NicState) {
        self.nic_state.store(state.as_raw(), Ordering::Release);
        loop {
            let cur = self.bar.read32_be(iseg::CMDQ_ADDR_L_SZ);
            let new = iseg::with_nic_state(cur, state.as_raw());
            if cur == new || self.bar.cas32_be(iseg::CMDQ_ADDR_L_SZ, cur, new) {
                return;
            }
        }
    }

    /// The NIC interface state the firmware publishes (full driver unless a fault set it).
    pub fn nic_state(&self) -> NicState {
        NicState::from_raw(self.nic_state.load(Ordering::Acquire))
    }

    /// Whether the function serves commands and the data path: no fatal syndrome and the NIC
    /// interface in full-driver state.
    pub fn serving(&self) -> bool {
        !self.is_fatal() && self.nic_state() == NicState::FullDriver
    }

    /// Whether the port's link is up (QUERY_VPORT_STATE, PTYS; RoCE packets flow only then).
    pub fn link_up(&self) -> bool {
        self.link.load(Ordering::Acquire)
    }

    /// Set the port's link; whether it changed. The link is the cable's, so a function reset
    /// keeps it.
    pub fn set_link(&self, up: bool) -> bool {
        self.link.swap(up, Ordering::AcqRel) != up
    }

    /// The init segment at power-on; `cmd_interface_rev` reads 0 until `initializing` clears
    /// when [`crate::Strictness::cmdif_rev`] is on.
    fn power_on_segment(&self) {
        write_power_on(&self.bar, self.options.fw);
        if self.options.firmware.strictness.cmdif_rev {
            let v = self.bar.read32_be(iseg::CMDIF_REV_FW_SUB);
            self.bar.write32_be(iseg::CMDIF_REV_FW_SUB, v & 0xffff);
        }
    }

    /// Whether the health counter was stopped.
    pub fn health_counter_stopped(&self) -> bool {
        self.health_stopped.load(Ordering::Acquire)
    }

    /// Incremented by every power-on reset.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    pub(crate) fn with_handler<R>(&self, f: impl FnOnce(&mut dyn DoorbellHandler) -> R) -> R {
        f(lock(&self.handler).as_mut())
    }

    pub(crate) fn quiesced(&self) -> std::sync::RwLockReadGuard<'_, ()> {
        self.quiesce.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Function-level reset: back to the power-on state (see the module docs).
    pub fn reset(&self) -> Result<(), EmuError> {
        {
            let _q = self.quiesce.write().unwrap_or_else(PoisonError::into_inner);
            self.bar.zero()?;
            self.power_on_segment();
            *lock(&self.config) = ConfigSpace::power_on(self.options.bar0);
            let now = Instant::now();
            *lock(&self.boot) = Boot {
                powered_on: now,
                ready_at: now + self.options.boot_delay,
                ready: false,
            };
            lock(&self.uars).clear();
            self.health_stopped.store(false, Ordering::Release);
            self.fatal.store(false, Ordering::Release);
            self.nic_state
                .store(NicState::FullDriver.as_raw(), Ordering::Release);
            self.uar_gen.fetch_add(1, Ordering::Release);
            self.epoch.fetch_add(1, Ordering::AcqRel);
            self.stats.resets.fetch_add(1, Ordering::Relaxed);
        }
        self.with_handler(|h| h.reset(self));
        info!("function reset to power-on state");
        Ok(())
    }

    /// The client went away: drop its DMA mappings and eventfds, then reset.
    pub(crate) fn disconnect(&self) -> Result<(), EmuError> {
        let maps = self.dma.clear();
        self.msix.clear();
        info!(
            dma_mappings = maps,
            "client disconnected: mappings and vectors dropped"
        );
        self.reset()
    }

    /// One health tick; the time until the next wanted tick.
    pub(crate) fn tick(&self) -> Duration {
        let _q = self.quiesced();
        let mut boot = lock(&self.boot);
        let now = Instant::now();
        if !boot.ready && now >= boot.ready_at {
            // The revision first: a driver that sees `initializing` clear reads a valid one.
            let v = self.bar.read32_be(iseg::CMDIF_REV_FW_SUB);
            self.bar.write32_be(
                iseg::CMDIF_REV_FW_SUB,
                (iseg::CMDIF_REV << 16) | (v & 0xffff),
            );
            let v = self.bar.read32_be(iseg::INITIALIZING);
            self.bar
                .write32_be(iseg::INITIALIZING, v & !iseg::INITIALIZING_BIT);
            boot.ready = true;
            info!(after = ?boot.ready_at - boot.powered_on, "firmware initialized");
        }
        if !self.health_counter_stopped() {
            let c = self.bar.read32_be(iseg::HEALTH_COUNTER);
            self.bar.write32_be(
                iseg::HEALTH_COUNTER,
                (c & 0xff00_0000) | (c.wrapping_add(1) & 0x00ff_ffff),
            );
        }
        let ns = u64::try_from(now.duration_since(boot.powered_on).as_nanos()).unwrap_or(u64::MAX);
        self.bar.write64_be(iseg::INTERNAL_TIMER, ns);
        self.stats.health_ticks.fetch_add(1, Ordering::Relaxed);
        let period = self.options.health_period;
        if boot.ready {
            period
        } else {
            period.min(boot.ready_at.saturating_duration_since(now))
        }
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        if let Some(p) = &self.eth {
            p.stop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watch::NoFirmware;

    fn dev(boot_ms: u64) -> Device {
        Device::new(
            Options {
                boot_delay: Duration::from_millis(boot_ms),
                ..Options::default()
            },
            Box::new(NoFirmware),
        )
        .unwrap()
    }

    #[test]
    fn boot_delay_health_and_reset() {
        let d = dev(20);
        assert!(d.initializing());
        d.tick();
        assert!(d.initializing(), "not before the boot delay");
        std::thread::sleep(Duration::from_millis(25));
        d.tick();
        assert!(!d.initializing());
        assert_eq!(d.bar().read32_be(iseg::HEALTH_COUNTER), 2);
        assert!(d.bar().read64_be(iseg::INTERNAL_TIMER) > 20_000_000);
        d.bar().write32_be(iseg::CMDQ_ADDR_H, 0x1234);
        d.config_write(4, &[0x06, 0]);
        d.reset().unwrap();
        assert!(d.initializing());
        assert_eq!(d.bar().read32_be(iseg::HEALTH_COUNTER), 0);
        assert_eq!(d.bar().read32_be(iseg::CMDQ_ADDR_H), 0);
        assert!(!d.bus_master());
        assert_eq!(d.epoch(), 1);
    }

    #[test]
    fn health_counter_wraps_in_24_bits_and_keeps_the_syndrome_byte() {
        let d = dev(0);
        d.bar().write32_be(iseg::HEALTH_COUNTER, 0x7fff_ffff);
        d.tick();
        assert_eq!(d.bar().read32_be(iseg::HEALTH_COUNTER), 0x7f00_0000);
    }

    #[test]
    fn dma_and_signals_need_bus_mastering() {
        let d = dev(0);
        let mut b = [0u8; 4];
        assert_eq!(
            d.dma_read(0x1000, &mut b).unwrap_err().kind,
            FaultKind::BusMasterDisabled
        );
        assert_eq!(d.signal(0).unwrap(), Signal::BusMasterDisabled);
        d.config_write(4, &[0x06, 0]);
        assert_eq!(
            d.dma_read(0x1000, &mut b).unwrap_err().kind,
            FaultKind::Unmapped
        );
        assert_eq!(d.signal(0).unwrap(), Signal::NotConnected);
    }

    #[test]
    fn uar_pages_exclude_the_init_segment_and_msix() {
        let d = dev(0);
        assert!(d.watch_uar(0).is_err());
        assert!(d.watch_uar(2).is_err());
        assert!(d.watch_uar(FIRST_NON_UAR_PAGE).is_err());
        d.watch_uar(3).unwrap();
        d.watch_uar(FIRST_NON_UAR_PAGE - 1).unwrap();
        assert_eq!(d.watched_uars(), vec![3, FIRST_NON_UAR_PAGE - 1]);
        d.unwatch_uar(3);
        assert_eq!(d.watched_uars(), vec![FIRST_NON_UAR_PAGE - 1]);
    }
}
