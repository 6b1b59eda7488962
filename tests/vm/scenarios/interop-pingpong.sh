# Interop: guest kernel rxe (stock ibv_rc_pingpong) <-> rnic's examples/rc_pingpong on the
# host, in a host netns behind the tap (10.50.0.2 guest, 10.50.0.1 host).
# RNIC_INTEROP_SERVER=kernel (default): the guest's tool is the server, rnic the client;
# =rnic: the other way round. One run per size in RNIC_INTEROP_SIZES (default "64 5000"),
# -m 1024, -n RNIC_INTEROP_ITERS (default 200), TCP port 18515 + run index.
# RNIC_RC_PINGPONG: the host binary (tests/vm.rs builds it). The guest's tool runs with -c
# and -g 1 (its IPv4 GID); rnic uses -g 0 on rxe:10.50.0.1 and -e (progress thread) unless
# RNIC_INTEROP_PROGRESS=poll.
# Results: capture.pcap (tap, both directions), rnic-<size>.log, share/kernel-<size>.txt.
SCENARIO_TIMEOUT=120
NS=rnicvm-$ID TAP=rnvtap0
SERVER=${RNIC_INTEROP_SERVER:-kernel}
SIZES=${RNIC_INTEROP_SIZES:-64 5000}
ITERS=${RNIC_INTEROP_ITERS:-200}
# rnic's progress: "events" (-e: progress thread + completion channel) or "poll"
# (caller-driven busy polling, as the stock tool's default).
PROGRESS=${RNIC_INTEROP_PROGRESS:-events}

scenario_prepare() {
  [ -x "${RNIC_RC_PINGPONG:-}" ] || { say "RNIC_RC_PINGPONG is not an executable: '${RNIC_RC_PINGPONG:-}'"; return 1; }
  printf 'SERVER=%s\nSIZES="%s"\nITERS=%s\n' "$SERVER" "$SIZES" "$ITERS" >> "$SHARE/env.sh"
  # Under loss the stock tool's missing closing handshake can strand the side that
  # finishes last (see linger_destroy_qp.c): the guest's tool keeps its QP a second.
  if [ -n "$NETEM" ]; then
    gcc -shared -fPIC -O2 -Wall -o "$SHARE/linger_destroy_qp.so" "$HERE/linger_destroy_qp.c" -ldl || return 1
    printf 'PRELOAD=/mnt/host/linger_destroy_qp.so\n' >> "$SHARE/env.sh"
  fi
}

# rnic_pp <size> <port> [server]: one rnic rc_pingpong run in the netns; a client retries
# while the guest's server is not listening yet.
rnic_pp() {
  local size=$1 port=$2 log=$RESULTS/rnic-$1.log rc
  shift 2
  for _ in $(seq 1 60); do
    rc=0
    local ev=-e
    [ "$PROGRESS" = events ] || ev=
    ip netns exec "$NS" timeout -k 5 60 "$RNIC_RC_PINGPONG" -d rxe:10.50.0.1 -g 0 $ev --stats \
      -p "$port" -s "$size" -m 1024 -n "$ITERS" "$@" > "$log" 2>&1 < /dev/null || rc=$?
    [ "$rc" -ne 0 ] && [ $# -gt 0 ] && not_listening "$log" || break
    sleep 1
  done
  echo "rc=$rc" >> "$log"
  say "rnic rc_pingpong -s $size ($SERVER server): rc=$rc; $(grep -E 'bytes in|iters in|^[A-Z]' "$log" | paste -sd'|')"
  return "$rc"
}

scenario_main() {
  interop_net_up
  interop_guest_start interop-pingpong
  local ok=0 i=0 size
  for size in $SIZES; do
    if [ "$SERVER" = kernel ]; then
      rnic_pp "$size" $((18515 + i)) 10.50.0.2 || ok=1
    else
      rnic_pp "$size" $((18515 + i)) || ok=1
    fi
    i=$((i + 1))
  done
  vm_wait interop-pingpong || ok=1
  interop_capture_stop
  guest_ok interop-pingpong && return "$ok"
}

scenario_check() {
  local ok=0 size
  for size in $SIZES; do
    expect "$RESULTS/rnic-$size.log" '^[0-9]+ iters in ' "rnic rc_pingpong -s $size result line" || ok=1
    expect "$SHARE/interop-pingpong.out" "^kernel rc_pingpong size=$size rc=0" "kernel rc_pingpong -s $size exit 0" || ok=1
    if [ -n "$NETEM" ]; then
      expect "$SHARE/kernel-$size.txt" '^linger_destroy_qp: keeping the QP' "kernel tool -s $size lingered" || ok=1
    fi
  done
  expect "$RESULTS/capture.log" '^[1-9][0-9]* packets captured' "tap capture has RoCEv2 packets" || ok=1
  return $ok
}
