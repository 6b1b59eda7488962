#!/bin/bash
# pairs.sh -- rnic-rxe against UCX's strongest tcp modes in alternating pairs,
# the comparison that holds on this bimodal 2-vCPU VM (a QUICK compare.sh
# point is 5 one-second runs, and its medians swing 1.6x between two runs
# minutes apart).
#
#   bash bench/pairs.sh [PAIRS] [RNICCTL]      (default 10, target/release/rnicctl)
#   ONLY=bw | ONLY=lat   one of the two tests;  RING=0   no packet-ring rows
#
# Each pair runs, back to back: rnic `perf write-bw` 1 MiB for 3 s (busy
# poll, two processes) and UCX `tag_bw` 1 MiB for ~3 s; then the same for
# 8-byte latency (rnic `write-lat`, UCX `tag_lat`, 40 000 iterations each);
# the latency pair also runs rnic with its packet-ring receive path
# (RNIC_RXE_RX_RING=1: root, Linux 6.2+) twice against the same UCX run:
# row `lat_ring_us` with frame transmit off (RNIC_RXE_TX_FRAMES=0), row
# `lat_frames_us` with it on — for that run only, lo's accept_local and
# route_localnet are set to 1 (restored after, also on interrupt), without
# which a frame looped back on lo is a martian (rnic_rxe::frames). Latency is each run's typical (median) one-way time, rnic's
# `t_typical` against UCX's `typical`: a mean also counts the time slices a
# spinning process loses to other work. Under load, `nice -n -19 bash bench/pairs.sh` keeps other
# work from taking the CPUs (not chrt: UCX's tcp transport starves under
# SCHED_FIFO).
# Prints every pair and, per test, both medians and the median of the pair
# ratios rnic / UCX (bandwidth > 1 and latency < 1: rnic ahead).
set -u
P=${1:-10}
B=${2:-$PWD/target/release/rnicctl}
[ -x "$B" ] || { echo "no rnicctl at $B: cargo build --release -p rnicctl"; exit 1; }
command -v ucx_perftest > /dev/null || { echo "ucx_perftest missing: apt-get install ucx-utils"; exit 1; }
export UCX_TLS=tcp UCX_NET_DEVICES=lo
out=$(mktemp)
bash "$(dirname "$0")/cpu.sh" "$B"
ONLY=${ONLY:-}
[ "$ONLY" = lat ] || for i in $(seq 1 "$P"); do
  "$B" perf write-bw -d rxe:127.0.0.1 -s 1048576 -D 3 -p 18680 > /dev/null 2>&1 & sleep 0.4
  r=$("$B" perf write-bw -d rxe:127.0.0.2 -s 1048576 -D 3 -p 18680 127.0.0.1 2>&1 | awk '$1==1048576{print $4*1.048576/1000}'); wait
  ucx_perftest -p 13995 > /dev/null 2>&1 & sleep 0.5
  u=$(ucx_perftest 127.0.0.1 -p 13995 -t tag_bw -s 1048576 -n 12000 -w 600 2>&1 | awk '/Final/{print $7*1.048576/1000}'); wait
  echo "bw_GB/s $r $u" | tee -a "$out"
done
# lo's two sysctls as found, restored on exit.
LO=/proc/sys/net/ipv4/conf/lo
old_al=$(cat $LO/accept_local) old_rl=$(cat $LO/route_localnet)
restore_lo() { echo "$old_al" > $LO/accept_local; echo "$old_rl" > $LO/route_localnet; } 2> /dev/null
trap 'restore_lo; rm -f "$out"' EXIT
# One rnic write-lat run (server and client); $1: RNIC_RXE_RX_RING, $2:
# RNIC_RXE_TX_FRAMES (1: lo's sysctls set for the run).
rnic_lat() {
  local log
  log=$(mktemp)
  if [ "$2" = 1 ]; then echo 1 > $LO/accept_local && echo 1 > $LO/route_localnet || return; fi
  export RNIC_RXE_RX_RING=$1 RNIC_RXE_TX_FRAMES=$2
  "$B" perf write-lat -d rxe:127.0.0.1 -s 8 -n 40000 -p 18681 > "$log.srv" 2>&1 & sleep 0.4
  "$B" perf write-lat -d rxe:127.0.0.2 -s 8 -n 40000 -p 18681 127.0.0.1 > "$log" 2>&1; wait
  unset RNIC_RXE_RX_RING RNIC_RXE_TX_FRAMES
  restore_lo
  awk '$1==8{print $5}' "$log"
  grep -q '^ *8 ' "$log" || { echo "rnic write-lat (RNIC_RXE_RX_RING=$1 RNIC_RXE_TX_FRAMES=$2) failed:" >&2; tail -3 "$log" "$log.srv" >&2; }
  rm -f "$log" "$log.srv"
}
[ "$ONLY" = bw ] || for i in $(seq 1 "$P"); do
  r=$(rnic_lat 0 0)
  g="" f=""; [ "${RING:-1}" = 1 ] && g=$(rnic_lat 1 0) && f=$(rnic_lat 1 1)
  ucx_perftest -p 13994 > /dev/null 2>&1 & sleep 0.5
  u=$(ucx_perftest 127.0.0.1 -p 13994 -t tag_lat -s 8 -n 40000 2>&1 | awk '/Final/{print $3}'); wait
  echo "lat_us $r $u" | tee -a "$out"
  [ -n "$g" ] && echo "lat_ring_us $g $u" | tee -a "$out"
  [ -n "$f" ] && echo "lat_frames_us $f $u" | tee -a "$out"
done
python3 - "$out" <<'PY'
import statistics as st, sys
d = {}
for l in open(sys.argv[1]):
    f = l.split()
    if len(f) == 3:
        d.setdefault(f[0], []).append((float(f[1]), float(f[2])))
for k, v in d.items():
    print(f"{k}: rnic median {st.median(x[0] for x in v):.3f}, UCX median {st.median(x[1] for x in v):.3f}, "
          f"median pair ratio {st.median(x[0] / x[1] for x in v):.2f} ({len(v)} pairs)")
PY
