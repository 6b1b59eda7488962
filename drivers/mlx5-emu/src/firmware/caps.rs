//! The capability pages the firmware reports (QUERY_HCA_CAP) and accepts (SET_HCA_CAP):
//! general (`cmd_hca_cap`), Ethernet offloads (`per_protocol_networking_offload_caps`), RoCE
//! (`roce_cap`) and NIC flow table (`flow_table_nic_cap`), each as a *max* page (what the
//! device supports) and a *current* page (what is enabled now). The Ethernet and flow table
//! pages have no settable field.
//!
//! Values are a plausible ConnectX-5 Ethernet function (mlx5.md §5.3 names the fields; the
//! numbers are ours, listed in docs/mlx5-emu.md). SET_HCA_CAP semantics (mlx5.md §3.1 step 10:
//! "copy current caps, modify, SET_HCA_CAP"): the page sent must equal the current page except
//! in the settable fields listed here, and each settable field must not exceed its max value.

use rnic_mlx5_prm::{
    CmdHcaCap, FieldLayout, FlowTableNicCap, PORT_TYPE_ETH, PORT_TYPE_IB,
    PerProtocolNetworkingOffloadCaps, ROCE_VERSION_1_CAP, ROCE_VERSION_2_CAP, cap_inline_mode,
    cmd_hca_cap, flex_parser_proto, flow_table_fields_supported as ffs, flow_table_nic_cap,
    flow_table_prop_layout as ftp, get_bits, per_protocol_networking_offload_caps as eth_cap,
    roce_cap, set_bits,
};

use super::syndrome;
use super::{FirmwareOptions, PortType};

/// Bytes of a capability page as QUERY_HCA_CAP returns it (mlx5.md §5.2: out len 0x1010,
/// capability page at 0x10).
pub const CAP_PAGE_BYTES: usize = 0x1000;

/// The general-cap fields SET_HCA_CAP may change (those K and RC set, mlx5.md §3.1 step 10).
pub const GENERAL_SETTABLE: &[FieldLayout] = &[
    cmd_hca_cap::cmdif_checksum,
    cmd_hca_cap::log_uar_page_sz,
    cmd_hca_cap::mkey_by_name,
    cmd_hca_cap::pkey_table_size,
    cmd_hca_cap::log_max_qp,
    cmd_hca_cap::drain_sigerr,
    cmd_hca_cap::uar_4k,
    cmd_hca_cap::cache_line_128byte,
    cmd_hca_cap::dct,
    cmd_hca_cap::release_all_pages,
    cmd_hca_cap::num_vhca_ports,
    cmd_hca_cap::roce,
    cmd_hca_cap::abs_native_port_num,
];

/// The RoCE-cap fields SET_HCA_CAP may change (mlx5.md §3.1 step 11).
pub const ROCE_SETTABLE: &[FieldLayout] = &[
    roce_cap::sw_r_roce_src_udp_port,
    roce_cap::qp_ooo_transmit_default,
];

/// One capability type: max and current pages (4096 bytes each; the structure is the first
/// 256 bytes, the rest reads zero).
#[derive(Clone, Debug)]
pub struct CapPair {
    /// The maximum (supported) values.
    pub max: Vec<u8>,
    /// The current (enabled) values.
    pub current: Vec<u8>,
    settable: &'static [FieldLayout],
    declared: &'static [FieldLayout],
}

/// Why SET_HCA_CAP refused a page: the syndrome and the field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CapRefusal {
    /// [`syndrome::CAP_READ_ONLY`] or [`syndrome::CAP_ABOVE_MAX`].
    pub syndrome: u32,
    /// The field's name (or "undeclared bits").
    pub field: &'static str,
}

fn field_value(page: &[u8], f: &FieldLayout) -> u64 {
    get_bits(page, f.bit_offset as usize, f.width).unwrap_or(0)
}

