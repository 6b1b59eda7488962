//! The driver's objects and data path end to end: `Hca` + event queue +
//! `Mkey` + `Cq` + `Qp` over vfio-user against rnic-mlx5-emu, talking RoCEv2
//! (UDP/4791 on 127.x addresses) to an rnic-rxe peer.
#![allow(clippy::unwrap_used)]

mod common;
use common::emulator;
use common::peer::{ALL, Peer, ip_pair, pattern, v4};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rnic_core::{
    AddressVector, InitParams, Memory, Mtu, Psn, QpType, RecvWr, RtrParams, RtsParams, SendFlags,
    SendOp, SendWr, Sge, UdDest, WcFlags, WcOpcode, WcStatus, WorkCompletion,
};
use rnic_mlx5::{
    Cq, Hca, HcaOptions, Mkey, Mlx5Error, PciFunction, PostFailure, Qp, QpOptions, Refused,
    VfioUserFunction,
};
use rnic_mlx5_emu::{Bar0Mapping, Emulator, Options};
use rnic_mlx5_prm::{HealthSyndrome, QpState};

/// Emulator, driver objects and a connected RC pair.
struct Rig {
    peer: Peer,
    /// QPs (each on a CQ of its own) made before `qp`, holding BlueFlame
    /// registers ([`rig_after`]); dropped first.
    holders: Vec<(Qp, Cq)>,
    qp: Qp,
    cq: Cq,
    mkey: Mkey,
    hca: Arc<Hca>,
    emu: Emulator,
    _dir: tempfile::TempDir,
}

const EMU_PSN: u32 = 0x1000;
const PEER_PSN: u32 = 0xab_cdef;

fn hca_options() -> HcaOptions {
    HcaOptions {
        pre_init_timeout: Duration::from_secs(10),
        cmd_timeout: Some(Duration::from_secs(5)),
        ..HcaOptions::default()
    }
}

fn up() -> (Emulator, tempfile::TempDir, Arc<Hca>) {
    up_with(Bar0Mapping::Uc)
}

/// An emulated function whose BAR0 is `bar0` (the default emulator's is
/// uncached, as kernel VFIO maps one), brought up with its event queue.
fn up_with(bar0: Bar0Mapping) -> (Emulator, tempfile::TempDir, Arc<Hca>) {
    let (emu, dir) = common::emulator_with(Options {
        bar0,
        ..Options::default()
    });
    let f: Arc<dyn PciFunction> = Arc::new(VfioUserFunction::connect(emu.socket()).unwrap());
    let mut hca = Hca::bring_up(f, hca_options()).unwrap();
    hca.enable_events().unwrap();
    assert!(hca.cmdq().event_mode());
    (emu, dir, Arc::new(hca))
}

fn rig() -> Rig {
    rig_after(0)
}

/// [`rig`], with `holders` QPs made first (unconnected, each on a CQ of its
/// own): the first ones take the function's exclusive BlueFlame registers.
fn rig_after(holders: usize) -> Rig {
    rig_with(Bar0Mapping::Uc, holders)
}

/// [`rig_after`] on an emulated BAR0 of `bar0`.
fn rig_with(bar0: Bar0Mapping, holders: usize) -> Rig {
    let (emu_ip, peer_ip) = ip_pair(231);
    let (emu, dir, hca) = up_with(bar0);
    let gid = hca.set_gid(0, emu_ip).unwrap();
    assert_eq!(gid, v4(emu_ip));
    let holders = (0..holders)
        .map(|_| {
            let mut cq = Cq::new(&hca, 256).unwrap();
            let qp = Qp::new(&hca, &mut cq, None, QpOptions::default()).unwrap();
            (qp, cq)
        })
        .collect();
    let mut cq = Cq::new(&hca, 256).unwrap();
    let buf = hca.function().alloc_dma(16 * 4096).unwrap();
    let mkey = Mkey::new(&hca, buf, ALL).unwrap();
    let mut qp = Qp::new(
        &hca,
        &mut cq,
        None,
        QpOptions {
            max_send_sge: 4,
            max_recv_sge: 4,
            ..QpOptions::default()
        },
    )
    .unwrap();
    qp.use_region(&mkey);
    let mut peer = Peer::new(peer_ip);
    let rtr = RtrParams {
        path_mtu: Mtu::Mtu1024,
        max_dest_rd_atomic: 16,
        ..RtrParams::default()
    };
    let rts = RtsParams {
        max_rd_atomic: 16,
        ..RtsParams::default()
    };
    let init = InitParams {
        access: ALL,
        ..InitParams::default()
    };
    peer.qp.to_init(&init).unwrap();
    peer.qp
        .to_rtr(qp.qpn(), Psn::from_wire(EMU_PSN), v4(emu_ip), &rtr)
        .unwrap();
    peer.qp.to_rts(Psn::from_wire(PEER_PSN), &rts).unwrap();
    qp.connect(
        &init,
        peer.qp.qpn(),
        v4(peer_ip),
        Psn::from_wire(PEER_PSN),
        Psn::from_wire(EMU_PSN),
        &rtr,
        &rts,
    )
    .unwrap();
    assert_eq!(qp.state(), QpState::Rts);
    assert_eq!(qp.query_state().unwrap(), QpState::Rts);
    Rig {
        peer,
        holders,
        qp,
        cq,
        mkey,
        hca,
        emu,
        _dir: dir,
    }
}

impl Rig {
    fn wait(&mut self, n: usize) -> Vec<WorkCompletion> {
        common::wait_cq(&mut self.cq, n)
    }

