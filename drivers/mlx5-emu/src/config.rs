//! PCI config space of the emulated function (256 bytes, type-0 header):
//! IDs, class, command register, BAR0 as a 64-bit memory BAR — prefetchable
//! or not as [`Bar0Mapping`] says — with working size probing, and a capability list holding MSI-X whose
//! table and PBA lie in BAR0. Writes go through a per-byte write mask, so
//! read-only fields stay read-only whatever the driver writes.

use crate::bar::{BAR0_SIZE, MSIX_PBA_OFFSET, MSIX_TABLE_OFFSET, MSIX_VECTORS};
use crate::device::Bar0Mapping;

/// Size of the config region.
pub const CONFIG_SIZE: usize = 256;
/// Mellanox Technologies.
pub const VENDOR_ID: u16 = 0x15b3;
/// ConnectX-5 (PCIe 3.0) physical function (mlx5.md §1).
pub const DEVICE_ID: u16 = 0x1017;
/// Subsystem ID reported (our choice; real boards carry a board-specific one).
pub const SUBSYSTEM_ID: u16 = 0x0008;
/// Class code: network controller, Ethernet (0x02 / 0x00 / prog-if 0).
pub const CLASS_CODE: u32 = 0x02_0000;
/// Offset of the MSI-X capability.
pub const MSIX_CAP: usize = 0x40;

/// Standard header offsets.
pub mod reg {
    /// Vendor ID.
    pub const VENDOR_ID: usize = 0x00;
    /// Device ID.
    pub const DEVICE_ID: usize = 0x02;
    /// Command.
    pub const COMMAND: usize = 0x04;
    /// Status.
    pub const STATUS: usize = 0x06;
    /// Revision ID.
    pub const REVISION: usize = 0x08;
    /// Class code (3 bytes from 0x09).
    pub const CLASS: usize = 0x09;
    /// Header type.
    pub const HEADER_TYPE: usize = 0x0e;
    /// BAR0 (low dword of the 64-bit BAR).
    pub const BAR0: usize = 0x10;
    /// BAR1 (high dword of BAR0).
    pub const BAR1: usize = 0x14;
    /// Subsystem vendor ID.
    pub const SUBSYSTEM_VENDOR: usize = 0x2c;
    /// Subsystem ID.
    pub const SUBSYSTEM_ID: usize = 0x2e;
    /// Capabilities pointer.
    pub const CAP_PTR: usize = 0x34;
    /// Interrupt pin.
    pub const INTERRUPT_PIN: usize = 0x3d;
}

/// Command register: memory space enable.
pub const COMMAND_MEMORY: u16 = 1 << 1;
/// Command register: bus master enable.
pub const COMMAND_MASTER: u16 = 1 << 2;
/// Status register: capabilities list present.
pub const STATUS_CAP_LIST: u16 = 1 << 4;
/// BAR flags of a write-combining BAR0: memory, 64-bit (type 0b10), prefetchable.
pub const BAR0_FLAGS_WC: u32 = 0b1100;
/// BAR flags of an uncached BAR0: memory, 64-bit (type 0b10), not prefetchable.
pub const BAR0_FLAGS_UC: u32 = 0b0100;
/// The prefetchable bit of a memory BAR.
pub const BAR_PREFETCHABLE: u32 = 0b1000;
/// MSI-X capability ID.
pub const CAP_ID_MSIX: u8 = 0x11;
/// MSI-X message control: enable.
pub const MSIX_ENABLE: u16 = 1 << 15;
/// MSI-X message control: function mask.
pub const MSIX_FUNCTION_MASK: u16 = 1 << 14;

/// The config bytes and which bits the driver may change.
#[derive(Clone, Debug)]
pub struct ConfigSpace {
    bytes: [u8; CONFIG_SIZE],
    wmask: [u8; CONFIG_SIZE],
}

impl Default for ConfigSpace {
    fn default() -> ConfigSpace {
        ConfigSpace::power_on(Bar0Mapping::Uc)
    }
}

impl ConfigSpace {
    /// The power-on contents, BAR0 advertised for `bar0` (prefetchable when write-combining).
    pub fn power_on(bar0: Bar0Mapping) -> ConfigSpace {
        let mut c = ConfigSpace {
            bytes: [0; CONFIG_SIZE],
            wmask: [0; CONFIG_SIZE],
        };
        c.put16(reg::VENDOR_ID, VENDOR_ID);
        c.put16(reg::DEVICE_ID, DEVICE_ID);
        c.put16(reg::STATUS, STATUS_CAP_LIST);
        c.bytes[reg::REVISION] = 0;
        c.bytes[reg::CLASS..reg::CLASS + 3].copy_from_slice(&CLASS_CODE.to_le_bytes()[..3]);
        c.bytes[reg::HEADER_TYPE] = 0;
        c.put32(
            reg::BAR0,
            match bar0 {
                Bar0Mapping::Uc => BAR0_FLAGS_UC,
                Bar0Mapping::Wc => BAR0_FLAGS_WC,
            },
        );
        c.put32(reg::BAR1, 0);
        c.put16(reg::SUBSYSTEM_VENDOR, VENDOR_ID);
        c.put16(reg::SUBSYSTEM_ID, SUBSYSTEM_ID);
        c.bytes[reg::CAP_PTR] = MSIX_CAP as u8;
        // No legacy INTx is emulated: interrupt pin 0.
        c.bytes[reg::INTERRUPT_PIN] = 0;
        // MSI-X: ID, next = 0 (end of list), message control = table size - 1,
        // table and PBA offsets with BIR 0.
        c.bytes[MSIX_CAP] = CAP_ID_MSIX;
        c.bytes[MSIX_CAP + 1] = 0;
        c.put16(MSIX_CAP + 2, (MSIX_VECTORS - 1) as u16);
        c.put32(MSIX_CAP + 4, MSIX_TABLE_OFFSET as u32);
        c.put32(MSIX_CAP + 8, MSIX_PBA_OFFSET as u32);

        // Write masks: command (memory, master, parity, SERR, INTx disable),
        // BAR0 address bits above its size, BAR1 whole, MSI-X enable/mask.
        c.mask16(
            reg::COMMAND,
            COMMAND_MEMORY | COMMAND_MASTER | 1 << 6 | 1 << 8 | 1 << 10,
        );
        c.mask32(reg::BAR0, !(BAR0_SIZE as u32 - 1) & !0xf);
        c.mask32(reg::BAR1, u32::MAX);
        c.mask16(MSIX_CAP + 2, MSIX_ENABLE | MSIX_FUNCTION_MASK);
        c
    }

