//! The `cfg(test)` twin of `sys.rs`: identical signatures, a scripted kernel.
//!
//! Mappings are real heap allocations (so regions built on the fake can be
//! read and written), but which hugepage sizes exist, which node each page
//! reports, what `RLIMIT_MEMLOCK` is and what sysfs/procfs contain are set per
//! test through [`script`]. Every call is logged ([`calls`]) and can be
//! observed as it happens ([`set_observer`]), which is how the teardown-order
//! test sees the state at each step. State is thread-local: each test runs on
//! its own thread and sees only its own script.

use std::alloc::{self, Layout};
use std::cell::RefCell;
use std::collections::HashMap;
use std::io;
use std::ptr::NonNull;

/// Same type as the real module's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MapKind {
    /// Base pages.
    Base,
    /// 2 MiB hugetlb.
    HugeTlb2M,
    /// 1 GiB hugetlb.
    HugeTlb1G,
}

/// Same type as the real module's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct MemPolicy {
    pub(crate) mode: i32,
    pub(crate) nodes: Vec<libc::c_ulong>,
}

/// One logged call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Call {
    Mmap { kind: MapKind, len: usize },
    Munmap { addr: usize, len: usize },
    MadviseHugepage { addr: usize, len: usize },
    Populate { addr: usize, len: usize },
    Mbind { addr: usize, len: usize, node: u32 },
    QueryNodes { pages: usize },
    Mlock { addr: usize, len: usize },
    Munlock { addr: usize, len: usize },
}

/// What the scripted kernel answers.
pub(crate) struct Script {
    /// Whether 2 MiB / 1 GiB hugetlb mmaps succeed (else `ENOMEM`).
    pub(crate) hugetlb_2m: bool,
    pub(crate) hugetlb_1g: bool,
    /// errno for `MADV_POPULATE_WRITE`, if it should fail.
    pub(crate) populate_errno: Option<i32>,
    /// errno for `mbind`, if it should fail.
    pub(crate) mbind_errno: Option<i32>,
    /// errno for `mlock`, if it should fail.
    pub(crate) mlock_errno: Option<i32>,
    /// The node `move_pages` reports for the page at index `i` of a query
    /// (negative: an errno such as `-ENOENT`). `None`: the node last bound
    /// with `mbind`, or 0.
    pub(crate) page_node: Option<Box<dyn Fn(usize) -> i32>>,
    /// Soft `RLIMIT_MEMLOCK`.
    pub(crate) memlock_limit: u64,
    /// sysfs/procfs contents by path; other paths are `ENOENT`.
    pub(crate) files: HashMap<String, String>,
}

impl Default for Script {
    fn default() -> Self {
        let mut files = HashMap::new();
        files.insert("/sys/devices/system/node/online".into(), "0\n".into());
        files.insert(
            "/sys/kernel/mm/transparent_hugepage/enabled".into(),
            "always [madvise] never\n".into(),
        );
        files.insert(
            "/proc/self/status".into(),
            "Name:\ttest\nVmLck:\t       0 kB\nCapEff:\t0000000000000000\n".into(),
        );
        Script {
            hugetlb_2m: true,
            hugetlb_1g: false,
            populate_errno: None,
            mbind_errno: None,
            mlock_errno: None,
            page_node: None,
            memlock_limit: u64::MAX,
            files,
        }
    }
}

/// A callback run on every call as it is made.
type Observer = Box<dyn FnMut(&Call)>;

struct State {
    script: Script,
    calls: Vec<Call>,
    observer: Option<Observer>,
    live: HashMap<usize, Layout>,
    bound_node: Option<u32>,
}

thread_local! {
    static STATE: RefCell<State> = RefCell::new(State {
        script: Script::default(),
        calls: Vec::new(),
        observer: None,
        live: HashMap::new(),
        bound_node: None,
    });
}

/// Change this thread's script.
pub(crate) fn script(f: impl FnOnce(&mut Script)) {
    STATE.with(|s| f(&mut s.borrow_mut().script));
}

/// The calls this thread made so far.
pub(crate) fn calls() -> Vec<Call> {
    STATE.with(|s| s.borrow().calls.clone())
}

/// Call `f` on every call, as it is made.
pub(crate) fn set_observer(f: impl FnMut(&Call) + 'static) {
    STATE.with(|s| s.borrow_mut().observer = Some(Box::new(f)));
}

/// Number of fake mappings still alive on this thread.
pub(crate) fn live_mappings() -> usize {
    STATE.with(|s| s.borrow().live.len())
}

fn log(call: Call) {
    // Take the observer out while it runs so it may inspect other state.
    let observer = STATE.with(|s| {
        let mut s = s.borrow_mut();
        s.calls.push(call.clone());
        s.observer.take()
    });
    if let Some(mut f) = observer {
        f(&call);
        STATE.with(|s| s.borrow_mut().observer = Some(f));
    }
}

fn err(code: i32) -> io::Error {
    io::Error::from_raw_os_error(code)
}

pub(crate) fn base_page_size() -> usize {
    4096
}

