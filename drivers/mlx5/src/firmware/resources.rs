//! Memory keys (mlx5.md §6) and the port's RoCE addresses (§5.4, §11a
//! steps 2–3): [`Mkey`], [`Hca::set_gid`].

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use rnic_core::{AccessFlags, Gid, Lkey, Memory, Rkey};
use rnic_mlx5_prm::{
    AccessRegisterIn, AccessRegisterOut, CmdOpcode, CreateMkeyIn, CreateMkeyOut,
    DeleteL2TableEntryIn, DeleteL2TableEntryOut, DestroyMkeyIn, DestroyMkeyOut, MKEY_QPN_UNBOUND,
    MTT_READ_ENABLE, MTT_WRITE_ENABLE, ModifyNicVportContextIn, ModifyNicVportContextOut, PtysReg,
    QUERY_VPORT_COUNTER_OP_MOD_VPORT, QueryNicVportContextIn, QueryNicVportContextOut,
    QueryVportCounterIn, QueryVportCounterOut, QueryVportStateIn, QueryVportStateOut,
    ROCE_L3_TYPE_IPV4, ROCE_L3_TYPE_IPV6, ROCE_VERSION_2, SetL2TableEntryIn, SetL2TableEntryOut,
    SetRoceAddressIn, SetRoceAddressOut, access_reg_op_mod, mkey_access_mode, ptys_proto,
    register_id,
};
use tracing::{debug, info, warn};

use crate::error::UserMemoryProblem;
use crate::function::memory::lock;
use crate::rdma::wq::RegionBytes;
use crate::{DmaBuffer, Hca, Mlx5Error, UserPages};

fn prm(what: &'static str) -> impl Fn(rnic_mlx5_prm::Error) -> Mlx5Error {
    move |source| Mlx5Error::Prm { what, source }
}

/// QUERY_VPORT_STATE `state`: the link is up (K `MLX5_VPORT_STATE_UP`).
const VPORT_STATE_UP: u32 = 1;

/// (lanes, Mb/s per lane) of the lowest legacy Ethernet link mode bit set
/// in a PTYS `eth_proto_*` word (K en_ethtool.c `mlx5e_ptys2ethtool`'s
/// table: bit → mode).
pub fn eth_link_mode(bits: u32) -> Option<(u8, u32)> {
    const MODES: [(u32, u8, u32); 26] = [
        (0, 1, 1_000),   // 1000BASE-CX-SGMII
        (1, 1, 1_000),   // 1000BASE-KX
        (2, 4, 2_500),   // 10GBASE-CX4
        (3, 4, 2_500),   // 10GBASE-KX4
        (4, 1, 10_000),  // 10GBASE-KR
        (5, 2, 10_000),  // 20GBASE-KR2
        (6, 4, 10_000),  // 40GBASE-CR4
        (7, 4, 10_000),  // 40GBASE-KR4
        (8, 4, 14_000),  // 56GBASE-R4
        (12, 1, 10_000), // 10GBASE-CR
        (13, 1, 10_000), // 10GBASE-SR
        (14, 1, 10_000), // 10GBASE-ER
        (15, 4, 10_000), // 40GBASE-SR4
        (16, 4, 10_000), // 40GBASE-LR4
        (18, 2, 25_000), // 50GBASE-SR2
        (20, 4, 25_000), // 100GBASE-CR4
        (21, 4, 25_000), // 100GBASE-SR4
        (22, 4, 25_000), // 100GBASE-KR4
        (23, 4, 25_000), // 100GBASE-LR4
        (24, 1, 100),    // 100BASE-TX
        (25, 1, 1_000),  // 1000BASE-T
        (26, 1, 10_000), // 10GBASE-T
        (27, 1, 25_000), // 25GBASE-CR
        (28, 1, 25_000), // 25GBASE-KR
        (29, 1, 25_000), // 25GBASE-SR
        (30, 2, 25_000), // 50GBASE-CR2
    ];
    if bits & (1 << 31) != 0 {
        return Some((2, 25_000)); // 50GBASE-KR2
    }
    MODES
        .iter()
        .find(|(bit, ..)| bits & (1 << bit) != 0)
        .map(|&(_, lanes, mbps)| (lanes, mbps))
}

/// Bytes of one MKey translation page (the MTT's `log_page_size` = 12).
pub const MTT_PAGE_BYTES: usize = 4096;

/// RoCE state of the function: its MAC, whether `roce_en` was set, and the
/// GID indexes written.
#[derive(Debug, Default)]
pub(crate) struct RoceState {
    mac: Option<[u8; 6]>,
    roce_enabled: bool,
    gids: BTreeMap<u16, Gid>,
    /// The MPFS L2 table entry holding the function's MAC, when written.
    mpfs: Option<u32>,
    /// The port's 802.1Q VLAN id and priority ([`Hca::set_vlan`]).
    vlan: Option<(u16, u8)>,
}

