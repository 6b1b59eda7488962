# Interop: guest kernel rxe (stock ibv_rc_pingpong, perftest) <-> rnic on an emulated
# ConnectX-5: rnic-mlx5-emu in the host netns behind the tap (10.50.0.1; the guest is
# 10.50.0.2), the rnic tools opened with mlx5:vfio-user:<socket>@10.50.0.1. STEPS
# (default: pingpong and write-bw/read-bw/send-lat, each both ways) is a list of
# "<what>:<server>" (see guest/interop-mlx5.sh); step i uses TCP port 18515 + i, -m 1024,
# -n ITERS (RNIC_MLX5_ITERS, default 100), pingpong -s PP_SIZE (RNIC_MLX5_PP_SIZE, 4096)
# (the guest's tool with -c: it checks every received buffer; rnic's own -c pattern is
# not the stock tool's, so rnic runs without it, as in interop-pingpong). A step "ud" is
# ibv_ud_pingpong (-s UD_SIZE, RNIC_MLX5_UD_SIZE, 1024: a datagram fits the path MTU);
# the stock tool echoes the last payload it received, so rnic's ud_pingpong runs -c (every
# datagram's payload, length and source QP) when it is the client. RNICCTL,
# RNIC_RC_PINGPONG, RNIC_UD_PINGPONG, RNIC_MLX5_EMU: the host binaries (tests/vm.rs builds
# them). rnic runs with -e (the function's event queue).
# Results: capture.pcap (tap), emu.log (the emulator: one "icrc: …" line per driver
# session; a client's retries while the guest boots are sessions without traffic), rnic-<i>-<what>.log, share/kernel-<i>-<what>.txt.
#
# RNIC_MLX5_WIRE=eth (issue 27): no host UDP socket carries RoCE. The emulator's port is an
# Ethernet cable (`--wire dgram`, QEMU's -netdev dgram protocol) plugged into the guest's
# second NIC (10.51.0.2, fd51::2, kernel rxe on it); the tap carries only the tools' TCP
# exchange. rnic opens the function with neigh=arp: its port answers ARP/ND for
# 10.51.0.1 / fd51::1 and resolves the guest by ARP/ND. A step "<what>6" runs over IPv6.
# Before the steps, `rnicctl neigh --resolve` must find the guest's MAC (neigh4.json,
# neigh6.json); after them the guest prints its `ip neigh` (the function's MAC).
SCENARIO_TIMEOUT=400
NS=rnicvm-$ID TAP=rnvtap0
WIRE=${RNIC_MLX5_WIRE:-udp}
FN_MAC=02:00:00:51:00:01
STEPS=${RNIC_MLX5_STEPS:-pp:kernel pp:rnic write-bw:kernel read-bw:kernel send-lat:kernel write-bw:rnic read-bw:rnic send-lat:rnic}
ITERS=${RNIC_MLX5_ITERS:-100}
PP_SIZE=${RNIC_MLX5_PP_SIZE:-4096}
UD_SIZE=${RNIC_MLX5_UD_SIZE:-1024}

scenario_prepare() {
  local b
  for b in RNICCTL RNIC_RC_PINGPONG RNIC_UD_PINGPONG RNIC_MLX5_EMU; do
    [ -x "${!b:-}" ] || { say "$b is not an executable: '${!b:-}'"; return 1; }
  done
  printf 'STEPS="%s"\nITERS=%s\nPP_SIZE=%s\nUD_SIZE=%s\nWIRE=%s\n' "$STEPS" "$ITERS" "$PP_SIZE" \
    "$UD_SIZE" "$WIRE" >> "$SHARE/env.sh"
  # Under loss the stock pingpong's missing closing handshake can strand the side that
  # finishes last (see linger_destroy_qp.c): the guest's tool keeps its QP a second.
  if [ -n "$NETEM" ]; then
    gcc -shared -fPIC -O2 -Wall -o "$SHARE/linger_destroy_qp.so" "$HERE/linger_destroy_qp.c" -ldl || return 1
    printf 'PRELOAD=/mnt/host/linger_destroy_qp.so\n' >> "$SHARE/env.sh"
  fi
}

