//! The send and receive rings, preallocated at QP creation, and the
//! scatter/gather copies over them.
//!
//! Both rings are power-of-two arrays indexed by free-running `u32`
//! counters (`& mask`, `wrapping_add`). A WQE's SGEs live in a flat array at
//! `slot * max_sge`, its inline bytes at `slot * max_inline`, so posting
//! copies into memory that already exists.

use rnic_core::{AddressVector, PdHandle, Psn, Qpn, SendFlags, SendOp, Sge, UdDest, WcStatus};

use super::qp::KeyPiece;
use super::{Access, MemError, MemKey, MemoryAccess};

/// Where a send WQE is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WqeStatus {
    /// Posted, no PSN yet.
    Posted,
    /// PSNs assigned; packets (being) sent.
    Started,
    /// Failed locally before or while starting; the completer fails it in order.
    Failed(WcStatus),
}

/// Where a UD send goes, as the engine keeps it (the address handle's
/// vector copied out at post time).
#[derive(Clone, Copy, Debug)]
pub(crate) struct UdTarget {
    pub av: AddressVector,
    pub remote_qpn: Qpn,
    pub remote_qkey: u32,
}

impl From<&UdDest> for UdTarget {
    fn from(d: &UdDest) -> UdTarget {
        UdTarget {
            av: d.av,
            remote_qpn: d.remote_qpn,
            remote_qkey: d.remote_qkey,
        }
    }
}

/// One send work request as the engine keeps it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SendWqe {
    pub wr_id: u64,
    pub op: SendOp,
    /// Destination of a UD send.
    pub ud: Option<UdTarget>,
    pub flags: SendFlags,
    /// Completion wanted on success.
    pub signaled: bool,
    pub num_sge: usize,
    /// The data is in the inline area, not behind the SGEs.
    pub inline: bool,
    /// Message length in bytes (atomics: 8).
    pub len: u64,
    pub status: WqeStatus,
    /// First PSN (valid once started).
    pub first_psn: Psn,
    /// PSNs the WQE takes: request packets, or READ response packets.
    pub npkts: u32,
}

impl SendWqe {
    pub(crate) const EMPTY: SendWqe = SendWqe {
        wr_id: 0,
        op: SendOp::Send,
        ud: None,
        flags: SendFlags::empty(),
        signaled: false,
        num_sge: 0,
        inline: false,
        len: 0,
        status: WqeStatus::Posted,
        first_psn: Psn::from_wire(0),
        npkts: 0,
    };

    /// READ or atomic: answered by data, limited by `max_rd_atomic`.
    pub(crate) fn is_rd_atomic(&self) -> bool {
        self.is_read() || self.is_atomic()
    }

    pub(crate) fn is_read(&self) -> bool {
        matches!(self.op, SendOp::RdmaRead { .. })
    }

    pub(crate) fn is_atomic(&self) -> bool {
        self.op.is_atomic()
    }

    /// The last PSN of the WQE's range.
    pub(crate) fn last_psn(&self) -> Psn {
        self.first_psn.wrapping_add(self.npkts.saturating_sub(1))
    }

    /// `psn` lies inside the WQE's range.
    pub(crate) fn holds(&self, psn: Psn) -> bool {
        psn.in_range(self.first_psn, self.npkts)
    }
}

/// The send ring.
#[derive(Debug)]
pub(crate) struct SendQueue {
    wqes: Vec<SendWqe>,
    sges: Vec<Sge>,
    inline: Vec<u8>,
    mask: u32,
    limit: u32,
    pub max_sge: usize,
    pub max_inline: usize,
    /// Oldest WQE not yet retired by the completer.
    pub head: u32,
    /// Next free slot.
    pub tail: u32,
}

impl SendQueue {
    pub(crate) fn new(depth: u32, max_sge: usize, max_inline: usize) -> SendQueue {
        let depth = depth.max(1);
        let cap = depth.next_power_of_two();
        let slots = cap as usize;
        SendQueue {
            wqes: vec![SendWqe::EMPTY; slots],
            sges: vec![Sge::default(); slots * max_sge],
            inline: vec![0; slots * max_inline],
            mask: cap - 1,
            limit: depth,
            max_sge,
            max_inline,
            head: 0,
            tail: 0,
        }
    }

    pub(crate) fn len(&self) -> u32 {
        self.tail.wrapping_sub(self.head)
    }

    pub(crate) fn is_full(&self) -> bool {
        self.len() >= self.limit
    }

