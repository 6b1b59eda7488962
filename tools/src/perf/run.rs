//! The test loops and the per-test order of perftest's exchanges.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rnic::core::{
    AccessFlags, CompletionQueue, Context, InitParams, Memory, MemoryRegion, Mtu, ProtectionDomain,
    Psn, QpCaps, QpInitAttr, QpType, QueuePair, RecvWr, Rkey, RtrParams, RtsParams, SendWr,
    WcStatus, WorkCompletion,
};
use rnic::rxe::{Progress, RxeConfig, RxeDevice, Target};
use rnic::{DeviceSpec, MemorySource, RxeTarget};
use serde_json::json;

use super::report::{self, BwRow, LatRow};
use super::wire::{BwReport, Dest, Role, Session};
use super::{Bar, CACHE_LINE, CYCLE_BUFFER, Outcome, Params, PerfArgs, Test, Verb};
use crate::error::CtlError;

/// An opened device: its context, the rxe device behind it (counters,
/// progress) and where its registrable memory comes from (host memory for
/// rxe, the function's DMA buffers for mlx5).
#[derive(Debug)]
pub struct Opened {
    /// The verbs context.
    pub ctx: Context,
    /// The rxe device, when the backend is rxe.
    pub dev: Option<RxeDevice>,
    /// Where buffers to register come from.
    pub memory: MemorySource,
}

/// Open a device spec the way every rnicctl command does (a bare netdev
/// name means `rxe:<name>`).
pub fn open_device(spec: &str, events: bool) -> Result<Opened, CtlError> {
    let spec = if spec.contains(':') || spec == "rxe" {
        spec.to_owned()
    } else {
        format!("rxe:{spec}")
    };
    let parsed: DeviceSpec = spec
        .parse()
        .map_err(|e: rnic::SpecError| CtlError::Usage(e.to_string()))?;
    match parsed {
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
            let dev =
                RxeDevice::open(&RxeConfig::new(target).with_progress(progress)).map_err(|e| {
                    CtlError::Open {
                        spec: spec.clone(),
                        why: e.to_string(),
                    }
                })?;
            Ok(Opened {
                ctx: dev.context(),
                dev: Some(dev),
                memory: MemorySource::Host,
            })
        }
        _ => rnic::open_with_memory(&spec)
            .map(|(ctx, memory)| Opened {
                ctx,
                dev: None,
                memory,
            })
            .map_err(|e| CtlError::Open {
                spec: spec.clone(),
                why: e.cause(),
            }),
    }
}

use rnic::error_chain;

fn verbs(what: &'static str) -> impl FnOnce(rnic::core::VerbsError) -> CtlError {
    move |e| CtlError::Verbs {
        what,
        why: e.to_string(),
    }
}

/// The resources of one run.
struct Bench {
    dev: Option<RxeDevice>,
    ctx: Context,
    _pd: ProtectionDomain,
    mem: Arc<dyn Memory>,
    mr: MemoryRegion,
    cq: CompletionQueue,
    qps: Vec<QueuePair>,
    /// Bytes per buffer slot: max(largest size, cycle buffer).
    slot: usize,
    events: bool,
    /// Receives posted and not yet completed, per QP.
    recvs: Vec<u32>,
    /// Sends posted and not yet completed, per QP.
    sends: Vec<u32>,
    wcs: Vec<WorkCompletion>,
}

