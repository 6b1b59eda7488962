//! The IOVA allocator: hands out device-address ranges inside the usable
//! apertures. Safe code only.
//!
//! Apertures are inclusive `[start, last]` ranges, as VFIO's
//! `VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE` capability reports them. Reserved
//! windows are carved out first; by default that is the x86 MSI window
//! `0xFEE00000..=0xFEEFFFFF`, which interrupt remapping claims and which
//! VFIO's reported ranges exclude on recent kernels but not on all.
//!
//! Invariants (checked by the property test at the bottom):
//! - every allocation lies inside one aperture and outside every reserved window;
//! - allocations never overlap;
//! - each allocation's start is a multiple of its alignment;
//! - freed space coalesces with its neighbours, so after freeing everything the
//!   free list equals the initial one and every request that fit once fits again.

use std::collections::BTreeMap;
use std::ops::RangeInclusive;

use rnic_core::Iova;

use crate::error::DmaError;

/// The x86 MSI doorbell window, never handed out by default.
pub const X86_MSI_WINDOW: RangeInclusive<u64> = 0xFEE0_0000..=0xFEEF_FFFF;

/// A first-fit allocator of aligned IOVA ranges with coalescing free.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IovaAllocator {
    /// Free ranges: start → last (inclusive), disjoint and non-adjacent.
    free: BTreeMap<u64, u64>,
    /// Allocated ranges: start → length.
    allocated: BTreeMap<u64, u64>,
}

impl IovaAllocator {
    /// An allocator over `apertures`, minus the x86 MSI window.
    pub fn new(apertures: &[RangeInclusive<u64>]) -> IovaAllocator {
        IovaAllocator::with_reserved(apertures, &[X86_MSI_WINDOW])
    }

    /// An allocator over `apertures` minus each `reserved` window.
    pub fn with_reserved(
        apertures: &[RangeInclusive<u64>],
        reserved: &[RangeInclusive<u64>],
    ) -> IovaAllocator {
        let mut alloc = IovaAllocator {
            free: BTreeMap::new(),
            allocated: BTreeMap::new(),
        };
        for ap in apertures {
            if ap.start() <= ap.end() {
                alloc.insert_free(*ap.start(), *ap.end());
            }
        }
        for r in reserved {
            if r.start() <= r.end() {
                alloc.carve(*r.start(), *r.end());
            }
        }
        alloc
    }

    /// Reserve `len` bytes aligned to `align` (a power of two), lowest
    /// address first.
    pub fn alloc(&mut self, len: u64, align: u64) -> Result<Iova, DmaError> {
        if len == 0 || !align.is_power_of_two() {
            return Err(DmaError::IovaRequest { len, align });
        }
        let found = self.free.iter().find_map(|(&start, &last)| {
            let at = start.checked_next_multiple_of(align)?;
            (at <= last && last - at >= len - 1).then_some((start, last, at))
        });
        let Some((start, last, at)) = found else {
            return Err(DmaError::IovaExhausted {
                len,
                align,
                free: self.free_bytes(),
            });
        };
        self.free.remove(&start);
        if at > start {
            self.free.insert(start, at - 1);
        }
        let end = at + (len - 1);
        if end < last {
            self.free.insert(end + 1, last);
        }
        self.allocated.insert(at, len);
        Ok(Iova(at))
    }

    /// Release the range that starts at `iova`; returns its length.
    pub fn free(&mut self, iova: Iova) -> Result<u64, DmaError> {
        let len = self
            .allocated
            .remove(&iova.0)
            .ok_or(DmaError::IovaFree { iova })?;
        self.insert_free(iova.0, iova.0 + (len - 1));
        Ok(len)
    }

    /// Whether `iova` is the start of a live allocation.
    pub fn is_allocated(&self, iova: Iova) -> bool {
        self.allocated.contains_key(&iova.0)
    }

    /// Bytes currently allocated.
    pub fn allocated_bytes(&self) -> u64 {
        self.allocated.values().sum()
    }

