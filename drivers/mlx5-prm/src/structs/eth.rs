//! Raw Ethernet queues (mlx5.md §5.1 ALLOC_TRANSPORT_DOMAIN; opcodes from K `mlx5_ifc.h`): the
//! transport interface send/receive objects (TIS, TIR), the send and receive queues with
//! their work queue (`wq`), the Ethernet offload capability page, and — from K `qp.h`, not
//! the ifc header — the Ethernet segment of a raw send WQE.
//!
//! A raw Ethernet send path is TD → TIS → SQ (on a CQ); a receive path is TD → RQ (on a
//! CQ) → TIR (direct: one RQ) → a flow table rule whose destination is the TIR.

use super::*;

prm_struct! {
    /// Transport interface send context: the send side's transport domain and priority (a raw Ethernet SQ names one TIS).
    pub struct Tisc, mod tisc = "tisc", size_bits: 0x500, source: Source::Ifc;
    {
        strict_lag_tx_port_affinity, set_strict_lag_tx_port_affinity: u32 [0x0, 1];
        tls_en, set_tls_en: u32 [0x1, 1];
        lag_tx_port_affinity, set_lag_tx_port_affinity: u32 [0x4, 4];
        prio, set_prio: u32 [0xc, 4];
        transport_domain, set_transport_domain: u32 [0x128, 24];
        underlay_qpn, set_underlay_qpn: u32 [0x148, 24];
        pd, set_pd: u32 [0x168, 24];
    }
}

prm_struct! {
    /// CREATE_TIS (0x912) input: `tisc` at 0x20.
    pub struct CreateTisIn, mod create_tis_in = "create_tis_in", size_bits: 0x600, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        uid, set_uid: u32 [0x10, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        ctx, ctx_mut: {Tisc} [0x100, 1280];
    }
}

prm_struct! {
    /// CREATE_TIS output.
    pub struct CreateTisOut, mod create_tis_out = "create_tis_out", size_bits: 0x80, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
        tisn, set_tisn: u32 [0x48, 24];
    }
}

prm_struct! {
    /// DESTROY_TIS (0x914) input.
    pub struct DestroyTisIn, mod destroy_tis_in = "destroy_tis_in", size_bits: 0x80, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        uid, set_uid: u32 [0x10, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        tisn, set_tisn: u32 [0x48, 24];
    }
}

prm_struct! {
    /// DESTROY_TIS output.
    pub struct DestroyTisOut, mod destroy_tis_out = "destroy_tis_out", size_bits: 0x80, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
    }
}

prm_struct! {
    /// Work queue: the ring of an SQ or RQ (`wq_type` cyclic, stride `1 << log_wq_stride` bytes, `1 << log_wq_sz` entries, pages `4 KiB << log_wq_pg_sz`), its doorbell record and `pas[]`.
    pub struct Wq, mod wq = "wq", size_bits: 0x600, source: Source::Ifc;
    {
        wq_type, set_wq_type: u32 [0x0, 4];
        wq_signature, set_wq_signature: u32 [0x4, 1];
        end_padding_mode, set_end_padding_mode: u32 [0x5, 2];
        cd_slave, set_cd_slave: u32 [0x7, 1];
        page_offset, set_page_offset: u32 [0x2b, 5];
        lwm, set_lwm: u32 [0x30, 16];
        pd, set_pd: u32 [0x48, 24];
        uar_page, set_uar_page: u32 [0x68, 24];
        dbr_addr, set_dbr_addr: u64 [0x80, 64];
        hw_counter, set_hw_counter: u32 [0xc0, 32];
        sw_counter, set_sw_counter: u32 [0xe0, 32];
        log_wq_stride, set_log_wq_stride: u32 [0x10c, 4];
        log_wq_pg_sz, set_log_wq_pg_sz: u32 [0x113, 5];
        log_wq_sz, set_log_wq_sz: u32 [0x11b, 5];
        dbr_umem_valid, set_dbr_umem_valid: u32 [0x120, 1];
        wq_umem_valid, set_wq_umem_valid: u32 [0x121, 1];
        log_wqe_num_of_strides, set_log_wqe_num_of_strides: u32 [0x134, 4];
        two_byte_shift_en, set_two_byte_shift_en: u32 [0x138, 1];
        log_wqe_stride_size, set_log_wqe_stride_size: u32 [0x13d, 3];
        dbr_umem_id, set_dbr_umem_id: u32 [0x140, 32];
        wq_umem_id, set_wq_umem_id: u32 [0x160, 32];
        wq_umem_offset, set_wq_umem_offset: u64 [0x180, 64];
        pas, set_pas: [u64; flex] [0x600, 64];
    }
}

