//! Capability pages and object contexts: cmd_hca_cap, roce_cap, mkc, mtt, eqc, cqc, qpc, ads, vport contexts, roce_addr_layout (mlx5.md §5-§7).

use super::*;

prm_struct! {
    /// General device capabilities (cap type 0): the fields mlx5.md §5.3 and §3 steps 10-11 name, and the limits a driver checks.
    pub struct CmdHcaCap, mod cmd_hca_cap = "cmd_hca_cap", size_bits: 0x800, source: Source::Ifc;
    {
        vhca_id, set_vhca_id: u32 [0x30, 16];
        abs_native_port_num, set_abs_native_port_num: u32 [0x7, 1];
        log_max_srq_sz, set_log_max_srq_sz: u32 [0x80, 8];
        log_max_qp_sz, set_log_max_qp_sz: u32 [0x88, 8];
        log_max_qp, set_log_max_qp: u32 [0x9b, 5];
        log_max_srq, set_log_max_srq: u32 [0xab, 5];
        ece_support, set_ece_support: u32 [0xa3, 1];
        log_max_cq_sz, set_log_max_cq_sz: u32 [0xc8, 8];
        log_max_cq, set_log_max_cq: u32 [0xdb, 5];
        log_max_eq_sz, set_log_max_eq_sz: u32 [0xe0, 8];
        relaxed_ordering_write, set_relaxed_ordering_write: u32 [0xe8, 1];
        log_max_mkey, set_log_max_mkey: u32 [0xea, 6];
        terminate_scatter_list_mkey, set_terminate_scatter_list_mkey: u32 [0xf6, 1];
        fast_teardown, set_fast_teardown: u32 [0xfb, 1];
        log_max_eq, set_log_max_eq: u32 [0xfc, 4];
        max_indirection, set_max_indirection: u32 [0x100, 8];
        log_max_mrw_sz, set_log_max_mrw_sz: u32 [0x109, 7];
        force_teardown, set_force_teardown: u32 [0x110, 1];
        log_max_bsf_list_size, set_log_max_bsf_list_size: u32 [0x112, 6];
        log_max_klm_list_size, set_log_max_klm_list_size: u32 [0x11a, 6];
        log_max_ra_req_qp, set_log_max_ra_req_qp: u32 [0x14a, 6];
        release_all_pages, set_release_all_pages: u32 [0x145, 1];
        log_max_ra_res_qp, set_log_max_ra_res_qp: u32 [0x15a, 6];
        start_pad, set_start_pad: u32 [0x163, 1];
        cache_line_128byte, set_cache_line_128byte: u32 [0x164, 1];
        gid_table_size, set_gid_table_size: u32 [0x170, 16];
        pkey_table_size, set_pkey_table_size: u32 [0x190, 16];
        vport_group_manager, set_vport_group_manager: u32 [0x1a0, 1];
        vhca_group_manager, set_vhca_group_manager: u32 [0x1a1, 1];
        ib_virt, set_ib_virt: u32 [0x1a2, 1];
        nic_flow_table, set_nic_flow_table: u32 [0x1a6, 1];
        port_module_event, set_port_module_event: u32 [0x1b0, 1];
        port_type, set_port_type: u32 [0x1b6, 2];
        num_ports, set_num_ports: u32 [0x1b8, 8];
        log_max_msg, set_log_max_msg: u32 [0x1c3, 5];
        max_tc, set_max_tc: u32 [0x1cc, 4];
        temp_warn_event, set_temp_warn_event: u32 [0x1d0, 1];
        general_notification_event, set_general_notification_event: u32 [0x1d2, 1];
        cqe_version, set_cqe_version: u32 [0x1fc, 4];
        drain_sigerr, set_drain_sigerr: u32 [0x20f, 1];
        cmdif_checksum, set_cmdif_checksum: u32 [0x210, 2];
        dct, set_dct: u32 [0x21a, 1];
        eth_net_offloads, set_eth_net_offloads: u32 [0x21c, 1];
        roce, set_roce: u32 [0x21d, 1];
        atomic, set_atomic: u32 [0x21e, 1];
        eswitch_manager, set_eswitch_manager: u32 [0x1a7, 1];
        log_max_l2_table, set_log_max_l2_table: u32 [0x483, 5];
        cq_oi, set_cq_oi: u32 [0x220, 1];
        cq_resize, set_cq_resize: u32 [0x221, 1];
        cq_moderation, set_cq_moderation: u32 [0x222, 1];
        cq_eq_remap, set_cq_eq_remap: u32 [0x226, 1];
        pg, set_pg: u32 [0x227, 1];
        imaicl, set_imaicl: u32 [0x231, 1];
        qkv, set_qkv: u32 [0x236, 1];
        pkv, set_pkv: u32 [0x237, 1];
        ud, set_ud: u32 [0x23d, 1];
        uc, set_uc: u32 [0x23e, 1];
        rc, set_rc: u32 [0x23f, 1];
        uar_4k, set_uar_4k: u32 [0x240, 1];
        umem_uid_0, set_umem_uid_0: u32 [0x252, 1];
        log_pg_sz, set_log_pg_sz: u32 [0x258, 8];
        bf, set_bf: u32 [0x260, 1];
        driver_version, set_driver_version: u32 [0x261, 1];
        mkey_by_name, set_mkey_by_name: u32 [0x266, 1];
        log_bf_reg_size, set_log_bf_reg_size: u32 [0x26b, 5];
        max_wqe_sz_sq, set_max_wqe_sz_sq: u32 [0x290, 16];
        max_wqe_sz_rq, set_max_wqe_sz_rq: u32 [0x2b0, 16];
        max_qp_mcg, set_max_qp_mcg: u32 [0x2e7, 25];
        log_max_mcg, set_log_max_mcg: u32 [0x318, 8];
        log_max_transport_domain, set_log_max_transport_domain: u32 [0x323, 5];
        relaxed_ordering_read, set_relaxed_ordering_read: u32 [0x32a, 1];
        log_max_pd, set_log_max_pd: u32 [0x32b, 5];
        log_max_xrcd, set_log_max_xrcd: u32 [0x33b, 5];
        vport_counters, set_vport_counters: u32 [0x181, 1];
        eth_virt, set_eth_virt: u32 [0x1a3, 1];
        log_max_rq, set_log_max_rq: u32 [0x363, 5];
        log_max_sq, set_log_max_sq: u32 [0x36b, 5];
        log_max_tir, set_log_max_tir: u32 [0x373, 5];
        log_max_tis, set_log_max_tis: u32 [0x37b, 5];
        basic_cyclic_rcv_wqe, set_basic_cyclic_rcv_wqe: u32 [0x380, 1];
        log_max_rqt, set_log_max_rqt: u32 [0x38b, 5];
        log_max_rqt_size, set_log_max_rqt_size: u32 [0x393, 5];
        log_max_tis_per_sq, set_log_max_tis_per_sq: u32 [0x39b, 5];
        roce_rw_supported, set_roce_rw_supported: u32 [0x3a1, 1];
        log_max_wq_sz, set_log_max_wq_sz: u32 [0x3db, 5];
        log_max_current_mc_list, set_log_max_current_mc_list: u32 [0x3f3, 5];
        log_max_current_uc_list, set_log_max_current_uc_list: u32 [0x3fb, 5];
        nic_vport_change_event, set_nic_vport_change_event: u32 [0x3e0, 1];
        disable_local_lb_uc, set_disable_local_lb_uc: u32 [0x3e1, 1];
        disable_local_lb_mc, set_disable_local_lb_mc: u32 [0x3e2, 1];
        sq_ts_format, set_sq_ts_format: u32 [0x440, 2];
        rq_ts_format, set_rq_ts_format: u32 [0x442, 2];
        log_uar_page_sz, set_log_uar_page_sz: u32 [0x490, 16];
        cqe_128_always, set_cqe_128_always: u32 [0x5bd, 1];
        cqe_compression, set_cqe_compression: u32 [0x5bf, 1];
        flex_parser_protocols, set_flex_parser_protocols: u32 [0x540, 32];
        num_vhca_ports, set_num_vhca_ports: u32 [0x610, 8];
        sw_owner_id, set_sw_owner_id: u32 [0x61e, 1];
    }
}

