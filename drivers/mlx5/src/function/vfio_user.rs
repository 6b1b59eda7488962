//! [`VfioUserFunction`]: a PCI function served by another process over a
//! vfio-user UNIX socket (rnic-mlx5-emu), through `vfio_user::Client`.
//!
//! # BAR0
//!
//! The server must offer all of BAR0 as sparse-mmap areas (rnic-mlx5-emu
//! does). The driver mmaps it once from the passed fd, so the init segment,
//! the command doorbell and every UAR page are plain shared memory behind the
//! same [`Mmio`] the kernel-VFIO transport uses, and a doorbell write costs
//! no message. A server offering only part of BAR0 is refused (with the
//! uncovered range named) rather than served by REGION_READ/WRITE messages:
//! an `Mmio` cannot turn a volatile store into a message, and two access
//! paths would make every register access transport-dependent.
//!
//! # Write-combining
//!
//! A vfio-user BAR is the server's memory, so how a store to it "arrives"
//! is the server's contract. rnic-mlx5-emu's: a **prefetchable** BAR0
//! (config space BAR0 bit 3) is a write-combining BAR whose BlueFlame
//! registers take combined copies (`--bar0 wc`); a non-prefetchable one is
//! uncached (`--bar0 uc`, the default, as kernel VFIO maps BARs), and a
//! BlueFlame copy is then served as a doorbell and counted
//! ([`VfioUserFunction::bar0_prefetchable`], [`crate::PciFunction::uar_wc`]).
//!
//! # What the `vfio_user` 0.1.7 client does not check
//!
//! - Its `resettable()` is inverted (true when `VFIO_DEVICE_FLAGS_RESET` is
//!   clear); this module uses its negation, and the crate is pinned to
//!   `=0.1.7` so a fixed release cannot silently flip it back.
//! - It ignores the error flag of replies: a `DMA_MAP` the server refused
//!   looks successful here. rnic-mlx5-emu counts and logs refusals, and any
//!   device access to that IOVA then faults (typed, counted) instead of
//!   touching memory. Its other handlers (REGION_READ/WRITE, DMA_UNMAP) never
//!   send error replies, whose shorter size this client would misread.

use std::any::Any;
use std::os::fd::{AsFd, AsRawFd};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rnic_core::Iova;
use rnic_dma::iova::X86_MSI_WINDOW;
use rnic_dma::{DmaDomain, IovaAllocator, Mapper, Mmio};
use tracing::{info, warn};
use vfio_bindings::bindings::vfio as b;
use vfio_user::Client;

use crate::error::Mlx5Error;
use crate::function::memory::{
    DmaBuffer, IovaSpace, lock, lookup_fd, not_file_backed, split_apertures,
};
use crate::{
    BlockWindow, FunctionId, PCI_BAR_PREFETCHABLE, PCI_BAR0, PCI_DEVICE_ID, PCI_VENDOR_ID,
    PciFunction, Vector, sys,
};

/// The IOVA aperture a vfio-user function offers (there is no IOMMU; the
/// server resolves IOVAs through its table of DMA_MAPs). Low 1 MiB and the
/// x86 MSI window are left out, as on real hardware.
const APERTURE: std::ops::RangeInclusive<u64> = 0x10_0000..=(1 << 48) - 1;
/// Most fds one vfio-user message may carry.
const MAX_FDS: usize = 16;

struct Shared {
    client: Mutex<Client>,
    path: PathBuf,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl Shared {
    fn protocol(&self, op: &'static str, source: vfio_user::Error) -> Mlx5Error {
        Mlx5Error::Protocol {
            op,
            path: self.path.clone(),
            source,
        }
    }
}

/// rnic-dma's [`Mapper`] over a vfio-user connection: `map` sends `DMA_MAP`
/// with the memfd behind the host range (see [`crate::function::memory`]), `unmap`
/// sends `DMA_UNMAP`.
#[derive(Clone, Debug)]
pub struct VfioUserMapper(Arc<Shared>);

// SAFETY: `unmap` returns Ok only after the server replied to DMA_UNMAP.
// rnic-mlx5-emu removes the mapping and waits for in-flight accesses to it
// before replying, so after Ok the device neither accesses nor can start to
// access the range. The host pages are memfd pages of one `SharedMemory`,
// which this process never reuses for anything else after unmapping them.
unsafe impl Mapper for VfioUserMapper {
    unsafe fn map(&self, iova: Iova, host: NonNull<u8>, len: u64) -> std::io::Result<()> {
        let (fd, offset) = lookup_fd(host, len).ok_or_else(|| not_file_backed(host, len))?;
        lock(&self.0.client)
            .dma_map(offset, iova.0, len, fd.as_raw_fd())
            .map_err(std::io::Error::other)
    }

