//! The system calls of device sharing ([`crate::share`]): the `bpf(2)`
//! commands that build and find the steering program and its socket array,
//! the `SO_REUSEPORT` socket that joins a group, and the open-file-description
//! locks of the slot registry. One function per call, typed results; every
//! `unsafe` block says what it relies on.
//!
//! # The steering program
//!
//! An eBPF `BPF_PROG_TYPE_SK_REUSEPORT` program, attached to the group with
//! `SO_ATTACH_REUSEPORT_EBPF`, reads the 24-bit BTH DestQP (UDP payload bytes
//! 5..8), shifts it right by [`SLOT_SHIFT`] to get the owner's slot, and asks
//! `bpf_sk_select_reuseport` for the socket stored at that slot of a
//! `BPF_MAP_TYPE_REUSEPORT_SOCKARRAY`. When the slot is empty (its owner has
//! closed, or never was) or the datagram is too short, it returns `SK_PASS`
//! without a selection and the kernel falls back to its hash: some member
//! gets the datagram, finds no such QP and drops and counts it. The array is
//! indexed by slot, not by group position, so a member leaving changes
//! nothing for the others (the kernel clears a closing socket's entry).

use std::ffi::CStr;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// QPN bits below the slot number: slot `s` owns QPNs `s << 16 ..= s << 16 | 0xffff`.
pub const SLOT_SHIFT: u32 = 16;
/// Slots (processes' devices sharing addresses on one host): `2^24 >> 16`.
pub const SLOTS: u32 = 1 << (24 - SLOT_SHIFT);

/// The socket array's name (`bpftool map` shows it).
pub const MAP_NAME: &[u8] = b"rnic_qpn_socks";
/// The program's name.
pub const PROG_NAME: &[u8] = b"rnic_qpn_steer";

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
const BPF_MAP_GET_FD_BY_ID: libc::c_long = 14;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;

const BPF_MAP_TYPE_REUSEPORT_SOCKARRAY: u32 = 20;
const BPF_PROG_TYPE_SK_REUSEPORT: u32 = 21;
const BPF_SK_REUSEPORT_SELECT: u32 = 39;
const BPF_ANY: u64 = 0;

const BPF_FUNC_SKB_LOAD_BYTES: i32 = 26;
const BPF_FUNC_SK_SELECT_REUSEPORT: i32 = 82;
const SK_PASS: i32 = 1;

/// `SO_ATTACH_REUSEPORT_EBPF` (asm-generic/socket.h).
const SO_ATTACH_REUSEPORT_EBPF: libc::c_int = 52;

/// The attribute block every command takes (zeroed beyond what it uses;
/// the kernel accepts a block larger than it knows when the tail is zero).
#[repr(C, align(8))]
struct Attr([u8; 128]);

impl Attr {
    fn new() -> Attr {
        Attr([0; 128])
    }
    fn u32(&mut self, off: usize, v: u32) -> &mut Attr {
        self.0[off..off + 4].copy_from_slice(&v.to_ne_bytes());
        self
    }
    fn u64(&mut self, off: usize, v: u64) -> &mut Attr {
        self.0[off..off + 8].copy_from_slice(&v.to_ne_bytes());
        self
    }
    fn name(&mut self, off: usize, name: &[u8]) -> &mut Attr {
        let n = name.len().min(15);
        self.0[off..off + n].copy_from_slice(&name[..n]);
        self
    }
}

/// `bpf(cmd, attr, sizeof attr)`.
fn bpf(cmd: libc::c_long, attr: &mut Attr) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a live, writable 128-byte block for the whole call;
    // every pointer stored in it (instructions, license, keys, values,
    // info) points at memory the caller keeps alive across this call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr.0.as_mut_ptr(),
            std::mem::size_of::<Attr>() as libc::c_uint,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// A command that returns a new file descriptor.
