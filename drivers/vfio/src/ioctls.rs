//! Every system call of rnic-vfio: one function per VFIO ioctl (numbers
//! computed with nix's `request_code_none!`, as `<linux/vfio.h>` defines them
//! with `_IO(VFIO_TYPE, VFIO_BASE + n)`), plus the file, mmap, pread/pwrite
//! and eventfd calls around them. Typed results; each `unsafe` block says why
//! it is sound. `ioctls_fake.rs` has the same signatures for `cargo test`.

use std::ffi::CString;
use std::io;
use std::num::NonZeroUsize;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::ptr::NonNull;

use nix::errno::Errno;
use nix::fcntl::{OFlag, open};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::mman::{MapFlags, ProtFlags, mmap, munmap};
use nix::sys::stat::Mode;
use nix::sys::uio::{pread, pwrite};
use nix::{
    ioctl_none_bad, ioctl_readwrite_bad, ioctl_write_int_bad, ioctl_write_ptr_bad,
    request_code_none,
};
use vfio_bindings::bindings::vfio as b;

use crate::info::{DeviceInfo, IrqInfo, IrqSet, RegionInfo};

const T: u8 = b::VFIO_TYPE;
const BASE: u32 = b::VFIO_BASE;

ioctl_none_bad!(vfio_get_api_version, request_code_none!(T, BASE));
ioctl_write_int_bad!(vfio_check_extension, request_code_none!(T, BASE + 1));
ioctl_write_int_bad!(vfio_set_iommu, request_code_none!(T, BASE + 2));
ioctl_readwrite_bad!(
    vfio_group_get_status,
    request_code_none!(T, BASE + 3),
    b::vfio_group_status
);
ioctl_write_ptr_bad!(
    vfio_group_set_container,
    request_code_none!(T, BASE + 4),
    libc::c_int
);
ioctl_none_bad!(vfio_group_unset_container, request_code_none!(T, BASE + 5));
ioctl_write_ptr_bad!(
    vfio_group_get_device_fd,
    request_code_none!(T, BASE + 6),
    libc::c_char
);
ioctl_readwrite_bad!(
    vfio_device_get_info,
    request_code_none!(T, BASE + 7),
    b::vfio_device_info
);
ioctl_readwrite_bad!(
    vfio_device_get_region_info,
    request_code_none!(T, BASE + 8),
    b::vfio_region_info
);
ioctl_readwrite_bad!(
    vfio_device_get_irq_info,
    request_code_none!(T, BASE + 9),
    b::vfio_irq_info
);
ioctl_write_ptr_bad!(
    vfio_device_set_irqs,
    request_code_none!(T, BASE + 10),
    b::vfio_irq_set
);
ioctl_none_bad!(vfio_device_reset, request_code_none!(T, BASE + 11));
// On a container fd, BASE + 12 is VFIO_IOMMU_GET_INFO (on a device fd the same
// number is VFIO_DEVICE_GET_PCI_HOT_RESET_INFO).
ioctl_readwrite_bad!(
    vfio_iommu_get_info,
    request_code_none!(T, BASE + 12),
    b::vfio_iommu_type1_info
);
ioctl_write_ptr_bad!(
    vfio_iommu_map_dma,
    request_code_none!(T, BASE + 13),
    b::vfio_iommu_type1_dma_map
);
ioctl_readwrite_bad!(
    vfio_iommu_unmap_dma,
    request_code_none!(T, BASE + 14),
    b::vfio_iommu_type1_dma_unmap
);

// The VFIO device cdev (Linux 6.6+) and the dma-buf feature (6.19+).
ioctl_readwrite_bad!(
    vfio_device_feature_raw,
    request_code_none!(T, BASE + 17),
    b::vfio_device_feature
);
ioctl_readwrite_bad!(
    vfio_device_bind_iommufd,
    request_code_none!(T, BASE + 18),
    b::vfio_device_bind_iommufd
);
ioctl_readwrite_bad!(
    vfio_device_attach_iommufd_pt,
    request_code_none!(T, BASE + 19),
    b::vfio_device_attach_iommufd_pt
);

/// iommufd's ioctl type (`IOMMUFD_TYPE`, `<linux/iommufd.h>`); the commands
/// are `_IO(IOMMUFD_TYPE, IOMMUFD_CMD_*)` with `IOMMUFD_CMD_BASE` = 0x80.
const IOMMUFD: u8 = b';';

