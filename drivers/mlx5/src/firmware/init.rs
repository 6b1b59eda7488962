//! Firmware bring-up and teardown of one function (mlx5.md §3): [`Hca`].
//!
//! [`Hca::bring_up`] runs §3.1 in order — reset if the function was left
//! set up, interface revision, wait for firmware, command queue, wait again,
//! ENABLE_HCA, ISSI, boot pages, host endianness, general and RoCE
//! capabilities, init pages, INIT_HCA, SET_DRIVER_VERSION, re-query, UAR, PD
//! — and a failure at any step tears down what the earlier steps built.
//! [`Hca::shutdown`] (or `Drop`) runs §3.2 in reverse: DEALLOC_PD,
//! DEALLOC_UAR, TEARDOWN_HCA, MANAGE_PAGES take until the firmware holds
//! none, DISABLE_HCA; only then are the pages, mailboxes and command queue
//! unmapped and freed (field order: the [`CmdQueue`] and the pages drop
//! after the commands that need them ran).
//!
//! See `docs/mlx5.md` for each command's source fact and the choices made
//! where mlx5.md is silent.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rnic_mlx5_prm::{
    AccessRegisterIn, AllocPdIn, AllocPdOut, AllocUarIn, AllocUarOut, CMD_INTERFACE_REV, CmdHcaCap,
    CmdOpcode, CmdStatus, DeallocPdIn, DeallocPdOut, DeallocUarIn, DeallocUarOut, DisableHcaIn,
    DisableHcaOut, EnableHcaIn, EnableHcaOut, HCA_CAP_OPMOD_CURRENT, HCA_CAP_OPMOD_MAX, InitHcaIn,
    InitHcaOut, PCI_DEVICE_IDS, PORT_TYPE_ETH, PORT_TYPE_IB, QueryHcaCapIn, QueryHcaCapOut,
    QueryIssiIn, QueryIssiOut, QueryPagesIn, QueryPagesOut, QuerySpecialContextsIn,
    QuerySpecialContextsOut, RegisterHostEndianness, RoceCap, SetDriverVersionIn,
    SetDriverVersionOut, SetHcaCapIn, SetHcaCapOut, SetIssiIn, SetIssiOut, TeardownHcaIn,
    TeardownHcaOut, access_reg_op_mod, cap_type, default_timeout_ms, initial_seg,
    query_hca_cap_out, query_pages_op_mod, register_id, set_hca_cap_in, teardown_profile,
};
use tracing::{info, info_span, warn};

use crate::firmware::cmd::{CmdQueue, CmdQueueOptions, decode_timeout};
use crate::firmware::pages::Pages;
use crate::firmware::read_iseg;
use crate::function::memory::lock;
use crate::{Mlx5Error, PciFunction};

pub use crate::firmware::pages::{FW_PAGE_BYTES, MAX_PAGES_PER_REQUEST, PAGES_PER_COMMAND};
/// How often `initializing` is polled (§3 step 2: every 2 ms).
pub const INIT_POLL: Duration = Duration::from_millis(2);

/// When [`Hca::bring_up`] resets the function first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ResetPolicy {
    /// Reset when the function shows an earlier command queue (a nonzero
    /// `cmdq_phy_addr`): a previous driver set it up and may have left it
    /// initialized (§12: FLR is the remedy). The default.
    #[default]
    IfInitialized,
    /// Always reset.
    Always,
    /// Never reset (a function left initialized then fails at ENABLE_HCA
    /// or INIT_HCA).
    Never,
}

/// How [`Hca::bring_up`] behaves.
#[derive(Clone, Debug)]
pub struct HcaOptions {
    /// When to reset the function first.
    pub reset: ResetPolicy,
    /// How long to wait for `initializing` before touching the command
    /// queue (§3 step 2; default 120 s).
    pub pre_init_timeout: Duration,
    /// How long to wait after setting the command queue address (§3 step 4);
    /// `None` = `cmd_q_init_to` from the init segment, else 2 s.
    pub fw_init_timeout: Option<Duration>,
    /// Per-command timeout; `None` = `cmd_exec_to`, else 60 s.
    pub cmd_timeout: Option<Duration>,
    /// Sent with SET_DRIVER_VERSION (at most 64 bytes are sent).
    pub driver_version: String,
    /// Where peers' MAC addresses may come from besides the caller, the
    /// function's own GIDs and static entries (`crate::firmware::neigh`).
    pub neighbours: crate::firmware::neigh::NeighbourOptions,
    /// Use a write-combining mapping of the UAR for BlueFlame copies where
    /// the transport has one ([`PciFunction::uar_wc`]); `false` rings
    /// 8-byte doorbells only. Default `true`.
    pub write_combining: bool,
}

impl Default for HcaOptions {
    fn default() -> HcaOptions {
        HcaOptions {
            reset: ResetPolicy::default(),
            pre_init_timeout: Duration::from_millis(default_timeout_ms::PRE_INIT),
            fw_init_timeout: None,
            cmd_timeout: None,
            driver_version: format!("rnic,rnic-mlx5,{}", env!("CARGO_PKG_VERSION")),
            write_combining: true,
            neighbours: Default::default(),
        }
    }
}

/// Firmware version `major.minor.subminor` (§2: `fw_rev` minor in bits
/// [31:16], major in [15:0]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct FwVersion {
    /// Major.
    pub major: u16,
    /// Minor.
    pub minor: u16,
    /// Sub-minor.
    pub subminor: u16,
}

impl fmt::Display for FwVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{:04}", self.major, self.minor, self.subminor)
    }
}

