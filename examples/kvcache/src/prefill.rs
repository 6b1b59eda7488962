//! The prefill node: connect to a decode node, agree on the layout, compute
//! the prompt's KV cache layer by layer and stream each layer's chunks into
//! the decode node's region while the next layer computes.
//!
//! Over RDMA every chunk is one signaled WRITE WITH IMMEDIATE from a
//! registered staging buffer; at most `window` of them are unacknowledged at
//! any time (a [`CreditWindow`]); a chunk that finds the window full waits
//! for a completion and counts one stall. The stream ends with a zero-length
//! WRITE WITH IMMEDIATE carrying the sentinel. Over TCP (the baseline) the
//! same chunks go as frames on the control socket.

use std::io::{BufReader, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Mutex, PoisonError};

use rnic::core::{
    AccessFlags, CompletionQueue, CreditWindow, Memory, MemoryRegion, QueuePair, Rkey, SendWr,
    WcStatus, WorkCompletion,
};
use rnic::rxe::FaultConfig;

use crate::KvError;
use crate::layout::{
    Chunk, ChunkPlan, KvGeometry, Msg, SENTINEL, VERSION, check_model, imm, model_fields, split_imm,
};
use crate::model::{Model, ModelConfig, prompt};
use crate::net::{Device, Placement, Rc, alloc_buffer, connect_within};
use crate::view::append_f32;

/// How the KV bytes travel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Transport {
    /// RDMA WRITE WITH IMMEDIATE into the decode node's registered region.
    #[default]
    Rdma,
    /// Frames on the TCP control socket (the baseline).
    Tcp,
}

impl Transport {
    /// The name on the wire and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Transport::Rdma => "rdma",
            Transport::Tcp => "tcp",
        }
    }

    /// Parse a name.
    pub fn from_name(s: &str) -> Option<Transport> {
        match s {
            "rdma" => Some(Transport::Rdma),
            "tcp" => Some(Transport::Tcp),
            _ => None,
        }
    }
}

/// Ways to break the stream on purpose (tests of the decode node's error
/// handling).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StreamFault {
    /// Stop once this many chunks have been delivered and drop everything —
    /// QP and connection, no sentinel — as a crash would.
    AbortAfter(u32),
    /// Send every chunk but never the sentinel.
    NoSentinel,
}

/// What the prefill node does.
#[derive(Clone, Debug)]
pub struct PrefillOptions {
    /// Device spec (`rxe`, `rxe:<ip>`, `mlx5:<bdf>`).
    pub device: String,
    /// The decode node's control address, `host:port`.
    pub connect: String,
    /// The model.
    pub model: ModelConfig,
    /// Prompt tokens (≥ 2).
    pub prompt_len: u32,
    /// Seed of the prompt's token ids.
    pub prompt_seed: u64,
    /// Tokens the decode node should generate.
    pub generate: u32,
    /// Unacknowledged chunks allowed in flight.
    pub window: u32,
    /// Largest chunk in bytes.
    pub chunk_bytes: u32,
    /// RDMA or the TCP baseline.
    pub transport: Transport,
    /// Receive-path faults of the rxe device.
    pub faults: FaultConfig,
    /// Deadline of every wait (connect, reply, completion).
    pub timeout: Duration,
    /// NUMA node for the staging buffer (`None`: where this thread runs).
    pub numa_node: Option<u32>,
    /// Per-layer progress lines on stderr.
    pub verbose: bool,
    /// Break the stream on purpose.
    pub fault: Option<StreamFault>,
}

impl PrefillOptions {
    /// Defaults for `connect` with `model`.
    pub fn new(connect: &str, model: ModelConfig) -> PrefillOptions {
        PrefillOptions {
            device: "rxe".into(),
            connect: connect.into(),
            model,
            prompt_len: 128,
            prompt_seed: 1,
            generate: 16,
            window: 16,
            chunk_bytes: 1 << 20,
            transport: Transport::Rdma,
            faults: FaultConfig::default(),
            timeout: Duration::from_secs(30),
            numa_node: None,
            verbose: false,
            fault: None,
        }
    }
}

