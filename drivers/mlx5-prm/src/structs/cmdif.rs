//! The command queue entry and mailbox block (mlx5.md §4), plus the common command header.

use super::*;

prm_struct! {
    /// One 64-byte command queue entry (mlx5.md §4.1; device.h `mlx5_cmd_layout`).
    ///
    /// `status` is the delivery status ([`DeliveryStatus`](crate::DeliveryStatus)), `ownership` 1 =
    /// owned by hardware. Mailbox pointers are split as in the ifc header: `_63_32` and `_31_9`
    /// (the address >> 9; blocks are at least 1 KiB aligned, mlx5.md §4.2).
    pub struct CmdQueueEntry, mod cmd_queue_entry = "cmd_queue_entry", size_bits: 0x200, source: Source::Ifc;
    {
        r#type, set_type: u32 [0x0, 8] = "type";
        input_length, set_input_length: u32 [0x20, 32];
        input_mailbox_pointer_63_32, set_input_mailbox_pointer_63_32: u32 [0x40, 32];
        input_mailbox_pointer_31_9, set_input_mailbox_pointer_31_9: u32 [0x60, 23];
        command_input_inline_data, set_command_input_inline_data: bytes [0x80, 128];
        command_output_inline_data, set_command_output_inline_data: bytes [0x100, 128];
        output_mailbox_pointer_63_32, set_output_mailbox_pointer_63_32: u32 [0x180, 32];
        output_mailbox_pointer_31_9, set_output_mailbox_pointer_31_9: u32 [0x1a0, 23];
        output_length, set_output_length: u32 [0x1c0, 32];
        token, set_token: u32 [0x1e0, 8];
        signature, set_signature: u32 [0x1e8, 8];
        status, set_status: u32 [0x1f8, 7];
        ownership, set_ownership: u32 [0x1ff, 1];
    }
}

prm_struct! {
    /// One 576-byte mailbox block (mlx5.md §4.2; device.h `mlx5_cmd_prot_block`).
    ///
    /// 512 data bytes, then `next_pointer` (address >> 10), `block_number`, `token`,
    /// `ctrl_signature`, `signature`.
    pub struct CmdIfBox, mod cmd_if_box = "cmd_if_box", size_bits: 0x1200, source: Source::Ifc;
    {
        mailbox_data, set_mailbox_data: bytes [0x0, 4096];
        next_pointer_63_32, set_next_pointer_63_32: u32 [0x1180, 32];
        next_pointer_31_10, set_next_pointer_31_10: u32 [0x11a0, 22];
        block_number, set_block_number: u32 [0x11c0, 32];
        token, set_token: u32 [0x11e8, 8];
        ctrl_signature, set_ctrl_signature: u32 [0x11f0, 8];
        signature, set_signature: u32 [0x11f8, 8];
    }
}

prm_struct! {
    /// The header every command input starts with (mlx5.md §4.3: `opcode` dw0 [31:16], `uid`
    /// dw0 [15:0], `op_mod` dw1 [15:0]). Not in the JSON (this ifc tree has no `mbox_in`).
    pub struct MboxIn, mod mbox_in = "mbox_in", size_bits: 0x40, source: Source::Doc("mlx5.md §4.3");
    {
        /// [`CmdOpcode`](crate::CmdOpcode).
        opcode, set_opcode: u32 [0x0, 16];
        uid, set_uid: u32 [0x10, 16];
        op_mod, set_op_mod: u32 [0x30, 16];
    }
}

prm_struct! {
    /// The header every command output starts with (mlx5.md §4.3: `status` byte 0,
    /// `syndrome` BE32 at byte 4). Not in the JSON (this ifc tree has no `mbox_out`).
    pub struct MboxOut, mod mbox_out = "mbox_out", size_bits: 0x40, source: Source::Doc("mlx5.md §4.3");
    {
        /// [`CmdStatus`](crate::CmdStatus).
        status, set_status: u32 [0x0, 8];
        /// Firmware-specific, undocumented outside NVIDIA's PRM: log it (mlx5.md §4.3).
        syndrome, set_syndrome: u32 [0x20, 32];
    }
}
