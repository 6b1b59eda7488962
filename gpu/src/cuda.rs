//! The CUDA side: [`Gpu`] (the primary context of one ordinal, shared),
//! [`VramBuffer`] (GPUDirect-capable device memory), [`CudaEngine`] (the
//! [`CopyEngine`] over one stream, with events as fences) and
//! [`Gpu::staged_memory`] (VRAM as a registrable `Memory`).
//!
//! Every entry point calls [`crate::driver()`] first, so on a machine
//! without CUDA each returns [`GpuError::NoDriver`] and cudarc is never
//! asked to load anything.
//!
//! VRAM comes from `cuMemAlloc_v2`, not from cudarc's `alloc_zeros` (which
//! uses `cuMemAllocAsync` pools when the device has them): GPUDirect RDMA
//! and dma-buf export are documented for `cuMemAlloc` memory, and each
//! buffer's `CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE` is read back
//! and reported. `SYNC_MEMOPS` is set on every buffer, as NVIDIA's
//! GPUDirect RDMA guide asks for memory a third party touches.

use std::collections::{BTreeMap, VecDeque};
use std::ffi::{c_char, c_int, c_void};
use std::fmt;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use cudarc::driver::sys::{self, CUdevice_attribute, CUpointer_attribute};
use cudarc::driver::{CudaContext, CudaEvent, CudaStream, DriverError, result};
use rnic_core::MemAccess;
use rnic_core::PciAddr;
use rnic_core::memory::check_range;
use rnic_dma::{DmaRegion, NodeId};
use tracing::{debug, error, info_span};

use crate::copy::{CopyEngine, Fence, Registrations};
use crate::driver::driver;
use crate::error::GpuError;
use crate::staged::{StagedMemory, StagingConfig};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Critical sections leave their data consistent before anything can panic.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Facts about one GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuInfo {
    /// CUDA ordinal.
    pub ordinal: usize,
    /// Marketing name.
    pub name: String,
    /// PCI address (from `cuDeviceGetPCIBusId`).
    pub pci: Option<PciAddr>,
    /// Device memory in bytes.
    pub total_mem: u64,
    /// Compute capability (major, minor).
    pub compute: (i32, i32),
    /// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED`.
    pub gpudirect_rdma: bool,
    /// `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED` (and the driver has
    /// `cuMemGetHandleForAddressRange`).
    pub dma_buf: bool,
    /// The NUMA node the GPU hangs off (its PCI function's node).
    pub numa_node: Option<NodeId>,
}

/// The primary context of one GPU; shared per ordinal ([`Gpu::open`]).
pub struct Gpu {
    ctx: Arc<CudaContext>,
    info: GpuInfo,
}

impl fmt::Debug for Gpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gpu").field("info", &self.info).finish()
    }
}

/// Open GPUs by ordinal: one context per ordinal per process.
static OPEN: Mutex<BTreeMap<usize, Weak<Gpu>>> = Mutex::new(BTreeMap::new());

/// Number of CUDA devices ([`GpuError::NoDriver`] without a driver).
pub fn device_count() -> Result<usize, GpuError> {
    Ok(driver()?.devices)
}

fn attr(ctx: &CudaContext, a: CUdevice_attribute) -> Result<i32, GpuError> {
    ctx.attribute(a)
        .map_err(|e| GpuError::cuda(format!("cuDeviceGetAttribute({a:?})"), e))
}

fn pci_bus_id(dev: sys::CUdevice) -> Option<PciAddr> {
    let mut buf = [0 as c_char; 32];
    // SAFETY: the buffer is 32 bytes and the length says so; the driver
    // writes a NUL-terminated string into it.
    let r = unsafe { sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as c_int, dev) };
    if r != sys::cudaError_enum::CUDA_SUCCESS {
        return None;
    }
    let text: String = buf
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8 as char)
        .collect();
    normalize_bus_id(&text)
}

/// `00000000:17:00.0` (NVML's 8-digit domain) or `0000:17:00.0` → PciAddr.
pub fn normalize_bus_id(text: &str) -> Option<PciAddr> {
    let text = text.trim().to_ascii_lowercase();
    let (domain, rest) = text.split_once(':')?;
    let domain = &domain[domain.len().saturating_sub(4)..];
    format!("{domain}:{rest}").parse().ok()
}

