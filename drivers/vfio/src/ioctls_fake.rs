//! The `cfg(test)` twin of `ioctls.rs`: identical signatures, a scripted
//! kernel. fds are real (`/dev/null`), so ownership and drop order behave as
//! in production; what each ioctl answers comes from a thread-local
//! [`Script`], and every call is logged ([`calls`]). BAR "mmaps" are heap
//! buffers; the device file behind pread/pwrite is a byte array.

use std::alloc::{self, Layout};
use std::cell::RefCell;
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

use crate::info::{DeviceInfo, IrqInfo, IrqSet, RegionInfo, encode_iommu_info};

/// One logged call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Call {
    Open(PathBuf),
    SetContainer,
    UnsetContainer,
    SetIommu(u32),
    GetDeviceFd(String),
    SetIrqs(Vec<u32>),
    Reset,
    Map {
        vaddr: usize,
        iova: u64,
        size: u64,
        writable: bool,
    },
    Unmap {
        iova: u64,
        size: u64,
    },
    Write {
        offset: u64,
        bytes: Vec<u8>,
    },
    Mmap {
        offset: u64,
        len: usize,
    },
    Munmap {
        len: usize,
    },
    IoasAlloc,
    Destroy(u32),
    BindIommufd,
    AttachPt(u32),
    ExportDmabuf {
        index: u32,
        offset: u64,
        length: u64,
    },
    MapFile {
        ioas: u32,
        start: u64,
        length: u64,
        iova: u64,
    },
    IoasUnmap {
        ioas: u32,
        iova: u64,
        length: u64,
    },
}

/// What the scripted kernel answers.
pub(crate) struct Script {
    pub(crate) api_version: i32,
    pub(crate) type1v2: bool,
    pub(crate) group_flags: u32,
    /// errno for opening these paths.
    pub(crate) open_errno: Vec<(PathBuf, i32)>,
    pub(crate) device: DeviceInfo,
    pub(crate) regions: Vec<RegionInfo>,
    pub(crate) irqs: Vec<IrqInfo>,
    pub(crate) iommu_info: Vec<u8>,
    /// errno for MAP_DMA.
    pub(crate) map_errno: Option<i32>,
    /// Bytes the kernel claims to unmap (`None`: all asked for).
    pub(crate) unmap_short: Option<u64>,
    pub(crate) memlock: u64,
    /// The device file (regions at their offsets).
    pub(crate) file: Vec<u8>,
    /// errno for the dma-buf export (a kernel before 6.19: ENOTTY).
    pub(crate) dmabuf_errno: Option<i32>,
    /// errno for IOMMU_IOAS_MAP_FILE (a non-VFIO dma-buf: EOPNOTSUPP).
    pub(crate) map_file_errno: Option<i32>,
}

impl Default for Script {
    fn default() -> Self {
        let region = |index: u32, flags: u32, size: u64| RegionInfo {
            index,
            flags,
            size,
            offset: u64::from(index) << 12,
        };
        Script {
            api_version: 0,
            type1v2: true,
            group_flags: 1, // VIABLE
            open_errno: Vec::new(),
            device: DeviceInfo {
                flags: 0b11, // RESET | PCI
                num_regions: 9,
                num_irqs: 5,
            },
            // BAR0: 4 KiB, read/write/mmap; BAR1..5, ROM: absent; config: 256 B.
            regions: (0..9)
                .map(|i| match i {
                    0 => region(0, 0b111, 4096),
                    7 => region(7, 0b011, 256),
                    i => region(i, 0, 0),
                })
                .collect(),
            irqs: vec![
                IrqInfo {
                    index: 0,
                    flags: 0b111,
                    count: 1,
                },
                IrqInfo {
                    index: 1,
                    flags: 0b1001,
                    count: 1,
                },
                IrqInfo {
                    index: 2,
                    flags: 0b1001,
                    count: 8,
                },
            ],
            iommu_info: encode_iommu_info(
                0x4020_1000,
                Some(&[0..=0xFEDF_FFFF, 0xFEF0_0000..=0x7F_FFFF_FFFF]),
            ),
            map_errno: None,
            unmap_short: None,
            memlock: 64 << 10,
            file: vec![0; 9 << 12],
            dmabuf_errno: None,
            map_file_errno: None,
        }
    }
}

