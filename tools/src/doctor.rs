//! `rnicctl doctor`: one line per check — OK / WARN / FAIL — with a fix.

use std::net::UdpSocket;
use std::path::Path;
use std::process::ExitCode;

use nix::sys::resource::{Resource, getrlimit};
use serde_json::json;

use crate::error::CtlError;
use crate::pci;

/// A check's verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    /// Fine.
    Ok,
    /// Works, but something is missing for part of rnic.
    Warn,
    /// A first run will fail.
    Fail,
}

/// One check's result.
#[derive(Clone, Debug)]
pub struct Check {
    /// Short name.
    pub name: String,
    /// Verdict.
    pub level: Level,
    /// What was found.
    pub detail: String,
    /// What to do (empty when OK).
    pub fix: String,
}

pub(crate) fn check(
    name: &str,
    level: Level,
    detail: impl Into<String>,
    fix: impl Into<String>,
) -> Check {
    Check {
        name: name.into(),
        level,
        detail: detail.into(),
        fix: fix.into(),
    }
}

fn count_dir(p: &Path) -> usize {
    std::fs::read_dir(p).map(|r| r.count()).unwrap_or(0)
}

/// Run every check.
pub fn checks() -> Vec<Check> {
    let sys = Path::new("/sys");
    let mut v = Vec::new();
    let mlx5 = pci::scan_mlx5(sys);
    let need_vfio = if mlx5.is_empty() {
        Level::Warn
    } else {
        Level::Fail
    };

    // IOMMU.
    let groups = count_dir(&sys.join("kernel/iommu_groups"));
    let cmdline = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
    let flags: Vec<&str> = cmdline
        .split_whitespace()
        .filter(|w| w.contains("iommu"))
        .collect();
    v.push(if groups > 0 {
        check("iommu", Level::Ok, format!("{groups} IOMMU groups; cmdline {}", flags.join(" ")), "")
    } else {
        check(
            "iommu",
            need_vfio,
            format!("no IOMMU groups (cmdline: {})", if flags.is_empty() { "no iommu flags".to_owned() } else { flags.join(" ") }),
            "enable VT-d/AMD-Vi in firmware and boot with intel_iommu=on iommu=pt (or amd_iommu=on); needed for mlx5 via VFIO only",
        )
    });

    // vfio-pci.
    let release = nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default();
    let loaded = sys.join("bus/pci/drivers/vfio-pci").exists();
    let builtin = std::fs::read_to_string(format!("/lib/modules/{release}/modules.builtin"))
        .map(|s| s.contains("vfio-pci.ko") || s.contains("vfio_pci.ko"))
        .unwrap_or(false);
    let available = std::fs::read_to_string(format!("/lib/modules/{release}/modules.dep"))
        .map(|s| s.contains("vfio-pci.ko") || s.contains("vfio_pci.ko"))
        .unwrap_or(false);
    v.push(if loaded || builtin {
        check("vfio-pci", Level::Ok, if loaded { "driver registered" } else { "built in" }, "")
    } else if available {
        check("vfio-pci", Level::Warn, "module present, not loaded", "modprobe vfio-pci")
    } else {
        check(
            "vfio-pci",
            need_vfio,
            format!("no vfio-pci module for kernel {release}"),
            "install the kernel's modules package (Debian: linux-image-$(uname -r)) and modprobe vfio-pci",
        )
    });

    // Group viability per mlx5 function.
    if mlx5.is_empty() {
        v.push(check(
            "mlx5",
            Level::Warn,
            "no mlx5 PCI functions; the rxe backend works without one",
            "none needed for rxe:<netdev>; for hardware install a ConnectX NIC",
        ));
    }
    // Group viability, as rnic-vfio judges it when opening the function.
    let vs = rnic_vfio::Sysfs::system();
    for f in &mlx5 {
        let name = format!("group {}", f.bdf);
        let Ok(addr) = f.bdf.parse::<rnic::core::PciAddr>() else {
            continue;
        };
        v.push(match vs.check_viable(&addr) {
            Ok(g) => check(
                &name,
                Level::Ok,
                format!("group {g} viable, {} on vfio-pci", f.bdf),
                "",
            ),
            Err(e @ rnic_vfio::VfioError::NoIommu { .. }) => check(
                &name,
                need_vfio,
                e.to_string(),
                "enable the IOMMU (see the iommu check)",
            ),
            Err(e) => check(
                &name,
                Level::Warn,
                e.to_string(),
                format!("rnicctl bind {} (and every group member it names)", f.bdf),
            ),
        });
    }

    // Audit rows 4, 23: how each function's doorbells will be rung, and how
    // many DMA mappings VFIO allows.
    for f in &mlx5 {
        let Ok(addr) = f.bdf.parse::<rnic::core::PciAddr>() else {
            continue;
        };
        let wc = vs.resource_wc(&addr, 0);
        v.push(if wc.exists() {
            check(
                &format!("doorbells {}", f.bdf),
                Level::Ok,
                format!(
                    "BlueFlame through a write-combining mapping ({} exists: BAR0 is prefetchable)",
                    wc.display()
                ),
                "",
            )
        } else {
            check(
                &format!("doorbells {}", f.bdf),
                Level::Warn,
                "8-byte doorbells only: kernel VFIO maps BARs uncached and there is no \
                 resource0_wc (BAR0 not prefetchable, or a kernel without it)",
                "none needed: doorbells work uncached; BlueFlame saves latency only with WC",
            )
        });
    }
    if !mlx5.is_empty() {
        let limit =
            std::fs::read_to_string("/sys/module/vfio_iommu_type1/parameters/dma_entry_limit")
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok());
        v.push(match limit {
            Some(n) if n >= 65535 => check(
                "dma_entry_limit",
                Level::Ok,
                format!("vfio_iommu_type1 allows {n} DMA mappings per container"),
                "",
            ),
            Some(n) => check(
                "dma_entry_limit",
                Level::Warn,
                format!("vfio_iommu_type1 allows only {n} DMA mappings per container"),
                "echo 262144 > /sys/module/vfio_iommu_type1/parameters/dma_entry_limit",
            ),
            None => check(
                "dma_entry_limit",
                need_vfio,
                "vfio_iommu_type1 is not loaded",
                "modprobe vfio_iommu_type1 (or vfio-pci, which loads it)",
            ),
        });
    }

    // /dev/vfio.
    let vfio = Path::new("/dev/vfio/vfio");
    v.push(if vfio.exists() {
        match nix::unistd::access(
            vfio,
            nix::unistd::AccessFlags::R_OK | nix::unistd::AccessFlags::W_OK,
        ) {
            Ok(()) => check("/dev/vfio", Level::Ok, "/dev/vfio/vfio read-write", ""),
            Err(e) => check(
                "/dev/vfio",
                need_vfio,
                format!("/dev/vfio/vfio: {e}"),
                "run as root or chown the group's /dev/vfio/<group> to your user",
            ),
        }
    } else {
        check(
            "/dev/vfio",
            need_vfio,
            "/dev/vfio/vfio missing",
            "modprobe vfio-pci (creates it)",
        )
    });

    // RLIMIT_MEMLOCK.
    v.push(match getrlimit(Resource::RLIMIT_MEMLOCK) {
        Ok((soft, _)) if soft == nix::sys::resource::RLIM_INFINITY => {
            check("memlock", Level::Ok, "RLIMIT_MEMLOCK unlimited", "")
        }
        Ok((soft, hard)) if soft >= 64 << 20 => check("memlock", Level::Ok, format!("RLIMIT_MEMLOCK {soft} bytes (hard {hard})"), ""),
        Ok((soft, hard)) => check(
            "memlock",
            Level::Warn,
            format!("RLIMIT_MEMLOCK {soft} bytes (hard {hard}): pinning large regions fails"),
            "ulimit -l unlimited (or memlock in /etc/security/limits.conf; LimitMEMLOCK=infinity for services)",
        ),
        Err(e) => check("memlock", Level::Warn, format!("getrlimit: {e}"), ""),
    });

    // Hugepages per node and NUMA topology.
    let nodes = rnic::dma::numa::online_nodes();
    let mut hp = Vec::new();
    let mut total = 0u64;
    for n in &nodes {
        for (dir, label) in [("hugepages-2048kB", "2M"), ("hugepages-1048576kB", "1G")] {
            let p = format!(
                "/sys/devices/system/node/node{}/hugepages/{dir}/nr_hugepages",
                n.0
            );
            if let Some(c) = std::fs::read_to_string(&p)
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
            {
                total += c;
                hp.push(format!("node{} {label}:{c}", n.0));
            }
        }
    }
    v.push(if total > 0 {
        check("hugepages", Level::Ok, hp.join(" "), "")
    } else {
        check(
            "hugepages",
            Level::Warn,
            format!("none reserved ({}); regions fall back to THP/4K pages", if hp.is_empty() { "no per-node counters".to_owned() } else { hp.join(" ") }),
            "echo 1024 | sudo tee /sys/devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages (per node)",
        )
    });
    let cpus: Vec<String> = nodes
        .iter()
        .map(|n| {
            let c =
                std::fs::read_to_string(format!("/sys/devices/system/node/node{}/cpulist", n.0))
                    .unwrap_or_default();
            format!("node{}: cpus {}", n.0, c.trim())
        })
        .collect();
    v.push(check(
        "numa",
        Level::Ok,
        format!("{} node(s): {}", nodes.len(), cpus.join("; ")),
        "",
    ));

    // GPU: driver, devices, topology, peer-BAR routes.
    v.extend(crate::doctor_gpu::checks());

    // UDP 4791.
    v.push(match UdpSocket::bind(("0.0.0.0", 4791)) {
        Ok(_) => check("udp/4791", Level::Ok, "free (bound and released 0.0.0.0:4791)", ""),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => check(
            "udp/4791",
            Level::Fail,
            "in use: kernel rdma_rxe or another rnic process owns RoCEv2's port",
            "remove kernel rxe links (rdma link delete rxe0; modprobe -r rdma_rxe) or stop the other rnic process; rnic's rxe needs UDP 4791",
        ),
        Err(e) => check("udp/4791", Level::Fail, format!("bind: {e}"), "check that IPv4 is available"),
    });

    // AF_PACKET, GSO, GRO.
    let packet = nix::sys::socket::socket(
        nix::sys::socket::AddressFamily::Packet,
        nix::sys::socket::SockType::Raw,
        nix::sys::socket::SockFlag::empty(),
        None,
    );
    v.push(match packet {
        Ok(_) => check(
            "af_packet",
            Level::Ok,
            "raw AF_PACKET sockets available",
            "",
        ),
        Err(e) => check(
            "af_packet",
            Level::Warn,
            format!("AF_PACKET: {e}"),
            "capture tests need CAP_NET_RAW (run as root); rnic itself does not",
        ),
    });
    // Full ICRC checks for unpredictable IPv4 identifications.
    // What devices opened with `RxeConfig::new` take from the environment.
    let env = rnic::rxe::RxeConfig::new(rnic::rxe::Target::Netdev("lo".into()));
    let recovery = env.ident_recovery;
    let tap = rnic::rxe::sys::ident_tap(std::net::Ipv4Addr::LOCALHOST, 4791);
    v.push(match (&tap, recovery) {
        (Ok(_), false) => check(
            "icrc",
            Level::Ok,
            "every IPv4 ICRC is checked in all 32 bits: predicted identification, else the identification tap (raw socket)",
            "",
        ),
        (Ok(_), true) => check(
            "icrc",
            Level::Warn,
            "identification tap available; RNIC_RXE_IDENT_RECOVERY is set, but only matters without a tap",
            "unset RNIC_RXE_IDENT_RECOVERY",
        ),
        (Err(e), false) => check(
            "icrc",
            Level::Warn,
            format!(
                "no identification tap ({e}): kernel-rxe packets whose IPv4 identification cannot be predicted (a peer's first packet, after a loss) are dropped, since their ICRC cannot be checked in full"
            ),
            "run as root or give the binary CAP_NET_RAW (setcap cap_net_raw+ep); or accept a 15-bit check for those packets with RNIC_RXE_IDENT_RECOVERY=1",
        ),
        (Err(e), true) => check(
            "icrc",
            Level::Warn,
            format!(
                "no identification tap ({e}) and RNIC_RXE_IDENT_RECOVERY=1: unpredictable IPv4 packets are accepted after a 15-bit ICRC check (a corrupted packet passes with probability 2^-15)"
            ),
            "run as root or give the binary CAP_NET_RAW for full 32-bit checks",
        ),
    });
    drop(tap);
    match UdpSocket::bind(("127.0.0.1", 0)) {
        Ok(s) => {
            let gso = rnic::rxe::sys::probe_gso(&s);
            let gro = rnic::rxe::sys::enable_gro(&s);
            v.push(if gso {
                check("udp-gso", Level::Ok, "UDP_SEGMENT accepted", "")
            } else {
                check(
                    "udp-gso",
                    Level::Warn,
                    "UDP_SEGMENT refused: one sendmmsg entry per packet",
                    "a kernel >= 4.18 batches sends with GSO",
                )
            });
            v.push(if gro {
                check("udp-gro", Level::Ok, "UDP_GRO accepted", "")
            } else {
                check(
                    "udp-gro",
                    Level::Warn,
                    "UDP_GRO refused: one datagram per packet",
                    "a kernel >= 5.0 coalesces receives with GRO",
                )
            });
            // The receive path rxe uses: what a busy-polling (caller-driven)
            // device gets from the kernel.
            use std::os::fd::AsFd;
            let usecs = rnic::rxe::sys::BUSY_POLL_USECS;
            let ring = if env.rx_ring {
                "; RNIC_RXE_RX_RING=1: IPv4 addresses receive through a packet ring instead (see rxe-rx-ring)"
            } else {
                ""
            };
            let place = if env.rx_place {
                "; RNIC_RXE_RX_PLACE=1: READ response payloads are received straight into their READs' buffers (socket ports)"
            } else {
                "; READ responses are copied from the receive slots (RNIC_RXE_RX_PLACE=1 receives their payloads straight into the READs' buffers)"
            };
            let moderation = match env.rx_moderation {
                Some(m) => format!(
                    "; progress threads nap {}-{} us between rounds (longer the larger the requester window) while {:.1} GB/s or more arrive, instead of being woken per datagram (receive moderation; RNIC_RXE_RX_MODERATION_US sets the shortest nap, 0 turns it off)",
                    m.nap.as_micros(),
                    m.longest_nap().as_micros(),
                    m.min_bytes_per_sec as f64 / 1e9
                ),
                None => "; receive moderation off (RNIC_RXE_RX_MODERATION_US=0): progress threads are woken per datagram".to_owned(),
            };
            v.push(match rnic::rxe::sys::set_busy_poll(s.as_fd(), usecs) {
                Ok(()) => check(
                    "rxe-rx-path",
                    Level::Ok,
                    format!(
                        "UDP sockets (sendmmsg/recvmmsg, GSO/GRO){ring}{place}{moderation}; busy-polling devices (caller-driven) call recvmmsg(MSG_DONTWAIT) per poll with SO_BUSY_POLL {usecs} us + SO_PREFER_BUSY_POLL, which polls a NIC's NAPI queue (lo and veth have none: there the poll loop is the whole path); io_uring and AF_XDP are not used (docs/benchmarks.md, \"The 8-byte path\")"
                    ),
                    "",
                ),
                Err(e) => check(
                    "rxe-rx-path",
                    Level::Warn,
                    format!(
                        "UDP sockets (sendmmsg/recvmmsg, GSO/GRO){place}{moderation}; SO_BUSY_POLL {usecs} us refused ({e}): busy-polling devices poll the socket only, not the NIC's queue"
                    ),
                    "run as root (CAP_NET_ADMIN) or raise net.core.busy_read to 50",
                ),
            });
        }
        Err(e) => v.push(check(
            "udp-gso",
            Level::Warn,
            format!("UDP socket: {e}"),
            "",
        )),
    }
    v.push(rx_ring_check());
    v.push(tx_frames_check());
    v.push(crc_check());
    v
}