/// `port_type` of the general capabilities (§5.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortType {
    /// InfiniBand.
    Ib,
    /// Ethernet (RoCE).
    Ethernet,
    /// Another value.
    Other(u32),
}

impl fmt::Display for PortType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PortType::Ib => f.write_str("InfiniBand"),
            PortType::Ethernet => f.write_str("Ethernet"),
            PortType::Other(v) => write!(f, "unknown ({v})"),
        }
    }
}

pub use crate::firmware::health::Health;
pub use crate::firmware::pages::PageCounts;

/// What a brought-up function is: versions, the capabilities that matter,
/// its UAR and PD (for `rnicctl info`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HcaInfo {
    /// The function's name (PCI address or `vfio-user:<socket>`).
    pub function: String,
    /// PCI device ID.
    pub device_id: u16,
    /// Firmware version.
    pub fw_version: FwVersion,
    /// Command interface revision (5).
    pub cmdif_rev: u32,
    /// The ISSI in use.
    pub issi: u16,
    /// Command queue slots.
    pub cmdq_slots: usize,
    /// Per-command timeout in force.
    pub cmd_timeout: Duration,
    /// Whether bring-up began with a function-level reset.
    pub reset_first: bool,
    /// `vhca_id`.
    pub vhca_id: u32,
    /// `port_type`.
    pub port_type: PortType,
    /// `num_ports`.
    pub num_ports: u32,
    /// `log_max_qp`.
    pub log_max_qp: u32,
    /// `log_max_cq`.
    pub log_max_cq: u32,
    /// `log_max_eq`.
    pub log_max_eq: u32,
    /// `log_max_mkey`.
    pub log_max_mkey: u32,
    /// `log_max_pd`.
    pub log_max_pd: u32,
    /// `log_max_msg` (largest message: 2^n bytes).
    pub log_max_msg: u32,
    /// General cap `roce` (current, after INIT_HCA).
    pub roce: bool,
    /// RoCE cap `roce_version` bits (bit0 v1, bit2 v2); 0 without RoCE.
    pub roce_version: u32,
    /// RoCE cap `sw_r_roce_src_udp_port` (current).
    pub sw_roce_src_udp_port: bool,
    /// The UAR page index from ALLOC_UAR.
    pub uar: u32,
    /// The PD from ALLOC_PD.
    pub pd: u32,
    /// Pages given.
    pub pages: PageCounts,
    /// How send doorbells are rung, and why.
    pub doorbells: DoorbellPath,
}

/// How send doorbells reach the device (mlx5.md §8; audit rows 4, 5).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DoorbellPath {
    /// BlueFlame copies through a write-combining mapping of the UAR (QPs
    /// with a register of their own); otherwise 8-byte doorbells only.
    pub write_combining: bool,
    /// Which mapping, or why there is no write-combining one.
    pub why: String,
}

impl fmt::Display for DoorbellPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.write_combining {
            write!(
                f,
                "BlueFlame through a write-combining mapping ({})",
                self.why
            )
        } else {
            write!(f, "8-byte doorbells on an uncached mapping ({})", self.why)
        }
    }
}

/// Capability pages as queried (whole QUERY_HCA_CAP outputs).
#[derive(Debug, Default)]
struct Caps {
    general_cur: Vec<u8>,
    general_max: Vec<u8>,
    roce_cur: Option<Vec<u8>>,
    roce_max: Option<Vec<u8>>,
}

/// What bring-up has done so far, undone in reverse by teardown.
#[derive(Debug, Default)]
struct Done {
    enabled: bool,
    initialized: bool,
    uar: Option<u32>,
    pd: Option<u32>,
}

/// A brought-up mlx5 function: command queue, pages, UAR and PD. Dropping it
/// tears the function down (§3.2); [`Hca::shutdown`] does the same and
/// reports the first failure.
pub struct Hca {
    info: HcaInfo,
    caps: Caps,
    done: Done,
    /// The UAR page mapped write-combining, when the doorbells use it.
    uar_wc: Option<crate::BlockWindow>,
    /// The key that ends a receive scatter list (audit row 21).
    terminator_lkey: u32,
    // Dropped after the teardown commands ran, before the command queue.
    pub(crate) pages: Arc<Pages>,
    pub(crate) runtime: crate::firmware::events::HcaRuntime,
    pub(crate) roce: Mutex<crate::firmware::resources::RoceState>,
    pub(crate) neighbours: crate::firmware::neigh::Neighbours,
    cmdq: Arc<CmdQueue>,
    function: Arc<dyn PciFunction>,
    torn_down: bool,
}

