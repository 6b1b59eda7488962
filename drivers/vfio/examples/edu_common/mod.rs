//! What the edu examples (`edu.rs`, `peer_bar.rs`) share: the device's
//! constants and one DMA (QEMU docs/specs/edu.rst).

use std::time::{Duration, Instant};

use rnic_dma::Mmio;

/// Errors of the examples.
pub type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// edu's DMA mask: 28 bits.
pub const DMA_MASK: u64 = (1 << 28) - 1;
/// edu's internal buffer, as a DMA source or destination.
pub const EDU_BUF: u64 = 0x4_0000;
/// QEMU 7.2's edu aborts on a transfer ending at its buffer's end: 2 KiB.
pub const LEN: usize = 2048;
/// Command bit 0: start.
pub const CMD_START: u64 = 1;
/// Command bit 1: edu → RAM.
pub const CMD_TO_RAM: u64 = 2;

/// Run one edu DMA and wait for the engine to finish (up to 10 s).
pub fn dma(bar: &Mmio, src: u64, dst: u64, len: usize, cmd: u64) -> Res<Duration> {
    let t0 = Instant::now();
    bar.write64(0x80, src)?;
    bar.write64(0x88, dst)?;
    bar.write64(0x90, len as u64)?;
    bar.write64(0x98, CMD_START | cmd)?;
    while bar.read64(0x98)? & CMD_START != 0 {
        if t0.elapsed() > Duration::from_secs(10) {
            return Err("edu DMA did not complete within 10 s".into());
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    Ok(t0.elapsed())
}
