#!/bin/bash
# Installs the system packages the workspace build needs beyond Rust (Debian, as root):
# hwloc and udev headers + pkg-config for rnic-gpu's topology (hwlocality links the
# system libhwloc; its `vendored` build would download, which CI cannot).
# Fast no-op when everything is there; otherwise one `apt-get update`, then install.
set -euo pipefail
PKGS=(libhwloc-dev libudev-dev pkg-config)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && { echo "[build-deps] all build packages present"; exit 0; }
[ "$(id -u)" -eq 0 ] || { echo "[build-deps] need root to install: ${missing[*]} (sudo apt-get install ${missing[*]})" >&2; exit 1; }
echo "[build-deps] installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
APT=(apt-get -o DPkg::Lock::Timeout=300 -o Acquire::Retries=3)
"${APT[@]}" update -qq
"${APT[@]}" install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "[build-deps] done"