    /// `idx` is a posted, unretired WQE.
    pub(crate) fn live(&self, idx: u32) -> bool {
        idx.wrapping_sub(self.head) < self.len()
    }

    pub(crate) fn get(&self, idx: u32) -> Option<&SendWqe> {
        if !self.live(idx) {
            return None;
        }
        self.wqes.get((idx & self.mask) as usize)
    }

    pub(crate) fn get_mut(&mut self, idx: u32) -> Option<&mut SendWqe> {
        if !self.live(idx) {
            return None;
        }
        self.wqes.get_mut((idx & self.mask) as usize)
    }

    pub(crate) fn sges(&self, idx: u32) -> &[Sge] {
        let n = self.get(idx).map_or(0, |w| w.num_sge);
        let at = (idx & self.mask) as usize * self.max_sge;
        self.sges.get(at..at + n).unwrap_or(&[])
    }

    /// The pieces of WQE `idx`'s message from offset `off`, `len` bytes, by
    /// key (for a gathering sink), into `out`; how many, or `None` when the
    /// data is inline or spans more SGEs than `out` holds.
    pub(crate) fn payload_pieces(
        &self,
        idx: u32,
        off: u64,
        len: usize,
        out: &mut [KeyPiece],
    ) -> Option<usize> {
        if self.get(idx)?.inline {
            return None;
        }
        let mut n = 0;
        sgl_walk(self.sges(idx), off, len, |s, addr, r| {
            let slot = out.get_mut(n).ok_or(MemError::Length)?;
            *slot = KeyPiece {
                key: MemKey::Local(s.lkey),
                addr,
                len: r.len(),
                access: Access::LocalRead,
            };
            n += 1;
            Ok(())
        })
        .ok()?;
        Some(n)
    }

    pub(crate) fn inline(&self, idx: u32) -> &[u8] {
        let n = self.get(idx).map_or(0, |w| w.len as usize);
        let at = (idx & self.mask) as usize * self.max_inline;
        self.inline.get(at..at + n).unwrap_or(&[])
    }

    /// Queue a WQE; the caller checked `is_full`, the SGE count and inline size.
    /// Returns the inline area of the new slot for the caller to fill.
    pub(crate) fn push(&mut self, wqe: SendWqe, sges: &[Sge]) -> &mut [u8] {
        let slot = (self.tail & self.mask) as usize;
        if let Some(w) = self.wqes.get_mut(slot) {
            *w = wqe;
        }
        let at = slot * self.max_sge;
        if let Some(d) = self.sges.get_mut(at..at + sges.len()) {
            d.copy_from_slice(sges);
        }
        self.tail = self.tail.wrapping_add(1);
        let at = slot * self.max_inline;
        self.inline
            .get_mut(at..at + self.max_inline)
            .unwrap_or(&mut [])
    }

    /// Retire the head WQE.
    pub(crate) fn pop(&mut self) {
        if self.len() > 0 {
            self.head = self.head.wrapping_add(1);
        }
    }

    pub(crate) fn clear(&mut self) {
        // Back to index 0, as a new queue: a reset engine indexes from 0.
        self.head = 0;
        self.tail = 0;
    }

    /// Gather `dst.len()` bytes at message offset `off` of WQE `idx`.
    pub(crate) fn read_payload(
        &self,
        mem: &dyn MemoryAccess,
        pd: PdHandle,
        idx: u32,
        off: u64,
        dst: &mut [u8],
    ) -> Result<(), MemError> {
        let Some(w) = self.get(idx) else {
            return Err(MemError::Length);
        };
        if w.inline {
            let src = self.inline(idx);
            let s = usize::try_from(off).map_err(|_| MemError::Length)?;
            let chunk = src.get(s..s + dst.len()).ok_or(MemError::Length)?;
            dst.copy_from_slice(chunk);
            Ok(())
        } else {
            sgl_read(mem, pd, self.sges(idx), off, dst)
        }
    }
}

/// One receive work request.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RecvWqe {
    pub wr_id: u64,
    pub num_sge: usize,
    /// Total bytes of the scatter list.
    pub len: u64,
}

/// The receive ring.
#[derive(Debug)]
pub(crate) struct RecvQueue {
    wqes: Vec<RecvWqe>,
    sges: Vec<Sge>,
    mask: u32,
    limit: u32,
    pub max_sge: usize,
    pub head: u32,
    pub tail: u32,
}

