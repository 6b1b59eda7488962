#!/usr/bin/env bash
# Release-build TTFT runs of kv_demo (RDMA over rxe on loopback, then the TCP
# baseline on the same prompt), each checked against the single-node
# reference; one JSON document per prompt length, collected into
# docs/kvcache/results.json. Then plot_ttft.py draws the breakdown chart.
#
#   examples/kvcache/scripts/bench.sh [prompt lengths...]   (default: 256 1024 2048 4096)
set -euo pipefail
root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
cd "$root"
cargo build --release -p rnic-kvcache --bin kv_demo
out=docs/kvcache/results.json
lens=("$@")
[ ${#lens[@]} -gt 0 ] || lens=(256 1024 2048 4096)
{
  echo "["
  first=1
  for n in "${lens[@]}"; do
    echo "kv_demo: prompt $n" >&2
    [ $first -eq 1 ] || echo ","
    first=0
    ./target/release/kv_demo --prompt "$n" --generate 32 --transport both --json -q
  done
  echo "]"
} > "$out.tmp"
mv "$out.tmp" "$out"
echo "wrote $out" >&2
python3 examples/kvcache/scripts/plot_ttft.py "$out" docs/kvcache/ttft_breakdown.png
