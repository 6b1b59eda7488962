//! A minimal command-interface client for the firmware tests: real bytes through
//! `rnic_mlx5::VfioUserFunction` (DMA buffers, BAR0 doorbell), every entry and mailbox byte
//! written through the rnic-mlx5-prm views. Deliberately independent of the driver's own
//! command code.
#![allow(clippy::unwrap_used, dead_code)]

pub mod eth;
pub mod hw;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rnic_core::Memory;
use rnic_mlx5::{DmaBuffer, PciFunction, VfioUserFunction};
use rnic_mlx5_emu::{Emulator, FirmwareHandle, Options};
use rnic_mlx5_prm::{
    CMD_INLINE_BYTES, CMD_TYPE_PCIE, CmdIfBox, CmdOpcode, CmdQueueEntry, MAILBOX_ALIGN,
    MAILBOX_DATA_BYTES, MboxIn, MboxOut, cmd_if_box, cmd_queue_entry, init_seg_offset, initial_seg,
};

/// Mailbox blocks per direction.
pub const BLOCKS: usize = 16;
/// Entry stride the tests expect the firmware to publish (log 6).
pub const STRIDE: usize = 64;

/// What came back from a command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// Delivered: `outlen` bytes of output.
    Done(Vec<u8>),
    /// A nonzero delivery status.
    Delivery(u8),
    /// The entry stayed owned by hardware.
    Timeout,
}

impl Reply {
    /// The output, asserting delivery.
    pub fn out(self) -> Vec<u8> {
        match self {
            Reply::Done(o) => o,
            other => panic!("command not delivered: {other:?}"),
        }
    }
}

/// The command status and syndrome of an output.
pub fn status(out: &[u8]) -> (u8, u32) {
    let o = MboxOut::new_unchecked(out);
    (o.status() as u8, o.syndrome())
}

/// A command buffer of `len` bytes with opcode and op_mod set.
pub fn cmd(op: CmdOpcode, op_mod: u32, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    let mut h = MboxIn::new_unchecked(&mut b[..]);
    h.set_opcode(op.as_raw().into()).unwrap();
    h.set_op_mod(op_mod).unwrap();
    b
}

/// Changes a test applies to what the client would send.
#[derive(Clone, Copy, Debug, Default)]
pub struct Tweak {
    /// Entry ownership bit (1 when None).
    pub ownership: Option<u32>,
    /// Entry type (7 when None).
    pub cmd_type: Option<u32>,
    /// Input block k gets this block number.
    pub in_block_number: Option<(usize, u32)>,
    /// Input block k gets this token.
    pub in_token: Option<(usize, u32)>,
    /// Output block k gets this block number.
    pub out_block_number: Option<(usize, u32)>,
    /// Input mailbox pointer replaced.
    pub in_ptr: Option<u64>,
    /// The entry's token.
    pub token: Option<u8>,
    /// `inlen` written into the entry instead of the input's length.
    pub inlen: Option<u32>,
}

/// The test rig: an emulator with firmware, and a connected client.
///
/// Fields drop in declaration order: the client's buffers and connection before the emulator,
/// so its shutdown does not wait for a connected client (2 s).
pub struct Rig {
    pub cmdq: Arc<DmaBuffer>,
    pub inbox: Arc<DmaBuffer>,
    pub outbox: Arc<DmaBuffer>,
    pub f: VfioUserFunction,
    pub emu: Emulator,
    pub token: u8,
    _dir: tempfile::TempDir,
    pub path: PathBuf,
}

fn split_ptr(addr: u64) -> (u32, u32) {
    ((addr >> 32) as u32, (addr as u32) >> 9)
}

impl Rig {
    /// A rig on a firmware with issue 26's strictness off: the raw-command
    /// tests built on it send what their checks need (whole capability
    /// pages, no answers to page requests); `tests/strict.rs` and
    /// `tests/strict_hca.rs` turn the checks on one by one, and every
    /// rnic-mlx5 test runs the default, strict emulator.
    pub fn new() -> Rig {
        Rig::with(Options {
            boot_delay: Duration::from_millis(1),
            firmware: rnic_mlx5_emu::FirmwareOptions {
                strictness: rnic_mlx5_emu::Strictness::legacy(),
                ..Default::default()
            },
            ..Options::default()
        })
    }

