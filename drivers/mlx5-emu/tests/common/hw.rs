//! The HCA tests' rig: bring-up to INIT_HCA with RoCE on, EQ/CQ/MKey/QP creation with
//! the PRM views, WQEs written into the SQ ring and rung at the UAR, CQE polling by owner
//! parity, and an rnic-rxe peer. Independent of the driver's data path.
#![allow(clippy::unwrap_used)]
// The re-exports below serve several test binaries, each using a subset.
#![allow(unused_imports)]

pub use std::net::{IpAddr, Ipv4Addr};
pub use std::sync::Arc;
pub use std::sync::atomic::{AtomicU32, Ordering};
pub use std::time::{Duration, Instant};

pub use super::{Rig, cmd, status};
pub use rnic_core::{
    AccessFlags, CompletionQueue, Context, HeapMemory, InitParams, Memory, MemoryRegion, Mtu,
    ProtectionDomain, Psn, QpCaps, QpInitAttr, QpType, QueuePair, RtrParams, RtsParams, SendFlags,
    SendOp, SendWr, Sge, WcStatus, WorkCompletion,
};
pub use rnic_mlx5::{DmaBuffer, PciFunction, Vector};
pub use rnic_mlx5_emu::firmware::syndrome as syn;
pub use rnic_mlx5_emu::{FirmwareOptions, Options, Phase, Strictness};
pub use rnic_mlx5_prm::{
    AllocPdOut, AllocUarOut, CmdOpcode, CmdStatus, Cqe64, CqeOpcode, CqeSyndrome, CreateCqIn,
    CreateCqOut, CreateEqIn, CreateEqOut, CreateMkeyIn, CreateMkeyOut, CreateQpIn, CreateQpOut,
    Eqe, ErrCqe, EventType, ManagePagesIn, ModifyNicVportContextIn, QpServiceType, QueryPagesOut,
    QueryQpOut, RoceCap, Rst2initQpIn, SetIssiIn, SetRoceAddressIn, WqeOpcode, cap_type,
    create_mkey_in, manage_pages_op_mod, query_hca_cap_out, query_pages_op_mod,
};

pub const OUT: usize = 0x10;
pub const MAC: [u8; 6] = [0x02, 0x00, 0x15, 0xb3, 0x10, 0x17];
pub const ALL: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

/// A fresh pair of loopback addresses per test (127.<pid>.<n>.1 / .2).
pub fn ip_pair() -> (IpAddr, IpAddr) {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let b = 30 + (std::process::id() % 200) as u8;
    let c = (n % 250) as u8;
    (
        IpAddr::V4(Ipv4Addr::new(127, b, c, 1)),
        IpAddr::V4(Ipv4Addr::new(127, b, c, 2)),
    )
}

pub fn give(r: &Rig, pages: &[u64]) {
    r.ok(&give_cmd(pages), OUT);
}

/// MANAGE_PAGES give of `pages`.
pub fn give_cmd(pages: &[u64]) -> Vec<u8> {
    let mut c = cmd(
        CmdOpcode::ManagePages,
        manage_pages_op_mod::GIVE,
        0x10 + 8 * pages.len(),
    );
    let mut v = ManagePagesIn::new_unchecked(&mut c[..]);
    v.set_input_num_entries(pages.len() as u32).unwrap();
    for (i, p) in pages.iter().enumerate() {
        v.set_pas(i, *p).unwrap();
    }
    c
}

pub fn query_pages(r: &Rig, op_mod: u32) -> i32 {
    let out = r.ok(&cmd(CmdOpcode::QueryPages, op_mod, 0x10), OUT);
    QueryPagesOut::new_unchecked(&out[..]).num_pages() as i32
}

/// The function up to INIT_HCA with RoCE on, the RoCE source-port cap enabled, a UAR and
/// a PD, and four MSI-X vectors.
///
/// Fields drop in declaration order: buffers and vectors before the rig, whose client then
/// disconnects before its emulator stops (a connected client costs a 2 s shutdown wait).
pub struct Hw {
    pub pages: Arc<DmaBuffer>,
    pub uar: u32,
    pub pd: u32,
    pub vectors: Vec<Vector>,
    pub bufs: Vec<Arc<DmaBuffer>>,
    pub r: Rig,
}

impl Hw {
    /// [`Rig::new`]'s firmware (issue 26's strictness off; see there).
    pub fn new() -> Hw {
        Hw::with(legacy())
    }

