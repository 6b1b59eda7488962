//! The emulated ConnectX function (rnic-mlx5-emu's `Device` and `Firmware`) in process,
//! driven by a hostile driver: the memory it DMAs to is one sealed memfd of which only the
//! first [`MAPPED`] bytes are mapped (the rest is a canary no device access may reach), the
//! doorbells go through the emulator's own watcher scan (the path the watcher thread takes),
//! and a compact command client writes entries and mailbox chains with the rnic-mlx5-prm
//! views (independent of the driver's command code, like the emulator tests' client).
//!
//! - [`firmware`]: the command interface under hostile entries, chains and inputs.
//! - [`wqe`]: an RC QP in RTS under hostile send WQEs (on a rig of its own that keeps the
//!   function, GID, UAR, PD and MKeys across inputs; see its `send_queue`).
//! - [`cqe`]: the other direction — the driver's (rnic-mlx5's) CQ and EQ consumers under
//!   hostile CQEs and EQEs, over plain DMA buffers (no emulator).
//!
//! One rig serves every input a thread runs ([`with_rig`]): before each input it is put back
//! to the state a fresh one has ([`Rig::reset`]: a function-level reset of the emulated
//! function, the memfd's mapped bytes punched back to holes, the canary checked, and the
//! emulator's accounting, pages and DMA mappings asserted equal to a fresh rig's), so an
//! input does the same thing whether it runs first or after a million others (see the
//! reproducibility test in `tests.rs`) and a leak across inputs is itself a failure. The
//! device's writes are found by reading back only the memfd's allocated extents
//! (`SEEK_DATA`/`SEEK_HOLE`: a hole reads as zero and only a write allocates), so a check
//! after a command costs the pages the input touched, not the whole mapping; allocated
//! pages found all zero (the firmware's pages, which MANAGE_PAGES reads and writes back
//! whole) are punched back to holes.

pub mod cqe;
pub mod firmware;
pub mod wqe;

use std::cell::RefCell;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::{FallocateFlags, FcntlArg, SealFlag, fallocate, fcntl};
use nix::sys::memfd::{MFdFlags, memfd_create};
use nix::unistd::{Whence, lseek};
use rnic_mlx5_emu::watch::Watcher;
use rnic_mlx5_emu::{
    Accounting, Device, Firmware, FirmwareHandle, FirmwareOptions, Options, Strictness,
};
use rnic_mlx5_prm::{
    CMD_INLINE_BYTES, CMD_TYPE_PCIE, CmdIfBox, CmdOpcode, CmdQueueEntry, MAILBOX_ALIGN,
    MAILBOX_DATA_BYTES, ManagePagesIn, MboxIn, MboxOut, SetIssiIn, cmd_if_box, init_seg_offset,
    initial_seg, manage_pages_op_mod, query_pages_op_mod,
};

/// The IOVA the memfd's first byte is mapped at.
pub const BASE: u64 = 0x10_0000_0000;
/// Bytes of the memfd mapped for DMA.
pub const MAPPED: u64 = 0x8_0000;
/// Canary bytes after the mapping (in the memfd, never mapped).
pub const CANARY: u64 = 0x1000;
/// What the canary holds.
pub const CANARY_BYTE: u8 = 0xa5;
/// A page of zeros.
static ZERO_PAGE: [u8; 4096] = [0; 4096];
/// The command queue (32 entries of 64 bytes).
pub const CMDQ: u64 = 0;
/// The input mailbox chain (up to [`BLOCKS`] blocks).
pub const INBOX: u64 = 0x1000;
/// The output mailbox chain.
pub const OUTBOX: u64 = 0x9000;
/// Mailbox blocks per direction.
pub const BLOCKS: usize = 32;
/// The pages MANAGE_PAGES gives ([`POOL_PAGES`] of them).
pub const POOL: u64 = 0x1_2000;
/// Pages in the pool: boot (16) + init (32) + 16 spare.
pub const POOL_PAGES: u64 = 64;
/// Where queues, rings and buffers go (the WQE target).
pub const QUEUES: u64 = 0x6_0000;
/// Bytes of a command queue entry.
pub const ENTRY: usize = 64;
/// The token the honest client uses.
pub const TOKEN: u8 = 0x5a;

