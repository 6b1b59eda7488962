//! The IOMMU side: a VFIO container with one group attached, the type1v2
//! IOMMU, its IOVA ranges, and DMA map/unmap with bookkeeping
//! ([`VfioMapper`] is rnic-dma's [`Mapper`]).

use std::collections::BTreeMap;
use std::io;
use std::ops::RangeInclusive;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use rnic_core::Iova;
use rnic_dma::iova::X86_MSI_WINDOW;
use rnic_dma::{DmaDomain, IovaAllocator, Mapper};
use tracing::{debug, error};

use crate::error::VfioError;
use crate::info::IommuInfo;
use crate::ioctls;

/// The aperture assumed when the kernel reports no IOVA-range capability
/// (before Linux 5.4): the low 4 GiB, which every IOMMU and device reaches.
pub const FALLBACK_APERTURE: RangeInclusive<u64> = 0..=0xFFFF_FFFF;

/// The first 4 KiB of IOVA space, never allocated.
pub const ZERO_PAGE: RangeInclusive<u64> = 0..=0xFFF;

/// Which kernel interface owns the device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Backend {
    /// What is in use: always the legacy container (`/dev/vfio/vfio` +
    /// `/dev/vfio/<group>`, `VFIO_TYPE1v2_IOMMU`).
    pub kind: &'static str,
    /// The iommufd cdev (`/dev/vfio/devices/vfioX`) when the kernel also
    /// offers that path; not used yet.
    pub cdev: Option<PathBuf>,
}

impl Backend {
    /// A one-line description.
    pub fn describe(&self) -> String {
        match &self.cdev {
            Some(c) => format!(
                "{} (iommufd cdev {} present, unused)",
                self.kind,
                c.display()
            ),
            None => format!("{} (no /dev/iommu cdev)", self.kind),
        }
    }
}

/// A container holding one group, with the type1v2 IOMMU set. Dropping it
/// detaches the group (devices and BAR mappings hold an `Arc`, so they are
/// gone by then) and closes both fds.
#[derive(Debug)]
pub struct Container {
    // Field order is drop order: the group fd closes before the container fd.
    group_fd: OwnedFd,
    fd: OwnedFd,
    group: u32,
    path: PathBuf,
    info: IommuInfo,
    /// Live mappings: IOVA → length.
    maps: Mutex<BTreeMap<u64, u64>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Critical sections leave the map consistent before anything can panic.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Container {
    /// Attach `group_fd` (group number `group`) to the container `fd` and
    /// select type1v2; reads the IOMMU info.
    pub(crate) fn attach(
        fd: OwnedFd,
        path: PathBuf,
        group_fd: OwnedFd,
        group: u32,
    ) -> Result<Container, VfioError> {
        let gname = format!("/dev/vfio/{group}");
        ioctls::group_set_container(group_fd.as_fd(), fd.as_fd())
            .map_err(|e| VfioError::ioctl("VFIO_GROUP_SET_CONTAINER", &gname, e))?;
        // From here on, dropping `c` detaches the group again.
        let mut c = Container {
            group_fd,
            fd,
            group,
            path,
            info: IommuInfo {
                iova_pgsizes: 0,
                iova_ranges: None,
            },
            maps: Mutex::new(BTreeMap::new()),
        };
        ioctls::set_iommu(
            c.fd.as_fd(),
            vfio_bindings::bindings::vfio::VFIO_TYPE1v2_IOMMU,
        )
        .map_err(|e| VfioError::ioctl("VFIO_SET_IOMMU(TYPE1v2)", c.path.display(), e))?;
        let raw = ioctls::iommu_get_info(c.fd.as_fd())
            .map_err(|e| VfioError::ioctl("VFIO_IOMMU_GET_INFO", c.path.display(), e))?;
        c.info = crate::info::parse_iommu_info(&raw).map_err(|e| {
            VfioError::ioctl(
                "VFIO_IOMMU_GET_INFO",
                c.path.display(),
                io::Error::new(io::ErrorKind::InvalidData, e.0),
            )
        })?;
        debug!(group, info = ?c.info, "container attached");
        Ok(c)
    }

    pub(crate) fn group_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.group_fd.as_fd()
    }

