//! Command execution: the function's life cycle and the bring-up, page, capability,
//! register, UAR/PD/TD and vport commands, each with the checks a real function makes.
//!
//! Check order for every command (so a test can predict which refusal wins): unknown opcode
//! (BAD_OP) → nonzero `uid` (BAD_PARAM) → `inlen` (BAD_INP_LEN) → `outlen` (BAD_OUTP_LEN) →
//! life-cycle state (BAD_SYS_STATE) → the command's own checks. A refused command changes no
//! state.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, Weak};

use rnic_mlx5_prm::{
    AccessRegisterIn, AllocPdOut, AllocTransportDomainOut, AllocUarOut, CmdOpcode, CmdStatus,
    DeallocPdIn, DeallocTransportDomainIn, DeallocUarIn, EnableHcaIn, ManagePagesIn,
    ManagePagesOut, MboxIn, ModifyNicVportContextIn, PtysReg, QUERY_VPORT_COUNTER_OP_MOD_VPORT,
    QueryHcaCapIn, QueryIssiOut, QueryNicVportContextIn, QueryNicVportContextOut, QueryPagesIn,
    QueryPagesOut, QuerySpecialContextsOut, QueryVportCounterIn, QueryVportCounterOut,
    QueryVportStateIn, QueryVportStateOut, RegisterHostEndianness, SetDriverVersionIn, SetHcaCapIn,
    SetIssiIn, TeardownHcaIn, access_reg_op_mod, access_register_in, cap_type, cmd_hca_cap,
    get_bits, manage_pages_in, manage_pages_op_mod, modify_nic_vport_context_in,
    modify_nic_vport_field_select, ptys_proto, ptys_reg, query_hca_cap_out, query_pages_op_mod,
    register_host_endianness, register_id, roce_cap, set_hca_cap_in, teardown_profile,
    vport_state_op_mod,
};

use super::caps::{CAP_PAGE_BYTES, Caps};
use super::syndrome as syn;
use super::{FirmwareOptions, PortType};
use crate::bar::{FIRST_NON_UAR_PAGE, INIT_SEGMENT_PAGES, UAR_PAGE};
use crate::device::Device;
use crate::hca::{Ctx, Hca, lock};

/// The function's life-cycle state (mlx5.md §3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Phase {
    /// Power-on: only ENABLE_HCA is accepted.
    Disabled,
    /// After ENABLE_HCA (or TEARDOWN_HCA): ISSI, pages, capabilities, registers, INIT_HCA.
    Enabled,
    /// After INIT_HCA: resources.
    Initialized,
}

/// A refused command: its status and syndrome.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The command status.
    pub status: CmdStatus,
    /// The syndrome (one of [`super::syndrome`]).
    pub syndrome: u32,
}

type Outcome = Result<(), Refusal>;

fn refuse(status: CmdStatus, syndrome: u32) -> Outcome {
    Err(Refusal { status, syndrome })
}

fn param(syndrome: u32) -> Outcome {
    refuse(CmdStatus::BadParam, syndrome)
}

/// Which life-cycle states a command runs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Needs {
    /// Only before ENABLE_HCA.
    Disabled,
    /// Enabled or initialized.
    Enabled,
    /// Enabled, not yet initialized.
    PreInit,
    /// Initialized.
    Initialized,
}

/// (input bytes, output bytes, state) of each supported command: the sizes of its PRM
/// structures (mlx5.md §5.2).
fn spec(op: CmdOpcode) -> Option<(usize, usize, Needs)> {
    use rnic_mlx5_prm as p;
    Some(match op {
        CmdOpcode::EnableHca => (
            p::enable_hca_in::SIZE_BYTES,
            p::enable_hca_out::SIZE_BYTES,
            Needs::Disabled,
        ),
        CmdOpcode::DisableHca => (
            p::disable_hca_in::SIZE_BYTES,
            p::disable_hca_out::SIZE_BYTES,
            Needs::Enabled,
        ),
        CmdOpcode::QueryIssi => (
            p::query_issi_in::SIZE_BYTES,
            p::query_issi_out::SIZE_BYTES,
            Needs::Enabled,
        ),
        CmdOpcode::SetIssi => (
            p::set_issi_in::SIZE_BYTES,
            p::set_issi_out::SIZE_BYTES,
            Needs::PreInit,
        ),
        CmdOpcode::QueryPages => (
            p::query_pages_in::SIZE_BYTES,
            p::query_pages_out::SIZE_BYTES,
            Needs::Enabled,
        ),
        CmdOpcode::ManagePages => (
            p::manage_pages_in::SIZE_BYTES,
            p::manage_pages_out::SIZE_BYTES,
            Needs::Enabled,
        ),
        CmdOpcode::QueryHcaCap => (
            p::query_hca_cap_in::SIZE_BYTES,
            p::query_hca_cap_out::SIZE_BYTES,
            Needs::Enabled,
        ),
        CmdOpcode::SetHcaCap => (
            p::set_hca_cap_in::SIZE_BYTES,
            p::set_hca_cap_out::SIZE_BYTES,
            Needs::PreInit,
        ),
        CmdOpcode::AccessReg => (
            p::access_register_in::SIZE_BYTES,
            p::access_register_out::SIZE_BYTES,
            Needs::Enabled,
        ),
        CmdOpcode::SetDriverVersion => (
            p::set_driver_version_in::SIZE_BYTES,
            p::set_driver_version_out::SIZE_BYTES,
            Needs::Enabled,
        ),
        CmdOpcode::InitHca => (
            p::init_hca_in::SIZE_BYTES,
            p::init_hca_out::SIZE_BYTES,
            Needs::PreInit,
        ),
        CmdOpcode::TeardownHca => (
            p::teardown_hca_in::SIZE_BYTES,
            p::teardown_hca_out::SIZE_BYTES,
            Needs::Enabled,
        ),
        CmdOpcode::Nop => (
            p::mbox_in::SIZE_BYTES,
            p::mbox_out::SIZE_BYTES,
            Needs::Enabled,
        ),
        CmdOpcode::AllocUar => (
            p::alloc_uar_in::SIZE_BYTES,
            p::alloc_uar_out::SIZE_BYTES,
            Needs::Initialized,
        ),
        CmdOpcode::DeallocUar => (
            p::dealloc_uar_in::SIZE_BYTES,
            p::dealloc_uar_out::SIZE_BYTES,
            Needs::Initialized,
        ),
        CmdOpcode::AllocPd => (
            p::alloc_pd_in::SIZE_BYTES,
            p::alloc_pd_out::SIZE_BYTES,
            Needs::Initialized,
        ),
        CmdOpcode::DeallocPd => (
            p::dealloc_pd_in::SIZE_BYTES,
            p::dealloc_pd_out::SIZE_BYTES,
            Needs::Initialized,
        ),
        CmdOpcode::AllocTransportDomain => (
            p::alloc_transport_domain_in::SIZE_BYTES,
            p::alloc_transport_domain_out::SIZE_BYTES,
            Needs::Initialized,
        ),
        CmdOpcode::DeallocTransportDomain => (
            p::dealloc_transport_domain_in::SIZE_BYTES,
            p::dealloc_transport_domain_out::SIZE_BYTES,
            Needs::Initialized,
        ),
        CmdOpcode::QueryVportState => (
            p::query_vport_state_in::SIZE_BYTES,
            p::query_vport_state_out::SIZE_BYTES,
            Needs::Initialized,
        ),
        CmdOpcode::QueryNicVportContext => (
            p::query_nic_vport_context_in::SIZE_BYTES,
            p::query_nic_vport_context_out::SIZE_BYTES,
            Needs::Initialized,
        ),
        CmdOpcode::ModifyNicVportContext => (
            p::modify_nic_vport_context_in::SIZE_BYTES,
            p::modify_nic_vport_context_out::SIZE_BYTES,
            Needs::Initialized,
        ),
        CmdOpcode::QuerySpecialContexts => (
            p::query_special_contexts_in::SIZE_BYTES,
            p::query_special_contexts_out::SIZE_BYTES,
            Needs::Initialized,
        ),
        CmdOpcode::QueryVportCounter => (
            p::query_vport_counter_in::SIZE_BYTES,
            p::query_vport_counter_out::SIZE_BYTES,
            Needs::Initialized,
        ),
        _ => {
            let (i, o) = crate::hca::spec(op)?;
            (i, o, Needs::Initialized)
        }
    })
}