impl Gpu {
    /// The GPU with CUDA ordinal `ordinal` (its primary context, retained);
    /// the same `Arc` while any holder keeps it.
    pub fn open(ordinal: usize) -> Result<Arc<Gpu>, GpuError> {
        let d = driver()?;
        let mut open = lock(&OPEN);
        if let Some(g) = open.get(&ordinal).and_then(Weak::upgrade) {
            return Ok(g);
        }
        if ordinal >= d.devices {
            return Err(GpuError::NoDevice {
                ordinal,
                count: d.devices,
            });
        }
        let _span = info_span!("gpu_open", ordinal).entered();
        let ctx = CudaContext::new(ordinal)
            .map_err(|e| GpuError::cuda(format!("CudaContext::new({ordinal})"), e))?;
        let pci = pci_bus_id(ctx.cu_device());
        let numa_node = pci.and_then(|p| crate::placement::node_of(&p));
        let dma_buf_attr = attr(
            &ctx,
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED,
        )?;
        let info = GpuInfo {
            ordinal,
            name: ctx
                .name()
                .map_err(|e| GpuError::cuda("cuDeviceGetName", e))?,
            pci,
            total_mem: ctx
                .total_mem()
                .map_err(|e| GpuError::cuda("cuDeviceTotalMem", e))? as u64,
            compute: ctx
                .compute_capability()
                .map_err(|e| GpuError::cuda("compute capability", e))?,
            gpudirect_rdma: attr(
                &ctx,
                CUdevice_attribute::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED,
            )? != 0,
            dma_buf: dma_buf_attr != 0 && d.has("cuMemGetHandleForAddressRange"),
            numa_node,
        };
        debug!(?info, "GPU opened");
        let g = Arc::new(Gpu { ctx, info });
        open.insert(ordinal, Arc::downgrade(&g));
        Ok(g)
    }

    /// What the GPU is.
    pub fn info(&self) -> &GpuInfo {
        &self.info
    }

    /// The cudarc context (for kernels and other CUDA work).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    fn bind(&self) -> Result<(), GpuError> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| GpuError::cuda("cuCtxSetCurrent", e))
    }

    /// `len` bytes of VRAM, GPUDirect-capable where the GPU supports it.
    pub fn alloc_vram(self: &Arc<Self>, len: usize) -> Result<VramBuffer, GpuError> {
        if len == 0 {
            return Err(GpuError::Unsupported {
                what: "a 0-byte VRAM buffer",
                why: "ask for at least one byte".into(),
            });
        }
        self.bind()?;
        // SAFETY: cuMemAlloc_v2 with the context current; the memory is
        // uninitialised device memory, which only copies ever read.
        let dptr = unsafe { result::malloc_sync(len) }
            .map_err(|e| GpuError::cuda(format!("cuMemAlloc({len})"), e))?;
        let mut buf = VramBuffer {
            dptr,
            len,
            gpu: self.clone(),
            gdr_capable: false,
        };
        let one: u32 = 1;
        // SAFETY: SYNC_MEMOPS takes a pointer to an unsigned int; `dptr` is
        // the start of a live allocation.
        unsafe {
            sys::cuPointerSetAttribute(
                (&one as *const u32).cast(),
                CUpointer_attribute::CU_POINTER_ATTRIBUTE_SYNC_MEMOPS,
                dptr,
            )
        }
        .result()
        .map_err(|e| GpuError::cuda("cuPointerSetAttribute(SYNC_MEMOPS)", e))?;
        let mut capable: c_int = 0;
        // SAFETY: IS_GPU_DIRECT_RDMA_CAPABLE writes one int through the
        // pointer; `dptr` is a live allocation.
        let r = unsafe {
            sys::cuPointerGetAttribute(
                (&mut capable as *mut c_int).cast::<c_void>(),
                CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE,
                dptr,
            )
        };
        buf.gdr_capable = r == sys::cudaError_enum::CUDA_SUCCESS && capable != 0;
        Ok(buf)
    }

    /// A copy engine on a new stream of this GPU.
    pub fn engine(self: &Arc<Self>) -> Result<Arc<CudaEngine>, GpuError> {
        let stream = self
            .ctx
            .new_stream()
            .map_err(|e| GpuError::cuda("cuStreamCreate", e))?;
        Ok(Arc::new(CudaEngine {
            gpu: self.clone(),
            stream,
            q: Mutex::new(Queue {
                next: 1,
                ..Queue::default()
            }),
            registered: Registrations::default(),
        }))
    }

    /// `len` bytes of VRAM as a registrable [`Memory`], staged through a
    /// hugepage ring on this GPU's NUMA node (unless `config.node` says
    /// otherwise) registered with `cuMemHostRegister`.
    pub fn staged_memory(
        self: &Arc<Self>,
        len: usize,
        mut config: StagingConfig,
    ) -> Result<StagedMemory<CudaEngine>, GpuError> {
        if config.node.is_none() {
            config.node = self.info.numa_node;
        }
        let engine = self.engine()?;
        StagedMemory::new(&engine, len, config)
    }
}

