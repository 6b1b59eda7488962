//! NIC RX flow steering (K `mlx5_ifc.h` flow table commands): flow tables, flow groups with
//! their match criteria, flow table entries forwarding to TIRs (or to tables of a higher
//! level), the root of the NIC RX table type — and the lookup a received frame goes through.
//!
//! Semantics (the stricter reading where the public facts are silent; docs/mlx5-emu.md):
//!
//! - Only the NIC RX table type exists (`flow_table_nic_cap` advertises receive only); every
//!   command names it and this vport (no other vport / eswitch fields).
//! - A group owns the entries `start_flow_index..=end_flow_index` of its table; groups of a
//!   table never overlap. Its mask may only set bits of the match fields the port parses
//!   (`flow_table_properties_nic_receive.ft_field_support`, ICMP/ICMPv6 through
//!   `flex_parser_protocols`), in the sets `match_criteria_enable` enables (outer headers,
//!   misc set 3).
//! - An entry lies in its group's range, at a free index; its `match_value` has no bit
//!   outside the group's mask, and no other entry of the group has the same value (a
//!   duplicate would make the match ambiguous). Actions: FWD_DEST (1..=2^log_max_destination
//!   TIRs or tables of a higher level) or DROP. Entries are not modified in place
//!   (`flow_modify_en` 0): delete and set again.
//! - A frame is looked up from the root table: groups in order of their first index, the
//!   first entry whose value equals the frame's key under its group's mask decides; a miss
//!   (or no root) drops the frame (counted `rx_no_rule`).
//! - Nothing in use is destroyed: a table that is the root, has groups or is an entry's
//!   destination; a group with entries; a TIR an entry forwards to (checked by the HCA).
//!
//! Every refusal leaves the tables as they were.

use std::collections::{BTreeMap, HashMap};

use rnic_mlx5_prm::{
    CmdStatus, CreateFlowGroupIn, CreateFlowGroupOut, CreateFlowTableIn, CreateFlowTableOut,
    DeleteFteIn, DestroyFlowGroupIn, DestroyFlowTableIn, FlowTablePropLayout, FteMatchParam,
    QueryFlowTableIn, QueryFlowTableOut, QueryFteIn, QueryFteOut, SetFlowTableRootIn, SetFteIn,
    flow_action, flow_context, flow_destination_type, flow_table_miss_action, flow_table_type,
    match_criteria, query_flow_table_out, query_fte_out, set_fte_in,
};

use super::{Outcome, refuse};
use crate::firmware::syndrome as syn;

/// Bytes of an `fte_match_param`.
const MATCH_BYTES: usize = FteMatchParam::<&[u8]>::SIZE_BYTES;
/// Bytes of one destination list element.
const DEST_BYTES: usize = 16;
/// The criteria sets the port parses.
const SUPPORTED_SETS: u32 = match_criteria::OUTER_HEADERS | match_criteria::MISC_PARAMETERS_3;

/// A destination of a forwarding entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dest {
    /// A TIR: the frame is received on its RQ.
    Tir(u32),
    /// Another flow table (of a higher level).
    Table(u32),
}

/// What the flow tables decided for a frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Forward to these TIRs; the deciding entry's `flow_tag`.
    Forward { tirs: Vec<u32>, flow_tag: u32 },
    /// An entry dropped it.
    Drop,
    /// No root table, or no entry matched.
    NoRule,
}

#[derive(Debug)]
struct Group {
    start: u32,
    end: u32,
    /// `match_criteria` (512 bytes).
    mask: Vec<u8>,
    /// Masked value → flow index.
    values: HashMap<Vec<u8>, u32>,
}

#[derive(Debug)]
struct Entry {
    group: u32,
    value: Vec<u8>,
    action: u32,
    dests: Vec<Dest>,
    flow_tag: u32,
    /// The flow context with its destination list, as set (QUERY_FLOW_TABLE_ENTRY).
    ctx: Vec<u8>,
}

#[derive(Debug)]
struct Table {
    level: u32,
    log_size: u32,
    /// The `flow_table_context` as created.
    ctx: Vec<u8>,
    groups: BTreeMap<u32, Group>,
    entries: BTreeMap<u32, Entry>,
}

/// The flow tables of the function.
#[derive(Debug, Default)]
pub(crate) struct Steering {
    tables: BTreeMap<u32, Table>,
    root: Option<u32>,
    next_group: u32,
}

fn param(s: u32) -> Outcome {
    refuse(CmdStatus::BadParam, s)
}

