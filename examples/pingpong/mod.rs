//! What `rc_pingpong` and `ud_pingpong` share: opening the `-d` device, the
//! `-c` payload pattern, GID printing and the initial PSN.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rnic::core::{
    AccessFlags, CompletionQueue, Context, Gid, InitParams, Memory, MemoryRegion, ProtectionDomain,
    QpCaps, QpInitAttr, QpType, QueuePair, RecvWr, Sge, WcStatus, WorkCompletion,
};
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

/// The options ibv_rc_pingpong and ibv_ud_pingpong share.
#[derive(clap::Args, Debug)]
pub struct Common {
    /// Listen on / connect to TCP port.
    #[arg(short = 'p', long = "port", default_value_t = 18515)]
    pub port: u16,
    /// Device: a spec (rxe:<netdev|ip>, mlx5:<bdf>@<ip>,
    /// mlx5:vfio-user:<socket>@<ip>) or a netdev name.
    #[arg(short = 'd', long = "ib-dev", default_value = "rxe")]
    pub device: String,
    /// Port of the device.
    #[arg(short = 'i', long = "ib-port", default_value_t = 1,
          value_parser = clap::value_parser!(u8).range(1..))]
    pub ib_port: u8,
    /// Number of receives to post at a time.
    #[arg(short = 'r', long = "rx-depth", default_value_t = 500,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub rx_depth: u32,
    /// Number of exchanges.
    #[arg(short = 'n', long = "iters", default_value_t = 1000,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub iters: u32,
    /// Service level value (RoCE: the traffic class).
    #[arg(short = 'l', long = "sl", default_value_t = 0)]
    pub sl: u8,
    /// Sleep on CQ events (default poll).
    #[arg(short = 'e', long = "events")]
    pub events: bool,
    /// Local port GID index.
    #[arg(short = 'g', long = "gid-idx", default_value_t = 0)]
    pub gid_idx: u8,
    /// Validate every received buffer (rnic's per-message pattern).
    #[arg(short = 'c', long = "chk")]
    pub check: bool,
    /// Print the rxe device's counters at the end (rnic only).
    #[arg(long = "stats")]
    pub stats: bool,
    /// Server to connect to (none: be the server).
    pub servername: Option<String>,
}

/// The `wr_id` of every receive.
pub const RECV_WRID: u64 = 1;
/// The `wr_id` of every send.
pub const SEND_WRID: u64 = 2;

/// What the stock pingpongs' main loop needs to know.
pub struct Loop<'a> {
    /// Exchanges to make.
    pub iters: u32,
    /// Receives to keep posted.
    pub rx_depth: u32,
    /// Receives posted before the loop.
    pub routs: u32,
    /// Sleep on CQ events instead of polling.
    pub events: bool,
    /// The client sends first.
    pub client: bool,
    /// The rxe device to drive while busy polling (`None`: mlx5, or `-e`).
    pub dev: Option<&'a RxeDevice>,
}