/// What the prefill node measured.
#[derive(Clone, Debug, Default)]
pub struct PrefillReport {
    /// `rdma` or `tcp`.
    pub transport: &'static str,
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Positions whose K/V were shipped (prompt − 1: the last prompt token
    /// is the decode node's first input).
    pub kv_positions: u32,
    /// KV bytes shipped.
    pub kv_bytes: u64,
    /// Chunks shipped (sentinel excluded).
    pub chunks: u32,
    /// Connect + layout exchange + QP bring-up.
    pub handshake: Duration,
    /// Prefill compute, from the accept to the last layer's end.
    pub compute: Duration,
    /// First post to last completion (sentinel included).
    pub transfer_span: Duration,
    /// Time with at least one layer's chunks in flight (union of each
    /// layer's first-post → last-completion intervals).
    pub transfer_busy: Duration,
    /// Compute end to last completion: what the transfer adds after compute.
    pub tail: Duration,
    /// Chunks that waited for a credit.
    pub stalls: u64,
    /// The credit window.
    pub window: u32,
    /// Most chunks in flight at once.
    pub max_in_flight: u32,
    /// Retransmissions by this node's QP (rxe).
    pub retransmits: u64,
    /// Injected faults on this node's receive path: (dropped, reordered).
    pub faults: (u64, u64),
    /// The staging buffer's placement.
    pub placement: Option<Placement>,
    /// Layers whose K and V were computed into the registered staging
    /// memory in place (the rest were copied in through `Memory::write`).
    pub in_place_layers: u32,
    /// The tokens the decode node reported.
    pub decode_tokens: Vec<u32>,
}

/// Per-layer transfer timestamps.
#[derive(Debug, Default)]
struct Spans {
    first_post: Vec<Option<Instant>>,
    last_done: Vec<Option<Instant>>,
}

impl Spans {
    fn new(layers: usize) -> Spans {
        Spans {
            first_post: vec![None; layers + 1],
            last_done: vec![None; layers + 1],
        }
    }

    fn posted(&mut self, layer: usize) {
        if let Some(slot @ None) = self.first_post.get_mut(layer) {
            *slot = Some(Instant::now());
        }
    }

    fn done(&mut self, layer: usize) {
        if let Some(slot) = self.last_done.get_mut(layer) {
            *slot = Some(Instant::now());
        }
    }

    /// Union length of the per-layer intervals, and the whole span.
    fn busy_and_span(&self) -> (Duration, Duration) {
        let mut iv: Vec<(Instant, Instant)> = self
            .first_post
            .iter()
            .zip(&self.last_done)
            .filter_map(|(a, b)| Some((((*a)?), (*b)?)))
            .collect();
        iv.sort();
        let mut busy = Duration::ZERO;
        let mut cur: Option<(Instant, Instant)> = None;
        for (a, b) in iv.iter().copied() {
            cur = match cur {
                Some((ca, cb)) if a <= cb => Some((ca, cb.max(b))),
                Some((ca, cb)) => {
                    busy += cb - ca;
                    Some((a, b))
                }
                None => Some((a, b)),
            };
        }
        if let Some((ca, cb)) = cur {
            busy += cb - ca;
        }
        let span = match (iv.first(), iv.iter().map(|x| x.1).max()) {
            (Some(f), Some(last)) => last - f.0,
            _ => Duration::ZERO,
        };
        (busy, span)
    }
}

/// The completion side of the RDMA stream, run on its own thread so credits
/// come back (and completion times are seen) while the model computes.
struct Reaper<'a> {
    /// Polled by the reaping thread alone (the lock is taken once).
    cq: Mutex<&'a mut CompletionQueue>,
    credits: CreditWindow,
    completed: AtomicU32,
    /// Last completion per layer (index `layers` is the sentinel).
    last_done: Mutex<Vec<Option<Instant>>>,
    error: Mutex<Option<KvError>>,
    stop: AtomicBool,
}

