//! The NIC RX flow table that steers ARP and IPv6 neighbour discovery to
//! the port's TIR (K fs_cmd.c issues the same four commands for a netdev's
//! tables): one table at level 0 made the root of NIC receive, two groups —
//! by EtherType; by EtherType, IP protocol and ICMPv6 type — and one entry
//! per frame kind, each forwarding to the TIR. Everything else the port
//! receives that is not RoCE misses the table and is dropped by the device.

use std::sync::Arc;

use rnic_mlx5_prm::{
    CmdOpcode, CreateFlowGroupIn, CreateFlowGroupOut, CreateFlowTableIn, CreateFlowTableOut,
    DeleteFteIn, DestroyFlowGroupIn, DestroyFlowTableIn, FteMatchParam, SetFlowTableRootIn,
    SetFteIn, flow_action, flow_destination_type, flow_table_type, match_criteria,
};
use tracing::{debug, warn};

use crate::{Hca, Mlx5Error};

fn prm(what: &'static str) -> impl Fn(rnic_mlx5_prm::Error) -> Mlx5Error {
    move |source| Mlx5Error::Prm { what, source }
}

/// EtherType of ARP.
pub const ETHERTYPE_ARP: u16 = 0x0806;
/// EtherType of IPv6.
pub const ETHERTYPE_IPV6: u16 = 0x86dd;
/// IP protocol number of ICMPv6.
pub const IPPROTO_ICMPV6: u8 = 58;
/// The ICMPv6 types of neighbour discovery (RFC 4861 §4: router
/// solicitation and advertisement, neighbour solicitation and
/// advertisement, redirect).
pub const ND_TYPES: [u8; 5] = [133, 134, 135, 136, 137];

/// What a rule matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rule {
    /// Every frame of this EtherType.
    EtherType(u16),
    /// IPv6, ICMPv6 of this type.
    Icmpv6(u8),
}

/// The installed table, groups and entries; removed in reverse on drop.
#[derive(Debug)]
pub struct FlowRules {
    hca: Arc<Hca>,
    table: u32,
    groups: Vec<u32>,
    entries: Vec<u32>,
    root: bool,
}

impl FlowRules {
    /// Install the rules that deliver ARP and neighbour discovery to
    /// `tirn`, and make the table the root of NIC receive.
    pub fn new(hca: &Arc<Hca>, tirn: u32) -> Result<FlowRules, Mlx5Error> {
        let mut cmd = vec![0u8; CreateFlowTableIn::<&[u8]>::SIZE_BYTES];
        CreateFlowTableIn::new_checked(&mut cmd[..])
            .and_then(|mut v| {
                v.set_table_type(flow_table_type::NIC_RX)?;
                let mut c = v.flow_table_context_mut();
                c.set_level(0)?;
                // 8 entries: ARP and five ICMPv6 types.
                c.set_log_size(3)
            })
            .map_err(prm("CREATE_FLOW_TABLE"))?;
        let out = hca.exec(
            CmdOpcode::CreateFlowTable,
            0,
            &cmd,
            CreateFlowTableOut::<&[u8]>::SIZE_BYTES,
        )?;
        let table = CreateFlowTableOut::new_checked(&out[..])
            .map_err(prm("CREATE_FLOW_TABLE"))?
            .table_id();
        let mut rules = FlowRules {
            hca: hca.clone(),
            table,
            groups: Vec::new(),
            entries: Vec::new(),
            root: false,
        };
        // Group 0 (index 0): by EtherType.
        rules.group(0, 1, match_criteria::OUTER_HEADERS, |m| {
            m.outer_headers_mut().set_ethertype(0xffff)
        })?;
        // Group 1 (indices 1..=5): EtherType, IP protocol, ICMPv6 type.
        rules.group(
            1,
            ND_TYPES.len() as u32,
            match_criteria::OUTER_HEADERS | match_criteria::MISC_PARAMETERS_3,
            |m| {
                let mut o = m.outer_headers_mut();
                o.set_ethertype(0xffff)?;
                o.set_ip_protocol(0xff)?;
                m.misc_parameters_3_mut().set_icmpv6_type(0xff)
            },
        )?;
        rules.entry(0, rules.groups[0], Rule::EtherType(ETHERTYPE_ARP), tirn)?;
        for (i, t) in ND_TYPES.iter().enumerate() {
            rules.entry(1 + i as u32, rules.groups[1], Rule::Icmpv6(*t), tirn)?;
        }
        let mut cmd = vec![0u8; SetFlowTableRootIn::<&[u8]>::SIZE_BYTES];
        SetFlowTableRootIn::new_checked(&mut cmd[..])
            .and_then(|mut v| {
                v.set_table_type(flow_table_type::NIC_RX)?;
                v.set_table_id(table)
            })
            .map_err(prm("SET_FLOW_TABLE_ROOT"))?;
        hca.exec(CmdOpcode::SetFlowTableRoot, 0, &cmd, 16)?;
        rules.root = true;
        debug!(
            table,
            tirn, "NIC RX root table steers ARP and ND to the port"
        );
        Ok(rules)
    }

    /// The table's id.
    pub fn table(&self) -> u32 {
        self.table
    }

