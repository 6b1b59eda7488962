//! Loopback conformance: two rnic-rxe devices on distinct 127.x addresses,
//! every operation, the message sizes around each MTU, all five MTUs,
//! byte-exact memory on both sides, immediates, atomics, UD, 64 QPs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use rnic_core::{
    AddressVector, InitParams, Mtu, Psn, QpType, RecvWr, SendFlags, SendOp, SendWr, Sge, WcFlags,
    WcOpcode, WcStatus,
};
use rnic_rxe::Progress;

const MIB: usize = 1 << 20;

/// WRITE, WRITE_WITH_IMM, SEND, SEND_WITH_IMM and READ of every size over
/// one MTU, then the atomics, checking both sides' bytes and every
/// completion (`common::every_rc_op`).
fn all_ops_at(mtu: Mtu, progress: Progress) {
    let (a, b) = sides(4 * MIB, progress);
    let (mut qa, mut qb) = (a.qp(QpType::Rc), b.qp(QpType::Rc));
    connect(&a, &mut qa, &b, &mut qb, mtu);
    every_rc_op(&a, &mut qa, &b, &mut qb, &sizes(mtu));
    let s = b.dev.stats();
    assert_eq!(s.device.icrc_drops, 0);
    assert!(s.device.icrc_ok > 0);
    assert_eq!(s.device.unknown_qpn, 0);
    let qs = s.qp(qb.qpn()).unwrap();
    assert!(qs.rx_packets > 0 && qs.tx_packets > 0);
}

#[test]
fn all_ops_mtu_256() {
    all_ops_at(Mtu::Mtu256, Progress::Thread);
}

#[test]
fn all_ops_mtu_512() {
    all_ops_at(Mtu::Mtu512, Progress::Thread);
}

#[test]
fn all_ops_mtu_1024() {
    all_ops_at(Mtu::Mtu1024, Progress::Thread);
}

#[test]
fn all_ops_mtu_2048() {
    all_ops_at(Mtu::Mtu2048, Progress::Thread);
}

#[test]
fn all_ops_mtu_4096() {
    all_ops_at(Mtu::Mtu4096, Progress::Thread);
}

#[test]
fn all_ops_caller_driven_mtu_4096() {
    all_ops_at(Mtu::Mtu4096, Progress::Caller);
}

#[test]
fn atomics_return_the_original_value() {
    let (a, b) = sides(MIB, Progress::Thread);
    let (mut qa, mut qb) = (a.qp(QpType::Rc), b.qp(QpType::Rc));
    connect(&a, &mut qa, &b, &mut qb, Mtu::Mtu1024);
    let target = b.mr.addr() + 4096;
    b.fill(4096, &100u64.to_ne_bytes());
    let res = [a.mr.sge(0, 8).unwrap()];
    // FETCH_ADD returns 100, leaves 142.
    qa.post_send(&[SendWr::atomic_fetch_add(1, &res, target, b.mr.rkey(), 42).signaled()])
        .unwrap();
    let wc = wait(&a.cq, 1, &[]);
    assert_eq!(wc[0].status, WcStatus::Success);
    assert_eq!(wc[0].opcode, WcOpcode::FetchAdd);
    assert_eq!(a.bytes(0, 8), 100u64.to_ne_bytes());
    assert_eq!(b.bytes(4096, 8), 142u64.to_ne_bytes());
    // CMP_SWP that matches: returns 142, stores 7.
    qa.post_send(&[SendWr::atomic_cmp_swap(2, &res, target, b.mr.rkey(), 142, 7).signaled()])
        .unwrap();
    let wc = wait(&a.cq, 1, &[]);
    assert_eq!(wc[0].status, WcStatus::Success);
    assert_eq!(wc[0].opcode, WcOpcode::CompSwap);
    assert_eq!(a.bytes(0, 8), 142u64.to_ne_bytes());
    assert_eq!(b.bytes(4096, 8), 7u64.to_ne_bytes());
    // CMP_SWP that does not match: returns 7, leaves 7.
    qa.post_send(&[SendWr::atomic_cmp_swap(3, &res, target, b.mr.rkey(), 999, 1).signaled()])
        .unwrap();
    let wc = wait(&a.cq, 1, &[]);
    assert_eq!(wc[0].status, WcStatus::Success);
    assert_eq!(a.bytes(0, 8), 7u64.to_ne_bytes());
    assert_eq!(b.bytes(4096, 8), 7u64.to_ne_bytes());
}