    /// The next send completion through the direct poll (`Cq::poll_send`).
    fn wait_send(&mut self) -> rnic_mlx5::SendCompletion {
        let start = Instant::now();
        loop {
            if let Some(c) = self.cq.poll_send() {
                return c;
            }
            assert!(start.elapsed() < Duration::from_secs(10), "timed out");
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    fn sge(&self, off: u64, len: u32) -> Sge {
        Sge::new(self.mkey.addr() + off, len, self.mkey.lkey())
    }

    fn local(&self, off: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.mkey.memory().read(off, &mut v).unwrap();
        v
    }

    fn teardown_is_clean(self) {
        let Rig {
            peer,
            holders,
            qp,
            cq,
            mkey,
            hca,
            emu,
            _dir,
        } = self;
        drop(holders);
        drop((qp, cq, mkey));
        let hca = Arc::into_inner(hca).expect("nothing else holds the Hca");
        hca.shutdown().unwrap();
        let acc = emu.accounting().unwrap();
        assert!(acc.is_clean(), "{acc:?}");
        drop(peer);
    }
}

#[test]
fn rc_write_read_send_write_imm_and_atomics_byte_exact() {
    let mut r = rig();
    let raddr = r.peer.mr.addr();
    let rkey = r.peer.mr.rkey();

    // WRITE 3000 bytes (crossing a page of the MTT), unsignaled, then a signaled one.
    let src = pattern(3000, 7);
    r.mkey.memory().write(3000, &src).unwrap();
    let a = [r.sge(3000, 1000)];
    let b = [r.sge(4000, 2000)];
    let mut second = SendWr::rdma_write(2, &b, raddr + 1064, rkey);
    second.flags = SendFlags::SIGNALED;
    r.qp.post_send(&[SendWr::rdma_write(1, &a, raddr + 64, rkey), second])
        .unwrap();
    let wc = r.wait(1);
    assert_eq!(
        (wc[0].wr_id, wc[0].status, wc[0].opcode),
        (2, WcStatus::Success, WcOpcode::RdmaWrite)
    );
    assert_eq!(r.peer.bytes(64, 3000), src, "byte-exact at the peer");
    assert_eq!(r.peer.bytes(3064, 1), [0]);
    assert_eq!(
        r.qp.outstanding(),
        (0, 0),
        "the unsignaled WRITE retired too"
    );

    // Inline WRITE of 8 bytes (BlueFlame).
    r.mkey.memory().write(0, b"8 bytes!").unwrap();
    let s = [r.sge(0, 8)];
    let mut w = SendWr::rdma_write(3, &s, raddr + 5000, rkey);
    w.flags = SendFlags::INLINE | SendFlags::SIGNALED;
    r.qp.post_send(&[w]).unwrap();
    assert_eq!(r.wait(1)[0].status, WcStatus::Success);
    assert_eq!(r.peer.bytes(5000, 8), b"8 bytes!");
    // An uncached BAR0 (kernel VFIO's mapping): an 8-byte doorbell, never a
    // BlueFlame copy (audit row 4).
    assert_eq!(r.qp.counters().blueflame, 0);
    assert!(r.qp.counters().doorbells >= 1);

    // READ 2048 bytes of the peer.
    let remote = pattern(2048, 11);
    r.peer.mem.write(16384, &remote).unwrap();
    let d = [r.sge(12288, 2048)];
    let mut rd = SendWr::rdma_read(4, &d, raddr + 16384, rkey);
    rd.flags = SendFlags::SIGNALED;
    r.qp.post_send(&[rd]).unwrap();
    let wc = r.wait(1)[0];
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.byte_len),
        (4, WcStatus::Success, WcOpcode::RdmaRead, 2048)
    );
    assert_eq!(r.local(12288, 2048), remote);

    // SEND from the peer into a receive, with immediate data.
    let rs = [r.sge(8192, 4096)];
    r.qp.post_recv(&[RecvWr::new(50, &rs)]).unwrap();
    let msg = pattern(1500, 3);
    r.peer.mem.write(8192, &msg).unwrap();
    let ps = [Sge::new(raddr + 8192, 1500, r.peer.mr.lkey())];
    r.peer
        .qp
        .post_send(&[SendWr {
            wr_id: 9,
            op: SendOp::SendWithImm { imm: 0x1234_5678 },
            sg_list: &ps,
            flags: SendFlags::SIGNALED,
            ud: None,
        }])
        .unwrap();
    let wc = r.wait(1)[0];
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.byte_len, wc.imm_data),
        (
            50,
            WcStatus::Success,
            WcOpcode::Recv,
            1500,
            Some(0x1234_5678)
        )
    );
    assert_eq!(r.local(8192, 1500), msg);
    assert_eq!(r.peer.wait(1)[0].status, WcStatus::Success);

    // SEND from us into the peer's receive.
    let pr = [Sge::new(raddr + 20000, 512, r.peer.mr.lkey())];
    r.peer.qp.post_recv(&[RecvWr::new(77, &pr)]).unwrap();
    let out = pattern(300, 5);
    r.mkey.memory().write(24000, &out).unwrap();
    let s = [r.sge(24000, 300)];
    let mut snd = SendWr::send(5, &s);
    snd.flags = SendFlags::SIGNALED;
    r.qp.post_send(&[snd]).unwrap();
    assert_eq!(r.wait(1)[0].opcode, WcOpcode::Send);
    let pw = r.peer.wait(1)[0];
    assert_eq!((pw.wr_id, pw.byte_len), (77, 300));
    assert_eq!(r.peer.bytes(20000, 300), out);

    // WRITE_IMM from the peer consumes our receive.
    r.qp.post_recv(&[RecvWr::new(51, &rs)]).unwrap();
    let wi = pattern(256, 17);
    r.peer.mem.write(30000, &wi).unwrap();
    let ps = [Sge::new(raddr + 30000, 256, r.peer.mr.lkey())];
    r.peer
        .qp
        .post_send(&[SendWr {
            wr_id: 10,
            op: SendOp::RdmaWriteWithImm {
                remote_addr: r.mkey.addr() + 40000,
                rkey: r.mkey.rkey(),
                imm: 0xfeed_f00d,
            },
            sg_list: &ps,
            flags: SendFlags::SIGNALED,
            ud: None,
        }])
        .unwrap();
    let wc = r.wait(1)[0];
    assert_eq!(
        (wc.wr_id, wc.opcode, wc.imm_data),
        (51, WcOpcode::RecvRdmaWithImm, Some(0xfeed_f00d))
    );
    assert_eq!(r.local(40000, 256), wi);
    r.peer.wait(1);

    // Our WRITE_IMM into the peer.
    let pr = [Sge::new(raddr + 20000, 64, r.peer.mr.lkey())];
    r.peer.qp.post_recv(&[RecvWr::new(78, &pr)]).unwrap();
    let s = [r.sge(24000, 100)];
    let mut w = SendWr::rdma_write_with_imm(6, &s, raddr + 45000, rkey, 0x0102_0304);
    w.flags = SendFlags::SIGNALED;
    r.qp.post_send(&[w]).unwrap();
    assert_eq!(r.wait(1)[0].status, WcStatus::Success);
    let pw = r.peer.wait(1)[0];
    assert_eq!((pw.wr_id, pw.imm_data), (78, Some(0x0102_0304)));
    assert_eq!(r.peer.bytes(45000, 100), out[..100]);

    // Fetch-and-add and compare-and-swap return the original value
    // (big-endian: no atomic endianness mode is set, mlx5.md §9.3).
    r.peer.mem.write(32768, &41u64.to_ne_bytes()).unwrap();
    let res = [r.sge(200, 8)];
    let mut fa = SendWr::new(
        7,
        SendOp::AtomicFetchAdd {
            remote_addr: raddr + 32768,
            rkey,
            add: 1,
        },
        &res,
    );
    fa.flags = SendFlags::SIGNALED;
    r.qp.post_send(&[fa]).unwrap();
    let wc = r.wait(1)[0];
    assert_eq!(
        (wc.opcode, wc.byte_len, wc.status),
        (WcOpcode::FetchAdd, 8, WcStatus::Success)
    );
    assert_eq!(u64::from_be_bytes(r.local(200, 8).try_into().unwrap()), 41);
    assert_eq!(
        u64::from_ne_bytes(r.peer.bytes(32768, 8).try_into().unwrap()),
        42
    );
    let res = [r.sge(208, 8)];
    let mut cs = SendWr::atomic_cmp_swap(8, &res, raddr + 32768, rkey, 42, 7);
    cs.flags = SendFlags::SIGNALED;
    r.qp.post_send(&[cs]).unwrap();
    assert_eq!(r.wait(1)[0].opcode, WcOpcode::CompSwap);
    assert_eq!(u64::from_be_bytes(r.local(208, 8).try_into().unwrap()), 42);
    assert_eq!(
        u64::from_ne_bytes(r.peer.bytes(32768, 8).try_into().unwrap()),
        7
    );

    let k = r.cq.counters();
    assert_eq!(
        (k.unknown_qpn, k.bad_wqe_counter, k.unknown_cqe),
        (0, 0, 0),
        "{k:?}"
    );
    r.teardown_is_clean();
}

