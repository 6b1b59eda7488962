#!/bin/sh
# Scenario interop-shared, guest side: two stock ibv_rc_pingpong servers on kernel rxe at
# once (ports 18515: a, 18516: b, both with -c), against two rnic processes that share one
# device on the host (10.50.0.1). SIZE, ITERS come from env.sh.
# Output: /mnt/host/kernel-<a|b>.txt and "kernel rc_pingpong <a|b> rc=<n>".
. /mnt/host/common.sh
nic_up 10.50.0.2/24 || exit 1
ibv_devinfo -v -d rxe0 | grep -E 'state|active_mtu|GID\['
timeout 90 ibv_rc_pingpong -d rxe0 -g 1 -p 18515 -s $SIZE -m 1024 -n $ITERS -c > $S/kernel-a.txt 2>&1 &
pa=$!
timeout 90 ibv_rc_pingpong -d rxe0 -g 1 -p 18516 -s $SIZE -m 1024 -n $ITERS -c > $S/kernel-b.txt 2>&1 &
pb=$!
wait $pa; ra=$?
wait $pb; rb=$?
for t in a b; do cat $S/kernel-$t.txt; done
echo "kernel rc_pingpong a rc=$ra"
echo "kernel rc_pingpong b rc=$rb"
[ $ra -eq 0 ] && [ $rb -eq 0 ] || fail=1
report
exit $fail