/// The ISSI values this firmware supports (mlx5.md §3.1 step 6): bit n = ISSI n.
pub const SUPPORTED_ISSI: u32 = 0b11;
/// The first UAR index handed out (pages 0..=2 hold the initialization segment).
pub const FIRST_UAR: u32 = INIT_SEGMENT_PAGES;
/// Lowest MTU MODIFY_NIC_VPORT_CONTEXT accepts.
pub const MIN_MTU: u32 = 68;
/// Highest MTU MODIFY_NIC_VPORT_CONTEXT accepts (ConnectX-5's largest).
pub const MAX_MTU: u32 = 9978;
/// The key QUERY_SPECIAL_CONTEXTS names as `terminate_scatter_list_mkey` when
/// [`FirmwareOptions::terminate_scatter_key`] is on: MKey index 0 (never handed out) with key
/// byte 0x5e — the firmware's choice (the real value is not public).
pub const TERMINATE_SCATTER_KEY: u32 = 0x5e;
/// What QUERY_HCA_CAP returns past the capability structure while
/// [`super::Strictness::cap_payload`] is on (the stricter reading of "reserved": a driver must
/// not send back bytes it does not own).
pub const CAP_TAIL_PATTERN: u8 = 0xa5;

/// The firmware's state; see the module docs.
#[derive(Clone, Debug)]
pub struct State {
    pub(crate) options: FirmwareOptions,
    pub(crate) phase: Phase,
    pub(crate) issi: u32,
    pub(crate) issi_set: bool,
    pub(crate) caps: Caps,
    pub(crate) pages: BTreeSet<u64>,
    pub(crate) host_endianness: Option<u32>,
    pub(crate) driver_version: Option<String>,
    pub(crate) uars: BTreeSet<u32>,
    pub(crate) pds: BTreeSet<u32>,
    pub(crate) tds: BTreeSet<u32>,
    pub(crate) roce_en: bool,
    pub(crate) mtu: u32,
    /// EQs, CQs, MKeys, QPs, GIDs and the data path.
    pub(crate) hca: Arc<Mutex<Hca>>,
    /// Pages the firmware wants beyond boot + init at run time (PAGE_REQUEST events).
    pub(crate) run_pages: i64,
    /// Commands held until their pages arrive (row 1), oldest first.
    pub(crate) parked: Vec<Parked>,
    /// Pages asked for by PAGE_REQUESTs for parked commands and not yet given.
    pub(crate) asked: u64,
    /// The port counters when the function last cleared its vport counters (or powered on):
    /// QUERY_VPORT_COUNTER reports what came since.
    pub(crate) vport_base: crate::eth::PortStats,
}

/// A command held for firmware pages ([`super::Strictness::page_requests`]): its slot stays
/// hardware-owned; the firmware re-reads the entry and its mailboxes when it runs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Parked {
    /// The command slot.
    pub(crate) slot: u32,
    /// The opcode fetched at the doorbell.
    pub(crate) opcode: u16,
    /// The pages its object costs.
    pub(crate) charge: u64,
}

/// What [`State::page_gate`] decided for a command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Gate {
    /// Execute it now.
    Run,
    /// Hold it (its charge); post a PAGE_REQUEST of `ask` pages when `ask` > 0.
    Park {
        /// Pages the object costs.
        charge: u64,
        /// Pages to ask for now.
        ask: u64,
    },
}

/// Bytes of capability type `t`'s structure (the rest of its 4 KiB area is reserved).
fn cap_struct_bytes(t: u32) -> usize {
    match t {
        cap_type::ROCE => roce_cap::SIZE_BYTES,
        cap_type::ETHERNET_OFFLOADS => {
            rnic_mlx5_prm::per_protocol_networking_offload_caps::SIZE_BYTES
        }
        cap_type::NIC_FLOW_TABLE => rnic_mlx5_prm::flow_table_nic_cap::SIZE_BYTES,
        _ => cmd_hca_cap::SIZE_BYTES,
    }
}

