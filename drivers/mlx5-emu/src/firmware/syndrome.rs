//! The emulated firmware's command syndromes: one stable 32-bit number per check, so a
//! driver test can tell *which* check refused its command.
//!
//! Real syndromes are NVIDIA-internal and undocumented (mlx5.md §4.3, §12); these are the
//! emulator's own. Layout: `0x0e00_0000 | group << 12 | n` — the `0x0e` top byte marks
//! "emulator", the group is the command family (0 = command interface, 1 = HCA life cycle,
//! 2 = pages, 3 = capabilities, 4 = registers, 5 = resources, 6 = vport, 7 = RoCE
//! addresses, 8 = EQ, 9 = CQ, 0xa = MKey, 0xb = QP, 0xc = raw Ethernet objects, 0xd = flow
//! steering). Every value is listed
//! in docs/mlx5-emu.md (a unit test holds the two together).

macro_rules! syndromes {
    ($( $(#[$m:meta])* $name:ident = $value:literal => $text:literal, )*) => {
        $( $(#[$m])* pub const $name: u32 = $value; )*

        /// Every syndrome: (value, constant name, what the check refused).
        pub const ALL: &[(u32, &str, &str)] = &[ $( ($value, stringify!($name), $text), )* ];
    };
}

syndromes! {
    /// The opcode is not one this firmware executes.
    UNKNOWN_OPCODE = 0x0e00_0001 => "opcode not supported by this firmware",
    /// A command other than ENABLE_HCA before ENABLE_HCA.
    NOT_ENABLED = 0x0e00_0002 => "function not enabled (ENABLE_HCA first)",
    /// `inlen` shorter than the command's input structure.
    INPUT_TOO_SHORT = 0x0e00_0003 => "inlen shorter than the command's input",
    /// `outlen` shorter than the command's output structure.
    OUTPUT_TOO_SHORT = 0x0e00_0004 => "outlen shorter than the command's output",
    /// A nonzero `uid` (no DevX user contexts exist).
    UID_NOT_ZERO = 0x0e00_0005 => "uid must be 0 (no user contexts)",
    /// The command is valid only after INIT_HCA.
    NOT_INITIALIZED = 0x0e00_0006 => "HCA not initialized (INIT_HCA first)",
    /// The command is valid only before INIT_HCA.
    ALREADY_INITIALIZED = 0x0e00_0007 => "not allowed after INIT_HCA",
    /// A fault hook (`Faults::fail_next`) failed the command; the hook chose the syndrome
    /// unless it passed 0, which becomes this value.
    INJECTED = 0x0e00_00ff => "failed by a fault hook",

    /// ENABLE_HCA on an enabled function.
    ALREADY_ENABLED = 0x0e00_1001 => "ENABLE_HCA: function already enabled",
    /// `function_id` or `embedded_cpu_function` names another function.
    OTHER_FUNCTION = 0x0e00_1002 => "function_id/embedded_cpu_function/other_function must name this function (0)",
    /// DISABLE_HCA while initialized.
    DISABLE_WHILE_INITIALIZED = 0x0e00_1003 => "DISABLE_HCA: TEARDOWN_HCA first",
    /// DISABLE_HCA while the firmware still holds pages.
    DISABLE_PAGES_HELD = 0x0e00_1004 => "DISABLE_HCA: pages still given (reclaim them with MANAGE_PAGES take)",
    /// SET_ISSI with an unsupported value.
    ISSI_UNSUPPORTED = 0x0e00_1005 => "SET_ISSI: value not in supported_issi (0, 1)",
    /// INIT_HCA before SET_ISSI.
    INIT_WITHOUT_ISSI = 0x0e00_1006 => "INIT_HCA: SET_ISSI first",
    /// INIT_HCA before all boot pages were given.
    INIT_WITHOUT_BOOT_PAGES = 0x0e00_1007 => "INIT_HCA: boot pages missing",
    /// INIT_HCA before all init pages were given.
    INIT_WITHOUT_INIT_PAGES = 0x0e00_1008 => "INIT_HCA: init pages missing",
    /// TEARDOWN_HCA with an unsupported profile (no force/fast teardown caps).
    TEARDOWN_PROFILE = 0x0e00_1009 => "TEARDOWN_HCA: profile not supported (only 0, graceful)",
    /// TEARDOWN_HCA while UARs, PDs or transport domains are alive.
    TEARDOWN_OBJECTS_LIVE = 0x0e00_100a => "TEARDOWN_HCA: UARs/PDs/TDs still allocated",
    /// TEARDOWN_HCA on a function that is not initialized.
    TEARDOWN_NOT_INITIALIZED = 0x0e00_100b => "TEARDOWN_HCA: not initialized",

    /// QUERY_PAGES / MANAGE_PAGES `op_mod` out of range.
    PAGES_OP_MOD = 0x0e00_2001 => "QUERY_PAGES/MANAGE_PAGES: unknown op_mod",
    /// MANAGE_PAGES give/take with `input_num_entries` = 0.
    PAGES_ZERO = 0x0e00_2002 => "MANAGE_PAGES: input_num_entries is 0",
    /// MANAGE_PAGES give: `inlen` cannot hold `input_num_entries` addresses.
    PAGES_INPUT_TOO_SHORT = 0x0e00_2003 => "MANAGE_PAGES give: inlen < 0x10 + 8 * input_num_entries",
    /// MANAGE_PAGES take: `outlen` cannot hold `input_num_entries` addresses.
    PAGES_OUTPUT_TOO_SHORT = 0x0e00_2004 => "MANAGE_PAGES take: outlen < 0x10 + 8 * input_num_entries",
    /// A page address not 4 KiB aligned.
    PAGE_UNALIGNED = 0x0e00_2005 => "MANAGE_PAGES give: page address not 4 KiB aligned",
    /// A page the firmware already holds (or listed twice in one command).
    PAGE_ALREADY_GIVEN = 0x0e00_2006 => "MANAGE_PAGES give: page already given",
    /// A page the device cannot read and write through the driver's DMA mappings.
    PAGE_NOT_MAPPED = 0x0e00_2007 => "MANAGE_PAGES give: page not DMA-mapped read/write",
    /// More pages than the firmware accepts in total.
    PAGES_LIMIT = 0x0e00_2008 => "MANAGE_PAGES give: more than max_pages held",
    /// The command waited for pages (a PAGE_REQUEST) and the driver answered MANAGE_PAGES
    /// op_mod 0 (cannot give).
    PAGES_CANT_GIVE = 0x0e00_2009 => "the command waited for the pages of a PAGE_REQUEST and the driver answered MANAGE_PAGES CANT_GIVE",

    /// QUERY_HCA_CAP / SET_HCA_CAP of a capability type this firmware does not have.
    CAP_TYPE_UNSUPPORTED = 0x0e00_3001 => "QUERY/SET_HCA_CAP: capability type not supported (general 0, RoCE 4)",
    /// Capability commands before the boot pages were given.
    CAP_WITHOUT_BOOT_PAGES = 0x0e00_3002 => "QUERY/SET_HCA_CAP, ACCESS_REG: give the boot pages first",
    /// SET_HCA_CAP changed a field that is not settable.
    CAP_READ_ONLY = 0x0e00_3003 => "SET_HCA_CAP: a read-only field differs from its current value",
    /// SET_HCA_CAP set a field above its maximum.
    CAP_ABOVE_MAX = 0x0e00_3004 => "SET_HCA_CAP: a field above its maximum (QUERY_HCA_CAP op_mod max)",
    /// SET_HCA_CAP with the current bit (op_mod bit 0) set.
    CAP_SET_OP_MOD = 0x0e00_3005 => "SET_HCA_CAP: op_mod bit 0 must be 0",
    /// SET_HCA_CAP with nonzero bytes past the capability structure's own size.
    CAP_PAYLOAD = 0x0e00_3006 => "SET_HCA_CAP: bytes of the capability area past the structure (cmd_hca_cap/roce_cap, 0x100 bytes) must be zero",

    /// ACCESS_REG of a register this firmware does not implement.
    REGISTER_UNSUPPORTED = 0x0e00_4001 => "ACCESS_REG: register not supported (only HOST_ENDIANNESS 0x7004 and PTYS 0x5004)",
    /// ACCESS_REG `op_mod` neither write (0) nor read (1).
    REGISTER_OP_MOD = 0x0e00_4002 => "ACCESS_REG: op_mod must be 0 (write) or 1 (read)",
    /// ACCESS_REG: the register data does not fit `inlen`/`outlen`.
    REGISTER_LENGTH = 0x0e00_4003 => "ACCESS_REG: inlen/outlen shorter than 0x10 + register size",
    /// ACCESS_REG PTYS of a port other than 1.
    REGISTER_PORT = 0x0e00_4004 => "ACCESS_REG PTYS: local_port must be 1 (one port)",
    /// ACCESS_REG PTYS asking for other than the Ethernet fields on an Ethernet port.
    REGISTER_PROTO = 0x0e00_4005 => "ACCESS_REG PTYS: proto_mask must be Ethernet (bit 2) on this port",
    /// ACCESS_REG write of a register the emulator only reads.
    REGISTER_READ_ONLY = 0x0e00_4006 => "ACCESS_REG: PTYS is read-only here (op_mod 1)",

    /// DEALLOC_UAR of an index that is not a UAR page.
    UAR_INDEX = 0x0e00_5001 => "DEALLOC_UAR: index is not a UAR page",
    /// DEALLOC_UAR of a UAR page not allocated.
    UAR_NOT_ALLOCATED = 0x0e00_5002 => "DEALLOC_UAR: UAR not allocated",
    /// ALLOC_UAR with every UAR page in use.
    UAR_EXHAUSTED = 0x0e00_5003 => "ALLOC_UAR: no free UAR page",
    /// DEALLOC_PD of a PD not allocated.
    PD_NOT_ALLOCATED = 0x0e00_5004 => "DEALLOC_PD: PD not allocated",
    /// ALLOC_PD beyond 2^log_max_pd.
    PD_EXHAUSTED = 0x0e00_5005 => "ALLOC_PD: 2^log_max_pd PDs allocated",
    /// DEALLOC_TRANSPORT_DOMAIN of a domain not allocated.
    TD_NOT_ALLOCATED = 0x0e00_5006 => "DEALLOC_TRANSPORT_DOMAIN: not allocated",
    /// ALLOC_TRANSPORT_DOMAIN beyond 2^log_max_transport_domain.
    TD_EXHAUSTED = 0x0e00_5007 => "ALLOC_TRANSPORT_DOMAIN: 2^log_max_transport_domain allocated",

    /// A vport other than the function's own.
    OTHER_VPORT = 0x0e00_6001 => "vport commands: other_vport/vport_number must be 0",
    /// QUERY_VPORT_STATE `op_mod` neither vNIC (0) nor uplink (2).
    VPORT_STATE_OP_MOD = 0x0e00_6002 => "QUERY_VPORT_STATE: op_mod must be 0 or 2",
    /// MODIFY_NIC_VPORT_CONTEXT selected a field this firmware does not modify.
    VPORT_FIELD_UNSUPPORTED = 0x0e00_6003 => "MODIFY_NIC_VPORT_CONTEXT: field_select other than roce_en/mtu/addresses_list/promisc",
    /// MODIFY_NIC_VPORT_CONTEXT with an MTU out of range.
    VPORT_MTU = 0x0e00_6004 => "MODIFY_NIC_VPORT_CONTEXT: mtu outside 68..=9978",
    /// RoCE setup on an InfiniBand port.
    ROCE_ON_IB_PORT = 0x0e00_6005 => "MODIFY_NIC_VPORT_CONTEXT roce_en / SET_ROCE_ADDRESS: the port is InfiniBand (cap port_type 0); RoCE needs it in Ethernet mode",
    /// An address list of a type other than UC (0) or MC (1).
    VPORT_LIST_TYPE = 0x0e00_6007 => "MODIFY_NIC_VPORT_CONTEXT addresses_list: allowed_list_type must be 0 (UC) or 1 (MC)",
    /// An address list longer than the cap allows.
    VPORT_LIST_SIZE = 0x0e00_6008 => "MODIFY_NIC_VPORT_CONTEXT addresses_list: allowed_list_size above 2^log_max_current_{uc,mc}_list (128)",
    /// An address list whose entries the input does not hold.
    VPORT_LIST_LENGTH = 0x0e00_6009 => "MODIFY_NIC_VPORT_CONTEXT addresses_list: input shorter than the list's entries",
    /// A unicast address in the multicast list, or a group address in the unicast list.
    VPORT_LIST_ADDRESS = 0x0e00_600a => "MODIFY_NIC_VPORT_CONTEXT addresses_list: an address of the wrong kind for the list (unicast in MC, group in UC)",
    /// QUERY_VPORT_COUNTER with an op_mod or port this firmware does not count.
    VPORT_COUNTER_OP_MOD = 0x0e00_6006 => "QUERY_VPORT_COUNTER: op_mod must be 0 (vport counters) and port_num 0 or 1",
    /// DEALLOC_PD / DEALLOC_UAR while an object still uses it.
    RESOURCE_IN_USE = 0x0e00_5008 => "DEALLOC_PD/DEALLOC_UAR: an MKey, EQ, CQ or QP still uses it",

    /// GID table index at or above gid_table_size.
    GID_INDEX = 0x0e00_7001 => "SET/QUERY_ROCE_ADDRESS: roce_address_index >= gid_table_size (256)",
    /// vhca_port_num nonzero while num_vhca_ports is 0.
    GID_PORT = 0x0e00_7002 => "SET/QUERY_ROCE_ADDRESS: vhca_port_num must be 0 when num_vhca_ports is 0, else 1..=num_vhca_ports",
    /// A RoCE version other than 2.
    GID_VERSION = 0x0e00_7003 => "SET_ROCE_ADDRESS: roce_version must be 2 (RoCE v1 is not emulated)",
    /// l3 type does not match the address (IPv4-mapped for IPv4).
    GID_L3_TYPE = 0x0e00_7004 => "SET_ROCE_ADDRESS: roce_l3_type does not match the GID (IPv4 = ::ffff:a.b.c.d, IPv6 otherwise)",
    /// The source MAC is not the function's.
    GID_MAC = 0x0e00_7005 => "SET_ROCE_ADDRESS: source MAC is not the function's permanent address",
    /// VLANs are not emulated.
    GID_VLAN = 0x0e00_7006 => "SET_ROCE_ADDRESS: vlan_valid set (VLANs are not emulated)",
    /// The address could not be bound (UDP/4791).
    GID_BIND = 0x0e00_7007 => "SET_ROCE_ADDRESS: binding UDP/4791 on the address failed (see the log)",
    /// RoCE disabled in the NIC vport context.
    ROCE_DISABLED = 0x0e00_7008 => "SET_ROCE_ADDRESS: roce_en is 0 (MODIFY_NIC_VPORT_CONTEXT roce_en first)",
    /// The GID entry is used by a QP.
    GID_IN_USE = 0x0e00_7009 => "SET_ROCE_ADDRESS: the entry is the source address of a QP past INIT",

    /// No free EQ number.
    EQ_EXHAUSTED = 0x0e00_8001 => "CREATE_EQ: 2^log_max_eq EQs exist",
    /// log_eq_size above log_max_eq_sz (or 0).
    EQ_SIZE = 0x0e00_8002 => "CREATE_EQ: log_eq_size 0 or above log_max_eq_sz",
    /// The UAR page is not allocated.
    EQ_UAR = 0x0e00_8003 => "CREATE_EQ/CREATE_CQ/CREATE_QP: uar_page not allocated",
    /// MSI-X vector out of range.
    EQ_VECTOR = 0x0e00_8004 => "CREATE_EQ: intr is not an MSI-X vector of the function (0..64)",
    /// pas[] too short, misaligned, or page_offset nonzero.
    QUEUE_PAS = 0x0e00_8005 => "CREATE_EQ/CQ/QP: pas[] shorter than the queue, an entry not page aligned, page_offset nonzero, or log_page_size too large",
    /// Not an EQ.
    EQ_NOT_FOUND = 0x0e00_8006 => "DESTROY_EQ/CREATE_CQ: no such EQ",
    /// A CQ still reports to the EQ.
    EQ_IN_USE = 0x0e00_8007 => "DESTROY_EQ: a CQ still names this EQ",
    /// Non-zero status / unsupported context bit.
    QUEUE_CONTEXT = 0x0e00_8008 => "CREATE_EQ/CQ: status nonzero, umem, CQE compression or a CQE size other than 64 bytes",

    /// No free CQ number.
    CQ_EXHAUSTED = 0x0e00_9001 => "CREATE_CQ: 2^log_max_cq CQs exist",
    /// log_cq_size above the cap.
    CQ_SIZE = 0x0e00_9002 => "CREATE_CQ: log_cq_size above log_max_cq_sz",
    /// dbr_addr not 8-byte aligned.
    DBR_ALIGN = 0x0e00_9003 => "CREATE_CQ/CREATE_QP: dbr_addr not 8-byte aligned",
    /// Not a CQ.
    CQ_NOT_FOUND = 0x0e00_9004 => "DESTROY_CQ/CREATE_QP: no such CQ",
    /// A QP, SQ or RQ still reports to the CQ.
    CQ_IN_USE = 0x0e00_9005 => "DESTROY_CQ: a QP, SQ or RQ still names this CQ",
    /// CREATE_CQ whose inlen lists more pas[] entries than the ring has pages.
    CQ_PAS_LENGTH = 0x0e00_9006 => "CREATE_CQ: pas[] (inlen) lists more pages than the CQ ring has",

    /// No free MKey index.
    MKEY_EXHAUSTED = 0x0e00_a001 => "CREATE_MKEY: 2^log_max_mkey MKeys exist",
    /// Access mode other than PA or MTT.
    MKEY_ACCESS_MODE = 0x0e00_a002 => "CREATE_MKEY: access mode other than PA (0) or MTT (1)",
    /// The PD does not exist.
    MKEY_PD = 0x0e00_a003 => "CREATE_MKEY/CREATE_QP: pd not allocated",
    /// MTT translation short or malformed.
    MKEY_MTT = 0x0e00_a004 => "CREATE_MKEY: translations do not cover start_addr..+len, an entry is not page aligned or lacks rd_en, or log_page_size outside 12..=30",
    /// Unsupported mkc bits.
    MKEY_CONTEXT = 0x0e00_a005 => "CREATE_MKEY: lr clear, free set, qpn bound, umem or umr_en set, or length 0",
    /// Not an MKey.
    MKEY_NOT_FOUND = 0x0e00_a006 => "DESTROY_MKEY: no such MKey",

    /// No free QPN.
    QP_EXHAUSTED = 0x0e00_b001 => "CREATE_QP: 2^log_max_qp QPs exist",
    /// Service type unsupported.
    QP_TYPE = 0x0e00_b002 => "CREATE_QP: st other than RC (0) or UD (2)",
    /// Queue sizes.
    QP_SIZE = 0x0e00_b003 => "CREATE_QP: log_sq_size/log_rq_size above log_max_qp_sz, RQ stride above max_wqe_sz_rq, or an unsupported rq_type",
    /// Unsupported context bits.
    QP_CONTEXT = 0x0e00_b004 => "CREATE_QP: pm_state not migrated (3), umem, ts_format real-time, cs_req/cs_res or input_qpn set",
    /// Not a QP.
    QP_NOT_FOUND = 0x0e00_b005 => "QP command: no such QP",
    /// The address path is unusable.
    QP_PATH = 0x0e00_b006 => "INIT2RTR: src_addr_index not a bound RoCE v2 GID, rgid of another L3 type, or udp_sport outside the RoCE cap range",
    /// Bad transition attribute.
    QP_ATTR = 0x0e00_b007 => "QP transition: mtu invalid or larger than the vport MTU allows, log_msg_max/log_sra_max/log_rra_max above caps, pkey_index or port invalid",
    /// The engine memory budget is spent.
    QP_MEMORY = 0x0e00_b009 => "CREATE_QP/CQ/EQ/MKEY: the firmware's object memory (256 MiB: transport rings, page lists, MTTs) is spent",
    /// Transition illegal from the current state.
    QP_STATE = 0x0e00_b008 => "QP transition not legal from the QP's current state",
    /// A UD QP modified without a valid MTU.
    UD_MTU = 0x0e00_b00a => "UD QP modify: mtu must be 1..=5 (256..4096) on every transition",
    /// A UD QP modified with log_msg_max above the cap.
    UD_MSG_MAX = 0x0e00_b00b => "UD QP modify: log_msg_max above the cap log_max_msg",
    /// Atomics asked of a device without the atomic capability.
    QP_ATOMIC = 0x0e00_b00c => "QP modify: rae or atomic_mode set but the device has no atomic capability (cap atomic 0)",
    /// ts_format the RoCE cap does not allow.
    QP_TS_FORMAT = 0x0e00_b00d => "CREATE_QP: ts_format not allowed by the RoCE cap qp_ts_format (0 free-running only, 1 real-time only, 2 both)",

    /// No free TIS number.
    TIS_EXHAUSTED = 0x0e00_c001 => "CREATE_TIS: 2^log_max_tis TISes exist",
    /// Not a TIS.
    TIS_NOT_FOUND = 0x0e00_c002 => "DESTROY_TIS/CREATE_SQ: no such TIS",
    /// Unsupported TIS context bits.
    TIS_CONTEXT = 0x0e00_c003 => "CREATE_TIS: strict_lag_tx_port_affinity, tls_en, lag_tx_port_affinity, underlay_qpn or pd set, or prio above 7",
    /// The transport domain is not allocated.
    TD_UNKNOWN = 0x0e00_c004 => "CREATE_TIS/CREATE_TIR: transport_domain not allocated",
    /// An SQ names the TIS.
    TIS_IN_USE = 0x0e00_c005 => "DESTROY_TIS: an SQ still names this TIS",
    /// No free SQ number.
    SQ_EXHAUSTED = 0x0e00_c006 => "CREATE_SQ: 2^log_max_sq SQs exist (or the QP number space is full)",
    /// Not an SQ.
    SQ_NOT_FOUND = 0x0e00_c007 => "MODIFY/DESTROY/QUERY_SQ: no such SQ",
    /// Unsupported SQ context bits.
    SQ_CONTEXT = 0x0e00_c008 => "CREATE_SQ: state not RST, tis_lst_sz not 1, hairpin/non_wire/rlky/cd_master/fre/multi-packet/reg_umr/swp/rate limit/QoS group set, or ts_format not allowed by cap sq_ts_format",
    /// The SQ would inline fewer headers than the port requires.
    SQ_INLINE = 0x0e00_c009 => "CREATE_SQ: min_wqe_inline_mode below what the port requires (Ethernet cap wqe_inline_mode: the vport context's min_wqe_inline_mode) or above 3",
    /// Unsupported work queue.
    WQ_CONTEXT = 0x0e00_c00a => "CREATE_SQ/CREATE_RQ: wq_type not cyclic, umem, signature, end padding, cd_slave, striding, log_wq_sz above log_max_wq_sz, or log_wq_stride not 6 (SQ) / 4..=log2(max_wqe_sz_rq) (RQ)",
    /// The transition is not legal from the current state (or the current state named is not
    /// the queue's).
    WQ_STATE = 0x0e00_c00b => "MODIFY_SQ/MODIFY_RQ: sq_state/rq_state is not the queue's state, or the transition is not RST→RDY, RDY→ERR, RDY→RST or ERR→RST",
    /// A modify_bitmask this firmware does not modify.
    WQ_BITMASK = 0x0e00_c00c => "MODIFY_SQ: modify_bitmask must be 0; MODIFY_RQ: only vsd (bit 1)",
    /// No free RQ number.
    RQ_EXHAUSTED = 0x0e00_c00d => "CREATE_RQ: 2^log_max_rq RQs exist (or the QP number space is full)",
    /// Not an RQ.
    RQ_NOT_FOUND = 0x0e00_c00e => "MODIFY/DESTROY/QUERY_RQ: no such RQ",
    /// Unsupported RQ context bits.
    RQ_CONTEXT = 0x0e00_c00f => "CREATE_RQ: state not RST, mem_rq_type not inline, rlky/delay_drop/scatter_fcs/hairpin/counter_set_id/rmpn set, or ts_format not allowed by cap rq_ts_format",
    /// A TIR names the RQ.
    RQ_IN_USE = 0x0e00_c011 => "DESTROY_RQ: a TIR still dispatches to this RQ",
    /// No free TIR number.
    TIR_EXHAUSTED = 0x0e00_c012 => "CREATE_TIR: 2^log_max_tir TIRs exist",
    /// Not a TIR.
    TIR_NOT_FOUND = 0x0e00_c013 => "DESTROY/QUERY_TIR: no such TIR",
    /// Unsupported TIR context.
    TIR_CONTEXT = 0x0e00_c014 => "CREATE_TIR: disp_type not direct (no RQ tables), or hashing, LRO, TLS or tunnel offload set",
    /// The TIR's RQ does not exist.
    TIR_RQ = 0x0e00_c015 => "CREATE_TIR: inline_rqn is not an RQ",
    /// A flow table entry forwards to the TIR.
    TIR_IN_USE = 0x0e00_c016 => "DESTROY_TIR: a flow table entry forwards to this TIR",
    /// A TIS or TIR names the transport domain.
    TD_IN_USE = 0x0e00_c017 => "DEALLOC_TRANSPORT_DOMAIN: a TIS or TIR still names it",

    /// A table type other than NIC RX.
    FLOW_TABLE_TYPE = 0x0e00_d001 => "flow commands: table_type must be 0 (NIC RX, the only type flow_table_nic_cap supports)",
    /// Another vport or eswitch named.
    FLOW_VPORT = 0x0e00_d002 => "flow commands: other_vport, vport_number, other_eswitch and eswitch_owner_vhca_id must be 0",
    /// Unsupported flow table context.
    FLOW_TABLE_CONTEXT = 0x0e00_d003 => "CREATE_FLOW_TABLE: reformat_en, decap_en, sw_owner, termination_table, rtc_valid or a miss table set, or table_miss_action not default",
    /// Level above the cap.
    FLOW_TABLE_LEVEL = 0x0e00_d004 => "CREATE_FLOW_TABLE: level above max_ft_level",
    /// Size above the cap.
    FLOW_TABLE_SIZE = 0x0e00_d005 => "CREATE_FLOW_TABLE: log_size above log_max_ft_size",
    /// Too many tables.
    FLOW_TABLE_EXHAUSTED = 0x0e00_d006 => "CREATE_FLOW_TABLE: 2^log_max_ft_num tables exist",
    /// Not a flow table.
    FLOW_TABLE_NOT_FOUND = 0x0e00_d007 => "flow commands: table_id is not a flow table",
    /// The table is the root.
    FLOW_TABLE_IS_ROOT = 0x0e00_d008 => "DESTROY_FLOW_TABLE: the table is the root (SET_FLOW_TABLE_ROOT another table, or op_mod 1, first)",
    /// The table still has groups.
    FLOW_TABLE_HAS_GROUPS = 0x0e00_d009 => "DESTROY_FLOW_TABLE: the table still has flow groups",
    /// An entry forwards to the table.
    FLOW_TABLE_IN_USE = 0x0e00_d00a => "DESTROY_FLOW_TABLE: an entry of another table forwards to it",
    /// Group range outside the table.
    FLOW_GROUP_RANGE = 0x0e00_d00b => "CREATE_FLOW_GROUP: start_flow_index > end_flow_index, or end_flow_index outside the table (2^log_size)",
    /// Group range overlaps another.
    FLOW_GROUP_OVERLAP = 0x0e00_d00c => "CREATE_FLOW_GROUP: the index range overlaps another group of the table",
    /// Criteria the port cannot match.
    FLOW_CRITERIA_UNSUPPORTED = 0x0e00_d00d => "CREATE_FLOW_GROUP: match_criteria_enable other than outer headers (bit 0) and misc set 3 (bit 4), or mask bits in fields the port does not match (ft_field_support, flex_parser_protocols)",
    /// Mask bits in a set not enabled.
    FLOW_CRITERIA_NOT_ENABLED = 0x0e00_d00e => "CREATE_FLOW_GROUP: mask bits in a criteria set match_criteria_enable does not enable",
    /// A group type this firmware lacks.
    FLOW_GROUP_TYPE = 0x0e00_d00f => "CREATE_FLOW_GROUP: group_type, match_definer_id or source_eswitch_owner_vhca_id_valid set",
    /// Not a flow group.
    FLOW_GROUP_NOT_FOUND = 0x0e00_d010 => "DESTROY_FLOW_GROUP/SET_FLOW_TABLE_ENTRY: group_id is not a group of the table",
    /// The group still has entries.
    FLOW_GROUP_HAS_ENTRIES = 0x0e00_d011 => "DESTROY_FLOW_GROUP: the group still has entries",
    /// Flow index outside the group.
    FLOW_INDEX = 0x0e00_d012 => "SET_FLOW_TABLE_ENTRY: flow_index outside its group's start..=end",
    /// An entry already at the index.
    FLOW_ENTRY_EXISTS = 0x0e00_d013 => "SET_FLOW_TABLE_ENTRY: an entry is at flow_index (delete it first)",
    /// Value bits outside the group's mask.
    FLOW_VALUE_OUTSIDE_MASK = 0x0e00_d014 => "SET_FLOW_TABLE_ENTRY: match_value has bits outside the group's match_criteria",
    /// Same match as another entry.
    FLOW_ENTRY_DUPLICATE = 0x0e00_d015 => "SET_FLOW_TABLE_ENTRY: another entry of the group has the same match_value",
    /// Unsupported action.
    FLOW_ACTION = 0x0e00_d016 => "SET_FLOW_TABLE_ENTRY: action must be FWD_DEST (4) or DROP (2), without flow counters",
    /// Bad destination count.
    FLOW_DEST_COUNT = 0x0e00_d017 => "SET_FLOW_TABLE_ENTRY: FWD_DEST with 0 or more than 2^log_max_destination destinations, or destinations without FWD_DEST",
    /// Bad destination type.
    FLOW_DEST_TYPE = 0x0e00_d018 => "SET_FLOW_TABLE_ENTRY: destination type other than TIR (2) or flow table (1), or reformat/eswitch fields set",
    /// No such TIR.
    FLOW_DEST_TIR = 0x0e00_d019 => "SET_FLOW_TABLE_ENTRY: a TIR destination is not a TIR",
    /// Bad destination table.
    FLOW_DEST_TABLE = 0x0e00_d01a => "SET_FLOW_TABLE_ENTRY: a table destination is not a table of a higher level",
    /// The input does not hold the destination list.
    FLOW_DEST_LENGTH = 0x0e00_d01b => "SET_FLOW_TABLE_ENTRY: inlen shorter than the flow context plus 16 bytes per destination",
    /// No such entry.
    FLOW_ENTRY_NOT_FOUND = 0x0e00_d01c => "DELETE/QUERY_FLOW_TABLE_ENTRY: no entry at flow_index",
    /// Modifying entries is not supported.
    FLOW_ENTRY_OP_MOD = 0x0e00_d01d => "SET_FLOW_TABLE_ENTRY: op_mod / modify_enable_mask must be 0 (entries are not modified in place: flow_modify_en 0)",
    /// SET_FLOW_TABLE_ROOT fields this firmware lacks.
    FLOW_ROOT_OP_MOD = 0x0e00_d01e => "SET_FLOW_TABLE_ROOT: op_mod other than 0 (set) or 1 (disconnect, table_id 0), or underlay_qpn / another vport's table named",
    /// Unsupported flow context fields.
    FLOW_ENTRY_CONTEXT = 0x0e00_d01f => "SET_FLOW_TABLE_ENTRY: push_vlan, extended_destination, hairpin, flow_source, encryption, packet reformat, modify header or ignore_flow_level set",
}

/// The description of `syndrome`, if it is one of ours.
pub fn describe(syndrome: u32) -> Option<&'static str> {
    ALL.iter().find(|s| s.0 == syndrome).map(|s| s.2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syndromes_are_unique_nonzero_and_documented() {
        let doc = include_str!("../../../../docs/mlx5-emu.md").to_ascii_lowercase();
        for (i, (v, name, _)) in ALL.iter().enumerate() {
            assert_ne!(*v, 0, "{name}");
            assert!(ALL[..i].iter().all(|o| o.0 != *v), "{name} duplicated");
            let hex = format!("0x{:04x}_{:04x}", v >> 16, v & 0xffff);
            assert!(
                doc.contains(&hex) && doc.contains(&name.to_ascii_lowercase()),
                "{name} ({hex}) missing from docs/mlx5-emu.md"
            );
        }
        assert_eq!(
            describe(PAGE_ALREADY_GIVEN),
            Some("MANAGE_PAGES give: page already given")
        );
    }
}
