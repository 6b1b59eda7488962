#!/usr/bin/env bash
# compare.sh -- rnic-rxe's loopback RDMA WRITE bandwidth and 8-byte latency
# against the peer transports of /work/shared/reference/peers.md, measured
# back to back in the same run, on 127.0.0.1:
#
#   rnic   cargo bench -p rnic-rxe --bench loopback (criterion):
#          write_bw/{4096,65536,1048576}  progress threads, app thread polls
#                                         the CQ (busy poll)
#          latency_8B_rtt/write           caller-driven busy poll; one-way =
#                                         round trip / 2
#   UCX    ucx_perftest, UCX_TLS=tcp, poll mode (default):
#          ucp_put_bw 4 KiB/64 KiB/1 MiB, tag_bw 1 MiB (the "best TCP"
#          stretch reference), tag_lat 8 B and ucp_put_lat 8 B (one-way)
#   libfabric udp;ofi_rxd (reliable RDM over UDP): fabtests fi_rma_bw
#          -o writedata 4 KiB/64 KiB/1 MiB and fi_rdm_pingpong 8 B (spin);
#          fabtests are not packaged in Debian 12: FABTESTS_BIN names the
#          directory holding the built fi_rma_bw / fi_rdm_pingpong
#          (peerbench.sh's build_fabtests does the build); without it
#          fi_pingpong (libfabric-bin) gives the 8 B latency only.
#
# Every repetition runs every test once (interleaved), REPS times. Each run
# records wall time, the CPU its processes used (getrusage of children),
# and the CPU everything else on the machine used meanwhile ("foreign",
# /proc/stat busy time minus ours, in % of one vCPU), so loaded runs can be
# told apart. Output in $OUT: runs.csv (one row per run and metric),
# logs/, summary.md (medians [min-max], ratios rnic/peer, CPU seconds per
# GB, median foreign load).
#
# Usage: bash bench/compare.sh            (from the repository root)
#   REPS=3  OUT=bench-results/<stamp>  FABTESTS_BIN=<dir>  SKIP_INSTALL=1
#   ONLY="rnic ucx fi"   (subset of groups)
set -u
cd "$(dirname "$0")/.."
REPS=${REPS:-3}
OUT=${OUT:-bench-results/$(date -u +%Y%m%d-%H%M%S)}
ONLY=${ONLY:-"rnic ucx fi"}
mkdir -p "$OUT/logs"

if [ "${SKIP_INSTALL:-0}" != 1 ] && ! command -v ucx_perftest > /dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    ucx-utils libucx0 libfabric-bin libfabric1 > "$OUT/apt-install.log" 2>&1
fi

