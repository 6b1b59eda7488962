//! rnic-mlx5-prm: the mlx5 (ConnectX) PRM structures, declared once.
//!
//! # What it owns
//!
//! The firmware-interface layouts that both the userspace driver (`rnic-mlx5`) and the
//! emulated ConnectX function (`rnic-mlx5-emu`) read and write: the BAR0 initialization
//! segment, the command queue entry and mailbox block, the command inputs/outputs and
//! contexts for bring-up, UAR, PD, MKey, EQ, CQ, RC/UD QPs, vport and RoCE addresses, the
//! capability pages, EQEs and event data, the 64-byte CQE, send WQE segments, doorbell
//! records and UAR doorbell words; the raw Ethernet objects (TIS, SQ, RQ, TIR and their
//! `wq`, the Ethernet send segment, the Ethernet offload caps) and NIC flow steering (flow
//! tables, groups, `fte_match_param`, entries forwarding to TIRs, the table root, the NIC
//! flow table caps, vport counters) — plus the raw constants ([`CmdOpcode`], [`CmdStatus`],
//! [`DeliveryStatus`], [`QpState`], [`WqeOpcode`], [`CqeOpcode`], [`CqeSyndrome`] with its
//! ibverbs mapping, [`EventType`], [`HealthSyndrome`], UAR offsets …) in [`consts`], apart
//! from any logic. No I/O, no allocation on the accessor path, `#![forbid(unsafe_code)]`.
//!
//! # How fields map to bits
//!
//! Offsets and widths are in **bits**, counted MSB-first inside big-endian 32-bit dwords from
//! the start of the structure — the kernel's `MLX5_GET`/`MLX5_SET` convention and the
//! JSON's. Byte = off / 8; dword = off / 32; inside the host-order dword the field's lowest
//! bit is `32 - off % 32 - width`. Since the dwords are big-endian this equals MSB-first
//! numbering through the byte stream, which is what [`get_bits`] / [`set_bits`] compute (for
//! any width 1..=64 and any alignment). Byte arrays (GIDs, inline data) are in wire order.
//!
//! # The macro's contract
//!
//! [`prm_struct!`] declares one structure: view type, PRM name, size in bits, where its facts
//! come from ([`Source`]), and one line per field, `getter, setter: KIND [bit_offset, width]
//! (= "prm.name")? (, doc "source")?;`. It generates:
//!
//! * `mod <prm_name>` with `NAME`, `SIZE_BITS`, `SIZE_BYTES`, one [`FieldLayout`] constant per
//!   field named like the getter (`create_qp_in::pas.byte_offset() == 0x110`) and
//!   `LAYOUT: StructLayout`. The modules are the offset constants for nested structures and
//!   for `Mmio` users ([`FieldLayout::extract`] / [`FieldLayout::insert`] on a dword).
//! * a view `View<T>` over `T: AsRef<[u8]>` (getters) / `AsMut<[u8]>` (setters):
//!   `new_checked(buf)` checks the length once ([`Error::Truncated`]); after that no
//!   accessor can panic (`new_unchecked` never panics either: short reads give 0, short
//!   writes fail).
//! * getters: `u32` for 1..=32 bits, `u64` for 33..=64, `&[u8]` for byte arrays, a nested view
//!   for `{Struct}` fields, `Option<u32/u64>` by index for arrays.
//! * setters return `Result<(), Error>` and **reject** a value wider than the field
//!   ([`Error::ValueTooWide`], nothing written) rather than masking it: a truncated PD or
//!   QPN would reach firmware as a different, valid-looking object. Byte-array setters take
//!   `&[u8; N]` of exactly the field's size; nested fields have a `_mut` accessor instead.
//! * const assertions: a field's width suits its kind and it lies inside the structure.
//!
//! ```
//! use rnic_mlx5_prm::{CreateQpIn, CmdOpcode, QpServiceType, create_qp_in, qpc};
//!
//! let mut buf = vec![0u8; CreateQpIn::<&[u8]>::SIZE_BYTES + 8]; // one pas[] entry
//! let mut cmd = CreateQpIn::new_checked(&mut buf[..])?;
//! cmd.set_opcode(CmdOpcode::CreateQp.as_raw().into())?;
//! let mut ctx = cmd.qpc_mut();
//! ctx.set_st(QpServiceType::Rc.as_raw().into())?;
//! ctx.set_pd(0x12)?;
//! ctx.primary_address_path_mut().set_vhca_port_num(1)?;
//! assert!(ctx.set_pd(1 << 24).is_err()); // pd is 24 bits
//! cmd.set_pas(0, 0x1_2345_6000)?;
//! assert_eq!(create_qp_in::pas.bit_offset, 0x880);
//! assert_eq!(create_qp_in::qpc.byte_offset() + qpc::pd.byte_offset(), 0x1d);
//! assert_eq!(buf[0x1d..0x20], [0, 0, 0x12]);
//! # Ok::<(), rnic_mlx5_prm::Error>(())
//! ```
//!
//! # What checks what
//!
//! * [`Source::Ifc`] structures and fields (everything from `mlx5_ifc.h`: `initial_seg`,
//!   `health_buffer`, `cmd_queue_entry`, `cmd_if_box`, every command in/out, `cmd_hca_cap`,
//!   `roce_cap`, `mkc`, `mtt`, `eqc`, `cqc`, `qpc`, `ads`, the vport contexts,
//!   `roce_addr_layout`, `eqe` and the event structs, `ud_adrs_vector`) are checked field by
//!   field, with nested structures expanded, and by size, against
//!   `tests/data/mlx5_ifc_layout.json` (a subset of `shared/reference/mlx5_ifc_layout.json`).
//! * [`Source::Doc`] structures and fields, absent from that header, are checked against the
//!   byte offsets written in mlx5.md, listed in `tests/layout_mlx5_md.rs`: `mbox_in`/`mbox_out`
//!   (§4.3), `cqe64` and `err_cqe` (§10), the WQE segments (§9), doorbell records and UAR
//!   doorbell words (§8), and the device.h-only registers of the init segment (§2:
//!   `nic_state`, `fw_reset_supported`, `cmd_exec_to`, `cmd_q_init_to`, timers, `clr_intx`),
//!   `health_buffer.assert_var`, `pages_req_event.ec_function`, `eqe.event_data.pages_req_event`
//!   (§11) and `ud_adrs_vector.q_key`. The same test also holds the ifc-declared
//!   `cmd_queue_entry`, `cmd_if_box`, `initial_seg`, `eqe` and the §5-§7 context fields against
//!   mlx5.md's byte tables, so both sources agree where both speak.
//! * [`export::layouts_json`] prints the table in the format of `mlx5_ifc_layout.md` ("For a
//!   layout exported by rnic"); `rnicctl mlx5 layouts --json` prints it.
//!
//! # Where the facts were silent or conflicting
//!
//! * `mbox_in` / `mbox_out`, `mlx5_cqe64`, `mlx5_err_cqe`, the WQE segments and doorbell
//!   formats are not in the JSON (device.h, not mlx5_ifc.h); `cmd_queue_entry` /
//!   `cmd_if_box` *are* (ifc names), so the device.h `mlx5_cmd_layout` /
//!   `mlx5_cmd_prot_block` are not declared separately. Sub-field names with a dot
//!   (`op_own.owner`, `fm_ce_se.ce`, `sop_drop_qpn.qpn`) and the doorbell structure names
//!   (`qp_doorbell_record`, `cq_doorbell_record`, `cq_uar_doorbell`, `eq_uar_doorbell`) are
//!   rnic's names for bit ranges mlx5.md describes.
//! * NIC interface state: ifc `nic_interface` is 2 bits [9:8]; the drivers read 3 bits [10:8]
//!   (`nic_state`, declared as a doc field; both are present).
//! * `clear_int` (ifc, 0x100c bit0) vs `clr_intx` (device.h, 0x200c): both declared, unused
//!   with MSI-X.
//! * QP state values are not tabulated in mlx5.md; [`QpState`] uses K `qp.h` (SQD = 5,
//!   SQ_DRAINING = 7) where ifc says SQD = 7 (§12).
//! * The health buffer's `assert_var` length differs between K (6 dwords) and RC (5 + pad);
//!   five are declared. The ifc header's name is `assert_existptr` where mlx5.md writes
//!   `assert_exit_ptr`.
//! * The page request event is not a member of the ifc `eqe.event_data` union in this tree;
//!   `eqe.pages_req_event` is declared from mlx5.md §11, and `ec_function` (bit15 embedded
//!   CPU, bit14 release-all) is reserved in ifc `pages_req_event`.
//! * The UD datagram segment: the JSON has `ud_adrs_vector`, mlx5.md §9 does not describe UD
//!   WQEs. The Q_Key location (`q_key`, the upper half of `dc_key`) comes from K device.h
//!   `struct mlx5_av` and is verified by neither reference.
//! * `cmd_hca_cap.disable_link_up_by_init_hca` (mlx5.md §3 step 10) is not in this header and is
//!   not declared; `qp_ooo_transmit_default` is in `roce_cap`, not `cmd_hca_cap`.
//! * `create_mkey_in.klm_pas_mtt` has 32-bit elements in ifc; a 64-bit MTT entry (layout `mtt`)
//!   is elements 2i and 2i+1.
//! * Completion mode 1 of `fm_ce_se` and `log_ack_req_freq` semantics are unconfirmed (§12);
//!   [`CompletionMode`] names only 0, 2, 3. The CQ arm `cmd` width is not stated: mlx5.md
//!   gives values 0 and `1 << 24`; 4 bits [27:24] are declared.
//! * [`CQE_SYNDROME_TO_IBV`] pairs each §10 syndrome with the ibverbs status its description
//!   names; mlx5.md lists the syndromes, not the mapping.
#![forbid(unsafe_code)]
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod bits;
pub mod consts;
mod error;
pub mod export;
mod layout;
pub mod structs;