/// The checks of issue 26 the fuzzed function runs with: every check whose refusals and counts
/// leave the harness's model true — not `page-requests` (a well-formed create may then wait
/// for pages the harness does not give: the model takes every well-formed command to
/// complete), not `eq-overrun` (a hostile EQ overrun would stop the function for the rest of
/// the input), not `cmdif-rev` (nothing reads it).
pub fn fuzz_strictness() -> Strictness {
    let mut s = Strictness::strict();
    s.page_requests = false;
    s.eq_overrun_fatal = false;
    s.cmdif_rev = false;
    s
}

/// A command buffer of `len` bytes with opcode and op_mod set.
pub fn cmd(op: CmdOpcode, op_mod: u32, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len.max(8)];
    let mut h = MboxIn::new_unchecked(&mut b[..]);
    let _ = h.set_opcode(op.as_raw().into());
    let _ = h.set_op_mod(op_mod);
    b
}

/// The command status and syndrome of an output.
pub fn status(out: &[u8]) -> (u8, u32) {
    let o = MboxOut::new_unchecked(out);
    (o.status() as u8, o.syndrome())
}

/// Mailbox blocks a length needs (mlx5.md §4.2).
pub fn blocks(len: usize) -> usize {
    len.saturating_sub(CMD_INLINE_BYTES)
        .div_ceil(MAILBOX_DATA_BYTES)
}

/// What came back from one entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// Delivered: `outlen` bytes (at least 16) of output.
    Done(Vec<u8>),
    /// A nonzero delivery status.
    Delivery(u8),
    /// The entry is still owned by hardware.
    NotCompleted,
}

/// The function, its firmware and the driver's memory.
#[derive(Debug)]
pub struct Rig {
    /// The emulated function.
    pub dev: Arc<Device>,
    /// Its firmware's handle (accounting, counters).
    pub fw: FirmwareHandle,
    mem: File,
    watcher: Watcher,
    /// What the mapped bytes held at the last [`Rig::refresh`], plus the harness's writes.
    image: Vec<u8>,
    scratch: Vec<u8>,
    /// The accounting of a fresh rig (what every reset must give back).
    fresh: Accounting,
    /// Resets since the rig was made (inputs run on it after the first).
    pub resets: u64,
}

fn memfd(len: u64) -> File {
    let fd = memfd_create(c"rnic-fuzz-dma", MFdFlags::MFD_ALLOW_SEALING).expect("memfd_create");
    let f = File::from(fd);
    f.set_len(len).expect("size the memfd");
    fcntl(&f, FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_SHRINK)).expect("seal the memfd");
    f
}

impl Rig {
    /// A powered-on function whose DMA table maps the first [`MAPPED`] bytes of a fresh
    /// memfd at [`BASE`], bus mastering on, the command queue address written.
    pub fn new() -> Rig {
        let options = Options {
            boot_delay: Duration::ZERO,
            firmware: FirmwareOptions {
                strictness: fuzz_strictness(),
                ..FirmwareOptions::default()
            },
            ..Options::default()
        };
        let fw = Firmware::new(options.firmware);
        let handle = fw.handle();
        let dev = Arc::new(Device::new(options, Box::new(fw)).expect("an emulated function"));
        handle.attach(&dev);
        let mem = memfd(MAPPED + CANARY);
        mem.write_all_at(&[CANARY_BYTE; CANARY as usize], MAPPED)
            .expect("write the canary");
        let file = mem.try_clone().expect("dup the memfd");
        dev.dma()
            .map(BASE, MAPPED, Some(file), 0, true, true)
            .expect("DMA_MAP");
        let fresh = handle.accounting();
        let mut rig = Rig {
            dev,
            fw: handle,
            mem,
            watcher: Watcher::default(),
            image: vec![0u8; MAPPED as usize],
            scratch: vec![0u8; MAPPED as usize],
            fresh,
            resets: 0,
        };
        rig.power_on();
        rig
    }

