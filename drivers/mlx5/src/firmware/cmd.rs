//! The command interface (mlx5.md §4): one 4 KiB command queue page of
//! 64-byte entries, mailbox chains for what does not fit inline, polled
//! completion.
//!
//! # Encoding (pure, tested on plain byte buffers)
//!
//! [`encode_entry`], [`encode_chain`] and [`decode_reply`] work on byte
//! buffers through the rnic-mlx5-prm views (`cmd_queue_entry`, `cmd_if_box`,
//! `mbox_in`, `mbox_out`): no offset in this file is written by hand. The
//! queue stages a command in ordinary memory, copies it into the DMA page
//! and mailboxes, then publishes it:
//!
//! 1. mailboxes and the entry (ownership 0) are written;
//! 2. [`dma_wmb_before_doorbell`] — the descriptor and mailboxes are visible
//!    to the device before the ownership bit;
//! 3. `status_own` = 1 (hardware owns the entry);
//! 4. [`dma_wmb_before_doorbell`] — the ownership byte before the doorbell;
//! 5. BE32 `1 << slot` to `cmd_dbell` (BAR0 + 0x018);
//! 6. poll `status_own` until bit 0 clears, then
//!    [`dma_rmb_after_owner_bit`] before reading the output.
//!
//! # Choices where mlx5.md is silent or offers alternatives
//!
//! * Tokens: 1..=255, incremented per command, never 0 (K's scheme, §4.1); the
//!   same token in the entry and every input and output block.
//! * Signatures (§4.1, §4.2) are always computed — the entry's over all 64
//!   bytes with `sig` = 0 and `status_own` = 1 (its final value, as K signs
//!   it after setting ownership), each block's `ctrl_sig` and `sig` as
//!   §4.2 defines them. The firmware checks them only with checksums on;
//!   bring-up turns them off (`cmdif_checksum` = 0), so correct signatures
//!   cost nothing and keep a checksum-enabled function working.
//! * Mailbox blocks are 1 KiB apart (≥ the 1 KiB alignment §4.2 asks for)
//!   in a 4 KiB-aligned [`DmaBuffer`] per slot and direction, grown on
//!   demand and reused.
//! * Output: only the driver's own chain is read (the device's `next`
//!   pointers are never followed), always `outlen` bytes as posted.
//! * Timeout: `cmd_exec_to` from the init segment when `cmd_q_init_to` is
//!   nonzero (§2: then both are valid), else 60 s (§2's kernel default), or
//!   what [`CmdQueueOptions::timeout`] says. A timed-out slot keeps its
//!   mailboxes and stays reserved until the device clears its ownership bit;
//!   later commands use another slot, or fail with
//!   [`Mlx5Error::NoCommandSlot`] when none is left.
//! * The last slot is reserved for MANAGE_PAGES (K `max_reg_cmds`, core/cmd.c;
//!   RC posts it on slot 31): regular commands take the other slots, one in
//!   flight at a time, and a page command runs beside them. Firmware may hold
//!   a regular command (CREATE_QP/CQ/MKEY under ICM pressure) until the page
//!   request it raised is answered; the event thread hands that request to
//!   the page worker, which answers on the page slot while the regular
//!   command waits (mlx5-hw-audit row 1). Neither waits under the queue's
//!   state lock, which covers only slot choice, posting and bookkeeping.
//! * A reply is checked no more strictly than the kernel checks it: delivery
//!   status and command status decide; an entry token, output length or
//!   output-block token/number that differs from what was posted is counted
//!   ([`CmdQueue::reply_mismatches`]) and logged, not an error (K
//!   core/cmd.c:307-330; audit row 14). An output length the device
//!   *shortened* still cannot make the driver read past its own buffers.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rnic_core::Memory;
use rnic_dma::barrier::{dma_rmb_after_owner_bit, dma_wmb_before_doorbell};
use rnic_mlx5_prm::{
    CMD_INLINE_BYTES, CMD_TYPE_PCIE, CmdIfBox, CmdOpcode, CmdQueueEntry, CmdStatus, DeliveryStatus,
    MAILBOX_ALIGN, MAILBOX_DATA_BYTES, MAX_CMD_SLOTS, MboxIn, MboxOut, TIMEOUT_MULTIPLIER_MS,
    TIMEOUT_MULTIPLIER_SHIFT, TIMEOUT_VALUE_MASK, cmd_if_box, cmd_queue_entry, default_timeout_ms,
    initial_seg,
};
use tracing::{debug, info, warn};

use crate::firmware::read_iseg;
use crate::function::memory::lock;
use crate::{DmaBuffer, Mlx5Error, PciFunction};

/// Bytes of the command queue page (one 4 KiB page, 4 KiB aligned; §3 step 3).
pub const CMDQ_PAGE_BYTES: usize = 4096;
/// Bytes of one command queue entry (64).
pub const ENTRY_BYTES: usize = cmd_queue_entry::SIZE_BYTES;
/// Bytes of one mailbox block (576).
pub const BLOCK_BYTES: usize = cmd_if_box::SIZE_BYTES;
/// Distance between mailbox blocks in a chain buffer: the 1 KiB alignment
/// of §4.2.
pub const BLOCK_STRIDE: usize = MAILBOX_ALIGN;
/// The largest command input or output the driver posts (a bound against
/// absurd lengths, not a firmware limit): 1 MiB.
pub const MAX_COMMAND_BYTES: usize = 1 << 20;

/// The data field of a mailbox block: bytes `DATA_START..DATA_END`.
const DATA_START: usize = cmd_if_box::mailbox_data.byte_offset();
const DATA_END: usize = DATA_START + cmd_if_box::mailbox_data.byte_len();

/// The byte holding `status_own` (delivery status and ownership) in an entry.
const STATUS_OWN: usize = cmd_queue_entry::ownership.byte_offset();

