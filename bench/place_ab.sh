#!/usr/bin/env bash
# place_ab.sh -- receive placement (RNIC_RXE_RX_PLACE=1) against the copy from
# the receive slot (RNIC_RXE_RX_PLACE=0), same binaries, alternating runs:
#  * read-bw: rnicctl perf read-bw, 1 MiB READs, busy poll, between
#    rxe:127.0.0.1 and rxe:127.0.0.2 (two processes), MB/s (perftest's);
#  * cpu-8 / cpu-2: byte_cost path 1 MiB READs, one thread driving both ends,
#    CPU ns per KiB (user + system), with 8 READ slots (buffers larger than
#    the L2: every byte from and to DRAM) and with 2 (cache-resident).
# Prints one CSV line per run, then the medians and the median of the paired
# placed/copied ratios.
#
# Usage: bash bench/place_ab.sh [REPS=5] [N=2000] [DUR=3]
# Needs: cargo build --release -p rnicctl -p rnic-rxe --example byte_cost
set -u
REPS=${1:-5}; N=${2:-2000}; DUR=${3:-3}
T=${CARGO_TARGET_DIR:-target}/release
port=19700
bw() { # env value -> MB/s
  port=$((port + 1))
  RNIC_RXE_RX_PLACE=$1 "$T/rnicctl" perf read-bw -d rxe:127.0.0.1 -s 1048576 -D "$DUR" -p $port --json > /tmp/place_srv.$$ 2>&1 &
  local srv=$!
  sleep 0.3
  local out
  out=$(RNIC_RXE_RX_PLACE=$1 timeout 60 "$T/rnicctl" perf read-bw -d rxe:127.0.0.2 -s 1048576 -D "$DUR" -p $port --json 127.0.0.1 2>&1)
  wait $srv 2> /dev/null
  python3 -c '
import json,sys
t=sys.stdin.read()
try:
    r=json.loads(t[t.index("{"):t.rindex("}")+1])["results"][0]
    print(r["bw_average"])
except Exception as e:
    print("ERR", e, t[-300:].replace("\n"," "))' <<< "$out"
}
cpu() { # env value, slots -> ns per KiB
  RNIC_RXE_RX_PLACE=$1 RNIC_BYTE_COST_SLOTS=$2 "$T/examples/byte_cost" path 1048576 "$N" owned read |
    sed -n 's/.*per KiB: \([0-9.]*\) ns CPU.*/\1/p'
}
{
echo "rep,placement,test,value"
for rep in $(seq 1 "$REPS"); do
  if [ $((rep % 2)) = 1 ]; then order="0 1"; else order="1 0"; fi
  for p in $order; do
    echo "$rep,$p,read-bw-MBps,$(bw "$p")"
    echo "$rep,$p,cpu-8-ns-per-KiB,$(cpu "$p" 8)"
    echo "$rep,$p,cpu-2-ns-per-KiB,$(cpu "$p" 2)"
  done
done
} | tee /tmp/place_ab.$$.csv
python3 - /tmp/place_ab.$$.csv <<'PY'
import csv, statistics, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if not r["value"].startswith("ERR")]
tests = sorted({r["test"] for r in rows})
print("test, copied (median), placed (median), median of paired placed/copied")
for t in tests:
    v = {p: {int(r["rep"]): float(r["value"]) for r in rows if r["test"] == t and r["placement"] == p} for p in "01"}
    pairs = [v["1"][k] / v["0"][k] for k in v["0"] if k in v["1"] and v["0"][k]]
    print(f'{t}, {statistics.median(v["0"].values()):.3f}, {statistics.median(v["1"].values()):.3f}, {statistics.median(pairs):.3f}')
PY