/// Issue 15 bug 2: a peer's SEND_WITH_INVALIDATE naming a plain `reg_mr`
/// registration (another region, or the receive buffer's own) is refused as
/// kernel rxe refuses it (rxe_invalidate_mr accepts only fast-registration
/// MRs; RESPST_ERR_INVALIDATE_RKEY): the receive completes with
/// `REM_INV_REQ_ERR`, the packet is ACKed (the sender's SEND succeeds), the
/// responder's QP moves to ERR, and the registration keeps working for
/// remote WRITEs and for its owner.
#[test]
fn send_with_invalidate_of_a_plain_mr_is_refused() {
    let (a, b) = sides(MIB, Progress::Thread);
    let extra = std::sync::Arc::new(rnic_core::HeapMemory::new(4096));
    let mr2 = b.pd.reg_mr(extra.clone(), ALL).unwrap();
    for (name, rkey) in [
        ("another region", mr2.rkey()),
        ("the receive buffer", b.mr.rkey()),
    ] {
        let (mut qa, mut qb) = (a.qp(QpType::Rc), b.qp(QpType::Rc));
        connect(&a, &mut qa, &b, &mut qb, Mtu::Mtu1024);
        let rsge = [b.mr.sge(0, 64).unwrap()];
        qb.post_recv(&[RecvWr::new(5, &rsge)]).unwrap();
        a.fill(0, b"invalidate!");
        let src = [a.mr.sge(0, 11).unwrap()];
        qa.post_send(&[SendWr::new(6, SendOp::SendWithInv { rkey }, &src).signaled()])
            .unwrap();
        assert_eq!(wait(&a.cq, 1, &[])[0].status, WcStatus::Success, "{name}");
        let wb = wait(&b.cq, 1, &[]);
        assert_eq!(wb[0].status, WcStatus::RemInvReqErr, "{name}: {:?}", wb[0]);
        assert_eq!(wb[0].invalidated_rkey, None, "{name}");
        let st = b.dev.stats();
        assert_eq!(st.qp(qb.qpn()).unwrap().invalidate_refused, 1, "{name}");
        // The responder QP is in ERR: a further receive is flushed.
        qb.post_recv(&[RecvWr::new(7, &rsge)]).unwrap();
        assert_eq!(
            wait(&b.cq, 1, &[])[0].status,
            WcStatus::WrFlushErr,
            "{name}"
        );
    }
    // Both keys still work, on a fresh pair: a remote WRITE through each.
    let (mut qa, mut qb) = (a.qp(QpType::Rc), b.qp(QpType::Rc));
    connect(&a, &mut qa, &b, &mut qb, Mtu::Mtu1024);
    a.fill(0, b"still alive");
    let src = [a.mr.sge(0, 11).unwrap()];
    qa.post_send(&[
        SendWr::rdma_write(8, &src, mr2.addr(), mr2.rkey()).signaled(),
        SendWr::rdma_write(9, &src, b.mr.addr() + 100, b.mr.rkey()).signaled(),
    ])
    .unwrap();
    let wa = wait(&a.cq, 2, &[]);
    assert!(wa.iter().all(|w| w.status == WcStatus::Success), "{wa:?}");
    let mut got = [0u8; 11];
    rnic_core::Memory::read(&*extra, 0, &mut got).unwrap();
    assert_eq!(&got, b"still alive");
    assert_eq!(b.bytes(100, 11), b"still alive");
    // And its owner uses it locally: B SENDs from the receive buffer's region.
    let rsge = [a.mr.sge(200, 64).unwrap()];
    qa.post_recv(&[RecvWr::new(10, &rsge)]).unwrap();
    let bsrc = [b.mr.sge(100, 11).unwrap()];
    qb.post_send(&[SendWr::new(11, SendOp::Send, &bsrc).signaled()])
        .unwrap();
    assert_eq!(wait(&b.cq, 1, &[])[0].status, WcStatus::Success);
    assert_eq!(wait(&a.cq, 1, &[])[0].status, WcStatus::Success);
    assert_eq!(a.bytes(200, 11), b"still alive");
}

