//! Protection domains, memory regions and address handles:
//! `ibv_alloc_pd` / `ibv_dealloc_pd`, `ibv_reg_mr` (and `_iova`, `_iova2`,
//! `ibv_rereg_mr`, `ibv_dereg_mr`), `ibv_create_ah` (and `_from_wc`,
//! `ibv_init_ah_from_wc`, `ibv_destroy_ah`).

use std::ffi::{c_int, c_uint, c_void};
use std::net::Ipv4Addr;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

use rnic::core::{
    AccessFlags, AddressHandle, AddressVector, Gid, MemoryRegion, ProtectionDomain, VerbsError,
};

use crate::abi::{
    IBV_ACCESS_HUGETLB, IBV_ACCESS_ON_DEMAND, IBV_ACCESS_OPTIONAL_RANGE, IBV_ACCESS_RNIC,
    IBV_ACCESS_ZERO_BASED, IBV_WC_GRH, Shared, ibv_ah, ibv_ah_attr, ibv_context, ibv_gid, ibv_mr,
    ibv_pd, ibv_wc, zeroed,
};
use crate::context::Context;
use crate::memory::{RangeError, UserMemory};
use crate::{errno_of, fail, fail_neg, fail_null, warn};

/// Handles (`ibv_pd.handle`, `ibv_mr.handle`, …): unique per process.
pub fn next_handle() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A protection domain.
#[repr(C)]
#[derive(Debug)]
pub struct Pd {
    /// The C structure.
    pub c: Shared<ibv_pd>,
    /// Its context (kept allocated while this exists).
    pub ctx: NonNull<Context>,
    /// rnic's domain.
    pub pd: ProtectionDomain,
    /// MRs, QPs and AHs in it (`ibv_dealloc_pd` refuses while any is left).
    pub children: AtomicUsize,
}

impl Pd {
    /// The PD behind an `ibv_pd *` of this library.
    ///
    /// # Safety
    ///
    /// `pd` came from [`ibv_alloc_pd`] and was not deallocated.
    pub unsafe fn from_ptr<'a>(pd: *mut ibv_pd) -> &'a Pd {
        // SAFETY: the C struct is the first field of a repr(C) Pd; the caller
        // guarantees it is live.
        unsafe { &*pd.cast::<Pd>() }
    }

    /// Its context.
    pub fn ctx(&self) -> &Context {
        // SAFETY: a context outlives its PDs (`ibv_close_device` keeps it
        // while they exist).
        unsafe { self.ctx.as_ref() }
    }
}

/// `ibv_alloc_pd`.
///
/// # Safety
///
/// `ctx` is an open context of this library.
pub unsafe extern "C" fn ibv_alloc_pd(ctx: *mut ibv_context) -> *mut ibv_pd {
    if ctx.is_null() {
        return fail_null(libc::EINVAL);
    }
    // SAFETY: the caller's open context.
    let c = unsafe { Context::from_ptr(ctx) };
    match c.rnic.alloc_pd() {
        Ok(pd) => {
            c.adopt();
            let obj = Box::new(Pd {
                c: Shared::new(ibv_pd {
                    context: ctx,
                    handle: next_handle(),
                }),
                ctx: NonNull::from(c),
                pd,
                children: AtomicUsize::new(0),
            });
            Box::leak(obj).c.get()
        }
        Err(e) => {
            warn(format_args!("ibv_alloc_pd: {e}"));
            fail_null(errno_of(&e))
        }
    }
}

/// `ibv_dealloc_pd`: `EBUSY` while MRs, QPs or AHs are in it.
///
/// # Safety
///
/// `pd` is a live PD of this library.
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    if pd.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: the caller's live PD.
    let p = unsafe { Pd::from_ptr(pd) };
    if p.children.load(Ordering::Acquire) != 0 {
        return fail(libc::EBUSY);
    }
    p.ctx().release();
    // SAFETY: leaked from a Box by `ibv_alloc_pd`; nothing refers to it.
    drop(unsafe { Box::from_raw(pd.cast::<Pd>()) });
    0
}

