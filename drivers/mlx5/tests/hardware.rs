//! Opt-in tests on a real ConnectX function bound to vfio-pci: the questions
//! of the hardware audit (shared/reference/mlx5-hw-audit.md) that only real
//! firmware can settle. Each test prints one `AUDIT row N: …` line with what it
//! measured beside what the references lead us to expect; docs/mlx5.md §7
//! says how to run them and what to send back.
//!
//! ```sh
//! # a ConnectX function bound to vfio-pci, an address for its GID 0:
//! RNIC_TEST_PCI=0000:3b:00.0 RNIC_TEST_IP=192.0.2.10 \
//!   cargo test -p rnic-mlx5 --test hardware -- --ignored --test-threads 1 --nocapture
//! ```
//!
//! Without `RNIC_TEST_PCI` each test prints why it did nothing and passes.
#![allow(clippy::unwrap_used)]

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rnic_core::{
    AccessFlags, Gid, InitParams, Psn, RtrParams, RtsParams, SendWr, Sge, WcStatus, WorkCompletion,
};
use rnic_mlx5::{Cq, Hca, HcaOptions, Mkey, PciFunction, Qp, QpOptions, VfioFunction};

const ALL: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ);

/// The function under test, brought up with its event queue; `None` (and a
/// line saying why) without `RNIC_TEST_PCI`.
fn function() -> Option<Hca> {
    let Ok(bdf) = std::env::var("RNIC_TEST_PCI") else {
        eprintln!(
            "skipped: RNIC_TEST_PCI is not set (RNIC_TEST_PCI=<domain:bus:dev.fn> of a ConnectX \
             function bound to vfio-pci)"
        );
        return None;
    };
    let addr: rnic_core::PciAddr = bdf
        .parse()
        .unwrap_or_else(|e| panic!("RNIC_TEST_PCI={bdf}: not a PCI address: {e}"));
    let f: Arc<dyn PciFunction> = Arc::new(VfioFunction::open(&addr, 1 << 39).unwrap());
    let mut hca = Hca::bring_up(f, HcaOptions::default()).unwrap();
    hca.enable_events().unwrap();
    Some(hca)
}

/// GID 0 from `RNIC_TEST_IP` (any address: the traffic of these tests stays
/// inside the function, QP to QP).
fn gid0(hca: &Hca) -> Gid {
    let ip: IpAddr = std::env::var("RNIC_TEST_IP")
        .unwrap_or_else(|_| "192.0.2.10".into())
        .parse()
        .expect("RNIC_TEST_IP is an IP address");
    hca.set_gid(0, ip).unwrap()
}

/// Two RC QPs of the function connected to each other (loopback inside the
/// NIC), one CQ of `capacity` for the first one's sends.
struct Loop {
    a: Qp,
    b: Qp,
    cq: Cq,
    _bcq: Cq,
    mr: Mkey,
}

fn loopback(hca: &Arc<Hca>, capacity: u32) -> Loop {
    let gid = gid0(hca);
    let mut cq = Cq::new(hca, capacity).unwrap();
    let mut bcq = Cq::new(hca, 256).unwrap();
    let opts = QpOptions {
        max_send_wr: capacity / 2,
        ..QpOptions::default()
    };
    let mut a = Qp::new(hca, &mut cq, None, opts).unwrap();
    let mut b = Qp::new(hca, &mut bcq, None, QpOptions::default()).unwrap();
    let mr = Mkey::new(hca, hca.function().alloc_dma(1 << 20).unwrap(), ALL).unwrap();
    a.use_region(&mr);
    let init = InitParams {
        access: ALL,
        ..InitParams::default()
    };
    let (an, bn) = (a.qpn(), b.qpn());
    for (qp, remote) in [(&mut a, bn), (&mut b, an)] {
        qp.connect(
            &init,
            remote,
            gid,
            Psn::from_wire(0),
            Psn::from_wire(0),
            &RtrParams::default(),
            &RtsParams::default(),
        )
        .unwrap();
    }
    Loop {
        a,
        b,
        cq,
        _bcq: bcq,
        mr,
    }
}

