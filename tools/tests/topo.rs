//! `rnicctl topo` and the GPU part of `rnicctl doctor`, as a user runs
//! them: on the synthetic two-node hwloc topology (rnic-gpu's fixture), on
//! this machine, and with a bad file.
#![allow(clippy::unwrap_used)]

use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_rnicctl");
const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../gpu/tests/fixtures/two-node-nic-gpu.xml"
);

fn rnicctl(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().unwrap()
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn topo_on_the_two_node_fixture() {
    let o = rnicctl(&["topo", "--xml", FIXTURE]);
    assert!(o.status.success(), "{o:?}");
    let s = text(&o);
    for want in [
        "NUMA nodes: 2",
        "  node 1: cpus 4-7, 64.0 GiB",
        "  node 0: 10 21",
        "  0000:03:00.0 15b3:1017 class 0200  node 0  cpus 0-3  link 15.8 GB/s",
        "  0000:86:00.0 10de:2335 class 0302  node 1  cpus 4-7",
        "  0000:03:00.0 ↔ 0000:04:00.0: PIX (same PCIe switch)",
        "  0000:11:00.0 ↔ 0000:04:00.0: NODE",
        "  0000:87:00.0 ↔ 0000:86:00.0: PHB",
        "  0000:03:00.0 ↔ 0000:86:00.0: SYS",
        "  GPU 0000:04:00.0 → NIC 0000:03:00.0 (PIX), staging buffers on node 0",
        "  GPU 0000:86:00.0 → NIC 0000:83:00.0 (PXB), staging buffers on node 1",
    ] {
        assert!(s.contains(want), "missing {want:?} in:\n{s}");
    }
    let j: serde_json::Value =
        serde_json::from_str(&text(&rnicctl(&["topo", "--xml", FIXTURE, "--json"]))).unwrap();
    assert_eq!(
        j["distances"]["values"],
        serde_json::json!([10, 21, 21, 10])
    );
    assert_eq!(j["pairings"][1]["relation"], "PXB");
    assert_eq!(j["gpus"][0]["numa_node"], 0);
    assert_eq!(j["nics"].as_array().unwrap().len(), 4);
}

#[test]
fn topo_export_reloads() {
    let o = rnicctl(&["topo", "--xml", FIXTURE, "--export-xml"]);
    assert!(o.status.success());
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("t.xml");
    std::fs::write(&p, o.stdout).unwrap();
    let again = rnicctl(&["topo", "--xml", p.to_str().unwrap()]);
    assert!(text(&again).contains("(PXB), staging buffers on node 1"));
}

#[test]
fn topo_on_this_machine_and_bad_input() {
    let o = rnicctl(&["topo"]);
    assert!(o.status.success(), "{o:?}");
    let s = text(&o);
    assert!(s.starts_with("topology: system\nNUMA nodes: "), "{s}");
    assert!(s.contains("rnic's choice"), "{s}");
    let o = rnicctl(&["topo", "--xml", "/nonexistent.xml"]);
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains("hwloc could not read the /nonexistent.xml topology"),
        "{e}"
    );
}

#[test]
fn doctor_reports_gpu_and_topology() {
    let o = rnicctl(&["doctor", "--json"]);
    let j: serde_json::Value = serde_json::from_str(text(&o).trim()).unwrap();
    let checks = j["checks"].as_array().unwrap();
    let find = |n: &str| checks.iter().find(|c| c["name"] == n).cloned();
    let cuda = find("cuda").expect("a cuda check");
    if rnic_gpu::driver().is_err() {
        assert_eq!(cuda["level"], "WARN");
        assert!(
            cuda["detail"]
                .as_str()
                .unwrap()
                .contains("GPU features are off")
        );
        assert!(
            cuda["fix"]
                .as_str()
                .unwrap()
                .contains("install the NVIDIA driver")
        );
    } else {
        assert!(cuda["detail"].as_str().unwrap().contains("driver,"));
    }
    let topo = find("topology").expect("a topology check");
    assert!(
        topo["detail"].as_str().unwrap().starts_with("hwloc: "),
        "{topo}"
    );
}