fn bpf_fd(cmd: libc::c_long, attr: &mut Attr) -> io::Result<OwnedFd> {
    let fd = bpf(cmd, attr)? as RawFd;
    // SAFETY: the kernel just returned `fd` as a new descriptor that nothing
    // else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Create the slot → socket array.
pub fn create_sockarray() -> io::Result<OwnedFd> {
    let mut a = Attr::new();
    a.u32(0, BPF_MAP_TYPE_REUSEPORT_SOCKARRAY)
        .u32(4, 4)
        .u32(8, 8)
        .u32(12, SLOTS)
        .name(28, MAP_NAME);
    bpf_fd(BPF_MAP_CREATE, &mut a)
}

/// One eBPF instruction.
#[derive(Clone, Copy)]
struct Insn {
    code: u8,
    regs: u8,
    off: i16,
    imm: i32,
}

const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: dst | (src << 4),
        off,
        imm,
    }
}

/// The steering program over socket array `map` (module docs), as
/// instructions.
fn program(map: RawFd) -> [Insn; 27] {
    const MOV_X: u8 = 0xbf;
    const MOV_K: u8 = 0xb7;
    const ADD_K: u8 = 0x07;
    const LSH_K: u8 = 0x67;
    const RSH_K: u8 = 0x77;
    const OR_X: u8 = 0x4f;
    const ST_W: u8 = 0x62;
    const STX_W: u8 = 0x63;
    const LDX_B: u8 = 0x71;
    const JNE_K: u8 = 0x55;
    const CALL: u8 = 0x85;
    const EXIT: u8 = 0x95;
    const LD_IMM64: u8 = 0x18;
    const PSEUDO_MAP_FD: u8 = 1;
    // UDP header (8 bytes) + BTH bytes 5..8: the ctx's data starts at the
    // UDP header.
    const QPN_AT: i32 = 8 + 5;
    [
        insn(MOV_X, 6, 1, 0, 0),                           // r6 = ctx
        insn(ST_W, 10, 0, -8, 0),                          // *(u32 *)(fp - 8) = 0
        insn(MOV_X, 1, 6, 0, 0),                           // r1 = ctx
        insn(MOV_K, 2, 0, 0, QPN_AT),                      // r2 = offset
        insn(MOV_X, 3, 10, 0, 0),                          // r3 = fp
        insn(ADD_K, 3, 0, 0, -8),                          // r3 = fp - 8
        insn(MOV_K, 4, 0, 0, 3),                           // r4 = 3 bytes
        insn(CALL, 0, 0, 0, BPF_FUNC_SKB_LOAD_BYTES),      // load the QPN
        insn(JNE_K, 0, 0, 16, 0),                          // short: pass (hash)
        insn(LDX_B, 1, 10, -8, 0),                         // r1 = qpn[0]
        insn(LSH_K, 1, 0, 0, 16),                          // r1 <<= 16
        insn(LDX_B, 2, 10, -7, 0),                         // r2 = qpn[1]
        insn(LSH_K, 2, 0, 0, 8),                           // r2 <<= 8
        insn(OR_X, 1, 2, 0, 0),                            // r1 |= r2
        insn(LDX_B, 2, 10, -6, 0),                         // r2 = qpn[2]
        insn(OR_X, 1, 2, 0, 0),                            // r1 = DestQP
        insn(RSH_K, 1, 0, 0, SLOT_SHIFT as i32),           // r1 = slot
        insn(STX_W, 10, 1, -4, 0),                         // *(u32 *)(fp - 4) = slot
        insn(MOV_X, 1, 6, 0, 0),                           // r1 = ctx
        insn(LD_IMM64, 2, PSEUDO_MAP_FD, 0, map),          // r2 = the array
        insn(0, 0, 0, 0, 0),                               //   (second half)
        insn(MOV_X, 3, 10, 0, 0),                          // r3 = fp
        insn(ADD_K, 3, 0, 0, -4),                          // r3 = &slot
        insn(MOV_K, 4, 0, 0, 0),                           // r4 = flags
        insn(CALL, 0, 0, 0, BPF_FUNC_SK_SELECT_REUSEPORT), // select (or not)
        insn(MOV_K, 0, 0, 0, SK_PASS),                     // pass: selected, else hash
        insn(EXIT, 0, 0, 0, 0),
    ]
}

