//! An in-memory [`Provider`] for tests: records every call, hands out
//! handles, and produces the completions a test scripts.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::access::AccessFlags;
use crate::memory::Memory;
use crate::provider::{
    CqHandle, CqInfo, DeviceAttr, GidEntry, MrHandle, MrInfo, PdHandle, PortAttr, PostError,
    Provider, QpHandle, QpInfo, VerbsError,
};
use crate::qp::{QpAttr, QpAttrMask, QpInitAttr, QpState};
use crate::types::{Lkey, Qpn, Rkey};
use crate::wr::{RecvWr, SendWr, WcOpcode, WcStatus, WorkCompletion};

/// A send completion of `qpn`.
fn send_wc(qpn: Qpn, wr_id: u64, status: WcStatus) -> WorkCompletion {
    WorkCompletion {
        wr_id,
        status,
        opcode: WcOpcode::Send,
        qp_num: qpn,
        ..WorkCompletion::default()
    }
}

/// One recorded provider call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Call {
    AllocPd(PdHandle),
    DeallocPd(PdHandle),
    RegMr(MrHandle),
    DeregMr(MrHandle),
    CreateCq(CqHandle),
    DestroyCq(CqHandle),
    CreateQp(QpHandle),
    ModifyQp(QpHandle, QpAttrMask),
    DestroyQp(QpHandle),
    /// The `(wr_id, signaled flag)` of each request accepted.
    PostSend(QpHandle, Vec<(u64, bool)>),
    /// The `wr_id` of each request accepted.
    PostRecv(QpHandle, Vec<u64>),
}

impl Call {
    pub(crate) fn is_teardown(&self) -> bool {
        matches!(
            self,
            Call::DeallocPd(_) | Call::DeregMr(_) | Call::DestroyCq(_) | Call::DestroyQp(_)
        )
    }
}

#[derive(Debug)]
struct FakeQp {
    qpn: Qpn,
    send_cq: CqHandle,
    recv_cq: CqHandle,
    state: QpState,
}

#[derive(Debug, Default)]
struct State {
    next: u32,
    calls: Vec<Call>,
    cqs: HashMap<CqHandle, VecDeque<WorkCompletion>>,
    qps: HashMap<QpHandle, FakeQp>,
    /// The next post_send accepts this many requests, then refuses.
    refuse_send_after: Option<usize>,
    /// The next post_recv accepts this many requests, then refuses.
    refuse_recv_after: Option<usize>,
    /// Complete every signaled send successfully as it is posted.
    auto_complete: bool,
}

/// The fake device.
#[derive(Debug, Default)]
pub(crate) struct FakeProvider {
    state: Mutex<State>,
}