/// Packets and octets of one [`VportCounters`] class.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Packets.
    pub packets: u64,
    /// Octets.
    pub octets: u64,
}

/// The NIC vport's own traffic counters (QUERY_VPORT_COUNTER): what the
/// port received and sent by cast, and what it dropped in error — beside
/// the port L2's counters, the NIC's view of the same wire.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VportCounters {
    /// Frames received in error (over the MTU, malformed).
    pub rx_errors: Traffic,
    /// Frames not sent in error.
    pub tx_errors: Traffic,
    /// Unicast received / sent.
    pub rx_unicast: Traffic,
    /// Unicast sent.
    pub tx_unicast: Traffic,
    /// Multicast received.
    pub rx_multicast: Traffic,
    /// Multicast sent.
    pub tx_multicast: Traffic,
    /// Broadcast received.
    pub rx_broadcast: Traffic,
    /// Broadcast sent.
    pub tx_broadcast: Traffic,
}

/// `allowed_list_type` of a multicast address list (the kernel's
/// MLX5_NVPRT_LIST_TYPE_MC).
const NIC_VPORT_LIST_MC: u32 = 1;

impl Hca {
    /// Whether `gid` is one of the function's own (set with [`Hca::set_gid`]).
    pub fn owns_gid(&self, gid: &Gid) -> bool {
        lock(&self.roce).gids.values().any(|g| g == gid)
    }

    /// Whether `gid` is set at an index other than `index`.
    fn owns_gid_other(&self, gid: &Gid, index: u16) -> bool {
        lock(&self.roce)
            .gids
            .iter()
            .any(|(i, g)| *i != index && g == gid)
    }

    /// Put the port's RoCE traffic on 802.1Q VLAN `vid` with priority `pcp`
    /// (`None`: untagged): every GID is programmed again with the VLAN
    /// (SET_ROCE_ADDRESS `vlan_valid`/`vlan_id`, as the kernel does for a
    /// GID of a VLAN netdev) and QPs connected from now on send with the
    /// priority (`ads.eth_prio`). The port's ARP/ND takes its tag from
    /// `PortOptions::vlan`.
    pub fn set_vlan(&self, vlan: Option<(u16, u8)>) -> Result<(), Mlx5Error> {
        if let Some((vid, pcp)) = vlan
            && (!(1..=4094).contains(&vid) || pcp > 7)
        {
            return Err(Mlx5Error::QpOptions {
                reason: format!(
                    "VLAN {vid} priority {pcp}: the id is 1..=4094 and the priority 0..=7"
                ),
            });
        }
        let (gids, mac) = {
            let mut r = lock(&self.roce);
            r.vlan = vlan;
            (r.gids.clone(), r.mac)
        };
        if let Some(mac) = mac {
            for (index, gid) in gids {
                self.set_roce_address(index, &gid, mac)?;
            }
        }
        info!(?vlan, "port VLAN");
        Ok(())
    }

    /// The port's VLAN id and priority, if it has one.
    pub fn vlan(&self) -> Option<(u16, u8)> {
        lock(&self.roce).vlan
    }

    /// Set the vport's MTU (`nic_vport_context.mtu` through
    /// MODIFY_NIC_VPORT_CONTEXT, the unit [`Hca::vport_mtu`] reads); QPs
    /// connected from then on have their path MTU capped to fit it.
    pub fn set_mtu(&self, mtu: u32) -> Result<(), Mlx5Error> {
        self.modify_vport(0, |v| {
            v.field_select_mut().set_mtu(1)?;
            v.nic_vport_context_mut().set_mtu(mtu)
        })?;
        info!(mtu, "vport MTU");
        Ok(())
    }

    /// The group addresses (broadcast included) whose frames the NIC delivers
    /// to this function's RX flow table: MODIFY_NIC_VPORT_CONTEXT
    /// `addresses_list` with `allowed_list_type` MC, replacing the list. A
    /// ConnectX's e-switch replicates broadcast and multicast to a vport by
    /// this list; mlx5e programs it with broadcast and every multicast
    /// address of the netdev (the kernel's `mlx5_modify_nic_vport_mac_list`:
    /// each entry a `mac_address_layout`, the MAC in its low 6 bytes).
    pub fn set_multicast_list(&self, macs: &[[u8; 6]]) -> Result<(), Mlx5Error> {
        let caps = self.general_caps()?;
        let max = 1usize << caps.log_max_current_mc_list();
        if macs.len() > max || macs.iter().any(|m| m[0] & 1 == 0) {
            return Err(Mlx5Error::QpOptions {
                reason: format!(
                    "multicast list: {} addresses (at most {max}, each a group address)",
                    macs.len()
                ),
            });
        }
        self.modify_vport(8 * macs.len(), |v| {
            v.field_select_mut().set_addresses_list(1)?;
            let mut c = v.nic_vport_context_mut();
            c.set_allowed_list_type(NIC_VPORT_LIST_MC)?;
            c.set_allowed_list_size(macs.len() as u32)?;
            for (i, m) in macs.iter().enumerate() {
                let mut e = [0u8; 8];
                e[2..].copy_from_slice(m);
                c.set_current_uc_mac_address(i, u64::from_be_bytes(e))?;
            }
            Ok(())
        })?;
        debug!(n = macs.len(), "vport multicast list");
        Ok(())
    }

