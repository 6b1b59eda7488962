//! Making host memory visible to a device: the [`Mapper`] trait (rnic-vfio
//! implements it with `VFIO_IOMMU_MAP_DMA`), the [`IdentityMapper`] of the
//! software backend, a [`RecordingMapper`] for tests, and the [`DmaDomain`]
//! that pairs a mapper with the IOVA space it maps into.

use std::fmt;
use std::io;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use rnic_core::Iova;

use crate::error::DmaError;
use crate::iova::IovaAllocator;

/// Installs and removes device (IOMMU) mappings.
///
/// # Safety
///
/// Implementors promise that once [`Mapper::unmap`] has returned `Ok`, the
/// device can no longer read or write the host memory that was mapped at that
/// IOVA (for VFIO: the `VFIO_IOMMU_UNMAP_DMA` ioctl succeeded, which also
/// flushes the IOTLB). [`crate::DmaRegion`] unmaps its host memory right after,
/// so a lying implementation lets a device write into freed memory.
pub unsafe trait Mapper: Send + Sync + fmt::Debug {
    /// Map `[host, host + len)` at `[iova, iova + len)` for the device.
    ///
    /// # Safety
    ///
    /// The caller must keep `[host, host + len)` mapped, and must not reuse
    /// or free it, until `unmap(iova, len)` has returned `Ok`: from now on the
    /// device may read and write it at any moment.
    unsafe fn map(&self, iova: Iova, host: NonNull<u8>, len: u64) -> io::Result<()>;

    /// [`Mapper::map`] for memory the device only reads (a registration
    /// granting no write access): a mapper that can restrict the device
    /// (VFIO's `VFIO_DMA_MAP_FLAG_READ` alone) makes its writes fault, and
    /// can then map memory the process itself mapped read-only. The default
    /// maps as [`Mapper::map`] does.
    ///
    /// # Safety
    ///
    /// As [`Mapper::map`].
    unsafe fn map_read_only(&self, iova: Iova, host: NonNull<u8>, len: u64) -> io::Result<()> {
        // SAFETY: the caller's contract is map's.
        unsafe { self.map(iova, host, len) }
    }

    /// Remove the mapping made by `map(iova, _, len)`.
    fn unmap(&self, iova: Iova, len: u64) -> io::Result<()>;

    /// Whether the device addresses host memory by its virtual address
    /// (IOVA = VA), so no IOVA needs allocating.
    fn identity(&self) -> bool {
        false
    }
}

/// The software backend's mapper: the "device" is this process, so an IOVA
/// is the host virtual address and mapping is a no-op.
#[derive(Clone, Copy, Debug, Default)]
pub struct IdentityMapper;

// SAFETY: no device is involved; after `unmap` nothing but this process's own
// code (which the region's lifetime governs) accesses the memory.
unsafe impl Mapper for IdentityMapper {
    unsafe fn map(&self, _iova: Iova, _host: NonNull<u8>, _len: u64) -> io::Result<()> {
        Ok(())
    }

    fn unmap(&self, _iova: Iova, _len: u64) -> io::Result<()> {
        Ok(())
    }

    fn identity(&self) -> bool {
        true
    }
}

/// One call a [`RecordingMapper`] saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapperCall {
    /// `map(iova, host, len)`.
    Map {
        /// Device address.
        iova: Iova,
        /// Host address.
        host: usize,
        /// Length.
        len: u64,
    },
    /// `unmap(iova, len)`.
    Unmap {
        /// Device address.
        iova: Iova,
        /// Length.
        len: u64,
    },
}

/// A mapper for tests: records every call and can be told to fail.
#[derive(Clone, Debug, Default)]
pub struct RecordingMapper {
    calls: Arc<Mutex<Vec<MapperCall>>>,
    fail_map: Option<i32>,
    fail_unmap: Option<i32>,
}