prm_struct! {
    /// RoCE capabilities (cap type 4; mlx5.md §5.3).
    pub struct RoceCap, mod roce_cap = "roce_cap", size_bits: 0x800, source: Source::Ifc;
    {
        roce_apm, set_roce_apm: u32 [0x0, 1];
        sw_r_roce_src_udp_port, set_sw_r_roce_src_udp_port: u32 [0x4, 1];
        fl_rc_qp_when_roce_disabled, set_fl_rc_qp_when_roce_disabled: u32 [0x5, 1];
        fl_rc_qp_when_roce_enabled, set_fl_rc_qp_when_roce_enabled: u32 [0x6, 1];
        roce_cc_general, set_roce_cc_general: u32 [0x7, 1];
        qp_ooo_transmit_default, set_qp_ooo_transmit_default: u32 [0x8, 1];
        qp_ts_format, set_qp_ts_format: u32 [0x1e, 2];
        l3_type, set_l3_type: u32 [0x8c, 4];
        roce_version, set_roce_version: u32 [0x98, 8];
        r_roce_dest_udp_port, set_r_roce_dest_udp_port: u32 [0xb0, 16];
        r_roce_max_src_udp_port, set_r_roce_max_src_udp_port: u32 [0xc0, 16];
        r_roce_min_src_udp_port, set_r_roce_min_src_udp_port: u32 [0xd0, 16];
        roce_address_table_size, set_roce_address_table_size: u32 [0xf0, 16];
    }
}

