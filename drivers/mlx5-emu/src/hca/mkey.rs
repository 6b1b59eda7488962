//! Memory keys (mlx5.md §6): CREATE_MKEY / DESTROY_MKEY, and [`MemView`], the transport
//! engine's [`MemoryAccess`] over them — every access is key-, PD-, bounds- and
//! rights-checked, then translated IOVA → DMA address through the MTT (or used directly in
//! PA mode) and performed through the device's DMA, chunk by chunk.

use std::collections::BTreeMap;

use rnic_core::{Lkey, PdHandle, Rkey};
use rnic_mlx5_prm::{
    CmdStatus, CreateMkeyIn, CreateMkeyOut, DestroyMkeyIn, MKEY_QPN_UNBOUND, MTT_READ_ENABLE,
    MTT_WRITE_ENABLE, create_mkey_in, mkey_access_mode,
};
use rnic_roce::transport::{Access, AtomicOp, MemError, MemKey, MemoryAccess};

use super::{Ctx, Outcome, refuse};
use crate::device::Device;
use crate::firmware::syndrome as syn;

/// The key of the synthetic region that carries a WQE's inline bytes into the engine. Index 0
/// is never handed out, so no driver key can name it, and [`MemView`] honours it only while an
/// inline WQE is being posted.
pub(crate) const INLINE_KEY: u32 = 0;

/// How an MKey translates its virtual addresses.
#[derive(Clone, Debug)]
enum Translation {
    /// Physical (bus) addresses: VA = IOVA.
    Pa,
    /// One entry per page from `start_addr` rounded down: `address | rd_en | wr_en`.
    Mtt { log_page: u32, entries: Vec<u64> },
}

/// One memory key.
#[derive(Clone, Debug)]
pub(crate) struct Mkey {
    key_byte: u8,
    pd: u32,
    lw: bool,
    rr: bool,
    rw: bool,
    atomic: bool,
    start: u64,
    /// `None`: `length64` (the whole address space from `start`).
    len: Option<u64>,
    tr: Translation,
}

/// The MKey table, by index.
#[derive(Debug, Default)]
pub(crate) struct MkeyTable {
    pub(crate) keys: BTreeMap<u32, Mkey>,
}

impl MkeyTable {
    /// Host bytes the MTTs hold.
    pub(crate) fn bytes(&self) -> usize {
        self.keys
            .values()
            .map(|k| match &k.tr {
                Translation::Pa => 0,
                Translation::Mtt { entries, .. } => entries.len() * 8,
            })
            .sum()
    }

    /// Whether an MKey lives in `pd`.
    pub(crate) fn uses_pd(&self, pd: u32) -> bool {
        self.keys.values().any(|k| k.pd == pd)
    }