/// A memory region.
#[repr(C)]
#[derive(Debug)]
pub struct Mr {
    /// The C structure.
    pub c: Shared<ibv_mr>,
    /// Its PD.
    pub pd: NonNull<Pd>,
    /// rnic's region and the memory behind it (`None` only while
    /// `ibv_rereg_mr` swaps them).
    reg: Option<(MemoryRegion, Arc<UserMemory>)>,
}

/// Why a registration was refused, as an errno and a sentence.
fn check_access(access: c_uint) -> Result<AccessFlags, (c_int, &'static str)> {
    if access & IBV_ACCESS_ON_DEMAND != 0 {
        return Err((
            libc::EOPNOTSUPP,
            "IBV_ACCESS_ON_DEMAND: rnic devices report no ODP capability; register without it",
        ));
    }
    // MW_BIND only allows binding memory windows (none can be allocated
    // here); HUGETLB is a hint; the optional range may be ignored by
    // definition.
    let ignored = (1 << 4) | IBV_ACCESS_HUGETLB | IBV_ACCESS_ZERO_BASED | IBV_ACCESS_OPTIONAL_RANGE;
    if access & !(IBV_ACCESS_RNIC | ignored) != 0 {
        return Err((libc::EINVAL, "unknown access flags"));
    }
    AccessFlags::from_bits_truncate(access & IBV_ACCESS_RNIC)
        .validate()
        .map_err(|_| {
            (
                libc::EINVAL,
                "REMOTE_WRITE or REMOTE_ATOMIC need LOCAL_WRITE too",
            )
        })
}

/// Register `len` bytes at `addr`, named `iova` in the region.
fn register(
    p: &Pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_uint,
) -> Result<(MemoryRegion, Arc<UserMemory>), (c_int, String)> {
    let flags = check_access(access).map_err(|(e, m)| (e, m.to_owned()))?;
    let base = if access & IBV_ACCESS_ZERO_BASED != 0 {
        0
    } else {
        iova
    };
    // mlx5 maps whole pages: the region's address may differ from the
    // memory's only by whole pages there (rnic-mlx5's MTT).
    if base != addr as u64 && p.ctx().backend() != "rxe" && (base ^ addr as u64) & 0xfff != 0 {
        return Err((
            libc::EOPNOTSUPP,
            format!(
                "an iova other than the address (by other than whole 4 KiB pages) is supported \
                 on rxe devices only, not {}",
                p.ctx().backend()
            ),
        ));
    }
    let writable = flags.intersects(AccessFlags::LOCAL_WRITE);
    // SAFETY: the application keeps the range mapped while it is
    // registered (the verbs contract); `ibv_dereg_mr` revokes before
    // returning.
    let mem = unsafe { UserMemory::new(addr as usize, len, base, writable) }.map_err(|e| match e {
        RangeError::Unmapped => (libc::EFAULT, format!("{len} bytes at {addr:p} are not all mapped")),
        RangeError::ReadOnly => (
            libc::EFAULT,
            format!("{len} bytes at {addr:p} are not all writable, and the region asks for write access"),
        ),
    })?;
    let mem = Arc::new(mem);
    // On mlx5 rnic-mlx5 maps the application's pages into the function's
    // IOMMU domain in place (UserMemory names its host address); rxe reaches
    // them through UserMemory's checked accesses.
    let mr = p.pd.reg_mr(Arc::clone(&mem), flags).map_err(|e| match e {
        VerbsError::UnreachableMemory { backend, domain } => (
            libc::EOPNOTSUPP,
            format!("the {backend} backend cannot reach this memory (it takes {domain})"),
        ),
        e => (errno_of(&e), e.to_string()),
    })?;
    Ok((mr, mem))
}