fn prm(what: &'static str) -> impl Fn(rnic_mlx5_prm::Error) -> Mlx5Error {
    move |source| Mlx5Error::Prm { what, source }
}

fn dma(what: &'static str) -> impl Fn(rnic_core::MemoryError) -> Mlx5Error {
    move |source| Mlx5Error::DmaAccess { what, source }
}

/// Mailbox blocks needed for a command input or output of `len` bytes: the
/// first 16 are inline, the rest 512 per block (§4.2).
pub fn blocks_for(len: usize) -> usize {
    len.saturating_sub(CMD_INLINE_BYTES)
        .div_ceil(MAILBOX_DATA_BYTES)
}

/// The token after `token`: 1..=255, never 0 (K, §4.1).
pub fn next_token(token: u8) -> u8 {
    match token.wrapping_add(1) {
        0 => 1,
        t => t,
    }
}

/// `~XOR` of `bytes`: the signature of §4.1/§4.2.
pub fn signature(bytes: &[u8]) -> u8 {
    !bytes.iter().fold(0u8, |acc, b| acc ^ b)
}

/// Decode an init-segment timeout register (`cmd_exec_to`, `cmd_q_init_to`;
/// §2): bits[19:0] the value, bits[30:29] the unit (ms, s, min, h). `None`
/// for a zero value.
pub fn decode_timeout(raw: u32) -> Option<Duration> {
    let value = u64::from(raw & TIMEOUT_VALUE_MASK);
    let unit = ((raw >> TIMEOUT_MULTIPLIER_SHIFT) & 3) as usize;
    let ms = value.checked_mul(*TIMEOUT_MULTIPLIER_MS.get(unit)?)?;
    (ms != 0).then(|| Duration::from_millis(ms))
}

/// Fill one mailbox chain (for `opcode`, named in errors) of `blocks` blocks in `chain` (at least
/// `blocks * BLOCK_STRIDE` bytes), which the device sees at `chain_iova`
/// (1 KiB aligned): block *i* at `chain_iova + i * BLOCK_STRIDE` carries
/// `data[i * 512 ..]` (zero-padded), `next` = the following block (0 for the
/// last), `block_number` = *i*, `token`, and both signatures (§4.2).
pub fn encode_chain(
    opcode: CmdOpcode,
    chain: &mut [u8],
    chain_iova: u64,
    data: &[u8],
    blocks: usize,
    token: u8,
) -> Result<(), Mlx5Error> {
    let p = prm("mailbox block");
    if !chain_iova.is_multiple_of(MAILBOX_ALIGN as u64) {
        return Err(Mlx5Error::CommandInput {
            opcode,
            reason: format!("mailbox chain at IOVA {chain_iova:#x} is not 1 KiB aligned"),
        });
    }
    for i in 0..blocks {
        let start = i * BLOCK_STRIDE;
        let region_len = chain.len();
        let block = chain
            .get_mut(start..start + BLOCK_BYTES)
            .ok_or(Mlx5Error::DmaAccess {
                what: "mailbox chain staging buffer",
                source: rnic_core::MemoryError::OutOfRange {
                    access: rnic_core::MemAccess::Write,
                    offset: start,
                    len: BLOCK_BYTES,
                    region_len,
                },
            })?;
        block.fill(0);
        let lo = (i * MAILBOX_DATA_BYTES).min(data.len());
        let hi = ((i + 1) * MAILBOX_DATA_BYTES).min(data.len());
        // hi - lo <= 512: inside the block's data field.
        block[DATA_START..DATA_START + (hi - lo)].copy_from_slice(&data[lo..hi]);
        let mut b = CmdIfBox::new_checked(&mut *block).map_err(&p)?;
        let next = if i + 1 < blocks {
            chain_iova + ((i + 1) * BLOCK_STRIDE) as u64
        } else {
            0
        };
        b.set_next_pointer_63_32((next >> 32) as u32).map_err(&p)?;
        b.set_next_pointer_31_10((next as u32) >> 10).map_err(&p)?;
        b.set_block_number(i as u32).map_err(&p)?;
        b.set_token(token.into()).map_err(&p)?;
        let bytes = b.as_bytes();
        let ctrl = signature(&bytes[DATA_END..cmd_if_box::ctrl_signature.byte_offset()]);
        b.set_ctrl_signature(ctrl.into()).map_err(&p)?;
        let sig = signature(&b.as_bytes()[..cmd_if_box::signature.byte_offset()]);
        b.set_signature(sig.into()).map_err(&p)?;
    }
    Ok(())
}

/// Where a command's mailbox chains are, as posted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Posted {
    /// The command.
    pub opcode: CmdOpcode,
    /// Its op_mod.
    pub op_mod: u16,
    /// The token in the entry and every block.
    pub token: u8,
    /// Input length (bytes).
    pub in_len: u32,
    /// Output length (bytes).
    pub out_len: u32,
    /// IOVA of the first input block (0 = none).
    pub in_chain: u64,
    /// IOVA of the first output block (0 = none).
    pub out_chain: u64,
}

