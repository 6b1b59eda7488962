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
info=$(lscpu)
field() { sed -n "s/^$1: *//p" <<< "$info" | head -1; }
model=$(field 'Model name')
fam=$(awk -F': ' '/^cpu family/{print $2; exit}' /proc/cpuinfo)
mod=$(awk -F': ' '/^model\t/{print $2; exit}' /proc/cpuinfo)
flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
have=""
for f in avx2 avx512f pclmulqdq vpclmulqdq erms fsrm; do
  if [[ $flags == *" $f "* ]]; then have+=" +$f"; else have+=" -$f"; fi
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
echo "cpu: $model (family $fam, model $mod), L2 $(field 'L2 cache'), L3 $(field 'L3 cache');$have$crc"