prm_struct! {
    /// Send queue context (a raw Ethernet SQ): `state` RST/RDY/ERR, completion queue, `min_wqe_inline_mode`, its TIS (`tis_lst_sz` 1, `tis_num_0`) and its `wq`.
    pub struct Sqc, mod sqc = "sqc", size_bits: 0x780, source: Source::Ifc;
    {
        rlky, set_rlky: u32 [0x0, 1];
        cd_master, set_cd_master: u32 [0x1, 1];
        fre, set_fre: u32 [0x2, 1];
        flush_in_error_en, set_flush_in_error_en: u32 [0x3, 1];
        allow_multi_pkt_send_wqe, set_allow_multi_pkt_send_wqe: u32 [0x4, 1];
        min_wqe_inline_mode, set_min_wqe_inline_mode: u32 [0x5, 3];
        state, set_state: u32 [0x8, 4];
        reg_umr, set_reg_umr: u32 [0xc, 1];
        allow_swp, set_allow_swp: u32 [0xd, 1];
        hairpin, set_hairpin: u32 [0xe, 1];
        non_wire, set_non_wire: u32 [0xf, 1];
        ts_format, set_ts_format: u32 [0x1a, 2];
        user_index, set_user_index: u32 [0x28, 24];
        cqn, set_cqn: u32 [0x48, 24];
        hairpin_peer_rq, set_hairpin_peer_rq: u32 [0x68, 24];
        hairpin_peer_vhca, set_hairpin_peer_vhca: u32 [0x90, 16];
        ts_cqe_to_dest_cqn, set_ts_cqe_to_dest_cqn: u32 [0xc8, 24];
        packet_pacing_rate_limit_index, set_packet_pacing_rate_limit_index: u32 [0xf0, 16];
        tis_lst_sz, set_tis_lst_sz: u32 [0x100, 16];
        qos_queue_group_id, set_qos_queue_group_id: u32 [0x110, 16];
        tis_num_0, set_tis_num_0: u32 [0x168, 24];
        wq, wq_mut: {Wq} [0x180, 1536];
    }
}

prm_struct! {
    /// CREATE_SQ (0x904) input: `sqc` at 0x20 (its `wq.pas[]` at 0x110).
    pub struct CreateSqIn, mod create_sq_in = "create_sq_in", size_bits: 0x880, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        uid, set_uid: u32 [0x10, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        ctx, ctx_mut: {Sqc} [0x100, 1920];
    }
}

prm_struct! {
    /// CREATE_SQ output.
    pub struct CreateSqOut, mod create_sq_out = "create_sq_out", size_bits: 0x80, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
        sqn, set_sqn: u32 [0x48, 24];
    }
}

prm_struct! {
    /// MODIFY_SQ (0x905) input: `sq_state` is the current state, `ctx.state` the next.
    pub struct ModifySqIn, mod modify_sq_in = "modify_sq_in", size_bits: 0x880, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        uid, set_uid: u32 [0x10, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        sq_state, set_sq_state: u32 [0x40, 4];
        sqn, set_sqn: u32 [0x48, 24];
        modify_bitmask, set_modify_bitmask: u64 [0x80, 64];
        ctx, ctx_mut: {Sqc} [0x100, 1920];
    }
}

prm_struct! {
    /// MODIFY_SQ output.
    pub struct ModifySqOut, mod modify_sq_out = "modify_sq_out", size_bits: 0x80, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
    }
}

prm_struct! {
    /// DESTROY_SQ (0x906) input.
    pub struct DestroySqIn, mod destroy_sq_in = "destroy_sq_in", size_bits: 0x80, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        uid, set_uid: u32 [0x10, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        sqn, set_sqn: u32 [0x48, 24];
    }
}

