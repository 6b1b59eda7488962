#!/usr/bin/env bash
# ab.sh -- A/B of two rnicctl builds on this machine, same run, alternating:
# 8 B WRITE one-way latency (write-lat, busy poll) and 1 MiB WRITE bandwidth
# (write-bw, busy poll) between rxe:127.0.0.1 and rxe:127.0.0.2, as
# bench/compare.sh runs them. Prints one CSV line per run and the medians.
#
# Usage: bash bench/ab.sh <rnicctl A> <rnicctl B> [REPS=7] [LAT_N=20000] [DUR=3]
# With AB_C=<rnicctl C> in the environment a third build joins, and the order
# rotates (A B C, B C A, C A B) so each build runs in each place equally often.
set -u
A=$1; B=$2; REPS=${3:-7}; LAT_N=${4:-20000}; DUR=${5:-3}; C=${AB_C:-}
port=19500
one() { # bin test size extra... -> prints the metric
  local bin=$1 t=$2 s=$3; shift 3
  port=$((port + 1))
  "$bin" perf "$t" -d rxe:127.0.0.1 -s "$s" -p $port --json "$@" > /tmp/ab_srv.$$ 2>&1 &
  local srv=$!
  sleep 0.3
  local out
  out=$(timeout 60 "$bin" perf "$t" -d rxe:127.0.0.2 -s "$s" -p $port --json "$@" 127.0.0.1 2>&1)
  wait $srv 2> /dev/null
  python3 -c '
import json,sys
t=sys.stdin.read()
try:
    r=json.loads(t[t.index("{"):t.rindex("}")+1])["results"][0]
    print(r["t_avg_us"] if "t_avg_us" in r else r["bw_average"])
except Exception as e:
    print("ERR", e, t[-300:].replace("\n"," "))' <<< "$out"
}
echo "rep,build,test,value"
for rep in $(seq 1 "$REPS"); do
  if [ -n "$C" ]; then
    case $((rep % 3)) in 1) order="A B C" ;; 2) order="B C A" ;; *) order="C A B" ;; esac
  elif [ $((rep % 2)) = 1 ]; then order="A B"; else order="B A"; fi
  for w in $order; do
    case $w in A) bin=$A ;; B) bin=$B ;; *) bin=$C ;; esac
    echo "$rep,$w,write-lat-8B-us,$(one "$bin" write-lat 8 -n "$LAT_N")"
    echo "$rep,$w,write-bw-1MiB,$(one "$bin" write-bw 1048576 -D "$DUR")"
  done
done