#[test]
fn a_remote_access_error_completes_with_rem_access_err_then_flushes() {
    let mut r = rig();
    let raddr = r.peer.mr.addr();
    let s = [r.sge(0, 64)];
    let mut bad = SendWr::rdma_write(1, &s, raddr, rnic_core::Rkey(r.peer.mr.rkey().get() ^ 0x80));
    bad.flags = SendFlags::SIGNALED;
    let mut after = SendWr::rdma_write(2, &s, raddr, r.peer.mr.rkey());
    after.flags = SendFlags::SIGNALED;
    r.qp.post_send(&[bad, after]).unwrap();
    let wcs = r.wait(2);
    assert_eq!(
        (wcs[0].wr_id, wcs[0].status),
        (1, WcStatus::RemAccessErr),
        "{wcs:?}"
    );
    assert_ne!(wcs[0].vendor_err, u32::MAX);
    assert_eq!((wcs[1].wr_id, wcs[1].status), (2, WcStatus::WrFlushErr));
    assert_eq!(r.qp.query_state().unwrap(), QpState::Err);
    // Back to RST and usable for a new connection attempt.
    r.qp.to_reset().unwrap();
    assert_eq!(r.qp.query_state().unwrap(), QpState::Rst);
    r.teardown_is_clean();
}

#[test]
fn an_armed_cq_raises_a_completion_event() {
    let mut r = rig();
    assert!(
        !r.cq.wait_event(Duration::from_millis(50)).unwrap(),
        "not armed: no event"
    );
    r.cq.arm(false).unwrap();
    let rec = r.cq.doorbell_record();
    assert_eq!(rec[4] >> 4, 0, "arm_sn 0, cmd 'next completion'");
    let s = [r.sge(0, 16)];
    let mut w = SendWr::rdma_write(1, &s, r.peer.mr.addr(), r.peer.mr.rkey());
    w.flags = SendFlags::SIGNALED;
    r.qp.post_send(&[w]).unwrap();
    assert!(
        r.cq.wait_event(Duration::from_secs(5)).unwrap(),
        "completion event"
    );
    assert_eq!(r.cq.counters().events, 1);
    assert_eq!(r.wait(1)[0].status, WcStatus::Success);
    // Re-armed with arm_sn 1 (incremented per event, §8).
    r.cq.arm(false).unwrap();
    assert_eq!(r.cq.doorbell_record()[4] >> 4, 1);
    let mut w = SendWr::rdma_write(2, &s, r.peer.mr.addr(), r.peer.mr.rkey());
    w.flags = SendFlags::SIGNALED;
    r.qp.post_send(&[w]).unwrap();
    assert!(r.cq.wait_event(Duration::from_secs(5)).unwrap());
    r.wait(1);
    assert!(r.hca.event_counters().completion >= 2);
    r.teardown_is_clean();
}

