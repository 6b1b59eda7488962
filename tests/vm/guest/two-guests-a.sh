#!/bin/sh
# Scenario two-guests, guest A (10.60.0.1): the servers.
. /mnt/host/common.sh
nic_up 10.60.0.1/24 || exit 1
step "A: rc_pingpong" timeout 200 ibv_rc_pingpong -d rxe0 -g 1 -n 100
step "A: ib_write_bw" timeout 200 ib_write_bw -d rxe0 -x 1 -s 65536 -n 200 -F --report_gbits
report
run_extra || exit 1
exit $fail
