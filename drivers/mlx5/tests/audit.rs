//! One test per row of the hardware audit (`shared/reference/mlx5-hw-audit.md`)
//! that the strict emulator can settle: each drives the real driver against
//! rnic-mlx5-emu with the check of that row on (the emulator's default) and,
//! where the row needs one, its fault hook or option; each comment names the
//! row and what main's driver did there. Rows tested elsewhere: 4/5
//! (`datapath.rs` `blueflame_only_through_write_combining_…`, `a_qp_sharing_…`),
//! 7 (`datapath.rs` `an_unresolved_peer_mac_…`, `ud_sends_both_ways_…`), 11
//! (`datapath.rs` `set_ci_follows_every_poll_…`), 14 (`cmdq_transport.rs`
//! `statuses_and_hostile_replies_…`), 22 (`health::tests`), 23
//! (`pages::tests`); rows only firmware can settle are in `hardware.rs`.
//! The table is docs/mlx5.md §15.
#![allow(clippy::unwrap_used)]

mod common;
use common::emulator_with;
use common::peer::{ALL, Peer, ip_pair, v4};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rnic_core::{
    AccessFlags, InitParams, Memory, Psn, QpType, RecvWr, RtrParams, RtsParams, SendWr, Sge,
    WcStatus, WorkCompletion,
};
use rnic_mlx5::{
    Cq, Hca, HcaOptions, Mkey, Mlx5Error, PciFunction, Qp, QpOptions, VfioUserFunction,
};
use rnic_mlx5_emu::firmware::cmdq::ReplyRewrite;
use rnic_mlx5_emu::{Emulator, FirmwareOptions, Options, PortType};
use rnic_mlx5_prm::{CmdOpcode, CmdStatus, HealthSyndrome, NicState, QpState};

fn options(firmware: FirmwareOptions) -> Options {
    Options {
        firmware,
        ..Options::default()
    }
}

fn hca_options() -> HcaOptions {
    HcaOptions {
        pre_init_timeout: Duration::from_secs(10),
        cmd_timeout: Some(Duration::from_secs(5)),
        ..HcaOptions::default()
    }
}

/// A strict emulated function with `firmware`, brought up with events.
fn up(firmware: FirmwareOptions) -> (Emulator, tempfile::TempDir, Arc<Hca>) {
    let (emu, dir) = emulator_with(options(firmware));
    let f: Arc<dyn PciFunction> = Arc::new(VfioUserFunction::connect(emu.socket()).unwrap());
    let mut hca = Hca::bring_up(f, hca_options()).unwrap();
    hca.enable_events().unwrap();
    (emu, dir, Arc::new(hca))
}

/// An RC QP of `hca` connected to an rxe peer's.
struct Pair {
    qp: Qp,
    cq: Cq,
    mkey: Mkey,
    peer: Peer,
}

fn rc_pair(hca: &Arc<Hca>) -> Pair {
    let (emu_ip, peer_ip) = ip_pair(210);
    hca.set_gid(0, emu_ip).unwrap();
    let mut cq = Cq::new(hca, 256).unwrap();
    let mkey = Mkey::new(hca, hca.function().alloc_dma(16 * 4096).unwrap(), ALL).unwrap();
    let mut qp = Qp::new(
        hca,
        &mut cq,
        None,
        QpOptions {
            max_recv_sge: 4,
            ..QpOptions::default()
        },
    )
    .unwrap();
    qp.use_region(&mkey);
    let mut peer = Peer::with(peer_ip, QpType::Rc);
    let init = InitParams {
        access: ALL,
        ..InitParams::default()
    };
    peer.qp.to_init(&init).unwrap();
    peer.qp
        .to_rtr(
            qp.qpn(),
            Psn::from_wire(0),
            v4(emu_ip),
            &RtrParams::default(),
        )
        .unwrap();
    peer.qp
        .to_rts(Psn::from_wire(0), &RtsParams::default())
        .unwrap();
    qp.connect(
        &init,
        peer.qp.qpn(),
        v4(peer_ip),
        Psn::from_wire(0),
        Psn::from_wire(0),
        &RtrParams::default(),
        &RtsParams::default(),
    )
    .unwrap();
    Pair { qp, cq, mkey, peer }
}