impl<'a> Reaper<'a> {
    fn new(cq: &'a mut CompletionQueue, window: u32, layers: usize) -> Result<Reaper<'a>, KvError> {
        Ok(Reaper {
            cq: Mutex::new(cq),
            credits: CreditWindow::with_default_watermarks(window).map_err(|_| {
                KvError::Config {
                    reason: "bad credit window",
                }
            })?,
            completed: AtomicU32::new(0),
            last_done: Mutex::new(vec![None; layers + 1]),
            error: Mutex::new(None),
            stop: AtomicBool::new(false),
        })
    }

    fn fail(&self, e: KvError) {
        let mut slot = self.error.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.is_none() {
            *slot = Some(e);
        }
    }

    /// The first error the reaper saw, taken.
    fn take_error(&self) -> Option<KvError> {
        self.error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    /// Poll until told to stop; each completion returns its credit.
    fn run(&self) {
        let mut wcs = [WorkCompletion::default(); 16];
        let mut armed = false;
        let mut cq = self.cq.lock().unwrap_or_else(PoisonError::into_inner);
        while !self.stop.load(Ordering::Acquire) {
            let n = match cq.poll(&mut wcs) {
                Ok(n) => n,
                Err(e) => return self.fail(KvError::verbs("poll_cq")(e)),
            };
            for wc in &wcs[..n] {
                if wc.status != WcStatus::Success {
                    return self.fail(KvError::Completion {
                        what: "a KV chunk write",
                        wr_id: wc.wr_id,
                        status: wc.status,
                    });
                }
                if self.credits.release(1).is_err() {
                    return self.fail(KvError::Protocol {
                        reason: "more completions than posted writes".into(),
                    });
                }
                let (layer, _) = split_imm(wc.wr_id as u32);
                let mut last = self
                    .last_done
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                if let Some(slot) = last.get_mut(layer as usize) {
                    *slot = Some(Instant::now());
                }
                self.completed.fetch_add(1, Ordering::AcqRel);
            }
            if n > 0 {
                armed = false;
                continue;
            }
            if !armed {
                // Arm, then poll once more: a completion that landed in
                // between would not signal.
                if let Err(e) = cq.req_notify(false) {
                    return self.fail(KvError::verbs("req_notify_cq")(e));
                }
                armed = true;
                continue;
            }
            if let Err(e) = cq.wait(Some(Duration::from_millis(20))) {
                return self.fail(KvError::verbs("wait_cq")(e));
            }
            armed = false;
        }
    }
}

/// The posting side of the RDMA stream (the computing thread).
struct RdmaSender<'a> {
    qp: &'a mut QueuePair,
    mr: MemoryRegion,
    reaper: &'a Reaper<'a>,
    va: u64,
    rkey: Rkey,
    timeout: Duration,
    stalls: u64,
    posted: u32,
    first_post: Vec<Option<Instant>>,
}

impl RdmaSender<'_> {
    /// Wait until `done()` holds, the reaper fails, or the timeout passes.
    fn wait_for(&self, what: &'static str, done: impl Fn() -> bool) -> Result<(), KvError> {
        let deadline = Instant::now() + self.timeout;
        loop {
            if let Some(e) = self.reaper.take_error() {
                return Err(e);
            }
            if done() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(KvError::Timeout {
                    what,
                    after: self.timeout,
                });
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    fn post(
        &mut self,
        layer: u32,
        local: u64,
        len: u32,
        remote: u64,
        imm: u32,
    ) -> Result<(), KvError> {
        if let Some(e) = self.reaper.take_error() {
            return Err(e);
        }
        if self.reaper.credits.available() == 0 {
            self.stalls += 1;
            let credits = &self.reaper.credits;
            self.wait_for(
                "waiting for a credit (the decode node acknowledges no chunk)",
                || credits.available() > 0,
            )?;
        }
        self.reaper
            .credits
            .try_acquire(1)
            .map_err(|_| KvError::Protocol {
                reason: "credit window out of step".into(),
            })?;
        let sge = [self
            .mr
            .sge(local as usize, len)
            .map_err(KvError::mem("building an SGE"))?];
        let sg: &[_] = if len == 0 { &[] } else { &sge };
        let wr_id = u64::from(crate::layout::imm(layer, 0));
        let wr =
            SendWr::rdma_write_with_imm(wr_id, sg, self.va + remote, self.rkey, imm).signaled();
        if let Some(slot @ None) = self.first_post.get_mut(layer as usize) {
            *slot = Some(Instant::now());
        }
        if let Err(e) = self.qp.post_send(&[wr]) {
            let _ = self.reaper.credits.release(1);
            return Err(KvError::Verbs {
                op: "post_send (WRITE WITH IMMEDIATE)",
                source: e,
            });
        }
        self.posted += 1;
        Ok(())
    }

    fn drain(&self) -> Result<(), KvError> {
        let (completed, posted) = (&self.reaper.completed, self.posted);
        self.wait_for(
            "waiting for the decode node to acknowledge the stream",
            || completed.load(Ordering::Acquire) >= posted,
        )
    }

    fn spans(&self) -> Spans {
        Spans {
            first_post: self.first_post.clone(),
            last_done: self
                .reaper
                .last_done
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
        }
    }
}

/// Run the prefill node to the end of the stream and the decode node's
/// `KVDONE`.
pub fn run(o: &PrefillOptions) -> Result<PrefillReport, KvError> {
    let cfg = o.model;
    if o.prompt_len < 2 {
        return Err(KvError::Config {
            reason: "the prompt needs at least 2 tokens",
        });
    }
    if o.window == 0 {
        return Err(KvError::Config {
            reason: "the credit window must be at least 1",
        });
    }
    let model = Model::new(cfg)?;
    let toks = prompt(o.prompt_len as usize, cfg.vocab, o.prompt_seed);
    let cached = o.prompt_len - 1;
    let d = cfg.d_model();
    let part = d as u64 * 4 * u64::from(cached);
    let started = Instant::now();

    // RDMA resources first: a layer can be shipped as soon as it exists.
    let rdma = o.transport == Transport::Rdma;
    let dev = if rdma {
        Some(Device::open(&o.device, o.faults)?)
    } else {
        None
    };
    let staging_len = (2 * part * u64::from(cfg.layers)) as usize;
    let (staging, placement) = match &dev {
        Some(dev) => dev.alloc_buffer(staging_len, o.numa_node)?,
        None => alloc_buffer(staging_len, o.numa_node),
    };
    let mut res = match &dev {
        Some(dev) => {
            let pd = dev.ctx.alloc_pd().map_err(KvError::verbs("alloc_pd"))?;
            let mr = pd
                .reg_mr(Arc::clone(&staging), AccessFlags::LOCAL_WRITE)
                .map_err(KvError::verbs("reg_mr (staging)"))?;
            // The QP retains the staging region itself: every write names it.
            let rc = Rc::new(dev, &pd, o.window + 1, 1, AccessFlags::empty())?;
            Some((rc, mr))
        }
        None => None,
    };

    let mut ctl = connect_within(&o.connect, o.timeout)?;
    ctl.set_read_timeout(Some(o.timeout))
        .and_then(|()| ctl.set_write_timeout(Some(o.timeout)))
        .map_err(KvError::io("setting socket timeouts"))?;
    let mut hello = model_fields(Msg::new("KVHELLO").with("v", VERSION), &cfg)
        .with("tokens", cached)
        .with("last_token", toks.last().copied().unwrap_or(0))
        .with("generate", o.generate)
        .with("chunk", o.chunk_bytes)
        .with("window", o.window)
        .with("transport", o.transport.name());
    if let Some((rc, _)) = &res {
        hello = rc.endpoint_fields(hello);
    }
    hello.send(&mut ctl)?;
    let mut reader = BufReader::new(ctl.try_clone().map_err(KvError::io("cloning the socket"))?);
    let reply = Msg::recv(&mut reader, "KVACCEPT")?;
    let accepted = started.elapsed();
    match reply.kind.as_str() {
        "KVACCEPT" => {}
        "KVREFUSE" => {
            return Err(KvError::Refused {
                reason: reply.str("reason").unwrap_or("no reason given").to_owned(),
            });
        }
        other => {
            return Err(KvError::Protocol {
                reason: format!("expected KVACCEPT, got {other}"),
            });
        }
    }
    check_model(&reply, &cfg)?;
    let g = KvGeometry {
        layers: cfg.layers,
        token_stride: reply.u64("token_stride")?,
        v_offset: reply.u64("v_offset")?,
        layer_stride: reply.u64("layer_stride")?,
        tokens: reply.u32("tokens")?,
        capacity: reply.u32("capacity")?,
    };
    if g.tokens != cached {
        return Err(KvError::LayoutMismatch {
            field: "tokens",
            ours: cached.to_string(),
            theirs: g.tokens.to_string(),
        });
    }
    if g.token_stride != d as u64 * 4 {
        return Err(KvError::LayoutMismatch {
            field: "token_stride",
            ours: (d * 4).to_string(),
            theirs: g.token_stride.to_string(),
        });
    }
    g.check(d, reply.u64("len")?)?;
    let plan = ChunkPlan::new(g, o.chunk_bytes)?;
    let remote = match res.as_mut() {
        Some((rc, _)) => {
            rc.connect_to(&reply)?;
            Some((reply.hex("va")?, Rkey(reply.hex("rkey")? as u32)))
        }
        None => None,
    };
    let handshake = started.elapsed();
    let job = Job {
        o,
        model: &model,
        tokens: &toks[..cached as usize],
        plan: &plan,
        staging: &*staging,
        part,
    };
    let out = match (res.as_mut(), remote) {
        (Some((rc, mr)), Some((va, rkey))) => {
            let reaper = Reaper::new(&mut rc.cq, o.window, cfg.layers as usize)?;
            std::thread::scope(|scope| {
                let reaping = scope.spawn(|| reaper.run());
                let mut sender = Sender::Rdma(Box::new(RdmaSender {
                    qp: &mut rc.qp,
                    mr: mr.clone(),
                    reaper: &reaper,
                    va,
                    rkey,
                    timeout: o.timeout,
                    stalls: 0,
                    posted: 0,
                    first_post: vec![None; cfg.layers as usize + 1],
                }));
                let out = job.stream(&mut sender);
                reaper.stop.store(true, Ordering::Release);
                let _ = reaping.join();
                out
            })?
        }
        _ => {
            let mut sender = Sender::Tcp {
                sock: &mut ctl,
                spans: Spans::new(cfg.layers as usize),
            };
            job.stream(&mut sender)?
        }
    };
    let Some(Streamed {
        compute,
        shipped,
        stalls,
        max_in_flight,
        busy,
        span,
        tail,
        in_place_layers,
    }) = out
    else {
        // Aborted on purpose: drop the QP and the socket mid-stream, as a
        // crash would.
        return Err(KvError::Protocol {
            reason: "stream aborted on purpose (test fault)".into(),
        });
    };

    Msg::new("KVSTATS")
        .with("start_ns", handshake.saturating_sub(accepted).as_nanos())
        .with("compute_ns", compute.as_nanos())
        .with("chunks", shipped)
        .with("stalls", stalls)
        .send(&mut ctl)?;
    let done = Msg::recv(&mut reader, "KVDONE")?;
    if done.kind != "KVDONE" {
        return Err(KvError::Protocol {
            reason: format!("expected KVDONE, got {}", done.kind),
        });
    }
    let decode_tokens = done
        .str("tokens")?
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse().map_err(|_| KvError::Protocol {
                reason: format!("bad token {s:?} in KVDONE"),
            })
        })
        .collect::<Result<Vec<u32>, _>>()?;
    let (retransmits, faults) = dev
        .as_ref()
        .map_or((0, (0, 0)), |d| (d.retransmits(), d.fault_counts()));
    Ok(PrefillReport {
        transport: o.transport.name(),
        prompt_tokens: o.prompt_len,
        kv_positions: cached,
        kv_bytes: g.shipped_bytes(),
        chunks: shipped,
        handshake,
        compute,
        transfer_span: span,
        transfer_busy: busy,
        tail,
        stalls,
        window: o.window,
        max_in_flight,
        retransmits,
        faults,
        placement: Some(placement),
        in_place_layers,
        decode_tokens,
    })
}