/// Fill a 64-byte entry for `input` (`input.len()` = `posted.in_len`):
/// type 7, lengths, mailbox pointers, the first 16 input bytes inline, zeroed
/// output, token and signature. `status_own` is left 0: the caller sets
/// ownership last, after a write barrier; the signature is computed for its
/// final value 0x01.
pub fn encode_entry(entry: &mut [u8], input: &[u8], posted: &Posted) -> Result<(), Mlx5Error> {
    let p = prm("command queue entry");
    let slice = entry
        .get_mut(..ENTRY_BYTES)
        .ok_or_else(|| p(short(ENTRY_BYTES, 0)))?;
    slice.fill(0);
    let mut e = CmdQueueEntry::new_checked(slice).map_err(&p)?;
    e.set_type(CMD_TYPE_PCIE).map_err(&p)?;
    e.set_input_length(posted.in_len).map_err(&p)?;
    e.set_input_mailbox_pointer_63_32((posted.in_chain >> 32) as u32)
        .map_err(&p)?;
    e.set_input_mailbox_pointer_31_9((posted.in_chain as u32) >> 9)
        .map_err(&p)?;
    let mut inline = [0u8; CMD_INLINE_BYTES];
    let n = input.len().min(CMD_INLINE_BYTES);
    inline[..n].copy_from_slice(&input[..n]);
    e.set_command_input_inline_data(&inline).map_err(&p)?;
    e.set_output_mailbox_pointer_63_32((posted.out_chain >> 32) as u32)
        .map_err(&p)?;
    e.set_output_mailbox_pointer_31_9((posted.out_chain as u32) >> 9)
        .map_err(&p)?;
    e.set_output_length(posted.out_len).map_err(&p)?;
    e.set_token(posted.token.into()).map_err(&p)?;
    e.set_ownership(1).map_err(&p)?;
    let sig = signature(e.as_bytes());
    e.set_signature(sig.into()).map_err(&p)?;
    e.set_ownership(0).map_err(&p)?;
    Ok(())
}

fn short(needed: usize, got: usize) -> rnic_mlx5_prm::Error {
    rnic_mlx5_prm::Error::Truncated {
        structure: "cmd_queue_entry",
        needed,
        got,
    }
}

/// A difference between a reply and what was posted that the kernel does
/// not check (entry token, output length, an output block's token or
/// number; K core/cmd.c:307-330, audit row 14): counted and logged by the
/// queue, never an error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplyMismatch {
    /// Which field.
    pub what: String,
    /// What the driver posted.
    pub posted: u64,
    /// What the device left.
    pub found: u64,
}

/// A completed command's output and what differed from what was posted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decoded {
    /// `posted.out_len` bytes: 16 inline, then 512 per block.
    pub out: Vec<u8>,
    /// Fields the device changed that the kernel does not check.
    pub mismatches: Vec<ReplyMismatch>,
}

/// Check a completed entry and its output chain and assemble the output
/// (`posted.out_len` bytes: 16 inline, then 512 per block, always the
/// driver's own length and chain, whatever the device wrote into the
/// entry). Errors, in this order: delivery status nonzero →
/// [`Mlx5Error::Delivery`]; a chain shorter than the output (the driver's
/// own buffer; never from [`CmdQueue::exec`]) → [`Mlx5Error::Reply`];
/// command status nonzero → [`Mlx5Error::Command`]. A changed entry token,
/// output length, block token or block number is a [`ReplyMismatch`].
pub fn decode_reply(entry: &[u8], chain: &[u8], posted: &Posted) -> Result<Decoded, Mlx5Error> {
    let opcode = posted.opcode;
    let e = CmdQueueEntry::new_checked(entry).map_err(prm("completed entry"))?;
    let delivery = DeliveryStatus::from_raw(e.status() as u8);
    if delivery != DeliveryStatus::Ok {
        return Err(Mlx5Error::Delivery {
            opcode,
            status: delivery,
        });
    }
    let mut mismatches = Vec::new();
    let mut differs = |what: String, posted: u64, found: u64| {
        if posted != found {
            mismatches.push(ReplyMismatch {
                what,
                posted,
                found,
            });
        }
    };
    differs("entry token".into(), posted.token.into(), e.token().into());
    differs(
        "output length".into(),
        posted.out_len.into(),
        e.output_length().into(),
    );
    let out_len = posted.out_len as usize;
    let mut out = vec![0u8; out_len];
    let n = out_len.min(CMD_INLINE_BYTES);
    out[..n].copy_from_slice(&e.command_output_inline_data()[..n]);
    for i in 0..blocks_for(out_len) {
        let start = i * BLOCK_STRIDE;
        let block = chain
            .get(start..start + BLOCK_BYTES)
            .ok_or_else(|| Mlx5Error::Reply {
                opcode,
                what: format!("output block {i} missing from the driver's chain"),
                posted: blocks_for(out_len) as u64,
                found: (chain.len() / BLOCK_STRIDE) as u64,
            })?;
        let b = CmdIfBox::new_checked(block).map_err(prm("output mailbox block"))?;
        differs(
            format!("output block {i} token"),
            posted.token.into(),
            b.token().into(),
        );
        differs(
            format!("output block {i} number"),
            i as u64,
            b.block_number().into(),
        );
        let lo = CMD_INLINE_BYTES + i * MAILBOX_DATA_BYTES;
        let hi = (lo + MAILBOX_DATA_BYTES).min(out_len);
        out[lo..hi].copy_from_slice(&b.mailbox_data()[..hi - lo]);
    }
    let head = MboxOut::new_checked(&out[..]).map_err(prm("command output header"))?;
    let status = CmdStatus::from_raw(head.status() as u8);
    if status != CmdStatus::Ok {
        return Err(Mlx5Error::Command {
            opcode,
            op_mod: posted.op_mod,
            status,
            syndrome: head.syndrome(),
        });
    }
    Ok(Decoded { out, mismatches })
}

/// How a [`CmdQueue`] is set up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CmdQueueOptions {
    /// Per-command timeout; `None` = the init segment's `cmd_exec_to`, else
    /// 60 s.
    pub timeout: Option<Duration>,
}

/// A timed-out command whose slot the device still owns.
#[derive(Debug)]
struct Stuck {
    opcode: CmdOpcode,
    token: u8,
    since: Instant,
}

#[derive(Debug, Default)]
struct Slot {
    stuck: Option<Stuck>,
    inbox: Option<Arc<DmaBuffer>>,
    outbox: Option<Arc<DmaBuffer>>,
}

#[derive(Debug)]
struct State {
    token: u8,
    slots: Vec<Slot>,
    executed: u64,
    mismatches: u64,
    events: Option<Arc<dyn CommandEvents>>,
}

