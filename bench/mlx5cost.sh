#!/usr/bin/env bash
# Instructions per call of rnic-mlx5's data path (issue 12's cost figures):
# one 8-byte inline RDMA WRITE (BlueFlame) posted and its CQE polled, three
# ways (generic, direct, Provider), counted by callgrind on the driver process
# with the emulated ConnectX in its own process. Prints one line per path:
#
#   bash bench/mlx5cost.sh [ITERS]        # default 2000 (+200 warm-up each)
#   RNIC_MLX5_WC=0 bash bench/mlx5cost.sh # the doorbell-only (UC) path
#
# The emulated BAR0 is write-combining for this run (--bar0 wc) unless
# RNIC_MLX5_WC=0; the driver then takes the path a kernel-VFIO UC mapping
# gives it: 8-byte doorbells only (audit row 4).
#
# Per call = the bench function's largest inclusive count / (ITERS + 200):
# a frameless wrapper is attributed to the file its first instruction came
# from, so the largest line per function is the one to read (docs/mlx5.md §13).
set -euo pipefail
cd "$(dirname "$0")/.."
iters=${1:-2000}
cargo build --release -q -p rnic-mlx5-emu --bin rnic-mlx5-emu
cargo build --release -q -p rnic-mlx5 --example mlx5_inline_write
dir=$(mktemp -d)
sock=$dir/emu.sock
bar0=wc
[ "${RNIC_MLX5_WC:-1}" = 0 ] && bar0=uc
bar0_flag=()
target/release/rnic-mlx5-emu --help | grep -q -- '--bar0' && bar0_flag=(--bar0 "$bar0")
target/release/rnic-mlx5-emu --socket "$sock" --once "${bar0_flag[@]}" > "$dir/emu.log" 2>&1 &
emu=$!
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
RNIC_MLX5_EMU_SOCKET=$sock valgrind --tool=callgrind --fair-sched=yes \
  --callgrind-out-file="$dir/mlx5.cg" --toggle-collect='mlx5_inline_write::bench_*' \
  target/release/examples/mlx5_inline_write "$iters" > "$dir/run.log" 2>&1 \
  || { cat "$dir/run.log" >&2; kill $emu 2>/dev/null; exit 1; }
wait $emu 2>/dev/null || true
callgrind_annotate --threshold=100 --inclusive=yes "$dir/mlx5.cg" \
  | python3 -c '
import re, sys
n = int(sys.argv[1]) + 200
best = {}
for line in sys.stdin:
    m = re.match(r"\s*([\d,]+)\s.*mlx5_inline_write::(bench_\w+)", line)
    if m:
        v = int(m.group(1).replace(",", ""))
        best[m.group(2)] = max(best.get(m.group(2), 0), v)
for f in ["bench_post", "bench_poll", "bench_post_inline", "bench_poll_send",
          "bench_provider_post", "bench_provider_poll"]:
    if f in best:
        print(f"{f:22} {best[f] / n:8.1f}")
' "$iters"
grep -m1 '^doorbells:' "$dir/run.log" || true
echo "(profile: $dir/mlx5.cg)"
