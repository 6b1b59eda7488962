//! The memory-key table: L_Key/R_Key → (region, PD, access, range).
//!
//! A key is `index << 8 | key_byte`. The index names a slot of a slab, so a
//! lookup is one bounds-checked vector index: O(1) and allocation-free (the
//! software responder calls [`KeyTable::lookup`] for every remote access).
//! Each slot keeps its key byte across registrations and changes it to a
//! different random value every time the slot is reused, and freed slots are
//! reused oldest-first; so a key that named an invalidated registration is
//! refused as [`KeyError::Stale`] even after its index is live again, and a
//! guessed key hits with probability 1/255 per live index.
//!
//! Registration holds an `Arc` of the region: a registered region cannot be
//! freed. [`KeyTable::invalidate`] needs `&mut self`, so once it returns no
//! lookup can still see the entry ("the key stops working immediately"), and
//! no borrowed lookup result can outlive it.

use std::collections::VecDeque;
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rnic_core::{AccessFlags, Lkey, Memory, PdHandle, Rkey};
use tracing::debug;

use crate::error::{DmaError, KeyError};
use crate::region::DmaRegion;

/// Largest index a 24-bit key index can hold.
const MAX_INDEX: u32 = (1 << 24) - 1;

/// The address the device and peers use for byte 0 of `m`: its IOVA when
/// it is mapped through an IOMMU, else its virtual address (identity mapping,
/// as on the software backend).
fn base_address<M: ?Sized + Memory>(m: &M) -> u64 {
    m.iova().map_or_else(|| m.addr(), |iova| iova.get())
}

/// A key type the table accepts: [`Lkey`] or [`Rkey`].
pub trait MemKey: Copy {
    /// The raw 32-bit key.
    fn raw(self) -> u32;
}

impl MemKey for Lkey {
    fn raw(self) -> u32 {
        self.get()
    }
}

impl MemKey for Rkey {
    fn raw(self) -> u32 {
        self.get()
    }
}

/// The keys of one registration (one value: L_Key = R_Key, as on mlx5) and
/// the address range they cover.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MrKeys {
    /// For local SGEs.
    pub lkey: Lkey,
    /// For peers (RETH, AtomicETH).
    pub rkey: Rkey,
    /// First address of the registration (what a peer puts in a RETH).
    pub start: u64,
    /// Length in bytes.
    pub len: u64,
}

/// What a registration is, which decides who may end it.
///
/// A peer's SEND_WITH_INVALIDATE may end only a fast-registration MR
/// (`IB_MR_TYPE_MEM_REG`) or a type-2 memory window (kernel rxe,
/// `rxe_invalidate_mr` / `rxe_invalidate_mw`). rnic has neither yet; when it
/// gains them they become variants here whose
/// [`remote_invalidate`](MrKind::remote_invalidate) is `true`, and only those.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MrKind {
    /// An ordinary registration (`reg_mr`): only its owner deregisters it.
    Registered,
}

impl MrKind {
    /// Whether a peer may invalidate a registration of this kind.
    pub const fn remote_invalidate(self) -> bool {
        match self {
            MrKind::Registered => false,
        }
    }
}

impl core::fmt::Display for MrKind {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            MrKind::Registered => "plain reg_mr",
        })
    }
}

/// One live registration.
#[derive(Debug)]
struct Entry<M: ?Sized> {
    region: Arc<M>,
    pd: PdHandle,
    kind: MrKind,
    access: AccessFlags,
    /// `[start, start + len)` in the device's address space.
    start: u64,
    len: u64,
    /// Offset of `start` within the region.
    offset: u64,
}

#[derive(Debug)]
struct Slot<M: ?Sized> {
    key_byte: u8,
    entry: Option<Entry<M>>,
}

/// The table; see the module docs. `M` is the region type (any
/// rnic-core [`Memory`]: a [`DmaRegion`] by default, or `dyn Memory` for a
/// provider that registers whatever `reg_mr` hands it).
#[derive(Debug)]
pub struct KeyTable<M: ?Sized + Memory = DmaRegion> {
    slots: Vec<Slot<M>>,
    /// Freed indices, oldest first.
    free: VecDeque<u32>,
    live: usize,
    rng: StdRng,
}

impl<M: ?Sized + Memory> Default for KeyTable<M> {
    fn default() -> Self {
        KeyTable::new()
    }
}

