//! BAR0 of the emulated function: a sealed memfd mapped `MAP_SHARED` here
//! and in the driver (the whole BAR is one sparse-mmap area), the layout
//! constants of the initialization segment, and its power-on contents.
//!
//! The bytes are shared with another process that writes them at any time,
//! so the emulator never forms `&[u8]` into them: every access is an aligned
//! atomic ([`AtomicU32`]/[`AtomicU64`] over the shared page, which the CPU
//! keeps coherent across processes) or, for message-based byte access,
//! [`AtomicU8`]. Accesses outside the BAR read as all-ones and writes are
//! dropped, as a PCI master abort would; nothing here panics.

use std::ffi::CString;
use std::fmt;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};

use crate::error::EmuError;
use crate::sys;

/// BAR0 size: 32 MiB, as ConnectX-4/5 functions report (mlx5.md is silent;
/// see docs/mlx5-emu.md).
pub const BAR0_SIZE: u64 = 32 << 20;
/// Bytes of one UAR page.
pub const UAR_PAGE: u64 = 4096;
/// Pages 0..=2 hold the initialization segment (its last fields, the
/// ieee1588 clock and `clr_intx`, sit at 0x2000..0x2010): not UAR pages.
pub const INIT_SEGMENT_PAGES: u32 = 3;
/// MSI-X vectors (table size).
pub const MSIX_VECTORS: u32 = 64;
/// The MSI-X table: the second-to-last page of BAR0 (our choice; mlx5.md is
/// silent, and the init segment owns 0x2000).
pub const MSIX_TABLE_OFFSET: u64 = BAR0_SIZE - 2 * UAR_PAGE;
/// The MSI-X pending-bit array: the last page of BAR0.
pub const MSIX_PBA_OFFSET: u64 = BAR0_SIZE - UAR_PAGE;
/// The first page that is not a UAR page (MSI-X table and PBA from here).
pub const FIRST_NON_UAR_PAGE: u32 = (MSIX_TABLE_OFFSET / UAR_PAGE) as u32;

/// Initialization-segment offsets (mlx5.md §2; big-endian dwords).
pub mod iseg {
    /// `fw_rev`: bits 31:16 minor, bits 15:0 major.
    pub const FW_REV: u64 = 0x000;
    /// `cmdif_rev_fw_sub`: bits 31:16 command-interface revision, bits 15:0 sub-minor.
    pub const CMDIF_REV_FW_SUB: u64 = 0x004;
    /// `cmdq_addr_h`: command queue address bits 63:32.
    pub const CMDQ_ADDR_H: u64 = 0x010;
    /// `cmdq_addr_l_sz`: write address bits 31:12; read bits 7:4 log size, bits 3:0 log stride; bits 10:8 NIC state.
    pub const CMDQ_ADDR_L_SZ: u64 = 0x014;
    /// `cmd_dbell`: write `1 << slot`.
    pub const CMD_DBELL: u64 = 0x018;
    /// `initializing`: bit31 = firmware still initializing.
    pub const INITIALIZING: u64 = 0x1fc;
    /// Start of the 64-byte health buffer.
    pub const HEALTH: u64 = 0x200;
    /// Health buffer `fw_ver` (0xffffffff would mean "PCI is dead").
    pub const HEALTH_FW_VER: u64 = 0x230;
    /// Health buffer byte `synd` (nonzero = fatal).
    pub const HEALTH_SYND: u64 = 0x23d;
    /// `cmd_exec_to` (0: the driver uses its default).
    pub const CMD_EXEC_TO: u64 = 0xff8;
    /// `cmd_q_init_to` (0: the driver uses its default).
    pub const CMD_Q_INIT_TO: u64 = 0xffc;
    /// `internal_timer_h`/`_l`: a free-running 64-bit timer (big-endian, high first).
    pub const INTERNAL_TIMER: u64 = 0x1000;
    /// `health_counter`: bits 23:0 tick periodically.
    pub const HEALTH_COUNTER: u64 = 0x1010;
    /// `initializing` bit.
    pub const INITIALIZING_BIT: u32 = 1 << 31;
    /// Required command-interface revision.
    pub const CMDIF_REV: u32 = 5;
    /// log2 of the command-queue entries the emulator offers (32).
    pub const LOG_CMDQ_SIZE: u32 = 5;
    /// log2 of the entry stride (64 bytes).
    pub const LOG_CMDQ_STRIDE: u32 = 6;
    /// `cmdq_addr_l_sz` bits 10:8: the NIC interface state (mlx5.md §2).
    pub const NIC_STATE_MASK: u32 = 0x7 << 8;

