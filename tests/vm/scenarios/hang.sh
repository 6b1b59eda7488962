# Scenario hang: a guest behind a tap in a netns that never finishes. It exists to prove
# that a hung scenario is killed at its timeout, reported as TIMEOUT, and leaves nothing behind.
SCENARIO_TIMEOUT=30
NS=rnicvm-$ID TAP=rnvtap0

scenario_main() {
  netns_add "$NS"
  tap_add "$NS" "$TAP" 10.70.0.1/24
  host_bg sleeper "$NS" sleep 100000
  VM_NETNS=$NS vm_start hang \
    -netdev "tap,id=n0,ifname=$TAP,script=no,downscript=no" -device virtio-net-pci,netdev=n0
  vm_wait hang
}

scenario_check() { return 1; }
