#!/usr/bin/env bash
# Release-build TTFT runs of kv_demo (RDMA over rxe on loopback, then the TCP
# baseline on the same prompt), each checked against the single-node
# reference; one JSON document per prompt length, collected into
# docs/kvcache/results.json; then RDMA again with the decode node's region
# registered before the request (--prealloc) into results_prealloc.json.
# plot_ttft.py draws the breakdown chart and prints the tables.
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
pre=docs/kvcache/results_prealloc.json
{
  echo "["
  first=1
  for n in "${lens[@]}"; do
    echo "kv_demo: prompt $n, pre-registered region" >&2
    [ $first -eq 1 ] || echo ","
    first=0
    ./target/release/kv_demo --prompt "$n" --generate 32 --transport rdma --prealloc --json -q
  done
  echo "]"
} > "$pre.tmp"
mv "$pre.tmp" "$pre"
echo "wrote $pre" >&2
python3 examples/kvcache/scripts/plot_ttft.py "$out" docs/kvcache/ttft_breakdown.png "$pre"
