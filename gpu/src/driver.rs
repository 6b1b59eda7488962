//! Is there a CUDA driver? The one place rnic-gpu decides, before any
//! cudarc call: cudarc loads `libcuda` lazily and **panics** when the
//! library, or any symbol it is asked for, is missing. So every entry point
//! of this crate goes through [`driver`] first, which
//!
//! 1. honours `RNIC_GPU=off` (GPU features off on purpose, e.g. to test the
//!    no-driver path on a GPU machine);
//! 2. asks cudarc's loader whether a `libcuda` candidate opens
//!    (`is_culib_present`, no panic);
//! 3. looks up every driver function rnic calls by name ([`REQUIRED`]), so
//!    an older driver is a typed [`GpuError::MissingSymbol`], never a panic
//!    in the middle of a copy;
//! 4. runs `cuInit(0)` and counts the devices.
//!
//! The answer is computed once per process.

use std::ffi::c_int;
use std::sync::OnceLock;

use cudarc::driver::{result, sys};

use crate::error::GpuError;

/// Every driver function rnic-gpu calls, directly or through cudarc's safe
/// API on the paths it uses.
pub const REQUIRED: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuGetErrorName",
    "cuGetErrorString",
    "cuDeviceGet",
    "cuDeviceGetCount",
    "cuDeviceGetAttribute",
    "cuDeviceGetName",
    "cuDeviceGetPCIBusId",
    "cuDeviceTotalMem_v2",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxGetCurrent",
    "cuCtxSetCurrent",
    "cuCtxSynchronize",
    "cuStreamCreate",
    "cuStreamSynchronize",
    "cuStreamDestroy_v2",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventSynchronize",
    "cuEventQuery",
    "cuEventElapsedTime",
    "cuEventDestroy_v2",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuMemHostRegister_v2",
    "cuMemHostUnregister",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyHtoD_v2",
    "cuMemcpyDtoH_v2",
    "cuMemsetD8_v2",
    "cuPointerGetAttribute",
    "cuPointerSetAttribute",
];

/// Functions used only where present (a feature, not a requirement).
pub const OPTIONAL: &[&str] = &[
    "cuMemGetHandleForAddressRange",
    "cuFlushGPUDirectRDMAWrites",
];

/// What the probe found when a driver is there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriverInfo {
    /// `cuDriverGetVersion`: (major, minor) of the CUDA API the driver supports.
    pub version: (i32, i32),
    /// Devices `cuDeviceGetCount` reports.
    pub devices: usize,
    /// Which of [`OPTIONAL`] the driver has.
    pub optional: Vec<&'static str>,
}

impl DriverInfo {
    /// `major.minor`.
    pub fn version_string(&self) -> String {
        format!("CUDA {}.{}", self.version.0, self.version.1)
    }

    /// Whether the optional driver function `name` is present.
    pub fn has(&self, name: &str) -> bool {
        self.optional.contains(&name)
    }
}

/// The probe's result, without the error's fix text (for `doctor`).
#[derive(Clone, Debug)]
enum Probe {
    Ready(DriverInfo),
    NoDriver(String),
    Missing(&'static str, String),
    Init(String),
}

static PROBE: OnceLock<Probe> = OnceLock::new();

fn symbol_present(name: &str) -> bool {
    // SAFETY: only called after is_culib_present() returned true, so culib()
    // finds a library and does not panic.
    let lib = unsafe { sys::culib() };
    // SAFETY: looking a symbol up has no side effects; the pointer is
    // neither kept nor called.
    unsafe { lib.get::<unsafe extern "C" fn()>(name.as_bytes()) }.is_ok()
}

fn driver_version() -> (i32, i32) {
    let mut v: c_int = 0;
    // SAFETY: cuDriverGetVersion (checked present) writes one int through a
    // valid pointer; it needs no cuInit.
    let r = unsafe { sys::cuDriverGetVersion(&mut v) };
    if r == sys::cudaError_enum::CUDA_SUCCESS {
        (v / 1000, (v % 1000) / 10)
    } else {
        (0, 0)
    }
}

fn probe() -> Probe {
    if std::env::var("RNIC_GPU").is_ok_and(|v| v == "off" || v == "0") {
        return Probe::NoDriver("RNIC_GPU=off is set (unset it to use the GPU)".into());
    }
    // SAFETY: is_culib_present only tries to dlopen the candidate names and
    // drops what it opened; it does not panic.
    if !unsafe { sys::is_culib_present() } {
        return Probe::NoDriver(
            "libcuda.so / libcuda.so.1 cannot be loaded (no NVIDIA driver, or its library is not \
             on the loader path)"
                .into(),
        );
    }
    if !symbol_present("cuDriverGetVersion") {
        return Probe::Missing("cuDriverGetVersion", "unknown version".into());
    }
    let version = driver_version();
    let vs = format!("CUDA {}.{}", version.0, version.1);
    if let Some(missing) = REQUIRED.iter().find(|s| !symbol_present(s)) {
        return Probe::Missing(missing, vs);
    }
    if let Err(e) = result::init() {
        return Probe::Init(format!(
            "libcuda loaded ({vs}) but cuInit failed: {:?} — is the nvidia kernel module loaded \
             (lsmod | grep nvidia) and /dev/nvidia* accessible?",
            e.0
        ));
    }
    let devices = match result::device::get_count() {
        Ok(n) => usize::try_from(n).unwrap_or(0),
        Err(e) => return Probe::Init(format!("cuDeviceGetCount failed: {:?}", e.0)),
    };
    let optional = OPTIONAL
        .iter()
        .copied()
        .filter(|s| symbol_present(s))
        .collect();
    Probe::Ready(DriverInfo {
        version,
        devices,
        optional,
    })
}

/// The CUDA driver, probed once; [`GpuError::NoDriver`] (with the fix)
/// when there is none. Every GPU entry point calls this first.
pub fn driver() -> Result<&'static DriverInfo, GpuError> {
    match PROBE.get_or_init(probe) {
        Probe::Ready(info) => Ok(info),
        Probe::NoDriver(d) | Probe::Init(d) => Err(GpuError::NoDriver { detail: d.clone() }),
        Probe::Missing(symbol, version) => Err(GpuError::MissingSymbol {
            symbol,
            version: version.clone(),
        }),
    }
}

/// Whether a usable CUDA driver with at least one device is present.
pub fn available() -> bool {
    driver().is_ok_and(|d| d.devices > 0)
}