    /// MODIFY_NIC_VPORT_CONTEXT of this function's vport: `fill` selects and
    /// sets the fields in an input `extra` bytes longer than the structure
    /// (an address list's entries).
    fn modify_vport(
        &self,
        extra: usize,
        fill: impl FnOnce(&mut ModifyNicVportContextIn<&mut [u8]>) -> Result<(), rnic_mlx5_prm::Error>,
    ) -> Result<(), Mlx5Error> {
        let mut buf = vec![0u8; ModifyNicVportContextIn::<&[u8]>::SIZE_BYTES + extra];
        ModifyNicVportContextIn::new_checked(&mut buf[..])
            .and_then(|mut v| fill(&mut v))
            .map_err(prm("MODIFY_NIC_VPORT_CONTEXT"))?;
        self.exec(
            CmdOpcode::ModifyNicVportContext,
            0,
            &buf,
            ModifyNicVportContextOut::<&[u8]>::SIZE_BYTES,
        )?;
        Ok(())
    }

    /// The vport's traffic counters (QUERY_VPORT_COUNTER, op_mod 0: this
    /// function's own vport); not cleared.
    pub fn vport_counters(&self) -> Result<VportCounters, Mlx5Error> {
        let mut cmd = vec![0u8; QueryVportCounterIn::<&[u8]>::SIZE_BYTES];
        QueryVportCounterIn::new_checked(&mut cmd[..])
            .and_then(|mut v| v.set_op_mod(QUERY_VPORT_COUNTER_OP_MOD_VPORT))
            .map_err(prm("QUERY_VPORT_COUNTER"))?;
        let out = self.exec(
            CmdOpcode::QueryVportCounter,
            QUERY_VPORT_COUNTER_OP_MOD_VPORT as u16,
            &cmd,
            QueryVportCounterOut::<&[u8]>::SIZE_BYTES,
        )?;
        let v = QueryVportCounterOut::new_checked(&out[..]).map_err(prm("QUERY_VPORT_COUNTER"))?;
        let t = |c: rnic_mlx5_prm::TrafficCounter<&[u8]>| Traffic {
            packets: c.packets(),
            octets: c.octets(),
        };
        Ok(VportCounters {
            rx_errors: t(v.received_errors()),
            tx_errors: t(v.transmit_errors()),
            rx_unicast: t(v.received_eth_unicast()),
            tx_unicast: t(v.transmitted_eth_unicast()),
            rx_multicast: t(v.received_eth_multicast()),
            tx_multicast: t(v.transmitted_eth_multicast()),
            rx_broadcast: t(v.received_eth_broadcast()),
            tx_broadcast: t(v.transmitted_eth_broadcast()),
        })
    }

    /// The IP addresses of the function's GIDs.
    pub fn own_ips(&self) -> Vec<IpAddr> {
        let mut ips: Vec<IpAddr> = lock(&self.roce)
            .gids
            .values()
            .map(crate::firmware::neigh::gid_ip)
            .collect();
        ips.dedup();
        ips
    }

    /// Entries of the port's GID table: the RoCE cap's
    /// `roce_address_table_size` (audit row 8); 0 without RoCE.
    pub fn gid_table_len(&self) -> u32 {
        self.roce_caps().map_or(0, |r| r.roce_address_table_size())
    }

    /// The function's permanent MAC (QUERY_NIC_VPORT_CONTEXT), once
    /// [`Hca::set_gid`] ran.
    pub fn mac(&self) -> Option<[u8; 6]> {
        lock(&self.roce).mac
    }

    /// QUERY_NIC_VPORT_CONTEXT of the function's own vport: the output.
    fn query_vport(&self) -> Result<Vec<u8>, Mlx5Error> {
        let buf = vec![0u8; QueryNicVportContextIn::<&[u8]>::SIZE_BYTES];
        self.exec(
            CmdOpcode::QueryNicVportContext,
            0,
            &buf,
            QueryNicVportContextOut::<&[u8]>::SIZE_BYTES,
        )
    }