impl Bench {
    fn new(args: &PerfArgs, p: &Params, cycle: u32) -> Result<Bench, CtlError> {
        let Opened { ctx, dev, memory } = open_device(&args.device, p.events)?;
        let max = p.sizes.iter().copied().max().unwrap_or(8) as usize;
        let slot = max.max(cycle as usize);
        let n = p.qps as usize;
        let pd = ctx.alloc_pd().map_err(verbs("allocating a PD"))?;
        let mem = memory.alloc(2 * n * slot).map_err(|e| CtlError::Verbs {
            what: "allocating the buffer",
            why: error_chain(&e),
        })?;
        let mr = pd
            .reg_mr(
                mem.clone(),
                AccessFlags::LOCAL_WRITE
                    | AccessFlags::REMOTE_WRITE
                    | AccessFlags::REMOTE_READ
                    | AccessFlags::REMOTE_ATOMIC,
            )
            .map_err(verbs("registering the buffer"))?;
        let send_depth = if p.test.is_lat() {
            p.tx_depth.max(16)
        } else {
            p.tx_depth
        };
        let recv_depth = if p.test.verb() == Verb::Send {
            p.rx_depth
        } else {
            1
        };
        let cq = ctx
            .create_cq_reserved(p.qps * (send_depth + recv_depth) + 16)
            .map_err(verbs("creating the CQ"))?;
        let caps = QpCaps {
            max_send_wr: send_depth,
            max_recv_wr: recv_depth,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: p.inline,
        };
        let mut qps = Vec::with_capacity(n);
        for _ in 0..n {
            let mut qp = pd
                .create_qp(&cq, &cq, &QpInitAttr::new(QpType::Rc, caps))
                .map_err(verbs("creating a QP"))?;
            qp.to_init(&InitParams {
                port_num: 1,
                access: AccessFlags::REMOTE_WRITE
                    | AccessFlags::REMOTE_READ
                    | AccessFlags::REMOTE_ATOMIC,
                ..InitParams::default()
            })
            .map_err(verbs("moving a QP to INIT"))?;
            qps.push(qp);
        }
        if p.events {
            cq.req_notify(false)
                .map_err(verbs("arming the completion channel"))?;
        }
        Ok(Bench {
            dev,
            ctx,
            _pd: pd,
            mem,
            mr,
            cq,
            qps,
            slot,
            events: p.events,
            recvs: vec![0; n],
            sends: vec![0; n],
            wcs: vec![WorkCompletion::default(); 64],
        })
    }

    fn dests(&self, gid_index: u8, out_reads: u16) -> Result<Vec<Dest>, CtlError> {
        let gids = self
            .ctx
            .query_gid_table(1)
            .map_err(verbs("reading the GID table"))?;
        let gid = gids
            .iter()
            .find(|g| g.index == u32::from(gid_index))
            .map(|g| g.gid)
            .ok_or_else(|| {
                CtlError::Usage(format!(
                    "GID index {gid_index} does not exist ({} entries; `rnicctl info <spec>` lists them)",
                    gids.len()
                ))
            })?;
        let n = self.qps.len() as u64;
        Ok(self
            .qps
            .iter()
            .enumerate()
            .map(|(i, qp)| Dest {
                lid: 0,
                out_reads,
                qpn: qp.qpn().get(),
                psn: rand_psn(i as u32),
                rkey: self.mr.rkey().get(),
                vaddr: self.mr.addr() + (n + i as u64) * self.slot as u64,
                gid: Some(gid),
                srqn: 0,
            })
            .collect())
    }

    fn connect(&mut self, my: &[Dest], rem: &[Dest], mtu: Mtu, p: &Params) -> Result<(), CtlError> {
        let rd = 16u8;
        for ((qp, m), r) in self.qps.iter_mut().zip(my).zip(rem) {
            let gid = r
                .gid
                .ok_or_else(|| CtlError::Usage("the peer sent no GID".into()))?;
            let rtr = RtrParams {
                path_mtu: mtu,
                max_dest_rd_atomic: rd,
                sgid_index: p.gid_index,
                hop_limit: 1,
                ..RtrParams::default()
            };
            qp.to_rtr(
                rnic::core::Qpn::from_wire(r.qpn),
                Psn::from_wire(r.psn),
                gid,
                &rtr,
            )
            .map_err(verbs("moving a QP to RTR"))?;
            qp.to_rts(
                Psn::from_wire(m.psn),
                &RtsParams {
                    max_rd_atomic: (r.out_reads.min(16) as u8).max(1),
                    ..RtsParams::default()
                },
            )
            .map_err(verbs("moving a QP to RTS"))?;
        }
        Ok(())
    }