    /// The IOMMU group number.
    pub fn group(&self) -> u32 {
        self.group
    }

    /// Supported IOMMU page sizes (bitmap).
    pub fn iova_pgsizes(&self) -> u64 {
        self.info.iova_pgsizes
    }

    /// Whether the kernel reported the IOVA-range capability.
    pub fn has_iova_range_cap(&self) -> bool {
        self.info.iova_ranges.is_some()
    }

    /// The usable IOVA ranges (inclusive): the capability's, or
    /// [`FALLBACK_APERTURE`] when the kernel reports none.
    pub fn iova_ranges(&self) -> Vec<RangeInclusive<u64>> {
        self.info
            .iova_ranges
            .clone()
            .unwrap_or_else(|| vec![FALLBACK_APERTURE])
    }

    /// An allocator over [`Container::iova_ranges`], clipped to
    /// `[0, limit]` (a device's DMA mask), minus the x86 MSI window and
    /// minus [`ZERO_PAGE`]: IOVA 0 is never handed out, since devices and
    /// drivers commonly read address 0 as "none".
    pub fn iova_allocator(&self, limit: u64) -> IovaAllocator {
        let clipped: Vec<_> = self
            .iova_ranges()
            .into_iter()
            .filter(|r| *r.start() <= limit)
            .map(|r| *r.start()..=(*r.end()).min(limit))
            .collect();
        IovaAllocator::with_reserved(&clipped, &[ZERO_PAGE, X86_MSI_WINDOW])
    }

    /// The live mappings (IOVA, length), lowest first.
    pub fn mappings(&self) -> Vec<(u64, u64)> {
        lock(&self.maps).iter().map(|(&i, &l)| (i, l)).collect()
    }