    /// [`Hw::new`] on a firmware configured with `options`. With the `page-requests` check
    /// on, 16 spare pages are given after INIT_HCA, so the rig's objects are charged without
    /// page requests (`Hw::with_spares(options, 0)` for a rig that gives none).
    pub fn with(options: Options) -> Hw {
        let spares = if options.firmware.strictness.page_requests {
            16
        } else {
            0
        };
        Hw::with_spares(options, spares)
    }

    /// [`Hw::with`] giving `spares` pages beyond boot + init after INIT_HCA.
    pub fn with_spares(options: Options, spares: usize) -> Hw {
        let r = Rig::with(options);
        let pages = self::boot(&r);
        let addr = |i: usize| pages.iter_page(i);
        let boot = r.fw().accounting().pages_held;
        let q = cmd(CmdOpcode::QueryHcaCap, (cap_type::ROCE << 1) | 1, 0x10);
        let out = r.ok(&q, 0x1010);
        let mut roce = out[query_hca_cap_out::cmd_hca_cap.byte_offset()..].to_vec();
        RoceCap::new_unchecked(&mut roce[..])
            .set_sw_r_roce_src_udp_port(1)
            .unwrap();
        // The structure only (0x100 bytes), the rest of the area zero, as K and RC send it.
        let mut set = cmd(CmdOpcode::SetHcaCap, cap_type::ROCE << 1, 0x1010);
        set[0x10..0x110].copy_from_slice(&roce[..0x100]);
        r.ok(&set, OUT);
        let init = query_pages(&r, query_pages_op_mod::INIT) as usize;
        give(&r, &(boot..boot + init).map(addr).collect::<Vec<_>>());
        r.ok(&cmd(CmdOpcode::InitHca, 0, 0x20), OUT);
        let given = boot + init;
        if spares > 0 {
            give(&r, &(given..given + spares).map(addr).collect::<Vec<_>>());
        }
        let mut m = cmd(CmdOpcode::ModifyNicVportContext, 0, 0x200);
        let mut v = ModifyNicVportContextIn::new_unchecked(&mut m[..]);
        v.field_select_mut().set_roce_en(1).unwrap();
        v.nic_vport_context_mut().set_roce_en(1).unwrap();
        r.ok(&m, OUT);
        let out = r.ok(&cmd(CmdOpcode::AllocUar, 0, 0x10), OUT);
        let uar = AllocUarOut::new_unchecked(&out[..]).uar();
        let out = r.ok(&cmd(CmdOpcode::AllocPd, 0, 0x10), OUT);
        let pd = AllocPdOut::new_unchecked(&out[..]).pd();
        let vectors = r.f.enable_msix(4).unwrap();
        Hw {
            r,
            pages,
            uar,
            pd,
            vectors,
            bufs: Vec::new(),
        }
    }

    pub fn buf(&mut self, len: usize) -> Arc<DmaBuffer> {
        let b = self.r.f.alloc_dma(len).unwrap();
        self.bufs.push(b.clone());
        b
    }

    pub fn uar_write64(&self, off: usize, v: u64) {
        self.r.f.uar(self.uar).unwrap().write64_be(off, v).unwrap();
    }

    pub fn uar_write32(&self, off: usize, v: u32) {
        self.r.f.uar(self.uar).unwrap().write32_be(off, v).unwrap();
    }

    /// SET_ROCE_ADDRESS index `idx` = `ip` (RoCE v2).
    pub fn set_gid(&self, idx: u32, ip: IpAddr) -> (u8, u32) {
        self.set_gid_with(idx, ip, MAC, 2)
    }

    pub fn set_gid_with(&self, idx: u32, ip: IpAddr, mac: [u8; 6], version: u32) -> (u8, u32) {
        let mut c = cmd(CmdOpcode::SetRoceAddress, 0, 0x30);
        let mut v = SetRoceAddressIn::new_unchecked(&mut c[..]);
        v.set_roce_address_index(idx).unwrap();
        let mut l = v.roce_address_mut();
        l.set_source_l3_address(&gid_of(ip)).unwrap();
        l.set_source_mac_47_32(u32::from(u16::from_be_bytes([mac[0], mac[1]])))
            .unwrap();
        l.set_source_mac_31_0(u32::from_be_bytes([mac[2], mac[3], mac[4], mac[5]]))
            .unwrap();
        l.set_roce_version(version).unwrap();
        l.set_roce_l3_type(u32::from(ip.is_ipv6())).unwrap();
        status(&self.r.exec(&c, OUT).out())
    }

