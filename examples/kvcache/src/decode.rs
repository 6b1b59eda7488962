//! The decode node: accept a prefill node, check its model and layout,
//! register a KV region sized for the prompt plus the tokens to generate,
//! keep `window + 1` receives posted for the WRITE WITH IMMEDIATE
//! completions, map every arriving chunk by its immediate, and once the
//! sentinel arrives generate tokens greedily — reading the cache in place.
//!
//! Every wait has a deadline: no prefill node (accept), no progress on the
//! stream (`timeout` without a chunk), or the prefill node's control
//! connection closing before the sentinel all end in a [`KvError`].

use std::io::{BufReader, ErrorKind, Read};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rnic::core::{
    AccessFlags, Memory, MemoryRegion, ProtectionDomain, RecvWr, WcOpcode, WcStatus, WorkCompletion,
};
use rnic::rxe::FaultConfig;

use crate::KvError;
use crate::layout::{ChunkPlan, KvGeometry, Msg, SENTINEL, VERSION, check_model, model_fields};
use crate::model::{Model, ModelConfig};
use crate::net::{Device, Placement, Rc, accept_within, alloc_kv_region};
use crate::prefill::Transport;
use crate::reference::greedy;
use crate::view::KvRegion;

/// What the decode node does.
#[derive(Clone, Debug)]
pub struct DecodeOptions {
    /// Device spec (`rxe`, `rxe:<ip>`, `mlx5:<bdf>`).
    pub device: String,
    /// The model (must match the prefill node's).
    pub model: ModelConfig,
    /// How long to wait for a prefill node to connect.
    pub accept_timeout: Duration,
    /// Deadline of every other wait: a control message, or the next chunk.
    pub timeout: Duration,
    /// Receive-path faults of the rxe device.
    pub faults: FaultConfig,
    /// NUMA node for the KV region (`None`: where this thread runs; for
    /// VRAM, the node of its staging ring, by default the GPU's).
    pub numa_node: Option<u32>,
    /// Where the KV region lives: host memory, a GPU's VRAM (`gpu:0`), or
    /// host memory behind the VRAM staging path (`gpu-emulated`).
    pub kv_memory: rnic::gpu::MemorySpec,
    /// Hash the received cache for the report (reads it once more).
    pub digest: bool,
    /// Progress lines on stderr.
    pub verbose: bool,
    /// Positions to allocate and register a KV region for before any
    /// prefill node connects (0: allocate per request, sized to it). A
    /// request that fits uses the prepared region, so its handshake skips
    /// allocation, pinning and registration.
    pub prealloc_positions: u32,
    /// Test hook: vanish right after accepting (the prefill's writes then
    /// go unanswered).
    pub die_after_accept: bool,
}

impl DecodeOptions {
    /// Defaults for `model`.
    pub fn new(model: ModelConfig) -> DecodeOptions {
        DecodeOptions {
            device: "rxe".into(),
            model,
            accept_timeout: Duration::from_secs(60),
            timeout: Duration::from_secs(30),
            faults: FaultConfig::default(),
            numa_node: None,
            kv_memory: rnic::gpu::MemorySpec::Host,
            digest: true,
            verbose: false,
            prealloc_positions: 0,
            die_after_accept: false,
        }
    }
}

