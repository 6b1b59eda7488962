//! Hca bring-up and teardown end to end over vfio-user against
//! rnic-mlx5-emu's firmware (one emulator and socket per test), plus the
//! opt-in test on a real function (`RNIC_TEST_PCI=<bdf>`).
#![allow(clippy::unwrap_used)]

mod common;
use common::{alloc_pd, dealloc_pd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rnic_mlx5::{
    FwVersion, Hca, HcaOptions, Mlx5Error, PciFunction, PortType, ResetPolicy, VfioUserFunction,
};
use rnic_mlx5_emu::{Emulator, FirmwareHandle, FirmwareOptions, NoFirmware, Options, Phase};
use rnic_mlx5_prm::{
    CmdOpcode, CmdStatus, EnableHcaIn, EnableHcaOut, HCA_CAP_OPMOD_MAX, HealthSyndrome,
    QueryHcaCapIn, QueryHcaCapOut, SetIssiIn, SetIssiOut, cap_type, initial_seg,
};

struct Rig {
    emu: Emulator,
    function: Arc<dyn PciFunction>,
    _dir: tempfile::TempDir,
}

fn options() -> Options {
    Options {
        boot_delay: Duration::from_millis(20),
        ..Options::default()
    }
}

fn connect(emu: Emulator, dir: tempfile::TempDir) -> Rig {
    let function: Arc<dyn PciFunction> = Arc::new(VfioUserFunction::connect(emu.socket()).unwrap());
    Rig {
        emu,
        function,
        _dir: dir,
    }
}

fn rig() -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let emu = Emulator::start(dir.path().join("mlx5.sock"), options()).unwrap();
    connect(emu, dir)
}

fn hca_options() -> HcaOptions {
    HcaOptions {
        pre_init_timeout: Duration::from_secs(10),
        cmd_timeout: Some(Duration::from_secs(10)),
        ..HcaOptions::default()
    }
}

fn fw(r: &Rig) -> &FirmwareHandle {
    r.emu.firmware().unwrap()
}

/// DMA mappings the emulated function still holds.
fn mappings(r: &Rig) -> usize {
    r.emu.device().dma().mappings().len()
}

#[test]
fn bring_up_reaches_init_hca_and_reports_info() {
    let r = rig();
    let hca = Hca::bring_up(r.function.clone(), hca_options()).unwrap();
    let info = hca.info();
    eprintln!("{info:#?}");
    assert_eq!(
        info.fw_version,
        FwVersion {
            major: 16,
            minor: 35,
            subminor: 2000
        }
    );
    assert_eq!(info.fw_version.to_string(), "16.35.2000");
    assert_eq!(info.cmdif_rev, 5);
    assert_eq!(info.device_id, 0x1017);
    assert_eq!(info.cmdq_slots, 32);
    assert_eq!(info.issi, 1);
    assert!(!info.reset_first, "a fresh function is not reset");
    assert_eq!(info.port_type, PortType::Ethernet);
    assert!(info.num_ports >= 1);
    assert!(info.roce, "RoCE enabled");
    assert_ne!(info.roce_version & (1 << 2), 0, "RoCEv2");
    for (name, v) in [
        ("log_max_qp", info.log_max_qp),
        ("log_max_cq", info.log_max_cq),
        ("log_max_eq", info.log_max_eq),
        ("log_max_mkey", info.log_max_mkey),
        ("log_max_pd", info.log_max_pd),
        ("log_max_msg", info.log_max_msg),
    ] {
        assert!(v > 0, "{name} = 0");
    }
    assert_eq!(
        info.pages.held,
        info.pages.boot + info.pages.init,
        "{:?}",
        info.pages
    );
    // The caps the driver set are in force.
    let caps = hca.general_caps().unwrap();
    assert_eq!(caps.cmdif_checksum(), 0);
    assert_eq!(caps.log_uar_page_sz(), 0);
    let roce = hca.roce_caps().unwrap();
    let max_sw = {
        let out = hca
            .exec(
                CmdOpcode::QueryHcaCap,
                (cap_type::ROCE << 1 | HCA_CAP_OPMOD_MAX) as u16,
                &[0u8; QueryHcaCapIn::<&[u8]>::SIZE_BYTES],
                QueryHcaCapOut::<&[u8]>::SIZE_BYTES,
            )
            .unwrap();
        QueryHcaCapOut::new_checked(&out[..])
            .unwrap()
            .roce_cap()
            .sw_r_roce_src_udp_port()
    };
    assert_eq!(
        roce.sw_r_roce_src_udp_port(),
        max_sw,
        "set exactly when the max allows it"
    );
    assert_eq!(info.sw_roce_src_udp_port, max_sw != 0);
    assert!(mappings(&r) > 0);
    let faults = &r.emu.device().dma().stats().faults;
    assert_eq!(
        faults.load(std::sync::atomic::Ordering::Relaxed),
        0,
        "no device access outside the driver's mappings"
    );
    hca.shutdown().unwrap();
    assert_eq!(mappings(&r), 0, "every DMA buffer unmapped after teardown");
}