/// The fields of an `fte_match_param` the port can match: all ones where
/// [`crate::eth::match_key`] fills something.
fn supported_mask() -> Vec<u8> {
    let mut m = vec![0u8; MATCH_BYTES];
    let mut p = FteMatchParam::new_unchecked(&mut m[..]);
    {
        let mut o = p.outer_headers_mut();
        let _ = o.set_smac_47_16(u32::MAX);
        let _ = o.set_smac_15_0(0xffff);
        let _ = o.set_dmac_47_16(u32::MAX);
        let _ = o.set_dmac_15_0(0xffff);
        let _ = o.set_ethertype(0xffff);
        let _ = o.set_cvlan_tag(1);
        let _ = o.set_first_prio(7);
        let _ = o.set_first_cfi(1);
        let _ = o.set_first_vid(0xfff);
        let _ = o.set_ip_version(0xf);
        let _ = o.set_ip_protocol(0xff);
        let _ = o.set_ip_dscp(0x3f);
        let _ = o.set_ip_ecn(3);
        let _ = o.set_ttl_hoplimit(0xff);
        let _ = o.set_frag(1);
        let _ = o.set_src_ipv4_src_ipv6(&[0xff; 16]);
        let _ = o.set_dst_ipv4_dst_ipv6(&[0xff; 16]);
        let _ = o.set_udp_sport(0xffff);
        let _ = o.set_udp_dport(0xffff);
        let _ = o.set_tcp_sport(0xffff);
        let _ = o.set_tcp_dport(0xffff);
        let _ = o.set_tcp_flags(0x1ff);
    }
    let mut m3 = p.misc_parameters_3_mut();
    let _ = m3.set_icmp_type(0xff);
    let _ = m3.set_icmp_code(0xff);
    let _ = m3.set_icmp_header_data(u32::MAX);
    let _ = m3.set_icmpv6_type(0xff);
    let _ = m3.set_icmpv6_code(0xff);
    let _ = m3.set_icmpv6_header_data(u32::MAX);
    m
}

/// The byte range of each criteria set in an `fte_match_param`, by its enable bit.
fn set_ranges() -> [(u32, std::ops::Range<usize>); 7] {
    use rnic_mlx5_prm::fte_match_param as f;
    let r = |l: rnic_mlx5_prm::FieldLayout| l.byte_offset()..l.byte_offset() + l.byte_len();
    [
        (match_criteria::OUTER_HEADERS, r(f::outer_headers)),
        (match_criteria::MISC_PARAMETERS, r(f::misc_parameters)),
        (match_criteria::INNER_HEADERS, r(f::inner_headers)),
        (match_criteria::MISC_PARAMETERS_2, r(f::misc_parameters_2)),
        (match_criteria::MISC_PARAMETERS_3, r(f::misc_parameters_3)),
        (match_criteria::MISC_PARAMETERS_4, r(f::misc_parameters_4)),
        (match_criteria::MISC_PARAMETERS_5, r(f::misc_parameters_5)),
    ]
}

fn masked(key: &[u8], mask: &[u8]) -> Vec<u8> {
    key.iter().zip(mask).map(|(k, m)| k & m).collect()
}

/// The common header of every flow command: the NIC RX type, this vport.
fn common(table_type: u32, other_vport: u32, vport: u32, other_esw: u32, owner: u32) -> Outcome {
    if table_type != flow_table_type::NIC_RX {
        return param(syn::FLOW_TABLE_TYPE);
    }
    if other_vport != 0 || vport != 0 || other_esw != 0 || owner != 0 {
        return param(syn::FLOW_VPORT);
    }
    Ok(())
}

impl Steering {
    /// Tables, groups and entries alive.
    pub(crate) fn objects(&self) -> usize {
        self.tables
            .values()
            .map(|t| 1 + t.groups.len() + t.entries.len())
            .sum()
    }

    /// Host bytes the tables hold.
    pub(crate) fn bytes(&self) -> usize {
        self.tables
            .values()
            .map(|t| {
                t.ctx.len()
                    + t.groups
                        .values()
                        .map(|g| g.mask.len() * (1 + g.values.len()))
                        .sum::<usize>()
                    + t.entries
                        .values()
                        .map(|e| e.ctx.len() + e.value.len())
                        .sum::<usize>()
            })
            .sum()
    }

    /// Whether an entry forwards to TIR `tirn`.
    pub(crate) fn uses_tir(&self, tirn: u32) -> bool {
        self.tables
            .values()
            .flat_map(|t| t.entries.values())
            .any(|e| e.dests.contains(&Dest::Tir(tirn)))
    }

