//! Firmware pages (mlx5.md §3 steps 7 and 12, §5.2, §11 PAGE_REQUEST): what
//! the driver gave, giving and taking back with MANAGE_PAGES, telling the
//! firmware it cannot give (CANT_GIVE), and the teardown reclaim.
//!
//! [`Pages`] is shared (`Arc`) by the [`crate::Hca`] — bring-up gives the boot
//! and init pages, teardown takes them all back — and by the page worker of
//! the event queue ([`crate::firmware::events`]), which answers run-time page
//! requests on the command queue's reserved page slot while a regular
//! command may be waiting for exactly those pages (audit row 1: K
//! core/pagealloc.c:700-776 serves them from a work queue fed by the EQ; RC
//! mlx5_vfio.c:1579-1642 from the wait loop).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rnic_mlx5_prm::{CmdOpcode, ManagePagesIn, ManagePagesOut, manage_pages_op_mod};
use tracing::{info, warn};

use crate::firmware::cmd::CmdQueue;
use crate::function::budget::BASE_PIN_BYTES;
use crate::function::memory::lock;
use crate::{DmaBuffer, Mlx5Error, PciFunction};

/// Bytes of a firmware page (MANAGE_PAGES gives 4 KiB pages, §5.2).
pub const FW_PAGE_BYTES: usize = 4096;
/// Pages per MANAGE_PAGES command (and per DMA buffer backing them): 512
/// entries = 4 KiB of `pas[]`, 9 mailbox blocks.
pub const PAGES_PER_COMMAND: usize = 512;
/// The most pages the driver gives on one request: 2^20 (4 GiB). A larger
/// request is answered with CANT_GIVE and refused as a broken device.
pub const MAX_PAGES_PER_REQUEST: i64 = 1 << 20;
/// How long teardown keeps asking for pages while the firmware returns none
/// (K `RECLAIM_PAGES` timeout, lib/tout.c: 5 s; restarted whenever pages
/// come back, K core/pagealloc.c:815-845; audit row 10).
pub const RECLAIM_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause between two reclaim rounds that returned nothing.
const RECLAIM_RETRY: Duration = Duration::from_millis(10);

/// Pages given to the firmware (§3 steps 7 and 12).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PageCounts {
    /// Boot pages given (QUERY_PAGES op_mod 1).
    pub boot: u64,
    /// Init pages given (QUERY_PAGES op_mod 2).
    pub init: u64,
    /// Pages the firmware holds now.
    pub held: u64,
}

/// One DMA buffer of firmware pages and how many of them the firmware holds.
#[derive(Debug)]
struct Chunk {
    buf: Option<Arc<DmaBuffer>>,
    held: usize,
}

/// The pages given to the firmware, by page IOVA.
#[derive(Debug, Default)]
pub(crate) struct PagePool {
    chunks: Vec<Chunk>,
    held: BTreeMap<u64, usize>,
    pub(crate) counts: PageCounts,
}

impl PagePool {
    pub(crate) fn held(&self) -> usize {
        self.held.len()
    }

    /// The firmware returned `page`; free its chunk once all are back.
    /// `false` for an address the driver never gave (or already took).
    pub(crate) fn returned(&mut self, page: u64) -> bool {
        let Some(chunk) = self.held.remove(&page) else {
            return false;
        };
        if let Some(c) = self.chunks.get_mut(chunk) {
            c.held = c.held.saturating_sub(1);
            if c.held == 0 {
                // Unmapped from the device, then freed (DmaBuffer::drop).
                c.buf = None;
            }
        }
        true
    }

    fn record(&mut self, buf: Arc<DmaBuffer>, n: usize) {
        let base = buf.iova().get();
        let chunk = self.chunks.len();
        self.chunks.push(Chunk {
            buf: Some(buf),
            held: n,
        });
        for i in 0..n {
            self.held.insert(base + (i * FW_PAGE_BYTES) as u64, chunk);
        }
    }

    /// Forget every page (after a reset, or when teardown unmaps what the
    /// firmware did not return): the buffers drop, unmapped from the device
    /// first.
    pub(crate) fn clear(&mut self) {
        self.chunks.clear();
        self.held.clear();
    }
}

/// What one MANAGE_PAGES take gave back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Taken {
    /// Pages the driver had given and got back.
    pub pages: usize,
    /// Entries the firmware returned (including addresses never given).
    pub entries: usize,
}

/// The firmware pages of one function; see the module docs.
pub(crate) struct Pages {
    function: Arc<dyn PciFunction>,
    cmdq: Arc<CmdQueue>,
    function_id: AtomicU16,
    pub(crate) pool: Mutex<PagePool>,
}

impl fmt::Debug for Pages {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pages")
            .field("function", &self.function.name())
            .field("held", &lock(&self.pool).held())
            .finish_non_exhaustive()
    }
}