#[test]
fn ud_send_delivers_grh_and_payload() {
    let (a, b) = sides(MIB, Progress::Thread);
    let (mut qa, mut qb) = (a.qp(QpType::Ud), b.qp(QpType::Ud));
    let init = InitParams {
        qkey: 0x1111_1111,
        ..InitParams::default()
    };
    for q in [&mut qa, &mut qb] {
        q.to_init(&init).unwrap();
        q.to_rtr(
            rnic_core::Qpn::from_wire(0),
            Psn::from_wire(0),
            a.gid(),
            &rtr(Mtu::Mtu1024),
        )
        .unwrap();
        q.to_rts(Psn::from_wire(0x22), &rts()).unwrap();
    }
    // Up to the port's MTU (4096 on lo), whatever the RTR path MTU says:
    // UD has none, kernel rxe sends datagrams of the port's.
    assert_eq!(a.dev.active_mtu(), Mtu::Mtu4096);
    for len in [0usize, 1, 1000, 1024, 4096] {
        let data = pattern(len, len as u32);
        a.fill(0, &data);
        b.fill(0, &vec![0xEE; 40 + len + 1]);
        let rsge = [b.mr.sge(0, 40 + 4096).unwrap()];
        qb.post_recv(&[RecvWr::new(9, &rsge)]).unwrap();
        let src = [a.mr.sge(0, len as u32).unwrap()];
        let src: &[Sge] = if len == 0 { &[] } else { &src };
        let ah = a.pd.create_ah(&AddressVector::new(b.gid())).unwrap();
        let dest = ah.ud_dest(qb.qpn(), 0x1111_1111);
        qa.post_send(&[SendWr::send_with_imm(10, src, 0xabc).to_ud(dest).signaled()])
            .unwrap();
        assert_eq!(wait(&a.cq, 1, &[])[0].status, WcStatus::Success);
        let wb = wait(&b.cq, 1, &[]);
        assert_eq!(wb[0].status, WcStatus::Success);
        assert_eq!(wb[0].src_qp, qa.qpn());
        assert_eq!(wb[0].byte_len, 40 + len as u32);
        assert_eq!(wb[0].imm_data, Some(0xabc));
        assert!(wb[0].wc_flags.contains(WcFlags::GRH));
        assert_eq!(b.bytes(40, len), data);
    }
}

#[test]
fn sixty_four_qps_at_once() {
    const N: usize = 64;
    const LEN: usize = 64 * 1024;
    let (a, b) = sides(N * LEN * 2, Progress::Thread);
    let mut pairs: Vec<_> = (0..N)
        .map(|_| {
            let (mut qa, mut qb) = (a.qp(QpType::Rc), b.qp(QpType::Rc));
            connect(&a, &mut qa, &b, &mut qb, Mtu::Mtu4096);
            (qa, qb)
        })
        .collect();
    let datas: Vec<Vec<u8>> = (0..N).map(|i| pattern(LEN, 1000 + i as u32)).collect();
    for (i, d) in datas.iter().enumerate() {
        a.fill(i * LEN, d);
    }
    // Every QP writes its slice and sends its index, all posted before polling.
    for (i, (qa, qb)) in pairs.iter_mut().enumerate() {
        let rsge = [b.mr.sge(N * LEN + i * 8, 8).unwrap()];
        qb.post_recv(&[RecvWr::new(i as u64, &rsge)]).unwrap();
        let src = [a.mr.sge(i * LEN, LEN as u32).unwrap()];
        a.fill(N * LEN + i * 8, &(i as u64).to_le_bytes());
        let msg = [a.mr.sge(N * LEN + i * 8, 8).unwrap()];
        qa.post_send(&[
            SendWr::rdma_write(i as u64, &src, b.mr.addr() + (i * LEN) as u64, b.mr.rkey()),
            SendWr::send(i as u64, &msg).signaled(),
        ])
        .unwrap();
    }
    let wa = wait(&a.cq, N, &[]);
    assert!(wa.iter().all(|w| w.status == WcStatus::Success), "{wa:?}");
    let wb = wait(&b.cq, N, &[]);
    assert!(wb.iter().all(|w| w.status == WcStatus::Success));
    for (i, d) in datas.iter().enumerate() {
        assert_eq!(&b.bytes(i * LEN, LEN), d, "QP {i}");
        assert_eq!(b.bytes(N * LEN + i * 8, 8), (i as u64).to_le_bytes());
    }
    assert_eq!(b.dev.stats().qps.len(), N);
}

