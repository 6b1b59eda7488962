//! `rnic-mlx5-emu`: serve an emulated ConnectX-5 function over vfio-user.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use rnic_mlx5_emu::{Emulator, FirmwareOptions, Options};

/// An emulated ConnectX-5 (mlx5, PCI 15b3:1017) function served over a
/// vfio-user UNIX socket, for running the rnic mlx5 driver without hardware.
///
/// The driver connects with `rnic::open("mlx5:vfio-user:PATH")` (or
/// `rnic_mlx5::VfioUserFunction::connect(PATH)`). BAR0 (32 MiB) is shared
/// memory: the initialization segment, the command doorbell and the UAR
/// pages are mmapped by the driver. The emulated firmware executes the
/// command interface (bring-up, pages, capabilities, UAR/PD) strictly and
/// completes commands by polling. One driver is served at a time; when it
/// disconnects the function is reset and the next one may connect. Logs go to
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
}

fn main() -> ExitCode {
    let args = Args::parse();
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
    match Emulator::start(&args.socket, options) {
        Ok(emu) => {
            emu.wait();
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("rnic-mlx5-emu: {e}");
            ExitCode::FAILURE
        }
    }
}