    fn unmap(&self, iova: Iova, len: u64) -> std::io::Result<()> {
        lock(&self.0.client)
            .dma_unmap(iova.0, len)
            .map_err(std::io::Error::other)
    }
}

/// The owner of the client's BAR0 mapping behind its [`Mmio`].
#[derive(Debug)]
struct BarMap {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: BarMap only owns the mapping; munmap from any thread is fine.
unsafe impl Send for BarMap {}
// SAFETY: `&BarMap` exposes nothing.
unsafe impl Sync for BarMap {}

impl Drop for BarMap {
    fn drop(&mut self) {
        // SAFETY: exactly the mapping made in `map_bar0`; the last Mmio
        // holding this owner is gone.
        if let Err(e) = unsafe { sys::unmap(self.ptr, self.len) } {
            warn!(len = self.len, %e, "munmap of the vfio-user BAR0 failed");
        }
    }
}

/// A function reached over vfio-user; see the module docs.
#[derive(Debug)]
pub struct VfioUserFunction {
    name: String,
    id: FunctionId,
    bar0: Mmio,
    bar0_blocks: Option<BlockWindow>,
    bar0_prefetchable: bool,
    config_size: u64,
    msix_count: u32,
    reset_supported: bool,
    space: Arc<IovaSpace>,
    domain: Arc<DmaDomain>,
    shared: Arc<Shared>,
}

/// Whether `areas` cover `[0, size)` without a gap; the first gap if not.
fn first_gap(areas: &[b::vfio_region_sparse_mmap_area], size: u64) -> Option<(u64, u64)> {
    let mut sorted: Vec<_> = areas.iter().map(|a| (a.offset, a.size)).collect();
    sorted.sort_unstable();
    let mut covered = 0u64;
    for (off, len) in sorted {
        if off > covered {
            return Some((covered, off));
        }
        covered = covered.max(off.saturating_add(len));
    }
    (covered < size).then_some((covered, size))
}

impl VfioUserFunction {
    /// Connect to the vfio-user server at `path`, negotiate, read the device
    /// and region info, mmap BAR0 and read the IDs.
    pub fn connect(path: impl AsRef<Path>) -> Result<VfioUserFunction, Mlx5Error> {
        let path = path.as_ref().to_path_buf();
        let _span = tracing::info_span!("vfio_user_connect", path = %path.display()).entered();
        let name = format!("vfio-user:{}", path.display());
        let mut client = connect_within(&path, CONNECT_TIMEOUT)?;
        let region_err = |index, reason: String| Mlx5Error::Region {
            function: name.clone(),
            index,
            reason,
        };
        let (bar0, bar0_blocks) =
            map_bar0(&client).map_err(|r| region_err(b::VFIO_PCI_BAR0_REGION_INDEX, r))?;
        let config_size = client
            .region(b::VFIO_PCI_CONFIG_REGION_INDEX)
            .map(|r| r.size)
            .filter(|&s| s >= 64)
            .ok_or_else(|| {
                region_err(
                    b::VFIO_PCI_CONFIG_REGION_INDEX,
                    "no PCI config region (is this a PCI device server?)".into(),
                )
            })?;
        // The crate computes `resettable` inverted: true when the flag is clear.
        let reset_supported = !client.resettable();
        let msix_count = client
            .get_irq_info(b::VFIO_PCI_MSIX_IRQ_INDEX)
            .map_err(|source| Mlx5Error::Protocol {
                op: "GET_IRQ_INFO (MSI-X)",
                path: path.clone(),
                source,
            })?
            .count;
        let shared = Arc::new(Shared {
            client: Mutex::new(client),
            path,
        });
        let mapper = VfioUserMapper(shared.clone());
        let (low, high) = split_apertures(&[APERTURE]);
        let reserved = [X86_MSI_WINDOW];
        let space = IovaSpace::new(
            name.clone(),
            Arc::new(mapper.clone()) as Arc<dyn Mapper>,
            IovaAllocator::with_reserved(&low, &reserved),
        );
        let domain = DmaDomain::new(mapper, IovaAllocator::with_reserved(&high, &reserved));
        let mut f = VfioUserFunction {
            name,
            id: FunctionId {
                vendor: 0,
                device: 0,
            },
            bar0,
            bar0_blocks,
            bar0_prefetchable: false,
            config_size,
            msix_count,
            reset_supported,
            space,
            domain,
            shared,
        };
        f.id = FunctionId {
            vendor: f.config_read16(PCI_VENDOR_ID)?,
            device: f.config_read16(PCI_DEVICE_ID)?,
        };
        f.bar0_prefetchable = f.config_read32(PCI_BAR0)? & PCI_BAR_PREFETCHABLE != 0;
        info!(function = %f.name, vendor = f.id.vendor, device = f.id.device, msix = msix_count,
              reset = reset_supported, "connected");
        Ok(f)
    }

