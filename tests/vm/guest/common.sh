# Sourced by the guest scripts (POSIX sh: dash in the guest). Settings come from the
# host in /mnt/host/env.sh (NETEM=...).
. /mnt/host/env.sh
S=/mnt/host
# Every guest's output names the kernel it booted (tests/vm.rs checks it where it matters).
echo "kernel: $(uname -r)"

# nic_up <ip/prefix>: the first NIC gets the address, netem (if any) and a kernel rxe device rxe0.
nic_up() {
  modprobe virtio_net && modprobe rdma_rxe && modprobe ib_uverbs || return 1
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    NIC=$(ls /sys/class/net | grep -v -E '^(lo|sit|tunl|ip6tnl)' | head -1)
    [ -n "$NIC" ] && break; sleep 0.5
  done
  [ -n "$NIC" ] || { echo "no NIC"; return 1; }
  ip addr add "$1" dev "$NIC" && ip link set "$NIC" up || return 1
  if [ -n "$NETEM" ]; then
    modprobe sch_netem && tc qdisc add dev "$NIC" root netem $NETEM || return 1
    echo "netem on $NIC: $(tc qdisc show dev "$NIC")"
  fi
  rdma link add rxe0 type rxe netdev "$NIC" || return 1
  export NIC
  echo "NIC $NIC ${1}: $(rdma link show rxe0/1)"
}

# capture_start <file>: tcpdump of RoCEv2 (udp/4791) on the NIC into the share.
capture_start() {
  tcpdump -i "$NIC" -n -U -c "${CAPTURE_MAX:-3000}" -w "$S/$1" udp port 4791 2>/tmp/tcpdump.err &
  TCPDUMP=$!
  sleep 1
}
capture_stop() {
  kill -INT "$TCPDUMP" 2>/dev/null; wait "$TCPDUMP" 2>/dev/null
  echo "capture: $(grep -E 'captured|dropped by kernel' /tmp/tcpdump.err | paste -sd, -)"
}

# step <name> <command...>: runs one step, prints "<name> rc=N", remembers a failure in $fail.
fail=0
step() { _n=$1; shift; "$@"; _rc=$?; echo "$_n rc=$_rc"; [ $_rc -eq 0 ] || fail=1; }

# retry <command...>: the peer guest may not be listening yet.
retry() { for _ in $(seq 1 30); do "$@" && return 0; sleep 1; done; return 1; }

# report: counters and qdisc statistics at the end of a scenario.
report() {
  echo "--- rdma statistic rxe0 ---"; rdma statistic show link rxe0/1 | tr ' ' '\n' | paste -sd' '
  echo "--- tc -s qdisc dev $NIC ---"; tc -s qdisc show dev "$NIC"
}

# run_extra: a command the host passed with run-scenario --exec (e.g. an rnic binary from the share).
run_extra() {
  [ -f "$S/extra.sh" ] || return 0
  echo "--- extra: $(cat "$S/extra.sh") ---"
  (cd "$S" && sh ./extra.sh); rc=$?
  echo "EXTRA: rc=$rc"
  return $rc
}
