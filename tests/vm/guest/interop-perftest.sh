#!/bin/sh
# Scenario interop-perftest, guest side: stock perftest (Debian's 4.5-0.17) on kernel rxe
# against `rnicctl perf` on the host (10.50.0.1). SERVER, TESTS, ITERS come from env.sh.
# Each run's output: /mnt/host/kernel-<test>.txt and "kernel perftest <test> rc=<n>".
. /mnt/host/common.sh
nic_up 10.50.0.2/24 || exit 1
ibv_devinfo -v -d rxe0 | grep -E 'state|active_mtu|GID\['
dpkg-query -W perftest 2>/dev/null
i=0
for t in $TESTS; do
  port=$((18515 + i))
  # Atomic tests refuse -s (always 8 bytes).
  case $t in atomic-*) sz= ;; *-bw) sz="-s 4096" ;; *) sz="-s 64" ;; esac
  tool=ib_$(echo $t | tr - _)
  out=$S/kernel-$t.txt
  if [ "$SERVER" = kernel ]; then
    timeout 90 $tool -d rxe0 -x 1 -F -p $port $sz -m 1024 -n $ITERS $EXTRA > $out 2>&1
    rc=$?
  else
    # The host's server may not listen yet: retry while the connection is refused.
    for _ in $(seq 1 60); do
      timeout 90 $tool -d rxe0 -x 1 -F -p $port $sz -m 1024 -n $ITERS $EXTRA 10.50.0.1 > $out 2>&1
      rc=$?
      grep -q "Couldn't connect\|Unable to open file descriptor" $out || break
      sleep 1
    done
  fi
  cat $out
  echo "kernel perftest $t rc=$rc"
  [ $rc -eq 0 ] || fail=1
  i=$((i + 1))
done
report
exit $fail
