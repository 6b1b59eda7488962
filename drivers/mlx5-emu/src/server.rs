//! [`Emulator`]: the vfio-user server around a [`Device`] — socket
//! handling, the region and interrupt tables the client sees, the
//! `ServerBackend` callbacks, and the threads (serving, watcher, health).
//!
//! # Serving
//!
//! `vfio_user::Server::run` serves one connection and returns when the
//! client disconnects; the serving thread calls it again for the next driver,
//! after dropping the old client's DMA mappings and eventfds and resetting
//! the function. The crate's VERSION handler panics on some malformed
//! messages (a missing NUL, a size smaller than the header): each `run` is
//! wrapped in `catch_unwind`, so such a client only loses its own connection
//! (counted in `DeviceStats::contained_panics`).
//!
//! # What the client may see fail
//!
//! REGION_READ/WRITE and DMA_UNMAP never answer with an error (the crate's
//! client would misread the shorter error reply): accesses outside a region
//! read all-ones and drop writes, as PCI does; an unmap of unknown or
//! partially covered ranges removes whatever it touches. DMA_MAP and SET_IRQS
//! refusals are sent as errors (EINVAL-style) and logged and counted here.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use tracing::{error, info, warn};
use vfio_bindings::bindings::vfio as b;
use vfio_user::{
    DmaMapFlags, DmaUnmapFlags, IrqInfo, Server, ServerBackend, ServerRegion, SparseArea,
};

use crate::bar::BAR0_SIZE;
use crate::config::CONFIG_SIZE;
use crate::device::{Device, Options};
use crate::error::EmuError;
use crate::firmware::{Accounting, Firmware, FirmwareHandle};
use crate::watch::{Backoff, DoorbellHandler, NoFirmware, Watcher};

/// Bind and listen on `path` such that the path appears only once it accepts connections:
/// bound and listening under a short temporary name in the same directory first, then
/// hard-linked to `path`. A client that waits for the file to appear (a test, a supervisor)
/// can connect at once; with a plain `bind` the file exists before `listen` and such a
/// connect is refused. An existing `path` is `AddrInUse`, as `bind` says.
pub(crate) fn listen_unix(path: &Path) -> io::Result<UnixListener> {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let tmp = path.with_file_name(format!(".{}.{n}", std::process::id()));
    let listener = match UnixListener::bind(&tmp) {
        Ok(l) => l,
        // The temporary name past the 107 bytes of sun_path: bind the path itself.
        Err(e) if e.kind() == io::ErrorKind::InvalidInput => return UnixListener::bind(path),
        Err(e) => return Err(e),
    };
    let placed = match std::fs::hard_link(&tmp, path) {
        Ok(()) => {
            let _ = std::fs::remove_file(&tmp);
            Ok(())
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!("{}: exists already", path.display()),
        )),
        // A filesystem without hard links: renamed (replacing what appeared at
        // `path` since the caller's check, as a second bind would not).
        Err(_) => std::fs::rename(&tmp, path),
    };
    if placed.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    placed.map(|()| listener)
}

/// Make `path` usable for a new listener: absent is fine; a socket nobody
/// listens on (left by a crashed emulator) is removed; a live socket or a
/// non-socket file is an error.
pub fn prepare_socket(path: &Path) -> Result<(), EmuError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(EmuError::Socket {
                op: "stat",
                path: path.to_path_buf(),
                source,
            });
        }
    };
    if !meta.file_type().is_socket() {
        return Err(EmuError::NotASocket {
            path: path.to_path_buf(),
        });
    }
    match UnixStream::connect(path) {
        Ok(_) => Err(EmuError::SocketInUse {
            path: path.to_path_buf(),
        }),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
            std::fs::remove_file(path).map_err(|source| EmuError::Socket {
                op: "remove stale socket",
                path: path.to_path_buf(),
                source,
            })?;
            info!(path = %path.display(), "removed a stale socket nobody listened on");
            Ok(())
        }
        Err(source) => Err(EmuError::Socket {
            op: "probe (connect to)",
            path: path.to_path_buf(),
            source,
        }),
    }
}

