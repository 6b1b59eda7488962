#!/bin/sh
# Scenario interop-rw, guest side: interop_rw.py (pyverbs on kernel rxe, GID index 1 =
# ::ffff:10.50.0.2) against rnic's examples/interop_rw on the host (10.50.0.1:18600).
. /mnt/host/common.sh
nic_up 10.50.0.2/24 || exit 1
ibv_devinfo -v -d rxe0 | grep -E 'GID\['
step interop_rw timeout 90 python3 $S/interop_rw.py 10.50.0.1 18600 "$RW_LEN" rxe0 1
report
run_extra || fail=1
exit $fail
