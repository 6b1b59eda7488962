//! One rxe device, many processes: every process (every open device) that
//! binds an address joins one `SO_REUSEPORT` group on `addr:4791`, and an
//! eBPF program attached to the group sends each datagram to the socket of
//! the member that owns its BTH DestQP. Nothing but the port is shared: each
//! member keeps its own engine, memory and QPs, and no hop is added.
//!
//! # Slots
//!
//! The 24-bit QPN space is cut into [`SLOTS`] slots of `2^16` QPNs
//! ([`QpnRange::of_slot`]); an open device owns one slot, host-wide, for its
//! lifetime, and hands out QPNs only from it. Steering is a pure function of
//! the QPN (`qpn >> 16`), so it never depends on who else is in the group.
//! A slot is owned by holding an open-file-description write lock on
//! `/run/rnic/rxe/slot-<n>`: the kernel drops the lock when the owner closes
//! the device or dies, however it dies, so a slot is never taken while its
//! owner lives and is free once it is gone. The file holds the owner's
//! description (pid, addresses, QPN range) for `rnicctl list`.
//!
//! # Groups
//!
//! Per (network namespace, address, port) a file `/run/rnic/rxe/group-…`
//! names the group's socket array and program by their kernel ids. A member
//! joins under that file's lock: it opens the array and program by id (or,
//! when they are gone, creates new ones), binds its `SO_REUSEPORT` socket,
//! stores the socket at its slot of the array, attaches the program to the
//! group (idempotent for the same program), and records the ids. When a
//! member's socket closes the kernel clears its array entry; datagrams for
//! its QPNs then fall back to the kernel's hash and reach some live member,
//! which drops them (`foreign_qpn`): a departed member's traffic is never
//! delivered to a QP, and a member never receives another's traffic while
//! that one lives.
//!
//! # Privileges
//!
//! Loading a `SK_REUSEPORT` program needs CAP_BPF (root, or
//! `setcap cap_bpf,cap_net_admin,cap_sys_admin+ep`); opening another
//! member's array by id needs CAP_SYS_ADMIN. Without them a device binds its
//! addresses exclusively, as before sharing existed, and says so once;
//! `RNIC_RXE_SHARE=0` asks for exclusive binding.

use std::fmt::Write as _;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::bpf::{self, Lock, SLOTS};
use crate::error::RxeError;
use crate::qpns::QpnRange;

/// Where the registry lives (host-wide: every sharing process must agree).
pub const REGISTRY: &str = "/run/rnic/rxe";

/// `RNIC_RXE_SHARE=0` (or `false`/`no`/`off`): bind exclusively.
pub fn share_from_env() -> bool {
    !std::env::var("RNIC_RXE_SHARE").is_ok_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "0" | "false" | "no" | "off"
        )
    })
}

/// One address's group, as this member joined it.
#[derive(Debug)]
struct Group {
    addr: SocketAddr,
    map: OwnedFd,
    map_id: u32,
    prog_id: u32,
}

/// An open device's membership: its slot, and the groups it joined.
#[derive(Debug)]
pub struct Member {
    slot: u32,
    range: QpnRange,
    /// The slot file, locked for as long as this lives.
    file: File,
    dir: PathBuf,
    groups: Vec<Group>,
    /// What the device was opened as (for `rnicctl list`).
    target: String,
}

/// A member of a group, as the registry shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberInfo {
    /// Its slot.
    pub slot: u32,
    /// Its QPN range.
    pub range: QpnRange,
    /// The owning process.
    pub pid: u32,
    /// What it opened (`rxe:lo`, `rxe:127.0.0.1`, …).
    pub target: String,
    /// The addresses it shares (`ip:port`).
    pub addrs: Vec<String>,
}

/// Why a slot could not be claimed.
#[derive(Debug)]
pub enum JoinError {
    /// Sharing cannot work here (no privileges, no registry, an old kernel,
    /// every slot taken): bind exclusively instead.
    Unavailable(String),
}

fn share_err(what: &'static str, addr: SocketAddr, source: io::Error) -> RxeError {
    RxeError::Share { what, addr, source }
}

fn open_rw(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o644)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
}

/// The calling thread's network namespace inode (0 when `/proc` hides it).
fn netns_ino() -> u64 {
    std::fs::metadata("/proc/thread-self/ns/net").map_or(0, |m| m.ino())
}