/// `struct iommu_destroy`.
#[repr(C)]
pub(crate) struct IommuDestroy {
    size: u32,
    id: u32,
}

/// `struct iommu_ioas_alloc`.
#[repr(C)]
pub(crate) struct IommuIoasAlloc {
    size: u32,
    flags: u32,
    out_ioas_id: u32,
}

/// `struct iommu_ioas_map_file` (40 bytes).
#[repr(C)]
pub(crate) struct IommuIoasMapFile {
    size: u32,
    flags: u32,
    ioas_id: u32,
    fd: i32,
    start: u64,
    length: u64,
    iova: u64,
}

/// `struct iommu_ioas_unmap` (24 bytes).
#[repr(C)]
pub(crate) struct IommuIoasUnmap {
    size: u32,
    ioas_id: u32,
    iova: u64,
    length: u64,
}

const _: () = {
    assert!(size_of::<IommuDestroy>() == 8);
    assert!(size_of::<IommuIoasAlloc>() == 12);
    assert!(size_of::<IommuIoasMapFile>() == 40);
    assert!(size_of::<IommuIoasUnmap>() == 24);
};

ioctl_write_ptr_bad!(
    iommu_destroy_raw,
    request_code_none!(IOMMUFD, 0x80),
    IommuDestroy
);
ioctl_readwrite_bad!(
    iommu_ioas_alloc_raw,
    request_code_none!(IOMMUFD, 0x81),
    IommuIoasAlloc
);
ioctl_readwrite_bad!(
    iommu_ioas_unmap_raw,
    request_code_none!(IOMMUFD, 0x86),
    IommuIoasUnmap
);
ioctl_readwrite_bad!(
    iommu_ioas_map_file_raw,
    request_code_none!(IOMMUFD, 0x8f),
    IommuIoasMapFile
);

/// `IOMMU_IOAS_MAP_FIXED_IOVA | WRITEABLE | READABLE`.
const MAP_FIXED_RW: u32 = 0b111;

fn io(e: Errno) -> io::Error {
    io::Error::from(e)
}

/// `open(path, O_RDWR | O_CLOEXEC)`: the container, a group or an iommufd cdev.
pub(crate) fn open_rw(path: &Path) -> io::Result<OwnedFd> {
    open(path, OFlag::O_RDWR | OFlag::O_CLOEXEC, Mode::empty()).map_err(io)
}

/// `VFIO_GET_API_VERSION` (`VFIO_API_VERSION` = 0 on every kernel so far).
pub(crate) fn get_api_version(container: BorrowedFd<'_>) -> io::Result<i32> {
    // SAFETY: the ioctl takes no argument and only returns an int.
    unsafe { vfio_get_api_version(container.as_raw_fd()) }.map_err(io)
}

/// `VFIO_CHECK_EXTENSION(ext)`: whether the container supports `ext`.
pub(crate) fn check_extension(container: BorrowedFd<'_>, ext: u32) -> io::Result<bool> {
    // SAFETY: the argument is an integer, passed by value; no memory is shared.
    unsafe { vfio_check_extension(container.as_raw_fd(), ext as libc::c_int) }
        .map(|r| r > 0)
        .map_err(io)
}

/// `VFIO_SET_IOMMU(ty)`: pick the IOMMU model once a group is attached.
pub(crate) fn set_iommu(container: BorrowedFd<'_>, ty: u32) -> io::Result<()> {
    // SAFETY: the argument is an integer, passed by value.
    unsafe { vfio_set_iommu(container.as_raw_fd(), ty as libc::c_int) }
        .map(drop)
        .map_err(io)
}

/// `VFIO_GROUP_GET_STATUS`: the group's flags (`VIABLE`, `CONTAINER_SET`).
pub(crate) fn group_get_status(group: BorrowedFd<'_>) -> io::Result<u32> {
    let mut st = b::vfio_group_status {
        argsz: size_of::<b::vfio_group_status>() as u32,
        flags: 0,
    };
    // SAFETY: `st` is a valid, writable vfio_group_status whose argsz is its size.
    unsafe { vfio_group_get_status(group.as_raw_fd(), &mut st) }.map_err(io)?;
    Ok(st.flags)
}

/// `VFIO_GROUP_SET_CONTAINER`: attach the group to the container.
pub(crate) fn group_set_container(
    group: BorrowedFd<'_>,
    container: BorrowedFd<'_>,
) -> io::Result<()> {
    let fd: libc::c_int = container.as_raw_fd();
    // SAFETY: the kernel reads one int (the container fd) through the pointer,
    // which is valid for the call.
    unsafe { vfio_group_set_container(group.as_raw_fd(), &fd) }
        .map(drop)
        .map_err(io)
}

