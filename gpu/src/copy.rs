//! The copy-engine interface between host staging buffers and device memory,
//! and [`HostEngine`], an engine whose "device memory" is host memory.
//!
//! A [`CopyEngine`] is one device context with one in-order copy queue
//! (CUDA: a context and a stream). It allocates device memory, registers
//! host staging buffers (CUDA: `cuMemHostRegister`, without which an "async"
//! copy is staged and synchronous), queues copies between them and hands
//! back a [`Fence`] per copy. Copies finish in queue order; `wait(f)` returns
//! once the copy that returned `f` and every one before it have finished.
//!
//! [`HostEngine`] implements the same contract with host memory standing in
//! for VRAM, so the staging logic above it ([`crate::StagedMemory`]) is
//! tested on machines without a GPU. It is genuinely deferred: a queued
//! copy runs only when a `wait` reaches it, reading its source *then* — so a
//! caller that reuses a staging slot before waiting, or reports a write done
//! before its copy ran, sees wrong bytes in the tests, exactly as it would on
//! a GPU. It also records the teardown order (device buffer freed, staging
//! unregistered, context released) for the tests to check.

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use rnic_core::memory::check_range;
use rnic_core::{HeapMemory, MemAccess, Memory};
use rnic_dma::DmaRegion;

use crate::error::GpuError;

/// Marks a queued copy; see [`CopyEngine::wait`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Fence(pub u64);

/// One device context with one in-order copy queue; see the module docs.
///
/// # Safety
///
/// Implementors promise that when [`CopyEngine::wait`] of a fence returned
/// `Ok`, the copy that returned it and every copy queued before it have
/// finished reading their source and writing their destination; that
/// [`CopyEngine::free`] returns only once the device no longer touches the
/// allocation; and that [`CopyEngine::unregister_host`] returns only once no
/// queued copy touches the buffer. Callers free staging memory right after
/// these, so a lying engine lets the device write into freed memory.
pub unsafe trait CopyEngine: Send + Sync + fmt::Debug + 'static {
    /// A device allocation.
    type Alloc: fmt::Debug + Send + Sync;

    /// One line: the engine and its device.
    fn describe(&self) -> String;

    /// Allocate `len` bytes of device memory (contents unspecified).
    fn alloc(&self, len: usize) -> Result<Self::Alloc, GpuError>;

    /// The device address of byte 0 of `a`.
    fn device_addr(&self, a: &Self::Alloc) -> u64;

    /// Free `a` (every copy touching it has been waited for).
    fn free(&self, a: Self::Alloc) -> Result<(), GpuError>;

    /// Make `region` a valid source and destination of queued copies
    /// (CUDA: `cuMemHostRegister`).
    fn register_host(&self, region: &DmaRegion) -> Result<(), GpuError>;

    /// Undo [`CopyEngine::register_host`] (every copy touching the region
    /// has been waited for).
    fn unregister_host(&self, region: &DmaRegion) -> Result<(), GpuError>;

    /// Queue a copy of `len` bytes from byte `src_off` of the registered
    /// `src` to byte `dst_off` of `dst`. The engine keeps `src` alive until
    /// the copy has finished.
    ///
    /// # Safety
    ///
    /// Both ranges lie inside their buffers, and nobody writes
    /// `src[src_off..src_off + len]` until `wait` of the returned fence
    /// returned.
    unsafe fn to_device(
        &self,
        dst: &Self::Alloc,
        dst_off: usize,
        src: &Arc<DmaRegion>,
        src_off: usize,
        len: usize,
    ) -> Result<Fence, GpuError>;

    /// Queue a copy of `len` bytes from byte `src_off` of `src` to byte
    /// `dst_off` of the registered `dst`. The engine keeps `dst` alive until
    /// the copy has finished.
    ///
    /// # Safety
    ///
    /// Both ranges lie inside their buffers, and nobody reads or writes
    /// `dst[dst_off..dst_off + len]` until `wait` of the returned fence
    /// returned.
    unsafe fn to_host(
        &self,
        dst: &Arc<DmaRegion>,
        dst_off: usize,
        src: &Self::Alloc,
        src_off: usize,
        len: usize,
    ) -> Result<Fence, GpuError>;

    /// Wait until the copy that returned `f`, and every copy queued before
    /// it, has finished.
    fn wait(&self, f: Fence) -> Result<(), GpuError>;

    /// Wait for every queued copy.
    fn wait_all(&self) -> Result<(), GpuError>;
}