#[test]
fn failing_commands_report_their_status_and_the_driver_stays_usable() {
    let r = rig();
    let hca = Hca::bring_up(r.function.clone(), hca_options()).unwrap();
    // An opcode the firmware does not implement.
    let err = hca
        .exec(CmdOpcode::Unknown(0x7ff), 0, &[0u8; 16], 16)
        .unwrap_err();
    match &err {
        Mlx5Error::Command {
            opcode: CmdOpcode::Unknown(0x7ff),
            status: CmdStatus::BadOp,
            syndrome,
            ..
        } => assert_ne!(*syndrome, 0, "the firmware names the failure"),
        other => panic!("expected BAD_OP, got {other}"),
    }
    assert!(err.to_string().contains("BAD_OP"), "{err}");
    // SET_ISSI with an ISSI the firmware does not support.
    let mut cmd = vec![0u8; SetIssiIn::<&[u8]>::SIZE_BYTES];
    SetIssiIn::new_checked(&mut cmd[..])
        .unwrap()
        .set_current_issi(0x7)
        .unwrap();
    let err = hca
        .exec(CmdOpcode::SetIssi, 0, &cmd, SetIssiOut::<&[u8]>::SIZE_BYTES)
        .unwrap_err();
    eprintln!("SET_ISSI 7: {err}");
    assert!(
        matches!(
            err,
            Mlx5Error::Command {
                status: CmdStatus::BadParam | CmdStatus::BadSysState,
                ..
            }
        ),
        "{err}"
    );
    // Still usable: a PD round trip.
    let pd = alloc_pd(&hca).unwrap();
    assert_ne!(pd, hca.info().pd);
    dealloc_pd(&hca, pd).unwrap();
    // Deallocating it twice is a bad resource.
    let err = dealloc_pd(&hca, pd).unwrap_err();
    assert!(matches!(err, Mlx5Error::Command { .. }), "{err}");
    hca.shutdown().unwrap();
    assert_eq!(mappings(&r), 0);
}

#[test]
fn a_function_left_initialized_by_a_leaked_hca_is_reset_and_brought_up() {
    let r = rig();
    let first = Hca::bring_up(r.function.clone(), hca_options()).unwrap();
    let pd = first.info().pd;
    // A crashed driver: nothing torn down, the function left initialized.
    std::mem::forget(first);
    let second = Hca::bring_up(r.function.clone(), hca_options()).unwrap();
    let info = second.info();
    assert!(info.reset_first, "the old command queue was seen and reset");
    assert_eq!(
        info.pd, pd,
        "a fresh function numbers objects from the start"
    );
    second.shutdown().unwrap();
}

