//! The command-queue transport (mlx5.md §4): fetch an entry through DMA, gather its input
//! from the 16 inline bytes and the input mailbox chain, validate the output chain, and
//! deliver the output — data first, the entry's status/ownership byte last.
//!
//! A broken transport (chain, pointers, lengths, descriptor type) is a *delivery* status in
//! the entry (`status_own` bits 7:1), never a command status: the command is not executed.
//! Signatures (`signature`, `ctrl_signature`) are not verified: this firmware reports
//! `cmdif_checksum` = 0 as both current and max, and mlx5.md §4.2 says they are checked only
//! when checksums are enabled.

use std::sync::atomic::{Ordering, fence};

use rnic_mlx5_prm::{
    CMD_INLINE_BYTES, CMD_TYPE_PCIE, CmdIfBox, CmdQueueEntry, DeliveryStatus, MAILBOX_ALIGN,
    MAILBOX_DATA_BYTES, MboxIn, cmd_if_box, cmd_queue_entry,
};

use crate::device::Device;

/// Bytes of a command queue entry.
pub const ENTRY_BYTES: usize = cmd_queue_entry::SIZE_BYTES;
/// Bytes of a mailbox block (576).
pub const BLOCK_BYTES: usize = cmd_if_box::SIZE_BYTES;
/// The longest input or output this firmware gathers (1 MiB; mlx5.md is silent). Longer is a
/// delivery `InputLenErr`/`OutputLenErr`.
pub const MAX_CMD_BYTES: usize = 1 << 20;

/// Why a rung slot was not processed at all (nothing is written back).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ignored {
    /// The driver has not written the command queue address yet.
    NoQueue,
    /// The entry itself could not be read through DMA.
    EntryUnreadable,
    /// The entry's ownership bit says software owns it (hardware ignores such a ring).
    NotOwned,
}

/// A fetched command, ready to execute.
#[derive(Debug)]
pub struct Command {
    /// The slot.
    pub slot: u32,
    /// IOVA of its entry.
    pub entry_iova: u64,
    /// The entry's token.
    pub token: u8,
    /// The opcode, from the inline input bytes (present whatever `inlen` says).
    pub opcode: u16,
    /// `inlen` bytes of input.
    pub input: Vec<u8>,
    /// `outlen`.
    pub outlen: usize,
    /// IOVAs of the output mailbox blocks, in chain order.
    out_blocks: Vec<u64>,
}

/// What fetching a slot gave.
#[derive(Debug)]
pub enum Fetch {
    /// Nothing to do (counted by the caller).
    Ignored(Ignored),
    /// A transport error: complete the entry with this delivery status.
    Refused {
        /// The entry.
        entry_iova: u64,
        /// The delivery status.
        status: DeliveryStatus,
    },
    /// A well-formed command.
    Ready(Command),
}

fn mailbox_pointer(hi: u32, lo_bits: u32, shift: u32) -> u64 {
    (u64::from(hi) << 32) | (u64::from(lo_bits) << shift)
}

/// Walk `n` blocks from `first`: block numbers 0, 1, …, every token = `token`, each block
/// 1 KiB aligned (the next pointer is by construction). Returns the block IOVAs and, if
/// `data` is given, fills it with the blocks' data bytes.
fn walk_chain(
    dev: &Device,
    first: u64,
    n: usize,
    token: u8,
    mut data: Option<&mut [u8]>,
    unaligned: DeliveryStatus,
) -> Result<Vec<u64>, DeliveryStatus> {
    if !first.is_multiple_of(MAILBOX_ALIGN as u64) {
        return Err(unaligned);
    }
    let mut blocks = Vec::with_capacity(n);
    let mut at = first;
    let mut raw = [0u8; BLOCK_BYTES];
    for k in 0..n {
        if dev.dma_read(at, &mut raw).is_err() {
            return Err(DeliveryStatus::FwInternalErr);
        }
        let b = CmdIfBox::new_unchecked(&raw[..]);
        if b.block_number() as usize != k {
            return Err(DeliveryStatus::BadBlockNumber);
        }
        if b.token() != u32::from(token) {
            return Err(DeliveryStatus::TokenErr);
        }
        if let Some(d) = data.as_deref_mut() {
            let from = k * MAILBOX_DATA_BYTES;
            let len = (d.len() - from).min(MAILBOX_DATA_BYTES);
            d[from..from + len].copy_from_slice(&b.mailbox_data()[..len]);
        }
        blocks.push(at);
        at = mailbox_pointer(b.next_pointer_63_32(), b.next_pointer_31_10(), 10);
    }
    Ok(blocks)
}