/// Device memory from `cuMemAlloc_v2`; freed on drop.
pub struct VramBuffer {
    dptr: sys::CUdeviceptr,
    len: usize,
    gpu: Arc<Gpu>,
    gdr_capable: bool,
}

impl fmt::Debug for VramBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VramBuffer")
            .field("dptr", &format_args!("{:#x}", self.dptr))
            .field("len", &self.len)
            .field("gpu", &self.gpu.info.ordinal)
            .field("gdr_capable", &self.gdr_capable)
            .finish()
    }
}

impl VramBuffer {
    /// The device address of byte 0.
    pub fn device_ptr(&self) -> u64 {
        self.dptr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never: buffers have at least one byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the driver reports the buffer usable for GPUDirect RDMA.
    pub fn gpudirect_capable(&self) -> bool {
        self.gdr_capable
    }

    /// The GPU it lives on.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// Export the buffer as a dma-buf fd (`cuMemGetHandleForAddressRange`),
    /// for kernel importers (`ibv_reg_dmabuf_mr` on a kernel verbs stack).
    /// `pcie` asks for the BAR1 (PCIe) mapping type (CUDA 12.8+; needed on
    /// C2C systems). Needs the open kernel modules; see docs/gpu.md for why
    /// iommufd cannot import it today.
    pub fn export_dmabuf(&self, pcie: bool) -> Result<OwnedFd, GpuError> {
        if !self.gpu.info.dma_buf {
            return Err(GpuError::Unsupported {
                what: "dma-buf export of VRAM",
                why: format!(
                    "GPU {} reports CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 0 or the driver lacks \
                     cuMemGetHandleForAddressRange: use the open NVIDIA kernel modules (R515+) \
                     and CUDA 11.7+",
                    self.gpu.info.ordinal
                ),
            });
        }
        self.gpu.bind()?;
        let mut fd: c_int = -1;
        let flags = if pcie {
            sys::CUmemRangeFlags_enum::CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE as u64
        } else {
            0
        };
        // SAFETY: the driver writes one int (the fd) through the pointer; the
        // range is this live allocation, whole.
        unsafe {
            sys::cuMemGetHandleForAddressRange(
                (&mut fd as *mut c_int).cast::<c_void>(),
                self.dptr,
                self.len,
                sys::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                flags,
            )
        }
        .result()
        .map_err(|e| GpuError::cuda("cuMemGetHandleForAddressRange(DMA_BUF_FD)", e))?;
        if fd < 0 {
            return Err(GpuError::Unsupported {
                what: "dma-buf export of VRAM",
                why: "the driver returned no fd".into(),
            });
        }
        // SAFETY: a fresh fd the driver created for us; nothing else owns it.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }
}

impl Drop for VramBuffer {
    fn drop(&mut self) {
        if let Err(e) = self.gpu.bind() {
            error!(%e, "cannot make the context current to free VRAM: leaking it");
            return;
        }
        // SAFETY: `dptr` came from cuMemAlloc_v2 and is freed once; the
        // engine that copies into it waited for its queue before dropping it
        // (StagedMemory's DeviceBuffer).
        if let Err(e) = unsafe { result::memory_free(self.dptr) } {
            error!(e = ?e.0, "cuMemFree failed");
        }
    }
}

#[derive(Default)]
struct Queue {
    next: u64,
    /// Copies queued and not yet waited for: (fence, event, host buffer kept
    /// alive until the copy is known done).
    inflight: VecDeque<(u64, CudaEvent, Arc<DmaRegion>)>,
    spare: Vec<CudaEvent>,
}

/// [`CopyEngine`] over one CUDA stream of a [`Gpu`]; a fence is an event
/// recorded after the copy.
pub struct CudaEngine {
    gpu: Arc<Gpu>,
    stream: Arc<CudaStream>,
    q: Mutex<Queue>,
    registered: Registrations,
}

impl fmt::Debug for CudaEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaEngine")
            .field("gpu", &self.gpu.info.ordinal)
            .finish()
    }
}

