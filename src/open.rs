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
    /// The mlx5 backend could not open or bring up the function.
    #[cfg(feature = "mlx5")]
    #[error("opening {spec}: {source}")]
    Mlx5 {
        /// The spec.
        spec: String,
        /// Why (boxed: the driver's error is large).
        #[source]
        source: Box<rnic_mlx5::Mlx5Error>,
    },
    /// The spec names another backend than the one asked for.
    #[error("{spec} is not an {backend} device spec")]
    WrongBackend {
        /// The spec.
        spec: String,
        /// The backend asked for.
        backend: &'static str,
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

impl OpenError {
    /// Why, without the spec: the cause's chain, each thing once
    /// ([`crate::error_chain`]), for a caller that names the spec itself.
    pub fn cause(&self) -> String {
        match self {
            #[cfg(feature = "mlx5")]
            OpenError::Mlx5 { source, .. } => crate::error_chain(source.as_ref()),
            #[cfg(feature = "rxe")]
            OpenError::Rxe { source, .. } => crate::error_chain(source),
            other => crate::error_chain(other),
        }
    }
}

/// Open the device `spec` names (`rxe`, `rxe:<netdev>`, `rxe:<ip>`,
/// `mlx5:<pci bdf>`, `mlx5:vfio-user:<socket>`) and return its verbs context.
///
/// An mlx5 function registers only its own DMA buffers: use [`open_mlx5`]
/// (feature `mlx5`) to get the provider, allocate with
/// `Mlx5Provider::alloc_dma`, and take the context from
/// `Mlx5Provider::context`.
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
        #[cfg(feature = "mlx5")]
        DeviceSpec::Mlx5 { .. } => open_mlx5(spec).map(|p| rnic_mlx5::Mlx5Provider::context(&p)),
        #[cfg(not(feature = "mlx5"))]
        DeviceSpec::Mlx5 { .. } => Err(OpenError::NotBuilt {
            spec: spec.to_owned(),
            backend: "mlx5",
            hint: "rebuild with feature `mlx5` (on by default)",
        }),
        #[allow(unreachable_patterns)]
        _ => Err(OpenError::NotBuilt {
            spec: spec.to_owned(),
            backend: "unknown",
            hint: "this build does not know the backend",
        }),
    }
}

/// Open and bring up the mlx5 function `spec` names (`mlx5:<pci bdf>`
/// through kernel VFIO, `mlx5:vfio-user:<socket>` through vfio-user), with
/// its event queue: the typed provider, for `alloc_dma`, `set_gid` and the
/// statically dispatched `Mlx5Provider::typed_context`. A spec ending in
/// `@<ip>` gets GID 0 programmed with that address.
#[cfg(feature = "mlx5")]
pub fn open_mlx5(spec: &str) -> Result<std::sync::Arc<rnic_mlx5::Mlx5Provider>, OpenError> {
    use std::sync::Arc;

    use rnic_mlx5::{Hca, HcaOptions, Mlx5Provider, PciFunction, VfioFunction, VfioUserFunction};

    use crate::spec::Mlx5Target;

    let err = |source| OpenError::Mlx5 {
        spec: spec.to_owned(),
        source: Box::new(source),
    };
    let DeviceSpec::Mlx5 {
        target,
        addr: gid,
        options,
    } = spec.parse::<DeviceSpec>()?
    else {
        return Err(OpenError::WrongBackend {
            spec: spec.to_owned(),
            backend: "mlx5",
        });
    };
    // A function has one owner (VFIO opens a device once; an emulated one
    // serves one driver): a second open in this process shares the first.
    let key = match &target {
        Mlx5Target::Pci(bdf) => bdf.to_string(),
        Mlx5Target::VfioUser(path) => std::fs::canonicalize(path)
            .unwrap_or_else(|_| path.clone())
            .display()
            .to_string(),
    };
    let mut opened = OPEN_MLX5
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    opened.retain(|_, w| w.strong_count() > 0);
    if let Some(provider) = opened.get(&key).and_then(std::sync::Weak::upgrade) {
        for (ip, mac) in options.neighbours {
            provider.hca().add_neighbour(ip, mac).map_err(err)?;
        }
        if let Some(ip) = gid {
            provider.ensure_gid(ip).map_err(err)?;
        }
        return Ok(provider);
    }
    use crate::spec::NeighbourMode;
    let pci = matches!(target, Mlx5Target::Pci(_));
    let function: Arc<dyn PciFunction> = match target {
        Mlx5Target::VfioUser(path) => Arc::new(VfioUserFunction::connect(path).map_err(err)?),
        Mlx5Target::Pci(bdf) => Arc::new(VfioFunction::open(&bdf, u64::MAX).map_err(err)?),
    };
    let mut opts = HcaOptions::default();
    opts.neighbours.host_kernel = options.neigh.map(|m| m == NeighbourMode::Host);
    opts.write_combining = !options.no_write_combining;
    let hca = Hca::bring_up(function, opts).map_err(err)?;
    for (ip, mac) in options.neighbours {
        hca.add_neighbour(ip, mac).map_err(err)?;
    }
    let provider = Mlx5Provider::new(hca).map_err(err)?;
    if let Some(mtu) = options.mtu {
        provider.hca().set_mtu(mtu).map_err(err)?;
    }
    if options.vlan.is_some() {
        provider.hca().set_vlan(options.vlan).map_err(err)?;
    }
    // A real port (kernel VFIO) answers and resolves ARP/ND by default.
    let arp = options.neigh.map_or(pci, |m| m == NeighbourMode::Arp);
    if arp {
        let port = rnic_mlx5::port::PortOptions {
            vlan: options.vlan.map(|(vid, pcp)| rnic_roce::wire::VlanTag {
                pcp,
                dei: false,
                vid,
            }),
            ..Default::default()
        };
        provider.open_port(port).map_err(err)?;
    }
    if let Some(ip) = gid {
        provider.set_gid(0, ip).map_err(err)?;
    }
    opened.insert(key, Arc::downgrade(&provider));
    Ok(provider)
}

