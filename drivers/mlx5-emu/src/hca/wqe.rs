//! Send-WQE parsing (mlx5.md §9) and CQE building (§10): the byte formats of the data path,
//! apart from the state machine in `dp`.

use std::net::IpAddr;

use rnic_core::{
    AddressVector, Gid, Lkey, Qpn, Rkey, SendFlags, SendOp, Sge, UdDest, WcFlags, WcOpcode,
    WorkCompletion,
};
use rnic_mlx5_prm::{
    Cqe64, CqeOpcode, CqeSyndrome, ErrCqe, INLINE_SEG_FLAG, UdAdrsVector, WqeAtomicSeg, WqeCtrlSeg,
    WqeDataSeg, WqeOpcode, WqeRaddrSeg, cqe_l3_hdr_type,
};

use super::port::GidEntry;
use super::qp::{QpObj, SendMeta};
use super::queues::CQE;

/// A parsed send WQE.
pub(crate) struct Parsed {
    pub(crate) op: SendOp,
    pub(crate) sges: Vec<Sge>,
    pub(crate) inline: Option<Vec<u8>>,
    pub(crate) ud: Option<UdDest>,
    pub(crate) flags: SendFlags,
    pub(crate) atomic_result: Option<(u32, u64)>,
    pub(crate) len: u64,
}

pub(crate) fn be32(b: &[u8], at: usize) -> u32 {
    let mut x = [0u8; 4];
    if let Some(s) = b.get(at..at + 4) {
        x.copy_from_slice(s);
    }
    u32::from_be_bytes(x)
}