/// The conformance sequence with both sides' buffers in memory the
/// application owns (`OwnedBuffer`, a `Vec` registered in place) and in a
/// `DmaRegion` (pinned pages, base pages here: no hugepages are reserved
/// for tests): both offer direct access, so every copy of the transport is
/// the bulk copy over raw pointers (`rnic_dma::copy`), and the bytes are
/// exact at every size around the MTU and at 1 MiB.
#[test]
fn all_ops_in_owned_buffers_and_dma_regions() {
    use rnic_dma::{DmaRegion, OwnedBuffer, PagePolicy, PageSize};
    use std::sync::Arc;
    let len = 4 * MIB + 4096;
    let owned = |_: ()| -> Arc<dyn rnic_core::Memory> { OwnedBuffer::zeroed(len) };
    let region = |_: ()| -> Arc<dyn rnic_core::Memory> {
        DmaRegion::builder(len)
            .pages(PagePolicy::Require(PageSize::Base))
            .pin(false)
            .build()
            .unwrap()
    };
    for (name, make) in [("owned", &owned as &dyn Fn(()) -> _), ("dma", &region)] {
        let (ia, ib) = ip_pair();
        let a = Side::with_memory(open(ia, Progress::Thread), make(()), 512);
        let b = Side::with_memory(open(ib, Progress::Thread), make(()), 512);
        assert!(
            a.mem.direct().is_some() && b.mem.direct().is_some(),
            "{name}"
        );
        let (mut qa, mut qb) = (a.qp(QpType::Rc), b.qp(QpType::Rc));
        connect(&a, &mut qa, &b, &mut qb, Mtu::Mtu1024);
        every_rc_op(&a, &mut qa, &b, &mut qb, &sizes(Mtu::Mtu1024));
        assert_eq!(b.dev.stats().device.icrc_drops, 0, "{name}");
    }
}

/// Caller-driven devices ask for `SO_BUSY_POLL` on their receive sockets
/// (as root the kernel takes it; unprivileged it may refuse above
/// `net.core.busy_read`, which the device reports), threaded ones do not,
/// and both still move data.
#[test]
fn caller_driven_devices_busy_poll_their_sockets() {
    let (ia, ib) = ip_pair();
    let a = open(ia, Progress::Caller);
    let b = open(ib, Progress::Thread);
    let root = nix::unistd::geteuid().is_root();
    match a.busy_poll() {
        rnic_rxe::BusyPoll::Set { usecs } => assert_eq!(usecs, rnic_rxe::sys::BUSY_POLL_USECS),
        rnic_rxe::BusyPoll::Refused(e) => assert!(!root, "root was refused SO_BUSY_POLL: {e}"),
        other => panic!("caller-driven device reports {other:?}"),
    }
    assert_eq!(b.busy_poll(), rnic_rxe::BusyPoll::Off);
    assert!(a.busy_poll().to_string().contains("recvmmsg"));
    let (a, b) = (Side::new(a, 1 << 16, 64), Side::new(b, 1 << 16, 64));
    let (mut qa, mut qb) = (a.qp(QpType::Rc), b.qp(QpType::Rc));
    connect(&a, &mut qa, &b, &mut qb, Mtu::Mtu1024);
    a.fill(0, b"busy");
    let src = [a.mr.sge(0, 4).unwrap()];
    qa.post_send(&[SendWr::rdma_write(1, &src, b.mr.addr(), b.mr.rkey()).signaled()])
        .unwrap();
    assert_eq!(wait(&a.cq, 1, &[])[0].status, WcStatus::Success);
    assert_eq!(b.bytes(0, 4), b"busy");
}