    /// CREATE_MKEY (mlx5.md §6).
    pub(crate) fn create(&mut self, ctx: &Ctx<'_>, input: &[u8], out: &mut [u8]) -> Outcome {
        let v = CreateMkeyIn::new_unchecked(input);
        let c = v.memory_key_mkey_entry();
        if v.mkey_umem_valid() != 0 || c.free() != 0 || c.lr() != 1 || c.umr_en() != 0 {
            return refuse(CmdStatus::BadParam, syn::MKEY_CONTEXT);
        }
        if c.qpn() != MKEY_QPN_UNBOUND {
            return refuse(CmdStatus::BadParam, syn::MKEY_CONTEXT);
        }
        if !ctx.pds.contains(&c.pd()) {
            return refuse(CmdStatus::BadRes, syn::MKEY_PD);
        }
        let mode = (c.access_mode_4_2() << 2) | c.access_mode_1_0();
        let length64 = c.length64() == 1;
        let len = c.len();
        if !length64 && len == 0 {
            return refuse(CmdStatus::BadParam, syn::MKEY_CONTEXT);
        }
        if !length64 && c.start_addr().checked_add(len).is_none() {
            return refuse(CmdStatus::BadParam, syn::MKEY_CONTEXT);
        }
        let tr = match mode {
            mkey_access_mode::PA => Translation::Pa,
            mkey_access_mode::MTT => {
                if length64 {
                    return refuse(CmdStatus::BadParam, syn::MKEY_MTT);
                }
                let log_page = c.log_page_size();
                if !(12..=30).contains(&log_page) {
                    return refuse(CmdStatus::BadParam, syn::MKEY_MTT);
                }
                let page = 1u64 << log_page;
                let first = c.start_addr() & !(page - 1);
                let npages = (c.start_addr() + len - first).div_ceil(page);
                let octwords = u64::from(c.translations_octword_size());
                let actual = u64::from(v.translations_octword_actual_size());
                if octwords * 2 < npages || actual * 2 < npages {
                    return refuse(CmdStatus::BadParam, syn::MKEY_MTT);
                }
                let at = create_mkey_in::klm_pas_mtt.byte_offset();
                let Some(need) = usize::try_from(npages).ok().and_then(|n| n.checked_mul(8)) else {
                    return refuse(CmdStatus::BadParam, syn::MKEY_MTT);
                };
                let Some(raw) = input.get(at..at + need) else {
                    return refuse(CmdStatus::BadInpLen, syn::MKEY_MTT);
                };
                let mut entries = Vec::with_capacity(raw.len() / 8);
                for e in raw.chunks_exact(8) {
                    let mut b = [0u8; 8];
                    b.copy_from_slice(e);
                    let e = u64::from_be_bytes(b);
                    let addr = e & !0xff;
                    if !addr.is_multiple_of(page) || e & MTT_READ_ENABLE == 0 {
                        return refuse(CmdStatus::BadParam, syn::MKEY_MTT);
                    }
                    entries.push(e);
                }
                Translation::Mtt { log_page, entries }
            }
            _ => return refuse(CmdStatus::BadParam, syn::MKEY_ACCESS_MODE),
        };
        let limit = 1u64 << ctx.caps.general().log_max_mkey();
        let Some(index) = (1..)
            .take_while(|&i| u64::from(i) < limit)
            .find(|i| !self.keys.contains_key(i))
        else {
            return refuse(CmdStatus::NoRes, syn::MKEY_EXHAUSTED);
        };
        self.keys.insert(
            index,
            Mkey {
                // mkey_7_0 is an 8-bit field.
                key_byte: c.mkey_7_0() as u8,
                pd: c.pd(),
                lw: c.lw() == 1,
                rr: c.rr() == 1,
                rw: c.rw() == 1,
                atomic: c.a() == 1,
                start: c.start_addr(),
                len: (!length64).then_some(len),
                tr,
            },
        );
        let _ = CreateMkeyOut::new_unchecked(out).set_mkey_index(index);
        tracing::debug!(
            index,
            key = format_args!("{:#x}", (index << 8) | c.mkey_7_0()),
            "CREATE_MKEY"
        );
        Ok(())
    }

    /// DESTROY_MKEY.
    pub(crate) fn destroy(&mut self, input: &[u8]) -> Outcome {
        let index = DestroyMkeyIn::new_unchecked(input).mkey_index();
        if self.keys.remove(&index).is_none() {
            return refuse(CmdStatus::BadRes, syn::MKEY_NOT_FOUND);
        }
        Ok(())
    }

    /// Resolve `key` for `[addr, addr + len)` with `access` in `pd`: the MKey, or why not.
    fn find(
        &self,
        pd: PdHandle,
        key: u32,
        addr: u64,
        len: u64,
        access: Access,
    ) -> Result<&Mkey, MemError> {
        let k = self.keys.get(&(key >> 8)).ok_or(MemError::InvalidKey)?;
        if k.key_byte != key as u8 {
            return Err(MemError::InvalidKey);
        }
        if k.pd != pd.0 {
            return Err(MemError::WrongPd);
        }
        let granted = match access {
            Access::LocalRead => true,
            Access::LocalWrite => k.lw,
            Access::RemoteRead => k.rr,
            Access::RemoteWrite => k.rw,
            Access::RemoteAtomic => k.atomic,
        };
        if !granted {
            return Err(MemError::AccessDenied);
        }
        let end = addr.checked_add(len).ok_or(MemError::OutOfBounds)?;
        if addr < k.start {
            return Err(MemError::OutOfBounds);
        }
        if let Some(l) = k.len
            && end > k.start + l
        {
            return Err(MemError::OutOfBounds);
        }
        Ok(k)
    }
}

