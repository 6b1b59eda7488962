//! NIC/GPU topology on hwloc (hwlocality): which NUMA node and CPUs are
//! nearest a PCI function, how two functions are connected, the NUMA
//! distance matrix, and which NIC rnic pairs with each GPU.
//!
//! PCI functions are found by address (BDF), so a NIC bound to vfio-pci —
//! which has no network or OpenFabrics OS device any more — is found as
//! well as one on its kernel driver. The relation between two functions is
//! classified as NCCL classifies paths ([`PciRelation`]): through at most
//! one PCIe switch (PIX), several switches (PXB), a host bridge (PHB),
//! across host bridges of one NUMA node (NODE), or across nodes (SYS).
//!
//! [`Topology::system`] reads this machine (I/O objects kept);
//! [`Topology::from_xml`] reads an hwloc XML export, which is how the tests
//! describe a two-node machine with a NIC and a GPU.

use std::fmt;
use std::path::Path;

use hwlocality::Topology as Hw;
use hwlocality::object::TopologyObject;
use hwlocality::object::attributes::ObjectAttributes;
use hwlocality::object::types::{BridgeType, ObjectType};
use hwlocality::topology::builder::TypeFilter;
use rnic_core::PciAddr;
use thiserror::Error;

/// A topology query that failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum TopoError {
    /// hwloc could not build the topology.
    #[error(
        "hwloc could not read the {source_name} topology: {reason} (check that /sys is mounted; \
         for an XML file, that it is an hwloc export: lstopo --of xml)"
    )]
    Load {
        /// "system" or the XML file.
        source_name: String,
        /// hwloc's error.
        reason: String,
    },
    /// No PCI function with that address.
    #[error(
        "no PCI function {addr} in the {source_name} topology: check the address with lspci -D \
         (functions present: {present})"
    )]
    NoSuchDevice {
        /// The address asked for.
        addr: PciAddr,
        /// Where the topology came from.
        source_name: String,
        /// What is there (up to 8).
        present: String,
    },
    /// Two addresses that name the same function.
    #[error("{0} and {0} are the same function: name two different devices")]
    Same(PciAddr),
}

/// How two PCI functions are connected, best first (NCCL's path types).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PciRelation {
    /// Through at most one PCIe switch (NCCL `PIX`).
    SameSwitch,
    /// Through several PCIe switches, without a host bridge (`PXB`).
    MultiSwitch,
    /// Through one PCIe host bridge (the CPU's root complex, `PHB`).
    HostBridge,
    /// Across host bridges of one NUMA node (`NODE`).
    SameNode,
    /// Across NUMA nodes, over the CPU interconnect (`SYS`).
    CrossNode,
}

impl PciRelation {
    /// NCCL's short name.
    pub fn nccl_name(self) -> &'static str {
        match self {
            PciRelation::SameSwitch => "PIX",
            PciRelation::MultiSwitch => "PXB",
            PciRelation::HostBridge => "PHB",
            PciRelation::SameNode => "NODE",
            PciRelation::CrossNode => "SYS",
        }
    }

    /// Whether peer-to-peer DMA between the two can stay below the root
    /// complex (PIX/PXB); otherwise it goes through the CPU (and, with an
    /// IOMMU forcing ACS, always does).
    pub fn below_root_complex(self) -> bool {
        matches!(self, PciRelation::SameSwitch | PciRelation::MultiSwitch)
    }
}

impl fmt::Display for PciRelation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self {
            PciRelation::SameSwitch => "same PCIe switch",
            PciRelation::MultiSwitch => "several PCIe switches, no host bridge",
            PciRelation::HostBridge => "one host bridge (through the CPU)",
            PciRelation::SameNode => "across host bridges of one NUMA node",
            PciRelation::CrossNode => "across NUMA nodes",
        };
        write!(f, "{} ({what})", self.nccl_name())
    }
}

/// What a PCI function is, by class code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceKind {
    /// Network controller (class 0x02): Ethernet, InfiniBand.
    Nic,
    /// Display or 3D controller (class 0x03): a GPU.
    Gpu,
    /// Anything else.
    Other,
}

