//! The emulated HCA end to end: EQs, CQs, MKeys and QPs created with real command bytes
//! (the rnic-mlx5-prm views through the tests' own command client), WQEs written into the
//! SQ ring and rung at the UAR, CQEs and EQEs read back from DMA memory — against an
//! rnic-rxe peer on a loopback address. Not the driver's data path.
#![allow(clippy::unwrap_used)]

mod common;

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use common::{Rig, cmd, status};
use rnic_core::{
    AccessFlags, CompletionQueue, Context, HeapMemory, InitParams, Memory, MemoryRegion, Mtu,
    ProtectionDomain, Psn, QpCaps, QpInitAttr, QpType, QueuePair, RtrParams, RtsParams, SendFlags,
    SendOp, SendWr, Sge, WcStatus, WorkCompletion,
};
use rnic_mlx5::{DmaBuffer, PciFunction, Vector};
use rnic_mlx5_emu::firmware::syndrome as syn;
use rnic_mlx5_emu::{Options, Phase};
use rnic_mlx5_prm::{
    AllocPdOut, AllocUarOut, CmdOpcode, CmdStatus, Cqe64, CqeOpcode, CqeSyndrome, CreateCqIn,
    CreateCqOut, CreateEqIn, CreateEqOut, CreateMkeyIn, CreateMkeyOut, CreateQpIn, CreateQpOut,
    Eqe, ErrCqe, EventType, ManagePagesIn, ModifyNicVportContextIn, QpServiceType, QueryPagesOut,
    QueryQpOut, RoceCap, Rst2initQpIn, SetIssiIn, SetRoceAddressIn, WqeOpcode, cap_type,
    create_mkey_in, manage_pages_op_mod, query_hca_cap_out, query_pages_op_mod,
};

const OUT: usize = 0x10;
const MAC: [u8; 6] = [0x02, 0x00, 0x15, 0xb3, 0x10, 0x17];
const ALL: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

/// A fresh pair of loopback addresses per test (127.<pid>.<n>.1 / .2).
fn ip_pair() -> (IpAddr, IpAddr) {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let b = 30 + (std::process::id() % 200) as u8;
    let c = (n % 250) as u8;
    (
        IpAddr::V4(Ipv4Addr::new(127, b, c, 1)),
        IpAddr::V4(Ipv4Addr::new(127, b, c, 2)),
    )
}

fn give(r: &Rig, pages: &[u64]) {
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
    r.ok(&c, OUT);
}

fn query_pages(r: &Rig, op_mod: u32) -> i32 {
    let out = r.ok(&cmd(CmdOpcode::QueryPages, op_mod, 0x10), OUT);
    QueryPagesOut::new_unchecked(&out[..]).num_pages() as i32
}

/// The function up to INIT_HCA with RoCE on, the RoCE source-port cap enabled, a UAR and
/// a PD, and four MSI-X vectors.
struct Hw {
    r: Rig,
    pages: Arc<DmaBuffer>,
    uar: u32,
    pd: u32,
    vectors: Vec<Vector>,
    bufs: Vec<Arc<DmaBuffer>>,
}