fn region(index: u32, flags: u32, size: u64) -> b::vfio_region_info {
    b::vfio_region_info {
        argsz: std::mem::size_of::<b::vfio_region_info>() as u32,
        flags,
        index,
        cap_offset: 0,
        size,
        offset: 0,
    }
}

/// The regions the client sees: BAR0 (all of it one sparse-mmap area, fd =
/// the BAR memfd) and config space; the other BARs, ROM and VGA are absent.
fn regions(dev: &Device) -> Vec<ServerRegion> {
    (0..b::VFIO_PCI_NUM_REGIONS)
        .map(|index| match index {
            b::VFIO_PCI_BAR0_REGION_INDEX => ServerRegion {
                region_info: region(
                    index,
                    b::VFIO_REGION_INFO_FLAG_READ
                        | b::VFIO_REGION_INFO_FLAG_WRITE
                        | b::VFIO_REGION_INFO_FLAG_MMAP,
                    BAR0_SIZE,
                ),
                sparse_areas: vec![SparseArea {
                    area: b::vfio_region_sparse_mmap_area {
                        offset: 0,
                        size: BAR0_SIZE,
                    },
                }],
                mmap_fd: Some(dev.bar().raw_fd()),
            },
            b::VFIO_PCI_CONFIG_REGION_INDEX => ServerRegion {
                region_info: region(
                    index,
                    b::VFIO_REGION_INFO_FLAG_READ | b::VFIO_REGION_INFO_FLAG_WRITE,
                    CONFIG_SIZE as u64,
                ),
                sparse_areas: Vec::new(),
                mmap_fd: None,
            },
            _ => ServerRegion {
                region_info: region(index, 0, 0),
                sparse_areas: Vec::new(),
                mmap_fd: None,
            },
        })
        .collect()
}

/// The interrupt indexes: only MSI-X has vectors.
fn irqs(dev: &Device) -> Vec<IrqInfo> {
    (0..b::VFIO_PCI_NUM_IRQS)
        .map(|index| IrqInfo {
            index,
            flags: if index == b::VFIO_PCI_MSIX_IRQ_INDEX {
                b::VFIO_IRQ_INFO_EVENTFD | b::VFIO_IRQ_INFO_NORESIZE
            } else {
                0
            },
            count: if index == b::VFIO_PCI_MSIX_IRQ_INDEX {
                dev.msix().count()
            } else {
                0
            },
        })
        .collect()
}

/// The `ServerBackend` of one emulator.
struct Backend {
    dev: Arc<Device>,
}

impl ServerBackend for Backend {
    fn region_read(&mut self, region: u32, offset: u64, data: &mut [u8]) -> io::Result<()> {
        match region {
            b::VFIO_PCI_CONFIG_REGION_INDEX => self.dev.config_read(offset, data),
            b::VFIO_PCI_BAR0_REGION_INDEX => self.dev.bar().read_bytes(offset, data),
            _ => data.fill(0xff),
        }
        Ok(())
    }

    fn region_write(&mut self, region: u32, offset: u64, data: &[u8]) -> io::Result<()> {
        match region {
            b::VFIO_PCI_CONFIG_REGION_INDEX => self.dev.config_write(offset, data),
            b::VFIO_PCI_BAR0_REGION_INDEX => self.dev.bar().write_bytes(offset, data),
            _ => warn!(
                region,
                offset,
                len = data.len(),
                "write to an absent region dropped"
            ),
        }
        Ok(())
    }

    fn dma_map(
        &mut self,
        flags: DmaMapFlags,
        offset: u64,
        address: u64,
        size: u64,
        fd: Option<File>,
    ) -> io::Result<()> {
        self.dev
            .dma()
            .map(
                address,
                size,
                fd,
                offset,
                flags.contains(DmaMapFlags::READ),
                flags.contains(DmaMapFlags::WRITE),
            )
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
    }

    fn dma_unmap(&mut self, flags: DmaUnmapFlags, address: u64, size: u64) -> io::Result<()> {
        if flags.contains(DmaUnmapFlags::UNMAP_ALL) {
            self.dev.dma().clear();
        } else {
            self.dev.dma().unmap(address, size);
        }
        Ok(())
    }