/// What a [`HostEngine`] did to its resources, in order (shared, so it can
/// be read after the engine is gone).
#[derive(Clone, Debug, Default)]
pub struct EngineLog(Arc<Mutex<Vec<String>>>);

impl EngineLog {
    fn push(&self, what: String) {
        lock(&self.0).push(what);
    }

    /// Every entry so far.
    pub fn entries(&self) -> Vec<String> {
        lock(&self.0).clone()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section leaves its data consistent before it can panic.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The host buffers registered with an engine, by start address and length.
#[derive(Debug, Default)]
pub(crate) struct Registrations(Mutex<Vec<(usize, usize)>>);

impl Registrations {
    /// Record `region`; `false` when it was already registered.
    pub(crate) fn add(&self, region: &DmaRegion) -> bool {
        let addr = region.as_ptr() as usize;
        let mut r = lock(&self.0);
        if r.iter().any(|(a, _)| *a == addr) {
            return false;
        }
        r.push((addr, region.len()));
        true
    }

    /// Forget `region`; `false` when it was not registered.
    pub(crate) fn remove(&self, region: &DmaRegion) -> bool {
        let addr = region.as_ptr() as usize;
        let mut r = lock(&self.0);
        let before = r.len();
        r.retain(|(a, _)| *a != addr);
        r.len() != before
    }

    /// `[off, off + len)` of `region` is a registered host range of engine
    /// `engine` (named for the error).
    pub(crate) fn check(
        &self,
        engine: impl FnOnce() -> String,
        region: &DmaRegion,
        off: usize,
        len: usize,
    ) -> Result<(), GpuError> {
        let addr = region.as_ptr() as usize;
        let found = lock(&self.0)
            .iter()
            .find(|(a, _)| *a == addr)
            .map(|&(_, l)| l);
        match found {
            Some(rlen) => Ok(check_range(MemAccess::Read, off, len, rlen)?),
            None => Err(GpuError::NotRegistered {
                engine: engine(),
                addr,
            }),
        }
    }
}

/// A [`HostEngine`] allocation: host memory standing in for VRAM.
#[derive(Clone, Debug)]
pub struct HostAlloc {
    mem: Arc<HeapMemory>,
    id: u64,
}

impl HostAlloc {
    /// The "device" bytes, as a device-side user (a GPU kernel) sees them:
    /// reads and writes here bypass the staging and the copy queue.
    pub fn device_view(&self) -> &Arc<HeapMemory> {
        &self.mem
    }
}

/// A queued copy: `len` bytes from `src` at `src_off` to `dst` at
/// `dst_off`; `host` is the registered host buffer it touches.
struct Op {
    src: Arc<dyn Memory>,
    src_off: usize,
    dst: Arc<dyn Memory>,
    dst_off: usize,
    len: usize,
    host: usize,
}

impl Op {
    fn run(self) -> Result<(), GpuError> {
        let mut tmp = vec![0u8; self.len];
        self.src.read(self.src_off, &mut tmp)?;
        self.dst.write(self.dst_off, &tmp)?;
        Ok(())
    }
}

#[derive(Default)]
struct HostState {
    queue: VecDeque<(u64, Op)>,
    next: u64,
    done: u64,
    next_alloc: u64,
    /// Copies queued so far (for tests and reports).
    queued: u64,
}

/// The host-memory copy engine; see the module docs.
pub struct HostEngine {
    state: Mutex<HostState>,
    registered: Registrations,
    log: EngineLog,
}

impl fmt::Debug for HostEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = lock(&self.state);
        f.debug_struct("HostEngine")
            .field("pending", &s.queue.len())
            .field("done", &s.done)
            .finish()
    }
}

impl HostEngine {
    /// A fresh engine ("context created" is its first log entry).
    pub fn new() -> Arc<HostEngine> {
        let log = EngineLog::default();
        log.push("context created".into());
        Arc::new(HostEngine {
            state: Mutex::new(HostState {
                next: 1,
                ..HostState::default()
            }),
            registered: Registrations::default(),
            log,
        })
    }

    /// The engine's log (what it allocated, registered, freed, released).
    pub fn log(&self) -> EngineLog {
        self.log.clone()
    }

    /// Copies queued and not yet run.
    pub fn pending(&self) -> usize {
        lock(&self.state).queue.len()
    }

    /// Copies queued since the engine was made.
    pub fn queued(&self) -> u64 {
        lock(&self.state).queued
    }