/// `VFIO_GROUP_UNSET_CONTAINER`: detach the group (its devices must be closed).
pub(crate) fn group_unset_container(group: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: no argument.
    unsafe { vfio_group_unset_container(group.as_raw_fd()) }
        .map(drop)
        .map_err(io)
}

/// `VFIO_GROUP_GET_DEVICE_FD(name)`: a device fd for `name` (`0000:00:02.0`).
pub(crate) fn group_get_device_fd(group: BorrowedFd<'_>, name: &str) -> io::Result<OwnedFd> {
    let name = CString::new(name).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: the kernel reads a NUL-terminated string through the pointer,
    // which `name` keeps valid for the call.
    let fd = unsafe { vfio_group_get_device_fd(group.as_raw_fd(), name.as_ptr()) }.map_err(io)?;
    // SAFETY: on success the ioctl returns a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `VFIO_DEVICE_GET_INFO`.
pub(crate) fn device_get_info(dev: BorrowedFd<'_>) -> io::Result<DeviceInfo> {
    let mut info = b::vfio_device_info {
        argsz: size_of::<b::vfio_device_info>() as u32,
        ..Default::default()
    };
    // SAFETY: `info` is a valid, writable vfio_device_info; argsz is its size,
    // so the kernel writes no capability chain past it.
    unsafe { vfio_device_get_info(dev.as_raw_fd(), &mut info) }.map_err(io)?;
    Ok(DeviceInfo {
        flags: info.flags,
        num_regions: info.num_regions,
        num_irqs: info.num_irqs,
    })
}

/// `VFIO_DEVICE_GET_REGION_INFO(index)` (without capabilities).
pub(crate) fn device_get_region_info(dev: BorrowedFd<'_>, index: u32) -> io::Result<RegionInfo> {
    let mut info = b::vfio_region_info {
        argsz: size_of::<b::vfio_region_info>() as u32,
        index,
        ..Default::default()
    };
    // SAFETY: `info` is valid and writable; argsz is its size, so the kernel
    // writes at most that much (it reports a larger argsz for capabilities).
    unsafe { vfio_device_get_region_info(dev.as_raw_fd(), &mut info) }.map_err(io)?;
    Ok(RegionInfo {
        index,
        flags: info.flags,
        size: info.size,
        offset: info.offset,
    })
}

/// `VFIO_DEVICE_GET_IRQ_INFO(index)`.
pub(crate) fn device_get_irq_info(dev: BorrowedFd<'_>, index: u32) -> io::Result<IrqInfo> {
    let mut info = b::vfio_irq_info {
        argsz: size_of::<b::vfio_irq_info>() as u32,
        index,
        ..Default::default()
    };
    // SAFETY: `info` is a valid, writable vfio_irq_info of the size in argsz.
    unsafe { vfio_device_get_irq_info(dev.as_raw_fd(), &mut info) }.map_err(io)?;
    Ok(IrqInfo {
        index,
        flags: info.flags,
        count: info.count,
    })
}

/// `VFIO_DEVICE_SET_IRQS` with a prepared [`IrqSet`].
pub(crate) fn device_set_irqs(dev: BorrowedFd<'_>, set: &IrqSet) -> io::Result<()> {
    let words = set.words();
    // SAFETY: `words` is a u32 buffer (4-aligned, as vfio_irq_set needs) laid
    // out as struct vfio_irq_set plus its data, `argsz` bytes long; the kernel
    // only reads it. The eventfds in it are kept open by the caller.
    unsafe { vfio_device_set_irqs(dev.as_raw_fd(), words.as_ptr().cast()) }
        .map(drop)
        .map_err(io)
}

/// `VFIO_DEVICE_RESET`.
pub(crate) fn device_reset(dev: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: no argument.
    unsafe { vfio_device_reset(dev.as_raw_fd()) }
        .map(drop)
        .map_err(io)
}

/// `VFIO_IOMMU_GET_INFO` with its capability chain: the raw bytes, for
/// [`crate::info::parse_iommu_info`]. Asks again with the size the kernel
/// reports when the chain does not fit.
pub(crate) fn iommu_get_info(container: BorrowedFd<'_>) -> io::Result<Vec<u8>> {
    let mut argsz = size_of::<b::vfio_iommu_type1_info>();
    for _ in 0..4 {
        // u64 words: vfio_iommu_type1_info is 8-aligned.
        let mut buf = vec![0u64; argsz.div_ceil(8)];
        let bytes = buf.len() * 8;
        let mut head = [0u8; 8];
        head[..4].copy_from_slice(&(bytes as u32).to_ne_bytes()); // argsz
        buf[0] = u64::from_ne_bytes(head);
        let ptr = buf.as_mut_ptr().cast::<b::vfio_iommu_type1_info>();
        // SAFETY: `ptr` points at `bytes` writable, 8-aligned bytes that start
        // with a vfio_iommu_type1_info whose argsz says `bytes`; the kernel
        // writes at most argsz bytes.
        unsafe { vfio_iommu_get_info(container.as_raw_fd(), ptr) }.map_err(io)?;
        let out: Vec<u8> = buf.iter().flat_map(|w| w.to_ne_bytes()).collect();
        let reported = u32::from_ne_bytes([out[0], out[1], out[2], out[3]]) as usize;
        if reported <= bytes {
            return Ok(out);
        }
        argsz = reported;
    }
    Err(io::Error::other(
        "VFIO_IOMMU_GET_INFO kept growing its argsz",
    ))
}

/// `VFIO_IOMMU_MAP_DMA`: map `[vaddr, vaddr + size)` at `iova`, for the
/// device to read, and to write when `writable` (the kernel then pins the
/// pages for writing, which a read-only mapping of the process refuses).
///
/// # Safety
///
/// From now until the matching [`iommu_unmap_dma`] returned, the device may
/// read (and when `writable` write) `[vaddr, vaddr + size)` at any moment:
/// the caller keeps it mapped and holds no Rust reference into it.
pub(crate) unsafe fn iommu_map_dma(
    container: BorrowedFd<'_>,
    vaddr: usize,
    iova: u64,
    size: u64,
    writable: bool,
) -> io::Result<()> {
    let write = if writable {
        b::VFIO_DMA_MAP_FLAG_WRITE
    } else {
        0
    };
    let map = b::vfio_iommu_type1_dma_map {
        argsz: size_of::<b::vfio_iommu_type1_dma_map>() as u32,
        flags: b::VFIO_DMA_MAP_FLAG_READ | write,
        vaddr: vaddr as u64,
        iova,
        size,
    };
    // SAFETY: `map` is a valid vfio_iommu_type1_dma_map the kernel only reads;
    // the memory it names is the caller's responsibility (see # Safety).
    unsafe { vfio_iommu_map_dma(container.as_raw_fd(), &map) }
        .map(drop)
        .map_err(io)
}

/// `VFIO_IOMMU_UNMAP_DMA`: returns the bytes the kernel unmapped.
pub(crate) fn iommu_unmap_dma(container: BorrowedFd<'_>, iova: u64, size: u64) -> io::Result<u64> {
    let mut unmap = b::vfio_iommu_type1_dma_unmap {
        argsz: size_of::<b::vfio_iommu_type1_dma_unmap>() as u32,
        iova,
        size,
        ..Default::default()
    };
    // SAFETY: `unmap` is valid and writable (the kernel writes back `size`);
    // no dirty bitmap is requested, so nothing past it is touched.
    unsafe { vfio_iommu_unmap_dma(container.as_raw_fd(), &mut unmap) }.map_err(io)?;
    Ok(unmap.size)
}

/// `IOMMU_IOAS_ALLOC` on an iommufd: a new IO address space's id.
pub(crate) fn iommu_ioas_alloc(iommufd: BorrowedFd<'_>) -> io::Result<u32> {
    let mut a = IommuIoasAlloc {
        size: size_of::<IommuIoasAlloc>() as u32,
        flags: 0,
        out_ioas_id: 0,
    };
    // SAFETY: `a` is a valid, writable iommu_ioas_alloc whose size field is
    // its size; the kernel writes only out_ioas_id.
    unsafe { iommu_ioas_alloc_raw(iommufd.as_raw_fd(), &mut a) }.map_err(io)?;
    Ok(a.out_ioas_id)
}

/// `IOMMU_DESTROY` of object `id` (an IOAS).
pub(crate) fn iommu_destroy(iommufd: BorrowedFd<'_>, id: u32) -> io::Result<()> {
    let d = IommuDestroy {
        size: size_of::<IommuDestroy>() as u32,
        id,
    };
    // SAFETY: `d` is a valid iommu_destroy the kernel only reads.
    unsafe { iommu_destroy_raw(iommufd.as_raw_fd(), &d) }
        .map(drop)
        .map_err(io)
}

/// `IOMMU_IOAS_MAP_FILE`: map `[start, start + length)` of `file` (a memfd,
/// or since 6.19 a VFIO-exported dma-buf) at the fixed `iova`, read/write.
/// The kernel holds its own reference to the file while mapped.
pub(crate) fn iommu_ioas_map_file(
    iommufd: BorrowedFd<'_>,
    ioas: u32,
    file: BorrowedFd<'_>,
    start: u64,
    length: u64,
    iova: u64,
) -> io::Result<()> {
    let mut m = IommuIoasMapFile {
        size: size_of::<IommuIoasMapFile>() as u32,
        flags: MAP_FIXED_RW,
        ioas_id: ioas,
        fd: file.as_raw_fd(),
        start,
        length,
        iova,
    };
    // SAFETY: `m` is a valid iommu_ioas_map_file whose size field is its
    // size; the memory mapped is the file's, pinned by the kernel itself.
    unsafe { iommu_ioas_map_file_raw(iommufd.as_raw_fd(), &mut m) }
        .map(drop)
        .map_err(io)
}

/// `IOMMU_IOAS_UNMAP` of `[iova, iova + length)`: the bytes unmapped.
pub(crate) fn iommu_ioas_unmap(
    iommufd: BorrowedFd<'_>,
    ioas: u32,
    iova: u64,
    length: u64,
) -> io::Result<u64> {
    let mut u = IommuIoasUnmap {
        size: size_of::<IommuIoasUnmap>() as u32,
        ioas_id: ioas,
        iova,
        length,
    };
    // SAFETY: `u` is valid and writable; the kernel writes back `length`.
    unsafe { iommu_ioas_unmap_raw(iommufd.as_raw_fd(), &mut u) }.map_err(io)?;
    Ok(u.length)
}

/// `VFIO_DEVICE_BIND_IOMMUFD` on a device cdev: the device's id in the iommufd.
pub(crate) fn device_bind_iommufd(dev: BorrowedFd<'_>, iommufd: BorrowedFd<'_>) -> io::Result<u32> {
    let mut bind = b::vfio_device_bind_iommufd {
        argsz: size_of::<b::vfio_device_bind_iommufd>() as u32,
        iommufd: iommufd.as_raw_fd(),
        ..Default::default()
    };
    // SAFETY: `bind` is a valid, writable struct whose argsz is its size; no
    // token is passed (token_uuid_ptr 0).
    unsafe { vfio_device_bind_iommufd(dev.as_raw_fd(), &mut bind) }.map_err(io)?;
    Ok(bind.out_devid)
}

/// `VFIO_DEVICE_ATTACH_IOMMUFD_PT`: attach the bound device to IOAS `pt_id`.
pub(crate) fn device_attach_pt(dev: BorrowedFd<'_>, pt_id: u32) -> io::Result<()> {
    let mut at = b::vfio_device_attach_iommufd_pt {
        argsz: size_of::<b::vfio_device_attach_iommufd_pt>() as u32,
        pt_id,
        ..Default::default()
    };
    // SAFETY: `at` is a valid, writable struct whose argsz is its size.
    unsafe { vfio_device_attach_iommufd_pt(dev.as_raw_fd(), &mut at) }
        .map(drop)
        .map_err(io)
}

/// `VFIO_DEVICE_FEATURE(GET | DMA_BUF)`: export `[offset, offset + length)`
/// of region `index` (a BAR) as a dma-buf (one range).
pub(crate) fn device_export_dmabuf(
    dev: BorrowedFd<'_>,
    index: u32,
    offset: u64,
    length: u64,
) -> io::Result<OwnedFd> {
    // vfio_device_feature (8) + vfio_device_feature_dma_buf (16) + one
    // vfio_region_dma_range (16), in 8-byte words for alignment.
    let mut bytes = [0u8; 40];
    let fields: [(usize, &[u8]); 8] = [
        (0, &40u32.to_ne_bytes()), // argsz
        (
            4,
            &(b::VFIO_DEVICE_FEATURE_GET | b::VFIO_DEVICE_FEATURE_DMA_BUF).to_ne_bytes(),
        ),
        (8, &index.to_ne_bytes()), // region_index
        (12, &((libc::O_RDWR | libc::O_CLOEXEC) as u32).to_ne_bytes()), // open_flags
        (16, &0u32.to_ne_bytes()), // flags
        (20, &1u32.to_ne_bytes()), // nr_ranges
        (24, &offset.to_ne_bytes()),
        (32, &length.to_ne_bytes()),
    ];
    for (at, f) in fields {
        bytes[at..at + f.len()].copy_from_slice(f);
    }
    let mut w = [0u64; 5];
    for (word, chunk) in w.iter_mut().zip(bytes.chunks_exact(8)) {
        let mut b8 = [0u8; 8];
        b8.copy_from_slice(chunk);
        *word = u64::from_ne_bytes(b8);
    }
    // SAFETY: `w` is 40 writable, 8-aligned bytes laid out as the feature
    // header, its DMA_BUF payload and one range, with argsz 40.
    let fd =
        unsafe { vfio_device_feature_raw(dev.as_raw_fd(), w.as_mut_ptr().cast()) }.map_err(io)?;
    // SAFETY: on success the ioctl returned a new dma-buf fd nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `pread` of exactly `buf.len()` bytes at `offset` of a device fd.
pub(crate) fn region_read(dev: BorrowedFd<'_>, offset: u64, buf: &mut [u8]) -> io::Result<()> {
    let n = pread(dev, buf, offset as libc::off_t).map_err(io)?;
    if n != buf.len() {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("pread at {offset:#x}: {n} of {} bytes", buf.len()),
        ));
    }
    Ok(())
}

