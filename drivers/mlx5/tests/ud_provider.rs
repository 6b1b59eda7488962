//! UD sends through `rnic_core::Provider` on mlx5 (emulated functions in
//! this process, an rnic-rxe peer on 127.x): the datagram segment comes
//! from the address handle's template (`Mlx5Ah`, made at `create_ah`), and
//! a handle of another device — an rxe one, or another mlx5 function's —
//! is refused with `PostError::ForeignAddressHandle`, the requests before
//! it posted, the QP still usable.
#![allow(clippy::unwrap_used)]

mod common;

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use rnic_core::{
    AccessFlags, AddressHandle, AddressVector, CompletionQueue, Context, Gid, HeapMemory,
    InitParams, Memory, MemoryRegion, PostError, ProtectionDomain, Psn, QpCaps, QpInitAttr, QpType,
    QueuePair, RecvWr, RtrParams, RtsParams, SendWr, Sge, VerbsError, WcOpcode, WcStatus,
    WorkCompletion,
};
use rnic_mlx5::Mlx5Provider;

const ALL: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);
const QKEY: u32 = 0x1111_1111;
const CAPS: QpCaps = QpCaps {
    max_send_wr: 16,
    max_recv_wr: 16,
    max_send_sge: 1,
    max_recv_sge: 1,
    max_inline_data: 64,
};

/// One end: a context, a PD, a CQ, a registered 64 KiB buffer, a UD QP in
/// RTS. Field order is drop order.
struct End {
    qp: QueuePair,
    mr: MemoryRegion,
    mem: Arc<dyn Memory>,
    cq: CompletionQueue,
    pd: ProtectionDomain,
    _ctx: Context,
}

impl End {
    fn new(ctx: Context, mem: Arc<dyn Memory>) -> End {
        let pd = ctx.alloc_pd().unwrap();
        let mr = pd.reg_mr(mem.clone(), ALL).unwrap();
        let cq = ctx.create_cq(256).unwrap();
        let mut qp = pd
            .create_qp(&cq, &cq, &QpInitAttr::new(QpType::Ud, CAPS))
            .unwrap();
        qp.to_init(&InitParams {
            qkey: QKEY,
            ..InitParams::default()
        })
        .unwrap();
        qp.to_rtr(
            rnic_core::Qpn::from_wire(0),
            Psn::from_wire(0),
            Gid::ZERO,
            &RtrParams::default(),
        )
        .unwrap();
        qp.to_rts(Psn::from_wire(7), &RtsParams::default()).unwrap();
        End {
            qp,
            mr,
            mem,
            cq,
            pd,
            _ctx: ctx,
        }
    }

    fn ah(&self, ip: IpAddr) -> AddressHandle {
        self.pd
            .create_ah(&AddressVector::new(Gid::from_ip(ip)))
            .unwrap()
    }

    fn wait(&mut self, n: usize) -> Vec<WorkCompletion> {
        common::wait_wcs(&mut self.cq, n)
    }
}

/// A signaled UD SEND of `s` to QP `qpn` through `ah`.
fn ud_send<'a>(id: u64, s: &'a [Sge], ah: &'a AddressHandle, qpn: rnic_core::Qpn) -> SendWr<'a> {
    SendWr::send(id, s).signaled().to_ud(ah.ud_dest(qpn, QKEY))
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn a_foreign_address_handle_is_refused_and_the_qp_stays_usable() {
    let b = 200 + (std::process::id() % 50) as u8;
    let ip = |d| IpAddr::V4(Ipv4Addr::new(127, 250, b, d));
    let (mlx5_ip, other_ip, rxe_ip) = (ip(1), ip(2), ip(3));
    let (_emu, provider) = common::provider(mlx5_ip);
    let (_other_emu, other) = common::provider(other_ip);
    let mut a = End::new(
        Mlx5Provider::context(&provider),
        provider.alloc_dma(64 << 10).unwrap(),
    );
    let mut o = End::new(
        Mlx5Provider::context(&other),
        other.alloc_dma(64 << 10).unwrap(),
    );
    let dev = rnic_rxe::RxeDevice::open(
        &rnic_rxe::RxeConfig::new(rnic_rxe::Target::Ip(rxe_ip))
            .with_progress(rnic_rxe::Progress::Thread),
    )
    .unwrap();
    let mut r = End::new(dev.context(), Arc::new(HeapMemory::new(64 << 10)));

    // The receiver: rxe, two receives (40 bytes of GRH area each).
    for (i, at) in [(10u64, 0u64), (11, 4096)] {
        let s = [Sge::new(r.mr.addr() + at, 40 + 1024, r.mr.lkey())];
        r.qp.post_recv(&[RecvWr::new(i, &s)]).unwrap();
    }
    let honest = a.ah(rxe_ip);
    let from_rxe = r.ah(rxe_ip);
    let from_other = o.ah(rxe_ip);
    let msg = pattern(300, 3);
    a.mem.write(0, &msg).unwrap();
    let s = [Sge::new(a.mr.addr(), 300, a.mr.lkey())];
    let rxe_qpn = r.qp.qpn();
    let send = |id: u64, ah| ud_send(id, &s, ah, rxe_qpn);

    // Alone: refused at index 0, nothing posted.
    for foreign in [&from_rxe, &from_other] {
        let e = a.qp.post_send(&[send(1, foreign)]).unwrap_err();
        assert!(
            matches!(
                e,
                VerbsError::PostSend {
                    index: 0,
                    reason: PostError::ForeignAddressHandle,
                }
            ),
            "{e:?}"
        );
        assert_eq!(a.qp.outstanding_sends(), 0);
    }
    // Behind an honest request: that one is posted, the batch stops at 1.
    let e =
        a.qp.post_send(&[send(2, &honest), send(3, &from_other)])
            .unwrap_err();
    assert!(
        matches!(
            e,
            VerbsError::PostSend {
                index: 1,
                reason: PostError::ForeignAddressHandle,
            }
        ),
        "{e:?}"
    );
    // And a following honest send on the same QP.
    a.qp.post_send(&[send(4, &honest)]).unwrap();

    let sent = a.wait(2);
    assert_eq!(
        sent.iter()
            .map(|w| (w.wr_id, w.status, w.opcode))
            .collect::<Vec<_>>(),
        [
            (2, WcStatus::Success, WcOpcode::Send),
            (4, WcStatus::Success, WcOpcode::Send)
        ]
    );
    let got = r.wait(2);
    for (w, at) in got.iter().zip([0usize, 4096]) {
        assert_eq!((w.status, w.byte_len), (WcStatus::Success, 340), "{w:?}");
        assert_eq!(w.src_qp, a.qp.qpn());
        let mut b = vec![0u8; 300];
        r.mem.read(at + 40, &mut b).unwrap();
        assert_eq!(b, msg);
    }
    assert_eq!(got.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [10, 11]);
    // Nothing reached the other mlx5 function's QP or left extra CQEs.
    let mut wcs = [WorkCompletion::default(); 4];
    assert_eq!(o.cq.poll(&mut wcs).unwrap(), 0);
    assert_eq!(a.cq.poll(&mut wcs).unwrap(), 0);
    drop((honest, from_other, from_rxe));
    drop((a, o, r));
}
