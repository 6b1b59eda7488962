//! The EQE and the event data layouts (mlx5.md §11).

use super::*;

prm_struct! {
    /// One 64-byte event queue entry (mlx5.md §11): valid iff `owner` == (ci >> log_eq_size) & 1.
    pub struct Eqe, mod eqe = "eqe", size_bits: 0x200, source: Source::Ifc;
    {
        event_type, set_event_type: u32 [0x8, 8];
        event_sub_type, set_event_sub_type: u32 [0x18, 8];
        event_data, set_event_data: bytes [0x100, 224];
        comp_event, comp_event_mut: {CompEvent} [0x100, 224] = "event_data.comp_event";
        qp_events, qp_events_mut: {QpEvents} [0x100, 224] = "event_data.qp_events";
        cq_error, cq_error_mut: {CqError} [0x100, 224] = "event_data.cq_error";
        port_state_change_event, port_state_change_event_mut: {PortStateChangeEvent} [0x100, 224] = "event_data.port_state_change_event";
        cmd_inter_comp_event, cmd_inter_comp_event_mut: {CmdInterCompEvent} [0x100, 224] = "event_data.cmd_inter_comp_event";
        signature, set_signature: u32 [0x1f0, 8];
        owner, set_owner: u32 [0x1ff, 1];
        /// The page request event data (type 0x0b) of mlx5.md §11; the ifc union lacks it.
        pages_req_event, pages_req_event_mut: {PagesReqEvent} [0x100, 224] = "event_data.pages_req_event", doc "mlx5.md §11 type 0x0b data at EQE+0x20";
    }
}

prm_struct! {
    /// Completion event data (type 0x00): `cq_number` (mlx5.md §11).
    pub struct CompEvent, mod comp_event = "comp_event", size_bits: 0xe0, source: Source::Ifc;
    {
        cq_number, set_cq_number: u32 [0xc8, 24];
    }
}

prm_struct! {
    /// Command completion event data (type 0x0a): bit i = command slot i done (mlx5.md §11).
    pub struct CmdInterCompEvent, mod cmd_inter_comp_event = "cmd_inter_comp_event", size_bits: 0xe0, source: Source::Ifc;
    {
        command_completion_vector, set_command_completion_vector: u32 [0x0, 32];
    }
}

prm_struct! {
    /// Page request event data (type 0x0b): `num_pages` signed, > 0 give, < 0 reclaim (mlx5.md §11).
    pub struct PagesReqEvent, mod pages_req_event = "pages_req_event", size_bits: 0xe0, source: Source::Ifc;
    {
        function_id, set_function_id: u32 [0x10, 16];
        num_pages, set_num_pages: u32 [0x20, 32];
        /// bit15 embedded-CPU function, bit14 release-all (mlx5.md §11; reserved in the ifc header).
        ec_function, set_ec_function: u32 [0x0, 16], doc "mlx5.md §11 ec_function BE16 at EQE+0x20";
    }
}

prm_struct! {
    /// QP/SRQ event data (types 0x01-0x05, 0x10, 0x11; mlx5.md §11).
    pub struct QpEvents, mod qp_events = "qp_events", size_bits: 0xe0, source: Source::Ifc;
    {
        r#type, set_type: u32 [0xa0, 8] = "type";
        qpn_rqn_sqn, set_qpn_rqn_sqn: u32 [0xc8, 24];
    }
}

prm_struct! {
    /// CQ error event data (type 0x04; mlx5.md §11).
    pub struct CqError, mod cq_error = "cq_error", size_bits: 0xe0, source: Source::Ifc;
    {
        cqn, set_cqn: u32 [0x8, 24];
        syndrome, set_syndrome: u32 [0x58, 8];
    }
}

prm_struct! {
    /// Port change event data (type 0x09; sub_type 1 down, 4 active, 5 initialized; mlx5.md §11).
    pub struct PortStateChangeEvent, mod port_state_change_event = "port_state_change_event", size_bits: 0xe0, source: Source::Ifc;
    {
        port_num, set_port_num: u32 [0x40, 4];
    }
}