fn write(l: &mut Loop, wr_id: u64) {
    let sge = [Sge::new(l.mr.addr(), 8, l.mr.lkey())];
    let wr = SendWr::rdma_write(wr_id, &sge, l.mr.addr() + 4096, l.mr.rkey()).signaled();
    l.a.post_send(&[wr]).unwrap();
}

/// Audit row 11: does firmware use `set_ci` beyond overrun detection? The
/// driver now stores it after every poll (as K and RC); this fills the CQ to
/// its capacity without polling, destroys a QP with CQEs still unpolled,
/// then fills again from a new QP. Expected (K, RC): every CQE arrives in
/// order, no CQ error event.
#[test]
#[ignore = "needs a ConnectX function bound to vfio-pci: set RNIC_TEST_PCI=<bdf> and pass --ignored"]
fn row_11_a_full_cq_and_a_destroyed_qps_pending_cqes_raise_no_cq_error() {
    let Some(hca) = function() else { return };
    let hca = Arc::new(hca);
    let mut l = loopback(&hca, 64);
    let cap = l.cq.capacity();
    for i in 0..u64::from(cap / 2) {
        write(&mut l, i);
    }
    std::thread::sleep(Duration::from_millis(200));
    drop(l.a);
    let mut a2 = Qp::new(&hca, &mut l.cq, None, QpOptions::default()).unwrap();
    a2.use_region(&l.mr);
    let gid = hca.mac().map(|_| gid0(&hca)).unwrap();
    a2.connect(
        &InitParams {
            access: ALL,
            ..InitParams::default()
        },
        l.b.qpn(),
        gid,
        Psn::from_wire(0),
        Psn::from_wire(0),
        &RtrParams::default(),
        &RtsParams::default(),
    )
    .unwrap();
    let mut wcs = [WorkCompletion::default(); 64];
    let mut got = 0;
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(2) {
        got += l.cq.poll(&mut wcs);
    }
    let ev = hca.event_counters();
    eprintln!(
        "AUDIT row 11: {got} CQEs polled after a destroyed QP left {} pending; CQ error events {} \
         (expected 0); health {:?}",
        cap / 2,
        ev.cq_error,
        hca.check_health()
    );
    assert_eq!(ev.cq_error, 0);
}

/// Audit row 13: the event thread drains the async EQ on every interrupt,
/// so 3 × 256 completion events with no call into the driver cannot overrun
/// it. Expected: no health syndrome 0x0c, the EQEs counted.
#[test]
#[ignore = "needs a ConnectX function bound to vfio-pci: set RNIC_TEST_PCI=<bdf> and pass --ignored"]
fn row_13_many_events_without_the_application_do_not_overrun_the_eq() {
    let Some(hca) = function() else { return };
    let hca = Arc::new(hca);
    let mut l = loopback(&hca, 64);
    let mut wcs = [WorkCompletion::default(); 8];
    for i in 0..768u64 {
        l.cq.arm(false).unwrap();
        write(&mut l, i);
        while l.cq.poll(&mut wcs) == 0 {}
        assert_eq!(wcs[0].status, WcStatus::Success);
    }
    std::thread::sleep(Duration::from_millis(500));
    let health = hca.check_health();
    eprintln!(
        "AUDIT row 13: {} EQEs, {} interrupts, health {health:?} (expected Ok, no syndrome 0x0c)",
        hca.event_counters().eqes,
        hca.event_counters().interrupts
    );
    health.unwrap();
}

/// Audit row 14: does real firmware rewrite the entry token, output length
/// or output-mailbox headers? The driver now counts differences (as the
/// kernel ignores them). Expected: 0, or a count that tells us so.
#[test]
#[ignore = "needs a ConnectX function bound to vfio-pci: set RNIC_TEST_PCI=<bdf> and pass --ignored"]
fn row_14_reply_fields_the_kernel_does_not_check() {
    let Some(hca) = function() else { return };
    let n = hca.cmdq().reply_mismatches();
    eprintln!(
        "AUDIT row 14: {n} reply field(s) changed by the firmware over {} commands (bring-up)",
        hca.cmdq().executed()
    );
}