    /// What the driver does after power-on and after a reset: bus mastering on, the command
    /// queue address written (the watcher's scan takes both in).
    fn power_on(&mut self) {
        self.dev.config_write(4, &[0x06, 0]);
        let bar = self.dev.bar();
        let iova = BASE + CMDQ;
        bar.write32_be(init_seg_offset::CMDQ_ADDR_H as u64, (iova >> 32) as u32);
        bar.write32_be(
            init_seg_offset::CMDQ_ADDR_L_SZ as u64,
            initial_seg::cmdq_phy_addr_31_12.insert(0, (iova >> 12) as u32),
        );
        self.scan();
    }

    /// Back to the state [`Rig::new`] gives: the function reset (FLR: init segment, config
    /// space, UAR pages and the firmware's state back to power-on; the DMA mapping kept, as
    /// a reset keeps the IOMMU's), the mapped bytes punched back to holes (zero) and the
    /// image with them, then power-on as in `new`. Asserts what a fresh rig has: no byte
    /// outside the mapping changed, the firmware's accounting equal to a fresh one's (no
    /// pages, no objects, phase), exactly the one DMA mapping.
    pub fn reset(&mut self) {
        self.assert_canary();
        self.punch(0, MAPPED);
        self.image.fill(0);
        self.dev.reset().expect("function-level reset");
        self.power_on();
        self.resets += 1;
        assert_eq!(
            self.fw.accounting(),
            self.fresh,
            "a reset function does not account like a fresh one"
        );
        assert!(self.fw.pages().is_empty(), "a reset function holds pages");
        assert_eq!(
            self.dev.dma().mappings(),
            vec![(BASE, MAPPED)],
            "the DMA table after a reset"
        );
    }

    /// Bytes of the memfd at `off` (host view: the whole memfd, canary included).
    pub fn read(&self, off: u64, dst: &mut [u8]) {
        self.mem.read_exact_at(dst, off).expect("read the memfd");
    }

    /// Write the memfd at `off` (as the driver does; the image follows).
    pub fn write(&mut self, off: u64, src: &[u8]) {
        self.mem.write_all_at(src, off).expect("write the memfd");
        let (at, end) = (off as usize, off as usize + src.len());
        if end <= self.image.len() {
            self.image[at..end].copy_from_slice(src);
        }
    }

    /// Write the memfd without the image knowing (a forged device write, for the tests
    /// that show the memory checks fire).
    #[cfg(test)]
    pub(crate) fn write_behind(&self, off: u64, src: &[u8]) {
        self.mem.write_all_at(src, off).expect("write the memfd");
    }

    /// The mapped bytes as of the last [`Rig::refresh`] (plus the harness's writes).
    pub fn image(&self) -> &[u8] {
        &self.image
    }

    /// Read the mapped bytes again; the bytes the device changed since the last refresh
    /// (offset, old, new). Only the memfd's allocated extents are read: a hole reads as
    /// zero, and the image is zero there too (every byte the image holds other than zero
    /// was written, by the harness or by the device, and a write allocates; only
    /// [`Rig::reset`] punches holes, and it zeroes the image).
    pub fn refresh(&mut self) -> Vec<(usize, u8, u8)> {
        self.refresh_range(0, MAPPED)
    }

