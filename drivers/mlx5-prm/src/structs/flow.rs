//! NIC flow steering (opcodes and layouts from K `mlx5_ifc.h`): flow tables, flow groups
//! with their match criteria (`fte_match_param`: L2-L4 headers, misc, ICMP in set 3), flow
//! table entries forwarding to TIRs, the root of the NIC RX table type, the NIC flow table
//! capability page, and the vport counters.
//!
//! Received frames that are not RoCE start at the root NIC RX table; each table's groups
//! partition its entries, each group masks the packet with one `match_criteria`, and an
//! entry whose `match_value` equals the masked packet applies its `action` (forward to its
//! destinations: TIRs).

use super::*;

prm_struct! {
    /// Flow table context: `level` (tables chain to higher levels only), `log_size` (entries), what a miss does (`table_miss_action` 0 default: the next level, or the vport's default).
    pub struct FlowTableContext, mod flow_table_context = "flow_table_context", size_bits: 0x140, source: Source::Ifc;
    {
        reformat_en, set_reformat_en: u32 [0x0, 1];
        decap_en, set_decap_en: u32 [0x1, 1];
        sw_owner, set_sw_owner: u32 [0x2, 1];
        termination_table, set_termination_table: u32 [0x3, 1];
        table_miss_action, set_table_miss_action: u32 [0x4, 4];
        level, set_level: u32 [0x8, 8];
        rtc_valid, set_rtc_valid: u32 [0x10, 1];
        log_size, set_log_size: u32 [0x18, 8];
        table_miss_id, set_table_miss_id: u32 [0x28, 24];
        lag_master_next_table_id, set_lag_master_next_table_id: u32 [0x48, 24];
    }
}

prm_struct! {
    /// CREATE_FLOW_TABLE (0x930) input: `table_type` 0 = NIC RX, the context at 0x18.
    pub struct CreateFlowTableIn, mod create_flow_table_in = "create_flow_table_in", size_bits: 0x200, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        uid, set_uid: u32 [0x10, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        other_vport, set_other_vport: u32 [0x40, 1];
        other_eswitch, set_other_eswitch: u32 [0x41, 1];
        vport_number, set_vport_number: u32 [0x50, 16];
        table_type, set_table_type: u32 [0x80, 8];
        eswitch_owner_vhca_id, set_eswitch_owner_vhca_id: u32 [0x90, 16];
        flow_table_context, flow_table_context_mut: {FlowTableContext} [0xc0, 320];
    }
}

prm_struct! {
    /// CREATE_FLOW_TABLE output.
    pub struct CreateFlowTableOut, mod create_flow_table_out = "create_flow_table_out", size_bits: 0x80, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
        table_id, set_table_id: u32 [0x48, 24];
    }
}

prm_struct! {
    /// DESTROY_FLOW_TABLE (0x931) input.
    pub struct DestroyFlowTableIn, mod destroy_flow_table_in = "destroy_flow_table_in", size_bits: 0x200, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        other_vport, set_other_vport: u32 [0x40, 1];
        other_eswitch, set_other_eswitch: u32 [0x41, 1];
        vport_number, set_vport_number: u32 [0x50, 16];
        table_type, set_table_type: u32 [0x80, 8];
        eswitch_owner_vhca_id, set_eswitch_owner_vhca_id: u32 [0x90, 16];
        table_id, set_table_id: u32 [0xa8, 24];
    }
}

prm_struct! {
    /// DESTROY_FLOW_TABLE output.
    pub struct DestroyFlowTableOut, mod destroy_flow_table_out = "destroy_flow_table_out", size_bits: 0x80, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
    }
}

prm_struct! {
    /// QUERY_FLOW_TABLE (0x932) input.
    pub struct QueryFlowTableIn, mod query_flow_table_in = "query_flow_table_in", size_bits: 0x200, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        table_type, set_table_type: u32 [0x80, 8];
        table_id, set_table_id: u32 [0xa8, 24];
    }
}

