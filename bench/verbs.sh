#!/usr/bin/env bash
# verbs.sh -- what rnic's drop-in libibverbs (verbs/, issue 29) costs against
# native rnic, measured in one run on one host (both ends on the shared rxe
# device of 127.0.0.1, RNIC_DEVICES=rxe:127.0.0.1 for the drop-in; docs/sharing.md):
#
#   write-lat  stock `ib_write_lat -s 8` on the drop-in  vs  `rnicctl perf
#              write-lat -s 8` (native, busy poll). ib_write_lat waits for the
#              peer's write by spinning on memory, outside any verbs call, so
#              the drop-in runs rnic-rxe's progress thread, with the poll
#              handoff (RNIC_VERBS_HANDOFF_US, default 50): after the first
#              message the polls for each write's completion receive the
#              answer, so this row holds the C ABI and the handoff's cost.
#   send-lat   stock `ib_send_lat -s 8` on the drop-in with
#              RNIC_VERBS_PROGRESS=caller  vs  `rnicctl perf send-lat -s 8`:
#              the same progress model on both sides, so the difference is the
#              C ABI (and perftest's own loop).
#   write-bw   stock `ib_write_bw -s 1048576` on the drop-in (client caller-
#              driven, passive server on the progress thread)  vs  `rnicctl
#              perf write-bw -s 1048576`.
#   callgrind  bench/verbs_cost.c (ibv_post_send / the ibv_wr_* API, then
#              ibv_poll_cq, of 8-byte RDMA writes on a loopback RC pair,
#              caller-driven): instructions per request inside the drop-in's
#              post_send (ibv_wr_* calls) / poll_cq, and of them inside rnic's
#              QueuePair::post_send_rest / the driver's poll: the difference is
#              what the C ABI adds per request (for polls also core's credit
#              accounting of shared CQs, which verbs CQs are), independent of
#              machine noise.
#
# Wall-clock rows alternate drop-in and native, REPS times; summary.md has the
# medians and the ratios. Numbers are only worth keeping on a quiet machine.
#
# Usage (root, Debian 12):  bash bench/verbs.sh
#   REPS=5  LAT_ITERS=20000  BW_ITERS=2000  COST_ITERS=2000
#   ONLY="lat bw cost"   OUT=<dir>   SKIP_BUILD=1
set -u
cd "$(dirname "$0")/.."
REPS=${REPS:-5}
LAT_ITERS=${LAT_ITERS:-20000}
BW_ITERS=${BW_ITERS:-2000}
COST_ITERS=${COST_ITERS:-2000}
ONLY=${ONLY:-"lat bw cost"}
OUT=${OUT:-bench/results/$(date -u +%Y%m%d-%H%M%S)-verbs}
mkdir -p "$OUT/logs"
echo "results in $OUT"
verbs/tests/install-deps.sh > "$OUT/install.log" 2>&1 || { echo "install-deps failed: $OUT/install.log"; exit 1; }
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  cargo build --release --locked -p rnicctl > "$OUT/build.log" 2>&1 || { echo "build failed: $OUT/build.log"; exit 1; }
  verbs/install.sh >> "$OUT/build.log" 2>&1 || { echo "build failed: $OUT/build.log"; exit 1; }
fi
RNICCTL=$PWD/target/release/rnicctl
VERBS=$PWD/target/release/verbs
# The drop-in's device on 127.0.0.1 alone, as rnicctl's rxe:127.0.0.1 (rnic_lo would
# also bind ::1, and a caller-driven poll then reads two sockets).
export RNIC_DEVICES=rxe:127.0.0.1
DEV=rnic_127_0_0_1
{ date -u; uname -r; nproc; git rev-parse --short HEAD; uptime; } > "$OUT/env.txt"
echo "group,rep,side,metric,value" > "$OUT/runs.csv"
PORT=19700

# pair <log> <server cmd...> -- <client cmd...>: run a server and its client on
# 127.0.0.1 (the client retries until the server listens).
pair() {
  local log=$1; shift
  local srv=() cli=()
  while [ "$1" != -- ]; do srv+=("$1"); shift; done; shift
  cli=("$@")
  PORT=$((PORT + 1))
  timeout 300 "${srv[@]}" -p $PORT > "$log.server" 2>&1 &
  local spid=$!
  for _ in $(seq 1 100); do
    ss -ltn "sport = :$PORT" | grep -q LISTEN && break
    sleep 0.05
  done
  timeout 300 "${cli[@]}" -p $PORT 127.0.0.1 > "$log" 2>&1
  local rc=$?
  # A caller-driven server (RNIC_VERBS_PROGRESS=caller) can be left waiting
  # for the ACK of its last reply, which the exiting client deferred to a
  # next verbs call that never comes: the client's row is what is kept.
  for _ in $(seq 1 100); do kill -0 $spid 2>/dev/null || break; sleep 0.1; done
  kill $spid 2>/dev/null
  wait $spid 2>/dev/null
  return $rc
}