    /// [`Rig::refresh`] of the mapped bytes in `[from, limit)` only (the image elsewhere is
    /// left as it is, to be compared by a later refresh of its range).
    pub fn refresh_range(&mut self, from: u64, limit: u64) -> Vec<(usize, u8, u8)> {
        let limit = limit.min(MAPPED);
        let mut diff = Vec::new();
        let mut at = from;
        while at < limit {
            let start = match lseek(&self.mem, at as i64, Whence::SeekData) {
                Ok(s) => s as u64,
                Err(Errno::ENXIO) => break,
                Err(e) => panic!("lseek(SEEK_DATA) on the memfd: {e}"),
            };
            if start >= limit {
                break;
            }
            let end = (lseek(&self.mem, start as i64, Whence::SeekHole)
                .expect("lseek(SEEK_HOLE) on the memfd") as u64)
                .min(limit);
            let (s, e) = (start as usize, end as usize);
            let mut now = std::mem::take(&mut self.scratch);
            self.read(start, &mut now[s..e]);
            for i in changed(&self.image[s..e], &now[s..e]) {
                diff.push((s + i, self.image[s + i], now[s + i]));
            }
            self.image[s..e].copy_from_slice(&now[s..e]);
            self.scratch = now;
            // Allocated pages that hold only zeros go back to holes (their bytes stay what
            // they are): the firmware's pages, which MANAGE_PAGES reads and writes back
            // whole, are not read again by every later refresh.
            let mut page = start;
            let mut zeros: Option<u64> = None;
            while page < end {
                let p = page as usize;
                let len = (end - page).min(4096);
                // (A comparison, not a byte loop: the fuzz build instruments loops.)
                if self.image[p..p + len as usize] == ZERO_PAGE[..len as usize] {
                    zeros.get_or_insert(page);
                } else if let Some(z) = zeros.take() {
                    self.punch(z, page - z);
                }
                page += len;
            }
            if let Some(z) = zeros {
                self.punch(z, end - z);
            }
            at = end;
        }
        diff
    }

    /// Zero `[off, off + len)` of the mapped bytes as the driver would, and cheaply: punched
    /// back to a hole, the image zeroed with it.
    pub fn zero(&mut self, off: u64, len: u64) {
        assert!(
            off.checked_add(len).is_some_and(|e| e <= MAPPED),
            "zero beyond the mapping"
        );
        self.punch(off, len);
        self.image[off as usize..(off + len) as usize].fill(0);
    }

    /// Make the mapped bytes from `off` on hold `want`, as the driver would, touching only
    /// the pages whose image differs (a page `want` has all zero is punched back to a hole).
    /// The image must be current (a [`Rig::refresh`] since the device last ran).
    pub fn restore(&mut self, off: u64, want: &[u8]) {
        assert!(
            off.is_multiple_of(4096) && off + want.len() as u64 <= MAPPED,
            "restore beyond the mapping"
        );
        for (k, page) in want.chunks(4096).enumerate() {
            let at = off + (k * 4096) as u64;
            let p = at as usize;
            if self.image[p..p + page.len()] == *page {
                continue;
            }
            if *page == ZERO_PAGE[..page.len()] {
                self.zero(at, page.len() as u64);
            } else {
                self.write(at, page);
            }
        }
    }

    /// Punch `[off, off + len)` of the memfd back to a hole (it reads as zero after).
    fn punch(&self, off: u64, len: u64) {
        fallocate(
            &self.mem,
            FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE,
            off as i64,
            len as i64,
        )
        .expect("punch a hole in the memfd");
    }

    /// Asserts that no byte outside the DMA mapping changed.
    pub fn assert_canary(&self) {
        let mut c = [0u8; CANARY as usize];
        self.read(MAPPED, &mut c);
        if c != [CANARY_BYTE; CANARY as usize] {
            let i = c.iter().position(|&b| b != CANARY_BYTE).unwrap_or(0);
            panic!(
                "host memory outside the DMA mapping changed: memfd byte {:#x} is {:#x}",
                MAPPED + i as u64,
                c[i]
            );
        }
    }

    /// Run the emulator's watcher scan once (every doorbell written since is delivered to
    /// the firmware, synchronously), then what the watcher thread runs after a scan
    /// (delayed completions, BlueFlame judging).
    pub fn scan(&mut self) -> usize {
        self.watcher.scan(&self.dev) + self.fw.after_scan(&self.dev)
    }