/// `pwrite` of exactly `buf.len()` bytes at `offset` of a device fd.
pub(crate) fn region_write(dev: BorrowedFd<'_>, offset: u64, buf: &[u8]) -> io::Result<()> {
    let n = pwrite(dev, buf, offset as libc::off_t).map_err(io)?;
    if n != buf.len() {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            format!("pwrite at {offset:#x}: {n} of {} bytes", buf.len()),
        ));
    }
    Ok(())
}

/// `mmap(len, PROT_READ | PROT_WRITE, MAP_SHARED, dev, offset)`: a BAR.
pub(crate) fn mmap_region(dev: BorrowedFd<'_>, offset: u64, len: usize) -> io::Result<NonNull<u8>> {
    let n = NonZeroUsize::new(len)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "mmap of 0 bytes"))?;
    // SAFETY: a fresh shared mapping chosen by the kernel (no address hint),
    // so no existing memory is replaced.
    let p = unsafe {
        mmap(
            None,
            n,
            ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
            MapFlags::MAP_SHARED,
            dev,
            offset as libc::off_t,
        )
    }
    .map_err(io)?;
    Ok(p.cast())
}

/// `munmap` of a mapping made by [`mmap_region`].
///
/// # Safety
///
/// `[ptr, ptr + len)` is exactly one mapping from [`mmap_region`] and nothing
/// uses it afterwards.
pub(crate) unsafe fn munmap_region(ptr: NonNull<u8>, len: usize) -> io::Result<()> {
    // SAFETY: the caller passes a whole mapping that is no longer used.
    unsafe { munmap(ptr.cast(), len) }.map_err(io)
}