    fn query_mac(&self) -> Result<[u8; 6], Mlx5Error> {
        let out = self.query_vport()?;
        let v = QueryNicVportContextOut::new_checked(&out[..])
            .map_err(prm("QUERY_NIC_VPORT_CONTEXT"))?;
        let addr = v.nic_vport_context().permanent_address().to_be_bytes();
        Ok([addr[2], addr[3], addr[4], addr[5], addr[6], addr[7]])
    }

    /// Whether the vport's link is up: QUERY_VPORT_STATE's operational
    /// `state` (K core/vport.c `mlx5_query_vport_state`; 1 = up; audit row 8).
    pub fn link_up(&self) -> Result<bool, Mlx5Error> {
        let buf = vec![0u8; QueryVportStateIn::<&[u8]>::SIZE_BYTES];
        let out = self.exec(
            CmdOpcode::QueryVportState,
            0,
            &buf,
            QueryVportStateOut::<&[u8]>::SIZE_BYTES,
        )?;
        let v = QueryVportStateOut::new_checked(&out[..]).map_err(prm("QUERY_VPORT_STATE"))?;
        Ok(v.state() == VPORT_STATE_UP)
    }

    /// The port's operating lanes and per-lane rate (Mb/s) from the PTYS
    /// register's `eth_proto_oper` (ACCESS_REG 0x5004 read, Ethernet
    /// protocols; the legacy link modes K's mlx5e maps in
    /// `mlx5e_ptys2ethtool`); `None` when the link is down or the mode is
    /// not one of them (audit row 8).
    pub fn link_speed(&self) -> Result<Option<(u8, u32)>, Mlx5Error> {
        let head = AccessRegisterIn::<&[u8]>::SIZE_BYTES;
        let reg_len = PtysReg::<&[u8]>::SIZE_BYTES;
        let mut cmd = vec![0u8; head + reg_len];
        AccessRegisterIn::new_checked(&mut cmd[..])
            .and_then(|mut v| {
                v.set_register_id(register_id::PTYS)?;
                v.set_argument(0)
            })
            .map_err(prm("ACCESS_REG PTYS"))?;
        PtysReg::new_checked(&mut cmd[head..])
            .and_then(|mut r| {
                r.set_local_port(1)?;
                r.set_proto_mask(ptys_proto::ETH)
            })
            .map_err(prm("ACCESS_REG PTYS"))?;
        let out = self.exec(
            CmdOpcode::AccessReg,
            access_reg_op_mod::READ as u16,
            &cmd,
            AccessRegisterOut::<&[u8]>::SIZE_BYTES + reg_len,
        )?;
        let at = AccessRegisterOut::<&[u8]>::SIZE_BYTES;
        let oper = PtysReg::new_checked(out.get(at..).unwrap_or(&[]))
            .map_err(prm("ACCESS_REG PTYS"))?
            .eth_proto_oper();
        Ok(eth_link_mode(oper))
    }

    /// The vport's Ethernet MTU in bytes (`nic_vport_context.mtu`, mlx5.md
    /// §5.4), read from the firmware each call.
    pub fn vport_mtu(&self) -> Result<u32, Mlx5Error> {
        let out = self.query_vport()?;
        let v = QueryNicVportContextOut::new_checked(&out[..])
            .map_err(prm("QUERY_NIC_VPORT_CONTEXT"))?;
        Ok(v.nic_vport_context().mtu())
    }

    fn set_roce_en(&self, on: bool) -> Result<(), Mlx5Error> {
        self.modify_vport(0, |v| {
            v.field_select_mut().set_roce_en(1)?;
            v.nic_vport_context_mut().set_roce_en(on.into())
        })
    }

