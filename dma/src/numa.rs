//! NUMA topology (from `/sys/devices/system/node/`), binding with
//! `mbind(MPOL_BIND)`, and placement verification with `move_pages`.
//!
//! Binding says where future faults allocate; it does not prove where pages
//! are. Verification asks the kernel for the node of every page of a populated
//! range, so a region's [`PlacementReport`] states facts, not intentions.

use std::fmt;
use std::ptr::NonNull;

use tracing::warn;

use crate::error::DmaError;
use crate::sys;

/// A NUMA node number as the kernel counts them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeId(pub u32);

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// What to do when verification finds pages off the wanted node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnMismatch {
    /// Fail the allocation with [`DmaError::PlacementMismatch`].
    #[default]
    Fail,
    /// Log a warning and keep the region; the report records the fraction.
    Warn,
}

/// Where a region's pages should live.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Placement {
    /// The wanted node; `None` lets the kernel choose (no binding; the report
    /// still records where the pages landed).
    pub node: Option<NodeId>,
    /// What a verified mismatch means.
    pub on_mismatch: OnMismatch,
}

/// How placement was established.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VerifyMethod {
    /// Every page was queried with `move_pages(0, n, pages, NULL, status, 0)`.
    MovePages,
    /// The kernel has no NUMA support (`ENOSYS`): there is one node, 0, and
    /// every page is on it by definition.
    SingleNodeKernel,
}

/// The result of querying every page of a region for its node.
#[derive(Clone, Debug, PartialEq)]
pub struct PlacementReport {
    /// The node that was asked for.
    pub wanted: Option<NodeId>,
    /// Pages queried (one address per page of the size in `granularity`).
    pub pages_checked: u64,
    /// Bytes per queried page.
    pub granularity: usize,
    /// Pages on the wanted node (all present pages when no node was wanted).
    pub pages_on_wanted: u64,
    /// Pages the kernel reported as not present or not queryable.
    pub pages_absent: u64,
    /// Present pages per node, sorted by node.
    pub by_node: Vec<(NodeId, u64)>,
    /// How the facts were obtained.
    pub method: VerifyMethod,
}

impl PlacementReport {
    /// `pages_on_wanted / pages_checked` (1.0 for an empty check).
    pub fn fraction_on_wanted(&self) -> f64 {
        if self.pages_checked == 0 {
            1.0
        } else {
            self.pages_on_wanted as f64 / self.pages_checked as f64
        }
    }

    /// The node holding most of the pages.
    pub fn dominant_node(&self) -> Option<NodeId> {
        self.by_node
            .iter()
            .max_by_key(|(_, n)| *n)
            .map(|(node, _)| *node)
    }

    /// Whether every checked page is on the wanted node (or, with no node
    /// wanted, present at all).
    pub fn all_on_wanted(&self) -> bool {
        self.pages_on_wanted == self.pages_checked
    }
}

const ONLINE: &str = "/sys/devices/system/node/online";

/// Parse a kernel CPU/node list such as `0-1,3` (the format of
/// `/sys/devices/system/node/online`).
pub fn parse_node_list(list: &str) -> Option<Vec<NodeId>> {
    let mut out = Vec::new();
    for part in list.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.parse().ok()?, b.parse().ok()?);
                if a > b {
                    return None;
                }
                out.extend((a..=b).map(NodeId));
            }
            None => out.push(NodeId(part.parse().ok()?)),
        }
    }
    Some(out)
}

/// The online NUMA nodes. A kernel without NUMA support (no
/// `/sys/devices/system/node/online`) has the single node 0.
pub fn online_nodes() -> Vec<NodeId> {
    sys::read_file(ONLINE)
        .ok()
        .and_then(|s| parse_node_list(&s))
        .unwrap_or_else(|| vec![NodeId(0)])
}

/// The NUMA node of a PCI function, from `/sys/bus/pci/devices/<bdf>/numa_node`
/// (`0000:3b:00.0`). The kernel's `-1` ("no affinity", e.g. in VMs) is `None`.
pub fn node_of_pci_device(bdf: &str) -> Result<Option<NodeId>, DmaError> {
    let path = format!("/sys/bus/pci/devices/{bdf}/numa_node");
    let fail = |reason: String| DmaError::PciNode {
        bdf: bdf.to_owned(),
        path: path.clone(),
        reason,
    };
    let valid = !bdf.is_empty()
        && bdf
            .bytes()
            .all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.');
    if !valid {
        return Err(fail(
            "not a PCI address (expected DDDD:BB:DD.F, as `lspci -D` prints it)".into(),
        ));
    }
    let text = sys::read_file(&path)
        .map_err(|e| fail(format!("{e}; is the device present (lspci -D)?")))?;
    let value: i64 = text
        .trim()
        .parse()
        .map_err(|_| fail(format!("unexpected content {:?}", text.trim())))?;
    Ok(u32::try_from(value).ok().map(NodeId))
}

