//! Where to put buffers a device touches: the NUMA node of a PCI function.
//!
//! With the `topology` feature this is hwloc's answer (the node below the
//! function's first non-I/O ancestor, from one system topology read per
//! process); without it, the kernel's `/sys/bus/pci/devices/<bdf>/numa_node`
//! through rnic-dma. Both say "no node" (`None`) when the function is not
//! attached to exactly one node (the kernel's `-1`, common in VMs).

use rnic_core::PciAddr;
use rnic_dma::NodeId;

/// The NUMA node nearest `addr`, if there is exactly one.
#[cfg(feature = "topology")]
pub fn node_of(addr: &PciAddr) -> Option<NodeId> {
    use std::sync::OnceLock;

    use crate::topo::Topology;
    // One read of the system topology per process.
    static SYSTEM: OnceLock<Option<Topology>> = OnceLock::new();
    match SYSTEM.get_or_init(|| Topology::system().ok()) {
        Some(t) => t.pci(addr).ok().and_then(|f| f.node).map(NodeId),
        None => sysfs_node(addr),
    }
}

/// The NUMA node nearest `addr`, if there is exactly one.
#[cfg(not(feature = "topology"))]
pub fn node_of(addr: &PciAddr) -> Option<NodeId> {
    sysfs_node(addr)
}

fn sysfs_node(addr: &PciAddr) -> Option<NodeId> {
    rnic_dma::numa::node_of_pci_device(&addr.to_string())
        .ok()
        .flatten()
}