impl CapPair {
    /// Check `requested` against the rules of the module docs; store it as current if it
    /// passes. Nothing changes on refusal.
    pub fn set(&mut self, requested: &[u8]) -> Result<(), CapRefusal> {
        let mut req = vec![0u8; CAP_PAGE_BYTES];
        let n = requested.len().min(CAP_PAGE_BYTES);
        req[..n].copy_from_slice(&requested[..n]);
        // Bits no settable field covers must equal the current page.
        let mut mask = vec![0u8; CAP_PAGE_BYTES];
        for f in self.settable {
            let ones = if f.width >= 64 {
                u64::MAX
            } else {
                (1u64 << f.width) - 1
            };
            let _ = set_bits(&mut mask, f.bit_offset as usize, f.width, ones);
        }
        let differs = req
            .iter()
            .zip(&self.current)
            .zip(&mask)
            .any(|((r, c), m)| (r ^ c) & !m != 0);
        if differs {
            let field = self
                .declared
                .iter()
                .find(|f| field_value(&req, f) != field_value(&self.current, f))
                .map_or("undeclared bits", |f| f.name);
            return Err(CapRefusal {
                syndrome: syndrome::CAP_READ_ONLY,
                field,
            });
        }
        if let Some(f) = self
            .settable
            .iter()
            .find(|f| field_value(&req, f) > field_value(&self.max, f))
        {
            return Err(CapRefusal {
                syndrome: syndrome::CAP_ABOVE_MAX,
                field: f.name,
            });
        }
        self.current = req;
        Ok(())
    }

    /// The page for QUERY_HCA_CAP: current (`true`) or max.
    pub fn page(&self, current: bool) -> &[u8] {
        if current { &self.current } else { &self.max }
    }
}

/// The capability types the firmware has.
#[derive(Clone, Debug)]
pub struct Caps {
    /// General (`cap_type` 0).
    pub general: CapPair,
    /// RoCE (`cap_type` 4).
    pub roce: CapPair,
    /// Ethernet offloads (`cap_type` 1).
    pub eth: CapPair,
    /// NIC flow table (`cap_type` 7).
    pub flow: CapPair,
}

/// Write each (field, value) into `page` through its layout. The values never exceed their
/// fields (the unit test reads them back); one that did would be logged and left 0.
fn fill(page: &mut [u8], sets: &[(FieldLayout, u32)]) {
    for (f, v) in sets {
        if let Err(e) = set_bits(page, f.bit_offset as usize, f.width, u64::from(*v)) {
            tracing::error!(%e, field = f.name, "capability default does not fit its field (bug)");
        }
    }
}