# row <log> <fields> <column>: the result row of a perftest-format log (a line
# of <fields> numbers whose first is the size), column <column> (1-based).
row() {
  awk -v n="$2" -v c="$3" 'NF == n && $1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ { v = $c } END { if (v != "") print v }' "$1"
}

record() { echo "$1,$2,$3,$4,$5" >> "$OUT/runs.csv"; }

lat_once() {
  local rep=$1 l
  l=$OUT/logs/dropin-write-lat-$rep.log
  pair "$l" env LD_LIBRARY_PATH="$VERBS" ib_write_lat -d $DEV -s 8 -n "$LAT_ITERS" -F -- \
            env LD_LIBRARY_PATH="$VERBS" ib_write_lat -d $DEV -s 8 -n "$LAT_ITERS" -F &&
    record write-lat "$rep" dropin t_typical_us "$(row "$l" 9 5)"
  l=$OUT/logs/native-write-lat-$rep.log
  pair "$l" "$RNICCTL" perf write-lat -d rxe:127.0.0.1 -s 8 -n "$LAT_ITERS" -- \
            "$RNICCTL" perf write-lat -d rxe:127.0.0.1 -s 8 -n "$LAT_ITERS" &&
    record write-lat "$rep" native t_typical_us "$(row "$l" 9 5)"
  # Native with rnic-rxe's progress thread receiving while the program spins
  # on memory (-e), the progress model ib_write_lat forces on the drop-in.
  l=$OUT/logs/native-thread-write-lat-$rep.log
  pair "$l" "$RNICCTL" perf write-lat -e -d rxe:127.0.0.1 -s 8 -n "$LAT_ITERS" -- \
            "$RNICCTL" perf write-lat -e -d rxe:127.0.0.1 -s 8 -n "$LAT_ITERS" &&
    record write-lat-thread "$rep" native t_typical_us "$(row "$l" 9 5)"
  l=$OUT/logs/dropin-send-lat-$rep.log
  pair "$l" env LD_LIBRARY_PATH="$VERBS" RNIC_VERBS_PROGRESS=caller ib_send_lat -d $DEV -s 8 -n "$LAT_ITERS" -F -- \
            env LD_LIBRARY_PATH="$VERBS" RNIC_VERBS_PROGRESS=caller ib_send_lat -d $DEV -s 8 -n "$LAT_ITERS" -F &&
    record send-lat "$rep" dropin t_typical_us "$(row "$l" 9 5)"
  l=$OUT/logs/native-send-lat-$rep.log
  pair "$l" "$RNICCTL" perf send-lat -d rxe:127.0.0.1 -s 8 -n "$LAT_ITERS" -- \
            "$RNICCTL" perf send-lat -d rxe:127.0.0.1 -s 8 -n "$LAT_ITERS" &&
    record send-lat "$rep" native t_typical_us "$(row "$l" 9 5)"
}

bw_once() {
  local rep=$1 l
  l=$OUT/logs/dropin-write-bw-$rep.log
  pair "$l" env LD_LIBRARY_PATH="$VERBS" ib_write_bw -d $DEV -s 1048576 -n "$BW_ITERS" -F -- \
            env LD_LIBRARY_PATH="$VERBS" RNIC_VERBS_PROGRESS=caller ib_write_bw -d $DEV -s 1048576 -n "$BW_ITERS" -F &&
    record write-bw "$rep" dropin bw_avg_MBps "$(row "$l" 5 4)"
  l=$OUT/logs/native-write-bw-$rep.log
  pair "$l" "$RNICCTL" perf write-bw -d rxe:127.0.0.1 -s 1048576 -n "$BW_ITERS" -- \
            "$RNICCTL" perf write-bw -d rxe:127.0.0.1 -s 1048576 -n "$BW_ITERS" &&
    record write-bw "$rep" native bw_avg_MBps "$(row "$l" 5 4)"
  # The same native pair with its server on rnic-rxe's progress thread (-e),
  # as the passive ib_write_bw server must be: what the C ABI costs apart
  # from the progress model.
  l=$OUT/logs/native-thread-write-bw-$rep.log
  pair "$l" "$RNICCTL" perf write-bw -e -d rxe:127.0.0.1 -s 1048576 -n "$BW_ITERS" -- \
            "$RNICCTL" perf write-bw -d rxe:127.0.0.1 -s 1048576 -n "$BW_ITERS" &&
    record write-bw-thread "$rep" native bw_avg_MBps "$(row "$l" 5 4)"
}

for rep in $(seq 1 "$REPS"); do
  case " $ONLY " in *" lat "*) echo "rep $rep: latency"; lat_once "$rep" ;; esac
  case " $ONLY " in *" bw "*) echo "rep $rep: bandwidth"; bw_once "$rep" ;; esac
done