fn reg(pd: *mut ibv_pd, addr: *mut c_void, len: usize, iova: u64, access: c_uint) -> *mut ibv_mr {
    if pd.is_null() {
        return fail_null(libc::EINVAL);
    }
    // SAFETY: the caller's live PD.
    let p = unsafe { Pd::from_ptr(pd) };
    match register(p, addr, len, iova, access) {
        Ok((mr, mem)) => {
            p.children.fetch_add(1, Ordering::AcqRel);
            let c = ibv_mr {
                context: p.ctx().as_ptr(),
                pd,
                addr,
                length: len,
                handle: next_handle(),
                lkey: mr.lkey().get(),
                rkey: mr.rkey().get(),
            };
            let obj = Box::new(Mr {
                c: Shared::new(c),
                pd: NonNull::from(p),
                reg: Some((mr, mem)),
            });
            Box::leak(obj).c.get()
        }
        Err((e, msg)) => {
            warn(format_args!(
                "ibv_reg_mr({addr:p}, {len}, access {access:#x}): {msg}"
            ));
            fail_null(e)
        }
    }
}

/// `ibv_reg_mr@@IBVERBS_1.1` (the header's `ibv_reg_mr` macro calls it for
/// constant access flags without optional bits).
///
/// # Safety
///
/// `pd` is a live PD; `addr..addr + length` is the application's memory.
pub unsafe extern "C" fn ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut ibv_mr {
    reg(pd, addr, length, addr as u64, access as c_uint)
}

/// `ibv_reg_mr_iova`.
///
/// # Safety
///
/// As [`ibv_reg_mr`].
pub unsafe extern "C" fn ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    reg(pd, addr, length, iova, access as c_uint)
}

/// `ibv_reg_mr_iova2` (what the `ibv_reg_mr` macro calls when the flags may
/// hold optional bits; perftest passes `IBV_ACCESS_RELAXED_ORDERING`).
///
/// # Safety
///
/// As [`ibv_reg_mr`].
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_uint,
) -> *mut ibv_mr {
    reg(pd, addr, length, iova, access)
}

/// Revoke and drop `m`'s registration: after this, rnic never touches the
/// memory (a queue pair may keep the key registered; accesses through it
/// fail).
fn unregister(m: &mut Mr) {
    if let Some((mr, mem)) = m.reg.take() {
        mem.revoke();
        // mlx5: the device reaches the pages without the CPU-side check, so
        // the key is destroyed and the pages unmapped (given back) now, not
        // when the last queue pair that named the region goes.
        if let Some(m5) = mr.driver_mr().downcast_ref::<rnic::mlx5::Mlx5Mr>()
            && let Err(e) = m5.revoke()
        {
            warn(format_args!(
                "ibv_dereg_mr: the mlx5 key could not be destroyed ({e}); its pages stay mapped"
            ));
        }
        drop(mr);
    }
}

/// `ibv_dereg_mr`.
///
/// # Safety
///
/// `mr` is a live MR of this library.
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    if mr.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: leaked from a Box by `reg`; the caller gives it up now.
    let mut m = unsafe { Box::from_raw(mr.cast::<Mr>()) };
    unregister(&mut m);
    // SAFETY: a PD outlives its MRs (dealloc refuses while they exist).
    unsafe { m.pd.as_ref() }
        .children
        .fetch_sub(1, Ordering::AcqRel);
    0
}

/// `IBV_REREG_MR_CHANGE_TRANSLATION`.
const REREG_TRANSLATION: c_int = 1;
/// `IBV_REREG_MR_CHANGE_PD`.
const REREG_PD: c_int = 2;
/// `IBV_REREG_MR_CHANGE_ACCESS`.
const REREG_ACCESS: c_int = 4;
/// `IBV_REREG_MR_ERR_INPUT`.
const REREG_ERR_INPUT: c_int = -1;
/// `IBV_REREG_MR_ERR_CMD`: the new registration failed, the old one is gone.
const REREG_ERR_CMD: c_int = -4;

