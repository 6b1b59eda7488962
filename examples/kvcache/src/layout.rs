//! The KV cache's layout in the decode node's region, how it is cut into
//! chunks, how a chunk is named in a 32-bit immediate, and the out-of-band
//! messages that carry the layout.
//!
//! # Region layout
//!
//! ```text
//! region = layer 0 | layer 1 | … | layer L-1          (layer_stride bytes each)
//! layer  = K[capacity][heads × head_dim] f32 LE | V[capacity][heads × head_dim] f32 LE
//!          ^ +0                                   ^ +v_offset
//! row p  = all heads of position p                (token_stride bytes)
//! ```
//!
//! The prefill ships positions `0..tokens` of each layer's K and V; the
//! decode node appends its own positions `tokens..capacity` in place.
//!
//! # Chunks and immediates
//!
//! A layer's shipped K bytes, then its V bytes, are cut into pieces of at
//! most `chunk_bytes`; chunk `c` of layer `l` travels as one RDMA WRITE WITH
//! IMMEDIATE whose immediate is `l << 16 | c` ([`imm`]). The stream ends with
//! a zero-length WRITE WITH IMMEDIATE carrying [`SENTINEL`].
//!
//! # Out-of-band messages (TCP, one text line each)
//!
//! ```text
//! prefill → decode  KVHELLO v=1 fp=<16 hex> layers=… heads=… head_dim=… ffn=… vocab=… seed=…
//!                   dtype=f32le tokens=… last_token=… generate=… chunk=… window=… transport=rdma|tcp
//!                   [qpn=… psn=… gid=<32 hex>]
//! decode → prefill  KVACCEPT v=1 fp=… layers=… heads=… head_dim=… dtype=f32le tokens=… capacity=…
//!                   token_stride=… v_offset=… layer_stride=… len=… va=<hex> rkey=<hex> [qpn=… psn=… gid=…]
//!              or   KVREFUSE reason=<text to end of line>
//! (the KV stream: RDMA writes, or for --transport tcp frames on this socket:
//!  imm u32 LE | offset u64 LE | len u32 LE | bytes)
//! prefill → decode  KVSTATS compute_ns=… chunks=… stalls=…
//! decode → prefill  KVDONE tokens=<comma-separated ids>
//! ```
//!
//! Unknown keys are ignored (forward compatibility); missing keys are
//! protocol errors.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, Write};

use crate::KvError;
use crate::model::ModelConfig;

/// The immediate that ends the stream.
pub const SENTINEL: u32 = 0xFFFF_FFFF;

/// Protocol version in every message.
pub const VERSION: u32 = 1;

/// The only element type: little-endian IEEE-754 binary32.
pub const DTYPE: &str = "f32le";

/// The immediate of chunk `chunk` of layer `layer`.
pub fn imm(layer: u32, chunk: u32) -> u32 {
    (layer << 16) | (chunk & 0xFFFF)
}

/// `(layer, chunk)` of an immediate (not the sentinel).
pub fn split_imm(imm: u32) -> (u32, u32) {
    (imm >> 16, imm & 0xFFFF)
}

/// Where the cache lives in the decode node's region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvGeometry {
    /// Layers.
    pub layers: u32,
    /// Bytes of one row (one position, all heads).
    pub token_stride: u64,
    /// Offset of V from the start of a layer.
    pub v_offset: u64,
    /// Bytes per layer.
    pub layer_stride: u64,
    /// Positions the prefill ships.
    pub tokens: u32,
    /// Positions the region holds.
    pub capacity: u32,
}

impl KvGeometry {
    /// The packed layout for `model` with room for `capacity` positions.
    pub fn new(model: &ModelConfig, tokens: u32, capacity: u32) -> KvGeometry {
        let token_stride = model.d_model() as u64 * 4;
        let v_offset = token_stride * u64::from(capacity);
        KvGeometry {
            layers: model.layers,
            token_stride,
            v_offset,
            layer_stride: 2 * v_offset,
            tokens,
            capacity,
        }
    }

    /// Bytes of the whole region.
    pub fn region_len(&self) -> u64 {
        self.layer_stride * u64::from(self.layers)
    }