# rnic_step <i> <what> <server>: one rnic run on the emulated function in the netns; a
# client retries while the guest's server is not listening yet.
rnic_step() {
  local i=$1 what=$2 server=$3 port=$((18515 + $1)) log=$RESULTS/rnic-$1-$2.log rc
  local spec=mlx5:vfio-user:$RUN/emu.sock@10.50.0.1 peer=() size tool=${2%6}
  if [ "$WIRE" = eth ]; then
    case $what in *6) spec="mlx5:vfio-user:$RUN/emu.sock@fd51::1?neigh=arp" ;;
      *) spec="mlx5:vfio-user:$RUN/emu.sock@10.51.0.1?neigh=arp" ;; esac
  fi
  [ "$server" = kernel ] && peer=(10.50.0.2)
  for _ in $(seq 1 60); do
    rc=0
    if [ "$tool" = pp ]; then
      ip netns exec "$NS" timeout -k 5 90 "$RNIC_RC_PINGPONG" -d "$spec" -g 0 -e \
        -p "$port" -s "$PP_SIZE" -m 1024 -n "$ITERS" "${peer[@]}" > "$log" 2>&1 < /dev/null || rc=$?
    elif [ "$tool" = ud ]; then
      ip netns exec "$NS" timeout -k 5 90 "$RNIC_UD_PINGPONG" -d "$spec" -g 0 -e \
        -p "$port" -s "$UD_SIZE" -n "$ITERS" ${peer:+-c} "${peer[@]}" > "$log" 2>&1 < /dev/null || rc=$?
    else
      case $tool in *-bw) size=4096 ;; *) size=64 ;; esac
      ip netns exec "$NS" timeout -k 5 90 "$RNICCTL" perf "$tool" -d "$spec" -x 0 -e \
        -p "$port" -s "$size" -m 1024 -n "$ITERS" "${peer[@]}" > "$log" 2>&1 < /dev/null || rc=$?
    fi
    [ "$rc" -ne 0 ] && [ ${#peer[@]} -gt 0 ] &&
      not_listening "$log" || break
    sleep 1
  done
  echo "rc=$rc" >> "$log"
  say "rnic (mlx5) $what ($server server): rc=$rc"
  return "$rc"
}

# neigh_check <fn ip> <guest ip> <file>: `rnicctl neigh` resolves the guest by ARP/ND from
# a fresh driver session (retried while the guest boots); its JSON in <file>.
neigh_check() {
  local spec="mlx5:vfio-user:$RUN/emu.sock@$1?neigh=arp" rc=1
  for _ in $(seq 1 60); do
    ip netns exec "$NS" timeout -k 5 30 "$RNICCTL" neigh "$spec" --resolve "$2" --wait 1 --json \
      > "$3" 2> "$3.err" < /dev/null && { rc=0; break; }
    sleep 1
  done
  say "rnicctl neigh $2 from $1: rc=$rc $(cat "$3")"
  return $rc
}

scenario_main() {
  interop_net_up
  local emu_args=() guest_args=()
  if [ "$WIRE" = eth ]; then
    # Two UDP ports of the scenario's netns: the emulator's end and the guest NIC's end.
    emu_args=(--wire "dgram:local=127.0.0.1:24791,remote=127.0.0.1:24792" --mac "$FN_MAC")
    guest_args=(-netdev "dgram,id=n1,local.type=inet,local.host=127.0.0.1,local.port=24792,remote.type=inet,remote.host=127.0.0.1,remote.port=24791"
      -device virtio-net-pci,netdev=n1,mac=52:54:00:51:00:02)
  fi
  NO_COLOR=1 host_bg emu "$NS" "$RNIC_MLX5_EMU" --socket "$RUN/emu.sock" --boot-delay-ms 10 "${emu_args[@]}"
  local emu=$BG_PID
  for _ in $(seq 1 100); do [ -S "$RUN/emu.sock" ] && break; sleep 0.1; done
  [ -S "$RUN/emu.sock" ] || { say "rnic-mlx5-emu did not listen on $RUN/emu.sock"; return 1; }
  interop_guest_start interop-mlx5 "${guest_args[@]}"
  local ok=0 i=0 step
  if [ "$WIRE" = eth ]; then
    neigh_check 10.51.0.1 10.51.0.2 "$RESULTS/neigh4.json" || ok=1
    neigh_check fd51::1 fd51::2 "$RESULTS/neigh6.json" || ok=1
  fi
  for step in $STEPS; do
    rnic_step "$i" "${step%%:*}" "${step#*:}" || ok=1
    i=$((i + 1))
  done
  vm_wait interop-mlx5 || ok=1
  kill -TERM "$emu" 2>/dev/null; wait "$emu" 2>/dev/null || true
  interop_capture_stop
  guest_ok interop-mlx5 && return "$ok"
}

scenario_check() {
  local ok=0 i=0 step
  for step in $STEPS; do
    expect "$RESULTS/rnic-$i-${step%%:*}.log" '^rc=0' "rnic (mlx5) $step exit 0" || ok=1
    expect "$SHARE/interop-mlx5.out" "^kernel ${step%%:*}@${step#*:} rc=0" "kernel $step exit 0" || ok=1
    i=$((i + 1))
  done
  if [ "$WIRE" = eth ]; then
    expect "$RESULTS/neigh4.json" '"mac":"52:54:00:51:00:02"' "rnicctl neigh resolved the guest by ARP" || ok=1
    expect "$RESULTS/neigh6.json" '"mac":"52:54:00:51:00:02"' "rnicctl neigh resolved the guest by ND" || ok=1
    expect "$SHARE/interop-mlx5.out" "^NEIGH 10.51.0.1 .*lladdr $FN_MAC" "the guest's ip neigh has the function's MAC (IPv4)" || ok=1
    case " $STEPS " in *6:*)
      expect "$SHARE/interop-mlx5.out" "^NEIGH fd51::1 .*lladdr $FN_MAC" "the guest's ip neigh has the function's MAC (IPv6)" || ok=1 ;;
    esac
  else
    expect "$RESULTS/emu.log" 'icrc: [1-9]' "emulator verified kernel packets" || ok=1
    expect "$RESULTS/capture.log" '^[1-9][0-9]* packets captured' "tap capture has RoCEv2 packets" || ok=1
  fi
  return $ok
}
