//! An in-memory [`Provider`] for tests: records every call, hands out
//! objects, and produces the completions a test scripts. It keeps the
//! driver side of the contract as a real driver must: it checks requests,
//! state and queue room, frees room only at poll, and says how many
//! unsignaled requests each send completion retires.

use std::collections::{HashMap, VecDeque};
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::access::AccessFlags;
use crate::error::{DeviceError, DeviceErrorKind};
use crate::memory::Memory;
use crate::provider::{
    CqOps, DeviceAttr, GidEntry, HostDomain, MrInfo, Outstanding, PortAttr, PostError, Provider,
    QpInfo, QpOps, VerbsError,
};
use crate::qp::{AddressVector, QpAttr, QpAttrMask, QpCaps, QpInitAttr, QpState, QpType};
use crate::types::{Lkey, Qpn, Rkey};
use crate::wr::{RecvWr, SendWr, WcOpcode, WcStatus, WorkCompletion};

/// One recorded provider call (objects named by the fake's ids; QPs by QPN).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Call {
    AllocPd(u32),
    DeallocPd(u32),
    RegMr(u32),
    DeregMr(u32),
    CreateCq(u32),
    DestroyCq(u32),
    CreateQp(Qpn),
    ModifyQp(Qpn, QpAttrMask),
    DestroyQp(Qpn),
    /// The `(wr_id, signaled flag)` of each request accepted.
    PostSend(Qpn, Vec<(u64, bool)>),
    /// The `wr_id` of each request accepted.
    PostRecv(Qpn, Vec<u64>),
    /// An address vector checked and resolved (`create_ah`).
    CreateAh,
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
struct QpRec {
    qp_type: QpType,
    caps: QpCaps,
    sig_all: bool,
    send_cq: u32,
    recv_cq: u32,
    state: QpState,
    /// Posted sends the fake has not completed: `(wr_id, signaled)`.
    sq: VecDeque<(u64, bool)>,
    sq_outstanding: u32,
    rq_outstanding: u32,
}

#[derive(Debug, Default)]
struct State {
    next: u32,
    calls: Vec<Call>,
    cqs: HashMap<u32, VecDeque<WorkCompletion>>,
    qps: HashMap<Qpn, QpRec>,
    refuse_send_after: Option<usize>,
    refuse_recv_after: Option<usize>,
    auto_complete: bool,
    /// Address vectors checked (`create_ah`, and nowhere else).
    av_checks: u32,
    /// UD sends posted, each through the handle's resolved destination.
    ud_sent: Vec<(u64, crate::wr::UdDest)>,
    /// `QpOps::try_post_send_one` takes what it is offered (else declines).
    take_one_sends: bool,
    /// Requests offered to `try_post_send_one`, and those it took.
    offered_one_sends: u32,
    taken_one_sends: u32,
    /// Calls of `QpOps::post_send` (the general post).
    general_send_posts: u32,
}

/// What the fake's `create_ah` resolved: the checked vector and the device
/// that checked it.
#[derive(Debug)]
pub(crate) struct FakeAh {
    dev: Shared,
    av: AddressVector,
}

type Shared = Arc<Mutex<State>>;

fn lock(s: &Shared) -> MutexGuard<'_, State> {
    s.lock().unwrap_or_else(PoisonError::into_inner)
}

impl State {
    fn id(&mut self) -> u32 {
        self.next += 1;
        self.next
    }

    /// Complete the first posted send of `qpn` with `wr_id`: it retires the
    /// unsignaled ones before it.
    fn complete_send(&mut self, qpn: Qpn, wr_id: u64, status: WcStatus) {
        let Some(q) = self.qps.get_mut(&qpn) else {
            return;
        };
        // A success retires the first *signaled* request with the id (the
        // engine knows positions; the fake finds them by id).
        let ok = status == WcStatus::Success;
        let Some(pos) = q.sq.iter().position(|w| w.0 == wr_id && (w.1 || !ok)) else {
            return;
        };
        q.sq.drain(..=pos);
        let cq = q.send_cq;
        let wc = WorkCompletion {
            wr_id,
            status,
            opcode: WcOpcode::Send,
            qp_num: qpn,
            retired_unsignaled: u32::try_from(pos).unwrap_or(u32::MAX),
            ..WorkCompletion::default()
        };
        self.cqs.entry(cq).or_default().push_back(wc);
    }

