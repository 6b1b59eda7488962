//! Data-path formats that the ifc header does not declare (device.h structs): the 64-byte
//! CQE, send WQE segments, the receive data segment, doorbell records and UAR doorbell
//! words. Offsets from mlx5.md §8-§10; the tests hold every field against the byte offsets
//! written there. Names are device.h's where mlx5.md gives them; a dotted name
//! (`op_own.owner`) is a sub-field rnic splits out of that device.h field.

use super::*;

prm_struct! {
    /// The 64-byte CQE (device.h `mlx5_cqe64`; mlx5.md §10). Valid iff `opcode` != 0xF and
    /// `owner` == (ci >> log_cq_size) & 1.
    pub struct Cqe64, mod cqe64 = "cqe64", size_bits: 0x200, source: Source::Doc("mlx5.md §10");
    {
        wqe_id, set_wqe_id: u32 [0x10, 16];
        rss_hash_result, set_rss_hash_result: u32 [0x60, 32];
        rss_hash_type, set_rss_hash_type: u32 [0x80, 8];
        ml_path, set_ml_path: u32 [0x88, 8];
        check_sum, set_check_sum: u32 [0xa0, 16];
        slid, set_slid: u32 [0xb0, 16];
        flags_rqpn, set_flags_rqpn: u32 [0xc0, 32];
        /// GRH / IP header present (`flags_rqpn` [29:28]).
        g, set_g: u32 [0xc2, 2] = "flags_rqpn.g";
        /// RoCE L3 type (`flags_rqpn` [25:24]): 0 GRH (RoCEv1), 1 IPv6, 2 IPv4.
        l3_hdr_type, set_l3_hdr_type: u32 [0xc6, 2] = "flags_rqpn.l3_hdr_type";
        /// Source QPN (responder; `flags_rqpn` [23:0]).
        rqpn, set_rqpn: u32 [0xc8, 24] = "flags_rqpn.rqpn";
        hds_ip_ext, set_hds_ip_ext: u32 [0xe0, 8];
        /// Received L4 checksum verified (`hds_ip_ext` bit2, K device.h `CQE_L4_OK`).
        l4_ok, set_l4_ok: u32 [0xe5, 1] = "hds_ip_ext.l4_ok", doc "K device.h CQE_L4_OK";
        /// Received IPv4 header checksum verified (`hds_ip_ext` bit1, `CQE_L3_OK`).
        l3_ok, set_l3_ok: u32 [0xe6, 1] = "hds_ip_ext.l3_ok", doc "K device.h CQE_L3_OK";
        /// Received L2 (FCS) good (`hds_ip_ext` bit0, `CQE_L2_OK`).
        l2_ok, set_l2_ok: u32 [0xe7, 1] = "hds_ip_ext.l2_ok", doc "K device.h CQE_L2_OK";
        /// bit0 = VLAN present.
        l4_l3_hdr_type, set_l4_l3_hdr_type: u32 [0xe8, 8];
        /// L4 header of a received frame ([`cqe_l4_hdr_type`](crate::cqe_l4_hdr_type); K
        /// device.h `get_cqe_l4_hdr_type`: bits [6:4]).
        l4_hdr_type, set_l4_hdr_type: u32 [0xe9, 3] = "l4_l3_hdr_type.l4_hdr_type", doc "K device.h get_cqe_l4_hdr_type";
        /// L3 header of a received Ethernet frame: 0 none, 1 IPv6, 2 IPv4 (rdma-core
        /// mlx5dv.h `MLX5_CQE_L3_HDR_TYPE_*`, cq.c `get_cqe_l3_hdr_type`: bits [3:2]).
        eth_l3_hdr_type, set_eth_l3_hdr_type: u32 [0xec, 2] = "l4_l3_hdr_type.l3_hdr_type", doc "rdma-core cq.c get_cqe_l3_hdr_type";
        /// A VLAN tag was stripped into `vlan_info` (K device.h `cqe_has_vlan`: bit0).
        vlan_present, set_vlan_present: u32 [0xef, 1] = "l4_l3_hdr_type.vlan", doc "K device.h cqe_has_vlan";
        vlan_info, set_vlan_info: u32 [0xf0, 16];
        /// SRQ number or user_index (CQE v1): the low 24 bits of the BE32 at 0x20.
        srqn_uidx, set_srqn_uidx: u32 [0x108, 24];
        /// Immediate data (raw big-endian as on the wire) / invalidated rkey / pkey.
        imm_inval_pkey, set_imm_inval_pkey: u32 [0x120, 32];
        /// Bytes received (responder) / read (RDMA READ requester).
        byte_cnt, set_byte_cnt: u32 [0x160, 32];
        timestamp, set_timestamp: u64 [0x180, 64];
        /// Opcode of the completed send WQE (requester CQE).
        wqe_opcode, set_wqe_opcode: u32 [0x1c0, 8] = "sop_drop_qpn.wqe_opcode";
        qpn, set_qpn: u32 [0x1c8, 24] = "sop_drop_qpn.qpn";
        /// Requester: WQE index of the completed WQE; responder: RQ WQE index.
        wqe_counter, set_wqe_counter: u32 [0x1e0, 16];
        signature, set_signature: u32 [0x1f0, 8];
        op_own, set_op_own: u32 [0x1f8, 8];
        /// [`CqeOpcode`](crate::CqeOpcode).
        opcode, set_opcode: u32 [0x1f8, 4] = "op_own.opcode";
        /// 0 none, 1 32-byte inline scatter, 2 64-byte inline scatter, 3 compressed.
        cqe_format, set_cqe_format: u32 [0x1fc, 2] = "op_own.format";
        se, set_se: u32 [0x1fe, 1] = "op_own.se";
        owner, set_owner: u32 [0x1ff, 1] = "op_own.owner";
    }
}

