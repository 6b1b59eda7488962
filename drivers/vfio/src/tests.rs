//! The open → map → teardown flow on the scripted kernel (`ioctls_fake.rs`)
//! and a synthetic sysfs tree.

use std::fs;
use std::ptr::NonNull;

use rnic_core::Iova;
use rnic_core::PciAddr;
use rnic_dma::{DmaRegion, Mapper, PagePolicy, PageSize};

use crate::ioctls::{self, Call, Script};
use crate::sysfs::tests::Tree;
use crate::*;

const EDU: &str = "0000:00:02.0";
const EDU_MASK: u64 = (1 << 28) - 1;

fn addr() -> PciAddr {
    EDU.parse().unwrap()
}

fn edu_tree() -> Tree {
    let t = Tree::new(&[(EDU, Some(2), Some("vfio-pci"), 0x1234, 0x11e8)]);
    fs::write(t.root.join("dev/vfio/vfio"), "").unwrap();
    fs::write(t.root.join("dev/vfio/2"), "").unwrap();
    t
}

fn open(t: &Tree) -> VfioDevice {
    ioctls::script(Script::default());
    VfioDevice::open_in(&t.sysfs(), &addr()).unwrap()
}

#[test]
fn open_attaches_the_group_selects_type1v2_and_reads_the_iova_ranges() {
    let t = edu_tree();
    let dev = open(&t);
    let c = ioctls::calls();
    assert_eq!(
        c,
        vec![
            Call::Open(t.root.join("dev/vfio/vfio")),
            Call::Open(t.root.join("dev/vfio/2")),
            Call::SetContainer,
            Call::SetIommu(3),
            Call::GetDeviceFd(EDU.into()),
        ]
    );
    assert_eq!(dev.container().group(), 2);
    assert!(dev.container().has_iova_range_cap());
    assert_eq!(
        dev.container().iova_ranges(),
        vec![0..=0xFEDF_FFFF, 0xFEF0_0000..=0x7F_FFFF_FFFF]
    );
    assert_eq!(dev.container().iova_pgsizes(), 0x4020_1000);
    let a = dev.container().iova_allocator(EDU_MASK);
    assert_eq!(
        a.free_ranges().collect::<Vec<_>>(),
        vec![0x1000..=EDU_MASK],
        "clipped to the DMA mask; IOVA 0 never handed out"
    );
    assert!(dev.info().reset_supported());
    assert!(dev.backend().describe().contains("TYPE1v2"));
    drop(dev);
    assert_eq!(
        ioctls::calls().last(),
        Some(&Call::UnsetContainer),
        "group detached on drop"
    );
}

#[test]
fn without_the_iova_range_capability_the_low_4_gib_are_used() {
    let t = edu_tree();
    ioctls::script(Script {
        iommu_info: info::encode_iommu_info(0x1000, None),
        ..Script::default()
    });
    let dev = VfioDevice::open_in(&t.sysfs(), &addr()).unwrap();
    assert!(!dev.container().has_iova_range_cap());
    assert_eq!(dev.container().iova_ranges(), vec![FALLBACK_APERTURE]);
}

#[test]
fn open_errors_say_what_to_do() {
    let t = edu_tree();
    let s = t.sysfs();
    ioctls::script(Script {
        open_errno: vec![(t.root.join("dev/vfio/2"), libc::EACCES)],
        ..Script::default()
    });
    let e = VfioDevice::open_in(&s, &addr()).unwrap_err().to_string();
    assert!(
        e.contains("permission denied (owner uid") && e.contains("chown"),
        "{e}"
    );

    ioctls::script(Script {
        open_errno: vec![(t.root.join("dev/vfio/vfio"), libc::ENOENT)],
        ..Script::default()
    });
    let e = VfioDevice::open_in(&s, &addr()).unwrap_err().to_string();
    assert!(e.contains("`modprobe vfio-pci`"), "{e}");

    ioctls::script(Script {
        type1v2: false,
        ..Script::default()
    });
    let e = VfioDevice::open_in(&s, &addr()).unwrap_err().to_string();
    assert!(e.contains("no VFIO_TYPE1v2_IOMMU"), "{e}");

    ioctls::script(Script {
        group_flags: 0,
        ..Script::default()
    });
    let e = VfioDevice::open_in(&s, &addr()).unwrap_err();
    assert!(
        matches!(e, VfioError::GroupNotViable { group: 2, .. }),
        "{e}"
    );
    assert!(
        !ioctls::calls().contains(&Call::SetContainer),
        "nothing attached for a non-viable group"
    );

    let wrong: PciAddr = "0000:00:09.0".parse().unwrap();
    let e = VfioDevice::open_in(&s, &wrong).unwrap_err().to_string();
    assert!(e.contains("no such device") && e.contains(EDU), "{e}");
}