#[test]
fn a_fatal_health_event_mid_traffic_moves_qps_to_err_with_flushed_completions() {
    let mut r = rig();
    let raddr = r.peer.mr.addr();
    let rkey = r.peer.mr.rkey();
    // Traffic: receives posted, a stream of writes.
    let rs = [r.sge(8192, 1024)];
    r.qp.post_recv(&[RecvWr::new(100, &rs), RecvWr::new(101, &rs)])
        .unwrap();
    let s = [r.sge(0, 256)];
    for i in 0..4 {
        let mut w = SendWr::rdma_write(i, &s, raddr, rkey);
        w.flags = SendFlags::SIGNALED;
        r.qp.post_send(&[w]).unwrap();
    }
    assert!(
        r.emu
            .firmware()
            .unwrap()
            .faults()
            .fatal(HealthSyndrome::HwFatal)
    );
    // More work posted after the device died, before the driver noticed.
    for i in 4..8 {
        let mut w = SendWr::rdma_write(i, &s, raddr, rkey);
        w.flags = SendFlags::SIGNALED;
        let _ = r.qp.post_send(&[w]);
    }
    let err = r.hca.check_health().unwrap_err();
    assert!(
        matches!(
            err,
            Mlx5Error::DeviceFatal {
                syndrome: Some(HealthSyndrome::HwFatal),
                ..
            }
        ),
        "{err}"
    );
    assert!(r.hca.is_fatal());
    assert_eq!(r.qp.state(), QpState::Err);
    // Refused before any poll has flushed the CQ: the fatal transition set
    // the QP's own flush flag (`Hca::register_qp`), the one flag a post
    // checks.
    let sent = r.qp.counters().sends;
    let refused = r.qp.post_write_inline(50, raddr, rkey, b"8 bytes!", true);
    assert_eq!(refused, Err(Refused::DeviceFatal));
    let mut w = SendWr::rdma_write(51, &s, raddr, rkey);
    w.flags = SendFlags::SIGNALED | SendFlags::INLINE;
    let general = r.qp.post_send(&[w]);
    assert!(matches!(
        general,
        Err(Mlx5Error::PostSend {
            index: 0,
            reason: PostFailure::DeviceFatal,
        })
    ));
    // The direct path's refusal, as an `Mlx5Error`, is the general path's.
    assert_eq!(
        refused.map_err(Mlx5Error::from).map_err(|e| e.to_string()),
        general.map_err(|e| e.to_string())
    );
    assert_eq!(r.qp.counters().sends, sent);
    // Every request completes once: done ones with success, the rest flushed.
    let wcs = r.wait(10);
    let mut ids: Vec<u64> = wcs.iter().map(|w| w.wr_id).collect();
    ids.sort_unstable();
    assert_eq!(ids, vec![0, 1, 2, 3, 4, 5, 6, 7, 100, 101], "{wcs:?}");
    assert!(wcs.iter().any(|w| w.status == WcStatus::WrFlushErr));
    assert!(
        wcs.iter()
            .filter(|w| w.wr_id >= 100)
            .all(|w| w.status == WcStatus::WrFlushErr && w.opcode == WcOpcode::Recv)
    );
    let mut more = [WorkCompletion::default(); 4];
    assert_eq!(r.cq.poll(&mut more), 0, "nothing completes twice");
    let mut w = SendWr::rdma_write(9, &s, raddr, rkey);
    w.flags = SendFlags::SIGNALED;
    assert!(matches!(
        r.qp.post_send(&[w]),
        Err(Mlx5Error::PostSend {
            reason: PostFailure::DeviceFatal,
            ..
        })
    ));
    // Teardown sends nothing more and still unmaps everything.
    let Rig {
        qp,
        cq,
        mkey,
        hca,
        emu,
        peer,
        ..
    } = r;
    let start = Instant::now();
    drop((qp, cq, mkey));
    let hca = Arc::into_inner(hca).unwrap();
    let _ = hca.shutdown();
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "no command waited for"
    );
    assert_eq!(emu.device().dma().mappings().len(), 0);
    drop(peer);
}

#[test]
fn page_requests_at_run_time_are_served_both_ways() {
    let (emu, _dir, hca) = up();
    let fw = emu.firmware().unwrap();
    let before = emu.accounting().unwrap().pages_held;
    assert!(fw.faults().request_pages(40));
    let start = Instant::now();
    while emu.accounting().unwrap().pages_held < before + 40 {
        hca.process_events(Duration::from_millis(20)).unwrap();
        assert!(start.elapsed() < Duration::from_secs(5), "pages not given");
    }
    assert!(fw.faults().request_pages(-25));
    while emu.accounting().unwrap().pages_held > before + 15 {
        hca.process_events(Duration::from_millis(20)).unwrap();
        assert!(start.elapsed() < Duration::from_secs(5), "pages not taken");
    }
    let k = hca.event_counters();
    assert_eq!(
        (k.page_requests, k.pages_given, k.pages_taken),
        (2, 40, 25),
        "{k:?}"
    );
    assert_eq!(hca.info().pages.held as usize, before + 15);
    assert!(k.command > 0, "commands completed by EQE");
    Arc::into_inner(hca).unwrap().shutdown().unwrap();
    assert!(emu.accounting().unwrap().is_clean());
}

#[test]
fn teardown_in_ownership_order_leaves_the_emulator_clean() {
    let r = rig();
    let acc = r.emu.accounting().unwrap();
    assert_eq!(
        (acc.eqs, acc.cqs, acc.qps, acc.mkeys, acc.gids),
        (1, 1, 1, 1, 1),
        "{acc:?}"
    );
    // The QP keeps its CQ's firmware object alive: drop the CQ handle first.
    let Rig {
        peer,
        qp,
        cq,
        mkey,
        hca,
        emu,
        _dir,
        ..
    } = r;
    drop(cq);
    assert_eq!(
        emu.accounting().unwrap().cqs,
        1,
        "the QP still holds the CQ"
    );
    drop(qp);
    assert_eq!(emu.accounting().unwrap().cqs, 0);
    drop(mkey);
    let hca = Arc::into_inner(hca).unwrap();
    hca.shutdown().unwrap();
    assert!(emu.accounting().unwrap().is_clean());
    drop(peer);
}