fn general_page(max: bool, o: &FirmwareOptions) -> Vec<u8> {
    let mut page = vec![0u8; CAP_PAGE_BYTES];
    let settable = |v: u32| if max { v } else { 0 };
    let port_type = match o.port_type {
        PortType::Eth => PORT_TYPE_ETH,
        PortType::Ib => PORT_TYPE_IB,
    };
    let sets = [
        (cmd_hca_cap::log_max_srq_sz, 15),
        (cmd_hca_cap::log_max_qp_sz, 15),
        (cmd_hca_cap::log_max_qp, 18),
        (cmd_hca_cap::log_max_srq, 20),
        (cmd_hca_cap::log_max_cq_sz, 22),
        (cmd_hca_cap::log_max_cq, 24),
        (cmd_hca_cap::log_max_eq_sz, 22),
        (cmd_hca_cap::log_max_mkey, 24),
        (cmd_hca_cap::log_max_eq, 7),
        (cmd_hca_cap::max_indirection, 4),
        (cmd_hca_cap::log_max_mrw_sz, 64),
        (cmd_hca_cap::log_max_klm_list_size, 16),
        (cmd_hca_cap::log_max_ra_req_qp, 4),
        (cmd_hca_cap::log_max_ra_res_qp, 4),
        (cmd_hca_cap::cache_line_128byte, settable(1)),
        (cmd_hca_cap::gid_table_size, 256),
        (cmd_hca_cap::pkey_table_size, 0),
        (cmd_hca_cap::port_type, port_type),
        (cmd_hca_cap::num_ports, 1),
        (cmd_hca_cap::log_max_msg, 30),
        (cmd_hca_cap::max_tc, 8),
        (cmd_hca_cap::cqe_version, 1),
        (cmd_hca_cap::drain_sigerr, settable(1)),
        (cmd_hca_cap::cmdif_checksum, 0),
        (cmd_hca_cap::eth_net_offloads, 1),
        (cmd_hca_cap::roce, 1),
        (cmd_hca_cap::atomic, u32::from(o.atomic)),
        (cmd_hca_cap::cq_oi, 1),
        (cmd_hca_cap::cq_resize, 1),
        (cmd_hca_cap::cq_moderation, 1),
        (cmd_hca_cap::cq_eq_remap, 1),
        (cmd_hca_cap::qkv, 1),
        (cmd_hca_cap::pkv, 1),
        (cmd_hca_cap::ud, 1),
        (cmd_hca_cap::uc, 1),
        (cmd_hca_cap::rc, 1),
        (cmd_hca_cap::uar_4k, settable(1)),
        (cmd_hca_cap::log_pg_sz, 12),
        (cmd_hca_cap::bf, 1),
        (cmd_hca_cap::driver_version, 1),
        (cmd_hca_cap::mkey_by_name, settable(1)),
        (cmd_hca_cap::log_bf_reg_size, 9),
        (cmd_hca_cap::max_wqe_sz_sq, 1024),
        (cmd_hca_cap::max_wqe_sz_rq, 512),
        (cmd_hca_cap::max_qp_mcg, 240),
        (cmd_hca_cap::log_max_mcg, 21),
        (cmd_hca_cap::log_max_transport_domain, 20),
        (cmd_hca_cap::log_max_pd, 24),
        (cmd_hca_cap::log_max_xrcd, 24),
        (cmd_hca_cap::roce_rw_supported, 1),
        (cmd_hca_cap::log_max_wq_sz, 17),
        // 128 addresses per list (mlx5e's per-vport lists rarely hold more; a smaller
        // limit than the 12-bit allowed_list_size keeps the bound checkable).
        (cmd_hca_cap::log_max_current_mc_list, 7),
        (cmd_hca_cap::log_max_current_uc_list, 7),
        (cmd_hca_cap::sq_ts_format, 0),
        (cmd_hca_cap::rq_ts_format, 0),
        (cmd_hca_cap::log_uar_page_sz, 0),
        // Current as well as max: the firmware reports the ports already (a driver that
        // copies current keeps them).
        (cmd_hca_cap::num_vhca_ports, u32::from(o.num_vhca_ports)),
        // Raw Ethernet and flow steering (issue 27).
        (cmd_hca_cap::nic_flow_table, 1),
        (cmd_hca_cap::vport_counters, 1),
        (cmd_hca_cap::log_max_rq, 16),
        (cmd_hca_cap::log_max_sq, 16),
        (cmd_hca_cap::log_max_tir, 16),
        (cmd_hca_cap::log_max_tis, 16),
        (cmd_hca_cap::log_max_tis_per_sq, 0),
        (cmd_hca_cap::basic_cyclic_rcv_wqe, 1),
        (
            cmd_hca_cap::flex_parser_protocols,
            flex_parser_proto::ICMP | flex_parser_proto::ICMPV6,
        ),
        (
            cmd_hca_cap::terminate_scatter_list_mkey,
            u32::from(o.terminate_scatter_key),
        ),
    ];
    fill(&mut page, &sets);
    page
}

