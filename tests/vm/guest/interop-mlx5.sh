#!/bin/sh
# Scenario interop-mlx5, guest side: stock ibv_rc_pingpong and perftest on kernel rxe
# against rnic on an emulated mlx5 function (rnic-mlx5-emu) at 10.50.0.1. STEPS, ITERS,
# PP_SIZE come from env.sh: "<what>:<server>" with <what> pp (ibv_rc_pingpong -c) or a
# perftest test (write-bw, read-bw, send-lat, …) and <server> kernel or rnic; step i uses
# TCP port 18515 + i. Each step's output: /mnt/host/kernel-<i>-<what>.txt and
# "kernel <what>@<server> rc=<n>".
. /mnt/host/common.sh
nic_up 10.50.0.2/24 || exit 1
ibv_devinfo -v -d rxe0 | grep -E 'state|active_mtu|GID\['
i=0
for step in $STEPS; do
  what=${step%%:*} server=${step#*:}
  port=$((18515 + i))
  out=$S/kernel-$i-$what.txt
  peer=
  [ "$server" = kernel ] || peer=10.50.0.1
  pre=   # linger_destroy_qp.so (netem) is for the stock pingpong only
  case $what in
    pp) pre=${PRELOAD:-}; cmd="ibv_rc_pingpong -d rxe0 -g 1 -p $port -s $PP_SIZE -m 1024 -n $ITERS -c" ;;
    *-bw) cmd="ib_$(echo $what | tr - _) -d rxe0 -x 1 -F -p $port -s 4096 -m 1024 -n $ITERS" ;;
    *) cmd="ib_$(echo $what | tr - _) -d rxe0 -x 1 -F -p $port -s 64 -m 1024 -n $ITERS" ;;
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
  [ $rc -eq 0 ] || fail=1
  i=$((i + 1))
done
report
exit $fail