    /// Bytes currently free (saturating at `u64::MAX` for a full 64-bit space).
    pub fn free_bytes(&self) -> u64 {
        self.free.iter().fold(0u64, |acc, (&s, &l)| {
            acc.saturating_add((l - s).saturating_add(1))
        })
    }

    /// The free ranges, lowest first.
    pub fn free_ranges(&self) -> impl Iterator<Item = RangeInclusive<u64>> + '_ {
        self.free.iter().map(|(&s, &l)| s..=l)
    }

    /// The allocated ranges, lowest first.
    pub fn allocated_ranges(&self) -> impl Iterator<Item = RangeInclusive<u64>> + '_ {
        self.allocated.iter().map(|(&s, &len)| s..=s + (len - 1))
    }

    /// Insert `[start, last]` into the free list, merging with overlapping or
    /// adjacent free ranges.
    fn insert_free(&mut self, mut start: u64, mut last: u64) {
        // Merge with a range that starts before and reaches us.
        if let Some((&s, &l)) = self.free.range(..=start).next_back()
            && l.checked_add(1).is_none_or(|next| next >= start)
        {
            self.free.remove(&s);
            start = s;
            last = last.max(l);
        }
        // Merge with ranges that start inside us or right after us.
        loop {
            let bound = last.saturating_add(1);
            let Some((&s, &l)) = self.free.range(start..=bound).next() else {
                break;
            };
            self.free.remove(&s);
            last = last.max(l);
        }
        self.free.insert(start, last);
    }

    /// Remove `[start, last]` from the free list.
    fn carve(&mut self, start: u64, last: u64) {
        let overlapping: Vec<(u64, u64)> = self
            .free
            .range(..=last)
            .filter(|&(_, &l)| l >= start)
            .map(|(&s, &l)| (s, l))
            .collect();
        for (s, l) in overlapping {
            self.free.remove(&s);
            if s < start {
                self.free.insert(s, start - 1);
            }
            if l > last {
                self.free.insert(last + 1, l);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn msi_window_is_excluded_by_default() {
        let a = IovaAllocator::new(&[0..=0xFFFF_FFFF]);
        let ranges: Vec<_> = a.free_ranges().collect();
        assert_eq!(ranges, vec![0..=0xFEDF_FFFF, 0xFEF0_0000..=0xFFFF_FFFF]);
    }

    #[test]
    fn aligned_first_fit_and_reuse() {
        let mut a = IovaAllocator::with_reserved(&[0x1000..=0x3F_FFFF], &[]);
        let x = a.alloc(0x1000, 0x1000).unwrap();
        assert_eq!(x, Iova(0x1000));
        let y = a.alloc(0x20_0000, 0x20_0000).unwrap();
        assert_eq!(y, Iova(0x20_0000), "2 MiB aligned");
        assert!(matches!(
            a.alloc(0x20_0000, 0x20_0000),
            Err(DmaError::IovaExhausted { .. })
        ));
        assert_eq!(a.free(y).unwrap(), 0x20_0000);
        assert_eq!(a.alloc(0x20_0000, 0x20_0000).unwrap(), y);
        assert!(matches!(
            a.free(Iova(0x1234)),
            Err(DmaError::IovaFree { .. })
        ));
    }

    #[test]
    fn full_64_bit_space_does_not_overflow() {
        let mut a = IovaAllocator::with_reserved(&[0..=u64::MAX], &[]);
        let top = a.alloc(1 << 63, 1 << 63).unwrap();
        assert_eq!(top, Iova(0));
        let hi = a.alloc(1 << 63, 1 << 63).unwrap();
        assert_eq!(hi, Iova(1 << 63));
        assert_eq!(a.free_bytes(), 0);
        a.free(hi).unwrap();
        a.free(top).unwrap();
        assert_eq!(a.free_ranges().collect::<Vec<_>>(), vec![0..=u64::MAX]);
    }

    #[test]
    fn bad_requests_are_typed() {
        let mut a = IovaAllocator::new(&[0..=0xFFFF]);
        assert!(matches!(
            a.alloc(0, 4096),
            Err(DmaError::IovaRequest { .. })
        ));
        assert!(matches!(
            a.alloc(4096, 3000),
            Err(DmaError::IovaRequest { .. })
        ));
    }

    #[derive(Clone, Debug)]
    enum Op {
        Alloc { pages: u64, align_shift: u32 },
        Free { pick: usize },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (1u64..64, 12u32..22).prop_map(|(pages, align_shift)| Op::Alloc { pages, align_shift }),
            any::<usize>().prop_map(|pick| Op::Free { pick }),
        ]
    }

    fn apertures() -> impl Strategy<Value = Vec<RangeInclusive<u64>>> {
        // Up to 4 apertures of 0..64 MiB at random 4 KiB-aligned starts below 4 GiB.
        prop::collection::vec((0u64..0x10_0000, 1u64..0x4000), 1..4).prop_map(|v| {
            v.into_iter()
                .map(|(s, n)| (s << 12)..=((s + n) << 12) - 1)
                .collect()
        })
    }

    fn inside(apertures: &[RangeInclusive<u64>], r: &RangeInclusive<u64>) -> bool {
        // Apertures may overlap or touch each other; check each byte run is
        // covered by walking the union.
        let mut union: Vec<(u64, u64)> = apertures.iter().map(|a| (*a.start(), *a.end())).collect();
        union.sort();
        let mut merged: Vec<(u64, u64)> = Vec::new();
        for (s, l) in union {
            match merged.last_mut() {
                Some((_, ml)) if s <= ml.saturating_add(1) => *ml = (*ml).max(l),
                _ => merged.push((s, l)),
            }
        }
        merged
            .iter()
            .any(|&(s, l)| s <= *r.start() && *r.end() <= l)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn random_alloc_free_sequences_keep_the_invariants(aps in apertures(), ops in prop::collection::vec(op(), 1..200)) {
            let mut a = IovaAllocator::new(&aps);
            let initial = a.clone();
            let mut live: Vec<(Iova, u64, u64)> = Vec::new();
            let mut sizes_that_fit = Vec::new();
            for op in ops {
                match op {
                    Op::Alloc { pages, align_shift } => {
                        let (len, align) = (pages << 12, 1u64 << align_shift);
                        if let Ok(iova) = a.alloc(len, align) {
                            live.push((iova, len, align));
                            sizes_that_fit.push((len, align));
                        }
                    }
                    Op::Free { pick } if !live.is_empty() => {
                        let (iova, len, _) = live.swap_remove(pick % live.len());
                        prop_assert_eq!(a.free(iova).unwrap(), len);
                        prop_assert!(a.free(iova).is_err(), "double free is refused");
                    }
                    Op::Free { .. } => {}
                }
                // Invariants after every step.
                let mut ranges: Vec<(u64, u64)> = live.iter().map(|&(i, l, _)| (i.0, i.0 + l - 1)).collect();
                ranges.sort();
                for w in ranges.windows(2) {
                    prop_assert!(w[0].1 < w[1].0, "overlap {:x?}", w);
                }
                for &(iova, len, align) in &live {
                    let r = iova.0..=iova.0 + len - 1;
                    prop_assert!(iova.0 % align == 0);
                    prop_assert!(inside(&aps, &r), "{:x?} outside {:x?}", r, aps);
                    prop_assert!(*r.end() < *X86_MSI_WINDOW.start() || *r.start() > *X86_MSI_WINDOW.end());
                }
                prop_assert_eq!(a.allocated_bytes() + a.free_bytes(), initial.free_bytes());
            }
            for (iova, _, _) in live.drain(..) {
                a.free(iova).unwrap();
            }
            prop_assert_eq!(&a, &initial, "everything freed coalesces back");
            // Every request that fit once (alone) fits again now.
            for (len, align) in sizes_that_fit {
                let iova = a.alloc(len, align).unwrap();
                a.free(iova).unwrap();
            }
        }
    }
}