/// Command completion by event (mlx5.md §11 type 0x0a): implemented by the
/// event queue once it exists.
pub(crate) trait CommandEvents: Send + Sync + fmt::Debug {
    /// A command is about to be posted in `slot`: forget a stale completion.
    fn begin(&self, slot: usize);
    /// Wait up to `slice` for the completion EQE of `slot`; whether it came.
    fn wait_command(&self, slot: usize, slice: Duration) -> bool;
}

/// The command queue of one function (mlx5.md §4).
pub struct CmdQueue {
    function: Arc<dyn PciFunction>,
    page: Arc<DmaBuffer>,
    log_stride: u32,
    timeout: Duration,
    /// The slot reserved for MANAGE_PAGES (the last one; `None` with a
    /// single slot, which then serves every command).
    page_slot: Option<usize>,
    /// Held by the one regular command in flight.
    regular: Mutex<()>,
    /// Held by the one page command in flight on `page_slot`.
    paging: Mutex<()>,
    /// Slots, tokens, counters: held only to post and to account, never
    /// while waiting.
    state: Mutex<State>,
}

impl fmt::Debug for CmdQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CmdQueue")
            .field("function", &self.function.name())
            .field("page", &self.page.iova())
            .field("log_stride", &self.log_stride)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// `log_cmdq_size` / `log_cmdq_stride` as the init segment reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CmdqGeometry {
    /// log2 of the number of entries.
    pub log_size: u32,
    /// log2 of the entry stride in bytes.
    pub log_stride: u32,
}

impl CmdqGeometry {
    /// From the low byte of `cmdq_addr_l_sz` (§2), refusing what §3 step 3
    /// refuses (`1 << log_size > 32`, `log_size + log_stride > 12`) and a
    /// stride below the 64-byte entry.
    pub fn from_register(function: &str, dword: u32) -> Result<CmdqGeometry, Mlx5Error> {
        let log_size = initial_seg::log_cmdq_size.extract(dword);
        let log_stride = initial_seg::log_cmdq_stride.extract(dword);
        let bad = |reason: String| Mlx5Error::InitSegment {
            function: function.into(),
            reason,
        };
        if (1usize << log_size) > MAX_CMD_SLOTS {
            return Err(bad(format!(
                "log_cmdq_size {log_size} means more than {MAX_CMD_SLOTS} command slots"
            )));
        }
        if log_size + log_stride > 12 {
            return Err(bad(format!(
                "log_cmdq_size {log_size} + log_cmdq_stride {log_stride} exceed one 4 KiB page"
            )));
        }
        if (1usize << log_stride) < ENTRY_BYTES {
            return Err(bad(format!(
                "log_cmdq_stride {log_stride} is smaller than a 64-byte entry"
            )));
        }
        Ok(CmdqGeometry {
            log_size,
            log_stride,
        })
    }

    /// Number of slots.
    pub fn slots(&self) -> usize {
        1 << self.log_size
    }
}

fn bar_err(e: rnic_dma::DmaError) -> Mlx5Error {
    Mlx5Error::Bar(e)
}

impl CmdQueue {
    /// Set up the command queue (§3 step 3, §4.3): read the geometry,
    /// allocate one zeroed 4 KiB-aligned page, write its address high dword
    /// then low dword (low 12 bits zero). The caller waits for
    /// `initializing` afterwards (§3 step 4).
    pub fn new(
        function: Arc<dyn PciFunction>,
        options: CmdQueueOptions,
    ) -> Result<CmdQueue, Mlx5Error> {
        let name = function.name().to_string();
        let bar = function.bar0();
        let addr_l = initial_seg::cmdq_phy_addr_31_12;
        let addr_h = initial_seg::cmdq_phy_addr_63_32;
        let sizes = bar.read32_be(addr_l.dword_offset()).map_err(bar_err)?;
        let geometry = CmdqGeometry::from_register(&name, sizes)?;
        let page = function.alloc_dma(CMDQ_PAGE_BYTES)?;
        let iova = page.iova().get();
        if !iova.is_multiple_of(CMDQ_PAGE_BYTES as u64) {
            return Err(Mlx5Error::InitSegment {
                function: name,
                reason: format!("command queue page at IOVA {iova:#x} is not 4 KiB aligned"),
            });
        }
        let timeout = match options.timeout {
            Some(t) => t,
            None => Self::iseg_timeout(function.as_ref())?,
        };
        bar.write32_be(addr_h.dword_offset(), (iova >> 32) as u32)
            .map_err(bar_err)?;
        // Low dword: address bits 31:12, the low 12 bits (read-only size and
        // stride, NIC state) written as zero (§3 step 3).
        bar.write32_be(addr_l.dword_offset(), addr_l.insert(0, (iova as u32) >> 12))
            .map_err(bar_err)?;
        info!(
            function = %name, iova = %page.iova(), slots = geometry.slots(),
            stride = 1u32 << geometry.log_stride, ?timeout,
            "command queue set up"
        );
        Ok(CmdQueue {
            function,
            page,
            log_stride: geometry.log_stride,
            timeout,
            page_slot: (geometry.slots() > 1).then(|| geometry.slots() - 1),
            regular: Mutex::new(()),
            paging: Mutex::new(()),
            state: Mutex::new(State {
                token: 0,
                slots: (0..geometry.slots()).map(|_| Slot::default()).collect(),
                executed: 0,
                mismatches: 0,
                events: None,
            }),
        })
    }

    fn iseg_timeout(function: &dyn PciFunction) -> Result<Duration, Mlx5Error> {
        let init_to = read_iseg(function, &initial_seg::cmd_q_init_to)?;
        let exec_to = read_iseg(function, &initial_seg::cmd_exec_to)?;
        let default = Duration::from_millis(default_timeout_ms::CMD);
        if init_to == 0 {
            return Ok(default);
        }
        Ok(decode_timeout(exec_to).unwrap_or(default))
    }