impl Member {
    /// Take a free slot in the registry at `dir` (normally [`REGISTRY`]) and
    /// check that this process may load the steering program.
    pub fn claim(dir: &Path, target: &str) -> Result<Member, JoinError> {
        // The probe: without CAP_BPF neither of these works.
        let probe = bpf::create_sockarray().and_then(|m| bpf::load_steering(m.as_fd()).map(drop));
        if let Err(e) = probe {
            return Err(JoinError::Unavailable(format!(
                "loading the steering program failed ({e}): sharing an address between \
                 processes needs CAP_BPF and CAP_SYS_ADMIN (run as root, or setcap \
                 cap_bpf,cap_net_admin,cap_sys_admin+ep on the binary)"
            )));
        }
        std::fs::create_dir_all(dir).map_err(|e| {
            JoinError::Unavailable(format!(
                "creating the registry {} failed: {e}",
                dir.display()
            ))
        })?;
        for slot in 0..SLOTS {
            let path = dir.join(format!("slot-{slot}"));
            let file = open_rw(&path).map_err(|e| {
                JoinError::Unavailable(format!("opening {} failed: {e}", path.display()))
            })?;
            match bpf::lock_file(file.as_fd(), false) {
                Ok(Lock::Taken) => {
                    let range = QpnRange::of_slot(slot).unwrap_or(QpnRange::ALL);
                    let mut m = Member {
                        slot,
                        range,
                        file,
                        dir: dir.to_owned(),
                        groups: Vec::new(),
                        target: target.to_owned(),
                    };
                    m.publish();
                    return Ok(m);
                }
                Ok(Lock::Busy) => continue,
                Err(e) => {
                    return Err(JoinError::Unavailable(format!(
                        "locking {} failed: {e}",
                        path.display()
                    )));
                }
            }
        }
        Err(JoinError::Unavailable(format!(
            "all {SLOTS} slots of {} are taken by live devices",
            dir.display()
        )))
    }

    /// This member's slot.
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// The QPNs this member may hand out.
    pub fn range(&self) -> QpnRange {
        self.range
    }

    /// Bind `addr` in its group: open (or create) the group's array and
    /// program, bind an `SO_REUSEPORT` socket, store it at this member's
    /// slot, attach the program.
    pub fn bind(&mut self, addr: SocketAddr) -> Result<UdpSocket, RxeError> {
        let name = format!(
            "group-{}-{}-{}",
            netns_ino(),
            addr.ip().to_string().replace([':', '%'], "_"),
            addr.port()
        );
        let path = self.dir.join(name);
        let mut gf = open_rw(&path).map_err(|e| share_err("opening the group file", addr, e))?;
        // Held until this function returns (the file closes).
        bpf::lock_file(gf.as_fd(), true)
            .map_err(|e| share_err("locking the group file", addr, e))?;
        let mut text = String::new();
        let _ = gf.read_to_string(&mut text);
        let (map, prog, map_id, prog_id) = match existing(&text) {
            Some(found) => found,
            None => {
                let map = bpf::create_sockarray()
                    .map_err(|e| share_err("creating the steering socket array", addr, e))?;
                let prog = bpf::load_steering(map.as_fd())
                    .map_err(|e| share_err("loading the steering program", addr, e))?;
                let map_id = bpf::map_info(map.as_fd())
                    .map_err(|e| share_err("querying the socket array", addr, e))?
                    .id;
                let prog_id = bpf::prog_info(prog.as_fd())
                    .map_err(|e| share_err("querying the steering program", addr, e))?
                    .id;
                (map, prog, map_id, prog_id)
            }
        };
        let sock = bpf::bind_reuseport(addr).map_err(|e| {
            if e.kind() == io::ErrorKind::AddrInUse {
                RxeError::PortInUse {
                    addr,
                    holder: " by a socket that does not share it — the kernel's rdma_rxe, an rnic \
                             process binding exclusively (RNIC_RXE_SHARE=0, or without CAP_BPF), \
                             or another program; find it with ss -uanp 'sport = :4791'"
                        .to_owned(),
                }
            } else {
                share_err("binding the shared RoCE socket", addr, e)
            }
        })?;
        bpf::set_slot(map.as_fd(), self.slot, sock.as_fd())
            .map_err(|e| share_err("storing the socket in the steering array", addr, e))?;
        bpf::attach_steering(sock.as_fd(), prog.as_fd())
            .map_err(|e| share_err("attaching the steering program", addr, e))?;
        let line = format!("{map_id} {prog_id}\n");
        if text != line {
            let _ = gf.set_len(0);
            let _ = gf.rewind();
            let _ = gf.write_all(line.as_bytes());
        }
        self.groups.push(Group {
            addr,
            map,
            map_id,
            prog_id,
        });
        self.publish();
        Ok(sock)
    }

    /// Whether this member's socket for `addr` is the one the array holds
    /// at its slot (`rnicctl doctor`, tests).
    pub fn steered(&self, addr: SocketAddr, sock: &UdpSocket) -> bool {
        let Some(g) = self.groups.iter().find(|g| g.addr == addr) else {
            return false;
        };
        match (
            bpf::slot_cookie(g.map.as_fd(), self.slot),
            bpf::sock_cookie(sock.as_fd()),
        ) {
            (Ok(Some(a)), Ok(b)) => a == b,
            _ => false,
        }
    }

    /// The groups joined: (address, array id, program id).
    pub fn groups(&self) -> Vec<(SocketAddr, u32, u32)> {
        self.groups
            .iter()
            .map(|g| (g.addr, g.map_id, g.prog_id))
            .collect()
    }

    /// Write this member's description into its slot file.
    fn publish(&mut self) {
        let mut s = String::new();
        let _ = writeln!(s, "pid {}", std::process::id());
        let _ = writeln!(s, "slot {}", self.slot);
        let _ = writeln!(s, "qpns {:#x} {:#x}", self.range.first, self.range.last);
        let _ = writeln!(s, "target {}", self.target);
        for g in &self.groups {
            let _ = writeln!(s, "addr {}", g.addr);
        }
        let _ = self.file.set_len(0);
        let _ = self.file.rewind();
        let _ = self.file.write_all(s.as_bytes());
    }
}