pub use bits::{get_bits, set_bits};
pub use consts::*;
pub use error::Error;
pub use layout::{FieldKind, FieldLayout, Source, StructLayout};
pub use structs::*;

/// Every declared structure, in declaration order (init segment, command interface,
/// commands, contexts, events, UD, data path).
pub const ALL_LAYOUTS: &[&StructLayout] = &[
    &cmd_queue_entry::LAYOUT,
    &cmd_if_box::LAYOUT,
    &mbox_in::LAYOUT,
    &mbox_out::LAYOUT,
    &query_hca_cap_in::LAYOUT,
    &query_hca_cap_out::LAYOUT,
    &set_hca_cap_in::LAYOUT,
    &set_hca_cap_out::LAYOUT,
    &query_issi_in::LAYOUT,
    &query_issi_out::LAYOUT,
    &set_issi_in::LAYOUT,
    &set_issi_out::LAYOUT,
    &enable_hca_in::LAYOUT,
    &enable_hca_out::LAYOUT,
    &disable_hca_in::LAYOUT,
    &disable_hca_out::LAYOUT,
    &query_pages_in::LAYOUT,
    &query_pages_out::LAYOUT,
    &manage_pages_in::LAYOUT,
    &manage_pages_out::LAYOUT,
    &init_hca_in::LAYOUT,
    &init_hca_out::LAYOUT,
    &teardown_hca_in::LAYOUT,
    &teardown_hca_out::LAYOUT,
    &set_driver_version_in::LAYOUT,
    &set_driver_version_out::LAYOUT,
    &access_register_in::LAYOUT,
    &access_register_out::LAYOUT,
    &register_host_endianness::LAYOUT,
    &ptys_reg::LAYOUT,
    &query_special_contexts_in::LAYOUT,
    &query_special_contexts_out::LAYOUT,
    &set_l2_table_entry_in::LAYOUT,
    &set_l2_table_entry_out::LAYOUT,
    &delete_l2_table_entry_in::LAYOUT,
    &delete_l2_table_entry_out::LAYOUT,
    &alloc_uar_in::LAYOUT,
    &alloc_uar_out::LAYOUT,
    &dealloc_uar_in::LAYOUT,
    &dealloc_uar_out::LAYOUT,
    &alloc_pd_in::LAYOUT,
    &alloc_pd_out::LAYOUT,
    &dealloc_pd_in::LAYOUT,
    &dealloc_pd_out::LAYOUT,
    &alloc_transport_domain_in::LAYOUT,
    &alloc_transport_domain_out::LAYOUT,
    &dealloc_transport_domain_in::LAYOUT,
    &dealloc_transport_domain_out::LAYOUT,
    &query_vport_state_in::LAYOUT,
    &query_vport_state_out::LAYOUT,
    &query_nic_vport_context_in::LAYOUT,
    &query_nic_vport_context_out::LAYOUT,
    &modify_nic_vport_context_in::LAYOUT,
    &modify_nic_vport_context_out::LAYOUT,
    &query_hca_vport_context_in::LAYOUT,
    &query_hca_vport_context_out::LAYOUT,
    &query_roce_address_in::LAYOUT,
    &query_roce_address_out::LAYOUT,
    &set_roce_address_in::LAYOUT,
    &set_roce_address_out::LAYOUT,
    &cmd_hca_cap::LAYOUT,
    &roce_cap::LAYOUT,
    &mkc::LAYOUT,
    &mtt::LAYOUT,
    &eqc::LAYOUT,
    &cqc::LAYOUT,
    &qpc::LAYOUT,
    &ads::LAYOUT,
    &nic_vport_context::LAYOUT,
    &modify_nic_vport_field_select::LAYOUT,
    &hca_vport_context::LAYOUT,
    &roce_addr_layout::LAYOUT,
    &eqe::LAYOUT,
    &comp_event::LAYOUT,
    &cmd_inter_comp_event::LAYOUT,
    &pages_req_event::LAYOUT,
    &qp_events::LAYOUT,
    &cq_error::LAYOUT,
    &port_state_change_event::LAYOUT,
    &initial_seg::LAYOUT,
    &health_buffer::LAYOUT,
    &create_mkey_in::LAYOUT,
    &create_mkey_out::LAYOUT,
    &destroy_mkey_in::LAYOUT,
    &destroy_mkey_out::LAYOUT,
    &create_eq_in::LAYOUT,
    &create_eq_out::LAYOUT,
    &destroy_eq_in::LAYOUT,
    &destroy_eq_out::LAYOUT,
    &create_cq_in::LAYOUT,
    &create_cq_out::LAYOUT,
    &destroy_cq_in::LAYOUT,
    &destroy_cq_out::LAYOUT,
    &modify_cq_in::LAYOUT,
    &modify_cq_out::LAYOUT,
    &create_qp_in::LAYOUT,
    &create_qp_out::LAYOUT,
    &destroy_qp_in::LAYOUT,
    &destroy_qp_out::LAYOUT,
    &rst2init_qp_in::LAYOUT,
    &rst2init_qp_out::LAYOUT,
    &init2rtr_qp_in::LAYOUT,
    &init2rtr_qp_out::LAYOUT,
    &rtr2rts_qp_in::LAYOUT,
    &rtr2rts_qp_out::LAYOUT,
    &rts2rts_qp_in::LAYOUT,
    &rts2rts_qp_out::LAYOUT,
    &qp_2err_in::LAYOUT,
    &qp_2err_out::LAYOUT,
    &qp_2rst_in::LAYOUT,
    &qp_2rst_out::LAYOUT,
    &query_qp_in::LAYOUT,
    &query_qp_out::LAYOUT,
    &ud_adrs_vector::LAYOUT,
    &cqe64::LAYOUT,
    &err_cqe::LAYOUT,
    &wqe_ctrl_seg::LAYOUT,
    &wqe_raddr_seg::LAYOUT,
    &wqe_atomic_seg::LAYOUT,
    &wqe_data_seg::LAYOUT,
    &wqe_inline_seg::LAYOUT,
    &qp_doorbell_record::LAYOUT,
    &cq_doorbell_record::LAYOUT,
    &cq_uar_doorbell::LAYOUT,
    &eq_uar_doorbell::LAYOUT,
    // Raw Ethernet queues and flow steering.
    &tisc::LAYOUT,
    &create_tis_in::LAYOUT,
    &create_tis_out::LAYOUT,
    &destroy_tis_in::LAYOUT,
    &destroy_tis_out::LAYOUT,
    &wq::LAYOUT,
    &sqc::LAYOUT,
    &create_sq_in::LAYOUT,
    &create_sq_out::LAYOUT,
    &modify_sq_in::LAYOUT,
    &modify_sq_out::LAYOUT,
    &destroy_sq_in::LAYOUT,
    &destroy_sq_out::LAYOUT,
    &query_sq_in::LAYOUT,
    &query_sq_out::LAYOUT,
    &rqc::LAYOUT,
    &create_rq_in::LAYOUT,
    &create_rq_out::LAYOUT,
    &modify_rq_in::LAYOUT,
    &modify_rq_out::LAYOUT,
    &destroy_rq_in::LAYOUT,
    &destroy_rq_out::LAYOUT,
    &query_rq_in::LAYOUT,
    &query_rq_out::LAYOUT,
    &tirc::LAYOUT,
    &create_tir_in::LAYOUT,
    &create_tir_out::LAYOUT,
    &destroy_tir_in::LAYOUT,
    &destroy_tir_out::LAYOUT,
    &query_tir_in::LAYOUT,
    &query_tir_out::LAYOUT,
    &per_protocol_networking_offload_caps::LAYOUT,
    &wqe_eth_seg::LAYOUT,
    &flow_table_context::LAYOUT,
    &create_flow_table_in::LAYOUT,
    &create_flow_table_out::LAYOUT,
    &destroy_flow_table_in::LAYOUT,
    &destroy_flow_table_out::LAYOUT,
    &query_flow_table_in::LAYOUT,
    &query_flow_table_out::LAYOUT,
    &fte_match_set_lyr_2_4::LAYOUT,
    &fte_match_set_misc::LAYOUT,
    &fte_match_set_misc3::LAYOUT,
    &fte_match_param::LAYOUT,
    &create_flow_group_in::LAYOUT,
    &create_flow_group_out::LAYOUT,
    &destroy_flow_group_in::LAYOUT,
    &destroy_flow_group_out::LAYOUT,
    &dest_format_struct::LAYOUT,
    &dest_format_flow_counter_list_auto::LAYOUT,
    &flow_context::LAYOUT,
    &set_fte_in::LAYOUT,
    &set_fte_out::LAYOUT,
    &delete_fte_in::LAYOUT,
    &delete_fte_out::LAYOUT,
    &query_fte_in::LAYOUT,
    &query_fte_out::LAYOUT,
    &set_flow_table_root_in::LAYOUT,
    &set_flow_table_root_out::LAYOUT,
    &flow_table_fields_supported::LAYOUT,
    &flow_table_prop_layout::LAYOUT,
    &flow_table_nic_cap::LAYOUT,
    &traffic_counter::LAYOUT,
    &query_vport_counter_in::LAYOUT,
    &query_vport_counter_out::LAYOUT,
];

/// The declared structure with this PRM name.
pub fn layout(name: &str) -> Option<&'static StructLayout> {
    ALL_LAYOUTS.iter().copied().find(|l| l.name == name)
}