/// A non-blocking, close-on-exec eventfd.
pub(crate) fn eventfd() -> io::Result<OwnedFd> {
    let efd = EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
        .map_err(io)?;
    Ok(efd.into())
}

/// Wait up to `timeout_ms` for the eventfd to fire; its counter (reset to 0),
/// or `None` on timeout.
pub(crate) fn eventfd_wait(fd: BorrowedFd<'_>, timeout_ms: u16) -> io::Result<Option<u64>> {
    let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
    let n = poll(&mut fds, PollTimeout::from(timeout_ms)).map_err(io)?;
    if n == 0 {
        return Ok(None);
    }
    let mut v = [0u8; 8];
    match nix::unistd::read(fd, &mut v) {
        Ok(8) => Ok(Some(u64::from_ne_bytes(v))),
        Ok(n) => Err(io::Error::other(format!("eventfd read returned {n} bytes"))),
        Err(Errno::EAGAIN) => Ok(None),
        Err(e) => Err(io(e)),
    }
}

/// The soft `RLIMIT_MEMLOCK` in bytes (`u64::MAX`: unlimited), for the
/// advice in [`crate::VfioError::Memlock`].
pub(crate) fn memlock_limit() -> io::Result<u64> {
    let (soft, _hard) =
        nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_MEMLOCK).map_err(io)?;
    Ok(soft)
}
