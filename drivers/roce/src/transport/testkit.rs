//! Test support for engines built on this crate (feature `testkit`, and
//! this crate's own tests): a strict in-memory [`MemoryAccess`] over byte
//! vectors that records which bytes the engine wrote. The transport's
//! simulation and the fuzz harnesses use it, so every hostile-input check
//! runs against the same memory model.

use rnic_core::{AccessFlags, PdHandle, Rkey};

use super::{Access, AtomicOp, MemError, MemKey, MemoryAccess};

/// One registered region of the table.
#[derive(Clone, Debug)]
pub struct Region {
    /// Its L_Key and R_Key.
    pub key: u32,
    /// The protection domain it was registered in.
    pub pd: PdHandle,
    /// The rights it grants.
    pub access: AccessFlags,
    /// Address of byte 0.
    pub base: u64,
    /// The bytes.
    pub data: Vec<u8>,
    /// Which bytes the engine wrote (through [`MemoryAccess::write`] or an
    /// atomic) since registration: what "filled by response data" means.
    pub written: Vec<bool>,
    /// Live (not invalidated).
    pub valid: bool,
    /// A peer may end it with SEND_WITH_INVALIDATE (what a fast-registration
    /// MR is); off for what `register` makes, as for a plain `reg_mr`.
    pub remote_invalidate: bool,
}

/// A memory-key table over byte vectors: L_Key and R_Key of a region are
/// the same number, `(index + 1) << 8 | 0x5a`. Strict: every access is
/// checked for key, PD, right and range before a byte moves (as
/// [`MemoryAccess`] requires), and it asserts that the engine uses local
/// keys only for local access and remote keys only for remote access.
#[derive(Clone, Debug, Default)]
pub struct MemTable {
    /// The registrations, by index.
    pub regions: Vec<Region>,
}

impl MemTable {
    /// Register `len` zero bytes at IOVA `base`; returns the key.
    pub fn register(&mut self, pd: PdHandle, base: u64, len: usize, access: AccessFlags) -> u32 {
        let key = ((self.regions.len() as u32 + 1) << 8) | 0x5a;
        self.regions.push(Region {
            key,
            pd,
            access,
            base,
            data: vec![0; len],
            written: vec![false; len],
            valid: true,
            remote_invalidate: false,
        });
        key
    }

    /// Let peers invalidate region `key` (make it stand for a
    /// fast-registration MR).
    pub fn allow_remote_invalidate(&mut self, key: u32) {
        if let Some(r) = self.region_mut(key) {
            r.remote_invalidate = true;
        }
    }

    /// The live region `key` names.
    pub fn region(&self, key: u32) -> Option<&Region> {
        let i = (key >> 8).checked_sub(1)? as usize;
        self.regions.get(i).filter(|r| r.key == key && r.valid)
    }

    /// The live region `key` names, writable.
    pub fn region_mut(&mut self, key: u32) -> Option<&mut Region> {
        let i = (key >> 8).checked_sub(1)? as usize;
        self.regions.get_mut(i).filter(|r| r.key == key && r.valid)
    }

    /// The bytes of region `key` (empty when unknown).
    pub fn bytes(&self, key: u32) -> &[u8] {
        self.region(key).map_or(&[], |r| &r.data)
    }

    /// The bytes of region `key`, writable (empty when unknown).
    pub fn bytes_mut(&mut self, key: u32) -> &mut [u8] {
        self.region_mut(key).map_or(&mut [], |r| &mut r.data)
    }

