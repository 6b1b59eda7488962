//! `KeyTable::lookup` never allocates: the software responder calls it on
//! every remote access. A counting global allocator observes the calling
//! thread while lookups (hits and every kind of miss) run.
#![allow(clippy::unwrap_used)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;

use rnic_core::HeapMemory;
use rnic_dma::{AccessFlags, KeyTable, PdHandle, Rkey};

struct Counting;

thread_local! {
    static ARMED: Cell<bool> = const { Cell::new(false) };
    static COUNT: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: forwards every call unchanged to the System allocator, which upholds
// GlobalAlloc's contract; the counting touches only const-initialized
// thread-locals, which never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if ARMED.with(Cell::get) {
            COUNT.with(|c| c.set(c.get() + 1));
        }
        // SAFETY: forwarded with the caller's (valid, non-zero-size) layout.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn lookups_hit_and_miss_without_allocating() {
    let mem = Arc::new(HeapMemory::new(1 << 16));
    let mut table = KeyTable::<HeapMemory>::with_seed(11);
    let rw = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let keys: Vec<_> = (0..64)
        .map(|_| {
            table
                .register(Arc::clone(&mem), 0, 1 << 16, PdHandle(1), rw)
                .unwrap()
        })
        .collect();
    let stale = keys[5];
    table.invalidate(stale.rkey).unwrap();
    let reused = table
        .register(Arc::clone(&mem), 0, 4096, PdHandle(1), rw)
        .unwrap();
    assert_eq!(reused.rkey.index(), stale.rkey.index());

    ARMED.with(|a| a.set(true));
    let mut ok = 0;
    let mut refused = 0;
    for k in &keys {
        let s = k.start;
        for (key, pd, va, len, acc) in [
            (k.rkey, PdHandle(1), s + 64, 128, AccessFlags::REMOTE_WRITE),
            (k.rkey, PdHandle(2), s, 8, AccessFlags::REMOTE_WRITE),
            (k.rkey, PdHandle(1), s, 8, AccessFlags::REMOTE_READ),
            (
                k.rkey,
                PdHandle(1),
                s + (1 << 16),
                1,
                AccessFlags::REMOTE_WRITE,
            ),
            (k.rkey, PdHandle(1), u64::MAX, 2, AccessFlags::REMOTE_WRITE),
            (
                Rkey::from_parts(9999, 1),
                PdHandle(1),
                s,
                8,
                AccessFlags::REMOTE_WRITE,
            ),
        ] {
            match table.lookup(key, pd, va, len, acc) {
                Ok(_) => ok += 1,
                Err(_) => refused += 1,
            }
        }
    }
    ARMED.with(|a| a.set(false));
    assert_eq!(COUNT.with(Cell::get), 0, "lookup allocated");
    // 63 live keys hit once each; key 5 is stale (its index was reused).
    assert_eq!(ok, 63);
    assert_eq!(refused, 64 * 6 - 63);
}
