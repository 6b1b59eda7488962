//! Typed answers of the VFIO ioctls and the pure byte layouts around them:
//! the `VFIO_IOMMU_GET_INFO` capability chain (IOVA ranges) and the
//! `VFIO_DEVICE_SET_IRQS` argument. Safe code only; tested on synthetic bytes.

use std::ops::RangeInclusive;

use vfio_bindings::bindings::vfio as b;

/// `VFIO_DEVICE_GET_INFO`'s answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// `VFIO_DEVICE_FLAGS_*` (bit 0: reset supported, bit 1: PCI).
    pub flags: u32,
    /// Number of regions (BARs, ROM, config, VGA, ...).
    pub num_regions: u32,
    /// Number of interrupt indexes (INTx, MSI, MSI-X, ERR, REQ).
    pub num_irqs: u32,
}

impl DeviceInfo {
    /// Whether `VFIO_DEVICE_RESET` is supported.
    pub fn reset_supported(&self) -> bool {
        self.flags & b::VFIO_DEVICE_FLAGS_RESET != 0
    }
}

/// `VFIO_DEVICE_GET_REGION_INFO`'s answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionInfo {
    /// Region index (`VFIO_PCI_BAR0_REGION_INDEX` .. `VFIO_PCI_CONFIG_REGION_INDEX`).
    pub index: u32,
    /// `VFIO_REGION_INFO_FLAG_*` (read 1, write 2, mmap 4, caps 8).
    pub flags: u32,
    /// Size in bytes (0: the BAR is not implemented).
    pub size: u64,
    /// Offset of the region in the device fd (for pread/pwrite/mmap).
    pub offset: u64,
}

impl RegionInfo {
    /// Whether the region may be mmapped.
    pub fn mmap_supported(&self) -> bool {
        self.flags & b::VFIO_REGION_INFO_FLAG_MMAP != 0
    }
}

/// `VFIO_DEVICE_GET_IRQ_INFO`'s answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IrqInfo {
    /// Interrupt index (`VFIO_PCI_MSI_IRQ_INDEX`, ...).
    pub index: u32,
    /// `VFIO_IRQ_INFO_*` flags.
    pub flags: u32,
    /// Vectors available at this index.
    pub count: u32,
}

/// What `VFIO_IOMMU_GET_INFO` says about the type1 IOMMU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IommuInfo {
    /// Supported IOMMU page sizes, as a bitmap (bit n: 2^n bytes).
    pub iova_pgsizes: u64,
    /// Usable IOVA ranges (inclusive), from the IOVA-range capability; `None`
    /// when the kernel reports no such capability (before Linux 5.4).
    pub iova_ranges: Option<Vec<RangeInclusive<u64>>>,
}

/// A malformed `VFIO_IOMMU_GET_INFO` buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CapChainError(pub String);

const INFO_LEN: usize = size_of::<b::vfio_iommu_type1_info>();
const CAP_HEADER_LEN: usize = size_of::<b::vfio_info_cap_header>();
const IOVA_CAP_LEN: usize = size_of::<b::vfio_iommu_type1_info_cap_iova_range>();
const IOVA_RANGE_LEN: usize = size_of::<b::vfio_iova_range>();

fn u16_at(buf: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(buf.get(at..at + 2)?.try_into().ok()?))
}
fn u32_at(buf: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(buf.get(at..at + 4)?.try_into().ok()?))
}
fn u64_at(buf: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(buf.get(at..at + 8)?.try_into().ok()?))
}

