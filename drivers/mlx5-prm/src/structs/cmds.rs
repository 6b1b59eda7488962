//! Bring-up, UAR/PD, vport and RoCE-address commands (mlx5.md §3, §5).

use super::*;

prm_struct! {
    /// QUERY_HCA_CAP (0x100) input: `op_mod` = cap_type << 1 | (1 current, 0 max) (mlx5.md §5.2).
    pub struct QueryHcaCapIn, mod query_hca_cap_in = "query_hca_cap_in", size_bits: 0x80, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        other_function, set_other_function: u32 [0x40, 1];
        ec_vf_function, set_ec_vf_function: u32 [0x41, 1];
        function_id_type, set_function_id_type: u32 [0x43, 1];
        function_id, set_function_id: u32 [0x50, 16];
    }
}

prm_struct! {
    /// QUERY_HCA_CAP output: the capability page at 0x10 (mlx5.md §5.2); general, RoCE, Ethernet offload and NIC flow table caps as nested views (the page is the union of them).
    pub struct QueryHcaCapOut, mod query_hca_cap_out = "query_hca_cap_out", size_bits: 0x8080, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
        cmd_hca_cap, cmd_hca_cap_mut: {CmdHcaCap} [0x80, 2048] = "capability.cmd_hca_cap";
        roce_cap, roce_cap_mut: {RoceCap} [0x80, 2048] = "capability.roce_cap";
        per_protocol_networking_offload_caps, per_protocol_networking_offload_caps_mut: {PerProtocolNetworkingOffloadCaps} [0x80, 2048] = "capability.per_protocol_networking_offload_caps";
        flow_table_nic_cap, flow_table_nic_cap_mut: {FlowTableNicCap} [0x80, 32768] = "capability.flow_table_nic_cap";
    }
}

prm_struct! {
    /// SET_HCA_CAP (0x109) input: `op_mod` = cap_type << 1, capability page at 0x10 (mlx5.md §5.2).
    pub struct SetHcaCapIn, mod set_hca_cap_in = "set_hca_cap_in", size_bits: 0x8080, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        other_function, set_other_function: u32 [0x40, 1];
        ec_vf_function, set_ec_vf_function: u32 [0x41, 1];
        function_id_type, set_function_id_type: u32 [0x43, 1];
        function_id, set_function_id: u32 [0x50, 16];
        cmd_hca_cap, cmd_hca_cap_mut: {CmdHcaCap} [0x80, 2048] = "capability.cmd_hca_cap";
        roce_cap, roce_cap_mut: {RoceCap} [0x80, 2048] = "capability.roce_cap";
        per_protocol_networking_offload_caps, per_protocol_networking_offload_caps_mut: {PerProtocolNetworkingOffloadCaps} [0x80, 2048] = "capability.per_protocol_networking_offload_caps";
        flow_table_nic_cap, flow_table_nic_cap_mut: {FlowTableNicCap} [0x80, 32768] = "capability.flow_table_nic_cap";
    }
}

prm_struct! {
    /// SET_HCA_CAP output.
    pub struct SetHcaCapOut, mod set_hca_cap_out = "set_hca_cap_out", size_bits: 0x80, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
    }
}

prm_struct! {
    /// QUERY_ISSI (0x10a) input.
    pub struct QueryIssiIn, mod query_issi_in = "query_issi_in", size_bits: 0x80, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
    }
}

prm_struct! {
    /// QUERY_ISSI output: `supported_issi_dw0` bit n = ISSI n supported (mlx5.md §5.2).
    pub struct QueryIssiOut, mod query_issi_out = "query_issi_out", size_bits: 0x380, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
        current_issi, set_current_issi: u32 [0x50, 16];
        supported_issi_dw0, set_supported_issi_dw0: u32 [0x360, 32];
    }
}

prm_struct! {
    /// SET_ISSI (0x10b) input.
    pub struct SetIssiIn, mod set_issi_in = "set_issi_in", size_bits: 0x80, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        current_issi, set_current_issi: u32 [0x50, 16];
    }
}

prm_struct! {
    /// SET_ISSI output.
    pub struct SetIssiOut, mod set_issi_out = "set_issi_out", size_bits: 0x80, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
    }
}

prm_struct! {
    /// ENABLE_HCA (0x104) input: `function_id` 0 = own function (mlx5.md §3 step 5).
    pub struct EnableHcaIn, mod enable_hca_in = "enable_hca_in", size_bits: 0x80, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        embedded_cpu_function, set_embedded_cpu_function: u32 [0x40, 1];
        function_id, set_function_id: u32 [0x50, 16];
    }
}