/// Load the steering program over socket array `map`. On a verifier
/// refusal the error carries the verifier's log.
pub fn load_steering(map: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let prog = program(map.as_raw_fd());
    let mut bytes = Vec::with_capacity(prog.len() * 8);
    for i in prog {
        bytes.push(i.code);
        bytes.push(i.regs);
        bytes.extend_from_slice(&i.off.to_le_bytes());
        bytes.extend_from_slice(&i.imm.to_le_bytes());
    }
    let license: &CStr = c"GPL";
    let mut log = vec![0u8; 16 * 1024];
    let load = |log_level: u32, log: &mut [u8]| {
        let mut a = Attr::new();
        a.u32(0, BPF_PROG_TYPE_SK_REUSEPORT)
            .u32(4, prog.len() as u32)
            .u64(8, bytes.as_ptr() as u64)
            .u64(16, license.as_ptr() as u64)
            .u32(24, log_level)
            .u32(28, if log_level > 0 { log.len() as u32 } else { 0 })
            .u64(
                32,
                if log_level > 0 {
                    log.as_mut_ptr() as u64
                } else {
                    0
                },
            )
            .name(48, PROG_NAME)
            .u32(68, BPF_SK_REUSEPORT_SELECT);
        bpf_fd(BPF_PROG_LOAD, &mut a)
    };
    match load(0, &mut log) {
        Ok(fd) => Ok(fd),
        Err(e)
            if e.raw_os_error() == Some(libc::EINVAL) || e.raw_os_error() == Some(libc::EACCES) =>
        {
            let _ = load(1, &mut log);
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            let text = String::from_utf8_lossy(&log[..end]).trim().to_owned();
            Err(io::Error::new(e.kind(), format!("{e}; verifier: {text}")))
        }
        Err(e) => Err(e),
    }
}

/// What `BPF_OBJ_GET_INFO_BY_FD` says of a map or program: (type, id,
/// name), and for a map (key size, value size, entries), for a program the
/// first map it uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ObjInfo {
    /// `bpf_map_type` / `bpf_prog_type`.
    pub kind: u32,
    /// The object's id.
    pub id: u32,
    /// Its name, NUL-padded.
    pub name: [u8; 16],
    /// Map: key size, value size, max entries. Program: the id of its
    /// first map, 0, number of maps.
    pub sizes: (u32, u32, u32),
}

impl ObjInfo {
    /// Whether its name is `want` (truncated to 15 bytes as the kernel keeps it).
    pub fn named(&self, want: &[u8]) -> bool {
        let n = want.len().min(15);
        self.name[..n] == want[..n] && self.name[n..].iter().all(|&b| b == 0)
    }
}

/// Describe map `fd`.
pub fn map_info(fd: BorrowedFd<'_>) -> io::Result<ObjInfo> {
    let mut info = [0u8; 88];
    let mut a = Attr::new();
    a.u32(0, fd.as_raw_fd() as u32)
        .u32(4, info.len() as u32)
        .u64(8, info.as_mut_ptr() as u64);
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut a)?;
    let w = |o: usize| u32::from_ne_bytes([info[o], info[o + 1], info[o + 2], info[o + 3]]);
    let mut name = [0u8; 16];
    name.copy_from_slice(&info[24..40]);
    Ok(ObjInfo {
        kind: w(0),
        id: w(4),
        name,
        sizes: (w(8), w(12), w(16)),
    })
}

