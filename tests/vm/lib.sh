# Helpers for tests/vm/scenarios/*.sh, sourced by run-scenario (bash).
# Everything started here is recorded under $RUN so that teardown can kill it by PID and
# remove its namespaces even when the scenario fails, hangs or is interrupted.
# Names: network namespaces rnicvm-<id>, taps rnvtap<n> (inside those namespaces),
# qemu -name rnicvm-<id>-<role>; <id> is run-scenario's PID.

say() { echo "[$(date +%T)] $*" | tee -a "$LOG"; }

# track <pid>: teardown kills it (and its process group) if it is still alive.
track() { echo "$1" >> "$RUN/pids"; }

# netns_add <name>: a private network namespace with lo up.
netns_add() {
  echo "$1" >> "$RUN/netns"
  ip netns add "$1"
  ip -n "$1" link set lo up
}

# tap_add <netns> <tap> <cidr>: a tap device inside <netns>, address assigned, up.
tap_add() {
  ip -n "$1" tuntap add "$2" mode tap
  ip -n "$1" addr add "$3" dev "$2"
  ip -n "$1" link set "$2" up
}

# host_bg <name> <netns|-> <command...>: runs a host-side helper in the background under
# the scenario timeout, output to $RESULTS/<name>.log. Sets BG_PID.
host_bg() {
  local name=$1 ns=$2; shift 2
  local pre=()
  [ "$ns" = - ] || pre=(ip netns exec "$ns")
  "${pre[@]}" timeout -k 5 "$TIMEOUT" "$@" > "$RESULTS/$name.log" 2>&1 < /dev/null &
  BG_PID=$!
  track "$BG_PID"
}

# wait_listen <netns> <port>: until something listens on TCP/<port> in <netns> (max 20 s).
wait_listen() {
  for _ in $(seq 1 100); do
    ip netns exec "$1" ss -Hltn "sport = :$2" | grep -q . && return 0
    sleep 0.2
  done
  say "nothing listens on port $2 in netns $1"; return 1
}

# vm_start <role> [qemu args...]: boots a guest that runs share/<role>.sh, in the background,
# under `timeout`. Env: VM_NETNS (run qemu inside that netns), VM_SMP, VM_MEM, VM_APPEND,
# VM_MACHINE (extra machine/NUMA args are just qemu args). Console: $RESULTS/console-<role>.log.
declare -A VM_PID
vm_start() {
  local role=$1; shift
  local pre=()
  [ -z "${VM_NETNS:-}" ] || pre=(ip netns exec "$VM_NETNS")
  "${pre[@]}" timeout -k 5 "$TIMEOUT" qemu-system-x86_64 \
    -name "rnicvm-$ID-$role" -pidfile "$RUN/qemu-$role.pid" \
    -accel "${RNIC_VM_ACCEL:-tcg,thread=multi}" -cpu max \
    -smp "${VM_SMP:-2}" -m "${VM_MEM:-2048}" -nographic -no-reboot -nic none \
    -kernel "$GUEST/vmlinuz" -initrd "$GUEST/rootfs.cpio.zst" \
    -append "console=ttyS0 quiet panic=-1 rnic.role=$role ${VM_APPEND:-}" \
    -virtfs "local,path=$SHARE,mount_tag=host,security_model=none,id=host" \
    "$@" > "$RESULTS/console-$role.log" 2>&1 < /dev/null &
  VM_PID[$role]=$!
  track "$!"
  say "guest $role started (pid ${VM_PID[$role]})"
}

# vm_wait <role>: waits for the guest to power off; fails unless qemu exited 0.
vm_wait() {
  local rc=0
  wait "${VM_PID[$1]}" || rc=$?
  [ -f "$RUN/qemu-$1.pid" ] && track "$(cat "$RUN/qemu-$1.pid")"
  case $rc in
    0) say "guest $1 powered off" ;;
    124|137) say "guest $1: qemu killed by timeout after ${TIMEOUT}s" ;;
    *) say "guest $1: qemu exited $rc (see console-$1.log)" ;;
  esac
  return "$rc"
}

# guest_ok <role>: the guest script ran to the end and exited 0.
guest_ok() { grep -q '^HARNESS: script exit 0$' "$SHARE/$1.out" 2>/dev/null; }

# not_listening <log>: the client in <log> failed only because the guest's server was not
# accepting yet (refused, unreachable, or Rust's "no error set after POLLHUP" when the RST
# races the poll), so the caller may retry.
not_listening() {
  grep -q "cannot connect to\|Connection refused\|couldn't connect\|No route\|unreachable" "$1"
}

# The interop layout: rnic in host netns $NS on tap $TAP (10.50.0.1/24, IPv6 off so the
# GID table is the IPv4 GID alone), the guest behind it at 10.50.0.2, RoCEv2 captured
# on the tap into $RESULTS/capture.pcap.
# interop_net_up: the netns, the tap and the capture (sets CAP_PID).
interop_net_up() {
  netns_add "$NS"
  tap_add "$NS" "$TAP" 10.50.0.1/24
  ip netns exec "$NS" sysctl -qw "net.ipv6.conf.$TAP.disable_ipv6=1"
  host_bg capture "$NS" tcpdump -i "$TAP" -n -U -s 0 -w "$RESULTS/capture.pcap" udp port 4791
  CAP_PID=$BG_PID
}

# interop_guest_start <scenario> [qemu args...]: boot the guest on the tap (and whatever
# else the extra qemu args plug in).
interop_guest_start() {
  local role=$1; shift
  VM_NETNS=$NS vm_start "$role" \
    -netdev "tap,id=n0,ifname=$TAP,script=no,downscript=no" \
    -device virtio-net-pci,netdev=n0,mac=52:54:00:50:00:02 "$@"
}

# interop_capture_stop: flush and stop the tap capture, log its packet count.
interop_capture_stop() {
  sleep 1; kill -INT "$CAP_PID"; wait "$CAP_PID" || true
  say "host capture: $(grep -E 'captured' "$RESULTS/capture.log")"
}

# teardown: kill what we started, remove namespaces. Idempotent, never fails.
teardown() {
  [ -z "${TORN_DOWN:-}" ] || return 0
  TORN_DOWN=1
  [ -z "${WATCHDOG:-}" ] || kill "$WATCHDOG" 2>/dev/null || true
  [ -z "${BODY:-}" ] || kill -TERM -- "-$BODY" 2>/dev/null || true
  local f pids=()
  for f in "$RUN"/qemu-*.pid; do [ -f "$f" ] && pids+=("$(cat "$f")"); done
  [ -f "$RUN/pids" ] && mapfile -t -O "${#pids[@]}" pids < "$RUN/pids"
  local p alive
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for _ in $(seq 1 50); do
    alive=()
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive+=("$p"); done
    [ ${#alive[@]} -eq 0 ] && break
    sleep 0.1
  done
  for p in "${alive[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  local ns
  if [ -f "$RUN/netns" ]; then
    while read -r ns; do
      for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
      ip netns del "$ns" 2>/dev/null || true
    done < "$RUN/netns"
  fi
}

# expect <file> <extended regex> <what>: a check for scenario_check; reports what is missing.
expect() {
  if grep -Eq -- "$2" "$1" 2>/dev/null; then say "check ok: $3"
  else say "CHECK FAILED: $3 (no /$2/ in $(basename "$1"))"; return 1; fi
}