    /// The per-command timeout in force.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Number of slots.
    pub fn slots(&self) -> usize {
        lock(&self.state).slots.len()
    }

    /// Slots still owned by the device after a timeout.
    pub fn stuck_slots(&self) -> usize {
        let mut st = lock(&self.state);
        self.reclaim(&mut st);
        st.slots.iter().filter(|s| s.stuck.is_some()).count()
    }

    /// Commands completed (any status).
    pub fn executed(&self) -> u64 {
        lock(&self.state).executed
    }

    /// Reply fields the device changed that the kernel does not check
    /// (entry token, output length, output block token or number), counted
    /// over every completed command; each is logged ([`ReplyMismatch`]).
    pub fn reply_mismatches(&self) -> u64 {
        lock(&self.state).mismatches
    }

    /// The slot reserved for MANAGE_PAGES, if the queue has more than one.
    pub fn page_slot(&self) -> Option<usize> {
        self.page_slot
    }

    /// The command queue page's IOVA.
    pub fn page_iova(&self) -> rnic_core::Iova {
        self.page.iova()
    }

    fn entry_offset(&self, slot: usize) -> usize {
        slot << self.log_stride
    }

    fn owned_by_hw(&self, slot: usize) -> Result<bool, Mlx5Error> {
        let mut b = [0u8; 1];
        self.page
            .read(self.entry_offset(slot) + STATUS_OWN, &mut b)
            .map_err(dma("command entry status_own"))?;
        Ok(cmd_queue_entry::ownership.extract(u32::from(b[0])) != 0)
    }

    /// Give back slots whose timed-out command the device has finished.
    fn reclaim(&self, st: &mut State) {
        for (i, slot) in st.slots.iter_mut().enumerate() {
            let Some(stuck) = &slot.stuck else { continue };
            match self.owned_by_hw(i) {
                Ok(false) => {
                    info!(
                        slot = i, opcode = %stuck.opcode, token = stuck.token,
                        after = ?stuck.since.elapsed(),
                        "the device returned a timed-out command slot; its late output is discarded"
                    );
                    slot.stuck = None;
                }
                Ok(true) => {}
                Err(e) => warn!(slot = i, %e, "cannot read a stuck slot's ownership"),
            }
        }
    }

    fn mailbox(
        function: &dyn PciFunction,
        have: &mut Option<Arc<DmaBuffer>>,
        blocks: usize,
    ) -> Result<Option<Arc<DmaBuffer>>, Mlx5Error> {
        if blocks == 0 {
            return Ok(None);
        }
        let need = blocks * BLOCK_STRIDE;
        match have {
            Some(buf) if buf.len() >= need => {}
            _ => {
                *have = Some(function.alloc_dma(need.next_multiple_of(CMDQ_PAGE_BYTES))?);
            }
        }
        Ok(have.clone())
    }

    /// Complete commands by EQE (`Some`) or by polling ownership (`None`).
    pub(crate) fn set_events(&self, events: Option<Arc<dyn CommandEvents>>) {
        lock(&self.state).events = events;
    }

    /// Whether commands complete by event.
    pub fn event_mode(&self) -> bool {
        lock(&self.state).events.is_some()
    }

    /// Execute one command and wait for it (polling, or by its completion
    /// EQE once the event queue exists). `input` is the whole
    /// command input (at least the 8-byte header, whose opcode and op_mod
    /// this sets); `out_len` the whole output length (at least 8). The
    /// output comes back only with command status OK.
    pub fn exec(
        &self,
        opcode: CmdOpcode,
        op_mod: u16,
        input: &[u8],
        out_len: usize,
    ) -> Result<Vec<u8>, Mlx5Error> {
        let bad = |reason: String| Mlx5Error::CommandInput { opcode, reason };
        if !(MboxIn::<&[u8]>::SIZE_BYTES..=MAX_COMMAND_BYTES).contains(&input.len()) {
            return Err(bad(format!(
                "input of {} bytes: a command input is {}..={MAX_COMMAND_BYTES} bytes",
                input.len(),
                MboxIn::<&[u8]>::SIZE_BYTES
            )));
        }
        if !(MboxOut::<&[u8]>::SIZE_BYTES..=MAX_COMMAND_BYTES).contains(&out_len) {
            return Err(bad(format!(
                "output of {out_len} bytes: a command output is {}..={MAX_COMMAND_BYTES} bytes",
                MboxOut::<&[u8]>::SIZE_BYTES
            )));
        }
        let mut input = input.to_vec();
        let mut head = MboxIn::new_checked(&mut input[..]).map_err(prm("command header"))?;
        head.set_opcode(opcode.as_raw().into())
            .map_err(prm("command header"))?;
        head.set_op_mod(op_mod.into())
            .map_err(prm("command header"))?;

        // One regular command at a time on the regular slots; a page command
        // on the reserved slot beside it (module docs).
        let reserved = self.page_slot.is_some() && opcode == CmdOpcode::ManagePages;
        let _turn = lock(if reserved {
            &self.paging
        } else {
            &self.regular
        });
        let flight = self.post(opcode, op_mod, &input, out_len, reserved)?;
        self.complete(flight)
    }