# Build the bench once; run the executable directly (cargo's own CPU stays
# out of the measurement).
BENCH=$(cargo bench -p rnic-rxe --bench loopback --no-run --message-format=json 2> "$OUT/build.log" |
  python3 -c 'import sys, json
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "loopback":
        print(m["executable"])' | tail -1)
[ -x "$BENCH" ] || { echo "bench build failed, see $OUT/build.log"; exit 1; }

{
  echo "date: $(date -u +%FT%TZ)"; echo "commit: $(git rev-parse --short HEAD) $(git status --porcelain | wc -l) files modified"
  echo "nproc: $(nproc)"; uname -srm; lscpu | grep -E 'Model name|Hypervisor'
  sysctl net.core.rmem_max net.core.wmem_max; ip -o link show lo | grep -o 'mtu [0-9]*'
  dpkg-query -W -f='${Package} ${Version}\n' ucx-utils libfabric1 2>/dev/null
  echo "loadavg: $(cat /proc/loadavg)"
} > "$OUT/env.txt" 2>&1

export OUT BENCH REPS ONLY FABTESTS_BIN=${FABTESTS_BIN:-}
exec python3 - << 'EOF'
import csv, os, re, resource, signal, socket, statistics as st, subprocess, time

OUT, BENCH, REPS, ONLY = os.environ["OUT"], os.environ["BENCH"], int(os.environ["REPS"]), os.environ["ONLY"].split()
FT = os.environ.get("FABTESTS_BIN", "")
SIZES = [4096, 65536, 1048576]
UCX_ENV = dict(os.environ, UCX_TLS="tcp", UCX_NET_DEVICES="lo")
FI_ENV = dict(os.environ, FI_TCP_IFACE="lo", FI_UDP_IFACE="lo", FI_SOCKETS_IFACE="lo")
rows = []

def busy_jiffies():
    v = list(map(int, open("/proc/stat").readline().split()[1:9]))
    return sum(v) - v[3] - v[4]

def child_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime

def wait_port(port, udp=False, secs=10):
    flag = "-lun" if udp else "-ltn"
    for _ in range(secs * 10):
        if re.search(rf"[:.]{port}\s", subprocess.run(["ss", flag], capture_output=True, text=True).stdout):
            return
        time.sleep(0.1)

def run(name, client, server=None, env=None, port=None, udp=False, timeout=180):
    """Run client (and server); returns (client stdout+stderr, wall, our cpu, foreign %)."""
    log = open(f"{OUT}/logs/{name}.log", "w")
    log.write(f"# cmd: {' '.join(client)}\n# server: {' '.join(server) if server else '-'}\n")
    log.flush()
    b0, c0, t0 = busy_jiffies(), child_cpu(), time.time()
    srv = None
    if server:
        srv = subprocess.Popen(server, env=env, stdout=log, stderr=subprocess.STDOUT)
        wait_port(port, udp)
    try:
        p = subprocess.run(client, env=env, capture_output=True, text=True, timeout=timeout)
        text, rc = p.stdout + p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        text, rc = f"TIMEOUT {e}", 124
    if srv:
        try:
            srv.wait(timeout=10)
        except subprocess.TimeoutExpired:
            srv.send_signal(signal.SIGTERM)
            try:
                srv.wait(timeout=5)
            except subprocess.TimeoutExpired:
                srv.kill(); srv.wait()
    wall, cpu = time.time() - t0, child_cpu() - c0
    busy = (busy_jiffies() - b0) / os.sysconf("SC_CLK_TCK")
    foreign = max(0.0, 100.0 * (busy - cpu) / wall)
    log.write(text + f"\n# rc {rc} wall {wall:.2f}s cpu {cpu:.2f}s foreign {foreign:.0f}% load {open('/proc/loadavg').read().strip()}\n")
    log.close()
    return text, wall, cpu, foreign

def add(rep, test, size, metric, value, unit, cpu_per_gb, foreign):
    rows.append(dict(rep=rep, test=test, size=size, metric=metric, value=value, unit=unit,
                     cpu_s_per_gb=cpu_per_gb, foreign_pct=round(foreign, 1)))

UNIT = {"B/s": 1e-9, "KiB/s": 1024 / 1e9, "MiB/s": 2**20 / 1e9, "GiB/s": 2**30 / 1e9}
TUNIT = {"ns": 1e-3, "µs": 1.0, "us": 1.0, "ms": 1e3}

def rnic(rep):
    text, wall, cpu, forn = run(f"rnic_write_bw__r{rep}", [BENCH, "--bench", "^write_bw/(4096|65536|1048576)$",
                                 "--warm-up-time", "1", "--measurement-time", "3", "--noplot"])
    # stdout (criterion) and stderr (the bench's CPU lines) arrive separately.
    cur, bw, cpu_pct = None, {}, {}
    for line in text.splitlines():
        m = re.match(r"write_bw/(\d+)\s+time:", line)
        if m:
            cur = int(m.group(1))
        m = re.match(r"\s+thrpt:\s+\[\S+ \S+ (\S+) (\S+)", line)
        if m and cur and "%" not in line:
            bw[cur] = float(m.group(1)) * UNIT[m.group(2)]
        m = re.match(r"write_bw (\d+): process CPU (\d+)% of one core", line)
        if m:
            cpu_pct[int(m.group(1))] = int(m.group(2))
    for size, gbs in sorted(bw.items()):
        c = cpu_pct.get(size)
        add(rep, "rnic write_bw", size, "bw", gbs, "GB/s", round(c / 100 / gbs, 3) if c else None, forn)
    text, wall, cpu, forn = run(f"rnic_lat__r{rep}", [BENCH, "--bench", "^latency_8B_rtt/write$",
                                 "--warm-up-time", "1", "--measurement-time", "3", "--noplot"])
    m = re.search(r"latency_8B_rtt/write\s+time:\s+\[\S+ \S+ (\S+) (\S+)", text)
    if m:
        add(rep, "rnic write_lat busy-poll", 8, "lat", float(m.group(1)) * TUNIT[m.group(2)] / 2, "us", None, forn)

def ucx_iters(t, s):
    return {("bw", 4096): 200000, ("bw", 65536): 20000, ("bw", 1048576): 1000, ("lat", 8): 20000}[(t, s)]

def ucx(rep):
    cases = [("ucp_put_bw", s) for s in SIZES] + [("tag_bw", 1048576), ("tag_lat", 8), ("ucp_put_lat", 8)]
    for t, s in cases:
        kind = "bw" if t.endswith("bw") else "lat"
        n = ucx_iters(kind, s); w = max(n // 10, 10)
        text, wall, cpu, forn = run(f"ucx_{t}__s{s}__r{rep}",
            ["ucx_perftest", "127.0.0.1", "-p", "13337", "-t", t, "-s", str(s), "-n", str(n), "-w", str(w)],
            server=["ucx_perftest", "-p", "13337"], env=UCX_ENV, port=13337)
        final = [l for l in text.splitlines() if re.match(r"\s*Final:", l)]
        if not final:
            continue
        f = final[-1].split()
        # Final: iters typical avg overall(usec) | bw avg overall (MB/s = MiB/s) | msgrate avg overall
        if kind == "bw":
            gbs = float(f[6]) * 2**20 / 1e9
            add(rep, f"UCX tcp {t}", s, "bw", gbs, "GB/s", round(cpu / ((n + w) * s / 1e9), 3), forn)
        else:
            add(rep, f"UCX tcp {t} poll", s, "lat", float(f[4]), "us", None, forn)

def fi(rep):
    if FT and os.access(f"{FT}/fi_rma_bw", os.X_OK):
        for s in SIZES:
            n = {4096: 20000, 65536: 4000, 1048576: 400}[s]
            args = ["-p", "udp", "-e", "rdm", "-o", "writedata", "-S", str(s), "-I", str(n)]
            text, wall, cpu, forn = run(f"fi_rma_bw_udp__s{s}__r{rep}", [f"{FT}/fi_rma_bw", *args, "-P", "9228", "127.0.0.1"],
                                        server=[f"{FT}/fi_rma_bw", *args, "-s", "127.0.0.1", "-B", "9228"],
                                        env=FI_ENV, port=9228, udp=True)
            for l in text.splitlines():
                p = l.split()
                if len(p) >= 7 and p[0].rstrip("kmg").isdigit() and re.match(r"[\d.]+$", p[4] if len(p) > 4 else ""):
                    # bytes iters total time MB/sec usec/xfer Mxfers/sec
                    gbs = float(p[4]) / 1e3
                    add(rep, "libfabric udp;ofi_rxd fi_rma_bw writedata", s, "bw", gbs, "GB/s",
                        round(cpu / (n * s / 1e9), 3), forn)
                    break
        lat_cmd = f"{FT}/fi_rdm_pingpong"
        base = ["-p", "udp", "-S", "8", "-I", "20000"]
        text, wall, cpu, forn = run(f"fi_rdm_pingpong_udp__s8__r{rep}", [lat_cmd, *base, "-P", "9228", "127.0.0.1"],
                                    server=[lat_cmd, *base, "-s", "127.0.0.1", "-B", "9228"], env=FI_ENV, port=9228, udp=True)
    else:
        base = ["-p", "udp", "-e", "rdm", "-d", "lo", "-S", "8", "-I", "10000"]
        text, wall, cpu, forn = run(f"fi_pingpong_udp__s8__r{rep}", ["fi_pingpong", *base, "-P", "47592", "127.0.0.1"],
                                    server=["fi_pingpong", *base, "-B", "47592"], env=FI_ENV, port=47592)
    for l in text.splitlines():
        p = l.split()
        if len(p) >= 7 and p[0] == "8" and re.match(r"[\d.]+$", p[5]):
            # bytes iters total time MB/sec usec/xfer Mxfers/sec (usec/xfer = one-way)
            add(rep, "libfabric udp;ofi_rxd pingpong spin", 8, "lat", float(p[5]), "us", None, forn)
            break

for rep in range(1, REPS + 1):
    for g, f in (("rnic", rnic), ("ucx", ucx), ("fi", fi)):
        if g in ONLY:
            f(rep)
    print(f"repetition {rep}/{REPS} done", flush=True)

with open(f"{OUT}/runs.csv", "w", newline="") as fh:
    w = csv.DictWriter(fh, fieldnames=list(rows[0].keys()) if rows else ["rep"])
    w.writeheader(); w.writerows(rows)

def med(test, size):
    v = [r for r in rows if r["test"] == test and r["size"] == size]
    if not v:
        return None
    vals = [r["value"] for r in v]
    cpu = [r["cpu_s_per_gb"] for r in v if r["cpu_s_per_gb"] is not None]
    return dict(med=st.median(vals), lo=min(vals), hi=max(vals), n=len(vals),
                cpu=st.median(cpu) if cpu else None, foreign=st.median(r["foreign_pct"] for r in v))

def cell(m, unit):
    if not m:
        return "–"
    s = f"{m['med']:.3g} [{m['lo']:.3g}–{m['hi']:.3g}]"
    if m["cpu"] is not None:
        s += f", {m['cpu']:.2f} CPU·s/GB"
    return s + f", foreign {m['foreign']:.0f}%"

tests = sorted({(r["test"], r["metric"]) for r in rows})
lines = [f"# rnic vs peers, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {REPS} repetitions",
         "", "median [min–max]; bandwidth in GB/s (1e9 B/s), latency one-way µs; CPU·s/GB = CPU seconds the",
         "processes used per GB moved; foreign = CPU other processes used meanwhile, % of one vCPU (median).", "",
         "| test | " + " | ".join(f"{s}" for s in [8] + SIZES) + " |", "|---|---|---|---|---|"]
for t, metric in tests:
    lines.append(f"| {t} | " + " | ".join(cell(med(t, s), metric) for s in [8] + SIZES) + " |")
lines += ["", "Ratios (rnic / peer, medians):", ""]
for s in SIZES:
    r = med("rnic write_bw", s)
    for peer in ("UCX tcp ucp_put_bw", "UCX tcp tag_bw", "libfabric udp;ofi_rxd fi_rma_bw writedata"):
        p = med(peer, s)
        if r and p:
            lines.append(f"* {s} B: rnic write_bw / {peer} = {r['med'] / p['med']:.2f}")
r = med("rnic write_lat busy-poll", 8)
for peer in ("UCX tcp tag_lat poll", "UCX tcp ucp_put_lat poll", "libfabric udp;ofi_rxd pingpong spin"):
    p = med(peer, 8)
    if r and p:
        lines.append(f"* 8 B latency: rnic / {peer} = {r['med'] / p['med']:.2f} (lower is better)")
open(f"{OUT}/summary.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
