#!/bin/sh
# Scenario interop-mlx5, guest side: stock ibv_rc_pingpong and perftest on kernel rxe
# against rnic on an emulated mlx5 function (rnic-mlx5-emu) at 10.50.0.1. STEPS, ITERS,
# PP_SIZE, UD_SIZE come from env.sh: "<what>:<server>" with <what> pp (ibv_rc_pingpong -c),
# ud (ibv_ud_pingpong) or a perftest test (write-bw, read-bw, send-lat, …) and <server>
# kernel or rnic; step i uses
# TCP port 18515 + i. Each step's output: /mnt/host/kernel-<i>-<what>.txt and
# "kernel <what>@<server> rc=<n>".
. /mnt/host/common.sh
# gid_index <gid>: its index in rxe0's GID table (empty while the kernel has not added it).
gid_index() {
  for f in /sys/class/infiniband/rxe0/ports/1/gids/*; do
    [ "$(cat "$f" 2>/dev/null)" = "$1" ] && { basename "$f"; return; }
  done
}
if [ "${WIRE:-udp}" = eth ]; then
  # The tap NIC carries the tools' TCP; the NIC cabled to the emulated port carries RoCE.
  modprobe virtio_net && modprobe rdma_rxe && modprobe ib_uverbs || exit 1
  for _ in $(seq 1 20); do
    TAPNIC=$(grep -l 52:54:00:50:00:02 /sys/class/net/*/address | cut -d/ -f5)
    NIC=$(grep -l 52:54:00:51:00:02 /sys/class/net/*/address | cut -d/ -f5)
    [ -n "$TAPNIC" ] && [ -n "$NIC" ] && break; sleep 0.5
  done
  [ -n "$NIC" ] || { echo "no NIC cabled to the emulated port"; exit 1; }
  ip addr add 10.50.0.2/24 dev "$TAPNIC" && ip link set "$TAPNIC" up || exit 1
  ip addr add 10.51.0.2/24 dev "$NIC" && ip addr add fd51::2/64 dev "$NIC" nodad &&
    ip link set "$NIC" up || exit 1
  if [ -n "$NETEM" ]; then
    modprobe sch_netem && tc qdisc add dev "$NIC" root netem $NETEM || exit 1
    echo "netem on $NIC: $(tc qdisc show dev "$NIC")"
  fi
  rdma link add rxe0 type rxe netdev "$NIC" || exit 1
  for _ in $(seq 1 20); do
    X4=$(gid_index 0000:0000:0000:0000:0000:ffff:0a33:0002)
    X6=$(gid_index fd51:0000:0000:0000:0000:0000:0000:0002)
    [ -n "$X4" ] && [ -n "$X6" ] && break; sleep 0.5
  done
  echo "NIC $NIC 10.51.0.2 (GID $X4) fd51::2 (GID $X6), tap $TAPNIC 10.50.0.2"
  export NIC
else
  nic_up 10.50.0.2/24 || exit 1
  X4=1
fi
ibv_devinfo -v -d rxe0 | grep -E 'state|active_mtu|GID\['
i=0
for step in $STEPS; do
  what=${step%%:*} server=${step#*:}
  tool=${what%6} x=$X4
  [ "$tool" = "$what" ] || x=$X6
  port=$((18515 + i))
  out=$S/kernel-$i-$what.txt
  peer=
  [ "$server" = kernel ] || peer=10.50.0.1
  pre=   # linger_destroy_qp.so (netem) is for the stock pingpong only
  case $tool in
    pp) pre=${PRELOAD:-}; cmd="ibv_rc_pingpong -d rxe0 -g $x -p $port -s $PP_SIZE -m 1024 -n $ITERS -c" ;;
    ud) cmd="ibv_ud_pingpong -d rxe0 -g $x -p $port -s $UD_SIZE -n $ITERS" ;;
    *-bw) cmd="ib_$(echo $tool | tr - _) -d rxe0 -x $x -F -p $port -s 4096 -m 1024 -n $ITERS" ;;
    *) cmd="ib_$(echo $tool | tr - _) -d rxe0 -x $x -F -p $port -s 64 -m 1024 -n $ITERS" ;;
  esac
  # A client retries while the host's server is not listening yet.
  for _ in $(seq 1 60); do
    LD_PRELOAD=$pre timeout 90 $cmd $peer > $out 2>&1
    rc=$?
    [ -n "$peer" ] && grep -q "Couldn't connect\|Unable to open file descriptor" $out || break
    sleep 1
  done
  cat $out
  echo "kernel $what@$server rc=$rc"
  # What the kernel resolved the function to, while the step's rnic may still hold the
  # port (once no rnic process runs, nothing answers for the function: entries fail).
  [ "${WIRE:-udp}" = eth ] && ip neigh show dev "$NIC" | sed 's/^/NEIGH /'
  [ $rc -eq 0 ] || fail=1
  i=$((i + 1))
done
report
exit $fail