/// What one stream measured.
struct Streamed {
    compute: Duration,
    shipped: u32,
    stalls: u64,
    max_in_flight: u32,
    busy: Duration,
    span: Duration,
    tail: Duration,
    in_place_layers: u32,
}

/// The compute-and-ship loop's inputs.
struct Job<'a> {
    o: &'a PrefillOptions,
    model: &'a Model,
    tokens: &'a [u32],
    plan: &'a ChunkPlan,
    staging: &'a dyn Memory,
    part: u64,
}

impl Job<'_> {
    /// Compute, shipping each layer as soon as its K and V exist; then the
    /// sentinel, then wait for every completion. `None` when aborted on
    /// purpose.
    fn stream(&self, sender: &mut Sender<'_>) -> Result<Option<Streamed>, KvError> {
        let o = self.o;
        let layers = self.model.config().layers;
        let t_compute = Instant::now();
        let mut bytes = Vec::new();
        let mut shipped = 0u32;
        let mut in_place_layers = 0u32;
        let mut aborted = false;
        let rdma = matches!(sender, Sender::Rdma(_));
        let result = self.model.prefill(self.tokens, |layer, k, v| {
            let base = 2 * self.part * layer as u64;
            // RDMA ships from the registered memory itself: the layer's K
            // and V go straight into it. TCP needs the packed bytes too.
            if rdma && fill_in_place(self.staging, base as usize, k, v)? {
                in_place_layers += 1;
            } else {
                bytes.clear();
                append_f32(k, &mut bytes);
                append_f32(v, &mut bytes);
                self.staging
                    .write(base as usize, &bytes)
                    .map_err(KvError::mem("staging a layer"))?;
            }
            for c in self.plan.layer(layer as u32) {
                if let Some(StreamFault::AbortAfter(n)) = o.fault
                    && shipped >= n
                {
                    aborted = true;
                    return Err(KvError::Protocol {
                        reason: format!("stream aborted on purpose after {n} chunks"),
                    });
                }
                sender.send(&c, base + c.local, &bytes)?;
                shipped += 1;
            }
            if o.verbose {
                eprintln!(
                    "prefill: layer {}/{layers} computed and queued ({:.1} ms)",
                    layer + 1,
                    t_compute.elapsed().as_secs_f64() * 1e3
                );
            }
            Ok(())
        });
        if aborted {
            // The chunks shipped so far land before the crash, so the decode
            // node's count is exact: `n`, not whatever was still queued.
            sender.finish()?;
            return Ok(None);
        }
        result?;
        let compute = t_compute.elapsed();
        let compute_end = Instant::now();
        if o.fault != Some(StreamFault::NoSentinel) {
            sender.sentinel(layers)?;
        }
        let (stalls, max_in_flight, spans) = sender.finish()?;
        let (busy, span) = spans.busy_and_span();
        let last = spans.last_done.iter().flatten().max().copied();
        let tail = last.map_or(Duration::ZERO, |t| t.saturating_duration_since(compute_end));
        Ok(Some(Streamed {
            compute,
            shipped,
            stalls,
            max_in_flight,
            busy,
            span,
            tail,
            in_place_layers,
        }))
    }
}

