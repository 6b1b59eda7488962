//! UD send and receive: one SEND_ONLY(_IMM) with DETH per work request.
//!
//! A UD send completes as soon as its packet is in the sink. A UD receive
//! checks the Q_Key, needs a posted receive (there is no RNR on UD: the
//! datagram is dropped and counted), and lands behind a 40-byte GRH area.

use rnic_core::{Gid, SendFlags, SendOp, WcFlags, WcOpcode, WcStatus, WorkCompletion};

use super::pkt::{Out, Pkt, f, op};
use super::qp::{Qp, Tx, transmit};
use super::queue::{sgl_check, sgl_write};
use super::{Access, Io, PacketDest};

/// Bytes reserved at the start of a UD receive buffer for the GRH.
pub const GRH_LEN: usize = 40;

/// Q_Keys with this bit set in a work request mean "use the QP's Q_Key".
const QKEY_FROM_QP: u32 = 0x8000_0000;

impl Qp {
    /// Send every queued UD work request the sink has room for.
    pub(crate) fn ud_send(&mut self, io: &mut Io<'_>) {
        let mtu = u64::from(self.a.path_mtu.bytes());
        loop {
            let idx = self.sq.head;
            let Some(w) = self.sq.get(idx).copied() else {
                return;
            };
            let imm = match w.op {
                SendOp::Send => None,
                SendOp::SendWithImm { imm } => Some(imm),
                _ => {
                    self.fail_head(WcStatus::LocQpOpErr, io);
                    return;
                }
            };
            let Some(dest) = w.ud else {
                self.fail_head(WcStatus::LocQpOpErr, io);
                return;
            };
            if w.len > mtu {
                self.fail_head(WcStatus::LocLenErr, io);
                return;
            }
            if !w.inline
                && sgl_check(&*io.mem, self.cfg.pd, self.sq.sges(idx), Access::LocalRead).is_err()
            {
                self.fail_head(WcStatus::LocProtErr, io);
                return;
            }
            let qkey = if dest.remote_qkey & QKEY_FROM_QP != 0 {
                self.a.qkey
            } else {
                dest.remote_qkey
            };
            let o = Out {
                opcode: if imm.is_some() {
                    op::UD_SEND_ONLY_IMM
                } else {
                    op::UD_SEND_ONLY
                },
                se: w.flags.contains(SendFlags::SOLICITED),
                dest_qp: dest.remote_qpn,
                ack_req: true,
                psn: self.req.next_psn,
                imm: imm.unwrap_or(0),
                qkey,
                src_qp: self.cfg.qpn,
                ..Out::default()
            };
            let pd = self.cfg.pd;
            let to = PacketDest {
                av: dest.av,
                qpn: dest.remote_qpn,
            };
            let sq = &self.sq;
            let mem = &*io.mem;
            let t = transmit(io.tx, &o, w.len as usize, &to, |buf| {
                sq.read_payload(mem, pd, idx, 0, buf)
            });
            self.count_tx(&t);
            match t {
                Tx::Full => return,
                Tx::Fill => {
                    self.fail_head(WcStatus::LocProtErr, io);
                    return;
                }
                Tx::Sent(_) => {}
            }
            self.req.next_psn = self.req.next_psn.next();
            self.req.idx = idx.wrapping_add(1);
            self.complete_send(idx, WcStatus::Success, io.cq);
        }
    }

    /// Deliver one UD datagram sent from `src` to local GID `dst`.
    pub(crate) fn ud_receive(&mut self, p: &Pkt<'_>, src: Gid, dst: Gid, io: &mut Io<'_>) {
        if p.qkey != self.a.qkey {
            self.stats.drops.qkey_mismatch += 1;
            return;
        }
        let Some(recv) = self.rq.front() else {
            self.stats.drops.no_receive += 1;
            return;
        };
        let n = p.payload.len();
        let total = (GRH_LEN + n) as u64;
        let mut wc_flags = WcFlags::GRH;
        if p.any(f::IMM) {
            wc_flags |= WcFlags::WITH_IMM;
        }
        let mut wc = WorkCompletion {
            wr_id: recv.wr_id,
            status: WcStatus::Success,
            opcode: WcOpcode::Recv,
            qp_num: self.cfg.qpn,
            byte_len: u32::try_from(total).unwrap_or(u32::MAX),
            imm_data: p.any(f::IMM).then_some(p.imm),
            src_qp: p.src_qp,
            wc_flags,
            ..WorkCompletion::default()
        };
        if total > recv.len {
            wc.status = WcStatus::LocLenErr;
            wc.byte_len = 0;
            self.push_recv(wc, io);
            return;
        }
        let grh = grh_bytes(src, dst, n);
        let sges = self.rq.front_sges();
        let pd = self.cfg.pd;
        let res = sgl_write(io.mem, pd, sges, 0, &grh)
            .and_then(|()| sgl_write(io.mem, pd, sges, GRH_LEN as u64, p.payload));
        if res.is_err() {
            wc.status = WcStatus::LocProtErr;
            wc.byte_len = 0;
        }
        self.push_recv(wc, io);
    }
}

/// An IB GRH as the receive buffer's first 40 bytes: version 6, payload
/// length, next header 0x1B (IBA transport), hop limit 64, SGID, DGID.
fn grh_bytes(sgid: Gid, dgid: Gid, paylen: usize) -> [u8; GRH_LEN] {
    let mut g = [0u8; GRH_LEN];
    g[0] = 0x60;
    let pl = u16::try_from(paylen).unwrap_or(u16::MAX).to_be_bytes();
    g[4] = pl[0];
    g[5] = pl[1];
    g[6] = 0x1b;
    g[7] = 64;
    g[8..24].copy_from_slice(sgid.raw());
    g[24..40].copy_from_slice(dgid.raw());
    g
}