    /// `VFIO_IOMMU_MAP_DMA` of `[host, host + len)` at `iova` (read/write).
    /// Refuses overlaps with live mappings before asking the kernel.
    ///
    /// # Safety
    ///
    /// The device may read and write `[host, host + len)` from now until
    /// [`Container::unmap_dma`] of this IOVA returned `Ok`: the caller keeps
    /// it mapped, does not reuse it, and creates no Rust reference into it
    /// (a `&`/`&mut` to memory a device writes is undefined behaviour).
    pub unsafe fn map_dma(&self, iova: u64, host: NonNull<u8>, len: u64) -> Result<(), VfioError> {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.map_dma_access(iova, host, len, true) }
    }

    /// [`Container::map_dma`] for the device to read only: its writes to
    /// the IOVA fault in the IOMMU, and memory the process mapped read-only
    /// can be mapped (the kernel pins such pages only for reading).
    ///
    /// # Safety
    ///
    /// As [`Container::map_dma`], for reads: the caller keeps the range
    /// mapped until [`Container::unmap_dma`] of this IOVA returned `Ok`.
    pub unsafe fn map_dma_read_only(
        &self,
        iova: u64,
        host: NonNull<u8>,
        len: u64,
    ) -> Result<(), VfioError> {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.map_dma_access(iova, host, len, false) }
    }

    /// [`Container::map_dma`], writable or not.
    ///
    /// # Safety
    ///
    /// As [`Container::map_dma`].
    unsafe fn map_dma_access(
        &self,
        iova: u64,
        host: NonNull<u8>,
        len: u64,
        writable: bool,
    ) -> Result<(), VfioError> {
        let range_err = |reason: String| VfioError::DmaRange {
            op: "map",
            iova,
            len,
            reason,
        };
        if len == 0 || iova.checked_add(len - 1).is_none() {
            return Err(range_err("empty or wrapping range".into()));
        }
        let last = iova + (len - 1);
        let mut maps = lock(&self.maps);
        if let Some((&i, &l)) = maps.range(..=last).next_back()
            && i + (l - 1) >= iova
        {
            return Err(range_err(format!(
                "overlaps the live mapping {i:#x}+{l:#x}"
            )));
        }
        // SAFETY: forwarded from this function's contract.
        let r = unsafe {
            ioctls::iommu_map_dma(self.fd.as_fd(), host.as_ptr() as usize, iova, len, writable)
        };
        match r {
            Ok(()) => {
                maps.insert(iova, len);
                Ok(())
            }
            Err(source) if matches!(source.raw_os_error(), Some(libc::ENOMEM | libc::EPERM)) => {
                let limit = match ioctls::memlock_limit() {
                    Ok(u64::MAX) => "unlimited".to_string(),
                    Ok(b) => format!("{b} bytes"),
                    Err(e) => format!("unknown ({e})"),
                };
                Err(VfioError::Memlock {
                    iova,
                    len,
                    limit,
                    source,
                })
            }
            Err(source) => Err(VfioError::ioctl(
                "VFIO_IOMMU_MAP_DMA",
                format!("{} IOVA {iova:#x}+{len:#x}", self.path.display()),
                source,
            )),
        }
    }

    /// `VFIO_IOMMU_UNMAP_DMA` of a mapping made by [`Container::map_dma`]
    /// (same IOVA and length). When it returns `Ok`, the device can no
    /// longer reach the memory (the kernel flushed the IOTLB).
    pub fn unmap_dma(&self, iova: u64, len: u64) -> Result<(), VfioError> {
        let mut maps = lock(&self.maps);
        if maps.get(&iova) != Some(&len) {
            return Err(VfioError::DmaRange {
                op: "unmap",
                iova,
                len,
                reason: "not a live mapping of this container (wrong IOVA or length)".into(),
            });
        }
        let done = ioctls::iommu_unmap_dma(self.fd.as_fd(), iova, len).map_err(|e| {
            VfioError::ioctl(
                "VFIO_IOMMU_UNMAP_DMA",
                format!("{} IOVA {iova:#x}+{len:#x}", self.path.display()),
                e,
            )
        })?;
        if done != len {
            return Err(VfioError::DmaRange {
                op: "unmap",
                iova,
                len,
                reason: format!("the kernel unmapped {done:#x} bytes"),
            });
        }
        maps.remove(&iova);
        Ok(())
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let left = lock(&self.maps).len();
        if left > 0 {
            error!(left, "container dropped with live DMA mappings");
        }
        if let Err(e) = ioctls::group_unset_container(self.group_fd.as_fd()) {
            error!(group = self.group, %e, "VFIO_GROUP_UNSET_CONTAINER failed");
        }
    }
}

/// rnic-dma's [`Mapper`] over a VFIO container: regions built with
/// `DmaRegion::builder(..).domain(device.dma_domain(..))` are mapped through
/// the IOMMU. Holds the container (and so the group attachment) alive.
#[derive(Clone, Debug)]
pub struct VfioMapper(pub Arc<Container>);

impl VfioMapper {
    /// A DMA domain over this container, IOVAs below `limit` (inclusive).
    pub fn domain(self, limit: u64) -> Arc<DmaDomain> {
        let alloc = self.0.iova_allocator(limit);
        DmaDomain::new(self, alloc)
    }
}

// SAFETY: `unmap` returns Ok only when VFIO_IOMMU_UNMAP_DMA succeeded for the
// whole range (Container::unmap_dma checks the byte count), after which the
// kernel has removed the IOMMU entries and flushed the IOTLB.
unsafe impl Mapper for VfioMapper {
    unsafe fn map(&self, iova: Iova, host: NonNull<u8>, len: u64) -> io::Result<()> {
        // SAFETY: the caller's contract (Mapper::map) is the one map_dma needs.
        unsafe { self.0.map_dma(iova.0, host, len) }.map_err(io::Error::other)
    }

    unsafe fn map_read_only(&self, iova: Iova, host: NonNull<u8>, len: u64) -> io::Result<()> {
        // SAFETY: the caller's contract (Mapper::map_read_only) is the one
        // map_dma_read_only needs.
        unsafe { self.0.map_dma_read_only(iova.0, host, len) }.map_err(io::Error::other)
    }

    fn unmap(&self, iova: Iova, len: u64) -> io::Result<()> {
        self.0.unmap_dma(iova.0, len).map_err(io::Error::other)
    }
}