/// Write `k` then `v` as little-endian `f32` straight into `mem`'s bytes at
/// `offset` — the application filling its registered memory in place, no
/// staging copy through the API — when `mem` offers direct access and this
/// host stores `f32` little-endian (the wire layout); `Ok(false)` otherwise
/// (the caller copies through `Memory::write`).
///
/// The in-place contract (`rnic_dma::buffer`): while the slice below lives
/// nothing else reads or writes `offset..offset + n`. It holds because each
/// layer's K‖V range of the staging memory is written exactly once, here,
/// before any of its chunks is posted (chunks of earlier layers name other
/// ranges), and the staging region grants no remote access.
fn fill_in_place(mem: &dyn Memory, offset: usize, k: &[f32], v: &[f32]) -> Result<bool, KvError> {
    if cfg!(target_endian = "big") {
        return Ok(false);
    }
    let Some(span) = mem.direct() else {
        return Ok(false);
    };
    let n = (k.len() + v.len()) * 4;
    let at = span
        .range(rnic::core::MemAccess::Write, offset, n)
        .map_err(KvError::mem("staging a layer in place"))?;
    // SAFETY: `range` checked that `offset..offset + n` lies inside the
    // span, live memory while `mem` (borrowed for this call) is; nothing
    // else touches the range while the slice lives (the contract above),
    // and the slice ends with this function.
    let dst = unsafe { std::slice::from_raw_parts_mut(at, n) };
    for (d, x) in dst.chunks_exact_mut(4).zip(k.iter().chain(v)) {
        d.copy_from_slice(&x.to_le_bytes());
    }
    Ok(true)
}

