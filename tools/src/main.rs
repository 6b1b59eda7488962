//! `rnicctl`: the operator's tool for rnic.
//!
//! * `list` — every RDMA-capable function: mlx5 PCI functions (driver, IOMMU
//!   group, NUMA node, link) and the rxe backend's endpoints (interfaces,
//!   GIDs, MTU).
//! * `bind` / `unbind` — move an mlx5 function to vfio-pci and back.
//! * `doctor` — check what a first run needs; one line per check with a fix.
//! * `info <spec>` — device attributes, ports, GID table, limits.
//! * `stats` — counters (of a perf run; live IPC is future work).
//! * `perf <test>` — perftest-compatible bandwidth/latency tests.
//! * `mlx5 layouts` — the mlx5 PRM layout table (`--json` for tools).
//! * `emu start|list|stop` — emulated ConnectX functions (rnic-mlx5-emu).
//! * `topo` — NUMA nodes, NICs, GPUs, how they connect, rnic's pairing (hwloc).
#![forbid(unsafe_code)]

mod doctor;
mod doctor_gpu;
mod emu;
mod error;
mod info;
mod list;
mod mlx5;
mod neigh;
mod pci;
mod perf;
mod stats;
mod topo;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use error::CtlError;

/// Drive RDMA NICs from userspace: inspect, bind, check and measure.
#[derive(Parser, Debug)]
#[command(name = "rnicctl", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// List RDMA-capable functions: mlx5 PCI functions and rxe endpoints.
    ///
    /// mlx5 functions are found by vendor 0x15b3 and the ConnectX device ids;
    /// each shows its driver, IOMMU group, NUMA node and PCIe link. rxe
    /// endpoints are the network interfaces with their GIDs (IPv4 as
    /// ::ffff:a.b.c.d) and the path MTU their interface MTU allows.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Root of the sysfs tree to read (tests use a synthetic one).
        #[arg(long, default_value = "/sys", hide = true)]
        sysfs_root: PathBuf,
    },
    /// Bind a PCI function to vfio-pci (remembering its driver for unbind).
    ///
    /// Shows the other members of its IOMMU group (all must leave their host
    /// drivers for VFIO to open the group) and refuses when the function —
    /// or a group member — carries the interface with the default route,
    /// unless --force.
    Bind {
        /// PCI address, e.g. 0000:3b:00.1.
        bdf: String,
        /// Say what would be done, change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Bind even if it takes down the default-route interface.
        #[arg(long)]
        force: bool,
        /// Root of the sysfs tree (tests use a synthetic one).
        #[arg(long, default_value = "/sys", hide = true)]
        sysfs_root: PathBuf,
        /// The routing table to check (tests use a synthetic one).
        #[arg(long, default_value = "/proc/net/route", hide = true)]
        route_table: PathBuf,
    },
    /// Give a function back to the driver it had before `bind`.
    Unbind {
        /// PCI address.
        bdf: String,
        /// Say what would be done, change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Driver to restore when none was remembered (default mlx5_core).
        #[arg(long)]
        driver: Option<String>,
        /// Root of the sysfs tree.
        #[arg(long, default_value = "/sys", hide = true)]
        sysfs_root: PathBuf,
    },
    /// Check everything a first run needs; prints a fix for each failure.
    ///
    /// Exit status 1 when a check FAILs (WARNs do not fail).
    Doctor {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Device attributes, ports, GID table, MTU and limits of a device spec.
    Info {
        /// rxe:<netdev|ip>, mlx5:<bdf>, or a bare netdev name.
        spec: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// An mlx5 function's neighbour cache: its port's ARP/ND entries (`ip neigh`'s view),
    /// static and host-kernel entries, and the port's counters.
    ///
    /// The spec needs the port's L2 (`neigh=arp`, the default for a PCI function). The cache
    /// is this command's own port's: empty at first, so `--resolve <ip>` asks the network
    /// (ARP for IPv4, neighbour discovery for IPv6) before listing. Exit status 1 when an
    /// address does not answer. Example: `rnicctl neigh 'mlx5:0000:17:00.1@10.0.0.1?neigh=arp'
    /// --resolve 10.0.0.2`.
    Neigh {
        /// mlx5:<bdf|socket>[@ip][?neigh=arp&vlan=..&mtu=..].
        spec: String,
        /// Resolve this address first (repeatable).
        #[arg(long, value_name = "IP")]
        resolve: Vec<std::net::IpAddr>,
        /// How long each resolution may take, in seconds.
        #[arg(long, default_value_t = 3.0, value_name = "SECONDS")]
        wait: f64,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Counters: live (of processes serving /run/rnic/<pid>.sock), or saved.
    ///
    /// Without an argument: every live process (`rnicctl perf … --stats-socket`
    /// serves one). With a PID: that process. With a file: the JSON of
    /// `rnicctl perf … --stats --json`. With a device spec: a device this
    /// command opens. Per device: packets, bytes, ICRC drops; per QP:
    /// retransmits, NAKs by code, RNR waits, duplicates; per CQ: high-water
    /// mark and credit stalls.
    Stats {
        /// PID, saved JSON file, or device spec.
        target: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// perftest-compatible tests: write/read/send/atomic, bw/lat.
    ///
    /// Server: `rnicctl perf write-bw -d rxe:10.0.0.1`; client: `rnicctl perf
    /// write-bw -d rxe:10.0.0.2 10.0.0.1`. The TCP exchange is perftest
    /// 4.5-0.17's (Debian bookworm), so either side may be a stock
    /// ib_write_bw / ib_send_lat / … on a kernel rxe device.
    ///
    /// rxe devices read the environment: RNIC_RXE_RX_RING=1 receives through
    /// a packet ring polled in memory (the lowest latency; root, Linux 6.2+;
    /// `rnicctl doctor` says whether it is available) and with it sends to
    /// on-link peers as whole frames (RNIC_RXE_TX_FRAMES=0 turns that off; on
    /// loopback frames need lo's accept_local and route_localnet, which
    /// `rnicctl doctor` checks), RNIC_RXE_RX_PLACE=1 receives READ response
    /// payloads straight into the READ's buffer, RNIC_RXE_SHARE=0 binds the
    /// address exclusively, RNIC_RXE_RX_MODERATION_US sets the shortest nap
    /// of a progress thread (`-e`) between rounds while a dense stream
    /// arrives, instead of being woken by each datagram (default 10 µs,
    /// growing to 100 with the requester window; 0 turns receive moderation
    /// off). QPs keep up to 1024 PSNs in flight (rxe: 128) where the
    /// device's sockets got 8 MiB receive buffers (CAP_NET_ADMIN), else 128;
    /// a loss halves the window, progress regrows it.
    Perf(perf::PerfArgs),
    /// mlx5 driver facts that need no device (`rnicctl mlx5 layouts --json`).
    #[command(subcommand)]
    Mlx5(mlx5::Mlx5Cmd),
    /// Emulated ConnectX functions: `emu start`, `emu list`, `emu stop`.
    ///
    /// Each is an rnic-mlx5-emu process serving a vfio-user socket
    /// (default /run/rnic/emu/<name>.sock) that the mlx5 driver opens as
    /// `mlx5:vfio-user:<socket>`.
    Emu(emu::EmuArgs),
    /// NUMA nodes and distances, NICs and GPUs with their nearest node and
    /// CPUs, how each NIC reaches each GPU (PIX/PXB/PHB/NODE/SYS, as NCCL
    /// names them) and the pairing and placement rnic chooses (hwloc).
    Topo(topo::TopoArgs),
}

fn run(cli: Cli) -> Result<ExitCode, CtlError> {
    match cli.cmd {
        Cmd::List { json, sysfs_root } => list::main(&sysfs_root, json).map(|()| ExitCode::SUCCESS),
        Cmd::Bind {
            bdf,
            dry_run,
            force,
            sysfs_root,
            route_table,
        } => pci::bind_main(&sysfs_root, &route_table, &bdf, dry_run, force)
            .map(|()| ExitCode::SUCCESS),
        Cmd::Unbind {
            bdf,
            dry_run,
            driver,
            sysfs_root,
        } => pci::unbind_main(&sysfs_root, &bdf, dry_run, driver.as_deref())
            .map(|()| ExitCode::SUCCESS),
        Cmd::Doctor { json } => doctor::main(json),
        Cmd::Info { spec, json } => info::main(&spec, json).map(|()| ExitCode::SUCCESS),
        Cmd::Neigh {
            spec,
            resolve,
            wait,
            json,
        } => {
            if !(wait.is_finite() && wait > 0.0 && wait <= 60.0) {
                return Err(CtlError::Usage(format!(
                    "--wait {wait}: give seconds in (0, 60]"
                )));
            }
            neigh::main(
                &spec,
                &resolve,
                std::time::Duration::from_secs_f64(wait),
                json,
            )
            .map(|()| ExitCode::SUCCESS)
        }
        Cmd::Stats { target, json } => {
            stats::main(target.as_deref(), json).map(|()| ExitCode::SUCCESS)
        }
        Cmd::Perf(a) => perf::main(&a).map(|()| ExitCode::SUCCESS),
        Cmd::Emu(a) => emu::main(&a)
            .map(|()| ExitCode::SUCCESS)
            .map_err(CtlError::from),
        Cmd::Topo(a) => topo::main(&a).map(|()| ExitCode::SUCCESS),
        Cmd::Mlx5(c) => {
            mlx5::main(&c);
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("rnicctl: {e}");
            ExitCode::FAILURE
        }
    }
}