impl CudaEngine {
    /// The GPU.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// The stream copies are queued on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    fn check_registered(&self, region: &DmaRegion, off: usize, len: usize) -> Result<(), GpuError> {
        self.registered.check(
            || format!("GPU {}", self.gpu.info.ordinal),
            region,
            off,
            len,
        )
    }

    /// Record a fence after the last queued copy, keeping `keep` alive.
    fn fence(&self, keep: &Arc<DmaRegion>) -> Result<Fence, GpuError> {
        let mut q = lock(&self.q);
        let ev = match q.spare.pop() {
            Some(e) => e,
            None => self
                .gpu
                .ctx
                .new_event(None)
                .map_err(|e| GpuError::cuda("cuEventCreate", e))?,
        };
        ev.record(&self.stream)
            .map_err(|e| GpuError::cuda("cuEventRecord", e))?;
        let seq = q.next;
        q.next += 1;
        q.inflight.push_back((seq, ev, keep.clone()));
        Ok(Fence(seq))
    }

    fn copy_err(op: &str, len: usize, e: DriverError) -> GpuError {
        GpuError::cuda(format!("{op}({len} bytes)"), e)
    }
}

// SAFETY: a fence's event is recorded on the engine's one stream after its
// copy, and CUDA streams run in order, so `wait` (cuEventSynchronize on the
// fence's event and every earlier one) returns after the copy and all before
// it finished. Queued copies hold an `Arc` of their host buffer until that
// wait. `free` runs after StagedMemory's wait_all; `unregister_host` waits
// for the whole queue before cuMemHostUnregister.
unsafe impl CopyEngine for CudaEngine {
    type Alloc = VramBuffer;

    fn describe(&self) -> String {
        format!(
            "GPU {} ({}, {})",
            self.gpu.info.ordinal,
            self.gpu.info.name,
            self.gpu
                .info
                .pci
                .map_or_else(|| "no PCI address".into(), |p| p.to_string())
        )
    }

    fn alloc(&self, len: usize) -> Result<VramBuffer, GpuError> {
        self.gpu.alloc_vram(len)
    }

    fn device_addr(&self, a: &VramBuffer) -> u64 {
        a.dptr
    }

    fn free(&self, a: VramBuffer) -> Result<(), GpuError> {
        self.wait_all()?;
        drop(a);
        Ok(())
    }

    fn register_host(&self, region: &DmaRegion) -> Result<(), GpuError> {
        self.gpu.bind()?;
        // SAFETY: the region's pages stay mapped while it is registered: the
        // Registered owner holds an Arc of it and unregisters before
        // dropping that Arc.
        unsafe {
            sys::cuMemHostRegister_v2(
                region.as_ptr().cast::<c_void>(),
                region.stats().mapped_bytes,
                sys::CU_MEMHOSTREGISTER_PORTABLE,
            )
        }
        .result()
        .map_err(|e| {
            GpuError::cuda(
                format!(
                    "cuMemHostRegister({} bytes, PORTABLE)",
                    region.stats().mapped_bytes
                ),
                e,
            )
        })?;
        self.registered.add(region);
        Ok(())
    }

    fn unregister_host(&self, region: &DmaRegion) -> Result<(), GpuError> {
        self.wait_all()?;
        self.gpu.bind()?;
        // SAFETY: registered by register_host; no copy is queued any more.
        unsafe { sys::cuMemHostUnregister(region.as_ptr().cast::<c_void>()) }
            .result()
            .map_err(|e| GpuError::cuda("cuMemHostUnregister", e))?;
        self.registered.remove(region);
        Ok(())
    }

