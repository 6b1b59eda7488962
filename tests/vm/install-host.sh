#!/bin/bash
# Installs the host packages the VM harness needs (Debian bookworm, as root).
# Fast no-op when everything is already there; otherwise one `apt-get update`, then install.
set -euo pipefail
# qemu-system-x86 only: bookworm's qemu-utils conflicts with a newer backports qemu-utils
# some images carry ("Breaks: qemu-system-common"), and the harness does not need it.
PKGS=(qemu-system-x86 mmdebstrap zstd cpio tcpdump iproute2 procps kmod python3 gcc libc6-dev
      coreutils util-linux)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && { echo "[install-host] all host packages present"; exit 0; }
[ "$(id -u)" -eq 0 ] || { echo "[install-host] need root to install: ${missing[*]}" >&2; exit 1; }
echo "[install-host] installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
APT=(apt-get -o DPkg::Lock::Timeout=300 -o Acquire::Retries=3)
"${APT[@]}" update -qq
"${APT[@]}" install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "[install-host] done"
