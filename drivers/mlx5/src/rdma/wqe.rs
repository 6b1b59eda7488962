//! Send and receive WQE encoding (mlx5.md §9), sans-IO.
//!
//! The hot path builds each segment as 64-bit *memory words* (the bytes in
//! the order the device reads them, as stored by one `AtomicU64` store) from
//! the PRM field layouts of `rnic-mlx5-prm` (`wqe_ctrl_seg`, `wqe_raddr_seg`,
//! `wqe_data_seg`, `wqe_atomic_seg`, `wqe_inline_seg`): each dword is
//! `FieldLayout::insert`ed field by field, so a layout change in the PRM
//! crate changes the encoding, and the unit tests hold every segment to the
//! bytes the PRM views write. A WQE is written straight into the ring, 8
//! bytes at a time, wrapping at the ring's end (§9: a WQE may wrap in the
//! middle).

use std::sync::atomic::{AtomicU64, Ordering};

use rnic_core::{SendFlags, SendOp, SendWr, Sge, WcOpcode};
use rnic_mlx5_prm::{
    CompletionMode, DS_UNIT_BYTES, FenceMode, INLINE_SEG_FLAG, INVALID_LKEY, MAX_DS, UdAdrsVector,
    WQEBB_BYTES, WqeOpcode, ud_adrs_vector, wqe_ctrl_seg, wqe_data_seg, wqe_inline_seg,
};

/// The largest inline payload a UD WQE carries: control 16 + datagram 48 +
/// inline header 4 + data still fit the 256 bytes of one BlueFlame half
/// (§8).
pub const MAX_INLINE_DATA: usize = 188;
/// The largest inline payload an RC WQE carries: a SEND (control 16 +
/// inline header 4 + data) fills one BlueFlame half; an RDMA WRITE of as
/// many bytes (+ 16 of remote address) takes 5 WQEBBs and rings a plain
/// doorbell. What perftest asks of ConnectX parts (236 on `ib_send_lat`,
/// 220 on `ib_write_lat`).
pub const MAX_INLINE_DATA_RC: usize = 236;
/// Bytes of the datagram (address vector) segment of a UD send (§9, the
/// extended 48-byte `ud_adrs_vector`).
pub const DATAGRAM_SEG_BYTES: usize = ud_adrs_vector::SIZE_BYTES;
/// The most gather entries one send WQE takes (bounded by `MAX_DS`).
pub const MAX_SEND_SGE: usize = 16;
/// The most scatter entries one receive WQE takes.
pub const MAX_RECV_SGE: usize = 16;

pub use crate::error::{PostFailure, Refused};

/// The RoCEv2 UDP source port when none is given: 0xC000 | a hash of the
/// two QPNs (rxe's range), so flows of different QP pairs spread.
pub fn default_udp_sport(local: u32, remote: u32) -> u16 {
    let h = local.wrapping_mul(0x9e37_79b9) ^ remote;
    0xc000 | ((h ^ (h >> 14)) & 0x3fff) as u16
}

const _: () = assert!(std::mem::size_of::<Result<(), Refused>>() <= 8);

/// A field's (shift, mask) inside its dword, computed at compile time from
/// the PRM layout (the hot path then shifts and masks only).
pub const fn pos(f: &rnic_mlx5_prm::FieldLayout) -> (u32, u32) {
    // Every field used with `put` lies inside one dword (asserted below).
    let shift = match f.dword_shift() {
        Some(s) => s,
        None => 0,
    };
    let mask = if f.width >= 32 {
        u32::MAX
    } else {
        (1u32 << f.width) - 1
    };
    (shift, mask)
}

/// Put `v` (masked to the field) at its position.
#[inline(always)]
pub const fn put(p: (u32, u32), v: u32) -> u32 {
    (v & p.1) << p.0
}