    fn set_roce_address(&self, index: u16, gid: &Gid, mac: [u8; 6]) -> Result<(), Mlx5Error> {
        let vlan = lock(&self.roce).vlan;
        let mut buf = vec![0u8; SetRoceAddressIn::<&[u8]>::SIZE_BYTES];
        {
            let mut v =
                SetRoceAddressIn::new_checked(&mut buf[..]).map_err(prm("SET_ROCE_ADDRESS"))?;
            v.set_roce_address_index(index.into())
                .map_err(prm("SET_ROCE_ADDRESS"))?;
            // K core/lib/gid.c:145-146: the port, when the function has
            // several vHCA ports (audit row 15).
            if self.general_caps()?.num_vhca_ports() > 0 {
                v.set_vhca_port_num(1).map_err(prm("SET_ROCE_ADDRESS"))?;
            }
            if *gid != Gid::ZERO {
                let mut a = v.roce_address_mut();
                (|| -> Result<(), rnic_mlx5_prm::Error> {
                    a.set_source_l3_address(gid.raw())?;
                    a.set_source_mac_47_32(u16::from_be_bytes([mac[0], mac[1]]).into())?;
                    a.set_source_mac_31_0(u32::from_be_bytes([mac[2], mac[3], mac[4], mac[5]]))?;
                    let l3 = if gid.to_ipv4().is_some() {
                        ROCE_L3_TYPE_IPV4
                    } else {
                        ROCE_L3_TYPE_IPV6
                    };
                    a.set_roce_l3_type(l3)?;
                    if let Some((vid, _)) = vlan {
                        a.set_vlan_valid(1)?;
                        a.set_vlan_id(vid.into())?;
                    }
                    a.set_roce_version(ROCE_VERSION_2)
                })()
                .map_err(prm("SET_ROCE_ADDRESS"))?;
            }
        }
        self.exec(
            CmdOpcode::SetRoceAddress,
            0,
            &buf,
            SetRoceAddressOut::<&[u8]>::SIZE_BYTES,
        )?;
        Ok(())
    }

    /// Program GID table entry `index` of port 1 with `ip` (RoCEv2,
    /// IPv4-mapped for IPv4; source MAC = the function's MAC). The first
    /// call reads the MAC and sets the vport's `roce_en` (§11a steps 2–3).
    /// The emulator serves RoCE on UDP/4791 at this address. Teardown
    /// clears every entry written and `roce_en`.
    pub fn set_gid(&self, index: u16, ip: IpAddr) -> Result<Gid, Mlx5Error> {
        // Audit row 9: RoCE only on an Ethernet port (RC mlx5_vfio.c:2220).
        let info = self.info();
        if info.port_type != crate::PortType::Ethernet {
            return Err(Mlx5Error::PortType {
                function: info.function,
                port_type: info.port_type,
            });
        }
        // Audit row 8: the table is as large as the RoCE cap says.
        let size = self.gid_table_len();
        if u32::from(index) >= size {
            return Err(Mlx5Error::GidIndex { index, size });
        }
        let mac = match self.mac() {
            Some(m) => m,
            None => {
                let m = self.query_mac()?;
                lock(&self.roce).mac = Some(m);
                m
            }
        };
        if !lock(&self.roce).roce_enabled {
            self.set_roce_en(true)?;
            lock(&self.roce).roce_enabled = true;
            self.mpfs_add(mac)?;
        }
        let gid = Gid::from_ip(ip);
        self.set_roce_address(index, &gid, mac)?;
        let old = lock(&self.roce).gids.insert(index, gid);
        info!(index, %ip, mac = ?mac, "SET_ROCE_ADDRESS");
        if let Some(r) = self.resolver() {
            if let Some(old) = old.filter(|o| *o != gid && !self.owns_gid_other(o, index)) {
                r.own_address(crate::firmware::neigh::gid_ip(&old), None);
            }
            r.own_address(ip, Some(mac));
        }
        Ok(gid)
    }

    /// An eswitch manager with an L2 (MPFS) table delivers unicast frames
    /// only to MACs in it; with no netdev, nobody else adds this function's
    /// (K core/lib/mpfs.c:98-136, from core/en_fs.c:588; audit row 16).
    /// Entry 0 of the table, removed at teardown.
    fn mpfs_add(&self, mac: [u8; 6]) -> Result<(), Mlx5Error> {
        let caps = self.general_caps()?;
        if caps.eswitch_manager() == 0 || caps.log_max_l2_table() == 0 {
            return Ok(());
        }
        let mut buf = vec![0u8; SetL2TableEntryIn::<&[u8]>::SIZE_BYTES];
        let mut word = [0u8; 8];
        word[2..].copy_from_slice(&mac);
        SetL2TableEntryIn::new_checked(&mut buf[..])
            .and_then(|mut v| {
                v.set_table_index(0)?;
                v.set_mac_address(u64::from_be_bytes(word))
            })
            .map_err(prm("SET_L2_TABLE_ENTRY"))?;
        self.exec(
            CmdOpcode::SetL2TableEntry,
            0,
            &buf,
            SetL2TableEntryOut::<&[u8]>::SIZE_BYTES,
        )?;
        lock(&self.roce).mpfs = Some(0);
        info!(mac = ?mac, "MPFS L2 table entry 0 set (eswitch manager)");
        Ok(())
    }

