//! MKey, EQ, CQ and QP commands (mlx5.md §6, §7).

use super::*;

prm_struct! {
    /// CREATE_MKEY (0x200) input: `mkc` at 0x10, MTT list (`klm_pas_mtt`) from 0x110 (mlx5.md §6).
    pub struct CreateMkeyIn, mod create_mkey_in = "create_mkey_in", size_bits: 0x880, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        uid, set_uid: u32 [0x10, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        pg_access, set_pg_access: u32 [0x60, 1];
        mkey_umem_valid, set_mkey_umem_valid: u32 [0x61, 1];
        data_direct, set_data_direct: u32 [0x62, 1];
        memory_key_mkey_entry, memory_key_mkey_entry_mut: {Mkc} [0x80, 512];
        translations_octword_actual_size, set_translations_octword_actual_size: u32 [0x300, 32];
        klm_pas_mtt, set_klm_pas_mtt: [u32; flex] [0x880, 32];
    }
}

prm_struct! {
    /// CREATE_MKEY output: key = `mkey_index << 8 | mkc.mkey_7_0` (mlx5.md §6).
    pub struct CreateMkeyOut, mod create_mkey_out = "create_mkey_out", size_bits: 0x80, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
        mkey_index, set_mkey_index: u32 [0x48, 24];
    }
}

prm_struct! {
    /// DESTROY_MKEY (0x202) input: `mkey_index` = lkey >> 8.
    pub struct DestroyMkeyIn, mod destroy_mkey_in = "destroy_mkey_in", size_bits: 0x80, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        uid, set_uid: u32 [0x10, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        mkey_index, set_mkey_index: u32 [0x48, 24];
    }
}

prm_struct! {
    /// DESTROY_MKEY output.
    pub struct DestroyMkeyOut, mod destroy_mkey_out = "destroy_mkey_out", size_bits: 0x80, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
    }
}

prm_struct! {
    /// CREATE_EQ (0x301) input: `eqc` at 0x10, four 64-bit event masks at 0x58 (bit t of mask 0 = event type t), `pas[]` at 0x110 (mlx5.md §7.1).
    pub struct CreateEqIn, mod create_eq_in = "create_eq_in", size_bits: 0x880, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        uid, set_uid: u32 [0x10, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        eq_context_entry, eq_context_entry_mut: {Eqc} [0x80, 512];
        event_bitmask, set_event_bitmask: [u64; 4] [0x2c0, 256];
        pas, set_pas: [u64; flex] [0x880, 64];
    }
}

prm_struct! {
    /// CREATE_EQ output.
    pub struct CreateEqOut, mod create_eq_out = "create_eq_out", size_bits: 0x80, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
        eq_number, set_eq_number: u32 [0x58, 8];
    }
}

prm_struct! {
    /// DESTROY_EQ (0x302) input.
    pub struct DestroyEqIn, mod destroy_eq_in = "destroy_eq_in", size_bits: 0x80, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        eq_number, set_eq_number: u32 [0x58, 8];
    }
}

prm_struct! {
    /// DESTROY_EQ output.
    pub struct DestroyEqOut, mod destroy_eq_out = "destroy_eq_out", size_bits: 0x80, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
    }
}

prm_struct! {
    /// CREATE_CQ (0x400) input: `cqc` at 0x10, `pas[]` at 0x110 (mlx5.md §7.2).
    pub struct CreateCqIn, mod create_cq_in = "create_cq_in", size_bits: 0x880, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        uid, set_uid: u32 [0x10, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        cq_context, cq_context_mut: {Cqc} [0x80, 512];
        cq_umem_valid, set_cq_umem_valid: u32 [0x2e0, 1];
        pas, set_pas: [u64; flex] [0x880, 64];
    }
}

prm_struct! {
    /// CREATE_CQ output.
    pub struct CreateCqOut, mod create_cq_out = "create_cq_out", size_bits: 0x80, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
        cqn, set_cqn: u32 [0x48, 24];
    }
}