impl Mkey {
    /// The DMA chunks of `[addr, addr + len)` (already bounds-checked): (IOVA, length).
    fn chunks(
        &self,
        addr: u64,
        len: u64,
        write: bool,
        mut f: impl FnMut(u64, usize, usize) -> Result<(), MemError>,
    ) -> Result<(), MemError> {
        match &self.tr {
            Translation::Pa => {
                let n = usize::try_from(len).map_err(|_| MemError::Length)?;
                f(addr, 0, n)
            }
            Translation::Mtt { log_page, entries } => {
                let page = 1u64 << log_page;
                let base = self.start & !(page - 1);
                let mut done = 0u64;
                while done < len {
                    let va = addr + done;
                    let idx = usize::try_from((va - base) >> log_page)
                        .map_err(|_| MemError::OutOfBounds)?;
                    let e = *entries.get(idx).ok_or(MemError::OutOfBounds)?;
                    if write && e & MTT_WRITE_ENABLE == 0 {
                        return Err(MemError::AccessDenied);
                    }
                    let off = va & (page - 1);
                    let n = (page - off).min(len - done);
                    let at = usize::try_from(done).map_err(|_| MemError::Length)?;
                    let nn = usize::try_from(n).map_err(|_| MemError::Length)?;
                    f((e & !0xff) + off, at, nn)?;
                    done += n;
                }
                Ok(())
            }
        }
    }
}

/// The engine's view of memory: the MKey table over the device's DMA. While an inline WQE is
/// posted, `inline` holds its bytes under [`INLINE_KEY`].
pub(crate) struct MemView<'a> {
    pub(crate) dev: &'a Device,
    pub(crate) mkeys: &'a MkeyTable,
    pub(crate) inline: Option<&'a [u8]>,
    /// DMA faults met (counted by the caller).
    pub(crate) dma_faults: std::cell::Cell<u64>,
}

fn raw(key: MemKey) -> u32 {
    match key {
        MemKey::Local(Lkey(k)) => k,
        MemKey::Remote(Rkey(k)) => k,
    }
}