impl FakeProvider {
    pub(crate) fn new() -> Arc<FakeProvider> {
        Arc::new(FakeProvider::default())
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn calls(&self) -> Vec<Call> {
        self.lock().calls.clone()
    }

    pub(crate) fn teardown_calls(&self) -> Vec<Call> {
        self.lock()
            .calls
            .iter()
            .filter(|c| c.is_teardown())
            .cloned()
            .collect()
    }

    pub(crate) fn count_modify_calls(&self) -> usize {
        self.lock()
            .calls
            .iter()
            .filter(|c| matches!(c, Call::ModifyQp(..)))
            .count()
    }

    pub(crate) fn posted_sends(&self) -> Vec<u64> {
        self.lock()
            .calls
            .iter()
            .filter_map(|c| match c {
                Call::PostSend(_, wrs) => Some(wrs.iter().map(|w| w.0).collect::<Vec<_>>()),
                _ => None,
            })
            .flatten()
            .collect()
    }

    pub(crate) fn posted_recvs(&self) -> Vec<u64> {
        self.lock()
            .calls
            .iter()
            .filter_map(|c| match c {
                Call::PostRecv(_, ids) => Some(ids.clone()),
                _ => None,
            })
            .flatten()
            .collect()
    }

    pub(crate) fn refuse_next_send_after(&self, accepted: usize) {
        self.lock().refuse_send_after = Some(accepted);
    }

    pub(crate) fn refuse_next_recv_after(&self, accepted: usize) {
        self.lock().refuse_recv_after = Some(accepted);
    }

    pub(crate) fn set_auto_complete(&self, on: bool) {
        self.lock().auto_complete = on;
    }

    /// Queue a send completion for `wr_id` on `qp`'s send CQ.
    pub(crate) fn complete_send(&self, qp: QpHandle, wr_id: u64, status: WcStatus) {
        let mut s = self.lock();
        let Some(q) = s.qps.get(&qp) else { return };
        let (cq, qpn) = (q.send_cq, q.qpn);
        s.cqs
            .entry(cq)
            .or_default()
            .push_back(send_wc(qpn, wr_id, status));
    }

    /// Queue a receive completion for `wr_id` on `qp`'s receive CQ.
    pub(crate) fn complete_recv(&self, qp: QpHandle, wr_id: u64, status: WcStatus) {
        let mut s = self.lock();
        let Some(q) = s.qps.get(&qp) else { return };
        let (cq, qpn) = (q.recv_cq, q.qpn);
        let wc = WorkCompletion {
            wr_id,
            status,
            opcode: WcOpcode::Recv,
            byte_len: 64,
            qp_num: qpn,
            ..WorkCompletion::default()
        };
        s.cqs.entry(cq).or_default().push_back(wc);
    }

    /// Queue an arbitrary completion.
    pub(crate) fn push_completion(&self, cq: CqHandle, wc: WorkCompletion) {
        self.lock().cqs.entry(cq).or_default().push_back(wc);
    }

    fn handle(s: &mut State) -> u32 {
        s.next += 1;
        s.next
    }

    /// Drop the queued completions of `qpn` (what RESET and destroy do).
    fn clean_cqs(s: &mut State, qpn: Qpn) {
        for queue in s.cqs.values_mut() {
            queue.retain(|wc| wc.qp_num != qpn);
        }
    }
}

impl Provider for FakeProvider {
    fn backend(&self) -> &'static str {
        "fake"
    }

    fn query_device(&self) -> Result<DeviceAttr, VerbsError> {
        Ok(DeviceAttr {
            fw_ver: "fake".to_owned(),
            max_qp: 64,
            ..DeviceAttr::default()
        })
    }

    fn query_port(&self, port_num: u8) -> Result<PortAttr, VerbsError> {
        if port_num == 1 {
            Ok(PortAttr::default())
        } else {
            Err(VerbsError::QueryPort {
                port: port_num,
                reason: "the fake device has one port".to_owned(),
            })
        }
    }

    fn query_gid_table(&self, _port_num: u8) -> Result<Vec<GidEntry>, VerbsError> {
        Ok(Vec::new())
    }

    fn alloc_pd(&self) -> Result<PdHandle, VerbsError> {
        let mut s = self.lock();
        let h = PdHandle(Self::handle(&mut s));
        s.calls.push(Call::AllocPd(h));
        Ok(h)
    }

    fn dealloc_pd(&self, pd: PdHandle) -> Result<(), VerbsError> {
        self.lock().calls.push(Call::DeallocPd(pd));
        Ok(())
    }

    fn reg_mr(
        &self,
        _pd: PdHandle,
        memory: Arc<dyn Memory>,
        _access: AccessFlags,
    ) -> Result<MrInfo, VerbsError> {
        let mut s = self.lock();
        let n = Self::handle(&mut s);
        let handle = MrHandle(n);
        s.calls.push(Call::RegMr(handle));
        Ok(MrInfo {
            handle,
            lkey: Lkey::from_parts(n, 0x11),
            rkey: Rkey::from_parts(n, 0x22),
            addr: memory.addr(),
            len: memory.len(),
        })
    }

    fn dereg_mr(&self, mr: MrHandle) -> Result<(), VerbsError> {
        self.lock().calls.push(Call::DeregMr(mr));
        Ok(())
    }

    fn create_cq(&self, depth: u32) -> Result<CqInfo, VerbsError> {
        let mut s = self.lock();
        let handle = CqHandle(Self::handle(&mut s));
        s.calls.push(Call::CreateCq(handle));
        s.cqs.insert(handle, VecDeque::new());
        Ok(CqInfo { handle, depth })
    }

    fn destroy_cq(&self, cq: CqHandle) -> Result<(), VerbsError> {
        let mut s = self.lock();
        s.cqs.remove(&cq);
        s.calls.push(Call::DestroyCq(cq));
        Ok(())
    }