prm_struct! {
    /// Memory key context (mlx5.md §6). `log_page_size` is log2(page) itself, unlike QP/CQ/EQ contexts.
    pub struct Mkc, mod mkc = "mkc", size_bits: 0x200, source: Source::Ifc;
    {
        free, set_free: u32 [0x1, 1];
        access_mode_4_2, set_access_mode_4_2: u32 [0x3, 3];
        relaxed_ordering_write, set_relaxed_ordering_write: u32 [0xd, 1];
        small_fence_on_rdma_read_response, set_small_fence_on_rdma_read_response: u32 [0xf, 1];
        umr_en, set_umr_en: u32 [0x10, 1];
        a, set_a: u32 [0x11, 1];
        rw, set_rw: u32 [0x12, 1];
        rr, set_rr: u32 [0x13, 1];
        lw, set_lw: u32 [0x14, 1];
        lr, set_lr: u32 [0x15, 1];
        access_mode_1_0, set_access_mode_1_0: u32 [0x16, 2];
        ma_translation_mode, set_ma_translation_mode: u32 [0x1a, 2];
        qpn, set_qpn: u32 [0x20, 24];
        mkey_7_0, set_mkey_7_0: u32 [0x38, 8];
        length64, set_length64: u32 [0x60, 1];
        bsf_en, set_bsf_en: u32 [0x61, 1];
        sync_umr, set_sync_umr: u32 [0x62, 1];
        expected_sigerr_count, set_expected_sigerr_count: u32 [0x65, 1];
        en_rinval, set_en_rinval: u32 [0x67, 1];
        pd, set_pd: u32 [0x68, 24];
        start_addr, set_start_addr: u64 [0x80, 64];
        len, set_len: u64 [0xc0, 64];
        bsf_octword_size, set_bsf_octword_size: u32 [0x100, 32];
        crossing_target_vhca_id, set_crossing_target_vhca_id: u32 [0x180, 16];
        translations_octword_size, set_translations_octword_size: u32 [0x1a0, 32];
        relaxed_ordering_read, set_relaxed_ordering_read: u32 [0x1d9, 1];
        log_page_size, set_log_page_size: u32 [0x1da, 6];
    }
}

prm_struct! {
    /// One MTT entry: page address | `rd_en` (0x1) | `wr_en` (0x2) (mlx5.md §6).
    pub struct Mtt, mod mtt = "mtt", size_bits: 0x40, source: Source::Ifc;
    {
        ptag_63_32, set_ptag_63_32: u32 [0x0, 32];
        ptag_31_8, set_ptag_31_8: u32 [0x20, 24];
        wr_en, set_wr_en: u32 [0x3e, 1];
        rd_en, set_rd_en: u32 [0x3f, 1];
    }
}

