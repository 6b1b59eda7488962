#!/bin/bash
# Builds the test guest (Debian bookworm kernel + initramfs rootfs) into the cache and prints
# its folder on stdout (progress goes to stderr). Reuses a cached guest when the inputs are
# unchanged: key = hash(this script, init.guest, packages.txt, modules.txt, kernel package+version).
# RNIC_VM_KERNEL=backports builds the same guest on bookworm-backports' kernel (6.12),
# RNIC_VM_KERNEL=trixie-backports on the newest kernel Debian packages (trixie-backports').
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
CACHE=${RNIC_VM_CACHE:-/var/cache/rnic-vm}
log() { echo "[build-guest] $*" >&2; }
t0=$SECONDS

# The mirror apt uses (never a hard-coded host).
MIRROR=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
MIRROR=${MIRROR:-http://deb.debian.org/debian}

# The guest's kernel, RNIC_VM_KERNEL: "stable" (default; bookworm's linux-image-amd64, 6.1),
# "backports" (bookworm-backports' linux-image-amd64, 6.12: the kernel of Debian 13 and
# of the distributions that packet-ring receive needs, 6.2+) or "trixie-backports"
# (trixie-backports' linux-image-amd64: the newest kernel Debian packages, 7.x in
# December 2026). The rootfs is bookworm's in every case. Backports are resolved through
# apt state of their own in the cache, so the host's apt sources stay as they are.
APT=()
case ${RNIC_VM_KERNEL:-stable} in
  stable) ;;
  backports | trixie-backports)
    SUITE=$RNIC_VM_KERNEL
    [ "$SUITE" = backports ] && SUITE=bookworm-backports
    A=$CACHE/apt-$RNIC_VM_KERNEL
    mkdir -p "$A/lists/partial" "$A/cache/archives/partial" "$A/parts"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $MIRROR $SUITE main" \
      > "$A/sources.list"
    APT=(-o "Dir::Etc::SourceList=$A/sources.list" -o "Dir::Etc::SourceParts=$A/parts"
         -o "Dir::State::Lists=$A/lists" -o "Dir::Cache=$A/cache")
    ;;
  *) log "RNIC_VM_KERNEL='$RNIC_VM_KERNEL': expected stable, backports or trixie-backports"; exit 2 ;;
esac

# The concrete kernel package behind linux-image-amd64 (the mirror moves its ABI number).
kernel_pkg() { apt-cache "${APT[@]}" depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}'; }
KPKG=$(kernel_pkg || true)
if [ -z "$KPKG" ]; then
  apt-get "${APT[@]}" -o DPkg::Lock::Timeout=300 update -qq >&2
  KPKG=$(kernel_pkg || true)
fi
[ -n "$KPKG" ] || { log "cannot resolve linux-image-amd64 (apt sources?)"; exit 1; }
KVER=$(apt-cache "${APT[@]}" policy "$KPKG" | awk '/Candidate:/{print $2}')
KEY=$( { cat "$HERE/build-guest.sh" "$HERE/init.guest" "$HERE/packages.txt" "$HERE/modules.txt"
         echo "$KPKG=$KVER"; } | sha256sum | cut -c1-16)
OUT=$CACHE/guest-$KEY
if [ -f "$OUT/ok" ]; then log "cached guest $OUT ($KPKG $KVER)"; echo "$OUT"; exit 0; fi

mkdir -p "$CACHE"
exec 9>"$CACHE/.build.lock"
flock -w 1800 9 || { log "timed out waiting for $CACHE/.build.lock"; exit 1; }
if [ -f "$OUT/ok" ]; then log "built meanwhile: $OUT"; echo "$OUT"; exit 0; fi
log "building $OUT ($KPKG $KVER)"
command -v mmdebstrap >/dev/null || { log "mmdebstrap missing: run $HERE/install-host.sh"; exit 1; }
W=$CACHE/tmp-$KEY
rm -rf "$W"; mkdir -p "$W"
trap 'rm -rf "$W"' EXIT