    /// Whether the server offers BAR0 prefetchable, which is its promise of
    /// a write-combining BAR (module docs).
    pub fn bar0_prefetchable(&self) -> bool {
        self.bar0_prefetchable
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    /// Whether the server offers a reset (`VFIO_DEVICE_FLAGS_RESET`).
    pub fn reset_supported(&self) -> bool {
        self.reset_supported
    }

    /// The mapper of this connection (for `DmaDomain::new` with an allocator
    /// of your own).
    pub fn mapper(&self) -> VfioUserMapper {
        VfioUserMapper(self.shared.clone())
    }

    fn check_config(&self, offset: u16, len: usize) -> Result<(), Mlx5Error> {
        if u64::from(offset) + len as u64 > self.config_size {
            return Err(Mlx5Error::ConfigRange {
                function: self.name.clone(),
                offset,
                len,
                size: self.config_size,
            });
        }
        Ok(())
    }

    fn set_irqs(&self, flags: u32, start: u32, count: u32, fds: &[i32]) -> Result<(), Mlx5Error> {
        lock(&self.shared.client)
            .set_irqs(b::VFIO_PCI_MSIX_IRQ_INDEX, flags, start, count, fds)
            .map_err(|e| self.shared.protocol("SET_IRQS (MSI-X)", e))
    }
}

/// How long the vfio-user handshake may take: a server serves one driver at
/// a time and leaves the next waiting in its accept queue.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// `Client::new` (connect and negotiate), given up after `timeout` with
/// [`Mlx5Error::ServerBusy`]: the `vfio_user` client has no timeout of its
/// own, so the handshake runs on a helper thread, which is left to finish
/// (and drop its late connection) on its own.
fn connect_within(path: &Path, timeout: Duration) -> Result<Client, Mlx5Error> {
    let (tx, rx) = std::sync::mpsc::channel();
    let p = path.to_path_buf();
    std::thread::Builder::new()
        .name("vfio-user-connect".into())
        .spawn(move || {
            let _ = tx.send(Client::new(&p));
        })
        .map_err(|source| Mlx5Error::Io {
            what: "starting the vfio-user connect thread",
            source,
        })?;
    match rx.recv_timeout(timeout) {
        Ok(r) => r.map_err(|source| Mlx5Error::Connect {
            path: path.to_path_buf(),
            source,
        }),
        Err(_) => Err(Mlx5Error::ServerBusy {
            path: path.to_path_buf(),
            after: timeout,
        }),
    }
}

/// mmap all of BAR0 from the fd the server passed; the reason on failure.
fn map_bar0(client: &Client) -> Result<(Mmio, Option<BlockWindow>), String> {
    let r = client
        .region(b::VFIO_PCI_BAR0_REGION_INDEX)
        .ok_or("the server offers no BAR0")?;
    if r.size == 0 {
        return Err("BAR0 has size 0".into());
    }
    if r.flags & b::VFIO_REGION_INFO_FLAG_MMAP == 0 {
        return Err(
            "BAR0 is not mmappable (VFIO_REGION_INFO_FLAG_MMAP clear); the driver needs \
                    all of BAR0 offered as sparse-mmap areas"
                .into(),
        );
    }
    let fo = r.file_offset.as_ref().ok_or(
        "the server passed no fd for BAR0 (it must declare sparse-mmap areas to pass one)",
    )?;
    if let Some((from, to)) = first_gap(&r.sparse_areas, r.size) {
        return Err(format!(
            "sparse-mmap areas leave BAR0 {from:#x}..{to:#x} unmapped; the driver needs all of \
             BAR0 mmappable"
        ));
    }
    let len = usize::try_from(r.size).map_err(|_| "BAR0 larger than the address space")?;
    let fd = fo.file().as_fd();
    match nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GET_SEALS) {
        Ok(s) if s & libc::F_SEAL_SHRINK != 0 => {}
        _ => warn!(
            "BAR0's fd is not sealed against shrinking: if the server truncates it, BAR \
                    accesses fault with SIGBUS"
        ),
    }
    let ptr = sys::mmap_shared(fd, fo.start(), len, false)
        .map_err(|e| format!("mmap of BAR0 ({len} bytes) failed: {e}"))?;
    let owner: Arc<dyn Any + Send + Sync> = Arc::new(BarMap { ptr, len });
    // SAFETY: `ptr` is a fresh MAP_SHARED mapping of `len` bytes, unmapped
    // only when `owner` drops; nothing creates references into it. It is
    // RAM shared with the device process, which accesses it with aligned
    // atomics; the driver's aligned 4/8-byte volatile accesses are single
    // loads/stores on the supported targets, which is the same contract a
    // real BAR gives (Mmio's RAM caveat concerns racing threads of this
    // process, which the driver's one-owner-per-register discipline rules out).
    let bar0 = unsafe { Mmio::new(ptr, len, owner.clone()) };
    // SAFETY: the same mapping and owner as the Mmio above, under the same
    // contract (BlockWindow::new's is Mmio::new's); mmap returns page-aligned
    // addresses, so the 64-alignment check passes.
    let blocks = unsafe { BlockWindow::new(ptr, len, owner) };
    Ok((bar0, blocks))
}

impl PciFunction for VfioUserFunction {
    fn name(&self) -> &str {
        &self.name
    }

