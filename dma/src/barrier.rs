//! Barriers named for what they order, after rdma-core's `util/udma_barrier.h`.
//!
//! The data path of a ring is: write the WQE (DMA memory) → write the
//! doorbell record (DMA memory) → ring the doorbell (MMIO) → optionally copy
//! the WQE into the BlueFlame buffer (write-combining MMIO) and flush it. On
//! the completion side: see the CQE owner bit flip (DMA memory) → read the
//! rest of the CQE. Each arrow that can be reordered has a function here.
//!
//! | function | x86_64 | aarch64 | others |
//! |---|---|---|---|
//! | [`dma_wmb_before_doorbell`] | compiler fence (x86 keeps stores in order, and WB stores before UC MMIO stores) | `dmb oshst` | `fence(SeqCst)` |
//! | [`dma_rmb_after_owner_bit`] | `lfence` | `dmb oshld` | `fence(SeqCst)` |
//! | [`wc_flush`] | `sfence` | `dsb st` | `fence(SeqCst)` |

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
use std::sync::atomic::fence;
#[cfg(target_arch = "x86_64")]
use std::sync::atomic::{Ordering, compiler_fence};

/// Make every store to DMA memory before this call visible to the device
/// before any store (in particular the MMIO doorbell write) after it.
///
/// Place it between writing a WQE or doorbell record and ringing the
/// doorbell, and between writing a descriptor's body and its valid/owner bit.
/// (rdma-core: `udma_to_device_barrier`.)
#[inline(always)]
pub fn dma_wmb_before_doorbell() {
    #[cfg(target_arch = "x86_64")]
    compiler_fence(Ordering::SeqCst);
    #[cfg(target_arch = "aarch64")]
    // SAFETY: `dmb oshst` only orders memory accesses; it reads and writes no
    // memory or registers (the asm has no operands), and the implicit memory
    // clobber keeps the compiler from moving accesses across it.
    unsafe {
        std::arch::asm!("dmb oshst", options(nostack, preserves_flags))
    };
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    fence(std::sync::atomic::Ordering::SeqCst);
}

/// After observing a device write (a CQE/EQE owner bit, a valid bit) make
/// every later load see the data the device wrote before it.
///
/// Place it between checking the owner bit and reading the rest of the
/// entry. (rdma-core: `udma_from_device_barrier`.)
#[inline(always)]
pub fn dma_rmb_after_owner_bit() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `lfence` needs SSE2, which every x86_64 CPU has (it is part of
    // the x86_64 baseline the target is compiled for); it touches no memory.
    unsafe {
        std::arch::x86_64::_mm_lfence()
    };
    #[cfg(target_arch = "aarch64")]
    // SAFETY: `dmb oshld` only orders memory accesses; no operands, and the
    // implicit memory clobber is a compiler barrier too.
    unsafe {
        std::arch::asm!("dmb oshld", options(nostack, preserves_flags))
    };
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    fence(std::sync::atomic::Ordering::SeqCst);
}

/// Flush write-combining buffers: stores to WC memory (BlueFlame) before this
/// call leave the CPU as their own PCIe writes before any later store.
///
/// Place it after copying a WQE into the BlueFlame buffer, and before a WC
/// copy that must not merge with an earlier MMIO write. (rdma-core:
/// `mmio_flush_writes` / `mmio_wc_start`.)
#[inline(always)]
pub fn wc_flush() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `sfence` needs SSE, part of the x86_64 baseline; it touches no
    // memory.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
    #[cfg(target_arch = "aarch64")]
    // SAFETY: `dsb st` waits for prior stores to complete; no operands, and
    // the implicit memory clobber is a compiler barrier too.
    unsafe {
        std::arch::asm!("dsb st", options(nostack, preserves_flags))
    };
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    fence(std::sync::atomic::Ordering::SeqCst);
}
