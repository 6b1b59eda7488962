//! Raw PRM constants, kept apart from logic. Every value names its source section in
//! `mlx5.md` (the reference notes in `shared/reference/`); values that mlx5.md does not
//! tabulate say where they come from instead.

/// Declares a wire-code enum with an `Unknown(raw)` variant, `from_raw` / `as_raw`, a
/// `name` and a `Display` that prints the name (or `unknown (0x..)`).
macro_rules! wire_enum {
    (
        $(#[$attr:meta])*
        pub enum $name:ident : $raw:ty {
            $( $(#[$vattr:meta])* $variant:ident = $value:literal => $text:literal, )*
        }
    ) => {
        $(#[$attr])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum $name {
            $( $(#[$vattr])* $variant, )*
            /// A value this table does not name (kept, never dropped).
            Unknown($raw),
        }

        impl $name {
            /// Every named value, in table order.
            pub const ALL: &'static [$name] = &[$($name::$variant),*];

            /// From the raw value.
            pub const fn from_raw(raw: $raw) -> Self {
                match raw {
                    $( $value => $name::$variant, )*
                    other => $name::Unknown(other),
                }
            }

            /// The raw value.
            pub const fn as_raw(self) -> $raw {
                match self {
                    $( $name::$variant => $value, )*
                    $name::Unknown(raw) => raw,
                }
            }

            /// The name from the source table; `None` for `Unknown`.
            pub const fn name(self) -> Option<&'static str> {
                match self {
                    $( $name::$variant => Some($text), )*
                    $name::Unknown(_) => None,
                }
            }
        }

        impl From<$raw> for $name {
            fn from(raw: $raw) -> Self {
                Self::from_raw(raw)
            }
        }

        impl core::fmt::Display for $name {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                match self.name() {
                    Some(text) => f.write_str(text),
                    None => write!(f, "unknown ({:#x})", self.as_raw()),
                }
            }
        }
    };
}

wire_enum! {
    /// Command opcodes (mlx5.md §5.1, K `MLX5_CMD_OP_*`; the raw Ethernet and flow steering
    /// ones, 0x770 and 0x900.., from K `mlx5_ifc.h` alone).
    pub enum CmdOpcode: u16 {
        QueryHcaCap = 0x100 => "QUERY_HCA_CAP",
        QueryAdapter = 0x101 => "QUERY_ADAPTER",
        InitHca = 0x102 => "INIT_HCA",
        TeardownHca = 0x103 => "TEARDOWN_HCA",
        EnableHca = 0x104 => "ENABLE_HCA",
        DisableHca = 0x105 => "DISABLE_HCA",
        QueryPages = 0x107 => "QUERY_PAGES",
        ManagePages = 0x108 => "MANAGE_PAGES",
        SetHcaCap = 0x109 => "SET_HCA_CAP",
        QueryIssi = 0x10a => "QUERY_ISSI",
        SetIssi = 0x10b => "SET_ISSI",
        SetDriverVersion = 0x10d => "SET_DRIVER_VERSION",
        CreateMkey = 0x200 => "CREATE_MKEY",
        QueryMkey = 0x201 => "QUERY_MKEY",
        DestroyMkey = 0x202 => "DESTROY_MKEY",
        QuerySpecialContexts = 0x203 => "QUERY_SPECIAL_CONTEXTS",
        CreateEq = 0x301 => "CREATE_EQ",
        DestroyEq = 0x302 => "DESTROY_EQ",
        QueryEq = 0x303 => "QUERY_EQ",
        CreateCq = 0x400 => "CREATE_CQ",
        DestroyCq = 0x401 => "DESTROY_CQ",
        QueryCq = 0x402 => "QUERY_CQ",
        ModifyCq = 0x403 => "MODIFY_CQ",
        CreateQp = 0x500 => "CREATE_QP",
        DestroyQp = 0x501 => "DESTROY_QP",
        Rst2InitQp = 0x502 => "RST2INIT_QP",
        Init2RtrQp = 0x503 => "INIT2RTR_QP",
        Rtr2RtsQp = 0x504 => "RTR2RTS_QP",
        Rts2RtsQp = 0x505 => "RTS2RTS_QP",
        Sqerr2RtsQp = 0x506 => "SQERR2RTS_QP",
        Qp2Err = 0x507 => "2ERR_QP",
        Qp2Rst = 0x50a => "2RST_QP",
        QueryQp = 0x50b => "QUERY_QP",
        SqdRtsQp = 0x50c => "SQD_RTS_QP",
        Init2InitQp = 0x50e => "INIT2INIT_QP",
        QueryVportState = 0x750 => "QUERY_VPORT_STATE",
        QueryNicVportContext = 0x754 => "QUERY_NIC_VPORT_CONTEXT",
        ModifyNicVportContext = 0x755 => "MODIFY_NIC_VPORT_CONTEXT",
        QueryRoceAddress = 0x760 => "QUERY_ROCE_ADDRESS",
        SetRoceAddress = 0x761 => "SET_ROCE_ADDRESS",
        QueryHcaVportContext = 0x762 => "QUERY_HCA_VPORT_CONTEXT",
        QueryHcaVportGid = 0x764 => "QUERY_HCA_VPORT_GID",
        AllocPd = 0x800 => "ALLOC_PD",
        DeallocPd = 0x801 => "DEALLOC_PD",
        AllocUar = 0x802 => "ALLOC_UAR",
        DeallocUar = 0x803 => "DEALLOC_UAR",
        AccessReg = 0x805 => "ACCESS_REG",
        Nop = 0x80d => "NOP",
        AllocTransportDomain = 0x816 => "ALLOC_TRANSPORT_DOMAIN",
        DeallocTransportDomain = 0x817 => "DEALLOC_TRANSPORT_DOMAIN",
        SetL2TableEntry = 0x829 => "SET_L2_TABLE_ENTRY",
        DeleteL2TableEntry = 0x82b => "DELETE_L2_TABLE_ENTRY",
        QueryVportCounter = 0x770 => "QUERY_VPORT_COUNTER",
        CreateTir = 0x900 => "CREATE_TIR",
        ModifyTir = 0x901 => "MODIFY_TIR",
        DestroyTir = 0x902 => "DESTROY_TIR",
        QueryTir = 0x903 => "QUERY_TIR",
        CreateSq = 0x904 => "CREATE_SQ",
        ModifySq = 0x905 => "MODIFY_SQ",
        DestroySq = 0x906 => "DESTROY_SQ",
        QuerySq = 0x907 => "QUERY_SQ",
        CreateRq = 0x908 => "CREATE_RQ",
        ModifyRq = 0x909 => "MODIFY_RQ",
        DestroyRq = 0x90a => "DESTROY_RQ",
        QueryRq = 0x90b => "QUERY_RQ",
        CreateTis = 0x912 => "CREATE_TIS",
        ModifyTis = 0x913 => "MODIFY_TIS",
        DestroyTis = 0x914 => "DESTROY_TIS",
        QueryTis = 0x915 => "QUERY_TIS",
        SetFlowTableRoot = 0x92f => "SET_FLOW_TABLE_ROOT",
        CreateFlowTable = 0x930 => "CREATE_FLOW_TABLE",
        DestroyFlowTable = 0x931 => "DESTROY_FLOW_TABLE",
        QueryFlowTable = 0x932 => "QUERY_FLOW_TABLE",
        CreateFlowGroup = 0x933 => "CREATE_FLOW_GROUP",
        DestroyFlowGroup = 0x934 => "DESTROY_FLOW_GROUP",
        QueryFlowGroup = 0x935 => "QUERY_FLOW_GROUP",
        SetFlowTableEntry = 0x936 => "SET_FLOW_TABLE_ENTRY",
        QueryFlowTableEntry = 0x937 => "QUERY_FLOW_TABLE_ENTRY",
        DeleteFlowTableEntry = 0x938 => "DELETE_FLOW_TABLE_ENTRY",
        ModifyFlowTable = 0x93c => "MODIFY_FLOW_TABLE",
    }
}

wire_enum! {
    /// Command status, output byte 0 (mlx5.md §4.3, K `MLX5_CMD_STAT_*`).
    pub enum CmdStatus: u8 {
        Ok = 0x00 => "OK",
        IntErr = 0x01 => "INT_ERR (internal error)",
        BadOp = 0x02 => "BAD_OP (unsupported opcode)",
        BadParam = 0x03 => "BAD_PARAM (bad parameter)",
        BadSysState = 0x04 => "BAD_SYS_STATE (bad system state)",
        BadRes = 0x05 => "BAD_RES (bad resource)",
        ResBusy = 0x06 => "RES_BUSY (resource busy)",
        /// K only (mlx5.md §4.3).
        NotReady = 0x07 => "NOT_READY",
        ExceedLim = 0x08 => "EXCEED_LIM (limits exceeded)",
        BadResState = 0x09 => "BAD_RES_STATE (bad resource state)",
        BadIndex = 0x0a => "BAD_INDEX (bad index)",
        NoRes = 0x0f => "NO_RES (no resources)",
        BadQpState = 0x10 => "BAD_QP_STATE (bad QP state)",
        BadPkt = 0x30 => "BAD_PKT (bad packet)",
        BadSize = 0x40 => "BAD_SIZE (bad size / too many outstanding CQEs)",
        BadInpLen = 0x50 => "BAD_INP_LEN (bad input length)",
        BadOutpLen = 0x51 => "BAD_OUTP_LEN (bad output length)",
    }
}

wire_enum! {
    /// Delivery status of a command entry, `status_own >> 1` (mlx5.md §4.3, K `cmd.c`).
    pub enum DeliveryStatus: u8 {
        Ok = 0x00 => "OK",
        SignatureErr = 0x01 => "signature error",
        TokenErr = 0x02 => "token error",
        BadBlockNumber = 0x03 => "bad block number",
        OutputPointerNotAligned = 0x04 => "output pointer not aligned to block size",
        InputPointerNotAligned = 0x05 => "input pointer not aligned to block size",
        FwInternalErr = 0x06 => "firmware internal error",
        InputLenErr = 0x07 => "command input length error",
        OutputLenErr = 0x08 => "command output length error",
        ReservedNotZero = 0x09 => "reserved fields not cleared",
        BadCmdType = 0x10 => "bad command descriptor type",
    }
}

/// `cmd_queue_entry.type` for the PCIe command transport (mlx5.md §4.1, `MLX5_PCI_CMD_XPORT`).
pub const CMD_TYPE_PCIE: u32 = 0x07;
/// Bytes of command input/output carried inline in the entry (mlx5.md §4.2).
pub const CMD_INLINE_BYTES: usize = 16;
/// Data bytes per mailbox block (mlx5.md §4.2).
pub const MAILBOX_DATA_BYTES: usize = 512;
/// Mailbox alignment: delivery status 0x4/0x5 otherwise; ≥ 1 KiB (mlx5.md §4.2).
pub const MAILBOX_ALIGN: usize = 1024;
/// The command interface revision the driver requires, `cmdif_rev_fw_sub >> 16` (mlx5.md §3 step 1).
pub const CMD_INTERFACE_REV: u32 = 5;
/// Most command slots: `1 << log_cmdq_size` ≤ 32 (mlx5.md §3 step 3, §4.3).
pub const MAX_CMD_SLOTS: usize = 32;

wire_enum! {
    /// QP states as `qpc.state` carries them. mlx5.md does not tabulate these values; they
    /// are K `qp.h` `enum mlx5_qp_state` (RST..ERR agree with ifc `MLX5_QPC_STATE_*`). The
    /// SQD code conflicts: ifc 7, qp.h 5 with SQ_DRAINING 7 (mlx5.md §12); qp.h kept.
    pub enum QpState: u8 {
        Rst = 0 => "RST",
        Init = 1 => "INIT",
        Rtr = 2 => "RTR",
        Rts = 3 => "RTS",
        Sqer = 4 => "SQER",
        Sqd = 5 => "SQD",
        Err = 6 => "ERR",
        SqDraining = 7 => "SQ_DRAINING",
    }
}

wire_enum! {
    /// `qpc.st`, the service type (mlx5.md §7.3).
    pub enum QpServiceType: u8 {
        Rc = 0 => "RC",
        Uc = 1 => "UC",
        Ud = 2 => "UD",
        Xrc = 3 => "XRC",
        Dci = 5 => "DCI",
        Qp1 = 8 => "QP1",
    }
}

/// `qpc.pm_state` = migrated, always used (mlx5.md §7.3).
pub const QP_PM_STATE_MIGRATED: u32 = 3;
/// `qpc.mtu` codes 1..=5 = 256..4096 bytes (mlx5.md §7.3): `256 << (code - 1)`.
pub const QP_MTU_256: u32 = 1;
/// See [`QP_MTU_256`].
pub const QP_MTU_512: u32 = 2;
/// See [`QP_MTU_256`].
pub const QP_MTU_1024: u32 = 3;
/// See [`QP_MTU_256`].
pub const QP_MTU_2048: u32 = 4;
/// See [`QP_MTU_256`].
pub const QP_MTU_4096: u32 = 5;
/// `qpc.rq_type`: regular RQ (mlx5.md §7.3).
pub const RQ_TYPE_REGULAR: u32 = 0;
/// `qpc.rq_type`: SRQ.
pub const RQ_TYPE_SRQ: u32 = 1;
/// `qpc.rq_type`: zero-length RQ.
pub const RQ_TYPE_ZERO_SIZE: u32 = 3;
/// `qpc.atomic_mode`: IB-compatible (mlx5.md §7.3, K `driver.h`).
pub const ATOMIC_MODE_IB_COMP: u32 = 1;
/// `qpc.atomic_mode`: ConnectX mode.
pub const ATOMIC_MODE_CX: u32 = 2;
/// `qpc.atomic_mode`: 8-byte.
pub const ATOMIC_MODE_8B: u32 = 3;
/// `qpc.ts_format`: free-running (mlx5.md §7.3).
pub const TS_FORMAT_FREE_RUNNING: u32 = 0;
/// `qpc.ts_format`: default.
pub const TS_FORMAT_DEFAULT: u32 = 1;
/// `qpc.ts_format`: real-time.
pub const TS_FORMAT_REAL_TIME: u32 = 2;
/// `qpc.log_ack_req_freq` the kernel uses (mlx5.md §7.4).
pub const LOG_ACK_REQ_FREQ_DEFAULT: u32 = 8;

/// `opt_param_mask` bits (mlx5.md §7.3, K `qp.h` `enum mlx5_qp_optpar`).
pub mod qp_optpar {
    /// Alternate address path.
    pub const ALT_ADDR_PATH: u32 = 1 << 0;
    /// Remote read enable.
    pub const RRE: u32 = 1 << 1;
    /// Remote atomic enable.
    pub const RAE: u32 = 1 << 2;
    /// Remote write enable.
    pub const RWE: u32 = 1 << 3;
    /// P_Key index.
    pub const PKEY_INDEX: u32 = 1 << 4;
    /// Q_Key.
    pub const Q_KEY: u32 = 1 << 5;
    /// RNR timeout.
    pub const RNR_TIMEOUT: u32 = 1 << 6;
    /// Primary address path.
    pub const PRIMARY_ADDR_PATH: u32 = 1 << 7;
    /// SRA max.
    pub const SRA_MAX: u32 = 1 << 8;
    /// RRA max.
    pub const RRA_MAX: u32 = 1 << 9;
    /// PM state.
    pub const PM_STATE: u32 = 1 << 10;
    /// Retry count.
    pub const RETRY_COUNT: u32 = 1 << 12;
    /// RNR retry.
    pub const RNR_RETRY: u32 = 1 << 13;
    /// ACK timeout.
    pub const ACK_TIMEOUT: u32 = 1 << 14;
    /// LAG TX affinity.
    pub const LAG_TX_AFF: u32 = 1 << 15;
    /// Primary port.
    pub const PRI_PORT: u32 = 1 << 16;
    /// Primary address path DSCP.
    pub const PRIMARY_ADDR_PATH_DSCP: u32 = 1 << 17;
    /// RMPN / XRQN.
    pub const RMPN_XRQN: u32 = 1 << 18;
    /// Receive CQN.
    pub const CQN_RCV: u32 = 1 << 19;
    /// Offload type.
    pub const OFFLOAD_TYPE: u32 = 1 << 24;
    /// Counter set id.
    pub const COUNTER_SET_ID: u32 = 1 << 25;
}

wire_enum! {
    /// Send WQE opcodes, `wqe_ctrl_seg.opcode` (mlx5.md §9.2).
    pub enum WqeOpcode: u8 {
        Nop = 0x00 => "NOP",
        SendInval = 0x01 => "SEND_INVAL",
        RdmaWrite = 0x08 => "RDMA_WRITE",
        RdmaWriteImm = 0x09 => "RDMA_WRITE_IMM",
        Send = 0x0a => "SEND",
        SendImm = 0x0b => "SEND_IMM",
        Lso = 0x0e => "LSO",
        RdmaRead = 0x10 => "RDMA_READ",
        AtomicCs = 0x11 => "ATOMIC_CS",
        AtomicFa = 0x12 => "ATOMIC_FA",
        AtomicMaskedCs = 0x14 => "ATOMIC_MASKED_CS",
        AtomicMaskedFa = 0x15 => "ATOMIC_MASKED_FA",
        BindMw = 0x18 => "BIND_MW",
        LocalInval = 0x1b => "LOCAL_INVAL",
        Umr = 0x25 => "UMR",
    }
}

wire_enum! {
    /// `fm_ce_se` [7:5], the fence mode (mlx5.md §9.1).
    pub enum FenceMode: u8 {
        NoFence = 0 => "none",
        InitiatorSmall = 1 => "initiator small fence",
        Fence = 2 => "fence",
        StrongOrdering = 3 => "strong ordering",
        SmallAndFence = 4 => "small and fence",
    }
}

wire_enum! {
    /// `fm_ce_se` [3:2], the completion mode (mlx5.md §9.1; the meaning of 1 is not
    /// confirmed by public sources, §12).
    pub enum CompletionMode: u8 {
        /// CQE only on error: an unsignaled WQE.
        ErrorOnly = 0 => "CQE on error only",
        /// Always generate a CQE (`MLX5_WQE_CTRL_CQ_UPDATE`).
        Always = 2 => "CQE always",
        /// CQE and EQE.
        AlwaysAndEqe = 3 => "CQE and EQE",
    }
}

/// WQE basic block size in bytes (mlx5.md §9).
pub const WQEBB_BYTES: usize = 64;
/// Bytes per `ds` unit (mlx5.md §9).
pub const DS_UNIT_BYTES: usize = 16;
/// Largest `ds` (mlx5.md §9).
pub const MAX_DS: u32 = 63;
/// Most WQEBBs in one WQE (1 KiB; mlx5.md §9).
pub const MAX_WQEBBS_PER_WQE: u32 = 16;
/// `wqe_inline_seg.byte_count` flag (mlx5.md §9.3).
pub const INLINE_SEG_FLAG: u32 = 0x8000_0000;
/// The receive-WQE terminator lkey (`MLX5_INVALID_LKEY`; mlx5.md §9.4).
pub const INVALID_LKEY: u32 = 0x100;
/// `ud_adrs_vector.destination_qp_dct` flag for the extended AV (`ext` bit; ifc).
pub const UD_AV_EXTENDED: u32 = 0x8000_0000;

wire_enum! {
    /// CQE opcodes, `op_own` [7:4] (mlx5.md §10).
    pub enum CqeOpcode: u8 {
        Req = 0 => "REQ",
        RespWrImm = 1 => "RESP_WR_IMM",
        RespSend = 2 => "RESP_SEND",
        RespSendImm = 3 => "RESP_SEND_IMM",
        RespSendInv = 4 => "RESP_SEND_INV",
        ResizeCq = 5 => "RESIZE_CQ",
        NoPacket = 6 => "NO_PACKET",
        SigErr = 12 => "SIG_ERR",
        ReqErr = 13 => "REQ_ERR",
        RespErr = 14 => "RESP_ERR",
        Invalid = 15 => "INVALID",
    }
}

/// What a fresh CQE's `op_own` is set to: opcode INVALID, owner 0 (mlx5.md §7.2).
pub const CQE_OP_OWN_INIT: u8 = 0xf0;
/// `cqe_format` value meaning a compressed CQE, never seen with `cqe_comp_en` 0 (mlx5.md §10).
pub const CQE_FORMAT_COMPRESSED: u32 = 3;
/// `flags_rqpn.l3_hdr_type` values (mlx5.md §10).
pub mod cqe_l3_hdr_type {
    /// GRH (RoCEv1).
    pub const GRH: u32 = 0;
    /// IPv6 (RoCEv2).
    pub const IPV6: u32 = 1;
    /// IPv4 (RoCEv2).
    pub const IPV4: u32 = 2;
}

/// ibverbs `enum ibv_wc_status` values that [`CqeSyndrome::ibv_wc_status`] maps to (the
/// numbers `rnic_core::WcStatus::as_raw` uses).
pub mod ibv_wc_status {
    /// IBV_WC_SUCCESS.
    pub const SUCCESS: u32 = 0;
    /// IBV_WC_LOC_LEN_ERR.
    pub const LOC_LEN_ERR: u32 = 1;
    /// IBV_WC_LOC_QP_OP_ERR.
    pub const LOC_QP_OP_ERR: u32 = 2;
    /// IBV_WC_LOC_PROT_ERR.
    pub const LOC_PROT_ERR: u32 = 4;
    /// IBV_WC_WR_FLUSH_ERR.
    pub const WR_FLUSH_ERR: u32 = 5;
    /// IBV_WC_MW_BIND_ERR.
    pub const MW_BIND_ERR: u32 = 6;
    /// IBV_WC_BAD_RESP_ERR.
    pub const BAD_RESP_ERR: u32 = 7;
    /// IBV_WC_LOC_ACCESS_ERR.
    pub const LOC_ACCESS_ERR: u32 = 8;
    /// IBV_WC_REM_INV_REQ_ERR.
    pub const REM_INV_REQ_ERR: u32 = 9;
    /// IBV_WC_REM_ACCESS_ERR.
    pub const REM_ACCESS_ERR: u32 = 10;
    /// IBV_WC_REM_OP_ERR.
    pub const REM_OP_ERR: u32 = 11;
    /// IBV_WC_RETRY_EXC_ERR.
    pub const RETRY_EXC_ERR: u32 = 12;
    /// IBV_WC_RNR_RETRY_EXC_ERR.
    pub const RNR_RETRY_EXC_ERR: u32 = 13;
    /// IBV_WC_REM_ABORT_ERR.
    pub const REM_ABORT_ERR: u32 = 16;
    /// IBV_WC_GENERAL_ERR.
    pub const GENERAL_ERR: u32 = 21;
}

wire_enum! {
    /// Error CQE syndromes, `err_cqe.syndrome` (mlx5.md §10).
    pub enum CqeSyndrome: u8 {
        LocalLength = 0x01 => "local length error",
        LocalQpOp = 0x02 => "local QP operation error",
        LocalProt = 0x04 => "local protection error",
        WrFlushed = 0x05 => "WR flushed",
        MwBind = 0x06 => "memory window bind error",
        BadResp = 0x10 => "bad response",
        LocalAccess = 0x11 => "local access error",
        RemoteInvalReq = 0x12 => "remote invalid request",
        RemoteAccess = 0x13 => "remote access error",
        RemoteOp = 0x14 => "remote operation error",
        TransportRetryExceeded = 0x15 => "transport retry counter exceeded",
        RnrRetryExceeded = 0x16 => "RNR retry counter exceeded",
        RemoteAborted = 0x22 => "remote aborted",
    }
}

/// Syndrome → ibverbs work-completion status, as data: each mlx5.md §10 syndrome and the
/// `ibv_wc_status` its description names. An unlisted syndrome maps to GENERAL_ERR.
pub const CQE_SYNDROME_TO_IBV: &[(CqeSyndrome, u32)] = &[
    (CqeSyndrome::LocalLength, ibv_wc_status::LOC_LEN_ERR),
    (CqeSyndrome::LocalQpOp, ibv_wc_status::LOC_QP_OP_ERR),
    (CqeSyndrome::LocalProt, ibv_wc_status::LOC_PROT_ERR),
    (CqeSyndrome::WrFlushed, ibv_wc_status::WR_FLUSH_ERR),
    (CqeSyndrome::MwBind, ibv_wc_status::MW_BIND_ERR),
    (CqeSyndrome::BadResp, ibv_wc_status::BAD_RESP_ERR),
    (CqeSyndrome::LocalAccess, ibv_wc_status::LOC_ACCESS_ERR),
    (CqeSyndrome::RemoteInvalReq, ibv_wc_status::REM_INV_REQ_ERR),
    (CqeSyndrome::RemoteAccess, ibv_wc_status::REM_ACCESS_ERR),
    (CqeSyndrome::RemoteOp, ibv_wc_status::REM_OP_ERR),
    (
        CqeSyndrome::TransportRetryExceeded,
        ibv_wc_status::RETRY_EXC_ERR,
    ),
    (
        CqeSyndrome::RnrRetryExceeded,
        ibv_wc_status::RNR_RETRY_EXC_ERR,
    ),
    (CqeSyndrome::RemoteAborted, ibv_wc_status::REM_ABORT_ERR),
];

impl CqeSyndrome {
    /// The ibverbs `ibv_wc_status` value for this syndrome ([`CQE_SYNDROME_TO_IBV`]).
    pub fn ibv_wc_status(self) -> u32 {
        CQE_SYNDROME_TO_IBV
            .iter()
            .find(|(s, _)| *s == self)
            .map_or(ibv_wc_status::GENERAL_ERR, |(_, status)| *status)
    }
}

wire_enum! {
    /// EQE types, `eqe.event_type` (mlx5.md §11).
    pub enum EventType: u8 {
        Completion = 0x00 => "completion",
        PathMig = 0x01 => "path migrated",
        CommEst = 0x02 => "communication established",
        SqDrained = 0x03 => "SQ drained",
        CqError = 0x04 => "CQ error",
        WqCatasError = 0x05 => "WQ catastrophic error",
        PathMigFailed = 0x07 => "path migration failed",
        InternalError = 0x08 => "internal error",
        PortChange = 0x09 => "port change",
        Cmd = 0x0a => "command completion",
        PageRequest = 0x0b => "page request",
        PageFault = 0x0c => "page fault",
        NicVportChange = 0x0d => "NIC vport change",
        WqInvalReq = 0x10 => "WQ invalid request",
        WqAccessError = 0x11 => "WQ access error",
        SrqCatasError = 0x12 => "SRQ catastrophic error",
        SrqLastWqe = 0x13 => "SRQ last WQE",
        SrqRqLimit = 0x14 => "SRQ limit",
        GeneralEvent = 0x22 => "general event",
    }
}

impl EventType {
    /// This type's bit in a 64-bit `create_eq_in.event_bitmask` word 0 (`None` for types ≥ 64).
    pub const fn mask_bit(self) -> Option<u64> {
        let t = self.as_raw();
        if t < 64 { Some(1u64 << t) } else { None }
    }
}

/// K's async EQ event mask `MLX5_ASYNC_EVENT_MASK` as event types (mlx5.md §11).
pub const ASYNC_EVENT_TYPES: &[EventType] = &[
    EventType::PathMig,
    EventType::CommEst,
    EventType::SqDrained,
    EventType::CqError,
    EventType::WqCatasError,
    EventType::PathMigFailed,
    EventType::WqInvalReq,
    EventType::WqAccessError,
    EventType::PortChange,
    EventType::SrqCatasError,
    EventType::SrqLastWqe,
    EventType::SrqRqLimit,
];

wire_enum! {
    /// `eqe.event_sub_type` of a port change event (mlx5.md §11).
    pub enum PortChangeSubtype: u8 {
        Down = 1 => "down",
        Active = 4 => "active",
        Initialized = 5 => "initialized",
    }
}

/// Initial `owner` of every EQE before CREATE_EQ (mlx5.md §7.1).
pub const EQE_OWNER_INIT: u8 = 1;
/// Spare EQEs added to the requested size, and the most EQEs between CI updates
/// (`MLX5_NUM_SPARE_EQE`; mlx5.md §7.1, §11).
pub const NUM_SPARE_EQE: u32 = 0x80;
/// EQE / CQE size in bytes (mlx5.md §10, §11).
pub const EQE_BYTES: usize = 64;
/// See [`EQE_BYTES`].
pub const CQE_BYTES: usize = 64;

wire_enum! {
    /// `health_buffer.synd` (mlx5.md §2); nonzero is fatal.
    pub enum HealthSyndrome: u8 {
        FwInternal = 0x01 => "firmware internal error",
        DeadIrisc = 0x07 => "dead IRISC",
        HwFatal = 0x08 => "hardware fatal error",
        FwCrc = 0x09 => "firmware CRC error",
        IcmFetchPciErr = 0x0a => "ICM fetch PCI error",
        IcmPageErr = 0x0b => "ICM page error",
        AsyncEqOverrun = 0x0c => "async EQ overrun",
        EqInErr = 0x0d => "EQ in error",
        EqInv = 0x0e => "EQ invalid",
        Ffser = 0x0f => "FFSER error",
        HighTemp = 0x10 => "high temperature",
        IcmPciPoisoned = 0x12 => "ICM PCI poisoned",
        TrustLockdown = 0x13 => "trust lockdown",
    }
}

wire_enum! {
    /// NIC interface state, `initial_seg.nic_state` (mlx5.md §2).
    pub enum NicState: u8 {
        FullDriver = 0 => "full driver",
        Disabled = 1 => "disabled",
        NoDramNic = 2 => "no-DRAM NIC",
        SwReset = 7 => "SW reset",
    }
}

/// `initializing` reads 1 while firmware is still initializing (mlx5.md §2).
pub const FW_INITIALIZING: u32 = 1;
/// `health_buffer.fw_version` when the PCI function is gone (mlx5.md §2).
pub const FW_VERSION_PCI_DEAD: u32 = 0xffff_ffff;
/// Timeout words (0xff8/0xffc): value bits [19:0] (mlx5.md §2).
pub const TIMEOUT_VALUE_MASK: u32 = 0x000f_ffff;
/// Timeout words: multiplier at `>> 29 & 3`: 0 ms, 1 s, 2 min, 3 h (mlx5.md §2).
pub const TIMEOUT_MULTIPLIER_SHIFT: u32 = 29;
/// Milliseconds per multiplier unit 0..=3 (mlx5.md §2).
pub const TIMEOUT_MULTIPLIER_MS: [u64; 4] = [1, 1_000, 60_000, 3_600_000];
/// Kernel defaults when the device gives no timeouts, in ms (mlx5.md §2).
pub mod default_timeout_ms {
    /// Wait for `initializing` before touching the command queue.
    pub const PRE_INIT: u64 = 120_000;
    /// Firmware init after the command queue is set.
    pub const FW_INIT: u64 = 2_000;
    /// One command.
    pub const CMD: u64 = 60_000;
    /// Teardown.
    pub const TEARDOWN: u64 = 3_000;
    /// Health poll period.
    pub const HEALTH_POLL: u64 = 2_000;
}

/// Capability types; QUERY_HCA_CAP `op_mod` = type << 1 | current (mlx5.md §5.2).
pub mod cap_type {
    /// General (`cmd_hca_cap`).
    pub const GENERAL: u32 = 0x0;
    /// Ethernet offloads.
    pub const ETHERNET_OFFLOADS: u32 = 0x1;
    /// ODP.
    pub const ODP: u32 = 0x2;
    /// Atomic.
    pub const ATOMIC: u32 = 0x3;
    /// RoCE (`roce_cap`).
    pub const ROCE: u32 = 0x4;
    /// NIC flow table.
    pub const NIC_FLOW_TABLE: u32 = 0x7;
    /// QoS.
    pub const QOS: u32 = 0xc;
    /// General 2.
    pub const GENERAL_2: u32 = 0x20;
}

/// QUERY_HCA_CAP `op_mod` low bit: current values (mlx5.md §5.2).
pub const HCA_CAP_OPMOD_CURRENT: u32 = 1;
/// QUERY_HCA_CAP `op_mod` low bit: maximum values.
pub const HCA_CAP_OPMOD_MAX: u32 = 0;
/// `cmd_hca_cap.port_type`: InfiniBand (mlx5.md §5.3).
pub const PORT_TYPE_IB: u32 = 0;
/// `cmd_hca_cap.port_type`: Ethernet.
pub const PORT_TYPE_ETH: u32 = 1;
/// `roce_cap.roce_version` bit: RoCEv1 (mlx5.md §5.3).
pub const ROCE_VERSION_1_CAP: u32 = 1 << 0;
/// `roce_cap.roce_version` bit: RoCEv2.
pub const ROCE_VERSION_2_CAP: u32 = 1 << 2;
/// `roce_addr_layout.roce_version` for RoCEv1 (mlx5.md §5.4).
pub const ROCE_VERSION_1: u32 = 0;
/// `roce_addr_layout.roce_version` for RoCEv2.
pub const ROCE_VERSION_2: u32 = 2;
/// `roce_addr_layout.roce_l3_type`: IPv4 (mlx5.md §5.4).
pub const ROCE_L3_TYPE_IPV4: u32 = 0;
/// `roce_addr_layout.roce_l3_type`: IPv6.
pub const ROCE_L3_TYPE_IPV6: u32 = 1;

/// QUERY_PAGES `op_mod` (mlx5.md §5.2).
pub mod query_pages_op_mod {
    /// Boot pages.
    pub const BOOT: u32 = 1;
    /// Init pages.
    pub const INIT: u32 = 2;
    /// Regular (run-time) pages.
    pub const REGULAR: u32 = 3;
}

/// MANAGE_PAGES `op_mod` (mlx5.md §5.2).
pub mod manage_pages_op_mod {
    /// The driver cannot give (allocation failed).
    pub const ALLOC_FAIL: u32 = 0;
    /// Give pages.
    pub const GIVE: u32 = 1;
    /// Take pages back.
    pub const TAKE: u32 = 2;
}

/// TEARDOWN_HCA `profile` (mlx5.md §3.2, §5.2).
pub mod teardown_profile {
    /// Graceful.
    pub const GRACEFUL: u32 = 0;
    /// Force close (cap `force_teardown`).
    pub const FORCE_CLOSE: u32 = 1;
    /// Prepare fast teardown (cap `fast_teardown`).
    pub const PREPARE_FAST_TEARDOWN: u32 = 2;
}

/// ACCESS_REG `op_mod` (mlx5.md §5.2).
pub mod access_reg_op_mod {
    /// Write.
    pub const WRITE: u32 = 0;
    /// Read.
    pub const READ: u32 = 1;
}

/// Register ids for ACCESS_REG (mlx5.md §5.2, K `driver.h`).
pub mod register_id {
    /// PMTU.
    pub const PMTU: u32 = 0x5003;
    /// PTYS.
    pub const PTYS: u32 = 0x5004;
    /// PAOS (port admin/oper status).
    pub const PAOS: u32 = 0x5006;
    /// HOST_ENDIANNESS.
    pub const HOST_ENDIANNESS: u32 = 0x7004;
    /// DTOR (default timeouts).
    pub const DTOR: u32 = 0xc00e;
}

/// PTYS `proto_mask` bits (K `MLX5_PTYS_IB` / `MLX5_PTYS_EN`).
pub mod ptys_proto {
    /// `proto_mask` bit 0: InfiniBand fields.
    pub const IB: u32 = 1 << 0;
    /// `proto_mask` bit 2: Ethernet fields (K `MLX5_PTYS_EN`).
    pub const ETH: u32 = 1 << 2;
}

/// QUERY_VPORT_STATE `op_mod` (mlx5.md §5.4).
pub mod vport_state_op_mod {
    /// vNIC vport.
    pub const VNIC_VPORT: u32 = 0;
    /// Uplink.
    pub const UPLINK: u32 = 2;
}

/// `mkc.access_mode_1_0` (mlx5.md §6).
pub mod mkey_access_mode {
    /// Physical addresses.
    pub const PA: u32 = 0;
    /// MTT translation.
    pub const MTT: u32 = 1;
    /// KLM.
    pub const KLM: u32 = 2;
    /// KSM.
    pub const KSM: u32 = 3;
}

/// MTT entry flag: read enable (mlx5.md §6, `mtt.rd_en`).
pub const MTT_READ_ENABLE: u64 = 0x1;
/// MTT entry flag: write enable (`mtt.wr_en`).
pub const MTT_WRITE_ENABLE: u64 = 0x2;
/// `mkc.qpn` value for an mkey bound to no QP (mlx5.md §6).
pub const MKEY_QPN_UNBOUND: u32 = 0xff_ffff;

wire_enum! {
    /// `sqc.state` / `rqc.state`, and MODIFY_SQ/RQ's `sq_state` / `rq_state` (K `mlx5_ifc.h`
    /// `MLX5_SQC_STATE_*`, `MLX5_RQC_STATE_*`: the same values).
    pub enum WqState: u8 {
        Rst = 0 => "RST",
        Rdy = 1 => "RDY",
        Err = 3 => "ERR",
    }
}

/// `wq.wq_type` (K `mlx5_ifc.h` `MLX5_WQ_TYPE_*`).
pub mod wq_type {
    /// Linked list (SRQ-like).
    pub const LINKED_LIST: u32 = 0x0;
    /// A cyclic ring: raw Ethernet SQs and RQs.
    pub const CYCLIC: u32 = 0x1;
    /// Linked list of multi-packet (striding) WQEs.
    pub const LINKED_LIST_STRIDING_RQ: u32 = 0x2;
    /// Cyclic ring of multi-packet (striding) WQEs.
    pub const CYCLIC_STRIDING_RQ: u32 = 0x3;
}

/// `rqc.mem_rq_type`: the RQ's WQEs are in its own `wq` (K `MLX5_RQC_MEM_RQ_TYPE_MEMORY_RQ_INLINE`).
pub const RQ_MEM_TYPE_INLINE: u32 = 0x0;

/// `tirc.disp_type` (K `mlx5_ifc.h` `MLX5_TIRC_DISP_TYPE_*`).
pub mod tir_disp_type {
    /// Every packet to the one RQ `inline_rqn`.
    pub const DIRECT: u32 = 0x0;
    /// Spread by hash over an RQ table (`indirect_table`).
    pub const INDIRECT: u32 = 0x1;
}

/// `tirc.self_lb_block` bits (K `MLX5_TIRC_SELF_LB_BLOCK_BLOCK_*`).
pub mod tir_self_lb_block {
    /// Unicast sent by this function is not received back.
    pub const UNICAST: u32 = 1 << 0;
    /// Multicast/broadcast sent by this function is not received back.
    pub const MULTICAST: u32 = 1 << 1;
}

/// How many headers a raw Ethernet send WQE carries inline: `sqc.min_wqe_inline_mode`,
/// `nic_vport_context.min_wqe_inline_mode` (K device.h `MLX5_INLINE_MODE_*`).
pub mod inline_mode {
    /// None required.
    pub const NONE: u32 = 0;
    /// The L2 header ([`ETH_L2_INLINE_HEADER_SIZE`](crate::ETH_L2_INLINE_HEADER_SIZE) bytes).
    pub const L2: u32 = 1;
    /// Up to the IP header.
    pub const IP: u32 = 2;
    /// Up to the TCP/UDP header.
    pub const TCP_UDP: u32 = 3;
}

/// `per_protocol_networking_offload_caps.wqe_inline_mode` (K vport.h `MLX5_CAP_INLINE_MODE_*`).
pub mod cap_inline_mode {
    /// Every send WQE must inline the L2 header.
    pub const L2: u32 = 0;
    /// The vport context's `min_wqe_inline_mode` says (and each SQ's `min_wqe_inline_mode`).
    pub const VPORT_CONTEXT: u32 = 1;
    /// No inline headers required.
    pub const NOT_REQUIRED: u32 = 2;
}

/// Bytes of an L2 header inlined in L2 inline mode: destination and source MAC, a VLAN tag
/// and the ethertype (rdma-core `providers/mlx5/wqe.h` `MLX5_ETH_L2_INLINE_HEADER_SIZE`).
pub const ETH_L2_INLINE_HEADER_SIZE: usize = 18;
/// The smallest L2 header, no VLAN tag (rdma-core `MLX5_ETH_L2_MIN_HEADER_SIZE`).
pub const ETH_L2_MIN_HEADER_SIZE: usize = 14;

/// `wqe_eth_seg.cs_flags` (K qp.h `MLX5_ETH_WQE_*_CSUM`).
pub mod eth_cs_flags {
    /// Inner (tunnelled) IPv4 header checksum.
    pub const L3_INNER_CSUM: u32 = 1 << 4;
    /// Inner L4 checksum.
    pub const L4_INNER_CSUM: u32 = 1 << 5;
    /// IPv4 header checksum.
    pub const L3_CSUM: u32 = 1 << 6;
    /// TCP/UDP checksum.
    pub const L4_CSUM: u32 = 1 << 7;
}

/// `wqe_eth_seg.insert.type`: insert the VLAN tag `insert.vlan_tci` (K qp.h `MLX5_ETH_WQE_INSERT_VLAN`).
pub const ETH_WQE_INSERT_VLAN: u32 = 1 << 15;

/// `cqe64.l4_l3_hdr_type` bits [6:4] of a received Ethernet frame (K device.h `CQE_L4_HDR_TYPE_*`).
pub mod cqe_l4_hdr_type {
    /// No L4 header recognised.
    pub const NONE: u32 = 0x0;
    /// TCP, no ACK.
    pub const TCP_NO_ACK: u32 = 0x1;
    /// UDP.
    pub const UDP: u32 = 0x2;
    /// TCP ACK, no data.
    pub const TCP_ACK_NO_DATA: u32 = 0x3;
    /// TCP ACK and data.
    pub const TCP_ACK_AND_DATA: u32 = 0x4;
}

/// `cqe64.l4_l3_hdr_type` bits [3:2] of a received Ethernet frame (rdma-core mlx5dv.h
/// `MLX5_CQE_L3_HDR_TYPE_*`; RoCE completions use [`cqe_l3_hdr_type`] in `flags_rqpn`).
pub mod cqe_eth_l3_hdr_type {
    /// No IP header.
    pub const NONE: u32 = 0x0;
    /// IPv6.
    pub const IPV6: u32 = 0x1;
    /// IPv4.
    pub const IPV4: u32 = 0x2;
}

/// Flow table types, `table_type` of the flow steering commands (K `mlx5_ifc.h`
/// `MLX5_FLOW_TABLE_TYPE_*`).
pub mod flow_table_type {
    /// NIC receive: where a vport's received (non-RoCE) packets are steered.
    pub const NIC_RX: u32 = 0x0;
    /// NIC transmit.
    pub const NIC_TX: u32 = 0x1;
    /// E-switch egress ACL.
    pub const ESW_EGRESS_ACL: u32 = 0x2;
    /// E-switch ingress ACL.
    pub const ESW_INGRESS_ACL: u32 = 0x3;
    /// E-switch forwarding database.
    pub const FDB: u32 = 0x4;
    /// Sniffer RX.
    pub const SNIFFER_RX: u32 = 0x5;
    /// Sniffer TX.
    pub const SNIFFER_TX: u32 = 0x6;
}

/// `flow_table_context.table_miss_action` (K `enum mlx5_flow_table_miss_action`).
pub mod flow_table_miss_action {
    /// Default: continue at the next level (the root's miss: the vport's default, a drop on
    /// NIC RX).
    pub const DEFAULT: u32 = 0;
    /// Forward to `table_miss_id`.
    pub const FWD: u32 = 1;
    /// Switch domain.
    pub const SWITCH_DOMAIN: u32 = 2;
}

/// `flow_context.action` bits (K `mlx5_ifc.h` `MLX5_FLOW_CONTEXT_ACTION_*`).
pub mod flow_action {
    /// Allow (continue).
    pub const ALLOW: u32 = 0x1;
    /// Drop.
    pub const DROP: u32 = 0x2;
    /// Forward to the destination list.
    pub const FWD_DEST: u32 = 0x4;
    /// Count into the flow counter list.
    pub const COUNT: u32 = 0x8;
    /// Packet reformat.
    pub const PACKET_REFORMAT: u32 = 0x10;
    /// Decapsulate.
    pub const DECAP: u32 = 0x20;
    /// Modify header.
    pub const MOD_HDR: u32 = 0x40;
    /// Pop a VLAN tag.
    pub const VLAN_POP: u32 = 0x80;
    /// Push a VLAN tag.
    pub const VLAN_PUSH: u32 = 0x100;
}

/// `dest_format_struct.destination_type` (K `mlx5_ifc.h` `enum mlx5_ifc_flow_destination_type`).
pub mod flow_destination_type {
    /// A vport.
    pub const VPORT: u32 = 0x0;
    /// Another flow table (of a higher level).
    pub const FLOW_TABLE: u32 = 0x1;
    /// A TIR: the packet is received on its RQ.
    pub const TIR: u32 = 0x2;
    /// A flow sampler.
    pub const FLOW_SAMPLER: u32 = 0x6;
    /// The uplink.
    pub const UPLINK: u32 = 0x8;
    /// The root of another table type.
    pub const TABLE_TYPE: u32 = 0xa;
}

/// `match_criteria_enable` bits: which set of `fte_match_param` a group matches on (K
/// device.h `MLX5_MATCH_*`).
pub mod match_criteria {
    /// `outer_headers` (L2-L4 of the received packet).
    pub const OUTER_HEADERS: u32 = 1 << 0;
    /// `misc_parameters`.
    pub const MISC_PARAMETERS: u32 = 1 << 1;
    /// `inner_headers`.
    pub const INNER_HEADERS: u32 = 1 << 2;
    /// `misc_parameters_2`.
    pub const MISC_PARAMETERS_2: u32 = 1 << 3;
    /// `misc_parameters_3` (ICMP / ICMPv6 type and code).
    pub const MISC_PARAMETERS_3: u32 = 1 << 4;
    /// `misc_parameters_4`.
    pub const MISC_PARAMETERS_4: u32 = 1 << 5;
    /// `misc_parameters_5`.
    pub const MISC_PARAMETERS_5: u32 = 1 << 6;
}

/// `cmd_hca_cap.flex_parser_protocols` bits: protocols the flexible parser can match, e.g.
/// ICMP / ICMPv6 type and code in `misc_parameters_3` (K device.h `MLX5_FLEX_PROTO_*`).
pub mod flex_parser_proto {
    /// ICMP (IPv4): `icmp_type`, `icmp_code`.
    pub const ICMP: u32 = 1 << 8;
    /// ICMPv6: `icmpv6_type`, `icmpv6_code` (IPv6 neighbour discovery).
    pub const ICMPV6: u32 = 1 << 9;
}

/// QUERY_VPORT_COUNTER `op_mod` (K `MLX5_QUERY_VPORT_COUNTER_IN_OP_MOD_VPORT_COUNTERS`).
pub const QUERY_VPORT_COUNTER_OP_MOD_VPORT: u32 = 0x0;

/// `cqc.cqe_sz` (mlx5.md §7.2).
pub mod cqe_size {
    /// 64-byte CQE.
    pub const BYTES_64: u32 = 0;
    /// 128-byte CQE.
    pub const BYTES_128: u32 = 1;
    /// 128-byte CQE, padded.
    pub const BYTES_128_PAD: u32 = 2;
}

wire_enum! {
    /// CQ arm command in the doorbell record / UAR doorbell (mlx5.md §8).
    pub enum CqArmCmd: u8 {
        /// Notify on the next completion.
        NextCompletion = 0 => "next completion",
        /// Notify on the next solicited completion (`1 << 24` in the dword).
        SolicitedOnly = 1 => "solicited only",
    }
}

/// UAR page size with `log_uar_page_sz` = 0; UAR n is at BAR0 + n * 4096 (mlx5.md §8).
pub const UAR_PAGE_BYTES: usize = 4096;
/// CQ doorbell offset in a UAR page, 64-bit BE write (mlx5.md §8).
pub const UAR_CQ_DOORBELL: usize = 0x020;
/// EQ doorbell "update CI and arm" offset, BE32 (mlx5.md §8).
pub const UAR_EQ_DOORBELL_ARM: usize = 0x040;
/// EQ doorbell "update CI, don't arm" offset, BE32 (mlx5.md §8).
pub const UAR_EQ_DOORBELL_NO_ARM: usize = 0x048;
/// First send doorbell / BlueFlame register (mlx5.md §8); register k is at
/// `UAR_BF_REG_0 + k * bf_reg_size`, with two halves of `bf_reg_size / 2`.
pub const UAR_BF_REG_0: usize = 0x800;
/// BlueFlame registers per UAR (mlx5.md §8).
pub const UAR_NUM_BF_REGS: usize = 4;
/// Non-fast-path BlueFlame registers per UAR in K (`MLX5_NON_FP_BFREGS_PER_UAR`; mlx5.md §8).
pub const UAR_NON_FP_BF_REGS: usize = 2;
/// Largest BlueFlame copy, bytes (mlx5.md §8).
pub const BLUEFLAME_MAX_BYTES: usize = 256;

/// Command and health register offsets in BAR0, bytes (mlx5.md §2), for `Mmio` users.
pub mod init_seg_offset {
    /// `fw_rev`.
    pub const FW_REV: usize = 0x000;
    /// `cmdif_rev_fw_sub`.
    pub const CMDIF_REV_FW_SUB: usize = 0x004;
    /// `cmdq_addr_h`.
    pub const CMDQ_ADDR_H: usize = 0x010;
    /// `cmdq_addr_l_sz`.
    pub const CMDQ_ADDR_L_SZ: usize = 0x014;
    /// `cmd_dbell`: write `1 << slot`.
    pub const CMD_DBELL: usize = 0x018;
    /// `initializing`.
    pub const INITIALIZING: usize = 0x1fc;
    /// The health buffer.
    pub const HEALTH_BUFFER: usize = 0x200;
    /// `cmd_exec_to`.
    pub const CMD_EXEC_TO: usize = 0xff8;
    /// `cmd_q_init_to`.
    pub const CMD_Q_INIT_TO: usize = 0xffc;
    /// `internal_timer_h`.
    pub const INTERNAL_TIMER_H: usize = 0x1000;
    /// `internal_timer_l`.
    pub const INTERNAL_TIMER_L: usize = 0x1004;
    /// `health_counter`.
    pub const HEALTH_COUNTER: usize = 0x1010;
}

/// PCI vendor id of all mlx5 functions (mlx5.md §1).
pub const PCI_VENDOR_MELLANOX: u16 = 0x15b3;
/// mlx5 PCI device ids and part names (mlx5.md §1); `true` = virtual function.
pub const PCI_DEVICE_IDS: &[(u16, &str, bool)] = &[
    (0x1011, "Connect-IB", false),
    (0x1012, "Connect-IB VF", true),
    (0x1013, "ConnectX-4", false),
    (0x1014, "ConnectX-4 VF", true),
    (0x1015, "ConnectX-4 Lx", false),
    (0x1016, "ConnectX-4 Lx VF", true),
    (0x1017, "ConnectX-5", false),
    (0x1018, "ConnectX-5 VF", true),
    (0x1019, "ConnectX-5 Ex", false),
    (0x101a, "ConnectX-5 Ex VF", true),
    (0x101b, "ConnectX-6", false),
    (0x101c, "ConnectX-6 VF", true),
    (0x101d, "ConnectX-6 Dx", false),
    (0x101e, "ConnectX family mlx5Gen Virtual Function", true),
    (0x101f, "ConnectX-6 Lx", false),
    (0x1021, "ConnectX-7", false),
    (0x1023, "ConnectX-8", false),
    (0x1025, "ConnectX-9", false),
    (0x1027, "ConnectX-10", false),
    (0xa2d2, "BlueField", false),
    (0xa2d3, "BlueField VF", true),
    (0xa2d6, "BlueField-2", false),
    (0xa2dc, "BlueField-3", false),
    (0xa2df, "BlueField-4", false),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_unknown() {
        for op in CmdOpcode::ALL {
            assert_eq!(CmdOpcode::from_raw(op.as_raw()), *op);
        }
        assert_eq!(CmdOpcode::from_raw(0x500), CmdOpcode::CreateQp);
        assert_eq!(CmdOpcode::from_raw(0x999), CmdOpcode::Unknown(0x999));
        assert_eq!(CmdStatus::from_raw(0x02), CmdStatus::BadOp);
        assert_eq!(CmdStatus::from_raw(0x51), CmdStatus::BadOutpLen);
        assert_eq!(CmdStatus::BadOp.to_string(), "BAD_OP (unsupported opcode)");
        assert_eq!(CmdStatus::from_raw(0x0b).to_string(), "unknown (0xb)");
        assert_eq!(DeliveryStatus::from_raw(0x10), DeliveryStatus::BadCmdType);
        assert_eq!(CqeOpcode::from_raw(13), CqeOpcode::ReqErr);
        assert_eq!(EventType::PageRequest.mask_bit(), Some(1 << 0x0b));
        assert_eq!(
            HealthSyndrome::from_raw(0x13),
            HealthSyndrome::TrustLockdown
        );
        assert_eq!(NicState::from_raw(7), NicState::SwReset);
        for s in CqeSyndrome::ALL {
            assert_eq!(CqeSyndrome::from_raw(s.as_raw()), *s);
        }
    }

    #[test]
    fn values_are_distinct() {
        fn distinct<T: Copy + Eq + core::hash::Hash>(v: impl Iterator<Item = T>) -> bool {
            let all: Vec<T> = v.collect();
            let set: std::collections::HashSet<T> = all.iter().copied().collect();
            set.len() == all.len()
        }
        assert!(distinct(CmdOpcode::ALL.iter().map(|o| o.as_raw())));
        assert!(distinct(CmdStatus::ALL.iter().map(|o| o.as_raw())));
        assert!(distinct(WqeOpcode::ALL.iter().map(|o| o.as_raw())));
        assert!(distinct(EventType::ALL.iter().map(|o| o.as_raw())));
        assert!(distinct(PCI_DEVICE_IDS.iter().map(|d| d.0)));
    }

    #[test]
    fn syndrome_mapping_follows_mlx5_md() {
        assert_eq!(
            CqeSyndrome::WrFlushed.ibv_wc_status(),
            ibv_wc_status::WR_FLUSH_ERR
        );
        assert_eq!(CqeSyndrome::RemoteAccess.ibv_wc_status(), 10);
        assert_eq!(CqeSyndrome::RnrRetryExceeded.ibv_wc_status(), 13);
        assert_eq!(
            CqeSyndrome::Unknown(0x99).ibv_wc_status(),
            ibv_wc_status::GENERAL_ERR
        );
        // Every named syndrome has exactly one mapping.
        for s in CqeSyndrome::ALL {
            assert_eq!(
                CQE_SYNDROME_TO_IBV.iter().filter(|(x, _)| x == s).count(),
                1
            );
        }
    }
}