    /// CREATE_FLOW_TABLE.
    pub(crate) fn create_table(
        &mut self,
        props: &FlowTablePropLayout<&[u8]>,
        input: &[u8],
        out: &mut [u8],
    ) -> Outcome {
        let v = CreateFlowTableIn::new_unchecked(input);
        common(
            v.table_type(),
            v.other_vport(),
            v.vport_number(),
            v.other_eswitch(),
            v.eswitch_owner_vhca_id(),
        )?;
        let c = v.flow_table_context();
        if c.reformat_en() != 0
            || c.decap_en() != 0
            || c.sw_owner() != 0
            || c.termination_table() != 0
            || c.rtc_valid() != 0
            || c.table_miss_action() != flow_table_miss_action::DEFAULT
            || c.table_miss_id() != 0
            || c.lag_master_next_table_id() != 0
        {
            return param(syn::FLOW_TABLE_CONTEXT);
        }
        if c.level() > props.max_ft_level() {
            return param(syn::FLOW_TABLE_LEVEL);
        }
        if c.log_size() > props.log_max_ft_size() {
            return param(syn::FLOW_TABLE_SIZE);
        }
        if self.tables.len() as u64 >= 1u64 << props.log_max_ft_num().min(24) {
            return refuse(CmdStatus::NoRes, syn::FLOW_TABLE_EXHAUSTED);
        }
        let Some(id) = (1u32..1 << 24).find(|n| !self.tables.contains_key(n)) else {
            return refuse(CmdStatus::NoRes, syn::FLOW_TABLE_EXHAUSTED);
        };
        let at = rnic_mlx5_prm::create_flow_table_in::flow_table_context;
        let ctx = input
            .get(at.byte_offset()..at.byte_offset() + at.byte_len())
            .unwrap_or(&[])
            .to_vec();
        self.tables.insert(
            id,
            Table {
                level: c.level(),
                log_size: c.log_size(),
                ctx,
                groups: BTreeMap::new(),
                entries: BTreeMap::new(),
            },
        );
        let _ = CreateFlowTableOut::new_unchecked(out).set_table_id(id);
        tracing::debug!(
            id,
            level = c.level(),
            log_size = c.log_size(),
            "CREATE_FLOW_TABLE"
        );
        Ok(())
    }

    /// DESTROY_FLOW_TABLE.
    pub(crate) fn destroy_table(&mut self, input: &[u8]) -> Outcome {
        let v = DestroyFlowTableIn::new_unchecked(input);
        common(
            v.table_type(),
            v.other_vport(),
            v.vport_number(),
            v.other_eswitch(),
            v.eswitch_owner_vhca_id(),
        )?;
        let id = v.table_id();
        let Some(t) = self.tables.get(&id) else {
            return refuse(CmdStatus::BadRes, syn::FLOW_TABLE_NOT_FOUND);
        };
        if self.root == Some(id) {
            return refuse(CmdStatus::BadResState, syn::FLOW_TABLE_IS_ROOT);
        }
        if !t.groups.is_empty() {
            return refuse(CmdStatus::BadResState, syn::FLOW_TABLE_HAS_GROUPS);
        }
        let referenced = self
            .tables
            .values()
            .flat_map(|t| t.entries.values())
            .any(|e| e.dests.contains(&Dest::Table(id)));
        if referenced {
            return refuse(CmdStatus::BadResState, syn::FLOW_TABLE_IN_USE);
        }
        self.tables.remove(&id);
        Ok(())
    }

    /// QUERY_FLOW_TABLE.
    pub(crate) fn query_table(&self, input: &[u8], out: &mut [u8]) -> Outcome {
        let v = QueryFlowTableIn::new_unchecked(input);
        common(v.table_type(), 0, 0, 0, 0)?;
        let Some(t) = self.tables.get(&v.table_id()) else {
            return refuse(CmdStatus::BadRes, syn::FLOW_TABLE_NOT_FOUND);
        };
        let at = query_flow_table_out::flow_table_context.byte_offset();
        if let Some(d) = out.get_mut(at..at + t.ctx.len()) {
            d.copy_from_slice(&t.ctx);
        }
        let _ = QueryFlowTableOut::new_unchecked(out);
        Ok(())
    }

