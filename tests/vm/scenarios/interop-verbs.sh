# Interop: rnic's drop-in libibverbs.so.1 (verbs/) under stock rdma-core tools and perftest on
# the host, in a netns behind the tap (10.50.0.1, device rnic_rnvtap0), against the same stock
# tools on the guest's kernel rxe (10.50.0.2). One guest boot, both directions, STEPS in order
# "<tool>:<server side>" (pp = ibv_rc_pingpong -c -s 4096; others ib_<tool> -F), each at
# -m 1024 -n RNIC_VERBS_ITERS (default 100), TCP port 18515 + step index. The client retries
# while the server is not listening. RNIC_VERBS_DIR: the directory holding the drop-in
# (tests/vm.rs builds it). Results: capture.pcap (tap), host-<i>-<tool>.log,
# share/guest-<i>-<tool>.txt.
SCENARIO_TIMEOUT=240
NS=rnicvm-$ID TAP=rnvtap0
ITERS=${RNIC_VERBS_ITERS:-100}
STEPS=${RNIC_VERBS_STEPS:-pp:guest write_bw:guest send_lat:guest pp:host read_bw:host send_lat:host}

scenario_prepare() {
  [ -f "${RNIC_VERBS_DIR:-}/libibverbs.so.1" ] || {
    say "RNIC_VERBS_DIR has no libibverbs.so.1: '${RNIC_VERBS_DIR:-}'"; return 1; }
  for t in ibv_rc_pingpong ib_write_bw; do
    command -v $t > /dev/null || { say "$t missing on the host: verbs/tests/install-deps.sh"; return 1; }
  done
  printf 'STEPS="%s"\nITERS=%s\n' "$STEPS" "$ITERS" >> "$SHARE/env.sh"
}

# host_step <index> <tool> <server side>: the host's half of one step, on the drop-in.
host_step() {
  local i=$1 tool=$2 side=$3 port=$(($1 + 18515)) log=$RESULTS/host-$1-$2.log rc peer=
  local cmd
  case $tool in
    pp) cmd="ibv_rc_pingpong -d rnic_$TAP -g 0 -c -s 4096 -m 1024 -n $ITERS -p $port" ;;
    *) cmd="ib_$tool -d rnic_$TAP -x 0 -F -m 1024 -n $ITERS -p $port" ;;
  esac
  [ "$side" = guest ] && peer=10.50.0.2
  for _ in $(seq 1 60); do
    rc=0
    ip netns exec "$NS" env LD_LIBRARY_PATH="$RNIC_VERBS_DIR" RNIC_DEVICES="rxe:$TAP" \
      timeout -k 5 90 $cmd $peer > "$log" 2>&1 < /dev/null || rc=$?
    # The stock tools say "Couldn't connect to <host>:<port>" while nothing listens.
    [ "$rc" -ne 0 ] && [ -n "$peer" ] && grep -qi "couldn't connect" "$log" || break
    sleep 1
  done
  echo "rc=$rc" >> "$log"
  say "drop-in $tool (server: $side): rc=$rc"
  return "$rc"
}

scenario_main() {
  interop_net_up
  interop_guest_start interop-verbs
  local ok=0 i=0 s
  for s in $STEPS; do
    host_step "$i" "${s%%:*}" "${s##*:}" || ok=1
    i=$((i + 1))
  done
  vm_wait interop-verbs || ok=1
  interop_capture_stop
  guest_ok interop-verbs && return "$ok"
}

scenario_check() {
  local ok=0 i=0 s
  for s in $STEPS; do
    expect "$RESULTS/host-$i-${s%%:*}.log" '^rc=0' "drop-in ${s%%:*} (server: ${s##*:}) exit 0" || ok=1
    expect "$SHARE/interop-verbs.out" "^guest $i ${s%%:*} rc=0" "kernel ${s%%:*} exit 0" || ok=1
    i=$((i + 1))
  done
  expect "$RESULTS/capture.log" '^[1-9][0-9]* packets captured' "tap capture has RoCEv2 packets" || ok=1
  return $ok
}