impl<M: ?Sized + Memory> KeyTable<M> {
    /// An empty table with key bytes from the OS's randomness.
    pub fn new() -> KeyTable<M> {
        KeyTable::from_rng(StdRng::from_os_rng())
    }

    /// An empty table with a deterministic key-byte sequence (tests).
    pub fn with_seed(seed: u64) -> KeyTable<M> {
        KeyTable::from_rng(StdRng::seed_from_u64(seed))
    }

    fn from_rng(rng: StdRng) -> KeyTable<M> {
        KeyTable {
            slots: Vec::new(),
            free: VecDeque::new(),
            live: 0,
            rng,
        }
    }

    /// Live registrations.
    pub fn len(&self) -> usize {
        self.live
    }

    /// Whether no registration is live.
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Register `[offset, offset + len)` of `region` in `pd` with `access`.
    /// The registration covers device addresses starting at
    /// `base + offset`, where base is the region's IOVA if it has one, else its
    /// virtual address.
    pub fn register(
        &mut self,
        region: Arc<M>,
        offset: u64,
        len: u64,
        pd: PdHandle,
        access: AccessFlags,
    ) -> Result<MrKeys, DmaError> {
        let region_len = region.len() as u64;
        if len == 0 || offset.checked_add(len).is_none_or(|end| end > region_len) {
            return Err(DmaError::Register {
                reason: format!(
                    "range [{offset:#x}, +{len:#x}) is empty or outside the {region_len}-byte region"
                ),
            });
        }
        access
            .validate()
            .map_err(|source| DmaError::RegisterAccess { source })?;
        let Some(start) = base_address(&*region)
            .checked_add(offset)
            .filter(|s| s.checked_add(len).is_some())
        else {
            return Err(DmaError::Register {
                reason: "the registered range overflows the address space".into(),
            });
        };
        let index = match self.free.pop_front() {
            Some(i) => i,
            None => {
                let i = u32::try_from(self.slots.len())
                    .ok()
                    .filter(|&i| i <= MAX_INDEX)
                    .ok_or_else(|| DmaError::Register {
                        reason: format!("the table is full ({} keys)", MAX_INDEX + 1),
                    })?;
                // A fresh slot starts from a random byte; "previous" is that byte.
                self.slots.push(Slot {
                    key_byte: self.rng.random(),
                    entry: None,
                });
                i
            }
        };
        let slot = &mut self.slots[index as usize];
        // A different byte on every (re)use: old + a random non-zero step.
        slot.key_byte = slot.key_byte.wrapping_add(self.rng.random_range(1..=255));
        slot.entry = Some(Entry {
            region,
            pd,
            kind: MrKind::Registered,
            access,
            start,
            len,
            offset,
        });
        self.live += 1;
        let raw = (index << 8) | u32::from(slot.key_byte);
        debug!(
            key = raw,
            start,
            len,
            pd = pd.0,
            ?access,
            "registered memory key"
        );
        Ok(MrKeys {
            lkey: Lkey(raw),
            rkey: Rkey(raw),
            start,
            len,
        })
    }

    /// The live entry `key` names, or why not.
    fn entry(&self, key: u32) -> Result<&Entry<M>, KeyError> {
        let index = key >> 8;
        let slot = self
            .slots
            .get(index as usize)
            .ok_or(KeyError::Unknown { key, index })?;
        let entry = slot
            .entry
            .as_ref()
            .ok_or(KeyError::Unknown { key, index })?;
        if slot.key_byte != key as u8 {
            return Err(KeyError::Stale { key, index });
        }
        Ok(entry)
    }

    /// Check an access of `[va, va + len)` with `key` from `pd` needing
    /// `access`; returns the region and the offset of `va` in it. O(1), never
    /// allocates. Checks in order: key exists, key byte current, PD, access,
    /// no overflow, range inside the registration.
    pub fn lookup<K: MemKey>(
        &self,
        key: K,
        pd: PdHandle,
        va: u64,
        len: u64,
        access: AccessFlags,
    ) -> Result<(&Arc<M>, u64), KeyError> {
        let key = key.raw();
        let e = self.entry(key)?;
        if e.pd != pd {
            return Err(KeyError::WrongPd {
                key,
                registered: e.pd.0,
                used: pd.0,
            });
        }
        if !e.access.contains(access) {
            return Err(KeyError::AccessDenied {
                key,
                wanted: access.bits(),
                granted: e.access.bits(),
            });
        }
        let end = va
            .checked_add(len)
            .ok_or(KeyError::Overflow { key, va, len })?;
        if va < e.start || end > e.start + e.len {
            return Err(KeyError::OutOfRange {
                key,
                va,
                len,
                start: e.start,
                reg_len: e.len,
            });
        }
        Ok((&e.region, e.offset + (va - e.start)))
    }