fn lowest_free(set: &BTreeSet<u32>, from: u32, below: u64) -> Option<u32> {
    (from..)
        .take_while(|&i| u64::from(i) < below)
        .find(|i| !set.contains(i))
}

impl State {
    /// Power-on state.
    pub fn new(options: FirmwareOptions) -> State {
        State {
            options,
            phase: Phase::Disabled,
            issi: 0,
            issi_set: false,
            caps: Caps::new(&options),
            pages: BTreeSet::new(),
            host_endianness: None,
            driver_version: None,
            uars: BTreeSet::new(),
            pds: BTreeSet::new(),
            tds: BTreeSet::new(),
            roce_en: false,
            mtu: u32::from(options.mtu),
            hca: Hca::new_shared(Weak::new()),
            run_pages: 0,
            parked: Vec::new(),
            asked: 0,
            vport_base: crate::eth::PortStats::default(),
        }
    }

    /// A power-on state whose HCA reaches the device through `dev`.
    pub(crate) fn attached(options: FirmwareOptions, dev: Weak<Device>) -> State {
        let mut s = State::new(options);
        if let Some(d) = dev.upgrade() {
            s.vport_base = d.port_counters().snapshot();
        }
        lock(&s.hca).attach(dev);
        s
    }

    /// The pages every initialized function keeps: boot + init.
    fn base_pages(&self) -> u64 {
        u64::from(self.options.boot_pages) + u64::from(self.options.init_pages)
    }

    /// The pages the live CQs, QPs and MKeys are charged (0 unless the `page-requests`
    /// check is on).
    fn object_charge(&self) -> u64 {
        if !self.options.strictness.page_requests {
            return 0;
        }
        let l = lock(&self.hca).live();
        u64::from(self.options.object_pages) * (l.cqs + l.qps + l.mkeys) as u64
    }

    /// The pages the parked commands wait for.
    fn parked_charge(&self) -> u64 {
        self.parked.iter().map(|p| p.charge).sum()
    }

    /// The pages the firmware runs on while initialized: boot + init + run-time demand +
    /// the objects' charge (without parked commands).
    fn committed(&self) -> u64 {
        (self.base_pages() + self.object_charge()).saturating_add_signed(self.run_pages)
    }

    /// The pages the firmware keeps while initialized: what it runs on and what parked
    /// commands wait for.
    fn keep_initialized(&self) -> u64 {
        self.committed() + self.parked_charge()
    }

    /// QUERY_PAGES(regular): what the run-time demand still lacks (> 0) or leaves over (< 0).
    fn regular_demand(&self) -> i64 {
        if self.phase != Phase::Initialized {
            return 0;
        }
        i64::try_from(self.keep_initialized()).unwrap_or(i64::MAX) - self.held() as i64
    }

    /// The firmware wants `n` pages more than it holds now (or `-n` fewer; never fewer than
    /// what it runs on without run-time demand): the target QUERY_PAGES(regular) then
    /// reports against.
    pub(crate) fn request_pages(&mut self, n: i32) {
        let floor = (self.base_pages() + self.object_charge() + self.parked_charge()) as i64;
        let target = (self.held() as i64 + i64::from(n)).max(floor);
        self.run_pages = target - floor;
    }

    /// Row 1: whether command `op` runs now or waits for pages. A CQ, QP or MKey creation
    /// costs `object_pages` while the `page-requests` check is on; when the pages held do not
    /// cover what the firmware runs on, what parked commands wait for and this charge, and an
    /// EQ subscribes to page requests (else the firmware cannot ask, and runs it as before),
    /// it parks and asks for what it has not asked for yet. Commands the common checks would
    /// refuse (uid, lengths, not initialized) run, to be refused.
    pub(crate) fn page_gate(&self, op: CmdOpcode, input: &[u8], outlen: usize) -> Gate {
        let creates = matches!(
            op,
            CmdOpcode::CreateCq | CmdOpcode::CreateQp | CmdOpcode::CreateMkey
        );
        let charge = u64::from(self.options.object_pages);
        if !creates || !self.options.strictness.page_requests || charge == 0 {
            return Gate::Run;
        }
        let Some((inlen_min, outlen_min, _)) = spec(op) else {
            return Gate::Run;
        };
        if self.phase != Phase::Initialized
            || MboxIn::new_unchecked(input).uid() != 0
            || input.len() < inlen_min
            || outlen < outlen_min
        {
            return Gate::Run;
        }
        let need = self.keep_initialized() + charge;
        if self.held() >= need || !lock(&self.hca).subscribes(rnic_mlx5_prm::EventType::PageRequest)
        {
            return Gate::Run;
        }
        let missing = need - self.held();
        Gate::Park {
            charge,
            ask: missing.saturating_sub(self.asked),
        }
    }

    /// The oldest parked command, if the pages held now cover it.
    pub(crate) fn runnable(&self) -> Option<Parked> {
        let head = *self.parked.first()?;
        (self.held() >= self.committed() + head.charge).then_some(head)
    }

    fn held(&self) -> u64 {
        self.pages.len() as u64
    }

    fn boot_missing(&self) -> u64 {
        u64::from(self.options.boot_pages).saturating_sub(self.held())
    }

    fn init_missing(&self) -> u64 {
        let total = u64::from(self.options.boot_pages) + u64::from(self.options.init_pages);
        total.saturating_sub(self.held()) - self.boot_missing()
    }

