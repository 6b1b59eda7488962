#!/usr/bin/env python3
"""Client side of examples/interop_rw.rs on kernel rxe, with pyverbs (rdma-core).

Registers one buffer of 3*len bytes: [0, len) is the target of the server's RDMA WRITE
(zeroed), [len, 2*len) the source of its RDMA READ (pattern 2), [2*len, 3*len) our scratch.
Pattern k, byte i: (37*k + 13*i + i//256) % 256. Exchange (one text line each way, the
client first): "qpn=<hex> psn=<hex> gid=<IPv6> rkey=<hex> va=<hex> len=<dec>"; the client
says "client-ready" once its QP is in RTS. Then the server WRITEs pattern 1 and READs pattern 2 and sends "server-done"; we check pattern 1,
WRITE pattern 3 into the server's [0, len), READ its [len, 2*len) (pattern 4), check it,
and send "client-done". Phase 3 (RNR both ways, min_rnr_timer 24 = 40.96 ms): after
"rnr-send" the server SENDs 3000 bytes of pattern 5 and we post our receive 300 ms late;
we say "rnr-recv-done" and SEND pattern 6, which the server receives 300 ms late; it ends
with "rnr-done". Every check prints "RW VERDICT: <what>: <n> bytes MATCH" or
"... MISMATCH at byte <n>"; the exit status is 0 only if all match.
usage: interop_rw.py <server-ip> <port> <len> [device] [gid-index]"""
import ipaddress
import socket
import sys
import time

import pyverbs.enums as e
from pyverbs.addr import AHAttr, GID, GlobalRoute
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.wr import SGE, RecvWR, SendWR

server, port, length = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
dev = sys.argv[4] if len(sys.argv) > 4 else "rxe0"
gid_index = int(sys.argv[5]) if len(sys.argv) > 5 else 1


def pattern(k, n):
    return bytes((37 * k + 13 * i + i // 256) % 256 for i in range(n))


def verdict(what, got, want):
    bad = next((i for i in range(len(want)) if got[i] != want[i]), None)
    if bad is None and len(got) == len(want):
        print(f"RW VERDICT: {what}: {len(want)} bytes MATCH", flush=True)
        return True
    print(f"RW VERDICT: {what}: MISMATCH at byte {bad}", flush=True)
    return False


ctx = Context(name=dev)
pd = PD(ctx)
access = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
mr = MR(pd, 3 * length, access)
mr.write(bytes(length), length, 0)
mr.write(pattern(2, length), length, length)
cq = CQ(ctx, 16)
qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq,
                       cap=QPCap(max_send_wr=4, max_recv_wr=1, max_send_sge=1, max_recv_sge=1)))
gid = ctx.query_gid(1, gid_index)
psn = 0x4321

# Connect (the server may not listen yet) and exchange endpoints.
for _ in range(60):
    try:
        sock = socket.create_connection((server, port), timeout=90)
        break
    except OSError:
        time.sleep(1)
else:
    sys.exit(f"cannot connect to {server}:{port}")
rf = sock.makefile("r")
mine = (f"qpn={qp.qp_num:06x} psn={psn:06x} gid={ipaddress.IPv6Address(str(gid))} "
        f"rkey={mr.rkey:08x} va={mr.buf:x} len={length}")
print(f"client: {mine}", flush=True)
sock.sendall((mine + "\n").encode())
line = rf.readline().strip()
print(f"server: {line}", flush=True)
f = dict(kv.split("=", 1) for kv in line.split())
assert int(f["len"]) == length, line
r_va, r_rkey = int(f["va"], 16), int(f["rkey"], 16)

attr = QPAttr()
attr.qp_access_flags = access
attr.port_num = 1
attr.path_mtu = e.IBV_MTU_1024
attr.dest_qp_num = int(f["qpn"], 16)
attr.rq_psn = int(f["psn"], 16)
attr.max_dest_rd_atomic = 4
attr.min_rnr_timer = 24  # 40.96 ms: the RNR phase checks the wait
gr = GlobalRoute(dgid=GID(ipaddress.IPv6Address(f["gid"]).exploded), sgid_index=gid_index,
                 hop_limit=64)