    /// Ring the command doorbell with `bits` and let the watcher deliver it.
    pub fn ring(&mut self, bits: u32) {
        self.dev
            .bar()
            .write32_be(init_seg_offset::CMD_DBELL as u64, bits);
        self.scan();
    }

    /// Write a 64-bit UAR doorbell (big-endian) at `page`, `offset` and scan.
    pub fn uar64(&mut self, page: u32, offset: u64, value: u64) {
        self.dev
            .bar()
            .write64_be(u64::from(page) * 4096 + offset, value);
        self.scan();
    }

    /// Write a 32-bit UAR doorbell and scan.
    pub fn uar32(&mut self, page: u32, offset: u64, value: u32) {
        self.dev
            .bar()
            .write32_be(u64::from(page) * 4096 + offset, value);
        self.scan();
    }

    /// Write an honest chain of `n` blocks at `at` carrying `data`, token `token`.
    pub fn write_chain(&mut self, at: u64, data: &[u8], n: usize, token: u8) {
        for k in 0..n {
            let mut raw = [0u8; cmd_if_box::SIZE_BYTES];
            let mut b = CmdIfBox::new_unchecked(&mut raw[..]);
            let from = (k * MAILBOX_DATA_BYTES).min(data.len());
            let to = (from + MAILBOX_DATA_BYTES).min(data.len());
            b.as_bytes_mut()[..to - from].copy_from_slice(&data[from..to]);
            if k + 1 < n {
                let next = BASE + at + ((k + 1) * MAILBOX_ALIGN) as u64;
                let _ = b.set_next_pointer_63_32((next >> 32) as u32);
                let _ = b.set_next_pointer_31_10((next as u32) >> 10);
            }
            let _ = b.set_block_number(k as u32);
            let _ = b.set_token(u32::from(token));
            self.write(at + (k * MAILBOX_ALIGN) as u64, &raw);
        }
    }

    /// An honest entry for `input` / `outlen` with the harness's chains.
    pub fn entry(input: &[u8], outlen: usize, token: u8) -> [u8; ENTRY] {
        let mut raw = [0u8; ENTRY];
        let mut e = CmdQueueEntry::new_unchecked(&mut raw[..]);
        let _ = e.set_type(CMD_TYPE_PCIE);
        let _ = e.set_input_length(input.len() as u32);
        let mut inline = [0u8; CMD_INLINE_BYTES];
        let n = input.len().min(CMD_INLINE_BYTES);
        inline[..n].copy_from_slice(&input[..n]);
        let _ = e.set_command_input_inline_data(&inline);
        let (h, l) = split(BASE + INBOX);
        let _ = e.set_input_mailbox_pointer_63_32(h);
        let _ = e.set_input_mailbox_pointer_31_9(l);
        let (h, l) = split(BASE + OUTBOX);
        let _ = e.set_output_mailbox_pointer_63_32(h);
        let _ = e.set_output_mailbox_pointer_31_9(l);
        let _ = e.set_output_length(outlen as u32);
        let _ = e.set_token(token.into());
        let _ = e.set_ownership(1);
        raw
    }

    /// Collect what entry `slot` says, reading the output chain at [`OUTBOX`].
    pub fn reply(&self, slot: u32, outlen: usize) -> Reply {
        let mut e = [0u8; ENTRY];
        self.read(CMDQ + u64::from(slot) * ENTRY as u64, &mut e);
        let v = CmdQueueEntry::new_unchecked(&e[..]);
        if v.ownership() != 0 {
            return Reply::NotCompleted;
        }
        if v.status() != 0 {
            return Reply::Delivery(v.status() as u8);
        }
        let mut out = vec![0u8; outlen.max(CMD_INLINE_BYTES)];
        out[..CMD_INLINE_BYTES].copy_from_slice(v.command_output_inline_data());
        let data = cmd_if_box::mailbox_data.byte_offset() as u64;
        for k in 0..blocks(outlen).min(BLOCKS) {
            let from = CMD_INLINE_BYTES + k * MAILBOX_DATA_BYTES;
            let to = (from + MAILBOX_DATA_BYTES).min(outlen);
            self.read(
                OUTBOX + (k * MAILBOX_ALIGN) as u64 + data,
                &mut out[from..to],
            );
        }
        Reply::Done(out)
    }