/// The array and program `text` ("map_id prog_id") names, when both are
/// still ours.
fn existing(text: &str) -> Option<(OwnedFd, OwnedFd, u32, u32)> {
    let mut it = text.split_whitespace().map(|w| w.parse::<u32>().ok());
    let (Some(Some(map_id)), Some(Some(prog_id))) = (it.next(), it.next()) else {
        return None;
    };
    let map = bpf::map_by_id(map_id).ok()?;
    if !bpf::map_info(map.as_fd()).is_ok_and(|i| bpf::is_our_map(&i) && i.id == map_id) {
        return None;
    }
    let prog = bpf::prog_by_id(prog_id).ok()?;
    if !bpf::prog_info(prog.as_fd()).is_ok_and(|i| bpf::is_our_prog(&i, map_id)) {
        return None;
    }
    Some((map, prog, map_id, prog_id))
}

/// Parse a slot file.
fn parse_member(text: &str) -> Option<MemberInfo> {
    let mut m = MemberInfo {
        slot: u32::MAX,
        range: QpnRange::ALL,
        pid: 0,
        target: String::new(),
        addrs: Vec::new(),
    };
    let hex = |w: &str| u32::from_str_radix(w.trim_start_matches("0x"), 16).ok();
    for line in text.lines() {
        let (k, v) = line.split_once(' ')?;
        match k {
            "pid" => m.pid = v.parse().ok()?,
            "slot" => m.slot = v.parse().ok()?,
            "qpns" => {
                let (a, b) = v.split_once(' ')?;
                m.range = QpnRange {
                    first: hex(a)?,
                    last: hex(b)?,
                };
            }
            "target" => m.target = v.to_owned(),
            "addr" => m.addrs.push(v.to_owned()),
            _ => {}
        }
    }
    (m.slot != u32::MAX && m.pid != 0).then_some(m)
}

/// The live members of the registry at `dir` (slot files someone holds
/// locked), by slot.
pub fn members_in(dir: &Path) -> Vec<MemberInfo> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let name = e.file_name();
        if !name.to_string_lossy().starts_with("slot-") {
            continue;
        }
        let Ok(mut f) = File::open(e.path()) else {
            continue;
        };
        if !bpf::file_locked(f.as_fd()).unwrap_or(false) {
            continue;
        }
        let mut text = String::new();
        if f.read_to_string(&mut text).is_ok()
            && let Some(m) = parse_member(&text)
        {
            out.push(m);
        }
    }
    out.sort_by_key(|m| m.slot);
    out
}

/// Bind every address of a device: in its sharing group when `share` asks
/// for it and this process may (else exclusively, said once), returning
/// the ports and the membership that owns the device's QPN slot.
pub(crate) fn bind_ports(
    addrs: &[crate::gid::LocalAddr],
    roce_port: u16,
    gro: bool,
    tap: bool,
    ring: bool,
    share: bool,
    target: &str,
) -> Result<(Vec<crate::port::Port>, Option<Member>), RxeError> {
    use crate::port::Port;
    static SAID: std::sync::Once = std::sync::Once::new();
    // A packet ring sees its address's datagrams whatever process they are
    // for: a device with rings binds exclusively.
    let mut member = if share && !ring {
        match Member::claim(Path::new(REGISTRY), target) {
            Ok(m) => Some(m),
            Err(JoinError::Unavailable(why)) => {
                SAID.call_once(|| {
                    tracing::warn!(
                        "binding UDP/{roce_port} exclusively, not shared with other processes: {why}"
                    );
                });
                None
            }
        }
    } else {
        None
    };
    let ports = addrs
        .iter()
        .map(|a| Port::bind(a, roce_port, gro, tap, ring, member.as_mut()))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((ports, member))
}

/// The live members of the host's registry.
pub fn members() -> Vec<MemberInfo> {
    members_in(Path::new(REGISTRY))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn slot_files_parse_back() {
        let t = "pid 42\nslot 3\nqpns 0x30000 0x3ffff\ntarget rxe:lo\naddr 127.0.0.1:4791\naddr [::1]:4791\n";
        let m = parse_member(t).unwrap();
        assert_eq!(m.pid, 42);
        assert_eq!(m.slot, 3);
        assert_eq!(m.range, QpnRange::of_slot(3).unwrap());
        assert_eq!(m.target, "rxe:lo");
        assert_eq!(m.addrs, ["127.0.0.1:4791", "[::1]:4791"]);
        assert_eq!(parse_member("slot 3\n"), None);
        assert_eq!(parse_member("pid x\nslot 3\n"), None);
    }

    #[test]
    fn group_files_that_name_nothing_are_ignored() {
        assert!(existing("").is_none());
        assert!(existing("zz 1").is_none());
        // Ids nothing has (or that are not ours) are not used.
        assert!(existing("4294967295 4294967295").is_none());
    }
}
