#!/usr/bin/env bash
# footprint.sh -- the instruction-cache footprint of rnic-rxe's 8-byte
# ping-pong, per iteration, from cachegrind (deterministic, no hardware
# counters needed): I1 misses with the host's 32 KiB I1, and with a 4 KiB
# I1, which misses nearly every line each iteration, so its count is about
# the code lines fetched per iteration. Then the functions that fetch the
# most lines, or with a second binary, the functions whose count changed.
#
# Usage: bash bench/footprint.sh <post_poll_cost A> [<post_poll_cost B>] [ITERS=3000]
#   cargo build --release -p rnic-rxe --example post_poll_cost
#   bash bench/footprint.sh target/release/examples/post_poll_cost
set -euo pipefail
A=$1
B=${2:-}
N=${3:-3000}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

measure() { # bin tag -> "<32 KiB misses/iter> <4 KiB lines/iter>", per-function table in $out/<tag>.fn
    local bin=$1 tag=$2
    local big small
    big=$(valgrind --tool=cachegrind --cache-sim=yes --cachegrind-out-file=/dev/null \
        "$bin" "$N" reserved typed 2>&1 | awk '/I1  misses/ {gsub(",", "", $4); print $4}')
    valgrind --tool=cachegrind --cache-sim=yes --I1=4096,2,64 \
        --cachegrind-out-file="$out/$tag.cg" "$bin" "$N" reserved typed > /dev/null 2>&1
    small=$(cg_annotate "$out/$tag.cg" 2>/dev/null | awk '/PROGRAM TOTALS/ && !done {gsub(",", "", $3); print $3; done = 1}')
    cg_annotate --auto=no --show=I1mr --sort=I1mr "$out/$tag.cg" 2>/dev/null | python3 -c '
import re, sys
n = int(sys.argv[1])
for line in sys.stdin:
    m = re.match(r"\s*([\d,]+)\s+\(\s*[\d.]+%\)\s+(\S.*)$", line)
    if not m or ":" not in m.group(2):
        continue
    name = re.sub(r"::h[0-9a-f]{16}", "", m.group(2).split(":", 1)[1].strip())
    print("%.1f" % (int(m.group(1).replace(",", "")) / n), name)' "$N" > "$out/$tag.fn"
    echo "$((big / N)) $((small / N))"
}

read -r a_big a_small < <(measure "$A" a)
echo "A $A: I1 misses per iteration (32 KiB I1) $a_big, lines fetched per iteration (4 KiB I1) $a_small"
if [ -z "$B" ]; then
    echo "lines per iteration, by function (4 KiB I1; a function's inlined code summed):"
    awk '{n = $1; $1 = ""; s[substr($0, 2)] += n} END {for (k in s) printf "%7.1f %s\n", s[k], k}' \
        "$out/a.fn" | sort -rn | head -25
    exit 0
fi
read -r b_big b_small < <(measure "$B" b)
echo "B $B: I1 misses per iteration (32 KiB I1) $b_big, lines fetched per iteration (4 KiB I1) $b_small"
echo "lines per iteration, by function (a function's inlined code summed): A B B-A, largest changes first"
python3 - "$out/a.fn" "$out/b.fn" <<'EOF'
import collections, sys
def load(path):
    d = collections.Counter()
    for line in open(path):
        n, name = line.rstrip("\n").split(" ", 1)
        d[name] += float(n)
    return d
a, b = load(sys.argv[1]), load(sys.argv[2])
for k in sorted(set(a) | set(b), key=lambda k: -abs(b[k] - a[k]))[:25]:
    print("%7.1f %7.1f %+7.1f %s" % (a[k], b[k], b[k] - a[k], k[:140]))
EOF