    /// CREATE_EQ of 2^log entries (owner bytes 1) on `vector` with `mask`.
    pub fn eq(&mut self, log: u32, vector: u32, mask: u64) -> (u32, Arc<DmaBuffer>) {
        let bytes = (64usize << log).max(4096);
        let b = self.buf(bytes);
        for i in 0..(1usize << log) {
            b.write(i * 64 + 63, &[1]).unwrap();
        }
        let np = bytes / 4096;
        let mut c = cmd(CmdOpcode::CreateEq, 0, 0x110 + 8 * np);
        let mut v = CreateEqIn::new_unchecked(&mut c[..]);
        let mut e = v.eq_context_entry_mut();
        e.set_log_eq_size(log).unwrap();
        e.set_uar_page(self.uar).unwrap();
        e.set_intr(vector).unwrap();
        v.set_event_bitmask(0, mask).unwrap();
        for p in 0..np {
            v.set_pas(p, b.iova().0 + (p * 4096) as u64).unwrap();
        }
        let out = self.r.ok(&c, OUT);
        (CreateEqOut::new_unchecked(&out[..]).eq_number(), b)
    }

    /// CREATE_CQ of 64 CQEs on `eqn`: (cqn, ring, doorbell record).
    pub fn cq(&mut self, eqn: u32) -> Cq {
        self.cq_with(eqn, false)
    }

    /// [`Hw::cq`] with `cqc.oi` (overrun ignore) as given.
    pub fn cq_with(&mut self, eqn: u32, oi: bool) -> Cq {
        let ring = self.buf(4096);
        for i in 0..64 {
            ring.write(i * 64 + 63, &[0xf0]).unwrap();
        }
        let dbr = self.buf(4096);
        let mut c = cmd(CmdOpcode::CreateCq, 0, 0x118);
        let mut v = CreateCqIn::new_unchecked(&mut c[..]);
        let mut x = v.cq_context_mut();
        x.set_log_cq_size(6).unwrap();
        x.set_uar_page(self.uar).unwrap();
        x.set_c_eqn_or_apu_element(eqn).unwrap();
        x.set_dbr_addr(dbr.iova().0).unwrap();
        x.set_oi(u32::from(oi)).unwrap();
        v.set_pas(0, ring.iova().0).unwrap();
        let out = self.r.ok(&c, OUT);
        Cq {
            cqn: CreateCqOut::new_unchecked(&out[..]).cqn(),
            ring,
            dbr,
            ci: 0,
        }
    }

    /// CREATE_MKEY in MTT mode over `buf` at virtual address `va`, key byte 0x5a.
    pub fn mkey(&self, buf: &DmaBuffer, va: u64, access: &[&str]) -> u32 {
        let np = buf.len() / 4096;
        let mut c = cmd(CmdOpcode::CreateMkey, 0, 0x110 + 8 * np.next_multiple_of(2));
        let mut v = CreateMkeyIn::new_unchecked(&mut c[..]);
        v.set_translations_octword_actual_size(np.div_ceil(2) as u32)
            .unwrap();
        let mut m = v.memory_key_mkey_entry_mut();
        m.set_access_mode_1_0(1).unwrap();
        m.set_lr(1).unwrap();
        for a in access {
            match *a {
                "lw" => m.set_lw(1).unwrap(),
                "rr" => m.set_rr(1).unwrap(),
                "rw" => m.set_rw(1).unwrap(),
                "a" => m.set_a(1).unwrap(),
                _ => unreachable!(),
            }
        }
        m.set_qpn(0xff_ffff).unwrap();
        m.set_mkey_7_0(0x5a).unwrap();
        m.set_pd(self.pd).unwrap();
        m.set_start_addr(va).unwrap();
        m.set_len(buf.len() as u64).unwrap();
        m.set_translations_octword_size(np.div_ceil(2) as u32)
            .unwrap();
        m.set_log_page_size(12).unwrap();
        let at = create_mkey_in::klm_pas_mtt.byte_offset();
        for p in 0..np {
            let e = (buf.iova().0 + (p * 4096) as u64) | 3;
            c[at + 8 * p..at + 8 * p + 8].copy_from_slice(&e.to_be_bytes());
        }
        let out = self.r.ok(&c, OUT);
        (CreateMkeyOut::new_unchecked(&out[..]).mkey_index() << 8) | 0x5a
    }
}

pub trait PageAddr {
    fn iter_page(&self, i: usize) -> u64;
}

impl PageAddr for Arc<DmaBuffer> {
    fn iter_page(&self, i: usize) -> u64 {
        self.iova().0 + (i * 4096) as u64
    }
}

