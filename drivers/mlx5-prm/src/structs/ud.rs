//! The UD address vector (datagram segment of a UD send WQE).

use super::*;

prm_struct! {
    /// The UD address vector, the datagram segment of a UD send WQE (48 bytes). `destination_qp_dct` is the remote QPN, `ext` set for the extended (48-byte) form.
    pub struct UdAdrsVector, mod ud_adrs_vector = "ud_adrs_vector", size_bits: 0x180, source: Source::Ifc;
    {
        dc_key, set_dc_key: u64 [0x0, 64];
        ext, set_ext: u32 [0x40, 1];
        destination_qp_dct, set_destination_qp_dct: u32 [0x48, 24];
        static_rate, set_static_rate: u32 [0x60, 4];
        sl_eth_prio, set_sl_eth_prio: u32 [0x64, 4];
        fl, set_fl: u32 [0x68, 1];
        mlid, set_mlid: u32 [0x69, 7];
        rlid_udp_sport, set_rlid_udp_sport: u32 [0x70, 16];
        rmac_47_16, set_rmac_47_16: u32 [0xa0, 32];
        rmac_15_0, set_rmac_15_0: u32 [0xc0, 16];
        tclass, set_tclass: u32 [0xd0, 8];
        hop_limit, set_hop_limit: u32 [0xd8, 8];
        grh, set_grh: u32 [0xe1, 1];
        src_addr_index, set_src_addr_index: u32 [0xe4, 8];
        flow_label, set_flow_label: u32 [0xec, 20];
        rgid_rip, set_rgid_rip: bytes [0x100, 128];
        /// The Q_Key, overlaying the upper half of `dc_key` (K device.h `struct mlx5_av`, union `key.qkey.qkey`). Not stated in mlx5.md: unverified by the references.
        q_key, set_q_key: u32 [0x0, 32], doc "K device.h struct mlx5_av key.qkey (outside mlx5.md)";
    }
}