fn prm(what: &'static str) -> impl Fn(rnic_mlx5_prm::Error) -> Mlx5Error {
    move |source| Mlx5Error::Prm { what, source }
}

impl Pages {
    pub(crate) fn new(function: Arc<dyn PciFunction>, cmdq: Arc<CmdQueue>) -> Pages {
        Pages {
            function,
            cmdq,
            function_id: AtomicU16::new(0),
            pool: Mutex::default(),
        }
    }

    /// The `function_id` QUERY_PAGES reported (every MANAGE_PAGES names it).
    pub(crate) fn set_function_id(&self, id: u16) {
        self.function_id.store(id, Ordering::Relaxed);
    }

    pub(crate) fn held(&self) -> usize {
        lock(&self.pool).held()
    }

    /// A MANAGE_PAGES input naming this function and `entries` (op_mod is
    /// the queue's to set).
    fn command(&self, entries: usize) -> Result<Vec<u8>, Mlx5Error> {
        let mut cmd = vec![0u8; ManagePagesIn::<&[u8]>::SIZE_BYTES];
        let mut v = ManagePagesIn::new_checked(&mut cmd[..]).map_err(prm("MANAGE_PAGES"))?;
        v.set_function_id(self.function_id.load(Ordering::Relaxed).into())
            .map_err(prm("MANAGE_PAGES"))?;
        v.set_input_num_entries(entries as u32)
            .map_err(prm("MANAGE_PAGES"))?;
        Ok(cmd)
    }

    /// Whether `count` more pages fit the transport's pinning budget (audit
    /// row 23), checked before any is allocated.
    pub(crate) fn check_budget(&self, count: usize) -> Result<(), Mlx5Error> {
        let (held, chunks) = {
            let pool = lock(&self.pool);
            (pool.held() as u64, pool.chunks.len() as u64)
        };
        self.function.dma_budget().check(
            self.function.name(),
            BASE_PIN_BYTES + held * FW_PAGE_BYTES as u64,
            (count * FW_PAGE_BYTES) as u64,
            chunks + 16,
            count.div_ceil(PAGES_PER_COMMAND) as u64,
        )
    }

    /// Give `count` 4 KiB pages, in DMA buffers of up to
    /// [`PAGES_PER_COMMAND`] pages, one MANAGE_PAGES per buffer. For a
    /// run-time request (`notify_fail`), a failure — memory that cannot be
    /// had, the budget, or the firmware refusing the give — is also told to
    /// the firmware (CANT_GIVE, K core/pagealloc.c:339-356, 389), so a
    /// command it holds for these pages fails instead of waiting for its
    /// timeout (audit row 1).
    pub(crate) fn give(&self, count: usize, notify_fail: bool) -> Result<(), Mlx5Error> {
        let r = self.give_all(count);
        if let Err(e) = &r {
            warn!(pages = count, %e, notify_fail, "firmware pages could not be given");
            if notify_fail && !matches!(e, Mlx5Error::CommandTimeout { .. }) {
                self.cant_give();
            }
        }
        r
    }

    fn give_all(&self, count: usize) -> Result<(), Mlx5Error> {
        self.check_budget(count)?;
        let mut left = count;
        while left > 0 {
            let n = left.min(PAGES_PER_COMMAND);
            let buf = self.function.alloc_dma(n * FW_PAGE_BYTES)?;
            let base = buf.iova().get();
            let mut cmd = self.command(n)?;
            cmd.resize(ManagePagesIn::<&[u8]>::SIZE_BYTES + 8 * n, 0);
            let mut v = ManagePagesIn::new_checked(&mut cmd[..]).map_err(prm("MANAGE_PAGES"))?;
            for i in 0..n {
                v.set_pas(i, base + (i * FW_PAGE_BYTES) as u64)
                    .map_err(prm("MANAGE_PAGES pas"))?;
            }
            let result = self.cmdq.exec(
                CmdOpcode::ManagePages,
                manage_pages_op_mod::GIVE as u16,
                &cmd,
                ManagePagesOut::<&[u8]>::SIZE_BYTES,
            );
            let mut pool = lock(&self.pool);
            match result {
                Ok(_) => {}
                // Not delivered or refused: the firmware holds none of them
                // and the buffer is freed. A timeout leaves them possibly
                // held: keep them as given (freed at teardown, after
                // DISABLE_HCA and the device unmap).
                Err(e @ Mlx5Error::CommandTimeout { .. }) => {
                    pool.record(buf, n);
                    return Err(e);
                }
                Err(e) => return Err(e),
            }
            pool.record(buf, n);
            left -= n;
        }
        Ok(())
    }