    /// Poll once; drive the backend when nothing completed (busy poll) or
    /// sleep on the channel (events). Returns the number of completions in
    /// `self.wcs`.
    fn poll(&mut self, wait: bool) -> Result<usize, CtlError> {
        if self.events && !wait {
            let n = self
                .cq
                .poll(&mut self.wcs)
                .map_err(verbs("polling the CQ"))?;
            if n == 0 {
                std::thread::yield_now();
            }
            return Ok(n);
        }
        if self.events {
            let n = self
                .cq
                .poll(&mut self.wcs)
                .map_err(verbs("polling the CQ"))?;
            if n > 0 {
                return Ok(n);
            }
            self.cq
                .wait(Some(Duration::from_millis(50)))
                .map_err(verbs("waiting for a CQ event"))?;
            self.cq
                .req_notify(false)
                .map_err(verbs("arming the completion channel"))?;
            return self.cq.poll(&mut self.wcs).map_err(verbs("polling the CQ"));
        }
        // Busy poll: the backend runs in caller-driven mode, so polling an
        // empty CQ is itself one round of progress (one recvmmsg).
        self.cq.poll(&mut self.wcs).map_err(verbs("polling the CQ"))
    }

    fn qp_index(&self, wc: &WorkCompletion) -> usize {
        self.qps
            .iter()
            .position(|q| q.qpn() == wc.qp_num)
            .unwrap_or(0)
    }

    /// Top the receive queues up; each receive takes a whole slot, so
    /// receives left from a smaller size (`-a`) still fit larger messages.
    fn post_recvs(&mut self, size: usize) -> Result<(), CtlError> {
        let n = self.qps.len();
        let len = self.slot.max(size) as u32;
        for q in 0..n {
            let want = self.qps[q].caps().max_recv_wr;
            while self.recvs[q] < want {
                let sge = [self
                    .mr
                    .sge((n + q) * self.slot, len)
                    .map_err(|e| CtlError::Verbs {
                        what: "building a receive SGE",
                        why: e.to_string(),
                    })?];
                self.qps[q]
                    .post_recv(&[RecvWr::new(q as u64, &sge)])
                    .map_err(verbs("posting a receive"))?;
                self.recvs[q] += 1;
            }
        }
        Ok(())
    }

    fn post(
        &mut self,
        q: usize,
        verb: Verb,
        size: usize,
        rem: &Dest,
        inline: bool,
    ) -> Result<(), CtlError> {
        let sge = [self
            .mr
            .sge(q * self.slot, size as u32)
            .map_err(|e| CtlError::Verbs {
                what: "building a send SGE",
                why: e.to_string(),
            })?];
        let rkey = Rkey(rem.rkey);
        let id = q as u64;
        let wr = match verb {
            Verb::Write => SendWr::rdma_write(id, &sge, rem.vaddr, rkey),
            Verb::Read => SendWr::rdma_read(id, &sge, rem.vaddr, rkey),
            Verb::Send => SendWr::send(id, &sge),
            Verb::Atomic => SendWr::atomic_fetch_add(id, &sge, rem.vaddr, rkey, 1),
        }
        .signaled();
        let wr = if inline && matches!(verb, Verb::Write | Verb::Send) {
            wr.inline()
        } else {
            wr
        };
        self.qps[q]
            .post_send(&[wr])
            .map_err(verbs("posting a work request"))?;
        self.sends[q] += 1;
        Ok(())
    }

    /// Poll once and account completions; returns (sends, receives) done
    /// per call through the callback.
    fn reap(&mut self, on: impl FnMut(usize, bool)) -> Result<usize, CtlError> {
        self.reap_with(true, on)
    }

    /// [`Bench::reap`] that never sleeps on the completion channel (for
    /// loops that watch memory rather than completions).
    fn reap_with(
        &mut self,
        wait: bool,
        mut on: impl FnMut(usize, bool),
    ) -> Result<usize, CtlError> {
        let n = self.poll(wait)?;
        for i in 0..n {
            let wc = self.wcs[i];
            if wc.status != WcStatus::Success {
                return Err(CtlError::Completion {
                    status: wc.status.as_str().to_owned(),
                    raw: wc.status.as_raw(),
                    wr_id: wc.wr_id,
                });
            }
            let q = self.qp_index(&wc);
            let is_recv = wc.opcode.is_recv();
            if is_recv {
                self.recvs[q] = self.recvs[q].saturating_sub(1);
            } else {
                self.sends[q] = self.sends[q].saturating_sub(1);
            }
            on(q, is_recv);
        }
        Ok(n)
    }