prm_struct! {
    /// Event queue context (mlx5.md §7.1).
    pub struct Eqc, mod eqc = "eqc", size_bits: 0x200, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 4];
        ec, set_ec: u32 [0xd, 1];
        oi, set_oi: u32 [0xe, 1];
        st, set_st: u32 [0x14, 4];
        page_offset, set_page_offset: u32 [0x54, 6];
        log_eq_size, set_log_eq_size: u32 [0x63, 5];
        uar_page, set_uar_page: u32 [0x68, 24];
        intr, set_intr: u32 [0xb4, 12];
        log_page_size, set_log_page_size: u32 [0xc3, 5];
        consumer_counter, set_consumer_counter: u32 [0x148, 24];
        producer_counter, set_producer_counter: u32 [0x168, 24];
    }
}

prm_struct! {
    /// Completion queue context (mlx5.md §7.2). Keep `cqe_comp_en` 0.
    pub struct Cqc, mod cqc = "cqc", size_bits: 0x200, source: Source::Ifc;
    {
        status, set_status: u32 [0x0, 4];
        dbr_umem_valid, set_dbr_umem_valid: u32 [0x6, 1];
        apu_cq, set_apu_cq: u32 [0x7, 1];
        cqe_sz, set_cqe_sz: u32 [0x8, 3];
        cc, set_cc: u32 [0xb, 1];
        scqe_break_moderation_en, set_scqe_break_moderation_en: u32 [0xd, 1];
        oi, set_oi: u32 [0xe, 1];
        cq_period_mode, set_cq_period_mode: u32 [0xf, 2];
        cqe_comp_en, set_cqe_comp_en: u32 [0x11, 1];
        mini_cqe_res_format, set_mini_cqe_res_format: u32 [0x12, 2];
        st, set_st: u32 [0x14, 4];
        cqe_compression_layout, set_cqe_compression_layout: u32 [0x1e, 2];
        page_offset, set_page_offset: u32 [0x54, 6];
        log_cq_size, set_log_cq_size: u32 [0x63, 5];
        uar_page, set_uar_page: u32 [0x68, 24];
        cq_period, set_cq_period: u32 [0x84, 12];
        cq_max_count, set_cq_max_count: u32 [0x90, 16];
        c_eqn_or_apu_element, set_c_eqn_or_apu_element: u32 [0xa0, 32];
        log_page_size, set_log_page_size: u32 [0xc3, 5];
        last_notified_index, set_last_notified_index: u32 [0x108, 24];
        last_solicit_index, set_last_solicit_index: u32 [0x128, 24];
        consumer_counter, set_consumer_counter: u32 [0x148, 24];
        producer_counter, set_producer_counter: u32 [0x168, 24];
        dbr_addr, set_dbr_addr: u64 [0x1c0, 64];
    }
}

