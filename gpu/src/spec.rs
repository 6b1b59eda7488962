//! [`MemorySpec`]: where a buffer lives, as users write it (`host`,
//! `gpu`, `gpu:1`, `gpu-emulated`) on command lines such as
//! `kv_decode --kv-memory gpu:0`.

use std::fmt;
use std::str::FromStr;

use crate::error::GpuError;

/// Host memory or the VRAM of one GPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum MemorySpec {
    /// Host memory (hugepages, NUMA-placed).
    #[default]
    Host,
    /// VRAM of the GPU with this CUDA ordinal.
    Gpu(usize),
    /// Host memory behind the same staging ring and copy queue as VRAM
    /// ([`crate::HostEngine`]): the GPU path, testable without a GPU.
    Emulated,
}

impl FromStr for MemorySpec {
    type Err = GpuError;

    fn from_str(s: &str) -> Result<MemorySpec, GpuError> {
        let bad = |reason: &str| GpuError::BadSpec {
            spec: s.to_owned(),
            reason: reason.to_owned(),
        };
        match s.trim() {
            "host" | "cpu" => Ok(MemorySpec::Host),
            "gpu" => Ok(MemorySpec::Gpu(0)),
            "gpu-emulated" => Ok(MemorySpec::Emulated),
            t => match t.strip_prefix("gpu:") {
                Some(n) => n
                    .parse()
                    .map(MemorySpec::Gpu)
                    .map_err(|_| bad("the ordinal after gpu: is not a number")),
                None => Err(bad("unknown memory kind")),
            },
        }
    }
}

impl fmt::Display for MemorySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemorySpec::Host => f.write_str("host"),
            MemorySpec::Gpu(n) => write!(f, "gpu:{n}"),
            MemorySpec::Emulated => f.write_str("gpu-emulated"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints() {
        for (text, spec) in [
            ("host", MemorySpec::Host),
            ("gpu", MemorySpec::Gpu(0)),
            ("gpu:0", MemorySpec::Gpu(0)),
            ("gpu:3", MemorySpec::Gpu(3)),
            ("gpu-emulated", MemorySpec::Emulated),
        ] {
            assert_eq!(text.parse::<MemorySpec>().unwrap(), spec);
        }
        assert_eq!(MemorySpec::Gpu(2).to_string(), "gpu:2");
        assert_eq!(MemorySpec::Emulated.to_string(), "gpu-emulated");
        for bad in ["gpu:", "gpu:x", "vram", "gpu:-1", ""] {
            let e = bad.parse::<MemorySpec>().unwrap_err();
            assert!(matches!(e, GpuError::BadSpec { .. }), "{bad:?} gave {e:?}");
            assert!(
                e.to_string()
                    .contains("expected host, gpu, gpu:<ordinal> or gpu-emulated")
            );
        }
    }
}
