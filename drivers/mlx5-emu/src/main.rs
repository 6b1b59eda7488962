//! `rnic-mlx5-emu`: serve an emulated ConnectX-5 function over vfio-user.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, mpsc};
use std::time::Duration;

use clap::{Parser, ValueEnum};
use nix::sys::signal::{SigSet, Signal};
use rnic_mlx5_emu::control::{ControlListener, Controller};
use rnic_mlx5_emu::eth::{mac_from_name, parse_mac};
use rnic_mlx5_emu::firmware::strict::CHECKS;
use rnic_mlx5_emu::report::{Reporter, StateReport};
use rnic_mlx5_emu::{
    AfterDisconnect, Bar0Mapping, Disconnect, Emulator, FirmwareOptions, Options, PortSpeed,
    PortType, Strictness, Wire,
};
use rnic_mlx5_prm::inline_mode;

/// An emulated ConnectX-5 (mlx5, PCI 15b3:1017) function served over a
/// vfio-user UNIX socket, for running the rnic mlx5 driver without hardware.
///
/// The driver connects with `rnic::open("mlx5:vfio-user:PATH")` (or
/// `rnic_mlx5::VfioUserFunction::connect(PATH)`). BAR0 (32 MiB) is shared
/// memory: the initialization segment, the command doorbell and the UAR
/// pages are mmapped by the driver. The emulated firmware executes the
/// command interface (bring-up, pages, capabilities, UAR/PD) strictly and
/// completes commands by polling. One driver is served at a time; when it
/// disconnects (cleanly or by dying) the function is reset and the next one
/// may connect, until SIGTERM or SIGINT (or, with --once, the first driver's
/// disconnect) stops it: the socket is removed and it exits 0. SIGUSR1
/// rewrites the --state-file. Logs go to
/// stderr (RUST_LOG=debug for every doorbell and DMA mapping).
///
/// The port: by default RoCE v2 runs over UDP sockets of this host
/// (`--wire udp`); `--wire dgram:…` or `--wire packet:IFNAME` make it an
/// Ethernet port with the function's MAC (`--mac`), carrying whole frames
/// (see --wire; docs/mlx5-emu.md "The Ethernet port").
#[derive(Debug, Parser)]
#[command(name = "rnic-mlx5-emu", version)]
struct Args {
    /// The vfio-user socket to listen on. A stale socket left by a dead
    /// emulator is removed; one that something listens on is an error.
    #[arg(long, value_name = "PATH")]
    socket: PathBuf,
    /// Milliseconds from power-on (and from every reset) until the init
    /// segment's `initializing` bit clears.
    #[arg(long, value_name = "N", default_value_t = 100)]
    boot_delay_ms: u64,
    /// Milliseconds between health-counter ticks.
    #[arg(long, value_name = "N", default_value_t = 50)]
    health_period_ms: u64,
    /// Pages the firmware asks for with QUERY_PAGES(boot).
    #[arg(long, value_name = "N", default_value_t = 16)]
    boot_pages: u32,
    /// Pages the firmware asks for with QUERY_PAGES(init).
    #[arg(long, value_name = "N", default_value_t = 32)]
    init_pages: u32,
    /// Exit (removing the socket) when the first driver disconnects, instead
    /// of resetting the function and serving the next one.
    #[arg(long)]
    once: bool,
    /// When a driver disconnects (or its process dies), keep the function as
    /// it left it — initialized, its pages and objects — dropping only its DMA
    /// mappings and interrupt eventfds, as a real function whose owner died
    /// without a reset: the next driver must reset it (FLR) before bring-up.
    #[arg(long)]
    keep_state_on_disconnect: bool,
    /// Keep a JSON state report at PATH: pages held, live objects, DMA
    /// mappings, what the last driver left behind, counters. Rewritten
    /// atomically at start, after each driver disconnects, on SIGUSR1 (the
    /// live state, a driver connected or not) and at exit.
    #[arg(long, value_name = "PATH")]
    state_file: Option<PathBuf>,
    /// Serve a control socket at PATH (a UNIX stream socket): one request a
    /// line (`state`, `fail-next OPCODE STATUS SYNDROME`, `swallow-next`,
    /// `delay-next [OPCODE] MS`, `error-cqe QPN|any SYNDROME [VENDOR]`,
    /// `error-cqe-recv …`, `health SYNDROME [rfr]`, `health-warn SYNDROME`,
    /// `health-stop`, `nic-state disabled|sw-reset`, `link up|down`,
    /// `pages +N|-N`, `take-zero N`, `rewrite-reply …`, `clear`, `help`),
    /// one JSON line a reply. Removed at exit.
    #[arg(long, value_name = "PATH")]
    control: Option<PathBuf>,
    /// Turn on every check of issue 26 (the audit's rows; docs/mlx5-emu.md
    /// "Issue 26"): object creation charged firmware pages with the command
    /// held until its page request is answered, BlueFlame bodies judged
    /// (uncombined on a uc BAR0, interleaved writes), UD MTU, zero-length receive
    /// segments, fatal EQ overrun, SET_HCA_CAP payload, cmd_interface_rev while
    /// initializing, CREATE_CQ pas length. Without it the emulator behaves as
    /// before them (for now the default).
    #[arg(long)]
    strict: bool,
    /// Turn off the named checks (comma-separated), after --strict:
    /// page-requests, blueflame, ud-mtu, recv-zero-length, eq-overrun,
    /// cap-payload, cmdif-rev, cq-pas.
    #[arg(long, value_name = "CHECK,…")]
    lenient: Option<String>,
    /// Firmware pages each CQ, QP and MKey costs while the page-requests check
    /// is on (0: none).
    #[arg(long, value_name = "N", default_value_t = 1)]
    object_pages: u32,
    /// How config space advertises BAR0: `uc` a non-prefetchable BAR (as
    /// kernel VFIO maps it: 8-byte doorbells only), `wc` a prefetchable one
    /// (a write-combining mapping takes BlueFlame copies).
    #[arg(long, value_enum, default_value_t = Bar0Arg::Uc)]
    bar0: Bar0Arg,
    /// The port's link layer (general cap port_type): `ib` refuses RoCE setup.
    #[arg(long, value_enum, default_value_t = PortTypeArg::Eth)]
    port_type: PortTypeArg,
    /// The port speed PTYS reports, in Gb/s: 10, 25, 40, 50 or 100.
    #[arg(long, value_name = "GBPS", default_value_t = 100, value_parser = parse_speed)]
    port_speed: u32,
    /// General cap num_vhca_ports: when nonzero SET/QUERY_ROCE_ADDRESS must
    /// name a port 1..=N in vhca_port_num.
    #[arg(long, value_name = "N", default_value_t = 0)]
    num_vhca_ports: u8,
    /// Advertise cap terminate_scatter_list_mkey: QUERY_SPECIAL_CONTEXTS names
    /// the key that ends a receive scatter list (0x100 becomes an ordinary key).
    #[arg(long)]
    terminate_scatter_key: bool,
    /// Clear general cap `atomic`: RST2INIT with rae or atomic_mode is refused.
    #[arg(long)]
    no_atomic: bool,
    /// RoCE cap qp_ts_format: which QP ts_format CREATE_QP accepts (default
    /// is always accepted).
    #[arg(long, value_enum, default_value_t = TsFormatArg::FreeRunning)]
    roce_qp_ts_format: TsFormatArg,
    /// What the function's port is cabled to. `udp` (the default): RoCE v2
    /// over UDP/4791 sockets of this host, one per GID, no L2.
    /// `dgram:local=ADDR:PORT,remote=ADDR:PORT`: Ethernet frames, one per UDP
    /// datagram between the two addresses — QEMU's `-netdev dgram` (and
    /// `-netdev socket,udp=`) protocol, so a guest's NIC is cabled straight
    /// to the port. `packet:IFNAME`: Ethernet frames on a host interface
    /// through AF_PACKET (promiscuous; needs root), e.g. a veth end. On an
    /// Ethernet wire every frame is whole (RoCE v2 and everything else),
    /// unicast for other MACs is dropped, and only the NIC RX flow table
    /// rules the driver installs let other frames in.
    #[arg(long, value_name = "WIRE", default_value = "udp")]
    wire: Wire,
    /// The function's MAC address (its vport's permanent address). Default:
    /// a locally administered address derived from the --socket path.
    #[arg(long, value_name = "MAC", value_parser = parse_mac)]
    mac: Option<[u8; 6]>,
    /// The port MTU on an Ethernet wire: the most L2 payload bytes a frame
    /// may carry, either way (larger frames are dropped and counted). The
    /// vport MTU the driver sees is at most this.
    #[arg(long, value_name = "BYTES", default_value_t = 9000,
          value_parser = clap::value_parser!(u32).range(68..=9978))]
    port_mtu: u32,
    /// The vport context's min_wqe_inline_mode: the headers every raw
    /// Ethernet send WQE must carry inline (CREATE_SQ refuses an SQ asking
    /// for less): none, l2 (18 bytes), ip, tcp-udp.
    #[arg(long, value_enum, default_value_t = MinInlineArg::L2)]
    min_inline: MinInlineArg,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum MinInlineArg {
    None,
    L2,
    Ip,
    TcpUdp,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Bar0Arg {
    Uc,
    Wc,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum PortTypeArg {
    Eth,
    Ib,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum TsFormatArg {
    /// Free-running only (cap 0).
    FreeRunning,
    /// Real-time only (cap 1).
    RealTime,
    /// Both (cap 2).
    Both,
}

fn parse_speed(s: &str) -> Result<u32, String> {
    s.parse::<u32>()
        .ok()
        .filter(|g| PortSpeed::from_gbps(*g).is_some())
        .ok_or_else(|| format!("{s:?} is not a port speed: type 10, 25, 40, 50 or 100"))
}

/// The strictness `--strict` / `--lenient` select (the default set without either).
fn strictness(args: &Args) -> Result<Strictness, String> {
    let base = if args.strict {
        Strictness::strict()
    } else {
        Strictness::default()
    };
    match &args.lenient {
        None => Ok(base),
        Some(list) => base.lenient(list),
    }
}

/// What the main thread is told.
#[derive(Debug)]
enum Event {
    /// Stop: SIGTERM or SIGINT.
    Signal(Signal),
    /// Stop: the driver left (`--once`).
    Once,
    /// SIGUSR1: rewrite the state file.
    Report,
}

/// Write the state report, logging (not failing) when it cannot be written.
fn report(path: Option<&PathBuf>, r: &StateReport) {
    if let Some(p) = path
        && let Err(e) = r.write_atomic(p)
    {
        tracing::warn!(path = %p.display(), %e, "could not write the state file");
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    // SIGTERM/SIGINT are taken synchronously by one thread: blocked here,
    // before any thread exists, so every thread inherits the mask.
    let mut signals = SigSet::empty();
    signals.add(Signal::SIGTERM);
    signals.add(Signal::SIGINT);
    signals.add(Signal::SIGUSR1);
    if let Err(e) = signals.thread_block() {
        eprintln!("rnic-mlx5-emu: blocking SIGTERM/SIGINT: {e}");
        return ExitCode::FAILURE;
    }
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let strictness = match strictness(&args) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("rnic-mlx5-emu: --lenient: {e}");
            return ExitCode::FAILURE;
        }
    };
    let on: Vec<&str> = strictness
        .iter()
        .filter(|(_, on)| *on)
        .map(|(n, _)| n)
        .collect();
    tracing::info!(
        checks = %if on.is_empty() { "none (legacy)".to_owned() } else { on.join(",") },
        of = CHECKS.len(),
        "strictness"
    );
    let options = Options {
        boot_delay: Duration::from_millis(args.boot_delay_ms),
        health_period: Duration::from_millis(args.health_period_ms.max(1)),
        firmware: FirmwareOptions {
            boot_pages: args.boot_pages,
            init_pages: args.init_pages,
            strictness,
            object_pages: args.object_pages,
            port_type: match args.port_type {
                PortTypeArg::Eth => PortType::Eth,
                PortTypeArg::Ib => PortType::Ib,
            },
            port_speed: PortSpeed::from_gbps(args.port_speed).unwrap_or(PortSpeed::G100),
            num_vhca_ports: args.num_vhca_ports,
            terminate_scatter_key: args.terminate_scatter_key,
            atomic: !args.no_atomic,
            roce_qp_ts_format: match args.roce_qp_ts_format {
                TsFormatArg::FreeRunning => 0,
                TsFormatArg::RealTime => 1,
                TsFormatArg::Both => 2,
            },
            mac: args
                .mac
                .unwrap_or_else(|| mac_from_name(args.socket.as_os_str().as_encoded_bytes())),
            min_inline: match args.min_inline {
                MinInlineArg::None => inline_mode::NONE,
                MinInlineArg::L2 => inline_mode::L2,
                MinInlineArg::Ip => inline_mode::IP,
                MinInlineArg::TcpUdp => inline_mode::TCP_UDP,
            },
            ..FirmwareOptions::default()
        },
        bar0: match args.bar0 {
            Bar0Arg::Uc => Bar0Mapping::Uc,
            Bar0Arg::Wc => Bar0Mapping::Wc,
        },
        wire: args.wire,
        port_mtu: args.port_mtu,
        ..Options::default()
    };
    let (tx, rx) = mpsc::channel();
    let (sig_tx, once_tx) = (tx.clone(), tx);
    // What the last driver left, and the reporter once the emulator exists:
    // the hook runs from the first driver on, possibly before `start_hooked`
    // returns, so the initial report below reads `last` under the same lock.
    let last = Arc::new(Mutex::new(None));
    let reporter: Arc<OnceLock<Reporter>> = Arc::default();
    let hook = {
        let (once, state_file, last, reporter) = (
            args.once,
            args.state_file.clone(),
            last.clone(),
            reporter.clone(),
        );
        move |d: &Disconnect| {
            // The lock also keeps this write and main's apart.
            let mut last = last.lock().unwrap_or_else(PoisonError::into_inner);
            *last = Some(*d);
            if let Some(r) = reporter.get() {
                report(state_file.as_ref(), &r.report(!once, Some(*d)));
            }
            if once {
                let _ = once_tx.send(Event::Once);
                AfterDisconnect::Stop
            } else {
                AfterDisconnect::Serve
            }
        }
    };
    let emu = match Emulator::start_hooked(&args.socket, options, hook) {
        Ok(emu) => emu,
        Err(e) => {
            eprintln!("rnic-mlx5-emu: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Read at each disconnect: only a driver that connected and was gone
    // before this store (the socket listens from `start_hooked` on) would
    // have had the default reset.
    emu.keep_state_on_disconnect(args.keep_state_on_disconnect);
    let spawned = std::thread::Builder::new()
        .name("mlx5-emu-signals".into())
        .spawn(move || {
            while let Ok(sig) = signals.wait() {
                let ev = match sig {
                    Signal::SIGUSR1 => Event::Report,
                    sig => Event::Signal(sig),
                };
                if sig_tx.send(ev).is_err() {
                    break;
                }
            }
        });
    if let Err(e) = spawned {
        eprintln!("rnic-mlx5-emu: starting the signal thread: {e}");
        emu.shutdown();
        return ExitCode::FAILURE;
    }
    // Before the first report: a reader that sees the state file (rnicctl
    // emu start) finds the control socket listening.
    let control = match &args.control {
        None => None,
        Some(path) => match ControlListener::start(path, Controller::new(&emu, last.clone())) {
            Ok(c) => Some(c),
            Err(e) => {
                eprintln!("rnic-mlx5-emu: control socket {}: {e}", path.display());
                emu.shutdown();
                return ExitCode::FAILURE;
            }
        },
    };
    let reporter = {
        let last = last.lock().unwrap_or_else(PoisonError::into_inner);
        let r = reporter.get_or_init(|| Reporter::new(&emu)).clone();
        report(
            args.state_file.as_ref(),
            &r.report(!(args.once && last.is_some()), *last),
        );
        r
    };
    loop {
        match rx.recv() {
            Ok(Event::Report) => {
                let last = last.lock().unwrap_or_else(PoisonError::into_inner);
                report(args.state_file.as_ref(), &reporter.report(true, *last));
            }
            Ok(Event::Signal(sig)) => {
                tracing::info!("{sig} received: stopping");
                break;
            }
            Ok(Event::Once) => {
                tracing::info!("the driver disconnected (--once): stopping");
                break;
            }
            Err(_) => {
                tracing::warn!("no stop event can arrive any more: stopping");
                break;
            }
        }
    }
    {
        let last = last.lock().unwrap_or_else(PoisonError::into_inner);
        report(args.state_file.as_ref(), &reporter.report(false, *last));
    }
    if let Some(c) = control {
        c.shutdown();
    }
    emu.shutdown();
    ExitCode::SUCCESS
}