impl Pair {
    /// The peer SENDs `data` (from its offset 0); our receive completion.
    fn send_from_peer(&mut self, data: &[u8]) -> WorkCompletion {
        self.peer.mem.write(0, data).unwrap();
        let ps = [Sge::new(
            self.peer.mr.addr(),
            data.len() as u32,
            self.peer.mr.lkey(),
        )];
        self.peer
            .qp
            .post_send(&[SendWr::send(3, &ps).signaled()])
            .unwrap();
        assert_eq!(self.peer.wait(1)[0].status, WcStatus::Success);
        let mut wcs = [WorkCompletion::default(); 1];
        let t = Instant::now();
        while self.cq.poll(&mut wcs) == 0 {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "no receive completion"
            );
        }
        wcs[0]
    }

    /// A signaled 8-byte inline WRITE to the peer's offset `at`, completed.
    fn write(&mut self, wr_id: u64, at: u64, bytes: &[u8; 8]) -> WcStatus {
        let raddr = self.peer.mr.addr() + at;
        self.qp
            .post_write_inline(wr_id, raddr, self.peer.mr.rkey(), bytes, true)
            .unwrap();
        let t = Instant::now();
        loop {
            if let Some(c) = self.cq.poll_send() {
                assert_eq!(c.wr_id(), wr_id);
                return c.status();
            }
            assert!(t.elapsed() < Duration::from_secs(10), "no completion");
        }
    }
}

/// Row 1: firmware holds CREATE_CQ/QP/MKEY until the page request it raised
/// is answered. With 64 pages charged per object, every object here waits
/// for the page worker, which answers on the reserved slot while the create
/// waits (main answered only after the command — never, since it waited for
/// the command: every create timed out). Then a firmware that refuses the
/// pages: the driver tells it (CANT_GIVE), and the held create fails at once
/// with NO_RES instead of timing out.
#[test]
fn row_01_held_creates_complete_when_the_page_worker_answers_and_fail_fast_on_cant_give() {
    let (emu, _dir, hca) = up(FirmwareOptions {
        object_pages: 64,
        ..FirmwareOptions::default()
    });
    let p0 = hca.info().pages.held;
    let mut pair = rc_pair(&hca);
    assert_eq!(pair.write(1, 0, b"pages ok"), WcStatus::Success);
    let st = emu.firmware().unwrap().stats();
    assert!(st.parked >= 3, "CQ, MKey, QP held: {st:?}");
    let ev = hca.event_counters();
    assert!(ev.page_requests >= 3 && ev.pages_given >= 3 * 64, "{ev:?}");
    assert_eq!(hca.info().pages.held, p0 + ev.pages_given);
    assert!(
        hca.cmdq().executed() > 0 && hca.cmdq().stuck_slots() == 0,
        "no command timed out"
    );
    drop(pair);

    // The firmware now holds at most what it has: the next give is refused.
    let (emu, _dir, hca) = up(FirmwareOptions {
        object_pages: 64,
        max_pages: 16 + 32 + 8,
        ..FirmwareOptions::default()
    });
    let start = Instant::now();
    let err = Cq::new(&hca, 64).unwrap_err();
    assert!(
        matches!(
            err,
            Mlx5Error::Command {
                opcode: CmdOpcode::CreateCq,
                status: CmdStatus::NoRes,
                ..
            }
        ),
        "{err}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(4),
        "not the 5 s timeout"
    );
    // The page worker counts its CANT_GIVE when that command returns, which
    // may be just after the create it unblocked.
    let t = Instant::now();
    while hca.event_counters().cant_give == 0 && t.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(hca.event_counters().cant_give, 1);
    assert_eq!(emu.firmware().unwrap().stats().cant_give, 1);
}