/// What the decode node measured.
#[derive(Clone, Debug, Default)]
pub struct DecodeReport {
    /// `rdma` or `tcp`.
    pub transport: &'static str,
    /// Prompt tokens (cached positions + the last prompt token).
    pub prompt_tokens: u32,
    /// Positions received.
    pub kv_positions: u32,
    /// KV bytes received.
    pub kv_bytes: u64,
    /// Chunks received.
    pub chunks: u32,
    /// The generated tokens.
    pub tokens: Vec<u32>,
    /// Time to first token: hello → first generated token.
    pub ttft: Duration,
    /// Hello → prefill compute start: region allocation, registration, QP
    /// bring-up on both nodes (the prefill node's share from its KVSTATS).
    pub handshake: Duration,
    /// The prefill node's compute time (from its KVSTATS).
    pub prefill_compute: Duration,
    /// Stream end minus handshake minus compute: what the transfer added.
    pub transfer_tail: Duration,
    /// Sentinel → tensor views ready.
    pub reconstruct: Duration,
    /// The first decode step.
    pub first_step: Duration,
    /// Accept sent → sentinel.
    pub stream: Duration,
    /// All decode steps.
    pub decode: Duration,
    /// Credit stalls the prefill node reported.
    pub prefill_stalls: u64,
    /// Injected faults on this node's receive path: (dropped, reordered).
    pub faults: (u64, u64),
    /// Retransmissions by this node's QP (rxe: ACKs, none expected).
    pub retransmits: u64,
    /// FNV-1a of the received cache (0 when not computed).
    pub digest: u64,
    /// The KV region's placement.
    pub placement: Option<Placement>,
    /// Where the KV region lives (`host`, `gpu:0`, `gpu-emulated`).
    pub kv_memory: String,
}