/// `ibv_rereg_mr`: a new registration with the changed translation, PD or
/// rights, in the same `ibv_mr` (its keys change). 0, or an
/// `ibv_rereg_mr_err_code` with errno set.
///
/// # Safety
///
/// `mr` is a live MR; `pd` (with `IBV_REREG_MR_CHANGE_PD`) a live PD of the
/// same context; the new range is the application's memory.
pub unsafe extern "C" fn ibv_rereg_mr(
    mr: *mut ibv_mr,
    flags: c_int,
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> c_int {
    if mr.is_null() || flags == 0 || flags & !(REREG_TRANSLATION | REREG_PD | REREG_ACCESS) != 0 {
        set_errno_input();
        return REREG_ERR_INPUT;
    }
    // SAFETY: the caller's live MR, reached through its Box's address; no
    // other reference to it is live during the call.
    let m = unsafe { &mut *mr.cast::<Mr>() };
    // SAFETY: `c` is the MR's own C struct.
    let old = unsafe { &*m.c.get() };
    let new_pd = if flags & REREG_PD != 0 { pd } else { old.pd };
    let (new_addr, new_len) = if flags & REREG_TRANSLATION != 0 {
        (addr, length)
    } else {
        (old.addr, old.length)
    };
    let Some((old_mr, _)) = &m.reg else {
        set_errno_input();
        return REREG_ERR_INPUT;
    };
    let new_access = if flags & REREG_ACCESS != 0 {
        access as c_uint
    } else {
        old_mr.access().bits()
    };
    if new_pd.is_null() {
        set_errno_input();
        return REREG_ERR_INPUT;
    }
    // SAFETY: the caller's live PD.
    let p = unsafe { Pd::from_ptr(new_pd) };
    // SAFETY: the MR's PD is live (a PD outlives its MRs).
    let old_ctx = unsafe { m.pd.as_ref() }.ctx;
    if p.ctx != old_ctx {
        set_errno_input();
        return REREG_ERR_INPUT;
    }
    unregister(m);
    match register(p, new_addr, new_len, new_addr as u64, new_access) {
        Ok((new_mr, mem)) => {
            // SAFETY: both PDs are live; the MR moves between their counts.
            unsafe { m.pd.as_ref() }
                .children
                .fetch_sub(1, Ordering::AcqRel);
            p.children.fetch_add(1, Ordering::AcqRel);
            // SAFETY: the MR's own C struct; the application does not read it
            // concurrently with a call that changes it.
            unsafe {
                let c = &mut *m.c.get();
                c.pd = new_pd;
                c.addr = new_addr;
                c.length = new_len;
                c.lkey = new_mr.lkey().get();
                c.rkey = new_mr.rkey().get();
            }
            m.pd = NonNull::from(p);
            m.reg = Some((new_mr, mem));
            0
        }
        Err((e, msg)) => {
            warn(format_args!("ibv_rereg_mr: {msg}"));
            crate::set_errno(e);
            REREG_ERR_CMD
        }
    }
}

fn set_errno_input() {
    crate::set_errno(libc::EINVAL);
}

/// An address handle.
#[repr(C)]
#[derive(Debug)]
pub struct Ah {
    /// The C structure.
    pub c: Shared<ibv_ah>,
    /// Its PD.
    pub pd: NonNull<Pd>,
    /// rnic's handle.
    pub ah: AddressHandle,
}

impl Ah {
    /// The AH behind an `ibv_ah *` of this library.
    ///
    /// # Safety
    ///
    /// `ah` came from [`ibv_create_ah`] and was not destroyed.
    pub unsafe fn from_ptr<'a>(ah: *mut ibv_ah) -> &'a Ah {
        // SAFETY: the C struct is the first field of a repr(C) Ah.
        unsafe { &*ah.cast::<Ah>() }
    }
}

/// rnic's address vector of an `ibv_ah_attr`, or why there is none.
pub fn address_vector(a: &ibv_ah_attr) -> Result<AddressVector, &'static str> {
    if a.is_global == 0 {
        return Err(
            "RoCE needs a global route header: set is_global = 1 and grh.dgid (LIDs do not exist on Ethernet)",
        );
    }
    if a.port_num > 1 {
        return Err("rnic devices have one port, number 1");
    }
    // SAFETY: every bit pattern is a valid `raw` of the union.
    let dgid = Gid(unsafe { a.grh.dgid.raw });
    Ok(AddressVector {
        dgid,
        sgid_index: a.grh.sgid_index,
        hop_limit: a.grh.hop_limit,
        traffic_class: a.grh.traffic_class,
        // 20 bits on the wire; the kernel masks the rest (UCX sets all 32
        // bits: `~path_index`).
        flow_label: a.grh.flow_label & AddressVector::MAX_FLOW_LABEL,
        udp_sport: None,
        dmac: None,
    })
}

