//! The engine's [`MemoryAccess`] over rnic-dma's key table.
//!
//! Every access is one O(1) [`KeyTable::lookup`] (key exists and is current,
//! PD, access right, whole range inside the registration) before a byte is
//! copied; a refused access touches nothing. Memory that offers direct
//! access ([`Memory::direct`]: heap, hugepage and application-owned
//! buffers) is copied with `rnic-dma`'s bulk copy (`rep movsb` over raw
//! pointers, `memcpy` speed); anything else (GPU memory behind a staging
//! ring, a BAR) through its own `read`/`write`.

use std::cell::OnceCell;
use std::sync::{Arc, RwLock, RwLockReadGuard};

use rnic_core::{AccessFlags, Memory, MemoryError, PdHandle, Rkey};
use rnic_dma::{KeyError, KeyTable};
use rnic_roce::transport::{Access, AtomicOp, Lent, MemError, MemKey, MemoryAccess};

/// The table every rxe device keeps: any `Arc<dyn Memory>` registers.
pub type Keys = KeyTable<dyn Memory>;

/// The engine's view of a device's key table for one engine call: the
/// table's read lock, taken at the call's first access and held to its end
/// (engine calls on different QPs read the table side by side; only
/// registration, deregistration and a peer's invalidation write it).
#[derive(Debug)]
pub struct KeyAccess<'a> {
    table: &'a RwLock<Keys>,
    read: OnceCell<RwLockReadGuard<'a, Keys>>,
}

impl<'a> KeyAccess<'a> {
    /// Access through `table`; nothing is locked until the first access.
    pub fn new(table: &'a RwLock<Keys>) -> KeyAccess<'a> {
        KeyAccess {
            table,
            read: OnceCell::new(),
        }
    }

    /// The table, read-locked (a poisoned lock is taken over: every update
    /// of the table is complete before it can panic).
    fn keys(&self) -> &Keys {
        self.read
            .get_or_init(|| self.table.read().unwrap_or_else(|p| p.into_inner()))
    }
}

fn need(access: Access) -> AccessFlags {
    match access {
        Access::LocalRead => AccessFlags::empty(),
        Access::LocalWrite => AccessFlags::LOCAL_WRITE,
        Access::RemoteRead => AccessFlags::REMOTE_READ,
        Access::RemoteWrite => AccessFlags::REMOTE_WRITE,
        Access::RemoteAtomic => AccessFlags::REMOTE_ATOMIC,
    }
}

fn key_err(e: KeyError) -> MemError {
    match e {
        KeyError::WrongPd { .. } => MemError::WrongPd,
        KeyError::AccessDenied { .. } => MemError::AccessDenied,
        KeyError::OutOfRange { .. } | KeyError::Overflow { .. } => MemError::OutOfBounds,
        KeyError::NotRemotelyInvalidatable { .. } => MemError::NotInvalidatable,
        _ => MemError::InvalidKey,
    }
}

fn mem_err(e: MemoryError) -> MemError {
    match e {
        MemoryError::Misaligned { .. } => MemError::Misaligned,
        _ => MemError::OutOfBounds,
    }
}

fn find(
    keys: &Keys,
    pd: PdHandle,
    key: MemKey,
    addr: u64,
    len: u64,
    access: Access,
) -> Result<(&Arc<dyn Memory>, usize), MemError> {
    let flags = need(access);
    let (region, off) = match key {
        MemKey::Local(l) => keys.lookup(l, pd, addr, len, flags),
        MemKey::Remote(r) => keys.lookup(r, pd, addr, len, flags),
    }
    .map_err(key_err)?;
    let off = usize::try_from(off).map_err(|_| MemError::OutOfBounds)?;
    Ok((region, off))
}

impl MemoryAccess for KeyAccess<'_> {
    fn check(
        &self,
        pd: PdHandle,
        key: MemKey,
        addr: u64,
        len: u64,
        access: Access,
    ) -> Result<(), MemError> {
        find(self.keys(), pd, key, addr, len, access).map(|_| ())
    }

    fn read(
        &self,
        pd: PdHandle,
        key: MemKey,
        addr: u64,
        dst: &mut [u8],
        access: Access,
    ) -> Result<(), MemError> {
        let (region, off) = find(self.keys(), pd, key, addr, dst.len() as u64, access)?;
        match region.pin_direct() {
            Some(pin) => rnic_dma::copy::read_span(&pin.span(), off, dst),
            None => region.read(off, dst),
        }
        .map_err(mem_err)
    }

    fn write(
        &mut self,
        pd: PdHandle,
        key: MemKey,
        addr: u64,
        src: &[u8],
        access: Access,
    ) -> Result<(), MemError> {
        let (region, off) = find(self.keys(), pd, key, addr, src.len() as u64, access)?;
        match region.pin_direct() {
            Some(pin) => rnic_dma::copy::write_span(&pin.span(), off, src),
            None => region.write(off, src),
        }
        .map_err(mem_err)
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
        let (region, off) = find(
            self.keys(),
            pd,
            MemKey::Remote(rkey),
            addr,
            8,
            Access::RemoteAtomic,
        )?;
        match op {
            AtomicOp::CompareSwap { compare, swap } => region.compare_swap_u64(off, compare, swap),
            AtomicOp::FetchAdd { add } => region.fetch_add_u64(off, add),
        }
        .map_err(mem_err)
    }

    fn lend(
        &self,
        pd: PdHandle,
        key: MemKey,
        addr: u64,
        len: u64,
        access: Access,
    ) -> Result<Option<Lent<'_>>, MemError> {
        let (region, off) = find(self.keys(), pd, key, addr, len, access)?;
        Ok(region.pin_direct().is_some().then_some((region, off)))
    }

    fn invalidate(&mut self, pd: PdHandle, rkey: Rkey) -> Result<(), MemError> {
        // The read lock goes before the write lock is taken (the next access
        // takes it again).
        drop(self.read.take());
        self.table
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .invalidate_remote(rkey, pd)
            .map(drop)
            .map_err(key_err)
    }
}