    /// Bytes the prefill ships (K and V of `tokens` positions, all layers).
    pub fn shipped_bytes(&self) -> u64 {
        2 * self.token_stride * u64::from(self.tokens) * u64::from(self.layers)
    }

    /// Offset of K row `pos` of `layer`.
    pub fn k_row(&self, layer: usize, pos: usize) -> u64 {
        self.layer_stride * layer as u64 + self.token_stride * pos as u64
    }

    /// Offset of V row `pos` of `layer`.
    pub fn v_row(&self, layer: usize, pos: usize) -> u64 {
        self.k_row(layer, pos) + self.v_offset
    }

    /// Check the layout is self-consistent and fits in `len` bytes.
    pub fn check(&self, d_model: usize, len: u64) -> Result<(), KvError> {
        let bad = |reason: String| Err(KvError::Protocol { reason });
        if self.token_stride < d_model as u64 * 4 {
            return bad(format!(
                "token_stride {} is smaller than a row ({} bytes)",
                self.token_stride,
                d_model * 4
            ));
        }
        if self.capacity < self.tokens
            || self.v_offset < self.token_stride * u64::from(self.capacity)
        {
            return bad("V overlaps K, or capacity < tokens".into());
        }
        if self.layer_stride < self.v_offset + self.token_stride * u64::from(self.capacity) {
            return bad("layers overlap".into());
        }
        if self.region_len() > len {
            return bad(format!(
                "the layout needs {} bytes but the region has {len}",
                self.region_len()
            ));
        }
        Ok(())
    }
}

/// One chunk of the stream: its immediate, where it lands in the decode
/// node's region, and its length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// Layer.
    pub layer: u32,
    /// Index within the layer.
    pub index: u32,
    /// Remote offset.
    pub offset: u64,
    /// Bytes.
    pub len: u32,
    /// Whether it is part of V (else K).
    pub is_v: bool,
    /// Offset within the layer's shipped bytes (K then V): where the
    /// prefill's packed staging copy of the chunk starts.
    pub local: u64,
}

/// The chunk plan both nodes derive from the same geometry.
#[derive(Clone, Debug)]
pub struct ChunkPlan {
    per_layer: Vec<Chunk>,
    geometry: KvGeometry,
}

impl ChunkPlan {
    /// Cut each layer's shipped K and V into pieces of `chunk_bytes`.
    pub fn new(g: KvGeometry, chunk_bytes: u32) -> Result<ChunkPlan, KvError> {
        if chunk_bytes == 0 {
            return Err(KvError::Config {
                reason: "chunk size must be > 0",
            });
        }
        let part = g.token_stride * u64::from(g.tokens);
        let mut per_layer = Vec::new();
        for is_v in [false, true] {
            let mut at = 0u64;
            while at < part {
                let len = (part - at).min(u64::from(chunk_bytes)) as u32;
                per_layer.push(Chunk {
                    layer: 0,
                    index: per_layer.len() as u32,
                    offset: if is_v { g.v_offset } else { 0 } + at,
                    len,
                    is_v,
                    local: if is_v { part } else { 0 } + at,
                });
                at += u64::from(len);
            }
        }
        if per_layer.len() > 0xFFFF || g.layers >= 0xFFFF {
            return Err(KvError::Config {
                reason: "too many chunks for the 16-bit immediate fields: raise --chunk",
            });
        }
        Ok(ChunkPlan {
            per_layer,
            geometry: g,
        })
    }

    /// Chunks per layer.
    pub fn per_layer(&self) -> u32 {
        self.per_layer.len() as u32
    }

    /// Chunks in all.
    pub fn total(&self) -> u32 {
        self.per_layer() * self.geometry.layers
    }

    /// The chunks of `layer`, with remote offsets.
    pub fn layer(&self, layer: u32) -> impl Iterator<Item = Chunk> + '_ {
        let base = self.geometry.layer_stride * u64::from(layer);
        self.per_layer.iter().map(move |c| Chunk {
            layer,
            offset: base + c.offset,
            ..*c
        })
    }

    /// The chunk an immediate names, if it is one of the plan's.
    pub fn lookup(&self, imm: u32) -> Option<Chunk> {
        let (layer, index) = split_imm(imm);
        if layer >= self.geometry.layers {
            return None;
        }
        let c = self.per_layer.get(index as usize)?;
        Some(Chunk {
            layer,
            offset: self.geometry.layer_stride * u64::from(layer) + c.offset,
            ..*c
        })
    }
}

