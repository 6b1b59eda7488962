#!/usr/bin/env bash
# compare.sh -- rnic (rxe backend) against the transports a user would pick
# instead, measured on this machine in one run (project issue #6):
#
#   rnic     `rnicctl perf` (perftest-compatible), two processes:
#            write-bw / read-bw / send-bw at 8 B ... 4 MiB (busy poll, -D s)
#            write-lat / send-lat at 8 B, 4 KiB, 64 KiB, busy poll and -e
#            (blocking: progress thread + completion channel); write-bw
#            1 and 4 MiB also with a passive server (-e) and, on loopback,
#            with the packet ring + frame transmit (root, Linux 6.2+; lo's
#            accept_local/route_localnet set for those runs only)
#            on loopback (rxe:127.0.0.1 <-> rxe:127.0.0.2) and across two
#            network namespaces joined by a veth pair (10.77.0.1 <-> .2)
#   UCX      ucx_perftest, UCX_TLS=tcp: ucp_put_bw, tag_bw (poll);
#            ucp_put_lat, tag_lat (poll and -E sleep)
#   TCP      iperf3 (bandwidth, -l <size>), qperf tcp_lat (ping-pong; both
#            block in the kernel)
#   libfabric fi_pingpong (libfabric-bin) over tcp and udp;ofi_rxd: latency.
#            Bandwidth needs fabtests' fi_rma_bw, which Debian 12 does not
#            package: set FABTESTS_SRC=<libfabric-v1.17.0>/fabtests (this
#            script builds fi_rma_bw into target/fabtests; `git archive
#            v1.17.0 fabtests` of github.com/ofiwg/libfabric gives the tree)
#            or FABTESTS_BIN=<dir with a built fi_rma_bw>; without either
#            those rows are skipped (the script says so).
#   share    rnic write-lat 8 B (poll) and write-bw 1 MiB with both ends on
#            one shared device (rxe:127.0.0.1 twice, docs/sharing.md) next
#            to the two-address pair, alternating in the same run
#   memcpy   256 MiB copy, 1 and 2 threads: the ceiling of any loopback
#            transfer
#
# Every repetition runs every test once (interleaved), REPS times. Each run
# records the CPU its processes used and the CPU everything else used
# meanwhile ("foreign", % of one vCPU) so noisy runs can be discarded.
# Output: bench/results/<stamp>/{runs.csv,summary.md,env.txt,logs/,*.png}
# and docs/bench_bw.png, docs/bench_lat.png.
#
# Usage (root, Debian 12, from anywhere):  bash bench/compare.sh
#   QUICK=1        few sizes, short runs (~10 min on 2 vCPUs)
#   REPS=3         repetitions (>= 3 for a median worth the name)
#   ONLY="mem duel share rnic ucx tcp fi"   subset of groups (duel: rnic write-lat,
#                                 socket path, packet ring without and with
#                                 frame transmit (lo's accept_local and
#                                 route_localnet set for that run), UCX tag_lat,
#                                 8 B, busy poll, back to back;
#                                 share: one shared device vs two addresses)
#   NETNS=0        skip the two-namespace rnic runs
#   SKIP_INSTALL=1 do not apt-get / pip install
#   FABTESTS_SRC=<fabtests source dir>  FABTESTS_BIN=<dir with fi_rma_bw>
#   OUT=<dir>   PLOTS=0 (no docs/*.png)
set -u
cd "$(dirname "$0")/.."
REPS=${REPS:-3}; QUICK=${QUICK:-0}
ONLY=${ONLY:-"mem duel share rnic ucx tcp fi"}
OUT=${OUT:-bench/results/$(date -u +%Y%m%d-%H%M%S)$([ "$QUICK" = 1 ] && echo -quick)}
mkdir -p "$OUT/logs"
echo "results in $OUT"