const CTRL_OPCODE: (u32, u32) = pos(&wqe_ctrl_seg::opcode);
const CTRL_INDEX: (u32, u32) = pos(&wqe_ctrl_seg::wqe_index);
const CTRL_QPN: (u32, u32) = pos(&wqe_ctrl_seg::qpn);
const CTRL_DS: (u32, u32) = pos(&wqe_ctrl_seg::ds);
const CTRL_FM_CE_SE: (u32, u32) = pos(&wqe_ctrl_seg::fm_ce_se);
const DATA_BYTE_COUNT: (u32, u32) = pos(&wqe_data_seg::byte_count);
const INLINE_LEN: (u32, u32) = pos(&wqe_inline_seg::len);
const _: () = assert!(
    wqe_ctrl_seg::opcode.dword_shift().is_some()
        && wqe_ctrl_seg::wqe_index.dword_shift().is_some()
        && wqe_ctrl_seg::qpn.dword_shift().is_some()
        && wqe_ctrl_seg::ds.dword_shift().is_some()
        && wqe_ctrl_seg::fm_ce_se.dword_shift().is_some()
        && wqe_data_seg::byte_count.dword_shift().is_some()
        && wqe_inline_seg::len.dword_shift().is_some()
);

/// Memory word of two big-endian dwords: bytes `dw0` then `dw1`.
#[inline(always)]
pub const fn be_pair(dw0: u32, dw1: u32) -> u64 {
    (((dw0 as u64) << 32) | dw1 as u64).to_be()
}

/// Memory word of one big-endian 64-bit field.
#[inline(always)]
pub const fn be64(v: u64) -> u64 {
    v.to_be()
}

/// `fm_ce_se` of a send: fence, completion mode, solicited (§9.1).
#[inline(always)]
pub const fn fm_ce_se(flags: SendFlags, signal_all: bool) -> u32 {
    let fence = if flags.contains(SendFlags::FENCE) {
        FenceMode::SmallAndFence.as_raw() as u32
    } else {
        FenceMode::NoFence.as_raw() as u32
    };
    let ce = if signal_all || flags.contains(SendFlags::SIGNALED) {
        CompletionMode::Always.as_raw() as u32
    } else {
        CompletionMode::ErrorOnly.as_raw() as u32
    };
    let se = flags.contains(SendFlags::SOLICITED) as u32;
    // Sub-fields of the byte at 0x0b: positions from the PRM layout, relative
    // to the byte's own field.
    let base = wqe_ctrl_seg::fm_ce_se.bit_offset;
    let fm = wqe_ctrl_seg::fence_mode.bit_offset - base;
    let cm = wqe_ctrl_seg::completion_mode.bit_offset - base;
    let so = wqe_ctrl_seg::solicited.bit_offset - base;
    (fence << (8 - fm - wqe_ctrl_seg::fence_mode.width))
        | (ce << (8 - cm - wqe_ctrl_seg::completion_mode.width))
        | (se << (8 - so - wqe_ctrl_seg::solicited.width))
}

/// The two memory words of a control segment (§9.1).
#[inline(always)]
pub const fn ctrl_words(
    opcode: WqeOpcode,
    wqe_index: u16,
    qpn: u32,
    ds: u32,
    fm_ce_se: u32,
    imm: u32,
) -> [u64; 2] {
    let dw0 = put(CTRL_INDEX, wqe_index as u32) | put(CTRL_OPCODE, opcode.as_raw() as u32);
    let dw1 = put(CTRL_QPN, qpn) | put(CTRL_DS, ds);
    let dw2 = put(CTRL_FM_CE_SE, fm_ce_se);
    [be_pair(dw0, dw1), be_pair(dw2, imm)]
}

/// The two memory words of a remote-address segment (§9.3).
#[inline(always)]
pub const fn raddr_words(raddr: u64, rkey: u32) -> [u64; 2] {
    [be64(raddr), be_pair(rkey, 0)]
}

/// The two memory words of a data-pointer segment (§9.3).
#[inline(always)]
pub const fn data_words(byte_count: u32, lkey: u32, addr: u64) -> [u64; 2] {
    let dw0 = put(DATA_BYTE_COUNT, byte_count);
    [be_pair(dw0, lkey), be64(addr)]
}

/// The receive terminator slot: byte_count 0, lkey `INVALID_LKEY`, addr 0 (§9.4).
pub const RECV_TERMINATOR: [u64; 2] = recv_terminator(INVALID_LKEY);

/// A receive terminator slot with key `lkey`: the firmware's
/// `terminate_scatter_list_mkey` where it advertises one (K ib/wr.c:1269,
/// QUERY_SPECIAL_CONTEXTS), else `INVALID_LKEY` (RC qp.c:3869; audit row 21).
pub const fn recv_terminator(lkey: u32) -> [u64; 2] {
    [be_pair(0, lkey), 0]
}