    fn id(&self) -> FunctionId {
        self.id
    }

    fn bar0(&self) -> &Mmio {
        &self.bar0
    }

    fn uar_wc(&self, index: u32) -> Result<BlockWindow, String> {
        if !self.bar0_prefetchable {
            return Err(
                "the vfio-user server offers BAR0 non-prefetchable: an uncached BAR, as kernel \
                 VFIO maps one (start rnic-mlx5-emu with --bar0 wc for a write-combining one)"
                    .into(),
            );
        }
        let blocks = self
            .bar0_blocks
            .as_ref()
            .ok_or("BAR0's mapping is not 64-byte aligned")?;
        let at = index as usize * crate::UAR_PAGE_SIZE;
        blocks
            .window(at, crate::UAR_PAGE_SIZE)
            .ok_or_else(|| format!("UAR page {index} lies outside BAR0"))
    }

    /// rnic-mlx5-emu carries RoCE over the host's UDP sockets: the host
    /// kernel routes and resolves every frame its port sends.
    fn host_neighbours(&self) -> bool {
        true
    }

    fn config_read(&self, offset: u16, buf: &mut [u8]) -> Result<(), Mlx5Error> {
        self.check_config(offset, buf.len())?;
        lock(&self.shared.client)
            .region_read(b::VFIO_PCI_CONFIG_REGION_INDEX, u64::from(offset), buf)
            .map_err(|e| Mlx5Error::Config {
                function: self.name.clone(),
                op: "read",
                offset,
                len: buf.len(),
                source: std::io::Error::other(e),
            })
    }