/// Where chunks go.
enum Sender<'a> {
    Rdma(Box<RdmaSender<'a>>),
    Tcp {
        sock: &'a mut TcpStream,
        spans: Spans,
    },
}

impl Sender<'_> {
    /// Ship chunk `c`, whose bytes start at `local` in the staging buffer
    /// (`layer_bytes` is the layer's packed K‖V copy, for TCP).
    fn send(&mut self, c: &Chunk, local: u64, layer_bytes: &[u8]) -> Result<(), KvError> {
        match self {
            Sender::Rdma(s) => s.post(c.layer, local, c.len, c.offset, imm(c.layer, c.index)),
            Sender::Tcp { sock, spans } => {
                spans.posted(c.layer as usize);
                let start = c.local as usize;
                let body =
                    layer_bytes
                        .get(start..start + c.len as usize)
                        .ok_or(KvError::Config {
                            reason: "chunk outside the staged layer",
                        })?;
                write_frame(sock, imm(c.layer, c.index), c.offset, body)?;
                spans.done(c.layer as usize);
                Ok(())
            }
        }
    }

    fn sentinel(&mut self, layers: u32) -> Result<(), KvError> {
        match self {
            Sender::Rdma(s) => s.post(layers, 0, 0, 0, SENTINEL),
            Sender::Tcp { sock, spans } => {
                spans.posted(layers as usize);
                write_frame(sock, SENTINEL, 0, &[])?;
                spans.done(layers as usize);
                Ok(())
            }
        }
    }

    /// Wait for every write to complete; (stalls, max in flight, spans).
    fn finish(&mut self) -> Result<(u64, u32, Spans), KvError> {
        match self {
            Sender::Rdma(s) => {
                s.drain()?;
                let max = s.reaper.credits.stats().max_in_flight;
                Ok((s.stalls, max, s.spans()))
            }
            Sender::Tcp { spans, .. } => Ok((0, 0, std::mem::take(spans))),
        }
    }
}

/// One TCP frame: imm u32 LE | offset u64 LE | len u32 LE | bytes.
fn write_frame(sock: &mut TcpStream, imm: u32, offset: u64, body: &[u8]) -> Result<(), KvError> {
    let mut head = [0u8; 16];
    head[..4].copy_from_slice(&imm.to_le_bytes());
    head[4..12].copy_from_slice(&offset.to_le_bytes());
    head[12..].copy_from_slice(&(body.len() as u32).to_le_bytes());
    sock.write_all(&head)
        .and_then(|()| sock.write_all(body))
        .map_err(KvError::io("sending a KV frame"))
}
