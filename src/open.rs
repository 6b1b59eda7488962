//! [`open`]: a device spec string → an open device's verbs context.

use thiserror::Error;

use crate::spec::{DeviceSpec, SpecError};

/// Why [`open`] failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The spec string names no device.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// The backend the spec names is not in this build, or not written yet.
    #[error("{spec}: the {backend} backend is not available in this build: {hint}")]
    NotBuilt {
        /// The spec.
        spec: String,
        /// The backend's name.
        backend: &'static str,
        /// What to do.
        hint: &'static str,
    },
    /// The rxe backend could not open the device.
    #[cfg(feature = "rxe")]
    #[error("opening {spec}: {source}")]
    Rxe {
        /// The spec.
        spec: String,
        /// Why.
        #[source]
        source: rnic_rxe::RxeError,
    },
}

/// Open the device `spec` names (`rxe`, `rxe:<netdev>`, `rxe:<ip>`,
/// `mlx5:<pci bdf>`) and return its verbs context.
///
/// `rxe` backends run with a progress thread; use [`rnic_rxe::RxeDevice`]
/// directly for caller-driven progress or for the device's counters.
pub fn open(spec: &str) -> Result<rnic_core::Context, OpenError> {
    let parsed: DeviceSpec = spec.parse()?;
    match parsed {
        #[cfg(feature = "rxe")]
        DeviceSpec::Rxe(target) => {
            let target = match target {
                crate::spec::RxeTarget::Netdev(n) => rnic_rxe::Target::Netdev(n),
                crate::spec::RxeTarget::Ip(ip) => rnic_rxe::Target::Ip(ip),
            };
            rnic_rxe::RxeDevice::open(&rnic_rxe::RxeConfig::new(target))
                .map(|d| d.context())
                .map_err(|source| OpenError::Rxe {
                    spec: spec.to_owned(),
                    source,
                })
        }
        #[cfg(not(feature = "rxe"))]
        DeviceSpec::Rxe(_) => Err(OpenError::NotBuilt {
            spec: spec.to_owned(),
            backend: "rxe",
            hint: "rebuild with the `rxe` feature (on by default)",
        }),
        DeviceSpec::Mlx5(_) => Err(OpenError::NotBuilt {
            spec: spec.to_owned(),
            backend: "mlx5",
            hint: "the VFIO ConnectX driver (feature `mlx5`) is not available yet; use rxe:<netdev|ip> meanwhile",
        }),
        #[allow(unreachable_patterns)]
        _ => Err(OpenError::NotBuilt {
            spec: spec.to_owned(),
            backend: "unknown",
            hint: "this build does not know the backend",
        }),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn mlx5_is_not_built_yet() {
        let e = open("mlx5:0000:3b:00.1").unwrap_err();
        assert!(matches!(
            e,
            OpenError::NotBuilt {
                backend: "mlx5",
                ..
            }
        ));
        assert!(e.to_string().contains("feature `mlx5`"), "{e}");
    }

    #[test]
    fn bad_spec_is_a_spec_error() {
        assert!(matches!(open("nope:1"), Err(OpenError::Spec(_))));
    }

    #[cfg(feature = "rxe")]
    #[test]
    fn rxe_missing_interface_lists_the_real_ones() {
        let e = open("rxe:nosuchif9").unwrap_err();
        let m = e.to_string();
        assert!(m.contains("not found") && m.contains("lo"), "{m}");
    }
}
