# Interop: guest kernel rxe running stock perftest 4.5-0.17 (ib_{write,read,send,atomic}_{bw,lat})
# <-> `rnicctl perf` on the host, in a host netns behind the tap (10.50.0.2 guest,
# 10.50.0.1 host). RNIC_INTEROP_SERVER=kernel (default): the guest's tools are the
# servers, rnicctl the clients; =rnic: the other way round. Tests in RNIC_PERF_TESTS
# (default "write-bw send-lat"), each at -s 4096 (bw) / 64 (lat) / none (atomics: 8),
# -n RNIC_PERF_ITERS (default 200) -m 1024, TCP port 18515 + run index. RNICCTL: the host binary
# (tests/vm.rs builds it). The guest uses -x 1 (its IPv4 GID); rnicctl -x 0 on
# rxe:10.50.0.1 with -e (progress thread: leaves the CPU to QEMU).
# Results: capture.pcap (tap), rnic-<test>.log, share/kernel-<test>.txt.
SCENARIO_TIMEOUT=280
NS=rnicvm-$ID TAP=rnvtap0
SERVER=${RNIC_INTEROP_SERVER:-kernel}
TESTS=${RNIC_PERF_TESTS:-write-bw send-lat}
ITERS=${RNIC_PERF_ITERS:-200}
EXTRA=${RNIC_PERF_EXTRA:-}   # options for both sides, e.g. "-q 2"

size_of() { case $1 in *-bw) echo 4096 ;; *) echo 64 ;; esac; }

scenario_prepare() {
  [ -x "${RNICCTL:-}" ] || { say "RNICCTL is not an executable: '${RNICCTL:-}'"; return 1; }
  printf 'SERVER=%s\nTESTS="%s"\nITERS=%s\nEXTRA="%s"\n' "$SERVER" "$TESTS" "$ITERS" "$EXTRA" >> "$SHARE/env.sh"
}

# rnic_perf <test> <port> [host]: one rnicctl perf run in the netns; a client retries
# while the guest's server is not listening yet.
rnic_perf() {
  local t=$1 port=$2 log=$RESULTS/rnic-$1.log rc size
  size=$(size_of "$t")
  shift 2
  for _ in $(seq 1 60); do
    rc=0
    ip netns exec "$NS" timeout -k 5 90 "$RNICCTL" perf "$t" -d rxe:10.50.0.1 -x 0 -e --stats \
      -p "$port" -s "$size" -m 1024 -n "$ITERS" $EXTRA "$@" > "$log" 2>&1 < /dev/null || rc=$?
    [ "$rc" -ne 0 ] && [ $# -gt 0 ] && not_listening "$log" || break
    sleep 1
  done
  echo "rc=$rc" >> "$log"
  say "rnicctl perf $t -s $size ($SERVER server): rc=$rc"
  return "$rc"
}

scenario_main() {
  interop_net_up
  interop_guest_start interop-perftest
  local ok=0 i=0 t
  for t in $TESTS; do
    if [ "$SERVER" = kernel ]; then
      rnic_perf "$t" $((18515 + i)) 10.50.0.2 || ok=1
    else
      rnic_perf "$t" $((18515 + i)) || ok=1
    fi
    i=$((i + 1))
  done
  vm_wait interop-perftest || ok=1
  interop_capture_stop
  guest_ok interop-perftest && return "$ok"
}

scenario_check() {
  local ok=0 t
  for t in $TESTS; do
    expect "$RESULTS/rnic-$t.log" '^rc=0' "rnicctl perf $t exit 0" || ok=1
    expect "$SHARE/interop-perftest.out" "^kernel perftest $t rc=0" "kernel perftest $t exit 0" || ok=1
  done
  expect "$RESULTS/capture.log" '^[1-9][0-9]* packets captured' "tap capture has RoCEv2 packets" || ok=1
  return $ok
}