    /// Choose a slot, write the mailboxes and the entry, hand it to the
    /// device and ring (§4.3 steps 1–5), under the state lock.
    fn post(
        &self,
        opcode: CmdOpcode,
        op_mod: u16,
        input: &[u8],
        out_len: usize,
        reserved: bool,
    ) -> Result<InFlight, Mlx5Error> {
        let mut st = lock(&self.state);
        self.reclaim(&mut st);
        let slots = st.slots.len();
        let free = |i: &usize| st.slots[*i].stuck.is_none();
        let slot = match self.page_slot {
            Some(p) if reserved => Some(p).filter(free),
            Some(p) => (0..p).find(free),
            None => (0..slots).find(free),
        }
        .ok_or(Mlx5Error::NoCommandSlot { opcode, slots })?;
        st.token = next_token(st.token);
        let token = st.token;
        let (in_blocks, out_blocks) = (blocks_for(input.len()), blocks_for(out_len));
        let function = self.function.as_ref();
        let inbox = Self::mailbox(function, &mut st.slots[slot].inbox, in_blocks)?;
        let outbox = Self::mailbox(function, &mut st.slots[slot].outbox, out_blocks)?;
        let posted = Posted {
            opcode,
            op_mod,
            token,
            in_len: input.len() as u32,
            out_len: out_len as u32,
            in_chain: inbox.as_ref().map_or(0, |b| b.iova().get()),
            out_chain: outbox.as_ref().map_or(0, |b| b.iova().get()),
        };

        // 1. Mailboxes and the entry, ownership still 0.
        if let Some(buf) = &inbox {
            let mut chain = vec![0u8; in_blocks * BLOCK_STRIDE];
            let rest = input.get(CMD_INLINE_BYTES..).unwrap_or(&[]);
            encode_chain(opcode, &mut chain, posted.in_chain, rest, in_blocks, token)?;
            buf.write(0, &chain).map_err(dma("input mailboxes"))?;
        }
        if let Some(buf) = &outbox {
            let mut chain = vec![0u8; out_blocks * BLOCK_STRIDE];
            encode_chain(opcode, &mut chain, posted.out_chain, &[], out_blocks, token)?;
            buf.write(0, &chain).map_err(dma("output mailboxes"))?;
        }
        let mut entry = [0u8; ENTRY_BYTES];
        encode_entry(&mut entry, input, &posted)?;
        let at = self.entry_offset(slot);
        self.page
            .write(at, &entry[..STATUS_OWN])
            .map_err(dma("command entry"))?;
        self.page
            .write(at + STATUS_OWN, &[0])
            .map_err(dma("command entry"))?;
        // 2.-3. Descriptor and mailboxes before the ownership bit.
        dma_wmb_before_doorbell();
        let own = cmd_queue_entry::ownership.insert(0, 1) as u8;
        self.page
            .write(at + STATUS_OWN, &[own])
            .map_err(dma("command entry ownership"))?;
        let events = st.events.clone();
        if let Some(ev) = &events {
            ev.begin(slot);
        }
        // 4.-5. Ownership before the doorbell.
        dma_wmb_before_doorbell();
        debug!(%opcode, op_mod, slot, token, in_len = input.len(), out_len, "command posted");
        self.function
            .bar0()
            .write32_be(
                initial_seg::command_doorbell_vector.dword_offset(),
                1 << slot,
            )
            .map_err(bar_err)?;
        Ok(InFlight {
            slot,
            posted,
            outbox,
            events,
            start: Instant::now(),
        })
    }

    /// Wait for a posted command (§4.3 step 6: its completion EQE in events
    /// mode, then ownership back — the EQE alone is not trusted) without
    /// the state lock, then decode it.
    fn complete(&self, flight: InFlight) -> Result<Vec<u8>, Mlx5Error> {
        let InFlight {
            slot,
            posted,
            outbox,
            events,
            start,
        } = flight;
        let opcode = posted.opcode;
        let mut spins = 0u32;
        let mut eqe_seen = false;
        while events.is_some() && !eqe_seen || self.owned_by_hw(slot)? {
            if let Some(ev) = events.as_ref().filter(|_| !eqe_seen) {
                let left = self.timeout.saturating_sub(start.elapsed());
                eqe_seen = ev.wait_command(slot, left.min(Duration::from_millis(2)));
            }
            let waited = start.elapsed();
            if waited >= self.timeout {
                let health = crate::firmware::health::Health::read(self.function.as_ref());
                warn!(
                    %opcode, slot, token = posted.token, after = ?waited, ?health,
                    "command timed out; slot reserved until the device returns it"
                );
                lock(&self.state).slots[slot].stuck = Some(Stuck {
                    opcode,
                    token: posted.token,
                    since: start,
                });
                return Err(Mlx5Error::CommandTimeout {
                    opcode,
                    slot,
                    after: waited,
                });
            }
            if events.is_some() && !eqe_seen {
                continue;
            }
            spins = spins.saturating_add(1);
            if spins < 200 {
                std::hint::spin_loop();
            } else if spins < 2_000 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
        dma_rmb_after_owner_bit();
        let mut done = [0u8; ENTRY_BYTES];
        self.page
            .read(self.entry_offset(slot), &mut done)
            .map_err(dma("completed command entry"))?;
        let mut chain = vec![0u8; blocks_for(posted.out_len as usize) * BLOCK_STRIDE];
        if let Some(buf) = &outbox {
            buf.read(0, &mut chain).map_err(dma("output mailboxes"))?;
        }
        let result = decode_reply(&done, &chain, &posted);
        {
            let mut st = lock(&self.state);
            st.executed += 1;
            if let Ok(d) = &result {
                st.mismatches += d.mismatches.len() as u64;
            }
        }
        match result {
            Ok(d) => {
                for m in &d.mismatches {
                    warn!(
                        %opcode, slot, what = %m.what, posted = m.posted, found = m.found,
                        "the device changed a reply field the kernel does not check; counted, \
                         output used"
                    );
                }
                debug!(%opcode, slot, after = ?start.elapsed(), "command done");
                Ok(d.out)
            }
            Err(e) => {
                debug!(%opcode, slot, %e, "command failed");
                Err(e)
            }
        }
    }
}

/// A command handed to the device, not yet completed.
struct InFlight {
    slot: usize,
    posted: Posted,
    outbox: Option<Arc<DmaBuffer>>,
    events: Option<Arc<dyn CommandEvents>>,
    start: Instant,
}

#[cfg(test)]
mod tests {
    use super::*;
    use rnic_mlx5_prm::{QueryHcaCapIn, SetHcaCapIn};