    pub fn with(options: Options) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mlx5.sock");
        let emu = Emulator::start(&path, options).unwrap();
        let f = VfioUserFunction::connect(&path).unwrap();
        f.enable_bus_master().unwrap();
        let bar = f.bar0();
        let deadline = Instant::now() + Duration::from_secs(5);
        while initial_seg::initializing
            .extract(bar.read32_be(init_seg_offset::INITIALIZING).unwrap())
            != 0
        {
            assert!(
                Instant::now() < deadline,
                "firmware never finished initializing"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        let l = bar.read32_be(init_seg_offset::CMDQ_ADDR_L_SZ).unwrap();
        assert_eq!(
            initial_seg::log_cmdq_size.extract(l),
            5,
            "32 entries published"
        );
        assert_eq!(
            initial_seg::log_cmdq_stride.extract(l),
            6,
            "64-byte stride published"
        );
        let cmdq = f.alloc_dma(4096).unwrap();
        let inbox = f.alloc_dma(BLOCKS * MAILBOX_ALIGN).unwrap();
        let outbox = f.alloc_dma(BLOCKS * MAILBOX_ALIGN).unwrap();
        let iova = cmdq.iova().0;
        bar.write32_be(init_seg_offset::CMDQ_ADDR_H, (iova >> 32) as u32)
            .unwrap();
        bar.write32_be(
            init_seg_offset::CMDQ_ADDR_L_SZ,
            initial_seg::cmdq_phy_addr_31_12.insert(0, (iova >> 12) as u32),
        )
        .unwrap();
        Rig {
            emu,
            f,
            cmdq,
            inbox,
            outbox,
            token: 0x5a,
            _dir: dir,
            path,
        }
    }

    pub fn fw(&self) -> &FirmwareHandle {
        self.emu.firmware().unwrap()
    }

    /// Execute on slot 0 and wait.
    pub fn exec(&self, input: &[u8], outlen: usize) -> Reply {
        self.exec_on(0, input, outlen, Tweak::default(), Duration::from_secs(5))
    }

    /// Execute, expect delivery and command status OK; the output.
    pub fn ok(&self, input: &[u8], outlen: usize) -> Vec<u8> {
        let out = self.exec(input, outlen).out();
        assert_eq!(
            status(&out),
            (0, 0),
            "command {:#x} failed",
            MboxIn::new_unchecked(input).opcode()
        );
        out
    }

    /// Execute, expect a command error; (status, syndrome).
    pub fn err(&self, input: &[u8], outlen: usize) -> (u8, u32) {
        let s = status(&self.exec(input, outlen).out());
        assert_ne!(s.0, 0, "expected an error");
        assert_ne!(s.1, 0, "every error has a nonzero syndrome");
        s
    }

    /// The raw 64 bytes of entry `slot`.
    pub fn entry(&self, slot: usize) -> [u8; 64] {
        let mut e = [0u8; 64];
        self.cmdq.read(slot * STRIDE, &mut e).unwrap();
        e
    }

    /// Mailbox block `k` of a region.
    pub fn block(buf: &DmaBuffer, k: usize) -> [u8; 576] {
        let mut b = [0u8; 576];
        buf.read(k * MAILBOX_ALIGN, &mut b).unwrap();
        b
    }

    fn write_chain(
        &self,
        buf: &DmaBuffer,
        data: &[u8],
        n: usize,
        (tweak, token0): (&Tweak, u8),
        input: bool,
    ) {
        for k in 0..n {
            let mut raw = [0u8; 576];
            let mut b = CmdIfBox::new_unchecked(&mut raw[..]);
            let from = k * MAILBOX_DATA_BYTES;
            let chunk = &data[from.min(data.len())..(from + MAILBOX_DATA_BYTES).min(data.len())];
            b.as_bytes_mut()[..chunk.len()].copy_from_slice(chunk);
            if k + 1 < n {
                let next = buf.iova().0 + ((k + 1) * MAILBOX_ALIGN) as u64;
                b.set_next_pointer_63_32((next >> 32) as u32).unwrap();
                b.set_next_pointer_31_10((next as u32) >> 10).unwrap();
            }
            let mut num = k as u32;
            let mut token = u32::from(token0);
            if input {
                if let Some((i, v)) = tweak.in_block_number
                    && i == k
                {
                    num = v;
                }
                if let Some((i, v)) = tweak.in_token
                    && i == k
                {
                    token = v;
                }
            } else if let Some((i, v)) = tweak.out_block_number
                && i == k
            {
                num = v;
            }
            b.set_block_number(num).unwrap();
            b.set_token(token).unwrap();
            buf.write(k * MAILBOX_ALIGN, &raw).unwrap();
        }
    }

    /// Execute `input` on `slot` with `tweak`, waiting up to `wait` for ownership to return.
    pub fn exec_on(
        &self,
        slot: usize,
        input: &[u8],
        outlen: usize,
        tweak: Tweak,
        wait: Duration,
    ) -> Reply {
        self.post(slot, input, outlen, tweak);
        self.wait(slot, outlen, wait)
    }

    /// Write the command (mailboxes, then the entry) and ring the doorbell for `slot`.
    pub fn post(&self, slot: usize, input: &[u8], outlen: usize, tweak: Tweak) {
        self.post_in(slot, input, outlen, tweak, (&self.inbox, &self.outbox));
    }

    /// A pair of mailbox chains of its own, for a command posted while another is outstanding
    /// (`post_in`/`wait_in`): as K and RC, each slot its own mailboxes.
    pub fn boxes(&self) -> (Arc<DmaBuffer>, Arc<DmaBuffer>) {
        (
            self.f.alloc_dma(BLOCKS * MAILBOX_ALIGN).unwrap(),
            self.f.alloc_dma(BLOCKS * MAILBOX_ALIGN).unwrap(),
        )
    }

    /// [`Rig::post`] with the input and output mailboxes of `boxes`.
    pub fn post_in(
        &self,
        slot: usize,
        input: &[u8],
        outlen: usize,
        tweak: Tweak,
        (inbox, outbox): (&DmaBuffer, &DmaBuffer),
    ) {
        let (nin, nout) = (blocks(input.len()), blocks(outlen));
        assert!(nin <= BLOCKS && nout <= BLOCKS, "test mailboxes too small");
        let token = tweak.token.unwrap_or(self.token);
        self.write_chain(
            inbox,
            input.get(CMD_INLINE_BYTES..).unwrap_or(&[]),
            nin,
            (&tweak, token),
            true,
        );
        self.write_chain(outbox, &[], nout, (&tweak, token), false);

        let mut raw = [0u8; 64];
        let mut e = CmdQueueEntry::new_unchecked(&mut raw[..]);
        e.set_type(tweak.cmd_type.unwrap_or(CMD_TYPE_PCIE)).unwrap();
        e.set_input_length(tweak.inlen.unwrap_or(input.len() as u32))
            .unwrap();
        let mut inline = [0u8; 16];
        let n = input.len().min(16);
        inline[..n].copy_from_slice(&input[..n]);
        e.set_command_input_inline_data(&inline).unwrap();
        let (h, l) = split_ptr(tweak.in_ptr.unwrap_or(inbox.iova().0));
        e.set_input_mailbox_pointer_63_32(h).unwrap();
        e.set_input_mailbox_pointer_31_9(l).unwrap();
        let (h, l) = split_ptr(outbox.iova().0);
        e.set_output_mailbox_pointer_63_32(h).unwrap();
        e.set_output_mailbox_pointer_31_9(l).unwrap();
        e.set_output_length(outlen as u32).unwrap();
        e.set_token(token.into()).unwrap();
        e.set_ownership(tweak.ownership.unwrap_or(1)).unwrap();
        self.cmdq.write(slot * STRIDE, &raw).unwrap();
        // Descriptor and mailboxes before the doorbell (mlx5.md §4.3 step 3).
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        self.f
            .bar0()
            .write32_be(init_seg_offset::CMD_DBELL, 1 << slot)
            .unwrap();
    }

    /// Poll entry `slot` until software owns it again (or `wait` passes), then collect the
    /// output.
    pub fn wait(&self, slot: usize, outlen: usize, wait: Duration) -> Reply {
        self.wait_in(slot, outlen, wait, &self.outbox)
    }

    /// [`Rig::wait`] reading the output mailboxes `outbox`.
    pub fn wait_in(&self, slot: usize, outlen: usize, wait: Duration, outbox: &DmaBuffer) -> Reply {
        let deadline = Instant::now() + wait;
        // The ownership byte alone, then (after an acquire fence) the entry: one 64-byte read
        // may load the inline output before the status byte the firmware wrote after it and
        // return a software-owned entry with the stale output (seen in CI: QUERY_PAGES read
        // back as 0 pages).
        let own = cmd_queue_entry::ownership.byte_offset();
        loop {
            let mut b = [0u8; 1];
            self.cmdq.read(slot * STRIDE + own, &mut b).unwrap();
            if cmd_queue_entry::ownership.extract(u32::from(b[0])) == 0 {
                break;
            }
            if Instant::now() >= deadline {
                return Reply::Timeout;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        let e = self.entry(slot);
        let v = CmdQueueEntry::new_unchecked(&e[..]);
        if v.status() != 0 {
            return Reply::Delivery(v.status() as u8);
        }
        let mut out = vec![0u8; outlen.max(16)];
        out[..16].copy_from_slice(v.command_output_inline_data());
        for k in 0..blocks(outlen) {
            let b = Self::block(outbox, k);
            let from = 16 + k * MAILBOX_DATA_BYTES;
            let to = (from + MAILBOX_DATA_BYTES).min(outlen);
            let data = cmd_if_box::mailbox_data.byte_offset();
            out[from..to].copy_from_slice(&b[data..data + (to - from)]);
        }
        Reply::Done(out)
    }
}

/// Mailbox blocks a length needs (mlx5.md §4.2).
pub fn blocks(len: usize) -> usize {
    len.saturating_sub(CMD_INLINE_BYTES)
        .div_ceil(MAILBOX_DATA_BYTES)
}