    fn reset(&mut self) -> io::Result<()> {
        self.dev.reset().map_err(io::Error::other)
    }

    fn set_irqs(
        &mut self,
        index: u32,
        flags: u32,
        start: u32,
        count: u32,
        fds: Vec<File>,
    ) -> io::Result<()> {
        self.dev
            .msix()
            .set_irqs(index, flags, start, count, fds)
            .inspect_err(|e| warn!(%e, "SET_IRQS refused"))
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
    }
}

/// A driver's connection that ended, as the serving thread reports it to the
/// hook of [`Emulator::on_disconnect`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Disconnect {
    /// Connections ended so far, this one included (1 for the first driver).
    pub connection: u64,
    /// What the driver left behind (pages, objects, DMA mappings), read
    /// before the reset that reclaimed it; `None` without the firmware.
    pub left: Option<Accounting>,
}

/// What the serving thread does after a [`Disconnect`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterDisconnect {
    /// Accept the next driver (the default without a hook).
    Serve,
    /// Stop serving: the serving thread ends (and removes the socket), so
    /// [`Emulator::wait`] returns.
    Stop,
}

/// The hook of [`Emulator::on_disconnect`].
type DisconnectHook = Box<dyn FnMut(&Disconnect) -> AfterDisconnect + Send>;

/// What the serving thread shares with the [`Emulator`].
#[derive(Default)]
struct Shared {
    firmware: OnceLock<FirmwareHandle>,
    on_disconnect: Mutex<Option<DisconnectHook>>,
    /// [`Emulator::keep_state_on_disconnect`].
    keep_state: AtomicBool,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("firmware", &self.firmware.get().is_some())
            .finish_non_exhaustive()
    }
}

/// A running emulated function: listening on its socket, serving one driver
/// at a time until [`Emulator::shutdown`] (or drop).
#[derive(Debug)]
pub struct Emulator {
    dev: Arc<Device>,
    socket: PathBuf,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    shared: Arc<Shared>,
}

fn spawn(
    what: &'static str,
    f: impl FnOnce() + Send + 'static,
) -> Result<JoinHandle<()>, EmuError> {
    thread::Builder::new()
        .name(format!("mlx5-emu-{what}"))
        .spawn(f)
        .map_err(|source| EmuError::Thread { what, source })
}

impl Emulator {
    /// Start an emulator running the strict firmware ([`Firmware`], configured by
    /// `options.firmware`) on `socket`; [`Emulator::firmware`] is its handle.
    pub fn start(socket: impl AsRef<Path>, options: Options) -> Result<Emulator, EmuError> {
        Emulator::start_firmware(socket, options, None)
    }

    /// [`Emulator::start`] with `hook` installed as [`Emulator::on_disconnect`]'s
    /// before the socket accepts its first driver, so no driver's end goes
    /// unreported (installing it after `start` can miss a driver that came
    /// and went at once).
    pub fn start_hooked(
        socket: impl AsRef<Path>,
        options: Options,
        hook: impl FnMut(&Disconnect) -> AfterDisconnect + Send + 'static,
    ) -> Result<Emulator, EmuError> {
        Emulator::start_firmware(socket, options, Some(Box::new(hook)))
    }

    fn start_firmware(
        socket: impl AsRef<Path>,
        options: Options,
        hook: Option<DisconnectHook>,
    ) -> Result<Emulator, EmuError> {
        let fw = Firmware::new(options.firmware);
        let handle = fw.handle();
        Emulator::start_inner(socket, options, Box::new(fw), |dev, shared| {
            // Attached and known before the first driver can connect.
            handle.attach(dev);
            let _ = shared.firmware.set(handle);
            *shared
                .on_disconnect
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = hook;
        })
    }

    /// Start an emulator without firmware: doorbells are only counted ([`NoFirmware`]).
    pub fn start_shell(socket: impl AsRef<Path>, options: Options) -> Result<Emulator, EmuError> {
        Emulator::start_with(socket, options, Box::new(NoFirmware))
    }