    fn posted(in_len: usize, out_len: usize, token: u8) -> Posted {
        Posted {
            opcode: CmdOpcode::SetHcaCap,
            op_mod: 0,
            token,
            in_len: in_len as u32,
            out_len: out_len as u32,
            in_chain: if blocks_for(in_len) > 0 {
                0x1_2345_6000
            } else {
                0
            },
            out_chain: if blocks_for(out_len) > 0 {
                0x7_0000_0400
            } else {
                0
            },
        }
    }

    #[test]
    fn block_counts_and_tokens() {
        assert_eq!(blocks_for(0), 0);
        assert_eq!(blocks_for(16), 0);
        assert_eq!(blocks_for(17), 1);
        assert_eq!(blocks_for(16 + 512), 1);
        assert_eq!(blocks_for(16 + 513), 2);
        assert_eq!(blocks_for(0x1010), 8);
        assert_eq!(next_token(0), 1);
        assert_eq!(next_token(1), 2);
        assert_eq!(next_token(255), 1, "never 0");
        let mut t = 0;
        for _ in 0..1000 {
            t = next_token(t);
            assert_ne!(t, 0);
        }
    }

    #[test]
    fn timeouts_decode_per_section_2() {
        assert_eq!(decode_timeout(0), None);
        assert_eq!(decode_timeout(500), Some(Duration::from_millis(500)));
        assert_eq!(decode_timeout((1 << 29) | 7), Some(Duration::from_secs(7)));
        assert_eq!(
            decode_timeout((2 << 29) | 2),
            Some(Duration::from_secs(120))
        );
        assert_eq!(
            decode_timeout((3 << 29) | 1),
            Some(Duration::from_secs(3600))
        );
        // Bits outside value and multiplier are ignored.
        assert_eq!(
            decode_timeout(0x8000_0000 | (1 << 29) | 3),
            Some(Duration::from_secs(3))
        );
    }

    #[test]
    fn geometry_is_checked_like_section_3() {
        let g = CmdqGeometry::from_register("t", 0x56).unwrap();
        assert_eq!((g.log_size, g.log_stride, g.slots()), (5, 6, 32));
        assert!(CmdqGeometry::from_register("t", 0x66).is_err(), "64 slots");
        assert!(
            CmdqGeometry::from_register("t", 0x57).is_ok(),
            "32 x 128 = 4 KiB"
        );
        assert!(CmdqGeometry::from_register("t", 0x49).is_err(), "> 4 KiB");
        assert!(
            CmdqGeometry::from_register("t", 0x05).is_err(),
            "32-byte stride"
        );
        // Address bits above the low byte do not matter.
        assert_eq!(
            CmdqGeometry::from_register("t", 0xabcd_e056)
                .unwrap()
                .slots(),
            32
        );
    }

    #[test]
    fn entry_golden_bytes_inline_split_at_16() {
        // A 0x1010-byte SET_HCA_CAP: 16 bytes inline, 8 blocks.
        let mut input = vec![0u8; 0x1010];
        let mut cmd = SetHcaCapIn::new_checked(&mut input[..]).unwrap();
        cmd.set_opcode(0x109).unwrap();
        cmd.set_op_mod(0x8).unwrap();
        for (i, b) in input.iter_mut().enumerate().skip(8) {
            *b = i as u8;
        }
        let p = posted(input.len(), 0x10, 0x5a);
        let mut e = [0xffu8; 64];
        encode_entry(&mut e, &input, &p).unwrap();
        // mlx5.md §4.1 offsets, byte by byte.
        assert_eq!(e[0x00], 0x07, "type");
        assert_eq!(e[0x01..0x04], [0, 0, 0]);
        assert_eq!(e[0x04..0x08], 0x1010u32.to_be_bytes(), "inlen");
        assert_eq!(e[0x08..0x10], 0x1_2345_6000u64.to_be_bytes(), "in_ptr");
        assert_eq!(e[0x10..0x20], input[..16], "first 16 input bytes inline");
        assert_eq!(e[0x10..0x14], [0x01, 0x09, 0, 0], "opcode in dw0 [31:16]");
        assert_eq!(e[0x20..0x30], [0; 16], "output zeroed");
        assert_eq!(e[0x30..0x38], [0; 8], "no output chain for 16 bytes");
        assert_eq!(e[0x38..0x3c], 0x10u32.to_be_bytes(), "outlen");
        assert_eq!(e[0x3c], 0x5a, "token");
        assert_eq!(e[0x3f], 0, "ownership is set last, by the queue");
        // The signature makes the XOR of the final entry (status_own = 1) 0xff.
        let mut fin = e;
        fin[0x3f] = 1;
        assert_eq!(fin.iter().fold(0u8, |a, b| a ^ b), 0xff);
    }

