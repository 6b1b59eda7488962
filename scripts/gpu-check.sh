#!/usr/bin/env bash
# Every GPU check of rnic in one run, on a machine with an NVIDIA GPU and its driver:
#
#   scripts/gpu-check.sh            # as root (hugepages, build packages); ~3-6 min on 16 cores
#
# 1. builds rnic-gpu's tests and examples, kv_demo and rnicctl (release; ~2 min on this repo's
#    2-core machines in debug, so well under that on 16 cores);
# 2. runs gpu/tests/cuda.rs with RNIC_TEST_GPU=1 (VRAM, the CUDA copy engine, staged VRAM
#    byte-checked on the device, dma-buf export, the rxe RC conformance sequence into VRAM:
#    every WRITE WITH IMMEDIATE checked in VRAM on its completion), then the rest of
#    rnic-gpu's tests (staging, no-driver path via RNIC_GPU=off, topology);
# 3. the copy-tier benchmark (pageable / pinned / hugepage + cuMemHostRegister, H2D and D2H,
#    4 KiB..1 GiB) beside the H200 reference figures;
# 4. the KV pair over rxe with the cache in host memory and in VRAM (--kv-memory host,gpu:0):
#    both must produce the single-node reference's tokens and KV digest;
# 5. rnicctl doctor (GPU section) and rnicctl topo.
#
# Prints one SUMMARY block; exits 0 only if every step passed, 2 when there is no GPU.
# Env: GPU=<ordinal> (default 0), TIERS_MAX=<size> (default 1G), GPU_CHECK_LOGS=<dir>.
set -uo pipefail
cd "$(dirname "$0")/.."

GPU=${GPU:-0}
TIERS_MAX=${TIERS_MAX:-1G}
LOGS=${GPU_CHECK_LOGS:-target/gpu-check}
mkdir -p "$LOGS"
t0=$(date +%s)

if ! { ldconfig -p 2>/dev/null | grep -q 'libcuda\.so'; } && ! [ -e /proc/driver/nvidia/version ]; then
  echo "gpu-check: no NVIDIA driver here (no libcuda.so in ldconfig -p, no /proc/driver/nvidia)."
  echo "gpu-check: this script needs a machine with an NVIDIA GPU and its driver; nothing was run."
  echo "gpu-check: without a GPU, scripts/test.sh runs every GPU test that can run (host copy engine)."
  exit 2
fi
command -v nvidia-smi >/dev/null && nvidia-smi -L | tee "$LOGS/nvidia-smi.txt"

if [ "$(id -u)" -eq 0 ]; then
  scripts/install-build-deps.sh || exit 1
  # 2 MiB hugepages for the hugepage tier (1 GiB) and the staging rings, restored at exit.
  hp=/proc/sys/vm/nr_hugepages
  before=$(cat "$hp")
  echo $((before + 640)) > "$hp" 2>/dev/null || true
  trap 'echo "$before" > "$hp" 2>/dev/null || true' EXIT
else
  echo "gpu-check: not root: no hugepages reserved (the hugepage tier falls back to THP), no packages installed"
fi

declare -a SUMMARY
fail=0
run() {  # run <name> <seconds> <command...>: log in $LOGS/<name>.log, one summary line
  local name=$1 limit=$2; shift 2
  local s=$(date +%s)
  timeout "$limit" "$@" > "$LOGS/$name.log" 2>&1
  local rc=$? el=$(( $(date +%s) - s ))
  if [ $rc -eq 0 ]; then SUMMARY+=("PASS $name (${el}s)")
  else SUMMARY+=("FAIL $name rc=$rc (${el}s; log $LOGS/$name.log)"); fail=1; fi
  echo "gpu-check: $name rc=$rc in ${el}s"
  return $rc
}

run build 300 cargo build --release --locked -p rnic-gpu --tests --examples \
  -p rnic-kvcache --bin kv_demo -p rnicctl || { printf '%s\n' "${SUMMARY[@]}"; exit 1; }
export RNIC_TEST_GPU=1
run cuda-tests 180 cargo test --release --locked -p rnic-gpu --test cuda -- --nocapture --test-threads 1
run gpu-crate-tests 120 cargo test --release --locked -p rnic-gpu --lib --test staging \
  --test no_driver --test topology
run copy-tiers 180 cargo run --release --locked -p rnic-gpu --example copy_tiers -- --gpu "$GPU" --max "$TIERS_MAX"
run kv-pair 240 target/release/kv_demo --prompt 512 --generate 16 --kv-memory "host,gpu:$GPU" --quiet
run doctor 30 sh -c 'target/release/rnicctl doctor; true'
run topo 30 target/release/rnicctl topo

echo
echo "==================== gpu-check SUMMARY ===================="
printf '%s\n' "${SUMMARY[@]}"
grep -h '^GPU:' "$LOGS/cuda-tests.log" | head -1
grep -h 'matches the single-node reference\|MISMATCH' "$LOGS/kv-pair.log"
grep -hA3 'side by side' "$LOGS/kv-pair.log"
grep -h '^SUMMARY' "$LOGS/copy-tiers.log"
grep -hE '^(OK|WARN|FAIL) +(cuda|gpu |peer-bar|vram-reach|topology)' "$LOGS/doctor.log"
echo "total $(( $(date +%s) - t0 ))s; logs in $LOGS/"
exit $fail
