# Interop with one shared rnic device: two rnic rc_pingpong processes on the same host
# device (rxe:10.50.0.1, in a host netns behind the tap) run at the same time, each
# against its own stock ibv_rc_pingpong server on the guest's kernel rxe (TCP ports 18515
# and 18516). The two processes share UDP/4791 through rnic-rxe's QPN-steered
# SO_REUSEPORT group (docs/sharing.md): each must get only its own QP's packets.
# One client busy-polls, the other uses -e (progress thread + completion channel).
# RNIC_RC_PINGPONG: the host binary (tests/vm.rs builds it).
# Results: capture.pcap (tap), rnic-a.log, rnic-b.log, share/kernel-a.txt, share/kernel-b.txt.
SCENARIO_TIMEOUT=150
NS=rnicvm-$ID TAP=rnvtap0
SIZE=${RNIC_INTEROP_SIZE:-4096}
ITERS=${RNIC_INTEROP_ITERS:-500}

scenario_prepare() {
  [ -x "${RNIC_RC_PINGPONG:-}" ] || { say "RNIC_RC_PINGPONG is not an executable: '${RNIC_RC_PINGPONG:-}'"; return 1; }
  printf 'SIZE=%s\nITERS=%s\n' "$SIZE" "$ITERS" >> "$SHARE/env.sh"
}

# rnic_client <tag> <port> [-e]: one rnic client on the shared device; retries while the
# guest's server is not listening yet.
rnic_client() {
  local tag=$1 port=$2 log=$RESULTS/rnic-$1.log rc
  shift 2
  for _ in $(seq 1 90); do
    rc=0
    ip netns exec "$NS" timeout -k 5 90 "$RNIC_RC_PINGPONG" -d rxe:10.50.0.1 -g 0 "$@" --stats \
      -p "$port" -s "$SIZE" -m 1024 -n "$ITERS" 10.50.0.2 > "$log" 2>&1 < /dev/null || rc=$?
    [ "$rc" -ne 0 ] && not_listening "$log" || break
    sleep 1
  done
  echo "rc=$rc" >> "$log"
  say "rnic client $tag: rc=$rc; $(grep -E 'bytes in|iters in|^[A-Z]' "$log" | paste -sd'|')"
  return "$rc"
}

scenario_main() {
  interop_net_up
  interop_guest_start interop-shared
  local ok=0 pa pb
  rnic_client a 18515 & pa=$!
  rnic_client b 18516 -e & pb=$!
  wait "$pa" || ok=1
  wait "$pb" || ok=1
  vm_wait interop-shared || ok=1
  interop_capture_stop
  guest_ok interop-shared && return "$ok"
}

scenario_check() {
  local ok=0 t
  for t in a b; do
    expect "$RESULTS/rnic-$t.log" '^[0-9]+ iters in ' "rnic client $t result line" || ok=1
    expect "$SHARE/interop-shared.out" "^kernel rc_pingpong $t rc=0" "kernel server $t exit 0" || ok=1
  done
  expect "$RESULTS/capture.log" '^[1-9][0-9]* packets captured' "tap capture has RoCEv2 packets" || ok=1
  return $ok
}