# ---- install the peers (Debian packages only) and matplotlib (PyPI) ----
if [ "${SKIP_INSTALL:-0}" != 1 ]; then
  need=()
  tools="ucx_perftest:ucx-utils fi_pingpong:libfabric-bin iperf3:iperf3 qperf:qperf gcc:gcc ss:iproute2"
  # Building fi_rma_bw (below) needs autotools and libfabric's headers.
  [ -n "${FABTESTS_SRC:-}" ] && tools+=" autoconf:autoconf automake:automake libtoolize:libtool make:make"
  for b in $tools; do
    command -v "${b%%:*}" > /dev/null || need+=("${b#*:}")
  done
  [ -n "${FABTESTS_SRC:-}" ] && [ ! -e /usr/include/rdma/fabric.h ] && need+=(libfabric-dev)
  if [ ${#need[@]} -gt 0 ]; then
    echo "apt-get install ${need[*]}"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"; } \
      > "$OUT/apt-install.log" 2>&1 || echo "WARN: apt-get install failed, see $OUT/apt-install.log"
  fi
  python3 -c 'import matplotlib' 2> /dev/null || pip install -q matplotlib > "$OUT/pip.log" 2>&1 ||
    pip install -q --break-system-packages matplotlib >> "$OUT/pip.log" 2>&1 ||
    echo "WARN: matplotlib not installable, no plots (see $OUT/pip.log)"
fi
for b in ucx_perftest fi_pingpong iperf3 qperf; do
  command -v $b > /dev/null || echo "WARN: $b not installed: its rows will be empty"
done
FABTESTS_BIN=${FABTESTS_BIN:-}
if [ -z "$FABTESTS_BIN" ] && [ -n "${FABTESTS_SRC:-}" ]; then
  # Build fi_rma_bw from the fabtests directory of the libfabric v1.17.0
  # source (the version Debian 12's libfabric-dev carries) into target/.
  ft=$PWD/target/fabtests
  if [ ! -x "$ft/benchmarks/fi_rma_bw" ]; then
    echo "building fi_rma_bw from $FABTESTS_SRC into $ft (log: $OUT/fabtests-build.log)"
    rm -rf "$ft" && mkdir -p "$ft" && cp -r "$FABTESTS_SRC"/. "$ft"/ &&
      (cd "$ft" && ./autogen.sh && ./configure && make -j"$(nproc)" benchmarks/fi_rma_bw) \
        > "$OUT/fabtests-build.log" 2>&1 ||
      echo "WARN: building fabtests from $FABTESTS_SRC failed, see $OUT/fabtests-build.log"
  fi
  [ -x "$ft/benchmarks/fi_rma_bw" ] && FABTESTS_BIN=$ft/benchmarks
fi
if [ -z "$FABTESTS_BIN" ] || [ ! -x "$FABTESTS_BIN/fi_rma_bw" ]; then
  echo "NOTE: fabtests (fi_rma_bw) are not packaged in Debian 12 and none was built (FABTESTS_SRC) or given (FABTESTS_BIN):" \
       "libfabric bandwidth rows skipped (fi_pingpong latency still runs)" | tee "$OUT/fabtests-skipped.txt"
  FABTESTS_BIN=
fi

# ---- build ----
cargo build --release -p rnicctl > "$OUT/build.log" 2>&1 || { echo "rnicctl build failed, see $OUT/build.log"; exit 1; }
RNICCTL=$PWD/target/release/rnicctl
MEMCPY=$PWD/target/bench-memcpy
gcc -O2 -pthread -o "$MEMCPY" bench/memcpy.c || exit 1

# ---- two network namespaces joined by veth, removed on exit ----
NS_A= NS_B=
if [ "${NETNS:-1}" = 1 ] && [[ " $ONLY " == *" rnic "* ]]; then
  NS_A=rnicbench-a-$$ NS_B=rnicbench-b-$$
  cleanup() { ip netns del "$NS_A" 2> /dev/null; ip netns del "$NS_B" 2> /dev/null; }
  trap cleanup EXIT; trap 'exit 130' INT TERM
  if ip netns add "$NS_A" && ip netns add "$NS_B" &&
     ip link add vrb-a netns "$NS_A" type veth peer name vrb-b netns "$NS_B" &&
     ip -n "$NS_A" addr add 10.77.0.1/24 dev vrb-a && ip -n "$NS_B" addr add 10.77.0.2/24 dev vrb-b &&
     ip -n "$NS_A" link set vrb-a mtu 9000 up && ip -n "$NS_B" link set vrb-b mtu 9000 up &&
     ip -n "$NS_A" link set lo up && ip -n "$NS_B" link set lo up; then
    :
  else
    echo "WARN: could not create the network namespaces: netns rows skipped"; NS_A= NS_B=
  fi
else
  :
fi

{
  echo "date: $(date -u +%FT%TZ)  QUICK=$QUICK REPS=$REPS ONLY=$ONLY"
  echo "commit: $(git rev-parse --short HEAD) $(git status --porcelain | wc -l) files modified"
  echo "nproc: $(nproc)"; uname -srm; lscpu | grep -E 'Hypervisor'; bash bench/cpu.sh "$RNICCTL"
  sysctl net.core.rmem_max net.core.wmem_max; ip -o link show lo | grep -o 'mtu [0-9]*'
  [ -n "$NS_A" ] && echo "netns: $NS_A 10.77.0.1 <-veth mtu 9000-> $NS_B 10.77.0.2"
  dpkg-query -W -f='${Package} ${Version}\n' ucx-utils libfabric1 libfabric-bin iperf3 qperf 2> /dev/null
  echo "loadavg at start: $(cat /proc/loadavg)"
  echo "top CPU users at start:"; ps -eo pcpu,comm --sort=-pcpu | head -6
} > "$OUT/env.txt" 2>&1

export OUT REPS QUICK ONLY RNICCTL MEMCPY FABTESTS_BIN NS_A NS_B
python3 bench/runner.py || echo "WARN: runner exited with $?"
echo "loadavg at end: $(cat /proc/loadavg)" >> "$OUT/env.txt"
[ -s "$OUT/runs.csv" ] || { echo "no results"; exit 1; }
if [ "${PLOTS:-1}" = 1 ]; then python3 bench/summary.py "$OUT" docs; else python3 bench/summary.py "$OUT"; fi