/// The two memory words of an atomic segment (§9.3).
#[inline(always)]
pub const fn atomic_words(swap_add: u64, compare: u64) -> [u64; 2] {
    [be64(swap_add), be64(compare)]
}

/// The inline segment header dword: `len | 0x80000000` (§9.3).
#[inline(always)]
pub const fn inline_header(len: u32) -> u32 {
    put(INLINE_LEN, len) | INLINE_SEG_FLAG
}

/// Which segments a request needs, its opcode and its size (§9.3 table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WqePlan {
    /// The WQE opcode.
    pub opcode: WqeOpcode,
    /// `imm` of the control segment (immediate data or the rkey to invalidate).
    pub imm: u32,
    /// Size in 16-byte units.
    pub ds: u32,
    /// Size in WQEBBs.
    pub wqebbs: u32,
    /// The payload travels inline (the SGEs are copied into the WQE).
    pub inline: bool,
    /// Inline payload bytes (0 when data segments are used).
    pub inline_len: usize,
    /// The completion opcode the request produces.
    pub wc_opcode: WcOpcode,
}

/// The limits a QP was created with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendLimits {
    /// Gather entries per send.
    pub max_sge: usize,
    /// Inline bytes per send.
    pub max_inline: usize,
    /// UD (datagram segment, sends only) rather than RC.
    pub ud: bool,
}

fn units(bytes: usize) -> u32 {
    bytes.div_ceil(DS_UNIT_BYTES) as u32
}

/// Plan one send WQE: opcode, size, inline length; every check that needs
/// nothing but the request and the limits.
pub fn plan<D>(wr: &SendWr<'_, D>, limits: &SendLimits) -> Result<WqePlan, PostFailure> {
    let (opcode, imm) = match wr.op {
        SendOp::Send => (WqeOpcode::Send, 0),
        SendOp::SendWithImm { imm } => (WqeOpcode::SendImm, imm),
        SendOp::SendWithInv { rkey } => (WqeOpcode::SendInval, rkey.get()),
        SendOp::RdmaWrite { .. } => (WqeOpcode::RdmaWrite, 0),
        SendOp::RdmaWriteWithImm { imm, .. } => (WqeOpcode::RdmaWriteImm, imm),
        SendOp::RdmaRead { .. } => (WqeOpcode::RdmaRead, 0),
        SendOp::AtomicCmpSwap { .. } => (WqeOpcode::AtomicCs, 0),
        SendOp::AtomicFetchAdd { .. } => (WqeOpcode::AtomicFa, 0),
    };
    let mut ds = 1; // control
    if limits.ud {
        if !matches!(wr.op, SendOp::Send | SendOp::SendWithImm { .. }) {
            return Err(PostFailure::Unsupported { op: wr.op.name() });
        }
        if wr.ud.is_none() {
            return Err(PostFailure::NoUdDest);
        }
        ds += units(DATAGRAM_SEG_BYTES);
    }
    if let Some((remote, _)) = wr.op.remote() {
        ds += 1; // remote address
        if wr.op.is_atomic() {
            if wr.sg_list.len() != 1 || wr.sg_list[0].length != 8 || remote % 8 != 0 {
                return Err(PostFailure::BadAtomic);
            }
            ds += 1; // atomic
        }
    }
    let inline = wr.flags.contains(SendFlags::INLINE)
        && !matches!(
            wr.op,
            SendOp::RdmaRead { .. } | SendOp::AtomicCmpSwap { .. } | SendOp::AtomicFetchAdd { .. }
        );
    let mut inline_len = 0;
    if inline {
        inline_len = wr.sg_list.iter().map(|s| s.length as usize).sum::<usize>();
        if inline_len > limits.max_inline {
            return Err(PostFailure::InlineTooLong {
                got: inline_len,
                max: limits.max_inline,
            });
        }
        if inline_len > 0 {
            ds += units(4 + inline_len);
        }
    } else {
        if wr.sg_list.len() > limits.max_sge {
            return Err(PostFailure::TooManySge {
                got: wr.sg_list.len(),
                max: limits.max_sge,
            });
        }
        // Zero-length SGEs are skipped (§9.3, as rdma-core).
        ds += wr.sg_list.iter().filter(|s| s.length > 0).count() as u32;
    }
    debug_assert!(ds <= MAX_DS);
    Ok(WqePlan {
        opcode,
        imm,
        ds,
        wqebbs: (ds as usize * DS_UNIT_BYTES).div_ceil(WQEBB_BYTES) as u32,
        inline,
        inline_len,
        wc_opcode: wr.op.wc_opcode(),
    })
}

