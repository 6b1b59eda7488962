//! The RC transport engine against a hostile peer, with the invariants as
//! assertions (see the crate docs).

use std::collections::HashSet;

use rnic_core::{
    AccessFlags, AddressVector, Gid, Lkey, Mtu, PdHandle, Psn, QpAttr, QpAttrMask, QpState, Qpn,
    RecvWr, Rkey, SendFlags, SendOp, SendWr, Sge, WcStatus, WorkCompletion,
};
use rnic_roce::transport::testkit::{MemTable, Region};
use rnic_roce::transport::{
    CompletionSink, CqSide, Instant, Io, PacketDest, PacketSink, Qp, QpConfig,
};
use rnic_roce::wire::{ExtHeader, Opcode, RocePacket, RoceRepr};

use crate::Input;

const PD: PdHandle = PdHandle(1);
const FOREIGN_PD: PdHandle = PdHandle(2);
const QPN_SELF: u32 = 0x22;
const QPN_PEER: u32 = 0x11;
/// The first PSN the fuzzed side expects (responder) or sends (requester).
const PSN0: u32 = 1000;
/// Most inputs steps a harness runs.
const MAX_STEPS: usize = 256;

/// The strict memory model every engine harness uses: rnic-roce's testkit
/// table (keys checked before a byte moves, local keys only for local
/// access, written bytes recorded), with each region filled with a pattern.
#[derive(Clone, Debug, Default)]
struct Model(MemTable);

impl Model {
    fn register(&mut self, pd: PdHandle, base: u64, len: usize, access: AccessFlags) -> u32 {
        let key = self.0.register(pd, base, len, access);
        for (i, b) in self.0.bytes_mut(key).iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(7) ^ key as u8;
        }
        key
    }

    fn region(&self, key: u32) -> &Region {
        self.0.region(key).expect("a region the harness registered")
    }
}

/// Packets the QP emitted; each is checked to be well-formed on commit.
#[derive(Debug, Default)]
struct Tx {
    buf: Vec<u8>,
    sent: Vec<Vec<u8>>,
}

impl PacketSink for Tx {
    fn buffer(&mut self, len: usize) -> Option<&mut [u8]> {
        self.buf.clear();
        self.buf.resize(len, 0);
        Some(&mut self.buf)
    }

    fn commit(&mut self, len: usize, dest: &PacketDest) {
        assert_eq!(dest.qpn, Qpn::from_wire(QPN_PEER), "a packet to a stranger");
        let bytes = &self.buf[..len];
        let p = match RocePacket::new_checked(bytes) {
            Ok(p) => p,
            Err(e) => panic!("the QP emitted a malformed packet ({e}): {bytes:02x?}"),
        };
        if let Err(e) = RoceRepr::parse(&p) {
            panic!("the QP emitted an unparsable packet ({e}): {bytes:02x?}");
        }
        assert_eq!(p.bth().dest_qp(), Qpn::from_wire(QPN_PEER));
        // Keep the last few (a requester's retries are what tests look at).
        if self.sent.len() == 64 {
            self.sent.remove(0);
        }
        self.sent.push(bytes.to_vec());
    }
}

/// Completions in arrival order.
#[derive(Debug, Default)]
struct Cq {
    wcs: Vec<(CqSide, WorkCompletion)>,
}

impl CompletionSink for Cq {
    fn complete(&mut self, side: CqSide, wc: WorkCompletion) {
        self.wcs.push((side, wc));
    }
}

/// One side under test.
struct Rig {
    qp: Qp,
    mem: Model,
    tx: Tx,
    cq: Cq,
    now: Instant,
    mtu: Mtu,
}

impl Rig {
    fn new(mtu: Mtu, sq_psn: u32, rq_psn: u32) -> Rig {
        let mut cfg = QpConfig::rc(Qpn::from_wire(QPN_SELF), PD);
        cfg.sq_depth = 16;
        cfg.rq_depth = 16;
        cfg.local_gid = gid(2);
        let qp = Qp::new(cfg).expect("an RC QP with depth 16");
        let mut rig = Rig {
            qp,
            mem: Model::default(),
            tx: Tx::default(),
            cq: Cq::default(),
            now: Instant::from_nanos(0),
            mtu,
        };
        rig.connect(sq_psn, rq_psn);
        rig
    }