    /// A peer's SEND_WITH_INVALIDATE for `rkey`, arriving on a QP of `pd`:
    /// ends the registration only if it exists in `pd` and is of a kind a
    /// peer may invalidate ([`MrKind::remote_invalidate`]). Every refusal
    /// leaves the table exactly as it was.
    pub fn invalidate_remote(&mut self, rkey: Rkey, pd: PdHandle) -> Result<Arc<M>, KeyError> {
        let raw = rkey.get();
        let e = self.entry(raw)?;
        if e.pd != pd {
            return Err(KeyError::WrongPd {
                key: raw,
                registered: e.pd.0,
                used: pd.0,
            });
        }
        if !e.kind.remote_invalidate() {
            return Err(KeyError::NotRemotelyInvalidatable {
                key: raw,
                kind: e.kind,
            });
        }
        self.invalidate(rkey)
    }

    /// The kind of registration `key` names.
    pub fn kind<K: MemKey>(&self, key: K) -> Result<MrKind, KeyError> {
        self.entry(key.raw()).map(|e| e.kind)
    }

    /// End the registration `key` names (its owner's deregistration); the
    /// key (and any other key for the index) stops working now. Returns the region's `Arc` so the caller
    /// decides where its last reference drops.
    pub fn invalidate<K: MemKey>(&mut self, key: K) -> Result<Arc<M>, KeyError> {
        let raw = key.raw();
        self.entry(raw)?;
        let index = raw >> 8;
        let entry = self.slots[index as usize]
            .entry
            .take()
            .ok_or(KeyError::Unknown { key: raw, index })?;
        self.free.push_back(index);
        self.live -= 1;
        debug!(key = raw, "invalidated memory key");
        Ok(entry.region)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    use rnic_core::HeapMemory;

    const PD: PdHandle = PdHandle(1);
    const RW: AccessFlags = AccessFlags::LOCAL_WRITE
        .union(AccessFlags::REMOTE_WRITE)
        .union(AccessFlags::REMOTE_READ);

    fn region(len: usize) -> Arc<HeapMemory> {
        Arc::new(HeapMemory::new(len))
    }

    /// A memory whose address range ends at the top of the address space.
    #[derive(Debug)]
    struct AtTheTop;

    impl Memory for AtTheTop {
        fn len(&self) -> usize {
            4096
        }
        fn addr(&self) -> u64 {
            u64::MAX - 100
        }
        fn read(&self, _: usize, _: &mut [u8]) -> Result<(), rnic_core::MemoryError> {
            Ok(())
        }
        fn write(&self, _: usize, _: &[u8]) -> Result<(), rnic_core::MemoryError> {
            Ok(())
        }
        fn compare_swap_u64(
            &self,
            _: usize,
            _: u64,
            _: u64,
        ) -> Result<u64, rnic_core::MemoryError> {
            Ok(0)
        }
        fn fetch_add_u64(&self, _: usize, _: u64) -> Result<u64, rnic_core::MemoryError> {
            Ok(0)
        }
    }

    #[test]
    fn lookup_returns_region_and_offset() {
        let mut t = KeyTable::with_seed(1);
        let r = region(4096);
        let base = r.addr();
        let k = t.register(Arc::clone(&r), 0x100, 0x800, PD, RW).unwrap();
        assert_eq!(k.lkey.get(), k.rkey.get());
        assert_eq!(
            k.start,
            base + 0x100,
            "no IOVA: keys cover virtual addresses"
        );
        let (got, off) = t
            .lookup(k.rkey, PD, base + 0x110, 0x20, AccessFlags::REMOTE_WRITE)
            .unwrap();
        assert!(Arc::ptr_eq(got, &r));
        assert_eq!(off, 0x110);
        // The last byte, and a zero-length access at the end, are in range.
        assert!(
            t.lookup(k.rkey, PD, base + 0x8ff, 1, AccessFlags::REMOTE_READ)
                .is_ok()
        );
        assert!(
            t.lookup(k.lkey, PD, base + 0x900, 0, AccessFlags::empty())
                .is_ok()
        );
    }

    #[test]
    fn each_failure_has_its_own_error() {
        let mut t = KeyTable::with_seed(2);
        let k = t
            .register(region(4096), 0, 4096, PD, AccessFlags::REMOTE_READ)
            .unwrap();
        let s = k.start;
        let raw = k.rkey.get();
        let bad_byte = Rkey(raw ^ 0x01);
        assert_eq!(
            t.lookup(bad_byte, PD, s, 1, AccessFlags::REMOTE_READ)
                .unwrap_err(),
            KeyError::Stale {
                key: raw ^ 1,
                index: raw >> 8
            }
        );
        let unknown = Rkey::from_parts(77, 0);
        assert!(matches!(
            t.lookup(unknown, PD, s, 1, AccessFlags::empty()),
            Err(KeyError::Unknown { index: 77, .. })
        ));
        assert!(matches!(
            t.lookup(k.rkey, PdHandle(2), s, 1, AccessFlags::REMOTE_READ),
            Err(KeyError::WrongPd {
                registered: 1,
                used: 2,
                ..
            })
        ));
        assert!(matches!(
            t.lookup(k.rkey, PD, s, 1, AccessFlags::REMOTE_WRITE),
            Err(KeyError::AccessDenied {
                wanted: 2,
                granted: 4,
                ..
            })
        ));
        assert!(matches!(
            t.lookup(k.rkey, PD, u64::MAX, 2, AccessFlags::REMOTE_READ),
            Err(KeyError::Overflow { .. })
        ));
        assert!(matches!(
            t.lookup(k.rkey, PD, s + 4000, 97, AccessFlags::REMOTE_READ),
            Err(KeyError::OutOfRange { .. })
        ));
        assert!(matches!(
            t.lookup(k.rkey, PD, s - 1, 1, AccessFlags::REMOTE_READ),
            Err(KeyError::OutOfRange { .. })
        ));
    }

    #[test]
    fn invalidation_is_immediate_and_stale_keys_stay_dead() {
        let mut t = KeyTable::with_seed(3);
        let r = region(8192);
        let k1 = t.register(Arc::clone(&r), 0, 8192, PD, RW).unwrap();
        assert_eq!(Arc::strong_count(&r), 2, "the table holds the region");
        let back = t.invalidate(k1.rkey).unwrap();
        drop(back);
        assert_eq!(Arc::strong_count(&r), 1, "invalidation releases it");
        assert!(matches!(
            t.lookup(k1.rkey, PD, k1.start, 1, AccessFlags::empty()),
            Err(KeyError::Unknown { .. })
        ));
        assert!(
            t.invalidate(k1.rkey).is_err(),
            "double invalidation is refused"
        );
        // Reuse of the index: same index, different byte; the old key is stale.
        let k2 = t.register(Arc::clone(&r), 0, 8192, PD, RW).unwrap();
        assert_eq!(k2.rkey.index(), k1.rkey.index());
        assert_ne!(k2.rkey.key_byte(), k1.rkey.key_byte());
        assert!(matches!(
            t.lookup(k1.rkey, PD, k1.start, 1, AccessFlags::empty()),
            Err(KeyError::Stale { .. })
        ));
        assert!(
            matches!(t.invalidate(k1.rkey), Err(KeyError::Stale { .. })),
            "a stale key can't invalidate"
        );
        assert!(
            t.lookup(k2.rkey, PD, k2.start, 1, AccessFlags::empty())
                .is_ok()
        );
    }

    #[test]
    fn key_bytes_change_on_every_reuse_and_are_random() {
        let mut t = KeyTable::with_seed(4);
        let r = region(4096);
        let mut prev = None;
        let mut bytes = HashSet::new();
        for _ in 0..1000 {
            let k = t.register(Arc::clone(&r), 0, 64, PD, RW).unwrap();
            assert_eq!(k.rkey.index(), 0, "a single slot, reused");
            if let Some(p) = prev {
                assert_ne!(k.rkey.key_byte(), p, "the byte changes on every reuse");
            }
            prev = Some(k.rkey.key_byte());
            bytes.insert(k.rkey.key_byte());
            t.invalidate(k.rkey).unwrap();
        }
        // 1000 draws over 255 steps: a fixed or cyclic pattern would cover far fewer.
        assert!(bytes.len() > 200, "only {} distinct key bytes", bytes.len());
        // Two tables seeded from the OS differ (probability of a false failure: 1/256^4).
        let firsts: Vec<Vec<u8>> = (0..2)
            .map(|_| {
                let mut t = KeyTable::<HeapMemory>::new();
                (0..4)
                    .map(|_| {
                        t.register(Arc::clone(&r), 0, 64, PD, RW)
                            .unwrap()
                            .rkey
                            .key_byte()
                    })
                    .collect()
            })
            .collect();
        assert_ne!(firsts[0], firsts[1]);
    }

    #[test]
    fn freed_indices_are_reused_oldest_first() {
        let mut t = KeyTable::with_seed(5);
        let r = region(4096);
        let keys: Vec<_> = (0..3)
            .map(|_| t.register(Arc::clone(&r), 0, 64, PD, RW).unwrap())
            .collect();
        t.invalidate(keys[2].rkey).unwrap();
        t.invalidate(keys[0].rkey).unwrap();
        assert_eq!(
            t.register(Arc::clone(&r), 0, 64, PD, RW)
                .unwrap()
                .rkey
                .index(),
            2
        );
        assert_eq!(
            t.register(Arc::clone(&r), 0, 64, PD, RW)
                .unwrap()
                .rkey
                .index(),
            0
        );
        assert_eq!(t.len(), 3);
    }

    #[test]
    fn registration_is_validated() {
        let mut t = KeyTable::with_seed(6);
        let r = region(4096);
        assert!(t.register(Arc::clone(&r), 4000, 97, PD, RW).is_err());
        assert!(t.register(Arc::clone(&r), 0, 0, PD, RW).is_err());
        assert!(t.register(Arc::clone(&r), u64::MAX, 2, PD, RW).is_err());
        let msg = t
            .register(Arc::clone(&r), 0, 64, PD, AccessFlags::REMOTE_WRITE)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("LOCAL_WRITE"), "{msg}");
        let mut top_table = KeyTable::<AtTheTop>::with_seed(7);
        assert!(
            top_table
                .register(Arc::new(AtTheTop), 0, 4096, PD, RW)
                .is_err(),
            "address overflow"
        );
        assert!(t.is_empty());
    }

