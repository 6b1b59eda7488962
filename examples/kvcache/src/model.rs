//! A small decoder-only transformer in plain Rust (f32): token embedding,
//! `layers` × (RMSNorm → multi-head attention with RoPE → residual → RMSNorm
//! → SiLU MLP → residual), final RMSNorm, output head tied to the embedding,
//! greedy sampling. Weights are seeded random numbers, so a
//! [`ModelConfig`] (with its seed) *is* the model: two nodes that agree on
//! the config compute bit-identical results.
//!
//! Every floating-point reduction has a fixed order (8 lanes, then a fixed
//! tree), so the result depends only on the inputs — never on which node or
//! which code path (prefill or decode) computed it.
//!
//! The prefill ([`Model::prefill`]) hands each layer's K and V to a callback
//! as soon as they are computed — before that layer's attention and MLP — so
//! a transport can ship them while the rest of the layer runs. The decode
//! step ([`Model::decode_step`]) reads cached K/V rows through a
//! [`KvStore`], which the decode node backs with its registered region.

use crate::KvError;

/// The shape and seed of a model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ModelConfig {
    /// Transformer blocks.
    pub layers: u32,
    /// Attention heads.
    pub heads: u32,
    /// Dimension per head (even: RoPE rotates pairs).
    pub head_dim: u32,
    /// Hidden size of the MLP.
    pub ffn: u32,
    /// Vocabulary size (≤ 65,536).
    pub vocab: u32,
    /// Seed of the weights.
    pub seed: u64,
}

impl ModelConfig {
    /// The demo default: 8 layers, 8 heads of 64, MLP 1024, vocab 512.
    pub const DEMO: ModelConfig = ModelConfig {
        layers: 8,
        heads: 8,
        head_dim: 64,
        ffn: 1024,
        vocab: 512,
        seed: 0x5EED,
    };

    /// A config small enough for debug-build tests: 2 layers, 8 heads of 16.
    pub const TINY: ModelConfig = ModelConfig {
        layers: 2,
        heads: 8,
        head_dim: 16,
        ffn: 256,
        vocab: 256,
        seed: 7,
    };

    /// Model width (`heads × head_dim`).
    pub fn d_model(&self) -> usize {
        self.heads as usize * self.head_dim as usize
    }

    /// Check the shape is one this code runs.
    pub fn validate(&self) -> Result<(), KvError> {
        let bad = |reason: &'static str| Err(KvError::Config { reason });
        if self.layers == 0 || self.layers > 4096 {
            return bad("layers must be 1..=4096");
        }
        if self.heads == 0 || self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            return bad("heads must be >= 1 and head_dim even and >= 2");
        }
        if !self.head_dim.is_multiple_of(8) {
            return bad("head_dim must be a multiple of 8");
        }
        if self.ffn == 0 || !self.ffn.is_multiple_of(8) {
            return bad("ffn must be a positive multiple of 8");
        }
        if self.vocab < 2 || self.vocab > 65_536 {
            return bad("vocab must be 2..=65536");
        }
        Ok(())
    }

    /// A 64-bit fingerprint of the model (shape, seed, and the code's
    /// numerics version): both nodes must agree on it.
    pub fn fingerprint(&self) -> u64 {
        let mut h = Fnv::new();
        h.bytes(b"rnic-kvcache-model-v1");
        for v in [self.layers, self.heads, self.head_dim, self.ffn, self.vocab] {
            h.bytes(&v.to_le_bytes());
        }
        h.bytes(&self.seed.to_le_bytes());
        h.finish()
    }
}

/// FNV-1a, 64 bit: fingerprints and KV digests.
#[derive(Clone, Copy, Debug)]
pub struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Fnv {
        Fnv::new()
    }
}