/// The mlx5 functions this process has open, by PCI address or canonical
/// socket path: [`open_mlx5`] hands a second opener the same provider.
#[cfg(feature = "mlx5")]
static OPEN_MLX5: std::sync::Mutex<
    std::collections::BTreeMap<String, std::sync::Weak<rnic_mlx5::Mlx5Provider>>,
> = std::sync::Mutex::new(std::collections::BTreeMap::new());

/// Where an opened device's registrable memory comes from: what the tools
/// and examples allocate their buffers with, whatever the backend.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum MemorySource {
    /// Host memory ([`rnic_core::HeapMemory`]): what rxe registers.
    Host,
    /// The mlx5 function's own DMA buffers (`Mlx5Provider::alloc_dma`),
    /// the only memory it registers.
    #[cfg(feature = "mlx5")]
    Mlx5(std::sync::Arc<rnic_mlx5::Mlx5Provider>),
}

/// Why [`MemorySource::alloc`] failed.
#[derive(Debug, Error)]
#[error("allocating {len} bytes of {what}: {source}")]
pub struct AllocError {
    /// The length asked for.
    pub len: usize,
    /// The kind of memory.
    pub what: &'static str,
    /// Why.
    #[source]
    pub source: Box<dyn std::error::Error + Send + Sync>,
}

impl MemorySource {
    /// `len` zeroed bytes the device can register (`reg_mr` on its context).
    pub fn alloc(&self, len: usize) -> Result<std::sync::Arc<dyn rnic_core::Memory>, AllocError> {
        match self {
            MemorySource::Host => Ok(std::sync::Arc::new(rnic_core::HeapMemory::new(len))),
            #[cfg(feature = "mlx5")]
            MemorySource::Mlx5(p) => match p.alloc_dma(len.max(1)) {
                Ok(b) => Ok(b),
                Err(e) => Err(AllocError {
                    len,
                    what: "mlx5 DMA memory",
                    source: Box::new(e),
                }),
            },
        }
    }

    /// The mlx5 provider behind this source, if it is one.
    #[cfg(feature = "mlx5")]
    pub fn mlx5(&self) -> Option<&std::sync::Arc<rnic_mlx5::Mlx5Provider>> {
        match self {
            MemorySource::Mlx5(p) => Some(p),
            MemorySource::Host => None,
        }
    }
}

/// [`open`], and where the device's registrable memory comes from: host
/// memory for rxe, the function's DMA buffers for mlx5. Programs written
/// against this run unchanged on every backend.
pub fn open_with_memory(spec: &str) -> Result<(rnic_core::Context, MemorySource), OpenError> {
    match spec.parse::<DeviceSpec>()? {
        #[cfg(feature = "mlx5")]
        DeviceSpec::Mlx5 { .. } => {
            let p = open_mlx5(spec)?;
            Ok((rnic_mlx5::Mlx5Provider::context(&p), MemorySource::Mlx5(p)))
        }
        _ => open(spec).map(|c| (c, MemorySource::Host)),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[cfg(not(feature = "mlx5"))]
    #[test]
    fn mlx5_needs_its_feature() {
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

    #[cfg(feature = "mlx5")]
    #[test]
    fn mlx5_without_a_server_says_to_start_the_emulator() {
        let e = open("mlx5:vfio-user:/nonexistent/rnic-emu.sock").unwrap_err();
        assert!(matches!(e, OpenError::Mlx5 { .. }), "{e}");
        let chain = crate::error_chain(&e);
        assert!(chain.contains("is rnic-mlx5-emu running?"), "{chain}");
        // Each thing once (issue 26 item 5): the spec, the hint, the OS error.
        for part in [
            "mlx5:vfio-user:/nonexistent/rnic-emu.sock",
            "is rnic-mlx5-emu running?",
            "os error 2",
        ] {
            assert_eq!(chain.matches(part).count(), 1, "{part:?} in {chain}");
        }
    }

    #[cfg(feature = "mlx5")]
    #[test]
    fn mlx5_on_an_absent_pci_function_is_an_error() {
        assert!(matches!(
            open("mlx5:0000:ff:1f.7"),
            Err(OpenError::Mlx5 { .. })
        ));
        assert!(matches!(
            open_mlx5("rxe:127.0.0.1"),
            Err(OpenError::WrongBackend { .. })
        ));
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
