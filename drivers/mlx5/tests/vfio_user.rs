//! The vfio-user transport end to end against rnic-mlx5-emu served from a
//! thread of this test process (one emulator and one socket per test).
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rnic_core::Memory;
use rnic_mlx5::{
    Mlx5Error, PCI_COMMAND, PCI_COMMAND_MASTER, PciFunction, SharedMemory, SharedPages,
    VfioUserFunction,
};
use rnic_mlx5_emu::{Device, DoorbellHandler, Emulator, FaultKind, Options, Signal};

#[derive(Clone, Debug, PartialEq, Eq)]
enum Ev {
    Cmd(u32),
    Uar(u32, u32, u64),
    Iseg(u32, u32),
    Reset,
}

#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<Ev>>>);

impl Recorder {
    fn events(&self) -> Vec<Ev> {
        self.0.lock().unwrap().clone()
    }
}

impl DoorbellHandler for Recorder {
    fn command_doorbell(&mut self, _dev: &Device, bits: u32) {
        self.0.lock().unwrap().push(Ev::Cmd(bits));
    }
    fn uar_doorbell(&mut self, _dev: &Device, page: u32, offset: u32, value: u64) {
        self.0.lock().unwrap().push(Ev::Uar(page, offset, value));
    }
    fn init_segment_write(&mut self, _dev: &Device, offset: u32, value: u32) {
        self.0.lock().unwrap().push(Ev::Iseg(offset, value));
    }
    fn reset(&mut self, _dev: &Device) {
        self.0.lock().unwrap().push(Ev::Reset);
    }
}

struct Setup {
    emu: Emulator,
    rec: Recorder,
    path: PathBuf,
    _dir: tempfile::TempDir,
}

fn setup(boot_ms: u64) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mlx5.sock");
    let rec = Recorder::default();
    let options = Options {
        boot_delay: Duration::from_millis(boot_ms),
        ..Options::default()
    };
    let emu = Emulator::start_with(&path, options, Box::new(rec.clone())).unwrap();
    Setup {
        emu,
        rec,
        path,
        _dir: dir,
    }
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

const INITIALIZING: usize = 0x1fc;
const HEALTH_COUNTER: usize = 0x1010;

#[test]
fn ids_init_segment_boot_and_health() {
    let s = setup(150);
    let f = VfioUserFunction::connect(&s.path).unwrap();
    let id = f.id();
    assert_eq!((id.vendor, id.device), (0x15b3, 0x1017));
    assert_eq!(
        f.config_read32(0x08).unwrap() >> 8,
        0x02_0000,
        "Ethernet class"
    );
    assert_eq!(f.msix_count().unwrap(), 64);
    assert!(f.reset_supported());
    let bar = f.bar0();
    assert_eq!(bar.len(), 32 << 20);
    let fw = bar.read32_be(0x000).unwrap();
    assert_eq!((fw & 0xffff, fw >> 16), (16, 35), "fw_rev major/minor");
    assert_eq!(
        bar.read32_be(0x014).unwrap() & 0xff,
        0x56,
        "32 x 64-byte entries"
    );

    assert_ne!(
        bar.read32_be(INITIALIZING).unwrap() >> 31,
        0,
        "initializing at power-on"
    );
    // Audit row 18: the revision is not readable while the firmware
    // initializes (the strict emulator reads 0 there), so a driver waits
    // for `initializing` first, as K does.
    assert_eq!(bar.read32_be(0x004).unwrap() >> 16, 0, "no revision yet");
    let t0 = Instant::now();
    wait_until("initializing to clear", || {
        bar.read32_be(INITIALIZING).unwrap() >> 31 == 0
    });
    assert!(
        t0.elapsed() >= Duration::from_millis(100),
        "cleared only after the boot delay"
    );
    let cmdif = bar.read32_be(0x004).unwrap();
    assert_eq!(
        (cmdif >> 16, cmdif & 0xffff),
        (5, 2000),
        "cmdif_rev / sub-minor"
    );

    let c0 = bar.read32_be(HEALTH_COUNTER).unwrap() & 0xff_ffff;
    wait_until("health_counter to tick twice", || {
        bar.read32_be(HEALTH_COUNTER).unwrap() & 0xff_ffff >= c0 + 2
    });
    let timer = bar.read64_be(0x1000).unwrap();
    assert!(
        timer > 100_000_000,
        "internal timer counts ns since power-on: {timer}"
    );
}