/// Serve one prefill node on `listener`.
pub fn serve(listener: &TcpListener, o: &DecodeOptions) -> Result<DecodeReport, KvError> {
    let cfg = o.model;
    let model = Model::new(cfg)?;
    // A GPU is opened (and its context held) before anything else: without
    // one, the run fails here with the driver's fix, not at the first request.
    let _gpu = match o.kv_memory {
        rnic::gpu::MemorySpec::Gpu(n) => Some(rnic::gpu::Gpu::open(n)?),
        _ => None,
    };
    let prepared = match o.prealloc_positions {
        0 => None,
        cap => Some(Prepared::new(o, cap)?),
    };
    let ctl = accept_within(listener, o.accept_timeout)?;
    let t0 = Instant::now();
    ctl.set_read_timeout(Some(o.timeout))
        .and_then(|()| ctl.set_write_timeout(Some(o.timeout)))
        .map_err(KvError::io("setting socket timeouts"))?;
    let mut reader = BufReader::new(ctl.try_clone().map_err(KvError::io("cloning the socket"))?);
    let mut ctl_w = ctl.try_clone().map_err(KvError::io("cloning the socket"))?;
    let hello = Msg::recv(&mut reader, "KVHELLO")?;
    if hello.kind != "KVHELLO" {
        return Err(KvError::Protocol {
            reason: format!("expected KVHELLO, got {}", hello.kind),
        });
    }
    if let Err(e) = check_model(&hello, &cfg) {
        let _ = Msg::new("KVREFUSE")
            .with("reason", e.to_string())
            .send(&mut ctl_w);
        return Err(e);
    }
    let tokens = hello.u32("tokens")?;
    let generate = hello.u32("generate")?;
    let window = hello.u32("window")?.clamp(1, 4096);
    let chunk = hello.u32("chunk")?;
    let last_token = hello.u32("last_token")?;
    let transport =
        Transport::from_name(hello.str("transport")?).ok_or_else(|| KvError::Protocol {
            reason: "unknown transport in KVHELLO".into(),
        })?;
    if tokens == 0 || last_token >= cfg.vocab {
        return Err(KvError::Protocol {
            reason: "KVHELLO names no cached positions or a token outside the vocabulary".into(),
        });
    }
    let need = tokens.saturating_add(generate);
    let (g, mem, placement, pre_rdma) = match prepared.filter(|p| p.cap >= need) {
        Some(p) => (
            KvGeometry::new(&cfg, tokens, p.cap),
            p.mem,
            p.placement,
            p.rdma,
        ),
        None if transport == Transport::Rdma => {
            // The device first: an mlx5 function registers only its own memory.
            let g = KvGeometry::new(&cfg, tokens, need);
            let dev = Device::open(&o.device, o.faults)?;
            let (mem, placement) = alloc_kv_region(
                o.kv_memory,
                Some(&dev),
                g.region_len() as usize,
                o.numa_node,
            )?;
            let r = register_on(dev, &mem)?;
            (g, mem, placement, Some(r))
        }
        None => {
            let g = KvGeometry::new(&cfg, tokens, need);
            let (mem, placement) =
                alloc_kv_region(o.kv_memory, None, g.region_len() as usize, o.numa_node)?;
            (g, mem, placement, None)
        }
    };
    let plan = ChunkPlan::new(g, chunk)?;

    let mut accept = model_fields(Msg::new("KVACCEPT").with("v", VERSION), &cfg)
        .with("tokens", g.tokens)
        .with("capacity", g.capacity)
        .with("token_stride", g.token_stride)
        .with("v_offset", g.v_offset)
        .with("layer_stride", g.layer_stride)
        .with("len", mem.len());
    let mut rdma = None;
    let dev = if transport == Transport::Rdma {
        let (dev, pd, mr) = match pre_rdma {
            Some(r) => r,
            None => register(o, &mem)?,
        };
        let mut rc = Rc::new(&dev, &pd, 1, window + 1, AccessFlags::REMOTE_WRITE)?;
        rc.peer_regions.push(mr.clone());
        for i in 0..=window {
            rc.qp
                .post_recv(&[RecvWr::new(u64::from(i), &[])])
                .map_err(KvError::verbs("post_recv"))?;
        }
        rc.connect_to(&hello)?;
        accept = rc
            .endpoint_fields(accept)
            .with("va", format!("{:x}", mr.addr()))
            .with("rkey", format!("{:x}", mr.rkey().0));
        rdma = Some(rc);
        Some(dev)
    } else {
        None
    };
    accept.send(&mut ctl_w)?;
    let handshake = t0.elapsed();
    if o.die_after_accept {
        return Err(KvError::Protocol {
            reason: "decode node stopped on purpose after accepting (test hook)".into(),
        });
    }

    let t_stream = Instant::now();
    let mut got = Got::new(plan.total());
    match rdma.as_mut() {
        Some(rc) => receive_rdma(rc, &plan, &ctl, o, &mut got)?,
        None => receive_tcp(&mut reader, &plan, &*mem, o, &mut got)?,
    }
    let sentinel_at = t0.elapsed();
    let stream = t_stream.elapsed();

    // Reconstruct: tensor views over the region, no copy.
    let t_rec = Instant::now();
    let region = KvRegion::new(Arc::clone(&mem), g, cfg.d_model())?;
    let reconstruct = t_rec.elapsed();

    let t_dec = Instant::now();
    let mut first_step = Duration::ZERO;
    let mut ttft = Duration::ZERO;
    let out = greedy(
        &model,
        &region,
        last_token,
        tokens as usize,
        generate,
        |i, tok| {
            if i == 0 {
                first_step = t_dec.elapsed();
                ttft = t0.elapsed();
            }
            if o.verbose && (i + 1) % 16 == 0 {
                eprintln!("decode: {} tokens (last {tok})", i + 1);
            }
        },
    )?;
    let decode = t_dec.elapsed();

    let stats = Msg::recv(&mut reader, "KVSTATS")?;
    let prefill_compute = Duration::from_nanos(stats.u64("compute_ns")?);
    // The prefill node's time from our accept to its first layer (parsing,
    // QP connect) belongs to the handshake.
    let handshake = handshake + Duration::from_nanos(stats.u64("start_ns").unwrap_or(0));
    let prefill_stalls = stats.u64("stalls").unwrap_or(0);
    let list = out.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    Msg::new("KVDONE").with("tokens", list).send(&mut ctl_w)?;
    let digest = if o.digest { region.digest()? } else { 0 };
    let (retransmits, faults) = dev
        .as_ref()
        .map_or((0, (0, 0)), |d| (d.retransmits(), d.fault_counts()));
    Ok(DecodeReport {
        transport: transport.name(),
        prompt_tokens: tokens + 1,
        kv_positions: tokens,
        kv_bytes: g.shipped_bytes(),
        chunks: got.count,
        tokens: out,
        ttft,
        handshake,
        prefill_compute,
        transfer_tail: sentinel_at.saturating_sub(handshake + prefill_compute),
        reconstruct,
        first_step,
        stream,
        decode,
        prefill_stalls,
        faults,
        retransmits,
        digest,
        placement: Some(placement),
        kv_memory: o.kv_memory.to_string(),
    })
}