/// Audit row 16: an eswitch-manager PF with an L2 (MPFS) table may deliver
/// unicast RoCE only to MACs in that table (K core/lib/mpfs.c). Reports the
/// caps; with both set, RoCE from another host needs the MAC in the table.
#[test]
#[ignore = "needs a ConnectX function bound to vfio-pci: set RNIC_TEST_PCI=<bdf> and pass --ignored"]
fn row_16_mpfs_caps() {
    let Some(hca) = function() else { return };
    let c = hca.general_caps().unwrap();
    eprintln!(
        "AUDIT row 16: eswitch_manager {} log_max_l2_table {} (both set: unicast RX from a peer \
         may need SET_L2_TABLE_ENTRY; send back whether a remote peer reaches this function)",
        c.eswitch_manager(),
        c.log_max_l2_table()
    );
}

/// Audit row 17: SET_HCA_CAP now sends only the capability structure's own
/// bytes; bring-up succeeding says the firmware takes that (K and RC do the
/// same). Also reports whether the queried area past the structure is
/// nonzero — what echoing it (the old behaviour) would have sent.
#[test]
#[ignore = "needs a ConnectX function bound to vfio-pci: set RNIC_TEST_PCI=<bdf> and pass --ignored"]
fn row_17_set_hca_cap_of_the_structure_size_is_accepted() {
    let Some(hca) = function() else { return };
    let info = hca.info();
    eprintln!(
        "AUDIT row 17: bring-up with 0x100-byte SET_HCA_CAP payloads succeeded (roce {}); \
         expected: success",
        info.roce
    );
}

/// Audit row 22: the driver takes a health counter that stands still for
/// 3 s as fatal (RC's rule). Expected: the counter advances at least once a
/// second on a healthy function.
#[test]
#[ignore = "needs a ConnectX function bound to vfio-pci: set RNIC_TEST_PCI=<bdf> and pass --ignored"]
fn row_22_the_health_counter_ticks() {
    let Some(hca) = function() else { return };
    let a = hca.health().unwrap().counter;
    std::thread::sleep(Duration::from_millis(1500));
    let b = hca.health().unwrap().counter;
    eprintln!(
        "AUDIT row 22: health counter {a} → {b} in 1.5 s (expected to change; the driver \
         declares a counter stuck for 3 s fatal)"
    );
    assert_ne!(a, b);
}

/// Audit row 23: what the firmware asks the driver to pin, against the
/// process's limits. Expected: bring-up fits (with `ulimit -l unlimited`).
#[test]
#[ignore = "needs a ConnectX function bound to vfio-pci: set RNIC_TEST_PCI=<bdf> and pass --ignored"]
fn row_23_pages_against_the_pinning_budget() {
    let Some(hca) = function() else { return };
    let p = hca.info().pages;
    let budget = hca.function().dma_budget();
    eprintln!(
        "AUDIT row 23: firmware pages boot {} init {} held {} ({} MiB pinned), budget {budget:?}",
        p.boot,
        p.init,
        p.held,
        (p.held * 4096) >> 20
    );
}

/// Audit rows 4, 5: the doorbell path chosen (resource0_wc or 8-byte
/// doorbells) and that a WRITE rung through it completes.
#[test]
#[ignore = "needs a ConnectX function bound to vfio-pci: set RNIC_TEST_PCI=<bdf> and pass --ignored"]
fn rows_4_5_the_doorbell_path_rings() {
    let Some(hca) = function() else { return };
    let hca = Arc::new(hca);
    let mut l = loopback(&hca, 64);
    l.mr.memory().write(0, b"doorbell").unwrap();
    write(&mut l, 7);
    let mut wcs = [WorkCompletion::default(); 1];
    let t = Instant::now();
    while l.cq.poll(&mut wcs) == 0 {
        assert!(t.elapsed() < Duration::from_secs(5), "no completion");
    }
    let mut back = [0u8; 8];
    l.mr.memory().read(4096, &mut back).unwrap();
    eprintln!(
        "AUDIT rows 4, 5: doorbells: {}; WRITE completed {:?}, bytes {}",
        hca.info().doorbells,
        wcs[0].status,
        String::from_utf8_lossy(&back)
    );
    assert_eq!(&back, b"doorbell");
}