impl<'a> Loop<'a> {
    /// The loop `args` ask for, `routs` receives posted.
    pub fn new(args: &Common, routs: u32, dev: Option<&'a RxeDevice>) -> Loop<'a> {
        Loop {
            iters: args.iters,
            rx_depth: args.rx_depth,
            routs,
            events: args.events,
            client: args.servername.is_some(),
            dev,
        }
    }
}

/// ibv_{rc,ud}_pingpong's loop: the client sends first; each side sends
/// message `scnt` once its previous send completed and a message arrived;
/// receives are reposted (`post_recvs` posts up to `n` and says how many)
/// when at most one is left. `on_recv` sees each receive with its sequence
/// number. Returns the seconds from the first send to the last completion.
pub fn run_loop(
    qp: &mut QueuePair,
    cq: &mut CompletionQueue,
    l: &Loop<'_>,
    mut post_recvs: impl FnMut(&mut QueuePair, u32) -> u32,
    mut post_send: impl FnMut(&mut QueuePair, u32) -> Result<(), String>,
    mut on_recv: impl FnMut(&WorkCompletion, u32) -> Result<(), String>,
) -> Result<f64, String> {
    let start = Instant::now();
    let mut routs = l.routs;
    let mut pending = RECV_WRID;
    let (mut scnt, mut rcnt) = (0u32, 0u32);
    if l.client {
        post_send(qp, 0)?;
        pending |= SEND_WRID;
    }
    let mut wcs = [WorkCompletion::default(); 2];
    while rcnt < l.iters || scnt < l.iters {
        let n = if l.events {
            if !cq
                .wait(Some(Duration::from_secs(30)))
                .map_err(|e| format!("Failed to get cq_event: {e}"))?
            {
                return Err("Failed to get cq_event: timed out".into());
            }
            cq.req_notify(false)
                .map_err(|e| format!("Couldn't request CQ notification: {e}"))?;
            cq.poll(&mut wcs)
                .map_err(|e| format!("poll CQ failed: {e}"))?
        } else {
            let n = cq
                .poll(&mut wcs)
                .map_err(|e| format!("poll CQ failed: {e}"))?;
            if let Some(d) = l.dev.filter(|_| n == 0) {
                d.progress();
            }
            n
        };
        for wc in &wcs[..n] {
            if wc.status != WcStatus::Success {
                return Err(format!(
                    "Failed status {} ({}) for wr_id {}",
                    wc.status.as_str(),
                    wc.status.as_raw(),
                    wc.wr_id
                ));
            }
            match wc.wr_id {
                SEND_WRID => scnt += 1,
                RECV_WRID => {
                    routs -= 1;
                    if routs <= 1 {
                        routs += post_recvs(qp, l.rx_depth - routs);
                        if routs < l.rx_depth {
                            return Err(format!("Couldn't post receive ({routs})"));
                        }
                    }
                    on_recv(wc, rcnt)?;
                    rcnt += 1;
                }
                other => return Err(format!("Completion for unknown wr_id {other}")),
            }
            pending &= !wc.wr_id;
            if scnt < l.iters && pending == 0 {
                post_send(qp, scnt)?;
                pending = RECV_WRID | SEND_WRID;
            }
        }
    }
    Ok(start.elapsed().as_secs_f64())
}

/// Post up to `n` copies of the receive of `sges`; how many were posted.
pub fn post_recvs(qp: &mut QueuePair, sges: &[Sge], n: u32) -> u32 {
    (0..n)
        .take_while(|_| qp.post_recv(&[RecvWr::new(RECV_WRID, sges)]).is_ok())
        .count() as u32
}

/// A pingpong's verbs objects. Field order is drop order.
pub struct Objects {
    /// The QP, in INIT.
    pub qp: QueuePair,
    /// `mem` registered for local writes.
    pub mr: MemoryRegion,
    /// The buffer, from the device's memory source.
    pub mem: Arc<dyn Memory>,
    /// The CQ both queues complete into.
    pub cq: CompletionQueue,
    /// The protection domain.
    pub pd: ProtectionDomain,
}

/// PD, a `len`-byte registered buffer, a CQ and a `qp_type` QP with one
/// send and `rx_depth` receives (ibv_{rc,ud}_pingpong's `pp_init_ctx`),
/// moved to INIT with `init`.
pub fn objects(
    ctx: &Context,
    memory: &MemorySource,
    len: usize,
    rx_depth: u32,
    qp_type: QpType,
    init: &InitParams,
) -> Result<Objects, String> {
    let pd = ctx
        .alloc_pd()
        .map_err(|e| format!("Couldn't allocate PD: {e}"))?;
    let mem: Arc<dyn Memory> = memory
        .alloc(len.max(1))
        .map_err(|e| format!("Couldn't allocate the buffer: {e}"))?;
    let mr = pd
        .reg_mr(mem.clone(), AccessFlags::LOCAL_WRITE)
        .map_err(|e| format!("Couldn't register MR: {e}"))?;
    // The stock tools ask for rx_depth + 1 entries; an mlx5 function also
    // wants room for its rounded-up queues (a power-of-two RQ and up to 16
    // WQEBBs of send queue), which costs rxe nothing.
    let cq = ctx
        .create_cq(rx_depth.next_power_of_two().max(rx_depth + 1) + 16)
        .map_err(|e| format!("Couldn't create CQ: {e}"))?;
    let caps = QpCaps {
        max_send_wr: 1,
        max_recv_wr: rx_depth,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let mut qp = pd
        .create_qp(&cq, &cq, &QpInitAttr::new(qp_type, caps))
        .map_err(|e| format!("Couldn't create QP: {e}"))?;
    qp.to_init(init)
        .map_err(|e| format!("Failed to modify QP to INIT: {e}"))?;
    Ok(Objects {
        qp,
        mr,
        mem,
        cq,
        pd,
    })
}
