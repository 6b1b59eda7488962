#!/usr/bin/env bash
# Build rnic's drop-in libibverbs and install it in a directory of its own:
#
#   verbs/install.sh                 # release build -> target/release/verbs/
#   verbs/install.sh --debug         # debug build   -> target/debug/verbs/
#   verbs/install.sh --dest DIR      # somewhere else
#   verbs/install.sh --dev-nodes     # also /dev/infiniband/<name> for each device (root)
#
# --dev-nodes: UCX (1.13) uses an RDMA device only if /dev/infiniband/<dev_name>
# is a character device it may open, although it never opens it. It creates,
# for every device the library lists (ibv_devices, so RNIC_DEVICES applies), a
# link /dev/infiniband/<name> -> /dev/null; names are rnic_*, never a kernel
# device's uverbsN. Nothing else needs them.
#
# Then run any verbs program on rnic with
#   LD_LIBRARY_PATH=<dir> ibv_devinfo -v
# The directory holds libibverbs.so.1 (and a libibverbs.so link, to link new
# programs against it with -L<dir> -libverbs).
set -euo pipefail
cd "$(dirname "$0")/.."
profile=release
dest=
dev_nodes=0
while [ $# -gt 0 ]; do
    case "$1" in
        --debug) profile=debug ;;
        --dest) dest="$2"; shift ;;
        --dev-nodes) dev_nodes=1 ;;
        -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
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
if [ "$dev_nodes" = 1 ]; then
    command -v ibv_devices >/dev/null || { echo "install.sh: --dev-nodes lists devices with ibv_devices: install ibverbs-utils" >&2; exit 1; }
    [ "$(id -u)" -eq 0 ] || { echo "install.sh: --dev-nodes writes /dev/infiniband: run as root" >&2; exit 1; }
    mkdir -p /dev/infiniband
    for name in $(LD_LIBRARY_PATH="$dest" RNIC_VERBS_QUIET=1 ibv_devices | awk 'NR > 2 { print $1 }'); do
        node=/dev/infiniband/$name
        if [ -e "$node" ] && [ ! -L "$node" ]; then
            echo "install.sh: $node exists and is not rnic's link: left alone" >&2
            continue
        fi
        ln -sfn /dev/null "$node"
        echo "linked $node -> /dev/null (for UCX)"
    done
fi