    /// CREATE_FLOW_GROUP.
    pub(crate) fn create_group(&mut self, input: &[u8], out: &mut [u8]) -> Outcome {
        let v = CreateFlowGroupIn::new_unchecked(input);
        common(
            v.table_type(),
            v.other_vport(),
            v.vport_number(),
            v.other_eswitch(),
            v.eswitch_owner_vhca_id(),
        )?;
        if v.group_type() != 0
            || v.match_definer_id() != 0
            || v.source_eswitch_owner_vhca_id_valid() != 0
        {
            return param(syn::FLOW_GROUP_TYPE);
        }
        let Some(t) = self.tables.get(&v.table_id()) else {
            return refuse(CmdStatus::BadRes, syn::FLOW_TABLE_NOT_FOUND);
        };
        let (start, end) = (v.start_flow_index(), v.end_flow_index());
        if start > end || u64::from(end) >= 1u64 << t.log_size {
            return param(syn::FLOW_GROUP_RANGE);
        }
        if t.groups.values().any(|g| start <= g.end && g.start <= end) {
            return param(syn::FLOW_GROUP_OVERLAP);
        }
        let enable = v.match_criteria_enable();
        if enable & !SUPPORTED_SETS != 0 {
            return param(syn::FLOW_CRITERIA_UNSUPPORTED);
        }
        let at = rnic_mlx5_prm::create_flow_group_in::match_criteria.byte_offset();
        let mut mask = vec![0u8; MATCH_BYTES];
        if let Some(s) = input.get(at..at + MATCH_BYTES) {
            mask.copy_from_slice(s);
        }
        for (bit, range) in set_ranges() {
            if enable & bit == 0 && mask[range].iter().any(|&b| b != 0) {
                return param(syn::FLOW_CRITERIA_NOT_ENABLED);
            }
        }
        let supported = supported_mask();
        if mask.iter().zip(&supported).any(|(m, s)| m & !s != 0) {
            return param(syn::FLOW_CRITERIA_UNSUPPORTED);
        }
        self.next_group = self.next_group.wrapping_add(1).max(1);
        let id = self.next_group;
        let table = v.table_id();
        if let Some(t) = self.tables.get_mut(&table) {
            t.groups.insert(
                id,
                Group {
                    start,
                    end,
                    mask,
                    values: HashMap::new(),
                },
            );
        }
        let _ = CreateFlowGroupOut::new_unchecked(out).set_group_id(id);
        tracing::debug!(table, id, start, end, enable, "CREATE_FLOW_GROUP");
        Ok(())
    }

    /// DESTROY_FLOW_GROUP.
    pub(crate) fn destroy_group(&mut self, input: &[u8]) -> Outcome {
        let v = DestroyFlowGroupIn::new_unchecked(input);
        common(
            v.table_type(),
            v.other_vport(),
            v.vport_number(),
            v.other_eswitch(),
            v.eswitch_owner_vhca_id(),
        )?;
        let Some(t) = self.tables.get_mut(&v.table_id()) else {
            return refuse(CmdStatus::BadRes, syn::FLOW_TABLE_NOT_FOUND);
        };
        let Some(g) = t.groups.get(&v.group_id()) else {
            return refuse(CmdStatus::BadRes, syn::FLOW_GROUP_NOT_FOUND);
        };
        if !g.values.is_empty() {
            return refuse(CmdStatus::BadResState, syn::FLOW_GROUP_HAS_ENTRIES);
        }
        t.groups.remove(&v.group_id());
        Ok(())
    }