prm_struct! {
    /// QUERY_FLOW_TABLE output: the context at 0x18.
    pub struct QueryFlowTableOut, mod query_flow_table_out = "query_flow_table_out", size_bits: 0x200, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
        flow_table_context, flow_table_context_mut: {FlowTableContext} [0xc0, 320];
    }
}

prm_struct! {
    /// L2-L4 header match set (outer or inner headers): MACs, ethertype, VLAN, IP version/protocol/addresses (an IPv4 address in the last 4 bytes), ports.
    pub struct FteMatchSetLyr24, mod fte_match_set_lyr_2_4 = "fte_match_set_lyr_2_4", size_bits: 0x200, source: Source::Ifc;
    {
        smac_47_16, set_smac_47_16: u32 [0x0, 32];
        smac_15_0, set_smac_15_0: u32 [0x20, 16];
        ethertype, set_ethertype: u32 [0x30, 16];
        dmac_47_16, set_dmac_47_16: u32 [0x40, 32];
        dmac_15_0, set_dmac_15_0: u32 [0x60, 16];
        first_prio, set_first_prio: u32 [0x70, 3];
        first_cfi, set_first_cfi: u32 [0x73, 1];
        first_vid, set_first_vid: u32 [0x74, 12];
        ip_protocol, set_ip_protocol: u32 [0x80, 8];
        ip_dscp, set_ip_dscp: u32 [0x88, 6];
        ip_ecn, set_ip_ecn: u32 [0x8e, 2];
        cvlan_tag, set_cvlan_tag: u32 [0x90, 1];
        svlan_tag, set_svlan_tag: u32 [0x91, 1];
        frag, set_frag: u32 [0x92, 1];
        ip_version, set_ip_version: u32 [0x93, 4];
        tcp_flags, set_tcp_flags: u32 [0x97, 9];
        tcp_sport, set_tcp_sport: u32 [0xa0, 16];
        tcp_dport, set_tcp_dport: u32 [0xb0, 16];
        l4_type, set_l4_type: u32 [0xc0, 2];
        ipv4_ihl, set_ipv4_ihl: u32 [0xd0, 4];
        ttl_hoplimit, set_ttl_hoplimit: u32 [0xd8, 8];
        udp_sport, set_udp_sport: u32 [0xe0, 16];
        udp_dport, set_udp_dport: u32 [0xf0, 16];
        src_ipv4_src_ipv6, set_src_ipv4_src_ipv6: bytes [0x100, 128];
        dst_ipv4_dst_ipv6, set_dst_ipv4_dst_ipv6: bytes [0x180, 128];
    }
}

