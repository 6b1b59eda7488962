//! Topology on hwloc: a synthetic two-node machine (tests/fixtures,
//! hand-written hwloc XML: a PCIe switch with a NIC and a GPU on node 0, a
//! second host bridge with a NIC on node 0, nested switches and a root port
//! on node 1) with every NCCL relation, the distance matrix and the
//! pairings; then this machine, whatever it has.
#![cfg(feature = "topology")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use rnic_core::PciAddr;
use rnic_gpu::topo::{DeviceKind, PciRelation, TopoError, Topology};

fn fixture() -> Topology {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/two-node-nic-gpu.xml");
    Topology::from_xml_file(&path).expect("fixture loads")
}

fn a(s: &str) -> PciAddr {
    s.parse().unwrap()
}

#[test]
fn fixture_nodes_cpus_and_distances() {
    let t = fixture();
    let nodes = t.nodes();
    assert_eq!(nodes.len(), 2, "{nodes:?}");
    assert_eq!((nodes[0].os_index, nodes[0].cpus.as_str()), (0, "0-3"));
    assert_eq!((nodes[1].os_index, nodes[1].cpus.as_str()), (1, "4-7"));
    assert_eq!(nodes[1].memory, 64 << 30);
    let d = t.distances().expect("the fixture has a SLIT matrix");
    assert_eq!(d.nodes, [0, 1]);
    assert_eq!(d.values, [10, 21, 21, 10]);
    assert_eq!(d.between(1, 0), Some(21));
    assert_eq!(d.between(0, 2), None);
}

#[test]
fn fixture_devices_by_address() {
    let t = fixture();
    let nic = t.pci(&a("0000:03:00.0")).unwrap();
    assert_eq!(
        (nic.vendor, nic.device, nic.class),
        (0x15b3, 0x1017, 0x0200)
    );
    assert_eq!(nic.kind, DeviceKind::Nic);
    assert_eq!((nic.node, nic.cpus.as_str()), (Some(0), "0-3"));
    assert!((nic.link_gbs - 15.75).abs() < 0.01, "{}", nic.link_gbs);
    let gpu = t.pci(&a("0000:86:00.0")).unwrap();
    assert_eq!(
        (gpu.kind, gpu.node, gpu.cpus.as_str()),
        (DeviceKind::Gpu, Some(1), "4-7")
    );
    // An InfiniBand-class function is a NIC too.
    assert_eq!(t.pci(&a("0000:83:00.0")).unwrap().kind, DeviceKind::Nic);
    let nics: Vec<String> = t.nics().iter().map(|f| f.addr.to_string()).collect();
    assert_eq!(
        nics,
        [
            "0000:03:00.0",
            "0000:11:00.0",
            "0000:83:00.0",
            "0000:87:00.0"
        ]
    );
    assert_eq!(t.gpus().len(), 2);
    // A wrong address names what is there.
    match t.pci(&a("0000:99:00.0")) {
        Err(e @ TopoError::NoSuchDevice { .. }) => {
            let m = e.to_string();
            assert!(
                m.contains("0000:99:00.0") && m.contains("0000:03:00.0") && m.contains("lspci"),
                "{m}"
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn fixture_relations_are_nccl_classes() {
    let t = fixture();
    let rel = |x: &str, y: &str| t.relation(&a(x), &a(y)).unwrap();
    assert_eq!(rel("0000:03:00.0", "0000:04:00.0"), PciRelation::SameSwitch);
    assert_eq!(rel("0000:04:00.0", "0000:03:00.0"), PciRelation::SameSwitch);
    assert_eq!(
        rel("0000:83:00.0", "0000:86:00.0"),
        PciRelation::MultiSwitch
    );
    assert_eq!(rel("0000:87:00.0", "0000:86:00.0"), PciRelation::HostBridge);
    assert_eq!(rel("0000:11:00.0", "0000:04:00.0"), PciRelation::SameNode);
    assert_eq!(rel("0000:03:00.0", "0000:86:00.0"), PciRelation::CrossNode);
    assert_eq!(rel("0000:87:00.0", "0000:04:00.0"), PciRelation::CrossNode);
    assert_eq!(
        PciRelation::MultiSwitch.to_string(),
        "PXB (several PCIe switches, no host bridge)"
    );
    assert!(PciRelation::SameSwitch.below_root_complex());
    assert!(!PciRelation::HostBridge.below_root_complex());
    assert!(matches!(
        t.relation(&a("0000:03:00.0"), &a("0000:03:00.0")),
        Err(TopoError::Same(_))
    ));
}

#[test]
fn fixture_pairs_each_gpu_with_its_closest_nic() {
    let t = fixture();
    let p = t.pairings();
    assert_eq!(p.len(), 2, "{p:?}");
    assert_eq!(
        (p[0].gpu, p[0].nic, p[0].relation, p[0].staging_node),
        (
            a("0000:04:00.0"),
            a("0000:03:00.0"),
            PciRelation::SameSwitch,
            Some(0)
        )
    );
    assert_eq!(
        (p[1].gpu, p[1].nic, p[1].relation, p[1].staging_node),
        (
            a("0000:86:00.0"),
            a("0000:83:00.0"),
            PciRelation::MultiSwitch,
            Some(1)
        )
    );
    assert_eq!(t.placement_node(&[a("0000:87:00.0")]), Some(1));
    assert_eq!(
        t.placement_node(&[a("0000:99:00.0"), a("0000:11:00.0")]),
        Some(0)
    );
}

#[test]
fn fixture_round_trips_through_xml() {
    let t = fixture();
    let again = Topology::from_xml(&t.to_xml().unwrap()).unwrap();
    assert_eq!(again.nics(), t.nics());
    assert_eq!(again.distances(), t.distances());
}

#[test]
fn bad_xml_is_a_typed_error() {
    let e = Topology::from_xml("<topology>not hwloc</topology>").unwrap_err();
    assert!(matches!(e, TopoError::Load { .. }), "{e}");
    assert!(e.to_string().contains("lstopo --of xml"), "{e}");
    let e = Topology::from_xml_file(Path::new("/nonexistent/topo.xml")).unwrap_err();
    assert!(matches!(e, TopoError::Load { .. }), "{e}");
}

/// This machine: every node hwloc sees is online in sysfs with the same
/// CPUs, and every PCI function's node is one of them (or none).
#[test]
fn this_machine_agrees_with_sysfs() {
    let t = Topology::system().expect("hwloc reads this machine");
    let nodes = t.nodes();
    assert!(!nodes.is_empty());
    for n in &nodes {
        let sys = std::fs::read_to_string(format!(
            "/sys/devices/system/node/node{}/cpulist",
            n.os_index
        ));
        if let Ok(list) = sys {
            assert_eq!(list.trim(), n.cpus, "node {} CPUs", n.os_index);
        }
    }
    for f in t.pci_functions() {
        let sysfs = std::fs::read_to_string(format!("/sys/bus/pci/devices/{}/numa_node", f.addr))
            .ok()
            .and_then(|s| s.trim().parse::<i64>().ok());
        match (f.node, sysfs) {
            (Some(n), Some(s)) if s >= 0 => assert_eq!(i64::from(n), s, "{}", f.addr),
            (Some(n), _) => assert!(nodes.iter().any(|x| x.os_index == n)),
            (None, _) => {}
        }
        assert_eq!(rnic_gpu::placement::node_of(&f.addr).map(|n| n.0), f.node);
    }
}