prm_struct! {
    /// Queue pair context (mlx5.md §7.3).
    pub struct Qpc, mod qpc = "qpc", size_bits: 0x740, source: Source::Ifc;
    {
        state, set_state: u32 [0x0, 4];
        lag_tx_port_affinity, set_lag_tx_port_affinity: u32 [0x4, 4];
        st, set_st: u32 [0x8, 8];
        isolate_vl_tc, set_isolate_vl_tc: u32 [0x12, 1];
        pm_state, set_pm_state: u32 [0x13, 2];
        req_e2e_credit_mode, set_req_e2e_credit_mode: u32 [0x16, 2];
        offload_type, set_offload_type: u32 [0x18, 4];
        end_padding_mode, set_end_padding_mode: u32 [0x1c, 2];
        wq_signature, set_wq_signature: u32 [0x20, 1];
        block_lb_mc, set_block_lb_mc: u32 [0x21, 1];
        atomic_like_write_en, set_atomic_like_write_en: u32 [0x22, 1];
        latency_sensitive, set_latency_sensitive: u32 [0x23, 1];
        drain_sigerr, set_drain_sigerr: u32 [0x25, 1];
        dp_ordering_force, set_dp_ordering_force: u32 [0x27, 1];
        pd, set_pd: u32 [0x28, 24];
        mtu, set_mtu: u32 [0x40, 3];
        log_msg_max, set_log_msg_max: u32 [0x43, 5];
        log_rq_size, set_log_rq_size: u32 [0x49, 4];
        log_rq_stride, set_log_rq_stride: u32 [0x4d, 3];
        no_sq, set_no_sq: u32 [0x50, 1];
        log_sq_size, set_log_sq_size: u32 [0x51, 4];
        retry_mode, set_retry_mode: u32 [0x56, 2];
        ts_format, set_ts_format: u32 [0x58, 2];
        rlky, set_rlky: u32 [0x5b, 1];
        ulp_stateless_offload_mode, set_ulp_stateless_offload_mode: u32 [0x5c, 4];
        counter_set_id, set_counter_set_id: u32 [0x60, 8];
        uar_page, set_uar_page: u32 [0x68, 24];
        user_index, set_user_index: u32 [0x88, 24];
        log_page_size, set_log_page_size: u32 [0xa3, 5];
        remote_qpn, set_remote_qpn: u32 [0xa8, 24];
        primary_address_path, primary_address_path_mut: {Ads} [0xc0, 352];
        secondary_address_path, secondary_address_path_mut: {Ads} [0x220, 352];
        log_ack_req_freq, set_log_ack_req_freq: u32 [0x380, 4];
        log_sra_max, set_log_sra_max: u32 [0x388, 3];
        retry_count, set_retry_count: u32 [0x38d, 3];
        rnr_retry, set_rnr_retry: u32 [0x390, 3];
        fre, set_fre: u32 [0x394, 1];
        cur_rnr_retry, set_cur_rnr_retry: u32 [0x395, 3];
        cur_retry_count, set_cur_retry_count: u32 [0x398, 3];
        next_send_psn, set_next_send_psn: u32 [0x3c8, 24];
        log_num_dci_stream_channels, set_log_num_dci_stream_channels: u32 [0x3e3, 5];
        cqn_snd, set_cqn_snd: u32 [0x3e8, 24];
        log_num_dci_errored_streams, set_log_num_dci_errored_streams: u32 [0x403, 5];
        deth_sqpn, set_deth_sqpn: u32 [0x408, 24];
        last_acked_psn, set_last_acked_psn: u32 [0x448, 24];
        ssn, set_ssn: u32 [0x468, 24];
        log_rra_max, set_log_rra_max: u32 [0x488, 3];
        atomic_mode, set_atomic_mode: u32 [0x48c, 4];
        rre, set_rre: u32 [0x490, 1];
        rwe, set_rwe: u32 [0x491, 1];
        rae, set_rae: u32 [0x492, 1];
        page_offset, set_page_offset: u32 [0x494, 6];
        dp_ordering_1, set_dp_ordering_1: u32 [0x49c, 1];
        cd_slave_receive, set_cd_slave_receive: u32 [0x49d, 1];
        cd_slave_send, set_cd_slave_send: u32 [0x49e, 1];
        cd_master, set_cd_master: u32 [0x49f, 1];
        min_rnr_nak, set_min_rnr_nak: u32 [0x4a3, 5];
        next_rcv_psn, set_next_rcv_psn: u32 [0x4a8, 24];
        xrcd, set_xrcd: u32 [0x4c8, 24];
        cqn_rcv, set_cqn_rcv: u32 [0x4e8, 24];
        dbr_addr, set_dbr_addr: u64 [0x500, 64];
        q_key, set_q_key: u32 [0x540, 32];
        rq_type, set_rq_type: u32 [0x565, 3];
        srqn_rmpn_xrqn, set_srqn_rmpn_xrqn: u32 [0x568, 24];
        rmsn, set_rmsn: u32 [0x588, 24];
        hw_sq_wqebb_counter, set_hw_sq_wqebb_counter: u32 [0x5a0, 16];
        sw_sq_wqebb_counter, set_sw_sq_wqebb_counter: u32 [0x5b0, 16];
        hw_rq_counter, set_hw_rq_counter: u32 [0x5c0, 32];
        sw_rq_counter, set_sw_rq_counter: u32 [0x5e0, 32];
        cgs, set_cgs: u32 [0x62f, 1];
        cs_req, set_cs_req: u32 [0x630, 8];
        cs_res, set_cs_res: u32 [0x638, 8];
        dc_access_key, set_dc_access_key: u64 [0x640, 64];
        dbr_umem_valid, set_dbr_umem_valid: u32 [0x683, 1];
    }
}