# 1. kernel: download the concrete package and unpack it. From Debian 13 on it is split:
# linux-image-<abi> depends on linux-binary-<abi> (the image), linux-modules-<abi> and
# linux-base-<abi> (modules.builtin, modules.order, config).
KV=${KPKG#linux-image-}
PARTS=("$KPKG=$KVER")
for p in $(apt-cache "${APT[@]}" depends "$KPKG" 2>/dev/null |
           awk -v kv="$KV" '$1 == "Depends:" && ($2 == "linux-binary-" kv || $2 == "linux-modules-" kv || $2 == "linux-base-" kv) {print $2}'); do
  PARTS+=("$p=$KVER")
done
if ! (cd "$W" && apt-get "${APT[@]}" -o APT::Sandbox::User=root download -qq "${PARTS[@]}" >&2); then
  # stale apt lists name a kernel the mirror no longer has: refresh once, start over
  [ -z "${RNIC_VM_REFRESHED:-}" ] || exit 1
  log "kernel download failed; refreshing the apt lists and starting over"
  rm -rf "$W"
  apt-get "${APT[@]}" -o DPkg::Lock::Timeout=300 update -qq >&2
  RNIC_VM_REFRESHED=1 exec "$0" "$@"
fi
for deb in "$W"/*.deb; do dpkg -x "$deb" "$W/kroot"; done
# modules under /lib and the image in /boot (Debian 12), or both under /usr/lib/modules
# (Debian 13: merged /usr)
KM=$W/kroot/lib/modules
[ -d "$KM/$KV" ] || KM=$W/kroot/usr/lib/modules
VMLINUZ=$W/kroot/boot/vmlinuz-$KV
[ -f "$VMLINUZ" ] || VMLINUZ=$KM/$KV/vmlinuz
[ -d "$KM/$KV" ] && [ -f "$VMLINUZ" ] || { log "no modules or vmlinuz for $KV in ${PARTS[*]}"; exit 1; }
log "kernel $KV unpacked (${#PARTS[@]} packages): $((SECONDS - t0))s"

# 2. rootfs from the same mirror apt uses.
mmdebstrap --quiet --variant=essential --include="$(grep -v '^#' "$HERE/packages.txt" | paste -sd,)" \
  bookworm "$W/rootfs" "$MIRROR" >&2
log "rootfs: $((SECONDS - t0))s"

# 3. only the modules we need and their dependencies (resolved inside the chroot).
R=$W/rootfs
mkdir -p "$R/kfull/lib" && cp -al "$KM" "$R/kfull/lib/"
chroot "$R" depmod -b /kfull "$KV"
grep -v '^#' "$HERE/modules.txt" | while read -r m; do
  case $m in
    *\?) chroot "$R" modprobe -d /kfull -S "$KV" --show-depends "${m%\?}" 2>/dev/null ||
            log "optional module ${m%\?}: not in $KV" ;;
    *) chroot "$R" modprobe -d /kfull -S "$KV" --show-depends "$m" ;;
  esac
done | awk '/^insmod/{print $2}' | sort -u | sed "s|^/kfull/lib/modules/$KV/||" > "$W/modlist"
D=$R/lib/modules/$KV
mkdir -p "$D"
cp "$KM/$KV"/modules.builtin* "$KM/$KV/modules.order" "$D/"
while read -r rel; do install -D -m 644 "$KM/$KV/$rel" "$D/$rel"; done < "$W/modlist"
rm -rf "$R/kfull"
chroot "$R" depmod "$KV"
rm -rf "$R"/usr/share/{doc,man,locale,info}/*
install -m 755 "$HERE/init.guest" "$R/init"

# 4. pack; publish atomically.
mkdir -p "$W/out"
cp "$VMLINUZ" "$W/out/vmlinuz"
(cd "$R" && find . -xdev | cpio -o -H newc --quiet | zstd -3 -T0 -q > "$W/out/rootfs.cpio.zst")
echo "$KPKG $KVER, $(wc -l < "$W/modlist") modules" > "$W/out/manifest"
touch "$W/out/ok"
rm -rf "$OUT"; mv "$W/out" "$OUT"
# keep the six newest guests: two per kernel (other checkouts may still use an older one)
ls -dt "$CACHE"/guest-* | tail -n +7 | xargs -r rm -rf
log "done in $((SECONDS - t0))s: $OUT ($(du -sh "$OUT" | cut -f1))"
echo "$OUT"
