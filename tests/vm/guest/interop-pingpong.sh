#!/bin/sh
# Scenario interop-pingpong, guest side: the stock ibv_rc_pingpong on kernel rxe against
# rnic's rc_pingpong on the host (10.50.0.1). SERVER, SIZES, ITERS come from env.sh.
# Each run's output: /mnt/host/kernel-<size>.txt and "kernel rc_pingpong size=<s> rc=<n>".
. /mnt/host/common.sh
nic_up 10.50.0.2/24 || exit 1
ibv_devinfo -v -d rxe0 | grep -E 'state|active_mtu|GID\['
i=0
for size in $SIZES; do
  port=$((18515 + i))
  out=$S/kernel-$size.txt
  if [ "$SERVER" = kernel ]; then
    LD_PRELOAD=${PRELOAD:-} timeout 60 ibv_rc_pingpong -d rxe0 -g 1 -p $port -s $size -m 1024 -n $ITERS -c > $out 2>&1
    rc=$?
  else
    # The host's server may not listen yet: retry while the connection is refused.
    for _ in $(seq 1 60); do
      LD_PRELOAD=${PRELOAD:-} timeout 60 ibv_rc_pingpong -d rxe0 -g 1 -p $port -s $size -m 1024 -n $ITERS -c 10.50.0.1 > $out 2>&1
      rc=$?
      grep -q "Couldn't connect" $out || break
      sleep 1
    done
  fi
  cat $out
  echo "kernel rc_pingpong size=$size rc=$rc"
  [ $rc -eq 0 ] || fail=1
  i=$((i + 1))
done
report
exit $fail
