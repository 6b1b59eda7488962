#!/bin/bash
# Installs what the verbs drop-in's tests run against (Debian bookworm, as
# root): the system libibverbs and its header (export list, ABI check), the
# stock tools (ibverbs-utils, perftest) and UCX's ucx_perftest.
# Fast no-op when everything is already there.
set -euo pipefail
PKGS=(libibverbs-dev libibverbs1 ibverbs-utils perftest ucx-utils binutils gcc libc6-dev)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && { echo "[verbs deps] all packages present"; exit 0; }
[ "$(id -u)" -eq 0 ] || { echo "[verbs deps] need root to install: ${missing[*]}" >&2; exit 1; }
echo "[verbs deps] installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
APT=(apt-get -o DPkg::Lock::Timeout=300 -o Acquire::Retries=3)
"${APT[@]}" update -qq
"${APT[@]}" install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "[verbs deps] done"