impl RecvQueue {
    pub(crate) fn new(depth: u32, max_sge: usize) -> RecvQueue {
        let depth = depth.max(1);
        let cap = depth.next_power_of_two();
        RecvQueue {
            wqes: vec![RecvWqe::default(); cap as usize],
            sges: vec![Sge::default(); cap as usize * max_sge],
            mask: cap - 1,
            limit: depth,
            max_sge,
            head: 0,
            tail: 0,
        }
    }

    pub(crate) fn len(&self) -> u32 {
        self.tail.wrapping_sub(self.head)
    }

    pub(crate) fn is_full(&self) -> bool {
        self.len() >= self.limit
    }

    pub(crate) fn front(&self) -> Option<RecvWqe> {
        if self.len() == 0 {
            return None;
        }
        self.wqes.get((self.head & self.mask) as usize).copied()
    }

    pub(crate) fn front_sges(&self) -> &[Sge] {
        let n = self.front().map_or(0, |w| w.num_sge);
        let at = (self.head & self.mask) as usize * self.max_sge;
        self.sges.get(at..at + n).unwrap_or(&[])
    }

    pub(crate) fn push(&mut self, wqe: RecvWqe, sges: &[Sge]) {
        let slot = (self.tail & self.mask) as usize;
        if let Some(w) = self.wqes.get_mut(slot) {
            *w = wqe;
        }
        let at = slot * self.max_sge;
        if let Some(d) = self.sges.get_mut(at..at + sges.len()) {
            d.copy_from_slice(sges);
        }
        self.tail = self.tail.wrapping_add(1);
    }

    pub(crate) fn pop(&mut self) {
        if self.len() > 0 {
            self.head = self.head.wrapping_add(1);
        }
    }

    pub(crate) fn clear(&mut self) {
        // Back to index 0, as a new queue: a reset engine indexes from 0.
        self.head = 0;
        self.tail = 0;
    }
}

/// Total bytes of a scatter/gather list.
pub(crate) fn sgl_len(sges: &[Sge]) -> u64 {
    sges.iter().map(|s| u64::from(s.length)).sum()
}

/// Check every SGE for `access`; returns the total length.
pub(crate) fn sgl_check(
    mem: &dyn MemoryAccess,
    pd: PdHandle,
    sges: &[Sge],
    access: Access,
) -> Result<u64, MemError> {
    for s in sges {
        if s.length > 0 {
            mem.check(
                pd,
                MemKey::Local(s.lkey),
                s.addr,
                u64::from(s.length),
                access,
            )?;
        }
    }
    Ok(sgl_len(sges))
}

/// Walk the list from message offset `off`, calling `f(sge, addr, range)`
/// for each piece of `len` bytes.
fn sgl_walk(
    sges: &[Sge],
    mut off: u64,
    len: usize,
    mut f: impl FnMut(&Sge, u64, core::ops::Range<usize>) -> Result<(), MemError>,
) -> Result<(), MemError> {
    let mut done = 0usize;
    for s in sges {
        if done == len {
            break;
        }
        let sl = u64::from(s.length);
        if off >= sl {
            off -= sl;
            continue;
        }
        let avail = usize::try_from(sl - off).unwrap_or(usize::MAX);
        let n = avail.min(len - done);
        f(s, s.addr.wrapping_add(off), done..done + n)?;
        done += n;
        off = 0;
    }
    if done == len {
        Ok(())
    } else {
        Err(MemError::Length)
    }
}

/// Gather `dst.len()` bytes starting at message offset `off`.
pub(crate) fn sgl_read(
    mem: &dyn MemoryAccess,
    pd: PdHandle,
    sges: &[Sge],
    off: u64,
    dst: &mut [u8],
) -> Result<(), MemError> {
    let len = dst.len();
    sgl_walk(sges, off, len, |s, addr, r| {
        let d = dst.get_mut(r).ok_or(MemError::Length)?;
        mem.read(pd, MemKey::Local(s.lkey), addr, d, Access::LocalRead)
    })
}

/// Scatter `src` starting at message offset `off`.
pub(crate) fn sgl_write(
    mem: &mut dyn MemoryAccess,
    pd: PdHandle,
    sges: &[Sge],
    off: u64,
    src: &[u8],
) -> Result<(), MemError> {
    sgl_walk(sges, off, src.len(), |s, addr, r| {
        let d = src.get(r).ok_or(MemError::Length)?;
        mem.write(pd, MemKey::Local(s.lkey), addr, d, Access::LocalWrite)
    })
}
