#!/bin/sh
# Scenario two-guests, guest A (10.60.0.1): the servers.
. /mnt/host/common.sh
nic_up 10.60.0.1/24 || exit 1
# Kernel rxe against kernel rxe under netem loss can stall a session for good (seen once
# in ~30 CI runs: rc_pingpong stopped after 90 of 100 iterations, both sides waiting). No
# rnic code runs here, so a session that stalls is cut at 90 s and both sides start
# another (the server listens again; the client, B, retries). ib_write_bw has its own TCP
# port (18516; rc_pingpong keeps 18515), so a client that retries after its peer moved on
# to the next tool cannot meet that tool's server.
step "A: rc_pingpong" retry timeout 90 ibv_rc_pingpong -d rxe0 -g 1 -n 100
step "A: ib_write_bw" retry timeout 90 ib_write_bw -d rxe0 -x 1 -p 18516 -s 65536 -n 200 -F --report_gbits
report
run_extra || exit 1
exit $fail