prm_struct! {
    /// ENABLE_HCA output.
    pub struct EnableHcaOut, mod enable_hca_out = "enable_hca_out", size_bits: 0x60, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
    }
}

prm_struct! {
    /// DISABLE_HCA (0x105) input.
    pub struct DisableHcaIn, mod disable_hca_in = "disable_hca_in", size_bits: 0x80, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        embedded_cpu_function, set_embedded_cpu_function: u32 [0x40, 1];
        function_id, set_function_id: u32 [0x50, 16];
    }
}

prm_struct! {
    /// DISABLE_HCA output.
    pub struct DisableHcaOut, mod disable_hca_out = "disable_hca_out", size_bits: 0x60, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
    }
}

prm_struct! {
    /// QUERY_PAGES (0x107) input: `op_mod` 1 boot, 2 init, 3 regular (mlx5.md §5.2).
    pub struct QueryPagesIn, mod query_pages_in = "query_pages_in", size_bits: 0x80, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        embedded_cpu_function, set_embedded_cpu_function: u32 [0x40, 1];
        function_id, set_function_id: u32 [0x50, 16];
    }
}

prm_struct! {
    /// QUERY_PAGES output: `num_pages` is signed (mlx5.md §5.2).
    pub struct QueryPagesOut, mod query_pages_out = "query_pages_out", size_bits: 0x80, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
        embedded_cpu_function, set_embedded_cpu_function: u32 [0x40, 1];
        function_id, set_function_id: u32 [0x50, 16];
        num_pages, set_num_pages: u32 [0x60, 32];
    }
}

prm_struct! {
    /// MANAGE_PAGES (0x108) input: `op_mod` 0 cannot give, 1 give, 2 take; `pas[]` from 0x10 (mlx5.md §5.2).
    pub struct ManagePagesIn, mod manage_pages_in = "manage_pages_in", size_bits: 0x80, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        embedded_cpu_function, set_embedded_cpu_function: u32 [0x40, 1];
        function_id, set_function_id: u32 [0x50, 16];
        input_num_entries, set_input_num_entries: u32 [0x60, 32];
        pas, set_pas: [u64; flex] [0x80, 64];
    }
}

prm_struct! {
    /// MANAGE_PAGES output: on take, the returned pages in `pas[]` (mlx5.md §5.2).
    pub struct ManagePagesOut, mod manage_pages_out = "manage_pages_out", size_bits: 0x80, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
        output_num_entries, set_output_num_entries: u32 [0x40, 32];
        pas, set_pas: [u64; flex] [0x80, 64];
    }
}

prm_struct! {
    /// INIT_HCA (0x102) input (0x20 bytes; mlx5.md §5.2).
    pub struct InitHcaIn, mod init_hca_in = "init_hca_in", size_bits: 0x100, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        sw_vhca_id, set_sw_vhca_id: u32 [0x62, 14];
        sw_owner_id, set_sw_owner_id: [u32; 4] [0x80, 128];
    }
}

prm_struct! {
    /// INIT_HCA output.
    pub struct InitHcaOut, mod init_hca_out = "init_hca_out", size_bits: 0x80, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
    }
}

prm_struct! {
    /// TEARDOWN_HCA (0x103) input: `profile` 0 graceful, 1 force, 2 prepare fast teardown (mlx5.md §3.2).
    pub struct TeardownHcaIn, mod teardown_hca_in = "teardown_hca_in", size_bits: 0x80, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        profile, set_profile: u32 [0x50, 16];
    }
}

prm_struct! {
    /// TEARDOWN_HCA output: `state` 1 = force/fast teardown failed (mlx5.md §3.2).
    pub struct TeardownHcaOut, mod teardown_hca_out = "teardown_hca_out", size_bits: 0x80, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
        state, set_state: u32 [0x7f, 1];
    }
}

prm_struct! {
    /// SET_DRIVER_VERSION (0x10d) input: a 64-byte version string.
    pub struct SetDriverVersionIn, mod set_driver_version_in = "set_driver_version_in", size_bits: 0x280, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        driver_version, set_driver_version: bytes [0x80, 512];
    }
}

prm_struct! {
    /// SET_DRIVER_VERSION output.
    pub struct SetDriverVersionOut, mod set_driver_version_out = "set_driver_version_out", size_bits: 0x80, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
    }
}