/// Parse the segments after the control segment. `Err(syndrome)` for a WQE the hardware
/// refuses before the transport sees it.
pub(crate) fn parse_segments(
    qp: &QpObj,
    op: WqeOpcode,
    ctrl: &WqeCtrlSeg<&[u8]>,
    body: &[u8],
    gids: &[Option<GidEntry>],
) -> Result<Parsed, u8> {
    let qp_op = CqeSyndrome::LocalQpOp.as_raw();
    let len_err = CqeSyndrome::LocalLength.as_raw();
    let mut at = 0usize;
    let mut seg = |n: usize| -> Result<&[u8], u8> {
        let s = body.get(at..at + n).ok_or(qp_op)?;
        at += n;
        Ok(s)
    };
    let mut ud = None;
    if qp.ud {
        let av = UdAdrsVector::new_unchecked(seg(UdAdrsVector::<&[u8]>::SIZE_BYTES)?);
        let gi = av.src_addr_index();
        if gids.get(gi as usize).copied().flatten().is_none() {
            return Err(qp_op);
        }
        let mut g = [0u8; 16];
        g.copy_from_slice(av.rgid_rip());
        let qkey = if av.q_key() & 0x8000_0000 != 0 {
            qp.q_key
        } else {
            av.q_key()
        };
        let sport = av.rlid_udp_sport() as u16;
        ud = Some(UdDest {
            av: AddressVector {
                dgid: Gid(g),
                sgid_index: gi as u8,
                hop_limit: av.hop_limit() as u8,
                traffic_class: av.tclass() as u8,
                flow_label: av.flow_label(),
                udp_sport: (sport != 0).then_some(sport),
                dmac: Some({
                    let (hi, lo) = (av.rmac_47_16().to_be_bytes(), av.rmac_15_0().to_be_bytes());
                    [hi[0], hi[1], hi[2], hi[3], lo[2], lo[3]]
                }),
            },
            remote_qpn: Qpn::from_wire(av.destination_qp_dct()),
            remote_qkey: qkey,
        });
    }
    let imm = ctrl.imm();
    let mut remote = (0u64, 0u32);
    if matches!(
        op,
        WqeOpcode::RdmaWrite
            | WqeOpcode::RdmaWriteImm
            | WqeOpcode::RdmaRead
            | WqeOpcode::AtomicCs
            | WqeOpcode::AtomicFa
    ) {
        let r = WqeRaddrSeg::new_unchecked(seg(16)?);
        remote = (r.raddr(), r.rkey());
    }
    let mut atomic = (0u64, 0u64);
    if matches!(op, WqeOpcode::AtomicCs | WqeOpcode::AtomicFa) {
        let a = WqeAtomicSeg::new_unchecked(seg(16)?);
        atomic = (a.swap_add(), a.compare());
    }
    let (rk, raddr) = (Rkey(remote.1), remote.0);
    let sop = match op {
        WqeOpcode::Send => SendOp::Send,
        WqeOpcode::SendImm => SendOp::SendWithImm { imm },
        WqeOpcode::SendInval => SendOp::SendWithInv { rkey: Rkey(imm) },
        WqeOpcode::RdmaWrite => SendOp::RdmaWrite {
            remote_addr: raddr,
            rkey: rk,
        },
        WqeOpcode::RdmaWriteImm => SendOp::RdmaWriteWithImm {
            remote_addr: raddr,
            rkey: rk,
            imm,
        },
        WqeOpcode::RdmaRead => SendOp::RdmaRead {
            remote_addr: raddr,
            rkey: rk,
        },
        WqeOpcode::AtomicCs => SendOp::AtomicCmpSwap {
            remote_addr: raddr,
            rkey: rk,
            compare: atomic.1,
            swap: atomic.0,
        },
        WqeOpcode::AtomicFa => SendOp::AtomicFetchAdd {
            remote_addr: raddr,
            rkey: rk,
            add: atomic.0,
        },
        _ => return Err(qp_op),
    };
    // Data: pointer segments or inline segments, not both.
    let mut sges = Vec::new();
    let mut inline: Option<Vec<u8>> = None;
    while at < body.len() {
        let head = be32(body, at);
        if head & INLINE_SEG_FLAG != 0 {
            if !sges.is_empty() {
                return Err(qp_op);
            }
            let n = (head & !INLINE_SEG_FLAG) as usize;
            let padded = (4 + n).div_ceil(16) * 16;
            let data = body.get(at + 4..at + 4 + n).ok_or(qp_op)?;
            inline.get_or_insert_with(Vec::new).extend_from_slice(data);
            at += padded;
        } else {
            if inline.is_some() {
                return Err(qp_op);
            }
            let d = WqeDataSeg::new_unchecked(body.get(at..at + 16).ok_or(qp_op)?);
            // byte_count 0 means 2 GiB, beyond any log_msg_max: a local length error.
            let n = d.byte_count();
            if n == 0 || n > 0x8000_0000 {
                return Err(len_err);
            }
            sges.push(Sge::new(d.addr(), n, Lkey(d.lkey())));
            at += 16;
        }
    }
    let len = match &inline {
        Some(b) => b.len() as u64,
        None => sges.iter().map(|s| u64::from(s.length)).sum(),
    };
    if len > 1u64 << qp.log_msg_max {
        return Err(len_err);
    }
    // A UD message fits one packet: above the QP's MTU it is a local length error (set only
    // while the ud-mtu check is on).
    if qp.ud && qp.ud_mtu.is_some_and(|m| len > u64::from(m)) {
        return Err(len_err);
    }
    let rd_atomic = matches!(
        op,
        WqeOpcode::RdmaRead | WqeOpcode::AtomicCs | WqeOpcode::AtomicFa
    );
    if rd_atomic && inline.is_some() {
        return Err(qp_op);
    }
    let mut atomic_result = None;
    if matches!(op, WqeOpcode::AtomicCs | WqeOpcode::AtomicFa) {
        if sges.len() != 1 || sges[0].length != 8 {
            return Err(len_err);
        }
        atomic_result = Some((sges[0].lkey.0, sges[0].addr));
    }
    if qp.ud && !matches!(op, WqeOpcode::Send | WqeOpcode::SendImm) {
        return Err(qp_op);
    }
    let mut flags = SendFlags::SIGNALED;
    if ctrl.solicited() == 1 {
        flags |= SendFlags::SOLICITED;
    }
    // Fence modes 2 (fence), 3 (strong ordering), 4 (small and fence) wait for earlier
    // READs/atomics; 1 (initiator small fence) does not stall the emulated requester.
    if ctrl.fence_mode() >= 2 {
        flags |= SendFlags::FENCE;
    }
    if inline.is_some() {
        flags |= SendFlags::INLINE;
    }
    Ok(Parsed {
        op: sop,
        sges,
        inline,
        ud,
        flags,
        atomic_result,
        len,
    })
}