prm_struct! {
    /// The error CQE (device.h `mlx5_err_cqe`; mlx5.md §10), opcode REQ_ERR / RESP_ERR.
    pub struct ErrCqe, mod err_cqe = "err_cqe", size_bits: 0x200, source: Source::Doc("mlx5.md §10");
    {
        srqn, set_srqn: u32 [0x100, 32];
        vendor_err_synd, set_vendor_err_synd: u32 [0x1b0, 8];
        /// [`CqeSyndrome`](crate::CqeSyndrome).
        syndrome, set_syndrome: u32 [0x1b8, 8];
        /// Opcode of the failed WQE.
        wqe_opcode, set_wqe_opcode: u32 [0x1c0, 8] = "s_wqe_opcode_qpn.wqe_opcode";
        qpn, set_qpn: u32 [0x1c8, 24] = "s_wqe_opcode_qpn.qpn";
        wqe_counter, set_wqe_counter: u32 [0x1e0, 16];
        op_own, set_op_own: u32 [0x1f8, 8];
        opcode, set_opcode: u32 [0x1f8, 4] = "op_own.opcode";
        owner, set_owner: u32 [0x1ff, 1] = "op_own.owner";
    }
}

prm_struct! {
    /// Send WQE control segment (device.h `mlx5_wqe_ctrl_seg`; mlx5.md §9.1).
    pub struct WqeCtrlSeg, mod wqe_ctrl_seg = "wqe_ctrl_seg", size_bits: 0x80, source: Source::Doc("mlx5.md §9.1");
    {
        /// Opcode modifier (0 for RC operations).
        opmod, set_opmod: u32 [0x0, 8] = "opmod_idx_opcode.opmod";
        /// SQ producer counter in WQEBBs (wraps at 0xffff regardless of SQ size).
        wqe_index, set_wqe_index: u32 [0x8, 16] = "opmod_idx_opcode.wqe_index";
        /// [`WqeOpcode`](crate::WqeOpcode).
        opcode, set_opcode: u32 [0x18, 8] = "opmod_idx_opcode.opcode";
        qpn, set_qpn: u32 [0x20, 24] = "qpn_ds.qpn";
        /// WQE size in 16-byte units (max 63).
        ds, set_ds: u32 [0x3a, 6] = "qpn_ds.ds";
        signature, set_signature: u32 [0x40, 8];
        fm_ce_se, set_fm_ce_se: u32 [0x58, 8];
        /// [`FenceMode`](crate::FenceMode) (`fm_ce_se` [7:5]).
        fence_mode, set_fence_mode: u32 [0x58, 3] = "fm_ce_se.fm";
        /// [`CompletionMode`](crate::CompletionMode) (`fm_ce_se` [3:2]).
        completion_mode, set_completion_mode: u32 [0x5c, 2] = "fm_ce_se.ce";
        /// Solicited event (`fm_ce_se` bit1).
        solicited, set_solicited: u32 [0x5e, 1] = "fm_ce_se.se";
        /// Immediate data (already big-endian, as on the wire) or the rkey to invalidate.
        imm, set_imm: u32 [0x60, 32];
    }
}

prm_struct! {
    /// Remote address segment (device.h `mlx5_wqe_raddr_seg`; mlx5.md §9.3).
    pub struct WqeRaddrSeg, mod wqe_raddr_seg = "wqe_raddr_seg", size_bits: 0x80, source: Source::Doc("mlx5.md §9.3");
    {
        raddr, set_raddr: u64 [0x0, 64];
        rkey, set_rkey: u32 [0x40, 32];
    }
}