attr.ah_attr = AHAttr(is_global=1, port_num=1, gr=gr)
qp.to_rtr(attr)
attr.sq_psn = psn
attr.timeout = 14
attr.retry_cnt = 7
attr.rnr_retry = 7
attr.max_rd_atomic = 4
qp.to_rts(attr)
sock.sendall(b"client-ready\n")  # the server may send only now (our QP left INIT)


def wait_wc(wr_id):
    deadline = time.time() + 60
    while time.time() < deadline:
        n, wcs = cq.poll()
        if n:
            if wcs[0].status != e.IBV_WC_SUCCESS or wcs[0].wr_id != wr_id:
                sys.exit(f"wr {wr_id}: completion status {wcs[0].status} wr_id {wcs[0].wr_id}")
            return wcs[0]
        time.sleep(0.001)
    sys.exit(f"wr {wr_id}: no completion")


def post_and_wait(opcode, wr_id, remote, n=None):
    wr = SendWR(wr_id=wr_id, opcode=opcode, num_sge=1,
                sg=[SGE(mr.buf + 2 * length, n or length, mr.lkey)],
                send_flags=e.IBV_SEND_SIGNALED)
    if remote is not None:
        wr.set_wr_rdma(r_rkey, remote)
    qp.post_send(wr)
    return wait_wc(wr_id)


line = rf.readline().strip()
print(f"server: {line}", flush=True)
assert line == "server-done", line
ok = verdict("rnic WRITE into kernel memory (pattern 1)", mr.read(length, 0), pattern(1, length))
ok &= verdict("kernel READ source left intact (pattern 2)", mr.read(length, length),
              pattern(2, length))
mr.write(pattern(3, length), length, 2 * length)
t0 = time.time()
post_and_wait(e.IBV_WR_RDMA_WRITE, 1, r_va)
print(f"kernel RDMA WRITE of {length} bytes completed in {time.time() - t0:.3f}s", flush=True)
mr.write(bytes(length), length, 2 * length)
t0 = time.time()
post_and_wait(e.IBV_WR_RDMA_READ, 2, r_va + length)
print(f"kernel RDMA READ of {length} bytes completed in {time.time() - t0:.3f}s", flush=True)
ok &= verdict("kernel READ of rnic memory (pattern 4)", mr.read(length, 2 * length),
              pattern(4, length))
sock.sendall(b"client-done\n")

# Phase 3, RNR both ways: the server SENDs pattern 5 before we have a receive (we post it
# 300 ms late), then we SEND pattern 6 before the server has one.
RNR_LEN = 3000
line = rf.readline().strip()
assert line == "rnr-send", line
mr.write(bytes(RNR_LEN), RNR_LEN, 2 * length)
time.sleep(0.3)
qp.post_recv(RecvWR(wr_id=3, num_sge=1, sg=[SGE(mr.buf + 2 * length, RNR_LEN, mr.lkey)]))
wc = wait_wc(3)
print(f"kernel received {wc.byte_len} bytes after RNR", flush=True)
ok &= verdict("rnic SEND into kernel memory after RNR (pattern 5)",
              mr.read(RNR_LEN, 2 * length), pattern(5, RNR_LEN))
mr.write(pattern(6, RNR_LEN), RNR_LEN, 2 * length)
sock.sendall(b"rnr-recv-done\n")
t0 = time.time()
post_and_wait(e.IBV_WR_SEND, 4, None, RNR_LEN)
print(f"kernel SEND of {RNR_LEN} bytes after RNR completed in {time.time() - t0:.3f}s", flush=True)
line = rf.readline().strip()
assert line == "rnr-done", line
sock.close()
sys.exit(0 if ok else 1)