/// Open the device and register `mem` for the prefill node's writes.
fn register(
    o: &DecodeOptions,
    mem: &Arc<dyn Memory>,
) -> Result<(Device, ProtectionDomain, MemoryRegion), KvError> {
    let dev = Device::open(&o.device, o.faults)?;
    register_on(dev, mem)
}

/// Register `mem` on the open `dev` for the prefill node's writes.
fn register_on(
    dev: Device,
    mem: &Arc<dyn Memory>,
) -> Result<(Device, ProtectionDomain, MemoryRegion), KvError> {
    let pd = dev.ctx.alloc_pd().map_err(KvError::verbs("alloc_pd"))?;
    let mr = pd
        .reg_mr(
            Arc::clone(mem),
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )
        .map_err(KvError::verbs("reg_mr (KV region)"))?;
    Ok((dev, pd, mr))
}

/// A KV region allocated and registered ahead of the request.
struct Prepared {
    cap: u32,
    mem: Arc<dyn Memory>,
    placement: Placement,
    rdma: Option<(Device, ProtectionDomain, MemoryRegion)>,
}

impl Prepared {
    fn new(o: &DecodeOptions, cap: u32) -> Result<Prepared, KvError> {
        let g = KvGeometry::new(&o.model, 0, cap);
        // The device first: an mlx5 function registers only its own memory.
        let dev = Device::open(&o.device, o.faults)?;
        let (mem, placement) = alloc_kv_region(
            o.kv_memory,
            Some(&dev),
            g.region_len() as usize,
            o.numa_node,
        )?;
        let rdma = Some(register_on(dev, &mem)?);
        Ok(Prepared {
            cap,
            mem,
            placement,
            rdma,
        })
    }
}

/// Which chunks have landed.
struct Got {
    seen: Vec<bool>,
    count: u32,
}

impl Got {
    fn new(total: u32) -> Got {
        Got {
            seen: vec![false; total as usize],
            count: 0,
        }
    }

    /// Record chunk `imm` of `len` bytes; errors for unknown, mis-sized or
    /// duplicate chunks.
    fn land(&mut self, plan: &ChunkPlan, imm: u32, len: u32) -> Result<u64, KvError> {
        let c = plan.lookup(imm).ok_or_else(|| KvError::Protocol {
            reason: format!("immediate {imm:#x} names no chunk of the layout"),
        })?;
        if c.len != len {
            return Err(KvError::Protocol {
                reason: format!(
                    "chunk {}/{} carried {len} bytes, the layout says {}",
                    c.layer, c.index, c.len
                ),
            });
        }
        let i = (c.layer * plan.per_layer() + c.index) as usize;
        if std::mem::replace(&mut self.seen[i], true) {
            return Err(KvError::Protocol {
                reason: format!("chunk {}/{} arrived twice", c.layer, c.index),
            });
        }
        self.count += 1;
        Ok(c.offset)
    }

    /// The sentinel arrived: every chunk must be in.
    fn finish(&self) -> Result<(), KvError> {
        if self.count as usize != self.seen.len() {
            return Err(KvError::Truncated {
                received: self.count,
                expected: self.seen.len() as u32,
                reason: "the sentinel arrived before every chunk".into(),
            });
        }
        Ok(())
    }

    fn truncated(&self, reason: String) -> KvError {
        KvError::Truncated {
            received: self.count,
            expected: self.seen.len() as u32,
            reason,
        }
    }
}

/// Whether the peer closed `sock` (EOF or reset) — without consuming data.
fn peer_closed(sock: &TcpStream) -> bool {
    if sock.set_nonblocking(true).is_err() {
        return true;
    }
    let mut b = [0u8; 1];
    let closed = match sock.peek(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != ErrorKind::WouldBlock,
    };
    let _ = sock.set_nonblocking(false);
    closed
}