thread_local! {
    static SCRIPT: RefCell<Script> = RefCell::new(Script::default());
    static CALLS: RefCell<Vec<Call>> = const { RefCell::new(Vec::new()) };
}

/// Replace this thread's script (and clear the log).
pub(crate) fn script(s: Script) {
    SCRIPT.with(|c| *c.borrow_mut() = s);
    CALLS.with(|c| c.borrow_mut().clear());
}

/// Change this thread's script in place.
pub(crate) fn edit(f: impl FnOnce(&mut Script)) {
    SCRIPT.with(|c| f(&mut c.borrow_mut()));
}

/// The calls logged on this thread.
pub(crate) fn calls() -> Vec<Call> {
    CALLS.with(|c| c.borrow().clone())
}

fn log(call: Call) {
    CALLS.with(|c| c.borrow_mut().push(call));
}

fn with<T>(f: impl FnOnce(&Script) -> T) -> T {
    SCRIPT.with(|c| f(&c.borrow()))
}

fn null_fd() -> io::Result<OwnedFd> {
    Ok(std::fs::File::open("/dev/null")?.into())
}

pub(crate) fn open_rw(path: &Path) -> io::Result<OwnedFd> {
    log(Call::Open(path.to_path_buf()));
    if let Some(e) = with(|s| {
        s.open_errno
            .iter()
            .find(|(p, _)| p == path)
            .map(|&(_, e)| e)
    }) {
        return Err(io::Error::from_raw_os_error(e));
    }
    null_fd()
}

pub(crate) fn get_api_version(_: BorrowedFd<'_>) -> io::Result<i32> {
    Ok(with(|s| s.api_version))
}

pub(crate) fn check_extension(_: BorrowedFd<'_>, ext: u32) -> io::Result<bool> {
    Ok(ext == 3 && with(|s| s.type1v2))
}

pub(crate) fn set_iommu(_: BorrowedFd<'_>, ty: u32) -> io::Result<()> {
    log(Call::SetIommu(ty));
    Ok(())
}

pub(crate) fn group_get_status(_: BorrowedFd<'_>) -> io::Result<u32> {
    Ok(with(|s| s.group_flags))
}

pub(crate) fn group_set_container(_: BorrowedFd<'_>, _: BorrowedFd<'_>) -> io::Result<()> {
    log(Call::SetContainer);
    Ok(())
}

pub(crate) fn group_unset_container(_: BorrowedFd<'_>) -> io::Result<()> {
    log(Call::UnsetContainer);
    Ok(())
}

pub(crate) fn group_get_device_fd(_: BorrowedFd<'_>, name: &str) -> io::Result<OwnedFd> {
    log(Call::GetDeviceFd(name.to_string()));
    null_fd()
}

pub(crate) fn device_get_info(_: BorrowedFd<'_>) -> io::Result<DeviceInfo> {
    Ok(with(|s| s.device))
}

pub(crate) fn device_get_region_info(_: BorrowedFd<'_>, index: u32) -> io::Result<RegionInfo> {
    with(|s| s.regions.get(index as usize).copied())
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))
}

pub(crate) fn device_get_irq_info(_: BorrowedFd<'_>, index: u32) -> io::Result<IrqInfo> {
    with(|s| s.irqs.iter().find(|i| i.index == index).copied())
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))
}

pub(crate) fn device_set_irqs(_: BorrowedFd<'_>, set: &IrqSet) -> io::Result<()> {
    log(Call::SetIrqs(set.words().to_vec()));
    Ok(())
}

pub(crate) fn device_reset(_: BorrowedFd<'_>) -> io::Result<()> {
    log(Call::Reset);
    Ok(())
}

pub(crate) fn iommu_get_info(_: BorrowedFd<'_>) -> io::Result<Vec<u8>> {
    Ok(with(|s| s.iommu_info.clone()))
}

/// # Safety
///
/// As the real function's.
pub(crate) unsafe fn iommu_map_dma(
    _: BorrowedFd<'_>,
    vaddr: usize,
    iova: u64,
    size: u64,
    writable: bool,
) -> io::Result<()> {
    log(Call::Map {
        vaddr,
        iova,
        size,
        writable,
    });
    match with(|s| s.map_errno) {
        Some(e) => Err(io::Error::from_raw_os_error(e)),
        None => Ok(()),
    }
}

