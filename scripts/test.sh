#!/usr/bin/env bash
# The whole rnic test suite, exactly as CI runs it (.ci/run calls this file).
#
#   sudo scripts/test.sh        # on a fresh Debian 12 machine, as root
#
# 1. installs the system packages the build and tests need (hwloc headers for
#    rnic-gpu's topology; QEMU, mmdebstrap, tcpdump, … for the VM harness)
# 2. checks formatting and lints (rustfmt, clippy -D warnings)
# 3. runs every test: unit, property, golden-vector, capture, loopback,
#    the long fault-injection simulations (release build), and the QEMU
#    guest scenarios (kernel rdma_rxe peer, real VFIO) in tests/vm,
#    and each cargo-fuzz target for a bounded time (scripts/fuzz.sh).
#
# Set RNIC_SKIP_VM=1 to leave out the QEMU scenarios on a machine that
# cannot run them (they then print SKIP lines; with CI set they fail instead).
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }
t0=$(date +%s)

step "system packages for the build (hwloc, udev headers, pkg-config)"
scripts/install-build-deps.sh

if [ "${RNIC_SKIP_VM:-0}" != 1 ]; then
    step "system packages for the VM harness"
    tests/vm/install-host.sh
fi

step "system packages for the libibverbs drop-in's tests (rdma-core's, perftest, UCX)"
verbs/tests/install-deps.sh

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy (all targets, warnings are errors)"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo test (workspace)"
cargo test --workspace --locked

step "fuzz targets (libFuzzer, ${FUZZ_SECONDS:-60} s each; a crash or a failed invariant fails the run)"
scripts/fuzz.sh

step "long runs (optimized: profile long-runs, --ignored): 100k-op fault simulations, 64 MiB loopback transfers"
cargo test --profile long-runs --locked -p rnic-roce -p rnic-rxe -- --ignored
# The rxe conformance suite's 64 MiB case on mlx5-over-emulator (~10 s once built).
cargo test --profile long-runs --locked -p rnic --test mlx5_conformance -- --ignored

printf '\nall checks passed in %ss\n' "$(( $(date +%s) - t0 ))"