    /// Execute `input` honestly on slot 0; the reply.
    pub fn exec(&mut self, input: &[u8], outlen: usize) -> Reply {
        let (nin, nout) = (blocks(input.len()), blocks(outlen));
        assert!(
            nin <= BLOCKS && nout <= BLOCKS,
            "harness mailboxes too small"
        );
        self.write_chain(
            INBOX,
            input.get(CMD_INLINE_BYTES..).unwrap_or(&[]),
            nin,
            TOKEN,
        );
        self.write_chain(OUTBOX, &[], nout, TOKEN);
        self.write(CMDQ, &Rig::entry(input, outlen, TOKEN));
        self.ring(1);
        self.reply(0, outlen)
    }

    /// Execute and require delivery and status OK; the output.
    pub fn ok(&mut self, input: &[u8], outlen: usize) -> Vec<u8> {
        match self.exec(input, outlen) {
            Reply::Done(out) => {
                assert_eq!(
                    status(&out),
                    (0, 0),
                    "bring-up command {:#x} failed",
                    MboxIn::new_unchecked(input).opcode()
                );
                out
            }
            other => panic!("bring-up command not delivered: {other:?}"),
        }
    }

    /// ENABLE_HCA, SET_ISSI 1, boot pages, INIT pages, INIT_HCA from the pool (RoCE caps
    /// as shipped). `roce_src_port` also sets the RoCE cap `sw_r_roce_src_udp_port`.
    pub fn bring_up(&mut self, roce_src_port: bool) {
        self.ok(&cmd(CmdOpcode::EnableHca, 0, 0x10), 0x10);
        let mut c = cmd(CmdOpcode::SetIssi, 0, 0x10);
        let _ = SetIssiIn::new_unchecked(&mut c[..]).set_current_issi(1);
        self.ok(&c, 0x10);
        let mut next = 0;
        for op_mod in [query_pages_op_mod::BOOT, query_pages_op_mod::INIT] {
            if op_mod == query_pages_op_mod::INIT && roce_src_port {
                self.enable_roce_src_port();
            }
            let out = self.ok(&cmd(CmdOpcode::QueryPages, op_mod, 0x10), 0x10);
            let n = rnic_mlx5_prm::QueryPagesOut::new_unchecked(&out[..]).num_pages() as u64;
            let pages: Vec<u64> = (next..next + n).map(pool_page).collect();
            next += n;
            self.give(&pages);
        }
        self.ok(&cmd(CmdOpcode::InitHca, 0, 0x20), 0x10);
    }

    fn enable_roce_src_port(&mut self) {
        use rnic_mlx5_prm::{RoceCap, cap_type, query_hca_cap_out};
        let q = cmd(CmdOpcode::QueryHcaCap, (cap_type::ROCE << 1) | 1, 0x10);
        let out = self.ok(&q, 0x1010);
        let mut roce = out[query_hca_cap_out::cmd_hca_cap.byte_offset()..].to_vec();
        let _ = RoceCap::new_unchecked(&mut roce[..]).set_sw_r_roce_src_udp_port(1);
        // The structure only (0x100 bytes), as K and RC send it (the `cap-payload` check).
        let mut set = cmd(CmdOpcode::SetHcaCap, cap_type::ROCE << 1, 0x1010);
        set[0x10..0x110].copy_from_slice(&roce[..0x100]);
        self.ok(&set, 0x10);
    }