/// One PCI function and what is nearest it.
#[derive(Clone, Debug, PartialEq)]
pub struct PciFunction {
    /// Address.
    pub addr: PciAddr,
    /// Vendor id.
    pub vendor: u16,
    /// Device id.
    pub device: u16,
    /// Class code (`0x0200` Ethernet, `0x0207` InfiniBand, `0x0302` 3D).
    pub class: u16,
    /// By class.
    pub kind: DeviceKind,
    /// The NUMA node it is attached to, when exactly one.
    pub node: Option<u32>,
    /// The CPUs nearest it (hwloc list syntax, `0-15,32-47`).
    pub cpus: String,
    /// PCIe link bandwidth in GB/s as hwloc reports it (0 when unknown).
    pub link_gbs: f32,
}

/// A NUMA node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NumaNode {
    /// OS index (`/sys/devices/system/node/node<N>`).
    pub os_index: u32,
    /// Its CPUs (list syntax).
    pub cpus: String,
    /// Local memory in bytes (0 when unknown).
    pub memory: u64,
}

/// The NUMA distance matrix (ACPI SLIT values: 10 is local).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Distances {
    /// Node OS indexes, in matrix order.
    pub nodes: Vec<u32>,
    /// Row-major: `values[i * n + j]` from node `i` to node `j`.
    pub values: Vec<u64>,
}

impl Distances {
    /// Distance from node `a` to node `b` (OS indexes).
    pub fn between(&self, a: u32, b: u32) -> Option<u64> {
        let i = self.nodes.iter().position(|&n| n == a)?;
        let j = self.nodes.iter().position(|&n| n == b)?;
        self.values.get(i * self.nodes.len() + j).copied()
    }
}

/// The NIC rnic pairs with a GPU, and why.
#[derive(Clone, Debug, PartialEq)]
pub struct Pairing {
    /// The GPU.
    pub gpu: PciAddr,
    /// The chosen NIC.
    pub nic: PciAddr,
    /// How they are connected.
    pub relation: PciRelation,
    /// The node staging buffers for this pair go on (the NIC's, else the
    /// GPU's).
    pub staging_node: Option<u32>,
}

/// A machine's topology with its PCI devices; see the module docs.
pub struct Topology {
    hw: Hw,
    source: String,
}

impl fmt::Debug for Topology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Topology")
            .field("source", &self.source)
            .finish()
    }
}

fn load_err(source: &str, e: impl fmt::Display) -> TopoError {
    TopoError::Load {
        source_name: source.to_owned(),
        reason: e.to_string(),
    }
}

fn pci_addr(obj: &TopologyObject) -> Option<(PciAddr, u16, u16, u16, f32)> {
    match obj.attributes() {
        Some(ObjectAttributes::PCIDevice(p)) => {
            let addr = PciAddr::new(p.domain(), p.bus_id(), p.bus_device(), p.function()).ok()?;
            Some((
                addr,
                p.vendor_id(),
                p.device_id(),
                p.class_id(),
                p.link_speed(),
            ))
        }
        _ => None,
    }
}

/// A cpuset in hwloc's list syntax (`0-3,8`).
fn cpu_list(set: &hwlocality::cpu::cpuset::CpuSet) -> String {
    let s = set.to_string();
    s.strip_prefix("CpuSet(")
        .and_then(|r| r.strip_suffix(')'))
        .map_or(s.clone(), str::to_owned)
}

fn is_host_bridge(obj: &TopologyObject) -> bool {
    matches!(obj.attributes(), Some(ObjectAttributes::Bridge(b)) if b.upstream_type() == BridgeType::Host)
}

impl Topology {
    fn build(
        b: hwlocality::topology::builder::TopologyBuilder,
        source: String,
    ) -> Result<Topology, TopoError> {
        let hw = b
            .with_io_type_filter(TypeFilter::KeepImportant)
            .map_err(|e| load_err(&source, e))?
            .build()
            .map_err(|e| load_err(&source, e))?;
        Ok(Topology { hw, source })
    }