/// One out-of-band message: a kind and `key=value` fields.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Msg {
    /// `KVHELLO`, `KVACCEPT`, …
    pub kind: String,
    /// The fields.
    pub fields: BTreeMap<String, String>,
}

impl Msg {
    /// An empty message of `kind`.
    pub fn new(kind: &str) -> Msg {
        Msg {
            kind: kind.to_owned(),
            fields: BTreeMap::new(),
        }
    }

    /// Add a field.
    #[must_use]
    pub fn with(mut self, key: &str, value: impl std::fmt::Display) -> Msg {
        self.fields.insert(key.to_owned(), value.to_string());
        self
    }

    /// The text line (no newline).
    pub fn to_line(&self) -> String {
        let mut s = self.kind.clone();
        // `reason` is free text and goes last.
        for (k, v) in self.fields.iter().filter(|(k, _)| *k != "reason") {
            let _ = write!(s, " {k}={v}");
        }
        if let Some(r) = self.fields.get("reason") {
            let _ = write!(s, " reason={}", r.replace('\n', " "));
        }
        s
    }

    /// Parse a line.
    pub fn parse(line: &str) -> Result<Msg, KvError> {
        let line = line.trim_end_matches(['\r', '\n']);
        let (head, reason) = match line.split_once(" reason=") {
            Some((h, r)) => (h, Some(r)),
            None => (line, None),
        };
        let mut parts = head.split(' ').filter(|p| !p.is_empty());
        let kind = parts.next().unwrap_or_default();
        if !kind.starts_with("KV") {
            return Err(KvError::Protocol {
                reason: format!("expected a KV* message, got {line:?}"),
            });
        }
        let mut m = Msg::new(kind);
        for p in parts {
            let (k, v) = p.split_once('=').ok_or_else(|| KvError::Protocol {
                reason: format!("field {p:?} of {kind} is not key=value"),
            })?;
            m.fields.insert(k.to_owned(), v.to_owned());
        }
        if let Some(r) = reason {
            m.fields.insert("reason".into(), r.to_owned());
        }
        Ok(m)
    }

    /// Field `key` as text.
    pub fn str(&self, key: &str) -> Result<&str, KvError> {
        self.fields
            .get(key)
            .map(String::as_str)
            .ok_or_else(|| KvError::Protocol {
                reason: format!("{} lacks the field {key:?}", self.kind),
            })
    }

    /// Field `key` as a decimal number.
    pub fn u64(&self, key: &str) -> Result<u64, KvError> {
        let v = self.str(key)?;
        v.parse().map_err(|_| KvError::Protocol {
            reason: format!("{}: {key}={v:?} is not a number", self.kind),
        })
    }

    /// Field `key` as a decimal u32.
    pub fn u32(&self, key: &str) -> Result<u32, KvError> {
        let v = self.u64(key)?;
        u32::try_from(v).map_err(|_| KvError::Protocol {
            reason: format!("{}: {key}={v} is out of range", self.kind),
        })
    }

    /// Field `key` as hexadecimal.
    pub fn hex(&self, key: &str) -> Result<u64, KvError> {
        let v = self.str(key)?;
        u64::from_str_radix(v, 16).map_err(|_| KvError::Protocol {
            reason: format!("{}: {key}={v:?} is not hexadecimal", self.kind),
        })
    }

    /// Write as one line.
    pub fn send(&self, w: &mut impl Write) -> Result<(), KvError> {
        let mut line = self.to_line();
        line.push('\n');
        w.write_all(line.as_bytes())
            .and_then(|()| w.flush())
            .map_err(KvError::io("sending a control message"))
    }

