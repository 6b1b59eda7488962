//! Event and completion queues (mlx5.md §7.1, §7.2, §10, §11): CREATE/DESTROY_EQ and _CQ,
//! EQE and CQE writing with the owner bit, arming through the UAR doorbells, overruns.
//!
//! Counters are 24 bits wide like the doorbells that carry them (`cons_index & 0xffffff`);
//! since queues hold at most 2^22 entries, the owner parity `(pi >> log_size) & 1` is the same
//! whether counted in 24 or 32 bits.

use std::collections::BTreeMap;

use rnic_mlx5_prm::{
    CQE_BYTES, CmdStatus, CreateCqIn, CreateCqOut, CreateEqIn, CreateEqOut, DestroyCqIn,
    DestroyEqIn, EQE_BYTES, Eqe, EventType, HealthSyndrome, cqe_size, create_cq_in, create_eq_in,
};

use super::{Ctx, HcaStats, Outcome, refuse};
use crate::device::Device;
use crate::firmware::syndrome as syn;

const MASK24: u32 = 0xff_ffff;

/// A ring of 64-byte entries in the driver's pages.
#[derive(Clone, Debug)]
pub(crate) struct Ring {
    pub(crate) pages: Vec<u64>,
    log_page: u32,
    pub(crate) log_size: u32,
}

impl Ring {
    /// The ring a create command describes: `log_size` entries of 64 bytes in pages of
    /// 4 KiB << `log_page_size` listed from `pas_at`.
    pub(crate) fn parse(
        input: &[u8],
        pas_at: usize,
        log_entries: u32,
        entry_log: u32,
        log_page_size: u32,
        page_offset: u32,
    ) -> Result<Ring, u32> {
        if page_offset != 0 || log_page_size > 18 {
            return Err(syn::QUEUE_PAS);
        }
        let log_page = 12 + log_page_size;
        let bytes = 1u64 << (log_entries + entry_log);
        let npages = bytes.div_ceil(1 << log_page) as usize;
        let pages = pas_list(input, pas_at, npages, log_page)?;
        Ok(Ring {
            pages,
            log_page,
            log_size: log_entries,
        })
    }

    /// A ring over `pages` of `1 << log_page` bytes (its entry count is not used).
    pub(crate) fn from_pages(pages: Vec<u64>, log_page: u32) -> Ring {
        Ring {
            pages,
            log_page,
            log_size: 0,
        }
    }

    /// Host bytes this ring's description holds.
    pub(crate) fn bytes(&self) -> usize {
        self.pages.len() * 8
    }

    pub(crate) fn entries(&self) -> u32 {
        1 << self.log_size
    }

    /// The IOVA of byte `off` of the ring (modulo its size).
    pub(crate) fn addr_of(&self, off: u64) -> u64 {
        let total = (self.pages.len() as u64) << self.log_page;
        let off = off % total.max(1);
        let page = (off >> self.log_page) as usize;
        self.pages.get(page).copied().unwrap_or(0) + (off & ((1 << self.log_page) - 1))
    }

    /// Write one 64-byte entry at `index`: bytes 0..56 first, then the last 8 (owner byte
    /// last), so the owner never turns valid before the body.
    fn write_entry(&self, dev: &Device, index: u32, e: &[u8; 64]) -> bool {
        let at = self.addr_of(u64::from(index & (self.entries() - 1)) * 64);
        dev.dma_write(at, &e[..56]).is_ok() && dev.dma_write(at + 56, &e[56..]).is_ok()
    }

    /// Read `dst.len()` bytes from ring byte offset `off`, wrapping.
    pub(crate) fn read(&self, dev: &Device, off: u64, dst: &mut [u8]) -> bool {
        let mut done = 0usize;
        while done < dst.len() {
            let o = off + done as u64;
            let in_page = (1u64 << self.log_page) - (o & ((1 << self.log_page) - 1));
            let n = (dst.len() - done).min(in_page as usize);
            if dev
                .dma_read(self.addr_of(o), &mut dst[done..done + n])
                .is_err()
            {
                return false;
            }
            done += n;
        }
        true
    }
}