prm_struct! {
    /// Miscellaneous match set (`misc_parameters`): source SQ/port, second VLAN, tunnels, RoCE BTH opcode and destination QP.
    pub struct FteMatchSetMisc, mod fte_match_set_misc = "fte_match_set_misc", size_bits: 0x200, source: Source::Ifc;
    {
        gre_c_present, set_gre_c_present: u32 [0x0, 1];
        gre_k_present, set_gre_k_present: u32 [0x2, 1];
        gre_s_present, set_gre_s_present: u32 [0x3, 1];
        source_vhca_port, set_source_vhca_port: u32 [0x4, 4];
        source_sqn, set_source_sqn: u32 [0x8, 24];
        source_eswitch_owner_vhca_id, set_source_eswitch_owner_vhca_id: u32 [0x20, 16];
        source_port, set_source_port: u32 [0x30, 16];
        outer_second_prio, set_outer_second_prio: u32 [0x40, 3];
        outer_second_cfi, set_outer_second_cfi: u32 [0x43, 1];
        outer_second_vid, set_outer_second_vid: u32 [0x44, 12];
        inner_second_prio, set_inner_second_prio: u32 [0x50, 3];
        inner_second_cfi, set_inner_second_cfi: u32 [0x53, 1];
        inner_second_vid, set_inner_second_vid: u32 [0x54, 12];
        outer_second_cvlan_tag, set_outer_second_cvlan_tag: u32 [0x60, 1];
        inner_second_cvlan_tag, set_inner_second_cvlan_tag: u32 [0x61, 1];
        outer_second_svlan_tag, set_outer_second_svlan_tag: u32 [0x62, 1];
        inner_second_svlan_tag, set_inner_second_svlan_tag: u32 [0x63, 1];
        gre_protocol, set_gre_protocol: u32 [0x70, 16];
        gre_key, set_gre_key: u32 [0x80, 32];
        vxlan_vni, set_vxlan_vni: u32 [0xa0, 24];
        bth_opcode, set_bth_opcode: u32 [0xb8, 8];
        geneve_vni, set_geneve_vni: u32 [0xc0, 24];
        outer_ipv6_flow_label, set_outer_ipv6_flow_label: u32 [0xec, 20];
        inner_ipv6_flow_label, set_inner_ipv6_flow_label: u32 [0x10c, 20];
        geneve_protocol_type, set_geneve_protocol_type: u32 [0x130, 16];
        bth_dst_qp, set_bth_dst_qp: u32 [0x148, 24];
    }
}

prm_struct! {
    /// Match set 3 (`misc_parameters_3`): TCP sequence numbers, ICMP/ICMPv6 type and code (IPv6 neighbour discovery is ICMPv6 133-137).
    pub struct FteMatchSetMisc3, mod fte_match_set_misc3 = "fte_match_set_misc3", size_bits: 0x200, source: Source::Ifc;
    {
        inner_tcp_seq_num, set_inner_tcp_seq_num: u32 [0x0, 32];
        outer_tcp_seq_num, set_outer_tcp_seq_num: u32 [0x20, 32];
        inner_tcp_ack_num, set_inner_tcp_ack_num: u32 [0x40, 32];
        outer_tcp_ack_num, set_outer_tcp_ack_num: u32 [0x60, 32];
        outer_vxlan_gpe_vni, set_outer_vxlan_gpe_vni: u32 [0x88, 24];
        outer_vxlan_gpe_next_protocol, set_outer_vxlan_gpe_next_protocol: u32 [0xa0, 8];
        outer_vxlan_gpe_flags, set_outer_vxlan_gpe_flags: u32 [0xa8, 8];
        icmp_header_data, set_icmp_header_data: u32 [0xc0, 32];
        icmpv6_header_data, set_icmpv6_header_data: u32 [0xe0, 32];
        icmp_type, set_icmp_type: u32 [0x100, 8];
        icmp_code, set_icmp_code: u32 [0x108, 8];
        icmpv6_type, set_icmpv6_type: u32 [0x110, 8];
        icmpv6_code, set_icmpv6_code: u32 [0x118, 8];
        geneve_tlv_option_0_data, set_geneve_tlv_option_0_data: u32 [0x120, 32];
        gtpu_teid, set_gtpu_teid: u32 [0x140, 32];
        gtpu_msg_type, set_gtpu_msg_type: u32 [0x160, 8];
        gtpu_msg_flags, set_gtpu_msg_flags: u32 [0x168, 8];
    }
}

prm_struct! {
    /// A flow match (criteria mask in a group, values in an entry): seven 64-byte sets, each enabled by one bit of `match_criteria_enable` ([`match_criteria`](crate::match_criteria)).
    pub struct FteMatchParam, mod fte_match_param = "fte_match_param", size_bits: 0x1000, source: Source::Ifc;
    {
        outer_headers, outer_headers_mut: {FteMatchSetLyr24} [0x0, 512];
        misc_parameters, misc_parameters_mut: {FteMatchSetMisc} [0x200, 512];
        inner_headers, inner_headers_mut: {FteMatchSetLyr24} [0x400, 512];
        misc_parameters_2, set_misc_parameters_2: bytes [0x600, 512];
        misc_parameters_3, misc_parameters_3_mut: {FteMatchSetMisc3} [0x800, 512];
        misc_parameters_4, set_misc_parameters_4: bytes [0xa00, 512];
        misc_parameters_5, set_misc_parameters_5: bytes [0xc00, 512];
    }
}