impl Fnv {
    /// A fresh hash.
    pub fn new() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
    /// Mix in bytes.
    pub fn bytes(&mut self, b: &[u8]) {
        for &x in b {
            self.0 ^= u64::from(x);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    /// The hash.
    pub fn finish(&self) -> u64 {
        self.0
    }
}

/// Seeded generator for weights and prompts (splitmix64).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `[-a, a)`.
    pub fn uniform(&mut self, a: f32) -> f32 {
        let u = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        (2.0 * u - 1.0) * a
    }
}

/// The seeded prompt: `n` token ids below `vocab`.
pub fn prompt(n: usize, vocab: u32, seed: u64) -> Vec<u32> {
    let mut r = Rng::new(seed ^ 0x9009_u64);
    (0..n)
        .map(|_| (r.next_u64() % u64::from(vocab)) as u32)
        .collect()
}

/// Where the decode step reads and appends K/V rows (one row = all heads of
/// one position, `d_model` floats).
pub trait KvStore {
    /// Read K row `pos` of `layer` into `out`.
    fn read_k(&self, layer: usize, pos: usize, out: &mut [f32]) -> Result<(), KvError>;
    /// Read V row `pos` of `layer` into `out`.
    fn read_v(&self, layer: usize, pos: usize, out: &mut [f32]) -> Result<(), KvError>;
    /// Store the K and V rows of `pos` in `layer`.
    fn write_kv(&self, layer: usize, pos: usize, k: &[f32], v: &[f32]) -> Result<(), KvError>;
}

struct Layer {
    attn_norm: Vec<f32>,
    wq: Vec<f32>,
    wk: Vec<f32>,
    wv: Vec<f32>,
    wo: Vec<f32>,
    mlp_norm: Vec<f32>,
    w1: Vec<f32>,
    w2: Vec<f32>,
}

/// The model: config plus weights.
pub struct Model {
    cfg: ModelConfig,
    embed: Vec<f32>,
    layers: Vec<Layer>,
    final_norm: Vec<f32>,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model").field("cfg", &self.cfg).finish()
    }
}

fn mat(r: &mut Rng, rows: usize, cols: usize) -> Vec<f32> {
    let a = (3.0 / cols as f32).sqrt();
    (0..rows * cols).map(|_| r.uniform(a)).collect()
}

fn norm_weights(r: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| 1.0 + r.uniform(0.1)).collect()
}

