# Scenario (a): kernel rxe in a guest <-> a peer on the host, in a host netns behind a tap.
# The host peer is, for now, pingpong_peer.py (answers ibv_rc_pingpong's TCP exchange so the
# guest sends SEND packets) plus tcpdump on the tap; tests/vm.rs verifies every captured
# RoCEv2 packet (parse + ICRC) with rnic-roce. Results: capture.pcap, peer.log.
SCENARIO_TIMEOUT=150
NS=rnicvm-$ID TAP=rnvtap0

scenario_main() {
  netns_add "$NS"
  tap_add "$NS" "$TAP" 10.50.0.1/24
  host_bg capture "$NS" tcpdump -i "$TAP" -n -U -w "$RESULTS/capture.pcap" udp port 4791
  local cap=$BG_PID
  host_bg peer "$NS" python3 "$HERE/pingpong_peer.py" 10.50.0.1
  local peer=$BG_PID
  wait_listen "$NS" 18515
  VM_NETNS=$NS vm_start tap-peer \
    -netdev "tap,id=n0,ifname=$TAP,script=no,downscript=no" \
    -device virtio-net-pci,netdev=n0,mac=52:54:00:50:00:02
  vm_wait tap-peer
  wait "$peer" || say "peer exited $?"
  sleep 1; kill -INT "$cap"; wait "$cap" || true
  say "host capture: $(grep -E 'captured' "$RESULTS/capture.log")"
  say "host netns counters: $(ip netns exec "$NS" nstat -az | awk '/^(Ip|Udp)(InReceives|InDatagrams|NoPorts|InErrors|InCsumErrors|InAddrErrors|InHdrErrors|InDiscards|RcvbufErrors) /{printf "%s=%s ", $1, $2}')"
  guest_ok tap-peer
}

scenario_check() {
  local ok=0
  expect "$SHARE/tap-peer.out" '^rxe sent_pkts=[1-9]' "guest kernel rxe sent packets" || ok=1
  expect "$RESULTS/peer.log" '^peer: client QP info' "peer answered rc_pingpong's exchange" || ok=1
  expect "$RESULTS/peer.log" '^peer: received [1-9]' "peer received the guest's RoCEv2 datagrams" || ok=1
  expect "$RESULTS/capture.log" '^[1-9][0-9]* packets captured' "tap capture has RoCEv2 packets" || ok=1
  return $ok
}