prm_struct! {
    /// Atomic segment (device.h `mlx5_wqe_atomic_seg`; mlx5.md §9.3): swap (CS) or add (FA),
    /// compare (CS only).
    pub struct WqeAtomicSeg, mod wqe_atomic_seg = "wqe_atomic_seg", size_bits: 0x80, source: Source::Doc("mlx5.md §9.3");
    {
        swap_add, set_swap_add: u64 [0x0, 64];
        compare, set_compare: u64 [0x40, 64];
    }
}

prm_struct! {
    /// Data pointer segment (device.h `mlx5_wqe_data_seg`; mlx5.md §9.3, §9.4): send
    /// gather entries and receive WQE slots. A receive terminator is byte_count 0, lkey
    /// [`INVALID_LKEY`](crate::INVALID_LKEY), addr 0.
    pub struct WqeDataSeg, mod wqe_data_seg = "wqe_data_seg", size_bits: 0x80, source: Source::Doc("mlx5.md §9.3");
    {
        byte_count, set_byte_count: u32 [0x0, 32];
        lkey, set_lkey: u32 [0x20, 32];
        addr, set_addr: u64 [0x40, 64];
    }
}

prm_struct! {
    /// Inline segment header (device.h `mlx5_wqe_inline_seg`; mlx5.md §9.3): `len | 0x80000000`,
    /// then `len` bytes, padded to 16 bytes (DS += ceil((4 + len) / 16)).
    pub struct WqeInlineSeg, mod wqe_inline_seg = "wqe_inline_seg", size_bits: 0x20, source: Source::Doc("mlx5.md §9.3");
    {
        byte_count, set_byte_count: u32 [0x0, 32];
        /// Must be 1 ([`INLINE_SEG_FLAG`](crate::INLINE_SEG_FLAG)).
        inline, set_inline: u32 [0x0, 1] = "byte_count.inline";
        len, set_len: u32 [0x1, 31] = "byte_count.len";
    }
}

prm_struct! {
    /// QP doorbell record in host memory (8 bytes at `qpc.dbr_addr`; mlx5.md §8). Each
    /// counter is a BE32 whose low 16 bits the driver writes. Names are rnic's.
    pub struct QpDoorbellRecord, mod qp_doorbell_record = "qp_doorbell_record", size_bits: 0x40, source: Source::Doc("mlx5.md §8");
    {
        /// RQ WQEs posted (`rq.head & 0xffff`).
        recv_counter, set_recv_counter: u32 [0x0, 32];
        /// SQ producer in WQEBBs (`sq.cur_post & 0xffff`).
        send_counter, set_send_counter: u32 [0x20, 32];
    }
}

prm_struct! {
    /// CQ doorbell record in host memory (8 bytes at `cqc.dbr_addr`; mlx5.md §8).
    pub struct CqDoorbellRecord, mod cq_doorbell_record = "cq_doorbell_record", size_bits: 0x40, source: Source::Doc("mlx5.md §8");
    {
        /// `cons_index & 0xffffff`.
        set_ci, set_set_ci: u32 [0x8, 24];
        arm_sn, set_arm_sn: u32 [0x22, 2] = "arm.arm_sn";
        /// [`CqArmCmd`](crate::CqArmCmd).
        arm_cmd, set_arm_cmd: u32 [0x24, 4] = "arm.cmd";
        arm_ci, set_arm_ci: u32 [0x28, 24] = "arm.ci";
    }
}

prm_struct! {
    /// The 64-bit CQ doorbell written to UAR + [`UAR_CQ_DOORBELL`](crate::UAR_CQ_DOORBELL)
    /// (mlx5.md §8): high dword as the record's `arm`, low dword `cqn`.
    pub struct CqUarDoorbell, mod cq_uar_doorbell = "cq_uar_doorbell", size_bits: 0x40, source: Source::Doc("mlx5.md §8");
    {
        arm_sn, set_arm_sn: u32 [0x2, 2];
        cmd, set_cmd: u32 [0x4, 4];
        ci, set_ci: u32 [0x8, 24];
        cqn, set_cqn: u32 [0x20, 32];
    }
}

prm_struct! {
    /// The BE32 EQ doorbell written to UAR + [`UAR_EQ_DOORBELL_ARM`](crate::UAR_EQ_DOORBELL_ARM)
    /// or [`UAR_EQ_DOORBELL_NO_ARM`](crate::UAR_EQ_DOORBELL_NO_ARM) (mlx5.md §8).
    pub struct EqUarDoorbell, mod eq_uar_doorbell = "eq_uar_doorbell", size_bits: 0x20, source: Source::Doc("mlx5.md §8");
    {
        eqn, set_eqn: u32 [0x0, 8];
        cons_index, set_cons_index: u32 [0x8, 24];
    }
}