#[test]
fn ud_sends_both_ways_with_the_grh_area_and_source_qpn() {
    let (emu_ip, peer_ip) = ip_pair(231);
    let (emu, _dir, hca) = up();
    hca.set_gid(0, emu_ip).unwrap();
    let mut cq = Cq::new(&hca, 512).unwrap();
    let mkey = Mkey::new(&hca, hca.function().alloc_dma(4 * 4096).unwrap(), ALL).unwrap();
    let mut qp = Qp::new(
        &hca,
        &mut cq,
        None,
        QpOptions {
            qp_type: QpType::Ud,
            max_recv_sge: 4,
            ..QpOptions::default()
        },
    )
    .unwrap();
    qp.use_region(&mkey);
    let qkey = 0x1111_1111;
    let init = InitParams {
        qkey,
        ..InitParams::default()
    };
    let mut peer = Peer::with(peer_ip, QpType::Ud);
    common::peer::ud_rts(&mut qp, &mut peer, emu_ip, &init, (0x33, 0x22));
    assert_eq!(qp.query_state().unwrap(), QpState::Rts);

    // Us → peer.
    let msg = pattern(500, 21);
    mkey.memory().write(0, &msg).unwrap();
    let prs = [Sge::new(peer.mr.addr(), 40 + 1024, peer.mr.lkey())];
    peer.qp.post_recv(&[RecvWr::new(5, &prs)]).unwrap();
    let s = [Sge::new(mkey.addr(), 500, mkey.lkey())];
    // The driver's own QP takes the destination by value (the verbs
    // layer's `Mlx5Qp` takes an address handle). The post path resolves no
    // neighbour (audit row 7): a vector without a MAC is refused, nothing
    // posted, rather than sent to the function's own MAC.
    let no_mac = SendWr::send(1, &s).signaled().to_ud(UdDest {
        av: AddressVector::new(v4(peer_ip)),
        remote_qpn: peer.qp.qpn(),
        remote_qkey: qkey,
    });
    let err = qp.post_send(&[no_mac]).unwrap_err();
    assert!(
        matches!(
            err,
            Mlx5Error::PostSend {
                reason: rnic_mlx5::PostFailure::UnresolvedMac { .. },
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(qp.counters().sends, 0);
    // Resolved on the control path: the peer's address is local to this
    // host (the emulated wire is the host's stack), so the host kernel's
    // route says loopback, whose MAC is all zero.
    let dmac = hca.resolve_neighbour(&v4(peer_ip), None).unwrap();
    assert_eq!(dmac, [0; 6]);
    let w = SendWr::send(1, &s).signaled().to_ud(UdDest {
        av: AddressVector {
            dmac: Some(dmac),
            ..AddressVector::new(v4(peer_ip))
        },
        remote_qpn: peer.qp.qpn(),
        remote_qkey: qkey,
    });
    qp.post_send(&[w]).unwrap();
    let pw = peer.wait(1)[0];
    assert_eq!(
        (pw.wr_id, pw.status, pw.byte_len),
        (5, WcStatus::Success, 540),
        "{pw:?}"
    );
    assert_eq!(pw.src_qp, qp.qpn());
    assert_eq!(peer.bytes(40, 500), msg);

    // Peer → us, with immediate data.
    let rs = [Sge::new(mkey.addr() + 4096, 40 + 1024, mkey.lkey())];
    qp.post_recv(&[RecvWr::new(9, &rs)]).unwrap();
    let back = pattern(300, 4);
    peer.mem.write(8192, &back).unwrap();
    let ps = [Sge::new(peer.mr.addr() + 8192, 300, peer.mr.lkey())];
    let to_emu = peer.pd.create_ah(&AddressVector::new(v4(emu_ip))).unwrap();
    peer.qp
        .post_send(&[SendWr {
            wr_id: 6,
            op: SendOp::SendWithImm { imm: 0xa5a5_0001 },
            sg_list: &ps,
            flags: SendFlags::SIGNALED,
            ud: Some(to_emu.ud_dest(qp.qpn(), qkey)),
        }])
        .unwrap();
    let mut wcs = [WorkCompletion::default(); 4];
    let start = Instant::now();
    let mut got = Vec::new();
    while got.len() < 2 {
        let n = cq.poll(&mut wcs);
        got.extend_from_slice(&wcs[..n]);
        assert!(start.elapsed() < Duration::from_secs(10), "{got:?}");
    }
    let recv = got.iter().find(|w| w.wr_id == 9).unwrap();
    assert_eq!(
        (recv.status, recv.byte_len, recv.imm_data),
        (WcStatus::Success, 340, Some(0xa5a5_0001))
    );
    assert!(recv.wc_flags.contains(WcFlags::GRH));
    assert_eq!(recv.src_qp, peer.qp.qpn());
    let mut b = vec![0u8; 300];
    mkey.memory().read(4096 + 40, &mut b).unwrap();
    assert_eq!(b, back);
    assert!(
        got.iter()
            .any(|w| w.wr_id == 1 && w.status == WcStatus::Success)
    );
    peer.wait(1);
    drop((qp, cq, mkey));
    Arc::into_inner(hca).unwrap().shutdown().unwrap();
    assert!(emu.accounting().unwrap().is_clean());
}

#[test]
fn the_health_poller_notices_a_fatal_error_and_stops() {
    let (emu, _dir, hca) = up();
    let poller = hca.spawn_health_poller(Duration::from_millis(10));
    std::thread::sleep(Duration::from_millis(50));
    assert!(!hca.is_fatal());
    assert!(
        emu.firmware()
            .unwrap()
            .faults()
            .fatal(HealthSyndrome::FwInternal)
    );
    let start = Instant::now();
    while !hca.is_fatal() {
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "poller did not notice"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(poller);
    let err = hca
        .exec(rnic_mlx5_prm::CmdOpcode::AllocPd, 0, &[0u8; 16], 16)
        .unwrap_err();
    assert!(matches!(err, Mlx5Error::DeviceFatal { .. }), "{err}");
    let hca = Arc::into_inner(hca).unwrap();
    let start = Instant::now();
    let _ = hca.shutdown();
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "no command waited for"
    );
    assert_eq!(emu.device().dma().mappings().len(), 0);
}

#[test]
fn in_event_mode_a_swallowed_command_times_out_and_the_queue_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let emu = Emulator::start(dir.path().join("mlx5.sock"), Options::default()).unwrap();
    let f: Arc<dyn PciFunction> = Arc::new(VfioUserFunction::connect(emu.socket()).unwrap());
    let mut hca = Hca::bring_up(
        f,
        HcaOptions {
            cmd_timeout: Some(Duration::from_millis(300)),
            ..hca_options()
        },
    )
    .unwrap();
    hca.enable_events().unwrap();
    let before = hca.event_counters().command;
    emu.firmware()
        .unwrap()
        .faults()
        .swallow_next(Some(rnic_mlx5_prm::CmdOpcode::AllocPd));
    let alloc = |hca: &Hca| {
        hca.exec(
            rnic_mlx5_prm::CmdOpcode::AllocPd,
            0,
            &[0u8; 16],
            rnic_mlx5_prm::AllocPdOut::<&[u8]>::SIZE_BYTES,
        )
    };
    let err = alloc(&hca).unwrap_err();
    assert!(matches!(err, Mlx5Error::CommandTimeout { .. }), "{err}");
    let out = alloc(&hca).unwrap();
    let pd = rnic_mlx5_prm::AllocPdOut::new_checked(&out[..])
        .unwrap()
        .pd();
    let mut d = vec![0u8; rnic_mlx5_prm::DeallocPdIn::<&[u8]>::SIZE_BYTES];
    rnic_mlx5_prm::DeallocPdIn::new_checked(&mut d[..])
        .unwrap()
        .set_pd(pd)
        .unwrap();
    hca.exec(rnic_mlx5_prm::CmdOpcode::DeallocPd, 0, &d, 16)
        .unwrap();
    assert!(
        hca.event_counters().command >= before + 2,
        "completed by EQE"
    );
    assert_eq!(hca.cmdq().stuck_slots(), 1);
    hca.shutdown().unwrap();
}

#[test]
fn a_cq_needs_the_event_queue_and_a_page_request_beyond_the_limit_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let emu = Emulator::start(dir.path().join("mlx5.sock"), Options::default()).unwrap();
    let f: Arc<dyn PciFunction> = Arc::new(VfioUserFunction::connect(emu.socket()).unwrap());
    let hca = Hca::bring_up(f, hca_options()).unwrap();
    let polled = Arc::new(hca);
    assert!(matches!(Cq::new(&polled, 16), Err(Mlx5Error::NoEventQueue)));
    let mut hca = Arc::into_inner(polled).unwrap();
    hca.enable_events().unwrap();
    let hca = Arc::new(hca);
    // CQ credit: a QP whose queues could complete more than the CQ holds is refused.
    let mut small = Cq::new(&hca, 64).unwrap();
    let err = Qp::new(&hca, &mut small, None, QpOptions::default()).unwrap_err();
    assert!(matches!(err, Mlx5Error::QueueSize { .. }), "{err}");
    let mut big = Cq::new(&hca, 256).unwrap();
    let qp = Qp::new(&hca, &mut big, None, QpOptions::default()).unwrap();
    let (sq, rq) = qp.sizes();
    assert_eq!(big.free_capacity(), 256 - sq - rq);
    assert!(Qp::new(&hca, &mut big, None, QpOptions::default()).is_err());
    drop(qp);
    assert_eq!(
        big.free_capacity(),
        256,
        "a destroyed QP returns its credit"
    );
    drop((small, big));
    assert!(emu.firmware().unwrap().faults().request_pages(i32::MAX));
    let held = emu.accounting().unwrap().pages_held;
    hca.process_events(Duration::from_millis(50)).unwrap();
    assert_eq!(hca.event_counters().pages_refused, 1);
    assert_eq!(emu.accounting().unwrap().pages_held, held, "nothing given");
    Arc::into_inner(hca).unwrap().shutdown().unwrap();
    assert!(emu.accounting().unwrap().is_clean());
}

#[test]
fn poster_and_poller_on_two_threads_with_a_full_sq_backpressuring() {
    let r = rig();
    let raddr = r.peer.mr.addr();
    let rkey = r.peer.mr.rkey();
    let (sq, _) = r.qp.sizes();
    const N: u64 = 600;
    let src = pattern(4096, 9);
    r.mkey.memory().write(0, &src).unwrap();
    let base = r.mkey.addr();
    let lkey = r.mkey.lkey();
    let Rig {
        peer,
        mut qp,
        mut cq,
        mkey,
        hca,
        emu,
        _dir,
        ..
    } = r;
    let poster = std::thread::spawn(move || {
        let mut full = 0u64;
        let mut i = 0u64;
        while i < N {
            let off = (i % 64) * 64;
            let sge = [Sge::new(base + off, 64, lkey)];
            let mut w = SendWr::rdma_write(i, &sge, raddr + off, rkey);
            // Every 4th signaled: the others are retired by the next CQE.
            if i % 4 == 3 || i == N - 1 {
                w.flags = SendFlags::SIGNALED;
            }
            match qp.post_send(&[w]) {
                Ok(()) => i += 1,
                Err(Mlx5Error::PostSend {
                    reason: PostFailure::QueueFull { .. },
                    ..
                }) => {
                    full += 1;
                    std::thread::yield_now();
                }
                Err(e) => panic!("{e}"),
            }
        }
        (qp, full)
    });
    let mut seen = Vec::new();
    let mut wcs = [WorkCompletion::default(); 32];
    let start = Instant::now();
    while seen.last() != Some(&(N - 1)) {
        let n = cq.poll(&mut wcs);
        for w in &wcs[..n] {
            assert_eq!(w.status, WcStatus::Success, "{w:?}");
            seen.push(w.wr_id);
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{} completions",
            seen.len()
        );
    }
    let (qp, full) = poster.join().unwrap();
    let expected: Vec<u64> = (0..N).filter(|i| i % 4 == 3 || *i == N - 1).collect();
    assert_eq!(seen, expected, "each signaled request once, in order");
    assert_eq!(qp.outstanding(), (0, 0));
    assert_eq!(qp.counters().queue_full, full, "stalls are counted");
    assert_eq!(peer.bytes(0, 4096), src);
    eprintln!("SQ of {sq} WQEBBs was full {full} times");
    let k = cq.counters();
    assert_eq!((k.unknown_qpn, k.bad_wqe_counter), (0, 0));
    Rig {
        peer,
        holders: Vec::new(),
        qp,
        cq,
        mkey,
        hca,
        emu,
        _dir,
    }
    .teardown_is_clean();
}

#[test]
fn a_qp_sharing_its_blueflame_register_posts_through_the_doorbell_on_every_path() {
    // Write-combining BAR0, every register of its own taken first: the QP
    // shares register 3, which never takes a BlueFlame copy (audit row 5);
    // the direct and the generic posts both ring the 8-byte doorbell.
    let mut r = rig_with(Bar0Mapping::Wc, rnic_mlx5::firmware::events::SHARED_BF_REG);
    assert!(!r.qp.blueflame());
    let raddr = r.peer.mr.addr();
    let rkey = r.peer.mr.rkey();
    let before = r.qp.counters();
    r.qp.post_write_inline(30, raddr + 7000, rkey, b"shared!!", true)
        .unwrap();
    let c = r.wait_send();
    assert_eq!((c.wr_id(), c.status()), (30, WcStatus::Success));
    assert_eq!(r.peer.bytes(7000, 8), b"shared!!");
    r.mkey.memory().write(0, b"generic!").unwrap();
    let sge = [r.sge(0, 8)];
    let mut wr = SendWr::rdma_write(31, &sge, raddr + 7008, rkey);
    wr.flags = SendFlags::INLINE | SendFlags::SIGNALED;
    r.qp.post_send(&[wr]).unwrap();
    let wc = r.wait(1)[0];
    assert_eq!((wc.wr_id, wc.status), (31, WcStatus::Success));
    assert_eq!(r.peer.bytes(7008, 8), b"generic!");
    let after = r.qp.counters();
    assert_eq!(after.sends, before.sends + 2);
    assert_eq!(after.blueflame, before.blueflame, "no BlueFlame copy");
    assert_eq!(after.doorbells, before.doorbells + 2);
    r.teardown_is_clean();
}

#[test]
fn the_direct_fast_path_writes_inline_and_polls_send_completions() {
    let mut r = rig();
    let raddr = r.peer.mr.addr();
    let rkey = r.peer.mr.rkey();
    let bf = r.qp.counters().blueflame;
    // Unsignaled then signaled: the CQE retires both; 28 bytes is one WQEBB.
    r.qp.post_write_inline(20, raddr + 6000, rkey, b"8 bytes!", false)
        .unwrap();
    let long = *b"twenty-eight bytes, inline!!";
    r.qp.post_write_inline(21, raddr + 6008, rkey, &long, true)
        .unwrap();
    let c = r.wait_send();
    assert_eq!(
        (c.wr_id(), c.status(), c.opcode(), c.qp_num()),
        (21, WcStatus::Success, WcOpcode::RdmaWrite, r.qp.qpn())
    );
    assert_eq!(r.peer.bytes(6000, 8), b"8 bytes!");
    assert_eq!(r.peer.bytes(6008, 28), long);
    assert_eq!(r.qp.outstanding(), (0, 0));
    // Uncached BAR0: the fast path rings 8-byte doorbells (audit row 4).
    assert_eq!(r.qp.counters().blueflame, bf);
    // A fast WRITE and a generic one complete alike through `poll`.
    r.qp.post_write_inline(22, raddr + 6100, rkey, &[7u8; 3], true)
        .unwrap();
    let wc = r.wait(1)[0];
    assert_eq!((wc.wr_id, wc.status), (22, WcStatus::Success));
    assert_eq!(r.peer.bytes(6100, 3), [7, 7, 7]);
    assert!(r.cq.poll_send().is_none());
    r.teardown_is_clean();
}

/// Audit row 11: the polls store `set_ci` after every batch (K ib/cq.c:645,
/// RC cq.c:159-162), so the device's view of the ring (CQEs written −
/// `set_ci`) is exactly what is unpolled: rounds of 100 signaled WRITEs,
/// each round's CQEs all written before any is polled, never show it more
/// than 100 on a capacity-256 CQ, and nothing overruns. (Main stored it
/// once per capacity, letting the view reach 344.)
#[test]
fn set_ci_follows_every_poll_and_the_cq_never_overruns() {
    let mut r = rig();
    let raddr = r.peer.mr.addr();
    let rkey = r.peer.mr.rkey();
    assert_eq!((r.cq.capacity(), r.cq.entries()), (256, 512));
    let written = |r: &Rig| r.emu.firmware().unwrap().hca_stats().cqes;
    let cqes0 = written(&r);
    let mut wr_id = 0u64;
    let mut view_max = 0u64;
    for round in 0..6u64 {
        for _ in 0..100 {
            let data = wr_id.to_le_bytes();
            r.qp.post_write_inline(wr_id, raddr + 8 * (wr_id % 512), rkey, &data, true)
                .unwrap();
            wr_id += 1;
        }
        let t = Instant::now();
        while written(&r) < cqes0 + wr_id {
            assert!(t.elapsed() < Duration::from_secs(10), "round {round}");
            std::thread::sleep(Duration::from_millis(1));
        }
        let set_ci = u64::from(u32::from_be_bytes(
            r.cq.doorbell_record()[..4].try_into().unwrap(),
        ));
        view_max = view_max.max(wr_id - set_ci);
        for k in 0..100 {
            let c = r.cq.poll_send().expect("every CQE was written");
            assert_eq!(
                (c.wr_id(), c.status()),
                (round * 100 + k, WcStatus::Success)
            );
        }
        let ci = u64::from(r.cq.consumer_index());
        let set_ci = u64::from(u32::from_be_bytes(
            r.cq.doorbell_record()[..4].try_into().unwrap(),
        ));
        // Audit row 11: set_ci follows every poll batch, as K and RC.
        assert_eq!(set_ci, ci, "stored after every poll");
    }
    assert_eq!(view_max, 100, "the device sees exactly what is unpolled");
    let st = r.emu.firmware().unwrap().hca_stats();
    assert_eq!((st.cq_overruns, st.cqes_dropped), (0, 0), "{st:?}");
    assert_eq!(r.peer.bytes(8 * (599 % 512), 8), 599u64.to_le_bytes());
}

/// Audit row 7: an RC QP's destination MAC is the peer's, never the
/// function's own as a silent fallback. With the host kernel not asked
/// (`neigh=static`), a peer nobody resolved is refused at RTR with the
/// address and the fix, nothing moved; a static entry resolves it, and the
/// firmware's path holds exactly that MAC. (Main sent such frames to the
/// function's own MAC.)
#[test]
fn an_unresolved_peer_mac_is_refused_at_rtr_and_a_static_entry_is_what_the_path_holds() {
    let (emu_ip, _) = ip_pair(231);
    let (emu, dir) = emulator();
    let f: Arc<dyn PciFunction> = Arc::new(VfioUserFunction::connect(emu.socket()).unwrap());
    let mut opts = hca_options();
    opts.neighbours.host_kernel = Some(false);
    let mut hca = Hca::bring_up(f, opts).unwrap();
    hca.enable_events().unwrap();
    let hca = Arc::new(hca);
    hca.set_gid(0, emu_ip).unwrap();
    let own = hca.mac().unwrap();
    let mut cq = Cq::new(&hca, 256).unwrap();
    let mut qp = Qp::new(&hca, &mut cq, None, QpOptions::default()).unwrap();
    qp.init(&InitParams::default()).unwrap();
    let peer: IpAddr = "198.51.100.7".parse().unwrap();
    let err = qp
        .ready_to_receive(
            rnic_core::Qpn::from_wire(0x11),
            Psn::from_wire(0),
            v4(peer),
            &RtrParams::default(),
        )
        .unwrap_err();
    assert!(
        matches!(&err, Mlx5Error::NoNeighbour { ip, .. } if *ip == peer),
        "{err}"
    );
    let text = err.to_string();
    assert!(
        text.contains("198.51.100.7") && text.contains("add_neighbour"),
        "{text}"
    );
    assert_eq!(qp.query_state().unwrap(), QpState::Init, "nothing moved");
    let mac = [0x02, 0x5e, 0x10, 0x00, 0x00, 0x07];
    assert!(
        hca.add_neighbour(peer, [0x03, 0, 0, 0, 0, 1]).is_err(),
        "multicast refused"
    );
    hca.add_neighbour(peer, mac).unwrap();
    qp.ready_to_receive(
        rnic_core::Qpn::from_wire(0x11),
        Psn::from_wire(0),
        v4(peer),
        &RtrParams::default(),
    )
    .unwrap();
    assert_eq!(qp.query_rmac().unwrap(), mac);
    assert_ne!(qp.query_rmac().unwrap(), own);
    let listed = hca.neighbours();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (listed[0].ip, listed[0].mac, listed[0].source),
        (peer, mac, rnic_mlx5::NeighbourSource::Static)
    );
    drop((qp, cq));
    drop(dir);
}