    fn config_write(&self, offset: u16, buf: &[u8]) -> Result<(), Mlx5Error> {
        self.check_config(offset, buf.len())?;
        lock(&self.shared.client)
            .region_write(b::VFIO_PCI_CONFIG_REGION_INDEX, u64::from(offset), buf)
            .map_err(|e| Mlx5Error::Config {
                function: self.name.clone(),
                op: "write",
                offset,
                len: buf.len(),
                source: std::io::Error::other(e),
            })
    }

    fn alloc_dma(&self, len: usize) -> Result<Arc<DmaBuffer>, Mlx5Error> {
        self.space.alloc(len)
    }

    fn map_user(
        &self,
        addr: usize,
        len: usize,
        writable: bool,
    ) -> Result<crate::UserPages, Mlx5Error> {
        self.space
            .map_user(addr, len, writable, crate::function::Sharing::Memfd)
    }

    fn dma_domain(&self) -> Arc<DmaDomain> {
        self.domain.clone()
    }

    fn msix_count(&self) -> Result<u32, Mlx5Error> {
        Ok(self.msix_count)
    }

    fn enable_msix(&self, count: u32) -> Result<Vec<Vector>, Mlx5Error> {
        if count == 0 || count > self.msix_count {
            return Err(Mlx5Error::Vectors {
                function: self.name.clone(),
                wanted: count,
                count: self.msix_count,
            });
        }
        let vectors = (0..count)
            .map(|vector| {
                sys::eventfd()
                    .map(|fd| Vector { fd, vector })
                    .map_err(|source| Mlx5Error::Eventfd { vector, source })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let flags = b::VFIO_IRQ_SET_DATA_EVENTFD | b::VFIO_IRQ_SET_ACTION_TRIGGER;
        for (chunk_no, chunk) in vectors.chunks(MAX_FDS).enumerate() {
            let raw: Vec<i32> = chunk.iter().map(|v| v.fd.as_raw_fd()).collect();
            let start = (chunk_no * MAX_FDS) as u32;
            self.set_irqs(flags, start, raw.len() as u32, &raw)?;
        }
        Ok(vectors)
    }

    fn disable_msix(&self) -> Result<(), Mlx5Error> {
        self.set_irqs(
            b::VFIO_IRQ_SET_DATA_NONE | b::VFIO_IRQ_SET_ACTION_TRIGGER,
            0,
            0,
            &[],
        )
    }

    fn reset(&self) -> Result<(), Mlx5Error> {
        if !self.reset_supported {
            return Err(Mlx5Error::ResetUnsupported {
                function: self.name.clone(),
            });
        }
        lock(&self.shared.client)
            .reset()
            .map_err(|e| self.shared.protocol("DEVICE_RESET", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn area(offset: u64, size: u64) -> b::vfio_region_sparse_mmap_area {
        b::vfio_region_sparse_mmap_area { offset, size }
    }

    #[test]
    fn sparse_areas_must_cover_the_bar() {
        assert_eq!(first_gap(&[area(0, 0x1000)], 0x1000), None);
        assert_eq!(
            first_gap(&[area(0x1000, 0x1000), area(0, 0x1000)], 0x2000),
            None
        );
        assert_eq!(
            first_gap(&[area(0, 0x1000)], 0x2000),
            Some((0x1000, 0x2000))
        );
        assert_eq!(
            first_gap(&[area(0x1000, 0x1000)], 0x2000),
            Some((0, 0x1000))
        );
        assert_eq!(first_gap(&[], 0x2000), Some((0, 0x2000)));
    }

    #[test]
    fn connect_to_nothing_says_how_to_start_the_emulator() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("absent.sock");
        let err = VfioUserFunction::connect(&path).unwrap_err();
        assert!(matches!(err, Mlx5Error::Connect { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(msg.contains("rnic-mlx5-emu --socket"), "{msg}");
        assert!(msg.contains("absent.sock"), "{msg}");
    }
}