/// Writes one WQE into a ring of memory words, wrapping at its end.
#[derive(Debug)]
pub struct RingWriter<'a> {
    words: &'a [AtomicU64],
    base: usize,
    mask: usize,
    pos: usize,
    /// How many words were written.
    pub len: usize,
}

impl<'a> RingWriter<'a> {
    /// A writer at word `start` of the ring `words[base .. base + mask + 1]`
    /// (`mask + 1` a power of two). `None` if the ring is not inside `words`.
    pub fn new(words: &'a [AtomicU64], base: usize, mask: usize, start: usize) -> Option<Self> {
        if base.checked_add(mask)? >= words.len() || !(mask + 1).is_power_of_two() {
            return None;
        }
        Some(RingWriter {
            words,
            base,
            mask,
            pos: start,
            len: 0,
        })
    }

    /// Store one word and move on.
    #[inline(always)]
    pub fn push(&mut self, word: u64) {
        let at = self.base + (self.pos & self.mask);
        // In bounds by construction: base + mask < words.len().
        if let Some(w) = self.words.get(at) {
            w.store(word, Ordering::Relaxed);
        }
        self.pos = self.pos.wrapping_add(1);
        self.len += 1;
    }

    /// Store a segment of two words.
    #[inline(always)]
    pub fn seg(&mut self, words: [u64; 2]) {
        self.push(words[0]);
        self.push(words[1]);
    }

    /// Store `bytes` (a multiple of 8 long after padding) as words.
    pub fn bytes(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            self.push(u64::from_ne_bytes(w));
        }
    }
}

/// The datagram segment of a UD send (extended address vector, §9 / K
/// `set_datagram_seg`), as bytes.
pub fn datagram_seg(
    dest: &rnic_core::UdDest,
    dmac: [u8; 6],
    udp_sport: u16,
) -> Result<[u8; DATAGRAM_SEG_BYTES], rnic_mlx5_prm::Error> {
    let mut b = [0u8; DATAGRAM_SEG_BYTES];
    let mut av = UdAdrsVector::new_checked(&mut b[..])?;
    av.set_q_key(dest.remote_qkey)?;
    av.set_ext(1)?;
    av.set_destination_qp_dct(dest.remote_qpn.get())?;
    av.set_rlid_udp_sport(udp_sport.into())?;
    av.set_rmac_47_16(u32::from_be_bytes([dmac[0], dmac[1], dmac[2], dmac[3]]))?;
    av.set_rmac_15_0(u32::from(u16::from_be_bytes([dmac[4], dmac[5]])))?;
    av.set_tclass(dest.av.traffic_class.into())?;
    av.set_hop_limit(dest.av.hop_limit.max(1).into())?;
    av.set_grh(1)?;
    av.set_src_addr_index(dest.av.sgid_index.into())?;
    av.set_flow_label(dest.av.flow_label & 0xf_ffff)?;
    av.set_rgid_rip(dest.av.dgid.raw())?;
    Ok(b)
}

/// A UD destination's datagram segment with what its address vector fixes
/// (destination GID and MAC, traffic class, hop limit, flow label, source
/// GID index, a given UDP source port) filled in once, when the address
/// handle is made ([`crate::Mlx5Ah`]); a post only puts in the peer's QPN,
/// its Q_Key and (when the vector leaves it to the driver) the UDP source
/// port derived from the two QPNs — the same bytes as [`datagram_seg`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DatagramTemplate {
    seg: [u8; DATAGRAM_SEG_BYTES],
    udp_sport: Option<u16>,
}

impl DatagramTemplate {
    /// The template of `av` sent to MAC `dmac`.
    pub fn new(
        av: &rnic_core::AddressVector,
        dmac: [u8; 6],
    ) -> Result<DatagramTemplate, rnic_mlx5_prm::Error> {
        let dest = rnic_core::UdDest {
            av: *av,
            remote_qpn: rnic_core::Qpn::from_wire(0),
            remote_qkey: 0,
        };
        Ok(DatagramTemplate {
            seg: datagram_seg(&dest, dmac, av.udp_sport.unwrap_or(0))?,
            udp_sport: av.udp_sport,
        })
    }

