# Scenario (b): two guests on a QEMU socket wire (inside a private netns, so the wire's
# 127.0.0.1 port is ours alone), kernel rxe <-> kernel rxe: ibv_rc_pingpong and ib_write_bw.
# With --netem, both NICs get that qdisc (e.g. --netem 'loss 1%'). Capture: two-guests.pcap (B's NIC).
SCENARIO_TIMEOUT=420
NS=rnicvm-$ID

scenario_main() {
  netns_add "$NS"
  VM_NETNS=$NS VM_SMP=1 VM_MEM=1024 vm_start two-guests-a \
    -netdev socket,id=n0,listen=127.0.0.1:12345 -device virtio-net-pci,netdev=n0,mac=52:54:00:60:00:01
  wait_listen "$NS" 12345
  VM_NETNS=$NS VM_SMP=1 VM_MEM=1024 vm_start two-guests-b \
    -netdev socket,id=n0,connect=127.0.0.1:12345 -device virtio-net-pci,netdev=n0,mac=52:54:00:60:00:02
  local rc=0
  vm_wait two-guests-b || rc=1
  vm_wait two-guests-a || rc=1
  guest_ok two-guests-a && guest_ok two-guests-b && [ $rc -eq 0 ]
}

scenario_check() {
  local ok=0 b=$SHARE/two-guests-b.out
  expect "$b" '^B: rc_pingpong rc=0' "rc_pingpong client" || ok=1
  expect "$b" '^B: ib_write_bw rc=0' "ib_write_bw client" || ok=1
  expect "$b" '^capture: [1-9][0-9]* packets captured' "RoCEv2 capture in the guest" || ok=1
  if [ -n "$NETEM" ]; then
    expect "$b" 'qdisc netem' "netem qdisc on B's NIC" || ok=1
  fi
  return $ok
}