/// `npages` page addresses from `pas_at`, each aligned to `1 << log_page`.
pub(crate) fn pas_list(
    input: &[u8],
    pas_at: usize,
    npages: usize,
    log_page: u32,
) -> Result<Vec<u64>, u32> {
    let raw = input
        .get(pas_at..pas_at + npages * 8)
        .ok_or(syn::QUEUE_PAS)?;
    raw.chunks_exact(8)
        .map(|c| {
            let mut b = [0u8; 8];
            b.copy_from_slice(c);
            let a = u64::from_be_bytes(b);
            if a.is_multiple_of(1 << log_page) {
                Ok(a)
            } else {
                Err(syn::QUEUE_PAS)
            }
        })
        .collect()
}

/// One event queue.
#[derive(Debug)]
pub(crate) struct Eq {
    pub(crate) ring: Ring,
    pub(crate) uar: u32,
    pub(crate) vector: u32,
    mask: [u64; 4],
    pi: u32,
    ci: u32,
    armed: bool,
    /// Overran (with `oi` clear): no more EQEs are written.
    pub(crate) overrun: bool,
    oi: bool,
}

impl Eq {
    /// Whether the EQ's bitmask asks for events of type `t`.
    pub(crate) fn wants(&self, t: EventType) -> bool {
        let t = u32::from(t.as_raw());
        self.mask[(t / 64) as usize] & (1 << (t % 64)) != 0
    }

    /// Write an EQE of `t` / `sub` with `data` (the 28 bytes at EQE+0x20) and interrupt if
    /// armed.
    pub(crate) fn post(
        &mut self,
        dev: &Device,
        t: EventType,
        sub: u8,
        data: &[u8; 28],
        stats: &mut HcaStats,
    ) {
        if self.overrun {
            stats.eqes_dropped += 1;
            return;
        }
        if (self.pi.wrapping_sub(self.ci) & MASK24) >= self.ring.entries() && !self.oi {
            self.overrun = true;
            stats.eq_overruns += 1;
            if dev.options().firmware.strictness.eq_overrun_fatal {
                // As firmware reports it (mlx5.md §2: health syndrome 0x0c "async EQ
                // overrun"), with rfr: the function stops.
                tracing::error!(
                    vector = self.vector,
                    "EQ overrun: consumer index not advanced; fatal health syndrome 0x0c"
                );
                dev.declare_fatal(HealthSyndrome::AsyncEqOverrun.as_raw());
            } else {
                tracing::warn!(
                    vector = self.vector,
                    "EQ overrun: consumer index not advanced; no more EQEs"
                );
            }
            return;
        }
        let mut e = [0u8; EQE_BYTES];
        {
            let mut v = Eqe::new_unchecked(&mut e[..]);
            let _ = v.set_event_type(u32::from(t.as_raw()));
            let _ = v.set_event_sub_type(u32::from(sub));
            let _ = v.set_owner((self.pi >> self.ring.log_size) & 1);
        }
        e[0x20..0x3c].copy_from_slice(data);
        if !self.ring.write_entry(dev, self.pi, &e) {
            stats.dma_faults += 1;
            tracing::warn!("EQE write faulted (EQ pages not mapped)");
            return;
        }
        self.pi = self.pi.wrapping_add(1) & MASK24;
        stats.eqes += 1;
        if self.armed {
            self.armed = false;
            let _ = dev.signal(self.vector);
            stats.interrupts += 1;
        }
    }

    /// The EQ doorbell: consumer index `ci`, arm if `arm`. An armed EQ with unconsumed EQEs
    /// interrupts at once.
    pub(crate) fn doorbell(&mut self, dev: &Device, ci: u32, arm: bool, stats: &mut HcaStats) {
        if (self.pi.wrapping_sub(ci) & MASK24) > self.ring.entries() {
            stats.bad_doorbells += 1;
            tracing::warn!(
                ci,
                pi = self.pi,
                "EQ doorbell with a consumer index beyond the producer: ignored"
            );
            return;
        }
        self.ci = ci & MASK24;
        if arm {
            if self.ci != self.pi {
                let _ = dev.signal(self.vector);
                stats.interrupts += 1;
            } else {
                self.armed = true;
            }
        }
    }
}

/// Why a CQE could not be written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CqFull {
    /// The CQ is (now) in error: overrun or its doorbell record / ring faulted.
    Error,
}

