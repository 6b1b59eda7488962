//! Every RoCEv2 wire parser over arbitrary bytes.

use rnic_roce::wire::{
    AethPacket, AethRepr, AtomicAckEthPacket, AtomicAckEthRepr, AtomicEthPacket, AtomicEthRepr,
    BthPacket, BthRepr, Datagram, DethPacket, DethRepr, Frame, IethPacket, IethRepr, ImmDtPacket,
    ImmDtRepr, RocePacket, RoceRepr, icrc,
};

/// Parse `data` as every header and as a whole packet, datagram and frame.
/// Panics (a finding) if a parser panics or a parsed packet does not
/// survive emit → parse unchanged.
pub fn packet(data: &[u8]) {
    headers(data);
    if let Ok(p) = RocePacket::new_checked(data) {
        // Every accessor of a checked packet is in bounds.
        let _ = (p.opcode(), p.info(), p.header_len(), p.pad_count());
        let _ = (
            p.payload().len(),
            p.pad().len(),
            p.covered().len(),
            p.icrc(),
        );
        let _ = (p.reth(), p.aeth(), p.immdt(), p.ieth(), p.atomic_eth());
        let _ = (p.atomic_ack_eth(), p.deth(), p.cnp_reserved());
        if let Ok(repr) = RoceRepr::parse(&p) {
            round_trip(&repr, p.payload());
        }
    }
    if let Ok(d) = Datagram::parse(data) {
        let _ = d.verify_icrc();
    }
    if let Ok(f) = Frame::parse(data) {
        let _ = f;
    }
    let _ = icrc::verify(data);
}

/// `repr` emitted with `payload` parses back to `repr` and the same payload.
fn round_trip(repr: &RoceRepr, payload: &[u8]) {
    let mut buf = vec![0u8; repr.buffer_len()];
    let n = match repr.emit(&mut buf, payload) {
        Ok(n) => n,
        Err(e) => panic!("a parsed packet does not re-emit: {e} ({repr:?})"),
    };
    let back = RocePacket::new_checked(&buf[..n]).expect("an emitted packet parses");
    let again = RoceRepr::parse(&back).expect("an emitted packet's repr parses");
    // PadCnt is derived from the payload length on emit (a received packet
    // may carry any PadCnt that its length allows; kernel rxe accepts it).
    let pad = (4 - repr.payload_len % 4) % 4;
    assert_eq!(
        usize::from(again.bth.pad_count),
        pad,
        "emit wrote the wrong PadCnt"
    );
    let mut want = *repr;
    want.bth.pad_count = again.bth.pad_count;
    assert_eq!(again, want, "emit → parse changed the packet");
    assert_eq!(back.payload(), payload, "emit → parse changed the payload");
}

/// Each extension header alone, from the first byte.
fn headers(data: &[u8]) {
    if let Ok(p) = BthPacket::new_checked(data) {
        let _ = BthRepr::parse(&p);
    }
    if let Ok(p) = AethPacket::new_checked(data) {
        let _ = AethRepr::parse(&p);
    }
    if let Ok(p) = AtomicEthPacket::new_checked(data) {
        let _ = AtomicEthRepr::parse(&p);
    }
    if let Ok(p) = AtomicAckEthPacket::new_checked(data) {
        let _ = AtomicAckEthRepr::parse(&p);
    }
    if let Ok(p) = DethPacket::new_checked(data) {
        let _ = DethRepr::parse(&p);
    }
    if let Ok(p) = IethPacket::new_checked(data) {
        let _ = IethRepr::parse(&p);
    }
    if let Ok(p) = ImmDtPacket::new_checked(data) {
        let _ = ImmDtRepr::parse(&p);
    }
}

/// A repr whose payload length disagrees with its payload cannot re-emit:
/// the round-trip check panics (its test shows the check can fail).
#[cfg(test)]
pub(crate) fn assert_round_trip_fails_for_a_truncated_payload() {
    use rnic_core::{Psn, Qpn};
    use rnic_roce::wire::{BthRepr, Opcode};
    let bth = BthRepr::new(Opcode::RC_SEND_ONLY, Qpn::from_wire(1), Psn::from_wire(1));
    round_trip(&RoceRepr::new(bth, 8), b"four");
}
