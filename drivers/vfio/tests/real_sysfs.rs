//! rnic-vfio against the running kernel's sysfs (no VFIO device needed):
//! the errors a user meets first must name what exists and what to do.
#![allow(clippy::unwrap_used)]

use rnic_core::PciAddr;
use rnic_vfio::{Sysfs, VfioDevice, VfioError};

#[test]
fn a_wrong_pci_address_lists_the_devices_that_exist() {
    let sysfs = Sysfs::system();
    let present = sysfs.devices();
    // Domain ffff is never populated.
    let addr: PciAddr = "ffff:ff:1f.7".parse().unwrap();
    let e = VfioDevice::open(&addr).unwrap_err();
    match &e {
        VfioError::NoSuchDevice {
            present: listed, ..
        } => assert_eq!(listed, &present),
        other => panic!("expected NoSuchDevice, got {other}"),
    }
    let msg = e.to_string();
    assert!(msg.contains("lspci -D"), "{msg}");
    if let Some(first) = present.first() {
        assert!(msg.contains(first.as_str()), "{msg}");
    }
}

#[test]
fn every_real_device_has_a_group_or_a_no_iommu_error_that_says_how_to_enable_it() {
    let sysfs = Sysfs::system();
    for d in sysfs.devices() {
        let Ok(addr) = d.parse::<PciAddr>() else {
            continue;
        };
        match sysfs.iommu_group(&addr) {
            Ok(g) => assert!(
                sysfs.group_devices(g).iter().any(|(m, _)| *m == d),
                "{d} is not listed in its own group {g}"
            ),
            Err(e) => {
                let m = e.to_string();
                assert!(
                    m.contains("intel_iommu=on") && m.contains("amd_iommu=on"),
                    "{m}"
                );
            }
        }
        // Opening a device not bound to vfio-pci says how to bind it.
        if sysfs.iommu_group(&addr).is_ok() && sysfs.driver(&addr).as_deref() != Some("vfio-pci") {
            let m = VfioDevice::open(&addr).unwrap_err().to_string();
            assert!(m.contains(&format!("rnicctl bind {d}")), "{m}");
        }
    }
}
