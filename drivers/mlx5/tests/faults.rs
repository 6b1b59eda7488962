//! The driver's error paths against rnic-mlx5-emu's fault hooks that make the
//! firmware late or the data path fail (issue 12, "Error paths"):
//!
//! * a command completion delayed (`Faults::delay_next`) less than the
//!   driver's command timeout: the command succeeds, no sooner than the delay,
//!   by polling and by completion EQE;
//! * delayed more: the typed timeout (`Mlx5Error::CommandTimeout` with the
//!   opcode), the slot stays reserved until the late completion comes back and
//!   is discarded, the next commands succeed, and a PD the late ALLOC_PD
//!   created (the driver cannot know it did) is freed by the function reset
//!   the driver's teardown falls back to when TEARDOWN_HCA is refused;
//! * an error CQE of each mlx5.md §10 syndrome (`Faults::error_cqe`) through
//!   the `rnic_core` Provider API: the polled `WorkCompletion`'s status (checked
//!   against the table of reference/mlx5.md §10, written out here, not the
//!   driver's table), `vendor_err`, the QP in ERR and later WRs flushed; and
//!   the receive-side variant;
//! * real RNR and transport retry exhaustion (no hook: a peer without
//!   receives, a peer QP in ERR);
//! * a command failing with each mlx5.md §4.3 status (`Faults::fail_next`).
#![allow(clippy::unwrap_used)]

mod common;
use common::{alloc_pd, dealloc_pd, emulator};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use rnic_core::{
    AccessFlags, CompletionQueue, Context, Gid, HeapMemory, InitParams, Memory, MemoryRegion, Mtu,
    ProtectionDomain, Psn, QpCaps, QpInitAttr, QpState, QpType, QueuePair, RecvWr, RtrParams,
    RtsParams, SendFlags, SendWr, Sge, WcStatus, WorkCompletion,
};
use rnic_mlx5::{Hca, HcaOptions, Mlx5Error, Mlx5Provider, PciFunction, VfioUserFunction};
use rnic_mlx5_emu::hca::{CqeInjection, InjectSide};
use rnic_mlx5_emu::{Emulator, FirmwareHandle, Phase};
use rnic_mlx5_prm::{CmdOpcode, CmdStatus};

const ALL: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

fn bring_up(emu: &Emulator, cmd_timeout: Duration) -> Hca {
    let f: Arc<dyn PciFunction> = Arc::new(VfioUserFunction::connect(emu.socket()).unwrap());
    Hca::bring_up(
        f,
        HcaOptions {
            pre_init_timeout: Duration::from_secs(10),
            cmd_timeout: Some(cmd_timeout),
            ..HcaOptions::default()
        },
    )
    .unwrap()
}

fn fw(emu: &Emulator) -> &FirmwareHandle {
    emu.firmware().unwrap()
}

