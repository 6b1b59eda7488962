# Interop: RDMA WRITE and READ between rnic (examples/interop_rw, host netns, 10.50.0.1)
# and the guest's kernel rxe (tests/vm/guest/interop_rw.py, pyverbs, 10.50.0.2), every
# byte checked on both sides ("RW VERDICT: … MATCH" lines). Exchange format: the header of
# examples/interop_rw.rs. RNIC_INTEROP_RW: the host binary (tests/vm.rs builds it);
# RNIC_INTEROP_RW_LEN: bytes per WRITE/READ (default 20000: 20 packets at MTU 1024).
# Results: capture.pcap (tap, both directions), rnic.log, share/interop-rw.out.
SCENARIO_TIMEOUT=120
NS=rnicvm-$ID TAP=rnvtap0
RW_LEN=${RNIC_INTEROP_RW_LEN:-20000}

scenario_prepare() {
  [ -x "${RNIC_INTEROP_RW:-}" ] || { say "RNIC_INTEROP_RW is not an executable: '${RNIC_INTEROP_RW:-}'"; return 1; }
  cp "$HERE/guest/interop_rw.py" "$SHARE/"
  printf 'RW_LEN=%s\n' "$RW_LEN" >> "$SHARE/env.sh"
}

scenario_main() {
  interop_net_up
  host_bg rnic "$NS" "$RNIC_INTEROP_RW" -d rxe:10.50.0.1 -g 0 --len "$RW_LEN" --port 18600
  local rnic=$BG_PID ok=0
  wait_listen "$NS" 18600
  interop_guest_start interop-rw
  vm_wait interop-rw || ok=1
  wait "$rnic" || { say "rnic interop_rw exited $?"; ok=1; }
  interop_capture_stop
  guest_ok interop-rw && return "$ok"
}

scenario_check() {
  local ok=0
  expect "$RESULTS/rnic.log" '^RW VERDICT: rnic READ of kernel memory .* MATCH' "rnic READ kernel memory" || ok=1
  expect "$RESULTS/rnic.log" '^RW VERDICT: kernel WRITE into rnic memory .* MATCH' "kernel WROTE rnic memory" || ok=1
  expect "$SHARE/interop-rw.out" '^RW VERDICT: rnic WRITE into kernel memory .* MATCH' "rnic WROTE kernel memory" || ok=1
  expect "$SHARE/interop-rw.out" '^RW VERDICT: kernel READ of rnic memory .* MATCH' "kernel READ rnic memory" || ok=1
  return $ok
}