    /// QUERY_VPORT_COUNTER: the vport's packets and octets since power-on (or the last
    /// `clear`), from the port's counters.
    fn query_vport_counter(&mut self, dev: &Device, input: &[u8], out: &mut [u8]) -> Outcome {
        let v = QueryVportCounterIn::new_unchecked(input);
        if v.other_vport() != 0 || v.vport_number() != 0 {
            return param(syn::OTHER_VPORT);
        }
        if v.op_mod() != QUERY_VPORT_COUNTER_OP_MOD_VPORT || v.port_num() > 1 {
            return param(syn::VPORT_COUNTER_OP_MOD);
        }
        let now = dev.port_counters().snapshot();
        let d = now.since(&self.vport_base);
        let mut o = QueryVportCounterOut::new_unchecked(out);
        let set = |mut t: rnic_mlx5_prm::TrafficCounter<&mut [u8]>, packets: u64, octets: u64| {
            let _ = t.set_packets(packets);
            let _ = t.set_octets(octets);
        };
        set(o.received_errors_mut(), d.rx_malformed + d.rx_mtu, 0);
        set(
            o.transmit_errors_mut(),
            d.tx_errors + d.tx_mtu + d.tx_bad_dmac + d.tx_bad_smac,
            0,
        );
        set(
            o.received_eth_unicast_mut(),
            d.rx_unicast,
            d.rx_unicast_octets,
        );
        set(
            o.received_eth_multicast_mut(),
            d.rx_multicast,
            d.rx_multicast_octets,
        );
        set(
            o.received_eth_broadcast_mut(),
            d.rx_broadcast,
            d.rx_broadcast_octets,
        );
        set(
            o.transmitted_eth_unicast_mut(),
            d.tx_unicast,
            d.tx_unicast_octets,
        );
        set(
            o.transmitted_eth_multicast_mut(),
            d.tx_multicast,
            d.tx_multicast_octets,
        );
        set(
            o.transmitted_eth_broadcast_mut(),
            d.tx_broadcast,
            d.tx_broadcast_octets,
        );
        set(o.local_loopback_mut(), d.rx_loopback, 0);
        if v.clear() == 1 {
            self.vport_base = now;
        }
        Ok(())
    }

    fn live_objects(&self) -> usize {
        self.uars.len() + self.pds.len() + self.tds.len() + lock(&self.hca).objects()
    }