prm_struct! {
    /// DESTROY_SQ output.
    pub struct DestroySqOut, mod destroy_sq_out = "destroy_sq_out", size_bits: 0x80, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
    }
}

prm_struct! {
    /// QUERY_SQ (0x907) input.
    pub struct QuerySqIn, mod query_sq_in = "query_sq_in", size_bits: 0x80, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        sqn, set_sqn: u32 [0x48, 24];
    }
}

prm_struct! {
    /// QUERY_SQ output: the context at 0x20.
    pub struct QuerySqOut, mod query_sq_out = "query_sq_out", size_bits: 0x880, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
        sq_context, sq_context_mut: {Sqc} [0x100, 1920];
    }
}

prm_struct! {
    /// Receive queue context (a raw Ethernet RQ): `state` RST/RDY/ERR, `mem_rq_type` inline (0), completion queue, `vsd` (VLAN strip disable), `scatter_fcs` and its `wq`.
    pub struct Rqc, mod rqc = "rqc", size_bits: 0x780, source: Source::Ifc;
    {
        rlky, set_rlky: u32 [0x0, 1];
        delay_drop_en, set_delay_drop_en: u32 [0x1, 1];
        scatter_fcs, set_scatter_fcs: u32 [0x2, 1];
        vsd, set_vsd: u32 [0x3, 1];
        mem_rq_type, set_mem_rq_type: u32 [0x4, 4];
        state, set_state: u32 [0x8, 4];
        flush_in_error_en, set_flush_in_error_en: u32 [0xd, 1];
        hairpin, set_hairpin: u32 [0xe, 1];
        ts_format, set_ts_format: u32 [0x1a, 2];
        user_index, set_user_index: u32 [0x28, 24];
        cqn, set_cqn: u32 [0x48, 24];
        counter_set_id, set_counter_set_id: u32 [0x60, 8];
        rmpn, set_rmpn: u32 [0x88, 24];
        hairpin_peer_sq, set_hairpin_peer_sq: u32 [0xa8, 24];
        hairpin_peer_vhca, set_hairpin_peer_vhca: u32 [0xd0, 16];
        wq, wq_mut: {Wq} [0x180, 1536];
    }
}

prm_struct! {
    /// CREATE_RQ (0x908) input: `rqc` at 0x20 (its `wq.pas[]` at 0x110).
    pub struct CreateRqIn, mod create_rq_in = "create_rq_in", size_bits: 0x880, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        uid, set_uid: u32 [0x10, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        ctx, ctx_mut: {Rqc} [0x100, 1920];
    }
}

prm_struct! {
    /// CREATE_RQ output.
    pub struct CreateRqOut, mod create_rq_out = "create_rq_out", size_bits: 0x80, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
        rqn, set_rqn: u32 [0x48, 24];
    }
}

prm_struct! {
    /// MODIFY_RQ (0x909) input: `rq_state` is the current state, `ctx.state` the next.
    pub struct ModifyRqIn, mod modify_rq_in = "modify_rq_in", size_bits: 0x880, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        uid, set_uid: u32 [0x10, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        rq_state, set_rq_state: u32 [0x40, 4];
        rqn, set_rqn: u32 [0x48, 24];
        modify_bitmask, set_modify_bitmask: u64 [0x80, 64];
        ctx, ctx_mut: {Rqc} [0x100, 1920];
    }
}

prm_struct! {
    /// MODIFY_RQ output.
    pub struct ModifyRqOut, mod modify_rq_out = "modify_rq_out", size_bits: 0x80, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
    }
}

prm_struct! {
    /// DESTROY_RQ (0x90a) input.
    pub struct DestroyRqIn, mod destroy_rq_in = "destroy_rq_in", size_bits: 0x80, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        uid, set_uid: u32 [0x10, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        rqn, set_rqn: u32 [0x48, 24];
    }
}

prm_struct! {
    /// DESTROY_RQ output.
    pub struct DestroyRqOut, mod destroy_rq_out = "destroy_rq_out", size_bits: 0x80, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
    }
}