impl fmt::Debug for Hca {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hca")
            .field("info", &self.info)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

fn prm(what: &'static str) -> impl Fn(rnic_mlx5_prm::Error) -> Mlx5Error {
    move |source| Mlx5Error::Prm { what, source }
}

/// Poll `initializing` (§2 0x1fc bit31) until it clears.
fn wait_initializing(
    function: &dyn PciFunction,
    stage: &'static str,
    timeout: Duration,
) -> Result<(), Mlx5Error> {
    let start = Instant::now();
    loop {
        if read_iseg(function, &initial_seg::initializing)? == 0 {
            return Ok(());
        }
        if start.elapsed() >= timeout {
            return Err(Mlx5Error::FirmwareInit {
                function: function.name().into(),
                stage,
                after: start.elapsed(),
            });
        }
        std::thread::sleep(INIT_POLL);
    }
}

/// Whether the function shows an earlier command queue address.
fn was_set_up(function: &dyn PciFunction) -> Result<bool, Mlx5Error> {
    let high = read_iseg(function, &initial_seg::cmdq_phy_addr_63_32)?;
    let low = read_iseg(function, &initial_seg::cmdq_phy_addr_31_12)?;
    Ok(high != 0 || low != 0)
}

fn fw_version(function: &dyn PciFunction) -> Result<FwVersion, Mlx5Error> {
    Ok(FwVersion {
        major: read_iseg(function, &initial_seg::fw_rev_major)? as u16,
        minor: read_iseg(function, &initial_seg::fw_rev_minor)? as u16,
        subminor: read_iseg(function, &initial_seg::fw_rev_subminor)? as u16,
    })
}

/// A zeroed command input of `len` bytes.
fn input(len: usize) -> Vec<u8> {
    vec![0u8; len]
}

impl Hca {
    /// Bring the function up (mlx5.md §3.1 steps 0–15, without the EQ and
    /// the vport RoCE enable, which later layers add).
    pub fn bring_up(function: Arc<dyn PciFunction>, opts: HcaOptions) -> Result<Hca, Mlx5Error> {
        let name = function.name().to_string();
        let span = info_span!("mlx5_bring_up", function = %name);
        let _g = span.enter();
        let f = function.as_ref();

        // Audit row 23: what bring-up pins before the firmware asks for
        // anything must fit the kernel's budget (the firmware's pages are
        // checked as it asks).
        f.dma_budget()
            .check(f.name(), 0, crate::function::budget::BASE_PIN_BYTES, 0, 16)?;
        // Step 0: memory space (BAR0 reads) and bus mastering.
        f.enable_bus_master()?;
        // Reset first if a previous driver left the function set up (§12).
        let reset_first = match opts.reset {
            ResetPolicy::Always => true,
            ResetPolicy::Never => false,
            ResetPolicy::IfInitialized => was_set_up(f)?,
        };
        if reset_first {
            info!("resetting the function first (policy {:?})", opts.reset);
            f.reset()?;
            // A reset clears the command register: enable again. A function
            // recovering from FLR may read all-ones (bit 31 of
            // `initializing` set), so wait for the firmware before reading
            // the revision.
            f.enable_bus_master()?;
            wait_initializing(f, "after the function reset", opts.pre_init_timeout)?;
        }

        // Step 2 before step 1 (K core/main.c:1369-1375 waits for the
        // firmware, then checks the revision in mlx5_cmd_enable; audit row
        // 18): a function still initializing after the open-time FLR may
        // not show its revision yet.
        wait_initializing(f, "before the command queue", opts.pre_init_timeout)?;
        let rev = read_iseg(f, &initial_seg::cmd_interface_rev)?;
        if rev != CMD_INTERFACE_REV {
            return Err(Mlx5Error::CmdifRev {
                function: name,
                found: rev,
                expected: CMD_INTERFACE_REV,
            });
        }
        // Step 3: command queue.
        let cmdq = Arc::new(CmdQueue::new(
            function.clone(),
            CmdQueueOptions {
                timeout: opts.cmd_timeout,
            },
        )?);
        // Step 4: wait again.
        let fw_init = match opts.fw_init_timeout {
            Some(t) => t,
            None => decode_timeout(read_iseg(f, &initial_seg::cmd_q_init_to)?)
                .unwrap_or(Duration::from_millis(default_timeout_ms::FW_INIT)),
        };
        wait_initializing(f, "after setting the command queue address", fw_init)?;

        let fw_version = fw_version(f)?;
        let id = f.id();
        info!(%fw_version, cmdif_rev = rev, "firmware ready");
        let mut hca = Hca {
            info: HcaInfo {
                function: name,
                device_id: id.device,
                fw_version,
                cmdif_rev: rev,
                issi: 0,
                cmdq_slots: cmdq.slots(),
                cmd_timeout: cmdq.timeout(),
                reset_first,
                vhca_id: 0,
                port_type: PortType::Other(0),
                num_ports: 0,
                log_max_qp: 0,
                log_max_cq: 0,
                log_max_eq: 0,
                log_max_mkey: 0,
                log_max_pd: 0,
                log_max_msg: 0,
                roce: false,
                roce_version: 0,
                sw_roce_src_udp_port: false,
                uar: 0,
                pd: 0,
                pages: PageCounts::default(),
                doorbells: DoorbellPath::default(),
            },
            caps: Caps::default(),
            done: Done::default(),
            uar_wc: None,
            terminator_lkey: rnic_mlx5_prm::INVALID_LKEY,
            pages: Arc::new(Pages::new(function.clone(), cmdq.clone())),
            runtime: crate::firmware::events::HcaRuntime::new(function.clone()),
            roce: Default::default(),
            neighbours: crate::firmware::neigh::Neighbours::new(
                opts.neighbours,
                function.host_neighbours(),
            ),
            cmdq,
            function,
            torn_down: false,
        };
        // From here on an error drops `hca`, which undoes what was done.
        hca.enable()?;
        hca.issi()?;
        let boot = hca.give_requested_pages(query_pages_op_mod::BOOT, "boot")?;
        lock(&hca.pages.pool).counts.boot = boot;
        hca.host_endianness()?;
        hca.set_general_caps()?;
        hca.set_roce_caps()?;
        let init = hca.give_requested_pages(query_pages_op_mod::INIT, "init")?;
        lock(&hca.pages.pool).counts.init = init;
        hca.init_hca()?;
        hca.set_driver_version(&opts.driver_version);
        hca.query_all_caps()?;
        hca.special_contexts()?;
        hca.alloc_uar()?;
        hca.choose_doorbells(opts.write_combining);
        hca.alloc_pd()?;
        hca.fill_info();
        info!(
            pages_boot = boot,
            pages_init = init,
            uar = hca.info.uar,
            pd = hca.info.pd,
            "function up"
        );
        Ok(hca)
    }