    fn put16(&mut self, at: usize, v: u16) {
        self.bytes[at..at + 2].copy_from_slice(&v.to_le_bytes());
    }

    fn put32(&mut self, at: usize, v: u32) {
        self.bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }

    fn mask16(&mut self, at: usize, v: u16) {
        self.wmask[at..at + 2].copy_from_slice(&v.to_le_bytes());
    }

    fn mask32(&mut self, at: usize, v: u32) {
        self.wmask[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }

    /// Read bytes; those beyond the config space read 0xff.
    pub fn read(&self, offset: u64, dst: &mut [u8]) {
        for (i, b) in dst.iter_mut().enumerate() {
            *b = usize::try_from(offset)
                .ok()
                .and_then(|o| o.checked_add(i))
                .and_then(|o| self.bytes.get(o).copied())
                .unwrap_or(0xff);
        }
    }

    /// Write bytes through the write mask; those beyond are dropped.
    pub fn write(&mut self, offset: u64, src: &[u8]) {
        for (i, v) in src.iter().enumerate() {
            let Some(o) = usize::try_from(offset).ok().and_then(|o| o.checked_add(i)) else {
                return;
            };
            if let (Some(b), Some(m)) = (self.bytes.get(o).copied(), self.wmask.get(o).copied()) {
                self.bytes[o] = (b & !m) | (v & m);
            }
        }
    }

    /// A 16-bit register.
    pub fn read16(&self, offset: usize) -> u16 {
        let mut v = [0u8; 2];
        self.read(offset as u64, &mut v);
        u16::from_le_bytes(v)
    }

    /// Whether bus mastering is enabled (DMA and MSI-X writes allowed).
    pub fn bus_master(&self) -> bool {
        self.read16(reg::COMMAND) & COMMAND_MASTER != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r32(c: &ConfigSpace, at: u64) -> u32 {
        let mut v = [0u8; 4];
        c.read(at, &mut v);
        u32::from_le_bytes(v)
    }

    #[test]
    fn ids_class_and_read_only_fields() {
        let mut c = ConfigSpace::default();
        assert_eq!(r32(&c, 0), 0x1017_15b3);
        assert_eq!(r32(&c, 0x08) >> 8, 0x02_0000);
        c.write(0, &[0, 0, 0, 0]);
        assert_eq!(r32(&c, 0), 0x1017_15b3, "IDs are read-only");
        c.write(4, &0xffffu16.to_le_bytes());
        assert_eq!(c.read16(4), 0x0546);
        assert!(c.bus_master());
    }

    #[test]
    fn bar0_sizing_reports_32_mib_64_bit_prefetchable_only_when_write_combining() {
        for (mapping, flags) in [(Bar0Mapping::Wc, 0b1100), (Bar0Mapping::Uc, 0b0100)] {
            let mut c = ConfigSpace::power_on(mapping);
            assert_eq!(r32(&c, 0x10) & 0xf, flags, "{mapping:?} before sizing");
            c.write(0x10, &u32::MAX.to_le_bytes());
            c.write(0x14, &u32::MAX.to_le_bytes());
            let lo = r32(&c, 0x10);
            assert_eq!(lo & 0xf, flags, "{mapping:?}: the flags are read-only");
            assert_eq!(!(lo & !0xf) + 1, 32 << 20);
            assert_eq!(r32(&c, 0x14), u32::MAX);
        }
        assert_eq!(
            r32(&ConfigSpace::default(), 0x10) & BAR_PREFETCHABLE,
            0,
            "UC by default"
        );
    }

    #[test]
    fn msix_capability_points_into_bar0() {
        let mut c = ConfigSpace::default();
        assert_ne!(c.read16(reg::STATUS) & STATUS_CAP_LIST, 0);
        let cap = c.bytes[reg::CAP_PTR] as u64;
        let mut hdr = [0u8; 2];
        c.read(cap, &mut hdr);
        assert_eq!(hdr, [0x11, 0]);
        assert_eq!(c.read16(cap as usize + 2) & 0x7ff, 63);
        assert_eq!(r32(&c, cap + 4), MSIX_TABLE_OFFSET as u32);
        assert_eq!(r32(&c, cap + 8), MSIX_PBA_OFFSET as u32);
        c.write(cap + 2, &0xffffu16.to_le_bytes());
        assert_eq!(
            c.read16(cap as usize + 2),
            0xc000 | 63,
            "only enable/mask are writable"
        );
        let mut past = [0u8; 4];
        c.read(254, &mut past);
        assert_eq!(&past[2..], &[0xff, 0xff]);
    }
}