    /// The firmware's handle (faults, counters, accounting) when started with
    /// [`Emulator::start`]; `None` with a custom handler.
    pub fn firmware(&self) -> Option<&FirmwareHandle> {
        self.shared.firmware.get()
    }

    /// What the firmware and the device hold for the driver (pages, UARs, PDs, TDs, DMA
    /// mappings); `None` with a custom handler.
    pub fn accounting(&self) -> Option<Accounting> {
        self.shared.firmware.get().map(FirmwareHandle::accounting)
    }

    /// Call `hook` from the serving thread each time a driver's connection
    /// ends, after the function was reset for the next one, with what that
    /// driver left behind; its answer says whether to serve the next driver
    /// (a connection that [`Emulator::shutdown`] makes to wake the serving
    /// thread is not reported). Replaces an earlier hook.
    pub fn on_disconnect(&self, hook: impl FnMut(&Disconnect) -> AfterDisconnect + Send + 'static) {
        *self
            .shared
            .on_disconnect
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Box::new(hook));
    }

    /// When `keep` is true, a driver's end (a clean disconnect or its process dying) does
    /// not reset the function: as a real function whose owner died without a function-level
    /// reset, it stays as the driver left it — life-cycle phase, pages held, objects, BAR0
    /// (the command queue address included) — except what belonged to the dead process:
    /// its DMA mappings and MSI-X eventfds are dropped. The next driver then finds the
    /// function initialized and must reset it (FLR, counted in [`crate::DeviceStats::resets`]).
    /// Default false: the function is reset for the next driver. Read at each disconnect.
    pub fn keep_state_on_disconnect(&self, keep: bool) {
        self.shared.keep_state.store(keep, Ordering::Release);
    }

    /// Start an emulator whose doorbell events go to `handler`.
    pub fn start_with(
        socket: impl AsRef<Path>,
        options: Options,
        handler: Box<dyn DoorbellHandler>,
    ) -> Result<Emulator, EmuError> {
        Emulator::start_inner(socket, options, handler, |_, _| {})
    }

    /// Listen on `socket`, run `before_serving` on the new function and the
    /// serving thread's shared state, then start serving.
    fn start_inner(
        socket: impl AsRef<Path>,
        options: Options,
        handler: Box<dyn DoorbellHandler>,
        before_serving: impl FnOnce(&Arc<Device>, &Shared),
    ) -> Result<Emulator, EmuError> {
        let socket = socket.as_ref().to_path_buf();
        prepare_socket(&socket)?;
        let dev = Arc::new(Device::new(options, handler)?);
        let listener = listen_unix(&socket).map_err(|e| EmuError::Listen {
            path: socket.clone(),
            source: vfio_user::Error::SocketBind(e),
        })?;
        // The emulator removes the socket when it stops (`Drop`).
        let server = Server::from_owned_fd(listener.into(), true, irqs(&dev), regions(&dev));
        let stop = Arc::new(AtomicBool::new(false));
        let shared = Arc::new(Shared::default());
        before_serving(&dev, &shared);
        let mut threads = Vec::new();

        let (d, s, sh) = (dev.clone(), stop.clone(), shared.clone());
        threads.push(spawn("serve", move || serve(&server, &d, &s, &sh))?);
        let (d, s, fw) = (dev.clone(), stop.clone(), shared.firmware.get().cloned());
        threads.push(spawn("watch", move || watch(&d, &s, fw.as_ref()))?);
        let (d, s) = (dev.clone(), stop.clone());
        threads.push(spawn("health", move || health(&d, &s))?);
        info!(socket = %socket.display(), "rnic-mlx5-emu listening (ConnectX-5 15b3:1017)");
        Ok(Emulator {
            dev,
            socket,
            stop,
            threads,
            shared,
        })
    }

    /// The emulated function.
    pub fn device(&self) -> &Arc<Device> {
        &self.dev
    }

    /// The socket path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Serve until the serving thread ends: when a hook of
    /// [`Emulator::on_disconnect`] says [`AfterDisconnect::Stop`] (it does
    /// not end on its own otherwise).
    pub fn wait(mut self) {
        if let Some(t) = self.threads.drain(..1).next()
            && t.join().is_err()
        {
            error!("serving thread panicked outside the contained region");
        }
    }

    /// Stop serving, join the threads, remove the socket. A client still
    /// connected keeps the serving thread until it disconnects; shutdown
    /// gives up waiting for it after 2 s (and removes the socket itself).
    pub fn shutdown(mut self) {
        self.stop_threads();
    }

    fn stop_threads(&mut self) {
        if self.threads.is_empty() {
            return;
        }
        self.stop.store(true, Ordering::Release);
        // Wake the accept() of the serving thread.
        let _ = UnixStream::connect(&self.socket);
        let deadline = Instant::now() + Duration::from_secs(2);
        for t in self.threads.drain(..) {
            t.thread().unpark();
            while !t.is_finished() && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(1));
            }
            if t.is_finished() {
                let _ = t.join();
            } else {
                warn!(thread = ?t.thread().name(), "emulator thread still busy (a client is connected); detached");
            }
        }
        // The socket is ours to remove (the listener was handed to the server
        // as a descriptor, without its path).
        if std::fs::symlink_metadata(&self.socket).is_ok_and(|m| m.file_type().is_socket())
            && let Err(e) = std::fs::remove_file(&self.socket)
            && e.kind() != io::ErrorKind::NotFound
        {
            warn!(socket = %self.socket.display(), %e, "could not remove the socket");
        }
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        self.stop_threads();
    }
}