    /// Execute command `op` (its opcode, from the inline bytes) with `input` (`inlen` bytes)
    /// into `out` (zeroed, at least 16 bytes, `outlen` of which are delivered).
    pub fn execute(
        &mut self,
        dev: &Device,
        op: CmdOpcode,
        input: &[u8],
        outlen: usize,
        out: &mut [u8],
    ) -> Outcome {
        let hdr = MboxIn::new_unchecked(input);
        let Some((inlen_min, outlen_min, needs)) = spec(op) else {
            return refuse(CmdStatus::BadOp, syn::UNKNOWN_OPCODE);
        };
        if hdr.uid() != 0 {
            return param(syn::UID_NOT_ZERO);
        }
        if input.len() < inlen_min {
            return refuse(CmdStatus::BadInpLen, syn::INPUT_TOO_SHORT);
        }
        if outlen < outlen_min {
            return refuse(CmdStatus::BadOutpLen, syn::OUTPUT_TOO_SHORT);
        }
        let state_ok = match (needs, self.phase) {
            (Needs::Disabled, Phase::Disabled) => Ok(()),
            (Needs::Disabled, _) => Err(syn::ALREADY_ENABLED),
            (_, Phase::Disabled) => Err(syn::NOT_ENABLED),
            (Needs::Enabled, _) => Ok(()),
            (Needs::PreInit, Phase::Enabled) => Ok(()),
            (Needs::PreInit, _) => Err(syn::ALREADY_INITIALIZED),
            (Needs::Initialized, Phase::Initialized) => Ok(()),
            (Needs::Initialized, _) => Err(syn::NOT_INITIALIZED),
        };
        if let Err(s) = state_ok {
            return refuse(CmdStatus::BadSysState, s);
        }
        match op {
            CmdOpcode::EnableHca | CmdOpcode::DisableHca => self.enable_disable(op, input),
            CmdOpcode::QueryIssi => {
                let mut o = QueryIssiOut::new_unchecked(out);
                let _ = o.set_current_issi(self.issi);
                let _ = o.set_supported_issi_dw0(SUPPORTED_ISSI);
                Ok(())
            }
            CmdOpcode::SetIssi => {
                let v = SetIssiIn::new_unchecked(input).current_issi();
                if v >= 32 || SUPPORTED_ISSI & (1 << v) == 0 {
                    return param(syn::ISSI_UNSUPPORTED);
                }
                self.issi = v;
                self.issi_set = true;
                Ok(())
            }
            CmdOpcode::QueryPages => self.query_pages(input, out),
            CmdOpcode::ManagePages => self.manage_pages(dev, input, outlen, out),
            CmdOpcode::QueryHcaCap => self.query_hca_cap(input, out),
            CmdOpcode::SetHcaCap => self.set_hca_cap(input),
            CmdOpcode::AccessReg => self.access_reg(dev, input, outlen, out),
            CmdOpcode::SetDriverVersion => {
                let v = SetDriverVersionIn::new_unchecked(input);
                let s = v.driver_version();
                let end = s.iter().position(|&b| b == 0).unwrap_or(s.len());
                self.driver_version = Some(String::from_utf8_lossy(&s[..end]).into_owned());
                Ok(())
            }
            CmdOpcode::InitHca => {
                if !self.issi_set {
                    return refuse(CmdStatus::BadSysState, syn::INIT_WITHOUT_ISSI);
                }
                if self.boot_missing() > 0 {
                    return refuse(CmdStatus::BadSysState, syn::INIT_WITHOUT_BOOT_PAGES);
                }
                if self.init_missing() > 0 {
                    return refuse(CmdStatus::BadSysState, syn::INIT_WITHOUT_INIT_PAGES);
                }
                self.phase = Phase::Initialized;
                Ok(())
            }
            CmdOpcode::TeardownHca => {
                let profile = TeardownHcaIn::new_unchecked(input).profile();
                if profile != teardown_profile::GRACEFUL {
                    return param(syn::TEARDOWN_PROFILE);
                }
                if self.phase != Phase::Initialized {
                    return refuse(CmdStatus::BadSysState, syn::TEARDOWN_NOT_INITIALIZED);
                }
                if self.live_objects() > 0 {
                    return refuse(CmdStatus::BadResState, syn::TEARDOWN_OBJECTS_LIVE);
                }
                lock(&self.hca).teardown();
                self.run_pages = 0;
                self.phase = Phase::Enabled;
                Ok(())
            }
            CmdOpcode::Nop => Ok(()),
            CmdOpcode::AllocUar => {
                let Some(idx) = lowest_free(&self.uars, FIRST_UAR, u64::from(FIRST_NON_UAR_PAGE))
                else {
                    return refuse(CmdStatus::NoRes, syn::UAR_EXHAUSTED);
                };
                if let Err(e) = dev.watch_uar(idx) {
                    tracing::error!(%e, "ALLOC_UAR: watching the page failed (bug)");
                    return refuse(CmdStatus::NoRes, syn::UAR_EXHAUSTED);
                }
                let _ = AllocUarOut::new_unchecked(out).set_uar(idx);
                self.uars.insert(idx);
                Ok(())
            }
            CmdOpcode::DeallocUar => {
                let idx = DeallocUarIn::new_unchecked(input).uar();
                if !(FIRST_UAR..FIRST_NON_UAR_PAGE).contains(&idx) {
                    return param(syn::UAR_INDEX);
                }
                if !self.uars.contains(&idx) {
                    return refuse(CmdStatus::BadRes, syn::UAR_NOT_ALLOCATED);
                }
                if lock(&self.hca).uses_uar(idx) {
                    return refuse(CmdStatus::BadResState, syn::RESOURCE_IN_USE);
                }
                self.uars.remove(&idx);
                dev.unwatch_uar(idx);
                Ok(())
            }
            CmdOpcode::AllocPd => {
                let limit = 1u64 << self.caps.general().log_max_pd();
                let Some(pd) = lowest_free(&self.pds, 1, limit) else {
                    return refuse(CmdStatus::NoRes, syn::PD_EXHAUSTED);
                };
                let _ = AllocPdOut::new_unchecked(out).set_pd(pd);
                self.pds.insert(pd);
                Ok(())
            }
            CmdOpcode::DeallocPd => {
                let pd = DeallocPdIn::new_unchecked(input).pd();
                if !self.pds.contains(&pd) {
                    return refuse(CmdStatus::BadRes, syn::PD_NOT_ALLOCATED);
                }
                if lock(&self.hca).uses_pd(pd) {
                    return refuse(CmdStatus::BadResState, syn::RESOURCE_IN_USE);
                }
                self.pds.remove(&pd);
                Ok(())
            }
            CmdOpcode::AllocTransportDomain => {
                let limit = 1u64 << self.caps.general().log_max_transport_domain();
                let Some(td) = lowest_free(&self.tds, 1, limit) else {
                    return refuse(CmdStatus::NoRes, syn::TD_EXHAUSTED);
                };
                let _ = AllocTransportDomainOut::new_unchecked(out).set_transport_domain(td);
                self.tds.insert(td);
                Ok(())
            }
            CmdOpcode::DeallocTransportDomain => {
                let td = DeallocTransportDomainIn::new_unchecked(input).transport_domain();
                if !self.tds.contains(&td) {
                    return refuse(CmdStatus::BadRes, syn::TD_NOT_ALLOCATED);
                }
                if lock(&self.hca).uses_td(td) {
                    return refuse(CmdStatus::BadResState, syn::TD_IN_USE);
                }
                self.tds.remove(&td);
                Ok(())
            }
            CmdOpcode::QueryVportCounter => self.query_vport_counter(dev, input, out),
            CmdOpcode::QueryVportState => {
                let v = QueryVportStateIn::new_unchecked(input);
                if v.other_vport() != 0 || v.vport_number() != 0 {
                    return param(syn::OTHER_VPORT);
                }
                let m = v.op_mod();
                if m != vport_state_op_mod::VNIC_VPORT && m != vport_state_op_mod::UPLINK {
                    return param(syn::VPORT_STATE_OP_MOD);
                }
                let mut o = QueryVportStateOut::new_unchecked(out);
                let _ = o.set_admin_state(1);
                let _ = o.set_state(u32::from(dev.link_up()));
                Ok(())
            }
            CmdOpcode::QueryNicVportContext => {
                let v = QueryNicVportContextIn::new_unchecked(input);
                if v.other_vport() != 0 || v.vport_number() != 0 {
                    return param(syn::OTHER_VPORT);
                }
                let mut o = QueryNicVportContextOut::new_unchecked(out);
                let mut c = o.nic_vport_context_mut();
                let _ = c.set_roce_en(u32::from(self.roce_en));
                let _ = c.set_mtu(lock(&self.hca).vport_mtu(self.mtu));
                let mac = self.options.mac;
                let mut be = [0u8; 8];
                be[2..].copy_from_slice(&mac);
                let _ = c.set_permanent_address(u64::from_be_bytes(be));
                let _ = c.set_min_wqe_inline_mode(self.options.min_inline);
                Ok(())
            }
            CmdOpcode::ModifyNicVportContext => self.modify_nic_vport(input),
            CmdOpcode::QuerySpecialContexts => {
                let mut o = QuerySpecialContextsOut::new_unchecked(out);
                // Only the terminator is offered (caps resd_lkey, null_mkey, dump_fill_mkey 0).
                let key = if self.options.terminate_scatter_key {
                    TERMINATE_SCATTER_KEY
                } else {
                    0
                };
                let _ = o.set_terminate_scatter_list_mkey(key);
                Ok(())
            }
            op if crate::hca::spec(op).is_some() => {
                let mut hca = lock(&self.hca);
                let ctx = Ctx {
                    pds: &self.pds,
                    uars: &self.uars,
                    tds: &self.tds,
                    caps: &self.caps,
                    mac: self.options.mac,
                    mtu: hca.vport_mtu(self.mtu),
                    roce_en: self.roce_en,
                    min_inline: self.options.min_inline,
                };
                hca.command(dev, op, input, out, &ctx)
            }
            // `spec` returned Some only for the opcodes above.
            _ => refuse(CmdStatus::BadOp, syn::UNKNOWN_OPCODE),
        }
    }

    fn enable_disable(&mut self, op: CmdOpcode, input: &[u8]) -> Outcome {
        // ENABLE_HCA and DISABLE_HCA inputs have the same layout.
        let v = EnableHcaIn::new_unchecked(input);
        if v.function_id() != 0 || v.embedded_cpu_function() != 0 {
            return param(syn::OTHER_FUNCTION);
        }
        if op == CmdOpcode::EnableHca {
            self.phase = Phase::Enabled;
            return Ok(());
        }
        if self.phase == Phase::Initialized {
            return refuse(CmdStatus::BadSysState, syn::DISABLE_WHILE_INITIALIZED);
        }
        if !self.pages.is_empty() {
            return refuse(CmdStatus::BadSysState, syn::DISABLE_PAGES_HELD);
        }
        let options = self.options;
        let dev = lock(&self.hca).device();
        *self = State::attached(options, dev);
        Ok(())
    }