/// Check `node` is online.
pub(crate) fn check_online(node: NodeId) -> Result<(), DmaError> {
    let online = online_nodes();
    if online.contains(&node) {
        Ok(())
    } else {
        let list = online
            .iter()
            .map(|n| n.to_string())
            .collect::<Vec<_>>()
            .join(",");
        Err(DmaError::NodeNotOnline { node, online: list })
    }
}

/// Whether binding was applied or the kernel lacks NUMA support.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Bound {
    Yes,
    NoNumaKernel,
}

/// `mbind(MPOL_BIND)` the range to `node`, before anything faults it in.
pub(crate) fn bind(addr: NonNull<u8>, len: usize, node: NodeId) -> Result<Bound, DmaError> {
    match sys::mbind_bind(addr, len, node.0) {
        Ok(()) => {
            // Cross-check that the policy took: a silently ignored binding
            // would make the later verification the first sign of trouble.
            if let Ok(policy) = sys::mempolicy_of(addr) {
                let word = policy.nodes.get(node.0 as usize / 64).copied().unwrap_or(0);
                if policy.mode != libc::MPOL_BIND || word & (1 << (node.0 % 64)) == 0 {
                    warn!(
                        node = node.0,
                        mode = policy.mode,
                        "mbind returned 0 but get_mempolicy disagrees"
                    );
                }
            }
            Ok(Bound::Yes)
        }
        Err(e) if e.raw_os_error() == Some(libc::ENOSYS) && node.0 == 0 => Ok(Bound::NoNumaKernel),
        Err(source) => Err(DmaError::Mbind { node, len, source }),
    }
}

/// Query pages per `move_pages` call: bounds the temporary vectors.
const QUERY_CHUNK: usize = 4096;

/// Query the node of every `granularity`-sized page of `[addr, addr + len)`.
pub(crate) fn verify(
    addr: NonNull<u8>,
    len: usize,
    granularity: usize,
    wanted: Option<NodeId>,
) -> Result<PlacementReport, DmaError> {
    let base = addr.as_ptr() as usize;
    let pages = len.div_ceil(granularity);
    let mut by_node: Vec<(NodeId, u64)> = Vec::new();
    let mut absent = 0u64;
    let mut addrs = Vec::with_capacity(pages.min(QUERY_CHUNK));
    let mut status = Vec::with_capacity(pages.min(QUERY_CHUNK));
    let mut method = VerifyMethod::MovePages;
    let mut first = 0;
    while first < pages {
        let n = (pages - first).min(QUERY_CHUNK);
        addrs.clear();
        addrs.extend((first..first + n).map(|i| base + i * granularity));
        status.clear();
        status.resize(n, i32::MIN);
        match sys::query_page_nodes(&addrs, &mut status) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {
                method = VerifyMethod::SingleNodeKernel;
                status.fill(0);
            }
            Err(source) => {
                return Err(DmaError::Syscall {
                    op: "move_pages (query)",
                    addr: base,
                    len,
                    source,
                });
            }
        }
        for &st in &status {
            if st < 0 {
                absent += 1;
                continue;
            }
            let node = NodeId(st as u32);
            match by_node.iter_mut().find(|(n, _)| *n == node) {
                Some((_, count)) => *count += 1,
                None => by_node.push((node, 1)),
            }
        }
        first += n;
    }
    by_node.sort();
    let present: u64 = by_node.iter().map(|(_, c)| c).sum();
    let on_wanted = match wanted {
        Some(w) => by_node.iter().find(|(n, _)| *n == w).map_or(0, |(_, c)| *c),
        None => present,
    };
    Ok(PlacementReport {
        wanted,
        pages_checked: pages as u64,
        granularity,
        pages_on_wanted: on_wanted,
        pages_absent: absent,
        by_node,
        method,
    })
}