#[test]
fn doorbell_writes_through_the_mapping_reach_the_handler() {
    let s = setup(0);
    let f = VfioUserFunction::connect(&s.path).unwrap();
    let bar = f.bar0();
    bar.write32_be(0x018, 1 << 31).unwrap();
    wait_until("command doorbell", || {
        s.rec.events().contains(&Ev::Cmd(1 << 31))
    });
    bar.write32_be(0x018, 1 << 31).unwrap();
    wait_until("second identical ring", || {
        s.rec
            .events()
            .iter()
            .filter(|e| **e == Ev::Cmd(1 << 31))
            .count()
            == 2
    });
    assert_eq!(bar.read32_be(0x018).unwrap(), 0, "the doorbell is consumed");

    bar.write32_be(0x010, 0x1).unwrap();
    bar.write32_be(0x014, 0x2345_6000).unwrap();
    wait_until("cmdq address events", || {
        let ev = s.rec.events();
        ev.contains(&Ev::Iseg(0x010, 1)) && ev.contains(&Ev::Iseg(0x014, 0x2345_6000))
    });
    assert_eq!(
        bar.read32_be(0x014).unwrap(),
        0x2345_6056,
        "address kept, geometry restored in the low byte"
    );

    s.emu.device().watch_uar(3).unwrap();
    // Let the watcher take its first look at the page.
    std::thread::sleep(Duration::from_millis(20));
    let uar = f.uar(3).unwrap();
    uar.write64_be(0x800, 0x0000_0100_0012_3408).unwrap();
    uar.write32_be(0x040, 0x0200_0005).unwrap();
    wait_until("UAR doorbells", || {
        let ev = s.rec.events();
        ev.contains(&Ev::Uar(3, 0x800, 0x0000_0100_0012_3408))
            && ev.contains(&Ev::Uar(3, 0x040, 0x0200_0005))
    });
    let dev = s.emu.device();
    assert!(dev.stats().uar_doorbells.load(Ordering::Relaxed) >= 2);
    // A page that is not watched produces nothing.
    f.uar(4).unwrap().write64_be(0x800, 7).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    assert!(!s.rec.events().iter().any(|e| matches!(e, Ev::Uar(4, ..))));
}

#[test]
fn dma_both_ways_faults_and_unmap() {
    let s = setup(0);
    let dev = s.emu.device().clone();
    let f = VfioUserFunction::connect(&s.path).unwrap();
    let buf = f.alloc_dma(8192).unwrap();
    let iova = buf.iova().0;
    assert_eq!(
        dev.dma().mappings(),
        vec![(iova, buf.shared().len() as u64)]
    );

    // Bus mastering off: the device may not touch memory.
    let mut b4 = [0u8; 4];
    assert_eq!(
        dev.dma_read(iova, &mut b4).unwrap_err().kind,
        FaultKind::BusMasterDisabled
    );
    let cmd = f.enable_bus_master().unwrap();
    assert_ne!(cmd & PCI_COMMAND_MASTER, 0);

    dev.dma_write(iova + 16, b"from the device").unwrap();
    let mut seen = [0u8; 15];
    buf.read(16, &mut seen).unwrap();
    assert_eq!(&seen, b"from the device");

    buf.write(100, b"from the driver").unwrap();
    let mut got = [0u8; 15];
    dev.dma_read(iova + 100, &mut got).unwrap();
    assert_eq!(&got, b"from the driver");

    // One byte past the mapping: a typed, counted fault that touches nothing.
    let mapped = buf.shared().len() as u64;
    let faults = dev.dma().stats().faults.load(Ordering::Relaxed);
    let err = dev.dma_write(iova + mapped - 4, &[0xAB; 5]).unwrap_err();
    assert_eq!((err.kind, err.at), (FaultKind::Unmapped, iova + mapped));
    assert_eq!(dev.dma().stats().faults.load(Ordering::Relaxed), faults + 1);
    let mut tail_dev = [1u8; 4];
    dev.dma_read(iova + mapped - 4, &mut tail_dev).unwrap();
    assert_eq!(
        tail_dev, [0; 4],
        "the in-range bytes of the faulting write are untouched"
    );

    drop(buf);
    assert!(
        dev.dma().mappings().is_empty(),
        "DMA_UNMAP before the buffer is freed"
    );
    let err = dev.dma_read(iova, &mut b4).unwrap_err();
    assert_eq!(err.kind, FaultKind::Unmapped);
}

