#!/usr/bin/env bash
# Build rnic's drop-in libibverbs and install it in a directory of its own:
#
#   verbs/install.sh                 # release build -> target/release/verbs/
#   verbs/install.sh --debug         # debug build   -> target/debug/verbs/
#   verbs/install.sh --dest DIR      # somewhere else
#
# Then run any verbs program on rnic with
#   LD_LIBRARY_PATH=<dir> ibv_devinfo -v
# The directory holds libibverbs.so.1 (and a libibverbs.so link, to link new
# programs against it with -L<dir> -libverbs).
set -euo pipefail
cd "$(dirname "$0")/.."
profile=release
dest=
while [ $# -gt 0 ]; do
    case "$1" in
        --debug) profile=debug ;;
        --dest) dest="$2"; shift ;;
        -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
        *) echo "install.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
if [ "$profile" = release ]; then
    cargo build --release --locked -p rnic-verbs
else
    cargo build --locked -p rnic-verbs
fi
target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
dest=${dest:-$target_dir/$profile/verbs}
mkdir -p "$dest"
install -m 0755 "$target_dir/$profile/librnic_verbs.so" "$dest/libibverbs.so.1"
ln -sf libibverbs.so.1 "$dest/libibverbs.so"
echo "installed $dest/libibverbs.so.1"
echo "use it with: export LD_LIBRARY_PATH=$dest"