    /// SET_FLOW_TABLE_ENTRY (a new entry; `tir_exists` says which TIRs exist).
    pub(crate) fn set_entry(
        &mut self,
        props: &FlowTablePropLayout<&[u8]>,
        tir_exists: impl Fn(u32) -> bool,
        input: &[u8],
    ) -> Outcome {
        let v = SetFteIn::new_unchecked(input);
        common(
            v.table_type(),
            v.other_vport(),
            v.vport_number(),
            v.other_eswitch(),
            v.eswitch_owner_vhca_id(),
        )?;
        if v.op_mod() != 0 || v.modify_enable_mask() != 0 {
            return param(syn::FLOW_ENTRY_OP_MOD);
        }
        if v.ignore_flow_level() != 0 {
            return param(syn::FLOW_ENTRY_CONTEXT);
        }
        let table_id = v.table_id();
        let Some(t) = self.tables.get(&table_id) else {
            return refuse(CmdStatus::BadRes, syn::FLOW_TABLE_NOT_FOUND);
        };
        let fc = v.flow_context();
        let index = v.flow_index();
        let group_id = fc.group_id();
        let Some(g) = t.groups.get(&group_id) else {
            return refuse(CmdStatus::BadRes, syn::FLOW_GROUP_NOT_FOUND);
        };
        if index < g.start || index > g.end {
            return param(syn::FLOW_INDEX);
        }
        if t.entries.contains_key(&index) {
            return param(syn::FLOW_ENTRY_EXISTS);
        }
        if fc.push_vlan() != 0
            || fc.extended_destination() != 0
            || fc.uplink_hairpin_en() != 0
            || fc.flow_source() != 0
            || fc.encrypt_decrypt_type() != 0
            || fc.packet_reformat_id() != 0
            || fc.modify_header_id() != 0
        {
            return param(syn::FLOW_ENTRY_CONTEXT);
        }
        let action = fc.action();
        let (ndest, ncount) = (fc.destination_list_size(), fc.flow_counter_list_size());
        if action != flow_action::FWD_DEST && action != flow_action::DROP || ncount != 0 {
            return param(syn::FLOW_ACTION);
        }
        let max_dest = 1u64 << props.log_max_destination().min(24);
        let fwd = action == flow_action::FWD_DEST;
        if (fwd && (ndest == 0 || u64::from(ndest) > max_dest)) || (!fwd && ndest != 0) {
            return param(syn::FLOW_DEST_COUNT);
        }
        let dest_at =
            set_fte_in::flow_context.byte_offset() + flow_context::destination.byte_offset();
        if input.len() < dest_at + ndest as usize * DEST_BYTES {
            return refuse(CmdStatus::BadInpLen, syn::FLOW_DEST_LENGTH);
        }
        let mut dests = Vec::with_capacity(ndest as usize);
        for i in 0..ndest as usize {
            let Some(d) = fc.destination(i) else {
                return refuse(CmdStatus::BadInpLen, syn::FLOW_DEST_LENGTH);
            };
            let e = d.destination_entry();
            if e.destination_eswitch_owner_vhca_id_valid() != 0
                || e.packet_reformat() != 0
                || e.destination_eswitch_owner_vhca_id() != 0
                || d.packet_reformat_id() != 0
            {
                return param(syn::FLOW_DEST_TYPE);
            }
            let id = e.destination_id();
            let dest = match e.destination_type() {
                flow_destination_type::TIR => {
                    if !tir_exists(id) {
                        return refuse(CmdStatus::BadRes, syn::FLOW_DEST_TIR);
                    }
                    Dest::Tir(id)
                }
                flow_destination_type::FLOW_TABLE => {
                    match self.tables.get(&id) {
                        Some(to) if to.level > t.level => {}
                        _ => return param(syn::FLOW_DEST_TABLE),
                    }
                    Dest::Table(id)
                }
                _ => return param(syn::FLOW_DEST_TYPE),
            };
            dests.push(dest);
        }
        let mv_at =
            set_fte_in::flow_context.byte_offset() + flow_context::match_value.byte_offset();
        let mut value = vec![0u8; MATCH_BYTES];
        if let Some(s) = input.get(mv_at..mv_at + MATCH_BYTES) {
            value.copy_from_slice(s);
        }
        if value.iter().zip(&g.mask).any(|(v, m)| v & !m != 0) {
            return param(syn::FLOW_VALUE_OUTSIDE_MASK);
        }
        if g.values.contains_key(&value) {
            return param(syn::FLOW_ENTRY_DUPLICATE);
        }
        let ctx_at = set_fte_in::flow_context.byte_offset();
        let ctx = input
            .get(ctx_at..dest_at + ndest as usize * DEST_BYTES)
            .unwrap_or(&[])
            .to_vec();
        let flow_tag = fc.flow_tag();
        let Some(t) = self.tables.get_mut(&table_id) else {
            return refuse(CmdStatus::BadRes, syn::FLOW_TABLE_NOT_FOUND);
        };
        if let Some(g) = t.groups.get_mut(&group_id) {
            g.values.insert(value.clone(), index);
        }
        t.entries.insert(
            index,
            Entry {
                group: group_id,
                value,
                action,
                dests,
                flow_tag,
                ctx,
            },
        );
        tracing::debug!(
            table = table_id,
            index,
            group = group_id,
            action,
            "SET_FLOW_TABLE_ENTRY"
        );
        Ok(())
    }