#[test]
fn a_dma_region_is_mapped_through_the_container_and_unmapped_on_drop() {
    let t = edu_tree();
    let dev = open(&t);
    let region = DmaRegion::builder(8192)
        .pages(PagePolicy::Require(PageSize::Base))
        .pin(false)
        .domain(dev.dma_domain(EDU_MASK))
        .build()
        .unwrap();
    let iova = region.iova().0;
    assert!(
        iova + 8191 <= EDU_MASK && iova.is_multiple_of(4096),
        "{iova:#x}"
    );
    assert_eq!(dev.container().mappings(), vec![(iova, 8192)]);
    assert!(ioctls::calls().contains(&Call::Map {
        vaddr: region.as_ptr() as usize,
        iova,
        size: 8192,
        writable: true,
    }));
    drop(dev);
    assert!(
        !ioctls::calls().contains(&Call::UnsetContainer),
        "the region's domain keeps the group attached"
    );
    drop(region);
    let c = ioctls::calls();
    let unmap = c
        .iter()
        .position(|x| *x == Call::Unmap { iova, size: 8192 });
    let unset = c.iter().position(|x| *x == Call::UnsetContainer);
    assert!(unmap.is_some() && unset.is_some() && unmap < unset, "{c:?}");
}

#[test]
fn map_bookkeeping_refuses_overlaps_unknown_unmaps_and_short_unmaps() {
    let t = edu_tree();
    let dev = open(&t);
    let c = dev.container();
    let host = NonNull::<u8>::dangling();
    // SAFETY: the fake kernel never touches the memory.
    unsafe { c.map_dma(0x10_0000, host, 0x2000) }.unwrap();
    // SAFETY: as above.
    let e = unsafe { c.map_dma(0x10_1000, host, 0x1000) }.unwrap_err();
    assert!(
        e.to_string()
            .contains("overlaps the live mapping 0x100000+0x2000"),
        "{e}"
    );
    // SAFETY: as above.
    unsafe { c.map_dma(0x10_2000, host, 0x1000) }.unwrap();
    assert!(c.unmap_dma(0x10_0000, 0x1000).is_err(), "length must match");
    assert!(c.unmap_dma(0x20_0000, 0x1000).is_err(), "unknown IOVA");
    ioctls::edit(|s| s.unmap_short = Some(0x1000));
    let e = c.unmap_dma(0x10_0000, 0x2000).unwrap_err();
    assert!(e.to_string().contains("unmapped 0x1000 bytes"), "{e}");
    assert_eq!(c.mappings().len(), 2, "a short unmap keeps the entry");
    ioctls::edit(|s| s.unmap_short = None);
    c.unmap_dma(0x10_0000, 0x2000).unwrap();
    c.unmap_dma(0x10_2000, 0x1000).unwrap();
    assert!(c.mappings().is_empty());
}

/// `map_dma_read_only` (and the mapper's `map_read_only`) asks the kernel
/// for a read-only mapping: VFIO_DMA_MAP_FLAG_READ alone.
#[test]
fn a_read_only_map_leaves_out_the_write_flag() {
    let t = edu_tree();
    let dev = open(&t);
    let c = dev.container();
    let host = NonNull::<u8>::dangling();
    // SAFETY: the fake kernel never touches the memory.
    unsafe { c.map_dma_read_only(0x30_0000, host, 0x1000) }.unwrap();
    let mapper = VfioMapper(c.clone());
    // SAFETY: as above.
    unsafe { mapper.map_read_only(Iova(0x40_0000), host, 0x2000) }.unwrap();
    // SAFETY: as above.
    unsafe { mapper.map(Iova(0x50_0000), host, 0x1000) }.unwrap();
    let maps: Vec<(u64, bool)> = ioctls::calls()
        .into_iter()
        .filter_map(|x| match x {
            Call::Map { iova, writable, .. } => Some((iova, writable)),
            _ => None,
        })
        .collect();
    assert_eq!(
        maps,
        [(0x30_0000, false), (0x40_0000, false), (0x50_0000, true)]
    );
    assert_eq!(c.mappings().len(), 3, "bookkept as any mapping");
    for (iova, len) in c.mappings() {
        c.unmap_dma(iova, len).unwrap();
    }
}

