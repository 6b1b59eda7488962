//! A process-wide list of live regions for tools (`rnicctl stats`).
//!
//! The registry holds [`Weak`] references to each region's [`RegionStats`],
//! never to the region itself: listing can't keep a region (and its pinned
//! memory and device mapping) alive, and can't run a region's teardown on the
//! lister's thread.

use std::sync::{Arc, Mutex, PoisonError, Weak};

use rnic_core::Iova;

use crate::numa::{NodeId, PlacementReport};
use crate::page::{Fallback, PageSize};

/// What a region is, fixed when it is built.
#[derive(Clone, Debug, PartialEq)]
pub struct RegionStats {
    /// Process-unique id, in creation order.
    pub id: u64,
    /// Bytes requested (the accessible length).
    pub bytes: usize,
    /// Bytes mapped (the request rounded up to whole pages).
    pub mapped_bytes: usize,
    /// The page size obtained.
    pub page_size: PageSize,
    /// Larger page sizes that were tried first, and why each was skipped.
    pub fallbacks: Vec<Fallback>,
    /// The NUMA node asked for.
    pub node_wanted: Option<NodeId>,
    /// The node holding most pages, as `move_pages` reported.
    pub node_verified: Option<NodeId>,
    /// Fraction of checked pages on the wanted node (of present pages when
    /// no node was wanted).
    pub verified_fraction: f64,
    /// The whole verification result.
    pub placement: PlacementReport,
    /// Whether the pages are `mlock`ed.
    pub pinned: bool,
    /// The device address of byte 0.
    pub iova: Iova,
    /// Whether a device mapping was installed through a non-identity mapper.
    pub device_mapped: bool,
}

static REGISTRY: Mutex<Vec<Weak<RegionStats>>> = Mutex::new(Vec::new());

/// Add a region's stats; prunes entries of dropped regions.
pub(crate) fn register(stats: &Arc<RegionStats>) {
    let mut list = REGISTRY.lock().unwrap_or_else(PoisonError::into_inner);
    list.retain(|w| w.strong_count() > 0);
    list.push(Arc::downgrade(stats));
}

/// The stats of every live region, oldest first.
pub fn snapshot() -> Vec<RegionStats> {
    let list = REGISTRY.lock().unwrap_or_else(PoisonError::into_inner);
    list.iter()
        .filter_map(Weak::upgrade)
        .map(|s| (*s).clone())
        .collect()
}