pub struct Cq {
    pub cqn: u32,
    pub ring: Arc<DmaBuffer>,
    pub dbr: Arc<DmaBuffer>,
    pub ci: u32,
}

impl Cq {
    /// Poll one CQE (owner parity, opcode != 0xF) within `wait`; advances set_ci.
    pub fn poll(&mut self, wait: Duration) -> Option<[u8; 64]> {
        let deadline = Instant::now() + wait;
        loop {
            let mut e = [0u8; 64];
            let slot = (self.ci & 63) as usize;
            self.ring.read(slot * 64, &mut e).unwrap();
            let op = e[63] >> 4;
            if op != 0xf && u32::from(e[63] & 1) == (self.ci >> 6) & 1 {
                std::sync::atomic::fence(Ordering::Acquire);
                self.ring.read(slot * 64, &mut e).unwrap();
                self.ci += 1;
                self.dbr
                    .write(0, &(self.ci & 0xff_ffff).to_be_bytes())
                    .unwrap();
                return Some(e);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    pub fn expect(&mut self) -> [u8; 64] {
        self.poll(Duration::from_secs(10))
            .expect("no CQE within 10 s")
    }
}

/// The next EQE of a ring of 2^log entries after `ci` EQEs, if its owner bit says so.
pub fn eqe(ring: &DmaBuffer, log: u32, ci: u32) -> Option<[u8; 64]> {
    let mut e = [0u8; 64];
    ring.read(((ci & ((1 << log) - 1)) * 64) as usize, &mut e)
        .unwrap();
    (u32::from(e[63] & 1) == (ci >> log) & 1).then_some(e)
}

/// [`eqe`] within 5 s. The firmware hands a command's output back (the ownership bit)
/// before it writes that command's completion EQE: a test that saw the command complete
/// waits for the EQE rather than reading its slot at once.
pub fn wait_eqe(ring: &DmaBuffer, log: u32, ci: u32) -> [u8; 64] {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(e) = eqe(ring, log, ci) {
            return e;
        }
        assert!(Instant::now() < deadline, "no EQE {ci}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

pub fn opcode(cqe: &[u8; 64]) -> CqeOpcode {
    CqeOpcode::from_raw((Cqe64::new_unchecked(&cqe[..]).opcode()) as u8)
}

pub fn syndrome(cqe: &[u8; 64]) -> CqeSyndrome {
    CqeSyndrome::from_raw(ErrCqe::new_unchecked(&cqe[..]).syndrome() as u8)
}

/// One emulated QP with its rings.
pub struct EmuQp {
    pub qpn: u32,
    pub wq: Arc<DmaBuffer>,
    pub dbr: Arc<DmaBuffer>,
    pub sq_pi: u16,
    pub rq_pi: u16,
}

pub const LOG_SQ: u32 = 6;
pub const LOG_RQ: u32 = 6;
/// RQ stride 32 bytes (two data segments).
pub const RQ_STRIDE: usize = 32;
pub const SQ_OFF: usize = (1 << LOG_RQ) * RQ_STRIDE;

impl EmuQp {
    pub fn create(hw: &mut Hw, cq: &Cq, st: QpServiceType) -> EmuQp {
        EmuQp::try_create(hw, cq, st, |_| {}).expect("CREATE_QP")
    }

    /// CREATE_QP with `tweak` applied to the context; the QP, or the command's (status,
    /// syndrome).
    pub fn try_create(
        hw: &mut Hw,
        cq: &Cq,
        st: QpServiceType,
        tweak: impl FnOnce(&mut rnic_mlx5_prm::Qpc<&mut [u8]>),
    ) -> Result<EmuQp, (u8, u32)> {
        let wq = hw.buf(2 * 4096);
        let dbr = hw.buf(4096);
        let mut c = cmd(CmdOpcode::CreateQp, 0, 0x110 + 16);
        let mut v = CreateQpIn::new_unchecked(&mut c[..]);
        let mut q = v.qpc_mut();
        q.set_st(u32::from(st.as_raw())).unwrap();
        q.set_pm_state(3).unwrap();
        q.set_pd(hw.pd).unwrap();
        q.set_log_sq_size(LOG_SQ).unwrap();
        q.set_log_rq_size(LOG_RQ).unwrap();
        q.set_log_rq_stride(1).unwrap();
        q.set_uar_page(hw.uar).unwrap();
        q.set_cqn_snd(cq.cqn).unwrap();
        q.set_cqn_rcv(cq.cqn).unwrap();
        q.set_dbr_addr(dbr.iova().0).unwrap();
        q.set_user_index(0x77).unwrap();
        tweak(&mut q);
        v.set_pas(0, wq.iova().0).unwrap();
        v.set_pas(1, wq.iova().0 + 4096).unwrap();
        let out = hw.r.exec(&c, OUT).out();
        if status(&out) != (0, 0) {
            return Err(status(&out));
        }
        Ok(EmuQp {
            qpn: CreateQpOut::new_unchecked(&out[..]).qpn(),
            wq,
            dbr,
            sq_pi: 0,
            rq_pi: 0,
        })
    }

    pub fn modify(
        &self,
        hw: &Hw,
        op: CmdOpcode,
        f: impl FnOnce(&mut rnic_mlx5_prm::Qpc<&mut [u8]>),
    ) -> (u8, u32) {
        let mut c = cmd(op, 0, 0x110);
        let mut v = Rst2initQpIn::new_unchecked(&mut c[..]);
        v.set_qpn(self.qpn).unwrap();
        f(&mut v.qpc_mut());
        status(&hw.r.exec(&c, OUT).out())
    }

    /// RST → INIT → RTR → RTS against `peer` (QPN, GID address, its SQ PSN).
    pub fn connect(&self, hw: &Hw, peer_qpn: u32, peer_ip: IpAddr, rq_psn: u32, sq_psn: u32) {
        self.connect_via(
            hw,
            (peer_qpn, peer_ip, [2, 0, 0x12, 0x34, 0x56, 0x78]),
            rq_psn,
            sq_psn,
        );
    }

    /// [`EmuQp::connect`] with the peer's MAC as the address path's `rmac`.
    pub fn connect_via(
        &self,
        hw: &Hw,
        (peer_qpn, peer_ip, rmac): (u32, IpAddr, [u8; 6]),
        rq_psn: u32,
        sq_psn: u32,
    ) {
        assert_eq!(
            self.modify(hw, CmdOpcode::Rst2InitQp, |q| {
                q.set_rre(1).unwrap();
                q.set_rwe(1).unwrap();
                q.set_rae(1).unwrap();
                q.primary_address_path_mut().set_vhca_port_num(1).unwrap();
            }),
            (0, 0)
        );
        assert_eq!(
            self.modify(hw, CmdOpcode::Init2RtrQp, |q| {
                q.set_mtu(3).unwrap();
                q.set_log_msg_max(20).unwrap();
                q.set_remote_qpn(peer_qpn).unwrap();
                q.set_next_rcv_psn(rq_psn).unwrap();
                q.set_min_rnr_nak(12).unwrap();
                q.set_log_rra_max(4).unwrap();
                let mut a = q.primary_address_path_mut();
                a.set_src_addr_index(0).unwrap();
                a.set_rgid_rip(&gid_of(peer_ip)).unwrap();
                a.set_hop_limit(64).unwrap();
                a.set_udp_sport(0xdcba).unwrap();
                a.set_vhca_port_num(1).unwrap();
                a.set_rmac_47_32(u32::from(u16::from_be_bytes([rmac[0], rmac[1]])))
                    .unwrap();
                a.set_rmac_31_0(u32::from_be_bytes([rmac[2], rmac[3], rmac[4], rmac[5]]))
                    .unwrap();
            }),
            (0, 0)
        );
        assert_eq!(
            self.modify(hw, CmdOpcode::Rtr2RtsQp, |q| {
                q.set_next_send_psn(sq_psn).unwrap();
                q.set_retry_count(7).unwrap();
                q.set_rnr_retry(7).unwrap();
                q.set_log_sra_max(4).unwrap();
                q.primary_address_path_mut().set_ack_timeout(14).unwrap();
            }),
            (0, 0)
        );
    }

    /// Write a send WQE (control + `segs`) at the producer, publish the doorbell record and
    /// ring UAR + 0x800. Returns the WQE index.
    pub fn post(&mut self, hw: &Hw, op: WqeOpcode, signaled: bool, segs: &[[u8; 16]]) -> u16 {
        let (idx, bell) = self.prepare(op, signaled, segs);
        hw.uar_write64(0x800, bell);
        idx
    }

    /// [`EmuQp::post`] without the doorbell: the WQE written and the doorbell record
    /// published. Returns the WQE index and the doorbell value (the control segment's first
    /// 8 bytes) to ring.
    pub fn prepare(&mut self, op: WqeOpcode, signaled: bool, segs: &[[u8; 16]]) -> (u16, u64) {
        let idx = self.write_wqe(op, signaled, segs);
        let bbs = (1 + segs.len()).div_ceil(4) as u16;
        self.sq_pi = self.sq_pi.wrapping_add(bbs);
        std::sync::atomic::fence(Ordering::SeqCst);
        self.dbr
            .write(4, &u32::from(self.sq_pi).to_be_bytes())
            .unwrap();
        std::sync::atomic::fence(Ordering::SeqCst);
        let mut first = [0u8; 8];
        self.wq
            .read(
                SQ_OFF + (usize::from(idx) & ((1 << LOG_SQ) - 1)) * 64,
                &mut first,
            )
            .unwrap();
        (idx, u64::from_be_bytes(first))
    }

    /// [`EmuQp::post`] as a BlueFlame copy: the WQE written and published, then its basic
    /// blocks copied into UAR register half `half` with 8-byte stores, word 0 first (as
    /// rdma-core's copy and rnic-mlx5's). Returns the WQE index.
    pub fn post_bf(
        &mut self,
        hw: &Hw,
        half: usize,
        op: WqeOpcode,
        signaled: bool,
        segs: &[[u8; 16]],
    ) -> u16 {
        let (idx, _) = self.prepare(op, signaled, segs);
        for (k, w) in self.wqe_words(idx, segs.len()).into_iter().enumerate() {
            hw.uar_write64(half + 8 * k, w);
        }
        idx
    }

    /// The WQE at `idx` of a control segment and `segs` data segments as 8-byte words (its
    /// basic blocks, as the ring holds them).
    pub fn wqe_words(&self, idx: u16, segs: usize) -> Vec<u64> {
        let bbs = (1 + segs).div_ceil(4);
        let mut out = Vec::new();
        for k in 0..bbs {
            let slot = (usize::from(idx) + k) & ((1 << LOG_SQ) - 1);
            let mut bb = [0u8; 64];
            self.wq.read(SQ_OFF + slot * 64, &mut bb).unwrap();
            out.extend(
                bb.chunks(8)
                    .map(|c| u64::from_be_bytes(c.try_into().unwrap())),
            );
        }
        out
    }

    /// Write a send WQE at the producer index into the ring only: neither the producer
    /// nor the doorbell record moves. Returns its index.
    pub fn write_wqe(&mut self, op: WqeOpcode, signaled: bool, segs: &[[u8; 16]]) -> u16 {
        let idx = self.sq_pi;
        let ds = 1 + segs.len() as u32;
        let mut w = vec![0u8; (ds as usize).div_ceil(4) * 64];
        w[0..4].copy_from_slice(&((u32::from(idx) << 8) | u32::from(op.as_raw())).to_be_bytes());
        w[4..8].copy_from_slice(&((self.qpn << 8) | ds).to_be_bytes());
        w[11] = if signaled { 2 << 2 } else { 0 };
        for (i, s) in segs.iter().enumerate() {
            w[16 + 16 * i..32 + 16 * i].copy_from_slice(s);
        }
        for (k, bb) in w.chunks(64).enumerate() {
            let slot = (usize::from(idx) + k) & ((1 << LOG_SQ) - 1);
            self.wq.write(SQ_OFF + slot * 64, bb).unwrap();
        }
        idx
    }

    /// Post one receive WQE (one data segment + terminator).
    pub fn post_recv(&mut self, addr: u64, len: u32, lkey: u32) -> u16 {
        self.post_recv_segs(&[data_seg(len, lkey, addr), data_seg(0, 0x100, 0)])
    }

    /// Post one receive WQE of exactly these (at most two) data segments.
    pub fn post_recv_segs(&mut self, segs: &[[u8; 16]]) -> u16 {
        let idx = self.rq_pi;
        let mut w = [0u8; RQ_STRIDE];
        for (i, s) in segs.iter().enumerate() {
            w[16 * i..16 * i + 16].copy_from_slice(s);
        }
        let slot = usize::from(idx) & ((1 << LOG_RQ) - 1);
        self.wq.write(slot * RQ_STRIDE, &w).unwrap();
        self.rq_pi = self.rq_pi.wrapping_add(1);
        std::sync::atomic::fence(Ordering::SeqCst);
        self.dbr
            .write(0, &u32::from(self.rq_pi).to_be_bytes())
            .unwrap();
        idx
    }

    pub fn state(&self, hw: &Hw) -> u32 {
        let mut c = cmd(CmdOpcode::QueryQp, 0, 0x10);
        c[0x09..0x0c].copy_from_slice(&self.qpn.to_be_bytes()[1..]);
        let out = hw.r.ok(&c, QueryQpOut::<&[u8]>::SIZE_BYTES + 16);
        QueryQpOut::new_unchecked(&out[..]).qpc().state()
    }
}

/// The GID bytes of an address (IPv4-mapped for IPv4).
pub fn gid_of(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => rnic_core::Gid::from_ipv4(v4).0,
        IpAddr::V6(v6) => v6.octets(),
    }
}

pub fn data_seg(len: u32, lkey: u32, addr: u64) -> [u8; 16] {
    let mut s = [0u8; 16];
    s[0..4].copy_from_slice(&len.to_be_bytes());
    s[4..8].copy_from_slice(&lkey.to_be_bytes());
    s[8..16].copy_from_slice(&addr.to_be_bytes());
    s
}

pub fn raddr_seg(addr: u64, rkey: u32) -> [u8; 16] {
    let mut s = [0u8; 16];
    s[0..8].copy_from_slice(&addr.to_be_bytes());
    s[8..12].copy_from_slice(&rkey.to_be_bytes());
    s
}

pub fn atomic_seg(swap_add: u64, compare: u64) -> [u8; 16] {
    let mut s = [0u8; 16];
    s[0..8].copy_from_slice(&swap_add.to_be_bytes());
    s[8..16].copy_from_slice(&compare.to_be_bytes());
    s
}

/// The rxe peer: device, PD, CQ, a 64 KiB buffer and its MR, one RC QP.
pub struct Peer {
    pub dev: rnic_rxe::RxeDevice,
    pub _ctx: Context,
    pub _pd: ProtectionDomain,
    pub cq: CompletionQueue,
    pub mem: Arc<HeapMemory>,
    pub mr: MemoryRegion,
    pub qp: QueuePair,
}

impl Peer {
    pub fn new(ip: IpAddr) -> Peer {
        Peer::with(ip, QpType::Rc)
    }

    pub fn with(ip: IpAddr, qp_type: QpType) -> Peer {
        let dev = rnic_rxe::RxeDevice::open(
            &rnic_rxe::RxeConfig::new(rnic_rxe::Target::Ip(ip))
                .with_progress(rnic_rxe::Progress::Thread),
        )
        .expect("open rxe");
        let ctx = dev.context();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(256).unwrap();
        let mem = Arc::new(HeapMemory::new(64 << 10));
        let mr = pd.reg_mr(mem.clone(), ALL).unwrap();
        let caps = QpCaps {
            max_send_wr: 64,
            max_recv_wr: 64,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline_data: 64,
        };
        let qp = pd
            .create_qp(&cq, &cq, &QpInitAttr::new(qp_type, caps))
            .unwrap();
        Peer {
            dev,
            _ctx: ctx,
            _pd: pd,
            cq,
            mem,
            mr,
            qp,
        }
    }

    pub fn connect(&mut self, emu_qpn: u32, emu_ip: IpAddr, emu_sq_psn: u32, my_psn: u32) {
        self.qp
            .to_init(&InitParams {
                access: ALL,
                ..InitParams::default()
            })
            .unwrap();
        let IpAddr::V4(v4) = emu_ip else { panic!() };
        self.qp
            .to_rtr(
                rnic_core::Qpn::from_wire(emu_qpn),
                Psn::from_wire(emu_sq_psn),
                rnic_core::Gid::from_ipv4(v4),
                &RtrParams {
                    path_mtu: Mtu::Mtu1024,
                    max_dest_rd_atomic: 16,
                    ..RtrParams::default()
                },
            )
            .unwrap();
        self.qp
            .to_rts(
                Psn::from_wire(my_psn),
                &RtsParams {
                    max_rd_atomic: 16,
                    ..RtsParams::default()
                },
            )
            .unwrap();
    }

    pub fn wait(&mut self, n: usize) -> Vec<WorkCompletion> {
        let mut out = Vec::new();
        let mut wcs = [WorkCompletion::default(); 16];
        let start = Instant::now();
        while out.len() < n {
            let got = self.cq.poll(&mut wcs).unwrap();
            out.extend_from_slice(&wcs[..got]);
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "peer timed out: {out:?}"
            );
            std::thread::sleep(Duration::from_micros(200));
        }
        out
    }

    pub fn bytes(&self, off: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.mem.read(off, &mut v).unwrap();
        v
    }
}

pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

pub const VA: u64 = 0x7f00_0000_1000;

/// Everything up to a connected RC pair: (hw, cq, comp EQ ring, qp, peer, data buffer, lkey).
///
/// `hw` is declared last so it drops last (see [`Hw`]).
pub struct Pair {
    pub aeq: (u32, Arc<DmaBuffer>),
    pub cq: Cq,
    pub ceq: (u32, Arc<DmaBuffer>),
    pub qp: EmuQp,
    pub peer: Peer,
    pub data: Arc<DmaBuffer>,
    pub lkey: u32,
    pub emu_ip: IpAddr,
    pub hw: Hw,
}

/// A pair on [`Rig::new`]'s firmware (issue 26's strictness off; see there).
pub fn pair() -> Pair {
    pair_with(legacy())
}

/// [`pair`] on a firmware configured with `options`.
pub fn pair_with(options: Options) -> Pair {
    let (emu_ip, peer_ip) = ip_pair();
    let mut hw = Hw::with(options);
    assert_eq!(hw.set_gid(0, emu_ip), (0, 0));
    assert_eq!(hw.r.fw().bound_addresses(), vec![emu_ip]);
    let async_mask = (1u64 << EventType::PageRequest.as_raw())
        | (1 << EventType::CqError.as_raw())
        | (1 << EventType::WqCatasError.as_raw());
    let aeq = hw.eq(7, 0, async_mask);
    let ceq = hw.eq(6, 1, 0);
    let cq = hw.cq(ceq.0);
    let data = hw.buf(4 * 4096);
    let lkey = hw.mkey(&data, VA, &["lw", "rr", "rw", "a"]);
    let qp = EmuQp::create(&mut hw, &cq, QpServiceType::Rc);
    let mut peer = Peer::new(peer_ip);
    let (emu_psn, peer_psn) = (0x1000, 0xabcdef);
    peer.connect(qp.qpn, emu_ip, emu_psn, peer_psn);
    qp.connect(&hw, peer.qp.qpn().get(), peer_ip, peer_psn, emu_psn);
    assert_eq!(qp.state(&hw), 3, "RTS");
    Pair {
        hw,
        aeq,
        cq,
        ceq,
        qp,
        peer,
        data,
        lkey,
        emu_ip,
    }
}

/// xorshift64*: deterministic noise for the hostile-driver tests.
pub struct Noise(pub u64);

impl Noise {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn fill(&mut self, b: &mut [u8]) {
        for x in b.iter_mut() {
            *x = self.next() as u8;
        }
    }
}

/// Options with `strictness` and the firmware options `firmware`, a 1 ms boot.
pub fn options(strictness: Strictness, firmware: FirmwareOptions) -> Options {
    Options {
        boot_delay: Duration::from_millis(1),
        firmware: FirmwareOptions {
            strictness,
            ..firmware
        },
        ..Options::default()
    }
}

/// Every check of issue 26 on.
pub fn strict() -> Options {
    options(Strictness::strict(), FirmwareOptions::default())
}

/// Every check off: the emulator as before issue 26.
pub fn legacy() -> Options {
    options(Strictness::legacy(), FirmwareOptions::default())
}

/// ENABLE_HCA, SET_ISSI 1 and the boot pages (from the start of a 64-page buffer, returned):
/// capabilities may be queried and set.
pub fn boot(r: &Rig) -> Arc<DmaBuffer> {
    r.ok(&cmd(CmdOpcode::EnableHca, 0, 0x10), OUT);
    let mut c = cmd(CmdOpcode::SetIssi, 0, 0x10);
    SetIssiIn::new_unchecked(&mut c[..])
        .set_current_issi(1)
        .unwrap();
    r.ok(&c, OUT);
    let pages = r.f.alloc_dma(64 * 4096).unwrap();
    let n = query_pages(r, query_pages_op_mod::BOOT) as usize;
    give(r, &(0..n).map(|i| pages.iter_page(i)).collect::<Vec<_>>());
    pages
}

/// Whether the first 128 EQEs of `ring` hold a CQ error event (overrun, syndrome 1) for CQ
/// `cqn`.
pub fn cq_error_seen(ring: &DmaBuffer, cqn: u32) -> bool {
    let mut e = [0u8; 64];
    (0..128).any(|i| {
        ring.read(i * 64, &mut e).unwrap();
        let v = Eqe::new_unchecked(&e[..]);
        v.event_type() == u32::from(EventType::CqError.as_raw())
            && v.cq_error().cqn() == cqn
            && v.cq_error().syndrome() == 1
    })
}