    fn query_pages(&mut self, input: &[u8], out: &mut [u8]) -> Outcome {
        let v = QueryPagesIn::new_unchecked(input);
        if v.function_id() != 0 || v.embedded_cpu_function() != 0 {
            return param(syn::OTHER_FUNCTION);
        }
        let n = match v.op_mod() {
            query_pages_op_mod::BOOT => self.boot_missing(),
            query_pages_op_mod::INIT => self.init_missing(),
            query_pages_op_mod::REGULAR => {
                let d = self
                    .regular_demand()
                    .clamp(i64::from(i32::MIN), i64::from(i32::MAX));
                let mut o = QueryPagesOut::new_unchecked(out);
                let _ = o.set_function_id(0);
                // num_pages is signed: negative = the firmware returns pages.
                let _ = o.set_num_pages(d as i32 as u32);
                return Ok(());
            }
            _ => return param(syn::PAGES_OP_MOD),
        };
        let mut o = QueryPagesOut::new_unchecked(out);
        let _ = o.set_function_id(0);
        // At most boot + init pages, both u32.
        let _ = o.set_num_pages(u32::try_from(n).unwrap_or(u32::MAX));
        Ok(())
    }

    fn manage_pages(
        &mut self,
        dev: &Device,
        input: &[u8],
        outlen: usize,
        out: &mut [u8],
    ) -> Outcome {
        let v = ManagePagesIn::new_unchecked(input);
        if v.function_id() != 0 || v.embedded_cpu_function() != 0 {
            return param(syn::OTHER_FUNCTION);
        }
        let n = v.input_num_entries() as usize;
        let pas_at = manage_pages_in::pas.byte_offset();
        match v.op_mod() {
            manage_pages_op_mod::ALLOC_FAIL => Ok(()),
            manage_pages_op_mod::GIVE => {
                if n == 0 {
                    return param(syn::PAGES_ZERO);
                }
                if input.len() < pas_at + 8 * n {
                    return refuse(CmdStatus::BadInpLen, syn::PAGES_INPUT_TOO_SHORT);
                }
                if self.pages.len() + n > self.options.max_pages as usize {
                    return refuse(CmdStatus::ExceedLim, syn::PAGES_LIMIT);
                }
                let mut new = BTreeSet::new();
                let mut page = vec![0u8; UAR_PAGE as usize];
                for i in 0..n {
                    let addr = v.pas(i).unwrap_or(0);
                    if !addr.is_multiple_of(UAR_PAGE) {
                        return param(syn::PAGE_UNALIGNED);
                    }
                    if self.pages.contains(&addr) || !new.insert(addr) {
                        return param(syn::PAGE_ALREADY_GIVEN);
                    }
                    // The page now belongs to the firmware: prove it can read and write all of
                    // it (writing back what it read changes nothing).
                    if dev.dma_read(addr, &mut page).is_err() || dev.dma_write(addr, &page).is_err()
                    {
                        return param(syn::PAGE_NOT_MAPPED);
                    }
                }
                self.asked = self.asked.saturating_sub(n as u64);
                self.pages.extend(new);
                Ok(())
            }
            manage_pages_op_mod::TAKE => {
                if n == 0 {
                    return param(syn::PAGES_ZERO);
                }
                if outlen < rnic_mlx5_prm::manage_pages_out::pas.byte_offset() + 8 * n {
                    return refuse(CmdStatus::BadOutpLen, syn::PAGES_OUTPUT_TOO_SHORT);
                }
                // While initialized the firmware keeps the boot and init pages it runs on.
                let keep = if self.phase == Phase::Initialized {
                    self.keep_initialized()
                } else {
                    0
                };
                let spare = usize::try_from(self.held().saturating_sub(keep)).unwrap_or(usize::MAX);
                let count = n.min(spare);
                let mut o = ManagePagesOut::new_unchecked(out);
                for i in 0..count {
                    let Some(addr) = self.pages.pop_last() else {
                        break;
                    };
                    let _ = o.set_pas(i, addr);
                }
                // count <= n, which came from a u32.
                let _ = o.set_output_num_entries(count as u32);
                Ok(())
            }
            _ => param(syn::PAGES_OP_MOD),
        }
    }

    fn cap_type_of(op_mod: u32) -> Option<u32> {
        match op_mod >> 1 {
            t @ (cap_type::GENERAL
            | cap_type::ROCE
            | cap_type::ETHERNET_OFFLOADS
            | cap_type::NIC_FLOW_TABLE) => Some(t),
            _ => None,
        }
    }

    fn cap_pair(&mut self, t: u32) -> &mut super::caps::CapPair {
        match t {
            cap_type::ROCE => &mut self.caps.roce,
            cap_type::ETHERNET_OFFLOADS => &mut self.caps.eth,
            cap_type::NIC_FLOW_TABLE => &mut self.caps.flow,
            _ => &mut self.caps.general,
        }
    }

    fn query_hca_cap(&mut self, input: &[u8], out: &mut [u8]) -> Outcome {
        let v = QueryHcaCapIn::new_unchecked(input);
        if v.other_function() != 0 || v.function_id() != 0 {
            return param(syn::OTHER_FUNCTION);
        }
        let Some(t) = Self::cap_type_of(v.op_mod()) else {
            return param(syn::CAP_TYPE_UNSUPPORTED);
        };
        if self.boot_missing() > 0 {
            return refuse(CmdStatus::BadSysState, syn::CAP_WITHOUT_BOOT_PAGES);
        }
        let tail = self.options.strictness.cap_payload;
        let page = self.cap_pair(t).page(v.op_mod() & 1 == 1);
        let at = query_hca_cap_out::cmd_hca_cap.byte_offset();
        if let Some(dst) = out.get_mut(at..at + CAP_PAGE_BYTES) {
            dst.copy_from_slice(page);
            if tail {
                dst[cap_struct_bytes(t)..].fill(CAP_TAIL_PATTERN);
            }
        }
        Ok(())
    }