    /// Issue 15 bug 2: a peer cannot end a plain registration; every
    /// refusal leaves the table as it was, and the owner still can.
    #[test]
    fn remote_invalidation_of_a_plain_registration_is_refused() {
        let mut t: KeyTable<HeapMemory> = KeyTable::with_seed(9);
        let k = t.register(region(4096), 0, 4096, PD, RW).unwrap();
        let other = t.register(region(4096), 0, 4096, PdHandle(2), RW).unwrap();
        assert_eq!(t.kind(k.rkey), Ok(MrKind::Registered));
        assert!(!MrKind::Registered.remote_invalidate());
        let raw = k.rkey.get();
        assert_eq!(
            t.invalidate_remote(k.rkey, PD).map(drop),
            Err(KeyError::NotRemotelyInvalidatable {
                key: raw,
                kind: MrKind::Registered
            })
        );
        assert!(matches!(
            t.invalidate_remote(other.rkey, PD),
            Err(KeyError::WrongPd {
                registered: 2,
                used: 1,
                ..
            })
        ));
        assert!(matches!(
            t.invalidate_remote(Rkey(raw ^ 1), PD),
            Err(KeyError::Stale { .. })
        ));
        assert!(matches!(
            t.invalidate_remote(Rkey::from_parts(999, 0), PD),
            Err(KeyError::Unknown { index: 999, .. })
        ));
        assert_eq!(t.len(), 2);
        assert!(
            t.lookup(k.rkey, PD, k.start, 4096, AccessFlags::REMOTE_WRITE)
                .is_ok()
        );
        // The owner's deregistration still works.
        assert!(t.invalidate(k.lkey).is_ok());
        assert_eq!(t.len(), 1);
    }
}