    /// This machine.
    pub fn system() -> Result<Topology, TopoError> {
        Topology::build(Hw::builder(), "system".into())
    }

    /// An hwloc XML export (`lstopo --of xml`), given as text.
    pub fn from_xml(xml: &str) -> Result<Topology, TopoError> {
        let b = Hw::builder()
            .from_xml(xml)
            .map_err(|e| load_err("XML", e))?;
        Topology::build(b, "XML".into())
    }

    /// An hwloc XML export in a file. (Read here, then parsed as text:
    /// hwlocality panics on a file it cannot open.)
    pub fn from_xml_file(path: &Path) -> Result<Topology, TopoError> {
        let source = path.display().to_string();
        let xml = std::fs::read_to_string(path).map_err(|e| load_err(&source, e))?;
        let b = Hw::builder()
            .from_xml(&xml)
            .map_err(|e| load_err(&source, e))?;
        Topology::build(b, source)
    }

    /// Where the topology came from (`system`, `XML` or a file name).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// This topology as hwloc XML (what `--xml` files look like).
    pub fn to_xml(&self) -> Result<String, TopoError> {
        self.hw
            .export_xml(hwlocality::topology::export::xml::XMLExportFlags::empty())
            .map(|x| x.to_string())
            .map_err(|e| load_err(&self.source, e))
    }

    /// Every NUMA node.
    pub fn nodes(&self) -> Vec<NumaNode> {
        self.hw
            .objects_with_type(ObjectType::NUMANode)
            .filter_map(|n| {
                let memory = match n.attributes() {
                    Some(ObjectAttributes::NUMANode(a)) => a.local_memory().map_or(0, |m| m.get()),
                    _ => 0,
                };
                Some(NumaNode {
                    os_index: u32::try_from(n.os_index()?).ok()?,
                    cpus: n.cpuset().map(|c| cpu_list(&c)).unwrap_or_default(),
                    memory,
                })
            })
            .collect()
    }

    /// The NUMA node whose memory hangs below `ancestor`, when exactly one.
    fn node_below(&self, ancestor: &TopologyObject) -> Option<u32> {
        let mut nodes = self
            .hw
            .objects_with_type(ObjectType::NUMANode)
            .filter(|n| n.is_in_subtree(ancestor));
        let one = nodes.next()?;
        if nodes.next().is_some() {
            return None;
        }
        u32::try_from(one.os_index()?).ok()
    }

    fn object(&self, addr: &PciAddr) -> Result<&TopologyObject, TopoError> {
        self.hw
            .pci_devices()
            .find(|o| pci_addr(o).is_some_and(|p| p.0 == *addr))
            .ok_or_else(|| {
                let present: Vec<String> = self
                    .hw
                    .pci_devices()
                    .filter_map(|o| pci_addr(o).map(|p| p.0.to_string()))
                    .take(8)
                    .collect();
                TopoError::NoSuchDevice {
                    addr: *addr,
                    source_name: self.source.clone(),
                    present: if present.is_empty() {
                        "none".into()
                    } else {
                        present.join(", ")
                    },
                }
            })
    }

    fn describe(&self, obj: &TopologyObject) -> Option<PciFunction> {
        let (addr, vendor, device, class, link_gbs) = pci_addr(obj)?;
        let kind = match class >> 8 {
            0x02 => DeviceKind::Nic,
            0x03 => DeviceKind::Gpu,
            _ => DeviceKind::Other,
        };
        let anc = obj.first_non_io_ancestor();
        Some(PciFunction {
            addr,
            vendor,
            device,
            class,
            kind,
            node: anc.and_then(|a| self.node_below(a)),
            cpus: anc
                .and_then(|a| a.cpuset())
                .map(|c| cpu_list(&c))
                .unwrap_or_default(),
            link_gbs,
        })
    }