fn roce_page(max: bool, o: &FirmwareOptions) -> Vec<u8> {
    let mut page = vec![0u8; CAP_PAGE_BYTES];
    let sets = [
        (roce_cap::qp_ts_format, o.roce_qp_ts_format),
        (roce_cap::sw_r_roce_src_udp_port, u32::from(max)),
        (roce_cap::l3_type, 0x7),
        (
            roce_cap::roce_version,
            ROCE_VERSION_1_CAP | ROCE_VERSION_2_CAP,
        ),
        (roce_cap::r_roce_dest_udp_port, 4791),
        (roce_cap::r_roce_max_src_udp_port, 0xffff),
        (roce_cap::r_roce_min_src_udp_port, 0xc000),
        (roce_cap::roce_address_table_size, 256),
    ];
    fill(&mut page, &sets);
    page
}

/// Ethernet offloads: checksums, VLAN stripping; no LSO, LRO, RSS or tunnels; send WQEs inline
/// what the vport context's `min_wqe_inline_mode` says.
fn eth_page() -> Vec<u8> {
    let mut page = vec![0u8; CAP_PAGE_BYTES];
    let sets = [
        (eth_cap::csum_cap, 1),
        (eth_cap::vlan_cap, 1),
        (eth_cap::wqe_inline_mode, cap_inline_mode::VPORT_CONTEXT),
    ];
    fill(&mut page, &sets);
    page
}

/// NIC flow tables: the receive type only, the fields the port's parser matches.
fn flow_page() -> Vec<u8> {
    let mut page = vec![0u8; CAP_PAGE_BYTES];
    let rx = flow_table_nic_cap::flow_table_properties_nic_receive.bit_offset;
    let at = |f: FieldLayout| FieldLayout {
        bit_offset: rx + f.bit_offset,
        ..f
    };
    let field = |f: FieldLayout| FieldLayout {
        bit_offset: rx + ftp::ft_field_support.bit_offset + f.bit_offset,
        ..f
    };
    let mut sets = vec![
        (at(ftp::ft_support), 1),
        (at(ftp::modify_root), 1),
        (at(ftp::reset_root_to_default), 1),
        (at(ftp::log_max_ft_size), 16),
        (at(ftp::max_ft_level), 63),
        (at(ftp::log_max_ft_num), 8),
        (at(ftp::log_max_destination), 4),
        (at(ftp::log_max_flow), 16),
    ];
    for f in [
        ffs::outer_dmac,
        ffs::outer_smac,
        ffs::outer_ether_type,
        ffs::outer_ip_version,
        ffs::outer_first_prio,
        ffs::outer_first_cfi,
        ffs::outer_first_vid,
        ffs::outer_ipv4_ttl,
        ffs::outer_sip,
        ffs::outer_dip,
        ffs::outer_frag,
        ffs::outer_ip_protocol,
        ffs::outer_ip_ecn,
        ffs::outer_ip_dscp,
        ffs::outer_udp_sport,
        ffs::outer_udp_dport,
        ffs::outer_tcp_sport,
        ffs::outer_tcp_dport,
        ffs::outer_tcp_flags,
    ] {
        sets.push((field(f), 1));
        sets.push((
            FieldLayout {
                bit_offset: rx + ftp::ft_field_bitmask_support.bit_offset + f.bit_offset,
                ..f
            },
            1,
        ));
    }
    fill(&mut page, &sets);
    page
}

impl Default for Caps {
    /// The power-on capabilities of a default firmware.
    fn default() -> Caps {
        Caps::new(&FirmwareOptions::default())
    }
}

impl Caps {
    /// The power-on capabilities of a firmware configured with `o`.
    pub fn new(o: &FirmwareOptions) -> Caps {
        Caps {
            general: CapPair {
                max: general_page(true, o),
                current: general_page(false, o),
                settable: GENERAL_SETTABLE,
                declared: cmd_hca_cap::LAYOUT.fields,
            },
            roce: CapPair {
                max: roce_page(true, o),
                current: roce_page(false, o),
                settable: ROCE_SETTABLE,
                declared: roce_cap::LAYOUT.fields,
            },
            eth: CapPair {
                max: eth_page(),
                current: eth_page(),
                settable: &[],
                declared: eth_cap::LAYOUT.fields,
            },
            flow: CapPair {
                max: flow_page(),
                current: flow_page(),
                settable: &[],
                declared: flow_table_nic_cap::LAYOUT.fields,
            },
        }
    }