fn receive_rdma(
    rc: &mut Rc,
    plan: &ChunkPlan,
    ctl: &TcpStream,
    o: &DecodeOptions,
    got: &mut Got,
) -> Result<(), KvError> {
    let mut wcs = [WorkCompletion::default(); 16];
    let mut last_progress = Instant::now();
    let mut last_peek = Instant::now();
    let mut armed = false;
    let mut closed = false;
    loop {
        let n = rc.cq.poll(&mut wcs).map_err(KvError::verbs("poll_cq"))?;
        for wc in &wcs[..n] {
            if wc.status != WcStatus::Success {
                return Err(KvError::Completion {
                    what: "a KV chunk receive",
                    wr_id: wc.wr_id,
                    status: wc.status,
                });
            }
            if wc.opcode != WcOpcode::RecvRdmaWithImm {
                return Err(KvError::Protocol {
                    reason: format!("unexpected completion {:?}", wc.opcode),
                });
            }
            let imm = wc.imm_data.ok_or_else(|| KvError::Protocol {
                reason: "a receive completed without immediate data".into(),
            })?;
            if imm == SENTINEL {
                return got.finish();
            }
            got.land(plan, imm, wc.byte_len)?;
            rc.qp
                .post_recv(&[RecvWr::new(wc.wr_id, &[])])
                .map_err(KvError::verbs("post_recv"))?;
            last_progress = Instant::now();
            if o.verbose && got.count.is_multiple_of(plan.per_layer()) {
                eprintln!(
                    "decode: layer {}/{} landed",
                    got.count / plan.per_layer(),
                    plan.total() / plan.per_layer()
                );
            }
        }
        if n > 0 {
            armed = false;
            continue;
        }
        if closed {
            return Err(got.truncated("the prefill node closed its connection mid-stream".into()));
        }
        if last_progress.elapsed() >= o.timeout {
            return Err(got.truncated(format!("no chunk for {:?}", o.timeout)));
        }
        if last_peek.elapsed() >= Duration::from_millis(20) {
            last_peek = Instant::now();
            if peer_closed(ctl) {
                // Chunks the prefill sent before it closed may have completed
                // since the empty poll above: poll once more before judging.
                closed = true;
                continue;
            }
        }
        if !armed {
            rc.cq
                .req_notify(false)
                .map_err(KvError::verbs("req_notify_cq"))?;
            armed = true;
            continue;
        }
        rc.cq
            .wait(Some(Duration::from_millis(20)))
            .map_err(KvError::verbs("wait_cq"))?;
        armed = false;
    }
}

fn receive_tcp(
    r: &mut BufReader<TcpStream>,
    plan: &ChunkPlan,
    mem: &dyn Memory,
    o: &DecodeOptions,
    got: &mut Got,
) -> Result<(), KvError> {
    let mut body = Vec::new();
    loop {
        let mut head = [0u8; 16];
        read_exact_or(r, &mut head, got, o)?;
        let imm = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
        let mut off = [0u8; 8];
        off.copy_from_slice(&head[4..12]);
        let offset = u64::from_le_bytes(off);
        let len = u32::from_le_bytes([head[12], head[13], head[14], head[15]]);
        if imm == SENTINEL {
            return got.finish();
        }
        let want = got.land(plan, imm, len)?;
        if want != offset {
            return Err(KvError::Protocol {
                reason: format!("frame for {imm:#x} at offset {offset}, the layout says {want}"),
            });
        }
        body.resize(len as usize, 0);
        read_exact_or(r, &mut body, got, o)?;
        mem.write(offset as usize, &body)
            .map_err(KvError::mem("storing a TCP frame"))?;
    }
}

fn read_exact_or(
    r: &mut BufReader<TcpStream>,
    buf: &mut [u8],
    got: &Got,
    o: &DecodeOptions,
) -> Result<(), KvError> {
    r.read_exact(buf).map_err(|e| match e.kind() {
        ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset => {
            got.truncated("the prefill node closed its connection mid-stream".into())
        }
        ErrorKind::WouldBlock | ErrorKind::TimedOut => {
            got.truncated(format!("no data for {:?}", o.timeout))
        }
        _ => KvError::Io {
            step: "reading a KV frame",
            source: e,
        },
    })
}
