#!/usr/bin/env python3
"""Stand-in host peer for scenario tap-peer (until the rnic rxe backend replaces it).

Answers ibv_rc_pingpong's TCP exchange (rocev2.md 14.1: "%04x:%06x:%06x:%s" + NUL, 52 bytes,
then the client's "done") with a made-up QPN/PSN and this host's GID, so the guest's kernel
rxe moves its QP to RTS and sends SEND packets to us. It never ACKs them; it only counts the
UDP/4791 datagrams it receives (so the guest gets no ICMP port-unreachable either).
usage: pingpong_peer.py <my-ipv4> [accept-timeout-seconds]"""
import socket
import sys
import time

ip = sys.argv[1]
accept_timeout = float(sys.argv[2]) if len(sys.argv) > 2 else 120
QPN, PSN = 0x000111, 0x000100

udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
udp.bind((ip, 4791))
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((ip, 18515))
srv.listen(1)
srv.settimeout(accept_timeout)
print(f"peer: listening on {ip}:18515", flush=True)
conn, addr = srv.accept()
msg = b""
while len(msg) < 52:
    chunk = conn.recv(52 - len(msg))
    if not chunk:
        sys.exit(f"peer: client closed after {len(msg)} bytes")
    msg += chunk
info = msg.rstrip(b"\0").decode()
print(f"peer: client QP info: {info} from {addr[0]}", flush=True)
gid = socket.inet_pton(socket.AF_INET6, "::ffff:" + ip).hex()
conn.sendall(("0000:%06x:%06x:%s" % (QPN, PSN, gid)).encode() + b"\0")
print(f"peer: sent QPN {QPN:#08x} PSN {PSN:#08x} GID ::ffff:{ip}", flush=True)
conn.settimeout(10)
conn.recv(16)  # the client's "done"; it closes the connection right after
conn.close()
# Count RoCEv2 datagrams until the guest has been quiet for 3 s (it retries until its
# ibv_rc_pingpong is killed), or 60 s have passed.
udp.settimeout(3)
count, deadline = 0, time.time() + 60
while time.time() < deadline:
    try:
        udp.recv(65535)
        count += 1
    except socket.timeout:
        if count:
            break
print(f"peer: received {count} RoCEv2 datagrams", flush=True)