prm_struct! {
    /// CREATE_FLOW_GROUP (0x933) input: the entries `start_flow_index..=end_flow_index` of a table share one match mask (`match_criteria`, sets enabled by `match_criteria_enable`).
    pub struct CreateFlowGroupIn, mod create_flow_group_in = "create_flow_group_in", size_bits: 0x2000, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        other_vport, set_other_vport: u32 [0x40, 1];
        other_eswitch, set_other_eswitch: u32 [0x41, 1];
        vport_number, set_vport_number: u32 [0x50, 16];
        table_type, set_table_type: u32 [0x80, 8];
        group_type, set_group_type: u32 [0x8c, 4];
        eswitch_owner_vhca_id, set_eswitch_owner_vhca_id: u32 [0x90, 16];
        table_id, set_table_id: u32 [0xa8, 24];
        source_eswitch_owner_vhca_id_valid, set_source_eswitch_owner_vhca_id_valid: u32 [0xc0, 1];
        start_flow_index, set_start_flow_index: u32 [0xe0, 32];
        end_flow_index, set_end_flow_index: u32 [0x120, 32];
        match_definer_id, set_match_definer_id: u32 [0x150, 16];
        match_criteria_enable, set_match_criteria_enable: u32 [0x1f8, 8];
        match_criteria, match_criteria_mut: {FteMatchParam} [0x200, 4096];
    }
}

prm_struct! {
    /// CREATE_FLOW_GROUP output.
    pub struct CreateFlowGroupOut, mod create_flow_group_out = "create_flow_group_out", size_bits: 0x80, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
        group_id, set_group_id: u32 [0x48, 24];
    }
}

prm_struct! {
    /// DESTROY_FLOW_GROUP (0x934) input.
    pub struct DestroyFlowGroupIn, mod destroy_flow_group_in = "destroy_flow_group_in", size_bits: 0x200, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        other_vport, set_other_vport: u32 [0x40, 1];
        other_eswitch, set_other_eswitch: u32 [0x41, 1];
        vport_number, set_vport_number: u32 [0x50, 16];
        table_type, set_table_type: u32 [0x80, 8];
        eswitch_owner_vhca_id, set_eswitch_owner_vhca_id: u32 [0x90, 16];
        table_id, set_table_id: u32 [0xa8, 24];
        group_id, set_group_id: u32 [0xc0, 32];
    }
}

prm_struct! {
    /// DESTROY_FLOW_GROUP output.
    pub struct DestroyFlowGroupOut, mod destroy_flow_group_out = "destroy_flow_group_out", size_bits: 0x80, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
    }
}

prm_struct! {
    /// One forwarding destination: `destination_type` ([`flow_destination_type`](crate::flow_destination_type)) and its id (a TIR number for a NIC RX rule).
    pub struct DestFormatStruct, mod dest_format_struct = "dest_format_struct", size_bits: 0x40, source: Source::Ifc;
    {
        destination_type, set_destination_type: u32 [0x0, 8];
        destination_id, set_destination_id: u32 [0x8, 24];
        destination_eswitch_owner_vhca_id_valid, set_destination_eswitch_owner_vhca_id_valid: u32 [0x20, 1];
        packet_reformat, set_packet_reformat: u32 [0x21, 1];
        destination_table_type, set_destination_table_type: u32 [0x28, 8];
        destination_eswitch_owner_vhca_id, set_destination_eswitch_owner_vhca_id: u32 [0x30, 16];
    }
}