    /// Clear the GID entries and `roce_en` (teardown, before DEALLOC_PD).
    pub(crate) fn roce_teardown(&self) -> Result<(), Mlx5Error> {
        let (gids, enabled, mpfs) = {
            let mut r = lock(&self.roce);
            (
                std::mem::take(&mut r.gids),
                std::mem::take(&mut r.roce_enabled),
                r.mpfs.take(),
            )
        };
        let mut first = Ok(());
        if let Some(index) = mpfs {
            let mut buf = vec![0u8; DeleteL2TableEntryIn::<&[u8]>::SIZE_BYTES];
            let r = DeleteL2TableEntryIn::new_checked(&mut buf[..])
                .and_then(|mut v| v.set_table_index(index))
                .map_err(prm("DELETE_L2_TABLE_ENTRY"))
                .and_then(|()| {
                    self.exec(
                        CmdOpcode::DeleteL2TableEntry,
                        0,
                        &buf,
                        DeleteL2TableEntryOut::<&[u8]>::SIZE_BYTES,
                    )
                });
            if let Err(e) = r {
                warn!(index, %e, "removing the MPFS L2 table entry failed");
                first = Err(e);
            }
        }
        for g in gids.into_keys() {
            if let Err(e) = self.set_roce_address(g, &Gid::ZERO, [0; 6]) {
                warn!(index = g, %e, "clearing a GID entry failed");
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        let disabled = if enabled {
            self.set_roce_en(false)
        } else {
            Ok(())
        };
        first.and(disabled)
    }
}

static KEY_BYTE: AtomicU8 = AtomicU8::new(1);

/// The variant byte of the next key (`mkey_7_0`): 1..=255, never 0, so no
/// key can be `1 << 8 | 0` = 0x100, `MLX5_INVALID_LKEY` — the receive
/// terminator (§9.4) — whatever index the firmware hands out.
fn next_key_byte() -> u8 {
    loop {
        let b = KEY_BYTE.fetch_add(1, Ordering::Relaxed);
        if b != 0 {
            return b;
        }
    }
}

/// What an [`Mkey`] translates to.
enum MkeyMemory {
    /// A driver DMA buffer ([`Mkey::new`]).
    Buffer(Arc<DmaBuffer>),
    /// Application memory mapped in place ([`Mkey::new_user`]): the pages
    /// (`None` once [`Mkey::revoke`] unmapped them) and the memory the CPU
    /// reads inline sends from.
    User {
        pages: Mutex<Option<UserPages>>,
        memory: Arc<dyn Memory>,
    },
}

/// A memory key (CREATE_MKEY, MTT access mode) over a [`DmaBuffer`]
/// ([`Mkey::new`]) or over application memory mapped in place
/// ([`Mkey::new_user`]): the address space of SGEs and RETHs starts at
/// [`Mkey::addr`] (the buffer's host virtual address, or the address the
/// registration names), translated by the MTT to the IOVA pages. Dropping
/// it destroys the key, then the memory's device mapping goes (the buffer
/// lives as long as the key and any QP that [`crate::Qp::use_region`]d it;
/// application pages are unmapped right after the key is destroyed).
pub struct Mkey {
    hca: Arc<Hca>,
    index: u32,
    key: u32,
    addr: u64,
    len: usize,
    access: AccessFlags,
    /// DESTROY_MKEY has run ([`Mkey::revoke`] or drop).
    destroyed: Mutex<bool>,
    // Last: dropped after `Drop::drop` destroyed the key.
    memory: MkeyMemory,
}

impl fmt::Debug for Mkey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mkey")
            .field("key", &format_args!("{:#x}", self.key))
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.len)
            .field("access", &self.access)
            .field(
                "memory",
                &match self.memory {
                    MkeyMemory::Buffer(_) => "dma buffer",
                    MkeyMemory::User { .. } => "application memory",
                },
            )
            .finish()
    }
}

/// The MTT entries of a buffer: each 4 KiB page's IOVA | read | write (§6).
pub fn mtt_entries(iova: u64, len: usize) -> impl Iterator<Item = u64> {
    (0..len.div_ceil(MTT_PAGE_BYTES))
        .map(move |p| (iova + (p * MTT_PAGE_BYTES) as u64) | MTT_READ_ENABLE | MTT_WRITE_ENABLE)
}

impl Mkey {
    /// Register `buf` with `access` (local read always).
    pub fn new(
        hca: &Arc<Hca>,
        buf: Arc<DmaBuffer>,
        access: AccessFlags,
    ) -> Result<Mkey, Mlx5Error> {
        let (addr, len, iova) = (buf.as_ptr() as u64, buf.len(), buf.iova().get());
        Mkey::create(hca, addr, len, iova, access, MkeyMemory::Buffer(buf))
    }