fn serve(server: &Server, dev: &Arc<Device>, stop: &AtomicBool, shared: &Shared) {
    let mut backend = Backend { dev: dev.clone() };
    while !stop.load(Ordering::Acquire) {
        match catch_unwind(AssertUnwindSafe(|| server.run(&mut backend))) {
            Ok(Ok(())) => info!("client disconnected"),
            Ok(Err(e)) => {
                warn!(%e, "vfio-user connection ended with an error");
                // Do not spin if accept itself keeps failing.
                thread::sleep(Duration::from_millis(10));
            }
            Err(_) => {
                dev.stats()
                    .contained_panics
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                error!(
                    "the vfio-user server code panicked on a malformed client message: dropped \
                     that connection, serving the next client"
                );
            }
        }
        let connection = dev.stats().connections.fetch_add(1, Ordering::Relaxed) + 1;
        let left = shared.firmware.get().map(FirmwareHandle::accounting);
        if shared.keep_state.load(Ordering::Acquire) {
            let maps = {
                let _q = dev.quiesced();
                dev.msix().clear();
                dev.dma().clear()
            };
            info!(
                dma_mappings = maps,
                "client disconnected: mappings and vectors dropped, function state kept \
                 (--keep-state-on-disconnect): the next driver must reset it"
            );
        } else if let Err(e) = dev.disconnect() {
            error!(%e, "reset after disconnect failed");
        }
        if stop.load(Ordering::Acquire) {
            break;
        }
        let mut hook = shared
            .on_disconnect
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(h) = hook.as_mut()
            && h(&Disconnect { connection, left }) == AfterDisconnect::Stop
        {
            info!(connection, "stopping after this driver, as asked");
            stop.store(true, Ordering::Release);
        }
    }
}

/// The watcher thread: BAR0 scans, then the firmware's work after each
/// ([`FirmwareHandle::after_scan`]: delayed command completions as their delays end,
/// BlueFlame bodies judged).
fn watch(dev: &Device, stop: &AtomicBool, fw: Option<&FirmwareHandle>) {
    let mut w = Watcher::default();
    let mut pace = Backoff::new();
    while !stop.load(Ordering::Acquire) {
        let events = {
            let _q = dev.quiesced();
            w.scan(dev) + fw.map_or(0, |f| f.after_scan(dev))
        };
        let sleep = pace.next(events);
        if sleep.is_zero() {
            std::hint::spin_loop();
        } else {
            thread::park_timeout(sleep);
        }
    }
}

fn health(dev: &Device, stop: &AtomicBool) {
    while !stop.load(Ordering::Acquire) {
        let next = dev.tick();
        thread::park_timeout(next.max(Duration::from_millis(1)));
    }
}