fn blocks_for(len: usize) -> usize {
    len.saturating_sub(CMD_INLINE_BYTES)
        .div_ceil(MAILBOX_DATA_BYTES)
}

/// Fetch slot `slot` of the queue at `base` (entries `1 << log_stride` bytes apart).
pub fn fetch(dev: &Device, base: u64, log_stride: u32, slot: u32) -> Fetch {
    let entry_iova = base + (u64::from(slot) << log_stride);
    let mut raw = [0u8; ENTRY_BYTES];
    if dev.dma_read(entry_iova, &mut raw).is_err() {
        return Fetch::Ignored(Ignored::EntryUnreadable);
    }
    let e = CmdQueueEntry::new_unchecked(&raw[..]);
    if e.ownership() != 1 {
        return Fetch::Ignored(Ignored::NotOwned);
    }
    let refuse = |status| Fetch::Refused { entry_iova, status };
    if e.r#type() != CMD_TYPE_PCIE {
        return refuse(DeliveryStatus::BadCmdType);
    }
    let inlen = e.input_length() as usize;
    let outlen = e.output_length() as usize;
    if inlen > MAX_CMD_BYTES {
        return refuse(DeliveryStatus::InputLenErr);
    }
    if outlen > MAX_CMD_BYTES {
        return refuse(DeliveryStatus::OutputLenErr);
    }
    // The token is 8 bits wide: the getter cannot exceed u8.
    let token = e.token() as u8;
    let mut input = vec![0u8; inlen];
    let inline = inlen.min(CMD_INLINE_BYTES);
    input[..inline].copy_from_slice(&e.command_input_inline_data()[..inline]);
    if inlen > CMD_INLINE_BYTES {
        let first = mailbox_pointer(
            e.input_mailbox_pointer_63_32(),
            e.input_mailbox_pointer_31_9(),
            9,
        );
        if let Err(s) = walk_chain(
            dev,
            first,
            blocks_for(inlen),
            token,
            Some(&mut input[CMD_INLINE_BYTES..]),
            DeliveryStatus::InputPointerNotAligned,
        ) {
            return refuse(s);
        }
    }
    let mut out_blocks = Vec::new();
    if outlen > CMD_INLINE_BYTES {
        let first = mailbox_pointer(
            e.output_mailbox_pointer_63_32(),
            e.output_mailbox_pointer_31_9(),
            9,
        );
        match walk_chain(
            dev,
            first,
            blocks_for(outlen),
            token,
            None,
            DeliveryStatus::OutputPointerNotAligned,
        ) {
            Ok(b) => out_blocks = b,
            Err(s) => return refuse(s),
        }
    }
    let opcode = MboxIn::new_unchecked(e.command_input_inline_data()).opcode();
    Fetch::Ready(Command {
        slot,
        entry_iova,
        token,
        // A 16-bit field.
        opcode: opcode as u16,
        input,
        outlen,
        out_blocks,
    })
}

/// Write the status byte: delivery status, ownership back to software. The last write of a
/// command, after a release fence (everything before it is visible first).
pub fn finish(dev: &Device, entry_iova: u64, status: DeliveryStatus) {
    let mut raw = [0u8; ENTRY_BYTES];
    let mut e = CmdQueueEntry::new_unchecked(&mut raw[..]);
    // 7-bit status: every DeliveryStatus value fits (the largest is 0x10).
    let _ = e.set_status(u32::from(status.as_raw()));
    let _ = e.set_ownership(0);
    let at = cmd_queue_entry::ownership.byte_offset();
    fence(Ordering::Release);
    if let Err(f) = dev.dma_write(entry_iova + at as u64, &raw[at..=at]) {
        tracing::warn!(%f, "completing a command entry failed (entry unmapped?)");
    }
}