    fn drain_sends(&mut self) -> Result<(), CtlError> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.sends.iter().any(|s| *s > 0) {
            self.reap(|_, _| {})?;
            if Instant::now() > deadline {
                return Err(CtlError::Stalled("waiting for the last completions"));
            }
        }
        Ok(())
    }

    /// Keep driving the backend for `d` (busy poll mode; events mode has
    /// its progress thread).
    fn linger(&mut self, d: Duration) -> Result<(), CtlError> {
        let end = Instant::now() + d;
        while Instant::now() < end {
            self.reap(|_, _| {})?;
            if self.events {
                break;
            }
        }
        Ok(())
    }

    fn byte(&self, off: usize) -> u8 {
        let mut b = [0u8; 1];
        let _ = self.mem.read(off, &mut b);
        b[0]
    }

    fn stats(&self) -> (serde_json::Value, String) {
        let cq = self.cq.stats();
        let regions = rnic::dma::registry::snapshot();
        let mut text = String::new();
        let mut dev_json = serde_json::Value::Null;
        if let Some(d) = &self.dev {
            let s = d.stats();
            text.push_str(&s.to_string());
            dev_json = crate::stats::rxe_json(&s);
        }
        text.push_str(&format!(
            "cq: depth {} in flight {} high-water mark {} credit stalls {} reserved QPs {} windowed QPs {}\n",
            cq.depth,
            cq.in_flight,
            cq.credits.max_in_flight,
            cq.credits.stalls,
            cq.static_qps,
            cq.windowed_qps
        ));
        text.push_str(&format!(
            "dma registry: {} live regions ({} bytes; the perf buffers are heap memory)\n",
            regions.len(),
            regions.iter().map(|r| r.bytes).sum::<usize>()
        ));
        let j = json!({
            "device": dev_json,
            "cq": crate::stats::cq_json(&self.cq.counters()),
            "dma_registry": crate::stats::registry_json(&regions),
        });
        (j, text)
    }
}

