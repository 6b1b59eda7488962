//! Instructions per post and per poll, for callgrind: one process, two rxe
//! devices (127.0.0.1, 127.0.0.2), both caller-driven, an RC pair, N
//! signaled RDMA WRITEs (8 bytes unless a size is given), each posted and
//! then polled for. With a size above the MTU each WRITE is a stream of
//! packets (1 MiB: 1024 at MTU 1024), so the receiving device's
//! `RxState::progress` divided by the packets it received is the receive
//! path's cost per packet of a bandwidth run.
//!
//! `post_one` and `poll_one` wrap the core calls (never inlined), so
//! `callgrind_annotate --inclusive=yes` shows the core call's whole cost; the
//! driver's `post_send` / `poll` inclusive cost subtracted from it is the
//! core's per-request overhead. See docs/benchmarks.md for the command.
//!
//! `cargo run --profile bench -p rnic-rxe --example post_poll_cost -- [N] [reserved|shared] [typed|dyn] [SIZE]`
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use rnic_core::{
    AccessFlags, CompletionQueue, Context, DeviceMemory, HeapMemory, InitParams, Provider, Psn,
    QpCaps, QpInitAttr, QpType, QueuePair, RtrParams, RtsParams, SendWr, VerbsError,
    WorkCompletion,
};
use rnic_rxe::{Progress, RxeConfig, RxeDevice, Target};

#[inline(never)]
fn post_one<P: Provider>(qp: &mut QueuePair<P>, wr: &[SendWr<'_>]) -> Result<(), VerbsError> {
    qp.post_send(wr)
}

#[inline(never)]
fn poll_one<P: Provider>(
    cq: &mut CompletionQueue<P>,
    wcs: &mut [WorkCompletion],
) -> Result<usize, VerbsError> {
    cq.poll(wcs)
}

fn run<P: Provider>(
    n: usize,
    size: usize,
    reserved: bool,
    ctx: [Context<P>; 2],
    dev: [RxeDevice; 2],
) where
    HeapMemory: DeviceMemory<P::Domain>,
{
    let all = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let mk = |ctx: &Context<P>| {
        let pd = ctx.alloc_pd().unwrap();
        let cq = if reserved {
            ctx.create_cq_reserved(256).unwrap()
        } else {
            ctx.create_cq(256).unwrap()
        };
        let mr = pd
            .reg_mr(Arc::new(HeapMemory::new(size.max(4096))), all)
            .unwrap();
        let caps = QpCaps {
            max_send_wr: 64,
            max_recv_wr: 64,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let mut qp = pd
            .create_qp(&cq, &cq, &QpInitAttr::new(QpType::Rc, caps))
            .unwrap();
        qp.to_init(&InitParams {
            access: all,
            ..InitParams::default()
        })
        .unwrap();
        (pd, cq, mr, qp)
    };
    let (_pa, mut cqa, mra, mut qa) = mk(&ctx[0]);
    let (_pb, _cqb, mrb, mut qb) = mk(&ctx[1]);
    let (ga, gb) = (dev[0].gids()[0], dev[1].gids()[0]);
    qa.to_rtr(qb.qpn(), Psn::from_wire(1), gb, &RtrParams::default())
        .unwrap();
    qb.to_rtr(qa.qpn(), Psn::from_wire(2), ga, &RtrParams::default())
        .unwrap();
    qa.to_rts(Psn::from_wire(2), &RtsParams::default()).unwrap();
    qb.to_rts(Psn::from_wire(1), &RtsParams::default()).unwrap();
    let sge = [mra.sge(0, u32::try_from(size).unwrap()).unwrap()];
    let wr = [SendWr::rdma_write(1, &sge, mrb.addr(), mrb.rkey()).signaled()];
    let mut wcs = [WorkCompletion::default(); 4];
    let (mut posts, mut polls) = (0u64, 0u64);
    for _ in 0..n {
        post_one(&mut qa, &wr).unwrap();
        posts += 1;
        loop {
            polls += 1;
            if poll_one(&mut cqa, &mut wcs).unwrap() > 0 {
                assert!(wcs[0].is_success());
                break;
            }
            dev[1].progress();
        }
    }
    let rx = dev[1].stats();
    println!(
        "{n} writes of {size} B: {posts} posts, {polls} polls; the target received {} packets in {} datagrams",
        rx.device.rx_packets, rx.device.rx_datagrams
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(20_000);
    let reserved = args.get(2).is_none_or(|a| a != "shared");
    let typed = args.get(3).is_some_and(|a| a == "typed");
    let size = args.get(4).and_then(|a| a.parse().ok()).unwrap_or(8);
    let open = |ip: [u8; 4]| {
        RxeDevice::open(
            &RxeConfig::new(Target::Ip(IpAddr::V4(Ipv4Addr::from(ip))))
                .with_progress(Progress::Caller),
        )
        .unwrap()
    };
    let dev = [open([127, 0, 0, 1]), open([127, 0, 0, 2])];
    if typed {
        let ctx = [dev[0].typed_context(), dev[1].typed_context()];
        run(n, size, reserved, ctx, dev);
    } else {
        let ctx = [dev[0].context(), dev[1].context()];
        run(n, size, reserved, ctx, dev);
    }
}