    fn set_hca_cap(&mut self, input: &[u8]) -> Outcome {
        let v = SetHcaCapIn::new_unchecked(input);
        if v.other_function() != 0 || v.function_id() != 0 {
            return param(syn::OTHER_FUNCTION);
        }
        if v.op_mod() & 1 != 0 {
            return param(syn::CAP_SET_OP_MOD);
        }
        let Some(t) = Self::cap_type_of(v.op_mod()) else {
            return param(syn::CAP_TYPE_UNSUPPORTED);
        };
        if self.boot_missing() > 0 {
            return refuse(CmdStatus::BadSysState, syn::CAP_WITHOUT_BOOT_PAGES);
        }
        let at = set_hca_cap_in::cmd_hca_cap.byte_offset();
        let page = input.get(at..).unwrap_or(&[]);
        if self.options.strictness.cap_payload
            && page
                .iter()
                .take(CAP_PAGE_BYTES)
                .skip(cap_struct_bytes(t))
                .any(|&b| b != 0)
        {
            tracing::info!(
                cap_type = t,
                "SET_HCA_CAP refused: bytes past the capability structure are not zero"
            );
            return param(syn::CAP_PAYLOAD);
        }
        self.cap_pair(t).set(page).map_err(|r| {
            tracing::info!(field = r.field, "SET_HCA_CAP refused");
            Refusal {
                status: CmdStatus::BadParam,
                syndrome: r.syndrome,
            }
        })
    }

    fn access_reg(&mut self, dev: &Device, input: &[u8], outlen: usize, out: &mut [u8]) -> Outcome {
        let v = AccessRegisterIn::new_unchecked(input);
        let id = v.register_id();
        if id != register_id::HOST_ENDIANNESS && id != register_id::PTYS {
            return param(syn::REGISTER_UNSUPPORTED);
        }
        if self.boot_missing() > 0 {
            return refuse(CmdStatus::BadSysState, syn::CAP_WITHOUT_BOOT_PAGES);
        }
        let data_at = access_register_in::register_data.byte_offset();
        if id == register_id::PTYS {
            return self.ptys(dev, v.op_mod(), input, outlen, out);
        }
        let size = register_host_endianness::SIZE_BYTES;
        match v.op_mod() {
            access_reg_op_mod::WRITE => {
                let Some(data) = input.get(data_at..data_at + size) else {
                    return refuse(CmdStatus::BadInpLen, syn::REGISTER_LENGTH);
                };
                self.host_endianness = Some(RegisterHostEndianness::new_unchecked(data).he());
                Ok(())
            }
            access_reg_op_mod::READ => {
                if outlen < data_at + size {
                    return refuse(CmdStatus::BadOutpLen, syn::REGISTER_LENGTH);
                }
                if let Some(dst) = out.get_mut(data_at..data_at + size) {
                    let _ = RegisterHostEndianness::new_unchecked(dst)
                        .set_he(self.host_endianness.unwrap_or(0));
                }
                Ok(())
            }
            _ => param(syn::REGISTER_OP_MOD),
        }
    }

    /// ACCESS_REG PTYS (0x5004) read: the port's one Ethernet link mode as capability and
    /// admin, and as oper while the link is up (0 while down).
    fn ptys(
        &self,
        dev: &Device,
        op_mod: u32,
        input: &[u8],
        outlen: usize,
        out: &mut [u8],
    ) -> Outcome {
        let data_at = access_register_in::register_data.byte_offset();
        let size = ptys_reg::SIZE_BYTES;
        match op_mod {
            access_reg_op_mod::READ => {}
            access_reg_op_mod::WRITE => return param(syn::REGISTER_READ_ONLY),
            _ => return param(syn::REGISTER_OP_MOD),
        }
        let Some(data) = input.get(data_at..data_at + size) else {
            return refuse(CmdStatus::BadInpLen, syn::REGISTER_LENGTH);
        };
        if outlen < data_at + size {
            return refuse(CmdStatus::BadOutpLen, syn::REGISTER_LENGTH);
        }
        let req = PtysReg::new_unchecked(data);
        if req.local_port() != 1 {
            return param(syn::REGISTER_PORT);
        }
        if self.options.port_type != PortType::Eth || req.proto_mask() != ptys_proto::ETH {
            return param(syn::REGISTER_PROTO);
        }
        let mode = self.options.port_speed.eth_proto_bit();
        if let Some(dst) = out.get_mut(data_at..data_at + size) {
            let mut o = PtysReg::new_unchecked(dst);
            let _ = o.set_local_port(1);
            let _ = o.set_proto_mask(ptys_proto::ETH);
            let _ = o.set_eth_proto_capability(mode);
            let _ = o.set_eth_proto_admin(mode);
            let _ = o.set_eth_proto_oper(if dev.link_up() { mode } else { 0 });
        }
        Ok(())
    }