#[test]
fn a_map_refused_for_memlock_names_the_limit_and_the_fix() {
    let t = edu_tree();
    let dev = open(&t);
    ioctls::edit(|s| s.map_errno = Some(libc::ENOMEM));
    // SAFETY: the fake kernel never touches the memory.
    let e = unsafe { dev.container().map_dma(0, NonNull::dangling(), 1 << 20) }.unwrap_err();
    let m = e.to_string();
    assert!(
        m.contains("RLIMIT_MEMLOCK (now 65536 bytes)") && m.contains("ulimit -l"),
        "{m}"
    );
    assert!(dev.container().mappings().is_empty());
}

#[test]
fn bar_mmio_owns_its_mapping_and_keeps_the_group_attached() {
    let t = edu_tree();
    let dev = open(&t);
    let bar = dev.map_bar(0).unwrap();
    assert_eq!(bar.len(), 4096);
    bar.write32(4, 0x1234_5678).unwrap();
    assert_eq!(bar.read32(4).unwrap(), 0x1234_5678);
    assert!(bar.read32(4096).is_err(), "bounds-checked");
    assert!(
        dev.map_bar(1)
            .unwrap_err()
            .to_string()
            .contains("not implemented")
    );
    assert!(
        dev.map_bar(7)
            .unwrap_err()
            .to_string()
            .contains("not a BAR")
    );
    drop(dev);
    assert!(!ioctls::calls().contains(&Call::UnsetContainer));
    drop(bar);
    let c = ioctls::calls();
    assert_eq!(
        &c[c.len() - 2..],
        &[Call::Munmap { len: 4096 }, Call::UnsetContainer]
    );
}

#[test]
fn bus_master_sets_memory_and_master_in_pci_command() {
    let t = edu_tree();
    let dev = open(&t);
    let cfg = dev.region(VFIO_PCI_CONFIG_REGION_INDEX).unwrap();
    ioctls::edit(|s| s.file[cfg.offset as usize + 4] = 0x01); // I/O space on
    assert_eq!(dev.enable_bus_master().unwrap(), 0x0007);
    assert!(ioctls::calls().contains(&Call::Write {
        offset: cfg.offset + PCI_COMMAND,
        bytes: vec![0x07, 0x00]
    }));
    assert_eq!(
        dev.config_read32(0).unwrap(),
        0,
        "other registers untouched"
    );
}