/// One completion queue.
#[derive(Debug)]
pub(crate) struct Cq {
    pub(crate) ring: Ring,
    pub(crate) uar: u32,
    pub(crate) eqn: u32,
    dbr: u64,
    pi: u32,
    /// Armed: `Some(solicited_only)`.
    armed: Option<bool>,
    /// The arm dword last applied, and those taken from the record whose
    /// doorbells have not been read yet, oldest first (see
    /// [`Cq::arm_from_record`]).
    arm_word: u32,
    from_record: Vec<u32>,
    /// The consumer index of the newest arm taken from the record: a
    /// doorbell behind it was written before that arm, which superseded it
    /// (see [`Cq::arm`]).
    record_ci: Option<u32>,
    pub(crate) error: bool,
    /// `cqc.oi` (overrun ignore): no overrun check, CQEs overwrite.
    oi: bool,
}

impl Cq {
    /// Write `cqe` (owner bit set here). `Ok(true)` when the CQE asks for a completion EQE
    /// (armed and matching, or `force`).
    pub(crate) fn push(
        &mut self,
        dev: &Device,
        mut cqe: [u8; CQE_BYTES],
        solicited: bool,
        force: bool,
        stats: &mut HcaStats,
    ) -> Result<bool, CqFull> {
        if self.error {
            stats.cqes_dropped += 1;
            return Err(CqFull::Error);
        }
        let mut d = [0u8; 4];
        if dev.dma_read(self.dbr, &mut d).is_err() {
            stats.dma_faults += 1;
            self.error = true;
            return Err(CqFull::Error);
        }
        let ci = u32::from_be_bytes(d) & MASK24;
        if !self.oi && (self.pi.wrapping_sub(ci) & MASK24) >= self.ring.entries() {
            self.error = true;
            stats.cq_overruns += 1;
            tracing::warn!(
                pi = self.pi,
                ci,
                "CQ overrun: set_ci not advanced; CQ in error"
            );
            return Err(CqFull::Error);
        }
        if self.armed.is_none() {
            self.arm_from_record(dev);
        }
        let owner = ((self.pi >> self.ring.log_size) & 1) as u8;
        cqe[63] = (cqe[63] & !1) | owner;
        if !self.ring.write_entry(dev, self.pi, &cqe) {
            stats.dma_faults += 1;
            self.error = true;
            return Err(CqFull::Error);
        }
        self.pi = self.pi.wrapping_add(1) & MASK24;
        stats.cqes += 1;
        let fire = match self.armed {
            Some(solicited_only) => !solicited_only || solicited,
            None => false,
        };
        if fire {
            self.armed = None;
        }
        Ok(fire || force)
    }

    /// An arm request whose doorbell the watcher has not read yet. The driver
    /// stores the arm dword in the CQ's doorbell record (`+4`) before it
    /// writes the UAR doorbell (mlx5.md §8); a PCIe device sees each doorbell
    /// write, but the emulator reads one register that a second arm may
    /// overwrite before the first is read — and the first arm's event would be
    /// lost. So before writing a CQE to an unarmed CQ, a record dword not yet
    /// seen is applied as the arm it announces; its doorbell, when read, is
    /// then not applied twice (nor a doorbell read late whose arm a later
    /// record already superseded).
    fn arm_from_record(&mut self, dev: &Device) {
        let mut w = [0u8; 4];
        if dev.dma_read(self.dbr + 4, &mut w).is_err() {
            return;
        }
        let word = u32::from_be_bytes(w);
        if word == self.arm_word {
            return;
        }
        let cmd = (word >> 24) & 0xf;
        if cmd > 1 {
            // Not an arm: its doorbell is refused when read.
            return;
        }
        self.arm_word = word;
        if self.from_record.len() == 16 {
            self.from_record.remove(0);
        }
        self.from_record.push(word);
        self.record_ci = Some(word & MASK24);
        let pending = self.pi.wrapping_sub(word & MASK24) & MASK24;
        // An arm behind the producer fires at once (as its doorbell would
        // have): on this CQE, whatever its kind.
        self.armed = Some(cmd == 1 && pending == 0);
    }

