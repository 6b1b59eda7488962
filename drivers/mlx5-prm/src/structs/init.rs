//! BAR0: the initialization segment and its health buffer (mlx5.md §2).

use super::*;

prm_struct! {
    /// The initialization segment at BAR0 (mlx5.md §2; ifc `initial_seg`).
    ///
    /// The driver reads it through `Mmio` dword by dword: use the field constants in
    /// [`initial_seg`] with [`FieldLayout::extract`]/[`FieldLayout::insert`]. An emulator can keep
    /// BAR0 as a byte buffer and use the view. Fields marked `doc` are from the kernel's
    /// `struct mlx5_init_seg` (device.h) as mlx5.md §2 lists them; the ifc header leaves them
    /// reserved.
    pub struct InitialSeg, mod initial_seg = "initial_seg", size_bits: 0x20060, source: Source::Ifc;
    {
        fw_rev_minor, set_fw_rev_minor: u32 [0x0, 16];
        fw_rev_major, set_fw_rev_major: u32 [0x10, 16];
        cmd_interface_rev, set_cmd_interface_rev: u32 [0x20, 16];
        fw_rev_subminor, set_fw_rev_subminor: u32 [0x30, 16];
        cmdq_phy_addr_63_32, set_cmdq_phy_addr_63_32: u32 [0x80, 32];
        cmdq_phy_addr_31_12, set_cmdq_phy_addr_31_12: u32 [0xa0, 20];
        nic_interface, set_nic_interface: u32 [0xb6, 2];
        log_cmdq_size, set_log_cmdq_size: u32 [0xb8, 4];
        log_cmdq_stride, set_log_cmdq_stride: u32 [0xbc, 4];
        command_doorbell_vector, set_command_doorbell_vector: u32 [0xc0, 32];
        initializing, set_initializing: u32 [0xfe0, 1];
        nic_interface_supported, set_nic_interface_supported: u32 [0xfe5, 3];
        embedded_cpu, set_embedded_cpu: u32 [0xfe8, 1];
        health_buffer, health_buffer_mut: {HealthBuffer} [0x1000, 512];
        no_dram_nic_offset, set_no_dram_nic_offset: u32 [0x1200, 32];
        clear_int, set_clear_int: u32 [0x807f, 1];
        health_syndrome, set_health_syndrome: u32 [0x8080, 8];
        health_counter, set_health_counter: u32 [0x8088, 24];
        /// NIC interface state as the drivers read it, `(cmdq_addr_l_sz >> 8) & 7` (mlx5.md §2; ifc gives `nic_interface` only 2 bits).
        nic_state, set_nic_state: u32 [0xb5, 3], doc "mlx5.md §2 NIC interface state";
        /// Bit 30 of `initializing`: firmware reset supported (mlx5.md §2).
        fw_reset_supported, set_fw_reset_supported: u32 [0xfe1, 1], doc "mlx5.md §2 0x1fc bit30";
        /// FW-suggested command timeout (K device.h; 0 on old firmware).
        cmd_exec_to, set_cmd_exec_to: u32 [0x7fc0, 32], doc "mlx5.md §2 0xff8";
        /// FW-suggested init timeout (K device.h; nonzero means both timeouts are valid).
        cmd_q_init_to, set_cmd_q_init_to: u32 [0x7fe0, 32], doc "mlx5.md §2 0xffc";
        internal_timer_h, set_internal_timer_h: u32 [0x8000, 32], doc "mlx5.md §2 0x1000";
        internal_timer_l, set_internal_timer_l: u32 [0x8020, 32], doc "mlx5.md §2 0x1004";
        real_time_h, set_real_time_h: u32 [0x8200, 32], doc "mlx5.md §2 0x1040";
        real_time_l, set_real_time_l: u32 [0x8220, 32], doc "mlx5.md §2 0x1044";
        ieee1588_clk, set_ieee1588_clk: u64 [0x10000, 64], doc "mlx5.md §2 0x2000";
        ieee1588_clk_type, set_ieee1588_clk_type: u32 [0x10040, 32], doc "mlx5.md §2 0x2008";
        /// Legacy INTx clear of device.h; the ifc header puts `clear_int` at 0x100c bit0 instead (conflict, mlx5.md §2/§12; irrelevant with MSI-X).
        clr_intx, set_clr_intx: u32 [0x10060, 32], doc "mlx5.md §2 0x200c";
    }
}

prm_struct! {
    /// The 64-byte health buffer at BAR0 + 0x200 (mlx5.md §2). Nonzero `synd` is fatal;
    /// see [`HealthSyndrome`](crate::HealthSyndrome).
    pub struct HealthBuffer, mod health_buffer = "health_buffer", size_bits: 0x200, source: Source::Ifc;
    {
        assert_existptr, set_assert_existptr: u32 [0x100, 32];
        assert_callra, set_assert_callra: u32 [0x120, 32];
        time, set_time: u32 [0x160, 32];
        fw_version, set_fw_version: u32 [0x180, 32];
        hw_id, set_hw_id: u32 [0x1a0, 32];
        rfr, set_rfr: u32 [0x1c0, 1];
        valid, set_valid: u32 [0x1c4, 1];
        severity, set_severity: u32 [0x1c5, 3];
        irisc_index, set_irisc_index: u32 [0x1e0, 8];
        synd, set_synd: u32 [0x1e8, 8];
        ext_synd, set_ext_synd: u32 [0x1f0, 16];
        /// The first five assert words (mlx5.md §2: K has 6 dwords, RC 5 + pad; both agree on these).
        assert_var, set_assert_var: [u32; 5] [0x0, 160], doc "mlx5.md §2 0x200 assert_var[]";
    }
}