    fn create_qp(
        &self,
        _pd: PdHandle,
        send_cq: CqHandle,
        recv_cq: CqHandle,
        init: &QpInitAttr,
    ) -> Result<QpInfo, VerbsError> {
        let mut s = self.lock();
        let n = Self::handle(&mut s);
        let handle = QpHandle(n);
        let qpn = Qpn::from_wire(0x100 + n);
        s.calls.push(Call::CreateQp(handle));
        s.qps.insert(
            handle,
            FakeQp {
                qpn,
                send_cq,
                recv_cq,
                state: QpState::Reset,
            },
        );
        Ok(QpInfo {
            handle,
            qpn,
            caps: init.caps,
        })
    }

    fn modify_qp(&self, qp: QpHandle, attr: &QpAttr, mask: QpAttrMask) -> Result<(), VerbsError> {
        let mut s = self.lock();
        s.calls.push(Call::ModifyQp(qp, mask));
        let Some(q) = s.qps.get_mut(&qp) else {
            return Err(VerbsError::ModifyQp {
                qp,
                mask,
                reason: "no such QP".to_owned(),
            });
        };
        if mask.contains(QpAttrMask::STATE) {
            q.state = attr.qp_state;
        }
        let (state, qpn) = (q.state, q.qpn);
        if state == QpState::Reset {
            Self::clean_cqs(&mut s, qpn);
        }
        Ok(())
    }

    fn query_qp(&self, qp: QpHandle) -> Result<QpAttr, VerbsError> {
        let s = self.lock();
        let q = s.qps.get(&qp).ok_or_else(|| VerbsError::QueryQp {
            qp,
            reason: "no such QP".to_owned(),
        })?;
        Ok(QpAttr {
            qp_state: q.state,
            ..QpAttr::default()
        })
    }

    fn destroy_qp(&self, qp: QpHandle) -> Result<(), VerbsError> {
        let mut s = self.lock();
        s.calls.push(Call::DestroyQp(qp));
        if let Some(q) = s.qps.remove(&qp) {
            Self::clean_cqs(&mut s, q.qpn);
        }
        Ok(())
    }

    fn post_send(&self, qp: QpHandle, wrs: &[SendWr<'_>]) -> Result<(), VerbsError> {
        let mut s = self.lock();
        let accept = s
            .refuse_send_after
            .take()
            .map_or(wrs.len(), |n| n.min(wrs.len()));
        let accepted: Vec<(u64, bool)> = wrs[..accept]
            .iter()
            .map(|w| (w.wr_id, w.flags.contains(crate::wr::SendFlags::SIGNALED)))
            .collect();
        if s.auto_complete
            && let Some((cq, qpn)) = s.qps.get(&qp).map(|q| (q.send_cq, q.qpn))
        {
            let queue = s.cqs.entry(cq).or_default();
            for &(wr_id, _) in accepted.iter().filter(|w| w.1) {
                queue.push_back(send_wc(qpn, wr_id, WcStatus::Success));
            }
        }
        s.calls.push(Call::PostSend(qp, accepted));
        if accept < wrs.len() {
            return Err(VerbsError::PostSend {
                index: accept,
                reason: PostError::Device("the fake device refused it"),
            });
        }
        Ok(())
    }

    fn post_recv(&self, qp: QpHandle, wrs: &[RecvWr<'_>]) -> Result<(), VerbsError> {
        let mut s = self.lock();
        let accept = s
            .refuse_recv_after
            .take()
            .map_or(wrs.len(), |n| n.min(wrs.len()));
        s.calls.push(Call::PostRecv(
            qp,
            wrs[..accept].iter().map(|w| w.wr_id).collect(),
        ));
        if accept < wrs.len() {
            return Err(VerbsError::PostRecv {
                index: accept,
                reason: PostError::Device("the fake device refused it"),
            });
        }
        Ok(())
    }

    fn poll_cq(&self, cq: CqHandle, wcs: &mut [WorkCompletion]) -> Result<usize, VerbsError> {
        let mut s = self.lock();
        let queue = s.cqs.entry(cq).or_default();
        let mut n = 0;
        for slot in wcs.iter_mut() {
            let Some(wc) = queue.pop_front() else { break };
            *slot = wc;
            n += 1;
        }
        Ok(n)
    }

    fn req_notify_cq(&self, _cq: CqHandle, _solicited_only: bool) -> Result<(), VerbsError> {
        Ok(())
    }
}