prm_struct! {
    /// DESTROY_CQ (0x401) input.
    pub struct DestroyCqIn, mod destroy_cq_in = "destroy_cq_in", size_bits: 0x80, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        uid, set_uid: u32 [0x10, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        cqn, set_cqn: u32 [0x48, 24];
    }
}

prm_struct! {
    /// DESTROY_CQ output.
    pub struct DestroyCqOut, mod destroy_cq_out = "destroy_cq_out", size_bits: 0x80, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
    }
}

prm_struct! {
    /// MODIFY_CQ (0x403) input (moderation / resize).
    pub struct ModifyCqIn, mod modify_cq_in = "modify_cq_in", size_bits: 0x880, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        uid, set_uid: u32 [0x10, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        cqn, set_cqn: u32 [0x48, 24];
        modify_field_select_resize_field_select, set_modify_field_select_resize_field_select: u32 [0x60, 32];
        cq_context, cq_context_mut: {Cqc} [0x80, 512];
        cq_umem_valid, set_cq_umem_valid: u32 [0x2e0, 1];
        pas, set_pas: [u64; flex] [0x880, 64];
    }
}

prm_struct! {
    /// MODIFY_CQ output.
    pub struct ModifyCqOut, mod modify_cq_out = "modify_cq_out", size_bits: 0x80, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
    }
}

prm_struct! {
    /// CREATE_QP (0x500) input: `qpc` at 0x18, `pas[]` at 0x110 (mlx5.md §7.3).
    pub struct CreateQpIn, mod create_qp_in = "create_qp_in", size_bits: 0x880, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        uid, set_uid: u32 [0x10, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        qpc_ext, set_qpc_ext: u32 [0x40, 1];
        input_qpn, set_input_qpn: u32 [0x48, 24];
        opt_param_mask, set_opt_param_mask: u32 [0x80, 32];
        ece, set_ece: u32 [0xa0, 32];
        qpc, qpc_mut: {Qpc} [0xc0, 1856];
        wq_umem_offset, set_wq_umem_offset: u64 [0x800, 64];
        wq_umem_id, set_wq_umem_id: u32 [0x840, 32];
        wq_umem_valid, set_wq_umem_valid: u32 [0x860, 1];
        pas, set_pas: [u64; flex] [0x880, 64];
    }
}

prm_struct! {
    /// CREATE_QP output.
    pub struct CreateQpOut, mod create_qp_out = "create_qp_out", size_bits: 0x80, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
        qpn, set_qpn: u32 [0x48, 24];
        ece, set_ece: u32 [0x60, 32];
    }
}

prm_struct! {
    /// DESTROY_QP (0x501) input.
    pub struct DestroyQpIn, mod destroy_qp_in = "destroy_qp_in", size_bits: 0x80, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        uid, set_uid: u32 [0x10, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        qpn, set_qpn: u32 [0x48, 24];
    }
}

prm_struct! {
    /// DESTROY_QP output.
    pub struct DestroyQpOut, mod destroy_qp_out = "destroy_qp_out", size_bits: 0x80, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
    }
}

prm_struct! {
    /// RST2INIT_QP (0x502) input (mlx5.md §7.3).
    pub struct Rst2initQpIn, mod rst2init_qp_in = "rst2init_qp_in", size_bits: 0x880, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        uid, set_uid: u32 [0x10, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        qpn, set_qpn: u32 [0x48, 24];
        opt_param_mask, set_opt_param_mask: u32 [0x80, 32];
        ece, set_ece: u32 [0xa0, 32];
        qpc, qpc_mut: {Qpc} [0xc0, 1856];
    }
}

prm_struct! {
    /// RST2INIT_QP output.
    pub struct Rst2initQpOut, mod rst2init_qp_out = "rst2init_qp_out", size_bits: 0x80, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
        ece, set_ece: u32 [0x60, 32];
    }
}