/// Parse a `struct vfio_iommu_type1_info` followed by its capability chain.
///
/// The chain is walked from `cap_offset` through each header's `next` (0
/// ends it); every offset must lie inside `buf` and move forward, so a
/// corrupt chain cannot loop. Unknown capabilities are skipped.
pub fn parse_iommu_info(buf: &[u8]) -> Result<IommuInfo, CapChainError> {
    let err = |m: String| CapChainError(m);
    if buf.len() < INFO_LEN {
        return Err(err(format!(
            "info is {} bytes, less than the {INFO_LEN}-byte header",
            buf.len()
        )));
    }
    let field = |at| u32_at(buf, at).ok_or_else(|| err(format!("short read at {at}")));
    let flags = field(4)?;
    let iova_pgsizes = u64_at(buf, 8).ok_or_else(|| err("short read at 8".into()))?;
    let mut info = IommuInfo {
        iova_pgsizes,
        iova_ranges: None,
    };
    if flags & b::VFIO_IOMMU_INFO_CAPS == 0 {
        return Ok(info);
    }
    let mut at = field(16)? as usize;
    let mut last = 0usize;
    while at != 0 {
        if at < INFO_LEN || at <= last || at + CAP_HEADER_LEN > buf.len() {
            return Err(err(format!(
                "capability at offset {at} is outside the {}-byte buffer or not after the previous one ({last})",
                buf.len()
            )));
        }
        let id = u16_at(buf, at).unwrap_or_default();
        let next = u32_at(buf, at + 4).unwrap_or_default() as usize;
        if u32::from(id) == b::VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE {
            let nr = u32_at(buf, at + CAP_HEADER_LEN)
                .ok_or_else(|| err(format!("IOVA-range capability at {at} is truncated")))?
                as usize;
            let first = at + IOVA_CAP_LEN;
            let end = nr
                .checked_mul(IOVA_RANGE_LEN)
                .and_then(|n| n.checked_add(first))
                .filter(|&e| e <= buf.len())
                .ok_or_else(|| {
                    err(format!(
                        "IOVA-range capability at {at} claims {nr} ranges, more than the buffer holds"
                    ))
                })?;
            let mut ranges = Vec::with_capacity(nr);
            for r in (first..end).step_by(IOVA_RANGE_LEN) {
                let (start, last) = (
                    u64_at(buf, r).unwrap_or_default(),
                    u64_at(buf, r + 8).unwrap_or_default(),
                );
                if start > last {
                    return Err(err(format!(
                        "IOVA range {start:#x}..={last:#x} is inverted"
                    )));
                }
                ranges.push(start..=last);
            }
            info.iova_ranges = Some(ranges);
        }
        last = at;
        at = next;
    }
    Ok(info)
}

/// Serialise a `struct vfio_iommu_type1_info` with an IOVA-range capability
/// (what the kernel writes); used by the test fake and the parser's tests.
pub fn encode_iommu_info(iova_pgsizes: u64, ranges: Option<&[RangeInclusive<u64>]>) -> Vec<u8> {
    let mut buf = vec![0u8; INFO_LEN];
    let flags = b::VFIO_IOMMU_INFO_PGSIZES | ranges.map_or(0, |_| b::VFIO_IOMMU_INFO_CAPS);
    buf[4..8].copy_from_slice(&flags.to_ne_bytes());
    buf[8..16].copy_from_slice(&iova_pgsizes.to_ne_bytes());
    if let Some(ranges) = ranges {
        buf[16..20].copy_from_slice(&(INFO_LEN as u32).to_ne_bytes());
        let id = b::VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE as u16;
        buf.extend_from_slice(&id.to_ne_bytes());
        buf.extend_from_slice(&1u16.to_ne_bytes()); // version
        buf.extend_from_slice(&0u32.to_ne_bytes()); // next
        buf.extend_from_slice(&(ranges.len() as u32).to_ne_bytes());
        buf.extend_from_slice(&0u32.to_ne_bytes()); // reserved
        for r in ranges {
            buf.extend_from_slice(&r.start().to_ne_bytes());
            buf.extend_from_slice(&r.end().to_ne_bytes());
        }
    }
    let argsz = buf.len() as u32;
    buf[0..4].copy_from_slice(&argsz.to_ne_bytes());
    buf
}

/// The argument of `VFIO_DEVICE_SET_IRQS`, as 32-bit words: `argsz, flags,
/// index, start, count` and then one eventfd per vector (`DATA_EVENTFD |
/// ACTION_TRIGGER`), or nothing (`DATA_NONE | ACTION_TRIGGER` with count 0
/// disables the index).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IrqSet(Vec<u32>);

impl IrqSet {
    /// Route vectors `start..start + fds.len()` of `index` to `fds`.
    pub fn eventfds(index: u32, start: u32, fds: &[i32]) -> IrqSet {
        let mut words = vec![
            0,
            b::VFIO_IRQ_SET_DATA_EVENTFD | b::VFIO_IRQ_SET_ACTION_TRIGGER,
            index,
            start,
            fds.len() as u32,
        ];
        words.extend(fds.iter().map(|&fd| fd as u32));
        words[0] = (words.len() * 4) as u32;
        IrqSet(words)
    }

