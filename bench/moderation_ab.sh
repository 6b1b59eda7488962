#!/usr/bin/env bash
# moderation_ab.sh -- receive moderation (RxeConfig::rx_moderation, default on)
# against none (RNIC_RXE_RX_MODERATION_US=0), same binary, alternating runs:
# rnicctl perf write-bw, 4 MiB WRITEs, between rxe:127.0.0.1 (the server,
# passive: `-e`, its progress thread receives and sleeps between datagrams)
# and rxe:127.0.0.2 (the client, busy-polling). A busy-polling server runs in
# each round too, as the reference. Per run: GB/s (1e9 B/s, perftest's
# average) and CPU seconds per GB of each process (getrusage through
# /usr/bin/time: user + system), and the server's wake-ups and naps
# (`--stats`). Prints one CSV line per run, then the medians per mode.
#
# Usage: bash bench/moderation_ab.sh [REPS=6] [DUR=4] [SIZE=4194304]
# Needs: cargo build --release -p rnicctl; /usr/bin/time (Debian: apt-get install time)
set -u
REPS=${1:-6}; DUR=${2:-4}; SIZE=${3:-4194304}
T=${CARGO_TARGET_DIR:-target}/release
[ -x /usr/bin/time ] || { echo "/usr/bin/time missing: apt-get install time"; exit 1; }
[ -x "$T/rnicctl" ] || { echo "$T/rnicctl missing: cargo build --release -p rnicctl"; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
port=19800
one() { # mode label, RNIC_RXE_RX_MODERATION_US, server flag
  port=$((port + 1))
  RNIC_RXE_RX_MODERATION_US=$2 /usr/bin/time -f "%U %S" -o "$tmp/srv.time" \
    "$T/rnicctl" perf write-bw -d rxe:127.0.0.1 $3 -s "$SIZE" -D "$DUR" -p $port --stats > "$tmp/srv.out" 2>&1 &
  local srv=$!
  sleep 0.4
  RNIC_RXE_RX_MODERATION_US=$2 /usr/bin/time -f "%U %S" -o "$tmp/cli.time" \
    timeout $((DUR * 10 + 30)) "$T/rnicctl" perf write-bw -d rxe:127.0.0.2 -s "$SIZE" -D "$DUR" -p $port 127.0.0.1 > "$tmp/cli.out" 2>&1
  wait $srv 2> /dev/null
  python3 - "$1" "$SIZE" "$tmp" <<'EOF'
import re, sys
mode, size, d = sys.argv[1], int(sys.argv[2]), sys.argv[3]
cli = open(f"{d}/cli.out").read()
rows = [l.split() for l in cli.splitlines() if l.split()[:1] == [str(size)]]
if not rows:
    print(f"{mode},ERR,,,,,"); sys.exit()
iters, mbs = int(rows[0][1]), float(rows[0][3])
gb = iters * size / 1e9
cpu = lambda f: sum(float(x) for x in open(f"{d}/{f}").read().split()[-2:])
m = re.search(r"received (\d+) datagrams in (\d+) wake-ups and (\d+) moderation naps", open(f"{d}/srv.out").read())
wakes, naps = (m.group(2), m.group(3)) if m else ("", "")
print(f"{mode},{mbs * 1.048576 / 1000:.2f},{cpu('cli.time') / gb:.3f},{cpu('srv.time') / gb:.3f},{wakes},{naps}")
EOF
}
{
echo "mode,GB/s,client CPU s/GB,server CPU s/GB,server wake-ups,server naps"
for _ in $(seq "$REPS"); do
  one passive-off 0 -e
  one passive-moderated "" -e
  one busy-server 0 ""
done
} | tee "$tmp/runs.csv"
python3 - "$tmp/runs.csv" <<'EOF'
import csv, statistics, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r["GB/s"] not in ("ERR", "")]
print("\nmedians: mode, GB/s, client + server CPU s/GB (server), runs")
for mode in ("passive-off", "passive-moderated", "busy-server"):
    rs = [r for r in rows if r["mode"] == mode]
    if not rs:
        continue
    med = lambda k: statistics.median(float(r[k]) for r in rs)
    c, s = med("client CPU s/GB"), med("server CPU s/GB")
    print(f"{mode}: {med('GB/s'):.2f} GB/s, {c + s:.3f} ({s:.3f}) CPU s/GB, {len(rs)} runs")
EOF