prm_struct! {
    /// One 16-byte element of `flow_context.destination[]`: a destination (the first `destination_list_size` elements) or a flow counter (the next `flow_counter_list_size`).
    pub struct DestFormatFlowCounterListAuto, mod dest_format_flow_counter_list_auto = "dest_format_flow_counter_list_auto", size_bits: 0x80, source: Source::Ifc;
    {
        destination_entry, destination_entry_mut: {DestFormatStruct} [0x0, 64] = "extended_dest_format.destination_entry";
        packet_reformat_id, set_packet_reformat_id: u32 [0x40, 32] = "extended_dest_format.packet_reformat_id";
        flow_counter_id, set_flow_counter_id: u32 [0x0, 32] = "flow_counter_list.flow_counter_id";
    }
}

prm_struct! {
    /// A flow table entry: its group, `action` bits ([`flow_action`](crate::flow_action)), `match_value` and the destination list that ends it.
    pub struct FlowContext, mod flow_context = "flow_context", size_bits: 0x1800, source: Source::Ifc;
    {
        push_vlan, set_push_vlan: u32 [0x0, 32];
        group_id, set_group_id: u32 [0x20, 32];
        flow_tag, set_flow_tag: u32 [0x48, 24];
        action, set_action: u32 [0x70, 16];
        extended_destination, set_extended_destination: u32 [0x80, 1];
        uplink_hairpin_en, set_uplink_hairpin_en: u32 [0x81, 1];
        flow_source, set_flow_source: u32 [0x82, 2];
        encrypt_decrypt_type, set_encrypt_decrypt_type: u32 [0x84, 4];
        destination_list_size, set_destination_list_size: u32 [0x88, 24];
        flow_counter_list_size, set_flow_counter_list_size: u32 [0xa8, 24];
        packet_reformat_id, set_packet_reformat_id: u32 [0xc0, 32];
        modify_header_id, set_modify_header_id: u32 [0xe0, 32];
        match_value, match_value_mut: {FteMatchParam} [0x200, 4096];
        destination, destination_mut: [{DestFormatFlowCounterListAuto}; flex] [0x1800, 128];
    }
}

prm_struct! {
    /// SET_FLOW_TABLE_ENTRY (0x936) input: entry `flow_index` of table `table_id`, the flow context at 0x40 (its destinations from 0x340).
    pub struct SetFteIn, mod set_fte_in = "set_fte_in", size_bits: 0x1a00, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        other_vport, set_other_vport: u32 [0x40, 1];
        other_eswitch, set_other_eswitch: u32 [0x41, 1];
        vport_number, set_vport_number: u32 [0x50, 16];
        table_type, set_table_type: u32 [0x80, 8];
        eswitch_owner_vhca_id, set_eswitch_owner_vhca_id: u32 [0x90, 16];
        table_id, set_table_id: u32 [0xa8, 24];
        ignore_flow_level, set_ignore_flow_level: u32 [0xc0, 1];
        modify_enable_mask, set_modify_enable_mask: u32 [0xd8, 8];
        flow_index, set_flow_index: u32 [0x100, 32];
        flow_context, flow_context_mut: {FlowContext} [0x200, 6144];
    }
}

prm_struct! {
    /// SET_FLOW_TABLE_ENTRY output.
    pub struct SetFteOut, mod set_fte_out = "set_fte_out", size_bits: 0x80, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
    }
}

prm_struct! {
    /// DELETE_FLOW_TABLE_ENTRY (0x938) input.
    pub struct DeleteFteIn, mod delete_fte_in = "delete_fte_in", size_bits: 0x200, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        other_vport, set_other_vport: u32 [0x40, 1];
        other_eswitch, set_other_eswitch: u32 [0x41, 1];
        vport_number, set_vport_number: u32 [0x50, 16];
        table_type, set_table_type: u32 [0x80, 8];
        eswitch_owner_vhca_id, set_eswitch_owner_vhca_id: u32 [0x90, 16];
        table_id, set_table_id: u32 [0xa8, 24];
        flow_index, set_flow_index: u32 [0x100, 32];
    }
}