    /// MANAGE_PAGES op_mod 0 (CANT_GIVE): the driver cannot give what the
    /// firmware asked for. A failure is logged (the caller reports the
    /// reason the pages could not be had).
    pub(crate) fn cant_give(&self) {
        let result = self.command(0).and_then(|cmd| {
            self.cmdq.exec(
                CmdOpcode::ManagePages,
                manage_pages_op_mod::ALLOC_FAIL as u16,
                &cmd,
                ManagePagesOut::<&[u8]>::SIZE_BYTES,
            )
        });
        match result {
            Ok(_) => info!("MANAGE_PAGES CANT_GIVE sent"),
            Err(e) => warn!(%e, "MANAGE_PAGES CANT_GIVE failed"),
        }
    }

    /// One MANAGE_PAGES take of up to `want` (≤ [`PAGES_PER_COMMAND`]) pages.
    fn take_once(&self, want: usize) -> Result<Taken, Mlx5Error> {
        let cmd = self.command(want)?;
        let out_len = ManagePagesOut::<&[u8]>::SIZE_BYTES + 8 * want;
        let out = self.cmdq.exec(
            CmdOpcode::ManagePages,
            manage_pages_op_mod::TAKE as u16,
            &cmd,
            out_len,
        )?;
        let view = ManagePagesOut::new_checked(&out[..]).map_err(prm("MANAGE_PAGES"))?;
        let got = view.output_num_entries() as usize;
        if got > want {
            return Err(Mlx5Error::Reply {
                opcode: CmdOpcode::ManagePages,
                what: "output_num_entries (more pages than asked for)".into(),
                posted: want as u64,
                found: got as u64,
            });
        }
        let mut pool = lock(&self.pool);
        let mut pages = 0;
        for i in 0..got {
            let page = view.pas(i).unwrap_or(0);
            if pool.returned(page) {
                pages += 1;
            } else {
                warn!(
                    page = format_args!("{page:#x}"),
                    "firmware returned a page the driver did not give; ignored"
                );
            }
        }
        Ok(Taken {
            pages,
            entries: got,
        })
    }

    /// Take back up to `limit` pages (a negative PAGE_REQUEST); stops early
    /// when the firmware returns none. The number taken back.
    pub(crate) fn take(&self, limit: usize) -> Result<usize, Mlx5Error> {
        let mut taken = 0;
        loop {
            let want = self.held().min(PAGES_PER_COMMAND).min(limit - taken);
            if want == 0 {
                return Ok(taken);
            }
            let t = self.take_once(want)?;
            taken += t.pages;
            if t.entries == 0 {
                return Ok(taken);
            }
        }
    }

    /// Take back every page (teardown, §3.2). A round that returns nothing
    /// is retried until `timeout` passes without a page coming back (the
    /// timer restarts whenever pages do, K core/pagealloc.c:815-845); then
    /// the rest stays with the firmware until DISABLE_HCA, and
    /// [`Mlx5Error::Pages`] says how many.
    pub(crate) fn reclaim_all(&self, timeout: Duration) -> Result<usize, Mlx5Error> {
        let mut taken = 0;
        let mut since = Instant::now();
        let mut empty_rounds = 0u32;
        loop {
            let want = self.held().min(PAGES_PER_COMMAND);
            if want == 0 {
                if empty_rounds > 0 {
                    info!(
                        empty_rounds,
                        "the firmware returned every page after empty rounds"
                    );
                }
                return Ok(taken);
            }
            let t = self.take_once(want)?;
            taken += t.pages;
            if t.entries > 0 {
                since = Instant::now();
                continue;
            }
            empty_rounds += 1;
            if since.elapsed() >= timeout {
                let held = self.held();
                return Err(Mlx5Error::Pages {
                    function: self.function.name().into(),
                    reason: format!(
                        "MANAGE_PAGES take returned no pages for {timeout:?} ({empty_rounds} \
                         rounds) while the firmware holds {held}; they stay mapped until \
                         DISABLE_HCA and are then unmapped"
                    ),
                });
            }
            std::thread::sleep(RECLAIM_RETRY);
        }
    }

    /// Boot, init and held pages.
    pub(crate) fn counts(&self) -> PageCounts {
        let pool = lock(&self.pool);
        PageCounts {
            held: pool.held() as u64,
            ..pool.counts
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_pool_frees_a_chunk_when_all_its_pages_are_back() {
        let mut pool = PagePool::default();
        pool.chunks.push(Chunk { buf: None, held: 2 });
        pool.held.insert(0x1000, 0);
        pool.held.insert(0x2000, 0);
        assert!(pool.returned(0x1000));
        assert!(!pool.returned(0x1000), "twice");
        assert!(!pool.returned(0x9000), "never given");
        assert_eq!(pool.held(), 1);
        assert!(pool.returned(0x2000));
        assert_eq!(pool.chunks[0].held, 0);
    }
}