    fn connect(&mut self, sq_psn: u32, rq_psn: u32) {
        let mut av = AddressVector::new(gid(1));
        av.udp_sport = Some(0xc000);
        let m = QpAttrMask::STATE;
        let steps = [
            (
                QpAttr {
                    qp_state: QpState::Init,
                    qp_access_flags: AccessFlags::all(),
                    ..QpAttr::default()
                },
                m | QpAttrMask::ACCESS_FLAGS,
            ),
            (
                QpAttr {
                    qp_state: QpState::Rtr,
                    path_mtu: self.mtu,
                    dest_qp_num: Qpn::from_wire(QPN_PEER),
                    rq_psn: Psn::from_wire(rq_psn),
                    max_dest_rd_atomic: 4,
                    min_rnr_timer: 1,
                    ah_attr: av,
                    ..QpAttr::default()
                },
                m | QpAttrMask::PATH_MTU
                    | QpAttrMask::DEST_QPN
                    | QpAttrMask::RQ_PSN
                    | QpAttrMask::MAX_DEST_RD_ATOMIC
                    | QpAttrMask::MIN_RNR_TIMER
                    | QpAttrMask::AV,
            ),
            (
                QpAttr {
                    qp_state: QpState::Rts,
                    sq_psn: Psn::from_wire(sq_psn),
                    timeout: 8,
                    retry_cnt: 3,
                    rnr_retry: 3,
                    max_rd_atomic: 4,
                    ..QpAttr::default()
                },
                m | QpAttrMask::SQ_PSN
                    | QpAttrMask::TIMEOUT
                    | QpAttrMask::RETRY_CNT
                    | QpAttrMask::RNR_RETRY
                    | QpAttrMask::MAX_QP_RD_ATOMIC,
            ),
        ];
        for (attr, mask) in &steps {
            let r = self.qp.modify(attr, *mask, &mut self.cq);
            assert!(r.is_ok(), "bring-up: {r:?}");
        }
    }