#[test]
fn dma_domain_refuses_anonymous_memory_with_a_fix() {
    let s = setup(0);
    let f = VfioUserFunction::connect(&s.path).unwrap();
    let err = rnic_dma::DmaRegion::builder(4096)
        .pin(false)
        .domain(f.dma_domain())
        .build()
        .unwrap_err();
    let msg = format!(
        "{err} / {:?}",
        std::error::Error::source(&err).map(|e| e.to_string())
    );
    assert!(msg.contains("not file-backed"), "{msg}");
    assert!(s.emu.device().dma().mappings().is_empty());
}

#[test]
fn msix_eventfds_fire_on_signal() {
    let s = setup(0);
    let dev = s.emu.device().clone();
    let f = VfioUserFunction::connect(&s.path).unwrap();
    let vectors = f.enable_msix(20).unwrap();
    assert_eq!(vectors.len(), 20);
    wait_until("vectors connected", || dev.msix().connected(19));
    assert_eq!(dev.signal(2).unwrap(), Signal::BusMasterDisabled);
    f.enable_bus_master().unwrap();
    assert_eq!(dev.signal(2).unwrap(), Signal::Delivered);
    assert_eq!(
        dev.signal(17).unwrap(),
        Signal::Delivered,
        "second SET_IRQS chunk"
    );
    assert_eq!(vectors[2].wait(Duration::from_secs(2)).unwrap(), Some(1));
    assert_eq!(vectors[17].wait(Duration::from_secs(2)).unwrap(), Some(1));
    assert_eq!(vectors[0].take().unwrap(), None, "other vectors stay quiet");
    assert!(matches!(
        f.enable_msix(65),
        Err(Mlx5Error::Vectors { count: 64, .. })
    ));
    f.disable_msix().unwrap();
    assert_eq!(dev.signal(2).unwrap(), Signal::NotConnected);
    assert_eq!(vectors[2].take().unwrap(), None);
}

#[test]
fn reset_restores_the_power_on_state() {
    let s = setup(30);
    let dev = s.emu.device().clone();
    let f = VfioUserFunction::connect(&s.path).unwrap();
    let bar = f.bar0();
    wait_until("boot", || bar.read32_be(INITIALIZING).unwrap() >> 31 == 0);
    f.enable_bus_master().unwrap();
    bar.write32_be(0x010, 0xdead).unwrap();
    let buf = f.alloc_dma(4096).unwrap();
    wait_until("health", || bar.read32_be(HEALTH_COUNTER).unwrap() > 0);
    wait_until("cmdq_addr_h seen", || {
        s.rec.events().contains(&Ev::Iseg(0x010, 0xdead))
    });

    f.reset().unwrap();
    assert!(s.rec.events().contains(&Ev::Reset));
    assert_ne!(
        bar.read32_be(INITIALIZING).unwrap() >> 31,
        0,
        "initializing again"
    );
    assert_eq!(bar.read32_be(0x010).unwrap(), 0);
    assert_eq!(bar.read32_be(0x014).unwrap() & 0xff, 0x56);
    assert_eq!(
        f.config_read16(PCI_COMMAND).unwrap() & PCI_COMMAND_MASTER,
        0
    );
    wait_until("boot after reset", || {
        bar.read32_be(INITIALIZING).unwrap() >> 31 == 0
    });
    assert_eq!(bar.read32_be(0x004).unwrap() >> 16, 5);
    // DMA mappings survive a function reset (they are the IOMMU's).
    f.enable_bus_master().unwrap();
    dev.dma_write(buf.iova().0, &[5]).unwrap();
    let mut b = [0u8];
    buf.read(0, &mut b).unwrap();
    assert_eq!(b, [5]);
}