/// 64 MiB WRITE and READ. Slow in debug builds: run with
/// `cargo test --release -p rnic-rxe --test loopback -- --ignored`.
#[test]
#[ignore = "64 MiB: run in release (scripts/test.sh does)"]
fn write_and_read_64_mib() {
    const LEN: usize = 64 * MIB;
    let (a, b) = sides(LEN, Progress::Thread);
    let (mut qa, mut qb) = (a.qp(QpType::Rc), b.qp(QpType::Rc));
    connect(&a, &mut qa, &b, &mut qb, Mtu::Mtu4096);
    let data = pattern(LEN, 64);
    a.fill(0, &data);
    let src = [a.mr.sge(0, LEN as u32).unwrap()];
    qa.post_send(&[SendWr::rdma_write(1, &src, b.mr.addr(), b.mr.rkey()).signaled()])
        .unwrap();
    assert_eq!(wait(&a.cq, 1, &[])[0].status, WcStatus::Success);
    assert!(b.bytes(0, LEN) == data, "64 MiB WRITE mismatch");
    a.fill(0, &vec![0; LEN]);
    qa.post_send(&[SendWr::rdma_read(2, &src, b.mr.addr(), b.mr.rkey()).signaled()])
        .unwrap();
    assert_eq!(wait(&a.cq, 1, &[])[0].status, WcStatus::Success);
    assert!(a.bytes(0, LEN) == data, "64 MiB READ mismatch");
    let _ = SendFlags::SIGNALED;
}

/// 128 two-packet WRITEs (AckReq on each last packet) leave in a few GSO sends and
/// arrive in a few GRO datagrams; the responder's cumulative ACKs of one
/// receive round collapse into one, and the data still lands byte-exact and
/// the last WRITE completes.
#[test]
fn acks_of_one_round_coalesce() {
    let (a, b) = sides(MIB, Progress::Caller);
    let (mut qa, mut qb) = (a.qp(QpType::Rc), b.qp(QpType::Rc));
    connect(&a, &mut qa, &b, &mut qb, Mtu::Mtu4096);
    let data = pattern(MIB, 11);
    a.fill(0, &data);
    let n = 128; // the send queue's depth
    let chunk = MIB / n;
    let sges: Vec<[Sge; 1]> = (0..n)
        .map(|i| [a.mr.sge(i * chunk, chunk as u32).unwrap()])
        .collect();
    let wrs: Vec<SendWr<'_>> = sges
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let w = SendWr::rdma_write(i as u64, s, b.mr.addr() + (i * chunk) as u64, b.mr.rkey());
            if i + 1 == n { w.signaled() } else { w }
        })
        .collect();
    qa.post_send(&wrs).unwrap();
    let wc = wait(&a.cq, 1, &[&b.dev]);
    assert_eq!(wc[0].status, WcStatus::Success);
    assert_eq!(wc[0].wr_id, (n - 1) as u64);
    assert!(b.bytes(0, MIB) == data);
    let sb = b.dev.stats().device;
    let acks = b
        .dev
        .stats()
        .qps
        .iter()
        .map(|(_, s)| s.acks_sent)
        .sum::<u64>();
    // (More than n when a loaded machine made the requester retransmit.)
    assert!(acks >= n as u64, "the engine acknowledged every AckReq");
    assert!(sb.acks_coalesced > 0, "{sb:?}");
    // Every ACK the engine emitted either left or was replaced by a newer one.
    assert!(sb.tx_packets + sb.acks_coalesced >= acks, "{sb:?}");
    assert!(sb.tx_packets < acks, "{sb:?}");
}