/// Wait until the peer's next exchange message arrives, driving the device
/// (and `idle`) meanwhile: a passive side must keep answering the active
/// side's packets in caller-driven mode.
fn wait_peer(
    sess: &mut Session<TcpStream>,
    b: &mut Bench,
    mut idle: impl FnMut(&mut Bench) -> Result<(), CtlError>,
) -> Result<(), CtlError> {
    sess.stream
        .set_nonblocking(true)
        .map_err(|source| CtlError::Io {
            what: "socket",
            source,
        })?;
    let mut one = [0u8; 1];
    let r = loop {
        match sess.stream.peek(&mut one) {
            Ok(0) => break Err(CtlError::PeerClosed),
            Ok(_) => break Ok(()),
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                // The exchange socket is looked at again after a batch of
                // idle rounds (or 1 ms), not after every one: a peek is a
                // system call, and a busy-polling receiver would otherwise
                // spend half its rounds on a socket that is quiet for the
                // whole test.
                let since = Instant::now();
                let mut rounds = 0;
                let mut failed = None;
                while rounds < 64 && since.elapsed() < Duration::from_millis(1) {
                    if let Err(e) = idle(b) {
                        failed = Some(e);
                        break;
                    }
                    rounds += 1;
                }
                if let Some(e) = failed {
                    break Err(e);
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(source) => {
                break Err(CtlError::Io {
                    what: "socket",
                    source,
                });
            }
        }
    };
    sess.stream
        .set_nonblocking(false)
        .map_err(|source| CtlError::Io {
            what: "socket",
            source,
        })?;
    r
}

fn idle_progress(b: &mut Bench) -> Result<(), CtlError> {
    if b.events {
        std::thread::sleep(Duration::from_millis(1));
        return Ok(());
    }
    b.reap(|_, _| {}).map(|_| ())
}

/// The bandwidth loop of the active side.
fn run_bw(b: &mut Bench, p: &Params, size: usize, rem: &[Dest]) -> Result<BwRow, CtlError> {
    let verb = p.test.verb();
    let n = b.qps.len();
    let mut posted = vec![0u64; n];
    let mut done = vec![0u64; n];
    let cap = if p.duration.is_some() {
        1 << 20
    } else {
        (p.iters as usize * n).min(1 << 22)
    };
    let mut times: Vec<u64> = Vec::with_capacity(cap);
    let mut last_ns = 0u64;
    let start = Instant::now();
    let deadline = p.duration.map(|d| start + d);
    let mut bar = Bar::new(deadline.is_some() || p.iters * size as u64 > (1 << 30));
    let inline = size as u32 <= p.inline;
    loop {
        let now = Instant::now();
        let more = |q: usize, posted: &[u64]| match deadline {
            Some(d) => now < d,
            None => posted[q] < p.iters,
        };
        for q in 0..n {
            while posted[q] - done[q] < u64::from(p.tx_depth) && more(q, &posted) {
                b.post(q, verb, size, &rem[q], inline)?;
                posted[q] += 1;
            }
        }
        b.reap(|q, recv| {
            if !recv {
                done[q] += 1;
                last_ns = start.elapsed().as_nanos() as u64;
                if times.len() < times.capacity() {
                    times.push(last_ns);
                }
            }
        })?;
        let finished = (0..n).all(|q| !more(q, &posted) && done[q] == posted[q]);
        if finished {
            break;
        }
        match deadline {
            Some(d) => bar.update(
                "perf",
                start.elapsed().as_secs_f64() / (d - start).as_secs_f64(),
            ),
            None => bar.update(
                "perf",
                done.iter().sum::<u64>() as f64 / (p.iters * n as u64) as f64,
            ),
        }
    }
    bar.finish();
    let total: u64 = done.iter().sum();
    // The time of the last completion (the samples for the peak may stop
    // earlier: they are capped).
    let secs = if last_ns > 0 {
        last_ns as f64 / 1e9
    } else {
        start.elapsed().as_secs_f64()
    };
    let bytes = (total * size as u64) as f64;
    let peak = report::peak_bytes_per_sec(&times, size as u64, p.tx_depth as usize);
    let avg = report::bw_unit(bytes, secs, p.gbits);
    Ok(BwRow {
        bytes: size as u64,
        // perftest reports iterations per QP (the message rate counts all).
        iters: total / n as u64,
        bw_peak: report::bw_unit(peak, 1.0, p.gbits).max(avg),
        bw_avg: avg,
        msg_rate: if secs > 0.0 {
            total as f64 / secs / 1e6
        } else {
            0.0
        },
    })
}

/// Receives counted by [`serve_sends`].
struct RxCount {
    got: u64,
    times: Vec<u64>,
    start: Option<Instant>,
    /// When the last receive completed (ns after the first).
    last_ns: u64,
}

impl RxCount {
    fn tick(&mut self, b: &mut Bench, size: usize) -> Result<(), CtlError> {
        let (got, times, start, last) = (
            &mut self.got,
            &mut self.times,
            &mut self.start,
            &mut self.last_ns,
        );
        b.reap(|_, recv| {
            if recv {
                let t0 = *start.get_or_insert_with(Instant::now);
                *got += 1;
                *last = t0.elapsed().as_nanos() as u64;
                if times.len() < times.capacity() {
                    times.push(*last);
                }
            }
        })?;
        b.post_recvs(size)
    }
}

/// The SEND receiver (ib_send_bw's server): counts `-n` receives per QP
/// (or, with `-D`, receives until the peer's next exchange message), keeps
/// the receive queues full, and measures its own bandwidth.
fn serve_sends(
    sess: &mut Session<TcpStream>,
    b: &mut Bench,
    p: &Params,
    size: usize,
) -> Result<BwRow, CtlError> {
    let n = b.qps.len();
    let want = p.iters * n as u64;
    let mut rx = RxCount {
        got: 0,
        times: Vec::with_capacity((want as usize).min(1 << 22)),
        start: None,
        last_ns: 0,
    };
    if p.duration.is_some() {
        wait_peer(sess, b, |b| rx.tick(b, size))?;
    } else {
        let mut last = Instant::now();
        let mut seen = 0;
        while rx.got < want {
            rx.tick(b, size)?;
            if rx.got != seen {
                seen = rx.got;
                last = Instant::now();
            } else if last.elapsed() > Duration::from_secs(30) {
                return Err(CtlError::Stalled(
                    "receiving SENDs (same -n and -q on both sides?)",
                ));
            }
        }
    }
    let RxCount {
        got,
        times,
        last_ns,
        ..
    } = rx;
    let secs = last_ns as f64 / 1e9;
    let avg = report::bw_unit((got * size as u64) as f64, secs, p.gbits);
    let peak = report::peak_bytes_per_sec(&times, size as u64, p.tx_depth as usize);
    Ok(BwRow {
        bytes: size as u64,
        iters: got / n as u64,
        bw_peak: report::bw_unit(peak, 1.0, p.gbits).max(avg),
        bw_avg: avg,
        msg_rate: if secs > 0.0 {
            got as f64 / secs / 1e6
        } else {
            0.0
        },
    })
}

fn spin_until(b: &mut Bench, mut cond: impl FnMut(&Bench) -> bool) -> Result<(), CtlError> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut spins = 0u32;
    while !cond(b) {
        b.reap_with(false, |_, _| {})?;
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(1024) && Instant::now() > deadline {
            return Err(CtlError::Stalled("waiting for the peer's message"));
        }
    }
    Ok(())
}