    /// The segment of a send from local QP `local_qpn` to QP `remote_qpn`
    /// under `remote_qkey`.
    #[inline]
    pub fn segment(
        &self,
        local_qpn: u32,
        remote_qpn: u32,
        remote_qkey: u32,
    ) -> Result<[u8; DATAGRAM_SEG_BYTES], rnic_mlx5_prm::Error> {
        let mut b = self.seg;
        let mut av = UdAdrsVector::new_checked(&mut b[..])?;
        av.set_q_key(remote_qkey)?;
        av.set_destination_qp_dct(remote_qpn)?;
        if self.udp_sport.is_none() {
            let sport = default_udp_sport(local_qpn, remote_qpn);
            av.set_rlid_udp_sport(sport.into())?;
        }
        Ok(b)
    }
}

/// Write the data segments of `sges` (zero-length ones skipped).
#[inline(always)]
pub fn push_sges(w: &mut RingWriter<'_>, sges: &[Sge]) {
    for s in sges {
        if s.length > 0 {
            w.seg(data_words(s.length, s.lkey.get(), s.addr));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rnic_core::{AddressVector, Gid, Lkey, Qpn, Rkey, UdDest};
    use rnic_mlx5_prm::{WqeAtomicSeg, WqeCtrlSeg, WqeDataSeg, WqeInlineSeg, WqeRaddrSeg};

    fn bytes_of(words: &[u64]) -> Vec<u8> {
        words.iter().flat_map(|w| w.to_ne_bytes()).collect()
    }

    #[test]
    fn a_datagram_template_gives_the_segment_built_field_by_field() {
        let own = [2, 0, 0x15, 0xb3, 0, 1];
        let mac = [0x02, 0x11, 0x22, 0x33, 0x44, 0x55];
        let v4 = AddressVector {
            traffic_class: 0x28,
            hop_limit: 9,
            flow_label: 0x1_2345,
            sgid_index: 2,
            ..AddressVector::new(Gid::from_ipv4("127.0.0.9".parse().unwrap()))
        };
        let cases = [
            v4,
            AddressVector {
                udp_sport: Some(0xc123),
                ..v4
            },
            AddressVector::new(Gid::link_local_from_mac(mac)),
            AddressVector {
                dmac: Some(mac),
                ..v4
            },
        ];
        for av in cases {
            let dmac = av
                .dmac
                .or_else(|| crate::firmware::neigh::link_local_mac(&av.dgid))
                .unwrap_or(own);
            let t = DatagramTemplate::new(&av, dmac).unwrap();
            for (local, remote, qkey) in [(0x11, 0x22, 0x1111_1111), (0xff_ffff, 0xab_cdef, 7)] {
                let dest = UdDest {
                    av,
                    remote_qpn: Qpn::from_wire(remote),
                    remote_qkey: qkey,
                };
                let sport = av
                    .udp_sport
                    .unwrap_or_else(|| default_udp_sport(local, remote));
                assert_eq!(
                    t.segment(local, remote, qkey).unwrap(),
                    datagram_seg(&dest, dmac, sport).unwrap(),
                    "{av:?} {local:#x} {remote:#x}"
                );
            }
        }
    }

    #[test]
    fn control_segment_matches_the_prm_view() {
        let mut golden = [0u8; 16];
        let mut v = WqeCtrlSeg::new_checked(&mut golden[..]).unwrap();
        v.set_opcode(WqeOpcode::RdmaWriteImm.as_raw().into())
            .unwrap();
        v.set_wqe_index(0xfffe).unwrap();
        v.set_qpn(0x12_3456).unwrap();
        v.set_ds(5).unwrap();
        v.set_fence_mode(FenceMode::SmallAndFence.as_raw().into())
            .unwrap();
        v.set_completion_mode(CompletionMode::Always.as_raw().into())
            .unwrap();
        v.set_solicited(1).unwrap();
        v.set_imm(0xdead_beef).unwrap();
        let flags = SendFlags::FENCE | SendFlags::SIGNALED | SendFlags::SOLICITED;
        let got = ctrl_words(
            WqeOpcode::RdmaWriteImm,
            0xfffe,
            0x12_3456,
            5,
            fm_ce_se(flags, false),
            0xdead_beef,
        );
        assert_eq!(bytes_of(&got), golden);
        // §9.1 byte by byte: opmod 0, index fffe, opcode 09; qpn 123456, ds 05;
        // signature 0; fm_ce_se = 4<<5 | 2<<2 | 1<<1 = 0x8a; imm.
        assert_eq!(
            golden,
            [
                0x00, 0xff, 0xfe, 0x09, 0x12, 0x34, 0x56, 0x05, 0, 0, 0, 0x8a, 0xde, 0xad, 0xbe,
                0xef
            ]
        );
    }

    #[test]
    fn unsignaled_and_signal_all() {
        assert_eq!(fm_ce_se(SendFlags::empty(), false), 0);
        assert_eq!(fm_ce_se(SendFlags::empty(), true), 0x08);
        assert_eq!(fm_ce_se(SendFlags::SIGNALED, false), 0x08);
    }

    #[test]
    fn raddr_data_atomic_inline_match_the_prm_views() {
        let mut g = [0u8; 16];
        let mut v = WqeRaddrSeg::new_checked(&mut g[..]).unwrap();
        v.set_raddr(0x0102_0304_0506_0708).unwrap();
        v.set_rkey(0xaabb_ccdd).unwrap();
        assert_eq!(
            bytes_of(&raddr_words(0x0102_0304_0506_0708, 0xaabb_ccdd)),
            g
        );

        let mut g = [0u8; 16];
        let mut v = WqeDataSeg::new_checked(&mut g[..]).unwrap();
        v.set_byte_count(4096).unwrap();
        v.set_lkey(0x0000_1234).unwrap();
        v.set_addr(0x7f00_0000_1000).unwrap();
        assert_eq!(bytes_of(&data_words(4096, 0x1234, 0x7f00_0000_1000)), g);

        let mut g = [0u8; 16];
        let mut v = WqeDataSeg::new_checked(&mut g[..]).unwrap();
        v.set_lkey(INVALID_LKEY).unwrap();
        assert_eq!(bytes_of(&RECV_TERMINATOR), g);

        let mut g = [0u8; 16];
        let mut v = WqeAtomicSeg::new_checked(&mut g[..]).unwrap();
        v.set_swap_add(0x1111_2222_3333_4444).unwrap();
        v.set_compare(0x5555_6666_7777_8888).unwrap();
        assert_eq!(
            bytes_of(&atomic_words(0x1111_2222_3333_4444, 0x5555_6666_7777_8888)),
            g
        );

        let mut g = [0u8; 4];
        let mut v = WqeInlineSeg::new_checked(&mut g[..]).unwrap();
        v.set_inline(1).unwrap();
        v.set_len(8).unwrap();
        assert_eq!(inline_header(8).to_be_bytes(), g);
        assert_eq!(g, [0x80, 0, 0, 8]);
    }

    fn limits() -> SendLimits {
        SendLimits {
            max_sge: 4,
            max_inline: 64,
            ud: false,
        }
    }

    #[test]
    fn plans_follow_the_composition_table() {
        let sge = [Sge::new(0x1000, 8, Lkey(0x100))];
        let two = [Sge::new(0x1000, 8, Lkey(1)), Sge::new(0x2000, 0, Lkey(1))];
        let l = limits();
        let p = plan(&SendWr::send(1, &sge), &l).unwrap();
        assert_eq!((p.opcode, p.ds, p.wqebbs), (WqeOpcode::Send, 2, 1));
        // A zero-length SGE is skipped.
        let p = plan(&SendWr::send(1, &two), &l).unwrap();
        assert_eq!(p.ds, 2);
        let p = plan(&SendWr::rdma_write(1, &sge, 0x10, Rkey(2)), &l).unwrap();
        assert_eq!((p.opcode, p.ds), (WqeOpcode::RdmaWrite, 3));
        let mut w = SendWr::rdma_write(1, &sge, 0x10, Rkey(2));
        w.flags = SendFlags::INLINE;
        let p = plan(&w, &l).unwrap();
        // ctrl + raddr + ceil((4 + 8) / 16).
        assert_eq!((p.ds, p.inline_len, p.wqebbs), (3, 8, 1));
        let p = plan(&SendWr::rdma_read(1, &sge, 0x10, Rkey(2)), &l).unwrap();
        assert_eq!(
            (p.opcode, p.ds, p.wc_opcode),
            (WqeOpcode::RdmaRead, 3, WcOpcode::RdmaRead)
        );
        let p = plan(&SendWr::atomic_cmp_swap(1, &sge, 0x10, Rkey(2), 1, 2), &l).unwrap();
        assert_eq!((p.opcode, p.ds), (WqeOpcode::AtomicCs, 4));
        let p = plan(
            &SendWr::new(1, SendOp::SendWithInv { rkey: Rkey(0x77) }, &sge),
            &l,
        )
        .unwrap();
        assert_eq!((p.opcode, p.imm), (WqeOpcode::SendInval, 0x77));
        let p = plan(&SendWr::send_with_imm(1, &sge, 0xabcd), &l).unwrap();
        assert_eq!((p.opcode, p.imm), (WqeOpcode::SendImm, 0xabcd));
        let five = [Sge::new(0, 1, Lkey(1)); 5];
        assert_eq!(
            plan(&SendWr::send(1, &five), &l),
            Err(PostFailure::TooManySge { got: 5, max: 4 })
        );
        let unaligned = plan(&SendWr::atomic_cmp_swap(1, &sge, 0x14, Rkey(2), 1, 2), &l);
        assert_eq!(unaligned, Err(PostFailure::BadAtomic));
        let big = [Sge::new(0, 65, Lkey(1))];
        let mut w = SendWr::send(1, &big);
        w.flags = SendFlags::INLINE;
        assert_eq!(
            plan(&w, &l),
            Err(PostFailure::InlineTooLong { got: 65, max: 64 })
        );
        // UD: sends only, with a destination; datagram adds 3 DS.
        let ud = SendLimits { ud: true, ..l };
        assert_eq!(
            plan(&SendWr::send(1, &sge), &ud),
            Err(PostFailure::NoUdDest)
        );
        assert!(matches!(
            plan(&SendWr::rdma_write(1, &sge, 0, Rkey(0)), &ud),
            Err(PostFailure::Unsupported { .. })
        ));
        let w = SendWr::send(1, &sge).to_ud(UdDest {
            av: AddressVector::new(Gid::ZERO),
            remote_qpn: Qpn::from_wire(5),
            remote_qkey: 7,
        });
        let p = plan(&w, &ud).unwrap();
        assert_eq!((p.ds, p.wqebbs), (5, 2));
    }

    #[test]
    fn writer_wraps_at_the_ring_end() {
        let ring: Vec<AtomicU64> = (0..24).map(|_| AtomicU64::new(0)).collect();
        // Ring of 16 words at base 8; start 2 words before its end.
        let mut w = RingWriter::new(&ring, 8, 15, 14).unwrap();
        for i in 1..=4u64 {
            w.push(i);
        }
        let got: Vec<u64> = ring.iter().map(|a| a.load(Ordering::Relaxed)).collect();
        assert_eq!(got[22], 1);
        assert_eq!(got[23], 2);
        assert_eq!(got[8], 3);
        assert_eq!(got[9], 4);
        assert_eq!(got[..8], [0; 8]);
        assert_eq!(w.len, 4);
        assert!(RingWriter::new(&ring, 16, 15, 0).is_none());
        assert!(RingWriter::new(&ring, 0, 14, 0).is_none());
    }

    #[test]
    fn datagram_segment_carries_qpn_qkey_and_gid() {
        let gid = Gid::from_ipv4(std::net::Ipv4Addr::new(127, 0, 0, 2));
        let dest = UdDest {
            av: AddressVector::new(gid),
            remote_qpn: Qpn::from_wire(0x12),
            remote_qkey: 0x1111_1111,
        };
        let b = datagram_seg(&dest, [2, 0, 0x15, 0xb3, 0x10, 0x17], 0xc001).unwrap();
        assert_eq!(&b[0..4], &[0x11; 4]);
        assert_eq!(&b[8..12], &[0x80, 0, 0, 0x12]);
        assert_eq!(&b[32..48], gid.raw());
        assert_eq!(&b[14..16], &[0xc0, 0x01]);
    }
}