    /// Disable every vector of `index`.
    pub fn disable(index: u32) -> IrqSet {
        IrqSet(vec![
            20,
            b::VFIO_IRQ_SET_DATA_NONE | b::VFIO_IRQ_SET_ACTION_TRIGGER,
            index,
            0,
            0,
        ])
    }

    /// The words (argsz first).
    pub fn words(&self) -> &[u32] {
        &self.0
    }

    /// The interrupt index.
    pub fn index(&self) -> u32 {
        self.0[2]
    }

    /// The eventfds, in vector order.
    pub fn fds(&self) -> Vec<i32> {
        self.0[5..].iter().map(|&w| w as i32).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iova_ranges_are_read_from_the_capability_chain() {
        let ranges = [0..=0xFEDF_FFFF, 0xFEF0_0000..=0xFF_FFFF_FFFF];
        let buf = encode_iommu_info(0x4020_1000, Some(&ranges));
        assert_eq!(buf.len(), 24 + 16 + 2 * 16, "header + cap + 2 ranges");
        let info = parse_iommu_info(&buf).unwrap();
        assert_eq!(info.iova_pgsizes, 0x4020_1000);
        assert_eq!(info.iova_ranges.as_deref(), Some(&ranges[..]));
    }

    #[test]
    fn unknown_capabilities_are_skipped_and_no_caps_means_none() {
        let plain = encode_iommu_info(0x1000, None);
        assert_eq!(parse_iommu_info(&plain).unwrap().iova_ranges, None);
        // A chain: an unknown cap (id 2, migration) first, then the IOVA range cap.
        let mut buf = encode_iommu_info(0x1000, Some(&[0x1000..=0xFFFF_FFFF]));
        let iova_cap = buf.split_off(24);
        let mut unknown = vec![0u8; 16];
        unknown[0..2].copy_from_slice(&2u16.to_ne_bytes());
        unknown[4..8].copy_from_slice(&(24u32 + 16).to_ne_bytes());
        buf.extend_from_slice(&unknown);
        buf.extend_from_slice(&iova_cap);
        let info = parse_iommu_info(&buf).unwrap();
        assert_eq!(info.iova_ranges, Some(vec![0x1000..=0xFFFF_FFFF]));
    }

    #[test]
    fn corrupt_chains_are_errors_not_loops_or_panics() {
        let good = encode_iommu_info(0x1000, Some(&[0..=0xFFFF]));
        // next points back at itself
        let mut looped = good.clone();
        looped[24 + 4..24 + 8].copy_from_slice(&24u32.to_ne_bytes());
        assert!(parse_iommu_info(&looped).is_err());
        // cap_offset beyond the buffer
        let mut far = good.clone();
        far[16..20].copy_from_slice(&4096u32.to_ne_bytes());
        assert!(parse_iommu_info(&far).is_err());
        // more ranges claimed than present
        let mut many = good.clone();
        many[24 + 8..24 + 12].copy_from_slice(&1000u32.to_ne_bytes());
        assert!(parse_iommu_info(&many).is_err());
        // inverted range
        let mut inv = good.clone();
        inv[40..48].copy_from_slice(&0x2_0000u64.to_ne_bytes());
        assert!(parse_iommu_info(&inv).is_err());
        // every truncation of a good buffer is an error or a parse, never a panic
        for n in 0..good.len() {
            let _ = parse_iommu_info(&good[..n]);
        }
        assert!(parse_iommu_info(&good[..10]).is_err());
    }

    #[test]
    fn irq_set_layout_matches_struct_vfio_irq_set() {
        let set = IrqSet::eventfds(b::VFIO_PCI_MSIX_IRQ_INDEX, 0, &[7, 9, 11]);
        let w = set.words();
        assert_eq!(w[0], 20 + 3 * 4, "argsz = header + one i32 per vector");
        assert_eq!(w[1], (1 << 2) | (1 << 5), "DATA_EVENTFD | ACTION_TRIGGER");
        assert_eq!((w[2], w[3], w[4]), (2, 0, 3));
        assert_eq!(set.fds(), vec![7, 9, 11]);
        assert_eq!(
            std::mem::offset_of!(b::vfio_irq_set, data),
            20,
            "eventfds start right after the five header words"
        );
        let off = IrqSet::disable(b::VFIO_PCI_MSI_IRQ_INDEX);
        assert_eq!(off.words(), &[20, 1 | (1 << 5), 1, 0, 0]);
    }
}