/// Latency loops (QP 0). Returns the round trips in ns (client side).
fn run_lat(
    b: &mut Bench,
    p: &Params,
    role: Role,
    size: usize,
    rem: &Dest,
) -> Result<Vec<u64>, CtlError> {
    let verb = p.test.verb();
    let n = b.qps.len();
    let mut samples = Vec::with_capacity(p.iters as usize);
    // The answering side measures from its reply to the next request (a
    // round trip seen from its side), so it has one sample fewer.
    let mut replied: Option<Instant> = None;
    let inline = size as u32 <= p.inline;
    let poll_off = n * b.slot + size - 1;
    let mut bar = Bar::new(p.iters > 200_000);
    let depth = b.qps[0].caps().max_send_wr;
    for i in 1..=p.iters {
        let c = (i & 0xff) as u8;
        // Keep the send queue within its credits.
        while b.sends[0] >= depth {
            b.reap(|_, _| {})?;
        }
        match (verb, role) {
            // ib_write_lat: the server writes first, the client answers
            // (perftest_resources.c run_iter_lat_write: only a server skips
            // the first wait). Each side's sample: its write to the peer's
            // next write landing.
            (Verb::Write, Role::Server) => {
                let _ = b.mem.write(size - 1, &[c]);
                let t0 = Instant::now();
                b.post(0, verb, size, rem, inline)?;
                spin_until(b, |b| b.byte(poll_off) == c)?;
                samples.push(t0.elapsed().as_nanos() as u64);
            }
            (Verb::Write, Role::Client) => {
                spin_until(b, |b| b.byte(poll_off) == c)?;
                if let Some(t) = replied {
                    samples.push(t.elapsed().as_nanos() as u64);
                }
                let _ = b.mem.write(size - 1, &[c]);
                replied = Some(Instant::now());
                b.post(0, verb, size, rem, inline)?;
            }
            (Verb::Send, _) => {
                let t0 = Instant::now();
                if role == Role::Client {
                    b.post(0, verb, size, rem, inline)?;
                }
                let mut got = false;
                let deadline = Instant::now() + Duration::from_secs(30);
                while !got {
                    b.reap(|_, recv| got |= recv)?;
                    if !got && Instant::now() > deadline {
                        return Err(CtlError::Stalled("waiting for the peer's SEND"));
                    }
                }
                b.post_recvs(size)?;
                if role == Role::Server {
                    if let Some(t) = replied {
                        samples.push(t.elapsed().as_nanos() as u64);
                    }
                    replied = Some(Instant::now());
                    b.post(0, verb, size, rem, inline)?;
                } else {
                    samples.push(t0.elapsed().as_nanos() as u64);
                }
            }
            (Verb::Read | Verb::Atomic, _) => {
                let t0 = Instant::now();
                b.post(0, verb, size, rem, inline)?;
                let deadline = Instant::now() + Duration::from_secs(30);
                while b.sends[0] > 0 {
                    b.reap(|_, _| {})?;
                    if Instant::now() > deadline {
                        return Err(CtlError::Stalled("waiting for a READ/atomic response"));
                    }
                }
                samples.push(t0.elapsed().as_nanos() as u64);
            }
        }
        bar.update("perf", i as f64 / p.iters as f64);
    }
    bar.finish();
    b.drain_sends()?;
    // The peer's last message is ours to acknowledge (the server's in
    // send-lat, the client's in write-lat): keep the backend running a
    // moment so the ACK leaves before we stop polling.
    let last_receiver = match verb {
        Verb::Write => Role::Server,
        _ => Role::Client,
    };
    if role == last_receiver {
        b.linger(Duration::from_millis(100))?;
    }
    Ok(samples)
}

