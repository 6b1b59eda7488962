"""summary.py OUT [DOCS] -- summary.md (medians [min-max] over repetitions,
ratios rnic/peer, median foreign load) and the PNG plots from OUT/runs.csv."""
import csv, os, statistics as st, sys, time
from collections import defaultdict

OUT = sys.argv[1]
DOCS = sys.argv[2] if len(sys.argv) > 2 else None
rows = list(csv.DictReader(open(f"{OUT}/runs.csv")))
for r in rows:
    r["size"], r["value"], r["foreign_pct"] = int(r["size"]), float(r["value"]), float(r["foreign_pct"])
    r["cpu_s_per_gb"] = float(r["cpu_s_per_gb"]) if r["cpu_s_per_gb"] not in ("", "None") else None

groups = defaultdict(list)
for r in rows:
    groups[(r["metric"], r["test"], r["mode"], r["size"])].append(r)


def med(metric, test, mode, size):
    v = groups.get((metric, test, mode, size))
    if not v:
        return None
    vals = [r["value"] for r in v]
    cpu = [r["cpu_s_per_gb"] for r in v if r["cpu_s_per_gb"] is not None]
    return dict(med=st.median(vals), lo=min(vals), hi=max(vals), n=len(vals),
                cpu=st.median(cpu) if cpu else None, foreign=st.median(r["foreign_pct"] for r in v))


def fmt(x):
    return f"{x:.3g}" if x < 1000 else f"{x:.0f}"


def cell(m):
    if not m:
        return "–"
    s = f"{fmt(m['med'])} [{fmt(m['lo'])}–{fmt(m['hi'])}]"
    if m["n"] < 3:
        s += f" n={m['n']}"
    return s


reps = len({r["rep"] for r in rows})
lines = [f"# rnic vs peers, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(os.path.getmtime(f'{OUT}/runs.csv')))}, "
         f"{reps} repetitions", "",
         "Median [min–max] over repetitions. Bandwidth GB/s (1e9 B/s); latency one-way µs (mean of",
         "each run's iterations; rnic/perftest `t_avg`, ucx_perftest overall avg, fi_pingpong usec/xfer,",
         "qperf latency). CPU·s/GB = CPU seconds the test's processes used per GB moved (median).",
         "foreign = CPU used by other processes during the run, % of one vCPU (median over the row).",
         "poll = busy polling on both sides; blocking = rnic `-e`, UCX `-E sleep`, kernel sockets.", ""]
for metric, title in (("bw", "Bandwidth, GB/s"), ("lat", "Latency, one-way µs")):
    keys = sorted({(k[1], k[2]) for k in groups if k[0] == metric and not k[1].startswith("memcpy")},
                  key=lambda k: (not k[0].startswith("rnic"), k))
    sizes = sorted({k[3] for k in groups if k[0] == metric and not k[1].startswith("memcpy")})
    if not keys:
        continue
    lines += [f"## {title}", "", "| test | mode | " + " | ".join(f"{s:,} B" for s in sizes) + " | CPU·s/GB (largest) | foreign |",
              "|---|---|" + "---|" * (len(sizes) + 2)]
    for test, mode in keys:
        ms = [med(metric, test, mode, s) for s in sizes]
        have = [m for m in ms if m]
        cpu = next((m["cpu"] for m in reversed(ms) if m and m["cpu"] is not None), None)
        forn = st.median(m["foreign"] for m in have)
        lines.append(f"| {test} | {mode} | " + " | ".join(cell(m) for m in ms) +
                     f" | {'' if cpu is None else f'{cpu:.2f}'} | {forn:.0f} % |")
    if metric == "bw":
        for th in (1, 2):
            m = med("bw", f"memcpy 256 MiB, {th} thread{'s' if th > 1 else ''}", "-", 268435456)
            if m:
                lines.append(f"| memcpy 256 MiB → 256 MiB, {th} thread{'s' if th > 1 else ''} (ceiling) | - | "
                             + " | ".join([cell(m)] * len(sizes)) + f" | | {m['foreign']:.0f} % |")
    lines.append("")

# ratios rnic / peer, same size, same polling mode
lines += ["## Ratios rnic / peer (medians; bandwidth: >1 = rnic faster; latency: <1 = rnic faster)", ""]
bw_pairs = [("rnic write-bw loopback", "poll", p, pm) for p, pm in
            (("UCX tcp ucp_put_bw", "poll"), ("UCX tcp tag_bw", "poll"), ("kernel TCP iperf3", "blocking"),
             ("libfabric tcp fi_rma_bw writedata", "poll"), ("libfabric udp;ofi_rxd fi_rma_bw writedata", "poll"))]
bw_pairs += [("rnic write-bw loopback", "poll, passive server", "UCX tcp tag_bw", "poll")]
bw_pairs += [("rnic write-bw loopback", "poll, packet ring + frames", p, "poll")
             for p in ("UCX tcp tag_bw", "libfabric tcp fi_rma_bw writedata")]
