//! The copy-tier benchmark: host↔device bandwidth from three kinds of host
//! memory, at sizes from 4 KiB to 1 GiB, timed with CUDA events on one
//! stream — and CPU access to a BAR mapping, write-combined against
//! uncached, where the caller has one.
//!
//! | tier | host memory | what it shows |
//! |---|---|---|
//! | `pageable` | a plain `Vec<u8>` | the driver's own staging copy (what an application that never pins gets) |
//! | `pinned` | `cuMemHostAlloc(0)` (not write-combined: cudarc's `alloc_pinned` is, and CPU reads of it are slow) | the DMA engine's rate |
//! | `hugepage` | an rnic-dma `DmaRegion` (2 MiB pages, on the GPU's NUMA node) registered with `cuMemHostRegister` | what `StagedMemory` stages through |
//!
//! The reference figures for an H200 machine (reference/peers.md): pinned
//! H2D ≈ 55 GB/s, pageable ≈ 7.8, hugepage + `cuMemHostRegister` ≈ 54.9;
//! dmaplane's RTX 5000 Ada tiers (reference/gpu.md §1d) are printed beside
//! them by the `copy_tiers` example.

use std::ffi::c_void;
use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::sys::{self, CUevent_flags};
use rnic_dma::{DmaRegion, Mmio, PagePolicy, PageSize};

use crate::copy::CopyEngine;
use crate::cuda::Gpu;
use crate::error::GpuError;
use crate::staged::Registered;

/// The kind of host memory a copy uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tier {
    /// Ordinary (pageable) heap memory.
    Pageable,
    /// `cuMemHostAlloc` page-locked memory.
    Pinned,
    /// A hugepage `DmaRegion` registered with `cuMemHostRegister`.
    Hugepage,
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Tier::Pageable => "pageable",
            Tier::Pinned => "pinned",
            Tier::Hugepage => "hugepage+register",
        })
    }
}

/// Host to device, or back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Host → device.
    H2D,
    /// Device → host.
    D2H,
}

impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Direction::H2D => "H2D",
            Direction::D2H => "D2H",
        })
    }
}

/// One measurement.
#[derive(Clone, Debug, PartialEq)]
pub struct TierResult {
    /// Host memory kind.
    pub tier: Tier,
    /// Direction.
    pub dir: Direction,
    /// Bytes per copy.
    pub size: usize,
    /// Copies timed.
    pub iters: u32,
    /// GB/s (10^9 bytes per second).
    pub gbps: f64,
}

/// Sizes 4 KiB, 16 KiB, … up to `max` (powers of 4).
pub fn sizes_up_to(max: usize) -> Vec<usize> {
    std::iter::successors(Some(4096usize), |s| s.checked_mul(4))
        .take_while(|s| *s <= max)
        .collect()
}

/// How many copies of `size` to time: at least 3, about `budget` bytes in
/// all, at most 1000.
pub fn iterations(size: usize, budget: usize) -> u32 {
    (budget / size.max(1)).clamp(3, 1000) as u32
}

/// Run every tier in both directions at `sizes`, each timed over about
/// `budget` bytes; `each` sees every result as it is measured.
pub fn copy_tiers(
    gpu: &Arc<Gpu>,
    sizes: &[usize],
    budget: usize,
    mut each: impl FnMut(&TierResult),
) -> Result<Vec<TierResult>, GpuError> {
    let Some(&max) = sizes.iter().max() else {
        return Ok(Vec::new());
    };
    let engine = gpu.engine()?;
    let vram = gpu.alloc_vram(max)?;
    let mut pageable = vec![0x5au8; max];
    // SAFETY: page-locked host memory, written before use (flags 0: not
    // write-combined, so the CPU may also read it).
    let mut pinned = unsafe { gpu.context().alloc_pinned_with_flags::<u8>(max, 0) }
        .map_err(|e| GpuError::cuda(format!("cuMemHostAlloc({max})"), e))?;
    let mut b = DmaRegion::builder(max).pages(PagePolicy::Prefer(PageSize::Huge2M));
    if let Some(n) = gpu.info().numa_node {
        b = b.node(n);
    }
    let huge = Registered::new(&engine, b.build()?)?;
    let pinned_ptr = pinned
        .as_mut_ptr()
        .map_err(|e| GpuError::cuda("pinned buffer", e))?;
    let stream = engine.stream().clone();
    let ctx = gpu.context().clone();
    let start = ctx
        .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(|e| GpuError::cuda("cuEventCreate", e))?;
    let end = ctx
        .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(|e| GpuError::cuda("cuEventCreate", e))?;
    let mut out = Vec::new();
    for tier in [Tier::Pageable, Tier::Pinned, Tier::Hugepage] {
        let host: *mut u8 = match tier {
            Tier::Pageable => pageable.as_mut_ptr(),
            Tier::Pinned => pinned_ptr,
            Tier::Hugepage => huge.region().as_ptr(),
        };
        for dir in [Direction::H2D, Direction::D2H] {
            for &size in sizes {
                let iters = iterations(size, budget);
                let copy = || {
                    let r = match dir {
                        // SAFETY: `host` and `vram` hold at least `max` >=
                        // size bytes and outlive the stream synchronisation
                        // below; the CPU does not touch the host buffer while
                        // the copies run (this loop waits on `end` first).
                        Direction::H2D => unsafe {
                            sys::cuMemcpyHtoDAsync_v2(
                                vram.device_ptr(),
                                host.cast::<c_void>(),
                                size,
                                stream.cu_stream(),
                            )
                        },
                        // SAFETY: as for H2D.
                        Direction::D2H => unsafe {
                            sys::cuMemcpyDtoHAsync_v2(
                                host.cast::<c_void>(),
                                vram.device_ptr(),
                                size,
                                stream.cu_stream(),
                            )
                        },
                    };
                    r.result().map_err(|e| {
                        GpuError::cuda(format!("{dir} copy of {size} bytes ({tier})"), e)
                    })
                };
                copy()?; // warm-up
                start
                    .record(&stream)
                    .map_err(|e| GpuError::cuda("cuEventRecord", e))?;
                for _ in 0..iters {
                    copy()?;
                }
                end.record(&stream)
                    .map_err(|e| GpuError::cuda("cuEventRecord", e))?;
                let ms = start
                    .elapsed_ms(&end)
                    .map_err(|e| GpuError::cuda("cuEventElapsedTime", e))?;
                let r = TierResult {
                    tier,
                    dir,
                    size,
                    iters,
                    gbps: size as f64 * f64::from(iters) / (f64::from(ms) / 1e3) / 1e9,
                };
                each(&r);
                out.push(r);
            }
        }
    }
    engine.wait_all()?;
    drop((huge, vram, pinned));
    Ok(out)
}