/// Run one test over an established exchange connection.
pub fn run(args: &PerfArgs, p: &Params, mut sess: Session<TcpStream>) -> Result<Outcome, CtlError> {
    let role = sess.role;
    let mut b = Bench::new(args, p, CYCLE_BUFFER)?;
    let _live = match (&b.dev, args.stats_socket) {
        (Some(d), true) => Some(crate::stats::StatsServer::start(
            d.clone(),
            b.cq.counters(),
            format!("rnicctl perf {}", p.test.perftest_name()),
        )?),
        _ => None,
    };
    let port = b.ctx.query_port(1).map_err(verbs("querying port 1"))?;
    let want = match args.mtu {
        Some(m) => Mtu::from_bytes(m).map_err(|e| CtlError::Usage(format!("-m {m}: {e}")))?,
        None => port.active_mtu,
    };
    let neg = sess.negotiate(CYCLE_BUFFER, CACHE_LINE, want.to_enum())?;
    if neg.cycle_buffer as usize > b.slot {
        return Err(CtlError::Usage(format!(
            "the peer's cycle buffer ({}) is larger than this side's buffer slot ({}); pass a larger -s",
            neg.cycle_buffer, b.slot
        )));
    }
    let mtu = Mtu::from_enum(neg.mtu_enum).map_err(|e| CtlError::Usage(e.to_string()))?;
    let out_reads = b
        .ctx
        .query_device()
        .map(|d| d.max_qp_init_rd_atom.min(16) as u16)
        .unwrap_or(1);
    let my = b.dests(p.gid_index, out_reads)?;
    let my0 = my[0];
    let mut out = Outcome {
        mtu: mtu.bytes(),
        peer_version: neg.peer_version.clone(),
        ..Outcome::default()
    };
    let lat_div = match p.test.verb() {
        Verb::Read | Verb::Atomic => 1.0,
        _ => 2.0,
    };
    if p.test.verb() == Verb::Send {
        b.post_recvs(p.sizes[0] as usize)?;
    }
    match p.test {
        Test::WriteBw | Test::ReadBw | Test::AtomicBw => {
            let rem = sess.hand_shake_all(&my)?;
            b.connect(&my, &rem, mtu, p)?;
            sess.hand_shake_all(&my)?;
            sess.hand_shake(&my0)?;
            if role == Role::Client {
                for s in &p.sizes {
                    out.bw.push(run_bw(&mut b, p, *s as usize, &rem)?);
                }
                sess.hand_shake(&my0)?;
                let last = out.bw.last().copied();
                let rep = last.map_or(BwReport::default(), |r| BwReport {
                    size: r.bytes,
                    iters: r.iters,
                    bw_peak: r.bw_peak,
                    bw_avg: r.bw_avg,
                    msg_rate: r.msg_rate,
                });
                sess.bw_reports(&rep)?;
            } else {
                wait_peer(&mut sess, &mut b, idle_progress)?;
                sess.hand_shake(&my0)?;
                let r = sess.bw_reports(&BwReport::default())?;
                out.bw.push(BwRow {
                    bytes: r.size,
                    iters: r.iters,
                    bw_peak: r.bw_peak,
                    bw_avg: r.bw_avg,
                    msg_rate: r.msg_rate,
                });
            }
            sess.close(&my0)?;
        }
        Test::SendBw => {
            // ib_send_bw: both sides measure; no reports are exchanged.
            // A sync before each size (after the server posted its
            // receives) and, with -a, one after it.
            let rem = sess.hand_shake_all(&my)?;
            b.connect(&my, &rem, mtu, p)?;
            sess.hand_shake(&my0)?;
            sess.hand_shake_all(&my)?;
            let all = p.sizes.len() > 1;
            for s in &p.sizes {
                let s = *s as usize;
                if role == Role::Server {
                    b.post_recvs(s)?;
                }
                sess.hand_shake(&my0)?;
                if role == Role::Client {
                    out.bw.push(run_bw(&mut b, p, s, &rem)?);
                } else {
                    out.bw.push(serve_sends(&mut sess, &mut b, p, s)?);
                }
                if all {
                    if role == Role::Server {
                        // The client waits for our ACKs before it syncs.
                        wait_peer(&mut sess, &mut b, idle_progress)?;
                    }
                    sess.hand_shake(&my0)?;
                }
            }
            if role == Role::Server {
                // The client's last SENDs are acknowledged once it stops
                // waiting; keep answering until its closing line arrives.
                wait_peer(&mut sess, &mut b, idle_progress)?;
            }
            sess.close(&my0)?;
        }
        Test::WriteLat => {
            sess.hand_shake(&my0)?;
            let rem = sess.hand_shake_all(&my)?;
            b.connect(&my, &rem, mtu, p)?;
            sess.hand_shake_all(&my)?;
            sess.hand_shake(&my0)?;
            for s in &p.sizes {
                let mut t = run_lat(&mut b, p, role, *s as usize, &rem[0])?;
                out.lat.push(lat_row(*s, &mut t, lat_div, p.iters));
            }
            // ib_write_lat closes without a final exchange.
        }
        Test::SendLat => {
            let rem = sess.hand_shake_all(&my)?;
            b.connect(&my, &rem, mtu, p)?;
            sess.hand_shake(&my0)?;
            sess.hand_shake_all(&my)?;
            for s in &p.sizes {
                b.post_recvs(*s as usize)?;
                sess.hand_shake(&my0)?;
                let mut t = run_lat(&mut b, p, role, *s as usize, &rem[0])?;
                out.lat.push(lat_row(*s, &mut t, lat_div, p.iters));
            }
            sess.close(&my0)?;
        }
        Test::ReadLat | Test::AtomicLat => {
            sess.hand_shake(&my0)?;
            let rem = sess.hand_shake_all(&my)?;
            b.connect(&my, &rem, mtu, p)?;
            sess.hand_shake_all(&my)?;
            sess.hand_shake(&my0)?;
            if role == Role::Server {
                wait_peer(&mut sess, &mut b, idle_progress)?;
            } else {
                for s in &p.sizes {
                    let mut t = run_lat(&mut b, p, role, *s as usize, &rem[0])?;
                    out.lat.push(LatRow::from_samples(*s, &mut t, lat_div));
                }
            }
            sess.close(&my0)?;
        }
    }
    // Let the last ACKs leave before the QPs go away.
    b.drain_sends()?;
    out.data_path = b.dev.as_ref().map(data_path);
    if args.stats {
        let (j, t) = b.stats();
        out.stats = Some(j);
        out.stats_text = Some(t);
    }
    drain_socket(&mut sess.stream);
    Ok(out)
}