    fn group(
        &mut self,
        start: u32,
        len: u32,
        criteria: u32,
        mask: impl FnOnce(&mut FteMatchParam<&mut [u8]>) -> Result<(), rnic_mlx5_prm::Error>,
    ) -> Result<(), Mlx5Error> {
        let mut cmd = vec![0u8; CreateFlowGroupIn::<&[u8]>::SIZE_BYTES];
        CreateFlowGroupIn::new_checked(&mut cmd[..])
            .and_then(|mut v| {
                v.set_table_type(flow_table_type::NIC_RX)?;
                v.set_table_id(self.table)?;
                v.set_start_flow_index(start)?;
                v.set_end_flow_index(start + len - 1)?;
                v.set_match_criteria_enable(criteria)?;
                mask(&mut v.match_criteria_mut())
            })
            .map_err(prm("CREATE_FLOW_GROUP"))?;
        let out = self.hca.exec(
            CmdOpcode::CreateFlowGroup,
            0,
            &cmd,
            CreateFlowGroupOut::<&[u8]>::SIZE_BYTES,
        )?;
        let id = CreateFlowGroupOut::new_checked(&out[..])
            .map_err(prm("CREATE_FLOW_GROUP"))?
            .group_id();
        self.groups.push(id);
        Ok(())
    }

    fn entry(&mut self, index: u32, group: u32, rule: Rule, tirn: u32) -> Result<(), Mlx5Error> {
        let mut cmd = vec![0u8; SetFteIn::<&[u8]>::SIZE_BYTES + 16];
        SetFteIn::new_checked(&mut cmd[..])
            .and_then(|mut v| {
                v.set_table_type(flow_table_type::NIC_RX)?;
                v.set_table_id(self.table)?;
                v.set_flow_index(index)?;
                let mut c = v.flow_context_mut();
                c.set_group_id(group)?;
                c.set_action(flow_action::FWD_DEST)?;
                c.set_destination_list_size(1)?;
                {
                    let mut m = c.match_value_mut();
                    match rule {
                        Rule::EtherType(t) => m.outer_headers_mut().set_ethertype(t.into())?,
                        Rule::Icmpv6(t) => {
                            let mut o = m.outer_headers_mut();
                            o.set_ethertype(ETHERTYPE_IPV6.into())?;
                            o.set_ip_protocol(IPPROTO_ICMPV6.into())?;
                            m.misc_parameters_3_mut().set_icmpv6_type(t.into())?;
                        }
                    }
                }
                let mut d = c
                    .destination_mut(0)
                    .ok_or(rnic_mlx5_prm::Error::Truncated {
                        structure: "set_fte_in destination",
                        needed: 16,
                        got: 0,
                    })?;
                let mut e = d.destination_entry_mut();
                e.set_destination_type(flow_destination_type::TIR)?;
                e.set_destination_id(tirn)
            })
            .map_err(prm("SET_FLOW_TABLE_ENTRY"))?;
        self.hca.exec(CmdOpcode::SetFlowTableEntry, 0, &cmd, 16)?;
        self.entries.push(index);
        Ok(())
    }
}

impl Drop for FlowRules {
    fn drop(&mut self) {
        if self.hca.is_fatal() {
            return;
        }
        let hca = &self.hca;
        let run_mod = |opcode: CmdOpcode, op_mod: u16, cmd: &[u8]| {
            if let Err(e) = hca.exec(opcode, op_mod, cmd, 16) {
                warn!(%opcode, error = %e, "flow table teardown step failed");
            }
        };
        let run = |opcode: CmdOpcode, cmd: &[u8]| run_mod(opcode, 0, cmd);
        if self.root {
            // Disconnect (op_mod 1, table_id 0): the root back to the
            // vport's default, as the kernel's mlx5_cmd_update_root_ft does
            // before it destroys the last table of a namespace.
            let mut cmd = vec![0u8; SetFlowTableRootIn::<&[u8]>::SIZE_BYTES];
            if SetFlowTableRootIn::new_checked(&mut cmd[..])
                .and_then(|mut v| v.set_table_type(flow_table_type::NIC_RX))
                .is_ok()
            {
                run_mod(CmdOpcode::SetFlowTableRoot, 1, &cmd);
            }
        }
        for index in self.entries.drain(..).rev() {
            let mut cmd = vec![0u8; DeleteFteIn::<&[u8]>::SIZE_BYTES];
            if DeleteFteIn::new_checked(&mut cmd[..])
                .and_then(|mut v| {
                    v.set_table_type(flow_table_type::NIC_RX)?;
                    v.set_table_id(self.table)?;
                    v.set_flow_index(index)
                })
                .is_ok()
            {
                run(CmdOpcode::DeleteFlowTableEntry, &cmd);
            }
        }
        for group in self.groups.drain(..).rev() {
            let mut cmd = vec![0u8; DestroyFlowGroupIn::<&[u8]>::SIZE_BYTES];
            if DestroyFlowGroupIn::new_checked(&mut cmd[..])
                .and_then(|mut v| {
                    v.set_table_type(flow_table_type::NIC_RX)?;
                    v.set_table_id(self.table)?;
                    v.set_group_id(group)
                })
                .is_ok()
            {
                run(CmdOpcode::DestroyFlowGroup, &cmd);
            }
        }
        let mut cmd = vec![0u8; DestroyFlowTableIn::<&[u8]>::SIZE_BYTES];
        if DestroyFlowTableIn::new_checked(&mut cmd[..])
            .and_then(|mut v| {
                v.set_table_type(flow_table_type::NIC_RX)?;
                v.set_table_id(self.table)
            })
            .is_ok()
        {
            run(CmdOpcode::DestroyFlowTable, &cmd);
        }
    }
}
