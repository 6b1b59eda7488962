#!/bin/bash
# cpu.sh -- one line naming what this machine's CPU brings to a benchmark:
# the model the hypervisor shows, family/model, the L2 and L3 sizes, and the
# flags that decide rnic's fast paths (VPCLMULQDQ: the 256-bit ICRC kernel;
# PCLMULQDQ: the 128-bit one; ERMS/FSRM: fast `rep movsb` copies). The same
# cloud machine kind has landed on different CPUs from one session to the
# next, so every result folder records it (bench/compare.sh, bench/pairs.sh).
#
#   bash bench/cpu.sh [RNICCTL]    with an rnicctl: its doctor's CRC kernel too
set -u
model=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
fam=$(awk -F': ' '/^cpu family/{print $2; exit}' /proc/cpuinfo)
mod=$(awk -F': ' '/^model\t/{print $2; exit}' /proc/cpuinfo)
l2=$(lscpu | sed -n 's/^L2 cache: *//p' | head -1)
l3=$(lscpu | sed -n 's/^L3 cache: *//p' | head -1)
have=""
for f in avx2 avx512f pclmulqdq vpclmulqdq erms fsrm; do
  if grep -m1 '^flags' /proc/cpuinfo | grep -qw "$f"; then have+=" +$f"; else have+=" -$f"; fi
done
crc=""
if [ -n "${1:-}" ] && [ -x "$1" ]; then
  crc=$("$1" doctor --json 2> /dev/null | python3 -c '
import json, sys
try:
    c = [c for c in json.load(sys.stdin)["checks"] if c["name"] == "icrc-crc"][0]
    print("; ICRC:", c["detail"].split(":")[0])
except Exception:
    pass')
fi
echo "cpu: $model (family $fam, model $mod), L2 $l2, L3 $l3;$have$crc"
