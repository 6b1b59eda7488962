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
//!   of a QP into an error CQE ([`Faults::error_cqe`]), report a health syndrome with or
//!   without `rfr` ([`Faults::health`]), set the NIC interface state ([`Faults::nic_state`]) or
//!   the port's link ([`Faults::set_link`]), answer MANAGE_PAGES takes with nothing
//!   ([`Faults::take_zero`]), rewrite a reply's headers ([`Faults::rewrite_next_reply`]).
//! - **Strictness** ([`Strictness`], issue 26): one switch per check the audit asked for —
//!   commands held until their page request is answered (row 1), BlueFlame bodies judged
//!   ([`bf`]), UD MTU, zero-length receive segments, fatal EQ overrun, SET_HCA_CAP payload,
//!   `cmd_interface_rev` while initializing, CREATE_CQ `pas[]` length.
//! - **Accounting** ([`FirmwareHandle::accounting`], [`FirmwareHandle::stats`]): pages held,
//!   live UARs/PDs/TDs, DMA mappings; commands by opcode, errors by status, delivery errors.
//!
//! # Locking
//!
//! The device calls the handler under its handler lock; the handler then takes the state
//! lock. A [`FirmwareHandle`] takes only the state, fault or stats locks, never the handler
//! lock, so test threads can inspect the firmware while it runs.

pub mod bf;
pub mod caps;
pub mod cmdq;
pub mod exec;
pub mod strict;
pub mod syndrome;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use rnic_mlx5_prm::{
    CmdOpcode, CmdStatus, DeliveryStatus, HealthSyndrome, MboxIn, MboxOut, initial_seg,
    manage_pages_op_mod,
};

use crate::bar::iseg;
use crate::device::Device;
use crate::watch::DoorbellHandler;

pub use exec::{Phase, Refusal, State};
pub use strict::Strictness;

/// The port's link layer (general cap `port_type`, mlx5.md §5.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortType {
    /// Ethernet (`port_type` 1): RoCE.
    Eth,
    /// InfiniBand (`port_type` 0): a VPI port in IB mode; RoCE setup is refused.
    Ib,
}

/// The port speed PTYS reports (one Ethernet link mode of K `enum mlx5e_link_mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortSpeed {
    /// 10GBASE-CR (link mode bit 12).
    G10,
    /// 25GBASE-CR (bit 27).
    G25,
    /// 40GBASE-CR4 (bit 6).
    G40,
    /// 50GBASE-CR2 (bit 30).
    G50,
    /// 100GBASE-CR4 (bit 20).
    G100,
}

impl PortSpeed {
    /// The speed in Gb/s.
    pub fn gbps(self) -> u32 {
        match self {
            PortSpeed::G10 => 10,
            PortSpeed::G25 => 25,
            PortSpeed::G40 => 40,
            PortSpeed::G50 => 50,
            PortSpeed::G100 => 100,
        }
    }

    /// The speed of `gbps` Gb/s, if one of the five.
    pub fn from_gbps(gbps: u32) -> Option<PortSpeed> {
        [
            PortSpeed::G10,
            PortSpeed::G25,
            PortSpeed::G40,
            PortSpeed::G50,
            PortSpeed::G100,
        ]
        .into_iter()
        .find(|s| s.gbps() == gbps)
    }