    unsafe fn to_device(
        &self,
        dst: &VramBuffer,
        dst_off: usize,
        src: &Arc<DmaRegion>,
        src_off: usize,
        len: usize,
    ) -> Result<Fence, GpuError> {
        self.check_registered(src, src_off, len)?;
        check_range(MemAccess::Write, dst_off, len, dst.len)?;
        self.gpu.bind()?;
        // SAFETY: both ranges were checked; the caller keeps the source bytes
        // unwritten until the fence, and the fence holds the region alive.
        unsafe {
            sys::cuMemcpyHtoDAsync_v2(
                dst.dptr + dst_off as u64,
                src.as_ptr().wrapping_add(src_off).cast::<c_void>(),
                len,
                self.stream.cu_stream(),
            )
        }
        .result()
        .map_err(|e| Self::copy_err("cuMemcpyHtoDAsync", len, e))?;
        self.fence(src)
    }

    unsafe fn to_host(
        &self,
        dst: &Arc<DmaRegion>,
        dst_off: usize,
        src: &VramBuffer,
        src_off: usize,
        len: usize,
    ) -> Result<Fence, GpuError> {
        self.check_registered(dst, dst_off, len)?;
        check_range(MemAccess::Read, src_off, len, src.len)?;
        self.gpu.bind()?;
        // SAFETY: both ranges were checked; the caller leaves the destination
        // bytes alone until the fence, and the fence holds the region alive.
        unsafe {
            sys::cuMemcpyDtoHAsync_v2(
                dst.as_ptr().wrapping_add(dst_off).cast::<c_void>(),
                src.dptr + src_off as u64,
                len,
                self.stream.cu_stream(),
            )
        }
        .result()
        .map_err(|e| Self::copy_err("cuMemcpyDtoHAsync", len, e))?;
        self.fence(dst)
    }

    fn wait(&self, f: Fence) -> Result<(), GpuError> {
        loop {
            let mut q = lock(&self.q);
            match q.inflight.front() {
                Some((seq, _, _)) if *seq <= f.0 => {}
                _ => return Ok(()),
            }
            let Some((_, ev, region)) = q.inflight.pop_front() else {
                return Ok(());
            };
            drop(q);
            if let Err(e) = ev.synchronize() {
                // Keep the host buffer alive: the copy's state is unknown.
                std::mem::forget(region);
                return Err(GpuError::cuda("cuEventSynchronize", e));
            }
            drop(region);
            lock(&self.q).spare.push(ev);
        }
    }

    fn wait_all(&self) -> Result<(), GpuError> {
        let last = lock(&self.q).next.saturating_sub(1);
        self.wait(Fence(last))
    }
}

impl VramBuffer {
    /// Copy `dst.len()` bytes at `offset` out of VRAM, synchronously (for
    /// checks and small reads; transports use [`StagedMemory`]).
    pub fn read_sync(&self, offset: usize, dst: &mut [u8]) -> Result<(), GpuError> {
        check_range(MemAccess::Read, offset, dst.len(), self.len)?;
        if dst.is_empty() {
            return Ok(());
        }
        self.gpu.bind()?;
        // SAFETY: the range was checked; cuMemcpyDtoH is synchronous and
        // writes exactly dst.len() bytes into the caller's buffer.
        unsafe { result::memcpy_dtoh_sync(dst, self.dptr + offset as u64) }
            .map_err(|e| GpuError::cuda(format!("cuMemcpyDtoH({} bytes)", dst.len()), e))
    }

    /// Copy `src` into VRAM at `offset`, synchronously (a device-side write
    /// as a kernel would make it, bypassing any staging).
    pub fn write_sync(&self, offset: usize, src: &[u8]) -> Result<(), GpuError> {
        check_range(MemAccess::Write, offset, src.len(), self.len)?;
        if src.is_empty() {
            return Ok(());
        }
        self.gpu.bind()?;
        // SAFETY: the range was checked; cuMemcpyHtoD is synchronous and
        // reads exactly src.len() bytes of the caller's buffer.
        unsafe { result::memcpy_htod_sync(self.dptr + offset as u64, src) }
            .map_err(|e| GpuError::cuda(format!("cuMemcpyHtoD({} bytes)", src.len()), e))
    }
}