    /// Run one command (see [`CmdQueue::exec`]). With the event queue, page
    /// requests the firmware raises meanwhile — even ones it holds this very
    /// command for — are answered by the page worker on the reserved slot.
    pub fn exec(
        &self,
        opcode: CmdOpcode,
        op_mod: u16,
        input: &[u8],
        out_len: usize,
    ) -> Result<Vec<u8>, Mlx5Error> {
        if self.is_fatal() {
            return Err(Mlx5Error::DeviceFatal {
                syndrome: None,
                counter_stuck: false,
                nic_state: None,
            });
        }
        self.cmdq.exec(opcode, op_mod, input, out_len)
    }

    /// The command queue.
    pub fn cmdq(&self) -> &CmdQueue {
        &self.cmdq
    }

    /// The function.
    pub fn function(&self) -> &Arc<dyn PciFunction> {
        &self.function
    }

    /// Versions, capabilities, UAR, PD and pages.
    pub fn info(&self) -> HcaInfo {
        let mut info = self.info.clone();
        info.pages = self.pages.counts();
        info
    }

    /// The function's health buffer now (§2).
    pub fn health(&self) -> Result<Health, Mlx5Error> {
        Health::read(self.function.as_ref())
    }

    /// The current general capabilities (queried after INIT_HCA).
    pub fn general_caps(&self) -> Result<CmdHcaCap<&[u8]>, Mlx5Error> {
        general_view(&self.caps.general_cur)
    }

    /// The maximum general capabilities.
    pub fn general_caps_max(&self) -> Result<CmdHcaCap<&[u8]>, Mlx5Error> {
        general_view(&self.caps.general_max)
    }

    /// The current RoCE capabilities, if the function has RoCE.
    pub fn roce_caps(&self) -> Option<RoceCap<&[u8]>> {
        let page = self.caps.roce_cur.as_ref()?;
        roce_view(page).ok()
    }

    /// A command whose output is only status and syndrome (`out_len`: the
    /// PRM size of its `_out` structure).
    fn exec_simple(
        &self,
        opcode: CmdOpcode,
        op_mod: u32,
        input: &[u8],
        out_len: usize,
    ) -> Result<(), Mlx5Error> {
        self.cmdq.exec(opcode, op_mod as u16, input, out_len)?;
        Ok(())
    }

    // Step 5.
    fn enable(&mut self) -> Result<(), Mlx5Error> {
        let mut buf = input(EnableHcaIn::<&[u8]>::SIZE_BYTES);
        let mut cmd = EnableHcaIn::new_checked(&mut buf[..]).map_err(prm("ENABLE_HCA"))?;
        cmd.set_function_id(0).map_err(prm("ENABLE_HCA"))?;
        cmd.set_embedded_cpu_function(0)
            .map_err(prm("ENABLE_HCA"))?;
        self.exec_simple(
            CmdOpcode::EnableHca,
            0,
            &buf,
            EnableHcaOut::<&[u8]>::SIZE_BYTES,
        )?;
        self.done.enabled = true;
        info!("ENABLE_HCA done");
        Ok(())
    }