prm_struct! {
    /// QUERY_RQ (0x90b) input.
    pub struct QueryRqIn, mod query_rq_in = "query_rq_in", size_bits: 0x80, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        rqn, set_rqn: u32 [0x48, 24];
    }
}

prm_struct! {
    /// QUERY_RQ output: the context at 0x20.
    pub struct QueryRqOut, mod query_rq_out = "query_rq_out", size_bits: 0x880, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
        rq_context, rq_context_mut: {Rqc} [0x100, 1920];
    }
}

prm_struct! {
    /// Transport interface receive context: `disp_type` direct (0) dispatches to the one RQ `inline_rqn`; indirect (1) hashes over an RQ table. `self_lb_block` bit0 unicast, bit1 multicast loopback blocked.
    pub struct Tirc, mod tirc = "tirc", size_bits: 0x780, source: Source::Ifc;
    {
        disp_type, set_disp_type: u32 [0x20, 4];
        tls_en, set_tls_en: u32 [0x24, 1];
        lro_timeout_period_usecs, set_lro_timeout_period_usecs: u32 [0x84, 16];
        packet_merge_mask, set_packet_merge_mask: u32 [0x94, 4];
        lro_max_ip_payload_size, set_lro_max_ip_payload_size: u32 [0x98, 8];
        inline_rqn, set_inline_rqn: u32 [0xe8, 24];
        rx_hash_symmetric, set_rx_hash_symmetric: u32 [0x100, 1];
        tunneled_offload_en, set_tunneled_offload_en: u32 [0x102, 1];
        indirect_table, set_indirect_table: u32 [0x108, 24];
        rx_hash_fn, set_rx_hash_fn: u32 [0x120, 4];
        self_lb_block, set_self_lb_block: u32 [0x126, 2];
        transport_domain, set_transport_domain: u32 [0x128, 24];
        rx_hash_toeplitz_key, set_rx_hash_toeplitz_key: [u32; 10] [0x140, 320];
        rx_hash_field_selector_outer, set_rx_hash_field_selector_outer: u32 [0x280, 32];
        rx_hash_field_selector_inner, set_rx_hash_field_selector_inner: u32 [0x2a0, 32];
    }
}

prm_struct! {
    /// CREATE_TIR (0x900) input: `tirc` at 0x20.
    pub struct CreateTirIn, mod create_tir_in = "create_tir_in", size_bits: 0x880, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        uid, set_uid: u32 [0x10, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        ctx, ctx_mut: {Tirc} [0x100, 1920];
    }
}

prm_struct! {
    /// CREATE_TIR output.
    pub struct CreateTirOut, mod create_tir_out = "create_tir_out", size_bits: 0x80, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
        tirn, set_tirn: u32 [0x48, 24];
    }
}

prm_struct! {
    /// DESTROY_TIR (0x902) input.
    pub struct DestroyTirIn, mod destroy_tir_in = "destroy_tir_in", size_bits: 0x80, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        uid, set_uid: u32 [0x10, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        tirn, set_tirn: u32 [0x48, 24];
    }
}

prm_struct! {
    /// DESTROY_TIR output.
    pub struct DestroyTirOut, mod destroy_tir_out = "destroy_tir_out", size_bits: 0x80, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
    }
}

prm_struct! {
    /// QUERY_TIR (0x903) input.
    pub struct QueryTirIn, mod query_tir_in = "query_tir_in", size_bits: 0x80, source: Source::Ifc;
    {
        opcode, set_opcode: u32 [0x0, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
        tirn, set_tirn: u32 [0x48, 24];
    }
}

prm_struct! {
    /// QUERY_TIR output: the context at 0x20.
    pub struct QueryTirOut, mod query_tir_out = "query_tir_out", size_bits: 0x880, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 8];
        syndrome, set_syndrome: u32 [0x20, 32];
        tir_context, tir_context_mut: {Tirc} [0x100, 1920];
    }
}