prm_struct! {
    /// DELETE_FLOW_TABLE_ENTRY output.
    pub struct DeleteFteOut, mod delete_fte_out = "delete_fte_out", size_bits: 0x80, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
    }
}

prm_struct! {
    /// QUERY_FLOW_TABLE_ENTRY (0x937) input.
    pub struct QueryFteIn, mod query_fte_in = "query_fte_in", size_bits: 0x200, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        table_type, set_table_type: u32 [0x80, 8];
        table_id, set_table_id: u32 [0xa8, 24];
        flow_index, set_flow_index: u32 [0x100, 32];
    }
}

prm_struct! {
    /// QUERY_FLOW_TABLE_ENTRY output: the flow context at 0x40.
    pub struct QueryFteOut, mod query_fte_out = "query_fte_out", size_bits: 0x1a00, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
        flow_context, flow_context_mut: {FlowContext} [0x200, 6144];
    }
}

prm_struct! {
    /// SET_FLOW_TABLE_ROOT (0x92f) input: table `table_id` becomes the root of its type, where the vport's received packets start.
    pub struct SetFlowTableRootIn, mod set_flow_table_root_in = "set_flow_table_root_in", size_bits: 0x200, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        other_vport, set_other_vport: u32 [0x40, 1];
        other_eswitch, set_other_eswitch: u32 [0x41, 1];
        vport_number, set_vport_number: u32 [0x50, 16];
        eswitch_owner_vhca_id, set_eswitch_owner_vhca_id: u32 [0x70, 16];
        table_type, set_table_type: u32 [0x80, 8];
        table_of_other_vport, set_table_of_other_vport: u32 [0x8f, 1];
        table_vport_number, set_table_vport_number: u32 [0x90, 16];
        table_id, set_table_id: u32 [0xa8, 24];
        underlay_qpn, set_underlay_qpn: u32 [0xc8, 24];
        table_eswitch_owner_vhca_id_valid, set_table_eswitch_owner_vhca_id_valid: u32 [0xe0, 1];
        table_eswitch_owner_vhca_id, set_table_eswitch_owner_vhca_id: u32 [0xf0, 16];
    }
}

prm_struct! {
    /// SET_FLOW_TABLE_ROOT output.
    pub struct SetFlowTableRootOut, mod set_flow_table_root_out = "set_flow_table_root_out", size_bits: 0x80, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
    }
}