    fn find(
        &self,
        pd: PdHandle,
        key: MemKey,
        addr: u64,
        len: u64,
        access: Access,
    ) -> Result<(usize, usize), MemError> {
        let k = match key {
            MemKey::Local(l) => l.get(),
            MemKey::Remote(r) => r.get(),
        };
        let i = (k >> 8).checked_sub(1).ok_or(MemError::InvalidKey)? as usize;
        let r = self
            .regions
            .get(i)
            .filter(|r| r.key == k && r.valid)
            .ok_or(MemError::InvalidKey)?;
        if r.pd != pd {
            return Err(MemError::WrongPd);
        }
        let remote = matches!(key, MemKey::Remote(_));
        let remote_access = matches!(
            access,
            Access::RemoteRead | Access::RemoteWrite | Access::RemoteAtomic
        );
        assert_eq!(
            remote, remote_access,
            "the engine used {key:?} for {access:?}: local keys are for local access only"
        );
        let need = match access {
            Access::LocalRead => AccessFlags::empty(),
            Access::LocalWrite => AccessFlags::LOCAL_WRITE,
            Access::RemoteRead => AccessFlags::REMOTE_READ,
            Access::RemoteWrite => AccessFlags::REMOTE_WRITE,
            Access::RemoteAtomic => AccessFlags::REMOTE_ATOMIC,
        };
        if !r.access.contains(need) {
            return Err(MemError::AccessDenied);
        }
        let start = addr.checked_sub(r.base).ok_or(MemError::OutOfBounds)?;
        let end = start.checked_add(len).ok_or(MemError::OutOfBounds)?;
        if end > r.data.len() as u64 {
            return Err(MemError::OutOfBounds);
        }
        Ok((i, start as usize))
    }
}

impl MemoryAccess for MemTable {
    fn check(
        &self,
        pd: PdHandle,
        key: MemKey,
        addr: u64,
        len: u64,
        access: Access,
    ) -> Result<(), MemError> {
        self.find(pd, key, addr, len, access).map(|_| ())
    }

    fn read(
        &self,
        pd: PdHandle,
        key: MemKey,
        addr: u64,
        dst: &mut [u8],
        access: Access,
    ) -> Result<(), MemError> {
        let (i, s) = self.find(pd, key, addr, dst.len() as u64, access)?;
        let src = self
            .regions
            .get(i)
            .and_then(|r| r.data.get(s..s + dst.len()))
            .ok_or(MemError::OutOfBounds)?;
        dst.copy_from_slice(src);
        Ok(())
    }

    fn write(
        &mut self,
        pd: PdHandle,
        key: MemKey,
        addr: u64,
        src: &[u8],
        access: Access,
    ) -> Result<(), MemError> {
        let (i, s) = self.find(pd, key, addr, src.len() as u64, access)?;
        let r = self.regions.get_mut(i).ok_or(MemError::OutOfBounds)?;
        let dst = r
            .data
            .get_mut(s..s + src.len())
            .ok_or(MemError::OutOfBounds)?;
        dst.copy_from_slice(src);
        r.written[s..s + src.len()].fill(true);
        Ok(())
    }

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
        let (i, s) = self.find(pd, MemKey::Remote(rkey), addr, 8, Access::RemoteAtomic)?;
        let cell = self
            .regions
            .get_mut(i)
            .and_then(|r| r.data.get_mut(s..s + 8))
            .ok_or(MemError::OutOfBounds)?;
        let mut w = [0u8; 8];
        w.copy_from_slice(cell);
        let orig = u64::from_ne_bytes(w);
        let new = match op {
            AtomicOp::CompareSwap { compare, swap } => {
                if orig == compare {
                    swap
                } else {
                    orig
                }
            }
            AtomicOp::FetchAdd { add } => orig.wrapping_add(add),
        };
        cell.copy_from_slice(&new.to_ne_bytes());
        if let Some(r) = self.regions.get_mut(i) {
            r.written[s..s + 8].fill(true);
        }
        Ok(orig)
    }

    fn invalidate(&mut self, pd: PdHandle, rkey: Rkey) -> Result<(), MemError> {
        let i = (rkey.get() >> 8)
            .checked_sub(1)
            .ok_or(MemError::InvalidKey)? as usize;
        let r = self
            .regions
            .get_mut(i)
            .filter(|r| r.key == rkey.get() && r.valid)
            .ok_or(MemError::InvalidKey)?;
        if r.pd != pd {
            return Err(MemError::WrongPd);
        }
        if !r.remote_invalidate {
            return Err(MemError::NotInvalidatable);
        }
        r.valid = false;
        Ok(())
    }
}