/// Wait until the firmware has no delayed command left.
fn wait_late_done(emu: &Emulator) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while fw(emu).late_pending() > 0 {
        assert!(Instant::now() < deadline, "the delayed command never ran");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_delay_shorter_than_the_command_timeout_succeeds_no_sooner_than_the_delay() {
    let (emu, _dir) = emulator();
    let mut hca = bring_up(&emu, Duration::from_secs(5));
    let delay = Duration::from_millis(300);
    // Polling mode (ownership), then events mode (the completion EQE is late too).
    for events in [false, true] {
        if events {
            hca.enable_events().unwrap();
            assert!(hca.cmdq().event_mode());
        }
        assert!(
            fw(&emu)
                .faults()
                .delay_next(Some(CmdOpcode::AllocPd), delay)
        );
        let pds = fw(&emu).accounting().pds;
        let start = Instant::now();
        let pd = alloc_pd(&hca).unwrap();
        let took = start.elapsed();
        assert!(
            took >= delay,
            "events {events}: done after {took:?}, delay {delay:?}"
        );
        assert!(took < Duration::from_secs(5), "{took:?}");
        assert_eq!(fw(&emu).accounting().pds, pds + 1);
        assert_eq!(hca.cmdq().stuck_slots(), 0);
        // Other commands are not delayed.
        let start = Instant::now();
        dealloc_pd(&hca, pd).unwrap();
        assert!(start.elapsed() < delay, "{:?}", start.elapsed());
    }
    let st = fw(&emu).stats();
    assert_eq!((st.delayed, st.late_dropped, st.ignored_busy), (2, 0, 0));
    hca.shutdown().unwrap();
    let acc = fw(&emu).accounting();
    assert!(acc.is_clean(), "{acc:?}");
}

#[test]
fn a_delay_past_the_timeout_is_a_typed_timeout_then_the_late_completion_is_absorbed() {
    let (emu, _dir) = emulator();
    // The driver's disconnect at the end of `shutdown` must not reset the function too
    // (that reset races the counter read below): only the driver's own reset counts.
    emu.keep_state_on_disconnect(true);
    let mut hca = bring_up(&emu, Duration::from_millis(200));
    hca.enable_events().unwrap();
    let pds_before = fw(&emu).accounting().pds;
    assert!(
        fw(&emu)
            .faults()
            .delay_next(Some(CmdOpcode::AllocPd), Duration::from_millis(700))
    );
    let start = Instant::now();
    let err = alloc_pd(&hca).unwrap_err();
    assert!(start.elapsed() >= Duration::from_millis(200));
    let slot = match err {
        Mlx5Error::CommandTimeout {
            opcode: CmdOpcode::AllocPd,
            slot,
            ..
        } => slot,
        other => panic!("wanted an ALLOC_PD timeout, got {other}"),
    };
    assert!(err.to_string().contains("ALLOC_PD"), "{err}");
    assert_eq!(hca.cmdq().stuck_slots(), 1, "slot {slot} reserved");
    // While the firmware is late, commands go on in other slots.
    let pd = alloc_pd(&hca).unwrap();
    dealloc_pd(&hca, pd).unwrap();
    assert_eq!(
        fw(&emu).accounting().pds,
        pds_before,
        "the late ALLOC_PD has not run yet"
    );
    assert_eq!(fw(&emu).late_pending(), 1);
    // The late completion arrives (output, ownership, EQE): the firmware executed it.
    wait_late_done(&emu);
    assert_eq!(
        fw(&emu).accounting().pds,
        pds_before + 1,
        "the late ALLOC_PD created a PD the driver never learnt of"
    );
    // The next command gives the slot back (its late output discarded) and succeeds.
    let pd = alloc_pd(&hca).unwrap();
    assert_eq!(hca.cmdq().stuck_slots(), 0, "the slot came back");
    dealloc_pd(&hca, pd).unwrap();
    for _ in 0..40 {
        dealloc_pd(&hca, alloc_pd(&hca).unwrap()).unwrap();
    }
    let st = fw(&emu).stats();
    assert_eq!((st.delayed, st.late_dropped, st.ignored_busy), (1, 0, 0));
    // Teardown: the firmware refuses TEARDOWN_HCA while it holds the unknown PD; the driver
    // resets the function, which frees it and the pages.
    let resets = emu.device().stats().resets.load(Ordering::Relaxed);
    match hca.shutdown() {
        Err(Mlx5Error::Command {
            opcode: CmdOpcode::TeardownHca,
            status: CmdStatus::BadResState,
            ..
        }) => {}
        other => panic!("wanted TEARDOWN_HCA BAD_RES_STATE, got {other:?}"),
    }
    assert_eq!(
        emu.device().stats().resets.load(Ordering::Relaxed),
        resets + 1
    );
    let acc = fw(&emu).accounting();
    assert!(acc.is_clean(), "{acc:?}");
    assert_eq!(acc.phase, Phase::Disabled);
}

#[test]
fn a_delayed_command_dropped_by_a_reset_never_completes() {
    let (emu, _dir) = emulator();
    let hca = bring_up(&emu, Duration::from_millis(150));
    assert!(
        fw(&emu)
            .faults()
            .delay_next(None, Duration::from_millis(400))
    );
    assert!(matches!(
        alloc_pd(&hca),
        Err(Mlx5Error::CommandTimeout { .. })
    ));
    let f = hca.function().clone();
    std::mem::forget(hca);
    f.reset().unwrap();
    // Dropped (or, wrongly, executed) when its delay ends, ~250 ms from now.
    let ran = fw(&emu).stats().executed(CmdOpcode::AllocPd);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let st = fw(&emu).stats();
        if st.late_dropped > 0 || st.executed(CmdOpcode::AllocPd) > ran {
            break;
        }
        assert!(Instant::now() < deadline, "{st:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
    let st = fw(&emu).stats();
    assert_eq!((st.delayed, st.late_dropped), (1, 1), "{st:?}");
    assert_eq!(fw(&emu).late_pending(), 0);
    assert_eq!(fw(&emu).accounting().phase, Phase::Disabled);
}

// ---------------------------------------------------------------------------
// Error CQEs through the Provider API.

/// mlx5.md §10's error CQE syndromes and the ibverbs status each one's
/// description names (IB spec / ibv_wc_status), written out independently of
/// `rnic_mlx5_prm::CQE_SYNDROME_TO_IBV`.
const SYNDROMES: &[(u8, WcStatus)] = &[
    (0x01, WcStatus::LocLenErr),
    (0x02, WcStatus::LocQpOpErr),
    (0x04, WcStatus::LocProtErr),
    (0x05, WcStatus::WrFlushErr),
    (0x06, WcStatus::MwBindErr),
    (0x10, WcStatus::BadRespErr),
    (0x11, WcStatus::LocAccessErr),
    (0x12, WcStatus::RemInvReqErr),
    (0x13, WcStatus::RemAccessErr),
    (0x14, WcStatus::RemOpErr),
    (0x15, WcStatus::RetryExcErr),
    (0x16, WcStatus::RnrRetryExcErr),
    (0x22, WcStatus::RemAbortErr),
];

fn ip_pair() -> (IpAddr, IpAddr) {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    // A /24 of its own per process (datapath.rs uses 231..=250).
    let b = 211 + (std::process::id() % 20) as u8;
    (
        IpAddr::V4(Ipv4Addr::new(127, b, (n % 250) as u8, 1)),
        IpAddr::V4(Ipv4Addr::new(127, b, (n % 250) as u8, 2)),
    )
}

struct Side {
    qp: QueuePair,
    cq: CompletionQueue,
    mr: MemoryRegion,
    pd: ProtectionDomain,
    _ctx: Context,
    gid: Gid,
}

impl Side {
    fn new(ctx: Context, mem: Arc<dyn Memory>, gid: Gid) -> Side {
        let pd = ctx.alloc_pd().unwrap();
        let mr = pd.reg_mr(mem, ALL).unwrap();
        let cq = ctx.create_cq(256).unwrap();
        let qp = Side::make_qp(&pd, &cq);
        Side {
            qp,
            cq,
            mr,
            pd,
            _ctx: ctx,
            gid,
        }
    }

    fn make_qp(pd: &ProtectionDomain, cq: &CompletionQueue) -> QueuePair {
        let caps = QpCaps {
            max_send_wr: 32,
            max_recv_wr: 32,
            max_send_sge: 2,
            max_recv_sge: 2,
            max_inline_data: 64,
        };
        pd.create_qp(cq, cq, &QpInitAttr::new(QpType::Rc, caps))
            .unwrap()
    }

    /// A fresh QP on the same PD and CQ (the old one destroyed).
    fn renew(&mut self) {
        let qp = Side::make_qp(&self.pd, &self.cq);
        drop(std::mem::replace(&mut self.qp, qp));
    }

    fn wait(&mut self, n: usize) -> Vec<WorkCompletion> {
        let mut out = Vec::new();
        let mut wcs = [WorkCompletion::default(); 16];
        let start = Instant::now();
        while out.len() < n {
            let got = self.cq.poll(&mut wcs).unwrap();
            out.extend_from_slice(&wcs[..got]);
            assert!(start.elapsed() < Duration::from_secs(10), "{out:?}");
            if got == 0 {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
        out
    }
}

fn connect(a: &mut Side, b: &mut Side) {
    connect_with(a, b, &RtsParams::default(), &rtr());
}

fn rtr() -> RtrParams {
    RtrParams {
        path_mtu: Mtu::Mtu1024,
        ..RtrParams::default()
    }
}

/// Connect `a` (sending with `a_rts`) and `b` (receiving with `b_rtr`).
fn connect_with(a: &mut Side, b: &mut Side, a_rts: &RtsParams, b_rtr: &RtrParams) {
    let init = InitParams {
        access: ALL,
        ..InitParams::default()
    };
    let (pa, pb) = (Psn::from_wire(0x100), Psn::from_wire(0x9000));
    a.qp.to_init(&init).unwrap();
    a.qp.to_rtr(b.qp.qpn(), pb, b.gid, &rtr()).unwrap();
    a.qp.to_rts(pa, a_rts).unwrap();
    b.qp.to_init(&init).unwrap();
    b.qp.to_rtr(a.qp.qpn(), pa, a.gid, b_rtr).unwrap();
    b.qp.to_rts(pb, &RtsParams::default()).unwrap();
}

/// An mlx5 side (Provider API over the emulated function) and an rnic-rxe peer.
struct Pair {
    mlx5: Side,
    peer: Side,
    _rxe: rnic_rxe::RxeDevice,
    _provider: Arc<Mlx5Provider>,
    emu: Emulator,
    _dir: tempfile::TempDir,
}

fn pair() -> Pair {
    let (emu, dir) = emulator();
    let (ip, peer_ip) = ip_pair();
    let provider = Mlx5Provider::new(bring_up(&emu, Duration::from_secs(5))).unwrap();
    let gid = provider.set_gid(0, ip).unwrap();
    let mem: Arc<dyn Memory> = provider.alloc_dma(64 << 10).unwrap();
    let mlx5 = Side::new(Mlx5Provider::context(&provider), mem, gid);
    let rxe = rnic_rxe::RxeDevice::open(
        &rnic_rxe::RxeConfig::new(rnic_rxe::Target::Ip(peer_ip))
            .with_progress(rnic_rxe::Progress::Thread),
    )
    .unwrap();
    let pgid = rxe.gids()[0];
    let pmem: Arc<dyn Memory> = Arc::new(HeapMemory::new(64 << 10));
    let peer = Side::new(rxe.context(), pmem, pgid);
    let mut p = Pair {
        mlx5,
        peer,
        _rxe: rxe,
        _provider: provider,
        emu,
        _dir: dir,
    };
    connect(&mut p.mlx5, &mut p.peer);
    p
}

impl Pair {
    fn renew(&mut self) {
        self.mlx5.renew();
        self.peer.renew();
        connect(&mut self.mlx5, &mut self.peer);
    }

    fn writes(&mut self, ids: &[u64]) {
        let sge = [Sge::new(self.mlx5.mr.addr(), 64, self.mlx5.mr.lkey())];
        let wrs: Vec<SendWr<'_>> = ids
            .iter()
            .map(|&id| {
                let mut w = SendWr::rdma_write(id, &sge, self.peer.mr.addr(), self.peer.mr.rkey());
                w.flags = SendFlags::SIGNALED;
                w
            })
            .collect();
        self.mlx5.qp.post_send(&wrs).unwrap();
    }
}

#[test]
fn an_error_cqe_of_each_syndrome_polls_as_its_ibverbs_status_and_later_wrs_flush() {
    let mut p = pair();
    // The path works before any injection.
    p.writes(&[100]);
    let wc = p.mlx5.wait(1);
    assert_eq!((wc[0].wr_id, wc[0].status), (100, WcStatus::Success));
    // Every §10 syndrome, then one the PRM does not define (→ GENERAL_ERR).
    let undefined = (0x7f, WcStatus::GeneralErr);
    for (i, &(syndrome, want)) in SYNDROMES.iter().chain([&undefined]).enumerate() {
        if i > 0 {
            p.renew();
        }
        let qpn = p.mlx5.qp.qpn().get();
        let vendor = syndrome ^ 0xa5;
        assert!(fw(&p.emu).faults().error_cqe(CqeInjection {
            qpn: Some(qpn),
            side: InjectSide::Send,
            syndrome,
            vendor,
        }));
        p.writes(&[1, 2, 3]);
        let wcs = p.mlx5.wait(3);
        let what = format!("syndrome {syndrome:#04x}: {wcs:?}");
        assert_eq!((wcs[0].wr_id, wcs[0].status), (1, want), "{what}");
        assert_eq!(wcs[0].vendor_err, u32::from(vendor), "{what}");
        assert_eq!(wcs[0].qp_num.get(), qpn, "{what}");
        for (wc, id) in wcs[1..].iter().zip([2, 3]) {
            assert_eq!((wc.wr_id, wc.status), (id, WcStatus::WrFlushErr), "{what}");
        }
        assert_eq!(p.mlx5.qp.query().unwrap().qp_state, QpState::Err, "{what}");
        // Posts after the error flush too.
        p.writes(&[4]);
        let wc = p.mlx5.wait(1);
        assert_eq!(
            (wc[0].wr_id, wc[0].status),
            (4, WcStatus::WrFlushErr),
            "{what}"
        );
    }
    assert_eq!(
        fw(&p.emu).hca_stats().injected_error_cqes,
        SYNDROMES.len() as u64 + 1
    );
    // A fresh QP after all that works.
    p.renew();
    p.writes(&[200]);
    let wc = p.mlx5.wait(1);
    assert_eq!((wc[0].wr_id, wc[0].status), (200, WcStatus::Success));
}

#[test]
fn an_injected_receive_error_cqe_polls_as_its_status_and_later_receives_flush() {
    let mut p = pair();
    let qpn = p.mlx5.qp.qpn().get();
    let rsge = [Sge::new(p.mlx5.mr.addr(), 256, p.mlx5.mr.lkey())];
    let recvs: Vec<RecvWr<'_>> = (10..13)
        .map(|id| RecvWr {
            wr_id: id,
            sg_list: &rsge,
        })
        .collect();
    p.mlx5.qp.post_recv(&recvs).unwrap();
    assert!(fw(&p.emu).faults().error_cqe(CqeInjection {
        qpn: Some(qpn),
        side: InjectSide::Recv,
        syndrome: 0x01,
        vendor: 0x42,
    }));
    let ssge = [Sge::new(p.peer.mr.addr(), 32, p.peer.mr.lkey())];
    let mut send = SendWr::send(7, &ssge);
    send.flags = SendFlags::SIGNALED;
    p.peer.qp.post_send(&[send]).unwrap();
    let wcs = p.mlx5.wait(3);
    assert_eq!(
        (wcs[0].wr_id, wcs[0].status),
        (10, WcStatus::LocLenErr),
        "{wcs:?}"
    );
    assert_eq!(wcs[0].vendor_err, 0x42, "{wcs:?}");
    for (wc, id) in wcs[1..].iter().zip([11, 12]) {
        assert_eq!((wc.wr_id, wc.status), (id, WcStatus::WrFlushErr), "{wcs:?}");
    }
    assert_eq!(p.mlx5.qp.query().unwrap().qp_state, QpState::Err);
    // A receive posted now flushes at once.
    p.mlx5
        .qp
        .post_recv(&[RecvWr {
            wr_id: 13,
            sg_list: &rsge,
        }])
        .unwrap();
    let wc = p.mlx5.wait(1);
    assert_eq!((wc[0].wr_id, wc[0].status), (13, WcStatus::WrFlushErr));
    assert_eq!(fw(&p.emu).hca_stats().injected_error_cqes, 1);
}

#[test]
fn rnr_retry_exhaustion_completes_with_rnr_retry_exc_err_then_flushes() {
    let mut p = pair();
    p.mlx5.renew();
    p.peer.renew();
    let rts = RtsParams {
        rnr_retry: 1,
        ..RtsParams::default()
    };
    let peer_rtr = RtrParams {
        min_rnr_timer: 1,
        ..rtr()
    };
    connect_with(&mut p.mlx5, &mut p.peer, &rts, &peer_rtr);
    // SENDs to a peer that posted no receive: RNR NAKs until the retries run out.
    let sge = [Sge::new(p.mlx5.mr.addr(), 16, p.mlx5.mr.lkey())];
    let mut a = SendWr::send(1, &sge);
    a.flags = SendFlags::SIGNALED;
    let mut b = SendWr::send(2, &sge);
    b.flags = SendFlags::SIGNALED;
    p.mlx5.qp.post_send(&[a, b]).unwrap();
    let wcs = p.mlx5.wait(2);
    assert_eq!(
        (wcs[0].wr_id, wcs[0].status),
        (1, WcStatus::RnrRetryExcErr),
        "{wcs:?}"
    );
    assert_eq!(
        (wcs[1].wr_id, wcs[1].status),
        (2, WcStatus::WrFlushErr),
        "{wcs:?}"
    );
    assert_eq!(p.mlx5.qp.query().unwrap().qp_state, QpState::Err);
    assert_eq!(
        fw(&p.emu).hca_stats().injected_error_cqes,
        0,
        "a real RNR, not a hook"
    );
}

#[test]
fn transport_retry_exhaustion_completes_with_retry_exc_err_then_flushes() {
    let mut p = pair();
    p.mlx5.renew();
    p.peer.renew();
    let rts = RtsParams {
        timeout: 10,
        retry_cnt: 1,
        ..RtsParams::default()
    };
    connect_with(&mut p.mlx5, &mut p.peer, &rts, &rtr());
    // The peer's QP goes to ERR: it answers nothing, so no ACK ever comes.
    p.peer.qp.to_error().unwrap();
    p.writes(&[1, 2]);
    let start = Instant::now();
    let wcs = p.mlx5.wait(2);
    assert_eq!(
        (wcs[0].wr_id, wcs[0].status),
        (1, WcStatus::RetryExcErr),
        "{wcs:?}"
    );
    assert_eq!(
        (wcs[1].wr_id, wcs[1].status),
        (2, WcStatus::WrFlushErr),
        "{wcs:?}"
    );
    assert!(start.elapsed() < Duration::from_secs(10));
    assert_eq!(p.mlx5.qp.query().unwrap().qp_state, QpState::Err);
    assert_eq!(
        fw(&p.emu).hca_stats().injected_error_cqes,
        0,
        "a real timeout, not a hook"
    );
}

/// mlx5.md §4.3's command statuses (byte 0 of every output) and their names,
/// written out here rather than taken from `CmdStatus`, plus one the table
/// does not define.
const STATUSES: &[(u8, &str)] = &[
    (0x01, "INT_ERR"),
    (0x02, "BAD_OP"),
    (0x03, "BAD_PARAM"),
    (0x04, "BAD_SYS_STATE"),
    (0x05, "BAD_RES"),
    (0x06, "RES_BUSY"),
    (0x07, "NOT_READY"),
    (0x08, "EXCEED_LIM"),
    (0x09, "BAD_RES_STATE"),
    (0x0a, "BAD_INDEX"),
    (0x0f, "NO_RES"),
    (0x10, "BAD_QP_STATE"),
    (0x30, "BAD_PKT"),
    (0x40, "BAD_SIZE"),
    (0x50, "BAD_INP_LEN"),
    (0x51, "BAD_OUTP_LEN"),
];

#[test]
fn a_command_failing_with_each_status_is_that_typed_error_and_the_driver_goes_on() {
    let (emu, _dir) = emulator();
    let mut hca = bring_up(&emu, Duration::from_secs(5));
    for events in [false, true] {
        if events {
            hca.enable_events().unwrap();
        }
        let pds = fw(&emu).accounting().pds;
        for (i, &(raw, name)) in STATUSES.iter().chain(&[(0x7e, "0x7e")]).enumerate() {
            let syndrome = 0x5a00_0000 | i as u32;
            fw(&emu)
                .faults()
                .fail_next(CmdOpcode::AllocPd, CmdStatus::from_raw(raw), syndrome);
            let err = alloc_pd(&hca).unwrap_err();
            match &err {
                Mlx5Error::Command {
                    opcode: CmdOpcode::AllocPd,
                    op_mod: 0,
                    status,
                    syndrome: s,
                } => {
                    assert_eq!(status.as_raw(), raw, "{err}");
                    assert_eq!(*s, syndrome, "{err}");
                }
                other => panic!("status {raw:#04x}: wanted a command error, got {other}"),
            }
            let text = err.to_string();
            assert!(text.contains(name), "status {raw:#04x}: {text}");
            assert!(text.contains(&format!("{syndrome:#x}")), "{text}");
            // Not executed: no PD; and the next command works.
            assert_eq!(fw(&emu).accounting().pds, pds, "{name}");
            let pd = alloc_pd(&hca).unwrap();
            dealloc_pd(&hca, pd).unwrap();
        }
    }
    assert_eq!(fw(&emu).stats().injected, 2 * (STATUSES.len() as u64 + 1));
    assert_eq!(hca.cmdq().stuck_slots(), 0);
    hca.shutdown().unwrap();
    let acc = fw(&emu).accounting();
    assert!(acc.is_clean(), "{acc:?}");
}