/// Which CRC-32 kernel computes the ICRC of every payload byte rnic-rxe
/// sends (`rnic_dma::crc`): on a loopback bandwidth run it is the largest
/// user-space cost of the sender, so its width bounds rxe bandwidth.
fn crc_check() -> Check {
    use rnic::dma::crc::Kernel;
    let k = Kernel::selected();
    match k {
        Kernel::Vpclmul512 => check(
            "icrc-crc",
            Level::Ok,
            "ICRC computed with 512-bit carry-less folds (AVX-512F + VPCLMULQDQ), the widest CRC kernel rnic has",
            "",
        ),
        Kernel::Vpclmul256 => check(
            "icrc-crc",
            Level::Ok,
            "ICRC computed with 256-bit carry-less folds (AVX2 + VPCLMULQDQ): this CPU has no AVX-512F for the 512-bit kernel",
            "",
        ),
        Kernel::Pclmul128 => check(
            "icrc-crc",
            Level::Ok,
            "ICRC computed with 128-bit carry-less folds (PCLMULQDQ): this CPU has no VPCLMULQDQ (Intel Ice Lake and later, AMD Zen 3 and later), whose 256-bit kernel runs about twice as fast where both were measured (docs/benchmarks.md, \"The ICRC read in place\"); on a loopback bandwidth run the ICRC then takes about a quarter of the sender's CPU",
            "",
        ),
        _ if cfg!(target_arch = "x86_64") => check(
            "icrc-crc",
            Level::Warn,
            format!(
                "ICRC computed by the {} kernel (a bounce buffer and crc32fast's table fallback): this CPU reports no PCLMULQDQ, so every payload byte's CRC runs several times slower than with carry-less folds and bounds rxe bandwidth",
                k.name()
            ),
            "run on a CPU with PCLMULQDQ (x86-64 servers since 2010 have it; a VM may hide it: check the hypervisor's CPU model)",
        ),
        _ => check(
            "icrc-crc",
            Level::Ok,
            format!(
                "ICRC computed by the {} kernel (a bounce buffer and crc32fast, which uses this architecture's CRC instructions where it has them)",
                k.name()
            ),
            "",
        ),
    }
}