/// Which reply fields a fault hook rewrites ([`crate::Faults::rewrite_next_reply`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplyRewrite {
    /// Each output block's `token` becomes the command's token XOR 0xff.
    pub mailbox_tokens: bool,
    /// Each output block's `block_number` becomes its index + 1.
    pub block_numbers: bool,
    /// The entry's `token` becomes the command's token XOR 0xff.
    pub entry_token: bool,
}

/// Deliver `output` (at least 16 bytes; bytes past `outlen` are not sent): the output
/// mailboxes' data areas (their headers stay as the driver wrote them unless `rewrite` says
/// otherwise), then the 16 inline output bytes of the entry. A DMA fault on the way is a
/// delivery `FwInternalErr`. The entry stays the firmware's until [`finish`] writes the
/// returned status byte.
pub fn reply(
    dev: &Device,
    cmd: &Command,
    output: &[u8],
    rewrite: Option<ReplyRewrite>,
) -> DeliveryStatus {
    let status = deliver(dev, cmd, output);
    if let Some(how) = rewrite
        && status == DeliveryStatus::Ok
        && !rewrite_headers(dev, cmd, how)
    {
        return DeliveryStatus::FwInternalErr;
    }
    status
}

/// Write the reply fields `how` names (before the status byte); `false` on a DMA fault.
fn rewrite_headers(dev: &Device, cmd: &Command, how: ReplyRewrite) -> bool {
    let other = cmd.token ^ 0xff;
    for (k, &block) in cmd.out_blocks.iter().enumerate() {
        if how.block_numbers {
            let at = block + cmd_if_box::block_number.byte_offset() as u64;
            // Block numbers are 32-bit big-endian; k < 2049 (1 MiB of 512-byte blocks).
            if dev.dma_write(at, &(k as u32 + 1).to_be_bytes()).is_err() {
                return false;
            }
        }
        if how.mailbox_tokens {
            let at = block + cmd_if_box::token.byte_offset() as u64;
            if dev.dma_write(at, &[other]).is_err() {
                return false;
            }
        }
    }
    if how.entry_token {
        let at = cmd.entry_iova + cmd_queue_entry::token.byte_offset() as u64;
        if dev.dma_write(at, &[other]).is_err() {
            return false;
        }
    }
    true
}

fn deliver(dev: &Device, cmd: &Command, output: &[u8]) -> DeliveryStatus {
    let tail = output
        .get(CMD_INLINE_BYTES..cmd.outlen.max(CMD_INLINE_BYTES))
        .unwrap_or(&[]);
    for (chunk, &block) in tail.chunks(MAILBOX_DATA_BYTES).zip(&cmd.out_blocks) {
        let at = block + cmd_if_box::mailbox_data.byte_offset() as u64;
        if dev.dma_write(at, chunk).is_err() {
            return DeliveryStatus::FwInternalErr;
        }
    }
    let at = cmd_queue_entry::command_output_inline_data.byte_offset();
    let inline = output.get(..CMD_INLINE_BYTES).unwrap_or(&[]);
    fence(Ordering::Release);
    if dev.dma_write(cmd.entry_iova + at as u64, inline).is_err() {
        return DeliveryStatus::FwInternalErr;
    }
    DeliveryStatus::Ok
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_counts_follow_mlx5_md() {
        assert_eq!(blocks_for(0), 0);
        assert_eq!(blocks_for(16), 0);
        assert_eq!(blocks_for(17), 1);
        assert_eq!(blocks_for(16 + 512), 1);
        assert_eq!(blocks_for(16 + 513), 2);
        assert_eq!(
            blocks_for(0x1010),
            8,
            "QUERY_HCA_CAP output: 4080 bytes in 8 blocks"
        );
        assert_eq!(BLOCK_BYTES, 576);
        assert_eq!(ENTRY_BYTES, 64);
    }
}