/// The `ibv_ah_attr` of an address vector.
pub fn ah_attr_of(av: &AddressVector, port: u8) -> ibv_ah_attr {
    let mut a: ibv_ah_attr = zeroed();
    a.grh.dgid = ibv_gid {
        raw: *av.dgid.raw(),
    };
    a.grh.flow_label = av.flow_label;
    a.grh.sgid_index = av.sgid_index;
    a.grh.hop_limit = av.hop_limit;
    a.grh.traffic_class = av.traffic_class;
    a.is_global = 1;
    a.port_num = port;
    a
}

/// `ibv_create_ah`.
///
/// # Safety
///
/// `pd` is a live PD; `attr` points to an `ibv_ah_attr`.
pub unsafe extern "C" fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    if pd.is_null() || attr.is_null() {
        return fail_null(libc::EINVAL);
    }
    // SAFETY: the caller's live PD.
    let p = unsafe { Pd::from_ptr(pd) };
    // SAFETY: the caller's attributes.
    let attr = unsafe { &*attr };
    let av = match address_vector(attr) {
        Ok(av) => av,
        Err(why) => {
            warn(format_args!("ibv_create_ah: {why}"));
            return fail_null(libc::EINVAL);
        }
    };
    match p.pd.create_ah(&av) {
        Ok(ah) => {
            p.children.fetch_add(1, Ordering::AcqRel);
            let obj = Box::new(Ah {
                c: Shared::new(ibv_ah {
                    context: p.ctx().as_ptr(),
                    pd,
                    handle: next_handle(),
                }),
                pd: NonNull::from(p),
                ah,
            });
            Box::leak(obj).c.get()
        }
        Err(e) => {
            warn(format_args!("ibv_create_ah: {e}"));
            fail_null(errno_of(&e))
        }
    }
}

/// `ibv_destroy_ah`.
///
/// # Safety
///
/// `ah` is a live AH of this library, named by no outstanding send.
pub unsafe extern "C" fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
    if ah.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: leaked from a Box by `ibv_create_ah`; the caller gives it up.
    let a = unsafe { Box::from_raw(ah.cast::<Ah>()) };
    // SAFETY: a PD outlives its AHs.
    unsafe { a.pd.as_ref() }
        .children
        .fetch_sub(1, Ordering::AcqRel);
    0
}