#[test]
fn without_the_reset_a_left_initialized_function_fails_clearly() {
    let r = rig();
    let first = Hca::bring_up(r.function.clone(), hca_options()).unwrap();
    std::mem::forget(first);
    let err = Hca::bring_up(
        r.function.clone(),
        HcaOptions {
            reset: ResetPolicy::Never,
            ..hca_options()
        },
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            Mlx5Error::Command {
                status: CmdStatus::BadSysState,
                ..
            }
        ),
        "{err}"
    );
    // And the default policy recovers it.
    Hca::bring_up(r.function.clone(), hca_options())
        .unwrap()
        .shutdown()
        .unwrap();
}

#[test]
fn a_device_that_never_answers_fails_with_a_timeout_and_cleans_up() {
    let dir = tempfile::tempdir().unwrap();
    let emu = Emulator::start_with(
        dir.path().join("mlx5.sock"),
        options(),
        Box::new(NoFirmware),
    )
    .unwrap();
    let r = connect(emu, dir);
    let start = Instant::now();
    let err = Hca::bring_up(
        r.function.clone(),
        HcaOptions {
            cmd_timeout: Some(Duration::from_millis(200)),
            ..hca_options()
        },
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            Mlx5Error::CommandTimeout {
                opcode: CmdOpcode::EnableHca,
                ..
            }
        ),
        "{err}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "no further commands after the timeout"
    );
    assert_eq!(
        mappings(&r),
        0,
        "the command queue page and mailboxes are unmapped"
    );
}

/// Opt-in: bring up and tear down a real function bound to vfio-pci.
/// `RNIC_TEST_PCI=0000:3b:00.0 cargo test -p rnic-mlx5 -- --ignored`.
#[test]
#[ignore = "needs a ConnectX function bound to vfio-pci: set RNIC_TEST_PCI=<bdf> and pass --ignored"]
fn hardware_bring_up_via_kernel_vfio() {
    let Ok(bdf) = std::env::var("RNIC_TEST_PCI") else {
        eprintln!(
            "skipped: RNIC_TEST_PCI is not set (RNIC_TEST_PCI=<domain:bus:dev.fn> of a ConnectX \
             function bound to vfio-pci)"
        );
        return;
    };
    let addr: rnic_core::PciAddr = bdf
        .parse()
        .unwrap_or_else(|e| panic!("RNIC_TEST_PCI={bdf}: not a PCI address: {e}"));
    let function: Arc<dyn PciFunction> =
        Arc::new(rnic_mlx5::VfioFunction::open(&addr, 1 << 39).unwrap());
    let hca = Hca::bring_up(function, HcaOptions::default()).unwrap();
    let info = hca.info();
    eprintln!("{info:#?}");
    assert_eq!(info.cmdif_rev, 5);
    assert!(info.pages.held > 0);
    hca.shutdown().unwrap();
}

#[test]
fn set_issi_with_an_unsupported_value_before_init_is_bad_param() {
    let r = rig();
    r.function.enable_bus_master().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let init = initial_seg::initializing;
    while init.extract(r.function.bar0().read32_be(init.dword_offset()).unwrap()) != 0 {
        assert!(Instant::now() < deadline, "firmware never ready");
        std::thread::sleep(Duration::from_millis(2));
    }
    let q = rnic_mlx5::CmdQueue::new(r.function.clone(), Default::default()).unwrap();
    q.exec(
        CmdOpcode::EnableHca,
        0,
        &[0u8; EnableHcaIn::<&[u8]>::SIZE_BYTES],
        EnableHcaOut::<&[u8]>::SIZE_BYTES,
    )
    .unwrap();
    let mut cmd = vec![0u8; SetIssiIn::<&[u8]>::SIZE_BYTES];
    SetIssiIn::new_checked(&mut cmd[..])
        .unwrap()
        .set_current_issi(0x7)
        .unwrap();
    let err = q
        .exec(CmdOpcode::SetIssi, 0, &cmd, SetIssiOut::<&[u8]>::SIZE_BYTES)
        .unwrap_err();
    assert!(
        matches!(
            err,
            Mlx5Error::Command {
                status: CmdStatus::BadParam,
                ..
            }
        ),
        "{err}"
    );
    // ISSI 1 is accepted afterwards.
    SetIssiIn::new_checked(&mut cmd[..])
        .unwrap()
        .set_current_issi(1)
        .unwrap();
    q.exec(CmdOpcode::SetIssi, 0, &cmd, SetIssiOut::<&[u8]>::SIZE_BYTES)
        .unwrap();
}