prm_struct! {
    /// ACCESS_REG (0x805) input: `op_mod` 0 write, 1 read; register data from 0x10 (mlx5.md §5.2).
    pub struct AccessRegisterIn, mod access_register_in = "access_register_in", size_bits: 0x80, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        register_id, set_register_id: u32 [0x50, 16];
        argument, set_argument: u32 [0x60, 32];
        register_data, set_register_data: [u32; flex] [0x80, 32];
    }
}

prm_struct! {
    /// ACCESS_REG output: register data from 0x10.
    pub struct AccessRegisterOut, mod access_register_out = "access_register_out", size_bits: 0x80, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
        register_data, set_register_data: [u32; flex] [0x80, 32];
    }
}

prm_struct! {
    /// The HOST_ENDIANNESS register (0x7004) payload: `he` 0 little-endian host, 1 big-endian (mlx5.md §3 step 9: byte 0 = 0x00 / 0x80).
    pub struct RegisterHostEndianness, mod register_host_endianness = "register_host_endianness", size_bits: 0x80, source: Source::Ifc;
    {
        he, set_he: u32 [0x0, 1];
    }
}

prm_struct! {
    /// The PTYS register (0x5004, mlx5.md §5.2): port type and speed. Read with `local_port` and
    /// `proto_mask` (bit 2 Ethernet, bit 0 InfiniBand) set; the Ethernet fields carry one bit per
    /// link mode (K `enum mlx5e_link_mode`).
    pub struct PtysReg, mod ptys_reg = "ptys_reg", size_bits: 0x200, source: Source::Ifc;
    {
        an_disable_admin, set_an_disable_admin: u32 [0x1, 1];
        an_disable_cap, set_an_disable_cap: u32 [0x2, 1];
        local_port, set_local_port: u32 [0x8, 8];
        plane_ind, set_plane_ind: u32 [0x18, 4];
        proto_mask, set_proto_mask: u32 [0x1d, 3];
        an_status, set_an_status: u32 [0x20, 4];
        data_rate_oper, set_data_rate_oper: u32 [0x30, 16];
        ext_eth_proto_capability, set_ext_eth_proto_capability: u32 [0x40, 32];
        eth_proto_capability, set_eth_proto_capability: u32 [0x60, 32];
        ib_link_width_capability, set_ib_link_width_capability: u32 [0x80, 16];
        ib_proto_capability, set_ib_proto_capability: u32 [0x90, 16];
        ext_eth_proto_admin, set_ext_eth_proto_admin: u32 [0xa0, 32];
        eth_proto_admin, set_eth_proto_admin: u32 [0xc0, 32];
        ib_link_width_admin, set_ib_link_width_admin: u32 [0xe0, 16];
        ib_proto_admin, set_ib_proto_admin: u32 [0xf0, 16];
        ext_eth_proto_oper, set_ext_eth_proto_oper: u32 [0x100, 32];
        eth_proto_oper, set_eth_proto_oper: u32 [0x120, 32];
        ib_link_width_oper, set_ib_link_width_oper: u32 [0x140, 16];
        ib_proto_oper, set_ib_proto_oper: u32 [0x150, 16];
        connector_type, set_connector_type: u32 [0x17c, 4];
        eth_proto_lp_advertise, set_eth_proto_lp_advertise: u32 [0x180, 32];
    }
}

prm_struct! {
    /// QUERY_SPECIAL_CONTEXTS (0x203) input.
    pub struct QuerySpecialContextsIn, mod query_special_contexts_in = "query_special_contexts_in", size_bits: 0x80, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
    }
}

prm_struct! {
    /// QUERY_SPECIAL_CONTEXTS output: `resd_lkey` usable by QPs with `rlky` = 1 (mlx5.md §5.2).
    pub struct QuerySpecialContextsOut, mod query_special_contexts_out = "query_special_contexts_out", size_bits: 0x100, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
        dump_fill_mkey, set_dump_fill_mkey: u32 [0x40, 32];
        resd_lkey, set_resd_lkey: u32 [0x60, 32];
        null_mkey, set_null_mkey: u32 [0x80, 32];
        terminate_scatter_list_mkey, set_terminate_scatter_list_mkey: u32 [0xa0, 32];
        repeated_mkey, set_repeated_mkey: u32 [0xc0, 32];
    }
}

prm_struct! {
    /// ALLOC_UAR (0x802) input.
    pub struct AllocUarIn, mod alloc_uar_in = "alloc_uar_in", size_bits: 0x80, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        uid, set_uid: u32 [0x10, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
    }
}

prm_struct! {
    /// ALLOC_UAR output: `uar` = UAR page index (mlx5.md §5.2, §8).
    pub struct AllocUarOut, mod alloc_uar_out = "alloc_uar_out", size_bits: 0x80, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
        uar, set_uar: u32 [0x48, 24];
    }
}

