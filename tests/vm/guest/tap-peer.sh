#!/bin/sh
# Scenario tap-peer, guest side: kernel rxe on the virtio NIC sends RoCEv2 to the host's peer
# (10.50.0.1, in a host netns behind the tap). The stand-in peer never ACKs, so
# ibv_rc_pingpong ends with a retry-exceeded error; what matters is the packets it sent.
. /mnt/host/common.sh
nic_up 10.50.0.2/24 || exit 1
ibv_devinfo -d rxe0 | grep -E 'state|active_mtu|link_layer'
echo "gid[1] = $(cat /sys/class/infiniband/rxe0/ports/1/gids/1)"
timeout 8 ibv_rc_pingpong -d rxe0 -g 1 -n 5 10.50.0.1
echo "rc_pingpong rc=$? (a non-zero rc is expected: the peer never ACKs)"
report
sent=$(rdma statistic show link rxe0/1 | tr ' ' '\n' | grep -A1 '^sent_pkts$' | tail -1)
echo "rxe sent_pkts=$sent"
run_extra || exit 1
[ "${sent:-0}" -gt 0 ]