    /// `cmdq_addr_l_sz` value `v` with NIC interface state `state` in bits 10:8.
    pub const fn with_nic_state(v: u32, state: u8) -> u32 {
        (v & !NIC_STATE_MASK) | ((state as u32 & 0x7) << 8)
    }
}

/// BAR0; see the module docs.
pub struct Bar {
    ptr: NonNull<u8>,
    len: u64,
    fd: OwnedFd,
}

impl fmt::Debug for Bar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Bar")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("fd", &self.fd.as_raw_fd())
            .finish()
    }
}

// SAFETY: Bar owns its mapping; it is not tied to a thread, and every access
// through `&Bar` is atomic.
unsafe impl Send for Bar {}
// SAFETY: as above: shared access is atomic loads/stores/RMWs only.
unsafe impl Sync for Bar {}

impl Drop for Bar {
    fn drop(&mut self) {
        // SAFETY: exactly the mapping made in `new`; `&self` accessors are
        // gone (we are being dropped).
        if let Err(e) = unsafe { sys::unmap(self.ptr, self.len as usize) } {
            tracing::error!(%e, "munmap of BAR0 failed");
        }
    }
}

impl Bar {
    /// A zeroed, size-sealed memfd of `len` bytes, mapped here.
    pub fn new(len: u64) -> Result<Bar, EmuError> {
        let err = |step, source| EmuError::Bar { step, source };
        let name =
            CString::new("rnic-mlx5-emu-bar0").map_err(|_| err("name", nix::Error::EINVAL))?;
        let fd = sys::memfd(&name).map_err(|e| err("memfd_create", e))?;
        sys::truncate(fd.as_fd(), len).map_err(|e| err("ftruncate", e))?;
        sys::seal_size(fd.as_fd()).map_err(|e| err("fcntl(F_ADD_SEALS)", e))?;
        let size = usize::try_from(len).map_err(|_| err("size", nix::Error::EOVERFLOW))?;
        let ptr = sys::mmap_shared(fd.as_fd(), 0, size, true, true).map_err(|e| err("mmap", e))?;
        Ok(Bar { ptr, len, fd })
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Always false.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The memfd (what the server passes to the driver).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    pub(crate) fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// The aligned, in-bounds `T`-sized slot at `offset`.
    fn slot(&self, offset: u64, width: u64) -> Option<*mut u8> {
        let end = offset.checked_add(width)?;
        (end <= self.len && offset.is_multiple_of(width))
            .then(|| self.ptr.as_ptr().wrapping_add(offset as usize))
    }

    fn u32_at(&self, offset: u64) -> Option<&AtomicU32> {
        let p = self.slot(offset, 4)?;
        // SAFETY: in bounds and 4-aligned (the mapping is page-aligned),
        // valid while `self` lives, which bounds the reference; the only
        // references into the BAR are atomics, which assume nothing about
        // values the driver changes.
        Some(unsafe { AtomicU32::from_ptr(p.cast()) })
    }

    fn u64_at(&self, offset: u64) -> Option<&AtomicU64> {
        let p = self.slot(offset, 8)?;
        // SAFETY: as in `u32_at`, 8-aligned.
        Some(unsafe { AtomicU64::from_ptr(p.cast()) })
    }

    fn u8_at(&self, offset: u64) -> Option<&AtomicU8> {
        let p = self.slot(offset, 1)?;
        // SAFETY: as in `u32_at`.
        Some(unsafe { AtomicU8::from_ptr(p) })
    }

    /// The big-endian dword at `offset` (all-ones outside or misaligned).
    pub fn read32_be(&self, offset: u64) -> u32 {
        self.u32_at(offset)
            .map_or(u32::MAX, |w| u32::from_be(w.load(Ordering::Acquire)))
    }

    /// Store a big-endian dword (dropped outside or misaligned).
    pub fn write32_be(&self, offset: u64, value: u32) {
        if let Some(w) = self.u32_at(offset) {
            w.store(value.to_be(), Ordering::Release);
        }
    }

    /// The big-endian qword at `offset` (high dword first).
    pub fn read64_be(&self, offset: u64) -> u64 {
        self.u64_at(offset)
            .map_or(u64::MAX, |w| u64::from_be(w.load(Ordering::Acquire)))
    }

    /// Store a big-endian qword.
    pub fn write64_be(&self, offset: u64, value: u64) {
        if let Some(w) = self.u64_at(offset) {
            w.store(value.to_be(), Ordering::Release);
        }
    }

    /// Atomically replace the big-endian dword with `value`; the old value
    /// (0 outside the BAR).
    pub fn swap32_be(&self, offset: u64, value: u32) -> u32 {
        self.u32_at(offset)
            .map_or(0, |w| u32::from_be(w.swap(value.to_be(), Ordering::AcqRel)))
    }

    /// Atomically replace the big-endian qword with `value`; the old value (0 outside the
    /// BAR).
    pub fn swap64_be(&self, offset: u64, value: u64) -> u64 {
        self.u64_at(offset)
            .map_or(0, |w| u64::from_be(w.swap(value.to_be(), Ordering::AcqRel)))
    }

    /// Replace the big-endian dword with `new` if it is `current`.
    pub fn cas32_be(&self, offset: u64, current: u32, new: u32) -> bool {
        self.u32_at(offset).is_some_and(|w| {
            w.compare_exchange(
                current.to_be(),
                new.to_be(),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
        })
    }

    /// Replace the big-endian qword with `new` if it is `current`.
    pub fn cas64_be(&self, offset: u64, current: u64, new: u64) -> bool {
        self.u64_at(offset).is_some_and(|w| {
            w.compare_exchange(
                current.to_be(),
                new.to_be(),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
        })
    }

    /// Copy bytes out (REGION_READ); bytes outside the BAR read 0xff.
    pub fn read_bytes(&self, offset: u64, dst: &mut [u8]) {
        for (i, b) in dst.iter_mut().enumerate() {
            *b = offset
                .checked_add(i as u64)
                .and_then(|o| self.u8_at(o))
                .map_or(0xff, |a| a.load(Ordering::Acquire));
        }
    }

    /// Copy bytes in (REGION_WRITE); bytes outside the BAR are dropped.
    pub fn write_bytes(&self, offset: u64, src: &[u8]) {
        for (i, b) in src.iter().enumerate() {
            if let Some(a) = offset.checked_add(i as u64).and_then(|o| self.u8_at(o)) {
                a.store(*b, Ordering::Release);
            }
        }
    }

    /// Zero the whole BAR (hole punch: the size and every mapping stay).
    pub fn zero(&self) -> Result<(), EmuError> {
        sys::punch_hole(self.fd.as_fd(), 0, self.len).map_err(|source| EmuError::Bar {
            step: "fallocate(PUNCH_HOLE)",
            source,
        })
    }
}

/// The firmware revision the init segment reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FwRev {
    /// Major (16 = the ConnectX-5 firmware family).
    pub major: u16,
    /// Minor.
    pub minor: u16,
    /// Sub-minor.
    pub subminor: u16,
}

impl Default for FwRev {
    /// 16.35.2000, a ConnectX-5 firmware line.
    fn default() -> FwRev {
        FwRev {
            major: 16,
            minor: 35,
            subminor: 2000,
        }
    }
}

/// The low byte of `cmdq_addr_l_sz` as read: log size and log stride.
pub const CMDQ_SIZES: u32 = (iseg::LOG_CMDQ_SIZE << 4) | iseg::LOG_CMDQ_STRIDE;

/// Write the power-on initialization segment into a zeroed BAR: revisions,
/// command-queue geometry, `initializing` set, health buffer `fw_ver`.
pub fn write_power_on(bar: &Bar, fw: FwRev) {
    bar.write32_be(
        iseg::FW_REV,
        (u32::from(fw.minor) << 16) | u32::from(fw.major),
    );
    bar.write32_be(
        iseg::CMDIF_REV_FW_SUB,
        (iseg::CMDIF_REV << 16) | u32::from(fw.subminor),
    );
    bar.write32_be(iseg::CMDQ_ADDR_H, 0);
    bar.write32_be(iseg::CMDQ_ADDR_L_SZ, CMDQ_SIZES);
    bar.write32_be(iseg::CMD_DBELL, 0);
    bar.write32_be(iseg::INITIALIZING, iseg::INITIALIZING_BIT);
    bar.write32_be(
        iseg::HEALTH_FW_VER,
        (u32::from(fw.minor) << 16) | u32::from(fw.major),
    );
    bar.write32_be(iseg::HEALTH_COUNTER, 0);
    bar.write64_be(iseg::INTERNAL_TIMER, 0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accesses_are_big_endian_bounded_and_never_panic() {
        let bar = Bar::new(8192).unwrap();
        bar.write32_be(0x10, 0x0102_0304);
        let mut b = [0u8; 4];
        bar.read_bytes(0x10, &mut b);
        assert_eq!(b, [1, 2, 3, 4]);
        bar.write64_be(0x20, 0x1122_3344_5566_7788);
        assert_eq!(bar.read32_be(0x20), 0x1122_3344, "high dword first");
        assert_eq!(bar.read32_be(8192), u32::MAX, "outside reads all-ones");
        assert_eq!(bar.read32_be(2), u32::MAX, "misaligned reads all-ones");
        bar.write32_be(8190, 7); // dropped
        let mut tail = [0u8; 4];
        bar.read_bytes(8190, &mut tail);
        assert_eq!(tail, [0, 0, 0xff, 0xff]);
        assert_eq!(bar.swap32_be(0x10, 0), 0x0102_0304);
        assert_eq!(bar.read32_be(0x10), 0);
        assert!(bar.cas32_be(0x10, 0, 5));
        assert!(!bar.cas32_be(0x10, 0, 6));
        bar.zero().unwrap();
        assert_eq!(bar.read32_be(0x10), 0);
        assert_eq!(bar.read64_be(0x20), 0);
    }

    #[test]
    fn power_on_segment_matches_the_prm_offsets() {
        let bar = Bar::new(BAR0_SIZE).unwrap();
        write_power_on(&bar, FwRev::default());
        assert_eq!(bar.read32_be(0x000), (35 << 16) | 16);
        assert_eq!(bar.read32_be(0x004) >> 16, 5);
        assert_eq!(bar.read32_be(0x004) & 0xffff, 2000);
        assert_eq!(bar.read32_be(0x014) & 0xff, 0x56, "32 entries of 64 bytes");
        assert_ne!(bar.read32_be(0x1fc) & (1 << 31), 0);
        assert!(MSIX_TABLE_OFFSET >= u64::from(INIT_SEGMENT_PAGES) * UAR_PAGE);
        assert!(u64::from(MSIX_VECTORS) * 16 <= UAR_PAGE);
    }
}