# ---- callgrind: instructions per request in the drop-in and in rnic under it ----
cost_rows=""
if [ -n "$(echo " $ONLY " | grep ' cost ')" ]; then
  gcc -O2 -o "$OUT/verbs_cost" bench/verbs_cost.c -libverbs || exit 1
  for mode in post wr; do
    f=$OUT/callgrind.$mode.out
    LD_LIBRARY_PATH="$VERBS" RNIC_VERBS_PROGRESS=caller RNIC_RXE_SHARE=0 \
      valgrind --tool=callgrind --callgrind-out-file="$f" "$OUT/verbs_cost" "$COST_ITERS" "$mode" "$DEV" \
      > "$OUT/logs/cost-$mode.log" 2>&1 || { echo "callgrind $mode failed: $OUT/logs/cost-$mode.log"; continue; }
    polls=$(awk '/writes/ { print $(NF-1) }' "$OUT/logs/cost-$mode.log")
    callgrind_annotate --inclusive=yes --threshold=100 "$f" > "$OUT/logs/cost-$mode.txt" 2>/dev/null
    # incl <pattern>: the inclusive Ir of the first function line matching <pattern>.
    incl() { grep -E "$1" "$OUT/logs/cost-$mode.txt" | head -1 | awk '{ gsub(",", "", $1); print $1 }'; }
    outer_post=$( [ "$mode" = wr ] && incl 'rnic_verbs::qp::post::wr_complete' || incl 'rnic_verbs::qp::post::post_send' )
    [ "$mode" = wr ] && outer_post=$(( outer_post + $(incl 'rnic_verbs::qp::post::wr_start' || echo 0) \
        + $(incl 'rnic_verbs::qp::post::wr_rdma_write' || echo 0) + $(incl 'rnic_verbs::qp::post::wr_set_sge ' || echo 0) ))
    # rnic's post below the shim: core's QueuePair::post_send (inlined) calls
    # post_send_rest for every request that is not inline.
    inner_post=$(incl 'rnic_core::queue_pair::QueuePair<.*>::post_send_rest')
    outer_poll=$(incl 'rnic_verbs::cq::poll_cq')
    # The driver's poll: below it, core's CompletionQueue::poll (inlined) and
    # its shared-CQ credit accounting (verbs CQs are shared: poll_windowed).
    inner_poll=$(incl '<rnic_rxe::provider::RxeCq as rnic_core::provider::CqOps>::poll')
    cost_rows+="| $mode | $(awk -v a="$outer_post" -v n="$COST_ITERS" 'BEGIN { printf "%.0f", a / n }') | $(awk -v a="$inner_post" -v n="$COST_ITERS" 'BEGIN { printf "%.0f", a / n }') | $(awk -v a="$outer_post" -v b="$inner_post" -v n="$COST_ITERS" 'BEGIN { printf "%.0f", (a - b) / n }') | $(awk -v a="$outer_poll" -v n="$polls" 'BEGIN { printf "%.0f", a / n }') | $(awk -v a="$inner_poll" -v n="$polls" 'BEGIN { printf "%.0f", a / n }') | $(awk -v a="$outer_poll" -v b="$inner_poll" -v n="$polls" 'BEGIN { printf "%.0f", (a - b) / n }') |
"
  done
fi

# ---- summary ----
python3 - "$OUT" "$cost_rows" <<'PY'
import csv, statistics, sys
out, cost = sys.argv[1], sys.argv[2]
rows = list(csv.DictReader(open(f"{out}/runs.csv")))
def med(g, side):
    v = [float(r["value"]) for r in rows if r["group"] == g and r["side"] == side and r["value"]]
    return (statistics.median(v), len(v)) if v else (None, 0)
lines = ["# drop-in libibverbs vs native rnic (bench/verbs.sh)", "",
         open(f"{out}/env.txt").read().replace("\n", "; "), "",
         "| test | metric | drop-in (median) | native (median) | drop-in / native | runs |",
         "|---|---|---|---|---|---|"]
for g, metric in (("write-lat", "t_typical µs"), ("write-lat-thread", "t_typical µs"),
                  ("send-lat", "t_typical µs"), ("write-bw", "BW average MB/s"),
                  ("write-bw-thread", "BW average MB/s")):
    # *-thread: the drop-in's runs against native on rnic-rxe's progress
    # thread (-e), the progress model the stock tool forces on the drop-in.
    (d, nd), (n, nn) = med(g.removesuffix("-thread"), "dropin"), med(g, "native")
    if d is None or n is None:
        continue
    lines.append(f"| {g} | {metric} | {d:.2f} | {n:.2f} | {d / n:.3f} | {nd}/{nn} |")
if cost:
    lines += ["", "Instructions per request (callgrind, bench/verbs_cost.c, caller-driven, one loopback RC pair):", "",
              "| post API | drop-in post | rnic QueuePair::post_send_rest | C ABI adds | drop-in poll_cq | rnic-rxe RxeCq::poll | C ABI + shared-CQ credits add |",
              "|---|---|---|---|---|---|---|", cost.rstrip()]
open(f"{out}/summary.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