/// Audit rows 4, 5 against the strict emulator's BlueFlame check. On an
/// uncached BAR0 (what kernel VFIO gives) the driver rings only 8-byte
/// doorbells: the emulator finds no BlueFlame body behind any of them
/// (`bf_uncombined` 0; main's driver copied every small WQE). On a
/// write-combining BAR0, five QPs posting from five threads at once — three
/// with registers of their own (copies), two sharing register 3 (doorbells
/// only) — never interleave two writers' bytes in one register
/// (`bf_interleaved` 0), and every WRITE lands.
#[test]
fn blueflame_only_through_write_combining_and_never_into_a_shared_register() {
    for bar0 in [Bar0Mapping::Uc, Bar0Mapping::Wc] {
        let (emu_ip, peer_ip) = ip_pair(231);
        let (emu, dir, hca) = up_with(bar0);
        assert_eq!(
            hca.info().doorbells.write_combining,
            bar0 == Bar0Mapping::Wc,
            "{}",
            hca.info().doorbells
        );
        hca.set_gid(0, emu_ip).unwrap();
        let peer = Peer::new(peer_ip);
        let raddr = peer.mr.addr();
        let rkey = peer.mr.rkey();
        let init = InitParams {
            access: ALL,
            ..InitParams::default()
        };
        let mut ends = Vec::new();
        let mut peer_qps = Vec::new();
        for k in 0..5u32 {
            let mut cq = Cq::new(&hca, 256).unwrap();
            let mut qp = Qp::new(&hca, &mut cq, None, QpOptions::default()).unwrap();
            let mut pqp = peer.another_rc();
            qp.connect(
                &init,
                pqp.qpn(),
                v4(peer_ip),
                Psn::from_wire(0),
                Psn::from_wire(0),
                &RtrParams::default(),
                &RtsParams::default(),
            )
            .unwrap();
            pqp.to_init(&init).unwrap();
            pqp.to_rtr(
                qp.qpn(),
                Psn::from_wire(0),
                v4(emu_ip),
                &RtrParams::default(),
            )
            .unwrap();
            pqp.to_rts(Psn::from_wire(0), &RtsParams::default())
                .unwrap();
            peer_qps.push(pqp);
            assert_eq!(
                qp.blueflame(),
                bar0 == Bar0Mapping::Wc && k < 3,
                "QP {k} on {bar0:?}"
            );
            ends.push((qp, cq, k));
        }
        let threads: Vec<_> = ends
            .into_iter()
            .map(|(mut qp, mut cq, k)| {
                std::thread::spawn(move || {
                    for i in 0..200u64 {
                        let at = raddr + u64::from(k) * 4096 + 8 * (i % 256);
                        qp.post_write_inline(i, at, rkey, &(i ^ u64::from(k)).to_le_bytes(), true)
                            .unwrap();
                        let t = Instant::now();
                        loop {
                            if let Some(c) = cq.poll_send() {
                                assert_eq!((c.wr_id(), c.status()), (i, WcStatus::Success));
                                break;
                            }
                            assert!(t.elapsed() < Duration::from_secs(10), "QP {k} post {i}");
                        }
                    }
                    (qp, cq)
                })
            })
            .collect();
        let ends: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        for k in 0..5u64 {
            let i = 199u64;
            assert_eq!(
                peer.bytes((k * 4096 + 8 * (i % 256)) as usize, 8),
                (i ^ k).to_le_bytes(),
                "QP {k}'s last WRITE on {bar0:?}"
            );
        }
        let st = emu.firmware().unwrap().stats();
        assert_eq!(
            (st.bf_uncombined, st.bf_interleaved),
            (0, 0),
            "{bar0:?}: {st:?}"
        );
        drop(ends);
        drop(hca);
        drop(peer_qps);
        drop((emu, dir, peer));
    }
}
