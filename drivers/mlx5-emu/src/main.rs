//! `rnic-mlx5-emu`: serve an emulated ConnectX-5 function over vfio-user.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, mpsc};
use std::time::Duration;

use clap::Parser;
use nix::sys::signal::{SigSet, Signal};
use rnic_mlx5_emu::control::{ControlListener, Controller};
use rnic_mlx5_emu::report::{Reporter, StateReport};
use rnic_mlx5_emu::{AfterDisconnect, Disconnect, Emulator, FirmwareOptions, Options};

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
    /// `error-cqe-recv …`, `health SYNDROME`, `health-stop`, `pages +N|-N`,
    /// `clear`, `help`),
    /// one JSON line a reply. Removed at exit.
    #[arg(long, value_name = "PATH")]
    control: Option<PathBuf>,
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
    let options = Options {
        boot_delay: Duration::from_millis(args.boot_delay_ms),
        health_period: Duration::from_millis(args.health_period_ms.max(1)),
        firmware: FirmwareOptions {
            boot_pages: args.boot_pages,
            init_pages: args.init_pages,
            ..FirmwareOptions::default()
        },
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