    /// The CQ doorbell's high dword `word` (`arm_sn << 28 | cmd << 24 | ci`): arm with
    /// `cmd` (0 next completion, 1 solicited only) at consumer index `ci`. `true` when CQEs
    /// beyond `ci` already exist: the event fires at once.
    pub(crate) fn arm(&mut self, word: u32, stats: &mut HcaStats) -> bool {
        if let Some(at) = self.from_record.iter().position(|&w| w == word) {
            // Taken from the record already (`arm_from_record`) — and so were the
            // arms before it, whose doorbells this one overwrote.
            self.from_record.drain(..=at);
            return false;
        }
        let (cmd, ci) = ((word >> 24) & 0xf, word & MASK24);
        // A doorbell the watcher read long ago and delivers only now, after
        // more arms than `from_record` keeps were taken from the record: its
        // consumer index is behind the newest of those (the driver's index
        // never goes back), so a later arm already superseded it. Applied, it
        // would fire at once for CQEs that arm already reported.
        if let Some(rc) = self.record_ci {
            let behind = rc.wrapping_sub(ci) & MASK24;
            if behind != 0 && behind < 1 << 23 {
                return false;
            }
        }
        self.arm_word = word;
        let pending = self.pi.wrapping_sub(ci) & MASK24;
        if cmd > 1 || self.error || pending > self.ring.entries() {
            // An unknown command, a CQ in error, or a consumer index beyond the producer.
            stats.bad_doorbells += 1;
            return false;
        }
        if pending != 0 {
            self.armed = None;
            return true;
        }
        self.armed = Some(cmd == 1);
        false
    }
}

/// The EQs and CQs.
#[derive(Debug, Default)]
pub(crate) struct Queues {
    pub(crate) eqs: BTreeMap<u32, Eq>,
    pub(crate) cqs: BTreeMap<u32, Cq>,
}

impl Queues {
    /// CREATE_EQ (mlx5.md §7.1).
    pub(crate) fn create_eq(
        &mut self,
        dev: &Device,
        ctx: &Ctx<'_>,
        input: &[u8],
        out: &mut [u8],
    ) -> Outcome {
        let v = CreateEqIn::new_unchecked(input);
        let c = v.eq_context_entry();
        if c.status() != 0 {
            return refuse(CmdStatus::BadParam, syn::QUEUE_CONTEXT);
        }
        let caps = ctx.caps.general();
        if c.log_eq_size() == 0 || c.log_eq_size() > caps.log_max_eq_sz() {
            return refuse(CmdStatus::BadParam, syn::EQ_SIZE);
        }
        if !ctx.uars.contains(&c.uar_page()) {
            return refuse(CmdStatus::BadRes, syn::EQ_UAR);
        }
        if c.intr() >= dev.msix().count() {
            return refuse(CmdStatus::BadParam, syn::EQ_VECTOR);
        }
        let ring = match Ring::parse(
            input,
            create_eq_in::pas.byte_offset(),
            c.log_eq_size(),
            6,
            c.log_page_size(),
            c.page_offset(),
        ) {
            Ok(r) => r,
            Err(s) => return refuse(CmdStatus::BadParam, s),
        };
        let limit = 1u32 << caps.log_max_eq();
        let Some(eqn) = (0..limit).find(|n| !self.eqs.contains_key(n)) else {
            return refuse(CmdStatus::NoRes, syn::EQ_EXHAUSTED);
        };
        let mut mask = [0u64; 4];
        for (i, m) in mask.iter_mut().enumerate() {
            *m = v.event_bitmask(i).unwrap_or(0);
        }
        self.eqs.insert(
            eqn,
            Eq {
                ring,
                uar: c.uar_page(),
                vector: c.intr(),
                mask,
                pi: 0,
                ci: 0,
                armed: false,
                overrun: false,
                oi: c.oi() == 1,
            },
        );
        let _ = CreateEqOut::new_unchecked(out).set_eq_number(eqn);
        tracing::debug!(
            eqn,
            vector = c.intr(),
            mask = format_args!("{:#x}", mask[0]),
            "CREATE_EQ"
        );
        Ok(())
    }

    /// DESTROY_EQ.
    pub(crate) fn destroy_eq(&mut self, input: &[u8]) -> Outcome {
        let eqn = DestroyEqIn::new_unchecked(input).eq_number();
        if !self.eqs.contains_key(&eqn) {
            return refuse(CmdStatus::BadRes, syn::EQ_NOT_FOUND);
        }
        if self.cqs.values().any(|c| c.eqn == eqn) {
            return refuse(CmdStatus::BadResState, syn::EQ_IN_USE);
        }
        self.eqs.remove(&eqn);
        Ok(())
    }