/// How `dev` received and sent: packet ring or UDP socket, and how many
/// datagrams left as frames (`rnicctl doctor` says why a path is not used).
fn data_path(dev: &RxeDevice) -> String {
    let (rings, ports) = dev.rx_rings();
    let rx = if rings == 0 {
        "rx UDP socket".to_owned()
    } else {
        format!("rx packet ring ({rings} of {ports} addresses)")
    };
    let d = dev.stats().device;
    let tx = match (dev.tx_frames(), d.tx_frames) {
        (false, _) => "tx UDP socket".to_owned(),
        (true, 0) => "tx UDP socket (no peer's next hop allowed a frame: `rnicctl doctor`, \
                      rxe-tx-frames, says why)"
            .to_owned(),
        (true, f) if f == d.tx_datagrams => format!("tx frames (all {f} datagrams)"),
        (true, f) => format!(
            "tx {f} of {} datagrams as frames, the rest through the UDP socket",
            d.tx_datagrams
        ),
    };
    format!("{rx}; {tx}")
}

/// A latency row reporting the iterations run (the server's samples are one fewer).
fn lat_row(size: u64, samples: &mut [u64], div: f64, iters: u64) -> LatRow {
    LatRow {
        iters,
        ..LatRow::from_samples(size, samples, div)
    }
}

/// Read what the peer still sends ("done") so closing does not reset the
/// connection under it.
fn drain_socket(s: &mut TcpStream) {
    let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
    let mut buf = [0u8; 64];
    let _ = s.read(&mut buf);
    let _ = s.flush();
}

/// `lrand48() & 0xffffff` stand-in.
fn rand_psn(i: u32) -> u32 {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| {
            d.subsec_nanos() ^ (d.as_secs() as u32).rotate_left(13)
        });
    (n ^ std::process::id().rotate_left(7) ^ i.wrapping_mul(0x9e37_79b9)) & 0xFF_FFFF
}