/// Describe program `fd`.
pub fn prog_info(fd: BorrowedFd<'_>) -> io::Result<ObjInfo> {
    let mut info = [0u8; 96];
    let mut map_ids = [0u32; 4];
    let mut a = Attr::new();
    // nr_map_ids at 52, map_ids at 56.
    info[52..56].copy_from_slice(&(map_ids.len() as u32).to_ne_bytes());
    info[56..64].copy_from_slice(&(map_ids.as_mut_ptr() as u64).to_ne_bytes());
    a.u32(0, fd.as_raw_fd() as u32)
        .u32(4, info.len() as u32)
        .u64(8, info.as_mut_ptr() as u64);
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut a)?;
    let w = |o: usize| u32::from_ne_bytes([info[o], info[o + 1], info[o + 2], info[o + 3]]);
    let mut name = [0u8; 16];
    name.copy_from_slice(&info[64..80]);
    Ok(ObjInfo {
        kind: w(0),
        id: w(4),
        name,
        sizes: (map_ids[0], 0, w(52)),
    })
}

/// Whether `info` is one of our socket arrays.
pub fn is_our_map(info: &ObjInfo) -> bool {
    info.kind == BPF_MAP_TYPE_REUSEPORT_SOCKARRAY
        && info.sizes == (4, 8, SLOTS)
        && info.named(MAP_NAME)
}

/// Whether `info` is our steering program over map `map_id`.
pub fn is_our_prog(info: &ObjInfo, map_id: u32) -> bool {
    info.kind == BPF_PROG_TYPE_SK_REUSEPORT
        && info.named(PROG_NAME)
        && info.sizes.0 == map_id
        && info.sizes.2 == 1
}

/// Open the map with id `id` (needs CAP_SYS_ADMIN).
pub fn map_by_id(id: u32) -> io::Result<OwnedFd> {
    let mut a = Attr::new();
    a.u32(0, id);
    bpf_fd(BPF_MAP_GET_FD_BY_ID, &mut a)
}

/// Open the program with id `id` (needs CAP_SYS_ADMIN).
pub fn prog_by_id(id: u32) -> io::Result<OwnedFd> {
    let mut a = Attr::new();
    a.u32(0, id);
    bpf_fd(BPF_PROG_GET_FD_BY_ID, &mut a)
}

/// Store socket `sock` at `slot` of array `map` (replacing what was there).
pub fn set_slot(map: BorrowedFd<'_>, slot: u32, sock: BorrowedFd<'_>) -> io::Result<()> {
    let key = slot;
    let value = sock.as_raw_fd() as u64;
    let mut a = Attr::new();
    a.u32(0, map.as_raw_fd() as u32)
        .u64(8, &key as *const u32 as u64)
        .u64(16, &value as *const u64 as u64)
        .u64(24, BPF_ANY);
    bpf(BPF_MAP_UPDATE_ELEM, &mut a).map(drop)
}