/// Apply the mismatch policy to a report.
pub(crate) fn judge(report: &PlacementReport, on_mismatch: OnMismatch) -> Result<(), DmaError> {
    let Some(wanted) = report.wanted else {
        return Ok(());
    };
    if report.all_on_wanted() {
        return Ok(());
    }
    let elsewhere = report.pages_checked - report.pages_on_wanted - report.pages_absent;
    match on_mismatch {
        OnMismatch::Fail => Err(DmaError::PlacementMismatch {
            wanted,
            checked: report.pages_checked,
            on_wanted: report.pages_on_wanted,
            elsewhere,
            absent: report.pages_absent,
        }),
        OnMismatch::Warn => {
            warn!(
                node = wanted.0,
                checked = report.pages_checked,
                on_wanted = report.pages_on_wanted,
                elsewhere,
                absent = report.pages_absent,
                "region placement differs from the wanted NUMA node"
            );
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::{self, Call};

    #[test]
    fn node_lists_parse() {
        assert_eq!(parse_node_list("0\n"), Some(vec![NodeId(0)]));
        assert_eq!(
            parse_node_list("0-2,5"),
            Some(vec![NodeId(0), NodeId(1), NodeId(2), NodeId(5)])
        );
        assert_eq!(parse_node_list("2-1"), None);
        assert_eq!(parse_node_list("x"), None);
    }

    #[test]
    fn pci_node_from_sysfs() {
        sys::script(|s| {
            s.files.insert(
                "/sys/bus/pci/devices/0000:3b:00.0/numa_node".into(),
                "1\n".into(),
            );
            s.files.insert(
                "/sys/bus/pci/devices/0000:00:04.0/numa_node".into(),
                "-1\n".into(),
            );
        });
        assert_eq!(node_of_pci_device("0000:3b:00.0").unwrap(), Some(NodeId(1)));
        assert_eq!(node_of_pci_device("0000:00:04.0").unwrap(), None);
        let missing = node_of_pci_device("0000:99:00.0").unwrap_err().to_string();
        assert!(
            missing.contains("/sys/bus/pci/devices/0000:99:00.0/numa_node"),
            "{missing}"
        );
        assert!(matches!(
            node_of_pci_device("../../etc"),
            Err(DmaError::PciNode { .. })
        ));
    }

    #[test]
    fn offline_node_is_refused_with_the_online_list() {
        sys::script(|s| {
            s.files
                .insert("/sys/devices/system/node/online".into(), "0-1\n".into());
        });
        assert!(check_online(NodeId(1)).is_ok());
        let msg = check_online(NodeId(3)).unwrap_err().to_string();
        assert!(msg.contains("node 3") && msg.contains("0,1"), "{msg}");
    }

    #[test]
    fn verify_counts_every_page_across_chunks() {
        let pages = QUERY_CHUNK + 10;
        // Page i is on node i % 3; page 7 is not present.
        sys::script(|s| {
            s.page_node = Some(Box::new(|i| {
                if i == 7 {
                    -libc::ENOENT
                } else {
                    (i % 3) as i32
                }
            }));
        });
        let addr = NonNull::<u8>::dangling();
        let report = verify(addr, pages * 4096, 4096, Some(NodeId(1))).unwrap();
        assert_eq!(report.pages_checked, pages as u64);
        // The fake's index restarts with each move_pages call (chunk), so
        // model the same: chunk sizes QUERY_CHUNK and 10.
        let model = |n: usize| (0..n).filter(|&i| i != 7).map(|i| i % 3);
        let expected: Vec<usize> = model(QUERY_CHUNK).chain(model(10)).collect();
        assert_eq!(report.pages_absent, 2);
        assert_eq!(
            report.pages_on_wanted,
            expected.iter().filter(|&&n| n == 1).count() as u64
        );
        for node in 0..3u32 {
            let count = expected.iter().filter(|&&n| n == node as usize).count() as u64;
            assert_eq!(report.by_node[node as usize], (NodeId(node), count));
        }
        let queries = sys::calls()
            .iter()
            .filter(|c| matches!(c, Call::QueryNodes { .. }))
            .count();
        assert_eq!(queries, 2);
        assert!(matches!(
            judge(&report, OnMismatch::Fail),
            Err(DmaError::PlacementMismatch { .. })
        ));
        assert!(judge(&report, OnMismatch::Warn).is_ok());
    }

    #[test]
    fn verify_without_a_wanted_node_reports_the_dominant_one() {
        sys::script(|s| s.page_node = Some(Box::new(|i| if i < 3 { 1 } else { 0 })));
        let report = verify(NonNull::dangling(), 10 * 4096, 4096, None).unwrap();
        assert_eq!(report.dominant_node(), Some(NodeId(0)));
        assert_eq!(report.by_node, vec![(NodeId(0), 7), (NodeId(1), 3)]);
        assert!(report.all_on_wanted());
        assert!(judge(&report, OnMismatch::Fail).is_ok());
    }
}