prm_struct! {
    /// DEALLOC_UAR (0x803) input.
    pub struct DeallocUarIn, mod dealloc_uar_in = "dealloc_uar_in", size_bits: 0x80, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        uid, set_uid: u32 [0x10, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        uar, set_uar: u32 [0x48, 24];
    }
}

prm_struct! {
    /// DEALLOC_UAR output.
    pub struct DeallocUarOut, mod dealloc_uar_out = "dealloc_uar_out", size_bits: 0x80, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
    }
}

prm_struct! {
    /// ALLOC_PD (0x800) input.
    pub struct AllocPdIn, mod alloc_pd_in = "alloc_pd_in", size_bits: 0x80, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        uid, set_uid: u32 [0x10, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
    }
}

prm_struct! {
    /// ALLOC_PD output.
    pub struct AllocPdOut, mod alloc_pd_out = "alloc_pd_out", size_bits: 0x80, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
        pd, set_pd: u32 [0x48, 24];
    }
}

prm_struct! {
    /// DEALLOC_PD (0x801) input.
    pub struct DeallocPdIn, mod dealloc_pd_in = "dealloc_pd_in", size_bits: 0x80, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        uid, set_uid: u32 [0x10, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        pd, set_pd: u32 [0x48, 24];
    }
}

prm_struct! {
    /// DEALLOC_PD output.
    pub struct DeallocPdOut, mod dealloc_pd_out = "dealloc_pd_out", size_bits: 0x80, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
    }
}

prm_struct! {
    /// ALLOC_TRANSPORT_DOMAIN (0x816) input (raw-Ethernet TIR/TIS only; mlx5.md §5.1).
    pub struct AllocTransportDomainIn, mod alloc_transport_domain_in = "alloc_transport_domain_in", size_bits: 0x80, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        uid, set_uid: u32 [0x10, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
    }
}

prm_struct! {
    /// ALLOC_TRANSPORT_DOMAIN output.
    pub struct AllocTransportDomainOut, mod alloc_transport_domain_out = "alloc_transport_domain_out", size_bits: 0x80, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
        transport_domain, set_transport_domain: u32 [0x48, 24];
    }
}

prm_struct! {
    /// DEALLOC_TRANSPORT_DOMAIN (0x817) input.
    pub struct DeallocTransportDomainIn, mod dealloc_transport_domain_in = "dealloc_transport_domain_in", size_bits: 0x80, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        uid, set_uid: u32 [0x10, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        transport_domain, set_transport_domain: u32 [0x48, 24];
    }
}

prm_struct! {
    /// DEALLOC_TRANSPORT_DOMAIN output.
    pub struct DeallocTransportDomainOut, mod dealloc_transport_domain_out = "dealloc_transport_domain_out", size_bits: 0x80, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
    }
}

prm_struct! {
    /// QUERY_VPORT_STATE (0x750) input: `op_mod` 0 vNIC vport, 2 uplink (mlx5.md §5.4).
    pub struct QueryVportStateIn, mod query_vport_state_in = "query_vport_state_in", size_bits: 0x80, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        other_vport, set_other_vport: u32 [0x40, 1];
        vport_number, set_vport_number: u32 [0x50, 16];
    }
}

prm_struct! {
    /// QUERY_VPORT_STATE output: `admin_state`, `state` (oper).
    pub struct QueryVportStateOut, mod query_vport_state_out = "query_vport_state_out", size_bits: 0x80, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
        admin_state, set_admin_state: u32 [0x78, 4];
        state, set_state: u32 [0x7c, 4];
    }
}

prm_struct! {
    /// QUERY_NIC_VPORT_CONTEXT (0x754) input (mlx5.md §5.4).
    pub struct QueryNicVportContextIn, mod query_nic_vport_context_in = "query_nic_vport_context_in", size_bits: 0x80, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        other_vport, set_other_vport: u32 [0x40, 1];
        vport_number, set_vport_number: u32 [0x50, 16];
        allowed_list_type, set_allowed_list_type: u32 [0x65, 3];
    }
}

prm_struct! {
    /// QUERY_NIC_VPORT_CONTEXT output: the context at 0x10.
    pub struct QueryNicVportContextOut, mod query_nic_vport_context_out = "query_nic_vport_context_out", size_bits: 0x880, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
        nic_vport_context, nic_vport_context_mut: {NicVportContext} [0x80, 2048];
    }
}