fn alloc_mapping(len: usize, align: usize) -> io::Result<NonNull<u8>> {
    let layout = Layout::from_size_align(len, align).map_err(|_| err(libc::EINVAL))?;
    if len == 0 {
        return Err(err(libc::EINVAL));
    }
    // SAFETY: the layout has a non-zero size (checked above).
    let ptr = unsafe { alloc::alloc_zeroed(layout) };
    let ptr = NonNull::new(ptr).ok_or_else(|| err(libc::ENOMEM))?;
    STATE.with(|s| s.borrow_mut().live.insert(ptr.as_ptr() as usize, layout));
    Ok(ptr)
}

pub(crate) fn mmap_anonymous(len: usize, kind: MapKind) -> io::Result<NonNull<u8>> {
    log(Call::Mmap { kind, len });
    let (ok, align) = STATE.with(|s| {
        let s = s.borrow();
        match kind {
            MapKind::Base => (true, 4096),
            MapKind::HugeTlb2M => (s.script.hugetlb_2m, 2 << 20),
            MapKind::HugeTlb1G => (s.script.hugetlb_1g, 1 << 30),
        }
    });
    if !ok {
        return Err(err(libc::ENOMEM));
    }
    if !len.is_multiple_of(align) {
        return Err(err(libc::EINVAL));
    }
    alloc_mapping(len, align)
}

pub(crate) fn mmap_anonymous_aligned(len: usize, align: usize) -> io::Result<NonNull<u8>> {
    log(Call::Mmap {
        kind: MapKind::Base,
        len,
    });
    alloc_mapping(len, align)
}

/// # Safety
///
/// As the real `munmap`: the range must be a whole fake mapping the caller
/// owns, and unused afterwards. (The fake only frees whole mappings and
/// panics on anything else, which catches double frees in tests.)
pub(crate) unsafe fn munmap(addr: NonNull<u8>, len: usize) -> io::Result<()> {
    log(Call::Munmap {
        addr: addr.as_ptr() as usize,
        len,
    });
    let layout = STATE.with(|s| s.borrow_mut().live.remove(&(addr.as_ptr() as usize)));
    let layout = layout.unwrap_or_else(|| panic!("fake munmap of {addr:?}: not a live mapping"));
    assert_eq!(
        layout.size(),
        len,
        "fake munmap with a different length than mmap"
    );
    // SAFETY: `addr` came from `alloc_zeroed` with exactly this layout (the
    // live map says so) and the caller no longer uses it.
    unsafe { alloc::dealloc(addr.as_ptr(), layout) };
    Ok(())
}

pub(crate) fn madvise_hugepage(addr: NonNull<u8>, len: usize) -> io::Result<()> {
    log(Call::MadviseHugepage {
        addr: addr.as_ptr() as usize,
        len,
    });
    Ok(())
}

pub(crate) fn populate_write(addr: NonNull<u8>, len: usize) -> io::Result<()> {
    log(Call::Populate {
        addr: addr.as_ptr() as usize,
        len,
    });
    match STATE.with(|s| s.borrow().script.populate_errno) {
        Some(code) => Err(err(code)),
        None => Ok(()),
    }
}

pub(crate) fn mbind_bind(addr: NonNull<u8>, len: usize, node: u32) -> io::Result<()> {
    log(Call::Mbind {
        addr: addr.as_ptr() as usize,
        len,
        node,
    });
    STATE.with(|s| {
        let mut s = s.borrow_mut();
        match s.script.mbind_errno {
            Some(code) => Err(err(code)),
            None => {
                s.bound_node = Some(node);
                Ok(())
            }
        }
    })
}

pub(crate) fn mempolicy_of(_addr: NonNull<u8>) -> io::Result<MemPolicy> {
    let bound = STATE.with(|s| s.borrow().bound_node);
    Ok(match bound {
        Some(node) => {
            let mut nodes: Vec<libc::c_ulong> = vec![0; 16];
            nodes[node as usize / 64] |= 1 << (node % 64);
            MemPolicy {
                mode: libc::MPOL_BIND,
                nodes,
            }
        }
        None => MemPolicy {
            mode: libc::MPOL_DEFAULT,
            nodes: vec![0; 16],
        },
    })
}

pub(crate) fn query_page_nodes(pages: &[usize], status: &mut [i32]) -> io::Result<()> {
    log(Call::QueryNodes { pages: pages.len() });
    if pages.len() != status.len() {
        return Err(err(libc::EINVAL));
    }
    STATE.with(|s| {
        let s = s.borrow();
        let default = s.bound_node.map_or(0, |n| n as i32);
        for (i, st) in status.iter_mut().enumerate() {
            *st = s.script.page_node.as_ref().map_or(default, |f| f(i));
        }
    });
    Ok(())
}

pub(crate) fn mlock(addr: NonNull<u8>, len: usize) -> io::Result<()> {
    log(Call::Mlock {
        addr: addr.as_ptr() as usize,
        len,
    });
    match STATE.with(|s| s.borrow().script.mlock_errno) {
        Some(code) => Err(err(code)),
        None => Ok(()),
    }
}

pub(crate) fn munlock(addr: NonNull<u8>, len: usize) -> io::Result<()> {
    log(Call::Munlock {
        addr: addr.as_ptr() as usize,
        len,
    });
    Ok(())
}

pub(crate) fn memlock_limit() -> io::Result<u64> {
    Ok(STATE.with(|s| s.borrow().script.memlock_limit))
}

pub(crate) fn read_file(path: &str) -> io::Result<String> {
    STATE
        .with(|s| s.borrow().script.files.get(path).cloned())
        .ok_or_else(|| err(libc::ENOENT))
}
