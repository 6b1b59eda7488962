#!/bin/sh
# Scenario interop-verbs, guest side: the stock tools on kernel rxe against the same stock tools
# on the host running on rnic's drop-in libibverbs (10.50.0.1). STEPS, ITERS come from env.sh.
# Each step's output: /mnt/host/guest-<i>-<tool>.txt and "guest <i> <tool> rc=<n>".
. /mnt/host/common.sh
nic_up 10.50.0.2/24 || exit 1
ibv_devinfo -v -d rxe0 | grep -E 'state|active_mtu|GID\['
i=0
for s in $STEPS; do
  tool=${s%%:*} side=${s##*:} port=$((18515 + i))
  case $tool in
    pp) cmd="ibv_rc_pingpong -d rxe0 -g 1 -c -s 4096 -m 1024 -n $ITERS -p $port" ;;
    *) cmd="ib_$tool -d rxe0 -x 1 -F -m 1024 -n $ITERS -p $port" ;;
  esac
  out=$S/guest-$i-$tool.txt
  if [ "$side" = guest ]; then
    timeout 90 $cmd > $out 2>&1
    rc=$?
  else
    # The host's server may not listen yet: retry while the connection is refused.
    for _ in $(seq 1 60); do
      timeout 90 $cmd 10.50.0.1 > $out 2>&1
      rc=$?
      grep -qi "couldn't connect\|Unable to open file descriptor" $out || break
      sleep 1
    done
  fi
  cat $out
  echo "guest $i $tool rc=$rc"
  [ $rc -eq 0 ] || fail=1
  i=$((i + 1))
done
report
exit $fail