prm_struct! {
    /// Which match fields a flow table type supports (one bit each).
    pub struct FlowTableFieldsSupported, mod flow_table_fields_supported = "flow_table_fields_supported", size_bits: 0x80, source: Source::Ifc;
    {
        outer_dmac, set_outer_dmac: u32 [0x0, 1];
        outer_smac, set_outer_smac: u32 [0x1, 1];
        outer_ether_type, set_outer_ether_type: u32 [0x2, 1];
        outer_ip_version, set_outer_ip_version: u32 [0x3, 1];
        outer_first_prio, set_outer_first_prio: u32 [0x4, 1];
        outer_first_cfi, set_outer_first_cfi: u32 [0x5, 1];
        outer_first_vid, set_outer_first_vid: u32 [0x6, 1];
        outer_ipv4_ttl, set_outer_ipv4_ttl: u32 [0x7, 1];
        outer_second_prio, set_outer_second_prio: u32 [0x8, 1];
        outer_second_cfi, set_outer_second_cfi: u32 [0x9, 1];
        outer_second_vid, set_outer_second_vid: u32 [0xa, 1];
        outer_sip, set_outer_sip: u32 [0xc, 1];
        outer_dip, set_outer_dip: u32 [0xd, 1];
        outer_frag, set_outer_frag: u32 [0xe, 1];
        outer_ip_protocol, set_outer_ip_protocol: u32 [0xf, 1];
        outer_ip_ecn, set_outer_ip_ecn: u32 [0x10, 1];
        outer_ip_dscp, set_outer_ip_dscp: u32 [0x11, 1];
        outer_udp_sport, set_outer_udp_sport: u32 [0x12, 1];
        outer_udp_dport, set_outer_udp_dport: u32 [0x13, 1];
        outer_tcp_sport, set_outer_tcp_sport: u32 [0x14, 1];
        outer_tcp_dport, set_outer_tcp_dport: u32 [0x15, 1];
        outer_tcp_flags, set_outer_tcp_flags: u32 [0x16, 1];
        outer_gre_protocol, set_outer_gre_protocol: u32 [0x17, 1];
        outer_gre_key, set_outer_gre_key: u32 [0x18, 1];
        outer_vxlan_vni, set_outer_vxlan_vni: u32 [0x19, 1];
        source_vhca_port, set_source_vhca_port: u32 [0x1e, 1];
        source_eswitch_port, set_source_eswitch_port: u32 [0x1f, 1];
        inner_dmac, set_inner_dmac: u32 [0x20, 1];
        inner_smac, set_inner_smac: u32 [0x21, 1];
        inner_ether_type, set_inner_ether_type: u32 [0x22, 1];
        inner_ip_version, set_inner_ip_version: u32 [0x23, 1];
        inner_sip, set_inner_sip: u32 [0x2c, 1];
        inner_dip, set_inner_dip: u32 [0x2d, 1];
        inner_ip_protocol, set_inner_ip_protocol: u32 [0x2f, 1];
        inner_udp_sport, set_inner_udp_sport: u32 [0x32, 1];
        inner_udp_dport, set_inner_udp_dport: u32 [0x33, 1];
        bth_dst_qp, set_bth_dst_qp: u32 [0x5a, 1];
    }
}

prm_struct! {
    /// Properties of one flow table type: support, largest table (`log_max_ft_size`), deepest level (`max_ft_level`), most tables / rules / destinations, and the match fields.
    pub struct FlowTablePropLayout, mod flow_table_prop_layout = "flow_table_prop_layout", size_bits: 0x200, source: Source::Ifc;
    {
        ft_support, set_ft_support: u32 [0x0, 1];
        flow_counter, set_flow_counter: u32 [0x2, 1];
        flow_modify_en, set_flow_modify_en: u32 [0x3, 1];
        modify_root, set_modify_root: u32 [0x4, 1];
        identified_miss_table_mode, set_identified_miss_table_mode: u32 [0x5, 1];
        flow_table_modify, set_flow_table_modify: u32 [0x6, 1];
        reformat, set_reformat: u32 [0x7, 1];
        decap, set_decap: u32 [0x8, 1];
        reset_root_to_default, set_reset_root_to_default: u32 [0x9, 1];
        pop_vlan, set_pop_vlan: u32 [0xa, 1];
        push_vlan, set_push_vlan: u32 [0xb, 1];
        ignore_flow_level, set_ignore_flow_level: u32 [0x15, 1];
        table_miss_action_domain, set_table_miss_action_domain: u32 [0x17, 1];
        log_max_ft_size, set_log_max_ft_size: u32 [0x22, 6];
        log_max_modify_header_context, set_log_max_modify_header_context: u32 [0x28, 8];
        max_modify_header_actions, set_max_modify_header_actions: u32 [0x30, 8];
        max_ft_level, set_max_ft_level: u32 [0x38, 8];
        log_max_ft_num, set_log_max_ft_num: u32 [0x78, 8];
        log_max_flow_counter, set_log_max_flow_counter: u32 [0x90, 8];
        log_max_destination, set_log_max_destination: u32 [0x98, 8];
        log_max_flow, set_log_max_flow: u32 [0xb8, 8];
        ft_field_support, ft_field_support_mut: {FlowTableFieldsSupported} [0x100, 128];
        ft_field_bitmask_support, ft_field_bitmask_support_mut: {FlowTableFieldsSupported} [0x180, 128];
    }
}