prm_struct! {
    /// MODIFY_NIC_VPORT_CONTEXT (0x755) input: `field_select` at 0x0c, context at 0x100 (mlx5.md §5.4).
    pub struct ModifyNicVportContextIn, mod modify_nic_vport_context_in = "modify_nic_vport_context_in", size_bits: 0x1000, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        other_vport, set_other_vport: u32 [0x40, 1];
        vport_number, set_vport_number: u32 [0x50, 16];
        field_select, field_select_mut: {ModifyNicVportFieldSelect} [0x60, 32];
        nic_vport_context, nic_vport_context_mut: {NicVportContext} [0x800, 2048];
    }
}

prm_struct! {
    /// MODIFY_NIC_VPORT_CONTEXT output.
    pub struct ModifyNicVportContextOut, mod modify_nic_vport_context_out = "modify_nic_vport_context_out", size_bits: 0x80, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
    }
}

prm_struct! {
    /// QUERY_HCA_VPORT_CONTEXT (0x762) input (IB ports).
    pub struct QueryHcaVportContextIn, mod query_hca_vport_context_in = "query_hca_vport_context_in", size_bits: 0x80, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        other_vport, set_other_vport: u32 [0x40, 1];
        port_num, set_port_num: u32 [0x4c, 4];
        vport_number, set_vport_number: u32 [0x50, 16];
    }
}

prm_struct! {
    /// QUERY_HCA_VPORT_CONTEXT output.
    pub struct QueryHcaVportContextOut, mod query_hca_vport_context_out = "query_hca_vport_context_out", size_bits: 0x1080, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
        hca_vport_context, hca_vport_context_mut: {HcaVportContext} [0x80, 4096];
    }
}

prm_struct! {
    /// QUERY_ROCE_ADDRESS (0x760) input: `roce_address_index` = GID table index (mlx5.md §5.4).
    pub struct QueryRoceAddressIn, mod query_roce_address_in = "query_roce_address_in", size_bits: 0x80, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        roce_address_index, set_roce_address_index: u32 [0x40, 16];
        vhca_port_num, set_vhca_port_num: u32 [0x5c, 4];
    }
}

prm_struct! {
    /// QUERY_ROCE_ADDRESS output: the entry at 0x10.
    pub struct QueryRoceAddressOut, mod query_roce_address_out = "query_roce_address_out", size_bits: 0x180, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
        roce_address, roce_address_mut: {RoceAddrLayout} [0x80, 256];
    }
}

prm_struct! {
    /// SET_ROCE_ADDRESS (0x761) input: index, `vhca_port_num` (only when `num_vhca_ports` > 0), entry at 0x10 (mlx5.md §5.4).
    pub struct SetRoceAddressIn, mod set_roce_address_in = "set_roce_address_in", size_bits: 0x180, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        roce_address_index, set_roce_address_index: u32 [0x40, 16];
        vhca_port_num, set_vhca_port_num: u32 [0x5c, 4];
        roce_address, roce_address_mut: {RoceAddrLayout} [0x80, 256];
    }
}

prm_struct! {
    /// SET_ROCE_ADDRESS output.
    pub struct SetRoceAddressOut, mod set_roce_address_out = "set_roce_address_out", size_bits: 0x80, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
    }
}

prm_struct! {
    /// SET_L2_TABLE_ENTRY (0x829) input: a MAC in an eswitch manager's L2
    /// (MPFS) table, so unicast frames to it reach this PF (K
    /// core/lib/mpfs.c; the MAC in bytes 2..8 of `mac_address`).
    pub struct SetL2TableEntryIn, mod set_l2_table_entry_in = "set_l2_table_entry_in", size_bits: 0x200, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        table_index, set_table_index: u32 [0xa8, 24];
        mac_address, set_mac_address: u64 [0x100, 64];
    }
}

prm_struct! {
    /// SET_L2_TABLE_ENTRY output.
    pub struct SetL2TableEntryOut, mod set_l2_table_entry_out = "set_l2_table_entry_out", size_bits: 0x80, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
    }
}

prm_struct! {
    /// DELETE_L2_TABLE_ENTRY (0x82b) input.
    pub struct DeleteL2TableEntryIn, mod delete_l2_table_entry_in = "delete_l2_table_entry_in", size_bits: 0x200, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        table_index, set_table_index: u32 [0xa8, 24];
    }
}

prm_struct! {
    /// DELETE_L2_TABLE_ENTRY output.
    pub struct DeleteL2TableEntryOut, mod delete_l2_table_entry_out = "delete_l2_table_entry_out", size_bits: 0x80, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
    }
}
