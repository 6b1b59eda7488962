//! The emulated firmware's command syndromes: one stable 32-bit number per check, so a
//! driver test can tell *which* check refused its command.
//!
//! Real syndromes are NVIDIA-internal and undocumented (mlx5.md §4.3, §12); these are the
//! emulator's own. Layout: `0x0e00_0000 | group << 12 | n` — the `0x0e` top byte marks
//! "emulator", the group is the command family (0 = command interface, 1 = HCA life cycle,
//! 2 = pages, 3 = capabilities, 4 = registers, 5 = resources, 6 = vport). Every value is listed
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

    /// ACCESS_REG of a register this firmware does not implement.
    REGISTER_UNSUPPORTED = 0x0e00_4001 => "ACCESS_REG: register not supported (only HOST_ENDIANNESS 0x7004)",
    /// ACCESS_REG `op_mod` neither write (0) nor read (1).
    REGISTER_OP_MOD = 0x0e00_4002 => "ACCESS_REG: op_mod must be 0 (write) or 1 (read)",
    /// ACCESS_REG: the register data does not fit `inlen`/`outlen`.
    REGISTER_LENGTH = 0x0e00_4003 => "ACCESS_REG: inlen/outlen shorter than 0x10 + register size",

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
    VPORT_FIELD_UNSUPPORTED = 0x0e00_6003 => "MODIFY_NIC_VPORT_CONTEXT: field_select other than roce_en/mtu",
    /// MODIFY_NIC_VPORT_CONTEXT with an MTU out of range.
    VPORT_MTU = 0x0e00_6004 => "MODIFY_NIC_VPORT_CONTEXT: mtu outside 68..=9978",
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