impl MemoryAccess for MemView<'_> {
    fn check(
        &self,
        pd: PdHandle,
        key: MemKey,
        addr: u64,
        len: u64,
        access: Access,
    ) -> Result<(), MemError> {
        if let (Some(b), MemKey::Local(Lkey(INLINE_KEY))) = (self.inline, key) {
            return if addr.checked_add(len).is_some_and(|e| e <= b.len() as u64) {
                Ok(())
            } else {
                Err(MemError::OutOfBounds)
            };
        }
        self.mkeys.find(pd, raw(key), addr, len, access).map(drop)
    }

    fn read(
        &self,
        pd: PdHandle,
        key: MemKey,
        addr: u64,
        dst: &mut [u8],
        access: Access,
    ) -> Result<(), MemError> {
        if let (Some(b), MemKey::Local(Lkey(INLINE_KEY))) = (self.inline, key) {
            let a = usize::try_from(addr).map_err(|_| MemError::OutOfBounds)?;
            let src = b.get(a..a + dst.len()).ok_or(MemError::OutOfBounds)?;
            dst.copy_from_slice(src);
            return Ok(());
        }
        let k = self
            .mkeys
            .find(pd, raw(key), addr, dst.len() as u64, access)?;
        let (dev, faults) = (self.dev, &self.dma_faults);
        k.chunks(addr, dst.len() as u64, false, |iova, at, n| {
            let d = dst.get_mut(at..at + n).ok_or(MemError::Length)?;
            dev.dma_read(iova, d).map_err(|_| {
                faults.set(faults.get() + 1);
                MemError::AccessDenied
            })
        })
    }

    fn write(
        &mut self,
        pd: PdHandle,
        key: MemKey,
        addr: u64,
        src: &[u8],
        access: Access,
    ) -> Result<(), MemError> {
        let k = self
            .mkeys
            .find(pd, raw(key), addr, src.len() as u64, access)?;
        let (dev, faults) = (self.dev, &self.dma_faults);
        k.chunks(addr, src.len() as u64, true, |iova, at, n| {
            let s = src.get(at..at + n).ok_or(MemError::Length)?;
            dev.dma_write(iova, s).map_err(|_| {
                faults.set(faults.get() + 1);
                MemError::AccessDenied
            })
        })
    }

    /// Remote atomics act on the 8 target bytes as a big-endian value (mlx5's "HCA"
    /// atomicity without the 8-byte endianness mode, which the atomic cap page would set and
    /// this firmware does not offer).
    fn atomic(
        &mut self,
        pd: PdHandle,
        rkey: Rkey,
        addr: u64,
        op: AtomicOp,
    ) -> Result<u64, MemError> {
        if !addr.is_multiple_of(8) {
            return Err(MemError::Misaligned);
        }
        let mut b = [0u8; 8];
        self.read(pd, MemKey::Remote(rkey), addr, &mut b, Access::RemoteAtomic)?;
        let orig = u64::from_be_bytes(b);
        let new = match op {
            AtomicOp::CompareSwap { compare, swap } => (orig == compare).then_some(swap),
            AtomicOp::FetchAdd { add } => Some(orig.wrapping_add(add)),
        };
        if let Some(n) = new {
            self.write(
                pd,
                MemKey::Remote(rkey),
                addr,
                &n.to_be_bytes(),
                Access::RemoteAtomic,
            )?;
        }
        Ok(orig)
    }

    /// No MKey is invalidatable by a peer (no fast-registration MKeys or memory windows).
    fn invalidate(&mut self, pd: PdHandle, rkey: Rkey) -> Result<(), MemError> {
        let k = self
            .mkeys
            .keys
            .get(&rkey.index())
            .filter(|k| k.key_byte == rkey.key_byte())
            .ok_or(MemError::InvalidKey)?;
        if k.pd != pd.0 {
            return Err(MemError::WrongPd);
        }
        Err(MemError::NotInvalidatable)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> MkeyTable {
        let mut t = MkeyTable::default();
        t.keys.insert(
            5,
            Mkey {
                key_byte: 0x5a,
                pd: 3,
                lw: true,
                rr: true,
                rw: false,
                atomic: false,
                start: 0x10_0800,
                len: Some(0x2000),
                tr: Translation::Mtt {
                    log_page: 12,
                    entries: vec![0xa000 | 3, 0x5000 | 1, 0x9000 | 3],
                },
            },
        );
        t
    }

    #[test]
    fn keys_are_checked_before_any_access() {
        let t = table();
        let (pd, key) = (PdHandle(3), (5 << 8) | 0x5a);
        assert!(
            t.find(pd, key, 0x10_0800, 0x2000, Access::LocalRead)
                .is_ok()
        );
        assert_eq!(
            t.find(pd, key ^ 1, 0x10_0800, 1, Access::LocalRead).err(),
            Some(MemError::InvalidKey)
        );
        assert_eq!(
            t.find(PdHandle(4), key, 0x10_0800, 1, Access::LocalRead)
                .err(),
            Some(MemError::WrongPd)
        );
        assert_eq!(
            t.find(pd, key, 0x10_0800, 1, Access::RemoteWrite).err(),
            Some(MemError::AccessDenied)
        );
        assert_eq!(
            t.find(pd, key, 0x10_07ff, 1, Access::LocalRead).err(),
            Some(MemError::OutOfBounds)
        );
        assert_eq!(
            t.find(pd, key, 0x10_2000, 0x801, Access::LocalRead).err(),
            Some(MemError::OutOfBounds)
        );
        assert_eq!(
            t.find(pd, key, u64::MAX, 2, Access::LocalRead).err(),
            Some(MemError::OutOfBounds)
        );
    }

    #[test]
    fn mtt_translation_splits_at_pages_and_needs_wr_en_to_write() {
        let t = table();
        let k = t.keys.get(&5).unwrap();
        let mut got = Vec::new();
        k.chunks(0x10_0ff0, 0x20, false, |iova, at, n| {
            got.push((iova, at, n));
            Ok(())
        })
        .unwrap();
        assert_eq!(got, vec![(0xaff0, 0, 0x10), (0x5000, 0x10, 0x10)]);
        // Page 1 (0x5000) lacks wr_en.
        assert_eq!(
            k.chunks(0x10_1000, 8, true, |_, _, _| Ok(())),
            Err(MemError::AccessDenied)
        );
        assert!(k.chunks(0x10_2000, 8, true, |_, _, _| Ok(())).is_ok());
    }
}