    /// DELETE_FLOW_TABLE_ENTRY.
    pub(crate) fn delete_entry(&mut self, input: &[u8]) -> Outcome {
        let v = DeleteFteIn::new_unchecked(input);
        common(
            v.table_type(),
            v.other_vport(),
            v.vport_number(),
            v.other_eswitch(),
            v.eswitch_owner_vhca_id(),
        )?;
        let Some(t) = self.tables.get_mut(&v.table_id()) else {
            return refuse(CmdStatus::BadRes, syn::FLOW_TABLE_NOT_FOUND);
        };
        let Some(e) = t.entries.remove(&v.flow_index()) else {
            return refuse(CmdStatus::BadRes, syn::FLOW_ENTRY_NOT_FOUND);
        };
        if let Some(g) = t.groups.get_mut(&e.group) {
            g.values.remove(&e.value);
        }
        Ok(())
    }

    /// QUERY_FLOW_TABLE_ENTRY (the flow context and destinations as set; the rest of the
    /// output zero).
    pub(crate) fn query_entry(&self, input: &[u8], out: &mut [u8]) -> Outcome {
        let v = QueryFteIn::new_unchecked(input);
        common(v.table_type(), 0, 0, 0, 0)?;
        let Some(t) = self.tables.get(&v.table_id()) else {
            return refuse(CmdStatus::BadRes, syn::FLOW_TABLE_NOT_FOUND);
        };
        let Some(e) = t.entries.get(&v.flow_index()) else {
            return refuse(CmdStatus::BadRes, syn::FLOW_ENTRY_NOT_FOUND);
        };
        let at = query_fte_out::flow_context.byte_offset();
        // The output holds the context and as many destinations as `outlen` allows.
        let n = e.ctx.len().min(out.len().saturating_sub(at));
        if let (Some(d), Some(s)) = (out.get_mut(at..at + n), e.ctx.get(..n)) {
            d.copy_from_slice(s);
        }
        let _ = QueryFteOut::new_unchecked(out);
        Ok(())
    }

    /// SET_FLOW_TABLE_ROOT: `op_mod` 0 makes `table_id` the root, 1 disconnects the root
    /// (cap `reset_root_to_default`).
    pub(crate) fn set_root(&mut self, input: &[u8]) -> Outcome {
        let v = SetFlowTableRootIn::new_unchecked(input);
        common(
            v.table_type(),
            v.other_vport(),
            v.vport_number(),
            v.other_eswitch(),
            v.eswitch_owner_vhca_id(),
        )?;
        if v.underlay_qpn() != 0
            || v.table_of_other_vport() != 0
            || v.table_vport_number() != 0
            || v.table_eswitch_owner_vhca_id_valid() != 0
            || v.table_eswitch_owner_vhca_id() != 0
        {
            return param(syn::FLOW_ROOT_OP_MOD);
        }
        match v.op_mod() {
            0 => {
                let id = v.table_id();
                if !self.tables.contains_key(&id) {
                    return refuse(CmdStatus::BadRes, syn::FLOW_TABLE_NOT_FOUND);
                }
                self.root = Some(id);
                tracing::debug!(id, "SET_FLOW_TABLE_ROOT");
                Ok(())
            }
            1 => {
                if v.table_id() != 0 {
                    return param(syn::FLOW_ROOT_OP_MOD);
                }
                self.root = None;
                Ok(())
            }
            _ => param(syn::FLOW_ROOT_OP_MOD),
        }
    }

