//! What `rc_pingpong` and `ud_pingpong` share: opening the `-d` device, the
//! `-c` payload pattern, GID printing and the initial PSN.

use rnic::core::{Context, Gid, Memory};
use rnic::rxe::{Progress, RxeConfig, RxeDevice, Target};
use rnic::{DeviceSpec, MemorySource, RxeTarget};

/// The opened device: its context, the rxe device when the backend is rxe
/// (busy-polling drives its progress), and where buffers come from.
pub type Opened = (Context, Option<RxeDevice>, MemorySource);

/// Open `spec` (a device spec or a bare netdev name). With `events`, rxe
/// runs its progress thread (completion channels need it); otherwise the
/// caller drives it.
pub fn open(spec: &str, events: bool) -> Result<Opened, String> {
    let spec = if spec.contains(':') || spec == "rxe" {
        spec.to_owned()
    } else {
        format!("rxe:{spec}")
    };
    match spec.parse::<DeviceSpec>().map_err(|e| e.to_string())? {
        DeviceSpec::Rxe(t) => {
            let target = match t {
                RxeTarget::Netdev(n) => Target::Netdev(n),
                RxeTarget::Ip(ip) => Target::Ip(ip),
            };
            let progress = if events {
                Progress::Thread
            } else {
                Progress::Caller
            };
            let dev = RxeDevice::open(&RxeConfig::new(target).with_progress(progress))
                .map_err(|e| format!("Couldn't get context for {spec}: {e}"))?;
            Ok((dev.context(), Some(dev), MemorySource::Host))
        }
        _ => rnic::open_with_memory(&spec)
            .map(|(c, m)| (c, None, m))
            .map_err(|e| format!("Couldn't get context for {spec}: {}", rnic::error_chain(&e))),
    }
}

/// The `-c` payload of message `seq`: byte `i` is `seq + i` (mod 256).
fn pattern(size: usize, seq: u32) -> impl Iterator<Item = u8> {
    (0..size).map(move |i| (seq as usize).wrapping_add(i) as u8)
}

/// Write message `seq`'s payload at `off`.
pub fn fill(mem: &dyn Memory, off: usize, size: usize, seq: u32) -> Result<(), String> {
    let bytes: Vec<u8> = pattern(size, seq).collect();
    mem.write(off, &bytes)
        .map_err(|e| format!("Couldn't fill the send buffer: {e}"))
}

/// Whether the `size` bytes at `off` are message `seq`'s payload.
pub fn check(mem: &dyn Memory, off: usize, size: usize, seq: u32) -> bool {
    let mut got = vec![0u8; size];
    mem.read(off, &mut got).is_ok() && got.into_iter().eq(pattern(size, seq))
}

/// The GID with index `idx` in port `port`'s table.
pub fn local_gid(ctx: &Context, port: u8, idx: u8) -> Result<Gid, String> {
    ctx.query_gid_table(port)
        .map_err(|e| e.to_string())?
        .iter()
        .find(|g| g.index == u32::from(idx))
        .map(|g| g.gid)
        .ok_or_else(|| format!("can't read sgid of index {idx}"))
}

/// A GID as `inet_ntop(AF_INET6)` prints it (`::ffff:127.0.0.1`).
pub fn gid_str(gid: &Gid) -> String {
    std::net::Ipv6Addr::from(*gid.raw()).to_string()
}

/// `lrand48() & 0xffffff` stand-in: the clock's nanoseconds.
pub fn rand_psn() -> u32 {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| {
            d.subsec_nanos() ^ (d.as_secs() as u32).rotate_left(13)
        });
    (n ^ std::process::id().rotate_left(7)) & 0xFF_FFFF
}

/// The two result lines of the stock pingpongs: both directions' bytes.
pub fn print_results(size: u32, iters: u32, secs: f64) {
    let bytes = u64::from(size) * u64::from(iters) * 2;
    println!(
        "{bytes} bytes in {secs:.2} seconds = {:.2} Mbit/sec",
        bytes as f64 * 8.0 / secs / 1_000_000.0
    );
    println!(
        "{} iters in {secs:.2} seconds = {:.2} usec/iter",
        iters,
        secs * 1_000_000.0 / f64::from(iters)
    );
}