impl Hw {
    fn new() -> Hw {
        let r = Rig::with(Options {
            boot_delay: Duration::from_millis(1),
            ..Options::default()
        });
        r.ok(&cmd(CmdOpcode::EnableHca, 0, 0x10), OUT);
        let mut c = cmd(CmdOpcode::SetIssi, 0, 0x10);
        SetIssiIn::new_unchecked(&mut c[..])
            .set_current_issi(1)
            .unwrap();
        r.ok(&c, OUT);
        let pages = r.f.alloc_dma(64 * 4096).unwrap();
        let addr = |i: usize| pages.iter_page(i);
        let boot = query_pages(&r, query_pages_op_mod::BOOT) as usize;
        give(&r, &(0..boot).map(addr).collect::<Vec<_>>());
        let q = cmd(CmdOpcode::QueryHcaCap, (cap_type::ROCE << 1) | 1, 0x10);
        let out = r.ok(&q, 0x1010);
        let mut roce = out[query_hca_cap_out::cmd_hca_cap.byte_offset()..].to_vec();
        RoceCap::new_unchecked(&mut roce[..])
            .set_sw_r_roce_src_udp_port(1)
            .unwrap();
        let mut set = cmd(CmdOpcode::SetHcaCap, cap_type::ROCE << 1, 0x1010);
        set[0x10..].copy_from_slice(&roce[..0x1000]);
        r.ok(&set, OUT);
        let init = query_pages(&r, query_pages_op_mod::INIT) as usize;
        give(&r, &(boot..boot + init).map(addr).collect::<Vec<_>>());
        r.ok(&cmd(CmdOpcode::InitHca, 0, 0x20), OUT);
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

    fn buf(&mut self, len: usize) -> Arc<DmaBuffer> {
        let b = self.r.f.alloc_dma(len).unwrap();
        self.bufs.push(b.clone());
        b
    }

    fn uar_write64(&self, off: usize, v: u64) {
        self.r.f.uar(self.uar).unwrap().write64_be(off, v).unwrap();
    }

    fn uar_write32(&self, off: usize, v: u32) {
        self.r.f.uar(self.uar).unwrap().write32_be(off, v).unwrap();
    }

    /// SET_ROCE_ADDRESS index `idx` = `ip` (RoCE v2).
    fn set_gid(&self, idx: u32, ip: IpAddr) -> (u8, u32) {
        self.set_gid_with(idx, ip, MAC, 2)
    }

    fn set_gid_with(&self, idx: u32, ip: IpAddr, mac: [u8; 6], version: u32) -> (u8, u32) {
        let mut c = cmd(CmdOpcode::SetRoceAddress, 0, 0x30);
        let mut v = SetRoceAddressIn::new_unchecked(&mut c[..]);
        v.set_roce_address_index(idx).unwrap();
        let mut l = v.roce_address_mut();
        let IpAddr::V4(v4) = ip else { panic!() };
        l.set_source_l3_address(&rnic_core::Gid::from_ipv4(v4).0)
            .unwrap();
        l.set_source_mac_47_32(u32::from(u16::from_be_bytes([mac[0], mac[1]])))
            .unwrap();
        l.set_source_mac_31_0(u32::from_be_bytes([mac[2], mac[3], mac[4], mac[5]]))
            .unwrap();
        l.set_roce_version(version).unwrap();
        l.set_roce_l3_type(0).unwrap();
        status(&self.r.exec(&c, OUT).out())
    }

    /// CREATE_EQ of 2^log entries (owner bytes 1) on `vector` with `mask`.
    fn eq(&mut self, log: u32, vector: u32, mask: u64) -> (u32, Arc<DmaBuffer>) {
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
    fn cq(&mut self, eqn: u32) -> Cq {
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
    fn mkey(&self, buf: &DmaBuffer, va: u64, access: &[&str]) -> u32 {
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

trait PageAddr {
    fn iter_page(&self, i: usize) -> u64;
}

impl PageAddr for Arc<DmaBuffer> {
    fn iter_page(&self, i: usize) -> u64 {
        self.iova().0 + (i * 4096) as u64
    }
}

struct Cq {
    cqn: u32,
    ring: Arc<DmaBuffer>,
    dbr: Arc<DmaBuffer>,
    ci: u32,
}

impl Cq {
    /// Poll one CQE (owner parity, opcode != 0xF) within `wait`; advances set_ci.
    fn poll(&mut self, wait: Duration) -> Option<[u8; 64]> {
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

    fn expect(&mut self) -> [u8; 64] {
        self.poll(Duration::from_secs(10))
            .expect("no CQE within 10 s")
    }
}

fn opcode(cqe: &[u8; 64]) -> CqeOpcode {
    CqeOpcode::from_raw((Cqe64::new_unchecked(&cqe[..]).opcode()) as u8)
}

fn syndrome(cqe: &[u8; 64]) -> CqeSyndrome {
    CqeSyndrome::from_raw(ErrCqe::new_unchecked(&cqe[..]).syndrome() as u8)
}

/// One emulated QP with its rings.
struct EmuQp {
    qpn: u32,
    wq: Arc<DmaBuffer>,
    dbr: Arc<DmaBuffer>,
    sq_pi: u16,
    rq_pi: u16,
}

const LOG_SQ: u32 = 6;
const LOG_RQ: u32 = 6;
/// RQ stride 32 bytes (two data segments).
const RQ_STRIDE: usize = 32;
const SQ_OFF: usize = (1 << LOG_RQ) * RQ_STRIDE;

impl EmuQp {
    fn create(hw: &mut Hw, cq: &Cq, st: QpServiceType) -> EmuQp {
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
        v.set_pas(0, wq.iova().0).unwrap();
        v.set_pas(1, wq.iova().0 + 4096).unwrap();
        let out = hw.r.ok(&c, OUT);
        EmuQp {
            qpn: CreateQpOut::new_unchecked(&out[..]).qpn(),
            wq,
            dbr,
            sq_pi: 0,
            rq_pi: 0,
        }
    }

    fn modify(
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
    fn connect(&self, hw: &Hw, peer_qpn: u32, peer_ip: IpAddr, rq_psn: u32, sq_psn: u32) {
        assert_eq!(
            self.modify(hw, CmdOpcode::Rst2InitQp, |q| {
                q.set_rre(1).unwrap();
                q.set_rwe(1).unwrap();
                q.set_rae(1).unwrap();
                q.primary_address_path_mut().set_vhca_port_num(1).unwrap();
            }),
            (0, 0)
        );
        let IpAddr::V4(v4) = peer_ip else { panic!() };
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
                a.set_rgid_rip(&rnic_core::Gid::from_ipv4(v4).0).unwrap();
                a.set_hop_limit(64).unwrap();
                a.set_udp_sport(0xdcba).unwrap();
                a.set_vhca_port_num(1).unwrap();
                a.set_rmac_47_32(0x0200).unwrap();
                a.set_rmac_31_0(0x1234_5678).unwrap();
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
    fn post(&mut self, hw: &Hw, op: WqeOpcode, signaled: bool, segs: &[[u8; 16]]) -> u16 {
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
        self.sq_pi = self.sq_pi.wrapping_add(w.len() as u16 / 64);
        std::sync::atomic::fence(Ordering::SeqCst);
        self.dbr
            .write(4, &u32::from(self.sq_pi).to_be_bytes())
            .unwrap();
        std::sync::atomic::fence(Ordering::SeqCst);
        let mut first = [0u8; 8];
        first.copy_from_slice(&w[..8]);
        hw.uar_write64(0x800, u64::from_be_bytes(first));
        idx
    }

    /// Post one receive WQE (one data segment + terminator).
    fn post_recv(&mut self, addr: u64, len: u32, lkey: u32) -> u16 {
        let idx = self.rq_pi;
        let mut w = [0u8; RQ_STRIDE];
        w[..16].copy_from_slice(&data_seg(len, lkey, addr));
        w[16..32].copy_from_slice(&data_seg(0, 0x100, 0));
        let slot = usize::from(idx) & ((1 << LOG_RQ) - 1);
        self.wq.write(slot * RQ_STRIDE, &w).unwrap();
        self.rq_pi = self.rq_pi.wrapping_add(1);
        std::sync::atomic::fence(Ordering::SeqCst);
        self.dbr
            .write(0, &u32::from(self.rq_pi).to_be_bytes())
            .unwrap();
        idx
    }

    fn state(&self, hw: &Hw) -> u32 {
        let mut c = cmd(CmdOpcode::QueryQp, 0, 0x10);
        c[0x09..0x0c].copy_from_slice(&self.qpn.to_be_bytes()[1..]);
        let out = hw.r.ok(&c, QueryQpOut::<&[u8]>::SIZE_BYTES + 16);
        QueryQpOut::new_unchecked(&out[..]).qpc().state()
    }
}

fn data_seg(len: u32, lkey: u32, addr: u64) -> [u8; 16] {
    let mut s = [0u8; 16];
    s[0..4].copy_from_slice(&len.to_be_bytes());
    s[4..8].copy_from_slice(&lkey.to_be_bytes());
    s[8..16].copy_from_slice(&addr.to_be_bytes());
    s
}

fn raddr_seg(addr: u64, rkey: u32) -> [u8; 16] {
    let mut s = [0u8; 16];
    s[0..8].copy_from_slice(&addr.to_be_bytes());
    s[8..12].copy_from_slice(&rkey.to_be_bytes());
    s
}

fn atomic_seg(swap_add: u64, compare: u64) -> [u8; 16] {
    let mut s = [0u8; 16];
    s[0..8].copy_from_slice(&swap_add.to_be_bytes());
    s[8..16].copy_from_slice(&compare.to_be_bytes());
    s
}

/// The rxe peer: device, PD, CQ, a 64 KiB buffer and its MR, one RC QP.
struct Peer {
    dev: rnic_rxe::RxeDevice,
    _ctx: Context,
    _pd: ProtectionDomain,
    cq: CompletionQueue,
    mem: Arc<HeapMemory>,
    mr: MemoryRegion,
    qp: QueuePair,
}

impl Peer {
    fn new(ip: IpAddr) -> Peer {
        Peer::with(ip, QpType::Rc)
    }

    fn with(ip: IpAddr, qp_type: QpType) -> Peer {
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

    fn connect(&mut self, emu_qpn: u32, emu_ip: IpAddr, emu_sq_psn: u32, my_psn: u32) {
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

    fn wait(&self, n: usize) -> Vec<WorkCompletion> {
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

    fn bytes(&self, off: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.mem.read(off, &mut v).unwrap();
        v
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

const VA: u64 = 0x7f00_0000_1000;

/// Everything up to a connected RC pair: (hw, cq, comp EQ ring, qp, peer, data buffer, lkey).
struct Pair {
    hw: Hw,
    aeq: (u32, Arc<DmaBuffer>),
    cq: Cq,
    ceq: (u32, Arc<DmaBuffer>),
    qp: EmuQp,
    peer: Peer,
    data: Arc<DmaBuffer>,
    lkey: u32,
    emu_ip: IpAddr,
}

fn pair() -> Pair {
    let (emu_ip, peer_ip) = ip_pair();
    let mut hw = Hw::new();
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

#[test]
fn rc_write_send_read_atomic_against_rxe() {
    let mut p = pair();
    let rkey = p.peer.mr.rkey().get();
    let raddr = p.peer.mr.addr();

    // WRITE: 3000 bytes from MKey offset 100 (crossing a page of the MTT) to the peer.
    let src = pattern(3000, 7);
    p.data.write(100, &src).unwrap();
    let unsignaled = p.qp.post(
        &p.hw,
        WqeOpcode::RdmaWrite,
        false,
        &[
            raddr_seg(raddr + 64, rkey),
            data_seg(1000, p.lkey, VA + 100),
        ],
    );
    let idx = p.qp.post(
        &p.hw,
        WqeOpcode::RdmaWrite,
        true,
        &[
            raddr_seg(raddr + 1064, rkey),
            data_seg(2000, p.lkey, VA + 1100),
        ],
    );
    assert_eq!((unsignaled, idx), (0, 1));
    let cqe = p.cq.expect();
    let v = Cqe64::new_unchecked(&cqe[..]);
    assert_eq!(opcode(&cqe), CqeOpcode::Req, "{cqe:x?}");
    assert_eq!(
        v.wqe_counter(),
        u32::from(idx),
        "the signaled WQE; the unsignaled one is implied"
    );
    assert_eq!(v.qpn(), p.qp.qpn);
    assert_eq!(v.wqe_opcode(), u32::from(WqeOpcode::RdmaWrite.as_raw()));
    assert_eq!(v.srqn_uidx(), 0x77, "user_index (cqe_version 1)");
    assert_eq!(p.peer.bytes(64, 3000), src, "byte-exact at the peer");
    assert_eq!(p.peer.bytes(64 + 3000, 1), [0], "guard byte untouched");
    assert!(
        p.cq.poll(Duration::from_millis(50)).is_none(),
        "one CQE only"
    );

    // SEND from the peer into a posted receive WQE.
    let ridx = p.qp.post_recv(VA + 8192, 4096, p.lkey);
    let msg = pattern(1500, 3);
    p.peer.mem.write(8192, &msg).unwrap();
    let sge = [Sge::new(p.peer.mr.addr() + 8192, 1500, p.peer.mr.lkey())];
    p.peer
        .qp
        .post_send(&[SendWr {
            wr_id: 9,
            op: SendOp::SendWithImm { imm: 0x1234_5678 },
            sg_list: &sge,
            flags: SendFlags::SIGNALED,
            ud: None,
        }])
        .unwrap();
    let cqe = p.cq.expect();
    let v = Cqe64::new_unchecked(&cqe[..]);
    assert_eq!(opcode(&cqe), CqeOpcode::RespSendImm, "{cqe:x?}");
    assert_eq!(v.byte_cnt(), 1500);
    assert_eq!(v.imm_inval_pkey(), 0x1234_5678);
    assert_eq!(v.wqe_counter(), u32::from(ridx));
    let mut got = vec![0u8; 1500];
    p.data.read(8192, &mut got).unwrap();
    assert_eq!(got, msg);
    assert_eq!(p.peer.wait(1)[0].status, WcStatus::Success);

    // READ 2048 bytes of the peer into MKey offset 12288.
    let remote = pattern(2048, 11);
    p.peer.mem.write(16384, &remote).unwrap();
    let idx = p.qp.post(
        &p.hw,
        WqeOpcode::RdmaRead,
        true,
        &[
            raddr_seg(raddr + 16384, rkey),
            data_seg(2048, p.lkey, VA + 12288),
        ],
    );
    let cqe = p.cq.expect();
    let v = Cqe64::new_unchecked(&cqe[..]);
    assert_eq!(
        (opcode(&cqe), v.wqe_counter(), v.byte_cnt()),
        (CqeOpcode::Req, u32::from(idx), 2048)
    );
    let mut got = vec![0u8; 2048];
    p.data.read(12288, &mut got).unwrap();
    assert_eq!(got, remote);

    // Fetch-and-add: the original value comes back (big-endian, no endianness mode).
    p.peer.mem.write(32768, &41u64.to_ne_bytes()).unwrap();
    let idx = p.qp.post(
        &p.hw,
        WqeOpcode::AtomicFa,
        true,
        &[
            raddr_seg(raddr + 32768, rkey),
            atomic_seg(1, 0),
            data_seg(8, p.lkey, VA + 200),
        ],
    );
    let cqe = p.cq.expect();
    assert_eq!(opcode(&cqe), CqeOpcode::Req, "{cqe:x?}");
    assert_eq!(Cqe64::new_unchecked(&cqe[..]).wqe_counter(), u32::from(idx));
    let mut orig = [0u8; 8];
    p.data.read(200, &mut orig).unwrap();
    assert_eq!(u64::from_be_bytes(orig), 41);
    let mut now = [0u8; 8];
    p.peer.mem.read(32768, &mut now).unwrap();
    assert_eq!(u64::from_ne_bytes(now), 42);

    // Compare-and-swap 42 → 7.
    p.qp.post(
        &p.hw,
        WqeOpcode::AtomicCs,
        true,
        &[
            raddr_seg(raddr + 32768, rkey),
            atomic_seg(7, 42),
            data_seg(8, p.lkey, VA + 208),
        ],
    );
    assert_eq!(opcode(&p.cq.expect()), CqeOpcode::Req);
    p.data.read(208, &mut orig).unwrap();
    assert_eq!(u64::from_be_bytes(orig), 42);
    p.peer.mem.read(32768, &mut now).unwrap();
    assert_eq!(u64::from_ne_bytes(now), 7);

    // The peer WRITEs into our MKey (remote access through the MTT, key byte checked).
    let w = pattern(700, 99);
    p.peer.mem.write(40000, &w).unwrap();
    let sge = [Sge::new(p.peer.mr.addr() + 40000, 700, p.peer.mr.lkey())];
    p.peer
        .qp
        .post_send(&[SendWr {
            wr_id: 10,
            op: SendOp::RdmaWrite {
                remote_addr: VA + 4000,
                rkey: rnic_core::Rkey(p.lkey),
            },
            sg_list: &sge,
            flags: SendFlags::SIGNALED,
            ud: None,
        }])
        .unwrap();
    assert_eq!(p.peer.wait(1)[0].status, WcStatus::Success);
    let mut got = vec![0u8; 700];
    p.data.read(4000, &mut got).unwrap();
    assert_eq!(got, w);
    let stats = p.hw.r.fw().hca_stats();
    assert!(stats.tx_packets > 0 && stats.rx_packets > 0, "{stats:?}");
    assert_eq!(stats.rx_bad_icrc, 0, "{stats:?}");
    let _ = (&p.ceq, p.emu_ip, &p.peer.dev);
}

#[test]
fn bad_lkey_is_a_local_protection_error_then_flushes() {
    let mut p = pair();
    let rkey = p.peer.mr.rkey().get();
    let raddr = p.peer.mr.addr();
    // A good WRITE, then one with an lkey whose key byte is wrong, then one more.
    let good = p.qp.post(
        &p.hw,
        WqeOpcode::RdmaWrite,
        true,
        &[raddr_seg(raddr, rkey), data_seg(16, p.lkey, VA)],
    );
    let bad = p.qp.post(
        &p.hw,
        WqeOpcode::RdmaWrite,
        false,
        &[raddr_seg(raddr, rkey), data_seg(16, p.lkey ^ 1, VA)],
    );
    let later = p.qp.post(
        &p.hw,
        WqeOpcode::RdmaWrite,
        true,
        &[raddr_seg(raddr, rkey), data_seg(16, p.lkey, VA)],
    );
    let c1 = p.cq.expect();
    assert_eq!(
        (opcode(&c1), Cqe64::new_unchecked(&c1[..]).wqe_counter()),
        (CqeOpcode::Req, u32::from(good))
    );
    let c2 = p.cq.expect();
    assert_eq!(opcode(&c2), CqeOpcode::ReqErr, "{c2:x?}");
    assert_eq!(syndrome(&c2), CqeSyndrome::LocalProt);
    assert_eq!(ErrCqe::new_unchecked(&c2[..]).wqe_counter(), u32::from(bad));
    let c3 = p.cq.expect();
    assert_eq!(
        (opcode(&c3), syndrome(&c3)),
        (CqeOpcode::ReqErr, CqeSyndrome::WrFlushed)
    );
    assert_eq!(
        ErrCqe::new_unchecked(&c3[..]).wqe_counter(),
        u32::from(later)
    );
    assert_eq!(p.qp.state(&p.hw), 6, "ERR");
    // Posted later still: flushed at once.
    let after =
        p.qp.post(&p.hw, WqeOpcode::Send, false, &[data_seg(8, p.lkey, VA)]);
    let c4 = p.cq.expect();
    assert_eq!(
        (syndrome(&c4), ErrCqe::new_unchecked(&c4[..]).wqe_counter()),
        (CqeSyndrome::WrFlushed, u32::from(after))
    );
}

#[test]
fn malformed_wqe_and_dma_fault_are_error_cqes() {
    let mut p = pair();
    // Unknown opcode 0x13: local QP operation error, QP to ERR.
    let idx = p.qp.post(
        &p.hw,
        WqeOpcode::from_raw(0x13),
        true,
        &[data_seg(8, p.lkey, VA)],
    );
    let c = p.cq.expect();
    assert_eq!(
        (opcode(&c), syndrome(&c)),
        (CqeOpcode::ReqErr, CqeSyndrome::LocalQpOp)
    );
    assert_eq!(ErrCqe::new_unchecked(&c[..]).wqe_counter(), u32::from(idx));
    assert_eq!(p.qp.state(&p.hw), 6);
    assert!(p.hw.r.fw().hca_stats().wqe_errors >= 1);

    // A second QP, RTS, with an SGE in a PA-mode MKey over unmapped IOVA: DMA fault.
    let mut c = cmd(CmdOpcode::CreateMkey, 0, 0x110);
    let mut v = CreateMkeyIn::new_unchecked(&mut c[..]);
    let mut m = v.memory_key_mkey_entry_mut();
    m.set_lr(1).unwrap();
    m.set_lw(1).unwrap();
    m.set_length64(1).unwrap();
    m.set_qpn(0xff_ffff).unwrap();
    m.set_pd(p.hw.pd).unwrap();
    let out = p.hw.r.ok(&c, OUT);
    let pa_key = CreateMkeyOut::new_unchecked(&out[..]).mkey_index() << 8;
    let mut qp2 = EmuQp::create(&mut p.hw, &p.cq, QpServiceType::Rc);
    let IpAddr::V4(e) = p.emu_ip else { panic!() };
    let o = e.octets();
    let pip = IpAddr::V4(Ipv4Addr::new(o[0], o[1], o[2], 3));
    let mut peer2 = Peer::new(pip);
    peer2.connect(qp2.qpn, p.emu_ip, 0x10, 0x20);
    qp2.connect(&p.hw, peer2.qp.qpn().get(), pip, 0x20, 0x10);
    let rkey = peer2.mr.rkey().get();
    let idx = qp2.post(
        &p.hw,
        WqeOpcode::RdmaWrite,
        true,
        &[
            raddr_seg(peer2.mr.addr(), rkey),
            data_seg(64, pa_key, 0xdead_0000_0000),
        ],
    );
    let c = p.cq.expect();
    assert_eq!(
        (opcode(&c), syndrome(&c)),
        (CqeOpcode::ReqErr, CqeSyndrome::LocalProt),
        "{c:x?}"
    );
    assert_eq!(ErrCqe::new_unchecked(&c[..]).qpn(), qp2.qpn);
    assert_eq!(ErrCqe::new_unchecked(&c[..]).wqe_counter(), u32::from(idx));
    assert!(p.hw.r.fw().hca_stats().dma_faults >= 1);
}

#[test]
fn cq_arm_raises_a_completion_eqe_and_msix() {
    let mut p = pair();
    let (eqn, eq_ring) = (p.ceq.0, p.ceq.1.clone());
    let _ = p.hw.vectors[1].take();
    // Arm: sn 0, cmd 0 (next completion), ci 0.
    p.hw.uar_write64(0x20, u64::from(p.cq.cqn));
    // Arm the EQ (consumer index 0).
    p.hw.uar_write32(0x40, eqn << 24);
    let rkey = p.peer.mr.rkey().get();
    p.qp.post(
        &p.hw,
        WqeOpcode::RdmaWrite,
        true,
        &[raddr_seg(p.peer.mr.addr(), rkey), data_seg(8, p.lkey, VA)],
    );
    assert_eq!(opcode(&p.cq.expect()), CqeOpcode::Req);
    assert!(
        p.hw.vectors[1]
            .wait(Duration::from_secs(5))
            .unwrap()
            .is_some(),
        "MSI-X vector 1 fired"
    );
    let mut e = [0u8; 64];
    eq_ring.read(0, &mut e).unwrap();
    let v = Eqe::new_unchecked(&e[..]);
    assert_eq!(v.event_type(), u32::from(EventType::Completion.as_raw()));
    assert_eq!(v.owner(), 0, "first pass: owner 0");
    assert_eq!(v.comp_event().cq_number(), p.cq.cqn);
    // Not re-armed: a second completion writes no EQE.
    p.qp.post(
        &p.hw,
        WqeOpcode::RdmaWrite,
        true,
        &[raddr_seg(p.peer.mr.addr(), rkey), data_seg(8, p.lkey, VA)],
    );
    assert_eq!(opcode(&p.cq.expect()), CqeOpcode::Req);
    eq_ring.read(64, &mut e).unwrap();
    assert_eq!(e[63], 1, "no second EQE");
    // Arming with a stale consumer index fires at once (CQEs beyond it exist).
    p.hw.uar_write32(0x40, (eqn << 24) | 1);
    p.hw.uar_write64(0x20, (((1u64 << 28) | 1) << 32) | u64::from(p.cq.cqn));
    assert!(
        p.hw.vectors[1]
            .wait(Duration::from_secs(5))
            .unwrap()
            .is_some()
    );
}

#[test]
fn command_completions_and_page_requests_are_eqes() {
    let mut hw = Hw::new();
    let mask = (1u64 << EventType::Cmd.as_raw()) | (1 << EventType::PageRequest.as_raw());
    let (eqn, ring) = hw.eq(7, 0, mask);
    let _ = hw.vectors[0].take();
    // The CREATE_EQ itself completed while the EQ existed: its EQE (slot 0) is the first.
    let mut e = [0u8; 64];
    ring.read(0, &mut e).unwrap();
    let v = Eqe::new_unchecked(&e[..]);
    assert_eq!(v.event_type(), u32::from(EventType::Cmd.as_raw()));
    assert_eq!(v.cmd_inter_comp_event().command_completion_vector(), 1);
    hw.uar_write32(0x40, (eqn << 24) | 1);
    // A NOP on slot 3: its completion EQE names bit 3, and the armed EQ interrupts.
    let out =
        hw.r.exec_on(
            3,
            &cmd(CmdOpcode::Nop, 0, 0x10),
            OUT,
            Default::default(),
            Duration::from_secs(5),
        )
        .out();
    assert_eq!(status(&out), (0, 0));
    assert!(
        hw.vectors[0]
            .wait(Duration::from_secs(5))
            .unwrap()
            .is_some()
    );
    ring.read(64, &mut e).unwrap();
    let v = Eqe::new_unchecked(&e[..]);
    assert_eq!(v.event_type(), u32::from(EventType::Cmd.as_raw()));
    assert_eq!(v.owner(), 0);
    assert_eq!(v.cmd_inter_comp_event().command_completion_vector(), 1 << 3);
    assert!(hw.r.fw().stats().command_events >= 2);
    // The firmware asks for 5 pages at run time.
    hw.uar_write32(0x40, (eqn << 24) | 2);
    assert!(hw.r.fw().faults().request_pages(5));
    assert!(
        hw.vectors[0]
            .wait(Duration::from_secs(5))
            .unwrap()
            .is_some()
    );
    ring.read(128, &mut e).unwrap();
    let v = Eqe::new_unchecked(&e[..]);
    assert_eq!(v.event_type(), u32::from(EventType::PageRequest.as_raw()));
    assert_eq!(v.pages_req_event().num_pages() as i32, 5);
    assert_eq!(query_pages(&hw.r, query_pages_op_mod::REGULAR), 5);
    let extra: Vec<u64> = (48..53).map(|i| hw.pages.iter_page(i)).collect();
    give(&hw.r, &extra);
    assert_eq!(query_pages(&hw.r, query_pages_op_mod::REGULAR), 0);
    // And wants 2 back.
    assert!(hw.r.fw().faults().request_pages(-2));
    assert_eq!(query_pages(&hw.r, query_pages_op_mod::REGULAR), -2);
}

#[test]
fn object_checks_and_teardown_accounting() {
    let (emu_ip, _) = ip_pair();
    let mut hw = Hw::new();
    let (st, synd) = hw.set_gid(0, emu_ip);
    assert_eq!((st, synd), (0, 0));
    // Refusals: another MAC, RoCE v1, an address of no local interface.
    let IpAddr::V4(e4) = emu_ip else { panic!() };
    let o = e4.octets();
    let other = IpAddr::V4(Ipv4Addr::new(o[0], o[1], o[2], 9));
    assert_eq!(
        hw.set_gid_with(1, other, [2, 0, 0, 0, 0, 1], 2),
        (CmdStatus::BadParam.as_raw(), syn::GID_MAC)
    );
    assert_eq!(
        hw.set_gid_with(1, other, MAC, 0),
        (CmdStatus::BadParam.as_raw(), syn::GID_VERSION)
    );
    let nowhere = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 77));
    assert_eq!(
        hw.set_gid(1, nowhere),
        (CmdStatus::BadParam.as_raw(), syn::GID_BIND)
    );
    // QUERY_ROCE_ADDRESS returns what was set.
    let mut q = cmd(CmdOpcode::QueryRoceAddress, 0, 0x10);
    rnic_mlx5_prm::QueryRoceAddressIn::new_unchecked(&mut q[..])
        .set_roce_address_index(0)
        .unwrap();
    let out = hw.r.ok(&q, 0x30);
    let o = rnic_mlx5_prm::QueryRoceAddressOut::new_unchecked(&out[..]);
    let l = o.roce_address();
    assert_eq!(l.source_l3_address(), &rnic_core::Gid::from_ipv4(e4).0[..]);
    assert_eq!((l.roce_version(), l.roce_l3_type()), (2, 0));
    // Index out of range, and a CQ on a missing EQ.
    let mut c = cmd(CmdOpcode::SetRoceAddress, 0, 0x30);
    SetRoceAddressIn::new_unchecked(&mut c[..])
        .set_roce_address_index(300)
        .unwrap();
    assert_eq!(
        hw.r.err(&c, OUT),
        (CmdStatus::BadParam.as_raw(), syn::GID_INDEX)
    );
    let mut c = cmd(CmdOpcode::CreateCq, 0, 0x118);
    CreateCqIn::new_unchecked(&mut c[..])
        .cq_context_mut()
        .set_c_eqn_or_apu_element(9)
        .unwrap();
    CreateCqIn::new_unchecked(&mut c[..])
        .cq_context_mut()
        .set_uar_page(hw.uar)
        .unwrap();
    assert_eq!(
        hw.r.err(&c, OUT),
        (CmdStatus::BadRes.as_raw(), syn::EQ_NOT_FOUND)
    );
    let (eqn, _) = hw.eq(6, 1, 0);
    let mut cq = hw.cq(eqn);
    let data = hw.buf(4096);
    let key = hw.mkey(&data, VA, &["lw"]);
    let qp = EmuQp::create(&mut hw, &cq, QpServiceType::Rc);
    // Illegal transition: RTR2RTS from RST.
    assert_eq!(
        qp.modify(&hw, CmdOpcode::Rtr2RtsQp, |_| {}),
        (CmdStatus::BadQpState.as_raw(), syn::QP_STATE)
    );
    // DESTROY_CQ while the QP names it; DEALLOC_PD while objects use it; TEARDOWN with objects.
    let mut d = cmd(CmdOpcode::DestroyCq, 0, 0x10);
    d[0x09..0x0c].copy_from_slice(&cq.cqn.to_be_bytes()[1..]);
    assert_eq!(
        hw.r.err(&d, OUT),
        (CmdStatus::BadResState.as_raw(), syn::CQ_IN_USE)
    );
    let mut dp = cmd(CmdOpcode::DeallocPd, 0, 0x10);
    dp[0x09..0x0c].copy_from_slice(&hw.pd.to_be_bytes()[1..]);
    assert_eq!(
        hw.r.err(&dp, OUT),
        (CmdStatus::BadResState.as_raw(), syn::RESOURCE_IN_USE)
    );
    let a = hw.r.fw().accounting();
    assert_eq!((a.eqs, a.cqs, a.qps, a.mkeys, a.gids), (1, 1, 1, 1, 1));
    // A UD QP's flushes: 2ERR with a posted receive gives a flush CQE.
    let mut ud = EmuQp::create(&mut hw, &cq, QpServiceType::Ud);
    assert_eq!(
        ud.modify(&hw, CmdOpcode::Rst2InitQp, |q| q.set_q_key(0x1111).unwrap()),
        (0, 0)
    );
    ud.post_recv(VA, 64, key);
    assert_eq!(ud.modify(&hw, CmdOpcode::Qp2Err, |_| {}), (0, 0));
    let c = cq.expect();
    assert_eq!(
        (opcode(&c), syndrome(&c)),
        (CqeOpcode::RespErr, CqeSyndrome::WrFlushed)
    );

    // Clean teardown: QPs, MKey, CQ, EQ, PD, UAR, GID cleared by TEARDOWN_HCA, pages back.
    for q in [&qp, &ud] {
        let mut c = cmd(CmdOpcode::DestroyQp, 0, 0x10);
        c[0x09..0x0c].copy_from_slice(&q.qpn.to_be_bytes()[1..]);
        hw.r.ok(&c, OUT);
    }
    let mut c = cmd(CmdOpcode::DestroyMkey, 0, 0x10);
    c[0x09..0x0c].copy_from_slice(&(key >> 8).to_be_bytes()[1..]);
    hw.r.ok(&c, OUT);
    hw.r.ok(&d, OUT);
    let mut c = cmd(CmdOpcode::DestroyEq, 0, 0x10);
    c[0x0b] = eqn as u8;
    hw.r.ok(&c, OUT);
    hw.r.ok(&dp, OUT);
    let mut c = cmd(CmdOpcode::DeallocUar, 0, 0x10);
    c[0x09..0x0c].copy_from_slice(&hw.uar.to_be_bytes()[1..]);
    hw.r.ok(&c, OUT);
    hw.r.ok(&cmd(CmdOpcode::TeardownHca, 0, 0x10), OUT);
    assert!(
        hw.r.fw().bound_addresses().is_empty(),
        "GIDs unbound at teardown"
    );
    let mut t = cmd(CmdOpcode::ManagePages, manage_pages_op_mod::TAKE, 0x10);
    ManagePagesIn::new_unchecked(&mut t[..])
        .set_input_num_entries(64)
        .unwrap();
    hw.r.ok(&t, 0x10 + 8 * 64);
    hw.r.ok(&cmd(CmdOpcode::DisableHca, 0, 0x10), OUT);
    assert_eq!(hw.r.fw().phase(), Phase::Disabled);
    drop((qp, ud, cq, data));
    let Hw {
        r,
        pages,
        bufs,
        vectors,
        ..
    } = hw;
    drop((pages, bufs, vectors));
    let Rig {
        emu,
        f,
        cmdq,
        inbox,
        outbox,
        ..
    } = r;
    drop((cmdq, inbox, outbox));
    drop(f);
    let fw = emu.firmware().unwrap().clone();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !fw.accounting().is_clean() {
        assert!(
            Instant::now() < deadline,
            "left behind: {:?}",
            fw.accounting()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn write_imm_from_the_peer_and_cq_overrun() {
    let mut p = pair();
    // RDMA WRITE with immediate from the peer: RESP_WR_IMM on the receive WQE.
    let ridx = p.qp.post_recv(VA, 0, p.lkey);
    let w = pattern(300, 5);
    p.peer.mem.write(0, &w).unwrap();
    let sge = [Sge::new(p.peer.mr.addr(), 300, p.peer.mr.lkey())];
    p.peer
        .qp
        .post_send(&[SendWr {
            wr_id: 1,
            op: SendOp::RdmaWriteWithImm {
                remote_addr: VA + 5000,
                rkey: rnic_core::Rkey(p.lkey),
                imm: 0xfeed_beef,
            },
            sg_list: &sge,
            flags: SendFlags::SIGNALED,
            ud: None,
        }])
        .unwrap();
    let c = p.cq.expect();
    let v = Cqe64::new_unchecked(&c[..]);
    assert_eq!(opcode(&c), CqeOpcode::RespWrImm, "{c:x?}");
    assert_eq!((v.imm_inval_pkey(), v.byte_cnt()), (0xfeed_beef, 300));
    assert_eq!(v.wqe_counter(), u32::from(ridx));
    let mut got = vec![0u8; 300];
    p.data.read(5000, &mut got).unwrap();
    assert_eq!(got, w);

    // 64 signaled NOPs fill the 64-entry CQ (set_ci not advanced); the 65th overruns it:
    // not written, a CQ error EQE instead.
    let first = p.cq.ci;
    for _ in 0..64 {
        p.qp.post(&p.hw, WqeOpcode::Nop, true, &[]);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while p.hw.r.fw().hca_stats().cqes < u64::from(first) + 64 {
        assert!(Instant::now() < deadline, "{:?}", p.hw.r.fw().hca_stats());
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut slot0 = [0u8; 64];
    p.cq.ring
        .read(((first & 63) as usize) * 64, &mut slot0)
        .unwrap();
    p.qp.post(&p.hw, WqeOpcode::Nop, true, &[]);
    let deadline = Instant::now() + Duration::from_secs(5);
    while p.hw.r.fw().hca_stats().cq_overruns == 0 {
        assert!(Instant::now() < deadline, "{:?}", p.hw.r.fw().hca_stats());
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut again = [0u8; 64];
    p.cq.ring
        .read(((first & 63) as usize) * 64, &mut again)
        .unwrap();
    assert_eq!(again, slot0, "never written past the ring");
    let mut e = [0u8; 64];
    let found = (0..128).any(|i| {
        p.aeq.1.read(i * 64, &mut e).unwrap();
        let v = Eqe::new_unchecked(&e[..]);
        v.event_type() == u32::from(EventType::CqError.as_raw())
            && v.cq_error().cqn() == p.cq.cqn
            && v.cq_error().syndrome() == 1
    });
    assert!(found, "CQ error EQE on the async EQ");
}

#[test]
fn ud_both_ways_against_rxe() {
    let (emu_ip, peer_ip) = ip_pair();
    let mut hw = Hw::new();
    assert_eq!(hw.set_gid(0, emu_ip), (0, 0));
    let ceq = hw.eq(6, 1, 0);
    let mut cq = hw.cq(ceq.0);
    let data = hw.buf(4 * 4096);
    let lkey = hw.mkey(&data, VA, &["lw"]);
    let mut qp = EmuQp::create(&mut hw, &cq, QpServiceType::Ud);
    let qkey = 0x1111_1111;
    assert_eq!(
        qp.modify(&hw, CmdOpcode::Rst2InitQp, |q| q.set_q_key(qkey).unwrap()),
        (0, 0)
    );
    assert_eq!(qp.modify(&hw, CmdOpcode::Init2RtrQp, |_| {}), (0, 0));
    assert_eq!(
        qp.modify(&hw, CmdOpcode::Rtr2RtsQp, |q| q
            .set_next_send_psn(5)
            .unwrap()),
        (0, 0)
    );
    let mut peer = Peer::with(peer_ip, QpType::Ud);
    let IpAddr::V4(e4) = emu_ip else { panic!() };
    let IpAddr::V4(p4) = peer_ip else { panic!() };
    peer.qp
        .to_init(&InitParams {
            qkey,
            ..InitParams::default()
        })
        .unwrap();
    peer.qp
        .to_rtr(
            rnic_core::Qpn::from_wire(0),
            Psn::from_wire(0),
            rnic_core::Gid::from_ipv4(e4),
            &RtrParams {
                path_mtu: Mtu::Mtu1024,
                ..RtrParams::default()
            },
        )
        .unwrap();
    peer.qp
        .to_rts(Psn::from_wire(0x22), &RtsParams::default())
        .unwrap();

    // Emulator → peer: ctrl + datagram segment (3 DS) + one data segment.
    let msg = pattern(500, 21);
    data.write(0, &msg).unwrap();
    let rsge = [Sge::new(peer.mr.addr(), 40 + 1024, peer.mr.lkey())];
    peer.qp
        .post_recv(&[rnic_core::RecvWr {
            wr_id: 3,
            sg_list: &rsge,
        }])
        .unwrap();
    let mut av = [0u8; 48];
    {
        let mut v = rnic_mlx5_prm::UdAdrsVector::new_unchecked(&mut av[..]);
        v.set_q_key(qkey).unwrap();
        v.set_destination_qp_dct(peer.qp.qpn().get()).unwrap();
        v.set_hop_limit(64).unwrap();
        v.set_src_addr_index(0).unwrap();
        v.set_rgid_rip(&rnic_core::Gid::from_ipv4(p4).0).unwrap();
    }
    let mut segs = [[0u8; 16]; 4];
    for (i, s) in segs.iter_mut().take(3).enumerate() {
        s.copy_from_slice(&av[i * 16..i * 16 + 16]);
    }
    segs[3] = data_seg(500, lkey, VA);
    let idx = qp.post(&hw, WqeOpcode::Send, true, &segs);
    let c = cq.expect();
    assert_eq!(opcode(&c), CqeOpcode::Req, "{c:x?}");
    assert_eq!(Cqe64::new_unchecked(&c[..]).wqe_counter(), u32::from(idx));
    let wc = peer.wait(1);
    assert_eq!(wc[0].status, WcStatus::Success);
    assert_eq!(wc[0].src_qp.get(), qp.qpn);
    assert_eq!(wc[0].byte_len, 540);
    assert_eq!(peer.bytes(40, 500), msg);

    // Peer → emulator: the GRH area first, then the payload; source QPN in the CQE.
    let ridx = qp.post_recv(VA + 4096, 40 + 1024, lkey);
    let back = pattern(700, 33);
    peer.mem.write(8192, &back).unwrap();
    let sge = [Sge::new(peer.mr.addr() + 8192, 700, peer.mr.lkey())];
    peer.qp
        .post_send(&[SendWr {
            wr_id: 4,
            op: SendOp::SendWithImm { imm: 0xabc },
            sg_list: &sge,
            flags: SendFlags::SIGNALED,
            ud: Some(rnic_core::UdDest {
                av: rnic_core::AddressVector::new(rnic_core::Gid::from_ipv4(e4)),
                remote_qpn: rnic_core::Qpn::from_wire(qp.qpn),
                remote_qkey: qkey,
            }),
        }])
        .unwrap();
    let c = cq.expect();
    let v = Cqe64::new_unchecked(&c[..]);
    assert_eq!(opcode(&c), CqeOpcode::RespSendImm, "{c:x?}");
    assert_eq!(
        (v.byte_cnt(), v.imm_inval_pkey(), v.rqpn()),
        (740, 0xabc, peer.qp.qpn().get())
    );
    assert_eq!((v.wqe_counter(), v.g()), (u32::from(ridx), 1));
    let mut got = vec![0u8; 700];
    data.read(4096 + 40, &mut got).unwrap();
    assert_eq!(got, back);
}

/// xorshift64*: deterministic noise for the hostile-driver tests.
struct Noise(u64);

impl Noise {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn fill(&mut self, b: &mut [u8]) {
        for x in b.iter_mut() {
            *x = self.next() as u8;
        }
    }
}

#[test]
fn hostile_command_bytes_never_crash_the_firmware() {
    let hw = Hw::new();
    let mut n = Noise(0x9e37_79b9_7f4a_7c15);
    let ops = [
        CmdOpcode::SetRoceAddress,
        CmdOpcode::QueryRoceAddress,
        CmdOpcode::CreateEq,
        CmdOpcode::DestroyEq,
        CmdOpcode::CreateCq,
        CmdOpcode::DestroyCq,
        CmdOpcode::CreateMkey,
        CmdOpcode::DestroyMkey,
        CmdOpcode::CreateQp,
        CmdOpcode::DestroyQp,
        CmdOpcode::Rst2InitQp,
        CmdOpcode::Init2RtrQp,
        CmdOpcode::Rtr2RtsQp,
        CmdOpcode::Qp2Err,
        CmdOpcode::Qp2Rst,
        CmdOpcode::QueryQp,
    ];
    for op in ops {
        for _ in 0..40 {
            let mut c = vec![0u8; 0x110 + 8 * (n.next() % 8) as usize];
            n.fill(&mut c);
            let mut h = rnic_mlx5_prm::MboxIn::new_unchecked(&mut c[..]);
            h.set_opcode(op.as_raw().into()).unwrap();
            h.set_uid(0).unwrap();
            let out = hw.r.exec(&c, 0x110 + 16);
            assert!(
                matches!(out, common::Reply::Done(_)),
                "{op}: no completion: {out:?}"
            );
        }
    }
    // Still serving.
    assert_eq!(status(&hw.r.ok(&cmd(CmdOpcode::Nop, 0, 0x10), OUT)), (0, 0));
}

#[test]
fn hostile_wqes_and_doorbells_never_crash_the_data_path() {
    let mut p = pair();
    let mut n = Noise(0x1234_5678_9abc_def1);
    for round in 0..200 {
        // Random ring contents, random counters, random doorbells of every kind.
        let mut junk = vec![0u8; 2 * 4096];
        n.fill(&mut junk);
        p.qp.wq.write(0, &junk).unwrap();
        let mut dbr = [0u8; 8];
        n.fill(&mut dbr);
        p.qp.dbr.write(0, &dbr).unwrap();
        let v = n.next();
        let off = [0x20usize, 0x800, 0x900, 0xa00][round % 4];
        p.hw.uar_write64(off, (v & !0xffff_ff00) | (u64::from(p.qp.qpn) << 8));
        p.hw.uar_write32(0x40 + 8 * (round % 2), n.next() as u32);
        if round % 50 == 0 {
            // A peer SEND lands on whatever the RQ holds.
            let sge = [Sge::new(p.peer.mr.addr(), 64, p.peer.mr.lkey())];
            let _ = p.peer.qp.post_send(&[SendWr {
                wr_id: round as u64,
                op: SendOp::Send,
                sg_list: &sge,
                flags: SendFlags::SIGNALED,
                ud: None,
            }]);
        }
    }
    std::thread::sleep(Duration::from_millis(50));
    // Still serving commands; the QP answers QUERY_QP (in whatever state it ended).
    assert_eq!(
        status(&p.hw.r.ok(&cmd(CmdOpcode::Nop, 0, 0x10), OUT)),
        (0, 0)
    );
    let st = p.qp.state(&p.hw);
    assert!(st <= 7, "{st}");
    let stats = p.hw.r.fw().hca_stats();
    assert!(
        stats.wqe_errors + stats.bad_doorbells + stats.cqes > 0,
        "{stats:?}"
    );
}

#[test]
fn a_silent_peer_exhausts_the_retries_on_the_engine_timers() {
    let mut p = pair();
    // The peer drops everything from now on: no ACKs. ack_timeout 14 (~67 ms), retry_count 7
    // (seven retries, not infinite) → TRANSPORT_RETRY_EXCEEDED after ~0.5 s.
    p.peer.qp.to_error().unwrap();
    let rkey = p.peer.mr.rkey().get();
    let idx = p.qp.post(
        &p.hw,
        WqeOpcode::RdmaWrite,
        true,
        &[raddr_seg(p.peer.mr.addr(), rkey), data_seg(32, p.lkey, VA)],
    );
    let c = p.cq.expect();
    assert_eq!(opcode(&c), CqeOpcode::ReqErr, "{c:x?}");
    assert_eq!(syndrome(&c), CqeSyndrome::TransportRetryExceeded);
    assert_eq!(ErrCqe::new_unchecked(&c[..]).wqe_counter(), u32::from(idx));
    assert_eq!(p.qp.state(&p.hw), 6, "ERR after the transport error");
}
