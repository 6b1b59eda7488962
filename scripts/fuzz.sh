#!/usr/bin/env bash
# Run rnic's cargo-fuzz targets (fuzz/fuzz_targets) for a bounded time each.
#
#   scripts/fuzz.sh                    # every target, 60 s each (what CI runs)
#   FUZZ_SECONDS=600 scripts/fuzz.sh requester
#   FUZZ_RUNS=10000000 scripts/fuzz.sh # a fixed number of executions instead
#
# Installs cargo-fuzz from crates.io when it is missing. Builds on the stable
# toolchain without a sanitizer (`-s none`: the harnesses are safe Rust and
# check their invariants with assertions, which is what finds bugs here).
# New interesting inputs go to a scratch corpus, never into the committed
# seeds (fuzz/corpus/<target>); a crash, a failed invariant or a timeout
# fails the script and leaves the input in fuzz/artifacts/<target>/.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(wire responder requester mlx5_firmware mlx5_wqe mlx5_cqe rxe_rx l2)
seconds=${FUZZ_SECONDS:-60}

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "installing cargo-fuzz (crates.io)…"
    cargo install cargo-fuzz --locked
fi
cargo fuzz build -s none

for t in "${targets[@]}"; do
    scratch=$(mktemp -d)
    if [ -n "${FUZZ_RUNS:-}" ]; then limit=(-runs="$FUZZ_RUNS"); else limit=(-max_total_time="$seconds"); fi
    if [ -n "${FUZZ_RUNS:-}" ]; then what="$FUZZ_RUNS runs"; else what="$seconds s"; fi
    echo "==> fuzz $t ($what), seeds: fuzz/corpus/$t ($(ls "corpus/$t" | wc -l) files)"
    log="$scratch.log"
    status=0
    cargo fuzz run -s none "$t" "$scratch" "corpus/$t" -- \
        "${limit[@]}" -timeout=30 -rss_limit_mb=2048 -print_final_stats=1 >"$log" 2>&1 || status=$?
    grep -E '^(#[0-9]+[[:space:]]+DONE|stat::number_of_executed_units|stat::average_exec_per_sec|stat::peak_rss_mb)' "$log" || true
    if [ "$status" != 0 ]; then tail -n 40 "$log" >&2; fi
    rm -f "$log"
    rm -rf "$scratch"
    if [ "$status" != 0 ]; then
        echo "fuzz target $t FAILED (exit $status); the input is in fuzz/artifacts/$t/" >&2
        exit 1
    fi
done
echo "fuzz: ${targets[*]} clean"