prm_struct! {
    /// Address path (mlx5.md §7.3): the remote GID/MAC, GID index, UDP source port, hop limit.
    pub struct Ads, mod ads = "ads", size_bits: 0x160, source: Source::Ifc;
    {
        fl, set_fl: u32 [0x0, 1];
        free_ar, set_free_ar: u32 [0x1, 1];
        pkey_index, set_pkey_index: u32 [0x10, 16];
        plane_index, set_plane_index: u32 [0x20, 8];
        grh, set_grh: u32 [0x28, 1];
        mlid, set_mlid: u32 [0x29, 7];
        rlid, set_rlid: u32 [0x30, 16];
        ack_timeout, set_ack_timeout: u32 [0x40, 5];
        src_addr_index, set_src_addr_index: u32 [0x48, 8];
        stat_rate, set_stat_rate: u32 [0x54, 4];
        hop_limit, set_hop_limit: u32 [0x58, 8];
        tclass, set_tclass: u32 [0x64, 8];
        flow_label, set_flow_label: u32 [0x6c, 20];
        rgid_rip, set_rgid_rip: bytes [0x80, 128];
        f_dscp, set_f_dscp: u32 [0x104, 1];
        f_ecn, set_f_ecn: u32 [0x105, 1];
        f_eth_prio, set_f_eth_prio: u32 [0x107, 1];
        ecn, set_ecn: u32 [0x108, 2];
        dscp, set_dscp: u32 [0x10a, 6];
        udp_sport, set_udp_sport: u32 [0x110, 16];
        dei_cfi, set_dei_cfi: u32 [0x120, 1];
        eth_prio, set_eth_prio: u32 [0x121, 3];
        sl, set_sl: u32 [0x124, 4];
        vhca_port_num, set_vhca_port_num: u32 [0x128, 8];
        rmac_47_32, set_rmac_47_32: u32 [0x130, 16];
        rmac_31_0, set_rmac_31_0: u32 [0x140, 32];
    }
}

prm_struct! {
    /// NIC vport context (mlx5.md §5.4): `roce_en`, `mtu`, `permanent_address` (MAC in its low 48 bits).
    pub struct NicVportContext, mod nic_vport_context = "nic_vport_context", size_bits: 0x800, source: Source::Ifc;
    {
        min_wqe_inline_mode, set_min_wqe_inline_mode: u32 [0x5, 3];
        disable_mc_local_lb, set_disable_mc_local_lb: u32 [0x1d, 1];
        disable_uc_local_lb, set_disable_uc_local_lb: u32 [0x1e, 1];
        roce_en, set_roce_en: u32 [0x1f, 1];
        arm_change_event, set_arm_change_event: u32 [0x20, 1];
        event_on_mtu, set_event_on_mtu: u32 [0x3b, 1];
        mtu, set_mtu: u32 [0x130, 16];
        system_image_guid, set_system_image_guid: u64 [0x140, 64];
        port_guid, set_port_guid: u64 [0x180, 64];
        node_guid, set_node_guid: u64 [0x1c0, 64];
        qkey_violation_counter, set_qkey_violation_counter: u32 [0x340, 16];
        promisc_uc, set_promisc_uc: u32 [0x780, 1];
        promisc_mc, set_promisc_mc: u32 [0x781, 1];
        promisc_all, set_promisc_all: u32 [0x782, 1];
        allowed_list_type, set_allowed_list_type: u32 [0x785, 3];
        allowed_list_size, set_allowed_list_size: u32 [0x794, 12];
        permanent_address, set_permanent_address: u64 [0x7a0, 64];
        current_uc_mac_address, set_current_uc_mac_address: [u64; flex] [0x800, 64];
    }
}

