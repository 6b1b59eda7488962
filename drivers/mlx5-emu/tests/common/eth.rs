//! The raw Ethernet test client: TD/TIS/SQ/RQ/TIR and flow table commands written with the
//! PRM views, raw send WQEs (control + Ethernet segment + data) rung at the UAR, receive
//! WQEs posted by the doorbell record, and the far end of a dgram wire (a UDP socket that
//! sends and receives whole frames). Independent of the driver.
#![allow(clippy::unwrap_used)]

use std::net::{SocketAddr, UdpSocket};

use super::hw::*;
use rnic_mlx5_emu::{PortStats, Wire};
use rnic_mlx5_prm::{
    AllocTransportDomainOut, CreateFlowGroupIn, CreateFlowGroupOut, CreateFlowTableIn,
    CreateFlowTableOut, CreateRqIn, CreateRqOut, CreateSqIn, CreateSqOut, CreateTirIn,
    CreateTirOut, CreateTisIn, CreateTisOut, FteMatchParam, ModifyNicVportContextIn, ModifyRqIn,
    ModifySqIn, QueryVportCounterOut, SetFlowTableRootIn, SetFteIn, WqState, WqeEthSeg,
    flow_action, flow_destination_type, inline_mode, match_criteria, wq_type,
};

/// A status and syndrome, or the object's number.
pub type Made = Result<u32, (u8, u32)>;

fn made(out: &[u8], f: impl Fn(&[u8]) -> u32) -> Made {
    match status(out) {
        (0, 0) => Ok(f(out)),
        s => Err(s),
    }
}

/// An options set for an emulator on a dgram wire from `local` to `remote`, MAC `mac`.
pub fn dgram_options(local: SocketAddr, remote: SocketAddr, mac: [u8; 6]) -> Options {
    Options {
        boot_delay: Duration::from_millis(1),
        firmware: FirmwareOptions {
            strictness: Strictness::legacy(),
            mac,
            ..Default::default()
        },
        wire: Wire::Dgram { local, remote },
        ..Options::default()
    }
}

/// The far end of a dgram wire: a UDP socket on 127.0.0.1.
pub struct Cable {
    pub sock: UdpSocket,
}

impl Cable {
    pub fn new() -> Cable {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        Cable { sock }
    }

    pub fn addr(&self) -> SocketAddr {
        self.sock.local_addr().unwrap()
    }

    /// Plug into the emulator's port (its bound address).
    pub fn plug(&self, port: SocketAddr) {
        self.sock.connect(port).unwrap();
    }

    pub fn send(&self, frame: &[u8]) {
        self.sock.send(frame).unwrap();
    }

    /// The next frame the port sent within 300 ms.
    pub fn recv(&self) -> Option<Vec<u8>> {
        let mut b = vec![0u8; 65536];
        match self.sock.recv(&mut b) {
            Ok(n) => Some(b[..n].to_vec()),
            Err(_) => None,
        }
    }
}

pub fn port_stats(hw: &Hw) -> PortStats {
    hw.r.emu.device().port_counters().snapshot()
}