/// Rows 2, 3: a syndrome without `rfr` is reported and the function keeps
/// running (main declared it fatal and flushed every QP); with `rfr` it is
/// fatal. A NIC interface state of SW reset (a firmware reset from
/// elsewhere) is fatal within the event thread's next check (main never
/// looked at it).
#[test]
fn row_02_03_a_warning_keeps_the_function_running_rfr_and_nic_state_are_fatal() {
    let (emu, _dir, hca) = up(FirmwareOptions::default());
    let mut pair = rc_pair(&hca);
    assert!(
        emu.firmware()
            .unwrap()
            .faults()
            .health(HealthSyndrome::HighTemp, false)
    );
    let h = hca.check_health().unwrap();
    assert_eq!(h.syndrome, Some(HealthSyndrome::HighTemp));
    assert!(!h.reset_required && h.fatal().is_none());
    assert_eq!(hca.health_report().warnings, 1);
    assert!(!hca.is_fatal());
    assert_eq!(pair.write(1, 0, b"running!"), WcStatus::Success);
    assert_eq!(pair.peer.bytes(0, 8), b"running!");

    let (emu, _dir, hca) = up(FirmwareOptions::default());
    let _pair2 = rc_pair(&hca);
    assert!(
        emu.firmware()
            .unwrap()
            .faults()
            .nic_state(NicState::SwReset)
    );
    let t = Instant::now();
    while !hca.is_fatal() {
        assert!(
            t.elapsed() < Duration::from_secs(3),
            "the event thread's check"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let err = hca.check_health().unwrap_err();
    assert!(
        matches!(
            err,
            Mlx5Error::DeviceFatal {
                nic_state: Some(NicState::SwReset),
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("SW reset"), "{err}");

    let (emu, _dir, hca) = up(FirmwareOptions::default());
    assert!(
        emu.firmware()
            .unwrap()
            .faults()
            .health(HealthSyndrome::HwFatal, true)
    );
    assert!(matches!(
        hca.check_health(),
        Err(Mlx5Error::DeviceFatal {
            syndrome: Some(HealthSyndrome::HwFatal),
            ..
        })
    ));
}

/// Row 6: every modify of a UD QP carries `mtu` and `log_msg_max` (the
/// strict emulator refuses one without: main's UD QPs failed at RST2INIT),
/// and a UD message goes through.
#[test]
fn row_06_ud_modifies_carry_mtu_and_a_datagram_goes_through() {
    let (_emu, _dir, hca) = up(FirmwareOptions::default());
    let (emu_ip, peer_ip) = ip_pair(210);
    hca.set_gid(0, emu_ip).unwrap();
    let (_cq, mkey, mut qp) = common::peer::ud_qp(&hca);
    let qkey = 0x1111_1111;
    let init = InitParams {
        qkey,
        ..InitParams::default()
    };
    let mut peer = Peer::with(peer_ip, QpType::Ud);
    common::peer::ud_rts(&mut qp, &mut peer, emu_ip, &init, (0, 0));
    assert_eq!(qp.query_state().unwrap(), QpState::Rts);
    let prs = [Sge::new(peer.mr.addr(), 40 + 1024, peer.mr.lkey())];
    peer.qp.post_recv(&[RecvWr::new(5, &prs)]).unwrap();
    let s = [Sge::new(mkey.addr(), 1024, mkey.lkey())];
    let dmac = hca.resolve_neighbour(&v4(peer_ip), None).unwrap();
    let w = SendWr::send(1, &s).signaled().to_ud(rnic_core::UdDest {
        av: rnic_core::AddressVector {
            dmac: Some(dmac),
            ..rnic_core::AddressVector::new(v4(peer_ip))
        },
        remote_qpn: peer.qp.qpn(),
        remote_qkey: qkey,
    });
    qp.post_send(&[w]).unwrap();
    let wc = peer.wait(1)[0];
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (5, WcStatus::Success, 1024 + 40)
    );
}

/// Row 8: the port is reported as the device says: QUERY_VPORT_STATE's
/// state (main reported Active whenever RoCE was on) and the RoCE cap's GID
/// table (main: 256 always); a link that goes down is a port that is down.
#[test]
fn row_08_port_state_follows_the_link() {
    let (emu, _dir, hca) = up(FirmwareOptions::default());
    assert!(hca.link_up().unwrap());
    assert_eq!(hca.gid_table_len(), 256);
    assert!(emu.firmware().unwrap().faults().set_link(false));
    assert!(!hca.link_up().unwrap());
    assert!(emu.firmware().unwrap().faults().set_link(true));
    assert!(hca.link_up().unwrap());
    let t = Instant::now();
    while hca.event_counters().port_change < 2 {
        assert!(t.elapsed() < Duration::from_secs(3), "PORT_CHANGE EQEs");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Row 9: RoCE setup on an InfiniBand-mode port is refused by the driver
/// with the fix (main sent MODIFY_NIC_VPORT_CONTEXT and got the firmware's
/// bare BAD_PARAM).
#[test]
fn row_09_an_infiniband_port_is_refused_with_the_fix() {
    let (emu, _dir, hca) = up(FirmwareOptions {
        port_type: PortType::Ib,
        ..FirmwareOptions::default()
    });
    let err = hca.set_gid(0, "127.0.0.9".parse().unwrap()).unwrap_err();
    assert!(matches!(err, Mlx5Error::PortType { .. }), "{err}");
    assert!(err.to_string().contains("LINK_TYPE_P1"), "{err}");
    let st = emu.firmware().unwrap().stats();
    assert_eq!(
        st.executed(CmdOpcode::ModifyNicVportContext),
        0,
        "nothing sent"
    );
}

/// Row 10: MANAGE_PAGES take returning no pages during teardown is asked
/// again, as K does (main gave up on the first empty answer and unmapped
/// pages the firmware still held).
#[test]
fn row_10_teardown_asks_again_when_a_take_returns_no_pages() {
    let (emu, _dir, hca) = up(FirmwareOptions::default());
    emu.firmware().unwrap().faults().take_zero(2);
    Arc::into_inner(hca).unwrap().shutdown().unwrap();
    let acc = emu.accounting().unwrap();
    assert!(acc.is_clean(), "{acc:?}");
}

/// Row 12: a zero-length receive SGE is skipped (RC), not written as a data
/// segment the HCA reads as 2 GiB (main's receive failed LOCAL_PROT).
#[test]
fn row_12_a_zero_length_receive_sge_is_skipped() {
    let (_emu, _dir, hca) = up(FirmwareOptions::default());
    let mut pair = rc_pair(&hca);
    let addr = pair.mkey.addr();
    let lkey = pair.mkey.lkey();
    let sges = [Sge::new(addr, 0, lkey), Sge::new(addr + 64, 32, lkey)];
    pair.qp.post_recv(&[RecvWr::new(9, &sges)]).unwrap();
    let wc = pair.send_from_peer(&[0x5a; 32]);
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (9, WcStatus::Success, 32)
    );
    let mut got = [0u8; 32];
    pair.mkey.memory().read(64, &mut got).unwrap();
    assert_eq!(got, [0x5a; 32]);
}

/// Row 13: the event thread drains the EQ on every interrupt, so 600
/// completion events the application never waits for cannot overrun its
/// 256 entries (main drained only when someone waited: the strict firmware
/// declared the overrun fatal, syndrome 0x0c).
#[test]
fn row_13_events_nobody_waits_for_do_not_overrun_the_eq() {
    let (emu, _dir, hca) = up(FirmwareOptions::default());
    let mut pair = rc_pair(&hca);
    for i in 0..600u64 {
        pair.cq.arm(false).unwrap();
        assert_eq!(
            pair.write(i, 8 * (i % 64), &i.to_le_bytes()),
            WcStatus::Success
        );
    }
    // One event per arm: none lost to an arm the emulator read late. The last
    // events may still be on their way: wait for them, then 200 ms more in which
    // no extra one may come, and count exactly.
    let deadline = Instant::now() + Duration::from_secs(5);
    while hca.event_counters().completion < 600 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(200));
    hca.check_health().unwrap();
    assert_eq!(
        hca.event_counters().completion,
        600,
        "{:?}; the emulator wrote: {:?}",
        hca.event_counters(),
        emu.firmware().unwrap().hca_stats()
    );
    let st = emu.firmware().unwrap().hca_stats();
    assert_eq!(st.eq_overruns, 0, "{st:?}");
}

/// Row 14: a reply whose token and block numbers the firmware rewrote is
/// used and the difference counted (main failed the command with `Reply`,
/// which the kernel never does).
#[test]
fn row_14_a_rewritten_reply_is_counted_and_used() {
    let (emu, _dir, hca) = up(FirmwareOptions::default());
    emu.firmware()
        .unwrap()
        .faults()
        .rewrite_next_reply(ReplyRewrite {
            mailbox_tokens: true,
            block_numbers: true,
            entry_token: true,
        });
    let before = hca.cmdq().reply_mismatches();
    // QUERY_HCA_CAP: 0x1010 bytes of output, eight blocks.
    let caps = hca.general_caps().unwrap().log_max_qp();
    let out = hca
        .exec(CmdOpcode::QueryHcaCap, 1, &[0u8; 16], 0x1010)
        .unwrap();
    assert_eq!(out.len(), 0x1010);
    assert!(
        hca.cmdq().reply_mismatches() >= before + 9,
        "entry + 8 blocks × 2"
    );
    assert!(caps > 0);
}

/// Row 15: with `num_vhca_ports` set, SET_ROCE_ADDRESS names the port (main
/// sent 0 and the firmware refused it).
#[test]
fn row_15_vhca_port_num_when_the_cap_has_vhca_ports() {
    let (_emu, _dir, hca) = up(FirmwareOptions {
        num_vhca_ports: 1,
        ..FirmwareOptions::default()
    });
    hca.set_gid(0, "127.0.0.19".parse().unwrap()).unwrap();
}

/// Rows 17, 18, 19: bring-up against the strict firmware passes the
/// capability payload check (main echoed 0x1000 bytes: CAP_PAYLOAD), waits
/// for `initializing` before the revision (main read 0: CmdifRev), and
/// CREATE_CQ lists exactly the ring's pages (main listed the doorbell
/// record's page too: CQ_PAS_LENGTH) — all with the emulator's own counters
/// showing no refusal.
#[test]
fn row_17_18_19_bring_up_and_a_cq_pass_the_strict_checks() {
    let (emu, _dir) = emulator_with(Options {
        boot_delay: Duration::from_millis(300),
        ..Options::default()
    });
    let f: Arc<dyn PciFunction> = Arc::new(VfioUserFunction::connect(emu.socket()).unwrap());
    let mut hca = Hca::bring_up(f, hca_options()).unwrap();
    hca.enable_events().unwrap();
    let hca = Arc::new(hca);
    for n in [2, 32, 64, 256, 1024] {
        let cq = Cq::new(&hca, n).unwrap();
        drop(cq);
    }
    let st = emu.firmware().unwrap().stats();
    assert_eq!(
        (st.errors_with(CmdStatus::BadParam), st.errors.len()),
        (0, 0),
        "{st:?}"
    );
}

/// Row 20: a RoCE QP's timestamp format follows the RoCE cap (main took the
/// general cap's, which the firmware refuses when the two differ).
#[test]
fn row_20_ts_format_follows_the_roce_cap() {
    for roce_qp_ts_format in [0, 1, 2] {
        let (_emu, _dir, hca) = up(FirmwareOptions {
            roce_qp_ts_format,
            ..FirmwareOptions::default()
        });
        let mut cq = Cq::new(&hca, 512).unwrap();
        let qp = Qp::new(&hca, &mut cq, None, QpOptions::default());
        assert!(
            qp.is_ok(),
            "roce_qp_ts_format {roce_qp_ts_format}: {:?}",
            qp.err()
        );
    }
}

/// Row 21: receive scatter lists end with the firmware's
/// `terminate_scatter_list_mkey` when it advertises one (main always wrote
/// 0x100, an ordinary invalid key there: LOCAL_PROT).
#[test]
fn row_21_the_advertised_terminator_ends_receive_lists() {
    let (_emu, _dir, hca) = up(FirmwareOptions {
        terminate_scatter_key: true,
        ..FirmwareOptions::default()
    });
    assert_ne!(hca.terminator_lkey(), rnic_mlx5_prm::INVALID_LKEY);
    let mut pair = rc_pair(&hca);
    let sges = [Sge::new(pair.mkey.addr(), 64, pair.mkey.lkey())];
    pair.qp.post_recv(&[RecvWr::new(4, &sges)]).unwrap();
    let wc = pair.send_from_peer(&[7u8; 16]);
    assert_eq!((wc.wr_id, wc.status), (4, WcStatus::Success));
}

/// Rows 61, 63 (the audit's OK rows with a note): without the atomic cap a
/// QP asking for remote atomics is refused by the driver with the fix
/// (main set `atomic_mode` and the firmware refused the modify), and
/// outstanding reads/atomics beyond the caps are clamped (main sent 2^6 and
/// the firmware refused RTR/RTS).
#[test]
fn row_61_63_atomics_need_the_cap_and_ra_depths_are_clamped() {
    let (_emu, _dir, hca) = up(FirmwareOptions {
        atomic: false,
        ..FirmwareOptions::default()
    });
    let mut cq = Cq::new(&hca, 512).unwrap();
    let mut qp = Qp::new(&hca, &mut cq, None, QpOptions::default()).unwrap();
    let err = qp
        .init(&InitParams {
            access: ALL | AccessFlags::REMOTE_ATOMIC,
            ..InitParams::default()
        })
        .unwrap_err();
    assert!(err.to_string().contains("REMOTE_ATOMIC"), "{err}");
    assert_eq!(qp.query_state().unwrap(), QpState::Rst);

    let (_emu, _dir, hca) = up(FirmwareOptions::default());
    let (emu_ip, peer_ip) = ip_pair(210);
    hca.set_gid(0, emu_ip).unwrap();
    let mut cq = Cq::new(&hca, 512).unwrap();
    let mut qp = Qp::new(&hca, &mut cq, None, QpOptions::default()).unwrap();
    qp.connect(
        &InitParams::default(),
        rnic_core::Qpn::from_wire(0x22),
        v4(peer_ip),
        Psn::from_wire(0),
        Psn::from_wire(0),
        &RtrParams {
            max_dest_rd_atomic: 255,
            ..RtrParams::default()
        },
        &RtsParams {
            max_rd_atomic: 255,
            ..RtsParams::default()
        },
    )
    .unwrap();
    assert_eq!(qp.query_state().unwrap(), QpState::Rts);
}

/// Row 8 through the verbs layer: `query_port` reports the link's state and
/// its speed from PTYS (main: Active and 4 × 25 Gb/s whatever the port did).
#[test]
fn row_08_query_port_reports_the_link_and_its_speed() {
    let (emu, _dir) = emulator_with(options(FirmwareOptions {
        port_speed: rnic_mlx5_emu::PortSpeed::G25,
        ..FirmwareOptions::default()
    }));
    let f: Arc<dyn PciFunction> = Arc::new(VfioUserFunction::connect(emu.socket()).unwrap());
    let hca = Hca::bring_up(f, hca_options()).unwrap();
    let provider = rnic_mlx5::Mlx5Provider::new(hca).unwrap();
    provider.set_gid(0, "127.0.0.29".parse().unwrap()).unwrap();
    let ctx = rnic_mlx5::Mlx5Provider::context(&provider);
    let p = ctx.query_port(1).unwrap();
    assert_eq!(p.state, rnic_core::PortState::Active);
    assert_eq!((p.active_width, p.active_speed_mbps), (1, 25_000));
    assert_eq!(p.gid_tbl_len, 256);
    assert!(emu.firmware().unwrap().faults().set_link(false));
    let p = ctx.query_port(1).unwrap();
    assert_eq!(p.state, rnic_core::PortState::Down);
    assert_eq!(p.bandwidth_mbps(), 0);
}