prm_struct! {
    /// INIT2RTR_QP (0x503) input.
    pub struct Init2rtrQpIn, mod init2rtr_qp_in = "init2rtr_qp_in", size_bits: 0x880, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        uid, set_uid: u32 [0x10, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        qpn, set_qpn: u32 [0x48, 24];
        opt_param_mask, set_opt_param_mask: u32 [0x80, 32];
        ece, set_ece: u32 [0xa0, 32];
        qpc, qpc_mut: {Qpc} [0xc0, 1856];
    }
}

prm_struct! {
    /// INIT2RTR_QP output.
    pub struct Init2rtrQpOut, mod init2rtr_qp_out = "init2rtr_qp_out", size_bits: 0x80, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
        ece, set_ece: u32 [0x60, 32];
    }
}

prm_struct! {
    /// RTR2RTS_QP (0x504) input.
    pub struct Rtr2rtsQpIn, mod rtr2rts_qp_in = "rtr2rts_qp_in", size_bits: 0x880, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        uid, set_uid: u32 [0x10, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        qpn, set_qpn: u32 [0x48, 24];
        opt_param_mask, set_opt_param_mask: u32 [0x80, 32];
        ece, set_ece: u32 [0xa0, 32];
        qpc, qpc_mut: {Qpc} [0xc0, 1856];
    }
}

prm_struct! {
    /// RTR2RTS_QP output.
    pub struct Rtr2rtsQpOut, mod rtr2rts_qp_out = "rtr2rts_qp_out", size_bits: 0x80, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
        ece, set_ece: u32 [0x60, 32];
    }
}

prm_struct! {
    /// RTS2RTS_QP (0x505) input.
    pub struct Rts2rtsQpIn, mod rts2rts_qp_in = "rts2rts_qp_in", size_bits: 0x880, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        uid, set_uid: u32 [0x10, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        qpn, set_qpn: u32 [0x48, 24];
        opt_param_mask, set_opt_param_mask: u32 [0x80, 32];
        ece, set_ece: u32 [0xa0, 32];
        qpc, qpc_mut: {Qpc} [0xc0, 1856];
    }
}

prm_struct! {
    /// RTS2RTS_QP output.
    pub struct Rts2rtsQpOut, mod rts2rts_qp_out = "rts2rts_qp_out", size_bits: 0x80, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
        ece, set_ece: u32 [0x60, 32];
    }
}

prm_struct! {
    /// 2ERR_QP (0x507) input.
    pub struct Qp2errIn, mod qp_2err_in = "qp_2err_in", size_bits: 0x80, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        uid, set_uid: u32 [0x10, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        qpn, set_qpn: u32 [0x48, 24];
    }
}

prm_struct! {
    /// 2ERR_QP output.
    pub struct Qp2errOut, mod qp_2err_out = "qp_2err_out", size_bits: 0x80, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
    }
}

prm_struct! {
    /// 2RST_QP (0x50a) input.
    pub struct Qp2rstIn, mod qp_2rst_in = "qp_2rst_in", size_bits: 0x80, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        uid, set_uid: u32 [0x10, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        qpn, set_qpn: u32 [0x48, 24];
    }
}

prm_struct! {
    /// 2RST_QP output.
    pub struct Qp2rstOut, mod qp_2rst_out = "qp_2rst_out", size_bits: 0x80, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
    }
}

prm_struct! {
    /// QUERY_QP (0x50b) input.
    pub struct QueryQpIn, mod query_qp_in = "query_qp_in", size_bits: 0x80, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        qpc_ext, set_qpc_ext: u32 [0x40, 1];
        qpn, set_qpn: u32 [0x48, 24];
    }
}

prm_struct! {
    /// QUERY_QP output: `qpc` at 0x18, `pas[]` at 0x110.
    pub struct QueryQpOut, mod query_qp_out = "query_qp_out", size_bits: 0xe80, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
        opt_param_mask, set_opt_param_mask: u32 [0x80, 32];
        ece, set_ece: u32 [0xa0, 32];
        qpc, qpc_mut: {Qpc} [0xc0, 1856];
        pas, set_pas: [u64; flex] [0x880, 64] = "qp_pas_or_qpc_ext_and_pas.qp_pas_list.pas";
    }
}
