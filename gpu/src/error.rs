//! [`GpuError`]: every failure of rnic-gpu, with the fix in the message.

use rnic_core::MemoryError;
use rnic_dma::DmaError;
use thiserror::Error;

/// What went wrong in rnic-gpu. Every entry point returns it; none panics.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum GpuError {
    /// No CUDA driver library on this machine: every GPU entry point returns
    /// this before touching cudarc (which would panic).
    #[error(
        "no CUDA driver: {detail}; rnic's GPU features are off. Install the NVIDIA driver \
         (Debian: apt-get install nvidia-driver libcuda1, or the CUDA repository's cuda-drivers) \
         so that libcuda.so.1 is on the loader path (ldconfig -p | grep libcuda), then check with \
         `rnicctl doctor`"
    )]
    NoDriver {
        /// What the probe found.
        detail: String,
    },
    /// The driver library is there but lacks a function rnic calls (a driver
    /// older than the CUDA 12.8 API rnic is built against).
    #[error(
        "the CUDA driver ({version}) lacks {symbol}: upgrade the NVIDIA driver to one that \
         supports CUDA 12.8 or newer (R570+)"
    )]
    MissingSymbol {
        /// The missing entry point.
        symbol: &'static str,
        /// `cuDriverGetVersion`, as `major.minor`.
        version: String,
    },
    /// A CUDA call failed.
    #[error("{op} failed: {code} ({text}){hint}")]
    Cuda {
        /// The call, with its arguments where they matter.
        op: String,
        /// The CUresult name (`CUDA_ERROR_OUT_OF_MEMORY`).
        code: String,
        /// The driver's description.
        text: String,
        /// What to do, when known (starts with "; ").
        hint: &'static str,
    },
    /// No GPU with that ordinal.
    #[error(
        "no GPU {ordinal}: the driver reports {count} device(s); use an ordinal below {count} (nvidia-smi -L lists them)"
    )]
    NoDevice {
        /// The ordinal asked for.
        ordinal: usize,
        /// Devices present.
        count: usize,
    },
    /// A device-memory spec (`gpu:0`) that does not parse.
    #[error(
        "bad GPU memory spec '{spec}': {reason} (expected host, gpu, gpu:<ordinal> or gpu-emulated)"
    )]
    BadSpec {
        /// The text given.
        spec: String,
        /// Why it was refused.
        reason: String,
    },
    /// The host staging buffer could not be built.
    #[error("host staging buffer: {0}")]
    Staging(#[from] DmaError),
    /// An access outside a buffer or a refused copy.
    #[error(transparent)]
    Memory(#[from] MemoryError),
    /// A copy was queued from a host buffer the engine was not told about.
    #[error(
        "{engine}: copy from a host buffer at {addr:#x} that is not registered with the engine: \
         register staging buffers first (async copies need page-locked, registered memory)"
    )]
    NotRegistered {
        /// The engine.
        engine: String,
        /// Start of the buffer.
        addr: usize,
    },
    /// What this machine cannot do, and why.
    #[error("{what} is not available here: {why}")]
    Unsupported {
        /// The feature.
        what: &'static str,
        /// The reason and the fix.
        why: String,
    },
}

impl GpuError {
    /// The error for a failed CUDA call `op` with result `code`.
    pub(crate) fn cuda(op: impl Into<String>, e: cudarc::driver::DriverError) -> GpuError {
        let code = format!("{:?}", e.0);
        let text = e
            .error_string()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|_| "no description".into());
        let hint = match e.0 {
            cudarc::driver::sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY => {
                "; free GPU memory (nvidia-smi shows who holds it) or use a smaller buffer"
            }
            cudarc::driver::sys::cudaError_enum::CUDA_ERROR_NO_DEVICE => {
                "; no usable GPU: check nvidia-smi and CUDA_VISIBLE_DEVICES"
            }
            cudarc::driver::sys::cudaError_enum::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED => {
                "; the range is already registered with CUDA (register each staging buffer once)"
            }
            cudarc::driver::sys::cudaError_enum::CUDA_ERROR_NOT_PERMITTED => {
                "; the driver refused: run as root or check the device's permissions"
            }
            _ => "",
        };
        GpuError::Cuda {
            op: op.into(),
            code,
            text,
            hint,
        }
    }
}