#[test]
fn teardown_leaves_the_firmware_holding_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let options = Options {
        firmware: FirmwareOptions {
            boot_pages: 600,
            init_pages: 1100,
            ..FirmwareOptions::default()
        },
        ..options()
    };
    let r = connect(
        Emulator::start(dir.path().join("mlx5.sock"), options).unwrap(),
        dir,
    );
    let hca = Hca::bring_up(r.function.clone(), hca_options()).unwrap();
    let info = hca.info();
    assert_eq!(
        (info.pages.boot, info.pages.init, info.pages.held),
        (600, 1100, 1700)
    );
    let acc = fw(&r).accounting();
    assert_eq!(acc.phase, Phase::Initialized);
    assert_eq!((acc.pages_held, acc.uars, acc.pds), (1700, 1, 1));
    assert_eq!(fw(&r).issi(), 1);
    assert_eq!(fw(&r).host_endianness(), Some(0), "little-endian host");
    assert!(
        fw(&r)
            .driver_version()
            .is_some_and(|v| v.starts_with("rnic,rnic-mlx5,")),
        "{:?}",
        fw(&r).driver_version()
    );
    // 600 = 512 + 88 and 1100 = 512 + 512 + 76: five gives.
    let gives = fw(&r).stats().executed(CmdOpcode::ManagePages);
    assert_eq!(gives, 5);
    hca.shutdown().unwrap();
    let acc = fw(&r).accounting();
    assert_eq!(acc.phase, Phase::Disabled);
    assert!(acc.is_clean(), "{acc:?}");
    // 1700 pages back in ceil(1700 / 512) = 4 takes.
    assert_eq!(fw(&r).stats().executed(CmdOpcode::ManagePages), gives + 4);
}

#[test]
fn a_failure_at_any_bring_up_step_is_undone() {
    let r = rig();
    let steps = [
        CmdOpcode::EnableHca,
        CmdOpcode::QueryIssi,
        CmdOpcode::SetIssi,
        CmdOpcode::QueryPages,
        CmdOpcode::ManagePages,
        CmdOpcode::AccessReg,
        CmdOpcode::QueryHcaCap,
        CmdOpcode::SetHcaCap,
        CmdOpcode::InitHca,
        CmdOpcode::AllocUar,
        CmdOpcode::AllocPd,
    ];
    for (i, &op) in steps.iter().enumerate() {
        let syndrome = 0x5000 + i as u32;
        fw(&r)
            .faults()
            .fail_next(op, CmdStatus::ExceedLim, syndrome);
        let err = Hca::bring_up(r.function.clone(), hca_options()).unwrap_err();
        match err {
            Mlx5Error::Command {
                opcode,
                status: CmdStatus::ExceedLim,
                syndrome: s,
                ..
            } if opcode == op && s == syndrome => {}
            other => panic!("{op}: expected its EXCEED_LIM, got {other}"),
        }
        let acc = fw(&r).accounting();
        assert!(acc.is_clean(), "{op}: {acc:?}");
        assert_eq!(acc.phase, Phase::Disabled, "{op}");
    }
    // A failing SET_DRIVER_VERSION is informational only.
    fw(&r)
        .faults()
        .fail_next(CmdOpcode::SetDriverVersion, CmdStatus::BadParam, 0);
    let hca = Hca::bring_up(r.function.clone(), hca_options()).unwrap();
    assert_eq!(fw(&r).stats().injected, steps.len() as u64 + 1);
    hca.shutdown().unwrap();
    assert!(fw(&r).accounting().is_clean());
}