    /// What the tables decide for a frame whose match key is `key`.
    pub(crate) fn lookup(&self, key: &[u8]) -> Verdict {
        let Some(mut id) = self.root else {
            return Verdict::NoRule;
        };
        let mut tirs = Vec::new();
        let mut flow_tag = 0;
        // Each hop goes to a higher level: at most one hop per table.
        for _ in 0..=self.tables.len() {
            let Some(t) = self.tables.get(&id) else {
                break;
            };
            let mut groups: Vec<&Group> = t.groups.values().collect();
            groups.sort_by_key(|g| g.start);
            let hit = groups
                .iter()
                .find_map(|g| g.values.get(&masked(key, &g.mask)))
                .and_then(|i| t.entries.get(i));
            let Some(e) = hit else {
                break;
            };
            if e.action == flow_action::DROP {
                return Verdict::Drop;
            }
            flow_tag = e.flow_tag;
            let mut next = None;
            for d in &e.dests {
                match *d {
                    Dest::Tir(n) => tirs.push(n),
                    Dest::Table(n) => next = next.or(Some(n)),
                }
            }
            match next {
                Some(n) => id = n,
                None => break,
            }
        }
        if tirs.is_empty() {
            Verdict::NoRule
        } else {
            Verdict::Forward { tirs, flow_tag }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rnic_mlx5_prm::{
        CmdOpcode, MboxIn, create_flow_group_in, create_flow_group_out, create_flow_table_out,
        set_fte_in,
    };

    fn props() -> Vec<u8> {
        let mut p = vec![0u8; FlowTablePropLayout::<&[u8]>::SIZE_BYTES];
        let mut v = FlowTablePropLayout::new_unchecked(&mut p[..]);
        v.set_ft_support(1).unwrap();
        v.set_max_ft_level(4).unwrap();
        v.set_log_max_ft_size(8).unwrap();
        v.set_log_max_ft_num(2).unwrap();
        v.set_log_max_destination(1).unwrap();
        p
    }

    fn cmd(op: CmdOpcode, len: usize) -> Vec<u8> {
        let mut b = vec![0u8; len];
        MboxIn::new_unchecked(&mut b[..])
            .set_opcode(op.as_raw().into())
            .unwrap();
        b
    }

    fn table(s: &mut Steering, level: u32, log_size: u32) -> Result<u32, u32> {
        let p = props();
        let mut c = cmd(CmdOpcode::CreateFlowTable, 0x40);
        let mut v = CreateFlowTableIn::new_unchecked(&mut c[..]);
        v.flow_table_context_mut().set_level(level).unwrap();
        v.flow_table_context_mut().set_log_size(log_size).unwrap();
        let mut out = vec![0u8; 0x10];
        s.create_table(&FlowTablePropLayout::new_unchecked(&p[..]), &c, &mut out)
            .map_err(|r| r.syndrome)?;
        Ok(create_flow_table_out::table_id
            .extract(u32::from_be_bytes([out[8], out[9], out[10], out[11]])))
    }

    fn group(
        s: &mut Steering,
        table: u32,
        range: (u32, u32),
        f: impl FnOnce(&mut FteMatchParam<&mut [u8]>),
    ) -> Result<u32, u32> {
        let mut c = cmd(CmdOpcode::CreateFlowGroup, create_flow_group_in::SIZE_BYTES);
        let mut v = CreateFlowGroupIn::new_unchecked(&mut c[..]);
        v.set_table_id(table).unwrap();
        v.set_start_flow_index(range.0).unwrap();
        v.set_end_flow_index(range.1).unwrap();
        v.set_match_criteria_enable(SUPPORTED_SETS).unwrap();
        f(&mut v.match_criteria_mut());
        let mut out = vec![0u8; 0x10];
        s.create_group(&c, &mut out).map_err(|r| r.syndrome)?;
        Ok(create_flow_group_out::group_id
            .extract(u32::from_be_bytes([out[8], out[9], out[10], out[11]])))
    }

    fn entry(
        s: &mut Steering,
        table: u32,
        group: u32,
        index: u32,
        ethertype: u32,
        dests: &[(u32, u32)],
    ) -> Result<(), u32> {
        let p = props();
        let mut c = cmd(
            CmdOpcode::SetFlowTableEntry,
            set_fte_in::SIZE_BYTES + 16 * dests.len(),
        );
        let mut v = SetFteIn::new_unchecked(&mut c[..]);
        v.set_table_id(table).unwrap();
        v.set_flow_index(index).unwrap();
        let mut fc = v.flow_context_mut();
        fc.set_group_id(group).unwrap();
        fc.set_action(flow_action::FWD_DEST).unwrap();
        fc.set_destination_list_size(dests.len() as u32).unwrap();
        fc.match_value_mut()
            .outer_headers_mut()
            .set_ethertype(ethertype)
            .unwrap();
        for (i, (ty, id)) in dests.iter().enumerate() {
            let mut d = fc.destination_mut(i).unwrap();
            d.destination_entry_mut().set_destination_type(*ty).unwrap();
            d.destination_entry_mut().set_destination_id(*id).unwrap();
        }
        s.set_entry(&FlowTablePropLayout::new_unchecked(&p[..]), |t| t == 9, &c)
            .map_err(|r| r.syndrome)
    }

    fn key(ethertype: u32) -> Vec<u8> {
        let mut k = vec![0u8; MATCH_BYTES];
        FteMatchParam::new_unchecked(&mut k[..])
            .outer_headers_mut()
            .set_ethertype(ethertype)
            .unwrap();
        k
    }

    #[test]
    fn rules_steer_and_refusals_change_nothing() {
        let mut s = Steering::default();
        let t0 = table(&mut s, 0, 2).unwrap();
        let t1 = table(&mut s, 1, 1).unwrap();
        assert_eq!(table(&mut s, 5, 1), Err(syn::FLOW_TABLE_LEVEL));
        assert_eq!(table(&mut s, 0, 9), Err(syn::FLOW_TABLE_SIZE));
        let g = group(&mut s, t0, (0, 1), |m| {
            m.outer_headers_mut().set_ethertype(0xffff).unwrap()
        })
        .unwrap();
        assert_eq!(
            group(&mut s, t0, (1, 2), |_| {}),
            Err(syn::FLOW_GROUP_OVERLAP)
        );
        assert_eq!(
            group(&mut s, t0, (2, 4), |_| {}),
            Err(syn::FLOW_GROUP_RANGE)
        );
        assert_eq!(
            group(&mut s, t0, (2, 3), |m| m
                .misc_parameters_mut()
                .set_source_port(1)
                .unwrap()),
            Err(syn::FLOW_CRITERIA_NOT_ENABLED)
        );
        let g1 = group(&mut s, t1, (0, 1), |m| {
            m.outer_headers_mut().set_ethertype(0xffff).unwrap()
        })
        .unwrap();
        entry(&mut s, t0, g, 0, 0x0806, &[(flow_destination_type::TIR, 9)]).unwrap();
        assert_eq!(
            entry(&mut s, t0, g, 0, 0x86dd, &[(2, 9)]),
            Err(syn::FLOW_ENTRY_EXISTS)
        );
        assert_eq!(
            entry(&mut s, t0, g, 1, 0x0806, &[(2, 9)]),
            Err(syn::FLOW_ENTRY_DUPLICATE)
        );
        assert_eq!(
            entry(&mut s, t0, g, 2, 0x86dd, &[(2, 9)]),
            Err(syn::FLOW_INDEX)
        );
        assert_eq!(
            entry(&mut s, t0, g, 1, 0x86dd, &[(2, 8)]),
            Err(syn::FLOW_DEST_TIR)
        );
        assert_eq!(
            entry(&mut s, t0, g, 1, 0x86dd, &[]),
            Err(syn::FLOW_DEST_COUNT)
        );
        assert_eq!(
            entry(&mut s, t0, g, 1, 0x86dd, &[(2, 9); 3]),
            Err(syn::FLOW_DEST_COUNT)
        );
        assert_eq!(
            entry(&mut s, t1, g1, 0, 0x86dd, &[(1, t0)]),
            Err(syn::FLOW_DEST_TABLE),
            "lower level"
        );
        entry(&mut s, t0, g, 1, 0x86dd, &[(1, t1)]).unwrap();
        entry(&mut s, t1, g1, 0, 0x86dd, &[(2, 9)]).unwrap();
        // No root yet: nothing is delivered.
        assert_eq!(s.lookup(&key(0x0806)), Verdict::NoRule);
        let mut root = cmd(CmdOpcode::SetFlowTableRoot, 0x40);
        SetFlowTableRootIn::new_unchecked(&mut root[..])
            .set_table_id(t0)
            .unwrap();
        s.set_root(&root).unwrap();
        assert_eq!(
            s.lookup(&key(0x0806)),
            Verdict::Forward {
                tirs: vec![9],
                flow_tag: 0
            }
        );
        assert_eq!(
            s.lookup(&key(0x86dd)),
            Verdict::Forward {
                tirs: vec![9],
                flow_tag: 0
            },
            "via t1"
        );
        assert_eq!(s.lookup(&key(0x0800)), Verdict::NoRule);
        assert!(s.uses_tir(9));
        // In use: nothing destroyed.
        let mut d = cmd(CmdOpcode::DestroyFlowTable, 0x40);
        DestroyFlowTableIn::new_unchecked(&mut d[..])
            .set_table_id(t1)
            .unwrap();
        assert_eq!(
            s.destroy_table(&d).unwrap_err().syndrome,
            syn::FLOW_TABLE_HAS_GROUPS
        );
        DestroyFlowTableIn::new_unchecked(&mut d[..])
            .set_table_id(t0)
            .unwrap();
        assert_eq!(
            s.destroy_table(&d).unwrap_err().syndrome,
            syn::FLOW_TABLE_IS_ROOT
        );
        assert_eq!(s.objects(), 2 + 2 + 3);
        assert_eq!(
            s.lookup(&key(0x86dd)),
            Verdict::Forward {
                tirs: vec![9],
                flow_tag: 0
            }
        );
    }
}