    /// Register application memory in place: `memory` (its bytes at host
    /// address `host`, [`Memory::len`] long) is mapped for the function
    /// ([`crate::PciFunction::map_user`]) and the key's address space
    /// starts at `addr` — the host address itself for `ibv_reg_mr`, or
    /// another address with the same offset within a 4 KiB page
    /// (`ibv_reg_mr_iova2`). The caller keeps the bytes mapped until the
    /// key is revoked or dropped.
    pub fn new_user(
        hca: &Arc<Hca>,
        memory: Arc<dyn Memory>,
        host: usize,
        addr: u64,
        access: AccessFlags,
    ) -> Result<Mkey, Mlx5Error> {
        let len = memory.len();
        let f = hca.function();
        if addr & (MTT_PAGE_BYTES as u64 - 1) != host as u64 & (MTT_PAGE_BYTES as u64 - 1) {
            return Err(Mlx5Error::UserMemory {
                function: f.name().to_owned(),
                addr: host,
                len,
                problem: UserMemoryProblem::PageOffset {
                    addr: host,
                    va: addr,
                },
            });
        }
        let writes = access.intersects(
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC,
        );
        let pages = f.map_user(host, len, writes)?;
        // The IOVA of the page holding byte 0 (`pages` starts there): the
        // MTT lists pages from it, as the device translates `addr` rounded
        // down to its page.
        let iova = pages.iova().get();
        Mkey::create(
            hca,
            addr,
            len,
            iova,
            access,
            MkeyMemory::User {
                pages: Mutex::new(Some(pages)),
                memory,
            },
        )
    }

    /// CREATE_MKEY: `len` bytes from `addr`, the first (partial) page at
    /// IOVA `iova` rounded down to 4 KiB.
    fn create(
        hca: &Arc<Hca>,
        addr: u64,
        len: usize,
        iova: u64,
        access: AccessFlags,
        memory: MkeyMemory,
    ) -> Result<Mkey, Mlx5Error> {
        let lead = (addr & (MTT_PAGE_BYTES as u64 - 1)) as usize;
        let first = iova & !(MTT_PAGE_BYTES as u64 - 1);
        let pages = (lead + len).div_ceil(MTT_PAGE_BYTES).max(1);
        let octwords = pages.div_ceil(2);
        let key_byte = next_key_byte();
        let mut cmd = vec![0u8; CreateMkeyIn::<&[u8]>::SIZE_BYTES + 16 * octwords];
        {
            let mut v = CreateMkeyIn::new_checked(&mut cmd[..]).map_err(prm("CREATE_MKEY"))?;
            v.set_pg_access(1).map_err(prm("CREATE_MKEY"))?;
            v.set_translations_octword_actual_size(octwords as u32)
                .map_err(prm("CREATE_MKEY"))?;
            for (i, e) in mtt_entries(first, lead + len).enumerate() {
                v.set_klm_pas_mtt(2 * i, (e >> 32) as u32)
                    .map_err(prm("CREATE_MKEY mtt"))?;
                v.set_klm_pas_mtt(2 * i + 1, e as u32)
                    .map_err(prm("CREATE_MKEY mtt"))?;
            }
            let mut m = v.memory_key_mkey_entry_mut();
            (|| -> Result<(), rnic_mlx5_prm::Error> {
                m.set_access_mode_1_0(mkey_access_mode::MTT & 3)?;
                m.set_access_mode_4_2(mkey_access_mode::MTT >> 2)?;
                m.set_a(access.contains(AccessFlags::REMOTE_ATOMIC).into())?;
                m.set_rw(access.contains(AccessFlags::REMOTE_WRITE).into())?;
                m.set_rr(access.contains(AccessFlags::REMOTE_READ).into())?;
                m.set_lw(access.contains(AccessFlags::LOCAL_WRITE).into())?;
                m.set_lr(1)?;
                m.set_qpn(MKEY_QPN_UNBOUND)?;
                m.set_mkey_7_0(key_byte.into())?;
                m.set_length64(0)?;
                m.set_pd(hca.info().pd)?;
                m.set_start_addr(addr)?;
                m.set_len(len as u64)?;
                m.set_translations_octword_size(octwords as u32)?;
                m.set_log_page_size(MTT_PAGE_BYTES.trailing_zeros())
            })()
            .map_err(prm("CREATE_MKEY mkc"))?;
        }
        let out = hca.exec(
            CmdOpcode::CreateMkey,
            0,
            &cmd,
            CreateMkeyOut::<&[u8]>::SIZE_BYTES,
        )?;
        let index = CreateMkeyOut::new_checked(&out[..])
            .map_err(prm("CREATE_MKEY"))?
            .mkey_index();
        let key = (index << 8) | u32::from(key_byte);
        debug!(key = format_args!("{key:#x}"), pages, "CREATE_MKEY");
        Ok(Mkey {
            hca: hca.clone(),
            index,
            key,
            addr,
            len,
            access,
            destroyed: Mutex::new(false),
            memory,
        })
    }