/// Wait until `f(stats)` holds (5 s at most); the stats then.
pub fn wait_stats(hw: &Hw, f: impl Fn(&PortStats) -> bool) -> PortStats {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let s = port_stats(hw);
        if f(&s) || Instant::now() > deadline {
            return s;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// MODIFY_NIC_VPORT_CONTEXT `addresses_list`, MC: the group addresses the vport receives
/// (what a driver subscribes before broadcast or multicast reaches its flow table). The
/// command's status and syndrome.
pub fn subscribe(hw: &Hw, macs: &[[u8; 6]]) -> (u8, u32) {
    let mut c = cmd(
        CmdOpcode::ModifyNicVportContext,
        0,
        ModifyNicVportContextIn::<&[u8]>::SIZE_BYTES + 8 * macs.len(),
    );
    {
        let mut v = ModifyNicVportContextIn::new_unchecked(&mut c[..]);
        v.field_select_mut().set_addresses_list(1).unwrap();
        let mut x = v.nic_vport_context_mut();
        x.set_allowed_list_type(1).unwrap();
        x.set_allowed_list_size(macs.len() as u32).unwrap();
        for (i, m) in macs.iter().enumerate() {
            let mut e = [0u8; 8];
            e[2..].copy_from_slice(m);
            x.set_current_uc_mac_address(i, u64::from_be_bytes(e))
                .unwrap();
        }
    }
    let out = hw.r.exec(&c, OUT).out();
    status(&out)
}

/// Broadcast and the IPv6 all-nodes group.
pub const GROUPS: [[u8; 6]; 2] = [[0xff; 6], [0x33, 0x33, 0, 0, 0, 1]];

pub fn td(hw: &Hw) -> u32 {
    let out = hw.r.ok(&cmd(CmdOpcode::AllocTransportDomain, 0, 0x10), OUT);
    AllocTransportDomainOut::new_unchecked(&out[..]).transport_domain()
}

pub fn tis(hw: &Hw, td: u32) -> Made {
    let mut c = cmd(CmdOpcode::CreateTis, 0, CreateTisIn::<&[u8]>::SIZE_BYTES);
    CreateTisIn::new_unchecked(&mut c[..])
        .ctx_mut()
        .set_transport_domain(td)
        .unwrap();
    let out = hw.r.exec(&c, OUT).out();
    made(&out, |o| CreateTisOut::new_unchecked(o).tisn())
}

pub fn tir(hw: &Hw, td: u32, rqn: u32, self_lb: u32) -> Made {
    let mut c = cmd(CmdOpcode::CreateTir, 0, CreateTirIn::<&[u8]>::SIZE_BYTES);
    let mut v = CreateTirIn::new_unchecked(&mut c[..]);
    let mut t = v.ctx_mut();
    t.set_transport_domain(td).unwrap();
    t.set_inline_rqn(rqn).unwrap();
    t.set_self_lb_block(self_lb).unwrap();
    let out = hw.r.exec(&c, OUT).out();
    made(&out, |o| CreateTirOut::new_unchecked(o).tirn())
}

/// A DESTROY_* / DEALLOC_* of object `n` (its number at 0x08): (status, syndrome).
pub fn destroy(hw: &Hw, op: CmdOpcode, n: u32) -> (u8, u32) {
    let mut c = cmd(op, 0, 0x10);
    c[0x09..0x0c].copy_from_slice(&n.to_be_bytes()[1..]);
    status(&hw.r.exec(&c, OUT).out())
}

/// A raw Ethernet SQ: 64 WQEBBs.
pub struct RawSq {
    pub sqn: u32,
    pub ring: Arc<DmaBuffer>,
    pub dbr: Arc<DmaBuffer>,
    pub pi: u16,
    /// Frame bytes are gathered from here (MKey `lkey`, VA = IOVA offset 0).
    pub data: Arc<DmaBuffer>,
    pub lkey: u32,
}

pub const SQ_LOG: u32 = 6;

/// CREATE_SQ with `tweak` on the context (its `wq` set up over a fresh ring).
pub fn try_sq(
    hw: &mut Hw,
    cqn: u32,
    tisn: u32,
    tweak: impl FnOnce(&mut rnic_mlx5_prm::Sqc<&mut [u8]>),
) -> Result<RawSq, (u8, u32)> {
    let ring = hw.buf(64 << SQ_LOG);
    let dbr = hw.buf(4096);
    let data = hw.buf(16 * 4096);
    let lkey = hw.mkey(&data, 0x10_0000, &["lw"]);
    let mut c = cmd(CmdOpcode::CreateSq, 0, CreateSqIn::<&[u8]>::SIZE_BYTES + 8);
    let mut v = CreateSqIn::new_unchecked(&mut c[..]);
    let mut s = v.ctx_mut();
    s.set_cqn(cqn).unwrap();
    s.set_tis_lst_sz(1).unwrap();
    s.set_tis_num_0(tisn).unwrap();
    s.set_min_wqe_inline_mode(inline_mode::L2).unwrap();
    s.set_user_index(0x55).unwrap();
    {
        let mut w = s.wq_mut();
        w.set_wq_type(wq_type::CYCLIC).unwrap();
        w.set_pd(hw.pd).unwrap();
        w.set_uar_page(hw.uar).unwrap();
        w.set_dbr_addr(dbr.iova().0).unwrap();
        w.set_log_wq_stride(6).unwrap();
        w.set_log_wq_sz(SQ_LOG).unwrap();
        w.set_pas(0, ring.iova().0).unwrap();
    }
    tweak(&mut s);
    let out = hw.r.exec(&c, OUT).out();
    let sqn = made(&out, |o| CreateSqOut::new_unchecked(o).sqn())?;
    Ok(RawSq {
        sqn,
        ring,
        dbr,
        pi: 0,
        data,
        lkey,
    })
}

pub fn modify_sq(hw: &Hw, sqn: u32, from: WqState, to: WqState) -> (u8, u32) {
    let mut c = cmd(CmdOpcode::ModifySq, 0, ModifySqIn::<&[u8]>::SIZE_BYTES);
    let mut v = ModifySqIn::new_unchecked(&mut c[..]);
    v.set_sqn(sqn).unwrap();
    v.set_sq_state(u32::from(from.as_raw())).unwrap();
    v.ctx_mut().set_state(u32::from(to.as_raw())).unwrap();
    status(&hw.r.exec(&c, OUT).out())
}

impl RawSq {
    /// A ready SQ.
    pub fn new(hw: &mut Hw, cqn: u32, tisn: u32) -> RawSq {
        let sq = try_sq(hw, cqn, tisn, |_| {}).expect("CREATE_SQ");
        assert_eq!(modify_sq(hw, sq.sqn, WqState::Rst, WqState::Rdy), (0, 0));
        sq
    }

    /// Post `frame` (its first `inline` bytes inline in the Ethernet segment, the rest from
    /// a data segment) with checksum flags `cs`, signaled; ring. The WQE index.
    pub fn send(&mut self, hw: &Hw, frame: &[u8], inline: usize, cs: u32) -> u16 {
        let idx = self.pi;
        let inline = inline.min(frame.len());
        let rest = &frame[inline..];
        let inl_units = if inline > 2 {
            (inline - 2).div_ceil(16)
        } else {
            0
        };
        let ds = 2 + inl_units + usize::from(!rest.is_empty());
        let mut w = vec![0u8; ds.div_ceil(4) * 64];
        w[0..4].copy_from_slice(
            &((u32::from(idx) << 8) | u32::from(WqeOpcode::Send.as_raw())).to_be_bytes(),
        );
        w[4..8].copy_from_slice(&((self.sqn << 8) | ds as u32).to_be_bytes());
        w[11] = 2 << 2;
        {
            let mut e = WqeEthSeg::new_unchecked(&mut w[16..32]);
            e.set_cs_flags(cs).unwrap();
            e.set_inline_hdr_sz(inline as u32).unwrap();
        }
        w[30..30 + inline].copy_from_slice(&frame[..inline]);
        if !rest.is_empty() {
            let off = 4096 * (usize::from(idx) % 16);
            self.data.write(off, rest).unwrap();
            let at = 32 + 16 * inl_units;
            w[at..at + 16].copy_from_slice(&data_seg(
                rest.len() as u32,
                self.lkey,
                0x10_0000 + off as u64,
            ));
        }
        let nbb = w.len() / 64;
        for (k, bb) in w.chunks(64).enumerate() {
            let slot = (usize::from(idx) + k) & ((1 << SQ_LOG) - 1);
            self.ring.write(slot * 64, bb).unwrap();
        }
        self.pi = self.pi.wrapping_add(nbb as u16);
        std::sync::atomic::fence(Ordering::SeqCst);
        self.dbr
            .write(4, &u32::from(self.pi).to_be_bytes())
            .unwrap();
        std::sync::atomic::fence(Ordering::SeqCst);
        hw.uar_write64(0x800, u64::from_be_bytes(w[..8].try_into().unwrap()));
        idx
    }
}

/// A raw Ethernet RQ: 64 WQEs of one 2 KiB buffer each (stride 32: a data segment and a
/// terminator).
pub struct RawRq {
    pub rqn: u32,
    pub ring: Arc<DmaBuffer>,
    pub dbr: Arc<DmaBuffer>,
    pub pi: u16,
    pub bufs: Arc<DmaBuffer>,
    pub lkey: u32,
}

pub const RQ_LOG: u32 = 6;
pub const RQ_BUF: usize = 2048;

pub fn try_rq(
    hw: &mut Hw,
    cqn: u32,
    tweak: impl FnOnce(&mut rnic_mlx5_prm::Rqc<&mut [u8]>),
) -> Result<RawRq, (u8, u32)> {
    let ring = hw.buf(32 << RQ_LOG);
    let dbr = hw.buf(4096);
    let bufs = hw.buf(RQ_BUF << RQ_LOG);
    let lkey = hw.mkey(&bufs, 0x2000_0000, &["lw"]);
    let mut c = cmd(CmdOpcode::CreateRq, 0, CreateRqIn::<&[u8]>::SIZE_BYTES + 8);
    let mut v = CreateRqIn::new_unchecked(&mut c[..]);
    let mut r = v.ctx_mut();
    r.set_cqn(cqn).unwrap();
    r.set_vsd(1).unwrap();
    r.set_user_index(0x66).unwrap();
    {
        let mut w = r.wq_mut();
        w.set_wq_type(wq_type::CYCLIC).unwrap();
        w.set_pd(hw.pd).unwrap();
        w.set_dbr_addr(dbr.iova().0).unwrap();
        w.set_log_wq_stride(5).unwrap();
        w.set_log_wq_sz(RQ_LOG).unwrap();
        w.set_pas(0, ring.iova().0).unwrap();
    }
    tweak(&mut r);
    let out = hw.r.exec(&c, OUT).out();
    let rqn = made(&out, |o| CreateRqOut::new_unchecked(o).rqn())?;
    Ok(RawRq {
        rqn,
        ring,
        dbr,
        pi: 0,
        bufs,
        lkey,
    })
}

pub fn modify_rq(hw: &Hw, rqn: u32, from: WqState, to: WqState) -> (u8, u32) {
    let mut c = cmd(CmdOpcode::ModifyRq, 0, ModifyRqIn::<&[u8]>::SIZE_BYTES);
    let mut v = ModifyRqIn::new_unchecked(&mut c[..]);
    v.set_rqn(rqn).unwrap();
    v.set_rq_state(u32::from(from.as_raw())).unwrap();
    v.ctx_mut().set_state(u32::from(to.as_raw())).unwrap();
    status(&hw.r.exec(&c, OUT).out())
}

impl RawRq {
    pub fn new(hw: &mut Hw, cqn: u32) -> RawRq {
        let rq = try_rq(hw, cqn, |_| {}).expect("CREATE_RQ");
        assert_eq!(modify_rq(hw, rq.rqn, WqState::Rst, WqState::Rdy), (0, 0));
        rq
    }

    /// Post `n` receive WQEs (buffer i of 2 KiB each).
    pub fn post(&mut self, n: usize) {
        for _ in 0..n {
            let slot = usize::from(self.pi) & ((1 << RQ_LOG) - 1);
            let mut w = [0u8; 32];
            w[..16].copy_from_slice(&data_seg(
                RQ_BUF as u32,
                self.lkey,
                0x2000_0000 + (slot * RQ_BUF) as u64,
            ));
            w[16..].copy_from_slice(&data_seg(0, 0x100, 0));
            self.ring.write(slot * 32, &w).unwrap();
            self.pi = self.pi.wrapping_add(1);
        }
        std::sync::atomic::fence(Ordering::SeqCst);
        self.dbr
            .write(0, &u32::from(self.pi).to_be_bytes())
            .unwrap();
    }

    /// The bytes WQE `idx`'s buffer holds.
    pub fn bytes(&self, idx: u16, len: usize) -> Vec<u8> {
        let slot = usize::from(idx) & ((1 << RQ_LOG) - 1);
        let mut b = vec![0u8; len];
        self.bufs.read(slot * RQ_BUF, &mut b).unwrap();
        b
    }
}

pub fn flow_table(
    hw: &Hw,
    level: u32,
    log_size: u32,
    tweak: impl FnOnce(&mut CreateFlowTableIn<&mut [u8]>),
) -> Made {
    let mut c = cmd(
        CmdOpcode::CreateFlowTable,
        0,
        CreateFlowTableIn::<&[u8]>::SIZE_BYTES,
    );
    let mut v = CreateFlowTableIn::new_unchecked(&mut c[..]);
    v.flow_table_context_mut().set_level(level).unwrap();
    v.flow_table_context_mut().set_log_size(log_size).unwrap();
    tweak(&mut v);
    let out = hw.r.exec(&c, OUT).out();
    made(&out, |o| CreateFlowTableOut::new_unchecked(o).table_id())
}

/// CREATE_FLOW_GROUP of `start..=end` enabling `enable`, the mask set by `mask`.
pub fn flow_group(
    hw: &Hw,
    table: u32,
    (start, end): (u32, u32),
    enable: u32,
    mask: impl FnOnce(&mut FteMatchParam<&mut [u8]>),
) -> Made {
    let mut c = cmd(
        CmdOpcode::CreateFlowGroup,
        0,
        CreateFlowGroupIn::<&[u8]>::SIZE_BYTES,
    );
    let mut v = CreateFlowGroupIn::new_unchecked(&mut c[..]);
    v.set_table_id(table).unwrap();
    v.set_start_flow_index(start).unwrap();
    v.set_end_flow_index(end).unwrap();
    v.set_match_criteria_enable(enable).unwrap();
    mask(&mut v.match_criteria_mut());
    let out = hw.r.exec(&c, OUT).out();
    made(&out, |o| CreateFlowGroupOut::new_unchecked(o).group_id())
}

/// SET_FLOW_TABLE_ENTRY `index` in `group` forwarding to TIRs `tirs` (DROP when empty), the
/// match value set by `value`.
pub fn flow_entry(
    hw: &Hw,
    (table, group, index): (u32, u32, u32),
    tirs: &[u32],
    value: impl FnOnce(&mut FteMatchParam<&mut [u8]>),
) -> (u8, u32) {
    let mut c = cmd(
        CmdOpcode::SetFlowTableEntry,
        0,
        SetFteIn::<&[u8]>::SIZE_BYTES + 16 * tirs.len(),
    );
    let mut v = SetFteIn::new_unchecked(&mut c[..]);
    v.set_table_id(table).unwrap();
    v.set_flow_index(index).unwrap();
    let mut fc = v.flow_context_mut();
    fc.set_group_id(group).unwrap();
    fc.set_flow_tag(0xabc).unwrap();
    if tirs.is_empty() {
        fc.set_action(flow_action::DROP).unwrap();
    } else {
        fc.set_action(flow_action::FWD_DEST).unwrap();
        fc.set_destination_list_size(tirs.len() as u32).unwrap();
    }
    value(&mut fc.match_value_mut());
    for (i, t) in tirs.iter().enumerate() {
        let mut d = fc.destination_mut(i).unwrap();
        let mut e = d.destination_entry_mut();
        e.set_destination_type(flow_destination_type::TIR).unwrap();
        e.set_destination_id(*t).unwrap();
    }
    status(&hw.r.exec(&c, OUT).out())
}

pub fn set_root(hw: &Hw, table: u32) -> (u8, u32) {
    let mut c = cmd(
        CmdOpcode::SetFlowTableRoot,
        0,
        SetFlowTableRootIn::<&[u8]>::SIZE_BYTES,
    );
    SetFlowTableRootIn::new_unchecked(&mut c[..])
        .set_table_id(table)
        .unwrap();
    status(&hw.r.exec(&c, OUT).out())
}

/// DESTROY_FLOW_TABLE / DESTROY_FLOW_GROUP / DELETE_FLOW_TABLE_ENTRY: (status, syndrome).
pub fn flow_destroy(hw: &Hw, op: CmdOpcode, table: u32, second: u32) -> (u8, u32) {
    let mut c = cmd(op, 0, 0x40);
    c[0x15..0x18].copy_from_slice(&table.to_be_bytes()[1..]);
    match op {
        CmdOpcode::DestroyFlowGroup => c[0x18..0x1c].copy_from_slice(&second.to_be_bytes()),
        CmdOpcode::DeleteFlowTableEntry => c[0x20..0x24].copy_from_slice(&second.to_be_bytes()),
        _ => {}
    }
    status(&hw.r.exec(&c, OUT).out())
}

/// An ethertype-only group (`start..=end`) and the outer-header criteria it needs.
pub fn ethertype_group(hw: &Hw, table: u32, range: (u32, u32)) -> Made {
    flow_group(hw, table, range, match_criteria::OUTER_HEADERS, |m| {
        m.outer_headers_mut().set_ethertype(0xffff).unwrap()
    })
}

/// QUERY_VPORT_COUNTER (clearing when `clear`): the output.
pub fn vport_counters(hw: &Hw, clear: bool) -> Vec<u8> {
    let mut c = cmd(CmdOpcode::QueryVportCounter, 0, 0x20);
    c[0x18] = u8::from(clear) << 7;
    hw.r.ok(&c, QueryVportCounterOut::<&[u8]>::SIZE_BYTES)
}

/// An Ethernet frame: `dst`, `src`, `ethertype`, `payload`.
pub fn frame(dst: [u8; 6], src: [u8; 6], ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = dst.to_vec();
    f.extend_from_slice(&src);
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// An ARP request for `target` from `sender` (42 bytes, unpadded).
pub fn arp_request(smac: [u8; 6], sender: [u8; 4], target: [u8; 4]) -> Vec<u8> {
    let mut p = vec![0, 1, 8, 0, 6, 4, 0, 1];
    p.extend_from_slice(&smac);
    p.extend_from_slice(&sender);
    p.extend_from_slice(&[0; 6]);
    p.extend_from_slice(&target);
    frame([0xff; 6], smac, 0x0806, &p)
}

/// An IPv6 neighbour solicitation for `target` (last 3 bytes into the solicited-node group)
/// from `src`, ICMPv6 checksum 0 (the port does not check it for steering).
pub fn neighbour_solicitation(smac: [u8; 6], src: [u8; 16], target: [u8; 16]) -> Vec<u8> {
    let dst_mac = [0x33, 0x33, 0xff, target[13], target[14], target[15]];
    let mut group = [0u8; 16];
    group[..2].copy_from_slice(&[0xff, 0x02]);
    group[11] = 1;
    group[12] = 0xff;
    group[13..].copy_from_slice(&target[13..]);
    let mut icmp = vec![135, 0, 0, 0, 0, 0, 0, 0];
    icmp.extend_from_slice(&target);
    icmp.extend_from_slice(&[1, 1]);
    icmp.extend_from_slice(&smac);
    let mut ip = vec![0x60, 0, 0, 0];
    ip.extend_from_slice(&(icmp.len() as u16).to_be_bytes());
    ip.extend_from_slice(&[58, 255]);
    ip.extend_from_slice(&src);
    ip.extend_from_slice(&group);
    ip.extend_from_slice(&icmp);
    frame(dst_mac, smac, 0x86dd, &ip)
}

/// An IPv4/UDP frame `src` → `dst` with `payload` (checksums left 0).
pub fn udp4(
    dmac: [u8; 6],
    smac: [u8; 6],
    (src, dst): ([u8; 4], [u8; 4]),
    dport: u16,
    payload: &[u8],
) -> Vec<u8> {
    let mut ip = vec![0x45, 0];
    ip.extend_from_slice(&((28 + payload.len()) as u16).to_be_bytes());
    ip.extend_from_slice(&[0, 0, 0x40, 0, 64, 17, 0, 0]);
    ip.extend_from_slice(&src);
    ip.extend_from_slice(&dst);
    ip.extend_from_slice(&0x1234u16.to_be_bytes());
    ip.extend_from_slice(&dport.to_be_bytes());
    ip.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    ip.extend_from_slice(&[0, 0]);
    ip.extend_from_slice(payload);
    frame(dmac, smac, 0x0800, &ip)
}