    /// Read one line; EOF is a protocol error naming `expect`.
    pub fn recv(r: &mut impl BufRead, expect: &'static str) -> Result<Msg, KvError> {
        let mut line = String::new();
        let n = r.read_line(&mut line).map_err(|e| {
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) {
                KvError::Protocol {
                    reason: format!("no {expect} from the peer before the deadline"),
                }
            } else {
                KvError::Io {
                    step: expect,
                    source: e,
                }
            }
        })?;
        if n == 0 {
            return Err(KvError::Protocol {
                reason: format!("the peer closed the connection before sending {expect}"),
            });
        }
        Msg::parse(&line)
    }
}

/// The model fields of a hello/accept, checked against ours field by field.
pub fn model_fields(m: Msg, cfg: &ModelConfig) -> Msg {
    m.with("fp", format!("{:016x}", cfg.fingerprint()))
        .with("layers", cfg.layers)
        .with("heads", cfg.heads)
        .with("head_dim", cfg.head_dim)
        .with("ffn", cfg.ffn)
        .with("vocab", cfg.vocab)
        .with("seed", cfg.seed)
        .with("dtype", DTYPE)
}

/// Compare the peer's model fields with `cfg`; the first difference is the
/// error (dims before the fingerprint, so the message names the cause).
pub fn check_model(m: &Msg, cfg: &ModelConfig) -> Result<(), KvError> {
    let v = m.u32("v")?;
    if v != VERSION {
        return Err(KvError::LayoutMismatch {
            field: "protocol version",
            ours: VERSION.to_string(),
            theirs: v.to_string(),
        });
    }
    let dtype = m.str("dtype")?;
    if dtype != DTYPE {
        return Err(KvError::LayoutMismatch {
            field: "dtype",
            ours: DTYPE.into(),
            theirs: dtype.into(),
        });
    }
    for (field, ours) in [
        ("layers", cfg.layers),
        ("heads", cfg.heads),
        ("head_dim", cfg.head_dim),
    ] {
        let theirs = m.u32(field)?;
        if theirs != ours {
            return Err(KvError::LayoutMismatch {
                field,
                ours: ours.to_string(),
                theirs: theirs.to_string(),
            });
        }
    }
    let fp = m.hex("fp")?;
    if fp != cfg.fingerprint() {
        return Err(KvError::LayoutMismatch {
            field: "model fingerprint",
            ours: format!("{:016x}", cfg.fingerprint()),
            theirs: format!("{fp:016x}"),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip() {
        let m = model_fields(Msg::new("KVHELLO").with("v", VERSION), &ModelConfig::TINY)
            .with("tokens", 15)
            .with("reason", "free text = with spaces");
        let line = m.to_line();
        assert!(line.starts_with("KVHELLO "));
        assert_eq!(Msg::parse(&line).expect("parse"), m);
        check_model(&m, &ModelConfig::TINY).expect("same model");
        let other = ModelConfig {
            seed: 8,
            ..ModelConfig::TINY
        };
        let e = check_model(&m, &other).expect_err("seed differs");
        assert!(e.to_string().contains("fingerprint"), "{e}");
        assert!(Msg::parse("HELLO x=1").is_err());
        assert!(Msg::parse("KVHELLO x").is_err());
        assert!(m.u64("nope").is_err());
    }

    #[test]
    fn chunk_plan_covers_k_and_v_exactly() {
        let g = KvGeometry::new(&ModelConfig::TINY, 15, 20);
        let plan = ChunkPlan::new(g, 1000).expect("plan");
        let row = ModelConfig::TINY.d_model() as u64 * 4;
        let part = row * 15;
        let mut k = 0u64;
        let mut v = 0u64;
        for c in plan.layer(1) {
            assert_eq!(plan.lookup(imm(1, c.index)), Some(c));
            if c.is_v {
                assert_eq!(c.offset, g.layer_stride + g.v_offset + v);
                v += u64::from(c.len);
            } else {
                assert_eq!(c.offset, g.layer_stride + k);
                k += u64::from(c.len);
            }
        }
        assert_eq!((k, v), (part, part));
        assert_eq!(plan.lookup(imm(2, 0)), None);
        assert_eq!(plan.lookup(imm(0, plan.per_layer())), None);
        assert_eq!(split_imm(imm(3, 7)), (3, 7));
        g.check(ModelConfig::TINY.d_model(), g.region_len())
            .expect("fits");
        assert!(g.check(ModelConfig::TINY.d_model(), 10).is_err());
    }
}
