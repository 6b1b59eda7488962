#!/bin/sh
# Scenario two-guests, guest B (10.60.0.2): the clients; captures the RoCEv2 traffic.
. /mnt/host/common.sh
nic_up 10.60.0.2/24 || exit 1
for i in $(seq 1 60); do busybox ping -c1 -W1 10.60.0.1 >/dev/null 2>&1 && break; done
echo "B: A reachable after $i tries"
capture_start two-guests.pcap
# A stalled session is cut at 90 s and tried again, as on A (two-guests-a.sh).
step "B: rc_pingpong" retry timeout 90 ibv_rc_pingpong -d rxe0 -g 1 -n 100 10.60.0.1
sleep 1
step "B: ib_write_bw" retry timeout 90 ib_write_bw -d rxe0 -x 1 -p 18516 -s 65536 -n 200 -F --report_gbits 10.60.0.1
capture_stop
report
run_extra || exit 1
exit $fail