#[test]
fn a_swallowed_command_times_out_and_the_driver_goes_on() {
    let r = rig();
    let hca = Hca::bring_up(
        r.function.clone(),
        HcaOptions {
            cmd_timeout: Some(Duration::from_millis(300)),
            ..hca_options()
        },
    )
    .unwrap();
    fw(&r).faults().swallow_next(Some(CmdOpcode::AllocPd));
    let err = alloc_pd(&hca).unwrap_err();
    assert!(
        matches!(
            err,
            Mlx5Error::CommandTimeout {
                opcode: CmdOpcode::AllocPd,
                slot: 0,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(hca.cmdq().stuck_slots(), 1, "slot 0 stays reserved");
    // The next command runs in another slot.
    let pd = alloc_pd(&hca).unwrap();
    dealloc_pd(&hca, pd).unwrap();
    assert_eq!(fw(&r).stats().swallowed, 1);
    hca.shutdown().unwrap();
    let acc = fw(&r).accounting();
    assert!(acc.is_clean(), "{acc:?}");
}

#[test]
fn a_swallowed_bring_up_command_fails_clearly_and_a_new_bring_up_recovers() {
    let r = rig();
    fw(&r).faults().swallow_next(Some(CmdOpcode::InitHca));
    let err = Hca::bring_up(
        r.function.clone(),
        HcaOptions {
            cmd_timeout: Some(Duration::from_millis(300)),
            ..hca_options()
        },
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            Mlx5Error::CommandTimeout {
                opcode: CmdOpcode::InitHca,
                ..
            }
        ),
        "{err}"
    );
    // The firmware answers other slots: the failed bring-up's teardown took
    // every page back and disabled the function, slot 0 stays reserved.
    let acc = fw(&r).accounting();
    assert!(acc.is_clean(), "{acc:?}");
    assert_eq!(acc.phase, Phase::Disabled);
    // The next bring-up resets the function (its old queue is seen).
    let hca = Hca::bring_up(r.function.clone(), hca_options()).unwrap();
    assert!(hca.info().reset_first);
    hca.shutdown().unwrap();
    let acc = fw(&r).accounting();
    assert!(acc.is_clean(), "{acc:?}");
}

#[test]
fn a_fatal_firmware_error_shows_in_the_health_buffer_and_commands_time_out() {
    let r = rig();
    let hca = Hca::bring_up(
        r.function.clone(),
        HcaOptions {
            cmd_timeout: Some(Duration::from_millis(200)),
            ..hca_options()
        },
    )
    .unwrap();
    let health = hca.health().unwrap();
    assert!(!health.is_fatal(), "{health:?}");
    assert!(fw(&r).faults().fatal(HealthSyndrome::HwFatal));
    let health = hca.health().unwrap();
    assert!(health.is_fatal());
    assert_eq!(health.syndrome, Some(HealthSyndrome::HwFatal));
    let err = alloc_pd(&hca).unwrap_err();
    assert!(matches!(err, Mlx5Error::CommandTimeout { .. }), "{err}");
    // Teardown gives up after its first timeout and still unmaps everything.
    let start = Instant::now();
    assert!(matches!(
        hca.shutdown(),
        Err(Mlx5Error::CommandTimeout { .. })
    ));
    assert!(start.elapsed() < Duration::from_secs(2));
    assert_eq!(mappings(&r), 0);
}

#[test]
fn commands_from_several_threads_are_serialized() {
    let r = rig();
    let hca = Arc::new(Hca::bring_up(r.function.clone(), hca_options()).unwrap());
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let hca = hca.clone();
            std::thread::spawn(move || {
                for _ in 0..25 {
                    let pd = alloc_pd(&hca).unwrap();
                    dealloc_pd(&hca, pd).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(fw(&r).accounting().pds, 1, "only the Hca's own PD is left");
    Arc::into_inner(hca).unwrap().shutdown().unwrap();
    assert!(fw(&r).accounting().is_clean());
}