    /// The PCI function at `addr` and what is nearest it.
    pub fn pci(&self, addr: &PciAddr) -> Result<PciFunction, TopoError> {
        let obj = self.object(addr)?;
        self.describe(obj).ok_or_else(|| TopoError::NoSuchDevice {
            addr: *addr,
            source_name: self.source.clone(),
            present: "(no PCI attributes)".into(),
        })
    }

    /// Every PCI function hwloc kept (network, display, storage, ...).
    pub fn pci_functions(&self) -> Vec<PciFunction> {
        self.hw
            .pci_devices()
            .filter_map(|o| self.describe(o))
            .collect()
    }

    /// Network functions (class 0x02).
    pub fn nics(&self) -> Vec<PciFunction> {
        self.pci_functions()
            .into_iter()
            .filter(|f| f.kind == DeviceKind::Nic)
            .collect()
    }

    /// GPUs (class 0x03).
    pub fn gpus(&self) -> Vec<PciFunction> {
        self.pci_functions()
            .into_iter()
            .filter(|f| f.kind == DeviceKind::Gpu)
            .collect()
    }

    /// How `a` and `b` are connected.
    pub fn relation(&self, a: &PciAddr, b: &PciAddr) -> Result<PciRelation, TopoError> {
        if a == b {
            return Err(TopoError::Same(*a));
        }
        let (oa, ob) = (self.object(a)?, self.object(b)?);
        let Some(common) = oa.first_common_ancestor(ob) else {
            return Ok(PciRelation::CrossNode);
        };
        if common.object_type().is_io() {
            if is_host_bridge(common) {
                return Ok(PciRelation::HostBridge);
            }
            // Bridges strictly between each device and the common bridge.
            let hops = |o: &TopologyObject| {
                o.ancestors()
                    .take_while(|x| !std::ptr::eq(*x, common))
                    .filter(|x| x.object_type() == ObjectType::Bridge)
                    .count()
            };
            return Ok(if hops(oa).max(hops(ob)) <= 1 {
                PciRelation::SameSwitch
            } else {
                PciRelation::MultiSwitch
            });
        }
        let node = |o: &TopologyObject| o.first_non_io_ancestor().and_then(|x| self.node_below(x));
        Ok(match (node(oa), node(ob)) {
            (Some(x), Some(y)) if x == y => PciRelation::SameNode,
            _ => PciRelation::CrossNode,
        })
    }

    /// The NUMA distance matrix, when the machine reports one.
    pub fn distances(&self) -> Option<Distances> {
        let all = self.hw.distances(None).ok()?;
        all.iter().find_map(|d| {
            let nodes: Option<Vec<u32>> = d
                .objects()
                .map(|o| {
                    let o = o?;
                    (o.object_type() == ObjectType::NUMANode)
                        .then(|| o.os_index().and_then(|i| u32::try_from(i).ok()))
                        .flatten()
                })
                .collect();
            Some(Distances {
                nodes: nodes?,
                values: d.distances().to_vec(),
            })
        })
    }

    /// For every GPU, the NIC rnic pairs it with: the closest relation,
    /// then the faster link, then the lower address.
    pub fn pairings(&self) -> Vec<Pairing> {
        let nics = self.nics();
        self.gpus()
            .iter()
            .filter_map(|g| {
                let best = nics
                    .iter()
                    .filter_map(|n| Some((self.relation(&g.addr, &n.addr).ok()?, n)))
                    .min_by(|(ra, na), (rb, nb)| {
                        ra.cmp(rb)
                            .then(nb.link_gbs.total_cmp(&na.link_gbs))
                            .then(na.addr.cmp(&nb.addr))
                    })?;
                Some(Pairing {
                    gpu: g.addr,
                    nic: best.1.addr,
                    relation: best.0,
                    staging_node: best.1.node.or(g.node),
                })
            })
            .collect()
    }

    /// The node to place buffers that `devices` touch: the node of the
    /// first that has one.
    pub fn placement_node(&self, devices: &[PciAddr]) -> Option<u32> {
        devices
            .iter()
            .find_map(|d| self.pci(d).ok().and_then(|f| f.node))
    }
}