pub(crate) fn iommu_unmap_dma(_: BorrowedFd<'_>, iova: u64, size: u64) -> io::Result<u64> {
    log(Call::Unmap { iova, size });
    Ok(with(|s| s.unmap_short).unwrap_or(size))
}

pub(crate) fn iommu_ioas_alloc(_: BorrowedFd<'_>) -> io::Result<u32> {
    log(Call::IoasAlloc);
    Ok(7)
}

pub(crate) fn iommu_destroy(_: BorrowedFd<'_>, id: u32) -> io::Result<()> {
    log(Call::Destroy(id));
    Ok(())
}

pub(crate) fn iommu_ioas_map_file(
    _: BorrowedFd<'_>,
    ioas: u32,
    _file: BorrowedFd<'_>,
    start: u64,
    length: u64,
    iova: u64,
) -> io::Result<()> {
    log(Call::MapFile {
        ioas,
        start,
        length,
        iova,
    });
    match with(|s| s.map_file_errno) {
        Some(e) => Err(io::Error::from_raw_os_error(e)),
        None => Ok(()),
    }
}

pub(crate) fn iommu_ioas_unmap(
    _: BorrowedFd<'_>,
    ioas: u32,
    iova: u64,
    length: u64,
) -> io::Result<u64> {
    log(Call::IoasUnmap { ioas, iova, length });
    Ok(length)
}

pub(crate) fn device_bind_iommufd(_: BorrowedFd<'_>, _: BorrowedFd<'_>) -> io::Result<u32> {
    log(Call::BindIommufd);
    Ok(3)
}

pub(crate) fn device_attach_pt(_: BorrowedFd<'_>, pt_id: u32) -> io::Result<()> {
    log(Call::AttachPt(pt_id));
    Ok(())
}

pub(crate) fn device_export_dmabuf(
    _: BorrowedFd<'_>,
    index: u32,
    offset: u64,
    length: u64,
) -> io::Result<OwnedFd> {
    log(Call::ExportDmabuf {
        index,
        offset,
        length,
    });
    match with(|s| s.dmabuf_errno) {
        Some(e) => Err(io::Error::from_raw_os_error(e)),
        None => null_fd(),
    }
}

pub(crate) fn region_read(_: BorrowedFd<'_>, offset: u64, buf: &mut [u8]) -> io::Result<()> {
    SCRIPT.with(|c| {
        let s = c.borrow();
        let src = s
            .file
            .get(offset as usize..offset as usize + buf.len())
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
        buf.copy_from_slice(src);
        Ok(())
    })
}

pub(crate) fn region_write(_: BorrowedFd<'_>, offset: u64, buf: &[u8]) -> io::Result<()> {
    log(Call::Write {
        offset,
        bytes: buf.to_vec(),
    });
    SCRIPT.with(|c| {
        let mut s = c.borrow_mut();
        let dst = s
            .file
            .get_mut(offset as usize..offset as usize + buf.len())
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
        dst.copy_from_slice(buf);
        Ok(())
    })
}

fn layout(len: usize) -> io::Result<Layout> {
    Layout::from_size_align(len, 4096).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
}

pub(crate) fn mmap_region(_: BorrowedFd<'_>, offset: u64, len: usize) -> io::Result<NonNull<u8>> {
    log(Call::Mmap { offset, len });
    if len == 0 {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: non-zero size, valid layout.
    NonNull::new(unsafe { alloc::alloc_zeroed(layout(len)?) })
        .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))
}

/// # Safety
///
/// As the real function's.
pub(crate) unsafe fn munmap_region(ptr: NonNull<u8>, len: usize) -> io::Result<()> {
    log(Call::Munmap { len });
    // SAFETY: allocated by `mmap_region` with this length and layout.
    unsafe { alloc::dealloc(ptr.as_ptr(), layout(len)?) };
    Ok(())
}

pub(crate) fn eventfd() -> io::Result<OwnedFd> {
    null_fd()
}

pub(crate) fn eventfd_wait(_: BorrowedFd<'_>, _timeout_ms: u16) -> io::Result<Option<u64>> {
    Ok(None)
}

pub(crate) fn memlock_limit() -> io::Result<u64> {
    Ok(with(|s| s.memlock))
}