    fn with<R>(&mut self, f: impl FnOnce(&mut Qp, Instant, &mut Io<'_>) -> R) -> R {
        let mut io = Io {
            mem: &mut self.mem.0,
            tx: &mut self.tx,
            cq: &mut self.cq,
        };
        f(&mut self.qp, self.now, &mut io)
    }

    fn receive(&mut self, packet: &[u8]) {
        self.with(|qp, now, io| qp.receive(now, packet, gid(1), io));
    }

    /// Let time pass to the next deadline (or 1 ms) and fire the timers.
    fn tick(&mut self) {
        let next = self
            .qp
            .next_deadline()
            .unwrap_or(self.now.after(core::time::Duration::from_millis(1)));
        self.now = next.max(self.now);
        self.with(|qp, now, io| {
            qp.on_timer(now, io);
            qp.run(now, io);
        });
    }
}

fn gid(last: u8) -> Gid {
    Gid::from_ipv4(std::net::Ipv4Addr::new(10, 0, 0, last))
}

/// A packet from the peer to the QP under test, structured from `inp`:
/// `opcode` with every extension header its opcode table entry lists;
/// header fields from `field`, payload from the input.
fn build(
    inp: &mut Input<'_>,
    opcode: u8,
    (qpn, psn): (u32, u32),
    field: &mut dyn FnMut(ExtHeader, &mut Input<'_>) -> Vec<u8>,
) -> Vec<u8> {
    let flags = inp.u8();
    let dest = if flags & 0x70 == 0x70 {
        inp.u32() & 0xff_ffff
    } else {
        qpn
    };
    let payload_len = usize::from(inp.u16() % 4200);
    let pad = (4 - payload_len % 4) % 4;
    let mut b = Vec::with_capacity(12 + 64 + payload_len + 8);
    b.push(opcode);
    // SE | MigReq | PadCnt | TVer 0.
    b.push((flags & 0x80) | 0x40 | ((pad as u8) << 4));
    b.extend_from_slice(&0xffffu16.to_be_bytes());
    b.push(0);
    b.extend_from_slice(&dest.to_be_bytes()[1..]);
    b.push(if flags & 1 != 0 { 0x80 } else { 0 });
    b.extend_from_slice(&(psn & 0xff_ffff).to_be_bytes()[1..]);
    if let Some(info) = Opcode(opcode).info() {
        for h in info.headers {
            b.extend_from_slice(&field(*h, inp));
        }
    }
    let payload = inp.bytes(payload_len);
    b.extend_from_slice(payload);
    b.resize(b.len() + (payload_len - payload.len()) + pad, 0);
    b.extend_from_slice(&[0; 4]); // ICRC (checked by the provider, not the engine)
    b
}

/// The responder: an RC QP in RTS fed hostile requests.
pub fn responder(data: &[u8]) {
    let mut inp = Input::new(data);
    let mtu = if inp.u8() & 1 == 0 {
        Mtu::Mtu256
    } else {
        Mtu::Mtu1024
    };
    let mut rig = Rig::new(mtu, 7, PSN0);
    let lw = AccessFlags::LOCAL_WRITE;
    let w = rig
        .mem
        .register(PD, 0x1_0000, 4096, lw | AccessFlags::REMOTE_WRITE);
    let r = rig
        .mem
        .register(PD, 0x2_0000, 4096, AccessFlags::REMOTE_READ);
    let a = rig
        .mem
        .register(PD, 0x3_0000, 64, lw | AccessFlags::REMOTE_ATOMIC);
    let canary = rig.mem.register(PD, 0x4_0000, 4096, lw);
    let foreign = rig
        .mem
        .register(FOREIGN_PD, 0x5_0000, 4096, AccessFlags::ALL_REMOTE);
    let recv = rig.mem.register(PD, 0x6_0000, 8192, lw);
    let keys = [w, r, a, canary, foreign, recv];
    let frozen: Vec<(u32, Vec<u8>)> = [r, canary, foreign]
        .iter()
        .map(|&k| (k, rig.mem.region(k).data.clone()))
        .collect();
    let mut posted: HashSet<u64> = HashSet::new();
    let mut next_wr = 1u64;
    let mut psn = PSN0;
    for _ in 0..MAX_STEPS {
        if inp.is_empty() {
            break;
        }
        match inp.u8() % 8 {
            0 => {
                let len = u32::from(inp.u16() % 4096);
                let sg = [Sge::new(
                    0x6_0000 + u64::from(inp.u8()) * 16,
                    len,
                    Lkey(recv),
                )];
                let wr = RecvWr::new(next_wr, &sg);
                if rig.with(|qp, _, io| qp.post_recv(&wr, io)).is_ok() {
                    posted.insert(next_wr);
                }
                next_wr += 1;
            }
            1 => {
                let n = usize::from(inp.u8() % 64);
                let raw = inp.bytes(n).to_vec();
                rig.receive(&raw);
            }
            2 => rig.tick(),
            _ => {
                let (pkt, in_order) = hostile_request(&mut inp, QPN_SELF, psn, &keys, &rig_bases());
                rig.receive(&pkt);
                if in_order {
                    psn = psn.wrapping_add(1);
                }
            }
        }
        check_responder(&rig, &frozen, &posted);
    }
}

/// One request a hostile requester sends to QP `qpn` whose next expected
/// PSN is `psn`, structured from `inp`: any RC request opcode (now and then
/// any byte), the expected PSN or one in or out of the window, RETH /
/// AtomicETH / IETH naming one of the responder's regions (`keys`, based at
/// `bases`) or a random key and address, near and across the region edges,
/// any length and payload. The ICRC bytes are zero (the caller fills them
/// where a provider checks them). Returns the packet and whether it used
/// the expected PSN.
pub fn hostile_request(
    inp: &mut Input<'_>,
    qpn: u32,
    psn: u32,
    keys: &[u32],
    bases: &[u64],
) -> (Vec<u8>, bool) {
    let opcode = match inp.u8() {
        x if x < 0xf0 => {
            static REQUESTS: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
            let requests = REQUESTS.get_or_init(|| rc_opcodes(true));
            requests[usize::from(x) % requests.len()]
        }
        x => x.wrapping_mul(17),
    };
    let delta = match inp.u8() {
        x if x < 0xc0 => 0,
        x => i32::from(x as i8),
    };
    let at = psn.wrapping_add_signed(delta);
    let pkt = build(inp, opcode, (qpn, at), &mut |h, inp| {
        field(h, inp, keys, bases)
    });
    (pkt, delta == 0)
}

/// The base address of each region of [`responder`], in key order.
fn rig_bases() -> [u64; 6] {
    [0x1_0000, 0x2_0000, 0x3_0000, 0x4_0000, 0x5_0000, 0x6_0000]
}

/// The RC opcodes the wire table classes as requests (`requests`) or as
/// responses, in numeric order.
fn rc_opcodes(requests: bool) -> Vec<u8> {
    use rnic_roce::wire::Transport;
    (0..=255u8)
        .filter(|&op| {
            Opcode(op).info().is_some_and(|i| {
                i.transport == Transport::Rc
                    && if requests {
                        i.operation.is_request()
                    } else {
                        i.operation.is_response()
                    }
            })
        })
        .collect()
}

/// Extension-header bytes naming the rig's regions (or random keys).
fn field(h: ExtHeader, inp: &mut Input<'_>, keys: &[u32], bases: &[u64]) -> Vec<u8> {
    let pick = usize::from(inp.u8());
    let (key, base) = match (keys.get(pick % 8), bases.get(pick % 8)) {
        (Some(&k), Some(&b)) => (k, b),
        _ => (inp.u32(), inp.u64()),
    };
    let va = base
        .wrapping_add(u64::from(inp.u16() % 4200))
        .wrapping_sub(8);
    match h {
        ExtHeader::Reth => {
            let mut v = va.to_be_bytes().to_vec();
            v.extend_from_slice(&key.to_be_bytes());
            v.extend_from_slice(&u32::from(inp.u16()).to_be_bytes());
            v
        }
        ExtHeader::AtomicEth => {
            let mut v = (va & !7).to_be_bytes().to_vec();
            v.extend_from_slice(&key.to_be_bytes());
            v.extend_from_slice(&inp.u64().to_be_bytes());
            v.extend_from_slice(&inp.u64().to_be_bytes());
            v
        }
        ExtHeader::Ieth => key.to_be_bytes().to_vec(),
        ExtHeader::Aeth => inp.u32().to_be_bytes().to_vec(),
        other => inp.bytes(other.len()).to_vec(),
    }
}

fn check_responder(rig: &Rig, frozen: &[(u32, Vec<u8>)], posted: &HashSet<u64>) {
    for (k, before) in frozen {
        assert!(
            rig.mem.region(*k).data == *before,
            "region {k:#x} (no remote write right, or another PD) changed"
        );
    }
    let mut seen = HashSet::new();
    for (side, wc) in &rig.cq.wcs {
        if *side == CqSide::Recv {
            assert!(
                posted.contains(&wc.wr_id),
                "a completion for a receive never posted: {wc:?}"
            );
            assert!(
                seen.insert(wc.wr_id),
                "receive {} completed twice",
                wc.wr_id
            );
        }
    }
}

/// One request the requester harness posted.
#[derive(Clone, Copy, Debug)]
struct Posted {
    kind: u8,
    off: usize,
    len: usize,
}

/// The requester: READs, atomics, WRITEs and SENDs outstanding against a
/// lying responder.
pub fn requester(data: &[u8]) {
    let mut inp = Input::new(data);
    let mtu = if inp.u8() & 1 == 0 {
        Mtu::Mtu256
    } else {
        Mtu::Mtu1024
    };
    let mut rig = Rig::new(mtu, PSN0, 7);
    let responses = rc_opcodes(false);
    const STRIDE: usize = 2048;
    let local = rig
        .mem
        .register(PD, 0x1_0000, 8 * STRIDE, AccessFlags::LOCAL_WRITE);
    let canary = rig
        .mem
        .register(PD, 0x8_0000, 4096, AccessFlags::LOCAL_WRITE);
    let frozen = rig.mem.region(canary).data.clone();
    let mut posted = Vec::new();
    let n = 1 + usize::from(inp.u8() % 8);
    for i in 0..n {
        let kind = inp.u8() % 5;
        let len = match kind {
            3 | 4 => 8,
            _ => usize::from(inp.u16()) % (STRIDE + 1),
        };
        let off = i * STRIDE;
        let sg = [Sge::new(0x1_0000 + off as u64, len as u32, Lkey(local))];
        let (remote_addr, rkey) = (0x9_0000 + off as u64, Rkey(0x1234));
        let op = match kind {
            0 => SendOp::RdmaRead { remote_addr, rkey },
            1 => SendOp::RdmaWrite { remote_addr, rkey },
            2 => SendOp::Send,
            3 => SendOp::AtomicFetchAdd {
                remote_addr,
                rkey,
                add: 1,
            },
            _ => SendOp::AtomicCmpSwap {
                remote_addr,
                rkey,
                compare: 0,
                swap: 1,
            },
        };
        let wr = SendWr {
            ud: None,
            wr_id: i as u64 + 1,
            sg_list: if len == 0 { &[] } else { &sg },
            op,
            flags: SendFlags::SIGNALED,
        };
        if rig.with(|qp, _, io| qp.post_send(&wr, io)).is_ok() {
            posted.push(Posted { kind, off, len });
        }
    }
    rig.with(|qp, now, io| qp.run(now, io));
    // Nothing has been written yet: response data alone marks bytes.
    assert!(rig.mem.region(local).written.iter().all(|w| !w));
    for _ in 0..MAX_STEPS {
        if inp.is_empty() {
            break;
        }
        match inp.u8() % 8 {
            0 => rig.tick(),
            1 => {
                let n = usize::from(inp.u8() % 64);
                let raw = inp.bytes(n).to_vec();
                rig.receive(&raw);
            }
            _ => {
                let opcode = match inp.u8() {
                    x if x < 0xf0 => responses[usize::from(x) % responses.len()],
                    x => x.wrapping_mul(13),
                };
                let at = PSN0.wrapping_add(u32::from(inp.u8() % 40)).wrapping_sub(2);
                let pkt = build(&mut inp, opcode, (QPN_SELF, at), &mut |h, inp| match h {
                    ExtHeader::Aeth => {
                        let syn = match inp.u8() {
                            x if x < 0x80 => 0x1f,
                            x if x < 0xa0 => 0x60,
                            x if x < 0xb0 => 0x21,
                            x => x,
                        };
                        (u32::from(syn) << 24 | u32::from(inp.u16()))
                            .to_be_bytes()
                            .to_vec()
                    }
                    other => inp.bytes(other.len()).to_vec(),
                });
                rig.receive(&pkt);
            }
        }
        check_requester(&rig, local, canary, &frozen, &posted);
    }
}

fn check_requester(rig: &Rig, local: u32, canary: u32, frozen: &[u8], posted: &[Posted]) {
    assert!(
        rig.mem.region(canary).data == frozen,
        "memory no request names changed"
    );
    let region = rig.mem.region(local);
    let mut last = 0u64;
    for (side, wc) in &rig.cq.wcs {
        assert_eq!(
            *side,
            CqSide::Send,
            "a receive completion on a QP with no receives"
        );
        assert!(
            wc.wr_id > last,
            "send completions out of posting order or twice: {} after {last}",
            wc.wr_id
        );
        last = wc.wr_id;
        let p = posted[(wc.wr_id - 1) as usize];
        let reads_back = matches!(p.kind, 0 | 3 | 4);
        if wc.status == WcStatus::Success && reads_back {
            let hole = region.written[p.off..p.off + p.len].iter().position(|w| !w);
            assert!(
                hole.is_none(),
                "request {} (kind {}, {} B) completed SUCCESS with byte {:?} never written by a response",
                wc.wr_id,
                p.kind,
                p.len,
                hole
            );
        }
    }
}

/// Issue 15's READ-hole reproducer as a [`requester`] program: MTU 1024,
/// one 2048-byte READ at PSN 1000; a PSN-sequence NAK (0x60) at 1001; an
/// honest READ_RESPONSE_ONLY of the tail at 1001.
#[cfg(test)]
pub(crate) fn issue15_read_hole_seed() -> Vec<u8> {
    let mut v = vec![1, 0, 0, 0x08, 0x00];
    // ACK opcode at PSN 1001, no payload, AETH syndrome byte 0x90 → 0x60.
    v.extend_from_slice(&[2, 4, 3, 0, 0, 0, 0x90, 0, 1]);
    // READ_RESPONSE_ONLY at 1001 with 1024 bytes, AETH ACK.
    v.extend_from_slice(&[2, 3, 3, 0, 0x04, 0x00, 0x00, 0, 2]);
    v.extend(std::iter::repeat_n(0x77, 1024));
    v
}

/// Hand-made [`requester`] programs: the reproducer, an honest two-packet
/// READ, a WRITE and its ACK, an atomic and its atomic ACK.
#[cfg(test)]
pub(crate) fn requester_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let mut read = vec![0, 0, 0, 0x02, 0x00];
    for (opcode, psn) in [(0u8, 2u8), (2, 3)] {
        read.extend_from_slice(&[2, opcode, psn, 0, 0x01, 0x00, 0x00, 0, 1]);
        read.extend(std::iter::repeat_n(0x33, 256));
    }
    let write = vec![0, 0, 1, 0x00, 0x40, 2, 4, 2, 0, 0, 0, 0x00, 0, 1];
    let mut atomic = vec![0, 0, 3, 2, 5, 2, 0, 0, 0, 0x00, 0, 1];
    atomic.extend_from_slice(&41u64.to_be_bytes());
    vec![
        ("issue15-nak-inside-read", issue15_read_hole_seed()),
        ("honest-read", read),
        ("write-ack", write),
        ("atomic-ack", atomic),
    ]
}

/// Hand-made [`responder`] programs: a receive and a SEND, a WRITE into
/// the writable region, a READ of the readable one, a SEND_WITH_INVALIDATE
/// of a plain registration.
#[cfg(test)]
pub(crate) fn responder_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let mut send = vec![0, 0, 0x01, 0x00, 0];
    send.extend_from_slice(&[3, 4, 0, 1, 0, 16]);
    send.extend_from_slice(b"sixteen bytes ok");
    let mut write = vec![1, 3, 10, 0, 1, 0, 8, 0, 0, 8, 0, 8];
    write.extend_from_slice(b"8 bytes!");
    let read = vec![0, 3, 12, 0, 1, 0, 0, 1, 0, 8, 0, 64, 2];
    let mut inv = vec![0, 0, 0x01, 0x00, 0, 3, 16, 0, 1, 0, 4, 0, 0, 8];
    inv.extend_from_slice(b"inv!");
    vec![
        ("send", send),
        ("write", write),
        ("read", read),
        ("send-with-invalidate", inv),
    ]
}

/// Runs the requester's checks over a forged state: a READ reported
/// SUCCESS with none of its bytes written (must panic).
#[cfg(test)]
pub(crate) fn check_a_forged_read_completion() {
    let mut rig = Rig::new(Mtu::Mtu1024, PSN0, 7);
    let local = rig
        .mem
        .register(PD, 0x1_0000, 4096, AccessFlags::LOCAL_WRITE);
    let canary = rig.mem.register(PD, 0x8_0000, 64, AccessFlags::LOCAL_WRITE);
    let frozen = rig.mem.region(canary).data.clone();
    rig.cq.wcs.push((
        CqSide::Send,
        WorkCompletion {
            wr_id: 1,
            status: WcStatus::Success,
            ..WorkCompletion::default()
        },
    ));
    let posted = [Posted {
        kind: 0,
        off: 0,
        len: 2048,
    }];
    check_requester(&rig, local, canary, &frozen, &posted);
}