/// The cookie of the socket at `slot` of `map`, `None` when empty.
pub fn slot_cookie(map: BorrowedFd<'_>, slot: u32) -> io::Result<Option<u64>> {
    let key = slot;
    let mut value = 0u64;
    let mut a = Attr::new();
    a.u32(0, map.as_raw_fd() as u32)
        .u64(8, &key as *const u32 as u64)
        .u64(16, &mut value as *mut u64 as u64);
    match bpf(BPF_MAP_LOOKUP_ELEM, &mut a) {
        Ok(_) => Ok(Some(value)),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

/// `SO_COOKIE` of a socket.
pub fn sock_cookie(sock: BorrowedFd<'_>) -> io::Result<u64> {
    let mut v = 0u64;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: `v` and `len` are live for the call and `len` is `v`'s size.
    let r = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_COOKIE,
            (&mut v as *mut u64).cast(),
            &mut len,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(v)
}

/// Attach program `prog` to the reuseport group `sock` is in (replaces the
/// group's program).
pub fn attach_steering(sock: BorrowedFd<'_>, prog: BorrowedFd<'_>) -> io::Result<()> {
    let fd: libc::c_int = prog.as_raw_fd();
    // SAFETY: `fd` is live for the call and the length is its size.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_ATTACH_REUSEPORT_EBPF,
            (&fd as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A UDP socket with `SO_REUSEPORT` set, bound to `addr`.
pub fn bind_reuseport(addr: SocketAddr) -> io::Result<std::net::UdpSocket> {
    use nix::sys::socket::{
        AddressFamily, SockFlag, SockType, SockaddrIn, SockaddrIn6, bind, setsockopt, socket,
        sockopt,
    };
    let family = match addr {
        SocketAddr::V4(_) => AddressFamily::Inet,
        SocketAddr::V6(_) => AddressFamily::Inet6,
    };
    let fd = socket(family, SockType::Datagram, SockFlag::SOCK_CLOEXEC, None)
        .map_err(io::Error::from)?;
    setsockopt(&fd, sockopt::ReusePort, &true).map_err(io::Error::from)?;
    match addr {
        SocketAddr::V4(a) => bind(fd.as_raw_fd(), &SockaddrIn::from(a)),
        SocketAddr::V6(a) => {
            setsockopt(&fd, sockopt::Ipv6V6Only, &true).map_err(io::Error::from)?;
            bind(fd.as_raw_fd(), &SockaddrIn6::from(a))
        }
    }
    .map_err(io::Error::from)?;
    Ok(std::net::UdpSocket::from(fd))
}

/// How an open-file-description lock request went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lock {
    /// Taken.
    Taken,
    /// Someone else holds it.
    Busy,
}

fn ofd_lock(fd: BorrowedFd<'_>, cmd: libc::c_int, ty: libc::c_short) -> io::Result<libc::flock> {
    // SAFETY: `flock` is plain data; all-zero is a valid value (whole file).
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = ty;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    // SAFETY: `fl` is live and writable for the call, as the command needs.
    let r = unsafe { libc::fcntl(fd.as_raw_fd(), cmd, &mut fl as *mut libc::flock) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fl)
}

/// Take a write lock on the whole file, owned by this open file description
/// (so two opens in one process conflict, and the lock dies with the
/// description: at `close` or process exit). `wait`: block until free.
pub fn lock_file(fd: BorrowedFd<'_>, wait: bool) -> io::Result<Lock> {
    let cmd = if wait {
        libc::F_OFD_SETLKW
    } else {
        libc::F_OFD_SETLK
    };
    match ofd_lock(fd, cmd, libc::F_WRLCK as libc::c_short) {
        Ok(_) => Ok(Lock::Taken),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EACCES)) => {
            Ok(Lock::Busy)
        }
        Err(e) => Err(e),
    }
}

/// Whether someone holds a lock on the file (without taking one).
pub fn file_locked(fd: BorrowedFd<'_>) -> io::Result<bool> {
    let fl = ofd_lock(fd, libc::F_OFD_GETLK, libc::F_WRLCK as libc::c_short)?;
    Ok(fl.l_type != libc::F_UNLCK as libc::c_short)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_program_encodes_registers_and_jumps() {
        let p = program(7);
        // The short-read jump lands on `r0 = SK_PASS`.
        let at = 8usize;
        let target = (at as i64 + 1 + i64::from(p[at].off)) as usize;
        assert_eq!(p[target].code, 0xb7);
        assert_eq!(p[target].imm, SK_PASS);
        assert_eq!(p[19].code, 0x18);
        assert_eq!(p[19].regs, 2 | (1 << 4));
        assert_eq!(p[19].imm, 7);
        assert_eq!(p[17].regs, 10 | (1 << 4));
        assert_eq!(p[26].code, 0x95);
    }

    #[test]
    fn names_compare_as_the_kernel_keeps_them() {
        let mut name = [0u8; 16];
        name[..14].copy_from_slice(b"rnic_qpn_socks");
        let i = ObjInfo {
            kind: BPF_MAP_TYPE_REUSEPORT_SOCKARRAY,
            id: 3,
            name,
            sizes: (4, 8, SLOTS),
        };
        assert!(is_our_map(&i));
        assert!(!i.named(b"rnic_qpn"));
        assert!(!is_our_map(&ObjInfo {
            sizes: (4, 4, SLOTS),
            ..i
        }));
    }
}