#[test]
fn interrupts_are_routed_to_eventfds_and_bounded_by_the_device() {
    let t = edu_tree();
    let dev = open(&t);
    let irqs = dev.enable_msix(3).unwrap();
    assert_eq!(
        irqs.iter().map(|i| i.vector).collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    let Some(Call::SetIrqs(words)) = ioctls::calls().last().cloned() else {
        panic!("no SET_IRQS")
    };
    assert_eq!(&words[..5], &[32, 0x24, VFIO_PCI_MSIX_IRQ_INDEX, 0, 3]);
    let fds: Vec<u32> = irqs
        .iter()
        .map(|i| std::os::fd::AsRawFd::as_raw_fd(&std::os::fd::AsFd::as_fd(i)) as u32)
        .collect();
    assert_eq!(&words[5..], &fds[..], "one eventfd per vector, in order");
    let e = dev.enable_msi(2).unwrap_err();
    assert!(
        matches!(
            e,
            VfioError::Irq {
                wanted: 2,
                count: 1,
                ..
            }
        ),
        "{e}"
    );
    dev.disable_irqs(VFIO_PCI_MSIX_IRQ_INDEX).unwrap();
    dev.reset().unwrap();
    assert_eq!(ioctls::calls().last(), Some(&Call::Reset));
    ioctls::edit(|s| s.device.flags = 0);
    let t2 = edu_tree();
    let no_reset = VfioDevice::open_in(&t2.sysfs(), &addr()).unwrap();
    assert!(matches!(
        no_reset.reset(),
        Err(VfioError::ResetUnsupported { .. })
    ));
}

/// A tree with the iommufd cdev for the edu function: `/dev/iommu`,
/// `vfio-dev/vfio0` under the device, `/dev/vfio/devices/vfio0`.
fn cdev_tree() -> Tree {
    let t = edu_tree();
    fs::write(t.root.join("dev/iommu"), "").unwrap();
    fs::create_dir_all(
        t.root
            .join(format!("sys/bus/pci/devices/{EDU}/vfio-dev/vfio0")),
    )
    .unwrap();
    fs::create_dir_all(t.root.join("dev/vfio/devices")).unwrap();
    fs::write(t.root.join("dev/vfio/devices/vfio0"), "").unwrap();
    t
}

#[test]
fn iommufd_route_binds_attaches_exports_maps_and_unmaps_in_order() {
    let t = cdev_tree();
    ioctls::script(Script::default());
    let fd = Iommufd::open_in(&t.sysfs()).unwrap();
    assert_eq!(fd.ioas(), 7);
    let dev = CdevDevice::open_in(&t.sysfs(), &addr(), &fd).unwrap();
    assert_eq!(dev.devid(), 3);
    let buf = dev.export_bar(2, 0x1000, 0x4000).unwrap();
    let m = fd.map_file(buf, 0, 0x4000, 0x10_0000).unwrap();
    assert_eq!((m.iova(), m.len()), (0x10_0000, 0x4000));
    drop(fd);
    drop(dev);
    assert!(
        !ioctls::calls().contains(&Call::Destroy(7)),
        "the IOAS went while a mapping still used it"
    );
    drop(m);
    assert_eq!(
        ioctls::calls(),
        vec![
            Call::Open(t.root.join("dev/iommu")),
            Call::IoasAlloc,
            Call::Open(t.root.join("dev/vfio/devices/vfio0")),
            Call::BindIommufd,
            Call::AttachPt(7),
            Call::ExportDmabuf {
                index: 2,
                offset: 0x1000,
                length: 0x4000
            },
            Call::MapFile {
                ioas: 7,
                start: 0,
                length: 0x4000,
                iova: 0x10_0000
            },
            Call::IoasUnmap {
                ioas: 7,
                iova: 0x10_0000,
                length: 0x4000
            },
            Call::Destroy(7),
        ]
    );
}

#[test]
fn iommufd_route_errors_name_what_the_kernel_lacks() {
    // No /dev/iommu.
    let t = edu_tree();
    ioctls::script(Script::default());
    let e = Iommufd::open_in(&t.sysfs()).unwrap_err().to_string();
    assert!(
        e.contains("no /dev/iommu") && e.contains("CONFIG_IOMMUFD"),
        "{e}"
    );
    // /dev/iommu but no device cdev (a 6.1 kernel).
    fs::write(t.root.join("dev/iommu"), "").unwrap();
    let fd = Iommufd::open_in(&t.sysfs()).unwrap();
    let e = CdevDevice::open_in(&t.sysfs(), &addr(), &fd)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("CONFIG_VFIO_DEVICE_CDEV") && e.contains("rnicctl bind"),
        "{e}"
    );
    // A cdev but no dma-buf export (before 6.19).
    let t = cdev_tree();
    ioctls::script(Script {
        dmabuf_errno: Some(libc::ENOTTY),
        map_file_errno: Some(libc::EOPNOTSUPP),
        ..Script::default()
    });
    let fd = Iommufd::open_in(&t.sysfs()).unwrap();
    let dev = CdevDevice::open_in(&t.sysfs(), &addr(), &fd).unwrap();
    let e = dev.export_bar(2, 0, 0x1000).unwrap_err().to_string();
    assert!(e.contains("Linux 6.19+") && e.contains("PCI_P2PDMA"), "{e}");
    assert!(dev.export_bar(6, 0, 0x1000).is_err());
    assert!(dev.export_bar(2, 0x10, 0x1000).is_err());
    // A dma-buf iommufd refuses (e.g. a CUDA one): says so, maps nothing.
    let other: std::os::fd::OwnedFd = fs::File::open("/dev/null").unwrap().into();
    let e = fd
        .map_file(other, 0, 0x1000, 0x2000)
        .unwrap_err()
        .to_string();
    assert!(e.contains("CUDA dma-buf cannot be mapped"), "{e}");
    assert!(
        !ioctls::calls()
            .iter()
            .any(|c| matches!(c, Call::IoasUnmap { .. })),
        "nothing was mapped, so nothing is unmapped"
    );
}