prm_struct! {
    /// Which fields MODIFY_NIC_VPORT_CONTEXT changes (mlx5.md §5.4).
    pub struct ModifyNicVportFieldSelect, mod modify_nic_vport_field_select = "modify_nic_vport_field_select", size_bits: 0x20, source: Source::Ifc;
    {
        affiliation, set_affiliation: u32 [0x12, 1];
        disable_uc_local_lb, set_disable_uc_local_lb: u32 [0x14, 1];
        disable_mc_local_lb, set_disable_mc_local_lb: u32 [0x15, 1];
        node_guid, set_node_guid: u32 [0x16, 1];
        port_guid, set_port_guid: u32 [0x17, 1];
        min_inline, set_min_inline: u32 [0x18, 1];
        mtu, set_mtu: u32 [0x19, 1];
        change_event, set_change_event: u32 [0x1a, 1];
        promisc, set_promisc: u32 [0x1b, 1];
        permanent_address, set_permanent_address: u32 [0x1c, 1];
        addresses_list, set_addresses_list: u32 [0x1d, 1];
        roce_en, set_roce_en: u32 [0x1e, 1];
    }
}

prm_struct! {
    /// HCA vport context (IB ports; QUERY_HCA_VPORT_CONTEXT).
    pub struct HcaVportContext, mod hca_vport_context = "hca_vport_context", size_bits: 0x1000, source: Source::Ifc;
    {
        field_select, set_field_select: u32 [0x0, 32];
        sm_virt_aware, set_sm_virt_aware: u32 [0x100, 1];
        has_smi, set_has_smi: u32 [0x101, 1];
        has_raw, set_has_raw: u32 [0x102, 1];
        grh_required, set_grh_required: u32 [0x103, 1];
        num_port_plane, set_num_port_plane: u32 [0x108, 8];
        port_physical_state, set_port_physical_state: u32 [0x110, 4];
        vport_state_policy, set_vport_state_policy: u32 [0x114, 4];
        port_state, set_port_state: u32 [0x118, 4];
        vport_state, set_vport_state: u32 [0x11c, 4];
        system_image_guid, set_system_image_guid: u64 [0x140, 64];
        port_guid, set_port_guid: u64 [0x180, 64];
        node_guid, set_node_guid: u64 [0x1c0, 64];
        cap_mask1, set_cap_mask1: u32 [0x200, 32];
        cap_mask1_field_select, set_cap_mask1_field_select: u32 [0x220, 32];
        cap_mask2, set_cap_mask2: u32 [0x240, 32];
        cap_mask2_field_select, set_cap_mask2_field_select: u32 [0x260, 32];
        lid, set_lid: u32 [0x300, 16];
        init_type_reply, set_init_type_reply: u32 [0x314, 4];
        lmc, set_lmc: u32 [0x318, 3];
        subnet_timeout, set_subnet_timeout: u32 [0x31b, 5];
        sm_lid, set_sm_lid: u32 [0x320, 16];
        sm_sl, set_sm_sl: u32 [0x330, 4];
        qkey_violation_counter, set_qkey_violation_counter: u32 [0x340, 16];
        pkey_violation_counter, set_pkey_violation_counter: u32 [0x350, 16];
    }
}

prm_struct! {
    /// One GID table entry (mlx5.md §5.4): GID, MAC, VLAN, `roce_version` 2 = RoCEv2, `roce_l3_type` 0 IPv4 / 1 IPv6.
    pub struct RoceAddrLayout, mod roce_addr_layout = "roce_addr_layout", size_bits: 0x100, source: Source::Ifc;
    {
        source_l3_address, set_source_l3_address: bytes [0x0, 128];
        vlan_valid, set_vlan_valid: u32 [0x83, 1];
        vlan_id, set_vlan_id: u32 [0x84, 12];
        source_mac_47_32, set_source_mac_47_32: u32 [0x90, 16];
        source_mac_31_0, set_source_mac_31_0: u32 [0xa0, 32];
        roce_l3_type, set_roce_l3_type: u32 [0xd4, 4];
        roce_version, set_roce_version: u32 [0xd8, 8];
    }
}
