//! The single-node reference: prefill and greedy decode in one process,
//! through the same region layout and views the decode node uses, with
//! no network in between. The disaggregated pair must match it exactly.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rnic::core::{HeapMemory, Memory};

use crate::KvError;
use crate::layout::KvGeometry;
use crate::model::{KvStore, Model, ModelConfig, pick, prompt};
use crate::view::{KvRegion, f32_bytes};

/// What the reference computed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reference {
    /// The generated tokens.
    pub tokens: Vec<u32>,
    /// FNV-1a of the prompt's KV cache (as the decode node's digest).
    pub digest: u64,
    /// Prefill compute time.
    pub prefill: Duration,
    /// Time to first token.
    pub ttft: Duration,
}

/// Tokens a greedy step may not repeat (the last ones fed or generated).
pub const NO_REPEAT: usize = 4;

/// Greedy generation of `n` tokens: feed `first` at position `pos`, then
/// each generated token at the next position. `on_token(i, token)` sees
/// every token as it is produced.
pub fn greedy(
    model: &Model,
    kv: &dyn KvStore,
    first: u32,
    pos: usize,
    n: u32,
    mut on_token: impl FnMut(u32, u32),
) -> Result<Vec<u32>, KvError> {
    let mut out = Vec::with_capacity(n as usize);
    let mut recent = std::collections::VecDeque::from([first]);
    let mut tok = first;
    for i in 0..n {
        let logits = model.decode_step(tok, pos + i as usize, kv)?;
        tok = pick(&logits, recent.make_contiguous());
        recent.push_back(tok);
        if recent.len() > NO_REPEAT {
            recent.pop_front();
        }
        on_token(i, tok);
        out.push(tok);
    }
    Ok(out)
}

/// Run the reference for a prompt of `prompt_len` seeded tokens.
pub fn run(
    cfg: &ModelConfig,
    prompt_len: u32,
    prompt_seed: u64,
    generate: u32,
) -> Result<Reference, KvError> {
    if prompt_len < 2 {
        return Err(KvError::Config {
            reason: "the prompt needs at least 2 tokens",
        });
    }
    let model = Model::new(*cfg)?;
    let toks = prompt(prompt_len as usize, cfg.vocab, prompt_seed);
    let cached = prompt_len - 1;
    let g = KvGeometry::new(cfg, cached, cached + generate);
    let mem: Arc<dyn Memory> = Arc::new(HeapMemory::new(g.region_len() as usize));
    let start = Instant::now();
    let mut bytes = Vec::new();
    model.prefill(&toks[..cached as usize], |layer, k, v| {
        f32_bytes(k, &mut bytes);
        mem.write(g.k_row(layer, 0) as usize, &bytes)
            .map_err(KvError::mem("storing K"))?;
        f32_bytes(v, &mut bytes);
        mem.write(g.v_row(layer, 0) as usize, &bytes)
            .map_err(KvError::mem("storing V"))
    })?;
    let prefill = start.elapsed();
    let region = KvRegion::new(Arc::clone(&mem), g, cfg.d_model())?;
    let mut ttft = Duration::ZERO;
    let last = toks.last().copied().unwrap_or(0);
    let tokens = greedy(&model, &region, last, cached as usize, generate, |i, _| {
        if i == 0 {
            ttft = start.elapsed();
        }
    })?;
    Ok(Reference {
        tokens,
        digest: region.digest()?,
        prefill,
        ttft,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::VecKv;

    /// The region views are an exact mapping: decoding from plain vectors
    /// filled straight from the prefill gives the same tokens.
    #[test]
    fn region_views_decode_like_plain_vectors() {
        let cfg = ModelConfig::TINY;
        let r = run(&cfg, 24, 3, 6).expect("reference");
        let model = Model::new(cfg).expect("model");
        let toks = prompt(24, cfg.vocab, 3);
        let d = cfg.d_model();
        let kv = VecKv::new(cfg.layers as usize, 30, d);
        model
            .prefill(&toks[..23], |layer, k, v| {
                for (p, (kr, vr)) in k.chunks_exact(d).zip(v.chunks_exact(d)).enumerate() {
                    kv.write_kv(layer, p, kr, vr)?;
                }
                Ok(())
            })
            .expect("prefill");
        let out = greedy(&model, &kv, toks[23], 23, 6, |_, _| {}).expect("decode");
        assert_eq!(out, r.tokens);
        assert_eq!(r.tokens.len(), 6);
    }
}