/// Dot product with a fixed reduction order (8 lanes, then pairwise).
#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut tail = 0f32;
    for (x, y) in ar.iter().zip(br) {
        tail += x * y;
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// `out[o] = dot(w[o], x)` for a row-major `w` of `out.len()` rows.
fn matvec(w: &[f32], x: &[f32], out: &mut [f32]) {
    let n = x.len();
    for (o, row) in out.iter_mut().zip(w.chunks_exact(n)) {
        *o = dot(row, x);
    }
}

/// `out[t][o] = dot(w[o], xs[t])` for every row `t` of `xs` (width `n`;
/// `out` rows of width `m`): the same dot products as [`matvec`] per row,
/// tiled so each weight row is reused across a block of positions.
fn matmul(w: &[f32], xs: &[f32], n: usize, out: &mut [f32], m: usize) {
    const TILE: usize = 16;
    let rows = xs.len() / n;
    for t0 in (0..rows).step_by(TILE) {
        let t1 = (t0 + TILE).min(rows);
        for (o, wr) in w.chunks_exact(n).enumerate() {
            for t in t0..t1 {
                out[t * m + o] = dot(wr, &xs[t * n..(t + 1) * n]);
            }
        }
    }
}

/// `x += y`, element-wise.
fn add(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

fn rmsnorm(x: &[f32], w: &[f32], out: &mut [f32]) {
    let ss = dot(x, x) / x.len() as f32;
    let inv = 1.0 / (ss + 1e-5).sqrt();
    for ((o, xi), wi) in out.iter_mut().zip(x).zip(w) {
        *o = xi * inv * wi;
    }
}

/// Rotate pairs of every head of `x` (one position) by RoPE at `pos`.
fn rope(x: &mut [f32], head_dim: usize, pos: usize) {
    let half = head_dim / 2;
    for head in x.chunks_exact_mut(head_dim) {
        for i in 0..half {
            let theta = pos as f32 * 10_000f32.powf(-((2 * i) as f32) / head_dim as f32);
            let (s, c) = theta.sin_cos();
            let (a, b) = (head[2 * i], head[2 * i + 1]);
            head[2 * i] = a * c - b * s;
            head[2 * i + 1] = a * s + b * c;
        }
    }
}

fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// Greedy choice: the index of the largest logit not in `banned` (the
/// first, on ties). A small no-repeat window keeps a random-weight model
/// from locking onto one token, so the generated sequence says more about
/// the cache it was computed from.
pub fn pick(logits: &[f32], banned: &[u32]) -> u32 {
    let mut best: Option<usize> = None;
    for (i, x) in logits.iter().enumerate() {
        if banned.contains(&(i as u32)) {
            continue;
        }
        if best.is_none_or(|b| *x > logits[b]) {
            best = Some(i);
        }
    }
    best.unwrap_or(0) as u32
}

/// Scratch buffers of one position's forward pass.
struct Scratch {
    h: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    att: Vec<f32>,
    o: Vec<f32>,
    f1: Vec<f32>,
    scores: Vec<f32>,
    row: Vec<f32>,
}

impl Scratch {
    fn new(d: usize, ffn: usize) -> Scratch {
        Scratch {
            h: vec![0.0; d],
            q: vec![0.0; d],
            k: vec![0.0; d],
            v: vec![0.0; d],
            att: vec![0.0; d],
            o: vec![0.0; d],
            f1: vec![0.0; ffn],
            scores: Vec::new(),
            row: vec![0.0; d],
        }
    }
}

impl Model {
    /// Build the model `cfg` describes (weights from its seed).
    pub fn new(cfg: ModelConfig) -> Result<Model, KvError> {
        cfg.validate()?;
        let d = cfg.d_model();
        let ffn = cfg.ffn as usize;
        let mut r = Rng::new(cfg.seed);
        let embed = (0..cfg.vocab as usize * d)
            .map(|_| r.uniform(1.0))
            .collect();
        let layers = (0..cfg.layers)
            .map(|_| Layer {
                attn_norm: norm_weights(&mut r, d),
                wq: mat(&mut r, d, d),
                wk: mat(&mut r, d, d),
                wv: mat(&mut r, d, d),
                wo: mat(&mut r, d, d),
                mlp_norm: norm_weights(&mut r, d),
                w1: mat(&mut r, ffn, d),
                w2: mat(&mut r, d, ffn),
            })
            .collect();
        let final_norm = norm_weights(&mut r, d);
        Ok(Model {
            cfg,
            embed,
            layers,
            final_norm,
        })
    }

    /// The config.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    fn embed_row(&self, tok: u32, out: &mut [f32]) -> Result<(), KvError> {
        let d = self.cfg.d_model();
        let start = tok as usize * d;
        let row = self.embed.get(start..start + d).ok_or(KvError::Config {
            reason: "token id outside the vocabulary",
        })?;
        out.copy_from_slice(row);
        Ok(())
    }

    /// Prefill `tokens`: compute every layer's K and V for all positions,
    /// calling `on_layer(layer, k, v)` (row-major `[tokens][d_model]`) as
    /// soon as they exist — before that layer's attention and MLP run.
    pub fn prefill(
        &self,
        tokens: &[u32],
        mut on_layer: impl FnMut(usize, &[f32], &[f32]) -> Result<(), KvError>,
    ) -> Result<(), KvError> {
        let d = self.cfg.d_model();
        let hd = self.cfg.head_dim as usize;
        let nh = self.cfg.heads as usize;
        let t = tokens.len();
        let mut x = vec![0f32; t * d];
        for (row, &tok) in x.chunks_exact_mut(d).zip(tokens) {
            self.embed_row(tok, row)?;
        }
        let ffn = self.cfg.ffn as usize;
        let mut hs = vec![0f32; t * d];
        let mut qs = vec![0f32; t * d];
        let mut ks = vec![0f32; t * d];
        let mut vs = vec![0f32; t * d];
        let mut atts = vec![0f32; t * d];
        let mut os = vec![0f32; t * d];
        let mut f1s = vec![0f32; t * ffn];
        let mut scores = vec![0f32; t];
        let mut kh = vec![0f32; t * hd];
        let mut vh = vec![0f32; t * hd];
        let scale = 1.0 / (hd as f32).sqrt();
        for (li, layer) in self.layers.iter().enumerate() {
            for (xp, hp) in x.chunks_exact(d).zip(hs.chunks_exact_mut(d)) {
                rmsnorm(xp, &layer.attn_norm, hp);
            }
            matmul(&layer.wq, &hs, d, &mut qs, d);
            matmul(&layer.wk, &hs, d, &mut ks, d);
            matmul(&layer.wv, &hs, d, &mut vs, d);
            for (p, (q, k)) in qs
                .chunks_exact_mut(d)
                .zip(ks.chunks_exact_mut(d))
                .enumerate()
            {
                rope(q, hd, p);
                rope(k, hd, p);
            }
            on_layer(li, &ks, &vs)?;
            // Attention, one head at a time over head-major copies of K and
            // V (contiguous rows: the same dot products, cache-friendly).
            for head in 0..nh {
                let hr = head * hd..(head + 1) * hd;
                for (p, (kr, vr)) in ks.chunks_exact(d).zip(vs.chunks_exact(d)).enumerate() {
                    kh[p * hd..(p + 1) * hd].copy_from_slice(&kr[hr.clone()]);
                    vh[p * hd..(p + 1) * hd].copy_from_slice(&vr[hr.clone()]);
                }
                for p in 0..t {
                    let qh = &qs[p * d + head * hd..p * d + (head + 1) * hd];
                    for (sc, kr) in scores[..=p].iter_mut().zip(kh.chunks_exact(hd)) {
                        *sc = dot(qh, kr) * scale;
                    }
                    softmax(&mut scores[..=p]);
                    let out = &mut atts[p * d + head * hd..p * d + (head + 1) * hd];
                    out.fill(0.0);
                    for (&w, vr) in scores[..=p].iter().zip(vh.chunks_exact(hd)) {
                        for (oi, vi) in out.iter_mut().zip(vr) {
                            *oi += w * vi;
                        }
                    }
                }
            }
            // The rest of the layer, batched over positions (the same
            // per-position arithmetic as `finish_layer`).
            matmul(&layer.wo, &atts, d, &mut os, d);
            add(&mut x, &os);
            for (xp, hp) in x.chunks_exact(d).zip(hs.chunks_exact_mut(d)) {
                rmsnorm(xp, &layer.mlp_norm, hp);
            }
            matmul(&layer.w1, &hs, d, &mut f1s, ffn);
            for f in f1s.iter_mut() {
                *f = silu(*f);
            }
            matmul(&layer.w2, &f1s, ffn, &mut os, d);
            add(&mut x, &os);
        }
        Ok(())
    }

    /// The rest of a layer for one position: output projection, residual,
    /// MLP, residual.
    fn finish_layer(
        &self,
        layer: &Layer,
        x: &mut [f32],
        att: &[f32],
        o: &mut [f32],
        h: &mut [f32],
        f1: &mut [f32],
    ) {
        matvec(&layer.wo, att, o);
        for (xi, oi) in x.iter_mut().zip(o.iter()) {
            *xi += oi;
        }
        rmsnorm(x, &layer.mlp_norm, h);
        matvec(&layer.w1, h, f1);
        for f in f1.iter_mut() {
            *f = silu(*f);
        }
        matvec(&layer.w2, f1, o);
        for (xi, oi) in x.iter_mut().zip(o.iter()) {
            *xi += oi;
        }
    }

    /// One decode step: run `token` at position `pos` against the `pos`
    /// cached positions in `kv` (reading their rows through it), append
    /// this position's K/V, and return the next-token logits.
    pub fn decode_step(
        &self,
        token: u32,
        pos: usize,
        kv: &dyn KvStore,
    ) -> Result<Vec<f32>, KvError> {
        let d = self.cfg.d_model();
        let hd = self.cfg.head_dim as usize;
        let nh = self.cfg.heads as usize;
        let mut s = Scratch::new(d, self.cfg.ffn as usize);
        let mut x = vec![0f32; d];
        self.embed_row(token, &mut x)?;
        let scale = 1.0 / (hd as f32).sqrt();
        s.scores.resize((pos + 1) * nh, 0.0);
        for (li, layer) in self.layers.iter().enumerate() {
            rmsnorm(&x, &layer.attn_norm, &mut s.h);
            matvec(&layer.wq, &s.h, &mut s.q);
            rope(&mut s.q, hd, pos);
            matvec(&layer.wk, &s.h, &mut s.k);
            rope(&mut s.k, hd, pos);
            matvec(&layer.wv, &s.h, &mut s.v);
            kv.write_kv(li, pos, &s.k, &s.v)?;
            // Scores: stream the K rows of every position out of the store.
            for p in 0..=pos {
                kv.read_k(li, p, &mut s.row)?;
                for head in 0..nh {
                    let hs = head * hd..(head + 1) * hd;
                    s.scores[head * (pos + 1) + p] = dot(&s.q[hs.clone()], &s.row[hs]) * scale;
                }
            }
            for head in 0..nh {
                softmax(&mut s.scores[head * (pos + 1)..(head + 1) * (pos + 1)]);
            }
            // Weighted V: stream the V rows, in the same order as prefill.
            s.att.fill(0.0);
            for p in 0..=pos {
                kv.read_v(li, p, &mut s.row)?;
                for head in 0..nh {
                    let w = s.scores[head * (pos + 1) + p];
                    let hs = head * hd..(head + 1) * hd;
                    for (oi, vi) in s.att[hs.clone()].iter_mut().zip(&s.row[hs]) {
                        *oi += w * vi;
                    }
                }
            }
            self.finish_layer(layer, &mut x, &s.att, &mut s.o, &mut s.h, &mut s.f1);
        }
        rmsnorm(&x.clone(), &self.final_norm, &mut x);
        let mut logits = vec![0f32; self.cfg.vocab as usize];
        matvec(&self.embed, &x, &mut logits);
        Ok(logits)
    }
}

fn softmax(v: &mut [f32]) {
    let mut m = f32::NEG_INFINITY;
    for x in v.iter() {
        m = m.max(*x);
    }
    let mut sum = 0f32;
    for x in v.iter_mut() {
        *x = (*x - m).exp();
        sum += *x;
    }
    let inv = 1.0 / sum;
    for x in v.iter_mut() {
        *x *= inv;
    }
}

/// A [`KvStore`] in plain vectors (for the single-node reference's own
/// decode positions and for tests).
#[derive(Debug)]
pub struct VecKv {
    d: usize,
    cap: usize,
    k: std::cell::RefCell<Vec<f32>>,
    v: std::cell::RefCell<Vec<f32>>,
}

impl VecKv {
    /// Room for `layers × cap` rows of width `d`.
    pub fn new(layers: usize, cap: usize, d: usize) -> VecKv {
        VecKv {
            d,
            cap,
            k: std::cell::RefCell::new(vec![0.0; layers * cap * d]),
            v: std::cell::RefCell::new(vec![0.0; layers * cap * d]),
        }
    }

    fn at(&self, layer: usize, pos: usize) -> Result<usize, KvError> {
        if pos >= self.cap {
            return Err(KvError::Config {
                reason: "KV position beyond the cache capacity",
            });
        }
        Ok((layer * self.cap + pos) * self.d)
    }
}

impl KvStore for VecKv {
    fn read_k(&self, layer: usize, pos: usize, out: &mut [f32]) -> Result<(), KvError> {
        let a = self.at(layer, pos)?;
        out.copy_from_slice(&self.k.borrow()[a..a + self.d]);
        Ok(())
    }
    fn read_v(&self, layer: usize, pos: usize, out: &mut [f32]) -> Result<(), KvError> {
        let a = self.at(layer, pos)?;
        out.copy_from_slice(&self.v.borrow()[a..a + self.d]);
        Ok(())
    }
    fn write_kv(&self, layer: usize, pos: usize, k: &[f32], v: &[f32]) -> Result<(), KvError> {
        let a = self.at(layer, pos)?;
        self.k.borrow_mut()[a..a + self.d].copy_from_slice(k);
        self.v.borrow_mut()[a..a + self.d].copy_from_slice(v);
        Ok(())
    }
}