    /// The current Ethernet offload capabilities as a view.
    pub fn eth(&self) -> PerProtocolNetworkingOffloadCaps<&[u8]> {
        PerProtocolNetworkingOffloadCaps::new_unchecked(&self.eth.current[..])
    }

    /// The current NIC flow table capabilities as a view.
    pub fn flow(&self) -> FlowTableNicCap<&[u8]> {
        FlowTableNicCap::new_unchecked(&self.flow.current[..])
    }

    /// The current general capabilities as a view.
    pub fn general(&self) -> CmdHcaCap<&[u8]> {
        CmdHcaCap::new_unchecked(&self.general.current[..])
    }

    /// The current RoCE capabilities as a view.
    pub fn roce(&self) -> rnic_mlx5_prm::RoceCap<&[u8]> {
        rnic_mlx5_prm::RoceCap::new_unchecked(&self.roce.current[..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rnic_mlx5_prm::RoceCap;

    #[test]
    fn defaults_fit_and_current_never_exceeds_max() {
        let caps = Caps::default();
        let g = caps.general();
        assert_eq!(g.log_max_qp(), 18);
        assert_eq!(g.log_max_msg(), 30);
        assert_eq!(g.log_max_mrw_sz(), 64);
        assert_eq!(g.port_type(), PORT_TYPE_ETH);
        assert_eq!(g.roce(), 1);
        assert_eq!(g.log_bf_reg_size(), 9);
        let gm = CmdHcaCap::new_unchecked(&caps.general.max[..]);
        assert_eq!((gm.mkey_by_name(), g.mkey_by_name()), (1, 0));
        let r = RoceCap::new_unchecked(&caps.roce.current[..]);
        assert_eq!(r.r_roce_dest_udp_port(), 4791);
        assert_eq!(r.roce_version(), 0x5);
        for pair in [&caps.general, &caps.roce] {
            for f in pair.settable {
                assert!(field_value(&pair.current, f) <= field_value(&pair.max, f));
            }
        }
    }

    #[test]
    fn set_accepts_settable_within_max_and_refuses_the_rest() {
        let mut caps = Caps::default();
        let mut page = caps.general.current.clone();
        let mut v = CmdHcaCap::new_unchecked(&mut page[..]);
        v.set_mkey_by_name(1).unwrap();
        v.set_log_max_qp(17).unwrap();
        caps.general.set(&page).unwrap();
        assert_eq!(caps.general().mkey_by_name(), 1);
        assert_eq!(caps.general().log_max_qp(), 17);

        let mut above = caps.general.current.clone();
        CmdHcaCap::new_unchecked(&mut above[..])
            .set_log_max_qp(19)
            .unwrap();
        assert_eq!(
            caps.general.set(&above),
            Err(CapRefusal {
                syndrome: syndrome::CAP_ABOVE_MAX,
                field: "log_max_qp"
            })
        );
        let mut ro = caps.general.current.clone();
        CmdHcaCap::new_unchecked(&mut ro[..])
            .set_log_max_pd(10)
            .unwrap();
        assert_eq!(
            caps.general.set(&ro),
            Err(CapRefusal {
                syndrome: syndrome::CAP_READ_ONLY,
                field: "log_max_pd"
            })
        );
        let mut undeclared = caps.general.current.clone();
        undeclared[0x800] = 1;
        assert_eq!(
            caps.general.set(&undeclared).unwrap_err().field,
            "undeclared bits"
        );
        assert_eq!(caps.general().log_max_qp(), 17, "refusals change nothing");
    }
}