    /// CREATE_EQ of a 64-entry ring at memfd offset `at` (one page, its entries as the
    /// driver left them), on UAR page `uar`, interrupt `vector`, events `mask`; its number.
    pub fn create_eq(&mut self, at: u64, uar: u32, vector: u32, mask: u64) -> u32 {
        use rnic_mlx5_prm::{CreateEqIn, CreateEqOut};
        let mut c = cmd(CmdOpcode::CreateEq, 0, 0x110 + 8);
        let mut v = CreateEqIn::new_unchecked(&mut c[..]);
        let mut e = v.eq_context_entry_mut();
        let _ = e.set_log_eq_size(6);
        let _ = e.set_uar_page(uar);
        let _ = e.set_intr(vector);
        let _ = v.set_event_bitmask(0, mask);
        let _ = v.set_pas(0, BASE + at);
        let out = self.ok(&c, 0x10);
        CreateEqOut::new_unchecked(&out[..]).eq_number()
    }

    /// CREATE_CQ of 2^`log` 64-byte CQEs (at most 64: one page) at memfd offset `ring`,
    /// doorbell record at `dbr`, on UAR page `uar`, events to EQ `eqn`; its number.
    pub fn create_cq(&mut self, log: u32, uar: u32, eqn: u32, ring: u64, dbr: u64) -> u32 {
        use rnic_mlx5_prm::{CreateCqIn, CreateCqOut};
        assert!(log <= 6, "a CQ ring of one page");
        let mut c = cmd(CmdOpcode::CreateCq, 0, 0x118);
        let mut v = CreateCqIn::new_unchecked(&mut c[..]);
        let mut x = v.cq_context_mut();
        let _ = x.set_log_cq_size(log);
        let _ = x.set_uar_page(uar);
        let _ = x.set_c_eqn_or_apu_element(eqn);
        let _ = x.set_dbr_addr(BASE + dbr);
        let _ = v.set_pas(0, BASE + ring);
        let out = self.ok(&c, 0x10);
        CreateCqOut::new_unchecked(&out[..]).cqn()
    }

    /// MANAGE_PAGES(GIVE) of `pages` (IOVAs).
    pub fn give(&mut self, pages: &[u64]) {
        let mut c = cmd(
            CmdOpcode::ManagePages,
            manage_pages_op_mod::GIVE,
            0x10 + 8 * pages.len(),
        );
        let mut v = ManagePagesIn::new_unchecked(&mut c[..]);
        let _ = v.set_input_num_entries(pages.len() as u32);
        for (i, p) in pages.iter().enumerate() {
            let _ = v.set_pas(i, *p);
        }
        self.ok(&c, 0x10);
    }
}

impl Default for Rig {
    fn default() -> Rig {
        Rig::new()
    }
}

thread_local! {
    static RIG: RefCell<Option<Rig>> = const { RefCell::new(None) };
}

/// Run `f` on this thread's rig: made on first use, [`Rig::reset`] before every later use
/// (an input that panicked halfway leaves nothing the reset does not undo).
pub fn with_rig<R>(f: impl FnOnce(&mut Rig) -> R) -> R {
    RIG.with_borrow_mut(|slot| {
        let rig = match slot {
            Some(rig) => {
                rig.reset();
                rig
            }
            None => slot.insert(Rig::new()),
        };
        f(rig)
    })
}

/// The IOVA of pool page `i`.
pub fn pool_page(i: u64) -> u64 {
    BASE + POOL + i * 4096
}

/// The offsets where `before` and `after` differ (compared page by page, then line by
/// line, so the common case of few changes costs a few `memcmp`s).
pub fn changed(before: &[u8], after: &[u8]) -> Vec<usize> {
    let mut out = Vec::new();
    if before == after {
        return out;
    }
    for (k, (a, b)) in before.chunks(4096).zip(after.chunks(4096)).enumerate() {
        if a == b {
            continue;
        }
        for (j, (x, y)) in a.chunks(64).zip(b.chunks(64)).enumerate() {
            if x != y {
                let at = k * 4096 + j * 64;
                out.extend((0..x.len()).filter(|&i| x[i] != y[i]).map(|i| at + i));
            }
        }
    }
    out
}

/// A mailbox pointer's (63:32, 31:9) fields.
pub fn split(addr: u64) -> (u32, u32) {
    ((addr >> 32) as u32, (addr as u32) >> 9)
}
