//! The send queue's consumer never passes the producer: a WQE whose DS count claims more
//! basic blocks than the doorbell record posted is refused and steps one block (found by
//! the `mlx5_wqe` fuzz target: the consumer jumped by the claimed size past the producer,
//! and the QP in ERR then flushed the ~65,000 WQEs the ring seemed to hold).
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::hw::*;
use rnic_mlx5_prm::{CqeOpcode, CqeSyndrome, ErrCqe, WqeOpcode};

#[test]
fn a_wqe_claiming_unposted_blocks_is_refused_without_passing_the_producer() {
    let mut p = pair();
    // A SEND of one basic block whose control segment says DS = 8 (two blocks); only the
    // one block is posted.
    let idx =
        p.qp.write_wqe(WqeOpcode::Send, true, &[data_seg(8, p.lkey, VA)]);
    let at = SQ_OFF + (usize::from(idx) & ((1 << LOG_SQ) - 1)) * 64;
    p.qp.wq.write(at + 7, &[8]).unwrap();
    p.qp.sq_pi = p.qp.sq_pi.wrapping_add(1);
    p.qp.dbr
        .write(4, &u32::from(p.qp.sq_pi).to_be_bytes())
        .unwrap();
    let mut first = [0u8; 8];
    p.qp.wq.read(at, &mut first).unwrap();
    p.hw.uar_write64(0x800, u64::from_be_bytes(first));

    let c = p.cq.expect();
    assert_eq!(
        (opcode(&c), syndrome(&c)),
        (CqeOpcode::ReqErr, CqeSyndrome::LocalQpOp)
    );
    assert_eq!(ErrCqe::new_unchecked(&c[..]).wqe_counter(), u32::from(idx));
    assert_eq!(p.qp.state(&p.hw), 6, "the QP is in ERR");
    std::thread::sleep(Duration::from_millis(50));
    let st = p.hw.r.fw().hca_stats();
    assert_eq!(
        (st.cqes, st.cqes_dropped, st.cq_overruns),
        (1, 0, 0),
        "one CQE for the one posted WQE, no flush of unposted ones: {st:?}"
    );

    // The next WQE posted is at index idx + 1, and is flushed there.
    let next =
        p.qp.post(&p.hw, WqeOpcode::Send, true, &[data_seg(8, p.lkey, VA)]);
    assert_eq!(next, idx.wrapping_add(1));
    let c = p.cq.expect();
    assert_eq!(
        (opcode(&c), syndrome(&c)),
        (CqeOpcode::ReqErr, CqeSyndrome::WrFlushed)
    );
    assert_eq!(ErrCqe::new_unchecked(&c[..]).wqe_counter(), u32::from(next));
    assert_eq!(p.hw.r.fw().hca_stats().cqes, 2);
}