    /// The local key.
    pub fn lkey(&self) -> Lkey {
        Lkey(self.key)
    }

    /// The remote key.
    pub fn rkey(&self) -> Rkey {
        Rkey(self.key)
    }

    /// The address of byte 0 in SGEs and RETHs.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The registered DMA buffer (`None` for application memory).
    pub fn buffer(&self) -> Option<&Arc<DmaBuffer>> {
        match &self.memory {
            MkeyMemory::Buffer(b) => Some(b),
            MkeyMemory::User { .. } => None,
        }
    }

    /// How many device mappings the application memory under this key
    /// took (`None` for a DMA buffer, `Some(0)` once revoked).
    pub fn user_pieces(&self) -> Option<usize> {
        match &self.memory {
            MkeyMemory::Buffer(_) => None,
            MkeyMemory::User { pages, .. } => Some(lock(pages).as_ref().map_or(0, |p| p.pieces())),
        }
    }

    /// The memory under the key as the CPU reaches it (byte 0 is the
    /// region's first byte): the DMA buffer, or the application's memory.
    pub fn memory(&self) -> &dyn Memory {
        match &self.memory {
            MkeyMemory::Buffer(b) => &**b,
            MkeyMemory::User { memory, .. } => &**memory,
        }
    }

    /// What inline sends read the region's bytes from.
    pub(crate) fn region_bytes(&self) -> RegionBytes {
        match &self.memory {
            MkeyMemory::Buffer(b) => RegionBytes::Buffer(b.clone()),
            MkeyMemory::User { memory, .. } => RegionBytes::Memory(memory.clone()),
        }
    }

    /// End the registration now, whoever still holds the key: DESTROY_MKEY
    /// (every later access through it fails at the device — a remote one
    /// with a remote access error, a local one with a local protection
    /// error), then, for application memory, the device mapping goes and
    /// the pages are given back (so the application may free them once
    /// this returns). A second call does nothing. If the command fails the
    /// key may still be live: the pages stay mapped and the error returns.
    pub fn revoke(&self) -> Result<(), Mlx5Error> {
        self.destroy()?;
        if let MkeyMemory::User { pages, .. } = &self.memory {
            drop(lock(pages).take());
        }
        Ok(())
    }

    /// DESTROY_MKEY unless it ran (or the function is fatal: then no
    /// command is sent, the firmware would not answer).
    fn destroy(&self) -> Result<(), Mlx5Error> {
        let mut destroyed = lock(&self.destroyed);
        if *destroyed || self.hca.is_fatal() {
            *destroyed = true;
            return Ok(());
        }
        let mut buf = vec![0u8; DestroyMkeyIn::<&[u8]>::SIZE_BYTES];
        DestroyMkeyIn::new_checked(&mut buf[..])
            .and_then(|mut v| v.set_mkey_index(self.index))
            .map_err(prm("DESTROY_MKEY"))?;
        self.hca.exec(
            CmdOpcode::DestroyMkey,
            0,
            &buf,
            DestroyMkeyOut::<&[u8]>::SIZE_BYTES,
        )?;
        *destroyed = true;
        Ok(())
    }
}

impl Drop for Mkey {
    fn drop(&mut self) {
        // The key goes first; the memory's device mapping (a field) after.
        if let Err(e) = self.destroy() {
            warn!(key = self.key, %e, "DESTROY_MKEY failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_key_byte_is_zero_so_no_key_is_the_invalid_lkey() {
        for _ in 0..600 {
            assert_ne!(next_key_byte(), 0);
        }
        assert_ne!(
            (1u32 << 8) | u32::from(next_key_byte()),
            rnic_mlx5_prm::INVALID_LKEY
        );
    }

    #[test]
    fn mtt_entries_are_page_iovas_with_read_and_write() {
        let e: Vec<u64> = mtt_entries(0x10_0000, 8192 + 1).collect();
        assert_eq!(e, vec![0x10_0003, 0x10_1003, 0x10_2003]);
    }

    #[test]
    fn ptys_link_modes_give_lanes_and_lane_rate() {
        assert_eq!(eth_link_mode(1 << 20), Some((4, 25_000)), "100GBASE-CR4");
        assert_eq!(eth_link_mode(1 << 27), Some((1, 25_000)), "25GBASE-CR");
        assert_eq!(eth_link_mode(1 << 6), Some((4, 10_000)), "40GBASE-CR4");
        assert_eq!(eth_link_mode(1 << 31), Some((2, 25_000)), "50GBASE-KR2");
        assert_eq!(eth_link_mode(0), None, "link down");
        assert_eq!(eth_link_mode(1 << 9), None, "a reserved bit");
    }
}