    fn run_until(&self, s: &mut HostState, f: u64) -> Result<(), GpuError> {
        while let Some((seq, _)) = s.queue.front() {
            if *seq > f {
                break;
            }
            let Some((seq, op)) = s.queue.pop_front() else {
                break;
            };
            op.run()?;
            s.done = seq;
        }
        s.done = s.done.max(f.min(s.next - 1));
        Ok(())
    }

    fn queue(&self, op: Op) -> Fence {
        let mut s = lock(&self.state);
        let seq = s.next;
        s.next += 1;
        s.queued += 1;
        s.queue.push_back((seq, op));
        Fence(seq)
    }
}

impl Drop for HostEngine {
    fn drop(&mut self) {
        self.log.push("context released".into());
    }
}

// SAFETY: copies run (under the state lock) only inside `wait`/`wait_all`,
// which return after running every copy up to the fence; `free` and
// `unregister_host` run every queued copy touching the buffer first, and the
// queued operations hold `Arc`s of their buffers, so nothing is touched after
// it was freed.
unsafe impl CopyEngine for HostEngine {
    type Alloc = HostAlloc;

    fn describe(&self) -> String {
        "host engine (host memory standing in for VRAM)".into()
    }

    fn alloc(&self, len: usize) -> Result<HostAlloc, GpuError> {
        let mut s = lock(&self.state);
        s.next_alloc += 1;
        let id = s.next_alloc;
        drop(s);
        self.log.push(format!("alloc {id} ({len} bytes)"));
        Ok(HostAlloc {
            mem: Arc::new(HeapMemory::new(len)),
            id,
        })
    }

    fn device_addr(&self, a: &HostAlloc) -> u64 {
        a.mem.addr()
    }

    fn free(&self, a: HostAlloc) -> Result<(), GpuError> {
        let mut s = lock(&self.state);
        let last = s.next - 1;
        self.run_until(&mut s, last)?;
        drop(s);
        self.log.push(format!("free {}", a.id));
        Ok(())
    }

    fn register_host(&self, region: &DmaRegion) -> Result<(), GpuError> {
        if !self.registered.add(region) {
            return Err(GpuError::Unsupported {
                what: "registering a host buffer twice",
                why: "the range is already registered (register each staging buffer once)".into(),
            });
        }
        self.log
            .push(format!("register host buffer ({} bytes)", region.len()));
        Ok(())
    }

    fn unregister_host(&self, region: &DmaRegion) -> Result<(), GpuError> {
        let addr = region.as_ptr() as usize;
        let mut s = lock(&self.state);
        if let Some(last) = s
            .queue
            .iter()
            .rev()
            .find(|(_, op)| op.host == addr)
            .map(|(seq, _)| *seq)
        {
            self.run_until(&mut s, last)?;
        }
        drop(s);
        if !self.registered.remove(region) {
            return Err(GpuError::NotRegistered {
                engine: "host engine".into(),
                addr,
            });
        }
        self.log
            .push(format!("unregister host buffer ({} bytes)", region.len()));
        Ok(())
    }

    unsafe fn to_device(
        &self,
        dst: &HostAlloc,
        dst_off: usize,
        src: &Arc<DmaRegion>,
        src_off: usize,
        len: usize,
    ) -> Result<Fence, GpuError> {
        self.registered
            .check(|| "host engine".into(), src, src_off, len)?;
        check_range(MemAccess::Write, dst_off, len, dst.mem.len())?;
        Ok(self.queue(Op {
            src: src.clone(),
            src_off,
            dst: dst.mem.clone(),
            dst_off,
            len,
            host: src.as_ptr() as usize,
        }))
    }

    unsafe fn to_host(
        &self,
        dst: &Arc<DmaRegion>,
        dst_off: usize,
        src: &HostAlloc,
        src_off: usize,
        len: usize,
    ) -> Result<Fence, GpuError> {
        self.registered
            .check(|| "host engine".into(), dst, dst_off, len)?;
        check_range(MemAccess::Read, src_off, len, src.mem.len())?;
        Ok(self.queue(Op {
            src: src.mem.clone(),
            src_off,
            dst: dst.clone(),
            dst_off,
            len,
            host: dst.as_ptr() as usize,
        }))
    }

    fn wait(&self, f: Fence) -> Result<(), GpuError> {
        let mut s = lock(&self.state);
        self.run_until(&mut s, f.0)
    }

    fn wait_all(&self) -> Result<(), GpuError> {
        let mut s = lock(&self.state);
        let last = s.next - 1;
        self.run_until(&mut s, last)
    }
}