impl RecordingMapper {
    /// A mapper that succeeds and records.
    pub fn new() -> RecordingMapper {
        RecordingMapper::default()
    }

    /// Make every `map` fail with `errno`.
    pub fn failing_map(mut self, errno: i32) -> RecordingMapper {
        self.fail_map = Some(errno);
        self
    }

    /// Make every `unmap` fail with `errno`.
    pub fn failing_unmap(mut self, errno: i32) -> RecordingMapper {
        self.fail_unmap = Some(errno);
        self
    }

    /// The calls so far (shared between clones).
    pub fn calls(&self) -> Vec<MapperCall> {
        lock(&self.calls).clone()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section in this crate leaves its data consistent before
    // anything that can panic, so a poisoned lock still holds valid data.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

// SAFETY: no device is involved; the recorder never touches the memory.
unsafe impl Mapper for RecordingMapper {
    unsafe fn map(&self, iova: Iova, host: NonNull<u8>, len: u64) -> io::Result<()> {
        lock(&self.calls).push(MapperCall::Map {
            iova,
            host: host.as_ptr() as usize,
            len,
        });
        match self.fail_map {
            Some(e) => Err(io::Error::from_raw_os_error(e)),
            None => Ok(()),
        }
    }

    fn unmap(&self, iova: Iova, len: u64) -> io::Result<()> {
        lock(&self.calls).push(MapperCall::Unmap { iova, len });
        match self.fail_unmap {
            Some(e) => Err(io::Error::from_raw_os_error(e)),
            None => Ok(()),
        }
    }
}

/// A device address space: the mapper that programs it and, unless the
/// mapper is an identity mapper, the allocator of its IOVAs. Shared by every
/// region mapped into it (`Arc<DmaDomain>`); each region keeps its domain alive.
#[derive(Debug)]
pub struct DmaDomain {
    mapper: Box<dyn Mapper>,
    iova: Option<Mutex<IovaAllocator>>,
}

impl DmaDomain {
    /// The software backend's domain: [`IdentityMapper`], IOVA = VA.
    pub fn identity() -> Arc<DmaDomain> {
        Arc::new(DmaDomain {
            mapper: Box::new(IdentityMapper),
            iova: None,
        })
    }

    /// A domain whose IOVAs come from `allocator` and are mapped by `mapper`.
    /// An identity mapper ignores the allocator.
    pub fn new(mapper: impl Mapper + 'static, allocator: IovaAllocator) -> Arc<DmaDomain> {
        let iova = (!mapper.identity()).then(|| Mutex::new(allocator));
        Arc::new(DmaDomain {
            mapper: Box::new(mapper),
            iova,
        })
    }

    /// Whether IOVA = host VA in this domain.
    pub fn is_identity(&self) -> bool {
        self.iova.is_none()
    }

    /// Whether `iova` is a live allocation of this domain's allocator.
    pub fn iova_allocated(&self, iova: Iova) -> bool {
        self.iova
            .as_ref()
            .is_some_and(|a| lock(a).is_allocated(iova))
    }

    /// Bytes of IOVA space allocated (0 for identity domains).
    pub fn iova_allocated_bytes(&self) -> u64 {
        self.iova.as_ref().map_or(0, |a| lock(a).allocated_bytes())
    }

    /// Allocate `len` bytes of IOVA aligned to `align`, or `None` for an
    /// identity domain.
    pub(crate) fn alloc_iova(&self, len: u64, align: u64) -> Result<Option<Iova>, DmaError> {
        match &self.iova {
            None => Ok(None),
            Some(a) => lock(a).alloc(len, align).map(Some),
        }
    }

    pub(crate) fn free_iova(&self, iova: Iova) -> Result<u64, DmaError> {
        match &self.iova {
            None => Ok(0),
            Some(a) => lock(a).free(iova),
        }
    }

    pub(crate) fn mapper(&self) -> &dyn Mapper {
        &*self.mapper
    }
}