fn raw_version(stream: &mut UnixStream, message_size: u32, payload: &[u8]) {
    let mut msg = Vec::new();
    msg.extend_from_slice(&0u16.to_ne_bytes()); // message id
    msg.extend_from_slice(&1u16.to_ne_bytes()); // VERSION
    msg.extend_from_slice(&message_size.to_ne_bytes());
    msg.extend_from_slice(&0u32.to_ne_bytes()); // flags: command
    msg.extend_from_slice(&0u32.to_ne_bytes()); // error
    msg.extend_from_slice(&0u16.to_ne_bytes()); // major
    msg.extend_from_slice(&1u16.to_ne_bytes()); // minor
    msg.extend_from_slice(payload);
    stream.write_all(&msg).unwrap();
}

fn expect_closed(stream: &mut UnixStream) {
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut b = [0u8; 64];
    assert_eq!(
        stream.read(&mut b).unwrap(),
        0,
        "the server drops the connection"
    );
}

#[test]
fn malformed_version_is_contained_and_the_next_driver_is_served() {
    let s = setup(0);
    let dev = s.emu.device().clone();

    // A capability string without its NUL: the crate's handler unwraps it.
    let mut c = UnixStream::connect(&s.path).unwrap();
    raw_version(&mut c, 24, b"abcd");
    expect_closed(&mut c);
    wait_until("first panic contained", || {
        dev.stats().contained_panics.load(Ordering::Relaxed) == 1
    });

    // A message size smaller than the VERSION header: the crate subtracts.
    let mut c = UnixStream::connect(&s.path).unwrap();
    raw_version(&mut c, 16, b"");
    expect_closed(&mut c);
    wait_until("second panic contained", || {
        dev.stats().contained_panics.load(Ordering::Relaxed) == 2
    });

    let f = VfioUserFunction::connect(&s.path).unwrap();
    assert_eq!(f.id().device, 0x1017);
}

#[test]
fn a_second_driver_gets_a_fresh_function_after_the_first_disconnects() {
    let s = setup(20);
    let dev = s.emu.device().clone();
    // A driver that dies without unmapping anything: the raw client, whose
    // socket closes with its mapping and vectors still installed.
    let mem = SharedMemory::new(4096, SharedPages::Base).unwrap();
    let efd = nix::sys::eventfd::EventFd::new().unwrap();
    let mut raw = vfio_user::Client::new(&s.path).unwrap();
    wait_until("boot", || !dev.initializing());
    raw.region_write(7, 4, &[0x06, 0]).unwrap();
    raw.dma_map(0, 0x10_0000, 4096, mem.fd().as_raw_fd())
        .unwrap();
    raw.set_irqs(2, 4 | 0x20, 1, 1, &[efd.as_raw_fd()]).unwrap();
    assert_eq!(dev.dma().mappings(), vec![(0x10_0000, 4096)]);
    assert!(dev.msix().connected(1) && dev.bus_master());
    drop(raw);
    wait_until("disconnect handled", || {
        dev.stats().connections.load(Ordering::Relaxed) == 1
    });
    assert!(dev.dma().mappings().is_empty(), "its mappings are dropped");
    assert!(!dev.msix().connected(1), "its eventfds are dropped");
    assert!(!dev.bus_master(), "the function was reset");

    let f2 = VfioUserFunction::connect(&s.path).unwrap();
    assert_eq!(f2.id().vendor, 0x15b3);
    assert_ne!(
        f2.bar0().read32_be(INITIALIZING).unwrap() >> 31,
        0,
        "booting again after the reset"
    );
    let buf2 = f2.alloc_dma(4096).unwrap();
    f2.enable_bus_master().unwrap();
    dev.dma_write(buf2.iova().0, b"hi").unwrap();
    let mut b = [0u8; 2];
    buf2.read(0, &mut b).unwrap();
    assert_eq!(&b, b"hi");
}