/// CPU access to a BAR mapping: (write GB/s, read GB/s) of `len` bytes
/// with 8-byte volatile stores and loads, repeated `rounds` times. Run it on
/// a write-combined and an uncached mapping of the same BAR to compare.
pub fn cpu_bar_bandwidth(bar: &Mmio, len: usize, rounds: u32) -> Result<(f64, f64), GpuError> {
    let len = len.min(bar.len()) & !7;
    let buf = vec![0xa5u8; len];
    let t = Instant::now();
    for _ in 0..rounds {
        bar.write_bytes(0, &buf).map_err(GpuError::Staging)?;
    }
    // A read orders the posted writes before the clock stops.
    bar.read64(0).map_err(GpuError::Staging)?;
    let w = t.elapsed().as_secs_f64();
    let mut back = vec![0u8; len];
    let t = Instant::now();
    for _ in 0..rounds {
        bar.read_bytes(0, &mut back).map_err(GpuError::Staging)?;
    }
    let r = t.elapsed().as_secs_f64();
    let total = len as f64 * f64::from(rounds);
    Ok((total / w / 1e9, total / r / 1e9))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_iterations() {
        let s = sizes_up_to(1 << 30);
        assert_eq!(s.first(), Some(&4096));
        assert_eq!(s.last(), Some(&(1 << 30)));
        assert_eq!(s.len(), 10);
        assert_eq!(iterations(4096, 256 << 20), 1000);
        assert_eq!(iterations(1 << 30, 256 << 20), 3);
        assert_eq!(iterations(16 << 20, 256 << 20), 16);
        assert!(sizes_up_to(100).is_empty());
    }

    /// A heap buffer standing in for a BAR mapping.
    struct HeapBar(std::ptr::NonNull<u8>, std::alloc::Layout);
    // SAFETY: owns its allocation exclusively, like a Box.
    unsafe impl Send for HeapBar {}
    // SAFETY: exposes nothing; the Mmio reaches it through raw pointers.
    unsafe impl Sync for HeapBar {}
    impl Drop for HeapBar {
        fn drop(&mut self) {
            // SAFETY: allocated below with this layout, freed once.
            unsafe { std::alloc::dealloc(self.0.as_ptr(), self.1) };
        }
    }

    #[test]
    fn bar_bandwidth_writes_and_reads_the_whole_window() {
        let layout = std::alloc::Layout::from_size_align(65536, 4096).unwrap();
        // SAFETY: non-zero size.
        let p = std::ptr::NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) }).unwrap();
        let owner: Arc<dyn std::any::Any + Send + Sync> = Arc::new(HeapBar(p, layout));
        // SAFETY: 64 KiB valid, page-aligned, alive as long as `owner`; used
        // from this thread only.
        let bar = unsafe { Mmio::new(p, 65536, owner) };
        let (w, r) = cpu_bar_bandwidth(&bar, 1 << 20, 4).unwrap();
        assert!(w > 0.0 && r > 0.0, "{w} {r}");
        let mut got = [0u8; 16];
        bar.read_bytes(65536 - 16, &mut got).unwrap();
        assert_eq!(
            got, [0xa5; 16],
            "the whole window (clamped to its length) was written"
        );
    }
}
