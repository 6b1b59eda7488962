#!/usr/bin/env bash
# blocking_ab.sh -- two rnicctl builds, alternating, in the blocking (-e)
# modes a waiting application uses: 8-byte send-lat and write-lat with both
# ends on their progress threads and completion channels (t_typical and
# t_avg, µs one way), then send-bw at 64 KiB and 1 MiB with a blocking
# server and a busy-polling or blocking client (GB/s = 1e9 B/s; CPU seconds
# per GB of both processes, user + system, and of the server). Written for
# the waiter that receives arrivals itself (RxeCq::wait, docs/benchmarks.md
# "Latency"); works for any A/B. One line per run.
#
# Usage: bash bench/blocking_ab.sh A B [REPS=6] [BW_REPS=3]
# Needs: /usr/bin/time (Debian: apt-get install time)
set -u
A=$1; B=$2; REPS=${3:-6}; BW_REPS=${4:-3}
. "$(dirname "$0")/ab_setup.sh"
ab_setup "$A" "$B"
port=23000
lat() { # label, binary, test
  port=$((port + 1))
  "$2" perf "$3" -d rxe:127.0.0.1 -e -s 8 -n 3000 -p $port > "$tmp/srv" 2>&1 &
  sleep 0.3
  r=$("$2" perf "$3" -d rxe:127.0.0.2 -e -s 8 -n 3000 -p $port 127.0.0.1 2>&1 | awk '$1==8{print $5, $6}')
  wait
  echo "$1 $3 8 B: t_typical t_avg ${r:-ERR}"
}
bw() { # label, binary, size, client flag
  port=$((port + 1))
  /usr/bin/time -f "%U %S" -o "$tmp/st" "$2" perf send-bw -d rxe:127.0.0.1 -e -s "$3" -D 2 -p $port > "$tmp/srv" 2>&1 &
  sleep 0.4
  /usr/bin/time -f "%U %S" -o "$tmp/ct" "$2" perf send-bw -d rxe:127.0.0.2 $4 -s "$3" -D 2 -p $port 127.0.0.1 > "$tmp/cli" 2>&1
  wait
  python3 - "$1" "$3" "${4:-busy}" "$tmp" <<'PY'
import sys
b, s, f, d = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
rows = [l.split() for l in open(f"{d}/cli") if l.split()[:1] == [str(s)]]
if not rows:
    print(b, "send-bw", s, f, "ERR"); sys.exit()
gb = int(rows[0][1]) * s / 1e9
cpu = lambda n: sum(map(float, open(f"{d}/{n}").read().split()[-2:]))
print(f"{b} send-bw {s} client {f}: {float(rows[0][3]) * 1.048576 / 1000:.2f} GB/s, "
      f"CPU s/GB {(cpu('ct') + cpu('st')) / gb:.3f} (server {cpu('st') / gb:.3f})")
PY
}
for _ in $(seq "$REPS"); do
  for t in send-lat write-lat; do lat A "$A" $t; lat B "$B" $t; done
done
for _ in $(seq "$BW_REPS"); do
  for s in 65536 1048576; do
    for f in "" -e; do bw A "$A" $s "$f"; bw B "$B" $s "$f"; done
  done
done
