#!/usr/bin/env bash
# window_ab.sh -- two rnicctl builds, alternating: rnicctl perf write-bw
# between rxe:127.0.0.1 (the server) and rxe:127.0.0.2 (the client,
# busy-polling), with the server passive (`-e`: its progress thread receives,
# with receive moderation) and busy-polling, at 1 MiB and 4 MiB. Written for
# the requester window of 1024 PSNs and the naps that follow it (issue 30,
# docs/benchmarks.md "A larger window, longer naps"); works for any A/B.
# Per run: GB/s (1e9 B/s, perftest's average), CPU seconds per GB of each
# process (getrusage through /usr/bin/time: user + system), the server's
# moderation naps. One CSV line per run, then per build and mode the medians
# and how many rounds B beat A.
#
# Usage: bash bench/window_ab.sh A B [REPS=6] [DUR=2]
#   A, B: rnicctl binaries (e.g. a copy of target/release/rnicctl built
#   from the commit before, and the current one)
# Needs: /usr/bin/time (Debian: apt-get install time)
set -u
A=$1; B=$2; REPS=${3:-6}; DUR=${4:-2}
. "$(dirname "$0")/ab_setup.sh"
ab_setup "$A" "$B"
port=20800
one() { # build label, binary, server flag, size
  port=$((port + 1))
  /usr/bin/time -f "%U %S" -o "$tmp/srv.time" \
    "$2" perf write-bw -d rxe:127.0.0.1 $3 -s "$4" -D "$DUR" -p $port --stats > "$tmp/srv.out" 2>&1 &
  local srv=$!
  sleep 0.4
  /usr/bin/time -f "%U %S" -o "$tmp/cli.time" \
    timeout $((DUR * 10 + 30)) "$2" perf write-bw -d rxe:127.0.0.2 -s "$4" -D "$DUR" -p $port 127.0.0.1 > "$tmp/cli.out" 2>&1
  wait $srv 2> /dev/null
  python3 - "$1" "${3:-busy}" "$4" "$tmp" <<'PY'
import re, sys
build, server, size, d = sys.argv[1], sys.argv[2].replace("-e", "passive"), int(sys.argv[3]), sys.argv[4]
cli = open(f"{d}/cli.out").read()
rows = [l.split() for l in cli.splitlines() if l.split()[:1] == [str(size)]]
if not rows:
    print(f"{build},{server},{size},ERR,,,"); sys.exit()
iters, mbs = int(rows[0][1]), float(rows[0][3])
gb = iters * size / 1e9
cpu = lambda f: sum(float(x) for x in open(f"{d}/{f}").read().split()[-2:])
m = re.search(r"(\d+) moderation naps", open(f"{d}/srv.out").read())
print(f"{build},{server},{size},{mbs * 1.048576 / 1000:.2f},{cpu('cli.time') / gb:.3f},{cpu('srv.time') / gb:.3f},{m.group(1) if m else ''}")
PY
}
{
echo "build,server,size,GB/s,client CPU s/GB,server CPU s/GB,server naps"
for _ in $(seq "$REPS"); do
  for size in 1048576 4194304; do
    for flag in -e ""; do
      one A "$A" "$flag" $size
      one B "$B" "$flag" $size
    done
  done
done
} | tee "$tmp/runs.csv"
python3 - "$tmp/runs.csv" <<'PY'
import csv, statistics, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r["GB/s"] not in ("ERR", "")]
med = lambda rs, k: statistics.median(float(r[k]) for r in rs)
print("\nserver, size, build: median GB/s, median client + server CPU s/GB (server);")
print("then the median of the paired ratios B/A (this VM runs in two speed phases, so")
print("medians across runs mix them; each pair ran back to back) and how many pairs B won")
for server in ("passive", "busy"):
    for size in ("1048576", "4194304"):
        pick = lambda b: [r for r in rows if (r["build"], r["server"], r["size"]) == (b, server, size)]
        a, b = pick("A"), pick("B")
        if not a or not b:
            continue
        both = lambda r: float(r["client CPU s/GB"]) + float(r["server CPU s/GB"])
        for name, rs in (("A", a), ("B", b)):
            print(f"{server:7} {int(size) >> 20} MiB {name}: {med(rs, 'GB/s'):.2f} GB/s, {statistics.median(both(r) for r in rs):.3f} ({med(rs, 'server CPU s/GB'):.3f}) s/GB")
        pairs = list(zip(a, b))
        bw = statistics.median(float(y["GB/s"]) / float(x["GB/s"]) for x, y in pairs)
        cpu = statistics.median(both(y) / both(x) for x, y in pairs)
        faster = sum(float(y["GB/s"]) > float(x["GB/s"]) for x, y in pairs)
        cheaper = sum(both(y) < both(x) for x, y in pairs)
        print(f"{server:7} {int(size) >> 20} MiB B/A: GB/s x{bw:.3f} (faster in {faster} of {len(pairs)}), CPU s/GB x{cpu:.3f} (cheaper in {cheaper} of {len(pairs)})")
PY