    fn modify_nic_vport(&mut self, input: &[u8]) -> Outcome {
        let v = ModifyNicVportContextIn::new_unchecked(input);
        if v.other_vport() != 0 || v.vport_number() != 0 {
            return param(syn::OTHER_VPORT);
        }
        let f = modify_nic_vport_context_in::field_select;
        let select = get_bits(input, f.bit_offset as usize, f.width).unwrap_or(0) as u32;
        let roce = modify_nic_vport_field_select::roce_en.insert(0, 1);
        let mtu = modify_nic_vport_field_select::mtu.insert(0, 1);
        let list = modify_nic_vport_field_select::addresses_list.insert(0, 1);
        let promisc = modify_nic_vport_field_select::promisc.insert(0, 1);
        if select & !(roce | mtu | list | promisc) != 0 {
            return param(syn::VPORT_FIELD_UNSUPPORTED);
        }
        let ctx = v.nic_vport_context();
        // The address list, checked whole before anything changes.
        let mut mc = None;
        if select & list != 0 {
            let kind = ctx.allowed_list_type();
            let n = ctx.allowed_list_size() as usize;
            if kind > 1 {
                return param(syn::VPORT_LIST_TYPE);
            }
            let g = self.caps.general();
            let log_max = if kind == 1 {
                g.log_max_current_mc_list()
            } else {
                g.log_max_current_uc_list()
            };
            if n > 1 << log_max {
                return param(syn::VPORT_LIST_SIZE);
            }
            let at = modify_nic_vport_context_in::nic_vport_context.byte_offset()
                + rnic_mlx5_prm::nic_vport_context::current_uc_mac_address.byte_offset();
            let Some(entries) = input.get(at..at + 8 * n) else {
                return refuse(CmdStatus::BadInpLen, syn::VPORT_LIST_LENGTH);
            };
            let macs: Vec<[u8; 6]> = entries
                .chunks_exact(8)
                .map(|e| [e[2], e[3], e[4], e[5], e[6], e[7]])
                .collect();
            if macs.iter().any(|m| (m[0] & 1 == 1) != (kind == 1)) {
                return param(syn::VPORT_LIST_ADDRESS);
            }
            if kind == 1 {
                mc = Some(macs);
            }
        }
        if select & mtu != 0 && !(MIN_MTU..=MAX_MTU).contains(&ctx.mtu()) {
            return param(syn::VPORT_MTU);
        }
        if select & roce != 0 && ctx.roce_en() == 1 && self.options.port_type == PortType::Ib {
            return param(syn::ROCE_ON_IB_PORT);
        }
        if select & roce != 0 {
            self.roce_en = ctx.roce_en() == 1;
        }
        if select & mtu != 0 {
            self.mtu = ctx.mtu();
        }
        // The unicast list is accepted and not used: the port takes unicast for the permanent
        // address (and, with promisc_uc, for any).
        if mc.is_some() || select & promisc != 0 {
            let mut hca = lock(&self.hca);
            if let Some(m) = mc {
                hca.mc_list = m;
            }
            if select & promisc != 0 {
                hca.promisc_mc = ctx.promisc_mc() == 1 || ctx.promisc_all() == 1;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Options;
    use crate::watch::NoFirmware;
    use rnic_mlx5_prm::{ManagePagesIn, mbox_in};

    fn run(s: &mut State, dev: &Device, input: &[u8], outlen: usize) -> (Outcome, Vec<u8>) {
        let op = CmdOpcode::from_raw(MboxIn::new_unchecked(input).opcode() as u16);
        let mut out = vec![0u8; outlen.max(16)];
        (s.execute(dev, op, input, outlen, &mut out), out)
    }

    fn cmd(op: CmdOpcode, op_mod: u32, len: usize) -> Vec<u8> {
        let mut b = vec![0u8; len.max(mbox_in::SIZE_BYTES)];
        let mut h = MboxIn::new_unchecked(&mut b[..]);
        h.set_opcode(op.as_raw().into()).unwrap();
        h.set_op_mod(op_mod).unwrap();
        b
    }

    #[test]
    fn page_demand_moves_from_boot_to_init_and_take_keeps_what_init_needs() {
        let dev = Device::new(Options::default(), Box::new(NoFirmware)).unwrap();
        let opts = FirmwareOptions {
            boot_pages: 2,
            init_pages: 3,
            ..FirmwareOptions::default()
        };
        let mut s = State::new(opts);
        s.phase = Phase::Enabled;
        s.issi_set = true;
        assert_eq!((s.boot_missing(), s.init_missing()), (2, 3));
        s.pages.extend([0x1000, 0x2000, 0x3000]);
        assert_eq!((s.boot_missing(), s.init_missing()), (0, 2));
        s.pages.extend([0x4000, 0x5000, 0x6000]);
        assert_eq!((s.boot_missing(), s.init_missing()), (0, 0));
        let (r, _) = run(&mut s, &dev, &cmd(CmdOpcode::InitHca, 0, 0x20), 0x10);
        assert_eq!(r, Ok(()));
        // One spare page beyond boot + init: only it comes back while initialized.
        let mut take = cmd(CmdOpcode::ManagePages, manage_pages_op_mod::TAKE, 0x10);
        ManagePagesIn::new_unchecked(&mut take[..])
            .set_input_num_entries(4)
            .unwrap();
        let (r, out) = run(&mut s, &dev, &take, 0x10 + 32);
        assert_eq!(r, Ok(()));
        let o = ManagePagesOut::new_unchecked(&out[..]);
        assert_eq!((o.output_num_entries(), o.pas(0)), (1, Some(0x6000)));
        assert_eq!(s.pages.len(), 5);
        // Short outlen for 4 entries.
        let (r, _) = run(&mut s, &dev, &take, 0x10 + 24);
        assert_eq!(
            r,
            Err(Refusal {
                status: CmdStatus::BadOutpLen,
                syndrome: syn::PAGES_OUTPUT_TOO_SHORT
            })
        );
    }

    #[test]
    fn checks_run_in_the_documented_order() {
        let dev = Device::new(Options::default(), Box::new(NoFirmware)).unwrap();
        let mut s = State::new(FirmwareOptions::default());
        // Disabled, short input, short output, nonzero uid: the uid check wins over lengths,
        // lengths over state.
        let mut c = cmd(CmdOpcode::QueryIssi, 0, 0x8);
        c[3] = 9;
        let (r, _) = run(&mut s, &dev, &c, 0);
        assert_eq!(r.unwrap_err().syndrome, syn::UID_NOT_ZERO);
        c[3] = 0;
        let (r, _) = run(&mut s, &dev, &c, 0);
        assert_eq!(r.unwrap_err().status, CmdStatus::BadInpLen);
        let c = cmd(CmdOpcode::QueryIssi, 0, 0x10);
        let (r, _) = run(&mut s, &dev, &c, 0);
        assert_eq!(r.unwrap_err().status, CmdStatus::BadOutpLen);
        let (r, _) = run(&mut s, &dev, &c, 0x70);
        assert_eq!(r.unwrap_err().syndrome, syn::NOT_ENABLED);
        let (r, _) = run(&mut s, &dev, &cmd(CmdOpcode::QueryAdapter, 0, 0x10), 0x10);
        assert_eq!(r.unwrap_err().status, CmdStatus::BadOp, "not implemented");
    }
}