    // Step 6.
    fn issi(&mut self) -> Result<(), Mlx5Error> {
        let buf = input(QueryIssiIn::<&[u8]>::SIZE_BYTES);
        let out = match self.cmdq.exec(
            CmdOpcode::QueryIssi,
            0,
            &buf,
            QueryIssiOut::<&[u8]>::SIZE_BYTES,
        ) {
            Ok(out) => out,
            Err(Mlx5Error::Command {
                status: CmdStatus::BadOp,
                ..
            }) => {
                // K: firmware without QUERY_ISSI speaks ISSI 0.
                info!("QUERY_ISSI unsupported: using ISSI 0");
                self.info.issi = 0;
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        let view = QueryIssiOut::new_checked(&out[..]).map_err(prm("QUERY_ISSI"))?;
        let supported = view.supported_issi_dw0();
        let current = view.current_issi();
        if supported & (1 << 1) != 0 {
            let mut buf = input(SetIssiIn::<&[u8]>::SIZE_BYTES);
            SetIssiIn::new_checked(&mut buf[..])
                .and_then(|mut c| c.set_current_issi(1))
                .map_err(prm("SET_ISSI"))?;
            self.exec_simple(CmdOpcode::SetIssi, 0, &buf, SetIssiOut::<&[u8]>::SIZE_BYTES)?;
            self.info.issi = 1;
        } else if supported & 1 != 0 || (supported == 0 && current == 0) {
            self.info.issi = 0;
        } else {
            return Err(Mlx5Error::Issi { supported });
        }
        info!(
            supported = format_args!("{supported:#x}"),
            current,
            issi = self.info.issi,
            "ISSI chosen"
        );
        Ok(())
    }

    /// QUERY_PAGES(`op_mod`) then MANAGE_PAGES give (steps 7 and 12); the
    /// number of pages given.
    fn give_requested_pages(&mut self, op_mod: u32, what: &'static str) -> Result<u64, Mlx5Error> {
        let mut buf = input(QueryPagesIn::<&[u8]>::SIZE_BYTES);
        QueryPagesIn::new_checked(&mut buf[..])
            .and_then(|mut c| c.set_function_id(0))
            .map_err(prm("QUERY_PAGES"))?;
        let out = self.cmdq.exec(
            CmdOpcode::QueryPages,
            op_mod as u16,
            &buf,
            QueryPagesOut::<&[u8]>::SIZE_BYTES,
        )?;
        let view = QueryPagesOut::new_checked(&out[..]).map_err(prm("QUERY_PAGES"))?;
        let num = i64::from(view.num_pages() as i32);
        let function_id = view.function_id() as u16;
        self.pages.set_function_id(function_id);
        info!(kind = what, num_pages = num, function_id, "QUERY_PAGES");
        if num <= 0 {
            if num < 0 {
                warn!(
                    kind = what,
                    num_pages = num,
                    "firmware offers to return pages at bring-up; ignored"
                );
            }
            return Ok(0);
        }
        if num > MAX_PAGES_PER_REQUEST {
            self.pages.cant_give();
            return Err(Mlx5Error::Pages {
                function: self.info.function.clone(),
                reason: format!(
                    "QUERY_PAGES ({what}) asks for {num} pages, more than the {MAX_PAGES_PER_REQUEST} \
                     this driver gives at once: the device reports nonsense; reset it"
                ),
            });
        }
        self.pages.give(num as usize, false)?;
        Ok(num as u64)
    }

    // Step 9 (RC always, K on PFs only; §12: not fatal on a VF).
    fn host_endianness(&self) -> Result<(), Mlx5Error> {
        let reg_len = RegisterHostEndianness::<&[u8]>::SIZE_BYTES;
        let head = AccessRegisterIn::<&[u8]>::SIZE_BYTES;
        let mut cmd = input(head + reg_len);
        let mut v = AccessRegisterIn::new_checked(&mut cmd[..]).map_err(prm("ACCESS_REG"))?;
        v.set_register_id(register_id::HOST_ENDIANNESS)
            .map_err(prm("ACCESS_REG"))?;
        v.set_argument(0).map_err(prm("ACCESS_REG"))?;
        RegisterHostEndianness::new_checked(&mut cmd[head..])
            .and_then(|mut r| r.set_he(u32::from(cfg!(target_endian = "big"))))
            .map_err(prm("HOST_ENDIANNESS"))?;
        let is_vf = PCI_DEVICE_IDS
            .iter()
            .any(|&(id, _, vf)| vf && id == self.info.device_id);
        match self.cmdq.exec(
            CmdOpcode::AccessReg,
            access_reg_op_mod::WRITE as u16,
            &cmd,
            head + reg_len,
        ) {
            Ok(_) => {
                info!(
                    big_endian = cfg!(target_endian = "big"),
                    "HOST_ENDIANNESS written"
                );
                Ok(())
            }
            Err(e @ Mlx5Error::Command { .. }) if is_vf => {
                warn!(%e, "HOST_ENDIANNESS refused on a VF; continuing (mlx5.md §12)");
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    fn query_cap(&self, cap: u32, current: bool) -> Result<Vec<u8>, Mlx5Error> {
        let op_mod = (cap << 1)
            | if current {
                HCA_CAP_OPMOD_CURRENT
            } else {
                HCA_CAP_OPMOD_MAX
            };
        let buf = input(QueryHcaCapIn::<&[u8]>::SIZE_BYTES);
        self.cmdq.exec(
            CmdOpcode::QueryHcaCap,
            op_mod as u16,
            &buf,
            QueryHcaCapOut::<&[u8]>::SIZE_BYTES,
        )
    }

    /// SET_HCA_CAP of `cap` with the capability area of `current` (a
    /// QUERY_HCA_CAP output) after `edit`.
    fn set_cap(
        &self,
        cap: u32,
        current: &[u8],
        edit: impl FnOnce(&mut SetHcaCapIn<&mut [u8]>) -> Result<(), rnic_mlx5_prm::Error>,
    ) -> Result<(), Mlx5Error> {
        let mut cmd = input(SetHcaCapIn::<&[u8]>::SIZE_BYTES);
        let from = query_hca_cap_out::cmd_hca_cap.byte_offset();
        let to = set_hca_cap_in::cmd_hca_cap.byte_offset();
        // Only the capability structure's own bytes, the rest of the area
        // zero (K core/main.c:701-702, 831; RC mlx5_vfio.c:1846-1847;
        // audit row 17): the driver does not echo bytes it does not own.
        let len = match cap {
            cap_type::ROCE => RoceCap::<&[u8]>::SIZE_BYTES,
            _ => CmdHcaCap::<&[u8]>::SIZE_BYTES,
        };
        let src = current
            .get(from..from + len)
            .ok_or_else(|| Mlx5Error::Prm {
                what: "QUERY_HCA_CAP output",
                source: rnic_mlx5_prm::Error::Truncated {
                    structure: "query_hca_cap_out",
                    needed: from + len,
                    got: current.len(),
                },
            })?;
        cmd[to..to + len].copy_from_slice(src);
        let mut v = SetHcaCapIn::new_checked(&mut cmd[..]).map_err(prm("SET_HCA_CAP"))?;
        edit(&mut v).map_err(prm("SET_HCA_CAP"))?;
        self.exec_simple(
            CmdOpcode::SetHcaCap,
            cap << 1,
            &cmd,
            SetHcaCapOut::<&[u8]>::SIZE_BYTES,
        )
    }

    // Step 10.
    fn set_general_caps(&mut self) -> Result<(), Mlx5Error> {
        let cur = self.query_cap(cap_type::GENERAL, true)?;
        let max = self.query_cap(cap_type::GENERAL, false)?;
        let (mkey_by_name, roce_rw, uar_4k, checksum, uar_sz) = {
            let m = general_view(&max)?;
            let c = general_view(&cur)?;
            (
                m.mkey_by_name(),
                m.roce_rw_supported(),
                m.uar_4k(),
                c.cmdif_checksum(),
                c.log_uar_page_sz(),
            )
        };
        let page = crate::sys::page_size();
        let log_uar_page_sz = page.trailing_zeros().saturating_sub(12);
        // K: 4 KiB UARs inside larger system pages when the max allows.
        let set_uar_4k = uar_4k != 0 && page > 4096;
        info!(
            cmdif_checksum = format_args!("{checksum} -> 0"),
            log_uar_page_sz = format_args!("{uar_sz} -> {log_uar_page_sz}"),
            mkey_by_name,
            roce = roce_rw,
            uar_4k = set_uar_4k,
            "SET_HCA_CAP general (RC's set; roce as K when roce_rw_supported)"
        );
        self.set_cap(cap_type::GENERAL, &cur, |v| {
            let mut c = v.cmd_hca_cap_mut();
            c.set_cmdif_checksum(0)?;
            c.set_log_uar_page_sz(log_uar_page_sz)?;
            if mkey_by_name != 0 {
                c.set_mkey_by_name(1)?;
            }
            if roce_rw != 0 {
                c.set_roce(1)?;
            }
            if set_uar_4k {
                c.set_uar_4k(1)?;
            }
            Ok(())
        })?;
        self.caps.general_max = max;
        self.caps.general_cur = self.query_cap(cap_type::GENERAL, true)?;
        Ok(())
    }

    // Step 11.
    fn set_roce_caps(&mut self) -> Result<(), Mlx5Error> {
        if general_view(&self.caps.general_cur)?.roce() == 0 {
            info!("general cap roce = 0: no RoCE capabilities to set");
            return Ok(());
        }
        let cur = self.query_cap(cap_type::ROCE, true)?;
        let max = self.query_cap(cap_type::ROCE, false)?;
        let max_sw = roce_view(&max)?.sw_r_roce_src_udp_port();
        let cur_sw = roce_view(&cur)?.sw_r_roce_src_udp_port();
        if max_sw != 0 && cur_sw == 0 {
            info!("RoCE cap sw_r_roce_src_udp_port: supported by max, off: setting it");
            self.set_cap(cap_type::ROCE, &cur, |v| {
                v.roce_cap_mut().set_sw_r_roce_src_udp_port(1)
            })?;
        } else if cur_sw != 0 {
            info!("RoCE cap sw_r_roce_src_udp_port already on");
        } else {
            info!(
                "RoCE cap sw_r_roce_src_udp_port not supported by max: the firmware picks UDP \
                 source ports (mlx5.md §12)"
            );
        }
        self.caps.roce_max = Some(max);
        self.caps.roce_cur = Some(cur);
        Ok(())
    }

    // Step 13.
    fn init_hca(&mut self) -> Result<(), Mlx5Error> {
        let buf = input(InitHcaIn::<&[u8]>::SIZE_BYTES);
        self.exec_simple(CmdOpcode::InitHca, 0, &buf, InitHcaOut::<&[u8]>::SIZE_BYTES)?;
        self.done.initialized = true;
        info!("INIT_HCA done");
        Ok(())
    }

    // Step 14 (K; only when cap driver_version is set; failure is logged).
    fn set_driver_version(&self, version: &str) {
        let supported = general_view(&self.caps.general_cur)
            .map(|c| c.driver_version())
            .unwrap_or(0);
        if supported == 0 {
            info!("cap driver_version = 0: SET_DRIVER_VERSION skipped");
            return;
        }
        let mut text = [0u8; 64];
        let bytes = version.as_bytes();
        let n = bytes.len().min(63);
        text[..n].copy_from_slice(&bytes[..n]);
        let mut cmd = input(SetDriverVersionIn::<&[u8]>::SIZE_BYTES);
        let built = SetDriverVersionIn::new_checked(&mut cmd[..])
            .and_then(|mut v| v.set_driver_version(&text));
        let result = built.map_err(prm("SET_DRIVER_VERSION")).and_then(|()| {
            self.exec_simple(
                CmdOpcode::SetDriverVersion,
                0,
                &cmd,
                SetDriverVersionOut::<&[u8]>::SIZE_BYTES,
            )
        });
        match result {
            Ok(()) => info!(version, "SET_DRIVER_VERSION done"),
            Err(e) => warn!(%e, "SET_DRIVER_VERSION failed; continuing (informational only)"),
        }
    }

    // Step 14: K re-reads every capability page after INIT_HCA.
    fn query_all_caps(&mut self) -> Result<(), Mlx5Error> {
        self.caps.general_cur = self.query_cap(cap_type::GENERAL, true)?;
        self.caps.general_max = self.query_cap(cap_type::GENERAL, false)?;
        if general_view(&self.caps.general_cur)?.roce() != 0 {
            self.caps.roce_cur = Some(self.query_cap(cap_type::ROCE, true)?);
            self.caps.roce_max = Some(self.query_cap(cap_type::ROCE, false)?);
        } else {
            self.caps.roce_cur = None;
            self.caps.roce_max = None;
        }
        Ok(())
    }

    /// QUERY_SPECIAL_CONTEXTS when the general cap advertises a
    /// `terminate_scatter_list_mkey` (K ib/wr.c:1269, which then ends receive
    /// scatter lists with it); otherwise `INVALID_LKEY` (0x100, RC qp.c:3869;
    /// audit row 21).
    fn special_contexts(&mut self) -> Result<(), Mlx5Error> {
        if general_view(&self.caps.general_cur)?.terminate_scatter_list_mkey() == 0 {
            return Ok(());
        }
        let buf = input(QuerySpecialContextsIn::<&[u8]>::SIZE_BYTES);
        let out = self.cmdq.exec(
            CmdOpcode::QuerySpecialContexts,
            0,
            &buf,
            QuerySpecialContextsOut::<&[u8]>::SIZE_BYTES,
        )?;
        self.terminator_lkey = QuerySpecialContextsOut::new_checked(&out[..])
            .map_err(prm("QUERY_SPECIAL_CONTEXTS"))?
            .terminate_scatter_list_mkey();
        info!(
            lkey = format_args!("{:#x}", self.terminator_lkey),
            "receive scatter lists end with the firmware's terminate_scatter_list_mkey"
        );
        Ok(())
    }

    /// The key that ends a receive scatter list shorter than its stride.
    pub fn terminator_lkey(&self) -> u32 {
        self.terminator_lkey
    }

    // Step 15 (UAR; the EQ is a later layer's).
    fn alloc_uar(&mut self) -> Result<(), Mlx5Error> {
        let buf = input(AllocUarIn::<&[u8]>::SIZE_BYTES);
        let out = self.cmdq.exec(
            CmdOpcode::AllocUar,
            0,
            &buf,
            AllocUarOut::<&[u8]>::SIZE_BYTES,
        )?;
        let uar = AllocUarOut::new_checked(&out[..])
            .map_err(prm("ALLOC_UAR"))?
            .uar();
        self.done.uar = Some(uar);
        self.info.uar = uar;
        info!(uar, "ALLOC_UAR");
        Ok(())
    }

    /// BlueFlame only through a write-combining mapping of the UAR; on an
    /// uncached one (what kernel VFIO gives) 8-byte doorbells only (K
    /// ib/wr.c:1025-1049; RC's VFIO provider offers only NC UARs,
    /// mlx5_vfio.c:2527; audit row 4).
    fn choose_doorbells(&mut self, wanted: bool) {
        let (wc, path) = if !wanted {
            (
                None,
                DoorbellPath {
                    write_combining: false,
                    why: "write-combining turned off (HcaOptions::write_combining)".into(),
                },
            )
        } else {
            match self.function.uar_wc(self.info.uar) {
                Ok(w) => (
                    Some(w),
                    DoorbellPath {
                        write_combining: true,
                        why: format!("UAR page {} via {}", self.info.uar, self.function.name()),
                    },
                ),
                Err(why) => (
                    None,
                    DoorbellPath {
                        write_combining: false,
                        why,
                    },
                ),
            }
        };
        info!(doorbells = %path, "doorbell path chosen");
        self.uar_wc = wc;
        self.info.doorbells = path;
    }

    /// The UAR page's write-combining mapping, when doorbells use one.
    pub(crate) fn uar_wc(&self) -> Option<&crate::BlockWindow> {
        self.uar_wc.as_ref()
    }

    fn alloc_pd(&mut self) -> Result<(), Mlx5Error> {
        let buf = input(AllocPdIn::<&[u8]>::SIZE_BYTES);
        let out = self
            .cmdq
            .exec(CmdOpcode::AllocPd, 0, &buf, AllocPdOut::<&[u8]>::SIZE_BYTES)?;
        let pd = AllocPdOut::new_checked(&out[..])
            .map_err(prm("ALLOC_PD"))?
            .pd();
        self.done.pd = Some(pd);
        self.info.pd = pd;
        info!(pd, "ALLOC_PD");
        Ok(())
    }

    fn fill_info(&mut self) {
        if let Ok(c) = general_view(&self.caps.general_cur) {
            let i = &mut self.info;
            i.vhca_id = c.vhca_id();
            i.port_type = match c.port_type() {
                PORT_TYPE_IB => PortType::Ib,
                PORT_TYPE_ETH => PortType::Ethernet,
                other => PortType::Other(other),
            };
            i.num_ports = c.num_ports();
            i.log_max_qp = c.log_max_qp();
            i.log_max_cq = c.log_max_cq();
            i.log_max_eq = c.log_max_eq();
            i.log_max_mkey = c.log_max_mkey();
            i.log_max_pd = c.log_max_pd();
            i.log_max_msg = c.log_max_msg();
            i.roce = c.roce() != 0;
        }
        if let Some(r) = self
            .caps
            .roce_cur
            .as_deref()
            .and_then(|p| roce_view(p).ok())
        {
            self.info.roce_version = r.roce_version();
            self.info.sw_roce_src_udp_port = r.sw_r_roce_src_udp_port() != 0;
        }
    }

    /// Tear down (§3.2) and report the first failure; every step runs even
    /// after a failure, except that after a command timeout no further
    /// command is posted (the firmware is not answering).
    pub fn shutdown(mut self) -> Result<(), Mlx5Error> {
        self.teardown()
    }

    fn teardown(&mut self) -> Result<(), Mlx5Error> {
        if self.torn_down {
            return Ok(());
        }
        self.torn_down = true;
        let span = info_span!("mlx5_teardown", function = %self.info.function);
        let _g = span.enter();
        let mut first: Option<Mlx5Error> = None;
        let mut hung = false;
        let mut step = |hung: &mut bool, what: &str, r: Result<(), Mlx5Error>| {
            if let Err(e) = r {
                warn!(step = what, %e, "teardown step failed");
                if matches!(
                    e,
                    Mlx5Error::CommandTimeout { .. } | Mlx5Error::NoCommandSlot { .. }
                ) {
                    *hung = true;
                }
                first.get_or_insert(e);
            }
        };
        if self.is_fatal() {
            // The firmware answers nothing any more: no command is sent.
            hung = true;
            self.done.pd = None;
            self.cmdq.set_events(None);
            self.runtime.stop_threads();
            self.runtime.events = None;
        }
        if !hung {
            let r = self.roce_teardown();
            step(&mut hung, "RoCE address and vport", r);
        }
        if let Some(pd) = self.done.pd.take().filter(|_| !hung) {
            let sizes = (
                DeallocPdIn::<&[u8]>::SIZE_BYTES,
                DeallocPdOut::<&[u8]>::SIZE_BYTES,
            );
            let r = self.dealloc(CmdOpcode::DeallocPd, sizes, |b| {
                DeallocPdIn::new_checked(b).and_then(|mut v| v.set_pd(pd))
            });
            step(&mut hung, "DEALLOC_PD", r);
        }
        if !hung {
            let r = self.destroy_events();
            step(&mut hung, "DESTROY_EQ", r);
        }
        if let Some(uar) = self.done.uar.take().filter(|_| !hung) {
            let sizes = (
                DeallocUarIn::<&[u8]>::SIZE_BYTES,
                DeallocUarOut::<&[u8]>::SIZE_BYTES,
            );
            let r = self.dealloc(CmdOpcode::DeallocUar, sizes, |b| {
                DeallocUarIn::new_checked(b).and_then(|mut v| v.set_uar(uar))
            });
            step(&mut hung, "DEALLOC_UAR", r);
        }
        if self.done.initialized && !hung {
            self.done.initialized = false;
            let r = (|| {
                let mut buf = input(TeardownHcaIn::<&[u8]>::SIZE_BYTES);
                TeardownHcaIn::new_checked(&mut buf[..])
                    .and_then(|mut v| v.set_profile(teardown_profile::GRACEFUL))
                    .map_err(prm("TEARDOWN_HCA"))?;
                self.exec_simple(
                    CmdOpcode::TeardownHca,
                    0,
                    &buf,
                    TeardownHcaOut::<&[u8]>::SIZE_BYTES,
                )
            })();
            // A graceful TEARDOWN_HCA the firmware refuses (BAD_RES_STATE: it still holds
            // an object the driver does not know of, such as the PD of an ALLOC_PD that timed
            // out and then executed late) leaves the function initialized with our pages:
            // reset it (mlx5.md §12: FLR is the remedy), which frees everything it holds;
            // nothing more is sent. The refusal is still returned.
            let refused = matches!(r, Err(Mlx5Error::Command { .. }));
            step(&mut hung, "TEARDOWN_HCA", r);
            if refused {
                warn!("TEARDOWN_HCA refused: resetting the function to free what it holds");
                let r = self.function.reset();
                step(&mut hung, "function reset after a refused TEARDOWN_HCA", r);
                self.done.enabled = false;
                lock(&self.pages.pool).clear();
            }
        }
        if !hung && self.done.enabled {
            let r = self
                .pages
                .reclaim_all(crate::firmware::pages::RECLAIM_TIMEOUT)
                .map(|n| info!(pages = n, "pages reclaimed"));
            step(&mut hung, "MANAGE_PAGES take", r);
        }
        if self.done.enabled && !hung {
            self.done.enabled = false;
            let r = (|| {
                let mut buf = input(DisableHcaIn::<&[u8]>::SIZE_BYTES);
                DisableHcaIn::new_checked(&mut buf[..])
                    .and_then(|mut v| v.set_function_id(0))
                    .map_err(prm("DISABLE_HCA"))?;
                self.exec_simple(
                    CmdOpcode::DisableHca,
                    0,
                    &buf,
                    DisableHcaOut::<&[u8]>::SIZE_BYTES,
                )
            })();
            step(&mut hung, "DISABLE_HCA", r);
        }
        let held = self.pages.held();
        if held > 0 {
            warn!(
                pages = held,
                "the firmware did not return every page; they are unmapped from the device now \
                 and then freed"
            );
        }
        // The pages, mailboxes and queue page are unmapped and freed when the
        // fields drop, after these commands.
        lock(&self.pages.pool).clear();
        match first {
            Some(e) => Err(e),
            None => {
                info!("function torn down");
                Ok(())
            }
        }
    }

    /// A dealloc command: `in_len` / `out_len` are its PRM sizes, `fill`
    /// writes the handle.
    fn dealloc(
        &self,
        opcode: CmdOpcode,
        (in_len, out_len): (usize, usize),
        fill: impl FnOnce(&mut [u8]) -> Result<(), rnic_mlx5_prm::Error>,
    ) -> Result<(), Mlx5Error> {
        let mut buf = input(in_len);
        fill(&mut buf).map_err(prm("dealloc input"))?;
        self.exec_simple(opcode, 0, &buf, out_len)
    }
}

impl Drop for Hca {
    fn drop(&mut self) {
        // Errors were logged by each step.
        let _ = self.teardown();
    }
}

/// The general capabilities in a QUERY_HCA_CAP output.
fn general_view(out: &[u8]) -> Result<CmdHcaCap<&[u8]>, Mlx5Error> {
    let at = query_hca_cap_out::cmd_hca_cap.byte_offset();
    CmdHcaCap::new_checked(out.get(at..).unwrap_or(&[])).map_err(prm("QUERY_HCA_CAP output"))
}

/// The RoCE capabilities in a QUERY_HCA_CAP output.
fn roce_view(out: &[u8]) -> Result<RoceCap<&[u8]>, Mlx5Error> {
    let at = query_hca_cap_out::roce_cap.byte_offset();
    RoceCap::new_checked(out.get(at..).unwrap_or(&[])).map_err(prm("QUERY_HCA_CAP output"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send_sync<T: Send + Sync>() {}

    #[test]
    fn hca_can_be_shared_between_threads() {
        send_sync::<Hca>();
        send_sync::<CmdQueue>();
    }

    #[test]
    fn fw_version_prints_like_the_kernel() {
        let v = FwVersion {
            major: 16,
            minor: 35,
            subminor: 2000,
        };
        assert_eq!(v.to_string(), "16.35.2000");
        assert_eq!(PortType::Ethernet.to_string(), "Ethernet");
    }
}