prm_struct! {
    /// NIC flow table capabilities (cap type 7): the properties of the NIC RX and TX table types.
    pub struct FlowTableNicCap, mod flow_table_nic_cap = "flow_table_nic_cap", size_bits: 0x8000, source: Source::Ifc;
    {
        nic_rx_multi_path_tirs, set_nic_rx_multi_path_tirs: u32 [0x0, 1];
        nic_rx_multi_path_tirs_fts, set_nic_rx_multi_path_tirs_fts: u32 [0x1, 1];
        allow_sniffer_and_nic_rx_shared_tir, set_allow_sniffer_and_nic_rx_shared_tir: u32 [0x2, 1];
        encap_general_header, set_encap_general_header: u32 [0x20, 1];
        log_max_packet_reformat_context, set_log_max_packet_reformat_context: u32 [0x2b, 5];
        max_encap_header_size, set_max_encap_header_size: u32 [0x36, 10];
        flow_table_properties_nic_receive, flow_table_properties_nic_receive_mut: {FlowTablePropLayout} [0x200, 512];
        flow_table_properties_nic_receive_rdma, flow_table_properties_nic_receive_rdma_mut: {FlowTablePropLayout} [0x400, 512];
        flow_table_properties_nic_transmit, flow_table_properties_nic_transmit_mut: {FlowTablePropLayout} [0x800, 512];
    }
}

prm_struct! {
    /// A packet and an octet count.
    pub struct TrafficCounter, mod traffic_counter = "traffic_counter", size_bits: 0x80, source: Source::Ifc;
    {
        packets, set_packets: u64 [0x0, 64];
        octets, set_octets: u64 [0x40, 64];
    }
}

prm_struct! {
    /// QUERY_VPORT_COUNTER (0x770) input: `clear` zeroes the counters after reading them.
    pub struct QueryVportCounterIn, mod query_vport_counter_in = "query_vport_counter_in", size_bits: 0x100, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        other_vport, set_other_vport: u32 [0x40, 1];
        port_num, set_port_num: u32 [0x4c, 4];
        vport_number, set_vport_number: u32 [0x50, 16];
        clear, set_clear: u32 [0xc0, 1];
    }
}

prm_struct! {
    /// QUERY_VPORT_COUNTER output: packet/octet counters of the vport by direction and cast.
    pub struct QueryVportCounterOut, mod query_vport_counter_out = "query_vport_counter_out", size_bits: 0x1080, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
        received_errors, received_errors_mut: {TrafficCounter} [0x80, 128];
        transmit_errors, transmit_errors_mut: {TrafficCounter} [0x100, 128];
        received_ib_unicast, received_ib_unicast_mut: {TrafficCounter} [0x180, 128];
        transmitted_ib_unicast, transmitted_ib_unicast_mut: {TrafficCounter} [0x200, 128];
        received_ib_multicast, received_ib_multicast_mut: {TrafficCounter} [0x280, 128];
        transmitted_ib_multicast, transmitted_ib_multicast_mut: {TrafficCounter} [0x300, 128];
        received_eth_broadcast, received_eth_broadcast_mut: {TrafficCounter} [0x380, 128];
        transmitted_eth_broadcast, transmitted_eth_broadcast_mut: {TrafficCounter} [0x400, 128];
        received_eth_unicast, received_eth_unicast_mut: {TrafficCounter} [0x480, 128];
        transmitted_eth_unicast, transmitted_eth_unicast_mut: {TrafficCounter} [0x500, 128];
        received_eth_multicast, received_eth_multicast_mut: {TrafficCounter} [0x580, 128];
        transmitted_eth_multicast, transmitted_eth_multicast_mut: {TrafficCounter} [0x600, 128];
        local_loopback, local_loopback_mut: {TrafficCounter} [0x680, 128];
    }
}