prm_struct! {
    /// Ethernet offload capabilities (cap type 1): `wqe_inline_mode` says how many packet headers each send WQE must carry inline (0 L2 always, 1 per the vport context's `min_wqe_inline_mode`, 2 none).
    pub struct PerProtocolNetworkingOffloadCaps, mod per_protocol_networking_offload_caps = "per_protocol_networking_offload_caps", size_bits: 0x800, source: Source::Ifc;
    {
        csum_cap, set_csum_cap: u32 [0x0, 1];
        vlan_cap, set_vlan_cap: u32 [0x1, 1];
        lro_cap, set_lro_cap: u32 [0x2, 1];
        lro_psh_flag, set_lro_psh_flag: u32 [0x3, 1];
        lro_time_stamp, set_lro_time_stamp: u32 [0x4, 1];
        wqe_vlan_insert, set_wqe_vlan_insert: u32 [0x7, 1];
        self_lb_en_modifiable, set_self_lb_en_modifiable: u32 [0x8, 1];
        max_lso_cap, set_max_lso_cap: u32 [0xb, 5];
        multi_pkt_send_wqe, set_multi_pkt_send_wqe: u32 [0x10, 2];
        wqe_inline_mode, set_wqe_inline_mode: u32 [0x12, 2];
        rss_ind_tbl_cap, set_rss_ind_tbl_cap: u32 [0x14, 4];
        reg_umr_sq, set_reg_umr_sq: u32 [0x18, 1];
        scatter_fcs, set_scatter_fcs: u32 [0x19, 1];
        enhanced_multi_pkt_send_wqe, set_enhanced_multi_pkt_send_wqe: u32 [0x1a, 1];
        tunnel_lso_const_out_ip_id, set_tunnel_lso_const_out_ip_id: u32 [0x1b, 1];
        swp, set_swp: u32 [0x20, 1];
        swp_csum, set_swp_csum: u32 [0x21, 1];
        swp_lso, set_swp_lso: u32 [0x22, 1];
        cqe_checksum_full, set_cqe_checksum_full: u32 [0x23, 1];
        max_vxlan_udp_ports, set_max_vxlan_udp_ports: u32 [0x30, 8];
        lro_min_mss_size, set_lro_min_mss_size: u32 [0x50, 16];
    }
}

prm_struct! {
    /// The Ethernet segment of a raw Ethernet send WQE, after the control segment (K
    /// `include/linux/mlx5/qp.h` `struct mlx5_wqe_eth_seg`; 16 bytes). `inline_hdr.sz` bytes
    /// of the frame's headers are carried inline from `inline_hdr.start`, running on into the
    /// following 16-byte units (rdma-core `providers/mlx5/qp.c`); the data segments carry
    /// the rest. The union's other reading (`insert`: VLAN insertion) shares the last dword.
    pub struct WqeEthSeg, mod wqe_eth_seg = "wqe_eth_seg", size_bits: 0x80, source: Source::Doc("K qp.h struct mlx5_wqe_eth_seg");
    {
        swp_outer_l4_offset, set_swp_outer_l4_offset: u32 [0x0, 8];
        swp_outer_l3_offset, set_swp_outer_l3_offset: u32 [0x8, 8];
        swp_inner_l4_offset, set_swp_inner_l4_offset: u32 [0x10, 8];
        swp_inner_l3_offset, set_swp_inner_l3_offset: u32 [0x18, 8];
        /// Checksum offloads ([`eth_cs_flags`](crate::eth_cs_flags)).
        cs_flags, set_cs_flags: u32 [0x20, 8];
        swp_flags, set_swp_flags: u32 [0x28, 8];
        /// The segment size of an LSO WQE.
        mss, set_mss: u32 [0x30, 16];
        /// Bytes of inline headers, from `inline_hdr.start` on.
        inline_hdr_sz, set_inline_hdr_sz: u32 [0x60, 16] = "inline_hdr.sz";
        /// The first two inline header bytes (the rest follow the segment).
        inline_hdr_start, set_inline_hdr_start: bytes [0x70, 16] = "inline_hdr.start";
        /// VLAN insertion (`insert.type`; [`ETH_WQE_INSERT_VLAN`](crate::ETH_WQE_INSERT_VLAN)).
        insert_type, set_insert_type: u32 [0x60, 16] = "insert.type";
        /// VLAN insertion: the tag control information.
        insert_vlan_tci, set_insert_vlan_tci: u32 [0x70, 16] = "insert.vlan_tci";
    }
}