    #[test]
    fn chain_of_three_blocks_golden_bytes() {
        // 16 inline + 1100 bytes = 3 blocks (512, 512, 76).
        let data: Vec<u8> = (0..1100u32).map(|i| (i * 7 + 3) as u8).collect();
        let base = 0x4_0000_0000u64 + 0x2000;
        let mut chain = vec![0xeeu8; 3 * BLOCK_STRIDE];
        encode_chain(CmdOpcode::Nop, &mut chain, base, &data, 3, 0x33).unwrap();
        for i in 0..3 {
            let b = &chain[i * BLOCK_STRIDE..i * BLOCK_STRIDE + 576];
            // mlx5.md §4.2 offsets.
            let lo = i * 512;
            let hi = (lo + 512).min(1100);
            assert_eq!(b[..hi - lo], data[lo..hi], "block {i} data");
            assert!(b[hi - lo..0x200].iter().all(|&x| x == 0), "padding zero");
            assert!(b[0x200..0x230].iter().all(|&x| x == 0), "reserved zero");
            let next = if i < 2 {
                base + (i as u64 + 1) * 1024
            } else {
                0
            };
            assert_eq!(b[0x230..0x238], next.to_be_bytes(), "block {i} next");
            assert_eq!(b[0x238..0x23c], (i as u32).to_be_bytes(), "block_num");
            assert_eq!(b[0x23c], 0);
            assert_eq!(b[0x23d], 0x33, "token");
            assert_eq!(b[0x23e], signature(&b[0x200..0x23e]), "ctrl_sig");
            assert_eq!(b[0x23f], signature(&b[..0x23f]), "sig");
            // Either signature makes its range XOR to 0xff.
            assert_eq!(b[0x200..0x23f].iter().fold(0u8, |a, x| a ^ x), 0xff);
            assert_eq!(b.iter().fold(0u8, |a, x| a ^ x), 0xff);
        }
        // The views agree with the raw offsets.
        let v = CmdIfBox::new_checked(&chain[1024..]).unwrap();
        assert_eq!(v.block_number(), 1);
        assert_eq!(v.token(), 0x33);
        assert_eq!(
            (u64::from(v.next_pointer_63_32()) << 32) | (u64::from(v.next_pointer_31_10()) << 10),
            base + 2048
        );
        assert!(
            encode_chain(CmdOpcode::Nop, &mut chain, base + 512, &data, 3, 1).is_err(),
            "unaligned"
        );
        assert!(
            encode_chain(CmdOpcode::Nop, &mut chain, base, &data, 4, 1).is_err(),
            "staging buffer too short"
        );
    }

    /// An entry and output chain as a device would leave them.
    fn complete(p: &Posted, out: &[u8], delivery: u8) -> ([u8; 64], Vec<u8>) {
        let mut e = [0u8; 64];
        encode_entry(&mut e, &[0u8; 16], p).unwrap();
        let n = out.len().min(16);
        e[0x20..0x20 + n].copy_from_slice(&out[..n]);
        e[0x3f] = delivery << 1;
        let blocks = blocks_for(p.out_len as usize);
        let mut chain = vec![0u8; blocks * BLOCK_STRIDE];
        encode_chain(
            p.opcode,
            &mut chain,
            p.out_chain,
            out.get(16..).unwrap_or(&[]),
            blocks,
            p.token,
        )
        .unwrap();
        (e, chain)
    }

    #[test]
    fn reply_is_assembled_from_inline_and_blocks() {
        let p = posted(0x10, 0x1010, 9);
        let mut out: Vec<u8> = (0..0x1010u32).map(|i| (i % 251) as u8).collect();
        out[0] = 0;
        out[4..8].copy_from_slice(&[0; 4]);
        let (e, chain) = complete(&p, &out, 0);
        let d = decode_reply(&e, &chain, &p).unwrap();
        assert_eq!(d.out, out);
        assert!(d.mismatches.is_empty());
    }

    #[test]
    fn reply_errors_are_typed() {
        let p = posted(0x10, 0x20, 9);
        let mut out = vec![0u8; 0x20];
        out[0] = 0x02; // BAD_OP
        out[4..8].copy_from_slice(&0x1234_5678u32.to_be_bytes());
        let (e, chain) = complete(&p, &out, 0);
        let err = decode_reply(&e, &chain, &p).unwrap_err();
        assert!(matches!(
            err,
            Mlx5Error::Command {
                status: CmdStatus::BadOp,
                syndrome: 0x1234_5678,
                ..
            }
        ));
        assert!(err.to_string().contains("BAD_OP"), "{err}");

        let (e, chain) = complete(&p, &[0u8; 0x20], 0x02);
        assert!(matches!(
            decode_reply(&e, &chain, &p),
            Err(Mlx5Error::Delivery {
                status: DeliveryStatus::TokenErr,
                ..
            })
        ));

        // Audit row 14: fields the kernel does not check are counted, the
        // output still used (K core/cmd.c:307-330 checks only the statuses).
        let (mut e, chain) = complete(&p, &[0u8; 0x20], 0);
        e[0x3c] = 10;
        let d = decode_reply(&e, &chain, &p).unwrap();
        assert_eq!(
            d.mismatches,
            vec![ReplyMismatch {
                what: "entry token".into(),
                posted: 9,
                found: 10
            }]
        );

        let (mut e, chain) = complete(&p, &[0u8; 0x20], 0);
        e[0x38..0x3c].copy_from_slice(&0x10_0000u32.to_be_bytes());
        let d = decode_reply(&e, &chain, &p).unwrap();
        assert_eq!(d.out.len(), 0x20, "the driver's own output length");
        assert_eq!(d.mismatches[0].found, 0x10_0000);

        let out: Vec<u8> = (0..0x20u8).map(|b| if b < 8 { 0 } else { b }).collect();
        let (e, mut chain) = complete(&p, &out, 0);
        chain[0x23d] = 8;
        chain[0x23b] = 5;
        let d = decode_reply(&e, &chain, &p).unwrap();
        assert_eq!(d.out, out, "the block's data is used");
        let what: Vec<_> = d.mismatches.iter().map(|m| m.what.as_str()).collect();
        assert_eq!(what, ["output block 0 token", "output block 0 number"]);
        // A chain shorter than the output (never the case from exec) is an
        // error, not a panic.
        let (e, _) = complete(&p, &[0u8; 0x20], 0);
        assert!(decode_reply(&e, &[], &p).is_err());
        assert!(decode_reply(&[0u8; 10], &[], &p).is_err());
    }

    #[test]
    fn header_views_match_section_4_3() {
        let mut buf = [0u8; 16];
        let mut q = QueryHcaCapIn::new_checked(&mut buf[..]).unwrap();
        q.set_opcode(0x100).unwrap();
        q.set_op_mod(0x9).unwrap();
        assert_eq!(buf[..8], [0x01, 0x00, 0, 0, 0, 0, 0, 0x09]);
    }
}