lat_pairs = [("duel: rnic write-lat", "poll", "duel: UCX tcp tag_lat", "poll"),
             ("duel: rnic write-lat, packet ring", "poll", "duel: UCX tcp tag_lat", "poll"),
             ("duel: rnic write-lat, packet ring + frames", "poll", "duel: UCX tcp tag_lat", "poll"),
             ("rnic write-lat loopback", "poll", "UCX tcp tag_lat", "poll"),
             ("rnic write-lat loopback", "poll", "UCX tcp ucp_put_lat", "poll"),
             ("rnic send-lat loopback", "poll", "UCX tcp tag_lat", "poll"),
             ("rnic send-lat loopback", "poll", "libfabric tcp fi_pingpong", "poll"),
             ("rnic send-lat loopback", "poll", "libfabric udp;ofi_rxd fi_pingpong", "poll"),
             ("rnic write-lat loopback", "blocking", "UCX tcp ucp_put_lat", "blocking"),
             ("rnic send-lat loopback", "blocking", "UCX tcp tag_lat", "blocking"),
             ("rnic send-lat loopback", "blocking", "kernel TCP qperf tcp_lat", "blocking")]
for metric, pairs in (("bw", bw_pairs), ("lat", lat_pairs)):
    sizes = sorted({k[3] for k in groups if k[0] == metric})
    for a, am, b, bm in pairs:
        cells = []
        for s in sizes:
            x, y = med(metric, a, am, s), med(metric, b, bm, s)
            if x and y and y["med"] > 0:
                cells.append(f"{s:,} B {x['med'] / y['med']:.2f}")
        if cells:
            lines.append(f"* {a} ({am}) / {b} ({bm}): " + ", ".join(cells))
mem1 = med("bw", "memcpy 256 MiB, 1 thread", "-", 268435456)
rbw = [k for k in groups if k[0] == "bw" and k[1].startswith("rnic")]
if mem1 and rbw:
    best = max((m["med"], t, mo, s) for (mt, t, mo, s), _ in groups.items() if mt == "bw" and t.startswith("rnic")
               for m in [med(mt, t, mo, s)])
    lines.append(f"* best rnic bandwidth median / 1-thread memcpy ceiling ({mem1['med']:.2f} GB/s): "
                 f"{best[0] / mem1['med']:.2f} ({best[1]}, {best[2]}, {best[3]:,} B)")
# CPU seconds per GB, rnic WRITE against UCX's strongest bandwidth mode, largest size
for am in ("poll", "poll, passive server"):
    x = groups.get(("bw", "rnic write-bw loopback", am, 4194304))
    y = groups.get(("bw", "UCX tcp tag_bw", "poll", 4194304))
    cx = sorted(r["cpu_s_per_gb"] for r in x or [] if r["cpu_s_per_gb"] is not None)
    cy = sorted(r["cpu_s_per_gb"] for r in y or [] if r["cpu_s_per_gb"] is not None)
    if cx and cy:
        mx, my = cx[len(cx) // 2], cy[len(cy) // 2]
        lines.append(f"* CPU·s/GB at 4 MiB, rnic write-bw loopback ({am}) {mx:.2f} / UCX tcp tag_bw (poll) {my:.2f}: {mx / my:.2f}")
open(f"{OUT}/summary.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))

# ---------------------------------------------------------------- plots ---
try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    print("matplotlib missing: no plots"); sys.exit(0)
dest = DOCS or OUT
for metric, fname, ylabel in (("bw", "bench_bw.png", "bandwidth, GB/s (1e9 B/s)"),
                              ("lat", "bench_lat.png", "one-way latency, µs")):
    fig, ax = plt.subplots(figsize=(10, 6.5))
    keys = sorted({(k[1], k[2]) for k in groups if k[0] == metric and not k[1].startswith("memcpy")},
                  key=lambda k: (not k[0].startswith("rnic"), k))
    for test, mode in keys:
        sizes = sorted(s for (mt, t, mo, s) in groups if (mt, t, mo) == (metric, test, mode))
        ms = [med(metric, test, mode, s) for s in sizes]
        y = [m["med"] for m in ms]
        err = [[m["med"] - m["lo"] for m in ms], [m["hi"] - m["med"] for m in ms]]
        style = "-" if test.startswith("rnic") else "--"
        ax.errorbar(sizes, y, yerr=err, fmt=style + ("o" if mode != "blocking" else "s"), ms=4, capsize=2,
                    lw=2 if test.startswith("rnic") else 1, label=f"{test} ({mode})")
    if metric == "bw":
        for th in (1, 2):
            m = med("bw", f"memcpy 256 MiB, {th} thread{'s' if th > 1 else ''}", "-", 268435456)
            if m:
                ax.axhline(m["med"], color="k", ls=":" if th == 1 else "-.", lw=1,
                           label=f"memcpy 256 MiB, {th} thr: {m['med']:.1f} GB/s (ceiling)")
    ax.set_xscale("log", base=2); ax.set_yscale("log")
    ax.set_xlabel("message size, bytes"); ax.set_ylabel(ylabel)
    ax.set_title(f"rnic (rxe over UDP) vs peers, median of {reps} reps, min–max bars; shared, loaded 2-vCPU VM")
    ax.grid(True, which="both", alpha=0.3); ax.legend(fontsize=7, loc="best", ncol=2)
    fig.tight_layout(); fig.savefig(f"{dest}/{fname}", dpi=110); fig.savefig(f"{OUT}/{fname}", dpi=80)
    print(f"wrote {dest}/{fname}")