/// Whether this process can open the packet-ring receive path
/// (`RNIC_RXE_RX_RING=1`), by opening one on 127.0.0.1 (port 0, which
/// nothing uses).
fn rx_ring_check() -> Check {
    match rnic::rxe::ring::PacketRing::open(std::net::Ipv4Addr::LOCALHOST, 0) {
        Ok(_) => check(
            "rxe-rx-ring",
            Level::Ok,
            "packet rings available: with RNIC_RXE_RX_RING=1 an IPv4 address receives through an AF_PACKET TPACKET_V2 ring polled in memory (an idle poll is a load, a datagram needs no system call; the device binds exclusively): the lowest-latency path, and with frame transmit beside it also the fastest bulk path measured on lo (docs/benchmarks.md)",
            "",
        ),
        Err((what, e)) => check(
            "rxe-rx-ring",
            Level::Warn,
            format!(
                "no packet ring: {what} failed ({e}); devices receive through their UDP sockets"
            ),
            "run as root (CAP_NET_RAW) on Linux 6.2+ for the low-latency receive path (RNIC_RXE_RX_RING=1)",
        ),
    }
}

/// Frame transmit beside the packet ring: the frame socket opens, and
/// whether frames leave on loopback (the sysctls) — on an Ethernet
/// interface they need nothing more.
fn tx_frames_check() -> Check {
    match rnic::rxe::frames::FrameTx::open() {
        Err(e) => check(
            "rxe-tx-frames",
            Level::Warn,
            format!("no frame socket ({e}): a ring device sends through its UDP sockets"),
            "run as root (CAP_NET_RAW) to send datagrams as frames beside the packet ring",
        ),
        Ok(_) => {
            let lo = match rnic::rxe::frames::loopback_sysctls() {
                Ok(()) => "and on lo (accept_local and route_localnet are set)".to_owned(),
                Err(why) => format!("— on lo they keep the UDP socket: {why}"),
            };
            check(
                "rxe-tx-frames",
                Level::Ok,
                format!(
                    "with RNIC_RXE_RX_RING=1, datagrams to IPv4 peers leave as whole frames \
                     through an AF_PACKET socket (RNIC_RXE_TX_FRAMES=0: never) to on-link \
                     Ethernet neighbours {lo}"
                ),
                "",
            )
        }
    }
}

/// `rnicctl doctor`.
pub fn main(json_out: bool) -> Result<ExitCode, CtlError> {
    let v = checks();
    let fails = v.iter().filter(|c| c.level == Level::Fail).count();
    if json_out {
        let j = json!({
            "checks": v.iter().map(|c| json!({
                "name": c.name,
                "level": match c.level { Level::Ok => "OK", Level::Warn => "WARN", Level::Fail => "FAIL" },
                "detail": c.detail,
                "fix": c.fix,
            })).collect::<Vec<_>>(),
            "failures": fails,
        });
        println!("{j}");
    } else {
        for c in &v {
            let lvl = match c.level {
                Level::Ok => "OK  ",
                Level::Warn => "WARN",
                Level::Fail => "FAIL",
            };
            if c.fix.is_empty() {
                println!("{lvl} {:<12} {}", c.name, c.detail);
            } else {
                println!("{lvl} {:<12} {} — fix: {}", c.name, c.detail, c.fix);
            }
        }
    }
    if fails > 0 {
        eprintln!("rnicctl: {}", CtlError::DoctorFailed(fails));
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}
