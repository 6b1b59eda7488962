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
  "${pre[@]}" timeout -k 5 "$((TIMEOUT + BOOT_SLACK))" "$@" > "$RESULTS/$name.log" 2>&1 < /dev/null &
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

# Boots. Under TCG a guest kernel now and then dies or stalls in early boot, before any of
# the scenario's code ran (seen: an int3 oops in sched_clock_cpu and a panic at 2.7 s; a
# silent stall right after the firmware's "Booting from ROM..."). So a guest must print
# /init's first line ("HARNESS: init reached") within RNIC_VM_BOOT_WAIT seconds (default
# 90; boot to /init takes 7-28 s here). A boot whose kernel panics, whose qemu exits, or
# that stays silent past that before /init is killed and the guest booted again, up to
# RNIC_VM_BOOT_TRIES boots in all (default 2); its console is kept as
# console-<role>-boot<n>.log, and the seconds it cost are added to the scenario's deadline
# ($RUN/lost, read by run-scenario's watchdog). Nothing after /init is retried: a failure
# there is the scenario's. RNIC_VM_BOOT_FAULT="<fault> ..." makes boot 1, 2, ... fail on
# purpose, to test this: panic (no init to run, so the kernel panics) or hang (vCPUs
# stopped, so the console stays silent).
BOOT_WAIT=${RNIC_VM_BOOT_WAIT:-90}
BOOT_TRIES=${RNIC_VM_BOOT_TRIES:-2}
for v in BOOT_WAIT BOOT_TRIES; do
  [[ ${!v} =~ ^[1-9][0-9]{0,3}$ ]] ||
    { echo "RNIC_VM_$v must be a whole number from 1 to 9999, got '${!v}'" >&2; exit 2; }
done
# The most failed boots can add to a scenario: the backstop timeouts of qemu and helpers.
BOOT_SLACK=$(((BOOT_TRIES - 1) * (BOOT_WAIT + 10)))
read -ra BOOT_FAULTS <<< "${RNIC_VM_BOOT_FAULT:-}"
for f in "${BOOT_FAULTS[@]}"; do
  case $f in panic|hang) ;; *) echo "RNIC_VM_BOOT_FAULT: unknown fault '$f' (panic or hang)" >&2; exit 2 ;; esac
done

# vm_start <role> [qemu args...]: boots a guest that runs share/<role>.sh, in the background,
# under `timeout`, and returns once it reached /init; boots it again after a boot that failed
# before (see above), and fails when all RNIC_VM_BOOT_TRIES boots did. Env: VM_NETNS (run qemu
# inside that netns), VM_SMP, VM_MEM, VM_APPEND, VM_MACHINE (extra machine/NUMA args are just
# qemu args). Console: $RESULTS/console-<role>.log.
declare -A VM_PID
vm_start() {
  local role=$1; shift
  local pre=() console=$RESULTS/console-$role.log try t0 why rc lost
  [ -z "${VM_NETNS:-}" ] || pre=(ip netns exec "$VM_NETNS")
  for ((try = 1; try <= BOOT_TRIES; try++)); do
    local fault=${BOOT_FAULTS[try - 1]:-} append=${VM_APPEND:-} stop=()
    case $fault in
      panic) append+=" rdinit=/rnic-boot-fault" ;;
      hang) stop=(-S) ;;
    esac
    t0=$SECONDS
    "${pre[@]}" timeout -k 5 "$((TIMEOUT + BOOT_SLACK))" qemu-system-x86_64 \
      -name "rnicvm-$ID-$role" -pidfile "$RUN/qemu-$role.pid" \
      -accel "${RNIC_VM_ACCEL:-tcg,thread=multi}" -cpu max \
      -smp "${VM_SMP:-2}" -m "${VM_MEM:-2048}" -nographic -no-reboot -nic none \
      -kernel "$GUEST/vmlinuz" -initrd "$GUEST/rootfs.cpio.zst" \
      -append "console=ttyS0 quiet panic=-1 rnic.role=$role $append" \
      -virtfs "local,path=$SHARE,mount_tag=host,security_model=none,id=host" \
      "${stop[@]}" "$@" > "$console" 2>&1 < /dev/null &
    VM_PID[$role]=$!
    track "$!"
    say "guest $role started (pid ${VM_PID[$role]}, boot $try of $BOOT_TRIES${fault:+, fault '$fault' injected})"
    why=$(boot_watch "${VM_PID[$role]}" "$console")
    if [ -z "$why" ]; then
      say "guest $role reached /init $((SECONDS - t0))s after its start"
      return 0
    fi
    kill -TERM "${VM_PID[$role]}" 2>/dev/null || true
    rc=0; wait "${VM_PID[$role]}" 2>/dev/null || rc=$?
    mv "$console" "$RESULTS/console-$role-boot$try.log"
    lost=$((SECONDS - t0))
    echo "$lost" >> "$RUN/lost"
    say "guest $role: boot $try of $BOOT_TRIES failed before /init after ${lost}s: $why (qemu exit $rc; console-$role-boot$try.log)"
    # A guest that powers off or panics makes qemu exit 0 (-no-reboot); a non-zero exit
    # of its own accord is qemu refusing its arguments, which another boot would repeat.
    if [[ $why == "qemu exited"* ]] && [ "$rc" -ne 0 ]; then
      say "guest $role did not boot: qemu itself failed (exit $rc), so it is not booted again"
      return 1
    fi
  done
  say "guest $role did not boot: none of its $BOOT_TRIES boot(s) reached /init (RNIC_VM_BOOT_TRIES)"
  return 1
}

# running <pid>: the process exists and has not exited (a child that exited stays a zombie,
# which `kill -0` still finds, until its parent waits for it).
running() {
  local st
  st=$(ps -o stat= -p "$1" 2>/dev/null) || return 1
  [ -n "$st" ] && [ "${st#Z}" = "$st" ]
}

# boot_watch <qemu pid> <console>: waits until the guest whose console is <console> reached
# /init (prints nothing) or its boot failed (prints why).
boot_watch() {
  local pid=$1 console=$2 end=$((SECONDS + BOOT_WAIT)) line
  while :; do
    grep -q 'HARNESS: init reached' "$console" 2>/dev/null && return 0
    line=$(grep -a -m1 -o 'Kernel panic.*' "$console" 2>/dev/null | tr -d '\r') || true
    [ -z "$line" ] || { echo "kernel panic ($line)"; return 0; }
    if ! running "$pid"; then
      line=$(tr -d '\r' < "$console" | grep -a . | tail -n 1 | cut -c1-160) || true
      echo "qemu exited (last console line: '$line')"; return 0
    fi
    [ "$SECONDS" -lt "$end" ] || { echo "no /init within ${BOOT_WAIT}s (RNIC_VM_BOOT_WAIT)"; return 0; }
    sleep 0.2
  done
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