    /// CREATE_CQ (mlx5.md §7.2).
    pub(crate) fn create_cq(
        &mut self,
        dev: &Device,
        ctx: &Ctx<'_>,
        input: &[u8],
        out: &mut [u8],
    ) -> Outcome {
        let v = CreateCqIn::new_unchecked(input);
        let c = v.cq_context();
        if c.status() != 0
            || c.cqe_sz() != cqe_size::BYTES_64
            || c.cqe_comp_en() != 0
            || c.dbr_umem_valid() != 0
            || c.apu_cq() != 0
            || v.cq_umem_valid() != 0
        {
            return refuse(CmdStatus::BadParam, syn::QUEUE_CONTEXT);
        }
        let caps = ctx.caps.general();
        if c.log_cq_size() > caps.log_max_cq_sz() {
            return refuse(CmdStatus::BadParam, syn::CQ_SIZE);
        }
        if !ctx.uars.contains(&c.uar_page()) {
            return refuse(CmdStatus::BadRes, syn::EQ_UAR);
        }
        let eqn = c.c_eqn_or_apu_element();
        if !self.eqs.contains_key(&eqn) {
            return refuse(CmdStatus::BadRes, syn::EQ_NOT_FOUND);
        }
        if !c.dbr_addr().is_multiple_of(8) {
            return refuse(CmdStatus::BadParam, syn::DBR_ALIGN);
        }
        let pas_at = create_cq_in::pas.byte_offset();
        let ring = match Ring::parse(
            input,
            pas_at,
            c.log_cq_size(),
            6,
            c.log_page_size(),
            c.page_offset(),
        ) {
            Ok(r) => r,
            Err(s) => return refuse(CmdStatus::BadParam, s),
        };
        // The stricter reading of `inlen` (K passes exactly the ring's pages): a list longer
        // than the ring is refused rather than its tail ignored.
        if dev.options().firmware.strictness.cq_pas
            && input.len().saturating_sub(pas_at) / 8 > ring.pages.len()
        {
            return refuse(CmdStatus::BadParam, syn::CQ_PAS_LENGTH);
        }
        let limit = 1u64 << caps.log_max_cq();
        let Some(cqn) = (1u32..)
            .take_while(|&n| u64::from(n) < limit)
            .find(|n| !self.cqs.contains_key(n))
        else {
            return refuse(CmdStatus::NoRes, syn::CQ_EXHAUSTED);
        };
        self.cqs.insert(
            cqn,
            Cq {
                ring,
                uar: c.uar_page(),
                eqn,
                dbr: c.dbr_addr(),
                pi: 0,
                armed: None,
                arm_word: 0,
                from_record: Vec::new(),
                record_ci: None,
                error: false,
                oi: c.oi() == 1,
            },
        );
        let _ = CreateCqOut::new_unchecked(out).set_cqn(cqn);
        tracing::debug!(cqn, eqn, log_size = c.log_cq_size(), "CREATE_CQ");
        Ok(())
    }

    /// DESTROY_CQ (`in_use`: a QP names it).
    pub(crate) fn destroy_cq(&mut self, input: &[u8], in_use: impl Fn(u32) -> bool) -> Outcome {
        let cqn = DestroyCqIn::new_unchecked(input).cqn();
        if !self.cqs.contains_key(&cqn) {
            return refuse(CmdStatus::BadRes, syn::CQ_NOT_FOUND);
        }
        if in_use(cqn) {
            return refuse(CmdStatus::BadResState, syn::CQ_IN_USE);
        }
        self.cqs.remove(&cqn);
        Ok(())
    }

    /// Whether an EQ asks for events of type `t`.
    pub(crate) fn subscribes(&self, t: EventType) -> bool {
        self.eqs.values().any(|e| e.wants(t))
    }