    fn purge(&mut self, qpn: Qpn) -> Outstanding {
        for queue in self.cqs.values_mut() {
            queue.retain(|wc| wc.qp_num != qpn);
        }
        let Some(q) = self.qps.get_mut(&qpn) else {
            return Outstanding::default();
        };
        q.sq.clear();
        let d = Outstanding {
            sends: q.sq_outstanding,
            recvs: q.rq_outstanding,
        };
        q.sq_outstanding = 0;
        q.rq_outstanding = 0;
        d
    }
}

/// The fake device.
#[derive(Debug, Default)]
pub(crate) struct FakeProvider {
    state: Shared,
}

impl FakeProvider {
    pub(crate) fn new() -> Arc<FakeProvider> {
        Arc::new(FakeProvider::default())
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Address vectors checked so far.
    pub(crate) fn av_checks(&self) -> u32 {
        self.lock().av_checks
    }

    /// UD sends accepted: `wr_id` and the destination used.
    pub(crate) fn ud_sent(&self) -> Vec<(u64, crate::wr::UdDest)> {
        self.lock().ud_sent.clone()
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

    /// Whether `try_post_send_one` takes the request it is offered.
    pub(crate) fn set_take_one_sends(&self, on: bool) {
        self.lock().take_one_sends = on;
    }

    /// `(offered to try_post_send_one, taken by it, general post_send calls)`.
    pub(crate) fn send_paths(&self) -> (u32, u32, u32) {
        let s = self.lock();
        (s.offered_one_sends, s.taken_one_sends, s.general_send_posts)
    }

    pub(crate) fn set_auto_complete(&self, on: bool) {
        self.lock().auto_complete = on;
    }

    /// Complete the posted send `wr_id` of `qpn` (and the unsignaled sends
    /// before it).
    pub(crate) fn complete_send(&self, qpn: Qpn, wr_id: u64, status: WcStatus) {
        self.lock().complete_send(qpn, wr_id, status);
    }

    /// Queue a receive completion for `wr_id` on `qpn`'s receive CQ.
    pub(crate) fn complete_recv(&self, qpn: Qpn, wr_id: u64, status: WcStatus) {
        let mut s = self.lock();
        let Some(cq) = s.qps.get(&qpn).map(|q| q.recv_cq) else {
            return;
        };
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
}

fn refused(what: &'static str) -> DeviceError {
    DeviceError::new(DeviceErrorKind::Transport, what)
}

/// The fake's protection domain.
#[derive(Debug)]
pub(crate) struct FakePd {
    id: u32,
    state: Shared,
}

impl Drop for FakePd {
    fn drop(&mut self) {
        lock(&self.state).calls.push(Call::DeallocPd(self.id));
    }
}

/// The fake's memory region.
#[derive(Debug)]
pub(crate) struct FakeMr {
    id: u32,
    state: Shared,
}

impl Drop for FakeMr {
    fn drop(&mut self) {
        lock(&self.state).calls.push(Call::DeregMr(self.id));
    }
}

/// The device CQ, destroyed with its last holder (the application's queue
/// object, or a QP completing into it).
#[derive(Debug)]
struct CqCore {
    id: u32,
    state: Shared,
}

impl Drop for CqCore {
    fn drop(&mut self) {
        let mut s = lock(&self.state);
        s.cqs.remove(&self.id);
        s.calls.push(Call::DestroyCq(self.id));
    }
}

/// The fake's completion queue.
#[derive(Debug)]
pub(crate) struct FakeCq {
    core: Arc<CqCore>,
}

impl FakeCq {
    pub(crate) fn id(&self) -> u32 {
        self.core.id
    }
}

impl CqOps for FakeCq {
    fn poll(&mut self, wcs: &mut [WorkCompletion]) -> Result<usize, VerbsError> {
        let mut s = lock(&self.core.state);
        let mut n = 0;
        for slot in wcs.iter_mut() {
            let Some(wc) = s.cqs.get_mut(&self.core.id).and_then(VecDeque::pop_front) else {
                break;
            };
            if let Some(q) = s.qps.get_mut(&wc.qp_num) {
                if wc.opcode.is_recv() {
                    q.rq_outstanding = q.rq_outstanding.saturating_sub(1);
                } else {
                    q.sq_outstanding = q
                        .sq_outstanding
                        .saturating_sub(wc.retired_unsignaled.saturating_add(1));
                }
            }
            *slot = wc;
            n += 1;
        }
        Ok(n)
    }

    fn req_notify(&self, _solicited_only: bool) -> Result<(), VerbsError> {
        Ok(())
    }

    fn event_fd(&self) -> Option<RawFd> {
        None
    }

    fn wait(&self, _timeout: Option<Duration>) -> Result<bool, VerbsError> {
        Err(VerbsError::NotSupported {
            operation: "wait_cq",
            backend: "fake",
        })
    }
}

/// The fake's queue pair.
#[derive(Debug)]
pub(crate) struct FakeQp {
    qpn: Qpn,
    state: Shared,
    _cqs: (Arc<CqCore>, Arc<CqCore>),
}

impl Drop for FakeQp {
    fn drop(&mut self) {
        let mut s = lock(&self.state);
        s.calls.push(Call::DestroyQp(self.qpn));
        s.purge(self.qpn);
        s.qps.remove(&self.qpn);
    }
}

impl FakeQp {
    /// The post itself, for both `post_send` and `try_post_send_one`.
    fn post_sends(&mut self, wrs: &[SendWr<'_>]) -> Result<(), VerbsError> {
        let mut s = lock(&self.state);
        let refuse_after = s.refuse_send_after.take();
        let auto = s.auto_complete;
        let qpn = self.qpn;
        let Some(q) = s.qps.get_mut(&qpn) else {
            return Err(VerbsError::PostSend {
                index: 0,
                reason: PostError::Device(refused("no such QP")),
            });
        };
        if !q.state.can_post_send() {
            return Err(VerbsError::PostSend {
                index: 0,
                reason: PostError::QpState { state: q.state },
            });
        }
        let requested = u32::try_from(wrs.len()).unwrap_or(u32::MAX);
        if q.sq_outstanding.saturating_add(requested) > q.caps.max_send_wr {
            return Err(VerbsError::PostSend {
                index: 0,
                reason: PostError::QueueFull {
                    outstanding: q.sq_outstanding,
                    capacity: q.caps.max_send_wr,
                    requested,
                },
            });
        }
        let mut accepted = Vec::new();
        let mut ud_sent = Vec::new();
        let mut stop = None;
        for (i, wr) in wrs.iter().enumerate() {
            if refuse_after == Some(i) {
                stop = Some((i, PostError::Device(refused("the fake device refused it"))));
                break;
            }
            if let Err(e) = wr.validate(q.qp_type, &q.caps) {
                stop = Some((i, PostError::InvalidWr(e)));
                break;
            }
            // The handle's own resolution, no second check of the vector;
            // a handle of another device is refused.
            let ud = match &wr.ud {
                None => None,
                Some(d) => match d.ah.driver::<FakeAh>() {
                    Some(ah) if Arc::ptr_eq(&ah.dev, &self.state) => Some(crate::wr::UdDest {
                        av: ah.av,
                        remote_qpn: d.remote_qpn,
                        remote_qkey: d.remote_qkey,
                    }),
                    _ => {
                        stop = Some((i, PostError::ForeignAddressHandle));
                        break;
                    }
                },
            };
            let signaled = wr.is_signaled(q.sig_all);
            q.sq.push_back((wr.wr_id, signaled));
            q.sq_outstanding += 1;
            accepted.push((wr.wr_id, signaled));
            if let Some(dest) = ud {
                ud_sent.push((wr.wr_id, dest));
            }
        }
        s.ud_sent.append(&mut ud_sent);
        if auto {
            for &(wr_id, _) in accepted.iter().filter(|w| w.1) {
                s.complete_send(qpn, wr_id, WcStatus::Success);
            }
        }
        s.calls.push(Call::PostSend(qpn, accepted));
        match stop {
            None => Ok(()),
            Some((index, reason)) => Err(VerbsError::PostSend { index, reason }),
        }
    }
}

impl QpOps for FakeQp {
    fn modify(&mut self, attr: &QpAttr, mask: QpAttrMask) -> Result<(), VerbsError> {
        let mut s = lock(&self.state);
        s.calls.push(Call::ModifyQp(self.qpn, mask));
        if let Some(q) = s.qps.get_mut(&self.qpn)
            && mask.contains(QpAttrMask::STATE)
        {
            q.state = attr.qp_state;
        }
        Ok(())
    }

    fn query(&mut self) -> Result<QpAttr, VerbsError> {
        let s = lock(&self.state);
        let state = s.qps.get(&self.qpn).map_or(QpState::Reset, |q| q.state);
        Ok(QpAttr {
            qp_state: state,
            ..QpAttr::default()
        })
    }

    fn post_send(&mut self, wrs: &[SendWr<'_>]) -> Result<(), VerbsError> {
        lock(&self.state).general_send_posts += 1;
        self.post_sends(wrs)
    }

    fn try_post_send_one(&mut self, wr: &SendWr<'_>) -> bool {
        let take = {
            let mut s = lock(&self.state);
            s.offered_one_sends += 1;
            s.take_one_sends
        };
        // A refusal of one request posted nothing: a decline.
        let taken = take && self.post_sends(std::slice::from_ref(wr)).is_ok();
        lock(&self.state).taken_one_sends += u32::from(taken);
        taken
    }

    fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> Result<(), VerbsError> {
        let mut s = lock(&self.state);
        let refuse_after = s.refuse_recv_after.take();
        let qpn = self.qpn;
        let Some(q) = s.qps.get_mut(&qpn) else {
            return Err(VerbsError::PostRecv {
                index: 0,
                reason: PostError::Device(refused("no such QP")),
            });
        };
        if !q.state.can_post_recv() {
            return Err(VerbsError::PostRecv {
                index: 0,
                reason: PostError::QpState { state: q.state },
            });
        }
        let requested = u32::try_from(wrs.len()).unwrap_or(u32::MAX);
        if q.rq_outstanding.saturating_add(requested) > q.caps.max_recv_wr {
            return Err(VerbsError::PostRecv {
                index: 0,
                reason: PostError::QueueFull {
                    outstanding: q.rq_outstanding,
                    capacity: q.caps.max_recv_wr,
                    requested,
                },
            });
        }
        let mut accepted = Vec::new();
        let mut stop = None;
        for (i, wr) in wrs.iter().enumerate() {
            if refuse_after == Some(i) {
                stop = Some((i, PostError::Device(refused("the fake device refused it"))));
                break;
            }
            if let Err(e) = wr.validate(&q.caps) {
                stop = Some((i, PostError::InvalidWr(e)));
                break;
            }
            q.rq_outstanding += 1;
            accepted.push(wr.wr_id);
        }
        s.calls.push(Call::PostRecv(qpn, accepted));
        match stop {
            None => Ok(()),
            Some((index, reason)) => Err(VerbsError::PostRecv { index, reason }),
        }
    }

    fn outstanding(&self) -> Outstanding {
        let s = lock(&self.state);
        s.qps
            .get(&self.qpn)
            .map_or(Outstanding::default(), |q| Outstanding {
                sends: q.sq_outstanding,
                recvs: q.rq_outstanding,
            })
    }

    fn discard(&mut self) -> Outstanding {
        lock(&self.state).purge(self.qpn)
    }
}

impl Provider for FakeProvider {
    type Domain = HostDomain;
    type Pd = FakePd;
    type Mr = FakeMr;
    type Cq = FakeCq;
    type Qp = FakeQp;
    type Ah = FakeAh;

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
                source: DeviceError::new(DeviceErrorKind::NotFound, "the fake device has one port"),
            })
        }
    }

    fn query_gid_table(&self, _port_num: u8) -> Result<Vec<GidEntry>, VerbsError> {
        Ok(Vec::new())
    }

    fn alloc_pd(&self) -> Result<FakePd, VerbsError> {
        let mut s = self.lock();
        let id = s.id();
        s.calls.push(Call::AllocPd(id));
        Ok(FakePd {
            id,
            state: Arc::clone(&self.state),
        })
    }

    fn reg_mr(
        &self,
        _pd: &FakePd,
        memory: Arc<dyn Memory>,
        _access: AccessFlags,
    ) -> Result<(FakeMr, MrInfo), VerbsError> {
        let mut s = self.lock();
        let n = s.id();
        s.calls.push(Call::RegMr(n));
        Ok((
            FakeMr {
                id: n,
                state: Arc::clone(&self.state),
            },
            MrInfo {
                lkey: Lkey::from_parts(n, 0x11),
                rkey: Rkey::from_parts(n, 0x22),
                addr: memory.addr(),
                len: memory.len(),
            },
        ))
    }

    fn create_cq(&self, depth: u32) -> Result<(FakeCq, u32), VerbsError> {
        let mut s = self.lock();
        let id = s.id();
        s.calls.push(Call::CreateCq(id));
        s.cqs.insert(id, VecDeque::new());
        Ok((
            FakeCq {
                core: Arc::new(CqCore {
                    id,
                    state: Arc::clone(&self.state),
                }),
            },
            depth,
        ))
    }

    fn create_qp(
        &self,
        _pd: &FakePd,
        send_cq: &FakeCq,
        recv_cq: &FakeCq,
        init: &QpInitAttr,
    ) -> Result<(FakeQp, QpInfo), VerbsError> {
        let mut s = self.lock();
        let n = s.id();
        let qpn = Qpn::from_wire(0x100 + n);
        s.calls.push(Call::CreateQp(qpn));
        s.qps.insert(
            qpn,
            QpRec {
                qp_type: init.qp_type,
                caps: init.caps,
                sig_all: init.sq_sig_all,
                send_cq: send_cq.id(),
                recv_cq: recv_cq.id(),
                state: QpState::Reset,
                sq: VecDeque::new(),
                sq_outstanding: 0,
                rq_outstanding: 0,
            },
        );
        Ok((
            FakeQp {
                qpn,
                state: Arc::clone(&self.state),
                _cqs: (Arc::clone(&send_cq.core), Arc::clone(&recv_cq.core)),
            },
            QpInfo {
                qpn,
                caps: init.caps,
            },
        ))
    }

    fn create_ah(&self, _pd: &FakePd, av: &AddressVector) -> Result<FakeAh, VerbsError> {
        let mut s = self.lock();
        s.av_checks += 1;
        s.calls.push(Call::CreateAh);
        // The fake's table has one source GID.
        if av.sgid_index != 0 {
            return Err(VerbsError::AddressVector {
                dgid: av.dgid,
                source: crate::provider::AvError::NoSuchSgid {
                    index: av.sgid_index,
                    table_len: 1,
                },
            });
        }
        Ok(FakeAh {
            dev: Arc::clone(&self.state),
            av: *av,
        })
    }
}
