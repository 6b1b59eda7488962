//! Command-line pieces the three binaries share (clap).

use std::time::Duration;

use clap::Args;
use rnic::rxe::FaultConfig;

use crate::model::ModelConfig;

/// The model: a preset, overridable field by field.
#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// Use the tiny test model (2 layers, 8 heads of 16) instead of the demo
    /// model (8 layers, 8 heads of 64, MLP 1024, vocab 512).
    #[arg(long)]
    pub tiny: bool,
    /// Transformer layers.
    #[arg(long)]
    pub layers: Option<u32>,
    /// Attention heads.
    #[arg(long)]
    pub heads: Option<u32>,
    /// Dimension per head (a multiple of 8).
    #[arg(long)]
    pub head_dim: Option<u32>,
    /// MLP hidden size (a multiple of 8).
    #[arg(long)]
    pub ffn: Option<u32>,
    /// Vocabulary size.
    #[arg(long)]
    pub vocab: Option<u32>,
    /// Seed of the weights (both nodes must use the same).
    #[arg(long)]
    pub model_seed: Option<u64>,
}

impl ModelArgs {
    /// The config these flags describe.
    pub fn config(&self) -> ModelConfig {
        let base = if self.tiny {
            ModelConfig::TINY
        } else {
            ModelConfig::DEMO
        };
        ModelConfig {
            layers: self.layers.unwrap_or(base.layers),
            heads: self.heads.unwrap_or(base.heads),
            head_dim: self.head_dim.unwrap_or(base.head_dim),
            ffn: self.ffn.unwrap_or(base.ffn),
            vocab: self.vocab.unwrap_or(base.vocab),
            seed: self.model_seed.unwrap_or(base.seed),
        }
    }
}

/// Fault injection in the rxe backend's receive path.
#[derive(Args, Debug, Clone)]
pub struct FaultArgs {
    /// Drop this percentage of received RoCE packets (rxe only).
    #[arg(long, default_value_t = 0.0)]
    pub loss: f64,
    /// Deliver this percentage of received packets after their successor.
    #[arg(long, default_value_t = 0.0)]
    pub reorder: f64,
    /// Seed of the fault pattern.
    #[arg(long, default_value_t = 1)]
    pub fault_seed: u64,
}

impl FaultArgs {
    /// The rxe fault config (`salt` varies the seed per node).
    pub fn config(&self, salt: u64) -> FaultConfig {
        let ppm = |pct: f64| (pct.clamp(0.0, 100.0) * 10_000.0).round() as u32;
        FaultConfig {
            seed: self.fault_seed.wrapping_add(salt),
            drop_ppm: ppm(self.loss),
            reorder_ppm: ppm(self.reorder),
        }
    }
}

/// Parse a duration in seconds (fractions allowed).
pub fn secs(s: &str) -> Result<Duration, String> {
    let v: f64 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if !(0.0..=86_400.0).contains(&v) {
        return Err("seconds must be in 0..=86400".into());
    }
    Ok(Duration::from_secs_f64(v))
}