fn l3_type(qp: &QpObj) -> u32 {
    match qp.src {
        Some((_, IpAddr::V6(_))) => cqe_l3_hdr_type::IPV6,
        _ => cqe_l3_hdr_type::IPV4,
    }
}

/// A requester CQE (opcode REQ) for `m`.
pub(crate) fn req_cqe(qp: &QpObj, m: &SendMeta) -> [u8; CQE] {
    let mut b = [0u8; CQE];
    let mut c = Cqe64::new_unchecked(&mut b[..]);
    let _ = c.set_opcode(u32::from(CqeOpcode::Req.as_raw()));
    let _ = c.set_wqe_opcode(u32::from(m.opcode));
    let _ = c.set_qpn(qp.qpn);
    let _ = c.set_wqe_counter(u32::from(m.index));
    let _ = c.set_srqn_uidx(qp.user_index);
    let op = WqeOpcode::from_raw(m.opcode);
    if matches!(
        op,
        WqeOpcode::RdmaRead | WqeOpcode::AtomicCs | WqeOpcode::AtomicFa
    ) {
        let _ = c.set_byte_cnt(m.len);
    }
    if m.solicited {
        let _ = c.set_se(1);
    }
    b
}

/// A responder CQE for RQ WQE `idx`.
pub(crate) fn resp_cqe(qp: &QpObj, idx: u16, wc: &WorkCompletion) -> [u8; CQE] {
    let mut b = [0u8; CQE];
    let mut c = Cqe64::new_unchecked(&mut b[..]);
    let op = match (wc.opcode, wc.imm_data, wc.invalidated_rkey) {
        (WcOpcode::RecvRdmaWithImm, ..) => CqeOpcode::RespWrImm,
        (_, Some(_), _) => CqeOpcode::RespSendImm,
        (_, _, Some(_)) => CqeOpcode::RespSendInv,
        _ => CqeOpcode::RespSend,
    };
    let _ = c.set_opcode(u32::from(op.as_raw()));
    let _ = c.set_byte_cnt(wc.byte_len);
    if let Some(imm) = wc.imm_data {
        let _ = c.set_imm_inval_pkey(imm);
    } else if let Some(r) = wc.invalidated_rkey {
        let _ = c.set_imm_inval_pkey(r.0);
    }
    let _ = c.set_qpn(qp.qpn);
    let _ = c.set_wqe_counter(u32::from(idx));
    let _ = c.set_srqn_uidx(qp.user_index);
    if qp.ud {
        let _ = c.set_rqpn(wc.src_qp.get());
        let _ = c.set_g(u32::from(wc.wc_flags.contains(WcFlags::GRH)));
        let ipv6 = wc.wc_flags.contains(WcFlags::GRH) && l3_type(qp) == cqe_l3_hdr_type::IPV6;
        let _ = c.set_l3_hdr_type(if ipv6 {
            cqe_l3_hdr_type::IPV6
        } else {
            cqe_l3_hdr_type::IPV4
        });
    } else {
        let _ = c.set_l3_hdr_type(l3_type(qp));
    }
    b
}

/// An error CQE.
pub(crate) fn err_cqe(
    qp: &QpObj,
    op: CqeOpcode,
    syndrome: u8,
    wqe_opcode: u8,
    counter: u16,
) -> [u8; CQE] {
    err_cqe_vendor(qp, op, syndrome, 0, wqe_opcode, counter)
}

/// [`err_cqe`] with `vendor_err_synd` = `vendor`.
pub(crate) fn err_cqe_vendor(
    qp: &QpObj,
    op: CqeOpcode,
    syndrome: u8,
    vendor: u8,
    wqe_opcode: u8,
    counter: u16,
) -> [u8; CQE] {
    let mut b = [0u8; CQE];
    let mut c = ErrCqe::new_unchecked(&mut b[..]);
    let _ = c.set_opcode(u32::from(op.as_raw()));
    let _ = c.set_syndrome(u32::from(syndrome));
    let _ = c.set_vendor_err_synd(u32::from(vendor));
    let _ = c.set_wqe_opcode(u32::from(wqe_opcode));
    let _ = c.set_qpn(qp.qpn);
    let _ = c.set_wqe_counter(u32::from(counter));
    let _ = c.set_srqn(qp.user_index);
    b
}