/// The IP version of the headers in a UD receive's 40-byte GRH slot (RoCE
/// v2 over IPv4 puts the IPv4 header in its last 20 bytes): 4, 6, or `None`.
fn grh_version(grh: &[u8; 40]) -> Option<u8> {
    let ip4 = &grh[20..40];
    if grh[0] >> 4 != 6 {
        return (ip4[0] >> 4 == 4).then_some(4);
    }
    if ip4[0] & 0xf != 5 {
        return Some(6);
    }
    // Version 6 in the first nibble and a 20-byte IPv4 header after it: the
    // IPv4 checksum decides.
    let mut sum: u32 = 0;
    for (i, pair) in ip4.chunks_exact(2).enumerate() {
        if i != 5 {
            sum += u32::from(u16::from_be_bytes([pair[0], pair[1]]));
        }
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    let check = !(sum as u16);
    Some(if check == u16::from_be_bytes([ip4[10], ip4[11]]) {
        4
    } else {
        6
    })
}

/// `ibv_init_ah_from_wc`: the address vector that answers the sender of
/// the UD receive `wc` whose buffer starts with `grh`. 0, or -1 with errno.
///
/// # Safety
///
/// `ctx` is an open context; `wc` a completion; `grh` the 40 bytes at the
/// start of that receive's buffer; `ah_attr` writable.
pub unsafe extern "C" fn ibv_init_ah_from_wc(
    ctx: *mut ibv_context,
    port: u8,
    wc: *mut ibv_wc,
    grh: *mut c_void,
    ah_attr: *mut ibv_ah_attr,
) -> c_int {
    if ctx.is_null() || wc.is_null() || ah_attr.is_null() {
        return fail_neg(libc::EINVAL);
    }
    // SAFETY: the caller's context.
    let c = unsafe { Context::from_ptr(ctx) };
    // SAFETY: the caller's completion.
    let wc = unsafe { &*wc };
    let mut a: ibv_ah_attr = zeroed();
    a.dlid = wc.slid;
    a.sl = wc.sl;
    a.src_path_bits = wc.dlid_path_bits;
    a.port_num = port;
    if wc.wc_flags & IBV_WC_GRH != 0 {
        if grh.is_null() {
            return fail_neg(libc::EINVAL);
        }
        let mut g = [0u8; 40];
        // SAFETY: the caller's 40-byte GRH slot.
        unsafe { std::ptr::copy_nonoverlapping(grh.cast::<u8>(), g.as_mut_ptr(), 40) };
        let flow = u32::from_be_bytes([g[0], g[1], g[2], g[3]]);
        a.grh.flow_label = flow & 0xf_ffff;
        a.is_global = 1;
        let (src, dst) = match grh_version(&g) {
            Some(4) => {
                let ip4 = &g[20..40];
                a.grh.hop_limit = ip4[8];
                a.grh.traffic_class = ip4[1];
                let s = Ipv4Addr::new(ip4[12], ip4[13], ip4[14], ip4[15]);
                let d = Ipv4Addr::new(ip4[16], ip4[17], ip4[18], ip4[19]);
                if d.is_multicast() {
                    return fail_neg(libc::EINVAL);
                }
                (Gid::from_ipv4(s), Gid::from_ipv4(d))
            }
            Some(_) => {
                if g[24] == 0xff {
                    return fail_neg(libc::EINVAL);
                }
                // Kernel rxe writes an IPv6 header (next header UDP) for
                // RoCE v2 over IPv6; rnic-rxe's engine writes the IB-style
                // GRH (next header 0x1B) for every RoCE v2 datagram. Both
                // mean RoCE v2 here: rnic speaks nothing else.
                if g[6] != libc::IPPROTO_UDP as u8 && g[6] != 0x1b {
                    return fail_neg(libc::EPROTONOSUPPORT);
                }
                a.grh.hop_limit = g[7];
                a.grh.traffic_class = ((flow >> 20) & 0xff) as u8;
                let mut s = [0u8; 16];
                let mut d = [0u8; 16];
                s.copy_from_slice(&g[8..24]);
                d.copy_from_slice(&g[24..40]);
                (Gid(s), Gid(d))
            }
            None => return fail_neg(libc::EPROTONOSUPPORT),
        };
        a.grh.dgid = ibv_gid { raw: *src.raw() };
        match c.gids.iter().find(|e| e.gid == dst) {
            Some(e) => a.grh.sgid_index = e.index as u8,
            None => return fail_neg(libc::ENOENT),
        }
    }
    // SAFETY: the caller's output.
    unsafe { ah_attr.write(a) };
    0
}

/// `ibv_create_ah_from_wc`.
///
/// # Safety
///
/// As [`ibv_init_ah_from_wc`], with a live PD.
pub unsafe extern "C" fn ibv_create_ah_from_wc(
    pd: *mut ibv_pd,
    wc: *mut ibv_wc,
    grh: *mut c_void,
    port: u8,
) -> *mut ibv_ah {
    if pd.is_null() {
        return fail_null(libc::EINVAL);
    }
    let mut a: ibv_ah_attr = zeroed();
    // SAFETY: the caller's live PD.
    let ctx = unsafe { (*pd).context };
    // SAFETY: its context is open; the caller's completion and GRH.
    let r = unsafe { ibv_init_ah_from_wc(ctx, port, wc, grh, &raw mut a) };
    if r != 0 {
        return std::ptr::null_mut();
    }
    // SAFETY: forwarded caller guarantees.
    unsafe { ibv_create_ah(pd, &raw mut a) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_flags_follow_ibverbs_rules() {
        assert_eq!(
            check_access(0x7).map(|f| f.bits()),
            Ok(0x7),
            "local write, remote write and read"
        );
        // perftest's relaxed ordering (the optional range) is ignored.
        assert_eq!(check_access(0x7 | (1 << 20)).map(|f| f.bits()), Ok(0x7));
        assert_eq!(check_access(0x2).map_err(|e| e.0), Err(libc::EINVAL));
        assert_eq!(
            check_access(IBV_ACCESS_ON_DEMAND).map_err(|e| e.0),
            Err(libc::EOPNOTSUPP)
        );
        assert_eq!(check_access(1 << 9).map_err(|e| e.0), Err(libc::EINVAL));
    }

    #[test]
    fn an_av_needs_a_grh() {
        let mut a: ibv_ah_attr = zeroed();
        assert!(address_vector(&a).is_err());
        a.is_global = 1;
        a.grh.dgid = ibv_gid {
            raw: *Gid::from_ipv4(Ipv4Addr::new(10, 0, 0, 2)).raw(),
        };
        a.grh.sgid_index = 1;
        a.grh.hop_limit = 64;
        a.grh.flow_label = 7;
        let av = address_vector(&a).expect("global");
        assert_eq!(av.dgid, Gid::from_ipv4(Ipv4Addr::new(10, 0, 0, 2)));
        assert_eq!((av.sgid_index, av.hop_limit, av.flow_label), (1, 64, 7));
        let back = ah_attr_of(&av, 1);
        // SAFETY: reading the raw bytes of a GID union is always valid.
        assert_eq!(unsafe { back.grh.dgid.raw }, *av.dgid.raw());
    }

    #[test]
    fn the_grh_slot_says_ipv4_or_ipv6() {
        // An IPv4 header (20 bytes, correct checksum) in the last 20 bytes.
        let mut g = [0u8; 40];
        let ip4 = [
            0x45, 0, 0, 0x30, 0, 0, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
        ];
        g[20..].copy_from_slice(&ip4);
        let mut sum: u32 = ip4
            .chunks_exact(2)
            .map(|p| u32::from(u16::from_be_bytes([p[0], p[1]])))
            .sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        let ck = (!(sum as u16)).to_be_bytes();
        g[30] = ck[0];
        g[31] = ck[1];
        assert_eq!(grh_version(&g), Some(4));
        // An IPv6 header.
        let mut g6 = [0u8; 40];
        g6[0] = 0x60;
        g6[6] = 17;
        assert_eq!(grh_version(&g6), Some(6));
        assert_eq!(grh_version(&[0u8; 40]), None);
    }
}