    /// Its bit in PTYS `eth_proto_capability` / `_admin` / `_oper` (K `MLX5E_PROT_MASK`).
    pub fn eth_proto_bit(self) -> u32 {
        1 << match self {
            PortSpeed::G10 => 12,
            PortSpeed::G25 => 27,
            PortSpeed::G40 => 6,
            PortSpeed::G50 => 30,
            PortSpeed::G100 => 20,
        }
    }
}

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
    /// Whether the port's link is up when the emulator starts (QUERY_VPORT_STATE `state`;
    /// [`Faults::set_link`] changes it at run time).
    pub link_up: bool,
    /// Which of issue 26's checks are on (default [`Strictness::legacy`] for now).
    pub strictness: Strictness,
    /// Firmware pages one CQ, QP or MKey costs while [`Strictness::page_requests`] is on
    /// (default 1; 0 charges nothing).
    pub object_pages: u32,
    /// The port's link layer (default Ethernet).
    pub port_type: PortType,
    /// The speed PTYS reports (default 100 Gb/s).
    pub port_speed: PortSpeed,
    /// General cap `num_vhca_ports` (default 0): when nonzero, SET/QUERY_ROCE_ADDRESS must
    /// name a port 1..=n in `vhca_port_num`.
    pub num_vhca_ports: u8,
    /// Advertise cap `terminate_scatter_list_mkey` (default off): QUERY_SPECIAL_CONTEXTS then
    /// names the key that ends a receive scatter list, and 0x100 is an ordinary key.
    pub terminate_scatter_key: bool,
    /// General cap `atomic` (default on). Off: RST2INIT with `rae` or `atomic_mode` is refused.
    pub atomic: bool,
    /// RoCE cap `qp_ts_format` (default 0: free-running only; 1 real-time only; 2 both).
    /// CREATE_QP's `ts_format` must be one it allows.
    pub roce_qp_ts_format: u32,
    /// The vport context's `min_wqe_inline_mode` (default [`inline_mode::L2`]): the headers
    /// every raw Ethernet send WQE must carry inline; CREATE_SQ refuses an SQ asking for less.
    ///
    /// [`inline_mode::L2`]: rnic_mlx5_prm::inline_mode::L2
    pub min_inline: u32,
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
            strictness: Strictness::default(),
            object_pages: 1,
            port_type: PortType::Eth,
            port_speed: PortSpeed::G100,
            num_vhca_ports: 0,
            terminate_scatter_key: false,
            atomic: true,
            roce_qp_ts_format: 0,
            min_inline: rnic_mlx5_prm::inline_mode::L2,
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
    /// Rings while the NIC interface state was disabled or SW reset (ignored).
    pub ignored_nic_state: u64,
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
    /// MANAGE_PAGES takes answered with 0 entries by [`Faults::take_zero`].
    pub take_zeroed: u64,
    /// Replies whose mailbox headers or entry token [`Faults::rewrite_next_reply`] rewrote.
    pub rewritten_replies: u64,
    /// Commands held until their page request was answered ([`Strictness::page_requests`]).
    pub parked: u64,
    /// PAGE_REQUEST EQEs posted for parked commands.
    pub parked_page_requests: u64,
    /// Parked commands failed (NO_RES `PAGES_CANT_GIVE`) by a MANAGE_PAGES op_mod 0.
    pub cant_give: u64,
    /// Parked commands a reset dropped (never executed, never completed).
    pub parked_dropped: u64,
    /// Send doorbells whose BlueFlame half held a body on a BAR0 advertised uncached
    /// (`blueflame` check): served as 8-byte doorbells.
    pub bf_uncombined: u64,
    /// Send doorbells whose BlueFlame body held bytes of another write (`blueflame` check).
    pub bf_interleaved: u64,
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
    /// Raw Ethernet objects alive: TISes, SQs, RQs, TIRs.
    pub eth_objects: usize,
    /// Flow steering objects alive: flow tables, groups, entries.
    pub flow_objects: usize,
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
            && self.eth_objects == 0
            && self.flow_objects == 0
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
    /// MANAGE_PAGES takes still to answer with 0 entries ([`Faults::take_zero`]).
    take_zero: u32,
    /// Replies still to rewrite ([`Faults::rewrite_next_reply`]).
    rewrite: Vec<cmdq::ReplyRewrite>,
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
    bf: Mutex<bf::BfJudge>,
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
                bf: Mutex::new(bf::BfJudge::default()),
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
            eth_objects: live.eth,
            flow_objects: live.flow,
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

    /// What the watcher runs after each scan of BAR0: [`FirmwareHandle::deliver_late`], and
    /// the judging of BlueFlame bodies ([`bf`], the `blueflame` check). The events it handled.
    pub fn after_scan(&self, dev: &Device) -> usize {
        let late = self.deliver_late(dev);
        if !dev.options().firmware.strictness.blueflame {
            return late;
        }
        let uc = dev.options().bar0 == crate::device::Bar0Mapping::Uc;
        let v = {
            let mut j = lock(&self.shared.bf);
            if j.is_idle() {
                return late;
            }
            j.judge(dev.bar(), uc)
        };
        if v != bf::Verdicts::default() {
            let mut st = lock(&self.shared.stats);
            st.bf_uncombined += v.uncombined;
            st.bf_interleaved += v.interleaved;
        }
        late
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
            if l.epoch != epoch || !dev.serving() {
                lock(&sh.stats).late_dropped += 1;
                tracing::info!(
                    slot = l.cmd.slot,
                    "delayed command dropped: reset or fatal since"
                );
                continue;
            }
            tracing::info!(slot = l.cmd.slot, op = %CmdOpcode::from_raw(l.cmd.opcode), "delayed command executes now");
            dispatch(sh, dev, &l.cmd);
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

    /// Declare a fatal error: [`Faults::health`] with `rfr`.
    pub fn fatal(&self, synd: HealthSyndrome) -> bool {
        self.health(synd, true)
    }

    /// Report health syndrome `synd` (mlx5.md §2): health buffer `synd` and the
    /// `health_syndrome` byte of `health_counter` = `synd`. With `rfr` ("reset firmware
    /// required") it is fatal: `rfr` is set, the health counter stops, and commands and the
    /// data path are no longer served (rings, doorbells and packets are ignored and counted).
    /// Without, it is a warning: `rfr` stays clear, the counter keeps ticking and the function
    /// keeps working. A function reset clears either. `false` without an attached device.
    pub fn health(&self, synd: HealthSyndrome, rfr: bool) -> bool {
        let Some(dev) = lock(&self.shared.device).upgrade() else {
            return false;
        };
        if rfr {
            dev.declare_fatal(synd.as_raw());
            tracing::warn!(syndrome = %synd, "fatal health syndrome declared, rfr (fault hook)");
        } else {
            dev.report_syndrome(synd.as_raw());
            tracing::warn!(syndrome = %synd, "health syndrome reported without rfr (fault hook)");
        }
        true
    }

    /// Publish NIC interface state `state` (disabled or SW reset, mlx5.md §2) in
    /// `cmdq_addr_l_sz` bits 10:8, as a firmware reset initiated elsewhere shows up: the
    /// function stops serving commands and the data path until a function reset. `false`
    /// without an attached device.
    pub fn nic_state(&self, state: rnic_mlx5_prm::NicState) -> bool {
        let Some(dev) = lock(&self.shared.device).upgrade() else {
            return false;
        };
        dev.set_nic_state(state);
        tracing::warn!(%state, "NIC interface state set (fault hook)");
        true
    }

    /// Set the port's link up or down: QUERY_VPORT_STATE and PTYS report it, a change posts
    /// a PORT_CHANGE EQE (sub_type active 4 / down 1, port 1) on the EQ that asks for port
    /// changes, and while it is down no RoCE packet is sent or received (dropped, counted in
    /// [`crate::HcaStats::link_down_drops`]). The link survives function resets. Whether an EQ
    /// took the event (`false` also when nothing changed or no device is attached).
    pub fn set_link(&self, up: bool) -> bool {
        let Some(dev) = lock(&self.shared.device).upgrade() else {
            return false;
        };
        if !dev.set_link(up) {
            return false;
        }
        tracing::info!(up, "port link changed (fault hook)");
        let s = lock(&self.shared.state);
        crate::hca::lock(&s.hca).port_change_event(&dev, up)
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

    /// The next `n` MANAGE_PAGES take (op_mod 2) commands complete OK with
    /// `output_num_entries` 0 and nothing returned, whatever the firmware holds (a transient
    /// "nothing to give back now"; K keeps asking until its reclaim timeout, row 10), then
    /// takes behave normally again. Replaces an earlier count.
    pub fn take_zero(&self, n: u32) {
        lock(&self.shared.faults).take_zero = n;
    }

    /// The next command's reply is written with its output-mailbox headers and/or entry token
    /// changed as `how` says (real firmware might; the kernel checks none of them, row 14):
    /// each output block's `token` becomes the command's token XOR 0xff, its `block_number`
    /// k + 1, the entry's `token` the token XOR 0xff. Queued; each applies to one command.
    pub fn rewrite_next_reply(&self, how: cmdq::ReplyRewrite) {
        lock(&self.shared.faults).rewrite.push(how);
    }

    /// Drop every pending hook: fail, swallow, delay, take-zero, reply rewrites, error CQE (a
    /// declared fatal error stays until reset; a command already being delayed still
    /// completes).
    pub fn clear(&self) {
        {
            let mut f = lock(&self.shared.faults);
            f.fail.clear();
            f.swallow.clear();
            f.delay.clear();
            f.take_zero = 0;
            f.rewrite.clear();
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
                *lock(&sh.stats)
                    .delivery_errors
                    .entry(status.as_raw())
                    .or_default() += 1;
                cmdq::finish(dev, entry_iova, status);
                return;
            }
            cmdq::Fetch::Ready(cmd) => cmd,
        };
        let op = CmdOpcode::from_raw(cmd.opcode);
        let busy = lock(&sh.late).iter().any(|l| l.cmd.slot == slot)
            || lock(&sh.state).parked.iter().any(|p| p.slot == slot);
        if busy {
            lock(&sh.stats).ignored_busy += 1;
            tracing::warn!(slot, %op, "ring of a slot whose command still executes: ignored");
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
        dispatch(sh, dev, &cmd);
    }
}

/// Run a fetched command — or park it until its pages arrive (row 1) — then run the parked
/// commands the pages now cover, or fail them all after a CANT_GIVE.
fn dispatch(sh: &Shared, dev: &Device, cmd: &cmdq::Command) {
    let op = CmdOpcode::from_raw(cmd.opcode);
    let injected = lock(&sh.faults).fail.iter().any(|i| i.opcode == op);
    if !injected {
        let mut s = lock(&sh.state);
        if let exec::Gate::Park { charge, ask } = s.page_gate(op, &cmd.input, cmd.outlen) {
            s.parked.push(exec::Parked {
                slot: cmd.slot,
                opcode: cmd.opcode,
                charge,
            });
            let posted = ask > 0 && {
                s.asked += ask;
                let n = i32::try_from(ask).unwrap_or(i32::MAX);
                crate::hca::lock(&s.hca).page_request_event(dev, n)
            };
            drop(s);
            let mut st = lock(&sh.stats);
            st.parked += 1;
            st.parked_page_requests += u64::from(posted);
            tracing::info!(
                slot = cmd.slot,
                %op,
                charge,
                ask,
                "command held until its pages arrive (PAGE_REQUEST)"
            );
            return;
        }
    }
    finish(sh, dev, cmd);
    let cant_give = op == CmdOpcode::ManagePages
        && MboxIn::new_unchecked(&cmd.input[..]).op_mod() == manage_pages_op_mod::ALLOC_FAIL;
    if cant_give {
        fail_parked(sh, dev);
    }
    resume_parked(sh, dev);
}

/// Re-read the entry of parked slot `slot` (the driver must leave a hardware-owned entry and
/// its mailboxes alone) for executing or failing it now.
fn refetch(sh: &Shared, dev: &Device, p: exec::Parked) -> Option<cmdq::Command> {
    let base = cmdq_base(dev)?;
    match cmdq::fetch(dev, base, iseg::LOG_CMDQ_STRIDE, p.slot) {
        cmdq::Fetch::Ready(cmd) if cmd.opcode == p.opcode => Some(cmd),
        cmdq::Fetch::Ready(cmd) => {
            tracing::warn!(
                slot = p.slot,
                parked = %CmdOpcode::from_raw(p.opcode),
                now = %CmdOpcode::from_raw(cmd.opcode),
                "a parked entry changed under the firmware: running what it holds now"
            );
            Some(cmd)
        }
        cmdq::Fetch::Refused { entry_iova, status } => {
            tracing::warn!(slot = p.slot, %status, "a parked entry's mailboxes changed: refused");
            *lock(&sh.stats)
                .delivery_errors
                .entry(status.as_raw())
                .or_default() += 1;
            cmdq::finish(dev, entry_iova, status);
            None
        }
        cmdq::Fetch::Ignored(why) => {
            tracing::warn!(slot = p.slot, ?why, "a parked entry is gone: dropped");
            lock(&sh.stats).parked_dropped += 1;
            None
        }
    }
}

/// Run the parked commands, oldest first, while the pages held cover them.
fn resume_parked(sh: &Shared, dev: &Device) {
    while dev.serving() {
        let next = {
            let mut s = lock(&sh.state);
            let Some(p) = s.runnable() else { return };
            s.parked.remove(0);
            p
        };
        tracing::info!(slot = next.slot, "pages arrived: the held command runs");
        if let Some(cmd) = refetch(sh, dev, next) {
            finish(sh, dev, &cmd);
        }
    }
}

/// CANT_GIVE: every parked command completes NO_RES (`PAGES_CANT_GIVE`), not executed.
fn fail_parked(sh: &Shared, dev: &Device) {
    let parked = {
        let mut s = lock(&sh.state);
        s.asked = 0;
        std::mem::take(&mut s.parked)
    };
    for p in parked {
        lock(&sh.stats).cant_give += 1;
        tracing::info!(
            slot = p.slot,
            "the driver cannot give pages: the held command fails"
        );
        if let Some(cmd) = refetch(sh, dev, p) {
            let out = vec![0u8; cmd.outlen.max(rnic_mlx5_prm::CMD_INLINE_BYTES)];
            let refusal = Refusal {
                status: CmdStatus::NoRes,
                syndrome: syndrome::PAGES_CANT_GIVE,
            };
            complete(sh, dev, &cmd, out, Err(refusal), None);
        }
    }
}

/// Execute a fetched command (or fail it, if a [`Faults::fail_next`] injection names it),
/// deliver its output and ownership, post its completion EQE and count it.
fn finish(sh: &Shared, dev: &Device, cmd: &cmdq::Command) {
    let slot = cmd.slot;
    let op = CmdOpcode::from_raw(cmd.opcode);
    let is_take = op == CmdOpcode::ManagePages
        && rnic_mlx5_prm::MboxIn::new_unchecked(&cmd.input[..]).op_mod()
            == rnic_mlx5_prm::manage_pages_op_mod::TAKE;
    let (injected, zero_take, rewrite) = {
        let mut f = lock(&sh.faults);
        let injected = f
            .fail
            .iter()
            .position(|i| i.opcode == op)
            .map(|i| f.fail.remove(i));
        let zero_take = injected.is_none() && is_take && f.take_zero > 0;
        if zero_take {
            f.take_zero -= 1;
        }
        let rewrite = (!f.rewrite.is_empty()).then(|| f.rewrite.remove(0));
        (injected, zero_take, rewrite)
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
        // Completed OK with output_num_entries 0 (the zeroed output), nothing taken.
        None if zero_take => {
            lock(&sh.stats).take_zeroed += 1;
            tracing::info!(slot, "MANAGE_PAGES take answered with 0 pages (fault hook)");
            Ok(())
        }
        None => lock(&sh.state).execute(dev, op, &cmd.input, cmd.outlen, &mut out),
    };
    complete(sh, dev, cmd, out, result, rewrite);
}

/// Deliver `result` of `cmd` (its output `out` when OK), its ownership and completion EQE,
/// and count it.
fn complete(
    sh: &Shared,
    dev: &Device,
    cmd: &cmdq::Command,
    mut out: Vec<u8>,
    result: Result<(), Refusal>,
    rewrite: Option<cmdq::ReplyRewrite>,
) {
    let slot = cmd.slot;
    let op = CmdOpcode::from_raw(cmd.opcode);
    if let Err(r) = result {
        out.fill(0);
        let mut o = MboxOut::new_unchecked(&mut out[..]);
        let _ = o.set_status(u32::from(r.status.as_raw()));
        let _ = o.set_syndrome(r.syndrome);
        tracing::debug!(slot, %op, status = %r.status, syndrome = format_args!("{:#x}", r.syndrome), "command failed");
    } else {
        tracing::debug!(slot, %op, "command ok");
    }
    if rewrite.is_some() {
        lock(&sh.stats).rewritten_replies += 1;
        tracing::info!(slot, ?rewrite, "reply headers rewritten (fault hook)");
    }
    let delivery = cmdq::reply(dev, cmd, &out, rewrite);
    // Counted before the entry goes back: a driver that saw its command complete reads
    // statistics that include it.
    {
        let mut st = lock(&sh.stats);
        if delivery != DeliveryStatus::Ok {
            *st.delivery_errors.entry(delivery.as_raw()).or_default() += 1;
        } else {
            *st.commands.entry(op.as_raw()).or_default() += 1;
            if let Err(r) = result {
                *st.errors.entry(r.status.as_raw()).or_default() += 1;
            }
        }
    }
    cmdq::finish(dev, cmd.entry_iova, delivery);
    // Events mode: a command completion EQE on the EQ that asks for them, after the
    // ownership it announces.
    let s = lock(&sh.state);
    let posted = crate::hca::lock(&s.hca).command_event(dev, slot);
    drop(s);
    if posted {
        lock(&sh.stats).command_events += 1;
    }
}

impl DoorbellHandler for Firmware {
    fn command_doorbell(&mut self, dev: &Device, bits: u32) {
        if dev.is_fatal() {
            lock(&self.shared.stats).ignored_dead += u64::from(bits.count_ones());
            return;
        }
        if !dev.serving() {
            lock(&self.shared.stats).ignored_nic_state += u64::from(bits.count_ones());
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
        let judge = dev.options().firmware.strictness.blueflame
            && (0x800..0x1000).contains(&offset)
            && dev.serving();
        if judge {
            // Rows 4, 5: what the half holds besides the doorbell (see `bf`).
            let expected = crate::hca::lock(&hca).bf_expected(dev, page, value);
            let uc = dev.options().bar0 == crate::device::Bar0Mapping::Uc;
            let qpn = (value as u32) >> 8;
            let index = (value >> 40) as u16;
            let v = lock(&self.shared.bf).observe(
                dev.bar(),
                (page, offset),
                (qpn, index),
                expected,
                uc,
            );
            lock(&self.shared.stats).bf_uncombined += v.uncombined;
        }
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
        let parked = s.parked.len();
        *s = State::attached(options, dev);
        drop(s);
        if parked > 0 {
            lock(&self.shared.stats).parked_dropped += parked as u64;
            tracing::info!(parked, "commands held for pages dropped by the reset");
        }
        lock(&self.shared.bf).clear();
        let dropped = std::mem::take(&mut *lock(&self.shared.late)).len();
        if dropped > 0 {
            lock(&self.shared.stats).late_dropped += dropped as u64;
            tracing::info!(dropped, "delayed commands dropped by the reset");
        }
    }
}