    /// Post an event of type `t` on every EQ that asks for it (async events) — the first
    /// one only, as a function routes each event type to one EQ.
    pub(crate) fn event(
        &mut self,
        dev: &Device,
        t: EventType,
        sub: u8,
        data: &[u8; 28],
        stats: &mut HcaStats,
    ) -> bool {
        match self.eqs.values_mut().find(|e| e.wants(t)) {
            Some(eq) => {
                eq.post(dev, t, sub, data, stats);
                true
            }
            None => false,
        }
    }

    /// Write a CQE to `cqn`, then its completion EQE when asked. A CQ overrun raises a CQ
    /// error event (syndrome 1 = overrun, 2 = access violation).
    pub(crate) fn complete(
        &mut self,
        dev: &Device,
        cqn: u32,
        cqe: [u8; CQE_BYTES],
        solicited: bool,
        force_eqe: bool,
        stats: &mut HcaStats,
    ) {
        let Some(cq) = self.cqs.get_mut(&cqn) else {
            stats.cqes_dropped += 1;
            return;
        };
        let was_error = cq.error;
        match cq.push(dev, cqe, solicited, force_eqe, stats) {
            Ok(true) => {
                let eqn = cq.eqn;
                self.completion_event(dev, eqn, cqn, stats);
            }
            Ok(false) => {}
            Err(CqFull::Error) => {
                if !was_error {
                    let mut data = [0u8; 28];
                    data[0..4].copy_from_slice(&(cqn & MASK24).to_be_bytes());
                    // cq_error.syndrome: byte 0x0b of the event data (EQE + 0x2b).
                    data[0x0b] = 1;
                    self.event(dev, EventType::CqError, 0, &data, stats);
                }
            }
        }
    }

    /// A completion EQE for `cqn` on EQ `eqn`.
    pub(crate) fn completion_event(
        &mut self,
        dev: &Device,
        eqn: u32,
        cqn: u32,
        stats: &mut HcaStats,
    ) {
        if let Some(eq) = self.eqs.get_mut(&eqn) {
            let mut data = [0u8; 28];
            // comp_event.cq_number: BE32 at EQE + 0x38, low 24 bits.
            data[0x18..0x1c].copy_from_slice(&(cqn & MASK24).to_be_bytes());
            eq.post(dev, EventType::Completion, 0, &data, stats);
        }
    }

    /// The CQ doorbell (UAR + 0x20) on UAR page `page`.
    pub(crate) fn cq_doorbell(
        &mut self,
        dev: &Device,
        page: u32,
        value: u64,
        stats: &mut HcaStats,
    ) {
        let cqn = (value as u32) & MASK24;
        let hi = (value >> 32) as u32;
        let Some(cq) = self.cqs.get_mut(&cqn).filter(|c| c.uar == page) else {
            stats.bad_doorbells += 1;
            tracing::debug!(cqn, page, "CQ doorbell for no CQ of this UAR page: ignored");
            return;
        };
        if cq.arm(hi, stats) {
            let eqn = cq.eqn;
            self.completion_event(dev, eqn, cqn, stats);
        }
    }

    /// The EQ doorbells (UAR + 0x40 arm, + 0x48 no arm) on UAR page `page`.
    pub(crate) fn eq_doorbell(
        &mut self,
        dev: &Device,
        page: u32,
        value: u64,
        arm: bool,
        stats: &mut HcaStats,
    ) {
        let eqn = ((value >> 24) & 0xff) as u32;
        match self.eqs.get_mut(&eqn).filter(|e| e.uar == page) {
            Some(eq) => eq.doorbell(dev, (value as u32) & MASK24, arm, stats),
            None => {
                stats.bad_doorbells += 1;
                tracing::debug!(eqn, page, "EQ doorbell for no EQ of this UAR page: ignored");
            }
        }
    }

    /// Host bytes the EQ and CQ descriptions hold.
    pub(crate) fn bytes(&self) -> usize {
        self.eqs.values().map(|e| e.ring.bytes()).sum::<usize>()
            + self.cqs.values().map(|c| c.ring.bytes()).sum::<usize>()
    }

    /// Whether a queue uses UAR page `uar`.
    pub(crate) fn uses_uar(&self, uar: u32) -> bool {
        self.eqs.values().any(|e| e.uar == uar) || self.cqs.values().any(|c| c.uar == uar)
    }
}

/// The number of bytes in one CQE (for the CQE builders).
pub(crate) const CQE: usize = CQE_BYTES;