/// One post of UD sends alternating between two peers on different
/// addresses (and QPNs): the transmit side resolves each destination
/// afresh (`Tx`'s one-entry route cache is keyed by GID and DestQP), so
/// every datagram reaches its own peer, in order, with its own payload.
#[test]
fn ud_sends_of_one_post_to_two_peers_each_reach_their_own() {
    let (ia, ib) = ip_pair();
    let ic = match ib {
        std::net::IpAddr::V4(v4) => {
            let o = v4.octets();
            std::net::IpAddr::V4(std::net::Ipv4Addr::new(o[0], o[1], o[2], 3))
        }
        std::net::IpAddr::V6(_) => unreachable!("ip_pair gives IPv4"),
    };
    let a = Side::new(open(ia, Progress::Thread), MIB, 64);
    let b = Side::new(open(ib, Progress::Thread), MIB, 64);
    let c = Side::new(open(ic, Progress::Thread), MIB, 64);
    let qkey = 0x2222_2222;
    let init = InitParams {
        qkey,
        ..InitParams::default()
    };
    let mut qps = [a.qp(QpType::Ud), b.qp(QpType::Ud), c.qp(QpType::Ud)];
    for q in &mut qps {
        q.to_init(&init).unwrap();
        q.to_rtr(
            rnic_core::Qpn::from_wire(0),
            Psn::from_wire(0),
            a.gid(),
            &rtr(Mtu::Mtu1024),
        )
        .unwrap();
        q.to_rts(Psn::from_wire(0x33), &rts()).unwrap();
    }
    let [mut qa, mut qb, mut qc] = qps;
    const LEN: usize = 100;
    const SLOT: usize = 40 + LEN;
    for (side, q) in [(&b, &mut qb), (&c, &mut qc)] {
        side.fill(0, &[0xEE; 2 * SLOT]);
        for k in 0..2usize {
            let sge = [side.mr.sge(k * SLOT, SLOT as u32).unwrap()];
            q.post_recv(&[RecvWr::new(k as u64, &sge)]).unwrap();
        }
    }
    let payloads: Vec<Vec<u8>> = (0..4).map(|k| pattern(LEN, 0x100 + k)).collect();
    for (k, p) in payloads.iter().enumerate() {
        a.fill(k * LEN, p);
    }
    let ah_b = a.pd.create_ah(&AddressVector::new(b.gid())).unwrap();
    let ah_c = a.pd.create_ah(&AddressVector::new(c.gid())).unwrap();
    let dests = [
        ah_b.ud_dest(qb.qpn(), qkey),
        ah_c.ud_dest(qc.qpn(), qkey),
        ah_b.ud_dest(qb.qpn(), qkey),
        ah_c.ud_dest(qc.qpn(), qkey),
    ];
    let sges: Vec<[Sge; 1]> = (0..4)
        .map(|k| [a.mr.sge(k * LEN, LEN as u32).unwrap()])
        .collect();
    let wrs: Vec<SendWr<'_>> = (0..4)
        .map(|k| {
            SendWr::send(20 + k as u64, &sges[k])
                .to_ud(dests[k])
                .signaled()
        })
        .collect();
    qa.post_send(&wrs).unwrap();
    let wa = wait(&a.cq, 4, &[]);
    assert!(wa.iter().all(|w| w.status == WcStatus::Success), "{wa:?}");
    for (side, first) in [(&b, 0usize), (&c, 1)] {
        let got = wait(&side.cq, 2, &[]);
        for (k, w) in got.iter().enumerate() {
            assert_eq!(w.status, WcStatus::Success);
            assert_eq!(w.wr_id, k as u64);
            assert_eq!(w.src_qp, qa.qpn());
            assert_eq!(w.byte_len, SLOT as u32);
            assert_eq!(
                side.bytes(k * SLOT + 40, LEN),
                payloads[first + 2 * k],
                "peer {first}, datagram {k}"
            );
        }
    }
}
